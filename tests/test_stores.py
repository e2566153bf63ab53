"""Session stores: the shipped conformance kit over every store, then SQLite-only files.

The conformance suite is :mod:`runtime.testing.stores` (a plug-in store runs it the same
way); here it runs against each built-in store through the ``store`` fixture, so a new
store gets the whole suite by adding one fixture parameter (PostgreSQL: a fresh schema
per test, skipped with its reason when the server is not reachable). The SQLite tests
poke at the file with a second, plain ``sqlite3`` connection: that is how another
process (or a curious user) sees it, and it lets the tests check exactly which rows a
save wrote.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import runtime
import runtime.registry
from actors.stores import (
    ENTRY_POINT_GROUP,
    MemoryStore,
    SQLiteStore,
    open_store,
    validate_session_id,
)
from actors.stores.sqlite import APPLICATION_ID, MAGIC, SCHEMA_VERSION
from runtime.errors import (
    ConfigurationError,
    InvalidSessionId,
    StoreConflict,
    StoreCorrupt,
    StoreError,
)
from runtime.messages import AssistantMessage, Message, ToolMessage, UserMessage
from runtime.testing.stores import (
    BAD_IDS,
    StoreConformance,
    StoreDeletionMarks,
    StoreGrownRows,
    StoreIncarnations,
    StoreKeptRows,
    StorePaging,
    StoreSubSessions,
    conversation,
    record,
    turn,
)

# -- the conformance kit, over every built-in store ------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        s: Any = MemoryStore()
    elif request.param == "sqlite":
        s = await SQLiteStore.open(tmp_path / "sessions.db")
    else:  # a fresh schema per test in the machine's PostgreSQL (skips when it is down)
        from actors.stores.postgres import PostgresStore

        s = await PostgresStore.open(request.getfixturevalue("pg_url"))
    try:
        yield s
    finally:
        await s.aclose()


class TestEveryStore(
    StoreConformance,
    StorePaging,
    StoreIncarnations,
    StoreDeletionMarks,
    StoreKeptRows,
    StoreSubSessions,
):
    """:mod:`runtime.testing.stores`, run over the ``store`` fixture's stores."""


class TestGrownRows(StoreGrownRows):
    """The grown rows' checks, over the stores that take them (SQLite, PostgreSQL: its
    heads from any size here, :data:`~actors.stores.postgres.GROWN_FROM_BYTES`)."""

    @pytest.fixture(params=["sqlite", "postgres"])
    async def store(self, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch):
        if request.param == "sqlite":
            s: Any = await SQLiteStore.open(tmp_path / "sessions.db")
        else:
            from actors.stores import postgres

            monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
            s = await postgres.PostgresStore.open(request.getfixturevalue("pg_url"))
        try:
            yield s
        finally:
            await s.aclose()


def test_store_conflict_is_a_public_store_error():
    assert runtime.StoreConflict is StoreConflict and issubclass(StoreConflict, StoreError)


async def test_open_store_names_a_store_without_versions(tmp_path: Path):
    class OldStore:  # a user's store written before the version rule
        async def load(self, session_id): ...
        async def save(self, session_id, start, messages, meta=None): ...
        async def list_sessions(self): ...
        async def delete(self, session_id): ...
        async def aclose(self): ...

    with pytest.raises(ConfigurationError, match="lacks version"):
        await open_store(OldStore())


# -- open_store and validate_session_id ---------------------------------------------------


async def test_open_store_specs(tmp_path: Path):
    memory = await open_store(None)
    assert isinstance(memory, MemoryStore)
    assert await open_store(memory) is memory
    for spec in (str(tmp_path / "a.db"), tmp_path / "b.db"):
        sqlite_store = await open_store(spec)
        try:
            assert isinstance(sqlite_store, SQLiteStore)
            await sqlite_store.save("s", 0, turn(0))
        finally:
            await sqlite_store.aclose()
    assert {"a.db", "b.db"} <= set(snapshot(tmp_path))
    with pytest.raises(ConfigurationError):
        await open_store(42)


class UrlStore(MemoryStore):
    """A plug-in store for tests: remembers the URL it was opened with."""

    url = ""

    @classmethod
    async def open(cls, url: str) -> UrlStore:
        store = cls()
        store.url = url
        return store


class NotAStore:
    @classmethod
    async def open(cls, url: str) -> object:
        return object()


def store_plugins(monkeypatch: pytest.MonkeyPatch, **targets: str) -> None:
    """Pretend installed packages declare these ``axon.stores`` entry points."""
    found = [EntryPoint(n, t, ENTRY_POINT_GROUP) for n, t in targets.items()]
    monkeypatch.setattr(runtime.registry, "entry_points", lambda group: found)


