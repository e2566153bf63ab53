"""More than one approval passed up by agents used as tools
(``as_tool(pass_approvals=True)``): two sub-agent calls of one step each suspend for an
approval, and the calling turn waits for both, resumed once both are decided; a sub-turn
with two approvals to ask for (two calls of a sub-step, or a later sub-step asking
again) passes them one at a time on the same calling call, whose continuation waits
again. Embedded host, SQLite; over HTTP too."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host
from runtime.actor_messages import InferRequest
from runtime.messages import ToolCallPart, ToolMessage
from runtime.output import ToolApprovalRequest
from tests.support.grammar import check_grammar
from tests.test_approval_expiry import EPOCH, trio_wall
from tests.test_approval_nested_pass import (
    _clear,  # noqa: F401 (fixture)
    _helper_model,
    ran,
    sub_steps,
    wire_money,
)
from tests.test_approval_web import answer, post, request_of
from tests.test_web_http import body
from tests.web.harness import web_server


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
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    return [", ".join(m.output or "not paid" for m in results)]


def _pays_in_turn_model(request: InferRequest) -> list:
    """Pays x, then (its second step) y; each call asks."""
    step = current_step(request.messages)
    if step < 2:
        return tool_call("wire_money", {"to": "xy"[step]}, tool_call_id=f"W{step + 1}")
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    return [", ".join(m.output or "not paid" for m in results)]


def _parent_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "pay x and y"}, tool_call_id="H")
    (result,) = [m for m in request.messages if isinstance(m, ToolMessage)]
    return [f"parent saw: {result.output or result.error}"]


def _calling(sub_model: Any) -> Agent:
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=sub_model), tools=[wire_money]
    )
    return Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


async def _sub_waits(host: Host) -> list[tuple[str, bool]]:
    sub = await host.store.load("s.helper.H")
    return [
        (p.awaiting.id, p.awaiting.decided)
        for m in sub.messages
        for p in getattr(m, "content", ())
        if isinstance(p, ToolCallPart) and p.awaiting is not None
    ]


async def test_a_sub_step_waiting_for_two_approvals_passes_the_first(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_calling(_pays_twice_model), session_id="s")
        asked = await session.run("go")
        waits = await _sub_waits(host)
    assert asked.finish_reason == "awaiting-input"
    assert [(p.tool_call_id, p.approval_id) for p in asked.pending] == [("H", waits[0][0])]
    assert [decided for _, decided in waits] == [False, False] and ran == []


async def test_the_callers_continuation_asks_for_the_second_approval_on_the_same_call(tmp_path):
    """Before: the sub-turn's two approvals were the tool error; nothing could pass
    the second one up, and the calling turn could not wait again."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_calling(_pays_twice_model), session_id="s")
        asked = await session.run("go")
        await session.decide(asked.pending[0].approval_id, approved=True)
        async with session.resume() as out:
            chunks = [c async for c in out]
        again = out.result
        waits = await _sub_waits(host)
    assert again.finish_reason == "awaiting-input"
    assert [(p.tool_call_id, p.approval_id) for p in again.pending] == [("H", waits[1][0])]
    asks = [(c.tool_call_id, c.approval_id) for c in chunks if isinstance(c, ToolApprovalRequest)]
    assert asks == [("H", waits[1][0])]
    check_grammar(chunks)
    assert ran == []  # the sub-step's calls run once both are decided


async def test_both_approvals_decided_in_turn_run_the_sub_step_and_finish_both(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_calling(_pays_twice_model), session_id="s")
        asked = await session.run("go")
        again = await session.respond(asked.pending[0].approval_id, approved=True)
        assert again.finish_reason == "awaiting-input"
        result = await session.respond(again.pending[0].approval_id, approved=False)
        stored = await host.store.load("s")
    assert (result.finish_reason, result.text) == ("stop", "parent saw: wired, not paid")
    assert ran == ["x"]
    assert [m.tool_call_id for m in stored.messages if isinstance(m, ToolMessage)] == ["H"]


async def test_a_sub_turn_asking_again_in_a_later_step_asks_the_caller_again(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_calling(_pays_in_turn_model), session_id="s")
        asked = await session.run("go")
        again = await session.respond(asked.pending[0].approval_id, approved=True)
        assert again.finish_reason == "awaiting-input" and ran == ["x"]
        result = await session.respond(again.pending[0].approval_id, approved=True)
    assert (result.finish_reason, result.text) == ("stop", "parent saw: wired, wired")
    assert sorted(ran) == ["x", "y"]


def _on_h(approval_id: str) -> dict[str, Any]:
    return {
        "type": "tool-helper",
        "toolCallId": "H",
        "state": "approval-responded",
        "input": {"input": "pay x and y"},
        "approval": {"id": approval_id, "approved": True},
    }


async def test_the_ai_sdk_continuation_streams_the_next_approval_request_on_the_call(tmp_path):
    async with web_server(_calling(_pays_twice_model), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            message_id = first[0]["messageId"]
            second = await post(
                client, answer("s", message_id, _on_h(request_of(first)["approvalId"]))
            )
            asked_again = request_of(second)
            third = await post(client, answer("s", message_id, _on_h(asked_again["approvalId"])))
    assert asked_again["toolCallId"] == "H"
    assert asked_again["approvalId"] != request_of(first)["approvalId"]
    assert second[-2]["type"] == "finish" and second[-2]["finishReason"] == "tool-calls"
    done = [c for c in third[:-1] if c["type"] == "tool-output-available"]
    assert [(c["toolCallId"], c["output"]) for c in done if not c.get("preliminary")] == [
        ("H", "wired, wired")
    ]
    assert sorted(ran) == ["x", "y"]


async def test_the_next_passed_approval_expires_at_the_sub_agents_deadline(autojump_clock):
    helper = Agent(
        name="helper",
        provider=ScriptedProvider(responder=_pays_twice_model),
        tools=[wire_money],
        approval_timeout=60,
    )
    agent = Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        session = await host.open_session(agent, session_id="s")
        asked = await session.run("go")
        await trio.sleep(10)
        again = await session.respond(asked.pending[0].approval_id, approved=True)
        waiting = [p for p in session.messages[1].content if isinstance(p, ToolCallPart)]
        await trio.sleep(51)
        text = "".join(getattr(p, "text", "") for p in session.messages[1].content)
    assert again.finish_reason == "awaiting-input"
    assert waiting[0].awaiting.expires_at == EPOCH + 60  # the sub-step's own deadline
    assert text == "parent saw: wired, not paid" and ran == ["x"]
