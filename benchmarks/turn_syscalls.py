"""The system calls of a turn of ``benchmarks.cpu_floor``'s Axon side, counted (by hand,
issue 24 goal 1; needs ``strace``).

``python3 -m benchmarks.turn_syscalls [openai|anthropic|scripted] [--deltas N] [--turns K]
[--tree DIR]`` runs a child under ``strace -f`` that makes 3 warm-up turns and then K
turns exactly as :mod:`benchmarks.task_steps` does (the pipeline benchmark's Axon side: a
fresh session, the stream, the close, the store read-back; SQLite store, the log tap at
``info`` into a file), and prints the system calls of the event loop's thread per turn,
by name (the loopback server's, in its own process, apart). Counts, not times: they do
not move with the machine's load. A turn's calls are the scheduler's rounds
(``epoll_wait``), SQLite's locks on its shared memory (``fcntl``, two a transaction) and
its log frames (``pwrite64``, two a page a commit), the log lines' writes, the request's
sends and the response's reads; the floor's read makes the last two only.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_BEGIN, _END = "/axon-turn-syscalls-begin", "/axon-turn-syscalls-end"
"""Paths the child asks ``os.access`` about around the counted turns: markers in the trace."""


async def _turns(fmt: str, n: int, turns: int, server: Any, directory: str) -> None:
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
    async with Host.open(store=str(Path(directory) / "syscalls.db")) as host:
        run = axon_side(host, agent, "syscalls")
        for _ in range(3):  # imports, the client, the connection
            await run()
        os.access(_BEGIN, os.F_OK)
        for _ in range(turns):
            await run()
        os.access(_END, os.F_OK)


def _child(fmt: str, n: int, turns: int) -> None:
    import trio

    from benchmarks.common import LogSink, LoopbackServer

    server = None if fmt == "scripted" else LoopbackServer([(fmt, n)])
    try:
        with tempfile.TemporaryDirectory(prefix="axon-syscalls-") as directory:
            sink = LogSink(directory)
            try:
                trio.run(_turns, fmt, n, turns, server, directory)
            finally:
                sink.close()
    finally:
        if server is not None:
            server.close()


def count(trace: str, turns: int) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Per-name counts between the markers: the marking thread's, everyone else's."""
    lines = Path(trace).read_text(errors="replace").splitlines()
    begin = next(i for i, line in enumerate(lines) if _BEGIN in line)
    end = next(i for i, line in enumerate(lines) if _END in line)
    loop = lines[begin].split()[0]
    mine: collections.Counter[str] = collections.Counter()
    others: collections.Counter[str] = collections.Counter()
    call = re.compile(r"\d+\s+(?:<\.\.\. )?(\w+)(?:\(| resumed)")
    for line in lines[begin + 1 : end]:
        found = call.match(line)
        if found is None or "resumed" in line:  # an unfinished call is counted once
            continue
        (mine if line.split()[0] == loop else others)[found.group(1)] += 1
    return mine, others


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.turn_syscalls")
    parser.add_argument(
        "fmt", nargs="?", default="openai", choices=("openai", "anthropic", "scripted")
    )
    parser.add_argument("--deltas", type=int, default=1)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--tree", default=os.getcwd(), help="the checkout to run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.fmt, args.deltas, args.turns)
        return
    with tempfile.TemporaryDirectory(prefix="axon-strace-") as scratch:
        trace = str(Path(scratch) / "trace.txt")
        argv = [sys.executable, "-P", str(Path(__file__).resolve()), "--child", args.fmt]
        argv += ["--deltas", str(args.deltas), "--turns", str(args.turns)]
        env = {**os.environ, "PYTHONPATH": args.tree}
        subprocess.run(
            ["strace", "-f", "-qq", "-o", trace, *argv], cwd=args.tree, env=env, check=True
        )
        mine, others = count(trace, args.turns)
    k = args.turns
    print(f"{args.fmt}, {args.deltas} deltas, {k} turns: system calls a turn")
    print(f"  event loop's thread {sum(mine.values()) / k:.1f}")
    for name, value in mine.most_common():
        print(f"    {name:14} {value / k:6.1f}")
    print(f"  other threads and processes {sum(others.values()) / k:.1f}")


if __name__ == "__main__":
    main()
