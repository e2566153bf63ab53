"""The AG-UI wire format (protocol 1.0), for :mod:`runtime.app.web.agui`.

The response side: runtime messages written as AG-UI messages (:func:`agui_messages`, the
``MESSAGES_SNAPSHOT`` of a stored history) and one turn's output chunks mapped to AG-UI
events (:class:`RunEncoder`). The request side (the ``RunAgentInput`` body, AG-UI
messages read into runtime messages) is :mod:`runtime.app.web.agui_input`. No web framework
here, and no dependency on the ``ag-ui-protocol`` package: the tests validate every
event this module makes against that package's models.

The mapping of a turn (``runId`` is the run the client asked for, ``threadId`` the
session):

* ``start`` -> ``RUN_STARTED`` (``protocolVersion`` 1.0), then the ``prelude`` events;
* ``step-start`` / ``step-finish`` -> ``STEP_STARTED`` / ``STEP_FINISHED``
  (``stepName``: ``step-<n>``);
* ``text-start/delta/finish`` -> ``TEXT_MESSAGE_START/CONTENT/END``; every text part of a
  turn streams into its one assistant message (``messageId``: the runtime's message id),
  which a text part of a later step reopens;
* ``reasoning-start/delta/finish`` -> ``REASONING_START``, ``REASONING_MESSAGE_START``,
  ``_CONTENT``, ``_END``, ``REASONING_END`` (one span per reasoning part; span and
  message share the id ``<message id>.r<k>``, the k-th reasoning part of the message);
  a signed or encrypted part's opaque value follows as ``REASONING_ENCRYPTED_VALUE``
  (``subtype: message``) before the run ends;
* ``tool-input-start/delta`` and ``tool-call`` -> ``TOOL_CALL_START`` (``parentMessageId``:
  the assistant message), ``TOOL_CALL_ARGS``, ``TOOL_CALL_END``; every ``toolCallId`` (of
  these, of results, snapshots, interrupts, ``pendingToolCallIds``) is the call's wire id
  ``<message id>.s<step>.<call id>`` (:func:`wire_call_id`), unique in the thread;
* ``tool-result`` / ``tool-error`` / ``tool-output-denied`` -> ``TOOL_CALL_RESULT``
  (``messageId``: ``<message id>.s<step>.<call id>.result``, :func:`result_message_id`;
  an error or a denial as its text, flagged in ``metadata.axon``);
* ``tool-approval-request`` -> an ``Interrupt`` (``reason: tool_call``) of the run's
  interrupt outcome;
* ``tool-stream`` and ``object-delta`` -> ``CUSTOM`` (``axon.tool-stream``,
  ``axon.object``);
* ``throttled`` (the step's model call waits for a rate limit) and ``budget-wait`` (it
  waits for output tokens the calls beside it hold) -> ``CUSTOM`` ``axon.throttled``
  (``value``: ``step``, ``wait``, ``reason``) and ``axon.budget-wait`` (``step``,
  ``want``, ``available``, ``held``, ``ahead``): notices, as the AI SDK stream's
  transient ``data-throttled`` / ``data-budget-wait``; AG-UI has no event of its own for
  a wait (a sub-agent's come nested in its ``axon.tool-stream``, as its other chunks);
* ``reset-step`` (the step's model call failed mid-stream and the step starts over on a
  fallback provider) -> what the failed call left open is closed, then ``CUSTOM``
  ``axon.reset-step`` (``value``: ``messageId``, ``step``, ``provider``, ``errorText``);
  AG-UI has no event that retracts streamed content, so the run ends with a
  ``MESSAGES_SNAPSHOT`` of the saved history before ``RUN_FINISHED``: a client that
  ignores the custom event still ends with the stored message (without the void text);
* ``finish`` -> ``RUN_FINISHED`` once the turn is saved: the success outcome (with
  ``pendingToolCallIds`` for client tool calls left unanswered), the interrupt outcome
  (after a ``MESSAGES_SNAPSHOT``) when an approval waits, the cancelled outcome for a
  turn a budget cut; ``usage`` the turn's, ``result`` a structured answer;
* ``error`` -> ``RUN_ERROR`` (``code``: the error kind); ``abort`` -> ``RUN_FINISHED``
  with the cancelled outcome, after closing what was open (a run stopped before its
  turn started, waiting in the session's queue: ``RUN_STARTED`` first).
"""

from __future__ import annotations

import base64
import datetime
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from runtime import output as o
from runtime.approval import APPROVAL, AWAITING_INPUT, CLIENT, PendingCall
from runtime.chunks import Usage
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    File,
    Image,
    Message,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
    is_media_output,
)
from runtime.serde import dumps, loads, unstructure, utf8_dumps

PROTOCOL_VERSION = "1.0"
"""The AG-UI protocol version these events follow (``RUN_STARTED.protocolVersion``)."""


APPROVAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "reason": {"type": "string", "description": "Why, shown to the model with a denial."},
        "editedArgs": {
            "type": "object",
            "description": "With approved: true, run the tool with these arguments instead "
            "of the model's (checked against the tool's input schema).",
        },
    },
    "required": ["approved"],
}
"""The ``responseSchema`` of an approval's interrupt: its resume ``payload``
(``editedArgs``: approve with edits, docs/approval.md)."""


# -- runtime messages -> AG-UI messages ---------------------------------------------------


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value, default=str, marked=False).decode()


def content_parts(parts: Iterable[Any]) -> list[dict[str, Any]]:
    """User content or a media tool output as AG-UI content parts."""
    out: list[dict[str, Any]] = []
    for p in parts:
        if isinstance(p, TextPart):
            out.append({"type": "text", "text": p.text})
        elif isinstance(p, Image | File):
            if p.data is not None:
                source = {
                    "type": "data",
                    "value": base64.b64encode(p.data).decode("ascii"),
                    "mimeType": p.media_type,
                }
            else:
                source = {"type": "url", "value": p.url, "mimeType": p.media_type}
            part: dict[str, Any] = {
                "type": "image" if isinstance(p, Image) else "document",
                "source": source,
            }
            if isinstance(p, File) and p.filename:
                part["metadata"] = {"filename": p.filename}
            out.append(part)
        elif isinstance(p, str):
            out.append({"type": "text", "text": p})
    return out


