"""A worker whose PostgreSQL is down logs its failed claims and ``LISTEN`` connections as
a line at once and then one with a count each interval (:mod:`runtime.log_repeats`), not a
line a poll: before, ``worker.claim_failed`` and ``turns.listen_failed`` were logged at
every poll, five lines a second at ``--poll 0.2``. Lines counted on virtual time."""

from __future__ import annotations

import io
import json
from typing import Any

import trio

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.app.worker import Worker
from runtime.errors import StoreError
from runtime.log_repeats import REPEAT_INTERVAL, RepeatedWarning
from runtime.logging import configure_logging
from tests.support.worker_agent import agent

OUTAGE = 10 * REPEAT_INTERVAL
"""Seconds of the outage each test runs through (virtual)."""


def lines(out: io.StringIO, event: str) -> list[dict[str, Any]]:
    return [
        line
        for line in (json.loads(raw) for raw in out.getvalue().splitlines())
        if line["event"] == event
    ]


async def test_a_repeated_warning_logs_its_first_at_once_then_a_count_each_interval(
    autojump_clock,
):
    out = io.StringIO()
    configure_logging("info", stream=out)
    warning = RepeatedWarning("axon.test", "test.failed")
    for n in range(100):
        warning.warning(error=f"down {n}")
        await trio.sleep(1.0)
    warning.clear()
    logged = lines(out, "test.failed")
    assert [line.get("repeated") for line in logged] == [None, 30, 30, 30, 9]
    assert logged[0]["error"] == "down 0" and logged[-1]["error"] == "down 99"
    assert sum(line.get("repeated", 1) for line in logged) == 100  # none uncounted
    warning.warning(error="down again")  # a new outage: said at once
    again = lines(out, "test.failed")[5:]
    assert [(line["error"], line.get("repeated")) for line in again] == [("down again", None)]


async def test_a_worker_whose_claims_fail_logs_a_line_and_then_counts(pg_url, autojump_clock):
    out = io.StringIO()
    configure_logging("info", stream=out)
    store = await PostgresStore.open(pg_url)
    worker = Worker(store=store, agent=agent, owner="w", poll=0.2)
    claims = 0

    async def claim(leases: Any) -> None:
        nonlocal claims
        claims += 1
        raise StoreError("connection refused")

    worker._claim = claim  # type: ignore[method-assign]
    worker._leases = object()  # type: ignore[assignment]
    try:
        with trio.move_on_after(OUTAGE):
            await worker._claim_until_stopped(None)  # type: ignore[arg-type]
    finally:
        await worker.queue.aclose()
        await store.aclose()
    logged = lines(out, "worker.claim_failed")
    assert claims > 1000
    assert len(logged) <= OUTAGE / REPEAT_INTERVAL + 1, len(logged)
    assert logged[0].get("repeated") is None and logged[1]["repeated"] > 100


async def test_a_queue_whose_listen_cannot_open_logs_a_line_and_then_counts(pg_url, autojump_clock):
    out = io.StringIO()
    configure_logging("info", stream=out)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    tries = 0

    def refused() -> Any:
        nonlocal tries
        tries += 1
        raise OSError("connection refused")

    queue._connect_listener = refused  # type: ignore[method-assign]
    try:
        with trio.move_on_after(OUTAGE):
            while True:
                await queue.wait(0.2)
        del queue._connect_listener  # the server is back: the held failures are counted
        assert await queue.wait(0.2)
    finally:
        await queue.aclose()
        await store.aclose()
    logged = lines(out, "turns.listen_failed")
    assert tries > 1000
    assert len(logged) <= OUTAGE / REPEAT_INTERVAL + 2, len(logged)
    assert sum(line.get("repeated", 1) for line in logged) == tries
