"""The public stream: :data:`OutputChunk`, what a UI consumes.

Grammar of one turn::

    start (step-start CONTENT* (reset-step CONTENT*)* step-finish)+ finish
                                                          -- or cut short by error / abort

A ``reset-step`` voids the step's content so far (its model call failed mid-stream and
the step starts over on a fallback provider, docs/providers.md): a consumer drops it.

A turn that suspends (docs/approval.md) has ``tool-approval-request`` s in its last step
and ends with ``finish`` (``awaiting-input``); its continuation starts with the results of
the calls it waited for (``tool-result`` / ``tool-error`` / ``tool-output-denied``, before
any ``step-start``), then its steps go on numbered after the suspended one's.

Every ``*-start`` has exactly one matching ``*-finish`` before the next ``step-finish``;
an ``object-delta`` comes only inside the text part it parses; ``part_id`` s are unique
across the whole turn; ``seq`` is monotonic per session. Each
chunk is also a bus event (``kind`` = ``"output." + type``) and carries the ids an
observer needs to correlate it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, dataclass_transform

import attrs

from runtime.chunks import Usage, _eq, _hash, _repr
from runtime.redact import redact_urls

if TYPE_CHECKING:
    from runtime.messages import Message  # messages imports ErrorInfo from here


@attrs.frozen(kw_only=True, slots=True)
class ErrorInfo:
    """What an ``error`` chunk tells the consumer about a failure.

    Every error text that leaves the process (the ``error`` chunk, ``TurnResult.error``,
    the web ``errorText``, ``run --jsonl``, the stored failed message) is made from one of
    these, so ``message`` is redacted here, once, whatever built it.
    """

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    kind: str
    """The error class name, e.g. ``"RateLimited"``; stable, for programs to switch on."""
    message: str = attrs.field(converter=redact_urls)
    """What went wrong, with credentials replaced by ``[redacted]``."""
    retryable: bool = False


_C = TypeVar("_C", bound=type)


def _ids_last(cls: type, fields: list[attrs.Attribute[Any]]) -> list[attrs.Attribute[Any]]:
    """attrs field transformer: a class's own fields first, the correlation ids it inherits
    after them, so a chunk or event reads (and serializes) as what it says, then whose."""
    # ``Attribute.inherited`` is documented attrs API that its stubs do not declare.
    inherited = [f for f in fields if f.inherited]  # type: ignore[attr-defined]
    return [f for f in fields if f not in inherited] + inherited


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(attrs.field,))
def _value(cls: _C) -> _C:
    """A frozen, slotted, keyword-only value class with the shared ``__repr__``, ``__eq__``
    and ``__hash__``.

    repr=False: one shared __repr__ (:func:`runtime.chunks._repr`, which every contract value
    class uses) instead of one compiled per class, which keeps ``import runtime`` cheap;
    equality and hashing likewise (:func:`runtime.chunks._eq`, set on the class itself, so
    attrs sees them as the class's own and compiles none). The bases that carry the
    correlation ids use it too, so the type checker sees their fields in every subclass.
    """
    cls.__eq__ = _eq  # type: ignore[assignment]
    cls.__hash__ = _hash  # type: ignore[assignment]
    return attrs.frozen(kw_only=True, slots=True, repr=False, field_transformer=_ids_last)(cls)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(attrs.field,))
def _out(type_: str) -> Callable[[_C], _C]:
    """Decorator: attach type/kind and make a frozen value class."""

    def wrap(cls: _C) -> _C:
        cls.type = type_  # type: ignore[attr-defined]
        cls.kind = "output." + type_  # type: ignore[attr-defined]
        return _value(cls)

    return wrap


@_value
class _Base:
    """What every chunk carries after its own fields: its place in the session's stream
    (``seq``, stamped by the stream controller) and the ids to correlate it with."""

    type: ClassVar[str]
    kind: ClassVar[str]
    __repr__ = _repr

    seq: int = 0
    session_id: str = ""
    turn_id: str = ""


@_out("start")
class Start(_Base):
    message_id: str


@_out("step-start")
class StepStart(_Base):
    step: int


@_out("text-start")
class TextStart(_Base):
    step: int
    part_id: str


@_out("text-delta")
class TextDelta(_Base):
    step: int
    part_id: str
    text: str


@_out("text-finish")
class TextFinish(_Base):
    step: int
    part_id: str


@_out("object-delta")
class ObjectDelta(_Base):
    """The structured answer parsed so far (an agent with an ``output_type``), sent after
    the text deltas of its JSON whenever the parsed value changed. ``part_id`` is the text
    part whose JSON it is; ``value`` is leniently parsed and not yet validated: the
    validated answer is ``output.result.output``."""

    step: int
    part_id: str
    value: Any


@_out("reasoning-start")
class ReasoningStart(_Base):
    step: int
    part_id: str


@_out("reasoning-delta")
class ReasoningDelta(_Base):
    step: int
    part_id: str
    text: str


@_out("reasoning-finish")
class ReasoningFinish(_Base):
    step: int
    part_id: str


@_out("tool-input-start")
class ToolInputStart(_Base):
    step: int
    tool_call_id: str
    tool_name: str


@_out("tool-input-delta")
class ToolInputDelta(_Base):
    step: int
    tool_call_id: str
    delta: str


@_out("tool-call")
class ToolCall(_Base):
    step: int
    tool_call_id: str
    tool_name: str
    input: Any


@_out("tool-result")
class ToolResult(_Base):
    step: int
    tool_call_id: str
    tool_name: str
    output: Any


@_out("tool-error")
class ToolError(_Base):
    step: int
    tool_call_id: str
    tool_name: str
    error: str


@_out("tool-approval-request")
class ToolApprovalRequest(_Base):
    """The call waits for a person's decision: the turn suspends after this step
    (``finish`` with ``awaiting-input``) until ``session.respond(approval_id, ...)``."""

    step: int
    tool_call_id: str
    tool_name: str
    approval_id: str
    asked_tool: str | None = None
    """The call is an agent used as a tool whose sub-agent's approval is passed up
    (``as_tool(pass_approvals=True)``): the tool of the sub-agent's call that asks (two
    agents deep, the innermost one's), and :attr:`asked_input` that call's input, which an
    edit of this approval replaces (:attr:`~runtime.messages.Awaiting.asked_tool`).
    ``None``: the call asks for itself (and left out of the chunk's JSON)."""
    asked_input: Any = None
    """With :attr:`asked_tool`: that call's input, as the sub-agent's model gave it."""
    asked_via: tuple[str, ...] = ()
    """With :attr:`asked_tool`, two and more agents deep: the agent tools between
    (:attr:`~runtime.messages.Awaiting.asked_via`). ``()``: left out of the JSON."""
    seq: int = 0
    session_id: str = ""
    turn_id: str = ""


@_out("tool-output-denied")
class ToolOutputDenied(_Base):
    """A waiting call was denied; the model sees the denial (with ``reason``) as its result."""

    step: int
    tool_call_id: str
    tool_name: str
    reason: str | None = None
    seq: int = 0
    session_id: str = ""
    turn_id: str = ""


@_out("tool-stream")
class ToolStream(_Base):
    """A chunk streamed by a running tool (an agent used as a tool streams its whole turn),
    nested under the parent's tool call. ``chunk`` keeps its own ``seq`` and part ids."""

    step: int
    tool_call_id: str
    tool_name: str
    chunk: Any


@_out("throttled")
class Throttled(_Base):
    """The step's model call waits for a rate limit (:mod:`runtime.ratelimit`): about
    ``wait`` seconds (another caller may take the slot first: it may come again), for
    ``reason`` ``requests``, ``tokens``, ``concurrency`` or ``provider`` (a pause the
    provider asked for). A notice for the UI; nothing of it is stored."""

    step: int
    wait: float
    reason: str


@_out("budget-wait")
class BudgetWait(_Base):
    """The step's model call (or its history's summary call) waits for output tokens
    the calls beside it hold: a sub-agent called at once with others draws on what its
    calling turn has left (:class:`runtime.budget.OutputAccount`), and this call may be
    sent ``want`` tokens as its cap while ``available`` are free, ``held`` reserved by
    calls in flight and ``ahead`` reservations wait before it (first come, first
    served). It goes on once enough comes back, or, nothing held, with what is left.
    Why: such a sub-turn said nothing while it waited, and a UI showed a stream that
    had stopped for no reason. A notice for the UI; nothing of it is stored."""

    step: int
    want: int
    available: int
    held: int
    ahead: int


@_out("steered")
class Steered(_Base):
    """A user message joined the running turn (the ``steer`` busy strategy,
    :mod:`runtime.busy`): stored as message ``message_id`` before step ``step``, whose
    model call is the first to see it. Sent before that step's ``step-start``, so a UI
    shows the message where the model saw it, without a reload. ``text`` is the
    message's text (its text parts joined; its images and files are in the stored
    message only). ``answer_id`` is the id of the assistant message the turn's steps go
    to from here (stored after the steered message): a client that shows the rest of the
    turn after the message it sent names its answer so.

    ``answered``: the message (a client's retry of it) was stored and answered by an
    earlier turn already; it is not stored again and nothing of this turn answers it:
    ``answer_id`` is that stored answer's id ("" when none follows it). A client that
    follows its steer ends there; the turn's own stream goes on."""

    step: int
    message_id: str
    text: str
    answer_id: str = ""
    answered: bool = False


@_out("reset-step")
class ResetStep(_Base):
    """Discard everything of step ``step`` shown so far: its model call failed after it
    had streamed output, and the step starts over on the next provider of the agent's
    :class:`~runtime.provider.FallbackProvider` (``provider``, its actor name), from
    the last committed step. A consumer drops the step's text, reasoning, object and
    tool-input parts it received since the step's ``step-start``; nothing of them is
    stored. The open part (if any) was closed by its ``*-finish`` just before; no new
    ``step-start`` follows: the step's new parts come next, with new ``part_id`` s.
    ``error`` is the failure that made the step start over."""

    step: int
    provider: str
    error: ErrorInfo


@_out("step-finish")
class StepFinish(_Base):
    step: int
    finish_reason: str
    usage: Usage


@_out("finish")
class Finish(_Base):
    finish_reason: str
    usage: Usage
    budget: str | None = None
    """Which budget ended the turn, when ``finish_reason`` is ``budget``."""


@_out("error")
class Error(_Base):
    error: ErrorInfo


@_out("abort")
class Abort(_Base):
    reason: str


OutputChunk = (
    Start
    | StepStart
    | TextStart
    | TextDelta
    | TextFinish
    | ObjectDelta
    | ReasoningStart
    | ReasoningDelta
    | ReasoningFinish
    | ToolInputStart
    | ToolInputDelta
    | ToolCall
    | ToolResult
    | ToolError
    | ToolApprovalRequest
    | ToolOutputDenied
    | ToolStream
    | Throttled
    | BudgetWait
    | Steered
    | ResetStep
    | StepFinish
    | Finish
    | Error
    | Abort
)

OUTPUT_CHUNK_TYPES: tuple[type, ...] = OutputChunk.__args__
DELTA_TYPES: tuple[type, ...] = (TextDelta, ReasoningDelta, ToolInputDelta, ObjectDelta)
"""Chunks logged only at debug level: the hot path."""


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class TurnResult:
    """What a finished turn leaves behind (``output.result``)."""

    __repr__ = _repr

    turn_id: str
    finish_reason: str
    """``stop``, ``length``, ``content-filter``, ``budget``, ``error``, ``aborted``, ..."""
    usage: Usage
    steps: int
    message: Message
    """The turn's assistant message."""
    tool_messages: tuple[Message, ...] = ()
    error: ErrorInfo | None = None
    abort_reason: str | None = None
    budget: str | None = None
    """Which budget ended the turn, when ``finish_reason`` is ``budget``."""
    output: Any = None
    """The validated answer of an agent with an ``output_type`` (an instance of it, or
    the ``dict`` for a JSON schema); ``None`` otherwise, or when no answer validated."""
    new_messages: tuple[Message, ...] = ()
    """What the turn added to the history, in order: its user message, its assistant
    message and the tool results. A program that keeps the conversation itself appends
    them to the history it passes the next turn (``open_session(history=...)``)."""
    pending: tuple[Any, ...] = ()
    """When ``finish_reason`` is ``awaiting-input``: the calls the turn waits for
    (:class:`runtime.approval.PendingCall` s), to decide with ``session.respond``."""
    saved: bool = True
    """Whether the store confirmed the turn's final save. ``False`` when it failed or was
    not answered within the turn runner's ``SAVE_TIMEOUT`` (then it may still land, in
    this process's order): a worker, whose turn the next one may run elsewhere, does not
    mark such a turn done but gives it back (runtime.app.worker)."""

    @property
    def text(self) -> str:
        """The answer: the text of the turn's assistant message, all steps joined."""
        return self.message.text  # type: ignore[union-attr]
