"""The statements a worker's turn costs PostgreSQL, counted (issue 24 goal 3).

Every statement is a round trip and a parse on both sides, and a worker saves every step
of every turn: these pin how many a save sends (counted by a wrapper around psycopg's
cursor, so a count, not a timing), and that fewer statements still write, and refuse,
what the store's contract says.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from functools import partial
from typing import Any

import attrs
import psycopg
import pytest
import trio
import trio.testing

from actors.stores.postgres import _TURNS_CHANNEL, LockedSession, PostgresStore
from actors.stores.postgres_calls import (
    CLAIM_FUNCTION_NAME,
    DECIDE_FUNCTION_NAME,
    SAVE_FUNCTION_NAME,
    SAVE_NEXT_FUNCTION_NAME,
)
from actors.stores.postgres_lane import LoopLane
from actors.stores.turn_claims import _take_expired
from actors.stores.turn_sql import TURNS_CHANNEL
from actors.stores.turns import QueuedTurn, TurnQueue
from runtime.approval import WAITING_META, Decision
from runtime.errors import (
    AlreadyDecided,
    LeaseLost,
    QueueFull,
    StoreConflict,
    StoreError,
    UnknownApproval,
    WaitExpired,
)
from runtime.messages import AssistantMessage, Awaiting, ToolCallPart, UserMessage
from runtime.turn_queue import Claim, NextClaim, NextClaimed


async def _drop_function(pg_url: str, name: str) -> None:
    """Drop the server-side function ``name``, as a store made before it was added."""
    store = await PostgresStore.open(pg_url)
    try:
        await store.run(
            "drop", lambda conn: conn.execute(f"DROP FUNCTION {name}"), transaction=False
        )
    finally:
        await store.aclose()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """Every cursor statement from here on, and every statement the store sends from the
    event loop (:class:`~actors.stores.postgres_lane.LoopLane`), by its first word
    (``BEGIN``/``COMMIT``, which psycopg sends without a cursor, are not counted:
    ``TRANSACTION`` counts the transactions begun, two round trips each)."""
    counts: collections.Counter[str] = collections.Counter()
    execute = psycopg.Cursor.execute
    transaction = psycopg.Connection.transaction

    def begun(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["TRANSACTION"] += 1
        return transaction(self, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "transaction", begun)

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        words = str(query).split()
        if words:  # the pool's check of an idle connection sends "": not the save's
            counts[words[0].upper()] += 1
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    call = LoopLane.call

    async def counted_call(self: Any, name: bytes, sql: bytes, *args: Any) -> Any:
        counts[sql.split()[0].decode().upper()] += 1  # a save sent from the event loop
        return await call(self, name, sql, *args)

    monkeypatch.setattr(LoopLane, "call", counted_call)
    yield counts


def said(*texts: str) -> list[UserMessage]:
    return [UserMessage(content=text) for text in texts]


async def test_a_save_of_a_new_session_is_one_call(pg_url, statements):
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("warm", 0, said("a"))  # the loop's connection opened (SET search_path)
        statements.clear()
        await store.save("s", 0, said("a", "b"), {"k": 1})
        # the save function: the lock (it finds none), the row and messages, in autocommit
        assert statements == {"SELECT": 1}, statements
        record = await store.load("s")
        assert record is not None
        assert [m.content for m in record.messages] == ["a", "b"]
        assert record.meta == {"k": 1}
    finally:
        await store.aclose()


async def test_a_save_of_a_stored_session_is_one_call(pg_url, statements):
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, said("a", "b", "c", "d"))
        statements.clear()
        # replace the tail with fewer messages: the one past them goes
        version = await store.save("s", 1, said("B", "C"), {"k": 2}, expected_version=version)
        # the save function: the lock, the delete, the insert and the row's update
        assert statements == {"SELECT": 1}, statements
        record = await store.load("s")
        assert record is not None
        assert [m.content for m in record.messages] == ["a", "B", "C"]
        assert record.meta == {"k": 2}
        assert record.version == version
        # replace the tail with more messages, over ones still stored; then append
        version = await store.save("s", 2, said("x", "y", "z"), expected_version=version)
        version = await store.save("s", 5, said("w"), expected_version=version)
        record = await store.load("s")
        assert record is not None
        assert [m.content for m in record.messages] == ["a", "B", "x", "y", "z", "w"]
        # everything from 0: the whole session replaced
        await store.save("s", 0, said("only"), expected_version=version)
        record = await store.load("s")
        assert record is not None
        assert [m.content for m in record.messages] == ["only"]
    finally:
        await store.aclose()


async def test_a_save_with_kept_rows_is_one_call_and_in_a_transaction_the_same(pg_url, statements):
    """A step's save whose turn's results are kept (:class:`~runtime.store.Store`'s kept
    rows): the save function writes the row before them over and the tail after them,
    one call as any save; the transaction (a guard's save) leaves the same session."""
    store = await PostgresStore.open(pg_url)
    try:
        for session_id, guard in (("call", None), ("transaction", lambda conn: None)):
            version = await store.save(session_id, 0, said("u", "a", "r1", "r2", "x", "y"))
            statements.clear()
            version = await store.save(
                session_id,
                1,
                said("A", "ignored", "ignored", "r3"),
                expected_version=version,
                kept=(1, 2),
                guard=guard,
            )
            if guard is None:
                assert statements == {"SELECT": 1}, statements
            record = await store.load(session_id)
            assert record is not None and record.version == version
            assert [m.content for m in record.messages] == ["u", "A", "r1", "r2", "r3"]
    finally:
        await store.aclose()


async def test_a_save_beyond_the_end_writes_nothing_and_says_how_long_it_is(pg_url):
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, said("a", "b"), {"k": 1})
        # the write statement's other parts (the delete, the insert) ran: rolled back
        with pytest.raises(StoreError, match=r"start 3 is beyond its end \(2 messages\)"):
            await store.save("s", 3, said("x", "y"), {"k": 2})
        record = await store.load("s")
        assert record is not None
        assert [m.content for m in record.messages] == ["a", "b"]
        assert record.meta == {"k": 1}
        assert record.version == version
    finally:
        await store.aclose()


async def test_a_session_created_meanwhile_is_a_conflict_and_keeps_its_messages(pg_url):
    """The other creator commits after this save found no session row: the save's insert
    finds the key taken, raises a conflict, and inserts none of its messages."""
    store = await PostgresStore.open(pg_url)
    other = await PostgresStore.open(pg_url)
    try:

        def create_meanwhile(conn: Any) -> LockedSession:
            with psycopg.connect(store.libpq, autocommit=True) as rival:
                rival.execute(f"SET search_path TO {store.schema}")
                rival.execute(
                    """INSERT INTO axon_sessions (session_id, meta, update_seq, version)
                    VALUES ('s', '{}', nextval('axon_update_seq'), nextval('axon_versions'))"""
                )
            return LockedSession(row=None)  # as if locked when there was no row

        with pytest.raises(StoreConflict):
            await store.save("s", 0, said("mine", "mine too"), guard=create_meanwhile)
        record = await other.load("s")
        assert record is not None
        assert record.messages == ()  # the rival's session, without this save's messages
    finally:
        await other.aclose()
        await store.aclose()


# -- claims ------------------------------------------------------------------------------


