"""A turn that waits for approval in the worker deployment, with real processes: two
``serve`` front ends and ``python -m runtime worker`` processes, on the test run's own
PostgreSQL and Redis (issue 21's test).

The turn asks; its queue row then waits with no owner and no lease; every worker is
SIGKILLed; a new one starts; the approval is posted to the other front end; the tool runs
once; the client that resumes on the first front end with ``Last-Event-ID`` misses and
repeats nothing; the stored message holds the request, the decision and the result."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio

from actors.stores.postgres import PostgresStore
from runtime.messages import AssistantMessage, TextPart, ToolCallPart, ToolMessage
from tests.support.redis import require_redis, unique_prefix
from tests.support.worker_agent import answer_text, read_ledger
from tests.test_relay_web import sse_events
from tests.test_workers import REPO, Workers, sql, wait_for

LIMIT = 60.0
AGENT = "tests.support.worker_agent:agent"


class FrontEnds:
    """``python -m runtime serve`` processes of one deployment; all stopped at the end."""

    def __init__(self, pg_url: str, redis_url: str, prefix: str) -> None:
        self.args = ["--store", pg_url, "--redis", redis_url, "--redis-prefix", prefix]
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "runtime", "serve", "--port", "0", *self.args,
             "--agent", AGENT, "--log-level", "warning"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": REPO},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    async def start(self) -> str:
        """Start a front end; its URL, once it serves."""
        proc = self.spawn()
        assert proc.stdout is not None
        line = await trio.to_thread.run_sync(proc.stdout.readline)
        assert "front-end mode" in line, line + (proc.stderr.read() if proc.poll() else "")
        return line.split()[4].rstrip("/")

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


@pytest.fixture
def deployment(pg_url: str) -> Iterator[tuple[Workers, FrontEnds]]:
    redis_url = require_redis()
    prefix = unique_prefix()
    workers = Workers(pg_url, redis_url, prefix)
    fronts = FrontEnds(pg_url, redis_url, prefix)
    try:
        yield workers, fronts
    finally:
        workers.close()
        fronts.close()


def chat(session_id: str, text: str) -> dict[str, Any]:
    return {
        "id": session_id,
        "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}],
        "trigger": "submit-message",
    }


def approval(session_id: str, text: str, message_id: str, approval_id: str) -> dict[str, Any]:
    """What ``useChat`` sends once ``addToolApprovalResponse`` approved the call."""
    sent = chat(session_id, text)
    part = {
        "type": "tool-guarded",
        "toolCallId": "call_a",
        "state": "approval-responded",
        "input": {"n": 1},
        "approval": {"id": approval_id, "approved": True},
    }
    sent["messages"].append(
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
    )
    sent["messageId"] = message_id
    return sent


async def read_some(response: httpx.Response, count: int) -> list[tuple[str | None, Any]]:
    """The first ``count`` events of a streaming response that carry an id."""
    raw = ""
    async for text in response.aiter_text():
        raw += text
        complete = raw[: raw.rfind("\n\n") + 2]
        events = [e for e in sse_events(complete) if e[0] is not None] if complete.strip() else []
        if len(events) >= count:
            return events[:count]
    raise AssertionError(f"the stream ended before {count} events: {raw!r}")


async def test_an_approval_survives_every_worker_and_resumes_from_another_front_end(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    text = "approve the effect"
    first_front, second_front = await fronts.start(), await fronts.start()
    for name in ("w1", "w2"):
        workers.start(name, AXON_TEST_DELAY="0.03")
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            first = sse_events(
                (await client.post(f"{first_front}/api/chat", json=chat("s1", text))).text
            )
        asked = next(d for _, d in first if d != "[DONE]" and d["type"] == "tool-approval-request")
        message_id = first[0][1]["messageId"]
        turn_id = message_id.removeprefix("msg_")
        row = sql(pg_url, "SELECT status, owner, lease_until FROM axon_turns WHERE turn_id = %s",
                  turn_id)  # fmt: skip
        assert row == [("awaiting-input", None, None)]
        for name in ("w1", "w2"):
            workers.signal(name, signal.SIGKILL)
        workers.start("w3", AXON_TEST_DELAY="0.03")
        sent = approval("s1", text, message_id, asked["approvalId"])
        with trio.fail_after(LIMIT):
            async with client.stream("POST", f"{second_front}/api/chat", json=sent) as response:
                assert response.status_code == 200
                continued = await read_some(response, 6)  # then the client drops this one
            last = continued[-1][0]
            assert last is not None
            rest = await client.get(
                f"{first_front}/api/chat/s1/stream", headers={"last-event-id": last}
            )

        async def finished() -> bool:
            rows = sql(pg_url, "SELECT status FROM axon_turns WHERE turn_id = %s", turn_id)
            return rows == [("done",)]

        await wait_for(finished, LIMIT, "the resumed turn to finish")
    store = await PostgresStore.open(pg_url)
    try:
        record = await store.load("s1")
    finally:
        await store.aclose()
    effects, attempts = read_ledger(pg_url)
    key = f"{turn_id}:0:call_a"
    assert effects == {key: 1} and attempts == {key: 1}  # the tool ran once
    events = [e for e in first if e[0] is not None] + continued
    events += [e for e in sse_events(rest.text) if e[0] is not None]
    ids = [int(i) for i, _ in events if i is not None]
    pause = len([e for e in first if e[0] is not None]) + 1  # the wait takes a seq, unsent
    assert ids == [*range(1, pause), *range(pause + 1, ids[-1] + 1)]  # no gap, no repeat
    assert continued[0][1] == {"type": "start", "messageId": message_id}
    types = [d["type"] for _, d in events]
    assert types.count("tool-input-available") == 1  # not sent again by the continuation
    outputs = [d for _, d in events if d["type"] == "tool-output-available"]
    assert outputs == [
        {"type": "tool-output-available", "toolCallId": "call_a", "output": "recorded 1"}
    ]
    streamed = "".join(d["delta"] for _, d in events if d["type"] == "text-delta")
    assert streamed == "I need your approval. " + answer_text(text)
    assert record is not None
    assistant = [m for m in record.messages if isinstance(m, AssistantMessage)]
    assert [m.id for m in assistant] == [message_id]
    call = next(p for p in assistant[0].content if isinstance(p, ToolCallPart))
    assert call.awaiting is not None and call.awaiting.id == asked["approvalId"]  # the request
    assert call.awaiting.decided and call.awaiting.approved  # the decision
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [(r.tool_call_id, r.output) for r in results] == [("call_a", "recorded 1")]  # result
    stored_text = "".join(p.text for p in assistant[0].content if isinstance(p, TextPart))
    assert stored_text == streamed
