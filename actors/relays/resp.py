"""A bare RESP2 connection for the relay writers' pipelines (issue 24).

RESP is packed and parsed by ``hiredis`` (the Redis project's C reader); this module
only owns the socket, the connection's set-up and the mapping of failures to coredis's
exceptions.

The writers' flushes are the relay's hot path: a worker's turn makes several, each a few
commands (``XADD``, sometimes ``EXPIRE`` / ``SET``). Through coredis a pipeline of one
``XADD`` cost about 200 µs of CPU (validators, request objects, its reader and writer
tasks and their memory streams); written here as RESP on a Trio stream it costs about
25 µs. Everything else the relay does (reads, tails, pub/sub, rate-limit scripts) stays
on coredis.

Only plain URLs are served here, ``redis://[user:password@]host[:port][/db]`` and
``unix://path[?db=N]`` without other options; any other URL (``rediss://``, client
options) keeps the writers on coredis: :func:`address` returns ``None`` for it.

A reply that is an error is returned as coredis's :class:`~coredis.exceptions.ResponseError`
for that command alone; a connection that breaks, or a reply that does not parse, raises
coredis's :class:`~coredis.exceptions.ConnectionError` for the whole pipeline and the
connection is dropped (the next pipeline opens a new one).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import attrs
import hiredis
import trio

Command = Sequence[bytes | str | int]


@attrs.frozen(kw_only=True, slots=True)
class Address:
    """Where and as whom to connect (from a plain URL)."""

    host: str | None = None
    port: int = 6379
    path: str | None = None
    username: str | None = None
    password: str | None = None
    db: int = 0


def address(url: str) -> Address | None:
    """The :class:`Address` of a plain Redis URL, or ``None`` for any other (coredis
    serves that one)."""
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query, keep_blank_values=True)
        if set(query) - {"db"} or parts.fragment:
            return None
        db = int(query["db"][0]) if "db" in query else 0
        if parts.scheme == "unix":
            if not parts.path or parts.username or parts.password:
                return None
            return Address(path=parts.path, db=db)
        if parts.scheme != "redis" or not parts.hostname:
            return None
        if parts.username and parts.password is None:
            return None  # a user without a password: coredis says what that means
        path = parts.path.strip("/")
        if path:
            if "db" in query:
                return None
            db = int(path)
        return Address(
            host=parts.hostname,
            port=parts.port or 6379,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            db=db,
        )
    except ValueError:
        return None


def encode(commands: Sequence[Command]) -> bytes:
    """``commands`` as RESP arrays of bulk strings, one buffer (hiredis packs them)."""
    # hiredis's stub types the tuple as one element long; it takes any number
    # (a list, not a generator: a resume a command; a pipeline a flush, issue 24 goal 3)
    return b"".join([hiredis.pack_command(tuple(command)) for command in commands])  # type: ignore[arg-type]


def _reader() -> hiredis.Reader:
    """A RESP reader whose error replies are coredis's
    :class:`~coredis.exceptions.ResponseError` values (returned, not raised)."""
    from coredis.exceptions import ResponseError

    return hiredis.Reader(replyError=ResponseError)


def _protocol_error(reply: Any) -> bool:
    """Whether ``reply`` is Redis's protocol error (after which it closes the connection)."""
    return isinstance(reply, Exception) and str(reply).startswith(
        ("ERR Protocol error", "Protocol error")
    )


