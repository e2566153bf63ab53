"""What a connection costs the ``serve`` process: its socket held no longer than it is
used, and room for many of them.

Imported only when serving (it imports Hypercorn). Each found by holding, churning
or starving connections against ``serve`` (docs/web.md, "Connections"):

* :func:`release_connections_on_close`: Hypercorn (0.18) kept the socket of a
  connection whose client had closed it, and that connection's two tasks, until its
  keep-alive timer ran out (5 s), because the timer was still running when the reader
  saw the end of the stream. Every client that sent a request, read the answer and
  closed its connection a moment later (a client that pools no connections, a browser
  tab closed, a load balancer's health check) cost the server a file descriptor for
  5 s: 200 such requests a second filled a default limit of 1,024, and the server
  stopped accepting connections and could not open its own (a turn's call to the model
  failed with "all attempts to connect ... failed").
* :func:`raise_open_file_limit`: ``serve`` raises its soft limit of open files to the
  hard one (Go's runtime does the same for every program), so a few thousand
  connections, idle or slow ones an attacker holds (up to the 5 s keep-alive for a
  request's head, ``--body-timeout`` for its body), cannot exhaust the 1,024 most
  systems give a process by default.
* :class:`ConnectionCap`: ``serve`` holds at most ``--max-connections`` connections
  (default: half its soft limit of open files, the rest left to the server's own
  sockets and files: its calls to the model, the store, MCP servers). One past the cap is
  accepted, answered a 503 at once, what it sends read and dropped for up to a second
  (so that it reads the 503, not a reset) and closed. Without a cap, past
  the hard limit Trio's accept loop retried each 0.1 s, logging a traceback each time,
  and every new connection, a real user's too, waited until some closed.
* :func:`probe_head`: a health probe (``GET``/``HEAD`` of ``/healthz`` or ``/readyz``)
  is still answered past the cap, on a connection of :data:`PROBE_ROOM` kept for
  them: refused like any other, a kubelet's liveness probe made the orchestrator
  restart a server that was only busy. Such a connection carries the probe and
  nothing else (:class:`OneRequestStream`), then is closed. Connections that send
  nothing (or no probe's request line) do not keep a probe out: the newest takes the
  place of the oldest (:meth:`ConnectionCap.make_room`).
* :attr:`CappedConfig.send_timeout`: every write to a connection, whoever makes it, is
  given up when its client takes nothing of it for ``--send-timeout`` (twice in a row),
  and the connection closed: Starlette's 500 and Hypercorn's own answers were written
  outside the app's deadline, shielded, and held their task for as long as a client that
  read nothing kept the connection.
"""

from __future__ import annotations

import ipaddress
import struct
from typing import Any

try:
    import fcntl
    import resource
    import termios
except ImportError:  # pragma: no cover - Windows has no limit of open files
    fcntl = None  # type: ignore[assignment]
    resource = None  # type: ignore[assignment]

import trio
from hypercorn.config import Config
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer

from runtime.logging import get_logger

OPEN_FILES_FALLBACK = 10240
"""The soft limit tried when the hard one cannot be set: macOS refuses more than
``OPEN_MAX`` (10,240) however high its hard limit, which it reports as unlimited."""


CONNECTIONS_SHARE = 2
"""The default cap is the soft limit of open files divided by this: half the process's
descriptors for connections, half for what serving them opens (a turn's call to the
model, the store, MCP servers' pipes, logs)."""

REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\n"
    b"retry-after: 1\r\n"
    b"connection: close\r\n\r\n"
    b"too many connections\n"
)
"""What a connection past the cap is sent before it is closed: written at once, the
client's request read only to be dropped (:func:`refuse_connection`)."""

REFUSAL_TIMEOUT = 1.0
"""Seconds the refusal may take to write, and to read what the client still sends
(:func:`refuse_connection`): a fresh socket's buffer takes it at once."""

LINGERING = 64
"""Refused connections read until their client closes at most at once: past these, one
is closed as soon as the refusal is written, so a flood of connections past the cap
holds no more than this many descriptors beyond it, a second each."""

PROBE_PATHS = frozenset({b"/healthz", b"/readyz"})
"""The paths answered past the cap (:func:`probe_head`): the health probes'
(:mod:`runtime.app.web.health`)."""

PROBE_ROOM = 8
"""Probes served past the cap at once (a kubelet sends two or three a container each
few seconds); one more past the cap gets the 503."""

PROBE_HEAD_MAX = 4096
"""Bytes a probe's request head may take (a kubelet's is about 150)."""

