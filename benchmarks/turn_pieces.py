"""Where the per-turn CPU of ``benchmarks.cpu_floor``'s Axon side goes, piece by piece
(by hand, issue 24 goal 1).

``python3 -m benchmarks.turn_pieces [openai|anthropic|scripted] [--deltas N]
[--children 4] [--rounds 5] [--warm 2] [--profile FILE] [--tree DIR]``

Each child process is one of ``cpu_floor``'s (the loopback server, SQLite store, log
lines at ``info`` into a file, ``--warm`` warm-up rounds, then ``--rounds`` rounds of the
floor and one Axon turn in turn), except that the Axon side's pieces are timed
separately by the process CPU (``time.process_time``, every thread): the session's open,
the stream (entered until its block is left: the turn, its saves and its lines), the
close, and the store's read-back. The log tap's own CPU (thread time in its ``handle``
and in the lines it writes) is counted inside those pieces and also shown alone, with
the lines and writes per turn. ``--profile FILE`` keeps a cProfile of the measured Axon
turns (every child's, merged) for ``python3 -m pstats``. Per piece: the min / median /
max over all children's rounds, us per turn.

``cpu_floor``'s children run 2 warm-up rounds and 5 measured ones each: the turns
measured are the 3rd to 7th of a fresh interpreter, so whatever a process learns in its
first turns (the log tap's plans, the redaction's caches, the interpreter's specialised
bytecode) is still being learned. ``--warm 200`` shows the same pieces hot.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PIECES = ("open", "stream", "close", "load", "log tap", "gc", "floor", "tap off", "paired")


async def _rounds(
    fmt: str,
    n: int,
    warm: int,
    rounds: int,
    server: Any,
    directory: str,
    prof: Any,
    ablate: bool,
    collect: bool,
    by_task: bool,
) -> dict[str, Any]:
    import actors.log_tap as tap_module
    from benchmarks.bench_pipeline import PROMPT, make_provider
    from benchmarks.common import INSTRUCTIONS
    from benchmarks.floor import floor_side
    from benchmarks.sse import delta_texts
    from runtime import Agent, Host, TextChunk

    tap_cpu = [0.0]
    original = tap_module.LogTap.handle

    skip = [False]

    async def handle(self: Any, message: Any) -> None:
        if skip[0]:
            return
        t0 = time.thread_time()
        try:
            await original(self, message)
        finally:
            tap_cpu[0] += time.thread_time() - t0

    tap_module.LogTap.handle = handle  # type: ignore[method-assign]
    gc_time = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_time[1] = time.process_time()
        else:
            gc_time[0] += time.process_time() - gc_time[1]

    gc.callbacks.append(on_gc)
    clock = _task_clock() if by_task else None
    tasks: dict[str, list[float]] = {}
    if fmt == "scripted":
        from actors.providers.scripted import ScriptedProvider

        provider: Any = ScriptedProvider([[TextChunk(text=t) for t in delta_texts(n)]])
        floor = None
    else:
        provider = make_provider(fmt, server.url(fmt, n))
        floor, floor_close = floor_side(fmt, server.url(fmt, n))
    agent = Agent(name="bench", provider=provider, instructions=INSTRUCTIONS)
    out: dict[str, list[float]] = {p: [] for p in PIECES}
    counter = iter(range(10**9))
    try:
        async with Host.open(store=str(Path(directory) / "cpu.db")) as host:

            async def turn(keep: bool) -> None:
                sid = f"cpu-{next(counter)}"
                if floor is not None:
                    c = time.process_time()
                    await floor()
                    if keep:
                        out["floor"].append(time.process_time() - c)
                if keep and prof is not None:
                    prof.enable()
                if collect:
                    gc.collect()
                tap_cpu[0] = 0.0
                gc_time[0] = 0.0
                if clock is not None:
                    clock.cpu.clear()
                    clock.steps.clear()
                    clock.on = keep
                c0 = time.process_time()
                session = await host.open_session(agent, session_id=sid)
                c1 = time.process_time()
                async with session.stream(PROMPT) as stream:
                    async for _ in stream:
                        pass
                c2 = time.process_time()
                await session.close()
                c3 = time.process_time()
                record = await host.store.load(sid)
                c4 = time.process_time()
                if clock is not None:
                    clock.on = False
                    if keep:
                        for label, cpu in clock.cpu.items():
                            tasks.setdefault(label, []).append(cpu)
                            tasks.setdefault(label + " steps", []).append(clock.steps[label])
                if keep and prof is not None:
                    prof.disable()
                assert record is not None and stream.result is not None
                assert record.messages[-1] == stream.result.message
                if keep:
                    for piece, value in zip(
                        PIECES[:4], (c1 - c0, c2 - c1, c3 - c2, c4 - c3), strict=True
                    ):
                        out[piece].append(value)
                    out["log tap"].append(tap_cpu[0])
                    out["gc"].append(gc_time[0])

            for _ in range(warm):
                await turn(False)
            for i in range(rounds):
                if not ablate:
                    await turn(True)
                    continue
                for off in (False, True) if i % 2 else (True, False):
                    skip[0] = off
                    await turn(True)
                    if off:
                        out["tap off"].append(sum(out[p].pop() for p in PIECES[:4]))
                skip[0] = False
                out["paired"].append(sum(out[p][-1] for p in PIECES[:4]) - out["tap off"][-1])
    finally:
        if floor is not None:
            await floor_close()
    return {**out, "tasks": tasks}


def _task_clock() -> Any:
    """A :class:`benchmarks.task_steps.StepCounter` that also sums each label's thread
    CPU time over its steps (``--by-task``)."""
    import collections

    import trio

    from benchmarks.task_steps import StepCounter

    class TaskClock(StepCounter):
        def __init__(self) -> None:
            super().__init__()
            self.cpu: collections.Counter[str] = collections.Counter()
            self._t0 = 0.0

        def before_task_step(self, task: Any) -> None:
            super().before_task_step(task)
            self._t0 = time.thread_time()

        def after_task_step(self, task: Any) -> None:
            if self.on:
                self.cpu[self._label(task)] += time.thread_time() - self._t0

    clock = TaskClock()
    trio.lowlevel.add_instrument(clock)
    return clock


def _child(
    fmt: str,
    n: int,
    warm: int,
    rounds: int,
    profile: str,
    ablate: bool,
    collect: bool,
    by_task: bool,
) -> None:
    import trio

    from benchmarks.common import LogSink, LoopbackServer

    server = None if fmt == "scripted" else LoopbackServer([(fmt, n)])
    prof = cProfile.Profile() if profile else None
    try:
        with tempfile.TemporaryDirectory(prefix="axon-turn-pieces-") as directory:
            sink = LogSink(directory)
            try:
                result = trio.run(
                    _rounds, fmt, n, warm, rounds, server, directory, prof, ablate, collect, by_task
                )
                result["lines"] = sink.lines() / (warm + rounds)
            finally:
                sink.close()
    finally:
        if server is not None:
            server.close()
    if prof is not None:
        prof.dump_stats(profile)
    print("RESULT " + json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.turn_pieces")
    parser.add_argument("fmt", nargs="?", default="openai")
    parser.add_argument("--deltas", type=int, default=1000)
    parser.add_argument("--children", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--profile", default="")
    parser.add_argument("--tree", default=os.getcwd())
    parser.add_argument(
        "--ablate-tap",
        action="store_true",
        help="each round also a turn with the log tap's handle a no-op (paired, in process)",
    )
    parser.add_argument(
        "--collect", action="store_true", help="a full collection before each Axon turn"
    )
    parser.add_argument(
        "--by-task", action="store_true", help="each task's thread CPU and steps a turn"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(
            args.fmt,
            args.deltas,
            args.warm,
            args.rounds,
            args.profile,
            args.ablate_tap,
            args.collect,
            args.by_task,
        )
        return
    merged: dict[str, list[float]] = {p: [] for p in PIECES}
    lines = []
    tasks: dict[str, list[float]] = {}
    profiles = []
    for i in range(args.children):
        profile = f"{args.profile}.{i}" if args.profile else ""
        argv = [str(Path(__file__).resolve()), args.fmt, "--child", "--deltas", str(args.deltas)]
        argv += ["--warm", str(args.warm), "--rounds", str(args.rounds), "--profile", profile]
        argv += ["--ablate-tap"] if args.ablate_tap else []
        argv += ["--collect"] if args.collect else []
        argv += ["--by-task"] if args.by_task else []
        env = {**os.environ, "PYTHONPATH": args.tree}
        proc = subprocess.run(
            [sys.executable, "-P", *argv],
            env=env,
            cwd=args.tree,
            check=True,
            capture_output=True,
            text=True,
        )
        row = json.loads(proc.stdout.split("RESULT ", 1)[1])
        lines.append(row.pop("lines"))
        for label, values in row.pop("tasks").items():
            tasks.setdefault(label, []).extend(values)
        for piece in PIECES:
            merged[piece].extend(row[piece])
        if profile:
            profiles.append(profile)
    print(f"{args.fmt}, {args.deltas} deltas, warm {args.warm}, load {os.getloadavg()[0]:.1f}")
    axon = [sum(v) for v in zip(*(merged[p] for p in PIECES[:4]), strict=True)]
    for piece, values in [("Axon, all four", axon), *merged.items()]:
        if values:
            s = [v * 1e6 for v in sorted(values)]
            print(f"  {piece:15} {s[0]:8.0f} / {statistics.median(s):8.0f} / {s[-1]:8.0f} us")
    print(f"  log lines a turn: {statistics.median(lines):.1f}")
    for label in sorted(t for t in tasks if not t.endswith(" steps")):
        cpu = statistics.median(tasks[label]) * 1e6
        steps = statistics.median(tasks[label + " steps"])
        print(f"  task {label:40} {cpu:7.0f} us {steps:5.1f} steps")
    if profiles:
        import pstats

        stats = pstats.Stats(*profiles)
        stats.dump_stats(args.profile)
        for p in profiles:
            os.unlink(p)


if __name__ == "__main__":
    main()
