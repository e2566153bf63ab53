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
from tests.support.pg import own_database


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


async def test_a_delete_in_a_database_of_a_linguistic_collation_finds_sub_sessions_by_index():
    # The sub-sessions are read by their ids' code points (``COLLATE "C"``: in a
    # linguistic order ``'.'`` may not sort before ``'/'``), which the primary key of a
    # database of another collation cannot serve: each delete read every session.
    import psycopg

    icu = "LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
    with own_database("UTF8", icu) as url:
        store = await PostgresStore.open(url)
        await store.aclose()
        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            conn.execute("SET search_path TO axon_t")
            conn.execute("SET enable_seqscan = off")  # (a table this small is read whole)
            plan = " ".join(
                row[0]
                for row in conn.execute(
                    """EXPLAIN SELECT session_id FROM axon_sessions
                    WHERE session_id COLLATE "C" >= 'c.' AND session_id COLLATE "C" < 'c/'"""
                )
            )
    assert "Index Cond" in plan and "'c.'" in plan.split("Index Cond")[1]  # (not a Filter)


async def test_a_postgres_delete_reads_no_message_of_its_tree(
    pg_url: str, monkeypatch: Any
) -> None:
    # The sub-sessions are found by the caller they record (axon_sessions.caller), not
    # by the calls in the tree's assistant messages, every one of which a delete read
    # and decoded (a session of thousands of steps paid it at its delete).
    import psycopg

    store = await PostgresStore.open(pg_url)
    try:
        ids = await _tree(store, 2)
        sent: list[str] = []
        execute = psycopg.Cursor.execute

        def recorded(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(" ".join(str(query).split()))
            return execute(self, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", recorded)
        await store.delete("c")
        monkeypatch.undo()
        reads = [q for q in sent if "axon_messages" in q and not q.startswith("DELETE")]
        assert reads == [], reads
        assert sum("WHERE caller = ANY" in q for q in sent) == len(ids)  # one a session
        assert await store.list_sessions() == []
    finally:
        await store.aclose()


async def test_a_postgres_delete_looks_sub_sessions_up_in_the_callers_index(pg_url: str):
    import psycopg

    store = await PostgresStore.open(pg_url)
    await store.aclose()
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        conn.execute(f"SET search_path TO {pg_url.split('schema=')[1]}")
        conn.execute("SET enable_seqscan = off")  # (a table this small is read whole)
        plan = " ".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN SELECT session_id, meta FROM axon_sessions "
                "WHERE caller = ANY(ARRAY['c', ''])"
            )
        )
    assert "axon_sessions_by_caller" in plan, plan


async def test_a_sub_session_whose_meta_names_another_caller_since_goes_with_that_one(
    pg_url: str,
):
    # the column follows the meta (the update's trigger): the delete of the caller
    # named first leaves it, the delete of the one named now takes it
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("c", 0, _calls(0))
        await store.save("d", 0, _calls(1))
        version = await store.save("s", 0, _calls(2), {PARENT_SESSION_META: "c"})
        await store.save("s", 2, _calls(3), {PARENT_SESSION_META: "d"}, expected_version=version)
        await store.delete("c")
        assert await store.load("s") is not None
        await store.delete("d")
        assert await store.load("s") is None
    finally:
        await store.aclose()


async def test_a_sub_session_whose_meta_a_latin1_database_cannot_read_is_deleted():
    # "中" has no LATIN1 form: the database cannot read that meta (its caller column
    # says so, ''), and the delete reads it in Python
    with own_database("LATIN1") as url:
        store = await PostgresStore.open(url)
        try:
            await store.save("c", 0, _calls(0))
            sub = sub_session_id("c" * 120, "helper", "k1")
            await store.save(sub, 0, _calls(1), {PARENT_SESSION_META: "c", "名": "中"})
            await store.save("other", 0, _calls(2), {PARENT_SESSION_META: "d", "名": "中"})
            await store.delete("c")
            assert await store.load(sub) is None
            assert await store.load("other") is not None
        finally:
            await store.aclose()


async def test_a_store_of_before_finds_the_sub_sessions_it_holds_and_its_older_writers(
    pg_url: str,
):
    # A store made before the caller column (dropped here) holds a hashed sub-session
    # its caller's stored call does not name: the opening fills the column from the
    # metas; a process of before, which writes no caller, inserts another after it: the
    # trigger records it.
    import psycopg

    schema = pg_url.split("schema=")[1]
    caller = "c" * 120
    before = sub_session_id(caller, "helper", "k1")
    after = sub_session_id(caller, "helper", "k2")
    store = await PostgresStore.open(pg_url)  # (its saves name no caller column)
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("DROP TRIGGER axon_sessions_caller_v1 ON axon_sessions")
        conn.execute("DROP TRIGGER axon_sessions_caller_update_v1 ON axon_sessions")
        conn.execute("DROP FUNCTION axon_sessions_caller_v1()")
        conn.execute("DROP FUNCTION axon_meta_caller_v1(bytea)")
        conn.execute("ALTER TABLE axon_sessions DROP COLUMN caller")  # (and its index)
    await store.save(caller, 0, _calls(0))
    await store.save(before, 0, _calls(1), {PARENT_SESSION_META: caller})
    await store.aclose()
    store = await PostgresStore.open(pg_url)
    try:
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            conn.execute(  # an older process's insert (its save's, as it was)
                """INSERT INTO axon_sessions (session_id, meta, update_seq, version)
                VALUES (%s, %s, nextval('axon_update_seq'), nextval('axon_versions'))""",
                (after, b'{"parent_session_id":"%s"}' % caller.encode()),
            )
        await store.delete(caller)
        assert await store.list_sessions() == []
    finally:
        await store.aclose()


async def test_a_sqlite_file_of_before_gains_the_callers_index_at_open(tmp_path: Path):
    import sqlite3

    from actors.stores.sqlite import _SUBS_OF_SQL

    path = tmp_path / "s.db"
    store = await SQLiteStore.open(path)
    await store.aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("DROP INDEX sessions_by_caller")  # (as a file of before)
    store = await SQLiteStore.open(path)
    await store.aclose()
    with sqlite3.connect(path) as conn:
        plan = conn.execute(f"EXPLAIN QUERY PLAN {_SUBS_OF_SQL}", ("c",)).fetchall()
    assert "USING INDEX sessions_by_caller" in str(plan), plan
