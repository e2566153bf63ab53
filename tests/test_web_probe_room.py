"""Health probes past ``serve --max-connections`` (docs/deployment.md, "Health checks"):
answered on a small room of connections kept for them, where every other request
still gets the 503. Before, the cap was decided at accept, before a byte was read, and
a kubelet's liveness probe of a server that was only busy got the 503: the
orchestrator restarted a healthy pod. Raw sockets against the app served in the
test's loop, as tests/test_web_connections.py does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import pytest
import trio
from hypercorn.config import Config
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.test_http_attacks_2 import until
from tests.test_web_connections import read_answer

CAP = 2


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))


@asynccontextmanager
async def full_server(
    hold: int = CAP, **options: Any
) -> AsyncIterator[tuple[Any, tuple[str, int]]]:
    """A server with a cap of :data:`CAP` connections, ``hold`` of them held (each
    answered once, kept open): ``(host, address)``; by default every new connection is
    past the cap."""
    from runtime import Host
    from runtime.app.web.app import create_app
    from runtime.app.web.serve import serve_app

    async with Host.open(log_tap=False) as host, trio.open_nursery() as nursery:
        app = create_app(host, agent())
        binds = await nursery.start(
            partial(serve_app, app, host="127.0.0.1", port=0, max_connections=CAP, **options)
        )
        address = ("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
        held = []
        try:
            for _ in range(hold):
                sock = trio.socket.socket()
                held.append(sock)
                await sock.connect(address)
                await sock.send(b"GET /api/info HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                assert (await read_answer(sock)).startswith(b"HTTP/1.1 200")
            yield host, address
        finally:
            for sock in held:
                sock.close()
            nursery.cancel_scope.cancel()


async def exchange(address: tuple[str, int], request: bytes) -> bytes:
    """Send ``request`` on a new connection and read until the server closes it."""
    with trio.socket.socket() as sock, trio.fail_after(20):
        await sock.connect(address)
        await sock.send(request)
        data = b""
        try:
            while piece := await sock.recv(1 << 16):
                data += piece
        except ConnectionResetError as exc:
            data += repr(exc).encode()
        return data


def probe(path: str, method: str = "GET", host: str = "127.0.0.1", extra: str = "") -> bytes:
    return (
        f"{method} {path} HTTP/1.1\r\nhost: {host}\r\nuser-agent: kube-probe/1.31\r\n"
        f"accept: */*\r\n{extra}\r\n"
    ).encode()


@pytest.fixture(autouse=True)
def _long_keep_alive(monkeypatch):
    monkeypatch.setattr(Config, "keep_alive_timeout", 3600)  # held connections stay


@pytest.mark.parametrize(
    ("request_", "status"),
    [
        (probe("/healthz"), b"200"),
        (probe("/readyz"), b"200"),
        (probe("/healthz", "HEAD"), b"200"),
        (probe("/readyz?verbose=1", extra="connection: close\r\n"), b"200"),
        (probe("/api/info"), b"503"),
        (probe("/healthz", "POST", extra="content-length: 0\r\n"), b"503"),
        (probe("/healthz/x"), b"503"),
        (probe("/healthz", extra="content-length: 5\r\n") + b"hello", b"503"),
        (probe("/healthz", extra="transfer-encoding: chunked\r\n") + b"0\r\n\r\n", b"503"),
        (probe("/healthz", extra="upgrade: h2c\r\nconnection: upgrade\r\n"), b"503"),
        (b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1", b"503"),  # the head never ends
        (b"", b"503"),  # a client that sends nothing
        # Host forged: the probe is served by the app, whose guard answers as it does
        # within the cap: /healthz whatever the Host, /readyz refused.
        (probe("/healthz", host="evil.example"), b"200"),
        (probe("/readyz", host="evil.example"), b"403"),
    ],
)
async def test_past_the_cap_a_probe_is_answered_and_anything_else_refused(request_, status):
    async with full_server() as (_host, address):
        answer = await exchange(address, request_)
    assert answer.split(b" ", 2)[1] == status, answer


async def test_a_request_pipelined_behind_a_probe_past_the_cap_is_not_served():
    # Sent at once: no probe (refused whole). Sent after the probe's answer: never read,
    # the connection closed; the chat turn never runs.
    chat = (
        b"POST /api/chat HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: 2\r\n\r\n{}"
    )
    async with full_server() as (host, address):
        together = await exchange(address, probe("/healthz") + chat)
        with trio.socket.socket() as sock, trio.fail_after(20):
            await sock.connect(address)
            await sock.send(probe("/healthz"))
            head = await read_answer(sock)
            rest = b""
            try:  # (sent to a closed connection: reset)
                await sock.send(chat)
                while piece := await sock.recv(1 << 16):
                    rest += piece
            except (ConnectionResetError, BrokenPipeError):
                pass
        sessions = dict(host.sessions)
    assert together.startswith(b"HTTP/1.1 503"), together
    assert head.startswith(b"HTTP/1.1 200") and rest == b"", (head, rest)
    assert sessions == {}


async def test_a_probe_past_the_cap_whose_client_never_reads_is_closed_all_the_same():
    async with full_server() as (_host, address):
        silent = []
        for _ in range(3 * 8):  # three times the room, none of them read
            sock = trio.socket.socket()
            silent.append(sock)
            await sock.connect(address)
            await sock.send(probe("/healthz"))
        try:
            # Each is answered into its socket's buffer and closed: the room is free
            # again at once (a 503 only while they are being answered).
            for _ in range(200):
                answer = await exchange(address, probe("/readyz"))
                if answer.startswith(b"HTTP/1.1 200"):
                    break
                await trio.sleep(0.05)
        finally:
            for sock in silent:
                sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer


async def test_past_the_room_for_probes_a_probe_gets_the_503():
    from runtime.app.web.connections import PROBE_ROOM, ConnectionCap

    original = ConnectionCap.__init__

    def full_room(self: ConnectionCap, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.probes = PROBE_ROOM

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ConnectionCap, "__init__", full_room)
        async with full_server() as (_host, address):
            answer = await exchange(address, probe("/healthz"))
    assert answer.startswith(b"HTTP/1.1 503"), answer


async def test_one_address_past_its_share_still_has_its_probes_answered():
    # The kubelet probes from the node's address, which NodePort traffic may share.
    async with full_server(hold=1, max_connections_per_address=1) as (_host, address):
        answers = [await exchange(address, probe(path)) for path in ("/healthz", "/api/info")]
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"503"]


@given(st.binary(max_size=300))
def test_only_a_probes_head_is_a_probe(raw):
    from runtime.app.web.connections import is_probe

    if is_probe(raw):
        line = raw.split(b"\r\n", 1)[0]
        method, target, version = line.split(b" ")
        assert method in (b"GET", b"HEAD") and version in (b"HTTP/1.1", b"HTTP/1.0")
        assert target.partition(b"?")[0] in (b"/healthz", b"/readyz")
        assert b"transfer-encoding" not in raw.lower()


async def test_a_serve_process_at_its_cap_answers_its_probes(tmp_path):
    # `serve --max-connections 2` (the CLI's wiring of the cap and the room), both held.
    import os
    import subprocess
    import sys

    errors = tmp_path / "stderr"
    with errors.open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            [
                *(sys.executable, "-m", "runtime", "serve", "--port", "0"),
                *("--max-connections", "2", "--max-connections-per-address", "off"),
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    held = []
    try:
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
            host, port = line.decode().split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)
            address = (host, int(port))
            for _ in range(CAP):
                sock = trio.socket.socket()
                held.append(sock)
                await sock.connect(address)
                await sock.send(b"GET /api/info HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                assert (await read_answer(sock)).startswith(b"HTTP/1.1 200")
            answers = [
                await exchange(address, probe(path)) for path in ("/healthz", "/readyz", "/")
            ]
    finally:
        for sock in held:
            sock.close()
        proc.kill()
        await proc.wait()
    assert [a.split(b" ", 2)[1] for a in answers] == [b"200", b"200", b"503"], answers


@asynccontextmanager
async def cap_seen() -> AsyncIterator[list[Any]]:
    """The :class:`ConnectionCap` the server in the block makes (a list of it)."""
    from runtime.app.web.connections import ConnectionCap

    caps: list[Any] = []
    original = ConnectionCap.__init__

    def noted(self: ConnectionCap, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        caps.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ConnectionCap, "__init__", noted)
        yield caps


def being_read(cap: Any) -> int:
    """Connections past the cap the server is reading from (the refusals lingering and
    the heads read for a probe; before the probe room's fix the heads were counted as
    lingering)."""
    return int(cap.lingering) + len(getattr(cap, "reading", ()))


async def test_connections_that_send_nothing_past_the_cap_do_not_keep_a_probe_out(
    monkeypatch,
):
    # 64 connections past the cap open and send nothing (held as long as a slow
    # attacker's: the read's timeout made long); a kubelet's probe after them is answered.
    from runtime.app.web import connections

    monkeypatch.setattr(connections, "PROBE_READ_TIMEOUT", 3600.0)
    monkeypatch.setattr(connections, "REFUSAL_TIMEOUT", 3600.0)
    silent = []
    async with cap_seen() as caps, full_server() as (_host, address):
        try:
            for _ in range(connections.LINGERING):
                sock = trio.socket.socket()
                silent.append(sock)
                await sock.connect(address)
            await until(lambda: being_read(caps[0]) >= connections.LINGERING)
            answer = await exchange(address, probe("/healthz"))
        finally:
            for sock in silent:
                sock.close()
    assert answer.startswith(b"HTTP/1.1 200"), answer


async def test_past_the_cap_a_request_line_that_is_no_probes_is_refused_at_once(monkeypatch):
    # The head is never finished: the 503 comes from the request line alone, not after
    # the read's timeout (made an hour here).
    from runtime.app.web import connections

    monkeypatch.setattr(connections, "PROBE_READ_TIMEOUT", 3600.0)
    async with full_server() as (_host, address):
        answer = await exchange(address, b"GET /api/info HTTP/1.1\r\nhost: 127.0.0.1\r\n")
    assert answer.startswith(b"HTTP/1.1 503"), answer
