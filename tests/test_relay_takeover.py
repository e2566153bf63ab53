"""A turn whose relay stream Redis lost just before another worker took it over, read over
HTTP from a front end: real worker processes (one SIGKILLed), real PostgreSQL, the run's
own Redis killed and restarted empty. No reader may show the takeover's stream spliced
onto what it read before as the whole answer."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
import trio

from actors.relays import RedisRelay
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.app.web.ui_stream import ui_messages
from runtime.messages import AssistantMessage, TextPart, ToolCallPart
from tests.support.redis import (
    redis_restored,
    require_redis,
    start_redis,
    stop_redis,
    unique_prefix,
)
from tests.test_frontend import Deployment, EventReader
from tests.test_workers import Workers
from tests.web.harness import ensure_ai_package, run_read_stream

LIMIT = 90


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@asynccontextmanager
async def front_end_and_workers(
    pg_url: str, redis_url: str, protocols: tuple[str, ...] = ("ai-sdk",)
) -> AsyncIterator[tuple[Deployment, Workers]]:
    """One front end (in this process) serving ``protocols``, and worker processes, on
    one schema and prefix."""
    from tests.support.worker_agent import agent

    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    prefix = unique_prefix()
    workers = Workers(pg_url, redis_url, prefix)
    try:
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                d = Deployment(
                    pg_url, redis_url, prefix, agent, store, queue, nursery, protocols=protocols
                )
                await d.start_front_end()
                yield d, workers
                nursery.cancel_scope.cancel()
    finally:
        workers.close()
        with trio.CancelScope(shield=True):
            await queue.aclose()
            await store.aclose()


async def wait_for_seq(redis_url: str, prefix: str, turn_id: str, seq: int) -> None:
    """Wait until the turn's relay stream holds ``seq``."""
    async with RedisRelay.open(redis_url, prefix=prefix) as relay:
        while await last_seq(relay, turn_id) < seq:  # noqa: ASYNC110
            await trio.sleep(0.02)


async def last_seq(relay: RedisRelay, turn_id: str) -> int:
    """The last relay seq the turn's stream holds (0: no stream)."""
    last = await relay.client.xrevrange(relay.turn_key(turn_id), "+", "-", count=1)
    if not last:
        return 0
    fields = last[0].field_values
    return int(fields[b"first"]) + len(orjson.loads(fields[b"items"])) - 1


def shows_whole(events: list[tuple[str | None, Any]], stored: AssistantMessage) -> bool:
    """The events are the stored message: its text, its tool calls, a finish."""
    data = [d for _, d in events if d != "[DONE]"]
    text = "".join(d["delta"] for d in data if d["type"] == "text-delta")
    calls = [d["toolCallId"] for d in data if d["type"] == "tool-input-available"]
    return (
        text == "".join(p.text for p in stored.content if isinstance(p, TextPart))
        and calls == [p.tool_call_id for p in stored.content if isinstance(p, ToolCallPart)]
        and data[-1]["type"] == "finish"
    )


def errors(events: list[tuple[str | None, Any]]) -> list[Any]:
    return [d for _, d in events if d != "[DONE]" and d["type"] == "error"]


