"""A message claimed by a process killed during its first model call (branch
``attack2``, after ``twinearly``).

A host that claims its turns (:attr:`~runtime.app.host.Host.claims_turns`: it saw another
process write its sessions) stores a new turn's user message and an empty answer before
the model call. Killed during that call, the store keeps both, the answer empty (marked
interrupted once a load settles it). The client's retry of the message (same id, same
content: a balancer's, a reconnect's) was replayed that empty answer, an ``abort``, on
every try: the question was never answered, where without the claim nothing was stored
and the retry ran it. Now such an answer is run again in its place."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from actors.providers.scripted import ScriptedProvider
from actors.stores.sqlite import SQLiteStore
from runtime import Agent
from runtime.liveness import RUNNING_META
from runtime.messages import AssistantMessage, UserMessage
from tests.test_killed_turn_marks import exited_writer
from tests.test_sqlite_twin_claims import _Gated, _meet, _stored, _text
from tests.test_web_http import body
from tests.web.harness import two_web_servers, web_server


async def _claimed(db: str) -> Any:
    """The session as a claiming server stored it while its model call for ``q1`` ran."""
    a_provider = _Gated("From A.")
    async with two_web_servers(
        Agent(provider=a_provider), Agent(provider=ScriptedProvider(steps=[["From B."]])), store=db
    ) as (a, _b, to_a, to_b):
        await _meet(to_a, to_b)
        a_provider.gate, a_provider.entered = trio.Event(), trio.Event()

        async def post() -> None:
            await to_a.post("/api/chat", json=body("s", "one", message_id="q1"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            await a_provider.entered.wait()  # the claim is stored
            claimed = await a.host.store.load("s")
            nursery.cancel_scope.cancel()
    return claimed


async def _as_killed(record: Any, path: Any, **extra: Any) -> None:
    """Store ``record`` in ``path`` as its process left it killed: its marker's writer
    a process that has exited."""
    store = await SQLiteStore.open(path)
    try:
        marker = {**record.meta[RUNNING_META], "writer": exited_writer()}
        await store.save("s", 0, record.messages, {**record.meta, RUNNING_META: marker})
    finally:
        await store.aclose()


async def test_a_retry_of_a_message_whose_claiming_process_was_killed_is_answered(tmp_path):
    claimed = await _claimed(str(tmp_path / "one.db"))
    assert _stored(claimed)[-2:] == [("user", "q1"), ("assistant", "")]
    killed = tmp_path / "killed.db"
    await _as_killed(claimed, killed)
    provider = ScriptedProvider(steps=[["From C."]])
    async with web_server(Agent(provider=provider), store=str(killed)) as c:
        async with httpx.AsyncClient(base_url=c.url) as to_c:
            retry = await to_c.post("/api/chat", json=body("s", "one", message_id="q1"))
        record = await c.host.store.load("s")
    assert retry.status_code == 200 and _text(retry.content) == "From C."
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "From C.")]
    assert [m.id for m in record.messages].count("q1") == 1


async def test_a_retry_to_a_server_holding_the_session_when_the_claimer_died_is_answered(
    tmp_path,
):
    """The server the retry reaches holds the session from before the claim: it reads
    the store (the claim, its marker's writer dead, not settled yet) and runs it."""
    db = tmp_path / "one.db"
    provider = ScriptedProvider(steps=[["From B."]])
    async with web_server(Agent(provider=provider), store=str(db)) as b:
        async with httpx.AsyncClient(base_url=b.url) as to_b:
            await to_b.post("/api/chat", json=body("s", "zero", message_id="q0"))
            other = await SQLiteStore.open(db)
            try:
                held = await other.load("s")
                claim = (UserMessage(content="one", id="q1"), AssistantMessage(id="a-killed"))
                marker = {"turn_id": "t", "message_id": "a-killed", "writer": exited_writer()}
                await other.save(
                    "s", 2, claim, {RUNNING_META: marker}, expected_version=held.version
                )
            finally:
                await other.aclose()
            retry = await to_b.post("/api/chat", json=body("s", "one", message_id="q1"))
        record = await b.host.store.load("s")
    assert retry.status_code == 200 and _text(retry.content) == "From B."
    assert _stored(record)[-2:] == [("user", "q1"), ("assistant", "From B.")]
