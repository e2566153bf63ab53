"""The messages actors exchange with each other (not part of the public stream).

Streams between actors travel as :class:`~runtime.inbox.Batch` es: a producer appends to
the batch it last sent for as long as the receiver has not picked it up yet, so items
that are already waiting move together in one hop, and nothing is ever held back waiting
for more. That keeps the per-delta cost of a stage to an append.

What the facade's names need lives where they do, and is named here too, for the actors
and the custom providers that import it from here: the batches in :mod:`runtime.inbox`,
a provider's :class:`InferRequest` and :class:`StreamFailed` in :mod:`runtime.provider`,
:class:`TurnResult` in :mod:`runtime.output`. So ``from runtime import Provider`` or
``TurnResult`` does not build the thirty-odd classes below, which only a running turn
sends (issue 24: they were a tenth of the contract's import time).
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs
import trio

from runtime.chunks import Usage, _eq, _hash, _repr
from runtime.errors import describe_exception
from runtime.inbox import MAX_BATCH, MAX_RUN, Batch, Batcher, Inbox
from runtime.messages import Message, Part, UserContent, UserMessage
from runtime.output import ErrorInfo, OutputChunk, TurnResult
from runtime.provider import InferRequest, StreamFailed
from runtime.redact import redact_urls
from runtime.store import SessionRecord

if TYPE_CHECKING:
    from runtime.budget import OutputAccount
    from runtime.hosting import ToolHost  # type-only: hosting.py names TurnResult in its turn

# -- provider requests ------------------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ThrottleNotice:
    """Turn runner -> stream controller: the step's model call waits for a rate limit
    (becomes a ``throttled`` output chunk)."""

    __repr__ = _repr

    step: int
    wait: float
    reason: str


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class BudgetWaitNotice:
    """Turn runner -> stream controller: the step's model call waits for output tokens
    the calls beside it hold (becomes a ``budget-wait`` output chunk)."""

    __repr__ = _repr

    step: int
    want: int
    available: int
    held: int
    ahead: int


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class StepReset:
    """Turn runner -> stream controller: the step's model call failed after it streamed
    output and the step starts over on ``provider`` (becomes a ``reset-step`` chunk)."""

    __repr__ = _repr

    step: int
    provider: str
    error: ErrorInfo
    """The failure that made the step start over."""


@attrs.frozen(kw_only=True, slots=True)
class SteeredNotice:
    """Turn runner -> stream controller: a user message joined the turn before step
    ``step`` (becomes a ``steered`` output chunk)."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash

    step: int
    message_id: str
    text: str
    answer_id: str = ""
    """The id of the assistant message the turn's steps go to from ``step`` on."""
    answered: bool = False
    """The message was stored and answered by an earlier turn (a client's retry of it):
    not stored again; ``answer_id`` is that earlier answer's id ("" if none follows it)."""


@attrs.frozen(kw_only=True, slots=True)
class RetryPrompt(UserMessage):
    """The user message of a request that tells the model why its answer was rejected
    (turn runner -> provider, in :attr:`InferRequest.messages`).

    Only ever in a request's messages, never in the history; a type of its own so that
    whatever counts the user's inputs in a request (the scripted provider) can skip it.
    """

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash


# -- engine and turn runner --------------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class BeginRequest:
    """Tells the engine a new model call starts: reset the tag partitioner."""

    __repr__ = _repr

    request_id: str
    cancel_scope: trio.CancelScope | None = None
    """The call's (:attr:`InferRequest.cancel_scope`): once its requester cancelled it,
    the engine forwards none of what the provider had queued of it. The runner no longer
    reads it, and what it left in the runner's stream inbox stayed there, unread, while
    the session idled."""


