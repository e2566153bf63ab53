"""The AG-UI endpoint: CopilotKit and every other AG-UI client can run an Axon agent.

Mounted at ``POST /ag-ui`` by ``serve --protocols ag-ui`` (:mod:`runtime.app.web.protocols`).
The body is a ``RunAgentInput``; the answer streams the run as AG-UI events over SSE
(:mod:`runtime.app.web.agui_wire` maps them). It is a thin adapter over the same turn
machinery as ``POST /api/chat``: the turn runs through ``session.stream`` (or
``session.resume``) and streams through the app's :class:`~runtime.app.web.app.TurnResponse`
with AG-UI's encoder: keep-alive comments, a client that disconnects cancels the turn
(saved, marked interrupted), a client that stops reading is dropped after
``send_timeout``.

``threadId`` is the session (stored like a chat-page session); ``runId`` the turn's id.
The server keeps the history, so of ``messages`` it reads only what is new:

* the last message is a user message the thread does not hold: a new turn with it (on a
  thread that does not exist yet, the messages before it start its history);
* the last message is a tool message, or ``resume`` is given: the answers for a turn that
  waits (docs/approval.md): each tool message after the last user message answers a
  client-side tool call (its text is the output; ``error`` makes it a failure), named by
  its wire id (``<message id>.s<step>.<call id>``, :func:`~runtime.app.web.agui_wire.
  wire_call_id`, what the run streamed it as) or, for the waiting turn's, its call id
  alone, each
  ``resume`` entry an approval's interrupt (``{"approved": bool, "reason"?: str}``, or
  ``status: cancelled``, a denial). They must answer every call the turn waits for; all
  are checked before any is recorded, then the turn's continuation streams;
* anything else (no new message: a client reconnecting, a replayed request) is answered
  with the thread as it is: ``RUN_STARTED``, ``MESSAGES_SNAPSHOT``, ``RUN_FINISHED``.

``tools`` are client-side tools (:meth:`runtime.tools.Tool.client`) offered for this run
only: a call to one ends the run with the success outcome naming it in
``pendingToolCallIds`` (the spec's frontend-tool round trip), and the next run answers it
with a tool message. A call that needs approval ends it with the interrupt outcome.
``context`` is added to the agent's instructions for the run. ``state`` and
``forwardedProps`` are accepted and not read.

Input refused before the run starts is an HTTP error with no event stream (the HTTP
binding's rule), ``{"error": message, "code": code}``, and records nothing: a malformed
body 400, a missing or wrong token 401, a body not sent as JSON 415, an unknown tool
call answered 404, a new message while an approval waits (or answers that leave a call
waiting) 409 ``interrupt_pending``, a thread running a turn 409 ``thread_busy``. The Host
and Origin checks of the whole app (:mod:`runtime.app.web.guard`) apply before these.

In a worker deployment's front end (``state.front``) no session opens here: a new turn
is queued for the workers, carrying the run's client tools, ``context``, the client's id
of its user message and a new thread's history (:class:`runtime.turn_queue.TurnOptions`),
answers are recorded through the queue, and the run streams from the relay through the
same encoder (:mod:`runtime.app.web.queued_turn`). The continuation of a turn that
waited is offered the tools of the run that started it.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable, Container, Mapping, Sequence
from functools import partial
from typing import Any

import orjson
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp

from runtime.app.web.agui_input import (
    AGUIError,
    RunInput,
    approval_answer,
    bad_input,
    history_of,
    parse_run_input,
    tool_answer,
    user_input,
)
from runtime.app.web.agui_wire import (
    RunEncoder,
    agui_messages,
    finished,
    legacy_wire_ids,
    looks_derived,
    pending_wire_id,
    snapshot_id,
    sse,
    stored_message_id,
    thread_calls,
)
from runtime.app.web.answers import checked_decisions
from runtime.app.web.chat_body import not_json
from runtime.app.web.chat_input import INLINE_BODY, _read_body, check_json_values, off_loop
from runtime.app.web.frontend import message_key
from runtime.app.web.guard import is_json
from runtime.app.web.http import CLOSING_RETRY_AFTER, ApiError, closing_message
from runtime.app.web.queued_turn import QueuedStreamResponse, QueuedTurnOutput
from runtime.app.web.resend import unrelayed_turn_id as _unrelayed
from runtime.approval import (
    APPROVAL,
    Decision,
    PendingCall,
    output_check,
    same_input,
    waiting_calls,
)
from runtime.busy import REJECT
from runtime.errors import (
    AlreadyDecided,
    CallerDecides,
    DecisionError,
    HostClosed,
    InvalidDecision,
    InvalidHistory,
    InvalidMedia,
    InvalidSessionId,
    MediaTooLarge,
    SessionBusy,
    SessionNotLoaded,
    TooManyParts,
    UnknownApproval,
    WaitExpired,
)
from runtime.liveness import answering_elsewhere
from runtime.media import check_limits, user_content
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    Message,
    ReasoningPart,
    ToolCallPart,
    ToolMessage,
    UserContent,
    UserMessage,
)
from runtime.serde import exact, lost_int, utf8_dumps
from runtime.store import SessionRecord, validate_session_id
from runtime.turn_queue import ClientToolSpec, TurnOptions

PATH = "/ag-ui"

HEADERS: dict[str, str] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}

_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""What the runtime takes as a turn or message id (a client's that is not is replaced)."""