PROBE_READ_TIMEOUT = 0.5
"""Seconds a connection past the cap is given to send its request's head before it is
refused: a prober sends it at once; only a client that sends nothing (or a slow
attacker) waits this long for its 503."""

PROBE_READS = 64
"""Connections past the cap whose head is being read at once (:func:`probe_head`), to
find the probes among them; one more takes the place of the oldest that has not sent a
probe's request line yet (:meth:`ConnectionCap.make_room`), or gets the 503 when none
can give way."""

REPORT_INTERVAL = 60.0
"""Seconds between two log lines saying connections were refused: one line a burst,
not one a connection (which an attacker could use to fill the log)."""


ADDRESS_SHARE = 4
"""The default per-address cap is the connection cap divided by this: one address (an
IPv6 /64) holds at most a quarter of it, so the rest stays for everyone else."""


def address_key(peer: Any) -> str | None:
    """What the per-address cap counts a connection under, from its socket's peer
    address (never a header: ``X-Forwarded-For`` is the client's own word, and comes
    after the connection is admitted): an IPv4 address (an IPv4-mapped IPv6 one as its
    IPv4), an IPv6 address's /64 (one host is given a /64; counted per address, it
    could open a connection from each of 2**64); ``None`` for a peer with no IP address
    (a Unix socket: a local proxy), which is not counted."""
    host = peer[0] if isinstance(peer, tuple) and peer else peer
    if not isinstance(host, str) or not host:
        return None
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return f"{ipaddress.IPv6Network((ip, 64), strict=False).network_address}/64"
    return str(ip)


def default_max_connections() -> int | None:
    """The connection cap derived from this process's soft limit of open files now (call
    it after :func:`raise_open_file_limit`); ``None`` (no cap) where there is no limit."""
    if resource is None:  # pragma: no cover - Windows
        return None
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft // CONNECTIONS_SHARE)


class ConnectionCap:
    """How many connections one server holds, and the refusals past ``limit``: a
    connection is admitted while fewer than ``limit`` are open, else refused and counted;
    the count is logged at most once each :data:`REPORT_INTERVAL` (its first at once).
    Refusals within the interval are held and logged when it has passed
    (:meth:`report_held`), or at shutdown: before, those of a burst's last interval were
    never logged unless another refusal came after it. Mutable, owned by one server's
    event loop."""

    __slots__ = (
        "_held",
        "by_address",
        "limit",
        "lingering",
        "open",
        "per_address",
        "probes",
        "reading",
        "refused",
        "reported_at",
    )

    def __init__(self, limit: int, per_address: int | None = None) -> None:
        self.limit = limit
        self.per_address = per_address
        """The most connections one address (:func:`address_key`) holds (``None``: no
        such cap): without it, one client could hold the whole cap and keep every other
        at 503."""
        self.by_address: dict[str, int] = {}
        """Connections open per address, for those with any."""
        self.open = 0
        self.lingering = 0
        """Refused connections being read until their client closes (:data:`LINGERING`)."""
        self.reading: dict[HeadRead, None] = {}
        """Connections past the cap whose head is being read (:func:`probe_head`), the
        oldest first (:data:`PROBE_READS`)."""
        self.probes = 0
        """Probes being served past the cap (:data:`PROBE_ROOM`)."""
        self.refused = 0
        """Refusals since the last log line."""
        self.reported_at: float | None = None
        self._held = trio.Event()
        """Set when refusals are held for the next line (:meth:`report_held` waits)."""

    def admit(self, address: str | None = None) -> bool:
        """Whether a new connection (from ``address``, :func:`address_key`) may be served
        (then it counts until :meth:`release` of the same address); a refusal is
        counted, and logged when none was for :data:`REPORT_INTERVAL`."""
        if self.open < self.limit:
            if address is None or self.per_address is None:
                self.open += 1
                return True
            held = self.by_address.get(address, 0)
            if held < self.per_address:
                self.by_address[address] = held + 1
                self.open += 1
                return True
        self.refused += 1
        now = trio.current_time()
        if self.reported_at is None or now - self.reported_at >= REPORT_INTERVAL:
            self._report(now)
        else:
            self._held.set()
        return False

    def make_room(self) -> bool:
        """Whether a head may be read (:func:`probe_head`): fewer than
        :data:`PROBE_READS` are, or the oldest read whose request line is not a probe's
        yet (a connection that sent nothing, or part of a line) gave way, its read
        cancelled (then it is refused). Before, these reads shared the refusals'
        :data:`LINGERING` room, and 64 connections that opened and sent nothing filled it
        for a second and a half each (the read, then the refusal's linger): a kubelet's
        probe meanwhile got the 503, so a client that sends nothing could have a busy pod
        restarted. A probe sends its head as it connects: to be made to give way, more
        than :data:`PROBE_READS` connections must come after it before its head does."""
        if len(self.reading) < PROBE_READS:
            return True
        for read in self.reading:
            if not read.probe_line:
                del self.reading[read]
                read.scope.cancel()
                return True
        return False

    def release(self, address: str | None = None) -> None:
        """An admitted connection (from ``address``, as admitted) is over."""
        self.open -= 1
        if address is not None and self.per_address is not None:
            held = self.by_address[address] - 1
            if held:
                self.by_address[address] = held
            else:
                del self.by_address[address]

    async def report_held(self) -> None:
        """Log refusals held within an interval once it has passed, and those held at
        shutdown (this task cancelled): run for as long as the server is."""
        try:
            while True:
                await self._held.wait()
                assert self.reported_at is not None  # held only after a line
                await trio.sleep_until(self.reported_at + REPORT_INTERVAL)
                if self.refused:
                    self._report(trio.current_time())
                else:  # a refusal after the interval logged them already
                    self._held = trio.Event()
        finally:
            if self.refused:
                self._report(trio.current_time())

    def _report(self, now: float) -> None:
        """Log the refusals since the last line, and start counting anew."""
        get_logger("axon.web").warning(
            "serve.connection_cap_reached",
            max_connections=self.limit,
            max_connections_per_address=self.per_address,
            refused=self.refused,
            hint="connections past --max-connections (or one address's past "
            "--max-connections-per-address) get 503 and are closed",
        )
        self.reported_at = now
        self.refused = 0
        self._held = trio.Event()


