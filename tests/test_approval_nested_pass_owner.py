"""Who decides a sub-agent's approval that was passed up to its caller
(``as_tool(pass_approvals=True)``): the calling session, alone. A decision addressed to
the sub-session itself (``respond`` there, an HTTP continuation naming it) is refused
with :class:`~runtime.errors.CallerDecides` (409 over HTTP), whatever order the two
come in, so the caller's decision is the one the sub-agent gets; the sub-agent's own
``approval_timeout`` is the caller's deadline too. Embedded host, SQLite."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, CallerDecides, Host, SessionBusy, UnknownApproval
from runtime.actor_messages import InferRequest
from runtime.approval import pending_calls
from runtime.events import ToolApprovalExpired
from tests.test_approval_expiry import trio_wall
from tests.test_approval_nested_pass import (
    SUB,
    _clear,  # noqa: F401 (fixture)
    _grand_parent,
    _helper_model,
    _last_result,
    _sub_approval_id,
    _suspend,
    parent,
    ran,
    sub_steps,
    wire_money,
)
from tests.test_approval_web import answer, post
from tests.test_web_http import body
from tests.web.harness import web_server


def helper() -> Agent:
    return Agent(
        name="helper", provider=ScriptedProvider(responder=_helper_model), tools=[wire_money]
    )


async def test_respond_on_the_sub_session_while_its_caller_waits_is_refused(tmp_path):
    """Before: the sub-session ran ``wire_money`` on its own approval, and the caller's
    later denial got ``parent saw: paid``."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, asked, _ = await _suspend(host)
        sub_id = asked.pending[0].approval_id
        sub_session = await host.open_session(helper(), session_id=SUB)
        with pytest.raises(CallerDecides, match="'s'"):
            await sub_session.respond(sub_id, approved=True)
        await sub_session.close()
        assert ran == []
        result = await session.respond(sub_id, approved=False, reason="no")
    assert result.text.startswith("parent saw: not paid: ") and "no" in result.text
    assert ran == [] and sub_steps == [0, 1]


async def test_decide_on_the_sub_session_records_nothing(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        _, asked, _ = await _suspend(host)
        sub_session = await host.open_session(helper(), session_id=SUB)
        with pytest.raises(CallerDecides):
            await sub_session.decide(asked.pending[0].approval_id, approved=True)
        sub = await host.store.load(SUB)
    assert [c.decided for c in pending_calls(list(sub.messages))] == [False]


async def test_the_sub_approval_id_sent_to_another_session_is_unknown_there(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        _, asked, _ = await _suspend(host)
        other = await host.open_session(parent(), session_id="t")
        await other.run("go")  # waits too, for an approval of its own sub-agent
        with pytest.raises(UnknownApproval):
            await other.respond(asked.pending[0].approval_id, approved=True)
    assert ran == []


async def test_racing_decisions_on_caller_and_sub_session_give_the_callers(tmp_path):
    """The sub-session opened with the very agent the caller's tool runs (an open of it
    with another agent is ``SessionBusy``, for the caller's call too)."""
    sub_agent = helper()
    calling = Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[sub_agent.as_tool(pass_approvals=True)],
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(calling, session_id="s")
        asked = await session.run("go")
        sub_id = asked.pending[0].approval_id
        sub_session = await host.open_session(sub_agent, session_id=SUB)
        refused: list[Exception] = []
        got: list = []

        async def on_sub() -> None:
            try:
                await sub_session.respond(sub_id, approved=True)
            except CallerDecides as exc:
                refused.append(exc)

        async def on_caller() -> None:
            got.append(await session.respond(sub_id, approved=False, reason="no"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_sub)
            nursery.start_soon(on_caller)
    assert len(refused) == 1 and got[0].text.startswith("parent saw: not paid")
    assert ran == [] and sub_steps == [0, 1]


def _on_w(sub_id: str) -> dict[str, Any]:
    """The sub-agent's call, answered as ``useChat`` would on a page showing the
    sub-session."""
    return {
        "type": "tool-wire_money",
        "toolCallId": "W",
        "state": "approval-responded",
        "input": {"to": "x"},
        "approval": {"id": sub_id, "approved": True},
    }


async def test_an_http_continuation_addressed_to_the_sub_session_is_a_409(tmp_path):
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await post(client, body("s"))
            sub = await _load(SUB, tmp_path)
            sub_id = await _sub_approval_id_in(tmp_path)
            response = await client.post(
                "/api/chat", json=answer(SUB, sub.messages[1].id, _on_w(sub_id))
            )
        after = await _load(SUB, tmp_path)
    assert response.status_code == 409 and "'s'" in response.text, response.text
    assert [c.decided for c in pending_calls(list(after.messages))] == [False]
    assert ran == []


async def test_the_callers_approval_runs_after_the_web_app_opened_the_sub_session(tmp_path):
    """The web app opens a session a request names with the agent it serves: before,
    the calling call's open of its sub-session (with the sub-agent) then failed with
    ``SessionBusy`` (``already open with another agent``) and the approval was lost."""
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            sub = await _load(SUB, tmp_path)
            sub_id = await _sub_approval_id_in(tmp_path)
            await client.post("/api/chat", json=answer(SUB, sub.messages[1].id, _on_w(sub_id)))
            part = {
                "type": "tool-helper",
                "toolCallId": "H",
                "state": "approval-responded",
                "input": {"input": "pay x"},
                "approval": {"id": sub_id, "approved": True},
            }
            second = await post(client, answer("s", first[0]["messageId"], part))
    done = [
        (c["toolCallId"], c.get("output"), c.get("errorText"))
        for c in second
        if isinstance(c, dict)
        and c.get("type", "").startswith("tool-output")
        and not c.get("preliminary")
    ]
    assert done == [("H", "paid", None)], second
    assert ran == ["x"] and sub_steps == [0, 1]


async def _sub_approval_id_in(tmp_path) -> str:
    async with Host.open(store=tmp_path / "w.db", log_tap=False) as host:
        return await _sub_approval_id(host)


async def _load(session_id: str, tmp_path) -> Any:
    async with Host.open(store=tmp_path / "w.db", log_tap=False) as host:
        return await host.store.load(session_id)


def _timed_helper() -> Agent:
    return Agent(
        name="helper",
        provider=ScriptedProvider(responder=_helper_model),
        tools=[wire_money],
        approval_timeout=60,
    )


def _timed_parent() -> Agent:
    return Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[_timed_helper().as_tool(pass_approvals=True)],
    )


def _parent_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "pay x"}, tool_call_id="H")
    result = _last_result(request)
    return [f"parent saw: {result.output if result.error is None else result.error}"]


