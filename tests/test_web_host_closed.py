"""A request reaching a host already *closed* (``serve`` stopping, past closing: the
host's ``check_open`` refuses everything) on a session not open yet: each endpoint
answers its protocol's "unavailable, try again" (503 with ``Retry-After``; MCP an error
result to call again), as for a host closing (tests/test_web_host_closing.py), not a
500 from opening the session."""

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


def close(server: WebServer) -> None:
    """The host as it is once closed (the server answers still)."""
    server.host.shutting_down = True
    server.host.closed = True


async def closed_request(
    server: WebServer, method: str, path: str, payload: Any = None, **headers: str
) -> Any:
    close(server)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            return await client.request(method, path, json=payload, headers=headers)
    finally:
        server.host.closed = False  # (the harness closes it for real)


async def nothing_stored(server: WebServer, session_id: str) -> bool:
    record = await server.host.store.load(session_id)
    return record is None or not record.messages


def unavailable(response: Any) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"]


async def test_a_chat_message_to_a_closed_host_is_a_503_to_send_again():
    async with web_server(agent()) as server:
        response = await closed_request(server, "POST", "/api/chat", body("s", "hi"))
        assert await nothing_stored(server, "s")
    unavailable(response)
    assert "shutting down" in response.json()["error"]


async def test_a_read_of_a_session_on_a_closed_host_is_a_503():
    async with web_server(agent()) as server:
        response = await closed_request(server, "GET", "/api/sessions/s")
    unavailable(response)
    assert "shutting down" in response.json()["error"]


# A stop or a resume on a closed host: 503 too (tests/test_web_host_closing_stops.py).


@pytest.mark.parametrize("stream", [True, False])
async def test_a_completion_on_a_session_of_a_closed_host_is_openai_s_503(stream):
    payload = {
        "model": agent().name,
        "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with web_server(agent(), protocols=PROTOCOLS) as server:
        response = await closed_request(
            server, "POST", "/v1/chat/completions", payload, **{"x-axon-session": "s"}
        )
        assert await nothing_stored(server, "s")
    unavailable(response)
    assert response.json()["error"]["type"]


async def test_a_run_on_a_closed_host_is_ag_ui_s_503():
    run = {
        "threadId": "t",
        "runId": "r",
        "messages": [{"id": "u1", "role": "user", "content": "hi"}],
    }
    async with web_server(agent(), protocols=PROTOCOLS) as server:
        response = await closed_request(server, "POST", "/ag-ui", run)
        assert await nothing_stored(server, "t")
    unavailable(response)
    assert response.json()["code"] == "unavailable"


async def test_a_task_sent_to_a_closed_host_is_an_a2a_503_and_no_task():
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    message["contextId"] = "c"
    send = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    async with web_server(agent(), protocols=PROTOCOLS) as server:
        response = await closed_request(server, "POST", "/a2a/jsonrpc", send)
        assert await nothing_stored(server, "c")
    unavailable(response)
    assert "shutting down" in response.json()["error"]["message"]


async def test_an_mcp_call_to_a_closed_host_is_an_error_result_to_call_again():
    from tests.test_mcp_server import mcp_client

    async with web_server(agent(), protocols=PROTOCOLS) as server, mcp_client(server) as client:
        close(server)
        try:
            result = await client.call_tool(agent().name, {"prompt": "hi", "session_id": "m"})
        finally:
            server.host.closed = False
        assert await nothing_stored(server, "m")
    assert result.is_error
    assert "shutting down" in result.content[0].text
