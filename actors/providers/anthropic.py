"""The Anthropic Messages provider: raw SSE events in, :data:`~runtime.chunks.StreamChunk` s out.

Everything Anthropic-specific lives in this one module, in four verbs that mirror the
OpenAI provider: :func:`map_messages` and :func:`map_tools` restore the session into a
request, :func:`parse_stream` turns the SDK's *raw* event stream
(``messages.create(stream=True)``, not the slower accumulating ``messages.stream()``
helper: we accumulate ourselves) into chunks, and :func:`classify_error` maps whatever
went wrong onto :mod:`runtime.errors`.

The ``anthropic`` SDK is imported only inside functions, so importing this module (or
``runtime``) never loads it; the client is built on the first call, which is also the
first time an API key is read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from collections.abc import Set as AbstractSet
from contextlib import aclosing
from typing import Any, ClassVar, cast

import trio

from actors.providers.anthropic_platforms import BedrockPlatform, VertexPlatform
from actors.providers.failures import (
    HALF_HELD,
    HEAD_BYTES,
    SHAPE_ERRORS,
    Slot,
    billed_when_cut,
    classify_status,
    classify_transport,
    created,
    finite,
    fitted_name,
    hook_error,
    missing_key,
    quoted,
    read_holding,
    retry_after,
    strict_loads,
    text_of,
    tokens,
    unreadable,
)
from actors.providers.json_slot import StringSlot, learn, orjson_module
from actors.providers.read_batch import ReadBatch
from actors.providers.sdk import SDKProvider, client_timeout
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
    CitationsChunk,
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
from runtime.errors import describe_exception
from runtime.history import (
    EMPTY_INPUT,
    ForeignReasoning,
    Origin,
    as_text,
    iter_turns,
    replays_to,
    split_steps,
)
from runtime.logging import get_logger
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
from runtime.redact import redact

PROVIDER = "anthropic"
"""The provider tag on reasoning and provider data; only such parts are sent back here."""

TRUNCATED_BY_MAX_TOKENS = (
    "the tool input was truncated by the output token limit (max_tokens); the call was not executed"
)
"""``input_error`` of a tool call whose block never ended because ``max_tokens`` hit."""

FINISH_REASONS: dict[str, str] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "length",
    # The context window filled up mid-answer: like max_tokens, the output was cut, so a
    # tool call in it must not run.
    "model_context_window_exceeded": "length",
    "refusal": "content-filter",
    "pause_turn": "other",
}
"""Anthropic ``stop_reason`` -> unified finish reason; anything else is ``other``."""

RESUMED = frozenset({"pause_turn", "compaction"})
"""The stop reasons of a turn the server paused (server tools ran long; the beta's
``pause_after_compaction``): sending the conversation back with the paused answer last
continues it, so their :class:`~runtime.chunks.FinishChunk` says ``resume`` (what the
SDK's tool runner calls ``resume``)."""

# Error ``type``s of an SSE ``event: error`` (HTTP status 200, so the type is all there
# is) and the HTTP status Anthropic documents for each, so such an error classifies
# exactly like the same failure reported before the stream started.
# fmt: off
_ERROR_TYPE_STATUS: dict[str, int] = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
    "permission_error": 403, "not_found_error": 404, "request_too_large": 413,
    "rate_limit_error": 429, "api_error": 500, "timeout_error": 504, "overloaded_error": 529,
}
# fmt: on
_USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
# Request keys the provider owns; request options cannot replace them.
_RESERVED = frozenset({"messages", "stream"})


# -- restoration: messages -> request -----------------------------------------------------


def map_messages(
    instructions: str | None,
    messages: Sequence[Message],
    *,
    origin: Origin | None = None,
    foreign_reasoning: ForeignReasoning = "drop",
) -> tuple[str | None, list[dict[str, Any]]]:
    """The ``system`` prompt and ``messages`` of a Messages API request.

    ``messages`` are a repaired history (:func:`runtime.history.repair`, which the turn
    runner applies before every request: every tool call has its result). Each
    assistant message is split back into the steps it was streamed in: one ``assistant``
    message per step, its blocks in the order they were produced (thinking keeps its
    place, which the API checks against the signature), then one ``user`` message with
    that step's ``tool_result`` s in call order. Merging two steps into one assistant
    message is what produced "Expected thinking or redacted_thinking, but found
    tool_use" 400s in other frameworks. Messages of the same role that end up adjacent
    are merged, since the API wants roles to alternate. A user message with nothing to
    send (``""``, whitespace) is :data:`~runtime.history.EMPTY_INPUT`, which the API
    takes where it refuses empty content; so is the user message put first when the
    history starts with the assistant (a client's, opened by its chat UI's greeting),
    since the API wants the user's first. Tool call ids that break the API's pattern are
    rewritten the same way in the call and its result (:func:`tool_id`).

    User content with images or files becomes content blocks: ``image`` and ``document``
    (PDF, or plain text), each with a ``base64`` (``text`` for a text document) or
    ``url`` source. A tool that returned images or files gets them inside its
    ``tool_result`` content, which the API allows. A type the API cannot take raises
    :class:`~runtime.errors.UnsupportedMedia` before any request.

    Thinking and provider data go back only where they :func:`~runtime.history.replays_to`
    ``origin``, the calling provider's own (``None``: Anthropic, any model or endpoint):
    a signature is bound to the model and the server that minted it. Reasoning that may
    not go back is dropped, or with ``foreign_reasoning="text"`` its text is sent as a
    ``text`` block in ``<think>`` tags (:func:`~runtime.history.as_text`).
    """
    target = origin or Origin(provider=PROVIDER)
    system = [instructions] if instructions else []
    out: list[dict[str, Any]] = []
    last = messages[-1] if messages else None
    for kind, msg, results in iter_turns(messages):
        if kind == "assistant":
            steps = [
                (
                    [
                        b
                        for b in (_part_block(p, target, foreign_reasoning) for p in parts)
                        if b is not None
                    ],
                    step_results,
                )
                for parts, step_results in split_steps(msg, results)
            ]
            for i, (raw, step_results) in enumerate(steps):
                later, open_end = _answered_later(steps, i, continued=msg is last)
                blocks = _no_thinking_last(_paired(raw, later, keep=open_end))
                if blocks:
                    _append(out, "assistant", blocks)
                if step_results:
                    _append(out, "user", [_tool_result(r) for r in step_results])
        elif isinstance(msg, SystemMessage):
            if msg.content:
                system.append(msg.content)
        elif isinstance(msg, UserMessage):
            content = _user_content(msg.content)
            if not content or (isinstance(content, str) and not content.strip()):
                content = EMPTY_INPUT  # the API refuses empty and whitespace-only content
            _append(out, "user", content)
        # a ToolMessage never reaches here: iter_turns hands them over with their call
    if out and out[-1]["role"] == "assistant":
        _no_trailing_whitespace(out[-1])
    if out and out[0]["role"] == "assistant":
        # A client's history opened by its chat UI's greeting: the API refuses a first
        # message that is not the user's ("first message must use the "user" role").
        out.insert(0, {"role": "user", "content": EMPTY_INPUT})
    return ("\n\n".join(system) or None), out


def _no_trailing_whitespace(message: dict[str, Any]) -> None:
    """The request's last message, an assistant's (a paused answer sent back to be
    continued), with the whitespace at the end of its last block cut when that is text:
    the API refuses "final assistant content" ending with whitespace, and asks a partial
    answer sent back so ("with any trailing whitespace stripped from the final text
    block": the SDK's ``fallback_credit_token``). A block left empty is dropped."""
    blocks = message["content"]
    last = blocks[-1] if blocks else None
    if last is None or last.get("type") != "text" or last["text"] == last["text"].rstrip():
        return
    text = last["text"].rstrip()
    blocks[-1:] = [{**last, "text": text}] if text else []


