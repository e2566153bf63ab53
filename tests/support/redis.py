"""The real Redis the relay tests use (127.0.0.1:6379); each test gets its own key prefix."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

REDIS_URL = os.environ.get("AXON_TEST_REDIS", "redis://127.0.0.1:6379/0")
START = [
    "redis-server", "--daemonize", "yes", "--bind", "127.0.0.1", "-::1", "--port", "6379",
    "--save", "", "--appendonly", "no", "--dir", "/var/lib/redis",
]  # fmt: skip


def redis_answers(timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 6379), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def require_redis() -> str:
    if not redis_answers():
        pytest.skip("Redis is not reachable on 127.0.0.1:6379 (the relay tests need a real one)")
    return REDIS_URL


def unique_prefix() -> str:
    return f"axontest:{uuid.uuid4().hex[:10]}:"


def start_redis() -> None:
    """Start Redis again if it does not answer (waits until it does, at most 10 s)."""
    if redis_answers():
        return
    subprocess.run(START, check=False, capture_output=True, timeout=10)
    deadline = time.monotonic() + 10
    while not redis_answers():
        if time.monotonic() > deadline:
            raise RuntimeError("Redis did not come back after a restart")
        time.sleep(0.05)


@contextmanager
def redis_restored() -> Iterator[None]:
    """Whatever happens inside, Redis is running afterwards."""
    try:
        yield
    finally:
        start_redis()


def stop_redis() -> None:
    subprocess.run(["redis-cli", "shutdown", "nosave"], check=False, capture_output=True)
    deadline = time.monotonic() + 10
    while redis_answers(0.1) and time.monotonic() < deadline:
        time.sleep(0.02)