async def test_a_claims_look_for_expired_leases_turns_sorting_off_for_its_transaction(pg_url):
    """A claim walks the heads in line with sorting off (a table PostgreSQL has not
    analyzed yet would otherwise be planned as a check of every head and a sort): the
    look for expired leases, the claim's first statement, sets it for the transaction."""

    store = await PostgresStore.open(pg_url)
    try:
        with psycopg.connect(store.libpq, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {store.schema}")
            notices: list[str] = []
            conn.add_notice_handler(lambda notice: notices.append(notice.message_primary))
            for _ in range(7):  # past psycopg's prepare threshold: the prepared look too
                with conn.transaction():
                    assert _take_expired(conn, "w1", 30.0, 3) is None
                    setting = conn.execute("SELECT current_setting('enable_sort')").fetchone()
                    assert setting == ("off",)
                assert conn.execute("SELECT current_setting('enable_sort')").fetchone() == ("on",)
            assert notices == []
    finally:
        await store.aclose()


async def test_a_claim_with_no_expired_lease_is_one_statement_and_no_transaction(
    pg_url, statements
):
    """The claim's common case is one call of its server-side function, in autocommit: it
    was a transaction of four round trips (``BEGIN``, the look for expired leases, the
    head's start, ``COMMIT``)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        assert await queue.claim("w0") is None  # the loop's connection opened
        await queue.submit("s1", "one")
        statements.clear()
        assert await queue.claim("w1") is not None
        assert statements == {"SELECT": 1}, statements
        statements.clear()
        assert await queue.claim("w1") is None  # nothing claimable: one statement too
        assert statements == {"SELECT": 1}, statements
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_claim_behind_an_expired_lease_takes_it_over_in_a_transaction(pg_url, statements):
    """The function starts nothing while a lease has expired: the claim then takes that
    turn over in a transaction of its own, as before."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        await queue.submit("s1", "one")
        first = await queue.claim("w1")
        await queue.submit("s2", "two")
        await store.run(
            "expire",
            lambda conn: conn.execute(
                "UPDATE axon_turns SET lease_until = now() - interval '1 minute' "
                "WHERE session_id = 's1'"
            ),
        )
        statements.clear()
        taken = await queue.claim("w2")
        assert statements["TRANSACTION"] == 1, statements
    finally:
        await queue.aclose()
        await store.aclose()
    assert first is not None and taken is not None
    assert (taken.turn.turn_id, taken.takeover, taken.epoch) == (first.turn.turn_id, True, 2)


async def test_the_claims_function_walks_the_heads_with_sorting_off(pg_url):
    """The head's start is planned with sorting off (the function's own setting), as the
    look's ``SET LOCAL`` had it: a table not analyzed yet is still walked in line."""

    store = await PostgresStore.open(pg_url)
    try:
        config = await store.run(
            "config",
            lambda conn: conn.execute(
                "SELECT proconfig FROM pg_proc WHERE proname = %s "
                "AND pronamespace = current_schema()::regnamespace",
                (CLAIM_FUNCTION_NAME,),
            ).fetchone(),
            transaction=False,
        )
    finally:
        await store.aclose()
    assert config is not None and "enable_sort=off" in config[0]


async def test_a_claims_look_for_an_expired_lease_reads_no_running_turn_when_none_expired(
    pg_url,
):
    """A claim's look for an expired lease enters the leases' index at the call's time
    (issue 24 goal 3, ``pg2w``): the function before filtered every running turn of the
    fleet by ``clock_timestamp()``, so each worker's claims read every other worker's
    turns too. Counted by the leases' index entries the claim's transaction read
    (``pg_stat_get_xact_tuples_returned``), 20 turns running, none expired."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        for i in range(25):
            await queue.submit(f"s{i}", "hi")
        for _ in range(20):
            assert await queue.claim("other") is not None
        with psycopg.connect(store.libpq, autocommit=False) as conn:
            conn.execute(f"SET search_path TO {store.schema}")
            claimed = conn.execute(
                f"SELECT o_expired, o_turn_id FROM {CLAIM_FUNCTION_NAME}('w', 30, %s)",
                (TURNS_CHANNEL,),
            ).fetchall()
            [(read,)] = conn.execute(
                "SELECT pg_stat_get_xact_tuples_returned('axon_turns_leases'::regclass)"
            ).fetchall()
            conn.rollback()
    finally:
        await queue.aclose()
        await store.aclose()
    assert [expired for expired, _ in claimed] == [False], claimed  # a head started
    assert read == 0


async def test_a_store_without_the_claims_function_gains_it_on_open(pg_url):
    """A store created before the function (a rolling upgrade) gets it when a worker of
    this version opens it, and claims through it."""

    await _drop_function(pg_url, CLAIM_FUNCTION_NAME)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        await queue.submit("s1", "one")
        claim = await queue.claim("w1")
    finally:
        await queue.aclose()
        await store.aclose()
    assert claim is not None and claim.turn.session_id == "s1"


async def test_a_first_turns_claim_reads_no_session_it_knows_is_not_stored(pg_url, statements):
    """The start of a head says whether its session is stored: a first turn's claim asked
    for the session (``load``) reads nothing more, and hands an empty one."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        assert await queue.claim("w0") is None  # the loop's connection opened
        await queue.submit("new", "one")
        statements.clear()
        claim = await queue.claim("w1", load=lambda session_id: True)
        assert statements == {"SELECT": 1}, statements
    finally:
        await queue.aclose()
        await store.aclose()
    assert claim is not None and claim.stored is not None
    assert (claim.stored.session_id, claim.stored.messages, claim.stored.version) == ("new", (), 0)


async def test_a_stored_sessions_claim_still_reads_it(pg_url, statements):
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        version = await store.save("old", 0, said("before"), expected_version=0)
        await queue.submit("old", "two")
        statements.clear()
        claim = await queue.claim("w1", load=lambda session_id: True)
        assert statements == {"SELECT": 2}, statements
    finally:
        await queue.aclose()
        await store.aclose()
    assert claim is not None and claim.stored is not None
    assert [m.text for m in claim.stored.messages] == ["before"]
    assert claim.stored.version == version


# -- a save in one call (the save function) ----------------------------------------------


async def _expire(store: PostgresStore, turn_id: str) -> None:
    await store.run(
        "expire",
        lambda conn: conn.execute(
            "UPDATE axon_turns SET lease_until = now() - interval '1 second' WHERE turn_id = %s",
            (turn_id,),
        ),
        transaction=False,
    )


async def _row(store: PostgresStore, turn_id: str) -> tuple[Any, ...]:
    return await store.run(
        "row",
        lambda conn: conn.execute(
            "SELECT status, owner, epoch, saved, finish_reason FROM axon_turns WHERE turn_id = %s",
            (turn_id,),
        ).fetchone(),
        transaction=False,
    )


async def test_a_fenced_out_workers_save_through_the_function_is_refused_and_writes_nothing(
    pg_url, statements
):
    """A worker whose turn was taken over saves (its step, the turn's end, the first
    save's ``saved`` mark) in one call of the save function: refused with ``LeaseLost``,
    and nothing of it is written: not the session, not the row."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        await queue.submit("s", "one")
        await queue.submit("t", "two")
        first = await queue.claim("w1")
        kept = await queue.claim("w1")
        assert first is not None and kept is not None
        await store.save("warm", 0, said("a"))  # the loop's connection opened
        lost: list[str] = []
        finished: list[str] = []
        with queue.fenced(
            kept,
            on_lost=lambda: lost.append("t"),
            on_finished=lambda: finished.append("t"),
        ):
            # the worker's usual step: one call, in autocommit
            statements.clear()
            version = await store.save("t", 0, said("one"), expected_version=0)
            assert statements == {"SELECT": 1}, statements
        # w1 never saved "s" (the row is not marked saved) and its lease runs out
        await _expire(store, first.turn.turn_id)
        taken = await queue.claim("w2")
        assert taken is not None and taken.takeover and taken.turn.turn_id == first.turn.turn_id
        await _expire(store, kept.turn.turn_id)
        again = await queue.claim("w2")
        assert again is not None and again.turn.turn_id == kept.turn.turn_id
        with queue.fenced(
            first,
            on_lost=lambda: lost.append("s"),
            on_finished=lambda: finished.append("s"),
        ):
            statements.clear()
            with pytest.raises(LeaseLost, match="owner w2, epoch 2, running"):
                await store.save("s", 0, said("late"), {"k": 1}, expected_version=0, ends="stop")
            assert statements == {"SELECT": 1}, statements  # the function refused it
        with queue.fenced(
            kept,
            on_lost=lambda: lost.append("t"),
            on_finished=lambda: finished.append("t"),
        ):
            with pytest.raises(LeaseLost):
                await store.save("t", 1, said("late"), expected_version=version, ends="stop")
        assert lost == ["s", "t"] and finished == []
        assert await store.load("s") is None
        record = await store.load("t")
        assert record is not None
        assert ([m.text for m in record.messages], record.version) == (["one"], version)
        # the rows as the takeovers left them: not marked, not ended
        assert await _row(store, first.turn.turn_id) == ("running", "w2", 2, False, None)
        assert await _row(store, kept.turn.turn_id) == ("running", "w2", 2, True, None)
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_last_save_through_the_function_ends_the_turn_in_its_call(pg_url, statements):
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    finished: list[bool] = []
    try:
        turn = await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None
        with queue.fenced(claim, on_finished=lambda: finished.append(True)):
            version = await store.save("s", 0, said("one"), expected_version=0)
            assert await _row(store, turn.turn_id) == ("running", "w1", 1, True, None)
            statements.clear()
            await store.save("s", 1, said("answer"), expected_version=version, ends="stop")
            assert statements == {"SELECT": 1}, statements
            assert finished == [True]
        assert await _row(store, turn.turn_id) == ("done", "w1", 1, True, "stop")
        record = await store.load("s")
        assert record is not None and [m.text for m in record.messages] == ["one", "answer"]
    finally:
        await queue.aclose()
        await store.aclose()


DEADLINE = 4_000_000_000.0
"""The waiting call's deadline (2096): a decision made now is in time."""


def _waiting_step(turn_id: str, message_id: str, expires_at: float = DEADLINE) -> list[Any]:
    """The turn's user message and the step whose call waits for approval (until
    ``expires_at``)."""
    call = ToolCallPart(
        tool_call_id="c1",
        tool_name="delete",
        input={},
        step=0,
        awaiting=Awaiting(kind="approval", id="ap1", turn_id=turn_id, expires_at=expires_at),
    )
    return [UserMessage(content="one"), AssistantMessage(id=message_id, content=(call,))]


async def _suspended_row(store: PostgresStore, turn_id: str) -> tuple[Any, ...]:
    return await store.run(
        "row",
        lambda conn: conn.execute(
            "SELECT status, owner, lease_until, expires_at, saved, finish_reason "
            "FROM axon_turns WHERE turn_id = %s",
            (turn_id,),
        ).fetchone(),
        transaction=False,
    )


async def test_the_step_that_waits_suspends_the_turn_in_one_call(pg_url, statements):
    """The save of the step that makes the turn wait for a person suspends its row
    (``awaiting-input``, no owner, no lease, the call's deadline) in the save function's
    call, as a plain step's save is one: no transaction."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    suspended: list[bool] = []
    try:
        turn = await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None
        await store.save("warm", 0, said("a"))  # the loop's connection opened
        messages = _waiting_step(turn.turn_id, claim.turn.message_id)
        with queue.fenced(claim, on_suspended=lambda: suspended.append(True)):
            statements.clear()
            await store.save("s", 0, messages, {WAITING_META: 1}, expected_version=0)
            assert statements == {"SELECT": 1}, statements
            assert suspended == [True]
        assert await _suspended_row(store, turn.turn_id) == (
            "awaiting-input",
            None,
            None,
            DEADLINE,
            True,
            "awaiting-input",
        )
        record = await store.load("s")
        assert record is not None and record.messages == tuple(messages)
        assert record.meta == {WAITING_META: 1}
        decided = await queue.decide("s", "ap1", Decision(approved=True), {})
        assert decided.recorded.complete and decided.turn.resumes == 1
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_fenced_out_workers_suspension_through_the_function_writes_nothing(
    pg_url, statements
):
    """A worker whose turn was taken over saves the step that waits: the call is refused
    with ``LeaseLost``, the session is not written and the row stays the new owner's."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    lost: list[bool] = []
    suspended: list[bool] = []
    try:
        turn = await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None
        await store.save("warm", 0, said("a"))  # the loop's connection opened
        await _expire(store, turn.turn_id)
        taken = await queue.claim("w2")
        assert taken is not None and taken.takeover
        messages = _waiting_step(turn.turn_id, claim.turn.message_id)
        with queue.fenced(
            claim,
            on_lost=lambda: lost.append(True),
            on_suspended=lambda: suspended.append(True),
        ):
            statements.clear()
            with pytest.raises(LeaseLost, match="owner w2, epoch 2, running"):
                await store.save("s", 0, messages, {WAITING_META: 1}, expected_version=0)
            assert statements == {"SELECT": 1}, statements  # the function refused it
        assert (lost, suspended) == ([True], [])
        assert await store.load("s") is None
        assert await _row(store, turn.turn_id) == ("running", "w2", 2, False, None)
    finally:
        await queue.aclose()
        await store.aclose()


# -- a decided turn's continuation -------------------------------------------------------


async def _waiting_turn(store: PostgresStore, queue: TurnQueue, session_id: str) -> Any:
    """A turn of ``session_id`` claimed by ``w1`` and suspended by the save of its step
    that waits for approval (``ap1``); its claim."""
    turn = await queue.submit(session_id, "one")
    claim = await queue.claim("w1")
    assert claim is not None and claim.turn.turn_id == turn.turn_id
    with queue.fenced(claim, on_suspended=lambda: None):
        messages = _waiting_step(turn.turn_id, claim.turn.message_id)
        await store.save(session_id, 0, messages, {WAITING_META: 1}, expected_version=0)
    return claim


async def test_a_decided_turns_claim_is_one_call_that_reads_its_session(pg_url, statements):
    """The decision leaves its turn ``running`` with no owner and a lapsed lease
    (``resume_pending``): the claim's function takes the continuation itself and returns
    the session the decision saved with it, one call from the event loop where it was
    the call, then a takeover's transaction in a thread (``BEGIN``, the look, the
    ``UPDATE``, the session's read, ``COMMIT``)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        first = await _waiting_turn(store, queue, "s")
        await queue.decide("s", "ap1", Decision(approved=True), {})
        decided = await store.load("s")
        assert decided is not None
        statements.clear()
        claim = await queue.claim("w2")
        assert statements == {"SELECT": 1}, statements
        assert claim is not None and claim.resumed and not claim.takeover
        assert (claim.turn.turn_id, claim.owner, claim.epoch) == (first.turn.turn_id, "w2", 2)
        assert claim.turn.attempts == 1
        assert claim.stored == decided  # the decision's history and version, as loaded
        row = await store.run(
            "row",
            lambda conn: conn.execute(
                "SELECT status, owner, epoch, resume_pending, lease_until > now() "
                "FROM axon_turns WHERE turn_id = %s",
                (first.turn.turn_id,),
            ).fetchone(),
            transaction=False,
        )
        assert row == ("running", "w2", 2, False, True)
        assert await queue.claim("w3") is None  # claimed once: its lease runs now
        # The suspended claim is fenced out; the continuation's own save goes through.
        with queue.fenced(first), pytest.raises(LeaseLost):
            await store.save("s", 2, said("late"), expected_version=decided.version)
        with queue.fenced(claim):
            await store.save("s", 2, said("result"), expected_version=decided.version)
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_continuation_whose_worker_dies_is_taken_over_and_fenced(store_and_queue):
    """The worker that claimed a continuation through the function dies (its lease runs
    out): the next claim takes the turn over as any running turn (its transaction, an
    attempt counted, the epoch bumped), and the dead worker's late save is refused."""
    store, queue = store_and_queue
    await _waiting_turn(store, queue, "s")
    await queue.decide("s", "ap1", Decision(approved=True), {})
    resumed = await queue.claim("w2")
    assert resumed is not None and resumed.resumed and resumed.stored is not None
    await _expire(store, resumed.turn.turn_id)
    taken = await queue.claim("w3")
    assert taken is not None and taken.takeover and not taken.resumed
    assert (taken.turn.turn_id, taken.epoch, taken.turn.attempts) == (
        resumed.turn.turn_id,
        3,
        2,
    )
    with queue.fenced(resumed), pytest.raises(LeaseLost):
        await store.save("s", 2, said("late"), expected_version=resumed.stored.version)
    assert (await store.load("s")) == resumed.stored


async def test_a_decided_turn_behind_a_lapsed_lease_waits_for_its_takeover(pg_url, statements):
    """A worker's lease that ran out before the decision's is taken over first, in its
    transaction (its attempts counted, as before); the continuation is the next claim's,
    one call. A continuation whose row another transaction holds is skipped, not waited
    for, and no other turn of its session starts meanwhile."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        first = await _waiting_turn(store, queue, "s")
        await queue.submit("other", "two")
        running = await queue.claim("w1")
        assert running is not None and running.turn.session_id == "other"
        await _expire(store, running.turn.turn_id)
        await store.run(
            "older",
            lambda conn: conn.execute(
                "UPDATE axon_turns SET lease_until = now() - interval '1 minute' "
                "WHERE turn_id = %s",
                (running.turn.turn_id,),
            ),
            transaction=False,
        )
        await queue.decide("s", "ap1", Decision(approved=True), {})
        await queue.submit("s", "next")  # queued behind it (the default)
        statements.clear()
        taken = await queue.claim("w2")
        assert statements["TRANSACTION"] == 1, statements
        assert taken is not None and taken.takeover and taken.turn.session_id == "other"
        assert taken.turn.attempts == 2
        with psycopg.connect(store.libpq, autocommit=True) as holder:
            holder.execute(f"SET search_path TO {store.schema}")
            with holder.transaction():
                holder.execute(
                    "SELECT 1 FROM axon_turns WHERE turn_id = %s FOR UPDATE",
                    (first.turn.turn_id,),
                )
                assert await queue.claim("w3") is None  # skipped; "next" waits its turn
        statements.clear()
        resumed = await queue.claim("w3")
        assert statements == {"SELECT": 1}, statements
        assert resumed is not None and resumed.resumed
        assert (resumed.turn.turn_id, resumed.epoch) == (first.turn.turn_id, 2)
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_decision_is_the_sessions_read_and_one_call(pg_url, statements):
    """A decision reads the session's last turn (one statement from the event loop,
    ``test_pg_decision_reads.py``), then checks the waiting turn's row, saves on top of
    the version read and requeues the turn in one call of the decision's function from
    the event loop, where it was a thread's transaction of four round trips (``BEGIN``,
    the row's requeue with the session's lock, the write, ``COMMIT``)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        first = await _waiting_turn(store, queue, "s")
        before = await store.version("s")
        statements.clear()
        decided = await queue.decide("s", "ap1", Decision(approved=True), {})
        assert statements == {"SELECT": 2}, statements  # the last turn's read, the function
        assert decided.recorded.complete and decided.recorded.version > before
        assert (decided.turn.turn_id, decided.turn.status) == (first.turn.turn_id, "running")
        assert (decided.turn.owner, decided.turn.resumes, decided.turn.expires_at) == (
            None,
            1,
            None,
        )
        record = await store.load("s")
        assert record is not None and record.version == decided.recorded.version
        assert record.meta == {WAITING_META: 0}
        assert decided.recorded.messages is None  # it read the last turn, not the whole
        call = record.messages[1].content[0]
        assert call.awaiting is not None and (call.awaiting.decided, call.awaiting.approved) == (
            True,
            True,
        )
        with pytest.raises(AlreadyDecided):
            await queue.decide("s", "ap1", Decision(approved=False), {})
        with pytest.raises(UnknownApproval):
            await queue.decide("other", "ap1", Decision(approved=False), {})
        assert (await store.load("s")) == record  # neither wrote anything
        claim = await queue.claim("w2")
        assert claim is not None and claim.resumed and claim.stored == record
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_decision_that_leaves_calls_waiting_keeps_its_turn_waiting(pg_url, statements):
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        turn = await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None
        user, step = _waiting_step(turn.turn_id, claim.turn.message_id)
        second = ToolCallPart(
            tool_call_id="c2",
            tool_name="delete",
            input={},
            step=0,
            awaiting=Awaiting(kind="approval", id="ap2", turn_id=turn.turn_id),
        )
        step = AssistantMessage(id=step.id, content=(*step.content, second))
        with queue.fenced(claim, on_suspended=lambda: None):
            await store.save("s", 0, [user, step], {WAITING_META: 2}, expected_version=0)
        statements.clear()
        decided = await queue.decide("s", "ap1", Decision(approved=True), {})
        assert statements == {"SELECT": 2}, statements
        assert not decided.recorded.complete and decided.turn.status == "awaiting-input"
        assert await queue.claim("w2") is None  # still waiting: nothing to claim
        decided = await queue.decide("s", "ap2", Decision(approved=False), {})
        assert decided.recorded.complete and decided.turn.status == "running"
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_decision_beside_another_running_turn_of_its_session_writes_nothing(
    pg_url, statements
):
    """The session's one running turn (the unique index) fails the decision's call
    whole: the decision is refused, the session and the waiting row stay as they were."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        first = await _waiting_turn(store, queue, "s")
        later = await queue.submit("s", "two")
        await store.run(  # started without superseding the wait, as no claim does
            "start",
            lambda conn: conn.execute(
                "UPDATE axon_turns SET status = 'running', owner = 'x', epoch = 1, "
                "lease_until = now() + interval '1 minute' WHERE turn_id = %s",
                (later.turn_id,),
            ),
            transaction=False,
        )
        before = await store.load("s")
        with pytest.raises(AlreadyDecided, match="superseded"):
            await queue.decide("s", "ap1", Decision(approved=True), {})
        assert await store.load("s") == before
        assert (await queue.get_status(first.turn.turn_id)).status == "awaiting-input"
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_decision_on_a_meta_the_function_cannot_merge_goes_in_the_transaction(
    pg_url, statements
):
    """A stored meta holding an escaped NUL (which PostgreSQL's text cannot hold) is merged
    by the client: the function refuses before writing, and the decision saves in the
    transaction, as before."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        await store.save("s", 0, [], {"k": "a\x00b"})
        turn = await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None
        version = await store.version("s")
        with queue.fenced(claim, on_suspended=lambda: None):
            messages = _waiting_step(turn.turn_id, claim.turn.message_id)
            await store.save("s", 0, messages, {WAITING_META: 1}, expected_version=version)
        statements.clear()
        decided = await queue.decide("s", "ap1", Decision(approved=True), {})
        assert statements["TRANSACTION"] == 1, statements
        assert decided.recorded.complete and decided.turn.status == "running"
        record = await store.load("s")
        assert record is not None and record.meta == {"k": "a\x00b", WAITING_META: 0}
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_store_without_the_decisions_function_gains_it_on_open(pg_url):
    """A store created before the decision's function (a rolling upgrade) gets it when a
    process of this version opens it, and records decisions through it."""

    await _drop_function(pg_url, DECIDE_FUNCTION_NAME)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        await _waiting_turn(store, queue, "s")
        decided = await queue.decide("s", "ap1", Decision(approved=True), {})
    finally:
        await queue.aclose()
        await store.aclose()
    assert decided.recorded.complete and decided.turn.status == "running"


async def test_the_save_function_merges_meta_as_the_transaction_does(pg_url, statements):
    """The patch's keys over the stored ones (``dict.update``), in SQL; a meta holding an
    escaped NUL (which ``jsonb`` cannot hold) is merged by the client, in a transaction."""
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, said("a"), {"a": 1, "b": "x", "n": {"d": [1.5]}})
        statements.clear()
        version = await store.save("s", 1, said("b"), {"b": "y", "c": [1, None]})
        assert statements == {"SELECT": 1}, statements
        record = await store.load("s")
        assert record is not None
        assert record.meta == {"a": 1, "b": "y", "n": {"d": [1.5]}, "c": [1, None]}
        statements.clear()
        version = await store.save("s", 2, said("c"), {"z": "nul\u0000"})
        assert statements["TRANSACTION"] == 1, statements
        statements.clear()
        await store.save("s", 3, said("d"), {"b": "w"}, expected_version=version)
        assert statements["TRANSACTION"] == 1, statements  # the stored meta holds one
        record = await store.load("s")
        assert record is not None
        assert record.meta == {
            "a": 1,
            "b": "w",
            "n": {"d": [1.5]},
            "c": [1, None],
            "z": "nul\u0000",
        }
        assert [m.text for m in record.messages] == ["a", "b", "c", "d"]
    finally:
        await store.aclose()


