"""Session stores (implementations of :class:`runtime.store.Store`) and how a host picks one.

* :class:`MemoryStore` keeps sessions in process memory (tests, one-shot runs).
* :class:`SQLiteStore` keeps them in one embedded SQLite file (WAL mode), where saving
  turn 500 of a session writes only what turn 500 added.
* a plug-in adds a store for a URL scheme through the ``axon.stores`` entry-point group
  (:data:`STORES`): one new module, no edit here.

:func:`open_store` turns a host's ``store=`` setting into a store; :func:`turn_queue` gives
the durable turn queue (:class:`runtime.turn_queue.TurnQueue`) that lives in a store
(PostgreSQL's, :class:`actors.stores.turns.TurnQueue`), keyed by the store's URL scheme
(:data:`QUEUES`), so that the worker deployment names no database. This folder sits under
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
from runtime.redact import redact_url
from runtime.registry import Registry
from runtime.store import Store, validate_session_id
from runtime.turn_queue import TurnQueue

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

QUEUE_BUILTIN: dict[str, str] = {
    "postgresql": "actors.stores.turns:TurnQueue",
    "postgres": "actors.stores.turns:TurnQueue",
}
"""The turn queues that ship with Axon, by the URL scheme of the store they live in."""

QUEUES = Registry(group="axon.turn_queues", kind="turn queue", builtin=QUEUE_BUILTIN)
"""Turn queues by their store's URL scheme (entry-point group ``axon.turn_queues``). A
registered class is called as ``cls(store, **options)`` with an open store of that
scheme and must return a :class:`~runtime.turn_queue.TurnQueue`."""

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
    if scheme not in STORES.entries():  # (``redis://``: a newcomer's guess)
        known = ", ".join(STORES.names()) or "none"
        raise ConfigurationError(
            f"unknown store {scheme!r}; registered stores: {known}; a path without a "
            "scheme (axon.db, ./data/axon.db) is a SQLite file"
        )
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


def queue_scheme(spec: Any) -> str:
    """The URL scheme of a store that holds a turn queue (``postgresql``), or a
    :class:`~runtime.errors.ConfigurationError` saying which stores do: checked before
    anything is opened, so a file path never becomes an SQLite file a worker cannot use."""
    url = _URL.match(spec) if isinstance(spec, str) else None
    scheme = url.group(1).lower() if url is not None else None
    if scheme is None or scheme not in QUEUES.entries():
        shown = redact_url(spec) if isinstance(spec, str) else type(spec).__name__
        raise ConfigurationError(
            "the worker deployment needs a store with a turn queue: a PostgreSQL URL "
            f"(postgresql://...){_plugins()}, not {shown!r}"
        )
    return scheme


def require_driver(spec: Any) -> None:
    """Check now that what the store a URL names needs is installed (its class's
    ``require_driver()``, when it has one: PostgreSQL's psycopg), raising its
    :class:`~runtime.errors.ConfigurationError`. Why: a command that opens something
    else first (``worker``: the Redis relay, retried for seconds when Redis does not
    answer) names the missing package at once, not after failing on that. Anything that
    is not a registered store's URL is left to :func:`open_store` to judge."""
    url = _URL.match(spec) if isinstance(spec, str) else None
    if url is None or (scheme := url.group(1).lower()) not in STORES.entries():
        return
    check = getattr(STORES.load(scheme), "require_driver", None)
    if callable(check):
        check()


def _plugins() -> str:
    others = [name for name in QUEUES.names() if name not in QUEUE_BUILTIN]
    return f" or {', '.join(s + '://' for s in others)}" if others else ""


def turn_queue(store: Store, **options: Any) -> TurnQueue:
    """The durable turn queue that lives in ``store``, chosen by the scheme of the URL the
    store was opened with (``store.url``): ``postgresql://`` gives
    :class:`actors.stores.turns.TurnQueue`. ``options`` go to the queue (``lease``,
    ``max_attempts``, caps...). The store stays the caller's to close."""
    cls = QUEUES.load(queue_scheme(getattr(store, "url", None)))
    queue = cls(store, **options)
    if not isinstance(queue, TurnQueue):
        raise ConfigurationError(
            f"turn queue {type(queue).__name__} is not a runtime.turn_queue.TurnQueue"
        )
    return queue


async def open_turn_queue(url: str, **options: Any) -> TurnQueue:
    """Open the store ``url`` names and the turn queue in it (:func:`turn_queue`); the
    caller closes both (``await queue.aclose()``, then ``await queue.store.aclose()``)."""
    queue_scheme(url)
    store = await open_store(url)
    try:
        return turn_queue(store, **options)
    except BaseException:
        await store.aclose()
        raise


__all__ = [
    "QUEUES",
    "STORES",
    "MemoryStore",
    "SQLiteStore",
    "is_store_url",
    "open_store",
    "open_turn_queue",
    "queue_scheme",
    "require_driver",
    "turn_queue",
    "validate_session_id",
]
