"""Google Gemini over the ``google-genai`` SDK (``streamGenerateContent?alt=sse``).

The same verbs as the other providers:

* :func:`map_messages` / :func:`map_tools` restore the session's history into Gemini
  ``contents``: one ``model`` content per step, its parts in the order they were produced,
  then one ``user`` content with that step's ``function_response`` s in call order;
* :func:`parse_stream` turns the response chunks, the API's JSON as dicts (read from the
  body's bytes by :mod:`actors.providers.gemini_wire`, the SDK still building and
  sending the request), into :data:`runtime.chunks.StreamChunk` s;
* :func:`map_finish_reason` and :func:`classify_error` map the API's words onto ours,
  errors through the shared ladder (:mod:`actors.providers.failures`).

How each response part is kept, so the next request can send it back as it came:

* a *thought* part (``thought: true``, a thought summary, asked for with
  ``include_thoughts``) is a :class:`~runtime.messages.ReasoningPart` tagged
  :data:`PROVIDER`; a ``thought_signature`` on it is the part's ``signature`` (base64, as
  the API sends it) and closes it;
* text is :class:`~runtime.messages.TextPart` s, a ``function_call`` a
  :class:`~runtime.messages.ToolCallPart` (emitted as soon as its part arrives: Gemini
  sends a call whole, never in pieces);
* a ``thought_signature`` on a text or function-call part (Gemini signs the first call of
  each step, and the last part of an answer, sometimes an empty text part of its own) is
  opaque: a :class:`~runtime.messages.ProviderDataPart` ``{"thought_signature": ...,
  "of": "function_call" | "text" | "empty"}`` right after the part it came on, put back
  on that part (or on an empty text part) when the step is restored;
* any other part (``executable_code``, ``code_execution_result``, an image the model
  made...) is a :class:`~runtime.messages.ProviderDataPart` holding the part verbatim.

Signatures, thoughts and provider data go back only where they
:func:`~runtime.history.replays_to` this provider's origin (the model and endpoint that
made them: a signature is validated against them). Gemini 3 refuses a function call of
the *current* turn without its signature ("Function call is missing a
thought_signature"); where the signature may not go back (the turn began on another
model or provider), the first call of each step of the current turn carries the
documented :data:`SIGNATURE_SENTINEL` instead, for models that validate
(:func:`validates_signatures`).

The rate limiter hears what Gemini says: a 429 ``RESOURCE_EXHAUSTED`` (as the HTTP
status, or an error object inside the stream) with a ``google.rpc.RetryInfo``
``retryDelay`` in its details (else ``retry-after``) pauses every caller of the
configuration for that long; a ``retry-after`` on a streamed answer does too. Compaction
counts with the API's own ``models.countTokens`` (:meth:`GeminiProvider.count_tokens`).

The SDK is imported only inside functions, so importing this module (or ``runtime``)
loads none of it; the client is built on the first call. The SDK's own async HTTP client
keeps one pool per *asyncio* loop (``asyncio.get_running_loop()``, which Trio has not),
so the provider hands it an ``httpx`` client of the library the SDK itself imported,
which runs on Trio through AnyIO; the SDK retries nothing unless asked (retrying is the
turn runner's decision, it knows what was already streamed).
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from collections.abc import AsyncIterable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import trio

from actors.providers.failures import (
    StayHome,
    billed_when_cut,
    classify_status,
    classify_transport,
    finite,
    fitted_name,
    missing_key,
    retry_after,
    strict_loads,
    text_of,
    tokens,
)
from actors.providers.gemini_wire import (
    count_request,
    open_stream,
    sdk_chunks,
    standard_b64,
    wire_chunks,
    wire_request,
)
from actors.providers.json_slot import orjson_module
from actors.providers.sdk import SDKProvider
from runtime import errors
from runtime.actor_messages import InferRequest
from runtime.chunks import (
    FinishChunk,
    ProviderDataChunk,
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
    EMPTY_INPUT,
    ForeignReasoning,
    Origin,
    as_text,
    iter_turns,
    replays_to,
    split_steps,
)
from runtime.ids import new_id
from runtime.messages import (
    File,
    Image,
    Message,
    Part,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
    is_media_output,
)
from runtime.output_schema import OUTPUT_TOOL
from runtime.provider import Emit, ProviderOptions, cap_output
from runtime.serde import dumps, exact_loads, lost_int

PROVIDER = "google"
"""The provider tag on reasoning and provider data; only such parts are sent back here."""

SIGNATURE_SENTINEL = "skip_thought_signature_validator"
"""What Gemini's documentation says to put in ``thought_signature`` for a function call
that has no signature of its own (one another model made): the validator skips it."""

GENERATED_ID = "gcall"
"""Prefix of the tool call ids this provider makes for calls the API gave no ``id``;
such an id is never sent back (the API did not issue it)."""

TOOL_MEDIA_PLACEHOLDER = "[{kind} {media_type} omitted: function responses carry text only]"
"""What the model reads in a function response where the tool returned an image or file."""

FINISH_REASONS: dict[str, str] = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "SAFETY": "content-filter",
    "RECITATION": "content-filter",
    "BLOCKLIST": "content-filter",
    "PROHIBITED_CONTENT": "content-filter",
    "SPII": "content-filter",
    "IMAGE_SAFETY": "content-filter",
    "IMAGE_PROHIBITED_CONTENT": "content-filter",
    "IMAGE_RECITATION": "content-filter",
    "MODEL_ARMOR": "content-filter",
    "MALFORMED_FUNCTION_CALL": "error",
    "UNEXPECTED_TOOL_CALL": "error",
    "TOO_MANY_TOOL_CALLS": "error",
    "MISSING_THOUGHT_SIGNATURE": "error",
    "MALFORMED_RESPONSE": "error",
}
"""Gemini ``finishReason`` -> unified finish reason; anything else is ``other``."""

# Google's status words (``error.status``) -> the error-type words of the shared ladder,
# for an error whose HTTP status is missing; the HTTP status decides otherwise.
_STATUS_WORDS: dict[str, str] = {
    "RESOURCE_EXHAUSTED": "rate_limit",
    "UNAVAILABLE": "server_error",
    "INTERNAL": "internal_error",
    "UNKNOWN": "server_error",
    "UNAUTHENTICATED": "authentication_error",
    "PERMISSION_DENIED": "permission_error",
    "INVALID_ARGUMENT": "invalid_request_error",
    "FAILED_PRECONDITION": "invalid_request_error",
    "NOT_FOUND": "invalid_request_error",
}
_RESERVED = frozenset({"model", "contents"})
"""Request keys the provider owns; request options cannot replace them."""


def map_finish_reason(raw: str | None, *, tool_calls: bool = False) -> str:
    """The unified finish reason for a Gemini ``finishReason``.

    ``STOP`` -> ``tool-calls`` when the response holds function calls (Gemini says
    ``STOP`` either way), else ``stop``; ``MAX_TOKENS`` -> ``length``; the safety,
    recitation and blocklist reasons -> ``content-filter``; a malformed or unexpected
    function call, too many calls, a missing signature -> ``error``; anything else
    (``OTHER``, ``LANGUAGE``, newer words) -> ``other``.
    """
    reason = FINISH_REASONS.get(raw or "", "other")
    return "tool-calls" if reason == "stop" and tool_calls else reason


def validates_signatures(model: str | None) -> bool:
    """Whether ``model`` refuses a current-turn function call without its signature:
    Gemini 3 and later (``gemini-3-pro-preview``, ``models/gemini-3.1-flash``...). A name
    this cannot read (a tuned model, an alias) is taken not to."""
    found = re.search(r"gemini-(\d+)", model or "")
    return found is not None and int(found.group(1)) >= 3


# -- restoration: messages -> contents ------------------------------------------------------

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/heic", "image/heif"})
"""Image formats Gemini takes."""
FILE_TYPES = frozenset({"application/pdf", "text/plain"})
"""File formats taken here (documents)."""


def _unsupported(what: str) -> errors.UnsupportedMedia:
    return errors.UnsupportedMedia(f"Gemini cannot take {what}", provider=PROVIDER)


def _media_part(part: Image | File) -> dict[str, Any]:
    """An ``inline_data`` part (base64 bytes) or a ``file_data`` part (by URI)."""
    allowed = IMAGE_TYPES if isinstance(part, Image) else FILE_TYPES
    if part.media_type not in allowed:
        kind = "images" if isinstance(part, Image) else "files"
        raise _unsupported(f"{part.media_type} {kind} (only {', '.join(sorted(allowed))})")
    if part.data is None:
        return {"file_data": {"mime_type": part.media_type, "file_uri": part.url}}
    data = base64.b64encode(part.data).decode("ascii")
    return {"inline_data": {"mime_type": part.media_type, "data": data}}


def _user_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}] if content else []
    return [
        {"text": p.text} if isinstance(p, TextPart) else _media_part(p)
        for p in content
        if not (isinstance(p, TextPart) and not p.text)
    ]


_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}")
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_.:-]")


def tool_name(name: str) -> str:
    """A call's name as a ``function_call`` and its ``function_response`` carry it (the
    pattern of a declaration's name: a letter or ``_`` first, then letters, digits,
    ``_ . : -``, at most 64): a name the model invented, or none, fitted to it
    (:func:`~actors.providers.failures.fitted_name`), the same in the call and its
    response, which Gemini pairs by name."""
    return fitted_name(name, _NAME, _NOT_NAME, 64)


def _tool_input(value: Any) -> dict[str, Any]:
    """A ``function_call.args``, which must be an object: an input that did not parse
    (kept as its raw text; the call never ran) is sent as ``{}``; a float that is not
    finite as ``null``, as the store writes it (the SDK would write ``NaN``, no JSON)."""
    if isinstance(value, dict):
        return finite(value)
    if isinstance(value, str):
        try:
            decoded = strict_loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            return {}
        return decoded if isinstance(decoded, dict) else {}
    return {}


def _response_value(output: Any) -> Any:
    if is_media_output(output):  # function responses here carry text (see the docstring)
        return "\n".join(
            p.text
            if isinstance(p, TextPart)
            else TOOL_MEDIA_PLACEHOLDER.format(
                kind="image" if isinstance(p, Image) else "file", media_type=p.media_type
            )
            for p in output
        )
    if isinstance(output, str):
        return output
    # NaN and infinities become text ("NaN"): the SDK writes the body with json.dumps,
    # which would send them as bare words, and the API refuses that as invalid JSON.
    return json.loads(json.dumps(output, ensure_ascii=False, default=str), parse_constant=str)


def _function_response(result: ToolMessage) -> dict[str, Any]:
    """``{"output": ...}`` or ``{"error": ...}``, the keys Gemini's documentation names."""
    if result.error is not None:
        response: dict[str, Any] = {"error": result.error}
    else:
        response = {"output": _response_value(result.output)}
    body: dict[str, Any] = {"name": tool_name(result.tool_name), "response": response}
    if not result.tool_call_id.startswith(GENERATED_ID + "_"):
        body["id"] = result.tool_call_id
    return {"function_response": body}


