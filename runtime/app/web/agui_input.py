"""The AG-UI request side (protocol 1.0), for :mod:`runtime.app.web.agui`.

A ``RunAgentInput`` body checked into a :class:`RunInput` (:func:`parse_run_input`): its
client tools (:func:`client_tools`), its ``resume`` entries (:class:`ResumeAnswer`, read
into an approval decision by :func:`approval_answer` or a tool's output by
:func:`tool_answer`), and its AG-UI messages read into runtime messages
(:func:`user_input`, :func:`history_of`). Anything refused is an :class:`AGUIError`,
answered with an HTTP error status before any event streams (the HTTP binding's rule).
The response side, runtime messages and output chunks written as AG-UI events, is
:mod:`runtime.app.web.agui_wire`.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import orjson

from runtime import json_exact
from runtime.app.web.agui_wire import stored_call_id
from runtime.errors import InvalidDecision, InvalidMedia, ToolDefinitionError
from runtime.logging import get_logger
from runtime.messages import (
    AssistantMessage,
    File,
    Image,
    Message,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserContent,
    UserMessage,
)
from runtime.redact import redact
from runtime.serde import exact_loads
from runtime.tools import LISTING_UNITS, InvalidJSONSchema, Tool, ToolInputError

ROLES = frozenset({"developer", "system", "assistant", "user", "tool", "activity", "reasoning"})
RESUME_STATUSES = frozenset({"resolved", "cancelled"})
CANCELLED_REASON = "cancelled"
"""The denial reason of an approval the client's resume entry cancelled."""


# -- errors -------------------------------------------------------------------------------


class AGUIError(Exception):
    """Input refused before the run starts: an HTTP error status with no event stream
    (the HTTP binding's rule), the body ``{"error": message, "code": code}``."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers
        """Headers of the answer (a full body budget's ``retry-after``, ``connection``)."""

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code}


def bad_input(message: str, code: str = "invalid_input") -> AGUIError:
    return AGUIError(400, message, code)


# -- the request --------------------------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True)
class ResumeAnswer:
    """One ``resume`` entry: the answer to an interrupt of the run it continues."""

    interrupt_id: str
    status: str
    payload: Any = None


@attrs.frozen(kw_only=True, slots=True)
class RunInput:
    """A checked ``RunAgentInput``."""

    thread_id: str
    run_id: str
    messages: tuple[dict[str, Any], ...]
    """The client's conversation, each message's shape checked (reasoning and activity
    messages included; they are never read)."""
    tools: tuple[Tool, ...] = ()
    """The client's tools, as client-side tools (:meth:`runtime.tools.Tool.client`)."""
    instructions: str | None = None
    """``context``, as instructions added for the run."""
    resume: tuple[ResumeAnswer, ...] = ()
    forwarded_props: Any = None


def _str(value: Any, where: str, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not optional and not value):
        raise bad_input(f"'{where}' must be a {'' if optional else 'non-empty '}string")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_input(f"'{where}' must be a list")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_input(f"'{where}' must be an object")
    return value


def _check_parts(content: list[Any], where: str) -> None:
    for j, part in enumerate(content):
        part = _object(part, f"{where}[{j}]")
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise bad_input(f"'{where}[{j}].text' must be a string")
        elif kind in ("image", "audio", "video", "document"):
            source = _object(part.get("source"), f"{where}[{j}].source")
            if source.get("type") not in ("data", "url", "file"):
                raise bad_input(f"'{where}[{j}].source.type' must be data, url or file")
            _str(source.get("value"), f"{where}[{j}].source.value")
            _str(source.get("mimeType"), f"{where}[{j}].source.mimeType", optional=True)
        else:
            raise bad_input(f"'{where}[{j}].type' must be text, image, audio, video or document")


