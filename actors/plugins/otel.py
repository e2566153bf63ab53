"""``OpenTelemetryActor``: bus events as OpenTelemetry spans (GenAI semantic conventions).

An observer like any other plug-in: it subscribes with ``drop-oldest`` (tracing never
stalls an agent) and builds, per turn, the span tree the GenAI conventions describe::

    invoke_agent {agent}            one per turn (a sub-agent's turn nests under the
    ├── chat {model}                parent's execute_tool span); one per model call
    ├── execute_tool {tool}         one per tool call
    └── chat {model}

with token usage, finish reasons, errors (``error.type`` and status ``ERROR``) and aborts
(``axon.turn.aborted``). A turn that suspends for input (docs/approval.md) ends its span
there, status OK, with ``axon.turn.awaiting_input`` and an ``axon.turn.suspended`` event
(each approval asked is an ``axon.approval.requested`` event before it); its
continuation is a new ``invoke_agent`` span (``axon.turn.resumed``) with a span *link*
to the suspended one, and the decisions recorded meanwhile as its first events
(``axon.approval.decided``, ``axon.approval.expired``). A wait holds no span open: the
link is how a trace viewer joins the two, however long the wait (within one process:
the actor remembers the last :data:`SUSPENDED_KEPT` suspended spans; across processes
and restarts, the suspension stores the span's trace and span ids with the session,
:data:`runtime.approval.SUSPENDED_TRACE_META`, and the continuation links to those).

The actor handles events after the fact, so spans are never "current": each is started
and ended with explicit times. Events carry no clock, so the actor's inbox stamps each
one the moment it is published (:class:`_StampingInbox`).

OpenTelemetry is an optional dependency (``pip install 'axon-runtime[otel]'``), imported
only when an actor is created: ``import actors.plugins`` does not import it. Error texts
go through :func:`runtime.redact.redact` before they become span data; tool arguments
and results are recorded only with ``capture_content=True`` (the conventions make them
opt-in because they may hold personal data), redacted too. structlog logging is
unaffected: this is one more observer beside the log tap.
"""

from __future__ import annotations

import atexit
import functools
import re
import threading
import time
from collections import OrderedDict
from typing import Any, ClassVar

import attrs
import trio

from actors.plugins.otel_export import build_tracer_provider, import_otel
from runtime.actor import Actor
from runtime.chunks import Usage
from runtime.errors import ConfigurationError
from runtime.events import (
    Lagged,
    ProviderFallback,
    ProviderRetry,
    StepFinished,
    StepStarted,
    ToolApprovalDecided,
    ToolApprovalExpired,
    ToolApprovalRequested,
    ToolCallCompleted,
    ToolCallRequested,
    TraceContext,
    TurnFinished,
    TurnStarted,
    TurnSteered,
)
from runtime.inbox import Inbox, OverflowPolicy
from runtime.redact import redact, redacted_str
from runtime.serde import dumps

# Attribute names of the GenAI semantic conventions (checked against the installed
# ``opentelemetry-semantic-conventions`` package by tests/test_otel.py). Kept as plain
# strings: that package marks its gen_ai module as moved to a separate repository.
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
AXON_PROVIDER = "axon.provider"
"""The provider's registry name, where it differs from ``gen_ai.provider.name``."""

GENAI_PROVIDERS = {
    "openai-responses": "openai",
    "google": "gcp.gemini",
    "anthropic-vertex": "gcp.vertex_ai",
    "anthropic-bedrock": "aws.bedrock",
}
"""Registry names whose ``gen_ai.provider.name`` is another: the conventions name the
vendor (``openai``), whichever of its APIs is called, and the platform a model is served
from (``gcp.gemini`` for the Gemini API, ``gcp.vertex_ai``, ``aws.bedrock``); the
registry name stays in :data:`AXON_PROVIDER`."""


