"""Where an approved turn's extra goes, embedded on SQLite: saves, version queries, log
lines and everything else, in microseconds per turn.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.approval_breakdown [ROUNDS]`` (default 200) from the tree to
measure, e.g. ``PYTHONPATH=/path/to/tree``. The same two sides as
:mod:`benchmarks.bench_approval`'s embedded part (a plain turn; the same turn suspended,
decided and resumed at once: ``decide`` then ``resume()``), and a third, **respond**:
the same turn suspended, then ``session.respond(id, approved=True)`` (what an
application that decides and resumes in one call runs; since branch ``apperf`` it makes
no version query). The three alternate (each first in turn), each after a full
collection, with the log tap at info into a file. The store's ``save``, ``version`` and
``load`` are wrapped on the instance (where the persister and the session find them) and
so is the log tap's ``handle``: each side's time in them is summed per turn; "everything
else" is the turn's time less those. Times are the event loop thread's CPU time
(:data:`_clock`). A wrapped call counts only the steps of its own task
(:class:`_TaskClock`): a call that yields (a store call takes the store's lock, which
checkpoints) lets other tasks run meanwhile, the log tap writing lines above all, and
that time is theirs, not the call's. Counting it in the call, as this tool first did,
put a third of the log lines' time and the actors' work in "saves" and "version queries"
twice (the same time counted again as log lines, and so taken out of "everything else").
Printed: medians per side and each side's difference from the plain turn, with call
counts; then the same CPU time by task (each actor's, the caller's, the supervisors'
that start and stop the actors), which says whose work the extra is. Compare runs side
by side, never one run with another day's.
"""

from __future__ import annotations

import collections
import gc
import itertools
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_approval import _agents, _check
from benchmarks.common import PROMPT, LogSink, count_argument

WARMUP = 20
_clock = time.thread_time
"""CPU time of the event loop's thread, where everything embedded runs (SQLite's small
writes and reads included): steadier than wall time on a loaded machine, where a side
descheduled for a few milliseconds would count them as its own."""

_spent: collections.Counter[str] = collections.Counter()
_calls: collections.Counter[str] = collections.Counter()
Sample = tuple[float, dict[str, float], dict[str, int], dict[str, float]]
CALLER = "the caller"
"""The task that runs the turns: ``session.run``, ``decide``, entering ``resume()`` and
reading the streams (``respond`` runs its continuation in this task too)."""