def result_content(output: Any) -> str | list[dict[str, Any]]:
    """A tool's output as a ``TOOL_CALL_RESULT``'s content: text (structured data as
    JSON), or content parts for media."""
    if is_media_output(output):
        return content_parts(output)
    return _json_text(output)


def wire_call_id(message_id: str, step: int, tool_call_id: str) -> str:
    """The id a stored call goes by on the wire (``toolCallId`` of every event and
    message, ``pendingToolCallIds``, an interrupt's ``toolCallId``):
    ``<assistant message id>.s<step>.<call id>``, the same live and in every snapshot,
    the message id written with its ``%`` and ``.`` escaped (:func:`_wire_message_id`).

    Why not the call id: it is unique in a turn at best (a provider numbering each
    response's calls ``call_0``, ``call_1``, ... repeats them in every turn), and
    ``@ag-ui/client`` keys tool calls by id across all a thread's messages: a second
    turn's ``call_0`` renamed the first turn's call (its arguments appended to the old
    ones) and its own assistant message was never made. A client's answer naming it is
    mapped back to the stored call (:func:`thread_calls`); the call id alone is still
    taken for a call of the turn that waits (a client holding an older snapshot).

    Why the escape: message ids may hold dots (``msg_<runId>``, the client's run id) and
    so may call ids (a thread's seeded calls keep the client's ids; a sub-agent's passed-up
    call is ``<call id>.<sub call id>``), and spelled plainly two calls had one wire id:
    ``S.s0.p.s0.call_0`` is call ``p.s0.call_0`` of message ``S`` and call ``call_0`` of
    message ``S.s0.p``, a run id a client can choose. With no dot in its message part a
    wire id reads back to one call only (:func:`split_wire_id`); an id without ``.`` or
    ``%`` (every id the runtime makes) is written as it is."""
    return f"{_wire_message_id(message_id)}.s{step}.{tool_call_id}"


def _wire_message_id(message_id: str) -> str:
    """``message_id`` as a wire id's first part: ``%`` written ``%25`` and ``.`` ``%2E``,
    so the part holds no dot and two message ids stay two."""
    if "." not in message_id and "%" not in message_id:
        return message_id
    return message_id.replace("%", "%25").replace(".", "%2E")


_ESCAPED = re.compile("%(25|2E)")


def _unescaped(match: re.Match[str]) -> str:
    return "%" if match.group(1) == "25" else "."


def split_wire_id(wire_id: str) -> tuple[str, int, str] | None:
    """The ``(message id, step, call id)`` a wire id (:func:`wire_call_id`) stands for, or
    ``None`` when ``wire_id`` is not one."""
    head, dot, rest = wire_id.partition(".")
    step, dot2, call_id = rest.partition(".")
    if not (dot and dot2 and step[:1] == "s" and step[1:].isdigit() and step[1:].isascii()):
        return None
    if str(int(step[1:])) != step[1:]:  # (a step is written with no leading zero)
        return None
    message_id = _ESCAPED.sub(_unescaped, head) if "%" in head else head
    if _wire_message_id(message_id) != head:  # (not as wire_call_id escapes it)
        return None
    return message_id, int(step[1:]), call_id


def stored_call_id(message_id: str, wire_id: str) -> str:
    """The call id a tool call of assistant message ``message_id`` sent by a client
    stands for: ``wire_id`` with :func:`wire_call_id`'s ``<message id>.s<step>.`` taken
    off, or ``wire_id`` itself (a call id of an older snapshot, or a client's own)."""
    if not message_id:
        return wire_id
    head = f"{_wire_message_id(message_id)}.s"
    if not wire_id.startswith(head):
        head = f"{message_id}.s"  # (the message part as written before it was escaped)
        if not wire_id.startswith(head):
            return wire_id
    step, dot, rest = wire_id[len(head) :].partition(".")
    return rest if dot and rest and step.isdigit() else wire_id


def legacy_wire_ids(messages: Sequence[Message]) -> dict[str, str]:
    """The wire ids the calls of ``messages`` went by before a wire id's message part
    was escaped (``<message id>.s<step>.<call id>`` spelled plainly), each to the call's
    wire id now (:func:`wire_call_id`): only for a message id holding ``.`` or ``%``
    (the rest are spelled alike), and only an old id that names one call. Why: a
    client that stored such an id (a worker front end's message ``msg_<runId>`` of a
    dotted run id) and sends it back (the answer to a call asked before the upgrade)
    was told 404. Left out: an old id that is another call's wire id now (that call's
    reading stands: the old spelling was the collision the escape ended), or two
    calls' old id (which one was meant cannot be told: still a 404)."""
    current: set[str] = set()
    old: dict[str, str | None] = {}
    for m in messages:
        if not isinstance(m, AssistantMessage):
            continue
        plain = "." not in m.id and "%" not in m.id
        for p in m.content:
            if not isinstance(p, ToolCallPart):
                continue
            ids = [p.tool_call_id]
            if p.awaiting is not None:
                ids += [sub.id for sub in _subs(p.awaiting)]
            for call_id in ids:
                wire = wire_call_id(m.id, p.step, call_id)
                current.add(wire)
                if not plain:
                    spelled = f"{m.id}.s{p.step}.{call_id}"
                    old[spelled] = None if spelled in old else wire
    return {k: v for k, v in old.items() if v is not None and k not in current}


def pending_wire_id(call: PendingCall) -> str:
    """The wire id of a call the turn waits for: a sub-agent's client call passed up goes
    by its own id (``<agent tool's call id>.<sub call id>``) under the agent tool's
    message and step."""
    raw = call.approval_id if call.sub_tool else call.tool_call_id
    return wire_call_id(call.message_id, call.step, raw)


