"""A stdio MCP server's bad lines (actors/mcp_lines.py): each unreadable answer fails the
request(s) it could belong to at once, quoting a bounded prefix without the server's
env values. The servers here speak through memory streams into the real line reader
and the real ``mcp`` client, so the clock is virtual: a request left to its timeout
would show as 30 or 60 s passed, an answer failed at once as none."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from actors import mcp as mcp_module
from actors.mcp import MCPServer, MCPServerActor
from actors.mcp_lines import QUOTED_CHARS, Lines, line_transport, read_heading
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, Host
from runtime.errors import MCPServerUnavailable
from tests.support.loopback import Recorded, Reply, loopback_server
from tests.test_mcp_attacks import TOKEN, ForgetfulServer
from tests.test_mcp_session_ends import until

KEY = "kQ7vW2xZ9pL4mN8rT3yB6cF1"
"""An API key the server is given in its env (no key shape: only known as that value)."""

ECHO = {"name": "echo", "inputSchema": {"type": "object", "properties": {"text": {}}}}
TYPED = {
    "name": "typed",
    "inputSchema": {"type": "object"},
    "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}},
}
NESTED = "[" * 2000 + "]" * 2000  # past orjson's 1,024 and the mcp package's parser


def answer(request: dict, result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}).encode()


Respond = Callable[[dict], list[bytes]]
EXIT = b"(the server exits)"
UNENDED = b"(no newline)"
"""Ends a line the server sends without its newline."""


def standard(request: dict) -> list[bytes]:
    method = request["method"]
    if method == "initialize":
        info = {"name": "fake", "version": "1"}
        return [
            answer(
                request,
                {
                    "protocolVersion": request["params"]["protocolVersion"],
                    "capabilities": {"tools": {}},
                    "serverInfo": info,
                },
            )
        ]
    if method == "tools/list":
        return [answer(request, {"tools": [ECHO, TYPED]})]
    text = request["params"]["arguments"].get("text", "")
    return [answer(request, {"content": [{"type": "text", "text": text}]})]


@pytest.fixture
def serve(monkeypatch) -> Callable[[Respond], None]:
    """Make every stdio MCP server a fake one answering each request with ``respond``'s
    lines (a newline added to each), through the real line reader."""

    def install(respond: Respond) -> None:
        @asynccontextmanager
        async def fake(self: MCPServerActor) -> AsyncIterator[Any]:
            to_server, server_in = trio.open_memory_channel[bytes](100)
            server_out, from_server = trio.open_memory_channel[bytes](10_000)

            async def receive() -> bytes:
                try:
                    return await from_server.receive()
                except trio.EndOfChannel:
                    return b""

            async def server() -> None:
                async with server_out:
                    buffer = b""
                    async for data in server_in:
                        buffer += data
                        while b"\n" in buffer:
                            line, buffer = buffer.split(b"\n", 1)
                            message = json.loads(line)
                            if "id" in message and "method" in message:
                                for reply in respond(message):
                                    if reply is EXIT:
                                        return  # its output closed: the server died
                                    end = b"" if reply.endswith(UNENDED) else b"\n"
                                    await server_out.send(reply.removesuffix(UNENDED) + end)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(server)
                lines = Lines(secrets=dict(self.config.env).values())
                async with line_transport(
                    receive,
                    to_server.send,
                    lines=lines,
                    limit=self.config.max_message_bytes,
                    too_long=self._too_long,
                ) as streams:
                    yield streams
                nursery.cancel_scope.cancel()

        monkeypatch.setattr(MCPServerActor, "_open_transport", fake)

    return install


def fake_server() -> MCPServer:
    return MCPServer.stdio("fake-server", name="fake", env={"FAKE_API_KEY": KEY})


def calling(*calls: tuple[str, dict]) -> ScriptedProvider:
    chunks = [
        c
        for n, (name, args) in enumerate(calls)
        for c in tool_call(name, args, tool_call_id=f"c{n}")
    ]
    return ScriptedProvider([chunks, ["done"]])


async def run_calls(*calls: tuple[str, dict]) -> tuple[list[Any], float]:
    """The tool messages of one step making ``calls``, and the virtual seconds it took."""
    agent = Agent(provider=calling(*calls), tools=[fake_server()])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        started = trio.current_time()
        await session.run("go")
        took = trio.current_time() - started
    return [m for m in session.messages if m.role == "tool"], took


def on_call(reply: Callable[[dict], list[bytes]]) -> Respond:
    def respond(request: dict) -> list[bytes]:
        return reply(request) if request["method"] == "tools/call" else standard(request)

    return respond


async def test_a_listing_answer_nested_past_orjson_fails_at_once_naming_the_server(
    serve, autojump_clock
):
    # Nested 2,000 deep, the answer was read by neither the mcp package nor orjson: the
    # listing waited its 30 s connect_timeout for an answer that had come.
    def respond(request: dict) -> list[bytes]:
        if request["method"] != "tools/list":
            return standard(request)
        return [
            b'{"jsonrpc": "2.0", "id": %d, "result": {"x": %s}}' % (request["id"], NESTED.encode())
        ]

    serve(respond)
    agent = Agent(provider=calling(), tools=[fake_server()])
    async with Host.open(log_tap=False) as host:
        started = trio.current_time()
        with pytest.raises(MCPServerUnavailable) as failed:
            await host.open_session(agent)
        took = trio.current_time() - started
    assert took < 1
    assert str(failed.value).startswith(
        "MCP server 'fake' could not start: MCPError: its answer could not be read: a line "
        "of 4046 characters is no JSON-RPC message: Invalid JSON: recursion limit exceeded "
    )
    assert str(failed.value).endswith(
        """(it began '{"jsonrpc": "2.0", "id": 2, "result": {"x": [[[[[[[[[[[[[[[['...)"""
    )


async def test_a_call_answer_with_its_id_after_an_unreadable_result_fails_at_once(
    serve, autojump_clock
):
    # The TypeScript SDK writes the result before the id; a lone surrogate (a file name
    # read with surrogateescape, in a Python server's json.dumps) is read by neither
    # parser. The call waited its tool_timeout (60 s).
    def reply(request: dict) -> list[bytes]:
        text = json.dumps({"content": [{"type": "text", "text": "name \udc80"}]})
        return [b'{"result": %s, "jsonrpc": "2.0", "id": %d}' % (text.encode(), request["id"])]

    serve(on_call(reply))
    [echo], took = await run_calls(("echo", {"text": "hi"}))
    assert took < 1
    assert echo.error.startswith(
        "tool echo raised MCPToolError: MCP server 'fake' answered with an error: its answer "
        "could not be read: a line of 93 characters is no JSON-RPC message: Invalid JSON: "
    )
    assert echo.error.endswith(
        """(it began '{"result": {"content": [{"type": "text", "text": "name \\\\udc8'...)"""
    )


async def test_an_answer_without_a_readable_id_fails_every_call_in_flight_at_once(
    serve, autojump_clock
):
    # An answer whose request cannot be told: one call in flight would never get its
    # answer (which one is unknown), and waited its tool_timeout. All fail at once.
    calls: list[dict] = []

    def reply(request: dict) -> list[bytes]:
        calls.append(request)
        if len(calls) < 2:
            return []
        return [b'{"jsonrpc": "2.0", "id": null, "result": {"content": %s}}' % NESTED.encode()]

    serve(on_call(reply))
    saved, took = await run_calls(("echo", {"text": "a"}), ("echo", {"text": "b"}))
    assert took < 1
    assert len(saved) == 2
    for message in saved:
        assert "MCP server 'fake' answered with an error: an answer it sent could not be " in (
            message.error
        )
        assert "and could have been this request's" in message.error


async def test_a_bad_line_is_quoted_in_at_most_a_prefix_without_the_servers_env_values(
    serve, autojump_clock
):
    def reply(request: dict) -> list[bytes]:
        leaked = json.dumps({"k": KEY})[:-1] + ', "x": ' + NESTED + "}"  # the key at the cut
        return [b'{"jsonrpc": "2.0", "id": %d, "result": %s}' % (request["id"], leaked.encode())]

    serve(on_call(reply))
    with capture_logs() as logs:
        [echo], took = await run_calls(("echo", {"text": "hi"}))
    assert took < 1
    assert echo.error.endswith(
        """(it began '{"jsonrpc": "2.0", "id": 3, "result": {"k": "[redacted]", "x'...)"""
    )
    assert KEY[:8] not in echo.error + repr(logs)


async def test_a_text_line_before_the_answer_is_logged_and_the_call_still_answered(
    serve, autojump_clock
):
    # Decided: a line that is no JSON object is dropped, not failed (a print or a banner
    # on stdout, which both mcp SDKs drop): it would fail the calls of every session.
    def reply(request: dict) -> list[bytes]:
        return [f"Loading model with key {KEY}...".encode(), *standard(request)]

    serve(on_call(reply))
    with capture_logs() as logs:
        [echo], _ = await run_calls(("echo", {"text": "hi"}))
    assert echo.output == "hi"
    [seen] = [e for e in logs if e["event"] == "mcp.transport-error"]
    assert seen["error"].endswith("(it began 'Loading model with key [redacted]...')")


async def test_an_invalid_result_is_described_without_quoting_it(serve, autojump_clock):
    # pydantic's error quoted the result (its input_value, cut mid-value): the head of an
    # env value, or the tail of a key past redaction, reached the model and the logs.
    def reply(request: dict) -> list[bytes]:
        return [answer(request, {"leak": KEY, "more": "x" * 100})]

    serve(on_call(reply))
    with capture_logs() as logs:
        [echo], _ = await run_calls(("echo", {"text": "hi"}))
    assert echo.error == (
        "tool echo raised MCPServerError: MCP server 'fake' sent an invalid result: "
        "content: Field required"
    )
    assert KEY[:8] not in repr(logs)


async def test_a_result_off_its_output_schema_is_described_in_a_bounded_line(serve, autojump_clock):
    # The mcp package's error is jsonschema's: the offending value whole, the schema and
    # the whole result pretty-printed (3 KB here, 200 KB as well: the env's key at its
    # head). Content of 3 KB is checked on the loop (ON_LOOP_STEPS): a worker thread's
    # wait lets the virtual clock jump to the call's timeout.
    def reply(request: dict) -> list[bytes]:
        structured = {"n": KEY + "x" * 1_000, "rest": ["y" * 2_000]}
        return [answer(request, {"content": [], "structuredContent": structured})]

    serve(on_call(reply))
    with capture_logs() as logs:
        [typed], _ = await run_calls(("typed", {}))
    assert typed.error.startswith(
        "tool typed raised MCPServerError: MCP server 'fake' sent an invalid result: "
        "the structured content of tool 'typed' does not fit its output schema: n: "
        "'[redacted]xxxx"
    )
    assert typed.error.endswith("xxx...") and len(typed.error) < 700
    assert KEY[:8] not in repr(logs)


async def test_a_result_without_the_structured_content_its_schema_promises_names_the_tool(
    serve, autojump_clock
):
    def reply(request: dict) -> list[bytes]:
        return [answer(request, {"content": [{"type": "text", "text": "5"}]})]

    serve(on_call(reply))
    [typed], _ = await run_calls(("typed", {}))
    assert typed.error == (
        "tool typed raised MCPServerError: MCP server 'fake' sent an invalid result: tool "
        "'typed' has an output schema but the result has no structured content"
    )


# -- a hostile server's other attacks -------------------------------------------------------


async def test_a_servers_error_is_cut_and_never_holds_its_env_key(serve, autojump_clock):
    # A server's JSON-RPC error message reached the model whole (200 KB here), with the
    # API key the server was given in its env: a key with no known shape, never redacted.
    def reply(request: dict) -> list[bytes]:
        error = {"code": -32000, "message": f"bad key {KEY} " + "z" * 200_000}
        return [json.dumps({"jsonrpc": "2.0", "id": request["id"], "error": error}).encode()]

    serve(on_call(reply))
    [echo], _ = await run_calls(("echo", {"text": "hi"}))
    said = "tool echo raised MCPToolError: MCP server 'fake' answered with an error: "
    assert echo.error.startswith(said + "bad key [redacted] zzz")
    assert echo.error.endswith("zzz...") and len(echo.error) == len(said) + 500 + 3


async def test_a_flood_of_list_changed_notices_starts_one_refresh_at_a_time(
    serve, autojump_clock, monkeypatch
):
    # Each notice started a refresh task, all queued on the lock to find the list fresh:
    # 5,000 notices took 1.9 s of the loop's CPU (as many log notices: 0.6 s).
    listed: list[int] = []
    started: list[int] = []
    refresh = MCPServerActor._refresh

    async def counted(self: MCPServerActor) -> None:
        started.append(1)
        await refresh(self)

    monkeypatch.setattr(MCPServerActor, "_refresh", counted)
    notice = json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})

    def respond(request: dict) -> list[bytes]:
        if request["method"] == "tools/list":
            listed.append(1)
        if request["method"] == "tools/call":
            return [notice.encode()] * 5000 + standard(request)
        return standard(request)

    serve(respond)
    [echo], _ = await run_calls(("echo", {"text": "hi"}))
    assert echo.output == "hi"
    assert len(started) <= 3 and 2 <= len(listed) <= 3  # the listing at start, then 1-2


async def test_a_list_changed_after_a_restart_is_listed_though_one_died_waiting(
    serve, autojump_clock
):
    # A refresh waiting for the lock when the server died was never run, and left the
    # mark that one is due: after the restart, no notice was listed again.
    listed: list[int] = []
    notice = json.dumps({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})

    def respond(request: dict) -> list[bytes]:
        if request["method"] == "tools/list":
            listed.append(1)
            if len(listed) == 2:  # the refresh of the two notices: dies instead
                return [EXIT]
        if request["method"] == "tools/call":
            if len(listed) == 1:
                return [notice.encode(), notice.encode()]  # and no answer
            return [notice.encode(), *standard(request)]
        return standard(request)

    serve(respond)
    turns = [[tool_call("echo", {"text": t}, tool_call_id=t), ["done"]] for t in ("a", "b")]
    agent = Agent(provider=ScriptedProvider(turns=turns), tools=[fake_server()])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("first")
        await session.run("second")
    first, second = [m for m in session.messages if m.role == "tool"]
    assert "died during the call" in first.error and second.output == "b"
    assert len(listed) == 4  # at start, the refresh that died, at restart, the refresh


async def test_a_line_left_unended_does_not_swallow_the_next_answer(serve, autojump_clock):
    # A server wrote half an answer and stopped: that call timed out (more could have
    # come), and the next answer, read as the end of that line, was dropped with it: the
    # next call waited its timeout too.
    def reply(request: dict) -> list[bytes]:
        if request["params"]["arguments"]["text"] == "a":
            return [
                b'{"jsonrpc": "2.0", "id": %d, "result": {"content": [' % request["id"] + UNENDED
            ]
        return standard(request)

    serve(on_call(reply))
    turns = [[tool_call("echo", {"text": t}, tool_call_id=t), ["done"]] for t in ("a", "b")]
    agent = Agent(
        provider=ScriptedProvider(turns=turns), tools=[fake_server()], budget=Budget(tool_timeout=5)
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("first")
        started = trio.current_time()
        await session.run("second")
        took = trio.current_time() - started
    first, second = [m for m in session.messages if m.role == "tool"]
    assert "timed out" in first.error
    assert second.output == "b" and took < 1


async def test_answers_to_no_request_and_twice_leave_the_calls_answered(serve, autojump_clock):
    def reply(request: dict) -> list[bytes]:
        return [answer({"id": 999}, {"content": []}), *standard(request), *standard(request)]

    serve(on_call(reply))
    saved, took = await run_calls(("echo", {"text": "a"}), ("echo", {"text": "b"}))
    assert sorted(m.output for m in saved) == ["a", "b"] and took < 1


class EchoingSSEServer(ForgetfulServer):
    """Its tool answers with an SSE event nested past the parser, ending with the
    ``Authorization`` header's value it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.restarted = True  # never forgets its sessions

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") != "tools/call":
            return super().__call__(request)
        echoed = json.dumps(request.headers["authorization"])
        data = f'{{"jsonrpc": "2.0", "id": {message["id"]}, "result": {NESTED}, "x": {echoed}}}'
        return Reply(body=b"event: message\ndata: " + data.encode() + b"\n\n")


