"""The ``Store`` protocol: where sessions live between turns.

A store keeps, per session, an ordered list of messages and a little metadata. Writes
are *appends from an index*: :meth:`Store.save` replaces the messages from ``start`` on,
so saving turn 500 costs what turn 500 wrote, never a rewrite of the whole session.

Several writers may share one store (two processes on one SQLite file, a web server and
a CLI on the same session). Each session therefore has a *version* that every save
checks and bumps atomically: a writer saves on top of the version it loaded, and a save
based on a version another writer has since replaced fails with
:class:`~runtime.errors.StoreConflict` instead of overwriting that writer's turns.
:func:`rebase` is how the runtime then puts its own messages after the other writer's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from runtime.chunks import _eq, _hash, _repr
from runtime.errors import InvalidSessionId
from runtime.messages import Message

_SESSION_ID = r"[A-Za-z0-9_.:-]{1,128}"
"""Compiled on first use (``re.compile`` caches it), not on import (issue 24's start-up
figure)."""


_match: Callable[[str], re.Match[str] | None] | None = None


def _session_id_match(session_id: str) -> re.Match[str] | None:
    """The pattern's ``fullmatch`` of ``session_id``; the pattern compiled on first use
    and kept (``re.compile``'s own cache is a look-up of its own: a turn validates its
    session's id five times, issue 24 goal 1)."""
    global _match
    if _match is None:
        _match = re.compile(_SESSION_ID).fullmatch
    return _match(session_id)


def validate_session_id(session_id: str) -> str:
    """Return ``session_id`` unchanged if it is 1-128 characters of ``[A-Za-z0-9_.:-]``.

    Session ids end up in file names, log lines, SQL parameters and URLs; restricting them
    to a small ASCII alphabet up front means none of those places ever needs escaping and
    an id read back from a store is byte-for-byte the one that was saved.

    Raises :class:`~runtime.errors.InvalidSessionId` (a ``ValueError``) otherwise,
    including for values that are not ``str`` at all.
    """
    if not isinstance(session_id, str) or _session_id_match(session_id) is None:
        raise InvalidSessionId(
            f"invalid session id {session_id!r}: a session id must be 1-128 characters "
            "of letters, digits, '-', '_', '.', ':'"
        )
    return session_id


@attrs.frozen(kw_only=True, slots=True)
class SessionRecord:
    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash
    session_id: str
    messages: tuple[Message, ...]
    meta: dict[str, Any] = attrs.field(factory=dict)
    """Free-form: agent name, parent session, timestamps."""
    version: int = attrs.field(default=0, eq=False)
    """The session's version when it was read; pass it as ``expected_version`` to save on
    top of exactly these messages. Not part of equality: two records holding the same
    messages and meta are the same conversation, whichever write produced them."""


@attrs.frozen(kw_only=True, slots=True)
class SessionInfo:
    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash
    session_id: str
    message_count: int
    meta: dict[str, Any] = attrs.field(factory=dict)


@runtime_checkable
class Store(Protocol):
    """Session storage. Implementations must be safe to call from Trio tasks.

    **The version rule** (every store keeps it, so no writer ever loses another's turns):
    each session has an integer version, ``0`` while it does not exist. Every successful
    :meth:`save` sets it to a value the session has never had before (the SQLite and
    memory stores add one; a new or re-created session starts above any version a deleted
    one had), and :meth:`load` returns it in :attr:`SessionRecord.version`. When
    ``expected_version`` is given, the check and the write are one atomic step (SQLite:
    inside the ``BEGIN IMMEDIATE`` transaction; PostgreSQL: ``SELECT ... FOR UPDATE`` or a
    conditional ``UPDATE``): if the stored version differs, the save raises
    :class:`~runtime.errors.StoreConflict` and writes nothing.
    """

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session (with its version), or ``None`` if it was never saved."""
        ...

    async def save(
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        meta: dict[str, Any] | None = None,
        *,
        expected_version: int | None = None,
    ) -> int:
        """Atomically replace messages ``start..`` with ``messages`` (and merge ``meta``),
        returning the session's new version.

        With ``expected_version``, raise :class:`~runtime.errors.StoreConflict` (writing
        nothing) unless the session's stored version is exactly that. The runtime always
        passes it; ``None`` saves unconditionally, for tools that own the store alone.
        """
        ...

    async def version(self, session_id: str) -> int:
        """The session's current version (``0`` if it does not exist): a cheap query that
        tells a writer whether someone else saved since it last loaded."""
        ...

    async def list_sessions(self) -> list[SessionInfo]: ...

    async def delete(self, session_id: str) -> None: ...

    async def aclose(self) -> None: ...


def rebase(stored: Sequence[Message], ours: Sequence[Message]) -> tuple[tuple[Message, ...], int]:
    """What a writer whose save met a conflict keeps of the store, to append ``ours`` to.

    ``stored`` is the session as the store holds it now, ``ours`` the messages the writer
    was saving. Any earlier copy of one of ``ours`` in ``stored`` (the same message
    ``id``: a step of this turn saved before the other writer appended its turn) is
    dropped, so the result followed by ``ours`` holds every message exactly once: the
    other writer's turns first, then this writer's turn whole, its tool calls still
    followed by their results. Returns that base and the index of the first stored
    message it does not keep unchanged (where the save has to start).
    """
    ids = {message.id for message in ours}
    base = tuple(message for message in stored if message.id not in ids)
    start = next((i for i, message in enumerate(stored) if message.id in ids), len(stored))
    return base, start
