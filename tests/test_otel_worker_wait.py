"""The OpenTelemetry plug-in across a worker restart (real PostgreSQL and Redis, a front
end and workers in this process): a turn suspends on one worker, whose tracing actor
ends its span there; a decision puts it back and another worker, with a tracing actor
that never saw that span, resumes it. The continuation's span links to the suspended
one through the trace context the suspension stored with the session."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from actors.plugins import OpenTelemetryActor
from actors.relays import RedisRelay
from runtime.app.worker import Worker
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, Deployment, deployment
from tests.test_otel_wait import turn_spans
from tests.test_relay_web import sse_events
from tests.test_worker_approval import answer, approval_agent, asked, first_part, payloads


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def traced_worker(d: Deployment, provider: Any, task_status: Any) -> None:
    """A worker of ``d`` with a tracing actor of its own (as ``worker --plugin otel``)."""
    async with (
        RedisRelay.open(d.redis_url, prefix=d.prefix) as relay,
        trio.open_nursery() as nursery,
    ):
        worker = Worker(
            store=d.store,
            relay=relay,
            agent=d.agent,
            poll=0.1,
            grace=1,
            plugins=[OpenTelemetryActor(tracer_provider=provider)],
        )
        task_status.started(await nursery.start(worker.run))


async def spans_of(exporter: InMemorySpanExporter, count: int) -> list[Any]:
    """The turn spans once ``count`` have ended (the actor handles events after the fact)."""
    with trio.fail_after(LIMIT):
        while True:
            spans = turn_spans(exporter.get_finished_spans())
            if len(spans) >= count:
                return spans
            await trio.sleep(0.02)


async def test_a_turn_resumed_by_another_worker_links_to_the_span_suspended_on_the_first(
    pg_url: str, redis_url: str
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with deployment(pg_url, redis_url, approval_agent(), worker=False) as d:
        async with trio.open_nursery() as nursery:
            first_worker = await nursery.start(traced_worker, d, provider)
            first = await first_part(d, d.urls[0])
            (waited,) = await spans_of(exporter, 1)
            first_worker.stop()  # the worker that suspended it is gone
        async with trio.open_nursery() as nursery:
            second_worker = await nursery.start(traced_worker, d, provider)
            message_id = payloads(first)[0]["messageId"]
            async with httpx.AsyncClient(timeout=LIMIT) as client:
                response = await client.post(
                    f"{d.urls[0]}/api/chat",
                    json=answer("s1", message_id, asked(first)["approvalId"], True),
                )
            waited_again, resumed = await spans_of(exporter, 2)
            second_worker.stop()
    assert payloads(sse_events(response.text))[-1]["finishReason"] == "stop"
    assert waited_again.context.span_id == waited.context.span_id
    assert waited.attributes["axon.turn.awaiting_input"] is True
    assert resumed.attributes["axon.turn.resumed"] is True
    assert resumed.attributes["axon.turn.id"] == waited.attributes["axon.turn.id"]
    (link,) = resumed.links
    assert (link.context.trace_id, link.context.span_id) == (
        waited.context.trace_id,
        waited.context.span_id,
    )
    assert link.attributes["axon.link.type"] == "resumes"
