"""A new AG-UI thread started from another thread's ``MESSAGES_SNAPSHOT`` on a worker
deployment's front end (real PostgreSQL and Redis, in process): the history the front
end queues with the turn holds the agent tool's call and result, not the sub-agent's
calls passed up (``H.L0``, ``H.L1``) the snapshot lists, as in the embedded app
(tests/test_agui_new_thread_history.py)."""

from __future__ import annotations

import pytest

from actors.providers import anthropic, openai
from tests.support.redis import require_redis
from tests.test_agui import run_input, user
from tests.test_agui_nested import answer, snapshot_of
from tests.test_agui_new_thread_history import locating, requests
from tests.test_frontend import deployment
from tests.test_worker_protocols import agui_run


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_thread_forked_from_a_snapshot_replays_the_agent_tools_call_alone_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    history = [user("go", "m1"), answer("H.L0", "Paris")]
    async with deployment(pg_url, redis_url, locating(), protocols=("ag-ui",)) as d:
        url = d.urls[0]
        await agui_run(url, run_input("s", user("go", "m1")))
        await agui_run(url, run_input("s", *history, runId="r2"))
        await agui_run(url, run_input("s", *history, answer("H.L1", "Rome"), runId="r3"))
        held = snapshot_of(await agui_run(url, run_input("s", runId="reconnect")))["messages"]
        requests.clear()
        await agui_run(url, run_input("t", *held, user("never mind", "m2"), runId="r4"))
    sent = requests[0]
    body = openai.map_messages(None, sent)
    calls = [c for m in body if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [("H", "helper")]
    _, messages = anthropic.map_messages(None, sent)
    blocks = [b for m in messages if isinstance(m["content"], list) for b in m["content"]]
    assert [b["name"] for b in blocks if b["type"] == "tool_use"] == ["helper"]
    assert [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"] == ["H"]
