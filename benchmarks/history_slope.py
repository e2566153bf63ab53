"""A turn's CPU against its session's length (by hand, issue 24 goal 1).

``python3 -m benchmarks.history_slope [MESSAGES ...] [--turns 200]`` (default 0 1000
10000 40000), run from the tree to measure (``PYTHONPATH=/path/to/tree``): per length, one
host (SQLite, the log tap at info into a file), one session opened with a history of that
many messages (user and assistant in turn), 20 warm-up turns, then ``--turns`` turns of a
scripted answer of 10 text deltas on it; the event loop thread's CPU per turn (us). What
grows with the length is what a step does over the whole history (its repair before the
model call, the snapshots its changes publish: ``tests/test_history_passes.py`` counts
them); a real provider's conversion of the history to its wire format comes on top.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

import trio

from benchmarks.common import LogSink


async def _per_turn(length: int, turns: int, directory: str) -> float:
    from actors.providers.scripted import ScriptedProvider
    from runtime import Agent, Host, TextChunk
    from runtime.messages import AssistantMessage, TextPart, UserMessage

    chunks = [TextChunk(text="hi") for _ in range(10)]
    agent = Agent(
        name="bench", provider=ScriptedProvider(responder=lambda _r: chunks, keep_requests=0)
    )
    history: list = []
    for _ in range(length // 2):
        history.append(UserMessage(content="hello"))
        history.append(AssistantMessage(content=(TextPart(text="hi there", step=0),)))
    async with Host.open(store=str(Path(directory) / f"h{length}.db")) as host:
        session = await host.open_session(agent, session_id="long", history=history)

        async def turn() -> None:
            async with session.stream("Hello") as out:
                async for _ in out:
                    pass

        for _ in range(20):
            await turn()
        gc.collect()
        c0 = time.thread_time()
        for _ in range(turns):
            await turn()
        return (time.thread_time() - c0) / turns * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lengths", nargs="*", type=int, default=[0, 1000, 10000, 40000])
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        sink = LogSink(directory)
        try:
            for length in args.lengths:
                spent = trio.run(_per_turn, length, args.turns, directory)
                print(f"{length:7d} messages: {spent:7.0f} us/turn")
        finally:
            sink.close()


if __name__ == "__main__":
    main()
