"""A decision posted after its wait's deadline by PostgreSQL's clock, while no worker has
noticed the expiry (every worker down): refused with 409, and the next worker up denies
the call ``timed out``; the tool never runs (docs/approval.md). Real PostgreSQL and
Redis, a front end and workers in this process."""

from __future__ import annotations

import time

import httpx
import pytest

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


@pytest.mark.parametrize("order", [("person", "expiry"), ("expiry", "person")])
async def test_a_late_decision_and_the_expiry_racing_on_the_row_record_only_the_expiry(
    pg_url: str, order: tuple[str, str]
) -> None:
    """Both wait on the turn's row, held by another transaction (the gate), queued in
    ``order``, then go: whichever takes the row first, the person's is refused and the
    expiry's denial is the one recorded."""
    import psycopg
    import trio

    from actors.stores.postgres import PostgresStore, parse_url
    from actors.stores.turns import TurnQueue
    from runtime.approval import Decision
    from runtime.errors import AlreadyDecided
    from tests.test_pg_turn_statements import _past_deadline_turn

    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    libpq, schema = parse_url(pg_url)
    outcome: dict[str, object] = {}
    try:
        claim = await _past_deadline_turn(store, queue, {})
        before = await store.version("s")
        with psycopg.connect(libpq) as gate:
            gate.execute(f"SET search_path TO {schema}")
            gate.execute(
                "SELECT 1 FROM axon_turns WHERE turn_id = %s FOR UPDATE", (claim.turn.turn_id,)
            )

            async def person() -> None:
                try:
                    await queue.decide("s", "ap1", Decision(approved=True), {})
                    outcome["person"] = "recorded"
                except AlreadyDecided:  # WaitExpired, or the expiry took the row first
                    outcome["person"] = "refused"

            async def expiry() -> None:
                denial = Decision(approved=False, reason="timed out")
                decided = await queue.decide("s", "ap1", denial, {}, expiry=True)
                outcome["expiry"] = decided.recorded.complete

            with psycopg.connect(libpq, autocommit=True) as look:

                async def waiting_on_the_row() -> int:
                    row = look.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    ).fetchone()
                    return int(row[0])

                with trio.fail_after(LIMIT):
                    async with trio.open_nursery() as nursery:
                        # Lock waiters are served in turn: the first queued takes the row.
                        for n, racer in enumerate(order, start=1):
                            nursery.start_soon({"person": person, "expiry": expiry}[racer])
                            while True:
                                if await waiting_on_the_row() >= n:
                                    break
                                await trio.sleep(0.01)
                        gate.rollback()  # the gate opens: both go
        after = await store.version("s")
        record = await store.load("s")
    finally:
        await queue.aclose()
        await store.aclose()
    assert outcome == {"person": "refused", "expiry": True}
    assert after == before + 1  # one write: the expiry's
    assert record is not None
    stored = record.messages[1].content[0].awaiting
    assert stored.approved is False and stored.reason == "timed out"
