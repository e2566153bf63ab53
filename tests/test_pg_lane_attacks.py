"""The calls a PostgreSQL store sends from the event loop (:class:`~actors.stores.postgres.
LoopLane`: a step's save as one call of ``axon_save_v2``, a claim's common case) attacked
as a careless deployment would: a connection whose client encoding is not UTF-8, a
database that is not UTF-8, arguments past what the function's parameters hold. Each
holds what the store's transaction in a thread held before the lane took these calls.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.errors import StoreError
from runtime.messages import UserMessage
from tests.support.pg import own_database


def said(*texts: str) -> list[UserMessage]:
    return [UserMessage(content=text) for text in texts]


async def _turn_row(store: PostgresStore, turn_id: str) -> tuple[Any, ...]:
    return await store.run(
        "row",
        lambda conn: conn.execute(
            "SELECT status, owner, finish_reason FROM axon_turns WHERE turn_id = %s", (turn_id,)
        ).fetchone(),
        transaction=False,
    )


async def test_a_claim_and_its_saves_on_the_loop_hold_under_a_latin1_client_encoding(pg_url):
    """The lane writes its text parameters and reads its text columns as UTF-8, so its
    connections tell the server so, whatever client encoding the URL (or
    ``PGCLIENTENCODING``, or a LATIN1 database's default) gives: the turn's input
    ``héllo`` is claimed as itself (it was read as UTF-8 from LATIN1 bytes: a
    ``UnicodeDecodeError`` out of the claim), and the worker ``wörker`` is stored as
    itself (it was stored as ``wÃ¶rker``: every renewal, sent by psycopg in LATIN1, was
    refused, the turn lost)."""
    store = await PostgresStore.open(pg_url + "&client_encoding=latin1")
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    lost: list[bool] = []
    finished: list[bool] = []
    try:
        turn = await queue.submit("s", "héllo")
        claim = await queue.claim("wörker")
        assert claim is not None and claim.turn.input == "héllo"
        assert await _turn_row(store, turn.turn_id) == ("running", "wörker", None)
        assert (await queue.renew(claim)).held
        with queue.fenced(
            claim, on_lost=lambda: lost.append(True), on_finished=lambda: finished.append(True)
        ):
            await store.save("s", 0, said("héllo", "ça va"), {"clé": "été"}, ends="stop")
        assert (lost, finished) == ([], [True])
        assert await _turn_row(store, turn.turn_id) == ("done", "wörker", "stop")
        record = await store.load("s")
        assert record is not None
        assert [m.text for m in record.messages] == ["héllo", "ça va"]
        assert record.meta == {"clé": "été"}
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_latin1_databases_meta_is_merged_as_before_the_save_function():
    """The save function merges meta in SQL, as text of the database's encoding: in a
    LATIN1 database a stored ``中`` cannot be (``character ... has no equivalent in
    encoding "LATIN1"``: every later save with meta refused). Meta is bytes to the store
    (``bytea``), so outside UTF-8 the client merges it in the save's transaction, as it did
    before the function; a turn's last save still ends it in its commit."""
    with own_database("LATIN1") as url:
        store = await PostgresStore.open(url)
        queue = TurnQueue(store, lease=30.0, max_attempts=3)
        finished: list[bool] = []
        try:
            version = await store.save("s", 0, said("a"), {"名": "é中", "k": 1})
            await store.save("s", 1, said("b"), {"x": "中", "名": 2}, expected_version=version)
            record = await store.load("s")
            assert record is not None
            assert [m.text for m in record.messages] == ["a", "b"]
            assert list(record.meta.items()) == [("名", 2), ("k", 1), ("x", "中")]
            turn = await queue.submit("t", "héllo")
            claim = await queue.claim("wörker")
            assert claim is not None and claim.turn.input == "héllo"
            with queue.fenced(claim, on_finished=lambda: finished.append(True)):
                version = await store.save("t", 0, said("héllo"), {"步": 1})
                await store.save("t", 1, said("ok"), {"步": 2}, ends="stop")
            assert finished == [True]
            assert await _turn_row(store, turn.turn_id) == ("done", "wörker", "stop")
            record = await store.load("t")
            assert record is not None and record.meta == {"步": 2}
        finally:
            await queue.aclose()
            await store.aclose()


async def test_a_save_past_the_message_index_range_is_a_store_error_and_writes_nothing(pg_url):
    """A message's index is an ``INTEGER``: a save whose start (or last message) is past
    2**31 - 1 is refused as a store error, as the transaction refused it (``integer out
    of range``, or beyond the session's end), not a ``struct.error`` out of the lane's
    encoding of the index array; the session is untouched."""
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, said("a"))
        for start, count in ((2**31, 1), (2**31 - 1, 2), (2**40, 1), (2**31, 0)):
            with pytest.raises(StoreError):
                await store.save("s", start, said(*["z"] * count))
        record = await store.load("s")
        assert record is not None
        assert ([m.text for m in record.messages], record.version) == (["a"], version)
    finally:
        await store.aclose()


async def test_a_worker_name_postgresql_text_cannot_hold_is_refused_before_any_claim(pg_url):
    """The claim's call sends the worker's name as a C string: ``a\\x00b`` reached the
    row as ``a``, so workers ``a\\x00b`` and ``a\\x00c`` were one owner to every fence
    check. A name with a NUL (or a lone surrogate, which is no UTF-8) is refused as a
    store error, as psycopg's claim refused it, and claims nothing."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        turn = await queue.submit("s", "one")
        for owner in ("a\x00b", "\udcff"):
            with pytest.raises(StoreError, match="owner"):
                await queue.claim(owner)
        assert await _turn_row(store, turn.turn_id) == ("queued", None, None)
    finally:
        await queue.aclose()
        await store.aclose()
