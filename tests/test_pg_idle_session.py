"""A server whose ``idle_session_timeout`` is shorter than the pool's idle connections
wait (here 300 ms, in the URL's ``options``: a role's or a database's setting does the
same): the store checks a connection idle for half of it before use, and takes the next
at once when one was closed (docs/deployment.md, "Limits and settings").

Before: a connection idle between 300 ms and the pool's 1 s check was used unchecked and
failed with ``terminating connection due to idle-session timeout`` (57P05), retried with
a ``store.retry`` warning on the next dead one; the pool's own check then waited a
second after each failed one, while the connection opened in its place idled past the
timeout too: 111 of 120 calls failed ("couldn't get a connection after 5.00 sec")."""

from __future__ import annotations

import gc
import io
import json

import psycopg
import trio

from actors.stores.postgres import PostgresStore
from runtime.logging import configure_logging

IDLE_300MS = "options=-c%20idle_session_timeout%3D300"


def retries(out: io.StringIO) -> list[str]:
    return [
        line["error"]
        for line in (json.loads(raw) for raw in out.getvalue().splitlines())
        if line["event"] == "store.retry"
    ]


def warnings(out: io.StringIO) -> list[str]:
    """Every warning's event (psycopg-pool's lines too: ``discarding closed connection``)."""
    return [
        line["event"]
        for line in (json.loads(raw) for raw in out.getvalue().splitlines())
        if line["level"] in ("warning", "error")
    ]


async def test_calls_after_idle_spells_past_the_idle_session_timeout_all_go_through(pg_url):
    out = io.StringIO()
    configure_logging("info", stream=out)
    store = await PostgresStore.open(f"{pg_url}&{IDLE_300MS}", retry_for=5)
    answered = 0

    async def call() -> None:
        nonlocal answered
        await store.now()
        answered += 1

    try:
        for _ in range(8):
            async with trio.open_nursery() as nursery:  # three pooled connections in use
                for _ in range(3):
                    nursery.start_soon(call)
            await trio.sleep(0.5)  # each idles past the server's 300 ms
    finally:
        await store.aclose()
    assert answered == 24
    assert warnings(out) == []  # nor psycopg-pool's discard of each closed one


async def test_an_idle_session_timeout_is_tried_again_once_at_once_and_a_second_is_an_outage(
    pg_url,
):
    out = io.StringIO()
    configure_logging("info", stream=out)
    store = await PostgresStore.open(pg_url, retry_for=5)
    calls = 0

    def timed_out(times: int):
        def fn(conn):
            nonlocal calls
            calls += 1
            if calls <= times:
                raise psycopg.errors.IdleSessionTimeout(
                    "terminating connection due to idle-session timeout"
                )
            return conn.execute("SELECT 1").fetchone()[0]

        return fn

    try:
        once = await store.run("once", timed_out(1))
        quiet = retries(out)
        calls = 0
        twice = await store.run("twice", timed_out(2))
    finally:
        await store.aclose()
    assert (once, quiet) == (1, [])
    # Two in a row are no race with the server's timer: retried as a connection error,
    # with its warning (a server that is going away is not hidden).
    assert twice == 1
    assert retries(out) == ["terminating connection due to idle-session timeout"]


async def test_reads_from_the_event_loop_after_idle_spells_all_go_through(pg_url):
    # The loop's lane (no thread, no pool): its connections idle as the pool's do.
    from runtime.messages import UserMessage

    out = io.StringIO()
    configure_logging("info", stream=out)
    store = await PostgresStore.open(f"{pg_url}&{IDLE_300MS}", retry_for=5)
    answered = 0

    async def call() -> None:
        nonlocal answered
        assert await store.load_last_turn("s") is not None
        answered += 1

    try:
        await store.save("s", 0, [UserMessage(content="hi")])
        for _ in range(8):
            async with trio.open_nursery() as nursery:  # three lane connections in use
                for _ in range(3):
                    nursery.start_soon(call)
            await trio.sleep(0.5)  # each idles past the server's 300 ms
    finally:
        await store.aclose()
    assert answered == 24
    assert retries(out) == []


async def test_the_listen_connection_waits_past_the_idle_session_timeout(pg_url):
    # Waiting idle is its work: before, the server closed it in each wait of a second
    # (a ``turns.listen_broken`` warning and a reconnect each, its notifications missed).
    from actors.stores.turns import TurnQueue

    out = io.StringIO()
    configure_logging("info", stream=out)
    store = await PostgresStore.open(f"{pg_url}&{IDLE_300MS}", retry_for=5)
    queue = TurnQueue(store)
    try:
        assert await queue.wait(1.0)  # opened: "maybe" at once
        woken = [await queue.wait(1.0) for _ in range(3)]
        payload = f"{store.schema}:t"
        await store.run("notify", lambda conn: conn.execute(f"NOTIFY axon_turns, '{payload}'"))
        notified = await queue.wait(5.0)
    finally:
        await queue.aclose()
        await store.aclose()
    assert (woken, notified) == ([False, False, False], True)
    assert warnings(out) == []


async def test_the_idle_checks_records_go_with_the_connections_the_pool_dropped(pg_url):
    # Kept by the connection's id, one record stayed for every connection ever opened
    # (a worker whose server closes idle connections opens one every few seconds).
    from actors.stores import postgres

    before = len(postgres._used), len(postgres._idle_limits)
    for _ in range(3):
        store = await PostgresStore.open(f"{pg_url}&{IDLE_300MS}", retry_for=5)
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(store.now)
        finally:
            await store.aclose()
    gc.collect()
    assert (len(postgres._used), len(postgres._idle_limits)) <= before
