"""The front end's idempotency keys attacked over HTTP: long ids, ids with the old key's
separator, a message id sent again with new text (an edit), a NUL in an id. Real
PostgreSQL, real Redis, real ``serve`` and workers."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import structlog
import trio

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.app.web.frontend import FrontEnd
from runtime.app.web.http import RELAY_UNAVAILABLE, STORE_REFUSED, STORE_UNAVAILABLE, ApiError
from runtime.app.web.resume import turn_to_resume
from runtime.approval import Decision
from runtime.errors import RelayUnavailable, StoreError, StoreUnavailable, TurnConflict
from runtime.messages import AssistantMessage, UserMessage
from tests.support.redis import require_redis, unique_prefix
from tests.support.worker_agent import agent as echo_agent
from tests.test_frontend import LIMIT, _axon, body, data, deployment, streamed_text
from tests.test_relay_web import sse_events
from tests.test_turn_queue import sql


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def started(response: httpx.Response) -> str:
    """The assistant message id a streamed answer starts."""
    assert response.status_code == 200, response.text
    first = data(sse_events(response.text))[0]
    assert first["type"] == "start", response.text
    return str(first["messageId"])


async def test_two_long_message_ids_sharing_a_prefix_in_a_long_session_are_two_turns(
    pg_url: str, redis_url: str
) -> None:
    session = "s" * 128  # the old key kept only 64 characters of the message id
    async with deployment(pg_url, redis_url, echo_agent) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            one = await client.post("/api/chat", json=body(session, "one", "m" * 64 + "-1"))
            two = await client.post("/api/chat", json=body(session, "two", "m" * 64 + "-2"))
        turns = await d.queue.turns(session)
    assert [t.input for t in turns] == ["one", "two"]
    assert started(one) != started(two)
    assert streamed_text(sse_events(two.text)) == "echo: two"


async def test_ids_that_spell_the_same_old_key_in_two_sessions_are_two_turns(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, echo_agent) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            first = await client.post("/api/chat", json=body("a", "one", "b:submit:c"))
            second = await client.post("/api/chat", json=body("a:submit:b", "two", "c"))
        mine, theirs = await d.queue.turns("a"), await d.queue.turns("a:submit:b")
    assert streamed_text(sse_events(first.text)) == "echo: one"
    assert streamed_text(sse_events(second.text)) == "echo: two"
    assert [t.input for t in mine] == ["one"] and [t.input for t in theirs] == ["two"]


async def test_a_message_id_sent_again_with_new_text_runs_the_edit(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, echo_agent) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            first = await client.post("/api/chat", json=body("s1", "first", "u1"))
            edit = await client.post("/api/chat", json=body("s1", "second", "u1"))
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert started(first) != started(edit)
    assert streamed_text(sse_events(edit.text)) == "echo: second"
    assert [(t.input, t.regenerate) for t in turns] == [("first", False), ("second", True)]
    assert record is not None  # the edit replaced the old turn, as the embedded server does
    assert [(type(m), m.text) for m in record.messages] == [
        (UserMessage, "second"),
        (AssistantMessage, "echo: second"),
    ]


async def test_an_identical_retry_replays_the_turn_it_queued(pg_url: str, redis_url: str) -> None:
    async with deployment(pg_url, redis_url, echo_agent) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            first = await client.post("/api/chat", json=body("s1", "hello", "u1"))
            retry = await client.post("/api/chat", json=body("s1", "hello", "u1"))
        turns = await d.queue.turns("s1")
    assert started(first) == started(retry)
    assert len(turns) == 1


async def test_editing_a_message_that_later_turns_follow_is_a_409(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, echo_agent) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("s1", "one", "u1"))
            await client.post("/api/chat", json=body("s1", "two", "u2"))
            edit = await client.post("/api/chat", json=body("s1", "uno", "u1"))
        turns = await d.queue.turns("s1")
    assert edit.status_code == 409
    assert "only the last message can be edited" in edit.json()["error"]
    assert [t.input for t in turns] == ["one", "two"]


async def test_editing_a_message_whose_turn_is_still_queued_is_refused(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await queue.submit("s1", "one", idempotency_key="k")
        with pytest.raises(TurnConflict, match="still queued"):
            await queue.submit("s1", "uno", idempotency_key="k")
        assert [t.input for t in await queue.turns("s1")] == ["one"]
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_nul_in_a_message_id_is_a_400_without_a_traceback(
    pg_url: str, redis_url: str
) -> None:
    serve = _axon("serve", "--port", "0", "--store", pg_url, "--redis", redis_url,
                  "--redis-prefix", unique_prefix())  # fmt: skip
    try:
        assert serve.stdout is not None and serve.stderr is not None
        line = await trio.to_thread.run_sync(serve.stdout.readline)
        assert "front-end mode" in line, line + (serve.stderr.read() if serve.poll() else "")
        url = line.split()[4].rstrip("/")
        with trio.fail_after(LIMIT):
            async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as client:
                response = await client.post("/api/chat", json=body("s1", "hi", "u\x001"))
    finally:
        serve.terminate()
        _, log = serve.communicate(timeout=LIMIT)
    assert response.status_code == 400
    error: Any = response.json().get("error")
    assert isinstance(error, str) and "NUL" in error and "\n" not in error
    assert "Traceback" not in log


class _Refusing:
    """A store and queue whose submit fails as ``error`` does."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def load(self, session_id: str) -> None:
        return None

    async def meta(self, session_id: str) -> None:
        return None

    async def submit(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error

    async def decide(self, *args: Any, **kwargs: Any) -> Any:
        raise self.error


async def test_a_conflict_on_submit_is_an_answer_of_one_line() -> None:
    refusing = _Refusing(TurnConflict("edited too late\nand more"))
    front = FrontEnd(store=refusing, queue=refusing, relay=None)
    with pytest.raises(ApiError) as raised:
        await front.submit("s1", "hi", "k", False)
    assert (raised.value.status, raised.value.message) == (409, "edited too late")


# A store's text names its database: a host, a port, sometimes a password.
_SECRET_ERROR = (
    "connection to postgresql://axon:hunter2@db-7.internal:5433/axon failed\n"
    "DETAIL: password=hunter2"
)


@pytest.mark.parametrize(
    ("error", "status", "told", "event"),
    [
        (StoreError(_SECRET_ERROR), 400, STORE_REFUSED, "frontend.submit_refused"),
        (StoreUnavailable(_SECRET_ERROR), 503, STORE_UNAVAILABLE, "frontend.submit_unavailable"),
    ],
)
async def test_a_store_error_on_submit_tells_a_fixed_sentence_and_logs_it_redacted(
    error: Exception, status: int, told: str, event: str
) -> None:
    refusing = _Refusing(error)
    front = FrontEnd(store=refusing, queue=refusing, relay=None)
    with structlog.testing.capture_logs() as logs, pytest.raises(ApiError) as raised:
        await front.submit("s1", "hi", "k", False)
    assert (raised.value.status, raised.value.message) == (status, told)
    assert [e["error"] for e in logs if e["event"] == event] == [
        "connection to postgresql://axon:[redacted]@db-7.internal:5433/axon failed\n"
        "DETAIL: password=[redacted]"
    ]


async def test_a_store_unavailable_on_decide_tells_a_fixed_sentence_and_logs_it_redacted() -> None:
    refusing = _Refusing(StoreUnavailable(_SECRET_ERROR))
    front = FrontEnd(store=refusing, queue=refusing, relay=None)
    with structlog.testing.capture_logs() as logs, pytest.raises(ApiError) as raised:
        await front.decide(None, "s1", "call-1", Decision(approved=True), {})
    assert (raised.value.status, raised.value.message) == (503, STORE_UNAVAILABLE)
    assert raised.value.headers == {"retry-after": "1"}
    logged = [e["error"] for e in logs if e["event"] == "frontend.decide_unavailable"]
    assert len(logged) == 1 and "hunter2" not in logged[0] and "db-7.internal" in logged[0]


class _RedisDown:
    """A relay whose Redis does not answer: its error names Redis's address."""

    async def resumable_turn(self, session_id: str, *, after_seq: int | None) -> Any:
        raise RelayUnavailable("Redis at redis-3.internal:6380 did not answer for 5 s")


async def test_a_relay_unavailable_tells_a_fixed_sentence_and_logs_the_address() -> None:
    with structlog.testing.capture_logs() as logs, pytest.raises(ApiError) as raised:
        await turn_to_resume(_RedisDown(), None, "s1", after_seq=None)
    assert (raised.value.status, raised.value.message) == (503, RELAY_UNAVAILABLE)
    assert raised.value.headers == {"retry-after": "1"}
    logged = [e["error"] for e in logs if e["event"] == "frontend.relay_unavailable"]
    assert logged == ["Redis at redis-3.internal:6380 did not answer for 5 s"]


async def test_a_store_from_before_the_key_columns_gains_them_on_open(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url)
    sql(
        store,
        "ALTER TABLE axon_turns DROP COLUMN message_key, DROP COLUMN input_hash, "
        "DROP COLUMN options",
    )
    await store.aclose()
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        first = await queue.submit("s1", "hi", idempotency_key="k")
        assert (await queue.submit("s1", "hi", idempotency_key="k")).turn_id == first.turn_id
        assert first.options.empty  # the options column is back, '{}' for the old rows too
        indexes = sql(
            store,
            "SELECT indexname FROM pg_indexes WHERE tablename = 'axon_turns' "
            "AND schemaname = current_schema()",
        )
        assert ("axon_turns_by_message_key",) in indexes
    finally:
        await queue.aclose()
        await store.aclose()
