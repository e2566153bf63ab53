"""Server-sent events read from an SDK response's bytes, for the providers' hot path.

The OpenAI and Anthropic SDKs decode a stream line by line in Python: each line decoded
to ``str``, each event an object, and three async generators between the socket and
the provider. On a stream of word-sized deltas that was the largest single cost of a
turn (issue 24: about half of the provider's time), while the floor it is compared with
(bare httpx + orjson) splits bytes into lines and decodes each ``data`` line. So the
providers keep the SDK for the request, the status errors and the connection, and read
the response body here: :func:`sse_batches` gives, per network read, the events it
completed as ``(event name, data bytes)`` pairs, and orjson reads the data bytes as
they are.

The decoding is the SSE specification's (and the SDKs'): lines end at CRLF, LF or CR
(a CR at the end of a read waits for the next read, which may begin with its LF); a
line starting with ``:`` is a comment; ``field: value`` loses one space after the
colon, a line without a colon is a field with an empty value; ``data`` lines join with
``\\n``; a blank line dispatches the event when it has an ``event`` name, ``data``, a
``retry`` or an ``id`` was ever given (the ``id`` is never reset, as the SDKs do); an
empty event name is none; other fields are ignored, and a last line without its blank
line is not an event. A UTF-8 byte order mark at the start of the body is dropped, as the
specification says (:func:`strip_bom`: before, it joined the first line's field name, and
the first event was lost, branch ``provmend``).

A line or an event is at most :data:`~actors.providers.failures.MAX_EVENT_BYTES` long:
past that the decoder raises :class:`~actors.providers.failures.EventTooLarge` (a
:class:`~runtime.errors.MalformedStream` once classified). Why: a hostile or broken server
that sends one endless line would else grow the buffer without bound, and re-joining it
with every read made the decoding quadratic (16 MiB with no newline cost 5 s of CPU, 64 MiB
over a minute, branch ``provatk``); a read that ends no line is now held as it is, and
joined once, when a line ends.

Only a stream the SDK would decode as plain SSE is read this way
(:func:`sdk_sse_response`); another decoder (Bedrock's binary event stream) or a test
double goes through the SDK.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any

import trio

from actors.providers.failures import MAX_EVENT_BYTES, EventTooLarge, quoted

Event = tuple[str | None, bytes]
"""One event: its ``event`` field (``None`` when it has none) and its data."""

_NAMES: dict[bytes, str] = {}
"""Event names already decoded (a stream repeats a handful of them)."""

_NAME_LINES: dict[bytes, str] = {}
"""The same names by their whole ``event: NAME`` line (:meth:`SSEDecoder._named_blocks`)."""

BOM = b"\xef\xbb\xbf"
"""The UTF-8 byte order mark, which a body may start with (the SSE specification drops it)."""


def strip_bom(head: bytes, chunk: bytes) -> tuple[bytes, bytes | None]:
    """A body's first reads without a leading :data:`BOM`: ``head`` is what was held of
    the body's start (the reads so far, fewer than three bytes, all a prefix of the BOM),
    ``chunk`` the next read. Gives the new ``head`` and the bytes to read on (``None``
    while the reads are still a prefix of the BOM: held; then the start is known)."""
    buf = head + chunk if head else chunk
    if len(buf) < 3 and BOM.startswith(buf):
        return buf, None
    return b"", buf[3:] if buf.startswith(BOM) else buf


class SSEDecoder:
    """Bytes in, events out, incrementally: :meth:`feed` each read, :meth:`finish` at
    the end of the body."""

    __slots__ = (
        "_data",
        "_event",
        "_head",
        "_held",
        "_held_size",
        "_last_id",
        "_rest",
        "_retry",
        "_size",
        "limit",
        "read",
    )

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        """The longest line or event, in bytes (``None``: :data:`MAX_EVENT_BYTES` as it
        is when the limit is checked); past it :class:`EventTooLarge`."""
        self._head: bytes | None = b""
        """The body's start held while it may be a BOM (:func:`strip_bom`); ``None`` once
        the start is read."""
        self.read = b""
        """The bytes the lines :meth:`feed_lines` gave last were cut from: line ``j``
        starts where lines ``0`` to ``j - 1`` end, each ended by one newline (so a
        reader can compare a run of blocks with the bytes where they lie, unjoined)."""
        self._rest = b""
        self._event: str | None = None
        self._data: list[bytes] = []
        self._last_id = ""
        self._retry: int | None = None
        self._held: list[bytes] = []
        """Reads that ended no line, after :attr:`_rest` (joined once a line ends)."""
        self._held_size = 0
        self._size = 0
        """The bytes of the pending event's data (:attr:`_data`)."""

    def feed(self, chunk: bytes) -> list[Event]:
        """The events that ``chunk`` completes, in order."""
        if self._head is not None:
            head, rest = strip_bom(self._head, chunk)
            if rest is None:
                self._head = head
                return []
            self._head, chunk = None, rest
        if (self._held or chunk.find(b"\n") < 0) and self._holds(chunk):  # (see _holds)
            return []
        buf, tail = self._joined(chunk)
        return self._feed(buf, tail)

    def _holds(self, chunk: bytes) -> bool:
        """Whether ``chunk`` ends no line (it then completes no event) and is held, as it
        is, for the read that ends the line; raises :class:`EventTooLarge` once the line
        is longer than :data:`MAX_EVENT_BYTES`."""
        # ``find``, not ``in``: bytes' ``in`` tries its operand as an integer first, and
        # for bytes builds and drops a TypeError (~1,800 instructions: CPython's
        # ``_Py_bytes_contains``), a few times a read (issue 24 goal 1).
        if chunk.find(b"\n") >= 0 or chunk.find(b"\r") >= 0 or self._rest[-1:] == b"\r":
            if self._held:
                self._rest = b"".join((self._rest, *self._held))
                self._held, self._held_size = [], 0
            return False
        self._held.append(chunk)
        self._held_size += len(chunk)
        limit = MAX_EVENT_BYTES if self.limit is None else self.limit
        if self._held_size + len(self._rest) > limit:
            raise EventTooLarge(f"an SSE line of more than {limit} bytes with no end")
        return True

    def _joined(self, chunk: bytes) -> tuple[bytes, bytes]:
        """What is left of the last read and ``chunk``, with LF line ends only, and the
        CR held for the next read (its LF may start it)."""
        buf = self._rest + chunk if self._rest else chunk
        tail = b""
        if buf.find(b"\r") >= 0:  # (see _holds)
            if buf[-1] == 13:  # a CR at the end: its LF may start the next read
                buf, tail = buf[:-1], b"\r"
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        return buf, tail

    def feed_lines(self, chunk: bytes, size: int = 3) -> tuple[list[bytes], list[Event]]:
        """:meth:`feed` as lines where it can: for a read whose complete lines are blocks
        of ``size`` lines, the last one blank (3: a Messages API body, ``event:``,
        ``data:`` and a blank line; 2: a Chat Completions body, ``data:`` and a blank
        line; however the read falls), with nothing pending from the last read, those
        lines (``size * k`` of them) and no events: block ``i`` is
        ``lines[size * i : size * (i + 1)]``, and :meth:`block_events` reads blocks as
        events, in order (the lines of a block that a reader proves to be a given event
        by their bytes it may take as that event itself: such a block moves no state).
        For any other read, no lines and what :meth:`feed` returns.

        Why: a text delta's SSE decoding (the lines cut into ``(name, data)`` pairs,
        each line looked at) cost about as much as reading its text (issue 24 goal 1);
        a reader that knows the bytes of a run of blocks can check them all at once
        (:meth:`actors.providers.json_slot.StringSlot.run_lines`, in :attr:`read`). The
        lines after the last blank one (none blank) wait for the next read, as
        :meth:`feed` keeps them."""
        if self._head is not None:
            head, rest = strip_bom(self._head, chunk)
            if rest is None:
                self._head = head
                return [], []
            self._head, chunk = None, rest
        if (self._held or chunk.find(b"\n") < 0) and self._holds(chunk):  # (see _holds)
            return [], []
        buf, tail = self._joined(chunk)
        if not self._data and self._event is None and self._retry is None:  # none pending
            lines = buf.split(b"\n")
            k = (len(lines) - 1) // size
            end = size * k
            if k and lines[size - 1 : end : size].count(b"") == k and b"" not in lines[end:-1]:
                self._rest = b"\n".join(lines[end:]) + tail
                del lines[end:]
                self.read = buf
                return lines, []
        return [], self._feed(buf, tail)

    def block_events(self, lines: list[bytes], i: int, j: int, size: int = 3) -> list[Event]:
        """The events of blocks ``i`` to ``j - 1`` of ``lines`` (:meth:`feed_lines` with
        ``size``), read in order after the blocks before them (an ``id`` moves the
        decoder's state)."""
        block = lines[size * i : size * j]
        if size == 3:
            names = list(map(_NAME_LINES.get, block[0::3]))
            if None not in names:  # each an "event: NAME" line of a name seen before...
                data = [line[6:] for line in block[1::3] if line.startswith(b"data: ")]
                if len(data) == j - i:  # ...a "data: " line and a blank one: one event each
                    return list(zip(names, data, strict=True))
        elif size == 2:
            out: list[Event] = [
                (None, line[6:]) for line in block[0::2] if line.startswith(b"data: ")
            ]
            if len(out) == j - i:  # each a "data: " line and a blank one
                return out
        return self._lines(block)

    def _feed(self, buf: bytes, tail: bytes) -> list[Event]:
        if not self._data and self._event is None and self._retry is None:  # none pending
            if buf.startswith(b"data: "):
                fast = self._data_blocks(buf)
            elif buf.startswith(b"event: "):
                fast = self._named_blocks(buf)
            else:
                fast = None
            if fast is not None:
                self._rest = fast[1] + tail
                return fast[0]
        blocks = buf.split(b"\n\n")
        last = blocks.pop()
        out = self._blocks(blocks) if blocks else []
        if last.find(b"\n") >= 0:  # complete lines of an unfinished block: read them now
            lines = last.split(b"\n")
            last = lines.pop()
            out += self._lines(lines)
        self._rest = last + tail
        return out

    # The two shapes a model's stream is made of, read from a read's lines in slices when
    # every complete block of the read has that shape (issue 24: a look at each block
    # made the decoding cost 2.5 times the floor's line split, and splitting at blank
    # lines alone cost as much as that split). Both need nothing pending from the last
    # read (:meth:`feed` checks) and return the events and what is left of the read: the
    # lines after the last blank one, at most two and none blank, which wait for the next
    # read (it then starts at a block's start). Why the checks suffice: a blank line ends
    # a block, so when every second (third) of the lines before the last one is blank,
    # and those before each blank line have the shape, each block is those lines; the
    # last line is never complete.

    def _data_blocks(self, buf: bytes) -> tuple[list[Event], bytes] | None:
        """Each complete block one ``data: `` line (a Chat Completions body)."""
        lines = buf.split(b"\n")
        k = (len(lines) - 1) // 2
        end = 2 * k
        if not k or lines[1:end:2].count(b"") != k or b"" in lines[end:-1]:
            return None
        out: list[Event] = [
            (None, line[6:]) for line in lines[0:end:2] if line.startswith(b"data: ")
        ]
        if len(out) != k:
            return None
        return out, b"\n".join(lines[end:])

    def _named_blocks(self, buf: bytes) -> tuple[list[Event], bytes] | None:
        """Each complete block an ``event: NAME`` line of a name seen before (the whole
        line looked up) and a ``data: `` line (a Messages API body)."""
        lines = buf.split(b"\n")
        k = (len(lines) - 1) // 3
        end = 3 * k
        if not k or lines[2:end:3].count(b"") != k or b"" in lines[end:-1]:
            return None
        names = list(map(_NAME_LINES.get, lines[0:end:3]))
        if None in names:
            return None
        data = [line[6:] for line in lines[1:end:3] if line.startswith(b"data: ")]
        if len(data) != k:
            return None
        return list(zip(names, data, strict=True)), b"\n".join(lines[end:])

    def _blocks(self, blocks: list[bytes]) -> list[Event]:
        """The events of complete blocks (the lines before a blank line). The two shapes
        a model's stream is made of, ``event: NAME`` + ``data: DATA`` and ``data: DATA``
        alone, are read as a whole (issue 24: a line at a time, the decoding cost more
        than the JSON); any other block goes through :meth:`_lines`, with its blank line.
        After a blank line nothing is pending (whatever was, was dispatched), which is
        what lets a block be read by itself."""
        out: list[Event] = []
        names = _NAMES
        pending = bool(self._data) or self._event is not None or self._retry is not None
        for block in blocks:
            if pending:  # lines of this block were read with the last read: go on
                pending = False
            elif block.startswith(b"event: "):
                name_line, _, rest = block.partition(b"\n")
                name = names.get(name_line[7:])
                if name is not None and rest.startswith(b"data: ") and b"\n" not in rest:
                    out.append((name, rest[6:]))
                    continue
            elif block.startswith(b"data: ") and b"\n" not in block:
                out.append((None, block[6:]))
                continue
            lines = block.split(b"\n")
            lines.append(b"")
            out += self._lines(lines)
        return out

    def finish(self, *, flush: bool = False) -> list[Event]:
        """The events the end of the body completes: only a last line ended by a CR.
        With ``flush``, the end of the body ends the last line and the event pending too
        (the A2A client reads a last event with no blank line after it); that line is
        bounded by the limit as any other."""
        rest, self._rest = self._rest, b""
        if flush:
            rest = b"".join((rest, *self._held))
            self._held, self._held_size = [], 0
            limit = MAX_EVENT_BYTES if self.limit is None else self.limit
            if len(rest) > limit:
                raise EventTooLarge(f"an SSE line of more than {limit} bytes with no end")
            lines = rest.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            if lines[-1]:
                lines.append(b"")
            return self._lines(lines)
        if self._held:  # the last line is a held read's: it ends in no CR
            self._held, self._held_size = [], 0
            return []
        if rest.endswith(b"\r"):
            return self._lines(rest[:-1].replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"))
        return []

    def _lines(self, lines: list[bytes]) -> list[Event]:
        out: list[Event] = []
        data = self._data
        start = len(data)  # the data lines pending from before, already counted
        names = _NAMES
        for line in lines:
            if line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value[:1] == b" " else value)
            elif not line:
                if data or self._event or self._last_id or self._retry is not None:
                    out.append((self._event, data[0] if len(data) == 1 else b"\n".join(data)))
                    self._event, self._retry = None, None
                    data = self._data = []
                    start = self._size = 0
            elif line.startswith(b"event: ") and line[7:] in names:  # a name seen before
                self._event = names[line[7:]]
            elif line[0] != 58:  # not a ":" comment
                self._field(line)
        if len(data) > start:  # an event left pending: its data is bounded too
            self._size += sum(map(len, data[start:])) + len(data) - start
            limit = MAX_EVENT_BYTES if self.limit is None else self.limit
            if self._size > limit:
                raise EventTooLarge(f"an SSE event of more than {limit} bytes")
        return out

    def _field(self, line: bytes) -> None:
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"event":
            event = value.decode("utf-8") or None  # as the SDKs' events: "" is no name
            if event is not None and len(_NAMES) < 256:
                _NAMES[value] = event
                if not value.startswith(b" "):  # "event: " + value is this line
                    _NAME_LINES[b"event: " + value] = event
            self._event = event
        elif name == b"data":  # "data" alone: an empty data line
            self._data.append(value)
        elif name == b"id":
            if b"\0" not in value:
                self._last_id = value.decode("utf-8")
        elif name == b"retry":
            try:
                self._retry = int(value)
            except ValueError:
                pass


