"""PostgreSQL's own counters a turn, one worker against two, by hand (issue 24 goal 3, ``pg2w``).

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.pg_two_workers OUT.json [TURNS] [ROUNDS] [WARM] [FLEETS]`` from the tree to
measure (``PYTHONPATH`` at it). Figure 8's CPU-bound run (:mod:`benchmarks.bench_workers`:
real worker processes, concurrency 8, one-turn sessions held then released at once), on a
throwaway PostgreSQL of its own started with ``pg_stat_statements`` (``track=all``: the
statements inside the server-side functions too) and ``track_functions``, and a throwaway
Redis. ``WARM`` turns (default none, as figure 8) run first in the same worker processes
(their connections opened and warmed), then the counters are reset and ``TURNS`` more are
released and counted. ``FLEETS``: the numbers of workers to run, ``1,2`` unless given
(``1``: one worker only).

Per turn, printed and written to ``OUT.json``, 1 worker then 2 (alternated by round): the
database's commits, buffer hits, tuples; WAL records and bytes, and the WAL's records by
kind (``pg_walinspect``: a heap ``UPDATE`` against a ``HOT_UPDATE``, a B-tree
``INSERT_LEAF`` is an index entry written); each table's inserts, updates and HOT updates;
each index's entries read and rows fetched; each statement's calls, rows, plans (planning
tracked), buffers hit and dirtied, WAL and time; the server-side functions' calls; the
CPU (``/proc/PID/schedstat``) and voluntary switches of every PostgreSQL process by role
(backends, new backends, the walwriter...); the waits of active backends sampled every 10
ms from ``pg_stat_activity``. Counts, so the machine's other work moves them little; the
CPU is as noisy as any here. The workers' logs go to ``OUT.logs/``.
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


async def _measure(
    pg: services.PostgresServer, admin: Any, n: int, turns: int, warm: int, logs: Path
) -> dict[str, Any]:
    """Counters a turn of ``turns`` turns run by ``n`` workers after ``warm`` others."""
    from benchmarks import bench_turn_cpu as cpu
    from benchmarks import bench_workers as bw

    schema, url = bw._schema_url()
    prefix = f"axonbench:{uuid.uuid4().hex[:10]}:"
    got: dict[str, Any] = {"workers": n, "turns": turns, "load": os.getloadavg()[0]}
    try:
        await bw._submit(url, turns + warm)
        await trio.to_thread.run_sync(
            bw._sql, url, "ANALYZE axon_turns", "UPDATE axon_turns SET cancel_requested = true"
        )
        with bw._worker_processes(n, url, prefix, 8, 0.0, logs):
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
            sampler = _WaitSampler(pg.url)
            sampler.start()
            await trio.to_thread.run_sync(
                bw._sql, url,
                "UPDATE axon_turns SET cancel_requested = false WHERE cancel_requested",
                f"NOTIFY axon_turns, '{schema}:go'",
            )  # fmt: skip
            await _wait_done(admin, schema, turns + warm)
            [(end,)] = admin.execute("SELECT pg_current_wal_insert_lsn()").fetchall()
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
            got["waits_sampled"] = dict(sampler.waits)
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
        f"\n    waits sampled: {got['waits_sampled']}"
    )


async def _main(out: str, turns: int, rounds: int, warm: int, fleets: tuple[int, ...]) -> None:
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
                results.append(await _measure(pg, admin, n, turns, warm, logs))
                print(_summary(results[-1]), flush=True)
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
            "usage: python3 -m benchmarks.pg_two_workers OUT.json [TURNS] [ROUNDS] [WARM] [FLEETS]"
        )
    numbers = [int(a) for a in args[1:4]] + [800, 2, 0][len(args[1:4]) :]
    fleets = tuple(int(n) for n in args[4].split(",")) if len(args) > 4 else (1, 2)
    trio.run(_main, args[0], *numbers[:3], fleets)


if __name__ == "__main__":
    main()
