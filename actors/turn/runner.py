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
and whether a call may run to :func:`refuse_call`.

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

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio

from actors.turn.compaction import compact
from actors.turn.parts import PartsManager
from actors.turn.session_sync import Adopted, adopt_record, adopt_save
from actors.turn.structured import StructuredTurn, observe, output_value, with_feedback
from actors.turn.suspension import (
    Suspending,
    awaiting,
    expiry_time,
    hold_context,
    hold_kind,
)
from actors.turn.takeover import Committed, find_committed
from actors.turn.throttle import acquire, limiter_of, release
from runtime import events as ev
from runtime.actor import Actor
from runtime.actor_messages import (
    Batch,
    Batcher,
    BeginRequest,
    ExecuteTools,
    InferRequest,
    RunTurn,
    SaveRequest,
    SaveResult,
    SessionSnapshot,
    SessionState,
    SteeredNotice,
    StepBegin,
    StepEnd,
    StepReset,
    StreamFailed,
    ThrottleNotice,
    ToolCallSpec,
    ToolDenied,
    ToolDone,
    ToolOutcome,
    ToolProgress,
    ToolStreamed,
    TurnBegin,
    TurnDone,
    TurnEnd,
    TurnResult,
    TurnSteering,
)
from runtime.agent import Agent
from runtime.approval import (
    APPROVAL,
    AWAITING_INPUT,
    SUPERSEDED,
    SUSPENDED_TRACE_META,
    WAITING_META,
    pending_calls,
    supersede,
    waiting_calls,
)
from runtime.chunks import (
    FinishChunk,
    ProviderDataChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.compaction import estimate_tokens
from runtime.errors import (
    ActorFailed,
    AxonError,
    BudgetExceeded,
    ProviderError,
    StoreError,
    ToolDefinitionError,
)
from runtime.history import INTERRUPTED, RepairedHistory
from runtime.hosting import ToolSource, TurnHost
from runtime.ids import new_id
from runtime.inbox import Inbox
from runtime.logging import get_logger
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    Message,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.output import ErrorInfo
from runtime.pricing import priced
from runtime.ratelimit import Limiter, Verdict
from runtime.redact import redact
from runtime.store import SessionRecord
from runtime.tools import Tool

SAVE_TIMEOUT = 5.0
"""Seconds a turn waits (shielded) for its final save."""
RUNNABLE_FINISH = ("stop", "tool-calls")


@attrs.define(slots=True)
class _Step:
    finish: str = "other"
    usage: Usage = attrs.field(factory=Usage)
    calls: list[ToolCallChunk] = attrs.field(factory=list)
    produced: bool = False


@attrs.define(slots=True, eq=False)
class _Turn:
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
    parts: PartsManager = attrs.field(factory=PartsManager)
    """Decides the part boundaries; ``parts.content`` is the assistant message's."""
    results: dict[str, ToolMessage] = attrs.field(factory=dict)
    """Tool messages added to the history, by call id."""
    outcomes: dict[str, ToolOutcome] = attrs.field(factory=dict)
    """Every outcome received, as it arrived: kept even if the turn is then cancelled."""
    usage: Usage = attrs.field(factory=Usage)
    step: int = 0
    step_open: bool = False
    tool_calls_used: int = 0
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
    untouched: bool = False
    """A turn taken over whose committed steps had already finished it: it ran nothing,
    and its end neither changes nor saves the history."""
    held: dict[str, Awaiting] = attrs.field(factory=dict)
    """The step's calls that suspend the turn (docs/approval.md), by call id."""
    provider: int = 0
    """Which of the runner's providers the turn's calls go to: the primary, or the
    fallback the turn went on with (``Agent(provider=[primary, fallback, ...])``)."""
    steering: TurnSteering = attrs.field(factory=TurnSteering)
    """User messages that join the turn at its next step boundary (``steer``)."""


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


def _cut_last_turn(state: SessionState) -> None:
    """Cut the history back to before its last user message (a regenerate): the turn
    that follows saves from the cut on, replacing the old turn in the store as well."""
    messages = state.messages
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], UserMessage):
            del messages[i:]
            state.saved_upto = min(state.saved_upto, i)
            return


