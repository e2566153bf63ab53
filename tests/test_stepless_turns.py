"""The two turns docs/streaming.md allows to stream ``start finish`` (no step, no
result), produced for real and checked by the grammar checker: a hook on turn start that
ends the turn by its own budget (``finish`` ``budget``), and a durable turn taken over
(``resume=True``) that had been answered already (``finish`` ``stop``)."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from runtime.agent import Hooks
from runtime.errors import BudgetExceeded
from tests.support.grammar import check_grammar


async def _chunks(session, *args, **kwargs) -> tuple[list, object]:
    async with session.stream(*args, **kwargs) as out:
        chunks = [c async for c in out]
    return chunks, out.result


async def test_a_hook_ending_the_turn_by_its_budget_on_turn_start_streams_start_finish():
    async def over_budget(event) -> None:
        raise BudgetExceeded("credits")

    agent = Agent(provider=ScriptedProvider([["never"]]), hooks=Hooks(on_turn_start=over_budget))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        chunks, result = await _chunks(session, "go")
    assert [c.type for c in chunks] == ["start", "finish"]
    assert (result.finish_reason, result.budget) == ("budget", "credits")
    check_grammar(chunks)


async def test_a_takeover_of_a_turn_answered_already_streams_start_finish():
    agent = Agent(provider=ScriptedProvider([["the answer"]]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        ids = {"turn_id": "turn_d", "message_id": "msg_d", "resume": True}
        await _chunks(session, "go", **ids)
        chunks, result = await _chunks(session, "go", **ids)
    assert [c.type for c in chunks] == ["start", "finish"]
    assert (result.finish_reason, result.text) == ("stop", "the answer")
    check_grammar(chunks)
