"""What agent the command line runs: the demo's tools only on the scripted demo, nothing
a real model did not ask for, and ``--agent module:name`` on ``run`` and ``serve``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import trio

from tests.support.loopback import Reply, loopback_server
from tests.test_provider_e2e import oa_answer

ROOT = Path(__file__).resolve().parents[1]
AGENTS = "tests.support.cli_agents"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


async def openai_request(*args: str) -> dict:
    """The request body ``run --provider openai ARGS "Hi"`` sends to a loopback server."""
    async with loopback_server(Reply(body=oa_answer("ok"))) as server:
        base = ["--provider", "openai", "--base-url", server.url + "/v1", "--api-key", "test"]
        proc = await trio.run_process(
            [sys.executable, "-m", "runtime", "run", "--jsonl", *base, *args, "Hi"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    return server.requests[0].json()


async def test_a_real_provider_gets_no_tools_and_no_instructions():
    body = await openai_request()
    assert "tools" not in body
    assert body["messages"] == [{"role": "user", "content": "Hi"}]


async def test_demo_tools_reach_a_real_provider_only_when_asked():
    body = await openai_request("--demo-tools")
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather", "get_time"]


def test_run_agent_runs_the_named_agent():
    proc = run_cli("--jsonl", "--agent", f"{AGENTS}:agent", "Hi")
    assert proc.returncode == 0, proc.stderr
    text = "".join(
        c["text"] for c in map(json.loads, proc.stdout.splitlines()) if c["type"] == "text-delta"
    )
    assert text == "hello from mine"


def test_run_agent_calls_a_factory_with_the_session_id(tmp_path):
    db = str(tmp_path / "s.db")
    proc = run_cli("--agent", f"{AGENTS}:per_session", "--store", db, "--session", "s7", "Hi")
    assert proc.returncode == 0, proc.stderr
    assert "hello from s7" in proc.stdout


def test_an_agent_module_in_the_current_folder_loads_when_the_folder_is_not_on_the_path(
    tmp_path,
):
    """The installed ``axon`` script's path starts with the script's own folder, not the
    current one as under ``python -m runtime`` (``-P`` runs the module that way): a
    newcomer's ``axon run --agent myagent:agent`` beside myagent.py found no module."""
    (tmp_path / "beside_me.py").write_text(
        "from actors.providers.scripted import ScriptedProvider\n"
        "from runtime.agent import Agent\n"
        "agent = Agent(name='mine', provider=ScriptedProvider([['hello from beside']]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-P", "-m", "runtime", "run", "--agent", "beside_me:agent", "Hi"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "hello from beside" in proc.stdout


def test_agent_with_an_option_it_overrides_is_refused():
    proc = run_cli("--agent", f"{AGENTS}:agent", "--model", "gpt-4o", "Hi")
    assert proc.returncode == 2
    assert proc.stderr == "error: --agent names the whole agent: drop --model\n"


def test_an_agent_that_is_not_one_is_one_error_line():
    proc = run_cli("--agent", f"{AGENTS}:not_an_agent", "Hi")
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: --agent '{AGENTS}:not_an_agent' is an int: "
        "expected an Agent, or a function of the session id returning one\n"
    )


def test_serve_agent_serves_the_named_agent():
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime", "serve", "--port", "0", "--agent", f"{AGENTS}:agent"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert f"agent {AGENTS}:agent" in line, line
        url = line.split()[4].rstrip("/")
        info = httpx.get(url + "/api/info", timeout=30).json()
    finally:
        proc.terminate()
        proc.wait(30)
    assert info["agent"] == "mine"
