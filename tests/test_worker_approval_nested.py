"""An agent used as a tool whose own tool needs approval, run by a worker (real
PostgreSQL and Redis, in process): the sub-turn suspends, the calling model is told it
did not finish, and nothing waits anywhere afterwards: the calling turn's row is done,
the sub-session's turn is ended in the store (its calls denied and answered)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, tool
from runtime.approval import pending_calls, waiting_calls
from runtime.messages import ToolMessage
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import chat, payloads

ran: list[str] = []


@tool(needs_approval=True)
async def wire_money(to: str) -> str:
    """Wire money."""
    ran.append(to)
    return "wired"


def calling() -> Agent:
    helper = Agent(
        name="helper",
        provider=ScriptedProvider([[*tool_call("wire_money", {"to": "x"}, tool_call_id="W")]]),
        tools=[wire_money],
    )
    return Agent(
        name="calls",
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "pay"}, tool_call_id="H")], ["ok"]]
        ),
        tools=[helper.as_tool()],
    )


async def finished(d: Any) -> Any:
    """The session's turns once its last one is done."""
    with trio.fail_after(LIMIT):
        while True:
            turns = await d.queue.turns("s1")
            if turns and turns[-1].status == "done":
                return turns
            await trio.sleep(0.02)


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_a_workers_sub_turn_that_asks_ends_and_its_caller_finishes(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "go"))
        turns = await finished(d)
        sub = await d.store.load("s1.helper.H")
        parent = await d.store.load("s1")
    events = payloads(sse_events(response.text))
    assert events[-1]["messageMetadata"]["finishReason"] == "stop"
    assert turns[-1].finish_reason == "stop"
    assert sub is not None and waiting_calls(sub.messages) == ()
    assert pending_calls(sub.messages) == ()
    assert [m.tool_call_id for m in sub.messages if isinstance(m, ToolMessage)] == ["W"]
    assert parent is not None and "did not finish" in parent.messages[2].error
    assert ran == []
