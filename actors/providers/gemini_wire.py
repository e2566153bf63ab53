"""Gemini's ``streamGenerateContent?alt=sse`` read from the response bytes, as dicts.

Why: the ``google-genai`` SDK turns every streamed chunk into a pydantic
``GenerateContentResponse`` (after decoding each SSE line to ``str``, ``json.loads``,
``json.dumps`` and ``json.loads`` again, and a key-renaming pass); on a stream of
word-sized deltas that made Gemini's parse path about twenty times as costly per chunk
as Anthropic's, while :func:`actors.providers.gemini.parse_stream` reads a handful of
fields. So, as the other providers do (:mod:`actors.providers.sse`), the SDK keeps the
request (its own request body converter, URL, key header, timeout, ``extra_body``) and
the HTTP status errors (its ``APIError`` s, raised by its own client), and this module
reads the response body: its lines split and joined by the SDK's own rules
(:class:`LineDecoder`), each chunk decoded by orjson into the API's JSON as it came
(camelCase keys, base64 text for bytes). An error object in the stream raises the SDK's
``APIError`` as the SDK does.

The SDK's automatic continuation is kept too (:func:`wire_chunks`): a hop that ends with
``finishReason: CONTINUATION`` and a new ``continuationToken`` is followed by a request
resuming from that token, its usage added to the previous hops', the intermediate
finish reason dropped. What is not kept: the SDK's silent reconnection of a dropped hop
(the turn runner decides about retries; it knows what was already streamed).

Everything private of the SDK this uses is looked up in :func:`wire_request`; when it is
missing (another SDK version), on Vertex AI, or when the SDK's HTTP response is not
httpx's, ``None`` sends the call through the SDK's own ``generate_content_stream``,
whose pydantic chunks :func:`sdk_chunks` turns into the same dicts.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import attrs
import trio

from actors.providers.failures import (
    HALF_HELD,
    HEAD_BYTES,
    MAX_EVENT_BYTES,
    EventTooLarge,
    Slot,
    hold_half,
    quoted,
    refuse_held,
)
from actors.providers.json_slot import orjson_module
from actors.providers.sse import body_bytes, strip_bom
from runtime import errors

PROVIDER = "google"

_DATA = b"data: "


@attrs.frozen(kw_only=True, slots=True)
class WireRequest:
    """One ``streamGenerateContent`` request as the SDK would send it."""

    api: Any
    """The SDK's ``BaseApiClient`` (key, base URL, headers, HTTP client)."""
    model: str
    """The model's resource path (``models/gemini-2.5-flash``)."""
    body: dict[str, Any]
    """The request body, converted by the SDK (camelCase, bytes as base64)."""
    http_options: Any
    """The call's ``HttpOptions`` (``extra_body``...) or ``None``."""


def wire_request(client: Any, params: dict[str, Any]) -> WireRequest | None:
    """The request the SDK's ``generate_content_stream`` would send for ``params``
    (``model``, ``contents``, ``config``), built by the SDK's own converters; ``None``
    when they are not there (another SDK version) or the client is Vertex AI's."""
    try:
        from google.genai import _common, models, types

        api = client.aio.models._api_client
        if getattr(api, "vertexai", False):
            return None
        to_mldev = models._GenerateContentParameters_to_mldev
        convert, encode = _common.convert_to_dict, _common.encode_unserializable_types
        parameters = types._GenerateContentParameters(**params)
        for name in ("_build_request", "_async_request"):
            getattr(api, name)
    except (ImportError, AttributeError):
        return None
    body = to_mldev(api, parameters, None, parameters)
    url = body.get("_url") or {}
    if body.get("_query"):
        return None  # not one this provider sends: let the SDK build its URL
    body.pop("config", None)
    config = parameters.config
    return WireRequest(
        api=api,
        model=str(url.get("model", params["model"])),
        body=encode(convert(body)),
        http_options=config.http_options if config is not None else None,
    )


