"""The scheduler's work in a worker's turn, counted (issue 24 goal 3).

A worker's turn runs the embedded host's pipeline plus the claim, the fenced saves and the
finish, each a PostgreSQL call in a thread. These pin the task steps those calls take
(counted by a Trio instrument, never timed: :mod:`tests.support.steps`), and that what
they no longer take carried nothing.
"""

from __future__ import annotations

import gc
import io
import json
import weakref
from typing import Any

import attrs
import pytest
import trio

from actors.log_tap import WINDOW, LogTap
from actors.stores.postgres import FreeLimiter, PostgresStore
from actors.stores.turns import QueuedTurn, TurnQueue
from runtime.app import worker as worker_module
from runtime.app.session import TurnStream
from runtime.app.worker import Worker, _take_slot
from runtime.errors import StoreError
from runtime.logging import configure_logging
from runtime.messages import UserMessage
from tests.support.calls import python_calls
from tests.support.steps import counted
from tests.support.steps import scopes_counted as steps_scopes
from tests.support.worker_agent import agent
from tests.test_http_attacks_2 import until
from tests.test_relay_coalescing import fake_relay


async def _finished(
    worker: Worker, submitter: TurnQueue, *turn_ids: str
) -> list[QueuedTurn | None]:
    """Run ``worker`` until each of ``turn_ids`` finished (or 30 s passed: ``None``), in
    order, then stop it: what ``submitter.wait_finished`` gave for each."""
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        done = [await submitter.wait_finished(turn_id, 30) for turn_id in turn_ids]
        worker.stop()
    return done


async def test_a_store_call_takes_one_step_while_a_thread_is_free(pg_url):
    store = await PostgresStore.open(pg_url)
    try:
        await store.run("warm", lambda conn: None, transaction=False)
        task = trio.lowlevel.current_task()
        with counted() as steps:
            await store.run("noop", lambda conn: None, transaction=False)
        # the wake-up with the thread's result only: no yield before the thread starts
        assert steps.of(task) == 1
    finally:
        await store.aclose()


async def test_a_free_limiter_takes_a_free_token_without_a_schedule_point():
    limiter = FreeLimiter(1)
    task = trio.lowlevel.current_task()
    with counted() as steps:
        await limiter.acquire_on_behalf_of("a")
    assert (steps.of(task), limiter.limiter.borrowed_tokens) == (0, 1)


async def test_a_free_limiter_waits_while_every_token_is_out():
    limiter = FreeLimiter(1)
    await limiter.acquire_on_behalf_of("a")
    got: list[str] = []

    async def second() -> None:
        await limiter.acquire_on_behalf_of("b")
        got.append("b")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # one thread at most: "b" waits for "a"'s token
        limiter.release_on_behalf_of("a")
    assert got == ["b"]


async def test_a_free_limiter_still_sees_a_cancel():
    limiter = FreeLimiter(1)
    with trio.CancelScope() as scope:
        scope.cancel()
        with pytest.raises(trio.Cancelled):
            await limiter.acquire_on_behalf_of("a")
    assert limiter.limiter.borrowed_tokens == 0


async def test_a_worker_takes_a_free_slot_without_a_schedule_point():
    slots = trio.Semaphore(2)
    task = trio.lowlevel.current_task()
    with counted() as steps:
        await _take_slot(slots)
    assert (steps.of(task), slots.value) == (0, 1)


async def test_a_worker_waits_for_a_slot_while_every_one_is_taken():
    slots = trio.Semaphore(1)
    await _take_slot(slots)
    took: list[bool] = []

    async def claim_loop() -> None:
        await _take_slot(slots)
        took.append(True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(claim_loop)
        await trio.testing.wait_all_tasks_blocked()
        assert took == []  # no more turns at once than the worker's concurrency
        slots.release()
    assert took == [True]


async def test_a_turns_last_save_finishes_its_row_without_a_finish_call(pg_url):
    """The save of a turn's last step carries its end (``SaveRequest.ends``): its commit
    finishes the turn's row, and the worker makes no finish call of its own (a store call,
    a thread hop and a commit fewer a turn). The saves before it leave the row running."""

    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    turn = await submitter.submit("s", "tools one")
    seen: list[tuple[str | None, str]] = []  # (ends, the row's status once it returned)
    real_save = store.save

    async def save(sid, *args, **kwargs):
        version = await real_save(sid, *args, **kwargs)
        row = await submitter.get_status(turn.turn_id)
        seen.append((kwargs.get("ends"), row.status))
        return version

    store.save = save
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05)
    finishes: list[object] = []
    real_finish = worker.queue.finish

    async def finish(*args, **kwargs):
        finishes.append(kwargs)
        return await real_finish(*args, **kwargs)

    worker.queue.finish = finish
    try:
        (done,) = await _finished(worker, submitter, turn.turn_id)
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done is not None and (done.status, done.finish_reason) == ("done", "stop")
    assert seen == [(None, "running"), (None, "running"), ("stop", "done")]
    assert finishes == []
    assert worker.done == {"done": 1}


