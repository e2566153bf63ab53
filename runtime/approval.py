"""Turns that wait for a person: what is stored, and how a decision is recorded.

A tool call that needs approval (``@tool(needs_approval=...)``) or runs on the client
(:meth:`runtime.tools.Tool.client`) suspends its turn (docs/approval.md): the call's
:class:`~runtime.messages.ToolCallPart` is stored with an
:class:`~runtime.messages.Awaiting` and no result. Nothing else holds the wait: no task,
no memory. This module reads those calls out of a history (:func:`waiting_calls`) and
records a decision for one of them in the store (:func:`record_decision`), as a
version-checked save: of two decisions for one call, exactly one is recorded.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import orjson

from runtime import (
    json_exact,  # JSON with integers past 64 bits exact (not runtime.serde: start-up)
    lifecycle,  # the decision's event, on first use (runtime/lifecycle.py)
)
from runtime.chunks import _eq, _hash, _repr
from runtime.errors import (
    AlreadyDecided,
    CallerDecides,
    EditTooLarge,
    InvalidDecision,
    StoreConflict,
    UnknownApproval,
    WaitExpired,
    describe_exception,
)
from runtime.logging import get_logger
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    Message,
    ToolCallPart,
    ToolMessage,
    UserMessage,
    drop_unneeded_schemas,
    is_media_output,
    reads_back_as_media,
    share_schemas,
    stored_schema,
)
from runtime.redact import redact
from runtime.results import truncate_output
from runtime.store import SessionRecord, Store
from runtime.tools import (
    InvalidJSONSchema,
    ToolInputError,
    check_against_schema,
    json_values_over,
    linear_schema_validator,
    own_input,
    to_jsonable,
)

if TYPE_CHECKING:
    from runtime.events import ToolApprovalDecided

APPROVAL = "approval"
CLIENT = "client"
AWAITING_INPUT = "awaiting-input"
"""The finish reason of a turn that suspended."""
SUPERSEDED = "superseded"
"""The reason a waiting call is denied with when a new user message arrives instead."""
WAITING_META = "awaiting_input"
"""The session meta key that says, without loading the history, how many calls its last
turn waits for (``0`` or absent: none): set by the save of a turn that suspends, counted
down by each decision, cleared by the turn that follows. What lists of sessions read."""
SUSPENDED_TRACE_META = "suspended_trace"
"""The session meta key under which a turn that suspends stores its trace context
(``turn_id``, ``trace_id``, ``span_id``; from :attr:`runtime.bus.Bus.trace_contexts`,
when a tracing plug-in gave one): its continuation's ``turn.started`` carries it
(:attr:`runtime.events.TurnStarted.suspended_trace`), so the continuation's span links
to the suspended one whichever process resumes it, after any restart."""
RECORD_ATTEMPTS = 8
"""Times :func:`record_decision` tries again after another writer's save came first."""


@attrs.frozen(kw_only=True, slots=True)
class PendingCall:
    """A call a suspended turn waits for (``session.pending``, ``TurnResult.pending``)."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    approval_id: str
    """What to answer with ``session.respond``: the approval id (``approvalId`` in the AI
    SDK stream); a client tool's is its call id."""
    tool_call_id: str
    tool_name: str
    input: Any
    kind: str
    """``"approval"`` or ``"client"``."""
    step: int
    message_id: str
    """The turn's assistant message (the continuation keeps it)."""
    turn_id: str
    decided: bool = False
    sub_tool: str | None = None
    """A call whose sub-agent waits for its client-side tool (``Awaiting.sub_tool``):
    that tool's name; :attr:`approval_id` is the id the calling stream showed its call
    under, and :attr:`sub_input` its input."""
    sub_input: Any = None
    original_input: Any = None
    """A call approved with an edited input: the model's input (:attr:`input` is the
    edited one, :attr:`~runtime.messages.Awaiting.original_input`); ``None``: not edited."""
    asked_tool: str | None = None
    """A sub-agent's approval passed up (``as_tool(pass_approvals=True)``): the tool of
    the sub-agent's call that asks, and :attr:`asked_input` its input
    (:attr:`~runtime.messages.Awaiting.asked_tool`): what an edit of it replaces
    (:attr:`input` is the agent tool's own)."""
    asked_input: Any = None
    edited_input: Any = None
    """Such an approval approved with edits: the edit the sub-agent's call runs with."""


