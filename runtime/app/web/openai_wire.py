"""The OpenAI Chat Completions wire format, for :mod:`runtime.app.web.openai_compat`.

A request body checked into a :class:`ChatRequest` (:func:`parse_chat_request`), the
turn's output chunks mapped to ``chat.completion.chunk`` s and gathered into one
``chat.completion`` (:class:`CompletionEncoder`), and errors in OpenAI's shape
(:class:`OpenAIError`). No web framework here: what maps what is testable alone.
"""

from __future__ import annotations

import time
from typing import Any

import attrs
import orjson

from runtime import output as o
from runtime.chunks import Usage
from runtime.errors import InvalidMedia
from runtime.ids import new_id
from runtime.media import user_content
from runtime.messages import (
    AssistantMessage,
    Image,
    Message,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserContent,
    UserMessage,
)
from runtime.serde import exact_loads, utf8_dumps

FINISH_REASONS = {"stop": "stop", "length": "length", "content-filter": "content_filter"}
"""The runtime's finish reasons OpenAI has a word for; ``budget`` is ``length``, the
rest ``stop``."""

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


# -- errors -------------------------------------------------------------------------------


class OpenAIError(Exception):
    """A request answered with OpenAI's error shape and ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})
        """Headers of the answer (a queue's 429 carries ``retry-after``)."""
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def _turn_error(chunk: o.Error | o.Abort) -> OpenAIError:
    """The error a failed or cut-off turn is answered with."""
    if isinstance(chunk, o.Error):
        return OpenAIError(
            500,
            f"{chunk.error.kind}: {chunk.error.message}",
            type="server_error",
            code=chunk.error.kind,
        )
    return OpenAIError(
        503, f"the turn was cut off: {chunk.reason}", type="server_error", code="aborted"
    )


# -- the request --------------------------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True)
class ChatRequest:
    """A checked ``POST /v1/chat/completions`` body."""

    model: str
    input: UserContent
    """The last message: the user's new input."""
    history: tuple[Message, ...]
    """Every message before it (used only when the request is stateless)."""
    stream: bool = False
    include_usage: bool = False


def _text(content: Any, param: str, *, allowed: frozenset[str] = frozenset({"text"})) -> str:
    """A message's ``content`` that must be text: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{param}' must be a string or a list of content parts", param)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in allowed:  # {} in a set: TypeError
            raise bad_request(f"'{param}[{j}]' must be a text part", f"{param}[{j}]")
        value = part.get("text", part.get("refusal"))
        if not isinstance(value, str):
            raise bad_request(f"'{param}[{j}]' has no text", f"{param}[{j}]")
        texts.append(value)
    return "".join(texts)


def _user_content(content: Any, param: str) -> UserContent:
    """A user message's ``content``: text, or text and ``image_url`` parts (a ``data:``
    or ``http(s):`` URL, never fetched here)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise bad_request(f"'{param}' must be a string or a non-empty list of content parts", param)
    items: list[str | Image] = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            items.append(part["text"])
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise bad_request(f"'{where}.image_url.url' must be a URL", f"{where}.image_url")
            try:
                items.append(Image(url=url))
            except InvalidMedia as exc:
                raise bad_request(f"'{where}': {exc}", where) from None
        else:
            raise bad_request(
                f"'{where}': unsupported content part {kind!r} (text, image_url)", where
            )
    if all(isinstance(i, str) for i in items):
        return "".join(i for i in items if isinstance(i, str))
    return user_content(items)


def _tool_calls(calls: Any, param: str, names: dict[str, str]) -> list[ToolCallPart]:
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise bad_request(f"'{param}' must be a list", param)
    parts = []
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        call_id = call.get("id") if isinstance(call, dict) else None
        if not isinstance(call_id, str) or not isinstance(function, dict):
            raise bad_request(f"'{where}' needs an 'id' and a 'function'", where)
        name, arguments = function.get("name"), function.get("arguments", "{}")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise bad_request(
                f"'{where}.function' needs a 'name' and 'arguments' (a JSON string)", where
            )
        try:
            value = exact_loads(arguments or "{}")  # (an integer past 64 bits exactly)
        except orjson.JSONDecodeError:
            raise bad_request(f"'{where}.function.arguments' is not JSON", where) from None
        if call_id in names:
            raise bad_request(f"'{where}.id' repeats the id of another call of the message", where)
        names[call_id] = name
        parts.append(ToolCallPart(tool_call_id=call_id, tool_name=name, input=value, step=0))
    return parts