# -- tools -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ToolCallSpec:
    __repr__ = _repr
    tool_call_id: str
    tool_name: str
    input: Any
    approved: bool = False
    """A person approved this call already (a resumed turn): it runs without asking."""
    ruled: bool = False
    """The call's approval rule (``needs_approval=lambda args, ctx: ...``) was asked as the
    turn made the call and said no decision is needed (:func:`actors.turn.suspension.
    hold_kind`): it runs without the rule being asked again. A rule is asked once a call,
    its answer reused: asked twice, one whose answer changed (a clock, a count, a lookup
    that failed once) or that counts its calls acted on two answers."""
    decision: Any = None
    """A call that waited for its sub-agent's approval (``Awaiting.nested``), decided:
    the decision, for :attr:`ToolContext.decision`."""


@attrs.define(kw_only=True, slots=True, eq=False)
class ExecuteTools:
    """Run a step's tool calls concurrently; one :class:`ToolOutcome` each goes to
    ``reply`` in completion order."""

    __repr__ = _repr

    session_id: str
    turn_id: str
    step: int
    calls: tuple[ToolCallSpec, ...]
    tools: dict[str, Any]
    default_timeout: float | None
    max_result_chars: int | None
    reply: Inbox[ToolOutcome | ToolProgress]
    cancel_scope: trio.CancelScope
    host: ToolHost | None = None
    """The host, handed to tools that take a :class:`~runtime.tools.ToolContext`."""
    deps: Any = None
    """The session's dependencies, handed to tools as ``ToolContext.deps``."""
    depth: int = 0
    """How many agents-used-as-tools deep the session runs (``ToolContext.depth``)."""
    may_wait: bool = False
    """Whether the turn can suspend for a call whose sub-agent waits (a step's calls run
    by the turn runner): ``ToolContext.may_wait`` for each call not approved already."""
    confirm: Callable[[], Awaitable[bool]] | None = None
    """The turn's :meth:`TurnCancel.confirmed` when it has a confirm (a worker's turn):
    ``ToolContext.confirm``, through which an agent tool's sub-turn confirms too."""
    max_parallel: int | None = None
    """How many of ``calls`` run at once (``Budget.max_parallel_tool_calls``; ``None``:
    all)."""
    output_left: int | None = None
    """The output tokens the calling turn has left (``ToolContext.output_left``)."""
    output_account: OutputAccount | None = None
    """The account the batch's sub-agents draw those tokens from, together
    (``ToolContext.output_account``; ``None``: no output budget)."""

    def answer_crash(self, actor: str, exc: BaseException, *, only: set[str] | None = None) -> None:
        """Answer each call (of ``only``, when given: those still unanswered) with an
        error outcome saying that the executor ``actor`` crashed, with ``exc``: the turn
        goes on with the model seeing it, instead of waiting to its deadline. Called by
        the supervisor for a request a crash cut short (:class:`runtime.actor.Actor`,
        any executor, a plain actor too) and by :class:`~actors.tool_executor.
        ToolExecutor`; never waits, nor raises for a full or closed reply inbox. Nothing
        for a request its turn stopped waiting for (its outcomes could answer a later
        step's calls)."""
        if self.cancel_scope.cancel_called:
            return
        why = f"the tool executor {actor!r} crashed ({describe_exception(exc)}); "
        for call in self.calls:
            if only is not None and call.tool_call_id not in only:
                continue
            outcome = ToolOutcome(
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                error=why + "the call did not complete",
            )
            try:
                self.reply.put_nowait(outcome)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ToolOutcome:
    __repr__ = _repr
    tool_call_id: str
    tool_name: str
    output: Any = None
    error: str | None = attrs.field(default=None, converter=attrs.converters.optional(redact_urls))
    """Redacted here, so the model, the stream and the store get the same clean text."""
    duration: float = 0.0
    usage: Usage | None = None
    """Tokens the tool spent (an agent used as a tool); added to the calling turn's."""
    waits_for: str | None = None
    """An agent used as a tool whose sub-turn waits for this approval id
    (:attr:`ToolContext.waits_for`): no result; the calling turn suspends."""
    waits_until: float | None = None
    """When the wait :attr:`waits_for` names expires (``None``: never)."""
    waits_client: tuple[str, Any] | None = None
    """With :attr:`waits_for`: the sub-agent's client tool call it waits for (its tool
    name and input; :attr:`ToolContext.waits_client`); ``None``: an approval."""
    waits_asked: tuple[str, Any, Any, tuple[str, ...]] | None = None
    """With :attr:`waits_for`, an approval: the sub-agent's call that asks (its tool's
    name, input, stored schema and the agent tools between;
    :attr:`ToolContext.waits_asked`)."""
    ran: bool | None = None
    """Whether the tool's function was called for this outcome (``True``: its output or
    its own error; ``False``: refused before, as an unknown tool, invalid arguments, a
    denial, a tool gone); ``None``: not said. Stored with an edited call's result
    (:attr:`~runtime.messages.ToolMessage.ran`)."""


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ToolProgress:
    """An output chunk a running tool streams, nested under its call."""

    __repr__ = _repr

    tool_call_id: str
    tool_name: str
    chunk: Any


