"""The AI SDK's continuation ``POST /api/chat``: answers for a turn that waits for input.

``useChat`` answers a waiting turn (docs/approval.md) by sending the conversation with
the ASSISTANT message last (``trigger: "submit-message"``, ``messageId``: that message's
id): each approval it answered is a tool part in state ``approval-responded`` with
``approval: {id, approved, reason?}``; each client-side tool it ran, a tool part in
state ``output-available`` (``output``) or ``output-error`` (``errorText``).
:func:`record_answers` reads those answers, checks them all against the stored turn
first (an unknown, foreign or decided id, or an answer of the wrong kind, is a 4xx and
nothing is recorded), then records each (:meth:`runtime.app.session.Session.decide`; in a
worker deployment's front end, :func:`check_and_record` with
:meth:`runtime.turn_queue.TurnQueue.decide`). The request whose answers complete the
turn's decisions streams its continuation, from what that decision stored; one that
leaves calls waiting gets 202 (``{"recorded": true, "waiting": m}``). In the embedded
app "the stored turn" is the session as the process holds it when it holds all of it,
which the first answer's version-checked save proves current (else the store is read):
an approve POST then reads nothing, as ``session.respond`` does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any

import attrs
import trio

from runtime.app.web.http import ApiError
from runtime.app.web.signing import REQUIRE_ENV, SECRET_SOURCES, SIGNING_CLIENTS, SessionSigner
from runtime.approval import (
    WAITING_META,
    Decision,
    PendingCall,
    Recorded,
    decide,
    large_output,
    pending_calls,
    stored_output,
    waiting_calls,
)
from runtime.errors import (
    AlreadyDecided,
    CallerDecides,
    DecisionError,
    InvalidDecision,
    StoreConflict,
    UnknownApproval,
    WaitExpired,
)
from runtime.history import off_loop_limiter
from runtime.messages import AssistantMessage, Awaiting, Message, ToolCallPart
from runtime.store import SessionRecord, Store

EDITED_INPUT = "axonEditedInput"
"""The key of a continuation's ``approval`` object that carries an edited input: an
Axon extension (the AI SDK has none), named so that no field the SDK adds can take it."""

STOPPED_WAIT = "stopped"
"""The reason a waiting turn's calls are denied with when the session is stopped."""

_STATUS: dict[type, int] = {
    UnknownApproval: 404,
    AlreadyDecided: 409,
    WaitExpired: 409,
    CallerDecides: 409,
    InvalidDecision: 400,
}


def is_continuation(payload: dict[str, Any]) -> bool:
    """Whether the body's last message is the assistant's (the AI SDK's answer form)."""
    messages = payload.get("messages")
    return (
        isinstance(messages, list)
        and bool(messages)
        and isinstance(messages[-1], dict)
        and messages[-1].get("role") == "assistant"
    )


