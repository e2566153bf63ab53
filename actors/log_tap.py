"""The log tap: every bus event it is given becomes one structlog JSON line.

Each line has ``event`` (the kind) and the correlation ids ``session_id``, ``turn_id``,
``step``, ``part_id``, ``seq`` and ``causation_id`` when the event has them. Deltas are
logged at debug level, and so are the output chunks that only frame the stream (start,
step, part and finish chunks: the lifecycle events ``turn.*`` and ``step.*`` say the
same at info, so an info log had every turn twice, twelve lines where six tell it,
issue 24) and a ``tool-approval-request`` chunk (``tool.approval-requested`` says it all
at info, issue 21); when debug is off the tap does not even subscribe to them, so a chunk
that is not logged costs nothing. Its inbox is ``drop-oldest``: a slow log sink
makes the tap lag (and say so), never an agent wait.

Every line is redacted exactly once: by the logger's own processors when they redact
(those of :func:`runtime.configure_logging` do, for every line whoever logs it), else by
the tap itself (a logger of the application's, structlog's defaults, ``capture_logs``).
Redacting in both places was a third of each line's cost (issue 24).
"""

from __future__ import annotations

from typing import Any, ClassVar

from runtime.actor import Actor
from runtime.events import LIFECYCLE_EVENT_TYPES, ActorCrashed, ActorGaveUp, Lagged
from runtime.inbox import OverflowPolicy
from runtime.logging import get_logger, level_enabled
from runtime.media import elide_media
from runtime.output import (
    DELTA_TYPES,
    OUTPUT_CHUNK_TYPES,
    Error,
    Finish,
    ReasoningFinish,
    ReasoningStart,
    Start,
    StepFinish,
    StepStart,
    TextFinish,
    TextStart,
    ToolApprovalRequest,
)
from runtime.redact import redact, redact_processor
from runtime.serde import converter

_WARN = (ActorCrashed, Lagged)
_ERROR = (ActorGaveUp, Error)
_FRAMES = (Start, StepStart, TextStart, TextFinish, ReasoningStart, ReasoningFinish, StepFinish)
_RESTATED = (ToolApprovalRequest,)
"""Output chunks whose every field a lifecycle event logged at info carries too: a
``tool-approval-request`` chunk (step, call id, tool name, approval id) says what the
``tool.approval-requested`` line says (with the approval id as its ``causation_id``, and
the call's input besides). One line per approval asked, not two (issue 21: a suspended
turn's extra lines were a fifth of what it costs over a plain turn)."""
DEBUG_TYPES: tuple[type, ...] = (*DELTA_TYPES, *_FRAMES, Finish, *_RESTATED)
"""Output chunks logged at debug: the deltas, the chunks that frame the stream (what
the ``turn.*`` / ``step.*`` lifecycle events already say at info) and those a lifecycle
event restates (:data:`_RESTATED`)."""


class LogTap(Actor):
    """Writes bus events through structlog (logger ``axon.events``)."""

    overflow: ClassVar[OverflowPolicy] = "drop-oldest"
    inbox_capacity = 4096

    def __init__(self, *, name: str = "log-tap", logger: Any = None) -> None:
        super().__init__(name=name)
        self.log = logger or get_logger("axon.events")

    def attach(self, bus: Any) -> None:
        debug = level_enabled(self.log, "debug")
        kinds = [*LIFECYCLE_EVENT_TYPES, *OUTPUT_CHUNK_TYPES]
        if not debug:
            kinds = [k for k in kinds if k not in DEBUG_TYPES]
        self.subscribes_to = tuple(kinds)  # type: ignore[misc]
        super().attach(bus)

    async def handle(self, event: Any) -> None:
        if isinstance(event, DEBUG_TYPES):
            level = "debug"
        elif isinstance(event, _ERROR):
            level = "error"
        elif isinstance(event, _WARN):
            level = "warning"
        else:
            level = "info"
        if not level_enabled(self.log, level):
            # Nothing is built for a line nobody sees: redacting an event that carries a
            # message of megabytes takes seconds, on the event loop.
            return
        fields = elide_media(converter.unstructure(event))
        if not _chain_redacts(self.log):
            fields = redact(fields)
        fields.pop("type", None)
        fields.pop("kind", None)
        if fields.get("causation_id") is None:  # what made it happen, most specific first
            fields["causation_id"] = (
                fields.get("tool_call_id") or fields.get("part_id") or fields.get("turn_id")
            )
        getattr(self.log, level)(event.kind, **fields)


def _chain_redacts(logger: Any) -> bool:
    """Whether ``logger``'s processors redact every line it writes.

    Asked for each line, not once: ``structlog.testing.capture_logs`` and a reconfigured
    chain change the very list a bound logger holds. A logger that is not a bound
    structlog logger (no ``_processors``) is taken not to redact."""
    processors = getattr(logger, "_processors", None)
    return isinstance(processors, list) and redact_processor in processors
