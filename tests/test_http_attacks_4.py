"""The served app attacked again (round 4, docs/web.md#attacked-round-4): the HTTP layer
itself (framing, clients that leave mid-body) and what came since round 3 (AG-UI client
tools, approvals, busy strategies, resume, media). Each finding is pinned over real HTTP,
as a client reaches it."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.web import agui, agui_input, chat_input, openai_compat
from runtime.tools import Tool, ToolInputError
from runtime.turn_queue import ClientToolSpec
from tests.support.redis import require_redis
from tests.test_agui import run_input, user
from tests.test_http_attacks_2 import head_of, raw_request, threads_running
from tests.test_web_http import body
from tests.test_web_slow_clients import chat_request, connect
from tests.test_worker_protocols import COLOR_TOOL, agui_agent, agui_run, protocols_deployment
from tests.web.harness import web_server

MAX_CLIENT_TOOLS = 128
MAX_TOOL_SCHEMAS = 256 << 10
"""``runtime.app.web.agui_input``'s caps, as docs/protocols-ag-ui.md states them."""


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))


# -- request smuggling: Content-Length beside Transfer-Encoding -----------------------------


async def test_a_body_framed_two_ways_is_refused_and_the_smuggled_request_never_runs():
    # h11 framed the body by Transfer-Encoding (an empty chunked body), answered it, and
    # kept reading the connection: the bytes after it, a body to a proxy framing by
    # Content-Length, ran as a second request. RFC 9112 6.1: refuse, or close after it.
    async with web_server(agent()) as server:
        host = server.url.removeprefix("http://")
        smuggled = json.dumps(body("smuggled")).encode()
        inner = (
            f"POST /api/chat HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(smuggled)}\r\n\r\n"
        ).encode() + smuggled
        outer = (
            f"POST /api/chat HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {5 + len(inner)}\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n"
        ).encode()
        response = await raw_request(server, outer + inner)
        stored = await server.host.store.list_sessions()
    assert stored == [] and "smuggled" not in server.host.sessions
    assert_refused_alone(response)


def assert_refused_alone(response: bytes) -> None:
    """One answer came, the refusal, and the connection closed. (Hypercorn lost it half
    the time to the bytes pipelined behind it until the body was drained first:
    tests/test_web_pipelining.py.)"""
    assert response.count(b"HTTP/1.1 ") == 1, response
    assert head_of(response).startswith(b"HTTP/1.1 400"), response
    assert b"connection: close" in head_of(response).lower()
    assert b"request smuggling" in response


async def test_a_get_framed_two_ways_is_refused_too():
    async with web_server(agent()) as server:
        host = server.url.removeprefix("http://")
        response = await raw_request(
            server,
            (
                f"GET /api/info HTTP/1.1\r\nHost: {host}\r\ncontent-length: 5\r\n"
                "transfer-encoding: chunked\r\n\r\n0\r\n\r\n"
                f"GET /api/sessions HTTP/1.1\r\nHost: {host}\r\n\r\n"
            ).encode(),
        )
    assert_refused_alone(response)


# -- a client that leaves before its body is in -------------------------------------------


@pytest.mark.parametrize(
    ("path", "protocol"),
    [("/api/chat", "ai-sdk"), ("/ag-ui", "ag-ui"), ("/v1/chat/completions", "openai")],
)
async def test_a_client_that_leaves_mid_body_leaves_no_traceback_in_the_log(
    path, protocol, caplog, monkeypatch
):
    # Starlette's ClientDisconnect escaped the body read: "Error in ASGI Framework" and a
    # traceback in the server's log, for every client that closed mid-upload.
    read: list[str] = []
    over = trio.Event()
    original = chat_input._read_body

    async def noting(*args: Any, **kwargs: Any) -> bytes:
        try:
            return await original(*args, **kwargs)
        finally:
            read.append(path)
            over.set()

    for module in (chat_input, agui, openai_compat):
        monkeypatch.setattr(module, "_read_body", noting)
    caplog.set_level(logging.INFO)
    async with web_server(agent(), protocols=("ai-sdk", protocol)) as server:
        request = chat_request(server, b'{"id": "s"', content_length=100)
        with trio.fail_after(20):
            sock = await connect(server)
            with sock:  # 10 bytes of the 100 promised, then the client is gone
                await sock.send(request.replace(b"/api/chat", path.encode(), 1))
            await over.wait()
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert "s" not in server.host.sessions
    assert read == [path]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]


# -- AG-UI client tools: how many, how large, and where their schemas are checked ----------


def run_with_tools(tools: list[dict[str, Any]], thread: str = "t") -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": "r",
        "messages": [{"id": "u", "role": "user", "content": "hi"}],
        "tools": tools,
    }


