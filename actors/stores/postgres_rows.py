"""A PostgreSQL store's session rows: the statements that read a session's messages
(:func:`load_rows`, its last turn, its listing page, its sub-sessions) and write them
(:func:`_replace_messages`), and PostgreSQL's binary format of the saves' arrays and of
the event loop's answers (:func:`read_row`), for
:class:`~actors.stores.postgres.PostgresStore` and the turn queue."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from actors.stores.owned import UNREADABLE_CALLER
from actors.stores.postgres_calls import FOLDED_BODY, SESSION_COLUMNS
from actors.stores.postgres_tables import MESSAGE_ID_FUNCTION
from runtime.errors import StoreError
from runtime.history import run_long_off_loop
from runtime.json_exact import dumps

_INT4, _TEXT, _BYTEA = 23, 25, 17
"""The element types' oids of the save's arrays."""
_int4 = struct.Struct("!i").pack


_ARRAY_HEAD = struct.Struct("!iiiii").pack


_FLOAT8 = struct.Struct("!d").unpack
_SIGNED_BIG_ENDIAN = functools.partial(int.from_bytes, byteorder="big", signed=True)
"""An ``INTEGER`` (4 bytes) or ``BIGINT`` (8) in the binary format: a C call, as
``bytes.decode`` for a ``TEXT`` and ``bytes`` for a ``BYTEA`` are, not a Python one a
column (a claim's and a last save's answers are ~15 columns, two a worker's turn:
issue 24 goal 3)."""
_READ_BINARY: Final[dict[str, Callable[[bytes], Any]]] = {
    "TEXT": bytes.decode,
    "BIGINT": _SIGNED_BIG_ENDIAN,
    "INTEGER": _SIGNED_BIG_ENDIAN,
    "BOOLEAN": lambda value: value == b"\x01",
    "DOUBLE PRECISION": lambda value: _FLOAT8(value)[0],
    "BYTEA": bytes,
}
"""A column in PostgreSQL's binary format, by its type, read as psycopg reads it."""


def read_row(result: Any, row: int, kinds: Sequence[str], at: int = 0) -> tuple[Any, ...]:
    """Row ``row`` of a :class:`LoopLane` result in the binary format, its columns from
    ``at`` on of types ``kinds`` (:data:`_READ_BINARY`'s)."""
    values = []
    for col, kind in enumerate(kinds, at):
        value = result.get_value(row, col)
        values.append(None if value is None else _READ_BINARY[kind](value))
    return tuple(values)


def _binary_array(oid: int, items: list[bytes]) -> bytes:
    """A one-dimensional array of ``items`` (each already in its binary format) in
    PostgreSQL's binary format: what psycopg's list dumper writes, without its look at
    every element for their type."""
    if not items:
        return struct.pack("!iii", 0, 0, oid)
    return _ARRAY_HEAD(1, 0, oid, len(items), 1) + b"".join(
        [_int4(len(item)) + item for item in items]
    )


def _arrays(rows: list[tuple[str, int, str, bytes]]) -> tuple[bytes, bytes, bytes]:
    """The indexes, roles and bodies of ``rows`` as three arrays in the binary format:
    the parameters of a save function's call."""
    ids, roles, bodies = _columns(rows)
    return (
        _binary_array(_INT4, [_int4(i) for i in ids]),
        _binary_array(_TEXT, [role.encode() for role in roles]),
        _binary_array(_BYTEA, bodies),
    )


def segment_arrays(
    fresh: list[int], segments: list[tuple[int, int, bytes]]
) -> tuple[bytes | None, bytes | None, bytes | None, bytes | None]:
    """A grown save's segments as the save function's parameters (``p_fresh``,
    ``p_seg_idx``, ``p_seg_first``, ``p_seg_bodies``), arrays in the binary format;
    ``None`` for none (the function then runs no statement for them)."""
    if not segments:
        seg: tuple[bytes | None, bytes | None, bytes | None] = (None, None, None)
    else:
        seg = (
            _binary_array(_INT4, [_int4(s[0]) for s in segments]),
            _binary_array(_INT4, [_int4(s[1]) for s in segments]),
            _binary_array(_BYTEA, [s[2] for s in segments]),
        )
    return (_binary_array(_INT4, [_int4(i) for i in fresh]) if fresh else None, *seg)


async def _arrays_off_loop(rows: list[tuple[str, int, str, bytes]]) -> tuple[bytes, bytes, bytes]:
    """:func:`_arrays`, in a worker thread for more than
    :data:`~runtime.history.OFF_LOOP_MESSAGES` rows (600,000 took the loop 1.3 s)."""
    return await run_long_off_loop(len(rows), _arrays, rows)


