"""Count the scheduler's work in a turn: task steps per actor and scheduler rounds.

``python3 -m benchmarks.task_steps [scripted|openai|anthropic] [--deltas N] [--turns K]``
runs K turns exactly as :mod:`benchmarks.profile` does (the pipeline benchmark's Axon
side: a fresh session, the stream, the close, the store read-back; SQLite store, the log
tap at ``info``), after one warm-up turn, under a :class:`trio.abc.Instrument` that
counts every task step (``before_task_step``) by the actor the task runs (its name;
other tasks by their trio name) and every scheduler round (``before_io_wait``). Prints
the counts per turn. Counts, not times: they do not move with the machine's load, so
two trees compare exactly (``--tree DIR`` runs another checkout's code).

A task step is one resumption of a task: each inbox ``get`` that waits, each
checkpoint, each wake-up costs one, and each round of the scheduler runs the tasks made
runnable in the one before. The turn's fixed cost in the scheduler is about these.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
from pathlib import Path
from typing import Any

import trio


class StepCounter(trio.abc.Instrument):
    """Task steps by actor name (or task name), and scheduler rounds."""

    def __init__(self) -> None:
        self.steps: collections.Counter[str] = collections.Counter()
        self.rounds = 0
        self._labels: dict[Any, str] = {}
        self.on = False

    def _label(self, task: Any) -> str:
        label = self._labels.get(task)
        if label is None:
            label = task.name
            frame = getattr(task.coro, "cr_frame", None)
            actor = frame.f_locals.get("actor") if frame is not None else None
            name = getattr(actor, "name", None)
            if name is not None and "supervise" in task.name:
                label = f"actor:{name}"
            self._labels[task] = label
        return label

    def before_task_step(self, task: Any) -> None:
        if self.on:
            self.steps[self._label(task)] += 1

    def task_exited(self, task: Any) -> None:
        self._labels.pop(task, None)

    def before_io_wait(self, timeout: float) -> None:
        if self.on:
            self.rounds += 1


async def _turns(fmt: str, n: int, turns: int, server: Any, directory: str) -> StepCounter:
    from benchmarks.bench_pipeline import axon_side, make_provider
    from benchmarks.common import INSTRUCTIONS
    from benchmarks.sse import delta_texts
    from runtime import Agent, Host, TextChunk

    if fmt == "scripted":
        from actors.providers.scripted import ScriptedProvider

        provider: Any = ScriptedProvider([[TextChunk(text=t) for t in delta_texts(n)]])
    else:
        provider = make_provider(fmt, server.url(fmt, n))
    agent = Agent(name="bench", provider=provider, instructions=INSTRUCTIONS)
    counter = StepCounter()
    trio.lowlevel.add_instrument(counter)
    async with Host.open(store=str(Path(directory) / "steps.db")) as host:
        run = axon_side(host, agent, "steps")
        await run()  # warm-up: imports, client, connection
        counter.on = True
        for _ in range(turns):
            await run()
        counter.on = False
    return counter


def count(fmt: str, n: int, turns: int) -> StepCounter:
    """K turns of ``fmt`` with ``n`` deltas each, counted (see the module's docstring)."""
    from benchmarks.common import LogSink, LoopbackServer

    server = None if fmt == "scripted" else LoopbackServer([(fmt, n)])
    try:
        with tempfile.TemporaryDirectory(prefix="axon-steps-") as directory:
            sink = LogSink(directory)
            try:
                return trio.run(_turns, fmt, n, turns, server, directory)
            finally:
                sink.close()
    finally:
        if server is not None:
            server.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.task_steps")
    parser.add_argument(
        "fmt", nargs="?", default="scripted", choices=("openai", "anthropic", "scripted")
    )
    parser.add_argument("--deltas", type=int, default=1)
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    counter = count(args.fmt, args.deltas, args.turns)
    k = args.turns
    total = sum(counter.steps.values())
    print(f"== {args.fmt}, {k} turns x {args.deltas} deltas: per turn ==")
    print(f"scheduler rounds {counter.rounds / k:8.2f}")
    print(f"task steps       {total / k:8.2f}")
    for label, steps in counter.steps.most_common():
        print(f"  {steps / k:8.2f}  {label}")


if __name__ == "__main__":
    main()
