"""Structured output through the whole host and the real SDK clients on a loopback server:
what each provider is asked for, the partial objects that stream, a rejected answer sent
back with its error, and the restored request of a later turn."""

from __future__ import annotations

import json
import sys

import pydantic
import trio

from actors.providers import AnthropicProvider, OpenAIProvider
from actors.providers.anthropic import OUTPUT_INSTRUCTION
from actors.turn.structured import retry_prompt
from runtime import Agent, Host, tool
from runtime.actor_messages import InferRequest
from runtime.inbox import Inbox
from runtime.messages import ReasoningPart, TextPart, UserMessage
from runtime.output_schema import output_schema, strict_schema
from tests.support.grammar import check_grammar
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
    sse,
)
from tests.test_provider_e2e import SIG, an_thinking, oa_chunk, oa_usage


class Weather(pydantic.BaseModel):
    """The weather in a city."""

    city: str
    temp: float


GOOD = '{"city": "Paris", "temp": 21.5}'
BAD = '{"city": "Paris", "temp": "hot"}'
ERROR = "the answer does not match the output schema: temp: Input should be a valid number, "
ERROR += "unable to parse string as a number"


def pieces(text: str, n: int = 3) -> list[str]:
    size = -(-len(text) // n)
    return [text[i : i + size] for i in range(0, len(text), size)]


async def run_two_turns(agent: Agent, server, second_reply: Reply):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        async with session.stream("weather?") as out:
            chunks = [c async for c in out]
        server.add(second_reply)
        await session.run("and tomorrow?")
        return chunks, out.result, list(session.messages)


# -- OpenAI: response_format json_schema, strict ----------------------------------------------


def oa_json(text: str) -> bytes:
    deltas = [oa_chunk({"role": "assistant", "content": ""})]
    deltas += [oa_chunk({"content": p}) for p in pieces(text)]
    return sse(*deltas, oa_chunk({}, "stop"), oa_usage())


async def test_openai_asks_for_strict_json_schema_and_retries_with_the_validation_error():
    async with loopback_server(
        Reply(body=oa_json(BAD), write_events=True), Reply(body=oa_json(GOOD), write_events=True)
    ) as server:
        provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key="test")
        agent = Agent(provider=provider, output_type=Weather)
        chunks, result, stored = await run_two_turns(agent, server, Reply(body=oa_json(GOOD)))
    check_grammar(chunks)
    assert result.output == Weather(city="Paris", temp=21.5) and result.steps == 2
    first, retry, later = (r.json() for r in server.requests)
    assert first["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Weather",
            "schema": strict_schema(output_schema(Weather).schema),
            "description": "The weather in a city.",
            "strict": True,
        },
    }
    assert first["response_format"]["json_schema"]["schema"]["additionalProperties"] is False
    # the partial objects stream, each step's last one being its whole answer
    deltas = [c for c in chunks if c.type == "object-delta"]
    assert [d.value for d in deltas if d.step == 1][-1] == {"city": "Paris", "temp": 21.5}
    assert [d.value for d in deltas if d.step == 0][-1] == {"city": "Paris", "temp": "hot"}
    assert retry["messages"] == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": BAD},
        {"role": "user", "content": retry_prompt(ERROR)},
    ]
    # stored: both answers as text; the next turn restores them, without the feedback
    assert [p.text for p in stored[1].content] == [BAD, GOOD]
    assert later["messages"] == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": BAD},
        {"role": "assistant", "content": GOOD},
        {"role": "user", "content": "and tomorrow?"},
    ]


async def test_openai_refuses_a_schema_strict_mode_cannot_express_before_sending_anything():
    class Tags(pydantic.BaseModel):
        tags: dict[str, int]

    async with loopback_server() as server:
        provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key="test")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider, output_type=Tags))
            async with session.stream("tags?") as out:
                chunks = [c async for c in out]
            stored = list(session.messages)
    check_grammar(chunks, ending="error")
    assert chunks[-1].error.kind == "ConfigurationError"
    assert "additional properties" in chunks[-1].error.message
    assert server.requests == []  # nothing was sent
    assert stored[0] == UserMessage(content="tags?", id=stored[0].id)
    assert stored[1].error.kind == "ConfigurationError"  # the input is kept, marked failed


# -- Anthropic: a forced final_output tool -------------------------------------------------


def an_answer(index: int, text: str) -> list[dict]:
    start = {
        "type": "content_block_start",
        "index": index,
        "content_block": {
            "type": "tool_use",
            "id": "toolu_out",
            "name": "final_output",
            "input": {},
        },
    }
    deltas = [
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": p},
        }
        for p in pieces(text)
    ]
    return [start, *deltas, {"type": "content_block_stop", "index": index}]


