"""A worker that lost a turn to another worker, then runs the session's next turn (real
PostgreSQL, two workers in this process).

Found by the chaos run (tests/support/chaos.py, seed 100 at size ``large``): a worker
paused past its lease while it ran a turn woke up, its save refused (``LeaseLost``), and
kept the session open with that turn's unsaved steps in its history. When it later ran
another turn of the session, it took the stored history in and put those steps after it
as its own (``adopt_record``'s rebase): a copy of the lost turn (its user message, its
assistant message, a second result of its call) written over the rows of the turns
stored after it. Now a worker drops the session of a turn it lost, and the next claim
reads it as stored.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.agent import Agent
from runtime.app.worker import Worker
from runtime.messages import AssistantMessage, ToolMessage, UserMessage
from tests.support.worker_agent import agent, read_ledger, respond
from tests.test_workers import sql

LIMIT = 60.0


def own_agent() -> Agent:
    """The worker tests' agent with a provider of its own: each worker's host runs (and
    stops) the provider actors of the agents it is given."""
    return attrs.evolve(agent, provider=ScriptedProvider(responder=respond, chunk_size=8))


async def test_a_worker_that_lost_a_turn_runs_the_sessions_next_turn_on_the_stored_history(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AXON_TEST_LEDGER", pg_url)
    monkeypatch.setenv("AXON_TEST_TOOL_HOLD", "1.5")  # a sits in its first tool
    read_ledger(pg_url)  # the ledger's tables, made once
    store_a = await PostgresStore.open(pg_url)
    store_b = await PostgresStore.open(pg_url)
    queue = TurnQueue(store_b)
    try:
        async with trio.open_nursery() as nursery:
            worker_a = Worker(store=store_a, agent=own_agent(), owner="a", poll=0.05)
            may_claim = trio.Event()
            may_claim.set()
            real_claim = worker_a._claim

            parked = trio.Event()

            async def claim_when_let(leases: Any) -> Any:
                # a claims nothing while b is to take the first turn over.
                if not may_claim.is_set():
                    parked.set()
                await may_claim.wait()
                return await real_claim(leases)

            worker_a._claim = claim_when_let  # type: ignore[method-assign]
            await nursery.start(worker_a.run)
            first = await queue.submit("s", "tools one")
            with trio.fail_after(LIMIT):
                while not (await trio.to_thread.run_sync(read_ledger, pg_url))[0]:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            may_claim = trio.Event()  # a claims nothing more, once its claim in flight is over
            with trio.fail_after(LIMIT):
                await parked.wait()
            # Another worker's claim took the turn (as after a pause past the lease): its
            # lease lapsed, so b takes it over; a's renewal and save are refused.
            await trio.to_thread.run_sync(
                sql,
                pg_url,
                "UPDATE axon_turns SET owner = 'gone', epoch = epoch + 1, "
                "lease_until = now() - interval '1 second' WHERE turn_id = %s "
                "RETURNING turn_id",
                first.turn_id,
            )
            monkeypatch.setenv("AXON_TEST_TOOL_HOLD", "0")
            worker_b = Worker(store=store_b, agent=own_agent(), owner="b", poll=0.05)
            await nursery.start(worker_b.run)
            done = await queue.wait_finished(first.turn_id, LIMIT)
            assert done is not None and done.status == "done" and done.owner == "b"
            with trio.fail_after(LIMIT):
                while worker_a.running:  # noqa: ASYNC110 - a's copy of the turn ends lost
                    await trio.sleep(0.02)
            worker_b.stop()
            with trio.fail_after(LIMIT):
                while worker_b.running or worker_b.host is not None:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            may_claim.set()
            second = await queue.submit("s", "tools two")  # only a is left to run it
            done = await queue.wait_finished(second.turn_id, LIMIT)
            assert done is not None and done.status == "done" and done.owner == "a"
            worker_a.stop()
        record = await store_b.load("s")
    finally:
        await queue.aclose()
        await store_a.aclose()
        await store_b.aclose()
    assert record is not None
    messages = record.messages
    assert [m.content for m in messages if isinstance(m, UserMessage)] == ["tools one", "tools two"]
    assert [m.id for m in messages if isinstance(m, AssistantMessage)] == [
        first.message_id,
        second.message_id,
    ]
    assert [m.tool_call_id for m in messages if isinstance(m, ToolMessage)] == [
        "call_1",
        "call_2",
    ] * 2
    assert [type(m).__name__ for m in messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "ToolMessage",
    ] * 2