def _answers(
    message: dict[str, Any], waiting: Sequence[PendingCall], signer: SessionSigner | None = None
) -> list[tuple[str, Decision]]:
    """The answers the assistant message carries: approvals it responded to, outputs of
    the client tools the turn waits for (other tool parts are results the server gave,
    which the client sends back as it got them: passed over).

    Each answering part must be the waiting call's as the server streamed it: an
    approval whose part names another call (``toolCallId``) or tool (``type``), or
    carries an input other than the stored call's, is a 400, and so is a second answer
    for one call, an output for a call that waits for approval (a server tool's result
    comes from the server, never the client) and an ``output-error`` without its
    ``errorText``. Taken as they came, the edited input of an approval (a page that lets
    the person change the arguments, then approve) approved the call as the model made
    it, with the person told nothing; an approval id put in another call's part approved
    that other call; two answers for one call were refused as "decided already".

    An approval's ``signature`` (the ``ai`` package sends back the one its request was
    streamed with, :mod:`runtime.app.web.signing`) must be text, and with ``signer`` it
    must verify against the stored call: 403 otherwise; with a ``signer`` that
    requires one (``--require-approval-signature``), an answer without one is a 403
    too. Its other keys
    (``descriptor``, ``inputSchemaInput``, ``requestReason``, ``isAutomatic``: what
    the SDK copies from the request) are passed over.

    ``approval.axonEditedInput`` (:data:`EDITED_INPUT`, an Axon extension: the AI SDK has
    no edit field, the page at ``/`` sends it) approves the call with that input instead
    of the model's (docs/approval.md, "Approving with edits"): an object, checked by the
    decision like every edit (approved only, the tool's schema), so a bad one is refused
    before anything is recorded. The part's ``input`` (and the signature) stay the call's
    as streamed: the edit is the answer, not a different call."""
    parts = message.get("parts")
    if not isinstance(parts, list):
        raise ApiError(400, "the assistant message has no 'parts'")
    # A call whose sub-agent waits for a client tool is answered by the part the
    # stream showed that tool's call in (its id the wait's); the agent tool's own part
    # (its preliminary output, the sub-agent's text so far) is no answer.
    calls = {c.approval_id if c.sub_tool else c.tool_call_id: c for c in waiting}
    by_key = {**calls, **{c.approval_id: c for c in waiting}}
    out: list[tuple[str, Decision]] = []
    answered: set[str] = set()
    for p in parts:
        if not isinstance(p, dict) or not str(p.get("type", "")).startswith(("tool-", "dynamic")):
            continue
        state, call_id = p.get("state"), p.get("toolCallId")
        if state == "approval-responded":
            approval = p.get("approval")
            if not isinstance(approval, dict) or not isinstance(approval.get("id"), str):
                raise ApiError(400, "an approval-responded tool part needs 'approval.id'")
            approved, reason = approval.get("approved"), approval.get("reason")
            if not isinstance(approved, bool) or not isinstance(reason, str | None):
                raise ApiError(400, "'approval.approved' must be a boolean, 'reason' a string")
            key = approval["id"]
            call = by_key.get(key)
            signature = approval.get("signature")
            if not isinstance(signature, str | None):
                raise ApiError(400, "'approval.signature' must be a string")
            edited = approval.get(EDITED_INPUT)
            if edited is not None and not isinstance(edited, dict):
                raise ApiError(
                    400, f"'approval.{EDITED_INPUT}' must be an object (the call's new input)"
                )
            if call is not None:
                _check_part(p, call, f"the approval {key!r}")
                if signer is not None:
                    if signature is not None:
                        _check_signature(signature, call, signer)
                    elif signer.required:
                        _unsigned(call)
            _once(answered, call.tool_call_id if call is not None else key)
            out.append((key, Decision(approved=approved, reason=reason, edited_input=edited)))
        elif (
            state in ("output-available", "output-error")
            and isinstance(call_id, str)  # (a list or an object: no call's, not a TypeError)
            and call_id in calls
        ):
            call = calls[call_id]
            if call.kind != "client":
                raise ApiError(
                    400,
                    f"call {call_id!r} ({call.tool_name}) runs on the server and waits for "
                    "approval: the client answers it with an approval, its output comes "
                    "from the server",
                )
            _check_part(p, call, f"the output of call {call_id!r}")
            _once(answered, call_id)
            call_id = call.approval_id  # (a sub-agent's client tool's: the wait's id)
            if state == "output-error":
                text = p.get("errorText")
                if not isinstance(text, str):
                    raise ApiError(
                        400, f"the output-error part of call {call_id!r} needs 'errorText' (text)"
                    )
                out.append((call_id, Decision(error=text)))
            else:
                out.append((call_id, Decision(output=p.get("output"), has_output=True)))
    return out