async def test_the_caller_waits_until_the_sub_agents_deadline(autojump_clock):
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        session = await host.open_session(_timed_parent(), session_id="s")
        asked = await session.run("go")
    assert asked.pending[0].approval_id == session.messages[1].content[0].awaiting.id
    assert session.messages[1].content[0].awaiting.expires_at == trio_wall() + 60


async def test_the_sub_agents_timeout_denies_the_wait_and_both_turns_finish(autojump_clock):
    """Before: the sub-session's timer resumed the sub-turn alone; the caller waited
    for ever for a decision that had been made."""
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        events = host.bus.subscribe([ToolApprovalExpired], name="t")
        session = await host.open_session(_timed_parent(), session_id="s")
        await session.run("go")
        await trio.sleep(61)
        expired = events.inbox.get_nowait()
        await trio.sleep(1)
        text = "".join(getattr(p, "text", "") for p in session.messages[1].content)
    assert (expired.session_id, expired.tool_call_id) == ("s", "H")
    assert text.startswith("parent saw: not paid") and "timed out" in text
    assert session.pending == () and ran == [] and sub_steps == [0, 1]


async def test_the_callers_approval_before_the_deadline_holds_past_it(autojump_clock):
    """Decided at 59 s, resumed at 61 s: the sub-session takes the caller's approval
    though its own deadline has passed by then (the caller's was checked)."""
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        session = await host.open_session(_timed_parent(), session_id="s")
        asked = await session.run("go")
        await trio.sleep(59)
        await session.decide(asked.pending[0].approval_id, approved=True)
        await trio.sleep(2)
        async with session.resume() as out:
            async for _ in out:
                pass
    assert out.result.text == "parent saw: paid" and ran == ["x"]


async def test_a_new_message_to_the_sub_session_while_its_caller_waits_is_refused(tmp_path):
    """Before: it superseded the sub-turn's wait; the caller's approval then ran
    nothing (``parent saw: `` with the superseded sub-turn's empty answer)."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, asked, _ = await _suspend(host)
        other = Agent(name="other", provider=ScriptedProvider([["hi there"]]))
        sub_session = await host.open_session(other, session_id=SUB)
        with pytest.raises(SessionBusy, match="'s'"):
            await sub_session.run("hello")
        await sub_session.close()
        result = await session.respond(asked.pending[0].approval_id, approved=True)
    assert result.text == "parent saw: paid" and ran == ["x"]


async def test_a_new_message_posted_for_the_sub_session_is_a_409(tmp_path):
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await post(client, body("s"))
            response = await client.post("/api/chat", json=body(SUB))
        after = await _load(SUB, tmp_path)
    assert response.status_code == 409, response.text
    assert [c.decided for c in pending_calls(list(after.messages))] == [False]


async def test_a_decision_on_the_middle_session_two_agents_deep_is_refused(tmp_path):
    """``top`` -> ``middle`` -> ``helper``: ``middle``'s call waits for the same id for
    ``top``; only ``top`` decides it."""
    agent = _grand_parent()
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        asked = await session.run("go")
        middle_session = await host.open_session(helper(), session_id="s.middle.T")
        with pytest.raises(CallerDecides, match="'s'"):
            await middle_session.decide(asked.pending[0].approval_id, approved=True)
        await middle_session.close()
        result = await session.respond(asked.pending[0].approval_id, approved=True)
    assert (result.finish_reason, result.text) == ("stop", "top saw: middle saw: paid")
    assert ran == ["x"]
