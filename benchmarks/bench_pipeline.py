"""1. Pipeline overhead and 6. time to first delta: Axon versus the raw SDK.

Both sides run in this process, under Trio, against the same loopback server process and
read the same bytes. The raw side is what an application would write without Axon:
``AsyncOpenAI().chat.completions.create(stream=True)`` / ``AsyncAnthropic().messages.create(
stream=True)`` and a loop that picks the text out of each chunk. The Axon side is one full
turn: ``session.stream(...)`` through every actor (provider, engine, turn runner, stream
controller, persister with SQLite, log tap at ``info`` writing JSON lines to a file) until
the turn is saved and the ``async with`` block is left.

The baseline is the fair one (issue 14): ONE client reused for every round, as Axon's
provider reuses its own (a client built per round pays several milliseconds of SSL and
HTTP set-up that hide Axon's cost), the same SQLite store and log level as production,
and no forced garbage collection between the sides (a user's comparison does not collect,
and a collection off the clock before each side would take some of Axon's garbage off its
time). Both sides must stream exactly the expected text, compared for equality.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from benchmarks.common import (
    ANTHROPIC_MODEL,
    API_KEY,
    INSTRUCTIONS,
    OPENAI_MODEL,
    PROMPT,
    Figure,
    LogSink,
    ServerAddress,
    Sizes,
    alternate,
    median,
    now,
    paired_ratios,
)
from benchmarks.sse import delta_texts

Run = Callable[[], Awaitable[tuple[float, float, list[str]]]]
"""One measured stream: (total seconds, seconds to the first text delta, the deltas)."""

TARGETS = {"openai": 1.1, "anthropic": 1.25}
"""Issue 14: the ratios a fair baseline must show (a prototype of 4 batched hops: 1.09 / 1.18)."""
TTFD_TARGET_MS = 1.0
"""Milliseconds a first delta may arrive after the raw SDK's, paced or burst (issue 14)."""
FORMATS = ("openai", "anthropic")


def raw_side(fmt: str, base_url: str) -> tuple[Run, Callable[[], Awaitable[None]]]:
    """The raw SDK reading one stream; returns (run, aclose)."""
    if fmt == "openai":
        import openai

        oclient = openai.AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        messages = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": PROMPT},
        ]

        async def run_openai() -> tuple[float, float, list[str]]:
            first = 0.0
            texts: list[str] = []
            t0 = now()
            stream = await oclient.chat.completions.create(
                model=OPENAI_MODEL,
                messages=messages,
                stream=True,
                stream_options={"include_usage": True},
            )
            async with stream:
                async for chunk in stream:
                    if chunk.choices:
                        text = chunk.choices[0].delta.content
                        if text:
                            if not texts:
                                first = now() - t0
                            texts.append(text)
            return now() - t0, first, texts

        return run_openai, oclient.close

    import anthropic

    aclient = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=base_url, max_retries=0)

    async def run_anthropic() -> tuple[float, float, list[str]]:
        first = 0.0
        texts: list[str] = []
        t0 = now()
        stream = await aclient.messages.create(
            model=ANTHROPIC_MODEL,
            max_tokens=4096,
            system=INSTRUCTIONS,
            messages=[{"role": "user", "content": PROMPT}],
            stream=True,
        )
        async with stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    if not texts:
                        first = now() - t0
                    texts.append(event.delta.text)
        return now() - t0, first, texts

    return run_anthropic, aclient.close


def make_provider(fmt: str, base_url: str) -> Any:
    if fmt == "openai":
        from actors.providers.openai import OpenAIProvider

        return OpenAIProvider(OPENAI_MODEL, base_url=base_url, api_key=API_KEY)
    from actors.providers.anthropic import AnthropicProvider

    return AnthropicProvider(ANTHROPIC_MODEL, base_url=base_url, api_key=API_KEY)


def axon_side(host: Any, agent: Any, prefix: str) -> Run:
    """One full Axon turn in a fresh session of ``host`` (opened and closed off the clock)."""
    counter = itertools.count()

    async def run() -> tuple[float, float, list[str]]:
        session = await host.open_session(agent, session_id=f"{prefix}-{next(counter)}")
        first = 0.0
        texts: list[str] = []
        t0 = now()
        async with session.stream(PROMPT) as out:
            async for chunk in out:
                if chunk.type == "text-delta":
                    if not texts:
                        first = now() - t0
                    texts.append(chunk.text)
        total = now() - t0
        await session.close()
        result = out.result
        if result is None or result.finish_reason != "stop":
            raise RuntimeError(f"the Axon turn did not finish: {result}")
        return total, first, texts

    return run


def _timed(run: Run, keep: dict[str, list[Any]], name: str, expect: int) -> Callable:
    """``run`` as an :func:`alternate` side that checks it streamed exactly the text of
    the body's ``expect`` deltas (count and characters)."""
    want = "".join(delta_texts(expect))

    async def side() -> float:
        total, first, texts = await run()
        if len(texts) != expect or "".join(texts) != want:
            raise RuntimeError(
                f"{name}: streamed {len(texts)} text deltas that differ from the {expect} sent"
            )
        keep.setdefault(name, []).append((total, first))
        return total

    return side


