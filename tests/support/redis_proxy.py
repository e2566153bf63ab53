"""A fault-injecting TCP proxy between the relay and the test's own Redis.

Runs in the test's Trio loop (:func:`redis_fault_proxy`). Each client connection gets a
connection to Redis of its own and is served in lockstep: one command read from the
client (its RESP bytes, whole), a :class:`Fault` chosen for it by the test's ``decide``,
the command forwarded, its one reply read back from Redis and handed on, unless the
fault says otherwise:

``delay``
    the reply handed on ``seconds`` late;
``fragment``
    the reply handed on byte by byte (a checkpoint between the bytes);
``drop_before``
    the connection closed before the command reaches Redis (nor any after it);
``drop_after``
    the command applied by Redis, the connection closed before its reply is handed on;
``cut``
    the command applied, the first half of its reply handed on, the connection closed;
``stall_before``
    the command never forwarded, the connection held open until the client leaves it
    (a client that never reads what is sent to it, seen from the sender);
``stall_after``
    the command applied, its reply never handed on, the connection held open until the
    client leaves it (a server that never answers);
``refuse``
    the command not forwarded, answered ``-OOM`` (Redis past ``maxmemory``).

Lockstep costs the pipelines their round trips' overlap, not their order or replies:
every command still gets its reply, in order. A connection that subscribes (pub/sub) is
passed through as it is from its ``SUBSCRIBE`` on, until
:meth:`RedisFaultProxy.hold_subscriptions` black-holes it (nothing more either way, the
connection held open on both sides: Redis still counts the subscriber). Every command
seen is recorded (:attr:`RedisFaultProxy.seen`) with the fault it got.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import hiredis
import trio

SUBSCRIBES = frozenset({"SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE"})
"""Commands after which a connection is passed through as it is, without faults: a
subscription's messages come without commands."""
OOM = b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
KINDS = (
    "delay",
    "fragment",
    "drop_before",
    "drop_after",
    "cut",
    "stall_before",
    "stall_after",
    "refuse",
)


@attrs.frozen
class Fault:
    kind: str
    seconds: float = 0.0

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault {self.kind!r}")


@attrs.frozen
class Command:
    """A command the proxy read from a client: its connection (numbered from 0 in the
    order they came), its name (upper case) and its arguments."""

    conn: int
    name: str
    args: tuple[bytes, ...]


Decide = Callable[[Command], Fault | None]


def value_end(buf: bytes | bytearray, at: int = 0) -> int | None:
    """The offset just past the RESP2/RESP3 value that starts at ``at`` in ``buf``;
    ``None`` while it is not all there."""
    eol = buf.find(b"\r\n", at)
    if eol < 0:
        return None
    kind, head, after = buf[at : at + 1], buf[at + 1 : eol], eol + 2
    if kind in (b"$", b"=", b"!"):  # bulk string, verbatim string, bulk error
        size = int(head)
        end = after + size + 2 if size >= 0 else after
        return end if len(buf) >= end else None
    if kind in (b"*", b"~", b">", b"%", b"|"):  # array, set, push, map, attribute
        size = int(head)
        for _ in range(max(size, 0) * (2 if kind in (b"%", b"|") else 1)):
            got = value_end(buf, after)
            if got is None:
                return None
            after = got
        return value_end(buf, after) if kind == b"|" else after  # an attribute prefixes
    if kind in (b"+", b"-", b":", b",", b"#", b"_", b"("):
        return after
    raise ValueError(f"not RESP at {at}: {bytes(buf[at : at + 20])!r}")


