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
