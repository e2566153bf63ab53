"""The test suite's autojump clock (tests/support/clock.py): virtual time waits for
worker threads, so a store call cannot let every pending timeout expire."""

from __future__ import annotations

import time

import trio


async def test_virtual_time_does_not_pass_while_a_worker_thread_runs(autojump_clock):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 5)  # a pending deadline the clock could jump to
        await trio.to_thread.run_sync(time.sleep, 0.05)
        assert trio.current_time() == 0
        nursery.cancel_scope.cancel()


async def test_virtual_time_still_jumps_once_the_thread_is_back(autojump_clock):
    await trio.to_thread.run_sync(time.sleep, 0.01)
    await trio.sleep(5)
    assert trio.current_time() == 5