async def test_an_entry_point_adds_a_store_for_its_url_scheme(monkeypatch):
    store_plugins(monkeypatch, mem=f"{__name__}:UrlStore")
    store = await open_store("mem://bucket/axon")
    assert isinstance(store, UrlStore) and store.url == "mem://bucket/axon"


async def test_an_unregistered_url_scheme_is_refused_and_creates_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigurationError) as info:
        await open_store("redis://localhost/0")
    assert str(info.value) == (
        "unknown store 'redis'; registered stores: postgresql, postgres; a path without a "
        "scheme (axon.db, ./data/axon.db) is a SQLite file"
    )
    assert snapshot(tmp_path) == {}


async def test_a_registered_store_whose_open_returns_no_store_is_refused(monkeypatch):
    store_plugins(monkeypatch, odd=f"{__name__}:NotAStore")
    with pytest.raises(ConfigurationError, match=r"returned object, not a runtime\.Store"):
        await open_store("odd://x")


async def test_a_path_with_a_colon_but_no_scheme_is_still_an_sqlite_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = await open_store("notes:2024.db")
    try:
        assert isinstance(store, SQLiteStore)
    finally:
        await store.aclose()
    assert "notes:2024.db" in snapshot(tmp_path)


def test_validate_session_id():
    assert validate_session_id("abc:1.2-3_X") == "abc:1.2-3_X"
    assert validate_session_id("z" * 128) == "z" * 128
    for bad in [*BAD_IDS, "abc\n", 1, None]:
        with pytest.raises(InvalidSessionId, match="session id"):
            validate_session_id(bad)
    assert issubclass(InvalidSessionId, ValueError)


# -- SQLite: the file ------------------------------------------------------------------------


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file in ``directory`` with its bytes: "unchanged" includes no new side files."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


async def make_store_file(path: Path, sessions: int = 3, turns: int = 40) -> None:
    store = await SQLiteStore.open(path)
    try:
        for s in range(sessions):
            history: list[Message] = []
            for n in range(turns):
                await store.save(f"s{s}", len(history), turn(n), {"n": n})
                history += turn(n)
    finally:
        await store.aclose()


async def test_reopening_gives_the_same_sessions(tmp_path: Path):
    path = tmp_path / "sessions.db"
    first = await SQLiteStore.open(path)
    await first.save("a", 0, conversation(), {"agent": "w"})
    await first.save("b", 0, turn(0))
    await first.save("a", len(conversation()), turn(1))
    await first.aclose()
    second = await SQLiteStore.open(str(path))
    try:
        assert await second.load("a") == record("a", conversation() + turn(1), {"agent": "w"})
        assert [i.session_id for i in await second.list_sessions()] == ["a", "b"]
        await second.save("b", 2, turn(2))
        assert [i.session_id for i in await second.list_sessions()] == ["b", "a"]
    finally:
        await second.aclose()


async def test_two_store_objects_on_one_file_see_each_other(tmp_path: Path):
    path = tmp_path / "sessions.db"
    one = await SQLiteStore.open(path)
    two = await SQLiteStore.open(path)
    try:
        await one.save("a", 0, turn(0))
        assert await two.load("a") == record("a", turn(0))
        await two.save("a", 2, turn(1))
        assert await one.load("a") == record("a", turn(0) + turn(1))
    finally:
        await one.aclose()
        await two.aclose()


async def test_file_layout_wal_and_marker(tmp_path: Path):
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.save("a", 0, turn(0), {"k": 1})
        (synchronous,) = store._conn.execute("PRAGMA synchronous").fetchone()
        assert synchronous == 1  # NORMAL: durable at checkpoints, never corrupt
        other = sqlite3.connect(path)
        try:
            assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert other.execute("PRAGMA application_id").fetchone() == (APPLICATION_ID,)
            assert dict(other.execute("SELECT key, value FROM axon_meta")) == {
                "magic": MAGIC,
                "schema_version": str(SCHEMA_VERSION),
            }
            rows = other.execute(
                "SELECT session_id, idx, role FROM messages ORDER BY idx"
            ).fetchall()
            assert rows == [("a", 0, "user"), ("a", 1, "assistant")]
        finally:
            other.close()
    finally:
        await store.aclose()


async def test_creates_missing_file_and_adopts_empty_file(tmp_path: Path):
    empty = tmp_path / "empty.db"
    empty.touch()
    for path in (tmp_path / "new.db", empty):
        store = await SQLiteStore.open(path)
        await store.save("s", 0, turn(0))
        await store.aclose()
        assert path.stat().st_size > 0


