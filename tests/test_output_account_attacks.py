"""Attacks on the output account that sub-agents called at once share
(:class:`runtime.budget.OutputAccount`, the budget3 merge): stalls, reservations not
given back, cancellation, fallbacks, A2A cuts.

Each test pins a behaviour found by trying to break it; those that found a defect say
which fix they need (the journal's ``attackbudget`` section).
"""

from __future__ import annotations

from typing import Any

import trio

from actors.a2a import A2AAgent
from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Budget, Host, ToolMessage, tool
from runtime.actor_messages import InferRequest
from tests.test_a2a import BOTH
from tests.web.harness import web_server

# -- A2A: a remote call held the account for its whole remote turn ---------------------


def _gated_remote(gate: trio.Event) -> Agent:
    """Says "Working on it. ", waits in a tool until ``gate`` is set, then "Done."."""

    @tool
    async def wait_here() -> str:
        """Wait."""
        await gate.wait()
        return "ok"

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return ["Working on it. ", *tool_call("wait_here", {})]
        return ["Done."]

    return Agent(name="slow", provider=ScriptedProvider(responder=script), tools=[wait_here])


async def test_a_remote_call_does_not_hold_the_account_while_its_remote_turn_waits():
    """A remote agent and a local sub-agent called in one step, the remote one waiting
    (in a tool) for what the local one does. The remote call reserved all the caller
    had left for the whole remote turn, so the local sub-agent's model call waited for
    it: a deadlock, ended only by the tool timeout (the remote call's result a timeout
    error). A remote answer now draws on the account as its bytes arrive: nothing is
    held while the remote turn waits, and both finish."""
    gate = trio.Event()

    def helper_model(request: InferRequest) -> list[Any]:
        gate.set()  # what the remote agent waits for
        return ["helped"]

    helper = Agent(name="helper", provider=ScriptedProvider(responder=helper_model))

    async with web_server(_gated_remote(gate), protocols=BOTH) as server:
        remote = A2AAgent(server.url).as_tool(name="researcher")

        def script(request: InferRequest) -> list[Any]:
            if current_step(request.messages) == 0:
                return [
                    *tool_call("researcher", {"input": "q"}, tool_call_id="R"),
                    *tool_call("helper", {"input": "h"}, tool_call_id="H"),
                ]
            return ["ok"]

        lead = Agent(
            name="lead",
            provider=ScriptedProvider(responder=script),
            tools=[remote, helper.as_tool()],
            budget=Budget(max_output_tokens=200, tool_timeout=5),
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead, session_id="p")
            with trio.fail_after(30):
                result = await session.run("go")
            tools = [m for m in session.messages if isinstance(m, ToolMessage)]
            outputs = {m.tool_call_id: m.output or m.error for m in tools}
    assert outputs == {"R": "Working on it. Done.", "H": "helped"}
    assert result.finish_reason == "stop"
    assert result.usage.output_tokens == 1 + len("Working on it. Done.") + 1 + 1


# -- compaction: a sub-turn's history processors held all that was left ----------------


async def test_a_history_processor_that_waits_holds_nothing_of_the_account(autojump_clock):
    """Two sub-agents called at once; the first's history processor (an application's,
    async) waits for what the second's model call does. Compaction reserved all the
    caller had left for all of its processors, a summary call or not, so the second's
    call waited for it: a deadlock, ended only by the tool timeout. A summary call now
    reserves its cap as it is made, and a processor that makes none holds nothing."""
    gate, inside = trio.Event(), trio.Event()

    async def waits(messages: Any, context: Any) -> Any:
        inside.set()
        await gate.wait()  # (a retrieval, a lock: anything an application awaits)
        return messages

    async def after_first(messages: Any, context: Any) -> Any:
        await inside.wait()  # (the second's call comes once the first is compacting)
        return messages

    def second_model(request: InferRequest) -> list[Any]:
        gate.set()
        return ["second"]

    first = Agent(name="first", provider=ScriptedProvider(["first"]), history_processors=[waits])
    second = Agent(
        name="second",
        provider=ScriptedProvider(responder=second_model),
        history_processors=[after_first],
    )

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return [
                *tool_call("first", {"input": "a"}, tool_call_id="A"),
                *tool_call("second", {"input": "b"}, tool_call_id="B"),
            ]
        return ["ok"]

    lead = Agent(
        name="lead",
        provider=ScriptedProvider(responder=script),
        tools=[first.as_tool(), second.as_tool()],
        budget=Budget(max_output_tokens=100, tool_timeout=5),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, session_id="c")
        with trio.fail_after(30):
            result = await session.run("go")
        tools = [m for m in session.messages if isinstance(m, ToolMessage)]
    assert {m.tool_call_id: m.output or m.error for m in tools} == {"A": "first", "B": "second"}
    assert result.finish_reason == "stop"