async def test_an_unreadable_sse_event_is_described_without_quoting_it():
    # The mcp package's error (the call's) quotes pydantic's, which quotes the event cut
    # in the middle: its tail here, the token the server echoed, whole or in part.
    async with loopback_server(respond=EchoingSSEServer()) as web:
        server = MCPServer.http(web.url + "/mcp", name="web", headers={"Authorization": TOKEN})
        agent = Agent(provider=calling(("echo", {})), tools=[server])
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            await session.run("go")
    [echo] = [m for m in session.messages if m.role == "tool"]
    assert echo.error == (
        "tool echo raised MCPToolError: MCP server 'web' answered with an error: Failed to "
        "parse SSE message: 1 validation error for union[JSONRPCRequest,JSONRPCNotification,"
        "JSONRPCResponse,JSONRPCError]\n  Invalid JSON: recursion limit exceeded at line 1 "
        "column 239 [type=json_invalid]"
    )


async def test_an_unreadable_sse_event_reaches_no_log_with_the_token_it_echoed(caplog):
    # The mcp package logs the event it cannot read with its exception (logger.exception
    # "Error parsing SSE message"): pydantic's text, which quotes the event cut in the
    # middle, its tail the Authorization token the server echoed. No redaction knows a
    # token of no key shape: the record now says what is wrong without the quote.
    caplog.set_level(logging.WARNING)
    async with loopback_server(respond=EchoingSSEServer()) as web:
        server = MCPServer.http(web.url + "/mcp", name="web", headers={"Authorization": TOKEN})
        agent = Agent(provider=calling(("echo", {})), tools=[server])
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            await session.run("go")
    assert TOKEN[-6:] not in caplog.text
    [record] = [r for r in caplog.records if r.name == "mcp.client.streamable_http"]
    assert record.getMessage() == (
        "Error parsing SSE message: ValidationError: Invalid JSON: recursion limit exceeded "
        "at line 1 column 239"
    )
    assert record.exc_info is None


