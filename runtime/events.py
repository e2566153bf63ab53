"""Lifecycle events published on the bus.

Every event is a frozen, keyword-only value with a stable dotted ``kind`` and the ids an
observer needs to correlate it across agents: ``session_id``, ``turn_id`` and, where it
has one, ``step`` and a ``causation_id`` (the id of whatever made it happen). The public
output stream's chunks (:mod:`runtime.output`) are bus events too, under ``output.*``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

import attrs

from runtime.chunks import Usage, _eq, _hash, _repr
from runtime.lifecycle import Event as Event  # its base, apart: see runtime/lifecycle.py
from runtime.messages import Message, UserContent
from runtime.output import ErrorInfo, _value

_C = TypeVar("_C", bound=type)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(attrs.field,))
def _event(kind: str) -> Callable[[_C], _C]:
    def wrap(cls: _C) -> _C:
        cls.kind = kind  # type: ignore[attr-defined]
        return _value(cls)  # ids last, shared __repr__

    return wrap


@_value
class _InTurn(Event):
    """An event of one turn: the session and turn it belongs to, after the event's own
    fields, and what caused it (a sub-agent's turn: the parent's tool call id)."""

    session_id: str
    turn_id: str
    causation_id: str | None = None


@_value
class _InSession(Event):
    """An event of one session, in a turn or not."""

    session_id: str
    turn_id: str | None = None
    causation_id: str | None = None


@_value
class _Anywhere(Event):
    """An event of the machinery (an actor, the bus), in a session and turn when it was
    serving one."""

    session_id: str | None = None
    turn_id: str | None = None
    causation_id: str | None = None


@attrs.frozen(kw_only=True, slots=True)
class TraceContext:
    """A span's ids as a tracer gave them (hex: 32 digits of trace id, 16 of span id),
    kept in the store so that a span made in another process can link to it."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    trace_id: str
    span_id: str


@_event("turn.started")
class TurnStarted(_InTurn):
    """A turn began. For a sub-agent's turn (``agent.as_tool()``), ``causation_id`` is the
    parent's tool call id, so an observer can nest the sub-turn under that call."""

    agent: str
    input: UserContent
    """The user input: text, or parts when it carried images or files."""
    provider: str | None = None
    """The provider's name (``openai``, ``anthropic``, ...), for tracing."""
    model: str | None = None
    """The model the turn's calls ask for, for tracing."""
    resumed: bool = False
    """The turn goes on from committed steps: the continuation of a turn that waited
    for input (docs/approval.md), or one taken over from a worker that died."""
    suspended_trace: TraceContext | None = None
    """The continuation of a turn that waited: the trace context its suspended span had,
    as stored with the wait (:data:`runtime.approval.SUSPENDED_TRACE_META`), for a
    tracer to link to."""


@_event("turn.finished")
class TurnFinished(_InTurn):
    """The turn ended: normally, by error, by budget, or aborted (``finish_reason``)."""

    finish_reason: str
    usage: Usage
    steps: int
    error: ErrorInfo | None = None
    abort_reason: str | None = None
    budget: str | None = None
    """Which budget ended the turn, when ``finish_reason`` is ``budget``."""
    saved: bool = True
    """Whether the store confirmed the turn's final save (``TurnResult.saved``): ``False``
    when it failed (``error`` says why) or did not answer within ``SAVE_TIMEOUT``."""


@_event("step.started")
class StepStarted(_InTurn):
    step: int


@_event("step.finished")
class StepFinished(_InTurn):
    step: int
    finish_reason: str
    usage: Usage


@_event("message.added")
class MessageAdded(_InTurn):
    """A message was appended to (or, for the turn's assistant message, updated in) history."""

    index: int
    message: Message


@_event("tool.call-requested")
class ToolCallRequested(_InTurn):
    step: int
    tool_call_id: str
    tool_name: str
    input: Any


@_event("tool.call-completed")
class ToolCallCompleted(_InTurn):
    step: int
    tool_call_id: str
    tool_name: str
    output: Any = None
    error: str | None = None
    duration: float = 0.0


@_event("session.saved")
class SessionSaved(_InTurn):
    message_count: int
    step: int | None = None


@_event("session.evicted")
class SessionEvicted(Event):
    """An idle session was freed from memory: its actors stopped and its history dropped
    (the store keeps it; the next use loads it again). ``reason`` is ``idle`` (unused for
    the host's ``idle_ttl``) or ``capacity`` (least recently used past ``max_sessions``)."""

    session_id: str
    reason: str
    idle_for: float
    """Seconds since the session was last used."""


@_event("session.concurrent-write")
class ConcurrentWrite(_InSession):
    """Another writer (another process or host on the same store) changed this session.

    ``resolution`` says what this process did about it: ``"reloaded"`` (a turn started
    on the stored history, which had moved on) or ``"rebased"`` (a save met the other
    writer's turns; this turn's messages were appended after them instead of over them).
    ``added`` counts the other writer's messages this session now holds, ``dropped`` the
    messages this session held that the store no longer has (another writer deleted the
    session, say). ``version`` and ``message_count`` describe the session afterwards.
    """

    resolution: str
    version: int
    message_count: int
    added: int
    dropped: int


