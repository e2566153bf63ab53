"""The offline demo: an agent on the scripted provider with a weather and a clock tool.

``python -m runtime run "Weather in Paris?"`` runs it: the model reasons, calls
``get_weather`` (or ``get_time``), and answers from the tool's result, all streamed as a
real provider would stream it — with no key and no network. The model's side of it (what
the scripted provider answers) is :func:`actors.providers.scripted.demo_script`.
"""

from __future__ import annotations

import datetime
import zlib
from typing import Any

from actors.providers.scripted import ScriptedProvider
from runtime.agent import Agent
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


def demo_provider(delay: float = 0.0) -> ScriptedProvider:
    """The demo's scripted provider (:meth:`ScriptedProvider.demo
    <actors.providers.scripted.ScriptedProvider.demo>`): reasoning, one tool call, then
    the answer."""
    return ScriptedProvider.demo(delay)


def demo_agent(*, delay: float = 0.0) -> Agent:
    """The demo agent (``delay`` paces the stream so a terminal shows it typing)."""
    return Agent(
        name="demo",
        provider=demo_provider(delay),
        instructions="You are a concise assistant. Use tools for facts.",
        tools=[get_weather, get_time],
    )