class TurnRunner(Suspending, Actor):
    """Per-session actor running turns, one at a time. How a turn suspends for input and
    resumes comes from :class:`~actors.turn.suspension.Suspending`."""

    inbox_capacity = 16

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
    ) -> None:
        super().__init__(name="turn-runner", session_id=state.session_id)
        self.state = state
        """The session's history: this runner's alone (others read :attr:`snapshot`)."""
        self.snapshot: SessionSnapshot = state.snapshot()
        """The history as of its last change: an immutable value, replaced on change."""
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
        self._log = get_logger("axon.turn")
        self.save_replies: Inbox[SaveResult] = Inbox(8, "drop-oldest", name="save-replies")
        """The persister's answers; only the latest request's matters, so a backlog of
        older ones is dropped rather than ever holding the persister up."""
        self._pending: SaveRequest | None = None
        """The session's latest save, until its outcome is adopted into the state."""
        self._answered: SaveResult | None = None
        """The answer to ``_pending``, once it came in."""
        self._repaired = RepairedHistory()
        """Repairs the history once per message, for the requests of every step."""
        self._repaired(state.messages)  # a resumed history: repaired with its loading

    async def handle(self, message: Any) -> None:
        if isinstance(message, RunTurn):
            await self.run_turn(message)

    def on_rest(self) -> None:
        """The session is idle: the inboxes only a turn uses let go of their channels."""
        for inbox in (self.stream_inbox, self.tool_inbox, self.save_replies):
            inbox.park()

    def _provider_at(self, index: int) -> Actor:
        """Provider ``index`` of the turn's chain: the primary, then the fallbacks."""
        return self.provider if index == 0 else self.fallbacks[index - 1]

    def _publish_history(self) -> None:
        """Replace :attr:`snapshot` with the history as it is now."""
        self.snapshot = self.state.snapshot()

    # -- one turn -----------------------------------------------------------------------

    async def run_turn(self, run: RunTurn) -> None:
        """Run one user input to completion (or until it is cut short), then close it."""
        state, agent, budget = self.state, self.agent, self.agent.budget
        sid = state.session_id
        turn_id = run.turn_id
        await self._sync(turn_id, reload=run.resume, stored=run.stored)
        message_id = run.message_id or new_id("msg")
        committed = None
        if run.resume and run.message_id is not None:
            committed = find_committed(state.messages, message_id)
        if committed is None and run.regenerate:
            _cut_last_turn(state)
        superseded: tuple[Any, ...] = ()
        # The stored meta may say a turn waits (docs/approval.md): this turn clears it.
        was_waiting = bool(waiting_calls(state.messages)) or bool(run.meta.get(WAITING_META))
        if committed is None:
            superseded = pending_calls(state.messages)
            at = supersede(state.messages)  # a turn waiting for input gives way
            if at is not None:
                state.saved_upto = min(state.saved_upto, at)
        turn = _Turn(
            turn_id=turn_id,
            start_index=len(state.messages),
            ctrl=Batcher(self.controller.inbox, turn_id),
            message_id=message_id,
            meta={"agent": agent.name, **run.meta, **({WAITING_META: 0} if was_waiting else {})},
            deps=run.deps,
            steering=run.steering,
            tools=run.tools,
            instructions=run.instructions,
        )
        if committed is None:
            state.messages.append(
                UserMessage(content=run.input, id=run.user_message_id or new_id("msg"))
            )
            turn.a_index = len(state.messages)
            state.messages.append(AssistantMessage(id=turn.message_id))
        else:
            self._continue(turn, committed)
        self._publish_history()
        scope = run.cancel.scope
        turn.output = StructuredTurn.start(agent, turn.message_id)
        if budget.deadline is not None:
            scope.deadline = trio.current_time() + budget.deadline
        try:
            await turn.ctrl.send(
                TurnBegin(turn_id=turn.turn_id, message_id=turn.message_id, consumer=run.consumer)
            )
            for call in superseded:
                if call.kind == APPROVAL:
                    await self.publish(
                        ev.ToolApprovalDecided(
                            session_id=sid,
                            tool_call_id=call.tool_call_id,
                            approved=False,
                            reason=SUPERSEDED,
                            turn_id=call.turn_id,
                            causation_id=call.approval_id,
                        )
                    )
            await self._announce(
                ev.TurnStarted(
                    session_id=sid,
                    turn_id=turn.turn_id,
                    agent=agent.name,
                    input=run.input,
                    causation_id=run.meta.get("parent_tool_call_id"),
                    provider=getattr(self.provider, "provider_name", None),
                    model=getattr(self.provider, "model", None) or None,
                    resumed=committed is not None,
                    suspended_trace=_suspended_trace(run.meta, turn_id, committed),
                ),
                agent.hooks.on_turn_start,
            )
            with scope:
                # A turn cancelled before it began (an ``interrupt`` that a newer message
                # overtook) ends here: the first model call may reach the provider before
                # any other checkpoint.
                await trio.lowlevel.checkpoint()
                if committed is not None and self._already_finished(turn, committed):
                    turn.untouched = True
                elif committed is not None and not await self._resolve(turn):
                    turn.untouched, turn.finish_reason = True, AWAITING_INPUT
                else:
                    await self._steps(turn)
            if scope.cancelled_caught:
                if run.cancel.reason is None and budget.deadline is not None:
                    turn.finish_reason, turn.budget = "budget", "deadline"
                else:
                    turn.finish_reason = "aborted"
                    turn.abort_reason = run.cancel.reason or "cancelled"
        except BudgetExceeded as stop:
            turn.finish_reason, turn.budget = "budget", stop.budget
        except trio.Cancelled:
            turn.finish_reason, turn.abort_reason = "aborted", "host shutdown"
            await self._finish_turn(run, turn)
            raise
        except Exception as exc:
            turn.error = _error_info(exc)
            turn.finish_reason = "error"
            self._log.error(
                "turn.failed",
                session_id=sid,
                turn_id=turn.turn_id,
                error=redact(turn.error.message),
                error_kind=turn.error.kind,
            )
        await self._finish_turn(run, turn)

    def _continue(self, turn: _Turn, committed: Committed) -> None:
        """Take over a turn another worker began: continue its assistant message from
        the step after its committed ones (see :mod:`actors.turn.takeover`). The history
        drops what a cut step left in it; the turn's saves, which start at its user
        message, drop it from the store too."""
        state = self.state
        turn.start_index, turn.a_index = committed.user_index, committed.assistant_index
        turn.parts = PartsManager(committed.parts)
        turn.step = committed.next_step
        turn.tool_calls_used = committed.calls
        turn.results = {t.tool_call_id: t for t in committed.tool_messages}
        turn.usage = committed.usage  # the committed steps' calls count too
        if committed.finished:
            return  # the history is left as it is
        del state.messages[committed.assistant_index :]
        state.messages.append(
            AssistantMessage(id=turn.message_id, content=committed.parts, usage=committed.usage)
        )
        state.messages.extend(committed.tool_messages)

    @staticmethod
    def _already_finished(turn: _Turn, committed: Committed) -> bool:
        """Whether the committed steps of a turn taken over already answered it (the
        worker died after committing the final step, before the turn was marked done):
        then no model call runs. A structured answer is judged again first: one that
        does not validate is asked for again, as if the step had just ended."""
        if not committed.finished:
            return False
        out = turn.output
        last = committed.next_step - 1
        return out is None or not out.ask_again(turn.parts.content, last, "stop")

    async def _steps(self, turn: _Turn) -> None:
        """The step loop: budget check, model call, tools, step boundary; until a step
        finishes without tool calls."""
        state, agent, budget = self.state, self.agent, self.agent.budget
        sid, ctrl = state.session_id, turn.ctrl
        while True:
            budget.check_step(turn.step)
            if turn.parts.content:  # a step boundary is behind
                if turn.steering.pull is not None and self._pending is not None:
                    # the step's save first: it tells a worker whether anyone steered
                    # (runtime.turn_queue.SteerWatch), so it reads nothing otherwise
                    await self._wait_answer(self._pending)
                await turn.steering.pull_waiting()  # another process's messages, if any
                if turn.steering.waiting:
                    await self._steer(turn)
            step = turn.parts.step = turn.step
            await ctrl.send(StepBegin(step=step))
            turn.step_open = True
            await self._announce(
                ev.StepStarted(session_id=sid, turn_id=turn.turn_id, step=step),
                agent.hooks.on_step_start,
            )
            result = await self._infer(turn)
            turn.usage = turn.usage + result.usage
            over = budget.tokens_exceeded(turn.usage)
            if result.calls:
                over = await self._run_tools(turn, result, refuse=over) or over
                for call in result.calls:  # call order, not completion order
                    if call.tool_call_id in turn.held:
                        continue  # it waits: no result until it is decided
                    oc = turn.outcomes[call.tool_call_id]
                    if oc.usage is not None:  # an agent used as a tool spent tokens
                        turn.usage = turn.usage + oc.usage
                    self._add_result(turn, oc, step)
                over = over or budget.tokens_exceeded(turn.usage)  # sub-agents' too
                await self._hold(turn, step)
            self._snapshot(turn)
            self._publish_history()
            await ctrl.send(StepEnd(step=step, finish_reason=result.finish, usage=result.usage))
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
                agent.hooks.on_step_finish,
            )
            await self._announce(
                ev.MessageAdded(
                    session_id=sid,
                    turn_id=turn.turn_id,
                    index=turn.a_index,
                    message=state.messages[turn.a_index],
                ),
                agent.hooks.on_message_added,
            )
            if turn.held and not over:  # what the sessions list reads (docs/approval.md)
                turn.meta = {**turn.meta, WAITING_META: len(turn.held), **self._trace_meta(turn)}
            await self._save(turn, step)
            if over:
                raise BudgetExceeded(over)
            if turn.held:  # committed with the step: the turn suspends (docs/approval.md)
                turn.finish_reason = AWAITING_INPUT
                await self._announce_waiting(turn, step)
                return
            if not result.calls:
                turn.finish_reason = result.finish
                if turn.output is not None and turn.output.ask_again(
                    turn.parts.content, step, result.finish
                ):
                    continue  # the answer did not validate: the model sees why, answers again
                return

    def _trace_meta(self, turn: _Turn) -> dict[str, Any]:
        """What the suspending save stores of the turn's trace context (a tracing
        plug-in's, :attr:`runtime.bus.Bus.trace_contexts`): its continuation links to it."""
        context = None if self.bus is None else self.bus.trace_contexts.get(turn.turn_id)
        if context is None:
            return {}
        return {SUSPENDED_TRACE_META: {**context, "turn_id": turn.turn_id}}

    async def _steer(self, turn: _Turn) -> None:
        """Insert the user messages handed to the running turn (the ``steer`` busy
        strategy) where the model sees them: after the last step's tool results, before
        the next model call. Each user input keeps its own assistant message, so the
        steps from here on go to a new one (same turn, steps numbered on); the stored
        history shows the messages where the model saw them."""
        state = self.state
        for item in turn.steering.take(turn.step):
            message = UserMessage(content=item.content, id=item.user_message_id)
            state.messages.append(message)
            await turn.ctrl.send(
                SteeredNotice(step=turn.step, message_id=message.id, text=message.text)
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
        turn.message_id = new_id("msg")
        turn.a_index = len(state.messages)
        state.messages.append(AssistantMessage(id=turn.message_id))
        turn.parts = PartsManager()
        if turn.output is not None:
            turn.output.message_id = turn.message_id
        self._publish_history()

    def _add_result(self, turn: _Turn, oc: ToolOutcome, step: int) -> None:
        msg = ToolMessage(
            tool_call_id=oc.tool_call_id,
            tool_name=oc.tool_name,
            step=step,
            output=oc.output,
            error=oc.error,
        )
        turn.results[oc.tool_call_id] = msg
        self.state.messages.append(msg)

    def _snapshot(
        self, turn: _Turn, interrupted: bool = False, error: ErrorInfo | None = None
    ) -> None:
        """Refresh the turn's assistant message in the history (a new frozen value)."""
        self.state.messages[turn.a_index] = AssistantMessage(
            id=turn.message_id,
            content=tuple(turn.parts.content),
            interrupted=interrupted,
            error=error,
            usage=turn.usage,
        )

    async def _save(self, turn: _Turn, step: int | None) -> SaveRequest:
        """Queue a save of the turn (from wherever the store is behind, after a failed
        save) with the persister; returns the request (its answer comes on
        :attr:`save_replies`, see :meth:`_answer`).

        The save is based on the stored version the state matches. If the previous save
        is still in flight, that version is not known yet: the request names the previous
        one instead, and the persister resolves it (see :class:`SaveRequest`)."""
        state = self.state
        prev = self._pending
        if prev is not None and self._answer(prev) is not None:
            await self._adopt(prev, turn)
            prev = None
        start = min(turn.start_index, state.saved_upto)
        req = SaveRequest(
            request_id=new_id("save"),
            session_id=state.session_id,
            turn_id=turn.turn_id,
            start=start,
            messages=tuple(state.messages[start:]),
            meta=turn.meta,
            step=step,
            expected_version=state.version if prev is None else None,
            after=None if prev is None else prev.request_id,
            reply=self.save_replies,
        )
        self._pending, self._answered = req, None
        try:
            await self.persister.inbox.put(req)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._answered = SaveResult(
                request_id=req.request_id,
                session_id=req.session_id,
                error=ActorFailed("the persister is not running; the session was not saved"),
            )
        return req

    def _answer(self, req: SaveRequest) -> SaveResult | None:
        """The persister's answer to ``req`` (the latest request) if it came in; answers
        to earlier requests are passed over (the latest one's is the one adopted)."""
        inbox = self.save_replies
        while self._answered is None:
            try:
                reply = inbox.get_nowait()
            except trio.WouldBlock:
                return None
            if isinstance(reply, SaveResult) and reply.request_id == req.request_id:
                self._answered = reply
        return self._answered

    async def _wait_answer(self, req: SaveRequest) -> SaveResult:
        """Wait for the persister's answer to ``req`` (the latest request)."""
        while (answer := self._answer(req)) is None:
            reply = await self.save_replies.get()
            if isinstance(reply, SaveResult) and reply.request_id == req.request_id:
                self._answered = reply
        return answer

    async def _adopt(self, req: SaveRequest, turn: _Turn | None) -> SaveResult:
        """Take a finished save's outcome into the state: how far the store got, its
        version and, if the save was rebased after another writer's, the new layout."""
        result = await self._wait_answer(req)
        if self._pending is req:
            self._pending, self._answered = None, None
        adopted = adopt_save(self.state, req, result)
        self._publish_history()
        if turn is not None and adopted.shift:
            turn.start_index += adopted.shift
            turn.a_index += adopted.shift
        await self._concurrent(adopted, "rebased", req.turn_id)
        return result

    async def _sync(
        self, turn_id: str, *, reload: bool = False, stored: SessionRecord | None = None
    ) -> None:
        """Before a turn: if another writer saved the session since this process last
        saw it, take its history (a version query; a load only when it moved), so the
        model sees that writer's turns. Bounded, and best effort: a save that meets the
        other writer's turns is rebased anyway.

        With ``reload`` (a turn resumed: its decisions were recorded by another writer,
        or taken over from another worker) the session has almost surely moved: it is
        loaded at once, one store round trip instead of a version query and a load; and
        when its caller hands the session as it just read or wrote it (``stored``: a
        continuation started in the process that recorded its decisions), none."""
        state = self.state
        store = getattr(self.persister, "store", None)
        with trio.move_on_after(SAVE_TIMEOUT):
            prev = self._pending
            if prev is not None:  # the previous turn's final save, if it outlived the turn
                await self._adopt(prev, None)
            if store is None:
                return
            try:
                if stored is not None and stored.version >= state.version:
                    record: SessionRecord | None = stored  # (not older than ours)
                elif not reload and await store.version(state.session_id) == state.version:
                    return
                else:
                    record = await store.load(state.session_id)
                if (0 if record is None else record.version) == state.version:
                    return  # (``reload``) it had not moved after all
            except StoreError as exc:
                self._log.warning(
                    "session.reload-failed",
                    session_id=state.session_id,
                    turn_id=turn_id,
                    error=redact(f"{type(exc).__name__}: {exc}"),
                )
                return
            adopted = adopt_record(state, record)
            self._publish_history()
            await self._concurrent(adopted, "reloaded", turn_id)

    async def _concurrent(self, adopted: Adopted, resolution: str, turn_id: str) -> None:
        """Say so (an event and a log line) when another writer's work came in: a warning,
        or a debug line on a host that expects other writers (a worker's)."""
        if not adopted.concurrent:
            return
        state = self.state
        expected = self.host.expects_other_writers
        log = self._log.debug if expected else self._log.warning
        log(
            "session.concurrent-writer",
            session_id=state.session_id,
            turn_id=turn_id,
            resolution=resolution,
            added=adopted.added,
            dropped=adopted.dropped,
            version=state.version,
        )
        await self.publish(
            ev.ConcurrentWrite(
                session_id=state.session_id,
                turn_id=turn_id,
                resolution=resolution,
                version=state.version,
                message_count=len(state.messages),
                added=adopted.added,
                dropped=adopted.dropped,
            )
        )

    async def _finish_turn(self, run: RunTurn, turn: _Turn) -> None:
        """Close the turn whatever happened: seal parts, pair every call with a result
        (a call that completed keeps its result), save (shielded, bounded), then tell the
        controller and hand the result over."""
        state, agent, ctrl = self.state, self.agent, turn.ctrl
        turn.steering.close()  # no step follows: a message still waiting starts a turn
        with trio.CancelScope(shield=True):
            closing: list[Any] = []
            turn.parts.close(closing)  # a part cut short ends here, in both outputs
            # Failed (an error ended it) and interrupted (cut from outside) are stored apart.
            cut = turn.abort_reason is not None or turn.budget == "deadline"
            cut = cut and turn.error is None
            if turn.finish_reason != AWAITING_INPUT and turn.meta.get(WAITING_META):
                turn.meta = {**turn.meta, WAITING_META: 0}  # cut after it was marked waiting
            if not turn.untouched:
                self._pair_calls(turn, closing)
                self._snapshot(turn, interrupted=cut, error=turn.error)
                self._publish_history()
            if turn.step_open and turn.error is None and turn.abort_reason is None:
                # A budget (the deadline, a hook's) cut the step: close it for the grammar.
                closing.append(StepEnd(step=turn.step, finish_reason="other", usage=Usage()))
                turn.step += 1
            saved = turn.untouched  # (an untouched turn has nothing to save)
            try:
                final = None if turn.untouched else await self._bounded_save(turn)
                saved = turn.untouched or (final is not None and final.error is None)
                if final is not None and final.error is not None and turn.error is None:
                    turn.error = _error_info(final.error)
                closing.append(
                    TurnEnd(
                        finish_reason=turn.finish_reason,
                        usage=turn.usage,
                        error=turn.error,
                        abort_reason=turn.abort_reason,
                        budget=turn.budget,
                    )
                )
                await _send_bounded(ctrl, closing)
                finished = ev.TurnFinished(
                    session_id=state.session_id,
                    turn_id=turn.turn_id,
                    finish_reason=turn.finish_reason,
                    usage=turn.usage,
                    steps=turn.step,
                    error=turn.error,
                    abort_reason=turn.abort_reason,
                    budget=turn.budget,
                )
                with trio.move_on_after(SAVE_TIMEOUT):
                    await self._announce(finished, agent.hooks.on_turn_finish)
            finally:
                result = TurnResult(
                    turn_id=turn.turn_id,
                    finish_reason=turn.finish_reason,
                    usage=turn.usage,
                    steps=turn.step,
                    message=state.messages[turn.a_index],
                    tool_messages=tuple(
                        turn.results[p.tool_call_id]
                        for p in turn.parts.content
                        if isinstance(p, ToolCallPart) and p.tool_call_id in turn.results
                    ),
                    error=turn.error,
                    abort_reason=turn.abort_reason,
                    budget=turn.budget,
                    output=output_value(turn.output),
                    new_messages=tuple(state.messages[turn.start_index :]),
                    pending=(
                        pending_calls(state.messages)
                        if turn.finish_reason == AWAITING_INPUT
                        else ()
                    ),
                    saved=saved,
                )
                await self._hand_over(run, turn, TurnDone(result=result))

    def _pair_calls(self, turn: _Turn, closing: list[Any]) -> None:
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
            self._add_result(turn, oc, part.step)
            if part.tool_call_id not in turn.outcomes:
                closing.append(ToolDone(step=part.step, outcome=oc))

    async def _hand_over(self, run: RunTurn, turn: _Turn, done: TurnDone) -> None:
        """The result to the consumer, after the turn's last chunk: through the stream
        controller, which keeps the order; straight onto the consumer's inbox if the
        controller does not take it (it gave up, or is stuck) or has ended.

        An ended controller still has an open inbox (a host that is torn down cancels its
        actors, it does not close their inboxes), so a send to it succeeds and the result
        would sit there unread, the consumer waiting for it for ever: checked first."""
        if not self.controller.stopped.is_set() and await self._to_controller(turn, done):
            return
        with trio.move_on_after(SAVE_TIMEOUT):
            try:
                await run.consumer.put(done)
                run.consumer.close()
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # the consumer is gone: nobody to tell

    @staticmethod
    async def _to_controller(turn: _Turn, done: TurnDone) -> bool:
        """Send ``done`` to the controller, waiting at most ``SAVE_TIMEOUT`` seconds for
        room; whether it took it. The bound is entered only when the send would wait."""
        try:
            return await _send_bounded(turn.ctrl, (done,))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return False

    async def _bounded_save(self, turn: _Turn) -> SaveResult | None:
        """The turn's final save, waited for at most ``SAVE_TIMEOUT`` seconds.

        When the last step's save (still in flight) already holds the turn as it ends (a
        turn that finished normally: nothing changed since), its answer is the final
        one: a second, identical write would cost a store round trip per turn for
        nothing (a transaction per turn on a PostgreSQL store)."""
        with trio.move_on_after(SAVE_TIMEOUT) as scope:
            pending = self._pending
            if pending is not None and self._holds_turn(pending, turn):
                result = await self._adopt(pending, turn)
                if result.error is None:
                    return result
            final = await self._save(turn, None)
            return await self._adopt(final, turn)
        if scope.cancelled_caught:
            self._log.error(
                "session.save-timeout", session_id=self.state.session_id, turn_id=turn.turn_id
            )
        return None

    def _holds_turn(self, req: SaveRequest, turn: _Turn) -> bool:
        """Whether ``req`` writes the session exactly as it is now (from the turn on)."""
        start = min(turn.start_index, self.state.saved_upto)
        return (
            req.start == start
            and req.meta == turn.meta
            and req.messages == tuple(self.state.messages[start:])
        )

    # -- one model call ---------------------------------------------------------------

    async def _infer(self, turn: _Turn) -> _Step:
        """One model call for the turn's current step, retried by the agent's policy
        while the call has produced no output; then, if the agent has fallbacks and the
        failure is one they cover, made again with the next provider: after a
        ``reset-step`` (:meth:`_reset_step`) if the failed call had streamed output."""
        policy = self.agent.retry
        attempt = 0
        mark = len(turn.parts.content)  # the step's parts start here
        while True:
            attempt += 1
            result = _Step()
            try:
                await self._call_once(turn, result)
                price_key = getattr(self._provider_at(turn.provider), "price_key", None)
                result.usage = await priced(result.usage, price_key() if price_key else None)
                return result
            except ProviderError as exc:
                delay = None if result.produced else policy.delay(attempt, exc)
                if delay is None:
                    if not await self._fall_back(turn, exc, reset=result.produced):
                        raise
                    if result.produced:
                        await self._reset_step(turn, mark, exc)
                    attempt = 0  # the next provider's call gets retries of its own
                    continue
                await self.publish(
                    ev.ProviderRetry(
                        session_id=self.state.session_id,
                        turn_id=turn.turn_id,
                        step=turn.step,
                        attempt=attempt,
                        delay=delay,
                        error=_error_info(exc),
                    )
                )
                self._log.warning(
                    "provider.retry",
                    session_id=self.state.session_id,
                    turn_id=turn.turn_id,
                    step=turn.step,
                    attempt=attempt,
                    delay=delay,
                    error=redact(str(exc)),
                )
                await trio.sleep(delay)

    async def _reset_step(self, turn: _Turn, mark: int, exc: ProviderError) -> None:
        """Void what the failed call of the step streamed, before the next provider makes
        the step again: its parts leave the turn's message (they are never stored: the
        step's save comes after its call succeeds), the structured answer's parser forgets
        them, and the stream says ``reset-step`` so every consumer drops them too."""
        turn.parts.discard(mark)
        if turn.output is not None:
            turn.output.discard()
        following = self._provider_at(turn.provider)
        await turn.ctrl.send(
            StepReset(step=turn.step, provider=following.name, error=_error_info(exc))
        )

    async def _fall_back(self, turn: _Turn, exc: ProviderError, *, reset: bool = False) -> bool:
        """Move the turn on to the next provider, if the agent has one left and its
        :class:`~runtime.provider.FallbackProvider` covers ``exc``; say so (an event and
        a warning; ``reset``: the failed call had streamed output). The turn stays on
        it: its later steps go there too."""
        chain = self.agent.provider
        falls_back_on = getattr(chain, "falls_back_on", None)
        if falls_back_on is None or not falls_back_on(exc):
            return False
        if turn.provider >= len(self.fallbacks):
            return False
        failed = self._provider_at(turn.provider)
        turn.provider += 1
        following = self._provider_at(turn.provider)
        error = _error_info(exc)
        self._log.warning(
            "provider.fallback",
            session_id=self.state.session_id,
            turn_id=turn.turn_id,
            step=turn.step,
            from_provider=failed.name,
            to_provider=following.name,
            error=redact(str(exc)),
            reset=reset,
        )
        await self.publish(
            ev.ProviderFallback(
                session_id=self.state.session_id,
                turn_id=turn.turn_id,
                step=turn.step,
                from_provider=failed.name,
                to_provider=following.name,
                error=error,
                provider=getattr(following, "provider_name", None),
                model=getattr(following, "model", None) or None,
                reset=reset,
            )
        )
        return True

    async def _begin(self, request_id: str) -> None:
        """Tell the engine a model call starts.

        A cancelled call can leave the engine blocked on a full stream inbox with what it
        still forwards of it (backpressure from a consumer that stopped reading), and its
        own inbox full: waiting for room there while nobody reads the stream inbox would
        never end. So while the engine has no room, what arrives on the stream inbox is
        dropped: nothing of the new call can be there before the engine hears of it.
        """
        begin = BeginRequest(request_id=request_id)
        try:
            self.engine.inbox.put_nowait(begin)
            return
        except trio.WouldBlock:
            pass

        async def drop_stale() -> None:
            while True:
                batch = await self.stream_inbox.get()
                if isinstance(batch, Batch):
                    batch.taken = True

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drop_stale)
            await self.engine.send(begin)
            nursery.cancel_scope.cancel()

    async def _call_once(self, turn: _Turn, result: _Step) -> None:
        """Ask the provider once and relay its chunks: the parts manager decides the
        parts, and what the stream shows goes on to the controller batch by batch."""
        state, agent = self.state, self.agent
        tools = await self._tools(turn)  # MCP servers' lists may have changed
        instructions = _joined(agent.instructions, turn.instructions)
        # Repaired once here, so no provider has to remember to: every tool call has a
        # result (``interrupted`` if it never got one), no result lacks its call.
        messages = self._repaired(state.messages)
        provider = self._provider_at(turn.provider)
        if agent.history_processors:  # context compaction (actors/turn/compaction.py)
            messages = await self._compact(turn, provider, messages, instructions, tools)
        limiter = limiter_of(provider)  # a rate limit (actors/turn/throttle.py)
        grant = await acquire(
            limiter,
            lambda: estimate_tokens(instructions, messages, tools),
            lambda verdict: self._throttled(turn, limiter, verdict),
        )
        request_id = new_id("req")
        await self._begin(request_id)
        request = InferRequest(
            request_id=request_id,
            session_id=state.session_id,
            turn_id=turn.turn_id,
            step=turn.step,
            instructions=instructions,
            messages=with_feedback(turn.output, messages),
            tools=tools,
            reply=self.engine.inbox,
            cancel_scope=trio.CancelScope(),
            settings=agent.settings,
            output=agent.output_schema,
        )
        await self._ask(provider, request)
        inbox, parts, ctrl = self.stream_inbox, turn.parts, turn.ctrl
        parts.origin = getattr(provider, "origin", None)  # recorded on signed parts
        try:
            while True:
                batch = await inbox.get()
                if not isinstance(batch, Batch) or batch.tag != request_id:
                    continue
                batch.taken = True
                failure: StreamFailed | None = None
                finished = False
                forward: list[Any] = []
                i, n = 0, len(batch)
                while i < n:
                    chunk = batch[i]
                    t = type(chunk)
                    if t is TextChunk:  # a run of text deltas, in one call
                        i = parts.texts(batch, i, forward)
                        continue
                    i += 1
                    if t is ReasoningChunk:
                        parts.reasoning(chunk, forward)
                    elif t is ToolInputDeltaChunk:
                        forward.append(chunk)
                    elif t is ToolInputStartChunk:
                        parts.tool_input_start(chunk, forward)
                    elif t is ToolCallChunk:
                        parts.tool_call(chunk, forward)
                        result.calls.append(chunk)
                    elif t is ProviderDataChunk:
                        parts.provider_data(chunk, forward)
                        result.produced = True  # stored, though the stream shows nothing
                    elif t is UsageChunk:
                        result.usage = chunk.usage
                    elif t is FinishChunk:
                        result.finish = chunk.reason
                        finished = True
                    elif t is StreamFailed:
                        failure = chunk
                if forward:
                    result.produced = True
                if finished:
                    parts.close(forward)  # the call's last part ends with it
                if forward:
                    await ctrl.send_all(observe(turn.output, forward))
                if failure is not None:
                    raise failure.error
                if finished:
                    return
        finally:
            request.cancel_scope.cancel()
            await release(limiter, grant, result.usage)

    async def _throttled(self, turn: _Turn, limiter: Limiter | None, verdict: Verdict) -> None:
        """The call waits for a rate limit: say so in the stream and on the bus."""
        wait, reason = verdict.wait, verdict.reason
        await turn.ctrl.send(ThrottleNotice(step=turn.step, wait=wait, reason=reason))
        await self.publish(
            ev.ProviderThrottled(
                session_id=self.state.session_id,
                turn_id=turn.turn_id,
                step=turn.step,
                wait=wait,
                reason=reason,
                key=limiter.key if limiter is not None else "",
            )
        )

    async def _compact(
        self,
        turn: _Turn,
        provider: Actor,
        messages: tuple[Message, ...],
        instructions: str | None,
        tools: tuple[Tool, ...],
    ) -> tuple[Message, ...]:
        """The agent's history processors on the call's ``messages``; a summary they
        stored goes into the history right before the turn's user message (saved with
        the turn), and its call's usage into the turn's."""
        done = await compact(
            self.agent.history_processors,
            messages,
            provider=provider,
            session_id=self.state.session_id,
            turn_id=turn.turn_id,
            step=turn.step,
            instructions=instructions,
            tools=tools,
        )
        history = self.state.messages
        for stored in done.stored:
            at = (
                turn.a_index - 1
                if isinstance(history[turn.a_index - 1], UserMessage)
                else turn.a_index
            )
            history.insert(at, stored.message)
            turn.a_index += 1
        turn.usage = turn.usage + done.usage
        if done.stored:
            self._publish_history()
            last = done.stored[-1]
            await self.publish(
                ev.HistoryCompacted(
                    session_id=self.state.session_id,
                    turn_id=turn.turn_id,
                    step=turn.step,
                    tokens_before=done.stored[0].tokens_before,
                    tokens_after=last.tokens_after,
                    covered=last.covered,
                    usage=done.usage,
                )
            )
        return done.messages

    # -- tools --------------------------------------------------------------------------

    async def _run_tools(self, turn: _Turn, result: _Step, *, refuse: str | None) -> str | None:
        """Run (or refuse) the step's calls, streaming each outcome as it completes into
        ``turn.outcomes``. Returns the name of a budget the calls ran into, if any."""
        agent, budget, sid = self.agent, self.agent.budget, self.state.session_id
        step, ctrl = turn.step, turn.ctrl
        refused: list[ToolOutcome] = []
        runnable: list[ToolCallSpec] = []
        over: str | None = None
        tools = {t.name: t for t in await self._tools(turn)}
        approver = self.host.approves_in_process()
        for call in result.calls:
            await self._announce(
                ev.ToolCallRequested(
                    session_id=sid,
                    turn_id=turn.turn_id,
                    step=step,
                    tool_call_id=call.tool_call_id,
                    tool_name=call.tool_name,
                    input=call.input,
                ),
                agent.hooks.on_tool_call,
            )
            refusal = refuse_call(call, result.finish, refuse)
            if refusal is None and not budget.admits_tool_call(turn.tool_calls_used):
                refusal = (
                    "the tool call was not executed: budget "
                    f"max_tool_calls={budget.max_tool_calls} reached"
                )
                over = "max_tool_calls"
            if refusal is not None:
                refused.append(
                    ToolOutcome(
                        tool_call_id=call.tool_call_id, tool_name=call.tool_name, error=refusal
                    )
                )
            else:
                turn.tool_calls_used += 1
                context = hold_context(self.host, sid, turn.turn_id, step, call, turn.deps)
                kind = hold_kind(tools.get(call.tool_name), call.input, context, approver)
                if kind is not None:
                    turn.held[call.tool_call_id] = awaiting(
                        kind, call.tool_call_id, turn.turn_id, expiry_time(self.host, self.agent)
                    )
                    continue
                runnable.append(
                    ToolCallSpec(
                        tool_call_id=call.tool_call_id, tool_name=call.tool_name, input=call.input
                    )
                )
        for oc in refused:
            turn.outcomes[oc.tool_call_id] = oc
            await self._tool_done(turn.turn_id, step, oc, ctrl)
        await self._execute(turn, step, runnable, tools)
        return over

    async def _tools(self, turn: _Turn) -> tuple[Tool, ...]:
        """The tools offered for the turn's next model call: the agent's (and its MCP
        servers' current ones), then the turn's own; a turn tool that takes an agent
        tool's name is a :class:`ToolDefinitionError`."""
        tools = await self.tool_source(self.agent)
        if not turn.tools:
            return tools
        taken = {t.name for t in tools} & {t.name for t in turn.tools}
        if taken:
            raise ToolDefinitionError(
                f"the turn's tool(s) {sorted(taken)} take the name of one of the agent's tools"
            )
        return (*tools, *turn.tools)

    async def _execute(
        self, turn: _Turn, step: int, runnable: list[ToolCallSpec], tools: dict[str, Any]
    ) -> None:
        """Run ``runnable`` on the tool executor, streaming each outcome as it completes
        into ``turn.outcomes``."""
        budget, sid, ctrl = self.agent.budget, self.state.session_id, turn.ctrl
        if runnable:
            inbox = self.tool_inbox
            request = ExecuteTools(
                session_id=sid,
                turn_id=turn.turn_id,
                step=step,
                calls=tuple(runnable),
                tools=tools,
                default_timeout=budget.tool_timeout,
                max_result_chars=budget.max_tool_result_chars,
                reply=inbox,
                cancel_scope=trio.CancelScope(),
                host=self.host,
                deps=turn.deps,
            )
            await self._ask(self.tool_executor, request)
            pending = {c.tool_call_id for c in runnable}
            try:
                while pending:
                    item = await inbox.get()
                    if type(item) is ToolProgress:
                        if item.tool_call_id in pending:
                            await ctrl.send(ToolStreamed(step=step, progress=item))
                        continue
                    if not isinstance(item, ToolOutcome) or item.tool_call_id not in pending:
                        continue  # a late outcome of a cancelled earlier request
                    pending.discard(item.tool_call_id)
                    turn.outcomes[item.tool_call_id] = item
                    await self._tool_done(turn.turn_id, step, item, ctrl)
            finally:
                request.cancel_scope.cancel()

    async def _tool_done(
        self,
        turn_id: str,
        step: int,
        oc: ToolOutcome,
        ctrl: Batcher,
        *,
        denied: bool = False,
        reason: str | None = None,
    ) -> None:
        if denied:
            await ctrl.send(ToolDenied(step=step, outcome=oc, reason=reason))
        else:
            await ctrl.send(ToolDone(step=step, outcome=oc))
        await self._announce(
            ev.ToolCallCompleted(
                session_id=self.state.session_id,
                turn_id=turn_id,
                step=step,
                tool_call_id=oc.tool_call_id,
                tool_name=oc.tool_name,
                output=oc.output,
                error=oc.error,
                duration=oc.duration,
            ),
            self.agent.hooks.on_tool_result,
        )

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
    """``items`` to the controller, waiting at most ``SAVE_TIMEOUT`` seconds for room;
    whether they went. The bound (a cancel scope) is entered only when the send would
    wait (:meth:`Batcher.try_send_all`): at a turn's end it almost never does."""
    if ctrl.try_send_all(items):
        return True
    with trio.move_on_after(SAVE_TIMEOUT):
        await ctrl.send_all(items)
        return True
    return False


