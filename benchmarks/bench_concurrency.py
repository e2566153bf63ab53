"""3. Concurrency: many sessions in one host, and what an idle session costs in memory.

Throughput: at each level N (1, 100, 1,000) N sessions each run one turn at the same
time: a tool step (the scripted model calls ``lookup``, the tool executor runs it) and
then an answer of 200 text deltas; aggregate deltas per second = N x 200 / wall time
from the first ``session.stream`` to the last turn saved. Sessions are opened before the
clock starts. Levels rotate order each round; the single-session figure is the median
of several turns per round (one turn is short, so one sample would be noisy). The
figure is the median over rounds of throughput(1,000) / throughput(1).

Memory: a fresh child process (so nothing freed by earlier benchmarks is reused) starts
a host, warms it up with a few sessions, then opens 1,000 sessions and reads the
resident set size (``/proc/self/statm``) before and after, after a full collection.
"""

from __future__ import annotations

import gc
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import (
    REPO,
    Figure,
    LogSink,
    Sizes,
    alternate,
    median,
    now,
    python_env,
    rss_bytes,
)
from benchmarks.sse import delta_texts

THROUGHPUT_TARGET = 0.70
MEMORY_TARGET_KB = 200.0


async def lookup(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def make_agent(deltas: int) -> Any:
    from actors.providers.scripted import ScriptedProvider, tool_call
    from runtime import Agent, TextChunk

    answer = [TextChunk(text=t) for t in delta_texts(deltas)]
    provider = ScriptedProvider([tool_call("lookup", {"city": "Paris"}), answer])
    return Agent(name="bench", provider=provider, tools=[lookup])


async def _level(host: Any, agent: Any, n: int, deltas: int, tag: str) -> float:
    """Seconds for ``n`` sessions to run one turn each, concurrently."""
    sessions = [await host.open_session(agent, session_id=f"{tag}-{i}") for i in range(n)]
    counts: list[int] = []

    async def turn(session: Any) -> None:
        k = 0
        async with session.stream("Weather in Paris?") as out:
            async for chunk in out:
                if chunk.type == "text-delta":
                    k += 1
        if out.result is None or out.result.finish_reason != "stop" or out.result.steps != 2:
            raise RuntimeError(f"concurrency: turn ended {out.result}")
        counts.append(k)

    gc.collect()
    t0 = now()
    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(turn, session)
    seconds = now() - t0
    for session in sessions:
        await session.close()
    if sum(counts) != n * deltas:
        raise RuntimeError(f"concurrency: {sum(counts)} deltas, expected {n * deltas}")
    return seconds


async def _measure(sizes: Sizes, directory: str) -> list[Figure]:
    from runtime import Host

    deltas = sizes.conc_deltas
    levels = sizes.conc_levels
    agent = make_agent(deltas)
    tags = itertools.count()
    sink = LogSink(directory)
    try:
        async with Host.open(store=str(Path(directory) / "concurrency.db")) as host:
            sides = {}
            for n in levels:

                async def side(n: int = n) -> float:
                    if n == 1:  # the median of a few single turns
                        runs = [
                            await _level(host, agent, 1, deltas, f"c1-{next(tags)}")
                            for _ in range(sizes.conc_single_turns)
                        ]
                        return median(runs)
                    return await _level(host, agent, n, deltas, f"c{n}-{next(tags)}")

                sides[str(n)] = side
            times = await alternate(sizes.conc_rounds, 1, sides)
    finally:
        sink.close()
    figures = []
    throughput = {n: [n * deltas / s for s in times[str(n)]] for n in levels}
    for n in levels:
        figures.append(
            Figure(
                key=f"concurrency.throughput.{n}",
                title=f"3. Throughput, {n:,} concurrent session(s)",
                value=median(throughput[n]),
                unit="deltas/s",
                detail=f"{deltas} deltas + 1 tool step each; {median(times[str(n)]) * 1e3:.1f} ms",
                data={"sessions": n, "seconds": times[str(n)]},
            )
        )
    top = levels[-1]
    ratios = [a / b for a, b in zip(throughput[top], throughput[1], strict=True)]
    value = median(ratios)
    figures.append(
        Figure(
            key="concurrency.scaling",
            title=f"3. Throughput at {top:,} sessions / at 1",
            value=value,
            unit="x",
            target=f">= {THROUGHPUT_TARGET:g}",
            passed=value >= THROUGHPUT_TARGET,
            detail=f"median of {sizes.conc_rounds} rounds",
            data={"ratios": ratios},
        )
    )
    return figures


# -- memory per idle session (in a child process) ------------------------------------------


async def _idle_memory(n: int, directory: str) -> dict[str, float]:
    from runtime import Host

    agent = make_agent(20)
    async with Host.open(store=str(Path(directory) / "idle.db")) as host:
        # Warm up: every code path and lazy import has run once, caches are filled.
        warm = [await host.open_session(agent, session_id=f"warm-{i}") for i in range(20)]
        for session in warm:
            await session.run("Weather in Paris?")
            await session.close()
        gc.collect()
        before = rss_bytes()
        sessions = [await host.open_session(agent, session_id=f"idle-{i}") for i in range(n)]
        gc.collect()
        opened = rss_bytes()
        for session in sessions:  # one turn each: history and a used controller
            await session.run("Weather in Paris?")
        gc.collect()
        after_turn = rss_bytes()
        return {
            "sessions": n,
            "rss_before": before,
            "rss_opened": opened,
            "rss_after_turn": after_turn,
            "kb_per_idle_session": (opened - before) / n / 1024,
            "kb_per_session_after_turn": (after_turn - before) / n / 1024,
        }


def _idle_child(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            result = trio.run(_idle_memory, n, directory)
        finally:
            sink.close()
    print(json.dumps(result))


def memory_figure(sizes: Sizes) -> Figure:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_concurrency", "idle", str(sizes.idle_sessions)],
        cwd=REPO,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    value = data["kb_per_idle_session"]
    return Figure(
        key="concurrency.memory_per_idle_session",
        title=f"3. Resident memory per idle session ({sizes.idle_sessions:,} open)",
        value=value,
        unit="KB",
        target=f"< {MEMORY_TARGET_KB:g} KB",
        passed=value < MEMORY_TARGET_KB,
        detail=f"{data['kb_per_session_after_turn']:.1f} KB each after one turn",
        data=data,
    )


def run(sizes: Sizes) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        figures = trio.run(_measure, sizes, directory)
    return [*figures, memory_figure(sizes)]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "idle":
        _idle_child(int(sys.argv[2]))
    else:  # pragma: no cover
        sys.exit("usage: python -m benchmarks.bench_concurrency idle N")
