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
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent
from runtime.actor_messages import InferRequest
from runtime.app.worker import STALL_INTERVALS, Worker, open_worker
from tests.support import worker_agent
from tests.support.pg import EXTERNAL_PG, pg_connect, postgres_stopped
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


# -- in process: what the beat sees besides PostgreSQL's clock ----------------------------
#
# A worker whose ``LISTEN`` connection is dead hears no ``NOTIFY``: it takes new turns only
# by polling (every ``--poll`` seconds), and one whose claim loop is stuck takes none, while
# PostgreSQL's clock still answers. The file must say so; and turns queued meanwhile must
# still be taken.


@asynccontextmanager
async def in_process(
    pg_url: str, health: Path, **options: Any
) -> AsyncIterator[tuple[Worker, TurnQueue]]:
    """A worker (``poll`` 0.1, the health file every :data:`INTERVAL`, ``options``) and a
    front end's queue on the test's schema."""
    front = await PostgresStore.open(pg_url)
    queue = TurnQueue(front)
    try:
        async with open_worker(
            pg_url,
            **{"agent": worker_agent.agent, **options},
            poll=0.1,
            health_file=str(health),
            health_interval=INTERVAL,
        ) as running:
            await a_wait_for(health)
            yield running, queue
    finally:
        with trio.CancelScope(shield=True):
            await queue.aclose()
            await front.aclose()


async def a_wait_for(health: Path) -> None:
    with trio.fail_after(LIMIT):
        while not os.path.exists(health):  # noqa: ASYNC110, ASYNC240 - another task makes it
            await trio.sleep(INTERVAL / 2)


async def a_touched_again(health: Path) -> bool:
    os.utime(health, (0, 0))
    with trio.move_on_after(LIMIT):
        while os.stat(health).st_mtime == 0:  # noqa: ASYNC110
            await trio.sleep(INTERVAL / 2)
        return True
    return False


async def a_stays_stale(health: Path) -> bool:
    os.utime(health, (0, 0))
    await trio.sleep(QUIET * INTERVAL)
    return os.stat(health).st_mtime == 0


async def listen_pid(worker: Worker, other_than: int | None = None) -> int:
    """The backend pid of the worker's ``LISTEN`` connection (one other than
    ``other_than``: waited for, within :data:`LIMIT`)."""
    with trio.fail_after(LIMIT):
        while True:
            listener = worker.queue._listen  # type: ignore[attr-defined]
            if listener is not None and not listener.conn.closed:
                pid = int(listener.conn.info.backend_pid)
                if pid != other_than:
                    return pid
            await trio.sleep(INTERVAL / 2)


async def answered(queue: TurnQueue, session_id: str) -> str:
    """Submit a turn; the status it ends with."""
    turn = await queue.submit(session_id, "hi")
    done = await queue.wait_finished(turn.turn_id, LIMIT)
    return "unfinished" if done is None else done.status


async def test_a_worker_whose_listen_connection_was_terminated_and_cannot_reopen_goes_stale(
    pg_url: str, tmp_path: Path
) -> None:
    # The pool answers (the clock read), the LISTEN connection is gone and a new one is
    # refused (a server at max_connections): before, the file was touched all the same.
    health = tmp_path / "alive"
    async with in_process(pg_url, health) as (running, queue):
        listening = running.queue
        pid = await listen_pid(running)
        connect = listening._connect_listener  # type: ignore[attr-defined]
        refused = {"now": True}

        def refusing() -> Any:
            if refused["now"]:
                raise psycopg.OperationalError("connection refused (the test)")
            return connect()

        listening._connect_listener = refusing  # type: ignore[attr-defined]
        with pg_connect() as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        stale = await a_stays_stale(health)
        # Queued while nothing listens: taken by the claim loop's polls all the same.
        status = await answered(queue, "s1")
        refused["now"] = False
        back = await a_touched_again(health)
        again = await listen_pid(running, other_than=pid)
        after = await answered(queue, "s2")
    assert stale
    assert status == "done"
    assert back and again != pid and after == "done"


async def test_a_worker_whose_listen_backend_stops_answering_listens_on_another(
    pg_url: str, tmp_path: Path
) -> None:
    # A LISTEN connection whose server end is paused (or partitioned away) looks alive:
    # no error, no notification ever. Before, the worker kept it for ever (polling only).
    if EXTERNAL_PG is not None:
        pytest.skip("AXON_TEST_PG points at a server this run did not start: not pausing it")
    health = tmp_path / "alive"
    async with in_process(pg_url, health) as (running, queue):
        pid = await listen_pid(running)
        os.kill(pid, signal.SIGSTOP)
        try:
            again = await listen_pid(running, other_than=pid)
            status = await answered(queue, "s1")
        finally:
            os.kill(pid, signal.SIGCONT)
        back = await a_touched_again(health)
    assert again != pid
    assert status == "done" and back


async def test_a_worker_whose_claims_are_stuck_on_a_lock_goes_stale_until_they_answer(
    pg_url: str, tmp_path: Path
) -> None:
    # The clock read and the LISTEN connection answer; every claim waits on a lock the
    # test's own connection holds. Before, the file was touched all the same.
    health = tmp_path / "alive"
    schema = pg_url.rsplit("schema=", 1)[1]
    async with in_process(pg_url, health) as (_, queue):
        with pg_connect() as conn:
            with conn.transaction():
                conn.execute(f"LOCK TABLE {schema}.axon_turns IN ACCESS EXCLUSIVE MODE")
                # (the loop's claim waits on it once its current wait ends; then the
                # bound of a stall: poll and STALL_INTERVALS health intervals)
                await trio.sleep(0.1 + (STALL_INTERVALS + 2) * INTERVAL)
                stale = await a_stays_stale(health)
        back = await a_touched_again(health)
        status = await answered(queue, "s1")
    assert stale
    assert back and status == "done"


HOLD: dict[str, trio.Event] = {}


async def hold(n: int) -> str:
    """Wait until the test lets go."""
    HOLD["entered"].set()
    await HOLD["go"].wait()
    return "went"


def _holding(request: InferRequest) -> list[Any]:
    if current_step(request.messages) == 0:
        return tool_call("hold", {"n": 1})
    return ["done"]


async def test_a_worker_whose_slots_are_all_busy_keeps_touching_its_health_file(
    pg_url: str, tmp_path: Path
) -> None:
    # Its claim loop waits for a free slot for as long as its turns run: no stall (a
    # probe that restarted it would cut the turns it runs well).
    HOLD["entered"], HOLD["go"] = trio.Event(), trio.Event()
    agent = Agent(name="h", provider=ScriptedProvider(responder=_holding), tools=[hold])
    health = tmp_path / "alive"
    async with in_process(pg_url, health, agent=agent, concurrency=1) as (running, queue):
        turn = await queue.submit("s1", "go")
        await HOLD["entered"].wait()
        await trio.sleep(0.1 + (STALL_INTERVALS + 2) * INTERVAL)  # past a stall's bound
        busy = await a_touched_again(health) and turn.turn_id in running.running
        HOLD["go"].set()
        done = await queue.wait_finished(turn.turn_id, LIMIT)
    assert busy
    assert done is not None and done.status == "done"
