"""A takeover that finds no stream for its turn: Redis lost it, or the dead worker had
streamed nothing (a worker that died before its first flush, a claim whose answer a
PostgreSQL restart lost). The two look the same from Redis. When the takeover re-runs
the turn from step 0 (no step committed), its stream is the whole turn: a reader that
has shown nothing reads it live; one that had shown part of the turn is told it is lost
(never a splice). Re-running from a later step it writes a ``gap`` as before: the
committed steps are not in its stream. Real Redis (the test run's own), through the
proxy with no faults."""

from __future__ import annotations

from typing import Any

import pytest

from runtime import output as o
from tests.support.redis_proxy import scripted
from tests.test_relay_coalescing import USAGE
from tests.test_relay_proxy_attacks import checked_read, through_proxy


@pytest.fixture
def redis_url() -> str:
    from tests.support.redis import require_redis

    return require_redis()


def rerun(step: int) -> list[Any]:
    """A takeover's chunks re-running the turn from ``step``."""
    return [
        o.Start(message_id="m"),
        o.StepStart(step=step),
        o.TextStart(step=step, part_id="b"),
        o.TextDelta(step=step, part_id="b", text="again"),
        o.TextFinish(step=step, part_id="b"),
        o.StepFinish(step=step, finish_reason="stop", usage=USAGE),
        o.Finish(finish_reason="stop", usage=USAGE),
    ]


async def take_over(relay: Any, step: int) -> None:
    """As a worker's takeover does: ``start``, then asks what was shown of the step it
    re-runs before that step's chunks."""
    chunks = rerun(step)
    writer = relay.writer(session_id="s", turn_id="t", takeover=True)
    writer.append(chunks[0])
    assert await writer.shown(step) is None  # nothing streamed of it: no reset
    for chunk in chunks[1:]:
        writer.append(chunk)
    await writer.aclose()


async def test_a_takeover_from_step_0_with_no_stream_is_read_whole(redis_url: str) -> None:
    """Nothing lost, nothing told: a reader that has shown nothing gets the re-run as
    the turn (before: a ``gap``, the reader told the turn was lost and rebuilt from the
    store at its end)."""
    async with through_proxy(scripted({})) as (_, relay):
        await take_over(relay, 0)
        got, gone = await checked_read(relay, "t")
    assert not gone
    assert [c.type for c in got] == [c.type for c in rerun(0)]
    assert [c.seq for c in got] == list(range(2, 2 + len(got)))


async def test_a_client_that_saw_part_of_a_lost_stream_is_told_after_such_a_takeover(
    redis_url: str,
) -> None:
    """The same stream resumed after seq 3 (the client saw some of what Redis lost):
    told the turn is gone, not shown the re-run's chunks after seq 3 as a sequel."""
    async with through_proxy(scripted({})) as (_, relay):
        await take_over(relay, 0)
        got, gone = await checked_read(relay, "t", after_seq=3)
    assert gone and not got


async def test_a_takeover_from_a_later_step_with_no_stream_still_tells_of_the_loss(
    redis_url: str,
) -> None:
    """Re-running from step 2 (steps 0 and 1 committed, their chunks not in any stream):
    a reader is told the turn is lost, and rebuilds it from the store."""
    async with through_proxy(scripted({})) as (_, relay):
        await take_over(relay, 2)
        got, gone = await checked_read(relay, "t")
    assert gone and not got
