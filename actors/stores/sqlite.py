"""A :class:`~runtime.store.Store` in one embedded SQLite file.

Layout (schema version 6)::

    axon_meta(key TEXT PRIMARY KEY, value TEXT)          -- magic, schema_version,
                                                         -- deleted_version (see delete),
                                                         -- writer:<host> (set_writer)
    sessions(session_id TEXT PRIMARY KEY, meta TEXT,     -- meta: a JSON object
             created_at REAL, updated_at REAL,           -- unix seconds, informative
             update_seq INTEGER,                         -- recency order, see below
             version INTEGER,                            -- bumped by every save
             incarnation INTEGER)                        -- version of its first save
    messages(session_id TEXT, idx INTEGER, role TEXT,
             body BLOB,                                  -- serde JSON of one Message
             message_id TEXT,                            -- a user message's id, else NULL
             PRIMARY KEY(session_id, idx))
    user_messages_by_id ON messages(session_id, message_id) WHERE role = 'user'
    sessions_by_caller ON sessions(<the caller its meta names>)   -- sub-sessions
    deletions(session_id TEXT PRIMARY KEY,               -- the deletion marks: grows
              count INTEGER)                             -- with each delete of the id
    message_segments(session_id TEXT, idx INTEGER,       -- a running turn's answer's
             first INTEGER, body BLOB,                   -- parts from ``first`` on
             PRIMARY KEY(session_id, idx, first))        -- (see "Grown messages")

and ``PRAGMA application_id`` = :data:`APPLICATION_ID`, so ``file(1)`` and other tools
can tell an Axon store from any other SQLite file.

One message is one row, keyed by its index in the session. :meth:`SQLiteStore.save`
deletes the rows from ``start`` on and inserts the new ones, all in one transaction, so
saving turn 500 writes what turn 500 added and never rewrites the session, and a failed
save leaves the previous state intact. The same transaction checks the session's
``version`` against the one the writer loaded and bumps it (the version rule of
:class:`~runtime.store.Store`), so two processes on one file never overwrite each other.

Schema version 1 (no ``version`` column) is upgraded in place when opened: the column is
added and every existing session starts at version 1. Schema version 2 (no
``incarnation`` column) likewise: its sessions get ``0`` ("not recorded", which refuses
nothing), a session created after records its own. Schema version 3 (no ``deletions``
table) gains the empty table: no id was deleted as far as it knows, which is what a
turn that read no mark assumes too. Schema version 4 (no ``message_id`` column) gains
the column, filled for its user messages from their bodies, and its index
(:meth:`SQLiteStore.has_user_messages`). Schema version 5 (no ``message_segments``)
gains the empty table. Newer schemas are refused.

Grown messages (:class:`~runtime.store.Store`'s grown rows): a running turn's answer
holds every step's parts, and each step's save sends it again; written whole, a turn of
n steps wrote n(n+1)/2 steps' parts (46.9 MB at 1,000 steps; benchmarks/journal,
``longturn2``). A save told that the message at a position grew
(``grown``) writes its *head* over its row, its fields with ``content`` as
``{"parts": N}`` (:data:`~actors.stores.validation.HEAD_PREFIX`), and one segment with
the parts new since the row's last write; the first such save moves every part into
segment ``0``. Writing a message whole (a turn's last save, a decision, a rebase)
deletes its segments, as does a delete of its row. A save that writes no head, of a
session that holds segments, writes every head left whole (a turn killed mid-answer,
whose last save never came: the session's next turn's save folds it once) and deletes
the session's segments (:func:`_fold_heads`). A load folds a head and its segments
back into the message's JSON, read in one transaction (one snapshot). A process of
schema 5 that has the file open when it is upgraded writes nothing more
(``_schema_moved``), and reads a head as a damaged row (``StoreCorrupt``: its
``content`` is no list), never as a message without content.

The file is never reset or overwritten: :meth:`SQLiteStore.open` only reads until it has
established that the file is empty or an Axon store, and raises
:class:`~runtime.errors.StoreCorrupt` for anything else (another program's database, a
text file, a truncated store). Losing a user's sessions to an automatic "repair" is
worse than refusing to start.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import struct
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeAlias, TypeVar

import orjson
import trio

import runtime.store as store_contract
from actors.stores.owned import owned_sessions
from actors.stores.validation import (
    HEAD_PEEK,
    HEAD_PREFIX,
    check_folded,
    check_grown,
    check_limit,
    check_version,
    decode_folded,
    decode_message,
    decode_meta,
    deleted_since,
    encoded_off_loop,
    fold_grown,
    head_parts,
    kept_tail,
    parse_cursor,
    split_grown,
    storable_meta,
)
from runtime import serde
from runtime.errors import StoreCorrupt, StoreError
from runtime.messages import Message
from runtime.store import SessionInfo, SessionRecord, validate_session_id

APPLICATION_ID = 0x41584F4E
"""``PRAGMA application_id`` of every Axon store: ASCII ``AXON``."""

MAGIC = "axon-session-store"
"""The ``magic`` row of ``axon_meta``."""

SCHEMA_VERSION = 6
"""The schema this code writes. Older files are upgraded in place; newer ones are refused."""

_SQLITE_HEADER = b"SQLite format 3\x00"
_HEADER_SIZE = 100
_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_BUSY_TIMEOUT = 10.0
"""Seconds a write waits for another process's write lock before failing."""
INLINE_SAVE_BYTES = 256 * 1024
"""A save whose messages serialize to at most this many bytes runs on the calling thread
when the write lock is free: with WAL and ``synchronous = NORMAL`` a commit writes the
log without syncing it, and a turn's save takes a fraction of a millisecond, where the
hop to a worker thread and back cost a few hundred microseconds, and, on a loaded
machine, milliseconds waiting for the thread to be scheduled (issue 24: the turn's fixed
cost). Larger saves, and any save that would wait for another process, go to a thread."""
INLINE_LOAD_BYTES = 64 * 1024
"""A session whose stored messages add up to at most this many bytes is loaded on the
calling thread when the file is not busy: reading and decoding a small session takes
less than the hop to a worker thread and back (a few hundred microseconds of wake-ups
and GIL hand-offs, milliseconds on a loaded machine; issue 24, the turn's fixed cost).
A larger one still goes to a thread, so the event loop never stalls on a long
session's read and decode; so does any load that would wait for another process."""
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
"""The primary result codes of a statement that would have had to wait (extended codes,
such as ``SQLITE_BUSY_RECOVERY``, keep their primary code in the low byte)."""

_WRITER_PREFIX: Final = "writer:"
"""The ``axon_meta`` keys of the hosts writing the file: ``writer:<host's marker id>``
(:meth:`SQLiteStore.set_writer`), a range of the table's primary key."""

_WRITERS_SQL: Final = "SELECT key, value FROM axon_meta WHERE key >= 'writer:' AND key < 'writer;'"

_DELETIONS_TABLE = """CREATE TABLE IF NOT EXISTS deletions (
    session_id TEXT PRIMARY KEY,
    count INTEGER NOT NULL
) WITHOUT ROWID"""
"""Each deleted id's deletion mark (:meth:`SQLiteStore.deletions`): one row an id."""

_SEGMENTS_TABLE = """CREATE TABLE IF NOT EXISTS message_segments (
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    first INTEGER NOT NULL,
    body BLOB NOT NULL,
    PRIMARY KEY (session_id, idx, first)
)"""
"""The parts of messages stored as a head and segments (the module's "Grown messages"):
one row a save of a running turn's step, keyed by the message's index and the index of
its first part."""

_TOP_MARK_SQL = """SELECT coalesce(
    (SELECT CAST(value AS INTEGER) FROM axon_meta WHERE key = 'deletion_mark'),
    (SELECT max(count) FROM deletions), 0)"""
"""The highest deletion mark set: kept in ``axon_meta`` (one primary-key probe), read
from the marks the first time (a file whose marks a process of before set)."""
_MARK_SQL = """INSERT INTO deletions (session_id, count) VALUES (?1, ?2)
    ON CONFLICT (session_id) DO UPDATE SET count = max(count + 1, excluded.count)"""
"""A deleted session's mark: one above the highest set (above the id's own, too)."""


