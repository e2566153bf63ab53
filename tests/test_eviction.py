"""Idle sessions are freed from memory (TTL and an LRU cap) and reloaded on demand."""

from __future__ import annotations

import gc
import sys
import tracemalloc
import weakref

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from actors.providers.scripted import ScriptedProvider, Sleep
from actors.stores import MemoryStore
from runtime import Agent, Host, configure_logging
from runtime.approval import pending_calls
from runtime.errors import ConfigurationError, SessionBusy, SessionNotLoaded, StoreError
from runtime.events import SessionEvicted
from runtime.messages import Message, UserMessage
from runtime.serde import structure, unstructure


def scripted_agent(*steps) -> Agent:
    return Agent(name="echo", provider=ScriptedProvider(steps=[list(steps or ["ok"])]))


def user_texts(messages) -> list[str]:
    return [m.content for m in messages if isinstance(m, UserMessage)]


async def test_a_session_idle_for_the_ttl_is_evicted(autojump_clock):
    async with Host.open(idle_ttl=60) as host:
        session = await host.open_session(scripted_agent(), session_id="s")
        await session.run("hi")
        actors = list(session.actors)
        await trio.sleep(59)
        assert host.sessions == {"s": session}
        await trio.sleep(2)
        assert host.sessions == {} and not session.loaded
        assert all(actor.stopped.is_set() for actor in actors)


async def test_a_turn_restarts_the_idle_time(autojump_clock):
    async with Host.open(idle_ttl=60) as host:
        session = await host.open_session(scripted_agent(), session_id="s")
        await trio.sleep(50)
        await session.run("hi")
        await trio.sleep(50)
        assert session.loaded
        await trio.sleep(11)
        assert not session.loaded


async def test_a_session_running_a_turn_is_never_evicted(autojump_clock):
    agent = scripted_agent(Sleep(1000), "done")
    async with Host.open(idle_ttl=10, max_sessions=1) as host:
        session = await host.open_session(agent, session_id="slow")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "go")
            await trio.sleep(500)
            await host.open_session(scripted_agent(), session_id="other")  # over the cap
            assert session.loaded and session.busy
        assert session.messages[-1].text == "done"
        await trio.sleep(11)
        assert not session.loaded


async def test_past_max_sessions_the_least_recently_used_is_evicted():
    agent = scripted_agent()
    async with Host.open(max_sessions=2) as host:
        a = await host.open_session(agent, session_id="a")
        b = await host.open_session(agent, session_id="b")
        await a.run("use a")  # b is now the least recently used
        c = await host.open_session(agent, session_id="c")
        assert list(host.sessions) == ["a", "c"]
        assert a.loaded and c.loaded and not b.loaded


async def test_eviction_is_a_bus_event_and_a_log_line():
    configure_logging("info")
    try:
        with capture_logs() as logs:
            async with Host.open(max_sessions=1) as host:
                sub = host.bus.subscribe([SessionEvicted])
                await host.open_session(scripted_agent(), session_id="first")
                await host.open_session(scripted_agent(), session_id="second")
                event = sub.inbox.get_nowait()
                await trio.sleep(0.05)  # the log tap writes the line
    finally:
        configure_logging("warning")
    assert (event.kind, event.session_id, event.reason) == ("session.evicted", "first", "capacity")
    lines = [line for line in logs if line["event"] == "session.evicted"]
    assert [(line["session_id"], line["reason"]) for line in lines] == [("first", "capacity")]


async def test_an_evicted_session_object_fails_clearly_on_reading_its_messages():
    async with Host.open(max_sessions=1) as host:
        session = await host.open_session(scripted_agent(), session_id="gone")
        await host.open_session(scripted_agent(), session_id="next")
        with pytest.raises(SessionNotLoaded, match=r"await session\.reopen\(\)"):
            session.messages  # noqa: B018


