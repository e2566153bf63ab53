"""1. Pipeline overhead and 6. time to first delta: Axon versus the raw SDK and the floor.

All sides run in this process, under Trio, against the same loopback server process and
read the same bytes. The raw side is what an application would write without Axon:
``AsyncOpenAI().chat.completions.create(stream=True)`` / ``AsyncAnthropic().messages.create(
stream=True)`` and a loop that picks the text out of each chunk. The floor
(:mod:`benchmarks.floor`, issue 24) is bare ``httpx`` + ``orjson``: the body's lines split,
each ``data:`` line decoded, nothing else; no Python client reads the stream for less. The
Axon side is one full turn: ``session.stream(...)`` through every actor (provider, engine,
turn runner, stream controller, persister with SQLite, log tap at ``info`` writing JSON
lines to a file) until the turn is saved and the ``async with`` block is left.

The baseline is the fair one (issue 14): ONE client reused for every round, as Axon's
provider reuses its own (a client built per round pays several milliseconds of SSL and
HTTP set-up that hide Axon's cost), the same SQLite store and log level as production,
and no forced garbage collection between the sides (a user's comparison does not collect,
and a collection off the clock before each side would take some of Axon's garbage off its
time). Every side must stream exactly the expected text, compared for equality, and
Axon's stored message must be the turn's (read back off the clock).

A 10,000-delta body is read by the floor and Axon only (the raw OpenAI SDK would take
seconds a round); with the 1,000-delta medians it splits what Axon adds to the floor into
a per-turn and a per-delta part (figure 1c).
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
    GEMINI_MODEL,
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
from benchmarks.floor import floor_side
from benchmarks.sse import delta_texts

Run = Callable[[], Awaitable[tuple[float, float, list[str], float]]]
"""One measured stream: (total seconds, seconds to the first text delta, the deltas, the
``perf_counter`` time its clock started)."""

TARGETS = {"openai": 1.1, "anthropic": 1.25}
"""Issue 14: the ratios a fair baseline must show (a prototype of 4 batched hops: 1.09 / 1.18)."""
TTFD_TARGET_MS = 1.0
"""Milliseconds a first delta may arrive after the raw SDK's, paced or burst (issue 14)."""
FLOOR_TARGET = 2.0
"""Issue 24: a whole turn of 1,000 deltas against the floor (bare httpx + orjson)."""
LONG_FLOOR_TARGET = 1.5
"""Issue 24: the same for 10,000 deltas, where the per-turn cost weighs less."""
TTFD_FLOOR_TARGET_MS = 0.5
"""Issue 24: milliseconds a first delta may arrive after the floor's (paced body)."""
FORMATS = ("openai", "anthropic", "gemini")
COALESCING = ("openai", "anthropic")
"""The formats whose providers can coalesce deltas (rows 1fc, 1lc)."""
"""Gemini's figures have no target (issue 23: measured, not yet held to one)."""


def _held(fmt: str, target: float) -> float | None:
    """The issues' target for ``fmt``; none for Gemini (measured, not yet held to one)."""
    return None if fmt == "gemini" else target


def raw_gemini(base_url: str) -> tuple[Run, Callable[[], Awaitable[None]]]:
    """``google-genai``'s ``generate_content_stream`` reading one stream. Under Trio the
    SDK needs an async client of its HTTP library given (its own pools per asyncio
    loop), as the provider gives it."""
    import sys

    from google import genai
    from google.genai import types

    http = next(sys.modules[m] for m in ("httpx2", "httpx") if m in sys.modules)
    client = http.AsyncClient(timeout=60.0)
    options = types.HttpOptions(base_url=base_url, httpx_async_client=client)
    gclient = genai.Client(api_key=API_KEY, http_options=options)
    config = {"system_instruction": INSTRUCTIONS}

    async def run_gemini() -> tuple[float, float, list[str], float]:
        first = 0.0
        texts: list[str] = []
        t0 = now()
        stream = await gclient.aio.models.generate_content_stream(
            model=GEMINI_MODEL, contents=PROMPT, config=config
        )
        async for chunk in stream:
            parts = chunk.candidates[0].content.parts if chunk.candidates else None
            text = parts[0].text if parts else None
            if text:
                if not texts:
                    first = now() - t0
                texts.append(text)
        return now() - t0, first, texts, t0

    return run_gemini, client.aclose


