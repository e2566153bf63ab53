"""Attacks on a worker's slot that waits without a claim of its own after its last save's
riding claim found nothing (``82126f5``) and on the suspension's riding claim
(``db84acb``): turns that become claimable without a ``NOTIFY``, a submit between the
save's commit and the loop's wait, a ``LISTEN`` connection lost right after, two slots
ending together, a suspending save's lost answer that had claimed. Real PostgreSQL
(``pg_url``: a schema of the tests' own server), workers in this process.

The wake-up tests run the worker with a poll no test waits for: a turn that only a
missed ``NOTIFY`` would start never starts, and the test fails at its deadline."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.app.worker import Worker
from tests.support.pg import pg_connect
from tests.support.worker_agent import agent
from tests.test_claim_lost_answers import _turn
from tests.test_next_claim_attacks import _lose_answer_once
from tests.test_worker_steps import _counting

NEVER = 3600.0


def _count_found_none(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many last saves' riding claims found nothing (each appends the waits then)."""
    seen: list[int] = []
    real = Worker._found_none

    def found_none(self: Worker, entry: Any) -> None:
        seen.append(self._waits)
        real(self, entry)

    monkeypatch.setattr(Worker, "_found_none", found_none)
    return seen


async def test_a_dead_workers_lease_expiring_after_a_found_nothing_save_is_taken_by_the_poll(
    store_and_queue, monkeypatch
):
    """A turn held by a dead worker is claimable once its lease expires, with no
    ``NOTIFY``: the slot whose last save found nothing (the lease still held then) waits
    at most its poll, then claims and takes the turn over."""
    found_none = _count_found_none(monkeypatch)
    store, submitter = store_and_queue
    dead = TurnQueue(store, lease=2.0)
    held = await submitter.submit("dead", "hello")
    assert await dead.claim("gone") is not None  # never renewed
    worker = Worker(store=store, agent=agent, owner="w", poll=0.2, concurrency=1)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                first = await submitter.submit("s0", "hello")
                ran = await submitter.wait_finished(first.turn_id, 20)
                assert found_none  # its save saw the lease still held
                taken = await submitter.wait_finished(held.turn_id, 20)
            worker.stop()
    finally:
        await dead.aclose()
    assert ran is not None and ran.status == "done"
    assert taken is not None and (taken.status, taken.owner) == ("done", "w")


