"""PostgreSQL's CPU and the client's per store call of a worker's turn, by hand (issue 24 goal 3).

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.bench_pg_ops [N]`` (default 800) from the tree to measure, e.g.
``PYTHONPATH=/path/to/tree``, alternating trees round after round. It uses
:func:`benchmarks.common.bench_server_urls` (a throwaway PostgreSQL, or ``AXON_BENCH_PG``
named on purpose) and a fresh schema.

``bench_turn_cpu`` measures a whole turn, whose CPU on this shared machine swings by a
third from round to round: too much to see a change worth 0.1 ms. This runs the store
calls a one-turn session costs a worker, each kind N times in a row with nothing else
going on: N turns (N sessions) submitted and analyzed, then N claims that start one,
N claims that find nothing, N fenced saves of a new session (2 messages), N of a stored
one (2 appended), N finishes. Around each batch it reads the server's CPU as
``bench_turn_cpu`` does (the postmaster and all its children, from ``/proc``: a tick is
10 ms, so 800 calls resolve 12.5 µs) and this process's (``time.process_time``: the
store's threads included). Printed: µs per call of each, server and client.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import trio

from benchmarks.bench_turn_cpu import postmaster_pid, tree_cpu
from benchmarks.common import bench_server_urls, count_argument


async def measure(n: int) -> dict[str, tuple[float, float]]:
    """Server and client µs per call of each kind, over ``n`` calls each."""
    from actors.stores.postgres import PostgresStore
    from actors.stores.turns import TurnQueue
    from runtime.messages import UserMessage

    pg_url, _ = bench_server_urls()
    schema = "ops_" + uuid.uuid4().hex[:8]
    store = await PostgresStore.open(pg_url + ("&" if "?" in pg_url else "?") + f"schema={schema}")
    queue = TurnQueue(store, lease=60.0, max_attempts=3)
    pid = postmaster_pid(pg_url)
    got: dict[str, tuple[float, float]] = {}

    def now() -> tuple[float, float]:
        return tree_cpu(pid), time.process_time()

    def took(kind: str, since: tuple[float, float]) -> None:
        server, client = now()
        got[kind] = ((server - since[0]) / n * 1e6, (client - since[1]) / n * 1e6)

    try:
        for i in range(n):
            await queue.submit(f"s{i}", "hello")
        await store.run("analyze", lambda conn: conn.execute("ANALYZE"), transaction=False)
        since = now()
        claims: list[Any] = [await queue.claim("w1") for _ in range(n)]
        took("claim", since)
        since = now()
        for _ in range(n):
            await queue.claim("w1")
        took("claim, none", since)
        said = [UserMessage(content="hello"), UserMessage(content="x" * 200)]
        for kind, start in (("save, new session", 0), ("save, stored session", 2)):
            since = now()
            for claim in claims:
                with queue.fenced(claim):
                    await store.save(claim.turn.session_id, start, said)
            took(kind, since)
        since = now()
        for claim in claims:
            await queue.finish(claim, status="done", finish_reason="stop")
        took("finish", since)
    finally:
        await store.aclose()
    return got


def main() -> None:
    n = count_argument(800, __doc__, "calls")
    for kind, (server, client) in trio.run(measure, n).items():
        print(f"{kind:22s} server {server:7.1f} us  client {client:7.1f} us")


if __name__ == "__main__":
    main()