def _check_signature(signature: str, call: PendingCall, signer: SessionSigner) -> None:
    """403 when ``signature`` is not the one the approval request of ``call`` was
    streamed with, for the call as the store holds it now (a call approved with edits
    already, whose answer a client sends back: its request was signed over the model's
    input, a reload's over the edited one, either is the call's).

    The refusal names the one cause a person cannot fix by reloading: front ends of a
    deployment with different secrets (or one restarted with another) refuse each
    other's signatures, and a reload served by the other front end signs anew, to be
    refused again here. It names the option and variable, never the secret."""
    inputs = [call.input] if call.original_input is None else [call.input, call.original_input]
    if not any(
        signer.verify(signature, call.approval_id, call.tool_call_id, call.tool_name, i)
        for i in inputs
    ):
        raise ApiError(
            403,
            f"the signature of the approval {call.approval_id!r} does not verify for call "
            f"{call.tool_call_id!r} ({call.tool_name}) of this session as it is stored: "
            "nothing was recorded (reload the session for its current requests; if this "
            "keeps happening, the server that signed the request had another secret: "
            f"every front end needs the same approval secret: {SECRET_SOURCES})",
        )


def _unsigned(call: PendingCall) -> None:
    """403 for an answer to ``call`` that carries no signature, the server requiring one
    (``--require-approval-signature``): nothing is recorded. The refusal says which
    clients send one, and that a reload gives the page a signed request again."""
    raise ApiError(
        403,
        f"the approval {call.approval_id!r} of call {call.tool_call_id!r} "
        f"({call.tool_name}) carries no signature and this server requires one "
        f"(--require-approval-signature or ${REQUIRE_ENV}): nothing was recorded; answer "
        f"with a client that sends back the request's signature ({SIGNING_CLIENTS}), "
        "from a page that got the request from this server (reload the session for it)",
    )


def _once(answered: set[str], call_id: str) -> None:
    """400 when the message answered ``call_id`` already: one answer per call."""
    if call_id in answered:
        raise ApiError(400, f"the assistant message answers call {call_id!r} twice")
    answered.add(call_id)


def _check_part(part: dict[str, Any], call: PendingCall, what: str) -> None:
    """400 when ``part`` is not the waiting ``call`` as the server streamed it: another
    call's id, another tool's name, or an input other than the stored one (an input
    absent or ``null`` is none given)."""
    call_id, kind = part.get("toolCallId"), str(part.get("type", ""))
    shown_id, name, input = call.tool_call_id, call.tool_name, call.input
    if call.sub_tool is not None:  # as the stream showed it: the sub-agent's call
        shown_id, name, input = call.approval_id, call.sub_tool, call.sub_input
    if call_id is not None and call_id != shown_id:
        raise ApiError(
            400,
            f"{what} is for call {shown_id!r} ({name}), but its part names call {call_id!r}",
        )
    if kind.startswith("tool-") and kind[5:] != name:
        raise ApiError(
            400,
            f"{what} is for call {shown_id!r} of tool {name!r}, but its part is a {kind!r}",
        )
    # (the server streams no dynamic tool, so a ``dynamic-tool`` part is one the client
    # made: the name it shows the person must still be the call's)
    shown_name = part.get("toolName")
    if not kind.startswith("tool-") and shown_name is not None and shown_name != name:
        raise ApiError(
            400,
            f"{what} is for call {shown_id!r} of tool {name!r}, but its part names tool "
            f"{str(shown_name)[:100]!r}",
        )
    sent = part.get("input")  # null: a client that keeps no input sent none
    # (a call approved with edits, answered again: the part may keep the model's input)
    edited_from = call.original_input if call.sub_tool is None else None
    if (
        sent is not None
        and not _same_json(sent, input)
        and not (edited_from is not None and _same_json(sent, edited_from))
    ):
        raise ApiError(
            400,
            f"{what} carries an input for {name} other than the call's: answer with "
            f"the input as it was streamed (an edit goes in 'approval.{EDITED_INPUT}')",
        )


def _same_json(sent: Any, stored: Any) -> bool:
    """Whether ``sent`` (a value the client parsed from the stream and sent back) is
    ``stored``: numbers compared as the doubles a JavaScript client holds them in (an
    integer past 2**53 comes back rounded), keys in any order."""
    if isinstance(sent, bool) or isinstance(stored, bool):
        return type(sent) is type(stored) and sent == stored
    if isinstance(sent, int | float) and isinstance(stored, int | float):
        try:
            return float(sent) == float(stored)
        except OverflowError:
            return sent == stored
    if isinstance(sent, dict) and isinstance(stored, dict):
        return sent.keys() == stored.keys() and all(_same_json(sent[k], stored[k]) for k in sent)
    if isinstance(sent, list) and isinstance(stored, list | tuple):
        return len(sent) == len(stored) and all(map(_same_json, sent, stored))
    return bool(sent == stored)