async def open_stream(wire: WireRequest) -> tuple[Any, Any]:
    """Send ``wire`` through the SDK's HTTP client (its status errors raise as there):
    ``(the SDK's HttpResponse, the httpx response)``, the second ``None`` when the body
    is not httpx's to read (then read it with ``async for`` through the SDK)."""
    api = wire.api
    path = f"{wire.model}:streamGenerateContent?alt=sse"
    request = api._build_request("post", path, dict(wire.body), wire.http_options)
    response = await api._async_request(
        http_request=request, http_options=wire.http_options, stream=True
    )
    raw = getattr(response, "response_stream", None)
    return response, (raw if hasattr(raw, "aiter_bytes") else None)


_COUNTED = ("contents", "systemInstruction", "tools", "toolConfig")
"""The parts of a request ``countTokens`` counts (the generation settings are not)."""


async def count_request(wire: WireRequest) -> int:
    """``POST {model}:countTokens`` with ``{"generateContentRequest": ...}`` (the
    request as a call sends it), through the SDK's client: ``totalTokens``."""
    request = {key: wire.body[key] for key in _COUNTED if key in wire.body}
    body = {"generateContentRequest": {"model": wire.model, **request}}
    response = await wire.api.async_request("post", f"{wire.model}:countTokens", body, None)
    answer = _decode(response.body.encode("utf-8")) if response.body else {}
    total = answer.get("totalTokens", 0) if type(answer) is dict else None  # proto3: 0 omitted
    if not isinstance(total, int) or isinstance(total, bool):
        raise errors.MalformedStream(
            f"countTokens answered without totalTokens: {str(answer)[:200]}", provider=PROVIDER
        )
    return total


class LineDecoder:
    """The SDK's stream framing, on bytes: lines end at CR, LF or CRLF; a ``data: ``
    line (with its space) adds to the chunk, which a blank line ends (lines joined with
    ``\\n``); an SSE comment (``:``) or another SSE field (``event``, ``id``,
    ``retry``) is skipped where no raw JSON is pending (the SDK would fail on it); any
    other line is raw JSON (an error the API wrote without SSE framing), buffered until
    its braces balance outside strings. At the end of the body: the last unended line,
    the raw buffer, then an unended chunk.

    A line, a chunk or a raw JSON value is at most :data:`MAX_EVENT_BYTES` long, else
    :class:`EventTooLarge`; a read that ends no line is held as it is and joined once a
    line ends (as :class:`~actors.providers.sse.SSEDecoder`: an endless line from a
    hostile server took memory without bound, and quadratic time). A UTF-8 byte order
    mark at the body's start is dropped, as an SSE client does
    (:func:`~actors.providers.sse.strip_bom`: it made the first line raw JSON, and the
    stream failed)."""

    __slots__ = ("_data", "_head", "_held", "_held_size", "_raw", "_rest", "_size")

    def __init__(self) -> None:
        self._head: bytes | None = b""
        """The body's start while it may be a BOM; ``None`` once read."""
        self._rest = b""
        self._data: list[bytes] = []
        self._size = 0
        """The bytes of :attr:`_data`."""
        self._raw = _RawJson()
        self._held: list[bytes] = []
        self._held_size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._head is not None:
            head, rest = strip_bom(self._head, chunk)
            if rest is None:
                self._head = head
                return []
            self._head, chunk = None, rest
        if b"\n" not in chunk and b"\r" not in chunk and self._rest[-1:] != b"\r":
            self._held.append(chunk)  # ends no line: held until one ends
            self._held_size += len(chunk)
            if self._held_size + len(self._rest) > MAX_EVENT_BYTES:
                raise EventTooLarge(f"a line of more than {MAX_EVENT_BYTES} bytes with no end")
            return []
        if self._held:
            self._rest = b"".join((self._rest, *self._held))
            self._held, self._held_size = [], 0
        buf = self._rest + chunk if self._rest else chunk
        lines = buf.splitlines()  # bytes: breaks at CR, LF, CRLF only
        if buf and buf[-1] == 13:  # a CR at the end: its LF may start the next read
            self._rest = lines.pop() + b"\r" if lines else b"\r"
        elif buf and buf[-1] != 10:
            self._rest = lines.pop()
        else:
            self._rest = b""
        return self._lines(lines)

    def finish(self) -> list[bytes]:
        if self._held:
            self._rest = b"".join((self._rest, *self._held))
            self._held, self._held_size = [], 0
        rest, self._rest = self._rest, b""
        out = self._lines(rest.splitlines() or ([b""] if rest else []))
        raw = self._raw.flush()
        if raw:
            out.append(raw)
        if self._data:
            out.append(b"\n".join(self._data))
            self._data = []
        return out

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if line[:6] == _DATA:
                data.append(line[6:])
                self._size += len(line)
                if self._size > MAX_EVENT_BYTES:
                    raise EventTooLarge(f"a chunk of more than {MAX_EVENT_BYTES} bytes")
            elif not line:
                if data:
                    out.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data = self._data = []
                    self._size = 0
            elif line[0] == 58 or (self._raw.empty and line.partition(b":")[0] in _FIELDS):
                continue  # an SSE comment (a proxy's keep-alive) or an SSE field: no data
            else:
                raw = self._raw.add(line)
                if raw is not None:
                    out.append(raw)
        return out


