"""An application embedding Axon with actors of its own: a replacement tool executor that
crashes, observers and executors shared by hosts, plug-ins that misbehave at start or
never read. Each must end in a clear error or a saved turn, never a hang, a lost
request or a silent second task on one inbox."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import structlog
import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from actors.stores.memory import MemoryStore
from actors.tool_executor import ToolExecutor
from runtime import (
    Actor,
    Agent,
    Budget,
    ConfigurationError,
    Host,
    RestartPolicy,
    TextChunk,
    configure_logging,
    run_sync,
    tool,
)
from runtime.events import TurnFinished, TurnStarted


@tool
def ping() -> str:
    """Ping."""
    return "pong"


class CrashingExecutor(Actor):
    """A replacement tool executor that is a plain actor (not a ``ServingActor``) with a
    bug: every request crashes it."""

    async def handle(self, message: object) -> None:
        raise RuntimeError("executor bug")


async def test_a_plain_actor_executor_that_crashes_answers_its_calls_with_the_crash(
    autojump_clock,
):
    # The request it crashed on was lost: the turn waited to its deadline (600 s here).
    store = MemoryStore()
    agent = Agent(
        provider=ScriptedProvider([[*tool_call("ping", {})], ["it failed"], ["next"]]),
        tools=[ping],
        budget=Budget(deadline=600),
    )
    executor = CrashingExecutor(name="my-executor")
    async with Host.open(store=store, log_tap=False, tool_executor=executor) as host:
        session = await host.open_session(agent, "s")
        started = trio.current_time()
        result = await session.run("go")
        took = trio.current_time() - started
        stored = await store.load("s")
    assert took < 1 and result.finish_reason == "stop" and result.text == "it failed"
    assert stored is not None
    error = stored.messages[2].error  # type: ignore[union-attr]
    assert error == (
        "the tool executor 'my-executor' crashed (RuntimeError: executor bug); "
        "the call did not complete"
    )


class SlowCrashingExecutor(Actor):
    async def handle(self, message: object) -> None:
        await trio.sleep(1)  # the next request queues meanwhile
        raise RuntimeError("executor bug")


async def test_a_plain_actor_executor_given_up_on_answers_the_requests_it_left_queued(
    autojump_clock,
):
    # Given up on (restart intensity 0), its inbox was closed with the second session's
    # request in it: that turn waited to its deadline.
    agent = Agent(
        provider=ScriptedProvider([[*tool_call("ping", {})], ["it failed"]] * 2),
        tools=[ping],
        budget=Budget(deadline=600),
    )
    results: dict[str, object] = {}
    policy = RestartPolicy(intensity=0)
    async with Host.open(
        log_tap=False, tool_executor=SlowCrashingExecutor(), restart_policy=policy
    ) as host:

        async def run(name: str) -> None:
            session = await host.open_session(agent, name)
            results[name] = await session.run("go")

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "a")
            nursery.start_soon(run, "b")
        took = trio.current_time() - started
    assert took < 10
    assert [results[n].tool_messages[0].error for n in "ab"] == [  # type: ignore[attr-defined]
        "the tool executor 'SlowCrashingExecutor' crashed (RuntimeError: executor bug); "
        "the call did not complete"
    ] * 2


class TurnCounter(Actor):
    subscribes_to = (TurnFinished,)

    def __init__(self) -> None:
        super().__init__(name="turn-counter")
        self.turns = 0

    async def handle(self, event: object) -> None:
        self.turns += 1


async def test_an_observer_running_on_one_host_is_refused_by_a_second_host_of_the_run(
    autojump_clock,
):
    # The second host started a second task on its inbox, subscribed to nothing of the
    # second host's bus: it counted none of that host's turns, silently.
    counter = TurnCounter()
    agent = Agent(provider=ScriptedProvider([["hi"]] * 2))
    async with Host.open(log_tap=False) as first, Host.open(log_tap=False) as second:
        await first.start_actor(counter)
        with pytest.raises(ConfigurationError, match="running on another host"):
            await second.start_actor(counter)
        await (await first.open_session(agent)).run("one")
    assert counter.turns == 1


def test_a_tool_executor_running_in_one_threads_host_is_refused_by_another_threads():
    # A threaded app handing one executor instance to every thread's host: two Trio runs
    # on one inbox (refused for providers only).
    executor = ToolExecutor()
    agent = Agent(provider=ScriptedProvider([["hi"]]))
    opened, release = threading.Event(), threading.Event()

    async def hold_open() -> None:
        async with Host.open(log_tap=False, tool_executor=executor):
            opened.set()
            await trio.to_thread.run_sync(release.wait, 60)

    thread = threading.Thread(target=trio.run, args=(hold_open,))
    thread.start()
    try:
        assert opened.wait(60)

        async def second() -> None:
            async with Host.open(log_tap=False, tool_executor=executor):
                pass

        with pytest.raises(ConfigurationError, match="running on another host"):
            trio.run(second)
    finally:
        release.set()
        thread.join(60)
    assert run_sync(agent, "after").text == "hi"  # another executor: its own


class StuckObserver(Actor):
    """A plug-in that asked for ``block`` (it must not lose an event) and stopped reading:
    it holds the first turn's start, its inbox of two fills with the next two events."""

    subscribes_to = (TurnStarted, TurnFinished)
    overflow = "block"
    inbox_capacity = 2

    async def handle(self, event: object) -> None:
        await trio.sleep_forever()


