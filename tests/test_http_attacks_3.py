"""The rule "a client that leaves while its turn is queued takes its message out of the
queue" (docs/web.md, Attacked (round 2)) attacked again (round 3): a retried POST of the
message after leaving, two waiting clients of which one leaves. Each held; pinned here
over real HTTP, as a client reaches it."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import httpx
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent, Hooks, UserMessage
from tests.test_http_attacks_2 import until
from tests.test_web_http import body
from tests.test_web_slow_clients import chat_request, connect
from tests.web.harness import wait_idle, web_server


def _first_waits(started: list[Any]) -> Agent:
    """An ``enqueue`` agent whose first turn sleeps a minute (stopped by the test)."""

    async def on_turn_start(event: Any) -> None:
        started.append(event)

    def respond(request: Any) -> Any:
        return [Sleep(60), "first"] if not started[1:] else ["later"]

    return Agent(
        provider=ScriptedProvider(responder=respond),
        on_busy="enqueue",
        hooks=Hooks(on_turn_start=on_turn_start),
    )


async def test_a_message_posted_again_after_its_client_left_the_queue_runs_once():
    """The client hung up while its message waited (the message left the queue, nothing
    of it stored) and posts it again with the same id: it queues and runs once, stored
    under its id."""
    started: list[Any] = []
    async with (
        web_server(_first_waits(started)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, "/api/chat", json=body("s", "first")))
            await until(lambda: "s" in server.host.sessions and server.host.sessions["s"].busy)
            session = server.host.sessions["s"]
            sent = json.dumps(body("s", "again", message_id="mX")).encode()
            sock = await connect(server)
            with sock:
                await sock.send(chat_request(server, sent))
                await until(lambda: session.queued == 1)
            await until(lambda: session.queued == 0)
            nursery.start_soon(
                partial(client.post, "/api/chat", json=body("s", "again", message_id="mX"))
            )
            await until(lambda: session.queued == 1)
            assert (await client.post("/api/chat/s/stop", json={})).status_code == 202
        await wait_idle(server, "s")
        record = await server.host.store.load("s")
    assert len(started) == 2
    assert record is not None
    users = [(m.content, m.id) for m in record.messages if isinstance(m, UserMessage)]
    assert users == [("first", users[0][1]), ("again", "mX")]


async def test_a_client_leaving_the_queue_leaves_the_one_behind_it_its_turn():
    started: list[Any] = []
    got: list[httpx.Response] = []
    async with (
        web_server(_first_waits(started)) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):

        async def stays() -> None:
            got.append(await client.post("/api/chat", json=body("s", "stays")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, "/api/chat", json=body("s", "first")))
            await until(lambda: "s" in server.host.sessions and server.host.sessions["s"].busy)
            session = server.host.sessions["s"]
            sock = await connect(server)
            with sock:
                await sock.send(chat_request(server, json.dumps(body("s", "left")).encode()))
                await until(lambda: session.queued == 1)
                nursery.start_soon(stays)
                await until(lambda: session.queued == 2)
            await until(lambda: session.queued == 1)
            assert (await client.post("/api/chat/s/stop", json={})).status_code == 202
        await wait_idle(server, "s")
        record = await server.host.store.load("s")
    assert len(started) == 2 and got[0].status_code == 200 and "later" in got[0].text
    assert record is not None
    assert [m.content for m in record.messages if isinstance(m, UserMessage)] == [
        "first",
        "stays",
    ]
