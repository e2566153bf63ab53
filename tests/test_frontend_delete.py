"""``DELETE /api/sessions/{id}`` on a worker deployment's front end: the test run's own
PostgreSQL and Redis (``pg_url``, ``redis_url``), a worker, real HTTP over loopback."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from runtime.errors import SESSION_DELETED
from tests.support.redis import require_redis
from tests.test_frontend import (
    LIMIT,
    EventReader,
    body,
    data,
    deployment,
    slow_agent,
    wait_for_turn,
)
from tests.test_relay_web import sse_events

JSON = {"content-type": "application/json"}


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def listed(client: httpx.AsyncClient) -> list[str]:
    return [s["session_id"] for s in (await client.get("/api/sessions")).json()["sessions"]]


async def listed_at(client: httpx.AsyncClient, url: str) -> list[str]:
    return [s["session_id"] for s in (await client.get(f"{url}/api/sessions")).json()["sessions"]]


async def test_the_front_end_deletes_a_session_from_the_api_and_the_store(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(3, 0.005)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("gone"))
            await client.post("/api/chat", json=body("kept"))
            r = await client.delete("/api/sessions/gone", headers=JSON)
            unknown = await client.delete("/api/sessions/never-was", headers=JSON)
            one = await client.get("/api/sessions/gone")
            names = await listed(client)
        stored = await d.store.load("gone")
    assert (r.status_code, unknown.status_code) == (204, 204)
    assert one.status_code == 404
    assert names == ["kept"]
    assert stored is None


async def test_deleting_on_another_front_end_ends_the_running_turns_stream(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(400), fronts=2) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with client.stream("POST", f"{a}/api/chat", json=body("s1")) as response:
                reader = EventReader(response)
                await reader.until(3)
                turn = await wait_for_turn(d.queue, "s1", "running")
                deleted = await client.delete(f"{b}/api/sessions/s1", headers=JSON)
                rest = await reader.all()
            ended = await d.queue.wait_finished(turn.turn_id, LIMIT)
            names = await listed_at(client, b)
        stored = await d.store.load("s1")
    assert deleted.status_code == 204
    assert {"type": "abort", "reason": SESSION_DELETED} in data(rest)
    assert ended is not None and ended.status == "cancelled"
    assert names == [] and stored is None


async def test_a_queued_turn_of_a_deleted_session_never_runs_and_its_stream_ends(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(3), worker=False) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            posted: list[Any] = []
            async with trio.open_nursery() as nursery:

                async def post() -> None:
                    posted.append(await client.post("/api/chat", json=body("s1")))

                nursery.start_soon(post)
                queued = await wait_for_turn(d.queue, "s1", "queued")
                deleted = await client.delete("/api/sessions/s1", headers=JSON)
            await d.start_worker()
            other = await client.post("/api/chat", json=body("s2"))  # the worker works
            names = await listed(client)
        turn = await d.queue.get(queued.turn_id)
        stored = await d.store.load("s1")
    assert deleted.status_code == 204
    assert data(sse_events(posted[0].text)) == [{"type": "abort", "reason": SESSION_DELETED}]
    assert other.status_code == 200
    assert turn is not None and turn.status == "cancelled"
    assert names == ["s2"] and stored is None


async def test_a_cross_site_or_forged_host_delete_on_the_front_end_deletes_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(3, 0.005)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("s1"))
            port = d.urls[0].rsplit(":", 1)[1]
            refused = [
                await client.delete("/api/sessions/s1", headers={**JSON, **h})
                for h in (
                    {"origin": "http://evil.example"},
                    {"sec-fetch-site": "cross-site"},
                    {"host": f"attacker.example:{port}"},
                )
            ]
            bare = await client.delete("/api/sessions/s1")
            names = await listed(client)
    assert [r.status_code for r in refused] == [403, 403, 403]
    assert bare.status_code == 415
    assert names == ["s1"]
