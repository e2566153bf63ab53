"""Shares of a sampled turn by actor, from py-spy's raw (collapsed) stacks (issue 24).

cProfile's per-call overhead inflates the small functions a delta's path is made of, so
the question "which stage costs what" is answered from samples instead::

    py-spy record -r 250 --nonblocking --format raw -o stacks.txt -- \\
        python3 -m benchmarks.profile anthropic --no-cprofile --deltas 10000 --turns 60
    python3 -m benchmarks.actor_shares stacks.txt

Each sample goes to the innermost frame of its stack that belongs to a stage
(:data:`STAGES`, first match walking from the leaf to the root): the provider (its
actor, the SDK, httpx and the SSE and JSON reads), the engine, the turn runner (with its
parts manager), the stream controller, the consumer (the turn's stream and the
benchmark's ``async for``), trio's scheduler and the actors' inboxes, the store and
persister, the log tap; what matches none is ``other``. Only samples taken inside
``trio.run`` count, and none importing a module or building a provider's SDK client
(the start-up, and what the first turn does once: the SDK's import, its client with
its TLS context). A C function (``orjson.loads``, a
SQLite statement) is not a frame of its own here: its time goes to the Python frame
that called it, which is the stage that asked for it.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable

STAGES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(r"[(/](" + pattern + ")"))
    for name, pattern in (
        (
            "provider",
            r"actors/providers/|runtime/provider\.py|anthropic/|openai/|httpx2?/|httpcore2?/"
            r"|h11/",
        ),
        ("engine", r"actors/engine\.py"),
        ("runner", r"actors/turn/"),
        ("controller", r"actors/stream_controller\.py"),
        ("consumer", r"runtime/app/session\.py|benchmarks/"),
        ("store", r"actors/stores/|actors/persister\.py|sqlite3/"),
        ("log", r"actors/log_tap\.py|runtime/logging\.py|structlog/"),
        ("scheduler/inboxes", r"trio/_core/|runtime/inbox\.py|runtime/actor\.py|outcome/"),
    )
)
"""Each stage and the file paths its frames come from, in the order a frame is tried."""


_TRIO = re.compile(r"[(/]trio/")
_ONCE = re.compile(r"importlib|\._get_client \(")
"""Work done once per process: an import, a provider's SDK client built on first use
(with its TLS context and its credentials registered with the redactor)."""


def stage_of(frames: list[str]) -> str:
    """The stage of a sample (frames root first): that of the innermost frame matching
    one, below trio's run loop (the frames every task's stack starts with); a sample in
    the run loop itself is the scheduler's."""
    start = 0
    while start < len(frames) and _TRIO.search(frames[start]):
        start += 1
    if start == len(frames):
        return "scheduler/inboxes"
    for frame in reversed(frames[start:]):
        for name, pattern in STAGES:
            if pattern.search(frame):
                return name
    return "other"


def shares(lines: Iterable[str]) -> tuple[Counter[str], int]:
    """Samples per stage, and their total, from py-spy's raw lines (``a;b;c count``)."""
    counts: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not _TRIO.search(stack) or _ONCE.search(stack):
            continue  # start-up, the first turn's imports and client: not a turn's work
        counts[stage_of(stack.split(";"))] += int(count)
    return counts, sum(counts.values())


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.actor_shares")
    parser.add_argument("stacks", help="py-spy record --format raw output")
    args = parser.parse_args()
    with open(args.stacks, encoding="utf-8") as f:
        counts, total = shares(f)
    for name, n in counts.most_common():
        print(f"{name:18} {100 * n / max(total, 1):5.1f} %  ({n} samples)")


if __name__ == "__main__":
    main()
