"""The workers' relay-read approval figure with its reader in another process (issue 21).

Not one of the numbered figures: run it as ``python3 -m benchmarks.approval_worker_reader
[ROUNDS]`` (default 61) from the tree to measure (``PYTHONPATH`` at it).
:mod:`benchmarks.bench_approval`'s ``overhead_read`` row reads each turn's relay stream in
the worker's own process and event loop, as its row-looking client does; a worker
deployment's front end is another process, whose decoding of the chunks takes none of
the worker's loop time. This runs the same sides (:class:`~benchmarks.bench_approval.
_RelayClient`: the same submit, reads, decision and checks) both ways in one alternation,
one worker in this process: **in process** (the row's way) and **in a child** (a client
process of its own, told over a pipe which side to run; it times and checks the side
itself and answers with its seconds). It prints, per placement, the medians of the plain
and approved sides, the approved side's extra (difference of the medians, and the median
of the rounds' paired differences), the ratio to plain + a step commit's median (timed
here as the benchmark times it), and the client process's CPU a side (for the child:
its own, the worker's not in it).
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import tempfile
from typing import Any

import trio

CHILD_TAGS = 1_000_000
"""Where the child's session numbers start (this process's start at 0)."""


async def _child(url: str, prefix: str) -> None:
    """Run the side named on each line of stdin; answer with a JSON line on stdout."""
    from actors.relays import RedisRelay
    from actors.stores import open_store, turn_queue
    from benchmarks.bench_approval import _RelayClient, _worker_agents
    from benchmarks.bench_workers import REDIS_URL

    store = await open_store(url)
    queue = turn_queue(store)
    stdin = trio.lowlevel.FdStream(0)
    try:
        async with RedisRelay.open(REDIS_URL, prefix=prefix) as relay:
            client = _RelayClient(
                queue, store, relay, _worker_agents(), itertools.count(CHILD_TAGS)
            )
            pending = b""
            while True:
                while b"\n" not in pending:
                    got = await stdin.receive_some()
                    if not got:
                        return
                    pending += got
                line, pending = pending.split(b"\n", 1)
                side = line.decode()
                seconds = await getattr(client, side)()
                answer = {"seconds": seconds, "cpu": client.cpu[side][-1]}
                sys.stdout.write(json.dumps(answer) + "\n")
                sys.stdout.flush()
    finally:
        await queue.aclose()
        await store.aclose()


class _Pipe:
    """This process's end of the child's stdin and stdout."""

    def __init__(self, proc: Any) -> None:
        self.proc = proc
        self.pending = b""
        self.cpu: dict[str, list[float]] = {"plain": [], "approved": []}

    async def run(self, side: str) -> float:
        await self.proc.stdin.send_all(side.encode() + b"\n")
        while b"\n" not in self.pending:
            got = await self.proc.stdout.receive_some()
            if not got:
                raise RuntimeError("the child reader ended")
            self.pending += got
        line, self.pending = self.pending.split(b"\n", 1)
        answer = json.loads(line)
        self.cpu[side].append(answer["cpu"])
        return float(answer["seconds"])


async def _measure(rounds: int) -> dict[str, Any]:
    from actors.relays import RedisRelay
    from actors.stores import open_store, turn_queue
    from benchmarks.bench_approval import _RelayClient, _worker_agents, step_commit
    from benchmarks.bench_workers import REDIS_URL, _drop_schema, _schema_url
    from benchmarks.common import alternate
    from runtime.app.worker import Worker

    schema, url = _schema_url()
    prefix = f"axon-bench-{schema}:"
    agents = _worker_agents()
    tags = itertools.count()
    store = await open_store(url)
    queue = turn_queue(store)
    try:
        async with (
            RedisRelay.open(REDIS_URL, prefix=prefix) as relay,
            trio.open_nursery() as nursery,
        ):
            worker = Worker(store=store, relay=relay, agent=agents, poll=0.5, concurrency=1)
            await nursery.start(worker.run)
            here = _RelayClient(queue, store, relay, agents, tags)
            proc = await trio.lowlevel.open_process(
                [sys.executable, "-m", "benchmarks.approval_worker_reader", "--child", url, prefix],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            child = _Pipe(proc)

            commit = step_commit(store, tags)

            try:
                times = await alternate(
                    rounds,
                    2,
                    {
                        "plain, in process": here.plain,
                        "approved, in process": here.approved,
                        "plain, in a child": lambda: child.run("plain"),
                        "approved, in a child": lambda: child.run("approved"),
                        "commit": commit,
                    },
                )
            finally:
                assert proc.stdin is not None
                await proc.stdin.aclose()
                await proc.wait()
            worker.stop()
    finally:
        await queue.aclose()
        await store.aclose()
        await trio.to_thread.run_sync(_drop_schema, schema)
    cpu = {"in process": here.cpu, "in a child": child.cpu}
    return {
        "times": times,
        "cpu": {k: {s: v[-rounds:] for s, v in c.items()} for k, c in cpu.items()},
    }


def _report(found: dict[str, Any]) -> None:
    times, cpus = found["times"], found["cpu"]
    ms = 1e3
    commit = statistics.median(times["commit"])
    for where in ("in process", "in a child"):
        plain, approved = times[f"plain, {where}"], times[f"approved, {where}"]
        p, a = statistics.median(plain), statistics.median(approved)
        paired = statistics.median(x - y for x, y in zip(approved, plain, strict=True))
        cpu = {k: statistics.median(v) * ms for k, v in cpus[where].items()}
        print(
            f"{where:11s} plain {p * ms:6.2f}  approved {a * ms:6.2f}  extra {(a - p) * ms:5.2f} "
            f"(paired {paired * ms:5.2f})  ratio {a / (p + commit):.3f}x  client CPU "
            f"{cpu['plain']:.2f} / {cpu['approved']:.2f} ms"
        )
    print(f"a step commit {commit * ms:.2f} ms; medians of {len(times['commit'])} rounds")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        trio.run(_child, sys.argv[2], sys.argv[3])
        return
    from benchmarks.common import LogSink, count_argument

    rounds = count_argument(61, __doc__)
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)  # as bench_approval.run logs
        try:
            found = trio.run(_measure, rounds)
        finally:
            sink.close()
    _report(found)


if __name__ == "__main__":
    main()
