"""What viewers of queued turns cost PostgreSQL (issue 18, item 5), by hand.

``python3 -m benchmarks.bench_viewers [N ...]`` (default 1 50 300). Not one of the
numbered figures. It starts a throwaway PostgreSQL and Redis the way the test suite does
(:mod:`tests.support.services`), and turns on ``log_statement = 'all'`` there (only
there: it never touches another server). For each N: a ``python -m runtime serve`` front
end with no worker, N clients each POSTing a turn (10 sessions, so every turn stays
queued) and reading its stream; 3 s after the last stream opened, the statements the
server logged over 10 s are counted (``xact_commit`` is printed too, but PostgreSQL
reports it lazily, so over 10 s it is noisy). Extra arguments after ``--`` go to
``serve``.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
import uuid

import trio

WINDOW = 10.0
SESSIONS = 10


def _clock(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%H:%M:%S.%f")[:-3]


def _start_serve(store: str, redis: str, flags: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runtime", "serve", "--port", "0", "--store", store,
         "--redis", redis, "--redis-prefix", f"bench{uuid.uuid4().hex[:6]}:", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip


def _statements(log: str, lo: str, hi: str) -> int:
    """Statements the server logged between the clock times ``lo`` and ``hi``."""
    count = 0
    with open(log) as lines:
        for entry in lines:
            words = entry.split()
            if len(words) > 4 and lo <= words[1] <= hi and "pg_stat_database" not in entry:
                count += "LOG:  execute" in entry or "LOG:  statement:" in entry
    return count


async def measure(n: int, pg: str, redis: str, log: str, flags: list[str]) -> tuple[float, float]:
    """(statements/s, commits/s) PostgreSQL saw from the front end with ``n`` viewers."""
    import httpx
    import psycopg

    def commits() -> int:
        with psycopg.connect(pg, autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            ).fetchone()
        return int(row[0]) if row else 0

    schema = f"axon_bench_{uuid.uuid4().hex[:8]}"
    serve = _start_serve(f"{pg}?schema={schema}", redis, flags)
    assert serve.stdout is not None
    try:
        line = await trio.to_thread.run_sync(serve.stdout.readline)
        base = line.split()[4].rstrip("/")
        limits = httpx.Limits(max_connections=n + 10)
        async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:
            opened = 0
            all_open = trio.Event()

            async def viewer(i: int) -> None:
                nonlocal opened
                body = {
                    "id": f"s{i % SESSIONS}",
                    "messages": [{"id": f"u{i}", "role": "user",
                                  "parts": [{"type": "text", "text": "hi"}]}],
                    "trigger": "submit-message",
                }  # fmt: skip
                async with client.stream("POST", "/api/chat", json=body) as response:
                    opened += 1
                    if opened == n:
                        all_open.set()
                    async for _ in response.aiter_raw():
                        pass

            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(viewer, i)
                    await trio.sleep(0.01)  # a burst of connects overflows the listen backlog
                await all_open.wait()
                await trio.sleep(3)
                start, c0 = time.time(), await trio.to_thread.run_sync(commits)
                await trio.sleep(WINDOW)
                c1, end = await trio.to_thread.run_sync(commits), time.time()
                nursery.cancel_scope.cancel()
        statements = _statements(log, _clock(start), _clock(end))
        return statements / (end - start), (c1 - c0) / (end - start)
    finally:
        serve.terminate()
        serve.communicate(timeout=30)
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main(argv: list[str]) -> int:
    import psycopg

    from tests.support.services import own_postgres, own_redis

    flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    counts = [int(a) for a in (argv[: argv.index("--")] if "--" in argv else argv)] or [1, 50, 300]
    server = own_postgres()
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        conn.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] '")
        conn.execute("SELECT pg_reload_conf()")
    for n in counts:
        got = trio.run(measure, n, server.url, own_redis().url, str(server.log), flags)
        print(
            f"{n:>4} viewers of queued turns: {got[0]:6.1f} statements/s "
            f"({got[1]:6.1f} commits/s by xact_commit)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