def _step_parts(
    parts: Sequence[Part],
    target: Origin,
    foreign_reasoning: ForeignReasoning,
) -> list[dict[str, Any]]:
    """One step's parts, in the order they were produced, signatures back in place."""
    out: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part, TextPart):
            if part.text:
                out.append({"text": part.text})
        elif isinstance(part, ToolCallPart):
            call: dict[str, Any] = {
                "name": tool_name(part.tool_name),
                "args": _tool_input(part.input),
            }
            if not part.tool_call_id.startswith(GENERATED_ID + "_"):
                call["id"] = part.tool_call_id
            out.append({"function_call": call})
        elif isinstance(part, ReasoningPart):
            if not replays_to(part, target):
                shown = as_text(part) if foreign_reasoning == "text" else None
                if shown is not None:
                    out.append({"text": shown})
                continue
            if not part.text and not part.signature:
                continue
            thought: dict[str, Any] = {"text": part.text, "thought": True}
            if part.signature:
                thought["thought_signature"] = part.signature
            out.append(thought)
        elif isinstance(part, ProviderDataPart) and replays_to(part, target):
            data = part.data
            signature = data.get("thought_signature")
            if set(data) == {"thought_signature", "of"} and isinstance(signature, str):
                _attach(out, signature, data.get("of"))
            else:
                out.append(dict(data))
    return out


