"""What a worker's approved turn does more than a plain one, counted (issue 21).

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.approval_worker_counts [ROUNDS]`` (default 7) from the tree to
measure (``PYTHONPATH`` at it). One :class:`~runtime.app.worker.Worker` in process as
:mod:`benchmarks.bench_approval`'s workers part runs it (concurrency 1; the claim loop's
idle poll at 30 s, so that only the flows' own work is counted), on a throwaway
PostgreSQL started with ``pg_stat_statements`` (``track=all``: the statements inside the
server-side functions too) and a throwaway Redis. Each round runs a **plain** turn (submit
to ``done``) and an **approved** one in three windows: **suspend** (submit to
``awaiting-input``), **decide** (the client's ``store.load``, not counted, then
``TurnQueue.decide`` on that read where the queue takes it, ``known``), and **resume**
(from the decision to ``done``, the decision's own calls taken out; PostgreSQL's and
Redis's counters are by statement, not by caller: the decision's statements are in this
window's).

Counted per window, printed as medians of the rounds after two of warm-up: the store's
calls (``load``, ``save``, ``save_decision``, ``run``: a thread's), the statements sent
from the event loop (:class:`~actors.stores.postgres_lane.LoopLane`, by name), thread
hops (``trio.to_thread.run_sync``), sessions and messages decoded, relay writers opened
and stream tails read, Redis pipelines (the writers' own RESP connection) and coredis
calls, Redis commands (``INFO commandstats``), PostgreSQL's statements (top level, and
inside functions), ``BEGIN`` s, the claim function's calls and the functions' NOTIFYs,
and the task steps of every task (a :class:`trio.abc.Instrument`; these move with
scheduling, the rest do not). The decide window counts only the calling task's work.
Compare trees side by side (two runs, one per tree).
"""

from __future__ import annotations

import collections
import inspect
import itertools
import statistics
from collections.abc import Callable
from typing import Any

import trio

from benchmarks.common import count_argument

WARM = 2
EXPIRY = "UPDATE axon_turns SET expires_at"
"""The workers' look for expired waits (every poll), not a flow's."""


class _Steps:
    """Task steps per task name while on (a :class:`trio.abc.Instrument`)."""

    def __init__(self) -> None:
        self.by: collections.Counter[str] = collections.Counter()
        self.on = False

    def before_task_step(self, task: Any) -> None:
        if self.on:
            self.by[task.name.rsplit(".", 1)[-1][:40]] += 1


class _Counts:
    """The wrapped calls' counts, all of them and the calling task's alone."""

    def __init__(self) -> None:
        self.all: collections.Counter[str] = collections.Counter()
        self.mine: collections.Counter[str] = collections.Counter()
        self.main: Any = None

    def bump(self, key: str) -> None:
        self.all[key] += 1
        if trio.lowlevel.current_task() is self.main:
            self.mine[key] += 1