def provider_attributes(provider: str) -> dict[str, str]:
    """``gen_ai.provider.name`` for the registry name ``provider`` (and ``axon.provider``
    when the two differ)."""
    name = GENAI_PROVIDERS.get(provider, provider)
    return (
        {PROVIDER_NAME: name}
        if name == provider
        else {PROVIDER_NAME: name, AXON_PROVIDER: provider}
    )


USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION = "gen_ai.usage.cache_creation.input_tokens"
USAGE_REASONING = "gen_ai.usage.reasoning.output_tokens"
USAGE_COST = "axon.usage.cost"
"""What the usage cost in US dollars (:attr:`Usage.cost <runtime.chunks.Usage.cost>`);
left out when unknown. The conventions define no cost attribute: Axon's own name."""
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"

TRACER_NAME = "axon.runtime"
SUSPENDED_KEPT = 10_000
"""Suspended turn spans the actor remembers, to link their continuations to (the oldest
are forgotten first: a continuation after that starts unlinked, ``axon.turn.resumed``
still set)."""
AWAITING_INPUT = "awaiting-input"
FLUSH_TIMEOUT = 5.0
"""Seconds the actor waits, when it ends, for the exporter to send what is buffered."""
_TOOL_RAISED = re.compile(r"^tool \S+ raised (\w+):")
FINISH_REASONS = {
    "stop": "stop",
    "tool-calls": "tool_call",
    "length": "length",
    "content-filter": "content_filter",
    "error": "error",
}
"""Axon's unified finish reasons in the conventions' words (others pass through)."""


class _StampingInbox(Inbox):
    """An inbox that pairs each message with the wall-clock time (ns) it was put in.

    :meth:`runtime.bus.Bus.publish` puts an event into every subscriber's inbox
    synchronously, so this is the moment the event was published, however long the
    actor takes to get to it.
    """

    __slots__ = ()

    async def put(self, message: Any) -> None:
        await super().put((time.time_ns(), message))

    def put_nowait(self, message: Any) -> None:
        super().put_nowait((time.time_ns(), message))


@attrs.define(slots=True, eq=False)
class _Chat:
    span: Any
    done_ns: int | None = None
    """When the model call ended (its first tool call was announced), if before the step."""


@attrs.define(slots=True, eq=False)
class _Turn:
    span: Any
    session_id: str
    agent: str
    provider: str | None
    model: str | None
    chats: dict[int, _Chat] = attrs.field(factory=dict)
    tools: dict[str, Any] = attrs.field(factory=dict)
    incomplete: bool = False
    """Events of this turn may have been dropped (the actor lagged)."""
    resumed: bool = False
    """The continuation of a turn that waited (or one taken over): its approved calls'
    ``execute_tool`` spans are made from their completion (they were asked before)."""


@attrs.define(slots=True, eq=False)
class _Suspended:
    """A turn span that ended waiting for input: what its continuation links to, and
    the decisions recorded meanwhile (``(time, event)``), for the continuation's span."""

    context: Any
    decisions: list[tuple[int, Any]] = attrs.field(factory=list)


