"""What the Redis relay's flusher holds while it sleeps between pipelines."""

from __future__ import annotations

import gc
import weakref

import trio

from tests.test_relay import opened, redis_url, text_turn  # noqa: F401 - redis_url: a fixture


async def test_a_closed_writer_is_not_held_by_the_flusher_asleep_after_its_last_flush(
    redis_url: str,  # noqa: F811
) -> None:
    # The flusher's loop kept the last pipeline's jobs (and so their writers, each with
    # its queue and turn) in a local while it slept until the next flush: a worker's last
    # turn's writer outlived its turn until another turn wrote (the worker leak test saw
    # one writer and one job grown, now and then, in a full suite).
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        writer.extend(text_turn(["hello"]))
        with trio.fail_after(30):
            await writer.aclose()
        gone = weakref.ref(writer)
        del writer
        await trio.sleep(0.05)  # (the flusher back asleep, waiting for the next flush)
        gc.collect()
        assert gone() is None
