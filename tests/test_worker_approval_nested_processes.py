"""An approved agent-as-tool once, with real processes (issue 21): a ``serve`` front end
and ``python -m runtime worker`` processes on the test run's own PostgreSQL and Redis.
The continuation of the approved call runs the sub-agent, whose step with ``note`` (a
side effect, keyed by its idempotency key) is committed; the worker is SIGKILLed in the
next step; the worker that takes the turn over goes on with that sub-turn from its
committed step: ``note`` ran once, under one key. Before, the sub-agent ran again from
the start, ``note`` under a second key."""

from __future__ import annotations

import functools
import signal
from pathlib import Path
from typing import Any

import httpx
import trio

from actors.stores.postgres import PostgresStore
from runtime.messages import ToolMessage, UserMessage
from tests.support.worker_agent import read_ledger
from tests.test_relay_web import sse_events
from tests.test_worker_approval_processes import LIMIT, FrontEnds, chat, deployment
from tests.test_workers import Workers, sql, wait_for

__all__ = ["deployment"]  # the fixture, used by name

AGENT = "tests.support.sub_once_agent:agent"


def approval(message_id: str, approval_id: str) -> dict[str, Any]:
    """What ``useChat`` sends once the ``helper`` call is approved."""
    sent = chat("s1", "go")
    part = {
        "type": "tool-helper",
        "toolCallId": "call_h",
        "state": "approval-responded",
        "input": {"input": "do"},
        "approval": {"id": approval_id, "approved": True},
    }
    sent["messages"].append(
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
    )
    sent["messageId"] = message_id
    return sent


async def test_a_sub_turn_cut_by_a_sigkill_goes_on_from_its_committed_step(
    pg_url: str, deployment: tuple[Workers, FrontEnds], tmp_path: Path, monkeypatch: Any
) -> None:
    monkeypatch.setattr("tests.test_worker_approval_processes.AGENT", AGENT)
    workers, fronts = deployment
    hang = tmp_path / "hang"
    args = {"extra_args": ["--agent", AGENT], "AXON_TEST_HANG_FILE": str(hang)}
    front = await fronts.start()
    workers.start("w1", **args)  # type: ignore[arg-type]
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            first = sse_events((await client.post(f"{front}/api/chat", json=chat("s1", "go"))).text)
        asked = next(d for _, d in first if d != "[DONE]" and d["type"] == "tool-approval-request")
        message_id = first[0][1]["messageId"]
        turn_id = message_id.removeprefix("msg_")
        sent = approval(message_id, asked["approvalId"])
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                functools.partial(client.post, f"{front}/api/chat", json=sent)
            )  # read, then cut

            async def hanging() -> bool:
                return hang.exists()

            await wait_for(hanging, LIMIT, "the sub-agent's second step to hang")
            workers.signal("w1", signal.SIGKILL)
            nursery.cancel_scope.cancel()
    workers.start("w2", **args)  # type: ignore[arg-type]

    async def finished() -> bool:
        rows = sql(pg_url, "SELECT status FROM axon_turns WHERE turn_id = %s", turn_id)
        return rows == [("done",)]

    await wait_for(finished, LIMIT, "the taken-over turn to finish")
    store = await PostgresStore.open(pg_url)
    try:
        parent, sub = await store.load("s1"), await store.load("s1.helper.call_h")
    finally:
        await store.aclose()
    effects, attempts = read_ledger(pg_url)
    assert len(effects) == 1 and list(attempts.values()) == [1]  # note ran once, one key
    assert sub is not None and sum(isinstance(m, UserMessage) for m in sub.messages) == 1
    assert parent is not None
    results = [(m.tool_call_id, m.output) for m in parent.messages if isinstance(m, ToolMessage)]
    assert results == [("call_h", "sub answer")]