_DERIVED = re.compile(r"\.(?:r[0-9]+|result)\Z")
"""The ends of the ids a snapshot derives from another's: a reasoning message's
(:func:`reasoning_id`) and a tool result's (:func:`result_message_id`)."""


def snapshot_id(message_id: str) -> str:
    """The id a stored user, system or tool message goes by in a snapshot: its own,
    unless it ends as an id the snapshot derives from another's does (``.r<k>``,
    ``.result``) or holds a ``%``; then with its ``%`` and ``.`` escaped (``%25``,
    ``%2E``), as a wire id's message part is.

    Why: a user message's id is the client's (any 1-128 of letters, digits, ``_.:-``),
    and one named ``<assistant id>.r0`` or ``<wire id>.result`` was the id of that
    assistant's reasoning message or that call's result in the same snapshot, which a
    client keying messages by id (``@ag-ui/client``) merged. Every derived id has a dot
    and no escaped id has one, and no kept id has a ``%``, so the snapshot's ids are
    distinct whatever a client named its messages. Escaped rather than refused or
    replaced: the stored id stays the client's, which a stop, a resend's check and the
    other protocols name the message by; a client keeps working, holding the escaped id
    from its next snapshot on (:func:`stored_message_id` reads it back). Ids the
    runtime makes (``msg_<hex>_<n>``) and clients' UUIDs are written as they are."""
    if "%" not in message_id and _DERIVED.search(message_id) is None:
        return message_id
    return _wire_message_id(message_id)


def stored_message_id(sent: str) -> str:
    """The stored id of the message a client names ``sent``: :func:`snapshot_id`'s
    escape undone when ``sent`` is one, else ``sent``."""
    if "%" not in sent:
        return sent
    stored = _ESCAPED.sub(_unescaped, sent)
    return stored if snapshot_id(stored) == sent else sent


def looks_derived(message_id: str) -> bool:
    """Whether ``message_id`` ends as an id a snapshot derives from another's does (an
    assistant message must not: it is written as it is, live and in snapshots)."""
    return _DERIVED.search(message_id) is not None


def result_message_id(message_id: str, step: int, tool_call_id: str) -> str:
    """The id of the tool message a call's result mints: the same in the stream and in
    every snapshot, so a snapshot updates what the stream built and a reconnecting
    client keeps one message per result.

    A call is its assistant message's (``message_id``) id *and* step: a call id alone is
    unique in a turn at best (a provider numbering each response's calls ``call_0``,
    ``call_1``, ... repeats them in every turn and every step), and two results under
    one ``<call id>.result`` were one message to a client keying messages by id
    (``@ag-ui/client`` and the apps on it merged or dropped one)."""
    return f"{wire_call_id(message_id, step, tool_call_id)}.result"


def reasoning_id(message_id: str, index: int) -> str:
    """The id of the ``index``-th reasoning part of assistant message ``message_id``."""
    return f"{message_id}.r{index}"


def _encrypted(part: ReasoningPart) -> str | None:
    return part.signature or part.redacted_data


def _provider_encrypted(part: ProviderDataPart) -> str | None:
    value = part.data.get("encrypted_content")
    return value if isinstance(value, str) and value else None


def _assistant(message: AssistantMessage) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    reasoning_by_step: dict[int, dict[str, Any]] = {}
    carried: str | None = None
    k = 0
    for part in message.content:
        if isinstance(part, ReasoningPart):
            entry: dict[str, Any] = {
                "id": reasoning_id(message.id, k),
                "role": "reasoning",
                "content": part.text,
            }
            k += 1
            if _encrypted(part):
                entry["encryptedValue"] = _encrypted(part)
            reasoning_by_step.setdefault(part.step, entry)
            out.append(entry)
    for part in message.content:
        if isinstance(part, ProviderDataPart) and _provider_encrypted(part):
            entry = reasoning_by_step.get(part.step, {})
            if entry and "encryptedValue" not in entry:
                entry["encryptedValue"] = _provider_encrypted(part)
            else:
                carried = _provider_encrypted(part)
    text = message.text
    calls: list[dict[str, Any]] = []
    sub_results: list[dict[str, Any]] = []
    for p in message.content:
        if isinstance(p, ToolCallPart):
            calls.append(_tool_call(p, message.id))
            if p.awaiting is not None:
                _add_sub_calls(p.awaiting, calls, sub_results, message.id, p.step)
    assistant: dict[str, Any] = {"id": message.id, "role": "assistant"}
    if text:
        assistant["content"] = text
    if calls:
        assistant["toolCalls"] = calls
    if carried is not None:
        assistant["encryptedValue"] = carried
    axon = {"status": message.status} if message.status != "complete" else {}
    if message.error is not None:
        axon["error"] = f"{message.error.kind}: {message.error.message}"
    if axon:
        assistant["metadata"] = {"axon": axon}
    if text or calls or carried is not None or axon:
        out.append(assistant)
    out += sub_results
    return out


def _tool_call(part: ToolCallPart, message_id: str) -> dict[str, Any]:
    """A stored call as an AG-UI tool call. An agent tool's call that waits (or waited)
    for its sub-agent's approval passed up says which sub call asked, in its
    ``metadata.axon`` (``askedTool``, ``askedArgs``, two and more agents deep
    ``askedVia``; approved with edits ``editedArgs``, what the sub call ran with): the
    interrupt's ``metadata`` says it while it waits, and a snapshot (a client
    reconnecting, the run's closing one) says it on the call the interrupt names."""
    call: dict[str, Any] = {
        "id": wire_call_id(message_id, part.step, part.tool_call_id),
        "type": "function",
        "function": {"name": part.tool_name, "arguments": _json_text(part.input)},
    }
    waiting = part.awaiting
    if waiting is not None and waiting.asked_tool is not None:
        asked: dict[str, Any] = {"askedTool": waiting.asked_tool, "askedArgs": waiting.asked_input}
        if waiting.asked_via:
            asked["askedVia"] = list(waiting.asked_via)
        if waiting.edited_input is not None:
            asked["editedArgs"] = waiting.edited_input
        call["metadata"] = {"axon": asked}
    return call