async def test_a_store_without_the_save_function_gains_it_on_open(pg_url):

    assert _TURNS_CHANNEL == TURNS_CHANNEL
    store = await PostgresStore.open(pg_url)
    version = await store.save("s", 0, said("a"))
    await store.run(
        "drop", lambda conn: conn.execute(f"DROP FUNCTION {SAVE_FUNCTION_NAME}"), transaction=False
    )
    await store.aclose()
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("s", 1, said("b"), expected_version=version)
        record = await store.load("s")
    finally:
        await store.aclose()
    assert record is not None and [m.text for m in record.messages] == ["a", "b"]


# -- the saves sent from the event loop (LoopLane) ---------------------------------------


async def test_a_save_cancelled_in_flight_on_the_loop_is_stored_whole(pg_url):
    """A save's call is shielded, as a thread's is: cancelled while its answer is awaited,
    it is stored all the same, and its connection serves the next save."""
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, said("a"))
        answered: list[int] = []

        async def save() -> None:
            answered.append(await store.save("s", 1, said("b", "c")))

        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(save)
                await trio.testing.wait_all_tasks_blocked()  # its answer awaited
                scope.cancel()
        record = await store.load("s")
        assert record is not None and [m.text for m in record.messages] == ["a", "b", "c"]
        assert answered == [record.version] and record.version > version  # read, not dropped
        await store.save("s", 3, said("d"), expected_version=record.version)
        record = await store.load("s")
        assert record is not None and [m.text for m in record.messages] == ["a", "b", "c", "d"]
    finally:
        await store.aclose()


