"""PostgreSQL's own counters a turn, one worker against two, by hand (issue 24 goal 3, ``pg2w``).

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.pg_two_workers OUT.json [TURNS] [ROUNDS] [WARM] [FLEETS] [--waits]``
from the tree to measure (``PYTHONPATH`` at it). Figure 8's CPU-bound run
(:mod:`benchmarks.bench_workers`: real worker processes, concurrency 8, one-turn sessions
held then released at once), on a throwaway PostgreSQL of its own started with
``pg_stat_statements`` (``track=all``: the statements inside the server-side functions
too) and ``track_functions``, and a throwaway Redis. ``WARM`` turns (default none, as
figure 8) run first in the same worker processes (their connections opened and warmed),
then the counters are reset and ``TURNS`` more are released and counted. ``FLEETS``: the
numbers of workers to run, ``1,2`` unless given (``1``: one worker only).

Per turn, printed and written to ``OUT.json``, 1 worker then 2 (alternated by round): the
database's commits, buffer hits, tuples; WAL records and bytes, and the WAL's records by
kind (``pg_walinspect``: a heap ``UPDATE`` against a ``HOT_UPDATE``, a B-tree
``INSERT_LEAF`` is an index entry written); each table's inserts, updates and HOT updates;
each index's entries read and rows fetched; each statement's calls, rows, plans (planning
tracked), buffers hit and dirtied, WAL and time; the server-side functions' calls; the
CPU (``/proc/PID/schedstat``) and voluntary switches of every PostgreSQL process by role
(backends, new backends, the walwriter...). With ``--waits``, the waits of active backends
sampled every 10 ms from ``pg_stat_activity`` (100 statements a second: PostgreSQL's and
this process's CPU, so off by default). Counts, so the machine's other work moves them
little; the CPU is as noisy as any here. The workers' logs go to ``OUT.logs/``.

Also per turn, over the same window (the release to the last turn done), **where the
machine's cores went** (``split_us``, ``/proc``): each worker process (all its threads),
PostgreSQL (every process of its own server), Redis, this process (the submitter: it only
polls a ``count(*)`` every 100 ms then), and ``others``: the machine's busy time less those
(other programs); with the window's wall time, the cores each had. The submissions are
before the window, as figure 8's are: what they cost this process (a front end's part of a
turn) and PostgreSQL is ``submit_us``. And the Redis commands a turn (``INFO commandstats``
of the run's own server, by command) and its socket reads (``reads``: round trips). With
each pair, the ceiling of two workers' turns/s over one's on the machine's cores:
``cores x w1 / (c1 x t)``, ``w1`` one worker's CPU a turn, ``c1`` the cores it had, ``t``
all the run's processes' CPU a turn (one worker's, and the pair's).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from tests.support import services

SAMPLE = 0.01
"""Seconds between two looks at the active backends' waits."""


STATS_OPTIONS = (
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
    "-c pg_stat_statements.track_planning=on -c track_functions=all"
)
"""The tests' throwaway server's settings, with the statistics extensions loaded."""


def _stats_postgres() -> services.PostgresServer:
    return services.PostgresServer(options=STATS_OPTIONS)