class EndlessSSEServer(ForgetfulServer):
    """Its tool answers with an SSE stream that never ends (a comment now and then)."""

    def __init__(self) -> None:
        super().__init__()
        self.restarted = True  # never forgets its sessions

    def __call__(self, request: Recorded) -> Reply:
        message = json.loads(request.body) if request.method == "POST" else {}
        if message.get("method") != "tools/call":
            return super().__call__(request)
        return Reply(stall=3600, keep_alive=b": ping\n\n")


def tasks_named(*names: str) -> int:
    """How many tasks run whose name holds one of ``names``."""

    def count(task: trio.lowlevel.Task) -> int:
        children = (c for n in task.child_nurseries for c in n.child_tasks)
        return any(n in task.name for n in names) + sum(map(count, children))

    return count(trio.lowlevel.current_root_task())


async def test_a_timed_out_calls_endless_sse_answer_is_closed():
    # The mcp package read a cancelled request's SSE answer on until the server ended it:
    # each call that timed out kept a task and a connection for the connection's life.
    async with loopback_server(respond=EndlessSSEServer()) as web:
        turns = [[tool_call("echo", {}, tool_call_id=f"c{n}"), ["done"]] for n in range(3)]
        agent = Agent(
            provider=ScriptedProvider(turns=turns),
            tools=[MCPServer.http(web.url + "/mcp", name="web")],
            budget=Budget(tool_timeout=0.5),
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            for _ in range(3):
                await session.run("go")
            with trio.fail_after(5):  # before: never (the server's stream has no end)
                await until(lambda: not tasks_named("_run_request_post", "_run_handler"))
    errors = [m.error for m in session.messages if m.role == "tool"]
    assert errors == ["tool echo timed out after 0.5s"] * 3


def test_what_a_server_said_is_read_in_a_window_of_its_text(monkeypatch):
    # The removal of pydantic's input quotes (a lazy ".*?" per ", input_value=") is
    # quadratic in a line full of them: a server's error message of 480 KB of them held
    # the loop 66 s (1 MiB: minutes). Only a window of the text is read now, the env's
    # values taken out of the whole text first.
    read: list[int] = []
    window = 4 * mcp_module.ERROR_MESSAGE_CHARS
    pattern = mcp_module._PYDANTIC_INPUT

    class Recording:
        def sub(self, replacement: str, text: str) -> str:
            read.append(len(text))
            assert len(text) <= window, f"read {len(text)} characters"
            return pattern.sub(replacement, text)

    monkeypatch.setattr(mcp_module, "_PYDANTIC_INPUT", Recording())
    config = MCPServer.stdio("x", env={"FAKE_API_KEY": KEY})
    text = f"bad key {KEY} " + ", input_value=" * 70_000
    said = MCPServerActor(config)._server_said(text)
    assert said == "bad key [redacted] ..."
    assert read and max(read) <= window


def test_what_a_server_said_loses_its_header_token_without_the_bearer_word():
    config = MCPServer.http("http://127.0.0.1:1/mcp", headers={"Authorization": f"Bearer {KEY}"})
    said = MCPServerActor(config)._server_said(f"no such token {KEY}; sent Bearer {KEY}")
    assert said == "no such token [redacted]; sent [redacted]"


# -- the parser ---------------------------------------------------------------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=10,
)
IDS = st.integers(-(2**63), 2**63) | st.text(max_size=8)