class RespConnection:
    """One connection, used by one task at a time (the relay's batcher): each
    :meth:`pipeline` writes its commands in one buffer and reads their replies."""

    def __init__(self, where: Address, *, connect_timeout: float = 2.0) -> None:
        self.where = where
        self.connect_timeout = connect_timeout
        self._stream: trio.SocketStream | None = None
        self._fd = -1
        """The stream's socket: read and written directly (:meth:`pipeline`)."""
        self._reader = _reader()

    async def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """The replies of ``commands`` in order (an error reply as a ``ResponseError``).

        A checkpoint, with one schedule point at most: its wait for the replies, or one
        at the end when they were there at once. A Trio socket's ``send`` and ``recv``
        each yield once after they succeed, so a pipeline (its send, its receive) took
        two or three task steps where the wait for Redis is the only one that carries
        anything: the relay's flusher sends a few a turn (issue 24 goal 3)."""
        await trio.lowlevel.checkpoint_if_cancelled()
        replies: list[Any] = []
        try:
            if self._stream is None:
                await self._open()
            assert self._stream is not None
            waited = await self._send(encode(commands))
            read_waited = await self._replies(len(commands), replies)
        except (
            OSError,
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            hiredis.HiredisError,
        ) as exc:
            # Imported here, on a failure only: an import statement on every pipeline
            # cost ~0.7 us (issue 24 goal 3).
            from coredis.exceptions import ConnectionError as RedisConnectionError

            why = f"{type(exc).__name__}: {exc}"
            broken = RedisConnectionError(f"relay write connection: {why}")
            answered = self._answered(replies, len(commands))
            await self.aclose()
            if answered:
                # Redis answered why it closed the connection (a command larger than its
                # ``proto-max-bulk-len``): that command's reply is its error; the ones
                # after it were never run, and fail as the connection did.
                return replies + [broken] * (len(commands) - len(replies))
            raise broken from exc
        except BaseException:
            await self.aclose()  # cancelled mid-reply: the stream's position is unknown
            raise
        if not (waited or read_waited):
            await trio.lowlevel.cancel_shielded_checkpoint()  # the pipeline's one
        return replies

    async def _send(self, data: bytes) -> bool:
        """All of ``data`` on the socket (non-blocking writes; a wait while its buffer is
        full); whether it waited."""
        fd, view, waited = self._fd, memoryview(data), False
        while view:
            try:
                sent = os.write(fd, view)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)
                waited = True
                continue
            view = view[sent:]
        return waited

    def _answered(self, replies: list[Any], count: int) -> bool:
        """Whether Redis, before the connection broke, answered the pipeline with a
        protocol error (it then closes the connection): the replies already buffered are
        added to ``replies`` (non-blocking reads, up to ``count`` of them), and the last
        is that error. A command of more bytes than Redis's ``proto-max-bulk-len`` gets
        ``ERR Protocol error: invalid bulk length`` and the connection reset while it is
        still being sent: without its reply, it looked like Redis gone, and was retried
        (the same way) until the writer gave up (benchmarks/journal/pipeline.md,
        "greedyleft")."""
        fd, reader = self._fd, self._reader
        try:
            while len(replies) < count:
                value = reader.gets()
                if value is not False:
                    replies.append(value)
                    continue
                if fd < 0:
                    break
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                reader.feed(chunk)
        except (OSError, hiredis.HiredisError):
            pass
        return bool(replies) and _protocol_error(replies[-1])

    async def _replies(self, count: int, replies: list[Any]) -> bool:
        """``count`` replies, appended to ``replies`` (non-blocking reads; a wait while
        none is buffered); whether it waited."""
        fd, reader = self._fd, self._reader
        waited = False
        while len(replies) < count:
            value = reader.gets()
            if value is False:  # hiredis: no whole reply buffered yet
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    await trio.lowlevel.wait_readable(fd)
                    waited = True
                    continue
                if not chunk:
                    raise trio.BrokenResourceError("Redis closed the connection") from None
                reader.feed(chunk)
                continue
            replies.append(value)
        return waited

    async def _open(self) -> None:
        where = self.where
        with trio.fail_after(self.connect_timeout):
            if where.path is not None:
                stream = await trio.open_unix_socket(where.path)
            else:
                assert where.host is not None
                stream = await trio.open_tcp_stream(where.host, where.port)
        self._stream, self._fd, self._reader = stream, stream.socket.fileno(), _reader()
        hello: list[Command] = []
        if where.password is not None:
            auth = [where.username, where.password] if where.username else [where.password]
            hello.append(["AUTH", *auth])
        if where.db:
            hello.append(["SELECT", where.db])
        if hello:
            with trio.fail_after(self.connect_timeout):
                await self._send(encode(hello))
                replies: list[Any] = []
                await self._replies(len(hello), replies)
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise OSError(f"Redis refused the connection's setup: {reply}")

    async def aclose(self) -> None:
        stream, self._stream, self._fd = self._stream, None, -1
        self._reader = _reader()
        if stream is not None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)


__all__ = ["Address", "RespConnection", "address", "encode"]
