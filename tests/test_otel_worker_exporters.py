"""Workers with ``--plugin otel`` whose collector answers, hangs or fails every export
(real ``python -m runtime worker`` processes on the test run's own PostgreSQL and
Redis): a turn that suspends for approval on one worker, stopped meanwhile, and resumes
on another ends as it would untraced, and each worker, told to stop, exits
(docs/telemetry.md: an unreachable collector never slows a turn, it only delays the exit
while an export retries). With a collector that answers, the continuation's span links
to the suspended one across the two processes."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.approval import Decision, pending_calls
from runtime.messages import AssistantMessage
from tests.support.loopback import Recorded, Reply, loopback_server
from tests.support.redis import require_redis, unique_prefix
from tests.support.worker_agent import answer_text, guarded
from tests.test_workers import Workers, finished, wait_for

EXIT_LIMIT = 20.0
"""Seconds a worker told to stop may take to exit: its grace (2 s), the plug-in's
flush (5 s at most), the exporter's give-up (1 s here) and the process's start, with room."""

COLLECTORS = {
    "answers": Reply(status=200, content_type="application/x-protobuf"),
    "hangs": Reply(status=200, content_type="application/x-protobuf", stall=600),
    "fails": Reply(status=500, body=b"collector broke", content_type="text/plain"),
}


@pytest.fixture
def pool(pg_url: str) -> Iterator[Workers]:
    workers = Workers(pg_url, require_redis(), unique_prefix())
    try:
        yield workers
    finally:
        workers.close()


def start_traced(pool: Workers, name: str, collector: str) -> None:
    pool.start(
        name,
        extra_args=["--plugin", "otel"],
        OTEL_EXPORTER_OTLP_ENDPOINT=collector,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_BSP_SCHEDULE_DELAY="20",  # export while the turn runs, not only at exit
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
    )


def stop(pool: Workers, name: str) -> int:
    """SIGTERM the worker; its exit status once it exited (fails past :data:`EXIT_LIMIT`)."""
    proc = pool.procs[name]
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(EXIT_LIMIT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{name} still running {EXIT_LIMIT} s after SIGTERM") from None


@pytest.mark.parametrize("collector", sorted(COLLECTORS))
async def test_a_turn_resumed_on_another_worker_ends_whatever_the_collector_does(
    pg_url: str, pool: Workers, collector: str
) -> None:
    def respond(_: Recorded) -> Reply:
        return COLLECTORS[collector]

    async with loopback_server(respond=respond) as server:
        store = await PostgresStore.open(pg_url)
        queue = TurnQueue(store)
        try:
            start_traced(pool, "w1", server.url)
            first = await queue.submit("s1", "approve this")

            async def waiting() -> list:  # type: ignore[type-arg]
                record = await store.load("s1")
                return [] if record is None else pending_calls(record.messages)

            (call,) = await wait_for(waiting, what="the turn waiting for approval on w1")
            w1_exit = await trio.to_thread.run_sync(stop, pool, "w1")
            start_traced(pool, "w2", server.url)
            await queue.decide(
                "s1", call.approval_id, Decision(approved=True), {"guarded": guarded}
            )
            resumed = await finished(queue, first.turn_id)
            second = await queue.submit("s1", "hello again")
            plain = await finished(queue, second.turn_id)
            record = await store.load("s1")
            w2_exit = await trio.to_thread.run_sync(stop, pool, "w2")
        finally:
            await queue.aclose()
            await store.aclose()
        requests = list(server.requests)
        exports = len(requests)
    assert (resumed.status, plain.status) == ("done", "done"), pool.log("w2")
    assert record is not None
    answers = [m.text for m in record.messages if isinstance(m, AssistantMessage)]
    assert answers == ["I need your approval. " + answer_text("approve this"), "echo: hello again"]
    assert (w1_exit, w2_exit) == (0, 0), pool.log("w1") + pool.log("w2")
    assert exports >= 2  # both workers tried
    if collector == "answers":
        assert_resumed_span_links_to_the_suspended_one(requests, first.turn_id)
        return
    for name in ("w1", "w2"):  # and were told it failed
        assert '"otel.export_failed"' in pool.log(name)


def spans_of(requests: list[Recorded]) -> list[Any]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    spans = []
    for request in requests:
        export = ExportTraceServiceRequest.FromString(request.body)
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                spans += list(scope.spans)
    return spans


def attributes(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def assert_resumed_span_links_to_the_suspended_one(requests: list[Recorded], turn_id: str) -> None:
    """docs/telemetry.md, "Waits": the suspended turn's span ended awaiting input (on
    w1); its continuation's span (on w2, whose actor never saw it) links to it."""
    turns = [
        s
        for s in spans_of(requests)
        if s.name.startswith("invoke_agent") and attributes(s).get("axon.turn.id") == turn_id
    ]
    assert len(turns) == 2, [attributes(s) for s in turns]
    suspended, resumed = sorted(turns, key=lambda s: s.start_time_unix_nano)
    assert attributes(suspended).get("axon.turn.awaiting_input") is True
    assert attributes(resumed).get("axon.turn.resumed") is True
    (link,) = resumed.links
    assert (link.trace_id, link.span_id) == (suspended.trace_id, suspended.span_id)
    assert {kv.key: kv.value.string_value for kv in link.attributes} == {
        "axon.link.type": "resumes"
    }
