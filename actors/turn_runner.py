"""The turn runner: drives one user input through as many model calls as it takes.

One per session. For each :class:`~runtime.session.RunTurn` it creates ONE empty
assistant message, then loops: budget check, model call (through the provider and the
engine), append parts, run tools, repeat, until a step finishes without tool calls.
Every raw item goes on to the stream controller as it arrives; the history is saved at
every step boundary and at the end of the turn, including a turn that was cut short.

Rules from peers' bugs, enforced here:

* tools run only when the step ended with ``stop`` or ``tool-calls``; calls cut by
  ``length`` or a filter, or whose input is unusable, get an error result instead;
* a step is final only when it finished with no tool calls;
* tool results stream in completion order but are saved in call order;
* a model call is retried only while its step has produced no output;
* a cancelled turn keeps what the user saw (marked interrupted), unfinished reasoning
  stays unsigned, and every started call gets an ``interrupted`` result.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from runtime import events as ev
from runtime.actor import Actor
from runtime.agent import Agent
from runtime.chunks import (
    FinishChunk,
    ProviderDataChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.errors import ActorFailed, AxonError, ProviderError
from runtime.history import INTERRUPTED
from runtime.ids import new_id
from runtime.inbox import Inbox
from runtime.logging import get_logger
from runtime.messages import (
    AssistantMessage,
    Part,
    ProviderDataPart,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.output import ErrorInfo
from runtime.protocol import (
    Batch,
    Batcher,
    BeginRequest,
    ExecuteTools,
    InferRequest,
    SaveRequest,
    StepBegin,
    StepEnd,
    StreamFailed,
    ToolCallSpec,
    ToolDone,
    ToolOutcome,
    ToolProgress,
    ToolStreamed,
    TurnBegin,
    TurnEnd,
    TurnResult,
)
from runtime.redact import redact
from runtime.session import RunTurn, SessionState

SAVE_TIMEOUT = 5.0
"""Seconds a turn waits (shielded) for its final save."""
RUNNABLE_FINISH = ("stop", "tool-calls")


class _PartBuilder:
    """Accumulates the current text or reasoning part from deltas (list + join: linear)."""

    __slots__ = ("kind", "parts", "pieces", "provider", "redacted", "refusal", "signature", "step")

    def __init__(self, parts: list[Part]) -> None:
        self.parts = parts
        self.kind: str | None = None
        self.pieces: list[str] = []
        self.step = 0
        self.signature: str | None = None
        self.redacted: str | None = None
        self.provider: str | None = None
        self.refusal = False

    def text(self, chunk: TextChunk, step: int) -> None:
        if self.kind != "text" or self.refusal != chunk.refusal:
            self.close()
            self.kind, self.step, self.refusal = "text", step, chunk.refusal
        self.pieces.append(chunk.text)

    def reasoning(self, chunk: ReasoningChunk, step: int) -> None:
        if self.kind != "reasoning":
            self.close()
            self.kind, self.step = "reasoning", step
        if chunk.text:
            self.pieces.append(chunk.text)
        if chunk.provider is not None:
            self.provider = chunk.provider
        if chunk.signature is not None or chunk.redacted_data is not None:
            self.signature = chunk.signature
            self.redacted = chunk.redacted_data
            self.close()

    def close(self) -> None:
        kind = self.kind
        if kind is None:
            return
        text = "".join(self.pieces)
        if kind == "text":
            if text:
                self.parts.append(TextPart(text=text, step=self.step, refusal=self.refusal))
        elif text or self.signature is not None or self.redacted is not None:
            self.parts.append(
                ReasoningPart(
                    text=text,
                    step=self.step,
                    signature=self.signature,
                    redacted_data=self.redacted,
                    provider=self.provider,
                )
            )
        self.kind = None
        self.pieces = []
        self.signature = self.redacted = self.provider = None
        self.refusal = False


@attrs.define(slots=True)
class _Step:
    finish: str = "other"
    raw_finish: str | None = None
    usage: Usage = attrs.field(factory=Usage)
    calls: list[ToolCallChunk] = attrs.field(factory=list)
    produced: bool = False


class _BudgetStop(Exception):
    def __init__(self, budget: str) -> None:
        self.budget = budget


class TurnRunner(Actor):
    """Per-session actor running turns, one at a time."""

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
        host: Any = None,
    ) -> None:
        super().__init__(name="turn-runner", session_id=state.session_id)
        self.state = state
        self.agent = agent
        self.provider = provider
        self.engine = engine
        self.controller = controller
        self.tool_executor = tool_executor
        self.persister = persister
        self.stream_inbox = stream_inbox
        """Where the engine sends this session's chunk batches."""
        self.tool_inbox = Inbox(1024, "block", name="tool-results")
        self.host = host
        self._log = get_logger("axon.turn")

    async def handle(self, message: Any) -> None:
        if isinstance(message, RunTurn):
            await self.run_turn(message)

    # -- one turn -----------------------------------------------------------------------

    async def run_turn(self, run: RunTurn) -> None:
        state, agent, budget = self.state, self.agent, self.agent.budget
        sid = state.session_id
        turn_id = new_id("turn")
        run.stream.turn_id = turn_id
        ctrl = Batcher(self.controller.inbox, turn_id)
        start_index = len(state.messages)
        state.messages.append(UserMessage(content=run.input))
        a_index = len(state.messages)
        assistant = AssistantMessage()
        state.messages.append(assistant)
        parts: list[Part] = []
        results: dict[str, ToolMessage] = {}
        builder = _PartBuilder(parts)
        usage = Usage()
        step = 0
        tool_calls_used = 0
        finish_reason = "stop"
        error: ErrorInfo | None = None
        abort_reason: str | None = None
        budget_name: str | None = None

        def snapshot(interrupted: bool = False) -> None:
            state.messages[a_index] = AssistantMessage(
                id=assistant.id, content=tuple(parts), interrupted=interrupted
            )

        async def save(step_no: int | None) -> SaveRequest:
            req = SaveRequest(
                session_id=sid,
                turn_id=turn_id,
                start=start_index,
                messages=tuple(state.messages[start_index:]),
                meta={"agent": agent.name, **state.meta},
                step=step_no,
            )
            try:
                await self.persister.inbox.put(req)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                req.error = ActorFailed("the persister is not running; the session was not saved")
                req.done.set()
            return req

        scope = trio.CancelScope()
        if budget.deadline is not None:
            scope.deadline = trio.current_time() + budget.deadline
        run.stream.bind_scope(scope)
        try:
            await ctrl.send(
                TurnBegin(turn_id=turn_id, message_id=assistant.id, consumer=run.consumer)
            )
            await self._announce(
                ev.TurnStarted(session_id=sid, turn_id=turn_id, agent=agent.name, input=run.input),
                agent.hooks.on_turn_start,
            )
            with scope:
                while True:
                    if step >= budget.max_steps:
                        raise _BudgetStop("max_steps")
                    await ctrl.send(StepBegin(step=step))
                    await self._announce(
                        ev.StepStarted(session_id=sid, turn_id=turn_id, step=step),
                        agent.hooks.on_step_start,
                    )
                    result = await self._infer(turn_id, step, parts, builder, ctrl)
                    builder.close()
                    usage = usage + result.usage
                    outcomes: list[ToolOutcome] = []
                    if result.calls:
                        outcomes, tool_calls_used, over = await self._run_tools(
                            turn_id, step, result, tool_calls_used, ctrl
                        )
                        for oc in outcomes:
                            if oc.usage is not None:  # an agent used as a tool spent tokens
                                usage = usage + oc.usage
                        for call in result.calls:  # call order, not completion order
                            oc = next(o for o in outcomes if o.tool_call_id == call.tool_call_id)
                            msg = ToolMessage(
                                tool_call_id=oc.tool_call_id,
                                tool_name=oc.tool_name,
                                step=step,
                                output=oc.output,
                                error=oc.error,
                            )
                            results[call.tool_call_id] = msg
                            state.messages.append(msg)
                    snapshot()
                    await ctrl.send(
                        StepEnd(step=step, finish_reason=result.finish, usage=result.usage)
                    )
                    await self._announce(
                        ev.StepFinished(
                            session_id=sid,
                            turn_id=turn_id,
                            step=step,
                            finish_reason=result.finish,
                            usage=result.usage,
                        ),
                        agent.hooks.on_step_finish,
                    )
                    await self._announce(
                        ev.MessageAdded(
                            session_id=sid,
                            turn_id=turn_id,
                            index=a_index,
                            message=state.messages[a_index],
                        ),
                        agent.hooks.on_message_added,
                    )
                    await save(step)
                    step += 1
                    self._check_tokens(usage)
                    if result.calls and over:
                        raise _BudgetStop("max_tool_calls")
                    if not result.calls:
                        finish_reason = result.finish
                        break
            if scope.cancelled_caught:
                if run.stream.cancel_reason is None and budget.deadline is not None:
                    finish_reason, budget_name = "budget", "deadline"
                else:
                    finish_reason = "aborted"
                    abort_reason = run.stream.cancel_reason or "cancelled"
        except _BudgetStop as stop:
            finish_reason, budget_name = "budget", stop.budget
        except trio.Cancelled:
            finish_reason, abort_reason = "aborted", "host shutdown"
            await self._finish_turn(
                run,
                turn_id,
                parts,
                builder,
                results,
                a_index,
                snapshot,
                save,
                ctrl,
                usage,
                step,
                finish_reason,
                None,
                abort_reason,
                None,
            )
            raise
        except Exception as exc:
            error = _error_info(exc)
            finish_reason = "error"
            self._log.error(
                "turn.failed",
                session_id=sid,
                turn_id=turn_id,
                error=redact(error.message),
                error_kind=error.kind,
            )
        await self._finish_turn(
            run,
            turn_id,
            parts,
            builder,
            results,
            a_index,
            snapshot,
            save,
            ctrl,
            usage,
            step,
            finish_reason,
            error,
            abort_reason,
            budget_name,
        )

    async def _finish_turn(
        self,
        run,
        turn_id,
        parts,
        builder,
        results,
        a_index,
        snapshot,
        save,
        ctrl,
        usage,
        step,
        finish_reason,
        error,
        abort_reason,
        budget_name,
    ) -> None:
        """Close the turn whatever happened: seal parts, pair every call with a result,
        tell the controller, save (shielded, bounded) and hand the result over."""
        state, agent = self.state, self.agent
        with trio.CancelScope(shield=True):
            builder.close()
            cut = error is not None or abort_reason is not None or budget_name == "deadline"
            for part in parts:
                if isinstance(part, ToolCallPart) and part.tool_call_id not in results:
                    msg = ToolMessage(
                        tool_call_id=part.tool_call_id,
                        tool_name=part.tool_name,
                        step=part.step,
                        error=INTERRUPTED,
                    )
                    results[part.tool_call_id] = msg
                    state.messages.append(msg)
            snapshot(interrupted=cut)
            try:
                with trio.move_on_after(SAVE_TIMEOUT):
                    await ctrl.send(
                        TurnEnd(
                            finish_reason=finish_reason,
                            usage=usage,
                            error=error,
                            abort_reason=abort_reason,
                        )
                    )
                final = await save(None)
                with trio.move_on_after(SAVE_TIMEOUT):
                    await final.done.wait()
                if final.error is not None and error is None:
                    error = _error_info(final.error)
                finished = ev.TurnFinished(
                    session_id=state.session_id,
                    turn_id=turn_id,
                    finish_reason=finish_reason,
                    usage=usage,
                    steps=step,
                    error=error,
                    abort_reason=abort_reason,
                )
                with trio.move_on_after(SAVE_TIMEOUT):
                    await self._announce(finished, agent.hooks.on_turn_finish)
            finally:
                run.stream.finish(
                    TurnResult(
                        turn_id=turn_id,
                        finish_reason=finish_reason,
                        usage=usage,
                        steps=step,
                        message=state.messages[a_index],
                        tool_messages=tuple(
                            results[p.tool_call_id] for p in parts if isinstance(p, ToolCallPart)
                        ),
                        error=error,
                        abort_reason=abort_reason,
                        budget=budget_name,
                    )
                )

    # -- one model call ---------------------------------------------------------------

    async def _infer(
        self, turn_id: str, step: int, parts: list[Part], builder: _PartBuilder, ctrl: Batcher
    ) -> _Step:
        policy = self.agent.retry
        attempt = 0
        while True:
            attempt += 1
            result = _Step()
            try:
                await self._call_once(turn_id, step, parts, builder, ctrl, result)
                return result
            except ProviderError as exc:
                delay = None if result.produced else policy.delay(attempt, exc)
                if delay is None:
                    raise
                await self.publish(
                    ev.ProviderRetry(
                        session_id=self.state.session_id,
                        turn_id=turn_id,
                        step=step,
                        attempt=attempt,
                        delay=delay,
                        error=_error_info(exc),
                    )
                )
                self._log.warning(
                    "provider.retry",
                    session_id=self.state.session_id,
                    turn_id=turn_id,
                    step=step,
                    attempt=attempt,
                    delay=delay,
                    error=redact(str(exc)),
                )
                await trio.sleep(delay)

    async def _call_once(
        self,
        turn_id: str,
        step: int,
        parts: list[Part],
        builder: _PartBuilder,
        ctrl: Batcher,
        result: _Step,
    ) -> None:
        state, agent = self.state, self.agent
        request_id = new_id("req")
        await self.engine.send(BeginRequest(request_id=request_id))
        request = InferRequest(
            request_id=request_id,
            session_id=state.session_id,
            turn_id=turn_id,
            step=step,
            instructions=agent.instructions,
            messages=tuple(state.messages),
            tools=agent.tools,
            reply=self.engine.inbox,
            cancel_scope=trio.CancelScope(),
            settings=agent.settings,
        )
        # The in-progress assistant message carries this turn's parts so far.
        request.messages = _with_parts(request.messages, parts)
        await self._ask(self.provider, request)
        inbox = self.stream_inbox
        try:
            while True:
                batch = await inbox.get()
                if not isinstance(batch, Batch) or batch.tag != request_id:
                    continue
                batch.taken = True
                failure: StreamFailed | None = None
                finished = False
                forward: list[Any] = []
                for chunk in batch:
                    t = type(chunk)
                    if t is TextChunk:
                        builder.text(chunk, step)
                        result.produced = True
                    elif t is ReasoningChunk:
                        builder.reasoning(chunk, step)
                        result.produced = True
                    elif t is ToolInputStartChunk:
                        builder.close()
                        result.produced = True
                    elif t is ToolCallChunk:
                        builder.close()
                        parts.append(
                            ToolCallPart(
                                tool_call_id=chunk.tool_call_id,
                                tool_name=chunk.tool_name,
                                input=chunk.input,
                                step=step,
                            )
                        )
                        result.calls.append(chunk)
                        result.produced = True
                    elif t is ProviderDataChunk:
                        builder.close()
                        parts.append(
                            ProviderDataPart(provider=chunk.provider, data=chunk.data, step=step)
                        )
                        result.produced = True
                    elif t is UsageChunk:
                        result.usage = chunk.usage
                    elif t is FinishChunk:
                        result.finish, result.raw_finish = chunk.reason, chunk.raw_reason
                        finished = True
                    elif t is StreamFailed:
                        failure = chunk
                        continue
                    forward.append(chunk)
                if forward:
                    await ctrl.send_all(forward)
                if failure is not None:
                    builder.close()
                    raise failure.error
                if finished:
                    return
        finally:
            request.cancel_scope.cancel()

    # -- tools --------------------------------------------------------------------------

    async def _run_tools(
        self, turn_id: str, step: int, result: _Step, used: int, ctrl: Batcher
    ) -> tuple[list[ToolOutcome], int, bool]:
        """Run (or refuse) the step's calls; stream each outcome as it completes."""
        agent, budget, sid = self.agent, self.agent.budget, self.state.session_id
        outcomes: list[ToolOutcome] = []
        runnable: list[ToolCallSpec] = []
        over = False
        for call in result.calls:
            await self._announce(
                ev.ToolCallRequested(
                    session_id=sid,
                    turn_id=turn_id,
                    step=step,
                    tool_call_id=call.tool_call_id,
                    tool_name=call.tool_name,
                    input=call.input,
                ),
                agent.hooks.on_tool_call,
            )
            refusal: str | None = None
            if result.finish not in RUNNABLE_FINISH:
                refusal = (
                    f"the tool call was not executed: the response ended with {result.finish!r} "
                    "(its input may be truncated)"
                )
            elif call.input_error is not None:
                refusal = call.input_error
            elif budget.max_tool_calls is not None and used >= budget.max_tool_calls:
                refusal = (
                    "the tool call was not executed: budget "
                    f"max_tool_calls={budget.max_tool_calls} reached"
                )
                over = True
            if refusal is not None:
                outcomes.append(
                    ToolOutcome(
                        tool_call_id=call.tool_call_id, tool_name=call.tool_name, error=refusal
                    )
                )
            else:
                used += 1
                runnable.append(
                    ToolCallSpec(
                        tool_call_id=call.tool_call_id, tool_name=call.tool_name, input=call.input
                    )
                )
        for oc in outcomes:
            await self._tool_done(turn_id, step, oc, ctrl)
        if runnable:
            inbox = self.tool_inbox
            request = ExecuteTools(
                session_id=sid,
                turn_id=turn_id,
                step=step,
                calls=tuple(runnable),
                tools=agent.tool_map,
                default_timeout=budget.tool_timeout,
                max_result_chars=budget.max_tool_result_chars,
                reply=inbox,
                cancel_scope=trio.CancelScope(),
                host=self.host,
            )
            await self._ask(self.tool_executor, request)
            pending = {c.tool_call_id for c in runnable}
            try:
                while pending:
                    oc = await inbox.get()
                    if type(oc) is ToolProgress:
                        if oc.tool_call_id in pending:
                            await ctrl.send(ToolStreamed(step=step, progress=oc))
                        continue
                    if not isinstance(oc, ToolOutcome) or oc.tool_call_id not in pending:
                        continue  # a late outcome of a cancelled earlier request
                    pending.discard(oc.tool_call_id)
                    outcomes.append(oc)
                    await self._tool_done(turn_id, step, oc, ctrl)
            finally:
                request.cancel_scope.cancel()
        return outcomes, used, over

    async def _tool_done(self, turn_id: str, step: int, oc: ToolOutcome, ctrl: Batcher) -> None:
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

    def _check_tokens(self, usage: Usage) -> None:
        b = self.agent.budget
        if b.max_input_tokens is not None and usage.input_tokens > b.max_input_tokens:
            raise _BudgetStop("max_input_tokens")
        if b.max_output_tokens is not None and usage.output_tokens > b.max_output_tokens:
            raise _BudgetStop("max_output_tokens")
        if b.max_total_tokens is not None and usage.total_tokens > b.max_total_tokens:
            raise _BudgetStop("max_total_tokens")

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


def _with_parts(messages: tuple[Any, ...], parts: list[Part]) -> tuple[Any, ...]:
    """The history with the turn's assistant message showing ``parts`` (its snapshot is
    only refreshed at step boundaries)."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if isinstance(msg, UserMessage):
            return messages
        if isinstance(msg, AssistantMessage):
            if len(msg.content) == len(parts):
                return messages
            updated = AssistantMessage(id=msg.id, content=tuple(parts), interrupted=msg.interrupted)
            return (*messages[:i], updated, *messages[i + 1 :])
    return messages


def _error_info(exc: BaseException) -> ErrorInfo:
    if isinstance(exc, AxonError):
        return ErrorInfo(kind=exc.kind, message=str(exc) or exc.kind, retryable=exc.retryable)
    return ErrorInfo(
        kind=type(exc).__name__, message=str(exc) or type(exc).__name__, retryable=False
    )
