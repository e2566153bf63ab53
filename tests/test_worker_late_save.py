"""A turn's final save that outlives ``SAVE_TIMEOUT`` in a worker deployment (real
PostgreSQL, two workers in this process).

The turn runner waits for its final save at most ``SAVE_TIMEOUT`` seconds; the request
stays with the persister. Before the fix the worker then left the turn's fenced block,
marked the turn ``done``, and the save, when the persister got to it, found no fence
(the store looked the session's fence up when the save *ran*): it landed unfenced, after
the next turn of the session (run by another worker) had saved, and was rebased after
that turn's messages: the session's history came out of order (seen once under load in
tests/test_workers.py's 200-turn test: ``m5`` stored before ``m4``).

Now the store refuses a save of a session whose fenced block ended (the claim it ran
under is over), and a worker whose turn's final save was not confirmed releases the turn
instead of marking it done: another worker takes it over and stores it, in order.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

import actors.turn.saving as saving_module
from actors.providers.scripted import ScriptedProvider
from actors.stores import MemoryStore
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent, Host
from runtime.app.worker import Worker
from runtime.errors import LeaseLost
from runtime.messages import AssistantMessage, UserMessage
from tests.support.worker_agent import agent

LIMIT = 60.0


class _Gate:
    """Holds store ``store``'s saves of session ``session_id`` until opened, as a
    persister backlog (or a slow server) holds them: the save has not reached the store
    yet when the turn runner stops waiting for it."""

    def __init__(self, store: PostgresStore, session_id: str) -> None:
        self.open = trio.Event()
        self.held = trio.Event()
        self.answered = trio.Event()
        self.outcomes: list[BaseException | int] = []
        real = store.save

        async def save(sid: str, *args: Any, **kwargs: Any) -> int:
            if sid == session_id and not self.open.is_set():
                self.held.set()
                await self.open.wait()
                try:
                    version = await real(sid, *args, **kwargs)
                except BaseException as exc:
                    self.outcomes.append(exc)
                    self.answered.set()
                    raise
                self.outcomes.append(version)
                self.answered.set()
                return version
            return await real(sid, *args, **kwargs)

        store.save = save  # type: ignore[method-assign]


async def test_a_final_save_that_outlives_the_timeout_never_lands_after_the_next_turn(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(saving_module, "SAVE_TIMEOUT", 0.5)
    store_a = await PostgresStore.open(pg_url)
    store_b = await PostgresStore.open(pg_url)
    queue = TurnQueue(store_b)
    gate = _Gate(store_a, "s")
    try:
        async with trio.open_nursery() as nursery:
            worker_a = Worker(store=store_a, agent=agent, owner="a", poll=0.05)
            claims = 0
            real_claim = worker_a._claim

            async def claim_once(leases: Any) -> Any:
                # Worker a takes the first turn and then nothing: the next turns go to b.
                nonlocal claims
                if claims:
                    await trio.sleep_forever()
                got = await real_claim(leases)
                claims += got is not None
                return got

            worker_a._claim = claim_once  # type: ignore[method-assign]
            await nursery.start(worker_a.run)
            first = await queue.submit("s", "s m1")
            with trio.fail_after(LIMIT):
                await gate.held.wait()  # a's save of the turn is held past SAVE_TIMEOUT
                while worker_a.running:  # noqa: ASYNC110 - a gives the turn up (done, released)
                    await trio.sleep(0.02)
            worker_b = Worker(store=store_b, agent=agent, owner="b", poll=0.05)
            await nursery.start(worker_b.run)
            second = await queue.submit("s", "s m2")
            done = await queue.wait_finished(second.turn_id, LIMIT)
            assert done is not None and done.status == "done"
            gate.open.set()  # a's late save reaches the store now
            with trio.fail_after(LIMIT):
                await gate.answered.wait()
            worker_a.stop()
            worker_b.stop()
        record = await store_b.load("s")
        turns = await queue.turns("s")
    finally:
        await queue.aclose()
        await store_a.aclose()
        await store_b.aclose()
    assert record is not None
    users = [m.content for m in record.messages if isinstance(m, UserMessage)]
    answers = [m.text for m in record.messages if isinstance(m, AssistantMessage)]
    assert users == ["s m1", "s m2"]
    assert answers == ["echo: s m1", "echo: s m2"]
    # the first turn was taken over by b, which stored it; a's late save was refused
    assert [(t.turn_id, t.status) for t in turns] == [
        (first.turn_id, "done"),
        (second.turn_id, "done"),
    ]
    assert all(isinstance(outcome, LeaseLost) for outcome in gate.outcomes)


async def test_an_embedded_sessions_late_save_lands_before_its_next_turns(
    autojump_clock: Any,
) -> None:
    """The embedded host has the same ``SAVE_TIMEOUT`` but one persister, which writes
    in order, and the session runs one turn at a time: a final save that outlived its
    turn lands before the next turn's saves (which name it, ``SaveRequest.after``), so
    the history stays in order and nothing is lost."""
    store = MemoryStore()
    real = store.save
    open_ = trio.Event()
    held = 0

    async def save(sid: str, *args: Any, **kwargs: Any) -> int:
        nonlocal held
        if held == 0:  # the first turn's save, held well past SAVE_TIMEOUT
            held += 1
            await open_.wait()
        return await real(sid, *args, **kwargs)

    store.save = save  # type: ignore[method-assign]
    agent = Agent(provider=ScriptedProvider(turns=[[["one"]], [["two"]]]))
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="e")
        first = await session.run("m1")
        assert not first.saved  # given up waiting for
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "m2")
            await trio.sleep(saving_module.SAVE_TIMEOUT * 4)
            open_.set()
    record = await store.load("e")
    assert record is not None
    assert [m.content for m in record.messages if isinstance(m, UserMessage)] == ["m1", "m2"]
    assert [m.text for m in record.messages if isinstance(m, AssistantMessage)] == ["one", "two"]
