"""A turn through every actor on the scripted provider: parts, steps, tools, results."""

from __future__ import annotations

import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import (
    Agent,
    AssistantMessage,
    Budget,
    Host,
    ReasoningChunk,
    ReasoningPart,
    TextChunk,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
    tool,
)
from tests.support.grammar import check_grammar


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


@tool
async def slow(seconds: float, label: str) -> str:
    """Sleep, then answer with the label."""
    await trio.sleep(seconds)
    return label


THREE_STEPS = [
    [ReasoningChunk(text="plan"), "first ", *tool_call("lookup", {"key": "a"}, tool_call_id="A")],
    ["second ", *tool_call("lookup", {"key": "b"}, tool_call_id="B")],
    ["done"],
]


async def run(agent: Agent, text: str = "go", **host_kw):
    async with Host.open(log_tap=False, **host_kw) as host:
        session = await host.open_session(agent, session_id="s")
        async with session.stream(text) as out:
            chunks = [c async for c in out]
        return chunks, out.result, session.messages


async def test_three_step_turn_makes_one_assistant_message_with_steps_0_1_2():
    agent = Agent(provider=ScriptedProvider(THREE_STEPS), tools=[lookup])
    chunks, result, messages = await run(agent)

    assert [type(m) for m in messages] == [UserMessage, AssistantMessage, ToolMessage, ToolMessage]
    assistant = messages[1]
    assert [(type(p), p.step) for p in assistant.content] == [
        (ReasoningPart, 0),
        (TextPart, 0),
        (ToolCallPart, 0),
        (TextPart, 1),
        (ToolCallPart, 1),
        (TextPart, 2),
    ]
    assert [(m.tool_call_id, m.step, m.output) for m in messages[2:]] == [
        ("A", 0, "value of a"),
        ("B", 1, "value of b"),
    ]
    assert result.finish_reason == "stop" and result.steps == 3
    assert result.text == "first second done"
    check_grammar(chunks)
    assert [c.step for c in chunks if c.type == "step-start"] == [0, 1, 2]


async def test_output_stream_carries_tool_call_and_result_in_its_step():
    agent = Agent(provider=ScriptedProvider(THREE_STEPS), tools=[lookup])
    chunks, _, _ = await run(agent)
    calls = [
        (c.type, c.step, c.tool_call_id) for c in chunks if c.type in ("tool-call", "tool-result")
    ]
    assert calls == [
        ("tool-call", 0, "A"),
        ("tool-result", 0, "A"),
        ("tool-call", 1, "B"),
        ("tool-result", 1, "B"),
    ]


async def test_part_ids_are_unique_across_steps_even_when_provider_restarts_indexes():
    agent = Agent(provider=ScriptedProvider(THREE_STEPS), tools=[lookup])
    chunks, _, _ = await run(agent)
    starts = [c.part_id for c in chunks if c.type in ("text-start", "reasoning-start")]
    assert len(starts) == 4 and len(set(starts)) == 4


async def test_two_tools_that_each_sleep_one_second_finish_in_one_second(autojump_clock):
    step0 = [
        *tool_call("slow", {"seconds": 1.0, "label": "x"}, tool_call_id="X"),
        *tool_call("slow", {"seconds": 1.0, "label": "y"}, tool_call_id="Y"),
    ]
    agent = Agent(provider=ScriptedProvider([step0, ["ok"]]), tools=[slow])
    start = trio.current_time()
    _, result, messages = await run(agent)
    assert trio.current_time() - start == 1.0
    assert [m.output for m in messages if isinstance(m, ToolMessage)] == ["x", "y"]
    assert result.finish_reason == "stop"


async def test_results_stream_in_completion_order_but_are_saved_in_call_order(autojump_clock):
    step0 = [
        *tool_call("slow", {"seconds": 2.0, "label": "late"}, tool_call_id="first"),
        *tool_call("slow", {"seconds": 1.0, "label": "early"}, tool_call_id="second"),
    ]
    agent = Agent(provider=ScriptedProvider([step0, ["ok"]]), tools=[slow])
    chunks, _, messages = await run(agent)
    streamed = [c.tool_call_id for c in chunks if c.type == "tool-result"]
    saved = [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]
    assert streamed == ["second", "first"]
    assert saved == ["first", "second"]


async def test_deltas_go_out_as_they_arrive_not_after_the_step(autojump_clock):
    provider = ScriptedProvider([[TextChunk(text="one "), Sleep(5), TextChunk(text="two")]])
    agent = Agent(provider=provider)
    seen: list[tuple[float, str]] = []
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        t0 = trio.current_time()
        async with session.stream("hi") as out:
            async for c in out:
                if c.type == "text-delta":
                    seen.append((trio.current_time() - t0, c.text))
    assert seen == [(0.0, "one "), (5.0, "two")]


async def test_max_steps_budget_ends_the_turn_with_finish_reason_budget():
    looping = [*tool_call("lookup", {"key": "k"}, tool_call_id="L")]
    agent = Agent(
        provider=ScriptedProvider([looping] * 5), tools=[lookup], budget=Budget(max_steps=2)
    )
    chunks, result, messages = await run(agent)
    assert result.finish_reason == "budget" and result.budget == "max_steps"
    assert result.steps == 2
    assert chunks[-1].type == "finish" and chunks[-1].finish_reason == "budget"
    # every call made has its result: the history is valid for the next request
    assert sum(isinstance(m, ToolMessage) for m in messages) == 2