def _attach(out: list[dict[str, Any]], signature: str, of: Any) -> None:
    """Put ``signature`` back on the part it came on: the last one, when it is of the
    kind recorded and unsigned; else (it was an empty text part, or the part it came on
    is not sent) on an empty text part of its own, as the API streams it."""
    last = out[-1] if out else None
    if (
        last is not None
        and of in ("function_call", "text")
        and of in last
        and not last.get("thought")
        and "thought_signature" not in last
    ):
        last["thought_signature"] = signature
    else:
        out.append({"text": "", "thought_signature": signature})


def _sign_first_calls(content: dict[str, Any]) -> None:
    """The first function call of a current-turn step must carry a signature: the
    sentinel where the real one may not go back."""
    for part in content["parts"]:
        if "function_call" in part:
            part.setdefault("thought_signature", _SENTINEL_B64)
            return


def _b64(text: str) -> str:
    """The base64 text whose bytes the SDK sends as ``text`` itself (it encodes bytes
    URL-safe), so the wire carries exactly the sentinel the documentation names."""
    return base64.b64encode(base64.urlsafe_b64decode(text)).decode("ascii")


_SENTINEL_B64 = _b64(SIGNATURE_SENTINEL)


def map_messages(
    instructions: str | None,
    messages: Sequence[Message],
    *,
    origin: Origin | None = None,
    foreign_reasoning: ForeignReasoning = "drop",
    sentinel: bool = False,
) -> tuple[str | None, list[dict[str, Any]]]:
    """The ``system_instruction`` and ``contents`` of a Gemini request.

    ``messages`` are a repaired history (:func:`runtime.history.repair`, applied by the
    turn runner): every call has its result. A :class:`UserMessage` is a ``user`` content
    (text, and images and documents as ``inline_data`` with base64 bytes, or
    ``file_data`` by URI); a :class:`SystemMessage` joins the instructions; each
    assistant message is split by step into one ``model`` content (its parts as produced,
    see the module docstring) and one ``user`` content holding that step's
    ``function_response`` s (``{"output": ...}``, or ``{"error": ...}``) in call order. A
    model content left with no parts is omitted, a user message with nothing to send is
    :data:`~runtime.history.EMPTY_INPUT`, and so is a user content put first when the
    history starts with the model's (a client's, opened by its chat UI's greeting);
    contents of one role in a row are one content, but function responses stay alone
    in theirs (:func:`merge_same_roles`).

    Thoughts, signatures and provider data go back only where they
    :func:`~runtime.history.replays_to` ``origin`` (the calling provider's; ``None``:
    Gemini, any model or endpoint); reasoning from elsewhere is dropped, or with
    ``foreign_reasoning="text"`` sent as text in ``<think>`` tags. With ``sentinel``, the
    first function call of each step after the last user message (the current turn) that
    has no signature gets :data:`SIGNATURE_SENTINEL`. Bytes (``thought_signature``,
    ``inline_data.data``) are base64 text, which the SDK decodes. An image or file type
    Gemini cannot take raises :class:`~runtime.errors.UnsupportedMedia` before any
    request; images and files a tool returned become a text placeholder.
    """
    target = origin or Origin(provider=PROVIDER)
    system = [instructions] if instructions else []
    out: list[dict[str, Any]] = []
    current: list[dict[str, Any]] = []  # the model contents of the current turn
    for kind, msg, results in iter_turns(messages):
        if kind == "assistant":
            for parts, step_results in split_steps(msg, results):
                step = _step_parts(parts, target, foreign_reasoning)
                if step:
                    content = {"role": "model", "parts": step}
                    out.append(content)
                    current.append(content)
                if step_results:
                    responses = [_function_response(r) for r in step_results]
                    out.append({"role": "user", "parts": responses})
        elif isinstance(msg, SystemMessage):
            if msg.content:
                system.append(msg.content)
        elif isinstance(msg, UserMessage):
            given = _user_parts(msg.content) or [{"text": EMPTY_INPUT}]  # no empty content
            current = []
            out.append({"role": "user", "parts": given})
    if sentinel:
        for content in current:
            _sign_first_calls(content)
    out = merge_same_roles(out)
    if out and out[0]["role"] == "model":
        # A client's history opened by its chat UI's greeting: the API wants the user's
        # content first ("Please ensure that multiturn requests alternate between user
        # and model", a 400 for a model content first).
        out.insert(0, {"role": "user", "parts": [{"text": EMPTY_INPUT}]})
    return ("\n\n".join(system) or None), out


