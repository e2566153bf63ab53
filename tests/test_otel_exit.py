"""The OpenTelemetry plug-in at the interpreter's exit: a host whose Trio run is on a
thread of its own (``AsyncHost``) left open while a turn streams. The plug-in's exit hook
(registered after ``AsyncHost``'s, so run before it: the host is still as the exit found
it) ends the open turn's spans (``axon.trace.incomplete``) so that they are exported:
before, the trace had no span of the very turn the exit cut. ``AsyncHost``'s hook then
closes the host, the turn saved interrupted (tests/test_aio_gone.py). A real
interpreter, exiting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import asyncio, atexit, json
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from actors.plugins.otel import OpenTelemetryActor
from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent
from runtime.app.aio import AsyncHost

exported = InMemorySpanExporter()
atexit.register(  # registered first: runs last, after every other exit hook
    lambda: print(json.dumps([
        [s.name, bool(s.attributes.get("axon.trace.incomplete"))]
        for s in exported.get_finished_spans()
    ]), flush=True)
)
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exported))
agent = Agent(provider=ScriptedProvider([["hello ", Sleep(3600), "never"]]))

kept = []

async def main():
    kept.append(AsyncHost.open(log_tap=False))
    host = await kept[0].__aenter__()  # never left
    await host.call(host.host.start_actor, OpenTelemetryActor(tracer_provider=provider))
    session = await host.open_session(agent)
    out = await session.stream("go").__aenter__()
    async for chunk in out:
        if chunk.type == "text-delta":
            return

loop = asyncio.new_event_loop()
loop.run_until_complete(main())  # and the interpreter exits, the loop left as it is
"""


def test_an_exit_with_a_turn_streaming_on_an_open_async_host_exports_its_spans_ended():
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(spans) == [["chat scripted", True], ["invoke_agent assistant", True]]