# -- persistence -------------------------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class SaveResult:
    """The persister's answer to one :class:`SaveRequest`, on the request's ``reply`` inbox.

    Exactly one of ``version`` (saved) and ``error`` (nothing written) is set."""

    __repr__ = _repr

    request_id: str
    session_id: str
    version: int | None = None
    """The session's version in the store after this save."""
    error: BaseException | None = None
    base: tuple[Message, ...] | None = None
    """Set when the save was rebased: what the store holds before the request's
    ``messages`` now (another writer saved in between)."""

    @property
    def in_place(self) -> bool:
        """Whether the messages were written where the request asked (saved, not rebased)."""
        return self.error is None and self.base is None


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class SaveRequest:
    """Replace the session's messages from ``start`` on with ``messages``.

    The save is based on ``expected_version`` (the store's version of the session when
    ``start`` and ``messages`` were computed) or, when that is ``None``, on the outcome of
    ``after``, the id of the same session's previous request (still in flight when this
    one was made; the persister answers requests in order, so it knows that outcome).
    When neither gives a version the layout is known to match, the persister *rebases*:
    it reloads the session and appends ``messages`` after what the store holds
    (:func:`runtime.store.rebase`), so a save never overwrites a message some other
    writer stored.

    The persister answers with one :class:`SaveResult` on ``reply``, without waiting: a
    requester that does not read its replies never stalls the persister (give ``reply``
    the ``drop-oldest`` policy; only the latest answer matters).
    """

    __repr__ = _repr

    request_id: str
    session_id: str
    turn_id: str
    start: int
    messages: tuple[Message, ...]
    meta: Mapping[str, Any] = attrs.field(factory=dict)
    step: int | None = None
    expected_version: int | None = None
    after: str | None = None
    """The ``request_id`` of the session's previous request, when this one is based on it."""
    reply: Inbox[SaveResult] | None = None
    ends: str | None = None
    """Set on the save of the step that ends the turn (no tool calls, no budget hit, no
    answer to validate): the turn's finish reason. A store that can (``ends_turns``, a
    worker's PostgreSQL store) marks the turn's queue row finished in the same commit,
    one transaction where there were two (issue 24 goal 3); any other ignores it."""
    absent_mark: int | None = None
    """The session's deletion mark (:func:`runtime.store.version_and_mark`) when its turn
    began on a session its host held nothing stored of; ``None``: not read (the store
    keeps none, or the session was stored). A save based on no version that meets a
    conflict reads the mark again: moved, the session was deleted and created again
    since the turn began, and the save is refused as a deleted session's
    (:class:`~runtime.errors.SessionDeleted`) instead of rebased onto the new one."""
    held: tuple[Message, ...] = ()
    """The session's messages as the store holds them at ``expected_version`` (the record
    a continuation's turn began from, for its first save): those of ``messages`` that
    are these very objects at the same places are not written again
    (:meth:`~actors.persister.Persister._unchanged`). A continuation's first save sends
    its turn from the user message on, which the store holds as it is, with the waiting
    assistant message the decision stored: without this it rewrote both (issue 21)."""
    fence: object | None = None
    """The store's fence the turn began under (:attr:`RunTurn.fence`), given to a store
    that takes it (:func:`runtime.store.takes_fence`) with the save: a save that reaches
    the store after the turn's claim is over is judged by that claim, whatever the store
    still remembers of it."""
    may_end: bool = False
    """Set on a step's save after which the turn may not go on (it hit its budget, waits
    for a decision, or its step may be its last): the save writes the turn's answer whole,
    not as grown rows (:meth:`~actors.persister.Persister._grown`), since no later save
    of the turn may come (the final save is skipped when this one holds the turn: a turn
    suspended for a decision left its waiting answer a head)."""
    cut: frozenset[str] = frozenset()
    """The ids of the messages a regenerate cut from the history (its turn replaces them):
    a save rebased on another writer's drops them from what the store holds too, or is
    refused when that writer's turn came after them (:func:`runtime.store.rebase`)."""


