"""Worker processes against real PostgreSQL and Redis servers the test run started: killed,
paused, restarted.

Every test runs real ``python -m runtime worker`` processes on the worker tests' agent
(:mod:`tests.support.worker_agent`), submits turns through the queue, and reads the
outcome from the store, the queue's rows, the relay and the tool's side-effect ledger.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence

import attrs
import orjson
import psycopg
import pytest
import trio

from actors.relays.redis_streams import RedisRelay
from actors.stores.postgres import PostgresStore, parse_url
from actors.stores.postgres_calls import SAVE_FUNCTION_NAME, SAVE_NEXT_FUNCTION_NAME
from actors.stores.turns import TurnQueue
from runtime.agent import Agent
from runtime.app.worker import Worker
from runtime.messages import AssistantMessage, TextPart, ToolCallPart, ToolMessage, UserMessage
from runtime.output import ResetStep, TextDelta
from tests.support import worker_agent
from tests.support.pg import restart_postgres
from tests.support.redis import (
    redis_restored,
    require_redis,
    start_redis,
    stop_redis,
    unique_prefix,
)
from tests.support.worker_agent import answer_text, read_ledger

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEASE = 2.0
"""Short, so a dead worker's turn is taken over soon; long enough that a healthy worker on
a loaded machine never misses a renewal (every third of it)."""


class Workers:
    """The worker processes of one test; all killed when it ends."""

    def __init__(self, pg_url: str, redis_url: str, prefix: str) -> None:
        self.pg_url = pg_url
        self.redis_url = redis_url
        self.prefix = prefix
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, str] = {}

    def start(
        self,
        name: str,
        *,
        lease: float = LEASE,
        max_attempts: int = 3,
        extra_args: Sequence[str] = (),
        **env: str,
    ) -> None:
        log = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"axon-{self.prefix[9:-1]}-{name}.log")
        self.logs[name] = log
        environ = {
            **os.environ,
            "PYTHONPATH": REPO,
            "AXON_TEST_LEDGER": self.pg_url,
            **env,
        }
        with open(log, "wb") as out:
            self.procs[name] = subprocess.Popen(
                [
                    sys.executable, "-m", "runtime", "worker",
                    "--store", self.pg_url, "--redis", self.redis_url,
                    "--redis-prefix", self.prefix,
                    "--agent", "tests.support.worker_agent:agent",
                    "--owner", name, "--lease", str(lease), "--poll", "0.1",
                    "--max-attempts", str(max_attempts), "--grace", "2",
                    "--log-level", "info", *extra_args,
                ],
                cwd=REPO, env=environ, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def signal(self, name: str, sig: int) -> None:
        self.procs[name].send_signal(sig)
        if sig == signal.SIGKILL:
            self.procs[name].wait(10)

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def log(self, name: str) -> str:
        with open(self.logs[name], encoding="utf-8", errors="replace") as f:
            return f.read()

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait(10)
        for log in self.logs.values():
            with_suppressed_remove(log)


def with_suppressed_remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture
async def cluster(pg_url: str) -> AsyncIterator[tuple[PostgresStore, TurnQueue]]:
    """The test's own store and queue on the workers' PostgreSQL schema."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        yield store, queue
    finally:
        await queue.aclose()
        await store.aclose()


async def in_first_tool(pg_url: str) -> None:
    """Wait until a worker has done the first tool call's side effect."""

    async def effect() -> bool:
        effects, _ = await trio.to_thread.run_sync(read_ledger, pg_url)
        return bool(effects)

    await wait_for(effect, what="a worker in its first tool")


@pytest.fixture
def workers(pg_url: str, redis_url: str) -> Iterator[Workers]:
    pool = Workers(pg_url, redis_url, unique_prefix())
    try:
        yield pool
    finally:
        pool.close()