async def test_a_save_on_a_lost_loop_connection_is_retried_on_a_new_one(pg_url):
    """The server ends the connection a save is sent on (a restart, an admin): the save
    fails there, and is retried on a connection the lane opens anew."""
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, said("a"))
        pids = [conn.pgconn.backend_pid for conn in store._lane._free]
        assert pids
        await store.run(
            "terminate",
            lambda conn: conn.execute(
                "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,)
            ),
            transaction=False,
        )
        version = await store.save("s", 1, said("b"), expected_version=version)
        record = await store.load("s")
        assert record is not None and [m.text for m in record.messages] == ["a", "b"]
        assert record.version == version
        assert [conn.pgconn.backend_pid for conn in store._lane._free] != pids
    finally:
        await store.aclose()


async def test_the_save_functions_meta_merge_keeps_each_value_and_key_order(pg_url, statements):
    """The merge keeps every stored value as stored: a float stays a float (``jsonb``
    would print ``1e16`` as ``10000000000000000``, read back as an int) and the keys keep
    ``dict.update``'s order (``jsonb`` sorts them by length)."""
    store = await PostgresStore.open(pg_url)
    try:
        stored = {"long_key": 1e16, "k": 2.5e-7, "z": {"nested": 1e17}, "n": -0.0}
        await store.save("s", 0, said("a"), stored)
        statements.clear()
        await store.save("s", 1, said("b"), {"k": 1e18, "new": 3.0})
        assert statements == {"SELECT": 1}, statements
        record = await store.load("s")
        assert record is not None
        want = dict(stored)
        want.update({"k": 1e18, "new": 3.0})
        assert list(record.meta) == list(want)
        assert [(k, type(v), v) for k, v in record.meta.items()] == [
            (k, type(v), v) for k, v in want.items()
        ]
    finally:
        await store.aclose()


