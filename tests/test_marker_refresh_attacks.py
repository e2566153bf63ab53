"""Attacks on the marker refreshes of a claiming host's long step (branch ``markers``,
``Saving._touching``), branch ``attackmarkers``."""

from __future__ import annotations

from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import liveness
from runtime.agent import Agent
from runtime.app.host import Host
from runtime.liveness import RUNNING_META
from runtime.tools import tool

TTL = 900.0
CALL = 2000.0


@tool(timeout=CALL + 1)
async def slow() -> str:
    """Take a long time."""
    await trio.sleep(CALL)
    return "slept"


@tool(needs_approval=True)
async def risky() -> str:
    """Needs a person's yes."""
    return "done"


async def test_a_long_tool_beside_a_call_held_for_approval_keeps_its_marker(
    tmp_path, monkeypatch, autojump_clock
):
    """A step whose calls are a held one and a long one: while the long one runs, the
    turn goes on (its step save comes after it), so a refresh stores the marker fresh;
    it cleared it (the held call made it a save "the turn may end at"), and the session
    looked idle to another process while its tool ran."""
    monkeypatch.setattr(liveness, "_wall", trio.current_time)
    monkeypatch.setenv(liveness.MARKER_TTL_ENV, str(TTL))
    steps: list[Any] = [
        [*tool_call("risky", {}, tool_call_id="c0"), *tool_call("slow", {}, tool_call_id="c1")]
    ]
    agent = Agent(provider=ScriptedProvider(steps=steps), tools=[slow, risky])
    async with Host.open(store=str(tmp_path / "one.db"), log_tap=False) as host:
        host.claims_turns = True
        session = await host.open_session(agent, session_id="s")
        seen: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def look() -> None:
                await trio.sleep(TTL)  # (the tool runs: two refreshes made)
                record = await host.store.load("s")
                seen.append(record.meta.get(RUNNING_META))

            nursery.start_soon(look)
            result = await session.run("go")
        record = await host.store.load("s")
    assert result.finish_reason == "awaiting-input"
    assert record.meta.get(RUNNING_META) is None  # (the step's save: the turn waits)
    assert seen[0] is not None
    assert seen[0]["at"] >= TTL - TTL / liveness.TOUCHES_PER_TTL
