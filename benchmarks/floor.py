"""The floor: the same stream read by bare ``httpx`` + ``orjson``, nothing else (issue 24).

No Python client can read a server-sent event stream for less than this: one reused
``AsyncClient``, one POST of the same request, the raw body bytes split into lines, each
``data:`` line decoded by orjson, and the text picked out of it (only so the reader can
check that it got exactly the deltas that were sent). No SSE event objects, no models,
no error mapping. It is what Axon's whole turn and the SDKs are compared with, so the
ratios say how far each is from what reading the bytes costs.

Needs only the standard library, ``httpx`` (or ``httpx2``, the fork the current SDKs are
built on, when ``httpx`` is missing) and ``orjson``, and runs under Trio or asyncio (httpx
picks the running loop), so the peers' worker (:mod:`benchmarks.peers_worker`) uses it
too.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

API_KEY = "sk-bench-not-a-real-key"
INSTRUCTIONS = "You are concise."
PROMPT = "Tell me about the weather in Paris."
OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
GEMINI_MODEL = "gemini-2.5-flash"

FloorRun = Callable[[], Awaitable[tuple[float, float, list[str], float]]]
"""One read: (total seconds, seconds to the first text delta, the text deltas, the
``perf_counter`` time its clock started)."""


def http_library() -> Any:
    """``httpx``, else ``httpx2``: the same API."""
    try:
        return importlib.import_module("httpx")
    except ImportError:
        return importlib.import_module("httpx2")


def request(fmt: str, base_url: str) -> tuple[str, bytes, dict[str, str]]:
    """The URL, JSON body and headers of the request the SDKs send for this benchmark."""
    import orjson

    if fmt == "openai":
        payload: dict[str, Any] = {
            "model": OPENAI_MODEL,
            "messages": [
                {"role": "system", "content": INSTRUCTIONS},
                {"role": "user", "content": PROMPT},
            ],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        url = base_url + "/chat/completions"
        headers = {"authorization": f"Bearer {API_KEY}"}
    elif fmt == "gemini":
        payload = {
            "contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
            "systemInstruction": {"parts": [{"text": INSTRUCTIONS}], "role": "user"},
        }
        url = base_url + f"/v1beta/models/{GEMINI_MODEL}:streamGenerateContent?alt=sse"
        headers = {"x-goog-api-key": API_KEY}
    else:
        payload = {
            "model": ANTHROPIC_MODEL,
            "max_tokens": 4096,
            "system": INSTRUCTIONS,
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": True,
        }
        url = base_url + "/v1/messages"
        headers = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
    headers |= {"content-type": "application/json", "accept-encoding": "identity"}
    return url, orjson.dumps(payload), headers


def floor_side(fmt: str, base_url: str) -> tuple[FloorRun, Callable[[], Awaitable[None]]]:
    """The floor reading ``fmt``'s stream at ``base_url`` (an SDK's ``base_url``, as
    :meth:`benchmarks.common.ServerAddress.url` gives it); returns (run, aclose)."""
    import orjson

    httpx = http_library()
    loads = orjson.loads
    now = time.perf_counter
    client = httpx.AsyncClient(timeout=60.0)
    url, body, headers = request(fmt, base_url)
    openai, gemini = fmt == "openai", fmt == "gemini"

    async def run() -> tuple[float, float, list[str], float]:
        first = 0.0
        texts: list[str] = []
        t0 = now()
        async with client.stream("POST", url, content=body, headers=headers) as response:
            response.raise_for_status()
            rest = b""
            async for data in response.aiter_raw():
                lines = (rest + data).split(b"\n") if rest else data.split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # event names, blank lines between events
                    value = line[5:]
                    if value.startswith(b" [DONE]"):
                        continue
                    event = loads(value)
                    if openai:
                        choices = event["choices"]
                        text = choices[0]["delta"].get("content") if choices else None
                    elif gemini:  # lines end with CR here (CRLF framing): orjson skips it
                        parts = event["candidates"][0].get("content", {}).get("parts")
                        text = parts[0].get("text") if parts else None
                    elif event["type"] == "content_block_delta":
                        text = event["delta"].get("text")
                    else:
                        text = None
                    if text:
                        if not texts:
                            first = now() - t0
                        texts.append(text)
        return now() - t0, first, texts, t0

    return run, client.aclose