def _mark_deletion(conn: sqlite3.Connection, session_id: str) -> None:
    """Set ``session_id``'s deletion mark (:data:`_MARK_SQL`), in the delete's transaction,
    and drop the marks :data:`~runtime.store.DELETION_MARKS_KEPT` deletions old: every
    tenth of that many deletions (a scan of the marks, which have no index: once a
    deletion it cost a delete 7 ms at 10,000 marks), so the file holds at most that many
    and a tenth more."""
    kept = store_contract.DELETION_MARKS_KEPT
    top = conn.execute(_TOP_MARK_SQL).fetchone()[0] + 1
    conn.execute(_MARK_SQL, (session_id, top))
    conn.execute(
        """INSERT INTO axon_meta (key, value) VALUES ('deletion_mark', ?)
        ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
        (str(top),),
    )
    if top % max(1, kept // 10) == 0:
        conn.execute("DELETE FROM deletions WHERE count <= ?", (top - kept,))


_MESSAGE_ID_INDEX = """CREATE INDEX IF NOT EXISTS user_messages_by_id
    ON messages (session_id, message_id) WHERE role = 'user'"""
"""The user messages' ids, by session (:meth:`SQLiteStore.has_user_messages`): "was user
message id X saved in this session" answered from it, where a front end read the whole
session (A2A's ``message/send``, a message sent again). Partial, as PostgreSQL's
``axon_user_messages_by_id``: an assistant's or a tool's row adds no entry. A column
the save writes (it has the message, no JSON to parse), not an expression index: a
writer of schema 4 writes nothing into a file of schema 5 (``_schema_moved``), and the
rows stored before are filled once by the upgrade (:func:`_fill_message_ids`)."""

_CALLER_OF = (
    "instr(meta, '\"parent_session_id\"') > 0 AND json_valid(CAST(meta AS TEXT))",
    "json_extract(CAST(meta AS TEXT), '$.parent_session_id')",
)
"""The caller a session's meta names (:data:`~runtime.tools.PARENT_SESSION_META`), as
SQL: the condition under which it may name one (its bytes hold the key, and it reads as
JSON: ``json_extract`` fails the statement on a meta that does not) and the expression.
``CAST``: the meta is stored as the bytes ``orjson`` wrote (a BLOB), which SQLite 3.45
and later read as its binary JSONB."""

_CALLER_INDEX = f"""CREATE INDEX IF NOT EXISTS sessions_by_caller
    ON sessions ({_CALLER_OF[1]}) WHERE {_CALLER_OF[0]}"""
"""The sub-sessions by their caller: a delete finds a session's sub-sessions by it
(:mod:`actors.stores.owned`) without reading the calls in its messages. An expression
index, not a column: SQLite keeps it at every writer's insert and update, a process's
of an earlier version too (so the file's schema version stays: a writer of before still
writes), and a file of before gains it on open (:func:`_connect`), built from the metas
it holds. Partial: a session whose meta does not hold the key has no entry and costs its
saves no JSON parse."""

_SUBS_OF_SQL = f"""SELECT session_id, meta FROM sessions
    WHERE {_CALLER_OF[0]} AND {_CALLER_OF[1]} = ?"""
"""The sessions whose meta names a caller (the index's condition repeated: SQLite uses
a partial index only for a query whose ``WHERE`` holds its terms)."""

_SCHEMA = (
    """CREATE TABLE axon_meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE sessions (
        session_id TEXT PRIMARY KEY,
        meta TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        update_seq INTEGER NOT NULL,
        version INTEGER NOT NULL DEFAULT 0,
        incarnation INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX sessions_by_update ON sessions (update_seq)",
    """CREATE TABLE messages (
        session_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        role TEXT NOT NULL,
        body BLOB NOT NULL,
        message_id TEXT,
        PRIMARY KEY (session_id, idx)
    )""",
    _DELETIONS_TABLE,
    _MESSAGE_ID_INDEX,
    _CALLER_INDEX,
    _SEGMENTS_TABLE,
)
_COLUMNS_V1 = {
    "axon_meta": {"key", "value"},
    "sessions": {"session_id", "meta", "created_at", "updated_at", "update_seq"},
    "messages": {"session_id", "idx", "role", "body"},
}
_COLUMNS_V2 = {**_COLUMNS_V1, "sessions": _COLUMNS_V1["sessions"] | {"version"}}
_COLUMNS_V3 = {**_COLUMNS_V2, "sessions": _COLUMNS_V2["sessions"] | {"incarnation"}}
_COLUMNS_V4 = {**_COLUMNS_V3, "deletions": {"session_id", "count"}}
_COLUMNS_V5 = {**_COLUMNS_V4, "messages": _COLUMNS_V4["messages"] | {"message_id"}}
_COLUMNS = {**_COLUMNS_V5, "message_segments": {"session_id", "idx", "first", "body"}}


def _fill_message_ids(conn: sqlite3.Connection) -> None:
    """The upgrade to schema 5: each stored user message's id, read from its body. A
    body that holds none that can be read (a damaged row) leaves it ``NULL``: the
    upgrade never fails on it, and :meth:`SQLiteStore.has_user_messages` of that session
    reads the session the long way (its load then says what is wrong)."""
    found = []
    for rowid, body in conn.execute("SELECT rowid, body FROM messages WHERE role = 'user'"):
        try:
            message_id = orjson.loads(body).get("id")
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            continue
        if isinstance(message_id, str):
            found.append((message_id, rowid))
    conn.executemany("UPDATE messages SET message_id = ? WHERE rowid = ?", found)


_MIGRATIONS: dict[int, tuple[str | Callable[[sqlite3.Connection], None], ...]] = {
    # 1 -> 2: per-session versions. Existing sessions start at 1, since 0 means "absent".
    1: (
        "ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0",
        "UPDATE sessions SET version = 1",
    ),
    # 2 -> 3: each session's incarnation (the version of its first save), so a save based
    # on a deleted session's version is told from another writer's (Store docstring).
    # Existing sessions: 0, not recorded (their first save's version is not known).
    2: ("ALTER TABLE sessions ADD COLUMN incarnation INTEGER NOT NULL DEFAULT 0",),
    # 3 -> 4: the deletion marks (runtime.store.Store, "Deletion marks"): one row per id
    # deleted since (the last DELETION_MARKS_KEPT deletions'). Empty: none counted before.
    3: (_DELETIONS_TABLE,),
    # 4 -> 5: the user messages' ids, indexed (SQLiteStore.has_user_messages): the
    # column, the ids of the user messages stored before, the index.
    4: (
        "ALTER TABLE messages ADD COLUMN message_id TEXT",
        _fill_message_ids,
        _MESSAGE_ID_INDEX,
    ),
    # 5 -> 6: a running turn's answer as a head and segments ("Grown messages"): the
    # table, empty (every message stored before is whole).
    5: (_SEGMENTS_TABLE,),
}


_T = TypeVar("_T")


class _Large:
    """The type of :data:`_LARGE`."""


_LARGE = _Large()
"""What the load on the loop answers for a session too large to read there (or a busy
file): the load goes to a worker thread instead."""


_Action: TypeAlias = "str | tuple[str, str]"
"""What a store call was doing, for its error: ``"open"``, or ``(verb, session_id)``,
formatted ``"<verb> of session '<id>'"`` only when the call fails (a turn's four store
calls formatted it every time; issue 24 goal 1)."""


def _error(path: str, action: _Action, err: sqlite3.Error) -> StoreError:
    """The store error for a sqlite3 exception: damage is StoreCorrupt, the rest StoreError."""
    if not isinstance(action, str):
        action = f"{action[0]} of session {action[1]!r}"
    code = getattr(err, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _CORRUPT_CODES:
        return StoreCorrupt(f"session store {path}: {action} failed, the file is damaged: {err}")
    if code is not None and code & 0xFF == sqlite3.SQLITE_BUSY:
        # SQLite's own text, "database is locked", names neither who nor for how long.
        return StoreError(
            f"session store {path}: {action} failed: another process held the file's "
            f"write lock for more than {_BUSY_TIMEOUT:g} s ({err})"
        )
    if code is not None and code & 0xFF == sqlite3.SQLITE_READONLY and action != "open":
        # SQLite's own text, "attempt to write a readonly database", of a store that
        # opened, read, and ran a turn to the end before its save said that much.
        return StoreError(
            f"session store {path}: {action} failed: this process may read the file but "
            f"not write it ({err}): make the file and its directory writable to it; "
            "nothing was written"
        )
    return StoreError(f"session store {path}: {action} failed: {err}")


def _open_error(path: str, err: sqlite3.Error) -> StoreError:
    """:func:`_error` for the open, saying what about the directory SQLite met: its own
    "unable to open database file" or "attempt to write a readonly database" names
    neither (a directory not writable only fails once SQLite creates the ``-wal`` and
    ``-shm`` files that live beside the store, which even reading needs)."""
    error = _error(path, "open", err)
    code = (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF
    if path == ":memory:" or code not in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY):
        return error
    directory = os.path.dirname(os.path.abspath(path))
    name = os.path.basename(path)
    if not os.path.isdir(directory):
        hint = f"its directory {directory} does not exist (it is not created)"
    elif not os.access(directory, os.W_OK):
        hint = (
            f"its directory {directory} is not writable, and SQLite keeps {name}-wal and "
            f"{name}-shm beside the file (reading needs them too)"
        )
    else:
        return error
    return StoreError(f"{error}: {hint}")


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite already rolled back (e.g. after SQLITE_FULL); nothing to undo


_JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
"""The first bytes of a rollback journal that holds a transaction (SQLite zeroes or
deletes it once the transaction is over)."""


def _journal_in_flight(path: Path) -> bool:
    """Whether a rollback journal beside ``path`` holds a transaction that has not ended:
    one in progress in another process, or one a killed process left ("hot"), which
    SQLite rolls back when it next opens the file. The file's pages are then whatever that
    transaction had written of them so far: a new store's creation, killed while its
    pages were being written, leaves a header claiming pages that are not there yet (or
    no header at all), and the checks below refused as truncated, or as no SQLite
    database, a file SQLite restores to the empty file it was. SQLite judges it instead;
    what it leaves is then inspected as any file is (``_inspect``)."""
    try:
        with path.with_name(path.name + "-journal").open("rb") as f:
            return f.read(len(_JOURNAL_MAGIC)) == _JOURNAL_MAGIC
    except OSError:
        return False


def _file_identity(path: str) -> tuple[int, int] | None:
    """The device and inode ``path`` names now, ``None`` if nothing is there (or it
    cannot be looked at)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _check_file(path: Path) -> None:
    """Refuse a file that cannot be an intact SQLite database, before SQLite opens it.

    Reads the 100-byte header only. SQLite itself would open a text file without complaint
    and fail only on the first query, and would read a truncated file until it happened
    to touch a missing page; checking here keeps the file untouched and the error precise.
    A missing or empty file is fine: it becomes a new store.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    except OSError as err:
        raise StoreError(f"session store {path}: cannot stat the file: {err}") from err
    if not stat.S_ISREG(info.st_mode):
        # A directory failed as "Is a directory" on the read below; /dev/null (no store,
        # one might think) and a FIFO as SQLite's "disk I/O error".
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
        raise StoreError(
            f"session store {path} is {kind}: give the path of a file (created if missing)"
        )
    size = info.st_size
    if size == 0 or _journal_in_flight(path):
        return
    try:
        with path.open("rb") as f:
            header = f.read(_HEADER_SIZE)
    except OSError as err:
        raise StoreError(f"session store {path}: cannot read the file: {err}") from err
    if not header.startswith(_SQLITE_HEADER):
        raise StoreCorrupt(
            f"session store {path} is not an Axon store: it is not a SQLite database "
            "(refusing to touch it)"
        )
    if len(header) < _HEADER_SIZE:
        raise StoreCorrupt(f"session store {path} is truncated: {size} bytes, no full header")
    (page_size,) = struct.unpack(">H", header[16:18])
    if page_size == 1:
        page_size = 65536
    if page_size < 512 or page_size & (page_size - 1):
        raise StoreCorrupt(f"session store {path} is damaged: invalid page size {page_size}")
    # A write-ahead log left by a crash may legitimately hold pages the main file does not
    # have yet (an interrupted checkpoint); SQLite recovers from it, so the size checks
    # below only hold for a file without one.
    wal = path.with_name(path.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        return
    if size % page_size:
        raise StoreCorrupt(
            f"session store {path} is truncated or damaged: {size} bytes is not a whole "
            f"number of {page_size}-byte pages"
        )
    change_counter, page_count = struct.unpack(">II", header[24:32])
    (valid_for,) = struct.unpack(">I", header[92:96])
    if page_count and change_counter == valid_for and size < page_count * page_size:
        raise StoreCorrupt(
            f"session store {path} is truncated: its header says {page_count} pages "
            f"({page_count * page_size} bytes) but the file has {size} bytes"
        )


def _inspect(conn: sqlite3.Connection, path: str) -> int | None:
    """The store's schema version, ``None`` if the database is empty (a new file); raises
    unless it is an Axon store.

    Only reads. The checks go from "is this ours at all" to "is it intact", so the error
    names the most basic problem.
    """
    (app_id,) = conn.execute("PRAGMA application_id").fetchone()
    objects = {name: kind for kind, name in conn.execute("SELECT type, name FROM sqlite_master")}
    if not objects and app_id == 0:
        return None
    if app_id != APPLICATION_ID:
        tables = sorted(name for name, kind in objects.items() if kind == "table")
        shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
        raise StoreCorrupt(
            f"session store {path} is not an Axon store: it is a SQLite database of another "
            f"application (application_id {app_id:#x}, expected {APPLICATION_ID:#x}; "
            f"tables: {shown or 'none'}); refusing to touch it"
        )
    if objects.get("axon_meta") != "table":
        raise StoreCorrupt(f"session store {path} is not an Axon store: no axon_meta table")
    marker = dict(conn.execute("SELECT key, value FROM axon_meta"))
    if marker.get("magic") != MAGIC:
        raise StoreCorrupt(
            f"session store {path} is not an Axon store: axon_meta magic is "
            f"{marker.get('magic')!r}, expected {MAGIC!r}"
        )
    try:
        version = int(marker["schema_version"])
    except (KeyError, TypeError, ValueError):
        raise StoreCorrupt(
            f"session store {path} is damaged: schema_version "
            f"{marker.get('schema_version')!r} is not a version number"
        ) from None
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"session store {path} has schema version {version}, newer than the "
            f"{SCHEMA_VERSION} this version of axon-runtime understands; upgrade "
            "axon-runtime to open it (the file was left untouched)"
        )
    if version < 1:
        raise StoreCorrupt(f"session store {path} is damaged: schema_version {version}")
    expected = (
        _COLUMNS
        if version >= 6
        else _COLUMNS_V5
        if version >= 5
        else _COLUMNS_V4
        if version >= 4
        else _COLUMNS_V3
        if version >= 3
        else _COLUMNS_V2
        if version >= 2
        else _COLUMNS_V1
    )
    for table, columns in expected.items():
        found = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if not columns <= found:
            raise StoreCorrupt(
                f"session store {path} is damaged: table {table} lacks column(s) "
                f"{', '.join(sorted(columns - found))}"
            )
    # Touch both B-trees (root and rightmost leaf) so gross damage surfaces now, not on
    # the first load; a full integrity check would read the whole file on every open.
    conn.execute("SELECT max(update_seq) FROM sessions").fetchone()
    conn.execute("SELECT session_id, idx FROM messages ORDER BY session_id DESC, idx DESC LIMIT 1")
    return version


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    """Upgrade a store from schema ``version`` to :data:`SCHEMA_VERSION`, inside the
    caller's write transaction (so a failure leaves the file as it was)."""
    for step in range(version, SCHEMA_VERSION):
        for statement in _MIGRATIONS[step]:
            if callable(statement):
                statement(conn)
            else:
                conn.execute(statement)
    conn.execute(
        "UPDATE axon_meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),)
    )


def _has_caller_index(conn: sqlite3.Connection) -> bool:
    """Whether the file has :data:`_CALLER_INDEX` (a file of before has not)."""
    return (
        conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'sessions_by_caller'"
        ).fetchone()
        is not None
    )


def _create_schema(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA:
        conn.execute(statement)
    conn.executemany(
        "INSERT INTO axon_meta (key, value) VALUES (?, ?)",
        [("magic", MAGIC), ("schema_version", str(SCHEMA_VERSION))],
    )
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def _read_only(err: sqlite3.Error) -> bool:
    return (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF == sqlite3.SQLITE_READONLY


def _upgrade_refused(path: str, found: int, err: sqlite3.Error) -> StoreError:
    """The open's error for a file of an older schema (or without the callers' index)
    that it may not write: the upgrade it needs writes to it. Said, not SQLite's "attempt
    to write a readonly database" alone (a schema 5 file, every file of before the
    running answer's segments, that a user may only read, opened before the upgrade)."""
    if found < SCHEMA_VERSION:
        what = (
            f"is of schema {found}, which this version upgrades to schema {SCHEMA_VERSION} "
            "as it opens it"
        )
    else:
        what = "has no index of its sub-sessions' callers, which this version builds as it opens it"
    return StoreError(
        f"session store {path} {what} (a write), but the file is read-only ({err}): open "
        "it once where it may be written (a copy of it, say), or read it with the "
        "axon-runtime that wrote it; it was left as it was"
    )


def _connect(path: str) -> sqlite3.Connection:
    """Open (creating if missing) and verify the store file; the blocking half of ``open``."""
    if path != ":memory:":
        _check_file(Path(path))
    try:
        # isolation_level=None: no implicit transactions; every write below runs in an
        # explicit BEGIN IMMEDIATE ... COMMIT, so what is atomic is spelled out.
        conn = sqlite3.connect(
            path, timeout=_BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as err:
        raise _open_error(path, err) from err
    try:
        # One read transaction, so its reads see one state of the file: read one by one,
        # another process creating the store could commit between the header's
        # application_id (still 0) and the list of tables (all there), and the file read
        # as "another application's" (1 in ~12 openings of 4 processes at once).
        conn.execute("BEGIN")
        try:
            found = _inspect(conn, path)
            indexed = found is not None and _has_caller_index(conn)
        finally:
            conn.execute("COMMIT")
        if found is None or found < SCHEMA_VERSION or not indexed:
            # Take the write lock, then look again: another process may have created or
            # upgraded the schema between our read and now.
            try:
                conn.execute("BEGIN IMMEDIATE")
                found = _inspect(conn, path)
                if found is None:
                    _create_schema(conn)
                elif found < SCHEMA_VERSION:
                    _migrate(conn, found)
                if not _has_caller_index(conn):  # a file of before: built once
                    conn.execute(_CALLER_INDEX)
                conn.execute("COMMIT")
            except sqlite3.Error as err:
                _rollback(conn)
                if found is None or not _read_only(err):
                    raise
                raise _upgrade_refused(path, found, err) from err
            except BaseException:
                _rollback(conn)
                raise
        # Only now that the file is known to be ours may its header be written.
        conn.execute("PRAGMA journal_mode = WAL").fetchone()
        conn.execute("PRAGMA synchronous = NORMAL")
        # The connection rests not waiting for locks: the calls made on the event loop
        # must not wait, and those given to a thread set the wait around themselves
        # (SQLiteStore._waiting), two statements where every loop call had two.
        conn.execute("PRAGMA busy_timeout = 0")
    except sqlite3.Error as err:
        conn.close()
        raise _open_error(path, err) from err
    except BaseException:
        conn.close()
        raise
    return conn


def _missing(path: str, session_id: str, expected: int, idx: int) -> StoreCorrupt:
    return StoreCorrupt(
        f"session store {path}: session {session_id!r} is missing message {expected} (the "
        f"next stored index is {idx})"
    )


_HEAD_LEN = len(HEAD_PREFIX)

_SCHEMA_TEXT = str(SCHEMA_VERSION)
""":data:`SCHEMA_VERSION` as ``axon_meta`` holds it."""


def _schema_moved(path: str, schema: Any) -> StoreError:
    """The error of a write into a file whose schema changed since it was opened."""
    return StoreError(
        f"session store {path} is at schema version {schema} now, not the "
        f"{SCHEMA_VERSION} it was opened at: another process's axon-runtime upgraded it; "
        "nothing was written (restart this process with that version)"
    )


def _deleted_version(conn: sqlite3.Connection) -> int:
    """The highest version a deleted session had (``0`` if none was ever deleted)."""
    row = conn.execute("SELECT value FROM axon_meta WHERE key = 'deleted_version'").fetchone()
    return 0 if row is None else int(row[0])


def _upsert_session(
    conn: sqlite3.Connection, session_id: str, meta: dict[str, Any], version: int, now: float
) -> None:
    """Write the session row: its merged meta, ``version``, and the next place in recency
    order; a new row (the session's first save) records ``version`` as its incarnation
    too, in the same statement. ``update_seq``, not ``updated_at``, orders list_sessions:
    it is strictly increasing per write, where two wall-clock readings can tie or step
    backwards."""
    conn.execute(
        """INSERT INTO sessions
            (session_id, meta, created_at, updated_at, update_seq, version, incarnation)
        VALUES (?1, ?2, ?3, ?3, (SELECT coalesce(max(update_seq), 0) + 1 FROM sessions),
            ?4, ?4)
        ON CONFLICT (session_id) DO UPDATE SET
            meta = excluded.meta,
            updated_at = excluded.updated_at,
            update_seq = excluded.update_seq,
            version = excluded.version""",
        (session_id, serde.dumps(meta), now, version),
    )


_HEAD_SQL = """SELECT (SELECT coalesce(sum(length(body)), 0) FROM messages
    WHERE session_id = ?1) + (SELECT coalesce(sum(length(body)), 0) FROM message_segments
    WHERE session_id = ?1) FROM sessions WHERE session_id = ?1"""
"""A stored session's messages' total size in bytes (no row: never saved)."""
_READ_SQL = """SELECT CASE WHEN m.idx IS NULL OR m.idx = 0 THEN s.meta END, s.version,
        CASE WHEN m.idx IS NULL OR m.idx = 0 THEN s.incarnation END, m.idx, m.role, m.body
    FROM sessions AS s LEFT JOIN messages AS m ON m.session_id = s.session_id
    WHERE s.session_id = ? ORDER BY m.idx"""
"""A session in one snapshot: its row joined to each message, in index order (read along
the messages' primary key: no sort), the meta on the first message's row only (not
copied once a message); one row of ``NULL`` message columns for a session without
messages, none for a session not stored. The incarnation as the meta."""


_LIST_COLUMNS = """SELECT s.session_id, s.meta,
        (SELECT coalesce(max(m.idx) + 1, 0) FROM messages AS m WHERE m.session_id = s.session_id),
        s.update_seq
    FROM sessions AS s"""
_LIST_SQL = _LIST_COLUMNS + " ORDER BY s.update_seq DESC LIMIT ?"
_LIST_AFTER_SQL = _LIST_COLUMNS + " WHERE s.update_seq < ? ORDER BY s.update_seq DESC LIMIT ?"
"""A page of the session listing: ``sessions_by_update`` walked backwards (from below the
cursor's ``update_seq``), as many rows as the limit (``-1``: all), each session's
message count read as its highest index plus one: one probe of the messages' primary key
(a save leaves no hole, a load checks it), where ``count(*)`` stepped through every
message of every session listed, so a page of long sessions cost their length (a
1,000-message session ~3,000 VM steps a listing, now the ~70 a short one's takes).
``update_seq`` is unique (each write takes the next one inside its ``BEGIN IMMEDIATE``),
so it orders the sessions without ties."""


_BEFORE_SAVE_SQL = """SELECT s.meta, s.version,
        (SELECT value FROM axon_meta WHERE key = 'deleted_version'),
        (SELECT coalesce(max(idx) + 1, 0) FROM messages WHERE session_id = ?1),
        (SELECT value FROM axon_meta WHERE key = 'schema_version'),
        (SELECT count FROM deletions WHERE session_id = ?1),
        (SELECT max(idx) FROM message_segments WHERE session_id = ?1)
    FROM (SELECT 1) LEFT JOIN sessions AS s ON s.session_id = ?1"""
"""What a save checks and builds on, in one statement inside its transaction: the
session's meta and version (``NULL`` for a session not stored), the highest version a
deleted session had (``NULL``: none ever deleted), the message count (``max(idx)`` is
one index probe; ``count(*)`` would scan the whole session) and the file's schema
version (another process's newer axon-runtime may have upgraded it since this one
opened it), and the session's deletion mark (``NULL``: none kept; one primary-key probe:
a save that creates the session with ``absent_mark`` checks it under the write lock),
and the highest index of a message stored in segments (``NULL``: none, so a save that
writes messages whole has no segments to delete). Three statements before (issue 24
goal 1)."""

_SEGMENTS_SQL = """SELECT idx, first, body FROM message_segments WHERE session_id = ?
    ORDER BY idx, first"""
"""A session's segments, in order (read along their primary key: no sort)."""
_PEEK_SQL = f"""SELECT substr(body, 1, {HEAD_PEEK}) FROM messages
    WHERE session_id = ? AND idx = ?"""
"""The first bytes of a message's row: enough to tell a head's part count."""


_WRITER_KEYS = """(SELECT coalesce(group_concat(key, ' '), '') FROM (SELECT key FROM axon_meta
    WHERE key >= 'writer:' AND key < 'writer;' LIMIT 2))"""
"""Two keys at most of the registry of the hosts writing the file
(:meth:`SQLiteStore.set_writer`), read with every version query (a primary-key range):
a host learns whether another host writes the file from the query its turn makes anyway
(:meth:`SQLiteStore.writers_seen`). Two tell "this host alone" from "another too"; all of
them made a file holding 10,000 rows (a crash loop's) cost 0.7 ms and a 230 kB string a
turn (branch ``attackregistry``)."""

_VERSION_SQL = f"""SELECT (SELECT version FROM sessions WHERE session_id = ?1), {_WRITER_KEYS}"""
"""A session's version (``NULL``: not stored), and the registry's keys."""

_VERSION_MARK_SQL = f"""SELECT (SELECT version FROM sessions WHERE session_id = ?1),
    (SELECT count FROM deletions WHERE session_id = ?1), {_WRITER_KEYS}"""
"""A session's version and deletion mark in one statement: two primary-key probes, one
row (``NULL`` for a session not stored, an id never deleted), and the registry's keys."""


_HAS_USER_MESSAGES_SQL = """SELECT DISTINCT message_id FROM messages INDEXED BY user_messages_by_id
    WHERE session_id = ?1 AND role = 'user' AND message_id IN ({asked})
UNION ALL SELECT NULL FROM (SELECT 1 FROM messages INDEXED BY user_messages_by_id
    WHERE session_id = ?1 AND role = 'user' AND message_id IS NULL LIMIT 1)"""
"""The ids asked that the session's user messages have, and ``NULL`` when one of them has
none recorded: probes of ``user_messages_by_id`` (``INDEXED BY``: the plan cannot fall
back to reading the session's rows), the rows read those of the ids asked."""
_IDS_A_STATEMENT = 500
"""Ids asked in one statement (SQLite's default limit of parameters is 32,766; of 999
before 3.32)."""
_IDS_ON_LOOP = 64
"""Ids asked on the calling thread at most (more go to a worker thread)."""


class _Written:
    """A save's rows (:func:`~actors.stores.validation.encode_rows`'s) and the messages
    they encode: :meth:`rows` adds each user message's id (``message_id``), made where
    the save's statements run (a long save's in its worker thread). ``grown``: the
    indexes of the messages that grew on their rows (the module's "Grown messages")."""

    __slots__ = ("_encoded", "_messages", "_start", "grown")

    def __init__(
        self,
        encoded: list[tuple[str, int, str, bytes]],
        messages: Sequence[Message],
        start: int,
        grown: frozenset[int] = frozenset(),
    ) -> None:
        self._encoded, self._messages, self._start = encoded, messages, start
        self.grown = grown

    def message(self, idx: int) -> Message:
        return self._messages[idx - self._start]

    def rows(self) -> list[tuple[str, int, str, bytes, str | None]]:
        messages, start = self._messages, self._start
        return [
            (session_id, idx, role, body, messages[idx - start].id if role == "user" else None)
            for session_id, idx, role, body in self._encoded
        ]


def _grow(
    conn: sqlite3.Connection,
    session_id: str,
    rows: list[tuple[str, int, str, bytes, str | None]],
    written: _Written,
    count: int,
    segments: list[tuple[str, int, int, bytes]],
    fresh: list[int],
    heads: set[int],
) -> list[tuple[str, int, str, bytes, str | None]]:
    """``rows`` with each grown message's body replaced by its head (the module's "Grown
    messages"), its new parts' segment added to ``segments``: from the part count its
    stored head names, or from ``0`` when its row is whole (then listed in ``fresh``:
    segments left at its index are deleted first). A message that cannot be split so, or
    whose stored head counts more parts than it has, keeps its whole body (its segments
    are deleted as any whole row's)."""
    grown = written.grown
    out = list(rows)
    for i, row in enumerate(rows):
        idx = row[1]
        if idx not in grown or idx >= count:
            continue
        peek = conn.execute(_PEEK_SQL, (session_id, idx)).fetchone()
        held = None if peek is None else head_parts(bytes(peek[0]))
        split = split_grown(written.message(idx), row[3], held or 0)
        if split is None:
            continue
        head, segment = split
        if held is None:
            fresh.append(idx)
        heads.add(idx)
        out[i] = (row[0], idx, row[2], head, row[4])
        if segment:
            segments.append((session_id, idx, held or 0, segment))
    return out


def _fold_heads(conn: sqlite3.Connection, path: str, session_id: str) -> None:
    """In a save that writes no head, of a session that holds segments: each head left
    (a turn killed mid-answer, whose last save never came) written over its row whole,
    folded from its segments, and the session's segments deleted; a head whose segments
    do not fold into the parts it counts (damage) is left as it is, with its segments,
    for its reads to refuse. What the dead turn's last save would have written, once:
    the session's next turn writes it (its segments otherwise stayed until the session's
    delete, each read folding them again)."""
    left = _by_message(conn.execute(_SEGMENTS_SQL, (session_id,)).fetchall())
    if not left:
        return
    damaged: list[int] = []
    for idx, segments in left.items():
        row = conn.execute(
            "SELECT role, body FROM messages WHERE session_id = ? AND idx = ?", (session_id, idx)
        ).fetchone()
        if row is None or bytes(row[1][:_HEAD_LEN]) != HEAD_PREFIX:
            continue  # (segments beside a whole row, or no row: deleted below)
        role, head = row[0], bytes(row[1])
        try:
            whole = fold_grown(path, session_id, idx, head, segments)
            check_folded(
                path, session_id, idx, head, decode_message(path, session_id, idx, role, whole)
            )
        except StoreCorrupt:
            damaged.append(idx)
            continue
        conn.execute(
            "UPDATE messages SET body = ? WHERE session_id = ? AND idx = ?",
            (whole, session_id, idx),
        )
    kept = f" AND idx NOT IN ({', '.join('?' * len(damaged))})" if damaged else ""
    conn.execute(f"DELETE FROM message_segments WHERE session_id = ?{kept}", (session_id, *damaged))


def _by_message(segments: list[tuple[int, int, bytes]]) -> dict[int, list[tuple[int, bytes]]]:
    """The session's segments by message index (:data:`_SEGMENTS_SQL`'s rows)."""
    by_idx: dict[int, list[tuple[int, bytes]]] = {}
    for idx, first, body in segments:
        by_idx.setdefault(idx, []).append((first, body))
    return by_idx


def _sub_candidates(conn: sqlite3.Connection, caller: str) -> list[tuple[str, Any]]:
    """The stored sessions whose meta names ``caller``, with their meta: a lookup of
    ``sessions_by_caller`` (:data:`_CALLER_INDEX`)."""
    return conn.execute(_SUBS_OF_SQL, (caller,)).fetchall()


def _delete_one(conn: sqlite3.Connection, session_id: str) -> None:
    """Delete one session's rows, in the delete's transaction; its id's deletion mark
    moves if it was stored, as does the highest deleted version."""
    row = conn.execute(
        "SELECT version FROM sessions WHERE session_id = ?", (session_id,)
    ).fetchone()
    conn.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM message_segments WHERE session_id = ?", (session_id,))
    conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
    if row is None:
        return
    _mark_deletion(conn, session_id)  # a session deleted: its id's mark moves (one row an id)
    if row[0] > _deleted_version(conn):
        conn.execute(
            """INSERT INTO axon_meta (key, value) VALUES ('deleted_version', ?)
            ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
            (str(row[0]),),
        )


class SQLiteStore:
    """Sessions in one SQLite file; create with ``await SQLiteStore.open(path)``.

    sqlite3 calls block, so each one runs in a worker thread
    (:func:`trio.to_thread.run_sync`) on the store's single connection (except the
    version lookup that starts a turn, the load of a small session or of one never
    saved, and a small save, which run on the calling thread when they need not wait:
    :data:`INLINE_LOAD_BYTES`, :data:`INLINE_SAVE_BYTES`), and a
    :class:`trio.Lock` lets only one run at a time: a connection is not safe for
    concurrent use, and one writer per process is all SQLite allows anyway. Worker threads
    are never abandoned on cancellation (a cancelled call waits for its statement to
    finish), so the lock is never released while the connection is still in use.

    Other processes may open the same file: WAL mode lets them read while this one writes,
    writes take the lock up front (``BEGIN IMMEDIATE``) and wait up to ten seconds for it.
    """

    checks_absent_mark: Final = True
    """Its ``save`` takes ``absent_mark``, checked in the save's transaction
    (:func:`~runtime.store.checks_absent_mark`)."""

    keeps_rows: Final = True
    """Its ``save`` takes ``kept`` (:class:`~runtime.store.Store`'s kept rows)."""

    def __init__(
        self, conn: sqlite3.Connection, path: str, identity: tuple[int, int] | None = None
    ) -> None:
        """Wrap an open, verified connection; use :meth:`open` instead. ``identity``:
        the file's device and inode as opened (:meth:`_check_in_place`)."""
        self._conn = conn
        self._path = path
        self._identity = identity
        self._lock = trio.Lock()
        self._closed = False
        self._writers_seen: str | None = None
        """The registry's keys (:meth:`set_writer`) as the last version query read them
        (:data:`_VERSION_SQL`), until :meth:`writers_seen` takes them."""

    @property
    def path(self) -> str:
        return self._path

    @classmethod
    async def open(cls, path: str | os.PathLike[str]) -> SQLiteStore:
        """Open the store at ``path``, creating the file (not its directory) if missing.

        The file must be missing, empty, or an Axon store. Anything else raises
        :class:`~runtime.errors.StoreCorrupt` naming the path, and the file is left
        byte-for-byte as it was: nothing is written until it is known to be ours. A store
        written by a newer schema raises :class:`~runtime.errors.StoreError` (also
        untouched). ``":memory:"`` opens a private in-memory database.
        """
        path = os.fspath(path)
        if not isinstance(path, str) or not path:
            raise StoreError(f"session store path must be a non-empty str path, got {path!r}")
        conn = await trio.to_thread.run_sync(_connect, path)
        identity = None if path == ":memory:" else _file_identity(path)
        return cls(conn, path, identity)

    def _moved(self) -> bool:
        """Whether the store's path no longer names the file this connection has open
        (moved, deleted, or replaced since the open). When nothing is at the path any
        more, the WAL (which lives beside the *name*, ``-wal``) is checkpointed into the
        file through the connection first: what was saved lands in the file wherever it
        was moved to (gone with it if it was deleted), where SQLite's close, seeing the
        file moved, leaves it in a ``-wal`` the moved file never reads. Not when another
        file took the name: that WAL may be its now."""
        if self._identity is None:
            return False
        now = _file_identity(self._path)
        if now == self._identity:
            return False
        if now is None:
            try:
                self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error:
                pass  # (the refusal says what it can; nothing else to do)
        return True

    def _check_in_place(self, action: str) -> None:
        """Refuse a write once the file was moved or deleted while open: SQLite went on
        writing and committing into the WAL beside the old name, every save said saved,
        and the moved file held none of it (not even the turns saved before the move,
        not checkpointed yet): an operator's ``mv sessions.db`` or ``rm`` while ``serve``
        ran lost every turn silently."""
        if self._moved():
            raise StoreError(
                f"session store {self._path}: {action} refused: the file was moved, "
                "deleted or replaced while this process had it open, so nothing more is "
                "written to it; what was saved before is in the file where it was moved "
                "to (lost if it was deleted): open the store again where it is"
            )

    async def _on_loop(self, action: _Action, fn: Callable[..., _T], *args: Any) -> _T | _Large:
        """``fn(*args)`` on the event loop under the store's lock, or :data:`_LARGE` if
        SQLite would have to wait for the file (the caller then asks a thread, which waits).

        ``fn`` does not await, so while it runs nothing else can take the lock: when the
        lock is free it is not taken at all, and the call checks for cancellation instead
        of yielding. A ``trio.Lock``'s acquire is a schedule point (a task step and a
        round of the scheduler more for each of a turn's store calls: the version query,
        the save, the read-back; issue 24 goal 1). While a thread's call holds the lock,
        the call waits for it as before."""
        lock = self._lock
        if lock.locked():
            async with lock:
                return self._now(action, fn, *args)
        await trio.lowlevel.checkpoint_if_cancelled()
        return self._now(action, fn, *args)

    def _now(self, action: _Action, fn: Callable[..., _T], *args: Any) -> _T | _Large:
        """:meth:`_on_loop`'s call itself, with the lock (or its equivalent) held."""
        if self._closed:
            raise StoreError(f"session store {self._path} is closed")
        try:
            return fn(*args)
        except sqlite3.OperationalError as err:
            if (getattr(err, "sqlite_errorcode", None) or 0) & 0xFF not in _BUSY_CODES:
                raise _error(self._path, action, err) from err
            return _LARGE  # busy: a thread waits for it
        except sqlite3.Error as err:
            raise _error(self._path, action, err) from err

    async def _run(self, action: _Action, fn: Callable[..., _T], *args: Any) -> _T:
        async with self._lock:
            if self._closed:
                raise StoreError(f"session store {self._path} is closed")
            try:
                return await trio.to_thread.run_sync(self._waiting, fn, *args)
            except sqlite3.Error as err:
                raise _error(self._path, action, err) from err

    def _waiting(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` (in a worker thread) with SQLite waiting up to ten seconds for
        another process's lock; the connection rests not waiting (see ``_connect``)."""
        conn = self._conn
        conn.execute(f"PRAGMA busy_timeout = {int(_BUSY_TIMEOUT * 1000)}")
        try:
            return fn(*args)
        finally:
            conn.execute("PRAGMA busy_timeout = 0")

    # -- load --------------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session with its messages in index order, or ``None`` if it was never saved.

        Raises :class:`~runtime.errors.StoreCorrupt` naming the session and index if a
        stored message cannot be structured back into a ``Message`` or an index is missing.
        """
        validate_session_id(session_id)
        action = ("load", session_id)
        # Never saved, or small: read on the loop (issue 24: a thread's hand-off and back
        # cost more than the read, see INLINE_LOAD_BYTES); large or busy: a thread.
        record = await self._on_loop(action, self._read, session_id, INLINE_LOAD_BYTES)
        if isinstance(record, _Large):
            return await self._run(action, self._load, session_id)
        return record

    def _load(self, session_id: str) -> SessionRecord | None:
        """The session, read in a worker thread whatever its size."""
        record = self._read(session_id, None)
        assert not isinstance(record, _Large)  # (no limit)
        return record

    def _read(self, session_id: str, limit: int | None) -> SessionRecord | _Large | None:
        """The session, read in one statement (one snapshot: the session row joined to its
        messages); with ``limit`` (on the loop), first its messages' total size (read
        from the rows' headers, not the bodies): ``None`` at once for a
        session never saved, :data:`_LARGE` when the bodies add up to more than
        ``limit`` bytes.

        No ``BEGIN``/``COMMIT`` around them: a statement reads one snapshot by itself, and
        the size is only the choice of where to read (issue 24 goal 1: a never-saved
        session's load was three statements and is one, a small session's five and is
        two)."""
        conn = self._conn
        if limit is not None:
            head = conn.execute(_HEAD_SQL, (session_id,)).fetchone()
            if head is None:
                return None
            if head[0] > limit:
                return _LARGE
        rows = conn.execute(_READ_SQL, (session_id,)).fetchall()
        segments: dict[int, list[tuple[int, bytes]]] = {}
        if any(row[5] is not None and row[5][:_HEAD_LEN] == HEAD_PREFIX for row in rows):
            # a running turn's answer stored in segments: the rows again and the
            # segments, in one read transaction (one snapshot: the turn's last save may
            # write it whole and delete them between two statements)
            conn.execute("BEGIN")
            try:
                rows = conn.execute(_READ_SQL, (session_id,)).fetchall()
                found = conn.execute(_SEGMENTS_SQL, (session_id,)).fetchall()
            finally:
                conn.execute("COMMIT")
            segments = _by_message(found)
        if not rows:
            return None  # (never saved, or deleted since the size was read)
        raw_meta, version, incarnation, first = rows[0][:4]
        if first is None:
            rows = []  # the session row alone: no messages
        elif first != 0:  # (then the meta was not read either)
            raise _missing(self._path, session_id, 0, first)
        meta = decode_meta(self._path, raw_meta, session_id)
        messages = []
        for expected, (_, _, _, idx, role, body) in enumerate(rows):
            if idx != expected:
                raise _missing(self._path, session_id, expected, idx)
            if body is not None and body[:_HEAD_LEN] == HEAD_PREFIX:
                messages.append(
                    decode_folded(self._path, session_id, idx, role, body, segments.get(idx, []))
                )
            else:
                messages.append(decode_message(self._path, session_id, idx, role, body))
        return SessionRecord(
            session_id=session_id,
            messages=tuple(messages),
            meta=meta,
            version=version,
            incarnation=incarnation,
        )

    # -- save --------------------------------------------------------------------------

    async def save(
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        meta: Mapping[str, Any] | None = None,
        *,
        expected_version: int | None = None,
        kept: Collection[int] = (),
        absent_mark: int | None = None,
        grown: Collection[int] = (),
    ) -> int:
        """Replace messages ``start..`` with ``messages`` and merge ``meta``, in one transaction;
        returns the session's new version.

        The messages at positions ``kept`` are in the file as they are already
        (:class:`~runtime.store.Store`'s kept rows): the others before the last kept one
        are written over their rows, the rows from it on are replaced, the kept ones
        are not written (a step's save rewrote every tool result of its turn).

        The transaction upserts the session row (meta merged shallowly, like
        ``dict.update``), deletes the rows with ``idx >= start`` and inserts the new ones;
        rows before ``start`` are not touched. ``start`` may equal the message count
        (append) but not exceed it. Every message is serialized before the transaction
        begins, so a message that cannot be serialized fails the save with
        :class:`~runtime.errors.StoreError` before anything is written; any later failure
        rolls the whole transaction back. Either way the session is as it was.

        With ``expected_version``, the transaction first checks that the session is at
        exactly that version (``0``: it does not exist) and otherwise raises
        :class:`~runtime.errors.StoreConflict`, writing nothing: another process saved the
        session since this one loaded it. The check and the write hold the file's write
        lock together, so no other writer can slip in between.

        With ``absent_mark``, a save that would create the session reads its deletion
        mark in the same transaction (the statement that reads the version) and raises
        :class:`~runtime.errors.SessionDeleted`, writing nothing, when it is above
        (:func:`~runtime.store.checks_absent_mark`): another process's create and delete
        cannot fall between the check and the write.

        The assistant messages at positions ``grown`` extend the ones stored at their
        places (:class:`~runtime.store.Store`'s grown rows): each is written as its head
        and a segment of its new parts (the module's "Grown messages").
        """
        tail, kept_at = kept_tail(session_id, messages, kept, expected_version)
        grew = check_grown(session_id, messages, grown, kept_at, expected_version)
        # (a long history in a worker thread: 600,000 messages took the loop 9 s)
        new, rows = await encoded_off_loop(
            session_id, start, messages, meta, expected_version, kept_at
        )
        meta = storable_meta(session_id, meta)  # fail before the transaction, not inside it
        written = _Written(rows, new, start, frozenset(start + i for i in grew))
        start += tail  # (the rows below it, if any, go over their places: _write)
        action = ("save", session_id)
        if sum(len(row[3]) for row in rows) <= INLINE_SAVE_BYTES:
            version = await self._on_loop(
                action,
                self._save_rows,
                session_id,
                start,
                written,
                meta,
                expected_version,
                absent_mark,
            )
            if not isinstance(version, _Large):
                return version
        return await self._run(
            action,
            self._save_rows,
            session_id,
            start,
            written,
            meta,
            expected_version,
            absent_mark,
        )

    def _save_rows(
        self,
        session_id: str,
        start: int,
        written: _Written,
        meta: Mapping[str, Any] | None,
        expected_version: int | None,
        absent_mark: int | None = None,
    ) -> int:
        """The save's transaction. On the event loop SQLite does not wait for the write
        lock: another process holding it raises ``SQLITE_BUSY`` before anything is
        written, and the caller retries in a worker thread, which waits (``_waiting``)."""
        self._check_in_place(f"save of session {session_id!r}")
        now = time.time()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = self._write(
                conn, session_id, start, written, meta, expected_version, now, absent_mark
            )
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
        return version

    def _write(
        self,
        conn: sqlite3.Connection,
        session_id: str,
        start: int,
        written: _Written,
        meta: Mapping[str, Any] | None,
        expected_version: int | None,
        now: float,
        absent_mark: int | None = None,
    ) -> int:
        """The save's statements, inside its transaction: check the version and
        ``start``, upsert the session row with the merged meta and the next version,
        replace the messages from ``start`` on (rows below it, a save's kept rows'
        neighbours, go over theirs); the new version."""
        raw_meta, current, deleted, count, schema, mark, segmented = conn.execute(
            _BEFORE_SAVE_SQL, (session_id,)
        ).fetchone()
        if schema != _SCHEMA_TEXT:
            raise _schema_moved(self._path, schema)
        stored = raw_meta is not None  # (meta is NOT NULL: none, no session row)
        if not stored:
            current = 0
        check_version(self._path, session_id, current, expected_version)
        if not stored and absent_mark is not None:
            deleted_since(session_id, mark or 0, absent_mark)
        # A re-created session starts above every version a deleted one had, so a
        # writer still holding the deleted session's version cannot match it.
        version = current + 1 if stored else (0 if deleted is None else int(deleted)) + 1
        if start > count:  # a save may append (start = the count) but leave no hole
            raise StoreError(
                f"save of session {session_id!r}: start {start} is beyond its end "
                f"({count} messages)"
            )
        merged = decode_meta(self._path, raw_meta, session_id) if stored else {}
        if meta:
            merged.update(meta)
        _upsert_session(conn, session_id, merged, version, now)
        rows = written.rows()
        segments: list[tuple[str, int, int, bytes]] = []
        fresh: list[int] = []  # rows becoming heads: their segments (none, or stale) go
        heads: set[int] = set()  # the rows written as heads
        if written.grown:
            rows = _grow(conn, session_id, rows, written, count, segments, fresh, heads)
        # The tail from ``start`` replaces the session's: rows past its end go, the rows
        # it has a place for are written over theirs (as those before the kept ones
        # are), the rest inserted. A decision rewrites the waiting message, the last
        # row: one statement, where deleting it and inserting it again were two.
        end = start + sum(1 for row in rows if row[1] >= start)
        if segmented is not None:  # a message written whole, or deleted: its segments go
            gone = [
                (session_id, row[1])
                for row in rows
                if row[1] <= segmented and (row[1] not in heads or row[1] in fresh)
            ]
            if gone:
                conn.executemany(
                    "DELETE FROM message_segments WHERE session_id = ? AND idx = ?", gone
                )
            if end <= segmented:
                conn.execute(
                    "DELETE FROM message_segments WHERE session_id = ? AND idx >= ?",
                    (session_id, end),
                )
            if not heads:  # no running answer of this save's: any head left is a dead one's
                _fold_heads(conn, self._path, session_id)
        if end < count:
            conn.execute(
                "DELETE FROM messages WHERE session_id = ? AND idx >= ?", (session_id, end)
            )
        over = 0
        while over < len(rows) and rows[over][1] < count:
            over += 1
        if over:
            conn.executemany(
                """UPDATE messages SET role = ?3, body = ?4, message_id = ?5
                WHERE session_id = ?1 AND idx = ?2""",
                rows[:over],
            )
        conn.executemany(
            """INSERT INTO messages (session_id, idx, role, body, message_id)
            VALUES (?, ?, ?, ?, ?)""",
            rows[over:],
        )
        if segments:
            conn.executemany(
                "INSERT OR REPLACE INTO message_segments (session_id, idx, first, body) "
                "VALUES (?, ?, ?, ?)",
                segments,
            )
        return version

    # -- version -------------------------------------------------------------------------

    async def version(self, session_id: str) -> int:
        """The session's version (``0`` if it does not exist): one primary-key lookup.

        Every turn starts with this, so it runs on the calling thread when it can: a read
        of a WAL database does not wait for writers, and the lookup takes microseconds,
        where handing it to a worker thread and back costs a few hundred (issue 24: the
        turn's fixed cost). SQLite is told not to wait at all; should the read be busy
        (a checkpoint or a recovery holding the file), it goes to a thread as every other
        call does, and waits there."""
        validate_session_id(session_id)
        action = ("version", session_id)
        version = await self._version_on_loop(action, session_id)
        if version is not None:
            return version
        return await self._run(action, self._version, session_id)

    def version_now(self, session_id: str) -> int | None:
        """The session's version, read on the calling thread without waiting (no await:
        no schedule point either), or ``None`` when that would wait: while a thread's
        call holds the connection, or the file is busy. For a caller that bounds only a
        wait (the turn runner's query before a turn, issue 24 goal 1)."""
        validate_session_id(session_id)
        if self._lock.locked():
            return None
        version = self._now(("version", session_id), self._version_without_waiting, session_id)
        return None if isinstance(version, _Large) else version

    async def _version_on_loop(self, action: _Action, session_id: str) -> int | None:
        """The session's version looked up on the calling thread, or ``None`` if that
        read would have to wait (the caller then asks a thread, which waits)."""
        version = await self._on_loop(action, self._version_without_waiting, session_id)
        return None if isinstance(version, _Large) else version

    def _version_without_waiting(self, session_id: str) -> int:
        """:meth:`_version` on the event loop: the connection rests not waiting, so a
        busy file raises ``SQLITE_BUSY`` at once."""
        return self._version(session_id)

    def _version(self, session_id: str) -> int:
        version, self._writers_seen = self._conn.execute(_VERSION_SQL, (session_id,)).fetchone()
        return version or 0

    # -- user message ids ----------------------------------------------------------------

    async def has_user_messages(self, session_id: str, ids: Collection[str]) -> frozenset[str]:
        """Which of ``ids`` are the ids of the session's stored user messages
        (:func:`runtime.store.has_user_messages`): one statement on the index of the user
        messages' ids (``user_messages_by_id``), a probe an id asked, whatever the
        session's length, where it read the whole session. A stored user message whose
        id the upgrade to schema 5 could not read from its body (``NULL``: a damaged row)
        makes it read the session the long way, as before (its load says what is wrong).
        On the calling thread when it need not wait, as :meth:`version`."""
        validate_session_id(session_id)
        wanted = sorted(frozenset(ids))
        if not wanted:
            return frozenset()
        action = ("user message ids", session_id)
        found: Any = _LARGE
        if len(wanted) <= _IDS_ON_LOOP:
            found = await self._on_loop(action, self._user_ids, session_id, wanted)
        if isinstance(found, _Large):
            found = await self._run(action, self._user_ids, session_id, wanted)
        if None in found:
            record = await self.load(session_id)
            messages = record.messages if record is not None else ()
            asked = frozenset(wanted)
            return frozenset(m.id for m in messages if m.role == "user" and m.id in asked)
        return frozenset(found)

    def _user_ids(self, session_id: str, wanted: list[str]) -> set[str | None]:
        """The ids of ``wanted`` the session's user messages have, and ``None`` if one of
        them has no id recorded; in statements of at most :data:`_IDS_A_STATEMENT` ids."""
        conn = self._conn
        found: set[str | None] = set()
        for at in range(0, len(wanted), _IDS_A_STATEMENT):
            part = wanted[at : at + _IDS_A_STATEMENT]
            sql = _HAS_USER_MESSAGES_SQL.format(asked=", ".join("?" * len(part)))
            found.update(row[0] for row in conn.execute(sql, (session_id, *part)))
        return found

    # -- deletion marks ------------------------------------------------------------------

    async def deletions(self, session_id: str) -> int:
        """How many times the session was deleted (its deletion mark, see
        :class:`~runtime.store.Store`): one primary-key lookup, ``0`` if never."""
        return (await self.version_and_deletions(session_id))[1]

    async def version_and_deletions(self, session_id: str) -> tuple[int, int]:
        """:meth:`version` and :meth:`deletions` in one statement (one snapshot): what a
        turn of a session its host holds nothing stored of reads in place of the version
        alone; on the calling thread when it need not wait, as :meth:`version`."""
        validate_session_id(session_id)
        action = ("version", session_id)
        got = await self._on_loop(action, self._version_and_deletions, session_id)
        if not isinstance(got, _Large):
            return got
        return await self._run(action, self._version_and_deletions, session_id)

    def version_and_deletions_now(self, session_id: str) -> tuple[int, int] | None:
        """:meth:`version_and_deletions` read on the calling thread without waiting, or
        ``None`` when that would wait (as :meth:`version_now`)."""
        validate_session_id(session_id)
        if self._lock.locked():
            return None
        got = self._now(("version", session_id), self._version_and_deletions, session_id)
        return None if isinstance(got, _Large) else got

    def _version_and_deletions(self, session_id: str) -> tuple[int, int]:
        version, count, self._writers_seen = self._conn.execute(
            _VERSION_MARK_SQL, (session_id,)
        ).fetchone()
        return version or 0, count or 0

    # -- the hosts writing the file -------------------------------------------------------

    async def writers(self) -> dict[str, str]:
        """The hosts that said they write this file (:meth:`set_writer`): each one's name
        and what it stored (:mod:`runtime.app.writers`). A primary-key range of
        ``axon_meta``; on the calling thread when it need not wait, as :meth:`version`."""
        got = await self._on_loop("writers", self._writers)
        if isinstance(got, _Large):
            return await self._run("writers", self._writers)
        return got

    def writers_seen(self) -> list[str] | None:
        """Two names of the registry at most, as the last version query read them (every turn
        makes one as it starts), taken: ``None`` when none was read since the last
        taking (:meth:`writers_now` then reads them)."""
        seen, self._writers_seen = self._writers_seen, None
        if seen is None:
            return None
        return [key[len(_WRITER_PREFIX) :] for key in seen.split()]

    def writers_now(self) -> dict[str, str] | None:
        """:meth:`writers` read on the calling thread without waiting, or ``None`` when
        that would wait (as :meth:`version_now`): what a turn reads before its first
        model call on a host that has not seen another writer (one key's range, no write)."""
        if self._lock.locked():
            return None
        got = self._now("writers", self._writers)
        return None if isinstance(got, _Large) else got

    def _writers(self) -> dict[str, str]:
        rows = self._conn.execute(_WRITERS_SQL).fetchall()
        return {key[len(_WRITER_PREFIX) :]: value for key, value in rows}

    async def set_writer(self, name: str, value: str | None, *, drop: Collection[str] = ()) -> None:
        """Store host ``name``'s row (``None``: remove it) and remove the rows of
        ``drop`` (hosts found gone), in one transaction."""
        await self._run("writers", self._set_writer, name, value, tuple(drop))

    def _set_writer(self, name: str, value: str | None, drop: tuple[str, ...]) -> None:
        self._check_in_place("the hosts' registry")
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "DELETE FROM axon_meta WHERE key = ?",
                [(_WRITER_PREFIX + gone,) for gone in (*drop, *(() if value else (name,)))],
            )
            if value is not None:
                conn.execute(
                    """INSERT INTO axon_meta (key, value) VALUES (?, ?)
                    ON CONFLICT (key) DO UPDATE SET value = excluded.value""",
                    (_WRITER_PREFIX + name, value),
                )
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    # -- list, delete, close -------------------------------------------------------------

    async def list_sessions(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[SessionInfo]:
        """The sessions with their message counts and meta, most recently saved first: all,
        or ``limit`` of them after the cursor ``after`` (the ``update_seq`` a
        :class:`SessionInfo` carries). A page is a range of ``sessions_by_update`` read
        backwards from the cursor (no sort); its message counts are counted for its rows
        only."""
        below = None if after is None else parse_cursor(after)
        limit = check_limit(limit)
        return await self._run("list_sessions", self._list, below, limit)

    def _list(self, below: int | None, limit: int | None) -> list[SessionInfo]:
        rows = self._conn.execute(
            _LIST_SQL if below is None else _LIST_AFTER_SQL,
            (-1 if limit is None else limit,) if below is None else (below, limit or -1),
        ).fetchall()
        return [
            SessionInfo(
                session_id=session_id,
                message_count=count,
                meta=decode_meta(self._path, meta, session_id),
                cursor=str(seq),
            )
            for session_id, meta, count, seq in rows
        ]

    async def delete(self, session_id: str) -> None:
        """Delete the session and its messages, and the sub-sessions it owns, at any depth
        (its agent tools' calls', :mod:`actors.stores.owned`), in one transaction;
        deleting an unknown session is a no-op."""
        validate_session_id(session_id)
        await self._run(f"delete of session {session_id!r}", self._delete, session_id)

    def _delete(self, session_id: str) -> None:
        self._check_in_place(f"delete of session {session_id!r}")
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                """SELECT version,
                    (SELECT value FROM axon_meta WHERE key = 'schema_version')
                FROM (SELECT 1) LEFT JOIN sessions ON session_id = ?""",
                (session_id,),
            ).fetchone()
            if row[1] != _SCHEMA_TEXT:
                raise _schema_moved(self._path, row[1])
            # with the sub-sessions it owns, any depth (actors.stores.owned), all in
            # this transaction: a sub-session is never left without its caller
            for sid in owned_sessions(session_id, lambda caller: _sub_candidates(conn, caller)):
                _delete_one(conn, sid)
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise

    def _close(self) -> None:
        self._moved()  # (its checkpoint, if the file was moved away: SQLite's close skips it)
        self._conn.close()

    async def aclose(self) -> None:
        """Close the connection (checkpointing the WAL into the file); idempotent.

        Waits for a call in progress to finish; calls made afterwards raise
        :class:`~runtime.errors.StoreError`.
        """
        async with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                await trio.to_thread.run_sync(self._close)
            except sqlite3.Error as err:
                raise _error(self._path, "close", err) from err
