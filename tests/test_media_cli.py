"""``run --file`` attaches images and files; ``show`` lists them; a missing or oversized
file is one ``error:`` line and exit 2, with no store created."""

from __future__ import annotations

import json

from tests.support.commands import run_runtime

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def test_run_with_files_stores_them_and_show_lists_them(tmp_path):
    image, notes, store = tmp_path / "dot.png", tmp_path / "notes.txt", str(tmp_path / "s.db")
    image.write_bytes(PNG)
    notes.write_text("remember the milk")
    ran = run_runtime(
        "run", "--jsonl", "--store", store, "--session", "s1",
        "--file", str(image), "--file", str(notes), "What time is it?",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout.splitlines()[-1])["type"] == "finish"
    shown = run_runtime("show", "s1", "--store", store)
    assert shown.stdout.splitlines()[:3] == [
        "user: What time is it?",
        "  [image image/png, 24 bytes]",
        "  [file text/plain notes.txt, 17 bytes]",
    ]


def test_a_missing_file_is_one_error_line_and_no_store(tmp_path):
    store = tmp_path / "s.db"
    ran = run_runtime("run", "--store", str(store), "--file", "/nonexistent/a.png", "hi")
    assert (ran.returncode, ran.stderr) == (2, "error: no file at /nonexistent/a.png\n")
    assert not store.exists()


def test_a_file_over_the_limit_is_refused_before_the_store_is_created(tmp_path):
    big, store = tmp_path / "big.pdf", tmp_path / "s.db"
    with big.open("wb") as f:
        f.write(b"%PDF-1.7\n")
        f.truncate(33 * 1024 * 1024)
    ran = run_runtime("run", "--store", str(store), "--file", str(big), "read it")
    assert ran.returncode == 2
    assert ran.stderr == "error: file 'big.pdf' is 33.0 MiB; the limit is 32.0 MiB per file\n"
    assert not store.exists()


def test_a_file_by_url_with_media_urls_off_is_one_error_line_and_no_store(tmp_path):
    store = tmp_path / "s.db"
    url = "http://169.254.169.254/latest/meta-data/creds.png"
    ran = run_runtime("run", "--media-urls", "off", "--store", str(store), "--file", url, "hi")
    assert ran.returncode == 2 and ran.stderr.count("\n") == 1
    assert ran.stderr.startswith(f"error: image (image/png) is given by URL ({url})")
    assert not store.exists()


def test_media_urls_off_reaches_the_agent_of_run_serve_and_worker():
    from runtime.app.cli import build_parser
    from runtime.app.commands import make_agent

    for argv in (["run", "hi"], ["serve"], ["worker", "--store", "postgresql://h/db"]):
        args = build_parser().parse_args([*argv, "--media-urls", "off"])
        args.output_type = None
        assert make_agent(args).media_limits.allow_urls is False, argv
        args = build_parser().parse_args(argv)
        args.output_type = None
        assert make_agent(args).media_limits.allow_urls is True, argv


def test_media_urls_off_reaches_an_agent_given_by_module_or_factory():
    from runtime import Agent
    from runtime.app.cli import build_parser
    from runtime.app.commands import make_agent

    for spec in ("tests.support.cli_agents:agent", "tests.support.cli_agents:per_session"):
        args = build_parser().parse_args(
            ["worker", "--store", "postgresql://h/db", "--agent", spec, "--media-urls", "off"]
        )
        source = make_agent(args)
        agent = source if isinstance(source, Agent) else source("s")
        assert agent.media_limits.allow_urls is False, spec