class HeadRead:
    """One head being read past the cap (:func:`probe_head`, :attr:`ConnectionCap.reading`):
    its read's cancel scope, and whether the request line it has sent is a probe's (then
    it gives way to no other)."""

    __slots__ = ("probe_line", "scope")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.probe_line = False


class CappedConfig(Config):
    """Hypercorn's configuration with the server's :class:`ConnectionCap` (``None``:
    connections are not counted) and the longest a write may wait for the socket
    (:attr:`send_timeout`), read by :class:`ReleasingTCPServer`."""

    connection_cap: ConnectionCap | None = None
    send_timeout: float | None = None
    """Seconds a write to a connection may wait for its client to take any of it; past
    that (twice in a row: :meth:`ReleasingTCPServer._send_within`) the connection is
    closed (``None``: no limit). The app bounds its own answers
    (:class:`~runtime.app.web.writer.SendDeadline`); this bounds what is written outside
    it: Starlette's 500 for a route that raised, Hypercorn's own answers (400 for a bad
    request, 100 Continue, 500 for an app that answered nothing). Hypercorn writes each
    shielded from cancellation, so a client that read nothing held the writing task, the
    connection's reader for the answers Hypercorn writes itself, for as long as it kept
    the connection open."""


async def refuse_connection(stream: Any, cap: ConnectionCap | None = None) -> None:
    """Answer a connection past the cap with :data:`REFUSAL` and close it. Closing a
    socket with unread data in it sends a reset, and a client still sending its request
    (a body larger than the buffers between them, a 16 MB one on loopback) saw
    "connection reset by peer" instead of the 503 and its ``Retry-After``. So the
    server stops writing and reads and drops what the client sends until it closes
    (a "lingering close", as nginx and Apache do), all of it within
    :data:`REFUSAL_TIMEOUT`, and for at most :data:`LINGERING` such connections of
    ``cap`` at once; past those it closes at once: its descriptor is back within a
    second, whatever the client does."""
    with trio.move_on_after(REFUSAL_TIMEOUT):
        try:
            await stream.send_all(REFUSAL)
            if cap is not None and cap.lingering < LINGERING:
                cap.lingering += 1
                try:
                    await stream.send_eof()
                    while await stream.receive_some(1 << 16):
                        pass
                finally:
                    cap.lingering -= 1
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the client is gone already
    await trio.aclose_forcefully(stream)