# -- stream controller markers -------------------------------------------------------------


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class TurnBegin:
    __repr__ = _repr
    turn_id: str
    message_id: str
    consumer: Inbox[ConsumerItem] | None
    """Where the turn's output goes: batches of output chunks, then :class:`TurnDone`."""


TEXT = "text"
"""The kind of a text part (:attr:`PartBegin.kind`)."""
REASONING = "reasoning"
"""The kind of a reasoning part (:attr:`PartBegin.kind`)."""


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class PartBegin:
    """A text or reasoning part opens (turn runner -> stream controller); where, the
    turn's parts manager decides (:mod:`actors.turn.parts`)."""

    __repr__ = _repr

    kind: str
    """``"text"`` or ``"reasoning"``."""
    part_id: str


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class PartEnd:
    """The open part closes; the chunks between it and its :class:`PartBegin` are its
    deltas, and the stored message holds the same part."""

    __repr__ = _repr

    kind: str
    part_id: str


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ObjectUpdate:
    """The answer's JSON, parsed so far, changed (turn runner -> stream controller); the
    controller renders it as an ``object-delta`` chunk of the text part ``part_id``."""

    __repr__ = _repr

    part_id: str
    value: Any


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class StepBegin:
    __repr__ = _repr
    step: int


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class StepEnd:
    __repr__ = _repr
    step: int
    finish_reason: str
    usage: Usage


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ToolDone:
    __repr__ = _repr
    step: int
    outcome: ToolOutcome


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ToolStreamed:
    __repr__ = _repr
    step: int
    progress: ToolProgress


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ApprovalAsked:
    """A call of the step waits for a person's decision (its turn suspends)."""

    __repr__ = _repr

    step: int
    tool_call_id: str
    tool_name: str
    approval_id: str
    asked_tool: str | None = None
    """A sub-agent's approval passed up: the call that asks (``Awaiting.asked_tool``)."""
    asked_input: Any = None
    asked_via: tuple[str, ...] = ()


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class ToolDenied:
    """A waiting call was denied: its result is the denial (``outcome.error``)."""

    __repr__ = _repr

    step: int
    outcome: ToolOutcome
    reason: str | None


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class TurnEnd:
    """The turn is over; ``error`` / ``abort_reason`` say how it was cut short, if so."""

    __repr__ = _repr

    finish_reason: str
    usage: Usage
    error: ErrorInfo | None = None
    abort_reason: str | None = None
    budget: str | None = None


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class TurnDone:
    """The turn is over and saved: the last item on its consumer's inbox.

    The turn runner sends it to the stream controller after the turn's last chunk (and
    after the ``turn.finished`` hooks ran); the controller hands it on to the consumer
    after every chunk and closes the consumer's inbox. Should the controller be gone, the
    runner puts it on the consumer's inbox itself, so a consumer always learns the end."""

    __repr__ = _repr

    result: TurnResult