def raw_side(fmt: str, base_url: str) -> tuple[Run, Callable[[], Awaitable[None]]]:
    """The raw SDK reading one stream; returns (run, aclose)."""
    if fmt == "gemini":
        return raw_gemini(base_url)
    if fmt == "openai":
        import openai

        oclient = openai.AsyncOpenAI(api_key=API_KEY, base_url=base_url, max_retries=0)
        messages = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": PROMPT},
        ]

        async def run_openai() -> tuple[float, float, list[str], float]:
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
            return now() - t0, first, texts, t0

        return run_openai, oclient.close

    import anthropic

    aclient = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=base_url, max_retries=0)

    async def run_anthropic() -> tuple[float, float, list[str], float]:
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
        return now() - t0, first, texts, t0

    return run_anthropic, aclient.close


def make_provider(fmt: str, base_url: str, *, coalesce: bool = False) -> Any:
    """The provider of ``fmt`` at ``base_url``; ``coalesce`` turns on
    :attr:`~runtime.provider.Provider.coalesce_deltas` (the rows marked "coalesced";
    the providers of :data:`COALESCING` only)."""
    if fmt == "gemini":
        from actors.providers.gemini import GeminiProvider

        return GeminiProvider(GEMINI_MODEL, base_url=base_url, api_key=API_KEY)
    if fmt == "openai":
        from actors.providers.openai import OpenAIProvider

        provider: Any = OpenAIProvider(OPENAI_MODEL, base_url=base_url, api_key=API_KEY)
    else:
        from actors.providers.anthropic import AnthropicProvider

        provider = AnthropicProvider(ANTHROPIC_MODEL, base_url=base_url, api_key=API_KEY)
    provider.coalesce_deltas = coalesce
    return provider


def axon_side(host: Any, agent: Any, prefix: str) -> Run:
    """One full Axon turn in a fresh session of ``host`` (opened and closed off the clock).
    Off the clock too, the stored assistant message is read back from the store and must
    be the turn's (so nothing may skip persistence to look fast)."""
    counter = itertools.count()

    async def run() -> tuple[float, float, list[str], float]:
        session_id = f"{prefix}-{next(counter)}"
        session = await host.open_session(agent, session_id=session_id)
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
        record = await host.store.load(session_id)
        if record is None or record.messages[-1] != result.message:
            raise RuntimeError("the Axon turn's stored message differs from its result's")
        if result.message.text != "".join(texts):
            raise RuntimeError("the Axon turn's stored text differs from what it streamed")
        return total, first, texts, t0

    return run


def _timed(
    run: Run,
    keep: dict[str, list[Any]],
    name: str,
    expect: int,
    server: ServerAddress | None = None,
    *,
    coalesced: bool = False,
) -> Callable:
    """``run`` as an :func:`alternate` side that checks it streamed exactly the text of
    the body's ``expect`` deltas (count and characters; ``coalesced``: the characters,
    in at most that many deltas, and the count is kept). It keeps (total, first delta)
    per round and, given the ``server`` of a paced body that notes its sends, the time
    from the server's first write to the first delta (``None`` when unknown)."""
    want = "".join(delta_texts(expect))

    async def side() -> float:
        before = len(server.sent_times()) if server is not None else 0
        total, first, texts, t0 = await run()
        count_ok = len(texts) <= expect if coalesced else len(texts) == expect
        if not count_ok or "".join(texts) != want:
            raise RuntimeError(
                f"{name}: streamed {len(texts)} text deltas that differ from the {expect} sent"
            )
        if coalesced:
            keep.setdefault(name + ":deltas", []).append(len(texts))
        sent = server.sent_times()[before:] if server is not None else []
        from_byte = t0 + first - sent[0] if len(sent) == 1 else None
        keep.setdefault(name, []).append((total, first, from_byte))
        return total

    return side


def _spread(ratios: list[float]) -> str:
    return f"min {min(ratios):.2f} / median {median(ratios):.2f} / max {max(ratios):.2f}"