async def test_a_stream_lost_before_a_takeover_is_rebuilt_or_an_error_never_spliced(
    pg_url: str, redis_url: str
) -> None:
    got: dict[str, list[tuple[str | None, Any]]] = {}
    with redis_restored():
        async with front_end_and_workers(pg_url, redis_url) as (d, workers):
            workers.start("a", AXON_TEST_DELAY="0.1")
            turn = await d.queue.submit("s1", "tools one")
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:

                async def read(
                    name: str,
                    headers: dict[str, str],
                    until: int = 0,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                ) -> None:
                    async with client.stream(
                        "GET", "/api/chat/s1/stream", headers=headers
                    ) as response:
                        assert response.status_code == 200
                        reader = EventReader(response)
                        if until:
                            await reader.until(until)
                        task_status.started()
                        got[name] = await reader.all()

                await wait_for_seq(redis_url, d.prefix, turn.turn_id, 28)  # into the answer
                workers.signal("a", signal.SIGKILL)
                async with trio.open_nursery() as nursery:
                    # A client that had the turn up to seq 24 reconnects: it gets 25..28.
                    await nursery.start(read, "live", {"last-event-id": "24"}, 4)
                    await trio.to_thread.run_sync(stop_redis)  # Redis loses the stream
                    await trio.to_thread.run_sync(start_redis)
                    await nursery.start(read, "fresh", {})
                    await nursery.start(read, "resumed", {"last-event-id": "28"})
                    workers.start("b", AXON_TEST_DELAY="0.03")  # takes the turn over
            done = await d.queue.get(turn.turn_id)
            assert done is not None and done.status == "done" and done.attempts == 2
            record = await d.store.load("s1")
            assert record is not None
            [stored] = [m for m in record.messages if m.id == turn.message_id]
            assert isinstance(stored, AssistantMessage)
    # The takeover re-ran only the answer step (its stream has no tool call) and
    # numbered it from 1, so a client that had the dead worker's seqs up to 28 must not
    # get the takeover's seqs from 29 on as the rest of the answer.
    assert shows_whole(got["fresh"], stored) and not errors(got["fresh"])  # rebuilt
    assert errors(got["resumed"]) and not shows_whole(got["resumed"], stored)
    assert errors(got["live"]) and min(int(i) for i, _ in got["live"] if i) == 25


def as_sse(events: list[tuple[str | None, Any]]) -> str:
    """Parsed SSE events back as an SSE body."""
    out = []
    for event_id, data in events:
        head = f"id: {event_id}\n" if event_id is not None else ""
        body = data if data == "[DONE]" else orjson.dumps(data).decode()
        out.append(f"{head}data: {body}\n\n")
    return "".join(out)


async def read_ui_message(node: str, sse: str) -> dict[str, Any]:
    """The UI message the `ai` package's readUIMessageStream builds from ``sse``."""
    read = await run_read_stream(node, {"sse": sse, "read": True})
    assert all(p["success"] for p in read["parsed"]), read["parsed"]
    assert read["error"] is None, read["error"]
    message: dict[str, Any] = read["message"]
    return message


