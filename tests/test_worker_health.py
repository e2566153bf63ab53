"""``worker --health-file``: the file a liveness probe reads the age of (docs/deployment.md,
"Health checks"), touched while the worker's loop runs and PostgreSQL answers, stale when
the test run's own PostgreSQL is stopped or paused, removed at exit. ``worker``
processes; the one wait that must see nothing happen is a count of health intervals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.pg import postgres_stopped
from tests.test_web_health import postgres_paused

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 60.0
INTERVAL = 0.1
"""The workers' ``--health-interval`` here."""
QUIET = 30
"""Intervals a stale file is watched for staying stale."""


@contextmanager
def worker(pg_url: str, health: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "runtime", "worker", "--store", pg_url,
            "--agent", "tests.support.worker_agent:agent", "--poll", "0.1",
            "--health-file", str(health), "--health-interval", str(INTERVAL),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        started = proc.stdout.readline()
        assert started.startswith("Axon worker"), started + proc.communicate()[1]
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=LIMIT)


def touched_again(health: Path) -> bool:
    """Set the file's time to the epoch and wait (bounded) for the worker to touch it."""
    os.utime(health, (0, 0))
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:
        if health.stat().st_mtime != 0:
            return True
        time.sleep(INTERVAL / 2)
    return False


def stays_stale(health: Path) -> bool:
    """Set the file's time to the epoch: still so :data:`QUIET` intervals later."""
    os.utime(health, (0, 0))
    time.sleep(QUIET * INTERVAL)
    return health.stat().st_mtime == 0


def wait_for(health: Path) -> None:
    deadline = time.monotonic() + LIMIT
    while not health.exists():
        assert time.monotonic() < deadline, "the worker made no health file"
        time.sleep(INTERVAL / 2)


def test_a_running_worker_keeps_touching_its_health_file_and_removes_it_at_exit(
    pg_url: str, tmp_path: Path
) -> None:
    health = tmp_path / "alive"
    with worker(pg_url, health) as proc:
        wait_for(health)
        assert touched_again(health)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=LIMIT)
    assert proc.returncode == 0
    assert not health.exists()


def test_a_worker_that_lost_postgresql_stops_touching_its_health_file_until_it_is_back(
    pg_url: str, tmp_path: Path
) -> None:
    health = tmp_path / "alive"
    with worker(pg_url, health) as proc:
        wait_for(health)
        with postgres_stopped():
            stale = stays_stale(health)
            assert proc.poll() is None  # the worker runs on, waiting for the database
        assert touched_again(health)
    assert stale


def test_a_worker_whose_postgresql_is_paused_stops_touching_its_health_file(
    pg_url: str, tmp_path: Path
) -> None:
    health = tmp_path / "alive"
    with worker(pg_url, health):
        wait_for(health)
        with postgres_paused():
            stale = stays_stale(health)
        assert touched_again(health)
    assert stale


def test_a_health_file_the_worker_cannot_write_is_refused_before_it_starts(
    pg_url: str, tmp_path: Path
) -> None:
    # Else every beat failed, and the probe restarted a worker that works.
    missing = tmp_path / "no-such-dir" / "alive"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "runtime",
            "worker",
            "--store",
            pg_url,
            "--health-file",
            str(missing),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: cannot write --health-file {missing}: No such file or directory"
    )
