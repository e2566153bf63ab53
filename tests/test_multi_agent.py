"""Agents as tools: nested streaming, usage roll-up, linked histories."""

from __future__ import annotations

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, ToolMessage, Usage, tool
from tests.support.grammar import check_grammar


@tool
async def lookup(topic: str) -> str:
    """Look up a topic."""
    return f"facts about {topic}"


def make_agents():
    researcher = Agent(
        name="researcher",
        instructions="Find facts.",
        provider=ScriptedProvider(
            [[*tool_call("lookup", {"topic": "trio"}, tool_call_id="R1")], ["Trio is structured."]],
            usage=Usage(input_tokens=100, output_tokens=10, total_tokens=110),
        ),
        tools=[lookup],
    )
    lead = Agent(
        name="lead",
        provider=ScriptedProvider(
            [
                [*tool_call("researcher", {"input": "what is trio?"}, tool_call_id="P1")],
                ["Summary: Trio is structured."],
            ],
            usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2),
        ),
        tools=[researcher.as_tool()],
    )
    return lead, researcher


async def test_sub_agent_streams_nested_under_the_parent_tool_call():
    lead, _ = make_agents()
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, session_id="p")
        async with session.stream("explain trio") as out:
            chunks = [c async for c in out]
    check_grammar(chunks)
    nested = [c for c in chunks if c.type == "tool-stream"]
    assert nested and all(c.tool_call_id == "P1" and c.tool_name == "researcher" for c in nested)
    inner = [c.chunk for c in nested]
    check_grammar(inner)  # the sub-turn is a complete, well-formed stream of its own
    assert [c.type for c in inner if c.type.startswith("tool-")] == [
        "tool-input-start",
        "tool-input-delta",
        "tool-input-delta",
        "tool-input-delta",
        "tool-call",
        "tool-result",
    ]
    # nested chunks arrive before the parent's result for that call
    types = [c.type for c in chunks]
    assert types.index("tool-stream") < types.index("tool-result")
    inner_parts = {c.part_id for c in inner if c.type == "text-start"}
    outer_parts = {c.part_id for c in chunks if c.type == "text-start"}
    assert inner_parts and not inner_parts & outer_parts


async def test_sub_agent_usage_counts_toward_the_parent_turn():
    lead, _ = make_agents()
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, session_id="p")
        result = await session.run("explain trio")
    # parent: 2 steps x 1 in; sub-agent: 2 steps x 100 in
    assert result.usage.input_tokens == 2 + 200
    assert result.usage.total_tokens == 2 * 2 + 2 * 110


async def test_both_histories_are_saved_separately_and_linked(tmp_path):
    lead, _ = make_agents()
    path = str(tmp_path / "m.db")
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(lead, session_id="p")
        await session.run("explain trio")
        parent_messages = session.messages
    async with Host.open(store=path, log_tap=False) as host:
        infos = {i.session_id: i for i in await host.store.list_sessions()}
        child_id = next(s for s in infos if s != "p")
        child = await host.store.load(child_id)
        parent = await host.open_session(lead, session_id="p")
        assert parent.messages == parent_messages
    assert infos[child_id].meta["parent_session_id"] == "p"
    assert infos[child_id].meta["parent_tool_call_id"] == "P1"
    assert [m.role for m in child.messages] == ["user", "assistant", "tool"]
    assert child.messages[0].content == "what is trio?"
    result_msg = next(m for m in parent_messages if isinstance(m, ToolMessage))
    assert result_msg.output == "Trio is structured."


async def test_sub_agent_tool_schema_takes_one_input_string():
    _, researcher = make_agents()
    spec = researcher.as_tool().spec()
    assert spec["name"] == "researcher"
    assert spec["parameters"]["required"] == ["input"]
    assert list(spec["parameters"]["properties"]) == ["input"]
    assert "researcher" in spec["description"]