def no_events(response: Any, head: bytes, provider: str) -> Exception:
    """The error of a body that held no event at all: an HTML error page, a whole JSON
    answer, an empty body, served with status 200. Why: the provider said the stream
    was cut (no ``[DONE]``, no ``message_stop``), which sent the user looking for a
    dropped connection; the content type and the body's first bytes say what came."""
    from runtime import errors

    kind = getattr(response, "headers", {}).get("content-type") or "none"
    what = f"it begins {quoted(head)}" if head else "it is empty"
    return errors.MalformedStream(
        f"the response holds no server-sent events (content-type {kind}; {what})",
        provider=provider,
    )


def block_bytes(lines: list[bytes], i: int, j: int, size: int = 3) -> int:
    """How many bytes of :attr:`SSEDecoder.read` blocks ``i`` to ``j - 1`` of ``lines``
    (:meth:`SSEDecoder.feed_lines` with ``size``) take: their lines, each with its
    newline. A reader that compares runs of blocks where they lie adds it to the offset
    of block ``i`` to get block ``j``'s."""
    block = lines[size * i : size * j]
    return sum(map(len, block)) + len(block)


def read_blocks(
    reader: Any,
    decoder: SSEDecoder,
    lines: list[bytes],
    size: int,
    lead: bytes,
    events: Callable[[list[Event], list[Any]], tuple[Exception | None, bool]],
    out: list[Any],
) -> tuple[Exception | None, bool]:
    """A read given as SSE lines (:meth:`SSEDecoder.feed_lines`, ``size`` a block) into
    ``out``, for a provider's reader: the runs of text deltas that are the reader's slot's
    bytes, read by their lines (``reader.slot.run_lines``, ``lead`` the bytes before the
    text; no ``(name, data)`` pair, no cut ``data:`` line a delta; issue 24 goal 1), and
    any other block as its events by ``events``, in order. While the reader learns its
    slot (``reader.learning``) or has one, a block at a time (the slot may change with
    it), else the rest in one call. What went wrong (after what came before it) or
    ``None``, and whether ``events`` said the stream ended. One loop for both providers:
    block ``i`` starts at offset ``at`` of :attr:`SSEDecoder.read`, which the runs are
    compared against where they lie."""
    k = len(lines) // size
    i = at = 0
    read = decoder.read
    while i < k:
        slot = reader.slot
        if slot is not None:
            run, i, at = slot.run_lines(lines, i, k, lead, read, at)
            if run:
                out.append(run)
            if i == k:
                break
        j = i + 1 if reader.learning or reader.slot is not None else k
        failure, done = events(decoder.block_events(lines, i, j, size), out)
        if failure is not None or done:
            return failure, done
        if j < k:
            at += block_bytes(lines, i, j, size)
        i = j
    return None, False


