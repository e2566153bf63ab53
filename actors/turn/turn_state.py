"""What one turn accumulates, shared by the turn runner's modules.

The runner (:mod:`actors.turn.runner`) and the parts mixed into it (saving, model calls,
tool calls, suspension) all read and change the same :class:`Turn`; it lives here, apart
from them all, so that each can import it without importing the runner (a cycle).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs

from actors.turn.parts import PartsManager
from actors.turn.structured import StructuredTurn
from runtime.actor_messages import Batcher, ToolOutcome, TurnSteering
from runtime.budget import Budget, OutputAccount
from runtime.chunks import ToolCallChunk, Usage
from runtime.errors import AxonError, ContextTooLong, exception_message
from runtime.ids import new_id
from runtime.messages import Awaiting, ToolCallPart, ToolMessage
from runtime.output import ErrorInfo
from runtime.store import SessionRecord
from runtime.tools import Tool


@attrs.define(slots=True)
class Step:
    """What one model call of a step produced: how it finished, its usage, its calls."""

    finish: str = "other"
    usage: Usage = attrs.field(factory=Usage)
    calls: list[ToolCallChunk] = attrs.field(factory=list)
    produced: bool = False
    cap: int | None = None
    """The output tokens the turn's budget let the call write: what the turn had left,
    at most what its :attr:`Turn.account` had (``None``: no budget)."""
    sent: int | None = None
    """The output cap the provider's request carried (``Provider.sent_cap``, when
    :attr:`cap` is set): :attr:`cap`, or a smaller one of the agent's ``settings``, the
    provider's options or its API's default (Anthropic's ``max_tokens``, 4096), which
    then is what cut a ``length`` call (:func:`actors.turn.inference.cut_by_budget`)."""
    held: int = 0
    """The tokens the call reserved in :attr:`Turn.account` (given back, less what it
    wrote, when it is over: :meth:`OutputAccount.settle <runtime.budget.OutputAccount.
    settle>`)."""
    resume: bool = False
    """The model paused its turn (:attr:`FinishChunk.resume <runtime.chunks.FinishChunk.
    resume>`): a call sending the conversation as it stands continues it."""


_NO_LIMITS = Budget()
"""A :class:`Turn`'s budget until the runner sets its own (frozen: one for all)."""


@attrs.define(slots=True, eq=False)
class Turn:
    """Everything one turn accumulates, and the context its steps and model calls run
    in; owned by the turn runner's task."""

    turn_id: str
    start_index: int
    """Index of the turn's user message in the history."""
    ctrl: Batcher
    """Where the turn's raw items go: the stream controller."""
    a_index: int = 0
    """Index of the turn's assistant message."""
    message_id: str = attrs.field(factory=lambda: new_id("msg"))
    """The id of the assistant message the turn's steps go to now (another after a
    message is steered in: :func:`actors.turn.takeover.steered_message_id`)."""
    first_message_id: str = ""
    """The id of the turn's first assistant message (its queue row's, in a worker)."""
    parts: PartsManager = attrs.field(factory=PartsManager)
    """Decides the part boundaries; ``parts.content`` is the assistant message's."""
    results: dict[str, ToolMessage] = attrs.field(factory=dict)
    """Tool messages added to the history, by call id."""
    unsaved_steers: list[tuple[Any, Any]] = attrs.field(factory=list)
    """``(SteeredInput, its UserMessage)`` of the messages steered into the turn that no
    save confirmed yet: each ``stored`` is set once one does (or the turn is over)."""
    outcomes: dict[str, ToolOutcome] = attrs.field(factory=dict)
    """Every outcome received, as it arrived: kept even if the turn is then cancelled."""
    usage: Usage = attrs.field(factory=Usage)
    limits: Budget = _NO_LIMITS
    """The budget the turn runs under: the agent's, its output tokens bounded for this
    run by :attr:`RunTurn.max_output_tokens <runtime.actor_messages.RunTurn.
    max_output_tokens>` (an agent tool's sub-turn: what its caller has left)."""
    account: OutputAccount | None = None
    """The live account this run's model calls reserve their caps in and settle into
    (:attr:`RunTurn.output_account <runtime.actor_messages.RunTurn.output_account>`: an
    agent tool's sub-turn shares its caller's batch's with the batch's other calls);
    ``None``: none (a turn an application runs)."""
    step: int = 0
    step_open: bool = False
    ended: bool = False
    """Whether its :class:`~runtime.actor_messages.TurnEnd` went to the controller (a
    runner that crashes after it sends only the result)."""
    tool_calls_used: int = 0
    resumed: int = 0
    """The paused calls the turn continued (:data:`actors.turn.runner.MAX_RESUMES`)."""
    finish_reason: str = "stop"
    error: ErrorInfo | None = None
    abort_reason: str | None = None
    budget: str | None = None
    meta: Mapping[str, Any] = attrs.field(factory=dict)
    """Saved with each of the turn's saves: the session's meta as the turn started."""
    deps: Any = None
    """The session's dependencies, for the turn's tool calls (``ToolContext.deps``)."""
    tools: tuple[Tool, ...] = ()
    """The turn's own tools (``RunTurn.tools``), offered after the agent's."""
    instructions: str | None = None
    """Added after the agent's instructions for this turn (``RunTurn.instructions``)."""

    output: StructuredTurn | None = None
    """The structured answer's state, for an agent with an ``output_type``."""
    deleted: bool = False
    """A save of the turn was refused because its session was deleted while it ran
    (:class:`~runtime.errors.SessionDeleted`): it ends ``aborted`` (``session deleted``),
    saves nothing more, and its runner forgets the session's history once it is over."""
    untouched: bool = False
    """A turn taken over whose committed steps had already finished it: it ran nothing,
    and its end neither changes nor saves the history."""
    held: dict[str, Awaiting] = attrs.field(factory=dict)
    """The step's calls that suspend the turn (docs/approval.md), by call id."""
    began_from: SessionRecord | None = None
    """The stored session a turn taken up again (a continuation, a takeover) began from,
    until its first save, which names it (:attr:`SaveRequest.held`): the persister then
    keeps the rows the store holds as they are instead of writing them again."""
    approved_before: tuple[ToolCallPart, ...] = ()
    """The calls a person approved in the turn this one superseded and that never ran:
    they run as this turn begins, before its model call, their results stored before its
    user message (:func:`runtime.approval.approved_waiting`)."""
    ended_before: tuple[ToolCallPart, ...] = ()
    """The calls of the turn this one superseded whose sub-agent waits for them
    (``Awaiting.nested``) and that got a denial's result: their sub-turns are ended as
    this turn begins (nobody resumes them after the calling turn went on)."""
    provider: int = 0
    """Which of the runner's providers the turn's calls go to: the primary, or the
    fallback the turn went on with (``Agent(provider=[primary, fallback, ...])``)."""
    steering: TurnSteering = attrs.field(factory=TurnSteering)
    """User messages that join the turn at its next step boundary (``steer``)."""
    confirm: Callable[[], Awaitable[bool]] | None = None
    """Awaited before the turn runs tools (:meth:`TurnCancel.confirmed`, the run's, when
    it has a :attr:`TurnCancel.confirm`); handed to its tools' sub-turns too."""
    marked: bool = False
    """A save of the turn stored it as running in this process (``Saving._save_meta``):
    its saves that end it clear the marker."""
    refused: bool = False
    """The store refused the turn's final save (an error, not a save that outlived
    ``SAVE_TIMEOUT``): nothing of it after its last confirmed save is stored."""
    elsewhere: bool = False
    """The refusal said its message was answered by another process
    (:class:`~runtime.errors.AnsweredElsewhere`, its claim's or its final save's): no
    later save may store it, so it leaves the history on every host, a library's too."""
    fence: object | None = None
    """The store's fence the turn began under (:attr:`RunTurn.fence`), on each of its
    saves (:attr:`SaveRequest.fence`)."""


CONTEXT_TOO_LONG_HINT = (
    "the session no longer fits the model's context window, and every later turn of it "
    "will be refused the same way: send less of it (Agent(history_processors=...), "
    "docs/providers.md#context-compaction) or go on in a new session"
)
"""Appended to a :class:`~runtime.errors.ContextTooLong` turn's message: the provider's
own words ("prompt is too long: 210000 tokens > 200000 maximum") say what, not that the
session is stuck nor what frees it."""


def error_info(exc: BaseException) -> ErrorInfo:
    """How an exception that ended a turn, or one of its calls, is reported (a turn the
    model refused as too long for its context window with :data:`CONTEXT_TOO_LONG_HINT`)."""
    if isinstance(exc, AxonError):
        message = exception_message(exc) or exc.kind
        if isinstance(exc, ContextTooLong):
            message = f"{message} ({CONTEXT_TOO_LONG_HINT})"
        return ErrorInfo(kind=exc.kind, message=message, retryable=exc.retryable)
    return ErrorInfo(
        kind=type(exc).__name__,
        message=exception_message(exc) or type(exc).__name__,
        retryable=False,
    )