_DECISION_STATUS: dict[type, int] = {
    UnknownApproval: 404,
    AlreadyDecided: 409,
    WaitExpired: 409,
    CallerDecides: 409,
}


def _decision_error(exc: DecisionError, named: Mapping[str, str] | None = None) -> AGUIError:
    """A decision the session refused as the run recorded it, in the endpoint's shape.
    A plain :class:`AlreadyDecided` there is another run's answer recorded since this
    run read the thread (two clients answering at once): ``already_answered``, the
    code the same answer gets when it comes after, not the error's class name.

    ``named``: the id the client sent for each call the session decides by another
    (:func:`_tool_answers`: a wire id for the stored call id): the session's message
    names the call by its key, which the client never sent, so it is named as sent."""
    code = "already_answered" if type(exc) is AlreadyDecided else exc.kind
    message = str(exc)
    for key, sent in (named or {}).items():
        message = message.replace(repr(key), repr(sent))
    return AGUIError(_DECISION_STATUS.get(type(exc), 400), message, code)


def error_response(error: AGUIError, headers: dict[str, str] | None = None) -> Response:
    return Response(
        utf8_dumps(error.body()),  # a refusal may quote half a character (a stored name)
        status_code=error.status,
        headers=headers,
        media_type="application/json",
    )


def _busy(session: Any, why: str | None = None) -> Response:
    return error_response(
        AGUIError(409, why or f"thread {session.id!r} is running a run already", "thread_busy")
    )


def _closing(exc: Exception) -> Response:
    """A run refused as the host closes (``serve`` stopping): a 503 to send again, no
    event stream (the HTTP binding's rule for a refusal before the run starts)."""
    retry = {"retry-after": CLOSING_RETRY_AFTER}
    return error_response(AGUIError(503, closing_message(exc), "unavailable"), retry)


class StreamEncoder(RunEncoder):
    """The run's encoder as :class:`~runtime.app.web.app.TurnResponse` drives it: its
    ``final`` ends the stream (``RUN_FINISHED``) once the turn is saved."""

    def final(self, out: Any) -> bytes:
        try:
            messages: Sequence[Message] = out.session.messages
        except SessionNotLoaded:
            messages = ()
        return b"".join(sse(e) for e in self.closing(out.result, messages))


def snapshot_response(
    run: RunInput, messages: Sequence[Message], metadata: dict[str, Any] | None
) -> Response:
    """A run with nothing new to run: the thread as it is (a client reconnecting or
    replaying a request), ending as the thread's last turn ended (the interrupt outcome
    while an approval waits, ``pendingToolCallIds`` while a client tool call does)."""
    started: dict[str, Any] = {
        "type": "RUN_STARTED",
        "threadId": run.thread_id,
        "runId": run.run_id,
        "protocolVersion": "1.0",
    }
    if metadata:
        started["metadata"] = metadata
    pending = [c for c in waiting_calls(messages) if not c.decided]
    ends = [
        e
        for e in finished(run.thread_id, run.run_id, pending, messages)
        if e["type"] != "MESSAGES_SNAPSHOT"
    ]
    events = [started, {"type": "MESSAGES_SNAPSHOT", "messages": agui_messages(messages)}, *ends]
    return Response(b"".join(sse(e) for e in events), headers=HEADERS)


def _awaiting(messages: Sequence[Message]) -> dict[str, Awaiting]:
    return {
        p.tool_call_id: p.awaiting
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart) and p.awaiting is not None
    }


def _echoes(held: Awaiting | None, decision: Decision) -> bool:
    """Whether ``decision`` is the one recorded already: a replayed request repeats it."""
    return (
        held is not None
        and held.decided
        and (held.approved, held.output, held.error)
        == (decision.approved, decision.output, decision.error)
    )


def _same_edit(call: PendingCall, decision: Decision) -> bool:
    """Whether ``decision``'s edit (or none) is the one ``call`` was approved with: a
    replayed resume repeats it; a different edit of a decided call is another answer."""
    if call.asked_tool is not None:  # a sub-agent's approval: its sub call was edited
        if decision.edited_input is None:
            return call.edited_input is None
        ran = call.asked_input if call.edited_input is None else call.edited_input
        return same_input(decision.edited_input, ran)
    if decision.edited_input is None:
        return call.original_input is None
    return same_input(decision.edited_input, call.input)


OFF_LOOP_ANSWER_CHARS = 4_096
"""A run whose tool messages hold more text than this has its answers read and checked
against their tools' output schemas (:func:`_answers`) in a worker thread (the app's
``parse_limiter``), not on the event loop every session streams on: a 10 MB answer of
400,000 rows took 7.4 s to check. 4,096 characters of JSON hold at most 2,048 values,
about the 2,000 past which every other answer is checked in a thread
(:data:`~runtime.approval.LARGE_OUTPUT_NODES`, the AI SDK's and A2A's): at 16,384 an
answer of 1,589 rows (3,180 values) was read and checked on the loop."""


def _answer_chars(run: RunInput) -> int:
    """The characters of the run's tool messages' text."""
    chars = 0
    for m in run.messages:
        content = m.get("content") if m["role"] == "tool" else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p.get("text") or "") for p in content if isinstance(p, dict))
    return chars


