"""Three-step turns through the whole host with the real SDK clients: the second and third
request bodies restore exactly what the model saw, for OpenAI, Anthropic (first party, on
Vertex, on Bedrock) and Gemini."""

from __future__ import annotations

import base64
import json

from actors.providers import (
    AnthropicBedrockProvider,
    AnthropicProvider,
    AnthropicVertexProvider,
    GeminiProvider,
    OpenAIProvider,
)
from runtime import Agent, Host, tool
from tests.support.grammar import check_grammar
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
    sse,
)
from tests.support.provider_calls import cli_turn

SIG = "EqQBCkYIBxgCIkB3mZ2a0cT1p0lXvYg8rW+QZ0s1mN4k6Jt7uY2h3Q9xZ8c1V5b0n2m4L6k8J0h2G4f6D8s0=="


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-{key}"


# -- OpenAI wire format --------------------------------------------------------------------


def oa_chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def oa_usage() -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def oa_tool_step(text: str, call_id: str, key: str) -> bytes:
    args = json.dumps({"key": key})
    return sse(
        oa_chunk({"role": "assistant", "content": text}),
        oa_chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "lookup", "arguments": ""},
                    }
                ]
            }
        ),
        oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[:5]}}]}),
        oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[5:]}}]}),
        oa_chunk({}, "tool_calls"),
        oa_usage(),
    )


def oa_answer(text: str) -> bytes:
    return sse(oa_chunk({"role": "assistant", "content": text}), oa_chunk({}, "stop"), oa_usage())


async def test_openai_three_step_turn_restores_each_step_exactly():
    replies = [
        Reply(body=oa_tool_step("first", "call_A", "a"), write_size=11),
        Reply(body=oa_tool_step("second", "call_B", "b")),
        Reply(body=oa_answer("done")),
    ]
    async with loopback_server(*replies) as server:
        agent = Agent(
            provider=OpenAIProvider("m", base_url=server.url + "/v1", api_key="test"),
            instructions="Be brief.",
            tools=[lookup],
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            async with session.stream("go") as out:
                chunks = [c async for c in out]
    check_grammar(chunks)
    assert out.result.text == "firstseconddone" and out.result.steps == 3
    assert out.result.usage.total_tokens == 45
    second, third = server.requests[1].json(), server.requests[2].json()
    step0 = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "first",
            "tool_calls": [
                {
                    "id": "call_A",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"key": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_A", "content": "value-a"},
    ]
    assert second["messages"] == step0
    assert third["messages"] == [
        *step0,
        {
            "role": "assistant",
            "content": "second",
            "tool_calls": [
                {
                    "id": "call_B",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"key": "b"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_B", "content": "value-b"},
    ]
    assert second["stream_options"] == {"include_usage": True}
    assert [t["function"]["name"] for t in second["tools"]] == ["lookup"]


# -- Anthropic wire format -------------------------------------------------------------------


def an_thinking(index: int, text: str, signature: str) -> list[dict]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "thinking_delta", "thinking": text},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "signature_delta", "signature": signature},
        },
        {"type": "content_block_stop", "index": index},
    ]


def an_text(index: int, text: str) -> list[dict]:
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "text", "text": ""},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        },
        {"type": "content_block_stop", "index": index},
    ]


def an_tool(index: int, call_id: str, key: str) -> list[dict]:
    raw = json.dumps({"key": key})
    return [
        {
            "type": "content_block_start",
            "index": index,
            "content_block": {"type": "tool_use", "id": call_id, "name": "lookup", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": raw[:4]},
        },
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "input_json_delta", "partial_json": raw[4:]},
        },
        {"type": "content_block_stop", "index": index},
    ]