async def test_an_observer_that_blocks_and_stopped_reading_holds_a_turn_only_to_its_deadline(
    autojump_clock,
):
    # The turn's start was announced before its cancel scope was entered: the third
    # turn hung there for ever, past its deadline (the second's finish waited 5 s, its
    # bound).
    agent = Agent(provider=ScriptedProvider([["a"], ["b"], ["c"]]), budget=Budget(deadline=30))
    async with Host.open(log_tap=False) as host:
        await host.start_actor(StuckObserver())
        session = await host.open_session(agent)
        await session.run("one")
        await session.run("two")
        with trio.fail_after(1000):
            third = await session.run("three")
    assert (third.finish_reason, third.budget) == ("budget", "deadline")


async def test_a_host_closing_ends_a_turn_an_observer_that_blocks_holds(autojump_clock):
    store = MemoryStore()
    agent = Agent(provider=ScriptedProvider([["a"], ["b"], ["c"]]))  # no deadline
    with trio.fail_after(1000), trio.move_on_after(100):
        async with Host.open(store=store, log_tap=False) as host:
            await host.start_actor(StuckObserver())
            session = await host.open_session(agent, "s")
            for text in ("one", "two", "three"):
                await session.run(text)
    stored = await store.load("s")
    assert stored is not None and [m.role for m in stored.messages] == ["user", "assistant"] * 3
    assert stored.messages[5].interrupted  # type: ignore[union-attr]


async def test_an_agent_shared_by_two_hosts_of_one_run_serves_one_after_the_other_closed(
    autojump_clock,
):
    # Each host ran the provider; the first to close set the nursery both served in to
    # None, and the other host's next turn crashed the provider (AssertionError).
    agent = Agent(provider=ScriptedProvider([["hi"]] * 3))
    async with Host.open(log_tap=False) as first:
        session = await first.open_session(agent)
        async with Host.open(log_tap=False) as second:
            await (await second.open_session(agent)).run("one")
        result = await session.run("two")
    assert (result.finish_reason, result.text) == ("stop", "hi")


async def test_a_host_closing_while_serving_another_hosts_call_fails_that_call_at_once(
    autojump_clock,
):
    # The second host's task took the first host's model call from the provider's one
    # inbox; closing, it cancelled the call, and the first host's turn waited for ever.
    slow = [TextChunk(text="a "), Sleep(5), TextChunk(text="b")]
    agent = Agent(provider=ScriptedProvider([slow] * 3))
    results: list[object] = []
    async with Host.open(log_tap=False) as first:
        session = await first.open_session(agent)
        async with trio.open_nursery() as nursery:
            async with Host.open(log_tap=False) as second:
                await (await second.open_session(agent)).run("first")  # taken by `first`'s
                nursery.start_soon(lambda: _run_into(session, "go", results))
                await trio.sleep(1)
        with trio.fail_after(100):
            again = await session.run("again")
    (cut,) = results
    assert cut.text == "a b" or (  # type: ignore[attr-defined]
        cut.finish_reason == "error"  # type: ignore[attr-defined]
        and "the host whose task served the call closed" in cut.error.message  # type: ignore[attr-defined]
    )
    assert again.text == "a b"


async def _run_into(session: object, text: str, results: list[object]) -> None:
    with trio.fail_after(100):
        results.append(await session.run(text))  # type: ignore[attr-defined]


class StalledSink:
    """An application's own log file whose first write stalls (a stalled mount, a network
    handler whose peer stopped reading) until ``flowing`` is set, 10 s at most."""

    def __init__(self) -> None:
        self.flowing = threading.Event()
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        if not self.lines:
            self.flowing.wait(10)
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        pass


@pytest.fixture
def stalled_sink() -> Iterator[StalledSink]:
    sink = StalledSink()
    structlog.configure(
        processors=[structlog.processors.add_log_level, structlog.processors.JSONRenderer()],
        logger_factory=structlog.WriteLoggerFactory(file=sink),  # type: ignore[arg-type]
        wrapper_class=structlog.make_filtering_bound_logger(20),
    )
    try:
        yield sink
    finally:
        sink.flowing.set()
        configure_logging("warning")


def test_an_applications_log_sink_that_stalls_does_not_stall_the_hosts_turns(stalled_sink):
    # The log tap wrote the application's lines on the event loop: the first line's
    # write held the loop, and every turn of the host, as long as the sink stalled.
    agent = Agent(provider=ScriptedProvider([["hi"]] * 3))

    async def three_turns() -> list[str]:
        async with Host.open() as host:  # (its log tap on)
            session = await host.open_session(agent)
            texts = [(await session.run("go")).text for _ in range(3)]
            written.append(len(stalled_sink.lines))  # while the sink stalled
            stalled_sink.flowing.set()  # it takes lines again: the tap's are written
        return texts

    written: list[int] = []
    assert trio.run(three_turns) == ["hi"] * 3
    assert written == [0]  # the turns ran while the first line waited
    kinds = [json.loads(line)["event"] for line in stalled_sink.lines]
    assert kinds.count("turn.finished") == 3
