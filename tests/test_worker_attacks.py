"""The worker deployment attacked: a key quoted in a provider's error, a stale owner's
late writes, forged queue input. Real PostgreSQL and Redis."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import orjson
import psycopg
import pytest
import trio

from actors.providers import OpenAIProvider
from actors.relays.redis_streams import RedisRelay
from actors.stores import postgres
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


async def test_a_client_frozen_inside_a_transaction_loses_its_locks_and_its_call_is_retried(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker stopped (SIGSTOP, a paused VM) in the middle of a save holds its turn's row
    # locked, which hides the turn from every takeover (FOR UPDATE SKIP LOCKED). The
    # server ends a session idle inside a transaction, so the lock goes; the frozen call,
    # when it wakes, is retried on another connection.
    monkeypatch.setattr(postgres, "IDLE_IN_TRANSACTION_TIMEOUT", 0.3)
    store = await PostgresStore.open(pg_url)
    woke = threading.Event()
    calls: list[int] = []

    def frozen_then_fine(conn: Any) -> str:
        calls.append(1)
        conn.execute("SELECT id FROM probe WHERE id = 1 FOR UPDATE")
        if len(calls) == 1:
            woke.wait(10)  # frozen, holding the row's lock
        conn.execute("UPDATE probe SET n = n + 1 WHERE id = 1")
        return "saved"

    def lock_taken_elsewhere() -> bool:
        with psycopg.connect(store.libpq, autocommit=True) as other:
            other.execute(f"SET search_path TO {store.schema}")
            for _ in range(100):  # up to 5 s
                with other.transaction():
                    row = other.execute(
                        "SELECT id FROM probe WHERE id = 1 FOR UPDATE SKIP LOCKED"
                    ).fetchone()
                if row is not None:
                    return True
                time.sleep(0.05)
        return False

    try:
        await store.run(
            "probe",
            lambda c: c.execute(
                "CREATE TABLE probe (id int PRIMARY KEY, n int); INSERT INTO probe VALUES (1, 0)"
            ),
        )
        taken: list[bool] = []
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                taken.append(await store.run("frozen save", frozen_then_fine) == "saved")

            nursery.start_soon(call)
            await trio.sleep(0.1)
            freed = await trio.to_thread.run_sync(lock_taken_elsewhere)
            woke.set()
        n = await store.run("read", lambda c: c.execute("SELECT n FROM probe").fetchone()[0])
    finally:
        woke.set()
        await store.aclose()
    assert freed  # another connection took the lock while the first client was frozen
    assert taken == [True] and len(calls) == 2  # the frozen try was retried, once
    assert n == 1  # and only the retry's write was kept
