"""Where a text delta's CPU goes, stage by stage, in one process (issue 24 goal 1).

Each stage is timed by itself over the same deltas, CPU time, the minimum of several
rounds (so another process's load moves it little): the provider's read of the
benchmark's in-memory 10,000-delta body (SSE, the JSON slot, the parse, the read's
batches into a sink: everything the provider's task does per delta but the socket), the
engine, the turn runner's parts manager and the stream controller on batches of 128
deltas, and the consumer's ``async for`` with the pipeline benchmark's loop body. What a
turn spends beyond their sum is the HTTP reads, the scheduler's rounds and the inboxes'
hops (per batch), the collector, and what grows with the text (the save, the log line of
the finished turn).

``python3 -m benchmarks.delta_stages``, or, for another checkout, from its directory:
``PYTHONPATH=$PWD python3 /path/to/benchmarks/delta_stages.py`` (its own modules are
timed; a tree without :class:`~runtime.provider.TextRun` is timed with text chunks).
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import trio

DELTAS = 10_000
BATCH = 128
READ = 16384


class _Response:
    def __init__(self, body: bytes) -> None:
        self.body, self.request, self.status_code = body, None, 200

    async def aiter_bytes(self) -> Any:
        for start in range(0, len(self.body), READ):
            yield self.body[start : start + READ]


class _Stream:
    """What the providers' readers take of an SDK stream: its response and decoder."""

    def __init__(self, body: bytes) -> None:
        self.response = _Response(body)
        self._decoder = type("SSEDecoder", (), {"__module__": "openai._streaming"})()
        self._observer = None

    def _iter_events(self) -> None:
        raise AssertionError("read from the bytes")


class _Sink:
    async def __call__(self, chunk: Any) -> None:
        pass

    async def send_all(self, chunks: Any, **_: Any) -> None:
        pass


async def _least(step: Callable[[], Awaitable[Any]], reps: int, rounds: int) -> float:
    """The least CPU seconds of ``reps`` calls of ``step`` over ``rounds`` rounds."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(reps):
            await step()
        best = min(best, time.process_time() - start)
    return best / reps


async def provider_read(fmt: str) -> float:
    """Microseconds a delta of the provider's read of the 10,000-delta body."""
    from actors.providers import anthropic, openai
    from benchmarks.sse import anthropic_body, openai_body

    body = anthropic_body(DELTAS) if fmt == "anthropic" else openai_body(DELTAS)
    module: Any = anthropic if fmt == "anthropic" else openai
    runs = {"runs": True} if "runs" in inspect.signature(module.parse_batches).parameters else {}

    async def once() -> None:
        if fmt == "anthropic":
            events = anthropic.json_event_batches(_Stream(body), texts=True)
            await anthropic.parse_batches(events, _Sink(), **runs)
        else:
            chunks = openai.json_chunk_batches(_Stream(body), texts=True)
            await openai.parse_batches(chunks, _Sink(), **runs)

    return await _least(once, 1, 15) / DELTAS * 1e6


def _batches(run: bool, count: int) -> list[Any]:
    from benchmarks.sse import delta_texts
    from runtime.actor_messages import Batch
    from runtime.chunks import TextChunk

    texts = delta_texts(BATCH)
    out = []
    for _ in range(count):
        batch: Batch[Any] = Batch("r")
        if run:
            from runtime.provider import TextRun

            batch.append(TextRun(texts=list(texts)))
        else:
            batch.extend(TextChunk(text=t) for t in texts)
        out.append(batch)
    return out


async def after_provider(run: bool) -> dict[str, float]:
    """Nanoseconds a delta of the engine, the parts manager and the controller."""
    from actors.engine import Engine
    from actors.stream_controller import StreamController
    from actors.turn.parts import PartsManager
    from runtime.actor_messages import BeginRequest
    from runtime.chunks import TextChunk
    from runtime.inbox import Inbox

    reps, rounds = 100, 15
    out: Inbox[Any] = Inbox()
    engine = Engine(out)
    await engine.handle(BeginRequest(request_id="r"))
    batches = iter(_batches(run, reps * rounds))

    async def engine_step() -> None:
        await engine.handle(next(batches))
        while len(out):
            out.get_nowait()

    one = _batches(run, 1)[0]

    async def parts_step() -> None:
        parts, forward = PartsManager(), []
        i, n = 0, len(one)
        while i < n:
            if type(one[i]) is TextChunk:
                i = parts.texts(one, i, forward)
            else:
                parts.text_run(one[i], forward)
                i += 1

    controller = StreamController(session_id="s")
    controller._consumer = None  # rendering only: no consumer to send to
    rendered = iter(_batches(run, reps * rounds))

    async def controller_step() -> None:
        await controller.handle(next(rendered))

    return {
        "engine": await _least(engine_step, reps, rounds) / BATCH * 1e9,
        "parts": await _least(parts_step, reps, rounds) / BATCH * 1e9,
        "controller": await _least(controller_step, reps, rounds) / BATCH * 1e9,
    }


async def consumer() -> float:
    """Nanoseconds a delta of ``async for`` over a turn's stream (its ``__anext__``,
    over chunks already received) with the pipeline benchmark's loop body."""
    from runtime.app.session import TurnStream
    from runtime.fastbuild import slot_builder
    from runtime.output import TextDelta

    build = slot_builder(TextDelta, ("step", "part_id", "text", "seq", "session_id", "turn_id"))
    chunks = [build(1, "p", "w", i, "s", "t") for i in range(BATCH)]

    class Stream:  # TurnStream's own __anext__, over a buffer already filled
        __anext__ = TurnStream.__anext__

        def __init__(self) -> None:
            self._buffer = deque(chunks)
            self._ended = False

        def __aiter__(self) -> Any:
            return self

        async def _receive(self) -> None:
            self._ended = True

    async def step() -> None:
        texts = []
        async for chunk in Stream():
            if chunk.type == "text-delta":
                texts.append(chunk.text)

    return await _least(step, 100, 15) / BATCH * 1e9


async def main() -> None:
    try:
        from runtime.provider import TextRun  # noqa: F401

        run = True
    except ImportError:
        run = False
    for fmt in ("anthropic", "openai"):
        print(f"provider read, {fmt}: {await provider_read(fmt):.3f} us a delta")
    stages = await after_provider(run)
    kind = "TextRun" if run else "text chunks"
    print(", ".join(f"{name} {ns:.0f} ns" for name, ns in stages.items()), f"a delta ({kind})")
    print(f"consumer (async for and the loop body): {await consumer():.0f} ns a delta")


if __name__ == "__main__":
    argparse.ArgumentParser(
        prog="python3 -m benchmarks.delta_stages",
        description="Where a text delta's CPU goes, stage by stage, in one process.",
    ).parse_args()
    trio.run(main)
