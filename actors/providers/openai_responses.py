"""OpenAI Responses API provider (``POST /v1/responses``): where OpenAI's reasoning models
expose their reasoning.

The same verbs as the other providers:

* :func:`map_messages` / :func:`map_tools` restore the session's history into Responses
  ``input`` items, step by step: each step's items in the order they were produced
  (``reasoning``, ``message``, ``function_call``, built-in tool items), then one
  ``function_call_output`` per call of that step, in call order;
* :func:`parse_stream` turns the SDK's typed ``ResponseStreamEvent`` s
  (``client.responses.create(stream=True)``) into :data:`runtime.chunks.StreamChunk` s;
* :func:`map_finish_reason` and :func:`classify_error` map the API's words onto ours,
  errors through the shared ladder (:mod:`actors.providers.failures`).

How each output item is kept, so the next request can send it back:

* a ``reasoning`` item is a :class:`~runtime.messages.ReasoningPart` tagged
  :data:`PROVIDER`: its summary texts (joined by a blank line) are the part's text, and
  its ``signature`` is the item itself as compact JSON (``{"item": {...}, "next":
  {...}}``): ``id``, ``summary`` and ``encrypted_content`` verbatim, plus the type and id
  of the item that followed it, which the API checks ("reasoning was provided without
  its required following item"). A reasoning item that never completed (the stream was
  cut) stays unsigned and is never sent back, like an interrupted Anthropic block;
* ``message`` text is :class:`~runtime.messages.TextPart` s (refusals marked);
* a ``function_call`` is a :class:`~runtime.messages.ToolCallPart` (``call_id``);
* any other output item (``web_search_call``, ``file_search_call``,
  ``code_interpreter_call``, ``image_generation_call``, ``mcp_call``...) ran on OpenAI's
  side: it is a :class:`~runtime.messages.ProviderDataPart` holding the item verbatim,
  sent back as it came; an item that waits for the client's answer (a
  ``custom_tool_call``, ``shell_call``, ``local_shell_call``, ``apply_patch_call``,
  ``computer_call``, client ``tool_search_call`` or ``mcp_approval_request``, from a tool
  given in ``request_options``) too, never run, and answered in the next request by its
  output item saying so (:func:`_unanswered_outputs`).

Reasoning and provider data go back only to this provider, and only to the model and
endpoint that produced them (``encrypted_content`` is bound to its organization: any
other answers ``invalid_encrypted_content``); reasoning from elsewhere (Chat Completions
``reasoning_content``, Anthropic's signed thinking, another model's or server's items) is
dropped, or sent as assistant text with ``foreign_reasoning="text"``. With
``store=False`` (the default: nothing is kept on OpenAI's side) the request asks for
``include=["reasoning.encrypted_content"]`` and a reasoning item without encrypted
content is not sent back (the API would look its ``id`` up and answer 404).

The ``openai`` SDK is imported only inside functions, so importing this module (or
``runtime``) stays fast; the client is built on the first call with ``max_retries=0``
(retrying is the turn runner's decision, it knows what was already streamed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncGenerator, AsyncIterable, Iterable, Mapping, Sequence
from contextlib import aclosing
from typing import Any, ClassVar

from actors.providers.failures import (
    HALF_HELD,
    HEAD_BYTES,
    SHAPE_ERRORS,
    Slot,
    arguments_json,
    classify_status,
    created,
    hold_half,
    refuse_held,
    strict_loads,
    text_of,
    tokens,
    unreadable,
)
from actors.providers.json_slot import orjson_module
from actors.providers.openai_common import (
    OpenAISDKProvider,
    as_body,
    body_keys,
    json_schema_spec,
    tool_name,
)
from actors.providers.openai_common import classify_error as _classify_openai
from actors.providers.sse import (
    SSEDecoder,
    body_bytes,
    no_events,
    read_to_end,
    sdk_sse_response,
)
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
    ForeignReasoning,
    Origin,
    as_text,
    iter_turns,
    replays_to,
    split_steps,
)
from runtime.ids import is_call_id_of, new_id
from runtime.json_exact import dumps, exact_loads, lost_int
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
from runtime.provider import Emit, ProviderOptions, cap_output

PROVIDER = "openai-responses"
"""The provider tag on reasoning and provider data; only such parts are sent back here."""

ENCRYPTED_REASONING = "reasoning.encrypted_content"
"""The ``include`` value that makes reasoning items carry their encrypted content."""

SUMMARY_SEPARATOR = "\n\n"
"""Streamed between two summary parts of one reasoning item (each is a paragraph)."""

TRUNCATED = "the function call was cut off before it completed ({reason}) and was not executed"

_INCOMPLETE_REASONS = {"max_output_tokens": "length", "content_filter": "content-filter"}
# In-stream error codes (``error`` events and ``response.failed``) have no HTTP status;
# these are the statuses the same failures have as HTTP errors, so both classify alike.
_CODE_STATUS = {"server_error": 500, "rate_limit_exceeded": 429, "vector_store_timeout": 504}
_TERMINAL = ("response.completed", "response.incomplete", "response.failed")
_OWN_ITEMS = ("message", "reasoning", "function_call")
# Request keys the provider owns; options cannot replace them.
_RESERVED = frozenset({"input", "stream"})


def map_finish_reason(
    status: str | None, *, reason: str | None = None, tool_calls: bool = False
) -> str:
    """The unified finish reason for a response's final ``status``.

    ``completed`` -> ``tool-calls`` when the response holds function calls, else
    ``stop``; ``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens`` ->
    ``length``, ``content_filter`` -> ``content-filter``, any other reason -> ``other``;
    ``failed`` -> ``error``; anything else (``cancelled``, ...) -> ``other``.
    """
    if status == "completed":
        return "tool-calls" if tool_calls else "stop"
    if status == "incomplete":
        return _INCOMPLETE_REASONS.get(reason or "", "other")
    if status == "failed":
        return "error"
    return "other"


# -- restoration: messages -> input items ---------------------------------------------------


def encode_reasoning(item: dict[str, Any], following: dict[str, Any] | None = None) -> str:
    """The ``signature`` of a reasoning part: the item verbatim and what followed it."""
    payload: dict[str, Any] = {"item": item}
    if following:
        payload["next"] = following
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def decode_reasoning(signature: str | None) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(item, next)`` from a reasoning part's ``signature``; ``None`` when it is not one
    this provider wrote (absent, not JSON, not a reasoning item)."""
    if not signature:
        return None
    try:
        payload = json.loads(signature)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    item, following = payload.get("item"), payload.get("next")
    if not isinstance(item, dict) or item.get("type") != "reasoning" or not item.get("id"):
        return None
    return item, following if isinstance(following, dict) else {}


