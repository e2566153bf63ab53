"""A concurrent multi-agent application embedding Axon carelessly: hooks that hang,
Ctrl-C landing in an actor's task, streams read from two tasks, streams left unread
while the host closes. Each must end in a clear typed error or a saved turn, never a
hang or a lost turn."""

from __future__ import annotations

import threading

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from actors.stores.memory import MemoryStore
from runtime import (
    Actor,
    Agent,
    Budget,
    ConfigurationError,
    Hooks,
    Host,
    HostClosed,
    SessionError,
    TextChunk,
    run_sync,
    tool,
)
from runtime.events import TurnFinished


async def hang(event: object) -> None:
    await trio.sleep_forever()


async def test_a_turn_start_hook_that_hangs_is_cut_by_the_turns_deadline(autojump_clock):
    agent = Agent(
        provider=ScriptedProvider([["hi"]]),
        hooks=Hooks(on_turn_start=hang),
        budget=Budget(deadline=30),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        with trio.fail_after(1000):
            result = await session.run("hello")
    assert (result.finish_reason, result.budget) == ("budget", "deadline")
    assert [m.role for m in session.messages] == ["user", "assistant"] and result.saved


async def test_a_turn_start_hook_that_hangs_is_cut_by_a_cancel(autojump_clock):
    hung: list[object] = []

    async def hang_once(event: object) -> None:
        if not hung:
            hung.append(event)
            await trio.sleep_forever()

    agent = Agent(provider=ScriptedProvider([["hi"]]), hooks=Hooks(on_turn_start=hang_once))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        with trio.fail_after(1000):
            async with session.stream("hello") as out:
                await trio.sleep(1)  # the hook hangs
                out.cancel("user stop")
                chunks = [chunk.type async for chunk in out]
            second = await session.run("again")  # the runner is free for the next turn
    assert chunks == ["start", "abort"] and out.result is not None
    assert out.result.abort_reason == "user stop" and second.text == "hi"


@pytest.mark.parametrize("ending", [KeyboardInterrupt, SystemExit])
async def test_ctrl_c_landing_in_a_tool_saves_the_turn_then_leaves_host_open(
    ending, autojump_clock
):
    # Trio raises KeyboardInterrupt in whichever task runs when Ctrl-C comes: here the
    # tool's. It used to take the actors' nursery (the persister with it) down at once:
    # nothing of the turn was stored.
    @tool
    async def work() -> str:
        """Works."""
        raise ending

    agent = Agent(provider=ScriptedProvider([[*tool_call("work", {})], ["done"]]), tools=[work])
    store = MemoryStore()
    with pytest.raises(ending):
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(agent, "s")
            await session.run("go")
            await trio.sleep_forever()  # the block is cancelled, not left running
    stored = await store.load("s")
    assert stored is not None
    assert [m.role for m in stored.messages] == ["user", "assistant", "tool"]
    assert stored.messages[1].interrupted


async def test_ctrl_c_landing_in_a_hook_saves_the_turn_then_leaves_host_open(autojump_clock):
    async def interrupted(event: object) -> None:
        raise KeyboardInterrupt

    @tool
    async def work() -> str:
        """Works."""
        return "worked"

    agent = Agent(
        provider=ScriptedProvider([[*tool_call("work", {})], ["done"]]),
        tools=[work],
        hooks=Hooks(on_tool_result=interrupted),
    )
    store = MemoryStore()
    with pytest.raises(KeyboardInterrupt):
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(agent, "s")
            await session.run("go")
    stored = await store.load("s")
    assert stored is not None
    assert [m.role for m in stored.messages] == ["user", "assistant", "tool"]
    assert stored.messages[1].interrupted and stored.messages[2].output == "worked"


async def test_a_stream_read_from_two_tasks_at_once_refuses_the_second_not_splitting_it(
    autojump_clock,
):
    # Each chunk went to one of them: two listeners (a UI, a log) each missed some,
    # silently.
    agent = Agent(provider=ScriptedProvider([["one two three"]], delay=1))
    read: list[list[str]] = []
    refused: list[SessionError] = []

    async def reader(out: object) -> None:
        chunks: list[str] = []
        try:
            async for chunk in out:  # type: ignore[attr-defined]
                chunks.append(chunk.type)
        except SessionError as exc:
            refused.append(exc)
        else:
            read.append(chunks)

    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("hi") as out:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(reader, out)
                nursery.start_soon(reader, out)
    assert len(refused) == 1 and "another task is reading this stream" in str(refused[0])
    assert len(read) == 1 and read[0].count("text-delta") == 3 and read[0][-1] == "finish"
    assert out.result is not None and out.result.text == "one two three"


class TurnCounter(Actor):
    subscribes_to = (TurnFinished,)

    def __init__(self) -> None:
        super().__init__(name="turn-counter")
        self.turns = 0

    async def handle(self, event: object) -> None:
        self.turns += 1


async def test_an_observer_started_again_after_its_host_closed_is_refused(autojump_clock):
    # Its first host's close stopped it: started on the next host it ended at once,
    # and counted nothing more, silently.
    counter = TurnCounter()
    agent = Agent(provider=ScriptedProvider([["hi"]]))
    async with Host.open(log_tap=False) as host:
        await host.start_actor(counter)
        await (await host.open_session(agent)).run("one")
    async with Host.open(log_tap=False) as host:
        with pytest.raises(ConfigurationError, match=r"has ended.*start a new instance"):
            await host.start_actor(counter)
    assert counter.turns == 1


async def test_an_actor_started_twice_on_one_host_is_refused(autojump_clock):
    # Two supervisors on one inbox: two handle() calls of one actor at once.
    counter = TurnCounter()
    async with Host.open(log_tap=False) as host:
        await host.start_actor(counter)
        with pytest.raises(ConfigurationError, match="running on this host already"):
            await host.start_actor(counter)


@tool(needs_approval=True)
async def send_email(to: str) -> str:
    """Send an email."""
    return f"sent to {to}"


async def waiting_session_of_a_closed_host(store: object) -> tuple[object, str]:
    """A session whose turn waits for an approval, its host closed."""
    agent = Agent(
        provider=ScriptedProvider([[*tool_call("send_email", {"to": "ceo"})], ["sent"]]),
        tools=[send_email],
    )
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, "s")
        result = await session.run("email the ceo")
    return session, result.pending[0].approval_id


