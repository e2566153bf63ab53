"""A worker deployment's session deleted while its turns are queued, running or waiting
for a person, then started again under the same id by a new message: real processes (a
``serve`` front end and a ``python -m runtime worker``) on the test run's own PostgreSQL
and Redis. ``PostgresStore.delete`` ends the session's turn rows in its transaction; the
old rows, the running turn's lease and a decision sent late for the deleted turn must do
nothing to the new conversation. (Attacked and held: no change was needed; these pin it.)"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from actors.stores.postgres import PostgresStore
from runtime.errors import SESSION_DELETED
from runtime.messages import UserMessage
from tests.test_relay_web import sse_events
from tests.test_worker_approval_processes import FrontEnds, approval, chat, deployment
from tests.test_workers import Workers, sql, wait_for

__all__ = ["deployment"]  # the fixture, used by name

LIMIT = 60.0
DELETE = {"content-type": "application/json"}


async def _stored(pg_url: str) -> Any:
    store = await PostgresStore.open(pg_url)
    try:
        return await store.load("s")
    finally:
        await store.aclose()


def _users(record: Any) -> list[Any]:
    return [m.content for m in record.messages if isinstance(m, UserMessage)]


def _rows(pg_url: str) -> list[tuple[str, str | None]]:
    return sql(pg_url, "SELECT status, cancel_reason FROM axon_turns ORDER BY seq")


async def test_a_running_and_a_queued_turn_of_a_deleted_session_stay_out_of_its_re_creation(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    # "tools one" runs on the worker (its tool holds 3 s after its effect), "two" is
    # queued behind it; the session is deleted and "hello" starts it again while the
    # old turn still runs and holds its lease.
    workers, fronts = deployment
    url = await fronts.start()
    workers.start("w1", AXON_TEST_TOOL_HOLD="3")
    replies: dict[str, httpx.Response] = {}
    async with httpx.AsyncClient(timeout=LIMIT) as client:

        async def post(message_id: str, text: str) -> None:
            sent = chat("s", text)
            sent["messages"][0]["id"] = message_id
            replies[message_id] = await client.post(f"{url}/api/chat", json=sent)

        async def running() -> list[Any]:
            return sql(pg_url, "SELECT 1 FROM axon_turns WHERE status = 'running'")

        async def queued() -> list[Any]:
            return sql(pg_url, "SELECT 1 FROM axon_turns WHERE status = 'queued'")

        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "u1", "tools one")
                await wait_for(running, LIMIT, "the first turn to run")
                nursery.start_soon(post, "u2", "two")
                await wait_for(queued, LIMIT, "the second turn to be queued")
                deleted = await client.delete(f"{url}/api/sessions/s", headers=DELETE)
                nursery.start_soon(post, "u3", "hello")

        async def settled() -> bool:
            return not sql(pg_url, "SELECT 1 FROM axon_turns WHERE status IN ('queued', 'running')")

        await wait_for(settled, LIMIT, "the turns to end")
    record = await _stored(pg_url)
    assert deleted.status_code == 204
    assert [r.status_code for r in replies.values()] == [200, 200, 200]
    assert 'data: {"type":"abort","reason":"session deleted"}' in replies["u1"].text
    assert sse_events(replies["u2"].text)[0][1] == {"type": "abort", "reason": SESSION_DELETED}
    assert '"finishReason":"stop"' in replies["u3"].text
    assert _rows(pg_url) == [
        ("cancelled", SESSION_DELETED),
        ("cancelled", SESSION_DELETED),
        ("done", None),
    ]
    assert record is not None and _users(record) == ["hello"]
    assert record.meta["title"] == "hello"
    assert [m.role for m in record.messages] == ["user", "assistant"]


async def test_a_late_decision_for_a_deleted_sessions_waiting_turn_leaves_its_re_creation_alone(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    # Both conversations' turns wait for the same tool call id (``call_a``): the late
    # approval names the deleted turn's message and approval.
    workers, fronts = deployment
    url = await fronts.start()
    workers.start("w1")
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            first = sse_events(
                (await client.post(f"{url}/api/chat", json=chat("s", "approve first"))).text
            )
            asked = next(
                d for _, d in first if d != "[DONE]" and d["type"] == "tool-approval-request"
            )
            deleted = await client.delete(f"{url}/api/sessions/s", headers=DELETE)
            await client.post(f"{url}/api/chat", json=chat("s", "approve again"))
            late = await client.post(
                f"{url}/api/chat",
                json=approval("s", "approve first", first[0][1]["messageId"], asked["approvalId"]),
            )
    record = await _stored(pg_url)
    assert deleted.status_code == 204 and late.status_code == 404
    assert _rows(pg_url) == [("cancelled", SESSION_DELETED), ("awaiting-input", None)]
    assert record is not None and _users(record) == ["approve again"]
    call = record.messages[-1].content[-1]
    assert call.tool_call_id == "call_a" and call.awaiting.id != asked["approvalId"]
    assert not call.awaiting.decided  # the new turn still waits for its own person
