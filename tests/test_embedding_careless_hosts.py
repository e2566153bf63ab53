"""A concurrent multi-agent application embedding Axon carelessly: hooks that hang,
Ctrl-C landing in an actor's task, streams read from two tasks, streams left unread
while the host closes. Each must end in a clear typed error or a saved turn, never a
hang or a lost turn."""

from __future__ import annotations

import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Budget, Hooks, Host


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
