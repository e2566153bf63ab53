"""An application embedding Axon with actors of its own: a replacement tool executor that
crashes, observers and executors shared by hosts, plug-ins that misbehave at start or
never read. Each must end in a clear error or a saved turn, never a hang, a lost
request or a silent second task on one inbox."""

from __future__ import annotations

import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.memory import MemoryStore
from runtime import Actor, Agent, Budget, Host, RestartPolicy, tool


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
