"""The OpenTelemetry plug-in and turns that wait for input (docs/approval.md): the turn span
ends with the wait (status OK), and the continuation's span links to it."""

from __future__ import annotations

import trio
import trio.testing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from actors.plugins import OpenTelemetryActor
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, tool
from runtime.approval import SUSPENDED_TRACE_META
from tests import test_busy


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


def asking() -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["Done."]]
    return Agent(name="files", provider=ScriptedProvider(steps), tools=[delete_file])


async def traced_wait(approved: bool = True) -> tuple:
    """A turn that waits, then its continuation, traced; the finished spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with Host.open(log_tap=False) as host:
        await host.start_actor(OpenTelemetryActor(tracer_provider=provider))
        session = await host.open_session(asking(), session_id="s")
        first = await session.run("delete /x")
        await session.respond(first.pending[0].approval_id, approved=approved, reason="ok")
    return first, exporter.get_finished_spans()


def turn_spans(spans) -> list:
    return sorted(
        (s for s in spans if s.name.startswith("invoke_agent")), key=lambda s: s.start_time
    )


async def test_the_turn_span_ends_with_the_wait_status_ok():
    first, spans = await traced_wait()
    waited, _ = turn_spans(spans)
    assert waited.attributes["axon.turn.finish_reason"] == "awaiting-input"
    assert waited.attributes["axon.turn.awaiting_input"] is True
    assert waited.status.status_code is StatusCode.OK
    names = [e.name for e in waited.events]
    assert names == ["axon.approval.requested", "axon.turn.suspended"]
    asked = waited.events[0].attributes
    assert asked["gen_ai.tool.name"] == "delete_file"
    assert asked["axon.approval.id"] == first.pending[0].approval_id


async def test_the_held_calls_tool_span_ends_with_the_wait_marked_waiting():
    _, spans = await traced_wait()
    waited, _ = turn_spans(spans)
    held = [
        s
        for s in spans
        if s.name == "execute_tool delete_file" and s.parent.span_id == waited.context.span_id
    ]
    assert len(held) == 1 and held[0].attributes["axon.tool.awaiting_input"] is True


async def test_the_continuation_is_a_new_span_linked_to_the_suspended_one():
    _, spans = await traced_wait()
    waited, resumed = turn_spans(spans)
    assert resumed.context.span_id != waited.context.span_id
    assert resumed.attributes["axon.turn.resumed"] is True
    assert resumed.attributes["axon.turn.id"] == waited.attributes["axon.turn.id"]
    (link,) = resumed.links
    assert link.context.span_id == waited.context.span_id
    assert link.context.trace_id == waited.context.trace_id
    assert link.attributes["axon.link.type"] == "resumes"
    assert resumed.attributes["axon.turn.finish_reason"] == "stop"
    assert "axon.turn.resumed" not in waited.attributes


async def test_the_decision_is_the_continuations_first_event_and_the_call_its_tool_span():
    _, spans = await traced_wait()
    _, resumed = turn_spans(spans)
    decided = resumed.events[0]
    assert decided.name == "axon.approval.decided"
    assert decided.attributes["axon.approval.approved"] is True
    assert decided.attributes["axon.approval.reason"] == "ok"
    ran = [
        s
        for s in spans
        if s.name == "execute_tool delete_file" and s.parent.span_id == resumed.context.span_id
    ]
    assert len(ran) == 1 and ran[0].attributes["gen_ai.tool.call.id"] == "D"


async def test_a_steered_message_is_an_event_on_the_running_turns_span():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    test_busy.held["open"], test_busy.held["release"] = trio.Event(), trio.Event()
    script = test_busy.Script(test_busy.holding(), ["both answered"])
    async with Host.open(log_tap=False) as host:
        await host.start_actor(OpenTelemetryActor(tracer_provider=provider))
        session = await host.open_session(test_busy.agent_with(script, "steer"), session_id="s")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "first")
            await test_busy.held["open"].wait()
            nursery.start_soon(session.run, "also this")
            await trio.testing.wait_all_tasks_blocked()
            test_busy.held["release"].set()
    (turn,) = turn_spans(exporter.get_finished_spans())
    steered = [e for e in turn.events if e.name == "axon.turn.steered"]
    assert len(steered) == 1 and steered[0].attributes["axon.step"] == 1


async def test_a_continuation_on_a_fresh_host_links_to_the_span_suspended_on_another(tmp_path):
    """The suspension stores its span's context with the session: a continuation on
    another host (another process, or after a restart) links to it, though that host's
    tracing actor never saw the suspended span."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        await host.start_actor(OpenTelemetryActor(tracer_provider=provider))
        session = await host.open_session(asking(), session_id="s")
        first = await session.run("delete /x")
    (waited,) = turn_spans(exporter.get_finished_spans())
    exporter.clear()
    async with Host.open(store=db, log_tap=False) as host:
        await host.start_actor(OpenTelemetryActor(tracer_provider=provider))
        session = await host.open_session(asking(), session_id="s")
        await session.respond(first.pending[0].approval_id, approved=True, reason="ok")
        assert SUSPENDED_TRACE_META in session.meta  # stored with the wait
    (resumed,) = turn_spans(exporter.get_finished_spans())
    assert first.finish_reason == "awaiting-input"
    assert resumed.attributes["axon.turn.resumed"] is True
    (link,) = resumed.links
    assert link.context.trace_id == waited.context.trace_id
    assert link.context.span_id == waited.context.span_id
    assert link.attributes["axon.link.type"] == "resumes"
    assert resumed.attributes["axon.turn.finish_reason"] == "stop"


async def test_a_takeover_of_a_turn_that_never_waited_links_to_nothing():
    from actors.turn.runner import _suspended_trace
    from runtime.events import TraceContext

    stored = {SUSPENDED_TRACE_META: {"turn_id": "t1", "trace_id": "ab", "span_id": "cd"}}
    assert _suspended_trace(stored, "t1", committed=object()) == TraceContext(
        trace_id="ab", span_id="cd"
    )
    assert _suspended_trace(stored, "t2", committed=object()) is None  # another turn's
    assert _suspended_trace(stored, "t1", committed=None) is None  # a new turn