async def sse_batches(chunks: AsyncGenerator[bytes, None]) -> AsyncGenerator[list[Event], None]:
    """The events of a body, one list per read that completed any; ``chunks`` closed when
    this ends, read to their end first unless cancelled (:func:`read_to_end`)."""
    decoder = SSEDecoder()
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                events = decoder.feed(chunk)
                if events:
                    yield events
        except (GeneratorExit, Exception):
            await read_to_end(chunks)
            raise
    events = decoder.finish()
    if events:
        yield events


DRAIN_SECONDS = 0.1
"""Seconds :func:`read_to_end` reads what is left of a body; a server that keeps it open is
cut then."""


async def read_to_end(chunks: AsyncIterator[bytes], seconds: float = DRAIN_SECONDS) -> None:
    """Read and drop what is left of a body (``response.aiter_bytes()``), for at most
    ``seconds``.

    Why: the HTTP library (httpx2 2.17) closes its own byte iterators only when the body
    was read to its end. Closed before (the answer's terminal event came, an ``error``
    event, an event that is not JSON), the inner one of the connection was left to the
    garbage collector, which Trio reports as a ``ResourceWarning`` (an error under ``-W
    error``), and the connection was not reused (branch ``providers3``; httpx2 #1212).
    A server ends the body right after such an event, so this costs one read."""
    with trio.move_on_after(seconds):
        async for _ in chunks:
            pass