@attrs.define(slots=True, eq=False)
class TurnCancel:
    """How a consumer stops its turn, as data in :class:`RunTurn`.

    The turn runner enters ``scope`` around the turn's steps (and sets its deadline); the
    consumer calls :meth:`cancel`, which keeps the first reason and cancels the scope (a
    scope cancelled before it is entered cancels on entry, like any Trio scope). The
    runner reads ``reason`` when the scope was cancelled: a reason means the consumer
    asked, none means the deadline passed. Nothing is called back on the consumer."""

    __repr__ = _repr

    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    reason: str | None = None
    confirm: Callable[[], Awaitable[None]] | None = None
    """Awaited by the runner before the turn runs tools (their side effects): a worker's
    turn confirms there that its claim still holds when the lease may have lapsed (the
    process was paused past it), and cancels the turn through :meth:`cancel` when
    another worker took it over. ``None``: nothing to confirm (a turn of this process
    alone)."""

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
            self.scope.cancel()

    async def confirmed(self) -> bool:
        """Await :attr:`confirm`; whether the turn may still run tools (not cancelled:
        by it, its claim lost, or before). What a sub-turn's confirm asks of its calling
        turn's (``ToolContext.confirm``): awaited in the sub-turn's task, outside this
        turn's scope, the cancel does not raise there."""
        if self.confirm is not None:
            await self.confirm()
        return not self.scope.cancel_called


@attrs.define(kw_only=True, slots=True, eq=False)
class SteeredInput:
    """A user message handed to a running turn (the ``steer`` busy strategy,
    :mod:`runtime.busy`). ``taken`` is set once its fate is known: ``accepted`` when
    the turn inserted it at a step boundary (its user message has ``user_message_id``),
    not when the turn ended first (then the message starts a turn of its own) or a stop
    withdrew it (:meth:`runtime.app.session.TurnStream.withdraw`: it never joins)."""

    __repr__ = _repr

    content: UserContent
    user_message_id: str
    taken: trio.Event = attrs.field(factory=trio.Event)
    accepted: bool = False
    step: int | None = None
    """The step the model first saw it before, once accepted."""
    answered: bool = False
    """Accepted as held: an earlier turn stored it and answered it (a client's retry of
    it), so this turn stored nothing of it (``Steered.answered``)."""
    stored: trio.Event = attrs.field(factory=trio.Event)
    """Set once a save of the turn holds the accepted message (or the turn is over):
    the steering caller's acknowledgement waits for it, so a process killed before that
    save loses no message it acknowledged."""
    dropped: bool = False
    """Set with :attr:`stored` when the turn is over and the message is not stored: the
    store refused the turn's saves and its host forgets such a turn (``serve``), which
    takes the message with it. The message then starts a turn of its own, as one the
    turn never took does: acknowledged as taken, it was lost without a word."""


@attrs.define(slots=True, eq=False)
class TurnSteering:
    """How user messages reach a running turn, as data in :class:`RunTurn` (like
    :class:`TurnCancel`, shared by the turn's stream and its runner).

    The session :meth:`offer` s a message; the runner :meth:`take` s what waits at each
    step boundary, and :meth:`close` s the box when the turn's steps are over, which
    hands back what it never took. All synchronous: no message is lost between a take
    and a close, and none is offered to a closed box."""

    __repr__ = _repr

    waiting: list[SteeredInput] = attrs.field(factory=list)
    closed: bool = False
    took: list[str] = attrs.field(factory=list)
    """The user message ids of the messages the turn took (:meth:`take`): they are the
    turn's input now, so a stop naming one stops the turn (``TurnStream.named_by``)."""
    pull: Callable[[], Awaitable[Sequence[SteeredInput]]] | None = None
    """Where messages for the turn wait besides :meth:`offer`: asked by the runner at
    each step boundary, once the previous step's save is answered, before it takes what
    waits (a worker's turn queue, where a front end on another process records a message
    that steers this turn: that save tells the worker whether one did). ``None``: only
    what is offered in this process."""

    def offer(self, item: SteeredInput) -> bool:
        """Queue ``item`` for the turn's next step boundary; ``False`` if it is over."""
        if self.closed:
            return False
        self.waiting.append(item)
        return True

    def withdraw(self, item: SteeredInput) -> None:
        """Take back ``item`` if the turn has not taken it (its sender left)."""
        if item in self.waiting:
            self.waiting.remove(item)

    async def pull_waiting(self) -> None:
        """Offer what :attr:`pull` finds (nothing without one): at a step boundary."""
        if self.pull is not None and not self.closed:
            for item in await self.pull():
                self.offer(item)

    def take(self, step: int) -> list[SteeredInput]:
        """The messages that wait, marked accepted before ``step``'s model call."""
        items, self.waiting = self.waiting, []
        for item in items:
            item.accepted, item.step = True, step
            self.took.append(item.user_message_id)
            item.taken.set()
        return items

    def close(self) -> None:
        """No step follows: every message still waiting is handed back, not accepted."""
        self.closed = True
        items, self.waiting = self.waiting, []
        for item in items:
            item.taken.set()


