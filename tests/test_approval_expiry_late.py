"""A decision that arrives after its wait's deadline, before anything noticed the expiry
(docs/approval.md): refused as one for a call decided already (409 on the web), and the
turn goes on denied ``timed out`` as if the timer had fired; the tool never runs."""

from __future__ import annotations

from typing import Any

import attrs
import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, ToolMessage, WaitExpired
from runtime.events import ToolApprovalExpired, TurnFinished
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)
from tests.test_approval_web import answer, approval_part
from tests.test_web_http import body, events
from tests.web.harness import web_server

EPOCH = 1_700_000_000.0


def agent() -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["answered"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file], approval_timeout=60)


def results(messages) -> list:
    return [m.error or m.output for m in messages if isinstance(m, ToolMessage)]


async def finished(events) -> TurnFinished:
    """The next turn's end that is not a suspension."""
    while True:
        event = await events.inbox.get()
        if isinstance(event, TurnFinished) and event.finish_reason != "awaiting-input":
            return event


async def test_an_approval_after_the_deadline_the_timer_missed_is_refused_and_times_out():
    now = [EPOCH]
    async with Host.open(log_tap=False) as host:
        host.clock = lambda: now[0]  # moved past the deadline; the timer sleeps on
        events = host.bus.subscribe([ToolApprovalExpired, TurnFinished], name="t")
        session = await host.open_session(agent(), session_id="s")
        first = await session.run("go")
        now[0] += 61
        with pytest.raises(WaitExpired):
            await session.respond(first.pending[0].approval_id, approved=True)
        end = await finished(events)
        record = await host.store.load("s")
    assert end.finish_reason == "stop"
    assert ran == []
    assert results(record.messages) == ["the tool call was denied: timed out"]


async def test_an_approval_a_second_before_the_deadline_still_runs_the_tool():
    now = [EPOCH]
    async with Host.open(log_tap=False) as host:
        host.clock = lambda: now[0]
        session = await host.open_session(agent(), session_id="s")
        first = await session.run("go")
        now[0] += 59
        result = await session.respond(first.pending[0].approval_id, approved=True)
    assert result.text == "answered" and ran == ["/x"]


async def asked(client) -> tuple[str, str]:
    """Start session ``s``'s turn over HTTP: (its message id, the approval id asked)."""
    chunks = events((await client.post("/api/chat", json=body("s"))).content)
    request = next(c for c in chunks if c != "[DONE]" and c["type"] == "tool-approval-request")
    return chunks[0]["messageId"], request["approvalId"]


async def stored_results(host: Host) -> list:
    """The session's tool results once its turn resumed (in the background) and ended."""
    with trio.fail_after(10):
        while True:
            record = await host.store.load("s")
            if record is not None and results(record.messages):
                return results(record.messages)
            await trio.sleep(0.01)


async def test_a_late_continuation_post_gets_409_and_the_turn_is_denied_timed_out(tmp_path):
    now = [EPOCH]
    async with web_server(agent(), store=str(tmp_path / "w.db")) as server:
        server.host.clock = lambda: now[0]
        async with httpx.AsyncClient(base_url=server.url) as client:
            message_id, approval_id = await asked(client)
            now[0] += 61  # past the deadline; the host's timer has not woken
            late = await client.post(
                "/api/chat", json=answer("s", message_id, approval_part(approval_id, True))
            )
            denied = await stored_results(server.host)
    assert late.status_code == 409
    assert "expired" in late.json()["error"]
    assert denied == ["the tool call was denied: timed out"]
    assert ran == []


async def test_a_continuation_post_after_a_restart_past_the_deadline_gets_409(tmp_path):
    now = [EPOCH]
    db = str(tmp_path / "w.db")
    async with web_server(agent(), store=db) as server:
        server.host.clock = lambda: now[0]
        async with httpx.AsyncClient(base_url=server.url) as client:
            message_id, approval_id = await asked(client)
    now[0] += 3600  # the server stopped for an hour
    async with web_server(agent(), store=db) as server:
        server.host.clock = lambda: now[0]
        async with httpx.AsyncClient(base_url=server.url) as client:
            late = await client.post(
                "/api/chat", json=answer("s", message_id, approval_part(approval_id, True))
            )
            denied = await stored_results(server.host)
    assert late.status_code == 409
    assert denied == ["the tool call was denied: timed out"]
    assert ran == []


async def test_a_late_a2a_decision_is_invalid_params_and_the_task_is_denied_timed_out():
    """A2A answers a decision it cannot take (decided already, or late) ``invalid params``."""
    from a2a.utils.errors import InvalidParamsError
    from google.protobuf.json_format import MessageToDict

    from tests.support.approval_agents import agent as approval_agent
    from tests.test_a2a import BOTH, collect, sdk, user

    now = [EPOCH]
    timed = attrs.evolve(approval_agent, approval_timeout=60)
    async with web_server(timed, protocols=BOTH) as server:
        server.host.clock = lambda: now[0]

        async def run(client: Any) -> Any:
            asked = await collect(client, user("weather?", message_id="q"))
            task = asked[0].task
            status = asked[-1].status_update.status
            pending = MessageToDict(status.message.parts[1].data)["pending"]
            now[0] += 61  # past the deadline; the host's timer has not woken
            decision = {"decisions": [{"id": pending[0]["id"], "approved": True}]}
            with pytest.raises(InvalidParamsError) as caught:
                await collect(
                    client,
                    user(
                        message_id="d", task_id=task.id, context_id=task.context_id, data=decision
                    ),
                )
            return task.context_id, caught.value

        context_id, error = await sdk(server, run)
        with trio.fail_after(10):
            while True:
                record = await server.host.store.load(context_id)
                if results(record.messages):
                    break
                await trio.sleep(0.01)
    assert "expired" in error.message
    assert results(record.messages) == ["the tool call was denied: timed out"]