@asynccontextmanager
async def body_bytes(response: Any) -> AsyncGenerator[AsyncGenerator[bytes, None], None]:
    """``response.aiter_bytes()`` for the block, closed when it ends; read to its end
    first (:func:`read_to_end`) when the block ends by an error or its generator is
    closed (the reader stopped at an answer's end or an ``error`` event), not when it is
    cancelled or ends by itself."""
    chunks = response.aiter_bytes()
    async with aclosing(chunks):
        try:
            yield chunks
        except (GeneratorExit, Exception):
            await read_to_end(chunks)
            raise


async def _through_sdk(stream: Any) -> AsyncGenerator[list[Event], None]:
    """The events of ``stream`` as its SDK decodes them, in the same form.

    A decoder of ours in the SDK's place (one with ``reads_body`` set: Bedrock's frames,
    :func:`~actors.providers.anthropic_platforms.frame_decoder_class`) is given the
    body's bytes by :func:`body_bytes` rather than by the SDK's ``_iter_events``, which
    closes neither the decoder's generator nor the one it reads: an error frame or a
    reader that stopped left both to the garbage collector (Trio's ``ResourceWarning``,
    branch ``providers3``)."""
    decoder: Any = getattr(stream, "_decoder", None)
    response: Any = getattr(stream, "response", None)
    if getattr(decoder, "reads_body", False) and hasattr(response, "aiter_bytes"):
        async with body_bytes(response) as chunks:
            decoded = decoder.aiter_bytes(chunks)
            async with aclosing(decoded):
                async for sse in decoded:
                    yield [(sse.event, sse.data.encode("utf-8"))]
        return
    events = stream._iter_events()
    async with aclosing(events):
        async for sse in events:
            yield [(sse.event, sse.data.encode("utf-8"))]


