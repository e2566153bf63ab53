"""A front end of before (``axon_submit_v3``) beside one of now (``axon_submit_v4``),
as during a rolling upgrade: two different edits of one message at once, and the same
steer sent twice at once, one call from each.

v4's guarantees (one of two racing edits queued, the other a 409; a steer's twin gives
back its steer) are checks a v4 call makes after its insert, on the rows committed
before it: they hold when the v4 call is the one that commits second, whatever the
first; when the v3 call commits second nothing checks it, and the pair behaves as two
v3 calls did (both edits queued, the later one's turn replacing the first's answer; the
running turn counts two steers). Nothing is lost and nothing fails either way: the
upgrade section of docs/deployment.md says so (upgrade every front end, then the
guarantees hold). Real PostgreSQL (the run's own); the first call is held in its insert
by :mod:`tests.test_submit_processes`'s trigger, no sleeps order them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from actors.stores import turn_submit
from actors.stores.postgres import PostgresStore
from actors.stores.postgres_calls import SUBMIT_FUNCTION_NAME, SUBMIT_V3_FUNCTION_NAME
from actors.stores.turns import TurnQueue
from tests.support.pg import pg_connect
from tests.test_submit_edit_race import _until_locked
from tests.test_submit_processes import STALL, _stall, _until_waiting


def _as_v3(store: PostgresStore) -> None:
    """``store``'s submits call ``axon_submit_v3`` (same parameters, same row), as a
    front end of before does: its lane's prepared submit named and sent for v3."""
    lane: Any = store._lane
    call = lane.call
    v4, v3 = (f"{name}(".encode() for name in (SUBMIT_FUNCTION_NAME, SUBMIT_V3_FUNCTION_NAME))

    async def v3_call(name: bytes, sql: bytes, *args: Any) -> Any:
        if name == turn_submit._SUBMIT_NAME:
            name, sql = b"axon_submit_v3_call", sql.replace(v4, v3, 1)
        return await call(name, sql, *args)

    lane.call = v3_call


async def _race(
    pg_url: str,
    first_v3: bool,
    status: str,
    first: Callable[[TurnQueue], Awaitable[None]],
    second: Callable[[TurnQueue], Awaitable[None]],
    held: int,
) -> list[tuple[Any, ...]]:
    """Session ``s``'s one turn set to ``status``, then ``first`` called (v3 when
    ``first_v3``) and held in its insert, ``second`` (the other version) called until
    ``held`` backends wait, then both let go: the session's rows after."""
    stores = [await PostgresStore.open(pg_url) for _ in range(2)]
    _as_v3(stores[0 if first_v3 else 1])
    queues = [TurnQueue(store) for store in stores]
    schema = pg_url.rsplit("schema=", 1)[1]
    try:
        await queues[0].submit("s", "hi", idempotency_key="m1")
        with pg_connect() as holder, pg_connect() as look:
            holder.execute(f"SET search_path TO {schema}")
            holder.execute("UPDATE axon_turns SET status = %s", (status,))
            _stall(holder)
            holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(first, queues[0])
                    await _until_waiting(look, schema, 1)  # the first, in its insert
                    nursery.start_soon(second, queues[1])
                    await _until_locked(look, held)  # the second, behind the first
                    holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
            return look.execute(
                f"SELECT input, status, steers FROM {schema}.axon_turns ORDER BY seq"
            ).fetchall()
    finally:
        for queue, store in zip(queues, stores, strict=True):
            await queue.aclose()
            await store.aclose()


def _editor(text: str, got: dict[str, str]) -> Callable[[TurnQueue], Awaitable[None]]:
    async def edit(queue: TurnQueue) -> None:
        try:
            got[text] = (await queue.submit("s", text, idempotency_key="m1")).turn_id
        except Exception as exc:  # (what the client would be told)
            got[text] = repr(exc)

    return edit


async def test_a_v4_edit_committing_after_a_racing_v3_edit_is_the_409(pg_url):
    got: dict[str, str] = {}
    rows = await _race(pg_url, True, "done", _editor("hello", got), _editor("howdy", got), 2)
    assert rows == [('"hi"', "done", 0), ('"hello"', "queued", 0)]
    assert "TurnConflict" in got["howdy"] and "still queued" in got["howdy"]


async def test_a_v3_edit_committing_after_a_racing_v4_edit_is_queued_too_as_before_v4(pg_url):
    """The documented limit of a mixed fleet: v3 has no check after its insert."""
    got: dict[str, str] = {}
    rows = await _race(pg_url, False, "done", _editor("hello", got), _editor("howdy", got), 2)
    assert rows == [('"hi"', "done", 0), ('"hello"', "queued", 0), ('"howdy"', "queued", 0)]
    assert "TurnConflict" not in got["howdy"]


async def _steer(queue: TurnQueue) -> None:
    await queue.submit("s", "also", idempotency_key="m2", on_busy="steer")


async def test_a_v4_steer_committing_after_its_v3_twin_gives_its_steer_back(pg_url):
    rows = await _race(pg_url, True, "running", _steer, _steer, 2)
    assert rows == [('"hi"', "running", 1), ('"also"', "queued", 0)]


async def test_a_v3_steer_committing_after_its_v4_twin_counts_a_second_steer_as_before_v4(
    pg_url,
):
    """The documented limit of a mixed fleet: v3's twin keeps the steer it raised."""
    rows = await _race(pg_url, False, "running", _steer, _steer, 2)
    assert rows == [('"hi"', "running", 2), ('"also"', "queued", 0)]
