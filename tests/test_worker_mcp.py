"""The MCP server (``serve --protocols mcp``) in a worker deployment's front end: a tool
call is a turn queued in PostgreSQL, run by a worker, its progress and answer read back
from the Redis relay. A real front end and a real worker (in this process) on the test
run's own PostgreSQL and Redis, driven by the official ``mcp`` client; bad input is
answered in MCP's shapes with nothing queued."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from runtime.app.web.mcp_endpoint import CANCELLED
from tests.support import worker_agent
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, Deployment, deployment, wait_for_turn
from tests.test_mcp_server import ACCEPT, INIT, Progress
from tests.test_worker_protocols import scripted_agent
from tests.test_workers import wait_for

MCP = ("ai-sdk", "mcp")
TOOL = "worker-test"


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@asynccontextmanager
async def mcp_deployment(
    pg_url: str, redis_url: str, delay: float = 0.0, **options: Any
) -> AsyncIterator[Deployment]:
    async with deployment(pg_url, redis_url, scripted_agent(delay), protocols=MCP, **options) as d:
        yield d


@asynccontextmanager
async def mcp_client(url: str, *, mode: str = "auto") -> AsyncIterator[Client]:
    async with create_mcp_http_client() as http:
        async with Client(streamable_http_client(url + "/mcp", http_client=http), mode=mode) as c:
            yield c


async def nothing_queued(d: Deployment) -> bool:
    return not await d.queue.busy_sessions() and await d.store.list_sessions() == []


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # the 2026 envelope, the handshake
async def test_a_call_is_a_queued_turn_answered_from_the_relay_with_progress(
    pg_url: str, redis_url: str, mode: str
) -> None:
    progress = Progress()
    async with mcp_deployment(pg_url, redis_url) as d, mcp_client(d.urls[0], mode=mode) as c:
        with trio.fail_after(LIMIT):
            result = await c.call_tool(TOOL, {"prompt": "tools please"}, progress_callback=progress)
        session_id = result.structured_content["session_id"]
        turns = await d.queue.turns(session_id)
        record = await d.store.load(session_id)
    answer = worker_agent.answer_text("tools please")
    assert not result.is_error
    assert result.structured_content == {
        "answer": answer,
        "session_id": session_id,
        "finish_reason": "stop",
    }
    assert [block.text for block in result.content] == [answer]
    texts = [m for _, m in progress.seen if m is not None and not m.startswith("[tool")]
    assert "".join(texts) == answer
    assert [m for _, m in progress.seen if m and m.startswith("[tool")] == ["[tool record]"] * 2
    assert [p for p, _ in progress.seen] == list(range(1, len(progress.seen) + 1))
    assert [t.status for t in turns] == ["done"]
    assert record is not None and record.meta["title"] == "tools please"


async def test_a_session_id_continues_the_conversation_on_the_worker(
    pg_url: str, redis_url: str
) -> None:
    async with mcp_deployment(pg_url, redis_url) as d, mcp_client(d.urls[0]) as c:
        with trio.fail_after(LIMIT):
            await c.call_tool(TOOL, {"prompt": "one", "session_id": "m1"})
            second = await c.call_tool(TOOL, {"prompt": "two", "session_id": "m1"})
        record = await d.store.load("m1")
    assert second.structured_content == {
        "answer": "echo: two",
        "session_id": "m1",
        "finish_reason": "stop",
    }
    assert record is not None
    assert [m.role for m in record.messages] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_cancelled_call_cancels_its_queued_turn(
    pg_url: str, redis_url: str, mode: str
) -> None:
    # slow enough (seconds) that the turn cannot end on its own before the cancellation
    # reaches its worker, even on a loaded machine; a cancelled turn ends at once
    async with mcp_deployment(pg_url, redis_url, delay=0.3) as d:
        async with mcp_client(d.urls[0], mode=mode) as c:
            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:

                    async def call() -> None:
                        await c.call_tool(TOOL, {"prompt": "tools long", "session_id": "mc"})

                    nursery.start_soon(call)
                    await wait_for_turn(d.queue, "mc", "running")
                    nursery.cancel_scope.cancel()  # the client gives up on the call

        async def ended() -> bool:
            turns = await d.queue.turns("mc")
            return bool(turns) and turns[-1].finished

        await wait_for(ended, LIMIT, "the call's turn to end")
        (turn,) = await d.queue.turns("mc")
    assert (turn.status, turn.cancel_reason) == ("cancelled", CANCELLED)


async def test_a_queued_turn_waiting_for_approval_is_a_tool_error_naming_the_call(
    pg_url: str, redis_url: str
) -> None:
    async with mcp_deployment(pg_url, redis_url) as d, mcp_client(d.urls[0]) as c:
        with trio.fail_after(LIMIT):
            result = await c.call_tool(TOOL, {"prompt": "approve it", "session_id": "ma"})
        turns = await d.queue.turns("ma")
    assert result.is_error and result.structured_content is None
    assert result.content[0].text.startswith("the turn waits for a decision on guarded (")
    assert "(session ma)" in result.content[0].text
    assert [t.status for t in turns] == ["awaiting-input"]


async def test_a_call_on_a_session_with_a_queued_turn_is_a_busy_tool_error_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with mcp_deployment(pg_url, redis_url, delay=0.05) as d, mcp_client(d.urls[0]) as c:
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(c.call_tool, TOOL, {"prompt": "tools slow", "session_id": "mb"})
                await wait_for_turn(d.queue, "mb", "running")
                busy = await c.call_tool(TOOL, {"prompt": "again", "session_id": "mb"})
        turns = await d.queue.turns("mb")
    assert busy.is_error and busy.content[0].text == "session 'mb' is already running a turn"
    assert [t.status for t in turns] == ["done"]  # the refused call queued nothing


async def test_an_unknown_tool_is_the_jsonrpc_invalid_params_error_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with mcp_deployment(pg_url, redis_url) as d, mcp_client(d.urls[0]) as c:
        with pytest.raises(MCPError) as caught:
            await c.call_tool("rm_rf", {"prompt": "x"})
        assert await nothing_queued(d)
    assert (caught.value.error.code, caught.value.error.message) == (-32602, "Unknown tool: rm_rf")


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ({}, "prompt must be a non-empty string"),
        ({"prompt": "x", "session_id": "../../etc"}, "session_id: "),
        ({"prompt": "x", "sudo": True}, "unknown argument(s): sudo"),
    ],
    ids=["no-prompt", "forged-session", "extra"],
)
async def test_bad_arguments_are_a_tool_error_and_queue_nothing(
    pg_url: str, redis_url: str, arguments: dict[str, Any], why: str
) -> None:
    async with mcp_deployment(pg_url, redis_url) as d, mcp_client(d.urls[0]) as c:
        result = await c.call_tool(TOOL, arguments)
        assert await nothing_queued(d)
    assert result.is_error and result.structured_content is None
    assert result.content[0].text.startswith(f"invalid arguments for worker-test: {why}")


async def test_a_forged_mcp_session_id_is_404_as_a_jsonrpc_error_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with mcp_deployment(pg_url, redis_url) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], headers=ACCEPT) as raw:
            await raw.post("/mcp", json=INIT)  # a real session exists: its id is not given
            call = {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"prompt": "hi"}},
            }
            headers = {"mcp-session-id": "0" * 32, "mcp-protocol-version": "2025-11-25"}
            forged = await raw.post("/mcp", json=call, headers=headers)
        assert await nothing_queued(d)
    assert forged.status_code == 404
    assert forged.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "Session not found"},
    }


async def test_a_call_over_a_full_queue_is_a_tool_error_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    caps = {"max_queued": 1}
    async with (
        mcp_deployment(pg_url, redis_url, worker=False, queue_caps=caps) as d,
        mcp_client(d.urls[0]) as c,
    ):
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(c.call_tool, TOOL, {"prompt": "first", "session_id": "f1"})
                await wait_for(d.queue.busy_sessions, LIMIT, "the first turn to be queued")
                full = await c.call_tool(TOOL, {"prompt": "second", "session_id": "f2"})
                nursery.cancel_scope.cancel()  # the first call is cancelled: so is its turn
        refused = await d.queue.turns("f2")
    assert full.is_error and full.content[0].text.startswith(
        "the turn could not be queued: the turn queue already holds"
    )
    assert refused == []