async def test_missing_directory_is_a_store_error_not_corruption(tmp_path: Path):
    with pytest.raises(StoreError) as info:
        await SQLiteStore.open(tmp_path / "no" / "such" / "dir.db")
    assert not isinstance(info.value, StoreCorrupt)


async def test_memory_path(tmp_path: Path):
    store = await SQLiteStore.open(":memory:")
    try:
        await store.save("s", 0, conversation())
        assert await store.load("s") == record("s", conversation())
    finally:
        await store.aclose()


def _foreign_db(path: Path, *statements: str) -> None:
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


FOREIGN = {
    "text file": lambda p: p.write_text("just some notes\n" * 200),
    "short garbage": lambda p: p.write_bytes(b"\x00\x01garbage"),
    "random bytes": lambda p: p.write_bytes(random.Random(1).randbytes(8192)),
    "sqlite header then garbage": lambda p: p.write_bytes(
        b"SQLite format 3\x00" + random.Random(2).randbytes(4080)
    ),
    "another app's db": lambda p: _foreign_db(
        p,
        "CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)",
        "INSERT INTO notes VALUES (1, 'x')",
    ),
    "same table names, no marker": lambda p: _foreign_db(
        p,
        "CREATE TABLE sessions(session_id TEXT PRIMARY KEY, meta TEXT)",
        "CREATE TABLE messages(session_id TEXT, idx INTEGER, body BLOB)",
        "INSERT INTO sessions VALUES ('a', '{}')",
    ),
    "empty db of another app": lambda p: _foreign_db(p, "PRAGMA application_id = 12345"),
    "our id, no axon_meta": lambda p: _foreign_db(
        p, f"PRAGMA application_id = {APPLICATION_ID}", "CREATE TABLE t(x)"
    ),
    "wrong magic": lambda p: _foreign_db(
        p,
        f"PRAGMA application_id = {APPLICATION_ID}",
        "CREATE TABLE axon_meta(key TEXT PRIMARY KEY, value TEXT)",
        "INSERT INTO axon_meta VALUES ('magic', 'something-else'), ('schema_version', '1')",
    ),
    "wal-mode db of another app": lambda p: _foreign_db(
        p, "PRAGMA journal_mode = WAL", "CREATE TABLE notes(x)", "INSERT INTO notes VALUES (1)"
    ),
}


@pytest.mark.parametrize("make", FOREIGN.values(), ids=FOREIGN.keys())
async def test_foreign_files_are_refused_and_untouched(tmp_path: Path, make):
    path = tmp_path / "sessions.db"
    make(path)
    before = snapshot(tmp_path)
    with pytest.raises(StoreCorrupt) as info:
        await SQLiteStore.open(path)
    assert str(path) in str(info.value)
    assert snapshot(tmp_path) == before
    with pytest.raises(StoreCorrupt):  # and again: refusing did not "fix" anything
        await open_store(path)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("keep", [0.5, 0.5001, 0.9, 50], ids=["half", "mid-page", "most", "header"])
async def test_truncated_store_is_refused_and_untouched(tmp_path: Path, keep: float):
    path = tmp_path / "sessions.db"
    await make_store_file(path)
    data = path.read_bytes()
    assert len(data) >= 8 * 4096  # several pages, so truncation cuts real data
    cut = int(keep) if keep > 1 else int(len(data) * keep)
    path.write_bytes(data[:cut])
    before = snapshot(tmp_path)
    with pytest.raises(StoreCorrupt, match="truncated") as info:
        await SQLiteStore.open(path)
    assert str(path) in str(info.value)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("page", [0, 1, 6])
async def test_damaged_pages_raise_store_corrupt_and_stay_untouched(tmp_path: Path, page: int):
    """Garbage inside a store (not just at its end) surfaces as StoreCorrupt: when opening
    if it hits the schema or our marker, else on the first load that reads the page."""
    path = tmp_path / "sessions.db"
    await make_store_file(path)
    data = bytearray(path.read_bytes())
    start = page * 4096 + (100 if page == 0 else 0)  # keep the 100-byte file header
    data[start : (page + 1) * 4096] = random.Random(page).randbytes((page + 1) * 4096 - start)
    path.write_bytes(bytes(data))
    before = snapshot(tmp_path)
    with pytest.raises(StoreCorrupt, match="damaged") as info:
        store = await SQLiteStore.open(path)
        try:
            for s in range(3):
                await store.load(f"s{s}")
        finally:
            await store.aclose()
    assert str(path) in str(info.value)
    assert snapshot(tmp_path) == before


