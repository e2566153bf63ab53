"""2. Core overhead without an SDK: the scripted provider streaming N pre-built deltas.

Everything but the SDK and the network: provider actor, engine, turn runner, stream
controller, consumer, persister (SQLite) and log tap (``info``), exactly as in the
pipeline benchmark. The deltas are :class:`~runtime.chunks.TextChunk` objects built
before the clock starts, so what is timed is Axon's per-delta work (and the one save of
the joined text at the end of the turn). The two sizes alternate; the ratio of their
median times shows whether the cost per delta stays flat (10x the deltas should take
10x the time: no quadratic string building, no per-delta rescans).
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import Figure, LogSink, Sizes, alternate, median, now
from benchmarks.sse import delta_texts

LINEARITY_TARGET = 11.0


def _side(host: Any, agent: Any, n: int, prefix: str) -> Any:
    counter = itertools.count()

    async def side() -> float:
        session = await host.open_session(agent, session_id=f"{prefix}-{next(counter)}")
        count = 0
        t0 = now()
        async with session.stream("go") as out:
            async for chunk in out:
                if chunk.type == "text-delta":
                    count += 1
        seconds = now() - t0
        await session.close()
        if count != n or out.result is None or out.result.finish_reason != "stop":
            raise RuntimeError(f"core: {count} of {n} deltas, result {out.result}")
        return seconds

    return side


async def _measure(sizes: Sizes, directory: str) -> list[Figure]:
    from actors.providers.scripted import ScriptedProvider
    from runtime import Agent, Host, TextChunk

    small, large = sizes.core_sizes
    sink = LogSink(directory)
    try:
        async with Host.open(store=str(Path(directory) / "core.db")) as host:
            sides = {}
            for n in (small, large):
                chunks = [TextChunk(text=t) for t in delta_texts(n)]
                agent = Agent(name="bench", provider=ScriptedProvider([chunks]))
                sides[str(n)] = _side(host, agent, n, f"core{n}")
            times = await alternate(sizes.core_rounds, 1, sides)
    finally:
        sink.close()
    t_small, t_large = median(times[str(small)]), median(times[str(large)])
    ratio = t_large / t_small
    scale = large / small
    limit = LINEARITY_TARGET * scale / 10
    return [
        Figure(
            key=f"core.us_per_delta.{small}",
            title=f"2. Core, scripted provider: {small:,} deltas",
            value=t_small * 1e6 / small,
            unit="us/delta",
            detail=f"{t_small * 1e3:.1f} ms per turn",
            data={"deltas": small, "seconds": times[str(small)]},
        ),
        Figure(
            key=f"core.us_per_delta.{large}",
            title=f"2. Core, scripted provider: {large:,} deltas",
            value=t_large * 1e6 / large,
            unit="us/delta",
            detail=f"{t_large * 1e3:.1f} ms per turn",
            data={"deltas": large, "seconds": times[str(large)]},
        ),
        Figure(
            key="core.linearity",
            title=f"2. Core linearity: time({large:,}) / time({small:,})",
            value=ratio,
            unit="x",
            target=f"<= {limit:g}",
            passed=ratio <= limit,
            detail=f"{scale:g}x the deltas; median of {sizes.core_rounds} rounds each",
            data={"rounds": sizes.core_rounds},
        ),
    ]


def run(sizes: Sizes) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        return trio.run(_measure, sizes, directory)