class _Peer:
    """One side's byte stream, read a whole RESP value at a time."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def value(self) -> bytes | None:
        """The next whole RESP value; ``None`` when the peer closed (or broke)."""
        while (end := value_end(self.buffer)) is None:
            try:
                data = await self.stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return None
            if not data:
                return None
            self.buffer += data
        value = bytes(self.buffer[:end])
        del self.buffer[:end]
        return value


class RedisFaultProxy:
    """Listens (:func:`redis_fault_proxy`) and serves each connection in lockstep with
    the Redis at ``upstream``, dealing ``decide``'s faults; records every command."""

    def __init__(self, upstream: tuple[str, int], decide: Decide) -> None:
        self.upstream = upstream
        self.decide = decide
        self.port = 0
        self.seen: list[tuple[Command, Fault | None]] = []
        self._ids = itertools.count()
        self._subscribed: dict[int, trio.CancelScope] = {}
        """The pass-through of each connection that subscribed and is not held."""
        self._subscribe_delay = 0.0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def hold_subscriptions(self) -> int:
        """Black-hole every connection that subscribed (the client's bytes dropped, no
        message or reply handed on, both connections kept open); how many."""
        held = len(self._subscribed)
        for scope in self._subscribed.values():
            scope.cancel()
        self._subscribed.clear()
        return held

    def delay_subscriptions(self, seconds: float) -> None:
        """Hold every later ``SUBSCRIBE`` (and the like) ``seconds`` before it goes on to
        Redis: a client that subscribes again is deaf meanwhile. (Not a fault ``decide``
        deals: seeded schedules never see a subscription's commands.)"""
        self._subscribe_delay = seconds

    def faults(self, *names: str) -> list[str]:
        """The kinds of fault dealt so far (to commands named ``names``, or any)."""
        return [f.kind for c, f in self.seen if f is not None and (not names or c.name in names)]

    async def _serve(self, client_stream: trio.SocketStream) -> None:
        conn = next(self._ids)
        try:
            server_stream = await trio.open_tcp_stream(*self.upstream)
        except OSError:
            await trio.aclose_forcefully(client_stream)
            return
        client, server = _Peer(client_stream), _Peer(server_stream)
        try:
            await self._lockstep(conn, client, server)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client left while its reply went out
        finally:
            await trio.aclose_forcefully(server_stream)
            await trio.aclose_forcefully(client_stream)

    async def _lockstep(self, conn: int, client: _Peer, server: _Peer) -> None:
        while True:
            request = await client.value()
            if request is None:
                return
            reader = hiredis.Reader()
            reader.feed(request)
            parsed = reader.gets()
            if not isinstance(parsed, list) or not parsed:
                raise ValueError(f"a client sent {request[:40]!r}, not a command")
            command = Command(conn, parsed[0].decode().upper(), tuple(parsed[1:]))
            if command.name in SUBSCRIBES:  # replies no longer follow commands one to one
                self.seen.append((command, None))
                if self._subscribe_delay:
                    await trio.sleep(self._subscribe_delay)
                await server.stream.send_all(request)
                with trio.CancelScope() as passing:
                    self._subscribed[conn] = passing
                    await _passthrough(client, server)
                self._subscribed.pop(conn, None)
                if passing.cancelled_caught:  # held: a subscription silently dead
                    await _hold(client)
                return
            fault = self.decide(command)
            self.seen.append((command, fault))
            kind = fault.kind if fault is not None else None
            if kind == "drop_before":
                return
            if kind == "stall_before":
                await _hold(client)
                return
            if kind == "refuse":
                await client.stream.send_all(OOM)
                continue
            await server.stream.send_all(request)
            reply = await server.value()
            if reply is None or kind == "drop_after":
                return
            if kind == "cut":
                await client.stream.send_all(reply[: len(reply) // 2])
                return
            if kind == "stall_after":
                await _hold(client)
                return
            if fault is not None and kind == "delay":
                await trio.sleep(fault.seconds)
            if kind == "fragment":
                for byte in range(len(reply)):
                    await client.stream.send_all(reply[byte : byte + 1])
                    await trio.lowlevel.checkpoint()
            else:
                await client.stream.send_all(reply)


async def _passthrough(client: _Peer, server: _Peer) -> None:
    """Bytes both ways as they come, until either side closes."""

    async def pump(source: _Peer, sink: _Peer, done: trio.CancelScope) -> None:
        try:
            if source.buffer:
                await sink.stream.send_all(bytes(source.buffer))
                source.buffer.clear()
            while data := await source.stream.receive_some(65536):
                await sink.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, client, server, nursery.cancel_scope)
        nursery.start_soon(pump, server, client, nursery.cancel_scope)


async def _hold(client: _Peer) -> None:
    """Keep the connection open, reading and dropping whatever the client sends, until it
    leaves it."""
    while True:
        try:
            data = await client.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return


@asynccontextmanager
async def redis_fault_proxy(
    upstream: tuple[str, int], decide: Decide
) -> AsyncIterator[RedisFaultProxy]:
    """A :class:`RedisFaultProxy` listening on a free port of 127.0.0.1 while the block
    runs; its connections are cut when it ends."""
    proxy = RedisFaultProxy(upstream, decide)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, proxy._serve, 0, host="127.0.0.1")
        )
        proxy.port = listeners[0].socket.getsockname()[1]
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()


def scripted(faults: dict[tuple[str, int], Fault]) -> Decide:
    """A ``decide`` dealing ``faults[(name, n)]`` to the ``n``-th command named ``name``
    (from 1, over every connection); nothing to any other."""
    counts: dict[str, int] = {}

    def decide(command: Command) -> Fault | None:
        counts[command.name] = counts.get(command.name, 0) + 1
        return faults.get((command.name, counts[command.name]))

    return decide


__all__ = [
    "KINDS",
    "Command",
    "Fault",
    "RedisFaultProxy",
    "redis_fault_proxy",
    "scripted",
    "value_end",
]
