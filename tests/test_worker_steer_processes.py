"""``serve --on-busy steer`` with real processes: a ``serve`` front end and a ``python -m
runtime worker`` process on the test run's own PostgreSQL and Redis.

A ``tools`` turn (tests/support/worker_agent.py) records effect 1 in step 0 and effect 2 in
step 1, each tool holding a while; a message posted while step 1's tool holds is queued
naming the running turn, the worker inserts it at the step boundary, and step 2's model
call is the first to see it: the agent answers the last user message it was sent
(``echo: ...``), so the answer proves the request held it. The running stream shows it
live (``data-steered``), the POST gets 202, the store holds it where the model saw it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import trio

from actors.stores.postgres import PostgresStore
from runtime.messages import AssistantMessage, UserMessage
from runtime.store import SessionRecord
from tests.support.redis import require_redis, unique_prefix
from tests.test_approval_node import ai6_entry
from tests.test_relay_web import sse_events
from tests.test_worker_approval_processes import FrontEnds, chat
from tests.test_workers import Workers, sql
from tests.web.harness import WEB, ensure_ai_package, run_node_script

LIMIT = 60.0


@pytest.fixture
def deployment(pg_url: str) -> Iterator[tuple[Workers, FrontEnds]]:
    redis_url = require_redis()
    prefix = unique_prefix()
    workers = Workers(pg_url, redis_url, prefix)
    fronts = FrontEnds(pg_url, redis_url, prefix)
    fronts.args += ["--on-busy", "steer"]
    try:
        yield workers, fronts
    finally:
        workers.close()
        fronts.close()


def steering(session_id: str, text: str) -> dict[str, Any]:
    sent = chat(session_id, text)
    sent["messages"][0]["id"] = "u2"
    return sent


async def until_tool_call(chunks: AsyncIterator[str], call_id: str) -> str:
    """The stream's text read until tool call ``call_id`` starts (its tool holds there);
    the rest stays unread in ``chunks``."""
    raw = ""
    async for text in chunks:
        raw += text
        if f'"toolCallId":"{call_id}"' in raw.replace(" ", ""):
            break
    return raw


async def rest_of(chunks: AsyncIterator[str]) -> str:
    """The stream's text still unread in ``chunks``, to its end."""
    return "".join([text async for text in chunks])


async def turn_outcome(
    pg_url: str, raw: str, columns: str = "status, finish_reason, steer_of"
) -> tuple[list[Any], str, list[tuple[Any, ...]], SessionRecord | None]:
    """What a steered turn of session ``s1`` left: the stream's events, the turn's id,
    the ``columns`` of its ``axon_turns`` rows in order, and the stored session."""
    events = [d for _, d in sse_events(raw) if d != "[DONE]"]
    turn_id = events[0]["messageId"].removeprefix("msg_")
    rows = sql(
        pg_url,
        f"SELECT {columns} FROM axon_turns WHERE session_id = %s ORDER BY seq",
        "s1",
    )
    store = await PostgresStore.open(pg_url)
    try:
        record = await store.load("s1")
    finally:
        await store.aclose()
    return events, turn_id, rows, record


