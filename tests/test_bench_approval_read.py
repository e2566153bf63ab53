"""``benchmarks.bench_approval``'s relay reader (the workers' ``overhead_read`` row): a
turn read as a worker deployment's front end streams it, from a real Redis."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.relays import RedisRelay
from benchmarks import bench_approval
from runtime import output as o
from runtime.chunks import Usage
from runtime.errors import RelayTurnGone
from tests.support.redis import require_redis, unique_prefix

USAGE = Usage(input_tokens=1, output_tokens=1, total_tokens=2)


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def part(text: str, finish: str) -> list[Any]:
    """One step's chunks, a turn's (or a continuation's) start to its ``finish``."""
    return [
        o.Start(message_id="m1", turn_id="t", session_id="s"),
        o.StepStart(step=0),
        o.TextStart(step=0, part_id="p"),
        o.TextDelta(step=0, part_id="p", text=text),
        o.TextFinish(step=0, part_id="p"),
        o.StepFinish(step=0, finish_reason=finish, usage=USAGE),
        o.Finish(finish_reason=finish, usage=USAGE),
    ]


async def write(relay: Any, chunks: list[Any], **close: Any) -> None:
    writer = relay.writer(session_id="s", turn_id="t", takeover=bool(close.pop("more", False)))
    for chunk in chunks:
        writer.append(chunk)
    await writer.aclose(**close)


async def test_a_read_begun_before_the_turn_has_a_stream_gets_the_whole_turn(
    redis_url: str,
) -> None:
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        waiting = trio.Event()
        xread = relay.client.xread

        def watched(streams: Any, **kwargs: Any) -> Any:
            if list(streams.values()) == ["0-0"]:  # the reader waits for the first entry
                waiting.set()
            return xread(streams, **kwargs)

        relay.client.xread = watched
        got: list[Any] = []

        async def read() -> None:
            got.extend(await bench_approval._read_turn(relay, "t"))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await waiting.wait()  # no stream yet: written only now
                await write(relay, part("all", "stop"))
    assert [c.type for c in got] == [c.type for c in part("all", "stop")]


async def test_a_read_ends_at_the_pause_and_one_after_it_reads_the_continuation(
    redis_url: str,
) -> None:
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        await write(relay, part("asks", "awaiting-input"), paused=True)
        with trio.fail_after(10):
            first = await bench_approval._read_turn(relay, "t")
            await write(relay, part("goes on", "stop"), more=True)
            rest = await bench_approval._read_turn(relay, "t", after_pauses=1)
    assert [c.text for c in first if type(c) is o.TextDelta] == ["asks"]
    assert first[-1].finish_reason == "awaiting-input"
    assert [c.text for c in rest if type(c) is o.TextDelta] == ["goes on"]
    assert type(rest[0]) is o.Start and rest[-1].finish_reason == "stop"


async def test_a_stream_the_relay_refuses_is_raised_not_waited_on(redis_url: str) -> None:
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        await relay.client.xadd(relay.turn_key("t"), {"junk": "1"}, identifier="5-1")
        with trio.fail_after(10), pytest.raises(RelayTurnGone):
            await bench_approval._read_turn(relay, "t")
