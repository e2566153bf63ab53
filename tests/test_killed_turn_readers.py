"""Every reader of a session's store agrees that a turn a dead process left running
(killed mid-turn: :mod:`runtime.liveness`) was interrupted, whichever reads it first: an
A2A task read, an AG-UI thread read, an answer's checks, not only a host's load, the
page's ``GET /api/sessions/{id}`` or ``show`` (``Host.load_settled``)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.stores.sqlite import SQLiteStore
from runtime import Agent
from runtime.app.host import Host
from runtime.app.web.a2a_tasks import task_id_of
from runtime.liveness import RUNNING_META
from runtime.messages import AssistantMessage, TextPart, UserMessage
from tests.test_killed_turn_marks import exited_writer
from tests.web.harness import web_server


def killed_session(path: Path) -> None:
    """Session ``s1`` as a process killed in its turn left it: its assistant message
    ``a1`` not marked, the running marker naming a process that has exited."""
    marker = {"turn_id": "t", "message_id": "a1", "writer": exited_writer()}

    async def save() -> None:
        store = await SQLiteStore.open(path)
        answer = AssistantMessage(id="a1", content=(TextPart(text="half", step=0),))
        await store.save("s1", 0, (UserMessage(content="go"), answer), {RUNNING_META: marker})
        await store.aclose()

    trio.run(save)


async def stored_interrupted(path: Path) -> list[bool]:
    store = await SQLiteStore.open(path)
    try:
        record = await store.load("s1")
    finally:
        await store.aclose()
    return [m.interrupted for m in record.messages if m.role == "assistant"]


def agent() -> Agent:
    return Agent(name="a", provider=ScriptedProvider(turns=[["Hi."]]))


@pytest.fixture
def killed(tmp_path: Path) -> Path:
    path = tmp_path / "s.db"
    killed_session(path)
    return path


async def test_an_a2a_task_read_first_shows_the_killed_turn_canceled(killed):
    async with web_server(agent(), store=str(killed), protocols=("a2a",)) as server:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "GetTask",
            "params": {"id": task_id_of("s1", "a1")},
        }
        async with httpx.AsyncClient(timeout=30) as http:
            got = (await http.post(server.url + "/a2a/jsonrpc", json=body)).json()
    assert got["result"]["status"]["state"] == "TASK_STATE_CANCELED"
    assert await stored_interrupted(killed) == [True]


async def test_an_agui_thread_read_first_marks_the_killed_turn(killed):
    async with web_server(agent(), store=str(killed), protocols=("ag-ui",)) as server:
        body = {"threadId": "s1", "runId": "r1", "messages": []}
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(server.url + "/ag-ui", json=body)
        assert response.status_code == 200, response.text
    assert await stored_interrupted(killed) == [True]


async def test_a_hosts_settled_read_marks_the_killed_turn_once(killed):
    async with Host.open(store=str(killed), log_tap=False) as host:
        first = await host.load_settled("s1")
        again = await host.load_settled("s1")
    assert [m.interrupted for m in first.messages if m.role == "assistant"] == [True]
    assert first.meta[RUNNING_META] is None
    assert again.version == first.version  # (nothing left to settle: no save)


async def test_a_resumed_stream_the_relay_lost_replays_the_killed_turn_interrupted(killed):
    from actors.relays import RedisRelay
    from tests.support.redis import require_redis, unique_prefix

    url = require_redis()
    async with (
        RedisRelay.open(url, prefix=unique_prefix()) as relay,
        web_server(agent(), store=str(killed), relay=relay) as server,
    ):
        # the killed host's turn is still the session's active one; its stream is gone
        await relay.client.set(relay.turn_key("t"), "not a stream")
        await relay.client.set(relay.active_key("s1"), "t")
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
            response = await http.get("/api/chat/s1/stream")
    assert response.status_code == 200
    events = [
        json.loads(line[len("data: ") :])
        for line in response.text.splitlines()
        if line.startswith("data: {")
    ]
    assert events[0] == {"type": "start", "messageId": "a1"}
    assert events[-1]["type"] == "abort"
    assert await stored_interrupted(killed) == [True]
