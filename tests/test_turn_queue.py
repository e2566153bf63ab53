"""The turn queue (actors/stores/turns.py) against a real PostgreSQL the test run started.

Leases are short (0.3 s) and real; a lease that must be over is usually expired by SQL
(``lease_until`` set in the past), so no test depends on how fast the machine is; one test
lets a real lease run out.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
import trio
import trio.lowlevel

from actors.stores.postgres import PostgresStore
from actors.stores.turn_sql import TURNS_CHANNEL
from actors.stores.turns import Claim, QueuedTurn, Renewal, TurnQueue
from runtime.approval import WAITING_META, Decision
from runtime.errors import (
    AlreadyDecided,
    InvalidSessionId,
    LeaseLost,
    StoreError,
    TurnIdTaken,
    UnknownApproval,
)
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    File,
    Image,
    TextPart,
    ToolCallPart,
    UserMessage,
)
from runtime.turn_queue import ClientToolSpec, TurnOptions
from tests.support.pg import drop_schema, pg_base_url, pg_connect, restart_postgres

LEASE = 0.3


@pytest.fixture
async def store(pg_url):
    s = await PostgresStore.open(pg_url)
    try:
        yield s
    finally:
        await s.aclose()


@pytest.fixture
async def queue(store):
    q = TurnQueue(store, lease=LEASE, max_attempts=3)
    try:
        yield q
    finally:
        await q.aclose()


def sql(store: PostgresStore, query: str, params: tuple = ()) -> list[tuple]:
    """Run ``query`` in the store's schema on a connection of its own (autocommit)."""
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {store.schema}")
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def expire(store: PostgresStore, turn_id: str) -> None:
    """End the turn's lease now, as if its worker had stopped renewing."""
    sql(
        store,
        "UPDATE axon_turns SET lease_until = now() - interval '1 second' WHERE turn_id = %s",
        (turn_id,),
    )


# -- submitting ------------------------------------------------------------------------


async def test_submit_queues_a_turn_with_its_input_and_meta(queue):
    turn = await queue.submit("s1", "hello", meta={"user": "ann"}, regenerate=True)
    assert isinstance(turn, QueuedTurn)
    assert (turn.session_id, turn.input, turn.meta, turn.regenerate) == (
        "s1",
        "hello",
        {"user": "ann"},
        True,
    )
    assert (turn.status, turn.owner, turn.epoch, turn.attempts) == ("queued", None, 0, 0)
    assert turn.message_id == f"msg_{turn.turn_id}"
    assert await queue.get(turn.turn_id) == turn


async def test_a_turns_options_travel_with_its_row_to_the_worker_that_claims_it(queue):
    options = TurnOptions(
        user_message_id="client-1",
        tools=(ClientToolSpec(name="pick", schema={"type": "object"}, description="Pick."),),
        instructions="Be brief.",
        history=(UserMessage(content="earlier"),),
        ephemeral=True,
    )
    turn = await queue.submit("s1", "hello", options=options)
    claim = await queue.claim("w1")
    plain = await queue.submit("s2", "hello")
    assert turn.options == options
    assert claim is not None and claim.turn.options == options
    assert plain.options == TurnOptions() and plain.options.empty
    assert options.tools[0].tool().is_client


async def test_submit_round_trips_images_and_files(queue):
    content = (
        TextPart(text="look", step=0),
        Image(data=b"\x89PNG\r\n\x1a\n" + b"\x00" * 16, media_type="image/png"),
        File(data=b"a\x00b", filename="blob.bin"),
    )
    turn = await queue.submit("s1", content)
    assert (await queue.get(turn.turn_id)).input == content


async def test_submit_with_the_same_idempotency_key_returns_the_first_turn(queue):
    first = await queue.submit("s1", "hello", idempotency_key="req-1")
    again = await queue.submit("s1", "hello", idempotency_key="req-1")
    assert again.turn_id == first.turn_id
    assert len(await queue.turns("s1")) == 1


