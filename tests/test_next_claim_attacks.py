"""The riding claim of a turn's last save (``axon_save_next_v1``) and the workers' wake-ups
attacked (round 3): a call's answer lost after its commit, a cancel landing between a
turn's claim and its start, a worker stopping as its turn ends, a mixed fleet over a
store upgraded while in use. Real PostgreSQL (the run's own), workers in this process.

The wake-up tests run their workers with a poll of an hour: a turn that only a missed
``NOTIFY`` would start never starts, and the test fails at its deadline, not later.
"""

from __future__ import annotations

import random
import types
from functools import partial
from typing import Any

import attrs
import psycopg
import pytest
import trio
import trio.testing

from actors.stores.postgres import PostgresStore
from actors.stores.postgres_lane import LoopLane
from actors.stores.turns import TurnQueue
from runtime.agent import Agent
from runtime.app import worker as worker_module
from runtime.app.worker import Worker
from runtime.approval import Decision
from runtime.errors import AlreadyDecided
from runtime.output import StepStart, TextDelta, TextFinish
from runtime.tools import tool
from runtime.turn_queue import NextClaim
from tests.support.pg import pg_connect
from tests.support.worker_agent import agent, respond
from tests.test_pg_turn_statements import _Listening, said, submit_held_open
from tests.test_turn_queue import suspended

NEVER = 3600.0
"""A poll no test waits for: only a wake-up starts a turn."""


def _lose_answer_once(
    monkeypatch: pytest.MonkeyPatch, name: bytes, suspends: bool = False
) -> list[int]:
    """The first call of the prepared statement ``name`` (``suspends``: one that suspends
    its turn) commits, then its answer is lost as when the connection dies on the way
    back; the store retries it. The list fills once it happened."""
    real = LoopLane.call
    lost: list[int] = []

    async def call(self: Any, called: bytes, sql: bytes, params: Any, *args: Any) -> Any:
        result = await real(self, called, sql, params, *args)
        # the suspension's flag: the save's 14th parameter, the save-and-claim's 15th
        flag = 14 if called == b"axon_save_next_call" else 13
        if called == name and not lost and (not suspends or params[flag] == b"t"):
            lost.append(1)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(LoopLane, "call", call)
    return lost


def _sql(store: PostgresStore, query: str, params: tuple[Any, ...] = ()) -> None:
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {store.schema}")
        conn.execute(query, params)


async def test_a_last_save_whose_answer_is_lost_after_its_commit_is_the_turns_end(
    pg_url, monkeypatch
):
    """The save committed (the turn ``done``, its answer stored, the next turn claimed)
    and only its answer was lost: the retry found the row as its own commit left it.
    It was read as a lost lease: the worker counted the turn ``lost``, the turn's
    stream got a ``LeaseLost`` error, the relay's stream was left without its end.
    Now the turn ends as stored; the turn the lost answer claimed waits for its lease,
    as a claim before a crash does, and is taken over."""
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    first = await submitter.submit("s0", "hello")
    second = await submitter.submit("s1", "hello")
    lost = _lose_answer_once(monkeypatch, b"axon_save_next_call")
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05, concurrency=1, lease=1.0)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            done = [await submitter.wait_finished(t.turn_id, 30) for t in (first, second)]
            worker.stop()
        record = await store.load("s0")
    finally:
        await submitter.aclose()
        await store.aclose()
    assert lost == [1]
    assert worker.done == {"done": 2}  # not {"lost": 1, "done": 1}
    assert [(d.status, d.epoch) if d else None for d in done] == [("done", 1), ("done", 2)]
    assert record is not None and [m.text for m in record.messages] == ["hello", "echo: hello"]


