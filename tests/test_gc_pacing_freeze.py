"""A pacing host freezes what survives to a quiet moment (:mod:`runtime.app.gcpacing`),
so no collection walks the sessions at rest. That is safe only because a session's
objects, and a turn's, go by reference counting alone once it closes, is evicted or
ends (frozen objects are never collected, but they are freed like any other when their
count drops to zero), and because the cyclic garbage a freeze can keep is bounded."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import Agent, Host, tool
from runtime.app.gcpacing import GcPacer


@tool
async def lookup(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


def tool_agent(turns: int = 1) -> Agent:
    """A turn with a tool step, as the benchmarks' (the provider keeps no requests)."""
    script = [tool_call("lookup", {"city": "Paris"}), ["sunny"]] * turns
    return Agent(name="a", provider=ScriptedProvider(script, keep_requests=0), tools=[lookup])


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only a collection frees it


def walked(obj: object) -> bool:
    """Whether a collection of every generation would walk ``obj`` (not frozen)."""
    return any(o is obj for o in gc.get_objects())


@contextmanager
def no_collector() -> Iterator[None]:
    """The collector off: only reference counting frees anything inside."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def held(session) -> list[weakref.ref]:
    """Weak references to what a session holds in memory: itself, actors, history."""
    return [weakref.ref(x) for x in (session, *session.actors, session.runner)]


async def test_a_closed_session_is_freed_by_reference_counting():
    agent = tool_agent(3)
    async with Host.open(log_tap=False) as host:
        with no_collector():
            refs = []
            for i in range(3):
                session = await host.open_session(agent, session_id=f"s{i}")
                await session.run("weather?")
                refs += held(session)
                await session.close()
            del session
            await trio.testing.wait_all_tasks_blocked()
            assert [r for r in refs if r() is not None] == []


async def test_an_evicted_session_lets_go_of_its_actors_and_history_without_a_collection():
    agent = tool_agent(2)
    async with Host.open(log_tap=False, max_sessions=1) as host:
        with no_collector():
            first = await host.open_session(agent, session_id="first")
            await first.run("weather?")
            refs = held(first)[1:]  # the application still holds the Session itself
            second = await host.open_session(agent, session_id="second")
            await second.run("weather?")  # over capacity: the first is evicted
            await trio.testing.wait_all_tasks_blocked()
            assert "first" not in host.sessions
            assert [r for r in refs if r() is not None] == []


async def test_a_turn_leaves_no_cyclic_garbage():
    """Nothing of a turn, a tool step's or a cancelled one's, waits for a collection:
    a freeze that catches a turn in flight keeps nothing dead once it ends."""
    agent = Agent(name="slow", provider=ScriptedProvider([[Sleep(10), "late"]], keep_requests=0))
    async with Host.open(log_tap=False) as host:
        done = await host.open_session(tool_agent(), session_id="done")
        slow = await host.open_session(agent, session_id="slow")
        with no_collector():
            await done.run("weather?")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow.run, "hi")
                await trio.testing.wait_all_tasks_blocked()
                slow.current.cancel("enough")
            await trio.testing.wait_all_tasks_blocked()
            assert gc.collect() == 0


async def test_frozen_sessions_are_freed_when_they_close():
    agent = tool_agent()
    async with Host.open(log_tap=False, gc_pacing=True) as host:
        before = gc.get_freeze_count()
        sessions = [await host.open_session(agent, session_id=f"s{i}") for i in range(20)]
        for session in sessions:
            await session.run("weather?")
        refs = [r for s in sessions for r in held(s)]
        gc.collect(1)
        gc.freeze()  # what a due quiet moment does (by hand: none is due in so few steps)
        frozen = gc.get_freeze_count()
        assert frozen > before + 20 * 10
        for session in sessions:
            await session.close()
        del sessions, session
        await trio.testing.wait_all_tasks_blocked()
        assert [r for r in refs if r() is not None] == []
        assert gc.get_freeze_count() < frozen - 20 * 10


async def test_a_quiet_moment_freezes_what_survived_instead_of_walking_it():
    pacer = GcPacer(steps=1, middle_every=1, full_after=1)
    pacer.acquire()
    try:
        pacer.host_started()
        survivor = _Node()
        grown = [[] for _ in range(sys.getallocatedblocks() // 2)]  # due: the heap grew
        await trio.lowlevel.checkpoint()
        await trio.sleep(0.01)  # quiet
        assert not walked(survivor)  # frozen: no collection walks it
        del grown
    finally:
        pacer.release()
    assert walked(survivor)  # the close unfreezes
    assert gc.get_freeze_count() == 0


async def _quiet_and_due() -> list[object]:
    """A quiet moment with a collection due: the heap grown by half (kept: the growth
    counts from the last collection's heap, this one included). By objects the collector
    does not track, and 1,000 it does, which freeze: a growth of tracked objects half the
    heap's blocks in number froze over a million in a full run's process, past the bound
    that 10,000 held sessions set (the bound's tests failed there, never alone)."""
    grown: list[object] = [object() for _ in range(sys.getallocatedblocks() // 2)]
    grown += [[] for _ in range(1_000)]
    await trio.lowlevel.checkpoint()
    await trio.sleep(0.01)
    return grown


async def test_frozen_cyclic_garbage_is_freed_once_the_frozen_heap_passes_its_bound():
    pacer = GcPacer(steps=1, middle_every=1, full_after=1, thaw_growth=0.0)
    pacer.acquire()
    try:
        pacer.host_started()
        node = _Node()
        ref = weakref.ref(node)
        kept = [await _quiet_and_due()]  # frozen alive
        del node  # cyclic garbage in the frozen heap
        assert ref() is not None
        kept.append(await _quiet_and_due())  # past the bound (nothing may grow): collected whole
        assert ref() is None and pacer.thaws == 1
    finally:
        pacer.release()


async def frozen_garbage_kept_once_the_host_holds(held: tuple[int, int]) -> bool:
    """Whether cyclic garbage frozen at one quiet moment is still kept (not thawed) at
    the next, after the pacing host's count went from nothing to ``held`` (sessions,
    messages) and the heap grew: the bound grew by what the host holds."""
    now = (0, 0)

    def count() -> tuple[int, int]:
        return now

    # (young_freeze: what the suite's earlier tests left in the young generation is no
    # burst to freeze; frozen, it failed this test in a full run, never alone)
    pacer = GcPacer(steps=1, middle_every=1, full_after=1, thaw_growth=0.0, young_freeze=10**9)
    pacer.acquire()
    try:
        pacer.host_started(count)
        node = _Node()
        ref = weakref.ref(node)
        kept = [await _quiet_and_due()]
        del node
        now = held
        kept.append(await _quiet_and_due())
        alive = ref() is not None and pacer.thaws == 0
    finally:
        pacer.release(count)
    gc.collect()
    assert ref() is None  # unfrozen once the last pacing host closed
    return alive


async def test_the_frozen_heap_s_bound_grows_with_the_sessions_held():
    assert await frozen_garbage_kept_once_the_host_holds((10_000, 0))  # 100 objects each


async def test_a_quiet_moment_freezes_what_survived_though_the_heap_did_not_grow():
    """A turn adds less than a quarter to a large host's heap: had the quiet moment
    waited for that growth, the histories stayed unfrozen for the next collection."""
    pacer = GcPacer(steps=1, middle_every=1, full_after=1)
    pacer.acquire()
    try:
        pacer.host_started()
        survivor = _Node()
        await trio.lowlevel.checkpoint()
        await trio.sleep(0.01)  # quiet; the heap as it was
        assert not walked(survivor)
    finally:
        pacer.release()


async def test_busy_spells_between_quiet_moments_bring_no_full_collection():
    """The middle collections count from the last quiet moment: a host with quiet
    moments between its bursts never reaches ``full_cap`` (at 10,000 sessions that
    collection walked the histories grown since: 0.9-1.6 s of CPU)."""
    pacer = GcPacer(steps=1, middle_every=1, full_after=1, full_cap=20)
    full: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            full.append(1)

    pacer.acquire()
    gc.callbacks.append(note)
    try:
        pacer.host_started()
        full.clear()
        for _ in range(15):  # a busy spell: 15 middle collections
            await trio.lowlevel.checkpoint()
        await trio.sleep(0.01)  # quiet; the heap has not grown by a quarter
        grown = [[] for _ in range(sys.getallocatedblocks() // 2)]  # now it has
        for _ in range(15):
            await trio.lowlevel.checkpoint()
        assert full == []
        del grown
    finally:
        gc.callbacks.remove(note)
        pacer.release()


async def test_the_frozen_heap_s_bound_grows_with_the_messages_the_histories_hold():
    """A long-lived host's histories grow the frozen heap turn after turn: counted, they
    bring no long walk of it; only what they do not explain does."""
    assert await frozen_garbage_kept_once_the_host_holds((1, 100_000))  # 25 objects each


async def test_a_pacing_host_counts_its_sessions_and_their_messages():
    async with Host.open(log_tap=False) as host:
        for i in range(2):
            await (await host.open_session(tool_agent(), session_id=f"s{i}")).run("weather?")
        per_turn = len(host.sessions["s0"].messages)
        assert per_turn >= 3 and host._held() == (2, 2 * per_turn)


async def test_the_frozen_heap_is_counted_only_once_the_heap_grew_by_a_quarter():
    """Counting the frozen objects walks their list (23 ms a million): a quiet moment
    looks at the bound only after the heap grew by a quarter since the last look."""
    # (young_freeze: the heap grown here is no burst to freeze before the look at it)
    pacer = GcPacer(steps=1, middle_every=1, full_after=1, thaw_growth=0.0, young_freeze=10**9)
    pacer.acquire()
    try:
        pacer.host_started()
        node = _Node()
        ref = weakref.ref(node)
        kept = [await _quiet_and_due()]  # looked at (within the bound), then frozen alive
        del node
        await trio.lowlevel.checkpoint()
        await trio.sleep(0.01)  # quiet, past the bound, but the heap did not grow: no look
        assert ref() is not None and pacer.thaws == 0
        kept.append(await _quiet_and_due())  # grown by half: looked at, collected whole
        assert ref() is None and pacer.thaws == 1
    finally:
        pacer.release()