async def test_sessions_of_one_agent_opened_at_once_share_its_one_provider_start(
    autojump_clock,
):
    """Each open started the agent's provider when none had started yet: the second
    start of one actor is refused, so every concurrent open but the first failed (fifty
    users arriving at once at a fresh server; a worker taking several sessions)."""
    agent = Agent(provider=ScriptedProvider([["hi"]] * 5))
    opened: list[object] = []

    async def open_one(n: int) -> None:
        opened.append(await host.open_session(agent, session_id=f"s{n}"))

    async with Host.open(log_tap=False) as host:
        async with trio.open_nursery() as nursery:
            for n in range(5):
                nursery.start_soon(open_one, n)
        assert len(opened) == 5
        results = [await session.run("hello") for session in opened]  # type: ignore[attr-defined]
    assert [r.text for r in results] == ["hi"] * 5


async def test_a_decision_on_a_session_of_a_closed_host_raises_host_closed_recording_nothing(
    autojump_clock,
):
    # It was recorded, and respond() then failed to resume (or, on a store the host had
    # opened, it raised the closed store's StoreError).
    store = MemoryStore()
    session, approval_id = await waiting_session_of_a_closed_host(store)
    before = await store.load("s")
    with pytest.raises(HostClosed):
        await session.respond(approval_id, approved=True)  # type: ignore[attr-defined]
    assert await store.load("s") == before


async def test_resuming_a_session_of_a_closed_host_raises_host_closed(tmp_path, autojump_clock):
    session, _ = await waiting_session_of_a_closed_host(tmp_path / "s.db")
    with pytest.raises(HostClosed):
        async with session.resume():  # type: ignore[attr-defined]
            pass


async def test_a_host_closing_beside_an_unread_stream_does_not_wait_for_its_reader(
    autojump_clock,
):
    # The turn was saved and its result sat in the stream's inbox, yet the host waited
    # for the consumer to read it: every close held 15 s (virtual here) by it.
    store = MemoryStore()
    agent = Agent(provider=ScriptedProvider([[TextChunk(text="Hello "), Sleep(60)]]))
    seen: dict[str, object] = {}
    async with trio.open_nursery() as nursery:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(agent, "s")

            async def consumer() -> None:
                async with session.stream("hi") as out:
                    await trio.sleep(100)  # busy elsewhere while the host closes
                    seen["chunks"] = [chunk.type async for chunk in out]
                seen["result"] = out.result

            nursery.start_soon(consumer)
            await trio.sleep(1)
            leaving = trio.current_time()
        seen["closing"] = trio.current_time() - leaving
    assert seen["closing"] < 1
    assert seen["chunks"] == [
        "start",
        "step-start",
        "text-start",
        "text-delta",
        "text-finish",
        "abort",
    ]
    result = seen["result"]
    assert result is not None and result.abort_reason == "host shutdown"  # type: ignore[attr-defined]
    stored = await store.load("s")
    assert stored is not None and stored.messages[1].interrupted


class HangingStart(TurnCounter):
    async def on_start(self) -> None:
        await trio.sleep_forever()  # a collector that never answers


async def test_an_observer_whose_start_hangs_can_be_given_up_by_its_caller(autojump_clock):
    # Shielded from its first on_start on, start_actor hung beyond the caller's bound.
    async with Host.open(log_tap=False) as host:
        subscribed = host.bus.subscription_count
        with pytest.raises(trio.TooSlowError), trio.fail_after(10):
            await host.start_actor(HangingStart())
        session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
        result = await session.run("hello")
        assert host.bus.subscription_count == subscribed  # nothing left fed, unread
    assert result.text == "hi"


def test_one_agent_run_from_two_threads_at_once_is_refused_in_the_second():
    # A threaded web app's run_sync of one module-level agent per request: the provider
    # actor served two Trio runs from one inbox, failed Trio's assertions and hung.
    in_tool, release = threading.Event(), threading.Event()

    @tool
    def wait() -> str:
        """Waits (a sync tool: a worker thread of the first run)."""
        in_tool.set()
        release.wait(60)
        return "waited"

    agent = Agent(provider=ScriptedProvider([[*tool_call("wait", {})], ["done"]]), tools=[wait])
    first: list[object] = []
    thread = threading.Thread(target=lambda: first.append(run_sync(agent, "one")))
    thread.start()
    try:
        assert in_tool.wait(60)
        with pytest.raises(ConfigurationError, match="another thread's Trio run"):
            run_sync(agent, "two")
    finally:
        release.set()
        thread.join(60)
    assert first[0].text == "done"  # type: ignore[attr-defined]
    assert run_sync(agent, "three").text == "done"  # served again once that run ended
