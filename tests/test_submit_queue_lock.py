"""The queue's total cap (``--max-queued``) and the lock it takes (round 4, ``atk4``).

A submit took the queue's advisory lock, the one every submit of the fleet takes while
the cap is on, before its insert, and held it to its commit: a submit of a large row (a
client's history of tens of MB) held every other session's submit behind the transfer
and writing of that row. Now the lock is taken right after the insert, for the count:
the tests hold a large submit inside its insert (a trigger of the test's waits there on
a lock the test holds) and show another session's submit commit meanwhile; and they
show the cap still exact when submits of two stores (two processes' pools) insert at
once, each held after its insert until both are there. Real PostgreSQL (the run's own).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

from actors.stores.postgres import PostgresStore
from actors.stores.postgres_lane import LoopLane
from actors.stores.turn_submit import LARGE_ROW
from actors.stores.turns import TurnQueue
from runtime.errors import QueueFull
from tests.support.pg import pg_connect

STALL = 4242
"""The advisory lock a test holds and its trigger waits for."""


def _stall_trigger(conn: Any, when: str, where: str) -> None:
    """A trigger of the test on ``axon_turns`` (``BEFORE`` or ``AFTER`` its insert) that
    waits, for the rows ``where`` picks, until the test lets go of :data:`STALL`."""
    conn.execute(
        f"""CREATE FUNCTION atk4_stall() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_lock_shared({STALL});
            PERFORM pg_advisory_unlock_shared({STALL});
            RETURN NEW;
        END $$"""
    )
    conn.execute(
        f"""CREATE TRIGGER atk4_stall {when} INSERT ON axon_turns FOR EACH ROW
        WHEN ({where}) EXECUTE FUNCTION atk4_stall()"""
    )


def _waiting(conn: Any, schema: str) -> tuple[int, int]:
    """Backends waiting for the stall, and for the queue's lock of ``schema``."""
    row = conn.execute(
        """WITH k AS (SELECT hashtextextended('axon_turns:' || %s, 0) AS key)
        SELECT
            count(*) FILTER (WHERE l.classid = 0 AND l.objid = %s),
            count(*) FILTER (WHERE l.classid = ((k.key >> 32) & 4294967295)::oid
                AND l.objid = (k.key & 4294967295)::oid)
        FROM pg_locks AS l, k
        WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1""",
        (schema, STALL),
    ).fetchone()
    return int(row[0]), int(row[1])


async def _until(conn: Any, schema: str, done: Any) -> tuple[int, int]:
    """Poll :func:`_waiting` until ``done(stalled, queue)`` says so; what it saw last."""
    while True:
        seen = _waiting(conn, schema)
        if done(*seen):
            return seen
        await trio.sleep(0.01)


