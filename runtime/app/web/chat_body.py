"""The JSON of a ``POST /api/chat`` body, cut down to what the server reads.

:func:`reduce_chat_body` parses a body and keeps its top-level scalar fields (``id``,
``trigger``, ``messageId``, ...) and its last user message, whose parts are counted
against the part limits *before* any of them is decoded, and stripped to the keys a text
or file part has. What it returns is small in structure whatever the body was: at most
``max_parts`` parts of a few strings each.

Parsing is where a hostile body costs most, and ``orjson`` holds the GIL for the whole
parse: 48 MiB of ``[[],[],...]`` is 16 million lists, seconds of CPU during which no
other request of the process would be answered, whatever thread ran it. So
:mod:`runtime.app.web.chat_input` parses a large body in a child process that runs this file
as a script (``python -P chat_body.py MAX_PARTS MAX_FILES`` with the body on stdin and the
reduced body as JSON on stdout): the server's own work is then proportional to the
reduced body's size, not to the JSON values the client sent. That is why this module
imports nothing but the standard library and ``orjson``: the child starts in a few tens
of milliseconds, without importing the runtime.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import orjson

PART_KEYS = ("type", "text", "url", "mediaType", "filename")
"""What a text or file part of a ``useChat`` message has that the server reads."""
ANSWER_KEYS = (
    "type",
    "toolCallId",
    "toolName",
    "state",
    "approval",
    "input",
    "output",
    "errorText",
)
"""What a tool part of a continuation's assistant message has that the server reads
(:mod:`runtime.app.web.answers`): approvals and client tools' outputs, kept whole, with
the call's input, which must be the stored call's."""
TOOL_PARTS = ("tool-", "dynamic")
"""How the ``type`` of a tool part of a ``useChat`` message starts."""
MAX_ANSWER_PARTS = 20_000
"""Tool parts a continuation's assistant message may have (or the host's ``max_parts``
when that is more): a step's calls, as many as the model asked for, each streamed to the
client, which sends them all back with its answers. A bound still, on what the server
decodes of a body (each kept part is a dict of a few keys)."""
MESSAGE_KEYS = ("id", "role", "content")
"""What the last user message has besides its parts that the server reads."""
MAX_ID_CHARS = 256
"""The longest assistant message id kept (:func:`_held_answer`): a turn's, even steered
into, is far shorter."""
CHILD_MEMORY = 2 << 30
"""Address space the parsing child may use (bytes): a body of nested empty arrays under
the size limit still needs about a gigabyte of Python objects; past this it is refused."""


class BodyRefused(Exception):
    """A body the server will not take: ``status`` (400 or 413) and a one-line reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _scalar(value: Any) -> Any:
    """``value`` if it is a JSON scalar, else an empty container of its kind: the caller
    still sees that it is not a string, without its contents."""
    if isinstance(value, dict):
        return {}
    if isinstance(value, list):
        return []
    return value


def _counted_parts(parts: list[Any], max_parts: int, max_files: int) -> list[dict[str, Any]]:
    files = sum(1 for p in parts if type(p) is dict and p.get("type") == "file")
    if files > max_files:
        raise BodyRefused(
            413,
            f"the last user message has {files} file parts; the limit is {max_files} "
            "images and files per message",
        )
    if len(parts) > max_parts:
        raise BodyRefused(
            413,
            f"the last user message has {len(parts)} parts; the limit is {max_parts} "
            "parts per message",
        )
    return [
        {key: _scalar(p[key]) for key in PART_KEYS if key in p}
        for p in parts
        if type(p) is dict and p.get("type") in ("text", "file")
    ]


def _answers_message(message: dict[str, Any], max_parts: int) -> dict[str, Any]:
    """A continuation's last (assistant) message: its tool parts, with what answers a
    waiting turn (:data:`ANSWER_KEYS`); at most ``max(max_parts, MAX_ANSWER_PARTS)`` of
    them, its other parts (``step-start``, text, reasoning) dropped uncounted.

    The message is one the server streamed, its parts as many as the model made: a
    step of more tool calls than a user's input may have parts (``max_parts``, 1,000 by
    default) held its one call that waits for approval, and every answer to it was
    refused (413), the turn left waiting until it expired."""
    parts = message.get("parts")
    kept = {key: _scalar(message[key]) for key in MESSAGE_KEYS if key in message}
    if type(parts) is not list:
        return kept
    tools = [p for p in parts if type(p) is dict and str(p.get("type", "")).startswith(TOOL_PARTS)]
    limit = max(max_parts, MAX_ANSWER_PARTS)
    if len(tools) > limit:
        raise BodyRefused(
            413,
            f"the last assistant message has {len(tools)} tool parts; the limit is {limit} "
            "tool parts per message",
        )
    kept["parts"] = [{key: p[key] for key in ANSWER_KEYS if key in p} for p in tools]
    return kept


