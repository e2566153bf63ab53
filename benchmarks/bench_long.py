"""4. Long sessions: what persisting turn 500 costs relative to turn 1 (SQLite store).

Two measurements, both alternating turn 1 and turn 500 round by round:

* **save**: ``store.save()`` of one turn's messages (user, assistant with a tool call
  and a 200-delta answer, tool result) into a session that holds 0 messages versus one
  that holds 499 such turns (1,497 messages). The save replaces from the turn's first
  index, exactly as the turn runner's saves do; repeating it rewrites the same rows.
* **whole turn**: one full Axon turn (scripted provider, same shape) in a fresh session
  versus in a session resumed from the store with 499 turns of history; each round uses
  sessions of its own, opened (and loaded) before the clock starts.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import trio

from benchmarks.bench_concurrency import make_agent
from benchmarks.common import Figure, LogSink, Sizes, alternate, median, now
from benchmarks.sse import delta_texts

TARGET = 1.5
DELTAS = 200


def turn_messages(i: int) -> tuple[Any, ...]:
    from runtime import AssistantMessage, TextPart, ToolCallPart, ToolMessage, UserMessage

    call = f"call_{i:06d}"
    return (
        UserMessage(content=f"Question {i}: what is the weather in Paris?"),
        AssistantMessage(
            content=(
                ToolCallPart(
                    tool_call_id=call, tool_name="lookup", input={"city": "Paris"}, step=0
                ),
                TextPart(text="".join(delta_texts(DELTAS)), step=1),
            )
        ),
        ToolMessage(tool_call_id=call, tool_name="lookup", step=0, output="sunny in Paris"),
    )


def history(turns: int) -> list[Any]:
    return [m for i in range(turns) for m in turn_messages(i)]


async def _measure(sizes: Sizes, directory: str) -> list[Figure]:
    from actors.stores.sqlite import SQLiteStore
    from runtime import Host

    long_turns = sizes.long_turns
    before = history(long_turns - 1)
    meta = {"agent": "bench"}
    figures: list[Figure] = []

    # -- store.save of one turn -----------------------------------------------------------
    store = await SQLiteStore.open(Path(directory) / "save.db")
    try:
        await store.save("long", 0, before, meta)
        first, last = turn_messages(0), turn_messages(long_turns - 1)

        async def save_first() -> float:
            t0 = now()
            await store.save("short", 0, first, meta)
            return now() - t0

        async def save_last() -> float:
            t0 = now()
            await store.save("long", len(before), last, meta)
            return now() - t0

        times = await alternate(
            sizes.long_save_reps, 2, {"1": save_first, "n": save_last}, collect=False
        )
    finally:
        await store.aclose()
    t1, tn = median(times["1"]), median(times["n"])
    value = tn / t1
    figures.append(
        Figure(
            key="long.save",
            title=f"4. Persist turn {long_turns} / turn 1 (store.save)",
            value=value,
            unit="x",
            target=f"<= {TARGET:g}",
            passed=value <= TARGET,
            detail=f"turn 1 {t1 * 1e6:.0f} us, turn {long_turns} {tn * 1e6:.0f} us",
            data={"reps": sizes.long_save_reps, "turn1_s": times["1"], "turnN_s": times["n"]},
        )
    )

    # -- one whole turn -----------------------------------------------------------------
    sink = LogSink(directory)
    try:
        path = Path(directory) / "turns.db"
        rounds = sizes.long_turn_rounds + 1  # +1 warm-up
        store = await SQLiteStore.open(path)
        try:
            for r in range(rounds):
                await store.save(f"long-{r}", 0, before, meta)
        finally:
            await store.aclose()
        agent = make_agent(DELTAS)
        async with Host.open(store=str(path)) as host:
            fresh, resumed = itertools.count(), itertools.count()

            async def one(session: Any) -> float:
                t0 = now()
                result = await session.run("Weather in Paris?")
                seconds = now() - t0
                if result.finish_reason != "stop" or result.steps != 2:
                    raise RuntimeError(f"long sessions: turn ended {result}")
                await session.close()
                return seconds

            async def turn_first() -> float:
                session = await host.open_session(agent, session_id=f"fresh-{next(fresh)}")
                return await one(session)

            async def turn_last() -> float:
                session = await host.open_session(agent, session_id=f"long-{next(resumed)}")
                if len(session.messages) != len(before):
                    raise RuntimeError("long sessions: the history did not load")
                return await one(session)

            turn_times = await alternate(
                sizes.long_turn_rounds, 1, {"1": turn_first, "n": turn_last}
            )
    finally:
        sink.close()
    t1, tn = median(turn_times["1"]), median(turn_times["n"])
    figures.append(
        Figure(
            key="long.turn",
            title=f"4. Whole turn {long_turns} / turn 1 (scripted, SQLite)",
            value=tn / t1,
            unit="x",
            target=f"<= {TARGET:g}",
            passed=tn / t1 <= TARGET,
            detail=f"turn 1 {t1 * 1e3:.2f} ms, turn {long_turns} {tn * 1e3:.2f} ms",
            data={
                "rounds": sizes.long_turn_rounds,
                "turn1_s": turn_times["1"],
                "turnN_s": turn_times["n"],
            },
        )
    )
    return figures


def run(sizes: Sizes) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        return trio.run(_measure, sizes, directory)
