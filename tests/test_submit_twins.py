"""The same message submitted twice at once is one submit.

A client's message sent again while its first submit is still in its call (a retry to
another front end after a lost connection, an AG-UI run posted again: AG-UI submits
under ``reject``) names the same turn: its key (the client's message id) or its turn id
(a ``runId``). The second call's look for the message finds nothing while the first's
insert is uncommitted; what it then did before its own insert (which conflicts with the
first's and returns it) met the first's row once committed: ``reject`` refused the
message as busy (409) while its own turn ran, and ``interrupt`` cancelled it (the
message never answered). Real PostgreSQL (the run's own); the first call is held in its
insert by a trigger of the test (:mod:`tests.test_submit_processes`'s).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.stores.postgres import PostgresStore
from actors.stores.postgres_calls import SUBMIT_FUNCTION_NAME
from actors.stores.turns import TurnQueue
from tests.support.pg import pg_connect
from tests.test_submit_processes import STALL, _stall, _until_waiting


@pytest.mark.parametrize("named_by", ["key", "turn id"])
@pytest.mark.parametrize("caps", [False, True])
async def test_the_same_message_submitted_twice_at_once_under_reject_is_one_turn(
    pg_url, named_by, caps
):
    """The second call waits for the session's lock the first holds in its insert; once
    the first committed, it returns the first's turn (it raised ``SessionBusy``: a 409
    "already running a turn" for the message's own turn)."""
    kw: dict[str, Any] = {"max_queued_per_session": 5, "max_queued": 50} if caps else {}
    named: dict[str, Any] = {"idempotency_key": "m1"} if named_by == "key" else {"turn_id": "run-1"}
    stores = [await PostgresStore.open(pg_url) for _ in range(2)]
    queues = [TurnQueue(store, **kw) for store in stores]
    schema = pg_url.rsplit("schema=", 1)[1]
    got: dict[int, Any] = {}

    async def submit(i: int) -> None:
        try:
            turn = await queues[i].submit("s", "hi", on_busy="reject", **named)
        except Exception as exc:  # (what the client would be told)
            got[i] = repr(exc)
        else:
            got[i] = (turn.turn_id, turn.status)

    try:
        with pg_connect() as holder, pg_connect() as look:
            holder.execute(f"SET search_path TO {schema}")
            _stall(holder)
            holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(submit, 0)
                    await _until_waiting(look, schema, 1)  # the first, in its insert
                    nursery.start_soon(submit, 1)
                    await _until_waiting(look, schema, 2)  # the second, on the session's lock
                    holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
            rows = look.execute(
                f"SELECT turn_id, status FROM {schema}.axon_turns ORDER BY seq"
            ).fetchall()
    finally:
        for queue, store in zip(queues, stores, strict=True):
            await queue.aclose()
            await store.aclose()
    assert len(rows) == 1 and rows[0][1] == "queued"
    assert got == {0: rows[0], 1: rows[0]}


async def _call(store: PostgresStore, params: tuple[Any, ...]) -> tuple[Any, ...]:
    sql = f"SELECT o_turn_id, o_status FROM {SUBMIT_FUNCTION_NAME}({', '.join(['%s'] * 19)})"
    return await store.run(
        "call", lambda conn: conn.execute(sql, params).fetchone(), transaction=False
    )


async def test_an_interrupt_whose_twin_committed_after_its_look_does_not_cancel_it(pg_url):
    """The first submit committed between the second's look for the message (which missed
    it) and its interrupt's statement (each statement its own snapshot): the state made
    here by calling the function as such a second call stands, its look given a key that
    finds nothing and the first's key for its row. The interrupt passes over the row of
    its own key and the call returns it, queued (v1 cancelled it, ``interrupted by a new
    message``, and returned it so)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        first = await queue.submit("s", "hi", idempotency_key="m1", on_busy="interrupt")
        assert first.idempotency_key is not None
        second = await _call(
            store,
            # (session, turn, message key, input hash, new key, input, meta, options,
            # regenerate, on_busy, stop name, turn name, held for, caps, large, channels,
            # interrupt reason)
            (
                *("s", "turn_other", "missed", "h", first.idempotency_key, '"hi"'),
                *(b"{}", b"{}", False, "interrupt", None, None, 30.0, None, None, False),
                *("axon_turns", "axon_cancel", "interrupted by a new message"),
            ),
        )
        rows = await store.run(
            "rows",
            lambda conn: conn.execute(
                "SELECT turn_id, status, cancel_reason FROM axon_turns"
            ).fetchall(),
            transaction=False,
        )
    finally:
        await queue.aclose()
        await store.aclose()
    assert second == (first.turn_id, "queued")
    assert rows == [(first.turn_id, "queued", None)]


async def test_a_run_posted_again_under_interrupt_does_not_cancel_its_own_turn(pg_url):
    """Unkeyed, named by its turn id (a ``runId`` sent again once the first was queued):
    there is no look for the message before the interrupt, which cancelled the first's
    row and returned it so."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        first = await queue.submit("s", "hi", turn_id="run-1", on_busy="interrupt")
        again = await queue.submit("s", "hi", turn_id="run-1", on_busy="interrupt")
        rows = await store.run(
            "rows",
            lambda conn: conn.execute(
                "SELECT turn_id, status, cancel_reason FROM axon_turns"
            ).fetchall(),
            transaction=False,
        )
    finally:
        await queue.aclose()
        await store.aclose()
    assert (first.turn_id, first.status) == ("run-1", "queued")
    assert (again.turn_id, again.status) == ("run-1", "queued")
    assert rows == [("run-1", "queued", None)]