def _no_thinking_last(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A step's blocks less the thinking at their end: the API refuses an assistant
    message whose last block is thinking ("The final block in an assistant message
    cannot be `thinking`"), which a step cut between its thinking and its answer (an
    interrupted turn, a stream that broke) leaves. Thinking with nothing after it
    carries no answer; a tool loop's steps end with their calls, so none is lost there."""
    end = len(blocks)
    while end and blocks[end - 1].get("type") in ("thinking", "redacted_thinking"):
        end -= 1
    return blocks[:end]


def _server_results(blocks: Iterable[dict[str, Any]]) -> set[Any]:
    """The ids of the server tool uses that ``blocks`` hold a result of."""
    return {
        b.get("tool_use_id")
        for b in blocks
        if b.get("type", "").endswith("_tool_result") and b.get("type") != "tool_result"
    }


def _answered_later(
    steps: Sequence[tuple[list[dict[str, Any]], list[Any]]], i: int, *, continued: bool
) -> tuple[set[Any], bool]:
    """The server tool uses answered in the steps after step ``i`` that the request
    joins with it in one assistant message (no tool result between: a paused turn's
    continuation, whose first block may be the result of the paused step's last use),
    and whether that message ends the request (``continued``: the history ends with this
    assistant message, a paused turn sent back to be continued, so a use still waiting
    for its result goes back as it is, which the server resumes)."""
    later: set[Any] = set()
    j = i
    while not steps[j][1] and j + 1 < len(steps):
        j += 1
        later |= _server_results(steps[j][0])
    return later, continued and not steps[j][1] and j == len(steps) - 1


def _paired(
    blocks: list[dict[str, Any]], later: AbstractSet[Any] = frozenset(), *, keep: bool = False
) -> list[dict[str, Any]]:
    """A step's blocks less each ``server_tool_use`` whose result block is neither among
    them nor ``later`` (a continued step's, :func:`_answered_later`): the step was cut
    while the server ran the tool, and the API refuses a server tool's use "found
    without a corresponding" result. ``keep``: none is dropped (the paused answer a
    request ends with, which the server continues)."""
    if keep:
        return blocks
    uses = [b for b in blocks if b.get("type") == "server_tool_use"]
    if not uses:
        return blocks
    answered = _server_results(blocks) | later
    return [b for b in blocks if b.get("type") != "server_tool_use" or b.get("id") in answered]


def _part_block(
    part: Part, target: Origin, foreign_reasoning: ForeignReasoning
) -> dict[str, Any] | None:
    """One part as a request content block, or ``None`` when it must not be sent."""
    if isinstance(part, TextPart):
        if not part.text.strip():
            return None
        if part.citations:  # each as it came, as the SDK sends a response's block back
            return {"type": "text", "text": part.text, "citations": list(part.citations)}
        return {"type": "text", "text": part.text}
    if isinstance(part, ToolCallPart):
        return {
            "type": "tool_use",
            "id": tool_id(part.tool_call_id),
            "name": tool_name(part.tool_name),
            "input": _tool_input(part.input),
        }
    if isinstance(part, ReasoningPart):
        # A signature verifies only with the model and server that minted it; an
        # unsigned block (interrupted before its signature arrived) or reasoning from
        # elsewhere would be rejected as thinking: it is dropped, or sent as text.
        if not replays_to(part, target):
            text = as_text(part) if foreign_reasoning == "text" else None
            return {"type": "text", "text": text} if text is not None else None
        if part.redacted_data is not None:
            return {"type": "redacted_thinking", "data": part.redacted_data}
        if part.signature:
            return {"type": "thinking", "thinking": part.text, "signature": part.signature}
        return None
    if isinstance(part, ProviderDataPart):
        return dict(part.data) if replays_to(part, target) else None
    return None


_NOT_ID = re.compile(r"[^a-zA-Z0-9_-]")


def tool_id(call_id: str) -> str:
    """A tool call id as the Messages API takes it (``^[a-zA-Z0-9_-]+$``, else a 400
    "String should match pattern"): as it is when it fits; else (another server's id,
    such as ``functions.lookup:0``) each other character made ``_`` and a digest of the
    original added, so two ids that differ only there stay two. The same for a call and
    its result, so they still pair; only the request holds it, the history keeps the id."""
    if call_id and not _NOT_ID.search(call_id):
        return call_id
    digest = hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{_NOT_ID.sub('_', call_id)[:64]}_{digest}"


_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")


def tool_name(name: str) -> str:
    """A call's name as a ``tool_use.name`` (``^[a-zA-Z0-9_-]{1,64}$``, the pattern of
    the tools a request offers): a name the model invented, or none, fitted to it
    (:func:`~actors.providers.failures.fitted_name`)."""
    return fitted_name(name, _NAME, _NOT_ID, 64)


def _tool_input(value: Any) -> dict[str, Any]:
    """A ``tool_use.input``, which the API requires to be an object.

    A call whose input did not parse (invalid or truncated JSON) is stored with the raw
    text; it was never executed and its result is an error saying so. We send ``{}``
    for it rather than the text the model wrote (which the API would reject): the model
    still sees the error result, and the request stays valid. A string that *is* a JSON
    object is decoded, so a store that keeps inputs as JSON text round-trips. A float
    that is not finite is sent as ``null``, as the store writes it (the body would not
    build: :func:`~actors.providers.failures.finite`), and text holding ``NaN`` is no
    JSON object.
    """
    if isinstance(value, dict):
        return finite(value)
    if isinstance(value, str):
        try:
            decoded = strict_loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's stack
            return {}
        return decoded if isinstance(decoded, dict) else {}
    return {}


BLANK_ERROR = "the tool failed and gave no error message"
"""The content of an error result whose message is blank: the API refuses a
``tool_result`` with ``is_error`` and empty content ("content cannot be empty if
`is_error` is true"), and an exception raised with no message, or a client tool's
answer ``error: ""``, makes one."""


EMPTY_OUTPUT = "(the tool returned no output)"
"""The content of a result whose output is empty (``""`` or whitespace): the API refused
a ``tool_result`` with empty content with a 400, as if the call had no result (Zed
#27130), so every later request of the session failed."""


def _tool_result(msg: ToolMessage) -> dict[str, Any]:
    if msg.error is not None:
        return {
            "type": "tool_result",
            "tool_use_id": tool_id(msg.tool_call_id),
            "content": msg.error if msg.error.strip() else BLANK_ERROR,
            "is_error": True,
        }
    output = msg.output
    content: str | list[dict[str, Any]]
    if is_media_output(output):
        content = _user_content(output)  # an image or a document: never empty
    elif isinstance(output, str):
        content = output if output.strip() else EMPTY_OUTPUT
    else:
        content = json.dumps(output, ensure_ascii=False, default=str)
    return {"type": "tool_result", "tool_use_id": tool_id(msg.tool_call_id), "content": content}


IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""Image formats the Messages API takes."""
DOCUMENT_TYPES = frozenset({"application/pdf", "text/plain"})
"""File formats the Messages API takes as ``document`` blocks."""


def _unsupported(what: str) -> errors.UnsupportedMedia:
    return errors.UnsupportedMedia(f"Anthropic cannot take {what}", provider=PROVIDER)


def _source(part: Image | File) -> dict[str, Any]:
    if part.data is None:
        return {"type": "url", "url": part.url}
    import base64

    data = base64.b64encode(part.data).decode("ascii")
    return {"type": "base64", "media_type": part.media_type, "data": data}


def _media_block(part: Image | File) -> dict[str, Any]:
    """An ``image`` or ``document`` content block."""
    if isinstance(part, Image):
        if part.media_type not in IMAGE_TYPES:
            raise _unsupported(f"{part.media_type} images (only {', '.join(sorted(IMAGE_TYPES))})")
        return {"type": "image", "source": _source(part)}
    if part.media_type not in DOCUMENT_TYPES:
        raise _unsupported(f"{part.media_type} files (only application/pdf and text/plain)")
    if part.media_type == "text/plain":
        if part.data is None:
            raise _unsupported("a text file by URL (only inline data): pass File(data=...)")
        try:
            text = part.data.decode("utf-8")
        except UnicodeDecodeError:
            raise _unsupported("a text/plain file that is not UTF-8") from None
        source = {"type": "text", "media_type": "text/plain", "data": text}
    else:
        source = _source(part)
    block: dict[str, Any] = {"type": "document", "source": source}
    if part.filename:
        block["title"] = part.filename
    return block


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    """A user message's (or a tool result's) content: text, or content blocks."""
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": p.text} if isinstance(p, TextPart) else _media_block(p)
        for p in content
        if not (isinstance(p, TextPart) and not p.text.strip())
    ]


def _append(out: list[dict[str, Any]], role: str, content: str | list[dict[str, Any]]) -> None:
    """Add a message, merging it into the previous one when the role repeats."""
    if out and out[-1]["role"] == role:
        prev = out[-1]
        prev["content"] = _blocks(prev["content"]) + _blocks(content)
    else:
        out.append({"role": role, "content": content})


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def tool_loop_start(messages: Sequence[dict[str, Any]]) -> int | None:
    """The index of the first assistant message of the turn a request continues, or
    ``None`` when it starts a turn (it ends with the user's own words, not only
    ``tool_result`` s).

    The API reads a tool loop as one assistant turn: its messages run from the first
    assistant message after the user's last message that was more than tool results,
    through each step and its results, and through a paused answer sent back last to
    be continued (``pause_turn``, ``compaction``): that too is the "final assistant
    message" the thinking rules name (:func:`thinking_allowed`)."""
    if len(messages) < 2:
        return None
    start = None
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i]["content"]
        if messages[i]["role"] == "assistant":
            start = i
        elif not (
            isinstance(content, list) and content and content[0].get("type") == "tool_result"
        ):
            break
    return start