async def test_anthropic_three_step_turn_restores_signed_thinking_and_results_exactly():
    step1 = anthropic_sse(
        anthropic_start(),
        *an_thinking(0, "plan A", SIG + "1"),
        *an_tool(1, "toolu_A", "a"),
        *anthropic_end("tool_use"),
    )
    step2 = anthropic_sse(
        anthropic_start(),
        *an_thinking(0, "plan B", SIG + "2"),
        *an_text(1, "now B"),
        *an_tool(2, "toolu_B", "b"),
        *anthropic_end("tool_use"),
    )
    step3 = anthropic_sse(anthropic_start(), *an_text(0, "all done"), *anthropic_end("end_turn"))
    async with loopback_server(
        Reply(body=step1, write_size=13), Reply(body=step2), Reply(body=step3)
    ) as server:
        provider = AnthropicProvider(
            "claude-sonnet-4-5",
            base_url=server.url,
            api_key="test",
            thinking_budget=1024,
            max_tokens=2048,
        )
        agent = Agent(provider=provider, instructions="Be brief.", tools=[lookup])
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            async with session.stream("go") as out:
                chunks = [c async for c in out]
            # a second turn on the same session replays the whole first turn
            server.add(
                Reply(
                    body=anthropic_sse(
                        anthropic_start(), *an_text(0, "again"), *anthropic_end("end_turn")
                    )
                )
            )
            await session.run("more")
    check_grammar(chunks)
    assert [c.type for c in chunks].count("reasoning-start") == 2
    second, third, fourth = (r.json() for r in server.requests[1:4])
    assert second["system"] == "Be brief."
    assert second["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    step0_msgs = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan A", "signature": SIG + "1"},
                {"type": "tool_use", "id": "toolu_A", "name": "lookup", "input": {"key": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_A", "content": "value-a"}],
        },
    ]
    assert second["messages"] == step0_msgs
    step1_msgs = [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan B", "signature": SIG + "2"},
                {"type": "text", "text": "now B"},
                {"type": "tool_use", "id": "toolu_B", "name": "lookup", "input": {"key": "b"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_B", "content": "value-b"}],
        },
    ]
    assert third["messages"] == [*step0_msgs, *step1_msgs]
    assert fourth["messages"] == [
        *step0_msgs,
        *step1_msgs,
        {"role": "assistant", "content": [{"type": "text", "text": "all done"}]},
        {"role": "user", "content": "more"},
    ]


async def test_cli_runs_a_turn_against_an_openai_compatible_server():
    chunks, requests = await cli_turn(
        Reply(body=oa_answer("hello from the server")),
        lambda url: ["--provider", "openai", "--base-url", url + "/v1", "--model", "local-model"],
    )
    check_grammar(chunks)
    assert (
        "".join(c["text"] for c in chunks if c["type"] == "text-delta") == "hello from the server"
    )
    assert requests[0].json()["model"] == "local-model"


async def test_cli_runs_a_turn_against_an_anthropic_compatible_server():
    body = anthropic_sse(
        anthropic_start(), *an_text(0, "hello from claude"), *anthropic_end("end_turn")
    )
    chunks, requests = await cli_turn(
        Reply(body=body),
        lambda url: ["--provider", "anthropic", "--base-url", url, "--model", "claude-x"],
    )
    assert "".join(c["text"] for c in chunks if c["type"] == "text-delta") == "hello from claude"
    assert requests[0].json()["model"] == "claude-x"


async def test_open_model_think_tags_split_across_deltas_become_reasoning_parts():
    from runtime import ReasoningPart, TextPart

    body = sse(
        oa_chunk({"role": "assistant", "content": "<thi"}),
        oa_chunk({"content": "nk>weigh options</th"}),
        oa_chunk({"content": "ink>\n\nAnswer: 42"}),
        oa_chunk({}, "stop"),
        oa_usage(),
    )
    async with loopback_server(Reply(body=body)) as server:
        agent = Agent(
            provider=OpenAIProvider("deepseek-r1", base_url=server.url + "/v1", api_key="test")
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            async with session.stream("q") as out:
                types = [c.type async for c in out]
    assert session.messages[1].content == (
        ReasoningPart(text="weigh options", step=0),
        TextPart(text="\n\nAnswer: 42", step=0),
    )
    assert types.index("reasoning-finish") < types.index("text-start")


async def test_shared_groq_recording_with_think_tags_yields_reasoning_then_answer():
    import pytest

    from tests.conftest import SHARED_STREAMS

    path = SHARED_STREAMS / "groq" / "think-tags-in-content.sse"
    if not path.exists():
        pytest.skip("shared fixtures not present")
    async with loopback_server(Reply(body=path.read_bytes(), write_size=97)) as server:
        agent = Agent(provider=OpenAIProvider("m", base_url=server.url + "/v1", api_key="test"))
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            result = await session.run("q")
    parts = session.messages[1].content
    assert parts[0].type == "reasoning" and parts[0].text.strip()
    assert "<think>" not in result.text and "</think>" not in result.text
    assert result.text.strip() and result.usage.total_tokens == 1009


# -- Gemini wire format ----------------------------------------------------------------------

GEMINI_SIG = "EhRnZW1pbmktdGVzdC1zaWduYXR1cmUtMRoE/v8AAQ=="


def gm_chunk(parts: list[dict] | None, finish: str | None = None) -> dict:
    candidate: dict = {"index": 0}
    if parts is not None:
        candidate["content"] = {"role": "model", "parts": parts}
    if finish is not None:
        candidate["finishReason"] = finish
    usage = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
    return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": "gemini-2.5-flash"}


def gm_body(*chunks: dict) -> bytes:
    return "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks).encode()


def gm_tool_step(thought: str, key: str, sig: str) -> bytes:
    call = {"functionCall": {"name": "lookup", "args": {"key": key}}, "thoughtSignature": sig}
    return gm_body(
        gm_chunk([{"text": thought, "thought": True}]),
        gm_chunk([call], "STOP"),
    )


def gm_answer(text: str) -> bytes:
    return gm_body(gm_chunk([{"text": text}]), gm_chunk([{"text": ""}], "STOP"))


async def test_gemini_three_step_turn_restores_thoughts_calls_and_signatures_exactly():
    sig_b = GEMINI_SIG.replace("MS", "Mi")
    replies = [
        Reply(body=gm_tool_step("plan A", "a", GEMINI_SIG), write_size=11),
        Reply(body=gm_tool_step("plan B", "b", sig_b)),
        Reply(body=gm_answer("all done")),
    ]
    async with loopback_server(*replies) as server:
        provider = GeminiProvider("gemini-2.5-flash", base_url=server.url, api_key="test")
        agent = Agent(provider=provider, instructions="Be brief.", tools=[lookup])
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(agent)
            async with session.stream("go") as out:
                chunks = [c async for c in out]
            server.add(Reply(body=gm_answer("again")))
            await session.run("more")
        await provider.aclose()
    check_grammar(chunks)
    assert out.result.text == "all done" and out.result.steps == 3
    assert [c.type for c in chunks].count("reasoning-start") == 2
    second, third, fourth = (r.json() for r in server.requests[1:4])
    assert second["systemInstruction"] == {"parts": [{"text": "Be brief."}], "role": "user"}

    def wire(sig: str) -> str:
        return base64.urlsafe_b64encode(base64.b64decode(sig)).decode()

    def step(thought: str, key: str, sig: str) -> list[dict]:
        return [
            {
                "parts": [
                    {"text": thought, "thought": True},
                    {
                        "functionCall": {"name": "lookup", "args": {"key": key}},
                        "thoughtSignature": wire(sig),
                    },
                ],
                "role": "model",
            },
            {
                "parts": [
                    {
                        "functionResponse": {
                            "name": "lookup",
                            "response": {"output": f"value-{key}"},
                        }
                    }
                ],
                "role": "user",
            },
        ]

    go = {"parts": [{"text": "go"}], "role": "user"}
    assert second["contents"] == [go, *step("plan A", "a", GEMINI_SIG)]
    assert third["contents"] == [go, *step("plan A", "a", GEMINI_SIG), *step("plan B", "b", sig_b)]
    assert fourth["contents"][-2:] == [
        {"parts": [{"text": "all done"}], "role": "model"},
        {"parts": [{"text": "more"}], "role": "user"},
    ]
    assert [d["name"] for d in second["tools"][0]["functionDeclarations"]] == ["lookup"]


async def test_an_agent_named_by_a_model_string_runs_on_that_provider(monkeypatch):
    async with loopback_server(Reply(body=gm_answer("hello from gemini"))) as server:
        monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", server.url)
        monkeypatch.setenv("GEMINI_API_KEY", "test")
        monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(model="google:gemini-2.5-pro"))
            result = await session.run("Hi")
    assert result.text == "hello from gemini"
    assert server.requests[0].path == "/v1/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
    assert server.requests[0].headers["x-goog-api-key"] == "test"


async def test_cli_runs_a_turn_on_gemini_named_by_its_model_string():
    chunks, requests = await cli_turn(
        Reply(body=gm_answer("hello from the cli")),
        lambda url: ["--model", "google:gemini-2.5-flash-lite", "--base-url", url],
    )
    check_grammar(chunks)
    assert "".join(c["text"] for c in chunks if c["type"] == "text-delta") == "hello from the cli"
    assert "gemini-2.5-flash-lite:streamGenerateContent" in requests[0].path


# -- Claude on Vertex and Bedrock ------------------------------------------------------------


async def test_vertex_two_step_turn_replays_its_signed_thinking_to_itself():
    step1 = anthropic_sse(
        anthropic_start(),
        *an_thinking(0, "plan A", SIG + "1"),
        *an_tool(1, "toolu_A", "a"),
        *anthropic_end("tool_use"),
    )
    step2 = anthropic_sse(anthropic_start(), *an_text(0, "done"), *anthropic_end("end_turn"))
    async with loopback_server(Reply(body=step1), Reply(body=step2)) as server:
        provider = AnthropicVertexProvider(
            "claude-sonnet-4-5@20250929",
            base_url=server.url,
            region="us-east5",
            project_id="p",
            access_token="test",
            thinking_budget=1024,
            max_tokens=2048,
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider, tools=[lookup]))
            result = await session.run("go")
        await provider.aclose()
    assert result.text == "done" and result.steps == 2
    assistant = server.requests[1].json()["messages"][1]
    assert assistant["content"][0] == {
        "type": "thinking",
        "thinking": "plan A",
        "signature": SIG + "1",
    }


