"""Stored schemas in the worker deployment (the suite's PostgreSQL and Redis, in
process): sub-agent calls of one step that each pass up an approval of the same tool
(``as_tool(pass_approvals=True)``) store its schema once in the calling message
(``Awaiting.schema_ref``), and each edit posted to a front end, in any order, is checked
against it (a refusal records nothing) and reaches its own sub call on a worker."""

from __future__ import annotations

from typing import Any

import attrs
import httpx
import pytest

from runtime.app.web.answers import EDITED_INPUT
from tests.support.redis import require_redis
from tests.test_approval_schema_refs import (
    _clear,  # noqa: F401 (fixture)
    _fan_out,
    calls,
    ran,
    stored_copies,
)
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import chat, payloads, waiting_turn
from tests.test_worker_approval_nested_pass import _answer


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def _on(call: str, approval_id: str, edit: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "tool-helper",
        "toolCallId": call,
        "state": "approval-responded",
        "input": {"input": f"add {call[1:]}"},
        "approval": {"id": approval_id, "approved": True, EDITED_INPUT: edit},
    }


async def test_passed_up_approvals_of_one_tool_store_one_schema_and_each_edit_is_checked(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, _fan_out(2), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "go"))
            events = payloads(sse_events(response.text))
            await waiting_turn(d)
            message_id = events[0]["messageId"]
            keys = {
                c["toolCallId"]: c["approvalId"]
                for c in events
                if c["type"] == "tool-approval-request"
            }
            waiting = await d.store.load("s1")
            refused = await client.post(
                f"{d.urls[1]}/api/chat",
                json=_answer("s1", message_id, _on("H1", keys["H1"], {"text": "no"})),
            )
            first = await client.post(
                f"{d.urls[1]}/api/chat",
                json=_answer("s1", message_id, _on("H1", keys["H1"], {"a": 10, "b": 1})),
            )
            last = await client.post(
                f"{d.urls[0]}/api/chat",
                json=_answer("s1", message_id, _on("H0", keys["H0"], {"a": 10, "b": 0})),
            )
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        record = await d.store.load("s1")
    assert waiting is not None and stored_copies(waiting.messages) == 1
    assert refused.status_code == 400 and "names 'text', which add" in refused.json()["error"]
    assert (first.status_code, first.json()) == (202, {"recorded": True, "waiting": 1})
    assert last.status_code == 200, last.text
    assert sorted(ran, key=repr) == [("add", {"a": 10, "b": 0}), ("add", {"a": 10, "b": 1})]
    assert record is not None and stored_copies(record.messages) == 0


@pytest.mark.parametrize("legacy", [True, False], ids=["stored-before-refs", "refs"])
async def test_a_waiting_step_in_postgresql_decides_each_edit_against_its_stored_schema(
    store_and_queue: Any, legacy: bool
) -> None:
    """Three waiting calls of ``add`` saved in PostgreSQL by the claimed turn, decided
    through the queue (a front end's path: the turn's last rows read) with no tools:
    as a step stored them before refs (the first call's copy, found by the tool's name)
    and as it stores them now, each edit is checked, the carrier decided first."""
    from runtime.approval import WAITING_META, Decision
    from runtime.errors import InvalidDecision
    from runtime.messages import (
        AssistantMessage,
        Awaiting,
        ToolCallPart,
        UserMessage,
        share_schemas,
    )
    from tests.test_approval_schema_refs import add

    store, queue = store_and_queue
    turn = await queue.submit("s", "add")
    claim = await queue.claim("w1")
    assert claim is not None
    parts = [
        ToolCallPart(
            tool_call_id=f"c{i}",
            tool_name="add",
            input={"a": i, "b": 0},
            step=0,
            awaiting=Awaiting(
                kind="approval",
                id=f"ap{i}",
                turn_id=turn.turn_id,
                schema=dict(add.parameters) if legacy and i == 0 else None,
            ),
        )
        for i in range(3)
    ]
    if not legacy:
        parts = [
            attrs.evolve(p, awaiting=attrs.evolve(p.awaiting, schema=dict(add.parameters)))
            for p in parts
        ]
        share_schemas(parts)
    step = [UserMessage(content="add"), AssistantMessage(id=turn.message_id, content=tuple(parts))]
    with queue.fenced(claim, on_suspended=lambda: None):
        await store.save("s", 0, step, {WAITING_META: 3})
    for i in (0, 2, 1):
        with pytest.raises(InvalidDecision, match="'x' is not of type"):
            bad = Decision(approved=True, edited_input={"a": "x", "b": 1})
            await queue.decide("s", f"ap{i}", bad, {})
        await queue.decide(
            "s", f"ap{i}", Decision(approved=True, edited_input={"a": 9, "b": i}), {}
        )
    record = await store.load("s")
    assert record is not None and stored_copies(record.messages) == 0
    assert [p.input for p in calls(record.messages)] == [{"a": 9, "b": i} for i in range(3)]
