"""An application embedding Axon carelessly: a host cancelled from outside, streams
left unread, misbehaving tools and observers, misused API. Each must end in a clear
typed error or a saved turn, never a hang or a lost turn."""

from __future__ import annotations

import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from actors.stores.memory import MemoryStore
from runtime import Agent, Host, TextChunk


def stalling_agent() -> Agent:
    """Says "Hello " and then stalls for a minute."""
    steps = [[TextChunk(text="Hello "), Sleep(60), TextChunk(text="world")]]
    return Agent(provider=ScriptedProvider(steps))


async def test_a_host_cancelled_from_outside_mid_turn_saves_the_turn_interrupted(
    autojump_clock,
):
    store = MemoryStore()
    with trio.move_on_after(1):
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(stalling_agent(), session_id="s")
            async with session.stream("hi") as out:
                async for _ in out:
                    pass
    stored = await store.load("s")
    assert out.result is not None and out.result.saved
    assert [m.role for m in stored.messages] == ["user", "assistant"]
    assert stored.messages[1].interrupted and stored.messages[1].text == "Hello "