async def test_bedrock_two_step_turn_through_the_host():
    from tests.support.eventstream import bedrock_stream

    step1 = bedrock_stream(
        anthropic_start(),
        *an_thinking(0, "plan A", SIG + "1"),
        *an_tool(1, "toolu_A", "a"),
        *anthropic_end("tool_use"),
    )
    step2 = bedrock_stream(anthropic_start(), *an_text(0, "done"), *anthropic_end("end_turn"))
    kind = "application/vnd.amazon.eventstream"
    async with loopback_server(
        Reply(body=step1, content_type=kind, write_size=17), Reply(body=step2, content_type=kind)
    ) as server:
        provider = AnthropicBedrockProvider(
            "anthropic.claude-sonnet-4-5-20250929-v1:0",
            base_url=server.url,
            region="us-east-1",
            api_key="test",
            thinking_budget=1024,
            max_tokens=2048,
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider, tools=[lookup]))
            async with session.stream("go") as out:
                chunks = [c async for c in out]
        await provider.aclose()
    check_grammar(chunks)
    assert out.result.text == "done" and out.result.steps == 2
    sent = server.requests[1].json()["messages"]
    assert sent[1]["content"][0]["signature"] == SIG + "1"
    assert sent[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "toolu_A", "content": "value-a"}
    ]
