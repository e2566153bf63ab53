"""An MCP session over streamable HTTP (``/mcp``) ends with the client's ``DELETE``, and
nothing of it stays: neither the ``mcp`` package's session (its session manager's table)
nor its tasks (``run_server``, ``message_router``, the request and GET streams' writers,
``sse-starlette``'s). The request shapes around a ``DELETE`` that could race it (a call
streaming, the GET stream open, two ``DELETE``\\ s, a wrong id, the ``initialize`` answer
unread, the ``initialized`` notification in flight), and two ids the transport confuses
(``7`` and ``"7"``, ``"_GET_stream"``), through httpx on a loopback server (branch
``mcpreap``: the body fuzzer's session "left after a DELETE" was its own rig's, which
sent none; these shapes left nothing, but for the two ids).
"""

from __future__ import annotations

import collections
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent
from tests.test_mcp_server import ACCEPT, INIT, MCP
from tests.web.harness import WebServer, web_server

INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
SDK_TASKS = ("mcp.", "sse_starlette.")
"""The modules whose tasks a session (and its requests) run."""


def slow_agent() -> Agent:
    """A turn that streams a word, then waits (long enough for the client to act)."""
    return Agent(name="slow", provider=ScriptedProvider(responder=lambda _: ["a ", Sleep(5), "b"]))


def quick_agent() -> Agent:
    return Agent(name="slow", provider=ScriptedProvider(responder=lambda _: ["a ", Sleep(1), "b"]))


def manager(server: WebServer) -> Any:
    """The ``mcp`` package's session manager behind ``/mcp``."""
    (route,) = [r for r in server.app.router.routes if getattr(r, "path", None) == "/mcp"]
    return route.endpoint.manager


def sdk_tasks() -> collections.Counter[str]:
    """The running tasks of the ``mcp`` package and ``sse-starlette``, by name."""
    names: collections.Counter[str] = collections.Counter()

    def walk(task: Any) -> None:
        if task.name.startswith(SDK_TASKS):
            names[task.name.rsplit(".", 1)[-1]] += 1
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    walk(trio.lowlevel.current_root_task())
    return names


async def left(server: WebServer) -> tuple[int, dict[str, int]]:
    """The sessions the manager holds and the tasks of ``SDK_TASKS`` running, once both
    are none (or as they are after 5 s: what stayed)."""
    held = manager(server)._server_instances
    with trio.move_on_after(5):
        await until(lambda: not held and not sdk_tasks())
    return len(held), dict(sdk_tasks())


async def until(check: Any) -> None:
    """Return once ``check()`` is true (polled: what it looks at has no event)."""
    while True:
        if check():
            return
        await trio.sleep(0.01)


def session_headers(opened: httpx.Response) -> dict[str, str]:
    return {
        "mcp-session-id": opened.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-11-25",
    }


async def open_session(raw: httpx.AsyncClient) -> dict[str, str]:
    """A session initialized: the headers its requests carry."""
    session = session_headers(await raw.post("/mcp", json=INIT))
    assert (await raw.post("/mcp", json=INITIALIZED, headers=session)).status_code == 202
    return session


def call(request_id: Any, prompt: str = "hi") -> dict[str, Any]:
    params = {"name": "slow", "arguments": {"prompt": prompt}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def client(server: WebServer) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server.url, headers=ACCEPT, timeout=30)


async def test_a_delete_while_a_call_streams_ends_the_session_and_its_tasks():
    async with web_server(slow_agent(), protocols=MCP) as server:
        async with client(server) as raw, client(server) as other:
            session = await open_session(raw)
            async with raw.stream("POST", "/mcp", json=call(2), headers=session) as streaming:
                async for line in streaming.aiter_lines():
                    if "notifications/progress" in line:  # the turn runs
                        break
                deleted = await other.delete("/mcp", headers=session)
                assert await left(server) == (0, {})
            server.host.cancel_turns("test over")
    assert deleted.status_code == 200


async def test_a_delete_with_the_get_stream_open_ends_it_and_the_session():
    async with web_server(slow_agent(), protocols=MCP) as server:
        async with client(server) as raw, client(server) as other:
            session = await open_session(raw)
            get = {**session, "accept": "text/event-stream"}
            async with raw.stream("GET", "/mcp", headers=get) as stream:
                assert stream.status_code == 200
                await other.delete("/mcp", headers=session)
                assert await left(server) == (0, {})
                assert [chunk async for chunk in stream.aiter_bytes()] == []  # (it ended)


@pytest.mark.parametrize("together", [False, True])
async def test_a_second_delete_finds_no_session_and_leaves_nothing(together):
    async with web_server(slow_agent(), protocols=MCP) as server:
        async with client(server) as raw:
            session = await open_session(raw)
            answers: list[int] = []

            async def delete() -> None:
                answers.append((await raw.delete("/mcp", headers=session)).status_code)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(delete)
                if not together:
                    await trio.sleep(0.2)
                nursery.start_soon(delete)
            assert await left(server) == (0, {})
    assert sorted(answers) == [200, 404]


@pytest.mark.parametrize("forged", ["0" * 32, "", "x y"])
async def test_a_delete_naming_another_session_ends_nothing(forged):
    async with web_server(slow_agent(), protocols=MCP) as server:
        async with client(server) as raw:
            session = await open_session(raw)
            wrong = await raw.delete("/mcp", headers={**session, "mcp-session-id": forged})
            assert list(manager(server)._server_instances) == [session["mcp-session-id"]]
            assert (await raw.delete("/mcp", headers=session)).status_code == 200
            assert await left(server) == (0, {})
    assert wrong.status_code in (400, 404)


