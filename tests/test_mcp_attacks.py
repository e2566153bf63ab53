"""MCP attacked from both sides: a hostile server Axon's client connects to
(tests/support/hostile_mcp_server.py, raw JSON-RPC on stdio) and a careless client of
the ``/mcp`` endpoint (raw HTTP). What held is in benchmarks/journal/workers.md; each
test here is a defect that was found and fixed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from structlog.testing import capture_logs

from actors.mcp import MCPServer, definition_chars
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, Host, tool
from runtime.errors import ConfigurationError, MCPServerUnavailable, ToolDefinitionError
from tests.support.loopback import Recorded, Reply, loopback_server
from tests.support.mcp_agents import echo
from tests.test_mcp_server import INIT, MCP
from tests.web.harness import web_server

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = str(ROOT / "tests" / "support" / "hostile_mcp_server.py")


def hostile(*modes: str, **env: str) -> MCPServer:
    return MCPServer.stdio(sys.executable, [HOSTILE, *modes], name="hostile", env=env)


def calling(*calls: tuple[str, dict]) -> ScriptedProvider:
    """One step calling ``calls`` (in parallel), then a step answering ``done``."""
    chunks = [c for name, args in calls for c in tool_call(name, args, tool_call_id=f"c_{name}")]
    return ScriptedProvider([chunks, ["done"]])


async def run_turn(agent: Agent):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("go")
        actor = host.mcp_servers[agent.mcp_servers[0]]
        return session, result, actor


def tool_messages(session) -> dict:
    return {m.tool_name: m for m in session.messages if m.role == "tool"}


# -- a hostile server -----------------------------------------------------------------------


async def test_a_server_error_with_the_generic_code_is_its_message_not_a_death():
    # -32000 is JSON-RPC's generic server error; the mcp package resolves a request cut
    # off by a closed connection with the same code. It was reported as a death, the
    # server's own message lost (and no restart followed: the server was alive).
    agent = Agent(provider=calling(("echo", {"text": "hi"})), tools=[hostile("generic-error")])
    session, result, actor = await run_turn(agent)
    error = tool_messages(session)["echo"].error
    assert "answered with an error: quota exceeded for this month" in error
    assert "died" not in error
    assert actor.last_error is None  # it never crashed
    assert result.finish_reason == "stop"


async def test_a_schema_that_is_its_own_reference_is_an_argument_error_not_an_executor_crash():
    # Validating against {"$ref": "#"} recursed until RecursionError, which crashed the
    # host-wide tool executor: every call it ran, of every session, failed with it.
    agent = Agent(
        provider=calling(("loop", {"x": 1}), ("echo", {"text": "still here"})),
        tools=[hostile()],
    )
    session, result, _ = await run_turn(agent)
    saved = tool_messages(session)
    assert saved["loop"].error == (
        "the schema of loop refers to itself without end: it cannot check any arguments"
    )
    assert saved["echo"].output == "still here"
    assert result.text == "done"


async def test_a_line_without_end_ends_the_connection_at_the_limit():
    # The mcp package's reader buffered a line without a limit, joining each chunk to
    # the line so far and splitting it all again (CPU quadratic in the line: 30 s of the
    # event loop for a 50 MB result, every session of the host stalled).
    agent = Agent(
        provider=calling(("echo", {"text": "hi"})),
        tools=[hostile("endless-line", MCP_TEST_BYTES=str(3 * 1024 * 1024))],
        budget=Budget(tool_timeout=20),  # without the limit, the call waited for this
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("go")
    error = tool_messages(session)["echo"].error
    assert "MCP server 'hostile' died during the call" in error
    assert "sent a message longer than 1048576 bytes" in error


async def test_a_message_over_one_mib_ends_the_connection_by_default():
    # A message is parsed whole on the event loop (the mcp package's parser holds the
    # GIL, so a thread frees nothing): at the former 32 MiB one held every session of the
    # host 0.9 to 23 s; the default limit is now 1 MiB, the mcp package's own SSE limit.
    agent = Agent(
        provider=calling(("echo", {"text": "hi"})),
        tools=[hostile("big-answer", MCP_TEST_BYTES=str(1024 * 1024 + 1))],
    )
    session, result, _ = await run_turn(agent)
    error = tool_messages(session)["echo"].error
    assert error == (
        "tool echo raised MCPServerDied: MCP server 'hostile' died during the call "
        "(sent a message longer than 1048576 bytes)"
    )
    assert result.finish_reason == "stop"


async def test_max_message_bytes_lets_a_longer_message_through():
    server = MCPServer.stdio(
        sys.executable,
        [HOSTILE, "big-answer"],
        name="hostile",
        env={"MCP_TEST_BYTES": str(1024 * 1024 + 1)},
        max_message_bytes=2 * 1024 * 1024,
    )
    agent = Agent(
        provider=calling(("echo", {"text": "hi"})),
        tools=[server],
        budget=Budget(max_tool_result_chars=None),
    )
    session, _, _ = await run_turn(agent)
    assert tool_messages(session)["echo"].output == "z" * (1024 * 1024 + 1)


def test_max_message_bytes_must_be_a_positive_int():
    with pytest.raises(ConfigurationError, match="max_message_bytes must be a positive int"):
        MCPServer.http("http://127.0.0.1:1/mcp", max_message_bytes=0)


async def test_a_garbage_line_with_a_key_is_logged_without_the_key(caplog):
    # The mcp package's parser logged the line, and its error (which the actor logs)
    # quoted it: a pydantic error cuts it to 'sk-ant-api...QQQ', which redaction, looking
    # for a whole key, let through.
    agent = Agent(provider=calling(("echo", {"text": "hi"})), tools=[hostile("garbage-with-key")])
    with capture_logs() as logs:
        session, _, _ = await run_turn(agent)
    assert tool_messages(session)["echo"].output == "hi"
    [seen] = [line for line in logs if line["event"] == "mcp.transport-error"]
    assert seen["error"] == (
        "MCPServerError: a line of 74 characters is no JSON-RPC message: Invalid JSON: "
        "expected ident at line 1 column 2 (it began 'not json: the key is [redacted]')"
    )
    assert "QQQQ" not in caplog.text


async def test_a_tool_added_mid_session_under_a_taken_name_is_refused_not_every_turn():
    # A clash is a configuration error when the session opens (it raises there), but a
    # server that added such a tool later (tools/list_changed) failed every later turn
    # of every session with its ToolDefinitionError.
    @tool
    def local(x: int) -> int:
        """A local tool."""
        return x

    offered = []

    def responder(request):
        offered.append(sorted(t.name for t in request.tools))
        if len(offered) in (1, 3):
            return tool_call("echo", {"text": "x"}, tool_call_id=f"c{len(offered)}")
        return ["done"]

    agent = Agent(
        provider=ScriptedProvider(responder=responder), tools=[local, hostile("grow-clash")]
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        first = await session.run("first")
        second = await session.run("second")
        refused = host.mcp_servers[agent.mcp_servers[0]].refused
    assert (first.finish_reason, second.finish_reason) == ("stop", "stop")
    assert offered[1:] == [["echo", "local", "loop"]] * 3
    assert refused["local"].startswith(
        "tool 'local' of MCP server 'hostile' has the same name as a local tool"
    )


def offered_tools(agent_tools: list[list[str]]):
    """A provider answering ``done``, recording the tool names of each request."""

    def responder(request):
        agent_tools.append([t.name for t in request.tools])
        return ["done"]

    return ScriptedProvider(responder=responder)


async def test_a_server_listing_thousands_of_tools_has_only_max_tools_offered():
    # Every tool a server listed was offered in every model request: a server listing a
    # million tools (one page, under the message limit) flooded each request, and the
    # mcp package read them all into models (seconds of the event loop, gigabytes).
    offered: list[list[str]] = []
    agent = Agent(
        provider=offered_tools(offered), tools=[hostile("many-tools", MCP_TEST_TOOLS="5000")]
    )
    with capture_logs() as logs:
        await run_turn(agent)
    assert [len(names) for names in offered] == [512]
    assert offered[0][:3] == ["echo", "loop", "t0"]
    [warned] = [line for line in logs if line["event"] == "mcp.too-many-tools"]
    assert warned["error"] == (
        "MCP server 'hostile' listed more than 512 tools (at least 5002): only the first 512 "
        "(max_tools) are offered"
    )


async def test_max_tools_is_configurable_per_server():
    offered: list[list[str]] = []
    server = MCPServer.stdio(
        sys.executable, [HOSTILE, "many-tools"], env={"MCP_TEST_TOOLS": "10"}, max_tools=3
    )
    await run_turn(Agent(provider=offered_tools(offered), tools=[server]))
    assert offered == [["echo", "loop", "t0"]]


async def test_a_tool_with_an_input_schema_over_the_size_cap_is_refused_the_others_offered():
    offered: list[list[str]] = []
    agent = Agent(
        provider=offered_tools(offered),
        tools=[hostile("huge-schema", MCP_TEST_BYTES=str(100_000))],
    )
    _, _, actor = await run_turn(agent)
    assert offered == [["echo", "loop"]]
    assert actor.refused["huge"].startswith(
        "MCP server 'hostile': tool 'huge' has an input schema of 100"
    )
    assert actor.refused["huge"].endswith("characters, more than the 32768 of max_tool_chars")


async def test_a_description_over_the_size_cap_is_cut_and_logged():
    agent = Agent(
        provider=offered_tools([]), tools=[hostile("huge-description", MCP_TEST_BYTES="100000")]
    )
    with capture_logs() as logs:
        _, _, actor = await run_turn(agent)
    [huge] = [t for t in actor.tools if t.name == "huge"]
    assert huge.description == "y" * 32768
    [warned] = [line for line in logs if line["event"] == "mcp.description-cut"]
    assert (warned["tool"], warned["chars"], warned["kept"]) == ("huge", 100000, 32768)


async def test_servers_whose_tools_pass_the_agents_cap_refuse_the_session_naming_each():
    # Each server's tools are capped alone (max_tools, max_tool_chars); nothing capped
    # them all together: twenty servers at their caps sent over 600 KB of definitions in
    # every model request. Two servers over a cap of 400 characters here.
    @tool
    def local(x: int) -> int:
        """A local tool."""
        return x

    agent = Agent(
        name="lead",
        provider=offered_tools([]),
        tools=[
            local,
            MCPServer.stdio(sys.executable, [HOSTILE], name="a", prefix="a"),
            MCPServer.stdio(sys.executable, [HOSTILE], name="b", prefix="b"),
        ],
        max_tools_chars=400,
    )
    # a_echo (6), "Echo the text back." (19), its schema as JSON (57); a_loop: 6, 47, 28
    local_chars, server_chars = definition_chars(local), 82 + 81
    async with Host.open(log_tap=False) as host:
        with pytest.raises(ToolDefinitionError) as raised:
            await host.open_session(agent)
        assert await host.store.list_sessions() == []
    total = local_chars + 2 * server_chars
    assert str(raised.value) == (
        f"the tools of agent 'lead' come to {total} characters of definitions (names, "
        "descriptions, input schemas), more than its max_tools_chars (400), and every model "
        f"request carries them all: its own: 1 tool, {local_chars}; MCP server 'a': 2 tools, "
        f"{server_chars}; MCP server 'b': 2 tools, {server_chars}. Offer fewer (a server "
        "less, MCPServer(max_tools=..., max_tool_chars=...)) or raise "
        "Agent(max_tools_chars=...)"
    )


async def test_a_server_whose_tools_pass_the_default_cap_refuses_the_session():
    # 9 tools of 30,000 characters each: under the server's own caps, over the agent's
    # 256 KiB (262,144 characters) all together.
    server = hostile("many-tools", MCP_TEST_TOOLS="9", MCP_TEST_DESCRIPTION="30000")
    agent = Agent(provider=offered_tools([]), tools=[server])
    async with Host.open(log_tap=False) as host:
        with pytest.raises(ToolDefinitionError, match=r"more than its max_tools_chars \(262,144\)"):
            await host.open_session(agent)


async def test_a_tool_a_server_adds_past_the_agents_cap_is_left_out_not_every_turn_failed():
    offered: list[list[str]] = []

    def responder(request):
        offered.append(sorted(t.name for t in request.tools))
        if len(offered) == 1:
            return tool_call("echo", {"text": "x"}, tool_call_id="c1")
        return ["done"]

    agent = Agent(
        provider=ScriptedProvider(responder=responder),
        tools=[hostile("grow-big", MCP_TEST_BYTES="1000")],
        max_tools_chars=1000,
    )
    with capture_logs() as logs:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            first = await session.run("first")
            second = await session.run("second")
            refused = host.mcp_servers[agent.mcp_servers[0]].refused
    assert (first.finish_reason, second.finish_reason) == ("stop", "stop")
    assert offered == [["echo", "loop"]] * 3
    assert refused["big"] == (
        "left out: the tools of agent 'assistant' would pass its max_tools_chars (1,000 "
        "characters of tool definitions in each request)"
    )
    [warned] = [line for line in logs if line["event"] == "mcp.tools-left-out"]
    assert (warned["server"], warned["tools"], warned["first"]) == ("hostile", 1, "big")


def test_max_tools_chars_must_be_a_positive_int():
    with pytest.raises(ConfigurationError, match="max_tools_chars must be an int >= 1"):
        Agent(max_tools_chars=0)


class ForgetfulServer:
    """A streamable HTTP MCP server that restarts (forgetting its sessions) when its
    tool is first called: that call gets the 404 a server answers a session it does not
    know (as Axon's own endpoint does: a JSON-RPC error body), later ones work in a new
    session."""

    def __init__(self) -> None:
        self.sessions: set[str] = set()
        self.started = 0
        self.restarted = False

    def __call__(self, request: Recorded) -> Reply:
        if request.method != "POST":
            return Reply(status=405, content_type="text/plain")
        message = json.loads(request.body)
        if "id" not in message:
            return Reply(status=202, content_type="application/json")
        method, params = message["method"], message.get("params") or {}
        if method == "initialize":
            self.started += 1
            session = f"s{self.started}"
            self.sessions.add(session)
            info = {"name": "forgetful", "version": "1"}
            return self.result(
                message,
                {
                    "protocolVersion": params["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": info,
                },
                session,
            )
        if method == "tools/call" and not self.restarted:
            self.restarted = True
            self.sessions.clear()
        if request.headers.get("mcp-session-id") not in self.sessions:
            error = {"code": -32600, "message": "Session not found"}
            body = json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode()
            return Reply(status=404, body=body, content_type="application/json")
        if method == "tools/list":
            tool = {"name": "echo", "inputSchema": {"type": "object"}}
            return self.result(message, {"tools": [tool]})
        text = request.headers["mcp-session-id"]
        return self.result(message, {"content": [{"type": "text", "text": text}]})

    def result(self, message: dict, result: dict, session: str | None = None) -> Reply:
        body = json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}).encode()
        headers = [("mcp-session-id", session)] if session else []
        return Reply(body=body, content_type="application/json", headers=headers)


async def test_an_http_server_that_lost_the_session_is_reconnected_in_a_new_one():
    # The specification: a 404 to a request carrying a session id means the session is
    # gone, and the client must initialize a new one. The mcp package's client does not,
    # and nothing restarted the connection: every later call failed the same way until
    # the host restarted.
    async with loopback_server(respond=ForgetfulServer()) as web:
        turns = [[tool_call("echo", {}, tool_call_id=f"c{n}"), ["done"]] for n in (1, 2)]
        agent = Agent(
            provider=ScriptedProvider(turns=turns),
            tools=[MCPServer.http(web.url + "/mcp", name="web")],
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            await session.run("first")
            await session.run("second")
    first, second = [m for m in session.messages if m.role == "tool"]
    assert "MCP server 'web' died during the call" in first.error
    assert "ended the session (HTTP 404)" in first.error
    assert second.output == "s2"


class CuttingServer(ForgetfulServer):
    """Its tool's answer is an SSE stream cut off before the answer's event ends."""

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") != "tools/call":
            self.restarted = True  # never forgets its sessions
            return super().__call__(request)
        answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"content": []}}
        body = b"event: message\ndata: " + json.dumps(answer).encode() + b"\n\n"
        return Reply(body=body, drop_after=len(body) - 10)


async def test_an_http_answer_cut_off_mid_stream_is_a_tool_error_saying_so():
    # It said the server "died during the call", though nothing restarted it (the
    # connection lives on): the mcp package's own reason was lost.
    async with loopback_server(respond=CuttingServer()) as web:
        agent = Agent(
            provider=calling(("echo", {})),
            tools=[MCPServer.http(web.url + "/mcp", name="web")],
        )
        session, result, actor = await run_turn(agent)
    error = tool_messages(session)["echo"].error
    assert "MCP server 'web' answered with an error: SSE stream ended without a response" in error
    assert actor.last_error is None
    assert result.finish_reason == "stop"


class HugeAnswerServer(ForgetfulServer):
    """Its tool answers with a JSON body of ``size`` bytes."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.restarted = True  # never forgets its sessions
        self.size = size

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") != "tools/call":
            return super().__call__(request)
        return self.result(message, {"content": [{"type": "text", "text": "y" * self.size}]})


async def test_an_http_json_answer_over_the_limit_is_an_error_for_its_call():
    # The mcp package reads a JSON answer whole, however long (its SSE events it limits
    # to 1 MiB): a server could make the host hold gigabytes. The limit is 1 MiB by
    # default (it was 32 MiB: a message is parsed on the event loop, see MAX_MESSAGE_BYTES).
    async with loopback_server(respond=HugeAnswerServer(2 * 1024 * 1024)) as web:
        agent = Agent(
            provider=calling(("echo", {})),
            tools=[MCPServer.http(web.url + "/mcp", name="web")],
        )
        session, result, _ = await run_turn(agent)
    assert tool_messages(session)["echo"].error == (
        "tool echo raised MCPToolError: MCP server 'web' answered with an error: Failed to "
        "parse JSON response: the answer is longer than 1048576 bytes"
    )
    assert result.finish_reason == "stop"


class RefusingServer(ForgetfulServer):
    """Answers ``method`` with HTTP ``status`` and ``body``; anything else as it should."""

    def __init__(self, status: int, method: str, body: bytes, content_type: str) -> None:
        super().__init__()
        self.restarted = True  # never forgets its sessions
        self.status, self.method, self.body, self.type = status, method, body, content_type

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") == self.method:
            return Reply(status=self.status, body=self.body, content_type=self.type)
        return super().__call__(request)


KEY = "sk-ant-api03-" + "Q" * 40
TOKEN = "tok-1234567890abcdef"  # no key shape: only known as a configured header's value


def refusing(status: int, method: str = "tools/call", body: bytes = b"", json_body=None):
    if json_body is not None:
        return RefusingServer(status, method, json.dumps(json_body).encode(), "application/json")
    return RefusingServer(status, method, body, "text/plain")


async def call_refused(server: RefusingServer):
    async with loopback_server(respond=server) as web:
        config = MCPServer.http(
            web.url + "/mcp", name="web", headers={"Authorization": f"Token {TOKEN}"}
        )
        agent = Agent(provider=calling(("echo", {})), tools=[config])
        return await run_turn(agent)


async def test_an_http_401_to_a_call_is_a_tool_error_saying_the_status():
    # The mcp package answered any non-2xx status whose body is no JSON-RPC error with
    # "Server returned an error response": the model never learnt it was refused.
    server = refusing(401, body=f"bad key {KEY}".encode())
    session, result, actor = await call_refused(server)
    assert tool_messages(session)["echo"].error == (
        "tool echo raised MCPToolError: MCP server 'web' answered 401 Unauthorized"
    )
    assert actor.last_error is None  # the connection lives on
    assert result.finish_reason == "stop"


async def test_an_http_500_to_a_call_is_a_tool_error_saying_the_status():
    session, _, _ = await call_refused(refusing(500, body=b"Traceback (most recent call last)"))
    assert tool_messages(session)["echo"].error == (
        "tool echo raised MCPToolError: MCP server 'web' answered 500 Internal Server Error"
    )


async def test_an_http_error_status_keeps_the_servers_message_without_the_header_it_echoes():
    error = {"code": -32001, "message": f"token {TOKEN} expired; Authorization: Bearer {KEY}"}
    server = refusing(403, json_body={"jsonrpc": "2.0", "id": None, "error": error})
    with capture_logs() as logs:
        session, _, _ = await call_refused(server)
    seen = tool_messages(session)["echo"].error
    assert seen.startswith(
        "tool echo raised MCPToolError: MCP server 'web' answered 403 Forbidden: token "
        "[redacted] expired"
    )
    assert TOKEN not in seen + repr(logs)
    assert "QQQQ" not in seen + repr(logs)


async def test_an_http_401_at_connect_is_an_unavailable_error_naming_the_status():
    # Opening the session said only "could not start: MCPError: Server returned an
    # error response": nothing told the user that the server refused its credentials.
    async with loopback_server(respond=refusing(401, method="initialize")) as web:
        agent = Agent(provider=calling(), tools=[MCPServer.http(web.url + "/mcp", name="web")])
        async with Host.open(log_tap=False) as host:
            with pytest.raises(MCPServerUnavailable) as refused:
                await host.open_session(agent)
    assert str(refused.value) == (
        "MCP server 'web' could not start: it answered 401 Unauthorized: its credentials "
        "(the headers given to MCPServer.http) are missing or not accepted"
    )


class CrowdedServer(ForgetfulServer):
    """Lists ``count`` tools in one JSON answer."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.restarted = True  # never forgets its sessions
        self.count = count

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") != "tools/list":
            return super().__call__(request)
        tools = [{"name": f"t{n}", "inputSchema": {"type": "object"}} for n in range(self.count)]
        return self.result(message, {"tools": tools})


async def test_an_http_server_listing_thousands_of_tools_has_only_max_tools_offered():
    offered: list[list[str]] = []
    async with loopback_server(respond=CrowdedServer(3000)) as web:
        server = MCPServer.http(web.url + "/mcp", name="web")
        await run_turn(Agent(provider=offered_tools(offered), tools=[server]))
    assert [len(names) for names in offered] == [512]
    assert offered[0][-1] == "t511"


# -- a careless client of the /mcp endpoint --------------------------------------------------


async def test_a_body_over_the_limit_is_a_jsonrpc_error_the_official_client_reads():
    # The transport's own limit answered 413 in plain text: the official client, which
    # reads a JSON-RPC error from any non-2xx JSON body, said only "Server returned an
    # error response", and a raw client got no JSON at all.
    async with web_server(echo, protocols=MCP, max_body=4096) as server:
        async with create_mcp_http_client() as http:
            transport = streamable_http_client(server.url + "/mcp", http_client=http)
            async with Client(transport) as client:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("echo", {"prompt": "x" * 10_000})
        async with httpx.AsyncClient(base_url=server.url) as raw:
            chunked = await raw.post(  # no Content-Length: the limit counts what arrives
                "/mcp",
                content=_chunks(b"[" + b" " * 10_000 + b"]"),
                headers={
                    "accept": "application/json, text/event-stream",
                    "content-type": "application/json",
                },
            )
        assert server.host.sessions == {}
    assert refused.value.error.message == "Request body too large"
    assert chunked.status_code == 413
    assert chunked.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "Request body too large"},
    }


async def _chunks(body: bytes):
    for start in range(0, len(body), 1024):
        yield body[start : start + 1024]


async def test_a_get_from_another_origin_opens_no_stream():
    # The guard let every GET pass its Origin check (it changes nothing); on /mcp a GET
    # opens the stream of a session's server messages, and the specification asks a
    # server to refuse every request whose Origin is not allowed (403).
    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    async with web_server(echo, protocols=MCP) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as raw:
            opened = await raw.post("/mcp", json=INIT)
            session = {
                "mcp-session-id": opened.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-11-25",
                "accept": "text/event-stream",
            }
            cross = await raw.get("/mcp", headers={**session, "origin": "https://evil.example"})
            site = await raw.get("/mcp", headers={**session, "sec-fetch-site": "cross-site"})
            async with raw.stream("GET", "/mcp", headers=session) as own:
                status = own.status_code  # the client's own stream still opens
    assert (cross.status_code, site.status_code, status) == (403, 403, 200)
    assert "CSRF" in cross.json()["error"]["message"]
