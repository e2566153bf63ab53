"""Two different edits of one message at once, and a steer sent twice.

Two edits of a message with other contents (a user's edit sent from two tabs, a retry
of an edit whose content changed) are two keys (an edit's key names the content and the
turn it replaces): each call's look found the old turn ended, so both were queued, and
the later one's turn replaced the first's answer. A steer submitted twice (its turn id
sent again, or the same message at once) raised the running turn's count of steers
twice for one steering row. Real PostgreSQL (the run's own); the first call is held in
its insert by a trigger of the test (:mod:`tests.test_submit_processes`'s), the second
waits for the session's lock the first holds: no sleeps order them.
"""

from __future__ import annotations

from typing import Any

import trio

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from tests.support.pg import pg_connect
from tests.test_submit_processes import STALL, _stall, _until_waiting


async def test_two_different_edits_of_one_message_at_once_queue_only_the_first(pg_url):
    """The first edit (held in its insert) is queued; the second, whose look found the
    old turn ended too, is refused as an edit of the first's turn still queued (a 409),
    as it is when sent after it. v3 queued both: two turns replacing one answer."""
    stores = [await PostgresStore.open(pg_url) for _ in range(2)]
    queues = [TurnQueue(store) for store in stores]
    schema = pg_url.rsplit("schema=", 1)[1]
    got: dict[str, Any] = {}

    async def edit(i: int, text: str) -> None:
        try:
            turn = await queues[i].submit("s", text, idempotency_key="m1")
        except Exception as exc:  # (what the client would be told)
            got[text] = repr(exc)
        else:
            got[text] = turn.turn_id

    try:
        old = await queues[0].submit("s", "hi", idempotency_key="m1")
        with pg_connect() as holder, pg_connect() as look:
            holder.execute(f"SET search_path TO {schema}")
            holder.execute("UPDATE axon_turns SET status = 'done'")
            _stall(holder)
            holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(edit, 0, "hello")
                    await _until_waiting(look, schema, 1)  # the first, in its insert
                    nursery.start_soon(edit, 1, "howdy")
                    await _until_waiting(look, schema, 2)  # the second, on the session's lock
                    holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
            rows = look.execute(
                f"SELECT turn_id, status, input FROM {schema}.axon_turns ORDER BY seq"
            ).fetchall()
    finally:
        for queue, store in zip(queues, stores, strict=True):
            await queue.aclose()
            await store.aclose()
    assert rows == [(old.turn_id, "done", '"hi"'), (got["hello"], "queued", '"hello"')]
    assert "TurnConflict" in got["howdy"] and "still queued" in got["howdy"]


async def test_a_steer_sent_again_by_its_turn_id_counts_one_steer(pg_url):
    """A run posted again under ``steer`` (its ``runId`` the turn id, no message key: no
    look before the steer) returns its turn; the running turn counts one steer, the one
    steering row (v3 counted two: a save read the steering rows for one that is not)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    schema = pg_url.rsplit("schema=", 1)[1]
    try:
        running = await queue.submit("s", "hi")
        with pg_connect() as conn:
            conn.execute(f"UPDATE {schema}.axon_turns SET status = 'running'")
        first = await queue.submit("s", "also", turn_id="run-2", on_busy="steer")
        again = await queue.submit("s", "also", turn_id="run-2", on_busy="steer")
        with pg_connect() as conn:
            rows = conn.execute(
                f"SELECT turn_id, steers, steer_of FROM {schema}.axon_turns ORDER BY seq"
            ).fetchall()
    finally:
        await queue.aclose()
        await store.aclose()
    assert first.turn_id == again.turn_id == "run-2"
    assert rows == [(running.turn_id, 1, None), ("run-2", 0, running.turn_id)]


async def _until_locked(conn: Any, n: int) -> None:
    """Until ``n`` backends wait on a lock of any kind (a row's, the stall's)."""
    while True:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone()
        if count >= n:
            return
        await trio.sleep(0.01)


async def test_the_same_steer_sent_twice_at_once_counts_one_steer(pg_url):
    """The second call's look misses the first's uncommitted row; its steer waits on the
    running turn's row the first's steer locked, then raises the count again; its insert
    meets the first's row and returns it. The twin gives its steer back."""
    stores = [await PostgresStore.open(pg_url) for _ in range(2)]
    queues = [TurnQueue(store) for store in stores]
    schema = pg_url.rsplit("schema=", 1)[1]
    got: dict[int, str] = {}

    async def steer(i: int) -> None:
        turn = await queues[i].submit("s", "also", idempotency_key="m2", on_busy="steer")
        got[i] = turn.turn_id

    try:
        running = await queues[0].submit("s", "hi")
        with pg_connect() as holder, pg_connect() as look:
            holder.execute(f"SET search_path TO {schema}")
            holder.execute("UPDATE axon_turns SET status = 'running'")
            _stall(holder)
            holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(steer, 0)
                    await _until_waiting(look, schema, 1)  # the first, in its insert
                    nursery.start_soon(steer, 1)
                    await _until_locked(look, 2)  # the second, on the running row
                    holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
            rows = look.execute(
                f"SELECT turn_id, steers, steer_of FROM {schema}.axon_turns ORDER BY seq"
            ).fetchall()
    finally:
        for queue, store in zip(queues, stores, strict=True):
            await queue.aclose()
            await store.aclose()
    assert got[0] == got[1]
    assert rows == [(running.turn_id, 1, None), (got[0], 0, running.turn_id)]