@attrs.frozen(kw_only=True, slots=True, eq=False)  # internal: identity is enough
class RunTurn:
    """Run one turn: what a :class:`~runtime.app.session.TurnStream` sends its session's
    turn runner. Data only: the output goes to ``consumer`` (chunk batches, then one
    :class:`TurnDone`), cancellation comes through ``cancel``."""

    __repr__ = _repr

    turn_id: str
    input: UserContent
    """The user message's content: text, or parts (text, images, files)."""
    consumer: Inbox[ConsumerItem]
    cancel: TurnCancel
    meta: Mapping[str, Any] = attrs.field(factory=dict)
    """The session's meta as of the turn's start; saved with the turn's messages."""
    regenerate: bool = False
    """Replace the last turn: cut the history back to before its last user message."""
    message_id: str | None = None
    """The id of the turn's assistant message (``None``: a new one). A durable turn
    passes a stable one, so that the worker taking it over finds its message."""
    user_message_id: str | None = None
    """The id the turn's user message gets (``None``: a new one). The web app passes the
    client's id of the message, so that a resend of it is recognised (a retry, an edit)."""
    resume: bool = False
    """The turn may have committed steps already (another worker ran it and died): when
    the history holds the assistant message ``message_id``, the turn continues it, from
    the step after its last committed one, instead of starting again (it wins over
    ``regenerate`` then). Without such a message it is an ordinary new turn."""
    deps: Any = None
    """The session's dependencies (``Session.deps``): what the turn's tools get as
    ``ToolContext.deps``. Held, never copied or saved."""
    steering: TurnSteering = attrs.field(factory=TurnSteering)
    """User messages that join the turn while it runs (the ``steer`` busy strategy)."""
    tools: tuple[Any, ...] = ()
    """Tools offered for this turn only, after the agent's own (and its MCP servers'):
    the client-side tools a protocol's caller declares with its request (AG-UI's
    ``tools``, :mod:`runtime.app.web.agui`). A name the agent already offers fails the
    turn (``ToolDefinitionError``). Not saved: a continuation is given them again."""
    max_output_tokens: int | None = None
    """The output tokens this run of the turn may write at most, under the agent's own
    ``Budget.max_output_tokens`` (``None``: that alone): an agent tool's sub-turn is
    given what its calling turn has left (``ToolContext.output_left``)."""
    output_account: OutputAccount | None = None
    """The live account the run's model calls reserve their caps from and settle into,
    shared with the other calls of its calling turn's batch (``ToolContext.
    output_account``): an agent tool's sub-turn; ``None``: none."""
    instructions: str | None = None
    """Added after the agent's instructions for this turn's model calls only (AG-UI's
    ``context``); never saved."""
    stored: SessionRecord | None = None
    """The session as its caller just read it from the store, or wrote it (a
    continuation: the waiting turn, its decisions recorded): with ``resume``, the turn
    starts from it instead of reading the session again. Without ``resume``, a record
    at the version the runner holds says nobody wrote since: no version query (a
    worker's turn of a session it loaded after claiming the turn)."""
    fence: object | None = None
    """The store's fence of the session as the turn begins (:func:`runtime.store.fence_of`;
    ``None``: none), put on each of its saves (:attr:`SaveRequest.fence`)."""


