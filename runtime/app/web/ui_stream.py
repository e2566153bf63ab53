"""The Vercel AI SDK "UI message stream" (protocol v1), spoken by ``POST /api/chat``.

:class:`UIStreamEncoder` maps the runtime's :data:`~runtime.output.OutputChunk` s to the
chunks that the ``ai`` package's ``uiMessageChunkSchema`` accepts, so a React app on
``useChat`` (or anything built on ``readUIMessageStream``) reads an Axon turn with no
adapter. Each chunk goes out as one Server-Sent Event, ``data: {json}\\n\\n``, and the
stream closes with ``data: [DONE]\\n\\n``. The mapping:

* ``start`` -> ``start`` (``messageId``);
* ``step-start`` / ``step-finish`` -> ``start-step`` / ``finish-step``;
* ``text-start/delta/finish`` -> ``text-start/delta/end`` (``id``, ``delta``);
* ``object-delta`` (a structured answer parsed so far) -> ``data-object`` (``id``: the
  text part's id, ``data``: the value): the AI SDK replaces a data part's ``data`` when
  one with the same type and id arrives, so the UI message holds the latest object;
* ``reasoning-start/delta/finish`` -> ``reasoning-start/delta/end`` (``id``, ``delta``);
  the ``id`` is :func:`reasoning_ui_id` (the message, the step, the part's place among
  the step's reasoning), which the AI SDK 7 keeps on the reasoning part it builds and
  :func:`ui_messages` gives the stored part too, so a reloaded page has the parts the
  stream built;
* ``tool-input-start`` -> ``tool-input-start`` (``toolCallId``, ``toolName``);
* ``tool-input-delta`` -> ``tool-input-delta`` (``toolCallId``, ``inputTextDelta``);
* ``tool-call`` -> ``tool-input-available`` (``toolCallId``, ``toolName``, ``input``);
  a sub-agent's client tool call passed up (id ``<call>.<sub call>``) has its calling
  call shown again first, with ``providerExecuted: true`` (``_server_runs``);
* ``tool-result`` -> ``tool-output-available`` (``toolCallId``, ``output``);
* ``tool-error`` -> ``tool-output-error`` (``toolCallId``, ``errorText``);
* ``tool-stream`` (a sub-agent's turn streaming inside its tool call) -> the text it has
  streamed so far as a preliminary ``tool-output-available`` (``preliminary: true``),
  which the final result replaces; its other nested chunks are not forwarded (but
  ``throttled`` and ``budget-wait``, below);
* ``tool-approval-request`` -> ``tool-approval-request`` (``approvalId``, ``toolCallId``;
  ``signature`` with a secret configured, :mod:`runtime.app.web.signing`, for a call
  whose input the stream showed or the stored call gave, :meth:`UIStreamEncoder.learn_input`;
  for a sub-agent's approval passed up, ``approvalDescriptor``: :func:`asked_descriptor`,
  the sub call that asks and the agent tools between, which the ``ai`` package keeps as
  ``approval.descriptor``);
* ``tool-output-denied`` -> ``tool-output-denied`` (``toolCallId``);
* ``throttled`` (the model call waits for a rate limit) -> ``data-throttled`` with
  ``transient: true`` (``data``: ``wait`` seconds and ``reason``): ``useChat`` hands it
  to ``onData`` and keeps it out of the message, so a UI can say "waiting for rate limit";
  a sub-agent's, nested in a ``tool-stream``, comes so too, with ``data.toolCallId`` the
  call it runs under (at any depth), as ``budget-wait``'s;
* ``budget-wait`` (a model call waits for output tokens the calls beside it hold) ->
  ``data-budget-wait`` with ``transient: true`` (``data``: ``step``, ``want``,
  ``available``, ``held``, ``ahead``); a sub-agent's, nested in a ``tool-stream``, comes
  so too, with ``data.toolCallId`` the call it runs under (at any depth), so a UI shows
  why that call's preliminary output has stopped;
* ``steered`` (a user message joined the running turn, ``on_busy="steer"``) ->
  ``data-steered`` with ``transient: true`` (``id`` and ``data.messageId``: the stored
  user message's id; ``data.text``, ``data.step``, ``data.answerId``: the id of the
  assistant message stored after it), before the step that first sees it: ``onData``
  gets it and the page shows it as the user's bubble at once;
* ``reset-step`` (the step's model call failed mid-stream and the step starts over on a
  fallback provider) -> ``reset-step``, the AI SDK's own chunk (``ai`` 7): its
  ``readUIMessageStream`` removes every part added since the step's ``start-step``;
  then a transient ``data-reset-step`` (``data``: the ``step``, the ``provider`` it
  goes on with and the ``errorText``) for ``onData``, kept out of the message;
* ``finish`` -> ``finish`` (``finishReason``, ``tool-calls`` for a turn that suspended
  waiting for input; ``messageMetadata``: the runtime's own finish reason and the summed
  ``usage``, its ``cost`` in US dollars when known);
* ``error`` -> ``error`` (``errorText``: ``"Kind: message"``);
* ``abort`` -> ``abort`` (``reason``).

:func:`ui_messages` gives a stored history in the AI SDK's ``UIMessage`` form (what
``useChat`` takes as its initial ``messages``). This module needs no web framework.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import orjson

from runtime import output as o
from runtime.app.web.signing import SessionSigner
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    File,
    Message,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserContent,
    UserMessage,
    is_media_output,
)
from runtime.serde import unstructure, utf8_dumps

AWAITING_INPUT = "awaiting-input"

HEADERS: dict[str, str] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-vercel-ai-ui-message-stream": "v1",
    "x-accel-buffering": "no",
}
"""Response headers of a UI message stream (as the ``ai`` package's own responses set)."""

DONE = b"data: [DONE]\n\n"
"""The event that closes a UI message stream."""

FINISH_REASONS = frozenset({"stop", "length", "content-filter", "tool-calls", "error", "other"})
"""The ``finishReason`` values the protocol knows; others (``budget``, ...) go as ``other``."""


ASKED_TOOL = "axonAskedTool"
"""The key of a passed-up approval's ``approvalDescriptor`` naming the sub-agent's tool
whose call asks (:func:`asked_descriptor`)."""

ASKED_INPUT = "axonAskedInput"
"""The key of a passed-up approval's ``approvalDescriptor`` holding that call's input, as
the sub-agent's model gave it: what an edit (``approval.axonEditedInput``) replaces."""

ASKED_VIA = "axonAskedVia"
"""The key of a passed-up approval's ``approvalDescriptor`` naming the agent tools between
the calling call's sub-agent and the one whose call asks (``Awaiting.asked_via``), two
and more agents deep; left out otherwise."""

ASKED_EDIT = "axonAskedEditedInput"
"""The key of a UI message tool part's ``toolMetadata`` holding the edit a passed-up
approval was approved with (what the sub-agent's call ran with, or runs with)."""


def asked_descriptor(tool: str, input: Any, via: Sequence[str] = ()) -> dict[str, Any]:
    """The ``approvalDescriptor`` of a sub-agent's approval passed up to the calling call
    (``as_tool(pass_approvals=True)``): the sub-agent's call that asks, ``{"axonAskedTool":
    name, "axonAskedInput": input}``. The request's own ids, input and signature are the
    agent tool's call (the one the stream showed, which the answer names); this says what
    the person approves, and what an edit is of. The ``ai`` package (6.0.274 on, and 7)
    keeps it whole as the tool part's ``approval.descriptor`` (``validateUIMessages``
    too) and sends it back with the answer, where it decides nothing: the server checks
    an edit against the sub call it stored. :func:`ui_messages` gives the stored part
    the same, so a reloaded page has the part the stream built. ``via``: the agent tools
    between, two and more agents deep (``"axonAskedVia"``, a list; left out when none)."""
    if via:
        return {ASKED_TOOL: tool, ASKED_INPUT: input, ASKED_VIA: list(via)}
    return {ASKED_TOOL: tool, ASKED_INPUT: input}


def _json(value: Any) -> bytes:
    return utf8_dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS)


