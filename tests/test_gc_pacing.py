"""``Host.open(gc_pacing=True)``: the Trio loop runs the garbage collections
(:mod:`runtime.app.gcpacing`), and still runs every kind: cyclic garbage, young or old,
is freed; the collector's automatic state comes back when the last pacing host closes."""

from __future__ import annotations

import gc
import sys
import weakref

import trio

from actors.providers import ScriptedProvider
from runtime import Agent, Host
from runtime.app.gcpacing import GcPacer


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it


async def test_a_pacing_host_turns_the_automatic_collector_off_and_back_on():
    assert gc.isenabled()
    async with Host.open(log_tap=False, gc_pacing=True):
        assert not gc.isenabled()
        async with Host.open(log_tap=False, gc_pacing=True):
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer host still paces
    assert gc.isenabled()


async def test_a_host_without_pacing_leaves_the_collector_alone():
    async with Host.open(log_tap=False):
        assert gc.isenabled()
        assert gc.get_freeze_count() == 0


async def test_a_pacing_host_freezes_the_heap_it_started_with_until_it_closes():
    """What was alive once the host started (imports, the host's services) is walked by
    no collection while pacing; unfrozen at the close, so no garbage is kept for ever."""
    assert gc.get_freeze_count() == 0
    async with Host.open(log_tap=False, gc_pacing=True) as host:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        async with Host.open(log_tap=False, gc_pacing=True):
            assert gc.get_freeze_count() <= frozen  # once per pacing (frozen objects can die)
        session = await host.open_session(Agent(name="a", provider=ScriptedProvider([["x"]])))
        await session.run("hi")
        assert gc.get_freeze_count() <= frozen  # no quiet moment with a collection due yet
    assert gc.get_freeze_count() == 0


async def test_a_pacing_host_keeps_the_application_s_own_freeze():
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        async with Host.open(log_tap=False, gc_pacing=True):
            assert 0 < gc.get_freeze_count() <= frozen  # not frozen again, not unfrozen
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


async def test_turns_answer_the_same_under_pacing():
    agent = Agent(name="greeter", provider=ScriptedProvider([["hel", "lo"]]))
    async with Host.open(log_tap=False, gc_pacing=True) as host:
        sessions = [await host.open_session(agent) for _ in range(20)]
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(session.run, "hi")
        assert [s.messages[-1].text for s in sessions] == ["hello"] * 20


async def test_young_cyclic_garbage_is_freed_as_the_loop_steps():
    async with Host.open(log_tap=False, gc_pacing=True):
        ref = weakref.ref(_Node())
        for _ in range(300):  # young collections run every hundred task steps
            await trio.lowlevel.checkpoint()
        assert ref() is None


async def test_old_cyclic_garbage_is_freed_at_a_quiet_moment():
    pacer = GcPacer(steps=1, middle_every=1, full_after=1)
    pacer.acquire()
    try:
        node = _Node()
        ref = weakref.ref(node)
        gc.collect()  # it survives into the oldest generation
        del node
        await trio.lowlevel.checkpoint()  # a middle collection: not the oldest generation
        await trio.sleep(0.01)  # quiet, but the heap did not grow: no full one is due
        assert ref() is not None
        grown = [[] for _ in range(sys.getallocatedblocks() // 2)]  # the heap grows by half
        await trio.lowlevel.checkpoint()
        await trio.sleep(0.01)  # the loop waits with nothing ready: a full collection
        assert ref() is None
        del grown
    finally:
        pacer.release()
    assert gc.isenabled()


def walked(obj: object) -> bool:
    """Whether a collection of every generation would walk ``obj`` (not frozen)."""
    return any(o is obj for o in gc.get_objects())


async def test_nothing_is_frozen_while_turns_are_in_flight():
    """Quiet counts the tasks beyond those alive when the host started: a loop that
    waits while turns wait (their tasks alive) neither collects its oldest generation
    nor freezes it (a host that froze its start: what survived is frozen when quiet)."""
    # (young_freeze: the heap grown below is no burst to freeze, see the tests after)
    pacer = GcPacer(steps=1, middle_every=1, full_after=1, quiet_tasks=2, young_freeze=10**9)
    pacer.acquire()
    try:
        pacer.host_started()
        survivor = _Node()
        grown = [[] for _ in range(sys.getallocatedblocks() // 2)]
        async with trio.open_nursery() as nursery:
            for _ in range(3):  # more than quiet_tasks beyond the resting ones
                nursery.start_soon(trio.sleep, 0.05)
            await trio.lowlevel.checkpoint()
            await trio.sleep(0.01)  # waits with nothing ready, but not quiet
            assert walked(survivor)
        await trio.lowlevel.checkpoint()
        await trio.sleep(0.01)  # the turns are done: quiet
        assert not walked(survivor)
        del grown
    finally:
        pacer.release()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def _lists(n: int) -> list[list[int]]:
    return [[] for _ in range(n)]


async def test_a_burst_of_objects_a_thread_made_is_frozen_not_walked_while_turns_run():
    """A worker thread that read a long history (600,000 messages: millions of objects,
    made while the collector is off) leaves them all in the young generation: the next
    young collection would walk every one on the loop. The pacer freezes them instead,
    though turns are in flight (no quiet moment)."""
    pacer = GcPacer(steps=1, middle_every=10, quiet_tasks=2, young_freeze=10_000)
    pacer.acquire()
    try:
        pacer.host_started()
        async with trio.open_nursery() as nursery:
            for _ in range(3):  # more than quiet_tasks beyond the resting ones
                nursery.start_soon(trio.sleep, 0.05)
            burst = await trio.to_thread.run_sync(_lists, 20_000)
            await trio.lowlevel.checkpoint()
            assert not walked(burst[-1])
            few = _lists(10)
            await trio.lowlevel.checkpoint()
            assert walked(few[-1])  # a young collection's few: collected as before
    finally:
        pacer.release()
    assert gc.isenabled() and gc.get_freeze_count() == 0


async def test_a_burst_made_over_several_young_collections_is_frozen_at_the_middle_one():
    """Made a little at a time, each young collection's share stays under the bound and
    is promoted; the middle collection that would walk them all freezes them instead.
    (The pacer is driven by hand, one young collection a call, with no task between.)"""
    pacer = GcPacer(steps=1, middle_every=4, young_freeze=10_000)
    gc.disable()
    try:
        pacer.host_started()  # the heap frozen as it stands, as a pacing host's
        step = trio.lowlevel.current_task()
        pieces = []
        for _ in range(3):
            pieces.append(_lists(4_000))
            pacer.before_task_step(step)  # a young collection: walked, promoted
            assert walked(pieces[-1][-1])
        pacer.before_task_step(step)  # the middle one: 12,000 promoted, frozen
        assert not any(walked(piece[-1]) for piece in pieces)
    finally:
        gc.unfreeze()
        gc.enable()