async def test_a_failed_last_save_leaves_the_finish_to_its_own_call(pg_url):
    """The save that carries the turn's end fails (nothing of it is written): the runner
    saves again without it, and the worker finishes the row itself, as before."""

    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    turn = await submitter.submit("s", "s m1")
    real_save = store.save
    refused: list[str] = []

    async def save(sid, *args, **kwargs):
        if kwargs.get("ends") is not None and not refused:
            refused.append(kwargs["ends"])
            raise StoreError("the server went away")
        return await real_save(sid, *args, **kwargs)

    store.save = save
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05)
    finishes: list[str] = []
    real_finish = worker.queue.finish

    async def finish(*args, **kwargs):
        finishes.append(kwargs["status"])
        return await real_finish(*args, **kwargs)

    worker.queue.finish = finish
    try:
        (done,) = await _finished(worker, submitter, turn.turn_id)
        record = await store.load("s")
    finally:
        await submitter.aclose()
        await store.aclose()
    assert refused == ["stop"]
    assert finishes == ["done"]
    assert done is not None and (done.status, done.finish_reason) == ("done", "stop")
    assert record is not None and [m.text for m in record.messages] == ["s m1", "echo: s m1"]


async def test_a_workers_log_tap_rests_and_a_first_claim_adds_no_line(pg_url):
    """A worker's log tap rests between writes (``LogTap.window``: its loop waits on
    PostgreSQL and Redis between a turn's events, and a tap that wrote each as it came
    took a step and a write for nearly every line), and a turn's first claim logs no
    ``worker.turn`` line at info: its ``turn.started`` line says the same (issue 24 goal 3).
    Every line is still written by the time the worker has stopped."""

    out = io.StringIO()
    configure_logging("info", stream=out)
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    turn = await submitter.submit("s", "tools one")
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            assert worker.host is not None
            taps = [a for a in worker.host._actors if isinstance(a, LogTap)]
            assert [tap.window for tap in taps] == [WINDOW] and WINDOW > 0
            done = await submitter.wait_finished(turn.turn_id, 30)
            worker.stop()
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done is not None and done.status == "done"
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert "worker.turn" not in events
    assert events.count("turn.started") == events.count("turn.finished") == 1
    assert events.count("step.finished") == events.count("step.started") == 3  # "tools one"


async def test_a_worker_forwards_a_turns_chunks_in_bulk_not_one_anext_each(pg_url, monkeypatch):
    """The worker reads its turn's stream with ``TurnStream.next_batch`` (every chunk
    that has arrived at once), not ``async for`` one ``__anext__`` a chunk: it only
    forwards them to the relay (issue 24 goal 3). The relay gets every chunk, in order,
    the turn's ``start`` first and its ``finish`` last."""

    class Writer:
        def __init__(self) -> None:
            self.chunks: list[object] = []
            self.closed = False
            self.calls = 0

        def append(self, chunk: object) -> None:
            self.chunks.append(chunk)
            self.calls += 1

        def extend(self, chunks: list[object]) -> None:
            self.chunks.extend(chunks)
            self.calls += 1

        async def aclose(self, *, final: bool = True, paused: bool = False) -> None:
            self.closed = final

    class Relay:
        def __init__(self) -> None:
            self.writers: list[Writer] = []

        def writer(self, **_: object) -> Writer:
            self.writers.append(Writer())
            return self.writers[-1]

    anext_calls = 0
    anext = TurnStream.__anext__

    async def counted_anext(self: TurnStream) -> object:
        nonlocal anext_calls
        anext_calls += 1
        return await anext(self)

    monkeypatch.setattr(TurnStream, "__anext__", counted_anext)
    aiter_calls = 0
    loop = TurnStream.__aiter__

    def counted_aiter(self: TurnStream) -> object:  # ``async for`` (a generator a loop)
        nonlocal aiter_calls
        aiter_calls += 1
        return loop(self)

    monkeypatch.setattr(TurnStream, "__aiter__", counted_aiter)
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    turn = await submitter.submit("s", "tools one")
    relay = Relay()
    worker = Worker(store=store, relay=relay, agent=agent, owner="w", poll=0.05)
    try:
        (done,) = await _finished(worker, submitter, turn.turn_id)
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done is not None and done.status == "done"
    assert anext_calls == 0 and aiter_calls == 0
    [writer] = relay.writers
    types = [chunk.type for chunk in writer.chunks]  # type: ignore[attr-defined]
    assert types[0] == "start" and types[-1] == "finish" and writer.closed
    assert types.count("step-start") == types.count("step-finish") == 3  # "tools one"
    # one call a batch the stream gave (``extend``), not one a chunk
    assert writer.calls < len(types) / 2


