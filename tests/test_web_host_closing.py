"""A request whose turn enters as its host closes (``serve`` SIGTERM'd with the request
on its way in): ``Session.stream`` raises :class:`~runtime.errors.HostClosed`, and each
endpoint answers it as its protocol's "unavailable, try again" (503 with
``Retry-After``), storing nothing of the request, instead of an unexpected error."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.test_web_http import body
from tests.web.harness import WebServer, web_server

PROTOCOLS = ("ai-sdk", "openai", "ag-ui", "a2a", "mcp")


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(turns=[["never said"]]))


async def closing_post(server: WebServer, path: str, payload: Any, **headers: str) -> Any:
    """POST ``payload`` to ``path`` once the host has begun closing (its signal watcher
    sets ``shutting_down`` first; the server still answers)."""
    server.host.shutting_down = True
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        return await client.post(path, json=payload, headers=headers)


async def nothing_stored(server: WebServer, session_id: str) -> bool:
    record = await server.host.store.load(session_id)
    return record is None or not record.messages


def completion(stream: bool) -> dict[str, Any]:
    return {"model": "axon", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}


async def test_a_chat_message_to_a_closing_host_is_a_503_to_send_again():
    async with web_server(agent()) as server:
        response = await closing_post(server, "/api/chat", body("s", "hi"))
        assert await nothing_stored(server, "s")
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"]
    assert "closing" in response.json()["error"]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_completion_on_a_session_of_a_closing_host_is_openai_s_503(stream):
    async with web_server(agent(), protocols=PROTOCOLS) as server:
        payload = {**completion(stream), "model": agent().name}
        response = await closing_post(
            server, "/v1/chat/completions", payload, **{"x-axon-session": "s"}
        )
        assert await nothing_stored(server, "s")
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"]
    assert response.json()["error"]["type"]


async def test_a_run_on_a_closing_host_is_ag_ui_s_503():
    run = {
        "threadId": "t",
        "runId": "r",
        "messages": [{"id": "u1", "role": "user", "content": "hi"}],
    }
    async with web_server(agent(), protocols=PROTOCOLS) as server:
        response = await closing_post(server, "/ag-ui", run)
        assert await nothing_stored(server, "t")
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"]
    assert response.json()["code"] == "unavailable"


async def test_a_task_sent_to_a_closing_host_is_an_a2a_error_and_no_task():
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    message["contextId"] = "c"
    send = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    async with web_server(agent(), protocols=PROTOCOLS) as server:
        response = await closing_post(server, "/a2a/jsonrpc", send)
        assert await nothing_stored(server, "c")
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"]
    assert "closing" in response.json()["error"]["message"]


async def test_an_mcp_call_to_a_closing_host_is_an_error_result_to_call_again():
    from tests.test_mcp_server import mcp_client

    async with web_server(agent(), protocols=PROTOCOLS) as server, mcp_client(server) as client:
        server.host.shutting_down = True
        result = await client.call_tool(agent().name, {"prompt": "hi", "session_id": "m"})
        assert await nothing_stored(server, "m")
    assert result.is_error
    assert "shutting down" in result.content[0].text
