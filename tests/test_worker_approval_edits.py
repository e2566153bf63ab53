"""Approve-with-edits in the worker deployment (real PostgreSQL and Redis, in process):
the front end checks the edit against the tool's schema and records it through the turn
queue (``TurnQueue.decide``, the decision's one transaction), and the worker that claims
the continuation runs the tool once with the edited input. AG-UI's ``editedArgs`` and
A2A's ``editedInput``, decided on a second front end; a refused edit records nothing and
the turn still waits."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from a2a.types.a2a_pb2 import TaskState
from google.protobuf.json_format import MessageToDict

from runtime.messages import AssistantMessage, ToolCallPart
from tests.support import worker_agent
from tests.support.redis import require_redis
from tests.test_a2a import answer_of, collect, last_state, sdk
from tests.test_a2a import user as a2a_user
from tests.test_agui import run_input, user
from tests.test_frontend import LIMIT
from tests.test_worker_protocols import (
    agui_agent,
    agui_post,
    agui_run,
    at,
    protocols_deployment,
    text_of,
)


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def the_call(record: Any) -> ToolCallPart:
    assert record is not None
    (call,) = [
        p
        for m in record.messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]
    return call


async def test_an_agui_edit_decided_on_one_front_end_runs_the_edit_once_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, agui_agent(), fronts=2) as d:
        first = await agui_run(d.urls[0], run_input("e1", user("approve it", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": True, "editedArgs": {"n": 7}}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        second = await agui_run(
            d.urls[1], run_input("e1", user("approve it", "m1"), resume=resume, runId="r2")
        )
        replay = await agui_run(d.urls[0], run_input("e1", resume=resume, runId="r3"))
        turns = await d.queue.turns("e1")
        record = await d.store.load("e1")
    assert "editedArgs" in interrupt["responseSchema"]["properties"]
    (result,) = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert result["content"] == "recorded 7"
    assert text_of(second) == worker_agent.answer_text("approve it")
    assert [e["type"] for e in replay] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert [t.status for t in turns] == ["done"]
    call = the_call(record)
    assert call.input == {"n": 7}
    assert call.awaiting is not None and call.awaiting.original_input == {"n": 1}
    results = [m for m in record.messages if type(m).__name__ == "ToolMessage"]
    assert [m.output for m in results] == ["recorded 7"]  # ran once


@pytest.mark.parametrize(
    "payload",
    [
        {"approved": True, "editedArgs": {"n": "seven"}},
        {"approved": False, "editedArgs": {"n": 7}},
    ],
)
async def test_an_agui_edit_that_does_not_fit_records_nothing_and_the_turn_still_waits(
    pg_url: str, redis_url: str, payload: dict[str, Any]
) -> None:
    async with protocols_deployment(pg_url, redis_url, agui_agent()) as d:
        first = await agui_run(d.urls[0], run_input("e2", user("approve it", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        before = await d.store.load("e2")
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        with trio.fail_after(LIMIT):
            refused = await agui_post(
                d.urls[0], run_input("e2", user("approve it", "m1"), resume=resume, runId="r2")
            )
        after = await d.store.load("e2")
        turns = await d.queue.turns("e2")
    assert (refused.status_code, refused.json()["code"]) == (400, "InvalidDecision")
    assert before is not None and after is not None
    assert after.version == before.version and after.messages == before.messages
    assert [t.status for t in turns] == ["awaiting-input"]


async def test_an_a2a_edited_decision_resumes_the_task_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, fronts=2) as d:
        with trio.fail_after(LIMIT):
            asked = await sdk(
                at(d.urls[0]),
                lambda c: collect(c, a2a_user("approve it", message_id="q", context_id="e3")),
            )
            status = asked[-1].status_update.status
            pending = MessageToDict(status.message.parts[1].data)["pending"]
            edit = {"id": pending[0]["id"], "approved": True, "editedInput": {"n": 5}}
            request = a2a_user(message_id="d", task_id=asked[0].task.id, data={"decisions": [edit]})
            answered = await sdk(at(d.urls[1]), lambda c: collect(c, request))
        record = await d.store.load("e3")
    assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
    assert answer_of(answered).endswith(worker_agent.answer_text("approve it"))
    call = the_call(record)
    assert call.input == {"n": 5} and call.awaiting is not None
    assert call.awaiting.original_input == {"n": 1}
    results = [m for m in record.messages if type(m).__name__ == "ToolMessage"]
    assert [m.output for m in results] == ["recorded 5"]
