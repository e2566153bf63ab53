"""A worker's turn whose final save the store refused: the worker gives it back and
another claim re-runs it (``worker.turn_unsaved``), its readers told to drop the unsaved
step. The front end's client is shown one answer ending once: the unsaved run's end
never reaches the relay (``Worker._stream_turn`` holds a turn's end until its result is
in). Before, the client got that run's ``error`` quoting the store (its class, its
path) in the middle of the stream, then the re-run and a ``finish``. Real PostgreSQL,
real Redis, real HTTP over loopback."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import PostgresStore
from runtime import Agent
from runtime.app.unsaved import NOT_SAVED_MESSAGE
from runtime.errors import StoreError
from tests.support.redis import require_redis
from tests.test_frontend import body, deployment
from tests.test_relay_web import sse_events
from tests.test_web_unsaved_queue import TOLD

ANSWER = "hello there"
SECRET = "/var/lib/postgresql/private-7f3a"


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def refuse_the_answers_saves(monkeypatch: pytest.MonkeyPatch, times: float = math.inf) -> list[int]:
    """Refuse the first ``times`` saves that hold the answer, as a full disk would (its
    message naming :data:`SECRET`); the list the refused saves' starts go into."""
    real = PostgresStore.save
    refused: list[int] = []

    async def save(
        self: Any, session_id: str, start: int, messages: Any, meta: Any = None, **kw: Any
    ) -> Any:
        if len(refused) < times and any(getattr(m, "text", "") == ANSWER for m in messages):
            refused.append(start)
            raise StoreError(f"could not extend file {SECRET}: No space left on device")
        return await real(self, session_id, start, messages, meta, **kw)

    monkeypatch.setattr(PostgresStore, "save", save)
    return refused


async def chat_once(pg_url: str, redis_url: str) -> tuple[httpx.Response, Any, Any]:
    """One message posted to session ``s1`` of a worker deployment whose agent answers
    :data:`ANSWER`: the response, the session's one turn and its stored record."""
    agent = Agent(name="a", provider=ScriptedProvider(responder=lambda request: [ANSWER]))
    async with deployment(pg_url, redis_url, agent) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=30) as client:
            response = await client.post("/api/chat", json=body("s1"))
        record = await d.store.load("s1")
        (turn,) = await d.queue.turns("s1")
    return response, turn, record


async def test_a_turn_given_back_unsaved_streams_one_answer_ending_once(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first run's step commit and its final save: refused (a full disk).
    refused = refuse_the_answers_saves(monkeypatch, times=2)
    response, turn, record = await chat_once(pg_url, redis_url)
    events = [e for _, e in sse_events(response.text) if e != "[DONE]"]
    types = [e["type"] for e in events]
    assert len(refused) == 2 and turn.status == "done" and turn.attempts == 2
    assert "error" not in types and types.count("finish") == 1 and types[-1] == "finish"
    assert SECRET not in response.text and "StoreError" not in response.text
    assert record is not None and [m.role for m in record.messages] == ["user", "assistant"]


async def test_a_turn_whose_every_attempt_is_refused_ends_not_saved_for_its_client(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every save of the turn's answer refused: its last attempt's worker fails it as not
    saved, and its client's stream ends with the ``not_saved`` error the embedded app
    gives. Before, that worker gave it back like the others, the next claim failed it
    "abandoned by 3 workers (their leases expired while running it): it may be killing
    its workers", and the client was told the relay stream was lost ("reload")."""
    refuse_the_answers_saves(monkeypatch)
    response, turn, _ = await chat_once(pg_url, redis_url)
    events = [e for _, e in sse_events(response.text) if e != "[DONE]"]
    assert (turn.status, turn.finish_reason, turn.attempts) == ("failed", "error", 3)
    assert turn.error == NOT_SAVED_MESSAGE
    assert events[-1] == TOLD  # (as the embedded app's)
    types = [e["type"] for e in events]
    last_run = len(types) - types[::-1].index("reset-step") if "reset-step" in types else 0
    assert "".join(e.get("delta", "") for e in events[last_run:]) == ANSWER  # (shown once)
    assert SECRET not in response.text and "StoreError" not in response.text