_FIELDS = frozenset((b"event", b"id", b"retry"))
"""The SSE fields other than ``data``: no JSON starts with them (nor with a ``:``, an SSE
comment), so a line of one, outside raw JSON, is skipped, as an SSE client does. Why: the
SDK reads such a line as raw JSON and fails the stream on a keep-alive comment a proxy
adds (``: ping``); the body is asked for as SSE (``alt=sse``), so it may hold them."""


class _RawJson:
    """Raw JSON lines until their braces balance outside strings (the SDK's rule)."""

    __slots__ = ("_depth", "_escaped", "_in_string", "_lines", "_size")

    def __init__(self) -> None:
        self._lines: list[bytes] = []
        self._size = 0
        self._depth, self._in_string, self._escaped = 0, False, False

    @property
    def empty(self) -> bool:
        """Whether no raw JSON is pending."""
        return not self._lines

    def add(self, line: bytes) -> bytes | None:
        self._size += len(line)
        if self._size > MAX_EVENT_BYTES:
            raise EventTooLarge(f"a JSON value of more than {MAX_EVENT_BYTES} bytes")
        for c in line.decode("utf-8", errors="replace"):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == "\\":
                    self._escaped = True
                elif c == '"':
                    self._in_string = False
            elif c == '"':
                self._in_string = True
            elif c == "{":
                self._depth += 1
            elif c == "}":
                self._depth -= 1
        self._lines.append(line)
        return self.flush() if self._depth == 0 else None

    def flush(self) -> bytes:
        out = b"".join(self._lines)
        self._lines = []
        self._size = 0
        self._depth, self._in_string, self._escaped = 0, False, False
        return out


def _decode(data: bytes) -> Any:
    """A chunk's JSON; the SDK decodes bytes as UTF-8 with replacement first, so bytes
    orjson refuses are given that chance before the chunk counts as undecodable."""
    orjson = orjson_module()  # (kept: an ``import`` here ran the import system a chunk)
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(data.decode("utf-8", errors="replace"))
        except ValueError as exc:
            raise errors.MalformedStream(
                f"undecodable stream data: {quoted(data[:HEAD_BYTES].decode('utf-8', 'replace'))}",
                provider=PROVIDER,
            ) from exc