async def test_a_workers_last_save_claims_its_next_turn_so_one_claim_call_serves_three(pg_url):
    """A worker's slot freed by a turn's end is filled by the claim riding on that turn's
    last save (one store call where there were two): with one slot, three queued turns
    take one claim call that found a turn, not three."""

    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    turns = [await submitter.submit(f"s{n}", "hello") for n in range(3)]
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05, concurrency=1)
    claimed: list[object] = []
    real_claim = worker.queue.claim_unread

    async def claim(*args, **kwargs):
        got = await real_claim(*args, **kwargs)
        if got is not None:
            claimed.append(getattr(got, "turn_id", None) or got.turn.turn_id)
        return got

    worker.queue.claim_unread = claim  # type: ignore[method-assign]
    try:
        done = await _finished(worker, submitter, *(t.turn_id for t in turns))
    finally:
        await submitter.aclose()
        await store.aclose()
    assert [d.status if d else None for d in done] == ["done"] * 3
    assert [d.owner if d else None for d in done] == ["w"] * 3
    assert claimed == [turns[0].turn_id]
    assert worker.done == {"done": 3}


async def test_a_turn_claimed_by_a_last_save_as_the_worker_stops_is_given_back(pg_url, monkeypatch):
    """A worker that began stopping between the save that claimed a turn for it and
    that turn's start starts nothing: the turn goes back at once (no owner, its lease
    lapsed, the attempt given back), for any worker's next claim."""

    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    first = await submitter.submit("s0", "hello")
    second = await submitter.submit("s1", "hello")
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05, concurrency=1)

    def claimed_next(self, claimed):  # the answer's hand-over, the stop right after it
        self.next = claimed
        worker.stop()

    monkeypatch.setattr(worker_module._Running, "claimed_next", claimed_next)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
        after = await submitter.get_status(second.turn_id)
        done = await submitter.get_status(first.turn_id)
        taken = await TurnQueue(store).claim("w2")
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done is not None and done.status == "done"
    assert worker.done == {"done": 1}
    assert after is not None and (after.status, after.owner, after.attempts) == ("running", None, 0)
    assert taken is not None and taken.turn.turn_id == second.turn_id and taken.takeover


async def test_a_turn_claimed_by_a_last_save_beside_a_takeover_is_given_back(pg_url, monkeypatch):
    """The claim loop's rule (nothing else runs beside a taken-over turn, which may be
    what kills workers) holds for a riding claim that lands once the loop took one over:
    the claimed turn goes back at once."""

    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    first = await submitter.submit("s0", "hello")
    second = await submitter.submit("s1", "hello")
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05, concurrency=1)

    def claimed_next(self, claimed):  # a takeover running here by the time it lands
        self.next = claimed
        fake = worker_module._Running(claim=attrs.evolve(self.claim, takeover=True))
        worker.running["elsewhere"] = fake

    monkeypatch.setattr(worker_module._Running, "claimed_next", claimed_next)
    given_back = trio.Event()
    real_release = worker.queue.release

    async def release(claim, **kwargs):
        done = await real_release(claim, **kwargs)
        given_back.set()
        return done

    worker.queue.release = release  # type: ignore[method-assign]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await submitter.wait_finished(first.turn_id, 30)
            with trio.fail_after(30):
                await given_back.wait()
            del worker.running["elsewhere"]
            worker.stop()
        after = await submitter.get_status(second.turn_id)
    finally:
        await submitter.aclose()
        await store.aclose()
    assert worker.done == {"done": 1}
    assert after is not None and (after.status, after.owner, after.attempts) == ("running", None, 0)