def _message(message: Any, i: int, names: dict[str, str]) -> Message:
    """One entry of ``messages`` as a runtime message. ``names``: the calls of the
    assistant message before it not answered yet (id -> name); a ``tool`` message must
    answer one of them, as the API itself has it. Why: the history's repair drops a
    result that does not follow its call and a call's second one, and two calls of one
    id in a message are one call to it, so such a history's tool output was lost
    without a word and the provider's request broke (two ``tool_calls`` of one id)."""
    param = f"messages[{i}]"
    role = message.get("role") if isinstance(message, dict) else None
    if not isinstance(role, str) or role not in ROLES:  # {} in a set: TypeError
        raise bad_request(
            f"'{param}.role' must be one of {', '.join(sorted(ROLES))}", f"{param}.role"
        )
    assert isinstance(message, dict)
    content = message.get("content")
    where = f"{param}.content"
    if role != "tool":
        names.clear()
    if role in ("system", "developer"):
        return SystemMessage(content=_text(content, where))
    if role == "user":
        return UserMessage(content=_user_content(content, where))
    if role == "assistant":
        text = (
            "" if content is None else _text(content, where, allowed=frozenset({"text", "refusal"}))
        )
        parts: list[Any] = [TextPart(text=text, step=0)] if text else []
        parts += _tool_calls(message.get("tool_calls"), f"{param}.tool_calls", names)
        return AssistantMessage(content=tuple(parts))
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or call_id not in names:
        raise bad_request(
            f"'{param}.tool_call_id' must name a tool call, not answered yet, of the "
            "assistant message before the tool messages",
            f"{param}.tool_call_id",
        )
    return ToolMessage(
        tool_call_id=call_id, tool_name=names.pop(call_id), step=0, output=_text(content, where)
    )


def parse_chat_request(payload: Any) -> ChatRequest:
    """A ``POST /v1/chat/completions`` body, checked; every fault an :class:`OpenAIError`
    (400) naming the parameter."""
    if not isinstance(payload, dict):
        raise bad_request("the body must be a JSON object")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required (GET /v1/models lists it)", "model")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    if payload.get("tools"):
        raise bad_request(
            "'tools' is not supported: the agent runs its own tools server-side", "tools"
        )
    if payload.get("functions"):
        raise bad_request(
            "'functions' is not supported: the agent runs its own tools server-side", "functions"
        )
    for choice in ("tool_choice", "function_call"):
        # a call the client asks for could never come: no tool call is sent to it
        if payload.get(choice) not in (None, "auto", "none"):
            raise bad_request(
                f"'{choice}' may only be 'auto' or 'none': the agent runs its own tools "
                "server-side and sends the client no tool calls",
                choice,
            )
    n = payload.get("n", 1)
    if n not in (1, None):
        raise bad_request("'n' must be 1: an agent gives one answer per turn", "n")
    stream = payload.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", "stream")
    options = payload.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", "stream_options")
    names: dict[str, str] = {}
    converted = [_message(m, i, names) for i, m in enumerate(messages)]
    last = converted[-1]
    if not isinstance(last, UserMessage):
        raise bad_request("the last message must be the user's (the turn's input)", "messages")
    if isinstance(last.content, str) and not last.content.strip():
        raise bad_request("the last user message has no text", f"messages[{len(messages) - 1}]")
    return ChatRequest(
        model=model,
        input=last.content,
        history=tuple(converted[:-1]),
        stream=stream,
        include_usage=bool(options.get("include_usage")),
    )


# -- the mapping --------------------------------------------------------------------------


def usage_object(usage: Usage) -> dict[str, Any]:
    """The runtime's summed usage in OpenAI's ``usage`` shape."""
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read or 0},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
    }