async def test_too_many_client_tools_or_too_large_schemas_are_a_413_before_any_is_built(
    monkeypatch,
):
    # Each schema is checked against the JSON Schema meta-schema (~0.5 ms a tool): a
    # 240 KB body of 14,000 tools held the event loop 5.6 s, and the duplicate count was
    # quadratic, so a 48 MiB one held a thread for hours.
    built: list[str] = []
    original = agui_input.Tool.client

    def noting(name: str, *args: Any, **kwargs: Any) -> Any:
        built.append(name)
        return original(name, *args, **kwargs)

    monkeypatch.setattr(agui_input.Tool, "client", staticmethod(noting))
    many = [{"name": f"t{i}"} for i in range(MAX_CLIENT_TOOLS + 1)]
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}
    async with web_server(agent(), protocols=("ai-sdk", "ag-ui")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            too_many = await client.post("/ag-ui", json=run_with_tools(many, "t1"))
            too_large = await client.post(
                "/ag-ui", json=run_with_tools([{"name": "w", "parameters": wide}], "t2")
            )
            assert built == []
            ok = await client.post("/ag-ui", json=run_with_tools(many[:-1], "t3"))
            twice = await client.post(
                "/ag-ui", json=run_with_tools([{"name": "a"}, {"name": "b"}, {"name": "a"}])
            )
        stored = [info.session_id for info in await server.host.store.list_sessions()]
    assert len(json.dumps(wide)) > MAX_TOOL_SCHEMAS
    assert (agui_input.MAX_CLIENT_TOOLS, agui_input.MAX_TOOL_SCHEMAS) == (128, 256 << 10)
    assert (too_many.status_code, too_many.json()["code"]) == (413, "too_many_tools")
    assert "129 tools; at most 128" in too_many.json()["error"]
    assert (too_large.status_code, too_large.json()["code"]) == (413, "too_many_tools")
    assert ok.status_code == 200 and '"RUN_FINISHED"' in ok.text
    assert twice.status_code == 400 and "['a'] more than once" in twice.json()["error"]
    assert stored == ["t3"]


async def test_a_small_run_declaring_tools_has_them_checked_off_the_event_loop(monkeypatch):
    parsed = threads_running(monkeypatch, agui, "parse_run_input")
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    async with web_server(agent(), protocols=("ai-sdk", "ag-ui")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            with_tools = await client.post(
                "/ag-ui", json=run_with_tools([{"name": "look", "parameters": schema}])
            )
            without = await client.post("/ag-ui", json=run_with_tools([], "t2"))
    assert with_tools.status_code == 200 and without.status_code == 200
    assert parsed == [True, False]


# -- AG-UI client tools: the client's regular expressions ----------------------------------


# (A client's patterns now run, in the linear engine: tests/test_client_tool_patterns.py.)


# -- a body in tiny chunks ------------------------------------------------------------------


def chunked(payload: bytes, size: int) -> bytes:
    pieces = (payload[i : i + size] for i in range(0, len(payload), size))
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


async def test_a_body_in_thousands_of_tiny_chunks_is_refused_once_they_are_many():
    # Each chunk cost the server ~30 us however small: 1 MB sent as 1-byte chunks (6 MB
    # on the wire) took it over 30 s of CPU, and was then a 408.
    async with web_server(agent()) as server:
        host = server.url.removeprefix("http://")
        head = (
            f"POST /api/chat HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            "transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        ).encode()
        tiny = json.dumps(body("tiny", "x" * 5000)).encode()
        refused = await raw_request(server, head + chunked(tiny, 1))
        # the same number of pieces, of 70 bytes: a client's ordinary (if odd) upload
        fine = json.dumps(body("fine", "x" * (len(tiny) * 70))).encode()
        answered = await raw_request(server, head + chunked(fine, 70))
        stored = [info.session_id for info in await server.host.store.list_sessions()]
    assert head_of(refused).startswith(b"HTTP/1.1 400"), refused[:300]
    assert b"pieces of under 64 bytes" in refused
    assert head_of(answered).startswith(b"HTTP/1.1 200") and b"[DONE]" in answered
    assert stored == ["fine"]


def doubling(depth: int) -> dict[str, Any]:
    """A small schema whose check of a wrong value is exponential in ``depth``: each
    definition is ``anyOf`` two references to the one before."""
    defs: dict[str, Any] = {"a0": {"type": "string"}}
    for i in range(1, depth + 1):
        defs[f"a{i}"] = {"anyOf": [{"$ref": f"#/$defs/a{i - 1}"}, {"$ref": f"#/$defs/a{i - 1}"}]}
    return {"type": "object", "$defs": defs, "properties": {"q": {"$ref": f"#/$defs/a{depth}"}}}


def test_a_client_schema_of_exponential_cost_is_cut_short_on_the_models_input():
    # 18 such definitions (1.3 KB) took 34 s of the event loop to refuse a number; each
    # one more, twice as long. An untrusted schema's check now stops after a budget of
    # keywords and refuses the value.
    tool = Tool.client("look", doubling(16), trusted=False)
    with pytest.raises(ToolInputError, match="took over 10000 steps"):
        tool.validate({"q": 1})
    assert tool.validate({"q": "fine"}) == {"q": "fine"}  # a matching value: linear
    table = {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {f"c{i}": {"type": "string"} for i in range(10)},
                },
            }
        },
    }
    rows = [{f"c{i}": "v" for i in range(10)} for _ in range(800)]
    assert Tool.client("table", table, trusted=False).validate({"rows": rows})
    trusted = Tool.client("look", doubling(8))  # a program's own: no budget
    with pytest.raises(ToolInputError, match="not valid under any"):
        trusted.validate({"q": 1})


