"""A real FastAPI app under a real uvicorn server, streaming Axon turns as SSE from an
``AsyncHost`` to httpx clients: many sessions at once, and a client that hangs up.

The server runs on a thread of the test (its own asyncio loop, a free loopback port);
the clients run in the test's own ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, AssistantMessage
from runtime.app.aio import AsyncHost
from tests.support.services import free_port

ANSWER = "The answer is forty-two, said Deep Thought after a while."
LIMIT = 60  # seconds: a hang fails its test instead of stalling the run


def endless() -> Iterator[str]:
    for i in range(200_000):
        yield f"w{i} "


def make_app(store: str) -> FastAPI:
    answers = Agent(name="answers", provider=ScriptedProvider([[ANSWER]]))
    talker = Agent(name="talker", provider=ScriptedProvider(responder=lambda r: endless()))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncHost.open(store=store) as host:
            app.state.axon = host
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/chat/{agent}/{session_id}")
    async def chat(agent: str, session_id: str, q: str, request: Request) -> StreamingResponse:
        host: AsyncHost = request.app.state.axon
        session = await host.open_session(answers if agent == "answers" else talker, session_id)

        async def events() -> AsyncIterator[str]:
            async with session.stream(q) as out:
                async for chunk in out:
                    if chunk.type == "text-delta":
                        yield f"data: {json.dumps(chunk.text)}\n\n"
            yield f"event: done\ndata: {json.dumps(out.result.finish_reason)}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/status/{session_id}")
    async def status(session_id: str, request: Request) -> dict[str, Any]:
        host: AsyncHost = request.app.state.axon
        record = await host.call(host.host.store.load, session_id)
        if record is None or len(record.messages) < 2:
            return {"status": None}
        reply = record.messages[1]
        assert isinstance(reply, AssistantMessage)
        return {"status": reply.status, "text": reply.text}

    return app


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(
        make_app(str(tmp_path / "app.db")), host="127.0.0.1", port=port, log_level="warning"
    )
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(LIMIT * 20):
        if srv.started or not thread.is_alive():
            break
        time.sleep(0.05)
    assert srv.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(LIMIT)
        assert not thread.is_alive()


async def read_sse(client: httpx.AsyncClient, url: str) -> tuple[str, str]:
    """The text deltas of one SSE stream, joined, and its ``done`` event's data."""
    texts: list[str] = []
    done = ""
    async with client.stream("GET", url) as response:
        assert response.status_code == 200
        event = "message"
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
                if event == "done":
                    done = data
                else:
                    texts.append(data)
            elif not line:
                event = "message"
    return "".join(texts), done


def test_fifty_concurrent_sessions_each_stream_their_whole_answer_as_sse(server: str) -> None:
    async def main() -> list[tuple[str, str]]:
        async with asyncio.timeout(LIMIT), httpx.AsyncClient(timeout=LIMIT) as client:
            return await asyncio.gather(
                *(read_sse(client, f"{server}/chat/answers/s{i}?q=hi") for i in range(50))
            )

    results = asyncio.run(main())
    assert results == [(ANSWER, "stop")] * 50


def test_a_client_that_disconnects_mid_stream_cancels_the_turn_and_it_is_saved_interrupted(
    server: str,
) -> None:
    async def main() -> dict[str, Any]:
        async with asyncio.timeout(LIMIT), httpx.AsyncClient(timeout=LIMIT) as client:
            received = 0
            async with client.stream("GET", f"{server}/chat/talker/gone?q=talk") as response:
                async for line in response.aiter_lines():
                    received += line.startswith("data: ")
                    if received == 3:
                        break  # leaving the block closes the connection mid-stream
            while True:  # the server notices when it next writes; then the turn is saved
                status = (await client.get(f"{server}/status/gone")).json()
                assert status["status"] != "complete", "the turn ran on after the hang-up"
                if status["status"] == "interrupted":
                    return status
                await asyncio.sleep(0.05)

    status = asyncio.run(main())
    assert status["text"].startswith("w0 w1 ")
    assert len(status["text"]) < len("".join(endless()))  # stopped, not run to the end
