"""Session stores: where a session's messages live between turns.

Two implementations of :class:`runtime.store.Store`:

* :class:`MemoryStore` keeps sessions in process memory (tests, one-shot runs).
* :class:`SQLiteStore` keeps them in one embedded SQLite file (WAL mode), where saving
  turn 500 of a session writes only what turn 500 added.

:func:`open_store` turns a host's ``store=`` setting into a store, and
:func:`validate_session_id` is the single definition of what a session id may look like.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.errors import ConfigurationError, StoreError
from runtime.messages import Message
from runtime.store import Store, validate_session_id

_MESSAGE_TYPES: tuple[type, ...] = typing.get_args(Message)


def _check_save(
    session_id: str,
    start: int,
    messages: Sequence[Message],
    meta: Mapping[str, Any] | None,
    expected_version: int | None = None,
) -> tuple[Message, ...]:
    """Validate the arguments of :meth:`Store.save` the same way in every store.

    Checked before anything is touched, so a bad call never changes a session. Returns
    ``messages`` as a tuple (the caller's sequence may be a list it keeps mutating). Whether
    ``start`` is within the session is left to the store, which must check it atomically
    with the write.
    """
    validate_session_id(session_id)
    if expected_version is not None and (
        not isinstance(expected_version, int)
        or isinstance(expected_version, bool)
        or expected_version < 0
    ):
        raise StoreError(
            f"save of session {session_id!r}: expected_version must be an int >= 0 or "
            f"None, got {expected_version!r}"
        )
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise StoreError(
            f"save of session {session_id!r}: start must be an int >= 0, got {start!r}"
        )
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise StoreError(
            f"save of session {session_id!r}: messages must be a sequence of Message, "
            f"got {type(messages).__name__}"
        )
    messages = tuple(messages)
    for offset, message in enumerate(messages):
        if not isinstance(message, _MESSAGE_TYPES):
            raise StoreError(
                f"save of session {session_id!r}: message {start + offset} is a "
                f"{type(message).__name__}, not a Message"
            )
    if meta is not None and not isinstance(meta, Mapping):
        raise StoreError(
            f"save of session {session_id!r}: meta must be a dict or None, "
            f"got {type(meta).__name__}"
        )
    if meta is not None and not all(isinstance(key, str) for key in meta):
        raise StoreError(f"save of session {session_id!r}: meta keys must be str")
    return messages


# The implementations import ``validate_session_id`` from this package, so they are
# imported only once it is defined.
from runtime.stores.memory import MemoryStore  # noqa: E402
from runtime.stores.sqlite import SQLiteStore  # noqa: E402

_STORE_METHODS = ("load", "save", "version", "list_sessions", "delete", "aclose")


async def open_store(spec: Any) -> Store:
    """The store a host setting names.

    * ``None``: a fresh :class:`MemoryStore` (nothing survives the process).
    * a ``str`` or ``os.PathLike``: ``await SQLiteStore.open(spec)``; the file is created if
      missing and refused (:class:`~runtime.errors.StoreCorrupt`) if it is not an Axon store.
    * an object implementing :class:`~runtime.store.Store`: returned as is, so hosts can
      plug in their own storage.

    Anything else raises :class:`~runtime.errors.ConfigurationError`.
    """
    if spec is None:
        return MemoryStore()
    if isinstance(spec, str | os.PathLike):
        return await SQLiteStore.open(spec)
    if isinstance(spec, Store):
        return spec
    missing = [name for name in _STORE_METHODS if not callable(getattr(spec, name, None))]
    if "version" in missing and len(missing) < len(_STORE_METHODS):
        raise ConfigurationError(
            f"{spec!r} is not a complete Store: it lacks {', '.join(missing)}. Stores "
            "keep a version per session that every save checks (see runtime.store.Store), "
            "so two writers on one session never overwrite each other's turns"
        )
    raise ConfigurationError(
        f"cannot open a session store from {spec!r}: expected None (in memory), "
        "a file path, or a Store instance"
    )


__all__ = ["MemoryStore", "SQLiteStore", "open_store", "validate_session_id"]