async def _append(
    outcomes: dict[str, Any], name: str, store: PostgresStore, session: str, version: int
) -> None:
    """Append two messages saying ``name`` at ``version``: the new version, or the conflict."""
    try:
        outcomes[name] = await store.save(session, 1, said(name, name), expected_version=version)
    except StoreConflict as err:
        outcomes[name] = err


async def test_two_stores_saving_one_version_through_the_function_one_wins(pg_url, statements):
    """Two processes' stores append to one session at the same version, each in one call
    of the save function, at once: exactly one save lands, the other is a conflict, and
    the session holds the winner's messages only, never a mix."""
    first = await PostgresStore.open(pg_url)
    second = await PostgresStore.open(pg_url)
    try:
        for round_ in range(8):
            session = f"race-{round_}"
            version = await first.save(session, 0, said("start"))
            outcomes: dict[str, Any] = {}

            statements.clear()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_append, outcomes, "a", first, session, version)
                nursery.start_soon(_append, outcomes, "b", second, session, version)
            # both went as one call each (a lane's first connection sends its SET too)
            assert statements["SELECT"] == 2 and not statements["TRANSACTION"], statements
            won = [name for name, got in outcomes.items() if isinstance(got, int)]
            assert len(won) == 1, outcomes
            lost = "b" if won == ["a"] else "a"
            assert isinstance(outcomes[lost], StoreConflict)
            record = await second.load(session)
            assert record is not None
            assert [m.text for m in record.messages] == ["start", won[0], won[0]]
    finally:
        await second.aclose()
        await first.aclose()


