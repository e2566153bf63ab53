"""Where an approved turn's extra goes, embedded on SQLite: saves, version queries, log
lines and everything else, in microseconds per turn.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.approval_breakdown [ROUNDS]`` (default 200) from the tree to
measure, e.g. ``PYTHONPATH=/path/to/tree``. The same two sides as
:mod:`benchmarks.bench_approval`'s embedded part (a plain turn; the same turn suspended,
decided and resumed at once), alternated, each after a full collection, with the log tap
at info into a file. The store's ``save``, ``version`` and ``load`` are wrapped on the
instance (where the persister and the session find them) and so is the log tap's
``handle``: each side's time in them is summed per turn; "everything else" is the turn's
time less those. Times are the event loop thread's CPU time (:data:`_clock`). A wrapped
call counts only the steps of its own task (:class:`_TaskClock`): a call that yields
(a store call takes the store's lock, which checkpoints) lets other tasks run meanwhile,
the log tap writing lines above all, and that time is theirs, not the call's. Counting it
in the call, as this tool first did, put a third of the log lines' time and the actors'
work in "saves" and "version queries" twice (the same time counted again as log lines,
and so taken out of "everything else"). Printed: medians per side and their difference,
with call counts. Compare runs side by side, never one run with another day's.
"""

from __future__ import annotations

import collections
import gc
import itertools
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_approval import _agents, _check
from benchmarks.common import PROMPT, LogSink

WARMUP = 20
_clock = time.thread_time
"""CPU time of the event loop's thread, where everything embedded runs (SQLite's small
writes and reads included): steadier than wall time on a loaded machine, where a side
descheduled for a few milliseconds would count them as its own."""

_spent: collections.Counter[str] = collections.Counter()
_calls: collections.Counter[str] = collections.Counter()
Sample = tuple[float, dict[str, float], dict[str, int]]


class _TaskClock(trio.abc.Instrument):
    """CPU time per task, summed over the task's steps: what a wrapped call of that task
    spends itself, however many other tasks ran while it waited."""

    def __init__(self) -> None:
        self.spent: dict[trio.lowlevel.Task, float] = {}
        self.step_began = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.step_began = _clock()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.spent[task] = self.spent.get(task, 0.0) + _clock() - self.step_began

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.spent.pop(task, None)

    def now(self) -> float:
        """The current task's CPU time so far, the step it is in included."""
        task = trio.lowlevel.current_task()
        return self.spent.get(task, 0.0) + _clock() - self.step_began


_tasks = _TaskClock()


def _timed(label: str, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = _tasks.now()
        try:
            return await fn(*args, **kwargs)
        finally:
            _spent[label] += _tasks.now() - t0
            _calls[label] += 1

    return timed


async def measure(rounds: int, directory: str) -> dict[str, list[Sample]]:
    """``rounds`` measured rounds of each side: (wall seconds, seconds per part, calls)."""
    from actors.log_tap import LogTap
    from runtime import Host

    LogTap.handle = _timed("log lines", LogTap.handle)  # type: ignore[method-assign]
    agents = _agents()
    tags = itertools.count()
    out: dict[str, list[Sample]] = {"plain": [], "approved": []}
    async with Host.open(store=str(Path(directory) / "breakdown.db")) as host:
        store = host.store
        for name in ("save", "version", "load"):
            setattr(store, name, _timed(f"store.{name}", getattr(store, name)))

        async def plain() -> Sample:
            session = await host.open_session(agents["plain"], f"p-{next(tags)}")
            gc.collect()
            _spent.clear()
            _calls.clear()
            t0 = _clock()
            result = await session.run(PROMPT)
            seconds = _clock() - t0
            _check(result, "stop", 2, "plain")
            await session.close()
            return seconds, dict(_spent), dict(_calls)

        async def approved() -> Sample:
            session = await host.open_session(agents["asks"], f"a-{next(tags)}")
            gc.collect()
            _spent.clear()
            _calls.clear()
            t0 = _clock()
            waiting = await session.run(PROMPT)
            await session.decide(waiting.pending[0].approval_id, approved=True)
            async with session.resume() as stream:
                async for _ in stream:
                    pass
            seconds = _clock() - t0
            _check(stream.result, "stop", 2, "resume")
            await session.close()
            return seconds, dict(_spent), dict(_calls)

        for i in range(WARMUP + rounds):
            for side in ("plain", "approved") if i % 2 else ("approved", "plain"):
                sample = await (plain() if side == "plain" else approved())
                if i >= WARMUP:
                    out[side].append(sample)
    return out


def report(samples: dict[str, list[Sample]]) -> None:
    def us(values: list[float]) -> float:
        return statistics.median(values) * 1e6

    plain, approved = samples["plain"], samples["approved"]
    labels = sorted({k for side in samples.values() for _, spent, _ in side for k in spent})
    print(f"{'':18s} {'plain':>9s} {'approved':>9s} {'extra':>9s}   calls plain/approved")
    for k in labels:
        p = us([s.get(k, 0.0) for _, s, _ in plain])
        a = us([s.get(k, 0.0) for _, s, _ in approved])
        cp = statistics.median([c.get(k, 0) for _, _, c in plain])
        ca = statistics.median([c.get(k, 0) for _, _, c in approved])
        print(f"{k:18s} {p:9.0f} {a:9.0f} {a - p:+9.0f}   {cp:g}/{ca:g}")
    rest_p = us([t - sum(s.values()) for t, s, _ in plain])
    rest_a = us([t - sum(s.values()) for t, s, _ in approved])
    print(f"{'everything else':18s} {rest_p:9.0f} {rest_a:9.0f} {rest_a - rest_p:+9.0f}")
    total_p, total_a = us([t for t, _, _ in plain]), us([t for t, _, _ in approved])
    print(f"{'total':18s} {total_p:9.0f} {total_a:9.0f} {total_a - total_p:+9.0f}")


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            samples = trio.run(measure, rounds, directory, instruments=[_tasks])
        finally:
            sink.close()
    report(samples)


if __name__ == "__main__":
    main()
