"""A deleted session takes the sub-sessions its agent tools ran in with it, across
processes: two stores on one SQLite file or one PostgreSQL schema (two processes)
deleting one caller's tree at once, and, in PostgreSQL, the sub-sessions' own turns
that are not over ending ``cancelled`` with the caller's delete
(:mod:`actors.stores.owned`). The per-store behaviour is the conformance kit's
``StoreSubSessions`` (tests/test_stores.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from actors.stores.postgres import PostgresStore
from actors.stores.sqlite import SQLiteStore
from actors.stores.turns import TurnQueue
from runtime.errors import SESSION_DELETED
from runtime.messages import AssistantMessage, Message, ToolCallPart, UserMessage
from runtime.tools import PARENT_SESSION_META, sub_session_id


def _calls(n: int, *calls: tuple[str, str]) -> list[Message]:
    return [
        UserMessage(content=f"q{n}", id=f"u{n}"),
        AssistantMessage(
            content=tuple(
                ToolCallPart(tool_call_id=c, tool_name=t, input={}, step=0) for t, c in calls
            ),
            id=f"a{n}",
        ),
    ]


async def _tree(store: Any, width: int) -> list[str]:
    """A caller ``c`` whose ``width`` calls each ran a sub-session with one of its own."""
    calls = [("helper", f"k{i}") for i in range(width)]
    await store.save("c", 0, _calls(0, *calls))
    ids = ["c"]
    for name, call in calls:
        sub = sub_session_id("c", name, call)
        await store.save(sub, 0, _calls(1, ("deeper", "d")), {PARENT_SESSION_META: "c"})
        subsub = sub_session_id(sub, "deeper", "d")
        await store.save(subsub, 0, _calls(2), {PARENT_SESSION_META: sub})
        ids += [sub, subsub]
    return ids


async def _delete_at_once(one: Any, two: Any, ids: list[str]) -> None:
    """``one`` deletes the caller while ``two`` deletes it and its first sub-session
    (a tree inside the caller's, locked from below)."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(one.delete, "c")
        nursery.start_soon(two.delete, ids[1])
        nursery.start_soon(two.delete, "c")


async def test_two_sqlite_stores_deleting_one_callers_tree_at_once_delete_it_all(
    tmp_path: Path,
):
    one = await SQLiteStore.open(tmp_path / "s.db")
    two = await SQLiteStore.open(tmp_path / "s.db")
    try:
        ids = await _tree(one, 4)
        await _delete_at_once(one, two, ids)
        assert await one.list_sessions() == [] and await two.list_sessions() == []
    finally:
        await one.aclose()
        await two.aclose()


async def test_two_postgres_stores_deleting_one_callers_tree_at_once_delete_it_all(
    pg_url: str,
):
    # no "deadlock detected": each delete locks the tree's turns, then its sessions'
    # rows one at a time in id order
    one = await PostgresStore.open(pg_url)
    two = await PostgresStore.open(pg_url)
    try:
        ids = await _tree(one, 4)
        await _delete_at_once(one, two, ids)
        assert await one.list_sessions() == []
        for sid in ids:
            assert await two.deletions(sid) > 0, sid
    finally:
        await one.aclose()
        await two.aclose()


async def test_a_sub_sessions_queued_turn_is_cancelled_with_its_callers_delete(pg_url: str):
    store = await PostgresStore.open(pg_url)
    try:
        ids = await _tree(store, 1)
        queue = TurnQueue(store)
        queued = await queue.submit(ids[2], "a message to the sub-sub-session")
        other = await queue.submit("unrelated", "hello")
        await store.delete("c")
        turn = await queue.get(queued.turn_id)
        assert turn is not None and turn.status == "cancelled"
        assert turn.cancel_reason == SESSION_DELETED
        left = await queue.get(other.turn_id)
        assert left is not None and left.status == "queued"
    finally:
        await store.aclose()
