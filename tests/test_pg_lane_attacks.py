"""The calls a PostgreSQL store sends from the event loop (:class:`~actors.stores.postgres.
LoopLane`: a step's save as one call of ``axon_save_v2``, a claim's common case) attacked
as a careless deployment would: a connection whose client encoding is not UTF-8, a
database that is not UTF-8, arguments past what the function's parameters hold. Each
holds what the store's transaction in a thread held before the lane took these calls.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
import trio
import trio.testing

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.errors import StoreError
from runtime.messages import UserMessage
from tests.support.pg import EXTERNAL_PG, own_database


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


# -- what holds (pinned: no other test does) ---------------------------------------------


async def test_stores_opening_one_fresh_schema_at_once_all_save_through_the_function(pg_url):
    """Processes starting together on a fresh schema each create or find the save and
    claim functions (the schema's advisory lock serializes their checks: two ``CREATE``
    of one function at once would fail one of them), and each then saves in one call."""
    stores: list[PostgresStore] = []
    calls = 0
    try:

        async def open_one() -> None:
            stores.append(await PostgresStore.open(pg_url))

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(open_one)
        assert len(stores) == 6
        for n, store in enumerate(stores):
            call = store._lane.call

            async def counted(*args: Any, call: Any = call) -> Any:
                nonlocal calls
                calls += 1
                return await call(*args)

            store._lane.call = counted  # type: ignore[method-assign]
            await store.save(f"s{n}", 0, said("a"))
        assert calls == 6
        for n in range(6):
            record = await stores[0].load(f"s{n}")
            assert record is not None and [m.text for m in record.messages] == ["a"]
    finally:
        for store in stores:
            await store.aclose()


async def test_a_save_of_megabytes_to_a_backend_that_stops_reading_leaves_the_loop_free(pg_url):
    """A step of megabytes (NULs, astral characters) is more than the socket's buffers:
    while the server reads none of it (its backend stopped), the lane waits on the loop
    for the socket, other tasks run, and once the backend reads again the step is stored
    byte for byte. (A blocking send would hold the whole loop until the server read.)"""
    if EXTERNAL_PG is not None:
        pytest.skip("stops a backend of the server: only on the run's own")
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, said("a"))
        pid = store._lane._free[0].pgconn.backend_pid
        big = "x\x00🙂é" * (2 * 2**20)  # ~26 MB of JSON
        ticks = 0
        saved: list[int] = []
        # Should the loop block after all, the backend reads again and the test fails
        # instead of hanging.
        watchdog = threading.Timer(30, os.kill, (pid, signal.SIGCONT))

        async def save() -> None:
            saved.append(await store.save("s", 1, said(big, "\x00"), expected_version=version))

        os.kill(pid, signal.SIGSTOP)
        watchdog.start()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(save)
                while ticks < 50:
                    await trio.sleep(0.01)
                    ticks += 1
                assert saved == [] and watchdog.is_alive()  # the loop ran, the save waits
                os.kill(pid, signal.SIGCONT)
        finally:
            watchdog.cancel()
            os.kill(pid, signal.SIGCONT)
        record = await store.load("s")
        assert record is not None and saved == [record.version]
        assert [m.text for m in record.messages] == ["a", big, "\x00"]
    finally:
        await store.aclose()


_ODD_KEYS = ("", " ", "a ", "\x01", "\n", '"', "\\", "/", "é", "中文", "🙂", "\u2028", "\x7f")
_ODD_KEYS += ("\ufeff", "k" * 300, "1", "null")


async def test_the_functions_meta_merge_keeps_odd_keys_and_extreme_numbers(pg_url):
    """The merge reads keys as text and writes them back escaped (``to_json``): empty,
    control, quote, backslash, line separator, astral and BOM keys, in stored and
    patch, nested or not, come back as ``dict.update`` makes them, and numbers at the
    ends of a float's and an int64's range keep their type and value."""
    store = await PostgresStore.open(pg_url)
    try:
        numbers = [1e308, -1e308, 5e-324, -0.0, 2**63 - 1, -(2**63), 0.1]
        stored = {key: {key: numbers[n % len(numbers)]} for n, key in enumerate(_ODD_KEYS)}
        version = await store.save("s", 0, said("a"), stored)
        patch = {key: [n, numbers[n % len(numbers)]] for n, key in enumerate(_ODD_KEYS[::2])}
        patch["new \x02"] = None
        calls = 0
        call = store._lane.call

        async def counted(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            return await call(*args)

        store._lane.call = counted  # type: ignore[method-assign]
        await store.save("s", 1, said("b"), patch, expected_version=version)
        assert calls == 1  # merged by the function, not in a transaction
        want = dict(stored)
        want.update(patch)
        record = await store.load("s")
        assert record is not None
        assert list(record.meta) == list(want)
        assert repr(record.meta) == repr(want)  # -0.0, 5e-324, types
    finally:
        await store.aclose()


async def test_a_decision_in_a_latin1_database_merges_its_meta_in_the_transaction():
    """A decision's save merges the session's meta too (the count of calls still
    waiting): outside UTF-8 it goes in the transaction, as a step's save does, not
    through the decision's function, which would merge a stored ``中`` as LATIN1 text and
    be refused."""
    from runtime.approval import WAITING_META, Decision
    from runtime.messages import AssistantMessage, Awaiting, ToolCallPart

    with own_database("LATIN1") as url:
        store = await PostgresStore.open(url)
        queue = TurnQueue(store, lease=30.0, max_attempts=3)
        try:
            version = await store.save("s", 0, [], {"名": "中"})
            turn = await queue.submit("s", "one")
            claim = await queue.claim("w1")
            assert claim is not None
            call = ToolCallPart(
                tool_call_id="c1",
                tool_name="delete",
                input={},
                step=0,
                awaiting=Awaiting(kind="approval", id="ap1", turn_id=turn.turn_id),
            )
            step = AssistantMessage(id=claim.turn.message_id, content=(call,))
            with queue.fenced(claim, on_suspended=lambda: None):
                await store.save(
                    "s", 0, [UserMessage(content="one"), step], {WAITING_META: 1},
                    expected_version=version,
                )  # fmt: skip
            decided = await queue.decide("s", "ap1", Decision(approved=True), {})
            assert decided.recorded.complete and decided.turn.status == "running"
            record = await store.load("s")
            assert record is not None and record.meta == {"名": "中", WAITING_META: 0}
        finally:
            await queue.aclose()
            await store.aclose()
