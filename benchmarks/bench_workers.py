"""8. The worker deployment: PostgreSQL turn queue, worker processes, Redis relay (issue 10).

Four figures, each a ratio or difference measured side by side in one run:

* **Workers: 2 processes / 1.** Real ``python -m runtime worker`` processes
  (``--concurrency`` 8 each, agent :mod:`benchmarks.workers_agent`, relay on) against one
  PostgreSQL, in a fresh schema per measurement (dropped after). Many one-turn sessions
  are submitted up front through :class:`~actors.stores.turns.TurnQueue`, the table is
  analyzed, and the turns are held unclaimable while the workers start; one transaction
  then releases them and notifies the workers, and this process only polls one
  ``count(*)`` every 50 ms until all are done, so it costs next to nothing while the
  workers run. The time is the database's own clock: from the release to the last
  ``finished_at``. Measurements alternate 1, 2, 2, 1, ...; the figure is the median of
  the per-round ratios. It runs twice: with the scripted model as fast as it gets (CPU
  bound: the workers, PostgreSQL and Redis share the machine's cores) and with a delay
  before each chunk (I/O bound, like a real model). Each measurement also reads from
  ``/proc`` how many cores the workers, PostgreSQL, Redis, this process and *everything
  else* had: CPU bound, the cores other programs take are the second worker's, so the
  figure's detail says how much that was (the machine's cores are shared).
* **Relay: first delta added.** In one process: a host runs a turn whose consumer appends
  every chunk to a :class:`~actors.relays.redis_streams.RedisRelay` writer, while a reader
  on a second Redis client (``RedisRelay.read``, blocked in ``XREAD``) timestamps the
  first text delta's arrival. The figure is relay arrival minus the in-process consumer's
  arrival of the same delta (``time.perf_counter`` both), p50 and p90 over many turns.
* **Store: PostgreSQL / SQLite.** The same multi-step tool turn (two ``lookup`` steps and
  a 50-delta answer) on ``Host.open(store="postgresql://...")`` and on
  ``Host.open(store=<SQLite file>)``, alternated; the ratio of medians.

* **CPU per turn** (8c): a worker's, its PostgreSQL's and Redis's, against the same turns
  embedded on SQLite, read from ``/proc``: :mod:`benchmarks.bench_turn_cpu`.

Each figure needs its servers: throwaway PostgreSQL and Redis servers the run starts
(never the machine's own), or the ones ``AXON_BENCH_PG`` / ``AXON_BENCH_REDIS`` name on
purpose; a figure whose server does not answer is *skipped*, saying which.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import (
    PROMPT,
    REPO,
    Figure,
    LogSink,
    Sizes,
    alternate,
    bench_server_urls,
    median,
    now,
    python_env,
)

PG_URL, REDIS_URL = bench_server_urls()
SCALING_TARGETS = {"io": 1.7, "cpu": 1.8}
"""Two worker processes' turns/s over one's: issue 10 asked 1.7x of any turn, issue 24 goal 3
1.8x of a CPU-bound one (benchmarks/journal/workers.md says why that one is out of reach while
PostgreSQL and Redis share the machine's two cores)."""
RELAY_TARGET_MS = 3.0
POLL = 0.1
"""Seconds between the submitter's checks for finished turns."""
FIRST_TEXT_PAUSE = 0.03
"""Seconds the relay benchmark's model waits before its first text delta, so the reader
is blocked in ``XREAD`` (live), not replaying a backlog, when the delta is written."""


# -- are the servers there ----------------------------------------------------------------


def pg_unavailable() -> str | None:
    """Why PostgreSQL cannot be used, or ``None`` when it answers."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as err:
        first = (str(err).strip().splitlines() or [repr(err)])[0]
        return f"PostgreSQL at {_shown(PG_URL)} does not answer: {first[:200]}"
    return None


def redis_unavailable() -> str | None:
    """Why Redis cannot be used, or ``None`` when it answers ``PING``."""
    from urllib.parse import urlsplit

    parts = urlsplit(REDIS_URL)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.sendall(b"PING\r\n")
            if sock.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                return None
    except OSError as err:
        return f"Redis at {host}:{port} does not answer: {err}"
    return f"Redis at {host}:{port} does not answer PING"


def _shown(url: str) -> str:
    from actors.stores.postgres import redact_url

    return redact_url(url)


def _schema_url() -> tuple[str, str]:
    schema = f"axon_bench_{uuid.uuid4().hex[:12]}"
    return schema, f"{PG_URL}?schema={schema}"


def _drop_schema(schema: str) -> None:
    _sql(f"{PG_URL}?schema={schema}", f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def _delete_keys(prefix: str) -> None:
    """The relay streams a measurement left (they would expire, but not for minutes)."""
    from actors.relays.redis_streams import RedisRelay

    async with RedisRelay.open(REDIS_URL, prefix=prefix) as relay:
        keys = [key async for key in relay.client.scan_iter(match=f"{prefix}*", count=1000)]
        for i in range(0, len(keys), 500):
            await relay.client.delete(keys[i : i + 500])


# -- 1. turns per second with 1 and 2 worker processes --------------------------------------


@contextmanager
def _worker_processes(
    n: int, url: str, prefix: str, concurrency: int, delay: float, logs: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``n`` worker processes, each ready (its banner printed) when this yields; stopped
    with SIGTERM (then killed) when it exits."""
    env = {**python_env(), "AXON_BENCH_DELAY": str(delay)}
    procs: list[subprocess.Popen[bytes]] = []
    outputs: list[Path] = []
    try:
        for i in range(n):
            # The command logs on stdout: into a file, never a pipe nobody drains.
            output = logs / f"worker-{prefix.strip(':').split(':')[-1]}-{i}.log"
            outputs.append(output)
            with output.open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [
                            sys.executable, "-m", "runtime", "worker",
                            "--store", url, "--redis", REDIS_URL, "--redis-prefix", prefix,
                            "--agent", "benchmarks.workers_agent:agent",
                            "--concurrency", str(concurrency), "--log-level", "info",
                            "--owner", f"bench-{i}",
                        ],
                        cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
        deadline = time.monotonic() + 60
        for proc, output in zip(procs, outputs, strict=True):
            while b"Axon worker " not in output.read_bytes():
                if proc.poll() is not None or time.monotonic() > deadline:
                    tail = output.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"a worker did not start: {tail}")
                time.sleep(0.02)
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _sql(url: str, *statements: str) -> list[Any]:
    """Run ``statements`` in one transaction in ``url``'s schema; the last one's rows."""
    import psycopg

    from actors.stores.postgres import parse_url

    libpq, schema = parse_url(url)
    deadline = time.monotonic() + 60
    while True:  # the server is shared: another program may be restarting it
        try:
            rows: list[Any] = []
            with psycopg.connect(libpq, connect_timeout=10) as conn:
                conn.execute(f"SET search_path TO {schema}")
                for statement in statements:
                    cur = conn.execute(statement)
                    rows = cur.fetchall() if cur.description else []
            return rows
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@functools.cache
def _server_pids() -> tuple[int, int]:
    """The PostgreSQL postmaster's and the Redis server's process ids (asked once)."""
    from benchmarks import bench_turn_cpu as cpu

    return cpu.postmaster_pid(PG_URL), cpu.redis_pid(REDIS_URL)


