"""Figure 5c's extra, two trees side by side: the CPU time of importing the whole contract in
a fresh process that has imported the dependencies already.

Not one of the numbered figures (``python3 -m benchmarks --only startup`` is): run it as
``python3 -m benchmarks.startup_ab TREE_A,TREE_B [ROUNDS]`` (default 31). Each round
times, in fresh children alternated between the trees (first one tree first, then the
other), the process CPU time of ``import <the contract>`` after ``import trio, attrs,
cattrs, structlog``, and once per round the dependencies' own import (the figure's
denominator). Why apart from figure 5c: 5c divides two children's times, each over
300 ms on this machine, to show a difference of a few milliseconds; timing only the
contract's part resolves it. Children keep their bytecode under their own prefix, as
:mod:`benchmarks.bench_startup`'s do; the first child of each tree warms it (and writes
whatever the tree caches beside its bytecode) and is not counted.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile

DEPS = "trio, attrs, cattrs, structlog"
_CPU = "import time; c = time.process_time(); {stmt}; print(time.process_time() - c)"


def _env(tree: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(tempfile.gettempdir(), "axon-startup-ab")
    env["PYTHONPATH"] = tree
    return env


def _cpu(tree: str, code: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=_env(tree), capture_output=True, text=True
    )
    out.check_returncode()
    return float(out.stdout)


def _contract(tree: str) -> str:
    code = "from benchmarks.bench_startup import contract; print(contract())"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=_env(tree), capture_output=True, text=True
    )
    out.check_returncode()
    return out.stdout.strip()


def main() -> None:
    trees = [os.path.abspath(t) for t in sys.argv[1].split(",")]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 31
    stmts = {t: f"import {DEPS}; " + _CPU.format(stmt=f"import {_contract(t)}") for t in trees}
    for t in trees:
        _cpu(t, stmts[t])
    deps: list[float] = []
    times: dict[str, list[float]] = {t: [] for t in trees}
    for r in range(rounds):
        deps.append(_cpu(trees[0], _CPU.format(stmt=f"import {DEPS}")))
        for t in trees if r % 2 == 0 else trees[::-1]:
            times[t].append(_cpu(t, stmts[t]))
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    dep = statistics.median(deps)
    print(f"{rounds} rounds, load {load}; the dependencies' import: {dep * 1e3:.1f} ms CPU")
    for t in trees:
        v = [x * 1e3 for x in times[t]]
        mid = statistics.median(v)
        print(
            f"{t}: the contract after them {min(v):.1f} / {mid:.1f} / {max(v):.1f} ms "
            f"(min / median / max), {mid / (dep * 1e3):.1%} of the dependencies' import"
        )


if __name__ == "__main__":
    main()
