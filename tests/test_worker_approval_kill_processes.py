"""A worker SIGKILLed in an approved turn's continuation, after the approved tool ran and
before its step's commit (real worker processes, the run's own PostgreSQL and Redis):
the worker that takes the turn over runs the approved call again, under the same
``ToolContext.idempotency_key`` (the turn's, its step's and the call's id), so a tool that
keys its side effect on it (the ledger of tests/support/worker_agent.py) does it once;
the decision is not asked again and the result is stored once (docs/approval.md)."""

from __future__ import annotations

import signal
from typing import Any

import trio

from runtime.approval import Decision, pending_calls
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage
from tests.support.worker_agent import agent, answer_text, read_ledger
from tests.test_workers import Workers, cluster, finished, redis_url, wait_for, workers

__all__ = ["cluster", "redis_url", "workers"]  # (the fixtures)


async def test_a_worker_killed_after_the_approved_tool_ran_leaves_its_effect_done_once(
    pg_url: str, workers: Workers, cluster: Any
) -> None:
    store, queue = cluster
    workers.start("a", AXON_TEST_GUARDED_HOLD="30")
    turn = await queue.submit("s1", "approve the wire")

    async def waiting() -> bool:
        status = await queue.get(turn.turn_id)
        return status is not None and status.status == "awaiting-input"

    await wait_for(waiting, what="the turn to wait for approval")
    record = await store.load("s1")
    assert record is not None
    (call,) = pending_calls(record.messages)
    decided = await queue.decide("s1", call.approval_id, Decision(approved=True), agent.tool_map)
    assert decided.recorded.complete
    key = f"{turn.turn_id}:0:{call.tool_call_id}"

    async def effect_done() -> bool:
        return key in (await trio.to_thread.run_sync(read_ledger, pg_url))[0]

    await wait_for(effect_done, what="the approved tool's side effect")
    held = await store.load("s1")
    assert held is not None and not any(isinstance(m, ToolMessage) for m in held.messages)
    workers.signal("a", signal.SIGKILL)  # the effect happened; its step is not committed
    workers.start("b")
    done = await finished(queue, turn.turn_id)
    effects, attempts = read_ledger(pg_url)
    record = await store.load("s1")
    assert done.status == "done"
    assert effects == {key: 1}  # done once ...
    assert attempts == {key: 2}  # ... though the takeover ran the approved call again
    assert record is not None
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [(r.tool_call_id, r.output) for r in results] == [(call.tool_call_id, "recorded 1")]
    (assistant,) = [m for m in record.messages if isinstance(m, AssistantMessage)]
    (stored,) = [p for p in assistant.content if isinstance(p, ToolCallPart)]
    assert stored.awaiting is not None and stored.awaiting.approved  # not asked again
    assert pending_calls(record.messages) == ()
    text = "".join(getattr(p, "text", "") for p in assistant.content)
    assert text.endswith(answer_text("approve the wire"))