def _cpu_split(workers: list[int]) -> dict[str, float]:
    """CPU seconds so far (``/proc``) of the worker processes, this run's PostgreSQL and
    Redis servers, this process, and everything else on the machine (``others``: the
    machine's busy time minus those). Differences over a measurement, per second, say
    how many cores each had: a CPU-bound 2 / 1 ratio means something only when the
    others had next to none (the machine's 2 cores are shared with other programs)."""
    from benchmarks import bench_turn_cpu as cpu

    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
        busy = (sum(ticks) - ticks[3] - ticks[4]) / cpu.TICK  # all but idle and iowait
        got = {
            "workers": sum(cpu.process_cpu(pid) for pid in workers),
            "postgresql": cpu.tree_cpu(_server_pids()[0]),
            "redis": cpu.process_cpu(_server_pids()[1]),
            "submitter": cpu.process_cpu(os.getpid()),
        }
    except (OSError, ValueError, StopIteration):  # not Linux, or a server not ours to read
        return {}
    return {**got, "others": busy - sum(got.values())}


class _ServerRestarted(Exception):
    """PostgreSQL restarted during a measurement (the machine is shared): measure again."""


def _server_started(url: str) -> Any:
    [(started,)] = _sql(url, "SELECT pg_postmaster_start_time()")
    return started