def _held(messages: Sequence[Message]) -> dict[str, tuple[Awaiting, Any]]:
    """The decisions already recorded for the calls the last turn still waits for, by
    id, each with its call's input as stored (an edit, if it was approved with one)."""
    decided = {c.approval_id for c in waiting_calls(messages) if c.decided}
    return {
        p.awaiting.id: (p.awaiting, _ran_with(p))
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart) and p.awaiting is not None and p.awaiting.id in decided
    }


def _ran_with(part: ToolCallPart) -> Any:
    """The input a decided call's approval runs: its own, or, for a sub-agent's approval
    passed up (``Awaiting.asked_tool``), the sub call's (the edit, if there was one)."""
    waiting = part.awaiting
    if waiting is None or waiting.asked_tool is None:
        return part.input
    return waiting.asked_input if waiting.edited_input is None else waiting.edited_input


def _echoes(held: tuple[Awaiting, Any] | None, decision: Decision) -> bool:
    """Whether ``decision`` is the one already recorded: a client sending back the
    server's own message of a half-decided turn (a page that answers one call at a time
    and got 202) repeats it, and that is not a second decision. One with an edited
    input repeats it when the call holds that input (a different edit is a second,
    refused decision, not an echo taken silently)."""
    if held is None:
        return False
    awaiting, input = held
    return (awaiting.approved, awaiting.output, awaiting.error) == (
        decision.approved,
        decision.output,
        decision.error,
    ) and (decision.edited_input is None or _same_json(decision.edited_input, input))


RecordAnswer = Callable[[str, Decision], Awaitable[Recorded]]
"""``await record(key, decision)``: how one checked answer is recorded (the embedded
app's ``session.decide``; a worker deployment's front end, the turn queue's ``decide``)."""


async def record_answers(
    session: Any, payload: dict[str, Any], signer: SessionSigner | None = None
) -> tuple[dict[str, Any], Recorded | None]:
    """Record the answers of a continuation body for ``session``; returns the calls the
    turn waited for, each id with its stored input (the client knows them: their input
    is not sent again; a request the continuation makes for one is signed over it) and
    what the last answer's decision recorded: only a ``complete`` one lets this request
    resume the turn (two requests never both resume it), from what it stored
    (``session.resume(decided=...)``). Every answer is checked before any is recorded.

    The answers are checked against the session as this process holds it
    (``session.held_record()``) when it holds all of it, instead of reading it from the
    store: the first answer is recorded on top of that record's version or not at all
    (``decide(expected_version=...)``), so either the store held what the checks saw, or
    nothing was recorded and they are made again on what the store holds. A view that
    refuses an answer is not believed either (it may be behind the store, which may
    know the call): the store is read and decides, so every 4xx comes from a read.

    A body whose answers are all already recorded, for a turn whose every call is decided
    but which was never resumed (the process that recorded the last decision stopped
    before its continuation stored a result: a kill, a restart), gives ``None`` for the
    decision: the caller resumes the turn from the store (``session.resume()``). Before,
    the client sending its answers again was told they answer nothing, and the turn
    waited for good with nothing left to decide.

    ``signer`` (the session's, with a secret configured) checks each approval's
    ``signature`` (:func:`_answers`)."""
    if session.busy:
        raise ApiError(409, f"session {session.id!r} is already running a turn")

    async def record(key: str, decision: Decision, expected_version: int | None = None) -> Recorded:
        recorded: Recorded = await session.decide(
            key,
            approved=decision.approved,
            reason=decision.reason,
            error=decision.error,
            expected_version=expected_version,
            edited_input=decision.edited_input,
            output_checked=decision.output_checked,
            input_checked=decision.input_checked,
            **({"output": decision.output} if decision.has_output else {}),
        )
        return recorded

    tools = {t.name: t for t in session.agent.tools}
    limit = session.agent.budget.max_tool_result_chars
    known = session.held_record()
    if known is not None:
        try:
            announced, answers = await _checked_off_loop(
                known.messages, payload, tools, signer, limit
            )
            first, *rest = answers
            recorded = await record(*first, expected_version=known.version)
        except (ApiError, DecisionError, StoreConflict):
            pass  # the view may be behind the store: check again on what it holds
        else:  # the store held what the checks saw: the rest are checked as well
            return announced, await record_all(rest, record, recorded)
    stored = await session.host.store.load(session.id)
    if stored is not None and _repeats(stored.messages, payload, signer):
        return _known(waiting_calls(stored.messages)), None
    return await check_and_record_on(stored, tools, payload, record, signer, limit)