async def wait_for(
    predicate,
    timeout: float = 30.0,  # noqa: ASYNC109
    what: str = "condition",
):  # type: ignore[no-untyped-def]
    """Poll ``await predicate()`` until it returns something truthy."""
    with trio.move_on_after(timeout):
        while True:
            value = await predicate()
            if value:
                return value
            await trio.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def sql(pg_url: str, query: str, *params: object) -> list[tuple]:  # type: ignore[type-arg]
    libpq, schema = parse_url(pg_url)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        return conn.execute(query, params).fetchall()


async def finished(queue: TurnQueue, turn_id: str, timeout: float = 60.0):  # noqa: ASYNC109  # type: ignore[no-untyped-def]
    async def ended():  # type: ignore[no-untyped-def]
        turn = await queue.get(turn_id)
        return turn if turn is not None and turn.status in ("done", "failed", "cancelled") else None

    return await wait_for(ended, timeout, f"turn {turn_id} to finish")


def assert_tools_turn_whole(messages, turn) -> None:  # type: ignore[no-untyped-def]
    """The stored ``tools`` turn holds each part exactly once, in step order."""
    users = [m for m in messages if isinstance(m, UserMessage)]
    assistants = [m for m in messages if isinstance(m, AssistantMessage)]
    tools = [m for m in messages if isinstance(m, ToolMessage)]
    assert [u.content for u in users] == [turn.input]
    assert [a.id for a in assistants] == [turn.message_id]
    assert [t.tool_call_id for t in tools] == ["call_1", "call_2"]
    assert [t.error for t in tools] == [None, None]
    parts = assistants[0].content
    calls = [p.tool_call_id for p in parts if isinstance(p, ToolCallPart)]
    assert calls == ["call_1", "call_2"]
    text = "".join(p.text for p in parts if isinstance(p, TextPart))
    assert text == answer_text(turn.input)
    steps = [p.step for p in parts]
    assert steps == sorted(steps) and steps[-1] == 2
    assert not assistants[0].interrupted


async def relayed_text(redis_url: str, prefix: str, turn_id: str) -> str:
    async with RedisRelay.open(redis_url, prefix=prefix) as relay:
        return "".join(
            [chunk.text async for chunk in relay.read(turn_id) if type(chunk) is TextDelta]
        )


async def test_a_worker_killed_mid_stream_is_taken_over_and_each_part_is_stored_once(
    pg_url: str,
    redis_url: str,
    workers: Workers,
    cluster: tuple[PostgresStore, TurnQueue],
) -> None:
    store, queue = cluster
    workers.start("a", AXON_TEST_DELAY="0.03")
    turn = await queue.submit("s1", "tools one")

    async def answering() -> bool:  # both tool steps committed: the answer streams
        record = await store.load("s1")
        return record is not None and len(record.messages) >= 4

    await wait_for(answering, what="the answer step")
    await trio.sleep(0.3)  # a few words into the answer
    workers.signal("a", signal.SIGKILL)
    workers.start("b")
    done = await finished(queue, turn.turn_id)
    assert done.status == "done"
    assert (done.attempts, done.epoch) == (2, 2)
    record = await store.load("s1")
    assert record is not None
    assert_tools_turn_whole(record.messages, turn)
    effects, _ = read_ledger(pg_url)
    assert effects == {f"{turn.turn_id}:0:call_1": 1, f"{turn.turn_id}:1:call_2": 1}
    # The relay's readers see the answer once: the dead worker's partial step dropped.
    assert await relayed_text(redis_url, workers.prefix, turn.turn_id) == answer_text(turn.input)


