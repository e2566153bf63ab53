"""Counting the scheduler's work: task steps and rounds (issue 24 goal 1).

A task step is one resumption of a task; a round of the scheduler runs the tasks made
runnable in the one before. The tests count them, never time them: a hop saved is a
step (and often a round) less whatever the machine's load.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio


class Steps(trio.abc.Instrument):
    """Task steps per task, and scheduler rounds, while installed."""

    def __init__(self) -> None:
        self.by_task: collections.Counter[Any] = collections.Counter()
        self.rounds = 0
        self._labels: dict[Any, str] = {}

    def before_task_step(self, task: Any) -> None:
        self.by_task[task] += 1
        if task not in self._labels:
            frame = getattr(task.coro, "cr_frame", None)
            actor = frame.f_locals.get("actor") if frame is not None else None
            self._labels[task] = getattr(actor, "name", None) or task.name

    def by_actor(self) -> collections.Counter[str]:
        """The steps per actor (its supervising task's, by the actor's name; any other
        task by its own name)."""
        out: collections.Counter[str] = collections.Counter()
        for task, n in self.by_task.items():
            out[self._labels[task]] += n
        return out

    def before_io_wait(self, timeout: float) -> None:
        self.rounds += 1

    def of(self, task: Any) -> int:
        """The steps ``task`` took."""
        return self.by_task[task]

    def named(self, part: str) -> int:
        """The steps of the tasks whose name holds ``part``."""
        return sum(n for task, n in self.by_task.items() if part in task.name)


@contextmanager
def counted() -> Iterator[Steps]:
    """A :class:`Steps` instrument, installed for the block."""
    steps = Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        yield steps
    finally:
        trio.lowlevel.remove_instrument(steps)


class Scopes:
    """Trio cancel scopes entered while installed, by the file that entered them (the
    nearest frame outside Trio and ``contextlib``): a scope costs ~3.5 µs of CPU to enter
    and leave, one with a deadline more (issue 24 goal 3). Counted, never timed."""

    def __init__(self) -> None:
        self.by_file: collections.Counter[str] = collections.Counter()

    def total(self) -> int:
        return sum(self.by_file.values())

    def of(self, part: str) -> int:
        """The scopes entered from files whose path holds ``part``."""
        return sum(n for path, n in self.by_file.items() if part in path)


@contextmanager
def scopes_counted(task: Any = None) -> Iterator[Scopes]:
    """A :class:`Scopes` count of the cancel scopes entered in the block: every task's, or
    ``task``'s alone."""
    import sys

    scopes = Scopes()
    enter = trio.CancelScope.__enter__

    def counting(self: trio.CancelScope) -> trio.CancelScope:
        if task is not None and trio.lowlevel.current_task() is not task:
            return enter(self)
        frame = sys._getframe(1)
        while frame is not None and (
            "/trio/" in frame.f_code.co_filename or "contextlib" in frame.f_code.co_filename
        ):
            frame = frame.f_back
        scopes.by_file[frame.f_code.co_filename if frame is not None else "?"] += 1
        return enter(self)

    trio.CancelScope.__enter__ = counting  # type: ignore[method-assign]
    try:
        yield scopes
    finally:
        trio.CancelScope.__enter__ = enter  # type: ignore[method-assign]
