"""Agents as MCP tools: ``serve --protocols mcp`` (streamable HTTP at /mcp) and
``python -m runtime mcp-server`` (stdio), driven by the official ``mcp`` client and by
Axon's own ``MCPServer`` client (an Axon agent using another Axon agent, in another
process). Bad input is answered in MCP's own shapes; attacks on the HTTP endpoint are
refused before any session opens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from actors.mcp import MCPServer
from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import Agent, Host
from runtime.app.mcp_tools import INPUT_SCHEMA, OUTPUT_SCHEMA, tool_name
from runtime.messages import AssistantMessage, ToolMessage
from tests.support.mcp_agents import echo
from tests.test_web_http import TWO_TOOLS, lookup
from tests.web.harness import WebServer, web_server

ROOT = Path(__file__).resolve().parents[1]
MCP = ("ai-sdk", "mcp")
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
SERVE = [sys.executable, "-m", "runtime", "serve", "--port", "0", "--protocols"]
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def finder() -> Agent:
    return Agent(name="finder", provider=ScriptedProvider(TWO_TOOLS), tools=[lookup])


def slow_agent() -> Agent:
    return Agent(name="slow", provider=ScriptedProvider([["thinking ", Sleep(30), "done"]]))


@asynccontextmanager
async def mcp_client(
    server: WebServer, *, mode: str = "auto", token: str | None = None
) -> AsyncIterator[Client]:
    """The official client on the served ``/mcp`` (with the bearer token, if any)."""
    headers = {"authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        transport = streamable_http_client(server.url + "/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


async def eventually(check: Any) -> None:
    """Wait (at most 10 s) until ``check()`` (or its awaited value) is true."""
    with trio.fail_after(10):
        while True:
            value = check()
            if not isinstance(value, bool):
                value = await value
            if value:
                return
            await trio.sleep(0.01)


class Progress:
    def __init__(self) -> None:
        self.seen: list[tuple[float, str | None]] = []

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        self.seen.append((progress, message))


# -- over streamable HTTP, with the official client -----------------------------------------


async def test_the_agent_is_one_tool_named_after_it_with_its_schemas():
    async with web_server(finder(), protocols=MCP) as server, mcp_client(server) as client:
        listed = await client.list_tools()
    (tool,) = listed.tools
    assert (tool.name, tool.title) == ("finder", "finder")
    assert tool.input_schema == INPUT_SCHEMA and tool.output_schema == OUTPUT_SCHEMA


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # the 2026 envelope, the handshake
async def test_a_call_answers_the_turns_text_and_streams_progress(mode):
    progress = Progress()
    async with web_server(finder(), protocols=MCP) as server:
        async with mcp_client(server, mode=mode) as client:
            result = await client.call_tool(
                "finder", {"prompt": "Find a and b"}, progress_callback=progress
            )
        session_id = result.structured_content["session_id"]
        stored = await server.host.store.load(session_id)
    answer = "Looking up a. Now b. Both found."
    assert not result.is_error
    assert [block.text for block in result.content] == [answer]
    assert result.structured_content == {
        "answer": answer,
        "session_id": session_id,
        "finish_reason": "stop",
    }
    messages = [m for m in progress.seen if not m[1].startswith("[tool")]
    assert "".join(message for _, message in messages) == answer
    assert [m for _, m in progress.seen if m.startswith("[tool")] == ["[tool lookup]"] * 2
    assert [p for p, _ in progress.seen] == list(range(1, len(progress.seen) + 1))
    assert stored is not None and [m.role for m in stored.messages][:2] == ["user", "assistant"]


async def test_a_session_id_continues_the_conversation_and_shows_on_the_chat_page():
    async with web_server(echo, protocols=MCP) as server, mcp_client(server) as client:
        first = await client.call_tool("echo", {"prompt": "one"})
        session_id = first.structured_content["session_id"]
        second = await client.call_tool("echo", {"prompt": "two", "session_id": session_id})
        named = await client.call_tool("echo", {"prompt": "three", "session_id": "mine"})
        async with httpx.AsyncClient(base_url=server.url) as page:
            listed = (await page.get("/api/sessions")).json()["sessions"]
    assert first.structured_content["answer"] == "echo #1: one"
    assert second.structured_content == {
        "answer": "echo #2: two",
        "session_id": session_id,
        "finish_reason": "stop",
    }
    assert named.structured_content["session_id"] == "mine"
    assert {s["session_id"]: s["title"] for s in listed} == {session_id: "one", "mine": "three"}


async def test_an_unknown_tool_is_the_jsonrpc_invalid_params_error():
    async with web_server(echo, protocols=MCP) as server, mcp_client(server) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("rm_rf", {"prompt": "x"})
        assert server.host.sessions == {}
    assert (caught.value.error.code, caught.value.error.message) == (-32602, "Unknown tool: rm_rf")


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({}, "prompt must be a non-empty string"),
        ({"prompt": 7}, "prompt must be a non-empty string"),
        ({"prompt": "x", "session_id": 3}, "session_id must be a string"),
        ({"prompt": "x", "session_id": "../../etc"}, "session_id: "),
        ({"prompt": "x", "sudo": True}, "unknown argument(s): sudo"),
    ],
    ids=["no-prompt", "prompt-not-text", "session-not-text", "forged-session", "extra"],
)
async def test_bad_arguments_are_a_tool_error_and_open_no_session(arguments, why):
    async with web_server(echo, protocols=MCP) as server, mcp_client(server) as client:
        result = await client.call_tool("echo", arguments)
        assert server.host.sessions == {}
        assert await server.host.store.list_sessions() == []
    assert result.is_error and result.structured_content is None
    assert result.content[0].text.startswith(f"invalid arguments for echo: {why}")


async def test_arguments_that_are_not_an_object_are_the_protocols_invalid_params():
    async with web_server(echo, protocols=MCP) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT) as raw:
            opened = await raw.post("/mcp", json=INIT)
            session = {"mcp-session-id": opened.headers["mcp-session-id"]}
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": ["x"]},
            }
            answered = await raw.post("/mcp", json=call, headers=session)
        assert server.host.sessions == {}
    assert '"code":-32602' in answered.text


async def test_a_forged_mcp_session_id_is_404_as_a_jsonrpc_error():
    async with web_server(echo, protocols=MCP) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT) as raw:
            await raw.post("/mcp", json=INIT)  # a real session exists: its id is not given
            forged = await raw.post(
                "/mcp",
                json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                headers={"mcp-session-id": "0" * 32, "mcp-protocol-version": "2025-11-25"},
            )
    assert forged.status_code == 404
    assert forged.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "Session not found"},
    }


async def test_a_failed_turn_is_an_is_error_result_and_is_stored_failed():
    def fail(request: Any) -> Any:
        raise ValueError("boom")

    agent = Agent(name="broken", provider=ScriptedProvider(responder=fail))
    async with web_server(agent, protocols=MCP) as server, mcp_client(server) as client:
        result = await client.call_tool("broken", {"prompt": "x", "session_id": "b1"})
        stored = await server.host.store.load("b1")
    assert result.is_error and result.content[0].text.startswith("the turn failed: ")
    assert "(session b1)" in result.content[0].text
    assert stored is not None
    assert [m.status for m in stored.messages if isinstance(m, AssistantMessage)] == ["failed"]


async def test_a_session_running_a_turn_answers_a_busy_tool_error():
    async with web_server(slow_agent(), protocols=MCP) as server, mcp_client(server) as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.call_tool, "slow", {"prompt": "a", "session_id": "s"})
            await eventually(lambda: "s" in server.host.sessions and server.host.sessions["s"].busy)
            busy = await client.call_tool("slow", {"prompt": "b", "session_id": "s"})
            server.host.cancel_turns("test over")
    assert busy.is_error and busy.content[0].text == "session 's' is already running a turn"


async def test_a_request_reusing_the_id_of_one_in_flight_is_refused_and_the_first_answered():
    # The transport keeps one response stream per request id in a session: a second
    # request with the id of one still running took it over, and the first was never
    # answered (its turn ran; its POST waited as long as the client held it).
    agent = Agent(
        name="queue",
        provider=ScriptedProvider(turns=[[["first ", Sleep(0.5), "answer"]], [["second"]]]),
    )
    answers: dict[str, httpx.Response] = {}
    async with web_server(agent, protocols=MCP) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT, timeout=30) as raw:
            session = await open_raw_session(raw)

            async def call(name: str, session_id: str) -> None:
                arguments = {"prompt": name, "session_id": session_id}
                params = {"name": "queue", "arguments": arguments}
                request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
                answers[name] = await raw.post("/mcp", json=request, headers=session)

            with trio.fail_after(20):  # a guard: the first was never answered
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "first", "a")
                    await eventually(lambda: "a" in server.host.sessions)
                    await call("again", "b")
    assert answers["again"].status_code == 409
    assert answers["again"].json()["id"] == 7
    assert "request id 7 is in use" in answers["again"].json()["error"]["message"]
    assert '"answer":"first answer"' in answers["first"].text
    assert "b" not in server.host.sessions  # the refused call ran nothing


async def open_raw_session(raw: httpx.AsyncClient) -> dict[str, str]:
    """A session initialized over raw HTTP: the headers its requests carry."""
    opened = await raw.post("/mcp", json=INIT)
    session = {
        "mcp-session-id": opened.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-11-25",
    }
    notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await raw.post("/mcp", json=notice, headers=session)
    return session


async def test_the_same_request_id_in_two_sessions_is_two_calls_and_a_cancel_stays_in_its_own():
    agent = Agent(
        name="queue",
        provider=ScriptedProvider(responder=lambda request: [Sleep(0.5), "answer"]),
    )
    answers: dict[str, httpx.Response] = {}
    async with web_server(agent, protocols=MCP) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT, timeout=30) as raw:
            one, two = await open_raw_session(raw), await open_raw_session(raw)

            async def call(name: str, session: dict[str, str]) -> None:
                params = {"name": "queue", "arguments": {"prompt": name, "session_id": name}}
                request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
                answers[name] = await raw.post("/mcp", json=request, headers=session)

            with trio.fail_after(20):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call, "a", one)
                    nursery.start_soon(call, "b", two)
                    await eventually(lambda: {"a", "b"} <= set(server.host.sessions))
                    cancel = {"requestId": 7, "reason": "b cancels its own call"}
                    notice = {"jsonrpc": "2.0", "method": "notifications/cancelled"}
                    await raw.post("/mcp", json={**notice, "params": cancel}, headers=two)
    assert '"answer":"answer"' in answers["a"].text
    assert "Request cancelled" in answers["b"].text


@pytest.mark.parametrize("on_busy", ["enqueue", "steer"])  # steer: a call needs its answer
async def test_a_session_that_queues_runs_a_second_call_after_the_first(on_busy):
    agent = Agent(
        name="queue",
        provider=ScriptedProvider(turns=[[["first ", Sleep(0.5), "answer"]], [["second answer"]]]),
        on_busy=on_busy,
    )
    results: dict[str, Any] = {}
    async with web_server(agent, protocols=MCP) as server, mcp_client(server) as client:

        async def call(prompt: str) -> None:
            results[prompt] = await client.call_tool("queue", {"prompt": prompt, "session_id": "q"})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "a")
            await eventually(lambda: "q" in server.host.sessions and server.host.sessions["q"].busy)
            nursery.start_soon(call, "b")
        stored = await server.host.store.load("q")
    assert results["a"].structured_content["answer"] == "first answer"
    assert results["b"].structured_content["answer"] == "second answer"
    assert stored is not None and [m.text for m in stored.messages if m.role == "user"] == [
        "a",
        "b",
    ]


def streamed(progress: Progress) -> str:
    return "".join(message or "" for _, message in progress.seen)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_cancelled_call_cancels_the_turn_and_it_is_saved_interrupted(mode):
    progress = Progress()
    async with web_server(slow_agent(), protocols=MCP) as server:
        async with mcp_client(server, mode=mode) as client:
            async with trio.open_nursery() as nursery:

                async def call() -> None:
                    args = {"prompt": "x", "session_id": "c"}
                    await client.call_tool("slow", args, progress_callback=progress)

                nursery.start_soon(call)
                # "thinking " streams as two deltas: cancelling after the first saved
                # "thinking" on a slow machine; the client gives up once both are out
                await eventually(lambda: streamed(progress) == "thinking ")
                nursery.cancel_scope.cancel()

        async def saved() -> bool:
            stored = await server.host.store.load("c")
            return stored is not None and any(
                isinstance(m, AssistantMessage) for m in stored.messages
            )

        await eventually(saved)
        stored = await server.host.store.load("c")
    (assistant,) = [m for m in stored.messages if isinstance(m, AssistantMessage)]
    assert assistant.status == "interrupted" and assistant.text == "thinking "


async def test_a_turn_waiting_for_approval_is_a_tool_error_naming_the_call():
    from runtime import tool

    @tool(needs_approval=True)
    async def wipe(path: str) -> str:
        """Wipe a path."""
        return "wiped"

    steps = [[*tool_call("wipe", {"path": "/"}, tool_call_id="W")], ["ok"]]
    agent = Agent(name="wiper", provider=ScriptedProvider(steps), tools=[wipe])
    async with web_server(agent, protocols=MCP) as server, mcp_client(server) as client:
        result = await client.call_tool("wiper", {"prompt": "wipe", "session_id": "w"})
    assert result.is_error
    assert result.content[0].text.startswith("the turn waits for a decision on wipe (")


# -- the checks in front of it ---------------------------------------------------------------


async def test_the_token_is_required_and_refused_in_the_bearer_shape():
    async with web_server(echo, protocols=MCP, token="s3cret") as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT) as raw:
            missing = await raw.post("/mcp", json=INIT)
            wrong = await raw.post("/mcp", json=INIT, headers={"authorization": "Bearer nope"})
        async with mcp_client(server, token="s3cret") as client:
            result = await client.call_tool("echo", {"prompt": "hi", "session_id": "t"})
        assert await server.host.store.list_sessions() != []
    for refused in (missing, wrong):
        assert refused.status_code == 401
        assert refused.json() == {
            "error": "invalid_token",
            "error_description": "missing or wrong bearer token",
        }
        assert refused.headers["www-authenticate"].startswith('Bearer error="invalid_token"')
    assert result.structured_content["answer"] == "echo #1: hi"


async def test_the_official_client_with_a_wrong_token_fails_and_opens_nothing():
    async with web_server(echo, protocols=MCP, token="s3cret") as server:
        with pytest.raises(BaseExceptionGroup) as caught:
            async with mcp_client(server, token="wrong") as client:
                await client.list_tools()
        assert server.host.sessions == {}
    refused, rest = caught.value.split(MCPError)
    assert refused is not None and rest is None


async def test_a_forged_host_is_refused_as_a_jsonrpc_error():
    async with web_server(echo, protocols=MCP) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT) as raw:
            refused = await raw.post("/mcp", json=INIT, headers={"host": "evil.example"})
        assert server.host.sessions == {}
    assert refused.status_code == 403
    body = refused.json()
    assert body["jsonrpc"] == "2.0" and body["error"]["code"] == -32600
    assert "DNS rebinding" in body["error"]["message"]


async def test_a_cross_site_request_is_refused_and_runs_nothing():
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"prompt": "pwned", "session_id": "x"}},
    }
    async with web_server(echo, protocols=MCP) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT) as raw:
            cross = await raw.post("/mcp", json=call, headers={"origin": "https://evil.example"})
            site = await raw.post("/mcp", json=call, headers={"sec-fetch-site": "cross-site"})
            plain = await raw.post(  # a <form> or no-cors fetch: no JSON content type
                "/mcp",
                content=b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"}',
                headers={"content-type": "text/plain", "accept": ACCEPT["accept"]},
            )
        assert server.host.sessions == {}
        assert await server.host.store.list_sessions() == []
    assert (cross.status_code, site.status_code, plain.status_code) == (403, 403, 415)
    assert "CSRF" in cross.json()["error"]["message"]
    assert plain.json()["error"]["code"] == -32600


async def test_only_the_named_protocols_serve_mcp():
    async with web_server(echo) as server, httpx.AsyncClient(base_url=server.url) as raw:
        assert (await raw.post("/mcp", json=INIT, headers=ACCEPT)).status_code == 404


# -- in other processes: serve, mcp-server over stdio, Axon's own client -------------------------


def stdio_params(*args: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "runtime", "mcp-server", *args],
        env={"PYTHONPATH": str(ROOT), **env},
        cwd=str(ROOT),
    )


async def test_mcp_server_serves_the_official_client_over_stdio():
    progress = Progress()
    params = stdio_params("--agent", "tests.support.mcp_agents:echo")
    async with Client(stdio_client(params)) as client:
        (tool,) = (await client.list_tools()).tools
        first = await client.call_tool(tool.name, {"prompt": "hello"}, progress_callback=progress)
        session_id = first.structured_content["session_id"]
        again = await client.call_tool(tool.name, {"prompt": "again", "session_id": session_id})
        bad = await client.call_tool(tool.name, {"prompt": ""})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("nope", {"prompt": "x"})
    assert tool.name == "echo"
    assert first.structured_content["answer"] == "echo #1: hello"
    assert "".join(message for _, message in progress.seen) == "echo #1: hello"
    assert again.structured_content["answer"] == "echo #2: again"
    assert bad.is_error and unknown.value.error.code == -32602


async def test_sigterm_saves_the_running_turn_interrupted_and_ends_mcp_server(tmp_path):
    pidfile, store = tmp_path / "pid", tmp_path / "s.db"
    params = stdio_params(
        "--agent",
        "tests.support.mcp_agents:slow",
        "--store",
        str(store),
        AXON_TEST_PIDFILE=str(pidfile),
    )
    streaming = trio.Event()
    cut_off: list[BaseException] = []
    seen = Progress()

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        await seen(progress, total, message)
        if streamed(seen) == "thinking ":  # both of its deltas, not the first alone
            streaming.set()

    async def call(client: Client) -> None:
        try:
            await client.call_tool("slow", {"prompt": "x", "session_id": "z"}, None, on_progress)
        except MCPError as exc:
            cut_off.append(exc)

    async with Client(stdio_client(params), mode="legacy") as client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, client)
            with trio.fail_after(30):
                await streaming.wait()  # the turn runs: the agent now sleeps 30 s
            os.kill(int(pidfile.read_text()), signal.SIGTERM)  # the server this test started
    async with Host.open(store=str(store), log_tap=False) as host:
        stored = await host.store.load("z")
    assert len(cut_off) == 1  # the connection closed under the call
    assert stored is not None
    (assistant,) = [m for m in stored.messages if isinstance(m, AssistantMessage)]
    assert assistant.status == "interrupted" and assistant.text == "thinking "


def test_mcp_server_with_bad_options_is_one_error_line_and_speaks_no_protocol():
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "mcp-server", "--agent", "no_such_module:agent"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        input="",
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: --agent 'no_such_module:agent'")
    assert proc.stderr.count("\n") == 1


def test_the_command_line_loads_no_mcp_package_until_it_serves():
    code = (
        "import sys, runtime.app.cli as cli; cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def delegating_agent(server: MCPServer, session_id: str | None = None) -> Agent:
    """An Axon agent whose model asks the remote ``echo`` agent (over MCP), then answers."""
    arguments = {"prompt": "ping"} | ({"session_id": session_id} if session_id else {})
    steps = [[*tool_call("echo", arguments, tool_call_id="E")], ["pong"]]
    return Agent(name="outer", provider=ScriptedProvider(steps), tools=[server])


def tool_outputs(messages: Any) -> list[Any]:
    return [m.output for m in messages if isinstance(m, ToolMessage)]


async def test_an_axon_agent_uses_an_axon_agent_over_stdio_mcp():
    remote = MCPServer.stdio(
        sys.executable,
        ["-m", "runtime", "mcp-server", "--agent", "tests.support.mcp_agents:echo"],
        env={"PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        name="remote",
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(delegating_agent(remote))
        result = await session.run("ask the other agent")
    (output,) = tool_outputs(session.messages)
    assert output["answer"] == "echo #1: ping" and output["finish_reason"] == "stop"
    assert result.text == "pong"


async def test_an_axon_agent_uses_a_served_axon_agent_over_http_mcp_with_the_token():
    proc = await trio.lowlevel.open_process(
        [*SERVE, "mcp", "--agent", "tests.support.mcp_agents:echo", "--token", "s3cret"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
    )
    try:
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
        banner = line.decode()
        url = banner.split(", MCP ", 1)[1].split(")")[0]
        assert url.endswith("/mcp")
        remote = MCPServer.http(url, headers={"Authorization": "Bearer s3cret"}, name="remote")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(delegating_agent(remote, session_id="shared"))
            await session.run("first")
            await session.run("second")
        outputs = tool_outputs(session.messages)
        proc.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert [o["answer"] for o in outputs] == ["echo #1: ping", "echo #2: ping"]
    assert {o["session_id"] for o in outputs} == {"shared"}


def test_tool_names_keep_to_what_model_apis_take():
    assert tool_name("support bot/v2") == "support_bot_v2"
    assert tool_name("") == "agent"
    assert len(tool_name("x" * 200)) == 64
