"""A loopback HTTP server for provider tests: replays SSE bodies to the real SDK clients.

Runs inside the test's own Trio loop. Each request pops the next scripted
:class:`Reply` (or, given ``respond``, gets the reply that function makes of it, for a
server that answers by what it is sent); every request (method, path, headers, JSON
body) is recorded so tests can assert exactly what the SDK sent. Replies can be cut
into small writes, delayed, dropped mid-body, or stall, to inject faults.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import attrs
import h11
import trio


@attrs.define(kw_only=True)
class Reply:
    body: bytes = b""
    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    content_type: str = "text/event-stream"
    write_size: int | None = None
    """Write the body in pieces of this many bytes (``None``: one write)."""
    delay: float = 0.0
    """Sleep this long between pieces."""
    write_events: bool = False
    """Write each SSE event (through its blank line) as its own piece, as a real server
    flushes them (the SDKs' decoders may wait for a piece that ends an event)."""
    drop_after: int | None = None
    """Close the connection abruptly after this many body bytes."""
    stall: float | None = None
    """Send headers, then sleep this long before the body."""
    stall_after: int = 0
    """With ``stall``: send this many body bytes first, then stall (a stream that stops
    mid-answer)."""
    keep_alive: bytes = b""
    """With ``stall``: write these bytes every :attr:`keep_alive_every` seconds while
    stalled (``: ping`` comments, blank lines, Anthropic ``event: ping`` events): a server
    that keeps the connection busy and sends no content."""
    keep_alive_every: float = 0.05


@attrs.define
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@attrs.define
class LoopbackServer:
    url: str
    replies: list[Reply]
    requests: list[Recorded] = attrs.field(factory=list)
    respond: Callable[[Recorded], Reply] | None = None
    """Makes the reply to each request from the request itself (``replies`` unused)."""

    def add(self, *replies: Reply) -> None:
        self.replies.extend(replies)


def sse(*events: Any, done: bool = True) -> bytes:
    """OpenAI-style SSE body: one ``data: {json}`` per event, then ``data: [DONE]``."""
    out = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]
    if done:
        out.append("data: [DONE]\n\n")
    return "".join(out).encode()


def anthropic_sse(*events: dict[str, Any]) -> bytes:
    """Anthropic-style SSE body: ``event: <type>`` + ``data: {json}`` per event."""
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def anthropic_start(model: str = "m") -> dict[str, Any]:
    """An Anthropic ``message_start`` event (message ``msg_1``, 10 tokens in, 1 out)."""
    return {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    }


def anthropic_end(reason: str) -> list[dict[str, Any]]:
    """An Anthropic message's last two events: ``message_delta`` with ``reason`` (5
    tokens out), ``message_stop``."""
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]


def responses_sse(model: str, n: int, events: list[dict[str, Any]]) -> bytes:
    """OpenAI Responses SSE body of response ``resp_{n}``: ``response.created``, the
    output ``events``, ``response.completed`` (10 tokens in, 5 out), each numbered."""
    response = {
        "id": f"resp_{n}",
        "object": "response",
        "created_at": 1,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    every = [
        {"type": "response.created", "response": {**response, "status": "in_progress"}},
        *events,
        {
            "type": "response.completed",
            "response": {**response, "status": "completed", "usage": usage},
        },
    ]
    return "".join(
        f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': i})}\n\n"
        for i, e in enumerate(every)
    ).encode()


async def _handle(stream: trio.SocketStream, server: LoopbackServer) -> None:
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            request = None
            body = bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                elif isinstance(event, h11.ConnectionClosed):
                    return
            assert request is not None
            recorded = Recorded(
                method=request.method.decode(),
                path=request.target.decode(),
                headers={k.decode().lower(): v.decode() for k, v in request.headers},
                body=bytes(body),
            )
            server.requests.append(recorded)
            if server.respond is not None:
                reply = server.respond(recorded)
            elif server.replies:
                reply = server.replies.pop(0)
            else:
                reply = Reply(status=500, body=b"no reply scripted")
            headers = [("content-type", reply.content_type), ("connection", "close")]
            headers += list(reply.headers)
            await stream.send_all(
                conn.send(h11.Response(status_code=reply.status, headers=headers))
            )
            payload = reply.body if reply.drop_after is None else reply.body[: reply.drop_after]
            if reply.stall:
                if reply.stall_after:
                    head, payload = payload[: reply.stall_after], payload[reply.stall_after :]
                    await stream.send_all(conn.send(h11.Data(data=head)))
                if reply.keep_alive:
                    with trio.move_on_after(reply.stall):
                        while True:
                            await trio.sleep(reply.keep_alive_every)
                            await stream.send_all(conn.send(h11.Data(data=reply.keep_alive)))
                else:
                    await trio.sleep(reply.stall)
            size = reply.write_size or max(1, len(payload))
            if reply.write_events:
                pieces = [p + b"\n\n" for p in payload.split(b"\n\n")]
                pieces[-1] = pieces[-1][:-2]
                pieces = [p for p in pieces if p]
            else:
                pieces = [payload[i : i + size] for i in range(0, len(payload), size)]
            for piece in pieces:
                if reply.delay:
                    await trio.sleep(reply.delay)
                await stream.send_all(conn.send(h11.Data(data=piece)))
            if reply.drop_after is not None:
                return  # abrupt close: no terminating chunk
            await stream.send_all(conn.send(h11.EndOfMessage()))
            return
    except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
        return
    finally:
        await stream.aclose()


@asynccontextmanager
async def loopback_server(
    *replies: Reply, respond: Callable[[Recorded], Reply] | None = None
) -> AsyncIterator[LoopbackServer]:
    """Serve ``replies`` in order on 127.0.0.1 (or each request ``respond``'s reply to
    it); yields the server (``.url``, ``.requests``)."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, lambda s: _handle(s, server), 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        server = LoopbackServer(
            url=f"http://127.0.0.1:{port}", replies=list(replies), respond=respond
        )
        try:
            yield server
        finally:
            nursery.cancel_scope.cancel()
