"""Session stores (implementations of :class:`runtime.store.Store`) and how a host picks one.

* :class:`MemoryStore` keeps sessions in process memory (tests, one-shot runs).
* :class:`SQLiteStore` keeps them in one embedded SQLite file (WAL mode), where saving
  turn 500 of a session writes only what turn 500 added.
* a plug-in adds a store for a URL scheme through the ``axon.stores`` entry-point group
  (:data:`STORES`): one new module, no edit here.

:func:`open_store` turns a host's ``store=`` setting into a store. This folder sits under
``runtime/`` beside the protocol it implements, but it is implementation-layer code: it
imports the contract (``runtime.store``, ``runtime.messages``, ...), never the host.
"""

from __future__ import annotations

import os
import re
from typing import Any

from actors.stores.memory import MemoryStore
from actors.stores.sqlite import SQLiteStore
from runtime.errors import ConfigurationError
from runtime.registry import Registry
from runtime.store import Store, validate_session_id

ENTRY_POINT_GROUP = "axon.stores"

BUILTIN: dict[str, str] = {
    "postgresql": "actors.stores.postgres:PostgresStore",
    "postgres": "actors.stores.postgres:PostgresStore",
}
"""The URL schemes of the stores that ship with Axon, ``scheme -> "module:Class"``
(a plain file path is an SQLite store, not a scheme). A plug-in cannot take one over."""

STORES = Registry(group=ENTRY_POINT_GROUP, kind="store", builtin=BUILTIN)
"""Stores by URL scheme. A registered class is opened with ``await cls.open(spec)``
(``spec`` is the whole URL) and must return a :class:`~runtime.store.Store`."""

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_STORE_METHODS = ("load", "save", "version", "list_sessions", "delete", "aclose")


def is_store_url(spec: Any) -> bool:
    """Whether ``spec`` names a store by URL (``postgresql://...``), not a file path."""
    return isinstance(spec, str) and _URL.match(spec) is not None


async def open_store(spec: Any) -> Store:
    """The store a host setting names.

    * ``None``: a fresh :class:`MemoryStore` (nothing survives the process).
    * a ``scheme://...`` URL: the store registered for ``scheme`` (:data:`STORES`),
      ``await cls.open(spec)``; an unregistered scheme is a
      :class:`~runtime.errors.ConfigurationError` naming the registered ones.
    * any other ``str`` or an ``os.PathLike``: ``await SQLiteStore.open(spec)``; the file is
      created if missing and refused (:class:`~runtime.errors.StoreCorrupt`) if it is not
      an Axon store.
    * an object implementing :class:`~runtime.store.Store`: returned as is, so hosts can
      plug in their own storage.

    Anything else raises :class:`~runtime.errors.ConfigurationError`.
    """
    if spec is None:
        return MemoryStore()
    if isinstance(spec, str) and (url := _URL.match(spec)) is not None:
        return await _open_registered(url.group(1).lower(), spec)
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
        "a file path, a URL of a registered store, or a Store instance"
    )


async def _open_registered(scheme: str, spec: str) -> Store:
    cls = STORES.load(scheme)
    opener = getattr(cls, "open", None)
    if not callable(opener):
        raise ConfigurationError(
            f"store {scheme!r} ({STORES.entries()[scheme].value}) has no open(url) to call"
        )
    store = await opener(spec)
    if not isinstance(store, Store):
        raise ConfigurationError(
            f"store {scheme!r}: open() returned {type(store).__name__}, not a runtime.Store"
        )
    return store


__all__ = [
    "STORES",
    "MemoryStore",
    "SQLiteStore",
    "is_store_url",
    "open_store",
    "validate_session_id",
]
