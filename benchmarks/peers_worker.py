"""7. The peers' pipeline benchmark; runs inside the peers' own virtualenv, under asyncio.

``<peers python> benchmarks/peers_worker.py PORT DELTAS ROUNDS WARMUP`` prints one JSON
object: for each framework and wire format, the seconds of each round for the framework,
for the raw SDK and for the floor (bare httpx + orjson, :mod:`benchmarks.floor`) read in
the same process (same loopback server, same bytes as Axon's benchmark). Frameworks that
are not installed are reported as skipped; so is the floor without ``orjson``. Needs only
the standard library, the peers and their SDKs (it imports ``benchmarks.sse`` and
``benchmarks.floor`` by path).
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.floor import floor_side
from benchmarks.sse import delta_texts

API_KEY = "sk-bench-not-a-real-key"
INSTRUCTIONS = "You are concise."
PROMPT = "Tell me about the weather in Paris."


def url(port: int, fmt: str, n: int) -> str:
    root = f"http://127.0.0.1:{port}/{fmt}/{n}/burst"
    return root + "/v1" if fmt == "openai" else root


async def raw_openai(base: str):
    import openai

    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=base, max_retries=0)
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": PROMPT}]

    async def run() -> str:
        out = []
        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        async with stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    out.append(chunk.choices[0].delta.content)
        return "".join(out)

    return run


async def raw_anthropic(base: str):
    import anthropic

    client = anthropic.AsyncAnthropic(api_key=API_KEY, base_url=base, max_retries=0)

    async def run() -> str:
        out = []
        stream = await client.messages.create(
            model="claude-sonnet-4-5",
            max_tokens=4096,
            system=INSTRUCTIONS,
            messages=[{"role": "user", "content": PROMPT}],
            stream=True,
        )
        async with stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    out.append(event.delta.text)
        return "".join(out)

    return run


async def pydantic_ai(fmt: str, base: str):
    from pydantic_ai import Agent

    if fmt == "openai":
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        model = OpenAIChatModel(
            "gpt-4o-mini", provider=OpenAIProvider(base_url=base, api_key=API_KEY)
        )
    else:
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        model = AnthropicModel(
            "claude-sonnet-4-5", provider=AnthropicProvider(base_url=base, api_key=API_KEY)
        )
    agent = Agent(model, instructions=INSTRUCTIONS, retries=0)

    async def run() -> str:
        out = []
        async with agent.run_stream(PROMPT) as result:
            async for text in result.stream_text(delta=True, debounce_by=None):
                out.append(text)
        return "".join(out)

    return run


async def openai_agents(fmt: str, base: str):
    if fmt != "openai":
        return None  # Anthropic needs the LiteLLM extra: not measured
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
    from openai.types.responses import ResponseTextDeltaEvent

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(api_key=API_KEY, base_url=base, max_retries=0)
    agent = Agent(
        name="bench",
        instructions=INSTRUCTIONS,
        model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
    )

    async def run() -> str:
        out = []
        result = Runner.run_streamed(agent, PROMPT)
        async for event in result.stream_events():
            if event.type == "raw_response_event" and isinstance(
                event.data, ResponseTextDeltaEvent
            ):
                out.append(event.data.delta)
        return "".join(out)

    return run


async def main(port: int, n: int, rounds: int, warmup: int) -> dict:
    expected = "".join(delta_texts(n))
    report: dict = {"results": [], "skipped": []}
    try:
        import importlib.metadata as md

        report["versions"] = {
            name: md.version(name)
            for name in ("pydantic-ai-slim", "openai-agents", "openai", "anthropic")
            if _installed(md, name)
        }
    except Exception:  # pragma: no cover
        report["versions"] = {}
    for framework, factory in (("Pydantic AI", pydantic_ai), ("OpenAI Agents SDK", openai_agents)):
        for fmt in ("openai", "anthropic"):
            base = url(port, fmt, n)
            try:
                peer = await factory(fmt, base)
                if peer is None:
                    report["skipped"].append(f"{framework} on {fmt}: not supported without extras")
                    continue
                raw = await (raw_openai(base) if fmt == "openai" else raw_anthropic(base))
            except ImportError as exc:
                report["skipped"].append(f"{framework} on {fmt}: {exc}")
                continue
            sides = {"raw": raw, "peer": peer}
            try:
                floor, floor_close = floor_side(fmt, base)
            except ImportError as exc:
                report["skipped"].append(f"the floor beside {framework} on {fmt}: {exc}")
            else:
                sides["floor"] = _text_of(floor)
            names = list(sides)
            times: dict[str, list[float]] = {name: [] for name in names}
            try:
                for r in range(warmup + rounds):
                    shift = r % len(names)
                    for name in names[shift:] + names[:shift]:
                        gc.collect()
                        t0 = time.perf_counter()
                        text = await sides[name]()
                        seconds = time.perf_counter() - t0
                        if text != expected:
                            raise RuntimeError(
                                f"{name} read {len(text)} characters, expected {len(expected)}"
                            )
                        if r >= warmup:
                            times[name].append(seconds)
            except Exception as exc:
                report["skipped"].append(
                    f"{framework} on {fmt}: failed: {type(exc).__name__}: {exc}"
                )
                traceback.print_exc()
                continue
            finally:
                if "floor" in sides:
                    await floor_close()
            result = {"framework": framework, "format": fmt, "raw_s": times["raw"]}
            result["peer_s"] = times["peer"]
            if "floor" in times:
                result["floor_s"] = times["floor"]
            report["results"].append(result)
    return report


def _text_of(floor):
    """The floor's read as a side of this worker: the text it streamed."""

    async def run() -> str:
        _total, _first, texts, _t0 = await floor()
        return "".join(texts)

    return run


def _installed(md, name: str) -> bool:
    try:
        md.version(name)
        return True
    except md.PackageNotFoundError:
        return False


if __name__ == "__main__":
    port, n, rounds, warmup = (int(x) for x in sys.argv[1:5])
    print(json.dumps(asyncio.run(main(port, n, rounds, warmup))))
