"""A sub-session (an agent used as a tool, ``as_tool(pass_approvals=True)``) whose turn
waits for its calling session's decision, written to through the worker deployment's
other protocols (real PostgreSQL and Redis, in process): the OpenAI-compatible endpoint
(``X-Axon-Session`` naming it) and A2A (its context id) refuse the message before it is
queued, in their own error shapes, and the caller's approval then runs the sub-agent's
call. Queued, the turn's claim of the sub-session would fence the caller's next save of
it out (``LeaseLost``) and the caller's decision would be lost. (Both were refused
already by the front end's submit, which reads the session's meta for them too; an
unnamed OpenAI completion runs in a new session, never a sub-session.) Deleting the
calling session ends the sub-session's wait."""

from __future__ import annotations

import httpx
import pytest

from tests.support.redis import require_redis
from tests.test_approval_nested_pass import (
    _clear,  # noqa: F401 (fixture)
    ran,
)
from tests.test_frontend import LIMIT, deployment
from tests.test_mcp_server import eventually
from tests.test_relay_web import sse_events
from tests.test_worker_approval import chat, payloads
from tests.test_worker_approval_nested_pass import SUB, _answer, _on_h, _suspend, calling
from tests.test_worker_protocols import ALL


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def _approve(d, client, message_id: str, approval_id: str) -> list:
    paid = await client.post(
        f"{d.urls[0]}/api/chat", json=_answer("s1", message_id, _on_h(approval_id, True))
    )
    last = payloads(sse_events(paid.text))
    return [
        (c["toolCallId"], c["output"])
        for c in last
        if c["type"] == "tool-output-available" and not c.get("preliminary")
    ]


async def test_an_openai_completion_naming_the_sub_session_is_a_409_and_the_wait_holds(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, calling(), protocols=ALL) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _suspend(d, client)
            response = await client.post(
                f"{d.urls[0]}/v1/chat/completions",
                json={"model": "calls", "messages": [{"role": "user", "content": "hello"}]},
                headers={"X-Axon-Session": SUB},
            )
            outputs = await _approve(d, client, message_id, approval_id)
        turns = await d.queue.turns(SUB)
    assert response.status_code == 409 and "'s1'" in response.text, response.text
    assert turns == []
    assert outputs == [("H", "paid")] and ran == ["x"]


async def test_an_a2a_message_in_the_sub_sessions_context_is_refused_and_the_wait_holds(
    pg_url: str, redis_url: str
) -> None:
    message = {
        "messageId": "m-1",
        "role": "ROLE_USER",
        "parts": [{"text": "hello"}],
        "contextId": SUB,
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    async with deployment(pg_url, redis_url, calling(), protocols=ALL) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            message_id, approval_id = await _suspend(d, client)
            response = await client.post(f"{d.urls[0]}/a2a/jsonrpc", json=body)
            outputs = await _approve(d, client, message_id, approval_id)
        turns = await d.queue.turns(SUB)
    refused = response.json()
    assert "error" in refused and "'s1'" in refused["error"]["message"], refused
    assert turns == []
    assert outputs == [("H", "paid")] and ran == ["x"]


async def test_deleting_the_calling_session_deletes_the_waiting_sub_session_in_a_worker_deployment(
    pg_url: str, redis_url: str
) -> None:
    """Before: the sub-session waited for good; a message to it was a 409 naming the
    deleted caller, and a decision there ``CallerDecides``; then its wait was ended and
    it stayed, an orphan. Now the caller's delete takes it; a message under its id
    starts a new conversation."""
    async with deployment(pg_url, redis_url, calling(), protocols=ALL) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            await _suspend(d, client)
            deleted = await client.delete(
                f"{d.urls[0]}/api/sessions/s1", headers={"content-type": "application/json"}
            )
            sub = await d.store.load(SUB)
            again = await client.post(f"{d.urls[0]}/api/chat", json=chat(SUB, "hello"))
    assert deleted.status_code == 204
    assert sub is None
    assert again.status_code == 200, again.text
    finished = payloads(sse_events(again.text))[-1]
    assert finished["type"] == "finish", again.text  # the worker ran its turn
    assert ran == []


async def test_an_unnamed_completions_scratch_session_goes_with_its_waiting_sub_session(
    pg_url: str, redis_url: str
) -> None:
    """The worker deletes a stateless completion's scratch session once its turn is over,
    here waiting for its agent tool's approval, and with it that sub-session. Before: the
    sub-session it left waited for good (then, its wait ended, stayed for good)."""
    request = {"model": "calls", "messages": [{"role": "user", "content": "go"}]}
    async with deployment(pg_url, redis_url, calling(), protocols=ALL) as d:

        async def stored() -> set[str]:
            return {i.session_id for i in await d.store.list_sessions()}

        before = await stored()
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            done = await client.post(f"{d.urls[0]}/v1/chat/completions", json=request)

        async def forgotten() -> bool:  # the worker deletes them after the answer
            return await stored() == before

        await eventually(forgotten)
    assert done.status_code == 200, done.text
    assert ran == []