def _add_sub_calls(
    waiting: Awaiting,
    calls: list[dict[str, Any]],
    results: list[dict[str, Any]],
    message_id: str,
    step: int,
) -> None:
    """The client tool calls a sub-agent passed up through the agent tool's call that
    ``waiting`` is stored on (``Awaiting.sub_tool``; those answered before it,
    ``sub_answered``), as the run streamed them: tool calls of the same assistant
    message under the ids the client answers (the wire ids of ``<call id>.<sub call
    id>``), and each answer given as a tool message. Without them a snapshot dropped the
    call a ``pendingToolCallIds`` names (``@ag-ui/client`` replaces its messages with it)."""
    for sub in _subs(waiting):
        calls.append(
            {
                "id": wire_call_id(message_id, step, sub.id),
                "type": "function",
                "function": {"name": sub.sub_tool or "", "arguments": _json_text(sub.sub_input)},
            }
        )
        if not sub.decided:
            continue
        result: dict[str, Any] = {
            "id": result_message_id(message_id, step, sub.id),
            "role": "tool",
            "toolCallId": wire_call_id(message_id, step, sub.id),
            "content": sub.error if sub.error is not None else result_content(sub.output),
        }
        if sub.error is not None:
            result["error"] = sub.error
        results.append(result)


def _subs(waiting: Awaiting) -> list[Awaiting]:
    """The sub-agent's client calls passed up through a call's wait: those answered,
    then the one it waits for now."""
    return [*waiting.sub_answered, *((waiting,) if waiting.sub_tool is not None else ())]


class _Owners:
    """Which call a tool message answers, as :func:`runtime.history.repair` pairs them:
    the latest call of its id and step, else the latest of its id (fed the history's
    assistant messages in order, ``add``; asked of each tool message, ``of``)."""

    __slots__ = ("calls", "latest")

    def __init__(self) -> None:
        self.calls: dict[tuple[str, int], tuple[str, int]] = {}
        self.latest: dict[str, tuple[str, int]] = {}

    def add(self, message_id: str, part: ToolCallPart) -> None:
        owner = (message_id, part.step)
        self.calls[part.tool_call_id, part.step] = self.latest[part.tool_call_id] = owner

    def of(self, result: ToolMessage) -> tuple[str, int] | None:
        """The answered call's ``(assistant message id, step)``; ``None``: none."""
        return self.calls.get((result.tool_call_id, result.step)) or self.latest.get(
            result.tool_call_id
        )


def thread_calls(messages: Sequence[Message]) -> tuple[dict[str, str], set[str]]:
    """Every call a snapshot of ``messages`` lists, by its wire id (:func:`wire_call_id`):
    the stored call id it stands for (a sub-agent's passed-up client call: its
    ``<call id>.<sub call id>``); and the wire ids of those the snapshot gives a result
    (a tool message). What a client's ``toolCallId`` is read by."""
    known: dict[str, str] = {}
    answered: set[str] = set()
    owners = _Owners()
    for m in messages:
        if isinstance(m, AssistantMessage):
            for p in m.content:
                if not isinstance(p, ToolCallPart):
                    continue
                owners.add(m.id, p)
                known[wire_call_id(m.id, p.step, p.tool_call_id)] = p.tool_call_id
                if p.awaiting is not None:
                    for sub in _subs(p.awaiting):
                        wire = wire_call_id(m.id, p.step, sub.id)
                        known[wire] = sub.id
                        if sub.decided:
                            answered.add(wire)
        elif isinstance(m, ToolMessage):
            owner = owners.of(m)
            if owner is not None:
                answered.add(wire_call_id(owner[0], owner[1], m.tool_call_id))
    return known, answered


def agui_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """A stored history as AG-UI messages (a ``MESSAGES_SNAPSHOT``'s): user and system
    messages; for each assistant message its reasoning messages, then the message with
    its text and tool calls; tool results as tool messages (a call that still waits has
    none), each id'd by the call it answers (:func:`result_message_id`). Every tool
    call goes by its wire id (:func:`wire_call_id`), unique in the thread; a user,
    system or tool message by its :func:`snapshot_id`, distinct from every derived id."""
    out: list[dict[str, Any]] = []
    owners = _Owners()
    for m in messages:
        if isinstance(m, UserMessage):
            content = m.content if isinstance(m.content, str) else content_parts(m.content)
            out.append({"id": snapshot_id(m.id), "role": "user", "content": content})
        elif isinstance(m, SystemMessage):
            out.append({"id": snapshot_id(m.id), "role": "system", "content": m.content})
        elif isinstance(m, AssistantMessage):
            for p in m.content:
                if isinstance(p, ToolCallPart):
                    owners.add(m.id, p)
            out.extend(_assistant(m))
        elif isinstance(m, ToolMessage):
            owner = owners.of(m)
            tool: dict[str, Any] = {
                "id": snapshot_id(m.id),
                "role": "tool",
                "toolCallId": m.tool_call_id,
            }
            if owner is not None:  # (a result no call claims, which repair drops: its own)
                tool["id"] = result_message_id(owner[0], m.step, m.tool_call_id)
                tool["toolCallId"] = wire_call_id(owner[0], owner[1], m.tool_call_id)
            tool["content"] = result_content(m.output) if m.error is None else m.error
            if m.error is not None:
                tool["error"] = m.error
            out.append(tool)
    return out


# -- the events ---------------------------------------------------------------------------


