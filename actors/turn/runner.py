"""The turn runner: drives one user input through as many model calls as it takes.

One per session, and the one owner of its history (:class:`~runtime.actor_messages.SessionState`):
after every change it publishes an immutable :class:`~runtime.actor_messages.SessionSnapshot`
(:attr:`TurnRunner.snapshot`), which is all the application side reads. For each
:class:`~runtime.actor_messages.RunTurn` it creates ONE empty
assistant message, then loops: budget check, model call (through the provider and the
engine), append parts, run tools, repeat, until a step finishes without tool calls.
Every raw item goes on to the stream controller as it arrives; the history is saved at
every step boundary and at the end of the turn, including a turn that was cut short. The
turn's result goes, as a :class:`~runtime.actor_messages.TurnDone`, to the consumer's inbox
after its last chunk.

What it delegates: where parts open and close to the :class:`~actors.turn.parts.PartsManager`
(one decision for the stream and the stored message), budget checks to
:class:`~runtime.budget.Budget`, retry delays to :class:`~runtime.retry.RetryPolicy`,
and whether a call may run to :func:`~actors.turn.tool_calls.refuse_call`.

The class is made of parts, one module each, mixed in: saving and adopting the store's
answers (:mod:`actors.turn.saving`), a step's model call (:mod:`actors.turn.inference`),
its tool calls (:mod:`actors.turn.tool_calls`), suspending for a person's input
(:mod:`actors.turn.suspension`); what a turn accumulates is
:class:`~actors.turn.turn_state.Turn`. This module keeps the turn itself: its start, its
step loop and its end.

Rules from peers' bugs, enforced here:

* tools run only when the step ended with ``stop`` or ``tool-calls``; calls cut by
  ``length`` or a filter, or whose input is unusable, get an error result instead (the
  provider's own words for what is wrong with the input, when it gave them);
* a step is final only when it finished with no tool calls;
* tool results stream in completion order but are saved in call order;
* a model call is retried only while its step has produced no output;
* a cancelled turn keeps what the user saw (marked interrupted; a turn an error ended is
  marked failed instead, with its error), unfinished reasoning stays unsigned, and every
  started call gets an ``interrupted`` result.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from actors.turn import saving
from actors.turn.inference import Inferring, cut_by_budget
from actors.turn.parts import PartsManager
from actors.turn.saving import NO_TITLE as _NO_TITLE
from actors.turn.saving import NO_TURN as _NO_TURN
from actors.turn.saving import SAVE_TIMEOUT as SAVE_TIMEOUT
from actors.turn.saving import Saving
from actors.turn.structured import StructuredTurn, output_value
from actors.turn.suspension import Suspending, edit_ran
from actors.turn.takeover import (
    Committed,
    find_committed,
    paused_mark,
    steered_message_id,
)
from actors.turn.tool_calls import RUNNABLE_FINISH as RUNNABLE_FINISH
from actors.turn.tool_calls import ToolCalling
from actors.turn.tool_calls import refuse_call as refuse_call
from actors.turn.turn_state import Step, Turn, error_info
from runtime import events as ev
from runtime.actor import Actor
from runtime.actor_messages import (
    Batcher,
    History,
    RunTurn,
    SaveRequest,
    SaveResult,
    SessionSnapshot,
    SessionState,
    SteeredNotice,
    StepBegin,
    StepEnd,
    ToolDone,
    ToolOutcome,
    ToolProgress,
    TurnBegin,
    TurnDone,
    TurnEnd,
    TurnResult,
)
from runtime.agent import Agent
from runtime.approval import (
    AWAITING_INPUT,
    SUPERSEDED,
    SUSPENDED_TRACE_META,
    WAITING_META,
    approval_decided,
    approved_waiting,
    pending_calls,
    supersede,
    waiting_calls,
)
from runtime.chunks import Usage
from runtime.errors import (
    SESSION_DELETED,
    ActorFailed,
    AnsweredElsewhere,
    AxonError,
    BudgetExceeded,
    OutputValidationError,
    SessionDeleted,
    describe_exception,
)
from runtime.history import INTERRUPTED, MessageIds, RepairedHistory
from runtime.hosting import ToolSource, TurnHost
from runtime.ids import new_id
from runtime.inbox import Inbox
from runtime.liveness import PAUSED_META
from runtime.logging import get_logger, log_exception
from runtime.messages import AssistantMessage, Message, ToolCallPart, ToolMessage, UserMessage
from runtime.output import ErrorInfo
from runtime.redact import redact
from runtime.store import SessionRecord

_NOT_EDITED: tuple[bool | None, bool] = (None, False)
"""What a result not of an edited call records of whether it ran: nothing."""


def _suspended_trace(
    meta: Mapping[str, Any], turn_id: str, committed: Any
) -> ev.TraceContext | None:
    """The trace context this turn's suspension stored, when the turn is its
    continuation (a takeover of a turn that never waited finds another turn's, or none)."""
    stored = meta.get(SUSPENDED_TRACE_META)
    if committed is None or not isinstance(stored, dict) or stored.get("turn_id") != turn_id:
        return None
    return ev.TraceContext(
        trace_id=str(stored.get("trace_id", "")), span_id=str(stored.get("span_id", ""))
    )


def _cut_last_turn(state: SessionState, in_flight: bool) -> None:
    """Cut the history back to before its last user message (a regenerate): the turn
    that follows saves from the cut on, replacing the old turn in the store as well
    (the ids of the stored messages cut kept in :attr:`SessionState.cut` until a save
    removed them there: one rebased on another writer's replaces them too). With a
    save ``in_flight`` (the previous turn's, outliving it: a slow store), what it
    writes may be stored too: its messages, all after ``saved_upto``, are cut as well
    (left out, its old turn stayed stored before the new one, branch attackmarkers)."""
    messages = state.messages
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], UserMessage):
            upto = len(messages) if in_flight else state.saved_upto
            if i < upto:
                state.cut = state.cut | {m.id for m in messages[i:upto]}
            del messages[i:]
            state.saved_upto = min(state.saved_upto, i)
            return


def _user_id(run: RunTurn, state: SessionState, ids: MessageIds) -> str:
    """The id a new turn's user message is stored under: the caller's (a client's id of
    the message), unless the session holds a message of that id already (a resend that
    no resend rule caught: the history came from another writer), whose second copy
    would make the id name two messages; then, as without one, a new id. Asked of the
    runner's kept ids (:class:`~runtime.history.MessageIds`): a pass over the history
    here made every turn's cost grow with its session."""
    wanted = run.user_message_id
    if wanted is None or ids.holds(state.messages, wanted):
        return new_id("msg")
    return wanted