async def test_a_turn_whose_session_is_still_being_read_holds_back_no_other_claim(
    pg_url, monkeypatch
):
    """The claim loop claimed a turn whose stored session it must read (600,000 messages
    are seconds) and, before, read it before it claimed again: the other sessions' turns
    waited behind it (benchmarks/journal/approval.md, branch ``whist``: first deltas 1.4-10.7 s
    late). The read is the turn's own task's now: another session's turn is claimed,
    run and done while it goes on; the long one runs after, once."""
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    await store.save("long", 0, [UserMessage(content="before")])
    read = trio.Event()
    real = PostgresStore.record_off_loop

    async def slow_read(self: PostgresStore, session_id: str, rows: Any) -> Any:
        if session_id == "long":
            await read.wait()  # as a long session's read goes on
        return await real(self, session_id, rows)

    monkeypatch.setattr(PostgresStore, "record_off_loop", slow_read)
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05, concurrency=2)
    try:
        long = await submitter.submit("long", "hello")
        short = await submitter.submit("short", "hello")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            done_short = await submitter.wait_finished(short.turn_id, 30)
            waiting = await submitter.get_status(long.turn_id)
            read.set()
            done_long = await submitter.wait_finished(long.turn_id, 30)
            worker.stop()
        record = await store.load("long")
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done_short is not None and done_short.status == "done"
    assert waiting is not None and waiting.status == "running"  # claimed, still being read
    assert done_long is not None and (done_long.status, done_long.epoch) == ("done", 1)
    assert record is not None and [m.text for m in record.messages] == [
        "before", "hello", "echo: hello",
    ]  # fmt: skip


async def test_a_turn_cancelled_while_its_session_is_still_being_read_starts_cancelled(
    pg_url, monkeypatch
):
    """A stop requested while the claimed turn's session is read (in its own task now)
    reaches it through the lease's renewal: it ends cancelled once read, its model never
    called, nothing of it stored beside the interrupted turn's empty answer."""
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    await store.save("long", 0, [UserMessage(content="before")])
    reading, read = trio.Event(), trio.Event()
    real = PostgresStore.record_off_loop

    async def slow_read(self: PostgresStore, session_id: str, rows: Any) -> Any:
        reading.set()
        await read.wait()
        return await real(self, session_id, rows)

    monkeypatch.setattr(PostgresStore, "record_off_loop", slow_read)
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05, lease=0.6)
    try:
        turn = await submitter.submit("long", "hello")
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            await reading.wait()
            await submitter.request_cancel(turn.turn_id)
            leases = worker._leases
            assert leases is not None  # a renewal (every 0.2 s) brings the cancel here:
            await until(lambda: leases._held[turn.turn_id].cancelled is not None)
            read.set()
            done = await submitter.wait_finished(turn.turn_id, 30)
            worker.stop()
        record = await store.load("long")
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done is not None and done.status == "cancelled"
    assert record is not None and "echo: hello" not in [m.text for m in record.messages]


class _Seen:
    """What a wrapped call saw, in order, with a wait for the n-th."""

    def __init__(self) -> None:
        self.items: list[object] = []
        self._more = trio.Event()

    def add(self, item: object) -> None:
        self.items.append(item)
        self._more.set()
        self._more = trio.Event()

    async def reach(self, n: int) -> None:
        while len(self.items) < n:
            await self._more.wait()


def _counting(worker: Worker) -> tuple[_Seen, _Seen]:
    """The worker's claims (the turn id each took, ``None``: nothing) and its waits (how
    many claims came before each)."""
    claims, waits = _Seen(), _Seen()
    real_claim, real_wait = worker.queue.claim_unread, worker.queue.wait

    async def claim(*args, **kwargs):
        got = await real_claim(*args, **kwargs)
        claims.add(None if got is None else getattr(got, "turn_id", None) or got.turn.turn_id)
        return got

    async def wait(*args):
        waits.add(len(claims.items))
        return await real_wait(*args)

    worker.queue.claim_unread = claim  # type: ignore[method-assign]
    worker.queue.wait = wait  # type: ignore[method-assign]
    return claims, waits


