"""Serve the web app on a loopback port inside the test's own Trio loop."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

from runtime import Host

WEB = Path(__file__).resolve().parent
NPM_TIMEOUT = 300


@attrs.define
class WebServer:
    url: str
    host: Host
    app: Any


@asynccontextmanager
async def web_server(
    agent: Any, *, store: Any = None, **app_options: Any
) -> AsyncIterator[WebServer]:
    """A host and the app served by Hypercorn's Trio worker on 127.0.0.1 (a free port)."""
    from runtime.app.web.app import create_app
    from runtime.app.web.serve import serve_app

    async with Host.open(store=store, log_tap=False) as host:
        app = create_app(host, agent, **app_options)
        async with trio.open_nursery() as nursery:
            # The transport's send deadline as `serve` sets it (the app's --send-timeout).
            send_timeout = app.state.axon.send_timeout
            binds = await nursery.start(
                partial(serve_app, app, host="127.0.0.1", port=0, send_timeout=send_timeout)
            )
            try:
                yield WebServer(url=binds[0], host=host, app=app)
            finally:
                nursery.cancel_scope.cancel()


@asynccontextmanager
async def two_web_servers(
    agent_a: Any, agent_b: Any, **options: Any
) -> AsyncIterator[tuple[WebServer, WebServer, httpx.AsyncClient, httpx.AsyncClient]]:
    """Two hosts and apps given the same ``options`` (``store=`` one file or database:
    two ``serve`` of one deployment behind a balancer), and a client of each:
    ``(a, b, to_a, to_b)``."""
    async with (
        web_server(agent_a, **options) as a,
        web_server(agent_b, **options) as b,
        httpx.AsyncClient(base_url=a.url) as to_a,
        httpx.AsyncClient(base_url=b.url) as to_b,
    ):
        yield a, b, to_a, to_b


async def wait_idle(server: WebServer, session_id: str) -> None:
    """Wait (at most 10 s) until the session's turn is over: its stream done and saved."""
    with trio.fail_after(10):
        while True:
            session = server.host.sessions.get(session_id)
            if session is not None and session.current is None and not session.busy:
                return
            await trio.sleep(0.01)


def ensure_ai_package() -> str:
    """The ``node`` executable, with the ``ai`` package installed in tests/web (npm
    install on first use); skips the test when Node.js, npm or the install is missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node.js/npm not installed: the `ai` package protocol check needs them")
    if not (WEB / "node_modules" / "ai" / "package.json").exists():
        try:
            proc = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=WEB,
                capture_output=True,
                text=True,
                timeout=NPM_TIMEOUT,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"npm install of the `ai` package failed: {exc}")
        if proc.returncode != 0 or not (WEB / "node_modules" / "ai").exists():
            pytest.skip(f"npm install of the `ai` package failed: {proc.stderr.strip()[-400:]}")
    return node


async def run_read_stream(node: str, config: dict[str, Any]) -> Any:
    """Run ``read_stream.mjs`` (the real ``ai`` package reading a UI message stream: a
    server's, or an SSE body given as ``config["sse"]``) and return what it printed,
    decoded; a failing script fails the test with its stderr."""
    return await run_node_script(node, WEB / "read_stream.mjs", config)


async def run_node_script(node: str, script: Path, config: dict[str, Any]) -> Any:
    """Run a Node ``script`` (in its own folder, where its packages are installed) with
    ``config`` as its one JSON argument and return what it printed, decoded; a failing
    script fails the test with its stderr."""
    with trio.fail_after(60):
        proc = await trio.run_process(
            [node, str(script), json.dumps(config)],
            cwd=script.parent,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)