def _ratio_figure(
    key: str,
    title: str,
    times: dict[str, list[float]],
    num: str,
    den: str,
    n: int,
    target: float | None,
) -> Figure:
    """``num``'s time over ``den``'s, the median of the per-round ratios."""
    ratios = paired_ratios(times[num], times[den])
    ratio = median(ratios)
    num_ms, den_ms = median(times[num]) * 1e3, median(times[den]) * 1e3
    return Figure(
        key=key,
        title=title,
        value=ratio,
        unit="x",
        target=f"<= {target:g}" if target is not None else "",
        passed=ratio <= target if target is not None else None,
        detail=(
            f"{den} {den_ms:.1f} ms, {num} {num_ms:.1f} ms; "
            f"{(num_ms - den_ms) * 1e3 / n:+.1f} us/delta; ratios {_spread(ratios)}"
        ),
        data={
            "deltas": n,
            "rounds": len(ratios),
            f"{den}_s": times[den],
            f"{num}_s": times[num],
            "ratios": ratios,
        },
    )


def _coalesced_figure(
    key: str,
    title: str,
    times: dict[str, list[float]],
    seen: dict[str, list[Any]],
    n: int,
    target: float,
) -> Figure:
    """The whole turn with :attr:`~runtime.provider.Provider.coalesce_deltas` against
    the floor, and how many deltas the consumer got for the ``n`` sent."""
    figure = _ratio_figure(key, title, times, "coalesced", "floor", n, target)
    counts = seen.get("coalesced:deltas", [])
    if counts:
        figure.detail += f"; the consumer got {median(counts):.0f} deltas for {n}"
        figure.data["deltas_received"] = counts
    return figure


def _added_figure(
    key: str,
    title: str,
    seen: dict[str, list[Any]],
    side: str,
    base: str,
    warmup: int,
    target: float | None,
    *,
    at: int = 1,
    since: str = "",
) -> Figure:
    """How much later ``side``'s first delta came than ``base``'s, median of the rounds;
    ``at`` picks the time each round noted (1: from the request, 2: from the server's
    first write, named by ``since`` in the detail)."""
    pairs = list(zip(seen[side], seen[base], strict=True))[warmup:]
    added = [(a[at] - b[at]) * 1e3 for a, b in pairs]
    value = median(added)
    return Figure(
        key=key,
        title=title,
        value=value,
        unit="ms",
        target=f"< {target:g} ms" if target is not None else "",
        passed=value < target if target is not None else None,
        detail=(
            f"{base} {median([b[at] for _, b in pairs]) * 1e3:.2f} ms, "
            f"{side} {median([a[at] for a, _ in pairs]) * 1e3:.2f} ms{since}; "
            f"added min {min(added):.2f} / max {max(added):.2f} ms"
        ),
        data={"added_ms": added, "rounds": len(added)},
    )


