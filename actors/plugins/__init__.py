"""Optional actors a host can start: approval, metrics, JSONL recorder, OpenTelemetry.

They are shipped as working examples of the :class:`runtime.Actor` API.

* :class:`ApprovalActor`: decides ``needs_approval`` tool calls (by policy, or by a person
  calling :meth:`ApprovalActor.approve` / :meth:`ApprovalActor.deny`).
* :class:`MetricsActor`: tokens, steps, tool calls and turn latency per session.
* :class:`JsonlRecorder`: every bus event as one JSON line in a file
  (``python -m runtime replay FILE`` re-renders it).
* :class:`OpenTelemetryActor`: turns, model calls and tool calls as OpenTelemetry spans
  (GenAI semantic conventions); needs ``pip install 'axon-runtime[otel]'``, imported only
  when the actor is created.
"""

from actors.plugins.approval import ApprovalActor
from actors.plugins.metrics import MetricsActor, SessionMetrics
from actors.plugins.otel import OpenTelemetryActor
from actors.plugins.recorder import JsonlRecorder

__all__ = [
    "ApprovalActor",
    "JsonlRecorder",
    "MetricsActor",
    "OpenTelemetryActor",
    "SessionMetrics",
]