async def _submit(url: str, turns: int) -> float:
    """Queue ``turns`` one-turn sessions through the queue; the seconds it took."""
    from actors.stores.postgres import PostgresStore
    from actors.stores.turns import TurnQueue

    store = await PostgresStore.open(url)
    try:
        queue = TurnQueue(store)
        t0 = now()
        for i in range(turns):
            await queue.submit(f"s{i}", PROMPT)
        return now() - t0
    finally:
        await store.aclose()


async def _wait_all_done(url: str, turns: int) -> None:
    """Poll (every ``POLL`` s, one ``count(*)`` on one kept connection) until every turn
    ended; all must be ``done``. The clock is the database's (``finished_at``), so how
    often this looks changes no figure; a new connection per look would fork a server
    process 20 times a second on the cores the workers are measured on."""
    import psycopg

    from actors.stores.postgres import parse_url

    count = (
        "SELECT count(*) FILTER (WHERE status IN ('done', 'failed', 'cancelled')), "
        "count(*) FILTER (WHERE status = 'done') FROM axon_turns"
    )
    libpq, schema = parse_url(url)
    conn = None
    try:
        while True:
            try:
                if conn is None or conn.closed:
                    conn = await trio.to_thread.run_sync(
                        lambda: psycopg.connect(libpq, connect_timeout=10, autocommit=True)
                    )
                    conn.execute(f"SET search_path TO {schema}")
                [(ended, done)] = await trio.to_thread.run_sync(
                    lambda: conn.execute(count).fetchall()  # noqa: B023
                )
            except psycopg.OperationalError:  # the shared server restarting: look again
                conn = None
                await trio.sleep(0.5)
                continue
            if ended == turns:
                break
            await trio.sleep(POLL)
    finally:
        if conn is not None:
            conn.close()
    if done != turns:
        raise RuntimeError(f"workers: {turns - done} of {turns} turns did not end 'done'")


async def _one_measurement(
    n: int, sizes: Sizes, delay: float, logs: Path, details: list[dict[str, Any]]
) -> float:
    """:func:`_measure_once`, again (at most twice more) if PostgreSQL restarted meanwhile."""
    for attempt in range(3):
        try:
            return await _measure_once(n, sizes, delay, logs, details)
        except _ServerRestarted:
            details.append({"workers": n, "discarded": "PostgreSQL restarted", "try": attempt})
    raise RuntimeError("workers: PostgreSQL restarted during three measurements in a row")


async def _measure_once(
    n: int, sizes: Sizes, delay: float, logs: Path, details: list[dict[str, Any]]
) -> float:
    """Seconds for ``n`` workers to run ``sizes.workers_turns`` queued turns (fresh schema).

    The turns are submitted first, through the queue, and the table analyzed (as a
    deployment's long-lived table is; see the README on a fresh table). They are held
    unclaimable (``cancel_requested``) while the workers start, then released in one
    transaction that notifies them: every worker starts claiming at once, and neither
    the workers' start-up nor the submissions are on the clock."""
    schema, url = _schema_url()
    prefix = f"axonbench:{uuid.uuid4().hex[:10]}:"
    turns = sizes.workers_io_turns if delay else sizes.workers_turns
    try:
        submitted = await _submit(url, turns)
        server = await trio.to_thread.run_sync(_server_started, url)
        await trio.to_thread.run_sync(
            _sql, url, "ANALYZE axon_turns", "UPDATE axon_turns SET cancel_requested = true"
        )
        with _worker_processes(n, url, prefix, sizes.workers_concurrency, delay, logs) as procs:
            pids = [proc.pid for proc in procs]
            cpu0 = _cpu_split(pids)
            t0 = now()
            [(released,)] = await trio.to_thread.run_sync(
                _sql,
                url,
                "UPDATE axon_turns SET cancel_requested = false",
                f"NOTIFY axon_turns, '{schema}:go'",
                "SELECT clock_timestamp()",
            )
            await _wait_all_done(url, turns)
            local = now() - t0
            cores = {k: round((v - cpu0[k]) / local, 2) for k, v in _cpu_split(pids).items()}
        if await trio.to_thread.run_sync(_server_started, url) != server:
            raise _ServerRestarted
        [(seconds, first_claim)] = await trio.to_thread.run_sync(
            _sql,
            url,
            f"SELECT extract(epoch FROM max(finished_at) - '{released.isoformat()}'), "
            f"extract(epoch FROM min(started_at) - '{released.isoformat()}') FROM axon_turns",
        )
    finally:
        await trio.to_thread.run_sync(_drop_schema, schema)
        await _delete_keys(prefix)
    got = {
        "turns": turns,
        "seconds": float(seconds),
        "local_seconds": local,
        "first_claim_after_s": float(first_claim),
        "submit_seconds": submitted,
        "cores": cores,
    }
    details.append({"workers": n, **got})
    return got["seconds"]