ConsumerItem: TypeAlias = "Batch[OutputChunk] | TurnDone"
"""What a consumer's inbox carries."""


# -- a session's history -------------------------------------------------------------


class Watermark:
    """What a reader of a :class:`History` (the kept repair) is told of its edits: the
    lowest position an edit may have changed since the reader last set :attr:`low`
    (:meth:`History.watch`). Messages compare by value, and a message replaced by one
    equal to it but holding values of other types (``1``, ``True``, ``1.0``) is another
    message to the model: a reader that keeps a part of the history learns here,
    without a pass over that part, whether it still holds the same objects."""

    __slots__ = ("low",)

    def __init__(self, low: int) -> None:
        self.low = low

    def settle(self) -> None:
        """The reader has caught up: no edit changed a position since (:data:`UNMOVED`)."""
        self.low = UNMOVED


UNMOVED = sys.maxsize
"""A :class:`Watermark`'s :attr:`~Watermark.low` when no edit changed a position."""


class History(list[Message]):
    """A session's history as its turn runner keeps it, counting its edits: every call
    that changes it adds one to :attr:`edits`, so the runner tells an unchanged history
    from a changed one without copying it to compare (a pass over the whole session;
    issue 24 goal 1). Equal to, and used as, a plain list otherwise.

    An edit that changes a position (rather than adding at the end) also lowers the
    :class:`Watermark` of each reader (:meth:`watch`) to the lowest position it changed.

    Only its own methods count: list's called on it (``list.append(h, m)``, ``heapq``'s
    C functions) do not. The runner checks the length and the last message besides
    (O(1)), so what such a call can hide is a same-length edit before the end; the kept
    repair compares the kept part by value besides, so what it can hide from that is a
    message replaced by an equal one of other types."""

    __slots__ = ("_marks", "edits")
    edits: int
    """Calls of its own methods that changed it (one more each ``__init__``)."""
    _marks: list[Watermark]
    """The readers' watermarks (:meth:`watch`)."""

    def __new__(cls, *args: Any) -> History:
        # Both slots set here, so __init__ reads them plainly: a ``getattr`` of an unset
        # slot with a default builds and drops an AttributeError (its message formatted,
        # ~2,500 instructions), twice for every history made (issue 24 goal 1).
        self = list.__new__(cls)
        self.edits = -1
        self._marks = []
        return self

    def __init__(self, *args: Any) -> None:
        # (h.__init__(other) again replaces the messages: an edit, never a count reset.
        # Counted before list's __init__, as every edit is: that one empties the list
        # first, so an iterable that fails part way has edited it all the same.)
        self.edits += 1
        if self._marks:  # (a fresh history has no readers yet)
            self._moved(0)
        super().__init__(*args)

    def watch(self) -> Watermark:
        """A new :class:`Watermark` of this history's edits from now on."""
        mark = Watermark(UNMOVED)
        self._marks.append(mark)
        return mark

    def _moved(self, position: int) -> None:
        """An edit may change what ``position`` and those after it hold."""
        for mark in self._marks:
            if position < mark.low:
                mark.low = position

    def _position(self, index: Any) -> int:
        """The lowest position ``self[index] = ...`` or ``del self[index]`` changes (0
        when ``index`` is not one list takes: the edit then raises anyway)."""
        n = len(self)
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step > 0:  # (a plain slice's assignment may insert at its start)
                return start
            span = range(start, stop, step)
            return span[-1] if span else n
        try:
            i = operator.index(index)
        except TypeError:
            return 0
        return max(0, i + n if i < 0 else i)

    def append(self, item: Message) -> None:
        self.edits += 1
        super().append(item)

    def extend(self, items: Any) -> None:
        self.edits += 1
        super().extend(items)

    def insert(self, index: Any, item: Message) -> None:
        self.edits += 1
        self._moved(min(self._position(index), len(self)))
        super().insert(index, item)

    def remove(self, item: Message) -> None:
        self.edits += 1
        self._moved(0)  # (a pass over the list already: the reader's check is one more)
        super().remove(item)

    def pop(self, index: Any = -1) -> Message:
        self.edits += 1
        self._moved(self._position(index))
        return super().pop(index)

    def clear(self) -> None:
        self.edits += 1
        self._moved(0)
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self.edits += 1
        self._moved(0)
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self.edits += 1
        self._moved(0)
        super().reverse()

    def __setitem__(self, index: Any, value: Any) -> None:
        self.edits += 1
        self._moved(self._position(index))
        super().__setitem__(index, value)

    def __delitem__(self, index: Any) -> None:
        self.edits += 1
        self._moved(self._position(index))
        super().__delitem__(index)

    def __iadd__(self, items: Any) -> History:  # type: ignore[override,misc]
        self.edits += 1
        super().__iadd__(items)
        return self

    def __imul__(self, n: Any) -> History:  # type: ignore[misc]
        self.edits += 1
        try:
            emptied = operator.index(n) < 1
        except TypeError:
            emptied = True
        if emptied:  # (else copies of the same messages added at the end)
            self._moved(0)
        super().__imul__(n)
        return self