async def test_a_worker_killed_between_a_tool_and_its_commit_repeats_no_side_effect(
    pg_url: str,
    redis_url: str,
    workers: Workers,
    cluster: tuple[PostgresStore, TurnQueue],
) -> None:
    store, queue = cluster
    workers.start("a", AXON_TEST_TOOL_HOLD="30")
    turn = await queue.submit("s1", "tools two")
    first = f"{turn.turn_id}:0:call_1"

    async def effect_done() -> bool:
        return first in (await trio.to_thread.run_sync(read_ledger, pg_url))[0]

    await wait_for(effect_done, what="the first tool's side effect")
    record = await store.load("s1")
    assert record is None or not any(isinstance(m, ToolMessage) for m in record.messages)
    workers.signal("a", signal.SIGKILL)  # the effect happened; its step is not committed
    workers.start("b")
    done = await finished(queue, turn.turn_id)
    assert done.status == "done"
    effects, attempts = read_ledger(pg_url)
    assert effects == {first: 1, f"{turn.turn_id}:1:call_2": 1}
    assert attempts[first] == 2  # the step was re-run, its effect was not repeated
    record = await store.load("s1")
    assert record is not None
    assert_tools_turn_whole(record.messages, turn)


def _backends_finishing_a_turn(pg_url: str) -> int:
    """Backends inside a last step's save, held (``AXON_TEST_FINISH_HOLD``) after it
    wrote the turn's row ``done``, before the commit."""
    libpq, _ = parse_url(pg_url)
    with psycopg.connect(libpq, autocommit=True) as conn:
        [(n,)] = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND state = 'active' AND (query LIKE %s OR query LIKE %s OR query LIKE %s)",
            (
                "%pg_sleep(%), pg_notify(%",
                f"%pg_sleep(%) FROM {SAVE_FUNCTION_NAME}(%",
                f"%pg_sleep(%) FROM {SAVE_NEXT_FUNCTION_NAME}(%",  # the next claim riding
            ),
        ).fetchall()
    return int(n)


async def test_a_worker_killed_in_its_last_save_leaves_the_turn_to_a_takeover_whole(
    pg_url: str,
    redis_url: str,
    workers: Workers,
    cluster: tuple[PostgresStore, TurnQueue],
) -> None:
    """The save of a turn's last step also finishes its row, in one transaction: a worker
    that dies inside it leaves neither (the turn runs, its last step unstored), and the
    turn taken over stores that step once and ends ``done``.

    The save is one statement in autocommit (the save function): a server runs a
    statement to its end, commit included, whoever sent it, unless it checks that the
    client is still there (``client_connection_check_interval``, set here for worker a):
    then the held statement is cancelled when a dies, as a transaction whose ``COMMIT``
    never came is rolled back."""
    store, queue = cluster
    workers.start(
        "a", AXON_TEST_FINISH_HOLD="3", PGOPTIONS="-c client_connection_check_interval=50"
    )
    turn = await queue.submit("s1", "tools one")

    async def in_last_save() -> bool:
        return await trio.to_thread.run_sync(_backends_finishing_a_turn, pg_url) > 0

    await wait_for(in_last_save, what="worker a inside its last save")
    held = await queue.get(turn.turn_id)
    assert held is not None and held.status == "running"  # written done, not committed
    record = await store.load("s1")
    assert record is not None and len(record.messages) == 4  # the two tool steps only
    workers.signal("a", signal.SIGKILL)
    workers.start("b")
    done = await finished(queue, turn.turn_id)
    assert done.status == "done" and done.owner == "b"
    assert (done.attempts, done.epoch) == (2, 2)
    record = await store.load("s1")
    assert record is not None
    assert_tools_turn_whole(record.messages, turn)
    effects, _ = read_ledger(pg_url)
    assert effects == {f"{turn.turn_id}:0:call_1": 1, f"{turn.turn_id}:1:call_2": 1}
    assert await relayed_text(redis_url, workers.prefix, turn.turn_id) == answer_text(turn.input)


