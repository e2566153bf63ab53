"""An agent used as a tool whose own tool needs approval (docs/embedding.md, "Agents as
tools"): its sub-turn suspends, the calling model is told it did not finish, and nothing
is left waiting in the sub-session for a client to approve after the fact."""

from __future__ import annotations

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, AlreadyDecided, Host, tool
from runtime.approval import WAITING_META, pending_calls, waiting_calls
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
        (call,) = waiting_calls(stored.messages)
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
            (call,) = waiting_calls(stored.messages)
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
