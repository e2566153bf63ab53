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
import trio

from actors.providers import OpenAIProvider
from runtime import Agent, Budget, Host, Usage, tool
from runtime.errors import ConfigurationError
from runtime.messages import ToolMessage
from tests.support.loopback import Reply, loopback_server
from tests.test_approval_nested_once import DyingStore, _has_result
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


def deploying(usage: int, call: str = "call_s") -> Reply:
    """The sub-agent's step asking for ``deploy`` (a call that needs approval)."""
    asks = json.dumps({"target": "prod"})
    return Reply(body=chat(call=(call, "deploy", asks), finish="tool_calls", usage=usage))


def waiting_caller(url: str) -> Agent:
    """A caller (100 output tokens) whose helper passes its approvals up to it."""
    provider = OpenAIProvider("m", base_url=url + "/v1", api_key=KEY)
    sub = Agent(name="helper", provider=provider, tools=[deploy])
    return Agent(
        provider=provider,
        tools=[sub.as_tool(pass_approvals=True)],
        budget=Budget(max_output_tokens=100),
    )


async def approved(replies: list[Reply], waits: int = 1) -> tuple[Any, list[dict[str, Any]]]:
    """The calling turn run to its wait, then approved ``waits`` times: its last result
    and the request bodies."""
    async with loopback_server(*replies) as server:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(waiting_caller(server.url), session_id="s")
            result = await session.run("Ask the helper.")
            for _ in range(waits):
                assert result.finish_reason == "awaiting-input", result.error
                result = await session.respond(result.pending[0].approval_id, approved=True)
        return result, [r.json() for r in server.requests]


WAITED = [
    calling(18),
    deploying(10),
    Reply(body=chat(texts=("Deployed.",), usage=2)),
    Reply(body=chat(texts=("It is deployed.",), usage=4)),
]
"""The caller writes 18 and calls the helper, which writes 10 and waits for approval;
approved, the helper writes 2 and answers, the caller 4: 34 written, 40 prompt tokens."""


async def test_a_sub_turn_gone_on_after_its_approval_may_write_what_its_caller_has_left():
    """The caller (100) wrote 18 and its sub-turn 10 before the wait: 72 left. The
    sub-turn, resumed with its 10 committed, is sent 72: what it may write beyond them
    (counted against the bound twice, it was sent 62)."""
    result, bodies = await approved(list(WAITED))
    assert result.error is None, result.error
    assert [b.get("max_tokens") for b in bodies][:3] == [100, 82, 72]


async def test_a_sub_turns_tokens_before_its_wait_count_once_for_its_caller():
    """Counted when the caller suspended, the sub-turn's 10 were counted again in the
    whole usage its resumed turn reports: 44 written for 34, and the caller's last call
    sent 100 - 18 - 10 - 12 = 60, not 70."""
    result, bodies = await approved(list(WAITED))
    assert [b.get("max_tokens") for b in bodies] == [100, 82, 72, 70]
    assert (result.usage.output_tokens, result.usage.input_tokens) == (34, 40)


async def test_a_sub_turn_that_waits_twice_has_each_of_its_tokens_counted_once():
    """Held again after its first approval (3 more written), then approved: each go-on
    adds what the sub-turn wrote since the caller's last count (3, then 2), not all of
    its usage again (13, then 15: the last call sent 44)."""
    replies = [calling(18), deploying(10), deploying(3, "call_t")]
    replies += [Reply(body=chat(texts=("Deployed.",), usage=2))]
    replies += [Reply(body=chat(texts=("It is deployed.",), usage=4))]
    result, bodies = await approved(replies, waits=2)
    assert result.error is None, result.error
    assert [b.get("max_tokens") for b in bodies] == [100, 82, 72, 69, 67]
    assert result.usage.output_tokens == 18 + 10 + 3 + 2 + 4


async def test_a_continuation_retried_after_its_sub_turn_finished_counts_it_once(tmp_path):
    """The host dies as the calling turn saves the helper's result (nothing written): the
    sub-session holds its finished turn (12 written, its saved usage). The retry on a new
    host takes that answer; it adds the 2 written after the wait (read from the caller's
    stored wait, not the sub-session's usage at the go-on, which is all 12 by then: the
    2 would be lost, the last call sent 72), and its last call is sent 70."""
    path = tmp_path / "s.db"
    async with loopback_server(*WAITED) as server:
        async with Host.open(store=path, log_tap=False) as host:
            session = await host.open_session(waiting_caller(server.url), session_id="s")
            asked = await session.run("Ask the helper.")
        store = await DyingStore.open(path)
        store.at, store.after = lambda sid, ms: sid == "s" and _has_result("call_1")(sid, ms), False
        with trio.CancelScope() as scope:
            store.kill = scope
            async with Host.open(store=store, log_tap=False) as host:
                session = await host.open_session(waiting_caller(server.url), session_id="s")
                await session.respond(asked.pending[0].approval_id, approved=True)
        assert store.dead and len(server.requests) == 3
        async with Host.open(store=path, log_tap=False) as host:
            session = await host.open_session(waiting_caller(server.url), session_id="s")
            async with session.resume() as out:
                async for _ in out:
                    pass
        bodies = [r.json() for r in server.requests]
    assert out.result.error is None, out.result.error
    assert [b.get("max_tokens") for b in bodies] == [100, 82, 72, 70]
    assert out.result.usage.output_tokens == 34


async def test_a_superseded_turns_approved_sub_turn_counts_only_its_tokens_after_the_wait():
    """Approved, then a new message instead of the continuation: the new turn runs the
    call first and counts the 2 its sub-turn wrote after the wait (the 10 before it were
    the waiting turn's), so its own call is sent 98 (it counted 12 and was sent 88). The
    sub-turn itself may write what the new turn has left: 100."""
    replies = [*WAITED[:3], Reply(body=chat(texts=("Hello.",), usage=4))]
    async with loopback_server(*replies) as server:
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(waiting_caller(server.url), session_id="s")
            asked = await session.run("Ask the helper.")
            await session.decide(asked.pending[0].approval_id, approved=True)
            result = await session.run("Hello?")
        bodies = [r.json() for r in server.requests]
    assert result.error is None, result.error
    assert [b.get("max_tokens") for b in bodies] == [100, 82, 100, 98]
    assert result.usage.output_tokens == 2 + 4
