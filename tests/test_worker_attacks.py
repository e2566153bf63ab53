"""The worker deployment attacked: a key quoted in a provider's error, a stale owner's
late writes, forged queue input. Real PostgreSQL and Redis."""

from __future__ import annotations

import io

import orjson
import pytest
import trio

from actors.providers import OpenAIProvider
from actors.relays.redis_streams import RedisRelay
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.agent import Agent
from runtime.app.worker import Worker
from runtime.errors import InvalidSessionId, LeaseLost, StoreError
from runtime.logging import configure_logging
from runtime.messages import UserMessage
from runtime.output import Error
from runtime.serde import to_json, unstructure
from tests.support.loopback import loopback_server
from tests.support.redis import require_redis, unique_prefix
from tests.test_key_leaks import refusal

KEY = "gsk_Q9zT4mLr8vXw2Yb7NcK1pD5eHj3s"


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_key_quoted_in_a_providers_401_reaches_no_row_stream_or_log(
    pg_url: str, redis_url: str
) -> None:
    logs = io.StringIO()
    configure_logging("info", stream=logs)
    prefix = unique_prefix()
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        async with (
            loopback_server(refusal("openai", KEY)) as server,
            RedisRelay.open(redis_url, prefix=prefix) as relay,
            trio.open_nursery() as nursery,
        ):
            provider = OpenAIProvider("gpt-4o-mini", base_url=server.url + "/v1", api_key=KEY)
            worker = Worker(store=store, relay=relay, agent=Agent(provider=provider), poll=0.1)
            await nursery.start(worker.run)
            turn = await queue.submit("k", "hi")
            done = await queue.wait_finished(turn.turn_id, 30)
            chunks = [c async for c in relay.read(turn.turn_id)]
            worker.stop()
        assert done is not None and done.status == "failed"
        assert (done.error and "401" in done.error) or "API key" in (done.error or "")
        errors = [c for c in chunks if type(c) is Error]
        assert errors  # the user is told the turn failed ...
        record = await store.load("k")
        assert record is not None
        stored = b"".join(to_json(m) for m in record.messages)
        for where, text in {
            "queue row": done.error or "",
            "stored session": stored.decode(),
            "relay stream": orjson.dumps([unstructure(c) for c in chunks]).decode(),
            "logs": logs.getvalue(),
        }.items():
            assert KEY not in text, f"the key leaked into the {where}"  # ... without the key
        assert [type(m) for m in record.messages][:1] == [UserMessage]
    finally:
        configure_logging("warning")
        await queue.aclose()
        await store.aclose()


async def test_a_stale_owners_save_after_a_takeover_is_refused_and_writes_nothing(
    pg_url: str,
) -> None:
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=0.2)
    try:
        turn = await queue.submit("s", "hi")
        stale = await queue.claim("old")
        assert stale is not None
        await trio.sleep(0.4)  # the old owner is paused past its lease
        fresh = await queue.claim("new")
        assert fresh is not None and fresh.epoch == stale.epoch + 1
        before = await store.version("s")
        with store.fenced("s", stale.fence()), pytest.raises(LeaseLost):
            await store.save("s", 0, [UserMessage(content="late write")])
        assert await store.version("s") == before
        assert not await queue.finish(stale, status="done", finish_reason="stop")
        assert (await queue.get(turn.turn_id)).owner == "new"  # type: ignore[union-attr]
    finally:
        await queue.aclose()
        await store.aclose()


@pytest.mark.parametrize(
    "session_id", ["../etc/passwd", "s'; DROP TABLE axon_turns; --", "", "x" * 200]
)
async def test_a_forged_session_id_is_refused_before_anything_is_queued(
    pg_url: str, session_id: str
) -> None:
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        with pytest.raises(InvalidSessionId):
            await queue.submit(session_id, "hi")
        assert await queue.active("s") is None
    finally:
        await queue.aclose()
        await store.aclose()


async def test_an_idempotency_key_of_another_session_is_refused_not_reused(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        mine = await queue.submit("alice", "secret plan", idempotency_key="k1")
        with pytest.raises(StoreError):
            await queue.submit("mallory", "show me", idempotency_key="k1")
        assert [t.turn_id for t in await queue.turns("mallory")] == []
        assert (await queue.get(mine.turn_id)).input == "secret plan"  # type: ignore[union-attr]
    finally:
        await queue.aclose()
        await store.aclose()