async def test_an_idempotency_key_of_another_session_is_refused(queue):
    await queue.submit("s1", "hello", idempotency_key="req-1")
    with pytest.raises(StoreError, match="already used by another session"):
        await queue.submit("s2", "hello", idempotency_key="req-1")
    assert await queue.turns("s2") == []


async def test_submit_refuses_a_bad_session_id_and_bad_input(queue):
    with pytest.raises(InvalidSessionId):
        await queue.submit("../etc", "hi")
    with pytest.raises(StoreError, match="parts must be"):
        await queue.submit("s1", (UserMessage(content="x"),))
    with pytest.raises(StoreError, match="cannot be serialized"):
        await queue.submit("s1", "hi", meta={"x": object()})
    assert await queue.turns("s1") == []


# -- claiming and order ----------------------------------------------------------------


async def test_claim_starts_the_oldest_queued_turn(queue):
    first = await queue.submit("s1", "one")
    claim = await queue.claim("w1")
    assert isinstance(claim, Claim)
    assert claim.turn.turn_id == first.turn_id
    assert (claim.owner, claim.epoch, claim.takeover) == ("w1", 1, False)
    assert (claim.turn.status, claim.turn.attempts) == ("running", 1)
    assert await queue.claim("w2") is None


async def test_a_sessions_second_turn_waits_for_its_first(queue):
    first = await queue.submit("s1", "one")
    second = await queue.submit("s1", "two")
    claim = await queue.claim("w1")
    assert claim.turn.turn_id == first.turn_id
    assert await queue.claim("w2") is None
    assert await queue.finish(claim, status="done", finish_reason="stop")
    after = await queue.claim("w2")
    assert after.turn.turn_id == second.turn_id


async def test_two_sessions_are_claimed_by_two_owners_at_once(queue):
    a = await queue.submit("sa", "one")
    b = await queue.submit("sb", "one")
    first = await queue.claim("w1")
    second = await queue.claim("w2")
    assert {first.turn.turn_id, second.turn.turn_id} == {a.turn_id, b.turn_id}
    assert {first.owner, second.owner} == {"w1", "w2"}


async def test_active_is_the_running_turn_else_the_oldest_queued(queue):
    assert await queue.active("s1") is None
    first = await queue.submit("s1", "one")
    await queue.submit("s1", "two")
    assert (await queue.active("s1")).turn_id == first.turn_id
    claim = await queue.claim("w1")
    await queue.finish(claim, status="done")
    third = await queue.claim("w1")
    assert (await queue.active("s1")).turn_id == third.turn.turn_id
    assert [t.input for t in await queue.turns("s1")] == ["one", "two"]


# -- leases, takeovers and fences ------------------------------------------------------


async def test_an_expired_lease_is_taken_over_with_the_next_epoch(queue):
    await queue.submit("s1", "one")
    old = await queue.claim("w1")
    await trio.sleep(LEASE * 2)  # the real lease runs out: w1 never renewed
    new = await queue.claim("w2")
    assert new.turn.turn_id == old.turn.turn_id
    assert (new.owner, new.epoch, new.takeover) == ("w2", old.epoch + 1, True)
    assert new.turn.attempts == 2


async def test_a_lease_renewed_in_time_is_not_taken_over(queue):
    await queue.submit("s1", "one")
    claim = await queue.claim("w1")
    renewal = await queue.renew(claim)
    assert renewal == Renewal(held=True, cancel_requested=False, cancel_reason=None)
    assert await queue.claim("w2") is None


async def test_a_fenced_save_is_refused_after_a_takeover(queue, store):
    await queue.submit("s1", "one")
    old = await queue.claim("w1")
    lost = []
    with store.fenced("s1", old.fence(on_lost=lambda: lost.append(True))):
        await store.save("s1", 0, [UserMessage(content="one")])
        expire(store, old.turn.turn_id)
        new = await queue.claim("w2")
        assert new.takeover
        with pytest.raises(LeaseLost):
            await store.save("s1", 1, [UserMessage(content="late")])
    assert lost == [True]
    record = await store.load("s1")
    assert [m.content for m in record.messages] == ["one"]
    assert (await queue.get(old.turn.turn_id)).saved


