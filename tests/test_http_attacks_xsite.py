"""The last session's HTTP behaviours attacked as a cross-site page, a careless client and
an attacker would (branch ``xsite``): a relay resume (``Last-Event-ID``) of a deleted
session's turn. What held is in benchmarks/journal/workers.md (xsite)."""

from __future__ import annotations

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider
from actors.relays import RedisRelay
from runtime import Agent
from tests.support.redis import require_redis, unique_prefix
from tests.test_frontend import LIMIT, body, deployment, streamed_text
from tests.test_relay_web import chat_body, sse_events, two_front_ends
from tests.web.harness import wait_idle

JSON = {"content-type": "application/json"}
FROM_THE_START = {"last-event-id": "0"}
"""A resume that saw nothing of the turn: since relayattack, given a turn that ended too."""


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def agent() -> Agent:
    return Agent(name="a", provider=ScriptedProvider(["the deleted answer"]))


async def test_a_deleted_sessions_turn_is_not_replayed_by_a_resume(redis_url: str) -> None:
    # relayattack gave a resume with Last-Event-ID the turn that ended (its stream kept 15
    # min): the session deleted, its answer was still replayed whole, to any front end.
    async with two_front_ends(redis_url, agent()) as (a, b):
        async with httpx.AsyncClient(timeout=20) as client:
            await client.post(f"{a.url}/api/chat", json=chat_body("s1"))
            await wait_idle(a, "s1")
            deleted = await client.delete(f"{a.url}/api/sessions/s1", headers=JSON)
            resumes = [
                await client.get(f"{url}/api/chat/s1/stream", headers=FROM_THE_START)
                for url in (a.url, b.url)
            ]
    assert deleted.status_code == 204
    assert [r.status_code for r in resumes] == [204, 204]


async def test_a_deleted_sessions_turn_is_not_replayed_by_a_front_ends_resume(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, agent(), fronts=2) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            posted = await client.post(f"{a}/api/chat", json=body("s1"))
            deleted = await client.delete(f"{a}/api/sessions/s1", headers=JSON)
            resumes = [
                await client.get(f"{url}/api/chat/s1/stream", headers=FROM_THE_START)
                for url in (a, b)
            ]
    assert streamed_text(sse_events(posted.text)) == "the deleted answer"
    assert deleted.status_code == 204
    assert [r.status_code for r in resumes] == [204, 204]


async def test_forgetting_a_deleted_sessions_turn_keeps_a_newer_turns_key(
    redis_url: str,
) -> None:
    # A new conversation of the same id may start its turn between the delete's read of
    # the key and its forget: that turn's key stays (its resumes are not 204s).
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        key = relay.active_key("s1")
        await relay.client.set(key, "turn_new")
        await relay.forget_session("s1", "turn_old")
        kept = await relay.session_turn("s1")
        await relay.forget_session("s1", "turn_new")
        gone = await relay.client.get(key)
    assert (kept, gone) == ("turn_new", None)
