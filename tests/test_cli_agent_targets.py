"""``--agent MODULE:NAME`` naming what is not an agent: every command that takes it
(``run``, ``serve``, ``worker``, ``mcp-server``) refuses it at start-up, before a server
binds, a turn starts or the store is opened, with one ``error:`` line naming the target
and what was expected, and exit status 2. A function of the session id is called once
there: one that needed more arguments was a TypeError traceback, one that returned no
Agent a 500 at the first request."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGENTS = "tests.support.cli_agents"
EXPECTED = "expected an Agent, or a function of the session id returning one"
COMMANDS = ["run", "serve", "worker", "mcp-server"]


def refused(command: str, spec: str, tmp_path: Path, cwd: Path = ROOT) -> str:
    """The one line ``command --agent spec`` writes on stderr, checked to be a refusal
    (status 2, no traceback, nothing on stdout, no store file made)."""
    db = tmp_path / "s.db"
    store = "postgresql://127.0.0.1:9/none" if command == "worker" else str(db)
    extra = {"run": ["hi"], "serve": ["--port", "0"]}.get(command, [])
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", command, "--agent", spec, "--store", store, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert not db.exists()
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: --agent {spec!r}")
    return proc.stderr.rstrip("\n")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_module_that_is_not_there_is_refused_at_start_up(command, tmp_path):
    line = refused(command, "tests.support.no_such_module:agent", tmp_path)
    assert line.endswith(
        "no module named 'tests.support.no_such_module' in the current folder or on the Python path"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_module_that_raises_on_import_is_refused_at_start_up(command, tmp_path):
    (tmp_path / "broken_agent.py").write_text("raise RuntimeError('no config file')\n")
    line = refused(command, "broken_agent:agent", tmp_path, cwd=tmp_path)
    where = tmp_path / "broken_agent.py"
    assert line.endswith(
        f"importing broken_agent failed: RuntimeError: no config file ({where}, line 1)"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_name_the_module_lacks_is_refused_at_start_up(command, tmp_path):
    line = refused(command, f"{AGENTS}:no_such_name", tmp_path)
    assert line.endswith(
        f"{AGENTS} has no 'no_such_name': expected it to name an Agent, "
        "or a function of the session id returning one"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_function_that_needs_more_arguments_is_refused_at_start_up(command, tmp_path):
    line = refused(command, f"{AGENTS}:needs_a_tenant", tmp_path)
    assert line.endswith(f"takes (tenant, session_id), not the session id alone: {EXPECTED}")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_function_returning_no_agent_is_refused_at_start_up(command, tmp_path):
    line = refused(command, f"{AGENTS}:not_an_agent_factory", tmp_path)
    assert line.endswith(f"returned an int, not an Agent: {EXPECTED}")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_class_is_refused_at_start_up(command, tmp_path):
    line = refused(command, f"{AGENTS}:Agent", tmp_path)
    assert line.endswith(f"is the class Agent, not an instance: {EXPECTED}")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_object_of_another_type_is_refused_at_start_up(command, tmp_path):
    line = refused(command, f"{AGENTS}:not_an_agent", tmp_path)
    assert line.endswith(f"is an int: {EXPECTED}")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_function_that_raises_is_refused_at_start_up(command, tmp_path):
    line = refused(command, f"{AGENTS}:raises", tmp_path)
    session = "axon-startup-check" if command != "run" else "session_"
    where = ROOT / "tests" / "support" / "cli_agents.py"
    assert f"raised RuntimeError: no key for this tenant ({where}, line " in line
    assert ") when called with the session id " in line
    assert f"'{session}" in line and line.endswith(EXPECTED)


@pytest.mark.parametrize("command", COMMANDS)
def test_an_async_agent_function_is_refused_at_start_up(command, tmp_path):
    line = refused(command, f"{AGENTS}:async_factory", tmp_path)
    assert line.endswith(f"is an async function: {EXPECTED} (a plain def)")


@pytest.mark.parametrize("command", COMMANDS)
def test_an_agent_with_no_provider_is_refused_at_start_up(command, tmp_path):
    """``serve`` started and answered each request with a 500 (the host refuses the
    agent only when a session opens)."""
    line = refused(command, f"{AGENTS}:no_provider", tmp_path)
    assert line.endswith(
        "agent 'none' has no provider: give it one, e.g. Agent(model='openai:gpt-4o-mini'), "
        "or Agent(provider=ScriptedProvider.demo()) for the offline demo"
    )