async def test_a_delete_before_the_initialize_answer_is_read_leaves_nothing():
    async with web_server(slow_agent(), protocols=MCP) as server:
        async with client(server) as raw, client(server) as other:
            async with raw.stream("POST", "/mcp", json=INIT) as opening:
                session = session_headers(opening)
                assert (await other.delete("/mcp", headers=session)).status_code == 200
                assert await left(server) == (0, {})


async def test_a_delete_racing_the_initialized_notification_leaves_nothing():
    async with web_server(slow_agent(), protocols=MCP) as server:
        async with client(server) as raw, client(server) as other:
            session = session_headers(await raw.post("/mcp", json=INIT))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: raw.post("/mcp", json=INITIALIZED, headers=session))
                nursery.start_soon(lambda: other.delete("/mcp", headers=session))
            assert await left(server) == (0, {})


async def test_a_get_stream_never_read_whose_client_goes_ends_and_its_session_expires():
    # No DELETE: the client opens its GET stream, reads none of it and closes the
    # connection. The GET's tasks end with the connection; the session itself stays
    # until its idle timeout (--mcp-session-idle, 600 s by default; a second here).
    async with web_server(slow_agent(), protocols=MCP) as server:
        manager(server).session_idle_timeout = 1
        async with client(server) as raw:
            session = await open_session(raw)
            get = {**session, "accept": "text/event-stream"}
            async with raw.stream("GET", "/mcp", headers=get) as stream:
                assert stream.status_code == 200
        assert list(manager(server)._server_instances) == [session["mcp-session-id"]]
        with trio.fail_after(10):
            await until(lambda: not sdk_tasks()["standalone_sse_writer"])  # (the GET's)
        assert await left(server) == (0, {})


async def test_calls_with_ids_7_and_the_string_7_are_one_id_the_second_refused():
    # The transport files a request's response stream under str(id): "7" took 7's over,
    # was answered with 7's result, and 7 was never answered, nor ended with the session.
    answers: dict[str, httpx.Response] = {}
    async with web_server(quick_agent(), protocols=MCP) as server:
        async with client(server) as raw, client(server) as other:
            session = await open_session(raw)

            async def first() -> None:
                answers["first"] = await raw.post("/mcp", json=call(7, "first"), headers=session)

            with trio.fail_after(15):  # (a guard: 7 was never answered)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(first)
                    await until(lambda: server.host.sessions)  # (7's turn runs)
                    answers["again"] = await other.post("/mcp", json=call("7"), headers=session)
    assert answers["again"].status_code == 409
    assert answers["again"].json()["id"] == "7"
    assert '"answer":"a b"' in answers["first"].text


async def test_a_call_with_the_get_streams_id_is_refused_and_the_delete_ends_the_stream():
    # The transport keeps the GET stream under "_GET_stream" among the requests' ids: a
    # request with that id took its place, and the GET stream outlived the DELETE.
    async with web_server(quick_agent(), protocols=MCP) as server:
        async with client(server) as raw, client(server) as other:
            session = await open_session(raw)
            get = {**session, "accept": "text/event-stream"}
            async with raw.stream("GET", "/mcp", headers=get) as stream:
                assert stream.status_code == 200
                with trio.fail_after(15):  # (a guard: its call was never answered)
                    refused = await other.post("/mcp", json=call("_GET_stream"), headers=session)
                await other.delete("/mcp", headers=session)
                assert await left(server) == (0, {})
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == -32600


def test_the_get_streams_id_is_the_transports():
    from mcp.server.streamable_http import GET_STREAM_KEY

    from runtime.app.web.mcp_endpoint import GET_STREAM_ID

    assert GET_STREAM_ID == GET_STREAM_KEY


async def test_calls_racing_their_sessions_delete_end_their_responses_and_leave_nothing():
    # The transport started a call's event stream, then found the session closed when it
    # handed the call on, and returned with the response open: the client read a broken
    # response (the server cut the connection), 7 times in 50 races. Now such a stream
    # ends, empty, as the transport's own does when the DELETE comes a moment later.
    statuses: collections.Counter[int] = collections.Counter()
    async with web_server(quick_agent(), protocols=MCP) as server:
        async with client(server) as raw:
            for _ in range(40):
                session = await open_session(raw)

                async def post(session: dict[str, str] = session) -> None:
                    answer = await raw.post("/mcp", json=call(2), headers=session)
                    statuses[answer.status_code] += 1

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(post)
                    nursery.start_soon(lambda s=session: raw.delete("/mcp", headers=s))
            assert await left(server) == (0, {})
    assert set(statuses) <= {200, 404}, statuses


DEEP: Any = []
for _ in range(300):  # (past orjson.dumps' 255 levels: the refusal's text was a 500)
    DEEP = [DEEP]


@pytest.mark.parametrize("request_id", [2.0, 2.5, None, True, [1], {"a": 1}, DEEP])
async def test_a_request_whose_id_is_no_string_or_integer_is_refused_not_taken_for_a_notification(
    request_id,
):
    # MCP: "Requests MUST include a string or integer ID ... MUST NOT be null". The
    # transport took a request with any other id for a notification: 202, nothing run,
    # nothing answered, and the client waited for an answer that never came.
    async with web_server(quick_agent(), protocols=MCP) as server:
        async with client(server) as raw:
            session = await open_session(raw)
            refused = await raw.post("/mcp", json=call(request_id), headers=session)
            unopened = await raw.post("/mcp", json={**INIT, "id": request_id})
    for answer in (refused, unopened):
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == -32600
        assert "string or an integer" in answer.json()["error"]["message"]
    assert not server.host.sessions