def an_json(text: str) -> bytes:
    return anthropic_sse(anthropic_start(), *an_answer(0, text), *anthropic_end("tool_use"))


async def test_anthropic_forces_the_output_tool_and_its_input_is_the_answer_text():
    async with loopback_server(
        Reply(body=an_json(BAD), write_events=True), Reply(body=an_json(GOOD), write_events=True)
    ) as server:
        provider = AnthropicProvider("claude-sonnet-4-5", base_url=server.url, api_key="test")
        agent = Agent(provider=provider, output_type=Weather, instructions="Be brief.")
        chunks, result, stored = await run_two_turns(agent, server, Reply(body=an_json(GOOD)))
    check_grammar(chunks)
    assert result.output == Weather(city="Paris", temp=21.5)
    first, retry, later = (r.json() for r in server.requests)
    assert first["tools"] == [
        {
            "name": "final_output",
            "description": "The weather in a city.",
            "input_schema": output_schema(Weather).schema,
        }
    ]
    assert first["tool_choice"] == {"type": "tool", "name": "final_output"}
    assert first["system"] == "Be brief."
    # the answer is not a tool call: no tool chunks, nothing executed, the step just stops
    types = {c.type for c in chunks}
    assert not types & {"tool-input-start", "tool-call", "tool-result", "tool-error"}
    assert [c.finish_reason for c in chunks if c.type == "step-finish"] == ["stop", "stop"]
    assert [c.value for c in chunks if c.type == "object-delta"][-1] == {
        "city": "Paris",
        "temp": 21.5,
    }
    assert retry["messages"] == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "text", "text": BAD}]},
        {"role": "user", "content": retry_prompt(ERROR)},
    ]
    # stored as text, so the restored request has no tool_use waiting for a tool_result
    assert stored[1].content == (TextPart(text=BAD, step=0), TextPart(text=GOOD, step=1))
    assert later["messages"] == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": BAD}, {"type": "text", "text": GOOD}],
        },
        {"role": "user", "content": "and tomorrow?"},
    ]


async def test_anthropic_with_thinking_asks_for_the_tool_in_the_prompt_instead_of_forcing_it():
    body = anthropic_sse(
        anthropic_start(),
        *an_thinking(0, "easy", SIG),
        *an_answer(1, GOOD),
        *anthropic_end("tool_use"),
    )
    async with loopback_server(Reply(body=body)) as server:
        provider = AnthropicProvider(
            "claude-sonnet-4-5",
            base_url=server.url,
            api_key="test",
            thinking_budget=1024,
            max_tokens=2048,
        )
        agent = Agent(provider=provider, output_type=Weather, instructions="Be brief.")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            result = await session.run("weather?")
    request = server.requests[0].json()
    assert "tool_choice" not in request  # forced tool use is refused with thinking on
    assert request["system"] == f"Be brief.\n\n{OUTPUT_INSTRUCTION}"
    assert result.output == Weather(city="Paris", temp=21.5)
    assert result.message.content == (
        ReasoningPart(
            text="easy",
            step=0,
            signature=SIG,
            provider="anthropic",
            model="claude-sonnet-4-5",
            endpoint=server.url,
        ),
        TextPart(text=GOOD, step=0),
    )


@tool
async def lookup(city: str) -> str:
    """Look the weather up."""
    return "21.5"


def test_anthropic_with_tools_of_its_own_forces_some_tool_not_the_answer():
    provider = AnthropicProvider("claude-sonnet-4-5", api_key="test")
    request = InferRequest(
        request_id="r",
        session_id="s",
        turn_id="t",
        step=0,
        instructions=None,
        messages=(UserMessage(content="hi"),),
        tools=(lookup,),
        reply=Inbox(),
        cancel_scope=trio.CancelScope(),
        output=output_schema(Weather),
    )
    params = provider.request_params(request)
    assert [t["name"] for t in params["tools"]] == ["lookup", "final_output"]
    assert params["tool_choice"] == {"type": "any"}


# -- the command line ----------------------------------------------------------------------


async def test_cli_output_schema_asks_for_it_and_streams_object_deltas(tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    async with loopback_server(Reply(body=oa_json('{"n": 42}'))) as server:
        proc = await trio.run_process(
            [
                sys.executable,
                "-m",
                "runtime",
                "run",
                "--jsonl",
                "--provider",
                "openai",
                "--base-url",
                server.url + "/v1",
                "--api-key",
                "test",
                "--output-schema",
                str(path),
                "count",
            ],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    chunks = [json.loads(x) for x in proc.stdout.decode().splitlines()]
    check_grammar(chunks)
    assert [c["value"] for c in chunks if c["type"] == "object-delta"][-1] == {"n": 42}
    sent = server.requests[0].json()["response_format"]["json_schema"]
    assert sent["schema"] == {**schema, "additionalProperties": False}
