"""AG-UI (POST /ag-ui) and what a sub-agent passes up through an agent tool's call
(``as_tool(pass_approvals=True)``), seen by a client that reconnects to the waiting turn
or sends the thread's messages back: the ``MESSAGES_SNAPSHOT`` holds what the run
streamed (a passed-up client call under its ``<call id>.<sub call id>``, the answers
given to those before it; the sub call a passed-up approval asks for on the agent
tool's call, as the interrupt names it), and a run that sends those messages back is
taken. Every event is checked against the official ``ag-ui-protocol`` models; the last
tests run the official ``@ag-ui/client`` (tests/agui/run_agent.mjs)."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Tool
from runtime.actor_messages import InferRequest
from runtime.messages import ToolMessage
from tests.test_agui import post, run, run_input, types, user
from tests.test_agui_node import node as node  # the fixture
from tests.test_agui_node import run_client
from tests.test_approval_nested_pass import _grand_parent, parent, ran
from tests.test_approval_nested_pass_client import _parent_model
from tests.web.harness import web_server

pytest.importorskip("ag_ui.core")

ASKED = {"askedTool": "wire_money", "askedArgs": {"to": "x"}}
"""What ``parent()``'s passed-up approval asks for: helper's ``wire_money({"to": "x"})``."""

locate = Tool.client(
    "locate", {"type": "object", "properties": {"precise": {"type": "boolean"}}}, "Where."
)


def _locates_twice(request: InferRequest) -> list[Any]:
    step = current_step(request.messages)
    if step < 2:
        return tool_call("locate", {"precise": step == 1}, tool_call_id=f"L{step}")
    return [" then ".join(m.output for m in request.messages if isinstance(m, ToolMessage))]


def locating() -> Agent:
    """An agent whose sub-agent asks for its client tool ``locate`` twice, in turn:
    passed up as ``H.L0``, then ``H.L1``."""
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_locates_twice), tools=[locate]
    )
    return Agent(
        name="top",
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


WIRE = re.compile(r"msg_[A-Za-z0-9_:-]+\.s[0-9]+\.")
"""The head of a call's wire id: ``<assistant message id>.s<step>.`` (agui_wire)."""


def bare(wire_id: str) -> str:
    """The call id a wire id stands for (``msg_x_1.s0.H.L0`` -> ``H.L0``); a call id that
    is not a wire id fails the test."""
    head = WIRE.match(wire_id)
    assert head is not None, f"not a wire id: {wire_id!r}"
    return wire_id[head.end() :]


def pending(events: list[dict[str, Any]]) -> list[str]:
    """The call ids a run's ``pendingToolCallIds`` name, bare."""
    return [bare(i) for i in events[-1]["outcome"]["pendingToolCallIds"]]


def calls_of(snapshot: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (bare(c["id"]), c["function"]["name"])
        for m in snapshot["messages"]
        if m["role"] == "assistant"
        for c in m.get("toolCalls", ())
    ]


def tool_messages(snapshot: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (bare(m["toolCallId"]), m["content"]) for m in snapshot["messages"] if m["role"] == "tool"
    ]


