"""An in-memory :class:`~runtime.store.Store`: sessions live as long as the object.

Messages are frozen attrs values, so the store keeps references to them instead of
serialized copies: nobody can change a stored message behind the store's back. Metadata
is a plain (mutable) dict, so it is deep-copied on the way in and on the way out.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

import attrs
import trio

import runtime.store as store_contract
from actors.stores.owned import owned_sessions
from actors.stores.validation import (
    check_limit,
    check_save,
    deleted_since,
    kept_tail,
    parse_cursor,
)
from runtime.errors import StoreConflict, StoreError
from runtime.messages import Message
from runtime.store import SessionInfo, SessionRecord, validate_session_id
from runtime.tools import PARENT_SESSION_META, caller_of


@attrs.define(slots=True)
class _Session:
    messages: list[Message]
    meta: dict[str, Any]
    version: int = 0
    incarnation: int = 0
    """The version the session's first save gave it (:attr:`SessionRecord.incarnation`)."""
    seq: int = 0
    """The session's place in recency order: the store's write count at its last save."""


class MemoryStore:
    """Sessions in a dict; for tests, one-shot runs and as the reference behaviour.

    Every method checkpoints first and then does all its work without yielding, so each
    call is atomic with respect to other Trio tasks (no lock needed) and a cancelled call
    changes nothing. ``save`` costs what it writes: the tail from ``start`` is cut from a
    list and the new messages appended, the earlier messages are not copied.
    """

    keeps_rows: Final = True
    """Its ``save`` takes ``kept`` (:class:`~runtime.store.Store`'s kept rows)."""

    checks_absent_mark: Final = True
    """Its ``save`` takes ``absent_mark`` (:func:`~runtime.store.checks_absent_mark`)."""

    def __init__(self) -> None:
        # Insertion order is recency: save moves its session to the end, so
        # list_sessions (most recently updated first) is the dict reversed.
        self._sessions: dict[str, _Session] = {}
        self._deleted_version = 0
        self._deletions: dict[str, int] = {}
        """Each deleted id's mark (:meth:`deletions`), in the order they were set: the
        marks of the last :data:`~runtime.store.DELETION_MARKS_KEPT` deletions."""
        self._top_mark = 0
        """The highest mark set (the next deletion's is one above)."""
        self._seq = 0
        """How many saves the store has taken: the next save's place in recency order."""
        """The highest version a deleted session had: a re-created session starts above
        it, so a writer still holding the old session's version can never match."""
        self._by_caller: dict[str, dict[str, None]] = {}
        """The stored sessions whose meta names a caller (:func:`~runtime.tools.caller_of`),
        by that caller (an ordered set each), kept by :meth:`save` and :meth:`delete`: a
        delete finds a session's sub-sessions here, where it read every stored
        session's meta once per session of the deleted tree."""
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("the memory store is closed")

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` if it was never saved (or was deleted)."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        validate_session_id(session_id)
        session = self._sessions.get(session_id)
        if session is None:
            return None
        return SessionRecord(
            session_id=session_id,
            messages=tuple(session.messages),
            meta=copy.deepcopy(session.meta),
            version=session.version,
            incarnation=session.incarnation,
        )

    async def version(self, session_id: str) -> int:
        """The session's version, ``0`` if it does not exist."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        validate_session_id(session_id)
        session = self._sessions.get(session_id)
        return 0 if session is None else session.version

    async def deletions(self, session_id: str) -> int:
        """How many times the session was deleted (its deletion mark, see
        :class:`~runtime.store.Store`): ``0`` if never."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        validate_session_id(session_id)
        return self._deletions.get(session_id, 0)

    async def version_and_deletions(self, session_id: str) -> tuple[int, int]:
        """:meth:`version` and :meth:`deletions`, read at once."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        validate_session_id(session_id)
        session = self._sessions.get(session_id)
        version = 0 if session is None else session.version
        return version, self._deletions.get(session_id, 0)

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
    ) -> int:
        """Replace messages ``start..`` with ``messages`` and merge ``meta`` into the session's;
        returns the session's new version. The messages at positions ``kept`` are held
        as they are already (:class:`~runtime.store.Store`'s kept rows): not written.

        With ``expected_version``, the session's version must be exactly that (``0``: it
        must not exist yet), or :class:`~runtime.errors.StoreConflict` is raised and nothing
        changes: the caller's view of the session is stale and writing would overwrite
        another writer's messages.

        ``start`` may equal the current message count (append) but not exceed it: a gap
        would mean the caller lost track of the session, and filling it with nothing would
        hide that. The merge is shallow (``dict.update``): keys in ``meta`` replace the
        stored ones, others are kept. Raises :class:`~runtime.errors.StoreError` for a
        bad ``start``, messages that are not ``Message`` values, or a non-dict ``meta``;
        the session is then unchanged. With ``absent_mark``, a save that would create the
        session raises :class:`~runtime.errors.SessionDeleted` instead when its deletion
        mark is above it (:func:`~runtime.store.checks_absent_mark`).
        """
        await trio.lowlevel.checkpoint()
        self._check_open()
        new = check_save(session_id, start, messages, meta, expected_version)
        tail, kept_at = kept_tail(session_id, new, kept, expected_version)
        meta_copy = copy.deepcopy(dict(meta)) if meta else {}
        session = self._sessions.get(session_id)
        current = 0 if session is None else session.version
        if expected_version is not None and expected_version != current:
            raise StoreConflict(
                f"save of session {session_id!r}: it is at version {current}, not the "
                f"{expected_version} this save was based on: another writer saved it since",
                session_id=session_id,
                expected=expected_version,
                actual=current,
            )
        if session is None and absent_mark is not None:
            deleted_since(session_id, self._deletions.get(session_id, 0), absent_mark)
        count = 0 if session is None else len(session.messages)
        if start + tail > count:  # (kept: every kept message must be there)
            raise StoreError(
                f"save of session {session_id!r}: start {start + tail} is beyond its end "
                f"({count} messages)"
            )
        if session is None:
            session = _Session(messages=[], meta={}, version=self._deleted_version)
        else:
            del self._sessions[session_id]  # re-inserted below: now the most recent
        stored = session.messages
        for i in range(tail):  # before the last kept one: over their place
            if i not in kept_at:
                stored[start + i] = new[i]
        del stored[start + tail :]
        stored.extend(new[tail:] if tail else new)
        if PARENT_SESSION_META in meta_copy:  # (the caller it names may change)
            was = caller_of(session.meta)
            session.meta.update(meta_copy)
            self._index_caller(session_id, was, caller_of(session.meta))
        else:
            session.meta.update(meta_copy)
        session.version += 1
        if session.incarnation == 0:  # its first save: a new incarnation
            session.incarnation = session.version
        self._seq += 1
        session.seq = self._seq
        self._sessions[session_id] = session
        return session.version

    def _index_caller(self, session_id: str, was: str | None, now: str | None) -> None:
        """Move ``session_id`` in :attr:`_by_caller` from caller ``was`` to ``now``."""
        if was == now:
            return
        if was is not None:
            subs = self._by_caller.get(was)
            if subs is not None:
                subs.pop(session_id, None)
                if not subs:
                    del self._by_caller[was]
        if now is not None:
            self._by_caller.setdefault(now, {})[session_id] = None

    async def list_sessions(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[SessionInfo]:
        """The sessions, most recently saved first: all, or ``limit`` of them after the
        cursor ``after`` (the place in recency order a :class:`SessionInfo` carries)."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        below = None if after is None else parse_cursor(after)
        check_limit(limit)
        infos: list[SessionInfo] = []
        for session_id, session in reversed(self._sessions.items()):
            if limit is not None and len(infos) >= limit:
                break
            if below is not None and session.seq >= below:
                continue
            infos.append(
                SessionInfo(
                    session_id=session_id,
                    message_count=len(session.messages),
                    meta=copy.deepcopy(session.meta),
                    cursor=str(session.seq),
                )
            )
        return infos

    async def delete(self, session_id: str) -> None:
        """Forget the session and the sub-sessions it owns, at any depth (its agent
        tools' calls', :mod:`actors.stores.owned`: here those whose meta names it, found
        in :attr:`_by_caller`); deleting an unknown session is not an error."""
        await trio.lowlevel.checkpoint()
        self._check_open()
        validate_session_id(session_id)
        for sid in owned_sessions(session_id, self._subs_of):
            session = self._sessions.pop(sid, None)
            if session is not None:
                self._index_caller(sid, caller_of(session.meta), None)
                self._deleted_version = max(self._deleted_version, session.version)
                self._mark_deletion(sid)

    def _subs_of(self, caller: str) -> list[tuple[str, Any]]:
        sessions = self._sessions
        return [(sid, sessions[sid].meta) for sid in self._by_caller.get(caller, ())]

    def _mark_deletion(self, session_id: str) -> None:
        """Set ``session_id``'s mark one above the highest, and drop the marks
        :data:`~runtime.store.DELETION_MARKS_KEPT` deletions old (the oldest come first)."""
        marks = self._deletions
        self._top_mark = top = self._top_mark + 1
        marks.pop(session_id, None)  # to the end: set last
        marks[session_id] = top
        oldest = top - store_contract.DELETION_MARKS_KEPT
        while marks[first := next(iter(marks))] <= oldest:
            del marks[first]

    async def aclose(self) -> None:
        """Close the store; further calls raise :class:`~runtime.errors.StoreError`.

        Idempotent. The sessions are dropped: a memory store is not reopened.
        """
        await trio.lowlevel.checkpoint()
        self._closed = True
        self._sessions.clear()
        self._by_caller.clear()
        self._deletions.clear()