async def _scaling(sizes: Sizes, delay: float, logs: Path) -> list[Figure]:
    details: list[dict[str, Any]] = []
    sides = {str(n): (lambda n=n: _one_measurement(n, sizes, delay, logs, details)) for n in (1, 2)}
    times = await alternate(sizes.workers_rounds, sizes.workers_warmup, sides, collect=False)
    turns = sizes.workers_io_turns if delay else sizes.workers_turns
    rate = {n: [turns / s for s in times[n]] for n in ("1", "2")}
    ratios = [b / a for a, b in zip(rate["1"], rate["2"], strict=True)]
    value = median(ratios)
    kind = "io" if delay else "cpu"
    what = f"{delay * 1e3:g} ms before each chunk" if delay else "model as fast as it gets"
    figures = [
        Figure(
            key=f"workers.turns_per_s.{kind}.{n}",
            title=f"8. Worker turns/s, {n} process(es), {kind} bound",
            value=median(rate[n]),
            unit="turns/s",
            detail=f"{turns} one-turn sessions, concurrency {sizes.workers_concurrency} each; "
            f"{what}",
            data={"seconds": times[n]},
        )
        for n in ("1", "2")
    ]
    figures.append(
        Figure(
            key=f"workers.scaling.{kind}",
            title=f"8. Turns/s, 2 worker processes / 1, {kind} bound",
            value=value,
            unit="x",
            target=f">= {SCALING_TARGETS[kind]:g}",
            passed=value >= SCALING_TARGETS[kind],
            detail=f"{median(rate['1']):.0f} vs {median(rate['2']):.0f} turns/s; median of "
            f"{sizes.workers_rounds} rounds; load {os.getloadavg()[0]:.2f}{_others(details)}",
            data={"ratios": ratios, "measurements": details, "delay": delay},
        )
    )
    return figures


def _run_cores(measured: dict[str, Any]) -> float:
    """The cores a measurement's own processes had (workers, PostgreSQL, Redis, the
    submitter; not ``others``, the machine's other programs)."""
    return sum(v for k, v in measured["cores"].items() if k != "others")