def _answers(
    run: RunInput,
    messages: Sequence[Message],
    waiting: Sequence[PendingCall],
    tools: Mapping[str, Any],
) -> tuple[list[tuple[str, Decision]], list[str], dict[str, str]]:
    """The decisions the run's tool messages and resume entries carry for the waiting
    calls, the resume entries that name no interrupt of the thread (ignored, as the
    spec says a producer does), and the id each call was answered by where the session
    decides it by another (:func:`_tool_answers`). A tool message for an unknown call
    is a 404; one for an approval, or for a call that waits for nothing, a 409; an
    answer that differs from one recorded already, or a call answered twice, a 409;
    one its tool's output schema (of the agent's ``tools``) takes neither as text nor
    as JSON, a 400."""
    held = _awaiting(messages)
    named: dict[str, str] = {}
    answers = _tool_answers(run, messages, waiting, held, tools, named)  # (its errors win)
    resumed, ignored = _resume_answers(run, waiting, held)
    return [*answers, *resumed], ignored, named


def _tool_answers(
    run: RunInput,
    messages: Sequence[Message],
    waiting: Sequence[PendingCall],
    held: dict[str, Awaiting],
    tools: Mapping[str, Any],
    named: dict[str, str] | None = None,
) -> list[tuple[str, Decision]]:
    """The decisions the tool messages after the run's last user message carry for the
    waiting client tool calls (see :func:`_answers`): each message's text read by its
    tool's output schema (:func:`~runtime.app.web.agui_input.structured_output`).
    ``named`` is given the id the client sent for each call decided by another key.
    Two tool messages answering one call (by its wire id and by its call id, or one id
    twice) are a 409 ``already_answered`` naming the second as sent: the session was
    asked to decide the call twice and named it by its stored id, which the client
    never sent."""
    named = {} if named is None else named
    effective = [m for m in run.messages if m["role"] not in ("reasoning", "activity")]
    last_user = max((i for i, m in enumerate(effective) if m["role"] == "user"), default=-1)
    # A waiting call is answered under its wire id (``<message id>.s<step>.<call id>``,
    # agui_wire.wire_call_id), or its call id alone (a client holding a snapshot from
    # before wire ids): that of the turn that waits, whatever earlier turns' calls
    # share it. A sub-agent's client tool passed up goes by the id its call was
    # streamed with (``<call id>.<sub call id>``), not the agent tool's call id.
    by_call = {_key(c): c for c in waiting} | {pending_wire_id(c): c for c in waiting}
    wire_known, wire_answered = thread_calls(messages)
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    # a sub-agent's client calls answered (those before the one the call waits for now,
    # and its last once the call has its result): the snapshot lists their answers and a
    # client sends them back with the history (each was a 404)
    for call_id, wait in list(held.items()):
        answered.update(a.id for a in wait.sub_answered)
        if wait.sub_tool is not None and call_id in answered:
            answered.add(wait.id)
    known = {
        p.tool_call_id
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    }
    out: list[tuple[str, Decision]] = []
    sent: dict[str, str] = {}  # each call answered so far: the id it was answered by
    legacy: dict[str, str] | None = None  # (read when an id is neither: agui_wire's)
    for message in effective[last_user + 1 :]:
        if message["role"] != "tool":
            continue
        call_id = wire = message["toolCallId"]
        if call_id not in by_call and call_id not in wire_known:
            # a wire id as spelled before its message part was escaped (a dotted
            # message id): the call it names, when it names one
            legacy = legacy_wire_ids(messages) if legacy is None else legacy
            wire = legacy.get(call_id, call_id)
        call = by_call.get(wire)
        if call is None and wire in wire_known:  # a call of the thread that waits for nothing
            if wire in wire_answered:  # its result, sent back with the history
                continue
            raise AGUIError(409, f"tool call {call_id!r} waits for no answer", "not_waiting")
        if call_id in answered and (call is None or call.decided):
            # a result the thread holds already, sent back with the history; never a call
            # that waits now: a call id is unique in a turn only (a provider numbering
            # its calls ``call_0`` in every response), so an earlier turn's result under
            # the same id passed over this turn's answer, which no run could then give
            continue
        if call is None:
            if call_id in known:
                raise AGUIError(409, f"tool call {call_id!r} waits for no answer", "not_waiting")
            raise AGUIError(404, f"no tool call {call_id!r} in this thread", "unknown_tool_call")
        if call.kind == APPROVAL:
            raise AGUIError(
                409,
                f"tool call {call_id!r} waits for approval: answer its interrupt "
                f"({call.approval_id!r}) in 'resume'",
                "interrupt_pending",
            )
        check = output_check(tools.get(call.tool_name), call.sub_tool)
        try:
            output, error = tool_answer(message, check, call=call_id)
        except InvalidDecision as exc:
            raise _decision_error(exc) from None
        decision = Decision(
            output=output if error is None else None,
            error=error,
            has_output=error is None,
            output_checked=error is None and check is not None,  # (structured_output's)
        )
        if call.decided:  # (its wait is on the call's part: a passed-up one's, the agent tool's)
            if _echoes(held.get(call.tool_call_id), decision):
                continue
            raise AGUIError(409, f"tool call {call_id!r} was answered already", "already_answered")
        key = _key(call)
        if key in sent:
            raise AGUIError(
                409,
                f"tool call {call_id!r} was answered already in this run (by the tool "
                f"message for {sent[key]!r}): answer each call once",
                "already_answered",
            )
        sent[key] = call_id
        if call_id != key:
            named[key] = call_id
        out.append((key, decision))
    return out