class _Listening:
    """A ``LISTEN axon_turns`` connection of the test's own: what the workers are told,
    in commit order, up to a marker the test sends after the writes it looks at."""

    def __init__(self, store: PostgresStore) -> None:
        self.store = store
        self.conn = psycopg.connect(store.libpq, autocommit=True)
        self.conn.execute("LISTEN axon_turns")

    def told(self) -> list[str]:
        """The payloads of this schema's notifications committed so far (a marker sent
        now arrives after all of them: notifications arrive in commit order)."""
        with psycopg.connect(self.store.libpq, autocommit=True) as other:
            other.execute("SELECT pg_notify('axon_turns', %s)", (f"{self.store.schema}:marker",))
        told = []
        for notify in self.conn.notifies(timeout=30):
            if notify.payload == f"{self.store.schema}:marker":
                return told
            if notify.payload.startswith(f"{self.store.schema}:"):
                told.append(notify.payload.split(":", 1)[1])
        raise AssertionError("the marker never arrived")

    def close(self) -> None:
        self.conn.close()


async def _ended_by_its_last_save(store: PostgresStore, queue: TurnQueue, session: str) -> str:
    """A turn of ``session`` claimed, saved and ended by its last save; its id."""
    claim = await queue.claim("w1")
    assert claim is not None and claim.turn.session_id == session
    with queue.fenced(claim, on_finished=lambda: None):
        version = await store.save(session, 0, said("one"), expected_version=None)
        await store.save(session, 1, said("answer"), expected_version=version, ends="stop")
    assert (await queue.get_status(claim.turn.turn_id)).status == "done"  # type: ignore[union-attr]
    return claim.turn.turn_id


async def test_a_turns_end_wakes_no_worker_when_nothing_of_its_session_is_queued(
    pg_url, store_and_queue
):
    """Every worker listens: a turn's end that frees nothing cost each a wake-up."""
    store, queue = store_and_queue
    await queue.submit("s", "one")
    listening = _Listening(store)
    try:
        await _ended_by_its_last_save(store, queue, "s")
        assert listening.told() == []
    finally:
        listening.close()


async def test_a_turns_end_wakes_the_workers_for_its_sessions_next_turn(store_and_queue):
    store, queue = store_and_queue
    await queue.submit("s", "one")
    await queue.submit("s", "two")
    listening = _Listening(store)
    try:
        ended = await _ended_by_its_last_save(store, queue, "s")
        assert listening.told() == [ended]
        nxt = await queue.claim("w2")
        assert nxt is not None and nxt.turn.input == "two"
    finally:
        listening.close()


async def _suspended_by_its_step(store: PostgresStore, queue: TurnQueue) -> Claim:
    """A claimed turn of session ``s`` suspended by the save of its step that waits for
    approval (one call of the save function); its claim."""
    claim = await queue.claim("w1")
    assert claim is not None and claim.turn.session_id == "s"
    with queue.fenced(claim, on_suspended=lambda: None):
        messages = _waiting_step(claim.turn.turn_id, claim.turn.message_id)
        await store.save("s", 0, messages, {WAITING_META: 1}, expected_version=0)
    assert (await queue.get_status(claim.turn.turn_id)).status == "awaiting-input"  # type: ignore[union-attr]
    return claim


async def test_a_suspension_wakes_no_worker_when_nothing_of_its_session_is_queued(
    pg_url, store_and_queue
):
    """A suspended turn frees its session and nothing else (its own worker claims again
    when its slot frees): every worker listens, and a wake-up for nothing cost each a
    signal, its LISTEN backend's read and a claim that found nothing (``axon_save_v3``
    woke them at every suspension)."""
    store, queue = store_and_queue
    await queue.submit("s", "one")
    await store.save("warm", 0, said("a"))  # the loop's connection opened
    listening = _Listening(store)
    try:
        await _suspended_by_its_step(store, queue)
        assert listening.told() == []
    finally:
        listening.close()


async def test_a_suspension_wakes_the_workers_for_its_sessions_next_turn(store_and_queue):
    """A message sent while the turn ran is queued behind it, and claimable once the turn
    waits (it supersedes the wait): the suspension wakes the workers for it, as a turn's
    end does."""
    store, queue = store_and_queue
    await queue.submit("s", "one")
    await queue.submit("s", "two")
    listening = _Listening(store)
    try:
        suspended = await _suspended_by_its_step(store, queue)
        assert listening.told() == [suspended.turn.turn_id]
        nxt = await queue.claim("w2")
        assert nxt is not None and nxt.turn.input == "two"
        row = await queue.get_status(suspended.turn.turn_id)
        assert row is not None and (row.status, row.finish_reason) == ("done", "superseded")
    finally:
        listening.close()


def submit_held_open(store: PostgresStore) -> psycopg.Connection:
    """A connection that inserted turn ``t2`` of session ``s`` as a submit does, its
    transaction held open: the head trigger holds the session's lock until its commit."""
    submitter = psycopg.connect(store.libpq)
    try:
        submitter.execute(f"SET search_path TO {store.schema}")
        submitter.execute(
            "INSERT INTO axon_turns (turn_id, session_id, input) VALUES ('t2', 's', '\"x\"')"
        )
    except BaseException:
        submitter.close()
        raise
    return submitter


async def test_a_submit_in_flight_when_the_turn_ends_is_seen_by_the_end(pg_url):
    """A submit of the session holds the session's lock from its insert to its commit:
    the ending save waits for it and wakes the workers for the turn it queued (without
    the lock, the end could miss it and the workers its own notification, which a claim
    woken before the end's commit found blocked by the running turn)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    await queue.submit("s", "one")
    claim = await queue.claim("w1")
    assert claim is not None
    listening = _Listening(store)
    submitter = submit_held_open(store)
    try:
        with queue.fenced(claim, on_finished=lambda: None):
            version = await store.save("s", 0, said("one"), expected_version=None)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(
                        store.save, "s", 1, said("answer"), expected_version=version, ends="stop"
                    )
                )
                await trio.testing.wait_all_tasks_blocked()  # the save waits for the lock
                assert (await queue.get_status(claim.turn.turn_id)).status == "running"  # type: ignore[union-attr]
                submitter.commit()
        assert listening.told() == [claim.turn.turn_id]
    finally:
        submitter.close()
        listening.close()
        await queue.aclose()
        await store.aclose()


# -- the next claim riding on a turn's last save (issue 24 goal 3, branch nextclaim) -----


@attrs.define
class _Next:
    """A worker's side of :class:`~runtime.turn_queue.NextClaim`, recorded."""

    want: bool = True
    held: list[tuple[str, str, int]] = attrs.field(factory=list)
    handed: list[NextClaimed] = attrs.field(factory=list)

    def hook(self) -> NextClaim:
        return NextClaim(
            wanted=lambda: self.want,
            on_claimed=lambda *key: self.held.append(key),
            claimed=self.handed.append,
            load=lambda session_id: True,
        )