async def test_a_paused_worker_past_its_lease_has_its_writes_refused(
    pg_url: str,
    redis_url: str,
    workers: Workers,
    cluster: tuple[PostgresStore, TurnQueue],
) -> None:
    store, queue = cluster
    workers.start("a", AXON_TEST_TOOL_HOLD="1.5")
    turn = await queue.submit("s1", "tools three")

    async def step_zero_running() -> bool:
        effects, _ = await trio.to_thread.run_sync(read_ledger, pg_url)
        return f"{turn.turn_id}:0:call_1" in effects

    await wait_for(step_zero_running, what="worker a in its first tool")
    workers.signal("a", signal.SIGSTOP)
    workers.start("b")
    done = await finished(queue, turn.turn_id)
    assert done.status == "done" and done.owner == "b"
    version = await store.version("s1")
    before = (await store.load("s1")).messages  # type: ignore[union-attr]
    workers.signal("a", signal.SIGCONT)  # a wakes up mid-tool, still believing it runs

    async def a_noticed() -> bool:
        return "lease_lost" in workers.log("a")

    await wait_for(a_noticed, timeout=20, what="worker a to notice its lost lease")
    await trio.sleep(1.0)
    assert await store.version("s1") == version
    assert (await store.load("s1")).messages == before  # type: ignore[union-attr]
    assert workers.alive("a")  # it goes on working: the next turn is its to take
    second = await queue.submit("s2", "after the pause")
    assert (await finished(queue, second.turn_id)).status == "done"


async def test_four_workers_run_200_turns_over_20_sessions_in_order_without_overlap(
    pg_url: str,
    redis_url: str,
    workers: Workers,
    cluster: tuple[PostgresStore, TurnQueue],
) -> None:
    store, queue = cluster
    for name in "abcd":
        workers.start(name)
    sessions = [f"s{i}" for i in range(20)]

    async def submit_all(session_id: str) -> None:
        async with trio.open_nursery() as nursery:  # simultaneous turns for one session
            for i in range(10):
                nursery.start_soon(queue.submit, session_id, f"{session_id} m{i}")

    async with trio.open_nursery() as nursery:
        for session_id in sessions:
            nursery.start_soon(submit_all, session_id)

    async def all_done() -> bool:
        rows = await trio.to_thread.run_sync(
            sql, pg_url, "SELECT count(*) FROM axon_turns WHERE status = 'done'"
        )
        return rows[0][0] == 200

    await wait_for(all_done, timeout=180, what="200 turns")
    rows = sql(
        pg_url,
        "SELECT session_id, input, owner, started_at, finished_at FROM axon_turns "
        "ORDER BY session_id, seq",
    )
    owners = {row[2] for row in rows}
    assert len(owners) >= 2
    by_session: dict[str, list[tuple]] = {}  # type: ignore[type-arg]
    for row in rows:
        by_session.setdefault(row[0], []).append(row)
    for session_id, turns in by_session.items():
        for earlier, later in itertools.pairwise(turns):
            assert earlier[4] <= later[3], f"{session_id}: turns overlapped"
        record = await store.load(session_id)
        assert record is not None
        users = [m.content for m in record.messages if isinstance(m, UserMessage)]
        answers = [m.text for m in record.messages if isinstance(m, AssistantMessage)]
        submitted = [row[1] for row in turns]
        assert users == [_input_text(raw) for raw in submitted]
        assert answers == [f"echo: {u}" for u in users]


def _input_text(raw: object) -> str:
    if isinstance(raw, str):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
        return value if isinstance(value, str) else str(value)
    return str(raw)


async def test_postgresql_and_redis_restarted_mid_turn_lose_nothing_committed(
    pg_url: str,
    redis_url: str,
    workers: Workers,
    cluster: tuple[PostgresStore, TurnQueue],
) -> None:
    store, queue = cluster
    workers.start("a", lease=10.0, AXON_TEST_DELAY="0.02", AXON_TEST_TOOL_HOLD="0.5")
    turn = await queue.submit("s1", "tools four")

    async def running() -> bool:
        got = await queue.get(turn.turn_id)
        return got is not None and got.status == "running"

    await wait_for(running, what="the turn to start")
    with redis_restored():
        await trio.to_thread.run_sync(restart_postgres)  # the run's own servers only
        await trio.to_thread.run_sync(stop_redis)
        await trio.sleep(0.5)
        await trio.to_thread.run_sync(start_redis)
    done = await finished(queue, turn.turn_id, timeout=90)
    assert done.status == "done"
    record = await store.load("s1")
    assert record is not None
    assert_tools_turn_whole(record.messages, turn)
    effects, _ = read_ledger(pg_url)
    assert effects == {f"{turn.turn_id}:0:call_1": 1, f"{turn.turn_id}:1:call_2": 1}