async def _measure(sizes: Sizes, server: ServerAddress, directory: str) -> list[Figure]:
    from runtime import Agent, Host

    n = sizes.pipeline_deltas
    figures: list[Figure] = []
    sink = LogSink(directory)
    try:
        async with Host.open(store=str(Path(directory) / "pipeline.db")) as host:
            for fmt in FORMATS:
                # -- 1. the whole stream, everything arriving at once ----------------------
                url = server.url(fmt, n, "burst")
                raw, raw_close = raw_side(fmt, url)
                agent = Agent(
                    name="bench", provider=make_provider(fmt, url), instructions=INSTRUCTIONS
                )
                seen: dict[str, list[Any]] = {}
                times = await alternate(
                    sizes.pipeline_rounds,
                    sizes.warmup,
                    {
                        "raw": _timed(raw, seen, "raw", n),
                        "axon": _timed(axon_side(host, agent, f"{fmt}-b"), seen, "axon", n),
                    },
                    collect=False,
                )
                await raw_close()
                ratios = paired_ratios(times["axon"], times["raw"])
                ratio = median(ratios)
                raw_ms, axon_ms = median(times["raw"]) * 1e3, median(times["axon"]) * 1e3
                figures.append(
                    Figure(
                        key=f"pipeline.{fmt}",
                        title=f"1. Pipeline / raw SDK, {fmt} ({n} deltas)",
                        value=ratio,
                        unit="x",
                        target=f"<= {TARGETS[fmt]}",
                        passed=ratio <= TARGETS[fmt],
                        detail=(
                            f"raw {raw_ms:.1f} ms, axon {axon_ms:.1f} ms; "
                            f"+{(axon_ms - raw_ms) * 1e3 / n:.1f} us/delta"
                        ),
                        data={
                            "deltas": n,
                            "rounds": sizes.pipeline_rounds,
                            "raw_s": times["raw"],
                            "axon_s": times["axon"],
                            "ratios": ratios,
                        },
                    )
                )
                # first delta of a burst: the same goal as paced (issue 14, see README)
                burst_added = [
                    (a[1] - r[1]) * 1e3 for a, r in zip(seen["axon"], seen["raw"], strict=True)
                ]
                burst_first = burst_added[sizes.warmup :] or burst_added
                figures.append(
                    Figure(
                        key=f"ttfd_burst.{fmt}",
                        title=f"6b. First delta added, whole body at once, {fmt}",
                        value=median(burst_first),
                        unit="ms",
                        target=f"< {TTFD_TARGET_MS:g} ms",
                        passed=median(burst_first) < TTFD_TARGET_MS,
                        detail=(
                            f"raw {median([r[1] for r in seen['raw']]) * 1e3:.2f} ms, "
                            f"axon {median([a[1] for a in seen['axon']]) * 1e3:.2f} ms"
                        ),
                        data={"added_ms": burst_first},
                    )
                )
                # -- 6. time to first delta, the first event alone on the wire --------------
                purl = server.url(fmt, n, "paced")
                praw, praw_close = raw_side(fmt, purl)
                pagent = Agent(
                    name="bench", provider=make_provider(fmt, purl), instructions=INSTRUCTIONS
                )
                pseen: dict[str, list[Any]] = {}
                await alternate(
                    sizes.ttfd_rounds,
                    sizes.warmup,
                    {
                        "raw": _timed(praw, pseen, "raw", n),
                        "axon": _timed(axon_side(host, pagent, f"{fmt}-p"), pseen, "axon", n),
                    },
                    collect=False,
                )
                await praw_close()
                pairs = list(zip(pseen["axon"], pseen["raw"], strict=True))[sizes.warmup :]
                added = [(a[1] - r[1]) * 1e3 for a, r in pairs]
                value = median(added)
                figures.append(
                    Figure(
                        key=f"ttfd.{fmt}",
                        title=f"6. First delta: added to the raw SDK's, {fmt}",
                        value=value,
                        unit="ms",
                        target=f"< {TTFD_TARGET_MS:g} ms",
                        passed=value < TTFD_TARGET_MS,
                        detail=(
                            f"raw {median([r[1] for _, r in pairs]) * 1e3:.2f} ms, "
                            f"axon {median([a[1] for a, _ in pairs]) * 1e3:.2f} ms"
                        ),
                        data={"added_ms": added, "rounds": sizes.ttfd_rounds},
                    )
                )
            lines = sink.lines()
    finally:
        sink.close()
    for fig in figures:
        if fig.key.startswith("pipeline."):
            fig.data["log_lines_written"] = lines
    return figures


def run(sizes: Sizes, server: ServerAddress) -> list[Figure]:
    with tempfile.TemporaryDirectory(prefix="axon-bench-") as directory:
        return trio.run(_measure, sizes, server, directory)