def kept_cursor(conn: Any) -> Any:
    """A cursor kept on ``conn`` for the statements every turn sends (a save's lock and
    write, the finish in a last save, the claim): ``conn.execute`` makes a cursor per
    statement, which sets up its adapters and looks its parameters' dumpers up again; a
    kept one has them. Only for a statement whose result is read at once: the next one
    on the cursor replaces it. A connection serves one thread at a time (the pool's), so
    its cursor does too; a closed connection's cursor is closed, and replaced."""
    cursor = getattr(conn, "_axon_cursor", None)
    if cursor is None or cursor.closed:
        cursor = conn._axon_cursor = conn.cursor()
    return cursor


def _beyond_end(session_id: str, start: int, count: int) -> None:
    raise StoreError(
        f"save of session {session_id!r}: start {start} is beyond its end ({count} messages)"
    )


_INSERT_ROWS = """INSERT INTO axon_messages (session_id, idx, role, body)
    SELECT %s, u.idx, u.role, u.body
    FROM unnest(%b::int[], %b::text[], %b::bytea[]) AS u(idx, role, body)"""
"""The messages of a save, all in one statement (arrays of index, role, body). The arrays
go in PostgreSQL's binary format (``%b``): in the text format each body was hex-encoded,
then quoted and escaped by a regular expression, in Python (a few percent of a worker's
CPU, more for long messages; issue 24); in binary a body is its bytes."""


def _columns(rows: list[tuple[str, int, str, bytes]]) -> tuple[list[int], list[str], list[bytes]]:
    return [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]


def _replace_messages(
    conn: Any,
    session_id: str,
    start: int,
    meta: dict[str, Any],
    rows: list[tuple[str, int, str, bytes]],
) -> int:
    """Replace the (locked) session's messages from ``start`` on with ``rows`` and write
    its merged meta, its next version and place in recency order, all in one statement
    (it was two: the delete, then the update with the insert); the new version.

    Messages past the new ones are deleted, the new ones inserted (rows below ``start``
    too: a save's kept rows lie between them and ``start``), or written over where
    their index is taken (``ON CONFLICT``: the statement's parts all see the rows as they
    were before it, so deleting ``start..`` and inserting the same keys in one statement
    would collide). A hole is refused: a save may append (``start`` = the message count)
    but not beyond, so message ``start - 1`` must be there, and the session's row is
    updated only if it is; otherwise the caller's transaction rolls back what the
    statement's other parts wrote."""
    ids, roles, bodies = _columns(rows)
    cursor = kept_cursor(conn)
    got = cursor.execute(
        f"""WITH gone AS (
            DELETE FROM axon_messages WHERE session_id = %s AND idx >= %s
        ), m AS ({_INSERT_ROWS}
            ON CONFLICT (session_id, idx) DO UPDATE SET role = excluded.role, body = excluded.body
        )
        UPDATE axon_sessions SET meta = %s, updated_at = now(),
            update_seq = nextval('axon_update_seq'),
            version = nextval('axon_versions')
        WHERE session_id = %s AND (%s = 0 OR EXISTS (
            SELECT 1 FROM axon_messages WHERE session_id = %s AND idx = %s - 1))
        RETURNING version""",
        (
            session_id,
            start + sum(1 for idx in ids if idx >= start),
            session_id,
            ids,
            roles,
            bodies,
            dumps(meta),  # (an integer past 64 bits exactly)
            session_id,
            start,
            session_id,
            start,
        ),
    ).fetchone()
    if got is None:
        # Every message there was is below ``start`` (there is none at ``start - 1``),
        # so the statement left them all alone: the count is theirs.
        (count,) = conn.execute(
            "SELECT coalesce(max(idx) + 1, 0) FROM axon_messages "
            "WHERE session_id = %s AND idx < %s",
            (session_id, start),
        ).fetchone()
        _beyond_end(session_id, start, count)
    return int(got[0])


def load_rows(conn: Any, session_id: str) -> list[Any]:
    """A session's row and its messages, from one snapshot in one statement (a session
    without messages is one row of NULLs): :meth:`PostgresStore.record` decodes them.
    The turn queue runs it in a claim's transaction too."""
    return list(
        conn.execute(
            f"""SELECT s.meta, s.version, m.idx, m.role, {FOLDED_BODY}, s.incarnation
            FROM axon_sessions AS s
            LEFT JOIN axon_messages AS m ON m.session_id = s.session_id
            WHERE s.session_id = %s ORDER BY m.idx""",
            (session_id,),
        ).fetchall()
    )


def _sub_candidates(conn: Any, caller: str) -> list[tuple[str, Any]]:
    """The stored sessions that may be ``caller``'s sub-sessions, with their meta: those
    whose ``caller`` column (kept by the database from their meta,
    :data:`~actors.stores.postgres_tables.CALLER_FUNCTION`) names it, or says their meta
    could not be read there; a lookup of ``axon_sessions_by_caller``. No message is read:
    the calls' ids in the caller's assistant messages were read and decoded before, all
    of them, at each delete."""
    rows = conn.execute(
        "SELECT session_id, meta FROM axon_sessions WHERE caller = ANY(%s)",
        ([caller, UNREADABLE_CALLER],),
    ).fetchall()
    return [(sid, bytes(meta)) for sid, meta in rows]


