"""An application embedding Axon with actors of its own: a replacement tool executor that
crashes, observers and executors shared by hosts, plug-ins that misbehave at start or
never read. Each must end in a clear error or a saved turn, never a hang, a lost
request or a silent second task on one inbox."""

from __future__ import annotations

import threading

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.memory import MemoryStore
from actors.tool_executor import ToolExecutor
from runtime import (
    Actor,
    Agent,
    Budget,
    ConfigurationError,
    Host,
    RestartPolicy,
    run_sync,
    tool,
)
from runtime.events import TurnFinished


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