def _others(details: list[dict[str, Any]]) -> str:
    """The cores other programs took during the measurements (median, max), for the
    figure's detail (CPU bound, what they took the workers did not get), and what bounds
    the ratio. A run's turns/s is the cores its processes had (``u``) over their CPU a
    turn (``t``), so 2 / 1 is exactly ``(u2 / u1) x (t1 / t2)``: at best ``u2`` is the
    machine's cores and ``t2`` is ``t1``, the ceiling ``cores / u1``. ``u1`` is ``c1 x
    (1 + n / w)`` (``c1`` the one worker's cores, ``w`` its CPU a turn, ``n`` the rest's),
    so the ceiling is about ``2 / (1 + n / w)`` on 2 cores: the README's section 8."""
    others = [d["cores"]["others"] for d in details if d.get("cores")]
    if not others:
        return ""
    # Other programs' cores ("others": the machine's other sessions) are not the run's:
    # counted in, a busy machine would lower the ceiling the run itself sets.
    ones = [d for d in details if d.get("cores") and d["workers"] == 1]
    twos = [d for d in details if d.get("cores") and d["workers"] == 2]
    cpus = os.cpu_count() or 1
    ceiling = ""
    if ones and median([_run_cores(d) for d in ones]) > 0:
        taken = median([_run_cores(d) for d in ones])
        ceiling = f"; ceiling {cpus / taken:.2f}x ({cpus} cores / {taken:.2f} by one worker's run)"
        if all(d["cores"].get("workers") for d in ones):
            outside = median([_run_cores(d) / d["cores"]["workers"] - 1 for d in ones])
            # The same with the one worker at a full core (on a busy machine it gets less,
            # which raises cores / u1 past what a quiet one would give).
            ceiling += (
                f", CPU outside the workers / the workers' {outside:.2f}: "
                f"{cpus / (1 + outside):.2f}x at a full core a worker"
            )
        timed = [d for d in ones + twos if d.get("turns") and d.get("local_seconds")]
        if twos and len(timed) == len(ones) + len(twos):
            # CPU a turn of the run's processes: cores x seconds / turns.
            def cost(ds: list[dict[str, Any]]) -> float:
                return median([_run_cores(d) * d["local_seconds"] / d["turns"] for d in ds])

            ceiling += (
                f"; two workers' run {median([_run_cores(d) for d in twos]):.2f} cores, its "
                f"CPU a turn {cost(twos) / cost(ones):.2f}x one worker's"
            )
    return f"; other programs took {median(others):.2f} cores (max {max(others):.2f}){ceiling}"


# -- 2. first delta added by the relay -----------------------------------------------------


def _relay_agent() -> Any:
    from actors.providers.scripted import ScriptedProvider, Sleep
    from runtime.agent import Agent
    from runtime.chunks import TextChunk

    answer = [Sleep(FIRST_TEXT_PAUSE), *(TextChunk(text=f" w{i}") for i in range(20))]
    provider = ScriptedProvider(responder=lambda request: answer, keep_requests=0)
    return Agent(name="bench-relay", provider=provider, instructions="bench")


async def _relay_added(sizes: Sizes, directory: str) -> list[float]:
    """Per turn: seconds from the in-process consumer getting the first text delta to a
    reader of the relay on another Redis client getting it."""
    from actors.relays.redis_streams import RedisRelay
    from runtime import Host
    from runtime.errors import RelayTurnGone

    agent = _relay_agent()
    prefix = f"axonbench:{uuid.uuid4().hex[:10]}:"
    added: list[float] = []
    try:
        async with (
            RedisRelay.open(REDIS_URL, prefix=prefix) as relay,
            RedisRelay.open(REDIS_URL, prefix=prefix) as front,
            Host.open(store=str(Path(directory) / "relay.db")) as host,
        ):
            for i in range(sizes.relay_warmup + sizes.relay_turns):
                session = await host.open_session(agent, session_id=f"relay-{i}")
                turn_id = f"turn_bench_{i}"
                stamps: dict[str, float] = {}

                async def read(turn_id: str = turn_id, stamps: dict[str, float] = stamps) -> None:
                    while True:  # until the writer's first flush created the stream
                        try:
                            async for chunk in front.read(turn_id):
                                if chunk.type == "text-delta" and "relay" not in stamps:
                                    stamps["relay"] = now()
                            return
                        except RelayTurnGone:
                            if "relay" in stamps:  # lost after it was read: a real failure
                                raise
                            await trio.sleep(0.001)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    writer = relay.writer(session_id=session.id, turn_id=turn_id)
                    async with session.stream(PROMPT, turn_id=turn_id) as out:
                        async for chunk in out:
                            if chunk.type == "text-delta" and "local" not in stamps:
                                stamps["local"] = now()
                            writer.append(chunk)
                    await writer.aclose()
                await session.close()
                if i >= sizes.relay_warmup:
                    added.append(stamps["relay"] - stamps["local"])
    finally:
        await _delete_keys(prefix)
    return added


def _percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- 3. a PostgreSQL turn / an SQLite turn -------------------------------------------------