async def _whole_stream(sizes: Sizes, server: ServerAddress, host: Any, fmt: str) -> list[Figure]:
    """Figures 1, 1f and 6b: the raw SDK, the floor and Axon on the burst body."""
    from runtime import Agent

    n = sizes.pipeline_deltas
    url = server.url(fmt, n, "burst")
    raw, raw_close = raw_side(fmt, url)
    floor, floor_close = floor_side(fmt, url)
    agent = Agent(name="bench", provider=make_provider(fmt, url), instructions=INSTRUCTIONS)
    seen: dict[str, list[Any]] = {}
    sides = {
        "raw": _timed(raw, seen, "raw", n),
        "floor": _timed(floor, seen, "floor", n),
        "axon": _timed(axon_side(host, agent, f"{fmt}-b"), seen, "axon", n),
    }
    if fmt in COALESCING:
        joined = Agent(
            name="bench", provider=make_provider(fmt, url, coalesce=True), instructions=INSTRUCTIONS
        )
        sides["coalesced"] = _timed(
            axon_side(host, joined, f"{fmt}-bc"), seen, "coalesced", n, coalesced=True
        )
    times = await alternate(sizes.pipeline_rounds, sizes.pipeline_warmup, sides, collect=False)
    await raw_close()
    await floor_close()
    figures = [
        _ratio_figure(
            f"pipeline.{fmt}",
            f"1. Pipeline / raw SDK, {fmt} ({n} deltas)",
            times,
            "axon",
            "raw",
            n,
            TARGETS.get(fmt),
        ),
        _ratio_figure(
            f"pipeline_floor.{fmt}",
            f"1f. Pipeline / floor (httpx + orjson), {fmt} ({n} deltas)",
            times,
            "axon",
            "floor",
            n,
            _held(fmt, FLOOR_TARGET),
        ),
        _ratio_figure(
            f"raw_floor.{fmt}",
            f"1r. Raw SDK / floor, {fmt} ({n} deltas)",
            times,
            "raw",
            "floor",
            n,
            None,
        ),
        # first delta of a burst: the same goal as paced (issue 14, see README)
        _added_figure(
            f"ttfd_burst.{fmt}",
            f"6b. First delta added to the raw SDK's, whole body at once, {fmt}",
            seen,
            "axon",
            "raw",
            sizes.pipeline_warmup,
            _held(fmt, TTFD_TARGET_MS),
        ),
        _added_figure(
            f"ttfd_burst_floor.{fmt}",
            f"6bf. First delta added to the floor's, whole body at once, {fmt}",
            seen,
            "axon",
            "floor",
            sizes.pipeline_warmup,
            None,
        ),
    ]
    if fmt in COALESCING:
        figures.insert(
            2,
            _coalesced_figure(
                f"pipeline_floor_coalesced.{fmt}",
                f"1fc. Pipeline / floor, deltas coalesced, {fmt} ({n} deltas)",
                times,
                seen,
                n,
                FLOOR_TARGET,
            ),
        )
    return figures


def _from_first_byte(
    key: str, title: str, seen: dict[str, list[Any]], warmup: int, target: float | None
) -> Figure | None:
    """Axon's first delta after the server's first write, minus the floor's, median of
    the rounds; ``None`` when the server did not note its sends."""
    pairs = list(zip(seen["axon"], seen["floor"], strict=True))[warmup:]
    if not pairs or any(a[2] is None or f[2] is None for a, f in pairs):
        return None
    return _added_figure(
        key, title, seen, "axon", "floor", warmup, target, at=2, since=" after the first byte"
    )


async def _first_delta(sizes: Sizes, server: ServerAddress, host: Any, fmt: str) -> list[Figure]:
    """Figures 6, 6f and 6x: the first event alone on the wire, then a pause."""
    from runtime import Agent

    n = sizes.pipeline_deltas
    url = server.url(fmt, n, "paced")
    raw, raw_close = raw_side(fmt, url)
    floor, floor_close = floor_side(fmt, url)
    agent = Agent(name="bench", provider=make_provider(fmt, url), instructions=INSTRUCTIONS)
    seen: dict[str, list[Any]] = {}
    await alternate(
        sizes.ttfd_rounds,
        sizes.pipeline_warmup,
        {
            "raw": _timed(raw, seen, "raw", n, server),
            "floor": _timed(floor, seen, "floor", n, server),
            "axon": _timed(axon_side(host, agent, f"{fmt}-p"), seen, "axon", n, server),
        },
        collect=False,
    )
    await raw_close()
    await floor_close()
    from_byte = _from_first_byte(
        f"ttfd_byte.{fmt}",
        f"6x. First delta after the first byte: added to the floor's, {fmt}",
        seen,
        sizes.pipeline_warmup,
        _held(fmt, TTFD_FLOOR_TARGET_MS),
    )
    return [
        *([from_byte] if from_byte is not None else []),
        _added_figure(
            f"ttfd.{fmt}",
            f"6. First delta: added to the raw SDK's, {fmt}",
            seen,
            "axon",
            "raw",
            sizes.pipeline_warmup,
            _held(fmt, TTFD_TARGET_MS),
        ),
        _added_figure(
            f"ttfd_floor.{fmt}",
            f"6f. First delta from the request: added to the floor's, {fmt}",
            seen,
            "axon",
            "floor",
            sizes.pipeline_warmup,
            None,
        ),
    ]


