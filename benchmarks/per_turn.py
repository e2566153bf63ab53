"""Per-turn CPU of one short embedded turn, two source trees side by side (by hand, issue 24).

``python3 -m benchmarks.per_turn --base DIR [--turns 2000] [--rounds 7] [--deltas 10]``
runs, alternately, one child process per tree (``--base DIR``, an export of the commit to
compare against, e.g. ``git archive <commit> | tar -x -C DIR``, then this worktree): each
child opens ``Host.open(store=<SQLite file>)`` with logging at ``info`` into a file (the log
tap on, as in the pipeline benchmark), runs 200 warm-up turns, then ``--turns`` turns of a
scripted provider streaming ``--deltas`` text deltas, each in a fresh session (open, stream,
close: what :func:`benchmarks.bench_pipeline.axon_side` times), and reports its CPU
(``time.process_time``: every thread, so SQLite's too) per measured turn. The figures are
each side's min / median / max over the rounds and the per-round ratio after / before.
The load average is printed beside them: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
WORDS = ["Paris", " is", " mild", " today", ",", " with", " light", " rain", " and", " wind"]


async def _child(turns: int, warm: int, deltas: int, directory: str) -> float:
    from actors.providers.scripted import ScriptedProvider
    from runtime import Agent, Host, TextChunk

    chunks = [TextChunk(text=WORDS[i % len(WORDS)]) for i in range(deltas)]
    agent = Agent(name="bench", provider=ScriptedProvider([chunks]), instructions="Be brief.")
    async with Host.open(store=str(Path(directory) / "turns.db")) as host:

        async def turn(i: int) -> None:
            session = await host.open_session(agent, session_id=f"s{i}")
            async with session.stream("Tell me about the weather in Paris.") as out:
                async for _ in out:
                    pass
            await session.close()
            if out.result is None or out.result.finish_reason != "stop":
                raise RuntimeError(f"the turn did not finish: {out.result}")

        for i in range(warm):
            await turn(i)
        t0 = time.process_time()
        for i in range(warm, warm + turns):
            await turn(i)
        return (time.process_time() - t0) / turns


def child_main(turns: int, warm: int, deltas: int) -> None:
    import trio

    from runtime import configure_logging

    with tempfile.TemporaryDirectory(prefix="axon-per-turn-") as directory:
        with open(Path(directory) / "axon.log.jsonl", "w", encoding="utf-8") as log:
            configure_logging("info", stream=log)
            cpu = trio.run(_child, turns, warm, deltas, directory)
    print(json.dumps({"cpu_per_turn": cpu}))


def run_child(tree: str, turns: int, warm: int, deltas: int) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    argv = ["--child", *map(str, (turns, warm, deltas))]
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["cpu_per_turn"])


def _spread(values: list[float], scale: float = 1e6) -> str:
    s = sorted(values)
    return f"{s[0] * scale:.0f} / {s[len(s) // 2] * scale:.0f} / {s[-1] * scale:.0f}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.per_turn")
    parser.add_argument("--base", required=True, help="the source tree to compare against")
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--deltas", type=int, default=10)
    args = parser.parse_args()
    sides: dict[str, list[float]] = {"before": [], "after": []}
    ratios: list[float] = []
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = [("before", args.base), ("after", str(HERE))]
        if r % 2:
            order.reverse()
        got = {name: run_child(tree, args.turns, args.warm, args.deltas) for name, tree in order}
        for name, cpu in got.items():
            sides[name].append(cpu)
        ratios.append(got["after"] / got["before"])
        load.append(os.getloadavg()[0])
        print(f"round {r}: before {got['before'] * 1e6:.0f} us, after {got['after'] * 1e6:.0f} us")
    for name, values in sides.items():
        print(f"{name}: CPU per turn min / median / max {_spread(values)} us")
    s = sorted(ratios)
    print(f"after / before min / median / max: {s[0]:.3f} / {s[len(s) // 2]:.3f} / {s[-1]:.3f}")
    print(f"load average (1 min) over the run: {min(load):.1f}-{max(load):.1f}")


if __name__ == "__main__":
    main()