async def _chunks_of(
    response: Any, raw: Any, carry: list[Any] | None = None, last: list[bytes] | None = None
) -> AsyncGenerator[dict[str, Any], None]:
    """The chunks of one hop's body as dicts; an error object raises the SDK's error.

    Once a chunk gave the first candidate's ``finishReason`` and a chunk at or after it
    its ``usageMetadata`` (the API sends both in its last chunk), or a prompt's
    ``blockReason``, the hop's answer is whole: the body is read on as before for at most
    :data:`DRAIN_AFTER_END` seconds, and cut there. Why: reading on to the body's end, a
    finished answer from a server (a proxy) that kept the body open waited for the read
    timeout and failed with a ``ProviderTimeout`` (branch ``provmend``).

    ``carry`` (one item): half a character held back (:func:`hold_half`) when an earlier
    hop ended, and where this hop leaves one it ends holding, for the next hop or
    :func:`wire_chunks`' end; without it, such a half goes out as it came."""
    from google.genai import errors as genai_errors

    decoder = LineDecoder()
    if last is None:
        last = [b""]
    fast = orjson_module().loads
    half: tuple[Any, str] | None = carry[0] if carry else None  # held back (hold_half)
    loads = fast if half is None else refuse_held
    async with body_bytes(raw) as batches:
        ended = finished = False
        deadline: float | None = None
        while not ended:
            if deadline is None:
                chunk = await anext(batches, None)
            else:  # the answer is whole: the rest of the body, briefly
                chunk = None
                with trio.move_on_at(deadline) as scope:
                    chunk = await anext(batches, None)
                if scope.cancelled_caught:
                    if carry is not None:  # (once a hop)
                        carry[0] = half
                    elif half is not None:
                        yield _half_flushed(*half)
                    return  # (what came after the answer and ends no chunk is dropped)
            if chunk is None:
                found, ended = decoder.finish(), True
            else:
                found = decoder.feed(chunk)
            for data in found:
                try:
                    value = loads(data)
                except ValueError:
                    value = _decode(data)  # the SDK's way, a half character read as it
                    if type(value) is dict and not _continues(value):
                        half, flush = hold_half(value, half, _first_text, _last_text, _part)
                        if flush is not None:
                            yield _half_flushed(flush)
                    loads = fast if half is None else refuse_held
                last[0] = data  # (a call's args read again exactly: gemini._exact_args)
                if type(value) is not dict:
                    raise errors.MalformedStream(
                        f"a chunk is not a JSON object: {quoted(data)}", provider=PROVIDER
                    )
                if next(iter(value), None) == "error":  # the SDK: '{"error":' starts it
                    code, value = _error_object(value["error"])
                    await genai_errors.APIError.raise_error_async(code, value, response)
                if deadline is None:
                    finished = finished or _finishes(value)
                    if finished and ("usageMetadata" in value or _blocked(value)):
                        deadline = trio.current_time() + DRAIN_AFTER_END
                yield value
        if carry is not None:  # what the body ended holding (once a hop)
            carry[0] = half
        elif half is not None:
            yield _half_flushed(*half)


def _parts(chunk: dict[str, Any]) -> list[Any] | None:
    candidates = chunk.get("candidates")
    first = candidates[0] if type(candidates) is list and candidates else None
    content = first.get("content") if type(first) is dict else None
    parts = content.get("parts") if type(content) is dict else None
    return parts if type(parts) is list and parts else None


def _plain(part: Any) -> Slot | None:
    """Where a part's text is, if it is plain text or a thought's (no signature); its
    part (:func:`hold_half`) ``"text"`` or ``"thought"``."""
    if type(part) is dict and type(part.get("text")) is str:
        if len(part) == 1:
            return part, "text", "text"
        if len(part) == 2 and part.get("thought") is True:
            return part, "text", "thought"
    return None


def _first_text(chunk: dict[str, Any], kind: Any) -> Slot | None:
    """The chunk's first text that says something, if it is of ``kind``; else its first
    empty one of ``kind`` (a held half waits past it), if all before it are empty.

    Why: a chunk ``[{"text": ""}, {"text": "\\ude00b"}]`` after a held half kept the half
    for its empty first part and sent the other half alone: U+FFFD twice live, where the
    saved message has the emoji (branch ``smallleft``)."""
    empty = None
    for part in _parts(chunk) or ():
        at = _plain(part)
        if at is None:
            break
        if at[0]["text"]:
            return at if at[2] == kind else None
        if empty is None and at[2] == kind:
            empty = at
    return empty


