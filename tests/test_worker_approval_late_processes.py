"""A late approval with real processes (docs/approval.md): every worker SIGKILLed while a
turn waits, its deadline (``approval_timeout``, by PostgreSQL's clock) passes, the
approval posted to a ``serve`` front end is refused with 409; the next worker up denies
the call ``timed out`` and the tool never runs."""

from __future__ import annotations

import signal

import httpx
import trio

from actors.stores.postgres import PostgresStore
from runtime.messages import ToolMessage
from tests.support.worker_agent import read_ledger
from tests.test_relay_web import sse_events
from tests.test_worker_approval_processes import (
    LIMIT,
    FrontEnds,
    approval,
    chat,
    deployment,
)
from tests.test_workers import Workers, sql, wait_for

__all__ = ["deployment"]  # the fixture, used by name

TIMEOUT = "2"
"""The agent's ``approval_timeout``: long enough for the test to kill the worker first."""


async def test_an_approval_after_the_deadline_with_every_worker_down_is_refused(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    text = "approve the effect"
    front = await fronts.start()
    workers.start("w1", AXON_TEST_APPROVAL_TIMEOUT=TIMEOUT)
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            first = sse_events((await client.post(f"{front}/api/chat", json=chat("s1", text))).text)
        asked = next(d for _, d in first if d != "[DONE]" and d["type"] == "tool-approval-request")
        message_id = first[0][1]["messageId"]
        turn_id = message_id.removeprefix("msg_")
        workers.signal("w1", signal.SIGKILL)  # every worker down, the wait not expired

        async def past_deadline() -> bool:
            rows = sql(
                pg_url,
                "SELECT status, expires_at <= extract(epoch FROM clock_timestamp())::float8 "
                "FROM axon_turns WHERE turn_id = %s",
                turn_id,
            )
            assert rows[0][0] == "awaiting-input", rows  # no worker expired it
            return bool(rows[0][1])

        await wait_for(past_deadline, LIMIT, "the wait's deadline to pass")
        sent = approval("s1", text, message_id, asked["approvalId"])
        with trio.fail_after(LIMIT):  # taken, it would stream until a worker resumed it
            async with client.stream("POST", f"{front}/api/chat", json=sent) as response:
                status = response.status_code
                said = (await response.aread()).decode() if status != 200 else ""
        still = sql(pg_url, "SELECT status FROM axon_turns WHERE turn_id = %s", turn_id)
        workers.start("w2")

        async def finished() -> bool:
            rows = sql(pg_url, "SELECT status FROM axon_turns WHERE turn_id = %s", turn_id)
            return rows == [("done",)]

        await wait_for(finished, LIMIT, "the next worker to deny the expired wait")
    store = await PostgresStore.open(pg_url)
    try:
        record = await store.load("s1")
    finally:
        await store.aclose()
    effects, _ = read_ledger(pg_url)
    assert status == 409
    assert "expired" in said
    assert still == [("awaiting-input",)]
    assert effects == {}  # the tool never ran
    assert record is not None
    results = [m.error for m in record.messages if isinstance(m, ToolMessage)]
    assert results == ["the tool call was denied: timed out"]
