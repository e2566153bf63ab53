"""What an index on ``axon_sessions.update_seq`` costs the saves and buys the list, by hand.

Not one of the numbered figures: ``python3 -m benchmarks.pg_list_index [SESSIONS] [SAVES]
[ROUNDS] [ACTIVE]`` (default 100000, 4000, 3, 500). On a throwaway PostgreSQL of its own (with
``pg_walinspect``), per round and per variant (``none``: this schema; ``btree``: ``CREATE
INDEX ... (update_seq)``, what stores of before have), alternated (ABBA...): a fresh
schema of ``SESSIONS`` stored sessions of 4 messages each (rows inserted directly, then
``VACUUM ANALYZE``), then ``SAVES`` saves of stored sessions through the save function
(an embedded turn's save from its start: the last two messages written again,
version-checked, meta unchanged): ``ACTIVE`` sessions spread over the table saved in turn,
after two saves each and a ``VACUUM`` (the steady state of sessions in use); with ``ACTIVE``
0, each session saved once, after 500 warm ones (a row's first update on a full page).
Per save: the backend's CPU (``/proc/PID/schedstat``), the WAL's bytes and records by kind (a B-tree
``INSERT_LEAF`` is an index entry written; heap ``UPDATE`` against ``HOT_UPDATE``), and
saves per second of one connection (wall clock, count over time). Then the first page and
a page deep in the list (``list_sessions(limit=51)``'s statements) by ``EXPLAIN
ANALYZE``: the plan's shape and its execution time, median of 5.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

from tests.support import services

WARM = 500
MESSAGES = 4


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _body(text: str) -> bytes:
    return json.dumps({"role": "user", "content": "x" * 200 + text}).encode()


def _saves(conn: Any, versions: dict[str, int], ids: list[str]) -> None:
    """One save per session of ``ids``: its last two messages written again (a turn's
    save from its start: the row count stays, so a session saved again and again does
    not grow), version-checked, meta unchanged."""
    from actors.stores.postgres_calls import SAVE_FUNCTION_NAME

    for sid in ids:
        got = conn.execute(
            f"SELECT o_status, o_version FROM {SAVE_FUNCTION_NAME}(%s, %s, %s, NULL, "
            "%s::int[], %s::text[], %s::bytea[], NULL, NULL, NULL, false, NULL, "
            "'axon_turns', false, NULL)",
            (sid, MESSAGES - 2, versions[sid], [MESSAGES - 2, MESSAGES - 1],
             ["user", "assistant"], [_body("u"), _body("a")]),
            prepare=True,
        ).fetchone()  # fmt: skip
        if got[0] != "ok":
            raise RuntimeError(f"save of {sid} refused: {got}")
        versions[sid] = got[1]


def _plan_ms(conn: Any, sql: str, args: tuple[Any, ...]) -> tuple[float, str]:
    times, shape = [], ""
    for _ in range(5):
        rows = [r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql, args)]
        times.append(float(rows[-1].split(": ")[1].split(" ms")[0]))
        shape = next(
            (r.strip() for r in rows if "Scan" in r and "axon_sessions" in r), rows[0].strip()
        )
    return statistics.median(times), shape


def measure(url: str, variant: str, sessions: int, saves: int, active: int) -> dict[str, Any]:
    import psycopg

    from actors.stores import postgres as pg
    from actors.stores.postgres_schema import _first_connect

    schema = "listix_" + uuid.uuid4().hex[:8]
    _first_connect(url, schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}, public")
        conn.execute(
            "INSERT INTO axon_sessions (session_id, meta, update_seq, version) "
            "SELECT 's' || n, '{}'::bytea, nextval('axon_update_seq'), nextval('axon_versions') "
            "FROM generate_series(1, %s) AS n",
            (sessions,),
        )
        conn.execute(
            "INSERT INTO axon_messages (session_id, idx, role, body) "
            "SELECT 's' || n, i, 'user', convert_to(repeat('x', 200), 'UTF8') "
            "FROM generate_series(1, %s) AS n, generate_series(0, %s) AS i",
            (sessions, MESSAGES - 1),
        )
        if variant == "btree":
            conn.execute("CREATE INDEX axon_sessions_by_update ON axon_sessions (update_seq)")
        conn.execute("VACUUM ANALYZE axon_sessions")
        conn.execute("VACUUM ANALYZE axon_messages")
        versions = dict(conn.execute("SELECT session_id, version FROM axon_sessions").fetchall())
        order = [f"s{n}" for n in range(1, sessions + 1)]
        if active:  # ``active`` sessions spread over the table, saved in turn again and
            # again, vacuumed once after a warm-up of two saves each (as autovacuum would)
            spread = order[:: max(1, sessions // active)][:active]
            warm = spread * 2
            picked = warm + (spread * (saves // active + 1))[:saves]
        else:  # each session saved once: the first update of a row on a full page
            step = max(1, sessions // (WARM + saves))
            picked = order[::step][: WARM + saves]
            warm = picked[:WARM]
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        _saves(conn, versions, warm)
        if active:
            conn.execute("VACUUM axon_sessions")
        hot0 = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname = 'axon_sessions' AND schemaname = %s",
            (schema,),
        ).fetchone()
        [(start,)] = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchall()
        cpu, wall = _cpu_ns(pid), time.perf_counter()
        _saves(conn, versions, picked[len(warm) :])
        wall, cpu = time.perf_counter() - wall, _cpu_ns(pid) - cpu
        [(end,)] = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchall()
        for _ in range(100):
            if conn.execute("SELECT pg_current_wal_flush_lsn() >= %s", (end,)).fetchone()[0]:
                break
            time.sleep(0.1)
        kinds = dict(
            conn.execute(
                'SELECT "resource_manager/record_type", count FROM pg_get_wal_stats(%s, %s, true) '
                "WHERE count > 0",
                (start, end),
            ).fetchall()
        )
        [(size,)] = conn.execute("SELECT %s::pg_lsn - %s::pg_lsn", (end, start)).fetchall()
        time.sleep(0.6)  # the statistics collector's flush (pgstat, 0.5 s)
        hot1 = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE relname = 'axon_sessions' AND schemaname = %s",
            (schema,),
        ).fetchone()
        first = _plan_ms(conn, pg._LIST_SQL, (51,))
        deep = _plan_ms(conn, pg._LIST_AFTER_SQL, (sessions // 2, 51))
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    n = len(picked) - len(warm)
    return {
        "variant": variant,
        "active": active,
        "saves_per_s": n / wall,
        "backend_us": cpu / n / 1e3,
        "wal_bytes": float(size) / n,
        "btree_leaf": kinds.get("Btree/INSERT_LEAF", 0) / n,
        "heap_update": kinds.get("Heap/UPDATE", 0) / n,
        "heap_hot": kinds.get("Heap/HOT_UPDATE", 0) / n,
        "hot_share": (hot1[1] - hot0[1]) / max(1, hot1[0] - hot0[0]),
        "first_page_ms": first[0],
        "first_page_plan": first[1],
        "deep_page_ms": deep[0],
        "load": os.getloadavg()[0],
    }


def main() -> None:
    import psycopg

    args = [int(a) for a in sys.argv[1:5]]
    sessions, saves, rounds, active = args + [100_000, 4000, 3, 500][len(args) :]
    server = services.PostgresServer()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_walinspect")
        for r in range(rounds):
            for variant in ("none", "btree") if r % 2 == 0 else ("btree", "none"):
                got = measure(server.url, variant, sessions, saves, active)
                print(json.dumps(got), flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