async def test_a_retried_last_save_returns_the_version_its_lost_answer_carried(pg_url, monkeypatch):
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0)
    finished: list[bool] = []
    try:
        await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None
        _lose_answer_once(monkeypatch, b"axon_save_call_ending")
        with queue.fenced(claim, on_finished=lambda: finished.append(True)):
            version = await store.save("s", 0, [], expected_version=None, ends="stop")
        assert version == await store.version("s") and finished == [True]
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_retried_last_save_behind_a_later_write_returns_no_version_of_that_write(
    pg_url, monkeypatch
):
    """Another writer saved the session between the lost answer and the retry (its next
    turn, on another worker): its version is not this save's (a session in memory
    taking it would skip the reload and overwrite that write), so the version is 0,
    which no stored session has: the session's next turn here reads it again."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0)
    real = LoopLane.call

    async def call(self: Any, name: bytes, sql: bytes, params: Any, *args: Any) -> Any:
        result = await real(self, name, sql, params, *args)
        if name == b"axon_save_call_ending" and not later:
            later.append(await other.save("s", 0, [], meta={"k": 1}))
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    later: list[int] = []
    other = await PostgresStore.open(pg_url)
    try:
        await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None
        monkeypatch.setattr(LoopLane, "call", call)
        with queue.fenced(claim, on_finished=lambda: None):
            version = await store.save("s", 0, [], expected_version=None, ends="stop")
        assert version == 0 and later and await store.version("s") == later[0]
    finally:
        await other.aclose()
        await queue.aclose()
        await store.aclose()


async def test_a_suspending_saves_answer_lost_after_its_commit_leaves_the_turn_waiting(
    pg_url, monkeypatch
):
    """The step that asks for approval committed its call and suspended the turn; the
    answer was lost. The retry found the row waiting with no owner and failed on it
    (``AttributeError``: the owner's ``NULL`` decoded): the turn's stream ended with an
    ``AttributeError`` and the worker counted it ``lost``. Now it waits for its person,
    as stored."""
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    turn = await submitter.submit("s0", "approve this")
    # the suspending save claims for the slot it frees (axon_save_next_v5): what its
    # lost answer claimed (nothing here) is given back
    lost = _lose_answer_once(monkeypatch, b"axon_save_next_call", suspends=True)
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05, concurrency=1)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            with trio.fail_after(30):
                while not worker.done:  # noqa: ASYNC110 - a worker's count
                    await trio.sleep(0.02)
            worker.stop()
        status = await submitter.get_status(turn.turn_id)
    finally:
        await submitter.aclose()
        await store.aclose()
    assert lost == [1]
    assert worker.done == {"awaiting-input": 1}
    assert status is not None and (status.status, status.owner) == ("awaiting-input", None)


async def test_a_turn_cancelled_between_its_claim_by_a_last_save_and_its_start_never_runs(
    pg_url, monkeypatch
):
    """The client leaves as the previous turn's last save claims its turn: the front end
    marks the row and asks over the relay, whose message came while the turn was not
    running here yet. It was dropped: the turn ran, its answer was stored and the row
    said ``done`` with a cancel reason, until a renewal (a third of a lease later) said
    it again. Now the request waits for the turn: it starts cancelled, its model never
    asked (the stored assistant message is empty), the row ``cancelled``."""
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    await submitter.submit("s0", "hello")
    second = await submitter.submit("s1", "hello")
    worker = Worker(store=store, agent=agent, owner="w", poll=0.05, concurrency=1, lease=60.0)

    def claimed_next(self: Any, claimed: Any) -> None:
        self.next = claimed
        _sql(
            store,
            "UPDATE axon_turns SET cancel_requested = true, cancel_reason = 'left' "
            "WHERE turn_id = %s",
            (claimed.turn_id,),
        )
        worker._on_relay_cancel(claimed.turn_id, "left")  # the relay's message, now

    monkeypatch.setattr(worker_module._Running, "claimed_next", claimed_next)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            done = await submitter.wait_finished(second.turn_id, 30)
            worker.stop()
        record = await store.load("s1")
    finally:
        await submitter.aclose()
        await store.aclose()
    assert done is not None and (done.status, done.cancel_reason) == ("cancelled", "left")
    assert worker.done == {"done": 1, "cancelled": 1}
    assert record is not None and [m.text for m in record.messages] == ["hello", ""]


# -- wake-ups: no claimable turn left until the poll -------------------------------------


def _gated_agent(gate: trio.Event) -> Agent:
    """The worker tests' agent, plus: input ``hold ...`` calls ``hold``, which returns
    once ``gate`` is set (the test decides when the turn ends)."""

    @tool
    async def hold() -> str:
        """Wait for the test."""
        await gate.wait()
        return "held"

    def responder(request: Any) -> list[Any]:
        from actors.providers.scripted import current_step, tool_call
        from tests.support.worker_agent import _last_input

        if _last_input(request).startswith("hold") and current_step(request.messages) == 0:
            return tool_call("hold", {}, tool_call_id="call_hold")
        return respond(request)

    from actors.providers.scripted import ScriptedProvider

    return Agent(
        name="gated", provider=ScriptedProvider(responder=responder), tools=[hold], instructions="t"
    )


async def _running(queue: TurnQueue, turn_id: str) -> None:
    with trio.fail_after(30):
        while (status := await queue.get_status(turn_id)) is None or (  # noqa: ASYNC110
            status.status != "running"
        ):
            await trio.sleep(0.02)


async def test_a_stopping_workers_last_turn_end_wakes_an_idle_worker_for_the_sessions_next(
    pg_url,
):
    """A worker stopping while its turn runs claims nothing with the turn's last save:
    the end's wake-up is what tells the idle worker the session's next turn is
    claimable. Missed, that turn waited for the idle worker's poll."""
    gate = trio.Event()
    gated = _gated_agent(gate)
    stores = [await PostgresStore.open(pg_url) for _ in range(2)]
    submitter = TurnQueue(stores[0])
    first = await submitter.submit("a", "hold on")
    stopping = Worker(store=stores[0], agent=gated, owner="stopping", poll=NEVER, concurrency=1)
    idle = Worker(store=stores[1], agent=gated, owner="idle", poll=NEVER, concurrency=1)
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(stopping.run)
                await _running(submitter, first.turn_id)
                await nursery.start(idle.run)
                second = await submitter.submit("a", "hello")
                await trio.sleep(0.2)  # the idle worker looked (not claimable) and waits
                stopping.stop()
                gate.set()
                done = await submitter.wait_finished(second.turn_id, 30)
                idle.stop()
    finally:
        await submitter.aclose()
        for store in stores:
            await store.aclose()
    assert done is not None and (done.status, done.owner) == ("done", "idle")
    assert stopping.done == {"done": 1}


async def test_a_turn_a_last_save_claimed_for_a_stopping_worker_wakes_an_idle_worker(
    pg_url, monkeypatch
):
    """The worker began stopping just after its last save claimed the next turn (the
    idle worker had looked and found it running): it gives the turn back, and the
    release's wake-up starts it on the idle worker at once (a takeover: nothing of it
    ran), not at the idle worker's poll."""
    stores = [await PostgresStore.open(pg_url) for _ in range(2)]
    submitter = TurnQueue(stores[0])
    gate, proceed = trio.Event(), trio.Event()
    gated = _gated_agent(gate)
    first = await submitter.submit("a", "hold on")
    stopping = Worker(store=stores[0], agent=gated, owner="stopping", poll=NEVER, concurrency=1)
    idle = Worker(store=stores[1], agent=gated, owner="idle", poll=NEVER, concurrency=1)

    def claimed_next(self: Any, claimed: Any) -> None:
        async def take() -> Any:
            await proceed.wait()
            return await claimed.take()

        self.next = attrs.evolve(claimed, take=take)

    monkeypatch.setattr(worker_module._Running, "claimed_next", claimed_next)
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(stopping.run)
                await _running(submitter, first.turn_id)
                second = await submitter.submit("b", "hello")  # nobody free: it waits
                gate.set()  # the first turn ends; its last save claims the second
                await _running(submitter, second.turn_id)
                await nursery.start(idle.run)  # looks, finds it running, waits
                await trio.sleep(0.2)
                stopping.stop()
                proceed.set()  # the claimed turn, read now: given back
                done = await submitter.wait_finished(second.turn_id, 30)
                idle.stop()
    finally:
        await submitter.aclose()
        for store in stores:
            await store.aclose()
    assert done is not None and (done.status, done.owner, done.epoch) == ("done", "idle", 2)
    assert stopping.done == {"done": 1}


class _EarlierWorker(Worker):
    """A worker of the version before the riding claim: its last save only saves and
    ends the turn (the save function), its loop claims after (``axon_claim_v2``)."""

    def _wants_next(self, entry: Any) -> bool:
        return False if entry is not None else super()._wants_next(entry)


async def test_a_mixed_fleet_runs_every_turn_over_a_store_upgraded_while_in_use(pg_url):
    """A store with the one head trigger of before, used by a worker that ends turns with
    the riding claim and one that ends them with the plain save and claims after, while
    120 submits to 5 sessions race the turns' ends; half-way a process of this version
    opens the store and splits the trigger in place. Every turn runs (none left queued
    without a head, none waiting for a poll), each session's in order."""
    stores = [await PostgresStore.open(pg_url) for _ in range(3)]
    _sql(stores[0], "DROP TRIGGER axon_turns_head_insert_v1 ON axon_turns")
    _sql(stores[0], "DROP TRIGGER axon_turns_head_v1 ON axon_turns")
    _sql(
        stores[0],
        "CREATE TRIGGER axon_turns_head_v1 BEFORE INSERT OR UPDATE OF status ON axon_turns "
        "FOR EACH ROW EXECUTE FUNCTION axon_turns_head_v1()",
    )
    submitter = TurnQueue(stores[0])
    workers = [
        Worker(store=stores[1], agent=agent, owner="new", poll=NEVER, concurrency=2),
        _EarlierWorker(store=stores[2], agent=agent, owner="old", poll=NEVER, concurrency=2),
    ]
    rng = random.Random(7)
    submitted: list[Any] = []
    upgraded: list[PostgresStore] = []
    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for worker in workers:
                    await nursery.start(worker.run)
                for n in range(120):
                    if n == 60:
                        upgraded.append(await PostgresStore.open(pg_url))
                    submitted.append(await submitter.submit(f"s{rng.randrange(5)}", f"m{n}"))
                    await trio.sleep(rng.choice([0, 0, 0.001, 0.003, 0.01]))
                done = [await submitter.wait_finished(t.turn_id, 60) for t in submitted]
                for worker in workers:
                    worker.stop()
        records = {s: await stores[0].load(f"s{s}") for s in range(5)}
    finally:
        await submitter.aclose()
        for store in (*stores, *upgraded):
            await store.aclose()
    assert [d.status if d else None for d in done] == ["done"] * 120
    assert all(worker.done.get("done") for worker in workers)  # both ran turns
    for s, record in records.items():
        asked = [t.input for t in submitted if t.session_id == f"s{s}"]
        assert record is not None
        assert [m.text for m in record.messages] == [
            text for m in asked for text in (m, f"echo: {m}")
        ]


# -- the relay's bulk forwarding and the lease ------------------------------------------


class _Batches:
    """A turn stream's :meth:`next_batch`, scripted."""

    def __init__(self, *batches: list[Any]) -> None:
        self.batches = list(batches)

    async def next_batch(self) -> list[Any]:
        return self.batches.pop(0) if self.batches else []


class _ScanningWriter:
    """A relay writer whose scan of what the dead worker showed of a step takes a round
    trip, during which ``during`` runs; what it is given to write, recorded."""

    def __init__(self, during: Any) -> None:
        self.during = during
        self.appended: list[Any] = []

    async def shown(self, step: int) -> list[Any]:
        await trio.lowlevel.checkpoint()
        self.during()
        return [TextFinish(step=step, part_id="p0")]  # the dead worker's open part

    def append(self, chunk: Any) -> None:
        self.appended.append(chunk)


async def test_a_takeover_that_loses_its_lease_while_it_reads_the_shown_step_writes_nothing():
    """A taken-over turn reads from the relay what its dead worker showed of the step it
    re-runs (a Redis round trip, up to the relay's close timeout). Its own lease lost
    meanwhile (another worker took the turn over again), it still wrote the step's
    closing parts and a ``reset-step`` into the stream the newer worker now writes:
    readers dropped the newer worker's parts of that step. Now it writes nothing."""
    claim = types.SimpleNamespace(takeover=True, epoch=2, turn=types.SimpleNamespace(turn_id="t1"))
    entry = worker_module._Running(claim=claim)  # type: ignore[arg-type]
    entry.stream = types.SimpleNamespace(session=None, cancel=lambda reason: None)
    writer = _ScanningWriter(lambda: entry.lose("renewal refused"))
    out = _Batches([StepStart(step=0), TextDelta(step=0, part_id="p1", text="again")])
    await Worker._relay(object.__new__(Worker), entry, out, writer)
    assert entry.lost and writer.appended == []


async def _waiting_for_a_lock(store: PostgresStore) -> None:
    """Until a backend waits for an advisory lock (the session's)."""
    with trio.fail_after(10), pg_connect() as conn:
        while not conn.execute(  # noqa: ASYNC110 - the server's state
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ).fetchone():
            await trio.sleep(0.01)


async def test_a_submit_in_flight_when_a_last_save_claims_is_seen_by_its_wake_up(pg_url):
    """The riding claim cannot see a submit of the session not committed yet; its wake-up
    waits for the session's lock, which that submit holds from its insert to its commit,
    and then sees the turn and wakes the workers for it (the submit's own notification
    came while the ending turn still ran: a claim it woke found the session busy)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    handed: list[Any] = []
    nxt = NextClaim(wanted=lambda: True, on_claimed=lambda *key: None, claimed=handed.append)
    await queue.submit("s", "one")
    claim = await queue.claim("w1")
    assert claim is not None
    listening = _Listening(store)
    submitter = submit_held_open(store)
    try:
        with queue.fenced(claim, on_finished=lambda: None, claim_next=nxt):
            version = await store.save("s", 0, said("one"), expected_version=None)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(
                        store.save, "s", 1, said("answer"), expected_version=version, ends="stop"
                    )
                )
                await _waiting_for_a_lock(store)  # its claim ran: it waits for the lock
                submitter.commit()
        assert handed == []  # the riding claim saw no turn
        assert listening.told() == [claim.turn.turn_id]
    finally:
        submitter.close()
        listening.close()
        await queue.aclose()
        await store.aclose()


async def test_a_decision_whose_answer_is_lost_after_its_commit_is_recorded_not_refused(
    pg_url, monkeypatch
):
    """The decision's call committed (the call decided, the turn put back for its
    continuation) and only its answer was lost. The retry found the version moved and the
    call decided, and the person was told the approval was already decided although their
    decision was the one stored. Now the retry recognises the session as its own write
    left it: the decision is reported recorded, the turn resumes once."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0)
    try:
        claim = await suspended(queue, store)
        lost = _lose_answer_once(monkeypatch, b"axon_decide_call")
        decided = await queue.decide("s1", "ap1", Decision(approved=True), {})
        resumed = await queue.claim("w2")
    finally:
        await queue.aclose()
        await store.aclose()
    assert lost == [1]
    assert decided.recorded.complete and decided.recorded.version > 0
    assert (decided.turn.status, decided.turn.owner, decided.turn.resumes) == ("running", None, 1)
    assert resumed is not None and resumed.turn.turn_id == claim.turn.turn_id and resumed.resumed


