"""8c. CPU per turn: a worker, its PostgreSQL and Redis, against the embedded host (issue 24).

Throughput ratios say how two workers share two cores; this says where the cores go.
Each round measures, side by side:

* **Worker.** One real ``python -m runtime worker`` process (concurrency 8, relay on, log
  lines at ``info`` into a file, agent :mod:`benchmarks.workers_agent`) on a fresh schema.
  All turns (one per session: a ``lookup`` step, then 20 deltas) are submitted before it
  starts; a warm-up batch is released first (imports, caches, connections), then the
  measured batch. Around the measured batch this process reads, from ``/proc``:

  - the worker's CPU (``utime + stime`` of ``/proc/<pid>/stat``: every thread);
  - PostgreSQL's: the postmaster's own and reaped children's (``cutime + cstime``) plus
    every live child's. The server is the run's own throwaway one, so all of its
    processes (backends, WAL writer, autovacuum, ...) are the turns' cost; also apart
    by process (:data:`PG_PARTS`: the ``pg_*`` lines);
  - Redis's (``redis-server``, one process);
  - the Redis commands the turns cost (``INFO commandstats``: ``XADD`` and all) and
    their round trips (``INFO stats`` ``total_reads_processed``: the server's socket
    reads; a pipeline the worker writes at once is one). Only of the run's own Redis,
    which nothing else uses meanwhile; the two ``INFO`` calls themselves are left out.

  The submitter polls one ``count(*)`` every 0.2 s meanwhile, on one kept connection (its
  statements are PostgreSQL's cost too: a few per second, about 0.1 % of the total).
* **Embedded.** The same turns in a child process: ``Host.open(store=<SQLite file>)``,
  logging at ``info`` into a file, 8 turns at once, the same warm-up; the child's CPU
  (``time.process_time``: every thread, so SQLite's too) over the measured batch, until
  the host is idle again (its log tap lags behind the turns: :func:`_settled`).

Figures: each side's CPU per turn (median of the rounds), and worker / embedded. Needs a
local PostgreSQL whose data directory this user can read (``SHOW data_directory``, then
``postmaster.pid``) and Redis's ``INFO`` ``process_id``: the throwaway servers are.

Also per turn: Redis commands (``XADD`` and all) and round trips (pipelines).

By hand: ``python3 -m benchmarks.bench_turn_cpu [--turns N] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import PROMPT, REPO, Figure, median, python_env, run_session_batch

TICK = os.sysconf("SC_CLK_TCK")
CONCURRENCY = 8
WORKER_CPU_TARGET = 1.5
PG_CPU_TARGET_MS = 2.0


# -- /proc ----------------------------------------------------------------------------------


def _stat(pid: int) -> list[str]:
    """``/proc/<pid>/stat``'s fields after the command name (field 3 is index 0)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rindex(")") + 2 :].split()


def process_cpu(pid: int, *, reaped: bool = False) -> float:
    """Seconds of CPU ``pid`` used (all its threads), plus its reaped children's."""
    fields = _stat(pid)
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if reaped:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / TICK


def tree_cpu(root: int) -> float:
    """``root``'s CPU with its reaped children's, plus every live child's."""
    total = process_cpu(root, reaped=True)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(int(entry.name))
            if int(fields[1]) == root:
                total += process_cpu(int(entry.name), reaped=True)
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return total


PG_PARTS = ("pool", "listen", "walwriter", "autovacuum", "background", "exited")
"""PostgreSQL's CPU apart (:func:`pg_parts`): the worker's pooled connections' backends,
its ``LISTEN`` connection's, the WAL writer, live autovacuum workers, the other background
processes (checkpointer, background writer, launchers), and ``exited``: the postmaster's
own with its reaped children's (autovacuum workers that ended, short-lived connections:
the submitter's poll of the measured batch is one)."""


def pg_processes(root: int) -> dict[int, tuple[str, float]]:
    """Each live child of the postmaster ``root``: its process title and CPU so far (with
    its reaped children's); under ``root`` itself, ``"postmaster"`` and its own CPU with
    every reaped child's."""
    got = {root: ("postmaster", process_cpu(root, reaped=True))}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            pid = int(entry.name)
            if int(_stat(pid)[1]) == root:
                title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                got[pid] = (title.decode(errors="replace").strip(), process_cpu(pid, reaped=True))
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return got


