"""A2A tasks over the runtime's sessions and turns: task = turn, ``contextId`` = session.

A task is one turn of the agent, with its continuations: a turn that waits for approval
or for a client-side tool (docs/approval.md) is a task in ``TASK_STATE_INPUT_REQUIRED``,
and the client's next message on the task carries the decisions that resume it, in the
same assistant message. Its id is ``<session id>~<assistant message id>``: from the id
alone any process on the store finds the turn again, so ``GetTask`` answers for turns
that ran before a restart (and for turns the chat page ran: every turn is a task).

Turns run in the app's background nursery, not in the request that started them: an
A2A client may send with ``returnImmediately``, drop its stream and subscribe again, so
a turn outlives its request. :class:`LiveTask` keeps what a subscriber needs while a task
runs (its state, its answer so far, the events since it started); :class:`TaskBook`
starts, finds, continues and cancels tasks. Tasks that are not live any more are read
back from the session's history (:func:`derive`).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from functools import partial
from typing import Any

import orjson
import trio

from actors.a2a import wire
from runtime.app.session import FINAL_WAIT
from runtime.app.unsaved import forget_unsaved, unsaved, unsaved_error
from runtime.app.web.answers import checked_decisions, record_all
from runtime.app.web.chat_input import title_of
from runtime.app.web.http import CLOSING_RETRY_AFTER, closing_message
from runtime.approval import (
    APPROVAL,
    SUPERSEDED,
    Decision,
    PendingCall,
    Recorded,
    pending_calls,
)
from runtime.busy import REJECT
from runtime.errors import (
    CallerWaits,
    DecisionError,
    HostClosed,
    InvalidMedia,
    InvalidSessionId,
    MediaTooLarge,
    NothingToResume,
    RelayUnavailable,
    SessionBusy,
    StoreConflict,
    TooManyParts,
)
from runtime.ids import new_id
from runtime.json_exact import dumps
from runtime.liveness import answering_elsewhere
from runtime.media import check_counts, check_limits, user_content
from runtime.messages import (
    AssistantMessage,
    Message,
    ToolCallPart,
    ToolMessage,
    UserContent,
    UserMessage,
)
from runtime.output import Start
from runtime.store import has_user_messages, validate_session_id
from runtime.tools import AGENT_DEPTH_META, agent_depth

CANCELED_REASON = "canceled by the A2A client"
"""The reason a canceled task's turn (or its waiting calls) is stopped with."""

LIVE_TASKS = 64
"""Tasks kept in memory while no turn of theirs runs (the oldest go first): a task that
is not kept is read back from its session's history when asked for. Running tasks are
always kept (there is at most one per session), and so are tasks in a transition (an
answer being recorded, a cancel under way: :meth:`TaskBook._keep`); the 65th task only
pushes the oldest resting one out of memory, nothing of it is lost. A kept task holds
its client's messages (media included) and its answer, so this bounds what finished
tasks hold (their stream events are dropped once no stream follows them:
:meth:`LiveTask._compact`)."""

RUNNING_TASKS = 100
"""Tasks that may run at once in one app. An A2A client need not hold a connection
while its task runs (``returnImmediately``), so without a bound a client could start
any number of turns; past it a new task is refused (``UnsupportedOperation``, HTTP 429
on HTTP+JSON) until one ends."""

SEPARATOR = "~"
"""Between a task id's session id and message id: in neither id's alphabet."""


def fingerprint(content: Any) -> str:
    """What a client's message said (its user content), as a digest: a message re-sent
    with the same ``messageId`` must say the same (:func:`check_resend`)."""
    return hashlib.sha256(dumps(wire.parts_of(content), marked=False)).hexdigest()


def answer_fingerprint(incoming: wire.Incoming) -> str:
    """What a message on a task (its answers to what the task waits for) said."""
    # (an integer past 64 bits in a data part too: orjson refused it, a 500 after the
    # answer was recorded)
    parts = dumps(incoming.parts, option=orjson.OPT_SORT_KEYS, marked=False)
    return hashlib.sha256(parts).hexdigest()


def check_resend(said: str | None, says: str, incoming: wire.Incoming, context_id: str) -> None:
    """A message whose ``messageId`` was sent before in the context is a resend, which
    runs nothing and gets the task it started, only when it says the same (``said`` /
    ``says``: the two :func:`fingerprint` s; ``None``: not known, taken as the same). A
    careless client that reuses one ``messageId`` for every message would otherwise get
    its first answer back for every later question, and nothing run."""
    if said is not None and said != says:
        raise wire.invalid_params(
            f"message.messageId {incoming.message_id[:128]!r} was sent before in context "
            f"{context_id!r} with other content: a message sent again with its messageId "
            "must be the same message (it runs nothing again); give each new message a "
            "messageId of its own"
        )


async def _streams_message(relay: Any, turn_id: str, message_id: str) -> bool:
    """Whether the relay's stream of ``turn_id`` starts message ``message_id`` (its first
    chunk, a ``start``); a stream the relay lost or cannot prove whole: ``False``."""
    chunks = relay.read(turn_id)
    try:
        with trio.move_on_after(FINAL_WAIT):
            first = await chunks.__anext__()
            return isinstance(first, Start) and first.message_id == message_id
        return False
    except (LookupError, StopAsyncIteration):
        return False
    finally:
        await chunks.aclose()


def task_id_of(context_id: str, message_id: str) -> str:
    return f"{context_id}{SEPARATOR}{message_id}"