CALL_ID_MAX = 64
"""The longest ``call_id`` the API takes ("string too long. Expected a string with
maximum length 64"): another server's ids can be longer."""


def wire_call_id(raw: str) -> str:
    """``raw`` as sent: itself when at most :data:`CALL_ID_MAX` characters, else (longer,
    or empty: a client's history may hold ``""``, which the API refuses) ``call_`` and a
    digest of it, the same for a call and its output, so they still pair (the history
    keeps the id)."""
    if 0 < len(raw) <= CALL_ID_MAX:
        return raw
    digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()
    return f"call_{digest[: CALL_ID_MAX - 5]}"


def _arguments(value: Any) -> str:
    # A call whose input did not parse is stored as the raw string: send it back verbatim.
    return value if isinstance(value, str) else arguments_json(value)


IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Image formats the Responses API takes (``input_image``)."""
FILE_TYPES = frozenset({"application/pdf"})
"""File formats it takes (``input_file``, inline or by URL)."""


def _media_item(part: Image | File) -> dict[str, Any]:
    """An ``input_image`` / ``input_file`` content item (user input or a tool's output).

    Unlike Chat Completions, Responses takes images and files in function call outputs
    too, and files by URL; a format it cannot take is refused here, before the request."""
    if isinstance(part, Image):
        if part.media_type not in IMAGE_TYPES:
            raise errors.UnsupportedMedia(
                f"OpenAI Responses cannot take {part.media_type} images "
                f"(only {', '.join(sorted(IMAGE_TYPES))})",
                provider=PROVIDER,
            )
        return {"type": "input_image", "image_url": part.data_url(), "detail": "auto"}
    if part.media_type not in FILE_TYPES:
        raise errors.UnsupportedMedia(
            f"OpenAI Responses cannot take {part.media_type} files (only application/pdf)",
            provider=PROVIDER,
        )
    item: dict[str, Any] = {"type": "input_file", "filename": part.filename or "file.pdf"}
    if part.data is None:
        item["file_url"] = part.url
    else:
        item["file_data"] = part.data_url()
    return item


def _content_items(parts: Iterable[Any]) -> list[dict[str, Any]]:
    return [
        {"type": "input_text", "text": p.text} if isinstance(p, TextPart) else _media_item(p)
        for p in parts
        if not (isinstance(p, TextPart) and not p.text)
    ]


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str):
        return content
    return _content_items(content) or ""  # only empty text parts: no empty array


def _output(result: ToolMessage) -> str | list[dict[str, Any]]:
    if result.error is not None:
        return result.error
    if is_media_output(result.output):
        return _content_items(result.output)
    if isinstance(result.output, str):
        return result.output
    return json.dumps(result.output, ensure_ascii=False, default=str)


def _step_items(
    parts: Sequence[Part], store: bool, target: Origin, foreign_reasoning: ForeignReasoning
) -> list[dict[str, Any]]:
    """One step's output items, in the order they were produced."""
    items: list[dict[str, Any]] = []
    links: dict[int, dict[str, Any]] = {}  # index of a reasoning item -> its recorded follower
    text: list[str] = []

    def end_text() -> None:
        if text:
            items.append({"role": "assistant", "content": "".join(text)})
            text.clear()

    for part in parts:
        if isinstance(part, TextPart):
            text.append(part.text)
            continue
        if isinstance(part, ReasoningPart) and not replays_to(part, target):
            shown = as_text(part) if foreign_reasoning == "text" else None
            if shown is not None:
                text.append(shown)
            continue  # another provider's, model's or server's: it cannot go back
        end_text()
        if isinstance(part, ToolCallPart):
            items.append(
                {
                    "type": "function_call",
                    "call_id": wire_call_id(part.tool_call_id),
                    "name": tool_name(part.tool_name),
                    "arguments": _arguments(part.input),
                }
            )
        elif isinstance(part, ReasoningPart):
            decoded = decode_reasoning(part.signature)
            if decoded is None:
                continue  # unsigned (cut short): nothing to send
            item, following = decoded
            if not store and not item.get("encrypted_content"):
                continue  # with store=False the API cannot look the id up
            links[len(items)] = following
            items.append(item)
        elif isinstance(part, ProviderDataPart) and replays_to(part, target):
            items.append(dict(part.data))
    end_text()
    # The API rejects a reasoning item with no item after it ("provided without its
    # required following item"): drop the reasoning items at the end of the step.
    while items and items[-1].get("type") == "reasoning":
        items.pop()
    unpaired: list[int] = []
    for index, following in links.items():
        if index + 1 < len(items):
            if _lost_message(items[index + 1], following):
                unpaired.append(index)
            else:
                _link(items[index + 1], following)
    for index in reversed(unpaired):
        del items[index]
    return items


def _lost_message(item: dict[str, Any], following: dict[str, Any]) -> bool:
    """Whether the ``message`` that followed a reasoning item is not ``item``, the item
    after it now: its text was whitespace alone, which the history's repair drops
    (:func:`runtime.history.repair`), so the call after it came next. Such a reasoning
    item is not sent. Why: the API pairs a reasoning item with the item that followed it,
    by id, and refuses one "provided without its required following item"; it went back
    followed by a call that had not followed it (branch ``provmend``). The reasoning is
    context the API does not require, a message of invented text would be worse."""
    return (
        following.get("type") == "message"
        and bool(following.get("id"))
        and not (item.get("role") == "assistant" and item.get("type", "message") == "message")
    )


def _link(item: dict[str, Any], following: dict[str, Any]) -> None:
    """Give ``item`` the id it had when it followed its reasoning item, if it is that item."""
    item_id = following.get("id")
    if not item_id or "id" in item:
        return
    kind = following.get("type")
    if kind == "function_call" and item.get("type") == "function_call":
        # the call may hold another id than the server gave it (runtime.ids.repeated_call_id)
        called, linked = item.get("call_id"), following.get("call_id")
        if called == linked or (
            isinstance(called, str) and isinstance(linked, str) and is_call_id_of(called, linked)
        ):
            item["id"] = item_id
    elif kind == "message" and item.get("role") == "assistant":
        content = item.pop("content")
        item.update(
            type="message",
            id=item_id,
            status="completed",
            content=[{"type": "output_text", "text": content, "annotations": []}],
        )


def map_messages(
    messages: Sequence[Message],
    *,
    store: bool = False,
    origin: Origin | None = None,
    foreign_reasoning: ForeignReasoning = "drop",
) -> list[dict[str, Any]]:
    """The Responses ``input`` items for a session's history.

    ``messages`` are a repaired history (:func:`runtime.history.repair`, applied by the
    turn runner): every call has its result. A :class:`UserMessage` is a ``user``
    message, a :class:`SystemMessage` a ``system`` message where it stands (the agent's
    instructions go in the request's ``instructions`` instead); each assistant message is
    split by step into that step's output items in stream order, followed by one
    ``function_call_output`` per call of the step, in call order.

    Within a step: adjacent text parts are one assistant ``message``; a tool call is a
    ``function_call`` (its input as JSON text, or the raw text when it did not parse); a
    reasoning part is sent back only when this provider signed it (see the module
    docstring), with ``store=False`` only when it holds encrypted content, and only when
    an item follows it in its step (the API rejects a reasoning item without the item
    that followed it); that following item gets back the ``id`` it had, so the API can
    pair the two. Provider data of this provider is sent verbatim. Reasoning and
    provider data go back only where they :func:`~runtime.history.replays_to` ``origin``
    (the calling provider's; ``None``: this provider, any model or endpoint); others are
    dropped, or with ``foreign_reasoning="text"`` reasoning text joins the step's
    assistant text in ``<think>`` tags.
    """
    target = origin or Origin(provider=PROVIDER)
    out: list[dict[str, Any]] = []
    for kind, message, results in iter_turns(messages):
        if kind == "assistant":
            for parts, step_results in split_steps(message, results):
                items = _step_items(parts, store, target, foreign_reasoning)
                out.extend(items)
                out.extend(
                    {
                        "type": "function_call_output",
                        "call_id": wire_call_id(r.tool_call_id),
                        "output": _output(r),
                    }
                    for r in step_results
                )
                out.extend(_unanswered_outputs(items))
        elif isinstance(message, SystemMessage):
            out.append({"role": "system", "content": message.content})
        elif isinstance(message, UserMessage):
            out.append({"role": "user", "content": _user_content(message.content)})
    return out


CUSTOM_TOOL_NOT_RUN = (
    "This tool is not available: the custom tool call was not executed and has no output."
)
"""The output a ``custom_tool_call`` is answered with (:func:`_unanswered_outputs`)."""

CLIENT_CALL_NOT_RUN = (
    "Not run: this application does not run the {kind} tool; the call was not "
    "executed and has no result."
)
"""What a client-side call Axon has no tool for is answered with (:func:`_unanswered_outputs`):
a ``shell_call``, ``local_shell_call``, ``apply_patch_call``, ``computer_call``, a
client ``tool_search_call``, an ``mcp_approval_request`` (denied)."""

BLANK_SCREENSHOT = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNgAAAAAgAB"
    "SK+kcQAAAABJRU5ErkJggg=="
)
"""A 1x1 black PNG: the screenshot a ``computer_call_output`` must hold (the API takes no
text there) when the computer call was not run; a ``developer`` message after it says so."""


