"""Sessions and the consumer's view of a turn (:class:`TurnStream`).

A session runs one turn at a time. ``session.stream(input)`` starts a turn and yields a
:class:`TurnStream`: iterate it for :data:`~runtime.output.OutputChunk` s, as they
arrive. Leaving the ``async with`` before the turn finished cancels the turn (the
stream ends with ``abort``, and what was streamed is saved, marked interrupted);
``output.cancel(reason)`` does the same from anywhere. After the block,
``output.result`` holds the :class:`~runtime.output.TurnResult`.

A host may free an idle session from memory (``Host.open(idle_ttl=, max_sessions=)``).
The :class:`Session` object stays valid: the next turn, or ``await session.reopen()``,
loads its history from the store again. Until then its synchronous views of the history
(``messages``, ``state``) raise :class:`~runtime.errors.SessionNotLoaded`.

Who owns what: the session's turn runner owns its history (:class:`SessionState`, private
to it) and publishes an immutable :class:`SessionSnapshot` after every change, which is
what ``session.messages`` and ``session.state`` read. The :class:`Session` owns its meta
and whether a turn is running (``busy``). A turn is a :class:`~runtime.actor_messages.RunTurn`
message (data only); its chunks and then its result arrive on the stream's own inbox.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from types import AsyncGeneratorType, MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, cast

import trio

from runtime import lifecycle  # turn.queued, at the first queued turn (runtime/lifecycle.py)
from runtime.actor_messages import (
    Batch,
    ConsumerItem,
    RunTurn,
    SessionSnapshot,
    SteeredInput,
    TurnCancel,
    TurnResult,
    TurnSteering,
)
from runtime.app.unsaved import unsaved, unsaved_error
from runtime.approval import (
    RECORD_ATTEMPTS,
    WAITING_META,
    Decision,
    PendingCall,
    Recorded,
    approval_decided,
    checked_output,
    large_output,
    pending_calls,
    record_decision,
    supersede,
    waiting_calls,
)
from runtime.busy import INTERRUPT, INTERRUPTED_BY_NEW, REJECT, STEER, OnBusy, check_on_busy
from runtime.errors import (
    SESSION_DELETED,
    ActorFailed,
    CallerWaits,
    ClosedWhileWaiting,
    ConfigurationError,
    HostClosed,
    InputHeld,
    InvalidMeta,
    InvalidTurnId,
    NothingToResume,
    RegenerateOutdated,
    SessionBusy,
    SessionError,
    SessionNotLoaded,
    StoreConflict,
    StoreError,
    TurnWithdrawn,
    WaitExpired,
)
from runtime.history import off_loop_limiter
from runtime.ids import new_id
from runtime.inbox import Inbox
from runtime.json_exact import dumps
from runtime.media import InputLimits, UserInput, check_counts, check_limits, user_content
from runtime.messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCallPart,
    UserContent,
    UserMessage,
)
from runtime.output import ErrorInfo, OutputChunk, Start, Steered
from runtime.store import SessionRecord, fence_of
from runtime.tools import CALLING_SESSION

if TYPE_CHECKING:
    from runtime.actor import Actor
    from runtime.agent import Agent
    from runtime.budget import OutputAccount
    from runtime.bus import Bus
    from runtime.store import Store
    from runtime.tools import Tool


class SessionOwner(Protocol):
    """What a :class:`Session` asks of the host that owns it, and nothing more.

    :class:`~runtime.app.host.Host` implements it. A session names this protocol instead
    of importing the host, so the two modules form no import circle and a test can own
    a session with a stand-in.
    """

    store: Store
    """Where the session's history is saved and loaded."""
    bus: Bus
    """Where the session's lifecycle events (decisions, ...) are published."""
    input_limits: InputLimits
    """The limits a user message's parts and media are checked against."""
    sessions: dict[str, Session]
    """The sessions in memory, by id (an evicted session is not among them)."""
    turns_by_id: dict[str, TurnStream]
    """The turns running now (each a session's ``current``), by turn id."""
    shutting_down: bool
    """Set once the host is closing: a turn waiting for its session refuses to start."""
    clock: Callable[[], float]
    """The clock waits expire by (``Agent(approval_timeout=...)``): a decision for a call
    past its deadline by it is refused (:class:`~runtime.errors.WaitExpired`)."""
    forgets_unsaved: bool
    """Whether a turn whose final save was refused is dropped from memory (``serve``):
    its session's title from an unstored first message goes with it."""

    def wait_over(self, session: Session) -> None:
        """Every call of the session's wait is decided: the host's timer forgets it."""

    def expire_now(self, session: Session) -> None:
        """Deny what of the session's wait expired, ``timed out``, and resume its turn, in
        the background: a decision found the wait past its deadline before the host's
        timer woke."""

    def touch(self, session: Session) -> None:
        """Mark the session used now (its idle age starts again)."""

    async def reopen_session(self, session: Session) -> None:
        """Load an evicted or closed session again."""

    async def close_session(self, session: Session) -> None:
        """Stop the session's actors and drop it from memory."""

    def wake(self, session: Session) -> None:
        """Start the session's resting actors (without yielding), before a turn."""

    def rest(self, session: Session) -> None:
        """Let the session's actors rest: no turn runs or waits."""

    def check_open(self) -> None:
        """Raise :class:`~runtime.errors.HostClosed` once the host has closed."""

    def refuse_saves(self, session_id: str, turn_id: str) -> None:
        """Refuse every save of turn ``turn_id`` from now on, writing nothing (its work
        is another process's now: :data:`runtime.agent.SUB_CALLER_LOST`)."""

    def accept_saves(self, session_id: str, turn_id: str) -> None:
        """Undo :meth:`refuse_saves` (that run of the turn is over)."""

    def stopped_before(self, session_id: str, message_id: str | None, turn_id: str) -> str | None:
        """The reason of a stop that reached the host before the new message it names
        (user message ``message_id``, turn ``turn_id``), used up; asked as that message
        would wait or its turn starts (``TurnStream._check_not_stopped_before``)."""

    def refuses_turn(self, turn_id: str) -> bool:
        """Whether turn ``turn_id``'s saves are refused: its session was deleted while it
        ran (a new turn must not take that id)."""


FINAL_WAIT = 10.0
"""Seconds a leaving consumer waits (shielded) for the cancelled turn to be saved."""
_NO_META: Mapping[str, Any] = MappingProxyType({})
"""The meta of every session with none: one shared read-only view, not one per session
(each is an object the garbage collector walks: ten thousand sessions, issue 24 item 5)."""


def _untitle_unstored(session: Session, result: TurnResult) -> None:
    """A turn of a host that forgets unsaved turns (``serve``: its client told
    ``not_saved``) ended with its save refused, and the store holds nothing of the
    session: the title the host holds is that turn's first message's, which is not
    stored. Kept, it was reapplied on reopen (:attr:`Session.unsaved_meta`) and saved
    with the next turn, naming the conversation after a message it does not hold. The
    next message of an idle session titles it again. A turn already queued behind the
    refused one (its request saw a title, so set none) is titled here by its own
    message, the first the store will hold: it was saved untitled, and only the turn
    after it titled the session."""
    if (
        result.saved
        or result.error is None  # a save not confirmed in time: still in flight
        or result.abort_reason == SESSION_DELETED
        or "title" not in session.meta
        or not session.host.forgets_unsaved
    ):
        return
    runner = session.runner
    if runner is not None and runner.snapshot.saved_upto == 0:
        meta = {key: value for key, value in session.meta.items() if key != "title"}
        head = session.queue_head
        if head is not None:
            meta["title"] = title_of(head.input)
        session._meta = _frozen_meta(meta)


TITLE_CHARS = 80
"""How long a title ``serve`` and ``mcp-server`` give a session may be."""


def _stored_checked_output(
    messages: Sequence[Message],
    key: str,
    output: Any,
    tools: Mapping[str, Any],
    max_chars: int | None,
) -> tuple[bool, Any]:
    """:func:`~runtime.approval.checked_output` with the output as it is stored (cut),
    for :meth:`Session.decide`'s worker thread (which passes no keyword)."""
    return checked_output(messages, key, output, tools, max_chars, cut=True)


def title_of(content: UserContent) -> str:
    """A session title from its first input: the text, else the attachments' names."""
    if isinstance(content, str):
        text = content
    else:
        text = "".join(p.text for p in content if isinstance(p, TextPart)) or " ".join(
            getattr(p, "filename", None) or p.type for p in content if not isinstance(p, TextPart)
        )
    # The start is enough: splitting a pasted document of megabytes would hold the loop.
    return " ".join(text[: TITLE_CHARS * 64].split())[:TITLE_CHARS]


def checked_meta(meta: Any) -> Mapping[str, Any]:
    """``meta`` if the store can save it (a dict of str keys and JSON values), else
    :class:`~runtime.errors.InvalidMeta`: refused when given, not at the turn's save
    (which then failed, the turn left unsaved)."""
    if not isinstance(meta, Mapping):
        raise InvalidMeta(f"session meta must be a dict, not {type(meta).__name__}")
    try:
        dumps(dict(meta))  # (an integer past 64 bits is JSON: the store writes it exactly)
    except TypeError as err:  # (orjson's errors; a key that is not a str as well)
        raise InvalidMeta(f"session meta is not JSON (str keys, JSON values): {err}") from None
    return meta


