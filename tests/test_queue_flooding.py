"""Queue flooding (issue 18, item 5) against the real PostgreSQL the test run started: caps
on queued turns, a claim whose cost does not grow with one session's backlog, fairness
across sessions, and the head trigger that makes both possible (actors/stores/turn_submit.py,
turn_claims.py, actors/stores/postgres.py).

No test measures time: the claim's cost is the number of rows and index entries its
transaction reads (PostgreSQL's own per-transaction counters), which is what grows with
a backlog."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.lowlevel

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.errors import QueueFull
from tests.support.pg import pg_connect


@pytest.fixture
async def store(pg_url):
    s = await PostgresStore.open(pg_url)
    try:
        yield s
    finally:
        await s.aclose()


def sql(store: PostgresStore, query: str, params: tuple = ()) -> list[tuple]:
    """Run ``query`` in the store's schema on a connection of its own (autocommit)."""
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {store.schema}")
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def flood(store: PostgresStore, session_id: str, n: int) -> None:
    """Queue ``n`` turns for ``session_id`` in one statement (as 3,000 POSTs would)."""
    sql(
        store,
        """INSERT INTO axon_turns (turn_id, session_id, input)
        SELECT %s || '-' || i, %s, '"x"' FROM generate_series(1, %s) AS i""",
        (session_id, session_id, n),
    )


def queued(store: PostgresStore) -> int:
    return sql(store, "SELECT count(*) FROM axon_turns WHERE status = 'queued'")[0][0]


# -- caps --------------------------------------------------------------------------------


async def test_a_submit_over_the_sessions_cap_is_refused_and_stores_nothing(store):
    queue = TurnQueue(store, max_queued_per_session=2, retry_after=7)
    await queue.submit("s1", "one")
    await queue.submit("s1", "two")
    with pytest.raises(QueueFull, match="session 's1' already has 2 turns queued") as err:
        await queue.submit("s1", "three")
    assert (err.value.scope, err.value.limit, err.value.retry_after) == ("session", 2, 7.0)
    assert [t.input for t in await queue.turns("s1")] == ["one", "two"]


async def test_the_sessions_cap_leaves_other_sessions_room(store):
    queue = TurnQueue(store, max_queued_per_session=1)
    await queue.submit("s1", "one")
    assert (await queue.submit("s2", "one")).session_id == "s2"


async def test_a_submit_over_the_total_cap_is_refused(store):
    queue = TurnQueue(store, max_queued=2)
    await queue.submit("s1", "one")
    await queue.submit("s2", "one")
    with pytest.raises(QueueFull, match="queue already holds 2 queued turns") as err:
        await queue.submit("s3", "one")
    assert (err.value.scope, err.value.limit) == ("total", 2)
    assert await queue.turns("s3") == []


async def test_a_claimed_turn_no_longer_counts_against_the_cap(store):
    queue = TurnQueue(store, max_queued_per_session=1)
    await queue.submit("s1", "one")
    assert await queue.claim("w1") is not None
    assert (await queue.submit("s1", "two")).status == "queued"


async def test_a_retried_submit_at_the_cap_returns_its_turn(store):
    queue = TurnQueue(store, max_queued_per_session=1)
    first = await queue.submit("s1", "one", idempotency_key="k1")
    again = await queue.submit("s1", "one", idempotency_key="k1")
    assert again.turn_id == first.turn_id


async def test_caps_of_none_accept_any_number(store):
    queue = TurnQueue(store, max_queued_per_session=None, max_queued=None)
    flood(store, "s1", 150)
    assert (await queue.submit("s1", "one more")).status == "queued"


@pytest.mark.parametrize("cap", [0, -1, 1.5, True])
async def test_a_cap_that_is_not_a_positive_integer_is_refused(store, cap):
    with pytest.raises(ValueError, match="max_queued must be a positive integer"):
        TurnQueue(store, max_queued=cap)


async def test_racing_submits_to_one_session_never_exceed_its_cap(store):
    queue = TurnQueue(store, max_queued_per_session=3)
    refused = 0

    async def submit(n: int) -> None:
        nonlocal refused
        try:
            await queue.submit("s1", f"t{n}")
        except QueueFull:
            refused += 1

    async with trio.open_nursery() as nursery:
        for n in range(12):
            nursery.start_soon(submit, n)
    assert (queued(store), refused) == (3, 9)


async def test_racing_submits_to_many_sessions_never_exceed_the_total_cap(store):
    queue = TurnQueue(store, max_queued=4)
    refused = 0

    async def submit(n: int) -> None:
        nonlocal refused
        try:
            await queue.submit(f"s{n}", "hi")
        except QueueFull:
            refused += 1

    async with trio.open_nursery() as nursery:
        for n in range(12):
            nursery.start_soon(submit, n)
    assert (queued(store), refused) == (4, 8)


