"""What connections cost the server: a closed one's socket let go at once, and room for
more than most systems' default 1,024 open files (docs/web.md, "Slow and stuck
clients"). Raw sockets against the app served in the test's loop, or a ``serve``
process."""

from __future__ import annotations

import ipaddress
import json
import os
import resource
import subprocess
import sys
from functools import partial

import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent
from tests.test_web_http import body
from tests.test_web_slow_clients import chat_request, connect
from tests.web.harness import web_server

CONNECTIONS = 300
"""Connections held at once against a ``serve`` started with :data:`SOFT_LIMIT` open
files: more than it could hold without raising it."""
SOFT_LIMIT = 128


def agent() -> Agent:
    return Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def read_answer(sock: trio.socket.SocketType) -> bytes:
    """One answer with a ``content-length``, read whole (the connection stays open)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = await sock.recv(1 << 16)
        assert piece, data
        data += piece
    head, _, payload = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(payload) < length:
        piece = await sock.recv(1 << 16)
        assert piece, data
        payload += piece
    return head


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
async def test_a_connection_its_client_closed_is_let_go_before_its_keep_alive_runs_out(
    monkeypatch,
):
    # Hypercorn kept such a connection's socket (and two tasks) until its keep-alive
    # timer ran out: 5 s of a file descriptor for every client that read its answer and
    # left a moment later, or opened a connection and used none of it (a browser's
    # preconnect), so 200 of them a second filled a 1,024 limit. An hour here: only the
    # fix lets them go.
    monkeypatch.setattr(Config, "keep_alive_timeout", 3600)
    async with web_server(agent()) as server:
        host = server.url.removeprefix("http://")
        before = open_fds()
        for _ in range(10):
            with await connect(server):
                pass  # nothing sent
            sock = await connect(server)
            with sock:
                await sock.send(f"GET /api/info HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
                assert (await read_answer(sock)).startswith(b"HTTP/1.1 200")
                await trio.sleep(0.05)  # the server back to waiting for the next request
        with trio.fail_after(10):  # a guard: the server's sockets close at once
            while True:
                if open_fds() <= before:
                    return
                await trio.sleep(0.01)


@pytest.mark.skipif(sys.platform != "linux", reason="sets and reads Linux limits")
async def test_serve_holds_more_connections_than_its_soft_open_file_limit(tmp_path):
    # `serve` started with the soft limit most systems give (1,024; 128 here) ran out of
    # file descriptors under that many connections: it stopped accepting (an `accept
    # returned EMFILE` traceback each 0.1 s) and could not open its own (a turn's call to
    # the model failed to connect). It raises the soft limit to the hard one now.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4 * CONNECTIONS:
        pytest.skip(f"the hard limit of open files ({hard}) leaves no room to raise")
    if soft != resource.RLIM_INFINITY and soft < 2 * CONNECTIONS:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2 * CONNECTIONS, hard))  # the clients'
    errors = tmp_path / "stderr"
    with errors.open("wb") as stderr:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "runtime", "serve", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=partial(resource.setrlimit, resource.RLIMIT_NOFILE, (SOFT_LIMIT, hard)),
        )
    answered = 0
    try:
        with trio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
            host, port = line.decode().split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)
            all_answered = trio.Event()

            async def hold() -> None:
                nonlocal answered
                sock = trio.socket.socket()
                with sock:
                    await sock.connect((host, int(port)))
                    await sock.send(f"GET /api/info HTTP/1.1\r\nhost: {host}\r\n\r\n".encode())
                    assert (await read_answer(sock)).startswith(b"HTTP/1.1 200")
                    answered += 1
                    if answered == CONNECTIONS:
                        all_answered.set()
                    await all_answered.wait()  # every connection held until all are answered

            async with trio.open_nursery() as nursery:
                for _ in range(CONNECTIONS):
                    nursery.start_soon(hold)
    finally:
        proc.kill()
        await proc.wait()
        if soft != resource.RLIM_INFINITY and soft < 2 * CONNECTIONS:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert answered == CONNECTIONS
    assert b"Too many open files" not in errors.read_bytes()


LEAVERS = 100
"""Clients that leave as their answer is written. Before the fix a share of them left
their socket held (144 of 927 in a like run against a busy session; this test failed 3
runs of 3 with the fix undone), so that none is held is not chance."""


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
async def test_a_connection_whose_client_left_while_its_answer_was_written_is_let_go(
    monkeypatch,
):
    # The reader saw the client leave while the answer (here a 409: the session is busy)
    # was still being written; the answer's end then started the keep-alive timer again,
    # for a next request that could no longer come. An hour here, as above.
    monkeypatch.setattr(Config, "keep_alive_timeout", 3600)
    words = [Sleep(0.05), "word "] * 400
    busy = Agent(provider=ScriptedProvider(responder=lambda request: list(words)))
    async with web_server(busy) as server:
        running = await connect(server)
        with running:
            await running.send(chat_request(server, json.dumps(body("busy")).encode()))
            assert (await running.recv(1 << 16)).startswith(b"HTTP/1.1 200")
            before = open_fds()

            async def leave() -> None:
                sock = await connect(server)
                with sock:
                    request = json.dumps(body("busy", "me too")).encode()
                    await sock.send(chat_request(server, request))
                    await sock.recv(1)  # the answer has started: gone

            async with trio.open_nursery() as nursery:
                for _ in range(LEAVERS):
                    nursery.start_soon(leave)
            with trio.fail_after(10):  # a guard: the server's sockets close at once
                while True:
                    if open_fds() <= before:
                        break
                    await trio.sleep(0.01)


CAP = 20
"""The connection cap of :func:`test_connections_past_the_cap_are_refused_at_once`; twice
as many are held against it."""


async def test_connections_past_the_cap_are_refused_at_once_and_logged_at_first_and_at_exit(
    monkeypatch,
):
    # With no cap, connections past the hard limit of open files made Trio's accept loop
    # fail with EMFILE, retry each 0.1 s and log a traceback each time, and every new
    # connection (a real user's too) waited. Past `--max-connections` one is answered
    # 503 and closed at once; the log says so at the first refusal and, for the refusals
    # held since, at shutdown: not once a connection. An hour of keep-alive here: the
    # held connections stay until the test lets them go.
    from structlog.testing import capture_logs

    from runtime import Host
    from runtime.app.web.app import create_app
    from runtime.app.web.serve import serve_app

    monkeypatch.setattr(Config, "keep_alive_timeout", 3600)
    with capture_logs() as logs:
        async with Host.open(log_tap=False) as host, trio.open_nursery() as nursery:
            app = create_app(host, agent())
            binds = await nursery.start(
                partial(serve_app, app, host="127.0.0.1", port=0, max_connections=CAP)
            )
            address = ("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
            held: list[trio.socket.SocketType] = []
            refused = 0
            all_refused = trio.Event()
            with trio.fail_after(20):  # a guard: refusals come at once
                for _ in range(2 * CAP):
                    sock = trio.socket.socket()
                    await sock.connect(address)
                    held.append(sock)

                async def refusal(sock: trio.socket.SocketType) -> None:
                    nonlocal refused
                    data = b""
                    while piece := await sock.recv(1 << 16):
                        data += piece
                    assert data.startswith(b"HTTP/1.1 503"), data
                    refused += 1
                    if refused == CAP:
                        all_refused.set()
                    held.remove(sock)
                    sock.close()

                async with trio.open_nursery() as readers:
                    for sock in held:
                        readers.start_soon(refusal, sock)
                    await all_refused.wait()
                    await trio.sleep(0.2)  # room for a wrong 21st refusal to show
                    readers.cancel_scope.cancel()
            assert (refused, len(held)) == (CAP, CAP)
            held.pop().close()  # one held connection goes: a real request is served
            with trio.fail_after(20):
                while True:
                    sock = trio.socket.socket()
                    with sock:
                        await sock.connect(address)
                        await sock.send(b"GET /api/info HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                        head = await read_answer(sock)
                    if head.startswith(b"HTTP/1.1 200"):
                        break
                    await trio.sleep(0.01)  # the server has not seen the close yet
            for sock in held:
                sock.close()
            nursery.cancel_scope.cancel()
    reached = [line["refused"] for line in logs if line["event"] == "serve.connection_cap_reached"]
    # The first refusal at once, the rest held for the interval, here said at shutdown.
    assert (len(reached), reached[0], sum(reached) >= CAP) == (2, 1, True), reached


async def test_refusals_after_the_last_log_line_are_logged_when_the_server_stops(monkeypatch):
    # The first refusal is logged at once, the next ones within REPORT_INTERVAL are
    # held: before, they reached the log only if another refusal came after it.
    from structlog.testing import capture_logs

    from runtime import Host
    from runtime.app.web.app import create_app
    from runtime.app.web.serve import serve_app

    monkeypatch.setattr(Config, "keep_alive_timeout", 3600)
    with capture_logs() as logs:
        async with Host.open(log_tap=False) as host, trio.open_nursery() as nursery:
            app = create_app(host, agent())
            binds = await nursery.start(
                partial(serve_app, app, host="127.0.0.1", port=0, max_connections=1)
            )
            address = ("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
            with trio.socket.socket() as kept:
                await kept.connect(address)
                with trio.fail_after(20):  # a guard: refusals come at once
                    for _ in range(3):
                        with trio.socket.socket() as sock:
                            await sock.connect(address)
                            while await sock.recv(1 << 16):
                                pass  # the 503, then the close
                nursery.cancel_scope.cancel()
    reached = [line for line in logs if line["event"] == "serve.connection_cap_reached"]
    assert sum(line["refused"] for line in reached) == 3, reached


async def test_refusals_held_within_the_interval_are_logged_once_it_has_passed(autojump_clock):
    from structlog.testing import capture_logs

    from runtime.app.web.connections import REPORT_INTERVAL, ConnectionCap

    cap = ConnectionCap(1)
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cap.report_held)
            assert [cap.admit() for _ in range(4)] == [True, False, False, False]
            await trio.sleep(REPORT_INTERVAL + 1)
            seen = [line["refused"] for line in logs]
            nursery.cancel_scope.cancel()
    assert seen == [1, 2]


@pytest.mark.skipif(sys.platform == "win32", reason="reads the limit of open files")
def test_max_connections_defaults_to_half_the_soft_open_file_limit_and_off_is_none():
    from runtime.app.cli import build_parser
    from runtime.app.web.serve import _max_connections

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    expected = None if soft == resource.RLIM_INFINITY else soft // 2
    parse = build_parser().parse_args
    assert _max_connections(parse(["serve"])) == expected
    assert _max_connections(parse(["serve", "--max-connections", "off"])) is None
    assert _max_connections(parse(["serve", "--max-connections", "20"])) == 20


async def test_a_client_past_the_cap_whose_request_was_sent_reads_the_503_not_a_reset(
    monkeypatch,
):
    # The refusal was written and the socket closed at once, the client's request unread
    # in it: the kernel then sends a reset, and a client that had sent its request before
    # reading (every client) saw "connection reset by peer", not the 503 and its
    # Retry-After. Now the server stops writing, reads and drops what the client sends
    # (up to a bound) until it closes, then closes.
    from runtime import Host
    from runtime.app.web.app import create_app
    from runtime.app.web.serve import serve_app

    monkeypatch.setattr(Config, "keep_alive_timeout", 3600)
    answers = []
    async with Host.open(log_tap=False) as host, trio.open_nursery() as nursery:
        app = create_app(host, agent())
        binds = await nursery.start(
            partial(serve_app, app, host="127.0.0.1", port=0, max_connections=1)
        )
        address = ("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
        with trio.socket.socket() as held, trio.fail_after(20):
            await held.connect(address)
            await held.send(b"GET /api/info HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            assert (await read_answer(held)).startswith(b"HTTP/1.1 200")  # admitted
            payload = json.dumps(body("s", "x" * 16_000_000)).encode()
            for _ in range(10):
                with trio.socket.socket() as sock:
                    await sock.connect(address)
                    request = (
                        b"POST /api/chat HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: "
                        b"application/json\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload
                    )
                    data = b""
                    try:
                        while request:
                            request = request[await sock.send(request) :]
                        while piece := await sock.recv(1 << 16):
                            data += piece
                    except (ConnectionResetError, BrokenPipeError) as exc:
                        data += repr(exc).encode()
                    answers.append(data.split(b"\r\n", 1)[0])
        nursery.cancel_scope.cancel()
    assert answers == [b"HTTP/1.1 503 Service Unavailable"] * 10


async def test_refused_connections_are_read_until_closed_only_up_to_a_bound(autojump_clock):
    # Reading a refused connection until its client closes holds its descriptor up to a
    # second: at most LINGERING of them do; the next ones are closed once written to.
    from runtime.app.web.connections import (
        LINGERING,
        REFUSAL,
        REFUSAL_TIMEOUT,
        ConnectionCap,
        refuse_connection,
    )

    cap = ConnectionCap(1)
    took = []
    for lingering in (0, LINGERING):
        cap.lingering = lingering
        client, server = trio.testing.memory_stream_pair()
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(refuse_connection, server, cap)
            assert await client.receive_some() == REFUSAL  # a client that never closes
        took.append(trio.current_time() - start)
        assert cap.lingering == lingering  # given back
    assert took == [REFUSAL_TIMEOUT, 0]


async def test_one_address_past_its_share_of_the_cap_is_refused_and_another_is_served(
    monkeypatch,
):
    # One client could hold the whole cap (idle connections, slow bodies) and keep every
    # other at 503. Counted by the socket's address: a forwarded-for header naming
    # another is not read (the connection is refused before it is).
    from runtime import Host
    from runtime.app.web.app import create_app
    from runtime.app.web.serve import serve_app

    monkeypatch.setattr(Config, "keep_alive_timeout", 3600)
    async with Host.open(log_tap=False) as host, trio.open_nursery() as nursery:
        app = create_app(host, agent())
        serve = partial(
            serve_app,
            app,
            host="127.0.0.1",
            port=0,
            max_connections=CAP,
            max_connections_per_address=5,
        )
        binds = await nursery.start(serve)
        address = ("127.0.0.1", int(binds[0].rsplit(":", 1)[1]))
        held = []
        with trio.fail_after(20):  # a guard: refusals come at once
            for _ in range(5):
                sock = trio.socket.socket()
                await sock.connect(address)
                held.append(sock)
            answers = []
            for _ in range(3):
                with trio.socket.socket() as sock:
                    await sock.connect(address)
                    await sock.send(
                        b"GET /api/info HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                        b"x-forwarded-for: 203.0.113.9\r\n\r\n"
                    )
                    answers.append(await read_answer(sock))
            with trio.socket.socket() as other:
                await other.bind(("127.0.0.2", 0))  # another client
                await other.connect(address)
                await other.send(b"GET /api/info HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                served = await read_answer(other)
        for sock in held:
            sock.close()
        nursery.cancel_scope.cancel()
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [b"HTTP/1.1 503 Service Unavailable"] * 3
    assert served.startswith(b"HTTP/1.1 200")


@given(st.ip_addresses(v=6), st.integers(0, 2**64 - 1))
def test_an_ipv6_client_is_counted_by_its_64(ip, low):
    from runtime.app.web.connections import address_key

    same_64 = ipaddress.IPv6Address((int(ip) >> 64 << 64) | low)
    if ip.ipv4_mapped is None and same_64.ipv4_mapped is None:
        assert address_key((str(ip), 1, 0, 0)) == address_key((str(same_64), 2, 0, 0))
        assert address_key((str(ip), 1, 0, 0)).endswith("/64")


def test_an_address_key_is_the_ipv4_address_or_none_without_an_ip():
    from runtime.app.web.connections import address_key

    assert address_key(("203.0.113.9", 1)) == "203.0.113.9"
    assert address_key(("::ffff:203.0.113.9", 1, 0, 0)) == "203.0.113.9"  # dual-stack
    assert address_key(("fe80::1%eth0", 1, 0, 2)) == "fe80::/64"
    assert [address_key(peer) for peer in ("", b"", None, ("nope", 1))] == [None] * 4


@pytest.mark.skipif(sys.platform == "win32", reason="reads the limit of open files")
def test_max_connections_per_address_defaults_to_a_quarter_of_the_cap_and_off_is_none():
    from runtime.app.cli import build_parser
    from runtime.app.web.serve import _max_connections_per_address

    parse = build_parser().parse_args
    assert _max_connections_per_address(parse(["serve"]), 400) == 100
    assert _max_connections_per_address(parse(["serve"]), None) is None
    off = parse(["serve", "--max-connections-per-address", "off"])
    assert _max_connections_per_address(off, 400) is None
    given = parse(["serve", "--max-connections-per-address", "7"])
    assert _max_connections_per_address(given, 400) == 7
