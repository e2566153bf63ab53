"""The ``Store`` protocol: where sessions live between turns.

A store keeps, per session, an ordered list of messages and a little metadata. Writes
are *appends from an index*: :meth:`Store.save` replaces the messages from ``start`` on,
so saving turn 500 costs what turn 500 wrote, never a rewrite of the whole session.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from runtime.errors import InvalidSessionId
from runtime.messages import Message

_SESSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def validate_session_id(session_id: str) -> str:
    """Return ``session_id`` unchanged if it is 1-128 characters of ``[A-Za-z0-9_.:-]``.

    Session ids end up in file names, log lines, SQL parameters and URLs; restricting them
    to a small ASCII alphabet up front means none of those places ever needs escaping and
    an id read back from a store is byte-for-byte the one that was saved.

    Raises :class:`~runtime.errors.InvalidSessionId` (a ``ValueError``) otherwise,
    including for values that are not ``str`` at all.
    """
    if not isinstance(session_id, str) or _SESSION_ID.fullmatch(session_id) is None:
        raise InvalidSessionId(
            f"invalid session id {session_id!r}: a session id must be 1-128 characters "
            "of letters, digits, '-', '_', '.', ':'"
        )
    return session_id


@attrs.frozen(kw_only=True, slots=True)
class SessionRecord:
    session_id: str
    messages: tuple[Message, ...]
    meta: dict[str, Any] = attrs.field(factory=dict)
    """Free-form: agent name, parent session, timestamps."""


@attrs.frozen(kw_only=True, slots=True)
class SessionInfo:
    session_id: str
    message_count: int
    meta: dict[str, Any] = attrs.field(factory=dict)


@runtime_checkable
class Store(Protocol):
    """Session storage. Implementations must be safe to call from Trio tasks."""

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session, or ``None`` if it was never saved."""
        ...

    async def save(
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        meta: dict[str, Any] | None = None,
    ) -> None:
        """Atomically replace messages ``start..`` with ``messages`` (and merge ``meta``)."""
        ...

    async def list_sessions(self) -> list[SessionInfo]: ...

    async def delete(self, session_id: str) -> None: ...

    async def aclose(self) -> None: ...
