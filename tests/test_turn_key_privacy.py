"""A turn key (a message's idempotency key) held by ANOTHER session's turn: the front
end's refusal names neither that session nor its turn, in every protocol that submits
under a key (AI SDK, A2A, AG-UI); the operator's log line keeps them. Before, the
queue's ``TurnConflict`` said ``... already names turn T of session 'S'`` and the 409
(or the protocol's error) carried it to the client. A real front end (in this process)
on the test run's own PostgreSQL and Redis; the other session's turn is submitted
straight to the queue under the key this session's message would use (a queue user
keying its own way, or a hash collision: the front ends scope keys by session)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from runtime.app.web.a2a_queued import _message_key as a2a_key
from runtime.app.web.agui import _run_key
from runtime.app.web.frontend import message_key
from runtime.errors import TurnConflict
from runtime.logging import configure_logging
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, deployment
from tests.test_worker_protocols import scripted_agent

OTHER = "zz-other-private-session"
MINE = "mine-1"


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def _ai_sdk() -> tuple[str, str, dict[str, Any]]:
    body = {
        "id": MINE,
        "messages": [{"id": "m-1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}],
    }
    return message_key(MINE, "submit", "m-1"), "/api/chat", body


def _a2a() -> tuple[str, str, dict[str, Any]]:
    message = {
        "messageId": "m-1",
        "role": "ROLE_USER",
        "parts": [{"text": "hi"}],
        "contextId": MINE,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    return a2a_key(MINE, "m-1"), "/a2a/jsonrpc", body


def _agui() -> tuple[str, str, dict[str, Any]]:
    body = {
        "threadId": MINE,
        "runId": "run-1",
        "messages": [{"id": "m-1", "role": "user", "content": "hi"}],
    }
    return _run_key(MINE, "m-1"), "/ag-ui", body


@pytest.fixture
def info_log() -> Iterator[io.StringIO]:
    """What Axon logs at ``info`` meanwhile (``serve --log-level info``)."""
    log = io.StringIO()
    configure_logging("info", stream=log)
    try:
        yield log
    finally:
        configure_logging("warning")


def _operator_lines(log: io.StringIO) -> list[str]:
    return [line for line in log.getvalue().splitlines() if OTHER in line]


@pytest.mark.parametrize("shape", [_ai_sdk, _a2a, _agui], ids=["ai-sdk", "a2a", "ag-ui"])
async def test_a_key_of_another_sessions_turn_is_refused_without_naming_it(
    pg_url: str, redis_url: str, shape: Any, info_log: io.StringIO
) -> None:
    key, path, sent = shape()
    async with deployment(
        pg_url, redis_url, scripted_agent(), protocols=("ai-sdk", "a2a", "ag-ui"), worker=False
    ) as d:
        other = await d.queue.submit(OTHER, "secret", idempotency_key=key)
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(d.urls[0] + path, json=sent)
        seen = response.text + " ".join(f"{k}: {v}" for k, v in response.headers.items())
        assert "already used by another session" in seen  # refused, and said so
        for private in (OTHER, other.turn_id):
            assert private not in seen
        assert await d.queue.turns(MINE) == []  # nothing queued
        assert [t.turn_id for t in await d.queue.turns(OTHER)] == [other.turn_id]
    lines = _operator_lines(info_log)  # the operator's one line names both
    assert len(lines) == 1 and "turn_queue.key_taken" in lines[0] and other.turn_id in lines[0]


async def test_the_queue_refusal_names_only_the_callers_session(
    pg_url: str, redis_url: str, info_log: io.StringIO
) -> None:
    async with deployment(pg_url, redis_url, scripted_agent(), worker=False) as d:
        other = await d.queue.submit(OTHER, "secret", idempotency_key="k-1")
        with pytest.raises(TurnConflict) as raised:
            await d.queue.submit(MINE, "hi", idempotency_key="k-1")
    text = str(raised.value)
    assert MINE in text and OTHER not in text and other.turn_id not in text
    lines = _operator_lines(info_log)
    assert len(lines) == 1 and "turn_queue.key_taken" in lines[0] and other.turn_id in lines[0]