def refuse_call(call: ToolCallChunk, finish: str, token_budget: str | None) -> str | None:
    """Why a call of a step that finished with ``finish`` must not run (the error result
    the model sees instead), or ``None`` if it may. The provider's ``input_error`` comes
    first: it says what is wrong with the input (invalid JSON, cut by ``length``), which
    helps the model more than the finish reason; then the finish reason, then a token
    ``token_budget`` the turn went over. (The tool-call budget is counted by the caller.)
    """
    if call.input_error is not None:
        return call.input_error
    if finish not in RUNNABLE_FINISH:
        return (
            f"the tool call was not executed: the response ended with {finish!r} "
            "(its input may be truncated)"
        )
    if token_budget is not None:
        return f"the tool call was not executed: budget {token_budget} exceeded"
    return None


def _joined(instructions: str | None, more: str | None) -> str | None:
    """The agent's instructions with a turn's own added after them."""
    if not more:
        return instructions
    return f"{instructions}\n\n{more}" if instructions else more


def _error_info(exc: BaseException) -> ErrorInfo:
    if isinstance(exc, AxonError):
        return ErrorInfo(kind=exc.kind, message=str(exc) or exc.kind, retryable=exc.retryable)
    return ErrorInfo(
        kind=type(exc).__name__, message=str(exc) or type(exc).__name__, retryable=False
    )
