"""``as_tool(pass_approvals=True)`` in the worker deployment (real PostgreSQL and Redis,
in process): the sub-agent's approval suspends the calling turn's row; the decision
posted for the calling session resumes both turns on a worker; one addressed to the
sub-session is a 409 that changes nothing; the sub-agent's ``approval_timeout`` is the
calling row's deadline, and its expiry denies the sub-agent's call."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent
from runtime.actor_messages import InferRequest
from runtime.approval import pending_calls
from runtime.messages import ToolMessage
from tests.support.redis import require_redis
from tests.test_approval_nested_pass import (
    _clear,  # noqa: F401 (fixture)
    _helper_model,
    _last_result,
    ran,
    sub_steps,
    wire_money,
)
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import asked, chat, expire_waiting_turn, payloads, waiting_turn


def _parent_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "pay x"}, tool_call_id="H")
    result = _last_result(request)
    return [f"parent saw: {result.output if result.error is None else result.error}"]


def calling(timeout: float | None = None) -> Agent:
    helper = Agent(
        name="helper",
        provider=ScriptedProvider(responder=_helper_model),
        tools=[wire_money],
        approval_timeout=timeout,
    )
    return Agent(
        name="calls",
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


SUB = "s1.helper.H"


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def _answer(session_id: str, message_id: str, part: dict[str, Any]) -> dict[str, Any]:
    sent = chat(session_id, "go")
    sent["messages"].append(
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
    )
    sent["messageId"] = message_id
    return sent


def _on_h(approval_id: str, approved: bool) -> dict[str, Any]:
    return {
        "type": "tool-helper",
        "toolCallId": "H",
        "state": "approval-responded",
        "input": {"input": "pay x"},
        "approval": {"id": approval_id, "approved": approved},
    }


async def _suspend(d: Any, client: httpx.AsyncClient) -> tuple[str, str]:
    """The calling turn's message id and the approval id it waits for."""
    response = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "go"))
    events = sse_events(response.text)
    await waiting_turn(d)
    return payloads(events)[0]["messageId"], asked(events)["approvalId"]


async def test_a_workers_calling_turn_waits_and_the_approval_resumes_both(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _suspend(d, client)
            assert ran == []
            response = await client.post(
                f"{d.urls[0]}/api/chat", json=_answer("s1", message_id, _on_h(approval_id, True))
            )
        turn = await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        sub = await d.store.load(SUB)
    second = payloads(sse_events(response.text))
    done = [c for c in second if c["type"] == "tool-output-available" and not c.get("preliminary")]
    assert [(c["toolCallId"], c["output"]) for c in done] == [("H", "paid")]
    assert second[-1]["finishReason"] == "stop"
    assert turn is not None and turn.status == "done"
    assert ran == ["x"] and sub_steps == [0, 1]
    assert sub is not None and pending_calls(list(sub.messages)) == ()


async def test_a_decision_posted_for_the_sub_session_is_a_409_in_a_worker_deployment(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            _, approval_id = await _suspend(d, client)
            sub = await d.store.load(SUB)
            assert sub is not None
            part = {
                "type": "tool-wire_money",
                "toolCallId": "W",
                "state": "approval-responded",
                "input": {"to": "x"},
                "approval": {"id": approval_id, "approved": True},
            }
            response = await client.post(
                f"{d.urls[0]}/api/chat", json=_answer(SUB, sub.messages[1].id, part)
            )
        after = await d.store.load(SUB)
    assert response.status_code == 409 and "'s1'" in response.text, response.text
    assert after is not None and [c.decided for c in pending_calls(list(after.messages))] == [False]
    assert ran == []


async def test_the_sub_agents_timeout_expires_the_calling_row_and_denies_its_call(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling(timeout=600)) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            await _suspend(d, client)
        turn = await expire_waiting_turn(d)
        record = await d.store.load("s1")
    assert turn is not None and turn.status == "done"
    assert record is not None
    (result,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert result.output.startswith("not paid: ") and "timed out" in result.output
    assert ran == [] and sub_steps == [0, 1]


def _pays_twice_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return [
            *tool_call("wire_money", {"to": "x"}, tool_call_id="W1"),
            *tool_call("wire_money", {"to": "y"}, tool_call_id="W2"),
        ]
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    return [", ".join(m.output or "not paid" for m in results)]


def _parent_of_two(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "pay x"}, tool_call_id="H")
    return [f"parent saw: {_last_result(request).output}"]


async def test_a_workers_calling_turn_waits_again_for_the_sub_steps_second_approval(
    pg_url: str, redis_url: str
) -> None:
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_pays_twice_model), tools=[wire_money]
    )
    agent = Agent(
        name="calls",
        provider=ScriptedProvider(responder=_parent_of_two),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    async with deployment(pg_url, redis_url, agent) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, first = await _suspend(d, client)
            response = await client.post(
                f"{d.urls[0]}/api/chat", json=_answer("s1", message_id, _on_h(first, True))
            )
            again = asked(sse_events(response.text))
            turn = await waiting_turn(d)
            assert again["toolCallId"] == "H" and again["approvalId"] != first
            assert turn.waiting and ran == []
            response = await client.post(
                f"{d.urls[0]}/api/chat",
                json=_answer("s1", message_id, _on_h(again["approvalId"], True)),
            )
        done = await d.queue.wait_finished(turn.turn_id, LIMIT)
    last = payloads(sse_events(response.text))
    outputs = [c for c in last if c["type"] == "tool-output-available" and not c.get("preliminary")]
    assert [(c["toolCallId"], c["output"]) for c in outputs] == [("H", "wired, wired")]
    assert done is not None and done.status == "done"
    assert sorted(ran) == ["x", "y"]


async def test_a_new_message_posted_for_the_sub_session_leaves_the_callers_wait(
    pg_url: str, redis_url: str
) -> None:
    """A 409 from the front end, nothing queued. Before: queued, the parent agent ran in
    the sub-session and superseded its wait; refused by the worker instead, its claim
    fenced the caller's next save of the sub-session out (``LeaseLost``). Either way
    the caller's approval was lost."""
    async with deployment(pg_url, redis_url, calling()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _suspend(d, client)
            response = await client.post(f"{d.urls[0]}/api/chat", json=chat(SUB, "hello"))
            paid = await client.post(
                f"{d.urls[0]}/api/chat", json=_answer("s1", message_id, _on_h(approval_id, True))
            )
    last = payloads(sse_events(paid.text))
    outputs = [c for c in last if c["type"] == "tool-output-available" and not c.get("preliminary")]
    assert response.status_code == 409 and "'s1'" in response.text, response.text
    assert [(c["toolCallId"], c["output"]) for c in outputs] == [("H", "paid")], last
    assert ran == ["x"]
