"""Instructions a turn, Axon's and the floor's, counted by callgrind (issue 24 goal 1).

CPU time on the shared 2-core machine moves with its load; the instructions a process
executes do not. One child a tree runs under ``valgrind --tool=callgrind`` (the loopback
server, a separate process, is not counted): it opens a host as :mod:`benchmarks.cpu_floor`
does (SQLite store, log lines at ``info`` into a file), warms up both sides (``--warm``
turns and reads each, by default ``benchmarks.common.WARM_TURNS``: past CPython 3.11's
specialisation of what runs once a turn), then runs ``turns`` reads of the floor
(:mod:`benchmarks.floor`), then ``turns`` Axon turns, each in a fresh session
(:func:`benchmarks.bench_pipeline.axon_side`, which checks the text and the stored message),
and waits until every task waits after each. Each side's counted part follows one more of
its own, not counted, so that its client's pooled connection is fresh: idle through the
other side's counted part (~5 s under callgrind) it could outlive the pool's 5 s keep-alive,
and the first counted turn then connected again, or not, as the machine's load had it; nor
does any pooled connection expire in the child (:func:`_keep_connections`). Callgrind's
counters are dumped (and so reset) before each side's reads (``os.getloadavg`` marks the
spot: ``--dump-before=getloadavg``) and after them (``os.sched_get_priority_max``), so
start-up, imports and warm-up are not counted: the dumps ``.2`` (the floor) and ``.4``
(Axon) are the counted parts, ``.1`` and ``.3`` the stretches before. (``--zero-before``
reset the summary but not every function's cost: a dump's functions carried up to 75 M
instructions of the imports and warm-up, so a zeroed dump could be read only as its total.)
``PYTHONHASHSEED`` and Trio's scheduler's random draws are fixed.

``--collect``: a full garbage collection before each side's counted part. Without it the
collections that fall in the window depend on the collector's phase, which any change to a
turn's allocations shifts: a gen-1 or gen-2 collection more or less in one tree's window
moved a 1,000-delta turn's count by ~300k instructions (1.5 %) between two trees differing
by ~20k (branch ``anthperf2``); with it both trees start from the same phase.

``--cache``: callgrind also simulates the caches and the branch predictor (``--cache-sim=yes
--branch-sim=yes``, the simulator cachegrind uses, kept under callgrind for its
zero/dump marks): a turn's first-level data misses (D1mr + D1mw), last-level misses (DLmr +
DLmw + ILmr), instruction-cache misses and mispredicted branches (Bcm + Bim), Axon's and the
floor's. The simulated caches are this machine's (Zen 5): I1 32 KiB 8-way, D1 48 KiB
12-way, and as the last level its private 1 MiB 16-way L2 (``CACHE_LL``), not the 32 MiB L3
shared with the other core: a turn's working set fits the L3, so the misses that cost are
the L2's. Deterministic like the instruction count; ~1.5x slower.

``python3 -m benchmarks.instr_count --trees /work/main,$PWD [--formats anthropic]
[--deltas 1000] [--turns 10] [--warm 10] [--collect] [--cache]``: each tree is put first on
``PYTHONPATH`` of its children, as :mod:`benchmarks.cpu_floor` does. Under callgrind a
1,000-delta Axon turn takes ~0.5 s; a child's start ~30 s.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

PARTS = (2, 4)
CACHE_I1 = "32768,8,64"
CACHE_D1 = "49152,12,64"
CACHE_LL = "1048576,16,64"
CACHE_EVENTS = ("Ir", "D1 miss", "LL miss", "I1 miss", "mispredicts", "branches")


async def _reads(
    fmt: str, n: int, turns: int, server: object, directory: str, collect: bool, warm: int
) -> None:
    from trio.testing import wait_all_tasks_blocked

    from benchmarks.bench_pipeline import axon_side, make_provider
    from benchmarks.common import INSTRUCTIONS
    from benchmarks.floor import floor_side
    from runtime import Agent, Host

    url = server.url(fmt, n)  # type: ignore[attr-defined]
    agent = Agent(name="bench", provider=make_provider(fmt, url), instructions=INSTRUCTIONS)
    floor, floor_close = floor_side(fmt, url)
    try:
        async with Host.open(store=str(Path(directory) / "cg.db")) as host:
            axon = axon_side(host, agent, "cg")
            for _ in range(warm):
                await axon()
                await wait_all_tasks_blocked()
                await floor()
                await wait_all_tasks_blocked()
            for side, run in (("floor", floor), ("axon", axon)):
                # One more of this side's, not counted, just before its counted ones: its
                # client's pooled connection is fresh. Idle through the other side's
                # counted part (~5 s under callgrind, more under load) it outlived the
                # pool's 5 s keep-alive, and a reconnect in the first counted turn
                # depended on the machine's load (branch ``instrperf``).
                await run()
                await wait_all_tasks_blocked()
                if collect:  # both sides, both trees, from the collector's same phase
                    gc.collect()
                os.getloadavg()  # callgrind: dump and reset the counters
                for _ in range(turns):
                    got = await run()
                    await wait_all_tasks_blocked()
                    if len(got[2]) != n:
                        raise RuntimeError(f"{side} read {len(got[2])} deltas, not {n}")
                os.sched_get_priority_max(0)  # callgrind: dump the counters
    finally:
        await floor_close()


def _keep_connections() -> None:
    """No pooled connection expires in this process: a turn or read slower than the
    pools' 5 s keep-alive (a full collection and a turn under callgrind, at a load of
    ~10) made the next one connect again, ~0.1-0.2 M instructions counted or not as the
    machine's load had it (branch ``instrperf``). Both sides' pools (httpcore: the
    floor's httpx; httpcore2: the SDKs') and every tree alike."""
    for name in ("httpcore", "httpcore2"):
        try:
            http11 = importlib.import_module(f"{name}._async.http11")
        except ImportError:
            continue
        http11.AsyncHTTP11Connection.has_expired = lambda self: False


def _child(fmt: str, n: int, turns: int, collect: bool, warm: int) -> None:
    import trio

    from benchmarks.common import LogSink, LoopbackServer

    # Trio reverses a scheduler round's batch at random (and draws its clock's offset):
    # seeded, both trees' runs make the same draws while their rounds match.
    trio._core._run._r.seed(0)
    _keep_connections()
    server = LoopbackServer([(fmt, n)])
    try:
        with tempfile.TemporaryDirectory(prefix="axon-instr-") as directory:
            sink = LogSink(directory)
            try:
                trio.run(_reads, fmt, n, turns, server, directory, collect, warm)
            finally:
                sink.close()
    finally:
        server.close()


def _cache_counts(text: str) -> dict[str, int]:
    """The simulated events of a callgrind dump, folded into :data:`CACHE_EVENTS`."""
    names = re.search(r"^events: (.+)$", text, re.M)
    found = re.search(r"^summary: ([\d ]+)$", text, re.M)
    if names is None or found is None:
        raise RuntimeError("no events or summary line")
    got = dict(zip(names.group(1).split(), map(int, found.group(1).split()), strict=False))
    return {
        "Ir": got["Ir"],
        "D1 miss": got["D1mr"] + got["D1mw"],
        "LL miss": got["DLmr"] + got["DLmw"] + got["ILmr"],
        "I1 miss": got["I1mr"],
        "mispredicts": got["Bcm"] + got["Bim"],
        "branches": got["Bc"] + got["Bi"],
    }


def cache_count(
    tree: str,
    fmt: str,
    n: int,
    turns: int,
    out: str,
    collect: bool = False,
    warm: int | None = None,
) -> tuple[dict[str, int], dict[str, int]]:
    """Simulated cache and branch events of the floor's ``turns`` reads and of Axon's
    ``turns`` turns (see ``--cache``)."""
    _run(tree, fmt, n, turns, out, collect, cache=True, warm=warm)
    floor, axon = (
        _cache_counts(Path(f"{out}.{part}").read_text(errors="replace")) for part in PARTS
    )
    return floor, axon


def count(
    tree: str,
    fmt: str,
    n: int,
    turns: int,
    out: str,
    collect: bool = False,
    warm: int | None = None,
) -> tuple[int, int]:
    """Ir of the floor's ``turns`` reads and of Axon's ``turns`` turns, one child under
    callgrind (``collect``: a full collection before each side's)."""
    _run(tree, fmt, n, turns, out, collect, warm=warm)
    counts = []
    for part in PARTS:
        text = Path(f"{out}.{part}").read_text(errors="replace")
        found = re.search(r"^summary: (\d+)", text, re.M)
        if found is None:
            raise RuntimeError(f"no summary in {out}.{part}")
        counts.append(int(found.group(1)))
    return counts[0], counts[1]


def _run(
    tree: str,
    fmt: str,
    n: int,
    turns: int,
    out: str,
    collect: bool,
    cache: bool = False,
    warm: int | None = None,
) -> None:
    if warm is None:
        from benchmarks.common import WARM_TURNS

        warm = WARM_TURNS
    env = {**os.environ, "PYTHONPATH": tree, "PYTHONHASHSEED": "0"}
    simulate = [
        "--cache-sim=yes",
        "--branch-sim=yes",
        f"--I1={CACHE_I1}",
        f"--D1={CACHE_D1}",
        f"--LL={CACHE_LL}",
    ]
    argv = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--dump-before=getloadavg",
        "--dump-before=sched_get_priority_max",
        *(simulate if cache else []),
        sys.executable,
        "-P",
        __file__,
        "--child",
        fmt,
        str(n),
        str(turns),
        str(int(collect)),
        str(warm),
    ]
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the child in {tree} failed:\n{done.stderr[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.instr_count")
    parser.add_argument("--trees", default=os.getcwd(), help="comma-separated checkouts")
    parser.add_argument("--formats", default="anthropic")
    parser.add_argument("--deltas", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--out", default=tempfile.gettempdir(), help="callgrind files here")
    parser.add_argument(
        "--collect",
        action="store_true",
        help="a full garbage collection before each side's counted part",
    )
    parser.add_argument(
        "--cache",
        action="store_true",
        help="also simulate the caches and branches: misses and mispredicts a turn",
    )
    parser.add_argument(
        "--warm",
        type=int,
        default=None,
        help="turns (and reads) each side runs before the counted ones (default WARM_TURNS)",
    )
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fmt, n, turns, collect, warm = args.child
        _child(fmt, int(n), int(turns), collect == "1", int(warm))
        return
    trees = args.trees.split(",")
    for fmt in args.formats.split(","):
        for i, tree in enumerate(trees):
            path = f"{args.out}/cg.{fmt}.{args.deltas}.{i}"
            if args.cache:
                sides = cache_count(
                    tree, fmt, args.deltas, args.turns, path, args.collect, args.warm
                )
                print(f"{fmt} {args.deltas} {tree} ({path}.2, .4), a turn:", flush=True)
                for event in CACHE_EVENTS:
                    floor, axon = (side[event] / args.turns for side in sides)
                    print(
                        f"  {event:<12} floor {floor:>13,.0f}  Axon {axon:>13,.0f}"
                        f"  {axon / floor:.3f}x",
                        flush=True,
                    )
                continue
            counts = count(tree, fmt, args.deltas, args.turns, path, args.collect, args.warm)
            floor, axon = (c / args.turns for c in counts)
            print(
                f"{fmt} {args.deltas} {tree}: floor {floor:,.0f} Ir a read,"
                f" Axon {axon:,.0f} Ir a turn, {axon / floor:.3f}x ({path}.2, .4)",
                flush=True,
            )


if __name__ == "__main__":
    main()