async def test_a_message_steered_into_a_workers_turn_reaches_its_next_model_call(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    front = await fronts.start()
    workers.start("w1", AXON_TEST_TOOL_HOLD="1.5")
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            async with client.stream(
                "POST", f"{front}/api/chat", json=chat("s1", "tools please")
            ) as response:
                assert response.status_code == 200
                chunks = response.aiter_text()
                raw = await until_tool_call(chunks, "call_2")  # step 1's tool holds
                steered = await client.post(f"{front}/api/chat", json=steering("s1", "also this"))
                raw += await rest_of(chunks)
    events, turn_id, rows, record = await turn_outcome(pg_url, raw)
    assert steered.status_code == 202, steered.text
    assert steered.json() == {
        "steered": True,
        "turnId": turn_id,
        "messageId": "u2",
        "answered": False,
    }
    assert rows == [("done", "stop", None), ("done", "steered", turn_id)]
    types = [e["type"] for e in events]
    at = types.index("data-steered")
    assert types[:at].count("start-step") == 2 and types[at + 1] == "start-step"
    assert events[at]["data"] == {
        "messageId": "u2",
        "text": "also this",
        "step": 2,
        "answerId": f"{events[0]['messageId']}-s2",  # where the answer is stored
    }
    answer = "".join(e["delta"] for e in events[at:] if e["type"] == "text-delta")
    assert answer == "echo: also this"  # step 2's request ended with the steered message
    assert record is not None
    kinds = [type(m).__name__ for m in record.messages]
    assert kinds == [
        *("UserMessage", "AssistantMessage", "ToolMessage", "ToolMessage"),
        *("UserMessage", "AssistantMessage"),
    ]
    steered_message, last = record.messages[4], record.messages[5]
    assert isinstance(steered_message, UserMessage) and steered_message.id == "u2"
    assert steered_message.content == "also this"
    assert isinstance(last, AssistantMessage) and last.text == "echo: also this"


def parts_of(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Each message's id, role and parts (metadata aside: the live stream's and the
    stored message's differ by design; so does a reasoning part's ``id``, which `ai` 7
    keeps from ``reasoning-start`` and the stored UI form has not)."""
    return [
        (m["id"], m["role"], [{k: v for k, v in p.items() if k != "id"} for p in m["parts"]])
        for m in messages
    ]


@pytest.fixture(scope="module")
def node() -> str:
    return ensure_ai_package()


@pytest.fixture(scope="module", params=["ai7", "ai6"])
def ai(request: pytest.FixtureRequest, node: str) -> dict[str, str]:
    return {} if request.param == "ai7" else {"ai": ai6_entry()}


async def steered_chat(
    deployment: tuple[Workers, FrontEnds], node: str, ai: dict[str, str], **config: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The real `ai` package's chat against two front ends and a worker: "tools please"
    from the first, "also this" sent to the second while step 1's tool holds; the chat's
    outcome and the stored session as a reload reads it."""
    workers, fronts = deployment
    urls = [await fronts.start(), await fronts.start()]
    workers.start("w1", AXON_TEST_TOOL_HOLD="2")
    config = {"url": urls[0], "urls": urls, "chatId": "s", "first": "tools please", **config}
    with trio.fail_after(LIMIT):
        chat = await run_node_script(
            node, WEB / "steer_chat.mjs", {**config, "holdTool": "record", "holdCount": 2, **ai}
        )
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        stored = (await client.get(f"{urls[1]}/api/sessions/s")).json()
    return chat, stored


async def test_a_useChat_message_steered_into_a_workers_turn_shows_where_it_is_stored(
    deployment: tuple[Workers, FrontEnds], node: str, ai: dict[str, str]
) -> None:
    """``sendMessage`` while the turn streams, the second POST on another front end: the
    answer so far ends at the message, the rest shows after it, as stored. The front end
    answered 202 and the first stream went on: the message sat at the bottom looking
    unanswered while the answer grew above it, and a reload reordered it."""
    chat, stored = await steered_chat(deployment, node, ai)
    assert chat["errors"] == [None] and chat["status"] == "ready"
    assert [b["trigger"] for b in chat["bodies"]] == ["submit-message", "submit-message"]
    assert parts_of(chat["steered"]) == parts_of(stored["ui_messages"])
    assert [m["role"] for m in chat["steered"]] == ["user", "assistant", "user", "assistant"]
    assert chat["steered"][3]["parts"][-1]["text"] == "echo: also this"
    (steered,) = chat["data"]
    assert steered["data"]["answerId"] == chat["steered"][3]["id"]


async def test_a_regenerate_after_a_steered_workers_turn_leaves_the_client_as_stored(
    deployment: tuple[Workers, FrontEnds], node: str, ai: dict[str, str]
) -> None:
    chat, stored = await steered_chat(deployment, node, ai, regenerate=True)
    assert chat["errors"] == [None, None]
    assert chat["bodies"][-1]["trigger"] == "regenerate-message"
    assert parts_of(chat["messages"]) == parts_of(stored["ui_messages"])
    texts = [p.get("text") for m in chat["messages"] for p in m["parts"] if p["type"] == "text"]
    assert texts[-2:] == ["also this", "echo: also this"]
