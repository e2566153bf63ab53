"""A relay read cancelled while it waits for the turn's next entries gives its Redis
connection's place back.

A front end reads a worker's turn live with a blocking ``XREAD``; a client that goes away
mid-turn cancels that read. coredis drops the connection a cancelled blocking command
was sent on, and its pool (64 places) never gave the dropped connection's place back:
after 64 such disconnects every command of the relay's client waited for a place that
never came: every stream, resume and stop of the front end hung, then failed ``no reply``
(benchmarks/journal/workers.md, "leakworker"). The test run's own Redis.
"""

from __future__ import annotations

import pytest
import trio

from actors.relays import RedisRelay
from runtime import output as o
from runtime.chunks import Usage
from tests.support.redis import require_redis, unique_prefix

POOL = 64
"""coredis's default number of connections a client's pool holds."""


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def _first_chunk_then_cancelled(relay: RedisRelay, turn_id: str) -> None:
    """Read the turn's first chunk, then wait in the live read until cancelled."""
    async with trio.open_nursery() as nursery:
        started = trio.Event()

        async def read() -> None:
            async for _ in relay.read(turn_id):
                started.set()

        nursery.start_soon(read)
        await started.wait()
        await trio.sleep(0.01)  # (in the blocking read now)
        nursery.cancel_scope.cancel()


async def test_reads_cancelled_while_they_wait_leave_the_relay_able_to_read(
    redis_url: str,
) -> None:
    async with RedisRelay.open(
        redis_url, prefix=unique_prefix(), op_timeout=1.0, retry_for=1.0
    ) as relay:
        live = relay.writer(session_id="s", turn_id="live", fresh=True)
        live.append(o.Start(message_id="m1"))
        done = relay.writer(session_id="t", turn_id="done", fresh=True)
        done.append(o.Start(message_id="m2"))
        done.append(o.Finish(finish_reason="stop", usage=Usage()))
        await done.aclose()
        with trio.fail_after(60):
            await live.flushed()
            for _ in range(POOL + 6):
                await _first_chunk_then_cancelled(relay, "live")
            read = [type(chunk) for chunk in [c async for c in relay.read("done")]]
        await live.aclose()
    assert read == [o.Start, o.Finish]
