"""Connections a PostgreSQL store runs its one-statement calls on from the event loop.

:class:`LoopLane` sends a statement with libpq's non-blocking API and waits for its
socket under Trio, without a thread; the store's transactions still run in threads on
its pool. Apart from :mod:`actors.stores.postgres` because it is transport, not storage:
the turn queue's ``LISTEN`` connection closes its connections the same way
(:func:`_close_on_loop`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, Final

import trio

CONNECT_TIMEOUT = 5
"""Seconds a new connection may take to be made (libpq's ``connect_timeout``)."""

SESSION_SETTINGS: Final = {
    "default_transaction_isolation": "read committed",
    "standard_conforming_strings": "on",
}
"""Settings the store's SQL needs whatever a database's or role's defaults say, set on
every connection it opens (:func:`set_session`; behind a transaction pooler, where no
``SET`` outlives a transaction, opening checks them instead, :func:`unlike_session`).

- ``default_transaction_isolation``: its statements and functions count what others
  committed while they waited for a lock (the caps' counts after the session's and the
  queue's locks, a claim's or a save's row read again after its lock), read committed's
  statement snapshot. Set to ``repeatable read`` by an operator, two processes' submits
  to one session at a cap of 3 queued 8 (each counted in the snapshot of its call's
  start); ``serializable`` failed racing submits ``could not serialize access`` (a front
  end's 500).
- ``standard_conforming_strings``: the functions' and triggers' ``bytea`` literals
  (``'\\x7b7d'``, a head's prefix, the caller key) are read as written only when on (the
  server's default since 9.1). Off (a legacy application's database), ``'\\x7b'`` was
  an escape: every save failed ``invalid input syntax for type bytea`` or stored a meta
  the store then called corrupt, and a schema created so kept a trigger whose condition
  never matched."""


def set_session(conn: Any, *, local: bool = False) -> None:
    """:data:`SESSION_SETTINGS` on ``conn`` (a direct connection, not a pooler's; ``local``:
    for the transaction it is in only)."""
    for name, value in SESSION_SETTINGS.items():
        conn.execute(f"SET {'LOCAL ' if local else ''}{name} TO '{value}'")


def unlike_session(conn: Any) -> dict[str, str]:
    """The :data:`SESSION_SETTINGS` ``conn``'s session does not have as they must be."""
    return {
        name: got
        for name, value in SESSION_SETTINGS.items()
        if (got := conn.execute("SELECT current_setting(%s)", (name,)).fetchone()[0]) != value
    }


class LoopLane:
    """Connections a store runs its one-statement calls on from the event loop itself,
    without a thread (issue 24 goal 3): a save is one call of :data:`SAVE_FUNCTION`, and
    in a thread it cost ~270 µs of the worker's CPU where the same statement sent from
    the loop (libpq's non-blocking API, the socket waited on by Trio) cost ~60 µs: the
    thread's hand-off and its wake-ups, and psycopg's cursor (query conversion, parameter
    dumping, the prepared statements' bookkeeping) for a statement whose parameters and
    result this store encodes and reads itself.

    At most ``size`` connections, opened (in a thread) when every open one is busy; a
    call waits for one beyond that. A call is shielded from cancellation, as a thread's
    is: once sent, its statement commits or not whatever the caller does, and its answer
    is read. A connection that fails is closed, never reused; the caller retries on
    another (:func:`_retrying`)."""

    def __init__(
        self,
        libpq: str,
        schema: str,
        size: int,
        *,
        pooled: bool = False,
        idle_limit: list[float | None] | None = None,
    ) -> None:
        self._libpq = libpq
        self._idle_limit = [None] if idle_limit is None else idle_limit
        """The server's ``idle_session_timeout`` (seconds; ``None``: none known), as the
        store's pooled connections on the same URL last read it: asked on each of these
        too, it cost a statement a connection."""
        self._schema = schema
        self._pooled = pooled
        """Behind a transaction pooler (``?pooler=transaction``): each call an unnamed
        statement (parsed at each call; a named one stays on the server connection it
        was prepared on, which the pooler hands to others), and no ``SET search_path``."""
        self._free: list[Any] = []
        self._slots = trio.Semaphore(size)
        self._closed = False

    async def call(
        self,
        name: bytes,
        sql: bytes,
        params: Sequence[bytes | None],
        formats: Sequence[int],
        result_format: int = 0,
        keep: frozenset[str] = frozenset(),
    ) -> Any:
        """The one result of prepared statement ``name`` (``sql``, prepared on a
        connection's first call of it) run with ``params``; a database error raises as
        psycopg raises it. The connection is closed after an error, unless its
        ``SQLSTATE`` is one of ``keep``: a refusal the statement raises on purpose (a
        submit's over a cap), after which the connection is idle and sound, and a
        client refused again and again would else cost the server a new backend each
        time."""
        # A free slot is taken without a schedule point (``Semaphore``'s ``async with``
        # yields once even then: a task step for nothing, a few a turn): the call's wait
        # for its answer is its schedule point, its cancellation checked here first.
        await trio.lowlevel.checkpoint_if_cancelled()
        slots = self._slots
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            await slots.acquire()
        try:
            conn = self._take_free() or await trio.to_thread.run_sync(self._connect)
            ok = False
            try:
                pgconn = conn.pgconn
                if self._pooled:
                    pgconn.send_query_params(sql, params, None, formats, result_format)
                else:
                    prepared = conn._axon_prepared
                    if name not in prepared:
                        with trio.CancelScope(shield=True):
                            pgconn.send_prepare(name, sql)
                            await _lane_result(conn, [])
                        prepared.add(name)
                    pgconn.send_query_prepared(name, params, formats, result_format)
                # On a busy machine the answer is often whole at once (the backend the
                # statement woke ran before this task went on): the shield's scope is
                # entered only for a wait, the one thing it shields (issue 24 goal 3).
                results: list[Any] = []
                sent = not pgconn.flush()
                if sent and _answered(pgconn, results):
                    result = _checked(results)
                else:
                    with trio.CancelScope(shield=True):
                        result = await _lane_result(conn, results, read=sent)
                ok = True
                return result
            except Exception as err:
                ok = bool(keep) and getattr(err, "sqlstate", None) in keep
                raise
            finally:
                if ok and not self._closed:
                    conn._axon_freed = time.monotonic()
                    self._free.append(conn)
                else:
                    _close_on_loop(conn)
        finally:
            slots.release()

    def _take_free(self) -> Any:
        """The free connection used last (``None``: none), those the server has closed
        or is about to close dropped without a round trip: idle for half their
        ``idle_session_timeout`` (:attr:`_idle_limit`). Before, each call after
        an idle spell past a short timeout (300 ms) met a closed connection, and was
        retried with a ``store.retry`` warning on the next closed one (21 warnings in
        24 calls)."""
        while self._free:
            conn = self._free.pop()
            limit = self._idle_limit[0]
            if limit is None or time.monotonic() - conn._axon_freed < limit / 2:
                return conn
            _close_on_loop(conn)
        return None

    def _connect(self) -> Any:
        import psycopg

        # UTF-8 whatever the URL, PGCLIENTENCODING or the database would make it: the lane
        # encodes its text parameters (a worker's name) and decodes its text columns (a
        # turn's input) itself, as UTF-8, where psycopg uses the connection's encoding.
        conn = psycopg.connect(
            self._libpq, connect_timeout=CONNECT_TIMEOUT, autocommit=True, client_encoding="UTF8"
        )
        try:
            if not self._pooled:
                conn.execute(f"SET search_path TO {self._schema}")
                set_session(conn)
        except BaseException:
            conn.close()
            raise
        conn._axon_prepared = set()  # type: ignore[attr-defined]
        conn._axon_freed = time.monotonic()  # type: ignore[attr-defined]
        return conn

    def close(self) -> None:
        self._closed = True
        free, self._free = self._free, []
        for conn in free:
            _close_on_loop(conn)


def idle_session_timeout(conn: Any) -> float | None:
    """``conn``'s ``idle_session_timeout`` in seconds (a role's, a database's, the URL's
    ``options``, the server's), past which the server closes it while idle; ``None``
    when off (0) or on a server before 14 (no such setting). Not asked behind a
    transaction pooler: its server connections' timeouts are the pooler's business."""
    row = conn.execute(
        "SELECT setting::bigint FROM pg_settings WHERE name = 'idle_session_timeout'"
    ).fetchone()
    return None if row is None or row[0] <= 0 else row[0] / 1000


def _close_on_loop(conn: Any) -> None:
    """Close a :class:`LoopLane` connection, Trio told first that its socket goes (the
    loop may hold it registered; its number may be reused by the next one)."""
    with contextlib.suppress(Exception):
        trio.lowlevel.notify_closing(conn.pgconn.socket)
    conn.close()


def _answered(pgconn: Any, results: list[Any]) -> bool:
    """Whether the whole answer to the statement just sent (and flushed) on ``pgconn``
    is in already: the socket read once, without a wait, its results into ``results``.
    When it is not (libpq busy, the socket just read), :func:`_lane_result` goes on with
    ``read=True``."""
    pgconn.consume_input()
    while not pgconn.is_busy():
        result = pgconn.get_result()
        if result is None:
            return True
        results.append(result)
        if pgconn.is_busy():
            pgconn.consume_input()
    return False


async def _lane_result(conn: Any, results: list[Any], *, read: bool = False) -> Any:
    """The result of the statement just sent on ``conn`` (non-blocking libpq), its socket
    waited on by Trio, going on from ``results`` (those :func:`_answered` read; ``read``:
    it read the socket last, and libpq was busy); an error result raises as psycopg
    raises it, once the connection is idle again.

    The socket is read at once after the send (on a busy machine the server often
    answered before this task ran again: no wait then), and after a result only when
    libpq does not hold the rest of the answer already (``is_busy`` parses what it holds
    without a read): a read after a result whose ``ReadyForQuery`` came in the same read
    found nothing, a ``recv`` failing with ``EAGAIN`` every call (issue 24 goal 3)."""
    pgconn = conn.pgconn
    fd = pgconn.socket
    while pgconn.flush():
        await trio.lowlevel.wait_writable(fd)
    if not read:
        pgconn.consume_input()
    while True:
        while pgconn.is_busy():
            await trio.lowlevel.wait_readable(fd)
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            break
        results.append(result)
        if pgconn.is_busy():
            pgconn.consume_input()
    return _checked(results)


_FATAL_ERROR: Final = 7
"""libpq's ``PGRES_FATAL_ERROR`` (``psycopg.pq.ExecStatus.FATAL_ERROR``): a result's
status read without psycopg's module, which :func:`_checked` imports for an error only
(an import statement a call was ~0.5 µs, two lane calls a worker's turn; issue 24 goal 3)."""


def _checked(results: list[Any]) -> Any:
    """The last of a statement's ``results``; an error result raises as psycopg raises it."""
    for result in results:
        if result.status == _FATAL_ERROR:
            import psycopg

            raise psycopg.errors.error_from_result(result, encoding="utf-8")
    return results[-1]
