"""The PostgreSQL statements and relay tail reads a worker spends per turn, counted, by hand.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.count_turn_statements [TURNS]`` (default 40) from the tree to
count, e.g. ``PYTHONPATH=/path/to/tree``. It uses :func:`benchmarks.common.bench_server_urls`
(throwaway servers, or ``AXON_BENCH_PG`` / ``AXON_BENCH_REDIS`` named on purpose).

TURNS one-session turns of two steps each (a tool call, then the answer: one step
boundary), nobody steering, are submitted up front; one in-process worker with a relay
runs them while every ``psycopg`` cursor statement is counted, and every statement the
store sends from the event loop (``LoopLane``; ``BEGIN``/``COMMIT``, which psycopg sends
without a cursor, are not), and so are the relay's ``XREVRANGE`` s. A count,
not a timing: the same on a loaded machine. Printed: per turn, the total and each
statement's share (its first 60 characters).
"""

from __future__ import annotations

import collections
from typing import Any

import psycopg
import trio

from benchmarks.common import bench_server_urls, count_argument

_POLL = "/*poll*/"
"""Marks this script's own polling statement, which is not counted."""


class _Counter:
    """Counts cursor statements while :attr:`active` (psycopg's class methods wrapped)."""

    def __init__(self) -> None:
        self.active = False
        self.counts: collections.Counter[str] = collections.Counter()
        execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
        counter = self

        def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            counter.saw(query)
            return execute(self, query, *args, **kwargs)

        def counted_many(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            counter.saw(query)
            return executemany(self, query, *args, **kwargs)

        psycopg.Cursor.execute = counted  # type: ignore[method-assign,assignment]
        psycopg.Cursor.executemany = counted_many  # type: ignore[method-assign]
        # The statements the store sends from the event loop, without a cursor (its saves).
        try:
            from actors.stores.postgres_lane import LoopLane
        except ImportError:  # a tree before the store's split, or before the lane
            try:
                from actors.stores.postgres import LoopLane
            except ImportError:
                return
        call = LoopLane.call

        async def counted_call(self: Any, name: bytes, sql: bytes, *args: Any) -> Any:
            counter.saw(sql.decode())
            return await call(self, name, sql, *args)

        LoopLane.call = counted_call  # type: ignore[method-assign]

    def saw(self, query: Any) -> None:
        text = query if isinstance(query, str) else repr(query)
        if self.active and _POLL not in text:
            self.counts[" ".join(text.split())[:60]] += 1


def _respond(request: Any) -> list[Any]:
    """Step 0 calls ``look``, step 1 answers: one step boundary per turn."""
    from actors.providers.scripted import tool_call
    from runtime.messages import ToolMessage

    if isinstance(request.messages[-1], ToolMessage):
        return ["done"]
    return [*tool_call("look", {}, tool_call_id="L")]


def _look() -> str:
    """Look around (the benchmark's one tool)."""
    return "nothing here"


async def count(turns: int) -> dict[str, Any]:
    """Run ``turns`` turns on one worker; the statements and tail reads they took."""
    from actors.providers.scripted import ScriptedProvider
    from actors.relays import RedisRelay
    from actors.stores.postgres import PostgresStore
    from runtime import Agent
    from runtime.app.worker import Worker
    from runtime.tools import tool

    pg_url, redis_url = bench_server_urls()
    counter = _Counter()
    store = await PostgresStore.open(pg_url + ("&" if "?" in pg_url else "?") + "schema=count")
    agent = Agent(provider=ScriptedProvider(responder=_respond), tools=[tool(_look, name="look")])
    worker = Worker(store=store, relay=None, agent=agent, poll=0.1, grace=1)
    queue = worker.queue
    ids = [(await queue.submit(f"count-{i}", "hi")).turn_id for i in range(turns)]
    tails = [0]
    async with RedisRelay.open(redis_url, prefix="count:") as relay, trio.open_nursery() as n:
        xrevrange = relay.client.xrevrange

        async def counted(*args: Any, **kwargs: Any) -> Any:
            tails[0] += 1
            return await xrevrange(*args, **kwargs)

        relay.client.xrevrange = counted
        worker.relay = relay
        counter.active = True
        await n.start(worker.run)
        while True:  # polled: the worker's own wake-ups are what is counted
            if not await _left(store):
                break
            await trio.sleep(0.05)
        counter.active = False
        worker.stop()
    reasons = collections.Counter([(await queue.get_status(t)).finish_reason for t in ids])  # type: ignore[union-attr]
    await store.aclose()
    return {"counts": counter.counts, "tails": tails[0], "reasons": reasons}


async def _left(store: Any) -> int:
    row = await store.run(
        "poll",
        lambda conn: conn.execute(
            f"SELECT {_POLL} count(*) FROM axon_turns WHERE status <> 'done'"
        ).fetchone(),
        transaction=False,
    )
    return int(row[0])


def main() -> None:
    turns = count_argument(40, __doc__, "turns")
    got = trio.run(count, turns)
    counts = got["counts"]
    print(f"{turns} turns, finish reasons {dict(got['reasons'])}")
    print(f"statements per turn {sum(counts.values()) / turns:.2f}")
    print(f"relay XREVRANGE per turn {got['tails'] / turns:.2f}")
    for text, n in counts.most_common():
        print(f"  {n / turns:6.2f}  {text}")


if __name__ == "__main__":
    main()
