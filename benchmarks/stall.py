"""How long the Trio loop goes without serving a ready task (figure 3's stall rows).

Two views, both recorded while a level of figure 3 runs:

* the longest single task step (Trio's instrument API: from ``before_task_step`` to
  ``after_task_step``): a piece of code that holds the loop without yielding, e.g. an
  O(sessions) scan per event, a synchronous write, a long garbage collection inside it;
* the worst lateness of a task that sleeps 1 ms in a loop: how long a ready task waits
  for its turn, i.e. the longest scheduler batch (every task ready at its start steps
  once), which grows with the number of tasks ready at once as well as with any long step.
"""

from __future__ import annotations

import time
from typing import Any

import trio

TICK = 0.001
"""Seconds the sleeper sleeps; its lateness is measured past this."""


class StallWatch(trio.abc.Instrument):
    """Records the longest task step (and which task took it) and the sleeper's worst
    lateness, between :meth:`watching` entries."""

    def __init__(self) -> None:
        self.longest_step = 0.0
        self.longest_task = ""
        self.worst_lateness = 0.0
        self.longest_gc = 0.0
        self.longest_gc_generation = -1
        self.longest_step_without_gc = 0.0
        self.longest_task_without_gc = ""
        self.collections = [0, 0, 0]
        """Collections per generation: CPython 3.11 runs a full one whenever the objects
        that survived into generation 2 since the last grew by a quarter, so a burst of
        allocation can bring many; their count matters as much as each one's length."""
        self.collection_ms = [0.0, 0.0, 0.0]
        self.longest_gc_cpu = 0.0
        """This thread's CPU time in the longest collection: far below its wall time means
        the process waited for a core in the middle of it (a loaded machine)."""
        self.longest_step_cpu = 0.0
        self.longest_cpu_task = ""
        """The most CPU time (this thread's) one step took, collections in it included,
        and its task: on a loaded machine a step's wall time also counts the time the
        process waited for a core, which no change of this code shortens."""
        self._step_start = 0.0
        self._step_cpu_start = 0.0
        self._gc_start = 0.0
        self._gc_cpu_start = 0.0
        self._collected = False
        """Whether a collection ran inside the step in progress."""
        self._in_step = False
        """Whether a task step is in progress: a collection outside one (run by an
        instrument between steps, e.g. ``Host.open(gc_pacing=True)`` when the loop is
        idle) holds the loop all the same, and counts as a step of its own."""

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        """A ``gc.callbacks`` hook: the longest collection, and its generation."""
        if phase == "start":
            self._gc_start = time.perf_counter()
            self._gc_cpu_start = time.thread_time()
            self._collected = True
            return
        took = time.perf_counter() - self._gc_start
        cpu = time.thread_time() - self._gc_cpu_start
        generation = info["generation"]
        self.collections[generation] += 1
        self.collection_ms[generation] += took * 1e3
        if took > self.longest_gc:
            self.longest_gc, self.longest_gc_generation = took, generation
            self.longest_gc_cpu = cpu
        between = f"(generation {generation} collection between steps)"
        if not self._in_step and took > self.longest_step:
            self.longest_step, self.longest_task = took, between
        if not self._in_step and cpu > self.longest_step_cpu:
            self.longest_step_cpu, self.longest_cpu_task = cpu, between

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._in_step = True
        self._collected = False
        self._step_start = time.perf_counter()
        self._step_cpu_start = time.thread_time()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self._in_step = False
        took = time.perf_counter() - self._step_start
        cpu = time.thread_time() - self._step_cpu_start
        if cpu > self.longest_step_cpu:
            self.longest_step_cpu, self.longest_cpu_task = cpu, task.name
        if took > self.longest_step:
            self.longest_step, self.longest_task = took, task.name
        if not self._collected and took > self.longest_step_without_gc:
            self.longest_step_without_gc, self.longest_task_without_gc = took, task.name

    def reset(self) -> None:
        self.longest_step, self.longest_task, self.worst_lateness = 0.0, "", 0.0
        self.longest_gc, self.longest_gc_generation = 0.0, -1
        self.collections, self.collection_ms, self.longest_gc_cpu = [0, 0, 0], [0.0] * 3, 0.0
        self.longest_step_without_gc, self.longest_task_without_gc = 0.0, ""
        self.longest_step_cpu, self.longest_cpu_task = 0.0, ""
        self._collected = False
        self._step_start = time.perf_counter()  # the step in progress counts from here
        self._step_cpu_start = time.thread_time()

    def snapshot(self) -> dict[str, Any]:
        return {
            "longest_step_ms": self.longest_step * 1e3,
            "longest_step_task": self.longest_task,
            "worst_lateness_ms": self.worst_lateness * 1e3,
            "longest_step_without_gc_ms": self.longest_step_without_gc * 1e3,
            "longest_step_without_gc_task": self.longest_task_without_gc,
            "longest_step_cpu_ms": self.longest_step_cpu * 1e3,
            "longest_step_cpu_task": self.longest_cpu_task,
            "longest_gc_ms": self.longest_gc * 1e3,
            "longest_gc_generation": self.longest_gc_generation,
            "longest_gc_cpu_ms": self.longest_gc_cpu * 1e3,
            "collections": list(self.collections),
            "collection_ms": [round(ms, 1) for ms in self.collection_ms],
        }

    async def sleeper(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Sleep :data:`TICK` in a loop, recording how late each wake-up is."""
        task_status.started()
        while True:
            start = time.perf_counter()
            await trio.sleep(TICK)
            late = time.perf_counter() - start - TICK
            if late > self.worst_lateness:
                self.worst_lateness = late


def worst_of(*seen: dict[str, Any]) -> dict[str, Any]:
    """The worst of several :meth:`StallWatch.snapshot` s (phases of one measurement)."""
    step = max(seen, key=lambda s: s["longest_step_ms"])
    collection = max(seen, key=lambda s: s["longest_gc_ms"])
    own = max(seen, key=lambda s: s["longest_step_without_gc_ms"])
    cpu = max(seen, key=lambda s: s["longest_step_cpu_ms"])
    return {
        **step,
        "longest_step_without_gc_ms": own["longest_step_without_gc_ms"],
        "longest_step_without_gc_task": own["longest_step_without_gc_task"],
        "longest_step_cpu_ms": cpu["longest_step_cpu_ms"],
        "longest_step_cpu_task": cpu["longest_step_cpu_task"],
        "worst_lateness_ms": max(s["worst_lateness_ms"] for s in seen),
        "longest_gc_ms": collection["longest_gc_ms"],
        "longest_gc_generation": collection["longest_gc_generation"],
        "longest_gc_cpu_ms": collection["longest_gc_cpu_ms"],
        "collections": [sum(s["collections"][g] for s in seen) for g in range(3)],
        "collection_ms": [round(sum(s["collection_ms"][g] for s in seen), 1) for g in range(3)],
    }