def event_batches(stream: Any) -> AsyncGenerator[list[Event], None]:
    """The events of an SDK ``AsyncStream``: read from its body's bytes when the SDK
    would decode them as plain SSE (:func:`sdk_sse_response`), else through the SDK's
    own ``_iter_events`` (which ``stream`` must have)."""
    response = sdk_sse_response(stream)
    if response is None:
        return _through_sdk(stream)
    return sse_batches(response.aiter_bytes())


def sdk_sse_response(stream: Any) -> Any:
    """The HTTP response of an SDK ``AsyncStream`` whose body the SDK would decode as
    plain SSE (its own ``SSEDecoder``), to read with :func:`sse_batches`; ``None`` for
    anything else (another decoder, a test double), which is read through the SDK."""
    decoder = getattr(stream, "_decoder", None)
    response = getattr(stream, "response", None)
    if decoder is None or response is None or not hasattr(response, "aiter_bytes"):
        return None
    cls = type(decoder)
    if cls.__name__ != "SSEDecoder" or not cls.__module__.endswith("._streaming"):
        return None
    return response


__all__ = [
    "BOM",
    "Event",
    "SSEDecoder",
    "block_bytes",
    "body_bytes",
    "event_batches",
    "read_to_end",
    "sdk_sse_response",
    "sse_batches",
    "strip_bom",
]
