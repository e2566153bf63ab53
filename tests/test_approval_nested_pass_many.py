"""More than one approval passed up by agents used as tools
(``as_tool(pass_approvals=True)``): two sub-agent calls of one step each suspend for an
approval, and the calling turn waits for both, resumed once both are decided; a sub-step
that waits for two approvals at once is still refused as the tool error (docs/approval.md
"Not yet"). Embedded host, SQLite."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host
from runtime.actor_messages import InferRequest
from runtime.messages import ToolCallPart, ToolMessage
from runtime.output import ToolApprovalRequest
from tests.support.grammar import check_grammar
from tests.test_approval_nested_pass import (
    _clear,  # noqa: F401 (fixture)
    _helper_model,
    ran,
    sub_steps,
    wire_money,
)


def _two_calls_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return [
            *tool_call("helper", {"input": "pay x"}, tool_call_id="H1"),
            *tool_call("helper", {"input": "pay y"}, tool_call_id="H2"),
        ]
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    return ["parent saw: " + ", ".join(f"{m.tool_call_id}={m.output or m.error}" for m in results)]


def _two_sub_agents() -> Agent:
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_helper_model), tools=[wire_money]
    )
    return Agent(
        provider=ScriptedProvider(responder=_two_calls_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


async def test_two_sub_agent_calls_of_one_step_each_pass_their_approval(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_two_sub_agents(), session_id="s")
        async with session.stream("go") as out:
            chunks = [c async for c in out]
    asked = out.result
    assert asked.finish_reason == "awaiting-input"
    assert [p.tool_call_id for p in asked.pending] == ["H1", "H2"]
    asks = [c.tool_call_id for c in chunks if isinstance(c, ToolApprovalRequest)]
    assert asks == ["H1", "H2"]
    check_grammar(chunks)
    assert ran == []


async def test_the_caller_resumes_once_both_passed_approvals_are_decided(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_two_sub_agents(), session_id="s")
        asked = await session.run("go")
        first, second = (p.approval_id for p in asked.pending)
        assert await session.respond(second, approved=False, reason="no") is None
        assert ran == []
        result = await session.respond(first, approved=True)
    assert result.finish_reason == "stop"
    assert result.text.startswith("parent saw: H1=paid, H2=not paid: ")
    assert ran == ["x"] and sorted(sub_steps) == [0, 0, 1, 1]


def _pays_twice_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return [
            *tool_call("wire_money", {"to": "x"}, tool_call_id="W1"),
            *tool_call("wire_money", {"to": "y"}, tool_call_id="W2"),
        ]
    return ["paid both"]


def _parent_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "pay x and y"}, tool_call_id="H")
    (result,) = [m for m in request.messages if isinstance(m, ToolMessage)]
    return [f"parent saw: {result.output or result.error}"]


async def test_a_sub_step_waiting_for_two_approvals_is_the_tool_error_and_ends(tmp_path):
    """Pinned: one approval passes at a time. Two in one sub-step do not suspend the
    caller; its model is told the sub-agent did not finish, and the sub-turn is ended
    (both calls denied, nothing left to decide anywhere)."""
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_pays_twice_model), tools=[wire_money]
    )
    agent = Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("go")
        sub = await host.store.load("s.helper.H")
    assert result.finish_reason == "stop" and result.pending == ()
    assert "wire_money (approval), wire_money (approval)" in result.text
    assert "did not finish" in result.text
    waits = [
        p.awaiting
        for m in sub.messages
        for p in getattr(m, "content", ())
        if isinstance(p, ToolCallPart)
    ]
    assert [(w.decided, w.approved) for w in waits] == [(True, False), (True, False)]
    assert ran == []
