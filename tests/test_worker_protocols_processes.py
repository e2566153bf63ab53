"""Each protocol a worker deployment's front end serves, with real processes: a
``serve --protocols ...`` front end and ``python -m runtime worker`` processes on the
test run's own PostgreSQL and Redis, driven by the protocol's official client (the
``openai`` SDK, the ``a2a-sdk`` client, AG-UI's ``ag_ui.core`` event models)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import trio

from tests.support.redis import require_redis, unique_prefix
from tests.support.worker_agent import answer_text
from tests.test_worker_approval_processes import FrontEnds
from tests.test_workers import Workers, sql

LIMIT = 60.0
PROTOCOLS = "ai-sdk,openai"


@pytest.fixture
def deployment(pg_url: str) -> Iterator[tuple[Workers, FrontEnds]]:
    redis_url = require_redis()
    prefix = unique_prefix()
    workers = Workers(pg_url, redis_url, prefix)
    fronts = FrontEnds(pg_url, redis_url, prefix)
    fronts.args += ["--protocols", PROTOCOLS]
    try:
        yield workers, fronts
    finally:
        workers.close()
        fronts.close()


async def test_the_openai_sdk_streams_and_completes_turns_that_worker_processes_run(
    pg_url: str, deployment: tuple[Workers, FrontEnds]
) -> None:
    workers, fronts = deployment
    url = await fronts.start()
    workers.start("w1")
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=LIMIT
    ) as client:
        with trio.fail_after(LIMIT):
            models = await client.models.list()
            stream = await client.chat.completions.create(
                model="worker-test",
                messages=[{"role": "user", "content": "tools via openai"}],
                stream=True,
                extra_headers={"X-Axon-Session": "p-oa"},
            )
            chunks = [chunk async for chunk in stream]
            whole = await client.chat.completions.create(
                model="worker-test",
                messages=[
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hey"},
                    {"role": "user", "content": "stateless"},
                ],
            )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(
        getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices
    )
    assert [m.id for m in models.data] == ["worker-test"]
    assert content == answer_text("tools via openai")
    assert reasoning == "I will record two effects."
    assert whole.choices[0].message.content == "echo: stateless"
    rows = sql(pg_url, "SELECT session_id, status, owner FROM axon_turns ORDER BY seq")
    assert [(r[1], r[2]) for r in rows] == [("done", "w1"), ("done", "w1")]
    assert rows[0][0] == "p-oa"
    sessions = sql(pg_url, "SELECT session_id FROM axon_sessions")
    assert sessions == [("p-oa",)]  # the stateless turn's scratch session is gone