def _check_message(message: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    message = _object(message, where)
    _str(message.get("id"), f"{where}.id")
    role = message.get("role")
    if not isinstance(role, str) or role not in ROLES:  # {} in a set: TypeError
        raise bad_input(f"'{where}.role' must be one of {', '.join(sorted(ROLES))}")
    content = message.get("content")
    if role in ("developer", "system", "reasoning"):
        if not isinstance(content, str):
            raise bad_input(f"'{where}.content' must be a string")
    elif role in ("user", "tool"):
        if isinstance(content, list):
            _check_parts(content, f"{where}.content")
        elif not isinstance(content, str):
            raise bad_input(f"'{where}.content' must be a string or a list of content parts")
        if role == "tool":
            _str(message.get("toolCallId"), f"{where}.toolCallId")
            _str(message.get("error"), f"{where}.error", optional=True)
    elif role == "assistant":
        _str(content, f"{where}.content", optional=True)
        for j, call in enumerate(_list(message.get("toolCalls"), f"{where}.toolCalls")):
            call = _object(call, f"{where}.toolCalls[{j}]")
            _str(call.get("id"), f"{where}.toolCalls[{j}].id")
            function = _object(call.get("function"), f"{where}.toolCalls[{j}].function")
            _str(function.get("name"), f"{where}.toolCalls[{j}].function.name")
            _str(
                function.get("arguments"),
                f"{where}.toolCalls[{j}].function.arguments",
                optional=True,
            )
            if not isinstance(function.get("arguments"), str):
                raise bad_input(f"'{where}.toolCalls[{j}].function.arguments' must be a string")
    else:  # activity: an object content, never read
        _object(content, f"{where}.content")
    return message


MAX_CLIENT_TOOLS = 128
"""Client tools one run may declare (OpenAI's own cap on a request's functions)."""
MAX_TOOL_SCHEMAS = 256 << 10
"""Bytes the client tools' ``parameters`` schemas may take in all, as JSON."""


def _check_tool_sizes(specs: list[Any]) -> None:
    """413 for more than :data:`MAX_CLIENT_TOOLS` tools, or schemas over
    :data:`MAX_TOOL_SCHEMAS` bytes, before any is built: each schema is checked against
    the JSON Schema meta-schema, ~0.5 ms a tool and ~8 us a byte of a large one, so a
    256 KiB body of 14,000 tools held the event loop 5.6 s, and a 48 MiB one a thread
    (and the duplicate-name count, quadratic) for hours."""
    if len(specs) > MAX_CLIENT_TOOLS:
        raise AGUIError(
            413,
            f"'tools' has {len(specs)} tools; at most {MAX_CLIENT_TOOLS} are taken",
            "too_many_tools",
        )
    size = 0
    for spec in specs:
        schema = spec.get("parameters") if isinstance(spec, dict) else None
        try:
            size += len(json_exact.dumps(schema, marked=False))  # (a bound past 64 bits)
        except TypeError:  # nested past orjson's 255 levels
            raise bad_input("a tool's 'parameters' schema is nested too deeply") from None
        if size > MAX_TOOL_SCHEMAS:
            raise AGUIError(
                413,
                f"the tools' 'parameters' schemas take over {MAX_TOOL_SCHEMAS} bytes",
                "too_many_tools",
            )


WARNED_PATTERNS = 256
"""Unchecked patterns of client tools this process remembers having logged."""

WARNED_SHOWN = 4
"""Tools one ``agui.schema-not-checked-here`` line names (the rest are counted)."""

_warned: OrderedDict[int, None] = OrderedDict()
"""The hashes of the unchecked patterns logged (not the patterns: up to 256 KiB each)."""


def _warn_unchecked(tools: Sequence[Any]) -> None:
    """Log, in one line for the request, the patterns of its client tools not run on the
    model's input here (a look-around, a backreference, past the request's compile
    budget) that this process has not logged yet (of the last :data:`WARNED_PATTERNS`):
    a client declares its tools with every request, and a warning per request, or per
    tool name, would bury the log (one that named its tools anew each request had up
    to 128 lines a request). The line names :data:`WARNED_SHOWN` tools, counts the rest."""
    fresh: list[tuple[str, list[str]]] = []
    for tool in tools:
        new = []
        for said in tool.validator.axon_unchecked:
            key = hash(said)
            if key not in _warned:
                _warned[key] = None
                new.append(said)
        if new:
            fresh.append((tool.name, new))
    while len(_warned) > WARNED_PATTERNS:
        _warned.popitem(last=False)
    if not fresh:
        return
    shown = fresh[:WARNED_SHOWN]
    unchecked = [s for _, said in shown for s in said]
    names = [name for name, _ in shown]
    more = len(fresh) - len(shown)
    get_logger("axon.web").warning(
        "agui.schema-not-checked-here",
        tool=redact(names[0]),
        tools=[redact(n) for n in names],
        more_tools=more,
        unchecked=[redact(s) for s in unchecked],
        error=f"client tool {names[0]!r}"
        + (f" and {len(fresh) - 1} more" if len(fresh) > 1 else "")
        + ": not run on the model's input here (the client checks its own tool's input): "
        + "; ".join(unchecked),
    )


def client_tools(tools: Any) -> tuple[Tool, ...]:
    """The request's ``tools`` as client-side tools; a malformed one, a schema that is not
    an object's, or a name given twice is a 400; too many, or schemas too large, 413."""
    out: list[Tool] = []
    specs = _list(tools, "tools")
    _check_tool_sizes(specs)
    budget = [LISTING_UNITS]  # (the request's tools' patterns compile within one budget)
    for i, spec in enumerate(specs):
        where = f"tools[{i}]"
        spec = _object(spec, where)
        name = _str(spec.get("name"), f"{where}.name")
        description = _str(spec.get("description"), f"{where}.description", optional=True) or ""
        schema = spec.get("parameters")
        if schema is None or schema == {}:
            schema = {"type": "object", "properties": {}}
        if not isinstance(schema, dict):
            raise bad_input(f"'{where}.parameters' must be a JSON schema object")
        try:
            # (a client's patterns run in linear time, within the budget: runtime.tools)
            tool = Tool.client(name, schema, description, trusted=False, budget=budget)  # type: ignore[arg-type]
            out.append(tool)
        except (ToolDefinitionError, InvalidJSONSchema) as exc:
            raise bad_input(f"'{where}': {exc}") from None
    twice = sorted(name for name, n in Counter(t.name for t in out).items() if n > 1)
    if twice:
        raise bad_input(f"'tools' names {twice} more than once")
    _warn_unchecked(out)
    return tuple(out)


def _instructions(context: Any) -> str | None:
    lines = []
    for i, item in enumerate(_list(context, "context")):
        item = _object(item, f"context[{i}]")
        description = _str(item.get("description"), f"context[{i}].description", optional=True)
        value = _str(item.get("value"), f"context[{i}].value", optional=True)
        if description is None or value is None:
            raise bad_input(f"'context[{i}]' needs a 'description' and a 'value' (strings)")
        lines.append(f"- {description}: {value}")
    if not lines:
        return None
    return "Context from the application:\n" + "\n".join(lines)


def _resume(entries: Any) -> tuple[ResumeAnswer, ...]:
    out = []
    for i, entry in enumerate(_list(entries, "resume")):
        entry = _object(entry, f"resume[{i}]")
        interrupt_id = _str(entry.get("interruptId"), f"resume[{i}].interruptId")
        status = entry.get("status")
        if not isinstance(status, str) or status not in RESUME_STATUSES:
            raise bad_input(f"'resume[{i}].status' must be resolved or cancelled")
        assert interrupt_id is not None
        out.append(
            ResumeAnswer(interrupt_id=interrupt_id, status=status, payload=entry.get("payload"))
        )
    ids = [a.interrupt_id for a in out]
    if len(set(ids)) != len(ids):
        raise bad_input("'resume' answers an interrupt more than once")
    return tuple(out)


def parse_run_input(payload: Any) -> RunInput:
    """A ``POST /ag-ui`` body, checked; every fault an :class:`AGUIError` (400) naming
    the field. ``state`` is accepted and not read (this agent keeps no shared state)."""
    payload = _object(payload, "the body")
    thread_id = _str(payload.get("threadId"), "threadId")
    run_id = _str(payload.get("runId"), "runId")
    if "messages" not in payload:
        raise bad_input("'messages' is required (a list, possibly empty)")
    messages = tuple(
        _check_message(m, i) for i, m in enumerate(_list(payload["messages"], "messages"))
    )
    assert thread_id is not None and run_id is not None
    return RunInput(
        thread_id=thread_id,
        run_id=run_id,
        messages=messages,
        tools=client_tools(payload.get("tools")),
        instructions=_instructions(payload.get("context")),
        resume=_resume(payload.get("resume")),
        forwarded_props=payload.get("forwardedProps"),
    )


# -- AG-UI messages -> runtime messages ---------------------------------------------------


def _media(part: dict[str, Any]) -> Image | File | None:
    """An image or document part as the runtime's media (``None``: a part the runtime
    cannot take, an audio or video part or a provider's file handle, which is dropped as
    the spec says a producer does)."""
    source = part["source"]
    if part["type"] not in ("image", "document") or source["type"] == "file":
        return None
    mime = source.get("mimeType")
    url = (
        source["value"]
        if source["type"] == "url"
        else f"data:{mime or ''};base64,{source['value']}"
    )
    filename = (
        (part.get("metadata") or {}).get("filename")
        if isinstance(part.get("metadata"), dict)
        else None
    )
    if part["type"] == "image":
        return Image(url=url, media_type=mime)
    return File(url=url, media_type=mime, filename=filename if isinstance(filename, str) else None)


def user_input(content: str | list[dict[str, Any]], where: str) -> UserContent:
    """A user message's content as user input: text, or text, images and documents."""
    if isinstance(content, str):
        return content
    items: list[str | Image | File] = []
    for j, part in enumerate(content):
        if part["type"] == "text":
            items.append(part["text"])
            continue
        try:
            media = _media(part)
        except InvalidMedia as exc:
            raise bad_input(f"'{where}[{j}]': {exc}") from None
        if media is not None:
            items.append(media)
    if all(isinstance(i, str) for i in items):
        return "".join(i for i in items if isinstance(i, str))
    return tuple(
        TextPart(text=i, step=0) if isinstance(i, str) else i
        for i in items
        if not (isinstance(i, str) and not i)
    )


def _text_of(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if p["type"] == "text")


def _arguments(text: str | None) -> Any:
    try:
        return exact_loads(text or "{}")  # (an integer past 64 bits exactly)
    except orjson.JSONDecodeError:
        return text


def _passed_up(call_id: str, calls: dict[str, str]) -> bool:
    """Whether ``call_id`` is a sub-agent's call passed up through one of ``calls`` (the
    calls before it in its message): the runtime names it ``<agent tool's call
    id>.<sub call id>`` (:func:`runtime.agent.sub_wait_id`, each agent between adding
    its own part) and lists it after that call (:mod:`runtime.app.web.agui_wire`'s
    snapshot). A dotted id under no call of its message (a client's ``call.1``) is a
    call of its own."""
    dot = call_id.find(".")
    while dot > 0:
        if call_id[:dot] in calls:
            return True
        dot = call_id.find(".", dot + 1)
    return False


def history_of(messages: Iterable[dict[str, Any]]) -> tuple[Message, ...]:
    """Checked AG-UI messages as a runtime history (the start of a new thread): system and
    developer messages as system messages, assistant text and tool calls, tool results;
    reasoning and activity messages are left out.

    A tool message answers a call, not answered yet, of the assistant message before the
    tool messages (reasoning and activity messages aside), and the calls of a message
    have distinct ids. Why: the history's repair drops a result that does not follow its
    call and a call's second one, and two calls of one id in a message are one call to
    it, so such a history's tool output was lost without a word and the provider's
    request broke (two ``tool_use`` blocks of one id).

    A sub-agent's call passed up (:func:`_passed_up`: a call under another call of the
    same message, ``H.L0`` under ``H``) and its tool message are left out: a
    ``MESSAGES_SNAPSHOT`` lists them for the client to answer, but the top agent's model
    never made that call (it called the agent tool ``H``, whose result follows). Kept,
    they were replayed to it as its own calls of a tool it does not have (a provider
    may refuse an unknown tool in the history, and the model is misled).

    A call's id as a snapshot gives it (its wire id, ``<message id>.s<step>.<call id>``:
    :func:`~runtime.app.web.agui_wire.wire_call_id`) is read back to the call id the
    model made (``call_0``), and a tool message may name it either way: the new
    thread's provider is sent the calls as its model made them (a wire id is not a
    valid call id to every provider: Anthropic's allow no dot). Two calls of a message
    that would read back to one id keep the ids they were sent with."""
    names: dict[str, str] = {}  # the calls of the last assistant message not answered yet
    sub_calls: set[str] = set()  # those of them passed up from a sub-agent: left out
    ids: dict[str, str] = {}  # the calls of that message: as sent -> as stored
    out: list[Message] = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role in ("system", "developer", "user", "assistant"):
            names.clear()
            sub_calls.clear()
            ids.clear()
        if role in ("system", "developer"):
            out.append(SystemMessage(content=m["content"]))
        elif role == "user":
            out.append(UserMessage(content=user_input(m["content"], f"messages[{i}].content")))
        elif role == "assistant":
            parts: list[Any] = [TextPart(text=m["content"], step=0)] if m.get("content") else []
            calls = m.get("toolCalls") or ()
            given = [c["id"] for c in calls]
            stored = [stored_call_id(m["id"], c) for c in given]
            if len(set(stored)) < len(set(given)):  # (two would be one: kept as sent)
                stored = given
            for j, call in enumerate(calls):
                function = call["function"]
                call_id = stored[j]
                if call_id in names:
                    raise bad_input(
                        f"'messages[{i}].toolCalls[{j}].id' repeats the id of another call "
                        "of the message"
                    )
                ids[call["id"]] = ids[call_id] = call_id
                if _passed_up(call_id, names):
                    sub_calls.add(call_id)
                names[call_id] = function["name"]
                if call_id in sub_calls:
                    continue
                parts.append(
                    ToolCallPart(
                        tool_call_id=call_id,
                        tool_name=function["name"],
                        input=_arguments(function["arguments"]),
                        step=0,
                    )
                )
            out.append(AssistantMessage(content=tuple(parts)))
        elif role == "tool":
            call_id = ids.get(m["toolCallId"], m["toolCallId"])
            if call_id in sub_calls and call_id in names:
                del names[call_id]  # answered (a second answer is refused, as any call's)
                continue
            if call_id not in names:
                raise bad_input(
                    f"'messages[{i}].toolCallId' names no tool call, not answered yet, of the "
                    "assistant message before the tool messages"
                )
            out.append(
                ToolMessage(
                    tool_call_id=call_id,
                    tool_name=names.pop(call_id),
                    step=0,
                    output=None if m.get("error") is not None else _text_of(m["content"]),
                    error=m.get("error"),
                )
            )
    return tuple(out)


def tool_answer(
    message: dict[str, Any], check: Callable[[Any], None] | None = None, *, call: str = ""
) -> tuple[Any, str | None]:
    """A tool message answering a client tool ``call``: ``(output, error)``; ``error``
    is set for a failure (the output is then the text, unread). The output is the
    message's text (a client tool's answer travels as text, as the spec says of
    structured results), read by the tool's output check ``check``
    (:func:`runtime.approval.output_check`) as :func:`structured_output` says."""
    text = _text_of(message["content"])
    error = message.get("error")
    if error is not None or check is None:
        return text, error
    return structured_output(text, check, call), None


def structured_output(text: str, check: Callable[[Any], None], call: str) -> Any:
    """A tool message's ``text`` as the output of a client tool whose output schema
    ``check`` (:func:`runtime.approval.output_check`) applies: the text itself when the
    schema takes it (a string schema, or none, takes JSON-looking text as it is: a
    string stays a string), else the JSON the text holds when the schema takes that (an
    object, an array, a number, a boolean, null: an AG-UI tool message's ``content`` is
    a string, so such an output cannot travel otherwise). Neither is
    :class:`~runtime.errors.InvalidDecision` (a 400), saying why: the text is not JSON,
    or the JSON's problems against the schema. Why: a tool whose schema wants an object
    could not be answered over AG-UI at all (the text was checked as a string)."""
    try:
        check(text)
        return text
    except ToolInputError as as_text:
        refused = as_text
    where = f"call {call!r}: " if call else ""
    try:
        value = exact_loads(text)  # (an integer past 64 bits exactly)
    except orjson.JSONDecodeError as exc:
        raise InvalidDecision(
            f"{where}{refused}; the tool message's content is text, and the tool's output "
            f"schema wants JSON: send the output as JSON text (the content is not JSON: {exc})"
        ) from None
    try:
        check(value)
    except ToolInputError as exc:
        raise InvalidDecision(f"{where}{exc} (the tool message's content, read as JSON)") from None
    return value


def approval_answer(answer: ResumeAnswer) -> tuple[bool, str | None, dict[str, Any] | None]:
    """A resume entry for an approval as ``(approved, reason, edited input)``: a
    cancelled entry is a denial (reason ``cancelled``); a resolved one's payload must
    match :data:`APPROVAL_SCHEMA` (``{"approved": bool, "reason"?: str, "editedArgs"?:
    object}``). ``editedArgs`` is checked here for its shape only: whether it goes with
    the answer (``approved: true``) and fits the tool's schema is the decision's check
    (:class:`~runtime.errors.InvalidDecision`, a 400 too)."""
    if answer.status == "cancelled":
        return False, CANCELLED_REASON, None
    payload = answer.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
        raise bad_input(
            f"resume entry {answer.interrupt_id!r}: the payload must be "
            '{"approved": true|false, "reason"?: string, "editedArgs"?: object}',
            "invalid_resume_payload",
        )
    edited = payload.get("editedArgs")
    if "editedArgs" in payload and not isinstance(edited, dict):
        raise bad_input(
            f"resume entry {answer.interrupt_id!r}: 'editedArgs' must be an object (the "
            "tool's arguments)",
            "invalid_resume_payload",
        )
    reason = payload.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise bad_input(f"resume entry {answer.interrupt_id!r}: 'reason' must be a string")
    return payload["approved"], reason, edited


__all__ = [
    "CANCELLED_REASON",
    "MAX_CLIENT_TOOLS",
    "MAX_TOOL_SCHEMAS",
    "AGUIError",
    "ResumeAnswer",
    "RunInput",
    "approval_answer",
    "bad_input",
    "client_tools",
    "history_of",
    "parse_run_input",
    "structured_output",
    "tool_answer",
    "user_input",
]
