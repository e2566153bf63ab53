"""Redis for the tests: a server of the test run's own; each test gets its own key prefix.

The server is one the run starts itself (:mod:`tests.support.services`: free port, no
persistence, killed at the end), or the one ``AXON_TEST_REDIS`` names when the user sets
it. Only the run's own server is ever stopped or restarted (:func:`stop_redis` skips the
test otherwise), and nothing is flushed: tests write under their own prefix.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

from tests.support.services import ServiceUnavailable, own_redis

EXTERNAL_REDIS = os.environ.get("AXON_TEST_REDIS") or None


@functools.cache
def _target() -> str | ServiceUnavailable:
    if EXTERNAL_REDIS is not None:
        return EXTERNAL_REDIS
    try:
        return own_redis().url
    except ServiceUnavailable as err:
        return err


def require_redis() -> str:
    """The test Redis's URL; skips the test, saying why, when there is none."""
    got = _target()
    if isinstance(got, ServiceUnavailable):
        pytest.skip(f"no Redis for the relay tests: {got}")
    return got


def redis_address() -> tuple[str, int]:
    parts = urlsplit(require_redis())
    return parts.hostname or "127.0.0.1", parts.port or 6379


def unique_prefix() -> str:
    return f"axontest:{uuid.uuid4().hex[:10]}:"


def _restartable() -> None:
    if EXTERNAL_REDIS is not None:
        pytest.skip("AXON_TEST_REDIS points at a server this run did not start: not stopping it")
    require_redis()


def stop_redis() -> None:
    """Kill the run's own Redis (no save): its streams are gone, connections cut."""
    _restartable()
    own_redis().stop()


def start_redis() -> None:
    """Start the run's own Redis again (empty) if it is down; waits until it answers."""
    _restartable()
    own_redis().start()


@contextmanager
def redis_restored() -> Iterator[None]:
    """Whatever happens inside, the run's own Redis is running afterwards."""
    _restartable()
    try:
        yield
    finally:
        own_redis().start()


def _config_set(name: str, value: str) -> None:
    """``CONFIG SET name value`` on the run's own Redis (an inline command, one reply)."""
    import socket

    with socket.create_connection(redis_address(), timeout=10) as sock:
        sock.sendall(f"CONFIG SET {name} {value}\r\n".encode())
        reply = sock.recv(1024)
    if not reply.startswith(b"+OK"):
        raise RuntimeError(f"CONFIG SET {name} {value}: {reply!r}")


@contextmanager
def redis_full() -> Iterator[None]:
    """Inside, the run's own Redis is full: ``maxmemory`` 1 byte, ``noeviction``, so
    every write that needs memory is refused with ``OOM`` (reads go on). Restored after."""
    _restartable()
    _config_set("maxmemory-policy", "noeviction")
    _config_set("maxmemory", "1")
    try:
        yield
    finally:
        _config_set("maxmemory", "0")


@contextmanager
def redis_small_bulk(limit: str = "1mb") -> Iterator[None]:
    """Inside, the run's own Redis takes no argument longer than ``limit``
    (``proto-max-bulk-len``): a longer one gets a protocol error and the connection
    closed. Restored (Redis's default, 512 MB) after."""
    _restartable()
    _config_set("proto-max-bulk-len", limit)
    try:
        yield
    finally:
        _config_set("proto-max-bulk-len", "512mb")
