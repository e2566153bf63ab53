"""The embedding API a program starts with: ``run_sync``, a tool's ``deps``, a history
passed in instead of loaded from a store, and the names ``runtime`` exports for them."""

from __future__ import annotations

import asyncio

import attrs
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.memory import MemoryStore
from runtime import (
    Agent,
    AssistantMessage,
    ConfigurationError,
    Host,
    InvalidHistory,
    TextPart,
    ToolContext,
    UserMessage,
    run_sync,
    tool,
)


@attrs.frozen
class Deps:
    user: str


@tool
async def whoami(context: ToolContext[Deps]) -> str:
    """The signed-in user."""
    return context.deps.user if context.deps is not None else "nobody"


def whoami_agent() -> Agent:
    steps = [[*tool_call("whoami", {})], ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=[whoami])


def earlier_turn() -> list:
    return [
        UserMessage(content="My name is Ada."),
        AssistantMessage(content=(TextPart(text="Hello Ada.", step=0),)),
    ]


def test_run_sync_returns_the_turn_result_with_its_text():
    result = run_sync(Agent(provider=ScriptedProvider([["Hello there."]])), "Hi")
    assert (result.finish_reason, result.text) == ("stop", "Hello there.")


def test_run_sync_works_in_a_running_asyncio_loop_as_in_a_notebook_cell():
    async def cell():
        return run_sync(Agent(provider=ScriptedProvider([["from a notebook"]])), "Hi").text

    assert asyncio.run(cell()) == "from a notebook"


async def test_run_sync_inside_a_trio_program_is_refused():
    with pytest.raises(ConfigurationError, match=r"await session\.run"):
        run_sync(Agent(provider=ScriptedProvider([["x"]])), "Hi")


def test_run_sync_hands_deps_to_the_tools():
    result = run_sync(whoami_agent(), "who am I?", deps=Deps(user="ada"))
    assert result.tool_messages[0].output == "ada"


def test_run_sync_continues_the_history_it_is_given():
    provider = ScriptedProvider([["Ada."]])
    run_sync(Agent(provider=provider), "What is my name?", history=earlier_turn())
    sent = [m.text for m in provider.requests[0].messages]
    assert sent[:3] == ["My name is Ada.", "Hello Ada.", "What is my name?"]


def test_the_new_messages_of_a_turn_carry_the_history_to_the_next_one():
    agent = Agent(provider=ScriptedProvider(turns=[[["Hello Ada."]], [["Ada."]]]))
    first = run_sync(agent, "My name is Ada.")
    second = run_sync(agent, "What is my name?", history=first.new_messages)
    assert [m.text for m in first.new_messages] == ["My name is Ada.", "Hello Ada."]
    assert [m.text for m in second.new_messages] == ["What is my name?", "Ada."]


def test_a_context_parameter_typed_with_deps_is_not_in_the_schema():
    assert whoami.parameters["properties"] == {} and whoami.context_param == "context"


async def test_a_tool_gets_the_deps_its_session_was_opened_with():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(whoami_agent(), deps=Deps(user="ada"))
        result = await session.run("who am I?")
    assert result.tool_messages[0].output == "ada"


async def test_deps_reassigned_between_turns_reach_the_next_turn():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(whoami_agent(), deps=Deps(user="ada"))
        await session.run("who am I?")
        session.deps = Deps(user="grace")
        result = await session.run("and now?")
    assert result.tool_messages[0].output == "grace"


async def test_a_sub_agent_tools_get_the_calling_sessions_deps():
    lead = Agent(
        name="lead",
        provider=ScriptedProvider([[*tool_call("helper", {"input": "who?"})], ["ok"]]),
        tools=[whoami_agent().as_tool(name="helper")],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, deps=Deps(user="ada"))
        async with session.stream("ask the helper") as out:
            nested = [c.chunk async for c in out if c.type == "tool-stream"]
    assert [c.output for c in nested if c.type == "tool-result"] == ["ada"]


async def test_a_history_given_to_a_new_session_is_saved_with_its_first_turn():
    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider([["Ada."]])), "s1", history=earlier_turn()
        )
        await session.run("What is my name?")
    record = await store.load("s1")
    assert [m.text for m in record.messages] == [
        "My name is Ada.",
        "Hello Ada.",
        "What is my name?",
        "Ada.",
    ]


async def test_a_history_for_a_stored_session_is_refused_and_the_store_kept():
    store = MemoryStore()
    agent = Agent(provider=ScriptedProvider([["ok"]]))
    async with Host.open(store=store, log_tap=False) as host:
        await (await host.open_session(agent, "s1")).run("first")
    async with Host.open(store=store, log_tap=False) as host:
        with pytest.raises(InvalidHistory, match="stored already"):
            await host.open_session(agent, "s1", history=earlier_turn())
    assert [m.text for m in (await store.load("s1")).messages] == ["first", "ok"]


async def test_a_history_holding_something_else_than_messages_is_refused():
    agent = Agent(provider=ScriptedProvider([["ok"]]))
    async with Host.open(log_tap=False) as host:
        with pytest.raises(InvalidHistory, match=r"history\[1\] is a dict"):
            await host.open_session(agent, history=[UserMessage(content="hi"), {"role": "user"}])
        with pytest.raises(InvalidHistory, match="not str"):
            await host.open_session(agent, history="hi")
        assert host.sessions == {}


def test_tool_context_is_exported_by_runtime():
    import runtime.tools

    assert ToolContext is runtime.tools.ToolContext
