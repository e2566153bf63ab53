"""Agents the MCP server tests serve in other processes (``--agent tests.support.mcp_agents:...``).

* ``echo``: answers ``echo #N: <input>`` in a few words, ``N`` counting the user messages
  of its session, so a caller sees whether a call continued a conversation;
* ``slow``: says ``thinking``, then waits ``AXON_TEST_SLOW`` seconds (default 30) before
  it answers: a turn to cancel or to find busy.

With ``AXON_TEST_PIDFILE`` set, the process that imports this module writes its pid
there, so a test can signal the very server it started.
"""

from __future__ import annotations

import os

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime.actor_messages import InferRequest
from runtime.agent import Agent
from runtime.messages import UserMessage

if os.environ.get("AXON_TEST_PIDFILE"):
    with open(os.environ["AXON_TEST_PIDFILE"], "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))


def _echo(request: InferRequest) -> list[str]:
    inputs = [m for m in request.messages if isinstance(m, UserMessage)]
    text = inputs[-1].text if inputs else ""
    return [f"echo #{len(inputs)}: ", text]


echo = Agent(name="echo", provider=ScriptedProvider(responder=_echo))

slow = Agent(
    name="slow",
    provider=ScriptedProvider(
        [["thinking ", Sleep(float(os.environ.get("AXON_TEST_SLOW", "30"))), "done"]]
    ),
)
