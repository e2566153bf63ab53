"""Clients that send too slowly or read nothing: real sockets against the served app."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, AssistantMessage, Hooks, TextPart, UserMessage
from runtime.actor_messages import Batcher
from tests.test_web_http import body, recording_agent
from tests.web.harness import WebServer, web_server


async def connect(
    server: WebServer, *, receive_buffer: int | None = None
) -> trio.socket.SocketType:
    """A raw TCP connection to the server (with a small receive buffer when asked)."""
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    sock = trio.socket.socket()
    if receive_buffer is not None:  # set before connecting: it sizes the TCP window
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    await sock.connect((host, int(port)))
    return sock


def chat_request(server: WebServer, payload: bytes, *, content_length: int | None = None) -> bytes:
    host = server.url.removeprefix("http://")
    length = len(payload) if content_length is None else content_length
    head = (
        f"POST /api/chat HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n"
    )
    return head.encode() + payload


async def read_to_end(sock: trio.socket.SocketType) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = bytearray()
    while True:
        try:
            piece = await sock.recv(1 << 16)
        except ConnectionResetError:
            break
        if not piece:
            break
        data += piece
    return bytes(data)


async def test_a_body_that_never_arrives_gets_408_and_the_connection_is_closed():
    agent = recording_agent(ScriptedProvider(steps=[["x"]]))
    async with web_server(agent, body_timeout=0.3) as server:
        with trio.fail_after(20):
            sock = await connect(server)
            with sock:
                # the headers promise 100 bytes; 10 come, then nothing
                await sock.send(chat_request(server, b'{"id": "s"', content_length=100))
                response = await read_to_end(sock)
        head, _, payload = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408")
        assert b"connection: close" in head.lower()
        assert "did not arrive within 0.3 s" in json.loads(payload)["error"]
        assert "s" not in server.host.sessions


TEXT_DELTA = "word "
DELTAS = 20_000
"""Far more deltas than the socket buffers and the (capped) pipeline hold, few enough that
an unbounded pipeline takes the whole turn long before the send timeout."""


class Flood:
    """An agent whose one answer is :data:`DELTAS` text deltas: how many its provider was
    asked for (``pulled``), the turns that finished, and an event set when one has."""

    def __init__(self) -> None:
        self.pulled = [0]
        self.finished: list[Any] = []
        self.over = trio.Event()

        def deltas() -> Iterator[str]:
            for _ in range(DELTAS):
                self.pulled[0] += 1
                yield TEXT_DELTA

        async def on_turn_finish(event: Any) -> None:
            self.finished.append(event)
            self.over.set()

        provider = ScriptedProvider(responder=lambda request: deltas())
        self.agent = Agent(provider=provider, hooks=Hooks(on_turn_finish=on_turn_finish))


async def read_nothing_until_over(
    server: WebServer, flood: Flood, request: bytes, session_id: str
) -> tuple[bytes, Any]:
    """Send ``request`` over a socket with a small receive buffer, read nothing until the
    turn is over, then read what is left: the response and the session's saved record."""
    with trio.fail_after(60):
        sock = await connect(server, receive_buffer=4096)
        with sock:
            await sock.send(request)
            await flood.over.wait()  # the client reads nothing meanwhile
            response = await read_to_end(sock)
        record = await server.host.store.load(session_id)
    return response, record


async def test_a_client_that_never_reads_is_dropped_and_its_turn_saved_interrupted(monkeypatch):
    # A small cap keeps the pipeline's bound (inbox capacities x cap) small for the test.
    monkeypatch.setattr(Batcher, "max_items", 1)
    flood = Flood()
    async with web_server(flood.agent, send_timeout=2) as server:
        request = chat_request(server, json.dumps(body("stuck")).encode())
        response, record = await read_nothing_until_over(server, flood, request, "stuck")
    finished, pulled = flood.finished, flood.pulled

    # the turn was cancelled because of the client, and saved with what it had produced
    assert [(e.finish_reason, e.abort_reason) for e in finished] == [
        ("aborted", "client not reading")
    ]
    saved = record.messages[1]
    assert isinstance(saved, AssistantMessage) and saved.interrupted
    words = saved.text.split()
    assert 0 < len(words) < DELTAS and set(words) == {"word"}
    # backpressure held the provider back: the server never had the whole turn
    assert pulled[0] < DELTAS
    # the connection was closed without the end of the stream
    assert response.startswith(b"HTTP/1.1 200")
    assert b"[DONE]" not in response and not response.endswith(b"0\r\n\r\n")


