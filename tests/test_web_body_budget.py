"""The process-wide budget of request-body bytes read at once (``max_body_in_flight``,
``serve --max-body-bytes-in-flight``): each body was bounded by ``--max-body`` and
``--body-timeout`` but their sum by nothing, and 10 clients each sending 40 MB of a
48 MiB body and stalling took ``serve`` from 56 to 368 MB resident (journal
pipeline.md, ``### connlimits``). Real sockets to the in-process server; a budget of a
few kilobytes keeps them small. Counts (bytes held, answers), no timings."""

from __future__ import annotations

import json

import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.web.chat_input import BodyBudget
from tests.test_http_attacks_2 import head_of
from tests.test_web_slow_clients import chat_request, connect, read_to_end
from tests.web.harness import WebServer, web_server

BUDGET = 10_000


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))


def budget_of(server: WebServer) -> BodyBudget:
    budget = server.app.state.axon.body_budget
    assert isinstance(budget, BodyBudget)
    return budget


async def held_becomes(budget: BodyBudget, size: int) -> None:
    """Wait (at most 10 s) until ``budget`` holds ``size`` bytes."""
    with trio.fail_after(10):
        while True:
            if budget.held == size:
                return
            await trio.sleep(0.01)


async def stall_mid_body(server: WebServer, sent: int, announced: int) -> trio.socket.SocketType:
    """A client that announced ``announced`` bytes of body, sent ``sent`` and stalls."""
    sock = await connect(server)
    await sock.send(chat_request(server, b"x" * sent, content_length=announced))
    return sock


def chunked(server: WebServer, path: str, *sizes: int) -> bytes:
    host = server.url.removeprefix("http://")
    head = (
        f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        "transfer-encoding: chunked\r\n\r\n"
    ).encode()
    chunks = b"".join(f"{size:x}\r\n".encode() + b"x" * size + b"\r\n" for size in sizes)
    return head + chunks + b"0\r\n\r\n"


def sized(server: WebServer, path: str, payload: bytes) -> bytes:
    return chat_request(server, payload).replace(b"/api/chat", path.encode(), 1)


async def exchange(server: WebServer, request: bytes) -> bytes:
    with trio.fail_after(20):
        sock = await connect(server)
        with sock:
            await sock.send(request)
            return await read_to_end(sock)


def assert_budget_refusal(response: bytes) -> None:
    """One answer, 503 with Retry-After, and the connection closed."""
    head = head_of(response).lower()
    assert response.count(b"HTTP/1.1 ") == 1, response
    assert head.startswith(b"http/1.1 503"), response
    assert b"\r\nretry-after: 5" in head, response
    assert b"\r\nconnection: close" in head, response


async def test_a_body_announced_past_what_is_free_gets_503_with_retry_after_and_a_close():
    async with web_server(agent(), max_body_in_flight=BUDGET) as server:
        budget = budget_of(server)
        with await stall_mid_body(server, 6_000, 8_000):
            await held_becomes(budget, 6_000)
            response = await exchange(server, chat_request(server, b"y" * 5_000))
            assert budget.held == 6_000
    assert_budget_refusal(response)
    assert b"max-body-bytes-in-flight" in response


async def test_a_chunked_body_that_grows_past_what_is_free_gets_503_and_takes_nothing():
    async with web_server(agent(), max_body_in_flight=BUDGET) as server:
        budget = budget_of(server)
        with await stall_mid_body(server, 6_000, 8_000):
            await held_becomes(budget, 6_000)
            response = await exchange(server, chunked(server, "/api/chat", 3_000, 3_000))
            assert budget.held == 6_000
    assert_budget_refusal(response)


@pytest.mark.parametrize(
    ("path", "protocol"),
    [
        ("/v1/chat/completions", "openai"),
        ("/ag-ui", "ag-ui"),
        ("/a2a/jsonrpc", "a2a"),
        ("/mcp", "mcp"),
    ],
)
async def test_every_endpoint_that_reads_a_body_answers_a_full_budget_with_retry_after(
    path, protocol
):
    async with web_server(
        agent(), max_body_in_flight=BUDGET, protocols=("ai-sdk", protocol)
    ) as server:
        budget = budget_of(server)
        with await stall_mid_body(server, 6_000, 8_000):
            await held_becomes(budget, 6_000)
            response = await exchange(server, sized(server, path, b"{" * 5_000))
    assert_budget_refusal(response)


async def test_the_budget_returns_to_zero_after_clients_that_vanish_mid_body():
    async with web_server(agent(), max_body_in_flight=BUDGET) as server:
        budget = budget_of(server)
        socks = [await stall_mid_body(server, 1_500, 2_000) for _ in range(5)]
        await held_becomes(budget, 7_500)
        for sock in socks:
            sock.close()
        await held_becomes(budget, 0)
        # ... and the whole budget serves a request again.
        payload = json.dumps({"id": "s", "messages": []}).encode() + b" " * 9_000
        response = await exchange(server, chat_request(server, payload))
        assert not head_of(response).startswith(b"HTTP/1.1 503"), response
        assert budget.held == 0


async def test_the_budget_returns_to_zero_when_a_stalled_body_times_out():
    async with web_server(agent(), max_body_in_flight=BUDGET, body_timeout=0.2) as server:
        budget = budget_of(server)
        with await stall_mid_body(server, 6_000, 8_000) as sock:
            with trio.fail_after(20):
                response = await read_to_end(sock)
            assert head_of(response).startswith(b"HTTP/1.1 408"), response
            await held_becomes(budget, 0)


async def test_the_budget_returns_to_zero_when_the_server_stops_mid_body():
    async with web_server(agent(), max_body_in_flight=BUDGET) as server:
        budget = budget_of(server)
        sock = await stall_mid_body(server, 6_000, 8_000)
        await held_becomes(budget, 6_000)
    sock.close()
    assert budget.held == 0


async def test_a_body_larger_than_the_whole_budget_is_413_not_a_503_to_retry():
    async with web_server(agent(), max_body_in_flight=BUDGET) as server:
        response = await exchange(server, chunked(server, "/api/chat", 6_000, 6_000))
        assert budget_of(server).held == 0
    assert head_of(response).startswith(b"HTTP/1.1 413"), response
