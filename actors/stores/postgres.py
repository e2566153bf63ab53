"""A :class:`~runtime.store.Store` in PostgreSQL, shared by any number of processes.

Layout (in one schema, ``public`` unless the URL says ``?schema=NAME``; schema version 1)::

    axon_meta(key TEXT PRIMARY KEY, value TEXT)          -- magic, schema_version,
                                                         -- writer:<host> (set_writer)
    axon_sessions(session_id TEXT PRIMARY KEY, meta BYTEA,   -- meta: a JSON object
                  created_at, updated_at TIMESTAMPTZ,
                  update_seq BIGINT,                     -- recency order (a sequence)
                  version BIGINT,                        -- bumped by every save
                  incarnation BIGINT,                    -- version of its first save
                  caller TEXT)                           -- the caller its meta names
    axon_sessions_by_caller ON axon_sessions (caller)    -- sub-sessions at a delete
    axon_sessions_by_code_point ON axon_sessions         -- the ids in code point order
        ((session_id COLLATE "C"))                       -- (an older version's delete)
    axon_messages(session_id, idx, role, body BYTEA,     -- serde JSON of one Message
                  PRIMARY KEY (session_id, idx))
    axon_deletions(session_id TEXT PRIMARY KEY,          -- the deletion marks: grows
                   deletions BIGINT)                     -- with each delete of the id
    axon_message_segments(session_id, idx, first,        -- a running turn's answer's
                   body BYTEA)                           -- parts: "Grown messages"
    axon_turns(...)                                      -- durable turns: stores/turns.py
    axon_held_stops(session_id, message_id, reason,      -- stops before their message's
                    held_at)                             -- POST: stores/turn_submit.py
    axon_claim_v5(owner, lease, channel, token)          -- a claim in one call: CLAIM_FUNCTION
    axon_save_v8(session, start, ...)                    -- a save in one call: SAVE_FUNCTION
    axon_decide_v4(turn, complete, session, ...)         -- a decision's save: DECIDE_FUNCTION
    axon_save_next_v8(session, start, ..., token)        -- a last save and the next claim
    axon_submit_v4(session, turn, key, ...)              -- a front end's submit: SUBMIT_FUNCTION
    (and the versions before them, which processes of before call: postgres_calls.py)

One message is one row keyed by its index, as in the SQLite store: :meth:`save` deletes
the rows from ``start`` on and inserts the new ones in one transaction, so persisting
turn 500 costs what turn 1 does. Bodies are ``bytea``, not ``jsonb``: a message may hold
``\\u0000``, which ``jsonb`` refuses, and nothing queries inside a body.

**Grown messages.** A running turn's answer holds every step's parts and each step's
save sends it again (:class:`~runtime.store.Store`'s grown rows): written whole, a turn
of n steps wrote n(n+1)/2 steps' parts. One of at least :data:`GROWN_FROM_BYTES` is
written as its head (its fields, ``content`` as ``{"parts": N}``) over its row and a
segment of its new parts in ``axon_message_segments``, in the save's one call (the
save function takes the segments: ``axon_save_v8``) or its transaction (a guard's);
the first from part 0, the next ones on top of what this store's last save of the
session left (at the version it left). Every read of bodies folds them in its statement
(:data:`~actors.stores.postgres_calls.FOLDED_BODY`: one snapshot), and so does the
claim's function's read of a continuation's session. The turn's last save writes the
answer whole. Any save that writes no head compacts the session in its commit, when it
holds segments (the save's lock of the session's row reads that): each head left is
written whole, folded as a read folds it, and every segment of the session deleted. So
a turn killed mid-answer (its last save never came) has its head written whole by the
session's next save, a takeover's or the next turn's, whichever process makes it, and
the segments a whole save of another process left beside its rows go (a save in a
transaction, a guard's: at a turn's last save, or when this store segmented the
session). A process of before this table reads a head as a damaged row (its
``content`` is no list of parts), never as an answer without its parts; its saves
write whole rows (the segments they leave behind are read by nothing, and dropped as
above or with the session). In a fleet of both versions (a rolling deploy) a process
of the version before calls its own functions (``axon_save_v7`` and
``axon_save_next_v7``, which dropped only the segments no head holds, and only for a
session its own store segmented; ``axon_save_v6``, ``axon_claim_v4``,
``axon_save_next_v6`` before them: all kept): it writes heads and segments as before
and reads them folded; the heads either writes are the same rows, so each appends to
or reads the other's, and a save of either version moves the session's version, so
neither appends to a head the other wrote whole.

**Versions.** Every save takes its new version from one database-wide sequence, so a
session never has a version it had before, even after being deleted and re-created (the
version rule of :class:`~runtime.store.Store`). The check against ``expected_version``
and the bump happen in the save's transaction, under ``SELECT ... FOR UPDATE`` of the
session row (or the insert's unique key, for a new session). A new session row records
its first version as its ``incarnation`` (a trigger, in the insert's statement), which
:meth:`load` reports: a re-created session's is above every version the deleted one had
(:attr:`~runtime.store.SessionRecord.incarnation`).

**Fences.** A worker running a durable turn registers a :class:`Fence` for the turn's
session (:meth:`PostgresStore.fenced`); every save of that session then also checks,
inside the same transaction, that the turn is still ``running`` under that
``(owner, epoch)``. A worker that lost its lease (another took the turn over) has its
saves refused with :class:`~runtime.errors.LeaseLost` and writes nothing.

**Under Trio.** Psycopg 3's async API runs on asyncio only, so each call runs psycopg's
sync API in a worker thread (:func:`trio.to_thread.run_sync`) with a connection from a
``psycopg_pool.ConnectionPool``, through a :class:`trio.CapacityLimiter` as large as the
pool: no thread ever waits for a connection, and a cancelled call waits for its
transaction to end, so a save is all or nothing. The calls every turn makes, each one
statement (a save without a guard: :data:`SAVE_FUNCTION`; a claim's common case), go
from the event loop itself instead (:class:`LoopLane`: libpq's non-blocking API on
connections of their own), shielded from cancellation the same way.

**Failures.** A connection that breaks (the server restarts, the network drops) fails the
transaction, which PostgreSQL rolls back; the call is retried with backoff for
``retry_for`` seconds and then raises :class:`~runtime.errors.StoreUnavailable`. A save
whose COMMIT was sent but whose answer was lost is retried too: its ``expected_version``
then no longer matches, and the persister's rebase (by message id) puts each message
in the session exactly once.

**Its parts.** The schema's DDL is in :mod:`actors.stores.postgres_tables`, the
server-side functions of a turn's calls in :mod:`actors.stores.postgres_calls`, the
schema's creation and upgrade on open in :mod:`actors.stores.postgres_schema`, the event
loop's connections in :mod:`actors.stores.postgres_lane`, the URL's parsing in
:mod:`actors.stores.postgres_url`, the connections' health and the retries in
:mod:`actors.stores.postgres_health`, the statements and binary formats of a session's
rows in :mod:`actors.stores.postgres_rows`, and the fences (their checks, and the store's
keeping of them: :class:`FenceKeeping`) in :mod:`actors.stores.postgres_fences`; this
module is the store itself (its pool, transactions and saves). The names callers import
from it stay importable here (``import X as X`` re-exports one it does not use itself).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Final, TypeVar

import trio

from actors.stores.owned import owned_sessions
from actors.stores.postgres_calls import (
    DECIDE_FUNCTION_NAME,
    SAVE_FUNCTION_NAME,
    SAVE_NEXT_FUNCTION_NAME,
    SAVE_NEXT_KINDS,
    STATUS_KINDS,
    compact_segments_sql,
)
from actors.stores.postgres_fences import (
    _MARK_TURN,
    _SHARE_TURN,
    Fence,
    FenceKeeping,
    LockedSession,
    Suspend,
    _check_fence,
    _check_fence_row,
    _own_write,
    decision_written,
)
from actors.stores.postgres_fences import ENDED_REMEMBERED as ENDED_REMEMBERED
from actors.stores.postgres_fences import LOCK_SESSION as LOCK_SESSION
from actors.stores.postgres_fences import RidingClaim as RidingClaim
from actors.stores.postgres_health import CHECK_IDLE as CHECK_IDLE
from actors.stores.postgres_health import (
    IDLE_SESSION_TIMEOUT,
    FreeLimiter,
    _alive,
    _close_if_read_only,
    _found_closed,
    _note_idle_session_timeout,
    _quiet_expected_discards,
    _retrying,
    _used,
)
from actors.stores.postgres_health import _idle_limits as _idle_limits
from actors.stores.postgres_lane import CONNECT_TIMEOUT, LoopLane, set_session
from actors.stores.postgres_rows import (
    _HAS_USER_MESSAGES_SQL,
    _INSERT_ROWS,
    _LAST_TURN_NAME,
    _LAST_TURN_SQL,
    _LAST_TURNS_NAME,
    _LAST_TURNS_SQL,
    _LIST_AFTER_SQL,
    _LIST_SQL,
    _arrays_off_loop,
    _beyond_end,
    _columns,
    _last_turn_rows,
    _replace_messages,
    _sub_candidates,
    kept_cursor,
    load_rows,
    read_row,
    segment_arrays,
)
from actors.stores.postgres_schema import (
    _first_connect,
)
from actors.stores.postgres_url import POOLER_HINT as POOLER_HINT
from actors.stores.postgres_url import (
    _split_url,
    parse_listen,
    redact_url,
)
from actors.stores.postgres_url import parse_pooler as parse_pooler
from actors.stores.postgres_url import parse_url as parse_url
from actors.stores.validation import (
    HEAD_PREFIX,
    check_grown,
    check_limit,
    check_version,
    decode_message,
    decode_meta,
    deleted_since,
    encode_meta,
    encoded_off_loop,
    kept_tail,
    parse_cursor,
    split_grown,
)
from runtime import serde
from runtime.errors import (
    SESSION_DELETED,
    ConfigurationError,
    LeaseLost,
    SessionDeleted,
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
)
from runtime.history import run_long_off_loop
from runtime.logging import get_logger
from runtime.messages import Message, UserMessage
from runtime.redact import register_url_secrets
from runtime.store import SessionInfo, SessionRecord, validate_session_id

DEFAULT_POOL_SIZE = 8
DEFAULT_RETRY_FOR = 30.0
"""Seconds a call keeps retrying while the server cannot be reached."""
IDLE_IN_TRANSACTION_TIMEOUT = 10.0
"""Seconds the server lets a connection of the store sit idle inside a transaction before
it ends the session (``idle_in_transaction_session_timeout``). A transaction here runs
its statements back to back from one thread, so a client idle inside one that long is
frozen (a stopped or swapped-out process, a paused VM): without the limit the row locks
it holds would stay until it wakes, and a save's ``FOR SHARE`` of its turn's row would
hide that turn from every takeover (claims lock ``FOR UPDATE SKIP LOCKED``), so a frozen
worker's turn would never move to a live one. Ended, the frozen client finds its
connection gone when it wakes, and its retried save is refused by the fence."""
_T = TypeVar("_T")


_WRITER_PREFIX: Final = "writer:"
"""The ``axon_meta`` keys of the hosts writing the store: ``writer:<host's marker id>``
(:meth:`PostgresStore.set_writer`)."""

_WRITERS_WHERE = "left(key, 7) = 'writer:'"
"""The registry's rows (not a range of keys: a collation other than ``C`` orders
``:`` and ``;`` as it likes). ``axon_meta`` holds a few rows: a scan of them."""

_WRITERS_SQL: Final = f"SELECT key, value FROM axon_meta WHERE {_WRITERS_WHERE}"

_WRITER_KEYS = f"""(SELECT coalesce(string_agg(key, ' '), '') FROM
    (SELECT key FROM axon_meta WHERE {_WRITERS_WHERE} LIMIT 2) AS w)"""
"""Two of the registry's keys at most, read with the version query of a host that
registered (the statement its turn makes anyway): no statement more to learn that
another host writes the store (:meth:`PostgresStore.writers_seen`). Two tell "this
host alone" from "another too"; all of them made a store holding thousands of rows
(a crash loop's) read and send them all every turn."""

_VERSION_WRITERS_SQL: Final = (
    f"SELECT (SELECT version FROM axon_sessions WHERE session_id = %s), {_WRITER_KEYS}"
)

_VERSION_MARK_SQL: Final = """SELECT (SELECT version FROM axon_sessions WHERE session_id = %(s)s),
    (SELECT deletions FROM axon_deletions WHERE session_id = %(s)s)"""

_VERSION_MARK_WRITERS_SQL: Final = f"{_VERSION_MARK_SQL}, {_WRITER_KEYS}"


class PostgresStore(FenceKeeping):
    """Sessions (and durable turns) in PostgreSQL; create with ``await PostgresStore.open(url)``."""

    ends_turns: Final = True
    """:meth:`save` takes ``ends`` (the persister passes it): a fenced save that ends its
    turn lets the fence finish the turn's queue row in the same commit."""
    keeps_rows: Final = True
    """:meth:`save` takes ``kept`` (:class:`~runtime.store.Store`'s kept rows)."""
    checks_absent_mark: Final = True
    """:meth:`save` takes ``absent_mark`` (:func:`~runtime.store.checks_absent_mark`)."""

    def __init__(
        self,
        pool: Any,
        *,
        url: str,
        schema: str,
        pool_size: int,
        retry_for: float,
        utf8: bool = True,
        idle_limit: list[float | None] | None = None,
    ):
        """Wrap an open pool whose schema exists; use :meth:`open` instead.
        ``idle_limit`` holds the server's ``idle_session_timeout`` as the pool's
        connections last read it (:func:`_note_idle_session_timeout`)."""
        self._pool = pool
        self._url = url
        self._shown = redact_url(url)
        """:attr:`url`, worked out once: every statement's error context names it, and
        redacting it each time was a few percent of a worker's CPU (issue 24)."""
        self.libpq, self.schema, self.pooled = _split_url(url)
        """The libpq URL (without Axon's ``schema`` and ``pooler`` parameters), the schema
        name, and whether the server is behind a transaction pooler (:func:`parse_pooler`:
        no connection keeps a ``SET``, a prepared statement or a ``LISTEN``)."""
        self.listen_libpq = parse_listen(url)
        """The libpq URL of the workers' ``LISTEN`` connection (:func:`parse_listen`),
        ``None`` behind a transaction pooler that names no direct one: they poll."""
        self._fences_closed = False
        self._limiter = FreeLimiter(pool_size)
        self._lane = LoopLane(
            self.libpq,
            self.schema,
            pool_size,
            pooled=self.pooled,
            idle_limit=[None] if idle_limit is None else idle_limit,
        )
        """Connections for the saves sent from the event loop (:meth:`_save_call`)."""
        self._writers_seen: str | None = None
        """The registry's keys (:meth:`set_writer`) as the last version query read them,
        until :meth:`writers_seen` takes them."""
        self._registered = False
        """Whether a host of this store put its row in the registry (:meth:`set_writer`):
        only then do the version queries read it (a worker's store, whose host keeps no
        row, sends them unchanged)."""
        self._retry_for = retry_for
        self._utf8 = utf8
        """Whether the database's encoding is UTF-8: the save function merges meta as text
        of it (:data:`SAVE_FUNCTION`), which elsewhere (LATIN1...) cannot hold every
        character a meta may (the client merges it then, in the save's transaction)."""
        self._closed = False
        self._fences: dict[str, Fence] = {}
        self._ended: OrderedDict[str, tuple[str, str, int]] = OrderedDict()
        """Sessions whose fenced block ended (the claim is over, the worker gave the turn
        up) and has no fence since, with the claim that ended (turn, owner, epoch; not
        the fence, whose callbacks hold the turn's stream and history): a save of the turn still
        on its way (the persister's, queued behind others when the turn stopped waiting
        for it) is refused, never written unfenced (bounded: :data:`ENDED_REMEMBERED`)."""
        self._marked: set[str] = set()
        """Fenced turns whose row already says ``saved`` (while their fence is held)."""
        self._under: dict[str, list[str]] = {}
        """The sub-sessions fenced by each claimed session's fence (:meth:`fence_under`),
        by that session's id: their fences move to :attr:`_after` when its block ends."""
        self._after: OrderedDict[str, Fence] = OrderedDict()
        """Sub-sessions whose calling turn's fenced block ended, with their fence (its
        callbacks dropped: they hold the turn's stream and history): a sub-turn may
        outlive its calling turn (the agent tool's task ends after the turn that
        cancelled it), and its late saves are checked against the same claim. Until
        the sub-session is fenced again or its host released it (:meth:`release_under`:
        the host closed it and its saves are written; bounded all the same:
        :data:`ENDED_REMEMBERED`)."""
        self._heads: OrderedDict[str, tuple[int, dict[int, int]]] = OrderedDict()
        """Each session's heads this store's last grown save wrote ("Grown messages"):
        the version it left and, by index, the parts the head's segments hold. A save
        of the session at that version appends a segment; any other grown save starts
        its message's segments again (from part 0). Bounded: :data:`ENDED_REMEMBERED`."""
        self._segmented: set[str] = set()
        """Sessions this store wrote (or read) segments of: its next save without a head
        compacts the session when it is a transaction too (a guard's), where a save
        function's call always looks (:data:`_COMPACT_SQL`)."""
        self._log = get_logger("axon.store.postgres")

    @property
    def url(self) -> str:
        """The URL the store was opened with, password removed."""
        return self._shown

    # -- open ----------------------------------------------------------------------------

    @staticmethod
    def require_driver() -> Any:
        """``psycopg_pool``, after checking psycopg 3 and it are installed: a missing one
        is a :class:`~runtime.errors.ConfigurationError` naming it and the extra (one
        ``error:`` line), as the other extras' checks say. Called by :meth:`open`, and
        by a command before it opens anything else (``worker``: its Redis relay, which it
        would otherwise retry for seconds first; :func:`actors.stores.require_driver`)."""
        try:
            import psycopg  # noqa: F401
            import psycopg_pool
        except ImportError as err:
            raise ConfigurationError(
                f"the PostgreSQL store needs the {err.name or 'psycopg'} package, which is "
                "not installed: pip install 'axon-runtime[postgres]'"
            ) from None
        return psycopg_pool

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        pool_size: int = DEFAULT_POOL_SIZE,
        retry_for: float = DEFAULT_RETRY_FOR,
        connect_retry_for: float = 10.0,
    ) -> PostgresStore:
        """Connect to ``url``, create (or check) the schema, and return the store.

        A server that does not answer is retried with backoff for ``connect_retry_for``
        seconds, then :class:`~runtime.errors.StoreUnavailable` says why; a database that
        does not exist, refused credentials or a bad URL fail at once
        (:class:`~runtime.errors.StoreError` / ``ConfigurationError``). A schema holding
        tables of another program, or a newer Axon schema, is refused untouched.
        """
        psycopg_pool = cls.require_driver()
        libpq, schema, pooled = _split_url(url)
        register_url_secrets(url)  # a driver's error quoting the URL is redacted too
        shown = redact_url(url)
        encoding = await _retrying(
            f"connect to {shown}",
            connect_retry_for,
            lambda: trio.to_thread.run_sync(_first_connect, libpq, schema, pooled),
        )

        idle_limit: list[float | None] = [None]  # (the pool's and the lane's)

        def configure(conn: Any) -> None:
            conn.execute(f"SET search_path TO {schema}")
            set_session(conn)
            idle = int(IDLE_IN_TRANSACTION_TIMEOUT * 1000)
            conn.execute(f"SET idle_in_transaction_session_timeout = {idle}")
            idle_limit[0] = _note_idle_session_timeout(conn)
            conn.commit()

        _quiet_expected_discards()
        pool = psycopg_pool.ConnectionPool(
            libpq,
            min_size=1,
            max_size=pool_size,
            open=False,
            # Behind a transaction pooler a session's SET would outlive its transaction
            # on a server connection another client (another store) gets next: none,
            # and no statement prepared (it stays on the backend it was prepared on).
            configure=None if pooled else configure,
            # No check by the pool: its loop waits a second (then two, four) after a
            # connection fails it, and the one opened meanwhile in its place idles in
            # the pool past a short idle_session_timeout: checked at last, dead too
            # (:func:`_alive`, checked in :meth:`run` instead).
            # Autocommit: a transaction is an explicit ``conn.transaction()`` block (see
            # :meth:`run`), and a single read needs none.
            kwargs={"connect_timeout": CONNECT_TIMEOUT, "autocommit": True}
            | ({"prepare_threshold": None} if pooled else {}),
            timeout=CONNECT_TIMEOUT,
            reconnect_timeout=max(retry_for, 1.0),
            name=f"axon-{schema}",
        )
        await trio.to_thread.run_sync(lambda: pool.open(wait=True, timeout=CONNECT_TIMEOUT * 2))
        return cls(
            pool,
            url=url,
            schema=schema,
            pool_size=pool_size,
            retry_for=retry_for,
            utf8=encoding == "UTF8",
            idle_limit=idle_limit,
        )

    async def now(self) -> float:
        """PostgreSQL's clock (``clock_timestamp()``, seconds since the epoch): what every
        process sharing this store sets and compares wait deadlines by, whatever its own
        wall clock says (:class:`runtime.clocks.AnchoredClock`)."""
        row = await self.run(
            "the database's clock",
            lambda conn: conn.execute(
                "SELECT extract(epoch FROM clock_timestamp())::float8"
            ).fetchone(),
            transaction=False,
        )
        return float(row[0])

    # -- running a transaction -----------------------------------------------------------

    async def run(self, action: str, fn: Callable[[Any], _T], *, transaction: bool = True) -> _T:
        """Run ``fn(conn)`` inside one transaction in a worker thread; commit unless it
        raises. Connection failures are retried with backoff for ``retry_for`` seconds
        (``fn`` must therefore be safe to run again: every caller's is one transaction).

        ``transaction=False`` is for an ``fn`` that runs a single statement (a read): it
        then runs alone in autocommit, one round trip instead of three (``BEGIN``, the
        statement, ``COMMIT``); one statement sees one snapshot either way."""
        if self._closed:
            raise StoreError(f"session store {self.url} is closed")

        def attempt() -> _T:
            # Connections the server closed while they idled (idle_session_timeout) are
            # dropped and the next taken at once, up to the pool's size of them; the
            # last is used unchecked, so a server that is down fails the call as before
            # (retried with backoff and a warning by ``_retrying``).
            timed_out = False
            for left in range(self._pool.max_size, -1, -1):
                found_closed = None
                try:
                    with self._pool.connection() as conn:
                        if left and not _alive(conn):
                            # Closed: the pool discards it (quietly) and opens another.
                            found_closed = id(conn)
                            _found_closed.add(found_closed)
                            continue
                        try:
                            if transaction:
                                with conn.transaction():
                                    result = fn(conn)
                            else:
                                result = fn(conn)
                        except Exception as err:
                            if getattr(err, "sqlstate", None) == IDLE_SESSION_TIMEOUT and (
                                left and not timed_out
                            ):
                                # Ended by the server while idle: nothing of ``fn`` ran. Once
                                # more on another connection, at once; twice is no race.
                                timed_out = True
                                continue
                            _close_if_read_only(conn, err)
                            raise
                        _used[conn] = time.monotonic()
                        return result
                finally:
                    if found_closed is not None:  # its discard logged (or not) by now
                        _found_closed.discard(found_closed)
            raise AssertionError("unreachable: the last try returns or raises")

        async def once() -> _T:
            return await trio.to_thread.run_sync(
                attempt,
                limiter=self._limiter,  # type: ignore[arg-type]  # CapacityLimiter-like
            )

        return await _retrying(f"{action} ({self.url})", self._retry_for, once, log=self._log)

    # -- the Store protocol --------------------------------------------------------------

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session with its messages in index order, or ``None`` if it was never saved."""
        validate_session_id(session_id)
        joined = await self.run(
            f"load of session {session_id!r}",
            lambda conn: load_rows(conn, session_id),
            transaction=False,
        )
        return await self.record_off_loop(session_id, joined)

    async def meta(self, session_id: str) -> dict[str, Any] | None:
        """The session's meta alone, or ``None`` if it was never saved: one primary-key
        lookup, however long the session (the front end asks it of every turn it queues,
        whether the session has a title yet: the whole session was loaded for that, a
        5,000-message one 1.4 MB a turn)."""
        validate_session_id(session_id)
        row = await self.run(
            f"meta of session {session_id!r}",
            lambda conn: conn.execute(
                "SELECT meta FROM axon_sessions WHERE session_id = %s", (session_id,)
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else decode_meta(self.url, bytes(row[0]), session_id)

    async def load_last_turn(self, session_id: str) -> tuple[int, SessionRecord] | None:
        """The session's last turn (:func:`runtime.store.load_last_turn`): ``(the index of
        its first message, the record of the messages from there on)``, ``None`` if it was
        never saved; one statement (:data:`_LAST_TURN_SQL`) sent from the event loop,
        whatever the session's length. What a decision reads, and what a worker
        deployment's front end reads of a turn that ended (where each loaded the whole
        session: a 5,000-message one 1.4 MB a turn)."""
        validate_session_id(session_id)
        return await self._read_tail(
            session_id, "last turn", _LAST_TURN_NAME, _LAST_TURN_SQL, (session_id.encode(),)
        )

    async def load_last_turns(
        self, session_id: str, turns: int
    ) -> tuple[int, SessionRecord] | None:
        """The session's last ``turns`` turns (:func:`runtime.store.load_last_turns`):
        its messages from its ``turns``-th last assistant message on (all of them when it
        has fewer), as :meth:`load_last_turn` reads the last one: one statement
        (:data:`_LAST_TURNS_SQL`), the assistant messages counted backwards on the
        messages' primary key. What a front end reads of a steered turn (an assistant
        message after each message steered into it), where it loaded the whole session."""
        validate_session_id(session_id)
        if turns < 1:
            raise ValueError(f"turns must be at least 1, not {turns}")
        params = (session_id.encode(), str(turns - 1).encode())
        return await self._read_tail(
            session_id, f"last {turns} turns", _LAST_TURNS_NAME, _LAST_TURNS_SQL, params
        )

    async def has_user_messages(self, session_id: str, ids: Collection[str]) -> frozenset[str]:
        """Which of ``ids`` are the ids of the session's stored user messages
        (:func:`runtime.store.has_user_messages`): one statement on the partial index of
        the user messages' ids (:data:`~actors.stores.postgres_tables.MESSAGE_ID_INDEX`),
        the rows read those of the ids asked, whatever the session's length, where a front
        end read the whole session (a 5,000-message one 1.2 MB a request). A stored user
        message whose id the index could not read (``NULL``: a ``\\u0000`` in its JSON)
        makes it read the session the long way, as before."""
        validate_session_id(session_id)
        wanted = frozenset(ids)
        if not wanted:
            return frozenset()
        rows = await self.run(
            f"user message ids of session {session_id!r}",
            lambda conn: conn.execute(
                _HAS_USER_MESSAGES_SQL, {"session": session_id, "ids": sorted(wanted)}
            ).fetchall(),
            transaction=False,
        )
        found = {found_id for (found_id,) in rows}
        if None in found:
            record = await self.load(session_id)
            messages = record.messages if record is not None else ()
            return frozenset(
                m.id for m in messages if isinstance(m, UserMessage) and m.id in wanted
            )
        return frozenset(found)

    async def _read_tail(
        self, session_id: str, what: str, name: bytes, sql: bytes, params: tuple[bytes, ...]
    ) -> tuple[int, SessionRecord] | None:
        """``(the index of the first message read, the record of the messages from there
        on)`` by one statement ``sql`` (prepared as ``name``) whose rows are
        :func:`_last_turn_rows`' (the index of the first in each row's third column);
        ``None`` when it reads none. What :meth:`load_last_turn` and
        :meth:`load_last_turns` share."""
        if self._closed:
            raise StoreError(f"session store {self.url} is closed")
        formats = (0,) * len(params)

        async def once() -> Any:
            return await self._lane.call(name, sql, params, formats, 1)

        action = f"read of session {session_id!r}'s {what}"
        result = await _retrying(f"{action} ({self.url})", self._retry_for, once, log=self._log)
        rows = await run_long_off_loop(result.ntuples, _last_turn_rows, result)
        if not rows:
            return None
        first = 0 if rows[0][2] is None else rows[0][2]
        record = await self.record_off_loop(session_id, rows, first)
        return None if record is None else (first, record)

    async def record_off_loop(
        self, session_id: str, joined: list[Any], first: int = 0
    ) -> SessionRecord | None:
        """:meth:`record`, in a worker thread for more than
        :data:`~runtime.history.OFF_LOOP_MESSAGES` rows: decoding a session of 600,000
        messages took the event loop 4.7 s (a worker's claim of its turn, a front end's
        read of it). The thread is handed the rows, which nothing else holds."""
        return await run_long_off_loop(len(joined), self.record, session_id, joined, first)

    def record(self, session_id: str, joined: list[Any], first: int = 0) -> SessionRecord | None:
        """The session from the rows :func:`load_rows` read (``None``: it was never saved);
        with ``first``, from rows that begin at that index (the record's messages are
        those from there on: a decision's read of the last turn)."""
        if not joined:
            return None
        row = joined[0]
        rows = [r[2:5] for r in joined if r[2] is not None]
        if any(bytes(r[2][: len(HEAD_PREFIX)]) == HEAD_PREFIX for r in rows):
            self._segmented.add(session_id)  # (a head read as it is: one without its
            # segments, whose decode fails below; every read folds the others)
        messages = []
        for expected, (idx, role, body) in enumerate(rows, first):
            if idx != expected:
                raise StoreCorrupt(
                    f"session store {self.url}: session {session_id!r} is missing message "
                    f"{expected} (the next stored index is {idx})"
                )
            messages.append(decode_message(self.url, session_id, idx, role, bytes(body)))
        return SessionRecord(
            session_id=session_id,
            messages=tuple(messages),
            meta=decode_meta(self.url, bytes(row[0]), session_id),
            version=row[1],
            incarnation=row[5] if len(row) > 5 else 0,
        )

    async def save(
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        meta: Mapping[str, Any] | None = None,
        *,
        expected_version: int | None = None,
        guard: Callable[[Any], LockedSession | None] | None = None,
        unfenced: bool = False,
        ends: str | None = None,
        kept: Collection[int] = (),
        absent_mark: int | None = None,
        fence: Fence | None = None,
        grown: Collection[int] = (),
    ) -> int:
        """Replace messages ``start..`` with ``messages`` and merge ``meta``, in one
        transaction; returns the session's new version (see the module docstring for
        versions and fences). Everything is serialized before the transaction begins, so
        a bad message fails the save before anything is written. The messages at
        positions ``kept`` are stored as they are already (:class:`~runtime.store.Store`'s
        kept rows): they are neither sent nor written, the others before the last of them
        go over their rows.

        ``guard(conn)`` (not part of the :class:`~runtime.store.Store` protocol) runs in
        the save's transaction before anything is written: it may refuse the save by
        raising, or write rows of its own that commit with the save or not at all (the
        turn queue records a decision and puts the waiting turn back so, atomically). A
        guard that locks the session's row in its own statement (:data:`LOCK_SESSION`)
        returns it as a :class:`LockedSession`: the save then checks the version on it and
        does not lock the row again (a round trip fewer).
        ``unfenced`` (not part of the protocol either) saves without the session's fence:
        a write that is not the fenced turn's own (a decision for it, which its guard
        checks against the turn's row), made by the process that runs the turn.
        ``ends`` (not part of the protocol either): the turn ends with this save, with that
        finish reason (:attr:`runtime.actor_messages.SaveRequest.ends`); the fence's
        :attr:`~Fence.in_save` may finish the turn's row in the save's commit.
        ``absent_mark``: a save that creates the session reads its deletion mark after
        its insert, in its transaction, and raises
        :class:`~runtime.errors.SessionDeleted`, the insert undone, when the mark is above
        (:func:`~runtime.store.checks_absent_mark`): another process's create and delete
        committed before the insert show there, none can fall between.
        ``fence`` (not part of the protocol either): the fence the save's turn began under
        (:meth:`fence_of`, carried by ``SaveRequest.fence``), which the save runs under
        instead of the one the store holds for the session now (:meth:`_save_fence`).
        ``grown``: the assistant messages at those positions extend the ones stored at
        their places (:class:`~runtime.store.Store`'s grown rows): one of at least
        :data:`GROWN_FROM_BYTES` is written as its head and a segment of its new parts,
        in the save function's call (the module's "Grown messages")."""
        tail, kept_at = kept_tail(session_id, messages, kept, expected_version)
        grew = check_grown(session_id, messages, grown, kept_at, expected_version)
        new, rows = await encoded_off_loop(
            session_id, start, messages, meta, expected_version, kept_at
        )
        segments: list[tuple[int, int, bytes]] = []
        heads: dict[int, int] = {}
        fresh: list[int] = []
        if grew:
            rows = self._grow(
                session_id, start, new, rows, grew, expected_version, segments, heads, fresh
            )
        start += tail  # (rows below it, if any, go over their places)
        # A save that writes no head compacts the session (the save function's p_drop,
        # :data:`SAVE_FUNCTION`): when the session holds segments (the lock of its row
        # reads that), each head left (a killed turn's answer, one a steer closed that
        # this store's saves kept) is written whole, folded, and every segment deleted,
        # in the call's commit. A save in a transaction (a guard's) does the same
        # (:data:`_COMPACT_SQL`, one statement more) for a session this store segmented
        # and at a turn's last save.
        drop = not heads
        compact = drop and (ends is not None or session_id in self._segmented)
        kept_heads: dict[int, int] = {}
        known = self._heads.get(session_id)
        if heads and known is not None and known[0] == expected_version:
            # (the heads of its last save this one keeps: an answer a steer closed)
            written_at = {row[1] for row in rows}
            kept_heads = {i: n for i, n in known[1].items() if i not in written_at}
        patch = encode_meta(session_id, meta)
        fence = None if unfenced else self._save_fence(session_id, fence)
        wrote: list[bool] = []
        steers: list[int] = []  # the turn row's count, as the fence check read it
        action = f"save of session {session_id!r}"

        def save(conn: Any) -> int:
            wrote.clear()
            steers.clear()
            version = self._save_in(
                conn,
                session_id,
                start,
                rows,
                patch,
                expected_version,
                fence,
                guard,
                steers,
                absent_mark,
            )
            if heads:
                _write_segments(conn, session_id, fresh, segments)
            elif compact:
                conn.execute(_COMPACT_SQL, {"session": session_id})
            if fence is not None and fence.in_save is not None:
                wrote.append(fence.in_save(conn, new, meta, ends))
            return version

        try:
            version = None
            # One call of the save function from the loop, unless a guard or the fence's
            # own writes need the transaction (or the meta patch holds an escaped NUL, or
            # the database's text is not UTF-8: the function merges meta as its text, or
            # an index is past an INTEGER's: the transaction's statements refuse it).
            if (
                guard is None
                and (patch is None or (self._utf8 and _NUL not in patch))
                and start + len(new) <= _INDEX_END
            ):
                ending: bool | Suspend | None = False
                if fence is not None and fence.in_save is not None:
                    ending = None if fence.one_call is None else fence.one_call(new, meta, ends)
                if ending is not None:
                    version = await self._save_call(
                        action,
                        session_id,
                        start,
                        rows,
                        patch,
                        expected_version,
                        fence,
                        ends if ending is True else None,
                        steers,
                        ending if isinstance(ending, Suspend) else None,
                        absent_mark,
                        fresh=fresh,
                        segments=segments,
                        drop=drop,
                    )
                    wrote.append(ending is not False)
            if version is None:
                version = await self.run(action, save)
        except LeaseLost as exc:
            if fence is not None:
                deleted = fence.on_deleted if isinstance(exc, SessionDeleted) else None
                told = deleted if deleted is not None else fence.on_lost
                if told is not None:
                    told()
            raise
        if fence is not None:
            self._fenced_save_committed(fence, wrote, steers)
        self._heads.pop(session_id, None)
        if heads or kept_heads:
            self._heads[session_id] = (version, {**kept_heads, **heads})
            while len(self._heads) > ENDED_REMEMBERED:
                self._heads.popitem(last=False)
            self._segmented.add(session_id)
        elif drop:
            self._segmented.discard(session_id)
        return version

    def _grow(
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        rows: list[tuple[str, int, str, bytes]],
        grew: frozenset[int],
        expected_version: int | None,
        segments: list[tuple[int, int, bytes]],
        heads: dict[int, int],
        fresh: list[int],
    ) -> list[tuple[str, int, str, bytes]]:
        """``rows`` with each grown message of at least :data:`GROWN_FROM_BYTES` as its
        head, its new parts' segment in ``segments``: from the parts its head holds when
        this store's last save left the session at ``expected_version`` (:attr:`_heads`),
        else from part ``0`` (its index in ``fresh``: its segments go first). ``heads``:
        the parts each head written holds."""
        known = self._heads.get(session_id)
        held = known[1] if known is not None and known[0] == expected_version else {}
        out = list(rows)
        for i, row in enumerate(rows):
            idx = row[1]
            if idx - start not in grew or len(row[3]) < GROWN_FROM_BYTES:
                continue
            message = messages[idx - start]
            parts = held.get(idx, 0)
            split = split_grown(message, row[3], parts)
            if split is None:
                continue
            head, segment = split
            if not parts:
                fresh.append(idx)
            if segment:
                segments.append((idx, parts, segment))
            heads[idx] = len(message.content)  # type: ignore[union-attr]
            out[i] = (row[0], idx, row[2], head)
        return out

    async def _save_call(
        self,
        action: str,
        session_id: str,
        start: int,
        rows: list[tuple[str, int, str, bytes]],
        patch: bytes | None,
        expected_version: int | None,
        fence: Fence | None,
        ends: str | None,
        steers: list[int],
        suspend: Suspend | None = None,
        absent_mark: int | None = None,
        fresh: list[int] | None = None,
        segments: list[tuple[int, int, bytes]] | None = None,
        drop: bool = False,
    ) -> int | None:
        """The save as one call of :data:`SAVE_FUNCTION`, sent from the event loop on a
        connection of the :class:`LoopLane` (in autocommit: the call is its own
        transaction); the new version, or ``None`` when the stored meta must be merged
        here (the caller saves in a transaction instead). Its refusals (nothing written)
        raise as the transaction's do. With ``suspend`` the call suspends the turn's row too.
        ``fresh`` and ``segments``: a grown save's (:meth:`_grow`), written in the call;
        ``drop``: the save writes no head, so the call compacts the session's heads and
        segments left, if any, in its commit (:data:`SAVE_FUNCTION`)."""
        if self._closed:
            raise StoreError(f"session store {self.url} is closed")
        arrays = await _arrays_off_loop(rows)
        mark = fence is not None and fence.under is None and fence.turn_id not in self._marked
        params: tuple[bytes | None, ...] = (
            session_id.encode(),
            b"%d" % start,
            None if expected_version is None else b"%d" % expected_version,
            patch,
            *arrays,
            None if fence is None else fence.turn_id.encode(),
            None if fence is None else fence.owner.encode(),
            None if fence is None else b"%d" % fence.epoch,
            b"t" if mark else b"f",
            None if ends is None else ends.encode(),
            _TURNS_CHANNEL.encode(),
            b"f" if suspend is None else b"t",
            None
            if suspend is None or suspend.expires_at is None
            else repr(suspend.expires_at).encode(),
            None if absent_mark is None else b"%d" % absent_mark,
            *segment_arrays(fresh or [], segments or []),
            b"t" if drop else b"f",
        )
        name, sql = (
            (_SAVE_NAME, _SAVE_SQL) if ends is None else (_SAVE_NAME_ENDING, _SAVE_SQL_ENDING)
        )
        formats: Sequence[int] = _SAVE_FORMATS
        result_format = 0
        asked = None
        ending = ends is not None or suspend is not None
        if ending and fence is not None and fence.claim_next is not None:
            asked = fence.claim_next()
        if asked is not None:  # the next claim rides on this last save (or suspension)
            name, sql, formats = _SAVE_NEXT_NAME, _SAVE_NEXT_SQL, _SAVE_NEXT_FORMATS
            result_format = 1
            params = (
                *params[:10],
                ends.encode() if ends is not None else None,
                _TURNS_CHANNEL.encode(),
                repr(float(asked.lease)).encode(),
                asked.token.encode(),
                b"f" if suspend is None else b"t",
                None
                if suspend is None or suspend.expires_at is None
                else repr(suspend.expires_at).encode(),
                *params[16:],  # the segments and the drop
            )

        sent = 0

        async def once() -> Any:
            nonlocal sent
            sent += 1
            return await self._lane.call(name, sql, params, formats, result_format)

        result = await _retrying(f"{action} ({self.url})", self._retry_for, once, log=self._log)
        if result_format:
            got = list(read_row(result, 0, SAVE_NEXT_KINDS))
            status = got[0]
            version = got[1]
        else:
            got = [result.get_value(0, col) for col in range(6)]
            got[0] = got[0].decode()
            status = got[0]
            version = None if got[1] is None else int(got[1])
        if status == "ok":
            if fence is not None:
                steers.append(int(got[2]))
            if asked is not None:
                asked.on_answer(result)  # no schedule point since the answer: it is taken
            return version
        if status == "lost":
            assert fence is not None
            if got[5] is None:
                row = None
            elif result_format:
                row = (got[3], got[4], got[5])
            else:  # (no owner: a suspended or released turn's row)
                owner = None if got[3] is None else got[3].decode()
                row = (owner, int(got[4]), got[5].decode())
            if sent > 1 and row == _own_write(fence, ends, suspend):
                # A retry of a call whose answer was lost after it committed (the
                # connection died on the way back): the turn's row is as this very save
                # left it, so the save is stored; it is not a lease lost. What a last
                # save also claimed is not known here (the claim's ``on_claimed`` never
                # ran): it is given back with its attempt, for the next claim to take.
                if asked is not None:
                    await self.run(
                        f"{action}: what its lost answer claimed",
                        asked.give_back,
                        transaction=False,
                    )
                return await self._version_written(session_id, fence.turn_id)
            _check_fence_row(row, fence, session_id)
            if fence.under is not None:
                # A sub-session's save whose calling turn is no longer running but still
                # this claim's (it ended, or suspended, as its sub-turn ended): the
                # function checks for a running turn, so the transaction saves it (its
                # check is the claim's alone).
                return None
        if status == "conflict":
            check_version(self.url, session_id, version or 0, expected_version)
        if status == "created":
            raise _created_meanwhile(self.url, session_id, expected_version, version or 0)
        if status == "deleted" and absent_mark is not None:
            deleted_since(session_id, version or 0, absent_mark)
        if status == "hole":
            _beyond_end(session_id, start, version or 0)
        if status == "meta":
            return None
        raise StoreError(f"save of session {session_id!r}: the save function said {status!r}")

    async def save_decision(
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        meta: Mapping[str, Any],
        *,
        expected_version: int,
        turn_id: str,
        complete: bool,
        deadline: float | None = None,
    ) -> tuple[str, int | None, tuple[Any, ...] | None]:
        """A decision's save together with its turn's row, as one call of
        :data:`DECIDE_FUNCTION` sent from the event loop (not part of the
        :class:`~runtime.store.Store` protocol: the turn queue's decisions use it). What
        the call said: ``("ok", version, row)`` (saved; the turn's row after, as
        :data:`STATUS_COLUMNS`), ``("refused", None, row)`` (the turn does not wait, or is
        not this session's: the row as found, ``None`` when there is none; nothing
        written), ``("expired", None, row)`` (``deadline``, the call's stored one, is
        at or before the database's clock: nothing written), ``("meta", None, None)``
        (the stored meta or the patch must be merged here, the database's text is not
        UTF-8, or an index is past an ``INTEGER``'s: save in the transaction instead, as
        :meth:`save` does). A version that moved raises
        :class:`~runtime.errors.StoreConflict`, another running turn of the session
        ``psycopg.errors.UniqueViolation``, both with nothing written."""
        import psycopg

        new, rows = await encoded_off_loop(session_id, start, messages, meta, expected_version)
        patch = encode_meta(session_id, meta)
        if self._closed:
            raise StoreError(f"session store {self.url} is closed")
        if (patch is not None and (not self._utf8 or _NUL in patch)) or (
            start + len(new) > _INDEX_END
        ):
            return "meta", None, None  # as a save would, in the transaction (:meth:`save`)
        params = (
            turn_id.encode(),
            b"t" if complete else b"f",
            session_id.encode(),
            b"%d" % start,
            b"%d" % expected_version,
            patch,
            *(await _arrays_off_loop(rows)),
            _TURNS_CHANNEL.encode(),
            None if deadline is None else repr(float(deadline)).encode(),
        )
        unique: list[BaseException] = []
        sent = 0

        async def once() -> Any:
            nonlocal sent
            sent += 1
            try:
                return await self._lane.call(_DECIDE_NAME, _DECIDE_SQL, params, _DECIDE_FORMATS, 1)
            except psycopg.errors.UniqueViolation as err:
                unique.append(err)
                return None

        action = f"decision's save of session {session_id!r}"
        result = await _retrying(f"{action} ({self.url})", self._retry_for, once, log=self._log)
        if result is None:
            raise unique[-1]
        got = read_row(result, 0, _DECIDE_KINDS)
        status, version = got[0], got[1]
        row = None if got[2] is None else got[2:]
        if sent > 1 and status in ("refused", "conflict", "expired"):
            # A retry of a call whose answer was lost after it committed: the version
            # moved and the call is decided because this very decision did it. Told
            # "already decided", the person whose decision is the one stored would try
            # again or give up. Recognised by what the session's last write stored.
            bodies = [body for _, _, _, body in rows]
            mine = await self._decision_written(session_id, turn_id, start, bodies)
            if mine is not None:
                return "ok", *mine
        if status == "conflict":
            check_version(self.url, session_id, version or 0, expected_version)
        if status == "hole":
            _beyond_end(session_id, start, version or 0)
        if status in ("ok", "refused", "expired", "meta"):
            return status, version, row
        raise StoreError(f"{action}: the decision's function said {status!r}")

    def _save_in(
        self,
        conn: Any,
        session_id: str,
        start: int,
        rows: list[tuple[str, int, str, bytes]],
        patch: bytes | None,
        expected_version: int | None,
        fence: Fence | None,
        guard: Callable[[Any], LockedSession | None] | None,
        steers: list[int] | None = None,
        absent_mark: int | None = None,
    ) -> int:
        """The save's transaction: check the fence, run the guard, check the version, write
        the session row (meta merged), replace the messages from ``start`` on; the new
        version.

        Few statements, because every one costs a round trip and a parse on both sides
        and a worker saves every step: without a guard, the fence check (and the turn's
        ``saved`` mark) and the session's lock are one statement, and the writes another:
        the session row's update (or insert) with the messages' delete, insert and hole
        check in its ``WITH``."""
        mark = fence is not None and fence.under is None and fence.turn_id not in self._marked
        if guard is not None:  # the guard runs between the fence check and the lock
            if fence is not None:
                _check_fence(conn, fence, session_id, steers)
            locked = guard(conn)
            if locked is None:
                row = self._lock_session(conn, session_id, expected_version)
            else:
                row = locked.row
                current = 0 if row is None else row[1]
                check_version(self.url, session_id, current, expected_version)
        else:
            row = self._lock_fenced(
                conn, session_id, expected_version, fence, mark=mark, steers=steers
            )
            mark = False
        merged = {} if row is None else decode_meta(self.url, bytes(row[0]), session_id)
        if patch is not None:
            merged.update(serde.loads(patch))
        if row is None:  # a session that does not exist has no messages to replace
            if start > 0:
                _beyond_end(session_id, start, 0)
            version = self._insert_session(conn, session_id, merged, expected_version, rows)
            if absent_mark is not None:  # (read after the insert: see save)
                got = conn.execute(
                    "SELECT deletions FROM axon_deletions WHERE session_id = %s", (session_id,)
                ).fetchone()
                deleted_since(session_id, 0 if got is None else int(got[0]), absent_mark)
        else:
            version = _replace_messages(conn, session_id, start, merged, rows)
        if mark:
            conn.execute(
                "UPDATE axon_turns SET saved = true WHERE turn_id = %s AND NOT saved",
                (fence.turn_id,),  # type: ignore[union-attr]
            )
        return version

    def _lock_session(
        self, conn: Any, session_id: str, expected_version: int | None
    ) -> tuple[Any, int] | None:
        """The session row (meta, version), locked until the transaction ends (``None``
        when there is none); :class:`StoreConflict` when it is not at ``expected_version``."""
        row = conn.execute(
            "SELECT meta, version FROM axon_sessions WHERE session_id = %s FOR UPDATE",
            (session_id,),
        ).fetchone()
        current = 0 if row is None else row[1]
        check_version(self.url, session_id, current, expected_version)
        return row

    def _lock_fenced(
        self,
        conn: Any,
        session_id: str,
        expected_version: int | None,
        fence: Fence | None,
        *,
        mark: bool,
        steers: list[int] | None = None,
    ) -> tuple[Any, int] | None:
        """:func:`_check_fence` (marking the turn ``saved`` when ``mark``) and
        :meth:`_lock_session` in one statement: the turn's row is locked first, then the
        session's, as when they were two."""
        if fence is None:
            return self._lock_session(conn, session_id, expected_version)
        turn = _MARK_TURN if mark else _SHARE_TURN
        cursor = kept_cursor(conn)
        got = cursor.execute(
            f"""WITH f AS ({turn})
            SELECT f.owner, f.epoch, f.status, s.meta, s.version, f.steers
            FROM (VALUES (1)) AS one
            LEFT JOIN f ON true
            LEFT JOIN LATERAL (
                SELECT meta, version FROM axon_sessions WHERE session_id = %s FOR UPDATE
            ) AS s ON true""",
            (fence.turn_id, session_id),
        ).fetchone()
        _check_fence_row(got[:3] if got[2] is not None else None, fence, session_id)
        if steers is not None:
            steers.append(got[5])
        row = None if got[4] is None else (got[3], got[4])
        check_version(self.url, session_id, 0 if row is None else row[1], expected_version)
        return row

    def _insert_session(
        self,
        conn: Any,
        session_id: str,
        meta: dict[str, Any],
        expected_version: int | None,
        rows: list[tuple[str, int, str, bytes]],
    ) -> int:
        """Create the session row with its messages ``rows``, in one statement; its
        version. A concurrent creator (committed after this transaction found no row)
        makes the insert find the key taken: a conflict, and no message is inserted (the
        messages' insert runs only for a session row this statement inserted)."""
        cursor = kept_cursor(conn)
        got = cursor.execute(
            f"""WITH s AS (
                INSERT INTO axon_sessions (session_id, meta, update_seq, version)
                VALUES (%s, %s, nextval('axon_update_seq'), nextval('axon_versions'))
                ON CONFLICT (session_id) DO NOTHING RETURNING version
            ), m AS ({_INSERT_ROWS} WHERE EXISTS (SELECT 1 FROM s))
            SELECT version FROM s""",
            (session_id, serde.dumps(meta), session_id, *_columns(rows)),
        ).fetchone()
        if got is None:
            actual = conn.execute(
                "SELECT version FROM axon_sessions WHERE session_id = %s", (session_id,)
            ).fetchone()[0]
            raise _created_meanwhile(self.url, session_id, expected_version, actual)
        return int(got[0])

    async def _decision_written(
        self, session_id: str, turn_id: str, start: int, bodies: Sequence[bytes]
    ) -> tuple[int, tuple[Any, ...]] | None:
        """The session's version and turn ``turn_id``'s row (:data:`STATUS_COLUMNS`) when
        the session's last write is a decision's save that stored exactly ``bodies`` from
        index ``start`` on (its messages' rows written in the transaction that last wrote
        the session: their ``xmin`` is the session row's); ``None`` otherwise. For a
        decision's save whose answer was lost after its commit. Another decider's identical
        decision, saved by the same kind of write, reads the same: the stored state is then
        what both asked for, and the retrying one is told so rather than refused."""
        return await self.run(
            f"what the decision's save of session {session_id!r} wrote",
            lambda conn: decision_written(conn, session_id, turn_id, start, bodies),
            transaction=False,
        )

    async def _version_written(self, session_id: str, turn_id: str) -> int:
        """The version a save of ``session_id`` that wrote turn ``turn_id``'s row in the
        same transaction gave the session, read after the fact (its answer was lost);
        ``0`` when the session was written again since (its row then carries another
        transaction's id): the session's next turn here then finds the stored version
        other than its own and reads the session again, never taking another writer's
        version for one that holds what this save wrote."""
        row = await self.run(
            f"version written by the save of session {session_id!r}",
            lambda conn: conn.execute(
                """SELECT s.version FROM axon_sessions AS s, axon_turns AS t
                WHERE s.session_id = %s AND t.turn_id = %s AND s.xmin = t.xmin""",
                (session_id, turn_id),
            ).fetchone(),
            transaction=False,
        )
        return 0 if row is None else int(row[0])

    async def version(self, session_id: str) -> int:
        """The session's version (``0`` if it does not exist): one primary-key lookup."""
        validate_session_id(session_id)
        if self._registered:  # (the registry's names too: :data:`_WRITER_KEYS`)
            row = await self.run(
                f"version of session {session_id!r}",
                lambda conn: conn.execute(_VERSION_WRITERS_SQL, (session_id,)).fetchone(),
                transaction=False,
            )
            self._writers_seen = row[1]
            return int(row[0] or 0)
        row = await self.run(
            f"version of session {session_id!r}",
            lambda conn: conn.execute(
                "SELECT version FROM axon_sessions WHERE session_id = %s", (session_id,)
            ).fetchone(),
            transaction=False,
        )
        return 0 if row is None else row[0]

    async def check_ready(self, session_id: str) -> None:
        """What ``/readyz`` asks (:mod:`runtime.app.web.health`): :meth:`version`'s look-up
        of ``session_id`` and, in the same statement, whether the server takes writes;
        raises :class:`~runtime.errors.StoreUnavailable` when it does not (a demoted
        primary, a standby, ``default_transaction_read_only``): every submit and save
        would fail, where the look-up alone answered."""
        validate_session_id(session_id)

        def ready(conn: Any) -> Any:
            row = conn.execute(
                "SELECT (SELECT version FROM axon_sessions WHERE session_id = %s), "
                "current_setting('transaction_read_only')",
                (session_id,),
            ).fetchone()
            if row[1] == "on":
                # A connection made while the server was read-only stays so once it is
                # writable again: dropped (the pool opens another), as a write that met
                # it drops it. A front end whose writes go from the event loop (its
                # submits) would else answer 503 here for good after a failover.
                conn.close()
            return row

        for _ in range(self._pool.max_size + 1):  # (each a connection of before, dropped)
            row = await self.run("readiness", ready, transaction=False)
            if row[1] != "on":
                return
        raise StoreUnavailable(
            f"session store {self.url} is read-only (transaction_read_only = on: a "
            "standby or a demoted primary): no turn can be queued or saved"
        )

    async def deletions(self, session_id: str) -> int:
        """How many times the session was deleted (its deletion mark, see
        :class:`~runtime.store.Store`): one primary-key lookup, ``0`` if never."""
        return (await self.version_and_deletions(session_id))[1]

    async def version_and_deletions(self, session_id: str) -> tuple[int, int]:
        """:meth:`version` and :meth:`deletions` in one statement (one snapshot, one round
        trip): what a turn of a session its host holds nothing stored of reads in place
        of the version alone."""
        validate_session_id(session_id)
        row = await self.run(
            f"version of session {session_id!r}",
            lambda conn: conn.execute(
                _VERSION_MARK_WRITERS_SQL if self._registered else _VERSION_MARK_SQL,
                {"s": session_id},
            ).fetchone(),
            transaction=False,
        )
        if self._registered:
            self._writers_seen = row[2]
        return int(row[0] or 0), int(row[1] or 0)

    # -- the hosts writing the store ------------------------------------------------------

    async def writers(self) -> dict[str, str]:
        """The hosts that said they write this store (:meth:`set_writer`): each one's name
        and what it stored (:func:`runtime.liveness.writer_row`). A few rows of
        ``axon_meta``."""
        rows = await self.run(
            "the hosts' registry",
            lambda conn: conn.execute(_WRITERS_SQL).fetchall(),
            transaction=False,
        )
        return {key[len(_WRITER_PREFIX) :]: value for key, value in rows}

    def writers_seen(self) -> list[str] | None:
        """Two names of the registry at most, as the last version query read them (every turn
        of a host that registered makes one as it starts), taken: ``None`` when none was
        read since the last taking (:meth:`writers` then reads them)."""
        seen, self._writers_seen = self._writers_seen, None
        if seen is None:
            return None
        return [key[len(_WRITER_PREFIX) :] for key in seen.split()]

    def writers_now(self) -> None:
        """``None``: every read of PostgreSQL waits (the host then awaits :meth:`writers`)."""
        return None

    async def set_writer(self, name: str, value: str | None, *, drop: Collection[str] = ()) -> None:
        """Store host ``name``'s row (``None``: remove it) and remove the rows of
        ``drop`` (hosts found gone), in one transaction. A row stored: this store's
        version queries read the registry's names from then on."""
        gone = [_WRITER_PREFIX + key for key in (*drop, *(() if value else (name,)))]

        def write(conn: Any) -> None:
            if gone:
                conn.execute("DELETE FROM axon_meta WHERE key = ANY(%s)", (gone,))
            if value is not None:
                conn.execute(
                    """INSERT INTO axon_meta (key, value) VALUES (%s, %s)
                    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value""",
                    (_WRITER_PREFIX + name, value),
                )

        await self.run("the hosts' registry", write)
        if value is not None:
            self._registered = True

    async def list_sessions(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[SessionInfo]:
        """The sessions with their message counts and meta, most recently saved first: all,
        or ``limit`` of them after the cursor ``after`` (the ``update_seq`` a
        :class:`SessionInfo` carries). ``update_seq`` has no index (every save changes it:
        an index would make each save's update non-HOT, see postgres_tables), so a page is
        a scan of the sessions' rows kept to the top ``limit`` (a bounded top-N heap, not a
        sort of them all); meta and message counts are read for the page's rows only."""
        below = None if after is None else parse_cursor(after)
        limit = check_limit(limit)
        rows = await self.run(
            "list_sessions",
            lambda conn: conn.execute(
                *((_LIST_SQL, (limit,)) if below is None else (_LIST_AFTER_SQL, (below, limit)))
            ).fetchall(),
            transaction=False,
        )
        return [
            SessionInfo(
                session_id=sid,
                message_count=count,
                meta=decode_meta(self.url, bytes(meta), sid),
                cursor=str(seq),
            )
            for sid, meta, count, seq in rows
        ]

    async def delete(self, session_id: str) -> None:
        """Delete the session and its messages, and the sub-sessions it owns, at any
        depth (its agent tools' calls', :mod:`actors.stores.owned`), theirs too;
        deleting an unknown session is a no-op.

        In the same transaction, the turns of each of them that are not over end ``cancelled``
        (finish reason ``aborted``, cancel reason ``session deleted``): a queued one or
        one waiting for a person never runs; a running one's worker has every later save
        refused (its fence: the row no longer runs), so nothing of it is written and the
        session is not created again, and it stops the turn at its lease's next renewal.
        The turns' rows are locked first, in line order, then the session's row, then
        the messages: the order a claim and a save take them (the messages before the
        session's row made a delete and a save wait for each other, and PostgreSQL failed
        one of them, "deadlock detected")."""
        validate_session_id(session_id)

        def delete(conn: Any) -> None:
            # with the sub-sessions it owns, any depth (actors.stores.owned), found by
            # reads before any lock, then locked and deleted as one session is
            owned = owned_sessions(session_id, lambda caller: _sub_candidates(conn, caller))
            turns = conn.execute(
                """SELECT turn_id, status FROM axon_turns
                WHERE session_id = ANY(%s)
                    AND status IN ('queued', 'running', 'awaiting-input')
                ORDER BY seq FOR UPDATE""",
                (owned,),
            ).fetchall()
            for turn_id, status in turns:  # one statement each: the head trigger moves on
                conn.execute(
                    """UPDATE axon_turns SET status = 'cancelled', finish_reason = 'aborted',
                        cancel_requested = true, cancel_reason = %s, owner = NULL,
                        lease_until = NULL, expires_at = NULL, resume_pending = false,
                        finished_at = clock_timestamp()
                    WHERE turn_id = %s""",
                    (SESSION_DELETED, turn_id),
                )
                conn.execute(
                    "SELECT pg_notify(%s, current_schema() || ':' || %s)",
                    (_TURNS_CHANNEL, turn_id),
                )
                if status == "running":
                    conn.execute("SELECT pg_notify(%s, %s)", (_CANCEL_CHANNEL, turn_id))
            # The sessions' rows, one at a time in id order (two deletes of overlapping
            # trees lock them in one order); each id's deletion mark moves if it was
            # stored (the trigger axon_sessions_deletion_v1, in the statement: a delete
            # of a session never stored, or deleted at once by another, moves nothing).
            for sid in sorted(owned):
                conn.execute("DELETE FROM axon_sessions WHERE session_id = %s", (sid,))
            conn.execute("DELETE FROM axon_messages WHERE session_id = ANY(%s)", (owned,))
            conn.execute("DELETE FROM axon_message_segments WHERE session_id = ANY(%s)", (owned,))

        await self.run(f"delete of session {session_id!r}", delete)

    async def aclose(self) -> None:
        """Close the pool; idempotent. Later calls raise :class:`~runtime.errors.StoreError`."""
        if self._closed:
            return
        self._closed = True
        self._lane.close()
        await trio.to_thread.run_sync(self._pool.close)


GROWN_FROM_BYTES = 8 * 1024
"""A grown message (:class:`~runtime.store.Store`'s grown rows) encoded to fewer bytes is
written whole; from this size on, as its head and a segment, both in the save's one call
(:data:`SAVE_FUNCTION`). A long turn's step save so writes at most this many bytes of
its answer and the step's new parts: its bytes no longer grow with its steps. (Below
it a head, a segment and the fold cost more than the bytes they save.)"""

_COMPACT_SQL = compact_segments_sql("%(session)s")
"""The session's heads folded into whole rows, then its segments deleted, in a save's
transaction that writes no head (as :data:`SAVE_FUNCTION`'s ``p_drop``: the session's
row is locked by the save, so no grown save of another process falls between)."""


def _write_segments(
    conn: Any, session_id: str, fresh: list[int], segments: list[tuple[int, int, bytes]]
) -> None:
    """In a grown save's transaction: the segments of the rows that became heads go
    (``fresh``: none, or left by a save of another version or process), then the new
    segments are written (over any left at their keys)."""
    if fresh:
        conn.execute(
            "DELETE FROM axon_message_segments WHERE session_id = %s AND idx = ANY(%s)",
            (session_id, fresh),
        )
    if segments:
        conn.execute(
            """INSERT INTO axon_message_segments (session_id, idx, first, body)
            SELECT %s, u.idx, u.first, u.body
            FROM unnest(%s::int[], %s::int[], %b::bytea[]) AS u(idx, first, body)
            ON CONFLICT (session_id, idx, first) DO UPDATE SET body = excluded.body""",
            (
                session_id,
                [s[0] for s in segments],
                [s[1] for s in segments],
                [s[2] for s in segments],
            ),
        )


def _created_meanwhile(
    url: str, session_id: str, expected_version: int | None, actual: int
) -> StoreConflict:
    return StoreConflict(
        f"save of session {session_id!r}: another writer created it "
        f"meanwhile (session store {url})",
        session_id=session_id,
        expected=expected_version or 0,
        actual=actual,
    )


_SAVE_SQL: Final = (
    f"SELECT * FROM {SAVE_FUNCTION_NAME}($1, $2, $3, $4, $5::int[], $6::text[], "
    "$7::bytea[], $8, $9, $10, $11, $12, $13, $14, $15, $16, $17::int[], $18::int[], "
    "$19::int[], $20::bytea[], $21)"
).encode()
"""The save function's call, as :class:`LoopLane` prepares it (parameters: ``$4`` and the
arrays in PostgreSQL's binary format, the rest as text: :data:`_SAVE_FORMATS`)."""
_SAVE_NAME: Final = b"axon_save_call"
_SAVE_SQL_ENDING = _SAVE_SQL
"""The call of a save that ends its turn: the same statement, prepared under a name of its
own (a crash test holds a worker inside it, before its commit, by replacing it:
``tests/support/worker_agent.py``)."""
_SAVE_NAME_ENDING: Final = b"axon_save_call_ending"
_SAVE_FORMATS: Final = (0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0)
_SAVE_NEXT_SQL: Final = (
    f"SELECT * FROM {SAVE_NEXT_FUNCTION_NAME}($1, $2, $3, $4, $5::int[], $6::text[], "
    "$7::bytea[], $8, $9, $10, $11, $12, $13, $14, $15, $16, $17::int[], $18::int[], "
    "$19::int[], $20::bytea[], $21)"
).encode()
"""The call of a last save with the next claim riding on it (:data:`SAVE_NEXT_FUNCTION`;
its answer in the binary format, as the claim's)."""
_SAVE_NEXT_NAME: Final = b"axon_save_next_call"
_SAVE_NEXT_FORMATS: Final = _SAVE_FORMATS
SAVE_NEXT_CLAIM_AT: Final = len(SAVE_NEXT_KINDS)
"""The column of :data:`SAVE_NEXT_FUNCTION`'s answer where the claim's columns begin."""
_DECIDE_SQL: Final = (
    f"SELECT * FROM {DECIDE_FUNCTION_NAME}($1, $2, $3, $4, $5, $6, $7::int[], $8::text[], "
    "$9::bytea[], $10, $11::float8)"
).encode()
"""The decision's function's call, as :class:`LoopLane` prepares it (``$6`` and the arrays
in the binary format, the rest as text; the answer in the binary format)."""
_DECIDE_NAME: Final = b"axon_decide_call"
_DECIDE_FORMATS: Final = (0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0)
_DECIDE_KINDS: Final = ("TEXT", "BIGINT", *STATUS_KINDS)
_INDEX_END: Final = 2**31
"""One past the last index a message may have (``axon_messages.idx`` is an ``INTEGER``)."""
_NUL: Final = b"\\u0000"
"""An escaped NUL in a JSON text: the save function's merge (``json_each``) reads keys as
PostgreSQL text, which cannot hold one, so a meta patch holding one goes as a transaction
(the merge in Python)."""
_TURNS_CHANNEL: Final = "axon_turns"
"""The turn queue's notification channel (:data:`actors.stores.turn_sql.TURNS_CHANNEL`),
where the save function sends a turn's end."""
_CANCEL_CHANNEL: Final = "axon_cancel"
"""Where a running turn's cancellation is said (:data:`actors.stores.turn_sql.CANCEL_CHANNEL`)."""
