"""Answers the app does not write itself: Starlette's 500 for a route that raised,
Hypercorn's own (400 for a bad request, 100 Continue, 500 for an app that answered
nothing). They were written outside the app's send deadline, and the 500's traceback
went to the log as it was. Real sockets against an app served in the test's loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import trio
import trio.testing
from starlette.routing import Route

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from runtime.app.web.app import create_app
from runtime.app.web.serve import serve_app
from tests.test_web_slow_clients import connect, read_to_end
from tests.web.harness import WebServer

ANSWER = 8 << 20
"""Bytes of an answer written in one piece: far more than the sockets' buffers hold."""
SECRET = "sk-proj-" + "a1B2c3D4" * 4
"""Key-shaped: what runtime.redact replaces wherever it finds it."""


@asynccontextmanager
async def served(app: Any, host: Host, **options: Any) -> AsyncIterator[WebServer]:
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve_app, app, host="127.0.0.1", port=0, **options))
        try:
            yield WebServer(url=binds[0], host=host, app=app)
        finally:
            nursery.cancel_scope.cancel()


def one_piece(size: int) -> Any:
    """An ASGI app that writes ``size`` bytes in one message, with no deadline of its
    own: as Starlette's 500 and Hypercorn's answers are written."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * size})

    return app


async def test_a_write_outside_the_app_s_deadline_is_given_up_for_a_client_that_reads_nothing(
    autojump_clock,
):
    # Hypercorn writes shielded from cancellation: a client that read nothing of an
    # answer written outside the app's send deadline held the writing task, and the
    # answer, for as long as it kept the connection, and got all of it when it came back.
    async with (
        Host.open(log_tap=False) as host,
        served(one_piece(ANSWER), host, send_timeout=60) as server,
    ):
        sock = await connect(server, receive_buffer=4096)
        with sock:
            await sock.send(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            await trio.sleep(600)  # nothing read for ten times the send timeout
            with trio.fail_after(600):
                response = await read_to_end(sock)
    assert response.startswith(b"HTTP/1.1 200")
    assert len(response) < ANSWER  # cut short: the connection was closed


async def test_a_slow_client_that_reads_gets_a_large_piece_whole(autojump_clock):
    # The transport's deadline is for a client that takes nothing: one reading a large
    # answer a few kilobytes at a time gets all of it however long it takes, though the
    # kernel wakes the writer only once a third of its buffer is free. (The
    # clock jumps only once the loop has been idle 0.1 s of real time, so never while
    # the kernel is still moving what the client read.)
    autojump_clock.autojump_threshold = 0.1
    size = 128 << 10
    async with (
        Host.open(log_tap=False) as host,
        served(one_piece(size), host, send_timeout=1) as server,
    ):
        sock = await connect(server, receive_buffer=4096)
        with sock:
            await sock.send(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            received = reads = 0
            while received < size:
                piece = await sock.recv(1 << 20)
                assert piece, received
                received += len(piece)
                reads += 1
                await trio.sleep(1.5)  # over the send timeout between reads
    assert reads * 1.5 > 10  # and ten times over it in all


async def test_a_route_that_raises_answers_500_with_no_secret_in_the_body_or_the_log(capsys):
    # The 500's body is Starlette's two words; the traceback Hypercorn logged for it went
    # to stderr as it was, a key inside the exception's text with it.
    async def fails(request: Any) -> Any:
        raise RuntimeError(f"upstream refused api_key={SECRET}")

    agent = Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))
    async with Host.open(log_tap=False) as host:
        app = create_app(host, agent)
        app.router.routes.append(Route("/api/fails", fails))
        async with served(app, host, send_timeout=60) as server:
            with trio.fail_after(20):
                sock = await connect(server)
                with sock:
                    address = server.url.removeprefix("http://")
                    request = (
                        f"GET /api/fails HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n"
                    )
                    await sock.send(request.encode())
                    response = await read_to_end(sock)
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)  # the log comes after
    log = capsys.readouterr().err
    assert response.startswith(b"HTTP/1.1 500")
    assert response.endswith(b"\r\n\r\nInternal Server Error")
    assert "Error in ASGI Framework" in log and "upstream refused" in log, (response, log)
    assert SECRET not in log and "[redacted]" in log


async def test_serve_bounds_its_transport_s_writes_by_send_timeout(monkeypatch):
    import argparse

    from runtime.app.web import serve

    seen: dict[str, Any] = {}

    async def recorded(app: Any, *, task_status: Any, **options: Any) -> None:
        seen.update(options)
        task_status.started([])

    monkeypatch.setattr(serve, "serve_app", recorded)
    parser = serve.add_serve_arguments(argparse.ArgumentParser())
    args = parser.parse_args(["--port", "0", "--send-timeout", "7"])
    assert await serve.serve_command(args) == 0
    assert seen["send_timeout"] == 7
