"""An agent used as a tool writes within what its calling turn has left.

The sub-turn's usage counted toward the caller's, but it ran under the sub-agent's own
budget alone: a caller allowed 100 output tokens called a sub-agent with none, which was
sent no cap and could write thousands (the caller then ended ``budget``, billed for
them). The sub-turn now runs under the smaller of its own budget and the caller's left
(``ToolContext.output_left``, ``Session.stream(max_output_tokens=...)``). Chat
Completions streams from the loopback server, read by the real openai SDK; the requests
come in order: the caller's first step, the sub-agent's, the caller's next.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.providers import OpenAIProvider
from runtime import Agent, Budget, Host, Usage, tool
from runtime.errors import ConfigurationError
from runtime.messages import ToolMessage
from tests.support.loopback import Reply, loopback_server
from tests.test_output_cap_unreported import chat

KEY = "sk-test-not-a-real-key-4243"
CALL = ("call_1", "helper", json.dumps({"input": "do it"}))


async def run(
    replies: list[Reply], caller: Budget, helper: Budget | None = None
) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """The calling turn's result, its stored messages, and the request bodies."""
    async with loopback_server(*replies) as server:
        async with Host.open(log_tap=False) as host:
            provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key=KEY)
            sub = Agent(name="helper", provider=provider, budget=helper or Budget())
            agent = Agent(provider=provider, tools=[sub.as_tool()], budget=caller)
            session = await host.open_session(agent, session_id="s")
            result = await session.run("Ask the helper.")
            stored = list((await host.store.load("s")).messages)
        return result, stored, [r.json() for r in server.requests]


def calling(usage: int) -> Reply:
    return Reply(body=chat(call=CALL, finish="tool_calls", usage=usage))


async def test_a_sub_agent_without_a_budget_is_sent_what_its_caller_has_left():
    replies = [calling(18), Reply(body=chat(texts=("Done.",), usage=2))]
    replies.append(Reply(body=chat(texts=("It is done.",), usage=4)))
    result, _, bodies = await run(replies, Budget(max_output_tokens=100))
    assert result.error is None, result.error
    assert [b.get("max_tokens") for b in bodies] == [100, 82, 80]
    assert result.usage.output_tokens == 18 + 2 + 4


async def test_a_sub_agents_own_smaller_budget_holds():
    replies = [calling(18), Reply(body=chat(texts=("Done.",), usage=2))]
    replies.append(Reply(body=chat(texts=("It is done.",), usage=4)))
    _, _, bodies = await run(replies, Budget(max_output_tokens=100), Budget(max_output_tokens=30))
    assert [b.get("max_tokens") for b in bodies] == [100, 30, 80]


async def test_a_sub_agent_cut_at_its_callers_left_ends_both_turns_budget():
    """The sub-turn ends ``budget`` (its text and a note are the call's result); the
    caller, nothing left, makes no call more and ends ``budget`` too."""
    cut = Reply(body=chat(texts=("Half of it",), finish="length", usage=82))
    result, stored, bodies = await run([calling(18), cut], Budget(max_output_tokens=100))
    assert [b.get("max_tokens") for b in bodies] == [100, 82]
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    [answer] = [m for m in stored if isinstance(m, ToolMessage)]
    assert answer.output == (
        "Half of it\n[the sub-agent stopped before it finished: max_output_tokens reached]"
    )


async def test_a_caller_without_an_output_budget_leaves_its_sub_agent_unbounded():
    replies = [calling(18), Reply(body=chat(texts=("Done.",), usage=2))]
    replies.append(Reply(body=chat(texts=("It is done.",), usage=4)))
    _, _, bodies = await run(replies, Budget())
    assert [b.get("max_tokens") for b in bodies] == [None, None, None]


def test_bounded_lowers_the_output_budget_to_what_this_run_may_write_beyond_its_usage():
    used = Usage(output_tokens=40, total_tokens=40)
    assert Budget(max_output_tokens=100).bounded(None, used) == Budget(max_output_tokens=100)
    assert Budget().bounded(30, used).max_output_tokens == 70  # a resumed turn: 40 written
    assert Budget(max_output_tokens=60).bounded(30, used).max_output_tokens == 60
    assert Budget(max_output_tokens=100).bounded(30, used).max_output_tokens == 70
    assert Budget().bounded(-5, used).max_output_tokens == 40


@pytest.mark.parametrize("bad", [-1, "10", 1.5, True])
async def test_a_turns_max_output_tokens_is_an_int_of_0_or_more(bad):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(model="scripted:demo"), session_id="s")
        with pytest.raises(ConfigurationError):
            session.stream("hi", max_output_tokens=bad)


@tool(needs_approval=True)
async def deploy(target: str = "") -> str:
    """Deploy."""
    return f"deployed {target}"


async def test_a_sub_turn_gone_on_after_its_approval_may_write_what_its_caller_has_left():
    """The caller (100) wrote 18 and its sub-turn 10 before the wait: 72 left. The
    sub-turn, resumed with its 10 committed, is sent 72: what it may write beyond them
    (counted against the bound twice, it was sent 62)."""
    asks = json.dumps({"target": "prod"})
    replies = [
        calling(18),
        Reply(body=chat(call=("call_s", "deploy", asks), finish="tool_calls", usage=10)),
        Reply(body=chat(texts=("Deployed.",), usage=2)),
        Reply(body=chat(texts=("It is deployed.",), usage=4)),
    ]
    async with loopback_server(*replies) as server:
        async with Host.open(log_tap=False) as host:
            provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key=KEY)
            sub = Agent(name="helper", provider=provider, tools=[deploy])
            agent = Agent(
                provider=provider,
                tools=[sub.as_tool(pass_approvals=True)],
                budget=Budget(max_output_tokens=100),
            )
            session = await host.open_session(agent, session_id="s")
            asked = await session.run("Ask the helper.")
            assert asked.finish_reason == "awaiting-input"
            result = await session.respond(asked.pending[0].approval_id, approved=True)
        bodies = [r.json() for r in server.requests]
    assert result.error is None, result.error
    assert [b.get("max_tokens") for b in bodies][:3] == [100, 82, 72]
