"""The test run's own servers do not outlive a run that is killed (tests/support/reaper.py).

A run stopped by ``SIGKILL`` (or a ``timeout``'s ``SIGTERM``) runs no teardown: before the
reapers, its PostgreSQL and Redis kept running, each holding a port and a directory under
``/tmp``, one pair more per killed run on the user's machine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.reaper import redis_pids
from tests.support.services import ServiceUnavailable, own_postgres, own_redis

REPO = Path(__file__).resolve().parent.parent

CHILD = """
import json, sys, time
from tests.support.services import own_postgres, own_redis
pg, redis = own_postgres(), own_redis()
print(json.dumps({"pg": [str(pg.root), pg.port], "redis": [str(redis.root), redis.port]}))
sys.stdout.flush()
if sys.argv[1] == "hang":
    time.sleep(600)
"""


def _answers(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _reapers(root: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tests.support.reaper" in argv and root.encode() in argv:
            found.append(int(entry.name))
    return found


def _until(check, seconds: float = 60.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


@pytest.fixture
def servers_available():
    try:  # the binaries are there (this run's own servers start, or were started)
        own_postgres(), own_redis()
    except ServiceUnavailable as err:
        pytest.skip(str(err))


def _child(mode: str) -> tuple[subprocess.Popen, dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    line = child.stdout.readline()
    assert line, "the child started no servers"
    return child, json.loads(line)


def test_a_killed_runs_servers_are_stopped_and_their_directories_deleted(servers_available):
    child, started = _child("hang")
    (pg_root, pg_port), (redis_root, redis_port) = started["pg"], started["redis"]
    try:
        assert _answers(pg_port) and _answers(redis_port) and redis_pids(Path(redis_root))
    finally:
        child.send_signal(signal.SIGKILL)  # no teardown, no atexit
        child.wait(timeout=30)
    assert _until(lambda: not Path(pg_root).exists() and not Path(redis_root).exists())
    assert not _answers(pg_port) and not _answers(redis_port)
    assert not redis_pids(Path(redis_root))
    assert _until(lambda: not _reapers(pg_root) and not _reapers(redis_root))


def test_a_run_that_ends_normally_leaves_no_reaper_behind(servers_available):
    child, started = _child("exit")  # its atexit stops the servers, deleting their folders
    child.wait(timeout=120)
    (pg_root, pg_port), (redis_root, _) = started["pg"], started["redis"]
    assert child.returncode == 0
    assert not Path(pg_root).exists() and not _answers(pg_port)
    assert _until(lambda: not _reapers(pg_root) and not _reapers(redis_root), 10)


BOUNCER_CHILD = """
import json, sys, time
from tests.support.services import own_pgbouncer
bouncer = own_pgbouncer()
print(json.dumps({"bouncer": [str(bouncer.root), bouncer.port],
                  "pg": [str(bouncer.server.root), bouncer.server.port]}))
sys.stdout.flush()
time.sleep(600)
"""


def test_a_killed_runs_pgbouncer_is_stopped_and_its_directory_deleted(servers_available):
    from tests.support.services import own_pgbouncer

    try:
        own_pgbouncer()
    except ServiceUnavailable as err:
        pytest.skip(str(err))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", BOUNCER_CHILD], cwd=REPO, env=env, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    started = json.loads(child.stdout.readline())
    (root, port), (pg_root, _) = started["bouncer"], started["pg"]
    try:
        assert _answers(port) and redis_pids(Path(root), b"pgbouncer")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert _until(lambda: not Path(root).exists() and not Path(pg_root).exists())
    assert not _answers(port) and not redis_pids(Path(root), b"pgbouncer")
    assert _until(lambda: not _reapers(root))