async def test_a_client_that_never_reads_a_large_json_answer_is_dropped_after_the_send_timeout(
    autojump_clock,
):
    # A JSON answer was sent from the request's task straight into Hypercorn's (shielded)
    # send: a client that asked for a long session and never read held that task, and
    # the answer's megabytes, for as long as it kept the connection open. Now each send
    # waits at most the send timeout, as a stream's does: the rest is dropped and the
    # connection closed.
    agent = recording_agent(ScriptedProvider(steps=[["x"]]))
    async with web_server(agent, send_timeout=60) as server:
        text = "w" * 100_000
        history = [
            m
            for i in range(100)
            for m in (
                UserMessage(content=text, id=f"u{i}"),
                AssistantMessage(content=(TextPart(text=text, step=0),), id=f"a{i}"),
            )
        ]
        await server.host.store.save("long", 0, history)
        host = server.url.removeprefix("http://")
        sock = await connect(server, receive_buffer=4096)
        with sock:
            await sock.send(f"GET /api/sessions/long HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
            await trio.sleep(120)  # the client reads nothing for twice the send timeout
            with trio.fail_after(600):
                response = await read_to_end(sock)
    head, _, payload = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    assert length > 20_000_000  # far more than the socket buffers hold
    assert len(payload) < length  # cut short: the server gave up on the client


async def test_a_client_that_pipelines_small_answers_and_never_reads_is_dropped(autojump_clock):
    # Answers under 64 KiB were sent straight from the request's task, as if a socket's
    # buffer always took them; a client that pipelines requests and reads nothing fills
    # that buffer with the answers before, and the next answer's send held its task for
    # as long as the connection lived: every answer was still there for a client that
    # came back after twice the send timeout. Now each answer's sends are bounded too.
    agent = recording_agent(ScriptedProvider(steps=[["x"]]))
    async with web_server(agent, send_timeout=60) as server:
        text = "w" * 8_000
        history = [
            UserMessage(content=text, id="u0"),
            AssistantMessage(content=(TextPart(text=text, step=0),), id="a0"),
        ]
        await server.host.store.save("small", 0, history)
        host = server.url.removeprefix("http://")
        sock = await connect(server, receive_buffer=4096)
        with sock:
            request = f"GET /api/sessions/small HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()
            await sock.send(request * 256)  # ~8 MB of answers: more than the buffers hold
            await trio.sleep(120)  # the client reads nothing for twice the send timeout
            with trio.fail_after(600):
                response = await read_to_end(sock)
    head = response.partition(b"\r\n\r\n")[0]
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    assert 20_000 < length < 64 * 1024  # a small answer, each of them
    assert response.count(b"HTTP/1.1 200") < 256  # cut short: the server gave up on it


async def test_a_held_response_start_goes_before_a_message_that_is_no_body():
    # The send deadline holds a response's start until its body's first piece; a message
    # of another kind (trailers, a pathsend) must not overtake it.
    from runtime.app.web.writer import _BoundedSend

    sent: list[str] = []

    async def send(message: Any) -> None:
        sent.append(message["type"])

    async def receive() -> Any:
        return {"type": "http.disconnect"}

    async with trio.open_nursery() as background:
        bounded = _BoundedSend(send, receive, background, 60)
        await bounded({"type": "http.response.start", "status": 200, "headers": []})
        await bounded({"type": "http.response.trailers", "headers": []})
    assert sent == ["http.response.start", "http.response.trailers"]