async def test_a_slot_whose_last_save_found_nothing_to_claim_waits_without_a_claim(pg_url):
    """The claim riding on a turn's last save that found nothing claimable is the loop's
    claim: the freed slot waits for the queue's next ``NOTIFY`` without a claim of its
    own (one claim call found nothing, not two), and what is submitted after wakes it
    at once (the loop's poll is 30 s here: only the ``NOTIFY`` can start the turns)."""

    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    worker = Worker(store=store, agent=agent, owner="w", poll=30, concurrency=1)
    claims, waits = _counting(worker)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                # Idle: a claim, then the wait (the first returns at once: its LISTEN
                # connection was just opened), a claim again, the wait.
                await waits.reach(2)
                idle = len(claims.items)
                first = await submitter.submit("s0", "hello")
                done = [await submitter.wait_finished(first.turn_id, 20)]
                await waits.reach(3)  # the slot freed: back to the wait
                second = await submitter.submit("s1", "hello")
                done.append(await submitter.wait_finished(second.turn_id, 20))
                await waits.reach(4)
            worker.stop()
    finally:
        await submitter.aclose()
        await store.aclose()
    assert [d.status if d else None for d in done] == ["done", "done"]
    # Each turn: the claim its NOTIFY woke, then its last save's claim (nothing), then
    # the wait: no claim of the loop's between the turn's end and the wait.
    assert claims.items[idle:] == [first.turn_id, second.turn_id]
    assert waits.items[2:] == [idle + 1, idle + 2]


async def test_a_slot_whose_wait_took_a_notify_after_its_last_save_was_sent_claims(
    pg_url, monkeypatch
):
    """A wait that returned after the last save that found nothing was sent may have
    taken the ``NOTIFY`` of a turn that save did not see: the loop claims then."""

    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    worker = Worker(store=store, agent=agent, owner="w", poll=30, concurrency=1)
    real_found_none = Worker._found_none

    def found_none(self, entry):
        real_found_none(self, entry)
        self._waits += 1  # as if a wait returned since the save was sent

    monkeypatch.setattr(Worker, "_found_none", found_none)
    claims, waits = _counting(worker)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                await waits.reach(2)  # idle (the first wait returns at once)
                idle = len(claims.items)
                first = await submitter.submit("s0", "hello")
                done = await submitter.wait_finished(first.turn_id, 20)
                await waits.reach(3)
            worker.stop()
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done is not None and done.status == "done"
    assert claims.items[idle:] == [first.turn_id, None]  # the loop's claim after the turn


async def test_the_save_that_suspends_a_turn_claims_for_its_slot(pg_url):
    """The step that makes a turn wait for a person frees its slot in its commit, as a
    last save does: the claim rides on that save (``axon_save_next_v8``), so a turn
    queued meanwhile starts from it, and when nothing is claimable the slot waits for
    the queue's next ``NOTIFY`` without a claim of the loop's; the decision's wakes it."""
    from actors.stores.postgres_calls import SAVE_NEXT_FUNCTION_NAME
    from runtime.approval import Decision, pending_calls
    from tests.support.worker_agent import guarded

    assert SAVE_NEXT_FUNCTION_NAME == "axon_save_next_v8"
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    worker = Worker(store=store, agent=agent, owner="w", poll=30, concurrency=1)
    claims, waits = _counting(worker)
    asks = await submitter.submit("s0", "approve it")
    behind = await submitter.submit("s1", "hello")  # claimable, behind it in line
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(20):
                waiting = await submitter.wait_finished(behind.turn_id, 20)
                await waits.reach(2)  # idle, listening
                status = await submitter.get_status(asks.turn_id)
                record = await store.load("s0")
                assert record is not None
                (call,) = pending_calls(record.messages)
                await submitter.decide(
                    "s0", call.approval_id, Decision(approved=True), {"guarded": guarded}
                )
                done = await submitter.wait_finished(asks.turn_id, 20)
            worker.stop()
    finally:
        await submitter.aclose()
        await store.aclose()
    assert status is not None and status.status == "awaiting-input"
    assert waiting is not None and waiting.status == "done"
    assert done is not None and done.status == "done"
    # The loop's first claim took the asking turn; its suspending save took the one
    # behind (the loop claimed it on main); that one's last save found nothing: the
    # slot waited without a claim (its first wait returned at once, its LISTEN
    # connection just opened: then a claim that found nothing, and the wait); the
    # decision's NOTIFY woke the claim of the continuation.
    assert claims.items == [asks.turn_id, None, asks.turn_id]
    assert waits.items[:2] == [1, 2]
    assert worker.done == {"awaiting-input": 1, "done": 2}


