"""The persister: the one writer of the session store in this host.

Turn runners send it :class:`~runtime.protocol.SaveRequest` s at every step boundary
and at the end of each turn; it writes them in order and signals ``done``. Being its
own actor, its writes are not cancelled when a turn is: a turn that is aborted still
gets its final save, and the turn runner waits for it in a shielded, time-bounded scope.

It is the one writer *in this host*, not on the store: another process may save the same
session. Every save is therefore based on a version (the store's version rule), and a
save that meets a newer version is rebased, never forced: the session is reloaded and the
request's messages are appended after what the store now holds. Nothing either writer
stored is lost; the turn runner adopts the new layout when it sees the request done.
"""

from __future__ import annotations

from typing import Any

from runtime.actor import Actor
from runtime.errors import StoreConflict, StoreError
from runtime.events import SessionSaved
from runtime.logging import get_logger
from runtime.protocol import SaveRequest
from runtime.redact import redact
from runtime.store import Store, rebase

REBASE_ATTEMPTS = 5
"""Reload-and-append attempts for one save before it fails with StoreConflict (another
writer saving the same session between each of our reloads and writes, five times over)."""


class Persister(Actor):
    inbox_capacity = 4096

    def __init__(self, store: Store, *, name: str = "persister") -> None:
        super().__init__(name=name)
        self.store = store
        self._log = get_logger("axon.persister")

    async def handle(self, message: Any) -> None:
        if not isinstance(message, SaveRequest):
            return
        try:
            await self._write(message)
        except Exception as exc:  # a failed write is reported to the waiter, never lost
            message.error = exc
            self._log.error(
                "session.save-failed",
                session_id=message.session_id,
                turn_id=message.turn_id,
                error=redact(f"{type(exc).__name__}: {exc}"),
            )
        else:
            before = message.start if message.base is None else len(message.base)
            await self.publish(
                SessionSaved(
                    session_id=message.session_id,
                    turn_id=message.turn_id,
                    message_count=before + len(message.messages),
                    step=message.step,
                )
            )
        finally:
            message.after = None  # only its outcome was needed: do not chain every request
            if message.on_done is not None:
                message.on_done(message)
            message.done.set()

    async def _write(self, req: SaveRequest) -> None:
        """Save ``req`` on top of the version it was based on, or rebase it."""
        expected = _based_on(req)
        if expected is not None:
            try:
                req.version = _checked(
                    self.store,
                    await self.store.save(
                        req.session_id,
                        req.start,
                        req.messages,
                        req.meta,
                        expected_version=expected,
                    ),
                )
                return
            except StoreConflict:
                pass  # another writer saved the session since: rebase below
        conflict: StoreConflict | None = None
        for _ in range(REBASE_ATTEMPTS):
            record = await self.store.load(req.session_id)
            stored = () if record is None else record.messages
            base, start = rebase(stored, req.messages)
            try:
                version = await self.store.save(
                    req.session_id,
                    start,
                    base[start:] + req.messages,
                    req.meta,
                    expected_version=0 if record is None else record.version,
                )
            except StoreConflict as exc:
                conflict = exc  # overtaken again between our load and our write
                continue
            req.version, req.base = _checked(self.store, version), base
            return
        raise StoreConflict(
            f"save of session {req.session_id!r} gave up: another writer saved it between "
            f"each of {REBASE_ATTEMPTS} reloads and writes; the turn is kept in memory and "
            "the next save tries again",
            session_id=req.session_id,
            expected=conflict.expected if conflict else -1,
            actual=conflict.actual if conflict else -1,
        ) from conflict


def _based_on(req: SaveRequest) -> int | None:
    """The version ``req``'s ``start`` and ``messages`` are known to fit, if any.

    A request made while the previous one was in flight fits the version that one left,
    provided it wrote where it was asked to (no rebase, no failure): then nothing moved.
    """
    if req.expected_version is not None:
        return req.expected_version
    prev = req.after
    if prev is not None and prev.error is None and prev.base is None:
        return prev.version
    return None


def _checked(store: Store, version: Any) -> int:
    """``version`` if it is one; a store that returns none cannot keep the version rule."""
    if not isinstance(version, int) or isinstance(version, bool):
        raise StoreError(
            f"{type(store).__name__}.save returned {version!r}, not the session's new "
            "version: a Store's save must return it (see runtime.store.Store)"
        )
    return version
