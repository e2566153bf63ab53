"""A stop or a resume reaching a host that is closing or closed (``serve`` stopping):
503 with ``Retry-After``, as every other request there gets, and nothing changed: no
turn stopped, no stop held or forwarded. Before, each answered as if done (204: "no
turn here", or a stop held for a message to come), though the host would run nothing
more: the client took its stop for done, and a stop held on the way out was a stop
lost (the message it named went on elsewhere)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.test_busy import Script, agent_with, held, holding
from tests.test_web_http import body, events
from tests.web.harness import WebServer, web_server

PROTOCOLS = ("ai-sdk", "a2a")

STATES = ("closing", "closed")


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(turns=[["said"]]))


def set_state(server: WebServer, state: str | None) -> None:
    """The host as it is while ``serve`` stops (``closing``: its turns being cancelled;
    ``closed``: past it), or open again (``None``: the harness closes it for real)."""
    server.host.shutting_down = state is not None
    server.host.closed = state == "closed"


def unavailable(response: Any) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"]


def a2a_call(method: str, task_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": {"id": task_id}}


STOPS = [
    ("POST", "/api/chat/s/stop", {}),
    ("POST", "/api/chat/s/stop", {"messageId": "u-late"}),
    ("POST", "/api/chat/s/stop", {"turnId": "t-late"}),
    ("GET", "/api/chat/s/stream", None),
    ("POST", "/a2a/jsonrpc", a2a_call("CancelTask", "task-1")),
    ("POST", "/a2a/jsonrpc", a2a_call("SubscribeToTask", "task-1")),
    ("POST", "/a2a/jsonrpc", a2a_call("tasks/cancel", "task-1")),
    ("POST", "/a2a/jsonrpc", a2a_call("tasks/resubscribe", "task-1")),
    ("POST", "/a2a/tasks/task-1:cancel", None),
    ("GET", "/a2a/tasks/task-1:subscribe", None),
]


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize(("method", "path", "payload"), STOPS)
async def test_a_stop_or_resume_on_a_closing_or_closed_host_is_a_503(state, method, path, payload):
    async with web_server(agent(), protocols=PROTOCOLS) as server:
        set_state(server, state)
        try:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                response = await client.request(method, path, json=payload)
        finally:
            set_state(server, None)
        assert len(server.host.held_stops) == 0  # nothing kept for a message to come
    unavailable(response)
    assert "shutting down" in response.text


@pytest.mark.parametrize("state", STATES)
async def test_a_stop_refused_on_the_way_out_stops_no_message_after(state):
    # The stop named a message on its way: held, it would have stopped that message's
    # turn here, though the client was told nothing of it (and sends it elsewhere).
    async with (
        web_server(agent()) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        set_state(server, state)
        try:
            stop = await client.post("/api/chat/s/stop", json={"messageId": "u-late"})
        finally:
            set_state(server, None)
        chat = await client.post("/api/chat", json=body("s", "hi", message_id="u-late"))
    unavailable(stop)
    assert events(chat.content)[-2]["type"] == "finish", chat.text


async def test_a_stop_while_the_host_closes_leaves_its_running_turn_to_the_shutdown():
    # The shutdown stops the turns it ends (reason "host shutdown", saved); a stop
    # that came meanwhile stops nothing more, and says so.
    script = Script(holding(), ["done"])
    async with (
        web_server(agent_with(script)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def chat() -> None:
                answers.append(await client.post("/api/chat", json=body("s", "go")))

            nursery.start_soon(chat)
            await held["open"].wait()
            set_state(server, "closing")
            try:
                stop = await client.post("/api/chat/s/stop", json={})
            finally:
                set_state(server, None)
            held["release"].set()
    unavailable(stop)
    assert events(answers[0].content)[-2]["type"] == "finish", answers[0].text


async def test_a_stop_and_a_chat_pipelined_on_one_connection_to_a_closing_host_get_two_503s():
    # The stop's body left unread by its refusal must not be read as the next request.
    from tests.test_web_connections import read_answer
    from tests.test_web_slow_clients import connect

    stop = b'{"messageId": "u-late"}'
    chat = orjson.dumps(body("s", "hi", message_id="u-late"))
    host_header = b"127.0.0.1"
    requests = b"".join(
        b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (path, host_header, len(payload), payload)
        for path, payload in ((b"/api/chat/s/stop", stop), (b"/api/chat", chat))
    )
    async with web_server(agent()) as server:
        set_state(server, "closing")
        try:
            sock = await connect(server)
            with sock, trio.fail_after(20):
                await sock.send(requests)
                heads = [await read_answer(sock), await read_answer(sock)]
        finally:
            set_state(server, None)
        held_stops = len(server.host.held_stops)
        record = await server.host.store.load("s")
    assert [h.split(b" ", 2)[1] for h in heads] == [b"503", b"503"], heads
    assert held_stops == 0 and record is None
