"""A stop sent while an approved turn's continuation runs, by a client that did not send
the continuation (the page was reloaded: its continuation request is gone or is another
tab's), naming the turn's user message as the chat page does, or nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from runtime.messages import AssistantMessage
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events, two_front_ends
from tests.test_worker_approval import (
    answer,
    approval_agent,
    asked,
    chat,
    payloads,
    ran,
    waiting_turn,
)
from tests.web.harness import wait_idle, web_server

STOPS = {"named": {"messageId": "u1"}, "plain": {}}


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


async def _continue_until_text(
    client: httpx.AsyncClient, url: str, sent: Any, *, leave: bool
) -> Any:
    """POST the continuation; once its answer streams, leave (``leave``) or hand back the
    open response's reader (the other tab that still reads)."""
    cm = client.stream("POST", f"{url}/api/chat", json=sent)
    response = await cm.__aenter__()
    lines = response.aiter_lines()
    async for line in lines:
        if '"text-delta"' in line:
            break
    if leave:
        await cm.__aexit__(None, None, None)
        return None
    return cm, lines


def _stored_answer(messages: Any) -> AssistantMessage:
    answers = [m for m in messages if isinstance(m, AssistantMessage)]
    return answers[-1]


@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
async def test_a_stop_after_a_reload_reaches_a_running_continuation_in_the_worker_deployment(
    pg_url: str, redis_url: str, stop: dict
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(delay=0.05), fronts=2) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = sse_events((await client.post(f"{a}/api/chat", json=chat("s1"))).text)
            turn = await waiting_turn(d)
            sent = answer("s1", payloads(first)[0]["messageId"], asked(first)["approvalId"], True)
            await _continue_until_text(client, a, sent, leave=True)  # the page reloads
            stopped = await client.post(f"{b}/api/chat/s1/stop", json=stop)
        finished = await d.queue.wait_finished(turn.turn_id, LIMIT)
        record = await d.store.load("s1")
    assert stopped.status_code == 202 and stopped.json()["turn_id"] == turn.turn_id
    assert finished is not None and finished.status == "cancelled"
    assert ran == ["/x"]  # approved: the call ran, the answer after it was cut
    assert record is not None and _stored_answer(record.messages).interrupted


async def test_a_stop_naming_its_answer_reaches_a_running_continuation_in_the_worker_deployment(
    pg_url: str, redis_url: str
) -> None:
    # The AI SDK's stop of a continuation names the continuation POST's messageId: the
    # answer (msg_<turn id>), not the user message the continuation is keyed by. It found
    # no turn: 204, and the continuation ran on (the embedded app's named_by finds it).
    async with deployment(pg_url, redis_url, approval_agent(delay=0.05), fronts=2) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = sse_events((await client.post(f"{a}/api/chat", json=chat("s1"))).text)
            turn = await waiting_turn(d)
            answer_id = payloads(first)[0]["messageId"]
            sent = answer("s1", answer_id, asked(first)["approvalId"], True)
            await _continue_until_text(client, a, sent, leave=True)
            stopped = await client.post(f"{b}/api/chat/s1/stop", json={"messageId": answer_id})
        finished = await d.queue.wait_finished(turn.turn_id, LIMIT)
    assert answer_id == turn.message_id
    assert stopped.status_code == 202 and stopped.json()["turn_id"] == turn.turn_id
    assert finished is not None and finished.status == "cancelled"


@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
async def test_a_stop_from_another_tab_reaches_a_running_continuation_in_the_embedded_app(
    stop: dict,
) -> None:
    async with web_server(approval_agent(delay=0.05)) as server:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = sse_events((await client.post(f"{server.url}/api/chat", json=chat("s1"))).text)
            sent = answer("s1", payloads(first)[0]["messageId"], asked(first)["approvalId"], True)
            cm, lines = await _continue_until_text(client, server.url, sent, leave=False)
            stopped = await client.post(f"{server.url}/api/chat/s1/stop", json=stop)
            rest = [line async for line in lines]
            await cm.__aexit__(None, None, None)
        await wait_idle(server, "s1")
        record = await server.host.store.load("s1")
    assert stopped.status_code == 202
    assert 'data: {"type":"abort","reason":"stopped by user"}' in rest
    assert ran == ["/x"]
    assert record is not None and _stored_answer(record.messages).interrupted


@pytest.mark.parametrize("stop", STOPS.values(), ids=STOPS.keys())
async def test_a_stop_on_another_embedded_front_end_reaches_a_running_continuation(
    redis_url: str, stop: dict
) -> None:
    async with two_front_ends(redis_url, approval_agent(delay=0.05)) as (a, b):
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = sse_events((await client.post(f"{a.url}/api/chat", json=chat("s1"))).text)
            sent = answer("s1", payloads(first)[0]["messageId"], asked(first)["approvalId"], True)
            cm, lines = await _continue_until_text(client, a.url, sent, leave=False)
            stopped = await client.post(f"{b.url}/api/chat/s1/stop", json=stop)
            rest = [line async for line in lines]
            await cm.__aexit__(None, None, None)
        await wait_idle(a, "s1")
        record = await a.host.store.load("s1")
    assert stopped.status_code == 202
    assert 'data: {"type":"abort","reason":"stopped by user"}' in rest
    assert ran == ["/x"]
    assert record is not None and _stored_answer(record.messages).interrupted


async def test_a_late_stop_of_a_continuation_does_not_stop_a_regenerate_of_its_answer() -> None:
    # The continuation of answer A ended before the client's stop naming A (the AI SDK
    # continuation's messageId) arrived; a regenerate of A names A too (what only a
    # regenerate has, so a stop that overtakes its POST stops it), and was stopped by
    # that late stop of the turn before.
    async with web_server(approval_agent()) as server:
        async with httpx.AsyncClient(timeout=LIMIT, base_url=server.url) as client:
            first = sse_events((await client.post("/api/chat", json=chat("s1"))).text)
            answer_id = payloads(first)[0]["messageId"]
            sent = answer("s1", answer_id, asked(first)["approvalId"], True)
            continued = await client.post("/api/chat", json=sent)
            stop = await client.post("/api/chat/s1/stop", json={"messageId": answer_id})
            again = {**chat("s1"), "trigger": "regenerate-message", "messageId": answer_id}
            regenerated = await client.post("/api/chat", json=again)
        await wait_idle(server, "s1")
    assert '"finishReason":"stop"' in continued.text
    assert stop.status_code == 204
    assert regenerated.status_code == 200 and "abort" not in regenerated.text