class OpenTelemetryActor(Actor):
    """Turns bus events into OpenTelemetry spans; see the module docstring.

    ``tracer_provider``: where spans go; ``None`` uses the global provider
    (``opentelemetry.trace.set_tracer_provider``), so an application that already set up
    OpenTelemetry just starts this actor. :func:`build_tracer_provider` makes one from the
    standard ``OTEL_*`` environment variables (what ``--otel`` does).
    ``capture_content``: also record tool call arguments and results (redacted).
    """

    subscribes_to: ClassVar[Any] = (
        TurnStarted,
        TurnFinished,
        StepStarted,
        StepFinished,
        ToolCallRequested,
        ToolCallCompleted,
        ProviderRetry,
        ProviderFallback,
        ToolApprovalRequested,
        ToolApprovalDecided,
        ToolApprovalExpired,
        TurnSteered,
    )
    """(The inbox itself hands the actor a :class:`Lagged` notice when it dropped events.)"""
    overflow: ClassVar[OverflowPolicy] = "drop-oldest"
    inbox_capacity = 4096

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        capture_content: bool = False,
        name: str = "otel",
    ) -> None:
        super().__init__(name=name)
        self.inbox = _StampingInbox(self.inbox_capacity, self.overflow, name=self.name)
        trace = import_otel()
        self._trace = trace
        self.tracer_provider = tracer_provider or trace.get_tracer_provider()
        self.tracer = self.tracer_provider.get_tracer(TRACER_NAME)
        self.capture_content = capture_content
        self.dropped = 0
        """Events this actor missed because it lagged (their spans may be incomplete)."""
        self._turns: dict[str, _Turn] = {}
        self._session_turn: dict[str, str] = {}
        self._tool_spans: dict[str, Any] = {}
        """Open execute_tool spans by call id: where a sub-agent's turn nests."""
        self._suspended: OrderedDict[str, _Suspended] = OrderedDict()
        """Turn spans that ended waiting for input, by turn id, oldest first."""

    # -- actor plumbing ----------------------------------------------------------------

    async def run(self) -> None:
        """Handle events; when cancelled (the host is closing) or stopped, first record
        what is still queued, end every open span, and flush the exporter. While it
        runs, the interpreter's exit does the same (:meth:`_end_at_exit`)."""
        at_exit = functools.partial(self._end_at_exit, trio.lowlevel.current_trio_token())
        atexit.register(at_exit)
        try:
            try:
                await super().run()
            except trio.Cancelled:
                with trio.CancelScope(shield=True):
                    await self._close()
                raise
            await self._close()
        finally:
            atexit.unregister(at_exit)

    async def handle(self, message: Any) -> None:
        self.record(message)

    def record(self, message: Any) -> None:
        """Apply one (stamped) event to the open spans. Synchronous: never yields."""
        if type(message) is tuple:
            now, event = message
        else:  # a Lagged notice the inbox made itself
            now, event = time.time_ns(), message
        kind = type(event)
        if kind is StepStarted:
            self._step_started(event, now)
        elif kind is StepFinished:
            self._step_finished(event, now)
        elif kind is ToolCallRequested:
            self._tool_requested(event, now)
        elif kind is ToolCallCompleted:
            self._tool_completed(event, now)
        elif kind is TurnStarted:
            self._turn_started(event, now)
        elif kind is TurnFinished:
            self._turn_finished(event, now)
        elif kind is ProviderRetry:
            self._provider_retry(event, now)
        elif kind is ProviderFallback:
            self._provider_fallback(event, now)
        elif kind is ToolApprovalRequested:
            self._approval_requested(event, now)
        elif kind is ToolApprovalDecided or kind is ToolApprovalExpired:
            self._approval_decided(event, now)
        elif kind is TurnSteered:
            self._steered(event, now)
        elif kind is Lagged:
            self.dropped += event.dropped
            for turn in self._turns.values():
                turn.incomplete = True

    async def _close(self) -> None:
        self._end_open()
        flush = getattr(self.tracer_provider, "force_flush", None)
        if flush is not None:
            with trio.move_on_after(FLUSH_TIMEOUT):
                millis = int(FLUSH_TIMEOUT * 1000)
                await trio.to_thread.run_sync(lambda: flush(millis), abandon_on_cancel=True)

    def _end_open(self) -> None:
        """Record what is still queued, then end every open turn's spans, incomplete."""
        while True:
            try:
                self.record(self.inbox.get_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
        now = time.time_ns()
        for turn_id in list(self._turns):
            turn = self._turns[turn_id]
            turn.incomplete = True
            self._end_turn(turn_id, now)

    def _end_at_exit(self, token: trio.lowlevel.TrioToken) -> None:
        """The interpreter exits while this actor still runs: its host's Trio run is on a
        thread of its own that nothing closed (an :class:`~runtime.app.aio.AsyncHost`
        left open), which exit stops where it is. The spans of the turns still open are
        ended (``axon.trace.incomplete``) on that run's thread and flushed, each for at
        most :data:`FLUSH_TIMEOUT`: before, they were never ended, so never exported, and
        the trace lacked the very turns the exit cut. (Runs before the SDK provider's own
        exit hook, registered earlier, which exports them if this flush could not.)"""
        ended = threading.Event()

        def end() -> None:
            try:
                self._end_open()
            finally:
                ended.set()

        try:
            token.run_sync_soon(end)
        except trio.RunFinishedError:
            return
        if not ended.wait(FLUSH_TIMEOUT):
            return
        flush = getattr(self.tracer_provider, "force_flush", None)
        if flush is not None:
            flush(int(FLUSH_TIMEOUT * 1000))

    # -- turns -------------------------------------------------------------------------

    def _turn_started(self, event: TurnStarted, now: int) -> None:
        stale = self._session_turn.get(event.session_id)
        if stale is not None and stale in self._turns:  # its turn.finished was dropped
            self._turns[stale].incomplete = True
            self._end_turn(stale, now)
        trace = self._trace
        parent = self._tool_spans.get(event.causation_id) if event.causation_id else None
        context = trace.set_span_in_context(parent) if parent is not None else _root_context()
        attributes: dict[str, Any] = {
            OPERATION_NAME: "invoke_agent",
            AGENT_NAME: event.agent,
            CONVERSATION_ID: event.session_id,
            "axon.turn.id": event.turn_id,
        }
        if event.provider:
            attributes.update(provider_attributes(event.provider))
        if event.model:
            attributes[REQUEST_MODEL] = event.model
        suspended = self._suspended.pop(event.turn_id, None)
        links = []
        if event.resumed:
            attributes["axon.turn.resumed"] = True
            waited = suspended.context if suspended is not None else None
            if waited is None:  # suspended in another process, or before a restart
                waited = _stored_context(trace, event.suspended_trace)
            if waited is not None:  # the wait it goes on from
                links.append(trace.Link(waited, {"axon.link.type": "resumes"}))
        span = self.tracer.start_span(
            f"invoke_agent {event.agent}",
            context=context,
            kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=now,
        )
        if event.resumed and suspended is not None:
            for at, decided in suspended.decisions:
                span.add_event(*_decision_event(decided), timestamp=at)
        context = span.get_span_context()
        if context.is_valid and self.bus is not None:  # stored with its suspension, if any
            self.bus.trace_contexts[event.turn_id] = {
                "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}",
            }
        self._turns[event.turn_id] = _Turn(
            span=span,
            session_id=event.session_id,
            agent=event.agent,
            provider=event.provider,
            model=event.model,
            resumed=event.resumed,
        )
        self._session_turn[event.session_id] = event.turn_id

    def _turn_finished(self, event: TurnFinished, now: int) -> None:
        turn = self._turns.get(event.turn_id)
        if turn is None:
            return
        span = turn.span
        span.set_attribute("axon.turn.finish_reason", event.finish_reason)
        span.set_attribute("axon.turn.steps", event.steps)
        _set_usage(span, event.usage)
        if event.budget is not None:
            span.set_attribute("axon.turn.budget", event.budget)
        error_type = message = None
        if event.error is not None:
            error_type, message = event.error.kind, redact(event.error.message)
        elif event.finish_reason == "error":
            error_type, message = "_OTHER", "the turn failed"
        elif event.finish_reason == AWAITING_INPUT:
            self._suspend(event.turn_id, turn, now)
        self._end_turn(
            event.turn_id,
            now,
            error_type=error_type,
            message=message,
            abort_reason=event.abort_reason if event.finish_reason == "aborted" else None,
        )

    def _end_turn(
        self,
        turn_id: str,
        now: int,
        *,
        error_type: str | None = None,
        message: str | None = None,
        abort_reason: str | None = None,
    ) -> None:
        """End the turn's span and every child still open: a failure or an abort marks
        them all, since it is what cut them short."""
        turn = self._turns.pop(turn_id)
        if self.bus is not None:
            self.bus.trace_contexts.pop(turn_id, None)
        if self._session_turn.get(turn.session_id) == turn_id:
            del self._session_turn[turn.session_id]
        children = [chat.span for chat in turn.chats.values()]
        children += list(turn.tools.values())
        for span in [*children, turn.span]:
            if abort_reason is not None:
                span.set_attribute("axon.turn.aborted", True)
                span.set_attribute("axon.turn.abort_reason", redact(abort_reason))
            if error_type is not None:
                self._fail(span, error_type, message)
            if turn.incomplete:
                span.set_attribute("axon.trace.incomplete", True)
        for step in sorted(turn.chats):
            chat = turn.chats[step]
            chat.span.end(end_time=chat.done_ns or now)
        for call_id, span in turn.tools.items():
            span.end(end_time=now)
            self._tool_spans.pop(call_id, None)
        turn.span.end(end_time=now)

    def _suspend(self, turn_id: str, turn: _Turn, now: int) -> None:
        """The turn waits for input: its span ends here, status OK (a wait is no error),
        and is remembered for the continuation to link to. Its held calls' tool spans
        end with it, marked waiting (they run, if approved, in the continuation)."""
        span = turn.span
        span.set_attribute("axon.turn.awaiting_input", True)
        span.add_event(
            "axon.turn.suspended", attributes={"axon.turn.waiting": len(turn.tools)}, timestamp=now
        )
        span.set_status(self._trace.Status(self._trace.StatusCode.OK))
        for tool_span in turn.tools.values():
            tool_span.set_attribute("axon.tool.awaiting_input", True)
        self._suspended[turn_id] = _Suspended(context=span.get_span_context())
        self._suspended.move_to_end(turn_id)
        while len(self._suspended) > SUSPENDED_KEPT:
            self._suspended.popitem(last=False)

    def _approval_requested(self, event: ToolApprovalRequested, now: int) -> None:
        turn = self._turns.get(event.turn_id)
        if turn is None:
            return
        turn.span.add_event(
            "axon.approval.requested",
            attributes={
                TOOL_NAME: event.tool_name,
                TOOL_CALL_ID: event.tool_call_id,
                "axon.approval.id": event.causation_id or "",
            },
            timestamp=now,
        )

    def _approval_decided(self, event: ToolApprovalDecided | ToolApprovalExpired, now: int) -> None:
        """A decision (or an expiry) for a suspended turn: kept for its continuation's
        span (none is open meanwhile)."""
        suspended = self._suspended.get(event.turn_id or "")
        if suspended is not None:
            suspended.decisions.append((now, event))

    def _steered(self, event: TurnSteered, now: int) -> None:
        turn = self._turns.get(event.turn_id)
        if turn is not None:
            turn.span.add_event(
                "axon.turn.steered",
                attributes={"axon.step": event.step, "axon.message.id": event.message_id},
                timestamp=now,
            )

    # -- model calls -------------------------------------------------------------------

    def _step_started(self, event: StepStarted, now: int) -> None:
        turn = self._turns.get(event.turn_id)
        if turn is None:
            return
        trace = self._trace
        attributes: dict[str, Any] = {
            OPERATION_NAME: "chat",
            CONVERSATION_ID: turn.session_id,
            "axon.step": event.step,
        }
        if turn.provider:
            attributes.update(provider_attributes(turn.provider))
        if turn.model:
            attributes[REQUEST_MODEL] = turn.model
        span = self.tracer.start_span(
            f"chat {turn.model}" if turn.model else "chat",
            context=trace.set_span_in_context(turn.span),
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
            start_time=now,
        )
        turn.chats[event.step] = _Chat(span=span)

    def _step_finished(self, event: StepFinished, now: int) -> None:
        turn = self._turns.get(event.turn_id)
        chat = turn.chats.pop(event.step, None) if turn is not None else None
        if chat is None:
            return
        _set_usage(chat.span, event.usage)
        reason = FINISH_REASONS.get(event.finish_reason, event.finish_reason)
        chat.span.set_attribute(RESPONSE_FINISH_REASONS, [reason])
        chat.span.end(end_time=chat.done_ns or now)

    def _provider_retry(self, event: ProviderRetry, now: int) -> None:
        turn = self._turns.get(event.turn_id)
        chat = turn.chats.get(event.step) if turn is not None else None
        if chat is None:
            return
        chat.span.add_event(
            "axon.provider.retry",
            attributes={
                "axon.retry.attempt": event.attempt,
                "axon.retry.delay": event.delay,
                ERROR_TYPE: event.error.kind,
            },
            timestamp=now,
        )

    def _provider_fallback(self, event: ProviderFallback, now: int) -> None:
        """The turn goes on with another provider: an event on the step's chat span,
        which (like the turn's later ones) names that provider and model from now on."""
        turn = self._turns.get(event.turn_id)
        if turn is None:
            return
        turn.provider, turn.model = event.provider or turn.provider, event.model
        chat = turn.chats.get(event.step)
        if chat is None:
            return
        chat.span.add_event(
            "axon.provider.fallback",
            attributes={
                "axon.fallback.from": event.from_provider,
                "axon.fallback.to": event.to_provider,
                ERROR_TYPE: event.error.kind,
            },
            timestamp=now,
        )
        if turn.provider:
            chat.span.set_attributes(provider_attributes(turn.provider))
        if turn.model:
            chat.span.set_attribute(REQUEST_MODEL, turn.model)
            chat.span.update_name(f"chat {turn.model}")

    # -- tool calls --------------------------------------------------------------------

    def _tool_requested(self, event: ToolCallRequested, now: int) -> None:
        turn = self._turns.get(event.turn_id)
        if turn is None:
            return
        chat = turn.chats.get(event.step)
        if chat is not None and chat.done_ns is None:
            chat.done_ns = now  # tools are announced once the model call has ended
        trace = self._trace
        attributes: dict[str, Any] = {
            OPERATION_NAME: "execute_tool",
            TOOL_NAME: event.tool_name,
            TOOL_CALL_ID: event.tool_call_id,
            TOOL_TYPE: "function",
            CONVERSATION_ID: turn.session_id,
            "axon.step": event.step,
        }
        if self.capture_content:
            attributes[TOOL_CALL_ARGUMENTS] = _json(event.input)
        span = self.tracer.start_span(
            f"execute_tool {event.tool_name}",
            context=trace.set_span_in_context(turn.span),
            kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
            start_time=now,
        )
        turn.tools[event.tool_call_id] = span
        self._tool_spans[event.tool_call_id] = span

    def _tool_completed(self, event: ToolCallCompleted, now: int) -> None:
        turn = self._turns.get(event.turn_id)
        span: Any = turn.tools.pop(event.tool_call_id, None) if turn is not None else None
        if span is None and turn is not None and turn.resumed:
            span = self._resumed_tool_span(turn, event, now)
        if span is None:
            return
        if self._tool_spans.get(event.tool_call_id) is span:
            del self._tool_spans[event.tool_call_id]
        if event.error is not None:
            raised = _TOOL_RAISED.match(event.error)
            self._fail(span, raised.group(1) if raised else "tool_error", redact(event.error))
        elif self.capture_content:
            span.set_attribute(TOOL_CALL_RESULT, _json(event.output))
        span.end(end_time=now)

    def _resumed_tool_span(self, turn: _Turn, event: ToolCallCompleted, now: int) -> Any:
        """The ``execute_tool`` span of a call a continuation ran (approved while the
        turn waited: it was asked, and its span ended, before the wait)."""
        trace = self._trace
        start = now - int(event.duration * 1e9)
        return self.tracer.start_span(
            f"execute_tool {event.tool_name}",
            context=trace.set_span_in_context(turn.span),
            kind=trace.SpanKind.INTERNAL,
            attributes={
                OPERATION_NAME: "execute_tool",
                TOOL_NAME: event.tool_name,
                TOOL_CALL_ID: event.tool_call_id,
                TOOL_TYPE: "function",
                CONVERSATION_ID: turn.session_id,
                "axon.step": event.step,
            },
            start_time=max(start, 0),
        )

    # -- helpers -----------------------------------------------------------------------

    def _fail(self, span: Any, error_type: str, message: str | None) -> None:
        span.set_attribute(ERROR_TYPE, error_type)
        span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, message))


