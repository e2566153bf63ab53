"""Garbage collection paced by the Trio loop instead of by allocation counts (opt-in:
``Host.open(gc_pacing=True)``, docs/embedding.md "Garbage collection in a large host").

Why: CPython 3.11's collector is not incremental, and in a host with thousands of turns
in flight its own triggers make long pauses of the loop:

* a full collection runs whenever the objects that survived into the oldest generation
  grew by a quarter, so a burst of turns brings several, each walking every turn in
  flight (10,000 turns: about 1.7 million objects, 0.5-3 s);
* a young collection runs when *allocations minus deallocations* pass 700, so while old
  objects die (turns ending) as fast as new ones are made, the young generation itself
  grows to hundreds of thousands of objects before one runs (100-300 ms each, measured).

The pacer turns the automatic collector off and runs the same collections itself, from
Trio's instrument API: a young one every ``steps`` task steps (so each walks what a
hundred steps left alive, a few milliseconds), a middle one every ``middle_every`` of
those, and a full one only at a quiet moment once one is due. Due, as CPython's own
rule: ``full_after`` middle collections since the last full one *and* the heap grew by
a quarter since (CPython counts the objects promoted into its oldest generation, which
it does not expose; the pacer reads the memory blocks allocated,
``sys.getallocatedblocks()``). Quiet: the loop has no task ready and at most
``quiet_tasks`` tasks live beyond those the host had once started (its services, and
the application's own tasks then; an idle session's actors rest and hold no task, so
few tasks means few turns in flight: a turn runs three or four, and a full collection
pauses every one of them); a loop that waits while ten thousand turns wait for their
store is not quiet. Once due with ``full_cap`` middle collections gone by and no quiet moment, one
runs anyway (so cyclic garbage stays bounded on a host that is never quiet; that one is
a pause like CPython's). Every collection still runs, and no garbage is kept for ever.

One more thing a pacing host does: once it has started, it freezes the heap as it stands
(``gc.freeze()`` after a full collection: the modules, functions and classes imported so
far, the host's own services, whatever the application holds at that moment; about
55,000 tracked objects in the benchmarks' host), so no collection walks it while the
host is open; each full collection is that much shorter. Frozen objects are never
collected, so the heap is unfrozen (``gc.unfreeze()``: back into the oldest generation,
collected as usual) when the last pacing host closes: cyclic garbage among them waits
for that at most. Sessions and turns are never frozen. An application that froze the
heap itself (``gc.get_freeze_count()`` not zero) keeps its freeze: the pacer then
neither freezes nor unfreezes.
"""

from __future__ import annotations

import gc
import sys

import trio


class GcPacer(trio.abc.Instrument):
    """A Trio instrument that runs the process's garbage collections (see the module)."""

    def __init__(
        self,
        *,
        steps: int = 100,
        middle_every: int = 10,
        full_after: int = 10,
        full_cap: int = 1000,
        quiet_tasks: int = 16,
    ) -> None:
        self.steps = steps
        self.middle_every = middle_every
        self.full_after = full_after
        self.full_cap = full_cap
        self.quiet_tasks = quiet_tasks
        self._blocks = sys.getallocatedblocks()
        """Memory blocks allocated after the last full collection."""
        self._checked = -1
        """The middle collection count at the last look at the heap's growth."""
        self._steps = 0
        self._young = 0
        self._middle = 0
        """Middle collections since the last full one."""
        self._was_enabled = True
        self._users = 0
        self._froze = False
        """Whether :meth:`host_started` froze the heap (and release must unfreeze it)."""
        self._resting_tasks = 0
        """Tasks alive when the (first) pacing host had started: the loop at rest."""

    def acquire(self) -> None:
        """Start pacing in the current Trio run (counted: the last :meth:`release` stops)."""
        self._users += 1
        if self._users == 1:
            self._was_enabled = gc.isenabled()
            gc.disable()
            trio.lowlevel.add_instrument(self)

    def release(self) -> None:
        """Stop pacing once every :meth:`acquire` is released; the collector's automatic
        state goes back to what it was."""
        self._users -= 1
        if self._users == 0:
            trio.lowlevel.remove_instrument(self)
            if self._froze:
                self._froze = False
                gc.unfreeze()
            if self._was_enabled:
                gc.enable()

    def host_started(self) -> None:
        """A pacing host has started its services: note the tasks alive (the loop at
        rest, see the module's "quiet") and move the heap as it stands (after a full
        collection, so no garbage) out of every collection's walk until the last
        :meth:`release`. Once per pacing: a second host's call, or a heap the application
        froze, freezes nothing."""
        self._resting_tasks = max(
            self._resting_tasks, trio.lowlevel.current_statistics().tasks_living
        )
        if self._froze or gc.get_freeze_count():
            return
        self._collect_full()
        gc.freeze()
        self._froze = True

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._steps += 1
        if self._steps < self.steps:
            return
        self._steps = 0
        self._young += 1
        if self._young % self.middle_every:
            gc.collect(0)
            return
        gc.collect(1)
        self._middle += 1
        if self._middle >= self.full_cap and self._due():  # never quiet: as CPython would
            self._collect_full()

    def before_io_wait(self, timeout: float) -> None:
        if timeout <= 0 or self._middle < self.full_after:  # tasks ready, or not due yet
            return
        tasks = trio.lowlevel.current_statistics().tasks_living
        if tasks <= self._resting_tasks + self.quiet_tasks and self._due():
            self._collect_full()

    def _due(self) -> bool:
        """Whether the heap grew by a quarter since the last full collection (read at
        most once per middle collection: it sums the allocator's pools)."""
        if self._checked == self._middle:
            return False
        self._checked = self._middle
        return sys.getallocatedblocks() > self._blocks + self._blocks // 4

    def _collect_full(self) -> None:
        self._middle = 0
        self._young = 0
        self._steps = 0
        gc.collect()
        self._blocks = sys.getallocatedblocks()
        self._checked = -1


_pacers: dict[object, GcPacer] = {}
"""The pacer of each Trio run with a pacing host open in it (by the run's token)."""


def acquire_pacer() -> GcPacer:
    """The current Trio run's pacer, started (one per run, however many hosts ask)."""
    token = trio.lowlevel.current_trio_token()
    pacer = _pacers.get(token)
    if pacer is None:
        pacer = _pacers[token] = GcPacer()
    pacer.acquire()
    return pacer


def release_pacer(pacer: GcPacer) -> None:
    """Release what :func:`acquire_pacer` gave; the run's last release stops it."""
    pacer.release()
    if pacer._users == 0:
        for token, known in list(_pacers.items()):
            if known is pacer:
                del _pacers[token]