def _repeats(
    stored: Sequence[Message], payload: dict[str, Any], signer: SessionSigner | None = None
) -> bool:
    """Whether the body only repeats the recorded answers of a turn whose every call is
    decided and none has its result yet (decided, never resumed)."""
    waiting = waiting_calls(stored)
    if not waiting or not all(c.decided for c in waiting):
        return False
    message = payload["messages"][-1]
    if payload.get("messageId", message.get("id")) not in (None, waiting[0].message_id):
        return False
    try:
        answers = _answers(message, waiting, signer)
    except ApiError:
        return False
    held = _held(stored)
    return bool(answers) and all(_echoes(held.get(key), d) for key, d in answers)


def _known(waiting: Sequence[PendingCall]) -> dict[str, Any]:
    """The calls a continuation's client knows (the turn waited for them), each id with
    its input as stored: what a request the continuation makes for one is signed over."""
    return {c.tool_call_id: c.input for c in waiting}


def _checked(
    stored: Sequence[Message],
    payload: dict[str, Any],
    tools: Mapping[str, Any],
    signer: SessionSigner | None = None,
    max_chars: int | None = None,
    *,
    outputs: bool = True,
    cut: bool = False,
) -> tuple[dict[str, Any], list[tuple[str, Decision]]]:
    """The calls the stored turn waits for (:func:`_known`) and the body's answers to record
    (echoes of recorded ones left out), each checked against ``stored``: a body with a
    bad one (or none) raises :class:`ApiError`. ``max_chars``: the agent's
    ``max_tool_result_chars``, which the recording bounds an edited input by
    (:func:`~runtime.approval.decide`): checked here too, so a body whose second answer
    carries too long an edit records nothing, not its first answer alone.

    A client tool's output checked here against its output schema, and an approval's
    edited input checked here against its tool's, are not checked again as they are
    recorded (``Decision.output_checked``, ``input_checked``: an edit was checked on
    the loop twice, here and as it was recorded); ``outputs=False``: neither checked
    here either (the answers are then only good for telling a refusal, which the
    check of either would make the same on any read: the call's part holds the
    tool's name and the model's input). ``cut``: each output carried as it is stored
    (:func:`_check_all`)."""
    message = payload["messages"][-1]
    waiting = waiting_calls(stored)
    message_id = payload.get("messageId", message.get("id"))
    if waiting and message_id not in (None, waiting[0].message_id):
        raise ApiError(404, f"message {message_id!r} is not the turn waiting for input")
    given = _answers(message, waiting, signer)
    held = _held(stored)
    answers = [(key, d) for key, d in given if not _echoes(held.get(key), d)]
    if not answers:
        if given:  # each the recorded decision, come late (the loser of two at once)
            raise ApiError(409, "the answers were recorded already; nothing is recorded again")
        raise ApiError(400, "the assistant message answers no call the turn waits for")
    if not outputs:  # (a refusal of either is the same on any read of the session)
        answers = [(key, _marked(d)) for key, d in answers]
    try:  # all checked first: a bad one records nothing
        marked, _ = _check_all(stored, answers, tools, max_chars, cut)
    except DecisionError as exc:
        raise ApiError(_STATUS.get(type(exc), 400), str(exc)) from None
    return _known(waiting), marked


