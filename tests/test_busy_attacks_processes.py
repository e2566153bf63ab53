"""Busy sessions attacked with real processes: a ``serve --on-busy steer`` front end and
``python -m runtime worker`` processes on the test run's own PostgreSQL and Redis; the
worker running a steered turn is SIGKILLed before the step boundary that would take the
message (tests/test_worker_steer_processes.py runs the same without the kill)."""

from __future__ import annotations

import signal

import httpx
import trio

from runtime.messages import AssistantMessage, UserMessage
from tests.test_worker_approval_processes import FrontEnds, chat
from tests.test_worker_steer_processes import (
    LIMIT,
    deployment,
    rest_of,
    steering,
    turn_outcome,
    until_tool_call,
)
from tests.test_workers import Workers, sql

__all__ = ["deployment"]  # (the fixture, used by name)


async def steering_row_queued(pg_url: str) -> None:
    """Until the front end queued the steering row (naming the running turn)."""
    query = "SELECT count(*) FROM axon_turns WHERE steer_of IS NOT NULL"
    while True:
        if sql(pg_url, query)[0][0]:
            return
        await trio.sleep(0.05)


async def test_a_message_steered_into_a_turn_whose_worker_is_killed_reaches_the_takeover(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    # The steering row is queued naming the running turn; its worker dies in step 0's
    # tool, before the boundary that would insert it. The worker that takes the turn
    # over runs step 0 again and inserts it after it: once, where the model sees it, and
    # the steering POST (waiting all along) gets its 202.
    workers, fronts = deployment
    front = await fronts.start()
    workers.start("w1", AXON_TEST_TOOL_HOLD="600")  # its tools never return there
    steered: list[httpx.Response] = []
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                async with client.stream(
                    "POST", f"{front}/api/chat", json=chat("s1", "tools please")
                ) as response:
                    assert response.status_code == 200
                    chunks = response.aiter_text()
                    raw = await until_tool_call(chunks, "call_1")  # step 0's tool holds

                    async def steer() -> None:
                        sent = steering("s1", "also this")
                        steered.append(await client.post(f"{front}/api/chat", json=sent))

                    nursery.start_soon(steer)
                    await steering_row_queued(pg_url)
                    workers.signal("w1", signal.SIGKILL)
                    workers.start("w2")
                    raw += await rest_of(chunks)
    _, turn_id, rows, record = await turn_outcome(pg_url, raw)
    assert steered[0].status_code == 202, steered[0].text
    assert steered[0].json() == {
        "steered": True,
        "turnId": turn_id,
        "messageId": "u2",
        "answered": False,
    }
    assert rows == [("done", "stop", None), ("done", "steered", turn_id)]
    assert record is not None
    users = [m for m in record.messages if isinstance(m, UserMessage)]
    assert [(m.id, m.content) for m in users[1:]] == [("u2", "also this")]  # once
    last = record.messages[-1]
    assert isinstance(last, AssistantMessage) and last.text == "echo: also this"