def sse(event: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying ``event`` as JSON."""
    return b"data: " + utf8_dumps(event, default=str) + b"\n\n"


def step_name(step: int) -> str:
    return f"step-{step}"


def token_usage(usage: Usage, provider: str | None, model: str | None) -> list[dict[str, Any]]:
    """The turn's usage as AG-UI ``TokenUsage`` entries (none when nothing was counted).
    AG-UI's ``inputTokens`` counts cached prompt tokens too: Anthropic reports them beside
    its input count, so they are added in for it."""
    if not (usage.input_tokens or usage.output_tokens or usage.total_tokens):
        return []
    inputs = usage.input_tokens
    if provider == "anthropic":
        inputs += (usage.cache_read or 0) + (usage.cache_write or 0)
    entry: dict[str, Any] = {
        "inputTokens": inputs,
        "outputTokens": usage.output_tokens,
        "totalTokens": inputs + usage.output_tokens,
    }
    if provider:
        entry["provider"] = provider
    if model:
        entry["model"] = model
    for key, value in (
        ("reasoningTokens", usage.reasoning_tokens),
        ("cachedInputTokens", usage.cache_read),
        ("cacheWriteInputTokens", usage.cache_write),
    ):
        if value is not None:
            entry[key] = value
    return [entry]


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat()


def interrupt(
    call: PendingCall, expires_at: float | None = None, via: Sequence[str] = ()
) -> dict[str, Any]:
    """The ``Interrupt`` an approval the turn waits for is reported as. A sub-agent's
    approval passed up (``PendingCall.asked_tool``) names the sub call that asks, the one
    ``editedArgs`` edits, in its message and ``metadata`` (``askedTool``, ``askedArgs``;
    two and more agents deep ``askedVia``, the agent tools between: ``via``, the wait's
    ``Awaiting.asked_via``)."""
    message = f"Approve {call.tool_name}({_json_text(call.input)})?"
    if call.asked_tool is not None:
        message = (
            f"Approve {call.asked_tool}({_json_text(call.asked_input)}), which the "
            f"sub-agent {call.tool_name} asks for?"
        )
    found: dict[str, Any] = {
        "id": call.approval_id,
        "reason": "tool_call",
        "message": message,
        "toolCallId": wire_call_id(call.message_id, call.step, call.tool_call_id),
        "responseSchema": APPROVAL_SCHEMA,
    }
    if call.asked_tool is not None:
        found["metadata"] = {"askedTool": call.asked_tool, "askedArgs": call.asked_input}
        if via:
            found["metadata"]["askedVia"] = list(via)
    if expires_at is not None:
        found["expiresAt"] = _iso(expires_at)
    return found


def _waits(messages: Sequence[Message]) -> dict[str, Awaiting]:
    """Each stored wait by its id (what an interrupt reads beyond its ``PendingCall``:
    the expiry, the agent tools a passed-up approval came through)."""
    return {
        p.awaiting.id: p.awaiting
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart) and p.awaiting is not None
    }


def _interrupt_of(call: PendingCall, wait: Awaiting | None) -> dict[str, Any]:
    if wait is None:
        return interrupt(call)
    return interrupt(call, wait.expires_at or None, wait.asked_via)


def finished(
    thread_id: str,
    run_id: str,
    pending: Sequence[PendingCall],
    messages: Sequence[Message],
) -> list[dict[str, Any]]:
    """The end of a run that left ``pending`` calls waiting (none: plain success):
    approvals make it the interrupt outcome, after a ``MESSAGES_SNAPSHOT`` of
    ``messages`` (the spec's state at the interrupt boundary); client tool calls alone,
    the success outcome naming them in ``pendingToolCallIds``."""
    approvals = [c for c in pending if c.kind == APPROVAL]
    if approvals:
        waits = _waits(messages)
        outcome: dict[str, Any] = {
            "type": "interrupt",
            "interrupts": [_interrupt_of(c, waits.get(c.approval_id)) for c in approvals],
        }
        snapshot = {"type": "MESSAGES_SNAPSHOT", "messages": agui_messages(messages)}
        return [
            snapshot,
            {"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id, "outcome": outcome},
        ]
    outcome = {"type": "success"}
    # (a sub-agent's client tool passed up: the id its call was streamed under)
    client = [pending_wire_id(c) for c in pending if c.kind == CLIENT]
    if client:
        outcome["pendingToolCallIds"] = client
    return [{"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id, "outcome": outcome}]


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return loads(dumps(unstructure(value), default=str))  # (an int past 64 bits exactly)


class RunEncoder:
    """Maps one turn's output chunks to AG-UI events (``encode``, ``events``), and ends
    the run once the turn is over and saved (``closing``).

    Stateful: it knows what is open (steps, the text message, reasoning, tool calls) so
    a cut-off turn still closes everything before its ``RUN_FINISHED``, which calls it
    has announced, and how the turn ended."""

    def __init__(
        self,
        thread_id: str,
        run_id: str,
        *,
        provider: str | None = None,
        model: str | None = None,
        reasoning_base: int = 0,
        prelude: Sequence[dict[str, Any]] = (),
        metadata: dict[str, Any] | None = None,
        answered: Iterable[str] = (),
    ) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.provider = provider
        self.model = model
        self.prelude = list(prelude)
        """Events sent right after ``RUN_STARTED`` (a snapshot that resynchronises the
        client)."""
        self.metadata = metadata
        """``RUN_STARTED.metadata``, when there is something to say."""
        self.answered = frozenset(answered)
        """Client tool calls the client answered with this run's tool messages: their
        results are the client's own messages already, and are not sent back."""
        self.message_id = ""
        self._reasoning_index = reasoning_base
        self._reasoning: dict[str, str] = {}
        """Open reasoning parts: part id -> reasoning message id."""
        self._reasoning_ids: list[str] = []
        """Every reasoning message id streamed, in order."""
        self._text_open = False
        self._steps: set[int] = set()
        self._steps_open: set[int] = set()
        self._calls_open: set[str] = set()
        self._args_sent: set[str] = set()
        self._announced: set[str] = set()
        self._wire: dict[str, str] = {}
        """The wire id (:func:`wire_call_id`) of each call id of the turn streamed."""
        self.finish_reason: str | None = None
        self.usage = Usage()
        self.abort_reason: str | None = None
        self.started = False
        """``RUN_STARTED`` was sent."""
        self.ended = False
        """``RUN_ERROR`` was sent: nothing may follow."""
        self.reset = False
        """A step started over (``reset-step``): the run ends with a snapshot."""

    # -- the stream ---------------------------------------------------------------------

    def encode(self, chunk: Any) -> list[dict[str, Any]]:
        """The AG-UI events for one output chunk.

        This runs once per delta: a text delta inside an open message, most of a turn,
        is encoded right here, any other chunk by one lookup of its type
        (:data:`_ENCODERS`)."""
        if self.ended:
            return []
        t = type(chunk)
        if t is o.TextDelta and self._text_open:
            return [
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": self.message_id, "delta": chunk.text}
            ]
        encode = _ENCODERS.get(t)
        return [] if encode is None else encode(self, chunk)

    def _start(self, chunk: o.Start) -> list[dict[str, Any]]:
        self.message_id = chunk.message_id
        return self._run_started()

    def _run_started(self) -> list[dict[str, Any]]:
        self.started = True
        started: dict[str, Any] = {
            "type": "RUN_STARTED",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "protocolVersion": PROTOCOL_VERSION,
        }
        if self.metadata:
            started["metadata"] = self.metadata
        return [started, *self.prelude]

    def _step_start(self, chunk: o.StepStart) -> list[dict[str, Any]]:
        self._steps.add(chunk.step)
        self._steps_open.add(chunk.step)
        return [{"type": "STEP_STARTED", "stepName": step_name(chunk.step)}]

    def _step_finish(self, chunk: o.StepFinish) -> list[dict[str, Any]]:
        self._steps_open.discard(chunk.step)
        return [{"type": "STEP_FINISHED", "stepName": step_name(chunk.step)}]

    def _text_start(self, chunk: o.TextStart) -> list[dict[str, Any]]:
        out = self._close_text()
        self._text_open = True
        return [
            *out,
            {"type": "TEXT_MESSAGE_START", "messageId": self.message_id, "role": "assistant"},
        ]

    def _unopened_text_delta(self, chunk: o.TextDelta) -> list[dict[str, Any]]:
        """A text delta with no message open: never without its start, kept valid
        regardless by opening one (an open message's deltas are encoded in ``encode``)."""
        self._text_open = True
        return [
            {"type": "TEXT_MESSAGE_START", "messageId": self.message_id, "role": "assistant"},
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": self.message_id, "delta": chunk.text},
        ]

    def _text_finish(self, chunk: o.TextFinish) -> list[dict[str, Any]]:
        return self._close_text()

    def _reasoning_start(self, chunk: o.ReasoningStart) -> list[dict[str, Any]]:
        rid = reasoning_id(self.message_id, self._reasoning_index)
        self._reasoning_index += 1
        self._reasoning[chunk.part_id] = rid
        self._reasoning_ids.append(rid)
        return [
            {"type": "REASONING_START", "messageId": rid},
            {"type": "REASONING_MESSAGE_START", "messageId": rid, "role": "reasoning"},
        ]

    def _reasoning_delta(self, chunk: o.ReasoningDelta) -> list[dict[str, Any]]:
        open_id = self._reasoning.get(chunk.part_id)
        if open_id is None:
            return []
        return [{"type": "REASONING_MESSAGE_CONTENT", "messageId": open_id, "delta": chunk.text}]

    def _reasoning_finish(self, chunk: o.ReasoningFinish) -> list[dict[str, Any]]:
        return self._close_reasoning(chunk.part_id)

    def wire_id(self, step: int, call_id: str) -> str:
        """The wire id of the turn's call ``call_id`` (made in ``step``): the one it was
        announced under, else its message's (:func:`wire_call_id`)."""
        wire = self._wire.get(call_id)
        return wire_call_id(self.message_id, step, call_id) if wire is None else wire

    def _tool_input_start(self, chunk: o.ToolInputStart) -> list[dict[str, Any]]:
        return self._start_call(chunk.step, chunk.tool_call_id, chunk.tool_name)

    def _tool_input_delta(self, chunk: o.ToolInputDelta) -> list[dict[str, Any]]:
        if chunk.tool_call_id not in self._calls_open:
            return []
        self._args_sent.add(chunk.tool_call_id)
        wire = self._wire[chunk.tool_call_id]
        return [{"type": "TOOL_CALL_ARGS", "toolCallId": wire, "delta": chunk.delta}]

    def _tool_call(self, chunk: o.ToolCall) -> list[dict[str, Any]]:
        out = self._start_call(chunk.step, chunk.tool_call_id, chunk.tool_name)
        if chunk.tool_call_id not in self._args_sent:
            out.append(
                {
                    "type": "TOOL_CALL_ARGS",
                    "toolCallId": self.wire_id(chunk.step, chunk.tool_call_id),
                    "delta": _json_text(chunk.input),
                }
            )
        return out + self._end_call(chunk.tool_call_id)

    def _tool_result(self, chunk: o.ToolResult) -> list[dict[str, Any]]:
        if chunk.tool_call_id in self.answered:  # the client's own message already
            return []
        return [
            *self._end_call(chunk.tool_call_id),
            self._result(chunk.step, chunk.tool_call_id, result_content(chunk.output)),
        ]

    def _tool_error(self, chunk: o.ToolError) -> list[dict[str, Any]]:
        if chunk.tool_call_id in self.answered:  # the client's own message already
            return []
        return [
            *self._end_call(chunk.tool_call_id),
            self._result(chunk.step, chunk.tool_call_id, chunk.error, {"error": True}),
        ]

    def _tool_output_denied(self, chunk: o.ToolOutputDenied) -> list[dict[str, Any]]:
        text = (
            f"the tool call was denied: {chunk.reason}"
            if chunk.reason
            else "the tool call was denied"
        )
        return [
            *self._end_call(chunk.tool_call_id),
            self._result(
                chunk.step, chunk.tool_call_id, text, {"denied": True, "reason": chunk.reason}
            ),
        ]

    def _tool_stream(self, chunk: o.ToolStream) -> list[dict[str, Any]]:
        return [
            {
                "type": "CUSTOM",
                "name": "axon.tool-stream",
                "value": {
                    "toolCallId": self.wire_id(chunk.step, chunk.tool_call_id),
                    "toolName": chunk.tool_name,
                    "chunk": {"type": getattr(chunk.chunk, "type", None), **_plain(chunk.chunk)},
                },
            }
        ]

    def _object_delta(self, chunk: o.ObjectDelta) -> list[dict[str, Any]]:
        return [
            {
                "type": "CUSTOM",
                "name": "axon.object",
                "value": {"messageId": self.message_id, "value": chunk.value},
            }
        ]

    def _throttled(self, chunk: o.Throttled) -> list[dict[str, Any]]:
        # a notice, nothing to close or keep: why the run is quiet for now
        value = {"step": chunk.step, "wait": chunk.wait, "reason": chunk.reason}
        return [{"type": "CUSTOM", "name": "axon.throttled", "value": value}]

    def _budget_wait(self, chunk: o.BudgetWait) -> list[dict[str, Any]]:
        value = {
            "step": chunk.step,
            "want": chunk.want,
            "available": chunk.available,
            "held": chunk.held,
            "ahead": chunk.ahead,
        }
        return [{"type": "CUSTOM", "name": "axon.budget-wait", "value": value}]

    def _reset_step(self, chunk: o.ResetStep) -> list[dict[str, Any]]:
        """Close what the failed call left open and say the step starts over; the
        run's closing snapshot replaces what the client built of it."""
        self.reset = True
        out = self._close_text()
        for part_id in list(self._reasoning):
            out += self._close_reasoning(part_id)
        for call_id in sorted(self._calls_open):
            out += self._end_call(call_id)
        info = chunk.error
        value = {
            "messageId": self.message_id,
            "step": chunk.step,
            "provider": chunk.provider,
            "errorText": f"{info.kind}: {info.message}",
        }
        out.append({"type": "CUSTOM", "name": "axon.reset-step", "value": value})
        if chunk.step in self._steps and chunk.step not in self._steps_open:
            # A takeover re-runs a step whose ``step-finish`` the dead worker had relayed
            # (not committed): the step opens again, so its re-run's STEP_FINISHED
            # closes a step that is open (the spec's sequence) rather than a second time.
            out += self._step_start(o.StepStart(step=chunk.step))
        return out

    def _finish(self, chunk: o.Finish) -> list[dict[str, Any]]:
        self.finish_reason = chunk.finish_reason
        self.usage = chunk.usage
        return []

    def _abort(self, chunk: o.Abort) -> list[dict[str, Any]]:
        self.abort_reason = chunk.reason
        if self.started:
            return []
        # A run stopped before its turn started (taken out of the session's queue): it
        # starts here, and ends as cancelled (``closing``), as a run stopped mid-turn.
        return self._run_started()

    def _error(self, chunk: o.Error) -> list[dict[str, Any]]:
        self.ended = True
        error: dict[str, Any] = {
            "type": "RUN_ERROR",
            "message": f"{chunk.error.kind}: {chunk.error.message}",
            "code": chunk.error.kind,
        }
        return [error]

    def events(self, chunk: Any) -> bytes:
        """``chunk`` as SSE bytes, for :class:`runtime.app.web.app.TurnResponse`."""
        return b"".join(sse(e) for e in self.encode(chunk))

    def _close_text(self) -> list[dict[str, Any]]:
        if not self._text_open:
            return []
        self._text_open = False
        return [{"type": "TEXT_MESSAGE_END", "messageId": self.message_id}]

    def _close_reasoning(self, part_id: str) -> list[dict[str, Any]]:
        rid = self._reasoning.pop(part_id, None)
        if rid is None:
            return []
        return [
            {"type": "REASONING_MESSAGE_END", "messageId": rid},
            {"type": "REASONING_END", "messageId": rid},
        ]

    def _start_call(self, step: int, call_id: str, name: str) -> list[dict[str, Any]]:
        if call_id in self._announced:
            return []
        self._announced.add(call_id)
        self._calls_open.add(call_id)
        wire = self._wire[call_id] = wire_call_id(self.message_id, step, call_id)
        return [
            {
                "type": "TOOL_CALL_START",
                "toolCallId": wire,
                "toolCallName": name,
                "parentMessageId": self.message_id,
            }
        ]

    def _end_call(self, call_id: str) -> list[dict[str, Any]]:
        if call_id not in self._calls_open:
            return []
        self._calls_open.discard(call_id)
        return [{"type": "TOOL_CALL_END", "toolCallId": self._wire[call_id]}]

    def _result(
        self, step: int, call_id: str, content: Any, axon: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        event: dict[str, Any] = {
            "type": "TOOL_CALL_RESULT",
            "messageId": result_message_id(self.message_id, step, call_id),
            "toolCallId": self.wire_id(step, call_id),
            "content": content,
            "role": "tool",
        }
        if axon:
            event["metadata"] = {"axon": axon}
        return event

    def _close_all(self) -> list[dict[str, Any]]:
        """Close what a cut-off turn left open, in the order a run must."""
        out = self._close_text()
        for part_id in list(self._reasoning):
            out += self._close_reasoning(part_id)
        for call_id in sorted(self._calls_open):
            out += self._end_call(call_id)
        for step in sorted(self._steps_open):
            out.append({"type": "STEP_FINISHED", "stepName": step_name(step)})
        self._steps_open.clear()
        return out

    # -- the end ------------------------------------------------------------------------

    def encrypted_values(self, message: Any) -> list[dict[str, Any]]:
        """``REASONING_ENCRYPTED_VALUE`` for each signed or encrypted reasoning part of
        this run's steps of the saved ``message``, on the reasoning message it streamed as
        (an encrypted reasoning item of a step that streamed no reasoning goes on the
        assistant message)."""
        if not isinstance(message, AssistantMessage):
            return []
        streamed = set(self._reasoning_ids)
        out: list[dict[str, Any]] = []
        for entry in _assistant(message):
            if entry["role"] == "reasoning" and entry["id"] in streamed:
                if entry.get("encryptedValue"):
                    out.append(_encrypted_event(entry["id"], entry["encryptedValue"]))
            elif entry["role"] == "assistant" and entry.get("encryptedValue"):
                if any(
                    isinstance(p, ProviderDataPart) and p.step in self._steps
                    for p in message.content
                ):
                    out.append(_encrypted_event(entry["id"], entry["encryptedValue"]))
        return out

    def snapshot_due(self) -> bool:
        """Whether :meth:`closing` sends a ``MESSAGES_SNAPSHOT`` of the whole thread (it
        replaces the client's messages: ``@ag-ui/client`` drops those it leaves out), so
        its ``messages`` must be the whole history: a run that waits for input (the
        interrupt outcome's state), or one whose step started over. Otherwise they are
        not read, and a worker deployment's front end reads the turn alone."""
        return self.reset or self.finish_reason == AWAITING_INPUT

    def closing(self, result: Any, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """The events that end the run, once the turn is over and saved: ``result`` is
        its :class:`~runtime.output.TurnResult` (``None`` if it never came),
        ``messages`` the session's history after it."""
        if self.ended:
            return []
        if not self.started:  # the run never started: nothing was sent
            return []
        out = self._close_all()
        if result is None and self.finish_reason is None and self.abort_reason is None:
            self.ended = True
            return [
                *out,
                {
                    "type": "RUN_ERROR",
                    "message": "the turn ended without a result",
                    "code": "no_result",
                },
            ]
        if result is not None:
            out += self.encrypted_values(result.message)
        usage = token_usage(self.usage, self.provider, self.model)
        if self.abort_reason is not None or self.finish_reason == "budget":
            why = self.abort_reason or f"budget {getattr(result, 'budget', None) or ''}".strip()
            end: dict[str, Any] = {
                "type": "RUN_FINISHED",
                "threadId": self.thread_id,
                "runId": self.run_id,
                "outcome": {"type": "cancelled"},
                "metadata": {"axon": {"reason": why}},
            }
            ends = [end]
        elif self.finish_reason == AWAITING_INPUT and result is not None:
            ends = finished(self.thread_id, self.run_id, result.pending, messages)
        else:
            ends = finished(self.thread_id, self.run_id, (), messages)
            if result is not None and result.output is not None:
                ends[-1]["result"] = _jsonable(result.output)
        if self.reset and ends[0]["type"] != "MESSAGES_SNAPSHOT":
            ends.insert(0, {"type": "MESSAGES_SNAPSHOT", "messages": agui_messages(messages)})
        if usage:
            ends[-1]["usage"] = usage
        self.ended = True
        return out + ends


_Encode = Callable[[RunEncoder, Any], list[dict[str, Any]]]


def _nothing(encoder: RunEncoder, chunk: Any) -> list[dict[str, Any]]:
    """A chunk with no event of its own: an approval request is reported as an
    interrupt when the run ends."""
    return []


_ENCODERS: dict[type, _Encode] = {
    o.Start: RunEncoder._start,
    o.StepStart: RunEncoder._step_start,
    o.StepFinish: RunEncoder._step_finish,
    o.TextStart: RunEncoder._text_start,
    o.TextDelta: RunEncoder._unopened_text_delta,
    o.TextFinish: RunEncoder._text_finish,
    o.ReasoningStart: RunEncoder._reasoning_start,
    o.ReasoningDelta: RunEncoder._reasoning_delta,
    o.ReasoningFinish: RunEncoder._reasoning_finish,
    o.ToolInputStart: RunEncoder._tool_input_start,
    o.ToolInputDelta: RunEncoder._tool_input_delta,
    o.ToolCall: RunEncoder._tool_call,
    o.ToolResult: RunEncoder._tool_result,
    o.ToolError: RunEncoder._tool_error,
    o.ToolOutputDenied: RunEncoder._tool_output_denied,
    o.ToolApprovalRequest: _nothing,
    o.ToolStream: RunEncoder._tool_stream,
    o.ObjectDelta: RunEncoder._object_delta,
    o.Throttled: RunEncoder._throttled,
    o.BudgetWait: RunEncoder._budget_wait,
    o.ResetStep: RunEncoder._reset_step,
    o.Finish: RunEncoder._finish,
    o.Abort: RunEncoder._abort,
    o.Error: RunEncoder._error,
}
"""Each output chunk type's encoding but an open message's text delta (``encode``)."""


def _encrypted_event(entity_id: str, value: str) -> dict[str, Any]:
    return {
        "type": "REASONING_ENCRYPTED_VALUE",
        "subtype": "message",
        "entityId": entity_id,
        "encryptedValue": value,
    }


def _plain(chunk: Any) -> dict[str, Any]:
    """A nested output chunk's fields as JSON values."""
    try:
        value = unstructure(chunk)
    except Exception:  # a tool may emit anything: it is passed on as text then
        return {"value": str(chunk)}
    return value if isinstance(value, dict) else {"value": value}


__all__ = [
    "APPROVAL_SCHEMA",
    "PROTOCOL_VERSION",
    "RunEncoder",
    "agui_messages",
    "finished",
    "interrupt",
    "looks_derived",
    "pending_wire_id",
    "result_content",
    "snapshot_id",
    "split_wire_id",
    "sse",
    "stored_call_id",
    "stored_message_id",
    "thread_calls",
    "token_usage",
    "wire_call_id",
]