def _wrap(owner: Any, name: str, count: Callable[[], None], *, sync: bool = False) -> None:
    fn = getattr(owner, name)
    if sync:

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            count()
            return fn(*args, **kwargs)
    else:

        async def wrapped(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
            count()
            return await fn(*args, **kwargs)

    setattr(owner, name, wrapped)


def _instrument(counts: _Counts) -> Callable[..., Any]:
    """Wrap what is counted; the unwrapped ``trio.to_thread.run_sync`` (the probe's own)."""
    import coredis

    import actors.stores.postgres as pg
    from actors.relays import RedisRelay, redis_writer, resp
    from actors.stores.postgres_lane import LoopLane

    def bump(key: str) -> Callable[[], None]:
        return lambda: counts.bump(key)

    for name in ("load", "save", "save_decision", "run"):
        _wrap(pg.PostgresStore, name, bump(f"store.{name}"))
    _wrap(pg.PostgresStore, "record", bump("sessions decoded"), sync=True)
    _wrap(pg, "decode_message", bump("messages decoded"), sync=True)
    call = LoopLane.call

    async def lane_call(self: Any, name: bytes, sql: bytes, *args: Any) -> Any:
        counts.bump(f"loop {name.decode()}")
        return await call(self, name, sql, *args)

    LoopLane.call = lane_call  # type: ignore[method-assign]
    run_sync = trio.to_thread.run_sync
    _wrap(trio.to_thread, "run_sync", bump("thread hops"))
    _wrap(resp.RespConnection, "pipeline", bump("redis pipelines (writers)"))
    _wrap(coredis.Redis, "execute_command", bump("redis calls (coredis)"))
    _wrap(RedisRelay, "writer", bump("relay writers opened"), sync=True)
    # (a tree before branch ``apwk`` read every tail in ``_read_tail``, through coredis)
    tail_read = "_tail_read" if hasattr(redis_writer.RedisRelayWriter, "_tail_read") else None
    if tail_read is None:
        _wrap(redis_writer.RedisRelayWriter, "_read_tail", bump("relay tails read"))
    else:
        _wrap(redis_writer.RedisRelayWriter, tail_read, bump("relay tails read"), sync=True)
    return run_sync


async def _run(pg_url: str, redis_url: str, admin: Any, rounds: int) -> dict[str, list[Any]]:
    from actors.relays import RedisRelay
    from actors.relays import resp as resp_module
    from actors.stores import open_store, turn_queue
    from benchmarks.bench_approval import PROMPT, _worker_agents
    from runtime.app.worker import Worker
    from runtime.approval import Decision, pending_calls

    counts, steps = _Counts(), _Steps()
    counts.main = trio.lowlevel.current_task()
    trio.lowlevel.add_instrument(steps)  # type: ignore[arg-type]
    pipeline = resp_module.RespConnection.pipeline
    run_sync = _instrument(counts)
    redis = resp_module.RespConnection(resp_module.address(redis_url))  # type: ignore[arg-type]

    async def redis_command(*command: Any) -> Any:
        return (await pipeline(redis, [command]))[0]  # type: ignore[arg-type]

    schema = "axon_counts"
    store = await open_store(f"{pg_url}?schema={schema}")
    queue = turn_queue(store)
    agents = _worker_agents()
    tags = itertools.count()
    looker = admin.__class__.connect(pg_url, autocommit=True)
    looker.execute(f"SET search_path TO {schema}")

    async def until(turn_id: str, status: str) -> None:
        def look() -> str:  # a statement of its own text: left out of the counts
            q = "SELECT status, 'probe' AS probe FROM axon_turns WHERE turn_id = %s"
            return str(looker.execute(q, (turn_id,)).fetchone()[0])

        while await run_sync(look) != status:  # noqa: ASYNC110 - a row polled, as figure 10
            await trio.sleep(0.001)

    async def start() -> None:
        await run_sync(lambda: admin.execute("SELECT pg_stat_statements_reset()"))
        await redis_command("CONFIG", "RESETSTAT")
        counts.all.clear()
        counts.mine.clear()
        steps.by.clear()
        steps.on = True

    async def stop() -> dict[str, Any]:
        await trio.sleep(0.05)  # what the flow left queued (the relay's last flush)
        steps.on = False
        got = dict(counts.all)
        rows = await run_sync(
            lambda: admin.execute(
                "SELECT toplevel, calls, query FROM pg_stat_statements "
                "WHERE query NOT LIKE '%%probe%%' AND query NOT LIKE '%%pg_stat_statements%%'"
            ).fetchall()
        )
        rows = [(top, n, " ".join(q.split())) for top, n, q in rows if EXPIRY not in q]
        info = (await redis_command("INFO", "commandstats")).decode()
        commands = {
            k.removeprefix("cmdstat_"): int(v.split(",")[0].split("=")[1])
            for k, v in (line.split(":", 1) for line in info.splitlines() if ":" in line)
            if k.startswith("cmdstat_") and not k.startswith(("cmdstat_config", "cmdstat_info"))
        }
        got.update(
            {
                "task steps": sum(steps.by.values()),
                "pg statements (top level)": sum(n for top, n, _ in rows if top),
                "pg statements (in functions)": sum(n for top, n, _ in rows if not top),
                "pg BEGIN": sum(n for top, n, q in rows if top and q.startswith("BEGIN")),
                "pg claim function": sum(n for top, n, q in rows if top and "axon_claim" in q),
                "pg NOTIFY in functions": sum(
                    n for top, n, q in rows if not top and q.startswith("SELECT pg_notify(")
                ),
                "redis commands": sum(commands.values()),
                **{f"redis {k}": v for k, v in commands.items()},
            }
        )
        return got

    results: dict[str, list[Any]] = {"plain": [], "suspend": [], "decide": [], "resume": []}
    try:
        async with (
            RedisRelay.open(redis_url, prefix=f"axon-counts-{schema}:") as relay,
            trio.open_nursery() as nursery,
        ):
            worker = Worker(store=store, relay=relay, agent=agents, poll=30.0, concurrency=1)
            await nursery.start(worker.run)
            takes_known = "known" in inspect.signature(queue.decide).parameters
            for r in range(rounds + WARM):
                await start()
                turn = await queue.submit(f"plain-{next(tags)}", PROMPT)
                await until(turn.turn_id, "done")
                plain = await stop()
                session_id = f"ask-{next(tags)}"
                await start()
                turn = await queue.submit(session_id, PROMPT)
                await until(turn.turn_id, "awaiting-input")
                suspend = await stop()
                record = await store.load(session_id)
                (call,) = pending_calls(record.messages)  # type: ignore[union-attr]
                tools = {t.name: t for t in agents(session_id).tools}
                extra = {"known": record} if takes_known else {}
                await start()
                await queue.decide(
                    session_id, call.approval_id, Decision(approved=True), tools, **extra
                )
                decide = dict(counts.mine)
                await until(turn.turn_id, "done")
                resume = await stop()
                for key, n in decide.items():  # the worker's alone (PostgreSQL's: both)
                    resume[key] -= n
                if r >= WARM:
                    for name, got in (
                        ("plain", plain),
                        ("suspend", suspend),
                        ("decide", decide),
                        ("resume", resume),
                    ):
                        results[name].append(got)
            worker.stop()
    finally:
        await queue.aclose()
        await store.aclose()
        looker.close()
    return results


def _print(results: dict[str, list[Any]]) -> None:
    keys = sorted({k for runs in results.values() for got in runs for k in got})
    print(f"{'':34s}" + "".join(f"{name:>10s}" for name in results))
    for key in keys:
        row = [statistics.median([got.get(key, 0) for got in runs]) for runs in results.values()]
        print(f"{key:34s}" + "".join(f"{v:>10g}" for v in row))


def main() -> None:
    import psycopg

    from benchmarks.pg_two_workers import _stats_postgres
    from tests.support import services

    rounds = count_argument(7, __doc__)
    pg, redis = _stats_postgres(), services.RedisServer()
    try:
        admin = psycopg.connect(pg.url, autocommit=True)
        admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        _print(trio.run(_run, pg.url, redis.url, admin, rounds))
        admin.close()
    finally:
        pg.close()
        redis.close()


if __name__ == "__main__":
    main()