async def test_a_workers_turn_closes_its_relay_writer_in_one_cancel_scope(pg_url, monkeypatch):
    """The worker closed its turn's Redis writer inside a shield of its own, around the
    close's own bounded scope: two scopes a turn (~3.5 µs each). The writer's bounded
    wait shields itself now (``aclose(shield=True)``): one. The turn's end is written
    all the same, before the worker's ``_stream_turn`` returns."""
    counts: list[tuple[int, int]] = []
    ends: list[list[str]] = []
    real = Worker._stream_turn

    async def stream_turn(self: Worker, *args: Any) -> str:
        with steps_scopes(trio.lowlevel.current_task()) as scopes:  # the turn's task
            status = await real(self, *args)
        counts.append((scopes.of("runtime/app/worker.py"), scopes.of("redis_writer.py")))
        ends.append(pipes.entries()[-1][2])
        return status

    monkeypatch.setattr(Worker, "_stream_turn", stream_turn)
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    turn = await submitter.submit("s", "tools one")
    try:
        async with fake_relay() as (relay, pipes):
            writers = attrs.make_class("Writers", ["writer"])(relay.writer)  # no cancel watch
            worker = Worker(store=store, relay=writers, agent=agent, owner="w", poll=0.05)
            (done,) = await _finished(worker, submitter, turn.turn_id)
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done is not None and done.status == "done"
    assert counts == [(0, 1)]
    assert len(ends) == 1 and ends[0][-1] == "relay.end"


def test_whether_a_last_save_may_claim_resumes_no_generator_over_the_turns_running() -> None:
    # Issue 24 goal 3: asked twice a worker's turn (its last save, the next turn's start)
    # over the turns running; ``any`` of a generator resumed it once a turn running.
    from types import SimpleNamespace

    def running(takeover: bool) -> Any:
        return SimpleNamespace(claim=SimpleNamespace(takeover=takeover))

    entries = [running(False) for _ in range(8)]
    worker = SimpleNamespace(_stopping=trio.Event(), running=dict(enumerate(entries)))
    wanted, calls = python_calls(
        lambda: [Worker._wants_next(worker, entries[0]), Worker._wants_next(worker, None)]  # type: ignore[arg-type]
    )
    assert wanted == [True, True]
    assert calls == ["_wants_next", "is_set"] * 2  # (before: a generator resumed 8 times each)
    beside = running(True)  # a takeover runs: no claim beside it, but its own last save's
    worker.running[8] = beside
    assert Worker._wants_next(worker, entries[0]) is False  # type: ignore[arg-type]
    assert Worker._wants_next(worker, None) is False  # type: ignore[arg-type]
    assert Worker._wants_next(worker, beside) is True  # type: ignore[arg-type]
    del worker.running[8]
    worker._stopping.set()
    assert Worker._wants_next(worker, None) is False  # type: ignore[arg-type]


async def test_a_workers_turn_is_freed_by_reference_counting_when_it_ends(pg_url, monkeypatch):
    """A worker's turn entry held its stream, and the stream the entry (its confirm
    callback): a cycle, so the turn's ~32 objects (the stream, its inbox, the claim, the
    result, ...) outlived each turn until the collector found them, every turn adding to
    the young generation whose growth triggers collections (issue 24 goal 3). With the
    collector off, the entry (and its stream) are gone once the turn has ended."""
    entries: list[weakref.ref[Any]] = []
    streams: list[weakref.ref[Any]] = []
    real = Worker._run_turn

    async def run_turn(self: Worker, entry: Any) -> str:
        entries.append(weakref.ref(entry))
        try:
            return await real(self, entry)
        finally:
            streams.append(weakref.ref(entry.stream))

    monkeypatch.setattr(Worker, "_run_turn", run_turn)
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    turns = [await submitter.submit(f"s{i}", "tools one") for i in range(2)]
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05)
    gc.collect()
    gc.disable()
    try:
        done = await _finished(worker, submitter, *(t.turn_id for t in turns))
        alive = [ref() is not None for ref in entries + streams]
    finally:
        gc.enable()
        await submitter.aclose()
        await store.aclose()
    assert [d.status if d is not None else None for d in done] == ["done", "done"]
    assert len(entries) == len(streams) == 2
    assert alive == [False] * 4
