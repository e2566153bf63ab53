"""A message waiting for its session's running turn (``serve --on-busy enqueue`` or
``steer``) when the host begins closing: the closing host's 503 with ``Retry-After``
in the request's protocol (an MCP error result to call again), as every request
refused there gets, nothing stored. Before, the waiting message's ``SessionBusy`` was
answered as a busy session's 409 ("already running a turn ... wait until busy false,
then send the message again"): a client that did so waited on a server going away."""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from runtime.messages import UserMessage
from tests.test_busy import Script, agent_with, held, holding
from tests.test_web_http import body
from tests.web.harness import WebServer, web_server

PROTOCOLS = ("ai-sdk", "openai", "mcp")


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


async def closing_with_one_waiting(server: WebServer, send: Any) -> Any:
    """Hold a turn of session ``s``, have ``send()`` wait behind it, then begin closing
    the host as its shutdown does (``shutting_down``, the running turns cancelled):
    what ``send()`` returned."""
    answers: list[Any] = []
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(partial(client.post, "/api/chat", json=body("s", "first")))
        await held["open"].wait()

        async def waiting() -> None:
            answers.append(await send(client))

        nursery.start_soon(waiting)
        await trio.testing.wait_all_tasks_blocked(0.05)  # (the server is in this loop)
        assert server.host.sessions["s"].waiting_inputs == 1
        server.host.shutting_down = True
        server.host.cancel_turns("host shutdown")
    server.host.shutting_down = False  # (the harness closes it for real)
    return answers[0]


def users(server: WebServer) -> list[Any]:
    return [m.text for m in server.host.sessions["s"].messages if isinstance(m, UserMessage)]


@pytest.mark.parametrize("on_busy", ["enqueue", "steer"])
async def test_a_chat_message_waiting_as_the_host_closes_is_a_503(on_busy):
    agent = agent_with(Script(holding(), ["never"]), on_busy)
    async with web_server(agent, on_busy=on_busy) as server:
        answer = await closing_with_one_waiting(
            server, lambda client: client.post("/api/chat", json=body("s", "waiting"))
        )
        stored = users(server)
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"]
    assert "shutting down" in answer.json()["error"]
    assert stored == ["first"]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_completion_waiting_as_the_host_closes_is_openai_s_503(stream):
    agent = agent_with(Script(holding(), ["never"]), "enqueue")
    payload = {
        "model": agent.name,
        "stream": stream,
        "messages": [{"role": "user", "content": "waiting"}],
    }
    async with web_server(agent, protocols=PROTOCOLS, on_busy="enqueue") as server:
        answer = await closing_with_one_waiting(
            server,
            lambda client: client.post(
                "/v1/chat/completions", json=payload, headers={"x-axon-session": "s"}
            ),
        )
        stored = users(server)
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"]
    assert stored == ["first"]


async def test_an_mcp_call_waiting_as_the_host_closes_is_an_error_result_to_call_again():
    from tests.test_mcp_server import mcp_client

    agent = agent_with(Script(holding(), ["never"]), "enqueue")
    async with web_server(agent, protocols=PROTOCOLS, on_busy="enqueue") as server:
        async with mcp_client(server) as client:

            async def call(_: Any) -> Any:
                return await client.call_tool(agent.name, {"prompt": "waiting", "session_id": "s"})

            result = await closing_with_one_waiting(server, call)
        stored = users(server)
    assert result.is_error
    assert "shutting down" in result.content[0].text
    assert stored == ["first"]
