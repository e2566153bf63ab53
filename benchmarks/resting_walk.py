"""What one full collection walks with N sessions at rest after a turn each, in a pacing
host (issue 24 item 5): a probe, not a figure.

``python -m benchmarks.resting_walk N [TURNS]`` opens a ``Host.open(gc_pacing=True)``
host, warms it up, opens N sessions, runs figure 3's turn in each at once, waits 2 s (the
log tap drains), then prints the longest collection the pacer ran during the burst and in
those 2 s (CPU time, ``gc.callbacks``), the objects frozen and the pacer's thaws so far
(:meth:`runtime.app.gcpacing.GcPacer._freeze_survivors`); TURNS such bursts (default 1),
so the histories grow as a long-lived host's do. Then the objects a full collection walks
(``gc.get_objects()``: every generation but the frozen one) and the median CPU time of
three full collections.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_concurrency import make_agent
from benchmarks.common import LogSink


class _Collections:
    """A ``gc.callbacks`` entry: the CPU time of each collection, by generation."""

    def __init__(self) -> None:
        self.done: list[tuple[float, int]] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.done.append(((time.thread_time() - self._start) * 1e3, info["generation"]))

    def longest(self) -> str:
        if not self.done:
            return "none"
        cpu, generation = max(self.done)
        full = sum(1 for _, g in self.done if g == 2)
        return f"gen {generation} {cpu:.1f} ms of {len(self.done)} ({full} full)"


async def _burst(sessions: list[Any]) -> tuple[str, str]:
    """One turn in every session at once, then 2 s at rest: the pacer's longest
    collection in each."""
    collections = _Collections()
    gc.callbacks.append(collections)
    try:
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(session.run, "Weather in Paris?")
        burst = collections.longest()
        collections.done = []
        await trio.sleep(2)
        return burst, collections.longest()
    finally:
        gc.callbacks.remove(collections)


async def _main(directory: str, n: int, turns: int) -> None:
    from runtime import Host
    from runtime.app.gcpacing import _pacers

    agent = make_agent(20)
    async with Host.open(store=str(Path(directory) / "walk.db"), gc_pacing=True) as host:
        for k in (1, 20):  # warm-up: every path once
            warm = [await host.open_session(agent, session_id=f"w{k}-{i}") for i in range(k)]
            for session in warm:
                await session.run("Weather in Paris?")
                await session.close()
        del warm
        sessions = [await host.open_session(agent, session_id=f"s{i}") for i in range(n)]
        pacer = next(iter(_pacers.values()))
        for turn in range(1, turns + 1):
            burst, after = await _burst(sessions)
            print(
                f"N={n} turn {turn}: the pacer's longest collection (generation, CPU ms):"
                f" during the burst {burst}, in the 2 s after it {after};"
                f" frozen={gc.get_freeze_count()} thaws={pacer.thaws}",
                flush=True,
            )
        gc.collect()
        walked = len(gc.get_objects())
        cpu = []
        for _ in range(3):
            start = time.thread_time()
            gc.collect()
            cpu.append((time.thread_time() - start) * 1e3)
        print(
            f"N={n} frozen={gc.get_freeze_count()} walked={walked} "
            f"per-session={walked / n:.1f} full collection cpu ms={sorted(cpu)[1]:.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python3 -m benchmarks.resting_walk",
        description="What the paced collections walk with N sessions at rest (issue 24 item 5).",
    )
    parser.add_argument("sessions", type=int, help="sessions opened, N")
    parser.add_argument("turns", type=int, nargs="?", default=1, help="bursts (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            trio.run(_main, directory, args.sessions, args.turns)
        finally:
            sink.close()


if __name__ == "__main__":
    main()
