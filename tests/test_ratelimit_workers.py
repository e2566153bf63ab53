"""Four worker processes share one rate limit through Redis: over two minutes of a clock
they share (running 10 times faster than the wall clock), no minute holds more than the
60 calls a minute allowed, and every session's turns still run in order."""

from __future__ import annotations

import time

import trio

from actors.relays.limits import RedisLimitBackend
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.messages import AssistantMessage, UserMessage
from runtime.ratelimit import WINDOW, limit_key
from tests.support.limited_agent import RPM
from tests.test_ratelimit import most_in_a_window
from tests.test_workers import (  # noqa: F401 (fixtures)
    Workers,
    cluster,
    redis_url,
    sql,
    wait_for,
    workers,
)

SPEED = 10.0
SESSIONS, TURNS = 15, 10
LONG_LEASE = 30.0
"""Seconds: far beyond a renewal's delay on a loaded machine (CI once saw 151 grants
for 150 turns with the 2 s lease of the crash tests)."""


async def test_four_workers_never_exceed_60_calls_a_minute_and_keep_each_sessions_order(
    pg_url: str,
    redis_url: str,  # noqa: F811
    workers: Workers,  # noqa: F811
    cluster: tuple[PostgresStore, TurnQueue],  # noqa: F811
) -> None:
    store, queue = cluster
    sessions = [f"s{i}" for i in range(SESSIONS)]

    async def submit_all(session_id: str) -> None:
        for i in range(TURNS):  # in order, each as soon as the last is queued
            await queue.submit(session_id, f"{session_id} m{i}")

    async with trio.open_nursery() as nursery:  # all queued first: the limit has to bind
        for session_id in sessions:
            nursery.start_soon(submit_all, session_id)
    clock = {"AXON_TEST_CLOCK_EPOCH": repr(time.time()), "AXON_TEST_CLOCK_SPEED": repr(SPEED)}
    for name in "abcd":  # no worker dies here: a lease that a loaded machine can miss
        # would re-run a turn, a second real model call (and grant) for it
        workers.start(
            name,
            lease=LONG_LEASE,
            extra_args=["--agent", "tests.support.limited_agent:agent"],
            **clock,
        )

    async def all_done() -> bool:
        rows = await trio.to_thread.run_sync(
            sql, pg_url, "SELECT count(*) FROM axon_turns WHERE status = 'done'"
        )
        return rows[0][0] == SESSIONS * TURNS

    await wait_for(all_done, timeout=180, what=f"{SESSIONS * TURNS} turns")

    from actors.relays.redis_streams import RedisRelay

    async with RedisRelay.open(redis_url, prefix=workers.prefix) as relay:
        backend: RedisLimitBackend = relay.rate_limits()
        granted = await backend.granted(limit_key("scripted", "scripted", None))
    assert len(granted) == SESSIONS * TURNS  # one model call a turn, each granted once
    assert most_in_a_window(granted) == RPM  # the limit bound, and was never passed
    assert max(granted) - min(granted) >= 2 * WINDOW  # 150 calls took over two minutes
    owners = {row[0] for row in sql(pg_url, "SELECT DISTINCT owner FROM axon_turns")}
    assert len(owners) >= 2

    for session_id in sessions:
        record = await store.load(session_id)
        assert record is not None
        users = [m.content for m in record.messages if isinstance(m, UserMessage)]
        answers = [m.text for m in record.messages if isinstance(m, AssistantMessage)]
        assert users == [f"{session_id} m{i}" for i in range(TURNS)]
        assert answers == [f"echo: {u}" for u in users]