def thinking_allowed(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether a request of these (mapped) ``messages`` may turn extended thinking on.

    Not when it continues a tool loop (it ends with ``tool_result`` s, or with a paused
    answer sent back to be continued) whose *first* assistant message does not start
    with a thinking block: the API refuses that ("When
    `thinking` is enabled, a final `assistant` message must start with a thinking
    block"), its "final assistant message" being the whole tool loop. That happens when
    the loop was begun by another model or provider (a fallback, a turn continued after
    an approval or a restart under another model), whose thinking cannot be sent here:
    the rest of that loop goes without thinking; so does a paused answer Claude began
    without thinking (adaptive thinking, which may skip it, or thinking turned on
    since). Later steps without thinking of their
    own (Claude thinks once a turn without interleaved thinking) keep it on: the docs
    want one thinking mode for the whole turn."""
    start = tool_loop_start(messages)
    if start is None:
        return True
    content = messages[start]["content"]
    first = content[0] if isinstance(content, list) and content else {}
    return first.get("type") in ("thinking", "redacted_thinking")


def without_loop_thinking(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` less the thinking blocks of the tool loop they continue, for a request
    with thinking off: the API refuses thinking there ("When thinking is disabled, an
    `assistant` message in the final position cannot contain `thinking`"). A loop begun
    with thinking and finished by Claude without it (a fallback to another
    :class:`AnthropicProvider` of the same model, an agent that turned thinking off)
    sends its steps without their thinking; earlier turns keep theirs, which the API
    takes and ignores."""
    start = tool_loop_start(messages)
    if start is None:
        return messages
    out = list(messages[:start])
    for msg in messages[start:]:
        content = msg["content"]
        if msg["role"] == "assistant" and isinstance(content, list):
            kept = [b for b in content if b.get("type") not in ("thinking", "redacted_thinking")]
            if kept != content:
                msg = {**msg, "content": kept or EMPTY_INPUT}
        out.append(msg)
    return out


MIN_THINKING_BUDGET = 1024
"""The smallest ``budget_tokens`` the API takes."""


INTERLEAVED_THINKING_BETA = "interleaved-thinking-2025-05-14"
"""The beta (``anthropic-beta`` header) with which Claude 4 thinks between tool calls, on
every step of a tool loop, instead of once a turn."""


def thinking_budget(
    budget: int | None, max_tokens: Any, *, interleaved: bool = False
) -> int | None:
    """The ``budget_tokens`` a call may send: the provider's, below the call's own
    ``max_tokens`` (an agent's ``settings`` may lower it; the API refuses a budget that
    is not below it), and ``None`` (thinking off for that call) when not even
    :data:`MIN_THINKING_BUDGET` fits. ``interleaved``: a call with tools and the
    interleaved-thinking beta, whose budget is the whole turn's and may exceed
    ``max_tokens`` (the docs: "the token limit becomes your entire context window")."""
    if budget is None or interleaved or not isinstance(max_tokens, int) or budget < max_tokens:
        return budget
    return max_tokens - 1 if max_tokens - 1 >= MIN_THINKING_BUDGET else None


ADAPTIVE_THINKING_MODELS = ("claude-opus-4-6", "claude-mythos-preview")
"""The models whose manual extended thinking (``thinking.type=enabled``, what a
``thinking_budget`` sends) the SDK warns is deprecated, asking for ``adaptive`` instead
(anthropic 2.17's ``MODELS_TO_WARN_WITH_THINKING_ENABLED``, a ``UserWarning`` on each
call): an :class:`AnthropicProvider` of one of them thinks adaptively by default."""


def wants_adaptive(model: str) -> bool:
    """Whether ``model`` is one of :data:`ADAPTIVE_THINKING_MODELS`, under any of its
    names (a dated id, Vertex's ``@`` version, Bedrock's ``anthropic.`` prefix)."""
    return any(name in model for name in ADAPTIVE_THINKING_MODELS)


def with_beta(headers: Any, beta: str) -> dict[str, Any]:
    """``headers`` (a call's ``extra_headers``, maybe ``None``) with ``beta`` added to
    their ``anthropic-beta`` list, which keeps the betas a caller asked for there (the
    header's name in any case). The SDK sends the header as it is; its Bedrock client
    moves it into the body's ``anthropic_beta``."""
    out = dict(headers or {})
    key = next((k for k in out if k.lower() == "anthropic-beta"), "anthropic-beta")
    given = [b.strip() for b in str(out.get(key) or "").split(",") if b.strip()]
    out[key] = ",".join(given if beta in given else [*given, beta])
    return out


def refused_with_thinking(key: str, value: Any, *, adaptive: bool = False) -> bool:
    """Whether the request option ``key`` = ``value`` is one the API refuses with
    extended thinking on, which a call with thinking leaves out: ``temperature`` other
    than 1 ("`temperature` may only be set to 1 when thinking is enabled"), ``top_k``,
    ``top_p`` below 0.95, and a ``tool_choice`` that forces tool use (``any``, ``tool``),
    which ``adaptive`` thinking takes (the thinking docs: "adaptive thinking supports
    forced tool use"). Thinking goes off and on within a session (a tool loop begun
    without it), so these stay in the agent's settings and go with the calls that do
    not think."""
    if key == "temperature":
        return value != 1
    if key == "top_k":
        return True
    if key == "top_p":
        return not (isinstance(value, int | float) and value >= 0.95)
    if key == "tool_choice":
        return not adaptive and isinstance(value, dict) and value.get("type") in ("any", "tool")
    return False


def map_tools(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """Tool definitions: ``{"name", "description", "input_schema"}`` from :meth:`Tool.spec`.

    A ``dict`` is taken as an Anthropic tool definition already (for example a server
    tool such as ``{"type": "web_search_20250305", "name": "web_search"}``) and sent as is.
    The description is left out when empty, where the API treats it as optional.
    """
    out: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, dict):
            out.append(tool)
            continue
        spec = tool.spec()
        entry: dict[str, Any] = {"name": spec["name"]}
        if spec.get("description"):
            entry["description"] = spec["description"]
        entry["input_schema"] = spec["parameters"]
        out.append(entry)
    return out


OUTPUT_INSTRUCTION = (
    f"Give your final answer by calling the {OUTPUT_TOOL} tool with it, and write no other "
    "text for it."
)
"""Added to the system prompt when the answer tool cannot be forced (extended thinking)."""


def map_output(params: dict[str, Any], output: Any, *, thinking: bool) -> None:
    """Ask for a structured answer: add the ``final_output`` tool (its input schema is the
    agent's output schema) to ``params`` and make the model call it.

    ``tool_choice`` forces it (``{"type": "tool"}``), or, when the agent has tools of
    its own, forces *a* tool call (``{"type": "any"}``) so those stay usable. Extended
    thinking accepts neither (only ``auto``): with thinking on, ``tool_choice`` stays
    ``auto`` and the system prompt says to answer through the tool; an answer written as
    plain text is validated all the same. The tool's input streams back as the answer's
    text (:func:`parse_stream` with ``answer_tool``), never as a call to execute.
    """
    tool: dict[str, Any] = {"name": OUTPUT_TOOL}
    if output.description:
        tool["description"] = output.description
    tool["input_schema"] = output.schema
    own_tools = bool(params.get("tools"))
    params["tools"] = [*params.get("tools", ()), tool]
    if thinking:
        system = params.get("system")
        params["system"] = f"{system}\n\n{OUTPUT_INSTRUCTION}" if system else OUTPUT_INSTRUCTION
    elif own_tools:
        params["tool_choice"] = {"type": "any"}
    else:
        params["tool_choice"] = {"type": "tool", "name": OUTPUT_TOOL}


# -- parsing: raw events -> chunks ---------------------------------------------------------


class _Block:
    """A content block between its ``content_block_start`` and ``content_block_stop``."""

    __slots__ = ("data", "id", "json", "kind", "name", "signed")

    def __init__(self, kind: str, *, id: str = "", name: str = "", data: Any = None) -> None:
        self.kind = kind
        """``text``, ``thinking``, ``redacted_thinking``, ``tool_use``, ``answer`` (the
        structured-output tool's call, streamed as text), or ``opaque`` for any other
        (server-side) block, which is kept whole as provider data."""
        self.id = id
        self.name = name
        self.data = data
        """``opaque``: the block as received (a dict); ``tool_use``: the input given at
        the start; ``thinking``: a signature given at the start; ``text``: its citations
        (a list), ``None`` while it has none."""
        self.json: list[str] = []
        """``partial_json`` fragments, joined once at the block's end (never per delta)."""
        self.signed = False
        """A ``signature_delta`` arrived (and closed the reasoning block downstream)."""


_COMPACTION_FIELDS = ("content", "encrypted_content")
"""The fields of a ``compaction`` block that its ``compaction_delta`` brings."""


def _compaction(block: _Block) -> bool:
    """Whether an ``opaque`` block is a ``compaction`` block."""
    return type(block.data) is dict and block.data.get("type") == "compaction"


def map_finish_reason(raw: str | None) -> str:
    """The unified finish reason for an Anthropic ``stop_reason``."""
    return FINISH_REASONS.get(raw or "", "other")


async def parse_stream(stream: Any, emit: Emit, *, answer_tool: str | None = None) -> None:
    """Emit the chunks of one raw Messages event stream; raise when it is not complete.

    ``stream`` is any async iterable of events as plain JSON dicts (:func:`json_events`
    makes them from the SDK's stream). Deltas are
    emitted as they arrive; a tool call (``ToolCallChunk``) only once its block has ended,
    because a prefix of the JSON may parse and still be wrong. Usage and the finish chunk
    come last, after ``message_stop``; a stream that ends before it (or without a
    ``stop_reason``) was cut, and raises :class:`MalformedStream`.

    A ``tool_use`` of ``answer_tool`` (structured output) is the answer, not a call: its
    input JSON is emitted as text chunks, and a ``tool_use`` stop reason with no other
    call is ``stop``.
    """
    await parse_batches(_one_by_one(stream), emit, answer_tool=answer_tool)


async def _one_by_one(stream: Any) -> AsyncGenerator[list[dict[str, Any]], None]:
    async for event in stream:
        yield [event]


async def parse_batches(
    batches: AsyncIterable[Sequence[dict[str, Any] | list[str]]],
    emit: Emit,
    *,
    answer_tool: str | None = None,
    coalesce: bool = False,
    runs: bool = False,
) -> None:
    """:func:`parse_stream` of events that come a network read at a time
    (:func:`json_event_batches`): each read's chunks are sent together
    (:class:`~actors.providers.read_batch.ReadBatch`; with ``coalesce``, a read's
    consecutive text deltas of one block join into one chunk; with ``runs``, those read
    through their slot go as a :class:`~runtime.provider.TextRun`)."""
    parse = _MessageParse(emit, answer_tool)
    out = ReadBatch(emit, coalesce=coalesce, runs=runs)
    try:
        async for batch in batches:
            try:
                await _parse_read(batch, parse, out)
            except SHAPE_ERRORS as exc:  # an event of the wrong shape
                await out.flush()
                raise unreadable(exc, PROVIDER) from exc
            except Exception:
                await out.flush()  # what the read gave before the failure stays emitted
                raise
            await out.flush()
        await parse.finish()
    except Exception as exc:
        if _after_a_whole_answer(parse, exc):
            # ``message_delta`` gave the stop reason and every block had ended: the answer
            # is whole; failing it made a fallback ask again and bill it twice.
            get_logger("axon.providers").warning(
                "provider.error_after_answer",
                provider=PROVIDER,
                stop_reason=parse.stop_reason,
                error=redact(describe_exception(exc)),
            )
            parse.stopped = True
            await parse.finish()
            return
        # Billed though the call failed: ``message_start`` counted the input (and
        # ``message_delta`` the output so far); the turn counts it (branch ``provleft``).
        if parse.usage and not parse.usage_sent:
            parse.usage_sent = True
            await emit(UsageChunk(usage=_total_usage(parse.usage)))
        raise
    except trio.Cancelled:  # the call's deadline, or its turn stopped: billed all the same
        if parse.usage and not parse.usage_sent:
            parse.usage_sent = True
            await billed_when_cut(emit, UsageChunk(usage=_total_usage(parse.usage)))
        raise


async def _parse_read(
    batch: Sequence[dict[str, Any] | list[str]], parse: _MessageParse, out: ReadBatch
) -> None:
    """The events of one read into ``out`` (text deltas inline: most of a stream)."""
    on_event = parse.on_event
    i, n = 0, len(batch)
    while i < n:
        event = batch[i]
        i += 1
        if isinstance(event, list):  # text deltas read through their slot (json_event_batches)
            await out.text_list(event)  # of the block of the last text delta read in full
            continue
        etype: Any = event.get("type")
        if etype == "content_block_delta":
            delta = event.get("delta") or {}
            dtype = delta.get("type")
            if dtype == "text_delta":
                text = delta.get("text")
                if text:
                    if type(text) is not str:
                        text_of(text, "a text_delta's text", PROVIDER)  # raises
                    index = event.get("index")
                    if index != parse.run_index:  # another block: another part
                        out.end_run()
                        parse.run_index = index
                    out.text(text)
                    if out.urgent:
                        await out.flush()
                continue
            chunk = parse.block_delta(event.get("index"), dtype, delta)
            if chunk is not None:
                out.add(chunk)
                if out.urgent:
                    await out.flush()
        else:
            # any other event is ignored (ping never gets here: it is dropped as the SDK does)
            handler = on_event.get(etype)
            if handler is not None:
                await out.flush()  # what came before goes first
                await handler(event)


_WHOLE = frozenset({"end_turn", "tool_use", "stop_sequence"})
"""The stop reasons after which an ``error`` event leaves the answer whole (not
``max_tokens``, ``refusal``, ``pause_turn``: their error stays the call's)."""


def _after_a_whole_answer(parse: _MessageParse, exc: Exception) -> bool:
    """Whether ``exc`` is an ``error`` event that came after the message was whole: its
    ``stop_reason`` read and no block left open (``message_stop`` alone missing; after
    it nothing is read). Asked of every failed stream: the SDK is looked up, never
    imported (an ``APIStatusError`` exists only once the SDK is loaded; an import here
    ran the import system on each failure, and this module imports no SDK itself)."""
    if type(parse.stop_reason) is not str or parse.stop_reason not in _WHOLE or parse.blocks:
        return False
    sdk = sys.modules.get("anthropic")
    return (
        sdk is not None
        and isinstance(exc, sdk.APIStatusError)
        and exc.status_code < 400  # in the stream, not the response's status
    )


class _MessageParse:
    """What :func:`parse_stream` has read of one message: its open blocks, how many tool
    calls it made, its stop reason and usage so far; a method per event type."""

    __slots__ = (
        "after_text",
        "answer_tool",
        "blocks",
        "calls",
        "emit",
        "on_event",
        "run_index",
        "stop_reason",
        "stopped",
        "usage",
        "usage_sent",
    )

    def __init__(self, emit: Emit, answer_tool: str | None) -> None:
        self.emit = emit
        self.answer_tool = answer_tool
        self.blocks: dict[int, _Block] = {}
        self.calls = 0
        """``tool_use`` blocks that are calls (not the answer)."""
        self.stop_reason: str | None = None
        self.stopped = False
        self.usage: dict[str, int | None] = {}
        self.usage_sent = False
        self.on_event = self.handlers()
        self.run_index: Any = None
        """The block of the last text delta (a text run never spans two blocks)."""
        self.after_text = False
        """The last block to end was an uncited text block (:meth:`block_start`)."""

    def handlers(self) -> dict[str, Callable[[dict[str, Any]], Awaitable[None]]]:
        """The events other than ``content_block_delta`` this reads, by type."""
        return {
            "content_block_start": self.block_start,
            "content_block_stop": self.block_stop,
            "message_start": self.message_start,
            "message_delta": self.message_delta,
            "message_stop": self.message_stop,
        }

    def block_delta(self, index: Any, dtype: Any, delta: dict[str, Any]) -> Any:
        """The chunk of a delta of type ``dtype`` (not a text delta) to block ``index``
        (``None``: none)."""
        block = self.blocks.get(index)
        if block is None:
            raise errors.MalformedStream(
                f"content_block_delta for block {index}, which was never started",
                provider=PROVIDER,
            )
        if dtype == "input_json_delta":
            fragment = text_of(delta.get("partial_json"), "partial_json", PROVIDER)
            if fragment:
                block.json.append(fragment)
                if block.kind == "tool_use":
                    return ToolInputDeltaChunk(tool_call_id=block.id, delta=fragment)
                if block.kind == "answer":
                    return TextChunk(text=fragment)
        elif dtype == "thinking_delta":
            thinking = text_of(delta.get("thinking"), "a thinking_delta's text", PROVIDER)
            if thinking:
                return ReasoningChunk(text=thinking, provider=PROVIDER)
        elif dtype == "signature_delta":
            block.signed = True
            signature = text_of(delta.get("signature"), "a signature", PROVIDER)
            return ReasoningChunk(signature=signature, provider=PROVIDER)
        elif dtype == "compaction_delta" and block.kind == "opaque" and _compaction(block):
            # A compaction block (the server's context compaction) starts with no summary;
            # its one delta brings it, and the block goes back verbatim, so the summary
            # must be in it (kept whole, as the SDK's accumulator does). Without it the
            # block went back empty, a no-op for the server: the compaction was lost.
            for key in _COMPACTION_FIELDS:
                if key in delta:
                    block.data[key] = delta[key]
        elif dtype == "citations_delta" and block.kind == "text":
            # A source of the text block: kept on the block (none of the hot text path's
            # work), sent with the block's end (_stop_block)
            citation = delta.get("citation")
            if type(citation) is dict:
                if block.data is None:
                    block.data = []
                block.data.append(citation)
        # any other delta type is newer than this module and ignored
        return None

    async def block_start(self, event: dict[str, Any]) -> None:
        content = event.get("content_block") or {}
        if self.after_text:
            self.after_text = False
            if content.get("type") == "text":
                # Text right after a text block: the parts manager would go on with the
                # same text part (a cited block's own end closed it, an uncited one's
                # did not), so the two blocks were stored as one text part, the second
                # one's citations covering both, and went back as one block. A
                # CitationsChunk of none ends the part: each block is a part of its own.
                await self.emit(CitationsChunk(citations=()))
        if content.get("type") == "tool_use" and content.get("name") == self.answer_tool:
            self.blocks[event.get("index")] = _Block("answer", data=content.get("input"))  # type: ignore[index]
        else:
            self.calls += content.get("type") == "tool_use"
            await _start_block(event.get("index"), content, self.blocks, self.emit)

    async def block_stop(self, event: dict[str, Any]) -> None:
        block = self.blocks.pop(event.get("index"), None)  # type: ignore[arg-type]
        if block is not None:
            self.after_text = block.kind == "text" and not block.data
            await _stop_block(block, self.emit)

    async def message_start(self, event: dict[str, Any]) -> None:
        _take_usage(self.usage, (event.get("message") or {}).get("usage"))

    async def message_delta(self, event: dict[str, Any]) -> None:
        self.stop_reason = (event.get("delta") or {}).get("stop_reason") or self.stop_reason
        _take_usage(self.usage, event.get("usage"))

    async def message_stop(self, event: dict[str, Any]) -> None:
        self.stopped = True

    async def finish(self) -> None:
        """After the last event: the calls cut short, the usage, the finish; or
        :class:`MalformedStream` for a stream that was cut itself."""
        stop_reason = self.stop_reason
        if not self.stopped or stop_reason is None:
            missing = "message_stop" if not self.stopped else "a stop_reason"
            raise errors.MalformedStream(
                f"the response stream ended without {missing} (cut short)", provider=PROVIDER
            )
        # Blocks the stop reason cut off before their end: a tool call is reported, never
        # parsed (a JSON prefix may parse and be wrong); an open thinking block stays
        # unsigned; an open server block cannot be replayed and is dropped.
        for block in self.blocks.values():
            if block.kind == "tool_use":
                cut = TRUNCATED_BY_MAX_TOKENS
                if stop_reason != "max_tokens":
                    cut = f"the tool input was cut off ({stop_reason}); the call was not executed"
                await self.emit(_tool_call(block, cut))
        self.usage_sent = True
        await self.emit(UsageChunk(usage=_total_usage(self.usage)))
        reason = map_finish_reason(stop_reason)
        if reason == "tool-calls" and not self.calls and self.answer_tool is not None:
            reason = "stop"  # the only tool used was the answer's
        await self.emit(
            FinishChunk(reason=reason, raw_reason=stop_reason, resume=stop_reason in RESUMED)
        )


def _total_usage(usage: dict[str, int | None]) -> Usage:
    """The message's usage from the counters its events gave."""
    inp, out = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
    return Usage(
        input_tokens=inp,
        output_tokens=out,
        total_tokens=inp + out,
        cache_read=usage.get("cache_read_input_tokens"),
        cache_write=usage.get("cache_creation_input_tokens"),
        reasoning_tokens=usage.get("thinking_tokens"),
    )


async def _start_block(index: Any, content: dict[str, Any], blocks: dict, emit: Emit) -> None:
    kind = content.get("type")
    if kind == "text":
        cited = content.get("citations")  # [] or none as a block starts; kept if any
        blocks[index] = _Block(kind, data=list(cited) if type(cited) is list and cited else None)
        text = text_of(content.get("text"), "a text block's text", PROVIDER)
        if text:
            await emit(TextChunk(text=text))
    elif kind == "thinking":
        signature = text_of(content.get("signature"), "a signature", PROVIDER)
        blocks[index] = _Block(kind, data=signature or None)
        thinking = text_of(content.get("thinking"), "a thinking block's text", PROVIDER)
        if thinking:
            await emit(ReasoningChunk(text=thinking, provider=PROVIDER))
    elif kind == "redacted_thinking":
        blocks[index] = _Block(kind)
        await emit(ReasoningChunk(redacted_data=content.get("data"), provider=PROVIDER))
    elif kind == "tool_use":
        call_id = text_of(content.get("id"), "a tool_use id", PROVIDER) or ""
        name = text_of(content.get("name"), "a tool_use name", PROVIDER) or ""
        blocks[index] = _Block(kind, id=call_id, name=name, data=content.get("input"))
        await emit(ToolInputStartChunk(tool_call_id=call_id, tool_name=name))
    else:  # server-side tool use/result, or a block type newer than this module
        blocks[index] = _Block("opaque", data=dict(content))


async def _stop_block(block: _Block, emit: Emit) -> None:
    kind = block.kind
    if kind == "tool_use":
        await emit(_tool_call(block))
    elif kind == "thinking":
        if block.data and not block.signed:  # signed in content_block_start, no delta
            await emit(ReasoningChunk(signature=block.data, provider=PROVIDER))
    elif kind == "answer":
        if not block.json and block.data:  # the whole input came with the block's start
            await emit(TextChunk(text=json.dumps(block.data, ensure_ascii=False)))
    elif kind == "opaque":
        data = block.data
        if block.json:  # server_tool_use: the input streamed like a tool_use's
            try:
                data["input"] = json.loads("".join(block.json))
            except (ValueError, RecursionError):
                pass  # keep the start's input; the server already ran the tool
        await emit(ProviderDataChunk(provider=PROVIDER, data=data))
    elif kind == "text" and block.data:  # cited: the text part ends with its citations
        await emit(CitationsChunk(citations=tuple(block.data)))


def _tool_call(block: _Block, cut: str | None = None) -> ToolCallChunk:
    """The complete call of a ``tool_use`` block; ``cut`` says why its input is unusable."""
    raw = "".join(block.json)
    ids = {"tool_call_id": block.id, "tool_name": block.name}
    if cut is not None:
        return ToolCallChunk(**ids, input=raw, input_error=cut)
    if not raw.strip():
        return ToolCallChunk(**ids, input=block.data or {})
    try:
        return ToolCallChunk(**ids, input=strict_loads(raw))
    except (ValueError, RecursionError) as exc:  # a recursion bomb is no JSON either
        return ToolCallChunk(**ids, input=raw, input_error=f"invalid JSON in tool input: {exc}")


def _take_usage(usage: dict[str, int | None], raw: Any) -> None:
    """Fold a ``usage`` object in; counters are cumulative, so later values replace."""
    if not isinstance(raw, dict):
        return
    for key in _USAGE_KEYS:
        value = tokens(raw.get(key))  # a count that is no count is none
        if value is not None:
            usage[key] = value
    details = raw.get("output_tokens_details")
    if isinstance(details, dict) and tokens(details.get("thinking_tokens")) is not None:
        usage["thinking_tokens"] = details["thinking_tokens"]


async def json_events(stream: Any) -> AsyncGenerator[dict[str, Any], None]:
    """The events of an SDK ``AsyncStream`` as plain dicts, one at a time (the events of
    :func:`json_event_batches`)."""
    batches = json_event_batches(stream)
    async with aclosing(batches):
        async for batch in batches:
            for event in batch:
                yield cast(dict[str, Any], event)  # without ``texts``: dicts only


async def json_event_batches(
    stream: Any, *, texts: bool = False
) -> AsyncGenerator[list[dict[str, Any] | list[str]], None]:
    """The events of an SDK ``AsyncStream`` as plain dicts, decoded by orjson, a list per
    network read; with ``texts``, a text delta that is the bytes of the last text delta
    decoded in full around another string is read as its text alone, without decoding
    the rest (:mod:`~actors.providers.json_slot`), and consecutive ones come as one
    ``list`` of their texts (``str`` s, in order, one a delta): deltas of the same block
    as that one, since any other ``content_block_delta`` decoded in full (another
    block's, another kind's) drops the slot.

    Why: the SDK validates every event into a pydantic model, and decodes the SSE lines
    in Python, one ``str`` and one event object at a time; those were most of what a
    stream costs on the client, while :func:`parse_stream` reads a few fields. So the
    request, the HTTP status errors and the connection stay the SDK's, the body's events
    are read from its bytes (:func:`~actors.providers.sse.event_batches`, the SDK's own
    SSE rules; a stream it does not decode as plain SSE goes through the SDK), and this
    does what the SDK's stream does with each event: skip ``ping`` s, events without a
    name and empty data, and raise the SDK's status error for ``event: error`` (same
    message, body and response), after the events of the same read that came before
    it. A stream without that iterator (another SDK version) or with the SDK's tracing
    observer on is read through the SDK, its events turned into dicts.

    With ``texts``, a read of the SDK's plain SSE is taken as its lines where it is made
    of ``event:`` + ``data:`` blocks (a Messages API body, :meth:`SSEDecoder.feed_lines`),
    and a run of text deltas of the slot's bytes is read from them by their bytes
    (:meth:`StringSlot.run_lines`), not cut into ``(name, data)`` pairs first: those
    pairs and the checks of each line were about as much of a delta's CPU as reading its
    text (issue 24 goal 1). Every other block is read as its events, as before.
    """
    iter_events = getattr(stream, "_iter_events", None)
    if iter_events is None or getattr(stream, "_observer", None) is not None:
        async for event in stream:
            yield [event if isinstance(event, dict) else event.to_dict()]
        return
    reader = _EventReader(stream, texts)
    response = sdk_sse_response(stream) if texts else None
    if response is None:  # through the SDK's decoder, or no text to read by slot
        events = event_batches(stream)
        async with aclosing(events):
            async for batch in events:
                out: list[dict[str, Any] | list[str]] = []
                failure = reader.events(batch, out)
                if out:
                    yield out  # what came before a failure is the stream's
                if failure is not None:
                    raise failure
                if reader.stopped:
                    await _drain_after_stop(events)
                    return
        return
    decoder = SSEDecoder()
    head, seen = b"", False
    async with body_bytes(response) as chunks:
        async for chunk in chunks:
            lines, batch = decoder.feed_lines(chunk)
            out = []
            if lines:
                failure = reader.lines(decoder, lines, out)
            else:
                failure = reader.events(batch, out) if batch else None
            if not seen:  # an event read (its chunk given, or a failure raised)
                head, seen = head or chunk[:HEAD_BYTES], bool(out or batch)
            if out:
                yield out
            if failure is not None:
                raise failure
            if reader.stopped:
                await _drain_after_stop(chunks)
                return
        batch = decoder.finish()
        if batch:
            out = []
            failure = reader.events(batch, out)
            if out:
                yield out
            if failure is not None:
                raise failure
        elif not seen:
            raise no_events(response, head, PROVIDER)


_DELTA = "content_block_delta"
_DELTA_LEAD = b"event: content_block_delta\ndata: "
"""A text delta's SSE block up to its data's value (:meth:`StringSlot.run_lines`)."""


class _EventReader:
    """What :func:`json_event_batches` knows of a stream between its reads: the slot of
    its text deltas and how many more may be tried as one; a method per form of a read
    (its events, or its lines, :meth:`~actors.providers.sse.SSEDecoder.feed_lines`)."""

    __slots__ = (
        "fast",
        "half",
        "learning",
        "loads",
        "response",
        "saved",
        "slot",
        "stopped",
        "stream",
        "texts",
    )

    def __init__(self, stream: Any, texts: bool) -> None:
        self.loads = self.fast = orjson_module().loads
        self.half: tuple[Any, str] | None = None
        """Half a character held back from a block's text (:meth:`refused`)."""
        self.saved: tuple[StringSlot | None, int] = (None, 0)
        self.stream = stream
        self.response = stream.response
        self.texts = texts
        self.slot: StringSlot | None = None
        self.learning = SLOT_LEARNING if texts else 0
        self.stopped = False
        """``message_stop`` was read: the message is whole, nothing follows it."""

    def lines(
        self, decoder: SSEDecoder, lines: list[bytes], out: list[dict[str, Any] | list[str]]
    ) -> Exception | None:
        """A read given as SSE lines, three a block, into ``out``: the runs of text
        deltas that are the slot's bytes read by their lines
        (:meth:`StringSlot.run_lines`: no ``(name, data)`` pair, no cut ``data:`` line a
        delta; issue 24 goal 1), any other block read as its events by :meth:`events`,
        in order. What went wrong (after the events before it), or ``None``."""
        failure, _ = read_blocks(self, decoder, lines, 3, _DELTA_LEAD, self._events, out)
        return failure

    def _events(
        self, batch: Sequence[tuple[Any, bytes]], out: list[dict[str, Any] | list[str]]
    ) -> tuple[Exception | None, bool]:
        """:meth:`events` as :func:`read_blocks` takes it (an Anthropic stream ends at its
        ``message_stop`` event: the blocks after it are not read)."""
        return self.events(batch, out), self.stopped

    def events(
        self, batch: Sequence[tuple[Any, bytes]], out: list[dict[str, Any] | list[str]]
    ) -> Exception | None:
        """A read's ``(name, data)`` events into ``out``; what went wrong (after the
        events before it), or ``None``."""
        loads = self.loads
        slot = self.slot
        learning = self.learning
        texts = self.texts
        failure: Exception | None = None
        i, n = 0, len(batch)
        while i < n:
            if slot is not None:  # a run of text deltas of the slot's block, at once
                run, i = slot.run(batch, i, _DELTA)
                if run:
                    out.append(run)
                    if i == n:
                        break
            name, data = batch[i]
            i += 1
            if name == "ping" or name is None:
                continue
            if name == "error":
                failure = _stream_error(self.stream, data, self.response)
                break
            if slot is not None:
                text = slot.text(data)  # (an event of another name, read as before)
                if text is not None:
                    out.append([text])
                    continue
            if not data:
                continue
            try:
                event = loads(data)
            except ValueError as exc:
                try:
                    event = self.refused(data, exc, out, slot, learning)
                except ValueError as refused:
                    failure = refused
                    break
                loads, slot, learning = self.loads, self.slot, self.learning
            if type(event) is not dict:
                failure = _not_an_object(data)
                break
            out.append(event)
            if name == "message_stop":
                self.stopped = True
                break
            if texts and event.get("type") == _DELTA:
                slot = None  # another block's delta, or another kind's: no str follows
                if learning and _delta_text(event):
                    learning -= 1
                    slot = learn(data, event, b'"text":', _delta_text, _put_delta_text)
        self.slot = slot
        self.learning = learning
        return failure

    def refused(
        self,
        data: bytes,
        exc: ValueError,
        out: list[dict[str, Any] | list[str]],
        slot: StringSlot | None,
        learning: int,
    ) -> Any:
        """An event's JSON that ``self.loads`` refused with ``exc``, read on the slow
        path that holds half a character back (:func:`read_holding`)."""
        return read_holding(
            self, data, exc, out, slot, learning, _text_of, _text_at, _block, _half_flushed
        )


_DELTA_TEXT = {
    "text_delta": "text",
    "thinking_delta": "thinking",
    "input_json_delta": "partial_json",
}
"""Each delta type whose text a held half may be cut from, and its text's key."""


def _text_at(event: dict[str, Any]) -> Slot | None:
    """Where a delta's text is (:func:`hold_half`): a text's, a thinking's, a tool
    call's input JSON; its part, the block's index and the delta's type."""
    delta = event.get("delta")
    if event.get("type") != _DELTA or type(delta) is not dict:
        return None
    kind = delta.get("type")
    key = _DELTA_TEXT.get(kind) if type(kind) is str else None
    if key is None or type(delta.get(key)) is not str:
        return None
    return delta, key, (event.get("index"), kind)


def _text_of(event: dict[str, Any], part: Any) -> Slot | None:
    at = _text_at(event)
    return at if at is not None and at[2] == part else None


def _block(event: dict[str, Any]) -> Any:
    return event.get("index")


def _half_flushed(part: Any) -> dict[str, Any]:
    """A delta of a held half whose other half did not come (:meth:`_EventReader.refused`)."""
    index, kind = part
    delta = {"type": kind, _DELTA_TEXT[kind]: HALF_HELD}
    return {"type": "content_block_delta", "index": index, "delta": delta}


DRAIN_AFTER_STOP = 0.1
"""Seconds to read what follows ``message_stop`` (the end of the body, so the connection
is reused); a server that keeps the body open is cut then."""


async def _drain_after_stop(events: AsyncIterator[Any]) -> None:
    """Read what follows ``message_stop`` for at most :data:`DRAIN_AFTER_STOP` seconds
    and drop it. Why: the message is whole at ``message_stop``; the reader went on to the
    end of the body, so a server (a proxy) that kept it open made a finished answer wait
    for the read timeout and then fail with a ``ProviderTimeout`` (branch ``provatk``)."""
    with trio.move_on_after(DRAIN_AFTER_STOP):
        async for _ in events:
            pass


def _response_closed(events: Any) -> bool:
    """Whether the HTTP response of the SDK stream ``events`` is closed already
    (``httpx2.Response.is_closed``: read to its end, or closed): then the stream's
    ``close`` returns without waiting (the response's ``aclose`` does nothing), and a
    shielded bound around it is not needed. ``False`` for anything else (another
    SDK version, a test double): it is closed within the bound, as before."""
    return getattr(getattr(events, "response", None), "is_closed", None) is True


def _not_an_object(data: bytes) -> errors.MalformedStream:
    """The error of an event whose data is JSON but no object (no event the API sends):
    :func:`json_event_batches` raises it after the events of the same read before it."""
    return errors.MalformedStream(
        "an event's data is not a JSON object: "
        + quoted(data[:HEAD_BYTES].decode("utf-8", "replace")),
        provider=PROVIDER,
    )


SLOT_LEARNING = 64
"""How many text deltas of a stream may be tried as a slot (:func:`json_event_batches`):
one a text block, but not without end for a server whose every delta differs."""


def _delta_text(event: Any) -> str | None:
    """The text of a ``text_delta`` event (the shape the fast read in :func:`_parse_read`
    takes), ``None`` for any other event."""
    if type(event) is not dict or event.get("type") != "content_block_delta":
        return None
    delta = event.get("delta")
    if type(delta) is not dict or delta.get("type") != "text_delta":
        return None
    text = delta.get("text")
    return text if type(text) is str and text else None


def _put_delta_text(event: dict[str, Any], text: str) -> None:
    event["delta"]["text"] = text


def _stream_error(stream: Any, data: bytes, response: Any) -> Exception:
    """The status error the SDK raises for an ``event: error`` (see its ``__stream__``)."""
    text = data.decode("utf-8", errors="replace")
    body: Any = text
    try:
        body = json.loads(text)
        message = f"{body}"
    except Exception:
        message = text or f"Error code: {response.status_code}"
    return stream._client._make_status_error(message, body=body, response=response)


# -- errors -----------------------------------------------------------------------------


def classify_error(exc: BaseException) -> errors.AxonError:
    """Map an SDK, transport or parsing exception onto :mod:`runtime.errors`.

    An ``APIStatusError`` goes through the shared status ladder
    (:func:`~actors.providers.failures.classify_status`). An SSE ``event: error``
    surfaces from the SDK as an ``APIStatusError`` with the stream's HTTP status (200);
    its ``error.type`` is then what tells the failure, so ``status_code`` becomes the
    status Anthropic documents for that type (529 for ``overloaded_error``). The SDK's
    timeout and connection errors, the HTTP library's errors mid-stream and undecodable
    events are transport failures
    (:func:`~actors.providers.failures.classify_transport`). The SDK's ``TypeError`` for
    a client with no credentials is :func:`~actors.providers.failures.missing_key`.
    """
    if isinstance(exc, errors.AxonError):
        return exc
    # Looked up, never imported (as in _after_a_whole_answer): an SDK exception exists
    # only once the SDK is loaded; an import here ran the import system per failure.
    anthropic = sys.modules.get("anthropic")
    if anthropic is None:
        return _classify_without_sdk(exc)
    if isinstance(exc, anthropic.APIStatusError):
        error_type = getattr(exc, "type", None)
        status = exc.status_code
        if status < 400:  # in-stream error: the HTTP status says nothing
            status = _ERROR_TYPE_STATUS.get(error_type or "", 500)
        return classify_status(
            getattr(exc, "api_message", None) or str(exc.message),
            provider=PROVIDER,
            status=status,
            error_type=error_type,
            retry_after=retry_after(exc.response.headers),
        )
    if isinstance(exc, anthropic.APITimeoutError):
        return errors.ProviderTimeout(f"the request timed out: {exc}", provider=PROVIDER)
    if isinstance(exc, anthropic.APIConnectionError):
        refused = hook_error(exc)  # a redirect off the endpoint's origin (StayHome)
        if refused is not None:
            return refused
        return errors.ConnectionLost(f"connection failed or dropped: {exc}", provider=PROVIDER)
    if isinstance(exc, anthropic.APIResponseValidationError):
        return errors.MalformedStream(f"unparseable response stream: {exc}", provider=PROVIDER)
    return _classify_without_sdk(exc)


def _classify_without_sdk(exc: BaseException) -> errors.AxonError:
    """:func:`classify_error` for an exception that is none of the SDK's own."""
    if isinstance(exc, TypeError) and "Could not resolve authentication method" in str(exc):
        return missing_key(PROVIDER, "ANTHROPIC_API_KEY")  # raised before any request
    found = classify_transport(exc, provider=PROVIDER)
    if found is not None:
        return found
    return errors.ProviderError(errors.describe_exception(exc), provider=PROVIDER)


# -- the provider -------------------------------------------------------------------------


@functools.cache
def _otel_trace() -> Any:
    """``opentelemetry.trace``, loaded by the SDK already when it gave a tracer, imported
    here once: a ``from ... import`` in a function runs the import system on every call
    (~3,900 instructions; issue 24 goal 1)."""
    from opentelemetry import trace

    return trace


def span_can_start(client: Any) -> bool:
    """Whether the span of a call through ``client`` (an Anthropic SDK client with an
    OpenTelemetry tracer) could record or carry a trace context: the client was given a
    tracer provider, or a real one is set globally (the proxy's spans do nothing then),
    or the current context holds a valid span, whose context a non-recording span
    carries on (the SDK's ``traceparent``)."""
    trace = _otel_trace()
    options = getattr(client, "_open_telemetry", None) or {}
    if options.get("tracer_provider") is not None:
        return True
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return True
    return trace.get_current_span().get_span_context().is_valid


_SPAN_AWARE: dict[type, type] = {}
"""Each SDK client class, to its subclass made by :func:`skip_idle_spans`."""


def skip_idle_spans(client: Any) -> None:
    """Have the SDK skip a call's OpenTelemetry span when it could neither record nor
    carry a trace context (:func:`span_can_start`), and make it as before when it could.

    Why: the SDK builds each call's span attributes (the server, the request's options,
    the default headers) before it asks whether the span records; with no OpenTelemetry
    SDK configured, the tracer is OpenTelemetry's proxy, whose span does neither, so the
    SDK drops it: 45-70 us of a one-delta call's CPU (branch ``g1sdk``). The client's
    class becomes a subclass (made once per class) whose ``_tracer`` is the SDK's, or
    ``None`` (the SDK's "no spans") whenever it is read while no span can start. Read,
    not set per call: the SDK reads it after an ``await`` (its options' preparation, a
    platform's credentials), and a client serves every session's calls, each task in a
    trace context of its own; so the answer is always the reading task's. An application
    that configures OpenTelemetry after the first call has the SDK's spans from then on.
    A client without this tracer property is left as it is: the request is the same
    either way, this only saves the work."""
    cls = type(client)
    if cls in _SPAN_AWARE.values():
        return
    aware = _SPAN_AWARE.get(cls)
    if aware is None:
        prop = getattr(cls, "_tracer", None)
        if not isinstance(prop, property) or prop.fget is None:
            return
        sdk_tracer = prop.fget

        def _tracer(self: Any) -> Any:
            tracer = sdk_tracer(self)
            return tracer if tracer is None or span_can_start(self) else None

        namespace = {"_tracer": property(_tracer), "__module__": cls.__module__}
        aware = _SPAN_AWARE[cls] = type(cls.__name__, (cls,), namespace)
        aware.__qualname__ = cls.__qualname__
    client.__class__ = aware


class AnthropicProvider(SDKProvider):
    """Streams Anthropic Messages API calls (raw events) for any number of sessions.

    ``request_options`` are extra request fields on every call (``temperature``,
    ``metadata``, ...), under the call's own ``InferRequest.settings``; fields the SDK's
    ``create`` does not name go in ``extra_body``."""

    provider_name: ClassVar[str] = PROVIDER
    default_endpoint: ClassVar[str | None] = "https://api.anthropic.com"
    endpoint_env: ClassVar[str | None] = "ANTHROPIC_BASE_URL"
    price_vendor: ClassVar[str | None] = "anthropic"
    usage_input_includes_cache: ClassVar[bool] = False  # cache reads and writes apart

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        thinking_budget: int | None = None,
        max_tokens: int = 4096,
        max_concurrency: int | None = None,
        timeout: float | None = 60.0,
        name: str | None = None,
        foreign_reasoning: ForeignReasoning = "drop",
        price_as: str | None = None,
        interleaved_thinking: bool = False,
        adaptive_thinking: bool | None = None,
        **request_options: Any,
    ) -> None:
        if adaptive_thinking is None:  # adaptive where the SDK deprecates a budget
            adaptive_thinking = thinking_budget is not None and wants_adaptive(model)
        if thinking_budget is not None and thinking_budget < MIN_THINKING_BUDGET:
            raise errors.ConfigurationError(
                f"thinking_budget ({thinking_budget}) must be at least {MIN_THINKING_BUDGET}: "
                "the API refuses a smaller budget_tokens"
            )
        if (
            thinking_budget is not None
            and thinking_budget >= max_tokens
            and not interleaved_thinking
            and not adaptive_thinking
        ):
            raise errors.ConfigurationError(
                f"thinking_budget ({thinking_budget}) must be below max_tokens ({max_tokens}): "
                "thinking tokens count towards max_tokens"
            )
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
        self.thinking_budget = thinking_budget
        """Extended-thinking budget in tokens; ``None`` leaves thinking off (unless
        :attr:`adaptive_thinking`, which sends no budget)."""
        self.max_tokens = max_tokens
        """Output token limit per call (thinking included)."""
        self.interleaved_thinking = interleaved_thinking
        """Ask for interleaved thinking (the :data:`INTERLEAVED_THINKING_BETA` header on
        every call that thinks): Claude 4 then thinks on each step of a tool loop, after
        the tool results, not only before its first call. With it a call that has tools
        may send a ``thinking_budget`` at or above ``max_tokens``. Off by default: a
        beta, and more thinking tokens."""
        self.adaptive_thinking = adaptive_thinking
        """Think adaptively: every call sends ``thinking={"type": "adaptive"}`` (Claude
        decides whether and how much to think, between tool calls too), no budget and no
        interleaved-thinking beta. Given as ``None`` (the default), it is on when a
        ``thinking_budget`` is given for a model of :data:`ADAPTIVE_THINKING_MODELS`,
        whose budgeted thinking the SDK warns is deprecated; ``False`` keeps the budget
        for them too, ``True`` turns adaptive thinking on for any model."""

    @classmethod
    def from_options(cls, options: ProviderOptions) -> AnthropicProvider:
        """``--provider anthropic``: ``--model`` (default ``claude-sonnet-4-5``),
        ``--base-url``, ``--api-key``, ``--thinking-budget``."""
        return cls(
            options.model or "claude-sonnet-4-5",
            base_url=options.base_url,
            api_key=options.api_key,
            thinking_budget=options.thinking_budget,
        )

    def describe_settings(self) -> dict[str, Any]:
        return {
            "thinking_budget": self.thinking_budget,
            "max_tokens": self.max_tokens,
            "interleaved_thinking": self.interleaved_thinking,
            "adaptive_thinking": self.adaptive_thinking,
            "foreign_reasoning": self.foreign_reasoning,
        }

    def new_client(self) -> Any:
        """The ``AsyncAnthropic`` client, with SDK retries off: the turn runner retries,
        with the classification above, so retries never stack."""
        from anthropic import AsyncAnthropic, Timeout  # the SDK: loaded by the first call only

        kw: dict[str, Any] = {"max_retries": 0, "timeout": client_timeout(self.timeout, Timeout)}
        if self.base_url is not None:
            kw["base_url"] = self.base_url
        if self._api_key is not None:
            kw["api_key"] = self._api_key
        return AsyncAnthropic(**kw)

    def client_secrets(self, client: Any) -> tuple[str | None, ...]:
        return (client.api_key, client.auth_token)  # an API key, or a bearer token

    def prepare_client(self, client: Any) -> None:
        super().prepare_client(client)
        skip_idle_spans(client)

    def _cap(self, options: dict[str, Any], left: int | None) -> int | None:
        """``max_tokens`` in ``options`` (the settings over the provider's options):
        theirs, else :attr:`max_tokens` (the API requires one), lowered to ``left``."""
        return cap_output(options, "max_tokens", left, self.max_tokens)

    def sent_cap(self, settings: Mapping[str, Any], left: int | None) -> int | None:
        """:meth:`request_params`' ``max_tokens``: :attr:`max_tokens` (4096 by default)
        when neither the settings nor the options give one and ``left`` is more."""
        return self._cap({**self.request_options, **settings}, left)

    def request_params(self, request: InferRequest) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for ``request`` (``stream=True``)."""
        system, messages = map_messages(
            request.instructions,
            request.messages,
            origin=self.origin,
            foreign_reasoning=self.foreign_reasoning,
        )
        params: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens}
        if system:
            params["system"] = system
        params["messages"] = messages
        if request.tools:
            params["tools"] = map_tools(request.tools)
        settings = self.call_options(request.settings)
        # the turn's output budget left, when below the cap given (the API requires one)
        self._cap(settings, request.max_output_tokens)
        config = self.thinking_config(
            messages, settings.get("max_tokens", self.max_tokens), bool(request.tools)
        )
        thinking = config is not None
        if config is not None:
            params["thinking"] = config
        else:
            params["messages"] = without_loop_thinking(messages)
        adaptive = thinking and self.adaptive_thinking
        if request.output is not None:  # adaptive thinking takes a forced tool
            map_output(params, request.output, thinking=thinking and not adaptive)
        known = self._known_params(self._get_client().messages.create)
        extra_body: dict[str, Any] = {}
        for key, value in settings.items():
            if key in _RESERVED or (
                thinking and refused_with_thinking(key, value, adaptive=adaptive)
            ):
                continue
            if key == "extra_body":
                extra_body.update(value)
            elif key in known:
                params[key] = value
            else:
                extra_body[key] = value
        if extra_body:
            params["extra_body"] = extra_body
        if thinking and self.interleaved_thinking and not adaptive:
            params["extra_headers"] = with_beta(
                params.get("extra_headers"), INTERLEAVED_THINKING_BETA
            )
        params["stream"] = True
        return params

    def thinking_config(
        self, messages: Sequence[dict[str, Any]], max_tokens: Any, tools: bool
    ) -> dict[str, Any] | None:
        """The ``thinking`` of a call of these (mapped) ``messages`` whose ``max_tokens``
        is ``max_tokens``, with or without ``tools``; ``None``: thinking off.

        Adaptive (:attr:`adaptive_thinking`): ``{"type": "adaptive"}`` on every call,
        a tool loop's included, whatever its first step did (Claude itself may skip
        thinking on a step: the API cannot want a loop to start with thinking then).
        Else the budget (:func:`thinking_budget`), where :func:`thinking_allowed`."""
        if self.adaptive_thinking:
            return {"type": "adaptive"}
        budget = thinking_budget(
            self.thinking_budget, max_tokens, interleaved=self.interleaved_thinking and tools
        )
        if budget is None or not thinking_allowed(messages):
            return None
        return {"type": "enabled", "budget_tokens": budget}

    async def stream(self, request: InferRequest, emit: Emit) -> None:
        """One model call: restore, request, parse. Failures raise classified errors."""
        try:
            client = self._get_client()
            events = await created(client.messages.create, self.request_params(request))
            await self.observe_headers(getattr(events, "response", None))  # rate limits
            try:
                parsed = json_event_batches(events, texts=True)
                async with aclosing(parsed):
                    await parse_batches(
                        parsed,
                        emit,
                        answer_tool=OUTPUT_TOOL if request.output is not None else None,
                        coalesce=self.coalesce_deltas,
                        runs=request.text_runs,
                    )
            finally:
                # release the connection even when cancelled or failed mid-stream
                # (shielded from the start: not set on the entered scope, which made trio
                # work its cancel status out again)
                if _response_closed(events):
                    # The body was read to its end (the drain after ``message_stop``)
                    # and the HTTP response closed itself: the close waits for nothing,
                    # so it enters no bound (a cancel scope, ~58k instructions a turn;
                    # issue 24 goal 1).
                    await events.close()
                else:
                    with trio.move_on_after(2, shield=True):
                        await events.close()
        except Exception as exc:
            raise classify_error(exc) from exc

    def classify_error(self, exc: BaseException) -> errors.AxonError:
        return classify_error(exc)

    async def count_tokens(
        self, instructions: str | None, messages: Sequence[Message], tools: Sequence[Any]
    ) -> int | None:
        """The request's input tokens from the API's own count (``messages.count_tokens``,
        ``POST /v1/messages/count_tokens``: free, rate-limited apart from messages), for
        the same system prompt, messages, tools and thinking setting as a call sends."""
        system, mapped = map_messages(
            instructions, messages, origin=self.origin, foreign_reasoning=self.foreign_reasoning
        )
        params: dict[str, Any] = {"model": self.model, "messages": mapped}
        if system:
            params["system"] = system
        if tools:
            params["tools"] = map_tools(tools)
        config = self.thinking_config(mapped, self.max_tokens, bool(tools))
        if config is not None:
            params["thinking"] = config
            if self.interleaved_thinking and not self.adaptive_thinking:
                params["extra_headers"] = with_beta(None, INTERLEAVED_THINKING_BETA)
        else:
            params["messages"] = without_loop_thinking(mapped)
        try:
            counted = await self._get_client().messages.count_tokens(**params)
        except Exception as exc:
            raise classify_error(exc) from exc
        return int(counted.input_tokens)


# -- on other platforms -------------------------------------------------------------------


class AnthropicVertexProvider(VertexPlatform, AnthropicProvider):
    """Claude on Google Cloud Vertex AI through ``AsyncAnthropicVertex``: this provider
    with Vertex's client, credentials and endpoint
    (:class:`~actors.providers.anthropic_platforms.VertexPlatform`)."""


class AnthropicBedrockProvider(BedrockPlatform, AnthropicProvider):
    """Claude on Amazon Bedrock through ``AsyncAnthropicBedrock``: this provider with
    Bedrock's client, credentials, endpoint and event-stream errors
    (:class:`~actors.providers.anthropic_platforms.BedrockPlatform`)."""