@given(
    ident=IDS,
    before=st.dictionaries(st.sampled_from(["jsonrpc", "result", "error", "x"]), JSON),
    after=st.dictionaries(st.sampled_from(["result", "error", "y"]), JSON),
    depth=st.sampled_from([0, 300, 5000]),
    spaced=st.booleans(),
)
def test_the_heading_of_any_answer_has_its_id_however_deep_and_wherever(
    ident, before, after, depth, spaced
):
    fields = {**before, "id": ident, **after, "result": None}
    text = json.dumps(fields, indent=1 if spaced else None)
    nested = "[" * depth + "]" * depth if depth else "null"
    heading = read_heading(text.replace('"result": null', '"result": ' + nested))
    assert heading.id == ident and heading.answer_shaped


@given(ident=IDS, rest=st.text(), cut=st.integers(0, 100))
def test_a_line_broken_after_its_id_still_has_it(ident, rest, cut):
    head = json.dumps({"jsonrpc": "2.0", "id": ident})[:-1] + ", "
    assert read_heading(head + (rest + '"result": [' * 3)[:cut]).id == ident


@given(st.text())
def test_any_text_has_a_heading(text):
    read_heading(text)
    read_heading("{" + text)


@given(fields=st.dictionaries(st.sampled_from(["jsonrpc", "id", "result", "x"]), JSON))
def test_a_line_with_a_method_is_never_an_answer(fields):
    heading = read_heading(json.dumps({**fields, "method": "tools/call"}))
    assert not heading.answer_shaped and heading.id is None