def split_task_id(task_id: str) -> tuple[str, str]:
    """``(session id, assistant message id)`` of a task id; ``TaskNotFound`` for an id
    this server never made."""
    context_id, sep, message_id = task_id.rpartition(SEPARATOR)
    try:
        validate_session_id(context_id)
        validate_session_id(message_id)  # the same alphabet as message ids
    except InvalidSessionId:
        raise wire.task_not_found(task_id) from None
    if not sep:
        raise wire.task_not_found(task_id)
    return context_id, message_id


# -- a task's state, from the history --------------------------------------------------


def pending_message(
    task_id: str, context_id: str, pending: Sequence[PendingCall]
) -> dict[str, Any]:
    """The status message of a task waiting for input: a line a person reads, and the
    calls as data (what the answer's ``decisions`` name)."""
    # a sub-agent's client tool passed up (``PendingCall.sub_tool``): its call, not the
    # agent tool's, is the one to run
    # and a sub-agent's approval passed up (``PendingCall.asked_tool``): its asking call,
    # the one an ``editedInput`` edits
    shown = [
        (
            c,
            c.sub_tool or c.asked_tool or c.tool_name,
            c.sub_input if c.sub_tool else c.asked_input if c.asked_tool else c.input,
        )
        for c in pending
    ]
    lines = [
        f"{'approve' if c.kind == APPROVAL else 'run the client-side tool'} "
        f"{name}({dumps(input, marked=False).decode()}) [id {c.approval_id}]"
        for c, name, input in shown
    ]
    calls = [
        {"id": c.approval_id, "kind": c.kind, "tool": name, "input": input}
        for c, name, input in shown
    ]
    parts = [
        wire.text_part("waiting for input: " + "; ".join(lines)),
        {"data": {"pending": calls}},
    ]
    return wire.message(
        wire.ROLE_AGENT,
        parts,
        message_id=new_id("msg"),
        context_id=context_id,
        task_id=task_id,
    )


NOTICES = frozenset({"throttled", "budget-wait"})
"""The output chunks a task's status says while they hold (:meth:`LiveTask.take`)."""

_QUIET = NOTICES | {"tool-stream"}
"""Chunks that do not end a notice: another notice, or a tool's nested stream (a tool
running beside the waiting model call says nothing of it)."""

_WHY = {
    "requests": "requests per minute",
    "tokens": "tokens per minute",
    "concurrency": "calls in flight",
    "provider": "the provider asked to pause",
}


def _notice_key(chunk: Any) -> tuple[Any, ...]:
    """What a notice says, to tell a wait said already from a new one: its kind and every
    field :func:`notice_message` shows. A limiter's next try of a wait for a free slot
    (``concurrency``, every 0.25 s) says the same and is not sent again; one whose wait
    changed (another caller took the slot it waited for: ``requests``, ``tokens``,
    ``provider``), or a step's second reservation (its history's summary call, then its
    own), is sent, so the task does not go on showing the first try's numbers (before,
    the key was the kind, step and reason alone: "about 60 s" stayed while the call
    waited minutes more)."""
    if chunk.type == "throttled":
        return (chunk.type, chunk.step, chunk.wait, chunk.reason)
    return (chunk.type, chunk.step, chunk.want, chunk.available, chunk.held, chunk.ahead)


def notice_message(task_id: str, context_id: str, chunk: Any) -> dict[str, Any]:
    """The status message of a task whose model call waits: a ``throttled`` chunk (a
    rate limit) or a ``budget-wait`` one (output tokens the calls beside it hold), as a
    line a person reads and the chunk's fields as data (``throttled`` / ``budgetWait``),
    as :func:`pending_message` says what an input-required task waits for."""
    if chunk.type == "throttled":
        why = _WHY.get(chunk.reason, chunk.reason)
        text = f"the model call waits about {chunk.wait:.3g} s for its rate limit ({why})"
        data = {"throttled": {"step": chunk.step, "wait": chunk.wait, "reason": chunk.reason}}
    else:
        text = (
            f"the model call waits for output tokens: it wants {chunk.want}, "
            f"{chunk.available} are free, {chunk.held} held by calls in flight, "
            f"{chunk.ahead} waiting before it"
        )
        fields = ("step", "want", "available", "held", "ahead")
        data = {"budgetWait": {name: getattr(chunk, name) for name in fields}}
    return wire.message(
        wire.ROLE_AGENT,
        [wire.text_part(text), {"data": data}],
        message_id=new_id("msg"),
        context_id=context_id,
        task_id=task_id,
    )


def _agent_note(task_id: str, context_id: str, text: str) -> dict[str, Any]:
    return wire.message(
        wire.ROLE_AGENT,
        [wire.text_part(text)],
        message_id=new_id("msg"),
        context_id=context_id,
        task_id=task_id,
    )


def user_message(m: UserMessage, context_id: str, task_id: str) -> dict[str, Any]:
    return wire.message(
        wire.ROLE_USER,
        wire.parts_of(m.content),
        message_id=m.id,
        context_id=context_id,
        task_id=task_id,
    )


def _stopped(part: ToolCallPart) -> bool:
    """A waiting call that a new message superseded or the client canceled."""
    w = part.awaiting
    assert w is not None
    return w.reason in (SUPERSEDED, CANCELED_REASON) or w.error in (SUPERSEDED, CANCELED_REASON)


def _continued(between: Sequence[Message]) -> bool:
    """Whether a waiting turn went on after its calls' results: an assistant message of
    its own follows them (before the next user message)."""
    return any(isinstance(m, AssistantMessage) for m in between)