async def test_a_retried_decision_that_never_committed_is_refused_behind_anothers(
    pg_url, monkeypatch
):
    """The first send failed before anything was written, and another person denied the
    call meanwhile: the retry finds the call decided, and it is not this decision that
    is stored, so it is refused as any late decision is."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0)
    other = await PostgresStore.open(pg_url)
    rival = TurnQueue(other, lease=30.0)
    real = LoopLane.call
    failed: list[int] = []

    async def call(self: Any, name: bytes, sql: bytes, params: Any, *args: Any) -> Any:
        if name == b"axon_decide_call" and self is store._lane and not failed:
            failed.append(1)
            await rival.decide("s1", "ap1", Decision(approved=False, reason="no"), {})
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real(self, name, sql, params, *args)

    try:
        await suspended(queue, store)
        monkeypatch.setattr(LoopLane, "call", call)
        with pytest.raises(AlreadyDecided):
            await queue.decide("s1", "ap1", Decision(approved=True), {})
        record = await store.load("s1")
    finally:
        await rival.aclose()
        await other.aclose()
        await queue.aclose()
        await store.aclose()
    assert failed == [1]
    assert record is not None
    (call_part,) = record.messages[-1].content
    assert call_part.awaiting.approved is False and call_part.awaiting.reason == "no"
