"""The cost of a claim behind one session's backlog (issue 18, item 5), by hand.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.bench_claim [--rounds N] [BACKLOG ...]`` (default backlogs 0 and
50000). It starts a throwaway PostgreSQL the way the test suite does
(:mod:`tests.support.services`), or uses the one ``AXON_BENCH_PG`` names on purpose; never
the machine's own.

Each backlog gets a fresh schema (dropped after): one session ("the flooder") gets
BACKLOG queued turns, inserted in one statement, behind a turn of its own that runs (so
none of its queued turns is claimable: the worst case for a claim that walks queued
turns), and the table is analyzed. Then, round after round, *alternating the schemas*
(so a busy machine slows each the same), another session submits one turn through
:meth:`TurnQueue.submit`; its claim is timed (``time.perf_counter`` around
:meth:`TurnQueue.claim`), then a claim that finds nothing (only the backlog is left).
Printed: per backlog the median and p90 of each, and the ratio of medians to the first
backlog's.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid
from typing import Any

import trio

from benchmarks.common import bench_server_urls

PG_URL = os.environ.get("AXON_BENCH_PG")
ROUNDS = 300


def _queue(store: Any) -> Any:
    from actors.stores.turns import TurnQueue

    try:  # no caps: the backlog is what is measured
        return TurnQueue(store, lease=3600.0, max_queued_per_session=None, max_queued=None)
    except TypeError:  # a version without caps (to measure the claim before them)
        return TurnQueue(store, lease=3600.0)


async def _prepare(base_url: str, backlog: int) -> tuple[str, Any, Any]:
    import psycopg

    from actors.stores.postgres import PostgresStore

    schema = f"axon_bench_{uuid.uuid4().hex[:12]}"
    store = await PostgresStore.open(f"{base_url}?schema={schema}")
    queue = _queue(store)
    await queue.submit("flooder", "runs")
    assert await queue.claim("flood-worker") is not None
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute(
            """INSERT INTO axon_turns (turn_id, session_id, input)
            SELECT 'flood_' || i, 'flooder', '"x"' FROM generate_series(1, %s) AS i""",
            (backlog,),
        )
        conn.execute("ANALYZE axon_turns")
    return schema, store, queue


async def _one_round(queue: Any, i: int) -> tuple[float, float]:
    await queue.submit(f"s{i}", "hi")
    start = time.perf_counter()
    claim = await queue.claim("w")
    claimed = time.perf_counter() - start
    assert claim is not None and claim.turn.session_id == f"s{i}", claim
    await queue.finish(claim, status="done")
    start = time.perf_counter()
    assert await queue.claim("w") is None
    return claimed, time.perf_counter() - start


async def measure(base_url: str, backlogs: list[int], rounds: int) -> None:
    import psycopg

    prepared = [await _prepare(base_url, n) for n in backlogs]
    times: list[list[tuple[float, float]]] = [[] for _ in backlogs]
    try:
        for i in range(rounds):
            order = list(range(len(backlogs)))
            if i % 2:
                order.reverse()
            for k in order:
                times[k].append(await _one_round(prepared[k][2], i))
    finally:
        for schema, store, queue in prepared:
            await queue.aclose()
            await store.aclose()
            with psycopg.connect(base_url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    base = None
    for n, got in zip(backlogs, times, strict=True):
        claims = sorted(t for t, _ in got)
        empty = sorted(e for _, e in got)
        med, med_empty = statistics.median(claims), statistics.median(empty)
        base = base or (med, med_empty)
        print(
            f"backlog {n:>7}: claim median {med * 1000:6.2f} ms "
            f"(p90 {claims[int(len(claims) * 0.9)] * 1000:6.2f}, x{med / base[0]:.2f}); "
            f"empty claim median {med_empty * 1000:6.2f} ms "
            f"(p90 {empty[int(len(empty) * 0.9)] * 1000:6.2f}, x{med_empty / base[1]:.2f})",
            flush=True,
        )


def main(argv: list[str]) -> int:
    rounds = ROUNDS
    argv = [a for a in argv if a != "--own-pg"]  # the default now; kept for old commands
    url = PG_URL or bench_server_urls()[0]
    if "--rounds" in argv:
        at = argv.index("--rounds")
        rounds = int(argv[at + 1])
        del argv[at : at + 2]
    backlogs = [int(a) for a in argv] or [0, 50_000]
    trio.run(measure, url, backlogs, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