def derive(
    messages: Sequence[Message], index: int, task_id: str, context_id: str, *, running: bool
) -> LiveTask:
    """The task of the assistant message at ``index``, as its history tells it
    (``running``: the session runs a turn now, which is this one if it is the last)."""
    message = messages[index]
    assert isinstance(message, AssistantMessage)
    user = next((m for m in reversed(messages[:index]) if isinstance(m, UserMessage)), None)
    after = messages[index + 1 :]
    nxt = next((i for i, m in enumerate(after) if isinstance(m, UserMessage)), len(after))
    last = nxt == len(after)
    answered = {m.tool_call_id for m in after[:nxt] if isinstance(m, ToolMessage)}
    awaiting = [p for p in message.content if isinstance(p, ToolCallPart) and p.awaiting]
    live = LiveTask(task_id, context_id, message.id)
    live.text = [message.text] if message.text else []
    if user is not None:
        live.history.append(user_message(user, context_id, task_id))
        live.seen[user.id] = fingerprint(user.content)
    note: dict[str, Any] | None = None
    if message.error is not None:
        state = wire.FAILED
        note = _agent_note(task_id, context_id, message.error.message)
    elif message.interrupted or any(_stopped(p) for p in awaiting):
        state = wire.CANCELED
    elif any(p.tool_call_id not in answered for p in awaiting):
        pending = pending_calls(messages[: index + 1 + nxt]) if last else ()
        if pending:
            state = wire.INPUT_REQUIRED
            note = pending_message(task_id, context_id, pending)
        else:  # decided, its continuation not run (yet): about to resume, or given up
            state = wire.WORKING if last else wire.CANCELED
    elif awaiting and not last and not _continued(after[:nxt]):
        # every call answered, but by the next message's turn (approved calls it ran, a
        # denial's result), never by this task's own: superseded, as the live adapter
        # marks a waiting task a new message overtakes
        state = wire.CANCELED
        note = _agent_note(task_id, context_id, "superseded by a later message")
    elif last and running:
        state = wire.WORKING
    else:
        state = wire.COMPLETED
    live.state = state
    live.status_message = note
    return live


# -- live tasks -------------------------------------------------------------------------


class HostClosing(wire.A2AError):
    """A task refused as the host closes (``serve`` stopping, :class:`HostClosed`):
    nothing ran or was stored; a 503 with ``Retry-After`` (over JSON-RPC too, as a
    refusal before the request is read is), to send again."""

    def __init__(self, exc: HostClosed) -> None:
        super().__init__("Internal", closing_message(exc), status=503)
        self.headers = {"retry-after": CLOSING_RETRY_AFTER}