def pg_parts(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], listening: set[int]
) -> dict[str, float]:
    """CPU seconds of each of :data:`PG_PARTS` between two :func:`pg_processes` snapshots
    (``listening``: the pids of backends whose connection listens). A process that started
    meanwhile counts from zero; one that exited meanwhile is in the postmaster's reaped
    time (``exited``), where the whole of its CPU lands."""
    parts = dict.fromkeys(PG_PARTS, 0.0)
    for pid, (title, cpu) in after.items():
        spent = cpu - before.get(pid, (title, 0.0))[1]
        name = title.removeprefix("postgres: ")
        if title == "postmaster":
            part = "exited"
        elif name.startswith("walwriter"):
            part = "walwriter"
        elif name.startswith("autovacuum worker"):
            part = "autovacuum"
        elif name.startswith(("checkpointer", "background", "autovacuum", "logical", "stats")):
            part = "background"
        else:
            part = "listen" if pid in listening else "pool"
        parts[part] += spent
    # A child that exited meanwhile: its time before the first snapshot was its own
    # then, and is in the postmaster's reaped time now; take it out again.
    for pid, (_, cpu) in before.items():
        if pid not in after:
            parts["exited"] -= cpu
    return parts


def _listening(pg_url: str) -> set[int]:
    """The pids of the server's backends whose last statement was a ``LISTEN``."""
    import psycopg

    with psycopg.connect(pg_url, connect_timeout=10, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE query ILIKE 'LISTEN %'"
        ).fetchall()
    return {pid for (pid,) in rows}


def postmaster_pid(pg_url: str) -> int:
    import psycopg

    with psycopg.connect(pg_url, connect_timeout=10) as conn:
        [(data,)] = conn.execute("SHOW data_directory").fetchall()
    return int(Path(data, "postmaster.pid").read_text().split()[0])


