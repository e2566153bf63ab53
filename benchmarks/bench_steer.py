"""What steering across processes adds to a worker's step (issue 21), by hand.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.bench_steer [--rounds N]``. It starts a throwaway PostgreSQL the
way the test suite does (:mod:`tests.support.services`), or uses the one ``AXON_BENCH_PG``
names on purpose; never the machine's own.

A worker now reads, at every step boundary of a turn it runs, the messages a front end
queued to steer it (:meth:`TurnQueue.take_steering`: one read of the ``axon_turns_queued``
index). Timed side by side with a lease renewal (one indexed ``UPDATE``, the smallest
write a worker makes per turn), in alternated rounds of 200 calls each, on a fresh schema
holding 200 queued turns of other sessions. Printed: per call min/median/max over rounds,
and the ratio of the two per round.
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

CALLS = 200


async def _claimed(queue: Any) -> Any:
    """A claimed turn of session ``s_bench`` behind 200 queued turns of other sessions."""
    for i in range(200):
        await queue.submit(f"s{i}", "x")
    turn = await queue.submit("s_bench", "go")
    while True:
        claim = await queue.claim("w")
        assert claim is not None
        if claim.turn.turn_id == turn.turn_id:
            return claim
        await queue.finish(claim, status="done")


async def measure(url: str, rounds: int) -> None:
    from actors.stores.postgres import PostgresStore
    from actors.stores.turns import TurnQueue

    schema = f"bench_steer_{uuid.uuid4().hex[:8]}"
    store = await PostgresStore.open(f"{url}{'&' if '?' in url else '?'}schema={schema}")
    queue = TurnQueue(store)
    try:
        claim = await _claimed(queue)
        calls = {"take_steering": queue.take_steering, "renew": queue.renew}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for n in range(rounds):
            for name in sorted(calls, reverse=n % 2 == 1):  # alternate which goes first
                start = time.perf_counter()
                for _ in range(CALLS):
                    await calls[name](claim)
                times[name].append((time.perf_counter() - start) / CALLS * 1000)
        for name, values in times.items():
            print(
                f"{name}: ms per call min {min(values):.3f} median "
                f"{statistics.median(values):.3f} max {max(values):.3f}"
            )
        ratios = [a / b for a, b in zip(times["take_steering"], times["renew"], strict=True)]
        print(
            f"take_steering / renew: min {min(ratios):.2f} median "
            f"{statistics.median(ratios):.2f} max {max(ratios):.2f}"
        )
    finally:
        import psycopg

        await queue.aclose()
        await store.aclose()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def main(argv: list[str]) -> None:
    rounds = 8
    if "--rounds" in argv:
        rounds = int(argv[argv.index("--rounds") + 1])
    url = os.environ.get("AXON_BENCH_PG") or bench_server_urls()[0]
    trio.run(measure, url, rounds)


if __name__ == "__main__":
    main(sys.argv[1:])
