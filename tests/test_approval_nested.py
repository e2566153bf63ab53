"""An agent used as a tool whose own tool needs approval (docs/embedding.md, "Agents as
tools"): its sub-turn suspends, the calling model is told it did not finish, and nothing
is left waiting in the sub-session for a client to approve after the fact."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, AlreadyDecided, Host, NothingToResume, tool
from runtime.agent import NESTED_WAIT
from runtime.approval import WAITING_META, pending_calls
from runtime.messages import AssistantMessage, ToolMessage
from tests.test_web_http import body, events
from tests.web.harness import web_server

ran: list[str] = []


@tool(needs_approval=True)
async def wire_money(to: str) -> str:
    """Wire money."""
    ran.append(to)
    return "wired"


def parent() -> Agent:
    helper = Agent(
        name="helper",
        provider=ScriptedProvider([[*tool_call("wire_money", {"to": "x"}, tool_call_id="W")]]),
        tools=[wire_money],
    )
    return Agent(
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "pay"}, tool_call_id="H")], ["ok"]]
        ),
        tools=[helper.as_tool()],
    )


SUB = "s.helper.H"


def asked(messages: list) -> SimpleNamespace:
    """The call the sub-turn asked approval for (answered now: its turn was ended)."""
    (message,) = [m for m in messages if isinstance(m, AssistantMessage)]
    (part,) = [p for p in message.content if getattr(p, "awaiting", None) is not None]
    return SimpleNamespace(approval_id=part.awaiting.id, message_id=message.id)


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


async def test_a_sub_turns_wait_is_denied_once_its_caller_gave_up(tmp_path):
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        result = await (await host.open_session(parent(), session_id="s")).run("go")
    async with Host.open(store=db, log_tap=False) as host:  # a restart: any process
        stored = await host.store.load(SUB)
        assert stored is not None and pending_calls(stored.messages) == ()
        assert stored.meta[WAITING_META] == 0
        call = asked(stored.messages)
        sub = await host.open_session(parent(), session_id=SUB)
        with pytest.raises(AlreadyDecided):
            await sub.respond(call.approval_id, approved=True)
    assert result.finish_reason == "stop" and ran == []


async def test_an_approval_posted_to_the_sub_session_is_refused_and_runs_nothing():
    """Before: the sub-session was listed as waiting, and this POST ran ``wire_money``
    after the calling model had gone on without it."""
    async with web_server(parent()) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            events((await client.post("/api/chat", json=body("s"))).content)
            listed = (await client.get("/api/sessions")).json()["sessions"]
            stored = await server.host.store.load(SUB)
            call = asked(stored.messages)
            sent = {
                "id": SUB,
                "messageId": call.message_id,
                "messages": [
                    {
                        "id": call.message_id,
                        "role": "assistant",
                        "parts": [
                            {
                                "type": "tool-wire_money",
                                "toolCallId": "W",
                                "state": "approval-responded",
                                "input": {"to": "x"},
                                "approval": {"id": call.approval_id, "approved": True},
                            }
                        ],
                    }
                ],
            }
            r = await client.post("/api/chat", json=sent)
    assert {s["session_id"]: s["waiting"] for s in listed}[SUB] == 0
    assert r.status_code == 409 and ran == []


logged: list[str] = []


@tool
async def log_it(x: str) -> str:
    """Log a line."""
    logged.append(x)
    return "logged"


def helper_that_goes_on() -> Agent:
    """A sub-agent that logs and asks to wire in one step, then would log again."""
    return Agent(
        name="helper",
        provider=ScriptedProvider(
            [
                [
                    *tool_call("log_it", {"x": "first"}, tool_call_id="L"),
                    *tool_call("wire_money", {"to": "x"}, tool_call_id="W"),
                ],
                [*tool_call("log_it", {"x": "after the parent went on"}, tool_call_id="L2")],
                ["sub done"],
            ]
        ),
        tools=[wire_money, log_it],
    )


async def test_a_sub_turn_its_caller_gave_up_on_can_no_longer_be_resumed():
    """Before: its calls were denied but the turn was left decided and unresumed, so
    ``resume()`` (or a body repeating the denial) ran the sub-agent on after the
    calling model had been told it did not finish: ``log_it`` ran a second time."""
    logged.clear()
    calling = Agent(
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "pay"}, tool_call_id="H")], ["ok"]]
        ),
        tools=[helper_that_goes_on().as_tool()],
    )
    async with Host.open(log_tap=False) as host:
        await (await host.open_session(calling, session_id="s")).run("go")
        sub = await host.open_session(helper_that_goes_on(), session_id=SUB)
        with pytest.raises(NothingToResume):
            async with sub.resume() as out:
                async for _ in out:
                    pass
        roles = [(m.role, getattr(m, "tool_call_id", None)) for m in sub.messages]
    assert logged == ["first"]
    assert roles == [("user", None), ("assistant", None), ("tool", "L"), ("tool", "W")]
    assert "cannot wait for a decision" in sub.messages[-1].error


async def test_the_calling_model_is_told_which_calls_of_the_sub_agent_ran():
    """Before: only "it did not finish": a model that asked again ran ``log_it`` twice."""
    logged.clear()
    calling = Agent(
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "pay"}, tool_call_id="H")], ["ok"]]
        ),
        tools=[helper_that_goes_on().as_tool()],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(calling, session_id="s")
        await session.run("go")
    (told,) = [m.error for m in session.messages if isinstance(m, ToolMessage)]
    assert told.endswith("it did not finish; the calls it made that ran: log_it")


async def test_a_body_repeating_the_sub_turns_denial_is_refused_and_runs_nothing():
    """Before: a repeat of the recorded answers resumes a turn decided and never
    resumed: 200, and the sub-agent went on (``log_it`` ran again) after its caller."""
    logged.clear()
    calling = Agent(
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "pay"}, tool_call_id="H")], ["ok"]]
        ),
        tools=[helper_that_goes_on().as_tool()],
    )
    async with web_server(calling) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            events((await client.post("/api/chat", json=body("s"))).content)
            call = asked((await server.host.store.load(SUB)).messages)
            part = {
                "type": "tool-wire_money",
                "toolCallId": "W",
                "state": "approval-responded",
                "input": {"to": "x"},
                "approval": {"id": call.approval_id, "approved": False, "reason": NESTED_WAIT},
            }
            message = {"id": call.message_id, "role": "assistant", "parts": [part]}
            sent = {"id": SUB, "messageId": call.message_id, "messages": [message]}
            r = await client.post("/api/chat", json=sent)
    assert r.status_code == 409 and logged == ["first"]