def _nested_in(message: Any, ids: set[str]) -> tuple[ToolCallPart, ...]:
    """The calls of ``message`` named in ``ids`` whose sub-agent's turn waits for them
    (``Awaiting.nested``)."""
    return tuple(
        p
        for p in getattr(message, "content", ())
        if isinstance(p, ToolCallPart)
        and p.tool_call_id in ids
        and p.awaiting is not None
        and p.awaiting.nested
    )


def _as_committed(stored: Message, committed: Committed, messages: list[Message]) -> bool:
    """Whether ``stored`` (the assistant message of a turn taken up again) and the
    messages after it are exactly what :meth:`TurnRunner._continue` would rebuild from
    ``committed``: the same part, usage and tool message objects, not interrupted, no
    error."""
    at = committed.assistant_index
    tools = committed.tool_messages
    return (
        type(stored) is AssistantMessage
        and stored.content is committed.parts
        and stored.id == committed.message_id
        and not stored.interrupted
        and stored.error is None
        and stored.usage is committed.usage
        and len(messages) - at - 1 == len(tools)
        and all(map(operator.is_, messages[at + 1 :], tools))
    )


def _stored_as_held(turn: Turn, state: SessionState, item: Any) -> None:
    """Acknowledge a steered ``item`` whose id the history holds already when a save
    holds that message: now if the store has it, else with the save that writes it."""
    for message in state.messages[state.saved_upto :]:
        if message.id == item.user_message_id:
            turn.unsaved_steers.append((item, message))
            return
    item.stored.set()


