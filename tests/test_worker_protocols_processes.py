"""Each protocol a worker deployment's front end serves, with real processes: a
``serve --protocols ...`` front end and ``python -m runtime worker`` processes on the
test run's own PostgreSQL and Redis, driven by the protocol's official client (the
``openai`` SDK, the ``a2a-sdk`` client, AG-UI's ``ag_ui.core`` event models, the
``mcp`` client)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
import trio
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    SendMessageConfiguration,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

from tests.support.redis import require_redis, unique_prefix
from tests.support.worker_agent import answer_text, read_ledger
from tests.test_a2a import answer_of, collect, last_state, sdk
from tests.test_a2a import user as a2a_user
from tests.test_agui import check_sequence, parse_sse, run_input, types, user, valid
from tests.test_mcp_server import Progress
from tests.test_worker_approval_processes import FrontEnds
from tests.test_worker_mcp import mcp_client
from tests.test_workers import Workers, sql

LIMIT = 60.0
PROTOCOLS = "ai-sdk,openai,ag-ui,a2a,mcp"


@pytest.fixture
def deployment(pg_url: str) -> Iterator[tuple[Workers, FrontEnds]]:
    redis_url = require_redis()
    prefix = unique_prefix()
    workers = Workers(pg_url, redis_url, prefix)
    fronts = FrontEnds(pg_url, redis_url, prefix)
    fronts.args += ["--protocols", PROTOCOLS]
    try:
        yield workers, fronts
    finally:
        workers.close()
        fronts.close()


async def test_the_openai_sdk_streams_and_completes_turns_that_worker_processes_run(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    url = await fronts.start()
    workers.start("w1")
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=LIMIT
    ) as client:
        with trio.fail_after(LIMIT):
            models = await client.models.list()
            stream = await client.chat.completions.create(
                model="worker-test",
                messages=[{"role": "user", "content": "tools via openai"}],
                stream=True,
                extra_headers={"X-Axon-Session": "p-oa"},
            )
            chunks = [chunk async for chunk in stream]
            whole = await client.chat.completions.create(
                model="worker-test",
                messages=[
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hey"},
                    {"role": "user", "content": "stateless"},
                ],
            )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    assert [m.id for m in models.data] == ["worker-test"]
    assert content == answer_text("tools via openai")
    assert reasoning == "I will record two effects."
    assert whole.choices[0].message.content == "echo: stateless"
    rows = sql(pg_url, "SELECT session_id, status, owner FROM axon_turns ORDER BY seq")
    assert [(r[1], r[2]) for r in rows] == [("done", "w1"), ("done", "w1")]
    assert rows[0][0] == "p-oa"
    sessions = sql(pg_url, "SELECT session_id FROM axon_sessions")
    assert sessions == [("p-oa",)]  # the stateless turn's scratch session is gone


async def test_an_mcp_tool_call_is_a_turn_a_worker_process_runs_with_progress_from_the_relay(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    url = await fronts.start()
    workers.start("w1")
    progress = Progress()
    async with mcp_client(url) as client:
        with trio.fail_after(LIMIT):
            result = await client.call_tool(
                "worker-test",
                {"prompt": "tools via mcp", "session_id": "p-mcp"},
                progress_callback=progress,
            )
    answer = answer_text("tools via mcp")
    assert result.structured_content == {
        "answer": answer,
        "session_id": "p-mcp",
        "finish_reason": "stop",
    }
    texts = [m for _, m in progress.seen if m is not None and not m.startswith("[tool")]
    assert "".join(texts) == answer
    assert sql(pg_url, "SELECT session_id, status, owner FROM axon_turns") == [
        ("p-mcp", "done", "w1")
    ]


async def agui_run(client: httpx.AsyncClient, body: dict) -> list[dict]:  # type: ignore[type-arg]
    """A run's events, each validated by AG-UI's official models, the sequence checked."""
    response = await client.post("/ag-ui", json=body)
    assert response.status_code == 200, response.text
    events = parse_sse(response.text)
    for event in events:
        valid(event)
    check_sequence(events)
    return events


async def test_an_agui_approval_waits_on_the_queue_and_its_resume_runs_the_tool_once_on_a_worker(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    first_front, second_front = await fronts.start(), await fronts.start()
    workers.start("w1", AXON_TEST_DELAY="0.01")
    async with httpx.AsyncClient(base_url=first_front, timeout=LIMIT) as one:
        with trio.fail_after(LIMIT):
            first = await agui_run(one, run_input("p-ag", user("approve it", "m1"), runId="r1"))
    (interrupt,) = first[-1]["outcome"]["interrupts"]
    assert sql(pg_url, "SELECT status, owner FROM axon_turns") == [("awaiting-input", None)]
    workers.start("w2", AXON_TEST_DELAY="0.01")
    resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}]
    async with httpx.AsyncClient(base_url=second_front, timeout=LIMIT) as two:
        with trio.fail_after(LIMIT):
            second = await agui_run(two, run_input("p-ag", resume=resume, runId="r2"))
    effects, _ = read_ledger(pg_url)
    assert first[-1]["outcome"]["type"] == "interrupt"
    assert interrupt["toolCallId"].endswith(".s0.call_a")  # its wire id
    assert "TOOL_CALL_START" not in types(second)
    (result,) = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert result["content"] == "recorded 1"
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == answer_text("approve it")
    assert effects == {"r1:0:call_a": 1}  # the approved tool ran once
    assert sql(pg_url, "SELECT turn_id, status FROM axon_turns") == [("r1", "done")]


async def test_a2a_tasks_are_queue_rows_that_worker_processes_run_and_any_front_end_follows(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    one, two = SimpleNamespace(url=await fronts.start()), SimpleNamespace(url=await fronts.start())
    workers.start("w1", AXON_TEST_DELAY="0.01")
    request = a2a_user("tools by a2a", context_id="p-a2a")
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    with trio.fail_after(LIMIT):
        (sent,) = await sdk(one, lambda c: collect(c, request), streaming=False)

        async def follow(client: Any) -> list[Any]:
            return [e async for e in client.subscribe(SubscribeToTaskRequest(id=sent.task.id))]

        events = await sdk(two, follow)  # subscribed on the other front end
        task = await sdk(one, lambda c: c.get_task(GetTaskRequest(id=sent.task.id)))

        async def refusals(client: Any) -> tuple[Any, Any]:
            with pytest.raises(TaskNotCancelableError) as finished:
                await client.cancel_task(CancelTaskRequest(id=sent.task.id))
            with pytest.raises(TaskNotFoundError) as unknown:
                await client.get_task(GetTaskRequest(id="p-a2a~msg_turn_unknown"))
            return finished.value, unknown.value

        await sdk(two, refusals, streaming=False)
    assert answer_of(events) == answer_text("tools by a2a")
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert "".join(p.text for p in task.artifacts[0].parts) == answer_text("tools by a2a")
    rows = sql(pg_url, "SELECT turn_id, status, owner FROM axon_turns")
    assert [(f"p-a2a~msg_{r[0]}", r[1], r[2]) for r in rows] == [(sent.task.id, "done", "w1")]
