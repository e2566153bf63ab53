"""Approve-with-edits of an MCP server's tool call and of a sub-agent's approval passed up,
in the worker deployment (the suite's PostgreSQL and Redis, in process). The front end
that decides has no MCP server session (its host starts none) and checks an MCP edit
against the schema stored with the wait; a sub-agent's approval is edited as the
sub-agent's call, checked against that tool's schema on the front end, recorded through
``TurnQueue.decide`` and passed down by the worker that runs the calling call again. A
refused edit is a 400 that records nothing; of two racing edits one is recorded and run."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers import ScriptedProvider
from runtime import Agent
from runtime.app.web.answers import EDITED_INPUT
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage
from tests.support.redis import require_redis
from tests.test_agui import run_input, user
from tests.test_approval_nested_pass import _clear  # noqa: F401 (fixture)
from tests.test_approval_nested_pass import ran as wired
from tests.test_frontend import LIMIT, deployment
from tests.test_mcp import calling as mcp_calling
from tests.test_mcp import stdio_server
from tests.test_relay_web import sse_events
from tests.test_worker_approval import chat, payloads, waiting_turn
from tests.test_worker_approval_nested_pass import SUB, _answer, _on_h, _suspend
from tests.test_worker_approval_nested_pass import calling as nested_agent
from tests.test_worker_protocols import agui_post, agui_run


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def calls(record: Any) -> list[ToolCallPart]:
    assert record is not None
    return [
        p
        for m in record.messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]


def mcp_agent() -> Agent:
    provider: ScriptedProvider = mcp_calling(("add", {"a": 1, "b": 2}))
    return Agent(name="mcp", provider=provider, tools=[stdio_server(needs_approval=["add"])])


def _on_add(approval_id: str, **approval: Any) -> dict[str, Any]:
    return {
        "type": "tool-add",
        "toolCallId": "c_add",
        "state": "approval-responded",
        "input": {"a": 1, "b": 2},
        "approval": {"id": approval_id, "approved": True, **approval},
    }


async def _ask_add(d: Any, client: httpx.AsyncClient) -> tuple[str, str]:
    response = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "add"))
    events = payloads(sse_events(response.text))
    await waiting_turn(d)
    asked = next(c for c in events if c["type"] == "tool-approval-request")
    return events[0]["messageId"], asked["approvalId"]


# -- an MCP server's tool -----------------------------------------------------------------


async def test_a_front_end_without_the_mcp_session_checks_the_edit_and_a_worker_runs_it(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, mcp_agent(), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _ask_add(d, client)
            edit = {EDITED_INPUT: {"a": 40, "b": 2}}
            sent = _answer("s1", message_id, _on_add(approval_id, **edit))
            response = await client.post(f"{d.urls[1]}/api/chat", json=sent)
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        record = await d.store.load("s1")
        front_servers = [h.mcp_servers for h in d.hosts]
    assert response.status_code == 200, response.text
    assert front_servers == [{}, {}]  # no front end opened the server's session
    (call,) = calls(record)
    assert call.input == {"a": 40, "b": 2}
    assert call.awaiting is not None and call.awaiting.original_input == {"a": 1, "b": 2}
    assert call.awaiting.schema is None
    results = [m.output for m in record.messages if isinstance(m, ToolMessage)]  # type: ignore[union-attr]
    assert results in ([42], ["42"])


@pytest.mark.parametrize(
    ("edit", "says"),
    [({"a": "x", "b": 2}, "invalid arguments for add"), ({"to": "y"}, "names 'to'")],
)
async def test_a_front_end_refuses_an_mcp_edit_the_listed_schema_refuses(
    pg_url: str, redis_url: str, edit: dict[str, Any], says: str
) -> None:
    async with deployment(pg_url, redis_url, mcp_agent()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _ask_add(d, client)
            before = await d.store.load("s1")
            sent = _answer("s1", message_id, _on_add(approval_id, **{EDITED_INPUT: edit}))
            refused = await client.post(f"{d.urls[0]}/api/chat", json=sent)
            after = await d.store.load("s1")
            turns = await d.queue.turns("s1")
    assert refused.status_code == 400 and says in refused.json()["error"], refused.text
    assert before is not None and after is not None
    assert (after.version, after.messages) == (before.version, before.messages)
    assert [t.status for t in turns] == ["awaiting-input"]


# -- a sub-agent's approval passed up -------------------------------------------------------


async def test_an_edit_of_a_passed_up_approval_reaches_the_sub_agents_call_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, nested_agent(), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _suspend(d, client)
            part = _on_h(approval_id, True)
            part["approval"][EDITED_INPUT] = {"to": "y"}
            response = await client.post(
                f"{d.urls[1]}/api/chat", json=_answer("s1", message_id, part)
            )
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        calling_record = await d.store.load("s1")
        sub = await d.store.load(SUB)
    assert response.status_code == 200, response.text
    assert wired == ["y"]  # once, with the edit
    (held,) = calls(calling_record)
    assert held.input == {"input": "pay x"}
    assert held.awaiting is not None and held.awaiting.edited_input == {"to": "y"}
    (asked,) = calls(sub)
    assert asked.input == {"to": "y"}
    assert asked.awaiting is not None and asked.awaiting.original_input == {"to": "x"}


@pytest.mark.parametrize(
    ("approval", "says"),
    [
        ({"approved": True, EDITED_INPUT: {"input": "pay y"}}, "names 'input'"),
        ({"approved": True, EDITED_INPUT: {"to": 9}}, "invalid arguments for wire_money"),
        ({"approved": False, EDITED_INPUT: {"to": "y"}}, "approved=True only"),
    ],
)
async def test_a_refused_edit_of_a_passed_up_approval_records_nothing_in_either_session(
    pg_url: str, redis_url: str, approval: dict[str, Any], says: str
) -> None:
    async with deployment(pg_url, redis_url, nested_agent()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _suspend(d, client)
            before = (await d.store.load("s1"), await d.store.load(SUB))
            part = _on_h(approval_id, True)
            part["approval"] = {"id": approval_id, **approval}
            refused = await client.post(
                f"{d.urls[0]}/api/chat", json=_answer("s1", message_id, part)
            )
            after = (await d.store.load("s1"), await d.store.load(SUB))
            turns = await d.queue.turns("s1")
    assert refused.status_code == 400 and says in refused.json()["error"], refused.text
    assert [(r.version, r.messages) for r in after] == [  # type: ignore[union-attr]
        (r.version, r.messages)  # type: ignore[union-attr]
        for r in before
    ]
    assert [t.status for t in turns] == ["awaiting-input"] and wired == []


async def test_two_front_ends_racing_edits_of_a_passed_up_approval_record_and_run_one(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, nested_agent(), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _suspend(d, client)
            statuses: dict[str, int] = {}

            async def post(url: str, to: str) -> None:
                part = _on_h(approval_id, True)
                part["approval"][EDITED_INPUT] = {"to": to}
                sent = _answer("s1", message_id, part)
                statuses[to] = (await client.post(f"{url}/api/chat", json=sent)).status_code

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, d.urls[0], "a")
                nursery.start_soon(post, d.urls[1], "b")
        turns = await d.queue.turns("s1")
        await d.queue.wait_finished(turns[0].turn_id, LIMIT)
        sub = await d.store.load(SUB)
        turns = await d.queue.turns("s1")
    assert sorted(statuses.values()) == [200, 409], statuses
    (won,) = [to for to, status in statuses.items() if status == 200]
    assert wired == [won]  # the recorded edit, run once
    assert calls(sub)[0].input == {"to": won}
    assert [t.resumes for t in turns] == [1]


async def test_an_agui_interrupt_names_the_asking_call_and_edited_args_edit_it(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, nested_agent(), protocols=("ag-ui",)) as d:
        first = await agui_run(d.urls[0], run_input("s1", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        resume = [
            {
                "interruptId": interrupt["id"],
                "status": "resolved",
                "payload": {"approved": True, "editedArgs": {"input": "pay y"}},
            }
        ]
        refused = await agui_post(
            d.urls[0], run_input("s1", user("go", "m1"), resume=resume, runId="r2")
        )
        resume[0]["payload"] = {"approved": True, "editedArgs": {"to": "z"}}
        await agui_run(d.urls[0], run_input("s1", user("go", "m1"), resume=resume, runId="r3"))
        replay = await agui_run(d.urls[0], run_input("s1", resume=resume, runId="r4"))
        sub = await d.store.load(SUB)
    assert interrupt["metadata"] == {"askedTool": "wire_money", "askedArgs": {"to": "x"}}
    assert "wire_money" in interrupt["message"]
    assert (refused.status_code, refused.json()["code"]) == (400, "InvalidDecision")
    assert wired == ["z"] and calls(sub)[0].input == {"to": "z"}
    assert [e["type"] for e in replay] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]


async def test_a_front_ends_stream_and_ui_messages_name_the_asking_call_for_the_page(
    pg_url: str, redis_url: str
) -> None:
    """The request a worker streams through Redis to a front end names the sub call that
    asks (``approvalDescriptor``, what the page's Edit box opens on), and so does another
    front end's ``ui_messages``, waiting and once approved with edits (``toolMetadata``)."""
    from runtime.app.web.ui_stream import ASKED_EDIT, ASKED_INPUT, ASKED_TOOL

    said = {ASKED_TOOL: "wire_money", ASKED_INPUT: {"to": "x"}}
    async with deployment(pg_url, redis_url, nested_agent(), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "go"))
            events = payloads(sse_events(response.text))
            await waiting_turn(d)
            request = next(c for c in events if c["type"] == "tool-approval-request")
            waiting = (await client.get(f"{d.urls[1]}/api/sessions/s1")).json()["ui_messages"]
            part = _on_h(request["approvalId"], True)
            part["approval"] |= {"descriptor": said, EDITED_INPUT: {"to": "y"}}
            answered = await client.post(
                f"{d.urls[1]}/api/chat", json=_answer("s1", events[0]["messageId"], part)
            )
            await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
            done = (await client.get(f"{d.urls[0]}/api/sessions/s1")).json()["ui_messages"]

    def h(ui: Any) -> dict[str, Any]:
        (found,) = [p for m in ui for p in m["parts"] if p.get("toolCallId") == "H"]
        return found

    assert request["toolCallId"] == "H" and request["approvalDescriptor"] == said
    assert h(waiting)["approval"]["descriptor"] == said
    assert answered.status_code == 200, answered.text
    assert wired == ["y"]
    assert h(done)["approval"]["descriptor"] == said
    assert h(done)["toolMetadata"] == {ASKED_EDIT: {"to": "y"}}