async def _store_ratio(sizes: Sizes, directory: str) -> Figure:
    from benchmarks.workers_agent import make_agent
    from runtime import Host

    agent = make_agent(words=50, tool_steps=2)
    schema, url = _schema_url()
    tags = itertools.count()

    async def turn(host: Any) -> float:
        session = await host.open_session(agent, session_id=f"store-{next(tags)}")
        t0 = now()
        async with session.stream(PROMPT) as out:
            async for _ in out:
                pass
        seconds = now() - t0
        await session.close()
        if out.result is None or out.result.finish_reason != "stop" or out.result.steps != 3:
            raise RuntimeError(f"store: the turn ended {out.result}")
        return seconds

    try:
        async with (
            Host.open(store=str(Path(directory) / "store.db")) as lite,
            Host.open(store=url) as pg,
        ):
            times = await alternate(
                sizes.store_rounds,
                sizes.warmup,
                {"postgresql": lambda: turn(pg), "sqlite": lambda: turn(lite)},
            )
    finally:
        await trio.to_thread.run_sync(_drop_schema, schema)
    pg_s, lite_s = median(times["postgresql"]), median(times["sqlite"])
    return Figure(
        key="workers.store",
        title="8. Tool turn on PostgreSQL / on SQLite",
        value=pg_s / lite_s,
        unit="x",
        detail=f"{pg_s * 1e3:.1f} vs {lite_s * 1e3:.1f} ms (3 steps, 2 tool calls, 50 deltas); "
        f"median of {sizes.store_rounds} rounds",
        data={"postgresql_s": times["postgresql"], "sqlite_s": times["sqlite"]},
    )


# -- the benchmark ---------------------------------------------------------------------------


def _skipped(key: str, title: str, unit: str, why: str) -> Figure:
    return Figure(key=key, title=title, value=None, unit=unit, detail=f"skipped: {why}")


async def _measure(sizes: Sizes, directory: str) -> list[Figure]:
    pg_why, redis_why = pg_unavailable(), redis_unavailable()
    figures: list[Figure] = []
    logs = Path(directory)
    for kind, delay in (("cpu", 0.0), ("io", sizes.workers_delay)):
        title = f"8. Turns/s, 2 worker processes / 1, {kind} bound"
        why = pg_why or redis_why
        if why:
            figures.append(_skipped(f"workers.scaling.{kind}", title, "x", why))
        else:
            figures += await _scaling(sizes, delay, logs)
    figures += await _cpu_figures(sizes, logs, pg_why or redis_why)
    if redis_why:
        figures.append(
            _skipped("workers.relay_first_delta", "8. Relay: first delta added", "ms", redis_why)
        )
    else:
        added = await _relay_added(sizes, directory)
        p50, p90 = _percentile(added, 0.5) * 1e3, _percentile(added, 0.9) * 1e3
        figures.append(
            Figure(
                key="workers.relay_first_delta",
                title="8. Relay: first delta added (p50)",
                value=p50,
                unit="ms",
                target=f"< {RELAY_TARGET_MS:g} ms",
                passed=p50 < RELAY_TARGET_MS,
                detail=f"p90 {p90:.2f} ms, max {max(added) * 1e3:.2f} ms; {len(added)} turns, "
                "Redis reader vs in-process consumer",
                data={"added_s": added},
            )
        )
    if pg_why:
        figures.append(
            _skipped("workers.store", "8. Tool turn on PostgreSQL / on SQLite", "x", pg_why)
        )
    else:
        figures.append(await _store_ratio(sizes, directory))
    return figures


async def _cpu_figures(sizes: Sizes, logs: Path, why: str | None) -> list[Figure]:
    """8c: CPU per turn of a worker, PostgreSQL and Redis against the embedded host
    (:mod:`benchmarks.bench_turn_cpu`)."""
    from benchmarks import bench_turn_cpu as cpu

    if why is None:
        try:
            cpu.postmaster_pid(PG_URL), cpu.redis_pid(REDIS_URL)
        except (OSError, ValueError, StopIteration) as err:
            why = f"the servers' processes cannot be read here ({err})"
    if why is not None:
        title = "8c. CPU per turn: worker / embedded (SQLite)"
        return [_skipped("workers.cpu.worker_over_embedded", title, "x", why)]
    turns = sizes.workers_cpu_turns
    got = await cpu.measure(turns, max(turns // 10, 1), sizes.workers_rounds, logs)
    return cpu.figures(got)


def run(sizes: Sizes) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            return trio.run(_measure, sizes, directory)
        finally:
            sink.close()


__all__ = ["pg_unavailable", "redis_unavailable", "run"]
