"""The agent the workers benchmark runs (``--agent benchmarks.workers_agent:agent``).

One short turn per session, as a chat deployment sees many of: the scripted model calls
``lookup`` (the tool executor runs it, the step is committed), then answers in
``AXON_BENCH_WORDS`` word-sized deltas (default 20). ``AXON_BENCH_DELAY`` (seconds,
default 0) is waited before every streamed chunk, like a real model's inter-token gap:
with it the turn is I/O bound, without it a worker's turns are as CPU bound as they get.

The same script, with ``tool_steps`` tool calls, is what the store comparison runs in
process (:func:`make_agent`).
"""

from __future__ import annotations

import os

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime.actor_messages import InferRequest
from runtime.agent import Agent
from runtime.chunks import TextChunk


async def lookup(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def make_agent(*, words: int = 20, tool_steps: int = 1, delay: float = 0.0) -> Agent:
    """``tool_steps`` steps that each call ``lookup``, then an answer of ``words`` deltas."""
    answer = [TextChunk(text=f" w{i}") for i in range(words)]

    def respond(request: InferRequest) -> list:  # type: ignore[type-arg]
        step = current_step(request.messages)
        if step < tool_steps:
            return tool_call("lookup", {"city": "Paris"}, tool_call_id=f"call_{step}")
        return answer

    provider = ScriptedProvider(responder=respond, delay=delay, keep_requests=0)
    return Agent(name="bench-worker", provider=provider, instructions="bench", tools=[lookup])


agent = make_agent(
    words=int(os.environ.get("AXON_BENCH_WORDS", "20") or 20),
    delay=float(os.environ.get("AXON_BENCH_DELAY", "0") or 0),
)
"""Every session's agent in the worker processes."""