def _set_usage(span: Any, usage: Usage) -> None:
    span.set_attribute(USAGE_INPUT_TOKENS, usage.input_tokens)
    span.set_attribute(USAGE_OUTPUT_TOKENS, usage.output_tokens)
    for key, value in (
        (USAGE_CACHE_READ, usage.cache_read),
        (USAGE_CACHE_CREATION, usage.cache_write),
        (USAGE_REASONING, usage.reasoning_tokens),
        (USAGE_COST, usage.cost),
    ):
        if value is not None:
            span.set_attribute(key, value)


def _json(value: Any) -> str:
    """Tool content as JSON text, credentials redacted (span attributes are flat)."""
    try:
        return dumps(redact(value), default=redacted_str, marked=False).decode()
    except TypeError:
        return redacted_str(value)


def _decision_event(event: ToolApprovalDecided | ToolApprovalExpired) -> tuple[str, dict]:
    """The span event (name, attributes) of a decision recorded while a turn waited."""
    attributes: dict[str, Any] = {TOOL_CALL_ID: event.tool_call_id}
    if event.causation_id:
        attributes["axon.approval.id"] = event.causation_id
    if event.reason is not None:
        attributes["axon.approval.reason"] = redact(event.reason)
    if isinstance(event, ToolApprovalExpired):
        return "axon.approval.expired", attributes
    attributes["axon.approval.approved"] = event.approved
    return "axon.approval.decided", attributes


