"""``MetricsActor``: per-session counters built from bus events only."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import trio

from runtime.actor import Actor
from runtime.events import StepFinished, ToolCallCompleted, TurnFinished, TurnStarted
from runtime.inbox import OverflowPolicy


@attrs.define(kw_only=True)
class SessionMetrics:
    turns: int = 0
    steps: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cost: float = 0.0
    """US dollars of the steps whose cost is known (:attr:`Usage.cost
    <runtime.chunks.Usage.cost>`)."""
    unpriced_steps: int = 0
    """Steps with tokens whose cost is unknown: :attr:`cost` leaves them out."""
    turn_latencies: list[float] = attrs.field(factory=list)
    """Seconds from ``turn.started`` to ``turn.finished``, per turn (Trio clock): the
    latest :attr:`MetricsActor.max_latencies` of them (:attr:`turns` counts them all)."""


class MetricsActor(Actor):
    subscribes_to: ClassVar[Any] = (TurnStarted, TurnFinished, StepFinished, ToolCallCompleted)
    overflow: ClassVar[OverflowPolicy] = "drop-oldest"
    inbox_capacity = 4096

    def __init__(
        self, *, name: str = "metrics", max_sessions: int = 10_000, max_latencies: int = 1000
    ) -> None:
        """``max_sessions``: the sessions kept, the least recently active forgotten past
        it; ``max_latencies``: the turn latencies kept per session, the oldest dropped.
        A long-running ``serve`` sees sessions without end: unbounded, the counters grew
        with every session the process ever ran."""
        super().__init__(name=name)
        if max_sessions < 1 or max_latencies < 1:
            raise ValueError("max_sessions and max_latencies must be at least 1")
        self.max_sessions = max_sessions
        self.max_latencies = max_latencies
        self.sessions: dict[str, SessionMetrics] = {}
        """Per session, least recently active first."""
        self._started: dict[str, float] = {}

    def for_session(self, session_id: str) -> SessionMetrics:
        """The session's counters, made the most recently active (a new one may push the
        least recently active session out)."""
        metrics = self.sessions.pop(session_id, None)
        if metrics is None:
            metrics = SessionMetrics()
            if len(self.sessions) >= self.max_sessions:
                del self.sessions[next(iter(self.sessions))]
        self.sessions[session_id] = metrics
        return metrics

    async def handle(self, event: Any) -> None:
        if not hasattr(event, "session_id") or event.session_id is None:
            return
        m = self.for_session(event.session_id)
        if isinstance(event, TurnStarted):
            if len(self._started) >= self.max_sessions:  # finishes the inbox dropped
                del self._started[next(iter(self._started))]
            self._started[event.turn_id] = trio.current_time()
        elif isinstance(event, TurnFinished):
            m.turns += 1
            start = self._started.pop(event.turn_id, None)
            if start is not None:
                m.turn_latencies.append(trio.current_time() - start)
                if len(m.turn_latencies) > self.max_latencies:
                    del m.turn_latencies[0]
        elif isinstance(event, StepFinished):
            m.steps += 1
            m.input_tokens += event.usage.input_tokens
            m.output_tokens += event.usage.output_tokens
            m.total_tokens += event.usage.total_tokens
            if event.usage.cost is not None:
                m.cost += event.usage.cost
            elif not event.usage.empty:
                m.unpriced_steps += 1
        elif isinstance(event, ToolCallCompleted):
            m.tool_calls += 1
            m.tool_errors += event.error is not None