async def _long_stream(sizes: Sizes, server: ServerAddress, host: Any, fmt: str) -> list[Figure]:
    """Figure 1l (the floor and Axon on a long burst) and 1c: what Axon adds to the
    floor, split into a per-turn and a per-delta part. The short body is read again in
    the same rounds (floor and Axon), so the split compares medians of one load."""
    from runtime import Agent

    n, long_n = sizes.pipeline_deltas, sizes.pipeline_long_deltas
    url, short_url = server.url(fmt, long_n, "burst"), server.url(fmt, n, "burst")
    floor, floor_close = floor_side(fmt, url)
    short_floor, short_floor_close = floor_side(fmt, short_url)
    agent = Agent(name="bench", provider=make_provider(fmt, url), instructions=INSTRUCTIONS)
    short_agent = Agent(
        name="bench", provider=make_provider(fmt, short_url), instructions=INSTRUCTIONS
    )
    seen: dict[str, list[Any]] = {}
    sides = {
        "floor": _timed(floor, seen, "floor", long_n),
        "axon": _timed(axon_side(host, agent, f"{fmt}-l"), seen, "axon", long_n),
        "short_floor": _timed(short_floor, seen, "short_floor", n),
        "short_axon": _timed(axon_side(host, short_agent, f"{fmt}-s"), seen, "short_axon", n),
    }
    if fmt in COALESCING:
        joined = Agent(
            name="bench", provider=make_provider(fmt, url, coalesce=True), instructions=INSTRUCTIONS
        )
        sides["coalesced"] = _timed(
            axon_side(host, joined, f"{fmt}-lc"), seen, "coalesced", long_n, coalesced=True
        )
    times = await alternate(sizes.pipeline_long_rounds, sizes.pipeline_warmup, sides, collect=False)
    await floor_close()
    await short_floor_close()
    figure = _ratio_figure(
        f"pipeline_long.{fmt}",
        f"1l. Pipeline / floor, {fmt} ({long_n} deltas)",
        times,
        "axon",
        "floor",
        long_n,
        _held(fmt, LONG_FLOOR_TARGET),
    )
    joined_figures = (
        [
            _coalesced_figure(
                f"pipeline_long_coalesced.{fmt}",
                f"1lc. Pipeline / floor, deltas coalesced, {fmt} ({long_n} deltas)",
                times,
                seen,
                long_n,
                LONG_FLOOR_TARGET,
            )
        ]
        if fmt in COALESCING
        else []
    )

    def split(side: str) -> tuple[float, float]:
        """(ms per turn, us per delta) of ``side``, from the medians at both lengths."""
        a, b = median(times["short_" + side]), median(times[side])
        per_delta = (b - a) / (long_n - n)
        return (a - per_delta * n) * 1e3, per_delta * 1e6

    axon_fixed, axon_per = split("axon")
    floor_fixed, floor_per = split("floor")
    added = axon_per - floor_per
    cost = Figure(
        key=f"pipeline_cost.{fmt}",
        title=f"1c. Added to the floor per delta / per turn, {fmt}",
        value=added,
        unit="us/delta",
        detail=(
            f"{added:+.1f} us/delta and {axon_fixed - floor_fixed:+.2f} ms/turn; "
            f"axon {axon_per:.1f} us/delta + {axon_fixed:.2f} ms, "
            f"floor {floor_per:.1f} us/delta + {floor_fixed:.2f} ms "
            f"(medians at {n} and {long_n} deltas, in the same rounds)"
        ),
        data={
            "axon_us_per_delta": axon_per,
            "axon_ms_per_turn": axon_fixed,
            "floor_us_per_delta": floor_per,
            "floor_ms_per_turn": floor_fixed,
        },
    )
    return [figure, *joined_figures, cost]


async def _measure(sizes: Sizes, server: ServerAddress, directory: str) -> list[Figure]:
    from runtime import Host

    figures: list[Figure] = []
    sink = LogSink(directory)
    try:
        async with Host.open(store=str(Path(directory) / "pipeline.db")) as host:
            for fmt in FORMATS:
                figures += await _whole_stream(sizes, server, host, fmt)
                figures += await _first_delta(sizes, server, host, fmt)
            for fmt in FORMATS:
                figures += await _long_stream(sizes, server, host, fmt)
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
