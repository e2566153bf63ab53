"""An agent used as a tool with ``pass_approvals=True`` whose own tool needs approval
(issue 21 item 1): the sub-turn's approval request surfaces on the calling turn, which
suspends; a decision for that approval id on the calling session resumes the sub-turn
from its committed step, then the calling turn with the sub-agent's answer. Embedded
host, SQLite; each tool runs once."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, AlreadyDecided, Host, UnknownApproval, tool
from runtime.actor_messages import InferRequest
from runtime.approval import WAITING_META, pending_calls
from runtime.messages import ToolMessage, UserMessage
from runtime.output import ToolApprovalRequest
from tests.support.grammar import check_grammar
from tests.test_approval_nested_once import DyingStore, _has_result
from tests.test_approval_web import answer, post, request_of
from tests.test_web_http import body
from tests.web.harness import web_server

ran: list[str] = []
sub_steps: list[int] = []


@tool(needs_approval=True)
async def wire_money(to: str) -> str:
    """Wire money."""
    ran.append(to)
    return "wired"


def _last_result(request: InferRequest) -> ToolMessage:
    return [m for m in request.messages if isinstance(m, ToolMessage)][-1]


def _helper_model(request: InferRequest) -> list:
    step = current_step(request.messages)
    sub_steps.append(step)
    if step == 0:
        return tool_call("wire_money", {"to": "x"}, tool_call_id="W")
    result = _last_result(request)
    return [f"not paid: {result.error}" if result.error else "paid"]


def _parent_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "pay x"}, tool_call_id="H")
    result = _last_result(request)
    return [f"parent saw: {result.output if result.error is None else result.error}"]


def parent() -> Agent:
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_helper_model), tools=[wire_money]
    )
    return Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


SUB = "s.helper.H"


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()
    sub_steps.clear()


async def _suspend(host: Host) -> tuple[Any, Any, list]:
    """Run the calling turn to its wait; its session, result and stream."""
    session = await host.open_session(parent(), session_id="s")
    async with session.stream("go") as out:
        chunks = [c async for c in out]
    return session, out.result, chunks


async def _sub_approval_id(host: Host) -> str:
    sub = await host.store.load(SUB)
    (part,) = [
        p
        for m in sub.messages
        for p in getattr(m, "content", ())
        if getattr(p, "awaiting", None) is not None
    ]
    return part.awaiting.id


async def test_the_sub_agents_approval_request_suspends_the_calling_turn(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, result, chunks = await _suspend(host)
        sub_id = await _sub_approval_id(host)
        stored = await host.store.load("s")
        busy = session.busy
    assert result.finish_reason == "awaiting-input"
    assert [(p.approval_id, p.tool_call_id) for p in result.pending] == [(sub_id, "H")]
    asks = [c for c in chunks if isinstance(c, ToolApprovalRequest)]
    assert [(c.tool_call_id, c.approval_id) for c in asks] == [("H", sub_id)]
    check_grammar(chunks)
    assert stored.meta[WAITING_META] == 1 and not busy
    assert not any(isinstance(m, ToolMessage) for m in stored.messages)  # H has no result
    assert ran == [] and sub_steps == [0]


async def test_approving_the_sub_approval_on_the_calling_session_finishes_both_turns(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, asked, _ = await _suspend(host)
        await session.decide(asked.pending[0].approval_id, approved=True)
        async with session.resume() as out:
            chunks = [c async for c in out]
        result = out.result
        sub = await host.store.load(SUB)
    assert (result.finish_reason, result.text) == ("stop", "parent saw: paid")
    assert ran == ["x"] and sub_steps == [0, 1]
    check_grammar(chunks)
    (wired,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    assert (wired.tool_call_id, wired.output) == ("W", "wired")


async def test_a_denial_is_the_sub_agents_to_answer_and_the_caller_gets_its_answer(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, asked, _ = await _suspend(host)
        result = await session.respond(asked.pending[0].approval_id, approved=False, reason="no")
    assert result.finish_reason == "stop"
    assert result.text.startswith("parent saw: not paid: ") and "no" in result.text
    assert ran == [] and sub_steps == [0, 1]


async def test_the_decision_resumes_both_turns_on_a_new_host_on_the_same_file(tmp_path):
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        _, asked, _ = await _suspend(host)
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        result = await session.respond(asked.pending[0].approval_id, approved=True)
    assert (result.finish_reason, result.text) == ("stop", "parent saw: paid")
    assert ran == ["x"] and sub_steps == [0, 1]


async def test_an_approval_id_the_calling_turn_does_not_wait_for_is_refused(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        with pytest.raises(UnknownApproval):
            await session.respond("approval_nope", approved=True)
    assert ran == [] and sub_steps == [0]


async def test_a_continuation_killed_after_the_sub_turn_finished_runs_no_tool_again(tmp_path):
    """The host dies as the calling turn saves ``H``'s result (nothing written): the
    sub-session holds the decision and the finished sub-turn. The retry (a new host)
    takes the sub-turn's answer: ``wire_money`` and the sub-agent's model not again."""
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        _, asked, _ = await _suspend(host)
    store = await DyingStore.open(path)
    store.at, store.after = lambda sid, ms: sid == "s" and _has_result("H")(sid, ms), False
    with trio.CancelScope() as scope:
        store.kill = scope
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(parent(), session_id="s")
            await session.respond(asked.pending[0].approval_id, approved=True)
    assert store.dead and ran == ["x"] and sub_steps == [0, 1]
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
    assert (out.result.finish_reason, out.result.text) == ("stop", "parent saw: paid")
    assert ran == ["x"] and sub_steps == [0, 1]


def _grand_parent() -> Agent:
    """``top`` calls ``middle`` (an agent as a tool) which calls ``helper``."""
    middle = Agent(
        name="middle",
        provider=ScriptedProvider(responder=_middle_model),
        tools=[
            Agent(
                name="helper",
                provider=ScriptedProvider(responder=_helper_model),
                tools=[wire_money],
            ).as_tool(pass_approvals=True)
        ],
    )
    return Agent(
        provider=ScriptedProvider(responder=_top_model),
        tools=[middle.as_tool(pass_approvals=True)],
    )


def _middle_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "pay x"}, tool_call_id="M")
    return [f"middle saw: {_last_result(request).output}"]


def _top_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("middle", {"input": "have x paid"}, tool_call_id="T")
    return [f"top saw: {_last_result(request).output}"]


async def test_an_approval_two_agents_deep_is_answered_on_the_top_session(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_grand_parent(), session_id="s")
        asked = await session.run("go")
        assert asked.finish_reason == "awaiting-input" and ran == []
        result = await session.respond(asked.pending[0].approval_id, approved=True)
    assert (result.finish_reason, result.text) == ("stop", "top saw: middle saw: paid")
    assert ran == ["x"] and sub_steps == [0, 1]


async def test_the_ai_sdk_continuation_approves_the_sub_approval_on_the_calling_call(tmp_path):
    """Over HTTP: the stream asks on ``H`` with the sub-turn's approval id; ``useChat``'s
    continuation answering ``H`` with it runs ``wire_money`` once, ``H`` gets the answer."""
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            asked = request_of(first)
            part = {
                "type": "tool-helper",
                "toolCallId": "H",
                "state": "approval-responded",
                "input": {"input": "pay x"},
                "approval": {"id": asked["approvalId"], "approved": True},
            }
            second = await post(client, answer("s", first[0]["messageId"], part))
    assert asked["toolCallId"] == "H" and first[-2]["finishReason"] == "tool-calls"
    done = [c for c in second[:-1] if c["type"] == "tool-output-available"]
    assert [(c["toolCallId"], c["output"]) for c in done if not c.get("preliminary")] == [
        ("H", "paid")
    ]
    assert second[-2]["type"] == "finish" and second[-2]["finishReason"] == "stop"
    assert ran == ["x"] and sub_steps == [0, 1]


def _typing_parent_model(request: InferRequest) -> list:
    """Calls ``helper`` for ``go``; answers a later message."""
    said = [m.content for m in request.messages if isinstance(m, UserMessage)]
    if said[-1] != "go":
        return ["fine"]
    return _parent_model(request)


async def test_a_new_message_that_supersedes_the_wait_ends_the_sub_turn(tmp_path):
    """Before: the calling turn went on ("superseded"), the sub-session still waited,
    and an approval posted to it ran ``wire_money`` after the caller had gone on."""
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_helper_model), tools=[wire_money]
    )
    agent = Agent(
        provider=ScriptedProvider(responder=_typing_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("go")
        sub_id = await _sub_approval_id(host)
        assert (await session.run("never mind")).text == "fine"
        sub = await host.store.load(SUB)
        sub_session = await host.open_session(helper, session_id=SUB)
        with pytest.raises(AlreadyDecided):
            await sub_session.respond(sub_id, approved=True)
    assert sub.meta[WAITING_META] == 0 and pending_calls(list(sub.messages)) == ()
    assert ran == [] and sub_steps == [0]
