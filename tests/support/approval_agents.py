"""Agents whose tool calls wait for a decision, for the command line's approval prompt
(``run --agent tests.support.approval_agents:NAME``; tests/test_cli_approval.py).

Each model is a scripted responder that reads the request, so a turn resumed in another
process (``run --session ID --approve-all``) goes on where the first one stopped."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime.actor_messages import InferRequest
from runtime.agent import Agent
from runtime.budget import Budget
from runtime.messages import ToolMessage
from runtime.tools import Tool, tool


@tool(needs_approval=True)
async def get_weather(city: str) -> str:
    """The weather in a city (it needs a person's approval)."""
    return f"sunny in {city}"


def _answer(request: InferRequest) -> list:
    """The model's answer once the last call has its result (or its denial)."""
    last = request.messages[-1]
    assert isinstance(last, ToolMessage)
    if last.error is not None:
        return [f"I could not check: {last.error}."]
    return [f"It is {last.output}."]


def _once(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("get_weather", {"city": "Oslo"})
    return _answer(request)


def _twice(request: InferRequest) -> list:
    step = current_step(request.messages)
    if step < 2:
        return tool_call("get_weather", {"city": ("Oslo", "Paris")[step]}, tool_call_id=f"c{step}")
    return _answer(request)


agent = Agent(name="asks", provider=ScriptedProvider(responder=_once), tools=[get_weather])

small_edits = Agent(
    name="asks-small",
    provider=ScriptedProvider(responder=_once),
    tools=[get_weather],
    budget=Budget(max_tool_result_chars=20),
)
"""``agent`` whose edits may be 20 characters of JSON (the model's input is 15)."""
"""Calls ``get_weather`` (which waits for approval) once, then answers."""

expiring = Agent(
    name="asks-briefly",
    provider=ScriptedProvider(responder=_once),
    tools=[get_weather],
    approval_timeout=0.5,
)
"""``agent`` whose wait expires half a second after it asks (``approval_timeout``)."""

twice = Agent(name="asks-twice", provider=ScriptedProvider(responder=_twice), tools=[get_weather])
"""Calls ``get_weather`` in two steps (the turn waits twice), then answers."""

locate = Tool.client("locate", {"type": "object", "properties": {}}, "Where the user is.")


def _client(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("locate", {})
    return _answer(request)


client = Agent(name="client", provider=ScriptedProvider(responder=_client), tools=[locate])
"""Calls ``locate``, a client-side tool the command line has no client for."""


def _delegates(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("weather_agent", {"input": "Oslo?"}, tool_call_id="H")
    return _answer(request)


delegates = Agent(
    name="delegates",
    provider=ScriptedProvider(responder=_delegates),
    tools=[
        Agent(
            name="weather_agent", provider=ScriptedProvider(responder=_once), tools=[get_weather]
        ).as_tool(pass_approvals=True)
    ],
)
"""Calls ``weather_agent``, an agent used as a tool whose ``get_weather`` call waits: its
approval passes up (``pass_approvals=True``), and an edit at the prompt is of that call."""