def is_probe(head: bytes) -> bool:
    """Whether ``head`` (a request's head, up to its blank line, nothing after) is a
    health probe's: ``GET`` or ``HEAD`` of a :data:`PROBE_PATHS` path (a query allowed),
    HTTP/1.0 or 1.1, with no body (no ``content-length`` but 0, no
    ``transfer-encoding``) and no ``upgrade``. Anything else is not answered past the
    cap, whatever it would be."""
    lines = head.split(b"\r\n")
    if not is_probe_line(lines[0]):
        return False
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon and line:
            return False
        name = name.strip().lower()
        if name in (b"transfer-encoding", b"upgrade"):
            return False
        if name == b"content-length" and value.strip() != b"0":
            return False
    return True


def is_probe_line(line: bytes) -> bool:
    """Whether ``line`` (a request line, without its end) is a probe's: ``GET`` or
    ``HEAD`` of a :data:`PROBE_PATHS` path (a query allowed), HTTP/1.0 or 1.1."""
    parts = line.split(b" ")
    if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
        return False
    return parts[1].partition(b"?")[0] in PROBE_PATHS and parts[2] in (b"HTTP/1.1", b"HTTP/1.0")


async def probe_head(stream: Any, cap: ConnectionCap) -> bytes | None:
    """The head of a health probe (:func:`is_probe`) sent on ``stream``, a connection
    past the cap, to be served all the same (:class:`OneRequestStream`); ``None`` for
    anything else (the caller refuses it: what was read is dropped, as a refused
    connection's request is). Read for at most :data:`PROBE_READ_TIMEOUT` and
    :data:`PROBE_HEAD_MAX` bytes, while :data:`PROBE_ROOM` probes are not being served
    already and there is room to read it (:meth:`ConnectionCap.make_room`): past either
    the connection is refused at once. Refused as soon as its request line is not a
    probe's; a read whose line is not a probe's yet may be cut short by a newer
    connection's (refused then). A head followed by anything (a body, a pipelined
    request) is no probe."""
    if cap.probes >= PROBE_ROOM or not cap.make_room():
        return None
    read = HeadRead(trio.CancelScope(deadline=trio.current_time() + PROBE_READ_TIMEOUT))
    cap.reading[read] = None
    data = b""
    try:
        with read.scope:
            while b"\r\n\r\n" not in data and len(data) <= PROBE_HEAD_MAX:
                piece = await stream.receive_some(PROBE_HEAD_MAX + 1)
                if not piece:
                    return None
                data += piece
                if not read.probe_line and b"\r\n" in data:
                    if not is_probe_line(data.partition(b"\r\n")[0]):
                        return None  # no probe: refused now, not when the head ends
                    read.probe_line = True
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        return None
    finally:
        cap.reading.pop(read, None)
    head, end, rest = data.partition(b"\r\n\r\n")
    if not end or rest or len(data) > PROBE_HEAD_MAX or not is_probe(head):
        return None
    return data


class OneRequestStream:
    """A connection past the cap as Hypercorn reads it for the probe it carries
    (:func:`probe_head`): the head already read, then nothing more, ever (what the
    client sends after is left unread: a request pipelined behind the probe is not
    served), until the connection is closed; writes go to the socket. The server
    closes it once the probe's answer is written (:class:`ReleasingTCPServer`)."""

    def __init__(self, stream: Any, head: bytes) -> None:
        self.stream = stream
        self.socket = stream.socket
        self._head: bytes | None = head
        self._closed = trio.Event()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        head, self._head = self._head, None
        if head is not None:
            return head
        await self._closed.wait()
        raise trio.ClosedResourceError

    async def send_all(self, data: Any) -> None:
        await self.stream.send_all(data)

    async def send_eof(self) -> None:
        await self.stream.send_eof()

    async def aclose(self) -> None:
        self._closed.set()
        await self.stream.aclose()


