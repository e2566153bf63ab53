"""A PostgreSQL store's connections' health and its retries: which errors are a server
out of reach (retried with backoff by :func:`_retrying`, then
:class:`~runtime.errors.StoreUnavailable`) and which fail at once, the pooled
connections' idle checks (:func:`_alive`) and the quieting of their expected discards,
and the thread token of its calls (:class:`FreeLimiter`);
:meth:`PostgresStore.run <actors.stores.postgres.PostgresStore.run>` uses them."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

import trio

from actors.stores.postgres_lane import idle_session_timeout
from runtime.errors import ConfigurationError, StoreError, StoreUnavailable
from runtime.redact import redact

_TRANSIENT = ("too many connections", "too many clients")
"""A connection refused for a limit (the server's ``max_connections``, a role's or a
database's ``CONNECTION LIMIT``): retried as an unreachable server is, though the text
names a role (``too many connections for role "app"``, which :data:`_PERMANENT`'s
``role`` took for a refused login: the call failed at once)."""


_PERMANENT = (
    "does not exist",
    "authentication failed",
    "password",
    "invalid",
    "role ",
    "unrecognized configuration parameter",  # the URL's options: no retry mends it
)


def _is_connection_error(err: BaseException) -> bool:
    import psycopg
    import psycopg_pool

    if isinstance(err, psycopg_pool.PoolTimeout):
        return True
    if isinstance(err, psycopg.errors.IdleInTransactionSessionTimeout):
        return True  # the server ended a frozen client's session: retry on another
    if isinstance(err, psycopg.errors.ReadOnlySqlTransaction):
        # A primary that became read-only (a failover's old primary, a standby the DNS
        # still names, default_transaction_read_only): nothing to fix in the request;
        # retried (on another connection: see _close_if_read_only) until it is writable again.
        return True
    if isinstance(err, psycopg.OperationalError):
        state = getattr(err, "sqlstate", None)
        # Class 08: connection exception; 57P0x: the server is shutting down/starting.
        return state is None or state.startswith("08") or state.startswith("57P")
    return isinstance(err, psycopg.InterfaceError)


IDLE_SESSION_TIMEOUT = "57P05"
"""The SQLSTATE of a connection the server closed for ``idle_session_timeout``
(``terminating connection due to idle-session timeout``): retried at once, once
(:meth:`PostgresStore.run`)."""

CHECK_IDLE = 1.0
"""Seconds a pooled connection may sit unused before the pool checks it (a round trip)
when it is handed out again."""


_READ_ONLY_SQL_TRANSACTION: Final = "25006"
"""SQLSTATE of ``psycopg.errors.ReadOnlySqlTransaction``: told by its code, which needs no
import on every statement's way out."""


def _close_if_read_only(conn: Any, err: Exception) -> None:
    """Close ``conn`` when ``err`` says what ran on it met a read-only server (the pool
    then drops it and opens another): a connection to a demoted primary or to a standby
    stays one, where a new connection follows the failover (a DNS name, a pooler, a
    multi-host URL with ``target_session_attrs=read-write``)."""
    if getattr(err, "sqlstate", None) == _READ_ONLY_SQL_TRANSACTION:
        conn.close()


_used: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
"""When each pooled connection last ended a transaction that went through (weak: a
connection the pool closed and dropped leaves no entry; by ``id``, one entry stayed for
each connection ever opened, and a new connection given a dead one's ``id`` inherited
its time and went unchecked)."""


_idle_limits: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
"""The server's ``idle_session_timeout`` (seconds) of each pooled connection that has
one (:func:`_note_idle_session_timeout`; weak, as :data:`_used`)."""


def _note_idle_session_timeout(conn: Any) -> float | None:
    """Note ``conn``'s ``idle_session_timeout`` (a role's, a database's, the URL's
    ``options``, the server's): past it the server closes the idle connection, and
    :func:`_alive` checks one idle for half of it (the event loop's connections, on the
    same URL, go by it too: :class:`LoopLane`). ``None`` on a server before 14 (no such
    setting) or with it off (0)."""
    limit = idle_session_timeout(conn)
    if limit is not None:
        _idle_limits[conn] = limit
    else:
        _idle_limits.pop(conn, None)
    return limit


def _alive(conn: Any) -> bool:
    """Whether ``conn``, taken from the pool, may be used: ``False`` if it was found
    closed (by the server: ``idle_session_timeout``, a restart), which the pool then
    discards. Checked (psycopg-pool's ``check_connection``, a round trip) only once idle
    for :data:`CHECK_IDLE`, or for half its ``idle_session_timeout`` when that is
    shorter: checking every time doubled the round trips of a busy worker, and a
    connection that carried a transaction a moment ago is as good as checked. One that
    broke anyway fails its transaction, which :meth:`PostgresStore.run` retries on
    another connection. Before, a timeout of 300 ms (below the check's second) failed
    every call that took a connection idle between the two, and the pool's own check
    starved it (its waits of a second after a failed check outlast the timeout)."""
    limit = _idle_limits.get(conn)
    bound = CHECK_IDLE if limit is None else min(CHECK_IDLE, limit / 2)
    if time.monotonic() - _used.get(conn, 0.0) <= bound:
        return True
    import psycopg  # (the round trip's path: a connection idle a while)
    import psycopg_pool

    try:
        psycopg_pool.ConnectionPool.check_connection(conn)
    except psycopg.Error:
        if not conn.closed:
            raise
        return False
    return True


_found_closed: set[int] = set()
"""Connections (by ``id``) :func:`_alive` found closed, on their way back to the pool
(:meth:`PostgresStore.run`),
whose discard psycopg-pool would log as a warning (``discarding closed connection``):
one a call after each idle spell past a short ``idle_session_timeout`` (85 in a worker's
ten turns at 300 ms), each expected and replaced. Any other discard is still logged."""


def _expected_discard(record: logging.LogRecord) -> bool:
    """psycopg-pool's log filter: ``False`` (dropped) for the discard of a connection
    :func:`_alive` found closed."""
    args = record.args
    if (
        record.msg == "discarding closed connection: %s"
        and isinstance(args, tuple)
        and len(args) == 1
        and id(args[0]) in _found_closed
    ):
        _found_closed.discard(id(args[0]))
        return False
    return True


def _quiet_expected_discards() -> None:
    """Install :func:`_expected_discard` on psycopg-pool's logger, once."""
    pool_log = logging.getLogger("psycopg.pool")
    if _expected_discard not in pool_log.filters:
        pool_log.addFilter(_expected_discard)


class FreeLimiter:
    """A :class:`trio.CapacityLimiter` for ``trio.to_thread.run_sync`` whose acquire takes
    no schedule point while a token is free (issue 24 goal 3).

    ``CapacityLimiter.acquire_on_behalf_of`` yields once even when a token is free (a
    cancel-shielded checkpoint), and ``to_thread.run_sync`` then parks the task at once
    until the thread's result: the first yield carried nothing, a task step and often a
    scheduler round more for every store call of a turn (claim, saves, finish). Free, the
    token is taken at once (cancellation still checked, as ``to_thread.run_sync`` checks
    it first too); while every token is out, or a task waits for one, the call waits in
    line as before, so the pool's size still bounds the threads.
    """

    __slots__ = ("_limiter",)

    def __init__(self, total_tokens: int) -> None:
        self._limiter = trio.CapacityLimiter(total_tokens)

    @property
    def limiter(self) -> trio.CapacityLimiter:
        """The limiter itself (its statistics)."""
        return self._limiter

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()  # yields only when cancelled
        try:
            self._limiter.acquire_on_behalf_of_nowait(borrower)
        except trio.WouldBlock:
            await self._limiter.acquire_on_behalf_of(borrower)

    def release_on_behalf_of(self, borrower: object) -> None:
        self._limiter.release_on_behalf_of(borrower)


async def _retrying(
    action: str, retry_for: float, fn: Callable[[], Any], *, log: Any = None
) -> Any:
    """Await ``fn()``, retrying connection failures with exponential backoff (0.05 s
    doubling to 2 s) for ``retry_for`` seconds; other database errors fail at once.
    psycopg's module is imported on a failure only: each save and claim of a worker's
    turn comes through here, and an import statement was ~0.5 µs a call (issue 24 goal 3)."""
    deadline = time.monotonic() + retry_for
    delay = 0.05
    while True:
        try:
            return await fn()
        except (StoreError, ConfigurationError):
            raise
        except Exception as err:
            import psycopg

            if not isinstance(err, psycopg.Error):
                raise
            message = redact(str(err).strip().splitlines()[0] if str(err).strip() else repr(err))
            lowered = message.lower()
            permanent = not _is_connection_error(err) or (
                any(word in lowered for word in _PERMANENT)
                and not any(word in lowered for word in _TRANSIENT)
            )
            if permanent:
                raise StoreError(f"{action} failed: {message}") from err
            if time.monotonic() + delay > deadline:
                what = (
                    "is read-only"
                    if isinstance(err, psycopg.errors.ReadOnlySqlTransaction)
                    else "cannot be reached"
                )
                raise StoreUnavailable(
                    f"{action} failed: the PostgreSQL server {what} ({message}); "
                    f"gave up after retrying for {retry_for:g} s"
                ) from err
            if log is not None:
                log.warning("store.retry", action=action, error=message, delay=delay)
            await trio.sleep(delay)
            delay = min(delay * 2, 2.0)