def finish_reason(reason: str) -> str:
    """The runtime's finish reason as OpenAI's (see :data:`FINISH_REASONS`)."""
    return "length" if reason == "budget" else FINISH_REASONS.get(reason, "stop")


class CompletionEncoder:
    """Maps one turn's output chunks to ``chat.completion.chunk`` s (``events``, for a
    stream) while gathering what the whole ``chat.completion`` says (``completion``).

    A ``reset-step`` (the step's model call failed mid-stream and the step starts over
    on a fallback provider) drops the step's text and reasoning from the completion.
    A stream cannot take back what it sent: if the step had streamed any, the stream
    ends there with an error event (``code`` ``step_reset``) and sends nothing more;
    the turn goes on and is stored whole, even if the client leaves then (``cut``: the
    app does not cancel a turn whose stream was ended this way). A step that had
    streamed nothing the client sees (tool input only) streams on unharmed."""

    def __init__(self, model: str, *, include_usage: bool = False) -> None:
        self.model = model
        self.include_usage = include_usage
        self.id = "chatcmpl-" + new_id("turn")
        self.created = int(time.time())
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.usage = Usage()
        self.finish_reason: str | None = None
        self.error: OpenAIError | None = None
        self.cut = False
        """A reset step had streamed content: the stream ended with an error event."""
        self._marks = (0, 0)
        """Where the current step's content and reasoning start."""

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def chunks(self, chunk: Any) -> list[dict[str, Any]]:
        """The Chat Completions chunks (or error events) ``chunk`` maps to."""
        out = self._chunks(chunk)
        return [] if self.cut and not isinstance(chunk, o.ResetStep) else out

    def _reset(self, chunk: o.ResetStep) -> list[dict[str, Any]]:
        content, reasoning = self._marks
        shown = len(self.content) > content or len(self.reasoning) > reasoning
        del self.content[content:], self.reasoning[reasoning:]
        if not shown or self.cut:
            return []
        self.cut = True
        why = OpenAIError(
            500,
            f"the answer was restarted on another provider ({chunk.provider}) after "
            f"{chunk.error.kind}; a chat.completions stream cannot retract the text it sent",
            type="server_error",
            code="step_reset",
        )
        return [why.body()]

    def _chunks(self, chunk: Any) -> list[dict[str, Any]]:
        if isinstance(chunk, o.StepStart):
            self._marks = (len(self.content), len(self.reasoning))
            return []
        if isinstance(chunk, o.ResetStep):
            return self._reset(chunk)
        if isinstance(chunk, o.Start):
            if chunk.turn_id:
                self.id = "chatcmpl-" + chunk.turn_id
            return [self._chunk({"role": "assistant", "content": ""})]
        if isinstance(chunk, o.TextDelta):
            self.content.append(chunk.text)
            return [self._chunk({"content": chunk.text})]
        if isinstance(chunk, o.ReasoningDelta):
            self.reasoning.append(chunk.text)
            return [self._chunk({"reasoning_content": chunk.text})]
        if isinstance(chunk, o.Finish):
            self.usage = chunk.usage
            self.finish_reason = finish_reason(chunk.finish_reason)
            out = [self._chunk({}, self.finish_reason)]
            if self.include_usage:
                last = self._chunk({})
                last["choices"] = []
                last["usage"] = usage_object(self.usage)
                out.append(last)
            return out
        if isinstance(chunk, o.Error | o.Abort):
            self.error = _turn_error(chunk)
            return [self.error.body()]
        return []  # tool calls, results and steps stay inside the agent

    def events(self, chunk: Any) -> bytes:
        """``chunk`` as SSE events (``data: {json}``), for :class:`TurnResponse`."""
        return b"".join(b"data: " + utf8_dumps(c) + b"\n\n" for c in self.chunks(chunk))

    def completion(self) -> dict[str, Any]:
        """The whole ``chat.completion`` of the turn gathered so far."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content),
            "refusal": None,
        }
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason or "stop",
                }
            ],
            "usage": usage_object(self.usage),
        }


__all__ = [
    "ChatRequest",
    "CompletionEncoder",
    "OpenAIError",
    "bad_request",
    "finish_reason",
    "parse_chat_request",
    "usage_object",
]
