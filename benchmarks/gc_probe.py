"""Figure 3's turns, watched by the garbage collector (issue 24 item 5): a probe, not a
figure.

``python -m benchmarks.gc_probe N MODE`` opens N sessions, then runs one turn in each at
once (a tool step and 20 text deltas, as figure 3) and prints the wall time, every
collection by generation (count, total and longest wall time, CPU time: this thread's,
so a collection that waited for a core shows), the longest task step and the tracked
objects per turn in flight. MODE (joined with ``-``):

* ``plain``: the interpreter's collector as it is;
* ``recipe``: what docs/embedding.md ("Garbage collection in a large host") suggests:
  ``gc.freeze()`` once the sessions are open, and no automatic full collection
  (``gc.set_threshold(700, 10, 1_000_000_000)``);
* ``pacing``: ``Host.open(gc_pacing=True)`` (:mod:`runtime.app.gcpacing`);
* ``count``: also samples ``gc.get_objects()`` every 50 ms for the peak count (slows the
  run: not for timings); ``hist`` adds the types at the peak.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_concurrency import make_agent
from benchmarks.common import LogSink
from benchmarks.stall import StallWatch


class Collections:
    """A ``gc.callbacks`` hook: wall and CPU milliseconds of every collection by generation."""

    def __init__(self) -> None:
        self.wall: dict[int, list[float]] = collections.defaultdict(list)
        self.cpu: dict[int, list[float]] = collections.defaultdict(list)
        self.collected: dict[int, list[int]] = collections.defaultdict(list)
        self._start = (0.0, 0.0)

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = (time.perf_counter(), time.thread_time())
            return
        wall, cpu = self._start
        self.wall[info["generation"]].append((time.perf_counter() - wall) * 1e3)
        self.cpu[info["generation"]].append((time.thread_time() - cpu) * 1e3)
        self.collected[info["generation"]].append(info["collected"])

    def lines(self) -> list[str]:
        return [
            f"  gen{g}: n={len(w)} total={sum(w):.0f} ms longest={max(w):.1f} ms "
            f"cpu total={sum(self.cpu[g]):.0f} ms cpu longest={max(self.cpu[g]):.1f} ms, "
            f"which freed {self.collected[g][w.index(max(w))]} cyclic objects "
            f"(most freed by one: {max(self.collected[g])})"
            for g, w in sorted(self.wall.items())
        ]


async def _peak(n: int, hist: bool, peak: dict[str, Any]) -> None:
    """Sample the tracked objects; keep the largest count (and its types)."""
    while True:
        await trio.sleep(0.05)
        objs = gc.get_objects()
        if len(objs) > peak["count"]:
            peak["count"] = len(objs)
            if hist:
                peak["types"] = collections.Counter(type(o).__qualname__ for o in objs)
        del objs


async def _turns(host: Any, agent: Any, n: int, mode: str) -> None:
    sessions = [await host.open_session(agent, session_id=f"s{i}") for i in range(n)]
    gc.collect()
    if "recipe" in mode:
        gc.freeze()
        gc.set_threshold(700, 10, 1_000_000_000)
    base = len(gc.get_objects())
    before = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    peak: dict[str, Any] = {"count": 0, "types": None}
    watch, seen = StallWatch(), Collections()

    async def turn(session: Any) -> None:
        async with session.stream("Weather in Paris?") as out:
            async for _ in out:
                pass

    trio.lowlevel.add_instrument(watch)
    watch.reset()
    gc.callbacks.append(seen)
    t0 = time.perf_counter()
    async with trio.open_nursery() as outer:
        if "count" in mode or "hist" in mode:
            outer.start_soon(_peak, n, "hist" in mode, peak)
        async with trio.open_nursery() as nursery:
            for session in sessions:
                nursery.start_soon(turn, session)
        outer.cancel_scope.cancel()
    seconds = time.perf_counter() - t0
    gc.callbacks.remove(seen)
    trio.lowlevel.remove_instrument(watch)
    snap = watch.snapshot()
    for session in sessions:
        await session.close()
    print(f"N={n} mode={mode} seconds={seconds:.2f} load={os.getloadavg()[0]:.1f}")
    print(*seen.lines(), sep="\n")
    print(f"  longest step {snap['longest_step_ms']:.0f} ms ({snap['longest_step_task']})")
    if peak["count"]:
        print(
            f"  tracked objects: {base} idle, peak {peak['count']}, "
            f"{(peak['count'] - base) / n:.1f} per turn in flight"
        )
    if peak["types"]:
        for name, k in (peak["types"] - before).most_common(30):
            print(f"    {k / n:7.2f} {name}")
    if "recipe" in mode:
        gc.set_threshold(700, 10, 10)
        gc.unfreeze()


async def _main(n: int, mode: str, directory: str) -> None:
    from runtime import Host

    agent = make_agent(20)
    store = str(Path(directory) / "probe.db")
    async with Host.open(store=store, gc_pacing="pacing" in mode) as host:
        warm = [await host.open_session(agent, session_id=f"warm-{i}") for i in range(20)]
        for session in warm:
            await session.run("Weather in Paris?")
            await session.close()
        await _turns(host, agent, n, mode)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            trio.run(
                _main, int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "plain", directory
            )
        finally:
            sink.close()