async def test_renew_after_losing_the_turn_says_not_held(queue, store):
    await queue.submit("s1", "one")
    old = await queue.claim("w1")
    expire(store, old.turn.turn_id)
    await queue.claim("w2")
    assert await queue.renew(old) == Renewal(held=False)


async def test_finish_by_the_old_owner_is_refused(queue, store):
    await queue.submit("s1", "one")
    old = await queue.claim("w1")
    expire(store, old.turn.turn_id)
    new = await queue.claim("w2")
    assert not await queue.finish(old, status="done")
    assert (await queue.get(old.turn.turn_id)).status == "running"
    assert await queue.finish(new, status="done")
    assert (await queue.get(old.turn.turn_id)).status == "done"


async def test_finish_refuses_a_status_that_is_not_final(queue):
    await queue.submit("s1", "one")
    claim = await queue.claim("w1")
    with pytest.raises(StoreError, match="status must be one of"):
        await queue.finish(claim, status="running")


async def test_a_turn_past_max_attempts_fails_and_unblocks_its_session(queue, store):
    poison = await queue.submit("s1", "kills workers")
    nxt = await queue.submit("s1", "next")
    for n in range(3):
        claim = await queue.claim(f"w{n}")
        assert claim.turn.turn_id == poison.turn_id
        expire(store, poison.turn_id)
    claim = await queue.claim("w9")
    assert claim.turn.turn_id == nxt.turn_id
    failed = await queue.get(poison.turn_id)
    assert failed.status == "failed"
    assert "abandoned by 3 workers" in failed.error


async def test_release_hands_the_turn_over_at_once_without_burning_an_attempt(queue):
    await queue.submit("s1", "one")
    old = await queue.claim("w1")
    assert await queue.release(old)
    new = await queue.claim("w2")
    assert new.turn.turn_id == old.turn.turn_id
    assert (new.takeover, new.epoch, new.turn.attempts) == (True, old.epoch + 1, 1)


async def test_a_released_claim_is_fenced_out(queue):
    await queue.submit("s1", "one")
    old = await queue.claim("w1")
    await queue.release(old)
    assert await queue.renew(old) == Renewal(held=False)
    assert not await queue.finish(old, status="done")


async def test_graceful_restarts_never_fail_a_turn(queue):
    turn = await queue.submit("s1", "one")
    for n in range(6):  # twice max_attempts
        claim = await queue.claim(f"w{n}")
        assert claim.turn.turn_id == turn.turn_id
        assert await queue.release(claim)
    assert (await queue.get(turn.turn_id)).status == "running"


# -- cancelling ------------------------------------------------------------------------


async def test_cancelling_a_queued_turn_ends_it_at_once(queue):
    turn = await queue.submit("s1", "one")
    cancelled = await queue.request_cancel(turn.turn_id, "user pressed stop")
    assert (cancelled.status, cancelled.finish_reason, cancelled.cancel_reason) == (
        "cancelled",
        "aborted",
        "user pressed stop",
    )
    assert await queue.claim("w1") is None


async def test_cancelling_a_running_turn_is_seen_by_its_renewal(queue):
    turn = await queue.submit("s1", "one")
    claim = await queue.claim("w1")
    marked = await queue.request_cancel(turn.turn_id, "stop")
    assert (marked.status, marked.cancel_requested) == ("running", True)
    assert await queue.renew(claim) == Renewal(
        held=True, cancel_requested=True, cancel_reason="stop"
    )


async def test_cancelling_an_unknown_turn_returns_none(queue):
    assert await queue.request_cancel("turn_nope") is None


async def test_wait_finished_returns_the_finished_turn(queue):
    turn = await queue.submit("s1", "one")
    claim = await queue.claim("w1")
    async with trio.open_nursery() as nursery:
        result = []

        async def waiter():
            result.append(await queue.wait_finished(turn.turn_id, 10))

        nursery.start_soon(waiter)
        await queue.finish(claim, status="done", finish_reason="stop")
    assert (result[0].status, result[0].finish_reason) == ("done", "stop")


