"""Axon's whole turn against the floor in process CPU time, trees side by side (issue 24).

Wall-clock ratios on the shared 2-core machine swing with its load; the process CPU time
(``time.process_time``) of the same reads moves much less. Each child process (one per tree,
format and delta count, the trees alternated) starts the benchmark's loopback server (its
CPU is not counted), opens a host as the pipeline benchmark does (SQLite store, log lines at
``info`` into a file), warms up (``--warm`` turns and reads, by default
``benchmarks.common.WARM_TURNS``, the same for every tree), then reads, round after round,
the floor (:mod:`benchmarks.floor`) and one Axon turn (:func:`benchmarks.bench_pipeline.
axon_side`, which checks the text and the stored message), each timed by its own CPU. The
parent prints, per tree and format, the median (and the min and max) of the per-round ratios
at 1,000 and 10,000 deltas and the split of the medians into a per-delta and a per-turn part
(a line through the two points). The Axon side's CPU includes the session's open and close
and the store read-back that the pipeline benchmark leaves off its clock, and what the turn
leaves its actors to do after its stream ended (their rests, the log tap's last lines): its
clock stops once every task waits (``trio.testing.wait_all_tasks_blocked``), where before
that work ran on the next floor read's clock (~3.5 task steps, ~110 us a turn, branch
``hops``).

``python3 -m benchmarks.cpu_floor --trees /work/main,$PWD [--formats anthropic,openai]
[--children 3] [--rounds 5] [--warm 10]``: each tree is put first on ``PYTHONPATH`` of its
children and is their working directory, so its own ``runtime``, ``actors`` and
``benchmarks`` are the ones measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

COUNTS = (1000, 10000)


async def _rounds(
    fmt: str, n: int, rounds: int, server: Any, directory: str, warm: int
) -> list[Any]:
    from trio.testing import wait_all_tasks_blocked

    from benchmarks.bench_pipeline import axon_side, make_provider
    from benchmarks.common import INSTRUCTIONS
    from benchmarks.floor import floor_side
    from runtime import Agent, Host

    url = server.url(fmt, n)
    agent = Agent(name="bench", provider=make_provider(fmt, url), instructions=INSTRUCTIONS)
    floor, floor_close = floor_side(fmt, url)
    out = []
    try:
        async with Host.open(store=str(Path(directory) / "cpu.db")) as host:
            axon = axon_side(host, agent, "cpu")
            # warm-up: imports, clients, connections, and CPython's specialisation of
            # what runs once a turn (``--warm``, by default ``benchmarks.common.WARM_TURNS``)
            for _ in range(warm):
                await axon()
                await wait_all_tasks_blocked()
                await floor()
                await wait_all_tasks_blocked()
            for _ in range(rounds):
                c0 = time.process_time()
                got = await floor()
                c1 = time.process_time()
                turn = await axon()
                # What the turn left for its actors to do after its stream ended (their
                # rests, the log tap's last lines) is the turn's: done on its clock, not
                # on the next floor read's.
                await wait_all_tasks_blocked()
                c2 = time.process_time()
                if len(got[2]) != n or turn[2] != got[2]:
                    raise RuntimeError("the floor and Axon did not read the same deltas")
                out.append((c1 - c0, c2 - c1))
    finally:
        await floor_close()
    return out


def _child(fmt: str, n: int, rounds: int, warm: int) -> None:
    import trio

    from benchmarks.common import LogSink, LoopbackServer

    server = LoopbackServer([(fmt, n)])
    try:
        with tempfile.TemporaryDirectory(prefix="axon-cpu-floor-") as directory:
            sink = LogSink(directory)
            try:
                result = trio.run(_rounds, fmt, n, rounds, server, directory, warm)
            finally:
                sink.close()
    finally:
        server.close()
    print("RESULT " + json.dumps(result))


def _run_child(tree: str, fmt: str, n: int, rounds: int, warm: int) -> list[Any]:
    from benchmarks.common import run_tree_child  # the parent's tree: a child never calls it

    return list(run_tree_child(__file__, tree, fmt, str(n), str(rounds), str(warm)))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.cpu_floor")
    parser.add_argument("--trees", default=os.getcwd(), help="comma-separated checkouts")
    parser.add_argument("--formats", default="anthropic,openai")
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--warm",
        type=int,
        default=None,
        help="turns (and floor reads) each child runs before its rounds (default WARM_TURNS)",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fmt, n, rounds, warm = args.child
        _child(fmt, int(n), int(rounds), int(warm))
        return
    if args.warm is None:
        from benchmarks.common import WARM_TURNS  # the parent's tree: the same for every tree

        args.warm = WARM_TURNS
    trees = args.trees.split(",")
    formats = args.formats.split(",")
    results: dict[tuple[str, str, int], list[Any]] = {}
    for child in range(args.children):
        order = trees if child % 2 == 0 else trees[::-1]
        for fmt in formats:
            for n in COUNTS:
                for tree in order:
                    rows = _run_child(tree, fmt, n, args.rounds, args.warm)
                    results.setdefault((tree, fmt, n), []).extend(rows)
    for fmt in formats:
        for tree in trees:
            medians = {}
            for n in COUNTS:
                rows = results[(tree, fmt, n)]
                floor = statistics.median(f for f, _ in rows)
                axon = statistics.median(a for _, a in rows)
                ratios = [a / f for f, a in rows]
                ratio = statistics.median(ratios)
                medians[n] = (floor, axon)
                print(
                    f"{fmt:9} {n:6} {tree}: Axon/floor {ratio:.2f}x"
                    f" (min {min(ratios):.2f}, max {max(ratios):.2f}), floor {floor * 1e3:.2f} ms,"
                    f" Axon {axon * 1e3:.2f} ms ({len(rows)} rounds)"
                )
            low, high = COUNTS
            for i, side in enumerate(("floor", "Axon")):
                per = (medians[high][i] - medians[low][i]) / (high - low)
                turn = medians[low][i] - low * per
                print(f"    {side}: {per * 1e6:.2f} us a delta, {turn * 1e3:.2f} ms a turn")


if __name__ == "__main__":
    main()
