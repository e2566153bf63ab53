"""A session saved from each provider, continued on each of the others.

The first turn runs on the source provider through the ``Host`` against its recorded
streams (loopback server, the real SDK client): signed reasoning (Anthropic's thinking,
Responses' encrypted reasoning, Gemini's thought signatures, Chat Completions'
``reasoning_content``), a call, then parallel calls (one with empty arguments), a tool
that fails and one whose output is ``""``, and the answer. The session, saved in the
store as the runtime saved it, is then continued on the target provider: its request body,
as the target's server received it, must be valid for the target's API (the structural
rules of :mod:`tests.support.wire_rules`), answer every call of the source turn with its
own output, and carry nothing only the source may read (signatures, encrypted items).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from actors.providers import (
    AnthropicProvider,
    GeminiProvider,
    OpenAIProvider,
    OpenAIResponsesProvider,
)
from actors.stores import MemoryStore
from runtime import Agent, Host, tool
from runtime.messages import (
    AssistantMessage,
    Image,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.retry import RetryPolicy
from tests.support import wire_rules
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
)

RECORDINGS = Path(__file__).resolve().parent / "recordings"
KEY = "sk-test-not-a-real-key-4243"


@tool
async def get_weather(city: str = "") -> str:
    """The weather of a city."""
    if city == "Atlantis":
        raise RuntimeError("no such city")
    return f"sunny in {city}"


@tool
async def get_time(tz: str = "", city: str = "") -> str:
    """The time somewhere (this one answers nothing)."""
    return ""


def make(provider: str, url: str) -> Any:
    if provider == "anthropic-interleaved":  # a budget above max_tokens: the beta allows it
        return AnthropicProvider(
            "claude-sonnet-4-5",
            base_url=url,
            api_key=KEY,
            thinking_budget=4096,
            max_tokens=2048,
            interleaved_thinking=True,
        )
    if provider == "anthropic-thinking":
        return AnthropicProvider(
            "claude-sonnet-4-5", base_url=url, api_key=KEY, thinking_budget=1024, max_tokens=2048
        )
    if provider == "gemini-3":  # checks the current turn's calls carry a signature
        return GeminiProvider("gemini-3-pro-preview", base_url=url, api_key=KEY)
    if provider == "mistral":  # a compatible server that takes nine-character ids
        return OpenAIProvider(
            "mistral-small", base_url=url + "/v1", api_key=KEY, call_ids="mistral"
        )
    if provider == "openai":
        return OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=KEY)
    if provider == "openai-responses":
        return OpenAIResponsesProvider("gpt-5-mini", base_url=url + "/v1", api_key=KEY)
    if provider == "anthropic":
        return AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key=KEY)
    return GeminiProvider("gemini-2.5-flash", base_url=url, api_key=KEY)


FOLDER = {
    "openai-responses": "openai-responses",
    "google": "google",
    "mistral": "openai",
    "anthropic-thinking": "anthropic",
    "gemini-3": "google",
}
# the source turn: a first step with a call (and reasoning where the provider signs it), a
# step of parallel calls, the answer
SOURCE_STEPS = {
    "openai": ["tool-call-fragments.sse", "parallel-tool-calls.sse", "text-plain.sse"],
    "openai-responses": ["reasoning-function-call.sse", "parallel-function-calls.sse", "text.sse"],
    "anthropic": ["interleaved-thinking.sse", "tool-use-several.sse", "redacted-thinking.sse"],
    "google": ["function-call-signed.sse", "parallel-function-calls.sse", "text.sse"],
}
ANSWER = {
    "anthropic-thinking": "text.sse",
    "gemini-3": "text.sse",
    "mistral": "text-plain.sse",
    "openai": "text-plain.sse",
    "openai-responses": "text.sse",
    "anthropic": "text.sse",
    "google": "text.sse",
}
HISTORY = {
    "anthropic-thinking": "messages",
    "gemini-3": "contents",
    "mistral": "messages",
    "openai": "messages",
    "openai-responses": "input",
    "anthropic": "messages",
    "google": "contents",
}
"""The key of a request body that holds the history."""
PROVIDERS = sorted(SOURCE_STEPS)
PAIRS = [(s, t) for s in PROVIDERS for t in [*PROVIDERS, "mistral"] if s != t]


def recording(provider: str, name: str) -> Reply:
    return Reply(body=(RECORDINGS / FOLDER.get(provider, provider) / name).read_bytes())


def _snake(value: Any) -> Any:
    """A Gemini body's camelCase keys as the wire rules name them."""
    if isinstance(value, dict):
        return {re.sub(r"(?<!^)([A-Z])", r"_\1", k).lower(): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


def sent(provider: str, body: dict[str, Any]) -> tuple[list[str], list[str], list[Any]]:
    """The wire-rule errors of a request body, the call ids it answers (in order), and
    the outputs it sends."""
    if provider in ("anthropic", "anthropic-thinking"):
        messages = body["messages"]
        results = [
            b
            for m in messages
            if isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "tool_result"
        ]
        thinking = body.get("thinking", {}).get("type") == "enabled"
        errs = wire_rules.anthropic_errors(messages, thinking=thinking)
        return errs, [r["tool_use_id"] for r in results], [r["content"] for r in results]
    if provider in ("openai", "mistral"):
        messages = body["messages"]
        results = [m for m in messages if m["role"] == "tool"]
        errs = wire_rules.chat_errors(messages)
        return errs, [r["tool_call_id"] for r in results], [r["content"] for r in results]
    if provider == "openai-responses":
        items = body["input"]
        results = [i for i in items if i.get("type") == "function_call_output"]
        errs = wire_rules.responses_errors(items)
        return errs, [r["call_id"] for r in results], [r["output"] for r in results]
    contents = _snake(body["contents"])
    responses = [
        p["function_response"] for c in contents for p in c["parts"] if "function_response" in p
    ]
    errs = wire_rules.gemini_errors(contents)
    return errs, [r.get("id") for r in responses], [r["response"] for r in responses]


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24

EXTRA_TURN = (
    UserMessage(content=(TextPart(text="and this picture?", step=0), Image(data=PNG))),
    AssistantMessage(
        content=(
            ToolCallPart(tool_call_id="call_x1", tool_name="delete_file", input={}, step=0),
            ToolCallPart(tool_call_id="toolu_x2", tool_name="pick_color", input="", step=0),
            ToolCallPart(
                tool_call_id="x3", tool_name="get_weather", input={"city": "Oslo"}, step=0
            ),
            TextPart(text="Here it is.", step=1),
        )
    ),
    ToolMessage(
        tool_call_id="call_x1",
        tool_name="delete_file",
        error="the tool call was denied: no",
        step=0,
    ),
    ToolMessage(tool_call_id="toolu_x2", tool_name="pick_color", error="", step=0),  # a client's
    ToolMessage(
        tool_call_id="x3",
        tool_name="get_weather",
        output=(TextPart(text="sunny in Oslo", step=0), Image(data=PNG)),
        step=0,
    ),
)
"""A turn saved as the runtime saves one: a user image, a denied approval, a client tool's
error with no message, a call whose input did not parse (``""``), a tool that returned an
image."""


async def continued(source: str, target: str, *extra: Any) -> tuple[Any, Any, list[Any]]:
    """The source turn's result, the target turn's result, and every request received;
    ``extra`` messages are saved after the source turn, before the target's."""
    replies = [recording(source, name) for name in SOURCE_STEPS[source]]
    store = MemoryStore()
    async with loopback_server(*replies, recording(target, ANSWER[target])) as server:
        async with Host.open(store=store, log_tap=False) as host:
            results = []
            for provider in (source, target):
                if provider == target and extra:
                    saved = await store.load("s1")
                    assert saved is not None
                    await store.save("s1", len(saved.messages), extra)
                agent = Agent(provider=make(provider, server.url), tools=[get_weather, get_time])
                session = await host.open_session(agent, session_id="s1")
                results.append(await session.run("What is the weather and the time?"))
                await host.close_session(session)
        return results[0], results[1], list(server.requests)


SIGNED = {
    "anthropic": {"signed reasoning", "redacted reasoning"},
    "openai-responses": {"signed reasoning"},
    "google": {"thought signature"},
    "openai": set(),
}


def signed_kinds(message: Any) -> set[str]:
    kinds = set()
    for part in message.content:
        if part.type == "reasoning" and part.signature:
            kinds.add("signed reasoning")
        if part.type == "reasoning" and part.redacted_data:
            kinds.add("redacted reasoning")
        if part.type == "provider-data" and "thought_signature" in part.data:
            kinds.add("thought signature")
    return kinds


@pytest.mark.parametrize(("source", "target"), PAIRS)
async def test_a_session_saved_on_one_provider_continues_on_another(source, target):
    first, second, requests = await continued(source, target)
    assert first.error is None, first.error
    assert second.error is None, second.error
    assert len(requests) == len(SOURCE_STEPS[source]) + 1
    assert signed_kinds(first.message) == SIGNED[source]
    calls = [p for p in first.message.content if p.type == "tool-call"]
    assert len(calls) >= 3  # a call, then parallel ones
    errs, answered, outputs = sent(target, requests[-1].json())
    assert errs == []
    assert len(answered) == len(calls) == len(set(answered))  # each call, once
    if target == "mistral":
        assert all(re.fullmatch("[a-zA-Z0-9]{9}", i) for i in answered)
    assert any("sunny" in str(o) for o in outputs)  # the tools' outputs went along


@pytest.mark.parametrize(("source", "target"), PAIRS)
async def test_nothing_only_the_source_may_read_reaches_another_provider(source, target):
    _first, _second, requests = await continued(source, target)
    body = requests[-1].json()
    history = json.dumps(body[HISTORY[target]])
    for secret in ("signature", "encrypted_content", "thoughtSignature", "redacted_thinking"):
        assert secret not in history, secret


@pytest.mark.parametrize(("source", "target"), PAIRS)
async def test_denials_client_errors_and_media_saved_after_a_session_go_to_another_provider(
    source, target
):
    first, second, requests = await continued(source, target, *EXTRA_TURN)
    assert second.error is None, second.error
    calls = [p for p in first.message.content if p.type == "tool-call"]
    errs, answered, outputs = sent(target, requests[-1].json())
    assert errs == []
    assert len(answered) == len(calls) + 3 == len(set(answered))
    if target == "mistral":
        assert all(re.fullmatch("[a-zA-Z0-9]{9}", i) for i in answered)
    shown = json.dumps(outputs)
    assert "the tool call was denied: no" in shown
    assert "sunny in Oslo" in shown


def unavailable(provider: str) -> Reply:
    """A 503 in the provider's own error format (every SDK reads the status)."""
    body = {"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}
    if provider == "anthropic":
        body = {"type": "error", "error": {"type": "api_error", "message": "overloaded"}}
    return Reply(status=503, body=json.dumps(body).encode(), content_type="application/json")


MID_TURN = [
    (s, t)
    for s in PROVIDERS
    for t in [*PROVIDERS, "anthropic-thinking", "gemini-3"]
    # (Claude to Claude with thinking on is one model, not a move)
    if s != t and (s, t) != ("anthropic", "anthropic-thinking")
]


@pytest.mark.parametrize(("source", "target"), MID_TURN)
async def test_a_tool_loop_begun_on_one_provider_is_finished_by_another_in_the_same_turn(
    source, target
):
    # the source makes the first step's calls, then is down: the fallback continues the loop
    first_step = recording(source, SOURCE_STEPS[source][0])
    replies = [first_step, unavailable(source), recording(target, ANSWER[target])]
    async with loopback_server(*replies) as server:
        async with Host.open(store=MemoryStore(), log_tap=False) as host:
            agent = Agent(
                provider=[make(source, server.url), make(target, server.url)],
                tools=[get_weather, get_time],
                retry=RetryPolicy(max_attempts=1),
            )
            session = await host.open_session(agent, session_id="s1")
            result = await session.run("What is the weather?")
        requests = list(server.requests)
    assert result.error is None, result.error
    assert len(requests) == 3
    calls = [p for p in result.message.content if p.type == "tool-call"]
    errs, answered, _outputs = sent(target, requests[-1].json())
    assert errs == []
    assert len(answered) == len(calls) == len(set(answered)) >= 1
    body = requests[-1].json()
    history = json.dumps(body[HISTORY[target]])
    if target == "gemini-3":  # the turn's calls carry the documented sentinel instead
        sentinel = '"thoughtSignature": "skip_thought_signature_validator"'
        assert sentinel in history
        history = history.replace(sentinel, "")
    for secret in ("signature", "encrypted_content", "thoughtSignature", "redacted_thinking"):
        assert secret not in history, secret


# -- Claude with and without thinking in one tool loop ----------------------------------------


def claude_api(*replies: Reply) -> Any:
    """A loopback ``respond`` that answers as the Messages API does: a 400 with the API's
    own text when the body breaks a wire rule (thinking on or off as the body says),
    else the next of ``replies``."""
    queue = list(replies)

    def respond(request: Any) -> Reply:
        errs = wire_rules.anthropic_params_errors(request.json(), request.headers)
        if errs:
            error = {"type": "invalid_request_error", "message": errs[0]}
            payload = json.dumps({"type": "error", "error": error}).encode()
            return Reply(status=400, body=payload, content_type="application/json")
        return queue.pop(0)

    return respond


async def tool_loop(
    providers: list[Any], replies: list[Reply], **agent: Any
) -> tuple[Any, list[Any]]:
    async with loopback_server(respond=claude_api(*replies)) as server:
        async with Host.open(store=MemoryStore(), log_tap=False) as host:
            agent = Agent(
                provider=[make(p, server.url) for p in providers],
                tools=[get_weather, get_time],
                retry=RetryPolicy(max_attempts=1),
                **agent,
            )
            session = await host.open_session(agent, session_id="s1")
            result = await session.run("What is the weather?")
        return result, list(server.requests)


async def test_thinking_stays_on_through_a_tool_loop_whose_later_steps_did_not_think():
    # Claude thinks once a turn without interleaved thinking: step two has none of its own
    steps = ["interleaved-thinking.sse", "tool-use-several.sse", "text.sse"]
    result, requests = await tool_loop(
        ["anthropic-thinking"], [recording("anthropic", s) for s in steps]
    )
    assert result.error is None, result.error
    assert [r.json().get("thinking", {}).get("type") for r in requests] == ["enabled"] * 3


async def test_claude_without_thinking_finishes_a_loop_begun_with_thinking_without_it():
    replies = [recording("anthropic", "interleaved-thinking.sse"), unavailable("anthropic")]
    result, requests = await tool_loop(
        ["anthropic-thinking", "anthropic"], [*replies, recording("anthropic", "text.sse")]
    )
    assert result.error is None, result.error
    last = requests[-1].json()
    assert "thinking" not in last
    assert '"thinking"' not in json.dumps(last["messages"])  # the loop's, left out
    assert any(p.type == "reasoning" for p in result.message.content)  # and still saved


async def test_claude_with_thinking_finishes_a_loop_begun_without_it_without_thinking():
    replies = [recording("anthropic", "tool-use-several.sse"), unavailable("anthropic")]
    result, requests = await tool_loop(
        ["anthropic", "anthropic-thinking"], [*replies, recording("anthropic", "text.sse")]
    )
    assert result.error is None, result.error
    assert "thinking" not in requests[-1].json()


async def test_thinking_after_text_in_one_step_is_sent_back_as_it_came():
    # interleaved thinking: thinking, text, thinking, tool_use in one message
    steps = ["interleaved-thinking.sse", "text.sse"]
    result, requests = await tool_loop(
        ["anthropic-thinking"], [recording("anthropic", s) for s in steps]
    )
    assert result.error is None, result.error
    step = requests[-1].json()["messages"][1]["content"]
    assert [b["type"] for b in step] == ["thinking", "text", "thinking", "tool_use"]


SAMPLING = {"temperature": 0.2, "top_k": 5, "top_p": 0.5, "tool_choice": {"type": "any"}}


async def test_sampling_options_refused_with_thinking_go_only_with_calls_that_do_not_think():
    replies = [recording("anthropic", "tool-use-several.sse"), unavailable("anthropic")]
    result, requests = await tool_loop(
        ["anthropic", "anthropic-thinking"],
        [*replies, recording("anthropic", "text.sse")],
        settings=SAMPLING,
    )
    assert result.error is None, result.error
    # the loop was begun without thinking: the fallback's call does not think, and takes them
    assert {k: requests[-1].json().get(k) for k in SAMPLING} == SAMPLING


async def test_a_thinking_call_leaves_out_the_sampling_options_the_api_refuses_with_it():
    result, requests = await tool_loop(
        ["anthropic-thinking"], [recording("anthropic", "text.sse")], settings=SAMPLING
    )
    assert result.error is None, result.error
    body = requests[0].json()
    assert body["thinking"]["type"] == "enabled"
    assert not set(SAMPLING) & set(body)


@pytest.mark.parametrize(("max_tokens", "budget"), [(1500, 1024), (1024, None)])
async def test_an_agents_max_tokens_below_the_budget_lowers_it_or_turns_thinking_off(
    max_tokens, budget
):
    result, requests = await tool_loop(
        ["anthropic-thinking"],
        [recording("anthropic", "text.sse")],
        settings={"max_tokens": max_tokens},
    )
    assert result.error is None, result.error
    body = requests[0].json()
    assert body["max_tokens"] == max_tokens
    assert body.get("thinking", {}).get("budget_tokens") == budget


def thinking_then_call(call_id: str) -> Reply:
    """A step of interleaved thinking after a tool result: signed thinking, one call."""
    blocks = [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "tool_use", "id": call_id, "name": "get_time", "input": {}},
    ]
    deltas = [
        [
            {"type": "thinking_delta", "thinking": "Oslo is sunny; now the time."},
            {"type": "signature_delta", "signature": "c2lnbmVkLXN0ZXAtdHdv"},
        ],
        [{"type": "input_json_delta", "partial_json": '{"city": "Oslo"}'}],
    ]
    events: list[dict[str, Any]] = [anthropic_start("claude-sonnet-4-5")]
    for i, (block, ds) in enumerate(zip(blocks, deltas, strict=True)):
        events.append({"type": "content_block_start", "index": i, "content_block": block})
        events += [{"type": "content_block_delta", "index": i, "delta": d} for d in ds]
        events.append({"type": "content_block_stop", "index": i})
    return Reply(body=anthropic_sse(*events, *anthropic_end("tool_use")))


async def test_interleaved_thinking_asks_for_the_beta_and_thinks_on_every_step_of_a_loop():
    steps = [
        recording("anthropic", "interleaved-thinking.sse"),
        thinking_then_call("toolu_01StepTwo"),
        recording("anthropic", "text.sse"),
    ]
    result, requests = await tool_loop(["anthropic-interleaved"], steps)
    assert result.error is None, result.error
    assert [r.headers.get("anthropic-beta") for r in requests] == [
        "interleaved-thinking-2025-05-14"
    ] * 3
    bodies = [r.json() for r in requests]
    assert [b["thinking"] for b in bodies] == [{"type": "enabled", "budget_tokens": 4096}] * 3
    assert all(b["max_tokens"] == 2048 for b in bodies)
    step_two = bodies[-1]["messages"][3]["content"]  # its own thinking goes back with it
    assert [b["type"] for b in step_two] == ["thinking", "tool_use"]


async def test_without_interleaved_thinking_no_beta_is_asked_for():
    steps = ["interleaved-thinking.sse", "text.sse"]
    result, requests = await tool_loop(
        ["anthropic-thinking"], [recording("anthropic", s) for s in steps]
    )
    assert result.error is None, result.error
    assert [r.headers.get("anthropic-beta") for r in requests] == [None, None]