def test_worker_refuses_a_store_that_is_not_postgresql(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "--store", str(tmp_path / "x.db")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and "PostgreSQL" in out.stderr
    assert "Traceback" not in out.stderr


async def test_a_turn_that_kills_its_workers_fails_after_max_attempts_and_blocks_nothing(
    pg_url: str,
    redis_url: str,
    workers: Workers,
    cluster: tuple[PostgresStore, TurnQueue],
) -> None:
    _store, queue = cluster
    poison = await queue.submit("s1", "crash now")
    after = await queue.submit("s1", "after the crash")
    other = await queue.submit("s2", "another session")
    started = 0

    async def supervise() -> None:  # a process manager restarting dead workers
        nonlocal started
        while True:
            if started == 0 or not workers.alive(f"w{started}"):
                started += 1
                workers.start(f"w{started}", max_attempts=2)
            await trio.sleep(0.1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(supervise)
        dead = await finished(queue, poison.turn_id, timeout=60)
        assert (await finished(queue, after.turn_id)).status == "done"
        assert (await finished(queue, other.turn_id)).status == "done"
        nursery.cancel_scope.cancel()
    assert dead.status == "failed"
    assert dead.attempts == 2
    assert "2" in (dead.error or "")
    assert started >= 3  # two killed by the turn, a third ran the rest


async def test_sigterm_drains_then_releases_a_long_turn_to_another_worker_at_once(
    pg_url: str, redis_url: str, workers: Workers, cluster: tuple[PostgresStore, TurnQueue]
) -> None:
    store, queue = cluster
    # A lease far longer than the test: only a release lets b take the turn over.
    workers.start("a", lease=120.0, AXON_TEST_TOOL_HOLD="30")
    turn = await queue.submit("s1", "tools five")

    await in_first_tool(pg_url)
    workers.signal("a", signal.SIGTERM)  # --grace 2: the tool holds 30 s

    async def exited() -> bool:
        return not workers.alive("a")

    await wait_for(exited, timeout=20, what="worker a to exit")
    assert workers.procs["a"].returncode == 0
    released = await queue.get(turn.turn_id)
    assert released is not None and released.status == "running"
    assert released.owner is None  # released: no lease to wait for
    workers.start("b", lease=120.0)
    done = await finished(queue, turn.turn_id, timeout=30)
    assert done.status == "done" and done.owner == "b"
    assert done.attempts == 1  # a graceful stop burns no attempt
    record = await store.load("s1")
    assert record is not None
    assert_tools_turn_whole(record.messages, turn)
    effects, _ = read_ledger(pg_url)
    assert set(effects.values()) == {1}


async def test_stop_through_the_queue_cancels_the_turn_on_its_worker_and_saves_it_interrupted(
    pg_url: str, redis_url: str, workers: Workers, cluster: tuple[PostgresStore, TurnQueue]
) -> None:
    store, queue = cluster
    workers.start("a", AXON_TEST_TOOL_HOLD="30")
    turn = await queue.submit("s1", "tools six")

    await in_first_tool(pg_url)
    await queue.request_cancel(turn.turn_id, "stopped by user")  # noticed on renewal
    done = await finished(queue, turn.turn_id, timeout=15)
    assert done.status == "cancelled"
    record = await store.load("s1")
    assert record is not None
    assistant = next(m for m in record.messages if isinstance(m, AssistantMessage))
    assert assistant.id == turn.message_id and assistant.interrupted
    assert workers.alive("a")


async def test_stop_over_the_relay_reaches_the_worker_at_once(
    pg_url: str, redis_url: str, workers: Workers, cluster: tuple[PostgresStore, TurnQueue]
) -> None:
    _store, queue = cluster
    workers.start("a", lease=120.0, AXON_TEST_TOOL_HOLD="30")  # no renewal in time
    turn = await queue.submit("s1", "tools seven")

    await in_first_tool(pg_url)
    async with RedisRelay.open(redis_url, prefix=workers.prefix) as relay:
        assert await relay.request_cancel(turn.turn_id, "stopped by user") >= 1
    done = await finished(queue, turn.turn_id, timeout=15)
    assert done.status == "cancelled"
    assert done.error == "stopped by user"


def test_worker_with_a_database_that_does_not_exist_is_one_line_and_exit_2() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runtime", "worker",
         "--store", "postgresql://postgres@127.0.0.1/axon_no_such_db"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and "axon_no_such_db" in out.stderr
    assert "Traceback" not in out.stderr


def test_worker_agent_that_is_not_importable_is_one_line_and_exit_2(pg_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "--store", pg_url,
         "--agent", "no_such_module:agent"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("error: --agent") and "Traceback" not in out.stderr


async def test_a_live_reader_is_told_the_step_restarted_and_ends_with_the_answer_once(
    pg_url: str, redis_url: str, workers: Workers, cluster: tuple[PostgresStore, TurnQueue]
) -> None:
    _store, queue = cluster
    workers.start("a", AXON_TEST_DELAY="0.03")
    turn = await queue.submit("s1", "tools eight")
    deltas: list[TextDelta] = []
    restarts: list[int] = []

    async def read(relay: RedisRelay) -> None:
        async for chunk in relay.read(turn.turn_id):
            if type(chunk) is ResetStep:
                restarts.append(chunk.step)
                deltas[:] = [d for d in deltas if d.step != chunk.step]
            elif type(chunk) is TextDelta:
                deltas.append(chunk)

    async with RedisRelay.open(redis_url, prefix=workers.prefix) as relay:

        async def started() -> bool:
            return await relay.active_turn("s1") == turn.turn_id

        await wait_for(started, what="the turn's stream")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, relay)
            await wait_for(lambda: _true_if(len(deltas) >= 3), what="some answer text")
            workers.signal("a", signal.SIGKILL)
            workers.start("b")
    assert restarts == [2]  # the answer step, re-run by b
    assert "".join(d.text for d in deltas) == answer_text(turn.input)
    assert (await finished(queue, turn.turn_id)).status == "done"


async def _true_if(value: bool) -> bool:
    return value


async def test_a_worker_with_an_agent_factory_keeps_no_agent_past_its_sessions(
    pg_url: str, cluster: tuple[PostgresStore, TurnQueue]
) -> None:
    store, queue = cluster
    made: list[str] = []

    def factory(session_id: str) -> Agent:
        made.append(session_id)
        return attrs.evolve(worker_agent.agent)

    async with trio.open_nursery() as nursery:
        worker = Worker(store=store, agent=factory, poll=0.05, max_sessions=2)
        await nursery.start(worker.run)
        for i in range(6):
            turn = await queue.submit(f"f{i % 3}", f"hello {i}")
            assert (await finished(queue, turn.turn_id)).status == "done"
        assert worker.host is not None and len(worker.host.sessions) <= 2
        worker.stop()
    assert sorted(set(made)) == ["f0", "f1", "f2"]


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--redis", "http://127.0.0.1:6379"], "bad Redis URL"),
        (["--concurrency", "0"], "--concurrency"),
        (["--lease", "-1"], "--lease"),
        (["--relay-flush-interval", "-0.001"], "--relay-flush-interval"),
        (["--relay-end-wait", "nan"], "--relay-end-wait"),
    ],
)
def test_worker_bad_options_are_one_line_exit_2_and_touch_no_database(
    pg_url: str, flags: list[str], says: str
) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "--store", pg_url, *flags],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and says in out.stderr
    assert "Traceback" not in out.stderr
    _, schema = parse_url(pg_url)
    assert sql(pg_url, "SELECT 1 FROM pg_namespace WHERE nspname = %s", schema) == []
