"""10. A turn that waits for approval, in the worker deployment (issue 21).

What suspending and resuming costs, against the same turn without approval, on one
worker in process (a :class:`~runtime.app.worker.Worker` on PostgreSQL with the Redis
relay, as ``python -m runtime worker`` runs it):

* **plain**: a turn whose model calls ``act`` (no approval), then answers in 50 deltas.
  Timed from the submit to the queue's ``done``.
* **approved**: the same turn, ``act`` needing approval. Timed from the submit to the row
  ``awaiting-input`` (the step committed, the row and relay stream paused), plus from the
  decision's return (:meth:`~runtime.turn_queue.TurnQueue.decide`: the turn put back) to
  ``done`` (a claim, the session reloaded, the tool run, the answer): the turn's time
  without the person's.
* **decide**: what the decision itself takes (the store read, the compare-and-set save
  with the row's check and requeue, in one transaction).
* **a step commit**: a ``PostgresStore.save`` of one assistant and one tool message
  with its version check, the unit the issue measures the overhead in.

Sides alternate per round; the figures are medians. The client looks at the turn's row
every millisecond (both sides alike). Needs PostgreSQL and Redis (``AXON_BENCH_PG``,
``AXON_BENCH_REDIS``); skipped, saying why, otherwise.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import trio

from benchmarks.bench_workers import (
    REDIS_URL,
    _drop_schema,
    _schema_url,
    pg_unavailable,
    redis_unavailable,
)
from benchmarks.common import PROMPT, Figure, Sizes, alternate, median, now

WORDS = 50


def _agents() -> Callable[[str], Any]:
    """The agent of a session: ``act`` needs approval in the ``ask-`` sessions only."""
    from actors.providers.scripted import ScriptedProvider, current_step, tool_call
    from runtime.agent import Agent
    from runtime.chunks import TextChunk
    from runtime.tools import tool

    answer = [TextChunk(text=f" w{i}") for i in range(WORDS)]

    def respond(request: Any) -> list[Any]:
        if current_step(request.messages) == 0:
            return tool_call("act", {"n": 1}, tool_call_id="call_act")
        return answer

    async def act(n: int) -> str:
        """Do it."""
        return f"done {n}"

    plain = Agent(
        name="plain",
        provider=ScriptedProvider(responder=respond, keep_requests=0),
        tools=[tool(act)],
    )
    asks = Agent(
        name="asks",
        provider=ScriptedProvider(responder=respond, keep_requests=0),
        tools=[tool(needs_approval=True)(act)],
    )
    return lambda session_id: asks if session_id.startswith("ask-") else plain


POLL = 0.001
"""Seconds between the client's looks at the turn's row (a primary-key read of its status
columns). Waiting on the queue's ``LISTEN`` wake-ups instead cost tens of milliseconds
per wake-up on a loaded machine, and the approved side waits twice as often."""


async def _until(queue: Any, turn_id: str, done: Callable[[Any], bool]) -> Any:
    """The turn's status once ``done(status)``, looked at every :data:`POLL` seconds."""
    with trio.fail_after(60):
        while True:
            status = await queue.get_status(turn_id)
            if status is not None and done(status):
                return status
            await trio.sleep(POLL)


async def _measure(sizes: Sizes) -> list[Figure]:
    from actors.relays import RedisRelay
    from actors.stores import open_store, turn_queue
    from runtime.app.worker import Worker
    from runtime.approval import Decision, pending_calls
    from runtime.messages import AssistantMessage, TextPart, ToolMessage

    schema, url = _schema_url()
    tags = itertools.count()
    agents = _agents()
    decide_s: list[float] = []
    store = await open_store(url)
    queue = turn_queue(store)
    try:
        async with (
            RedisRelay.open(REDIS_URL, prefix=f"axon-bench-{schema}:") as relay,
            trio.open_nursery() as nursery,
        ):
            worker = Worker(store=store, relay=relay, agent=agents, poll=0.5, concurrency=1)
            await nursery.start(worker.run)

            async def plain() -> float:
                t0 = now()
                turn = await queue.submit(f"plain-{next(tags)}", PROMPT)
                await _until(queue, turn.turn_id, lambda s: s.finished)
                return now() - t0

            async def approved() -> float:
                session_id = f"ask-{next(tags)}"
                t0 = now()
                turn = await queue.submit(session_id, PROMPT)
                await _until(queue, turn.turn_id, lambda s: s.waiting)
                t1 = now()
                record = await store.load(session_id)
                assert record is not None
                (call,) = pending_calls(record.messages)
                tools = {t.name: t for t in agents(session_id).tools}
                await queue.decide(session_id, call.approval_id, Decision(approved=True), tools)
                t2 = now()
                await _until(queue, turn.turn_id, lambda s: s.finished)
                decide_s.append(t2 - t1)
                return (t1 - t0) + (now() - t2)

            async def commit() -> float:
                session_id = f"commit-{next(tags)}"
                version = await store.save(session_id, 0, [])
                message = AssistantMessage(id="m", content=(TextPart(text="w " * WORDS, step=0),))
                result = ToolMessage(tool_call_id="c", tool_name="act", step=0, output="done")
                t0 = now()
                await store.save(session_id, 0, [message, result], expected_version=version)
                return now() - t0

            times = await alternate(
                sizes.approval_rounds,
                sizes.warmup,
                {"plain": plain, "approved": approved, "commit": commit},
            )
            worker.stop()
    finally:
        await queue.aclose()
        await store.aclose()
        await trio.to_thread.run_sync(_drop_schema, schema)
    rounds = sizes.approval_rounds
    decide_s = decide_s[-rounds:]  # the measured rounds' (``alternate`` warms up first)
    plain_s, approved_s = median(times["plain"]), median(times["approved"])
    commit_s, decided_s = median(times["commit"]), median(decide_s)
    overhead = approved_s - plain_s
    return [
        Figure(
            key="approval.workers.overhead",
            title="10. Workers: approved turn / (plain turn + a step commit)",
            value=approved_s / (plain_s + commit_s),
            unit="x",
            target="<= 1",
            passed=overhead <= commit_s,
            detail=f"approved {approved_s * 1e3:.1f} ms (without the person's wait) vs plain "
            f"{plain_s * 1e3:.1f} ms: +{overhead * 1e3:.1f} ms; a step commit "
            f"{commit_s * 1e3:.2f} ms; median of {rounds} rounds",
            data={k: v for k, v in times.items()},
        ),
        Figure(
            key="approval.workers.decide",
            title="10. Workers: recording the decision",
            value=decided_s * 1e3,
            unit="ms",
            detail="load + compare-and-set save with the row's check and requeue; "
            f"median of {len(decide_s)}",
            data={"decide_s": decide_s},
        ),
    ]


def run(sizes: Sizes) -> list[Figure]:
    why = pg_unavailable() or redis_unavailable()
    if why:
        return [
            Figure(
                key="approval.workers.overhead",
                title="10. Workers: approved turn / (plain turn + a step commit)",
                value=None,
                unit="x",
                detail=f"skipped: {why}",
            )
        ]
    return trio.run(_measure, sizes)


__all__ = ["run"]