async def test_max_tool_calls_budget_refuses_calls_past_it():
    step0 = [
        *tool_call("lookup", {"key": "1"}, tool_call_id="c1"),
        *tool_call("lookup", {"key": "2"}, tool_call_id="c2"),
    ]
    agent = Agent(
        provider=ScriptedProvider([step0, ["x"]]), tools=[lookup], budget=Budget(max_tool_calls=1)
    )
    _, result, messages = await run(agent)
    tools = [m for m in messages if isinstance(m, ToolMessage)]
    assert tools[0].output == "value of 1"
    assert "max_tool_calls" in tools[1].error
    assert result.finish_reason == "budget" and result.budget == "max_tool_calls"


async def test_second_turn_continues_the_same_history():
    agent = Agent(provider=ScriptedProvider(turns=[[["hello"]], [["again"]]]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="two")
        first = await session.run("one")
        second = await session.run("two")
        provider = agent.provider
    assert (first.text, second.text) == ("hello", "again")
    assert [m.role for m in session.messages] == ["user", "assistant", "user", "assistant"]
    # the second request carried the whole first turn
    assert [m.role for m in provider.requests[1].messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]


async def test_hooks_see_turn_step_message_and_tool_events_in_order():
    from runtime import Hooks

    seen: list[str] = []

    async def record(event):
        seen.append(event.kind)

    hooks = Hooks(
        on_turn_start=record,
        on_turn_finish=record,
        on_step_start=record,
        on_step_finish=record,
        on_message_added=record,
        on_tool_call=record,
        on_tool_result=record,
    )
    steps = [[*tool_call("lookup", {"key": "a"}, tool_call_id="A")], ["ok"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[lookup], hooks=hooks)
    await run(agent)
    assert seen == [
        "turn.started",
        "step.started",
        "tool.call-requested",
        "tool.call-completed",
        "step.finished",
        "message.added",
        "step.started",
        "step.finished",
        "message.added",
        "turn.finished",
    ]


async def test_a_second_concurrent_turn_on_one_session_is_refused():
    import pytest

    from runtime import SessionBusy

    agent = Agent(provider=ScriptedProvider([["a ", Sleep(1), "b"]]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("first") as out:
            with pytest.raises(SessionBusy):
                async with session.stream("second"):
                    pass
            await out.collect()
        assert out.result.finish_reason == "stop"


async def test_a_call_truncated_by_length_tells_the_model_the_providers_reason():
    # The provider knows best what is wrong with the input; its words reach the model
    # instead of the runner's generic "the response ended with 'length'".
    from runtime import FinishChunk, ToolCallChunk

    why = "the tool input was truncated by the output token limit (max_tokens)"
    steps = [
        [
            ToolCallChunk(
                tool_call_id="T", tool_name="lookup", input='{"key": "a', input_error=why
            ),
            FinishChunk(reason="length", raw_reason="max_tokens"),
        ],
        ["sorry"],
    ]
    agent = Agent(provider=ScriptedProvider(steps), tools=[lookup])
    chunks, result, messages = await run(agent)
    tool_msg = next(m for m in messages if isinstance(m, ToolMessage))
    assert tool_msg.error == why and tool_msg.output is None
    assert [c.error for c in chunks if c.type == "tool-error"] == [why]
    assert result.text == "sorry"


async def test_a_hook_raising_budget_exceeded_ends_the_turn_cleanly_with_its_budget():
    from actors.stores import MemoryStore
    from runtime import BudgetExceeded, Hooks

    async def cost_guard(event):
        raise BudgetExceeded("max_cost")

    store = MemoryStore()
    steps = [["first ", *tool_call("lookup", {"key": "a"}, tool_call_id="A")], ["never"]]
    agent = Agent(
        provider=ScriptedProvider(steps), tools=[lookup], hooks=Hooks(on_step_finish=cost_guard)
    )
    chunks, result, _ = await run(agent, store=store)
    assert result.finish_reason == "budget" and result.budget == "max_cost"
    assert result.error is None and result.steps == 1
    assert chunks[-1].type == "finish" and chunks[-1].budget == "max_cost"
    check_grammar(chunks)
    saved = (await store.load("s")).messages
    assert [m.role for m in saved] == ["user", "assistant", "tool"]
    assert saved[1].text == "first " and saved[2].output == "value of a"


async def test_a_turn_start_hook_raising_budget_exceeded_ends_the_turn_before_any_step():
    from runtime import BudgetExceeded, Hooks

    async def over_daily_quota(event):
        raise BudgetExceeded("daily_quota")

    provider = ScriptedProvider([["never"]])
    agent = Agent(provider=provider, hooks=Hooks(on_turn_start=over_daily_quota))
    chunks, result, messages = await run(agent)
    assert [c.type for c in chunks] == ["start", "finish"]
    assert chunks[-1].budget == "daily_quota" and result.steps == 0
    assert not provider.requests and result.error is None
    assert [m.role for m in messages] == ["user", "assistant"] and messages[1].content == ()
