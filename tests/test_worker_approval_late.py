"""A decision posted after its wait's deadline by PostgreSQL's clock, while no worker has
noticed the expiry (every worker down): refused with 409, and the next worker up denies
the call ``timed out``; the tool never runs (docs/approval.md). Real PostgreSQL and
Redis, a front end and workers in this process."""

from __future__ import annotations

import time

import httpx

from runtime.messages import ToolMessage
from tests.test_frontend import LIMIT, deployment
from tests.test_worker_approval import (  # noqa: F401 (fixtures)
    _clear_ran,
    answer,
    approval_agent,
    asked,
    first_part,
    payloads,
    ran,
    redis_url,
    waiting_turn,
)


async def test_an_approval_posted_past_the_deadline_with_every_worker_down_is_409(
    pg_url: str,
    redis_url: str,  # noqa: F811 (the fixture)
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(timeout=600)) as d:
        host = d.workers[0].host
        assert host is not None
        # The deadline this worker stores is 50 minutes past by PostgreSQL's clock: as
        # if the wait began an hour ago and every worker went down since.
        host.clock = lambda: time.time() - 3600
        first = await first_part(d, d.urls[0])
        waited = await waiting_turn(d)
        await d.stop_workers()
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            late = await client.post(
                f"{d.urls[0]}/api/chat",
                json=answer(
                    "s1", payloads(first)[0]["messageId"], asked(first)["approvalId"], True
                ),
            )
        still = await d.queue.get_status(waited.turn_id)
        await d.start_worker()  # its clock is PostgreSQL's: the wait is due
        turn = await d.queue.wait_finished(waited.turn_id, LIMIT)
        record = await d.store.load("s1")
    assert late.status_code == 409
    assert "expired" in late.json()["error"]
    assert still is not None and still.waiting  # nothing recorded by the late decision
    assert turn is not None and turn.status == "done"
    assert record is not None
    results = [m.error for m in record.messages if isinstance(m, ToolMessage)]
    assert results == ["the tool call was denied: timed out"]
    assert ran == []
