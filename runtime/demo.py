"""The offline demo: an agent on the scripted provider with a weather and a clock tool.

``python -m runtime run "Weather in Paris?"`` runs it: the model reasons, calls
``get_weather`` (or ``get_time``), and answers from the tool's result, all streamed as a
real provider would stream it — with no key and no network.
"""

from __future__ import annotations

import datetime
import re
import zlib
from typing import Any

from runtime.agent import Agent
from runtime.chunks import ReasoningChunk, StreamChunk
from runtime.messages import ToolMessage, UserMessage
from runtime.protocol import InferRequest
from runtime.tools import tool


@tool
async def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city.

    Args:
        city: The city name, e.g. "Paris".
    """
    h = zlib.crc32(city.lower().encode())
    conditions = ["sunny", "cloudy", "light rain", "windy", "clear skies"]
    return {
        "city": city,
        "temperature_c": 8 + h % 20,
        "conditions": conditions[h % len(conditions)],
    }


@tool
def get_time(timezone: str = "UTC") -> str:
    """The current time (ISO 8601) in a timezone offset such as "UTC" or "+02:00".

    Args:
        timezone: "UTC" or an offset like "+02:00".
    """
    if timezone.upper() == "UTC":
        tz = datetime.UTC
    else:
        sign = -1 if timezone.startswith("-") else 1
        hours, _, minutes = timezone.lstrip("+-").partition(":")
        tz = datetime.timezone(
            sign * datetime.timedelta(hours=int(hours), minutes=int(minutes or 0))
        )
    return datetime.datetime.now(tz).replace(microsecond=0).isoformat()


def _respond(request: InferRequest) -> list[StreamChunk | str]:
    from actors.providers.scripted import tool_call

    user = next((m for m in reversed(request.messages) if isinstance(m, UserMessage)), None)
    prompt = user.text if user else ""
    last = request.messages[-1] if request.messages else None
    if isinstance(last, ToolMessage):  # step 2: answer from the tool's result
        if last.error:
            return [f"Sorry, the {last.tool_name} tool failed: {last.error}"]
        out = last.output
        if last.tool_name == "get_weather" and isinstance(out, dict):
            return [
                ReasoningChunk(
                    text="The tool answered; I will summarize it briefly.", provider="scripted"
                ),
                f"It is {out['temperature_c']}°C and {out['conditions']} "
                f"in {out['city']} right now.",
            ]
        return [f"The current time is {out}."]
    if re.search(r"\b(time|clock|hour)\b", prompt, re.I):
        return [
            ReasoningChunk(
                text="The user wants the time. I will call the clock tool.", provider="scripted"
            ),
            *tool_call("get_time", {"timezone": "UTC"}, tool_call_id="call_time_1"),
        ]
    match = re.search(r"\b(?:in|at|for)\s+([A-Z][\w-]*(?:\s+[A-Z][\w-]*)*)", prompt)
    city = match.group(1) if match else "Paris"
    return [
        ReasoningChunk(
            text=f"The user asks about the weather in {city}. I should call get_weather "
            "rather than guess, then answer in one sentence.",
            provider="scripted",
        ),
        "Let me check the weather. ",
        *tool_call("get_weather", {"city": city}, tool_call_id="call_weather_1"),
    ]


def demo_provider(delay: float = 0.0) -> Any:
    """A scripted provider that plays reasoning, one tool call, then the answer.

    It keeps no requests: the demo serves long-lived ``serve`` processes, where recording
    every request would hold every session's history (and every prompt) forever."""
    from actors.providers.scripted import ScriptedProvider

    return ScriptedProvider(responder=_respond, delay=delay, keep_requests=0)


def demo_agent(*, delay: float = 0.0) -> Agent:
    """The demo agent (``delay`` paces the stream so a terminal shows it typing)."""
    return Agent(
        name="demo",
        provider=demo_provider(delay),
        instructions="You are a concise assistant. Use tools for facts.",
        tools=[get_weather, get_time],
    )