class LiveTask:
    """A task as subscribers follow it: its state, its answer so far, its history, and
    the stream events (``StreamResponse`` s) since it was started here."""

    def __init__(self, task_id: str, context_id: str, message_id: str) -> None:
        self.id = task_id
        self.context_id = context_id
        self.message_id = message_id
        self.state = wire.SUBMITTED
        self.status_message: dict[str, Any] | None = None
        self.timestamp = wire.now()
        self.text: list[str] = []
        self.history: list[dict[str, Any]] = []
        self.seen: dict[str, str] = {}
        """Stored ids of the client messages this task took (a re-sent one is known), to
        what each said (:func:`fingerprint`: a resend must say the same)."""
        self.events: list[dict[str, Any]] = []
        """The events its followers have yet to read (:meth:`follow`): once it settles
        and none follows it, they are dropped (:meth:`_compact`)."""
        self._dropped = 0
        """Events dropped before :attr:`events` (a follower's cursor counts them)."""
        self._followers = 0
        self.transition = trio.Lock()
        """Held while a message's answers are recorded and the continuation they complete
        starts, and while the task is canceled: a cancel that came in between found the
        task waiting with nothing left to deny, answered ``CANCELED``, and the
        continuation then ran the approved calls and completed the task."""
        self.running = False
        """A turn (or a continuation) of the task runs now."""
        self.out: Any = None
        """The running turn's stream (to cancel it)."""
        self._step_mark = 0
        """Where the current step's text starts in :attr:`text` (a reset cuts it there)."""
        self.notice: tuple[Any, ...] | None = None
        """What the status says the model call waits for (:func:`_notice_key`: a
        ``throttled`` or ``budget-wait`` chunk's kind and fields), until the turn goes on."""
        self._changed = trio.Event()

    @property
    def settled(self) -> bool:
        """No turn of the task runs (it waits, or is over): a stream of it ends here.
        A task this book runs is terminal or waits whenever its turn is not running; one
        read back from the store whose turn nothing here runs shows as it is."""
        return not self.running

    def snapshot(self, history_length: int | None = None) -> dict[str, Any]:
        """The ``Task`` as it is now."""
        return wire.task(
            self.id,
            self.context_id,
            wire.status(self.state, self.status_message, self.timestamp),
            text="".join(self.text),
            history=self.history,
            history_length=history_length,
        )

    @property
    def cursor(self) -> int:
        """Where a stream that starts now follows the task from (:meth:`follow`)."""
        return self._dropped + len(self.events)

    def _emit(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self._changed.set()
        self._changed = trio.Event()

    def _compact(self) -> None:
        """Drop what a settled task nobody follows holds for its followers only: its
        events (a stream that starts now starts past them; subscribing to a finished task
        is refused) and its answer in pieces (joined). A kept task (``LIVE_TASKS`` of
        them) held ~800 bytes per text delta of its answer: a long answer, tens of MB."""
        if self.settled and not self._followers and self.events:
            self._dropped += len(self.events)
            self.events = []
            whole = "".join(self.text)
            self.text = [whole] if whole else []
            self._step_mark = len(self.text)

    def set_state(self, state: str, note: dict[str, Any] | None = None) -> None:
        self.state, self.status_message, self.timestamp = state, note, wire.now()
        self.notice = None
        self._emit(wire.status_update(self.id, self.context_id, wire.status(state, note)))
        self._compact()

    def add_text(self, text: str) -> None:
        append = bool(self.text)
        self.text.append(text)
        self._emit(wire.artifact_update(self.id, self.context_id, text, append=append))

    def take(self, chunk: Any) -> None:
        """One output chunk of the task's turn: its text goes into the answer artifact;
        a ``reset-step`` (the step starts over on a fallback provider) takes the step's
        text out again: the artifact is sent whole, without it, and without ``append``,
        which replaces the artifact the client holds (A2A has no other way to retract).

        A ``throttled`` or ``budget-wait`` chunk (the model call waits) is a ``WORKING``
        status update whose message says so (:func:`notice_message`; the same wait said
        again, every field the same, is not sent again: :func:`_notice_key`); the
        turn's next chunk of its own (not a tool's nested stream) ends it with a
        ``WORKING`` update with no message, so neither the task nor a client that keeps
        its last status says it waits once it goes on. A
        sub-agent's, nested in its ``tool-stream``, is not said: A2A shows none of a
        task's tool calls, and one call's wait beside others at work is no status of
        the task."""
        kind = chunk.type
        if self.notice is not None and kind not in _QUIET:
            self.set_state(wire.WORKING)  # it goes on: the wait is over
        if kind == "text-delta" and chunk.text:
            self.add_text(chunk.text)
        elif kind == "step-start":
            self._step_mark = len(self.text)
        elif kind == "reset-step":
            del self.text[self._step_mark :]
            whole = "".join(self.text)
            self.text = [whole] if whole else []
            self._step_mark = len(self.text)
            self._emit(wire.artifact_update(self.id, self.context_id, whole, append=False))
        elif kind in NOTICES:
            self._notice(chunk)

    def _notice(self, chunk: Any) -> None:
        said = _notice_key(chunk)
        if said == self.notice or self.state != wire.WORKING:
            return  # (a limiter's next try of the same wait; never outside a run)
        self.set_state(wire.WORKING, notice_message(self.id, self.context_id, chunk))
        self.notice = said

    def close_answer(self) -> None:
        if self.text:
            self._emit(wire.artifact_update(self.id, self.context_id, "", append=True, last=True))

    async def wait_settled(self) -> None:
        while not self.settled:
            await self._changed.wait()

    def follow(self, cursor: int) -> AsyncIterator[dict[str, Any]]:
        """The events from ``cursor`` (:attr:`cursor` when the stream started) on, as
        they come, until the task settles. The follower counts from now, before the
        iterator starts, so that the events it is to read are kept for it."""
        self._followers += 1
        return self._follow(cursor)

    async def _follow(self, cursor: int) -> AsyncIterator[dict[str, Any]]:
        try:
            while True:
                while cursor < self.cursor:
                    cursor += 1
                    yield self.events[cursor - 1 - self._dropped]
                if self.settled:
                    return
                await self._changed.wait()
        finally:
            self._followers -= 1
            self._compact()


def _busy(context_id: str, running: LiveTask | None) -> wire.A2AError:
    what = f"task {running.id!r}" if running is not None else "a turn"
    return wire.A2AError(
        "UnsupportedOperation",
        f"context {context_id!r} is running {what}: one task runs per context at a time "
        "(wait for it, cancel it, or use another contextId)",
    )


def _media_error(exc: Exception) -> wire.A2AError:
    if isinstance(exc, MediaTooLarge | TooManyParts):
        return wire.invalid_params(str(exc))
    return wire.A2AError("ContentTypeNotSupported", str(exc))


class TaskBook:
    """The A2A tasks of one app (:class:`runtime.app.web.app.WebState`)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.live: dict[str, LiveTask] = {}

    # -- reading ------------------------------------------------------------------------

    async def _history(self, context_id: str) -> tuple[Sequence[Message], bool] | None:
        """The session's messages and whether it runs a turn: from memory while it does
        (its running turn is not all saved), else from the store (a decision recorded
        through the store is not in memory yet); ``None`` for no such session."""
        session = self.state.host.sessions.get(context_id)
        if session is not None and session.loaded and session.busy:
            return session.messages, True
        record = await self.state.host.load_settled(context_id)  # (a killed turn: canceled)
        return (record.messages, False) if record is not None else None

    async def _history_if_sent(
        self, context_id: str, stored_id: str
    ) -> tuple[Sequence[Message], bool] | None:
        """:meth:`_history` when message ``stored_id`` may be in it, else ``None``: a
        stored session is read whole only when its store says the id is there
        (:func:`~runtime.store.has_user_messages`; a 5,000-message one was 1.2 MB a send).
        Read from the store while another process runs a turn of it (its running
        marker, :func:`~runtime.liveness.answering_elsewhere`: two ``serve`` on one
        file, the same message sent to both at once), it is refused as a context
        running a task is here: its resend was given the claimed empty answer as a
        completed task."""
        session = self.state.host.sessions.get(context_id)
        if session is not None and session.loaded and session.busy:
            return session.messages, True
        store = self.state.host.store
        if getattr(store, "has_user_messages", None) is not None:  # (else it would load twice)
            if stored_id not in await has_user_messages(store, context_id, (stored_id,)):
                return None
        session = self.state.host.sessions.get(context_id)  # (again, after the await)
        if session is not None and session.loaded and session.busy:
            return session.messages, True
        record = await self.state.host.load_settled(context_id)  # (a killed turn: canceled)
        if record is None:
            return None
        if answering_elsewhere(record.meta, self.state.host.marker_id) and any(
            type(m) is UserMessage and m.id == stored_id for m in record.messages
        ):
            raise wire.A2AError(
                "UnsupportedOperation",
                f"context {context_id!r} is running a task on another server (message "
                f"{stored_id!r} was sent to two at once): ask for it once it is done",
            )
        return record.messages, False

    async def find(self, task_id: str) -> LiveTask:
        """The task ``task_id``: live, or read back from its session (and kept live from
        then on); ``TaskNotFound`` otherwise."""
        live = self.live.get(task_id)
        if live is not None:
            return live
        context_id, message_id = split_task_id(task_id)
        found = await self._history(context_id)
        if found is None:
            raise wire.task_not_found(task_id)
        messages, running = found
        index = next(
            (
                i
                for i, m in enumerate(messages)
                if isinstance(m, AssistantMessage) and m.id == message_id
            ),
            None,
        )
        if index is None:
            raise wire.task_not_found(task_id)
        live = derive(messages, index, task_id, context_id, running=running)
        session = self.state.host.sessions.get(context_id)
        current = session.current if session is not None and running else None
        if live.state == wire.WORKING and current is not None and self.state.background:
            live.running = True  # a turn this book did not start (the chat page's)
            self.state.background.start_soon(self._watch, live, current)
        return self._keep(live)

    async def _watch(self, live: LiveTask, current: Any) -> None:
        """Follow a turn this book did not start to its end, for its subscribers: its
        answer and its final state, as its history then tells them."""
        await current.done.wait()
        try:
            found = await self._history(live.context_id)
            messages = found[0] if found is not None else ()
            index = next(
                i
                for i, m in enumerate(messages)
                if isinstance(m, AssistantMessage) and m.id == live.message_id
            )
            fresh = derive(messages, index, live.id, live.context_id, running=False)
        except Exception:  # gone from the store meanwhile: nothing more to tell
            live.running = False
            live.set_state(live.state)
            return
        live.running = False
        text, sent = "".join(fresh.text), "".join(live.text)
        if text.startswith(sent) and text != sent:
            live.add_text(text[len(sent) :])
        live.close_answer()
        live.set_state(fresh.state, fresh.status_message)

    def _keep(self, live: LiveTask) -> LiveTask:
        """Keep ``live``, and drop the oldest tasks past :data:`LIVE_TASKS` that are at
        rest: neither running nor in a transition (:attr:`LiveTask.transition` held, an
        answer being recorded or a cancel under way). One dropped in a transition was
        found again as a fresh copy, whose lock orders nothing: a cancel then ran beside
        the continuation an answer was starting, answered ``CANCELED``, and the
        continuation completed the turn."""
        self.live[live.id] = live
        if len(self.live) > LIVE_TASKS:
            resting = [
                k for k, t in self.live.items() if not t.running and not t.transition.locked()
            ]
            for key in resting[: len(self.live) - LIVE_TASKS]:
                del self.live[key]
        return live

    # -- sending ------------------------------------------------------------------------

    async def send(self, request: wire.SendRequest) -> LiveTask:
        """Start the task a message asks for, or continue the one it names; a message
        sent before (its ``messageId``) gives the task it started, and runs nothing."""
        incoming = request.message
        if incoming.task_id is not None:
            return await self._continue(incoming)
        opened = self._opening(incoming)
        if isinstance(opened, LiveTask):
            return opened
        context_id, stored_id, content = opened
        found = await self._history_if_sent(context_id, stored_id)
        if found is not None:
            messages, _ = found
            at = next(
                (
                    i
                    for i, m in enumerate(messages)
                    if isinstance(m, UserMessage) and m.id == stored_id
                ),
                None,
            )
            if at is not None:  # a re-sent message: the task it started
                sent = messages[at]
                assert isinstance(sent, UserMessage)
                check_resend(fingerprint(sent.content), fingerprint(content), incoming, context_id)
                answer = next(
                    (m for m in messages[at + 1 :] if isinstance(m, AssistantMessage)), None
                )
                if answer is not None:
                    return await self.find(task_id_of(context_id, answer.id))
        self._check_capacity()  # before a session opens: a refused task leaves nothing
        session = await self.state.session(context_id)
        # Looked for again after the last await: the same message sent twice at once may
        # have started its task meanwhile (then the session is busy with it, not another).
        twin = self._sent_before(context_id, stored_id)
        if twin is not None:
            return twin
        if session.busy:
            raise _busy(context_id, self._running_in(context_id))
        message_id = new_id("task")
        live = LiveTask(task_id_of(context_id, message_id), context_id, message_id)
        live.seen[stored_id] = fingerprint(content)
        live.history.append(self._history_entry(incoming, context_id, live.id, stored_id))
        if "title" not in session.meta:
            session.set_title(title_of(content))
        depth = wire.hops(incoming.metadata)
        if depth > agent_depth(session.meta):  # the turn runs that deep; never less:
            session.update_meta({AGENT_DEPTH_META: depth})  # no caller resets a context
        waiting = [
            t
            for t in self.live.values()
            if t.context_id == context_id and t.state == wire.INPUT_REQUIRED
        ]
        self.live[live.id] = live
        try:
            await self._start(live, session, content, stored_id=stored_id)
        except BaseException:
            self.live.pop(live.id, None)
            twin = self._sent_before(context_id, stored_id)
            if twin is not None:  # the same message, sent twice at once: one turn
                return twin
            raise
        for old in waiting:  # the new turn denied what they waited for: superseded
            old.set_state(
                wire.CANCELED, _agent_note(old.id, context_id, f"superseded by task {live.id}")
            )
        return self._keep(live)

    def _opening(self, incoming: wire.Incoming) -> LiveTask | tuple[str, str, UserContent]:
        """A message that starts a task, checked: its context id, stored message id and
        content; or the live task it started already (a resend, checked no further)."""
        context_id = incoming.context_id or new_id("ctx")
        try:
            validate_session_id(context_id)
        except InvalidSessionId as exc:
            raise wire.invalid_params(f"message.contextId: {exc}") from None
        stored_id = wire.stored_message_id(incoming.message_id)
        try:
            content = user_content(wire.user_input(incoming.parts))
            twin = self._sent_before(context_id, stored_id)
            if twin is not None:  # a resend: checked no further than that it is one
                check_resend(twin.seen[stored_id], fingerprint(content), incoming, context_id)
                return twin
            check_counts(content, self.state.host.input_limits)
            check_limits(content, self.state.agent_for(context_id).media_limits)
        except (InvalidMedia, MediaTooLarge, TooManyParts) as exc:
            raise _media_error(exc) from None
        return context_id, stored_id, content

    def _check_capacity(self) -> None:
        running = sum(t.running for t in self.live.values())
        if running >= RUNNING_TASKS:
            raise wire.A2AError(
                "UnsupportedOperation",
                f"{running} tasks are running, the most this agent runs at once: "
                "try again when one has ended",
                status=429,
            )

    def _sent_before(self, context_id: str, stored_id: str) -> LiveTask | None:
        """The live task that message ``stored_id`` of the context started, if any."""
        return next(
            (t for t in self.live.values() if t.context_id == context_id and stored_id in t.seen),
            None,
        )

    def _running_in(self, context_id: str) -> LiveTask | None:
        return next(
            (t for t in self.live.values() if t.context_id == context_id and t.running), None
        )

    @staticmethod
    def _history_entry(
        incoming: wire.Incoming, context_id: str, task_id: str, stored_id: str
    ) -> dict[str, Any]:
        return {
            **incoming.raw,
            "messageId": incoming.message_id,
            "contextId": context_id,
            "taskId": task_id,
            "role": wire.ROLE_USER,
        }

    async def _task_waiting(self, incoming: wire.Incoming) -> tuple[LiveTask, str | None]:
        """The task a message on a task answers, checked to wait for input, and the
        message's stored id (``None``: the task has this message already, a resend)."""
        assert incoming.task_id is not None
        live = await self.find(incoming.task_id)
        if incoming.context_id is not None and incoming.context_id != live.context_id:
            raise wire.invalid_params(
                f"message.contextId {incoming.context_id!r} is not the context of task {live.id!r}"
            )
        stored_id = wire.stored_message_id(incoming.message_id)
        if stored_id in live.seen:
            check_resend(
                live.seen[stored_id], answer_fingerprint(incoming), incoming, live.context_id
            )
            return live, None
        if live.state in wire.TERMINAL:
            raise wire.A2AError(
                "UnsupportedOperation",
                f"task {live.id!r} is in a terminal state ({live.state}): send a message "
                "without taskId to go on in its context",
            )
        if live.running or live.state not in wire.INTERRUPTED:
            raise wire.A2AError(
                "UnsupportedOperation",
                f"task {live.id!r} is running: it takes a message only while it waits for input",
            )
        return live, stored_id

    def _took_answers(
        self,
        live: LiveTask,
        incoming: wire.Incoming,
        stored_id: str,
        remaining: Sequence[Any] | None,
    ) -> None:
        """Note the recorded answer message on its task; with the calls still
        ``remaining`` (``None``: the answers put its turn back), the task waits for input
        again."""
        live.seen[stored_id] = answer_fingerprint(incoming)
        live.history.append(self._history_entry(incoming, live.context_id, live.id, stored_id))
        if remaining is not None:
            live.set_state(
                wire.INPUT_REQUIRED, pending_message(live.id, live.context_id, remaining)
            )

    async def _continue(self, incoming: wire.Incoming) -> LiveTask:
        """A message on a task: the answers of a task waiting for input."""
        live, stored_id = await self._task_waiting(incoming)
        if stored_id is None:
            return live
        async with live.transition:
            # checked again: a cancel (or another answer) may have gone first
            live, stored_id = await self._task_waiting(incoming)
            if stored_id is None:
                return live
            session = await self.state.session(live.context_id)
            if session.busy:
                raise _busy(live.context_id, self._running_in(live.context_id))
            recorded, remaining = await self._record(session, live, incoming)
            complete = recorded.complete
            self._took_answers(live, incoming, stored_id, None if complete else remaining)
            if complete:
                await self._start(live, session, None, decided=recorded)
        return live

    async def _record(
        self, session: Any, live: LiveTask, incoming: wire.Incoming
    ) -> tuple[Recorded, tuple[PendingCall, ...]]:
        """Record the decisions a message carries (all checked first: a bad one records
        nothing); what the last one recorded (its ``complete``: whether they completed the
        turn's) and the calls still waiting.

        Checked against the session as this process last stored it
        (:meth:`~runtime.app.session.Session.held_record`, no read), the first decision
        saved on top of that version (as the web app's answers are): when the store has
        moved past it, or the view does not show what the message answers, nothing is
        recorded and the checks run again on what the store holds."""
        tools = session.agent.tool_map
        limit = session.agent.budget.max_tool_result_chars
        known = session.held_record()
        if known is not None:
            try:
                answers, remaining = await self._checked(
                    live, incoming, known.messages, tools, limit
                )
                first = await self._decide(session, live, *answers[0], version=known.version)
            except (wire.A2AError, StoreConflict):
                pass  # the view may be behind the store: check again on what it holds
            else:
                record = partial(self._decide, session, live)
                return await record_all(answers[1:], record, first), remaining
        record = await session.host.store.load(session.id)
        stored = record.messages if record is not None else ()
        answers, remaining = await self._checked(live, incoming, stored, tools, limit)
        return await record_all(answers, partial(self._decide, session, live)), remaining

    async def _checked(
        self,
        live: LiveTask,
        incoming: wire.Incoming,
        stored: Sequence[Message],
        tools: Any,
        max_chars: int | None,
    ) -> tuple[list[tuple[str, Decision]], tuple[PendingCall, ...]]:
        """The message's decisions, each checked against ``stored``
        (:func:`checked_decisions`), and the calls they leave waiting; an
        :class:`~actors.a2a.wire.A2AError` for a task that no longer waits or a decision
        that cannot be made. ``max_chars``: the agent's ``max_tool_result_chars``, which
        ``session.decide`` bounds an edit by: checked here too, or a message whose second
        decision's edit is too long records its first."""
        pending = pending_calls(stored)
        if not pending or pending[0].message_id != live.message_id:
            raise wire.A2AError(
                "UnsupportedOperation", f"task {live.id!r} does not wait for input any more"
            )
        answers = _decisions(wire.data_parts(incoming.parts), pending)
        try:
            answers, stored = await checked_decisions(stored, answers, tools, max_chars)
        except DecisionError as exc:
            raise wire.invalid_params(str(exc)) from None
        return answers, pending_calls(stored)

    async def _decide(
        self,
        session: Any,
        live: LiveTask,
        key: str,
        decision: Decision,
        *,
        version: int | None = None,
    ) -> Recorded:
        """One decision recorded (on top of ``version`` when given: a
        :class:`~runtime.errors.StoreConflict` then records nothing)."""
        try:
            return await session.decide(
                key,
                approved=decision.approved,
                reason=decision.reason,
                error=decision.error,
                edited_input=decision.edited_input,
                expected_version=version,
                output_checked=decision.output_checked,
                input_checked=decision.input_checked,
                **({"output": decision.output} if decision.has_output else {}),
            )
        except DecisionError as exc:
            raise wire.invalid_params(str(exc)) from None
        except SessionBusy:
            raise _busy(live.context_id, self._running_in(live.context_id)) from None

    async def _start(
        self,
        live: LiveTask,
        session: Any,
        content: Any,
        *,
        stored_id: str | None = None,
        decided: Recorded | None = None,
    ) -> None:
        """Run the task's turn (``content``), or its continuation (``None``; ``decided``:
        what the decision that completed it recorded, which the continuation starts from
        while it is the session's latest), in the app's background nursery; returns once
        it runs. A turn that cannot start (the session is busy after all) raises here,
        and nothing runs."""
        self._check_capacity()
        background = self.state.background
        if background is None:
            raise wire.A2AError(
                "Internal",
                "the A2A endpoint runs tasks in the app's lifespan, which is not running",
            )
        try:
            await background.start(self._drive, live, session, content, stored_id, decided)
        except CallerWaits as exc:  # the calling session decides what this one waits for
            raise wire.A2AError("UnsupportedOperation", str(exc)) from None
        except SessionBusy:
            raise _busy(live.context_id, self._running_in(live.context_id)) from None
        except NothingToResume as exc:
            raise wire.A2AError("UnsupportedOperation", str(exc)) from None
        except HostClosed as exc:  # the turn entered as the host closed: it never ran
            raise HostClosing(exc) from None

    async def _drive(
        self,
        live: LiveTask,
        session: Any,
        content: Any,
        stored_id: str | None,
        decided: Recorded | None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        turn = (
            session.resume(decided=decided)
            if content is None
            else session.stream(  # a task is one turn: never queued behind or steered into
                content, message_id=live.message_id, user_message_id=stored_id, on_busy=REJECT
            )
        )
        started = False
        try:
            async with turn as out:
                live.out, live.running, started = out, True, True
                live.set_state(wire.WORKING)
                task_status.started()
                async for chunk in out:
                    live.take(chunk)
                with trio.move_on_after(FINAL_WAIT):
                    await out.done.wait()
            self._finish(live, out.result)
            await forget_unsaved(session, out.result)
        except Exception as exc:
            if not started:
                raise
            live.running = False
            live.set_state(
                wire.FAILED,
                _agent_note(live.id, live.context_id, f"internal error: {type(exc).__name__}"),
            )
        finally:
            if live.running:  # cancelled from outside (the app shutting down)
                live.running = False
                live.set_state(
                    wire.CANCELED, _agent_note(live.id, live.context_id, "server shutdown")
                )
            live.out = None

    def _finish(self, live: LiveTask, result: Any) -> None:
        live.running = False
        live.close_answer()
        ids = (live.id, live.context_id)
        if result is None:
            live.set_state(wire.FAILED, _agent_note(*ids, "the turn ended without a result"))
        elif unsaved(result):  # whatever it answered: the context does not hold it
            live.set_state(wire.FAILED, _agent_note(*ids, unsaved_error(result).message))
        elif result.finish_reason == "awaiting-input":
            live.set_state(wire.INPUT_REQUIRED, pending_message(*ids, result.pending))
        elif result.finish_reason == "error":
            why = result.error.message if result.error is not None else "the turn failed"
            live.set_state(wire.FAILED, _agent_note(*ids, why))
        elif result.finish_reason == "aborted":
            live.set_state(wire.CANCELED, _agent_note(*ids, result.abort_reason or "canceled"))
        else:
            live.set_state(wire.COMPLETED)

    # -- canceling ----------------------------------------------------------------------

    async def cancel(self, task_id: str) -> LiveTask:
        """Cancel a task: stop its running turn, or deny what it waits for. A canceled
        task again gives the task as it is (idempotent); a completed or failed one
        ``TaskNotCancelable``."""
        live = await self.find(task_id)
        async with live.transition:  # after an answer that resumes it: its continuation
            return await self._cancel(live, task_id)

    async def _cancel(self, live: LiveTask, task_id: str) -> LiveTask:
        if not live.running and await self._cancel_elsewhere(live.context_id, live.message_id):
            self.live.pop(task_id, None)
            return await self.find(task_id)
        if live.state == wire.CANCELED and not live.running:
            return live
        if live.state in wire.TERMINAL:
            raise wire.A2AError(
                "TaskNotCancelable", f"task {task_id!r} is {live.state}: it cannot be canceled"
            )
        if live.running and live.out is not None:
            live.out.cancel(CANCELED_REASON)
            with trio.move_on_after(FINAL_WAIT * 2):
                await live.wait_settled()
            return live
        session = await self.state.session(live.context_id)
        if session.busy:  # a turn this book does not run (the chat page's): stop it
            current = session.current
            if current is not None:
                current.cancel(CANCELED_REASON)
                with trio.move_on_after(FINAL_WAIT * 2):
                    await current.done.wait()
            self.live.pop(task_id, None)
            return await self.find(task_id)
        record = await session.host.store.load(session.id)
        pending = pending_calls(record.messages) if record is not None else ()
        if any(call.message_id == live.message_id for call in pending):
            # Denied and answered, the turn ended: only denied, it stayed decided and
            # never resumed, and a resume() of the session ran the model on after the
            # client had canceled it. A call decided meanwhile keeps its decision.
            await session.end_wait(CANCELED_REASON)
        live.set_state(wire.CANCELED, _agent_note(live.id, live.context_id, CANCELED_REASON))
        return live

    async def _cancel_elsewhere(self, context_id: str, message_id: str) -> bool:
        """Cancel the task's turn if another embedded host runs it (``serve --redis``:
        the relay streams the session's turn, whose ``start`` names the task's message,
        and this host runs none) over the relay's cancel channel, and wait (at most
        ``2 * FINAL_WAIT``) until the relay says it ended; whether there was one. Before,
        this host read the task back from the store (its first steps saved), found no
        turn of its own and answered it completed (``TaskNotCancelable``) or canceled,
        while the other host ran it on. A relay that does not answer: ``False``."""
        relay = self.state.relay
        if relay is None or not hasattr(relay, "request_cancel"):
            return False
        session = self.state.host.sessions.get(context_id)
        if session is not None and session.busy:
            return False  # this host runs the session's turn
        try:
            turn_id = await relay.active_turn(context_id)
            if turn_id is None or not await _streams_message(relay, turn_id, message_id):
                return False
            await relay.request_cancel(turn_id, CANCELED_REASON)
            with trio.move_on_after(FINAL_WAIT * 2):
                while await relay.active_turn(context_id) == turn_id:  # noqa: ASYNC110
                    await trio.sleep(0.05)  # (the relay's end is in Redis: no event here)
        except RelayUnavailable:
            return False
        return True

    def cancel_all(self, reason: str) -> int:
        """Cancel every running task (a server shutting down); how many ran."""
        running = [t for t in self.live.values() if t.running and t.out is not None]
        for t in running:
            t.out.cancel(reason)
        return len(running)


def _decisions(values: Sequence[Any], pending: Sequence[PendingCall]) -> list[tuple[str, Decision]]:
    """The decisions in a message's ``data`` parts: ``{"decisions": [{"id", "approved",
    "reason", "editedInput"} | {"id", "output"} | {"id", "error"}, ...]}`` (or one such
    decision alone; ``id`` may be left out when one call waits). ``editedInput``: approve
    with that input instead of the model's (``approved: true`` only, checked against
    the tool's schema by the decision, docs/approval.md)."""
    found: list[Any] = []
    for value in values:
        if isinstance(value, dict) and isinstance(value.get("decisions"), list):
            found.extend(value["decisions"])
        elif isinstance(value, dict) and ({"approved", "output", "error"} & value.keys()):
            found.append(value)
    if not found:
        raise wire.invalid_params(
            "the task waits for input: answer with a data part "
            '{"decisions": [{"id": ID, "approved": true}]} (an approval) or '
            '{"decisions": [{"id": ID, "output": ...}]} (a client-side tool); the ids are '
            "in the task's status message"
        )
    out: list[tuple[str, Decision]] = []
    for i, d in enumerate(found):
        if not isinstance(d, dict):
            raise wire.invalid_params(f"decisions[{i}] must be an object")
        key = d.get("id")
        if key is None and len(pending) == 1:
            key = pending[0].approval_id
        if not isinstance(key, str):
            raise wire.invalid_params(f"decisions[{i}].id must be the id of a waiting call")
        approved, reason, error = d.get("approved"), d.get("reason"), d.get("error")
        if approved is not None and not isinstance(approved, bool):
            raise wire.invalid_params(f"decisions[{i}].approved must be true or false")
        if not isinstance(reason, str | None) or not isinstance(error, str | None):
            raise wire.invalid_params(f"decisions[{i}].reason and .error must be strings")
        edited = d.get("editedInput")
        if "editedInput" in d and not isinstance(edited, dict):
            raise wire.invalid_params(f"decisions[{i}].editedInput must be an object")
        out.append(
            (
                key,
                Decision(
                    approved=approved,
                    reason=reason,
                    output=d.get("output"),
                    error=error,
                    has_output="output" in d,
                    edited_input=edited,
                ),
            )
        )
    return out


__all__ = [
    "CANCELED_REASON",
    "LiveTask",
    "TaskBook",
    "check_resend",
    "checked_decisions",
    "derive",
    "fingerprint",
    "split_task_id",
    "task_id_of",
]