def _held_answer(messages: list[Any], at: int) -> list[dict[str, Any]]:
    """The assistant message right before the last message ``messages[at]``, reduced to
    its id (``[]`` if there is none): what a ``useChat`` client that sends while a turn
    streams shows that turn's answer in (``steer``: :mod:`runtime.app.web.resend`)."""
    if at != len(messages) - 1 or at == 0:
        return []
    held = messages[at - 1]
    if type(held) is not dict or held.get("role") != "assistant":
        return []
    value = held.get("id")
    if type(value) is not str or len(value) > MAX_ID_CHARS:  # (no stored id is longer)
        return []
    return [{"id": value, "role": "assistant"}]


def not_json(refused: ValueError) -> str:
    """Why a body orjson refused (``refused``) is refused: it is not JSON, or it is JSON
    whose text holds half a character (a lone surrogate's escape, ``"\\ud800"``), which
    no message can hold: said so, where "the body is not JSON" sent the person looking
    for a syntax error."""
    if "surrogate" in str(refused):
        return "the body's text holds half a character (a lone surrogate escape such as \\ud800)"
    return "the body is not JSON"


def reduce_chat_body(raw: bytes, max_parts: int, max_files: int) -> dict[str, Any]:
    """``raw``'s top-level scalar fields and ``messages``: its last user message alone,
    with its parts reduced to :data:`PART_KEYS` (only text and file parts kept), after
    the id of the assistant message before it when the body ends with it; or,
    when the last message is the assistant's (a continuation answering a waiting turn,
    :mod:`runtime.app.web.answers`), that message alone with its tool parts.

    Raises :class:`BodyRefused`: 400 for a body that is not a JSON object with a list of
    messages holding a user message, 413 for a last user message with more than
    ``max_parts`` parts or ``max_files`` file parts."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BodyRefused(400, not_json(exc)) from None
    if type(payload) is not dict:
        raise BodyRefused(400, "the body must be a JSON object")
    if "id" not in payload:
        raise BodyRefused(400, "'id' (the session id) is required")
    reduced = {key: _scalar(value) for key, value in payload.items() if key != "messages"}
    messages = payload.get("messages")
    if type(messages) is not list:
        raise BodyRefused(400, "'messages' must be a list")
    if messages and type(messages[-1]) is dict and messages[-1].get("role") == "assistant":
        answers = _answers_message(messages[-1], max_parts)
        try:
            lost = _long_number(raw) and _lost_int(answers.get("parts"))
        except RecursionError:  # (nested past Python's stack: as orjson read it)
            lost = False
        if lost:
            answers = _answers_message(_exactly(raw, payload)["messages"][-1], max_parts)
        reduced["messages"] = [answers]
        return reduced
    for at in range(len(messages) - 1, -1, -1):
        message = messages[at]
        if type(message) is dict and message.get("role") == "user":
            last = {key: _scalar(message[key]) for key in MESSAGE_KEYS if key in message}
            parts = message.get("parts")
            if type(parts) is list:
                last["parts"] = _counted_parts(parts, max_parts, max_files)
            reduced["messages"] = [*_held_answer(messages, at), last]
            return reduced
    raise BodyRefused(400, "no user message in 'messages'")


_PAST_64_BITS = float(1 << 63)

_DIGIT_MAP = bytes(49 if 48 <= b <= 57 else 48 for b in range(256))
"""Each byte as ``1`` (an ASCII digit) or ``0``, for :func:`_long_number`."""

_LONG_RUN = b"1" * 19
"""The fewest digits an integer orjson reads as a float has (``-9223372036854775809``,
past 64 bits: 19)."""


def _long_number(raw: bytes) -> bool:
    """Whether ``raw`` holds a run of 19 digits. Without one it holds no integer
    :func:`_lost_int` looks for (an integral float it would find was written as a float,
    which the standard library's reader reads the same), so the walk is skipped: it was
    one Python call per JSON value of the answer, on the event loop for a body below
    ``INLINE_BODY`` (256 KiB of ``[0,0,...]``: 130,968 calls, ~0.1 s of the loop).
    Two linear passes in C (a regex's ``[0-9]{19}`` is retried from each digit)."""
    return _LONG_RUN in raw.translate(_DIGIT_MAP)


def _lost_int(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` (what orjson read) holds an integral float of magnitude 2**63 or
    more: what orjson reads an integer past 64 bits as (``123456789012345678901234567890``
    is ``1.2345678901234568e+29``). Walked: a continuation's kept tool parts only (a
    client tool's output, an approval's edit), not the body
    (:func:`runtime.serde.lost_int`'s rule; this module imports no runtime)."""
    kind = type(value)
    if kind is float:
        return abs(value) >= _PAST_64_BITS and value.is_integer()
    if depth > 1000:
        return False
    if kind is dict:
        return any(_lost_int(v, depth + 1) for v in value.values())
    if kind is list:
        return any(_lost_int(v, depth + 1) for v in value)
    return False


def _exactly(raw: bytes, payload: Any) -> Any:
    """``raw`` read by the standard library's reader (integers of any size), which orjson
    read as ``payload``; nested past Python's stack, ``payload``."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return payload


BLOB_CHARS = 64 << 10
"""Strings this long or longer travel from the child as raw UTF-8 after the JSON, not in
it: decoding raw UTF-8 costs the server a copy, parsing a JSON string of tens of
megabytes (escapes, validation) a tenth of a second with the GIL held."""


def pack(value: Any) -> bytes:
    """``value`` (a reduced body) as the child writes it: JSON in which every long string
    is ``{"$blob": [start, end]}``, a newline, then those strings' UTF-8 bytes."""
    blobs: list[bytes] = []
    size = 0

    def cut(item: Any) -> Any:
        nonlocal size
        if isinstance(item, str) and len(item) >= BLOB_CHARS:
            data = item.encode("utf-8", "surrogatepass")
            blobs.append(data)
            size += len(data)
            return {"$blob": [size - len(data), size]}
        if isinstance(item, dict):
            return {key: cut(v) for key, v in item.items()}
        if isinstance(item, list):
            return [cut(v) for v in item]
        return item

    head = _head(cut(value))
    return b"".join([head, b"\n", *blobs])


def _head(value: Any) -> bytes:
    """``value``'s JSON (orjson); one holding an integer past 64 bits, which orjson does
    not write, by the standard library after a tab (whitespace orjson never writes), so
    that :func:`unpack` reads it with the standard library too (integers exact)."""
    try:
        return orjson.dumps(value)
    except TypeError as exc:
        if "64-bit" not in str(exc):
            raise
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return b"\t" + text.encode("utf-8", "surrogatepass")


def unpack(data: bytes | bytearray) -> Any:
    """What :func:`pack` packed. A ``{"$blob": ...}`` can only be the child's: a reduced
    body's dicts are its own (a client's objects arrive as ``{}``). The long strings are
    decoded straight from ``data``, with no copy of it."""
    end = data.index(b"\n")
    head = bytes(data[:end])
    blobs = memoryview(data)[end + 1 :]

    def restore(item: Any) -> Any:
        if isinstance(item, dict):
            span = item.get("$blob")
            if span is not None and len(item) == 1:
                return str(blobs[span[0] : span[1]], "utf-8", "surrogatepass")
            return {key: restore(v) for key, v in item.items()}
        if isinstance(item, list):
            return [restore(v) for v in item]
        return item

    return restore(json.loads(head) if head[:1] == b"\t" else orjson.loads(head))


def _limit_memory() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))
    except (ImportError, ValueError, OSError):  # pragma: no cover - not on this platform
        pass


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
VALUES = "--values"
"""The child's argument that makes it count a body's JSON values (:func:`json_values`)."""


def json_values_bound(raw: bytes) -> int:
    """At least as many as the JSON values in ``raw``: each value but a container's first
    follows a ``,``, each key a ``:``, each container opens with a ``[`` or ``{`` (the
    same characters inside strings count too)."""
    return raw.count(b",") + raw.count(b":") + raw.count(b"[") + raw.count(b"{") + 1


def json_values(raw: bytes) -> int:
    """:func:`json_values_bound` of ``raw`` with its strings taken out: the values, plus
    one for each empty array or object (so ``[[],[],...]`` meets a cap at half as many),
    for a body that is JSON (one that is not is refused by its parse)."""
    return json_values_bound(_JSON_STRING.sub(b"", raw))


def main(argv: list[str]) -> int:
    """The child: the body on stdin, ``{"body": reduced}`` or ``{"refused": [status,
    message]}`` on stdout, as :func:`pack` writes it; with :data:`VALUES`,
    ``{"values": json_values(body)}``."""
    _limit_memory()
    if argv[:1] == [VALUES]:
        sys.stdout.buffer.write(pack({"values": json_values(sys.stdin.buffer.read())}))
        return 0
    max_parts, max_files = int(argv[0]), int(argv[1])
    raw = sys.stdin.buffer.read()
    try:
        answer: dict[str, Any] = {"body": reduce_chat_body(raw, max_parts, max_files)}
    except BodyRefused as refused:
        answer = {"refused": [refused.status, refused.message]}
    except (MemoryError, RecursionError):
        answer = {"refused": [413, "the request body has too many JSON values to parse"]}
    del raw
    sys.stdout.buffer.write(pack(answer))
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child by runtime.app.web.chat_input
    sys.exit(main(sys.argv[1:]))