# -- fairness ----------------------------------------------------------------------------


async def test_another_sessions_single_turn_is_claimed_before_a_flooders_backlog(store):
    queue = TurnQueue(store, max_queued_per_session=None)
    for n in range(30):
        await queue.submit("flooder", f"t{n}")
    single = await queue.submit("victim", "my one question")
    claimed = []
    for _ in range(3):  # one worker, each turn run to its end before the next claim
        claim = await queue.claim("w1")
        claimed.append(claim.turn.session_id)
        await queue.finish(claim, status="done")
    assert "victim" in claimed[:2], claimed
    assert (await queue.get(single.turn_id)).status == "done"


async def test_a_sessions_turns_still_run_in_submission_order(store):
    queue = TurnQueue(store)
    submitted = [(await queue.submit(f"s{n % 2}", f"t{n}")).turn_id for n in range(6)]
    order = []
    while (claim := await queue.claim("w1")) is not None:
        order.append(claim.turn.turn_id)
        await queue.finish(claim, status="done")
    assert [t for t in order if t in submitted[0::2]] == submitted[0::2]
    assert [t for t in order if t in submitted[1::2]] == submitted[1::2]


async def test_cancelling_a_sessions_first_queued_turn_lets_its_next_run(store):
    queue = TurnQueue(store)
    first = await queue.submit("s1", "one")
    second = await queue.submit("s1", "two")
    await queue.submit("s1", "three")
    await queue.request_cancel(first.turn_id)
    claim = await queue.claim("w1")
    assert claim.turn.turn_id == second.turn_id


async def test_submits_racing_claims_and_cancels_leave_no_turn_stranded(store):
    queue = TurnQueue(store, max_queued_per_session=None)
    submitted: list[str] = []

    async def submitter(session: str) -> None:
        for n in range(15):
            submitted.append((await queue.submit(session, f"t{n}")).turn_id)
            if n % 5 == 4:
                await queue.request_cancel(submitted[-2])

    async def worker(name: str) -> None:
        for _ in range(60):
            claim = await queue.claim(name)
            if claim is not None:
                await queue.finish(claim, status="done")
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for s in ("a", "b"):
            nursery.start_soon(submitter, s)
        for w in ("w1", "w2", "w3"):
            nursery.start_soon(worker, w)
    while (claim := await queue.claim("w1")) is not None:  # what is left runs, in order
        await queue.finish(claim, status="done")
    assert queued(store) == 0
    heads = sql(store, "SELECT count(*) FROM axon_turns WHERE head")
    assert heads == [(0,)]


# -- the claim's cost --------------------------------------------------------------------


_READ = """SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)
                   + pg_stat_get_xact_tuples_fetched(c.oid))::int
    FROM pg_class AS c
    WHERE c.oid = 'axon_turns'::regclass
       OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'axon_turns'::regclass)"""
"""Rows and index entries of ``axon_turns`` this connection read and has not yet reported
(PostgreSQL keeps them per backend until it flushes them, so one transaction's reads are
the difference before and after it)."""


class _CountingStore:
    """The store's :meth:`~PostgresStore.run` on one connection of the test's, recording
    how many rows and index entries of ``axon_turns`` each transaction read."""

    def __init__(self, store: PostgresStore) -> None:
        self.schema, self.libpq, self.url = store.schema, store.libpq, store.url
        self.conn = pg_connect()
        self.conn.execute(f"SET search_path TO {store.schema}")
        self.read: list[int] = []

    async def run(self, action: str, fn: Any, *, transaction: bool = True) -> Any:
        def attempt() -> Any:
            with self.conn.transaction():
                (before,) = self.conn.execute(_READ).fetchone()
                result = fn(self.conn)
                (after,) = self.conn.execute(_READ).fetchone()
            self.read.append(after - before)
            return result

        return await trio.to_thread.run_sync(attempt)


async def test_a_claim_reads_the_same_rows_behind_a_backlog_of_thousands(store):
    async def cost_of_a_claim(victim: str) -> int:
        """Rows read by a claim of another session's turn, and by a claim finding none."""
        counting = _CountingStore(store)
        queue = TurnQueue(counting, max_queued_per_session=None)  # type: ignore[arg-type]
        try:
            await queue.submit(victim, "hi")
            assert (await queue.claim("w2")).turn.session_id == victim
            assert await queue.claim("w2") is None  # nothing claimable but the backlog
            return max(counting.read[1:])
        finally:
            counting.conn.close()

    sql(store, "INSERT INTO axon_turns (turn_id, session_id, input) VALUES ('f-0', 'flooder', '1')")
    sql(store, "UPDATE axon_turns SET status = 'running', owner = 'w1', lease_until = "
        "now() + interval '1 hour' WHERE turn_id = 'f-0'")  # fmt: skip
    small = await cost_of_a_claim("v1")
    flood(store, "flooder", 3000)  # queued behind the flooder's running turn
    sql(store, "ANALYZE axon_turns")
    large = await cost_of_a_claim("v2")
    assert large <= small + 10, (small, large)  # the old claim read 3,000 more