async def test_newer_schema_is_refused_and_untouched(tmp_path: Path):
    path = tmp_path / "sessions.db"
    await make_store_file(path, sessions=1, turns=1)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE axon_meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    before = snapshot(tmp_path)
    with pytest.raises(StoreError, match="schema version 99") as info:
        await SQLiteStore.open(path)
    assert str(path) in str(info.value)
    assert snapshot(tmp_path) == before


async def test_two_store_objects_on_one_file_never_overwrite_each_other(tmp_path: Path):
    path = tmp_path / "sessions.db"
    one = await SQLiteStore.open(path)
    two = await SQLiteStore.open(path)
    try:
        await one.save("a", 0, turn(0))
        seen_by_one = (await one.load("a")).version
        seen_by_two = (await two.load("a")).version
        await two.save("a", 2, turn(1), expected_version=seen_by_two)
        with pytest.raises(StoreConflict):  # one's view is stale: it must not write at 2
            await one.save("a", 2, turn(2), expected_version=seen_by_one)
        assert await one.load("a") == record("a", turn(0) + turn(1))
    finally:
        await one.aclose()
        await two.aclose()


async def test_deleted_session_versions_survive_reopening(tmp_path: Path):
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    old = await store.save("s", 0, turn(0))
    old = await store.save("s", 2, turn(1), expected_version=old)
    await store.delete("s")
    await store.aclose()
    store = await SQLiteStore.open(path)
    try:
        assert await store.save("s", 0, turn(2), expected_version=0) > old
    finally:
        await store.aclose()


FIXTURE_V1 = Path(__file__).parent / "fixtures" / "store_v1.sqlite"
"""Written by the schema-1 SQLiteStore (before versions): session ``legacy`` holds
``conversation() + turn(1)`` with meta ``{"agent": "demo"}``, session ``other`` ``turn(0)``."""


async def test_schema_1_file_is_upgraded_in_place_and_keeps_its_sessions(tmp_path: Path):
    path = tmp_path / "old.db"
    shutil.copy(FIXTURE_V1, path)
    store = await SQLiteStore.open(path)
    try:
        legacy = await store.load("legacy")
        assert legacy == record("legacy", conversation() + turn(1), {"agent": "demo"})
        assert legacy.version == 1 and await store.version("other") == 1
        assert [i.session_id for i in await store.list_sessions()] == ["other", "legacy"]
        n = len(legacy.messages)
        assert await store.save("legacy", n, turn(2), expected_version=1) == 2
        with pytest.raises(StoreConflict):
            await store.save("legacy", n, turn(3), expected_version=1)
    finally:
        await store.aclose()
    conn = sqlite3.connect(path)
    try:
        meta = dict(conn.execute("SELECT key, value FROM axon_meta"))
        assert meta["schema_version"] == str(SCHEMA_VERSION) == "6"
    finally:
        conn.close()
    again = await SQLiteStore.open(path)  # an upgraded file opens as a current one
    try:
        assert await again.load("legacy") == record(
            "legacy", conversation() + turn(1) + turn(2), {"agent": "demo"}
        )
    finally:
        await again.aclose()


