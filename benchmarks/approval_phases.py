"""Where an approved turn's extra sits, embedded on SQLite: in the suspended turn, the
decision, or the continuation, each set against the plain turn's own pieces.

Not one of the numbered figures (``python3 -m benchmarks`` does not run it): run it as
``python3 -m benchmarks.approval_phases [ROUNDS]`` (default 200) from the tree to
measure, e.g. ``PYTHONPATH=/path/to/tree``. One host (SQLite, the log tap at info into a
file) and :mod:`benchmarks.bench_approval`'s scripted stream; five sides, alternated
(each first in turn), each on a fresh session after a full collection, timed in the
event loop thread's CPU (:data:`_clock`), medians in microseconds:

* **plain**: the figure's plain turn (``act``, then 50 text deltas): two steps;
* **answer**: a turn of the second step alone (the same 50 deltas, no tool);
* **empty**: a turn whose one model call answers nothing (a turn's start and end, one
  model call, one save);
* **tool**: a turn of the first step alone (``act`` called and run, then the step
  budget, ``max_steps=1``, ends the turn): a turn's start and end around the tool step;
* **approved**: the figure's approved side, by phase: the turn that suspends
  (``session.run``), ``decide``, the continuation (``resume()``, read to its end);
* **respond**: the same turn suspended, then ``session.respond`` (decide and continue
  in one call, without the version query).

The plain turn is its tool step plus an answer step, so ``plain - answer`` is what the
tool step costs inside a turn, and the approved side's extra splits exactly into

* the suspension: ``suspend - (plain - answer)``, what the turn that stops costs over
  the same step inside a turn that goes on (its end, and the start the continuation
  needs, less the tool's run, which moved to the continuation);
* the decision: ``decide``;
* the continuation: ``resume - answer``, what the continuation costs over a turn of the
  answer step alone (the tool's run and its result's save, less what a continuation
  does not do that a new turn does).

And ``tool - (plain - answer)`` is what a turn's start and end cost around a step (the
plain turn pays them once for two steps), the size of the suspension's share.
The empty turn tells the same from another side, for scale.
"""

from __future__ import annotations

import gc
import itertools
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_approval import _agents, _answer, _check
from benchmarks.common import PROMPT, LogSink, count_argument

WARMUP = 20
_clock = time.thread_time
"""CPU time of the event loop's thread, where everything embedded runs."""
SIDES = ("plain", "answer", "empty", "tool", "approved", "respond")
PHASES = ("plain", "answer", "empty", "tool", "suspend", "decide", "resume", "r-suspend", "respond")
"""What is timed: the one-turn sides, and the two approval sides by phase (``r-suspend``:
the turn that suspends on the ``respond`` side)."""


async def measure(rounds: int, directory: str, warmup: int = WARMUP) -> dict[str, list[float]]:
    """Seconds of CPU per side and phase, ``rounds`` measured rounds each (after
    ``warmup`` rounds thrown away)."""
    from actors.providers.scripted import ScriptedProvider
    from runtime import Agent, Budget, Host

    agents = _agents()
    answer = _answer()

    def answers(chunks: list[Any]) -> Callable[[Any], list[Any]]:
        return lambda _request: chunks

    for name, chunks in (("answer", answer), ("empty", [])):
        agents[name] = Agent(
            name=name, provider=ScriptedProvider(responder=answers(chunks), keep_requests=0)
        )
    plain = agents["plain"]
    agents["tool"] = Agent(
        name="tool", provider=plain.provider, tools=plain.tools, budget=Budget(max_steps=1)
    )
    tags = itertools.count()
    out: dict[str, list[float]] = {k: [] for k in PHASES}

    async with Host.open(store=str(Path(directory) / "phases.db")) as host:

        async def one_turn(side: str, steps: int, finish: str = "stop") -> dict[str, float]:
            session = await host.open_session(agents[side], f"{side}-{next(tags)}")
            gc.collect()
            c0 = _clock()
            result = await session.run(PROMPT)
            spent = _clock() - c0
            _check(result, finish, steps, side)
            await session.close()
            return {side: spent}

        async def approved() -> dict[str, float]:
            session = await host.open_session(agents["asks"], f"a-{next(tags)}")
            gc.collect()
            c0 = _clock()
            waiting = await session.run(PROMPT)
            c1 = _clock()
            await session.decide(waiting.pending[0].approval_id, approved=True)
            c2 = _clock()
            async with session.resume() as stream:
                async for _ in stream:
                    pass
            c3 = _clock()
            _check(stream.result, "stop", 2, "resume")
            await session.close()
            return {"suspend": c1 - c0, "decide": c2 - c1, "resume": c3 - c2}

        async def respond() -> dict[str, float]:
            session = await host.open_session(agents["asks"], f"r-{next(tags)}")
            gc.collect()
            c0 = _clock()
            waiting = await session.run(PROMPT)
            c1 = _clock()
            result = await session.respond(waiting.pending[0].approval_id, approved=True)
            c2 = _clock()
            _check(result, "stop", 2, "respond")
            await session.close()
            return {"r-suspend": c1 - c0, "respond": c2 - c1}

        sides: dict[str, Callable[[], Awaitable[dict[str, float]]]] = {
            "plain": lambda: one_turn("plain", 2),
            "answer": lambda: one_turn("answer", 1),
            "empty": lambda: one_turn("empty", 1),
            "tool": lambda: one_turn("tool", 1, "budget"),
            "approved": approved,
            "respond": respond,
        }
        for i in range(warmup + rounds):
            shift = i % len(SIDES)
            for side in SIDES[shift:] + SIDES[:shift]:  # each side first in turn
                spent = await sides[side]()
                if i >= warmup:
                    for k, v in spent.items():
                        out[k].append(v)
    return out


def report(samples: dict[str, list[float]]) -> dict[str, float]:
    """Print the medians and the split of the extra; returns them (microseconds)."""
    us = {k: statistics.median(v) * 1e6 for k, v in samples.items()}
    tool_step = us["plain"] - us["answer"]
    approved = us["suspend"] + us["decide"] + us["resume"]
    ends = us["tool"] - tool_step
    split = {
        "extra": approved - us["plain"],
        "suspension": us["suspend"] - tool_step,
        "decision": us["decide"],
        "continuation": us["resume"] - us["answer"],
        "respond extra": us["r-suspend"] + us["respond"] - us["plain"],
    }
    print(f"{'CPU, us (medians)':28s}")
    for k in PHASES:
        print(f"  {k:26s} {us[k]:8.0f}")
    print(f"  {'tool step (plain - answer)':26s} {tool_step:8.0f}")
    print(f"  {'a turn start + end':26s} {ends:8.0f}   (tool - tool step)")
    print("the approved side's extra over the plain turn:")
    for k, v in split.items():
        print(f"  {k:26s} {v:+8.0f}")
    return {**us, **split, "tool step": tool_step, "turn start + end": ends}


def main() -> None:
    rounds = count_argument(200, __doc__)
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            samples = trio.run(measure, rounds, directory)
        finally:
            sink.close()
    report(samples)


if __name__ == "__main__":
    main()