def sse(chunk: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying ``chunk`` as JSON."""
    return b"data: " + _json(chunk) + b"\n\n"


def error_text(kind: str, message: str) -> str:
    """The ``errorText`` of an error: ``"Kind: message"`` (the kind alone if no message)."""
    return f"{kind}: {message}" if message else kind


def reasoning_ui_id(message_id: str, step: int, index: int) -> str:
    """The ``id`` of the ``index``-th reasoning part of step ``step`` of assistant message
    ``message_id``, in the stream and in the stored form alike. Derived, not the
    runtime's ``part_id`` (random, and not stored); counted within a step, so a
    continuation (its steps numbered after the suspended one's) and a step started over
    (``reset-step``: the AI SDK drops the step's parts) number their parts as the stored
    message has them."""
    return f"{message_id}.s{step}.r{index}"


def _usage(usage: Any) -> dict[str, Any]:
    return {k: v for k, v in unstructure(usage).items() if v is not None}


class UIStreamEncoder:
    """Maps one turn's output chunks to UI message stream chunks.

    Stateful for three things: a tool result whose call the stream never announced gets
    a ``tool-input-available`` first (the AI SDK rejects a result for an unknown call), a
    streaming tool's text is accumulated for its preliminary outputs, and each reasoning
    part's id is :func:`reasoning_ui_id` (the message from ``start``; a stream read from
    the middle of a turn, which had no ``start``, keeps the runtime's ``part_id``).
    """

    def __init__(self, announced: Iterable[str] = (), signer: SessionSigner | None = None) -> None:
        self._announced: set[str] = set(announced)
        """Calls the client knows already: a continuation's waiting calls (docs/approval.md).
        Given as a mapping (call id -> the call's input as stored: :func:`~runtime.app.web.
        answers.record_answers`), a signer signs a request the continuation makes for one
        of them over that input: a sub-agent asking again on the same calling call
        (``as_tool(pass_approvals=True)``) streams a new request for a call whose input
        this stream never showed. Before, that request went out unsigned, and where
        signatures are required the live client's answer to it was a 403."""
        self._signer = signer
        """Signs approval requests (a secret configured): the session's signer."""
        self._inputs: dict[str, Any] = (
            dict(announced) if signer is not None and isinstance(announced, Mapping) else {}
        )
        """With a signer, each call's input as the stream showed it, by call id."""
        self._streamed: dict[str, str] = {}
        self._calls: dict[str, o.ToolCall] = {}
        """Each call the stream showed, by id (the chunk, no copy), for
        :meth:`_server_runs`."""
        self._message_id: str | None = None
        self._reasoning_count: dict[int, int] = {}
        """Per step, the reasoning parts it has streamed (since its start or reset)."""
        self._reasoning_ids: dict[str, str] = {}
        """Open reasoning parts: ``part_id`` -> the ``id`` the stream gives them."""

    def encode(self, chunk: Any) -> list[dict[str, Any]]:
        """The UI message stream chunks for one ``OutputChunk`` (usually exactly one).

        This runs once per delta: a text delta, most of a turn, is encoded right here, any
        other chunk by one lookup of its type (:data:`_ENCODERS`)."""
        t = type(chunk)
        if t is o.TextDelta:
            return [{"type": "text-delta", "id": chunk.part_id, "delta": chunk.text}]
        encode = _ENCODERS.get(t)
        return [] if encode is None else encode(self, chunk)

    def _object_delta(self, chunk: o.ObjectDelta) -> list[dict[str, Any]]:
        return [{"type": "data-object", "id": chunk.part_id, "data": chunk.value}]

    def _throttled(
        self, chunk: o.Throttled, tool_call_id: str | None = None
    ) -> list[dict[str, Any]]:
        # transient: the UI shows it while it waits, never stores it
        data: dict[str, Any] = {"wait": chunk.wait, "reason": chunk.reason}
        if tool_call_id is not None:  # a sub-agent's, nested under this call
            data["toolCallId"] = tool_call_id
        return [{"type": "data-throttled", "data": data, "transient": True}]

    def _budget_wait(
        self, chunk: o.BudgetWait, tool_call_id: str | None = None
    ) -> list[dict[str, Any]]:
        # transient, as throttled: why a sub-agent's stream has stopped for now
        data: dict[str, Any] = {
            "step": chunk.step,
            "want": chunk.want,
            "available": chunk.available,
            "held": chunk.held,
            "ahead": chunk.ahead,
        }
        if tool_call_id is not None:  # a sub-agent's, nested under this call
            data["toolCallId"] = tool_call_id
        return [{"type": "data-budget-wait", "data": data, "transient": True}]

    def _steered(self, chunk: o.Steered) -> list[dict[str, Any]]:
        """A user message that joined the running turn: a transient data part (the AI
        SDK hands it to ``onData``, it is no part of the assistant message), which the
        page shows as the user's bubble; the stored session has it as a user message."""
        data = {"messageId": chunk.message_id, "text": chunk.text, "step": chunk.step}
        if chunk.answer_id:  # where the turn's answer goes on (stored after the message)
            data["answerId"] = chunk.answer_id
        if chunk.answered:  # (a retry of a message an earlier turn stored and answered)
            data["answered"] = True
        return [{"type": "data-steered", "id": chunk.message_id, "data": data, "transient": True}]

    def _reset(self, chunk: o.ResetStep) -> list[dict[str, Any]]:
        # the AI SDK drops the step's parts itself; the reason goes to onData only
        self.restart_step(chunk.step)
        info = chunk.error
        data = {
            "step": chunk.step,
            "provider": chunk.provider,
            "errorText": error_text(info.kind, info.message),
        }
        return [
            {"type": "reset-step"},
            {"type": "data-reset-step", "data": data, "transient": True},
        ]

    def restart_step(self, step: int) -> None:
        """Step ``step`` starts, or starts over: its reasoning parts count from 0."""
        self._reasoning_count.pop(step, None)

    def _step_start(self, chunk: o.StepStart) -> list[dict[str, Any]]:
        self.restart_step(chunk.step)
        return [{"type": "start-step"}]

    def _reasoning_start(self, chunk: o.ReasoningStart) -> list[dict[str, Any]]:
        ui_id = chunk.part_id
        if self._message_id is not None:
            k = self._reasoning_count.get(chunk.step, 0)
            self._reasoning_count[chunk.step] = k + 1
            ui_id = reasoning_ui_id(self._message_id, chunk.step, k)
        self._reasoning_ids[chunk.part_id] = ui_id
        return [{"type": "reasoning-start", "id": ui_id}]

    def _reasoning_delta(self, chunk: o.ReasoningDelta) -> list[dict[str, Any]]:
        ui_id = self._reasoning_ids.get(chunk.part_id, chunk.part_id)
        return [{"type": "reasoning-delta", "id": ui_id, "delta": chunk.text}]

    def _reasoning_finish(self, chunk: o.ReasoningFinish) -> list[dict[str, Any]]:
        ui_id = self._reasoning_ids.pop(chunk.part_id, chunk.part_id)
        return [{"type": "reasoning-end", "id": ui_id}]

    def _tool_input_start(self, chunk: o.ToolInputStart) -> list[dict[str, Any]]:
        return [
            {
                "type": "tool-input-start",
                "toolCallId": chunk.tool_call_id,
                "toolName": chunk.tool_name,
            }
        ]

    def _tool_input_delta(self, chunk: o.ToolInputDelta) -> list[dict[str, Any]]:
        return [
            {
                "type": "tool-input-delta",
                "toolCallId": chunk.tool_call_id,
                "inputTextDelta": chunk.delta,
            }
        ]

    def _tool_call(self, chunk: o.ToolCall) -> list[dict[str, Any]]:
        call = chunk.tool_call_id
        self._announced.add(call)
        if self._signer is not None:
            self._inputs[call] = chunk.input
        if "." in call:
            shown = self._input_available(call, chunk.tool_name, chunk.input)
            return [*self._server_runs(call.partition(".")[0]), shown]
        self._calls[call] = chunk
        return [self._input_available(call, chunk.tool_name, chunk.input)]

    def _server_runs(self, call: str) -> list[dict[str, Any]]:
        """The calling call ``call`` of a sub-agent's client tool call passed up
        (``<call>.<sub call>``), shown again as run by the server (``providerExecuted``,
        its input or preliminary output as shown; the ``ai`` package keeps the mark on
        the part): ``useChat``'s ``lastAssistantMessageIsCompleteWithToolCalls``, which
        leaves such parts out, then waits for the sub call's output alone (the calling
        call, in the step with no output, kept it from sending the continuation).
        Nothing for a call this stream did not show (a continuation's: the client has
        it marked already)."""
        if call in self._streamed:
            return [
                {
                    "type": "tool-output-available",
                    "toolCallId": call,
                    "output": self._streamed[call],
                    "preliminary": True,
                    "providerExecuted": True,
                }
            ]
        shown = self._calls.get(call)
        if shown is None:
            return []
        ui = self._input_available(call, shown.tool_name, shown.input)
        return [{**ui, "providerExecuted": True}]

    def _tool_result(self, chunk: o.ToolResult) -> list[dict[str, Any]]:
        return [
            *self._announce(chunk),
            {
                "type": "tool-output-available",
                "toolCallId": chunk.tool_call_id,
                "output": ui_output(chunk.output),
            },
        ]

    def _tool_error(self, chunk: o.ToolError) -> list[dict[str, Any]]:
        return [
            *self._announce(chunk),
            {
                "type": "tool-output-error",
                "toolCallId": chunk.tool_call_id,
                "errorText": chunk.error,
            },
        ]

    def _announce(self, chunk: o.ToolResult | o.ToolError) -> list[dict[str, Any]]:
        """A ``tool-input-available`` for a call the stream never announced (the AI SDK
        rejects a result for an unknown call), else nothing."""
        if chunk.tool_call_id in self._announced:
            return []
        self._announced.add(chunk.tool_call_id)
        return [self._input_available(chunk.tool_call_id, chunk.tool_name, None)]

    def unsigned(self, chunk: Any) -> bool:
        """Whether ``chunk`` is an approval request this encoder would send unsigned
        though it has a signer: its call's input never went through it (a stream
        resumed after the call, :mod:`runtime.app.web.resume`, which then learns the
        stored input with :meth:`learn_input`)."""
        return (
            type(chunk) is o.ToolApprovalRequest
            and self._signer is not None
            and chunk.tool_call_id not in self._inputs
        )

    def learn_input(self, tool_call_id: str, input: Any) -> None:
        """Sign the approval request of call ``tool_call_id`` over ``input`` (the call as
        the store holds it), as if the stream had shown it."""
        if self._signer is not None:
            self._inputs[tool_call_id] = input

    def _tool_approval_request(self, chunk: o.ToolApprovalRequest) -> list[dict[str, Any]]:
        """The request; signed (a signer) over the input this stream showed the call
        with (or :meth:`learn_input` gave it: a stream read from after the call, a
        resume); the session's ``ui_messages`` carry the same signature."""
        ui: dict[str, Any] = {
            "type": "tool-approval-request",
            "approvalId": chunk.approval_id,
            "toolCallId": chunk.tool_call_id,
        }
        call = chunk.tool_call_id
        if chunk.asked_tool is not None:  # a sub-agent's approval: the call that asks
            ui["approvalDescriptor"] = asked_descriptor(
                chunk.asked_tool, chunk.asked_input, chunk.asked_via
            )
        if self._signer is not None and call in self._inputs:
            ui["signature"] = self._signer.sign(
                chunk.approval_id, call, chunk.tool_name, self._inputs[call]
            )
        return [ui]

    def _tool_output_denied(self, chunk: o.ToolOutputDenied) -> list[dict[str, Any]]:
        return [{"type": "tool-output-denied", "toolCallId": chunk.tool_call_id}]

    def _tool_stream(self, chunk: o.ToolStream) -> list[dict[str, Any]]:
        """A running tool's own stream (an agent used as a tool): its text so far, as the
        AI SDK's preliminary tool output; the final result replaces it."""
        inner = chunk.chunk
        if type(inner) is not o.TextDelta:
            while type(inner) is o.ToolStream:  # (a sub-agent's sub-agent's)
                inner = inner.chunk
            # why its stream stopped: shown, not dropped
            if type(inner) is o.BudgetWait:
                return self._budget_wait(inner, chunk.tool_call_id)
            if type(inner) is o.Throttled:
                return self._throttled(inner, chunk.tool_call_id)
            return []
        text = self._streamed.get(chunk.tool_call_id, "") + inner.text
        self._streamed[chunk.tool_call_id] = text
        return [
            {
                "type": "tool-output-available",
                "toolCallId": chunk.tool_call_id,
                "output": text,
                "preliminary": True,
            }
        ]

    def _start(self, chunk: o.Start) -> list[dict[str, Any]]:
        self._message_id = chunk.message_id
        return [{"type": "start", "messageId": chunk.message_id}]

    def _finish(self, chunk: o.Finish) -> list[dict[str, Any]]:
        reason = chunk.finish_reason
        ui_reason = "tool-calls" if reason == AWAITING_INPUT else reason
        return [
            {
                "type": "finish",
                "finishReason": ui_reason if ui_reason in FINISH_REASONS else "other",
                "messageMetadata": {"finishReason": reason, "usage": _usage(chunk.usage)},
            }
        ]

    def _error(self, chunk: o.Error) -> list[dict[str, Any]]:
        info = chunk.error
        return [{"type": "error", "errorText": error_text(info.kind, info.message)}]

    def _abort(self, chunk: o.Abort) -> list[dict[str, Any]]:
        return [{"type": "abort", "reason": chunk.reason}]

    @staticmethod
    def _input_available(call_id: str, name: str, input: Any) -> dict[str, Any]:
        return {
            "type": "tool-input-available",
            "toolCallId": call_id,
            "toolName": name,
            "input": input,
        }

    def events(self, chunk: Any) -> bytes:
        """The SSE bytes for one ``OutputChunk`` (``b""`` when it maps to nothing)."""
        return b"".join(sse(c) for c in self.encode(chunk))


_Encode = Callable[[UIStreamEncoder, Any], list[dict[str, Any]]]


def _only_type(ui_type: str) -> _Encode:
    """The encoding of a chunk that maps to a bare UI chunk of ``ui_type``."""
    return lambda encoder, chunk: [{"type": ui_type}]


def _part_edge(ui_type: str) -> _Encode:
    """The encoding of a part's start or end: ``ui_type`` with the part's id."""
    return lambda encoder, chunk: [{"type": ui_type, "id": chunk.part_id}]


_ENCODERS: dict[type, _Encode] = {
    o.Start: UIStreamEncoder._start,
    o.StepStart: UIStreamEncoder._step_start,
    o.TextStart: _part_edge("text-start"),
    o.TextFinish: _part_edge("text-end"),
    o.ObjectDelta: UIStreamEncoder._object_delta,
    o.Throttled: UIStreamEncoder._throttled,
    o.BudgetWait: UIStreamEncoder._budget_wait,
    o.Steered: UIStreamEncoder._steered,
    o.ResetStep: UIStreamEncoder._reset,
    o.ReasoningStart: UIStreamEncoder._reasoning_start,
    o.ReasoningDelta: UIStreamEncoder._reasoning_delta,
    o.ReasoningFinish: UIStreamEncoder._reasoning_finish,
    o.ToolInputStart: UIStreamEncoder._tool_input_start,
    o.ToolInputDelta: UIStreamEncoder._tool_input_delta,
    o.ToolCall: UIStreamEncoder._tool_call,
    o.ToolResult: UIStreamEncoder._tool_result,
    o.ToolError: UIStreamEncoder._tool_error,
    o.ToolApprovalRequest: UIStreamEncoder._tool_approval_request,
    o.ToolOutputDenied: UIStreamEncoder._tool_output_denied,
    o.ToolStream: UIStreamEncoder._tool_stream,
    o.StepFinish: _only_type("finish-step"),
    o.Finish: UIStreamEncoder._finish,
    o.Error: UIStreamEncoder._error,
    o.Abort: UIStreamEncoder._abort,
}
"""How each ``OutputChunk`` type is encoded (the mapping in the module docstring); a type
not here maps to nothing."""


def encode_turn(chunks: Iterable[Any]) -> list[dict[str, Any]]:
    """Every UI message stream chunk of a whole turn (a convenience for tests and tools)."""
    encoder = UIStreamEncoder()
    return [ui for chunk in chunks for ui in encoder.encode(chunk)]


# -- stored history -> UIMessage ----------------------------------------------------------


def _tool_part(
    call: ToolCallPart, result: ToolMessage | None, signer: SessionSigner | None
) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": f"tool-{call.tool_name}",
        "toolCallId": call.tool_call_id,
        "input": call.input,
    }
    waiting = call.awaiting
    if waiting is not None and waiting.kind == "approval":
        approval: dict[str, Any] = {"id": waiting.id}
        if signer is not None and result is None:  # (a call with its result needs none)
            # as the stream's request had it: a reloaded page echoes it with its answer
            approval["signature"] = signer.sign(
                waiting.id, call.tool_call_id, call.tool_name, call.input
            )
        if waiting.asked_tool is not None:  # passed up: the sub call, as the stream said
            approval["descriptor"] = asked_descriptor(
                waiting.asked_tool, waiting.asked_input, waiting.asked_via
            )
        if waiting.decided:
            approval["approved"] = bool(waiting.approved)
            if waiting.reason is not None:
                approval["reason"] = waiting.reason
        part["approval"] = approval
        if waiting.original_input is not None:  # approved with edits: ``input`` ran
            # (``toolMetadata``: the UIMessage's own place for app data on a tool part,
            # which the ``ai`` package's validateUIMessages takes)
            part["toolMetadata"] = {"axonOriginalInput": waiting.original_input}
        elif waiting.edited_input is not None:  # a passed-up approval approved with edits:
            # the sub call's input is the edit (``input`` here is the agent tool's prompt)
            part["toolMetadata"] = {ASKED_EDIT: waiting.edited_input}
        if result is None:
            part["state"] = "approval-responded" if waiting.decided else "approval-requested"
            return part
        if waiting.decided and not waiting.approved:
            part["state"] = "output-denied"
            return part
    if result is None:
        part["state"] = "input-available"
    elif result.error is not None:
        part["state"] = "output-error"
        part["errorText"] = result.error
    else:
        part["state"] = "output-available"
        part["output"] = ui_output(result.output)
    return part


def _sub_tool_part(waiting: Awaiting) -> dict[str, Any]:
    """The part of a sub-agent's client tool call that an agent tool's call waited for
    (``Awaiting.sub_tool``), as the stream showed it (its id the wait's), with the
    caller's answer once given: a reloaded page can still answer it."""
    part: dict[str, Any] = {
        "type": f"tool-{waiting.sub_tool}",
        "toolCallId": waiting.id,
        "input": waiting.sub_input,
        "state": "input-available",
    }
    if waiting.decided and waiting.error is not None:
        part["state"] = "output-error"
        part["errorText"] = waiting.error
    elif waiting.decided:
        part["state"] = "output-available"
        part["output"] = ui_output(waiting.output)
    return part


def _assistant(
    message: AssistantMessage, results: dict[str, ToolMessage], signer: SessionSigner | None
) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    for step in message.steps():
        parts.append({"type": "step-start"})
        k = 0
        for p in step:
            if isinstance(p, TextPart):
                parts.append({"type": "text", "text": p.text, "state": "done"})
            elif isinstance(p, ReasoningPart):
                # as the stream built it: its id, and a part even with no text to show
                # (redacted or encrypted reasoning streams a start and an end)
                ui_id = reasoning_ui_id(message.id, p.step, k)
                k += 1
                parts.append({"type": "reasoning", "id": ui_id, "text": p.text, "state": "done"})
            elif isinstance(p, ToolCallPart):
                part = _tool_part(p, results.get(p.tool_call_id), signer)
                parts.append(part)
                w = p.awaiting
                if w is not None and (w.sub_tool is not None or w.sub_answered):
                    part["providerExecuted"] = True  # (as the stream marked it)
                    # each sub call the stream showed, in turn: those answered before
                    parts.extend(_sub_tool_part(a) for a in w.sub_answered)
                    if w.sub_tool is not None:
                        parts.append(_sub_tool_part(w))
            # provider-data parts are opaque to a UI
    metadata: dict[str, Any] = {"interrupted": message.interrupted}
    if message.error is not None:  # failed: not interrupted, and the UI can say why
        metadata["failed"] = True
        metadata["errorText"] = error_text(message.error.kind, message.error.message)
    if message.usage is not None:  # as the stream's finish gave it (tokens and cost)
        metadata["usage"] = _usage(message.usage)
    return {"id": message.id, "role": "assistant", "parts": parts, "metadata": metadata}


def ui_parts(content: UserContent) -> list[dict[str, Any]]:
    """User content as ``UIMessage`` parts: ``text`` parts, and ``file`` parts
    (``mediaType``, ``url``: a data URL for inline bytes, ``filename`` when known), the
    shape ``useChat`` sends an attachment in."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    parts: list[dict[str, Any]] = []
    for p in content:
        if isinstance(p, TextPart):
            parts.append({"type": "text", "text": p.text})
        else:
            part = {"type": "file", "mediaType": p.media_type, "url": p.data_url()}
            if isinstance(p, File) and p.filename:
                part["filename"] = p.filename
            parts.append(part)
    return parts


def ui_output(output: Any) -> Any:
    """A tool's output for the UI: media parts as :func:`ui_parts`, anything else as is."""
    return ui_parts(output) if is_media_output(output) else output


def handed_over(chunk: o.Steered) -> bytes:
    """The end of a stream whose client steered message ``chunk.message_id`` into the
    turn and reads the rest of it from that message's own stream (``follow``): a
    ``finish`` (``finishReason`` ``other``; ``messageMetadata.finishReason``
    ``steered``, with the message's id and ``answerId``, the answer's message), then
    ``[DONE]``. ``useChat`` ends this message there, and shows the rest in the message
    after the one it sent, as the session stores it."""
    meta: dict[str, Any] = {
        "finishReason": "steered",
        "steeredBy": chunk.message_id,
        "answerId": chunk.answer_id,
    }
    if chunk.answered:
        meta["answered"] = True
    return sse({"type": "finish", "finishReason": "other", "messageMetadata": meta}) + DONE


def ui_messages(
    messages: Sequence[Message], signer: SessionSigner | None = None
) -> list[dict[str, Any]]:
    """A stored history as AI SDK ``UIMessage`` s: the tool results folded into their
    calls' tool parts, a ``step-start`` part before each step; with ``signer`` (the
    session's), each approval of a call with no result yet (one a client may still
    answer) with the ``signature`` its request was streamed with."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if isinstance(m, UserMessage | SystemMessage):
            out.append({"id": m.id, "role": m.role, "parts": ui_parts(m.content)})
        elif isinstance(m, AssistantMessage):
            out.append(_assistant(m, _results_of(messages, i), signer))
    return out


def _results_of(messages: Sequence[Message], index: int) -> dict[str, ToolMessage]:
    """The results of the calls of the assistant message at ``index``: the tool messages
    that follow it, up to the next user or assistant message. A call id is unique within
    a turn only (a provider may number its calls ``call_1``, ``call_2`` in every turn):
    one map for the whole history gave each earlier call the last turn's result."""
    results: dict[str, ToolMessage] = {}
    for m in messages[index + 1 :]:
        if isinstance(m, ToolMessage):
            results.setdefault(m.tool_call_id, m)
        elif isinstance(m, UserMessage | AssistantMessage):
            break
    return results
