"""Agents the command-line tests load with ``--agent tests.support.cli_agents:NAME``."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider
from runtime.agent import Agent

agent = Agent(name="mine", provider=ScriptedProvider(responder=lambda request: ["hello from mine"]))
"""One agent for every session."""


def per_session(session_id: str) -> Agent:
    """A function of the session id: its agent says which session it runs."""
    return Agent(
        name="mine",
        provider=ScriptedProvider(responder=lambda request: [f"hello from {session_id}"]),
    )


not_an_agent = 42


def not_an_agent_factory(session_id: str) -> int:
    """A careless factory: a function of the session id that returns no Agent."""
    return 42


def needs_a_tenant(tenant: str, session_id: str) -> Agent:
    """A function the command line cannot call: it takes more than the session id."""
    raise AssertionError("never called")


def raises(session_id: str) -> Agent:
    """A function of the session id that fails (a key it needs is missing, say)."""
    raise RuntimeError("no key for this tenant")


async def async_factory(session_id: str) -> Agent:
    """An ``async def`` factory: its call returns a coroutine, not an Agent."""
    return agent


no_provider = Agent(name="none")
"""An Agent nothing can answer: no provider and no ``model`` string."""
