"""Count the scheduler's work in a worker's turn, against the same turn embedded (issue 24 goal 3).

``python3 -m benchmarks.worker_steps [--turns K] [--concurrency C] [--no-relay] [--no-embedded]``
(another tree's code: ``PYTHONPATH=DIR python3 path/to/worker_steps.py ...``);
``--calls N`` instead times the two calls the ``wsteps`` round cut a step from, alone
(:func:`_calls`).

The worker side runs K one-turn sessions of the workers benchmark's agent
(:func:`benchmarks.workers_agent.make_agent`: a ``lookup`` step, then 20 deltas), all
submitted up front, on one in-process :class:`~runtime.app.worker.Worker` (PostgreSQL
store, a Redis relay unless ``--no-relay``; the throwaway servers of
:func:`benchmarks.common.bench_server_urls`), after a warm-up batch. The embedded side
runs the same K turns in a :class:`~runtime.Host` on SQLite, C at once. Both are counted
under :class:`benchmarks.task_steps.StepCounter` (task steps by actor or task name,
scheduler rounds) plus the thread hops (``trio.to_thread.run_sync`` calls) and the
thread-to-loop calls (``TrioToken.run_sync_soon``). Counts, not times: they do not move
with the machine's load, though the worker's (C turns at once, a poll, a lease thread)
vary a little from run to run where the embedded host's do not.

The lease thread renews every ``lease / 3`` s whatever the turns do (a thread of its own,
no task step) and is left at its default. The driver's own task (its wait for the turns
to end, its submits: the worker claims each turn as it is submitted, so the counting
starts before them) is left out, its thread hops and their returns too.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import tempfile
from pathlib import Path
from typing import Any

import trio


class _Hops:
    """Counts ``trio.to_thread.run_sync`` and ``run_sync_soon`` calls while :attr:`on`."""

    def __init__(self) -> None:
        self.on = False
        self.threads = 0
        self.soon = 0
        self.own = 0
        """The driver's own hops (its submits), and so its ``run_sync_soon`` calls."""
        self.driver: Any = None
        run_sync = trio.to_thread.run_sync
        hops = self

        async def counted(*args: Any, **kwargs: Any) -> Any:
            if hops.on:
                if trio.lowlevel.current_task() is hops.driver:
                    hops.own += 1
                else:
                    hops.threads += 1
            return await run_sync(*args, **kwargs)

        trio.to_thread.run_sync = counted  # type: ignore[assignment]
        token_type = type(trio.lowlevel.current_trio_token())
        soon = token_type.run_sync_soon

        def counted_soon(self: Any, *args: Any, **kwargs: Any) -> Any:
            if hops.on:
                hops.soon += 1
            return soon(self, *args, **kwargs)

        token_type.run_sync_soon = counted_soon  # type: ignore[method-assign,assignment]


async def _worker_side(turns: int, warm: int, concurrency: int, relay_on: bool) -> dict[str, Any]:
    import uuid

    from actors.relays import RedisRelay
    from actors.stores.postgres import PostgresStore
    from benchmarks.common import PROMPT, bench_server_urls
    from benchmarks.task_steps import StepCounter
    from benchmarks.workers_agent import make_agent
    from runtime.app.worker import Worker

    pg_url, redis_url = bench_server_urls()
    schema = f"steps_{uuid.uuid4().hex[:8]}"
    store = await PostgresStore.open(pg_url + ("&" if "?" in pg_url else "?") + f"schema={schema}")
    counter = StepCounter()
    hops = _Hops()

    class Counted(Worker):
        """Sets :attr:`reached` once :attr:`want` turns are done (no polling: a driver
        waking on a timer would add scheduler rounds to the count)."""

        want = 0
        reached = trio.Event()

        async def _run_claim(self, entry: Any, slots: trio.Semaphore) -> None:
            await super()._run_claim(entry, slots)
            if sum(self.done.values()) >= self.want:
                self.reached.set()

    worker = Counted(
        store=store, relay=None, agent=make_agent(), poll=0.5, grace=1, concurrency=concurrency
    )
    queue = worker.queue
    for i in range(warm):
        await queue.submit(f"warm-{i}", PROMPT)
    driver: list[Any] = []

    async def done(n: int) -> None:
        worker.want, worker.reached = n, trio.Event()
        if sum(worker.done.values()) < n:
            await worker.reached.wait()

    async with contextlib.AsyncExitStack() as stack:
        if relay_on:
            prefix = f"steps:{schema}:"
            relay = RedisRelay.open(redis_url, prefix=prefix)
            worker.relay = await stack.enter_async_context(relay)
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(worker.run)
        await done(warm)
        trio.lowlevel.add_instrument(counter)
        driver.append(trio.lowlevel.current_task())
        hops.driver = driver[0]
        counter.on = hops.on = True
        for i in range(turns):  # the worker claims each at once: counted from here
            await queue.submit(f"turn-{i}", PROMPT)
        await done(warm + turns)
        counter.on = hops.on = False
        worker.stop()
    await store.aclose()
    return _summary(counter, hops, driver[0].name, worker.done)


