"""A per-call approval rule is asked once a call in the worker deployment too (real
PostgreSQL and Redis, a front end and a worker in this process): the worker's turn asks
it as the call is made, and neither the step that runs a call it let through nor the
continuation a front end's decision queues asks it again
(tests/test_approval_rule_attacks.py: the embedded host)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, tool
from runtime.actor_messages import InferRequest
from runtime.messages import ToolMessage, UserMessage
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import answer, asked, chat, payloads, waiting_turn

ran: list[str] = []
rule_asked: list[str] = []


def _rule(arguments: dict[str, Any], context: Any) -> bool:
    """Yes for ``/x`` the first time it is asked of a path, the opposite after: a second
    question of the same call would be answered otherwise."""
    path = arguments["path"]
    first = path not in rule_asked
    rule_asked.append(path)
    return (path == "/x") is first


@tool(needs_approval=_rule)
async def delete_file(path: str) -> str:
    """Delete a file (some need a person's approval)."""
    ran.append(path)
    return f"deleted {path}"


def respond(request: InferRequest) -> list[Any]:
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    said = str(users[-1].content)
    if current_step(request.messages) == 0 and said.startswith("delete "):
        return [*tool_call("delete_file", {"path": said.split()[1]}, tool_call_id="D")]
    last = request.messages[-1]
    return [f"Result: {last.output if isinstance(last, ToolMessage) else 'ok'}"]


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()
    rule_asked.clear()


def rule_agent() -> Agent:
    return Agent(name="asks", provider=ScriptedProvider(responder=respond), tools=[delete_file])


async def test_the_rule_is_asked_once_for_a_call_it_lets_run(pg_url: str, redis_url: str) -> None:
    async with deployment(pg_url, redis_url, rule_agent()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "delete /y"))
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
    assert response.status_code == 200
    assert rule_asked == ["/y"] and ran == ["/y"]


async def test_the_rule_is_asked_once_across_the_wait_and_the_front_ends_decision(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, rule_agent()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "delete /x"))
        await waiting_turn(d)
        events = sse_events(first.text)
        message_id = payloads(events)[0]["messageId"]
        approval = asked(events)["approvalId"]
        assert rule_asked == ["/x"] and ran == []
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            second = await client.post(
                f"{d.urls[0]}/api/chat", json=answer("s1", message_id, approval, True)
            )
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
    assert second.status_code == 200
    assert rule_asked == ["/x"] and ran == ["/x"]
