"""A streaming response written from a task of its own, so a stuck client cannot hold it.

Hypercorn's ``send`` waits (shielded from cancellation) until the socket takes the data:
a client that stops reading blocks whoever calls it, for good. If the request's own task
called it, that task could neither notice nor give up, and the turn behind the stream
would go on producing into memory. :class:`BodyWriter` makes the calls from another
task instead, through a bounded queue. The request task hands it data; when the queue
has stayed full for ``timeout`` seconds (the client took nothing in that time), the
request task is told, cancels the turn and returns, and Hypercorn then closes the
connection, which also frees the writer's blocked call.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import trio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

QUEUED = 64
"""Pieces (one SSE event each, usually) queued for the writer; what waits beyond that is
held back by the turn's own bounded pipeline."""
QUEUED_BYTES = 512 * 1024
"""Bytes queued for the writer, whatever the pieces: a piece may be a relay read of
thousands of events (a queued turn's stream), and 64 of those held a whole 10 MB answer
for a client that reads nothing. A piece is taken while less than this is queued, so one
piece larger than it still goes."""

NOT_READING = "client not reading"
DISCONNECTED = "client disconnected"

Write = Callable[[bytes], Awaitable[None]]
"""``await write(data)``: one piece of a response's body, for a :class:`BodyPump`."""


