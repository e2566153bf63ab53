"""A web client cannot make its session another's sub-session (attacknew).

A session's sub-sessions are those whose meta names it as their caller
(``parent_session_id``): a delete takes them, a sub-turn's approvals go to it. So a
client that could write that key into its session's meta could have its session deleted
with another's, or be shown another's approvals. Every protocol of ``serve`` is sent the
key wherever a body carries free fields (the AI SDK body and message metadata, OpenAI's
``metadata``, A2A's message and request metadata, AG-UI's ``forwardedProps`` and
``state``), and a first message whose title is the key itself (the stores' triggers
look for the key's bytes before parsing): none of those sessions names a caller, and
deleting the victim leaves them all (a session saved with the key, the control, goes).
Held when written; a guard for protocols to come.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.tools import PARENT_SESSION_META, caller_of
from tests.support.redis import require_redis
from tests.test_frontend import deployment
from tests.test_web_http import JSON, body, events
from tests.web.harness import wait_idle, web_server

VICTIM = "victim"
NAMED = {PARENT_SESSION_META: VICTIM}
PROTOCOLS = ("ai-sdk", "openai", "a2a", "ag-ui")


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(steps=[["Noted."]] * 20))


async def _every_protocol_says_the_caller(
    client: httpx.AsyncClient, settled: Callable[[str], Awaitable[None]]
) -> list[str]:
    """The attacker's sessions, each told by one protocol that its caller is the victim
    (``settled``: waits until a session's turn is saved)."""
    chat = body("att-ai-sdk", "hi")
    chat.update(meta=NAMED, metadata=NAMED, **NAMED)
    chat["messages"][-1]["metadata"] = NAMED
    r = await client.post("/api/chat", json=chat)
    assert r.status_code == 200 and b"[DONE]" in r.content, r.text
    r = await client.post("/api/chat", json=body("att-title", PARENT_SESSION_META))
    assert r.status_code == 200 and b"[DONE]" in r.content, r.text
    r = await client.post(
        "/v1/chat/completions",
        json={
            "model": "assistant",
            "messages": [{"role": "user", "content": "hi"}],
            "metadata": NAMED,
            "user": VICTIM,
        },
        headers={"X-Axon-Session": "att-openai"},
    )
    assert r.status_code == 200, r.text
    message = {
        "messageId": "m-1",
        "contextId": "att-a2a",
        "role": "ROLE_USER",
        "parts": [{"text": "hi"}],
        "metadata": NAMED,
    }
    r = await client.post(
        "/a2a/jsonrpc",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "SendMessage",
            "params": {"message": message, "metadata": NAMED},
        },
    )
    assert "error" not in r.json(), r.text
    r = await client.post(
        "/ag-ui",
        json={
            "threadId": "att-agui",
            "runId": "run-att",
            "messages": [{"id": "u1", "role": "user", "content": "hi"}],
            "forwardedProps": NAMED,
            "state": NAMED,
        },
    )
    assert r.status_code == 200, r.text
    made = ["att-ai-sdk", "att-title", "att-openai", "att-a2a", "att-agui"]
    for session_id in made:
        await settled(session_id)
    return made


@pytest.fixture(params=["sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    if request.param == "sqlite":
        yield str(tmp_path / "s.db")
        return
    from actors.stores.postgres import PostgresStore

    opened = await PostgresStore.open(request.getfixturevalue("pg_url"))
    try:
        yield opened
    finally:
        await opened.aclose()


async def test_no_protocol_lets_a_client_name_its_sessions_caller(store: Any) -> None:
    async with web_server(
        agent(),
        store=store,
        protocols=PROTOCOLS,
    ) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.post("/api/chat", json=body(VICTIM, "mine"))
            assert events(r.content)[-1] == "[DONE]"
            made = await _every_protocol_says_the_caller(client, partial(wait_idle, server))
            store = server.host.store  # (the store actor, whatever was given)
            # (the control: a session whose meta does name the victim goes with it)
            await _delete_the_victim(client, store, made)


async def test_no_protocol_of_a_worker_front_end_lets_a_client_name_its_sessions_caller(
    pg_url: str,
) -> None:
    """The same through a front end, the turns run by a worker (the meta a queued turn
    carries is set by the worker on its session)."""
    async with deployment(pg_url, require_redis(), agent(), protocols=PROTOCOLS) as d:
        store = d.store

        async def settled(session_id: str) -> None:
            with trio.fail_after(30):
                while True:
                    record = await store.load(session_id)
                    if record is not None and record.messages[-1].role == "assistant":
                        if not (await d.queue.unsaved_sessions()):
                            return
                    await trio.sleep(0.05)

        async with httpx.AsyncClient(base_url=d.urls[0], timeout=30) as client:
            r = await client.post("/api/chat", json=body(VICTIM, "mine"))
            assert r.status_code == 200, r.text
            await settled(VICTIM)
            made = await _every_protocol_says_the_caller(client, settled)
            await _delete_the_victim(client, store, made)


async def _delete_the_victim(client: httpx.AsyncClient, store: Any, made: list[str]) -> None:
    """Save a control session whose meta names the victim as its caller, delete the
    victim over HTTP: none of the sessions ``made`` (each naming the victim in every field
    a protocol offers) names a caller or goes with it; the control goes."""
    control = await store.load("att-title")
    await store.save("control", 0, control.messages, NAMED)
    metas = {s: (await store.load(s)).meta for s in made}
    deleted = await client.delete(f"/api/sessions/{VICTIM}", headers=JSON)
    left = {s: await store.load(s) for s in made}
    gone = await store.load("control")
    assert {s: caller_of(m) for s, m in metas.items()} == dict.fromkeys(made)
    assert deleted.status_code == 204
    assert all(record is not None for record in left.values()), left
    assert gone is None


SHAPES = {
    "big": ({PARENT_SESSION_META: VICTIM, "big": "x" * 10_000_000}, True),
    "not_a_string": ({PARENT_SESSION_META: 5}, False),
    "a_list": ({PARENT_SESSION_META: [VICTIM]}, False),
    "nested": ({"x": {PARENT_SESSION_META: VICTIM}}, False),
    "in_a_value": ({"title": PARENT_SESSION_META, "t": f'"{PARENT_SESSION_META}"'}, False),
}


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    if request.param == "memory":
        from actors.stores.memory import MemoryStore

        yield MemoryStore()
        return
    if request.param == "sqlite":
        from actors.stores.sqlite import SQLiteStore

        opened: Any = await SQLiteStore.open(tmp_path / "s.db")
    else:
        from actors.stores.postgres import PostgresStore

        opened = await PostgresStore.open(request.getfixturevalue("pg_url"))
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.mark.parametrize("shape", sorted(SHAPES))
async def test_a_meta_goes_with_the_session_it_names_as_caller_alike_in_every_store(
    any_store: Any, shape: str
) -> None:
    """Only a string at the meta's top level names a caller, in each store alike (the
    memory store reads the meta in Python, SQLite an expression index, PostgreSQL a
    trigger's column): 10 MB of meta around it, a number, a list, the key nested or
    inside a value."""
    from runtime.messages import UserMessage

    meta, named = SHAPES[shape]
    said = (UserMessage(content="hi", id="u"),)
    await any_store.save(VICTIM, 0, said, {})
    await any_store.save("sub", 0, said, meta)
    await any_store.delete(VICTIM)
    assert (await any_store.load("sub") is None) is named
