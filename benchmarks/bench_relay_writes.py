"""The relay's writing side alone: CPU per turn of a process whose 8 turns at once go
through :class:`~actors.relays.RedisRelay` writers (issue 24 goal 3).

A worker's CPU per turn (``bench_turn_cpu``) swings by a millisecond from round to round
on the shared benchmark machine, more than the relay's whole share of it; this isolates
the relay. Each simulated turn appends the chunks a worker's one-step tool turn of
``benchmarks.workers_agent`` appends, with its gaps (a burst, the tool step's save, the
text step's deltas 0.2 ms apart, the last save, the queue's end), then closes its writer
as the worker does; 8 run at once. Figures: the process's CPU per turn
(``time.process_time``) over the measured turns after a warm-up, and (``--count``, a
separate run: the instrument costs CPU) Trio scheduler passes (``before_io_wait``) and
task wake-ups (``task_scheduled``) per turn, the relay's ``XADD`` entries and pipelines
per turn. Against a throwaway Redis (``tests/support/services.py``) or ``AXON_BENCH_REDIS``.

By hand: ``python3 -m benchmarks.bench_relay_writes [--turns 2000] [--rounds 5] [--count]``.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import trio
import trio.abc

CONCURRENCY = 8


class _Count(trio.abc.Instrument):
    def __init__(self) -> None:
        self.passes = 0
        self.wakeups = 0

    def before_io_wait(self, timeout: float) -> None:
        self.passes += 1

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        self.wakeups += 1


async def _turn(relay: Any, i: int, stats: dict[str, int]) -> None:
    from runtime import output as o
    from runtime.chunks import Usage

    writer = relay.writer(session_id=f"s{i}", turn_id=f"t{i}", fresh=True)
    call = f"call{i}"
    usage = Usage(input_tokens=1, output_tokens=1, total_tokens=2)
    for chunk in (
        o.Start(message_id=f"m{i}"),
        o.StepStart(step=0),
        o.ToolInputStart(step=0, tool_call_id=call, tool_name="lookup"),
    ):
        writer.append(chunk)
    for part in ('{"q"', ': "x', '"}'):
        await trio.sleep(0.0002)
        writer.append(o.ToolInputDelta(step=0, tool_call_id=call, delta=part))
    writer.append(o.ToolCall(step=0, tool_call_id=call, tool_name="lookup", input={"q": "x"}))
    await trio.sleep(0.0005)  # the tool
    writer.append(o.ToolResult(step=0, tool_call_id=call, tool_name="lookup", output="42"))
    writer.append(o.StepFinish(step=0, finish_reason="tool-calls", usage=usage))
    await trio.sleep(0.002)  # the tool step's save
    writer.append(o.StepStart(step=1))
    await trio.sleep(0.0005)
    writer.append(o.TextStart(step=1, part_id="p"))
    for k in range(20):
        writer.append(o.TextDelta(step=1, part_id="p", text=f" word{k}"))
        await trio.sleep(0.0002)
    writer.append(o.TextFinish(step=1, part_id="p"))
    writer.append(o.StepFinish(step=1, finish_reason="stop", usage=usage))
    await trio.sleep(0.002)  # the last save
    writer.append(o.Finish(finish_reason="stop", usage=usage))
    await trio.sleep(0.003)  # the queue says the turn ended
    await writer.aclose()
    stats["entries"] += writer.flushes


async def _batch(relay: Any, first: int, turns: int, stats: dict[str, int]) -> None:
    limit = trio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with limit:
            await _turn(relay, i, stats)

    async with trio.open_nursery() as nursery:
        for i in range(first, first + turns):
            nursery.start_soon(one, i)


async def measure(url: str, turns: int, warm: int, count: bool) -> dict[str, float]:
    from actors.relays import RedisRelay

    prefix = f"axonbench:{uuid.uuid4().hex[:10]}:"
    stats = {"entries": 0}
    async with RedisRelay.open(url, prefix=prefix) as relay:
        await _batch(relay, 0, warm, stats)
        counter = _Count()
        if count:
            trio.lowlevel.add_instrument(counter)
        stats["entries"] = 0
        pipelines = relay.batcher.pipelines
        t0 = time.process_time()
        await _batch(relay, warm, turns, stats)
        cpu = time.process_time() - t0
        if count:
            trio.lowlevel.remove_instrument(counter)
        pipelines = relay.batcher.pipelines - pipelines
        keys = [key async for key in relay.client.scan_iter(match=f"{prefix}*", count=1000)]
        for i in range(0, len(keys), 500):
            await relay.client.delete(keys[i : i + 500])
    got = {
        "cpu_ms": cpu / turns * 1000,
        "entries": stats["entries"] / turns,
        "pipelines": pipelines / turns,
    }
    if count:
        got |= {"passes": counter.passes / turns, "wakeups": counter.wakeups / turns}
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--warm", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--count", action="store_true")
    args = parser.parse_args()
    import os

    url = os.environ.get("AXON_BENCH_REDIS")
    if url is None:
        from tests.support.services import own_redis

        url = own_redis().url
    for _ in range(args.rounds):
        got = trio.run(measure, url, args.turns, args.warm, args.count)
        print(json.dumps({"load": os.getloadavg()[0], **{k: round(v, 3) for k, v in got.items()}}))


if __name__ == "__main__":
    main()
