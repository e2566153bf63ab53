"""Gemini's parse path, before and after reading the stream's bytes, beside Anthropic's.

``python3 -m benchmarks.gemini_parse [--deltas N] [--rounds R]``: one process, three
sides, alternated each round (rotating which goes first), medians of the per-round
figures. Each side is a provider's ``stream()`` reading a body of ``N`` text deltas
(:mod:`benchmarks.sse`) from an ``httpx.MockTransport`` (no socket: what is measured is
the client's work, request building included, amortized over the deltas):

* ``gemini-before``: the provider as it was (the SDK's ``generate_content_stream``, a
  pydantic ``GenerateContentResponse`` per chunk, then the object parser), taken from
  git (``--before REV``, default the commit before the fast path);
* ``gemini-after``: this tree's provider (the bytes read by orjson,
  :mod:`actors.providers.gemini_wire`);
* ``anthropic``: this tree's Anthropic provider on its own body of ``N`` deltas.

Prints microseconds per delta (min / median / max) and the paired ratios. Not one of the
figures of ``python3 -m benchmarks``: a one-off comparison, its result in the README.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import trio

from benchmarks.sse import anthropic_body, gemini_body

BEFORE = "6da5863"
"""The last commit whose Gemini provider read the SDK's pydantic chunks."""


def old_gemini(rev: str) -> Any:
    """``actors/providers/gemini.py`` as it was at ``rev``, imported under another name."""
    source = subprocess.run(
        ["git", "show", f"{rev}:actors/providers/gemini.py"],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parent.parent,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "gemini_before.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("gemini_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gemini_before"] = module
    spec.loader.exec_module(module)
    return module


def _transport(body: bytes, http: Any = httpx) -> Any:
    """An async client of ``http`` (httpx, or the httpx2 an SDK imported) answering
    every request with ``body``."""

    def answer(request: Any) -> Any:
        return http.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return http.AsyncClient(transport=http.MockTransport(answer))


def _sdk_http(sdk_module: str) -> Any:
    """The httpx an SDK imported (some import ``httpx2``)."""
    importlib.import_module(sdk_module)
    return next(sys.modules[m] for m in ("httpx2", "httpx") if m in sys.modules)


def gemini_side(cls: Any, body: bytes) -> Any:
    from google import genai
    from google.genai import types

    provider = cls("gemini-2.5-flash", api_key="bench", include_thoughts=False)
    client = _transport(body, _sdk_http("google.genai"))
    options = types.HttpOptions(base_url="http://bench", httpx_async_client=client)
    provider._client = genai.Client(api_key="bench", http_options=options)
    return provider


def anthropic_side(body: bytes) -> Any:
    import anthropic

    from actors.providers.anthropic import AnthropicProvider

    provider = AnthropicProvider("claude-sonnet-4-5", api_key="bench")
    provider._client = anthropic.AsyncAnthropic(
        api_key="bench",
        base_url="http://bench",
        http_client=_transport(body, _sdk_http("anthropic")),
        max_retries=0,
    )
    return provider


def timed(provider: Any, deltas: int) -> Callable[[], Awaitable[float]]:
    from runtime.actor_messages import InferRequest
    from runtime.chunks import TextChunk
    from runtime.inbox import Inbox
    from runtime.messages import UserMessage

    async def run() -> float:
        request = InferRequest(
            request_id="r",
            session_id="s",
            turn_id="t",
            step=0,
            instructions="You are concise.",
            messages=(UserMessage(content="Tell me about the weather in Paris."),),
            tools=(),
            reply=Inbox(),
            cancel_scope=trio.CancelScope(),
        )
        texts = 0

        async def emit(chunk: Any) -> None:
            nonlocal texts
            if type(chunk) is TextChunk:
                texts += 1

        start = time.perf_counter()
        await provider.stream(request, emit)
        seconds = time.perf_counter() - start
        assert texts == deltas, (texts, deltas)
        return seconds

    return run


async def measure(deltas: int, rounds: int, before: str) -> dict[str, list[float]]:
    from actors.providers.gemini import GeminiProvider

    sides = {
        "gemini-before": timed(
            gemini_side(old_gemini(before).GeminiProvider, gemini_body(deltas)), deltas
        ),
        "gemini-after": timed(gemini_side(GeminiProvider, gemini_body(deltas)), deltas),
        "anthropic": timed(anthropic_side(anthropic_body(deltas)), deltas),
    }
    names = list(sides)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds + 2):  # two warm-up rounds
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            seconds = await sides[name]()
            if r >= 2:
                out[name].append(seconds / deltas * 1e6)
    return out


def _spread(values: list[float]) -> str:
    ordered = sorted(values)
    return f"{ordered[0]:.2f} / {ordered[len(ordered) // 2]:.2f} / {ordered[-1]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--before", default=BEFORE)
    args = parser.parse_args()
    per_delta = trio.run(measure, args.deltas, args.rounds, args.before)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{args.deltas} deltas, {args.rounds} rounds; us per delta, min / median / max")
    for name, values in per_delta.items():
        print(f"  {name:14} {_spread(values)}")
    pairs = [
        ("gemini-before / gemini-after", "gemini-before", "gemini-after"),
        ("gemini-before / anthropic", "gemini-before", "anthropic"),
        ("gemini-after / anthropic", "gemini-after", "anthropic"),
    ]
    for label, a, b in pairs:
        ratios = [x / y for x, y in zip(per_delta[a], per_delta[b], strict=True)]
        print(f"  {label:30} {_spread(ratios)}")


if __name__ == "__main__":
    main()