def _last_text(chunk: dict[str, Any]) -> Slot | None:
    """The chunk's last text that says something, if nothing but empty texts follow it.

    Why: ``[{"text": "a\\ud83d"}, {"text": ""}]`` held no half (its last text was the
    empty one): the half went out alone (branch ``smallleft``)."""
    for part in reversed(_parts(chunk) or ()):
        at = _plain(part)
        if at is None or at[0]["text"]:
            return at
    return None


def _part(chunk: dict[str, Any]) -> int | None:
    """The first candidate's text is one part (across continuation hops); ``None``: the
    answer ends with this chunk."""
    if _continuing(chunk):
        return 0
    return None if _finishes(chunk) else 0


def _continuing(chunk: dict[str, Any]) -> bool:
    candidates = chunk.get("candidates")
    first = candidates[0] if type(candidates) is list and candidates else None
    return type(first) is dict and first.get("finishReason") == "CONTINUATION"


def _continues(chunk: dict[str, Any]) -> bool:
    """A hop's last chunk, with no text, whose answer the next hop continues: a held half
    waits on through it (:func:`_chunks_of`)."""
    return _continuing(chunk) and _parts(chunk) is None


def _half_flushed(kind: str, text: str = HALF_HELD) -> dict[str, Any]:
    """A chunk of a held half of a ``kind`` part (``"text"``, ``"thought"``) whose other
    half did not come next (:func:`hold_half`)."""
    part: dict[str, Any] = {"text": text, "thought": True} if kind == "thought" else {"text": text}
    return {"candidates": [{"content": {"parts": [part], "role": "model"}}]}


DRAIN_AFTER_END = 0.1
"""Seconds to read what follows a hop's answer (the body's end, so the connection is
reused and what a server adds is read as before); a server that keeps the body open is
cut then."""


def _finishes(chunk: dict[str, Any]) -> bool:
    """Whether ``chunk`` gives the first candidate's ``finishReason`` or blocks the prompt."""
    candidates = chunk.get("candidates")
    if type(candidates) is list and candidates:
        first = candidates[0]
        return type(first) is dict and first.get("finishReason") is not None
    return _blocked(chunk)


def _blocked(chunk: dict[str, Any]) -> bool:
    feedback = chunk.get("promptFeedback")
    return type(feedback) is dict and feedback.get("blockReason") is not None


def _error_object(error: Any) -> tuple[int, dict[str, Any]]:
    """An in-stream error's status code and body as the SDK's error takes them.

    Why: the SDK's error compares the ``code`` with numbers and reads the ``message``
    as text; an error object that was a string, had no code or a code that is no
    number, failed the turn with the comparison's ``TypeError`` (not retryable, its
    message lost). An error with no usable code is the server's (500); its message is
    text (the JSON of what it was, if it was none)."""
    if not isinstance(error, dict):
        error = {"message": error if isinstance(error, str) else json.dumps(error)}
    code = error.get("code")
    if type(code) is not int or not 400 <= code < 600:
        code = 500
    message = error.get("message")
    if not isinstance(message, str):
        message = json.dumps(message) if message is not None else "an error with no message"
    return code, {"error": {**error, "code": code, "message": message}}


def _hop_state(first: dict[str, Any], hop: dict[str, Any]) -> None:
    """What the first candidate says of the hop: its finish reason, a resume token."""
    if first.get("finishReason") is not None:
        hop["finish"] = first["finishReason"]
    if first.get("continuationToken"):
        hop["token"] = first["continuationToken"]


