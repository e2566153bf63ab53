"""Profile the Axon side of the pipeline benchmark (or the core one) with cProfile.

``python3 -m benchmarks.profile [openai|anthropic|scripted] [--deltas N] [--turns K]``
runs K full turns of N deltas exactly as the pipeline benchmark's Axon side does (its own
loopback server process, SQLite store, log tap at ``info``), after one warm-up turn, and
prints the functions that cost the most, by own time, first those in this repository's
``runtime/`` and ``actors/`` and then everything. ``--out FILE`` keeps the raw profile
for ``python -m pstats`` or snakeviz. cProfile's per-call overhead inflates small
functions; for a sampling view run ``py-spy record --format raw -o stacks.txt --
python3 -m benchmarks.profile openai --no-cprofile --turns 100``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
from pathlib import Path

import trio

from benchmarks.bench_pipeline import axon_side, make_provider
from benchmarks.common import INSTRUCTIONS, REPO, LogSink, LoopbackServer
from benchmarks.sse import delta_texts


async def _turns(
    fmt: str, n: int, turns: int, server: LoopbackServer | None, directory: str, profile: bool
):
    from runtime import Agent, Host, TextChunk

    if fmt == "scripted":
        from actors.providers.scripted import ScriptedProvider

        provider = ScriptedProvider([[TextChunk(text=t) for t in delta_texts(n)]])
    else:
        assert server is not None
        provider = make_provider(fmt, server.url(fmt, n))
    agent = Agent(name="bench", provider=provider, instructions=INSTRUCTIONS)
    profiler = cProfile.Profile() if profile else None
    async with Host.open(store=str(Path(directory) / "profile.db")) as host:
        run = axon_side(host, agent, "profile")
        await run()  # warm-up: imports, client, connection
        if profiler is not None:
            profiler.enable()
        for _ in range(turns):
            await run()
        if profiler is not None:
            profiler.disable()
    return profiler


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.profile")
    parser.add_argument(
        "fmt", nargs="?", default="openai", choices=("openai", "anthropic", "scripted")
    )
    parser.add_argument("--deltas", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", help="write the raw profile here")
    parser.add_argument(
        "--no-cprofile",
        action="store_true",
        help="only run the turns (to sample them from outside: py-spy record -- python3 -m ...)",
    )
    args = parser.parse_args()
    server = None if args.fmt == "scripted" else LoopbackServer([(args.fmt, args.deltas)])
    try:
        with tempfile.TemporaryDirectory(prefix="axon-profile-") as directory:
            sink = LogSink(directory)
            try:
                profiler = trio.run(
                    _turns,
                    args.fmt,
                    args.deltas,
                    args.turns,
                    server,
                    directory,
                    not args.no_cprofile,
                )
            finally:
                sink.close()
    finally:
        if server is not None:
            server.close()
    if profiler is None:
        return
    if args.out:
        profiler.dump_stats(args.out)
    ours = f"{REPO}/(runtime|actors)/"
    for title, restrict in (("runtime/ and actors/", [ours]), ("everything", [])):
        buf = io.StringIO()
        stats = pstats.Stats(profiler, stream=buf).sort_stats("tottime")
        stats.print_stats(*restrict, args.top)
        print(f"== {args.fmt}, {args.turns} turns x {args.deltas} deltas: {title} ==")
        print(buf.getvalue().split("\n", 6)[-1].replace(str(REPO) + "/", ""))


if __name__ == "__main__":
    main()
