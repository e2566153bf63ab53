"""``serve --drain N`` as a worker deployment's front end, a real process, real
signals, on the test run's own PostgreSQL and Redis with a real worker process: during
the drain it serves as before (``/readyz`` 503 ``draining``, a new message queued and
streamed); once the drain ends (a second SIGTERM ends it now) the stream being read
ends cleanly (whole events, the closing comment, no ``[DONE]``), a message whose body
came meanwhile is a 503 with ``Retry-After`` and queues nothing, the process exits 0,
and the cut stream is read on another front end with ``Last-Event-ID``: the rest of the
turn, which went on on its worker, to its ``[DONE]``. Before, the stream was cut by
the server's last seconds and the late message was queued."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from runtime.app.web.frontend import CLOSING_END
from tests.support.redis import require_redis, unique_prefix
from tests.support.worker_agent import answer_text
from tests.test_frontend import EventReader, body, data
from tests.test_relay_web import sse_events
from tests.test_worker_approval_processes import FrontEnds
from tests.test_workers import Workers, sql

LIMIT = 60.0


@pytest.fixture
def deployment(pg_url: str) -> Iterator[tuple[Workers, FrontEnds]]:
    redis_url = require_redis()
    prefix = unique_prefix()
    workers = Workers(pg_url, redis_url, prefix)
    fronts = FrontEnds(pg_url, redis_url, prefix)
    try:
        yield workers, fronts
    finally:
        workers.close()
        fronts.close()


async def _late_message(url: str, session_id: str) -> tuple[trio.SocketStream, bytes]:
    """A connection whose ``POST /api/chat`` the server handles (its head read: the
    ``100 Continue`` came) while its body is not sent yet; that body."""
    where = urlsplit(url)
    sent = json.dumps(body(session_id, "late")).encode()
    stream = await trio.open_tcp_stream(where.hostname, where.port)
    head = (
        f"POST /api/chat HTTP/1.1\r\nHost: {where.netloc}\r\nExpect: 100-continue\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(sent)}\r\n\r\n"
    ).encode()
    await stream.send_all(head)
    got = b""
    while b"\r\n\r\n" not in got:
        got += await stream.receive_some(65536)
    assert got.startswith(b"HTTP/1.1 100"), got
    return stream, sent


async def _answer(stream: trio.SocketStream) -> bytes:
    got = b""
    while chunk := await stream.receive_some(65536):
        got += chunk
    return got


async def test_a_front_end_drains_then_closes_cleanly_and_its_stream_resumes_elsewhere(
    pg_url: str, deployment: tuple[Workers, FrontEnds], tmp_path: Path
) -> None:
    workers, fronts = deployment
    fronts.args += ["--drain", "600"]
    url = await fronts.start()
    front = fronts.procs[-1]
    gate = tmp_path / "gate"
    workers.start("w1", AXON_TEST_TOOL_GATE=str(gate))
    async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            async with client.stream("POST", "/api/chat", json=body("s-read", "tools one")) as read:
                reader = EventReader(read)
                seen = await reader.until(2)  # the turn streams; it then waits in its tool
                while not await trio.Path(f"{gate}.at").exists():  # noqa: ASYNC110
                    await trio.sleep(0.02)
                front.send_signal(signal.SIGTERM)  # the drain starts
                async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as probe:
                    while (await probe.get("/readyz")).status_code != 503:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                    drained = await probe.post("/api/chat", json=body("s-drain", "during"))
                late, late_body = await _late_message(url, "s-late")
                front.send_signal(signal.SIGTERM)  # the drain ends now
                async for text in reader.chunks:
                    reader.raw += text
            raw = reader.raw
            rest = sse_events(raw.removesuffix(CLOSING_END.decode()))
            await late.send_all(late_body)
            refused = await _answer(late)
            code = await trio.to_thread.run_sync(front.wait)
    assert drained.status_code == 200  # served during the drain
    assert raw.endswith(CLOSING_END.decode()) and "[DONE]" not in raw
    head = refused.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 503") and b"\r\nretry-after: 5" in head
    assert code == 0
    assert sql(pg_url, "SELECT count(*) FROM axon_turns WHERE session_id = 's-late'") == [(0,)]
    last_id = [i for i, _ in rest if i is not None][-1]
    assert int(last_id) >= int(seen[-1][0])
    # The turn goes on: read on another front end from where the cut stream stopped.
    fronts.args = fronts.args[:-2]  # (no --drain: the fixture's one SIGTERM stops it)
    other = await fronts.start()
    async with httpx.AsyncClient(base_url=other, timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):
            async with client.stream(
                "GET", "/api/chat/s-read/stream", headers={"last-event-id": last_id}
            ) as resumed:
                gate.touch()  # the tool ends, the turn with it
                text = (await resumed.aread()).decode()
    events = sse_events(text)
    assert resumed.status_code == 200 and events[-1] == (None, "[DONE]")
    assert all(int(i) > int(last_id) for i, _ in events if i is not None)
    deltas = [d["delta"] for d in data(rest + events) if d.get("type") == "text-delta"]
    assert "".join(deltas) == answer_text("tools one")