@attrs.define(kw_only=True, slots=True, eq=False)
class SessionState:
    """A session's history as its turn runner keeps it: private to that runner, which
    publishes every change as a :class:`SessionSnapshot`."""

    __repr__ = _repr

    session_id: str
    messages: list[Message] = attrs.field(factory=list)
    saved_upto: int = 0
    """How many messages the store is known to hold; saves start no later than this."""
    version: int = 0
    """The store's version of the session that ``messages[:saved_upto]`` matches (``0``:
    not stored); saves are based on it, so one that another writer overtook conflicts."""
    cut: frozenset[str] = frozenset()
    """The ids of stored messages a regenerate cut from ``messages`` that no save has
    removed from the store yet (:attr:`SaveRequest.cut`): a save, or a reload, meeting
    another writer's replaces them there too, or refuses the regenerated turn."""

    def snapshot(self) -> SessionSnapshot:
        return SessionSnapshot(
            session_id=self.session_id,
            messages=tuple(self.messages),
            saved_upto=self.saved_upto,
            version=self.version,
        )


@attrs.frozen(kw_only=True, slots=True, eq=False)
class SessionSnapshot:
    """A session's history at one moment (``session.state``): an immutable value the turn
    runner replaces after every change, so readers never see it half-changed."""

    __repr__ = _repr

    session_id: str
    messages: tuple[Message, ...] = ()
    saved_upto: int = 0
    """How many of ``messages`` the store is known to hold."""
    version: int = 0
    """The store's version of the session that ``messages[:saved_upto]`` matches."""

    @property
    def all_saved(self) -> bool:
        """Whether the store holds every message (evicting the session loses nothing)."""
        return self.saved_upto >= len(self.messages)


__all__ = [
    "MAX_BATCH",
    "MAX_RUN",
    "REASONING",
    "TEXT",
    "ApprovalAsked",
    "Batch",
    "Batcher",
    "BeginRequest",
    "BudgetWaitNotice",
    "ConsumerItem",
    "ExecuteTools",
    "InferRequest",
    "ObjectUpdate",
    "Part",
    "PartBegin",
    "PartEnd",
    "RetryPrompt",
    "RunTurn",
    "SaveRequest",
    "SaveResult",
    "SessionSnapshot",
    "SessionState",
    "SteeredNotice",
    "StepBegin",
    "StepEnd",
    "StreamFailed",
    "ThrottleNotice",
    "ToolCallSpec",
    "ToolDenied",
    "ToolDone",
    "ToolOutcome",
    "TurnBegin",
    "TurnCancel",
    "TurnDone",
    "TurnEnd",
    "TurnResult",
]