async def test_an_evicted_session_object_reloads_on_its_next_turn_with_its_history(tmp_path):
    provider = ScriptedProvider(steps=[["answer"]])
    agent = Agent(provider=provider)
    async with Host.open(store=str(tmp_path / "s.db"), max_sessions=1) as host:
        session = await host.open_session(agent, session_id="kept")
        await session.run("first")
        await host.open_session(agent, session_id="evicts-kept")
        assert not session.loaded
        await session.run("second")
        assert host.sessions["kept"] is session
        assert user_texts(provider.requests[-1].messages) == ["first", "second"]
        assert [m.role for m in session.messages] == ["user", "assistant"] * 2


async def test_reopen_loads_the_history_back_into_the_same_object():
    agent = scripted_agent()
    async with Host.open(max_sessions=1) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("hello")
        await host.open_session(agent, session_id="t")
        await session.reopen()
        assert user_texts(session.messages) == ["hello"]
        assert await host.open_session(agent, session_id="s") is session


async def test_open_session_after_eviction_gives_back_the_object_still_held():
    agent = scripted_agent()
    async with Host.open(max_sessions=1) as host:
        session = await host.open_session(agent, session_id="s")
        await host.open_session(agent, session_id="t")
        assert await host.open_session(agent, session_id="s") is session
        assert session.loaded


async def test_an_evicted_object_of_another_agent_is_superseded_and_then_refused():
    async with Host.open(max_sessions=1) as host:
        old = await host.open_session(scripted_agent(), session_id="s")
        await host.open_session(scripted_agent(), session_id="t")
        new = await host.open_session(scripted_agent(), session_id="s")
        assert new is not old and new.loaded
        with pytest.raises(SessionBusy, match="opened again with another agent"):
            await old.run("stale")


async def test_meta_of_a_session_evicted_before_its_first_turn_is_kept():
    agent = scripted_agent()
    async with Host.open(max_sessions=1) as host:
        session = await host.open_session(agent, session_id="s", meta={"owner": "ada"})
        await host.open_session(agent, session_id="t")
        await session.run("hi")
        record = await host.store.load("s")
    assert record.meta["owner"] == "ada"


class FailingSaves(MemoryStore):
    async def save(self, *args, **kwargs):
        raise StoreError("disk full")


async def test_a_session_whose_history_is_not_saved_is_not_evicted(autojump_clock):
    async with Host.open(store=FailingSaves(), idle_ttl=10, log_tap=False) as host:
        session = await host.open_session(scripted_agent(), session_id="unsaved")
        await session.run("keep me")
        await trio.sleep(100)
        assert session.loaded and user_texts(session.messages) == ["keep me"]


@pytest.mark.parametrize("options", [{"idle_ttl": 0}, {"idle_ttl": -1}, {"max_sessions": 0}])
async def test_bad_eviction_settings_are_refused(options):
    with pytest.raises(ConfigurationError):
        async with Host.open(**options):
            pass


async def test_two_thousand_sessions_under_a_cap_of_100_keep_memory_bounded():
    agent = Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))
    async with Host.open(max_sessions=100, log_tap=False) as host:
        baseline_subs = host.bus.subscription_count

        async def open_batch(start: int, count: int) -> None:
            for i in range(start, start + count):
                session = await host.open_session(agent, session_id=f"s{i}")
                await session.run("hi")
                del session
            agent.provider.requests.clear()  # the test double's own record of requests

        await open_batch(0, 200)  # past the cap: the steady state
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            await open_batch(200, 1800)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(host.sessions) <= 100
        assert len(host._actors) <= 3 * 100 + 3  # + persister, tool executor, provider
        assert host.bus.subscription_count == baseline_subs
        assert len(host.bus._routes) <= 101  # cached routes, by session
        # The memory store keeps every history (about 1 KiB each here); sessions held in
        # memory would add tens of KiB each (58 MiB for 1,800 without the cap).
        assert grown < 16 * 2**20, f"grew {grown / 2**20:.1f} MiB"


class CopyingStore(MemoryStore):
    """Keeps copies of the messages, as a store on disk does (and, unlike SQLite's
    thread, without racing the autojump clock)."""

    async def save(self, session_id, start, messages, meta=None, **kwargs):
        copies = [structure(unstructure(m), Message) for m in messages]
        return await super().save(session_id, start, copies, meta, **kwargs)


