"""Worker processes whose wall clocks are off by an hour (a container without NTP, a VM
resumed from suspend), on the test run's own PostgreSQL: a wait's deadline
(``approval_timeout``) is set and expired by PostgreSQL's clock, so no worker cuts a
person's wait short or stretches it by its own clock's error.

The skew is injected into each worker's ``time.time`` (tests/support/skew.py); the
machine's clock is not touched."""

from __future__ import annotations

import signal

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.messages import ToolMessage
from tests.support.skew import skewed
from tests.support.worker_agent import read_ledger
from tests.test_workers import (
    Workers,
    cluster,
    finished,
    in_first_tool,
    redis_url,
    sql,
    wait_for,
    workers,
)

__all__ = ["cluster", "redis_url", "workers"]  # the fixtures, used by name

HOUR = 3600.0
TIMEOUT = "600"
"""The agent's ``approval_timeout``: ten minutes, far from any test's duration."""


async def waiting(queue: TurnQueue, turn_id: str) -> None:
    async def waits() -> bool:
        turn = await queue.get(turn_id)
        return turn is not None and turn.status == "awaiting-input"

    await wait_for(waits, what=f"turn {turn_id} to wait for approval")


def seconds_left(pg_url: str, turn_id: str) -> float:
    """The waiting row's deadline less PostgreSQL's clock."""
    ((left,),) = sql(
        pg_url,
        "SELECT expires_at - extract(epoch FROM clock_timestamp())::float8 "
        "FROM axon_turns WHERE turn_id = %s",
        turn_id,
    )
    return float(left)


async def test_a_worker_an_hour_behind_stores_a_deadline_ten_minutes_ahead_of_the_database(
    pg_url: str, workers: Workers, cluster: tuple[PostgresStore, TurnQueue]
) -> None:
    _, queue = cluster
    workers.start("behind", AXON_TEST_APPROVAL_TIMEOUT=TIMEOUT, **skewed(-HOUR))
    turn = await queue.submit("s1", "approve the effect")
    await waiting(queue, turn.turn_id)
    assert 500 < seconds_left(pg_url, turn.turn_id) <= 600  # not an hour in the past


async def test_a_worker_an_hour_ahead_expires_only_the_waits_the_database_says_are_due(
    pg_url: str, workers: Workers, cluster: tuple[PostgresStore, TurnQueue]
) -> None:
    store, queue = cluster
    # Its expiry poll never comes (``--poll 600``): it only makes the turns wait.
    ask = ("--poll", "600")
    workers.start("long", AXON_TEST_APPROVAL_TIMEOUT=TIMEOUT, extra_args=ask)
    kept = await queue.submit("s1", "approve the effect")
    await waiting(queue, kept.turn_id)
    workers.signal("long", signal.SIGKILL)
    workers.start("short", AXON_TEST_APPROVAL_TIMEOUT="0.001", extra_args=ask)
    due = await queue.submit("s2", "approve the effect")
    await waiting(queue, due.turn_id)
    workers.signal("short", signal.SIGKILL)
    workers.start("ahead", AXON_TEST_APPROVAL_TIMEOUT=TIMEOUT, **skewed(HOUR))
    # The poll that took the due wait took every wait the worker believed due.
    assert (await finished(queue, due.turn_id)).status == "done"
    assert (await queue.get(kept.turn_id)).status == "awaiting-input"  # type: ignore[union-attr]
    assert seconds_left(pg_url, kept.turn_id) > 500
    record = await store.load("s2")
    assert record is not None
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [r.error for r in results] == ["the tool call was denied: timed out"]
    assert len(sql(pg_url, "SELECT 1 FROM axon_turns WHERE status = 'awaiting-input'")) == 1


async def test_a_worker_an_hour_ahead_takes_no_live_workers_turn_over(
    pg_url: str, workers: Workers, cluster: tuple[PostgresStore, TurnQueue]
) -> None:
    _, queue = cluster
    workers.start("live", AXON_TEST_DELAY="0.03")  # a turn of several leases
    turn = await queue.submit("s1", "tools one")
    await in_first_tool(pg_url)
    workers.start("ahead", **skewed(HOUR))
    done = await finished(queue, turn.turn_id)
    assert (done.status, done.attempts, done.epoch) == ("done", 1, 1)
    effects, _ = read_ledger(pg_url)
    assert sorted(effects.values()) == [1, 1]  # each tool ran once
