"""A worker turn's server-side calls driven by one client in SQL, counted, by hand (``pg3``).

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.pg_turn_calls [TURNS] [ROUNDS]`` (default 1000, 1) from the tree to
measure (``PYTHONPATH`` at it), e.g. alternating trees. No worker, no Redis: one
connection calls what a worker's one-step turn calls, each turn the save of ``[user,
assistant, tool]`` with the ``saved`` mark, then the last save from message 0 that ends
it and claims the next (the claim riding on it, as a worker's loop), on a throwaway
PostgreSQL of its own with ``pg_stat_statements`` (``track=all``) and ``pg_walinspect``,
in a schema the tree's :func:`~actors.stores.postgres_schema._first_connect` creates.
Per turn, after a warm-up of 300 turns: the backend's CPU (``/proc/PID/schedstat``: this
one process, nothing else's), the statements run at every level and those planned at the
call, the WAL's records by kind (a B-tree ``INSERT_LEAF`` is an index entry written; a heap
``UPDATE`` against a ``HOT_UPDATE``) and bytes. ``AXON_PERF=FILE``: ``perf record -g`` of
the backend over the measured turns into ``FILE``. ``AXON_LIST_INDEX=1``: the schema gets
``axon_sessions_by_update`` (what the sessions list would read, :mod:`benchmarks.pg_list_index`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from tests.support import services

WARM = 300
OPTIONS = (
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
    "-c pg_stat_statements.track_planning=on"
)


def _cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def _turns(conn: Any, claim: Any, count: int) -> Any:
    """``count`` one-step turns from ``claim`` (the first's); the claim the last made."""
    from actors.stores.postgres_calls import SAVE_FUNCTION_NAME, SAVE_NEXT_FUNCTION_NAME

    roles = ["user", "assistant", "tool"]
    for _ in range(count):
        turn, session, epoch = claim

        def body(text: str) -> bytes:
            return json.dumps({"role": "assistant", "content": "x" * 200 + text}).encode()

        saved = conn.execute(
            f"SELECT o_status, o_version FROM {SAVE_FUNCTION_NAME}(%s, 0, 0, '\\x7b7d', "
            "%s::int[], %s::text[], %s::bytea[], %s, 'w', %s, true, NULL, 'axon_turns', "
            "false, NULL)",
            (session, [0, 1, 2], roles, [body("u"), body("a1"), body("t")], turn, epoch),
            prepare=True,
        ).fetchone()
        ended = conn.execute(
            f"SELECT o_status, n_turn_id, n_session_id, n_epoch FROM {SAVE_NEXT_FUNCTION_NAME}"
            "(%s, 0, %s, '\\x7b7d', %s::int[], %s::text[], %s::bytea[], %s, 'w', %s, "
            "'stop', 'axon_turns', 30)",
            (session, saved[1], [0, 1, 2], roles, [body("u"), body("a2"), body("t")], turn,
             epoch),
            prepare=True,
        ).fetchone()  # fmt: skip
        if (saved[0], ended[0]) != ("ok", "ok"):
            raise RuntimeError(f"a save was refused: {saved}, {ended}")
        claim = ended[1:]
    return claim


def measure(url: str, turns: int) -> dict[str, Any]:
    """One round: ``turns`` measured turns after :data:`WARM`, on a fresh schema."""
    import psycopg

    from actors.stores.postgres_calls import CLAIM_FUNCTION_NAME
    from actors.stores.postgres_schema import _first_connect

    schema = "calls_" + uuid.uuid4().hex[:8]
    _first_connect(url, schema)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}, public")
        if os.environ.get("AXON_LIST_INDEX"):  # the sessions list's index (pg_list_index)
            conn.execute("CREATE INDEX axon_sessions_by_update ON axon_sessions (update_seq)")
        conn.execute(
            "INSERT INTO axon_turns (turn_id, session_id, input) "
            "SELECT 't' || i, 's' || i, 'hi' FROM generate_series(1, %s) AS i",
            (WARM + turns + 1,),
        )
        conn.execute("ANALYZE axon_turns")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        claim = conn.execute(
            f"SELECT o_turn_id, o_session_id, o_epoch FROM {CLAIM_FUNCTION_NAME}"
            "('w', 30, 'axon_turns')"
        ).fetchone()
        claim = _turns(conn, claim, WARM)
        conn.execute("SELECT pg_stat_statements_reset()")
        [(start,)] = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchall()
        perf = None
        if os.environ.get("AXON_PERF"):
            perf = subprocess.Popen(
                ["perf", "record", "-e", "cpu-clock", "-F", "4999", "-g", "-p", str(pid),
                 "-o", os.environ["AXON_PERF"]],
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(0.5)
        cpu = _cpu_ns(pid)
        _turns(conn, claim, turns)
        cpu = _cpu_ns(pid) - cpu
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        [(end,)] = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchall()
        calls, plans = conn.execute(
            "SELECT sum(calls), sum(plans) FILTER (WHERE NOT toplevel) FROM pg_stat_statements "
            "WHERE query NOT LIKE '%%pg_stat_statements%%' "
            "AND query NOT LIKE '%%pg_current_wal%%'"
        ).fetchone()
        for _ in range(100):  # the WAL is read once flushed
            if conn.execute("SELECT pg_current_wal_flush_lsn() >= %s", (end,)).fetchone()[0]:
                break
            time.sleep(0.1)
        kinds = conn.execute(
            'SELECT "resource_manager/record_type", count FROM pg_get_wal_stats(%s, %s, true) '
            "WHERE count > 0 ORDER BY count DESC",
            (start, end),
        ).fetchall()
        [(size,)] = conn.execute("SELECT %s::pg_lsn - %s::pg_lsn", (end, start)).fetchall()
    return {
        "backend_us": cpu / turns / 1e3,
        "statements": calls / turns,
        "planned": (plans or 0) / turns,
        "wal_bytes": float(size) / turns,
        "wal": {kind: count / turns for kind, count in kinds},
        "load": os.getloadavg()[0],
    }


def main() -> None:
    import psycopg

    numbers = [int(a) for a in sys.argv[1:3]] + [1000, 1][len(sys.argv[1:3]) :]
    turns, rounds = numbers[:2]
    server = services.PostgresServer(options=OPTIONS)
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            conn.execute("CREATE EXTENSION pg_walinspect")
        for _ in range(rounds):
            got = measure(server.url, turns)
            wal = ", ".join(f"{k} {v:.2f}" for k, v in list(got["wal"].items())[:8])
            print(
                f"backend {got['backend_us']:.0f} µs a turn (load {got['load']:.2f}); "
                f"statements {got['statements']:.2f}, planned {got['planned']:.2f}; WAL "
                f"{got['wal_bytes']:.0f} B: {wal}",
                flush=True,
            )
    finally:
        server.close()


if __name__ == "__main__":
    main()
