"""Tools: schemas from hints and docstrings, and every failure becomes a result the model sees."""

from __future__ import annotations

import time

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.tool_executor import run_tool_call, truncate_output
from runtime import Agent, Budget, Host, ToolCallChunk, ToolDefinitionError, ToolMessage, tool
from runtime.actor_messages import ToolCallSpec
from runtime.tools import InvalidJSONSchema, json_schema_validator


@tool
def forecast(city: str, days: int = 3) -> str:
    """Forecast for a city.

    Args:
        city: Which city.
        days: How many days ahead.
    """
    return f"{city}:{days}"


def test_schema_comes_from_type_hints_and_docstring():
    assert forecast.name == "forecast"
    assert forecast.description == "Forecast for a city."
    assert forecast.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "Which city."},
            "days": {"type": "integer", "default": 3, "description": "How many days ahead."},
        },
        "required": ["city"],
    }


def test_tool_can_be_renamed_and_redescribed_directly():
    def ident(x: int) -> int:
        return x

    renamed = tool(ident, name="identity", description="Returns x.")
    assert (renamed.name, renamed.description) == ("identity", "Returns x.")


def test_function_without_hints_cannot_be_a_tool():
    def untyped(x):
        return x

    with pytest.raises(ToolDefinitionError, match="no type hint"):
        tool(untyped)


async def outcome(name: str, args, tools=None, limit=None, max_chars=None):
    tools = tools or {"forecast": forecast}
    return await run_tool_call(
        ToolCallSpec(tool_call_id="c", tool_name=name, input=args), tools, limit, max_chars
    )


async def test_sync_tool_runs_in_a_thread_and_returns_output():
    oc = await outcome("forecast", {"city": "Oslo"})
    assert (oc.output, oc.error) == ("Oslo:3", None)


async def test_unknown_tool_becomes_an_error_naming_the_available_ones():
    oc = await outcome("nope", {})
    assert oc.error == "unknown tool 'nope'; available tools: forecast"


async def test_invalid_arguments_become_an_error_saying_what_is_wrong():
    oc = await outcome("forecast", {"days": "many"})
    assert "city: Field required" in oc.error and "days:" in oc.error


async def test_arguments_that_are_not_an_object_are_rejected():
    oc = await outcome("forecast", "{not json")
    assert oc.error == "arguments for forecast must be a JSON object, got str"


async def test_exception_in_a_tool_becomes_an_error_result():
    @tool
    async def broken() -> str:
        """Fails."""
        raise KeyError("missing")

    oc = await outcome("broken", {}, {"broken": broken})
    assert oc.error == "tool broken raised KeyError: 'missing'"


async def test_tool_past_its_timeout_is_abandoned(autojump_clock):
    @tool(timeout=2)
    async def sleepy() -> str:
        """Sleeps."""
        await trio.sleep(100)
        return "never"

    oc = await outcome("sleepy", {}, {"sleepy": sleepy})
    assert oc.error == "tool sleepy timed out after 2s"


async def test_sync_tool_timeout_does_not_block_the_loop():
    @tool(timeout=0.05)
    def blocking() -> str:
        """Blocks a thread."""
        time.sleep(0.5)
        return "late"

    start = time.monotonic()
    oc = await outcome("blocking", {}, {"blocking": blocking})
    assert oc.error == "tool blocking timed out after 0.05s"
    assert time.monotonic() - start < 0.4


async def test_unserializable_return_value_becomes_an_error():
    @tool
    async def odd() -> object:
        """Returns a socket-like thing."""
        return trio.Event()

    oc = await outcome("odd", {}, {"odd": odd})
    assert oc.error.startswith("tool odd returned a value that is not JSON")


def test_huge_output_is_truncated_with_a_visible_marker():
    out = truncate_output("x" * 50, 10)
    assert out == "x" * 10 + "…[truncated: 40 of 50 characters omitted]"
    assert truncate_output({"a": 1}, 100) == {"a": 1}


async def test_tool_errors_reach_the_model_as_tool_messages_and_the_turn_goes_on():
    steps = [
        [
            *tool_call("forecast", {"days": 1}, tool_call_id="bad"),
            *tool_call("ghost", {}, tool_call_id="ghost"),
        ],
        ["recovered"],
    ]
    provider = ScriptedProvider(steps)
    agent = Agent(provider=provider, tools=[forecast])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("hi") as out:
            chunks = [c async for c in out]
    errors = [(c.tool_call_id, c.type) for c in chunks if c.type.startswith("tool-e")]
    assert sorted(errors) == [("bad", "tool-error"), ("ghost", "tool-error")]
    second_request = provider.requests[1].messages
    tool_msgs = [m for m in second_request if isinstance(m, ToolMessage)]
    assert [m.tool_call_id for m in tool_msgs] == ["bad", "ghost"]
    assert all(m.error for m in tool_msgs)
    assert out.result.text == "recovered"


