"""What every HTTP provider needs to classify a failed call, written once.

* :func:`retry_after`: the wait a response asks for (``retry-after-ms``, else
  ``retry-after`` in seconds or as an HTTP date);
* :func:`classify_status`: the one status ladder from an HTTP status (and the error type
  and code words of the body) to the classes of :mod:`runtime.errors`, in one order for
  every provider, so the same failure is the same error whichever SDK reported it;
* :func:`missing_key`: a call made with no API key, the same error for every SDK;
* :func:`classify_transport`: timeouts, dropped connections and undecodable bodies
  raised by the SDKs' HTTP library while a stream is read;
* :class:`StayHome`: the HTTP client's refusal of a redirect to another origin;
* :func:`strict_loads`, :func:`finite`, :func:`arguments_json`: a tool call's input as JSON
  is (no ``NaN``, no infinity);
* :func:`fitted_name`: a stored tool call's name as an API's pattern takes it;
* :func:`created`: a request made again with valid text when its SDK cannot write it.

A provider keeps only what is its own: how to find the status, type and message in its
SDK's exceptions (and, for errors sent inside a stream with HTTP 200, which status the
error type stands for). Nothing here imports an SDK or an HTTP library.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from runtime import errors, serde
from runtime.redact import redact_text

CONTEXT_TOO_LONG = re.compile(
    r"context_length_exceeded|prompt is too long|maximum context|context (window|length|limit)"
    r"|exceeds? .*context|input token count .*exceeds|input is too long",
    re.IGNORECASE,
)
"""Words in an error's code or message meaning the conversation is over the model's
context window (OpenAI's ``context_length_exceeded``, Anthropic's "prompt is too long",
Gemini's "The input token count (N) exceeds the maximum number of tokens allowed",
Bedrock's "Input is too long for requested model", and what compatible servers say)."""

CAP_TOO_LARGE = re.compile(
    r"\b(max_tokens|max_completion_tokens|max_output_tokens|maxOutputTokens)\b"
    r"[^.]{0,80}?(too large|above maximum|maximum allowed|valid range|<=|supported range)",
    re.IGNORECASE,
)
"""A 400's message saying the request's output cap is above the model's maximum:
OpenAI's "max_tokens is too large: 1000000. This model supports at most 16384
completion tokens, whereas you provided 1000000." (also for ``max_completion_tokens``),
Anthropic's "max_tokens: 1000000 > 64000, which is the maximum allowed number of output
tokens for claude-...", and what compatible servers say ("integer above maximum value,
expected a value <= 12288", "the valid range of max_tokens is [1, 8192]")."""

CAP_LIMIT = (
    re.compile(r"supports at most (\d+) completion tokens", re.IGNORECASE),
    re.compile(r"> (\d+), which is the maximum allowed", re.IGNORECASE),
    re.compile(r"expected a value <= (\d+)", re.IGNORECASE),
    re.compile(r"valid range of \w+ is \[1, (\d+)\]", re.IGNORECASE),
)
"""Where a :data:`CAP_TOO_LARGE` message names the model's maximum."""

MAX_EVENT_BYTES = 64 << 20
"""The longest SSE line or event (and Gemini chunk) a provider reads from its bytes: far
above any real event (a whole Responses ``response.completed``, an image in a Gemini
chunk: a few MiB), low enough that a server sending one endless line cannot take the
process's memory. Past it the stream is :class:`EventTooLarge`."""


QUOTED = 200
"""Bytes of a server's body an error message quotes (:func:`quoted`)."""

QUOTE_MARGIN = 4096
"""Bytes past the cut :func:`quoted` reads to find a secret that runs across it."""

HEAD_BYTES = QUOTED + QUOTE_MARGIN
"""How much of a body's first bytes a provider keeps for :func:`quoted`."""


def quoted(data: bytes | str, limit: int = QUOTED) -> str:
    """``repr(data[:limit])`` for an error message, with every secret redacted before the
    cut. Why: an error's text is redacted where it is made, but a key the cut runs
    through was no longer the registered value (nor key-shaped): a proxy's HTML page or
    an undecodable body quoting a key at byte 170 showed 30 of its 32 characters in the
    stream, the store and the logs. Give it ``HEAD_BYTES`` of the body when there are
    more: a secret that starts before the cut and ends within the margin is hidden."""
    shown = repr(data[:limit])
    if len(data) <= limit:
        return redact_text(shown)
    whole = redact_text(repr(data[: limit + QUOTE_MARGIN]))
    return whole[: len(shown) - 1] + shown[-1]


class EventTooLarge(ValueError):
    """A line or an event of a stream over :data:`MAX_EVENT_BYTES`, with no end: read as
    :class:`~runtime.errors.MalformedStream` (:func:`classify_transport`)."""


_TRANSPORT_LIBRARIES = ("httpx2", "httpx")
"""The HTTP libraries the ``openai`` and ``anthropic`` SDKs are built on (``httpx2`` in
current releases, ``httpx`` before); both share the exception classes used here."""


def retry_after(headers: Any) -> float | None:
    """Seconds to wait before retrying, from response headers; ``None`` if not given.

    ``retry-after-ms`` wins (OpenAI and Anthropic send it, more precise); else
    ``retry-after`` as seconds or as an HTTP date (a date in the past is 0). A header
    that is malformed, or not a finite number (``inf``, ``nan``), counts as absent: a
    bad header must turn into neither a crash nor an endless wait, and a bad
    ``retry-after-ms`` leaves a good ``retry-after`` beside it to say the wait (as
    :func:`runtime.ratelimit.parse_rate_headers` reads them).
    """
    if headers is None:
        return None
    try:
        ms = float(headers.get("retry-after-ms")) / 1000
    except (TypeError, ValueError, OverflowError):
        ms = math.nan  # absent or malformed
    if math.isfinite(ms):
        return max(0.0, ms)
    try:
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            seconds = float(value)
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            seconds = when.timestamp() - time.time()
    except (TypeError, ValueError, OverflowError):
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def classify_status(
    message: str,
    *,
    provider: str,
    status: int | None,
    error_type: str | None = None,
    code: str | None = None,
    retry_after: float | None = None,
) -> errors.ProviderError:
    """The error class for a failed call, from its HTTP ``status`` (``None`` for an
    error sent inside a stream) and the ``error_type`` / ``code`` words of its body.

    One order, the first match wins:

    1. 429 or a ``rate_limit`` word -> :class:`RateLimited` (not retryable when the
       words say ``insufficient_quota``: waiting does not refill a quota);
    2. 529 or an ``overloaded`` word -> :class:`Overloaded`;
    3. 5xx, or type ``server_error`` / ``internal_error`` / ``api_error`` ->
       :class:`ProviderUnavailable`;
    4. 401, 403, or type ``authentication_error`` / ``permission_error`` ->
       :class:`AuthenticationFailed`;
    5. 408 -> :class:`ProviderTimeout`;
    6. code or message saying the context is too long -> :class:`ContextTooLong`;
    7. a 4xx whose message says the output cap is above the model's maximum
       (:data:`CAP_TOO_LARGE`) -> :class:`OutputCapTooLarge`, with the maximum if named;
    8. other 4xx, or type ``invalid_request_error`` -> :class:`BadRequest`;
    9. anything else -> :class:`ProviderError`.

    ``retry_after`` is kept on every class (the retry policy reads it only where the
    error is retryable).
    """
    kw: dict[str, Any] = {"status_code": status, "provider": provider, "retry_after": retry_after}
    words = f"{code or ''} {error_type or ''}".lower()
    if status == 429 or "rate_limit" in words:
        retryable = False if "insufficient_quota" in words else None
        return errors.RateLimited(message, retryable=retryable, **kw)
    if status == 529 or "overloaded" in words:
        return errors.Overloaded(message, **kw)
    if (status is not None and status >= 500) or error_type in (
        "server_error",
        "internal_error",
        "api_error",
    ):
        return errors.ProviderUnavailable(message, **kw)
    if status in (401, 403) or error_type in ("authentication_error", "permission_error"):
        return errors.AuthenticationFailed(message, **kw)
    if status == 408:
        return errors.ProviderTimeout(message, **kw)
    if CONTEXT_TOO_LONG.search(words) or CONTEXT_TOO_LONG.search(message):
        return errors.ContextTooLong(message, **kw)
    four = status is not None and 400 <= status < 500
    if (four or error_type == "invalid_request_error") and CAP_TOO_LARGE.search(message):
        return errors.OutputCapTooLarge(message, limit=cap_limit(message), **kw)
    if (status is not None and 400 <= status < 500) or error_type == "invalid_request_error":
        return errors.BadRequest(message, **kw)
    return errors.ProviderError(message, **kw)


def cap_limit(message: str) -> int | None:
    """The model's output maximum a :data:`CAP_TOO_LARGE` message names (:data:`CAP_LIMIT`),
    else ``None``."""
    for pattern in CAP_LIMIT:
        found = pattern.search(message)
        if found:
            return int(found.group(1))
    return None


def tokens(value: Any) -> int | None:
    """A token count as a server sent it: a non-negative integer, else ``None`` (absent).

    Why: a count is summed into the turn's usage and checked against its token budget; a
    string (``"ten"``) failed the turn with a ``TypeError`` of the runtime's addition,
    and a negative one was summed as it was, lowering the turn's total below what it
    spent (a hostile or broken server could keep a budget from ever being reached)."""
    return value if type(value) is int and value >= 0 else None


def text_of(value: Any, what: str, provider: str) -> Any:
    """``value`` when it is a string or ``None``; a :class:`MalformedStream` for any
    other value (a number, an object) where the API sends text.

    Why: a chunk's text travels as it is to the engine, which reads it as a string; a
    text delta of ``5`` crashed the engine actor and the turn ended as if answered, its
    text lost (branch ``provatk``)."""
    if value is None or type(value) is str:
        return value
    raise errors.MalformedStream(
        f"{what} is {type(value).__name__}, not text: {value!r:.200}", provider=provider
    )


SHAPE_ERRORS = (AttributeError, TypeError, KeyError, IndexError)
"""What reading a chunk of the wrong shape raises (a string where an object belongs, an
object where a string does): :func:`unreadable` makes it a :class:`MalformedStream`."""


def unreadable(exc: BaseException, provider: str) -> errors.MalformedStream:
    """The error of a chunk or event of the wrong shape (one of :data:`SHAPE_ERRORS`
    raised reading it). Why: it was reported as a ``ProviderError`` naming a
    ``TypeError`` or ``AttributeError``, not retryable, as if the provider had a bug; it
    is a stream the client cannot read, which a retry may well read."""
    return errors.MalformedStream(
        f"unreadable response chunk: {type(exc).__name__}: {exc}", provider=provider
    )


def missing_key(provider: str, variable: str) -> errors.AuthenticationFailed:
    """The error for a call with no API key: neither given (``--api-key``, ``api_key=``)
    nor in the environment ``variable`` the SDK reads. Every SDK says this in its own
    words (OpenAI's "Missing credentials", Anthropic's ``TypeError`` "Could not resolve
    authentication method"); this is one class and one line that says what to do.

    The provider does not know how it was configured: ``--api-key`` is refused under
    ``--agent module:name`` (the agent's own code builds the provider), so the line names
    the variable, which works either way, first and both ways of passing a key after it."""
    return errors.AuthenticationFailed(
        f"no API key for {provider}: set {variable}, or pass a key "
        "(the api_key argument in code, --api-key with --provider or --model)",
        provider=provider,
    )


def classify_transport(exc: BaseException, *, provider: str) -> errors.ProviderError | None:
    """The error class for an exception of the HTTP layer or of decoding the stream;
    ``None`` when ``exc`` is neither (the provider then reports it as it is).

    Timeouts -> :class:`ProviderTimeout`; other transport errors (refused, reset, cut
    mid-body) -> :class:`ConnectionLost`; undecodable bytes or JSON ->
    :class:`MalformedStream`. The HTTP library is looked up among the modules already
    imported, never imported here: an exception of a library nobody imported cannot
    have been raised.
    """
    detail = f"{type(exc).__name__}: {exc}"
    for library in _TRANSPORT_LIBRARIES:
        http = sys.modules.get(library)
        if http is None:
            continue
        if isinstance(exc, http.TimeoutException):
            return errors.ProviderTimeout(f"the request timed out: {detail}", provider=provider)
        if isinstance(exc, http.DecodingError):
            return errors.MalformedStream(f"undecodable response: {detail}", provider=provider)
        if isinstance(exc, http.TransportError):
            return errors.ConnectionLost(
                f"connection failed or dropped: {detail}", provider=provider
            )
    if isinstance(exc, EventTooLarge):
        return errors.MalformedStream(f"unreadable stream: {exc}", provider=provider)
    if isinstance(exc, json.JSONDecodeError | UnicodeDecodeError):
        return errors.MalformedStream(f"undecodable stream data: {detail}", provider=provider)
    return None


# -- redirects --------------------------------------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: Any) -> tuple[str, str, int | None]:
    """The origin (scheme, host, port: the scheme's default when none is written) of an
    HTTP library's ``URL``."""
    scheme = url.scheme
    return scheme, url.host, url.port or _DEFAULT_PORTS.get(scheme)


class StayHome:
    """A request hook of a provider's HTTP client (``event_hooks["request"]``, called for
    each request, a redirect's next one too): a request to another origin than the
    endpoint's is not sent, a :class:`~runtime.errors.ProviderError` (not retryable)
    naming that origin, never the path or query (nor the key, which is a header).

    Why: every SDK's client follows redirects, and a 307 or 308 re-sends the request as
    it was (the whole conversation) to the host it names; ``Authorization`` is dropped
    there by the HTTP library, Anthropic's ``x-api-key`` by its SDK, Gemini's
    ``x-goog-api-key`` by nothing until branch ``provatk``, and never the body. A redirect
    within the endpoint's origin is followed (branch ``provmend``)."""

    __slots__ = ("home", "provider")

    def __init__(self, endpoint: Any, provider: str) -> None:
        self.home = origin_of(endpoint)
        self.provider = provider

    async def __call__(self, request: Any) -> None:
        there = origin_of(request.url)
        if there != self.home:
            scheme, host, port = there
            shown = f"[{host}]" if ":" in host else host
            raise errors.ProviderError(
                f"the endpoint redirected the call to another origin, {scheme}://{shown}"
                f"{'' if port is None else f':{port}'}; not followed: the request (the "
                "conversation) would be sent there. If the endpoint moved, set the "
                "provider's base URL to it",
                provider=self.provider,
                retryable=False,
            )


def stay_home(http: Any, endpoint: Any, provider: str) -> None:
    """Add :class:`StayHome` for ``endpoint`` to the request hooks of ``http`` (an SDK's
    HTTP client; one without ``event_hooks`` is left as it is)."""
    hooks = getattr(http, "event_hooks", None)
    if isinstance(hooks, dict):
        http.event_hooks = {
            **hooks,
            "request": [*hooks.get("request", ()), StayHome(endpoint, provider)],
        }


def hook_error(exc: BaseException) -> errors.AxonError | None:
    """The error a hook of the HTTP client raised (:class:`StayHome`) that the SDK wrapped
    (as its connection error), else ``None``."""
    cause = exc.__cause__
    return cause if isinstance(cause, errors.AxonError) else None


# -- numbers JSON has not ------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is past the range of a number")
    return value


def strict_loads(raw: str | bytes) -> Any:
    """``json.loads`` of a tool call's arguments as JSON (RFC 8259) reads them: ``NaN``,
    ``Infinity`` and ``-Infinity`` (which Python's reader takes) and a number past a
    double's range (``1e400``, read as an infinity) raise ``ValueError``.

    Why: such an input was run (the tool got ``nan``), kept in the session as it was and
    written by the store as ``null``; replayed, it made the Anthropic request fail to
    build (``Out of range float values are not JSON compliant``, not retryable, on every
    later turn of the session), Gemini's body invalid JSON, and OpenAI's arguments text
    no JSON. Now it is invalid JSON, as any other: the call is not run and the model
    reads why (branch ``provmend``)."""
    return json.loads(raw, parse_constant=_no_constant, parse_float=_finite_float)


def loads_refused(data: bytes, refused: ValueError) -> Any:
    """An event's JSON that ``orjson.loads`` refused with ``refused``, read as the SDKs
    read it (``json.loads``) when orjson refused only half a character: a server's
    ``"\\ud83d"`` escape (an emoji's surrogate pair split across two deltas, or one
    half alone). Else ``refused`` is raised.

    Why: the OpenAI and Anthropic readers (orjson) failed such an event as
    ``MalformedStream`` on every retry, where their SDKs read it; the turn was lost. The
    half stays in the text as it came (the stores write U+FFFD for a half left alone,
    the next request too: :func:`created`)."""
    if "surrogate" not in str(refused):
        raise refused
    try:
        return json.loads(data)
    except ValueError:
        raise refused from None


HALF_HELD = "\ufffd"
"""What a held half (:func:`hold_half`) reads when its other half does not come next."""


def refuse_held(data: bytes) -> Any:
    """A reader's ``loads`` while it holds half a character (:func:`hold_half`): every
    event then goes to its slow path, which reads it and joins or flushes the half. So
    the fast path never looks for a held half."""
    raise ValueError("half a character held: read on the slow path")


def _joined(high: str, text: str) -> str:
    """``text`` after a held ``high`` half: the character the two halves make if it
    opens with the other half, else U+FFFD for the half alone."""
    if text and "\udc00" <= text[0] <= "\udfff":
        return chr(0x10000 + ((ord(high) - 0xD800) << 10) + (ord(text[0]) - 0xDC00)) + text[1:]
    return HALF_HELD + text


Slot = tuple[dict[str, Any], str, Any]
"""Where a text is in an event: the dict holding it, its key, and the part it is of (a
reader's own name for it: a block's index and kind, a tool call's index...)."""

ELSEWHERE = object()
"""What a reader's ``part_of`` says of an event that is no part of the answer it reads
(an OpenAI chunk of choice 1 alone, ``n`` > 1): a held half waits past it (:func:`hold_half`)."""


def read_holding(
    reader: Any,
    data: bytes,
    exc: ValueError,
    out: list[Any],
    slot: Any,
    learning: int,
    first: Callable[[dict[str, Any], Any], Slot | None],
    last: Callable[[dict[str, Any]], Slot | None],
    part_of: Callable[[dict[str, Any]], Any],
    flushed: Callable[[Any], Any],
) -> Any:
    """A reader's slow path for an event whose JSON ``reader.loads`` refused with
    ``exc``: half a character read as the SDK reads it (:func:`loads_refused`), and a
    delta's text (an answer's, a reasoning's, a tool call's arguments) ending in a high
    surrogate held back for the next delta of its part (:func:`hold_half`; any other
    event first: the half goes out before it, as ``flushed(part)`` appended to ``out``).
    While a half is held, ``reader.loads`` refuses every event (:func:`refuse_held`) and
    no slot reads, so they all come here, and the reader's ``slot`` and ``learning``
    wait in ``reader.saved``. ``reader`` (the OpenAI and the Anthropic readers) has
    ``half``, ``fast`` (orjson's ``loads``), ``saved``, ``slot``, ``learning`` and
    ``loads``, which the caller reads on with; the event is returned."""
    if reader.half is None:
        event = loads_refused(data, exc)  # half a character: as the SDK reads it
    else:
        try:
            event = reader.fast(data)
        except ValueError as real:
            event = loads_refused(data, real)
    was = reader.half
    if type(event) is dict:
        reader.half, flush = hold_half(event, was, first, last, part_of)
        if flush is not None:
            out.append(flushed(flush))
    if was is None:
        if reader.half is None:
            reader.slot, reader.learning = slot, learning
        else:
            reader.saved = (slot, learning)
            reader.slot, reader.learning, reader.loads = None, 0, refuse_held
    elif reader.half is None:
        (reader.slot, reader.learning), reader.loads = reader.saved, reader.fast
    return event


def hold_half(
    event: dict[str, Any],
    held: tuple[Any, str] | None,
    first: Callable[[dict[str, Any], Any], Slot | None],
    last: Callable[[dict[str, Any]], Slot | None],
    part_of: Callable[[dict[str, Any]], Any],
) -> tuple[tuple[Any, str] | None, Any]:
    """An event read on a reader's slow path (:func:`loads_refused`, or any event while
    a half is held): the held half ``(part, high surrogate)`` joined to the event's
    text of that part (``first(event, part)``: the character, or U+FFFD when that text
    does not open with the other half); the event's ``last`` text, if it ends in a high
    surrogate, gives that up, held for the next delta of its part (``part_of`` the event
    ``None``: the answer ends with this event, the half is U+FFFD there). The half now
    held (or ``None``), and the part whose held half must go out first as U+FFFD
    (:data:`HALF_HELD`; the event holds no text of it), or ``None``. An event whose
    ``part_of`` is :data:`ELSEWHERE` leaves a held half held.

    Why: a server escaping an emoji as ``"\\ud83d"`` then ``"\\ude00"`` in two deltas
    showed each half as U+FFFD on every live stream (the web protocols and the relay
    write JSON that holds no half), while the saved message has the emoji whole; held
    back here, the live text is the saved text. Only on the slow path: an event orjson
    reads holds no half (branch ``emoji``). Reasoning and tool call arguments too, and
    another choice's chunk (``n`` > 1) between choice 0's halves no longer flushes the
    half (branch ``leftmix``); nor does an empty delta of the part, which left the half
    U+FFFD (branch ``restream``)."""
    flush = kept = None
    ends = part_of(event)
    if held is not None:
        if ends is ELSEWHERE:
            return held, None
        at = first(event, held[0])
        if at is None:
            flush = held[0]
        elif at[0][at[1]] or ends is None:
            at[0][at[1]] = _joined(held[1], at[0][at[1]])
        else:  # an empty delta of the part (OpenAI's ``content: ""``): the half waits on
            kept = held
    at = last(event)
    if at is not None:
        text = at[0][at[1]]
        if text and "\ud800" <= text[-1] <= "\udbff":
            if ends is None:  # the answer ends: nothing to wait for
                at[0][at[1]] = text[:-1] + HALF_HELD
            else:
                at[0][at[1]] = text[:-1]
                # (another part's half now held: the one kept goes out first)
                return (at[2], text[-1]), flush if kept is None else kept[0]
    return kept, flush


async def billed_when_cut(emit: Any, usage: Any) -> None:
    """``usage`` (a :class:`~runtime.chunks.UsageChunk` of what the call's stream said
    so far) sent while the call is being cancelled: its ``call_timeout`` or its turn
    stopped. ``emit``'s ``send_over`` (the provider's batcher) with no wait: its one
    checkpoint is shielded, and past the inbox's capacity the chunk goes all the same,
    behind what was sent, before the call's ``StreamFailed``.

    Why: a call cut by its ``call_timeout`` after Anthropic's ``message_start`` (or a
    Gemini chunk's ``usageMetadata``) was billed, yet the turn counted 0: a cancel is no
    failure the parser sees (``except Exception``), so the usage it had was dropped
    (branch ``leftmix``)."""
    send_over = getattr(emit, "send_over", None)
    if send_over is None:  # (an emit of a test's own: nothing to send past a cancel)
        return
    try:
        await send_over([usage], 0)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass  # the requester is gone: nobody to count it


def finite(value: Any) -> Any:
    """``value`` (JSON as Python) with each float that is not finite as ``None``, as the
    store writes it (orjson); ``value`` itself when it holds none. For an input already
    in a history (a hand-made one, or one kept before :func:`strict_loads`), so the
    request holds valid JSON."""
    try:
        return _finite(value)
    except RecursionError:  # nested past Python's stack: left as it is
        return value


def _finite(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        out: dict[Any, Any] | None = None
        for key, item in value.items():
            new = _finite(item)
            if new is not item:
                if out is None:
                    out = dict(value)
                out[key] = new
        return value if out is None else out
    if kind is list or kind is tuple:
        items = [_finite(item) for item in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def arguments_json(value: Any) -> str:
    """A tool call's input as the JSON text of OpenAI's ``arguments``: a float that is
    not finite as ``null`` (:func:`finite`), where ``json.dumps`` wrote ``NaN``."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(finite(value))


UNNAMED_TOOL = "unnamed_tool"
"""The name a request gives a stored call that has none (the model sent a call without a
name; it never ran, its error result says so)."""


def fitted_name(name: str, pattern: re.Pattern[str], other: re.Pattern[str], limit: int) -> str:
    """A stored tool call's ``name`` as a request sends it: itself when it matches the
    API's ``pattern``; else each character ``other`` finds made ``_``, cut to ``limit``
    characters, and ``_`` put first when ``pattern`` wants another first character
    (``""``: :data:`UNNAMED_TOOL`).

    Why: the runtime refuses to offer a tool whose name an API would refuse
    (:data:`runtime.tools.TOOL_NAME`), but a call names whatever the model wrote, and a
    history given by a client (the OpenAI-compatible and AG-UI endpoints) whatever it
    holds. A model inventing ``repo_browser.open_file`` got an "unknown tool" error
    result, kept in the history; sent back as it was, the name made every later request
    of the session a 400 ("Invalid 'messages[1].tool_calls[0].function.name': string
    does not match pattern"). The name is only what the model reads of a call that
    never ran: the call and its result are paired by id (Gemini: by name too, and both
    go through here), and the history keeps the name."""
    if pattern.fullmatch(name):
        return name
    fitted = other.sub("_", name)[:limit] or UNNAMED_TOOL
    if not pattern.fullmatch(fitted):
        fitted = ("_" + fitted)[:limit]
    return fitted


async def created(create: Callable[..., Awaitable[Any]], body: dict[str, Any]) -> Any:
    """``create(**body)``, made once more with
    :func:`runtime.serde.without_lone_surrogates` of ``body`` when the SDK cannot write the
    body (``UnicodeEncodeError``: it encodes its JSON as UTF-8).

    Why: a model's text holding half a character (a server that split a surrogate pair
    across two deltas, or sent one half) stays so in the session's memory (the store
    writes U+FFFD); every later request of the session, on every SDK but Gemini's, then
    failed before it was sent. The text is walked only then, not on every request."""
    try:
        return await create(**body)
    except UnicodeEncodeError:
        return await create(**serde.without_lone_surrogates(body))
