"""A remote A2A agent used as a tool is counted and bounded by its caller's output budget.

A2A carries no token usage, so ``A2AAgent(url).as_tool()`` was neither bounded nor
counted: a caller allowed 100 output tokens could delegate an answer of any length, and
its next call was sent the whole 99 again. The answer is now counted as a server that
reports no usage is (its UTF-8 bytes, at most what the caller has left: no token is
less than a byte), toward the calling turn's usage; past what the caller has left (or
what the batch's account has, beside other calls) it is cut there, the remote task
canceled, and the result says so; the caller, nothing left, ends ``budget``. The remote
agent is an Axon agent served over A2A by the suite's own web server fixture.
"""

from __future__ import annotations

from typing import Any

import trio

from actors.a2a import A2AAgent
from actors.a2a.agent import NOT_CALLED, SPENT_NOTE
from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Budget, Host, ToolMessage
from runtime.actor_messages import InferRequest
from runtime.budget import OutputAccount
from runtime.tools import ToolContext
from tests.test_a2a import BOTH, gated_agent
from tests.web.harness import web_server

ANSWER = "Trio is structured."  # 19 bytes


def lead(remote: Any, budget: Budget, calls: tuple[str, ...] = ("P1",)) -> Agent:
    """Asks the remote agent (tool ``researcher``) in one step, then says ``ok``. Its
    calls write 1 token each (the scripted provider's count)."""

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            ask = {"input": "what is trio?"}
            return [c for i in calls for c in tool_call("researcher", ask, tool_call_id=i)]
        return ["ok"]

    return Agent(
        name="lead", provider=ScriptedProvider(responder=script), tools=[remote], budget=budget
    )


def gated(gate: trio.Event) -> Agent:
    """Says "Working on it. " (16 bytes), then waits in a tool until ``gate`` is set."""
    return gated_agent(gate, first="Working on it. ")


async def ask(remote_agent: Agent, budget: Budget, calls: tuple[str, ...] = ("P1",)) -> Any:
    """The lead's turn: its result, its tool results, its requests, the nested chunks."""
    async with web_server(remote_agent, protocols=BOTH) as server:
        remote = A2AAgent(server.url).as_tool(name="researcher")
        async with Host.open(log_tap=False) as host:
            agent = lead(remote, budget, calls)
            session = await host.open_session(agent, session_id="p")
            with trio.fail_after(30):  # (a call that is not stopped waits for ever)
                async with session.stream("explain trio") as out:
                    chunks = [c async for c in out]
            results = [m for m in session.messages if isinstance(m, ToolMessage)]
        remote_sessions = [s.session_id for s in await server.host.store.list_sessions()]
        stored = [await server.host.store.load(s) for s in remote_sessions]
    nested = [c.chunk for c in chunks if c.type == "tool-stream"]
    return out.result, results, agent.provider.requests, nested, stored


async def test_a_remote_answer_counts_its_bytes_toward_the_callers_output():
    """19 bytes: the caller's next call is sent 100 - 1 - 19 (it was sent 99)."""
    researcher = Agent(name="researcher", provider=ScriptedProvider([ANSWER]))
    result, results, requests, nested, _ = await ask(researcher, Budget(max_output_tokens=100))
    assert [m.output for m in results] == [ANSWER]
    assert [r.max_output_tokens for r in requests] == [100, 80]
    assert result.usage.output_tokens == 1 + 19 + 1
    assert [(c.finish_reason, c.usage.output_tokens) for c in nested if c.type == "finish"] == [
        ("stop", 19)
    ]


async def test_a_remote_answer_past_what_the_caller_has_left_is_cut_and_its_task_canceled():
    """10 left: the answer is cut at 10 bytes, the remote task canceled (its turn saved
    interrupted; it waited in a tool for ever), the nested turn ends ``budget``, and the
    caller, nothing left, ends ``budget`` without another call."""
    gate = trio.Event()  # never set: only a cancel ends the remote turn
    result, results, requests, nested, stored = await ask(gated(gate), Budget(max_output_tokens=11))
    assert [m.output for m in results] == ["Working on\n" + SPENT_NOTE]
    assert len(requests) == 1
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    assert result.usage.output_tokens == 11
    ends = [(c.finish_reason, c.budget) for c in nested if c.type == "finish"]
    assert ends == [("budget", "max_output_tokens")]
    (remote,) = stored
    assert remote.messages[1].interrupted


async def test_remote_calls_at_once_share_what_the_caller_has_left():
    """30 left, two answers of 19: one whole, the other cut at the 11 still left."""
    researcher = Agent(name="researcher", provider=ScriptedProvider([ANSWER]))
    result, results, _, _, _ = await ask(researcher, Budget(max_output_tokens=31), ("P1", "P2"))
    assert sorted(m.output for m in results) == sorted([ANSWER, ANSWER[:11] + "\n" + SPENT_NOTE])
    assert result.usage.output_tokens == 31
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")


async def test_remote_calls_at_once_draw_as_their_bytes_arrive():
    """Two answers of 50 under 30 left: each is cut where the account ran out (it draws
    its bytes as they arrive, holding nothing while its remote turn runs:
    tests/test_output_account_attacks.py), together 30 bytes."""
    researcher = Agent(name="researcher", provider=ScriptedProvider(["x" * 50]))
    result, results, _, _, _ = await ask(researcher, Budget(max_output_tokens=31), ("P1", "P2"))
    texts = [m.output.removesuffix(SPENT_NOTE).rstrip("\n") for m in results]
    assert all(m.output.endswith(SPENT_NOTE) for m in results)
    assert sum(len(t) for t in texts) == 30
    assert result.usage.output_tokens == 31


async def test_a_remote_call_whose_batch_has_nothing_left_is_not_made():
    """Nothing left in the batch's account (the calls beside it spent it): not called
    (the agent's address is never reached)."""
    remote = A2AAgent("http://127.0.0.1:9/").as_tool(name="researcher")
    context = ToolContext(
        host=None,
        session_id="s",
        turn_id="t",
        step=0,
        tool_call_id="c",
        tool_name="researcher",
        emit=None,
        output_left=40,
        output_account=OutputAccount(0),
    )
    assert await remote.call({"input": "q"}, context) == NOT_CALLED


async def test_without_an_output_budget_a_remote_answer_is_neither_cut_nor_counted():
    researcher = Agent(name="researcher", provider=ScriptedProvider([ANSWER]))
    result, results, requests, _, _ = await ask(researcher, Budget())
    assert [m.output for m in results] == [ANSWER]
    assert [r.max_output_tokens for r in requests] == [None, None]
    assert result.usage.output_tokens == 2