async def _last_save_claiming(
    store: PostgresStore, queue: TurnQueue, claim: Any, nxt: _Next, statements: Any = None
) -> None:
    """``claim``'s turn saved and ended by its last save, ``nxt`` asked for the next."""
    session = claim.turn.session_id
    with queue.fenced(claim, on_finished=lambda: None, claim_next=nxt.hook()):
        version = await store.save(session, 0, said("one"), expected_version=None)
        if statements is not None:
            statements.clear()
        await store.save(session, 1, said("answer"), expected_version=version, ends="stop")


async def _one_claimed_one_queued(queue: TurnQueue) -> tuple[Claim, QueuedTurn]:
    """Session ``s``'s turn claimed by ``w1``, and session ``t``'s queued: the turn a last
    save of ``s`` may claim next."""
    first = await queue.submit("s", "one")
    second = await queue.submit("t", "two")
    claim = await queue.claim("w1")
    assert claim is not None and claim.turn.turn_id == first.turn_id
    return claim, second


async def test_a_last_save_claims_the_next_turn_in_the_same_call(pg_url, statements):
    """The turn's end and the claim for the slot it frees: one statement, where the
    worker sent the save and then a claim; the claimed turn's lease is held from the
    answer on and it reads as a claim would (its session, stored, read for it)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    nxt = _Next()
    try:
        await store.save("t", 0, said("earlier"))  # t is stored: its claim reads it
        claim, second = await _one_claimed_one_queued(queue)
        await _last_save_claiming(store, queue, claim, nxt, statements)
        assert statements == {"SELECT": 1}, statements
        assert await _row(store, claim.turn.turn_id) == ("done", "w1", 1, True, "stop")
        assert await _row(store, second.turn_id) == ("running", "w1", 1, False, None)
        assert nxt.held == [(second.turn_id, "w1", 1)]
        [handed] = nxt.handed
        taken = await handed.take()
        assert (taken.turn.turn_id, taken.turn.input, taken.owner, taken.epoch) == (
            second.turn_id,
            "two",
            "w1",
            1,
        )
        assert not taken.takeover and not taken.resumed
        assert taken.stored is not None and [m.text for m in taken.stored.messages] == ["earlier"]
        assert await queue.claim("w2") is None  # claimed once
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_fenced_out_last_save_claims_nothing_and_writes_nothing(store_and_queue):
    store, queue = store_and_queue
    nxt = _Next()
    claim, waiting = await _one_claimed_one_queued(queue)
    with queue.fenced(claim, on_finished=lambda: None, claim_next=nxt.hook()):
        version = await store.save("s", 0, said("one"), expected_version=None)
        await _expire(store, claim.turn.turn_id)
        taken = await TurnQueue(store, lease=30.0, max_attempts=3).claim("w2")
        assert taken is not None and taken.turn.turn_id == claim.turn.turn_id
        with pytest.raises(LeaseLost):
            await store.save("s", 1, said("answer"), expected_version=version, ends="stop")
    assert nxt.held == [] and nxt.handed == []
    assert await _row(store, waiting.turn_id) == ("queued", None, 0, False, None)
    assert await _row(store, claim.turn.turn_id) == ("running", "w2", 2, True, None)
    record = await store.load("s")
    assert record is not None and [m.text for m in record.messages] == ["one"]


async def test_a_last_save_claims_nothing_when_the_worker_wants_no_more(pg_url, statements):
    """A stopping worker's last save is the plain one: the next turn stays queued."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    nxt = _Next(want=False)
    try:
        claim, second = await _one_claimed_one_queued(queue)
        await _last_save_claiming(store, queue, claim, nxt, statements)
        assert statements == {"SELECT": 1}, statements
        assert await _row(store, claim.turn.turn_id) == ("done", "w1", 1, True, "stop")
        assert await _row(store, second.turn_id) == ("queued", None, 0, False, None)
        assert nxt.held == [] and nxt.handed == []
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_last_save_behind_an_expired_lease_leaves_it_to_the_claims_takeover(
    pg_url, store_and_queue
):
    """An expired lease goes first, as in a claim: the riding claim takes nothing (the
    worker's claim loop takes the turn over, in its transaction)."""
    store, queue = store_and_queue
    nxt = _Next()
    await queue.submit("s", "one")
    dead = await queue.submit("d", "dead")
    queued = await queue.submit("t", "two")
    claim = await queue.claim("w1")
    lapsed = await queue.claim("w0")
    assert claim is not None and lapsed is not None and lapsed.turn.turn_id == dead.turn_id
    await _expire(store, dead.turn_id)
    await _last_save_claiming(store, queue, claim, nxt)
    assert nxt.handed == []
    assert await _row(store, queued.turn_id) == ("queued", None, 0, False, None)
    taken = await queue.claim("w1")
    assert taken is not None and taken.takeover and taken.turn.turn_id == dead.turn_id


async def test_a_last_save_that_claims_its_sessions_next_turn_wakes_no_worker(
    pg_url, store_and_queue
):
    """The session's next turn, claimed in the end's call, needs nobody woken (the plain
    end wakes every worker for it); another session's claimed, this one's next is."""
    store, queue = store_and_queue
    nxt = _Next()
    await queue.submit("s", "one")
    second = await queue.submit("s", "two")
    listening = _Listening(store)
    try:
        claim = await queue.claim("w1")
        assert claim is not None
        await _last_save_claiming(store, queue, claim, nxt)
        assert [h.turn_id for h in nxt.handed] == [second.turn_id]
        assert listening.told() == []
    finally:
        listening.close()


async def test_a_last_save_that_claims_another_sessions_turn_wakes_for_its_own_next(
    pg_url, store_and_queue
):
    store, queue = store_and_queue
    nxt = _Next()
    await queue.submit("s", "one")
    other = await queue.submit("t", "other")
    await queue.submit("s", "two")  # behind t's in line
    listening = _Listening(store)
    try:
        claim = await queue.claim("w1")
        assert claim is not None
        await _last_save_claiming(store, queue, claim, nxt)
        assert [h.turn_id for h in nxt.handed] == [other.turn_id]
        assert listening.told() == [claim.turn.turn_id]
    finally:
        listening.close()


async def test_a_last_save_cancelled_in_flight_still_hands_over_what_it_claimed(
    pg_url, store_and_queue
):
    """The call is shielded: cancelled while its answer is awaited, it commits, and the
    turn it claimed is handed to the worker all the same (not left claimed and unknown
    until its lease expires)."""
    store, queue = store_and_queue
    nxt = _Next()
    claim, second = await _one_claimed_one_queued(queue)
    with queue.fenced(claim, on_finished=lambda: None, claim_next=nxt.hook()):
        version = await store.save("s", 0, said("one"), expected_version=None)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    partial(store.save, "s", 1, said("answer"), expected_version=version, ends="x")
                )
                await trio.testing.wait_all_tasks_blocked()  # its answer awaited
                scope.cancel()
    assert [h.turn_id for h in nxt.handed] == [second.turn_id]
    assert nxt.held == [(second.turn_id, "w1", 1)]
    assert await _row(store, claim.turn.turn_id) == ("done", "w1", 1, True, "x")


