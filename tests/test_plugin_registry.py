"""Plug-ins by name: the ``axon.plugins`` entry-point group and ``--plugin NAME[:OPTIONS]``.

The built-ins (``otel``, ``recorder``) are found like any package's plug-in; a plug-in
registered by an installed distribution's entry point (:mod:`tests.support.plugin_probe`,
put on ``PYTHONPATH``) is loaded by name by ``run``, ``serve`` and ``worker``, each in a
process of its own; an unknown name is one ``error:`` line on each.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import httpx
import pytest
import trio

import runtime.registry
from actors.plugins import JsonlRecorder, OpenTelemetryActor
from actors.plugins.registry import (
    BUILTIN,
    ENTRY_POINT_GROUP,
    PluginSpec,
    create_plugin,
    plugin_names,
)
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.app.cli import build_parser
from runtime.app.commands import plugin_specs
from runtime.errors import ConfigurationError
from tests.support.plugin_probe import TARGET, Probe, probe_distribution, read_probe

ROOT = Path(__file__).resolve().parents[1]
SERVE = [sys.executable, "-m", "runtime", "serve", "--port", "0", "--delay", "0"]
WORKER = [sys.executable, "-m", "runtime", "worker", "--delay", "0"]
UNKNOWN = "error: unknown plug-in 'nope'; registered plug-ins: otel, recorder, probe"


def registered(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    """Pretend installed packages declare these ``axon.plugins`` entry points."""
    found = [EntryPoint(n, t, ENTRY_POINT_GROUP) for n, t in targets.items()]
    monkeypatch.setattr(
        runtime.registry,
        "entry_points",
        lambda group: found if group == ENTRY_POINT_GROUP else [],
    )


@pytest.fixture
def probe_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a command that has the ``probe`` plug-in installed."""
    where = probe_distribution(tmp_path / "site")
    return {**os.environ, "PYTHONPATH": f"{where}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1"}


# -- the registry -----------------------------------------------------------------------------


def test_the_builtin_plugins_are_registered_by_name():
    assert plugin_names() == ["otel", "recorder"]


def test_pyproject_declares_the_builtins_as_axon_plugins_entry_points():
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["entry-points"][ENTRY_POINT_GROUP] == BUILTIN


def test_an_unknown_name_is_a_configuration_error_naming_the_registered_ones():
    with pytest.raises(ConfigurationError) as info:
        create_plugin("otle")
    assert str(info.value) == "unknown plug-in 'otle'; registered plug-ins: otel, recorder"


def test_an_entry_point_adds_a_plugin_built_from_its_options(monkeypatch, tmp_path):
    registered(monkeypatch, probe=TARGET)
    assert plugin_names() == ["otel", "recorder", "probe"]
    actor = create_plugin(f"probe:{tmp_path / 'p.txt'}")
    assert isinstance(actor, Probe) and actor.path == tmp_path / "p.txt"


def test_an_entry_point_that_returns_no_actor_is_a_configuration_error(monkeypatch):
    registered(monkeypatch, wrong="os.path:basename")
    with pytest.raises(ConfigurationError, match=r"'wrong' \(os.path:basename\) returned str"):
        create_plugin("wrong:x")


def test_options_split_at_the_first_colon_only():
    assert PluginSpec.parse("recorder:C:/logs/a.jsonl") == PluginSpec(
        name="recorder", options="C:/logs/a.jsonl"
    )
    assert PluginSpec.parse("otel") == PluginSpec(name="otel", options=None)
    with pytest.raises(ConfigurationError, match="NAME"):
        PluginSpec.parse(":x")


def test_the_recorder_plugin_records_to_the_file_its_options_name(tmp_path):
    actor = create_plugin(f"recorder:{tmp_path / 'e.jsonl'}")
    assert isinstance(actor, JsonlRecorder) and actor.path == str(tmp_path / "e.jsonl")
    with pytest.raises(ConfigurationError, match="recorder:PATH"):
        create_plugin("recorder")


def test_the_otel_plugin_takes_capture_content_and_refuses_other_options(monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    actor = create_plugin("otel:capture-content")
    assert isinstance(actor, OpenTelemetryActor) and actor.capture_content
    with pytest.raises(ConfigurationError, match="'otel' takes no option but 'capture-content'"):
        create_plugin("otel:verbose")


def test_the_older_flags_are_aliases_of_the_builtin_plugins():
    args = build_parser().parse_args(
        ["run", "--otel", "--record", "e.jsonl", "--plugin", "x:1", "hi"]
    )
    assert [str(spec) for spec in plugin_specs(args)] == ["otel", "recorder:e.jsonl", "x:1"]
    args = build_parser().parse_args(["serve", "--otel"])
    assert [str(spec) for spec in plugin_specs(args)] == ["otel"]


def test_listing_the_plugins_imports_no_plugin_module_and_no_opentelemetry():
    code = (
        "import sys\n"
        "from actors.plugins.registry import plugin_names\n"
        "plugin_names()\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')]\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


async def finished(queue: TurnQueue, turn_id: str) -> bool:
    status = await queue.get_status(turn_id)
    return status is not None and status.status == "done"


# -- each command loads a plug-in by name --------------------------------------------------


def test_run_loads_a_plugin_an_installed_package_registered(probe_env, tmp_path):
    probe = tmp_path / "probe.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "run", "--plugin", f"probe:{probe}", "Hi"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=probe_env,
    )
    assert proc.returncode == 0, proc.stderr
    assert read_probe(probe) == ["started", "turn stop"]


async def test_serve_loads_a_plugin_an_installed_package_registered(probe_env, tmp_path):
    probe = tmp_path / "probe.txt"
    proc = await trio.lowlevel.open_process(
        [*SERVE, "--plugin", f"probe:{probe}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=probe_env,
        cwd=ROOT,
    )
    try:
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
            banner = line.decode()
            assert "plug-in probe" in banner
            url = "/".join(banner.split(" on ", 1)[1].split("/", 3)[:3])
            chat = {
                "id": "web",
                "messages": [
                    {"id": "m0", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
                ],
                "trigger": "submit-message",
            }
            async with httpx.AsyncClient(base_url=url) as client:
                response = await client.post("/api/chat", json=chat)
                assert response.status_code == 200
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert read_probe(probe) == ["started", "turn stop"]


async def test_worker_loads_a_plugin_an_installed_package_registered(probe_env, tmp_path, pg_url):
    probe = tmp_path / "probe.txt"
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    proc = await trio.lowlevel.open_process(
        [*WORKER, "--store", pg_url, "--poll", "0.1", "--plugin", f"probe:{probe}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=probe_env,
        cwd=ROOT,
    )
    try:
        turn = await queue.submit("s1", "hi")
        with trio.fail_after(30):
            while True:  # polling another process's row
                if await finished(queue, turn.turn_id):
                    break
                await trio.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await queue.aclose()
        await store.aclose()
    assert read_probe(probe) == ["started", "turn stop"]


@pytest.mark.parametrize(
    "command",
    [
        ["run", "hi"],
        ["serve", "--port", "0"],
        ["worker", "--store", "postgresql://127.0.0.1:1/none"],  # refused before connecting
        ["mcp-server"],  # refused before the protocol starts
    ],
    ids=["run", "serve", "worker", "mcp-server"],
)
def test_an_unknown_plugin_is_one_error_line_on_each_command(probe_env, command):
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", *command, "--plugin", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=probe_env,
        input="",
    )
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, UNKNOWN + "\n", "")