def _resume_answers(
    run: RunInput, waiting: Sequence[PendingCall], held: dict[str, Awaiting]
) -> tuple[list[tuple[str, Decision]], list[str]]:
    """The decisions the run's resume entries carry for the waiting approvals, and the
    entries that name no interrupt of the thread (see :func:`_answers`)."""
    out: list[tuple[str, Decision]] = []
    ignored: list[str] = []
    by_interrupt = {c.approval_id: c for c in waiting if c.kind == APPROVAL}
    for entry in run.resume:
        call = by_interrupt.get(entry.interrupt_id)
        if call is None:
            ignored.append(entry.interrupt_id)
            continue
        approved, reason, edited = approval_answer(entry)
        decision = Decision(approved=approved, reason=reason, edited_input=edited)
        if call.decided:
            if _echoes(held.get(call.tool_call_id), decision) and _same_edit(call, decision):
                continue
            raise AGUIError(
                409, f"interrupt {entry.interrupt_id!r} was answered already", "already_answered"
            )
        out.append((entry.interrupt_id, decision))
    return out, ignored


def _key(call: PendingCall) -> str:
    """What the session decides a waiting client call by: its call id, or a sub-agent's
    passed-up call's own (``<call id>.<sub call id>``)."""
    return call.approval_id if call.sub_tool else call.tool_call_id


def _uncovered(
    waiting: Sequence[PendingCall], answers: Sequence[tuple[str, Decision]]
) -> list[PendingCall]:
    keys = {key for key, _ in answers}
    return [
        c
        for c in waiting
        if not c.decided and c.approval_id not in keys and c.tool_call_id not in keys
    ]


def _pending_refusal(calls: Sequence[PendingCall]) -> AGUIError:
    approvals = [c.approval_id for c in calls if c.kind == APPROVAL]
    # (the ids the client answers: wire ids, a sub-agent's client call passed up by its own)
    client = [pending_wire_id(c) for c in calls if c.kind != APPROVAL]
    said = []
    if approvals:
        said.append(f"interrupts {approvals} (answer them in 'resume')")
    if client:
        said.append(f"tool calls {client} (answer each with a tool message)")
    return AGUIError(
        409,
        "the thread waits for " + " and ".join(said) + ": a run must answer all of them",
        "interrupt_pending",
    )


def _reasoning_count(messages: Sequence[Message], message_id: str) -> int:
    for m in messages:
        if isinstance(m, AssistantMessage) and m.id == message_id:
            return sum(isinstance(p, ReasoningPart) for p in m.content)
    return 0


MEDIA_PARTS = frozenset({"image", "audio", "video", "document"})


def _check_counts(messages: Sequence[dict[str, Any]], limits: Any) -> None:
    """413 when a user message has more parts (or media) than the host's
    ``input_limits``, counted before any part is decoded."""
    for m in messages:
        content = m.get("content")
        if m["role"] == "user" and isinstance(content, list):
            try:
                limits.check(len(content), sum(p["type"] in MEDIA_PARTS for p in content))
            except TooManyParts as exc:
                raise AGUIError(413, str(exc), "too_many_parts") from None


INLINE_MESSAGES = 1000
"""A history longer than this is converted off the event loop (:func:`off_loop`)."""


def _ids(messages: Sequence[Message]) -> set[str]:
    return {m.id for m in messages}


def _seed(earlier: Sequence[dict[str, Any]], limits: Any) -> tuple[Message, ...]:
    """A new thread's history from the client's ``earlier`` messages, their parts
    counted first (:func:`_check_counts`)."""
    _check_counts(earlier, limits)
    return history_of(earlier)


def _json_body(raw: bytes) -> Any:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_input(not_json(exc)) from None
    # A resume's payload (an edit's editedArgs) is JSON, not text, and so are the client
    # tools' schemas (a bound past 64 bits): read exactly when orjson made an integer
    # past 64 bits a float (only they are walked, not the history).
    if type(payload) is dict and (
        lost_int(payload.get("resume")) or lost_int(payload.get("tools"))
    ):
        return exact(payload, raw)
    return payload


def _checked_run(payload: Any) -> tuple[RunInput, list[dict[str, Any]]]:
    """The checked body, and its messages but reasoning and activity ones."""
    run = parse_run_input(payload)
    return run, [m for m in run.messages if m["role"] not in ("reasoning", "activity")]


def _run_input(raw: bytes) -> tuple[RunInput, list[dict[str, Any]]]:
    return _checked_run(_json_body(raw))


def _declares_tools(payload: Any) -> bool:
    """Whether the body declares client tools, whose schemas are checked off the loop
    however small the body (:func:`runtime.app.web.agui_input.client_tools`)."""
    return isinstance(payload, dict) and bool(payload.get("tools"))


def _valid_id(value: str) -> str | None:
    return value if _ID.fullmatch(value) else None