async def test_a_store_without_the_next_claims_function_gains_it_on_open(pg_url):

    await _drop_function(pg_url, SAVE_NEXT_FUNCTION_NAME)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    nxt = _Next()
    try:
        claim, second = await _one_claimed_one_queued(queue)
        await _last_save_claiming(store, queue, claim, nxt)
        assert [h.turn_id for h in nxt.handed] == [second.turn_id]
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_last_save_claims_a_decided_turns_continuation_with_its_session(
    pg_url, store_and_queue
):
    """The riding claim is the claim's function: a decided turn's continuation comes
    first, claimed with the session the decision saved, as a claim hands it."""
    store, queue = store_and_queue
    nxt = _Next()
    waiting = await _waiting_turn(store, queue, "d")
    await queue.submit("s", "one")
    claim = await queue.claim("w1")
    assert claim is not None and claim.turn.session_id == "s"
    await queue.decide("d", "ap1", Decision(approved=True), {})
    decided = await store.load("d")
    await _last_save_claiming(store, queue, claim, nxt)
    [handed] = nxt.handed
    taken = await handed.take()
    assert taken.resumed and not taken.takeover
    assert (taken.turn.turn_id, taken.owner, taken.epoch) == (waiting.turn.turn_id, "w1", 2)
    assert taken.stored == decided
    assert nxt.held == [(waiting.turn.turn_id, "w1", 2)]


async def test_a_turn_claimed_by_a_last_save_and_never_started_is_taken_over_at_its_lease(
    pg_url, store_and_queue
):
    """A riding claim whose answer never reaches a worker (it died, or the answer was
    lost: the retried save finds its own commit, not what it claimed) is what a claim
    before a crash is: nothing renews its lease, and once the lease runs out any worker
    takes the turn over (the attempt counted), with nothing of it saved."""
    store, queue = store_and_queue
    nxt = _Next()
    claim, second = await _one_claimed_one_queued(queue)
    await _last_save_claiming(store, queue, claim, nxt)
    assert [h.turn_id for h in nxt.handed] == [second.turn_id]  # never taken
    assert await queue.claim("w2") is None  # its lease runs
    await _expire(store, second.turn_id)
    taken = await queue.claim("w2")
    assert taken is not None and taken.takeover and taken.turn.turn_id == second.turn_id
    assert (taken.owner, taken.epoch, taken.turn.attempts) == ("w2", 2, 2)
    assert not taken.turn.saved


async def _past_deadline_turn(store: PostgresStore, queue: TurnQueue, meta: dict) -> Any:
    """A turn of ``s`` suspended on a call whose deadline (1970) is past by the database's
    clock, no worker having expired it; its claim."""
    await store.save("s", 0, [], meta)
    turn = await queue.submit("s", "one")
    claim = await queue.claim("w1")
    assert claim is not None
    version = await store.version("s")
    with queue.fenced(claim, on_suspended=lambda: None):
        messages = _waiting_step(turn.turn_id, claim.turn.message_id, expires_at=900.0)
        await store.save("s", 0, messages, {WAITING_META: 1}, expected_version=version)
    return claim


@pytest.mark.parametrize("path", ["the-function", "the-transaction"])
async def test_a_decision_past_the_databases_deadline_is_refused_and_writes_nothing(
    pg_url, statements, path, monkeypatch
):
    """Checked by the database's clock where the decision is written (the function's
    statement, or the transaction after the row's lock): the session and the row stay as
    they were, the turn waiting for a worker's look to deny it ``timed out``."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        claim = await _past_deadline_turn(store, queue, {})
        if path == "the-transaction":  # as for a meta the function cannot merge

            async def merged_here(*args: Any, **kwargs: Any) -> tuple[str, None, None]:
                return "meta", None, None

            monkeypatch.setattr(store, "save_decision", merged_here)
        before = await store.version("s")
        with pytest.raises(WaitExpired, match="expired"):
            await queue.decide("s", "ap1", Decision(approved=True), {})
        status = await queue.get_status(claim.turn.turn_id)
        after = await store.version("s")
        expired = await queue.decide(
            "s", "ap1", Decision(approved=False, reason="timed out"), {}, expiry=True
        )
    finally:
        await queue.aclose()
        await store.aclose()
    assert after == before
    assert status is not None and status.waiting
    assert expired.recorded.complete and expired.turn.status == "running"


async def test_a_submit_that_may_take_a_held_stop_sends_no_statement_more(pg_url, statements):
    """A front end's submit names the message a stop held before its POST would name
    (``stop_name``): the stop is taken in the insert's own statement (a ``WITH`` in
    place of the ``INSERT``), so a keyed submit costs what it did, taken or not."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        await queue.submit("s0", "zero", idempotency_key="k0")  # the connection opened
        counts = []
        for n, name in enumerate([None, "u2", "u3"]):
            if name == "u3":
                await queue.hold_stop("s3", "u3", [], "stopped by user")
            statements.clear()
            turn = await queue.submit(
                f"s{n + 1}", "one", idempotency_key=f"k{n + 1}", stop_name=name
            )
            counts.append(sum(statements.values()))
        assert turn.cancel_reason == "stopped by user"
        assert counts[0] == counts[1] == counts[2], (counts, statements)
    finally:
        await queue.aclose()
        await store.aclose()


@pytest.mark.parametrize("keyed", [False, True])
async def test_a_capped_submit_is_one_call(pg_url, statements, keyed):
    """A front end's submit with both caps on (the defaults) is one call of the submit's
    function, in autocommit: the message's look, the session's lock, its look for a
    repeat and its count, the insert, the queue's lock, its count and the workers'
    wake-up all inside it, where the transaction before cost 7 (unkeyed) or 8 round
    trips (``BEGIN``, 4 or 5 statements, the insert, ``COMMIT``)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        await queue.submit("s0", "zero")  # the connection opened
        statements.clear()
        key = "k1" if keyed else None
        turn = await queue.submit("s1", "one", idempotency_key=key)
        counted = dict(statements)
        again = await queue.get(turn.turn_id)
    finally:
        await queue.aclose()
        await store.aclose()
    assert counted == {"SELECT": 1}, counted
    assert again is not None and (again.session_id, again.input, again.status) == (
        "s1",
        "one",
        "queued",
    )


@pytest.mark.parametrize("cap", ["session", "total"])
async def test_a_refused_submit_keeps_its_connection(pg_url, cap):
    """A refusal is an error the submit's function raises (its writes roll back); the
    connection it came on is idle and sound after it, and is kept: a client refused
    again and again (over a cap, in a loop) does not cost the server a new backend a
    time, as a closed connection would."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(
        store,
        max_queued_per_session=1 if cap == "session" else None,
        max_queued=1 if cap == "total" else None,
    )
    try:
        await queue.submit("s", "one")
        before = [c.pgconn.backend_pid for c in store._lane._free]
        for _ in range(3):
            with pytest.raises(QueueFull) as refused:
                await queue.submit("s", "two")
        after = [c.pgconn.backend_pid for c in store._lane._free]
    finally:
        await queue.aclose()
        await store.aclose()
    assert refused.value.scope == cap
    assert len(before) == 1 and after == before


async def test_a_submit_the_queue_s_cap_refuses_wakes_no_worker(pg_url):
    """The workers' wake-up is sent in the queue count's statement: a submit that count
    refuses rolls it back with its row, so the workers are told of the turns queued and
    of no other."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, max_queued=1)
    listening = _Listening(store)
    try:
        queued = await queue.submit("s1", "one")
        with pytest.raises(QueueFull):
            await queue.submit("s2", "two")
        told = await trio.to_thread.run_sync(listening.told)
    finally:
        listening.close()
        await queue.aclose()
        await store.aclose()
    assert told == [queued.turn_id]
