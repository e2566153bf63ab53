"""A Trio autojump clock that does not jump while a worker thread runs.

Trio's ``MockClock(autojump_threshold=0)`` jumps virtual time to the next deadline as
soon as every task is waiting, and a task waiting for :func:`trio.to_thread.run_sync`
counts as waiting: during one SQLite call (a millisecond of real time) the clock can
pass every pending deadline. A test then sees a store call "take" 16 virtual seconds,
the runtime's shutdown and save bounds expire in the middle of it, and the outcome
depends on how fast the thread was (the flaky
``test_host_shutdown_cancels_running_turns_and_saves_them``). The runtime's bounds are
right for real time, where a store call does not outlast them by luck; this clock makes
virtual time honest about threads, so those tests are deterministic.
"""

from __future__ import annotations

import trio
from trio.testing import MockClock


def thread_aware_autojump_clock() -> MockClock:
    """A ``MockClock(autojump_threshold=0)`` whose autojump holds off while a worker
    thread of the default limiter (any ``trio.to_thread.run_sync`` without a limiter of
    its own) runs: virtual time passes only when the program is idle, not while it waits
    for a thread, and jumps as usual once the thread's result is back.

    ``MockClock`` cannot be subclassed (Trio marks it final) and Trio's run loop only
    autojumps a ``MockClock``, so the instance's ``_autojump`` (what the run loop calls
    when it is idle) is wrapped instead. While it holds off, the loop polls for the
    thread's result without sleeping; threads here are short store calls."""
    clock = MockClock(autojump_threshold=0)
    jump = clock._autojump
    limiter = trio.to_thread.current_default_thread_limiter

    def autojump_unless_a_thread_runs() -> None:
        if not limiter().borrowed_tokens:
            jump()

    clock._autojump = autojump_unless_a_thread_runs  # type: ignore[method-assign]
    return clock
