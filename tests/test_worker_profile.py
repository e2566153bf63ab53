"""What ``benchmarks.worker_profile`` counts of the event loop's rounds (issue 24 goal 3):
the rounds that could block, the rounds of each window of turns, the context switches."""

from __future__ import annotations

import time

import trio
import trio.testing

from benchmarks import worker_profile


async def _counted(counter: worker_profile.CpuByTask, work: object) -> None:
    trio.lowlevel.add_instrument(counter)
    counter.on = True
    try:
        await work()  # type: ignore[operator]
    finally:
        counter.on = False
        trio.lowlevel.remove_instrument(counter)


async def test_a_round_with_nothing_runnable_counts_as_one_that_could_block() -> None:
    """A task alone that waits for a thread leaves the loop nothing to run: each wait is
    a round whose I/O wait has a timeout (it could block); a bare checkpoint is a round
    that could not (another task, the checkpointing one, is runnable). (A thread, not a
    ``trio.sleep(0.001)``: on a loaded machine the sleep's deadline had passed by the
    loop's next round, whose wait then had no timeout: 2 rounds that could block of 3.)"""
    counter = worker_profile.CpuByTask()

    seen: list[tuple[int, int]] = []

    async def work() -> None:
        for _ in range(3):
            await trio.to_thread.run_sync(time.sleep, 0.001)
        seen.append((counter.rounds, counter.blocked))
        for _ in range(5):
            await trio.lowlevel.checkpoint()

    await _counted(counter, work)
    [(rounds, blocked)] = seen
    assert blocked >= 3  # an early wake-up of the wait is one more
    assert counter.blocked == blocked  # the checkpoints' rounds could not block
    assert counter.rounds == rounds + 5


async def test_the_rounds_of_each_window_of_turns_are_kept_in_order() -> None:
    """``turn_done`` marks the rounds at each turn's end; ``windows`` gives the rounds a
    turn of each full window, in order (the mode a run was in, window by window)."""
    counter = worker_profile.CpuByTask()

    async def work() -> None:
        for turn in range(5):
            for _ in range(1 if turn < 2 else 3):  # two cheap turns, then three dear
                await trio.lowlevel.checkpoint()
            counter.turn_done()

    await _counted(counter, work)
    assert counter.marks[-1] == counter.rounds
    # The first window (2 turns) took 2 of the rounds a checkpoint is, the second 6.
    first, second = counter.windows(2)
    assert second == 3 * first
    assert len(counter.windows(2)) == 2  # the fifth turn does not fill a window


def test_the_context_switches_of_the_loop_and_of_the_other_threads_are_read_apart() -> None:
    """A thread that sleeps counts voluntary switches under ``threads``, not ``loop``."""
    import threading
    import time

    slept, done = threading.Event(), threading.Event()

    def sleeper() -> None:
        for _ in range(20):
            time.sleep(0.0005)
        slept.set()
        done.wait()

    thread = threading.Thread(target=sleeper, daemon=True)
    thread.start()
    slept.wait()
    try:
        got = worker_profile.switches()  # read while it lives: its counts end with it
    finally:
        done.set()
        thread.join()
    assert set(got) == {"loop", "threads"}
    assert got["threads"][0] >= 20  # its sleeps, each a voluntary switch


def test_pinning_puts_every_thread_of_the_process_on_the_cpus_given() -> None:
    """``--pin``: the threads running now and those they start later run on those CPUs."""
    import os
    import threading

    was = os.sched_getaffinity(0)
    cpu = min(was)
    seen: list[set[int]] = []
    try:
        worker_profile.pin_threads({cpu})
        thread = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        thread.start()
        thread.join()
        assert os.sched_getaffinity(0) == {cpu}
        assert seen == [{cpu}]
    finally:
        worker_profile.pin_threads(was)
