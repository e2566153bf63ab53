"""OpenAI Chat Completions provider (also serves OpenAI-compatible servers).

One module, four verbs, like every provider here:

* :func:`map_messages` / :func:`map_tools` restore the session's history into the
  Chat Completions request format (one ``assistant`` message per step, each followed by
  the ``tool`` results of that step, in call order);
* :func:`parse_stream` turns the Chat Completions chunk stream (plain JSON dicts from
  :func:`json_chunks`, or the SDK's models) into
  :data:`runtime.chunks.StreamChunk` s;
* :func:`map_finish_reason` and :func:`classify_error` map the SDK's words onto ours (the
  latter shared with the Responses provider: :mod:`actors.providers.openai_common`).

The ``openai`` SDK is imported only inside functions, so importing this module (or
``runtime``) stays fast and works without the SDK configured; the client is created on
the first call, with ``max_retries=0`` because retrying is the turn runner's decision.

Why the stream parser is shaped as it is (each point is a bug a peer shipped):

* tool calls are accumulated by id first, then by index: servers reuse an index for a
  new call, send ``""`` or no id on continuations, or send a whole call in one delta;
* a :class:`~runtime.chunks.ToolCallChunk` is emitted only after the whole stream ended
  (after the trailing usage chunk), never when the JSON first parses, and a call cut by
  ``length`` or the content filter carries an ``input_error`` so it is never executed;
* chunks with empty ``choices`` (Azure's leading ``prompt_filter_results``, the usage
  chunk, OpenAI's trailing moderation chunk) are not the end of the stream: ``[DONE]``
  is; a stream that ends without any ``finish_reason`` was cut and is an error;
* only choice ``0`` is read (``n > 1`` responses interleave other choices).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Iterable,
    Mapping,
    Sequence,
)
from contextlib import aclosing
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

import trio

from actors.providers.failures import (
    ELSEWHERE,
    HALF_HELD,
    HEAD_BYTES,
    SHAPE_ERRORS,
    Slot,
    arguments_json,
    created,
    quoted,
    read_holding,
    strict_loads,
    text_of,
    tokens,
    unreadable,
)
from actors.providers.json_slot import StringSlot, TwoStringSlot, learn, orjson_module
from actors.providers.openai_common import (
    OpenAISDKProvider,
    as_body,
    body_keys,
    classify_error,
    json_schema_spec,
    tool_name,
)
from actors.providers.openai_common import get_field as _get
from actors.providers.read_batch import ReadBatch
from actors.providers.sse import (
    SSEDecoder,
    body_bytes,
    event_batches,
    no_events,
    read_blocks,
    sdk_sse_response,
)
from runtime import errors
from runtime.actor_messages import InferRequest
from runtime.chunks import (
    FinishChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.errors import AxonError
from runtime.history import (
    ForeignReasoning,
    Origin,
    as_text,
    iter_turns,
    replays_to,
    split_steps,
)
from runtime.ids import new_id
from runtime.logging import get_logger
from runtime.messages import (
    AssistantMessage,
    File,
    Image,
    Message,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
    is_media_output,
)
from runtime.provider import Emit, ProviderOptions, cap_output
from runtime.redact import redact

_FINISH_REASONS = {
    "stop": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "length": "length",
    "content_filter": "content-filter",
    "error": "error",  # OpenRouter reports upstream failures this way
}

TRUNCATED = (
    "the tool call was truncated by the output limit (finish_reason={raw}) and was not executed"
)
FILTERED = "the tool call was cut by the content filter (finish_reason={raw}) and was not executed"


def map_finish_reason(raw: str | None) -> str:
    """The unified finish reason for a Chat Completions ``finish_reason``.

    ``stop`` -> ``stop``; ``tool_calls`` and the legacy ``function_call`` ->
    ``tool-calls``; ``length`` -> ``length``; ``content_filter`` -> ``content-filter``;
    ``error`` (OpenRouter) -> ``error``; anything else (``eos``, vendor words) -> ``other``.
    """
    return _FINISH_REASONS.get(raw or "", "other")


# -- restoration: messages -> request ------------------------------------------------------


CALL_ID_MAX = 40
"""The longest ``tool_calls[].id`` OpenAI takes ("string too long. Expected a string with
maximum length 40"): ids another server made (Responses item ids, a gateway's UUIDs) can
be longer."""


def tool_id(call_id: str, limit: int = CALL_ID_MAX) -> str:
    """``call_id`` as sent: itself when at most ``limit`` characters, else (longer, or
    empty: a client's history may hold ``""``, which the API refuses) ``call_`` and a
    digest of it, the same for a call and its result, so they still pair (the history
    keeps the id)."""
    if 0 < len(call_id) <= limit:
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"call_{digest[: limit - 5]}"


CallIdShape = Literal["openai", "mistral"]
"""The call ids a server takes: ``openai``, any id of at most :data:`CALL_ID_MAX`
characters; ``mistral``, exactly nine letters and digits (:data:`MISTRAL_CALL_ID`)."""

MISTRAL_CALL_ID = re.compile(r"[a-zA-Z0-9]{9}")
"""The ids Mistral's API (and vLLM serving a Mistral model) takes: "Tool call id was ...
but must be a-z, A-Z, 0-9, with a length of 9" (a 400 for an OpenAI ``call_...`` or an
Anthropic ``toolu_...`` id of a history another provider made)."""

_BASE62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _nine(raw: str, salt: int) -> str:
    number = int.from_bytes(
        hashlib.sha256(f"{salt}:{raw}".encode("utf-8", "surrogatepass")).digest()[:8], "big"
    )
    out = []
    for _ in range(9):
        number, digit = divmod(number, 62)
        out.append(_BASE62[digit])
    return "".join(out)


class CallIds:
    """The ids of one request's calls as its server takes them, the same for a call and
    its result (the history keeps the originals; the server's own new calls come with
    ids of its shape, kept as they are, so nothing maps back).

    For ``mistral``: an id of its shape is itself; any other is nine letters and digits
    made from a digest of it, deterministic (the same history gives the same request,
    so a prompt cache still matches) and unique within the request (one that would
    meet an id already given is made from the digest again, salted)."""

    __slots__ = ("_given", "_shape")

    def __init__(self, shape: CallIdShape, messages: Sequence[Message]) -> None:
        self._shape = shape
        self._given: dict[str, str] = {}
        if shape != "mistral":
            return
        raw: list[str] = []
        for message in messages:
            if isinstance(message, ToolMessage):
                raw.append(message.tool_call_id)
            elif isinstance(message, AssistantMessage):
                raw.extend(p.tool_call_id for p in message.content if isinstance(p, ToolCallPart))
        taken = {r for r in raw if MISTRAL_CALL_ID.fullmatch(r)}
        self._given = {r: r for r in taken}
        for r in raw:
            if r in self._given:
                continue
            salt, fitted = 0, _nine(r, 0)
            while fitted in taken:
                salt += 1
                fitted = _nine(r, salt)
            taken.add(fitted)
            self._given[r] = fitted

    def __call__(self, call_id: str) -> str:
        if self._shape == "mistral":
            return self._given.get(call_id) or _nine(call_id, 0)
        return tool_id(call_id)


def _arguments(value: Any) -> str:
    # A call whose input did not parse is stored as the raw string: send it back verbatim.
    return value if isinstance(value, str) else arguments_json(value)


IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Image formats Chat Completions takes."""
FILE_TYPES = frozenset({"application/pdf"})
"""File formats Chat Completions takes (as ``file_data``; a file URL it cannot take)."""
TOOL_MEDIA_PLACEHOLDER = (
    "[{kind} {media_type} omitted: Chat Completions tool results cannot carry images or files]"
)
"""What the model reads in a tool result where the tool returned an image or file."""


def _unsupported(what: str) -> errors.UnsupportedMedia:
    return errors.UnsupportedMedia(f"OpenAI Chat Completions cannot take {what}", provider="openai")


def _media_block(part: Image | File) -> dict[str, Any]:
    """An ``image_url`` or ``file`` content block for a user message."""
    if isinstance(part, Image):
        if part.media_type not in IMAGE_TYPES:
            raise _unsupported(f"{part.media_type} images (only {', '.join(sorted(IMAGE_TYPES))})")
        return {"type": "image_url", "image_url": {"url": part.data_url()}}
    if part.media_type not in FILE_TYPES:
        raise _unsupported(f"{part.media_type} files (only application/pdf)")
    if part.data is None:
        raise _unsupported("a file by URL (only inline data): pass its bytes as File(data=...)")
    return {
        "type": "file",
        "file": {"file_data": part.data_url(), "filename": part.filename or "file.pdf"},
    }


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    blocks = [
        {"type": "text", "text": p.text} if isinstance(p, TextPart) else _media_block(p)
        for p in content
        if not (isinstance(p, TextPart) and not p.text)
    ]
    return blocks or ""  # only empty text parts: the API refuses an empty array


def _media_output_text(parts: Sequence[Any]) -> str:
    # Chat Completions tool messages hold text only: the model is told what it missed.
    return "\n".join(
        p.text
        if isinstance(p, TextPart)
        else TOOL_MEDIA_PLACEHOLDER.format(
            kind="image" if isinstance(p, Image) else "file", media_type=p.media_type
        )
        for p in parts
    )


def _tool_message(result: ToolMessage, ids: CallIds) -> dict[str, Any]:
    if result.error is not None:
        content = result.error
    elif is_media_output(result.output):
        content = _media_output_text(result.output)
    elif isinstance(result.output, str):
        content = result.output
    else:
        content = json.dumps(result.output, default=str)
    return {"role": "tool", "tool_call_id": ids(result.tool_call_id), "content": content}


def _assistant_step(
    parts: Sequence[Any],
    send_reasoning_content: bool,
    target: Origin,
    foreign_reasoning: ForeignReasoning,
    ids: CallIds,
) -> dict[str, Any] | None:
    pieces: list[str] = []
    reasoning: list[str] = []
    for p in parts:
        if isinstance(p, TextPart):
            pieces.append(p.text)
        elif isinstance(p, ReasoningPart):
            # Untagged reasoning (split from ``<think>`` tags in the text) is the model's
            # own plain text, as the server sent it.
            if p.provider is None or replays_to(p, target):
                # unsigned text only: signatures/redacted data belong elsewhere
                if send_reasoning_content and p.signature is None and p.redacted_data is None:
                    reasoning.append(p.text)
            elif foreign_reasoning == "text" and (shown := as_text(p)) is not None:
                pieces.append(shown)
    text = "".join(pieces)
    calls = [
        {
            "id": ids(p.tool_call_id),
            "type": "function",
            "function": {"name": tool_name(p.tool_name), "arguments": _arguments(p.input)},
        }
        for p in parts
        if isinstance(p, ToolCallPart)
    ]
    if not text.strip() and not calls:
        return None  # nothing the API accepts (reasoning-only or ProviderDataPart-only step)
    message: dict[str, Any] = {"role": "assistant", "content": text if text.strip() else None}
    if joined := "".join(reasoning):
        message["reasoning_content"] = joined
    if calls:
        message["tool_calls"] = calls
    return message


def map_messages(
    instructions: str | None,
    messages: Sequence[Message],
    *,
    send_reasoning_content: bool = False,
    origin: Origin | None = None,
    foreign_reasoning: ForeignReasoning = "drop",
    call_ids: CallIdShape = "openai",
) -> list[dict[str, Any]]:
    """The Chat Completions ``messages`` for a session's history.

    ``messages`` are a repaired history (:func:`runtime.history.repair`, which the turn
    runner applies before every request): every call has its result. ``instructions``
    become the first ``system`` message, a :class:`SystemMessage` a ``system`` message
    where it stands, a :class:`UserMessage` a ``user`` message, and each assistant
    message is split by step into
    ``assistant{content, tool_calls}`` followed by one ``tool`` message per call of that
    step, in call order: exactly the sequence the model saw.

    Choices made here: a step's text parts are joined with ``""`` (they are slices of one
    stream); refusal text is sent as ordinary ``content`` (every compatible server
    accepts that, and the model sees what it said); reasoning is dropped unless
    ``send_reasoning_content`` is set (DeepSeek-style servers that require it back), and
    then only unsigned, unredacted reasoning goes out as that step's
    ``reasoning_content``, and only where it :func:`~runtime.history.replays_to`
    ``origin`` (the calling provider's; ``None``: ``openai``, any model or endpoint) or
    is untagged (split from ``<think>`` tags); reasoning from another provider, model or
    server is dropped, or with ``foreign_reasoning="text"`` sent in the step's
    ``content`` in ``<think>`` tags; :class:`~runtime.messages.ProviderDataPart` s are
    dropped; a step left with neither text nor tool calls is omitted, since the API
    rejects an assistant message with neither.

    User content with images or files becomes a list of content blocks: ``text``,
    ``image_url`` (a data URL or the image's URL) and ``file`` (``file_data``, a PDF's data
    URL, with its ``filename``). An image or file type the API cannot take (or a file
    given by URL) raises :class:`~runtime.errors.UnsupportedMedia` before any request.
    Tool messages hold text only: an image or file a tool returned is replaced by a
    placeholder that says so (:data:`TOOL_MEDIA_PLACEHOLDER`).

    Call ids are sent in the server's ``call_ids`` shape (:class:`CallIds`).
    """
    target = origin or Origin(provider="openai")
    ids = CallIds(call_ids, messages)
    out: list[dict[str, Any]] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for kind, message, results in iter_turns(messages):
        if kind == "assistant":
            for parts, step_results in split_steps(message, results):
                step = _assistant_step(
                    parts, send_reasoning_content, target, foreign_reasoning, ids
                )
                if step is not None:
                    out.append(step)
                out.extend(_tool_message(r, ids) for r in step_results)
        elif isinstance(message, SystemMessage):
            out.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            out.append({"role": "user", "content": _user_content(message.content)})
    return out


def map_tools(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """``[{"type": "function", "function": {name, description, parameters}}]`` from each
    tool's :meth:`runtime.tools.Tool.spec` (a plain spec dict is accepted as is); an
    empty description is omitted rather than sent as ``""``."""
    out = []
    for tool in tools:
        spec = tool.spec() if hasattr(tool, "spec") else dict(tool)
        function = {"name": spec["name"], "parameters": spec.get("parameters") or {}}
        if spec.get("description"):
            function["description"] = spec["description"]
        out.append({"type": "function", "function": function})
    return out


def map_output(output: Any) -> dict[str, Any]:
    """The ``response_format`` for an agent's :class:`~runtime.output_schema.OutputSchema`:
    ``json_schema`` in strict mode (:func:`~actors.providers.openai_common.json_schema_spec`)."""
    return {"type": "json_schema", "json_schema": json_schema_spec(output)}


# -- the stream: SDK chunks -> StreamChunk ------------------------------------------------


def _usage(raw: Any) -> Usage | None:
    """The usage object's counts; one that is no count (a string, a negative number) is
    none (:func:`~actors.providers.failures.tokens`)."""
    prompt, completion = tokens(_get(raw, "prompt_tokens")), tokens(_get(raw, "completion_tokens"))
    if prompt is None and completion is None:
        return None
    prompt, completion = prompt or 0, completion or 0
    return Usage(
        input_tokens=prompt,
        output_tokens=completion,
        total_tokens=tokens(_get(raw, "total_tokens")) or prompt + completion,
        cache_read=tokens(_get(_get(raw, "prompt_tokens_details"), "cached_tokens")),
        reasoning_tokens=tokens(_get(_get(raw, "completion_tokens_details"), "reasoning_tokens")),
    )


def _text(value: Any, what: str) -> str | None:
    return text_of(value, what, "openai")


def _fragment(args: Any) -> str | None:
    """A tool call's ``arguments`` fragment; a JSON value a server sent in the place of
    the string holding it (an object, an array) is that string. Why: the fragments are
    joined as strings; an object there failed the call with a ``TypeError``."""
    if args is None or type(args) is str:
        return args
    return json.dumps(args, ensure_ascii=False)


class _Call:
    """One tool call being accumulated from its deltas."""

    __slots__ = ("args", "id", "name", "started")

    def __init__(self, call_id: str) -> None:
        self.id = call_id
        self.name = ""
        self.args: list[str] = []
        self.started = False


class _ToolCalls:
    """Tool-call deltas -> calls, matched by id first and by index second."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []
        self._by_id: dict[str, _Call] = {}
        self._by_index: dict[Any, _Call] = {}

    def _call_for(self, call_id: str | None, index: Any) -> _Call:
        if call_id and call_id in self._by_id:
            return self._by_id[call_id]
        if not call_id:  # a continuation: the call last opened at this index
            call = self._by_index.get(index)
            if call is None and index is None and self.calls:
                call = self.calls[-1]
            if call is not None:
                return call
            call_id = new_id("call")  # the server gave no id at all: make one
        call = _Call(call_id)
        self.calls.append(call)
        self._by_id[call_id] = call
        self._by_index[index] = call  # a reused index now means this new call
        return call

    def feed(self, call_id: str | None, index: Any, name: str | None, args: str | None) -> list:
        """The chunks one delta produces (start once the name is known, then fragments)."""
        call = self._call_for(call_id, index)
        if name and not call.name:
            call.name = name
        if args:
            call.args.append(args)
        if call.started:
            return [ToolInputDeltaChunk(tool_call_id=call.id, delta=args)] if args else []
        if not call.name:
            return []  # wait for the name; fragments so far are flushed with the start
        call.started = True
        out: list[Any] = [ToolInputStartChunk(tool_call_id=call.id, tool_name=call.name)]
        if call.args:
            out.append(ToolInputDeltaChunk(tool_call_id=call.id, delta="".join(call.args)))
        return out

    def feed_delta(self, tool_calls: Any, legacy: Any) -> list:
        """The chunks of one delta's ``tool_calls`` fragments, then of its deprecated
        single ``function_call``."""
        out: list[Any] = []
        for tc in tool_calls or ():
            fn = _get(tc, "function")
            out += self.feed(
                _text(_get(tc, "id"), "a tool call's id"),
                _get(tc, "index"),
                _text(_get(fn, "name"), "a tool call's name"),
                _fragment(_get(fn, "arguments")),
            )
        if legacy is not None:
            name, args = _get(legacy, "name"), _get(legacy, "arguments")
            name = _text(name, "a function_call's name")
            out += self.feed(None, "function_call", name, _fragment(args))
        return out

    def finish(self, raw_reason: str | None, reason: str) -> list:
        """The complete calls, in call order; ``input_error`` when unusable."""
        out: list[Any] = []
        for call in self.calls:
            raw = "".join(call.args)
            error: str | None = None
            try:
                value: Any = strict_loads(raw) if raw.strip() else {}
            except (ValueError, RecursionError) as exc:  # a recursion bomb is no JSON either
                value, error = raw, f"invalid JSON in tool arguments: {exc}"
            if reason == "length":
                error = TRUNCATED.format(raw=raw_reason)
            elif reason == "content-filter":
                error = FILTERED.format(raw=raw_reason)
            elif not call.name:
                error = "the tool call has no name"
            if not call.started:
                out.append(ToolInputStartChunk(tool_call_id=call.id, tool_name=call.name))
            out.append(
                ToolCallChunk(
                    tool_call_id=call.id, tool_name=call.name, input=value, input_error=error
                )
            )
        return out


async def parse_stream(stream: AsyncIterable[Any], emit: Emit, *, provider: str = "openai") -> None:
    """Read a Chat Completions chunk stream and ``emit`` :data:`StreamChunk` s.

    Text, refusal, reasoning and tool-input chunks go out as they arrive; at the end of
    the stream come one :class:`UsageChunk` (the last usage seen: the trailing
    empty-``choices`` chunk, usage on a choice chunk, or Groq's ``x_groq.usage``), the
    :class:`ToolCallChunk` s in call order, and the :class:`FinishChunk` last.

    Reasoning is read from the ``reasoning_content`` delta field (DeepSeek, Z.ai, vLLM)
    or, when that is empty, ``reasoning`` (Groq, OpenRouter): one of the two, never both,
    because some servers fill both with the same text. Any refusal makes the finish
    reason ``content-filter`` (the raw reason stays what the server said).

    Errors are raised classified (:func:`classify_error`): an ``error`` object or
    ``event: error`` in the stream, a dropped connection, unparsable data, and a stream
    that ended with no ``finish_reason`` at all (:class:`MalformedStream`). Whatever was
    emitted before stays emitted; no :class:`FinishChunk` follows an error.
    """
    async with aclosing(_one_by_one(stream)) as batches:  # it stops at an error
        await parse_batches(batches, emit, provider=provider)


async def _one_by_one(stream: AsyncIterable[Any]) -> AsyncGenerator[list[Any], None]:
    iterator = aiter(stream)
    while True:
        try:
            chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        yield [chunk]


async def parse_batches(
    batches: AsyncIterable[list[Any]],
    emit: Emit,
    *,
    provider: str = "openai",
    coalesce: bool = False,
    runs: bool = False,
) -> None:
    """:func:`parse_stream` of chunks that come a network read at a time
    (:func:`json_chunk_batches`): each read's text chunks are sent together
    (:class:`~actors.providers.read_batch.ReadBatch`; with ``coalesce``, a read's
    consecutive text deltas join into one chunk; with ``runs``, those read through their
    slot go as a :class:`~runtime.provider.TextRun`). Errors, as there, are raised
    classified, after the chunks that came before them."""
    state = _StreamState(emit, provider)
    out = ReadBatch(emit, coalesce=coalesce, runs=runs)
    iterator = aiter(batches)
    while True:
        try:
            batch = await anext(iterator)
        except StopAsyncIteration:
            break
        except Exception as exc:
            await out.flush()
            if state.usage is not None:  # billed though the call failed: the turn counts it
                await emit(UsageChunk(usage=state.usage))
            raise classify_error(exc, provider=provider) from exc
        i, n = 0, len(batch)
        while i < n:
            chunk = batch[i]
            t = type(chunk)
            i += 1
            if t is list:  # texts of chunks read through their slot (json_chunk_batches)
                await out.text_list(chunk)
                continue
            text = _text_only(chunk) if t is dict else None
            if text is not None:  # the common chunk, read without the general path's look-ups
                if text:
                    out.text(text)
                    if out.urgent:
                        await out.flush()
                continue
            await out.flush()  # what came before goes first
            try:
                await state.read(chunk)
            except SHAPE_ERRORS as exc:  # a chunk of the wrong shape
                raise unreadable(exc, provider) from exc
        await out.flush()
    await _emit_end(
        emit, state.calls, state.usage, state.raw_reason, refused=state.refused, provider=provider
    )


class _StreamState:
    """What the general path has read of a stream: calls, usage, finish, refusal."""

    __slots__ = ("calls", "emit", "provider", "raw_reason", "refused", "usage")

    def __init__(self, emit: Emit, provider: str) -> None:
        self.emit = emit
        self.provider = provider
        self.calls = _ToolCalls()
        self.usage: Usage | None = None
        self.raw_reason: str | None = None
        self.refused = False

    async def read(self, chunk: Any) -> None:
        """A chunk that is not plain text: usage, choice 0's finish, reasoning, text,
        refusal and tool-call fragments, emitted in that order."""
        emit = self.emit
        found = _usage(_get(chunk, "usage")) or _usage(_get(_get(chunk, "x_groq"), "usage"))
        self.usage = found or self.usage
        for choice in _get(chunk, "choices") or ():
            if (_get(choice, "index") or 0) != 0:
                continue  # n > 1: only the first choice is this turn's answer
            reason = text_of(_get(choice, "finish_reason"), "a finish_reason", self.provider)
            self.raw_reason = reason or self.raw_reason
            delta = _get(choice, "delta")
            if delta is None:
                continue
            reasoning = _get(delta, "reasoning_content") or _get(delta, "reasoning")
            if reasoning and isinstance(reasoning, str):
                await emit(ReasoningChunk(text=reasoning, provider=self.provider))
            text = _get(delta, "content")
            if text and isinstance(text, str):
                await emit(TextChunk(text=text))
            refusal = text_of(_get(delta, "refusal"), "a refusal", self.provider)
            if refusal:
                self.refused = True
                await emit(TextChunk(text=refusal, refusal=True))
            tool_calls = _get(delta, "tool_calls")
            legacy = _get(delta, "function_call")  # deprecated single function call
            if tool_calls or legacy is not None:
                for item in self.calls.feed_delta(tool_calls, legacy):
                    await emit(item)


SLOT_LEARNING = 8
"""How many times a stream's text chunks are tried as a slot (:func:`json_chunk_batches`):
a server that sends each chunk with its own bytes besides the text then stops paying for
the try. (api.openai.com's ``obfuscation`` padding, a string of its own on every chunk,
is the slot's second string: :func:`_put_obfuscation`.)"""


def _text_or_none(chunk: Any) -> str | None:
    return _text_only(chunk) if type(chunk) is dict else None


def _put_text(chunk: dict[str, Any], text: str) -> None:
    chunk["choices"][0]["delta"]["content"] = text


def _put_obfuscation(chunk: dict[str, Any], padding: str) -> None:
    """Where api.openai.com's random padding goes (a chunk's ``obfuscation``, which no
    reader here looks at): a slot's second string (:mod:`~actors.providers.json_slot`)."""
    chunk["obfuscation"] = padding


_OBFUSCATION = (b'"obfuscation":', _put_obfuscation)


def _first_choice(chunk: dict[str, Any]) -> dict[str, Any] | None:
    choices = chunk.get("choices")
    if type(choices) is list:
        for choice in choices:
            if type(choice) is dict and not choice.get("index"):
                return choice
    return None


def _texts(chunk: dict[str, Any]) -> list[Slot]:
    """Where choice 0's texts are (:func:`hold_half`), in the order they are emitted:
    its reasoning, its text, its refusal, each tool call's arguments (the part: the
    delta's key, or ``("call", index)``)."""
    choice = _first_choice(chunk)
    delta = None if choice is None else choice.get("delta")
    if type(delta) is not dict:
        return []
    found: list[Slot] = []
    for key in ("reasoning_content", "reasoning"):
        if type(delta.get(key)) is str and delta[key]:
            found.append((delta, key, "reasoning"))
            break  # (both sent: the first is read, _StreamState.read)
    for key in ("content", "refusal"):
        if type(delta.get(key)) is str:
            found.append((delta, key, key))
    calls = delta.get("tool_calls")
    for call in calls if type(calls) is list else ():
        fn = call.get("function") if type(call) is dict else None
        if type(fn) is dict and type(fn.get("arguments")) is str:
            found.append((fn, "arguments", ("call", call.get("index"))))
    return found


def _text_of(chunk: dict[str, Any], part: Any) -> Slot | None:
    """Where choice 0's first text of ``part`` that says something is in ``chunk``
    (:func:`hold_half`), else its first empty one (a held half waits past it), if there.

    Why: two argument deltas of one call in a chunk, ``""`` then ``"\\ude00"``, after a
    held half kept the half for the empty one and sent the other half alone: U+FFFD
    twice live, the tool given the emoji (branch ``smallleft``)."""
    empty = None
    for at in _texts(chunk):
        if at[2] == part:
            if at[0][at[1]]:
                return at
            empty = empty or at
    return empty


def _last_text(chunk: dict[str, Any]) -> Slot | None:
    """Choice 0's last text in ``chunk`` that says something (:func:`hold_half`), if
    it has one. (Why: an empty one after it held no half, branch ``smallleft``.)"""
    for at in reversed(_texts(chunk)):
        if at[0][at[1]]:
            return at
    return None


def _part(chunk: dict[str, Any]) -> Any:
    """``None``: choice 0's answer ends with this chunk; :data:`ELSEWHERE`: the chunk is
    of other choices alone (``n`` > 1), which a held half waits past."""
    choice = _first_choice(chunk)
    if choice is None:
        choices = chunk.get("choices")
        return ELSEWHERE if type(choices) is list and choices else 0
    return None if choice.get("finish_reason") is not None else 0


def _half_flushed(part: Any) -> dict[str, Any]:
    """A chunk of a held half of ``part`` whose other half did not come
    (:meth:`_ChunkReader.refused`)."""
    if type(part) is tuple:  # a tool call's arguments
        call = {"index": part[1], "function": {"arguments": HALF_HELD}}
        delta: dict[str, Any] = {"tool_calls": [call]}
    else:
        delta = {"reasoning_content" if part == "reasoning" else part: HALF_HELD}
    return {"choices": [{"index": 0, "delta": delta}]}


_TEXT_DELTA_KEYS = frozenset({"content", "role"})


def _text_only(chunk: dict[str, Any]) -> str | None:
    """The text of a chunk that carries nothing else this parser reads: no usage, one
    choice (the first), no finish reason, a delta of ``content`` (and ``role``) only. That
    is almost every chunk of an answer, and reading it here skips the general path's
    dozen look-ups (issue 24). ``None`` for any other chunk, which the general path reads
    (a dict without ``content`` too: there, nothing is emitted either)."""
    if chunk.get("usage") is not None or "x_groq" in chunk:
        return None
    choices = chunk.get("choices")
    if type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("index") or choice.get("finish_reason") is not None:
        return None
    delta = choice.get("delta")
    if type(delta) is not dict:
        return None
    text = delta.get("content")
    if type(text) is not str:
        return None
    # ``content`` alone (the common delta) needs no look at the other keys
    return text if len(delta) == 1 or delta.keys() <= _TEXT_DELTA_KEYS else None


async def _emit_end(
    emit: Emit,
    calls: _ToolCalls,
    usage: Usage | None,
    raw_reason: str | None,
    *,
    refused: bool,
    provider: str,
) -> None:
    """After the last chunk: the usage, the complete calls and the finish; or
    :class:`MalformedStream` when no chunk gave a finish reason (the stream was cut)."""
    if raw_reason is None:
        raise errors.MalformedStream(
            "the stream ended without a finish_reason (the response was cut)", provider=provider
        )
    reason = "content-filter" if refused else map_finish_reason(raw_reason)
    if usage is not None:
        await emit(UsageChunk(usage=usage))
    for item in calls.finish(raw_reason, reason):
        await emit(item)
    await emit(FinishChunk(reason=reason, raw_reason=raw_reason))


DRAIN_AFTER_DONE = 0.1
"""Seconds to read what follows ``[DONE]`` (the end of the body, so the connection is
reused), as the SDK's own stream does; a server that keeps the body open is cut then."""

USAGE_GRACE = 1.0
"""Seconds the answer waits for the usage chunk it asked for once choice 0's
``finish_reason`` came (:func:`json_chunk_batches`): a server that ignores
``stream_options`` never sends one, and one that then keeps the body open held the
finished answer until the read timeout (then failed it) or, sending keep-alives, for
ever (branch ``provdeadline``). After the grace the answer ends whole, its usage
unknown (no usage chunk). OpenAI and the compatible servers send usage right after the
finish chunk, in the same read or the next."""


async def json_chunks(stream: Any) -> AsyncGenerator[Any, None]:
    """The chunks of an SDK ``AsyncStream`` as plain dicts, one at a time (the chunks of
    :func:`json_chunk_batches`)."""
    batches = json_chunk_batches(stream)
    async with aclosing(batches):
        async for batch in batches:
            for chunk in batch:
                yield chunk


async def json_chunk_batches(
    stream: Any, *, texts: bool = False, usage: bool | None = None
) -> AsyncGenerator[list[Any], None]:
    """The chunks of an SDK ``AsyncStream`` as plain dicts, decoded by orjson, a list per
    network read; with ``texts``, a chunk of text alone (:func:`_text_only`) that is the
    bytes of one such chunk before it around another string (and, from api.openai.com,
    another ``obfuscation`` padding string) comes as its text, read without
    decoding the rest (:mod:`~actors.providers.json_slot`), and consecutive ones as one
    ``list`` of their texts, in order.

    Why: the SDK builds a pydantic model of every chunk, and decodes the SSE lines in
    Python, one ``str`` and one event object at a time; those were most of what a stream
    costs on the client, while :func:`parse_stream` reads a handful of fields. So the
    request, the HTTP status errors and the connection stay the SDK's, the body's events
    are read from its bytes (:func:`~actors.providers.sse.sse_batches`, the SDK's own SSE
    rules), and this does what the SDK's stream does with each event: stop at ``[DONE]``
    (then read the rest of the body, briefly, so the connection is reused) and raise
    ``openai.APIError`` for an ``error`` object in the data, with the same message and
    body, after the chunks of the same read that came before it. Transport errors come
    from the HTTP library as they are (the SDK would wrap them; :func:`classify_error`
    maps both the same way). A stream the SDK does not decode as plain SSE goes through
    its ``_iter_events``; one without that iterator (another SDK version, a test double)
    is read as it is, a chunk per list.

    With ``texts``, a read of plain SSE made of ``data:`` + blank-line blocks is taken as
    its lines (:meth:`SSEDecoder.feed_lines`), and a run of text chunks of the slot's
    bytes is read from them by their bytes (:meth:`TwoStringSlot.run_lines`), not cut
    into ``(name, data)`` pairs first (issue 24 goal 1); every other block is read as
    its events, as before.

    With ``usage`` (``True``: the request asked for the usage chunk, ``False``: it did
    not), the answer is whole once choice 0's ``finish_reason`` came and, when usage was
    asked, a chunk with usage at or after it (the trailing ``choices: []`` chunk, or
    usage on the finish chunk as DeepSeek and Together send it): the body is then read on
    as before (a moderation chunk, an ``error``, ``[DONE]``) for at most
    :data:`DRAIN_AFTER_DONE` seconds, and cut there. Why: a server (a proxy) that kept
    the body open after the last chunk made a finished answer wait for the read timeout
    and fail with a ``ProviderTimeout``, as Anthropic did before it stopped at
    ``message_stop`` (branch ``provmend``). Usage asked and not there at the finish: the
    body is read on for at most :data:`USAGE_GRACE` seconds (a usage chunk then ends it
    as above), and cut there, the answer whole without usage (a server that ignores
    ``stream_options`` and keeps the body open, branch ``provdeadline``). ``None`` reads
    to ``[DONE]``.
    """
    iter_events = getattr(stream, "_iter_events", None)
    response = getattr(stream, "response", None)
    if iter_events is None or response is None:
        async for chunk in stream:
            yield [chunk]
        return
    reader = _ChunkReader(response, texts, usage)
    sse_response = sdk_sse_response(stream) if texts else None
    if sse_response is None:  # through the SDK's decoder, or no text to read by slot
        events = event_batches(stream)
        async with aclosing(events):
            while True:
                if reader.deadline is None:
                    batch = await anext(events, None)
                else:  # the answer is whole: the rest of the body, briefly
                    batch = None
                    with trio.move_on_at(reader.deadline):
                        batch = await anext(events, None)
                if batch is None:
                    return
                out: list[Any] = []
                failure, done = reader.events(batch, out)
                if out:
                    yield out  # what came before a failure or the end is the stream's
                if failure is not None:
                    raise failure
                if done:
                    await _drain_after_done(events)
                    return
    decoder = SSEDecoder()
    async with body_bytes(sse_response) as chunks:
        head, seen = b"", False
        while True:
            if reader.deadline is None:
                chunk = await anext(chunks, None)
            else:  # the answer is whole: the rest of the body, briefly
                chunk = None
                with trio.move_on_at(reader.deadline) as scope:
                    chunk = await anext(chunks, None)
                if scope.cancelled_caught:
                    return  # (what came after the answer and ends no event is dropped)
            if chunk is None:
                break
            lines, batch = decoder.feed_lines(chunk, 2)
            out = []
            if lines:
                failure, done = reader.lines(decoder, lines, out)
            else:
                failure, done = reader.events(batch, out) if batch else (None, False)
            if not seen:  # an event read (its chunk given, or a failure or the end raised)
                head, seen = head or chunk[:HEAD_BYTES], bool(out or batch)
            if out:
                yield out
            if failure is not None:
                raise failure
            if done:
                await _drain_after_done(chunks)
                return
        batch = decoder.finish()
        if batch:
            out = []
            failure, done = reader.events(batch, out)
            if out:
                yield out
            if failure is not None:
                raise failure
        elif not seen:
            raise no_events(sse_response, head, "openai")


_DATA_LEAD = b"data: "
"""A chunk's SSE block up to its data's value (:meth:`StringSlot.run_lines`)."""


class _ChunkReader:
    """What :func:`json_chunk_batches` knows of a stream between its reads: the slot of
    its text chunks and how many more may be tried as one; a method per form of a read
    (its events, or its lines, :meth:`~actors.providers.sse.SSEDecoder.feed_lines`)."""

    __slots__ = (
        "deadline",
        "fast",
        "finished",
        "half",
        "learning",
        "loads",
        "response",
        "saved",
        "slot",
        "usage",
        "watching",
        "whole",
    )

    def __init__(self, response: Any, texts: bool, usage: bool | None = None) -> None:
        self.loads = self.fast = orjson_module().loads
        self.half: tuple[Any, str] | None = None
        """Half a character held back from choice 0's text (:meth:`refused`)."""
        self.saved: tuple[StringSlot | TwoStringSlot | None, int] = (None, 0)
        self.response = response
        self.slot: StringSlot | TwoStringSlot | None = None
        self.learning = SLOT_LEARNING if texts else 0
        self.usage = usage
        """Whether the request asked for usage; ``None``: read to ``[DONE]``."""
        self.finished = False
        """Choice 0's ``finish_reason`` was read."""
        self.whole = False
        """That ``finish_reason`` says the answer is whole (:data:`_WHOLE`)."""
        self.deadline: float | None = None
        """When reading the body stops, once the answer is whole (:meth:`_ends`) or its
        usage is late (:data:`USAGE_GRACE`)."""
        self.watching = usage is not None
        """Whether a chunk may still end the answer (:meth:`_ends`): until one has."""

    def lines(
        self, decoder: SSEDecoder, lines: list[bytes], out: list[Any]
    ) -> tuple[Exception | None, bool]:
        """A read given as SSE lines, two a block, into ``out``: the runs of text chunks
        that are the slot's bytes read by their lines (:meth:`StringSlot.run_lines`: no
        ``(name, data)`` pair, no cut ``data:`` line a chunk; issue 24 goal 1), any other
        block read as its events by :meth:`events`, in order. What went wrong (after the
        chunks before it) or ``None``, and whether ``[DONE]`` came."""
        return read_blocks(self, decoder, lines, 2, _DATA_LEAD, self.events, out)

    def events(
        self, batch: Sequence[tuple[Any, bytes]], out: list[Any]
    ) -> tuple[Exception | None, bool]:
        """A read's ``(name, data)`` events into ``out``; what went wrong (after the
        chunks before it) or ``None``, and whether ``[DONE]`` came."""
        loads = self.loads
        slot = self.slot
        learning = self.learning
        failure: Exception | None = None
        done = False
        i, n = 0, len(batch)
        while i < n:
            if slot is not None:  # a run of text chunks, at once
                run, i = slot.run(batch, i, None)
                if run:
                    out.append(run)
                    if i == n:
                        break
            data = batch[i][1]
            i += 1
            if not data:
                # No data: a block of a ``retry:`` or ``id:`` field alone (the SDK's
                # decoder makes it an event, the SSE specification none); the SDK then
                # failed the stream parsing it as JSON. Nothing to read.
                continue
            if slot is not None:
                text = slot.text(data)  # (an event with a name, read as before)
                if text is not None:
                    out.append([text])
                    continue
            if data.startswith(b"[DONE]"):
                if self.half is not None:  # (once a stream)
                    out.append(_half_flushed(self.half[0]))
                done = True
                break
            try:
                chunk = loads(data)
            except ValueError as exc:
                try:
                    chunk = self.refused(data, exc, out, slot, learning)
                except ValueError as refused:
                    failure = refused
                    break
                loads, slot, learning = self.loads, self.slot, self.learning
            if type(chunk) is not dict:
                # A JSON array here was read downstream as a run of texts (the form
                # this reader gives those in) and crashed the engine with its numbers.
                failure = errors.MalformedStream(
                    f"a chunk is not a JSON object: {quoted(data)}", provider="openai"
                )
                break
            if chunk.get("error"):
                if type(chunk.get("usage")) is dict:  # billed, said beside the error
                    out.append({"choices": [], "usage": chunk["usage"]})  # (OpenRouter)
                if self.whole:
                    # After choice 0's stop or tool calls the answer is whole (only its
                    # usage may be missing): failing it made a fallback ask again, billed
                    # twice. (After ``length`` OpenRouter's "Token limit reached" stays
                    # the error it was.)
                    get_logger("axon.providers").warning(
                        "provider.error_after_answer",
                        provider="openai",
                        error=redact(quoted(data)),
                    )
                    done = True
                    break
                failure = _stream_error(chunk["error"], self.response)
                break
            out.append(chunk)
            if self.watching and self._ends(chunk):
                self.watching = False
                self.deadline = trio.current_time() + DRAIN_AFTER_DONE  # the answer is whole
            if learning and type(chunk) is dict and _text_only(chunk):
                learning -= 1  # each chunk may differ (an obfuscation field): a few tries
                slot = (
                    learn(data, chunk, b'"content":', _text_or_none, _put_text, pad=_OBFUSCATION)
                    or slot
                )
        self.slot = slot
        self.learning = learning
        return failure, done

    def refused(
        self,
        data: bytes,
        exc: ValueError,
        out: list[Any],
        slot: StringSlot | TwoStringSlot | None,
        learning: int,
    ) -> Any:
        """An chunk's JSON that ``self.loads`` refused with ``exc``, read on the slow
        path that holds half a character back (:func:`read_holding`)."""
        return read_holding(
            self, data, exc, out, slot, learning, _text_of, _last_text, _part, _half_flushed
        )

    def _ends(self, chunk: dict[str, Any]) -> bool:
        """Whether ``chunk`` ends the answer (:func:`json_chunk_batches`' ``usage``):
        choice 0's finish came (in it or before) and, if usage was asked, it has usage."""
        if not self.finished:
            choices = chunk.get("choices")
            if type(choices) is not list:
                return False
            for choice in choices:
                if (
                    type(choice) is dict
                    and not choice.get("index")
                    and choice.get("finish_reason") is not None
                ):
                    self.finished = True
                    reason = choice.get("finish_reason")
                    self.whole = type(reason) is str and reason in _WHOLE
            if not self.finished:
                return False
            if self.usage:  # the usage asked, from now on a grace to come in
                self.deadline = trio.current_time() + USAGE_GRACE
        if not self.usage:
            return True
        groq = chunk.get("x_groq")
        return type(chunk.get("usage")) is dict or (
            type(groq) is dict and type(groq.get("usage")) is dict
        )


async def _drain_after_done(events: AsyncIterator[Any]) -> None:
    """Read what follows ``[DONE]`` for at most :data:`DRAIN_AFTER_DONE` seconds and drop
    it: the body read to its end lets the HTTP library reuse the connection for the next
    request, as the SDK's own stream does; a server that keeps the body open is cut."""
    with trio.move_on_after(DRAIN_AFTER_DONE):
        async for _ in events:
            pass


_WHOLE = frozenset({"stop", "tool_calls", "function_call"})
"""The finish reasons after which an error chunk leaves the answer whole."""


def _stream_error(body: Any, response: Any) -> Exception:
    """The ``APIError`` the SDK raises for an ``error`` object inside the stream."""
    import openai

    message = body.get("message") if isinstance(body, dict) else body
    if not message or not isinstance(message, str):  # (a string is its own message)
        message = "An error occurred during streaming"
    return openai.APIError(message=message, request=response.request, body=body)


# -- the provider actor ------------------------------------------------------------------


def _call_ids_for(base_url: str | None) -> CallIdShape:
    """``mistral`` for an endpoint on ``mistral.ai``, else ``openai``."""
    host = (urlsplit(base_url).hostname or "") if base_url else ""
    return "mistral" if host == "mistral.ai" or host.endswith(".mistral.ai") else "openai"


def _cap_field_for(base_url: str | None) -> str:
    """The request field that caps a call's output: ``max_completion_tokens`` on OpenAI's
    own API (its reasoning models refuse ``max_tokens``), ``max_tokens`` on any other
    server. Why: compatible servers read ``max_tokens``, and not all read the newer name:
    Mistral refuses it (422, "Extra inputs are not permitted"), Ollama and LM Studio
    ignore it and write on to the context's end (vLLM and llama.cpp take both)."""
    host = (urlsplit(base_url).hostname or "") if base_url else "api.openai.com"
    own = host == "api.openai.com" or host.endswith(".openai.azure.com")
    return "max_completion_tokens" if own else "max_tokens"


def _cap_fields(options: dict[str, Any], default: str) -> tuple[str, ...]:
    """The output cap fields a call's ``options`` name (an agent's ``settings`` or the
    provider's options may name either, for a server that reads only that one), else the
    provider's ``default`` (:func:`_cap_field_for`)."""
    named = tuple(k for k in ("max_completion_tokens", "max_tokens") if k in options)
    return named or (default,)


BODY_KEYS = ("messages", "tools", "stream_options")
"""The ``create`` arguments the provider builds as wire JSON, given to the SDK in
``extra_body`` (:func:`~actors.providers.openai_common.as_body`), with ``model``
(:func:`~actors.providers.openai_common.body_keys`) and a ``response_format`` given as
a dict (an answer schema's: 41 us of the SDK's walk a call, which returns it as it is)."""


class OpenAIProvider(OpenAISDKProvider):
    """Chat Completions over the ``openai`` SDK, for OpenAI and compatible servers.

    ``request_options`` are extra ``chat.completions.create`` arguments for every call
    (``temperature``, ``max_completion_tokens``, ``extra_body``...)."""

    provider_name: ClassVar[str] = "openai"
    default_endpoint: ClassVar[str | None] = "https://api.openai.com/v1"
    endpoint_env: ClassVar[str | None] = "OPENAI_BASE_URL"
    price_vendor: ClassVar[str | None] = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        send_reasoning_content: bool = False,
        max_concurrency: int | None = None,
        timeout: float | None = 60.0,
        name: str | None = None,
        foreign_reasoning: ForeignReasoning = "drop",
        price_as: str | None = None,
        call_ids: CallIdShape | None = None,
        **request_options: Any,
    ) -> None:
        super().__init__(
            model,
            base_url=base_url,
            api_key=api_key,
            max_concurrency=max_concurrency,
            timeout=timeout,
            name=name,
            foreign_reasoning=foreign_reasoning,
            request_options=request_options,
            price_as=price_as,
        )
        self.send_reasoning_content = send_reasoning_content
        """Send each step's unsigned reasoning back as ``reasoning_content`` (DeepSeek
        thinking mode requires it; other servers reject or ignore the field)."""
        if call_ids is not None and call_ids not in ("openai", "mistral"):
            raise errors.ConfigurationError(
                f"call_ids must be 'openai' or 'mistral', not {call_ids!r}"
            )
        self.cap_field = _cap_field_for(base_url)
        """Where a call's output cap goes when no option names one (:func:`_cap_field_for`):
        the turn's output budget left (:attr:`InferRequest.max_output_tokens`)."""
        self.call_ids: CallIdShape = call_ids or _call_ids_for(base_url)
        """The shape of the call ids the server takes (:class:`CallIds`): ``mistral``
        for a ``base_url`` on ``mistral.ai`` unless given; give it for Mistral's models
        served elsewhere (vLLM checks their ids the same way)."""

    @classmethod
    def from_options(cls, options: ProviderOptions) -> OpenAIProvider:
        """``--provider openai``: ``--model`` (default ``gpt-4o-mini``), ``--base-url``
        for any compatible server, ``--api-key``."""
        return cls(
            options.model or "gpt-4o-mini", base_url=options.base_url, api_key=options.api_key
        )

    def _cap(self, options: dict[str, Any], left: int | None) -> int | None:
        """Lower the cap fields ``options`` name (else :attr:`cap_field`) to ``left``;
        the smallest cap they then carry (``None``: none)."""
        caps = [cap_output(options, f, left) for f in _cap_fields(options, self.cap_field)]
        sent = [c for c in caps if c is not None]
        return min(sent) if sent else None

    def sent_cap(self, settings: Mapping[str, Any], left: int | None) -> int | None:
        """:meth:`request_params`' cap: in the field the options name, or
        :attr:`cap_field`."""
        return self._cap({**self.request_options, **settings}, left)

    def request_params(self, request: InferRequest) -> dict[str, Any]:
        """The ``chat.completions.create`` keyword arguments for ``request``."""
        options = self.call_options(request.settings)
        params: dict[str, Any] = {
            "model": self.model,
            "messages": map_messages(
                request.instructions,
                request.messages,
                send_reasoning_content=self.send_reasoning_content,
                origin=self.origin,
                foreign_reasoning=self.foreign_reasoning,
                call_ids=self.call_ids,
            ),
        }
        if request.tools:
            params["tools"] = map_tools(request.tools)
        if request.output is not None:
            params["response_format"] = map_output(request.output)
        self._cap(options, request.max_output_tokens)
        stream_options = options.pop("stream_options", {})
        params.update(options)
        params["stream"] = True
        if stream_options is not None:  # an explicit None omits it for servers that reject it
            params["stream_options"] = {"include_usage": True, **stream_options}
        return params

    async def stream(self, request: InferRequest, emit: Emit) -> None:
        """One streamed Chat Completions call; raises a classified error on failure."""
        params = self.request_params(request)
        client = self._get_client()
        try:
            keys: tuple[str, ...] = BODY_KEYS
            if type(params.get("response_format")) is dict:  # an answer schema's, or a dict
                keys = (*keys, "response_format")  # (a model class stays for create to refuse)
            response = await created(
                client.chat.completions.create, as_body(params, body_keys(client, keys))
            )
        except Exception as exc:
            raise classify_error(exc, provider=self.provider_name) from exc
        await self.observe_headers(getattr(response, "response", None))  # rate limits
        asked = params.get("stream_options")
        usage = type(asked) is dict and bool(asked.get("include_usage"))
        async with response:  # closes the HTTP response on error and on cancellation
            batches = json_chunk_batches(response, texts=True, usage=usage)
            async with aclosing(batches):
                await parse_batches(
                    batches,
                    emit,
                    provider=self.provider_name,
                    coalesce=self.coalesce_deltas,
                    runs=request.text_runs,
                )

    def classify_error(self, exc: BaseException) -> AxonError:
        return classify_error(exc, provider=self.provider_name)

    def count_items(
        self, instructions: str | None, messages: Sequence[Message], tools: Sequence[Any]
    ) -> list[Any]:
        """The request's ``messages`` and tool definitions (for :meth:`count_tokens`)."""
        items: list[Any] = map_messages(
            instructions,
            messages,
            send_reasoning_content=self.send_reasoning_content,
            origin=self.origin,
            foreign_reasoning=self.foreign_reasoning,
            call_ids=self.call_ids,
        )
        return [*items, map_tools(tools)] if tools else items

    def describe_settings(self) -> dict[str, Any]:
        return {
            "send_reasoning_content": self.send_reasoning_content,
            "foreign_reasoning": self.foreign_reasoning,
            "call_ids": self.call_ids,
        }