def _redis_info(redis_url: str, section: str) -> list[str]:
    """The lines of Redis's ``INFO section`` (one plain RESP call, no client library)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(redis_url)
    with socket.create_connection((parts.hostname, parts.port or 6379), timeout=5) as sock:
        sock.sendall(f"INFO {section}\r\n".encode())
        got = b""
        while b"\r\n" not in got:
            got += sock.recv(65536)
        header, _, body = got.partition(b"\r\n")
        size = int(header[1:])  # a bulk string: $<length>
        while len(body) < size + 2:
            body += sock.recv(65536)
    return body[:size].decode().splitlines()


def redis_pid(redis_url: str) -> int:
    line = next(x for x in _redis_info(redis_url, "server") if x.startswith("process_id:"))
    return int(line.split(":")[1])


def redis_counts(redis_url: str) -> dict[str, int]:
    """Calls so far of each command (lower case) on the Redis at ``redis_url``, and
    ``reads``: its socket reads (``total_reads_processed``), a round trip each: a
    pipeline that arrives in one read counts once, however many commands it holds."""
    counts: dict[str, int] = {}
    for line in _redis_info(redis_url, "commandstats"):
        if line.startswith("cmdstat_"):  # cmdstat_xadd:calls=12,usec=...
            name, _, stats = line[len("cmdstat_") :].partition(":")
            counts[name] = int(stats.split(",")[0].split("=")[1])
    reads = next(x for x in _redis_info(redis_url, "stats") if x.startswith("total_reads"))
    counts["reads"] = int(reads.split(":")[1])
    return counts


def redis_per_turn(before: dict[str, int], after: dict[str, int], turns: int) -> dict[str, float]:
    """Per turn between two :func:`redis_counts`: ``xadd``, ``commands`` (all but the
    counting's own ``INFO``) and ``pipelines`` (round trips, less the counting's)."""
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    commands = sum(v for k, v in diff.items() if k not in ("reads", "info"))
    # Each snapshot is two connections of one INFO each: between two snapshots the
    # server reads 4 times for them (two requests, two closes; measured back to back).
    pipelines = diff["reads"] - 4
    return {
        "xadd": diff.get("xadd", 0) / turns,
        "commands": commands / turns,
        "pipelines": pipelines / turns,
    }


# -- the worker side ------------------------------------------------------------------------


async def _submit_held(url: str, warm: int, turns: int) -> None:
    """Queue ``warm + turns`` one-turn sessions, every one held (``cancel_requested``)."""
    from actors.stores.postgres import PostgresStore
    from actors.stores.turns import TurnQueue
    from benchmarks.bench_workers import _sql

    store = await PostgresStore.open(url)
    try:
        queue = TurnQueue(store)
        for i in range(warm + turns):
            await queue.submit(f"{'w' if i < warm else 'm'}{i}", PROMPT)
    finally:
        await store.aclose()
    await trio.to_thread.run_sync(
        _sql, url, "ANALYZE axon_turns", "UPDATE axon_turns SET cancel_requested = true"
    )


async def _release(url: str, schema: str, prefix: str, expected: int) -> None:
    """Release the held sessions starting with ``prefix``; return when ``expected`` turns
    (released before or now) are done."""
    from benchmarks.bench_workers import _sql

    await trio.to_thread.run_sync(
        _sql,
        url,
        f"UPDATE axon_turns SET cancel_requested = false WHERE session_id LIKE '{prefix}%'",
        f"NOTIFY axon_turns, '{schema}:go'",
    )
    import psycopg

    from actors.stores.postgres import parse_url

    libpq, search = parse_url(url)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {search}")
        while True:
            [(done, ended)] = conn.execute(
                "SELECT count(*) FILTER (WHERE status = 'done'), "
                "count(*) FILTER (WHERE status IN ('done', 'failed', 'cancelled')) "
                "FROM axon_turns WHERE NOT cancel_requested"
            ).fetchall()
            if ended >= expected:
                if done != ended:
                    raise RuntimeError(f"turn cpu: {ended - done} turns did not end 'done'")
                return
            await trio.sleep(0.2)


async def worker_round(turns: int, warm: int, logs: Path) -> dict[str, float]:
    """CPU seconds per turn of the worker, PostgreSQL and Redis over ``turns`` turns."""
    from benchmarks.bench_workers import (
        PG_URL,
        REDIS_URL,
        _delete_keys,
        _drop_schema,
        _schema_url,
        _worker_processes,
    )

    schema, url = _schema_url()
    prefix = f"axonbench:{uuid.uuid4().hex[:10]}:"
    pg, redis = postmaster_pid(PG_URL), redis_pid(REDIS_URL)
    try:
        await _submit_held(url, warm, turns)
        with _worker_processes(1, url, prefix, CONCURRENCY, 0.0, logs) as [proc]:
            await _release(url, schema, "w", warm)
            spy = _py_spy(proc.pid)
            counted = redis_counts(REDIS_URL)
            processes = pg_processes(pg)
            before = (process_cpu(proc.pid), tree_cpu(pg), process_cpu(redis), time.monotonic())
            await _release(url, schema, "m", warm + turns)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            after = (process_cpu(proc.pid), tree_cpu(pg), process_cpu(redis), time.monotonic())
            split = pg_parts(processes, pg_processes(pg), _listening(PG_URL))
            calls = redis_per_turn(counted, redis_counts(REDIS_URL), turns)
    finally:
        await trio.to_thread.run_sync(_drop_schema, schema)
        await _delete_keys(prefix)
    worker, postgres, redis_s, wall = (b - a for a, b in zip(before, after, strict=True))
    return {
        "worker": worker / turns,
        "postgresql": postgres / turns,
        "redis": redis_s / turns,
        "wall": wall / turns,
        **{f"redis_{k}": v for k, v in calls.items()},
        **{f"pg_{k}": v / turns for k, v in split.items()},
    }


def _py_spy(pid: int) -> subprocess.Popen[bytes] | None:
    """With ``AXON_BENCH_PYSPY=<file>`` (by hand): py-spy samples the worker's measured
    batch into that file (raw stacks; gently, without stopping the process), with the
    extra py-spy arguments in ``AXON_BENCH_PYSPY_ARGS`` (``--gil``: Python's CPU only)."""
    out = os.environ.get("AXON_BENCH_PYSPY")
    if not out:
        return None
    spy = subprocess.Popen(
        ["py-spy", "record", "-r", "200", "--nonblocking", "--format", "raw", "-o", out,
         "--pid", str(pid), *os.environ.get("AXON_BENCH_PYSPY_ARGS", "").split()],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(1.0)  # attached before the batch starts
    return spy


# -- the embedded side (a child process) ----------------------------------------------------


async def _embedded_turns(directory: str, warm: int, turns: int) -> float:
    """CPU seconds per turn of this process running ``turns`` turns, 8 at once."""
    from benchmarks.workers_agent import agent
    from runtime import Host

    async with Host.open(store=str(Path(directory) / "embedded.db")) as host:

        async def batch(tag: str, n: int) -> None:
            await run_session_batch(host, agent, tag, n, CONCURRENCY, check=True)

        await batch("w", warm)
        await _settled()
        t0 = time.process_time()
        await batch("m", turns)
        await _settled()
        return (time.process_time() - t0) / turns


async def _settled() -> None:
    """Return once the host has no work left (every task blocked for a moment).

    A batch's last turn ends before the host's observers are done with it: the log tap
    (a ``drop-oldest`` inbox, handled as the loop gets to it) lagged thousands of lines
    behind 8 turns at once, so reading the CPU right at the batch's end left about
    1 ms per turn of the turns' own log lines out of the embedded figure. The worker's
    figure has them (its CPU is read once the queue says every turn is done, polled
    every 0.2 s)."""
    import trio.testing

    await trio.testing.wait_all_tasks_blocked(cushion=0.05)


EMBEDDED_GC = ("default", "worker")
"""``--embedded-gc``: the embedded child's collector thresholds. ``default``: CPython's
(as an application embedding the host has them); ``worker`` (by hand): the worker
command's, :data:`runtime.app.commands.COMMAND_GC_THRESHOLDS`, set as that command sets
them (after the imports, before the host opens): the two sides on the same collector."""


def embedded_round(turns: int, warm: int, gc_mode: str = "default") -> float:
    """:func:`_embedded_turns` in a fresh child process (as the worker is one)."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_turn_cpu", "--embedded-child",
         "--turns", str(turns), "--warm", str(warm), "--embedded-gc", gc_mode],
        cwd=REPO, env=python_env(), capture_output=True, check=True, timeout=600,
    )  # fmt: skip
    return float(json.loads(done.stdout.decode().strip().splitlines()[-1])["cpu_per_turn"])


def _child(turns: int, warm: int, gc_mode: str = "default") -> None:
    from runtime import configure_logging

    if gc_mode == "worker":
        import gc

        from runtime.app.commands import COMMAND_GC_THRESHOLDS

        gc.set_threshold(*COMMAND_GC_THRESHOLDS)

    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        with open(Path(directory) / "axon.log.jsonl", "w", encoding="utf-8") as log:
            configure_logging("info", stream=log)
            cpu = trio.run(_embedded_turns, directory, warm, turns)
    import gc

    print(json.dumps({"cpu_per_turn": cpu, "gc_threshold": gc.get_threshold()}))


# -- the figures ----------------------------------------------------------------------------


async def measure(
    turns: int, warm: int, rounds: int, logs: Path, embedded_gc: str = "default"
) -> dict[str, Any]:
    """Alternate a worker round and an embedded round ``rounds`` times."""
    sides: dict[str, list[float]] = {
        "worker": [], "postgresql": [], "redis": [], "wall": [], "embedded": [],
        "redis_xadd": [], "redis_commands": [], "redis_pipelines": [],
    }  # fmt: skip
    for r in range(rounds):
        order = ("worker", "embedded") if r % 2 == 0 else ("embedded", "worker")
        for side in order:
            if side == "worker":
                for key, value in (await worker_round(turns, warm, logs)).items():
                    sides.setdefault(key, []).append(value)
            else:
                sides["embedded"].append(
                    await trio.to_thread.run_sync(embedded_round, turns, warm, embedded_gc)
                )
    ratios = [w / e for w, e in zip(sides["worker"], sides["embedded"], strict=True)]
    load = os.getloadavg()[0]
    return {
        "sides": sides,
        "ratios": ratios,
        "load": load,
        "turns": turns,
        "embedded_gc": embedded_gc,
    }


def figures(got: dict[str, Any]) -> list[Figure]:
    sides, ratios = got["sides"], got["ratios"]
    ms = {k: median(v) * 1e3 for k, v in sides.items()}
    span = {k: f"{min(v) * 1e3:.2f}-{max(v) * 1e3:.2f}" for k, v in sides.items()}
    calls = {k: f"{min(sides[k]):.2f}-{max(sides[k]):.2f}" for k in sides if k.startswith("redis_")}
    detail = f"{got['turns']} turns x {len(ratios)} rounds; load {got['load']:.2f}"
    if got.get("embedded_gc", "default") != "default":
        detail += f"; embedded gc {got['embedded_gc']}"
    ratio = median(ratios)
    return [
        Figure(
            key="workers.cpu.worker_over_embedded",
            title="8c. CPU per turn: worker / embedded (SQLite)",
            value=ratio,
            unit="x",
            target=f"<= {WORKER_CPU_TARGET:g}",
            passed=ratio <= WORKER_CPU_TARGET,
            detail=f"{ms['worker']:.2f} ms ({span['worker']}) vs {ms['embedded']:.2f} ms "
            f"({span['embedded']}); ratios {min(ratios):.2f}-{max(ratios):.2f}; {detail}",
            data=got,
        ),
        Figure(
            key="workers.cpu.postgresql",
            title="8c. CPU per turn: PostgreSQL (all server processes)",
            value=ms["postgresql"],
            unit="ms",
            target=f"<= {PG_CPU_TARGET_MS:g} ms",
            passed=ms["postgresql"] <= PG_CPU_TARGET_MS,
            detail=f"{span['postgresql']} ms; "
            + "".join(f"{k}: {ms[f'pg_{k}']:.2f}, " for k in PG_PARTS if f"pg_{k}" in ms)
            + detail,
        ),
        Figure(
            key="workers.cpu.redis",
            title="8c. CPU per turn: Redis",
            value=ms["redis"],
            unit="ms",
            detail=f"{span['redis']} ms; {detail}",
        ),
        Figure(
            key="workers.cpu.redis_commands",
            title="8c. Redis commands per turn (XADD and all)",
            value=median(sides["redis_commands"]),
            unit="per turn",
            detail=f"{calls['redis_commands']}; XADD {median(sides['redis_xadd']):.2f} "
            f"({calls['redis_xadd']}); {detail}",
        ),
        Figure(
            key="workers.cpu.redis_pipelines",
            title="8c. Redis round trips per turn (pipelines)",
            value=median(sides["redis_pipelines"]),
            unit="per turn",
            detail=f"{calls['redis_pipelines']}; {detail}",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--warm", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--embedded-gc",
        choices=EMBEDDED_GC,
        default="default",
        help="the embedded child's collector thresholds: CPython's (default) or the "
        "worker command's (COMMAND_GC_THRESHOLDS)",
    )
    parser.add_argument("--embedded-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.embedded_child:
        _child(args.turns, args.warm, args.embedded_gc)
        return
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        got = trio.run(
            measure, args.turns, args.warm, args.rounds, Path(directory), args.embedded_gc
        )
    for figure in figures(got):
        print(f"{figure.title}: {figure.value:.2f} {figure.unit}  [{figure.detail}]")
    sides = got["sides"]
    for key in sides:
        if key.startswith("redis_"):
            print(f"  {key}: " + ", ".join(f"{v:.2f}" for v in sides[key]) + " per turn")
        else:
            print(f"  {key}: " + ", ".join(f"{v * 1e3:.2f}" for v in sides[key]) + " ms")


if __name__ == "__main__":
    main()