@attrs.frozen(kw_only=True, slots=True)
class Decision:
    """An answer for one waiting call: ``approved`` (and ``reason``) for an approval;
    ``output`` or ``error`` for a client tool."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    approved: bool | None = None
    reason: str | None = None
    output: Any = None
    error: str | None = None
    has_output: bool = False
    """Whether ``output`` was given (``None`` is a valid output)."""
    edited_input: Any = None
    """An approval's edited input (``approved=True`` only): the tool runs with it instead
    of the model's, checked against the tool's input schema first (``None``: as the
    model gave it). Stored as the call's input, the model's kept in
    :attr:`~runtime.messages.Awaiting.original_input` (docs/approval.md, "Approving with
    edits")."""
    by_caller: bool = False
    """Made by the calling call of an agent used as a tool, for a wait of its sub-session
    (:attr:`~runtime.messages.Awaiting.caller`): the only decision such a wait takes.
    Its deadline is not checked again: the caller's wait, checked when the caller's
    decision was made, had the same one."""
    output_checked: bool = False
    """``output`` was checked against the call's tool's output schema already, as the
    decision would (:func:`checked_output`, in a worker thread when large; a front end
    reading a tool message's text by that check): not checked again. Set by the code
    that ran the check, never read from a client. Why: a 10 MB answer of 400,000 rows
    took 7.4 s to check, on the event loop, and was checked three times (the front
    end's reading, its check of every answer before recording, the recording)."""
    input_checked: bool = False
    """``edited_input`` was checked as the decision would (:func:`_edited`: its size, its
    keys, the tool's check) on the same call, and is plain JSON, the form it is stored
    in (a body's): not checked again. Set by the code that ran the check (A2A's check of
    a message's decisions before it records them), never read from a client."""


@attrs.frozen(kw_only=True, slots=True)
class Recorded:
    """What :func:`record_decision` did: the call decided, and whether that completed
    the turn's waiting calls (then the turn can resume)."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    call: PendingCall
    complete: bool
    version: int
    messages: tuple[Message, ...] | None = None
    """The session's whole history as the decision stored it (at ``version``): a
    continuation started in the same process takes it instead of reading it back.
    ``None`` when the decision read only the session's last turn (``last_turn``)."""
    waiting: tuple[PendingCall, ...] = ()
    """The turn's waiting calls as the decision left them, decided or not
    (:func:`waiting_calls` of :attr:`messages`): found by the one scan that checked the
    decision, so the continuation need not scan the history again."""

    @property
    def left(self) -> int:
        """How many of the turn's calls still wait for a decision after this one (what
        a 202 answer to a decision that did not complete the turn reports)."""
        return sum(not c.decided for c in self.waiting)


def approval_decided(
    session_id: str,
    call: PendingCall,
    *,
    approved: bool,
    reason: str | None,
    max_chars: int | None = None,
) -> ToolApprovalDecided | None:
    """The bus event that tells of a decision for ``call`` (its cause the approval id), or
    ``None`` for a client tool's call, whose answer is no approval.

    ``max_chars``: the limit the decision's reason was stored cut to (:func:`_check`);
    the event carries the same cut text, so an observer of the bus (an event log, a
    structured log) is not handed the client's whole reason, up to the body's size.
    ``edited``: the call's own input was edited, or, for a sub-agent's approval passed
    up, its sub call's (before, that event said ``edited=False``)."""
    if call.kind != APPROVAL:
        return None
    return lifecycle.ToolApprovalDecided(
        session_id=session_id,
        tool_call_id=call.tool_call_id,
        approved=approved,
        reason=_kept(reason, max_chars),
        # (a passed-up approval's edit is its sub call's: Awaiting.edited_input)
        edited=call.original_input is not None or call.edited_input is not None,
        turn_id=call.turn_id,
        causation_id=call.approval_id,
    )


def _last_turn(messages: Sequence[Message]) -> tuple[int, AssistantMessage] | None:
    """The last assistant message, when no user message follows it."""
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if isinstance(m, UserMessage):
            return None
        if isinstance(m, AssistantMessage):
            return i, m
    return None


def waiting_calls(messages: Sequence[Message]) -> tuple[PendingCall, ...]:
    """The calls the history's last turn waits for, decided or not: those stored with an
    :class:`~runtime.messages.Awaiting` and no result yet. Empty when the last turn did
    not suspend (or was resumed, or a newer user message superseded it)."""
    return _waiting_in(messages, _last_turn(messages))


def _waiting_in(
    messages: Sequence[Message], found: tuple[int, AssistantMessage] | None
) -> tuple[PendingCall, ...]:
    """:func:`waiting_calls`, the last turn (``_last_turn(messages)``) already found."""
    if found is None:
        return ()
    index, message = found
    answered = {m.tool_call_id for m in messages[index + 1 :] if isinstance(m, ToolMessage)}
    return tuple(
        [
            _pending(p, message.id)
            for p in message.content
            if isinstance(p, ToolCallPart)
            and p.awaiting is not None
            and p.tool_call_id not in answered
        ]
    )


def pending_calls(messages: Sequence[Message]) -> tuple[PendingCall, ...]:
    """The waiting calls still without a decision."""
    return tuple([c for c in waiting_calls(messages) if not c.decided])


def _pending(part: ToolCallPart, message_id: str) -> PendingCall:
    waiting = part.awaiting
    assert waiting is not None
    return PendingCall(
        approval_id=waiting.id,
        tool_call_id=part.tool_call_id,
        tool_name=part.tool_name,
        input=part.input,
        kind=waiting.kind,
        step=part.step,
        message_id=message_id,
        turn_id=waiting.turn_id,
        decided=waiting.decided,
        sub_tool=waiting.sub_tool,
        sub_input=waiting.sub_input,
        original_input=waiting.original_input,
        asked_tool=waiting.asked_tool,
        asked_input=waiting.asked_input,
        edited_input=waiting.edited_input,
    )


def output_check(tool: Any, sub_tool: str | None = None) -> Callable[[Any], None] | None:
    """The check of a caller's output for a client-side call of ``tool``: its output
    schema's (:meth:`~runtime.tools.ClientTool.validate_output`), or, for a sub-agent's
    client tool ``sub_tool`` passed up through the agent tool ``tool``, that tool's
    (:meth:`~runtime.agent.AgentTool.validate_sub_output`); ``None``: no check. It
    raises :class:`~runtime.tools.ToolInputError`. A front end whose answers come as
    text reads them by it (an AG-UI tool message's, :mod:`runtime.app.web.agui_input`)."""
    if sub_tool is not None:
        sub_check = getattr(tool, "validate_sub_output", None)
        return None if sub_check is None else functools.partial(sub_check, sub_tool)
    return getattr(tool, "validate_output", None)  # type: ignore[no-any-return]


LARGE_OUTPUT_NODES = 2_000
"""A client's output of more JSON values than this (:func:`large_output`) is checked
against its tool's output schema in a worker thread (:func:`checked_output`), not on the
event loop that serves every session: 400,000 rows (10 MB) took 7.4 s to check, ~9 us a
value."""


def large_output(value: Any, nodes: int = LARGE_OUTPUT_NODES) -> bool:
    """Whether ``value`` (JSON) holds more than ``nodes`` values
    (:func:`~runtime.tools.json_values_over`)."""
    return json_values_over(value, nodes)


def checked_output(
    messages: Sequence[Message],
    key: str,
    output: Any,
    tools: Mapping[str, Any],
    max_chars: int | None = None,
    *,
    cut: bool = False,
) -> tuple[bool, Any]:
    """Check a client's ``output`` for the waiting client call ``key`` of ``messages``
    against its tool's output schema, as the decision would (:func:`_check`):
    ``(True, the output in the form it is stored in)`` when checked (the
    :class:`Decision` then carries that and ``output_checked``), ``(False, output)``
    when there is nothing to check here (no such undecided client call in
    ``messages``, a tool without an output schema: the decision checks what it finds).
    Raises :class:`InvalidDecision` when the schema refuses it. Runs in a worker thread
    for a large output (``Session.decide``, the AI SDK's answers): it reads only
    ``messages``, ``output`` and the tools' validators, which nothing changes meanwhile.

    ``cut``: the output is returned as it is stored (:func:`stored_output`: cut to
    ``max_chars``), a tool without an output schema's too, so the recording on the loop
    does not write the whole of it out again (``Session.decide``'s large outputs)."""
    call = next(
        (c for c in waiting_calls(messages) if key in (c.approval_id, c.tool_call_id)), None
    )
    if call is None or call.decided or call.kind == APPROVAL:
        return False, output
    check = output_check(tools.get(call.tool_name), call.sub_tool)
    if check is None:
        return (True, stored_output(call, output, max_chars)) if cut else (False, output)
    value = _storable_output(call, output)
    try:
        check(value)
    except ToolInputError as exc:
        raise InvalidDecision(str(exc)) from None
    # (with ``cut``, stored_output's form: the value checked, cut, not converted again)
    return True, truncate_output(value, max_chars) if cut else value


def _check(
    part: ToolCallPart, decision: Decision, tools: Mapping[str, Any], max_chars: int | None
) -> Awaiting:
    """The part's :class:`Awaiting` with ``decision`` in it, or :class:`InvalidDecision`.

    What the client gave (a reason, an output, an error) is kept cut to ``max_chars`` (the
    agent's ``max_tool_result_chars``) with the marker, as a server tool's stored result
    is: kept whole, a 1 MB reason or 10 MB output stayed in the session, read back and
    written again with it, though the model read only ``max_chars`` of it. An output is
    checked against the tool's schema whole, before it is cut; not again when the
    calling session's call passes it down (``by_caller``: its check was the caller's,
    on the whole output, and what it passes is cut to the calling agent's limit)."""
    waiting = part.awaiting
    assert waiting is not None
    given = decision.has_output or decision.error is not None
    if waiting.kind == APPROVAL:
        # Only a bool: ``approved="false"`` (a form field passed on) approved the call.
        if given or not isinstance(decision.approved, bool):
            raise InvalidDecision(
                f"call {part.tool_call_id!r} ({part.tool_name}) waits for approval: answer "
                f"with approved=True or approved=False (got {decision.approved!r})"
            )
        if decision.reason is not None and not isinstance(decision.reason, str):
            raise InvalidDecision(
                f"call {part.tool_call_id!r} ({part.tool_name}): the reason must be text or "
                f"None (got {type(decision.reason).__name__})"
            )
        return attrs.evolve(
            waiting,
            decided=True,
            approved=decision.approved,
            reason=_kept(decision.reason, max_chars),
        )  # (its stored schema, if no other wait names it, goes: drop_unneeded_schemas)
    if decision.edited_input is not None:
        raise InvalidDecision(
            f"call {part.tool_call_id!r} ({part.tool_name}) is a client-side tool: its input "
            "cannot be edited (the client runs it with the input it likes)"
        )
    if decision.approved is not None or not given:
        raise InvalidDecision(
            f"call {part.tool_call_id!r} ({part.tool_name}) is a client-side tool: answer "
            "with its output= (or error=)"
        )
    output = None
    if decision.error is None:
        output = _storable_output(part, decision.output, as_json=decision.output_checked)
        check = None
        # (by_caller: checked whole by the caller, which may have cut it)
        if not decision.by_caller and not decision.output_checked:
            check = output_check(tools.get(part.tool_name), waiting.sub_tool)
        if check is not None:
            try:
                check(output)
            except ToolInputError as exc:
                raise InvalidDecision(str(exc)) from None
    error = decision.error
    return attrs.evolve(
        waiting,
        decided=True,
        output=output if error is not None else truncate_output(output, max_chars),
        error=_kept(error, max_chars),
    )


def _edited(
    part: ToolCallPart,
    decision: Decision,
    tools: Mapping[str, Any],
    max_chars: int | None,
    schema: Any = None,
) -> Any:
    """The edited input ``decision`` approves ``part`` with, as the store will give it
    back (JSON), or :class:`InvalidDecision`: an edit goes with ``approved=True`` only
    (a denied call never runs, so an edit of it would be stored as if it had meant
    something), and must pass the tool's own check of its arguments, as the model's
    input did before the call waited: an input the tool would refuse would otherwise be
    approved and then fail as the tool's error.

    The check is the one the model's input had (:func:`_edit_check`): ``schema``, the one
    stored for the wait when no code holds it (an MCP server's tool, listed at run time,
    :func:`~runtime.messages.stored_schema`), else
    the tool's own by its name; never the tool by its name for a wait that names a
    stored schema its message lacks (:attr:`~runtime.messages.Awaiting.schema_ref`).
    A call whose sub-agent asked (``pass_approvals=True``)
    is an edit of the sub-agent's call (``Awaiting.asked_tool``/``asked_input``), not of
    the agent tool's prompt, checked against that tool's schema.

    Checked in the form the store gives back, which is the one the tool runs with
    (the executor validates the stored call): checked as given, ``{"x": NaN}`` passed a
    ``float`` parameter, was stored as ``{"x": null}`` and, approved, ran into the
    tool's "invalid arguments" error. A validator of the tool's own that raises
    something else than :class:`~runtime.tools.ToolInputError` refuses the edit too
    (the executor makes it the call's error; here it was a 500). What a refusal echoes
    of the edit (a key, a value's text, from the tool's own error message) is cut to
    :data:`ECHOED_CHARS`: a 100 KB key was a 100 KB error, five of them five times
    that.

    An edit longer than the call takes is :class:`EditTooLarge` (:func:`_check_size`),
    before the tool's check runs on it."""
    edited = decision.edited_input
    waiting = part.awaiting
    assert waiting is not None
    name, model_input = part.tool_name, part.input
    if waiting.nested:
        if waiting.asked_tool is None:  # (a wait stored before it named its sub call)
            raise InvalidDecision(
                f"call {part.tool_call_id!r} ({part.tool_name}) waits for a sub-agent's "
                "approval that does not say which call asks, so it cannot be edited"
            )
        name, model_input = waiting.asked_tool, waiting.asked_input
    where = f"call {part.tool_call_id!r} ({part.tool_name})"
    if waiting.nested:
        where = f"{where}, whose sub-agent's call of {name} asks,"
    if decision.approved is not True:
        raise InvalidDecision(f"{where}: an edited input goes with approved=True only")
    if not isinstance(edited, Mapping):
        raise InvalidDecision(
            f"{where}: the edited input must be a JSON object (got {type(edited).__name__})"
        )
    if decision.input_checked:  # (checked whole, on this call, by the caller: JSON)
        return edited
    if schema is None and waiting.schema_ref is not None:
        # The wait names a stored schema its message does not hold (a damaged or
        # hand-built record): the tool of that name here may be another listing's, or
        # another tool's altogether, so it must not stand in for the schema named.
        raise InvalidDecision(
            f"{where}: the schema stored for it ({waiting.schema_ref}) is not in its "
            "message, so an edited input cannot be checked"
        )
    check, schema = _edit_check(part, name, tools, schema)
    if check is None:  # the tool is gone (a redeploy): nothing to check the edit with
        raise InvalidDecision(
            f"{where}: the tool is not available here, so an edited input cannot be checked"
        )
    try:
        data = json_exact.dumps(to_jsonable(dict(edited)))
        stored = json_exact.loads(data)
    except (TypeError, orjson.JSONEncodeError) as exc:
        cause = str(exc).removeprefix("tool returned a value that cannot be serialized: ")
        raise InvalidDecision(
            f"{where}: the edited input cannot be stored as JSON: {_echoed(cause)}"
        ) from None
    if not decision.by_caller:  # (checked on the caller, against the same sub call)
        whose = "the agent's"
        if waiting.nested:  # bounded for the model it is replayed to: the asking agent's
            max_chars, whose = _asking_limit(tools.get(part.tool_name), waiting, max_chars)
        _check_size(data, model_input, max_chars, where, whose)
    unknown = _unknown_keys(stored, schema, model_input)
    if unknown:
        raise InvalidDecision(
            f"{where}: the edited input names {_echoed(', '.join(map(repr, unknown)))}, which "
            f"{name} does not take (its arguments: "
            f"{_echoed(', '.join(_properties(schema)) or 'none')}); the "
            "tool would run without them"
        )
    try:
        check(own_input(stored))  # (a validator of the tool's own may change what it gets)
    except ToolInputError as exc:
        raise InvalidDecision(f"{where}: {_echoed(str(exc))}") from None
    except Exception as exc:  # a validator of the tool's own that raised past pydantic
        raise InvalidDecision(
            f"{where}: invalid arguments for {name}: validation raised "
            f"{_echoed(describe_exception(exc))}"
        ) from None
    return stored


def _asking_limit(tool: Any, waiting: Awaiting, max_chars: int | None) -> tuple[int | None, str]:
    """The ``max_tool_result_chars`` an edit of a passed-up approval's sub call is bounded
    by, and whose it is: the agent whose call asked (found through the agent tool
    ``tool``, :meth:`~runtime.agent.AgentTool.asking_agent`), not the calling agent's
    ``max_chars``. The edit becomes that call's input in the sub-session and is replayed
    to the sub-agent's model on each of its later requests (the note in its result tells
    it again); the calling agent's model is never sent it. Bounded by the caller's, a
    sub-agent allowed 2,000 characters was given an edit of 100,000, and one allowed more
    than its caller was refused an edit it takes. ``max_chars`` when no such agent is
    found here."""
    find = getattr(tool, "asking_agent", None)
    agent = None if find is None else find(waiting.asked_via)
    budget = getattr(agent, "budget", None)
    if budget is None:
        return max_chars, "the agent's"
    name = getattr(agent, "name", None)
    return budget.max_tool_result_chars, (f"the sub-agent {name}'s" if name else "the sub-agent's")


def _check_size(
    data: bytes, model_input: Any, max_chars: int | None, where: str, whose: str = "the agent's"
) -> None:
    """:class:`EditTooLarge` when an edit's JSON (``data``, as stored) is longer, in
    characters as the model reads it (without
    :data:`~runtime.json_exact.BIG_INT_MARK`), than the larger of ``max_chars`` (the
    agent's ``max_tool_result_chars``; ``None``: no limit) and the JSON of the model's
    own input for the call (``model_input``): the edit is stored as the call's input
    and replayed to the model on every later call, so it is bounded as what the client
    gives otherwise is (a reason, a client tool's output: cut to ``max_chars``), while
    an edit no longer than what the model wrote itself always fits. Refused rather
    than cut: a cut input is not the one the person approved."""
    if max_chars is None:
        return
    if len(data) <= max_chars:  # (fewer bytes than the limit: fewer characters too)
        return
    try:
        own = len(json_exact.dumps(model_input, marked=False).decode())
    except TypeError:  # (never stored so: the limit alone)
        own = 0
    limit = max(max_chars, own)
    # The JSON's characters as the model reads it: not the mark stored before each
    # integer past 64 bits (a tab; a tab in a string is escaped, so each is a mark).
    size = len(data.decode()) - data.count(json_exact.BIG_INT_MARK)
    if size > limit:
        raise EditTooLarge(
            f"{where}: the edited input is {size:,} characters of JSON, more than the "
            f"{limit:,} it may have (the larger of {whose} max_tool_result_chars, "
            f"{max_chars:,}, and the model's own input, {own:,}): nothing was recorded, "
            "the call still waits",
            size=size,
            limit=limit,
        )


def _edit_check(
    part: ToolCallPart, name: str, tools: Mapping[str, Any], stored: Any
) -> tuple[Callable[[Any], Any] | None, Any]:
    """What checks an edit of ``part`` (of the call of tool ``name`` it stands for) and
    the schema whose keys it may name: ``stored``, the schema stored for the wait, when
    there is one
    (an MCP server's tool, the one the model was given, checked as the tool checks it,
    whether or not this process has that server's session), else the tool by its name
    (for a nested approval, the sub-agent's tool the agent tool finds). ``None``: no
    check here."""
    waiting = part.awaiting
    assert waiting is not None
    if isinstance(stored, dict):
        try:
            validator = _stored_validator(
                json_exact.dumps(stored, option=orjson.OPT_SORT_KEYS)  # (bounds exact)
            )
        except InvalidJSONSchema as exc:
            why = str(exc)

            def refuse(arguments: Any) -> Any:
                raise ToolInputError(
                    f"the schema stored with the wait cannot check it here ({why}), so an "
                    "edited input cannot be checked"
                )

            return refuse, stored

        def check(arguments: Any) -> Any:
            check_against_schema(name, validator, arguments, "arguments")
            return arguments

        return check, stored
    tool = tools.get(part.tool_name)
    if waiting.nested:
        find = getattr(tool, "asked_tool", None)
        tool = None if find is None else find(name, waiting.asked_via)
    return getattr(tool, "validate", None), getattr(tool, "parameters", None)


EDIT_CHECK_UNITS = 20_000
"""What compiling the patterns of one schema stored with a wait may newly cost, in the
units of :data:`~runtime.tools.PATTERN_UNITS` (~0.1-0.2 s at most, once per schema and
process: a compiled pattern is kept): it is built on the deciding event loop, a front
end's that serves every session. A pattern past it is not run on an edit (the server
checks its own input), as one the linear engine does not take."""


@functools.lru_cache(maxsize=32)
def _stored_validator(schema: bytes) -> Any:
    """The validator of a stored schema (its JSON, keys sorted): built once per schema
    for the last 32 (building checks the schema against its meta-schema, 2.4 ms for a
    two-argument tool's, against 0.05 ms for the check itself).

    Untrusted (:func:`~runtime.tools.linear_schema_validator`): the schema is what an
    MCP server listed and the value what an HTTP client sent, checked on the deciding
    process's event loop (a worker deployment's front end, every session's). Trusted, a
    1.3 KB schema of 16 ``anyOf`` definitions referring twice to the one before held the
    loop 9.5 s per edit (18: 34 s), and a ``pattern`` of ``^(a|aa)*$`` in Python's
    ``re`` minutes for 45 ``a`` and a ``!``. So its ``pattern`` s and
    ``patternProperties`` run in linear time, compiled within :data:`EDIT_CHECK_UNITS`,
    as the MCP tool's own check runs them on the model's input, and a check stops past
    :data:`~runtime.tools.UNTRUSTED_STEPS` keywords. What is not run here is logged
    once, as it is built (``approval.schema-not-checked-here``)."""
    validator = linear_schema_validator(json_exact.loads(schema), budget=[EDIT_CHECK_UNITS])
    if validator.axon_unchecked:
        get_logger("axon.approval").warning(
            "approval.schema-not-checked-here",
            unchecked=[redact(s) for s in validator.axon_unchecked],
            error="a schema stored with a wait: not run on an edited input here (the "
            "tool's server checks its own input): " + "; ".join(validator.axon_unchecked),
        )
    return validator


def _properties(schema: Any) -> list[str]:
    """The argument names an input schema declares."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return [str(k) for k in properties] if isinstance(properties, dict) else []


def _unknown_keys(edited: dict[str, Any], schema: Any, model_input: Any) -> list[str]:
    """The keys of ``edited`` that the tool's ``schema`` does not declare, unless it allows
    more (``additionalProperties``) or the model's own input had them: a function tool
    passes such a key over, so a person's misspelt ``"recursve": true`` or ``"dryrun":
    false`` was approved, stored as the call's input and shown, and the tool ran
    without it (with that argument's default)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    if schema.get("additionalProperties", False) not in (False, None):
        return []  # (true, or a schema for the rest: the tool takes other keys)
    known = set(schema["properties"])
    had = set(model_input) if isinstance(model_input, dict) else set()
    return [k for k in edited if k not in known and k not in had]


ECHOED_CHARS = 500
"""At most this much of a refused edit's own text (the tool's error message, which may
name its keys and values) is echoed in the refusal; the rest is cut, said so."""


def _echoed(text: str) -> str:
    """``text`` cut to :data:`ECHOED_CHARS`, with a visible marker when cut."""
    if len(text) <= ECHOED_CHARS:
        return text
    return f"{text[:ECHOED_CHARS]}... ({len(text) - ECHOED_CHARS:,} characters cut)"


def _decided_part(
    part: ToolCallPart,
    decision: Decision,
    tools: Mapping[str, Any],
    max_chars: int | None,
    schema: Any = None,
) -> ToolCallPart:
    """``part`` with ``decision`` in it: its :class:`Awaiting` decided (:func:`_check`)
    (an edit checked against ``schema``, the one stored for it, if any)
    and, approved with an edited input, that input as the call's own, the model's kept
    in :attr:`~runtime.messages.Awaiting.original_input`. The call's input is replaced,
    not shadowed, so everything that reads a call (the continuation that runs it, each
    provider's replay, the UI messages) sees the input the tool ran with and the result
    that input gave, with no reader of its own to get wrong."""
    waiting = _check(part, decision, tools, max_chars)
    if decision.edited_input is None:
        return attrs.evolve(part, awaiting=waiting)
    edited = _edited(part, decision, tools, max_chars, schema)
    if waiting.nested:  # the sub-agent's call is edited, as the call runs again
        if same_input(edited, waiting.asked_input):
            return attrs.evolve(part, awaiting=waiting)
        return attrs.evolve(part, awaiting=attrs.evolve(waiting, edited_input=edited))
    if same_input(edited, part.input):  # the model's own input sent back: a plain approval
        return attrs.evolve(part, awaiting=waiting)
    return attrs.evolve(
        part,
        input=edited,
        awaiting=attrs.evolve(waiting, original_input=part.input, edit_in_result=True),
    )


def same_input(edited: Any, model: Any) -> bool:
    """Whether an edit is the model's input sent back: JSON equality, where ``==``
    alone took ``true`` for ``1`` (and ``false`` for ``0``), so an edit of ``{"v": true}``
    to ``{"v": 1}`` was a plain approval and the tool ran with ``true``. Numbers are
    compared exactly otherwise (``1`` is ``1.0``: a client that parsed the call's input
    as JavaScript sends the model's ``1.0`` back as ``1``)."""
    if isinstance(edited, bool) or isinstance(model, bool):
        return type(edited) is type(model) and edited == model
    if isinstance(edited, dict) and isinstance(model, dict):
        return edited.keys() == model.keys() and all(
            same_input(edited[k], model[k]) for k in edited
        )
    if isinstance(edited, list | tuple) and isinstance(model, list | tuple):
        return len(edited) == len(model) and all(map(same_input, edited, model))
    return bool(edited == model)


def _kept(text: str | None, max_chars: int | None) -> str | None:
    """``text`` as a decision stores it: cut to ``max_chars``, with the marker."""
    return None if text is None else truncate_output(text, max_chars)


def _storable_output(
    part: ToolCallPart | PendingCall, output: Any, *, as_json: bool = False
) -> Any:
    """A client tool's ``output`` in the JSON form a server tool's return value takes
    (:func:`~runtime.tools.to_jsonable`: a set a list, a datetime its ISO text), or
    :class:`InvalidDecision` when it has none (an integer past 64 bits is kept
    exactly, :func:`runtime.json_exact.dumps`). As given, the model saw one value and the store
    kept another (an object's repr, bytes as base64, a set as its repr), or the save failed.
    ``as_json``: ``output`` is that form already (``Decision.output_checked``: JSON a
    body held, or this function's result), not converted again (pydantic-core's walk
    of 100,000 rows took 0.4 s of the loop, at each of a decision's two checks)."""
    try:
        value = output if as_json else to_jsonable(output)
        data = None if is_media_output(value) else json_exact.dumps(value)
    except TypeError as exc:
        raise InvalidDecision(
            f"call {part.tool_call_id!r} ({part.tool_name}): the output cannot be stored as "
            f"JSON: {exc}"
        ) from None
    if data is not None and reads_back_as_media(value):
        # Taken, it was JSON text to the model in this process and, once the session was
        # read back from the store, an image or file (a URL the agent's --media-urls off
        # refuses, data past its media limits) sent to the model as the tool's result.
        raise InvalidDecision(
            f"call {part.tool_call_id!r} ({part.tool_name}): the output is shaped as stored "
            "media parts (a list of image/file part objects), which a client's output "
            "cannot be"
        )
    # As the store gives it back: NaN and the infinities are null there (a server tool's
    # output is read back the same way, runtime.results.truncate_output).
    if as_json:
        return value
    return json_exact.loads(data) if data is not None and b"null" in data else value


def stored_output(
    call: PendingCall | ToolCallPart, output: Any, max_chars: int | None, *, as_json: bool = False
) -> Any:
    """A client tool's ``output`` for ``call`` as a decision stores it (:func:`_check`):
    its JSON form (:func:`_storable_output`), cut to ``max_chars`` with the marker. A
    :class:`Decision` that carries it (with ``output_checked``) is recorded as it is:
    the recording's cut keeps a text cut already (:func:`runtime.results.truncate_output`),
    so the whole output is not written out again. Why: a front end checks a large
    output in a worker thread, and the recording, on the event loop, wrote it twice
    more (100,000 rows, 1.2 MB: ~0.07 s of the loop)."""
    return truncate_output(_storable_output(call, output, as_json=as_json), max_chars)


def decide(
    messages: Sequence[Message],
    key: str,
    decision: Decision,
    tools: Mapping[str, Any],
    max_chars: int | None = None,
) -> tuple[int, tuple[Message, ...], PendingCall, bool]:
    """Apply ``decision`` to the waiting call ``key`` (an approval id, or a call id) of
    ``messages``: ``(index of the changed assistant message, the messages, the call,
    whether every waiting call is decided now)``. Raises :class:`UnknownApproval`,
    :class:`AlreadyDecided` or :class:`InvalidDecision`; changes nothing then. What the
    client gave is kept cut to ``max_chars`` (:func:`_check`), and an edited input
    longer than it (and than the model's own input) is :class:`EditTooLarge`
    (:func:`_check_size`): a caller that checks a decision here before recording it
    passes the ``max_chars`` the recording will use, or it would record the answers
    before such an edit and refuse that one only."""
    index, out, call, waiting = _decide(messages, key, decision, tools, max_chars)
    return index, out, call, all(c.decided for c in waiting)


def _decide(
    messages: Sequence[Message],
    key: str,
    decision: Decision,
    tools: Mapping[str, Any],
    max_chars: int | None = None,
    now: float | None = None,
) -> tuple[int, tuple[Message, ...], PendingCall, tuple[PendingCall, ...]]:
    """:func:`decide`, with the turn's waiting calls as the decision leaves them instead of
    whether all are decided: the history is scanned once (the last turn found, its calls
    read), and what that scan found is all a caller needs to know about the wait after
    the decision (how many calls are left, whether the turn can resume, which message
    and turn it continues)."""
    found = _last_turn(messages)
    waiting = _waiting_in(messages, found)
    call = next((c for c in waiting if key in (c.approval_id, c.tool_call_id)), None)
    if call is None:
        if _ever_waited(messages, key):
            raise AlreadyDecided(f"{key!r} was decided already")
        raise UnknownApproval(f"no call of this session waits for {key!r}")
    if call.decided:
        raise AlreadyDecided(f"{key!r} was decided already")
    assert found is not None
    index, message = found
    if not decision.by_caller:
        _check_owner(message, call, key)
        if now is not None:
            _check_deadline(message, call, key, now)
    parts = list(message.content)
    share_schemas(parts)  # (a record stored before refs: given them, so none is lost)
    at = next(
        i
        for i, p in enumerate(parts)
        if isinstance(p, ToolCallPart) and p.tool_call_id == call.tool_call_id
    )
    decided_part = parts[at]
    assert isinstance(decided_part, ToolCallPart)
    schema = stored_schema(parts, decided_part)
    parts[at] = _decided_part(decided_part, decision, tools, max_chars, schema)
    share_schemas(parts)  # (per-tool copies: the decided call's goes to the next, by name)
    drop_unneeded_schemas(parts)
    content = tuple(parts)
    out = list(messages)
    out[index] = attrs.evolve(message, content=content)
    if decision.edited_input is not None:
        part = next(
            p
            for p in content
            if isinstance(p, ToolCallPart) and p.tool_call_id == call.tool_call_id
        )
        assert part.awaiting is not None
        original = part.awaiting.original_input
        call = attrs.evolve(
            call,
            input=part.input,
            original_input=original,
            edited_input=part.awaiting.edited_input,
        )
    call = attrs.evolve(call, decided=True)
    after = tuple(call if c.tool_call_id == call.tool_call_id else c for c in waiting)
    return index, tuple(out), call, after


def _check_owner(message: AssistantMessage, call: PendingCall, key: str) -> None:
    """:class:`CallerDecides` when ``call`` waits for the session that called this one
    as a tool (:attr:`~runtime.messages.Awaiting.caller`): a decision here would
    leave the caller's wait for the same id undecided, or decided otherwise."""
    for part in message.content:
        if isinstance(part, ToolCallPart) and part.tool_call_id == call.tool_call_id:
            caller = part.awaiting.caller if part.awaiting is not None else None
            if caller is not None:
                raise CallerDecides(
                    f"{key!r} waits in a sub-session of session {caller!r}, which called "
                    f"its agent as a tool: decide it on session {caller!r}",
                    caller=caller,
                )
            return


def _check_deadline(message: AssistantMessage, call: PendingCall, key: str, now: float) -> None:
    """:class:`WaitExpired` when ``call``'s stored deadline is at or before ``now``: a
    decision that arrives after the wait expired is refused even though no timer has
    denied the call yet (every worker down, the host's timer not woken), or it would run
    a tool the person's window had closed on."""
    for part in message.content:
        if isinstance(part, ToolCallPart) and part.tool_call_id == call.tool_call_id:
            expires_at = part.awaiting.expires_at if part.awaiting is not None else None
            if expires_at is not None and expires_at <= now:
                raise WaitExpired(f"{key!r} can no longer be decided: the wait expired")
            return


def _ever_waited(messages: Sequence[Message], key: str) -> bool:
    """Whether any call of the history ever waited under ``key`` (then it was decided)."""
    return any(
        isinstance(p, ToolCallPart)
        and p.awaiting is not None
        and key in (p.awaiting.id, p.tool_call_id)
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
    )


class DecisionSave(Protocol):
    """How :func:`record_decision` saves a decided history (by default ``store.save``):
    a store that holds more than the session (a turn queue) saves the decision together
    with what it means there, in one transaction, and may refuse it by raising."""

    async def __call__(
        self,
        *,
        start: int,
        messages: Sequence[Message],
        meta: Mapping[str, Any],
        expected_version: int,
        call: PendingCall,
        complete: bool,
    ) -> int: ...


LastTurn = Callable[[], Awaitable[tuple[int, SessionRecord] | None]]
"""How :func:`record_decision` reads only the session's last turn: ``(the index of the
first message read, the session's record holding the messages from there on)``, from the
session's last assistant message on (all of it when there is none), meta and version as
a load's, in one snapshot; ``None`` when the session was never saved."""


async def record_decision(
    store: Store,
    session_id: str,
    key: str,
    decision: Decision,
    tools: Mapping[str, Any],
    *,
    save: DecisionSave | None = None,
    known: SessionRecord | None = None,
    only_known: bool = False,
    last_turn: LastTurn | None = None,
    max_chars: int | None = None,
    clock: Callable[[], float] | None = None,
) -> Recorded:
    """Record ``decision`` for the waiting call ``key`` of session ``session_id`` in
    ``store``: load, check, save on top of the version loaded. When another writer saved
    in between (a concurrent decision), load again and check again: a call someone else
    decided meanwhile raises :class:`AlreadyDecided`, so of two decisions exactly one
    wins. Raises :class:`UnknownApproval` for an id the session does not wait for (one
    of another session's is unknown here). ``save`` replaces the version-checked
    ``store.save`` (it must check ``expected_version`` the same way).

    ``known`` is the session as the caller holds it in memory (a loaded session whose
    history is all saved, at the version it was saved with): the first attempt decides
    on it instead of loading, one store round trip fewer. Nothing is lost if it is
    stale: its version no longer matches, the save conflicts, and the next attempt
    loads, as it would after any concurrent write.

    ``only_known``: decide on ``known`` alone, saved on top of its version or not at all:
    a conflicting save raises :class:`~runtime.errors.StoreConflict` (nothing recorded)
    instead of loading again, and the view's own refusal is raised as it is. For a caller
    that checked more than this decision against ``known`` (a body of several answers,
    :func:`runtime.app.web.answers.record_answers`): the save's version check tells it
    whether those checks were made on what the store held.

    ``last_turn`` reads the session's last turn instead of loading all of it: a decision
    looks at nothing else (the calls the last turn waits for, and the tool messages after
    it), and saves from that turn's assistant message on, so a session of 600,000
    messages is not decoded whole for one decision. The save's version check is the same
    (the read's version, one snapshot with its rows); a key the last turn does not wait
    for loads the whole session before it is refused, which alone says whether the call
    was decided already (:class:`AlreadyDecided`) or never waited
    (:class:`UnknownApproval`); one the last turn shows decided is refused as it is.

    ``max_chars``: the agent's ``max_tool_result_chars``; what the client gave (a reason,
    a client tool's output or error) is stored cut to it, with the marker, as a server
    tool's result is, and an edited input longer than it and than the model's own input
    is refused, :class:`EditTooLarge` (``None``: kept whole, any edit taken).

    ``clock``: the clock that decides the waits' deadlines (the host's); a call whose
    stored deadline is at or before its reading raises :class:`WaitExpired` (nothing
    recorded), read at each attempt just before the decision is checked and saved on
    top of the version checked, so an expiry saved meanwhile wins by the version check
    (``None``: deadlines not checked, the expiry's own save)."""
    conflict: StoreConflict | None = None
    if only_known and known is None:
        raise ValueError("only_known needs the view to decide on: known")
    for _ in range(1 if only_known else RECORD_ATTEMPTS):
        first = 0
        if known is not None:
            record = known
        elif last_turn is not None:
            first, record = await _last_turn_read(last_turn, key)
        else:
            record = await _loaded(store, session_id, key)
        now = None if clock is None else clock()
        try:
            decided = _decide(record.messages, key, decision, tools, max_chars, now)
        except (UnknownApproval, AlreadyDecided) as exc:
            if known is not None and not only_known:
                known = None  # the caller's view may be behind the store's: read it
                continue
            if known is not None or first == 0 or isinstance(exc, AlreadyDecided):
                raise
            # Not a call of the last turn: only the whole history says whether an
            # earlier turn's call waited under it (decided then) or none ever did.
            first, record = 0, await _loaded(store, session_id, key)
            decided = _decide(record.messages, key, decision, tools, max_chars, now)
        known = None
        try:
            return await _save_decided(store, session_id, record.version, decided, save, first)
        except StoreConflict as exc:
            conflict = exc
    assert conflict is not None
    raise conflict


async def _last_turn_read(last_turn: LastTurn, key: str) -> tuple[int, SessionRecord]:
    """What ``last_turn`` read: one never saved waits for nothing, so ``key`` is unknown."""
    read = await last_turn()
    if read is None:
        raise UnknownApproval(f"no call of this session waits for {key!r}")
    return read


async def _loaded(store: Store, session_id: str, key: str) -> SessionRecord:
    """The session :func:`record_decision` decides on, read from ``store``: one never
    saved waits for nothing, so ``key`` is unknown there."""
    record = await store.load(session_id)
    if record is None:
        raise UnknownApproval(f"no call of this session waits for {key!r}")
    return record


async def _save_decided(
    store: Store,
    session_id: str,
    expected_version: int,
    decided: tuple[int, tuple[Message, ...], PendingCall, tuple[PendingCall, ...]],
    save: DecisionSave | None,
    first: int = 0,
) -> Recorded:
    """Save what :func:`_decide` made of the history on top of ``expected_version`` (the
    version it was decided on), through ``save`` if given, else ``store.save``; what was
    recorded. Only the changed assistant message and what follows it is written, with
    the count of calls still waiting as the session's meta (:data:`WAITING_META`), so a
    reader of the meta alone knows whether the turn can resume. A concurrent writer
    makes this raise :class:`~runtime.errors.StoreConflict`: the caller loads again.
    ``first``: the history decided on is the session's from that index on (its last
    turn), so the save starts that much further and no whole history is recorded."""
    index, messages, call, waiting = decided
    left = sum(not c.decided for c in waiting)
    complete = not left
    changed = messages[index:]
    index += first
    if save is None:
        version = await store.save(
            session_id,
            index,
            changed,
            {WAITING_META: left},
            expected_version=expected_version,
        )
    else:
        version = await save(
            start=index,
            messages=changed,
            meta={WAITING_META: left},
            expected_version=expected_version,
            call=call,
            complete=complete,
        )
    whole = messages if first == 0 else None
    return Recorded(call=call, complete=complete, version=version, messages=whole, waiting=waiting)


def denial_text(reason: str | None) -> str:
    """The tool result a denied call gets: what the model reads."""
    return f"the tool call was denied: {reason or 'no reason given'}"


def approved_waiting(messages: Sequence[Message]) -> tuple[ToolCallPart, ...]:
    """The calls the last turn waits for that a person approved and that never ran (the
    continuation that would run them never came: a client that did not come back, a
    process stopped after the decision's save), in call order. A new user message runs
    them before it (:func:`supersede` leaves them to its caller): a recorded approval is
    never turned into a denial by a later message. A call whose sub-agent's client tool
    the caller answered (``Awaiting.sub_tool``) is one too: run, it passes the output
    down and its result is the sub-agent's answer."""
    found = _last_turn(messages)
    ids = {c.tool_call_id for c in _waiting_in(messages, found) if c.decided}
    if found is None or not ids:
        return ()
    return tuple(
        [
            p
            for p in found[1].content
            if isinstance(p, ToolCallPart)
            and p.tool_call_id in ids
            and p.awaiting is not None
            and (
                (p.awaiting.kind == APPROVAL and p.awaiting.approved)
                or p.awaiting.sub_tool is not None  # a sub-agent's client tool, answered:
            )  # its call runs with the output, which its sub-agent takes
        ]
    )


def supersede(
    messages: list[Message],
    max_chars: int | None = None,
    leave: Collection[str] = (),
    reason: str = SUPERSEDED,
) -> int | None:
    """Before a new user message: deny every call the last turn still waits for and that
    nobody decided, with reason ``superseded`` (what ``useChat`` does when the user types
    instead of answering), and give each waiting call its result, so the history a model
    sees is whole: a decided one its decision's (a denial with its reason, a client
    tool's output or error). Changes ``messages`` in place; returns the index of the
    changed assistant message (``None``: nothing waited). A result made of what the
    client gave (a client tool's output or error, a denial's reason) is cut to
    ``max_chars`` (the agent's ``max_tool_result_chars``), as a server tool's is.

    The calls named in ``leave`` (the approved ones, :func:`approved_waiting`) get no
    result here: the caller runs them and adds theirs. ``reason``: why the turn will
    not resume (an agent used as a tool whose caller went on: ``NESTED_WAIT``)."""
    waiting = waiting_calls(messages)
    if not waiting:
        return None
    found = _last_turn(messages)
    assert found is not None
    index, message = found
    content = []
    results: list[ToolMessage] = []
    for p in message.content:
        if (
            isinstance(p, ToolCallPart)
            and p.awaiting is not None
            and any(c.tool_call_id == p.tool_call_id for c in waiting)
        ):
            w = p.awaiting
            w = attrs.evolve(w, schema=None)  # (nothing waits: no edit to check)
            if not w.decided:
                w = attrs.evolve(w, decided=True, reason=reason)
                w = attrs.evolve(w, approved=False) if w.kind == APPROVAL else w
                if w.kind == CLIENT:
                    w = attrs.evolve(w, error=reason)
            p = attrs.evolve(p, awaiting=w)
            if p.tool_call_id not in leave:
                results.append(_superseded_result(p, max_chars, reason))
        content.append(p)
    messages[index] = attrs.evolve(message, content=tuple(content))
    messages.extend(results)
    return index


def _superseded_result(part: ToolCallPart, max_chars: int | None, why: str) -> ToolMessage:
    w = part.awaiting
    assert w is not None
    if w.kind == APPROVAL:
        not_run = "a new message superseded it" if why == SUPERSEDED else why
        error = (
            f"the tool call was not executed: {not_run}"
            if w.approved
            else truncate_output(denial_text(w.reason), max_chars)
        )
        return ToolMessage(
            tool_call_id=part.tool_call_id,
            tool_name=part.tool_name,
            step=part.step,
            error=error,
            # an approved edit never run: what the model is told says so (replay_edits)
            ran=False if w.approved and w.edit_in_result else None,
        )
    return ToolMessage(
        tool_call_id=part.tool_call_id,
        tool_name=part.tool_name,
        step=part.step,
        output=None if w.output is None else truncate_output(w.output, max_chars),
        error=None if w.error is None else truncate_output(w.error, max_chars),
    )


__all__ = [
    "APPROVAL",
    "AWAITING_INPUT",
    "CLIENT",
    "LARGE_OUTPUT_NODES",
    "SUPERSEDED",
    "SUSPENDED_TRACE_META",
    "WAITING_META",
    "Decision",
    "DecisionSave",
    "LastTurn",
    "PendingCall",
    "Recorded",
    "approval_decided",
    "approved_waiting",
    "checked_output",
    "decide",
    "denial_text",
    "large_output",
    "output_check",
    "pending_calls",
    "record_decision",
    "stored_output",
    "supersede",
    "waiting_calls",
]