async def test_an_approval_expiring_after_a_found_nothing_suspension_resumes_its_turn(
    store_and_queue, monkeypatch
):
    """The save that suspends a turn for a person found nothing to claim for the slot;
    the person never answers. The worker's expiry (``approval_timeout``) records the
    call denied and the continuation is claimed: the waiting slot is not left waiting
    for a decision's ``NOTIFY`` that no person sends."""
    found_none = _count_found_none(monkeypatch)
    store, submitter = store_and_queue
    timed = attrs.evolve(agent, approval_timeout=1.0)
    worker = Worker(store=store, agent=timed, owner="w", poll=0.2, concurrency=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(20):
            asks = await submitter.submit("s0", "approve this")
            done = await submitter.wait_finished(asks.turn_id, 20)
        worker.stop()
    assert found_none  # the suspension's riding claim found nothing
    assert done is not None and done.status == "done"
    assert worker.done == {"awaiting-input": 1, "done": 1}


async def test_a_submit_between_a_found_nothing_saves_commit_and_the_loops_wait_starts_at_once(
    store_and_queue, monkeypatch
):
    """A turn submitted after the save that found nothing committed and before the
    loop's wait began: its ``NOTIFY`` is kept on the ``LISTEN`` connection and the wait
    returns at once (the poll is an hour)."""
    found_none = _count_found_none(monkeypatch)
    store, submitter = store_and_queue
    worker = Worker(store=store, agent=agent, owner="w", poll=NEVER, concurrency=1)
    claims, waits = _counting(worker)
    late: list[Any] = []
    counted_wait = worker.queue.wait

    async def wait(*args: Any) -> Any:
        if found_none and not late:  # the first wait after the found-nothing save
            late.append(await submitter.submit("s1", "hello"))
        return await counted_wait(*args)

    worker.queue.wait = wait  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(20):
            await waits.reach(2)  # idle, listening
            idle = len(claims.items)
            first = await submitter.submit("s0", "hello")
            ran = await submitter.wait_finished(first.turn_id, 20)
            while not late:  # noqa: ASYNC110 - the wrapped wait's state
                await trio.sleep(0.01)
            after = await submitter.wait_finished(late[0].turn_id, 20)
        worker.stop()
    assert ran is not None and ran.status == "done"
    assert after is not None and after.status == "done"
    # No claim of the loop's found nothing in between: the wait returned at once.
    assert claims.items[idle:] == [first.turn_id, late[0].turn_id]


async def test_a_listen_connection_lost_right_after_a_found_nothing_save_misses_no_turn(
    store_and_queue, monkeypatch
):
    """The ``LISTEN`` connection's backend killed right after a last save found nothing,
    and a turn submitted at once (its ``NOTIFY`` sent to no one): the wait sees the
    connection gone, reopens it and claims (the poll is an hour)."""
    found_none = _count_found_none(monkeypatch)
    store, submitter = store_and_queue
    worker = Worker(store=store, agent=agent, owner="w", poll=NEVER, concurrency=1)
    _claims, waits = _counting(worker)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(20):
            await waits.reach(2)  # idle, listening
            first = await submitter.submit("s0", "hello")
            ran = await submitter.wait_finished(first.turn_id, 20)
            await waits.reach(3)  # back in the wait, without a claim
            assert found_none
            listener = worker.queue._listen  # type: ignore[attr-defined]
            pid = listener.conn.info.backend_pid
            with pg_connect() as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            second = await submitter.submit("s1", "hello")
            after = await submitter.wait_finished(second.turn_id, 20)
        worker.stop()
    assert ran is not None and ran.status == "done"
    assert after is not None and after.status == "done"


async def test_two_slots_ending_together_one_finding_nothing_one_claiming_miss_nothing(
    store_and_queue, monkeypatch
):
    """Two slots whose turns end close together, one save claiming the turn queued
    behind and the other finding nothing: every turn runs, and one submitted later
    still wakes the worker (the poll is an hour)."""
    found_none = _count_found_none(monkeypatch)
    store, submitter = store_and_queue
    turns = [await submitter.submit(f"s{n}", "hello") for n in range(3)]
    worker = Worker(store=store, agent=agent, owner="w", poll=NEVER, concurrency=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(20):
            done = [await submitter.wait_finished(t.turn_id, 20) for t in turns]
            while len(found_none) < 2:  # noqa: ASYNC110 - the worker's state
                await trio.sleep(0.01)
            later = await submitter.submit("s9", "hello")
            done.append(await submitter.wait_finished(later.turn_id, 20))
        worker.stop()
    assert [d.status if d else None for d in done] == ["done"] * 4
    assert worker.done == {"done": 4}


async def test_a_suspending_saves_lost_answer_gives_back_the_turn_it_claimed_uncharged(
    store_and_queue, monkeypatch
):
    """The save that suspends a turn for a person claimed the turn queued behind it
    (``axon_save_next_v5``) and committed; its answer was lost. What it claimed is given
    back and runs as its first attempt, not taken over as a second when its lease
    lapses (at ``max_attempts`` 1 that failed it as poison); the suspended turn waits
    for its person, as stored."""
    store, submitter = store_and_queue
    asks = await submitter.submit("s0", "approve this")
    behind = await submitter.submit("s1", "hello")
    lost = _lose_answer_once(monkeypatch, b"axon_save_next_call", suspends=True)
    worker = Worker(
        store=store, agent=agent, owner="w", poll=0.05, concurrency=1, lease=1.0, max_attempts=1
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        done = await submitter.wait_finished(behind.turn_id, 30)
        worker.stop()
    rows = [_turn(store, t.turn_id) for t in (asks, behind)]
    assert lost == [1]
    assert done is not None and done.status == "done"
    assert [(status, attempts, error) for status, _, _, attempts, error in rows] == [
        ("awaiting-input", 1, None),
        ("done", 1, None),
    ]


async def test_a_decision_before_the_suspending_saves_answer_wakes_the_waiting_slot(
    pg_url, monkeypatch
):
    """The person decides between the suspending save's commit and its answer's arrival
    (the save's claim found nothing: the decision was not there yet): the decision's
    ``NOTIFY`` is kept on the ``LISTEN`` connection, so the slot that then waits without
    a claim of its own wakes at once and claims the continuation (the poll is an hour)."""
    from actors.stores.postgres_lane import LoopLane
    from runtime.approval import Decision, pending_calls
    from tests.support.worker_agent import guarded

    found_none = _count_found_none(monkeypatch)
    store = await PostgresStore.open(pg_url)
    other = await PostgresStore.open(pg_url)
    submitter = TurnQueue(other)
    worker = Worker(store=store, agent=agent, owner="w", poll=NEVER, concurrency=1)
    _claims, waits = _counting(worker)
    decided: list[Any] = []
    real = LoopLane.call

    async def call(self: Any, called: bytes, sql: bytes, params: Any, *args: Any) -> Any:
        result = await real(self, called, sql, params, *args)
        if called == b"axon_save_next_call" and params[14] == b"t" and not decided:
            record = await other.load("s0")  # the call is stored: the person decides
            assert record is not None
            (pending,) = pending_calls(record.messages)
            decided.append(
                await submitter.decide(
                    "s0", pending.approval_id, Decision(approved=True), {"guarded": guarded}
                )
            )
        return result

    monkeypatch.setattr(LoopLane, "call", call)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                await waits.reach(2)  # idle, listening
                asks = await submitter.submit("s0", "approve this")
                done = await submitter.wait_finished(asks.turn_id, 20)
            worker.stop()
    finally:
        await submitter.aclose()
        await store.aclose()
        await other.aclose()
    assert decided and len(found_none) == 2  # the suspension's, the continuation's
    assert done is not None and done.status == "done"
    assert worker.done == {"awaiting-input": 1, "done": 1}


async def test_a_suspending_saves_claim_takes_its_sessions_next_turn_which_supersedes(
    store_and_queue,
):
    """A turn of the same session queued behind the one that asks for a person: the
    suspension's riding claim takes it at once (as the loop's claim would: a new message
    supersedes what waits, docs/approval.md), the waiting turn ends ``superseded``, and
    the worker's loop made no claim after the suspension."""
    store, submitter = store_and_queue
    worker = Worker(store=store, agent=agent, owner="w", poll=NEVER, concurrency=1)
    claims, _waits = _counting(worker)
    asks = await submitter.submit("s0", "approve this")
    behind = await submitter.submit("s0", "hello")
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        with trio.fail_after(20):
            done = [await submitter.wait_finished(t.turn_id, 20) for t in (asks, behind)]
        worker.stop()
    record = await store.load("s0")
    assert [(d.status, d.finish_reason) if d else None for d in done] == [
        ("done", "superseded"),
        ("done", "stop"),
    ]
    assert claims.items[0] == asks.turn_id
    assert behind.turn_id not in claims.items  # the suspending save's claim took it
    assert worker.done == {"awaiting-input": 1, "done": 1}
    assert record is not None
    texts = [getattr(m, "text", None) for m in record.messages]
    assert texts.index("approve this") < texts.index("hello")


class _EarlierWorker(Worker):
    """A worker of a version before the riding claims: its saves only save (the
    suspension and the turn's end), its loop claims after each."""

    def _wants_next(self, entry: Any) -> bool:
        return False if entry is not None else super()._wants_next(entry)


async def test_a_mixed_fleet_with_suspensions_riding_and_not_runs_every_turn(pg_url):
    """A worker whose suspensions and turn ends claim for their slots, beside one whose
    loop claims after each (an earlier version), over one database: turns that wait for
    a person, decided as they wait, among plain turns of other sessions, submitted while
    the others end. Every turn ends ``done`` with no poll (an hour)."""
    from runtime.approval import Decision, pending_calls
    from tests.support.worker_agent import guarded

    stores = [await PostgresStore.open(pg_url) for _ in range(3)]
    submitter = TurnQueue(stores[0])
    workers = [
        Worker(store=stores[1], agent=agent, owner="new", poll=NEVER, concurrency=2),
        _EarlierWorker(store=stores[2], agent=agent, owner="old", poll=NEVER, concurrency=2),
    ]

    async def decide_when_waiting(turn: Any) -> None:
        while True:
            status = await submitter.get_status(turn.turn_id)
            if status is not None and status.status == "awaiting-input":
                break
            await trio.sleep(0.01)
        record = await stores[0].load(turn.session_id)
        assert record is not None
        (pending,) = pending_calls(record.messages)
        await submitter.decide(
            turn.session_id, pending.approval_id, Decision(approved=True), {"guarded": guarded}
        )

    submitted: list[Any] = []
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for worker in workers:
                    await nursery.start(worker.run)
                async with trio.open_nursery() as deciders:
                    for n in range(24):
                        if n % 3 == 0:
                            turn = await submitter.submit(f"a{n}", "approve this")
                            deciders.start_soon(decide_when_waiting, turn)
                        else:
                            turn = await submitter.submit(f"h{n % 4}", f"m{n}")
                        submitted.append(turn)
                        await trio.sleep(0.002 * (n % 3))
                done = [await submitter.wait_finished(t.turn_id, 60) for t in submitted]
                for worker in workers:
                    worker.stop()
    finally:
        await submitter.aclose()
        for store in stores:
            await store.aclose()
    assert [d.status if d else None for d in done] == ["done"] * 24
    assert sum(w.done.get("awaiting-input", 0) for w in workers) == 8