class TurnRunner(Suspending, Saving, Inferring, ToolCalling, Actor):
    """Per-session actor running turns, one at a time. How a turn suspends for input and
    resumes comes from :class:`~actors.turn.suspension.Suspending`; saving, from
    :class:`~actors.turn.saving.Saving`; a step's model call, from
    :class:`~actors.turn.inference.Inferring`; its tool calls, from
    :class:`~actors.turn.tool_calls.ToolCalling`."""

    inbox_capacity = 16
    handling_waits = True  # a turn waits for its model call (runtime.actor.Actor)
    _deleted_since = False
    """The reload before the turn about to open found the session deleted since the
    version the history held (``Saving._sync``), and this runner opened no turn before
    (:attr:`_held_title`): the meta its run carries is the deleted conversation's.
    (Class defaults, set on the instance only then: a runner whose session was never
    deleted under it carries nothing more.)"""
    _absent_mark: int | None = None
    """The session's deletion mark as the turn about to open read it, the session not
    stored (``Saving._absent``), for its saves (:attr:`SaveRequest.absent_mark`). (A
    class default, as the one above.)"""
    _kept_ids: MessageIds | None = None
    """The ids the history holds (:attr:`_ids`), made at their first use, and a class
    default until then: an idle session's runner keeps none of their three objects, nor
    one more instance attribute (set in ``__init__``, it was the 30th of a runner's, past
    what CPython 3.11's instances share: every idle runner then kept a dict of its own,
    1.6 KB a session, benchmarks 24.5)."""
    _stale_title: Any = _NO_TITLE
    """The deleted conversation's title, which the session's host still holds and sends
    with each turn: not saved into the new conversation (:meth:`_turn_meta`)."""
    _held_title: Any = _NO_TURN
    """The title the last turn opened here carried (its host's for the conversation):
    the stale one when the next turn's reload finds the session deleted since."""

    def __init__(
        self,
        *,
        state: SessionState,
        agent: Agent,
        provider: Actor,
        engine: Actor,
        controller: Actor,
        tool_executor: Actor,
        persister: Actor,
        stream_inbox: Inbox,
        host: TurnHost,
        tool_source: ToolSource,
        fallbacks: Sequence[Actor] = (),
        repaired: RepairedHistory | None = None,
    ) -> None:
        super().__init__(name="turn-runner", session_id=state.session_id)
        self.state = state
        """The session's history: this runner's alone (others read :attr:`snapshot`)."""
        if type(state.messages) is not History:
            state.messages = History(state.messages)
        self.snapshot: SessionSnapshot = state.snapshot()
        """The history as of its last change: an immutable value, replaced on change."""
        self._shown: tuple[Any, int | None] = (state.messages, state.messages.edits)
        """The history list :attr:`snapshot` was taken from, and its edits then."""
        self.agent = agent
        self.provider = provider
        self.fallbacks: tuple[Actor, ...] = tuple(fallbacks)
        """The providers a turn goes on with, in order, when a call to the one before
        fails (:class:`~runtime.provider.FallbackProvider`)."""
        self.engine = engine
        self.controller = controller
        self.tool_executor = tool_executor
        self.persister = persister
        self.stream_inbox = stream_inbox
        """Where the engine sends this session's chunk batches."""
        self.tool_inbox: Inbox[ToolOutcome | ToolProgress] = Inbox(
            1024, "block", name="tool-results"
        )
        self.host = host
        """What the runner asks of its host (:class:`~runtime.hosting.TurnHost`)."""
        self.tool_source = tool_source
        """The tools of the agent's next model call (its own and its MCP servers')."""
        self.save_replies: Inbox[SaveResult] = Inbox(8, "drop-oldest", name="save-replies")
        """The persister's answers; only the latest request's matters, so a backlog of
        older ones is dropped rather than ever holding the persister up."""
        self._pending: SaveRequest | None = None
        """The session's latest save, until its outcome is adopted into the state."""
        self._answered: SaveResult | None = None
        """The answer to ``_pending``, once it came in."""
        if repaired is None:
            repaired = RepairedHistory()
            repaired(state.messages)  # a resumed history: repaired with its loading
            repaired.rest()
        self._repaired = repaired
        """Repairs the history once per message, for the requests of every step (given
        primed with ``state.messages`` when the host repaired a long one off the loop:
        :func:`runtime.history.repaired_off_loop`)."""

    @property
    def _ids(self) -> MessageIds:
        """The ids the history holds: whether a client's id of a message is stored
        (a new turn's user message, a steered one) without a pass over the session."""
        ids = self._kept_ids
        if ids is None:
            ids = self._kept_ids = MessageIds()
        return ids

    def holds_message(self, message_id: str) -> bool:
        """Whether the history holds a message of id ``message_id`` (the kept ids: after
        :meth:`read_ids`, a look-up and the messages added since)."""
        return self._ids.holds(self.state.messages, message_id)

    async def read_ids(self) -> None:
        """Catch the kept ids up with the history in bounded loop steps
        (:meth:`MessageIds.caught_up`): the first read of a long session's, at its first
        turn with a client's id, was one pass on the loop (a 600,000-message session
        stalled every session of the process)."""
        await self._ids.caught_up(lambda: self.state.messages)

    @property
    def _log(self) -> Any:
        """The runner's logger, asked for when a line is written (a failure, a warning),
        not as the runner is made: a fresh session makes one per open, and a turn that
        goes well writes no line of its own (``get_logger`` compares the structlog
        configuration on every call; issue 24 goal 1)."""
        return get_logger("axon.turn")

    async def handle(self, message: Any) -> None:
        if isinstance(message, RunTurn):
            await self.run_turn(message)
            self.turn_ended = True  # it may rest now (Actor.rests_after_turn)

    def on_give_up(self, exc: BaseException) -> None:
        """A turn already sent (its stream opened while the crash was being handled)
        will never run: its stream ends, without a result, rather than waiting for ever.
        The turn the crash cut was ended by :meth:`_end_crashed`; the session's next
        turn gets a fresh runner (:meth:`~runtime.app.host.Host._renew_given_up`)."""
        queued: list[Any] = []
        self.inbox.drain_nowait(queued)
        for message in queued:
            if isinstance(message, RunTurn):
                message.consumer.close()

    def on_rest(self) -> None:
        """The session is idle: the inboxes only a turn uses let go of their channels."""
        for inbox in (self.stream_inbox, self.tool_inbox, self.save_replies):
            inbox.park()

    def _publish_history(self) -> None:
        """Replace :attr:`snapshot` with the history as it is now; kept when the history
        is what it shows already (the same messages, saved as far, at one version).

        A history not edited since the snapshot (:class:`~runtime.actor_messages.History`
        counts its edits) is not copied: the snapshot's messages are kept, with the new
        version if it moved (a save's answer). An edited one is copied once, compared
        only when the lengths match (by value, then by identity: a message replaced by
        an equal one of other types, ``1`` made ``True``, is a change), and that copy is
        the new snapshot's. (Copies to compare and to publish were passes over the whole
        session at every step.)

        A list that keeps no count (a plug-in's ``state.messages = [...]``) is made a
        History here, once (a copy): uncounted, it cost a pass over the session at
        every publication and every model call. From then on the runner's history is
        that History: the plug-in's own list is no longer it (edit ``state.messages``)."""
        state, shown = self.state, self.snapshot
        messages = state.messages
        unchanged = state.saved_upto == shown.saved_upto and state.version == shown.version
        edits = getattr(messages, "edits", None)
        if edits is None:
            messages = state.messages = History(messages)
            edits = messages.edits
        if (
            edits is not None
            and self._shown[0] is messages
            and self._shown[1] == edits
            # list's own methods called on the History (list.append(h, m), heapq) edit
            # it without counting: its length and last message are checked too (O(1)).
            and len(messages) == len(shown.messages)
            and (not messages or messages[-1] is shown.messages[-1])
        ):
            if not unchanged:
                self.snapshot = SessionSnapshot(
                    session_id=state.session_id,
                    messages=shown.messages,
                    saved_upto=state.saved_upto,
                    version=state.version,
                )
            return
        self._shown = (messages, edits)
        if not unchanged or len(messages) != len(shown.messages):
            self.snapshot = state.snapshot()
            return
        copy = tuple(messages)
        if copy == shown.messages and all(map(operator.is_, copy, shown.messages)):
            return  # (by value, in C; then by identity, only when equal: an equal
            # message may hold values of other types, ``1`` made ``True`` or ``1.0``)
        self.snapshot = SessionSnapshot(
            session_id=state.session_id,
            messages=copy,
            saved_upto=state.saved_upto,
            version=state.version,
        )

    # -- one turn -----------------------------------------------------------------------

    async def run_turn(self, run: RunTurn) -> None:
        """Run one user input to completion (or until it is cut short), then close it."""
        agent, budget = self.agent, self.agent.budget
        try:
            began = await self._sync(run.turn_id, reload=run.resume, stored=run.stored)
            if run.user_message_id is not None:  # (``_user_id`` asks them)
                await self.read_ids()
            turn, committed, superseded = self._open_turn(run, began)
            if committed is not None:
                turn.began_from = began
        except Exception:
            run.consumer.close()  # a bug before the turn began: its stream just ends
            raise
        try:
            self._publish_history()
            scope = run.cancel.scope
            turn.output = StructuredTurn.start(agent, turn.message_id)
            if budget.deadline is not None:
                scope.deadline = trio.current_time() + budget.deadline
            try:
                await turn.ctrl.send(
                    TurnBegin(
                        turn_id=turn.turn_id,
                        message_id=turn.first_message_id,  # (a takeover's is the first's)
                        consumer=run.consumer,
                    )
                )
                with scope:
                    # In the turn's scope too: an observer that asked for ``block`` and
                    # stopped reading held the turn here, past its deadline, a cancel and
                    # a closing host, and every later turn of the host with it.
                    started = await self._announce_start(run, turn, committed, superseded)
                    # A turn cancelled before it began (an ``interrupt`` that a newer message
                    # overtook) ends here: the first model call may reach the provider before
                    # any other checkpoint. A cancel already called is seen without yielding
                    # (a schedule point is a task step and a scheduler round more per turn,
                    # issue 24 goal 1); a deadline already past only by the scheduler.
                    if scope.deadline <= trio.current_time():
                        await trio.lowlevel.checkpoint()
                    else:
                        await trio.lowlevel.checkpoint_if_cancelled()
                    if agent.hooks.on_turn_start is not None:
                        # In the turn's scope, as every later hook: a hook that hangs (a
                        # lock, a slow service) is cut by the deadline, out.cancel() and
                        # a host closing; outside it, it held the turn, and the session's
                        # later turns behind it, for ever.
                        await agent.hooks.on_turn_start(started)
                    if committed is not None and self._already_finished(turn, committed):
                        turn.untouched = True
                    elif committed is not None and not await self._resolve(turn):
                        turn.untouched, turn.finish_reason = True, AWAITING_INPUT
                        await self._show_waiting(turn)
                    elif turn.held:
                        # Not dead: reached only here, after ``_resolve`` gave the waited
                        # calls their results but held one again (an agent tool whose
                        # sub-agent asks its next approval; ``turn.held`` is empty in any
                        # turn not resumed). That call has no result and the turn already
                        # ends ``awaiting-input``, its new wait saved and announced: no
                        # step may run (a model call would see the call unanswered).
                        # Pinned by tests/test_approval_nested_pass_many.py (5 fail
                        # without this branch; journal pipeline.md, ### smallleft).
                        pass
                    else:
                        await self._run_approved_before(turn)
                        if committed is None and (
                            self.host.claims_turns or await self.host.shares_store()
                        ):
                            await self._claim(turn, run.user_message_id)
                        await self._steps(turn)
                if scope.cancelled_caught:
                    if run.cancel.reason is None and budget.deadline is not None:
                        turn.finish_reason, turn.budget = "budget", "deadline"
                    else:
                        turn.finish_reason = "aborted"
                        turn.abort_reason = run.cancel.reason or "cancelled"
            except BudgetExceeded as stop:
                turn.finish_reason, turn.budget = "budget", stop.budget
            except SessionDeleted:  # its save was refused (turn.deleted): ends quietly
                turn.finish_reason, turn.abort_reason = "aborted", SESSION_DELETED
            except trio.Cancelled:
                turn.finish_reason, turn.abort_reason = "aborted", "host shutdown"
                await self._finish_turn(run, turn)
                raise
            except (KeyboardInterrupt, SystemExit) as stop:
                # Ctrl-C landing in this task (a hook's code, the runner's own), a hook's
                # sys.exit(): the turn ends as a cancelled one, saved and handed over,
                # before it goes on to close the host (Host.end_for), which raises it.
                turn.finish_reason, turn.abort_reason = "aborted", type(stop).__name__
                await self._finish_turn(run, turn)
                raise
            except Exception as exc:
                turn.error = error_info(self._given_up(exc))
                turn.finish_reason = "error"
                fields = {
                    "session_id": self.state.session_id,
                    "turn_id": turn.turn_id,
                    "error": redact(turn.error.message),
                    "error_kind": turn.error.kind,
                }
                if isinstance(exc, AxonError):  # said on purpose: the message is the story
                    self._log.error("turn.failed", **fields)
                else:  # a bug (a hook of the application's that raised): where it failed
                    log_exception(self._log, "turn.failed", **fields)
            await self._finish_turn(run, turn)
        except Exception as exc:
            # A bug past the turn's own error handling (ours, a plug-in's: its end, its
            # save, a hook of its end): the crash is logged and the runner restarted,
            # but nothing would end this turn's stream; its consumer waited for ever.
            await self._end_crashed(run, turn, exc)
            raise

    def _given_up(self, exc: Exception) -> Exception:
        """``exc`` as the turn's error: a send refused by the stream controller given up
        on (its inbox closed under the turn) says so, not ``ClosedResourceError``."""
        if isinstance(exc, trio.ClosedResourceError | trio.BrokenResourceError):
            if self.controller.ended:
                return ActorFailed(
                    "the stream controller was given up on (its crash could not be "
                    "handled): the rest of this turn's output is not streamed"
                )
        return exc

    async def _end_crashed(self, run: RunTurn, turn: Turn, exc: Exception) -> None:
        """End the stream of a turn the runner crashed in (past the turn's own error
        handling: its end, its save, a hook of its end): an ``error`` chunk and a
        result saying so, through the controller (after the chunks it holds), then the
        consumer's inbox closed. Whatever the turn added to the history stays in it,
        unsaved as far as it was not: the session's next save writes it."""
        sent = False
        try:
            if not self.controller.ended:
                if not turn.ended:
                    turn.error = ErrorInfo(
                        kind="ActorFailed",
                        message=f"the turn runner crashed: {describe_exception(exc)}",
                    )
                    turn.finish_reason = "error"
                items: list[Any] = (
                    []
                    if turn.ended
                    else [TurnEnd(finish_reason="error", usage=turn.usage, error=turn.error)]
                )
                items.append(TurnDone(result=self._result(turn, saved=False)))
                with trio.move_on_after(saving.SAVE_TIMEOUT, shield=True):
                    sent = await _send_bounded(turn.ctrl, items)
        except Exception:
            pass
        if not sent:  # no controller to hand it over: the stream just ends
            run.consumer.close()

    def _turn_meta(self, meta: Mapping[str, Any]) -> Mapping[str, Any]:
        """``meta`` (the run's: its session's as its host holds it) as the turn saves it:
        without the title of a conversation deleted since (another process deleted the
        session, its host here was not told). Saved, it named the new conversation after
        the deleted one, and, the session started again by another writer, replaced the
        title that writer gave it. A title the host sets afterwards is saved."""
        held = meta.get("title", _NO_TITLE)
        if held is not self._held_title:
            self._held_title = held
        if self._deleted_since:
            self._deleted_since = False
            self._stale_title = held
        stale = self._stale_title
        if stale is _NO_TITLE:
            return meta
        if held != stale:
            self._stale_title = _NO_TITLE  # the host's title moved on: its own from here
            return meta
        return {key: value for key, value in meta.items() if key != "title"}

    def _open_turn(
        self, run: RunTurn, began: SessionRecord | None = None
    ) -> tuple[Turn, Committed | None, tuple[Any, ...]]:
        """The turn ``run`` starts (or continues: its committed step, when a resumed turn
        finds one), its messages in the session's history, and the calls of a turn that
        waited for input which this one supersedes (denied as it begins). ``began``: the
        session as the turn's start read it, whose meta tells a paused last step
        (:data:`~runtime.liveness.PAUSED_META`, which the application's meta, the run's,
        never holds)."""
        state, agent = self.state, self.agent
        turn_id = run.turn_id
        message_id = run.message_id or new_id("msg")
        committed, mark = None, None
        if run.resume and run.message_id is not None:
            mark = paused_mark(began.meta, turn_id) if began is not None else None
            paused = mark[0] if mark is not None else None
            committed = find_committed(state.messages, message_id, paused)
        if committed is None and run.regenerate:
            _cut_last_turn(state, self._pending is not None)
        superseded: tuple[Any, ...] = ()
        approved: tuple[Any, ...] = ()
        ended_nested: tuple[Any, ...] = ()
        # The stored meta may say a turn waits (docs/approval.md): this turn clears it.
        waiting = waiting_calls(state.messages)
        was_waiting = bool(waiting) or bool(run.meta.get(WAITING_META))
        if committed is None and waiting:  # (nothing waits: nothing to deny, run or end)
            superseded = tuple([c for c in waiting if not c.decided])  # (pending_calls)
            # a turn waiting for input gives way; what a person approved runs first
            approved = approved_waiting(state.messages)
            leave = {p.tool_call_id for p in approved}
            ended = {c.tool_call_id for c in waiting} - leave
            at = supersede(state.messages, self.agent.budget.max_tool_result_chars, leave)
            if at is not None:  # sub-turns of calls the new message denies: ended too
                ended_nested = _nested_in(state.messages[at], ended)
            if at is not None:
                state.saved_upto = min(state.saved_upto, at)
        turn = Turn(
            turn_id=turn_id,
            start_index=len(state.messages),
            ctrl=Batcher(self.controller.inbox, turn_id),
            message_id=message_id,
            first_message_id=message_id,
            meta={
                "agent": agent.name,
                **self._turn_meta(run.meta),
                **({WAITING_META: 0} if was_waiting else {}),
            },
            deps=run.deps,
            steering=run.steering,
            confirm=run.cancel.confirmed if run.cancel.confirm is not None else None,
            tools=run.tools,
            instructions=run.instructions,
            approved_before=approved,
            ended_before=ended_nested,
            fence=run.fence,
        )
        if committed is None:
            state.messages.append(
                UserMessage(content=run.input, id=_user_id(run, state, self._ids))
            )
            turn.a_index = len(state.messages)
            state.messages.append(AssistantMessage(id=turn.message_id))
        else:
            self._continue(turn, committed)
            if mark is not None:  # the pauses its first worker continued count on
                turn.resumed = mark[1]
                # its mark, which this turn's saves keep and its end clears (_save_meta)
                stored = {"turn_id": turn_id, "step": mark[0], "resumed": mark[1]}
                turn.meta = {**turn.meta, PAUSED_META: stored}
        # this run's output bound (a sub-turn's: its caller's left), beyond what it wrote
        turn.limits = agent.budget.bounded(run.max_output_tokens, turn.usage)
        turn.account = run.output_account  # shared with its caller's other calls
        return turn, committed, superseded

    async def _announce_start(
        self, run: RunTurn, turn: Turn, committed: Committed | None, superseded: tuple[Any, ...]
    ) -> ev.TurnStarted:
        """Tell the bus the turn started: the superseded approvals denied, then
        ``TurnStarted``, which it returns for the agent's ``on_turn_start`` hook (awaited
        by the caller inside the turn's cancel scope)."""
        sid, agent, turn_id = self.state.session_id, self.agent, turn.turn_id
        for call in superseded:
            event = approval_decided(sid, call, approved=False, reason=SUPERSEDED)
            if event is not None:
                await self.publish(event)
        started = ev.TurnStarted(
            session_id=sid,
            turn_id=turn.turn_id,
            agent=agent.name,
            input=run.input,
            causation_id=run.meta.get("parent_tool_call_id"),
            provider=getattr(self.provider, "provider_name", None),
            model=getattr(self.provider, "model", None) or None,
            resumed=committed is not None,
            suspended_trace=_suspended_trace(run.meta, turn_id, committed),
        )
        await self.publish(started)
        return started

    def _continue(self, turn: Turn, committed: Committed) -> None:
        """Take over a turn another worker began: continue its assistant message from
        the step after its committed ones (see :mod:`actors.turn.takeover`). The history
        drops what a cut step left in it; the turn's saves, which start at its user
        message, drop it from the store too."""
        state = self.state
        turn.start_index, turn.a_index = committed.user_index, committed.assistant_index
        turn.message_id = committed.message_id  # a steered message's, after a steer
        turn.parts = PartsManager(committed.parts, committed.earlier_ids)
        turn.step = committed.next_step
        turn.tool_calls_used = committed.calls
        turn.results = {t.tool_call_id: t for t in committed.tool_messages}
        turn.usage = committed.usage  # the committed steps' calls count too
        stored = state.messages[committed.assistant_index]
        if committed.finished and stored.content == committed.parts:  # type: ignore[union-attr]
            return  # the history is left as it is
        if _as_committed(stored, committed, state.messages):
            # Nothing cut (a turn that waited, continued): the stored objects stay, so
            # its first save knows them stored as they are (``SaveRequest.held``) and
            # writes only what is new (issue 21: it rewrote the waiting message).
            return
        # (a finished turn too, once a cut step is dropped: a structured answer the
        # resumed turn rejects is asked for again, and the request must not end with
        # the cut step's partial text)
        del state.messages[committed.assistant_index :]
        state.messages.append(
            AssistantMessage(id=turn.message_id, content=committed.parts, usage=committed.usage)
        )
        state.messages.extend(committed.tool_messages)

    @staticmethod
    def _already_finished(turn: Turn, committed: Committed) -> bool:
        """Whether the committed steps of a turn taken over already answered it (the
        worker died after committing the final step, before the turn was marked done):
        then no model call runs. A structured answer is judged again first: one that
        does not validate is asked for again, as if the step had just ended. The
        answers rejected before it are judged again too, whether or not the turn is
        finished: the next request shows the model each with its error, and the retries
        they spent stay spent (:meth:`StructuredTurn.rejudge`)."""
        out = turn.output
        last = committed.next_step - 1
        if out is not None:
            out.rejudge(turn.parts.content, before=last)
        if not committed.finished:
            return False
        return out is None or not out.ask_again(turn.parts.content, last, "stop")

    async def _steps(self, turn: Turn) -> None:
        """The step loop: budget check, model call, tools, step boundary; until a step
        finishes without tool calls (or suspends, waiting for input)."""
        budget = turn.limits
        paused = False
        while True:
            budget.check_step(turn.step)
            if budget.output_left(turn.usage) == 0:  # no call may write nothing
                raise BudgetExceeded("max_output_tokens")
            # A step boundary is behind, unless the server paused the answer: a message
            # steered in there went between the paused answer and its continuation, so
            # the model started over on it, a server tool use in progress dropped.
            if turn.parts.content and not paused:
                await self._at_boundary(turn)
            step = await self._begin_step(turn)
            touch = self._touching(turn)  # (a long call: its marker refreshed)
            try:
                result = await self._infer(turn)
            finally:
                await self._touched(touch)
            turn.usage = turn.usage + result.usage
            over = budget.tokens_exceeded(turn.usage) or budget.output_spent(
                turn.usage, more=bool(result.calls), cut=cut_by_budget(result)
            )
            if result.calls:
                over = await self._take_results(turn, result, step, over)
            resume = paused = _resumes(turn, result, over)
            again = await self._end_step(turn, result, step, over, resume)
            if over:
                raise BudgetExceeded(over)
            if turn.held:  # committed with the step: the turn suspends (docs/approval.md)
                turn.finish_reason = AWAITING_INPUT
                await self._announce_waiting(turn, step)
                return
            if not result.calls:
                turn.finish_reason = result.finish
                if resume:  # paused (server tools ran long): the next call continues it
                    turn.resumed += 1
                    continue
                if isinstance(again, OutputValidationError):
                    raise again  # (its retries spent: judged before the step's save)
                if again:
                    continue  # the answer did not validate: the model sees why, answers again
                return

    async def _at_boundary(self, turn: Turn) -> None:
        """Between two steps: the messages steered into the turn join it here."""
        if turn.steering.pull is not None and self._pending is not None:
            # the step's save first: it tells a worker whether anyone steered
            # (runtime.turn_queue.SteerWatch), so it reads nothing otherwise
            await self._wait_answer(self._pending)
        await turn.steering.pull_waiting()  # another process's messages, if any
        if turn.steering.waiting:
            await self._steer(turn)

    async def _begin_step(self, turn: Turn) -> int:
        """Open the turn's next step (the controller, the bus, the hook); its number."""
        step = turn.parts.step = turn.step
        await turn.ctrl.send(StepBegin(step=step))
        turn.step_open = True
        await self._announce(
            ev.StepStarted(session_id=self.state.session_id, turn_id=turn.turn_id, step=step),
            self.agent.hooks.on_step_start,
        )
        return step

    async def _take_results(
        self, turn: Turn, result: Step, step: int, over: str | None
    ) -> str | None:
        """Run the step's calls (refused when a budget is ``over``) and add their results,
        in call order; the budget exceeded now, if any (sub-agents' tokens count)."""
        touch = self._touching(turn)  # (long tools: the turn's marker refreshed)
        try:
            over = await self._run_tools(turn, result, refuse=over) or over
        finally:
            await self._touched(touch)
        for call in result.calls:  # call order, not completion order
            if call.tool_call_id in turn.held:
                waited = turn.outcomes.get(call.tool_call_id)
                if waited is not None and waited.usage is not None:  # its sub-turn's, so far
                    turn.usage = turn.usage + waited.usage
                continue  # it waits: no result until it is decided
            oc = turn.outcomes[call.tool_call_id]
            if oc.usage is not None:  # an agent used as a tool spent tokens
                turn.usage = turn.usage + oc.usage
            self._add_result(turn, oc, step)
        budget = turn.limits
        over = over or budget.tokens_exceeded(turn.usage)
        over = over or budget.output_spent(turn.usage, more=True, cut=False)
        await self._hold(turn, step)
        return over

    async def _end_step(
        self, turn: Turn, result: Step, step: int, over: str | None, resume: bool = False
    ) -> bool | OutputValidationError:
        """Close the step (the controller, the bus, the hooks) and commit it. A step
        giving a structured answer (no calls, no budget hit, nothing held) has it judged
        before its save: ``True`` when the model is asked again, the error when the
        retries are spent (raised by the step loop after the save), else ``False``."""
        state, hooks, sid = self.state, self.agent.hooks, self.state.session_id
        self._snapshot(turn)
        self._publish_history()
        await turn.ctrl.send(StepEnd(step=step, finish_reason=result.finish, usage=result.usage))
        turn.step_open = False
        turn.step += 1  # counted once its step-finish is out, whatever a hook does next
        await self._announce(
            ev.StepFinished(
                session_id=sid,
                turn_id=turn.turn_id,
                step=step,
                finish_reason=result.finish,
                usage=result.usage,
            ),
            hooks.on_step_finish,
        )
        await self._announce(
            ev.MessageAdded(
                session_id=sid,
                turn_id=turn.turn_id,
                index=turn.a_index,
                message=state.messages[turn.a_index],
            ),
            hooks.on_message_added,
        )
        if turn.held and not over:  # what the sessions list reads (docs/approval.md)
            turn.meta = {**turn.meta, WAITING_META: len(turn.held), **self._trace_meta(turn)}
        again: bool | OutputValidationError = False
        if turn.output is not None and not (result.calls or over or turn.held or resume):
            try:
                again = turn.output.ask_again(turn.parts.content, step, result.finish)
            except OutputValidationError as exc:
                again = exc
        # Stored as running (runtime.liveness) only when the turn goes on after the step:
        # its calls, or its structured answer rejected (asked again: a kill during the
        # retry leaves the turn marked). A step that ends the turn saves what its final
        # save would (that one then costs no write).
        goes_on = (bool(result.calls) and not over) or again is True or resume
        if resume:  # a takeover continues it too (actors.turn.takeover), counting on
            mark = {"turn_id": turn.turn_id, "step": step, "resumed": turn.resumed + 1}
            turn.meta = {**turn.meta, PAUSED_META: mark}  # (cleared by _save_meta)
        ends = None if resume else _ends(turn, result, over)
        await self._save(turn, step, ends=ends, running=goes_on)
        return again

    def _trace_meta(self, turn: Turn) -> dict[str, Any]:
        """What the suspending save stores of the turn's trace context (a tracing
        plug-in's, :attr:`runtime.bus.Bus.trace_contexts`): its continuation links to it."""
        context = None if self.bus is None else self.bus.trace_contexts.get(turn.turn_id)
        if context is None:
            return {}
        return {SUSPENDED_TRACE_META: {**context, "turn_id": turn.turn_id}}

    async def _steer(self, turn: Turn) -> None:
        """Insert the user messages handed to the running turn (the ``steer`` busy
        strategy) where the model sees them: after the last step's tool results, before
        the next model call. Each user input keeps its own assistant message, so the
        steps from here on go to a new one (same turn, steps numbered on); the stored
        history shows the messages where the model saw them.

        A message whose id the session holds already is taken as it is, not stored
        again: a client's retry that a worker's turn queue holds twice (its first copy
        steered in, or stored by an earlier turn, before the retry's row was taken) was
        stored twice under one id, and the model read it twice."""
        if turn.steering.waiting:  # (each is asked of the kept ids: read them first)
            await self.read_ids()
        state = self.state
        answer_id = steered_message_id(turn.first_message_id, turn.step)
        steered = False
        for item in turn.steering.take(turn.step):
            if self._ids.holds(state.messages, item.user_message_id):
                _stored_as_held(turn, state, item)
                answered = self._answered_before(turn, item.user_message_id)
                if answered is not None:  # (its client is told: it follows none of this turn)
                    item.answered = True
                    await turn.ctrl.send(answered)
                continue
            steered = True
            message = UserMessage(content=item.content, id=item.user_message_id)
            state.messages.append(message)
            turn.unsaved_steers.append((item, message))
            await turn.ctrl.send(
                SteeredNotice(
                    step=turn.step, message_id=message.id, text=message.text, answer_id=answer_id
                )
            )
            await self.publish(
                ev.TurnSteered(
                    session_id=state.session_id,
                    turn_id=turn.turn_id,
                    step=turn.step,
                    message_id=item.user_message_id,
                    input=item.content,
                )
            )
        if not steered:
            return
        turn.message_id = answer_id
        turn.a_index = len(state.messages)
        state.messages.append(AssistantMessage(id=turn.message_id))
        turn.parts = PartsManager(earlier=turn.parts.call_ids)  # ids stay unique in the turn
        if turn.output is not None:
            turn.output.message_id = turn.message_id
        self._publish_history()

    def _answered_before(self, turn: Turn, message_id: str) -> SteeredNotice | None:
        """The notice of a steered message whose id an earlier turn stored (a client's
        retry of it): ``answered``, naming the answer stored after it ("" if none).
        ``None`` when the copy held is this turn's (its ``steered`` chunk was sent).
        Without it, a client that follows its steer saw nothing until the turn's end."""
        messages = self.state.messages
        at = self._ids.first(messages, message_id)
        if at < 0 or at >= turn.start_index:
            return None
        held = messages[at]
        answer_id = ""
        for i in range(at + 1, turn.start_index):  # (to its turn's answer: no slice copied)
            message = messages[i]
            if isinstance(message, AssistantMessage):
                answer_id = message.id
                break
            if isinstance(message, UserMessage):
                break
        return SteeredNotice(
            step=turn.step,
            message_id=message_id,
            text=held.text if isinstance(held, UserMessage) else "",
            answer_id=answer_id,
            answered=True,
        )

    def _add_result(
        self, turn: Turn, oc: ToolOutcome, step: int, ran: tuple[bool | None, bool] = _NOT_EDITED
    ) -> None:
        """``oc`` stored as the call's result; ``ran``: what an edited call's result
        records of whether its tool ran (:func:`~actors.turn.suspension.edit_ran`)."""
        msg = ToolMessage(
            tool_call_id=oc.tool_call_id,
            tool_name=oc.tool_name,
            step=step,
            output=oc.output,
            error=oc.error,
            ran=ran[0],
            ran_unknown=ran[1],
        )
        turn.results[oc.tool_call_id] = msg
        self.state.messages.append(msg)

    def _snapshot(
        self, turn: Turn, interrupted: bool = False, error: ErrorInfo | None = None
    ) -> None:
        """Refresh the turn's assistant message in the history (a new frozen value), or
        keep the one in place when it is that message already: its very parts, id, flags,
        error and usage (the turn's end refreshed the message its last step had just
        made, and the final save then compared the two part by part; issue 24 goal 1)."""
        messages = self.state.messages
        content = tuple(turn.parts.content)
        current = messages[turn.a_index]
        if (
            type(current) is AssistantMessage
            and current.content == content  # (the same part objects: by identity, in C)
            and current.id == turn.message_id
            and current.interrupted is interrupted
            and current.error is error
            and current.usage is turn.usage
        ):
            return
        messages[turn.a_index] = AssistantMessage(
            id=turn.message_id,
            content=content,
            interrupted=interrupted,
            error=error,
            usage=turn.usage,
        )

    async def _finish_turn(self, run: RunTurn, turn: Turn) -> None:
        """Close the turn whatever happened: seal parts, pair every call with a result
        (a call that completed keeps its result), save (shielded, bounded), then tell the
        controller and hand the result over (even if saving or telling failed).

        Shielded where it waits, not as a whole: every wait from here on is in a bound
        that is shielded as well (the save's, :func:`_send_bounded`'s, the
        announcement's, the hand-over's), and nothing else yields (the sends that need
        no wait are made without a bound, see :meth:`_announce_end`). So a turn
        cancelled from outside (a host shutting down) still saves and hands its result
        over, and a turn that ends well enters one cancel scope here, its save's, not
        two (issue 24 goal 1)."""
        turn.steering.close()  # no step follows: a message still waiting starts a turn
        self._repaired.rest()  # (the repair of its tail: the next turn's starts anew)
        closing: list[Any] = []
        self._seal(turn, closing)
        saved = turn.untouched  # (an untouched turn has nothing to save)
        try:
            saved = await self._save_last(turn)
            await self._announce_end(turn, closing, saved)
        finally:
            dropped = turn.refused and (turn.elsewhere or self.host.forgets_unsaved)
            for item, _ in turn.unsaved_steers:  # the turn is over: what it saved, it saved
                item.dropped = dropped
                item.stored.set()
            turn.unsaved_steers.clear()
            result = self._result(turn, saved)
            try:
                if dropped:  # (see _discard_unsaved; a library host's too when
                    # its message was answered elsewhere: no later save may store it)
                    # Before the hand-over, which lets a turn queued behind this one
                    # start: it must start from what the store holds, not carry this on.
                    await self._discard_unsaved(turn)
            finally:
                await self._hand_over(run, turn, TurnDone(result=result))
        if turn.deleted:
            self._forget_deleted(turn.meta)

    def _seal(self, turn: Turn, closing: list[Any]) -> None:
        """Close what the turn left open, into ``closing`` (what the controller gets
        next): its parts cut short, its calls without a result, its step; and take the
        history's snapshot of how it ended."""
        turn.parts.close(closing)  # a part cut short ends here, in both outputs
        # Failed (an error ended it) and interrupted (cut from outside) are stored apart.
        cut = turn.abort_reason is not None or turn.budget == "deadline"
        cut = cut and turn.error is None
        if turn.finish_reason != AWAITING_INPUT and turn.meta.get(WAITING_META):
            turn.meta = {**turn.meta, WAITING_META: 0}  # cut after it was marked waiting
        if turn.approved_before:
            # Cut before it ran what a person approved in the turn it superseded (in
            # its start's announcement, its hook): stored interrupted, as a call cut
            # while it ran is; else they stayed approved, with no result, for ever.
            parts, turn.approved_before = turn.approved_before, ()
            self._place_approved_before(turn, parts, {})
        if not turn.untouched:
            self._pair_calls(turn, closing)
            self._snapshot(turn, interrupted=cut, error=turn.error)
            self._publish_history()
        if turn.step_open and turn.error is None and turn.abort_reason is None:
            # A budget (the deadline, a hook's) cut the step: close it for the grammar.
            closing.append(StepEnd(step=turn.step, finish_reason="other", usage=Usage()))
            turn.step += 1

    async def _save_last(self, turn: Turn) -> bool:
        """The turn's last save (bounded); whether everything of it is stored. A save
        that failed becomes the turn's error when it had none."""
        if turn.untouched:
            return True
        if turn.refused:  # its message answered elsewhere before it ran (_claim)
            return False
        final = await self._bounded_save(turn)
        if turn.deleted:  # refused, its session deleted: nothing written, no error
            turn.finish_reason, turn.abort_reason = "aborted", SESSION_DELETED
            return False
        if final is not None and final.error is not None:
            turn.refused = True
            turn.elsewhere = isinstance(final.error, AnsweredElsewhere)
            if turn.elsewhere:  # (another process wrote the session: the loser writes
                self.host.saw_other_writer()  # nothing, so no reload would ever say so)
            if turn.error is None:
                turn.error = error_info(final.error)
        return final is not None and final.error is None

    async def _announce_end(self, turn: Turn, closing: list[Any], saved: bool) -> None:
        """Send the controller what ``closing`` holds and the turn's end, then tell the
        bus and the agent's hook (bounded: a stuck subscriber does not hold the turn; the
        bound is entered only when the event cannot be delivered at once, or a hook runs,
        as :func:`_send_bounded` does)."""
        closing.append(
            TurnEnd(
                finish_reason=turn.finish_reason,
                usage=turn.usage,
                error=turn.error,
                abort_reason=turn.abort_reason,
                budget=turn.budget,
            )
        )
        if not self.controller.ended:  # (given up on: the result goes straight over)
            await _send_bounded(turn.ctrl, closing)
        turn.ended = True
        finished = ev.TurnFinished(
            session_id=self.state.session_id,
            turn_id=turn.turn_id,
            finish_reason=turn.finish_reason,
            usage=turn.usage,
            steps=turn.step,
            error=turn.error,
            abort_reason=turn.abort_reason,
            budget=turn.budget,
            saved=saved,
        )
        hook = self.agent.hooks.on_turn_finish
        if hook is None and (self.bus is None or self.bus.try_publish(finished)):
            return  # delivered without a wait: no bound to enter (a cancel scope's cost)
        with trio.move_on_after(saving.SAVE_TIMEOUT, shield=True):
            await self._announce(finished, hook)

    def _result(self, turn: Turn, saved: bool) -> TurnResult:
        """What the turn's caller gets: how it ended, its message and results, and the
        calls it waits for when it suspended."""
        messages = self.state.messages
        return TurnResult(
            turn_id=turn.turn_id,
            finish_reason=turn.finish_reason,
            usage=turn.usage,
            steps=turn.step,
            message=messages[turn.a_index],
            tool_messages=tuple(
                turn.results[p.tool_call_id]
                for p in turn.parts.content
                if isinstance(p, ToolCallPart) and p.tool_call_id in turn.results
            ),
            error=turn.error,
            abort_reason=turn.abort_reason,
            budget=turn.budget,
            output=output_value(turn.output),
            new_messages=tuple(messages[turn.start_index :]),
            pending=pending_calls(messages) if turn.finish_reason == AWAITING_INPUT else (),
            saved=saved,
        )

    def _pair_calls(self, turn: Turn, closing: list[Any]) -> None:
        """Give every call of the turn that has no result one: its outcome if it
        completed, else ``interrupted`` (also streamed, in ``closing``)."""
        waits = turn.finish_reason == AWAITING_INPUT
        for part in turn.parts.content:
            if not isinstance(part, ToolCallPart) or part.tool_call_id in turn.results:
                continue
            if waits and part.awaiting is not None and not part.awaiting.decided:
                continue  # the turn waits for it: stored without a result
            oc = turn.outcomes.get(part.tool_call_id) or ToolOutcome(
                tool_call_id=part.tool_call_id, tool_name=part.tool_name, error=INTERRUPTED
            )
            self._add_result(turn, oc, part.step, edit_ran(part, oc))
            if part.tool_call_id not in turn.outcomes:
                closing.append(ToolDone(step=part.step, outcome=oc))

    async def _hand_over(self, run: RunTurn, turn: Turn, done: TurnDone) -> None:
        """The result to the consumer, after the turn's last chunk: through the stream
        controller, which keeps the order; also straight onto the consumer's inbox (the
        first to arrive ends the stream) if the controller did not take it in time (it
        is stuck, or the consumer does not read) or has ended.

        An ended controller still has an open inbox (a host that is torn down cancels its
        actors, it does not close their inboxes), so a send to it succeeds and the result
        would sit there unread, the consumer waiting for it for ever: checked first."""
        if not self.controller.ended and await self._to_controller(turn, done):
            return
        with trio.move_on_after(saving.SAVE_TIMEOUT, shield=True):
            try:
                await run.consumer.put(done)
                run.consumer.close()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the consumer is gone: nobody to tell

    @staticmethod
    async def _to_controller(turn: Turn, done: TurnDone) -> bool:
        """Send ``done`` to the controller, waiting at most ``SAVE_TIMEOUT`` seconds for
        room; whether it took it. The bound is entered only when the send would wait."""
        try:
            return await _send_bounded(turn.ctrl, (done,))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False

    # -- helpers ------------------------------------------------------------------------

    @staticmethod
    async def _ask(actor: Actor, message: Any) -> None:
        """Send to another actor; one that gave up surfaces as :class:`ActorFailed`."""
        try:
            await actor.send(message)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            raise ActorFailed(
                f"{actor.name} is not running (it crashed more often than its restart policy "
                "allows); this session cannot go on until the host restarts it"
            ) from None

    async def _announce(self, event: Any, hook: Any) -> None:
        await self.publish(event)
        if hook is not None:
            await hook(event)


