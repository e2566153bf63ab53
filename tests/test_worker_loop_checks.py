"""A client tool's large answer on a worker deployment's front end (real PostgreSQL and
Redis, in process): checked once against its output schema, in a worker thread, over
AG-UI, over the AI SDK's POST and over A2A, as in the embedded app (tests/test_loop_checks.py,
tests/test_a2a_loop_checks.py)."""

from __future__ import annotations

import httpx
import orjson
import pytest
import trio
from a2a.types.a2a_pb2 import TaskState

from runtime import ToolMessage
from tests.support.redis import require_redis
from tests.test_a2a import sdk
from tests.test_a2a_loop_checks import FLOAT_ROWS, _answer_over_a2a
from tests.test_agui import run_input, user
from tests.test_frontend import deployment
from tests.test_loop_checks import BIG, _output_part, _saved_cut, agent
from tests.test_loop_checks import checks as checks  # the fixture
from tests.test_relay_web import sse_events
from tests.test_worker_approval import LIMIT, chat, payloads, waiting_turn
from tests.test_worker_protocols import agui_run, at


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_an_agui_large_answer_is_checked_once_in_a_thread_on_a_front_end(
    pg_url: str, redis_url: str, checks
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        first = await agui_run(url, run_input("s", user("go", "m1")))
        (wire,) = first[-1]["outcome"]["pendingToolCallIds"]
        content = orjson.dumps(BIG).decode()
        answer = {"id": "a1", "role": "tool", "toolCallId": wire, "content": content}
        last = await agui_run(url, run_input("s", user("go", "m1"), answer, runId="r2"))
        record = await d.store.load("s")
    assert last[-1]["type"] == "RUN_FINISHED" and last[-1]["outcome"]["type"] == "success"
    assert len(checks.values) == 1 and checks.on_main == [False]  # was 3, on the loop
    assert checks.converted_on_loop == 0
    _saved_cut(record)


async def test_an_ai_sdk_large_tool_output_is_checked_once_in_a_thread_on_a_front_end(
    pg_url: str, redis_url: str, checks
) -> None:
    async with deployment(pg_url, redis_url, agent()) as d:
        url = d.urls[0]
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(f"{url}/api/chat", json=chat("s", "go"))
            first = payloads(sse_events(response.text))
            await waiting_turn(d, "s")
            sent = chat("s", "go")
            message_id = first[0]["messageId"]
            sent["messages"].append(
                {
                    "id": message_id,
                    "role": "assistant",
                    "parts": [{"type": "step-start"}, _output_part(BIG)],
                }
            )
            sent["messageId"] = message_id
            second = await client.post(f"{url}/api/chat", json=sent)
        record = await d.store.load("s")
    assert second.status_code == 200, second.text
    assert len(checks.values) == 1 and checks.on_main == [False]  # was 2, on the loop
    assert checks.converted_on_loop == 0
    _saved_cut(record)
    assert record is not None and any(isinstance(m, ToolMessage) for m in record.messages)


async def test_an_a2a_large_output_is_checked_once_in_a_thread_on_a_front_end(
    pg_url: str, redis_url: str, checks
) -> None:
    async with deployment(pg_url, redis_url, agent(), protocols=("a2a",)) as d:
        with trio.fail_after(LIMIT):
            asked, answered = await sdk(
                at(d.urls[0]), lambda c: _answer_over_a2a(c, BIG), streaming=False
            )
        record = await d.store.load(asked.task.context_id)
    assert answered.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert len(checks.values) == 1 and checks.on_main == [False]  # was 2, on the loop
    assert checks.converted_on_loop == 0  # was 2
    assert record is not None
    (saved,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert isinstance(saved.output, str) and saved.output.startswith(FLOAT_ROWS)