async def test_schema_2_file_is_upgraded_in_place_its_sessions_incarnations_not_recorded(
    tmp_path: Path,
):
    # A file of before incarnations (schema 2: the column dropped from a current one).
    path = tmp_path / "v2.db"
    store = await SQLiteStore.open(path)
    old = await store.save("s", 0, turn(0))
    old = await store.save("s", 2, turn(1), expected_version=old)
    await store.aclose()
    make_schema_4(path)
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE sessions DROP COLUMN incarnation")
    conn.execute("UPDATE axon_meta SET value = '2' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    store = await SQLiteStore.open(path)
    try:
        kept = await store.load("s")
        assert kept == record("s", turn(0) + turn(1)) and kept.version == old
        assert kept.incarnation == 0  # not recorded: nothing is refused on it
        await store.delete("s")
        again = await store.save("s", 0, turn(2), expected_version=0)
        assert (await store.load("s")).incarnation == again > old
    finally:
        await store.aclose()
    conn = sqlite3.connect(path)
    try:
        assert dict(conn.execute("SELECT key, value FROM axon_meta"))["schema_version"] == "6"
    finally:
        conn.close()


def make_schema_5(path: Path) -> None:
    """Make the current store file at ``path`` one of before the segments of a running
    turn's answer (schema 5: no ``message_segments`` table), as a store of that version
    left it (none of its messages in segments)."""
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM message_segments").fetchone() == (0,)
    conn.execute("DROP TABLE message_segments")
    conn.execute("UPDATE axon_meta SET value = '5' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()


def make_schema_4(path: Path) -> None:
    """Make the current store file at ``path`` one of before the index of its user
    messages' ids (schema 4: no ``message_id`` column), as a store of that version left it."""
    make_schema_5(path)
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX user_messages_by_id")
    conn.execute("ALTER TABLE messages DROP COLUMN message_id")
    conn.execute("UPDATE axon_meta SET value = '4' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()


def make_schema_3(path: Path) -> None:
    """Make the current store file at ``path`` one of before deletion marks (schema 3:
    no ``deletions`` table, no highest mark in ``axon_meta``), as a store of that version
    left it."""
    make_schema_4(path)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE deletions")
    conn.execute("DELETE FROM axon_meta WHERE key = 'deletion_mark'")
    conn.execute("UPDATE axon_meta SET value = '3' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()


async def test_schema_3_file_is_upgraded_in_place_and_gains_the_deletion_marks(tmp_path: Path):
    # A file of before deletion marks: its sessions kept, the marks start at 0 (none
    # counted before), and count deletions from then on.
    path = tmp_path / "v3.db"
    store = await SQLiteStore.open(path)
    kept = await store.save("s", 0, turn(0))
    await store.save("gone", 0, turn(1))
    await store.delete("gone")  # (counted by nothing: the table is dropped below)
    await store.aclose()
    make_schema_3(path)
    store = await SQLiteStore.open(path)
    try:
        assert await store.load("s") == record("s", turn(0))
        assert await store.version_and_deletions("s") == (kept, 0)
        assert await store.version_and_deletions("gone") == (0, 0)
        await store.delete("s")
        assert await store.version_and_deletions("s") == (0, 1)
    finally:
        await store.aclose()
    conn = sqlite3.connect(path)
    try:
        assert dict(conn.execute("SELECT key, value FROM axon_meta"))["schema_version"] == "6"
        assert list(conn.execute("SELECT session_id, count FROM deletions")) == [("s", 1)]
    finally:
        conn.close()


def schema_4_file(path: Path) -> None:
    """A store file at ``path`` as schema 4 left one (before the index of the user
    messages' ids): session ``s`` (user messages ``u1``, ``u2``), ``t`` (``u3``)."""

    async def write() -> None:
        store = await SQLiteStore.open(path)
        try:
            await store.save(
                "s",
                0,
                [
                    UserMessage(content="a", id="u1"),
                    AssistantMessage(id="x"),
                    UserMessage(content="b", id="u2"),
                ],
            )
            await store.save("t", 0, [UserMessage(content="c", id="u3")])
        finally:
            await store.aclose()

    trio.run(write)
    make_schema_4(path)


async def test_schema_4_file_is_upgraded_in_place_and_its_user_message_ids_indexed(
    tmp_path: Path,
):
    path = tmp_path / "v4.db"
    await trio.to_thread.run_sync(schema_4_file, path)
    store = await SQLiteStore.open(path)
    try:
        assert await store.has_user_messages("s", ["u1", "u2", "u3", "x"]) == {"u1", "u2"}
        assert await store.has_user_messages("t", ["u1", "u3"]) == {"u3"}
        version = await store.version("s")
        await store.save("s", 3, [UserMessage(content="d", id="u4")], expected_version=version)
        assert await store.has_user_messages("s", ["u4"]) == {"u4"}
    finally:
        await store.aclose()
    conn = sqlite3.connect(path)
    try:
        assert dict(conn.execute("SELECT key, value FROM axon_meta"))["schema_version"] == "6"
        ids = list(conn.execute("SELECT session_id, idx, message_id FROM messages ORDER BY 1, 2"))
    finally:
        conn.close()
    assert ids == [("s", 0, "u1"), ("s", 1, None), ("s", 2, "u2"), ("s", 3, "u4"), ("t", 0, "u3")]


async def test_a_user_message_whose_id_the_upgrade_cannot_read_is_asked_the_long_way(
    tmp_path: Path,
):
    """A damaged user row of a schema-4 file: the upgrade leaves its id ``NULL`` (it does
    not fail on it), and asking its session reads the session, which says what is wrong;
    the other sessions are answered from the index."""
    path = tmp_path / "v4.db"
    await trio.to_thread.run_sync(schema_4_file, path)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE messages SET body = x'7b7b7b' WHERE session_id = 't'")
    conn.commit()
    conn.close()
    store = await SQLiteStore.open(path)
    try:
        assert await store.has_user_messages("s", ["u1", "u3"]) == {"u1"}
        with pytest.raises(StoreCorrupt, match="'t' message 0 cannot be read"):
            await store.has_user_messages("t", ["u3"])
    finally:
        await store.aclose()


# -- SQLite: damaged rows -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "match"),
    [
        ("UPDATE messages SET body = x'7b7b7b' WHERE idx = 1", "'s' message 1 cannot be read"),
        (
            """UPDATE messages SET body = '{"role": "alien"}' WHERE idx = 1""",
            "'s' message 1 cannot be read",
        ),
        ("""UPDATE messages SET body = '{"role": "user"}' WHERE idx = 1""", "message 1"),
        ("UPDATE messages SET role = 'user' WHERE idx = 1", "message 1 is stored as role"),
        ("DELETE FROM messages WHERE idx = 1", "missing message 1"),
        ("DELETE FROM messages WHERE idx = 0", "missing message 0"),
        ("UPDATE sessions SET meta = 'not json'", "meta of session 's'"),
    ],
)
async def test_damaged_rows_raise_store_corrupt(tmp_path: Path, sql: str, match: str):
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.save("s", 0, turn(0) + turn(1))
        conn = sqlite3.connect(path)
        conn.execute(sql)
        conn.commit()
        conn.close()
        with pytest.raises(StoreCorrupt, match=match) as info:
            await store.load("s")
        assert str(path) in str(info.value)
    finally:
        await store.aclose()


# -- SQLite: transactions and write cost ----------------------------------------------------


async def _state(store: SQLiteStore) -> tuple[Any, ...]:
    return (await store.load("a"), await store.load("b"), await store.list_sessions())


@pytest.mark.parametrize(
    "bad",
    [
        ToolMessage(tool_call_id="c", tool_name="t", step=0, output={1: "int key"}),
    ],
    ids=["int-dict-key"],  # (an int past 64 bits is stored: tests/test_big_ints.py)
)
async def test_unserializable_message_midway_leaves_state_intact(tmp_path: Path, bad):
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        await store.save("a", 0, turn(0) + turn(1), {"k": 1})
        await store.save("b", 0, turn(0))
        before = await _state(store)
        with pytest.raises(StoreError, match="message 2 cannot be serialized"):
            await store.save("a", 1, [UserMessage(content="ok", id="ok"), bad, *turn(5)], {"k": 2})
        assert await _state(store) == before
    finally:
        await store.aclose()


async def test_failure_inside_the_transaction_rolls_everything_back(tmp_path: Path):
    """A message row's write that fails after the upsert and the rows before it undoes
    them all (the row at 3 is written over its place or inserted: both fail)."""
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.save("a", 0, turn(0) + turn(1), {"k": 1})
        await store.save("b", 0, turn(0))
        before = await _state(store)
        conn = sqlite3.connect(path)
        for event in ("INSERT", "UPDATE"):
            conn.execute(
                f"CREATE TRIGGER fail_{event} BEFORE {event} ON messages WHEN NEW.idx = 3 "
                "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
        conn.commit()
        with pytest.raises(StoreError, match="injected failure"):
            await store.save("a", 1, turn(5) + turn(6), {"k": 2})
        assert await _state(store) == before
        # The connection is not left inside a transaction: once the fault is gone the
        # same save goes through.
        conn.execute("DROP TRIGGER fail_INSERT")
        conn.execute("DROP TRIGGER fail_UPDATE")
        conn.commit()
        conn.close()
        await store.save("a", 1, turn(5) + turn(6), {"k": 2})
        assert await store.load("a") == record("a", turn(0)[:1] + turn(5) + turn(6), {"k": 2})
    finally:
        await store.aclose()


async def test_a_turn_s_store_calls_take_few_statements(tmp_path: Path):
    """The statements SQLite runs for each of the calls a turn of a new session makes
    (issue 24 goal 1: 17 before, 9 now; a cold statement costs 5-20 us): a never-saved
    session's load is one, a small session's two (no BEGIN/COMMIT: each reads one
    snapshot), a save's checks one, and a save that only appends deletes nothing."""
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    seen: list[str] = []
    store._conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())[:24]))

    def took() -> list[str]:
        done = list(seen)
        seen.clear()
        return done

    try:
        assert await store.load("s") is None
        assert took() == ["SELECT (SELECT coalesce("]
        assert await store.version("s") == 0
        assert took() == ["SELECT (SELECT version F"]  # (and the hosts' registry: twins2)
        assert await store.save("s", 0, turn(0), {"agent": "a"}, expected_version=0) == 1
        assert took() == [
            "BEGIN IMMEDIATE",
            "SELECT s.meta, s.version",
            "INSERT INTO sessions (se",
            "INSERT INTO messages (se",
            "INSERT INTO messages (se",
            "COMMIT",
        ]
        loaded = await store.load("s")
        assert loaded == record("s", turn(0), {"agent": "a"}) and loaded.version == 1
        assert took() == ["SELECT (SELECT coalesce(", "SELECT CASE WHEN m.idx I"]
        # Appending deletes nothing; a tail replaced is written over its rows (one
        # statement a row, not a delete and an insert); a shorter one deletes the rest.
        await store.save("s", 2, turn(1), expected_version=1)
        assert "DELETE FROM messages WHE" not in took()
        await store.save("s", 3, turn(2), expected_version=2)
        replaced = took()
        assert "DELETE FROM messages WHE" not in replaced
        assert replaced.count("UPDATE messages SET role") == 1
        assert replaced.count("INSERT INTO messages (se") == 1
        loaded = await store.load("s")
        assert loaded == record("s", turn(0) + turn(1)[:1] + turn(2), {"agent": "a"})
        assert loaded.version == 3
        await store.save("s", 2, turn(3)[:1], expected_version=3)
        shortened = took()
        assert "DELETE FROM messages WHE" in shortened
        assert shortened.count("UPDATE messages SET role") == 1
        loaded = await store.load("s")
        assert loaded == record("s", turn(0) + turn(3)[:1], {"agent": "a"})
    finally:
        store._conn.set_trace_callback(None)
        await store.aclose()


async def test_version_now_reads_without_waiting_or_says_it_would_wait(tmp_path: Path):
    """``version_now``: the version (``0`` for a session not stored) on the calling
    thread; ``None`` while another call holds the connection (a thread's, here the lock
    taken by hand); a bad id refused as by every call, a closed store a ``StoreError``."""
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        assert store.version_now("s") == 0
        await store.save("s", 0, turn(0))
        assert store.version_now("s") == 1 == await store.version("s")
        async with store._lock:
            assert store.version_now("s") is None
        with pytest.raises(InvalidSessionId):
            store.version_now("bad id")
    finally:
        await store.aclose()
    with pytest.raises(StoreError, match="closed"):
        store.version_now("s")


async def test_a_session_saved_without_messages_loads_with_none(tmp_path: Path):
    """The read's join gives one row of empty message columns for such a session."""
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        await store.save("s", 0, [], {"k": 1})
        on_loop, in_thread = await store.load("s"), await store._run("load", store._load, "s")
        assert on_loop == in_thread == record("s", [], {"k": 1})
        assert on_loop.version == in_thread.version == 1
    finally:
        await store.aclose()


async def test_each_save_writes_only_its_own_rows(tmp_path: Path):
    """Saving turn N inserts N's rows; earlier rows are neither deleted nor updated."""
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        history: list[Message] = []
        for n in range(250):  # 500 messages
            await store.save("a", len(history), turn(n))
            history += turn(n)
        await store.save("b", 0, turn(0))
        conn = sqlite3.connect(path, isolation_level=None)
        conn.executescript(
            """
            CREATE TABLE audit(tbl TEXT, op TEXT, session_id TEXT, idx INTEGER);
            CREATE TRIGGER audit_mi AFTER INSERT ON messages
                BEGIN INSERT INTO audit VALUES ('messages', 'insert', NEW.session_id, NEW.idx); END;
            CREATE TRIGGER audit_mu AFTER UPDATE ON messages
                BEGIN INSERT INTO audit VALUES ('messages', 'update', NEW.session_id, NEW.idx); END;
            CREATE TRIGGER audit_md AFTER DELETE ON messages
                BEGIN INSERT INTO audit VALUES ('messages', 'delete', OLD.session_id, OLD.idx); END;
            CREATE TRIGGER audit_si AFTER INSERT ON sessions
                BEGIN INSERT INTO audit VALUES ('sessions', 'insert', NEW.session_id, NULL); END;
            CREATE TRIGGER audit_su AFTER UPDATE ON sessions
                BEGIN INSERT INTO audit VALUES ('sessions', 'update', NEW.session_id, NULL); END;
            CREATE TRIGGER audit_sd AFTER DELETE ON sessions
                BEGIN INSERT INTO audit VALUES ('sessions', 'delete', OLD.session_id, NULL); END;
            """
        )
        rowids = conn.execute(
            "SELECT rowid, session_id, idx FROM messages ORDER BY rowid"
        ).fetchall()

        def audit() -> list[tuple]:
            rows = conn.execute("SELECT tbl, op, session_id, idx FROM audit ORDER BY rowid")
            result = rows.fetchall()
            conn.execute("DELETE FROM audit")
            return result

        await store.save("a", 500, turn(250))  # append turn 251 to a 500-message session
        assert audit() == [
            ("sessions", "update", "a", None),
            ("messages", "insert", "a", 500),
            ("messages", "insert", "a", 501),
        ]
        await store.save("a", 501, [UserMessage(content="redo", id="redo")])  # replace the last one
        assert audit() == [
            ("sessions", "update", "a", None),
            ("messages", "update", "a", 501),  # over its row
        ]
        # Rows that existed before are the same physical rows.
        now = conn.execute(
            "SELECT rowid, session_id, idx FROM messages WHERE idx < 500 OR session_id = 'b' "
            "ORDER BY rowid"
        ).fetchall()
        assert now == rowids
        conn.close()
        assert len((await store.load("a")).messages) == 502
    finally:
        await store.aclose()


class _FailingConnection:
    """A connection whose every statement fails (not busy): what the store reports."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real

    def execute(self, sql: str, *args: Any) -> Any:
        if sql.startswith("PRAGMA busy_timeout"):
            return self.real.execute(sql, *args)
        raise sqlite3.OperationalError("disk I/O error")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def test_a_failed_sqlite_call_names_what_it_was_doing(tmp_path: Path):
    """The load, the save and the version query each name themselves and the session
    in their error, as before; the text is made only when a call fails (a turn's four
    calls formatted it every time, issue 24 goal 1)."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    real = store._conn
    store._conn = _FailingConnection(real)  # type: ignore[assignment]
    try:
        with pytest.raises(StoreError, match=r": load of session 's-1' failed: disk I/O"):
            await store.load("s-1")
        with pytest.raises(StoreError, match=r": save of session 's-1' failed: disk I/O"):
            await store.save("s-1", 0, turn(0))
        with pytest.raises(StoreError, match=r": version of session 's-1' failed: disk I/O"):
            await store.version("s-1")
        with pytest.raises(StoreError, match=r": version of session 's-1' failed: disk I/O"):
            store.version_now("s-1")
    finally:
        store._conn = real
        await store.aclose()


# -- the listing by the page -------------------------------------------------------------


class _OldListing(MemoryStore):
    """A store written before paging: ``list_sessions`` takes no arguments."""

    async def list_sessions(self):  # type: ignore[override]
        return [attrs.evolve(i, cursor=None) for i in await super().list_sessions()]


async def test_list_page_slices_a_store_written_before_paging():
    from runtime.errors import InvalidCursor
    from runtime.store import list_page

    store = _OldListing()
    for n in range(5):
        await store.save(f"s{n}", 0, turn(n))
    first = await list_page(store, limit=2)
    assert [i.session_id for i in first.sessions] == ["s4", "s3"] and first.next_cursor
    second = await list_page(store, limit=2, after=first.next_cursor)
    third = await list_page(store, limit=2, after=second.next_cursor)
    assert [i.session_id for i in second.sessions + third.sessions] == ["s2", "s1", "s0"]
    assert third.next_cursor is None
    for bad in ("12", "i:x", "i:-1", "i:" + "9" * 30):
        with pytest.raises(InvalidCursor):
            await list_page(store, limit=2, after=bad)


async def test_a_sqlite_page_is_a_range_of_the_recency_index(tmp_path: Path):
    """No sort of all sessions: the plan walks ``sessions_by_update`` from the cursor."""
    from actors.stores import sqlite as sqlite_store

    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.save("a", 0, turn(0))
        conn = store._conn
        for sql, args in (
            (sqlite_store._LIST_SQL, (50,)),
            (sqlite_store._LIST_AFTER_SQL, (10, 50)),
        ):
            plan = " | ".join(r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + sql, args))
            assert "sessions_by_update" in plan and "TEMP B-TREE" not in plan, plan
            if args[0] == 10:
                assert "update_seq<?" in plan.replace(" ", ""), plan
    finally:
        await store.aclose()


@pytest.mark.parametrize("bad", ["", "x", "-1", "1.5", " 1", "1" * 40, "\uff11", "9" * 19])
async def test_a_built_in_store_refuses_a_cursor_it_did_not_write(store, bad):
    """The built-in stores' cursors are a decimal ``update_seq`` that fits in 64 bits."""
    from runtime.errors import InvalidCursor

    await store.save("s", 0, turn(0))
    with pytest.raises(InvalidCursor):
        await store.list_sessions(limit=2, after=bad)


async def test_a_file_whose_marks_the_first_version_set_marks_the_next_deletion_above_them(
    tmp_path: Path,
):
    # The marks' first version counted deletions per id and kept no highest mark: the
    # next deletion's mark is read above the highest of them (an id's mark never falls).
    path = tmp_path / "s.db"
    store = await SQLiteStore.open(path)
    try:
        store._conn.execute("INSERT INTO deletions VALUES ('a', 7), ('s', 2)")
        await store.save("s", 0, turn(0))
        await store.delete("s")
        assert await store.deletions("s") == 8
    finally:
        await store.aclose()