async def _send_bounded(ctrl: Batcher[Any], items: Sequence[Any]) -> bool:
    """``items`` to the controller, waiting at most ``SAVE_TIMEOUT`` seconds for room,
    then past its inbox's capacity (:meth:`Batcher.send_over`); whether they went
    within it. So a turn's end reaches the controller even when the consumer stopped
    reading with the pipeline full (a deadline, a cancel), and is handed over behind
    the turn's chunks once the consumer reads again (given up on, the consumer waited
    for ever and the session stayed busy). The bound (a cancel scope) is entered only
    when the send would wait (:meth:`Batcher.try_send_all`): at a turn's end it almost
    never does."""
    if ctrl.try_send_all(items):
        return True
    return await ctrl.send_over(items, saving.SAVE_TIMEOUT)  # (a turn's end: shielded)


MAX_RESUMES = 10
"""The paused model calls (:attr:`FinishChunk.resume <runtime.chunks.FinishChunk.resume>`:
Anthropic's ``pause_turn`` and ``compaction`` stops) one turn continues; the next one
ends the turn with its finish (``other``). Each continuation is a step, counted by
:attr:`Budget.max_steps <runtime.budget.Budget.max_steps>` too."""


def _resumes(turn: Turn, result: Step, over: str | None) -> bool:
    """Whether the step ``result`` just ended paused and the turn continues it with its
    next call: the conversation sent as it stands, the paused answer last, which the
    model takes up where it stopped (what the Anthropic SDK's tool runner does). Not
    when it made tool calls (they run, and the next step follows anyway), went over a
    budget, waits for a person, or the turn continued :data:`MAX_RESUMES` already."""
    return (
        result.resume
        and not (result.calls or over or turn.held)
        and turn.resumed < MAX_RESUMES
        and result.finish not in ("error", "aborted")
    )


def _ends(turn: Turn, result: Step, over: str | None) -> str | None:
    """The finish reason the turn ends with when the step ``result`` just closed is its
    last for sure (``SaveRequest.ends``): no tool calls, no budget hit, no structured
    answer to judge again, none of the reasons a turn's result fails or stops it;
    ``None`` when anything may still follow (the step loop decides as before)."""
    if result.calls or over or turn.held or turn.output is not None:
        return None
    if result.finish in ("error", "aborted", AWAITING_INPUT):
        return None
    return result.finish