# -- the schema --------------------------------------------------------------------------


async def test_a_store_from_before_the_head_trigger_gains_it_with_heads_set(pg_url, store):
    sql(store, "DROP TRIGGER axon_turns_head_v1 ON axon_turns")
    sql(store, "DROP TRIGGER axon_turns_head_insert_v1 ON axon_turns")
    sql(store, "ALTER TABLE axon_turns DROP COLUMN head")
    for turn_id, session in (("a1", "a"), ("b1", "b"), ("a2", "a")):
        sql(
            store,
            "INSERT INTO axon_turns (turn_id, session_id, input) VALUES (%s, %s, '\"x\"')",
            (turn_id, session),
        )
    reopened = await PostgresStore.open(pg_url)
    try:
        queue = TurnQueue(reopened)
        claims = [await queue.claim("w1"), await queue.claim("w2"), await queue.claim("w3")]
        assert [c.turn.turn_id if c else None for c in claims] == ["a1", "b1", None]
    finally:
        await reopened.aclose()


def head_calls(store: PostgresStore, *statements: str) -> int:
    """How many times ``statements`` (one transaction, rolled back) ran the head
    trigger's function (PostgreSQL's own count of this transaction's calls)."""
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {store.schema}")
        conn.execute("SET track_functions = 'all'")
        with conn.transaction(force_rollback=True):
            for statement in statements:
                conn.execute(statement)
            [(calls,)] = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions "
                "WHERE funcname = 'axon_turns_head_v1'"
            ).fetchall()
    return int(calls)


async def test_a_running_turns_end_does_not_run_the_head_trigger(store):
    queue = TurnQueue(store)
    await queue.submit("s1", "one")
    claim = await queue.claim("w1")
    assert claim is not None
    done = f"UPDATE axon_turns SET status = 'done' WHERE turn_id = '{claim.turn.turn_id}'"
    assert head_calls(store, done) == 0


async def test_a_queued_turns_start_and_a_submit_still_run_the_head_trigger(store):
    queue = TurnQueue(store)
    first = await queue.submit("s1", "one")
    await queue.submit("s1", "two")
    start = f"UPDATE axon_turns SET status = 'running' WHERE turn_id = '{first.turn_id}'"
    insert = "INSERT INTO axon_turns (turn_id, session_id, input) VALUES ('t3', 's2', 'x')"
    assert head_calls(store, start) == 1
    assert head_calls(store, insert) == 1
    # The start moved the session's head to its next turn, as before.
    queued = sql(store, "SELECT turn_id, head FROM axon_turns ORDER BY seq")
    assert queued == [(first.turn_id, True), (queued[1][0], False)]  # rolled back
    claims = [await queue.claim("w1"), await queue.claim("w2")]
    assert claims[0] is not None and claims[0].turn.turn_id == first.turn_id
    assert claims[1] is None  # the session's next turn waits for the first
    await queue.finish(claims[0], status="done")
    nxt = await queue.claim("w2")
    assert nxt is not None and nxt.turn.input == "two"


async def test_a_store_with_the_one_head_trigger_gets_the_two_on_open(pg_url, store):
    sql(store, "DROP TRIGGER axon_turns_head_insert_v1 ON axon_turns")
    sql(store, "DROP TRIGGER axon_turns_head_v1 ON axon_turns")
    sql(  # the trigger as stores created before the split have it
        store,
        "CREATE TRIGGER axon_turns_head_v1 BEFORE INSERT OR UPDATE OF status ON axon_turns "
        "FOR EACH ROW EXECUTE FUNCTION axon_turns_head_v1()",
    )
    queue = TurnQueue(store)
    await queue.submit("a", "one")
    await queue.submit("a", "two")
    reopened = await PostgresStore.open(pg_url)
    try:
        triggers = sql(
            store,
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'axon_turns'::regclass "
            "AND NOT tgisinternal ORDER BY tgname",
        )
        assert triggers == [("axon_turns_head_insert_v1",), ("axon_turns_head_v1",)]
        again = TurnQueue(reopened)
        await again.submit("b", "three")
        claims = [await again.claim("w1"), await again.claim("w2"), await again.claim("w3")]
        assert [c.turn.input if c else None for c in claims] == ["one", "three", None]
    finally:
        await reopened.aclose()