def merge_same_roles(contents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``contents`` with each run of contents of one role made one content, their parts
    concatenated in order, except that function responses are never put in one content
    with other parts.

    Why: the API wants ``user`` and ``model`` contents to alternate ("Please ensure that
    multiturn requests alternate between user and model", a 400; the SDK's own chat
    history stays alternating for it), and a history has runs of one role: two user
    messages in a row, two assistant messages in a row. Each was sent as its own
    content (branch ``providers3``). A step's function responses followed by a user
    message (steered into the turn, or sent after an interrupted one) stay two contents:
    Gemini refuses a content that mixes function responses with text (a 400, reported
    against LangChain.js #11445 and others), and with them merged Gemini 3 read the
    message as text to continue (gemini-cli #28700). A model content invented between
    them would be worse: the model repeated such placeholders (gemini-cli #29265)."""
    merged: list[dict[str, Any]] = []
    for content in contents:
        last = merged[-1] if merged else None
        if (
            last is not None
            and last["role"] == content["role"]
            and _responds(last) == _responds(content)
        ):
            merged[-1] = {**last, "parts": [*last["parts"], *content["parts"]]}
        else:
            merged.append(content)
    return merged


def _responds(content: dict[str, Any]) -> bool:
    return any("function_response" in part for part in content["parts"])


def map_tools(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """Gemini ``tools``: one ``{"function_declarations": [...]}`` holding every function
    (``name``, ``description`` when not empty, ``parameters_json_schema``: the tool's JSON
    schema as is), then each ``dict`` given as a Gemini tool already (a built-in such as
    ``{"google_search": {}}`` or ``{"code_execution": {}}``), sent as it is."""
    declarations: list[dict[str, Any]] = []
    native: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, dict):
            native.append(tool)
            continue
        spec = tool.spec()
        entry: dict[str, Any] = {"name": spec["name"]}
        if spec.get("description"):
            entry["description"] = spec["description"]
        entry["parameters_json_schema"] = spec.get("parameters") or {"type": "object"}
        declarations.append(entry)
    head = [{"function_declarations": declarations}] if declarations else []
    return [*head, *native]


def map_output(config: dict[str, Any], output: Any) -> None:
    """Ask for a structured answer, in ``config`` (a ``GenerateContentConfig`` dict).

    Without tools: JSON mode, ``response_mime_type="application/json"`` with the schema as
    ``response_json_schema``. With tools (Gemini 2.5 refuses JSON mode beside function
    calling): a ``final_output`` function whose parameters are the schema, and
    ``function_calling_config`` mode ``ANY`` so the model calls a function each step;
    that call's arguments stream back as the answer's text (:func:`parse_stream` with
    ``answer_tool``), never as a call to execute.
    """
    if not config.get("tools"):
        config["response_mime_type"] = "application/json"
        config["response_json_schema"] = output.schema
        return
    answer: dict[str, Any] = {"name": OUTPUT_TOOL, "parameters_json_schema": output.schema}
    if output.description:
        answer["description"] = output.description
    tools = config["tools"]
    if tools and "function_declarations" in tools[0]:
        tools[0]["function_declarations"].append(answer)
    else:
        tools.insert(0, {"function_declarations": [answer]})
    config["tool_config"] = {"function_calling_config": {"mode": "ANY"}}


# -- parsing: response chunks -> StreamChunk ------------------------------------------------


def _signature(part: dict[str, Any]) -> str | None:
    raw = text_of(part.get("thoughtSignature"), "a thoughtSignature", PROVIDER)
    return standard_b64(raw) if raw else None


def _usage(raw: dict[str, Any]) -> Usage:
    """The counts of ``usageMetadata``; one that is no count (a string, a negative
    number) is none (:func:`~actors.providers.failures.tokens`)."""

    def get(key: str) -> int | None:
        return tokens(raw.get(key))

    prompt = (get("promptTokenCount") or 0) + (get("toolUsePromptTokenCount") or 0)
    thoughts = get("thoughtsTokenCount")
    output = (get("candidatesTokenCount") or 0) + (thoughts or 0)
    return Usage(
        input_tokens=prompt,
        output_tokens=output,
        total_tokens=get("totalTokenCount") or prompt + output,
        cache_read=get("cachedContentTokenCount"),
        reasoning_tokens=thoughts,
    )


def _other_part(part: dict[str, Any]) -> dict[str, Any]:
    """A part kept whole (code, its result, an image the model made...) in the form the
    SDK's ``Part`` dumps (snake_case keys; bytes URL-safe base64), which is what the
    next request's ``contents`` take back; as it came if the SDK cannot read it."""
    from google.genai import types

    try:
        model = types.Part._from_response(response=dict(part), kwargs={})
    except (AttributeError, ValueError):
        return part
    dumped: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    return dumped


def _malformed(what: str) -> errors.MalformedStream:
    return errors.MalformedStream(f"unreadable response chunk: {what}", provider=PROVIDER)


def _exact_args(data: bytes, call: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    """``call``'s ``args`` read again exactly from its chunk's bytes ``data``: orjson read
    an integer past 64 bits in them as a float (``args``), which pydantic's ``int`` took
    as the wrong integer. Only a function call's args are walked for that
    (:func:`runtime.serde.lost_int`), never a text chunk. The call is found in the chunk
    read exactly by its name and id and by what orjson read of its args; ``args`` when
    none is (a chunk the continuation changed)."""
    doc = exact_loads(data)
    for candidate in doc.get("candidates") or () if type(doc) is dict else ():
        content = candidate.get("content") if type(candidate) is dict else None
        parts = content.get("parts") if type(content) is dict else None
        for part in parts if type(parts) is list else ():
            found = part.get("functionCall") if type(part) is dict else None
            if (
                type(found) is dict
                and found.get("name") == call.get("name")
                and found.get("id") == call.get("id")
                and type(found.get("args")) is dict
                and orjson_module().loads(dumps(found["args"])) == args
            ):
                exact: dict[str, Any] = found["args"]
                return exact
    return args


class _Parser:
    """One response stream's state: calls seen, the finish reason, the last usage."""

    def __init__(
        self, emit: Emit, answer_tool: str | None, last: list[bytes] | None = None
    ) -> None:
        self.emit = emit
        self.answer_tool = answer_tool
        self.last = last
        """The bytes of the chunk being read (``None``: read through the SDK's types)."""
        self.calls = 0
        self.finish: str | None = None
        self.blocked: str | None = None
        self.usage: dict[str, Any] | None = None
        """The last ``usageMetadata`` (running totals: only the last one counts, so it
        becomes a :class:`Usage` once, at the end)."""

    async def feed(self, response: dict[str, Any]) -> None:
        get = response.get
        usage = get("usageMetadata")
        if usage is not None:
            self.usage = usage
        feedback = get("promptFeedback")
        if feedback and feedback.get("blockReason") is not None:
            self.blocked = str(feedback["blockReason"])
        candidates = get("candidates")
        if not candidates:
            return
        candidate = candidates[0]  # one candidate is asked for; others are not this turn's
        content = candidate.get("content")
        parts = content.get("parts") if content else None
        if parts:
            emit = self.emit
            for part in parts:
                text = part.get("text")
                if type(text) is str and len(part) == 1:  # most parts: plain text
                    if text:
                        await emit(TextChunk(text=text))
                else:
                    await self.part(part)
        finish = candidate.get("finishReason")
        if finish is not None:
            self.finish = str(finish)

    async def part(self, part: dict[str, Any]) -> None:
        emit = self.emit
        signature = _signature(part)
        text = text_of(part.get("text"), "a part's text", PROVIDER)
        if part.get("thought"):
            if text:
                await emit(ReasoningChunk(text=text, provider=PROVIDER))
            if signature:
                await emit(ReasoningChunk(signature=signature, provider=PROVIDER))
            return
        call = part.get("functionCall")
        if call is not None:
            await self.call(call)
            if signature:
                await self.signed(signature, "function_call")
            return
        if text is not None:  # a part holds one kind of data; text is text
            if text:
                await emit(TextChunk(text=text))
            if signature:
                await self.signed(signature, "text" if text else "empty")
            return
        await emit(ProviderDataChunk(provider=PROVIDER, data=_other_part(part)))

    async def signed(self, signature: str, of: str) -> None:
        data = {"thought_signature": signature, "of": of}
        await self.emit(ProviderDataChunk(provider=PROVIDER, data=data))

    async def call(self, call: dict[str, Any]) -> None:
        name = text_of(call.get("name"), "a functionCall's name", PROVIDER) or ""
        args = call.get("args")
        if args is None:
            args = {}
        elif type(args) is not dict:
            raise _malformed(f"function call arguments are not an object: {args!r:.200}")
        elif self.last is not None and lost_int(args):
            args = _exact_args(self.last[0], call, args)
        if self.answer_tool is not None and name == self.answer_tool:
            await self.emit(TextChunk(text=json.dumps(args, ensure_ascii=False)))
            return
        self.calls += 1
        call_id = text_of(call.get("id"), "a functionCall's id", PROVIDER) or new_id(GENERATED_ID)
        clean = finite(args)  # NaN or an infinity (a chunk read by Python's json, as the
        error = None  # SDK's): no JSON number, so not run, as the other providers do
        if clean is not args:
            args, error = clean, "invalid JSON in function call arguments: a NaN or infinity"
        await self.emit(ToolInputStartChunk(tool_call_id=call_id, tool_name=name))
        await self.emit(
            ToolInputDeltaChunk(tool_call_id=call_id, delta=json.dumps(args, ensure_ascii=False))
        )
        await self.emit(
            ToolCallChunk(tool_call_id=call_id, tool_name=name, input=args, input_error=error)
        )

    async def billed(self) -> None:
        """The usage the chunks gave before the call failed, emitted once: billed though
        the call failed, as Anthropic's and OpenAI's failed calls count theirs (branch
        ``provleft``; Gemini's was dropped, branch ``leftmix``)."""
        usage, self.usage = self.usage, None  # (end() emits it otherwise: once either way)
        if type(usage) is dict:
            await self.emit(UsageChunk(usage=_usage(usage)))

    async def end(self) -> None:
        raw = self.finish
        if raw is None:
            if self.blocked is None:
                raise errors.MalformedStream(
                    "the response stream ended without a finishReason (cut short)",
                    provider=PROVIDER,
                )
            reason, raw = "content-filter", self.blocked  # the prompt itself was refused
        else:
            reason = map_finish_reason(raw, tool_calls=self.calls > 0)
        usage, self.usage = self.usage, None
        if usage is not None:
            await self.emit(UsageChunk(usage=_usage(usage)))
        await self.emit(FinishChunk(reason=reason, raw_reason=raw))


async def parse_stream(
    stream: AsyncIterable[dict[str, Any]],
    emit: Emit,
    *,
    answer_tool: str | None = None,
    last: list[bytes] | None = None,
) -> None:
    """Read a Gemini response stream (its chunks as the API's JSON, dicts: from the
    bytes, :func:`~actors.providers.gemini_wire.wire_chunks`, or from the SDK's types,
    :func:`~actors.providers.gemini_wire.sdk_chunks`) and ``emit`` :data:`StreamChunk` s.

    Thought, text and call parts go out as they arrive, in part order (see the module
    docstring for how each is kept); only the first candidate is read. After the stream
    come one :class:`UsageChunk` (the last ``usageMetadata``: Gemini's counts are
    running totals; output tokens include the thoughts) and the :class:`FinishChunk`. A
    prompt the API blocked (``promptFeedback.blockReason``, no candidate) finishes with
    ``content-filter``. A ``functionCall`` of ``answer_tool`` (structured output) is the
    answer: its arguments are emitted as text.

    Errors are raised classified (:func:`classify_error`): an error object in the stream
    or an HTTP error, a dropped connection, undecodable data, a chunk of the wrong
    shape, and a stream that ended without a ``finishReason`` (:class:`MalformedStream`).
    What was emitted before stays emitted; no :class:`FinishChunk` follows an error.
    """
    parser = _Parser(emit, answer_tool, last)
    iterator = aiter(stream)
    try:
        while True:
            try:
                response = await anext(iterator)
            except StopAsyncIteration:
                break
            except Exception as exc:
                raise classify_error(exc, streaming=True) from exc
            try:
                await parser.feed(response)
            except (AttributeError, TypeError, IndexError) as exc:  # a chunk of the wrong shape
                raise _malformed(f"{type(exc).__name__}: {exc}") from exc
        try:
            usage = parser.usage
            if usage is not None and type(usage) is not dict:
                raise TypeError(f"usageMetadata is {type(usage).__name__}")
        except TypeError as exc:
            raise _malformed(str(exc)) from exc
        await parser.end()
    except Exception:
        await parser.billed()
        raise
    except trio.Cancelled:  # the call's deadline, or its turn stopped: billed all the same
        usage, parser.usage = parser.usage, None
        if type(usage) is dict:
            await billed_when_cut(emit, UsageChunk(usage=_usage(usage)))
        raise


# -- errors ---------------------------------------------------------------------------------


def _retry_delay(details: Any) -> float | None:
    """Seconds from a ``google.rpc.RetryInfo`` in the error body (``"retryDelay": "37s"``)."""
    error = details.get("error") if isinstance(details, dict) else None
    for item in (error or {}).get("details") or () if isinstance(error, dict) else ():
        if isinstance(item, dict) and str(item.get("@type", "")).endswith("RetryInfo"):
            delay = str(item.get("retryDelay", "")).removesuffix("s")
            try:
                seconds = float(delay)
            except ValueError:
                return None
            return seconds if 0 <= seconds < float("inf") else None
    return None


def classify_error(exc: BaseException, *, streaming: bool = False) -> AxonError:
    """Map an SDK, transport or parsing exception onto :mod:`runtime.errors`.

    The SDK's ``APIError`` (an HTTP error status, or an error object sent inside the
    stream, which carries its own ``code``) goes through the shared status ladder
    (:func:`~actors.providers.failures.classify_status`) with its HTTP status, Google's
    status word (``RESOURCE_EXHAUSTED``, ``UNAVAILABLE``...) as the error type, ``code``
    ``overloaded`` when the message says the model is (Gemini's 503 "The model is
    overloaded"), and the wait a ``RetryInfo`` asks for (else ``retry-after``).
    Timeouts, dropped connections and undecodable data are transport failures
    (:func:`~actors.providers.failures.classify_transport`), as is a chunk the SDK cannot
    read (``streaming``: raised while the stream is read).
    """
    if isinstance(exc, AxonError):
        return exc
    from google.genai import errors as genai_errors

    if isinstance(exc, genai_errors.APIError):
        message = exc.message or str(exc)
        status = exc.code if isinstance(exc.code, int) else None
        word = exc.status if isinstance(exc.status, str) else None
        code = "overloaded" if "overloaded" in message.lower() else None
        response = getattr(exc, "response", None)
        wait = _retry_delay(exc.details)
        if wait is None:
            wait = retry_after(getattr(response, "headers", None))
        return classify_status(
            message,
            provider=PROVIDER,
            status=status,
            error_type=_STATUS_WORDS.get(word or "", word.lower() if word else None),
            code=code,
            retry_after=wait,
        )
    if isinstance(exc, genai_errors.UnknownApiResponseError):
        return errors.MalformedStream(f"undecodable stream data: {exc}", provider=PROVIDER)
    found = classify_transport(exc, provider=PROVIDER)
    if found is not None:
        return found
    if streaming and isinstance(exc, ValueError):  # pydantic: a chunk of the wrong shape
        return errors.MalformedStream(
            f"unreadable response chunk: {type(exc).__name__}: {exc}", provider=PROVIDER
        )
    return errors.ProviderError(errors.describe_exception(exc), provider=PROVIDER)


# -- the provider actor ---------------------------------------------------------------------


class GeminiProvider(SDKProvider):
    """Google Gemini (the Gemini Developer API) over the ``google-genai`` SDK: streaming,
    function calls, thought summaries, thought signatures kept and sent back, images.

    ``request_options`` are extra ``GenerateContentConfig`` fields for every call
    (``temperature``, ``max_output_tokens``, ``safety_settings``, ``thinking_config``...);
    a request's ``settings`` override them key by key. ``tools`` are added to the agent's
    functions (built-ins: ``[{"google_search": {}}]``). Names the SDK's config does not
    know go in the request body as they are (``http_options.extra_body``)."""

    provider_name: ClassVar[str] = PROVIDER
    default_endpoint: ClassVar[str | None] = "https://generativelanguage.googleapis.com"
    price_vendor: ClassVar[str | None] = "google"
    endpoint_env: ClassVar[str | None] = "GOOGLE_GEMINI_BASE_URL"
    key_env: ClassVar[tuple[str, ...]] = ("GOOGLE_API_KEY", "GEMINI_API_KEY")
    install_extra: ClassVar[str | None] = "google"
    """Where the key is read when none is given, in the SDK's order."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        include_thoughts: bool = True,
        thinking_budget: int | None = None,
        max_concurrency: int | None = None,
        timeout: float | None = 60.0,
        name: str | None = None,
        foreign_reasoning: ForeignReasoning = "drop",
        price_as: str | None = None,
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
        self.include_thoughts = include_thoughts
        """Ask for thought summaries (``thinking_config.include_thoughts``), streamed as
        reasoning. Set ``False`` for a model that does not think."""
        self.thinking_budget = thinking_budget
        """``thinking_config.thinking_budget`` in tokens (``0`` turns thinking off where
        the model allows, ``-1`` lets it decide); ``None``: the model's default."""
        self._key: str | None = None  # the key in use, given or from the environment
        self._http: Any = None

    @classmethod
    def from_options(cls, options: ProviderOptions) -> GeminiProvider:
        """``--provider google``: ``--model`` (default ``gemini-2.5-flash``),
        ``--base-url``, ``--api-key``, ``--thinking-budget``."""
        return cls(
            options.model or "gemini-2.5-flash",
            base_url=options.base_url,
            api_key=options.api_key,
            thinking_budget=options.thinking_budget,
        )

    def describe_settings(self) -> dict[str, Any]:
        return {
            "include_thoughts": self.include_thoughts,
            "thinking_budget": self.thinking_budget,
            "foreign_reasoning": self.foreign_reasoning,
        }

    def new_client(self) -> Any:
        """The ``genai.Client``, with an HTTP client of our own (see the module
        docstring) and no SDK retries."""
        # The SDK first, then the key: with neither, "set GEMINI_API_KEY" came first, and
        # once it was set, "install google-genai" (a newcomer on the core install).
        try:
            from google import genai  # the SDK: loaded by the first call only
            from google.genai import types
        except ImportError as exc:  # before: the ImportError left the call unclassified
            raise errors.ConfigurationError(
                "google cannot run without google-genai: pip install 'axon-runtime[google]'"
            ) from exc
        key = self._api_key or next(
            (os.environ[v] for v in self.key_env if os.environ.get(v)), None
        )
        if not key:
            raise missing_key(PROVIDER, " or ".join(self.key_env))

        self._key = key
        http = next(sys.modules[m] for m in ("httpx2", "httpx") if m in sys.modules)
        home = http.URL(self.endpoint or self.default_endpoint or "")
        # a redirect off the endpoint's origin is refused, as for every provider (its key
        # header, x-goog-api-key, went on there: branch provatk; the conversation too)
        hooks = {"request": [StayHome(home, PROVIDER)]}
        self._http = http.AsyncClient(
            timeout=self.timeout, follow_redirects=True, event_hooks=hooks
        )
        options = types.HttpOptions(
            base_url=self.base_url,
            timeout=None if self.timeout is None else int(self.timeout * 1000),
            httpx_async_client=self._http,
        )
        # vertexai=False: the SDK's GOOGLE_GENAI_USE_VERTEXAI would make this client
        # Vertex AI's (its express mode: other paths, another host the key is not sent
        # to), unlike this provider's endpoint and origin (branch ``platatk``)
        return genai.Client(api_key=key, vertexai=False, http_options=options)

    def client_secrets(self, client: Any) -> tuple[str | None, ...]:
        return (self._key,)

    def _cap(self, options: dict[str, Any], left: int | None) -> int | None:
        """``max_output_tokens`` in ``options`` (the settings over the provider's
        options), lowered to ``left``."""
        return cap_output(options, "max_output_tokens", left)

    def sent_cap(self, settings: Mapping[str, Any], left: int | None) -> int | None:
        """:meth:`request_params`' ``max_output_tokens`` (the API's only cap field)."""
        return self._cap({**self.request_options, **settings}, left)

    def request_params(self, request: InferRequest) -> dict[str, Any]:
        """The ``generate_content_stream`` keyword arguments (``model``, ``contents``,
        ``config``) for ``request``."""
        system, contents = map_messages(
            request.instructions,
            request.messages,
            origin=self.origin,
            foreign_reasoning=self.foreign_reasoning,
            sentinel=validates_signatures(self.model),
        )
        config: dict[str, Any] = {"automatic_function_calling": {"disable": True}}
        if system:
            config["system_instruction"] = system
        tools = map_tools(request.tools)
        thinking: dict[str, Any] = {}
        if self.include_thoughts:
            thinking["include_thoughts"] = True
        if self.thinking_budget is not None:
            thinking["thinking_budget"] = self.thinking_budget
        if thinking:
            config["thinking_config"] = thinking
        from google.genai import types

        known = types.GenerateContentConfig.model_fields
        extra_body: dict[str, Any] = {}
        options = self.call_options(request.settings)
        self._cap(options, request.max_output_tokens)  # the turn's left
        for key, value in options.items():
            if key in _RESERVED:
                continue
            if key == "tools":
                tools.extend(value or ())
            elif key == "extra_body":
                extra_body.update(value)
            elif key in known:
                config[key] = value
            else:
                extra_body[key] = value
        if tools:
            config["tools"] = tools
        if request.output is not None:
            map_output(config, request.output)
        if extra_body:
            config["http_options"] = {"extra_body": extra_body}
        return {"model": self.model, "contents": contents, "config": config}

    async def stream(self, request: InferRequest, emit: Emit) -> None:
        """One streamed call: restore, request, parse. The body is read from its bytes
        (:mod:`~actors.providers.gemini_wire`), or through the SDK's types where that
        cannot be. Failures raise classified errors."""
        try:
            client = self._get_client()
            params = self.request_params(request)
            wire = wire_request(client, params)
            last: list[bytes] | None = None
            if wire is None:
                responses = await client.aio.models.generate_content_stream(**params)
                chunks = sdk_chunks(responses)
            else:
                last = [b""]  # (each chunk's bytes: _Parser.call)
                chunks = wire_chunks(wire, self._open_hop, self.observe_headers, last)
        except AxonError:
            raise
        except Exception as exc:
            raise classify_error(exc) from exc
        answers_by_call = request.output is not None and "tool_config" in params["config"]
        try:
            await parse_stream(
                chunks, emit, answer_tool=OUTPUT_TOOL if answers_by_call else None, last=last
            )
        finally:
            # release the connection even when cancelled or failed mid-stream
            with trio.move_on_after(2) as scope:
                scope.shield = True
                await chunks.aclose()
                if wire is None:
                    await responses.aclose()

    async def _open_hop(self, wire: Any) -> tuple[Any, Any]:
        """One hop of :func:`~actors.providers.gemini_wire.wire_chunks`; a response
        whose body is not httpx's is refused (never seen with this provider's client)."""
        response, raw = await open_stream(wire)
        if raw is None:
            raise errors.ProviderError(
                "the SDK's HTTP response has no byte stream to read", provider=PROVIDER
            )
        return response, raw

    def classify_error(self, exc: BaseException) -> AxonError:
        return classify_error(exc)

    async def count_tokens(
        self, instructions: str | None, messages: Sequence[Message], tools: Sequence[Any]
    ) -> int | None:
        """The request's input tokens from the API's own count (``models.countTokens``:
        free, rate-limited apart from generation), for the same system instruction,
        contents and tools as a call sends.

        The SDK's ``count_tokens`` sends ``contents`` only on the Gemini Developer API
        (it refuses a system instruction and tools there), which would undercount a
        request by its instructions and tool declarations; the endpoint also takes the
        whole request as ``generateContentRequest``, which is what is sent here, its
        parts converted by the SDK exactly as :meth:`stream` sends them, through the
        SDK's client (its key, base URL and status errors). ``None`` (the estimate)
        where the SDK lacks what that takes (:func:`~actors.providers.gemini_wire
        .wire_request`)."""
        system, contents = map_messages(
            instructions,
            messages,
            origin=self.origin,
            foreign_reasoning=self.foreign_reasoning,
            sentinel=validates_signatures(self.model),
        )
        config: dict[str, Any] = {}
        if system:
            config["system_instruction"] = system
        declared = map_tools(tools)
        if declared:
            config["tools"] = declared
        try:
            client = self._get_client()
            params = {"model": self.model, "contents": contents, "config": config}
            wire = wire_request(client, params)
            if wire is None:
                return None
            counted = await count_request(wire)
        except AxonError:
            raise
        except Exception as exc:
            raise classify_error(exc) from exc
        return counted

    async def aclose(self) -> None:
        """Close the HTTP connection pool (the next call opens a new client)."""
        client, self._client = self._client, None
        http, self._http = self._http, None
        if client is not None:
            client.close()  # the SDK's idle synchronous pool
        if http is not None:
            await http.aclose()
