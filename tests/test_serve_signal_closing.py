"""``serve`` SIGTERM'd with a message waiting for its session's running turn
(``--on-busy enqueue``): the signal cancels the running turns (reason ``server
shutdown``), and the waiting message must not start a turn of its own on a server
going away (a model call cut a moment later, stored interrupted): it gets the closing
host's 503 with ``Retry-After``, nothing of it stored. A real signal to the test
process, caught by ``serve``'s own receiver, the app served in the test's loop."""

from __future__ import annotations

import os
import signal
from functools import partial
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from runtime import Host
from runtime.app.cli import build_parser
from runtime.messages import UserMessage
from tests.test_busy import Script, agent_with, held, holding
from tests.test_web_http import body


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


async def test_a_message_waiting_when_serve_gets_its_signal_is_a_503_and_runs_nothing(
    free_tcp_port: int,
) -> None:
    from runtime.app.web.app import create_app
    from runtime.app.web.serve import _serve_until_signal

    script = Script(holding(), ["ran on a server going away"])
    agent = agent_with(script, "enqueue")
    args = build_parser().parse_args(
        ["serve", "--port", str(free_tcp_port), "--max-connections", "off"]
    )
    answers: dict[str, Any] = {}
    async with Host.open(log_tap=False) as host:
        app = create_app(host, agent, on_busy="enqueue")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(_serve_until_signal, app, host, args, "test", protocols=()))
            url = f"http://127.0.0.1:{free_tcp_port}"
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                with trio.fail_after(20):
                    while True:
                        try:
                            await client.get("/api/info")
                            break
                        except httpx.ConnectError:
                            await trio.sleep(0.05)

                async def post(name: str, text: str) -> None:
                    answers[name] = await client.post("/api/chat", json=body("s", text))

                async with trio.open_nursery() as posts:
                    posts.start_soon(post, "first", "go")
                    await held["open"].wait()
                    posts.start_soon(post, "second", "waiting")
                    await trio.testing.wait_all_tasks_blocked(0.05)
                    assert host.sessions["s"].waiting_inputs == 1
                    os.kill(os.getpid(), signal.SIGTERM)
        users = [m.text for m in host.sessions["s"].messages if isinstance(m, UserMessage)]
    second = answers["second"]
    assert second.status_code == 503, second.text
    assert second.headers["retry-after"]
    assert "server shutdown" in answers["first"].text
    assert users == ["go"]
    assert len(script.requests) == 1  # the waiting message made no model call
