"""An approval's large edited input on a worker deployment's front end (real PostgreSQL
and Redis, in process), over AG-UI and over the AI SDK's POST: checked once against its
tool's schema, in a worker thread, as in the embedded app
(tests/test_loop_checks_edits.py). The AI SDK's session has a turn before the one that
waits, so the front end reads the last turn alone and asks whether the answers are
refused there first (``answers_refused``), which checked the edit too, on the loop."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent
from runtime.actor_messages import InferRequest
from runtime.app.web.answers import EDITED_INPUT
from runtime.messages import UserMessage
from tests.support.redis import require_redis
from tests.test_agui import run_input, user
from tests.test_frontend import deployment
from tests.test_loop_checks_edits import LARGE, _stored_input, keep, kept
from tests.test_loop_checks_edits import checks as checks  # the fixture
from tests.test_relay_web import sse_events
from tests.test_worker_approval import LIMIT, chat, payloads, waiting_turn
from tests.test_worker_protocols import agui_run


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def _keep_when_asked(request: InferRequest) -> list[Any]:
    """``keep`` as ``K`` when the last user message says "keep", then ``done``; else
    ``hello`` (every worker reads the same script)."""
    last = [m for m in request.messages if isinstance(m, UserMessage)][-1]
    if "keep" not in str(last.content):
        return ["hello"]
    if current_step(request.messages) == 0:
        return [*tool_call("keep", {"rows": [1]}, tool_call_id="K")]
    return ["done"]


def agent() -> Agent:
    return Agent(name="keeper", provider=ScriptedProvider(responder=_keep_when_asked), tools=[keep])


async def test_an_agui_large_edit_is_checked_once_in_a_thread_on_a_front_end(
    pg_url: str, redis_url: str, checks
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        first = await agui_run(url, run_input("s", user("keep", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": True, "editedArgs": LARGE}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        last = await agui_run(url, run_input("s", user("keep", "m1"), resume=resume, runId="r2"))
        record = await d.store.load("s")
    assert last[-1]["outcome"] == {"type": "success"}
    assert checks == [False]  # was [True, True]
    assert kept == [2_500]
    assert _stored_input(record, 1) == LARGE


async def test_an_ai_sdk_large_edit_is_checked_once_in_a_thread_on_a_front_end(
    pg_url: str, redis_url: str, checks
) -> None:
    async with deployment(pg_url, redis_url, agent()) as d:
        url = d.urls[0]
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            hello = await client.post(f"{url}/api/chat", json=chat("s", "hi", "u0"))
            assert hello.status_code == 200
            response = await client.post(f"{url}/api/chat", json=chat("s", "keep"))
            first = payloads(sse_events(response.text))
            await waiting_turn(d, "s")
            (asked,) = [c for c in first if c["type"] == "tool-approval-request"]
            approval = {"id": asked["approvalId"], "approved": True, EDITED_INPUT: LARGE}
            part = {
                "type": "tool-keep",
                "toolCallId": "K",
                "state": "approval-responded",
                "input": {"rows": [1]},
                "approval": approval,
            }
            sent = chat("s", "keep")
            message_id = first[0]["messageId"]
            sent["messages"].append(
                {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
            )
            sent["messageId"] = message_id
            second = await client.post(f"{url}/api/chat", json=sent)
        record = await d.store.load("s")
    assert second.status_code == 200, second.text
    assert checks == [False]  # was [True, False, True]: the last turn's refusal test, the
    # check before recording (in a thread), the recording
    assert kept == [2_500]
    assert _stored_input(record, 3) == LARGE
