"""Other sessions' submits while one submit inserts a large row (round 4, ``atk4``), by
hand: counts, not times.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.submit_lock [--mb N] [--rounds N]`` with the checkout to measure
first on ``PYTHONPATH`` (this file only needs ``actors``). It starts a throwaway
PostgreSQL the way the test suite does (:mod:`tests.support.services`), or uses the one
``AXON_BENCH_PG`` names on purpose; never the machine's own.

Each round, in a fresh schema with the queue's total cap on (``max_queued`` 10,000, the
default of ``serve``): one store submits an input of N MB (session ``big``) while
another store (a second front end's pool) submits small turns one after another, each to
a session of its own, until the big one returned. Printed per round: how many small
submits committed while the big one was in flight (before: the ones that came before it
took the queue's lock, then one waited for its commit).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

import trio

from benchmarks.common import bench_server_urls


async def _round(base_url: str, mb: int) -> int:
    import psycopg

    from actors.stores.postgres import PostgresStore
    from actors.stores.turns import TurnQueue

    schema = f"axon_bench_{uuid.uuid4().hex[:12]}"
    url = f"{base_url}?schema={schema}"
    big_store, small_store = await PostgresStore.open(url), await PostgresStore.open(url)
    big, small = TurnQueue(big_store, max_queued=10_000), TurnQueue(small_store, max_queued=10_000)
    done = trio.Event()
    during = 0
    try:

        async def submit_big() -> None:
            await big.submit("big", "x" * (mb * 1_000_000))
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(submit_big)
            i = 0
            while not done.is_set():
                await small.submit(f"s{i}", "hi")
                during += not done.is_set()
                i += 1
    finally:
        await big.aclose()
        await small.aclose()
        await big_store.aclose()
        await small_store.aclose()
        with psycopg.connect(base_url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return during


async def main(mb: int, rounds: int) -> None:
    pg, _ = bench_server_urls()
    checkout = os.path.dirname(os.path.dirname(sys.modules["actors"].__file__ or ""))
    print(f"checkout {checkout}, {mb} MB, load {os.getloadavg()[0]:.1f}")
    for r in range(rounds):
        during = await _round(pg, mb)
        print(f"round {r}: {during} small submits committed while the big one was in flight")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import actors  # noqa: F401  (the checkout on PYTHONPATH)

    trio.run(main, args.mb, args.rounds)
