"""A relay writer's bound in bytes (``max_queue_bytes``): a turn of large chunks against a
Redis that does not answer waits for it, holding at most the bound (and the batch that
crossed it), and loses nothing once Redis answers again; a reader that stops reading
holds nothing of the writer's.

Redis is paused (``SIGSTOP``) for real: a ``redis-server`` this test starts itself
(:class:`tests.support.services.RedisServer`), never the run's shared one nor the
machine's. Real time: every wait is bounded, nothing is timed."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

from actors.relays.redis_writer import _measured
from runtime import output as o
from runtime.errors import RelayTurnGone
from tests.support.redis import require_redis
from tests.support.services import RedisServer, ServiceUnavailable
from tests.test_relay import USAGE, opened, read_all

BOUND = 1_000_000
"""The writers' ``max_queue_bytes`` here."""
BIG = "x" * 200_000
"""One delta: five of them reach the bound."""
DELTAS = 40
"""A turn of 8 MB of deltas: eight times the bound."""
SLACK = 1000
"""Bytes of JSON around the deltas' text (a chunk's other fields, an entry's brackets)."""


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A Redis of this test's own, which it may pause."""
    require_redis()  # (skips, saying why, where no redis-server is installed)
    try:
        server = RedisServer()
    except ServiceUnavailable as exc:
        pytest.skip(f"no Redis of the test's own: {exc}")
    try:
        yield server
    finally:
        server.close()


@contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    """``server`` stopped (``SIGSTOP``: connections open, nothing answered) inside."""
    assert server.process is not None
    pid = server.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def delta(i: int) -> Any:
    return o.TextDelta(step=0, part_id="p", text=BIG if i % 2 == 0 else BIG.upper())


def opening() -> list[Any]:
    return [o.Start(message_id="m", turn_id="t", session_id="s"), o.StepStart(step=0),
            o.TextStart(step=0, part_id="p")]  # fmt: skip


def ending() -> list[Any]:
    return [
        o.TextFinish(step=0, part_id="p"),
        o.StepFinish(step=0, finish_reason="stop", usage=USAGE),
        o.Finish(finish_reason="stop", usage=USAGE),
    ]


async def test_a_turn_of_large_chunks_waits_for_a_paused_redis_within_the_bound_in_bytes(
    own_server: RedisServer,
) -> None:
    # Before: the queue was bounded by its count only (10,000): the whole 8 MB was held
    # while Redis did not answer, and would have been for 10,000 chunks of any size.
    appended = 0
    most = 0
    async with opened(
        own_server.url, max_queue_bytes=BOUND, op_timeout=0.5, close_timeout=120,
        retry_max=0.2,
    ) as relay:  # fmt: skip
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        writer.extend(opening())
        with trio.fail_after(30):
            await writer.flushed()

        async def turn() -> None:
            nonlocal appended, most
            for i in range(DELTAS):
                writer.extend([delta(i)])
                appended += 1
                most = max(most, writer.held, _measured(writer._queue))
                await writer.room()

        with paused(own_server), trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(turn)
                with trio.fail_after(60):  # the turn comes to wait on the paused Redis
                    seen = -1
                    while seen != appended:
                        seen = appended
                        await trio.sleep(1.0)
                waiting_at = appended
                held_then = writer.held
                queued_json = _measured(writer._queue)
                assert writer.failures >= 1  # Redis did not answer meanwhile
                own_server.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        writer.extend(ending())
        await writer.aclose()
        chunks = await read_all(relay, "t")
    # the turn waited, short of its 40 deltas, holding no more than the bound and the
    # delta that crossed it (the queue's JSON measured apart from the writer's count)
    assert 0 < waiting_at < DELTAS
    assert held_then <= BOUND + len(BIG) + SLACK and queued_json <= BOUND + len(BIG) + SLACK
    assert most <= BOUND + len(BIG) + SLACK
    # and lost nothing: the whole turn reads back once Redis answered
    assert writer.lost == 0
    texts = [c.text for c in chunks if type(c) is o.TextDelta]
    assert texts == [delta(i).text for i in range(DELTAS)]


async def test_a_reader_that_stops_reading_holds_nothing_of_the_writers(
    own_server: RedisServer,
) -> None:
    # A resumable GET whose client stalls stops pulling its read: the writer writes to
    # Redis, not to its readers, so its turn neither waits nor holds more for it.
    async with opened(own_server.url, max_queue_bytes=BOUND) as relay:
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        writer.extend(opening())
        with trio.fail_after(30):
            await writer.flushed()
        read = relay.read("t")
        try:
            first = await read.__anext__()  # the reader read once, then stalls
            assert type(first) is o.Start
            most = 0
            with trio.fail_after(60):
                for i in range(DELTAS):
                    writer.extend([delta(i)])
                    most = max(most, writer.held)
                    await writer.room()
                await writer.flushed()
            assert writer.held == 0 and writer.lost == 0
            assert most <= BOUND + len(BIG) + SLACK
        finally:
            await read.aclose()
        writer.extend(ending())
        await writer.aclose()
        chunks = await read_all(relay, "t")
    assert [c.text for c in chunks if type(c) is o.TextDelta] == [
        delta(i).text for i in range(DELTAS)
    ]


async def test_a_redis_paused_past_close_timeout_loses_the_queue_not_the_turn_nor_the_bound(
    own_server: RedisServer,
) -> None:
    # Redis that makes no room for ``close_timeout`` is down, not slow: the turn is not
    # held for the outage (it drops its queue, readers told) and never holds more.
    most = 0
    async with opened(
        own_server.url, max_queue_bytes=BOUND, op_timeout=0.5, close_timeout=1.0,
        retry_max=0.2,
    ) as relay:  # fmt: skip
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        writer.extend(opening())
        with trio.fail_after(30):
            await writer.flushed()
        with paused(own_server), trio.fail_after(60):
            for i in range(DELTAS):  # the whole turn goes on, Redis paused throughout
                writer.extend([delta(i)])
                most = max(most, writer.held, _measured(writer._queue))
                await writer.room()
        writer.extend(ending())
        with trio.fail_after(60):
            await writer.aclose()
        with pytest.raises(RelayTurnGone, match="lost part of turn"):
            await read_all(relay, "t")
    assert 0 < writer.lost < DELTAS + 3
    # the bound and the delta that crossed it: never the turn's 8 MB
    assert most <= BOUND + len(BIG) + SLACK