def snapshot_of(events: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [e for e in events if e["type"] == "MESSAGES_SNAPSHOT"]
    return found


def answer(call_id: str, text: str) -> dict[str, Any]:
    return {"id": f"a-{call_id}", "role": "tool", "toolCallId": call_id, "content": text}


# -- a passed-up approval -----------------------------------------------------------------


async def test_a_reconnect_to_a_passed_up_approval_names_the_asking_call_as_the_live_run_did():
    async with web_server(parent(), protocols=("ag-ui",)) as server:
        live = await run(server, run_input("s", user("go", "m1")))
        again = await run(server, run_input("s", runId="reconnect"))
    assert types(again) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert again[-1]["outcome"] == live[-1]["outcome"]
    (interrupt,) = again[-1]["outcome"]["interrupts"]
    assert interrupt["metadata"] == ASKED and bare(interrupt["toolCallId"]) == "H"
    assert snapshot_of(again) == snapshot_of(live)
    (call,) = [c for m in snapshot_of(again)["messages"] for c in m.get("toolCalls", ())]
    assert call["id"] == interrupt["toolCallId"] and call["metadata"] == {"axon": ASKED}


async def test_the_snapshot_after_an_approval_with_edits_says_what_the_sub_call_ran_with():
    async with web_server(parent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": True, "editedArgs": {"to": "y"}}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        await run(server, run_input("s", user("go", "m1"), resume=resume, runId="r2"))
        again = await run(server, run_input("s", runId="reconnect"))
    assert ran == ["y"]
    (call,) = [c for m in snapshot_of(again)["messages"] for c in m.get("toolCalls", ())]
    assert call["metadata"] == {"axon": {**ASKED, "editedArgs": {"to": "y"}}}


async def test_two_agents_deep_the_interrupt_and_the_snapshot_name_the_agent_between():
    """``top`` -> ``middle`` -> ``helper``: the interrupt said ``wire_money`` with no word
    of ``helper`` it is asked through (the AI SDK's ``axonAskedVia`` said it)."""
    async with web_server(_grand_parent(), protocols=("ag-ui",)) as server:
        live = await run(server, run_input("s", user("go", "m1")))
        again = await run(server, run_input("s", runId="reconnect"))
    deep = {**ASKED, "askedVia": ["helper"]}
    for events in (live, again):
        (interrupt,) = events[-1]["outcome"]["interrupts"]
        assert interrupt["metadata"] == deep
        (call,) = [c for m in snapshot_of(events)["messages"] for c in m.get("toolCalls", ())]
        assert call["metadata"] == {"axon": deep}


# -- a passed-up client tool call ---------------------------------------------------------


async def test_a_reconnect_to_a_passed_up_client_call_gets_the_call_it_is_told_to_answer():
    """The snapshot listed the agent tool's call ``H`` alone while ``pendingToolCallIds``
    named ``H.L0``: a client replacing its messages with it lost the call to answer."""
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        live = await run(server, run_input("s", user("go", "m1")))
        again = await run(server, run_input("s", runId="reconnect"))
    streamed = [
        (e["toolCallId"], e["toolCallName"]) for e in live if e["type"] == "TOOL_CALL_START"
    ]
    assert [(bare(i), name) for i, name in streamed] == [("H", "helper"), ("H.L0", "locate")]
    assert again[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [streamed[1][0]]}
    listed = [
        (c["id"], c["function"]["name"]) for c in snapshot_of(again)["messages"][1]["toolCalls"]
    ]
    assert listed == streamed  # the same wire ids live and in the snapshot
    assert tool_messages(snapshot_of(again)) == []


async def test_the_snapshot_holds_each_sub_call_answered_before_the_one_that_waits():
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        await run(server, run_input("s", user("go", "m1"), answer("H.L0", "Paris"), runId="r2"))
        again = await run(server, run_input("s", runId="reconnect"))
    assert pending(again) == ["H.L1"]
    snapshot = snapshot_of(again)
    assert calls_of(snapshot) == [("H", "helper"), ("H.L0", "locate"), ("H.L1", "locate")]
    assert tool_messages(snapshot) == [("H.L0", "Paris")]


async def test_a_run_that_sends_back_an_earlier_sub_calls_answer_goes_on():
    """The client keeps its answer to ``H.L0`` and sends it with the one to ``H.L1``
    (``@ag-ui/client`` sends all its messages): it was a 404, ``no tool call 'H.L0'``,
    and the turn waited for ever."""
    history = [user("go", "m1"), answer("H.L0", "Paris")]
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        await run(server, run_input("s", *history, runId="r2"))
        last = await run(server, run_input("s", *history, answer("H.L1", "Rome"), runId="r3"))
        record = await server.host.store.load("s")
    text = "".join(e["delta"] for e in last if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "parent saw: Paris then Rome"
    assert last[-1]["outcome"] == {"type": "success"}
    assert record is not None and [type(m).__name__ for m in record.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
    ]


async def test_a_run_replayed_after_the_turn_went_on_is_answered_with_the_thread():
    """The same run sent again once the turn is over (its last sub call's answer is the
    call's, not a stored tool message): a snapshot, as for a top-level client call; it
    was a 404 for ``H.L1``."""
    history = [user("go", "m1"), answer("H.L0", "Paris"), answer("H.L1", "Rome")]
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        await run(server, run_input("s", *history[:2], runId="r2"))
        await run(server, run_input("s", *history, runId="r3"))
        again = await run(server, run_input("s", *history, runId="r4"))
    assert types(again) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert tool_messages(snapshot_of(again))[:2] == [("H.L0", "Paris"), ("H.L1", "Rome")]


async def test_a_client_that_resends_the_snapshots_own_messages_goes_on():
    """The reconnecting client's messages are the snapshot's (their ids and the answer
    given before, as the server wrote them) plus its new answer."""
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        await run(server, run_input("s", user("go", "m1"), answer("H.L0", "Paris"), runId="r2"))
        held = snapshot_of(await run(server, run_input("s", runId="reconnect")))["messages"]
        last = await run(server, run_input("s", *held, answer("H.L1", "Rome"), runId="r3"))
    assert last[-1]["outcome"] == {"type": "success"}


async def test_another_answer_to_a_sub_call_answered_before_is_not_recorded():
    """A resent answer to ``H.L0`` that differs from the one recorded is passed over (as
    a stored result sent back is): the sub-agent saw the first one."""
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        await run(server, run_input("s", user("go", "m1"), answer("H.L0", "Paris"), runId="r2"))
        history = [user("go", "m1"), answer("H.L0", "Lima"), answer("H.L1", "Rome")]
        last = await run(server, run_input("s", *history, runId="r3"))
    text = "".join(e["delta"] for e in last if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "parent saw: Paris then Rome"


async def test_an_answer_to_a_sub_call_the_thread_never_made_is_still_404():
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        r = await post(server, run_input("s", user("go", "m1"), answer("H.L9", "x"), runId="r2"))
    assert r.status_code == 404 and r.json()["code"] == "unknown_tool_call"


async def test_a_later_turns_passed_up_client_calls_under_ids_used_before_are_answered():
    """Turn 2 calls ``H`` again and its sub-agent asks ``L0`` and ``L1`` again (ids are
    unique in a turn only): its answers were passed over as those turn 1 recorded under
    the same ids, and the run refused (``H.L0``: 409 naming ``H``; ``H.L1``: 404)."""
    first = [user("go", "m1"), answer("H.L0", "Paris"), answer("H.L1", "Rome")]
    second = [*first, user("again", "m2"), answer("H.L0", "Oslo")]
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        await run(server, run_input("s", *first[:2], runId="r2"))
        await run(server, run_input("s", *first, runId="r3"))
        asked = await run(server, run_input("s", *first, user("again", "m2"), runId="r4"))
        assert pending(asked) == ["H.L0"]
        await run(server, run_input("s", *second, runId="r5"))
        last = await run(server, run_input("s", *second, answer("H.L1", "Bern"), runId="r6"))
    text = "".join(e["delta"] for e in last if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text.endswith("Oslo then Bern") and last[-1]["outcome"] == {"type": "success"}


async def test_a_run_that_leaves_a_passed_up_client_call_unanswered_names_its_own_id():
    """The refusal names the id the client answers (``H.L0``), not the agent tool's call
    (``H``, which a tool message cannot answer)."""
    resume = [{"interruptId": "made-up", "status": "resolved", "payload": {"approved": True}}]
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        r = await post(server, run_input("s", user("go", "m1"), resume=resume, runId="r2"))
    assert r.status_code == 409 and r.json()["code"] == "interrupt_pending"
    (wire,) = re.findall(r"tool calls \['([^']+)'\]", r.json()["error"])
    assert bare(wire) == "H.L0"


def _locates_then_pays(request: InferRequest) -> list[Any]:
    step = current_step(request.messages)
    if step == 0:
        return tool_call("locate", {}, tool_call_id="L")
    if step == 1:
        return tool_call("wire_money", {"to": "x"}, tool_call_id="W")
    return [
        "done: " + ", ".join(str(m.output) for m in request.messages if isinstance(m, ToolMessage))
    ]


def locating_then_paying() -> Agent:
    """The sub-agent asks for its client tool (``H.L``), then for approval of
    ``wire_money``: both passed up through ``H``, in turn."""
    from tests.test_approval_nested_pass import wire_money

    helper = Agent(
        name="helper",
        provider=ScriptedProvider(responder=_locates_then_pays),
        tools=[locate, wire_money],
    )
    return Agent(
        name="top",
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


async def test_a_resume_sent_with_the_answer_to_the_sub_call_before_it_goes_on():
    """The approval the sub-agent passes up after its client call: the resume comes
    with the client's messages, its answer to ``H.L`` among them (a 404 before)."""
    history = [user("go", "m1"), answer("H.L", "Paris")]
    async with web_server(locating_then_paying(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        asked = await run(server, run_input("s", *history, runId="r2"))
        (interrupt,) = asked[-1]["outcome"]["interrupts"]
        resume = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
        ]
        last = await run(server, run_input("s", *history, resume=resume, runId="r3"))
    assert interrupt["metadata"] == ASKED
    assert calls_of(snapshot_of(asked)) == [("H", "helper"), ("H.L", "locate")]
    assert tool_messages(snapshot_of(asked)) == [("H.L", "Paris")]
    assert last[-1]["outcome"] == {"type": "success"} and ran == ["x"]


# -- the official client ------------------------------------------------------------------


async def test_the_official_client_reconnecting_answers_each_passed_up_client_call(node):
    """A second HttpAgent (a reloaded app: no messages of its own) reconnects to the
    waiting thread, answers the sub call the snapshot gives it, then the next one."""
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        url = server.url + "/ag-ui"
        first = await run_client(
            node, {"url": url, "threadId": "t", "runs": [{"userText": "go", "tools": []}]}
        )
        runs = [{}, {"answerPending": {"content": "Paris"}}, {"answerPending": {"content": "Rome"}}]
        second = await run_client(node, {"url": url, "threadId": "t", "runs": runs})
    assert first["warnings"] == second["warnings"] == []
    assert pending([{"outcome": first["results"][0]["outcome"]}]) == ["H.L0"]
    reconnect, paris, rome = second["results"]
    for result in second["results"]:
        assert result["error"] is None and result["schemaErrors"] == [], result
    assert pending([{"outcome": reconnect["outcome"]}]) == ["H.L0"]
    (assistant,) = [m for m in reconnect["messages"] if m["role"] == "assistant"]
    assert [bare(c["id"]) for c in assistant["toolCalls"]] == ["H", "H.L0"]
    assert pending([{"outcome": paris["outcome"]}]) == ["H.L1"]
    assert rome["outcome"]["type"] == "success"
    (assistant,) = [m for m in rome["messages"] if m["role"] == "assistant"]
    assert assistant["content"] == "parent saw: Paris then Rome"


async def test_the_official_client_reconnecting_to_a_passed_up_approval_sees_the_asking_call(node):
    async with web_server(parent(), protocols=("ag-ui",)) as server:
        url = server.url + "/ag-ui"
        first = await run_client(node, {"url": url, "threadId": "t", "runs": [{"userText": "go"}]})
        second = await run_client(
            node, {"url": url, "threadId": "t", "runs": [{}, {"approveAll": True}]}
        )
    live = first["results"][0]
    reconnect, approved = second["results"]
    assert first["warnings"] == second["warnings"] == []
    assert reconnect["error"] is None and reconnect["schemaErrors"] == []
    assert reconnect["pendingInterrupts"] == live["pendingInterrupts"]
    (interrupt,) = reconnect["pendingInterrupts"]
    assert interrupt["metadata"] == ASKED
    (assistant,) = [m for m in reconnect["messages"] if m["role"] == "assistant"]
    assert assistant["toolCalls"][0]["metadata"] == {"axon": ASKED}  # kept by the client
    assert approved["outcome"]["type"] == "success" and ran == ["x"]


# -- two clients at once ------------------------------------------------------------------


def read_together(monkeypatch: Any) -> None:
    """The next two runs each read the thread, then wait for the other to have read it
    too: both see the approval waiting before either records its answer."""
    from runtime.app.web.agui import AGUIRoutes

    read = AGUIRoutes._stored
    arrived: list[str] = []
    both = trio.Event()

    async def stored_together(self: Any, session_id: str) -> Any:
        record = await read(self, session_id)
        if both.is_set() or len(arrived) >= 2:
            return record
        arrived.append(session_id)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        return record

    monkeypatch.setattr(AGUIRoutes, "_stored", stored_together)


async def answer_at_once(url: str, interrupt_id: str) -> dict[bool, Any]:
    """An approval and a denial of ``interrupt_id``, sent at once: each reply."""
    replies: dict[bool, Any] = {}

    async def answer_it(approved: bool) -> None:
        payload = {"approved": approved}
        resume = [{"interruptId": interrupt_id, "status": "resolved", "payload": payload}]
        body = run_input("s", user("go", "m1"), resume=resume, runId=f"r-{approved}")
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            replies[approved] = await client.post("/ag-ui", json=body)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_it, True)
        nursery.start_soon(answer_it, False)
    return replies


def check_one_recorded(replies: dict[bool, Any]) -> None:
    """One answer ran, the other was refused with a documented code."""
    statuses = sorted(r.status_code for r in replies.values())
    assert statuses == [200, 409], {k: r.text for k, r in replies.items()}
    (refused,) = [r for r in replies.values() if r.status_code == 409]
    assert refused.json()["code"] in ("already_answered", "thread_busy"), refused.text
    assert ran == (["x"] if replies[True].status_code == 200 else [])


async def test_two_clients_answering_a_passed_up_approval_at_once_record_one_the_other_409(
    monkeypatch,
):
    """Both runs read the waiting thread before either records its answer: one runs,
    the other is refused with a documented code (it was ``AlreadyDecided``, the error
    class's name, where the same answer coming after gets ``already_answered``)."""
    async with web_server(parent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("s", user("go", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        read_together(monkeypatch)
        replies = await answer_at_once(server.url, interrupt["id"])
    check_one_recorded(replies)