def _frozen_meta(meta: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A read-only copy of ``meta`` (the shared :data:`_NO_META` when empty)."""
    return MappingProxyType(dict(meta)) if meta else _NO_META


_TURN_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def _as_record(session_id: str, decided: Recorded) -> SessionRecord:
    """The session as a decision stored it."""
    assert decided.messages is not None
    return SessionRecord(session_id=session_id, messages=decided.messages, version=decided.version)


def _check_bound(value: int | None) -> int | None:
    """A turn's ``max_output_tokens``: ``None`` or an int of 0 or more, else
    :class:`~runtime.errors.ConfigurationError` (a string reached every call's cap)."""
    if value is not None and (type(value) is not int or value < 0):
        raise ConfigurationError(
            f"max_output_tokens must be None or an int of 0 or more, not {value!r}"
        )
    return value


_STEERED_MARK = "-s"
"""What a turn's assistant message id after a steered message puts after its first one's
(``<first>-s<step>``: :func:`actors.turn.takeover.steered_message_id`, spelled here as
:data:`runtime.app.web.queued_turn.STEERED_MARK` does, so a session needs no runner)."""


def _answer_of(message_id: str, first: str) -> bool:
    """Whether ``message_id`` is an id the turn whose first assistant message is
    ``first`` gives an answer after a steered message (any step: which one the message
    joins at is not known when it arrives)."""
    steered = first + _STEERED_MARK
    return message_id.startswith(steered) and message_id[len(steered) :].isdigit()


def _check_id(value: str | None, what: str) -> str | None:
    """``value`` unchanged if ``None`` or a valid id (the session ids' alphabet: ids end
    up in log lines, SQL parameters and URLs), else :class:`InvalidTurnId`."""
    if value is None:
        return None
    if not isinstance(value, str) or _TURN_ID.fullmatch(value) is None:
        raise InvalidTurnId(
            f"invalid {what} {value!r}: it must be 1-128 characters of letters, digits, "
            "'-', '_', '.', ':'"
        )
    return value


class SessionRunner(Protocol):
    """What a :class:`Session` needs of its turn runner
    (:class:`actors.turn.runner.TurnRunner`): where to send a turn, and its latest
    snapshot of the history."""

    @property
    def snapshot(self) -> SessionSnapshot: ...

    async def send(self, message: RunTurn) -> None: ...

    def holds_message(self, message_id: str) -> bool: ...

    async def read_ids(self) -> None: ...


class TurnStream:
    """One turn as its consumer sees it: an async iterator of output chunks.

    The stream owns an inbox: the turn's chunks arrive on it in batches, and last the
    turn's :class:`~runtime.actor_messages.TurnDone`, which sets :attr:`result` and ends the
    iteration. Leaving the ``async with`` early cancels the turn and reads on (discarding
    the rest) until that result, so the turn is saved when the block is left.
    """

    _joining: tuple[TurnSteering, SteeredInput] | None = None
    """While its input waits to join the running turn (``steer``): that turn's steering
    and the input offered to it (a class default: set on the instance only then)."""
    _receiving = False
    """While a task waits for the stream's next item (:meth:`_receive`): a second task
    reading it meanwhile is refused (a class default, as :attr:`_joining`)."""
    _readers: list[AsyncGeneratorType[OutputChunk, None]] | None = None
    """The generators :meth:`__aiter__` gave (one per ``async for``), closed when the
    ``async with`` is left (a class default, as :attr:`_joining`)."""
    _followers: dict[str, TurnStream] | None = None
    """On a running turn's stream: the steering streams that :attr:`follow` it, by their
    user message's id (a class default: set on the instance once one asks)."""
    steer_answered = False
    """On a steered stream (:attr:`steered`): the turn found its message stored and
    answered by an earlier turn (``Steered.answered``), and stored nothing of it."""
    _followed: deque[OutputChunk] | None = None
    """On a following stream (:attr:`follow`): the running turn's chunks from the one
    that shows its message on, not read yet (``None`` until that chunk passed)."""
    _follow_wake: trio.Event | None = None
    answer_ids: tuple[str, ...] = ()
    """The ids of the assistant messages its consumer was shown the turn's answer in: the
    ``start`` chunk's, then each a following stream took over with (:meth:`hands_over`)."""

    continues: str | None = None
    """A continuation's (:class:`ResumeStream`): the id of the user message whose turn it
    continues, which a stop names as it named that turn (:meth:`named_by`; a class
    default: set on a continuation's instance only)."""

    def __init__(
        self,
        session: Session,
        text: UserContent,
        *,
        regenerate: bool = False,
        turn_id: str | None = None,
        message_id: str | None = None,
        user_message_id: str | None = None,
        regenerates: str | None = None,
        resume: bool = False,
        capacity: int = 128,  # batches of up to MAX_BATCH chunks (runtime.inbox)
        on_busy: OnBusy | None = None,
        tools: tuple[Tool, ...] = (),
        instructions: str | None = None,
        follow: bool = False,
        max_output_tokens: int | None = None,
        output_account: OutputAccount | None = None,
    ) -> None:
        self.session = session
        self.follow = follow
        """Once its input joined the running turn (``steer``), whether this stream yields
        that turn's chunks from the one that shows the input on (:meth:`hands_over`):
        first a ``start`` naming the assistant message the answer goes to (stored after
        the input), then the rest of the turn. Without it a steered stream yields none."""
        self.on_busy = None if on_busy is None else check_on_busy(on_busy)
        """This turn's busy strategy, if not the session's (:meth:`Session.stream`)."""
        self.on_busy_now: OnBusy | None = None
        """The strategy that applied, when the session was busy as the turn began."""
        self.input = text
        self.regenerate = regenerate
        self.message_id = _check_id(message_id, "message id")
        """The id the turn's assistant message gets (``None``: a new one)."""
        self.user_message_id = _check_id(user_message_id, "user message id")
        """The id the turn's user message gets (``None``: a new one)."""
        self.regenerates = regenerates
        """With ``regenerate``: the id of the answer it replaces, as the caller named it
        (the AI SDK's ``messageId``), if it did: a stop naming that id finds this turn
        (:meth:`named_by`)."""
        self.resume = resume
        """Whether the turn continues the committed steps of message :attr:`message_id`."""
        self.tools = tools
        """Tools offered for this turn only (``RunTurn.tools``)."""
        self.instructions = instructions
        """Instructions added for this turn only (``RunTurn.instructions``)."""
        self.max_output_tokens = _check_bound(max_output_tokens)
        """The output tokens this run may write at most (``RunTurn.max_output_tokens``)."""
        self.output_account = output_account
        """The account its model calls share with its caller's other calls
        (``RunTurn.output_account``)."""
        self.stored: SessionRecord | None = None
        """The session as just read from the store (``RunTurn.stored``): for a
        continuation, or a turn whose session was loaded for it."""
        if resume and message_id is None:
            raise InvalidTurnId("a turn to resume needs the message_id of its assistant message")
        self.result: TurnResult | None = None
        """Set when the turn is over: when the iteration ends, after the ``async with``
        block at the latest."""
        self.turn_id = _check_id(turn_id, "turn id") or new_id("turn")
        self._named = turn_id is not None and not resume
        self._done: trio.Event | None = None
        self._over = False  # (what :attr:`done` says, whether or not it was made)
        self._cancel = TurnCancel()
        self._steering = TurnSteering()
        self.arrival = 0
        """When the input found its session busy (:meth:`Session.arrive`): its place in
        the session's queue."""
        self._poked: trio.Event | None = None
        """What this stream waits on while queued (:meth:`poke`)."""
        self._withdrawn: str | None = None
        """Why it was taken out of its session's queue (or of the running turn's steering,
        before the turn took it) before it started (:meth:`withdraw`)."""
        self.steered = False
        """Whether the input joined the turn that was running (the ``steer`` busy
        strategy) instead of starting one: then this stream yields no chunks (the
        running turn's stream shows them), :attr:`turn_id` is that turn's, and
        :attr:`result` its result once it is over."""
        self._host_stream: TurnStream | None = None
        """The running turn's stream the input joined, when :attr:`steered`."""
        self._inbox: Inbox[ConsumerItem] = Inbox(capacity, "block", name="consumer")
        self._buffer: deque[OutputChunk] = deque()
        self._ended = False
        self._entered = False

    @property
    def done(self) -> trio.Event:
        """Set with :attr:`result` (or when the turn's runner never answered). Made when
        first asked for (set already if the turn is over): most turns' callers read the
        stream to its end and never wait on it (issue 24 goal 1)."""
        event = self._done
        if event is None:
            event = self._done = trio.Event()
            if self._over:
                event.set()
        return event

    @property
    def cancel_reason(self) -> str | None:
        """The reason the turn was cancelled with, if it was."""
        return self._cancel.reason

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the turn: it ends with an ``abort`` chunk carrying ``reason`` (a steered
        input's stream stops the turn it joined)."""
        if self._host_stream is not None:
            self._host_stream.cancel(reason)
        elif not self._over:
            self._cancel.cancel(reason)

    def result_waits(self) -> bool:
        """Whether the turn's result has arrived and waits, unread, behind the chunks
        its consumer has not read yet: the turn is over but for its consumer, which
        reads the rest whenever it reads again (:meth:`Host._shutdown
        <runtime.app.host.Host._shutdown>`)."""
        item = self._inbox.last()
        return item is not None and not isinstance(item, Batch)

    def end_orphaned(self) -> None:
        """Called by the host once its actors have all ended: nothing will arrive on this
        stream any more, so its inbox is closed and the consumer reads to the end of what
        came (``result`` stays ``None`` if the result never did)."""
        self._inbox.close()

    def _names_a_running_turn(self, session: Session) -> bool:
        """Whether this stream's turn id is a turn of another session running now. Asked
        only for a caller's own id: a generator of the running turns made for every turn
        and never read was closed with a ``GeneratorExit`` (an exception built and
        dropped, issue 24 goal 1)."""
        running = session.host.turns_by_id.get(self.turn_id)
        return running is not None and running.session.current is running

    async def __aenter__(self) -> TurnStream:
        session = self.session
        session.host.check_open()
        if self._entered:  # (it ran the turn again into its closed inbox: busy for ever)
            raise SessionError(
                "this stream has run its turn already: call session.stream(...) again for another"
            )
        self._entered = True
        if not session.loaded:
            await session.reopen()
        elif (session.busy or session.queued) and self.user_message_id is not None:
            # What ``_check_not_held`` asks, read in bounded loop steps first: a running
            # turn with no client id of its own read none (it yields only when more than
            # one step's worth is unread; the session's state is asked again after).
            assert session.runner is not None
            await session.runner.read_ids()
            if not session.loaded:
                await session.reopen()
        queued = False
        if session.busy or session.queued:
            self._check_not_held()
            if self._named and (
                self._names_a_running_turn(session)
                or session.waiting_stream(message_id=None, turn_id=self.turn_id) is not None
            ):
                # The caller's turn id names a turn that runs or waits here already (two
                # requests sent at once with one id): it names that one, and this turn
                # gets an id of its own, as it would once the first had started.
                self.turn_id = new_id("turn")
            self.arrival = session.arrive()
            if CALLING_SESSION.get() == session.id:  # (it waited for the tool's timeout)
                raise SessionBusy(
                    f"session {session.id!r}: a tool of its running turn cannot run a turn "
                    "of its own session (it would wait for the turn that waits for the "
                    "tool); run it in another session"
                )
            self._check_not_stopped_before()
            queued = await self._when_busy()
            if self.steered:
                return self
        # From here to ``current = self`` nothing yields: an idle host cannot evict it between.
        if session.host.shutting_down:
            # The host began closing while this turn was on its way in (reading its
            # session or its decision from the store): the shutdown cancelled the turns
            # that ran then and stops the session's actors, so this one would run on a
            # stopped stream controller (a crash, its stream an ``error``). Refused as a
            # closed host's new work is; its input is not stored.
            raise HostClosed("the host is closing: open a new one (Host.open()) to run more turns")
        assert session.runner is not None
        session.host.touch(session)
        if queued:
            session.leave_queue(self)
        if session.busy:
            raise SessionBusy(f"session {session.id!r} is already running a turn")
        self._check_not_callers_wait()
        if queued and (session.interrupting or (session.queued and self.on_busy_now == INTERRUPT)):
            # A newer message waits already (one that interrupts, or any behind a turn
            # that interrupted): this turn is cut before its model call (a scope cancelled
            # before it is entered cancels on entry). Its input is kept.
            self._cancel.cancel(INTERRUPTED_BY_NEW)
        if self._named and (
            self._names_a_running_turn(session) or session.host.refuses_turn(self.turn_id)
        ):
            # A caller's id (an AG-UI runId) that names a turn of another session running
            # now: a turn id names one running turn (cancels, the relay's streams). Or
            # one of a deleted session's turn, whose saves are refused (a thread deleted
            # and started again, its client's runId constant).
            self.turn_id = new_id("turn")
        if not queued:
            # A stop that came before this message (its POST and the stop raced): its
            # turn is cut before its model call, its input kept, as a stop just after it
            # started would have. (A queued one was asked as it came to wait.)
            stopped = self._stopped_before()
            if stopped is not None:
                self._cancel.cancel(stopped)
        session.host.wake(session)  # (it may renew actors given up on: a new runner)
        runner = session.runner
        assert runner is not None
        session.current = self
        session.host.turns_by_id[self.turn_id] = self
        session.changed()
        try:
            await runner.send(
                RunTurn(
                    turn_id=self.turn_id,
                    input=self.input,
                    consumer=self._inbox,
                    cancel=self._cancel,
                    meta=session.meta,
                    regenerate=self.regenerate,
                    message_id=self.message_id,
                    user_message_id=self.user_message_id,
                    resume=self.resume,
                    deps=session.deps,
                    steering=self._steering,
                    tools=self.tools,
                    instructions=self.instructions,
                    stored=self.stored,
                    max_output_tokens=self.max_output_tokens,
                    output_account=self.output_account,
                    fence=fence_of(session.host.store, session.id),
                )
            )
        except BaseException:
            session.current = None
            self._not_running()
            session.changed()
            raise
        return self

    def _not_running(self) -> None:
        """This turn no longer runs: out of its host's ``turns_by_id``."""
        running = self.session.host.turns_by_id
        if running.get(self.turn_id) is self:
            del running[self.turn_id]

    def poke(self) -> None:
        """Wake this stream if it waits in its session's queue (:meth:`Session.changed`
        pokes the queue's head only)."""
        event, self._poked = self._poked, None
        if event is not None:
            event.set()

    def named_by(self, message_id: str) -> bool:
        """Whether a caller's ``message_id`` names this turn: its user message's id, or
        (a regenerate) the id of the answer it replaces (:attr:`regenerates`), or (a
        continuation after a wait for input) the user message of the turn it continues
        (:attr:`continues`) or that turn's answer (the AI SDK continuation's
        ``messageId``), or a message steered into it that it took (its input now, and
        the rest of the turn that message's answer: a stop naming it stops the turn, as
        one naming the turn's own message does; one the turn has not taken yet is taken
        out instead, :meth:`withdraw`)."""
        if self.continues is not None and message_id in (self.continues, self.message_id):
            return True
        return message_id in (self.user_message_id, self.regenerates) or (
            message_id in self._steering.took
        )

    def withdraw(self, reason: str) -> bool:
        """Take this stream's input out of its session's queue before its turn starts,
        or out of the running turn's steering before that turn takes it (``POST
        /api/chat/{id}/stop`` naming a waiting message): its ``async with`` raises
        :class:`~runtime.errors.TurnWithdrawn`, nothing run or stored, the running turn
        untouched. ``False`` when it waits for neither (started, taken into the running
        turn, over, or not entered yet)."""
        joining = self._joining
        if joining is not None:
            steering, item = joining
            if item.accepted:  # taken at a step boundary: it is the running turn's now
                return False
            steering.withdraw(item)
            self._withdrawn = reason
            item.taken.set()  # (its caller wakes, sees it withdrawn: it never joins)
            return True
        if self not in self.session._queue:
            return False
        self._withdrawn = reason
        self.poke()
        return True

    def _withdrawn_error(self) -> TurnWithdrawn:
        """What the ``async with`` of a withdrawn stream raises."""
        reason = self._withdrawn
        assert reason is not None
        return TurnWithdrawn(
            f"the message waiting for session {self.session.id!r}'s turn was taken out of "
            f"its queue ({reason}): it did not run, nothing was stored",
            reason=reason,
        )

    async def _wait_poked(self) -> None:
        """Until :meth:`poke`: a turn of the session started or ended, or a stream left
        the queue, while this one heads it."""
        if self._poked is None:
            self._poked = trio.Event()
        await self._poked.wait()

    def _check_not_stopped_before(self) -> None:
        """A new message that would wait for the running turn (queued, or to be steered
        into it): raise :class:`~runtime.errors.TurnWithdrawn` if a stop naming it (its
        user message id or its turn id) reached the host before it did (sent to this
        host, or forwarded by another and held by the relay's publisher). What
        ``Host.stop_named`` does to a waiting message when the stop comes after it, so
        both orders agree: it never waits, runs or is stored (:meth:`_stopped_before`:
        a regenerate or an edit only by the answer it replaces or its turn id)."""
        reason = self._stopped_before()
        if reason is not None:
            self._withdrawn = reason
            raise self._withdrawn_error()

    def _stopped_before(self) -> str | None:
        """The reason of a stop that reached the host before this new message did and
        names it (its user message id or its turn id), used up. A regenerate or an edit
        is asked by what only it has, the answer it replaces (:attr:`regenerates`, the
        AI SDK's ``messageId``) or its turn id, not by its user message's id, which
        named the turn before (a late stop of that turn cannot be told from an early
        one of this); a continuation not at all (:meth:`_check_not_stopped_before`)."""
        if self.resume or self.continues is not None:
            return None
        message_id = self.regenerates if self.regenerate else self.user_message_id
        return self.session.host.stopped_before(self.session.id, message_id, self.turn_id)

    def _check_not_held(self) -> None:
        """Refuse (:class:`~runtime.errors.InputHeld`) a new input whose message id the
        busy session holds already: a client's resend (a retry after a timeout) ran as a
        second turn under ``enqueue``, interrupted its own turn under ``interrupt``, or
        joined it as a second copy under ``steer``, each time storing two user messages
        with one id."""
        message_id = self.user_message_id
        if message_id is None or self.regenerate or self.resume:
            return
        held = self.session._holds_input(message_id)
        if held is not None:
            where = {
                "running": "is the input of the turn running now",
                "waiting": "waits already for its turn (or to join the running one)",
                "stored": "is in the session's history already",
                "answer": "is the id the running turn gives its answer after a steered message",
            }[held]
            raise InputHeld(
                f"message {message_id!r} {where}: it is not sent again while session "
                f"{self.session.id!r} is busy."
            )

    def _check_not_callers_wait(self) -> None:
        """Refuse (:class:`~runtime.errors.SessionBusy`) a new input to a sub-session
        (an agent used as a tool) whose turn waits for a decision its calling session
        makes (``Awaiting.caller``): it would supersede that wait, and the caller's
        decision then ran nothing (its call got the superseded sub-turn's empty answer).
        The calling call's own takeover of the waiting turn (``resume`` naming its
        message) goes through. Only the last assistant message is looked at, and only
        a turn that waits so is checked further."""
        messages = self.session.messages
        last = next((m for m in reversed(messages) if isinstance(m, AssistantMessage)), None)
        if last is None or (self.resume and self.message_id == last.id):
            return
        caller = next(
            (
                p.awaiting.caller
                for p in last.content
                if isinstance(p, ToolCallPart)
                and p.awaiting is not None
                and p.awaiting.caller is not None
            ),
            None,
        )
        if caller is not None and waiting_calls(messages):
            raise CallerWaits(
                f"session {self.session.id!r} waits for a decision of session {caller!r}, "
                "which called its agent as a tool: decide it there (a new message here "
                "would end that wait)",
                caller=caller,
            )

    def _check_still_last(self) -> None:
        """A ``regenerate`` of a named user message that waited for the session's turns:
        refused (:class:`~runtime.errors.RegenerateOutdated`) when that message is no
        longer the last one. It cut the turn that ran meanwhile (another message's, its
        answer lost) and stored the message again after the one it replaced."""
        message_id = self.user_message_id
        if not self.regenerate or message_id is None:
            return
        users = [m for m in self.session.messages if isinstance(m, UserMessage)]
        if users and users[-1].id != message_id:
            raise RegenerateOutdated(
                f"message {message_id!r} is no longer the last user message of session "
                f"{self.session.id!r}: message {users[-1].id!r} was answered after it while "
                "this regenerate waited; nothing was regenerated."
            )

    def confirm_with(self, confirm: Callable[[], Awaitable[None]]) -> None:
        """Have the turn await ``confirm`` before it runs tools (:attr:`TurnCancel.confirm`):
        a worker's turn, whose claim may have been taken over while the process was
        paused past its lease."""
        self._cancel.confirm = confirm

    def steer_from(self, pull: Callable[[], Awaitable[Sequence[SteeredInput]]]) -> None:
        """Have the turn also take the messages ``pull`` returns at each step boundary
        (before entering): a worker's turn, steered by messages a front end on another
        process recorded in the turn queue (:attr:`TurnSteering.pull`)."""
        self._steering.pull = pull

    async def _when_busy(self) -> bool:
        """A turn runs (or others wait for one): what the session's busy strategy says
        (:mod:`runtime.busy`). Raises :class:`~runtime.errors.SessionBusy` (``reject``;
        always for the continuation of a turn that waited, which has no new input);
        returns ``False`` once the input joined the running turn (``steer``: then
        :attr:`steered`), ``True`` once this stream heads the session's queue with no
        turn running (``enqueue``, ``interrupt``, a steered input the turn ended before
        taking, a ``regenerate`` under ``steer``)."""
        session = self.session
        strategy = self.on_busy_now = REJECT if self.resume else self.on_busy or session.on_busy
        if strategy == REJECT:
            raise SessionBusy(f"session {session.id!r} is already running a turn")
        running = session.current
        if strategy == STEER and running is not None and not self.regenerate:
            if await self._steer_into(running):
                return False
        await self._wait_in_queue(strategy)
        return True

    async def _steer_into(self, running: TurnStream) -> bool:
        """Hand the input to the running turn, and wait until it takes it at a step
        boundary (``True``) or ends without another step (``False``: the input then
        waits for a turn of its own, with the same user message id)."""
        item = SteeredInput(
            content=self.input, user_message_id=self.user_message_id or new_id("msg")
        )
        self.user_message_id = item.user_message_id
        if self.follow:  # before the offer: the turn may take it at once
            if running._followers is None:
                running._followers = {}
            running._followers[item.user_message_id] = self
        if not running._steering.offer(item):
            self._unfollow(running, item.user_message_id)
            return False
        session = self.session
        self._joining = running._steering, item
        if session._joiners is None:
            session._joiners = []
        session._joiners.append(self)
        try:
            await item.taken.wait()
        except BaseException:
            running._steering.withdraw(item)  # the caller left first: it never joins
            self._unfollow(running, item.user_message_id)
            raise
        finally:
            self._joining = None
            session._joiners.remove(self)
            if not session._joiners:
                session._joiners = None
        if self._withdrawn is not None:  # a stop named it before the turn took it
            self._unfollow(running, item.user_message_id)
            raise self._withdrawn_error()
        if not item.accepted:
            self._unfollow(running, item.user_message_id)
            return False
        await item.stored.wait()  # acknowledged once a save holds it (a kill loses none)
        if item.dropped:  # the turn went unsaved, and forgotten: the message runs on its own
            self._unfollow(running, item.user_message_id)
            self._followed = None
            return False
        self.steered, self._host_stream, self.turn_id = True, running, running.turn_id
        if item.answered:
            self.steer_answered = True
        return True

    def _unfollow(self, running: TurnStream, message_id: str) -> None:
        """This stream will not follow ``running`` (its input did not join it)."""
        followers = running._followers
        if followers is not None and followers.get(message_id) is self:
            del followers[message_id]

    def hands_over(self, message_id: str) -> bool:
        """Whether the stream that steered user message ``message_id`` into this turn
        follows it (:attr:`follow`): from the chunk that shows that message on, the turn's
        chunks go to that stream too, which shows them after its message; a consumer that
        shows the turn to the same client ends its own showing there (a following
        stream's consumer too: the turn's are asked)."""
        if self._host_stream is not None:
            return self._host_stream.hands_over(message_id)
        followers = self._followers
        return followers is not None and message_id in followers

    def _tee(self, chunks: Sequence[OutputChunk]) -> None:
        """Hand the chunks its consumer takes to the streams that follow the turn: each
        from the chunk that shows its message on (a ``start`` naming the answer's
        message first), that chunk left out."""
        followers = self._followers
        assert followers is not None
        for chunk in chunks:
            for message_id, follower in followers.items():
                if follower._followed is not None:
                    follower._followed.append(chunk)
                elif (
                    isinstance(chunk, Steered)
                    and chunk.message_id == message_id
                    and not chunk.answered  # (an earlier turn's: none of this answers it)
                ):
                    self.answer_ids = (*self.answer_ids, chunk.answer_id)
                    follower._followed = deque(
                        [
                            Start(
                                message_id=chunk.answer_id,
                                seq=chunk.seq,
                                session_id=chunk.session_id,
                                turn_id=chunk.turn_id,
                            )
                        ]
                    )
        for follower in followers.values():
            follower._wake_follower()

    def _wake_follower(self) -> None:
        event, self._follow_wake = self._follow_wake, None
        if event is not None:
            event.set()

    async def _wait_in_queue(self, strategy: OnBusy) -> None:
        """Wait in the session's queue (in arrival order) until no turn runs and none
        waits ahead of this one; under ``interrupt``, cancel each turn that runs
        meanwhile (the newest message wins). Left at the queue's head: the caller starts
        the turn without yielding, then leaves the queue."""
        session = self.session
        ahead = session.join_queue(self) + int(session.busy)
        try:
            await session.host.bus.publish(
                lifecycle.TurnQueued(
                    session_id=session.id, turn_id=self.turn_id, strategy=strategy, ahead=ahead
                )
            )
            while True:
                if self._withdrawn is not None:
                    raise self._withdrawn_error()
                if session.host.shutting_down:
                    raise ClosedWhileWaiting(
                        f"session {session.id!r}: the host is shutting down; the waiting turn "
                        "did not start"
                    )
                running = session.current
                if running is None and session.queue_head is self:
                    if session.loaded:
                        self._check_still_last()
                        return
                    await session.reopen()
                    continue
                if running is not None and strategy == INTERRUPT:
                    running.cancel(INTERRUPTED_BY_NEW)
                await self._wait_poked()
        except BaseException:
            session.give_up_place(self)
            raise

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        readers = self._readers
        if readers is not None:  # the async for's generators (:meth:`__aiter__`)
            self._readers = None
            for reader in readers:
                # one left at its ``yield`` (a ``break``) closes at once; one another
                # task reads through (running) ends with the turn
                if reader.ag_frame is not None and not reader.ag_running:
                    await reader.aclose()
        if self.steered:  # the turn it joined is not this stream's to end
            host = self._host_stream
            if not self._over:
                self._end(host.result if host is not None else None)
            self._inbox.close_receiver()
            return
        if not self._over:
            if exc_type is not None and issubclass(exc_type, trio.Cancelled):
                self.cancel("cancelled")
            elif exc_type is not None:
                self.cancel(f"consumer failed: {exc_type.__name__}")
            else:
                self.cancel("consumer left the stream")
            with trio.CancelScope(shield=True), trio.move_on_after(FINAL_WAIT):
                while not self._ended:  # the rest of the turn, to its result
                    self._buffer.clear()
                    await self._receive(alone=False)  # (beside a reader it handed on to)
            self._end(None)  # the runner never answered: the session must not stay busy
        self._inbox.close_receiver()

    def _end(self, result: TurnResult | None) -> None:
        """The turn is over for this stream: free the session for its next turn."""
        if self._over:
            return
        self._ended = True
        self.result = result
        self._steering.close()  # an input still waiting to join starts a turn of its own
        if self._followers is not None:  # they end with this turn
            for follower in self._followers.values():
                follower._wake_follower()
        session = self.session
        if result is not None and session.current is self:
            _untitle_unstored(session, result)
            told = unsaved_error(result) if unsaved(result) else None
            session.last_turn = (result.turn_id, result.message.id, told)
        if session.current is self:
            if self.continues is not None or session.continued is not None:
                session.continued = self.message_id if self.continues is not None else None
            session.current = None
            self._not_running()
            session.changed()
            if not session.queued:  # idle: its actors rest until its next turn
                session.host.rest(session)
        session.host.touch(session)  # an idle session's age counts from here
        self._over = True
        if self._done is not None:
            self._done.set()

    def __aiter__(self) -> AsyncGeneratorType[OutputChunk, None]:
        """The chunks as an async generator, one per ``async for``: the same chunks, in
        the same order, as :meth:`__anext__` gives (it reads on from the same buffer).

        Why not ``self``: ``async for`` over an object whose ``__anext__`` is a coroutine
        method looks the method up, makes a coroutine, runs and frees it for every chunk;
        over an async generator it resumes one frame (the interpreter's ``anext`` of an
        async generator, whose awaitables are recycled): ~450 of the ~10,000 instructions
        a delta of a whole Anthropic turn (callgrind, issue 24 goal 1). A generator that
        one ``async for`` left early (``break``) waits at its ``yield``; the stream closes
        it when its ``async with`` is left, so none is collected unfinished (Trio warns
        of that). So a loop over the stream ends with its block: one that another task
        runs and is between two chunks then reads no further (one waiting for a chunk
        ends with the turn, as before)."""
        reader = cast("AsyncGeneratorType[OutputChunk, None]", self._read())
        readers = self._readers
        if readers is None:
            self._readers = [reader]
        else:
            readers[:] = [r for r in readers if r.ag_frame is not None]
            readers.append(reader)
        return reader

    async def _read(self) -> AsyncGenerator[OutputChunk, None]:
        buf = self._buffer
        while True:
            while buf:
                yield buf.popleft()
            if self._ended:
                return
            await self._receive()

    async def __anext__(self) -> OutputChunk:
        buf = self._buffer
        while not buf:
            if self._ended:
                raise StopAsyncIteration
            await self._receive()
        return buf.popleft()

    async def next_batch(self, most: int = 4096) -> list[OutputChunk]:
        """Every chunk that has arrived and was not read yet (:meth:`take_ready`),
        waiting for one if none has; ``[]`` once the turn is over. The same chunks
        ``async for`` yields, taken in bulk by a consumer that forwards them (the asyncio
        bridge, :mod:`runtime.app.aio`, crosses threads once per batch, not once per chunk)."""
        while not self._buffer:
            if self._ended:
                return []
            await self._receive()
        return self.take_ready(most)

    def take_ready(self, most: int = 4096) -> list[OutputChunk]:
        """The chunks that have arrived and were not read yet, without waiting: those
        read from the inbox already and, while fewer than ``most``, the inbox's waiting
        batches (each holds at most :data:`~runtime.actor_messages.MAX_BATCH`)."""
        buf = self._buffer
        inbox = self._inbox
        while not self._ended and len(buf) < most and len(inbox):
            self._take(inbox.get_nowait())
        chunks = list(buf)
        buf.clear()
        return chunks

    async def _receive(self, alone: bool = True) -> None:
        """Take the next inbox item: a batch into the buffer, or the turn's end.

        One task reads at a time (``alone``): two tasks iterating one stream each got
        some of its chunks, silently (a UI and a log each missing half the deltas)."""
        if not self._entered:  # (nothing would ever arrive: it waited for ever)
            raise SessionError(
                "a stream runs its turn once entered: async with session.stream(...) as "
                "out: async for chunk in out: ..."
            )
        if alone and self._receiving:
            raise SessionError(
                "another task is reading this stream: each chunk goes to one reader, so "
                "two would each miss some; read it in one task and hand the chunks on "
                "(a trio memory channel per listener)"
            )
        self._receiving = True
        try:
            if self._host_stream is not None:  # steered: nothing of its own, the turn's result
                host = self._host_stream
                if self.follow:  # ... or what that turn's consumer took from its step on
                    while not self._followed and not host._over:
                        self._follow_wake = trio.Event()
                        await self._follow_wake.wait()
                    if self._followed:
                        self._buffer.extend(self._followed)
                        self._followed.clear()
                        return
                await host.done.wait()
                self._end(host.result)
                return
            inbox = self._inbox
            if len(inbox):
                # Already queued: a batch is taken with a schedule point as ``get`` takes it,
                # the turn's result (its last item) without one: the stream ends here, and a
                # yield would cost the caller a task step and a scheduler round more per turn
                # (issue 24 goal 1).
                item = await inbox.take()
                self._take(item)
                if isinstance(item, Batch):
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return
            try:
                item = await inbox.get()
            except trio.EndOfChannel:  # closed without a result: only if the runner failed
                self._end(None)
                return
            self._take(item)
        finally:
            self._receiving = False

    def _take(self, item: ConsumerItem) -> None:
        if isinstance(item, Batch):
            item.taken = True
            self._buffer.extend(item)
            if not self.answer_ids and item and type(item[0]) is Start:
                self.answer_ids = (item[0].message_id,)
            if self._followers is not None:
                self._tee(item)
        else:
            self._end(item.result)

    async def collect(self) -> list[OutputChunk]:
        """Every remaining chunk of the turn, as a list."""
        return [chunk async for chunk in self]


class ResumeStream(TurnStream):
    """The continuation of a turn that waited for input (``session.resume()``): entering
    it reads the waiting turn from the store (or takes what this process's decision
    stored, if a version query shows nobody wrote since), and runs it on from its
    suspended step, under its turn id and in its assistant message; the turn runner
    starts from that record instead of reading the session again.

    ``decided`` (from :meth:`Session.respond`): the decision that completed the turn,
    recorded by the same call just before; taken as it is, without the version query,
    while it is still the session's latest decision (:meth:`Session.take_decided`)."""

    def __init__(
        self,
        session: Session,
        *,
        tools: tuple[Tool, ...] = (),
        instructions: str | None = None,
        decided: Recorded | None = None,
        max_output_tokens: int | None = None,
        output_account: OutputAccount | None = None,
    ) -> None:
        super().__init__(
            session,
            "",
            turn_id=None,
            resume=False,
            tools=tools,
            instructions=instructions,
            max_output_tokens=max_output_tokens,
            output_account=output_account,
        )
        self._decided = decided

    async def __aenter__(self) -> TurnStream:
        session = self.session
        session.host.check_open()  # (before the store, which a closed host closed)
        taken = session.take_decided(self._decided) if self._decided is not None else None
        record: SessionRecord | None
        if taken is not None:
            record, waiting = taken
        else:
            record, waiting = await session.decided_record()
        if not waiting or not all(c.decided for c in waiting):
            left = sum(not c.decided for c in waiting)
            raise NothingToResume(
                f"session {session.id!r} has no waiting turn to resume"
                if not waiting
                else f"session {session.id!r}: {left} waiting call(s) not decided yet"
            )
        self.message_id, self.turn_id, self.resume = waiting[0].message_id, waiting[0].turn_id, True
        # Its id was a caller's (an AG-UI runId) that another session's turn may run under
        # now (a client's constant runId): then, as for a new turn, it gets its own id
        # (a turn id names one running turn: a stop by id, the relay's stream).
        self._named = True
        self.stored = record  # the turn runner starts from it: no second read
        self.continues = _asked_by(
            record.messages if record is not None else session.messages, self.message_id
        )
        return await super().__aenter__()


def _asked_by(messages: Sequence[Message], answer_id: str | None) -> str | None:
    """The id of the user message that assistant message ``answer_id`` answers (the last
    user message before it), if any."""
    asked: str | None = None
    for message in messages:
        if message.id == answer_id:
            return asked
        if isinstance(message, UserMessage):
            asked = message.id
    return None


_UNSET: Any = object()


class Session:
    """A conversation with one agent, hosted by a :class:`~runtime.app.host.Host`."""

    _joiners: list[TurnStream] | None = None
    """The streams whose input waits to join the running turn at its next step boundary
    (``steer``), until it is taken or handed back; an instance's own from the first (a
    class default: an idle session holds no list and no attribute of it; an empty list
    each, with ``TurnStream._joining`` set in ``__init__``, was +0.065 KB an idle
    session, 4.17 -> 4.23, ``bench_concurrency idle 10000 1000``)."""

    continued: str | None = None
    """The answer the session's last turn continued (after a wait for input), if it was
    a continuation: a stop naming that answer that comes now is the continuation's,
    late (``Host.hold_stop`` keeps none for a regenerate of it). A class default: an
    idle session that never continued holds no attribute of it."""

    def __init__(
        self,
        host: SessionOwner,
        agent: Agent,
        runner: SessionRunner,
        *,
        session_id: str,
        meta: Mapping[str, Any] | None = None,
        deps: Any = None,
        on_busy: OnBusy | None = None,
    ) -> None:
        self.host = host
        self.agent = agent
        self._on_busy: OnBusy | None = None if on_busy is None else check_on_busy(on_busy)
        self._queue: deque[TurnStream] = deque()
        """Turns waiting to start, in arrival order (``enqueue``, ``interrupt``)."""
        self._arrivals = 0
        """Inputs that found the session busy, counted (:meth:`arrive`)."""
        self.interrupting = 0
        """How many of :attr:`_queue` wait under ``interrupt``: a turn that starts
        while one of them waits is cut at once (the newest message wins)."""
        self._changed: trio.Event | None = None
        """Set (and dropped) when a turn starts or ends, or one leaves the queue; made
        by the first :meth:`wait_changed` (an idle session holds none)."""
        self.deps = deps
        """The application's own dependencies, handed to every tool call of the session's
        turns as ``ToolContext.deps`` (read when a turn starts; reassign it freely between
        turns). Kept in memory only: never saved, and an evicted session keeps it."""
        self._id = session_id
        self.runner: SessionRunner | None = runner
        self.actors: list[Actor] = []
        self.loaded_record: SessionRecord | None = None
        """What the host's last load of the session read (:meth:`take_loaded`)."""
        self.current: TurnStream | None = None
        """The turn in progress, if any."""
        self.last_used = 0.0
        """Trio time of the last use (open, turn start or end, a read through the web API)."""
        self._meta: Mapping[str, Any] = _frozen_meta(meta)
        self._saved_anything = True
        """Whether the store held any of the session when it was last evicted."""
        self.last_turn: tuple[str, str, ErrorInfo | None] | None = None
        """The last turn that ended here: its id, its assistant message's id, and the
        error its client was told when it was not saved (``not_saved``). A relay resume
        that lost the turn's stream rebuilds it from that message only, or ends as its
        live stream did (:mod:`runtime.app.web.resume`): the store's last assistant
        message may be another turn's."""
        self._decided: Recorded | None = None
        """This process's last decision (the session as it stored it, and the turn's
        waiting calls), until a continuation takes it (:meth:`decided_record`)."""

    @property
    def id(self) -> str:
        return self._id

    @property
    def loaded(self) -> bool:
        """Whether the session is in memory: open on its host and not evicted."""
        return self.runner is not None and self.host.sessions.get(self._id) is self

    @property
    def state(self) -> SessionSnapshot:
        """The history as the turn runner last published it (an immutable snapshot).
        Raises :class:`~runtime.errors.SessionNotLoaded` after an eviction, until
        reopened."""
        if self.runner is None:
            raise SessionNotLoaded(
                f"session {self._id!r} was evicted from memory while idle; its history is in "
                "the store: `await session.reopen()` (or start a turn) to load it again"
            )
        return self.runner.snapshot

    @property
    def messages(self) -> tuple[Message, ...]:
        """The history: system/user/assistant/tool messages, in order. Raises
        :class:`~runtime.errors.SessionNotLoaded` after an eviction, until reopened."""
        return self.state.messages

    @property
    def busy(self) -> bool:
        """Whether a turn is running (from its start until its stream has the result)."""
        return self.current is not None

    @property
    def on_busy(self) -> OnBusy:
        """What a new user message does while a turn runs (:mod:`runtime.busy`): the
        session's own strategy if it was given one (``host.open_session(on_busy=)``, or
        set here), else its agent's (``Agent(on_busy=)``, ``reject`` by default)."""
        return self._on_busy or self.agent.on_busy

    @on_busy.setter
    def on_busy(self, value: OnBusy | None) -> None:
        self._on_busy = None if value is None else check_on_busy(value)

    @property
    def queued(self) -> int:
        """How many turns wait for the running one to end (``enqueue``, ``interrupt``)."""
        return len(self._queue)

    @property
    def waiting_inputs(self) -> int:
        """How many user messages wait for the running turn: queued turns, and messages
        waiting to join it at its next step boundary (``steer``)."""
        running = self.current
        steering = len(running._steering.waiting) if running is not None else 0
        return len(self._queue) + steering

    @property
    def queue_head(self) -> TurnStream | None:
        """The turn that starts next, if any waits."""
        return self._queue[0] if self._queue else None

    def withdraw_queued(self, reason: str) -> int:
        """Withdraw every turn waiting in the queue (:meth:`TurnStream.withdraw`): none
        of them runs. How many there were."""
        return sum(stream.withdraw(reason) for stream in list(self._queue))

    def arrive(self) -> int:
        """The arrival number of a new input that finds the session busy."""
        self._arrivals += 1
        return self._arrivals

    def join_queue(self, stream: TurnStream) -> int:
        """Called by a waiting turn's stream: it waits behind those that arrived before it
        (a steered input the running turn ended without taking joins late, and goes
        before the inputs that arrived after it); how many wait ahead of it."""
        queue = self._queue
        at = len(queue)
        while at and queue[at - 1].arrival > stream.arrival:
            at -= 1
        queue.insert(at, stream)
        if stream.on_busy_now == INTERRUPT:
            self.interrupting += 1
        return at

    def leave_queue(self, stream: TurnStream) -> None:
        """Called by a waiting turn's stream as it starts (or gives up waiting:
        :meth:`give_up_place`)."""
        if stream in self._queue:
            self._queue.remove(stream)
            if stream.on_busy_now == INTERRUPT:
                self.interrupting -= 1
            self.changed()

    def give_up_place(self, stream: TurnStream) -> None:
        """Called by a waiting turn's stream that leaves the queue without starting (its
        caller cancelled or timed out, the host shutting down). A session it leaves idle
        lets its actors rest: the turn that ended before kept them awake for this one
        (it gave up in the batch that ended that turn, after the end looked at the
        queue), and nothing else would rest them before the next turn or the eviction."""
        self.leave_queue(stream)
        if self.current is None and not self._queue:
            self.host.rest(self)

    def waiting_stream(self, *, message_id: str | None, turn_id: str | None) -> TurnStream | None:
        """The stream waiting in the queue (not started yet), or waiting to join the
        running turn (``steer``, not taken yet), that ``message_id`` names
        (:meth:`TurnStream.named_by`: its user message, or the answer a regenerate
        replaces) or whose turn is ``turn_id``, if any."""
        for stream in (*self._queue, *(self._joiners or ())):
            if (message_id is not None and stream.named_by(message_id)) or (
                turn_id is not None and stream.turn_id == turn_id
            ):
                return stream
        return None

    async def holds_input(self, message_id: str) -> str | None:
        """Where the session holds user message ``message_id`` while a turn runs or waits:
        ``"running"`` (the running turn's input), ``"waiting"`` (a queued turn's, or one
        waiting to join the running turn), ``"answer"`` (an id the running turn's
        answer takes once a message is steered into it, ``<first>-s<step>``:
        :func:`actors.turn.takeover.steered_message_id`; a user message stored under it
        would share it), ``"stored"`` (a message of the history has the
        id: asked of the runner's kept ids, as the runner asks them of a new turn's or a
        steered message's id, which it would not store again), else ``None``.
        A client that sends a message again while the session is busy (a retry after a
        timeout) must not get a second copy of it: the web app asks this first.
        The runner's ids not read yet are read first in bounded loop steps
        (:meth:`SessionRunner.read_ids`; no yield when they are read already), so a
        first question of a long session does not stall the process; the session's
        state is asked after that."""
        if self.loaded and self.runner is not None:
            await self.runner.read_ids()
        return self._holds_input(message_id)

    def _holds_input(self, message_id: str) -> str | None:
        """:meth:`holds_input` once the runner's ids are read (a stream's check, which
        reads them before it, in bounded steps, and must not yield between its look at
        the session's state and its arrival)."""
        running = self.current
        if running is not None:
            if running.user_message_id == message_id:
                return "running"
            if any(i.user_message_id == message_id for i in running._steering.waiting):
                return "waiting"
            first = running.message_id or (running.answer_ids[0] if running.answer_ids else None)
            if first is not None and _answer_of(message_id, first):
                return "answer"
        if any(s.user_message_id == message_id for s in self._queue):
            return "waiting"
        runner = self.runner
        if self.loaded and runner is not None and runner.holds_message(message_id):
            return "stored"  # (the runner's kept ids: a scan of the history cost a pass
            # over the session per message that found it busy)
        return None

    def changed(self) -> None:
        """Wake whatever waits for the session's turns to change, and the queue's head:
        only the head can start, and a stream that leaves the queue changes it again, so
        the next one wakes in turn (a host shutting down refuses them one by one). Waking
        every queued stream on every change cost ten thousand queued messages 10^8
        wake-ups, in the one thread every session's turns run on."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None
        if self._queue:
            self._queue[0].poke()

    async def wait_changed(self) -> None:
        """Until a turn starts or ends, or one leaves the queue."""
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    @property
    def meta(self) -> Mapping[str, Any]:
        """The session's meta (title, links to a parent session, ...), read-only; saved
        with the session's messages. Change it with :meth:`update_meta`."""
        return self._meta

    def update_meta(self, values: Mapping[str, Any]) -> None:
        """Set meta keys. Saved with the next turn's first save (a turn already running
        keeps the meta it started with). Raises :class:`~runtime.errors.InvalidMeta`
        for keys or values the store cannot save, changing nothing."""
        self._meta = _frozen_meta(checked_meta({**self._meta, **checked_meta(values)}))

    def set_title(self, title: str) -> None:
        """Set the session's title (``meta["title"]``)."""
        self.update_meta({"title": title})

    @property
    def unsaved_meta(self) -> Mapping[str, Any] | None:
        """Meta of a session evicted before anything of it was saved, applied on reopen."""
        return None if self._saved_anything or not self._meta else self._meta

    async def reopen(self) -> None:
        """Load the session again after its host evicted it (or it was closed): its
        history from the store, fresh actors. A no-op while it is loaded."""
        if not self.loaded:
            await self.host.reopen_session(self)

    def attach(self, runner: SessionRunner, actors: list[Actor], meta: Mapping[str, Any]) -> None:
        """Called by the host when it (re)loads the session: the new runner, actors and
        meta (as loaded)."""
        self.runner = runner
        self.actors = actors
        self._meta = _frozen_meta(meta)
        self._saved_anything = True
        self.loaded_record = None

    def take_loaded(self) -> SessionRecord | None:
        """The record the host loaded the session from (an empty one at version 0 if it
        was not stored), once: ``None`` after that. A worker that loaded the session for
        the turn it claimed hands it to that turn (``RunTurn.stored``), which then needs
        no version query."""
        record, self.loaded_record = self.loaded_record, None
        return record

    def detach(self) -> None:
        """Called by the host when it evicts the session: drop the history and actors."""
        if self.runner is not None:
            self._saved_anything = self.runner.snapshot.saved_upto > 0
        self.runner = None
        self.actors = []
        if self.current is not None:
            self.current._not_running()
        self.current = None
        self._decided = None

    def stream(
        self,
        input: UserInput,
        *,
        regenerate: bool = False,
        turn_id: str | None = None,
        message_id: str | None = None,
        resume: bool = False,
        user_message_id: str | None = None,
        on_busy: OnBusy | None = None,
        tools: tuple[Tool, ...] = (),
        instructions: str | None = None,
        regenerates: str | None = None,
        follow: bool = False,
        stored: SessionRecord | None = None,
        max_output_tokens: int | None = None,
        output_account: OutputAccount | None = None,
    ) -> TurnStream:
        """Start a turn for user ``input``; use as ``async with session.stream(t) as out``.

        ``input`` is text, or a list of text, :class:`~runtime.messages.Image` and
        :class:`~runtime.messages.File` values (one image or file alone also works). It is
        checked here, before anything is stored: a value of another kind or a bad image
        raises :class:`~runtime.errors.InvalidMedia`, media bigger than the agent's
        ``media_limits`` :class:`~runtime.errors.MediaTooLarge`, more parts than the host's
        ``input_limits`` :class:`~runtime.errors.TooManyParts`.

        With ``regenerate``, the turn replaces the session's last turn: the history is cut
        back to before its last user message first (in the store too, with the turn's
        first save). A session runs one turn at a time: entering while a turn runs does
        what the session's busy strategy says (:attr:`on_busy`, or ``on_busy`` here for
        this input alone; :mod:`runtime.busy`): raise
        :class:`~runtime.errors.SessionBusy` (``reject``), wait for the running turn to
        end (``enqueue``), cancel it (``interrupt``), or join it at its next step boundary
        (``steer``: then the stream's ``steered`` is set, it yields no chunks of its own,
        and its ``result`` is the joined turn's; with ``follow``, it yields the joined
        turn's chunks from the one that shows the input on, as :attr:`TurnStream.follow`
        says).

        A durable turn (run by a worker, taken over by another if that one dies) names
        itself: ``turn_id`` is used instead of a new id (unless a turn of another session
        of the host running now has it: then a new one), ``message_id`` becomes its
        assistant message's id. With ``resume``, the turn may have committed steps
        already: if the history holds message ``message_id``, the turn continues it from
        the step after its last committed one (only the step in flight runs again, and
        ``input`` is not added again); a turn whose committed steps finished it runs no
        model call and changes nothing. Without such a message it is a new turn. A
        malformed id, or ``resume`` without ``message_id``, raises
        :class:`~runtime.errors.InvalidTurnId`. ``user_message_id`` is the id the turn's
        user message gets (the web app passes the client's, to recognise a resend of it).
        ``regenerates`` (with ``regenerate``) names the answer the turn replaces as the
        caller knows it (the AI SDK's ``messageId``): only a name, by which a stop finds
        the turn (:meth:`waiting_stream`, :meth:`TurnStream.named_by`).

        ``tools`` are offered to the model for this turn only, after the agent's own (the
        client-side tools a protocol's caller declares, :meth:`runtime.tools.Tool.client`);
        ``instructions`` are added after the agent's for this turn only. Neither is saved.

        ``stored``: the session as its caller just read it from the store (what
        :meth:`take_loaded` gives right after the host opened it), which the turn starts
        from instead of asking the store again (a ``resume`` turn loads the session
        first otherwise). Only for a record read just now: a newer save is not looked for.

        ``max_output_tokens``: the output tokens this turn may write at most, over all its
        calls, under the agent's own ``Budget.max_output_tokens`` (the smaller holds, and
        is each call's cap as the budget is): an agent used as a tool runs its sub-turn
        under what its calling turn has left (:attr:`ToolContext.output_left`). An int of
        0 or more; ``None``: the agent's budget alone. ``output_account``: the live
        account (:class:`~runtime.budget.OutputAccount`) each of the turn's model calls
        reserves its cap in, and settles into when it is over; an agent used as a tool
        runs its sub-turn on its calling call's (:attr:`ToolContext.output_account`), so
        sub-agents called at once never write more, together, than the caller had left.
        It bounds a turn that has an output budget (its agent's, or ``max_output_tokens``,
        which the tool gives with it); a turn without one reserves nothing.
        """
        self._decided = None  # a new input supersedes what waited: nothing to resume
        content = user_content(input)
        check_counts(content, self.host.input_limits)
        check_limits(content, self.agent.media_limits)
        stream = TurnStream(
            self,
            content,
            regenerate=regenerate,
            turn_id=turn_id,
            message_id=message_id,
            user_message_id=user_message_id,
            regenerates=regenerates if regenerate else None,
            resume=resume,
            on_busy=on_busy,
            tools=tools,
            instructions=instructions,
            follow=follow,
            max_output_tokens=max_output_tokens,
            output_account=output_account,
        )
        if stored is not None:
            stream.stored = stored
        return stream

    @property
    def pending(self) -> tuple[PendingCall, ...]:
        """The calls the session's last turn waits for, not yet decided (docs/approval.md),
        as of the history in memory (a decision recorded elsewhere shows after the next
        load: ``await session.reopen()`` of an evicted session, or a turn)."""
        return pending_calls(self.messages)

    async def decide(
        self,
        id: str,
        *,
        approved: bool | None = None,
        reason: str | None = None,
        output: Any = _UNSET,
        error: str | None = None,
        edited_input: Mapping[str, Any] | None = None,
        expected_version: int | None = None,
        by_caller: bool = False,
        tools: Sequence[Tool] = (),
        output_checked: bool = False,
        input_checked: bool = False,
    ) -> Recorded:
        """Record a decision for a waiting call, without resuming the turn: ``approved``
        (and ``reason``) for an approval id, ``output`` (or ``error``) for a client tool's
        call id. Checked and stored atomically (of two decisions for one call, exactly
        one is recorded). Raises :class:`~runtime.errors.UnknownApproval` (no such call
        waits in this session), :class:`~runtime.errors.AlreadyDecided`,
        :class:`~runtime.errors.InvalidDecision` (the wrong kind of answer, an output
        its schema refuses); nothing changes then. ``.complete`` on the result says
        whether every waiting call is decided now: then :meth:`resume`.

        ``edited_input``: approve (``approved=True`` only) with this input instead of the
        model's; checked against the tool's input schema like the model's
        (:class:`~runtime.errors.InvalidDecision` if it fails, nothing recorded), stored
        as the call's input, the model's kept beside it; for an agent tool's call whose
        sub-agent passed its approval up, the edit is of the sub call that asks (checked
        against that tool, kept as ``Awaiting.edited_input`` until the call runs again)
        (docs/approval.md, "Approving with edits"). ``tools``: the turn's own tools
        (``stream(text, tools=...)``), to check an edit of a call of one of them.

        ``expected_version``: record it on top of that version of the session, the one
        :meth:`held_record` gave, or not at all: when the session in memory is no longer
        at it, or the store has moved past it, raises :class:`~runtime.errors.StoreConflict`
        and records nothing. For a caller that checked more than this decision against
        that record (the web app's body of several answers): the save's version check
        tells it whether its checks were made on what the store held.

        A call of a sub-session (an agent used as a tool) waits for the session that
        called it: a decision here raises :class:`~runtime.errors.CallerDecides`, which
        names that session; ``by_caller`` is the calling call's own (the agent tool
        running again with the caller's decision), the one decision it takes.

        A large ``output`` (:func:`~runtime.approval.large_output`) is checked against
        its tool's output schema in a worker thread, not on the event loop the host's
        other sessions stream on, and once. ``output_checked``: the caller checked it
        against that schema already and it is plain JSON, as a body parses to (the web
        front ends, reading a body's answers): not checked or converted again.
        ``input_checked``: the same of ``edited_input`` (checked on this call as the
        decision checks an edit: A2A's decisions).

        A session of a closed host raises :class:`~runtime.errors.HostClosed`, recording
        nothing (it recorded the decision, then its continuation was refused, or failed
        on the store the host had closed)."""
        self.host.check_open()
        if self.busy:
            raise SessionBusy(f"session {self._id!r} is already running a turn")
        by_name = {t.name: t for t in (*self.agent.tools, *tools)}
        known = view = self.held_record()
        if (
            not output_checked
            and output is not _UNSET
            and not by_caller
            and approved is None
            and error is None
            and edited_input is None
            and large_output(output)
        ):
            if view is None and expected_version is None:
                # No view in memory (evicted, another process's session): the session
                # read here, to check against in the thread, and decided on as read.
                view = await self.host.store.load(self._id)
            if view is not None:
                # Stored as the recording keeps it (cut), made in the thread: the
                # recording, on the loop, does not write the whole output out again.
                output_checked, output = await trio.to_thread.run_sync(
                    _stored_checked_output,
                    view.messages,
                    id,
                    output,
                    by_name,
                    self.agent.budget.max_tool_result_chars,
                    limiter=off_loop_limiter(),
                )
        decision = Decision(
            approved=approved,
            reason=reason,
            output=None if output is _UNSET else output,
            error=error,
            has_output=output is not _UNSET,
            edited_input=edited_input,
            by_caller=by_caller,
            output_checked=output_checked,
            input_checked=input_checked,
        )
        if expected_version is not None and (known is None or known.version != expected_version):
            raise StoreConflict(
                f"session {self._id!r} is no longer at version {expected_version} in memory",
                session_id=self._id,
                expected=expected_version,
                actual=known.version if known is not None else 0,
            )
        self._decided = None
        try:
            recorded = await record_decision(
                self.host.store,
                self._id,
                id,
                decision,
                by_name,
                known=view,
                only_known=expected_version is not None,
                max_chars=self.agent.budget.max_tool_result_chars,
                clock=self.host.clock,
            )
        except WaitExpired:
            # Past the deadline before the timer noticed: deny it now, as the timer
            # would have, and resume the turn (in the background).
            self.host.expire_now(self)
            raise
        except StoreError as e:
            if self.host.shutting_down:  # (set from the start of its close on)
                # Its save was under way as the host closed the store it had opened:
                # what a closed host's decision raises, not the store's "is closed".
                raise HostClosed(
                    "the host closed while the decision was being saved: open a new one "
                    "(Host.open()); it loads what the store kept"
                ) from e
            raise
        if recorded.messages is not None:
            self._decided = recorded
        if recorded.complete:
            self.host.wait_over(self)
        event = approval_decided(
            self._id,
            recorded.call,
            approved=bool(approved),
            reason=reason,
            max_chars=self.agent.budget.max_tool_result_chars,
        )
        if event is not None:
            await self.host.bus.publish(event)
        return recorded

    async def end_wait(self, reason: str) -> None:
        """End the turn that waits for input, for good, without resuming it: each call
        it still waits for is denied with ``reason`` (a client tool's gets it as its
        error), and every waiting call gets its result, in one version-checked save (a
        conflicting writer: read again). The history is then whole and no
        ``resume()``, continuation request or later decision can run the turn on.
        How an agent used as a tool closes a sub-turn that suspended once its caller
        was told it did not finish (before, its calls were only denied: the turn stayed
        decided and unresumed, and a ``resume()`` ran the sub-agent on, tools and all,
        after the calling model had gone on without it). Nothing waits: nothing done."""
        store = self.host.store
        max_chars = self.agent.budget.max_tool_result_chars
        for _ in range(RECORD_ATTEMPTS):
            record = await store.load(self._id)
            if record is None:
                return
            messages = list(record.messages)
            denied = pending_calls(messages)
            at = supersede(messages, max_chars, reason=reason)
            if at is None:
                return
            try:
                await store.save(
                    self._id,
                    at,
                    messages[at:],
                    {WAITING_META: 0},
                    expected_version=record.version,
                )
            except StoreConflict:
                continue
            self._decided = None
            for call in denied:
                event = approval_decided(
                    self._id, call, approved=False, reason=reason, max_chars=max_chars
                )
                if event is not None:
                    await self.host.bus.publish(event)
            return

    def held_record(self) -> SessionRecord | None:
        """The session as this process last stored it, when memory holds all of it: what
        its latest decision stored (:meth:`decide`; no turn has run since, or it would
        have been taken or dropped), else the history in memory when it is all saved (at
        the version the turn runner last saw); ``None`` when neither (evicted, a step
        not saved yet). A view, not a read: a decision is checked against it without
        reading the store, and saved on top of its version, so a stale one (another
        writer saved since) only costs that read after all, never a wrong decision.
        Preferring the decision's record lets the next decision of the same turn (a
        page that answers its calls one at a time, a body of several answers) save on
        top of it instead of conflicting with the version the runner last saw."""
        if self.runner is None or not self.loaded:
            return None
        decided = self._decided
        if decided is not None and decided.messages is not None:
            return _as_record(self._id, decided)
        snap = self.runner.snapshot
        if snap.version <= 0 or not snap.all_saved:
            return None
        return SessionRecord(session_id=self._id, messages=snap.messages, version=snap.version)

    async def decided_record(self) -> tuple[SessionRecord | None, tuple[PendingCall, ...]]:
        """The stored session, for a continuation, and its last turn's waiting calls: what
        this process's last decision stored if the store is still at its version (a
        version query), else read.

        The query cannot ride in the decision's own save: the save's version says what
        the store held when the decision committed, and what matters is whether anyone
        wrote since. Another process may load the decided session right after that
        commit, run the approved tool and commit its result before this continuation
        starts (between ``decide`` and ``resume``, which an application may call apart);
        trusting the decision's record then would run the tool a second time. Nothing
        else touches the store before the tool runs (its result's save comes after it),
        so this query is the only look that can see such a writer. (:meth:`respond`,
        which resumes at once, goes without it: :meth:`take_decided` says why.)"""
        store, decided, self._decided = self.host.store, self._decided, None
        if decided is not None and await store.version(self._id) == decided.version:
            return _as_record(self._id, decided), decided.waiting
        record = await store.load(self._id)
        return record, waiting_calls(record.messages) if record is not None else ()

    def take_decided(
        self, decided: Recorded
    ) -> tuple[SessionRecord, tuple[PendingCall, ...]] | None:
        """What ``decided`` stored (the session and its turn's waiting calls), for the
        continuation :meth:`respond` starts at once after it (or the web app's
        continuation request, ``resume(decided=...)``), without a version query;
        ``None`` when it is no longer this process's latest decision (another input, a
        decision or an eviction came in between): then :meth:`decided_record` decides.

        Why this is safe without the query. The query sees another writer that committed
        between the decision's save and the query, and nothing else. Here the decision is
        this call's own, it completed the turn (``respond`` resumes only then; of two
        racing decisions exactly one is recorded, by the version-checked save of
        :func:`~runtime.approval.record_decision`, and only its caller sees
        ``complete``), and all that runs between its commit and this is the bus's
        delivery of ``tool.approval-decided`` (which waits only for a subscriber's full
        inbox); in the web app, also the request handing its response to the server,
        which calls it at once, and that response's :meth:`reopen` (a no-op while the
        session is loaded: an eviction in between drops the decision, below). A writer
        of another process caught by the query would have had to load the session,
        continue the turn (or supersede it) and commit within those microseconds; one a
        little slower, committing just after the query and before this continuation's
        first save, is missed by the query too (the embedded store has no lease: nothing
        fences a continuation there, as a worker's claim does).
        So the query narrowed a race it cannot close by a few microseconds, and guarded
        nothing ``respond`` relies on. A writer in this process is seen without asking
        the store: a new input clears the latest decision (:meth:`stream`), as an
        eviction does (:meth:`detach`), and a later decision replaces it; then the store
        is asked, as for ``resume()``. Where ``decide`` and ``resume`` are called apart,
        possibly minutes apart, the query stays (:meth:`decided_record`)."""
        if self._decided is not decided or decided.messages is None:
            return None
        self._decided = None
        return _as_record(self._id, decided), decided.waiting

    def resume(
        self,
        *,
        tools: tuple[Tool, ...] = (),
        instructions: str | None = None,
        decided: Recorded | None = None,
        max_output_tokens: int | None = None,
        output_account: OutputAccount | None = None,
    ) -> TurnStream:
        """The continuation of the turn that waited, once every call it waits for is
        decided: ``async with session.resume() as out``. Approved calls run (once),
        denied ones give the model the denial, client tools' outputs are their results,
        and the model goes on in the same assistant message. Entering raises
        :class:`~runtime.errors.NothingToResume` when no turn waits or a call is still
        undecided. ``tools`` and ``instructions`` are :meth:`stream`'s, for the
        continuation only.

        ``decided``: what :meth:`decide` returned for the decision that completed the
        turn, when the caller resumes at once after making it (as :meth:`respond` does,
        and the web app's continuation request): the continuation starts from what that
        decision stored, without asking the store for the version, while it is still
        the session's latest decision (:meth:`take_decided` says why that is safe only
        then). Leave it out where the decision and the continuation are apart.
        ``max_output_tokens``: :meth:`stream`'s, what the continuation may write beyond
        the turn's committed steps; ``output_account``: :meth:`stream`'s."""
        return ResumeStream(
            self,
            tools=tools,
            instructions=instructions,
            decided=decided,
            max_output_tokens=max_output_tokens,
            output_account=output_account,
        )

    async def respond(
        self,
        id: str,
        *,
        approved: bool | None = None,
        reason: str | None = None,
        output: Any = _UNSET,
        error: str | None = None,
        edited_input: Mapping[str, Any] | None = None,
        tools: Sequence[Tool] = (),
        instructions: str | None = None,
    ) -> TurnResult | None:
        """:meth:`decide`, then, if that decided the last waiting call, run the
        continuation to its end and return its result (``None`` while other calls
        still wait). The continuation starts from what the decision stored, without
        reading the store or asking it for the version (:meth:`take_decided` says why
        that is safe). ``tools`` and ``instructions`` are :meth:`resume`'s: a turn
        given tools of its own (``stream(text, tools=...)``) needs them again to run
        one a person approved (before, ``respond`` could not give them: the approved
        call got ``unknown tool`` and never ran). ``edited_input``: :meth:`decide`'s."""
        recorded = await self.decide(
            id,
            approved=approved,
            reason=reason,
            output=output,
            error=error,
            edited_input=edited_input,
            tools=tools,
        )
        if not recorded.complete:
            return None
        resumed = self.resume(tools=tuple(tools), instructions=instructions, decided=recorded)
        async with resumed as out:
            async for _ in out:
                pass
        return out.result

    def regenerate(self, text: UserInput) -> TurnStream:
        """``stream(text, regenerate=True)``: run the last turn again, with ``text``."""
        return self.stream(text, regenerate=True)

    async def run(self, text: UserInput) -> TurnResult:
        """Run a whole turn, discarding the stream; returns its result (``result.text``
        is the answer, ``result.finish_reason`` how the turn ended: a failed turn
        returns with ``error`` set rather than raising; ``result.saved`` is ``False``
        when the store did not confirm the turn's save, in time or at all)."""
        async with self.stream(text) as out:
            async for _ in out:
                pass
        if out.result is None:
            raise ActorFailed(
                f"session {self._id!r}: the turn ended without a result (its turn runner "
                "crashed, or the host closed while it was stuck): the log's actor.crashed "
                "line says why"
            )
        return out.result

    async def close(self) -> None:
        """Stop this session's actors; its history stays in the store. Raises
        :class:`~runtime.errors.SessionBusy` while a turn runs or waits (stopped under
        it, the turn's stream never ended): cancel it, or close after it ended."""
        if self.busy or self.queued:
            raise SessionBusy(
                f"session {self._id!r} is running a turn: cancel it (out.cancel()) or "
                "close the session after it ended"
            )
        await self.host.close_session(self)