def written(*ids: int) -> Lines:
    import mcp_types

    lines = Lines(secrets=[KEY])
    for request in ids:
        lines.wrote(mcp_types.JSONRPCRequest(jsonrpc="2.0", id=request, method="ping"))
    return lines


@given(
    noise=st.text(alphabet='abc{}[]" :,0123456789', max_size=200),
    at=st.integers(0, 200),
)
def test_a_quoted_line_never_holds_the_key_or_more_than_the_prefix(noise, at):
    line = '{"jsonrpc": "2.0", "id": 5, "x": ' + noise[:at] + KEY + noise[at:] + NESTED
    [failed] = written(5).read(line)
    said = failed.message.error.message
    quoted = said[said.index("(it began ") + len("(it began ") : -1].removesuffix("...")
    assert len(eval(quoted)) <= QUOTED_CHARS
    assert all(KEY[n : n + 6] not in said for n in range(len(KEY) - 5))


def test_an_unreadable_answer_for_a_request_not_in_flight_fails_nothing():
    lines = written(1)
    [dropped] = lines.read('{"jsonrpc": "2.0", "id": 2, "result": ' + NESTED + "}")
    assert isinstance(dropped, Exception) and "an answer to no request in flight" in str(dropped)
    assert list(lines.in_flight) == [1]