def _root_context() -> Any:
    """An empty context: a turn with no parent starts its own trace, whatever span
    happens to be current in the task that started the actor."""
    from opentelemetry.context import Context

    return Context()


# -- the ``otel`` plug-in ---------------------------------------------------------------

CAPTURE_CONTENT = "capture-content"
"""The ``otel`` plug-in's one option: record tool arguments and results on the spans."""


def otel_plugin(options: str | None = None) -> OpenTelemetryActor:
    """The ``otel`` plug-in (``--plugin otel``, ``--otel``): an actor exporting to what
    the ``OTEL_*`` variables name (:func:`build_tracer_provider`);
    ``--plugin otel:capture-content`` also records tool arguments and results."""
    if options not in (None, "", CAPTURE_CONTENT):
        raise ConfigurationError(
            f"plug-in 'otel' takes no option but {CAPTURE_CONTENT!r}, not {options!r} "
            "(the OTEL_* variables configure the export: docs/telemetry.md)"
        )
    return OpenTelemetryActor(
        tracer_provider=build_tracer_provider(), capture_content=options == CAPTURE_CONTENT
    )


__all__ = ["OpenTelemetryActor", "build_tracer_provider", "otel_plugin"]


def _stored_context(trace: Any, stored: TraceContext | None) -> Any:
    """The span context a suspension stored (hex ids), as a remote one to link to;
    ``None`` when there is none or it does not parse."""
    if stored is None:
        return None
    try:
        context = trace.SpanContext(
            trace_id=int(stored.trace_id, 16),
            span_id=int(stored.span_id, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
    except (KeyError, TypeError, ValueError):
        return None
    return context if context.is_valid else None
