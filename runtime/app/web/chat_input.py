"""What a ``POST /api/chat`` body says: the session, the last user input, the trigger.

Shared by the embedded app (:mod:`runtime.app.web.app`), which runs the turn, and the front
end of a worker deployment (:mod:`runtime.app.web.frontend`), which queues it: both must
refuse the same bodies with the same errors and title a new session the same way.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from starlette.requests import ClientDisconnect, Request

from runtime.agent import Agent
from runtime.app.session import TITLE_CHARS, title_of
from runtime.app.web import chat_body
from runtime.app.web.answers import is_continuation
from runtime.app.web.guard import is_number
from runtime.app.web.http import ApiError, session_id_param, web_state
from runtime.errors import InvalidMedia, MediaTooLarge
from runtime.media import InputLimits, check_limits, user_content
from runtime.messages import File, Image, UserContent


def _file_part(part: dict[str, Any]) -> Image | File:
    """A ``useChat`` file part (``mediaType``, ``url``, ``filename``) as an image or file.

    Only ``data:``, ``http:`` and ``https:`` URLs are taken, and an http(s) URL is passed
    on for the provider to fetch: this server never fetches a URL it was given."""
    url, media_type, filename = part.get("url"), part.get("mediaType"), part.get("filename")
    if not isinstance(url, str) or not url:
        raise ApiError(400, "a file part needs a 'url' (a data:, http: or https: URL)")
    if media_type is not None and not isinstance(media_type, str):
        raise ApiError(400, "a file part's 'mediaType' must be a string")
    if filename is not None and not isinstance(filename, str):
        raise ApiError(400, "a file part's 'filename' must be a string")
    try:
        if media_type is not None and media_type.lower().startswith("image/"):
            return Image(url=url, media_type=media_type)
        found = File(url=url, media_type=media_type, filename=filename)
        if found.media_type.startswith("image/"):  # type: ignore[union-attr]
            # no mediaType given, and the bytes (or the URL) say image
            return Image(data=found.data, url=found.url, media_type=found.media_type)
        return found
    except InvalidMedia as exc:
        label = f"file part {filename!r}" if filename else "file part"
        raise ApiError(400, f"{label}: {exc}") from None


def _last_user_input(messages: Any) -> UserContent:
    """The last user message of a ``useChat`` body: its text, or its text and file parts."""
    if not isinstance(messages, list):
        raise ApiError(400, "'messages' must be a list")
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        parts = message.get("parts")
        items: list[str | Image | File] = []
        if isinstance(parts, list):
            for p in parts:
                if not isinstance(p, dict):
                    continue
                if p.get("type") == "text" and isinstance(p.get("text"), str):
                    items.append(p["text"])
                elif p.get("type") == "file":
                    items.append(_file_part(p))
        elif isinstance(message.get("content"), str):  # the pre-parts message shape
            items.append(message["content"])
        text = "".join(i for i in items if isinstance(i, str))
        media = [i for i in items if not isinstance(i, str)]
        if not media:
            if not text.strip():
                raise ApiError(400, "the last user message has no text")
            return text
        return user_content(items)
    raise ApiError(400, "no user message in 'messages'")


async def off_loop(work: Callable[[Any], Any], data: Any, *, big: bool, state: Any) -> Any:
    """``work(data)``, in a worker thread when ``big``. The AG-UI and Chat Completions
    bodies carry a whole history, which is kept, so it cannot be cut down in a child as
    ``POST /api/chat``'s is; but checking and converting 600,000 messages (28 MB) took
    the event loop 2.5-3.6 s in one step, answering no other request meanwhile. In a
    thread the interpreter hands the loop a turn every few milliseconds; the app's
    ``parse_limiter`` bounds how many such threads run at once."""
    if not big:
        return work(data)
    return await trio.to_thread.run_sync(work, data, limiter=state.parse_limiter)


MAX_JSON_VALUES = 6_000_000
"""JSON values (arrays, objects, members' keys, scalars) a body parsed in the server's
process may hold: 413 past it (:func:`check_json_values`). Parsed, a value is a Python
object of 50-70 bytes and a body's bytes can hold one in three: 48 MiB of ``[[],[],...]``
or ``[{},{},...]`` was 1.2 GB resident (24 times the body), of ``["ab",...]`` 700 MB,
of floats 500 MB, where the same size of text is 48 MB. The cap holds that to some 430
MB, about what the longest history a client sends takes (600,000 messages, 28 MB:
4.2 million values, ~300 MB)."""


class TooManyValues(ApiError):
    """A body refused for its JSON values (:func:`check_json_values`), not its size."""


async def check_json_values(raw: bytes, state: Any) -> None:
    """413 for a body of more than :data:`MAX_JSON_VALUES` JSON values, before it is
    parsed in the server's process (AG-UI, Chat Completions, A2A, MCP; ``POST /api/chat``
    parses a large body in a memory-capped child). Counting its punctuation
    (:func:`~runtime.app.web.chat_body.json_values_bound`) is a few milliseconds a
    megabyte; only a body where that passes the cap is counted again with its strings
    taken out, so that a long text full of commas is not refused for them, and in a
    child process (``state.parse_limiter``): taking out 10 million short strings is 3 s
    of CPU, which in a thread would hold the interpreter, and every other request, as
    long."""
    if chat_body.json_values_bound(raw) <= MAX_JSON_VALUES:
        return
    if await _values_in_child(raw, state.parse_limiter) > MAX_JSON_VALUES:
        raise TooManyValues(
            413,
            f"the request body has more than {MAX_JSON_VALUES:,} JSON values (arrays, "
            "objects, keys, numbers, strings), the limit of what the server parses",
        )


MANY_PIECES = 4096
SMALL_PIECE = 64
"""A body that arrives in more than :data:`MANY_PIECES` pieces (chunks, network reads)
of under :data:`SMALL_PIECE` bytes on average is refused (400): each piece costs the
server ~30 us however small, so 1 MB sent as 1-byte chunks (6 MB on the wire) took over
30 s of its CPU. A client sends a body in large pieces; the network splits it in
segments of over a kilobyte."""


class BodyBudget:
    """The request-body bytes the process holds at once, all requests together, and how
    many it may (``limit``): :func:`_read_body` takes each piece of a body from it as the
    piece arrives and gives them all back when the read ends, however it ends (the body
    in, a refusal, the body timeout, the client gone, the request cancelled).

    Each body is bounded by ``--max-body`` and ``--body-timeout``, their sum by nothing:
    10 clients each sending 40 MB of a 48 MiB body and stalling took ``serve`` from 56
    to 368 MB resident. Bytes are counted as they arrive, not as ``Content-Length``
    announces them: a client that announces 48 MiB and sends nothing holds none, so a
    few such connections cannot shut every other request out; to fill the budget a
    client must send it. Not thread-safe: the app's requests run on one Trio loop."""

    __slots__ = ("held", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        """Bytes of bodies being read now."""

    @property
    def free(self) -> int:
        return self.limit - self.held

    def take(self, size: int) -> bool:
        """Whether ``size`` more bytes fit; if so they are held until :meth:`give_back`."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held -= size


BUDGET_RETRY_AFTER = "5"
"""Seconds a client refused by a full :class:`BodyBudget` is told to wait: the bodies
holding it are read in moments, or in at most ``--body-timeout`` when stalled."""


def _budget_full(budget: BodyBudget) -> ApiError:
    """503 with ``Retry-After``; the connection closed, as the rest of the body is not
    read (:class:`~runtime.app.web.app.CloseUnread` drops a small rest first, so the
    answer is read whole)."""
    return ApiError(
        503,
        f"the server holds {budget.held} bytes of request bodies, its limit "
        f"(--max-body-bytes-in-flight) is {budget.limit}: try again later",
        {"retry-after": BUDGET_RETRY_AFTER, "connection": "close"},
    )


async def _read_body(
    request: Request,
    limit: int,
    within: float | None = None,
    budget: BodyBudget | None = None,
) -> bytes:
    """The request body: 413 past ``limit`` bytes, 408 (and the connection closed) when
    it has not arrived in full ``within`` seconds, so a client that announces a
    body and never sends it cannot hold a connection open; 400 for a body in thousands of
    tiny pieces (:data:`MANY_PIECES`) or whose client left before it was in. Its bytes
    are held in ``budget`` while it is read: 503 (and the connection closed) for a body
    that would take more than is free, at once when ``Content-Length`` says so; one
    larger than the whole budget is a 413, as it could never be read."""
    if budget is not None:
        limit = min(limit, budget.limit)
    length = request.headers.get("content-length")
    if length is not None:
        if not is_number(length):
            raise ApiError(400, "bad content-length")
        if int(length) > limit:
            raise ApiError(413, f"request body larger than {limit} bytes")
        if budget is not None and int(length) > budget.free:
            raise _budget_full(budget)
    body = bytearray()  # what it holds of the budget, too
    pieces = 0
    try:
        with trio.move_on_after(within if within and within > 0 else math.inf):
            try:
                async for piece in request.stream():
                    size = len(piece)
                    if len(body) + size > limit:
                        raise ApiError(413, f"request body larger than {limit} bytes")
                    if budget is not None and not budget.take(size):
                        raise _budget_full(budget)
                    body += piece
                    pieces += 1
                    if pieces > MANY_PIECES and len(body) < pieces * SMALL_PIECE:
                        raise ApiError(
                            400,
                            f"the request body came in over {MANY_PIECES} pieces of under "
                            f"{SMALL_PIECE} bytes on average",
                            {"connection": "close"},
                        )
            except ClientDisconnect:
                # The client closed the connection (or sent a chunk Hypercorn refused)
                # before its body was in: no one reads an answer. Uncaught, it was an
                # "Error in ASGI Framework" traceback in the log for each such client.
                raise ApiError(400, "the client left before its request body arrived") from None
            return bytes(body)
        raise ApiError(
            408, f"the request body did not arrive within {within:g} s", {"connection": "close"}
        )
    finally:
        if budget is not None:
            budget.give_back(len(body))


INLINE_BODY = 256 << 10
"""Bodies up to this many bytes are parsed in the server's own process: whatever JSON
they hold, parsing them takes the event loop a few tens of milliseconds at most. Larger
ones are parsed in a child process (:mod:`runtime.app.web.chat_body`)."""
PARSE_TIMEOUT = 60.0
"""Seconds a child may take to parse a body before the request is refused (413)."""
CHILD_PARSES = 2
"""Children parsing bodies at once per app; more large requests wait their turn."""

_CHILD = str(Path(chat_body.__file__).resolve())


async def _exchange(child: trio.Process, raw: bytes, out: bytearray) -> None:
    """Write ``raw`` to ``child``'s stdin while reading its stdout into ``out``, until it
    exits."""
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None and stdout is not None

    async def feed() -> None:
        async with stdin:
            with contextlib.suppress(trio.BrokenResourceError):
                await stdin.send_all(raw)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(feed)
        while piece := await stdout.receive_some(1 << 20):
            out += piece
    await child.wait()


async def _reduced_in_child(raw: bytes, limits: InputLimits, limiter: trio.CapacityLimiter) -> Any:
    """:func:`~runtime.app.web.chat_body.reduce_chat_body` of ``raw``, run in a child process
    (see there why): meanwhile the event loop only moves bytes; then it decodes a body
    whose structure is at most ``max_parts`` parts, its long strings straight from the
    bytes the child wrote."""
    out = await _in_child([str(limits.max_parts), str(limits.max_files)], raw, limiter)
    answer = chat_body.unpack(out)
    if "refused" in answer:
        status, message = answer["refused"]
        raise ApiError(status, message)
    return answer["body"]


async def _values_in_child(raw: bytes, limiter: trio.CapacityLimiter) -> int:
    """:func:`~runtime.app.web.chat_body.json_values` of ``raw``, run in a child process."""
    return int(chat_body.unpack(await _in_child([chat_body.VALUES], raw, limiter))["values"])


async def _in_child(args: list[str], raw: bytes, limiter: trio.CapacityLimiter) -> bytearray:
    """What :mod:`~runtime.app.web.chat_body` run as a child with ``args`` writes for
    ``raw``: 413 when it takes over :data:`PARSE_TIMEOUT` or dies (past its memory)."""
    command = [sys.executable, "-P", _CHILD, *args]
    out = bytearray()
    async with limiter:
        with trio.move_on_after(PARSE_TIMEOUT) as scope:
            child = await trio.lowlevel.open_process(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            try:
                await _exchange(child, raw, out)
            finally:
                if child.returncode is None:
                    child.kill()
                with trio.CancelScope(shield=True):
                    await child.wait()
                    for pipe in (child.stdin, child.stdout):
                        if pipe is not None:
                            await pipe.aclose()
    if scope.cancelled_caught:
        raise ApiError(413, f"the request body took over {PARSE_TIMEOUT:g} s to parse")
    if child.returncode != 0 or not out:
        # Killed past its memory limit, most likely: a body of millions of JSON values.
        raise ApiError(413, "the request body has too many JSON values to parse")
    return out


async def read_chat_request(
    request: Request, *, answers: bool = False
) -> tuple[dict[str, Any], str, UserContent, bool]:
    """A ``POST /api/chat`` body: ``(payload, session_id, last user input, regenerate)``,
    every bad part a 4xx. ``payload`` holds the body's top-level scalar fields and, in
    ``messages``, its last user message alone (:mod:`runtime.app.web.chat_body`).

    A body whose last message is the assistant's answers a turn waiting for input
    (:mod:`runtime.app.web.answers`): taken only with ``answers`` (its input is then ``""``),
    a 400 otherwise, never read as a new turn of the last user message.

    A last user message with more parts, or more file parts, than the host's
    ``input_limits`` is a 413 before any part is decoded. A large body is parsed in a
    child process, and its parts are decoded in a thread, so that no body, however its
    JSON is shaped, holds up the server's other requests while it is read."""
    state = web_state(request)
    raw = await _read_body(request, state.max_body, state.body_timeout, state.body_budget)
    limits: InputLimits = state.host.input_limits
    large = len(raw) > INLINE_BODY
    try:
        if large:
            payload = await _reduced_in_child(raw, limits, state.parse_limiter)
        else:
            payload = chat_body.reduce_chat_body(raw, limits.max_parts, limits.max_files)
    except chat_body.BodyRefused as refused:
        raise ApiError(refused.status, refused.message) from None
    del raw
    session_id = session_id_param(payload["id"])
    messages = payload["messages"]
    # An answer for a waiting turn ends with the assistant message (runtime.app.web.answers).
    if is_continuation(payload):
        if not answers:
            raise ApiError(400, "answering a turn that waits for input is not supported here yet")
        text: UserContent = ""
    elif large:
        text = await trio.to_thread.run_sync(
            _last_user_input, messages, limiter=state.parse_limiter
        )
    else:
        text = _last_user_input(messages)
    trigger = payload.get("trigger", "submit-message")
    if trigger not in ("submit-message", "regenerate-message"):
        raise ApiError(400, f"unknown trigger {trigger!r}")
    return payload, session_id, text, trigger == "regenerate-message"


def check_media(text: UserContent, agent: Agent) -> None:
    """413 when ``text``'s attachments are over ``agent``'s media limits, 400 when one is
    a URL and the agent takes none (``--media-urls off``)."""
    try:
        check_limits(text, agent.media_limits)
    except MediaTooLarge as exc:
        raise ApiError(413, exc.message) from None
    except InvalidMedia as exc:
        raise ApiError(400, exc.message) from None


__all__ = [
    "MAX_JSON_VALUES",
    "TITLE_CHARS",
    "TooManyValues",
    "check_json_values",
    "check_media",
    "read_chat_request",
    "title_of",
]