# -- waking workers --------------------------------------------------------------------


async def test_wait_wakes_on_a_submit(queue, store):
    assert await queue.wait(0)  # first call: (re)connected, may have missed something
    other = TurnQueue(store, lease=LEASE)
    await other.submit("s1", "one")
    assert await queue.wait(10)


async def test_a_wait_is_woken_on_the_event_loop_without_a_thread(queue, store, monkeypatch):
    """The ``LISTEN`` connection's socket is waited on by Trio: a notification wakes the
    worker with no thread's hand-off, and a cancelled wait keeps the connection (nothing
    half read), which the next wait goes on listening on."""
    assert await queue.wait(0)  # connected
    hops: list[object] = []
    run_sync = trio.to_thread.run_sync

    async def counted(fn: object, *args: object, **kwargs: object) -> object:
        hops.append(fn)
        return await run_sync(fn, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    conn = queue._listen.conn
    with trio.move_on_after(0.05) as scope:
        await queue.wait(30)
    assert scope.cancelled_caught
    await TurnQueue(store, lease=LEASE).submit("s1", "one")
    hops.clear()
    assert await queue.wait(10)
    assert hops == [] and queue._listen.conn is conn


async def test_a_wait_takes_every_notification_waiting_so_one_claim_follows_a_busy_spell(
    queue, store
):
    """A worker busy with its turns does not wait, so the notifications of the turns
    finished meanwhile pile up on its connection; once idle it is woken once for all of
    them, not once each (an empty claim per finished turn, issue 24 goal 3)."""
    assert await queue.wait(0)  # connected
    # Five turns' notifications committed together: the listening backend sends them
    # in one go, so none can still be on its way when the first wait drains the
    # connection (five separate submits could leave the last in flight under load).
    notes = "; ".join(f"NOTIFY {TURNS_CHANNEL}, '{store.schema}:t{i}'" for i in range(5))

    def notify_five() -> None:
        # One simple query of several statements runs as one transaction.
        with psycopg.connect(store.libpq, autocommit=True) as conn:
            conn.execute(notes)

    await trio.to_thread.run_sync(notify_five)
    assert await queue.wait(10)
    assert not await queue.wait(0.2)


async def test_wait_times_out_when_nothing_happens(queue):
    await queue.wait(0)
    assert not await queue.wait(0.2)


async def test_a_check_of_the_listen_connection_keeps_the_notifications_it_meets(queue, store):
    # A worker's health beat checks the connection between two waits (one SELECT 1 on
    # it): a notification that arrives meanwhile is the next wait's, not lost.
    await queue.wait(0)
    await TurnQueue(store, lease=LEASE).submit("s1", "one")
    assert await queue.check_listening()
    with trio.fail_after(10):
        assert await queue.wait(30)
    assert not await queue.wait(0.05)


async def test_a_check_that_opened_the_listen_connection_anew_makes_the_next_wait_say_so(queue):
    # Gone (it broke while nothing waited): the check opens another, and notifications
    # sent in between may be lost, so the next wait returns at once, as a wait that
    # opened it does.
    await queue.wait(0)
    queue._listen.conn.close()
    assert await queue.check_listening()
    with trio.fail_after(10):
        assert await queue.wait(30)
    assert not await queue.wait(0.05)


async def test_a_cancelled_wait_leaves_waiting_usable(queue, store):
    await queue.wait(0)
    with trio.move_on_after(0.1) as scope:
        await queue.wait(30)
    assert scope.cancelled_caught
    await queue.wait(0)  # reconnects
    await TurnQueue(store, lease=LEASE).submit("s1", "one")
    assert await queue.wait(10)


# -- many workers, one database --------------------------------------------------------


async def test_four_workers_claim_forty_turns_each_exactly_once_in_session_order(
    pg_url, queue, store
):
    sessions = [f"s{n}" for n in range(5)]
    submitted = [await queue.submit(sessions[n % 5], f"t{n}") for n in range(40)]
    claimed: list[str] = []
    finished_order: dict[str, list[int]] = {s: [] for s in sessions}
    running: set[str] = set()
    violations: list[str] = []

    async def worker(name: str) -> None:
        own = await PostgresStore.open(pg_url)
        q = TurnQueue(own, lease=10)
        try:
            idle = 0
            while idle < 20:
                claim = await q.claim(name)
                if claim is None:
                    idle += 1
                    await trio.sleep(0.01)
                    continue
                idle = 0
                sid = claim.turn.session_id
                if sid in running:
                    violations.append(f"{sid} claimed twice at once")
                running.add(sid)
                claimed.append(claim.turn.turn_id)
                doubles = await own.run(
                    "check",
                    lambda conn: conn.execute(
                        "SELECT session_id FROM axon_turns WHERE status = 'running' "
                        "GROUP BY session_id HAVING count(*) > 1"
                    ).fetchall(),
                )
                if doubles:
                    violations.append(f"two running turns in {doubles}")
                await trio.lowlevel.checkpoint()
                finished_order[sid].append(claim.turn.seq)
                running.discard(sid)
                assert await q.finish(claim, status="done")
        finally:
            await q.aclose()
            await own.aclose()

    async with trio.open_nursery() as nursery:
        for n in range(4):
            nursery.start_soon(worker, f"w{n}")
    assert violations == []
    assert sorted(claimed) == sorted(t.turn_id for t in submitted)
    for sid, order in finished_order.items():
        assert order == sorted(order), sid
    rows = sql(store, "SELECT status, count(*) FROM axon_turns GROUP BY status")
    assert rows == [("done", 40)]


# -- the server restarting -------------------------------------------------------------


async def test_submit_and_claim_succeed_after_postgresql_restarts(queue):
    await queue.wait(0)
    await trio.to_thread.run_sync(restart_postgres)  # the run's own server, never the user's
    turn = await queue.submit("s1", "after the restart")
    claim = await queue.claim("w1")
    assert claim.turn.turn_id == turn.turn_id
    assert await queue.wait(5)  # the broken LISTEN connection is reopened, not raised


async def test_wait_ignores_turns_of_another_schema(queue):
    schema = f"axon_t_{uuid.uuid4().hex[:12]}"
    other = await PostgresStore.open(f"{pg_base_url()}?schema={schema}")
    try:
        await queue.wait(0)
        await TurnQueue(other, lease=LEASE).submit("s1", "elsewhere")
        assert not await queue.wait(0.3)
    finally:
        await other.aclose()
        drop_schema(schema)


# -- the schema ------------------------------------------------------------------------


async def test_a_store_from_before_the_queue_columns_gains_them_on_open(pg_url, store):
    sql(store, "ALTER TABLE axon_turns DROP COLUMN meta, DROP COLUMN regenerate, "
        "DROP COLUMN cancel_reason")  # fmt: skip
    sql(store, "INSERT INTO axon_turns (turn_id, session_id, input) VALUES ('old', 's1', '\"hi\"')")
    reopened = await PostgresStore.open(pg_url)
    try:
        queue = TurnQueue(reopened)
        old = await queue.get("old")
        assert (old.input, old.meta, old.regenerate, old.cancel_reason) == ("hi", {}, False, None)
        assert (await queue.submit("s1", "new", meta={"k": 1})).meta == {"k": 1}
    finally:
        await reopened.aclose()


# -- takeovers of special turns --------------------------------------------------------


async def test_a_takeover_of_a_turn_being_cancelled_tells_the_new_worker(queue, store):
    turn = await queue.submit("s1", "one")
    old = await queue.claim("w1")
    await queue.request_cancel(turn.turn_id, "stop")
    expire(store, turn.turn_id)
    new = await queue.claim("w2")
    assert (new.takeover, new.turn.cancel_requested, new.turn.cancel_reason) == (
        True,
        True,
        "stop",
    )
    assert old.turn.turn_id == new.turn.turn_id


async def test_a_finish_retried_after_its_commit_reports_success(queue):
    await queue.submit("s1", "one")
    claim = await queue.claim("w1")
    assert await queue.finish(claim, status="done")
    assert await queue.finish(claim, status="done")  # as a retried transaction would
    assert not await queue.finish(claim, status="failed")


async def test_a_submit_repeated_with_its_turn_id_returns_the_first_turn(queue):
    first = await queue.submit("s1", "hello", turn_id="turn-a")
    again = await queue.submit("s1", "hello", turn_id="turn-a")
    assert again == first
    # Another session's: taken (not its turn, nor which session holds it); a front end
    # submits it again under an id of its own (tests/test_turn_id_races.py).
    with pytest.raises(TurnIdTaken, match="turn id 'turn-a' is already used"):
        await queue.submit("s2", "hello", turn_id="turn-a")


# -- turns that wait for a person --------------------------------------------------------


async def suspended(queue: TurnQueue, store: PostgresStore, session_id: str = "s1") -> Claim:
    """A claimed turn whose stored step waits for approval ``ap1`` (call ``c1``), and
    which its worker then suspended."""
    await queue.submit(session_id, "delete it")
    claim = await queue.claim("w1")
    assert claim is not None
    call = ToolCallPart(
        tool_call_id="c1",
        tool_name="delete",
        input={},
        step=0,
        awaiting=Awaiting(kind="approval", id="ap1", turn_id=claim.turn.turn_id),
    )
    messages = [
        UserMessage(content="delete it"),
        AssistantMessage(id=claim.turn.message_id, content=(call,)),
    ]
    await store.save(session_id, 0, messages)
    assert await queue.suspend(claim, expires_at=1000.0)
    return claim


async def test_a_suspended_turn_holds_no_owner_no_lease_and_not_its_session(queue, store):
    claim = await suspended(queue, store)
    later = await queue.submit("s1", "never mind")
    (row,) = sql(
        store,
        "SELECT status, owner, lease_until, expires_at FROM axon_turns WHERE turn_id = %s",
        (claim.turn.turn_id,),
    )
    assert row == ("awaiting-input", None, None, 1000.0)
    assert await queue.active("s1") == await queue.get_status(later.turn_id)  # the wait is not
    next_claim = await queue.claim("w2")  # the session's next turn runs, superseding the wait
    assert next_claim is not None and next_claim.turn.turn_id == later.turn_id
    waited = await queue.get_status(claim.turn.turn_id)
    assert (waited.status, waited.finish_reason) == ("done", "superseded")


async def test_a_stale_claim_cannot_suspend_the_turn(queue, store):
    turn = await queue.submit("s1", "one")
    old = await queue.claim("w1")
    expire(store, turn.turn_id)
    await queue.claim("w2")  # taken over
    assert not await queue.suspend(old)
    assert (await queue.get_status(turn.turn_id)).status == "running"


async def test_the_decision_that_completes_a_wait_makes_the_next_claim_its_continuation(
    queue, store
):
    claim = await suspended(queue, store)
    decided = await queue.decide("s1", "ap1", Decision(approved=True), {})
    resumed = await queue.claim("w2")
    assert decided.recorded.complete and decided.turn.resumes == 1
    assert decided.turn.status == "running" and decided.turn.owner is None
    assert resumed is not None and resumed.turn.turn_id == claim.turn.turn_id
    assert (resumed.resumed, resumed.takeover, resumed.turn.resumes) == (True, False, 1)
    assert resumed.turn.expires_at is None


async def test_a_decision_for_a_turn_that_no_longer_waits_is_refused_and_not_saved(queue, store):
    await suspended(queue, store)
    await queue.submit("s1", "never mind")
    await queue.claim("w2")  # supersedes the wait
    version = await store.version("s1")
    with pytest.raises(AlreadyDecided, match="superseded"):
        await queue.decide("s1", "ap1", Decision(approved=True), {})
    assert await store.version("s1") == version


async def test_a_waiting_turn_is_cancelled_only_when_asked_and_then_no_decision_resumes_it(
    queue, store
):
    claim = await suspended(queue, store)
    turn_id = claim.turn.turn_id
    left = await queue.request_cancel(turn_id, "stop")
    ended = await queue.request_cancel(turn_id, "canceled by the A2A client", waiting=True)
    with pytest.raises(AlreadyDecided, match="cancelled"):
        await queue.decide("s1", "ap1", Decision(approved=True), {})
    assert left is not None and left.status == "awaiting-input"
    assert ended is not None and (ended.status, ended.finish_reason, ended.expires_at) == (
        "cancelled",
        "aborted",
        None,
    )
    assert ended.cancel_reason == "canceled by the A2A client"
    assert await queue.claim("w2") is None  # nothing to resume


async def test_a_decision_for_another_sessions_call_is_unknown(queue, store):
    await suspended(queue, store, "s1")
    await store.save("s2", 0, [UserMessage(content="hi")])
    with pytest.raises(UnknownApproval):
        await queue.decide("s2", "ap1", Decision(approved=True), {})


async def test_two_deciders_blocked_on_the_waiting_row_at_once_record_exactly_one(
    pg_url, queue, store
):
    """Two decisions (each on a store and pool of its own, as two front ends) that both
    read the session and both reach the turn's row while a third transaction holds it:
    when it lets go, one records and requeues the turn, the other re-reads the row the
    first committed, finds it no longer waits and is refused, saving nothing."""
    import psycopg

    claim = await suspended(queue, store)
    other = await PostgresStore.open(pg_url)
    try:
        queues = (queue, TurnQueue(other, lease=LEASE, max_attempts=3))
        outcomes: list[object] = []
        with psycopg.connect(pg_base_url(), autocommit=False) as holder:
            holder.execute(f"SET search_path TO {store.schema}")
            holder.execute(
                "SELECT 1 FROM axon_turns WHERE turn_id = %s FOR UPDATE", (claim.turn.turn_id,)
            )

            async def decide(q: TurnQueue, approved: bool) -> None:
                try:
                    outcomes.append(await q.decide("s1", "ap1", Decision(approved=approved), {}))
                except AlreadyDecided as exc:
                    outcomes.append(exc)

            async with trio.open_nursery() as nursery:
                for q, approved in zip(queues, (True, False), strict=True):
                    nursery.start_soon(decide, q, approved)
                for _ in range(3000):  # until both wait on the row's lock
                    waiting = sql(  # the decision's statement, or its function's call
                        store,
                        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND (query LIKE %s OR query LIKE %s)",
                        ("%axon_turns%", "%axon_decide%"),
                    )
                    if waiting == [(2,)]:
                        break
                    await trio.sleep(0.01)
                assert waiting == [(2,)]
                holder.rollback()
        await queues[1].aclose()
    finally:
        await other.aclose()
    won = [o for o in outcomes if not isinstance(o, AlreadyDecided)]
    lost = [o for o in outcomes if isinstance(o, AlreadyDecided)]
    assert len(won) == 1 and len(lost) == 1, outcomes
    assert "its turn is running now" in str(lost[0])
    row = await queue.get_status(claim.turn.turn_id)
    assert (row.status, row.resumes) == ("running", 1)
    record = await store.load("s1")
    assert record is not None and record.version == won[0].recorded.version  # type: ignore[attr-defined]


async def test_an_expired_wait_is_handed_to_one_caller_at_a_time(queue, store):
    claim = await suspended(queue, store)
    assert await queue.take_expired(999.0) == []  # not due yet
    (due,) = await queue.take_expired(1000.0)
    again = await queue.take_expired(1000.0)  # held back from a second worker
    await queue.set_expiry(claim.turn.turn_id, 2000.0)
    later = await queue.take_expired(1999.0)
    assert due.turn_id == claim.turn.turn_id and again == [] and later == []
    assert (await queue.get_status(claim.turn.turn_id)).expires_at == 2000.0


async def test_a_store_from_before_waiting_turns_gains_the_status_on_open(pg_url, store):
    sql(store, "ALTER TABLE axon_turns DROP CONSTRAINT axon_turns_status_check, "
        "ADD CONSTRAINT axon_turns_status_check CHECK (status IN "
        "('queued', 'running', 'done', 'failed', 'cancelled'))")  # fmt: skip
    sql(store, "ALTER TABLE axon_turns DROP COLUMN expires_at, DROP COLUMN resumes, "
        "DROP COLUMN resume_pending")  # fmt: skip
    reopened = await PostgresStore.open(pg_url)
    try:
        queue = TurnQueue(reopened)
        claim = await suspended(queue, reopened)
        assert (await queue.get_status(claim.turn.turn_id)).waiting
    finally:
        await reopened.aclose()


FAR = 4_000_000_000.0
"""A wait's deadline in 2096: a decision before it is in time (one past it is refused)."""


async def test_the_step_that_waits_suspends_the_row_in_its_fenced_save(queue, store):
    await queue.submit("s1", "delete it")
    claim = await queue.claim("w1")
    assert claim is not None
    call = ToolCallPart(
        tool_call_id="c1",
        tool_name="delete",
        input={},
        step=0,
        awaiting=Awaiting(kind="approval", id="ap1", turn_id=claim.turn.turn_id, expires_at=FAR),
    )
    messages = [
        UserMessage(content="delete it"),
        AssistantMessage(id=claim.turn.message_id, content=(call,)),
    ]
    told: list[str] = []
    with queue.fenced(claim, on_suspended=lambda: told.append("suspended")):
        await store.save("s1", 0, messages[:1])  # a step that waits for nothing
        assert told == []
        await store.save("s1", 0, messages, {WAITING_META: 1})
        (row,) = sql(
            store,
            "SELECT status, owner, lease_until, expires_at FROM axon_turns WHERE turn_id = %s",
            (claim.turn.turn_id,),
        )
        # The decision for it, made while the worker still holds the fence (its turn
        # is ending): not the turn's own write, so not refused.
        decided = await queue.decide("s1", "ap1", Decision(approved=True), {})
    assert told == ["suspended"]
    assert row == ("awaiting-input", None, None, FAR)
    assert decided.recorded.complete and decided.turn.resumes == 1


async def test_steer_submits_are_counted_on_the_running_turn_and_its_fenced_saves_read_it(
    queue, store
):
    """The worker learns of steering from its saves (no read of its own): each ``steer``
    submit counts itself on the running turn's row, each fenced save reads the count in
    its fence check, and the read of the steering rows returns the count it saw."""
    from runtime.turn_queue import SteerWatch

    await queue.submit("s1", "first")
    claim = await queue.claim("w1")
    assert claim is not None
    watch = SteerWatch()
    with queue.fenced(claim, watch=watch):
        await store.save("s1", 0, [UserMessage(content="first")])  # the first: it marks
        assert (watch.steers, watch.pending) == (0, False)
        steering = await queue.submit("s1", "also this", on_busy="steer")
        await store.save("s1", 0, [UserMessage(content="first")])
        assert (watch.steers, watch.pending) == (1, True)
        taken = await queue.take_steering(claim, watch)
        assert [t.turn_id for t in taken] == [steering.turn_id]
        assert (watch.taken, watch.pending) == (1, False)
        later = await queue.submit("s1", "and this", on_busy="steer")  # after the read
        await store.save("s1", 0, [UserMessage(content="first")])
        assert (watch.steers, watch.pending) == (2, True)
        taken = await queue.take_steering(claim, watch)
    assert steering.steer_of == later.steer_of == claim.turn.turn_id
    assert [t.turn_id for t in taken] == [steering.turn_id, later.turn_id]  # none marked yet
    assert not watch.pending
