"""One provider call alone against the floor, in process CPU time, trees side by side.

A whole turn's fixed cost (:mod:`benchmarks.cpu_floor`) mixes the provider's request
with the session, the store, the log tap and the actors' hops; this measures the
provider's part by itself (issue 24, goal 1): each child process (one per tree and
format, the trees alternated) starts the benchmark's loopback server (its CPU is not
counted), then, round after round, reads the floor (:mod:`benchmarks.floor`: one bare
``client.stream`` of the same body) and makes one ``provider.stream`` call of the
benchmark's request (through the real SDK client, built once, as a turn does), each
timed by its own CPU. The chunks go to a sink that keeps them (no actor after the
provider). The parent prints, per tree and format, the min and median of both and the
median of the per-round differences: what the provider's call costs over the floor.

``python3 -m benchmarks.provider_call --trees /work/main,$PWD [--formats
anthropic,openai] [--deltas 1] [--children 3] [--rounds 300]``: each tree is put first on
``PYTHONPATH`` of its children and is their working directory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

WARM_UP = 20


def bench_request() -> Any:
    """The benchmark's one model call as the provider is given it (the floor's prompt,
    no tools); ``stream()`` emits to its argument only, so it has no reply inbox."""
    import trio

    from benchmarks.common import INSTRUCTIONS
    from benchmarks.floor import PROMPT
    from runtime.messages import UserMessage
    from runtime.provider import InferRequest

    return InferRequest(
        request_id="r",
        session_id="s",
        turn_id="t",
        step=0,
        instructions=INSTRUCTIONS,
        messages=(UserMessage(content=PROMPT),),
        tools=(),
        reply=None,  # type: ignore[arg-type]
        cancel_scope=trio.CancelScope(),
    )


async def _rounds(fmt: str, n: int, rounds: int, server: Any) -> list[Any]:

    from benchmarks.bench_pipeline import make_provider
    from benchmarks.floor import floor_side

    url = server.url(fmt, n)
    provider = make_provider(fmt, url)
    floor, floor_close = floor_side(fmt, url)
    request = bench_request()
    chunks: list[Any] = []

    async def emit(chunk: Any) -> None:
        chunks.append(chunk)

    out = []
    try:
        for i in range(WARM_UP + rounds):
            chunks.clear()
            c0 = time.process_time()
            got = await floor()
            c1 = time.process_time()
            await provider.stream(request, emit)
            c2 = time.process_time()
            texts = [c.text for c in chunks if type(c).__name__ == "TextChunk"]
            if texts != got[2]:
                raise RuntimeError("the floor and the provider did not read the same deltas")
            if i >= WARM_UP:
                out.append((c1 - c0, c2 - c1))
    finally:
        await floor_close()
        await provider.aclose()
    return out


def _child(fmt: str, n: int, rounds: int) -> None:
    import trio

    from benchmarks.common import LoopbackServer

    server = LoopbackServer([(fmt, n)])
    try:
        result = trio.run(_rounds, fmt, n, rounds, server)
    finally:
        server.close()
    print("RESULT " + json.dumps(result))


def _run_child(tree: str, fmt: str, n: int, rounds: int) -> list[Any]:
    from benchmarks.common import run_tree_child  # the parent's tree: a child never calls it

    return list(run_tree_child(__file__, tree, fmt, str(n), str(rounds)))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.provider_call")
    parser.add_argument("--trees", default=os.getcwd(), help="comma-separated checkouts")
    parser.add_argument("--formats", default="anthropic,openai")
    parser.add_argument("--deltas", type=int, default=1)
    parser.add_argument("--children", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        fmt, n, rounds = args.child
        _child(fmt, int(n), int(rounds))
        return
    trees = args.trees.split(",")
    formats = args.formats.split(",")
    results: dict[tuple[str, str], list[Any]] = {}
    for child in range(args.children):
        order = trees if child % 2 == 0 else trees[::-1]
        for fmt in formats:
            for tree in order:
                rows = _run_child(tree, fmt, args.deltas, args.rounds)
                results.setdefault((tree, fmt), []).extend(rows)
    for fmt in formats:
        for tree in trees:
            rows = results[(tree, fmt)]
            floor = [f for f, _ in rows]
            call = [p for _, p in rows]
            over = statistics.median(p - f for f, p in rows)
            print(
                f"{fmt:9} {args.deltas:6} {tree}: floor {min(floor) * 1e6:.0f} /"
                f" {statistics.median(floor) * 1e6:.0f} us, provider {min(call) * 1e6:.0f} /"
                f" {statistics.median(call) * 1e6:.0f} us (min / median),"
                f" over the floor {over * 1e6:.0f} us ({len(rows)} rounds)"
            )


if __name__ == "__main__":
    main()