class _TaskClock(trio.abc.Instrument):
    """CPU time per task, summed over the task's steps: what a wrapped call of that task
    spends itself, however many other tasks ran while it waited. Also summed by who runs
    the task (:attr:`by_owner`): an actor's class (a task the host supervises it in),
    :data:`CALLER`, else the task's function."""

    def __init__(self) -> None:
        self.spent: dict[trio.lowlevel.Task, float] = {}
        self.step_began = 0.0
        self.caller: trio.lowlevel.Task | None = None
        self.by_owner: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._owners: dict[trio.lowlevel.Task, str] = {}

    def restart(self) -> None:
        """Start counting by owner afresh, the step in progress from now."""
        self.by_owner.clear()
        self.step_began = _clock()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.step_began = _clock()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        spent = _clock() - self.step_began
        self.spent[task] = self.spent.get(task, 0.0) + spent
        owner = self._owners.get(task)
        if owner is None:
            owner = self._owners[task] = self._owner(task)
        self.by_owner[owner] += spent

    def _owner(self, task: trio.lowlevel.Task) -> str:
        if task is self.caller:
            return CALLER
        frame = getattr(task.coro, "cr_frame", None)
        actor = None if frame is None else frame.f_locals.get("actor")
        return type(actor).__name__ if actor is not None else task.name.rsplit(".", 1)[-1]

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.spent.pop(task, None)
        self._owners.pop(task, None)

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
    """``rounds`` measured rounds of each side: (CPU seconds, seconds per part, calls,
    seconds by task)."""
    from actors.log_tap import LogTap
    from runtime import Host

    LogTap.handle = _timed("log lines", LogTap.handle)  # type: ignore[method-assign]
    agents = _agents()
    tags = itertools.count()
    _tasks.caller = trio.lowlevel.current_task()
    out: dict[str, list[Sample]] = {"plain": [], "approved": [], "respond": []}
    async with Host.open(store=str(Path(directory) / "breakdown.db")) as host:
        store = host.store
        for name in ("save", "version", "load"):
            setattr(store, name, _timed(f"store.{name}", getattr(store, name)))

        async def timed(agent: str, tag: str, body: Callable[[Any], Awaitable[Any]]) -> Sample:
            """One turn of a fresh session, timed: ``body(session)`` runs it and returns
            the check of its end (run after the clock stopped)."""
            session = await host.open_session(agents[agent], f"{tag}-{next(tags)}")
            gc.collect()
            _spent.clear()
            _calls.clear()
            _tasks.restart()
            t0 = _clock()
            check = await body(session)
            seconds = _clock() - t0
            by_owner = dict(_tasks.by_owner)
            check()
            await session.close()
            return seconds, dict(_spent), dict(_calls), by_owner

        async def run_plain(session: Any) -> Callable[[], None]:
            result = await session.run(PROMPT)
            return lambda: _check(result, "stop", 2, "plain")

        async def decide_then_resume(session: Any) -> Callable[[], None]:
            waiting = await session.run(PROMPT)
            await session.decide(waiting.pending[0].approval_id, approved=True)
            async with session.resume() as stream:
                async for _ in stream:
                    pass
            return lambda: _check(stream.result, "stop", 2, "resume")

        async def respond(session: Any) -> Callable[[], None]:
            waiting = await session.run(PROMPT)
            result = await session.respond(waiting.pending[0].approval_id, approved=True)
            assert result is not None
            return lambda: _check(result, "stop", 2, "respond")

        sides = {
            "plain": partial(timed, "plain", "p", run_plain),
            "approved": partial(timed, "asks", "a", decide_then_resume),
            "respond": partial(timed, "asks", "r", respond),
        }
        order = list(sides)
        for i in range(WARMUP + rounds):
            for side in order[i % 3 :] + order[: i % 3]:  # each side first in turn
                sample = await sides[side]()
                if i >= WARMUP:
                    out[side].append(sample)
    return out


def report(samples: dict[str, list[Sample]]) -> None:
    def us(values: list[float]) -> float:
        return statistics.median(values) * 1e6

    plain = samples["plain"]
    others = [k for k in samples if k != "plain"]
    labels = sorted({k for side in samples.values() for _, spent, _, _ in side for k in spent})
    head = "".join(f" {k:>9s} {'extra':>7s}" for k in others)
    print(f"{'':18s} {'plain':>9s}{head}   calls {'/'.join(['plain', *others])}")
    for k in labels:
        p = us([s.get(k, 0.0) for _, s, _, _ in plain])
        row = "".join(
            f" {a:9.0f} {a - p:+7.0f}"
            for a in (us([s.get(k, 0.0) for _, s, _, _ in samples[o]]) for o in others)
        )
        calls = "/".join(
            f"{statistics.median([c.get(k, 0) for _, _, c, _ in samples[side]]):g}"
            for side in ("plain", *others)
        )
        print(f"{k:18s} {p:9.0f}{row}   {calls}")

    def line(label: str, value: Callable[[Sample], float]) -> None:
        p = us([value(s) for s in plain])
        row = "".join(
            f" {a:9.0f} {a - p:+7.0f}" for a in (us([value(s) for s in samples[o]]) for o in others)
        )
        print(f"{label:18s} {p:9.0f}{row}")

    line("everything else", lambda s: s[0] - sum(s[1].values()))
    line("total", lambda s: s[0])
    print(f"\n{'by task':18s} {'plain':>9s}{head}")
    owners = {k for side in samples.values() for *_, by_owner in side for k in by_owner}
    rows = []
    for k in owners:
        p = us([o.get(k, 0.0) for *_, o in plain])
        values = [us([o.get(k, 0.0) for *_, o in samples[side]]) for side in others]
        rows.append((values[0] - p, k, p, values))
    for _, k, p, values in sorted(rows, reverse=True):
        row = "".join(f" {a:9.0f} {a - p:+7.0f}" for a in values)
        print(f"{k:18s} {p:9.0f}{row}")


def main() -> None:
    rounds = count_argument(200, __doc__)
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            samples = trio.run(measure, rounds, directory, instruments=[_tasks])
        finally:
            sink.close()
    report(samples)


if __name__ == "__main__":
    main()