_HAS_USER_MESSAGES_SQL: Final = f"""SELECT asked.id FROM unnest(%(ids)s::text[]) AS asked(id),
LATERAL (SELECT FROM axon_messages WHERE session_id = %(session)s AND role = 'user'
    AND {MESSAGE_ID_FUNCTION}(body) = asked.id LIMIT 1) AS stored
UNION ALL SELECT NULL FROM (SELECT FROM axon_messages WHERE session_id = %(session)s
    AND role = 'user' AND {MESSAGE_ID_FUNCTION}(body) IS NULL LIMIT 1) AS unreadable"""
"""The ids asked that the session's stored user messages have, and ``NULL`` when one of
their bodies has no id the index could read: a lookup of the partial index
``(session_id, id) WHERE role = 'user'`` for each id, and one for ``NULL`` (the query's
own ``role = 'user'``, the same literal, lets the planner use it). One lookup an id, not
``= ANY(ids)`` nor an ``OR``: for those the planner scanned all the session's user rows
on the index, filtering them, where it believed the session short (a table not analyzed
yet: 151 pages for 1,000 messages) (:meth:`PostgresStore.has_user_messages`)."""
_LAST_TURN_SQL: Final = f"""SELECT s.meta, s.version, m.idx, m.role, {FOLDED_BODY}
FROM axon_sessions AS s
LEFT JOIN axon_messages AS m ON m.session_id = s.session_id AND m.idx >= coalesce(
    (SELECT a.idx FROM axon_messages AS a
     WHERE a.session_id = $1 AND a.role = 'assistant' ORDER BY a.idx DESC LIMIT 1), 0)
WHERE s.session_id = $1 ORDER BY m.idx""".encode()
"""A session's row and its messages from its last assistant message on (all of them when
it has none), in one statement (one snapshot): :meth:`PostgresStore.load_last_turn`, in
:func:`load_rows`'s columns; the assistant message found backwards on the messages'
primary key, a row or a few."""
_LAST_TURN_NAME: Final = b"axon_last_turn_read"
_LAST_TURNS_SQL: Final = f"""SELECT s.meta, s.version, m.idx, m.role, {FOLDED_BODY}
FROM axon_sessions AS s
LEFT JOIN axon_messages AS m ON m.session_id = s.session_id AND m.idx >= coalesce(
    (SELECT a.idx FROM axon_messages AS a
     WHERE a.session_id = $1 AND a.role = 'assistant' ORDER BY a.idx DESC
     LIMIT 1 OFFSET $2::bigint), 0)
WHERE s.session_id = $1 ORDER BY m.idx""".encode()
""":data:`_LAST_TURN_SQL` from the session's ``$2 + 1``-th last assistant message on:
:meth:`PostgresStore.load_last_turns`."""
_LAST_TURNS_NAME: Final = b"axon_last_turns_read"
_SESSION_KINDS: Final = tuple(kind for _, kind in SESSION_COLUMNS)


def _last_turn_rows(result: Any) -> list[tuple[Any, ...]]:
    """The rows of a :data:`_LAST_TURN_SQL` answer (binary format)."""
    return [read_row(result, i, _SESSION_KINDS) for i in range(result.ntuples)]


_LIST_PAGE = """SELECT p.session_id, p.meta,
        (SELECT coalesce(max(m.idx) + 1, 0) FROM axon_messages AS m
            WHERE m.session_id = p.session_id),
        p.update_seq
    FROM (SELECT session_id, meta, update_seq FROM axon_sessions {where}
        ORDER BY update_seq DESC LIMIT %s) AS p
    ORDER BY p.update_seq DESC"""
_LIST_SQL = _LIST_PAGE.format(where="")
_LIST_AFTER_SQL = _LIST_PAGE.format(where="WHERE update_seq < %s")
"""A page of the session listing: the top ``limit`` sessions (all, with ``NULL``) below
the cursor's ``update_seq`` in the inner query, whose messages alone the outer one
counts: as the highest index plus one, one probe of the messages' primary key (a save
leaves no hole, a load checks it), where ``count(*)`` read every message's index entry,
so a page of long sessions cost their length (a 1,000-message one 25 buffers, now 4).
``update_seq`` comes from one sequence, so it orders the sessions without ties.
Without an index on it (this schema's, see postgres_tables) the inner query is a scan
kept to a top-``limit`` heap; with one (``axon_sessions_by_update``, which stores created
before that schema still have) it is a backward index range scan."""