@_event("actor.crashed")
class ActorCrashed(_Anywhere):
    """An actor's handler raised; the supervisor decides what happens next."""

    actor: str
    error: str
    error_type: str
    restarts: int


@_event("actor.restarted")
class ActorRestarted(_Anywhere):
    actor: str
    restarts: int


@_event("actor.gave-up")
class ActorGaveUp(_Anywhere):
    """Restart intensity exceeded: the actor stays down and its session fails."""

    actor: str
    restarts: int
    error: str


@_event("bus.lagged")
class Lagged(_Anywhere):
    """Delivered to a ``drop-oldest`` subscriber in place of ``dropped`` events it missed."""

    subscriber: str
    dropped: int


@_event("provider.retry")
class ProviderRetry(_InTurn):
    """A model call failed before producing output and will be tried again."""

    step: int
    attempt: int
    delay: float
    error: ErrorInfo


@_event("provider.throttled")
class ProviderThrottled(_InTurn):
    """A model call waits for its provider's rate limit (:mod:`runtime.ratelimit`):
    about ``wait`` seconds, for ``reason`` ``requests``, ``tokens``, ``concurrency`` or
    ``provider`` (``retry-after`` or an ``x-ratelimit-*`` header said so). ``key`` names
    the limit (provider, model, endpoint)."""

    step: int
    wait: float
    reason: str
    key: str


@_event("history.compacted")
class HistoryCompacted(_InTurn):
    """A history processor stored a summary before a model call (context compaction,
    :mod:`runtime.compaction`): ``covered`` messages of the request are now sent as the
    summary, which is saved with the turn. ``usage`` is the summary call's (it counts
    toward the turn's); the token counts are the request's before and after."""

    step: int
    tokens_before: int
    tokens_after: int
    covered: int
    usage: Usage


@_event("provider.fallback")
class ProviderFallback(_InTurn):
    """A model call failed after its retries with an error its agent's
    :class:`~runtime.provider.FallbackProvider` covers: the turn goes on with the next
    provider, from the same step. If the call had streamed output, ``reset`` is true and
    the stream carried a ``reset-step`` chunk (:class:`~runtime.output.ResetStep`)."""

    step: int
    from_provider: str
    """The actor name of the provider that failed (``anthropic:claude-sonnet-4-5``)."""
    to_provider: str
    """The actor name of the provider the turn goes on with."""
    error: ErrorInfo
    provider: str | None = None
    """The registry name of the provider the turn goes on with (as in
    :class:`TurnStarted`)."""
    model: str | None = None
    """Its model."""
    reset: bool = False
    """Whether the failed call had streamed output that the step's restart discarded."""


@_event("tool.approval-requested")
class ToolApprovalRequested(_InTurn):
    """A tool marked ``needs_approval`` waits for a :class:`ToolApprovalDecided`."""

    step: int
    tool_call_id: str
    tool_name: str
    input: Any


@_event("tool.approval-decided")
class ToolApprovalDecided(_InSession):
    """Approve or deny a pending tool call; a denial becomes the tool's error result."""

    tool_call_id: str
    approved: bool
    reason: str | None = None
    edited: bool = False
    """Approved with an edited input: the call's stored input is the person's, the
    model's kept in :attr:`~runtime.messages.Awaiting.original_input` (docs/approval.md,
    "Approving with edits"). The input itself is not on the bus: it may be large, and
    the stored call holds it."""


@_event("tool.approval-expired")
class ToolApprovalExpired(_InSession):
    """A waiting call's ``approval_timeout`` passed before anyone decided it: it is
    recorded as denied (a client tool's as failed) with ``reason`` ``timed out``
    (docs/approval.md). ``causation_id`` is the approval id (a client tool's call id)."""

    tool_call_id: str
    tool_name: str
    reason: str


@_event("turn.steered")
class TurnSteered(_InTurn):
    """A user message joined the running turn (the ``steer`` busy strategy,
    :mod:`runtime.busy`): stored as message ``message_id`` before step ``step``'s
    model call, which is the first to see it."""

    step: int
    message_id: str
    input: UserContent


@_event("turn.queued")
class TurnQueued(_InTurn):
    """A user message arrived while a turn ran and waits for its turn (the ``enqueue``
    and ``interrupt`` busy strategies, or a steered message the running turn ended
    before taking); ``turn_id`` is the turn it will run as, ``ahead`` how many turns
    (running or waiting) come first. ``turn.started`` follows when it runs."""

    strategy: str
    ahead: int


LIFECYCLE_EVENT_TYPES: tuple[type, ...] = (
    TurnStarted,
    TurnFinished,
    StepStarted,
    StepFinished,
    MessageAdded,
    ToolCallRequested,
    ToolCallCompleted,
    SessionSaved,
    SessionEvicted,
    ConcurrentWrite,
    ActorCrashed,
    ActorRestarted,
    ActorGaveUp,
    Lagged,
    ProviderRetry,
    ProviderThrottled,
    HistoryCompacted,
    ProviderFallback,
    ToolApprovalRequested,
    ToolApprovalDecided,
    ToolApprovalExpired,
    TurnSteered,
    TurnQueued,
)
