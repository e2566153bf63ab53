"""The cost of a claim behind one session's backlog (issue 18, item 5), by hand.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.bench_claim [BACKLOG ...]``. It needs a PostgreSQL:
``AXON_BENCH_PG`` (default ``postgresql://postgres@127.0.0.1/test``), or ``--own-pg`` to
start a throwaway one the way the test suite does (:mod:`tests.support.services`).

For each backlog size, in a fresh schema (dropped after): one session ("the flooder")
gets BACKLOG queued turns, inserted in one statement, and its first turn is claimed (so it
runs, the worst case: every one of its queued turns is then not claimable), the table is
analyzed, and then ROUNDS times another session submits one turn through
:meth:`TurnQueue.submit`, which is claimed (timed: ``time.perf_counter`` around
:meth:`TurnQueue.claim`) and finished. Printed: the median and p90 claim time per backlog,
and the median of a claim that finds nothing.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import uuid

import trio

PG_URL = os.environ.get("AXON_BENCH_PG", "postgresql://postgres@127.0.0.1/test")
ROUNDS = 200


async def measure(base_url: str, backlog: int) -> tuple[float, float, float]:
    """(median, p90, empty median) claim seconds behind ``backlog`` queued turns."""
    import psycopg

    from runtime.stores.postgres import PostgresStore
    from runtime.stores.turns import TurnQueue

    schema = f"axon_bench_{uuid.uuid4().hex[:12]}"
    store = await PostgresStore.open(f"{base_url}?schema={schema}")
    queue = TurnQueue(store, lease=3600.0, max_queued_per_session=None, max_queued=None)
    try:
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            conn.execute(
                """INSERT INTO axon_turns (turn_id, session_id, input)
                SELECT 'flood_' || i, 'flooder', '"x"' FROM generate_series(1, %s) AS i""",
                (backlog,),
            )
            conn.execute("ANALYZE axon_turns")
        if backlog:
            assert await queue.claim("flood-worker") is not None
        times, empty = [], []
        for i in range(ROUNDS):
            await queue.submit(f"s{i}", "hi")
            start = time.perf_counter()
            claim = await queue.claim("w")
            times.append(time.perf_counter() - start)
            assert claim is not None and claim.turn.session_id == f"s{i}", claim
            await queue.finish(claim, status="done")
            start = time.perf_counter()
            assert await queue.claim("w") is None
            empty.append(time.perf_counter() - start)
        times.sort()
        return statistics.median(times), times[int(len(times) * 0.9)], statistics.median(empty)
    finally:
        await queue.aclose()
        await store.aclose()
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main(argv: list[str]) -> int:
    url = PG_URL
    if "--own-pg" in argv:
        argv = [a for a in argv if a != "--own-pg"]
        from tests.support.services import own_postgres

        url = own_postgres().url
    sizes = [int(a) for a in argv] or [0, 50_000]
    for size in sizes:
        med, p90, empty = trio.run(measure, url, size)
        print(
            f"backlog {size:>7}: claim median {med * 1000:6.2f} ms, p90 {p90 * 1000:6.2f} ms; "
            f"empty claim median {empty * 1000:6.2f} ms",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