class BodyWriter:
    """Sends ``start`` (an ``http.response.start`` message), then the queued body pieces,
    merged into one ``send`` when several are waiting. Run :meth:`run` in a nursery that
    outlives the request (see :attr:`runtime.app.web.app.WebState.background`)."""

    def __init__(self, send: Send, start: dict[str, Any], *, timeout: float | None) -> None:
        self.send = send
        self.start = start
        self.timeout = math.inf if timeout is None or timeout <= 0 else timeout
        self.finished = trio.Event()
        """Set when the writer is done: the body was completed, or it gave up."""
        self.stalled = False
        """A piece waited ``timeout`` seconds for room: the client is not reading."""
        self._abandoned = False
        self._queue, self._pieces = trio.open_memory_channel[bytes](QUEUED)
        self._queued = 0
        """Bytes in the queue (:data:`QUEUED_BYTES`)."""
        self._room = trio.Event()
        """Set when the writer takes pieces from the queue, or stops."""

    @classmethod
    def ok(cls, send: Send, headers: Mapping[str, str], *, timeout: float | None) -> BodyWriter:
        """A writer of a ``200`` response with ``headers``."""
        encoded = [(k.encode(), v.encode()) for k, v in headers.items()]
        start = {"type": "http.response.start", "status": 200, "headers": encoded}
        return cls(send, start, timeout=timeout)

    async def run(self) -> None:
        try:
            await self.send(self.start)
            async with self._pieces:
                while True:
                    try:
                        pieces = [await self._pieces.receive()]
                    except trio.EndOfChannel:
                        break
                    while True:
                        try:
                            pieces.append(self._pieces.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    self._queued -= sum(map(len, pieces))
                    self._room.set()
                    if self._abandoned:
                        return
                    await self.send(
                        {"type": "http.response.body", "body": b"".join(pieces), "more_body": True}
                    )
            if not self._abandoned:
                await self.send({"type": "http.response.body", "body": b"", "more_body": False})
        except Exception:  # the connection is gone: there is nothing left to write to
            pass
        finally:
            self._abandoned = True
            self._room.set()
            self.finished.set()

    async def write(self, data: bytes) -> bool:
        """Queue ``data``; ``False`` when it cannot be: the client took nothing for
        ``timeout`` seconds (:attr:`stalled`), or the writer has stopped."""
        if self._abandoned:
            return False
        if self._queued < QUEUED_BYTES:
            try:
                self._queue.send_nowait(data)
                self._queued += len(data)
                return True
            except trio.WouldBlock:
                pass
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return False
        with trio.move_on_after(self.timeout):
            while self._queued >= QUEUED_BYTES:
                self._room = trio.Event()  # one producer: the request's task
                await self._room.wait()
                if self._abandoned:
                    return False
            try:
                await self._queue.send(data)
                self._queued += len(data)
                return True
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return False
        self.stalled = True
        return False

    async def close(self) -> bool:
        """Complete the body once everything queued is sent; ``False`` (and the rest
        dropped) when that takes more than ``timeout`` seconds."""
        self._queue.close()
        with trio.move_on_after(self.timeout):
            await self.finished.wait()
            return True
        self.stalled = True
        self.abandon()
        return False

    def abandon(self) -> None:
        """Write nothing more (the client is gone or stuck); the writer ends as soon as
        its current ``send`` returns."""
        self._abandoned = True
        self._queue.close()
        self._room.set()


class SendDeadline:
    """ASGI middleware: every response that is not an event stream (a JSON answer, an
    error, a page) is sent from a task of the app's ``background`` nursery, each send
    waited for at most ``send_timeout`` seconds, as :class:`BodyWriter` bounds a
    stream's. Hypercorn's ``send`` waits (shielded) until the socket takes the data, so a
    client that sends a request and never reads a large answer (``GET
    /api/sessions/{id}`` of a long session) held the request's task for as long as its
    connection lived; now the task gives up after the deadline, drops what is left, and
    returns, and Hypercorn closes the connection. Small answers too, and their headers:
    they went straight from the request's task while they fitted a socket's buffer (64
    KiB), but a client that pipelines requests and reads nothing fills that buffer with
    the answers before, and the next one's send then held its task, and its answer, for
    good (256 pipelined 32 KB answers: every one was still delivered to a client that
    came back to read after twice the deadline; branch ``deadlinecli``). The
    ``http.response.start`` message is held and sent with the body's first piece, in
    one task. Event streams write through their own :class:`BodyWriter` and pass
    straight through. ``state`` is the app's :class:`~runtime.app.web.app.WebState`
    (``send_timeout``, ``background``, read at each request: the nursery exists only
    while the app's lifespan runs)."""

    def __init__(self, app: ASGIApp, *, state: Any) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        background = self.state.background
        timeout = self.state.send_timeout
        if scope["type"] != "http" or background is None or not timeout or timeout <= 0:
            await self.app(scope, receive, send)
            return
        bounded = _BoundedSend(send, receive, background, timeout)
        scope[SEND_DEADLINE] = bounded  # (for :func:`streams_bounded`)
        await self.app(scope, receive, bounded)


SEND_DEADLINE = "axon.send_deadline"
"""The scope key of a request's :class:`SendDeadline` send (:func:`streams_bounded`)."""


@contextmanager
def streams_bounded(scope: Scope) -> Iterator[None]:
    """Within the block, the request's event streams are bounded too, as
    :class:`SendDeadline` bounds its other answers: for an endpoint that writes its event
    streams itself, not through a :class:`BodyWriter` (``/mcp``: the ``mcp`` package's
    transport). A send not taken within ``send_timeout`` drops the rest and cancels the
    block, so the request's task returns and Hypercorn closes the connection. Before, an
    MCP client that called the agent and read nothing held the answer (12 MB of a long
    one: the text and its structured copy) and the request's task for as long as it kept
    the connection, and got all of it when it came back (branch ``deadlinecli``). Without
    a send deadline (none, or no lifespan) the block runs as it is."""
    with trio.CancelScope() as cancel:
        bounded = scope.get(SEND_DEADLINE)
        if isinstance(bounded, _BoundedSend):
            bounded.streams = cancel
        yield


_END: Message = {"type": "http.response.body", "body": b"", "more_body": False}


class _BoundedSend:
    """One response's ``send`` for :class:`SendDeadline`."""

    def __init__(
        self, send: Send, receive: Receive, background: trio.Nursery, timeout: float
    ) -> None:
        self.send = send
        self.receive = receive
        self.background = background
        self.timeout = timeout
        self.direct = False
        """An event stream: its own writer bounds it."""
        self.stalled = False
        """A send waited ``timeout`` seconds: the rest of the response is dropped."""
        self.start: Message | None = None
        """The response's start, held until its body's first piece goes with it."""
        self.streams: trio.CancelScope | None = None
        """Set by :func:`streams_bounded`: an event stream is bounded too, and a send
        not taken in time cancels this scope (the endpoint's call)."""

    async def __call__(self, message: Message) -> None:
        if self.direct:
            await self.send(message)
            return
        if self.stalled:
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.streams is not None and _is_event_stream(message):
                await self._bounded([message])  # at once: a stream's headers are not held
            elif _is_event_stream(message):
                self.direct = True
                await self.send(message)
            else:
                self.start = message
            return
        if kind != "http.response.body":  # (trailers; a pathsend, were one advertised)
            start, self.start = self.start, None
            if start is not None:
                await self._bounded([start])
                if self.stalled:
                    return
            await self.send(message)
            return
        start, self.start = self.start, None
        messages = [] if start is None else [start]
        if message.get("body") or start is None:
            messages.append(
                {"type": "http.response.body", "body": message["body"], "more_body": True}
            )
        await self._bounded(messages)
        if not self.stalled and not message.get("more_body", False):
            await self._end()

    async def _end(self) -> None:
        """The response's end, sent while the rest of the request is read and dropped:
        ending it (Hypercorn's ``StreamClosed``) hands the app an ``http.disconnect``,
        which waits for room in the request's queue, full when the app answered without
        reading the body (a refusal). Sent from the request's task that was a race the
        end mostly won; from a writer's task without the drain it mostly lost, and the
        connection hung. Bounded as the rest: a chunked body's end is bytes too."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._drain)
            await self._bounded([_END])
            nursery.cancel_scope.cancel()

    async def _drain(self) -> None:
        while (await self.receive())["type"] != "http.disconnect":
            pass

    async def _bounded(self, messages: list[Message]) -> None:
        done = trio.Event()
        failed: list[BaseException] = []

        async def deliver() -> None:
            try:
                for message in messages:
                    await self.send(message)
            except Exception as exc:  # the caller's, as its own send would have raised it
                failed.append(exc)
            finally:
                done.set()

        self.background.start_soon(deliver)
        with trio.move_on_after(self.timeout):
            await done.wait()
            if failed:
                raise failed[0]
            return
        self.stalled = True
        if self.streams is not None:
            self.streams.cancel()


def _is_event_stream(start: Message) -> bool:
    for name, value in start.get("headers", ()):
        if name.lower() == b"content-type":
            return bytes(value).split(b";")[0].strip().lower() == b"text/event-stream"
    return False


class BodyPump:
    """Writes a streaming body through a :class:`BodyWriter` while watching the client:
    a keep-alive comment after ``keepalive`` seconds without a write (``0``: none), and
    the body cut short (its task cancelled) when the client disconnects or stops reading
    (:attr:`left` says which). Each streaming response that outlives its turn (a queued
    turn's, a resumed one's) pumps its body this way."""

    def __init__(self, writer: BodyWriter, keepalive: float) -> None:
        self.writer = writer
        self.keepalive = keepalive
        self.left: str | None = None
        """Why the client's stream ended early (it left, it stopped reading), if it did."""
        self._last_write = trio.current_time()
        self._scope = trio.CancelScope()

    async def write(self, data: bytes) -> None:
        """Queue ``data`` for the client; nothing once it has left."""
        if self.left is not None:
            return
        if not await self.writer.write(data):
            self.left = NOT_READING if self.writer.stalled else DISCONNECTED
            self._scope.cancel()
        self._last_write = trio.current_time()

    async def run(self, receive: Receive, body: Callable[[Write], Awaitable[None]]) -> None:
        """Run ``body(write)`` until it returns or the client leaves."""
        self._last_write = trio.current_time()
        async with trio.open_nursery() as nursery:
            self._scope = nursery.cancel_scope
            nursery.start_soon(self._watch_disconnect, receive)
            if self.keepalive:
                nursery.start_soon(self._keep_alive)
            await body(self.write)
            nursery.cancel_scope.cancel()

    async def _watch_disconnect(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.left = self.left or DISCONNECTED
        self._scope.cancel()

    async def _keep_alive(self) -> None:
        while True:
            await trio.sleep_until(self._last_write + self.keepalive)
            if trio.current_time() >= self._last_write + self.keepalive:
                await self.write(b": keep-alive\n\n")
