"""``python -m runtime run``: the demo's JSON lines obey the grammar; the terminal render."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from runtime.app.render import TerminalRenderer
from tests.support.grammar import check_grammar

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_demo_jsonl_obeys_the_output_grammar():
    proc = run_cli("--jsonl", "What's the weather in Paris?")
    assert proc.returncode == 0, proc.stderr
    chunks = [json.loads(line) for line in proc.stdout.splitlines()]
    check_grammar(chunks)
    types = [c["type"] for c in chunks]
    assert "reasoning-delta" in types and "tool-call" in types
    result = next(c for c in chunks if c["type"] == "tool-result")
    assert result["tool_name"] == "get_weather" and result["output"]["city"] == "Paris"
    assert [c["step"] for c in chunks if c["type"] == "step-start"] == [0, 1]
    assert chunks[-1]["finish_reason"] == "stop"


def test_demo_renders_reasoning_tool_card_and_answer():
    proc = run_cli("Weather in Oslo?")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "thinking: The user asks about the weather in Oslo" in out
    assert "tool · get_weather" in out and '"city": "Oslo"' in out
    assert "in Oslo right now." in out


def test_clock_prompt_calls_the_clock_tool():
    proc = run_cli("--jsonl", "What time is it?")
    calls = [json.loads(x) for x in proc.stdout.splitlines() if '"tool-call"' in x]
    assert [c["tool_name"] for c in calls] == ["get_time"]


def test_renderer_dims_reasoning_and_boxes_tool_errors():
    from runtime import output as o
    from runtime.chunks import Usage

    buf = io.StringIO()
    renderer = TerminalRenderer(
        Console(file=buf, width=80, force_terminal=True, color_system="standard")
    )
    for chunk in [
        o.ReasoningStart(step=0, part_id="r"),
        o.ReasoningDelta(step=0, part_id="r", text="hmm"),
        o.ReasoningFinish(step=0, part_id="r"),
        o.ToolCall(step=0, tool_call_id="c", tool_name="t", input={"a": 1}),
        o.ToolError(step=0, tool_call_id="c", tool_name="t", error="boom"),
        o.Finish(finish_reason="stop", usage=Usage()),
    ]:
        renderer.render(chunk)
    text = buf.getvalue()
    assert "\x1b[2" in text  # dim
    assert "hmm" in text and "tool · t" in text and "boom" in text and "stop" in text


def test_session_resumes_from_a_store_file(tmp_path):
    db = str(tmp_path / "cli.db")
    first = run_cli("--jsonl", "--store", db, "--session", "cli", "Weather in Rome?")
    second = run_cli("--jsonl", "--store", db, "--session", "cli", "Weather in Lima?")
    assert first.returncode == 0 and second.returncode == 0, second.stderr
    import sqlite3

    count = (
        sqlite3.connect(db)
        .execute("select count(*) from messages where session_id='cli'")
        .fetchone()[0]
    )
    assert count == 6  # two turns of user, assistant, tool


def test_sigterm_aborts_the_running_turn_and_saves_it(tmp_path):
    import signal
    import sqlite3
    import time

    db = str(tmp_path / "sig.db")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime",
            "run",
            "--jsonl",
            "--delay",
            "0.2",
            "--store",
            db,
            "--session",
            "sig",
            "Weather in Paris?",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the turn has started streaming
    assert '"start"' in first
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out = proc.stdout.read()  # not communicate(): it would skip what readline buffered
    proc.wait(timeout=30)
    err = proc.stderr.read() if proc.stderr else ""
    chunks = [json.loads(first)] + [json.loads(line) for line in out.splitlines()]
    assert chunks[-1] == {**chunks[-1], "type": "abort", "reason": "signal SIGTERM"}
    check_grammar(chunks, ending="abort")
    assert proc.returncode == 1, err
    body = (
        sqlite3.connect(db)
        .execute("select body from messages where session_id='sig' and role='assistant'")
        .fetchone()[0]
    )
    assert json.loads(body)["interrupted"] is True


def test_sessions_and_show_list_and_print_a_stored_conversation(tmp_path):
    db = str(tmp_path / "show.db")
    assert run_cli("--store", db, "--session", "trip", "Weather in Rome?").returncode == 0
    listing = subprocess.run(
        [sys.executable, "-m", "runtime", "sessions", "--store", db],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert listing.stdout.split("\t")[:2] == ["trip", "3 messages"]
    show = subprocess.run(
        [sys.executable, "-m", "runtime", "show", "trip", "--store", db],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert show.returncode == 0, show.stderr
    assert "user: Weather in Rome?" in show.stdout
    assert "[step 0] tool-call get_weather" in show.stdout
    assert "tool get_weather result (step 0)" in show.stdout
    assert "[step 1] text: It is" in show.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "runtime", "show", "nope", "--store", db],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert missing.returncode == 1 and "no session 'nope'" in missing.stderr


def test_a_new_stored_session_prints_the_id_that_resumes_it(tmp_path):
    db = str(tmp_path / "new.db")
    proc = run_cli("--jsonl", "--store", db, "Weather in Rome?")
    assert proc.returncode == 0, proc.stderr
    session_id = json.loads(proc.stdout.splitlines()[-1])["session_id"]
    assert proc.stderr == f"session {session_id} (continue it with --session {session_id})\n"


def test_a_resumed_session_prints_no_id(tmp_path):
    proc = run_cli("--jsonl", "--store", str(tmp_path / "s.db"), "--session", "s1", "Hi")
    assert proc.returncode == 0 and proc.stderr == ""


def help_text(*command: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return " ".join(proc.stdout.split())  # argparse wraps lines where it likes


def test_worker_help_shows_its_defaults():
    text = help_text("worker")
    for default in [
        "turns run at once (default 4)",
        "unrenewed (default 10)",
        "marked failed (default 3)",
        "on SIGTERM (default 10)",
        "when idle (default 1)",
    ]:
        assert default in text


def test_serve_help_shows_the_body_limit():
    assert "largest request body, bytes (default 50331648: 48 MiB" in help_text("serve")


def test_serve_help_says_the_token_guards_the_protocols_endpoints_not_the_probes():
    """It said /api/ only, while /v1/, /a2a/, /ag-ui and /mcp answer 401 without it too
    (docs/web.md), and the probes need none (docs/deployment.md, Health checks)."""
    text = help_text("serve")
    assert "on /api/ and the protocols' endpoints (/v1/, /a2a/, /ag-ui, /mcp)" in text
    assert "not the probes /healthz and /readyz" in text


def test_help_names_each_providers_default_model():
    from actors.providers.registry import create_provider
    from runtime.app.commands import DEFAULT_MODELS
    from runtime.provider import ProviderOptions

    text = help_text("run")
    for name, model in DEFAULT_MODELS.items():
        assert create_provider(name, ProviderOptions()).model == model
        assert f"{model} for {name}" in text


def test_the_installed_script_names_itself_axon():
    code = "import sys; sys.argv[0] = '/venv/bin/axon'; from runtime.app.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.stdout.startswith("usage: axon ")


def test_a_module_run_names_the_interpreter_it_was_typed_with():
    """``python3 -m runtime`` (the README's spelling) prints ``python3 -m runtime``, not
    ``python -m runtime``, which does not run where there is no plain ``python``."""
    assert help_text().startswith(f"usage: {os.path.basename(sys.executable)} -m runtime ")


def test_the_installed_scripts_help_names_the_worker_command_axon_too():
    """Help text naming another command names the one the user typed, like the usage line."""
    code = "import sys; sys.argv[0] = '/venv/bin/axon'; from runtime.app.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, "serve", "--help"], capture_output=True, text=True, cwd=ROOT
    )
    assert "front end of `axon worker`s" in " ".join(proc.stdout.split())
