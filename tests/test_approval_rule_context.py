"""What a per-call approval rule (``needs_approval=lambda args, ctx: ...``) is told of its
call (docs/approval.md, "Declaring tools"): the ``ToolContext`` fields the call's tool is
told, as the turn decides whether to wait. Before, the rule's context said ``depth`` 0
in a sub-agent (an agent used as a tool), where the tool itself and an in-process
approver's rule are told the sub-agent's depth: a rule that asks only at the top
(``ctx.depth == 0``) asked nothing anywhere."""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, ToolContext, tool

FIELDS = ("session_id", "turn_id", "step", "tool_call_id", "tool_name", "deps", "depth")
told: dict[str, tuple[Any, ...]] = {}


def rule(arguments: dict[str, Any], ctx: ToolContext) -> bool:
    told["rule"] = tuple(getattr(ctx, f) for f in FIELDS)
    return False  # (runs at once: the tool says what it is told)


@tool(needs_approval=rule)
async def lookup(key: str, ctx: ToolContext) -> str:
    """Look a key up."""
    told["tool"] = tuple(getattr(ctx, f) for f in FIELDS)
    return "found"


@pytest.fixture(autouse=True)
def _clear() -> None:
    told.clear()


async def test_a_rule_is_told_the_calls_own_context_fields():
    agent = Agent(
        provider=ScriptedProvider([[*tool_call("lookup", {"key": "a"})], ["done"]]),
        tools=[lookup],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s", deps={"user": "ann"})
        await session.run("go")
    assert told["rule"] == told["tool"]
    assert told["rule"][0] == "s" and told["rule"][5] == {"user": "ann"}


async def test_a_sub_agents_rule_is_told_the_sub_agents_depth():
    helper = Agent(
        name="helper",
        provider=ScriptedProvider([[*tool_call("lookup", {"key": "a"})], ["found it"]]),
        tools=[lookup],
    )
    agent = Agent(
        provider=ScriptedProvider([[*tool_call("helper", {"input": "look"})], ["ok"]]),
        tools=[helper.as_tool()],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("go")
    assert told["rule"][6] == told["tool"][6] == 1
