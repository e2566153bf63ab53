"""The approved calls of a turn a new message replaced run as the next turn begins
(``Suspending._run_quietly``). In a worker that batch confirms the claim first, as every
other batch of tools does (``Turn.confirm``, the worker's lease check): a worker woken
past its lease after a takeover runs none of them again. Before, that batch ran
without asking."""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, tool
from tests.support.claims import Claim

ran: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file (the side effect a takeover must not repeat)."""
    ran.append(path)
    return f"deleted {path}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


async def next_turn_after_an_approval(holds: int) -> tuple[Claim, Any]:
    answers = [tool_call("delete_file", {"path": "/x"}, tool_call_id="D"), ["fine"]]
    model = ScriptedProvider(responder=lambda request: answers.pop(0))
    agent = Agent(provider=model, tools=[delete_file])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        first = await session.run("delete /x")
        assert (await session.decide(first.pending[0].approval_id, approved=True)).complete
        turn = session.stream("and then?")  # nobody resumed: the approved call runs now
        claim = Claim(turn, holds)
        turn.confirm_with(claim)
        async with turn as out:
            async for _ in out:
                pass
    return claim, out.result


async def test_a_replaced_turn_s_approved_call_is_not_run_once_the_claim_is_lost():
    claim, result = await next_turn_after_an_approval(holds=0)
    assert ran == []
    assert claim.asked == 1
    assert result is not None and result.finish_reason == "aborted"


async def test_a_replaced_turn_s_approved_call_runs_once_the_claim_is_confirmed():
    claim, result = await next_turn_after_an_approval(holds=10)
    assert ran == ["/x"]
    assert claim.asked == 1  # the approved batch; the model then answers with no tool
    assert result is not None and result.text == "fine"