def _check_sent_again(run: RunInput, stored: Sequence[Message], last: dict[str, Any]) -> None:
    """409 ``id_taken`` for a run's last user message whose id the thread stores for
    another message: an answer's (or any not a user message), or a user message that
    says something else. Not a replay then (which the thread's snapshot answers) but a
    new message, which that answer would drop unseen; as the AI SDK endpoint refuses
    an earlier message's id (:func:`~runtime.app.web.resend.classify_resend`). Read
    only for a last user message the thread holds (a replayed run), from the end."""
    message_id = stored_message_id(last["id"])
    held = next((m for m in reversed(stored) if m.id == message_id), None)
    if held is None:  # (a snapshot's id of an assistant message's part: not a user's)
        return
    if isinstance(held, UserMessage):
        try:
            says = user_content(_new_user_input(run, last))
        except AGUIError:
            says = None
        if says == held.content:
            return
    raise AGUIError(
        409,
        f"message {last['id']!r} is the id of another message of thread "
        f"{run.thread_id!r} (an answer's, or an earlier message that said something "
        "else): send the new message under a new id",
        "id_taken",
    )


def _new_user_input(run: RunInput, message: dict[str, Any]) -> UserContent:
    """The new user message's content as user input; 400 when it has none."""
    # (found by identity from the end, where it is: not compared with every message)
    index = next(i for i in range(len(run.messages) - 1, -1, -1) if run.messages[i] is message)
    text = user_input(message["content"], f"messages[{index}].content")
    if not (text.strip() if isinstance(text, str) else text):
        raise bad_input(f"'messages[{index}]' (the new user message) has no content")
    return text


def _check_media(text: UserContent, agent: Any) -> None:
    """413 for media over the agent's limits, 400 for media that cannot be read."""
    try:
        check_limits(text, agent.media_limits)
    except MediaTooLarge as exc:
        raise AGUIError(413, exc.message, "media_too_large") from None
    except InvalidMedia as exc:
        raise bad_input(exc.message) from None


def _resync(
    stored: Sequence[Message],
    earlier: Sequence[dict[str, Any]],
    *,
    message: dict[str, Any],
    user_id: str | None,
) -> list[dict[str, Any]]:
    """A ``MESSAGES_SNAPSHOT`` of the thread and its new message when the client holds
    another history than the thread's (it resynchronises the client), else nothing."""
    held = [m for m in stored if isinstance(m, UserMessage | AssistantMessage)]
    if not held:  # a new thread: nothing the client could miss
        return []
    client_ids = {m["id"] for m in earlier}
    # (a client holds a message under the id it sent, or a snapshot's: agui_wire.snapshot_id)
    if all(m.id in client_ids or snapshot_id(m.id) in client_ids for m in held):
        return []
    mine = {**message, "id": snapshot_id(user_id)} if user_id else message
    return [{"type": "MESSAGES_SNAPSHOT", "messages": [*agui_messages(stored), mine]}]


