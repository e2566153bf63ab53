"""The last session's HTTP behaviours attacked as a cross-site page, a careless client and
an attacker would (branch ``xsite``): a relay resume (``Last-Event-ID``) of a deleted
session's turn. What held is in benchmarks/journal/workers.md (xsite)."""

from __future__ import annotations

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent
from runtime.tools import sub_session_id
from tests.support.redis import require_redis
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
    async with two_front_ends(redis_url, agent(), shared_store=True) as (a, b):
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


async def test_a_deleted_callers_sub_session_turn_is_not_replayed_by_a_resume(
    redis_url: str,
) -> None:
    # The caller's delete takes its agent tools' sub-sessions with it; their turns were
    # published too, under ids a client saw (the caller, the tool, the call id).
    helper = Agent(name="helper", provider=ScriptedProvider([["the deleted sub answer"]]))
    caller = Agent(
        name="caller",
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "x"}, tool_call_id="H")], ["ok"]]
        ),
        tools=[helper.as_tool()],
    )
    sub = sub_session_id("s1", "helper", "H")
    async with two_front_ends(redis_url, caller, shared_store=True) as (a, b):
        async with httpx.AsyncClient(timeout=20) as client:
            await client.post(f"{a.url}/api/chat", json=chat_body("s1"))
            await wait_idle(a, "s1")
            before = await client.get(f"{b.url}/api/chat/{sub}/stream", headers=FROM_THE_START)
            await client.delete(f"{a.url}/api/sessions/s1", headers=JSON)
            after = await client.get(f"{b.url}/api/chat/{sub}/stream", headers=FROM_THE_START)
    assert streamed_text(sse_events(before.text)) == "the deleted sub answer"
    assert after.status_code == 204
