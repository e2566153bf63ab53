"""A worker's turn confirms its claim before each batch of tools (``TurnCancel.confirm``,
the worker's lease check): a process paused past its lease and woken after a takeover
runs no tool the takeover ran. An agent tool's sub-turn (``Agent.as_tool``) runs its own
tools in a turn of its own: it confirms through the calling turn's confirm, so a worker
woken inside a sub-turn runs no sub-agent tool either. Before, the sub-turn had no
confirm: its tools ran whatever the calling turn's claim said."""

from __future__ import annotations

from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host, tool
from runtime.actor_messages import InferRequest

ran: list[str] = []


@tool
async def record(what: str) -> str:
    """Record ``what`` (the side effect a takeover must not repeat)."""
    ran.append(what)
    return "recorded"


def _helper_model(request: InferRequest) -> list[Any]:
    if current_step(request.messages) == 0:
        return tool_call("record", {"what": "effect"}, tool_call_id="R")
    return ["recorded it"]


def _boss_model(request: InferRequest) -> list[Any]:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "record it"}, tool_call_id="H")
    return ["done"]


def boss() -> Agent:
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_helper_model), tools=[record]
    )
    return Agent(
        name="boss", provider=ScriptedProvider(responder=_boss_model), tools=[helper.as_tool()]
    )


class Claim:
    """A worker's confirm whose claim is lost after ``holds`` confirms: the next one
    cancels the turn, as ``Worker._confirm_claim`` does (``entry.lose``)."""

    def __init__(self, stream: Any, holds: int) -> None:
        self.stream = stream
        self.holds = holds
        self.asked = 0

    async def __call__(self) -> None:
        self.asked += 1
        if self.asked > self.holds:
            self.stream.cancel("lease lapsed before the turn ran a tool")
        await trio.lowlevel.checkpoint()


async def test_a_sub_turn_confirms_through_its_calling_turn_and_runs_no_tool_once_it_is_lost():
    ran.clear()
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(boss(), session_id="s")
        turn = session.stream("go")
        claim = Claim(turn, holds=1)  # the boss's batch (the agent tool) runs; then lost
        turn.confirm_with(claim)
        async with turn as out:
            async for _ in out:
                pass
    assert ran == []
    assert claim.asked == 2  # the boss's batch, then the sub-turn's
    assert out.result is not None and out.result.finish_reason == "aborted"


async def test_a_sub_turn_whose_calling_turn_holds_its_claim_runs_its_tools():
    ran.clear()
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(boss(), session_id="s")
        turn = session.stream("go")
        claim = Claim(turn, holds=10)
        turn.confirm_with(claim)
        async with turn as out:
            async for _ in out:
                pass
    assert claim.asked == 2
    assert ran == ["effect"]
    assert out.result is not None and out.result.text == "done"