def test_an_answer_read_or_failed_leaves_the_requests_in_flight():
    import mcp_types

    lines = written(1, 2, 3)
    lines.read(json.dumps({"jsonrpc": "2.0", "id": "1", "result": {}}))  # "1" is 1
    [failed] = lines.read('{"jsonrpc": "2.0", "id": 2, "result": ' + NESTED + "}")
    assert failed.message.id == 2
    cancel = {"requestId": 3, "reason": "timed out"}
    lines.wrote(
        mcp_types.JSONRPCNotification(
            jsonrpc="2.0", method="notifications/cancelled", params=cancel
        )
    )
    assert lines.in_flight == {}


def test_an_answer_shaped_line_without_an_id_fails_every_request_in_flight():
    lines = written(1, 2)
    logged, *failed = lines.read('{"jsonrpc": "2.0", "result": {"x": NaN')
    assert isinstance(logged, Exception)
    assert sorted(f.message.id for f in failed) == [1, 2]
    assert lines.in_flight == {}


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        '{"level": "info", "msg": "started", "error": null}',
        "{'jsonrpc': '2.0', 'id': 1}",
        '{"jsonrpc": "2.0", "method": "notifications/message", "params": ' + NESTED + "}",
        "[" + NESTED + "]",
    ],
)
def test_a_line_that_is_no_answer_fails_nothing(line):
    lines = written(1)
    [logged] = lines.read(line)
    assert isinstance(logged, Exception)
    assert list(lines.in_flight) == [1]


