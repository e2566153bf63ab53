"""Segments a running turn's answer left behind (branch ``segleft``, journal
``benchmarks/journal/workers.md``).

A running turn's step saves store its answer as a head and segments
(:class:`~runtime.store.Store`'s grown rows); the turn's last save writes it whole and
drops them. Two ways they stayed: a whole save by a store that never wrote them (a
takeover's, a worker of an older version: PostgreSQL dropped segments only for the
sessions its own store had segmented), and a turn killed mid-answer whose head no save
wrote again (the session's next turn saves after it). Stale segments beside a whole row
are never read (a fold is of heads only): storage, not a wrong answer. Now a save that
writes no head folds every head its session still holds into a whole row and drops the
segments (PostgreSQL: in the save function's call, a turn's last save always; SQLite:
when its file holds segments), so a killed turn's answer is written whole by the
session's next turn."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.stores.sqlite import SQLiteStore
from runtime.errors import StoreConflict
from runtime.messages import AssistantMessage, ToolCallPart, UserMessage
from tests.test_append_only_attacks import _pg_stored, _stored

Stored = Callable[[], Awaitable[tuple[list[tuple[str, int]], int]]]
Opener = Callable[[], Awaitable[Any]]


def _answer(n: int, answer_id: str = "a") -> AssistantMessage:
    calls = tuple(
        ToolCallPart(tool_call_id=f"c{i}", tool_name="t", input={"i": i}, step=i) for i in range(n)
    )
    return AssistantMessage(content=calls, id=answer_id)


@pytest.fixture(params=["sqlite", "postgres"])
async def stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Opener, Stored, dict[str, Any]]]:
    """An opener of stores on one database (each a process's own), the reader of its
    heads and segments, and the keywords of a turn's last save (PostgreSQL's ``ends``)."""
    opened: list[Any] = []
    if request.param == "sqlite":
        path = tmp_path / "s.db"

        async def open_store() -> Any:
            opened.append(await SQLiteStore.open(path))
            return opened[-1]

        async def stored() -> tuple[list[tuple[str, int]], int]:
            return _stored(path)

        last: dict[str, Any] = {}
    else:
        from actors.stores import postgres

        url = request.getfixturevalue("pg_url")
        request.getfixturevalue("monkeypatch").setattr(postgres, "GROWN_FROM_BYTES", 0)

        async def open_store() -> Any:
            opened.append(await postgres.PostgresStore.open(url))
            return opened[-1]

        async def stored() -> tuple[list[tuple[str, int]], int]:
            return await _pg_stored(opened[0])

        last = {"ends": "end_turn"}
    try:
        yield open_store, stored, last
    finally:
        for store in opened:
            await store.aclose()


async def _killed_mid_answer(store: Any) -> int:
    """Session ``s``'s first turn as a writer killed mid-answer leaves it: its answer
    (3 parts) a head and segments; the version."""
    version = await store.save("s", 0, [UserMessage(content="go", id="u"), _answer(1)])
    version = await store.save("s", 1, [_answer(2)], expected_version=version, grown=(0,))
    return await store.save("s", 1, [_answer(3)], expected_version=version, grown=(0,))


async def test_stale_segments_beside_a_whole_row_are_never_folded_into_it(
    stores: tuple[Opener, Stored, dict[str, Any]],
) -> None:
    """A store that never wrote the session's segments writes the answer whole over its
    head (a takeover's step save): the segments it did not drop are not read with the
    whole row, nor with the head a third store grows on it."""
    open_store, _, _ = stores
    dead, taker, third = await open_store(), await open_store(), await open_store()
    version = await _killed_mid_answer(dead)
    version = await taker.save("s", 1, [_answer(4)], expected_version=version)
    record = await third.load("s")
    assert record is not None and record.messages[1] == _answer(4)
    await third.save("s", 1, [_answer(5)], expected_version=version, grown=(0,))
    record = await taker.load("s")
    assert record is not None and record.messages[1:] == (_answer(5),)


async def test_a_last_save_by_a_store_that_never_wrote_the_segments_drops_them(
    stores: tuple[Opener, Stored, dict[str, Any]],
) -> None:
    """A takeover's last save writes the answer whole over the dead worker's head: the
    dead worker's segments go with it (PostgreSQL dropped only the segments of sessions
    its own store had segmented: they stayed until the session's delete)."""
    open_store, stored, last = stores
    dead, taker = await open_store(), await open_store()
    version = await _killed_mid_answer(dead)
    await taker.save("s", 1, [_answer(4)], expected_version=version, **last)
    record = await taker.load("s")
    assert record is not None and record.messages[1] == _answer(4)
    assert await stored() == ([], 0)


async def test_a_killed_turns_head_is_written_whole_by_the_next_turns_last_save(
    stores: tuple[Opener, Stored, dict[str, Any]],
) -> None:
    """The session's next turn, saved after a killed turn's head by another process,
    folds that head into a whole row and drops its segments, in its save; the session
    reads the same."""
    open_store, stored, last = stores
    dead, next_turn = await open_store(), await open_store()
    version = await _killed_mid_answer(dead)
    later = [UserMessage(content="more", id="u2"), _answer(1, "b")]
    await next_turn.save("s", 2, later, expected_version=version, **last)
    record = await next_turn.load("s")
    assert record is not None
    assert record.messages[1:] == (_answer(3), *later)
    assert await stored() == ([], 0)


async def test_a_running_turns_head_written_whole_by_another_writer_fails_its_next_save(
    stores: tuple[Opener, Stored, dict[str, Any]],
) -> None:
    """Another writer (a second host on the session) saves while a turn's answer is a
    head: the head is written whole under it, and the running turn's next grown save
    meets the version it moved (a conflict, nothing written: the persister rebases and
    writes the answer whole), never a segment on top of a row that holds its parts."""
    open_store, stored, last = stores
    running, other = await open_store(), await open_store()
    version = await _killed_mid_answer(running)
    later = [UserMessage(content="more", id="u2"), _answer(1, "b")]
    moved = await other.save("s", 2, later, expected_version=version, **last)
    with pytest.raises(StoreConflict):
        await running.save("s", 1, [_answer(4)], expected_version=version, grown=(0,))
    await running.save("s", 4, [UserMessage(content="again", id="u3")], expected_version=moved)
    record = await running.load("s")
    assert record is not None and record.messages[1] == _answer(3)
    assert await stored() == ([], 0)


async def test_deleting_a_session_with_segments_leaves_none(
    stores: tuple[Opener, Stored, dict[str, Any]],
) -> None:
    open_store, stored, _ = stores
    store = await open_store()
    await _killed_mid_answer(store)
    assert (await stored())[1] > 0
    await store.delete("s")
    assert await store.load("s") is None
    assert await stored() == ([], 0)


async def test_a_head_a_worker_of_the_version_before_left_is_written_whole_by_this_ones(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mixed fleet: a process of the version before (its calls of ``axon_save_v7``,
    still created) grows an answer and dies; this version's save of the session's next
    turn writes that head whole. And the version before's saves go on through its own
    function on the session after (its grown save from a fresh head, its last save)."""
    from actors.stores import postgres
    from actors.stores.postgres_calls import (
        SAVE_FUNCTION_NAME,
        SAVE_NEXT_FUNCTION_NAME,
        SAVE_NEXT_V7_FUNCTION_NAME,
        SAVE_V7_FUNCTION_NAME,
    )

    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    current = await postgres.PostgresStore.open(pg_url)

    def as_before(m: pytest.MonkeyPatch) -> None:
        """Its calls, prepared under names of their own (each store's connections are
        its own; the names only keep this process's two apart)."""
        for name, was, now in (
            ("_SAVE_SQL", SAVE_FUNCTION_NAME, SAVE_V7_FUNCTION_NAME),
            ("_SAVE_SQL_ENDING", SAVE_FUNCTION_NAME, SAVE_V7_FUNCTION_NAME),
            ("_SAVE_NEXT_SQL", SAVE_NEXT_FUNCTION_NAME, SAVE_NEXT_V7_FUNCTION_NAME),
        ):
            m.setattr(postgres, name, getattr(postgres, name).replace(was.encode(), now.encode()))
        for name in ("_SAVE_NAME", "_SAVE_NAME_ENDING", "_SAVE_NEXT_NAME"):
            m.setattr(postgres, name, getattr(postgres, name) + b"_v7")

    try:
        with monkeypatch.context() as m:
            as_before(m)
            before = await postgres.PostgresStore.open(pg_url)
            try:
                version = await _killed_mid_answer(before)
            finally:
                await before.aclose()
        assert (await _pg_stored(current))[0] == [("s", 1)]
        later = [UserMessage(content="more", id="u2"), _answer(1, "b")]
        version = await current.save("s", 2, later, expected_version=version)
        assert await _pg_stored(current) == ([], 0)
        with monkeypatch.context() as m:
            as_before(m)
            before = await postgres.PostgresStore.open(pg_url)
            try:
                version = await before.save(
                    "s", 3, [_answer(2, "b")], expected_version=version, grown=(0,)
                )
                assert await _pg_stored(current) == ([("s", 3)], 1)
                await before.save("s", 3, [_answer(3, "b")], expected_version=version)
            finally:
                await before.aclose()
        assert await _pg_stored(current) == ([], 0)  # (v7's drop, of rows no heads)
        record = await current.load("s")
    finally:
        await current.aclose()
    assert record is not None and record.messages[1:] == (_answer(3), later[0], _answer(3, "b"))


async def test_a_damaged_head_is_left_for_its_reads_to_refuse_not_written_whole(
    tmp_path: Path,
) -> None:
    """A head one of whose segments is gone (damage) is not folded into a whole row of
    fewer parts by the next save: it stays as it is, and a load still refuses it."""
    import sqlite3

    from runtime.errors import StoreCorrupt

    path = tmp_path / "s.db"
    store = await SQLiteStore.open(path)
    try:
        version = await _killed_mid_answer(store)
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM message_segments WHERE first > 0")
        later = [UserMessage(content="more", id="u2"), _answer(1, "b")]
        await store.save("s", 2, later, expected_version=version)
        with pytest.raises(StoreCorrupt, match="message 1"):
            await store.load("s")
    finally:
        await store.aclose()
    assert _stored(path) == ([("s", 1)], 1)


async def test_a_save_in_a_transaction_writes_the_heads_left_whole_too(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save with a guard (a transaction, not the save function's call) of a session
    this store segmented folds the heads left and deletes the segments in its commit."""
    from actors.stores import postgres

    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    store = await postgres.PostgresStore.open(pg_url)
    try:
        version = await _killed_mid_answer(store)
        later = [UserMessage(content="more", id="u2"), _answer(1, "b")]
        await store.save("s", 2, later, expected_version=version, guard=lambda conn: None)
        stored = await _pg_stored(store)
        record = await store.load("s")
    finally:
        await store.aclose()
    assert stored == ([], 0)
    assert record is not None and record.messages[1:] == (_answer(3), *later)


class _CompactingAfterFirstRead:
    """A reader's connection on which another process's save folds the session's head
    right after the read's first statement (which saw the head), before the read's
    transaction that reads the rows again and the segments."""

    def __init__(self, conn: Any, path: Path) -> None:
        self._conn, self._path, self.folded = conn, path, False

    def execute(self, sql: str, *args: Any) -> Any:
        result = self._conn.execute(sql, *args)
        if not self.folded and "LEFT JOIN messages" in sql:
            self.folded = True
            result = list(result.fetchall())
            trio.from_thread.run(_next_turn_saved, self._path)
            return _Rows(result)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _Rows:
    def __init__(self, rows: list[Any]) -> None:
        self._rows = rows

    def fetchall(self) -> list[Any]:
        return self._rows


async def _next_turn_saved(path: Path) -> None:
    other = await SQLiteStore.open(path)
    try:
        record = await other.load("s")
        assert record is not None
        later = [UserMessage(content="more", id="u2"), _answer(1, "b")]
        await other.save("s", 2, later, expected_version=record.version)
    finally:
        await other.aclose()


async def test_a_read_that_saw_a_head_before_another_process_folded_it_reads_it_whole(
    tmp_path: Path,
) -> None:
    """SQLite: a load's first statement sees the head; another process's save folds it
    and deletes its segments before the load's transaction reads the rows again with
    the segments: the load reads the whole row (one snapshot), never a head without
    its segments."""
    path = tmp_path / "s.db"
    writer = await SQLiteStore.open(path)
    reader = await SQLiteStore.open(path)
    try:
        await _killed_mid_answer(writer)
        spy = _CompactingAfterFirstRead(reader._conn, path)
        reader._conn = spy  # type: ignore[assignment]
        record = await trio.to_thread.run_sync(reader._read, "s", None)
        reader._conn = spy._conn
    finally:
        await writer.aclose()
        await reader.aclose()
    assert spy.folded and _stored(path) == ([], 0)
    assert record is not None and record.messages[1] == _answer(3)
    assert len(record.messages) == 4
