"""A viewer of a worker's turn on the relay (``GET /api/chat/{id}/stream``) that reads
nothing while a long turn streams, then reads what it was sent and resumes with
``Last-Event-ID`` on another front end. Real PostgreSQL, real Redis, real HTTP."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.web.writer import NOT_READING, QUEUED_BYTES, BodyPump, BodyWriter
from tests.test_frontend import (
    LIMIT,
    _AsServer,
    body,
    deployment,
    redis_url,
    stored_text,
    streamed_text,
    wait_for_turn,
)
from tests.test_relay_web import sse_events
from tests.test_web_slow_clients import connect, read_to_end

__all__ = ["redis_url"]


def _dechunk(raw: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 response, as far as it arrived whole."""
    _, _, rest = raw.partition(b"\r\n\r\n")
    out = bytearray()
    while True:
        size_line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return bytes(out)
        size = int(size_line, 16)
        if size == 0 or len(rest) < size:
            out += rest[:size]
            return bytes(out)
        out += rest[:size]
        rest = rest[size + 2 :]


def _complete_events(text: str) -> list[tuple[str | None, Any]]:
    complete = text[: text.rfind("\n\n") + 2]
    return sse_events(complete) if complete.strip() else []


async def test_a_viewer_that_stalls_is_dropped_and_resumes_with_no_gap_and_no_repeat(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ~10 MB of SSE: more than the kernel's socket buffers hold.
    words = " ".join(f"{'x' * 90}{i}" for i in range(60_000))
    agent = Agent(name="big", provider=ScriptedProvider(steps=[[words]]))
    dropped = trio.Event()
    most = [0, 0]  # bytes queued for a writer at once, the largest piece
    write = BodyPump.write
    queue_write = BodyWriter.write

    async def watched(pump: BodyPump, data: bytes) -> None:
        await write(pump, data)
        if pump.left == NOT_READING:
            dropped.set()

    async def counted(writer: BodyWriter, data: bytes) -> bool:
        most[1] = max(most[1], len(data))
        ok = await queue_write(writer, data)
        most[0] = max(most[0], writer._queued)
        return ok

    monkeypatch.setattr(BodyPump, "write", watched)
    monkeypatch.setattr(BodyWriter, "write", counted)
    async with deployment(pg_url, redis_url, agent, fronts=2, send_timeout=0.5) as d:
        a, b = d.urls
        server = _AsServer(url=a)
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                posted: list[str] = []

                async def post() -> None:
                    response = await client.post(f"{b}/api/chat", json=body("s1"))
                    posted.append(response.text)

                nursery.start_soon(post)
                turn = await wait_for_turn(d.queue, "s1", "running")
                sock = await connect(server, receive_buffer=4096)  # type: ignore[arg-type]
                with sock:
                    host = a.removeprefix("http://")
                    await sock.send(
                        f"GET /api/chat/s1/stream HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()
                    )
                    done = await d.queue.wait_finished(turn.turn_id, LIMIT)
                    assert done is not None and done.status == "done"
                    with trio.fail_after(LIMIT):
                        await dropped.wait()
                        received = await read_to_end(sock)
            seen = _complete_events(_dechunk(received).decode())
            assert seen and seen[-1][1] != "[DONE]"
            last = [i for i, _ in seen if i is not None][-1]
            rest = await client.get(f"{b}/api/chat/s1/stream", headers={"last-event-id": last})
            final = [i for i, _ in sse_events(rest.text) if i is not None][-1]
            again = await client.get(f"{a}/api/chat/s1/stream", headers={"last-event-id": final})
        stored = await d.assistant("s1")
    # The front end held at most its writer's bound of the stream (one piece past it),
    # however much the turn streamed, and dropped the client.
    assert most[0] <= QUEUED_BYTES + most[1] < len(words) // 10
    assert len(received) < len(words) // 10
    # Resumed after its last whole event (the turn had ended meanwhile: it was a 204,
    # and the answer stayed cut short), it gets the rest; resumed after the end, a 204.
    assert rest.status_code == 200
    assert again.status_code == 204
    after = [e for e in sse_events(rest.text) if e[0] is not None]
    events = [e for e in seen if e[0] is not None] + after
    ids = [int(i) for i, _ in events if i is not None]
    assert ids == list(range(1, len(ids) + 1))  # nothing repeated, nothing skipped
    assert streamed_text(events) == stored_text(stored) == words
    assert streamed_text(sse_events(posted[0])) == words