def test_a_client_schemas_unique_items_over_many_objects_is_cut_short():
    # jsonschema compares every pair of objects: 1,000 distinct ones took 4.5 s of the
    # loop, 3,000 took 32 s. The items are hashed now (a step each): 3,000 objects pass,
    # and an array past the budget's steps is still refused.
    schema = {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}
    tool = Tool.client("look", schema, trusted=False)
    with pytest.raises(ToolInputError, match="took over 10000 steps"):
        tool.validate({"a": [{"k": i} for i in range(20_000)]})
    assert tool.validate({"a": [{"k": i} for i in range(3000)]})
    with pytest.raises(ToolInputError, match="non-unique"):
        tool.validate({"a": [{"k": i} for i in range(3000)] + [{"k": 2999}]})
    assert tool.validate({"a": [{"k": i} for i in range(100)]})
    assert tool.validate({"a": list(range(5000))})  # scalars are sorted, not paired
    with pytest.raises(ToolInputError, match="non-unique"):
        tool.validate({"a": [{"k": 1}, {"k": 1}]})


def test_a_client_schemas_enum_of_many_objects_is_cut_short():
    # enum compares the value with every member: 1,000 values against 5,000 objects took
    # 19 s of the loop. Each object member is now a step (each 64 scalar ones).
    def tool(members: list[Any]) -> Tool:
        items = {"type": "array", "items": {"enum": members}}
        schema = {"type": "object", "properties": {"x": items}}
        return Tool.client("pick", schema, trusted=False)

    objects = [{"a": i} for i in range(5000)]
    with pytest.raises(ToolInputError, match="took over 10000 steps"):
        tool(objects).validate({"x": [{"a": -1}] * 1000})
    assert tool(objects[:20]).validate({"x": [{"a": 19}] * 200})
    colors = [f"c{i}" for i in range(500)]
    assert tool(colors).validate({"x": ["c499"] * 500})
    with pytest.raises(ToolInputError, match="is not one of"):
        tool(colors).validate({"x": ["red"]})


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_worker_builds_a_queued_runs_client_tools_off_its_event_loop(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker built each client tool (its schema checked against the meta-schema) on
    # its own loop as it claimed the turn: up to 128 tools and 256 KiB of schemas were
    # seconds in which its other turns and its leases' renewals waited.
    built: list[bool] = []
    original = ClientToolSpec.tool

    def noting(spec: ClientToolSpec, *args: Any) -> Any:
        built.append(threading.current_thread() is not threading.main_thread())
        return original(spec, *args)

    monkeypatch.setattr(ClientToolSpec, "tool", noting)
    async with protocols_deployment(pg_url, redis_url, agui_agent()) as d:
        events = await agui_run(
            d.urls[0], run_input("t", user("pick one", "m1"), tools=[COLOR_TOOL], runId="r1")
        )
    (pending,) = events[-1]["outcome"]["pendingToolCallIds"]
    assert pending.endswith(".s0.c1") and built == [True]  # (the call's wire id)


def test_a_number_too_large_for_a_multiple_of_check_is_invalid_input_not_a_failed_turn():
    # multipleOf divides as floats: 10**400 from the model raised OverflowError out of
    # the check, and the turn failed (RUN_ERROR) instead of the model being told.
    schema = {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 0.1}}}
    for tool in (Tool.client("num", schema), Tool.client("num", schema, trusted=False)):
        with pytest.raises(ToolInputError, match="cannot be checked"):
            tool.validate({"n": 10**400})
        assert tool.validate({"n": 0.5}) == {"n": 0.5}
