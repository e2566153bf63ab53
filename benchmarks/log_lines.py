"""What one log line costs the log tap, source trees side by side (by hand, issues 21/24).

``python3 -m benchmarks.log_lines --trees BASE,BRANCH [--children 6] [--rounds 7]
[--lines 6000]``: child processes, alternating the trees (each tree first on the child's
``PYTHONPATH`` and its working directory, so its own ``runtime`` and ``actors`` are
measured; the base is e.g. ``git worktree add --detach /work/tmp/base main``).

Each child configures logging as an application does (``configure_logging("info")`` into
a real file), then *records* the bus events the log tap is given over real embedded turns
on SQLite (the turns of :mod:`benchmarks.bench_approval`: a plain turn, and the same turn
suspended for approval, decided and resumed), with the tap's ``handle`` replaced by a
recorder so that nothing is written yet. Then it *replays* them through a fresh
:class:`~actors.log_tap.LogTap` (logger ``axon.events``, as the host makes it), one turn's
events at a time, timing each turn's lines by the thread's CPU time
(``time.thread_time``). Every line replayed is a distinct event (recorded once, replayed
once): ids, timestamps and turn ids differ from line to line as in production, so a cache
of strings seen before helps only as much as it would there. A warm-up of a few hundred
lines comes first.

Per round (``--lines`` lines, plain and approved turns alternated): microseconds per
line, and per turn of each kind (all of that turn's lines, as the log-line row of
:mod:`benchmarks.approval_breakdown` counts them, but without the task switches). The
parent prints each tree's min / median / max over all its children's rounds, and the
load average over the run.
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

WARM_TURNS = 20


async def _record(turns: int, directory: str) -> list[tuple[str, list[Any]]]:
    """The events the log tap is given over ``turns`` turns (half plain, half approved),
    grouped by turn: ``(kind, events)``."""
    import trio

    from actors.log_tap import LogTap
    from benchmarks.bench_approval import _agents, _check
    from benchmarks.common import PROMPT
    from runtime import Host

    seen: list[Any] = []

    async def record(self: Any, event: Any) -> None:
        seen.append(event)

    handle = LogTap.handle
    LogTap.handle = record  # type: ignore[method-assign]
    agents = _agents()
    groups: list[tuple[str, list[Any]]] = []
    try:
        async with Host.open(store=str(Path(directory) / "lines.db")) as host:
            for i in range(turns):
                kind = "plain" if i % 2 == 0 else "approved"
                session = await host.open_session(
                    agents["plain" if i % 2 == 0 else "asks"], f"s{i}"
                )
                if kind == "plain":
                    _check(await session.run(PROMPT), "stop", 2, kind)
                else:
                    waiting = await session.run(PROMPT)
                    await session.decide(waiting.pending[0].approval_id, approved=True)
                    async with session.resume() as stream:
                        async for _ in stream:
                            pass
                    _check(stream.result, "stop", 2, kind)
                await session.close()
                await trio.sleep(0.001)  # the tap drains what the turn put in its inbox
                groups.append((kind, seen[:]))
                seen.clear()
    finally:
        LogTap.handle = handle  # type: ignore[method-assign]
    return groups


async def _replay(groups: list[tuple[str, list[Any]]], rounds: int, lines: int) -> list[Any]:
    from actors.log_tap import LogTap

    tap = LogTap()
    clock = time.thread_time
    out = []
    at = 0

    async def play(count: int) -> tuple[float, int, dict[str, list[float]]]:
        nonlocal at
        spent, done = 0.0, 0
        per_turn: dict[str, list[float]] = {"plain": [], "approved": []}
        while done < count:
            kind, events = groups[at]
            at += 1
            t0 = clock()
            for event in events:
                await tap.handle(event)
            took = clock() - t0
            spent += took
            done += len(events)
            per_turn[kind].append(took)
        return spent, done, per_turn

    await play(WARM_TURNS * 18)
    for _ in range(rounds):
        spent, done, per_turn = await play(lines)
        out.append(
            {
                "per_line": spent / done,
                "plain": statistics.median(per_turn["plain"]),
                "approved": statistics.median(per_turn["approved"]),
            }
        )
    return out


def _child(rounds: int, lines: int) -> None:
    import trio

    from runtime import configure_logging

    with tempfile.TemporaryDirectory(prefix="axon-log-lines-") as directory:
        with open(Path(directory) / "axon.log.jsonl", "w", encoding="utf-8") as log:
            configure_logging("info", stream=log)
            # About 15 lines a plain turn and 21 an approved one: enough turns that no
            # event is replayed twice.
            turns = 2 * WARM_TURNS + (rounds * lines) // 15 + 2
            groups = trio.run(_record, turns, directory)
            result = trio.run(_replay, groups, rounds, lines)
            log.flush()
            written = sum(1 for _ in open(log.name, "rb"))
    print("RESULT " + json.dumps({"rounds": result, "written": written}))


def _run_child(tree: str, rounds: int, lines: int) -> dict[str, Any]:
    from benchmarks.common import run_tree_child  # the parent's tree: a child never calls it

    return dict(run_tree_child(__file__, tree, str(rounds), str(lines)))


def _spread(values: list[float], scale: float = 1e6, digits: int = 1) -> str:
    s = sorted(values)
    med = statistics.median(s)
    return f"{s[0] * scale:.{digits}f} / {med * scale:.{digits}f} / {s[-1] * scale:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.log_lines")
    parser.add_argument("--trees", default=os.getcwd(), help="comma-separated checkouts")
    parser.add_argument("--children", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--lines", type=int, default=6000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(int(args.child[0]), int(args.child[1]))
        return
    trees = args.trees.split(",")
    results: dict[str, list[dict[str, float]]] = {tree: [] for tree in trees}
    load = [os.getloadavg()]
    for child in range(args.children):
        for tree in trees if child % 2 == 0 else trees[::-1]:
            got = _run_child(tree, args.rounds, args.lines)
            results[tree].extend(got["rounds"])
            median = statistics.median(r["per_line"] for r in got["rounds"]) * 1e6
            print(f"child {child} {tree}: {median:.1f} us a line ({got['written']} written)")
            load.append(os.getloadavg())
    print(f"\n{'':30s} {'us a line':>20s} {'plain turn, us':>20s} {'approved turn, us':>20s}")
    print(f"{'':30s} {'min / median / max':>20s} {'':>20s} {'':>20s}")
    for tree, rows in results.items():
        print(
            f"{tree[-30:]:30s} {_spread([r['per_line'] for r in rows]):>20s}"
            f" {_spread([r['plain'] for r in rows], digits=0):>20s}"
            f" {_spread([r['approved'] for r in rows], digits=0):>20s}"
        )
    ones = [round(one, 2) for one, _, _ in load]
    print(f"load average (1 min) over the run: {min(ones)}-{max(ones)}, {ones}")


if __name__ == "__main__":
    main()
