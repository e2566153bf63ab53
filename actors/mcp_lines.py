"""The lines of a stdio MCP server: bounded, parsed, and each bad one sent where it belongs.

A stdio server speaks one JSON-RPC message a line. The ``mcp`` package's reader logged
a line it could not read and dropped it: when that line was the answer to a request (a
result nested past the package's parser, past ``orjson``'s 1,024, a lone surrogate from
a file name, a ``NaN``), the request waited its whole timeout (30 s for a listing, the
agent's ``tool_timeout`` for a call) for an answer that had come. :class:`Lines` knows
the requests in flight (it sees every message written) and sends each unreadable line:

* with an ``id`` (read by :func:`read_heading` however deep or broken the rest) of a
  request in flight: to that request, which fails at once saying why;
* shaped like an answer (a ``jsonrpc`` or ``id`` key, no ``method``) whose request
  cannot be told (no ``id``, ``null``, ``true``, broken before it): to EVERY request in
  flight. One of them will never get its answer and which is unknown; failing them all
  at once (the model may call again) beats one waiting its timeout, and the server broke
  the protocol on an answer. A real answer that comes later is dropped by the package
  (an unknown id), as a late one always is;
* anything else (text, a JSON log line, a request or notification of the server's, an
  answer to no request in flight): nowhere. It is logged (the actor's
  ``mcp.transport-error``) and dropped. The specification forbids a server any output
  on stdout that is not a message, but servers print banners and debug lines there, and
  both ``mcp`` SDKs (Python, TypeScript) drop them: failing the calls in flight for one
  print would fail the calls of every session sharing the server, and a banner would
  keep the server from ever starting. Such a line, if it was an answer, leaves its
  request to its timeout: the one case still waiting, by choice.

A message glued to the end of a bad line (a server that wrote half an answer, then the
next message) is read, from the line's last ``{"jsonrpc"``; the rest is the bad line.

Every error quotes at most :data:`QUOTED_CHARS` of the line, without the values of the
server's configured ``env`` (the API keys it was given) and without key-shaped text.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import attrs

from runtime.errors import MCPServerError
from runtime.redact import REDACTED, is_secret_value, redact

UNREADABLE_ANSWER = -32603
"""The JSON-RPC code (internal error) a request whose answer could not be read fails with."""

QUOTED_CHARS = 60
"""The most characters of a bad line an error or a log line quotes."""

GLUED = '{"jsonrpc"'
"""How a message glued to the end of a bad line is found (its last occurrence): how the
``mcp`` packages (Python's) and most servers begin a message."""

RequestId = int | str

_WS = re.compile(r"[ \t\r\n]*")
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_KEY = re.compile(rf"[ \t\r\n]*({_STRING})[ \t\r\n]*:[ \t\r\n]*")
_SCALAR = re.compile(rf"{_STRING}|[^\s\"\[\]{{}}:,]+")
_SEPARATOR = re.compile(r"[ \t\r\n]*,")
_NESTED = re.compile(rf'{_STRING}|"|[\[{{]+|[\]}}]+')
"""What skipping a nested value looks at: strings (whose brackets do not count), an
unterminated string (the end of what can be read), and runs of brackets (a line nested
a million deep is two matches, not a million)."""
_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")


@attrs.frozen(kw_only=True, slots=True)
class Heading:
    """What the top level of a line's JSON object says, as far as it can be read."""

    answer_shaped: bool = False
    """It has a ``jsonrpc`` or an ``id`` key, and no ``method``."""
    id: RequestId | None = None
    """Its ``id``, when that is an integer or a string (the last one, as JSON readers do)."""


def read_heading(line: str) -> Heading:
    """The :class:`Heading` of ``line``, read however deep its values are nested and
    however broken it is after its keys: reading stops where the top level can no longer
    be followed (the keys before count). Linear in the line; no recursion."""
    pos = _WS.match(line).end()  # type: ignore[union-attr]
    if not line.startswith("{", pos):
        return Heading()
    pos += 1
    seen: set[str] = set()
    answered: RequestId | None = None
    while (key := _KEY.match(line, pos)) is not None:
        try:
            name = json.loads(key.group(1))
        except ValueError:
            break
        pos = key.end()
        if line.startswith(("{", "["), pos):
            end = _skip_nested(line, pos)
            value = None
        elif (scalar := _SCALAR.match(line, pos)) is not None:
            end, value = scalar.end(), scalar.group()
        else:
            break
        if name in ("id", "jsonrpc", "method"):
            seen.add(name)
            if name == "id":
                answered = _request_id(value)
        if end is None or (separator := _SEPARATOR.match(line, end)) is None:
            break
        pos = separator.end()
    shaped = bool(seen & {"id", "jsonrpc"}) and "method" not in seen
    return Heading(answer_shaped=shaped, id=answered if "method" not in seen else None)


def _skip_nested(line: str, pos: int) -> int | None:
    """Where the array or object at ``pos`` ends, or ``None`` when it cannot be found."""
    depth = 0
    while (token := _NESTED.search(line, pos)) is not None:
        text, pos = token.group(), token.end()
        if text[0] == '"':
            if len(text) == 1:
                return None  # a string without end
        elif text[0] in "[{":
            depth += len(text)
        else:
            depth -= len(text)
            if depth <= 0:  # a run may close the top level too: end at the value's close
                return pos + depth
    return None


def _request_id(value: str | None) -> RequestId | None:
    if value is None:
        return None
    if _INTEGER.fullmatch(value):
        return int(value)
    if value.startswith('"'):
        try:
            text = json.loads(value)
        except ValueError:
            return None
        return text if isinstance(text, str) else None
    return None


def _coerced(request_id: RequestId) -> RequestId:
    """The key the ``mcp`` package matches an answer's id with: ``"7"`` is ``7``."""
    if isinstance(request_id, str):
        try:
            return int(request_id)
        except ValueError:
            pass
    return request_id


def bounded(text: str, secrets: Iterable[str] = (), chars: int = QUOTED_CHARS) -> tuple[str, bool]:
    """At most ``chars`` of ``text``, without any of ``secrets`` and without key-shaped
    text, and whether it was cut. A secret that begins in the kept part is removed whole
    before the cut: a cut through it would leave its head."""
    values = [s for s in secrets if is_secret_value(s)]
    window = text[: chars + max(map(len, values), default=0) + 256]
    for secret in sorted(values, key=len, reverse=True):
        window = window.replace(secret, REDACTED)
    window = redact(window)
    return window[:chars], len(window) > chars


def quote(line: str, secrets: Iterable[str] = ()) -> str:
    """At most :data:`QUOTED_CHARS` of ``line`` (:func:`bounded`), as a Python literal."""
    kept, cut = bounded(line, secrets)
    return repr(kept) + ("..." if cut else "")


class Lines:
    """Turns a stdio server's lines into messages for the ``mcp`` package's session,
    knowing which requests are in flight (:meth:`wrote` sees every message written).
    See the module's docstring for where an unreadable line goes."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # The optional ``mcp`` extra (and pydantic, kept off the start-up path): imported
        # once a server here, not once a line in :meth:`wrote` and :meth:`_parse`.
        import mcp_types
        from mcp.shared.message import SessionMessage
        from pydantic import ValidationError

        self.in_flight: dict[RequestId, RequestId] = {}
        """The requests written and not yet answered: their id as sent, by its key."""
        self._secrets = tuple(secrets)
        self._types = mcp_types
        self._message = SessionMessage
        self._invalid = ValidationError

    def wrote(self, message: Any) -> None:
        """Note a message written to the server (a ``JSONRPCMessage``)."""
        mcp_types = self._types
        if isinstance(message, mcp_types.JSONRPCRequest):
            self.in_flight[_coerced(message.id)] = message.id
        elif (
            isinstance(message, mcp_types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
            and isinstance(request := (message.params or {}).get("requestId"), int | str)
        ):
            self.in_flight.pop(_coerced(request), None)

    def read(self, line: str) -> list[Any]:
        """The messages (``SessionMessage`` s) and errors (exceptions the session logs)
        that ``line`` makes."""
        parsed = self._parse(line)
        if not isinstance(parsed, str):
            return [parsed]
        # A message glued to the end of a line left unended (a server that wrote half an
        # answer, then the next): the message is read, the rest is a bad line. It was
        # dropped with it, and its request waited its timeout too.
        glued = line.rfind(GLUED, 1)
        if glued > 0 and not isinstance(tail := self._parse(line[glued:]), str):
            return [*self._unreadable(line[:glued], self._parse(line[:glued])), tail]
        return self._unreadable(line, parsed)

    def _parse(self, line: str) -> Any:
        """``line`` as a ``SessionMessage`` (its request no longer in flight when it is
        an answer), else what is wrong with it."""
        mcp_types = self._types
        try:
            message = mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        except self._invalid as exc:
            why = describe_invalid(exc, where=False)
            return f"a line of {len(line)} characters is no JSON-RPC message: {why}"
        except ValueError:
            return f"a line of {len(line)} characters is no JSON-RPC message"
        if isinstance(message, mcp_types.JSONRPCResponse | mcp_types.JSONRPCError):
            if message.id is not None:
                self.in_flight.pop(_coerced(message.id), None)
        return self._message(message)

    def _unreadable(self, line: str, error: str) -> list[Any]:
        """Where the unreadable ``line`` goes (the module's docstring says why)."""
        error += f" (it began {quote(line, self._secrets)})"
        heading = read_heading(line)
        if not heading.answer_shaped:
            return [MCPServerError(error)]
        if heading.id is not None:
            answered = self.in_flight.pop(_coerced(heading.id), None)
            if answered is None:  # answered already, cancelled, or never asked
                return [MCPServerError(f"{error}, an answer to no request in flight")]
            return [_failed(answered, f"its answer could not be read: {error}")]
        failed = list(self.in_flight.values())
        self.in_flight.clear()
        why = f"an answer it sent could not be read, and could have been this request's: {error}"
        return [MCPServerError(error)] + [_failed(request, why) for request in failed]


def describe_invalid(exc: Any, *, where: bool = True) -> str:
    """What a pydantic ``ValidationError`` says is wrong (at most three errors, each at
    its place when ``where``), without the input. Its own text quotes the input, cut in
    the middle (``'sk-ant-api...QQQ'``): a key's head or tail, past redaction."""
    errors = exc.errors(include_input=False, include_url=False, include_context=False)[:3]
    return "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if where and e["loc"] else e["msg"]
        for e in errors
    )


def _failed(request: RequestId, why: str) -> Any:
    import mcp_types
    from mcp.shared.message import SessionMessage

    error = mcp_types.ErrorData(code=UNREADABLE_ANSWER, message=why)
    return SessionMessage(mcp_types.JSONRPCError(jsonrpc="2.0", id=request, error=error))


@asynccontextmanager
async def line_transport(
    receive: Callable[[], Awaitable[bytes]],
    send: Callable[[bytes], Awaitable[None]],
    *,
    lines: Lines,
    limit: int,
    too_long: Callable[[int], None],
    encoding: str = "utf-8",
    drain: Callable[[], Awaitable[None]] | None = None,
    stop: Callable[[], Awaitable[None]] | None = None,
    flush_timeout: float = 2.0,
) -> AsyncIterator[tuple[Any, Any]]:
    """An MCP transport (the read and write streams the ``mcp`` package's session takes)
    over a byte stream: ``receive`` the server's output (``b""`` or ``EndOfStream`` at its
    end), ``send`` to its input. Lines are bounded: the search for the newline resumes
    where it stopped, and a line longer than ``limit`` ends the connection
    (``too_long(limit)`` first). Bytes that are not UTF-8 are replaced, making the line
    unreadable as any other bad line. When the transport is left: ``drain`` (the reader
    reads on until it returns) and ``stop`` the server (a stdio process's shutdown)."""
    import anyio
    import anyio.lowlevel

    read_writer, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, write_reader = anyio.create_memory_object_stream[Any](0)
    writer_done = anyio.Event()

    async def reader() -> None:
        buffer, scanned = bytearray(), 0
        try:
            async with read_writer:  # closed first: the session sees the end at once
                while True:
                    while (end := buffer.find(b"\n", scanned)) < 0:
                        if len(buffer) > limit:
                            too_long(limit)
                            return
                        scanned = len(buffer)
                        chunk = await receive()
                        if not chunk:
                            return
                        buffer += chunk
                    if end > limit:  # its end came with the read that passed the limit
                        too_long(limit)
                        return
                    line = buffer[:end].decode(encoding, errors="replace")
                    del buffer[: end + 1]
                    scanned = 0
                    for message in lines.read(line):
                        await read_writer.send(message)
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        except ConnectionError:
            pass
        finally:
            del buffer
            if drain is not None:
                await drain()  # until the shutdown closes the pipe

    async def writer() -> None:
        try:
            async with write_reader:
                async for message in write_reader:
                    lines.wrote(message.message)
                    text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await send((text + "\n").encode(encoding))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the connection end
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(reader)
        tasks.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(flush_timeout):
                    await writer_done.wait()
                if stop is not None:
                    await stop()
                for stream in (read_stream, write_stream, read_writer, write_reader):
                    await stream.aclose()
                await anyio.lowlevel.checkpoint()
            tasks.cancel_scope.cancel()


__all__ = [
    "QUOTED_CHARS",
    "UNREADABLE_ANSWER",
    "Heading",
    "Lines",
    "bounded",
    "describe_invalid",
    "line_transport",
    "read_heading",
]
