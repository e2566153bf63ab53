"""Waking idle workers: the turn queue's ``LISTEN axon_turns`` connection
(:meth:`TurnListening.wait`), kept open between waits and blocked on in a thread.

Apart from the claims because it is the one part of :class:`~actors.stores.turns.TurnQueue`
with state of its own (the connection, and the thread a cancelled wait abandons:
:class:`_Listener`), and the one that holds a connection outside the store's pool.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import trio

from actors.stores.postgres import CONNECT_TIMEOUT
from actors.stores.turn_sql import TURNS_CHANNEL
from runtime.errors import StoreError
from runtime.redact import redact

if TYPE_CHECKING:
    from actors.stores.postgres import PostgresStore


class _Listener:
    """The state of one wait thread, shared with the Trio side: a wait cancelled while
    its thread blocks abandons the thread, which then closes the connection itself."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.abandoned = False
        self.done = False


class TurnListening:
    """The workers' wait for new work (mixed into :class:`~actors.stores.turns.TurnQueue`,
    which creates the state it keeps)."""

    if TYPE_CHECKING:  # provided by the turn queue
        store: PostgresStore
        _listen: _Listener | None
        _wait_lock: trio.Lock
        _closed: bool
        _log: Any

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - a thread blocks on it
        """Block until a ``NOTIFY axon_turns`` arrives or ``timeout`` seconds pass; ``True``
        if notified (something may be claimable or finished).

        The ``LISTEN`` connection stays open between calls, so a notification sent while
        the worker was busy is kept and the next wait returns at once. When the connection
        is (re)opened, notifications may have been missed, so that wait returns ``True``
        at once: a spurious wake-up costs one claim, a missed one a whole ``timeout``.
        Cancelling a wait abandons its thread, which closes the connection when it ends.
        Meant for one worker loop: concurrent waits on one queue take turns (front ends
        waiting for a turn use :meth:`wait_finished`).
        """
        if self._closed:
            raise StoreError(f"turn queue of {self.store.url} is closed")
        async with self._wait_lock:
            listener = self._listen
            if listener is None or listener.conn.closed or listener.conn.broken:
                if listener is not None:
                    await trio.to_thread.run_sync(listener.conn.close)
                    self._listen = None
                try:
                    conn = await trio.to_thread.run_sync(self._connect_listener)
                except Exception as err:
                    # Down: say "maybe" after a pause; the caller's next query retries.
                    self._log.warning("turns.listen_failed", error=redact(str(err)))
                    await trio.sleep(min(timeout, 1.0))
                    return True
                self._listen = _Listener(conn)
                return True
            try:
                return await trio.to_thread.run_sync(
                    _wait_for_notify,
                    listener,
                    f"{self.store.schema}:",
                    timeout,
                    abandon_on_cancel=True,
                )
            except trio.Cancelled:
                with listener.lock:
                    listener.abandoned = True
                    done = listener.done
                self._listen = None
                if done:
                    listener.conn.close()
                raise
            except Exception as err:  # the connection broke: reopen on the next wait
                self._log.warning("turns.listen_broken", error=redact(str(err)))
                return True

    async def aclose(self) -> None:
        """Close the ``LISTEN`` connection; idempotent (the store stays open: it is the
        caller's)."""
        self._closed = True
        listener, self._listen = self._listen, None
        if listener is not None:
            await trio.to_thread.run_sync(listener.conn.close)

    def _connect_listener(self) -> Any:
        import psycopg

        conn = psycopg.connect(self.store.libpq, connect_timeout=CONNECT_TIMEOUT, autocommit=True)
        try:
            conn.execute(f"LISTEN {TURNS_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return conn


def _wait_for_notify(listener: _Listener, prefix: str, timeout: float) -> bool:
    """In a worker thread: block on the LISTEN connection until a notification of this
    schema (payload starting with ``prefix``) arrives or ``timeout`` passes."""
    deadline = time.monotonic() + max(timeout, 0.0)
    try:
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            for notify in listener.conn.notifies(timeout=remaining, stop_after=1):
                if notify.payload.startswith(prefix):
                    return True
            if time.monotonic() >= deadline:
                return False
    finally:
        with listener.lock:
            listener.done = True
            abandoned = listener.abandoned
        if abandoned:
            listener.conn.close()
