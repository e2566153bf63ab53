"""Waking idle workers: the turn queue's ``LISTEN axon_turns`` connection
(:meth:`TurnListening.wait`), kept open between waits, its socket waited on by Trio.

Apart from the claims because it is the one part of :class:`~actors.stores.turns.TurnQueue`
with state of its own (the connection: :class:`_Listener`), and the one that holds a
connection outside the store's pool.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from actors.stores.postgres_lane import CONNECT_TIMEOUT, _close_on_loop
from actors.stores.turn_sql import TURNS_CHANNEL
from runtime.errors import StoreError
from runtime.redact import redact

if TYPE_CHECKING:
    from actors.stores.postgres import PostgresStore
    from runtime.log_repeats import RepeatedWarning


class _Listener:
    """The ``LISTEN`` connection of a queue's waits."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.fresh = True
        """Opened since the last wait: notifications may have been missed, so the next
        wait returns at once (a check of the connection may open it, not only a wait)."""


class TurnListening:
    """The workers' wait for new work (mixed into :class:`~actors.stores.turns.TurnQueue`,
    which creates the state it keeps)."""

    if TYPE_CHECKING:  # provided by the turn queue
        store: PostgresStore
        _listen: _Listener | None
        _wait_lock: trio.Lock
        _closed: bool
        _log: Any
        _listen_failed: RepeatedWarning

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - the queue's API
        """Block until a ``NOTIFY axon_turns`` arrives or ``timeout`` seconds pass; ``True``
        if notified (something may be claimable or finished).

        The ``LISTEN`` connection stays open between calls, so a notification sent while
        the worker was busy is kept and the next wait returns at once. When the connection
        is (re)opened, notifications may have been missed, so that wait returns ``True``
        at once: a spurious wake-up costs one claim, a missed one a whole ``timeout``.
        The connection's socket is waited on by Trio, not by a thread: a notification
        wakes the worker without a thread's hand-off, and a cancelled wait leaves the
        connection as it was (nothing half read). Meant for one worker loop: concurrent
        waits on one queue take turns (front ends waiting for a turn use
        :meth:`wait_finished`).
        """
        if self._closed:
            raise StoreError(f"turn queue of {self.store.url} is closed")
        if getattr(self.store, "listen_libpq", "") is None:
            # Behind a transaction pooler a LISTEN lands on whichever server connection
            # ran it and is never heard on this one: the worker polls (``--poll``), unless
            # the URL names the server itself for it (``listen_host``/``listen_port``).
            await trio.sleep(max(timeout, 0.0))
            return False
        async with self._wait_lock:
            listener = self._listen
            if listener is None or listener.conn.closed or listener.conn.broken:
                if not await self._reopen(listener):
                    # Down: say "maybe" after a pause; the caller's next query retries.
                    await trio.sleep(min(timeout, 1.0))
                    return True
                assert self._listen is not None
                self._listen.fresh = False  # (said now)
                return True
            if listener.fresh:  # opened by a check since the last wait
                listener.fresh = False
                return True
            try:
                return await _wait_for_notify(listener.conn, f"{self.store.schema}:", timeout)
            except Exception as err:  # the connection broke: reopen on the next wait
                self._listen = None
                _close_on_loop(listener.conn)
                self._log.warning("turns.listen_broken", error=redact(str(err)))
                return True

    async def _reopen(self, listener: _Listener | None) -> bool:
        """Open a ``LISTEN`` connection in place of ``listener`` (broken, or none), under
        the wait lock; ``False`` (logged) when it could not be opened."""
        if listener is not None:
            _close_on_loop(listener.conn)
            self._listen = None
        try:
            conn = await trio.to_thread.run_sync(self._connect_listener)
        except Exception as err:
            self._listen_failed.warning(error=redact(str(err)))
            return False
        self._listen_failed.clear()
        self._listen = _Listener(conn)
        return True

    async def check_listening(self) -> bool:
        """Whether the ``LISTEN`` connection answers: one round trip on it (``SELECT 1``),
        taken between two waits (the one in progress ends first, within its timeout).
        ``False`` when it broke, or could not be (re)opened. A connection that does not
        answer (its server end paused or partitioned away: no notification reaches it,
        and nothing tells the socket so) is dropped when the caller gives up on the check
        (its cancellation): the next wait opens another, at once (a new connection may
        have missed notifications). Not a wait's business: a worker whose slots are all
        busy does not wait, and its ``LISTEN`` connection is checked all the same.
        Opens the connection when there is none (one that broke while nothing waited),
        as a wait would."""
        if self._closed:
            raise StoreError(f"turn queue of {self.store.url} is closed")
        if getattr(self.store, "listen_libpq", "") is None:
            # Behind a transaction pooler with no server named for it: no LISTEN to
            # check (the worker polls); one opened here would land on a pooled server
            # connection and stay there for the pooler's next client.
            await trio.lowlevel.checkpoint()
            return True
        async with self._wait_lock:
            listener = self._listen
            if listener is None or listener.conn.closed or listener.conn.broken:
                return await self._reopen(listener)  # fresh: the next wait returns at once
            answered = False
            try:
                await _ping(listener.conn)
                answered = True
            except Exception as err:  # broke: the next wait (or check) opens another
                self._log.warning("turns.listen_broken", error=redact(str(err)))
            finally:
                if not answered:  # broke, or no answer within the caller's bound
                    if self._listen is listener:
                        self._listen = None
                    _close_on_loop(listener.conn)
            return answered

    async def aclose(self) -> None:
        """Close the ``LISTEN`` connection; idempotent (the store stays open: it is the
        caller's)."""
        self._closed = True
        listener, self._listen = self._listen, None
        if listener is not None:
            _close_on_loop(listener.conn)
            await trio.lowlevel.checkpoint()

    def _connect_listener(self) -> Any:
        import psycopg

        conn = psycopg.connect(
            getattr(self.store, "listen_libpq", None) or self.store.libpq,
            connect_timeout=CONNECT_TIMEOUT,
            autocommit=True,
        )
        try:
            if conn.info.server_version >= 140000:
                # Waiting idle is this connection's work: a role's (or the server's)
                # idle_session_timeout closed it at each wait longer than the timeout
                # (at 300 ms: a `turns.listen_broken` warning and a reconnect each 0.3 s,
                # each reconnect's notifications missed). One round trip with the LISTEN.
                conn.execute(f"SET idle_session_timeout = 0; LISTEN {TURNS_CHANNEL}")
            else:  # (no such setting before 14)
                conn.execute(f"LISTEN {TURNS_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return conn


_TUPLES_OK = 2
"""libpq's ``PGRES_TUPLES_OK`` (``psycopg.pq.ExecStatus.TUPLES_OK``, psycopg imported
only once a connection is made)."""


async def _ping(conn: Any) -> None:
    """One ``SELECT 1`` on the idle ``LISTEN`` connection, its socket waited on by Trio;
    raises when the connection broke or the query failed. Notifications received
    meanwhile stay in libpq's list for the next wait."""
    pgconn = conn.pgconn
    pgconn.send_query(b"SELECT 1")
    while pgconn.flush():
        await trio.lowlevel.wait_writable(pgconn.socket)
    while True:
        pgconn.consume_input()
        if not pgconn.is_busy():
            break
        await trio.lowlevel.wait_readable(pgconn.socket)
    failed = None
    while (result := pgconn.get_result()) is not None:
        if result.status != _TUPLES_OK:
            failed = failed or (result.error_message or b"").decode(errors="replace")
    if failed is not None:
        raise StoreError(f"the LISTEN connection's check failed: {failed.strip()}")


async def _wait_for_notify(conn: Any, prefix: str, timeout: float) -> bool:  # noqa: ASYNC109
    """Wait on the ``LISTEN`` connection (libpq's non-blocking reads, its socket waited
    on by Trio) until a notification of this schema (payload starting with ``prefix``)
    arrives or ``timeout`` passes; those already received are looked at first.

    Every notification received so far is taken off the connection by the wait that
    returns, not one a wait: each turn's end notifies every worker, and a worker busy
    with its slots full reads none until it waits, so one that took them a wait at a
    time made a claim for each (issue 24 goal 3: at a batch's end, a claim that found
    nothing for every turn any worker ended meanwhile). One claim after the wait sees
    what all of them announced: the worker claims until a claim finds nothing."""
    pgconn = conn.pgconn
    fd = pgconn.socket
    with trio.move_on_after(max(timeout, 0.0)):
        while True:
            if _drained(pgconn, prefix):
                return True
            await trio.lowlevel.wait_readable(fd)
    return False


def _drained(pgconn: Any, prefix: str) -> bool:
    """Read what the socket holds and take every notification received off ``pgconn``;
    whether one was this schema's (payload starting with ``prefix``). Reads again until
    a read brings no notification: libpq's one read stops at its buffer's size."""
    ours = False
    while True:
        pgconn.consume_input()
        got = False
        while (notify := pgconn.notifies()) is not None:
            got = True
            ours = ours or notify.extra.decode(errors="replace").startswith(prefix)
        if not got:
            return ours
