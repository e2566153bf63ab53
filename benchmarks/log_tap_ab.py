"""The log tap's CPU inside real turns, main's against this tree's, in one process (by
hand, issues 24 and 21).

``python3 -m benchmarks.log_tap_ab --base DIR [--rounds 30] [--turns 300] [--no-hold]``

Process-against-process figures of a turn swing by more than what a log line's changes
can move (``benchmarks.per_turn``: ±10 % at load 4). Here one process runs the turns of
:mod:`benchmarks.per_turn` (a fresh SQLite file, session and scripted 10-delta stream per
turn, logging at ``info`` into a file), swapping per round which log tap the host starts
and which redaction processor and time stamper the chain holds: the base tree's
``actors/log_tap.py``, ``runtime/redact.py`` and ``runtime/logging.py``'s ``UtcStamper``
(loaded from ``DIR``'s files; the rest of the runtime is this
tree's) against this tree's, alternating which side goes first. Per side: the process CPU
per turn, and the thread CPU spent in the tap's ``handle`` per turn (the tap's own
share, much steadier); the paired per-round differences; how many lines went out per
write. ``--no-hold``: the base side is this tree's tap writing every line at once
(what holding the lines of queued events saves, alone).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any


def _load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _spread(values: list[float]) -> str:
    s = sorted(values)
    return f"{s[0]:.1f} / {statistics.median(s):.1f} / {s[-1]:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.log_tap_ab")
    parser.add_argument("--base", required=True, help="a checkout of the commit to compare")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--no-hold", action="store_true")
    args = parser.parse_args()

    import structlog
    import trio

    import actors.log_tap as tap_module
    from benchmarks.per_turn import _child
    from runtime import configure_logging
    from runtime import redact as redaction

    base_redact = _load("base_redact", f"{args.base}/runtime/redact.py")
    base_logging = _load("base_logging", f"{args.base}/runtime/logging.py")
    base_tap = _load("base_log_tap", f"{args.base}/actors/log_tap.py")
    base_tap._chain_redacts = lambda logger: (  # main's tap asks whether its chain redacts
        base_redact.redact_processor in getattr(logger, "_processors", ())
    )
    tap_cpu = {"base": 0.0, "branch": 0.0}
    written: list[int] = []

    def timed(side: str, handle: Any) -> Any:
        clock = time.thread_time

        async def timed_handle(self: Any, event: Any) -> None:
            t0 = clock()
            try:
                await handle(self, event)
            finally:
                tap_cpu[side] += clock() - t0

        return timed_handle

    class BranchTap(tap_module.LogTap):
        def _write_held(self) -> None:
            if self._held:
                written.append(len(self._held))
            super()._write_held()

    class AtOnce(tap_module.LogTap):
        async def handle(self, event: Any) -> None:
            self._line(event)
            self._write_held()

    BranchTap.handle = timed("branch", BranchTap.handle)  # type: ignore[method-assign]
    AtOnce.handle = timed("base", AtOnce.handle)  # type: ignore[method-assign]
    base_tap.LogTap.handle = timed("base", base_tap.LogTap.handle)

    with tempfile.TemporaryDirectory(prefix="axon-log-tap-ab-") as directory:
        with open(Path(directory) / "axon.log.jsonl", "w", encoding="utf-8") as log:
            configure_logging("info", stream=log)
            chain = structlog.get_config()["processors"]
            at = chain.index(redaction.redact_processor)
            stamp = next(i for i, p in enumerate(chain) if type(p).__name__ == "UtcStamper")
            stampers = {"base": base_logging.UtcStamper(), "branch": chain[stamp]}

            def use(side: str) -> None:
                if side == "branch" or args.no_hold:
                    tap_module.LogTap = BranchTap if side == "branch" else AtOnce  # type: ignore[misc]
                    chain[at] = redaction.redact_processor
                    chain[stamp] = stampers["branch"]
                else:
                    tap_module.LogTap = base_tap.LogTap  # type: ignore[misc]
                    chain[at] = base_redact.redact_processor
                    chain[stamp] = stampers["base"]

            def turns(count: int, warm: int) -> float:
                return float(trio.run(_child, count, warm, 10, tempfile.mkdtemp(dir=directory)))

            for side in ("base", "branch"):
                use(side)
                turns(50, 100)
            written.clear()
            cpu: dict[str, list[float]] = {"base": [], "branch": []}
            tap: dict[str, list[float]] = {"base": [], "branch": []}
            loads = []
            for r in range(args.rounds):
                for side in ("base", "branch") if r % 2 == 0 else ("branch", "base"):
                    use(side)
                    before = tap_cpu[side]
                    cpu[side].append(turns(args.turns, 20) * 1e6)
                    tap[side].append((tap_cpu[side] - before) / (args.turns + 20) * 1e6)
                loads.append(os.getloadavg()[0])
    for side in ("base", "branch"):
        print(f"{side:7s} process CPU a turn, us (min / median / max): {_spread(cpu[side])}")
        print(f"{side:7s} the tap's handle a turn, us:                {_spread(tap[side])}")
    for name, values in (("process", cpu), ("tap", tap)):
        diffs = [b - a for a, b in zip(values["base"], values["branch"], strict=True)]
        print(f"paired {name} (branch - base) a turn: median {statistics.median(diffs):+.1f} us")
    print(f"branch: {sum(written) / max(1, len(written)):.2f} lines a write")
    print(f"load average (1 min) over the run: {min(loads):.2f}-{max(loads):.2f}")


if __name__ == "__main__":
    main()
