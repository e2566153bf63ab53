"""An edited input's bound (docs/approval.md, "Approving with edits";
tests/test_approval_edit_size.py for the embedded app) in the worker deployment (the
suite's PostgreSQL and Redis, in process): the front end refuses an edit whose JSON is
longer than the larger of the agent's ``max_tool_result_chars`` and the model's own
input, over the AI SDK continuation, AG-UI and A2A, before the queue records anything;
the turn still waits."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from tests.support.redis import require_redis
from tests.test_a2a import collect, sdk
from tests.test_a2a import user as a2a_user
from tests.test_agui import run_input, user
from tests.test_approval_edit_size import DEFAULT, sized
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import (
    _clear_ran,  # noqa: F401 (fixture)
    answer,
    approval_agent,
    chat,
    payloads,
    ran,
)
from tests.test_worker_protocols import agui_agent, agui_post, agui_run, at, protocols_deployment


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_front_end_body_whose_second_answer_has_too_long_an_edit_records_neither(
    pg_url: str, redis_url: str
) -> None:
    """Every answer is checked, with the limit, before the queue records the first."""
    async with deployment(pg_url, redis_url, approval_agent(), fronts=1) as d:
        (a,) = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = payloads(
                sse_events(
                    (await client.post(f"{a}/api/chat", json=chat("s1", "delete /x /y"))).text
                )
            )
            d_ask, e_ask = [c for c in first if c["type"] == "tool-approval-request"]
            sent = answer("s1", first[0]["messageId"], d_ask["approvalId"], True)
            big = {"id": e_ask["approvalId"], "approved": True}
            big["axonEditedInput"] = sized("path", DEFAULT + 1)
            (_, d_part) = sent["messages"][-1]["parts"]
            e_part = {**d_part, "toolCallId": "E", "input": {"path": "/y"}, "approval": big}
            sent["messages"][-1]["parts"].append(e_part)
            before = await d.store.load("s1")
            refused = await client.post(f"{a}/api/chat", json=sent)
            after = await d.store.load("s1")
            turns = await d.queue.turns("s1")
    assert refused.status_code == 400, refused.text
    assert "100,001 characters of JSON, more than the 100,000" in refused.json()["error"]
    assert before is not None and after is not None
    assert (after.version, after.messages) == (before.version, before.messages)
    assert [t.status for t in turns] == ["awaiting-input"]
    assert ran == []


async def test_a_front_end_ag_ui_resume_with_too_long_edited_args_records_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, agui_agent()) as d:
        first = await agui_run(d.urls[0], run_input("e2", user("approve it", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": True, "editedArgs": {"n": 2, **sized("pad", DEFAULT)}}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        before = await d.store.load("e2")
        with trio.fail_after(LIMIT):
            refused = await agui_post(
                d.urls[0], run_input("e2", user("approve it", "m1"), resume=resume, runId="r2")
            )
        after = await d.store.load("e2")
        turns = await d.queue.turns("e2")
    assert (refused.status_code, refused.json()["code"]) == (400, "EditTooLarge"), refused.text
    assert before is not None and after is not None
    assert (after.version, after.messages) == (before.version, before.messages)
    assert [t.status for t in turns] == ["awaiting-input"]


async def test_a_front_end_a2a_decision_with_too_long_an_edit_records_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url) as d:
        with trio.fail_after(LIMIT):
            asked = await sdk(
                at(d.urls[0]),
                lambda c: collect(c, a2a_user("approve it", message_id="q", context_id="e3")),
            )
            status = asked[-1].status_update.status
            pending = MessageToDict(status.message.parts[1].data)["pending"]
            edit = {"n": 5, **sized("pad", DEFAULT)}
            decision = {"id": pending[0]["id"], "approved": True, "editedInput": edit}
            request = a2a_user(
                message_id="d", task_id=asked[0].task.id, data={"decisions": [decision]}
            )
            before = await d.store.load("e3")

            async def refused(client: Any) -> Any:
                with pytest.raises(InvalidParamsError) as caught:
                    await collect(client, request)
                return caught.value

            error = await sdk(at(d.urls[0]), refused)
        after = await d.store.load("e3")
        turns = await d.queue.turns("e3")
    assert "more than the 100,000" in error.message
    assert before is not None and after is not None
    assert (after.version, after.messages) == (before.version, before.messages)
    assert [t.status for t in turns] == ["awaiting-input"]