def _add_usage(before: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """A hop's usage plus the previous hops' (numbers added, as the SDK merges)."""
    out = dict(usage)
    for key, value in before.items():
        if isinstance(value, int) and isinstance(out.get(key, 0), int):
            out[key] = out.get(key, 0) + value
        elif key not in out:
            out[key] = value
    return out


OpenHop = Callable[[WireRequest], Awaitable[tuple[Any, Any]]]
"""Opens one hop: ``(the SDK's HttpResponse, the httpx response)`` (:func:`open_stream`)."""
OnResponse = Callable[[Any], Awaitable[None]]
"""Hears each hop's HTTP response (``Provider.observe_headers``)."""


async def wire_chunks(
    wire: WireRequest, open_hop: OpenHop, on_response: OnResponse, last: list[bytes] | None = None
) -> AsyncGenerator[dict[str, Any], None]:
    """Every chunk of the call as the API's JSON, following continuation hops.

    ``open_hop(wire)`` opens one hop (:func:`open_stream`); ``on_response`` hears each
    hop's HTTP response (its rate-limit headers). A hop whose last ``finishReason`` is
    ``CONTINUATION`` with a new token has that finish reason dropped from its chunks and
    is followed by a hop resuming from the token; usage is summed across hops.
    ``last[0]``: the bytes of the chunk last yielded (a function call's args are read
    again from them when orjson lost an integer past 64 bits: ``gemini._exact_args``).
    """
    before: dict[str, Any] | None = None
    start_token: str | None = None
    carry: list[Any] = [None]  # half a character a hop ended holding (_chunks_of)
    while True:
        response, raw = await open_hop(wire)
        hop: dict[str, Any] = {"finish": None, "token": None}
        usage = None
        try:
            await on_response(raw)
            chunks = _chunks_of(response, raw, carry, last)
            async with aclosing(chunks):  # the caller may stop reading at any chunk
                async for chunk in chunks:
                    candidates = chunk.get("candidates")
                    first = candidates[0] if candidates else None
                    if type(first) is dict and (
                        "finishReason" in first or "continuationToken" in first
                    ):
                        _hop_state(first, hop)
                        if hop["finish"] == "CONTINUATION" and hop["token"]:
                            first.pop("finishReason", None)
                    if before is not None and "usageMetadata" in chunk:
                        usage = chunk["usageMetadata"]
                        if isinstance(usage, dict):
                            usage = chunk["usageMetadata"] = _add_usage(before, usage)
                    elif "usageMetadata" in chunk:
                        usage = chunk["usageMetadata"]
                    yield chunk
        finally:
            await raw.aclose()
        token = hop["token"]
        if hop["finish"] != "CONTINUATION" or not token or token == start_token:
            if carry[0] is not None:  # (once a call)
                yield _half_flushed(carry[0][0])
            return
        before, start_token = usage if isinstance(usage, dict) else before, token
        wire = _resumed(wire, token)


def _resumed(wire: WireRequest, token: str) -> WireRequest:
    """``wire`` resuming from ``token`` (the body's ``continuationToken``, where the
    SDK's converter puts the config's ``continuation_token``)."""
    return attrs.evolve(wire, body={**wire.body, "continuationToken": token})


async def sdk_chunks(stream: AsyncIterator[Any]) -> AsyncGenerator[dict[str, Any], None]:
    """The SDK's ``GenerateContentResponse`` s as the API's JSON (camelCase keys; bytes
    as base64, URL-safe as pydantic writes them, which the parser reads as well)."""
    async for response in stream:
        yield response.model_dump(mode="json", by_alias=True, exclude_none=True)


def standard_b64(text: str) -> str:
    """Standard padded base64 of the bytes ``text`` holds (standard or URL-safe, padded
    or not): signatures are kept as the SDK would give them, ``b64encode`` of the bytes."""
    if "-" not in text and "_" not in text and not len(text) % 4:
        return text
    raw = base64.urlsafe_b64decode(
        text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4)
    )
    return base64.b64encode(raw).decode("ascii")


__all__ = [
    "LineDecoder",
    "OnResponse",
    "OpenHop",
    "WireRequest",
    "count_request",
    "open_stream",
    "sdk_chunks",
    "standard_b64",
    "wire_chunks",
    "wire_request",
]