async def test_an_evicted_sessions_one_megabyte_prompt_is_freed(autojump_clock):
    prompt = "x" * 2**20
    agent = scripted_agent()
    async with Host.open(store=CopyingStore(), idle_ttl=60) as host:
        session = await host.open_session(agent, session_id="big")
        result = await session.run(prompt)
        message = weakref.ref(session.messages[0])
        assert message().content == prompt
        del result, prompt
        agent.provider.requests.clear()  # the test double's own record of requests
        await trio.sleep(61)
        gc.collect()
        assert not session.loaded
        assert message() is None
        await session.reopen()
        assert len(session.messages[0].content) == 2**20


async def test_two_turns_racing_on_an_evicted_session_load_it_once_and_run_one(autojump_clock):
    agent = scripted_agent(Sleep(1), "done")
    async with Host.open(max_sessions=1, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await host.open_session(agent, session_id="t")
        outcomes: list[str] = []

        async def turn() -> None:
            try:
                await session.run("go")
                outcomes.append("ran")
            except SessionBusy:
                outcomes.append("busy")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(turn)
            nursery.start_soon(turn)
        assert sorted(outcomes) == ["busy", "ran"]
        assert len(host._actors) == 3 + 3  # persister, executor, provider + one session's


async def test_a_closed_session_object_reloads_on_its_next_turn():
    agent = scripted_agent()
    async with Host.open() as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("one")
        await session.close()
        await session.run("two")
        assert session.loaded and user_texts(session.messages) == ["one", "two"]


async def test_the_demo_agent_serve_runs_keeps_no_prompt_once_its_session_is_evicted(
    autojump_clock,
):
    """``serve``'s offline agent: its provider records no requests, so eviction frees all."""
    from runtime.app.demo import demo_agent

    prompt = "y" * 2**20
    async with Host.open(store=CopyingStore(), idle_ttl=60, log_tap=False) as host:
        session = await host.open_session(demo_agent(), session_id="demo-big")
        await session.run(prompt)
        message = weakref.ref(session.messages[0])
        del prompt
        await trio.sleep(61)
        gc.collect()
        assert not session.loaded
        assert message() is None


def waiting_agent(argument: str, *, approval_timeout: float | None = None) -> Agent:
    """A turn that calls ``act(argument)``, which needs approval: the turn suspends."""
    from actors.providers.scripted import tool_call
    from runtime import tool

    @tool(needs_approval=True)
    async def act(text: str) -> str:
        """Act on the text."""
        return "done"

    provider = ScriptedProvider(steps=[tool_call("act", {"text": argument})], keep_requests=0)
    return Agent(name="asks", provider=provider, tools=[act], approval_timeout=approval_timeout)


async def test_an_evicted_waiting_turn_leaves_neither_its_session_nor_its_call_in_memory(
    autojump_clock,
):
    """A turn that waits for a person is a record in the store (docs/approval.md): once
    its session is evicted the host holds no reference to the session or its history."""
    agent = waiting_agent("y" * 2**20)
    async with Host.open(store=CopyingStore(), idle_ttl=60) as host:
        session = await host.open_session(agent, session_id="waits")
        result = await session.run("go")
        assert result.finish_reason == "awaiting-input"
        call = weakref.ref(session.messages[1].content[0])
        held = weakref.ref(session)
        assert call().input["text"] == "y" * 2**20
        del result, session
        await trio.sleep(61)
        gc.collect()
        assert held() is None
        assert call() is None
        assert host.get_session("waits") is None
        assert [p.tool_name for p in (await host.open_session(agent, "waits")).pending] == ["act"]


async def test_an_evicted_turn_waiting_with_a_deadline_leaves_only_the_deadline_in_memory(
    autojump_clock,
):
    """With ``approval_timeout`` the host's timer watches the wait: by its session id and
    deadline, never by the session or its history."""
    agent = waiting_agent("z" * 2**20, approval_timeout=3600)
    async with Host.open(store=CopyingStore(), idle_ttl=60) as host:
        session = await host.open_session(agent, session_id="waits")
        await session.run("go")
        call = weakref.ref(session.messages[1].content[0])
        held = weakref.ref(session)
        del session
        await trio.sleep(61)
        gc.collect()
        assert held() is None
        assert call() is None
        assert list(host.expiry._due) == ["waits"]


async def test_evicted_waiting_turns_leave_no_session_object_and_no_entry_keyed_by_session():
    """Issue 21: N waiting turns, each session evicted by the next (``max_sessions=1``),
    leave in the process what the one loaded session holds, nothing of the others: no
    ``Session`` object, no weak handle, no bus route, no persister memory of its last
    save (which served nothing once the session was evicted, yet was kept for up to
    1,024 sessions), no expiry entry, no task or awake actor."""
    from runtime.app.session import Session

    agent = waiting_agent("w")
    async with Host.open(max_sessions=1, log_tap=False) as host:
        tasks = 0
        for i in range(30):
            session = await host.open_session(agent, session_id=f"w{i}")
            assert (await session.run("go")).finish_reason == "awaiting-input"
            if i == 0:  # (the host's and the provider's tasks started)
                await trio.testing.wait_all_tasks_blocked()
                tasks = trio.lowlevel.current_statistics().tasks_living
        del session
        await trio.testing.wait_all_tasks_blocked()
        gc.collect()
        loaded = set(host.sessions)
        assert loaded == {"w29"}
        left = [o.id for o in gc.get_objects() if isinstance(o, Session)]
        assert left == ["w29"]
        assert set(host._handles) == loaded
        assert set(host.bus._routes) <= loaded
        assert set(host.persister._latest) == loaded
        assert not host.expiry._due
        assert len(host._actors) == 3 + 3  # the loaded session's; persister, executor, provider
        assert not [a for a in host._actors if a.session_id and not a.resting]
        assert trio.lowlevel.current_statistics().tasks_living == tasks


async def test_reading_a_waiting_turns_calls_leaves_no_tuple_in_cpythons_free_lists():
    """Issue 21, counted in blocks: a waiting turn reads its pending calls (``pending_calls``
    over ``waiting_calls``) and drops them. Built as ``tuple(genexpr)``, each read
    allocated ten slots and shrank the tuple, whose block then went to the interpreter's
    free list of 1-tuples at its death and stayed there (up to 2,000, until a full
    collection): two blocks a waiting turn, an idle turn none, which the memory benchmark
    read as a waiting child's 64-94 KB more of Python pools (benchmarks/journal/approval.md,
    branch ``apmem2``). Built from a list, the tuple is allocated at its size."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(waiting_agent("w"), session_id="w")
        assert (await session.run("go")).finish_reason == "awaiting-input"
        messages = list(session.messages)
    assert [c.tool_name for c in pending_calls(messages)] == ["act"]
    gc.collect()  # (a full collection empties the free lists)
    before = sys.getallocatedblocks()
    for _ in range(500):
        pending_calls(messages)
    assert sys.getallocatedblocks() - before < 50  # 1,000 more as tuple(genexpr)


async def test_a_session_opened_at_capacity_looks_at_the_least_recently_used_alone():
    # A worker keeps up to a thousand sessions and opens one for most turns: eviction
    # went through a copy of every session in memory each time, to evict the first.
    class Counted(dict):
        looked = 0

        def values(self):  # type: ignore[override]
            for session in super().values():
                Counted.looked += 1
                yield session

    agent = scripted_agent()
    async with Host.open(max_sessions=50) as host:
        for i in range(50):
            await host.open_session(agent, session_id=f"s{i}")
        host.sessions = Counted(host.sessions)
        await host.open_session(agent, session_id="new")
        looked = Counted.looked
        assert "s0" not in host.sessions and "s1" in host.sessions and "new" in host.sessions
        assert len(host.sessions) == 50
    assert looked == 1