def _not_run(kind: str) -> str:
    return CLIENT_CALL_NOT_RUN.format(kind=kind)


def _with_caller(answer: dict[str, Any], item: Mapping[str, Any]) -> dict[str, Any]:
    if item.get("caller") is not None:  # a call a program made goes back to that program
        answer["caller"] = item["caller"]
    return answer


def _answer_custom(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    answer = {
        "type": "custom_tool_call_output",
        "call_id": item.get("call_id"),
        "output": CUSTOM_TOOL_NOT_RUN,
    }
    return [_with_caller(answer, item)]


def _answer_shell(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    run = {"stdout": "", "stderr": _not_run("shell"), "outcome": {"type": "exit", "exit_code": 1}}
    answer = {"type": "shell_call_output", "call_id": item.get("call_id"), "output": [run]}
    return [_with_caller(answer, item)]


def _answer_local_shell(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    # The SDK's type names the call by ``id``, OpenAI's guide by ``call_id``: both given.
    call_id = item.get("call_id")
    return [
        {
            "type": "local_shell_call_output",
            "id": call_id,
            "call_id": call_id,
            "output": _not_run("local shell"),
        }
    ]


def _answer_apply_patch(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    answer = {
        "type": "apply_patch_call_output",
        "call_id": item.get("call_id"),
        "status": "failed",
        "output": _not_run("apply_patch"),
    }
    return [_with_caller(answer, item)]


def _answer_computer(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    # No pending safety check is acknowledged: nothing was done.
    screenshot = {"type": "computer_screenshot", "image_url": BLANK_SCREENSHOT}
    call_id = item.get("call_id")
    return [
        {"type": "computer_call_output", "call_id": call_id, "output": screenshot},
        {"role": "developer", "content": f"computer_call {call_id}: {_not_run('computer')}"},
    ]


def _answer_tool_search(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    if item.get("execution") != "client":
        return []  # the server searched: its output item came with the call
    call_id = item.get("call_id")
    return [
        {
            "type": "tool_search_output",
            "call_id": call_id,
            "execution": "client",
            "status": "completed",
            "tools": [],
        },
        {"role": "developer", "content": f"tool_search_call {call_id}: {_not_run('tool search')}"},
    ]


def _answer_mcp_approval(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    reason = (
        "Not approved: this application does not answer MCP approval requests, "
        "so the MCP tool call was not run."
    )
    return [
        {
            "type": "mcp_approval_response",
            "approval_request_id": item.get("id"),
            "approve": False,
            "reason": reason,
        }
    ]


_ANSWERS: dict[str, tuple[str, str, str, Any]] = {
    # call item type: (its key field, the answer's type, the answer's key field, answer)
    "custom_tool_call": ("call_id", "custom_tool_call_output", "call_id", _answer_custom),
    "shell_call": ("call_id", "shell_call_output", "call_id", _answer_shell),
    "local_shell_call": ("call_id", "local_shell_call_output", "call_id", _answer_local_shell),
    "apply_patch_call": ("call_id", "apply_patch_call_output", "call_id", _answer_apply_patch),
    "computer_call": ("call_id", "computer_call_output", "call_id", _answer_computer),
    "tool_search_call": ("call_id", "tool_search_output", "call_id", _answer_tool_search),
    "mcp_approval_request": (
        "id",
        "mcp_approval_response",
        "approval_request_id",
        _answer_mcp_approval,
    ),
}
"""The output items that wait for the client's answer (the ``openai`` SDK's
``ResponseOutputItem`` union less what Axon runs, ``function_call``, and what the server
answers itself: ``program``, hosted tools), with what answers each."""
_ANSWER_TYPES = {answer: key for _, answer, key, _ in _ANSWERS.values()}


def _answered(item: Mapping[str, Any]) -> Any:
    """The call an answer item answers (``local_shell_call_output`` may name it by ``id``)."""
    key = _ANSWER_TYPES[item["type"]]
    found = item.get(key)
    if found is None and item["type"] == "local_shell_call_output":
        found = item.get("id")
    return found


def _unanswered_outputs(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """An answer saying the call was not run for each call among a step's ``items`` that
    waits for the client's answer and that they do not answer (:data:`_ANSWERS`).

    Why: such an item reaches the API only through tools given in ``request_options``
    (a custom tool, ``shell``, ``local_shell``, ``apply_patch``, ``computer``, a client
    tool search, an MCP server that requires approval); no Axon tool runs it, so it is
    kept as provider data and never run. Sent back alone, the next request failed (the
    API refuses a call item without its output item); answered so, the request is valid
    and the model reads that the call did not run: an output with the words of
    :data:`CLIENT_CALL_NOT_RUN` (a shell's on stderr with exit code 1, a patch's as
    ``failed``), an MCP approval denied with a reason, and for the two answers with no
    room for words (a computer call's screenshot, a tool search's tools) a ``developer``
    message after them. A call a server ran comes with its own output item (a hosted
    shell's ``shell_call_output``, a server tool search's ``tool_search_output``), which
    is sent as it came and gets no second. A call made through a program (``caller``) is
    answered to the same caller."""
    answered = {
        (item["type"], _answered(item)) for item in items if item.get("type") in _ANSWER_TYPES
    }
    out: list[dict[str, Any]] = []
    for item in items:
        entry = _ANSWERS.get(item.get("type") or "")
        if entry is None:
            continue
        key, answer_type, _, answer = entry
        if (answer_type, item.get(key)) in answered:
            continue
        out.extend(answer(item))
    return out


def map_output(output: Any) -> dict[str, Any]:
    """The ``text.format`` for an agent's :class:`~runtime.output_schema.OutputSchema`:
    ``json_schema`` in strict mode, the schema rewritten as strict mode needs (the same
    rewrite as Chat Completions' ``response_format``; Responses takes the spec flat)."""
    return {"type": "json_schema", **json_schema_spec(output)}


def map_tools(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """Function tools ``{"type": "function", name, description, parameters, "strict":
    False}`` from each tool's :meth:`runtime.tools.Tool.spec`; a ``dict`` is taken as a
    Responses tool definition already (a built-in tool such as ``{"type":
    "web_search"}``) and sent as is.

    ``strict`` is sent as ``False`` explicitly: strict mode needs every property
    required and ``additionalProperties: false``, which a tool with optional arguments
    does not declare, and the API's default has differed between model families.
    """
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, dict):
            out.append(tool)
            continue
        spec = tool.spec()
        entry: dict[str, Any] = {"type": "function", "name": spec["name"]}
        if spec.get("description"):
            entry["description"] = spec["description"]
        entry["parameters"] = spec.get("parameters") or {"type": "object", "properties": {}}
        entry["strict"] = False
        out.append(entry)
    return out


# -- the stream: SDK events -> StreamChunk --------------------------------------------------


def _dump(item: Any) -> dict[str, Any]:
    """An SDK output item as the plain dict it arrived as (fields the server sent)."""
    if isinstance(item, dict):
        return dict(item)
    return item.to_dict(mode="json")


class _Call:
    """A function call between its ``output_item.added`` and ``output_item.done``."""

    __slots__ = ("args", "call_id", "name", "started")

    def __init__(self, call_id: str, name: str) -> None:
        self.call_id = call_id
        self.name = name
        self.args: list[str] = []
        """``arguments.delta`` fragments, joined once at the end (never per delta)."""
        self.started = False


def _call_id(item: Any) -> str:
    """The ``call_id`` results are paired on; servers that omit it get the item id or a
    fresh one, so the call can still be answered."""
    found = getattr(item, "call_id", None) or getattr(item, "id", None)
    if found:
        return text_of(found, "a function_call's call_id", PROVIDER)
    return new_id("call")


def _name(item: Any) -> str:
    """A ``function_call`` item's name (``""`` when it has none); one that is no text is
    malformed (the SDK validates nothing: a number went on as the tool's name)."""
    return text_of(getattr(item, "name", None), "a function_call's name", PROVIDER) or ""


def _item_arguments(item: Any, last: list[bytes] | None = None) -> str | None:
    """A ``function_call`` item's ``arguments``; a JSON value a server sent in the place
    of the string holding it is that string (as the Chat Completions provider reads it:
    it was unreadable), an integer past 64 bits in it exact: orjson read it as a float
    (:func:`sdk_events`), so a value holding such a float is read again from its event's
    bytes ``last[0]`` (:func:`_exact_item_arguments`)."""
    raw = getattr(item, "arguments", None)
    if raw is None or type(raw) is str:
        return raw
    if last is not None and lost_int(raw):
        raw = _exact_item_arguments(last[0], raw)
    return json.dumps(raw, ensure_ascii=False)


def _exact_item_arguments(data: bytes, raw: Any) -> Any:
    """The ``arguments`` value of the item in the event ``data`` (bytes), read exactly,
    if orjson read it as ``raw``; else ``raw`` (an event the SDK's own stream read)."""
    doc = exact_loads(data) if data else None
    if type(doc) is dict and type(doc.get("data")) is dict and "item" not in doc:
        doc = doc["data"]  # (synthesized: the event's data inside)
    item = doc.get("item") if type(doc) is dict else None
    found = item.get("arguments") if type(item) is dict else None
    if found is not None and orjson_module().loads(dumps(found)) == raw:
        return found
    return raw


def _parse_arguments(call_id: str, name: str, raw: str) -> ToolCallChunk:
    if not name:
        return ToolCallChunk(
            tool_call_id=call_id, tool_name=name, input=raw, input_error="the call has no name"
        )
    if not raw.strip():
        return ToolCallChunk(tool_call_id=call_id, tool_name=name, input={})
    try:
        value = strict_loads(raw)
    except (ValueError, RecursionError) as exc:  # a recursion bomb is no JSON either
        return ToolCallChunk(
            tool_call_id=call_id,
            tool_name=name,
            input=raw,
            input_error=f"invalid JSON in function call arguments: {exc}",
        )
    return ToolCallChunk(tool_call_id=call_id, tool_name=name, input=value)


_TEXT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.refusal.delta",
    }
)
"""The events whose ``delta`` is text, emitted as it is."""


def _usage(raw: Any) -> Usage | None:
    """The response's usage; a count that is no count (a string, a negative number: the
    SDK does not validate them) is none (:func:`~actors.providers.failures.tokens`)."""
    if raw is None:
        return None
    inp = tokens(getattr(raw, "input_tokens", None)) or 0
    out = tokens(getattr(raw, "output_tokens", None)) or 0
    return Usage(
        input_tokens=inp,
        output_tokens=out,
        total_tokens=tokens(getattr(raw, "total_tokens", None)) or inp + out,
        cache_read=tokens(
            getattr(getattr(raw, "input_tokens_details", None), "cached_tokens", None)
        ),
        reasoning_tokens=tokens(
            getattr(getattr(raw, "output_tokens_details", None), "reasoning_tokens", None)
        ),
    )


def _in_stream_error(code: str | None, message: str | None) -> errors.ProviderError:
    """The error class of a failure reported inside the stream (no HTTP status)."""
    status = _CODE_STATUS.get(code or "")
    if status is None and code:
        status = 400  # invalid_prompt, image_*, *_policy: the request itself is refused
    return classify_status(
        message or f"the response failed ({code or 'no code'})",
        provider=PROVIDER,
        status=status,
        error_type=code,
        code=code,
    )


class _Parser:
    """The state of one response stream; :meth:`feed` takes one event at a time."""

    def __init__(self, emit: Emit, last: list[bytes] | None = None) -> None:
        self.emit = emit
        self.last = last
        """The bytes of the event being read (``None``: read by the SDK's own stream)."""
        self.calls: dict[int, _Call] = {}
        """Function calls still open, by ``output_index``."""
        self.any_call = False
        self.refused = False
        self.streamed: set[int] = set()
        """Output indexes whose text or summary arrived as deltas."""
        self.summary_index: dict[int, int] = {}
        self.held: dict[str, Any] | None = None
        """A completed reasoning item waiting for the item that follows it."""
        self.terminal: Any = None

    async def release(self, following: Any = None) -> None:
        """Close the held reasoning part, recording ``following`` (an output item) in it."""
        held, self.held = self.held, None
        if held is None:
            return
        link: dict[str, Any] = {}
        if following is not None:
            link = {"type": getattr(following, "type", None), "id": getattr(following, "id", None)}
            if link["type"] == "function_call":
                link["call_id"] = getattr(following, "call_id", None)
        await self.emit(ReasoningChunk(signature=encode_reasoning(held, link), provider=PROVIDER))

    async def feed(self, event: Any) -> None:
        etype = getattr(event, "type", None)
        if etype in _TEXT_DELTAS:  # the SDK does not validate: a delta must be text
            text_of(getattr(event, "delta", None), f"a {etype} event's delta", PROVIDER)
        if etype == "response.output_text.delta":
            if event.delta:
                await self.release()
                self.streamed.add(event.output_index)
                await self.emit(TextChunk(text=event.delta))
        elif etype == "response.function_call_arguments.delta":
            call = self.calls.get(event.output_index)
            if call is not None and event.delta:
                call.args.append(event.delta)
                await self.emit(ToolInputDeltaChunk(tool_call_id=call.call_id, delta=event.delta))
        elif etype in (
            "response.reasoning_summary_text.delta",
            "response.reasoning_text.delta",
        ):
            await self._reasoning_delta(event)
        elif etype == "response.refusal.delta":
            if event.delta:
                await self.release()
                self.refused = True
                self.streamed.add(event.output_index)
                await self.emit(TextChunk(text=event.delta, refusal=True))
        elif etype == "response.output_item.added":
            await self._item_added(event.output_index, event.item)
        elif etype == "response.output_item.done":
            await self._item_done(event.output_index, event.item)
        elif etype in _TERMINAL:
            await self.release()
            self.terminal = event
        elif etype == "error":
            await self.release()
            raise _in_stream_error(getattr(event, "code", None), getattr(event, "message", None))
        # created / in_progress / content_part / *.done / built-in tool progress events
        # carry nothing the items' added and done events do not.

    async def _reasoning_delta(self, event: Any) -> None:
        if not event.delta:
            return
        await self.release()  # a new item's reasoning must not join the held part
        index = event.output_index
        summary = getattr(event, "summary_index", None)
        part: int = summary if summary is not None else getattr(event, "content_index", 0)
        previous = self.summary_index.get(index)
        self.summary_index[index] = part
        self.streamed.add(index)
        text = event.delta
        if previous is not None and previous != part:
            text = SUMMARY_SEPARATOR + text
        await self.emit(ReasoningChunk(text=text, provider=PROVIDER))

    async def _item_added(self, index: int, item: Any) -> None:
        await self.release(following=item)
        if getattr(item, "type", None) == "function_call":
            call = _Call(_call_id(item), _name(item))
            self.calls[index] = call
            self.any_call = True
            if call.name:
                call.started = True
                await self.emit(ToolInputStartChunk(tool_call_id=call.call_id, tool_name=call.name))
            arguments = _item_arguments(item, self.last)
            if arguments:
                call.args.append(arguments)
                if call.started:
                    await self.emit(ToolInputDeltaChunk(tool_call_id=call.call_id, delta=arguments))

    async def _item_done(self, index: int, item: Any) -> None:
        kind = getattr(item, "type", None)
        if kind is None:
            return  # no item: nothing to keep
        if kind == "reasoning":
            await self.release()
            data = _dump(item)
            if index not in self.streamed:  # the summary came whole, not as deltas
                summary = SUMMARY_SEPARATOR.join(
                    s.get("text", "") for s in data.get("summary") or () if isinstance(s, dict)
                )
                if summary:
                    await self.emit(ReasoningChunk(text=summary, provider=PROVIDER))
            self.held = data
        elif kind == "function_call":
            await self.release()
            call = self.calls.pop(index, None)
            if call is None:  # done without added: the whole call at once
                call = _Call(_call_id(item), _name(item))
                self.any_call = True
            arguments = _item_arguments(item, self.last)
            raw = arguments if arguments is not None else "".join(call.args)
            name = call.name or _name(item)
            if not call.started:
                await self.emit(ToolInputStartChunk(tool_call_id=call.call_id, tool_name=name))
                if raw:
                    await self.emit(ToolInputDeltaChunk(tool_call_id=call.call_id, delta=raw))
            await self.emit(_parse_arguments(call.call_id, name, raw))
        elif kind == "message":
            await self.release()
            if index not in self.streamed:  # the text came whole, not as deltas
                for content in getattr(item, "content", None) or ():
                    ctype = getattr(content, "type", None)
                    if ctype == "output_text" and content.text:
                        await self.emit(TextChunk(text=content.text))
                    elif ctype == "refusal" and content.refusal:
                        self.refused = True
                        await self.emit(TextChunk(text=content.refusal, refusal=True))
        else:  # a built-in tool item that ran on OpenAI's side: kept verbatim
            await self.release()
            await self.emit(ProviderDataChunk(provider=PROVIDER, data=_dump(item)))

    async def finish(self) -> None:
        """Usage, the calls the response cut off, and the finish chunk; or raise."""
        event = self.terminal
        if event is None:
            raise errors.MalformedStream(
                "the response stream ended without response.completed, response.incomplete "
                "or response.failed (cut short)",
                provider=PROVIDER,
            )
        response = event.response
        status = getattr(response, "status", None) or event.type.removeprefix("response.")
        if event.type == "response.failed" or status == "failed":
            error = getattr(response, "error", None)
            usage = _usage(getattr(response, "usage", None))
            if usage is not None:  # billed though it failed: the turn counts it
                await self.emit(UsageChunk(usage=usage))
            raise _in_stream_error(getattr(error, "code", None), getattr(error, "message", None))
        details = getattr(response, "incomplete_details", None)
        reason = getattr(details, "reason", None)
        finish = map_finish_reason(status, reason=reason, tool_calls=self.any_call)
        if self.refused and finish in ("stop", "other"):
            finish = "content-filter"
        usage = _usage(getattr(response, "usage", None))
        if usage is not None:
            await self.emit(UsageChunk(usage=usage))
        cut = TRUNCATED.format(reason=reason or status)
        for call in self.calls.values():  # no output_item.done for these
            if not call.started:
                await self.emit(ToolInputStartChunk(tool_call_id=call.call_id, tool_name=call.name))
            raw = "".join(call.args)
            if status == "completed":  # the response says every item is complete
                await self.emit(_parse_arguments(call.call_id, call.name, raw))
                continue
            await self.emit(  # cut off: reported, never executed
                ToolCallChunk(
                    tool_call_id=call.call_id, tool_name=call.name, input=raw, input_error=cut
                )
            )
        await self.emit(FinishChunk(reason=finish, raw_reason=reason or status))


async def sdk_events(stream: Any, read: list[bytes] | None = None) -> AsyncGenerator[Any, None]:
    """The typed events of an SDK ``AsyncStream``, as the SDK's own stream gives them,
    its body read by our SSE decoder (:class:`~actors.providers.sse.SSEDecoder`) when
    the SDK would decode it as plain SSE (:func:`~actors.providers.sse.sdk_sse_response`);
    anything else (another decoder, a test double) is iterated as it is.

    Why: the SDK's decoder has no limit on a line or an event, so a server that sends one
    endless line grew the process's memory without bound; ours stops at
    :data:`~actors.providers.failures.MAX_EVENT_BYTES` (:class:`EventTooLarge`, a
    :class:`~runtime.errors.MalformedStream`), as for the other providers. Each event is
    then what the SDK's stream makes of it: ``[DONE]`` ends the stream, an ``error``
    object in the data is the SDK's ``APIError`` (legacy stream mode), the data is
    parsed with :func:`json.loads` and built into the stream's type by the client
    (unvalidated, as the SDK does). Two differences, as for Chat Completions: a block
    of a ``retry:`` or ``id:`` field alone (no data; the SDK failed parsing it) is no
    event, and a body with no event at all (an HTML page, a whole JSON answer, an empty
    body, status 200) is :func:`~actors.providers.sse.no_events`, not "cut short".
    Transport errors come from the HTTP library as they are (:func:`classify_error`
    maps them as the SDK's wrapped ones). ``read[0]``, if given, is set to each event's
    bytes before it is yielded (one store an event): a call's ``arguments`` sent as a
    JSON object is read from them again exactly (:func:`_item_arguments`)."""
    response = sdk_sse_response(stream)
    client = getattr(stream, "_client", None)
    cast_to = getattr(stream, "_cast_to", None)
    build = getattr(client, "_process_response_data", None)
    if response is None or build is None or cast_to is None:
        async for event in stream:
            yield event
        return
    options = getattr(stream, "_options", None)
    legacy = options is None or getattr(options, "stream_mode", "legacy") == "legacy"
    synthesize = options is not None and bool(getattr(options, "synthesize_event_and_data", 0))
    decoder = SSEDecoder()
    head, seen = b"", False
    loads = fast = orjson_module().loads
    half: tuple[Any, str] | None = None  # half a character held back (hold_half)
    async with body_bytes(response) as chunks:  # closed and read to its end on every way out
        while True:
            try:
                chunk = await anext(chunks)
            except StopAsyncIteration:
                batch = decoder.finish()
                last = True
            else:
                head = head or chunk[:HEAD_BYTES]
                batch = decoder.feed(chunk)
                last = False
            for name, data in batch:
                seen = True
                if not data:
                    continue  # a retry: or id: field alone (the SDK failed parsing it)
                if data.startswith(b"[DONE]"):
                    await read_to_end(chunks)
                    return
                if read is not None:
                    read[0] = data  # (the event's bytes: _item_arguments)
                try:
                    value = loads(data)  # what json.loads reads, faster
                except ValueError:
                    value = json.loads(data)  # as the SDK reads it (half a character too)
                    if type(value) is dict:
                        half, flush = hold_half(value, half, _text_of, _text_at, _text_part)
                        if flush is not None:
                            held = _half_flushed(flush)
                            if synthesize:
                                held = {"data": held, "event": held["type"]}
                            yield build(data=held, cast_to=cast_to, response=response)
                    loads = fast if half is None else refuse_held
                if legacy and isinstance(value, dict) and value.get("error"):
                    raise _sdk_stream_error(value["error"], response)
                if synthesize:
                    value = {"data": value, "event": name}
                yield build(data=value, cast_to=cast_to, response=response)
            if last:
                break
    if not seen:
        raise no_events(response, head, PROVIDER)


_PART_KEYS = ("type", "item_id", "output_index", "content_index", "summary_index")
"""What tells one delta's text from another's: its kind and where it is."""


def _text_at(event: dict[str, Any]) -> Slot | None:
    """Where a delta's text is (:func:`hold_half`): an output text's, a refusal's, a
    reasoning's, a function call's arguments; its part, the event's kind and indexes."""
    if event.get("type") in _TEXT_DELTAS and type(event.get("delta")) is str:
        return event, "delta", tuple(event.get(key) for key in _PART_KEYS)
    return None


def _text_of(event: dict[str, Any], part: Any) -> Slot | None:
    at = _text_at(event)
    return at if at is not None and at[2] == part else None


def _text_part(event: dict[str, Any]) -> Any:
    return 0  # (the parts end with their own done events)


def _half_flushed(part: Any) -> dict[str, Any]:
    """A delta of a held half whose other half did not come next."""
    event = {key: value for key, value in zip(_PART_KEYS, part, strict=True) if value is not None}
    event["delta"] = HALF_HELD
    if event["type"] == "response.output_text.delta":
        event["logprobs"] = []
    return event


def _sdk_stream_error(body: Any, response: Any) -> Exception:
    """The ``APIError`` the SDK's stream raises for an ``error`` object in an event."""
    import openai

    message = body.get("message") if isinstance(body, dict) else None
    if not message or not isinstance(message, str):
        message = "An error occurred during streaming"
    return openai.APIError(message=message, request=response.request, body=body)


async def parse_stream(
    stream: AsyncIterable[Any], emit: Emit, last: list[bytes] | None = None
) -> None:
    """Read a Responses event stream and ``emit`` :data:`StreamChunk` s.

    Text, refusal, reasoning-summary and argument deltas go out as they arrive. A
    reasoning part is closed (signed, see the module docstring) when the next output item
    starts or the response ends; summary parts of one item are separated by a blank
    line. A :class:`ToolCallChunk` comes when its ``function_call`` item is done, with
    the arguments of that done item (never when a prefix first parses). A built-in tool
    item becomes a :class:`ProviderDataChunk` when it is done. After
    ``response.completed`` / ``response.incomplete`` come one :class:`UsageChunk`, a
    :class:`ToolCallChunk` for each call whose item never reported done (complete when
    the response completed, else with an ``input_error``: cut off, never executed), and
    the :class:`FinishChunk` last.

    Errors are raised classified: an ``error`` event or ``response.failed`` by its
    ``code`` through the shared ladder, a dropped connection or undecodable data by
    :func:`classify_error`, and a stream that ended without a terminal event as
    :class:`MalformedStream`. What was emitted before stays emitted. (The SDK builds
    events without validating them and fills a missing field with ``None``: an event
    lacking what it needs is skipped.)
    """
    parser = _Parser(emit, last)
    iterator = aiter(stream)
    while parser.terminal is None:
        try:
            event = await anext(iterator)
        except StopAsyncIteration:
            break
        except Exception as exc:
            raise classify_error(exc) from exc
        try:
            await parser.feed(event)
        except SHAPE_ERRORS as exc:  # an event of the wrong shape (the SDK validates none)
            raise unreadable(exc, PROVIDER) from exc
    try:
        await parser.finish()
    except SHAPE_ERRORS as exc:
        raise unreadable(exc, PROVIDER) from exc


def classify_error(exc: BaseException) -> AxonError:
    """Map an exception from the SDK (or its transport) onto :mod:`runtime.errors`: the
    same ladder as the Chat Completions provider (HTTP status, body ``type`` / ``code``,
    ``retry-after-ms`` / ``retry-after``), tagged with this provider's name."""
    return _classify_openai(exc, provider=PROVIDER)


# -- the provider actor ----------------------------------------------------------------------


BODY_KEYS = ("input", "tools", "include", "instructions", "store", "text")
"""The ``responses.create`` arguments the provider builds as wire JSON, given to the SDK
in ``extra_body`` (:func:`~actors.providers.openai_common.as_body`), with ``model``
(:func:`~actors.providers.openai_common.body_keys`): the SDK's walk of them against its
request types returns them unchanged, for 11-55 us each (``text``, an answer schema's
format, the most), on top of the input items' per-item cost."""


class OpenAIResponsesProvider(OpenAISDKProvider):
    """The OpenAI Responses API over the ``openai`` SDK: reasoning summaries, encrypted
    reasoning kept across steps, function calls and built-in tools.

    ``request_options`` are extra ``responses.create`` arguments for every call
    (``reasoning={"effort": "low", "summary": "auto"}``, ``max_output_tokens``, ...).
    ``tools`` are *added* to the agent's function tools (built-in tools: ``[{"type":
    "web_search"}]``); ``include`` is merged with the provider's own; ``store`` replaces
    :attr:`store` for the call (restoration and ``include`` follow it). Fields the SDK
    does not name go in ``extra_body``."""

    provider_name: ClassVar[str] = PROVIDER
    default_endpoint: ClassVar[str | None] = "https://api.openai.com/v1"
    endpoint_env: ClassVar[str | None] = "OPENAI_BASE_URL"
    price_vendor: ClassVar[str | None] = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        store: bool = False,
        encrypted_reasoning: bool = True,
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
        self.store = store
        """Sent as ``store``: ``False`` keeps nothing on OpenAI's side, so reasoning
        travels encrypted in the history instead."""
        self.encrypted_reasoning = encrypted_reasoning
        """With ``store=False``, ask for ``reasoning.encrypted_content`` (set ``False`` for
        models without reasoning, which reject it with "Encrypted content is not
        supported with this model")."""

    @classmethod
    def from_options(cls, options: ProviderOptions) -> OpenAIResponsesProvider:
        """``--provider openai-responses``: ``--model`` (default ``gpt-5-mini``),
        ``--base-url``, ``--api-key``."""
        return cls(
            options.model or "gpt-5-mini", base_url=options.base_url, api_key=options.api_key
        )

    def describe_settings(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "encrypted_reasoning": self.encrypted_reasoning,
            "foreign_reasoning": self.foreign_reasoning,
        }

    def _cap(self, options: dict[str, Any], left: int | None) -> int | None:
        """``max_output_tokens`` in ``options`` (the settings over the provider's
        options), lowered to ``left``."""
        return cap_output(options, "max_output_tokens", left)

    def sent_cap(self, settings: Mapping[str, Any], left: int | None) -> int | None:
        """:meth:`request_params`' ``max_output_tokens`` (the API's only cap field)."""
        return self._cap({**self.request_options, **settings}, left)

    def request_params(self, request: InferRequest) -> dict[str, Any]:
        """The ``responses.create`` keyword arguments for ``request`` (``stream=True``)."""
        options = self.call_options(request.settings)
        self._cap(options, request.max_output_tokens)  # the turn's left
        store = bool(options.pop("store", self.store))
        params: dict[str, Any] = {
            "model": self.model,
            "input": map_messages(
                request.messages,
                store=store,
                origin=self.origin,
                foreign_reasoning=self.foreign_reasoning,
            ),
            "store": store,
        }
        if request.instructions:
            params["instructions"] = request.instructions
        tools = map_tools(request.tools)
        include = [ENCRYPTED_REASONING] if self.encrypted_reasoning and not store else []
        known = self._known_params(self._get_client().responses.create)
        extra_body: dict[str, Any] = {}
        for key, value in options.items():
            if key in _RESERVED:
                continue
            if key == "tools":
                tools.extend(value or ())
            elif key == "include":
                wanted = [value] if isinstance(value, str) else list(value or ())
                include.extend(v for v in wanted if v not in include)
            elif key == "extra_body":
                extra_body.update(value)
            elif key in known:
                params[key] = value
            else:
                extra_body[key] = value
        if tools:
            params["tools"] = tools
        if include:
            params["include"] = include
        if request.output is not None:
            params["text"] = {"format": map_output(request.output)}
        if extra_body:
            params["extra_body"] = extra_body
        params["stream"] = True
        return params

    async def stream(self, request: InferRequest, emit: Emit) -> None:
        """One streamed Responses call; raises a classified error on failure."""
        try:
            params = self.request_params(request)
            client = self._get_client()
            response = await created(
                client.responses.create, as_body(params, body_keys(client, BODY_KEYS))
            )
        except AxonError:
            raise
        except Exception as exc:
            raise classify_error(exc) from exc
        await self.observe_headers(getattr(response, "response", None))  # rate limits
        # the response closes the HTTP response on error and on cancellation
        last = [b""]  # (each event's bytes: a call's arguments sent as an object, exact)
        async with response, aclosing(sdk_events(response, last)) as events:
            await parse_stream(events, emit, last)

    def classify_error(self, exc: BaseException) -> AxonError:
        return classify_error(exc)

    def count_items(
        self, instructions: str | None, messages: Sequence[Message], tools: Sequence[Any]
    ) -> list[Any]:
        """The request's instructions, ``input`` items and tool definitions (for
        :meth:`count_tokens`)."""
        items: list[Any] = [instructions] if instructions else []
        items += map_messages(
            messages, store=self.store, origin=self.origin, foreign_reasoning=self.foreign_reasoning
        )
        return [*items, map_tools(tools)] if tools else items