async def _checked_off_loop(
    stored: Sequence[Message],
    payload: dict[str, Any],
    tools: Mapping[str, Any],
    signer: SessionSigner | None = None,
    max_chars: int | None = None,
) -> tuple[dict[str, Any], list[tuple[str, Decision]]]:
    """:func:`_checked`, in a worker thread when the body's message is large
    (:func:`~runtime.approval.large_output`): its outputs' checks against their tools'
    schemas (400,000 rows: 7.4 s) would hold the event loop every session streams on,
    and so would writing them out to be stored (done there too: ``cut``,
    :func:`_check_all`)."""
    if large_output(payload["messages"][-1]):
        checked = partial(_checked, cut=True)
        return await trio.to_thread.run_sync(
            checked, stored, payload, tools, signer, max_chars, limiter=off_loop_limiter()
        )
    return _checked(stored, payload, tools, signer, max_chars)


def _check_all(
    stored: Sequence[Message],
    answers: Sequence[tuple[str, Decision]],
    tools: Any,
    max_chars: int | None,
    cut: bool = False,
) -> tuple[list[tuple[str, Decision]], Sequence[Message]]:
    """Each decision made on ``stored`` in turn (a :class:`DecisionError` for one that
    cannot be): the decisions, a client tool's output and an edited input marked checked
    (``Decision.output_checked``, ``input_checked``: the recording does not check them
    again), and the messages they leave. ``cut``: each output carried in the form it is
    stored in (:func:`~runtime.approval.stored_output`), made here (a worker thread),
    not written out again as it is recorded (on the loop)."""
    marked = []
    for key, decision in answers:
        _, stored, call, _ = decide(stored, key, decision, tools, max_chars)
        marked.append((key, _marked(decision, call if cut else None, max_chars)))
    return marked, stored


def _marked(
    decision: Decision, call: PendingCall | None = None, max_chars: int | None = None
) -> Decision:
    """``decision`` as checked: its output or edit (plain JSON, from the message) not
    checked again; given the ``call`` it decided, its output as it is stored."""
    output = decision.output
    if call is not None and decision.has_output and decision.error is None:
        output = stored_output(call, output, max_chars, as_json=decision.output_checked)
    return attrs.evolve(
        decision,
        output=output,
        output_checked=decision.has_output,
        input_checked=decision.edited_input is not None,
    )


async def checked_decisions(
    stored: Sequence[Message],
    answers: Sequence[tuple[str, Decision]],
    tools: Any,
    max_chars: int | None,
) -> tuple[list[tuple[str, Decision]], Sequence[Message]]:
    """:func:`_check_all`, in a worker thread (the shared ``off_loop_limiter``) when an
    output or edited input is large (:func:`~runtime.approval.large_output`): a client
    tool's output checked against its schema (20,000 rows: 2 s loaded) would hold the
    event loop every session streams on, and so would writing it out to be stored
    (done there too: ``cut``). The checks read only ``stored``, the decisions and the
    tools' validators, which nothing changes meanwhile."""
    given = [d.output if d.has_output else d.edited_input for _, d in answers]
    if large_output(given):
        return await trio.to_thread.run_sync(
            _check_all, stored, answers, tools, max_chars, True, limiter=off_loop_limiter()
        )
    return _check_all(stored, answers, tools, max_chars)


async def record_all(
    answers: Sequence[tuple[str, Decision]], record: RecordAnswer, last: Recorded | None = None
) -> Recorded:
    """Record each of ``answers`` (checked) with ``record``; what the last one recorded
    (``last`` when there are none). A refusal (a :class:`DecisionError` from ``record``)
    is an :class:`ApiError`; the A2A endpoint's ``record`` raises its own errors first."""
    try:
        for key, decision in answers:
            last = await record(key, decision)
    except DecisionError as exc:
        raise ApiError(_STATUS.get(type(exc), 400), str(exc)) from None
    assert last is not None
    return last