async def test_calls_cut_by_length_are_not_executed_and_the_model_is_told():
    ran: list[str] = []

    @tool
    async def write(text: str) -> str:
        """Write."""
        ran.append(text)
        return "ok"

    from runtime import FinishChunk

    steps = [
        [
            ToolCallChunk(tool_call_id="w", tool_name="write", input={"text": "partial"}),
            FinishChunk(reason="length", raw_reason="max_tokens"),
        ],
        ["sorry"],
    ]
    agent = Agent(provider=ScriptedProvider(steps), tools=[write])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("write it")
    assert ran == []
    tool_msg = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert "not executed" in tool_msg.error and "'length'" in tool_msg.error
    assert result.text == "sorry"


async def test_call_with_unparsable_input_gets_the_provider_reason_as_error():
    steps = [
        [
            ToolCallChunk(
                tool_call_id="j",
                tool_name="forecast",
                input='{"city": "Os',
                input_error="invalid JSON in tool arguments",
            )
        ],
        ["ok"],
    ]
    agent = Agent(provider=ScriptedProvider(steps), tools=[forecast], budget=Budget(max_steps=3))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        await session.run("x")
    tool_msg = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert tool_msg.error == "invalid JSON in tool arguments"


async def test_a_custom_tool_executor_plugs_in_through_the_host():
    from actors.tool_executor import ToolExecutor
    from runtime.actor_messages import ToolOutcome

    class CachingExecutor(ToolExecutor):
        """Answers every call from a fixed cache instead of running the tool."""

        async def handle(self, message):
            for call in message.calls:
                await message.reply.put(
                    ToolOutcome(
                        tool_call_id=call.tool_call_id, tool_name=call.tool_name, output="cached"
                    )
                )

    steps = [[*tool_call("forecast", {"city": "Oslo"}, tool_call_id="F")], ["ok"]]
    async with Host.open(log_tap=False, tool_executor=CachingExecutor()) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider(steps), tools=[forecast]))
        await session.run("x")
    assert next(m for m in session.messages if isinstance(m, ToolMessage)).output == "cached"


# -- JSON schemas from elsewhere (MCP tools, structured output) ----------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "http://169.254.169.254/latest/meta-data/iam"},
        {"$ref": "https://example.com/schema.json"},
        {"$ref": "file:///etc/passwd"},
        {"$ref": "//example.com/x"},
        {"$ref": "../secrets.json#/x"},
        {"$ref": "urn:example:thing"},
        {"$dynamicRef": "http://example.com/meta#node"},
        {"$id": "http://example.com/root", "properties": {"x": {"$ref": "other.json"}}},
        {"allOf": [{"items": {"anyOf": [{"$ref": "http://example.com/deep"}]}}]},
    ],
)
def test_a_json_schema_with_a_reference_outside_it_is_refused(schema):
    with pytest.raises(InvalidJSONSchema, match="points outside the schema"):
        json_schema_validator(schema)


def test_a_json_schema_ref_to_nothing_in_it_is_refused():
    with pytest.raises(InvalidJSONSchema, match="'#/\\$defs/missing' points to nothing"):
        json_schema_validator({"properties": {"x": {"$ref": "#/$defs/missing"}}})


def test_a_ref_shaped_value_inside_const_is_data_not_a_reference():
    validator = json_schema_validator({"const": {"$ref": "http://example.com/x"}})
    assert validator.is_valid({"$ref": "http://example.com/x"})


@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}},
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"n": {"type": "integer"}},
            "properties": {"x": {"$ref": "#/definitions/n"}},
        },
        {
            "$id": "http://example.com/s",
            "$defs": {"n": {"type": "integer"}},
            "properties": {"x": {"$ref": "#/$defs/n"}},
        },
    ],
)
def test_a_json_schema_with_local_references_validates(schema):
    validator = json_schema_validator(schema)
    assert validator.is_valid({"x": 1}) and not validator.is_valid({"x": "one"})


def test_a_json_schema_nested_too_deeply_is_refused_in_one_line():
    schema: dict = {}
    for _ in range(5000):
        schema = {"items": schema}
    with pytest.raises(InvalidJSONSchema, match="nested too deeply"):
        json_schema_validator(schema)
