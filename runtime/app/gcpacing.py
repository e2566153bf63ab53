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
host is open. From then on, the full collection a quiet moment is due for is not a walk
of everything either: the young generations are collected and what is left is frozen
too (:meth:`GcPacer._freeze_survivors`). Without this, the first quiet moment after a
burst of 10,000 turns walked the 10,000 sessions at rest (350,000-450,000 objects,
230-310 ms of CPU); with it, each quiet moment walks what a middle collection would.
A freezing host does this at every quiet moment once ``full_after`` middle collections
have gone by, whether or not the heap grew by a quarter: otherwise what each turn adds
to the histories (less than a quarter a turn) stayed unfrozen, the middle collections
counted on across bursts, and the ``full_cap`` collection came mid-burst, a walk of the
grown histories (0.9 and 1.6 s of CPU in the third and fifth turn of 10,000 sessions,
``benchmarks/resting_walk.py``).

Frozen objects are never collected, but they are freed by reference counting like any
other: a session's objects go when it closes or is evicted, a turn's when it ends (no
cycles among them: ``tests/test_gc_pacing_freeze.py`` runs them with the collector
off), and the frozen count falls with them. What a freeze keeps is cyclic garbage that
was in the oldest generation then, or frozen objects that later become cyclic garbage:
an application's cycles. That is bounded: once the frozen objects pass what was alive at
the last whole collection, doubled (``thaw_growth``), plus 100 per session held beyond
those held then (``thaw_per_session``; a session at rest after a turn holds about 40)
and 25 per message their histories hold beyond those then (``thaw_per_message``; a
turn's four messages add about 7), the quiet moment unfreezes the heap, collects it
whole and freezes it again, i.e. one long walk after at least as many objects frozen
since the last. Counting the histories is what tells them from a leak: without it,
10,000 sessions' histories passed the bound after about 11 turns each and brought a
walk of a million objects. The heap is unfrozen
(``gc.unfreeze()``: back into the oldest generation, collected as usual) when the last
pacing host closes. An application that froze the heap itself (``gc.get_freeze_count()``
not zero) keeps its freeze: the pacer then neither freezes nor unfreezes, and its full
collections walk the heap.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

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
        thaw_growth: float = 1.0,
        thaw_per_session: int = 100,
        thaw_per_message: int = 25,
        young_freeze: int = 100_000,
    ) -> None:
        self.steps = steps
        self.middle_every = middle_every
        self.full_after = full_after
        self.full_cap = full_cap
        self.quiet_tasks = quiet_tasks
        self.young_freeze = young_freeze
        self._blocks = sys.getallocatedblocks()
        """Memory blocks allocated after the last full collection."""
        self._checked = -1
        """The middle collection count at the last look at the heap's growth."""
        self._steps = 0
        self._young = 0
        self._promoted = 0
        """Objects the young collections since the last middle one may have promoted
        (the young generation's count before each: an upper bound of what survived)."""
        self._middle = 0
        """Middle collections since the last full one."""
        self._was_enabled = True
        self._users = 0
        self._froze = False
        """Whether :meth:`host_started` froze the heap (and release must unfreeze it)."""
        self._resting_tasks = 0
        """Tasks alive when the (first) pacing host had started: the loop at rest."""
        self.thaw_growth = thaw_growth
        self.thaw_per_session = thaw_per_session
        self.thaw_per_message = thaw_per_message
        self._session_counts: list[Callable[[], tuple[int, int]]] = []
        """Each pacing host's count of the sessions it holds in memory and of their
        histories' messages."""
        self._live = 0
        """Objects frozen right after the last full collection of everything (all alive)."""
        self._live_held = (0, 0)
        """Sessions and messages held then."""
        self._thaw_blocks = 0
        """Memory blocks allocated at the last look at the frozen heap's bound (counting
        the frozen objects walks their list: 23 ms a million, so once a quarter's
        growth, not at every quiet moment)."""
        self.thaws = 0
        """Full collections of the frozen heap too (see :meth:`_freeze_survivors`)."""

    def acquire(self) -> None:
        """Start pacing in the current Trio run (counted: the last :meth:`release` stops)."""
        self._users += 1
        if self._users == 1:
            self._was_enabled = gc.isenabled()
            gc.disable()
            trio.lowlevel.add_instrument(self)

    def release(self, sessions: Callable[[], tuple[int, int]] | None = None) -> None:
        """Stop pacing once every :meth:`acquire` is released; the collector's automatic
        state goes back to what it was. ``sessions`` is what the host gave
        :meth:`host_started`, if it did."""
        if sessions is not None and sessions in self._session_counts:
            self._session_counts.remove(sessions)
        self._users -= 1
        if self._users == 0:
            trio.lowlevel.remove_instrument(self)
            if self._froze:
                self._froze = False
                gc.unfreeze()
            if self._was_enabled:
                gc.enable()

    def host_started(self, sessions: Callable[[], tuple[int, int]] | None = None) -> None:
        """A pacing host has started its services: note the tasks alive (the loop at
        rest, see the module's "quiet") and move the heap as it stands (after a full
        collection, so no garbage) out of every collection's walk until the last
        :meth:`release`. Once per pacing: a second host's call, or a heap the application
        froze, freezes nothing."""
        self._resting_tasks = max(
            self._resting_tasks, trio.lowlevel.current_statistics().tasks_living
        )
        if sessions is not None:
            self._session_counts.append(sessions)
        if self._froze or gc.get_freeze_count():
            return
        self._collect_full()
        gc.freeze()
        self._froze = True
        self._live = gc.get_freeze_count()
        self._live_held = self._held()
        self._thaw_blocks = sys.getallocatedblocks()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._steps += 1
        if self._steps < self.steps:
            return
        self._steps = 0
        young = gc.get_count()[0]
        self._young += 1
        middle = not self._young % self.middle_every
        if self._froze and (young if not middle else self._promoted + young) > self.young_freeze:
            self._freeze_burst()
            return
        if not middle:
            gc.collect(0)
            self._promoted += young
            return
        gc.collect(1)
        self._promoted = 0
        self._middle += 1
        if self._middle >= self.full_cap and self._due():  # never quiet: as CPython would
            if self._froze and self._past_thaw_limit():  # (bursts frozen meanwhile)
                self._thaw()
            else:
                self._collect_full()

    def before_io_wait(self, timeout: float) -> None:
        if timeout <= 0 or self._middle < self.full_after:  # tasks ready, or not due yet
            return
        if trio.lowlevel.current_statistics().tasks_living > self._resting_tasks + self.quiet_tasks:
            return
        if self._froze:  # heap grown or not: a freeze costs a middle collection
            self._freeze_survivors()
        elif self._due():
            self._collect_full()

    def _freeze_burst(self) -> None:
        """A burst of objects made at once (a worker thread that read a history of
        600,000 messages made millions; the collector is off meanwhile) frozen rather than
        walked: a young or middle collection of them held the loop 0.4 s, and CPython's
        own collections while the thread made them 0.2-2 s each (benchmarks/journal/approval.md,
        branch ``whist``). Not measured against :meth:`_thaw_limit` here: the history a
        burst makes is not a session's yet (a body being read), so the bound would not
        count it and the freeze would turn into a walk of it; the next quiet moment
        measures (or a never-quiet host's ``full_cap`` collection)."""
        gc.freeze()
        self._promoted = 0
        self._young = 0

    def _due(self) -> bool:
        """Whether the heap grew by a quarter since the last full collection (read at
        most once per middle collection: it sums the allocator's pools)."""
        if self._checked == self._middle:
            return False
        self._checked = self._middle
        return sys.getallocatedblocks() > self._blocks + self._blocks // 4

    def _held(self) -> tuple[int, int]:
        counts = [count() for count in self._session_counts]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def _thaw_limit(self) -> int:
        """The frozen objects past which a quiet moment collects the frozen heap too:
        what was alive at the last such collection, grown by ``thaw_growth`` of itself
        (default: doubled), by ``thaw_per_session`` for each session held beyond those
        held then and by ``thaw_per_message`` for each message of their histories beyond
        those then. The histories are what a long-lived host's frozen heap grows by (7
        tracked objects a session a tool-using turn of four messages, measured): counted,
        they move the bound with them, and only what they do not explain (an
        application's cycles) brings the long walk."""
        sessions, messages = self._held()
        live_sessions, live_messages = self._live_held
        return (
            self._live
            + int(self._live * self.thaw_growth)
            + self.thaw_per_session * max(0, sessions - live_sessions)
            + self.thaw_per_message * max(0, messages - live_messages)
        )

    def _past_thaw_limit(self) -> bool:
        """Whether the frozen objects passed :meth:`_thaw_limit`, looked at once the heap
        grew by a quarter since the last look (so a host's quiet moments do not each
        count a million frozen objects)."""
        blocks = sys.getallocatedblocks()
        if blocks <= self._thaw_blocks + self._thaw_blocks // 4:
            return False
        self._thaw_blocks = blocks
        return gc.get_freeze_count() > self._thaw_limit()

    def _freeze_survivors(self) -> None:
        """A quiet moment's collection in a host that froze the heap: the young
        generations collected, then everything else frozen (``gc.freeze()`` moves a
        list: no walk), so the oldest generation, i.e. the sessions at rest, is walked by
        no collection. A session's objects, and a turn's, are freed by reference counting
        once it closes or ends (``tests/test_gc_pacing_freeze.py``), frozen or not; what
        this keeps is cyclic garbage that reached the oldest generation (an
        application's cycles), bounded: once the frozen objects pass
        :meth:`_thaw_limit` the heap is unfrozen, collected whole, and frozen again (one
        long walk, amortised over at least as many objects frozen since)."""
        if self._past_thaw_limit():
            self._thaw()
            return
        self._promoted = 0
        self._middle = 0
        self._young = 0
        self._steps = 0
        gc.collect(1)
        gc.freeze()
        self._blocks = sys.getallocatedblocks()
        self._checked = -1

    def _thaw(self) -> None:
        """The frozen heap collected with the rest, and what is alive frozen again."""
        gc.unfreeze()
        self._collect_full()
        gc.freeze()
        self._live = gc.get_freeze_count()
        self._live_held = self._held()
        self._thaw_blocks = sys.getallocatedblocks()
        self.thaws += 1

    def _collect_full(self) -> None:
        self._promoted = 0
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


def release_pacer(pacer: GcPacer, sessions: Callable[[], tuple[int, int]] | None = None) -> None:
    """Release what :func:`acquire_pacer` gave (and the host's session count, if it
    gave one to :meth:`GcPacer.host_started`); the run's last release stops it."""
    pacer.release(sessions)
    if pacer._users == 0:
        for token, known in list(_pacers.items()):
            if known is pacer:
                del _pacers[token]