async def check_and_record(
    store: Store,
    session_id: str,
    tools: Mapping[str, Any],
    payload: dict[str, Any],
    record: RecordAnswer,
    signer: SessionSigner | None = None,
    max_chars: int | None = None,
) -> tuple[dict[str, Any], Recorded]:
    """:func:`record_answers` for session ``session_id`` of ``store``, read from it, each
    answer recorded with ``record`` once all are checked against the stored turn; the
    calls the turn waited for (:func:`_known`), and what the last answer recorded (its
    ``complete``: whether the answers completed the turn's decisions). ``max_chars``:
    the agent's ``max_tool_result_chars`` (:func:`_checked`)."""
    stored = await store.load(session_id)
    return await check_and_record_on(stored, tools, payload, record, signer, max_chars)


async def check_and_record_on(
    stored_record: SessionRecord | None,
    tools: Mapping[str, Any],
    payload: dict[str, Any],
    record: RecordAnswer,
    signer: SessionSigner | None = None,
    max_chars: int | None = None,
) -> tuple[dict[str, Any], Recorded]:
    """:func:`check_and_record` on the session as the caller read it (``None``: never
    saved), so that the caller can hand the same read to its first decision."""
    stored = stored_record.messages if stored_record is not None else ()
    announced, answers = await _checked_off_loop(stored, payload, tools, signer, max_chars)
    return announced, await record_all(answers, record)


def answers_refused(
    stored_record: SessionRecord | None,
    tools: Mapping[str, Any],
    payload: dict[str, Any],
    signer: SessionSigner | None = None,
    max_chars: int | None = None,
) -> bool:
    """Whether :func:`check_and_record_on` would refuse the body's answers on
    ``stored_record`` (an :class:`ApiError`), recording nothing."""
    stored = stored_record.messages if stored_record is not None else ()
    try:  # (outputs and edits unchecked: a refusal of one is the same on any read)
        _checked(stored, payload, tools, signer, max_chars, outputs=False)
    except ApiError:
        return True
    return False


async def pending_in(store: Store, session_id: str) -> tuple[PendingCall, ...]:
    """The calls session ``session_id``'s stored last turn still waits for, undecided."""
    record = await store.load(session_id)
    return pending_calls(record.messages) if record is not None else ()


async def deny_pending(
    store: Store,
    session_id: str,
    reason: str,
    record: Callable[[str, Decision], Awaitable[Recorded]],
) -> str | None:
    """Deny every call the session's waiting turn waits for, with ``reason`` (an approval
    denied, a client tool answered with the error ``reason``), each through ``record``;
    the id of that turn, or ``None`` when nothing waits. A call someone decided first
    keeps that decision. What ``POST /api/chat/{id}/stop`` does to a turn that waits in
    a worker deployment: the decision that completes it resumes the turn, whose model
    is told, as after any denial."""
    turn_id = None
    for call in await pending_in(store, session_id):
        decision = (
            Decision(approved=False, reason=reason)
            if call.kind == "approval"
            else Decision(error=reason)
        )
        try:
            await record(call.approval_id, decision)
        except (AlreadyDecided, UnknownApproval):
            continue  # decided (or superseded) first: that decision stands
        turn_id = call.turn_id
    return turn_id


def waiting_in_meta(meta: Mapping[str, Any]) -> int:
    """How many calls a stored session's last turn waits for, by its meta
    (:data:`runtime.approval.WAITING_META`): what lists of sessions show."""
    value = meta.get(WAITING_META)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def awaited_calls(messages: Sequence[Message], message_id: str) -> tuple[str, ...]:
    """The ids of the calls of message ``message_id`` that waited for input: a client
    reading the turn's continuation knows them (their input is not streamed again)."""
    return tuple(
        p.tool_call_id
        for m in messages
        if isinstance(m, AssistantMessage) and m.id == message_id
        for p in m.content
        if isinstance(p, ToolCallPart) and p.awaiting is not None
    )


__all__ = [
    "answers_refused",
    "awaited_calls",
    "check_and_record",
    "check_and_record_on",
    "checked_decisions",
    "is_continuation",
    "pending_in",
    "record_all",
    "record_answers",
    "waiting_in_meta",
]
