"""A message steered into a worker's turn whose worker is SIGKILLed inside the save that
would store it (``AXON_TEST_FINISH_HOLD``: the turn's last save, held before its commit):
real ``serve`` and ``python -m runtime worker`` processes on the test run's own
PostgreSQL and Redis (tests/test_worker_steer_processes.py's deployment).

The steering row is marked only by the save that stores the message, so the worker that
takes the turn over takes the message again, and its model call sees it once. The client
that steered gets its 202 once that worker stored it; the running stream shows the
message once (before: twice, the dead worker's ``data-steered`` and the takeover's)."""

from __future__ import annotations

import signal
from typing import Any

import httpx
import trio

from runtime.messages import UserMessage
from tests.test_worker_approval_processes import FrontEnds, chat
from tests.test_worker_steer_processes import (
    LIMIT,
    deployment,
    rest_of,
    steering,
    turn_outcome,
    until_tool_call,
)
from tests.test_workers import Workers, _backends_finishing_a_turn, wait_for

__all__ = ["deployment"]  # (the fixture)


async def test_a_message_steered_into_a_turn_whose_worker_dies_in_its_save_runs_once(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    front = await fronts.start()
    workers.start(
        "a",
        AXON_TEST_TOOL_HOLD="1.5",
        AXON_TEST_FINISH_HOLD="30",
        PGOPTIONS="-c client_connection_check_interval=50",
    )
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            async with client.stream(
                "POST", f"{front}/api/chat", json=chat("s1", "tools please")
            ) as response:
                assert response.status_code == 200
                chunks = response.aiter_text()
                raw = await until_tool_call(chunks, "call_2")  # step 1's tool holds
                async with trio.open_nursery() as nursery:

                    async def steer() -> None:
                        sent = steering("s1", "also this")
                        out["steered"] = await client.post(f"{front}/api/chat", json=sent)

                    nursery.start_soon(steer)

                    async def in_last_save() -> bool:
                        return await trio.to_thread.run_sync(_backends_finishing_a_turn, pg_url) > 0

                    await wait_for(in_last_save, what="worker a inside its last save")
                    workers.signal("a", signal.SIGKILL)  # the message taken, not stored
                    workers.start("b")
                    raw += await rest_of(chunks)
    columns = "status, finish_reason, steer_of, attempts, owner"
    events, turn_id, rows, record = await turn_outcome(pg_url, raw, columns)
    assert rows == [
        ("done", "stop", None, 2, "b"),
        ("done", "steered", turn_id, 0, None),
    ]
    assert out["steered"].status_code == 202, out["steered"].text
    assert out["steered"].json()["turnId"] == turn_id
    types = [e["type"] for e in events]
    shown = [e["data"]["messageId"] for e in events if e["type"] == "data-steered"]
    assert shown == ["u2"], types
    assert types.count("reset-step") == 1 and types[-1] == "finish"
    assert record is not None
    users = [m for m in record.messages if isinstance(m, UserMessage)]
    assert [(m.id, m.content) for m in users][1:] == [("u2", "also this")]
    assert record.messages[-1].text == "echo: also this"
