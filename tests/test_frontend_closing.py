"""A worker deployment's front end closing (``serve`` once its ``--drain`` ended:
``FrontEnd.close``). It holds nothing a client's work needs, so: new work (a message,
answers, a stream to read) is refused with each protocol's 503 and ``Retry-After``,
nothing queued, for another front end to take; a stream being read ends cleanly (whole
events, a comment, no ``[DONE]``: the turn did not end), to be read on another front
end with ``Last-Event-ID``; a stop, a delete, a read of a session are still answered
(one write or read in the store). Before, nothing changed at its close: a message
arriving then was queued and its stream cut by the server's last seconds. A real front
end (in this process) on the test run's own PostgreSQL and Redis; the process with its
signals: tests/test_frontend_closing_process.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from runtime.app.web.frontend import CLOSING_END
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, EventReader, body, deployment, wait_for_turn
from tests.test_worker_mcp import TOOL, mcp_client
from tests.test_worker_protocols import scripted_agent

ALL = ("ai-sdk", "openai", "ag-ui", "a2a", "mcp")


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def _a2a(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


def _a2a_send(context_id: str) -> dict[str, Any]:
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    return _a2a("SendMessage", {"message": {**message, "contextId": context_id}})


REFUSED: list[tuple[str, str, str, Any]] = [
    ("ai-sdk chat", "POST", "/api/chat", body("c-ai")),
    ("ai-sdk stream", "GET", "/api/chat/s-read/stream", None),
    (
        "openai",
        "POST",
        "/v1/chat/completions",
        {"model": "worker-test", "messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "openai stream",
        "POST",
        "/v1/chat/completions",
        {"model": "worker-test", "stream": True, "messages": [{"role": "user", "content": "x"}]},
    ),
    (
        "ag-ui",
        "POST",
        "/ag-ui",
        {
            "threadId": "c-agui",
            "runId": "r-1",
            "messages": [{"id": "m-1", "role": "user", "content": "hi"}],
        },
    ),
    ("a2a send", "POST", "/a2a/jsonrpc", _a2a_send("c-a2a")),
]


async def test_a_closing_front_end_ends_its_streams_refuses_new_work_and_still_stops(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, scripted_agent(), protocols=ALL, worker=False) as d:
        front = d.fronts[0]
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            with trio.fail_after(LIMIT):
                # A stream being read (its turn queued: no worker yet), then the close.
                async with client.stream("POST", "/api/chat", json=body("s-read")) as response:
                    await wait_for_turn(d.queue, "s-read", "queued")
                    front.close()
                    reader = EventReader(response)
                    await reader.all()
                    raw = reader.raw
                assert response.status_code == 200
                assert raw.endswith(CLOSING_END.decode()) and "[DONE]" not in raw
                refused = {}
                for name, method, path, sent in REFUSED:
                    answer = await client.request(method, path, json=sent)
                    refused[name] = (answer.status_code, answer.headers.get("retry-after"))
                subscribe = await client.post(
                    "/a2a/jsonrpc", json=_a2a("SubscribeToTask", {"id": "no-such-task"})
                )
                async with mcp_client(d.urls[0]) as mcp:
                    called = await mcp.call_tool(TOOL, {"prompt": "hi", "session_id": "c-mcp"})
                # Served still: a session's read, its stop.
                listed = await client.get("/api/sessions")
                stopped = await client.post("/api/chat/s-read/stop", json={})
                turns = await d.queue.turns("s-read")
            for session_id in ("c-ai", "c-agui", "c-a2a", "c-mcp"):
                assert await d.queue.turns(session_id) == []  # nothing queued
    assert refused == {name: (503, "5") for name, *_ in REFUSED}
    assert (subscribe.status_code, subscribe.headers.get("retry-after")) == (503, "5")
    assert called.is_error and "shutting down" in called.content[0].text  # type: ignore[union-attr]
    assert listed.status_code == 200
    assert stopped.status_code in (200, 202, 204)
    assert [t.status for t in turns] == ["cancelled"]  # the stop was done


async def test_open_streams_of_every_protocol_end_cleanly_and_their_turns_go_on(
    pg_url: str, redis_url: str
) -> None:
    """Each stream waits for its queued turn (no worker yet) when the front end closes:
    OpenAI's and AG-UI's end with their error event (OpenAI's ``[DONE]`` after it), A2A's
    after the task as it was (subscribe again elsewhere), MCP's call with an error
    result; none cut, and no turn cancelled (before: cut by the server's last seconds)."""
    openai_body = {
        "model": "worker-test",
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    agui_body = {
        "threadId": "g-1",
        "runId": "r-1",
        "messages": [{"id": "m-1", "role": "user", "content": "hi"}],
    }
    a2a_body = _a2a_send("a-1")
    a2a_body["method"] = "SendStreamingMessage"
    async with deployment(pg_url, redis_url, scripted_agent(), protocols=ALL, worker=False) as d:
        results: dict[str, Any] = {}
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:

            async def read(name: str, path: str, sent: Any, headers: Any = None) -> None:
                async with client.stream("POST", path, json=sent, headers=headers) as r:
                    results[name] = (r.status_code, (await r.aread()).decode())

            async def call() -> None:
                async with mcp_client(d.urls[0]) as mcp:
                    results["mcp"] = await mcp.call_tool(
                        TOOL, {"prompt": "hi", "session_id": "m-1"}
                    )

            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(
                        read,
                        "openai",
                        "/v1/chat/completions",
                        openai_body,
                        {"X-Axon-Session": "o-1"},
                    )
                    nursery.start_soon(read, "ag-ui", "/ag-ui", agui_body)
                    nursery.start_soon(read, "a2a", "/a2a/jsonrpc", a2a_body)
                    nursery.start_soon(call)
                    for session_id in ("o-1", "g-1", "a-1", "m-1"):
                        await wait_for_turn(d.queue, session_id, "queued")
                    d.fronts[0].close()
                statuses = [
                    [t.status for t in await d.queue.turns(s)] for s in ("o-1", "g-1", "a-1", "m-1")
                ]
    said = "this front end is stopping"
    status, text = results["openai"]
    assert status == 200 and said in text and text.endswith("data: [DONE]\n\n")
    status, text = results["ag-ui"]
    assert status == 200 and said in text and text.count("RUN_ERROR") == 1
    assert "RUN_FINISHED" not in text
    status, text = results["a2a"]
    assert status == 200 and text.startswith("data: ") and text.endswith("\n\n")
    assert results["mcp"].is_error and said in results["mcp"].content[0].text
    assert statuses == [["queued"]] * 4  # the turns go on: a worker runs them