class AGUIRoutes:
    """``POST /ag-ui`` over the app's :class:`~runtime.app.web.app.WebState`."""

    def __init__(self, state: Any, stream: Any, token: str | None) -> None:
        self.state = state
        self.stream = stream
        """The app's turn-streaming response (:class:`runtime.app.web.app.TurnResponse`)."""
        self.token = token.encode() if token else None

    async def endpoint(self, request: Request) -> Any:
        try:
            return await self.run(request)
        except AGUIError as exc:
            headers = {"www-authenticate": "Bearer"} if exc.status == 401 else exc.headers
            return error_response(exc, headers)
        except HostClosed as exc:  # its session opened on a host closed already
            return _closing(exc)

    def _check_request(self, request: Request) -> None:
        if self.token is not None:
            scheme, _, credentials = (
                request.headers.get("authorization", "").encode("latin-1").partition(b" ")
            )
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credentials.strip(), self.token
            ):
                raise AGUIError(401, "missing or wrong bearer token", "unauthorized")
        if not is_json(request.headers.get("content-type")):
            raise AGUIError(415, "the body must be sent as content-type: application/json")

    async def run(self, request: Request) -> Any:
        state = self.state
        self._check_request(request)
        if state.front is not None:  # closing: 503 before the body is read
            state.front.check_open()
        try:
            raw = await _read_body(request, state.max_body, state.body_timeout, state.body_budget)
            await check_json_values(raw, state)
        except ApiError as exc:
            raise AGUIError(exc.status, exc.message, headers=exc.headers) from None
        if len(raw) > INLINE_BODY:
            run, effective = await off_loop(_run_input, raw, big=True, state=state)
        else:  # client tools' schemas take ~0.5 ms each to check: off the loop too
            payload = _json_body(raw)
            run, effective = await off_loop(
                _checked_run, payload, big=_declares_tools(payload), state=state
            )
        try:
            session_id = validate_session_id(run.thread_id)
        except InvalidSessionId as exc:
            raise bad_input(f"threadId: {exc}", "invalid_thread_id") from None
        if await self._busy(session_id):
            raise AGUIError(409, f"thread {session_id!r} is running a run already", "thread_busy")
        record = await self._stored(session_id)
        stored: tuple[Message, ...] = record.messages if record is not None else ()
        version = record.version if record is not None else 0
        last = effective[-1] if effective else None
        # (a thread's stored history is as long as the one a client posted to start it)
        held_ids = await off_loop(_ids, stored, big=len(stored) > INLINE_MESSAGES, state=state)
        new_user = (
            last is not None
            and last["role"] == "user"
            and stored_message_id(last["id"]) not in held_ids  # (as a snapshot wrote it)
        )
        if last is not None and last["role"] == "user" and not new_user and not run.resume:
            _check_sent_again(run, stored, last)
        if run.resume or (last is not None and last["role"] == "tool"):
            if new_user:
                raise bad_input(
                    "a run that answers waiting calls carries no new user message: send it "
                    "in the next run",
                    "unexpected_user_message",
                )
            return await self._continue(run, session_id, stored, version)
        if new_user:
            assert last is not None
            return await self._new_turn(
                run, session_id, stored, effective, record is None, held_ids
            )
        if record is not None and answering_elsewhere(record.meta, self.state.host.marker_id):
            # Not the claimed empty answer as the thread's snapshot (a 200 saying nothing):
            # the thread runs on another server (two ``serve`` on one file), as _busy's.
            raise AGUIError(
                409,
                f"thread {session_id!r} is running a run on another server (the same "
                "message was sent to two at once): reconnect once it is done",
                "thread_busy",
            )
        current = tuple(self._current(session_id, stored, version))  # the thread's own copy
        reply = partial(snapshot_response, run, metadata=None)
        return await off_loop(reply, current, big=len(current) > INLINE_MESSAGES, state=state)

    async def _stored(self, session_id: str) -> SessionRecord | None:
        """The thread as stored: the history of its session open here when that holds
        all of it at the version the store is at (``Session.held_record``, checked by a
        version query: one key's probe), else read whole. A client's every run read the
        whole thread (a 5,000-message one ~1.5 MB a run), which the process held."""
        store = self.state.host.store
        session = self.state.host.sessions.get(session_id)
        held = session.held_record() if session is not None else None
        if held is not None and await store.version(session_id) == held.version:
            return held  # type: ignore[no-any-return]
        return await self.state.host.load_settled(session_id)  # type: ignore[no-any-return]

    async def _busy(self, session_id: str) -> bool:
        """Whether the thread runs a turn: here, or (a worker deployment's front end)
        queued or running on the workers."""
        front = self.state.front
        if front is not None:
            return await front.queue.active(session_id) is not None
        open_session = self.state.host.sessions.get(session_id)
        return open_session is not None and bool(open_session.busy)

    def _current(
        self, session_id: str, stored: tuple[Message, ...], version: int
    ) -> Sequence[Message]:
        """The thread's history: the open session's (ahead of the store while a turn
        runs, or a save failed), else the stored one (at ``version``), also when another
        process saved the thread since the session here last read it: two ``serve`` on
        one SQLite file, a run sent again to the other one than ran it was answered with
        the snapshot of a history without that run's turn, which the client took."""
        session = self.state.host.sessions.get(session_id)
        if session is not None:
            try:
                if session.state.version >= version:
                    return session.messages  # type: ignore[no-any-return]
            except SessionNotLoaded:
                pass
        return stored

    def _encoder(
        self,
        run: RunInput,
        agent: Any,
        *,
        reasoning_base: int = 0,
        prelude: Sequence[dict[str, Any]] = (),
        metadata: dict[str, Any] | None = None,
        answered: Sequence[str] = (),
    ) -> Callable[[], StreamEncoder]:
        provider = self.state.host.provider_of(agent)  # its own, or its model's

        def make() -> StreamEncoder:
            return StreamEncoder(
                run.thread_id,
                run.run_id,
                provider=getattr(provider, "provider_name", None),
                model=getattr(provider, "model", None) or None,
                reasoning_base=reasoning_base,
                prelude=prelude,
                metadata=metadata,
                answered=answered,
            )

        return make

    def _tools(self, session_id: str) -> dict[str, Any]:
        """The thread's agent's tools by name (its open session's agent, else the one
        that runs it), known before the thread is opened."""
        known = self.state.host.get_session(session_id)
        agent = known.agent if known is not None else self.state.agent_for(session_id)
        return {t.name: t for t in agent.tools}

    def _check_tools(self, run: RunInput, session_id: str) -> None:
        """400 for a client tool named like one of the thread's agent's tools (checked
        before the thread is opened: a refused run opens nothing)."""
        if not run.tools:
            return
        taken = sorted(self._tools(session_id).keys() & {t.name for t in run.tools})
        if taken:
            raise bad_input(
                f"'tools' {taken} take the name of the agent's own tools", "tool_name_taken"
            )

    async def _new_turn(
        self,
        run: RunInput,
        session_id: str,
        stored: tuple[Message, ...],
        effective: list[dict[str, Any]],
        new_thread: bool,
        held_ids: Container[str],
    ) -> ASGIApp:
        state = self.state
        waiting = [c for c in waiting_calls(stored) if not c.decided]
        approvals = [c for c in waiting if c.kind == APPROVAL]
        if approvals:  # the spec: pending interrupts block new input
            raise _pending_refusal(approvals)
        message = effective[-1]
        earlier = effective[:-1]
        # The client's earlier messages may be 600,000: walked in a thread when many (the
        # request's own lists, which nothing else holds; ``stored`` is a tuple).
        big = len(earlier) > INLINE_MESSAGES
        limits = state.host.input_limits
        _check_counts([message], limits)
        text = _new_user_input(run, message)
        seed = None
        if new_thread and earlier:
            seed = await off_loop(partial(_seed, limits=limits), earlier, big=big, state=state)
        self._check_tools(run, session_id)
        session, agent = await self._open_thread(session_id, seed)
        _check_media(text, agent)
        user_id = _valid_id(message["id"])
        resync = partial(_resync, stored, message=message, user_id=user_id)
        prelude = await off_loop(
            resync, earlier, big=big or len(stored) > INLINE_MESSAGES, state=state
        )
        if session is None:
            return await self._submit(
                run, session_id, text, user_id, seed, agent, prelude, held_ids
            )
        return self.stream(  # type: ignore[no-any-return]
            session,
            text,
            user_message_id=user_id,
            turn_id=await _unrelayed(state.relay, _valid_id(run.run_id)),
            tools=run.tools,
            instructions=run.instructions,
            keepalive=state.keepalive,
            send_timeout=state.send_timeout,
            background=state.background,
            encoder=self._encoder(run, session.agent, prelude=prelude),
            headers=HEADERS,
            busy=_busy,
            closing=_closing,
            on_busy=REJECT,  # a run is one turn: never queued behind or steered into
        )

    async def _open_thread(
        self, session_id: str, seed: tuple[Message, ...] | None
    ) -> tuple[Any, Any]:
        """The thread's open session (started from ``seed`` when new) and its agent; in a
        worker deployment's front end no session, as nothing opens here, and the agent."""
        state = self.state
        if state.front is not None:
            return None, state.agent_for(session_id)
        try:
            session = await state.session(session_id, history=seed)
        except InvalidHistory:  # another request started the thread meanwhile
            session = await state.session(session_id)
        return session, session.agent

    async def _submit(
        self,
        run: RunInput,
        session_id: str,
        text: UserContent,
        user_id: str | None,
        seed: tuple[Message, ...] | None,
        agent: Any,
        prelude: list[dict[str, Any]],
        held_ids: Container[str] = (),
    ) -> ASGIApp:
        """The new turn queued through a worker deployment's front end, its run streamed
        from the queue. ``held_ids``: the ids of the thread's messages."""
        front = self.state.front
        options = TurnOptions(
            user_message_id=user_id,
            tools=tuple(ClientToolSpec.of(t) for t in run.tools),
            instructions=run.instructions,
            history=seed,
        )
        key = None if user_id is None else _run_key(session_id, user_id)
        turn_id = _queue_turn_id(run.run_id)
        if turn_id is not None and await front.queue.get_status(turn_id) is not None:
            # a runId used before (a careless client's constant one, in any thread): the
            # queue refuses a turn id twice, so this run's turn gets a new one
            turn_id = None
        elif turn_id is not None and _named_already(f"msg_{turn_id}", held_ids, user_id):
            turn_id = None
        try:
            turn = await front.submit(
                session_id,
                text,
                key,
                False,
                turn_id=turn_id,
                options=options,
                stop_name=user_id,  # a stop held for it before the run came
            )
        except ApiError as exc:  # (its Retry-After kept: a full queue's, a store's)
            raise AGUIError(
                exc.status, exc.message, _CODES.get(exc.status), headers=exc.headers
            ) from None
        out = QueuedTurnOutput(front, turn)
        return self._queued(run, out, agent, prelude=prelude)

    async def _continue(
        self, run: RunInput, session_id: str, stored: tuple[Message, ...], version: int
    ) -> ASGIApp:
        state = self.state
        waiting = waiting_calls(stored)
        tools = self._tools(session_id)
        if _answer_chars(run) > OFF_LOOP_ANSWER_CHARS:  # (read and checked in a thread)
            answers, ignored, named = await trio.to_thread.run_sync(
                _answers, run, stored, waiting, tools, limiter=state.parse_limiter
            )
        else:
            answers, ignored, named = _answers(run, stored, waiting, tools)
        metadata = {"axon": {"ignoredResume": ignored}} if ignored else None
        if not waiting:  # nothing waits (a replayed resume): the thread as it is
            return snapshot_response(run, self._current(session_id, stored, version), metadata)
        uncovered = _uncovered(waiting, answers)
        if uncovered:
            raise _pending_refusal(uncovered)
        self._check_tools(run, session_id)
        base = _reasoning_count(stored, waiting[0].message_id)
        metadata_and_answered: dict[str, Any] = {
            "reasoning_base": base,
            "metadata": metadata,
            "answered": [key for key, d in answers if d.approved is None],
        }
        if state.front is not None:
            out = await self._decide_queued(session_id, stored, waiting, answers, named)
            agent = state.agent_for(session_id)
            return self._queued(run, out, agent, **metadata_and_answered)
        session = await state.session(session_id)
        tools = {t.name: t for t in session.agent.tools}
        limit = session.agent.budget.max_tool_result_chars  # (what session.decide bounds by)
        try:
            # all checked first, a bad one records nothing; each output and edit checked
            # once (a large one in a thread), marked so the recording does not again
            answers, _ = await checked_decisions(stored, answers, tools, limit)
            for key, decision in answers:
                await session.decide(
                    key,
                    approved=decision.approved,
                    reason=decision.reason,
                    error=decision.error,
                    edited_input=decision.edited_input,
                    output_checked=decision.output_checked,
                    input_checked=decision.input_checked,
                    **({"output": decision.output} if decision.has_output else {}),
                )
        except DecisionError as exc:
            raise _decision_error(exc, named) from None
        except SessionBusy:  # another request resumed it meanwhile
            raise AGUIError(
                409, f"thread {session_id!r} is running a run already", "thread_busy"
            ) from None
        return self.stream(  # type: ignore[no-any-return]
            session,
            "",
            resume=True,
            tools=run.tools,
            instructions=run.instructions,
            keepalive=state.keepalive,
            send_timeout=state.send_timeout,
            background=state.background,
            encoder=self._encoder(run, session.agent, **metadata_and_answered),
            headers=HEADERS,
            busy=_busy,
            closing=_closing,
            on_busy=REJECT,  # a run is one turn: never queued behind or steered into
        )

    async def _decide_queued(
        self,
        session_id: str,
        stored: tuple[Message, ...],
        waiting: Sequence[PendingCall],
        answers: Sequence[tuple[str, Decision]],
        named: Mapping[str, str],
    ) -> QueuedTurnOutput:
        """The run's answers recorded through the queue (all checked first, each output
        and edit once, a large one in a thread: a bad one records nothing), and the
        continuation they start, as the workers stream it. ``named``: the ids the client
        sent (:func:`_decision_error`)."""
        state = self.state
        front = state.front
        front.check_open()  # closing: 503, nothing recorded (its body came meanwhile)
        agent = state.agent_for(session_id)
        tools = {t.name: t for t in agent.tools}
        limit = agent.budget.max_tool_result_chars
        decided = []
        try:
            answers, checked = await checked_decisions(stored, answers, tools, limit)
            for key, decision in answers:
                decided.append(
                    await front.decide(
                        state.host.bus, session_id, key, decision, tools, max_chars=limit
                    )
                )
        except DecisionError as exc:
            raise _decision_error(exc, named) from None
        except ApiError as exc:  # (its Retry-After kept: a full queue's, a store's)
            raise AGUIError(
                exc.status, exc.message, _CODES.get(exc.status), headers=exc.headers
            ) from None
        # decided before (a replayed run): the continuation those decisions started
        turn = decided[-1].turn if decided else await front.queue.get_status(waiting[0].turn_id)
        if turn is None or turn.waiting:
            raise _pending_refusal([c for c in waiting_calls(checked) if not c.decided])
        return QueuedTurnOutput(front, turn, after_pauses=turn.resumes)

    def _queued(
        self, run: RunInput, out: QueuedTurnOutput, agent: Any, **encoding: Any
    ) -> QueuedStreamResponse:
        """A queued turn (a worker deployment's front end), streamed from the relay with
        the run's encoder; a client that leaves cancels it, as in the embedded app."""
        state = self.state
        encoder = self._encoder(run, agent, **encoding)()
        out.history = encoder.snapshot_due  # the whole thread only for its snapshot
        return QueuedStreamResponse(
            out,
            encoder,
            headers=HEADERS,
            keepalive=state.keepalive,
            send_timeout=state.send_timeout,
            background=state.background,
        )


