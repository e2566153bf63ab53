"""A worker's lease check, played by a test: the confirm a turn awaits before each batch
of tools (``TurnCancel.confirm``; ``Worker._confirm_claim`` in a worker), and the two
agents an agent tool's sub-turn runs in (``boss`` calling ``helper``, whose ``record``
is the side effect a takeover must not repeat)."""

from __future__ import annotations

from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, tool
from runtime.actor_messages import InferRequest

ran: list[str] = []
"""What ``record`` recorded (a test clears it first)."""


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
    """``boss``, whose first step calls the agent tool ``helper``, whose first step calls
    ``record``."""
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