def shape(parts: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """A UI message's parts as what a viewer sees: type, and text or call id."""
    return [(p["type"], p.get("text", p.get("toolCallId"))) for p in parts]


async def test_a_takeover_that_answers_otherwise_takes_back_the_dead_worker_s_text(
    pg_url: str, redis_url: str
) -> None:
    """Worker ``a`` streams part of the answer and is SIGKILLed; ``b`` re-runs the step
    and answers otherwise. The AI SDK client that watched it live, one that resumes with
    ``Last-Event-ID`` from the middle of the dead worker's answer, and one that comes
    after, all end (through the `ai` package) with the stored message, none of ``a``'s
    text in it."""
    node = ensure_ai_package()
    got: dict[str, list[tuple[str | None, Any]]] = {}
    async with front_end_and_workers(pg_url, redis_url) as (d, workers):
        workers.start("a", AXON_TEST_DELAY="0.05", AXON_TEST_ANSWER_TAG="first-")
        turn = await d.queue.submit("s1", "tools one")
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:

            async def read(
                name: str,
                headers: dict[str, str],
                task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
            ) -> None:
                async with client.stream("GET", "/api/chat/s1/stream", headers=headers) as r:
                    assert r.status_code == 200
                    reader = EventReader(r)
                    await reader.until(1)
                    task_status.started()
                    got[name] = await reader.all()

            await wait_for_seq(redis_url, d.prefix, turn.turn_id, 28)  # into the answer
            async with trio.open_nursery() as nursery:
                await nursery.start(read, "live", {})
                workers.signal("a", signal.SIGKILL)
                async with RedisRelay.open(redis_url, prefix=d.prefix) as relay:
                    dead = await last_seq(relay, turn.turn_id)
                workers.start("b", AXON_TEST_DELAY="0.03", AXON_TEST_ANSWER_TAG="second-")
                await wait_for_seq(redis_url, d.prefix, turn.turn_id, dead + 6)  # b's reset in
                await nursery.start(read, "resumed", {"last-event-id": "26"})
                await nursery.start(read, "after", {})
        done = await d.queue.get(turn.turn_id)
        assert done is not None and done.status == "done" and done.attempts == 2
        record = await d.store.load("s1")
        assert record is not None
    [stored] = [m for m in ui_messages(record.messages) if m["id"] == turn.message_id]
    assert "first-" not in orjson.dumps(stored).decode()
    assert "second-w0" in orjson.dumps(stored).decode()
    live = [data for _, data in got["live"]]
    assert any(d != "[DONE]" and "first-" in d.get("delta", "") for d in live)  # a's text shown
    assert [d["type"] for d in live if d != "[DONE]"].count("reset-step") == 1
    resumed = [e for e in got["live"] if e[0] is not None and int(e[0]) <= 26] + got["resumed"]
    for events in (got["live"], resumed, got["after"]):
        message = await read_ui_message(node, as_sse(events))
        assert "first-" not in orjson.dumps(message).decode()
        assert shape(message["parts"]) == shape(stored["parts"])


async def test_an_agui_run_taken_over_mid_answer_ends_with_the_re_run_s_answer_only(
    pg_url: str, redis_url: str
) -> None:
    """The same takeover through AG-UI (a front end reading the relay for a protocol
    that cannot take text back): valid events in a valid sequence, the reset said, and
    the closing snapshot holds the stored answer, none of the dead worker's text."""
    from tests.test_agui import check_sequence, parse_sse, run_input, user, valid

    async with front_end_and_workers(pg_url, redis_url, ("ag-ui",)) as (d, workers):
        workers.start("a", AXON_TEST_DELAY="0.05", AXON_TEST_ANSWER_TAG="first-")
        response: list[httpx.Response] = []

        async def post() -> None:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as c:
                body = run_input("t1", user("tools one", "u1"), runId="r1")
                response.append(await c.post("/ag-ui", json=body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            await wait_for_seq(redis_url, d.prefix, "r1", 28)  # into the answer
            workers.signal("a", signal.SIGKILL)
            workers.start("b", AXON_TEST_DELAY="0.01", AXON_TEST_ANSWER_TAG="second-")
        record = await d.store.load("t1")
        assert record is not None
    [r] = response
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    for event in events:
        valid(event)
    check_sequence(events)
    shown = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert "first-w0" in shown  # the dead worker's text went out
    [reset] = [e for e in events if e.get("name") == "axon.reset-step"]
    assert reset["value"]["step"] == 2 and reset["value"]["errorText"].startswith("Takeover")
    snapshot = next(e for e in reversed(events) if e["type"] == "MESSAGES_SNAPSHOT")
    [answer] = [m for m in snapshot["messages"] if m["role"] == "assistant" and m.get("content")]
    [stored] = [m for m in record.messages if isinstance(m, AssistantMessage)]
    text = "".join(p.text for p in stored.content if isinstance(p, TextPart))
    assert answer["content"] == text and "second-w0" in text
    assert "first-" not in orjson.dumps(snapshot).decode()


async def test_an_openai_completion_taken_over_mid_answer_holds_the_re_run_s_answer(
    pg_url: str, redis_url: str
) -> None:
    """Through the OpenAI-compatible endpoint, answered whole: the completion is the
    stored answer, none of the dead worker's text."""
    async with front_end_and_workers(pg_url, redis_url, ("openai",)) as (d, workers):
        workers.start("a", AXON_TEST_DELAY="0.05", AXON_TEST_ANSWER_TAG="first-")
        response: list[httpx.Response] = []

        async def post() -> None:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as c:
                body = {
                    "model": "worker-test",
                    "messages": [{"role": "user", "content": "tools one"}],
                }
                headers = {"X-Axon-Session": "oa"}
                response.append(await c.post("/v1/chat/completions", json=body, headers=headers))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post)
            while not (turns := await d.queue.turns("oa")):
                assert not response, response[0].text
                await trio.sleep(0.02)
            await wait_for_seq(redis_url, d.prefix, turns[0].turn_id, 28)  # into the answer
            workers.signal("a", signal.SIGKILL)
            workers.start("b", AXON_TEST_DELAY="0.01", AXON_TEST_ANSWER_TAG="second-")
        record = await d.store.load("oa")
        assert record is not None
    [r] = response
    assert r.status_code == 200, r.text
    [stored] = [m for m in record.messages if isinstance(m, AssistantMessage)]
    text = "".join(p.text for p in stored.content if isinstance(p, TextPart))
    assert r.json()["choices"][0]["message"]["content"] == text
    assert "second-w0" in text and "first-" not in r.text