_CODES = {429: "queue_full", 503: "unavailable", 409: "conflict"}
"""The ``code`` of a queue's refusal, by its status."""


def _run_key(session_id: str, user_id: str) -> str:
    """The idempotency key of a run's new user message in the queue: a run sent again
    (the same message id, the same content) is the same turn."""
    return message_key(session_id, "ag-ui", user_id)


def _named_already(answer_id: str, held_ids: Container[str], user_id: str | None) -> bool:
    """Whether a queued turn's answer ``msg_<runId>`` would take the id of a message of
    the thread, or of the run's own user message (both the client's to name: a user
    message ``msg_Q``, then a run ``Q``): two messages of one id, in every snapshot and
    in the AI SDK's form. The turn gets an id of the server's then."""
    return answer_id == user_id or answer_id in held_ids


def _queue_turn_id(run_id: str) -> str | None:
    """The client's ``runId`` as the queued turn's id when its assistant message's id
    (``msg_<turn id>``) stays a valid id, else ``None`` (a new one). Nor one ending as
    an id a snapshot derives from a message's (``.r<k>``, ``.result``,
    :func:`~runtime.app.web.agui_wire.looks_derived`): a run named ``<R>.r0`` made
    message ``msg_<R>.r0``, the id of the reasoning message of run ``R``'s."""
    message_id = f"msg_{run_id}"
    return run_id if _valid_id(message_id) and not looks_derived(message_id) else None


def agui_endpoint(state: Any, *, token: str | None, stream: Any) -> Callable[[Request], Any]:
    """The ``POST /ag-ui`` endpoint over the app's ``state`` (mounted by
    :func:`runtime.app.web.protocols.mount_protocols`), its turns streamed by ``stream``."""
    return AGUIRoutes(state, stream, token).endpoint


__all__ = ["HEADERS", "PATH", "agui_endpoint"]
