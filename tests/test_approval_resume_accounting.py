"""What a continuation counts (docs/approval.md): a call approved while the turn waited
runs in the continuation, and what it spent is the turn's as it would have been had it
run at once: an agent used as a tool spends tokens, which count toward the parent turn's
usage and its token budget."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, Host
from runtime.chunks import Usage
from tests.support.grammar import check_grammar

CALL = Usage(input_tokens=100, output_tokens=10, total_tokens=110)  # each model call's


def parent(budget: Budget | None = None) -> Agent:
    helper = Agent(name="helper", provider=ScriptedProvider([["sub answer"]], usage=CALL))
    return Agent(
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "do"}, tool_call_id="H")], ["ok"]], usage=CALL
        ),
        tools=[helper.as_tool(needs_approval=True)],
        budget=budget or Budget(),
    )


async def test_an_approved_sub_agents_tokens_count_toward_the_continued_turn():
    """Before: 220 tokens (the parent's two calls), the sub-agent's 110 lost."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        asked = await session.run("go")
        result = await session.respond(asked.pending[0].approval_id, approved=True)
    assert result is not None and result.usage.total_tokens == 330
    assert session.messages[1].usage.total_tokens == 330


async def test_an_approved_sub_agent_past_the_token_budget_ends_the_turn_before_the_model():
    """Before: the turn went on to its next model call and finished ``stop``."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(parent(Budget(max_total_tokens=200)), session_id="s")
        asked = await session.run("go")
        result = await session.respond(asked.pending[0].approval_id, approved=True)
    assert result is not None
    assert (result.finish_reason, result.budget) == ("budget", "max_total_tokens")
    assert result.usage.total_tokens == 220 and result.text == ""  # no model call after it


async def test_an_approved_sub_agent_run_before_a_new_message_counts_toward_that_turn():
    """The call approved but never resumed runs as the next message's turn begins: that
    turn spent its tokens. Before: 110 (its own model call), the sub-agent's lost."""
    agent = Agent(
        provider=ScriptedProvider(
            turns=[[[*tool_call("helper", {"input": "do"}, tool_call_id="H")]], [["fine"]]],
            usage=CALL,
        ),
        tools=[
            Agent(name="helper", provider=ScriptedProvider([["sub"]], usage=CALL)).as_tool(
                needs_approval=True
            )
        ],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        asked = await session.run("go")
        await session.decide(asked.pending[0].approval_id, approved=True)
        result = await session.run("and then?")
    assert (result.finish_reason, result.text) == ("stop", "fine")
    assert result.usage.total_tokens == 220


async def test_a_continuation_a_budget_ends_before_any_step_streams_its_results_and_finish():
    """``start``, the sub-agent's result, ``finish`` (``budget``): no step, a shape the
    grammar allows only there (tests/support/grammar). Before, the checker wanted one."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(parent(Budget(max_total_tokens=200)), session_id="s")
        asked = await session.run("go")
        await session.decide(asked.pending[0].approval_id, approved=True)
        async with session.resume() as out:
            chunks = [c async for c in out]
    assert [c.type for c in chunks if c.type != "tool-stream"] == ["start", "tool-result", "finish"]
    assert chunks[-1].finish_reason == "budget"
    check_grammar(chunks)
