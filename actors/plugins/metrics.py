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
    """Seconds from ``turn.started`` to ``turn.finished``, per turn (Trio clock)."""


class MetricsActor(Actor):
    subscribes_to: ClassVar[Any] = (TurnStarted, TurnFinished, StepFinished, ToolCallCompleted)
    overflow: ClassVar[OverflowPolicy] = "drop-oldest"
    inbox_capacity = 4096

    def __init__(self, *, name: str = "metrics") -> None:
        super().__init__(name=name)
        self.sessions: dict[str, SessionMetrics] = {}
        self._started: dict[str, float] = {}

    def for_session(self, session_id: str) -> SessionMetrics:
        return self.sessions.setdefault(session_id, SessionMetrics())

    async def handle(self, event: Any) -> None:
        if not hasattr(event, "session_id") or event.session_id is None:
            return
        m = self.for_session(event.session_id)
        if isinstance(event, TurnStarted):
            self._started[event.turn_id] = trio.current_time()
        elif isinstance(event, TurnFinished):
            m.turns += 1
            start = self._started.pop(event.turn_id, None)
            if start is not None:
                m.turn_latencies.append(trio.current_time() - start)
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