async def _embedded_side(turns: int, warm: int, concurrency: int) -> dict[str, Any]:
    from benchmarks.common import run_session_batch
    from benchmarks.task_steps import StepCounter
    from benchmarks.workers_agent import make_agent
    from runtime import Host

    agent = make_agent()
    counter = StepCounter()
    hops = _Hops()
    with tempfile.TemporaryDirectory(prefix="axon-wsteps-") as directory:
        async with Host.open(store=str(Path(directory) / "steps.db")) as host:

            async def batch(tag: str, n: int) -> None:
                await run_session_batch(host, agent, tag, n, concurrency, close=False)

            await batch("warm", warm)
            trio.lowlevel.add_instrument(counter)
            counter.on = hops.on = True
            await batch("turn", turns)
            await trio.sleep(0.2)  # the log tap's tail
            counter.on = hops.on = False
    return _summary(counter, hops, None, {"done": turns})


async def _calls(n: int) -> dict[str, float]:
    """The two calls this round cut a step from, alone: a no-op store call (a thread hop
    through :meth:`PostgresStore.run <actors.stores.postgres.PostgresStore.run>`) and a
    one-``XADD`` relay pipeline (:class:`actors.relays.resp.RespConnection`), ``n`` of
    each in turn; the process's CPU (every thread) and the caller's task steps per call."""
    import time
    import uuid

    from actors.relays.resp import RespConnection, address
    from actors.stores.postgres import PostgresStore
    from benchmarks.common import bench_server_urls
    from tests.support.steps import counted

    pg_url, redis_url = bench_server_urls()
    schema = f"calls_{uuid.uuid4().hex[:8]}"
    store = await PostgresStore.open(pg_url + ("&" if "?" in pg_url else "?") + f"schema={schema}")
    where = address(redis_url)
    assert where is not None
    conn = RespConnection(where)
    xadd = [["XADD", f"calls:{schema}", "*", "f", "v"]]
    task = trio.lowlevel.current_task()
    out: dict[str, float] = {}
    try:
        for _ in range(50):  # warm: connections, imports
            await store.run("warm", _noop, transaction=False)
            await conn.pipeline(xadd)
        for label, call in (
            ("store call", lambda: store.run("call", _noop, transaction=False)),
            ("relay pipeline", lambda: conn.pipeline(xadd)),
        ):
            with counted() as steps:
                cpu = time.process_time()
                for _ in range(n):
                    await call()
                cpu = time.process_time() - cpu
            out[f"{label}: CPU us"] = cpu / n * 1e6
            out[f"{label}: task steps"] = steps.of(task) / n
    finally:
        await conn.aclose()
        await store.aclose()
    return out


def _noop(conn: Any) -> None:
    return None


def _summary(counter: Any, hops: _Hops, driver: str | None, done: Any) -> dict[str, Any]:
    steps = collections.Counter(counter.steps)
    if driver is not None:
        steps.pop(driver, None)
        steps["<TrioToken.run_sync_soon task>"] -= hops.own  # the driver's submits' returns
    return {
        "steps": steps,
        "rounds": counter.rounds,
        "threads": hops.threads,
        "soon": hops.soon - hops.own,
        "done": dict(done),
    }


def _print(title: str, got: dict[str, Any], turns: int) -> None:
    steps = got["steps"]
    print(f"== {title}: per turn ({got['done']}) ==")
    print(f"scheduler rounds   {got['rounds'] / turns:8.2f}")
    print(f"task steps         {sum(steps.values()) / turns:8.2f}")
    print(f"thread hops        {got['threads'] / turns:8.2f}")
    print(f"run_sync_soon      {got['soon'] / turns:8.2f}")
    for label, n in steps.most_common():
        if n / turns >= 0.05:
            print(f"  {n / turns:8.2f}  {label}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.worker_steps")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--no-relay", action="store_true")
    parser.add_argument("--no-embedded", action="store_true")
    parser.add_argument(
        "--calls", type=int, default=0, help="time N store calls and N relay pipelines instead"
    )
    args = parser.parse_args()
    if args.calls:
        for key, value in trio.run(_calls, args.calls).items():
            print(f"{key:28s} {value:8.2f}")
        return
    from benchmarks.common import LogSink

    with tempfile.TemporaryDirectory(prefix="axon-wsteps-log-") as logs:
        sink = LogSink(logs)
        try:
            k = args.turns
            got = trio.run(_worker_side, k, args.warm, args.concurrency, not args.no_relay)
            _print(f"worker, {k} turns, concurrency {args.concurrency}", got, k)
            if not args.no_embedded:
                got = trio.run(_embedded_side, k, args.warm, args.concurrency)
                _print(f"embedded (SQLite), {k} turns, concurrency {args.concurrency}", got, k)
        finally:
            sink.close()


if __name__ == "__main__":
    main()
