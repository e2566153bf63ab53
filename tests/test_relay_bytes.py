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

from actors.providers.scripted import ScriptedProvider
from actors.relays import attach_relay
from actors.relays.redis_writer import _measured
from runtime import Agent, Host
from runtime import output as o
from runtime.errors import RelayTurnGone
from tests.support.redis import require_redis
from tests.support.services import RedisServer, ServiceUnavailable
from tests.test_relay import USAGE, opened, read_all, read_when_published

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


async def test_a_turn_waiting_for_a_paused_redis_holds_no_other_sessions_chunks(
    own_server: RedisServer,
) -> None:
    # Before: the publisher's handler awaited the big turn's room after each chunk, and
    # the small turn's chunks waited behind it on the bus: none reached the relay (its
    # writer was not even opened) until Redis answered again.
    big_agent = Agent(
        name="big", provider=ScriptedProvider(steps=[[BIG * DELTAS]], chunk_size=len(BIG))
    )
    small_agent = Agent(name="small", provider=ScriptedProvider(steps=[["hello"]]))
    async with opened(
        own_server.url, max_queue_bytes=BOUND, op_timeout=0.5, close_timeout=120,
        retry_max=0.2,
    ) as relay, Host.open(log_tap=False) as host:  # fmt: skip
        publisher = await attach_relay(host, relay)
        big = await host.open_session(big_agent, session_id="big")
        small = await host.open_session(small_agent, session_id="small")
        outs: dict[str, Any] = {}

        async def run(session: Any, text: str) -> None:
            async with session.stream(text) as out:
                outs[session.id] = out
                await out.collect()

        with paused(own_server), trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, big, "go")
                with trio.fail_after(30):  # the big turn comes to wait on the paused Redis
                    while not any(w.held >= BOUND for w in publisher.writers.values()):  # noqa: ASYNC110
                        await trio.sleep(0.05)
                await run(small, "hi")
                small_turn = outs["small"].turn_id
                with trio.fail_after(30):  # its end reached its writer, Redis paused still
                    while small_turn in publisher.writers or not any(  # noqa: ASYNC110
                        w.turn_id == small_turn for w in relay.live
                    ):
                        await trio.sleep(0.05)
                assert "big" in {w.session_id for w in relay.live}  # still waiting
                own_server.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        got_small = await read_when_published(relay, small_turn)
        got_big = await read_when_published(relay, outs["big"].turn_id)
    assert [c.text for c in got_small if type(c) is o.TextDelta] == ["hello"]
    assert "".join(c.text for c in got_big if type(c) is o.TextDelta) == BIG * DELTAS


async def test_a_published_burst_of_large_chunks_waits_within_the_bound(
    own_server: RedisServer,
) -> None:
    # Before: the turn's burst (8 MB, put without a wait while the inbox had room) sat
    # in the publisher's inbox, out of the writer's bound, while the handler waited.
    agent = Agent(
        name="big", provider=ScriptedProvider(steps=[[BIG * DELTAS]], chunk_size=len(BIG))
    )
    async with opened(
        own_server.url, max_queue_bytes=BOUND, op_timeout=0.5, close_timeout=120,
        retry_max=0.2,
    ) as relay, Host.open(log_tap=False) as host:  # fmt: skip
        publisher = await attach_relay(host, relay)
        session = await host.open_session(agent, session_id="big")
        with paused(own_server), trio.fail_after(120):
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    async with session.stream("go") as out:
                        await out.collect()

                nursery.start_soon(run)
                with trio.fail_after(30):  # the turn comes to wait on the paused Redis
                    while not any(w.held >= BOUND for w in publisher.writers.values()):  # noqa: ASYNC110
                        await trio.sleep(0.05)
                await trio.sleep(1.0)  # (it waits: nothing more comes)
                (writer,) = publisher.writers.values()
                assert writer.held < BOUND + len(BIG) + SLACK
                assert len(publisher.inbox) == 0
                own_server.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        got = await read_all(relay, writer.turn_id)
    assert "".join(c.text for c in got if type(c) is o.TextDelta) == BIG * DELTAS