def _rows(conn: Any, sql: str) -> list[dict[str, Any]]:
    cur = conn.execute(sql)
    names = [c.name for c in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _schedstat_ns(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except OSError:
        return 0


def _voluntary(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _role(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "gone"
    return "backend" if "127.0.0.1" in command else command.replace("postgres: ", "")[:40]


def _server_pids(postmaster: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True, text=True)
    return [postmaster, *map(int, out.stdout.split())]


class _WaitSampler(threading.Thread):
    """Counts the wait events of the active backends, looked at every :data:`SAMPLE` s."""

    def __init__(self, url: str) -> None:
        import psycopg

        super().__init__(daemon=True)
        self.conn = psycopg.connect(url, autocommit=True)
        self.stopped = threading.Event()
        self.waits: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        while not self.stopped.is_set():
            for kind, event in self.conn.execute(
                "SELECT wait_event_type, wait_event FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() "
                "AND state = 'active'"
            ).fetchall():
                self.waits[f"{kind}:{event}"] += 1
            time.sleep(SAMPLE)
        self.conn.close()


async def _wait_done(admin: Any, schema: str, n: int) -> None:
    while True:
        [(done,)] = await trio.to_thread.run_sync(
            lambda: admin.execute(
                f"SELECT count(*) FROM {schema}.axon_turns WHERE status = 'done'"
            ).fetchall()
        )
        if done >= n:
            return
        await trio.sleep(0.1)


def _busy_s() -> float:
    """Seconds the machine's cores were busy so far (``/proc/stat``: all but idle, iowait)."""
    from benchmarks import bench_turn_cpu as cpu

    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / cpu.TICK


def _split_s(workers: list[int], postmaster: int, redis: int) -> dict[str, float]:
    """CPU seconds so far of each worker, PostgreSQL's server (every process), Redis, this
    process and the machine (``busy``)."""
    from benchmarks import bench_turn_cpu as cpu

    got = {f"worker{i}": cpu.process_cpu(pid) for i, pid in enumerate(workers)}
    return {
        **got,
        "postgresql": cpu.tree_cpu(postmaster),
        "redis": cpu.process_cpu(redis),
        "submitter": cpu.process_cpu(os.getpid()),
        "busy": _busy_s(),
        "wall": time.monotonic(),
    }


def _split_per_turn(
    before: dict[str, float], after: dict[str, float], turns: int
) -> dict[str, float]:
    """µs a turn of each part between two :func:`_split_s`, ``others`` (busy less the
    run's), ``total`` (the run's) and each part's cores (``cores_*``)."""
    spent = {k: after[k] - before[k] for k in before}
    wall, busy = spent.pop("wall"), spent.pop("busy")
    ours = sum(spent.values())
    spent["others"] = busy - ours
    got = {k: v / turns * 1e6 for k, v in spent.items()}
    got["total"] = ours / turns * 1e6
    got["wall"] = wall / turns * 1e6
    got.update({f"cores_{k}": v / wall for k, v in spent.items()})
    return got


async def _measure(
    pg: services.PostgresServer,
    admin: Any,
    n: int,
    turns: int,
    warm: int,
    logs: Path,
    waits: bool,
) -> dict[str, Any]:
    """Counters a turn of ``turns`` turns run by ``n`` workers after ``warm`` others."""
    from benchmarks import bench_turn_cpu as cpu
    from benchmarks import bench_workers as bw

    schema, url = bw._schema_url()
    prefix = f"axonbench:{uuid.uuid4().hex[:10]}:"
    got: dict[str, Any] = {"workers": n, "turns": turns, "load": os.getloadavg()[0]}
    try:
        postmaster = cpu.postmaster_pid(pg.url)
        redis_pid = cpu.redis_pid(os.environ["AXON_BENCH_REDIS"])
        submitting = _split_s([], postmaster, redis_pid)
        await bw._submit(url, turns + warm)
        got["submit_us"] = _split_per_turn(
            submitting, _split_s([], postmaster, redis_pid), turns + warm
        )
        await trio.to_thread.run_sync(
            bw._sql, url, "ANALYZE axon_turns", "UPDATE axon_turns SET cancel_requested = true"
        )
        with bw._worker_processes(n, url, prefix, 8, 0.0, logs) as procs:
            if warm:
                await trio.to_thread.run_sync(
                    bw._sql, url,
                    f"UPDATE axon_turns SET cancel_requested = false WHERE seq <= {warm}",
                    f"NOTIFY axon_turns, '{schema}:go'",
                )  # fmt: skip
                await _wait_done(admin, schema, warm)
                # an idle backend flushes its statistics within 10 s: the warm batch's
                # are in before the reset, none of them after it
                await trio.sleep(11)
            for reset in ("pg_stat_statements_reset()", "pg_stat_reset()",
                          "pg_stat_reset_shared('wal')"):  # fmt: skip
                admin.execute(f"SELECT {reset}")
            await trio.sleep(1.2)
            [(lsn,)] = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchall()
            pids = _server_pids(cpu.postmaster_pid(pg.url))
            before = {pid: (_schedstat_ns(pid), _voluntary(pid)) for pid in pids}
            sampler = _WaitSampler(pg.url) if waits else None
            if sampler is not None:
                sampler.start()
            workers = [proc.pid for proc in procs]
            commands = cpu.redis_counts(os.environ["AXON_BENCH_REDIS"])
            split = _split_s(workers, cpu.postmaster_pid(pg.url), redis_pid)
            await trio.to_thread.run_sync(
                bw._sql, url,
                "UPDATE axon_turns SET cancel_requested = false WHERE cancel_requested",
                f"NOTIFY axon_turns, '{schema}:go'",
            )  # fmt: skip
            await _wait_done(admin, schema, turns + warm)
            got["split_us"] = _split_per_turn(
                split, _split_s(workers, cpu.postmaster_pid(pg.url), redis_pid), turns
            )
            counted = cpu.redis_counts(os.environ["AXON_BENCH_REDIS"])
            got["redis_calls"] = {
                k: (v - commands.get(k, 0)) / turns
                for k, v in counted.items()
                if v != commands.get(k, 0)
            }
            [(end,)] = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchall()
            if sampler is not None:
                sampler.stopped.set()
                sampler.join()
            roles: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0])
            for pid in _server_pids(cpu.postmaster_pid(pg.url)):
                ns0, vol0 = before.get(pid, (0, 0))
                role = _role(pid) + ("" if pid in before else " (new)")
                roles[role][0] += (_schedstat_ns(pid) - ns0) / turns / 1e3
                roles[role][1] += (_voluntary(pid) - vol0) / turns
                roles[role][2] += 1
            got["cpu_us_switches_processes"] = {
                k: [round(x, 2) for x in v] for k, v in roles.items()
            }
            got["waits_sampled"] = dict(sampler.waits) if sampler is not None else None
            got["statements"] = _rows(
                admin,
                "SELECT calls, rows, plans, shared_blks_hit AS hit, shared_blks_dirtied AS "
                "dirtied, wal_records, wal_bytes::bigint, round(total_exec_time::numeric, 1) "
                "AS exec_ms, round(total_plan_time::numeric, 1) AS plan_ms, toplevel, "
                "left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query "
                "FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 40",
            )
            # The WAL the batch wrote, by record kind (Heap UPDATE against HOT_UPDATE,
            # Btree INSERT_LEAF: an index entry written), from pg_walinspect, once flushed.
            for _ in range(100):
                if admin.execute(f"SELECT pg_current_wal_flush_lsn() >= '{end}'").fetchone()[0]:
                    break
                await trio.sleep(0.1)
            got["wal_kinds"] = _rows(
                admin,
                'SELECT "resource_manager/record_type" AS kind, count, combined_size '
                f"FROM pg_get_wal_stats('{lsn}', '{end}', true) "
                "WHERE count > 0 ORDER BY count DESC",
            )
        await trio.sleep(1.5)  # the backends' last statistics flushed as they exit
        got["database"] = _rows(
            admin,
            "SELECT xact_commit, xact_rollback, blks_hit, blks_read, tup_returned, tup_fetched, "
            "tup_inserted, tup_updated, tup_deleted, deadlocks FROM pg_stat_database "
            "WHERE datname = current_database()",
        )[0]
        got["wal"] = _rows(
            admin, "SELECT wal_records, wal_fpi, wal_bytes::bigint FROM pg_stat_wal"
        )[0]
        got["tables"] = _rows(
            admin,
            "SELECT relname, idx_tup_fetch, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
            "FROM pg_stat_user_tables "
            f"WHERE schemaname = '{schema}'",
        )
        got["indexes"] = _rows(
            admin,
            "SELECT indexrelname, idx_scan, idx_tup_read, idx_tup_fetch FROM "
            f"pg_stat_user_indexes WHERE schemaname = '{schema}' ORDER BY idx_tup_read DESC",
        )
        got["functions"] = _rows(
            admin,
            f"SELECT funcname, calls FROM pg_stat_user_functions WHERE schemaname = '{schema}'",
        )
    finally:
        await trio.to_thread.run_sync(bw._drop_schema, schema)
        await bw._delete_keys(prefix)
    return got


def _summary(got: dict[str, Any]) -> str:
    turns = got["turns"]
    db, index = got["database"], {i["indexrelname"]: i for i in got["indexes"]}
    table = next(t for t in got["tables"] if t["relname"] == "axon_turns")
    read = {k.removeprefix("axon_turns_"): v["idx_tup_read"] / turns for k, v in index.items()}
    cpu = got["cpu_us_switches_processes"]
    return (
        f"{got['workers']} worker(s), load {got['load']:.2f}: commits "
        f"{db['xact_commit'] / turns:.2f}, buffer hits {db['blks_hit'] / turns:.0f}, tuples "
        f"returned {db['tup_returned'] / turns:.0f} fetched {db['tup_fetched'] / turns:.0f}, "
        f"WAL records {got['wal']['wal_records'] / turns:.1f}; index entries read: leases "
        f"{read.get('leases', 0):.1f}, one_running {read.get('one_running', 0):.1f}, heads "
        f"{read.get('heads', 0):.1f}; axon_turns rows fetched {table['idx_tup_fetch'] / turns:.1f}"
        f"\n    WAL bytes {got['wal']['wal_bytes'] / turns:.0f}; updates (HOT) a turn: "
        + ", ".join(
            f"{t['relname']} {t['n_tup_upd'] / turns:.2f} ({t['n_tup_hot_upd'] / turns:.2f})"
            for t in got["tables"]
        )
        + "; WAL records a turn: "
        + ", ".join(f"{k['kind']} {k['count'] / turns:.2f}" for k in got["wal_kinds"][:8])
        + f"\n    CPU µs, voluntary switches a turn, processes: {cpu}"
        f"\n    waits sampled: {got['waits_sampled']}" + _split_summary(got)
    )


def _statement_calls(got: dict[str, Any]) -> float:
    """Top-level statements a turn (the functions' inner ones not counted)."""
    return sum(s["calls"] for s in got["statements"] if s["toplevel"]) / got["turns"]


_PARTS = ("worker", "postgresql", "redis", "submitter")
"""The run's own processes in ``split_us`` (the workers summed); ``others`` is not one."""


def _parts(split: dict[str, float], prefix: str = "") -> dict[str, float]:
    """``split``'s µs a turn (or with ``prefix`` ``"cores_"`` its cores) by part, the
    workers summed, with ``others`` and ``total`` (the run's processes)."""
    got = dict.fromkeys((*_PARTS, "others"), 0.0)
    for key, value in split.items():
        part = key.removeprefix(prefix).rstrip("0123456789")  # worker0, worker1: worker
        if key.startswith(prefix) and part in got and (prefix or not key.startswith("cores_")):
            got[part] += value
    got["total"] = sum(got[p] for p in _PARTS)
    return got


def _split_summary(got: dict[str, Any]) -> str:
    us, cores = _parts(got["split_us"]), _parts(got["split_us"], "cores_")
    submit = _parts(got["submit_us"])
    calls = got["redis_calls"]
    return (
        "\n    µs a turn (cores): "
        + ", ".join(f"{p} {us[p]:.0f} ({cores[p]:.2f})" for p in us)
        + f", wall {got['split_us']['wall']:.0f}"
        + f"; outside the workers / the workers {(us['total'] - us['worker']) / us['worker']:.3f}"
        + f"\n    submitting, µs a turn: this process {submit['submitter']:.0f}, PostgreSQL "
        f"{submit['postgresql']:.0f}"
        + f"\n    top-level statements a turn {_statement_calls(got):.2f}; Redis a turn: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(calls.items()))
    )


def _ceiling(one: dict[str, Any], two: dict[str, Any]) -> str:
    """Two workers' turns/s over one's, taken apart. A run's turns/s is the cores its
    processes had (``u``) over their CPU a turn (``t``), so 2 / 1 is exactly
    ``(u2 / u1) x (t1 / t2)``: the cores the second worker's run found, times how much
    dearer a turn got. At best ``u2`` is the machine's cores and ``t2`` is ``t1``: the
    ceiling ``cores / u1``; ``u1`` is ``c1 x t1 / w1`` (``c1`` the cores the one worker had,
    ``w1`` its CPU a turn), ``cores / (1 + n / w1)`` at a full core (``n``: the CPU a turn
    outside the workers)."""
    cpus = os.cpu_count() or 1
    a, b = _parts(one["split_us"]), _parts(two["split_us"])
    u1, u2 = _parts(one["split_us"], "cores_")["total"], _parts(two["split_us"], "cores_")["total"]
    outside = (a["total"] - a["worker"]) / a["worker"]
    return (
        f"2 / 1 measured {one['split_us']['wall'] / two['split_us']['wall']:.2f}x = cores "
        f"{u2:.2f} / {u1:.2f} x CPU a turn {a['total']:.0f} / {b['total']:.0f} µs "
        f"({u2 / u1:.2f} x {a['total'] / b['total']:.2f}); ceiling {cpus} / {u1:.2f} = "
        f"{cpus / u1:.2f}x; at a full core for one worker {cpus / (1 + outside):.2f}x "
        f"(outside the workers / the workers {outside:.3f})"
    )


async def _main(
    out: str, turns: int, rounds: int, warm: int, fleets: tuple[int, ...], waits: bool
) -> None:
    import psycopg

    pg, redis = _stats_postgres(), services.RedisServer()
    try:
        os.environ["AXON_BENCH_PG"], os.environ["AXON_BENCH_REDIS"] = pg.url, redis.url
        admin = psycopg.connect(pg.url, autocommit=True)
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        logs = Path(out).with_suffix(".logs")
        logs.mkdir(exist_ok=True)
        results = []
        for r in range(rounds):
            for n in fleets if r % 2 == 0 else fleets[::-1]:
                results.append(await _measure(pg, admin, n, turns, warm, logs, waits))
                print(_summary(results[-1]), flush=True)
                pair = {g["workers"]: g for g in results[-2:]}
                if len(results) % 2 == 0 and set(pair) == {1, 2}:
                    print("  " + _ceiling(pair[1], pair[2]), flush=True)
                text = json.dumps(results, indent=1, default=str)
                await trio.to_thread.run_sync(Path(out).write_text, text)
        admin.close()
    finally:
        pg.close()
        redis.close()


def main() -> None:
    args = sys.argv[1:]
    if not args:
        sys.exit(
            "usage: python3 -m benchmarks.pg_two_workers OUT.json [TURNS] [ROUNDS] [WARM] "
            "[FLEETS] [--waits]"
        )
    waits = "--waits" in args
    args = [a for a in args if a != "--waits"]
    numbers = [int(a) for a in args[1:4]] + [800, 2, 0][len(args[1:4]) :]
    fleets = tuple(int(n) for n in args[4].split(",")) if len(args) > 4 else (1, 2)
    trio.run(_main, args[0], numbers[0], numbers[1], numbers[2], fleets, waits)


if __name__ == "__main__":
    main()