async def test_a_large_submit_in_its_insert_holds_no_other_sessions_submit(pg_url):
    """While a submit of a 20 MB input is inside its insert, another session's submit
    commits: it used to wait for the queue's lock, which the large one held from before
    its insert to its commit (the order was large, then small; one waiter seen)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, max_queued=100)
    order: list[str] = []
    with pg_connect() as holder, pg_connect() as look:
        holder.autocommit = look.autocommit = True
        holder.execute(f"SET search_path TO {store.schema}")
        _stall_trigger(holder, "BEFORE", "NEW.session_id = 'big'")
        holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
        try:

            async def submit(session_id: str, text: str) -> None:
                await queue.submit(session_id, text)
                order.append(session_id)

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(submit, "big", "x" * 20_000_000)
                    await _until(look, store.schema, lambda stalled, _: stalled == 1)
                    nursery.start_soon(submit, "small", "hi")
                    # The small one commits, or is seen waiting for the queue's lock.
                    seen = await _until(look, store.schema, lambda _, q: q > 0 or order)
                    holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
        finally:
            await queue.aclose()
            await store.aclose()
    assert seen == (1, 0)  # the large one in its insert, nobody behind the queue's lock
    assert order == ["small", "big"]


@pytest.mark.parametrize("cap, submits", [(1, 2), (5, 8)])
async def test_the_total_cap_holds_when_two_stores_submit_at_once(pg_url, cap, submits):
    """Submits of two stores (two pools, as two front-end processes), every one held
    after its insert, its row written and not committed, until all are there (or, the
    code before, waiting for the queue's lock): once let go, exactly ``cap`` are queued
    and the others refused with ``QueueFull``, never more than the cap."""
    stores = [await PostgresStore.open(pg_url) for _ in range(2)]
    queues = [TurnQueue(store, max_queued=cap) for store in stores]
    schema = stores[0].schema
    queued: list[str] = []
    refused: list[str] = []
    with pg_connect() as holder, pg_connect() as look:
        holder.autocommit = look.autocommit = True
        holder.execute(f"SET search_path TO {schema}")
        _stall_trigger(holder, "AFTER", "true")
        holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
        try:

            async def submit(i: int) -> None:
                try:
                    await queues[i % 2].submit(f"s{i}", "hi")
                except QueueFull:
                    refused.append(f"s{i}")
                else:
                    queued.append(f"s{i}")

            with trio.fail_after(120):
                async with trio.open_nursery() as nursery:
                    for i in range(submits):
                        nursery.start_soon(submit, i)
                    await _until(look, schema, lambda s, q: s + q == submits)
                    holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
            with psycopg.connect(stores[0].libpq) as conn:
                (count,) = conn.execute(
                    f"SELECT count(*) FROM {schema}.axon_turns WHERE status = 'queued'"
                ).fetchone()
        finally:
            for queue in queues:
                await queue.aclose()
            for store in stores:
                await store.aclose()
    assert len(queued) == cap and len(refused) == submits - cap
    assert count == cap


async def test_a_large_submit_over_the_cap_is_refused_before_its_insert(pg_url):
    """A queue at its cap refuses a large submit before its row is sent (no insert ran:
    a sequence the test's trigger draws from at every insert did not move); a small one
    is counted after its insert, which the refusal rolls back. Nothing is queued."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, max_queued=1)
    with pg_connect() as conn:
        conn.autocommit = True
        conn.execute(f"SET search_path TO {store.schema}")
        conn.execute("CREATE SEQUENCE atk4_inserts")
        conn.execute(
            """CREATE FUNCTION atk4_count() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM nextval('atk4_inserts'); RETURN NEW; END $$"""
        )
        conn.execute(
            "CREATE TRIGGER atk4_count BEFORE INSERT ON axon_turns "
            "FOR EACH ROW EXECUTE FUNCTION atk4_count()"
        )

        def inserts() -> int:
            return int(conn.execute("SELECT last_value FROM atk4_inserts").fetchone()[0])

        try:
            await queue.submit("s0", "first")
            after_first = inserts()
            with pytest.raises(QueueFull):
                await queue.submit("s1", "x" * (LARGE_ROW + 1))
            after_large = inserts()
            with pytest.raises(QueueFull):
                await queue.submit("s2", "small")
            after_small = inserts()
            (count,) = conn.execute("SELECT count(*) FROM axon_turns").fetchone()
        finally:
            await queue.aclose()
            await store.aclose()
    assert (after_first, after_large, after_small) == (1, 1, 2)
    assert count == 1


async def test_a_submit_at_the_cap_whose_commits_answer_is_lost_returns_its_turn(
    pg_url, monkeypatch
):
    """The queue's last free place taken by a submit whose answer was lost after its
    call committed: its retry finds its own row (the cap counted after the insert would
    count it twice) and returns its turn, never ``QueueFull``; one turn queued."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, max_queued=1)
    lost: list[int] = []
    armed: list[int] = []
    real = LoopLane.call

    async def answer_lost(self: Any, name: bytes, *args: Any) -> Any:
        result = await real(self, name, *args)  # (the submit's one call, committed)
        if armed and not lost and name == b"axon_submit_call":
            lost.append(1)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    try:
        monkeypatch.setattr(LoopLane, "call", answer_lost)
        armed.append(1)
        turn = await queue.submit("s", "x" * (LARGE_ROW + 1), turn_id="t1")
        with psycopg.connect(store.libpq) as conn:
            rows = conn.execute(f"SELECT turn_id, status FROM {store.schema}.axon_turns").fetchall()
    finally:
        await queue.aclose()
        await store.aclose()
    assert lost == [1]
    assert turn.turn_id == "t1" and rows == [("t1", "queued")]