class ReleasingTCPServer(TCPServer):
    """Hypercorn's Trio connection, which stops its keep-alive timer once the client has
    closed the connection (or it could not be read), and starts none after, so that its
    socket is closed as soon as its answers are over, not when the timer runs out."""

    releases_on_close = True
    reading_over = False
    """Whether the reader has ended: no further request can come."""
    probe_only = False
    """Whether this connection came past the cap and carries one health probe
    (:func:`probe_head`): closed once its answer is written."""

    async def run(self) -> None:
        cap = getattr(self.config, "connection_cap", None)
        if cap is None:
            await super().run()
            return
        address = None
        if cap.per_address is not None:
            stream = getattr(self.stream, "transport_stream", self.stream)  # TLS: under it
            try:
                address = address_key(stream.socket.getpeername())
            except (AttributeError, OSError):  # gone already, or no socket to ask
                address = None
        if not cap.admit(address):
            head = await probe_head(self.stream, cap)
            if head is None:
                await refuse_connection(self.stream, cap)
                return
            cap.probes += 1
            try:
                self.probe_only = True
                self.stream = OneRequestStream(self.stream, head)  # type: ignore[assignment]
                await super().run()
            finally:
                cap.probes -= 1
            return
        try:
            await super().run()
        finally:
            cap.release(address)

    async def _read_data(self) -> None:
        await super()._read_data()
        # The reader has handed the protocol the close; what is left of the connection
        # is the answers being written (each ends on its own), then the socket's close.
        self.reading_over = True
        await self.idle_task.stop()

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated) and event.idle and self.reading_over:
            # An answer ended after the client had left (a stream, an answer written
            # while the close came in): there is no next request to wait for.
            return
        if isinstance(event, Updated) and event.idle and self.probe_only:
            # The probe answered past the cap: its connection carries nothing more.
            await self.stream.aclose()
            return
        timeout = getattr(self.config, "send_timeout", None)
        if isinstance(event, RawData) and timeout:
            await self._send_within(event.data, timeout)
            return
        await super().protocol_send(event)

    async def _send_within(self, data: bytes, patience: float) -> None:
        """Hypercorn's write of ``data`` (shielded: the app's cancellation cannot cut an
        answer in half), given up when the client takes nothing for ``patience`` seconds:
        the connection is then closed, which ends its reader and its answer's task as a
        client that left does. Written with the socket's own ``send`` (a call a wait for
        room, as ``send_all`` does), each wait bounded; one that runs out while the
        client still acknowledged bytes (:func:`_unsent` fell) waits on, so a slow
        client that reads a large answer gets all of it (the kernel wakes a writer only
        once a third of its buffer, up to megabytes, is free). A TLS stream (no plain
        socket) is written as Hypercorn writes it."""
        sock = getattr(self.stream, "socket", None)
        if sock is None:
            await super().protocol_send(RawData(data=data))
            return
        async with self.send_lock:
            try:
                with memoryview(data) as view:
                    sent = 0
                    unsent: int | None = None
                    while sent < len(view):
                        with trio.CancelScope(shield=True) as scope:
                            scope.deadline = trio.current_time() + patience
                            sent += await sock.send(view[sent:])
                        if not scope.cancelled_caught:
                            unsent = None  # the socket took some: measure anew
                        else:
                            unsent, before = _unsent(sock), unsent
                            if unsent is None or (before is not None and unsent >= before):
                                await trio.aclose_forcefully(self.stream)
                                await self.protocol.handle(Closed())
                                return
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                await self.protocol.handle(Closed())


def _unsent(sock: Any) -> int | None:
    """Bytes written to ``sock`` its peer has not acknowledged yet (Linux's ``TIOCOUTQ``;
    ``None`` where it cannot be read)."""
    if fcntl is None or not hasattr(termios, "TIOCOUTQ"):
        return None
    try:
        answer = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(4))
    except OSError:
        return None
    return int(struct.unpack("i", answer)[0])


def release_connections_on_close() -> None:
    """Make Hypercorn's Trio worker serve each connection with :class:`ReleasingTCPServer`
    (once per process; a Hypercorn whose connection class no longer has the reader and
    timer this relies on is left as it is)."""
    current: Any = hypercorn_run.TCPServer
    if getattr(current, "releases_on_close", False):
        return
    if current is not TCPServer or not hasattr(TCPServer, "_read_data"):
        return  # not the class this was written against: leave it alone
    hypercorn_run.TCPServer = ReleasingTCPServer  # type: ignore[misc]


def raise_open_file_limit() -> int | None:
    """Raise this process's soft limit of open files (sockets included) to its hard
    limit, or to :data:`OPEN_FILES_FALLBACK` where the hard one is refused; the limit in
    force after, ``None`` where there is none to raise (Windows)."""
    if resource is None:  # pragma: no cover - Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, OPEN_FILES_FALLBACK):
        if soft == resource.RLIM_INFINITY or (target != resource.RLIM_INFINITY and target <= soft):
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        break
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


__all__ = [
    "CappedConfig",
    "ConnectionCap",
    "HeadRead",
    "OneRequestStream",
    "ReleasingTCPServer",
    "address_key",
    "default_max_connections",
    "is_probe",
    "is_probe_line",
    "probe_head",
    "raise_open_file_limit",
    "release_connections_on_close",
]