class Raw(Lines):
    """Each line as it is read, unparsed."""

    def read(self, line: str) -> list[Any]:
        return [line]


def split(lines: list[str], cuts: list[int], limit: int) -> tuple[list[str], bool]:
    """What the transport reads of ``lines`` (each ended by a newline) sent in chunks
    cut at ``cuts``, and whether it ended the connection for a line over ``limit``."""
    data = "".join(line + "\n" for line in lines).encode()
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    read: list[str] = []
    over: list[int] = []

    async def main() -> None:
        async def receive() -> bytes:
            return chunks.pop(0) if chunks else b""

        async def send(data: bytes) -> None:
            pass

        async with line_transport(
            receive, send, lines=Raw(), limit=limit, too_long=over.append
        ) as (stream, _):
            async for line in stream:
                read.append(line)

    trio.run(main)
    return read, bool(over)


@given(
    lines=st.lists(st.text(alphabet='ab{}"', max_size=20), max_size=8),
    cuts=st.lists(st.integers(0, 200), max_size=10),
)
def test_lines_are_read_whole_in_any_chunks_up_to_the_limit(lines, cuts):
    limit = 12
    read, ended = split(lines, cuts, limit)
    first_over = next((n for n, line in enumerate(lines) if len(line) > limit), len(lines))
    assert read == lines[:first_over]
    assert ended == any(len(line) > limit for line in lines)


@given(
    head=st.text(max_size=30),
    ident=st.integers(0, 100),
    text=st.text(max_size=10),
)
def test_a_message_glued_to_any_unended_line_is_still_read(head, ident, text):
    lines = written(ident)
    answer = {
        "jsonrpc": "2.0",
        "id": ident,
        "result": {"content": [{"type": "text", "text": text}]},
    }
    *_, read = lines.read(head + json.dumps(answer))
    assert read.message.id == ident and read.message.result == answer["result"]
    assert lines.in_flight == {}


async def test_a_server_printing_its_debug_lines_on_stdout_is_one_warning_and_a_count(
    serve, autojump_clock
):
    # Each line that is no message was a warning of its own: a server whose logging goes
    # to stdout made 2,000 `mcp.transport-error` lines for 2,000 debug lines, burying the
    # log. The first is logged at once, the rest counted (runtime.log_repeats).
    def reply(request: dict) -> list[bytes]:
        return [f"debug {i}: key {KEY}".encode() for i in range(2_000)] + standard(request)

    serve(on_call(reply))
    with capture_logs() as logs:
        [echo], _ = await run_calls(("echo", {"text": "hi"}))
    assert echo.output == "hi"
    seen = [e for e in logs if e["event"] == "mcp.transport-error"]
    assert len(seen) == 2  # the first, and the count held back (said when the server stops)
    assert "repeated" not in seen[0] and seen[0]["error"].endswith(
        "(it began 'debug 0: key [redacted]')"
    )
    assert seen[1]["repeated"] == 1_999 and "debug 1999" in seen[1]["error"]
    assert KEY not in str(seen)
