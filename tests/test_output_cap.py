"""The turn's output budget is every call's own cap (``Budget.max_output_tokens``).

The budget was only checked once a call's usage came back: a turn allowed 200 output
tokens still asked for, and was billed, a 4,000-token answer. Each call now carries what
the turn has left as its API's max-tokens field (Chat Completions ``max_tokens`` on a
compatible server, ``max_completion_tokens`` on OpenAI's own; Responses
``max_output_tokens``; Anthropic ``max_tokens``; Gemini ``maxOutputTokens``), a smaller
cap of the agent's settings or the provider's options winning. The turns run through the
``Host`` against recorded streams from the loopback server, read by the real SDK clients;
the request bodies are the server's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.providers import (
    AnthropicProvider,
    GeminiProvider,
    OpenAIProvider,
    OpenAIResponsesProvider,
)
from actors.providers.openai import _cap_field_for
from runtime import Agent, Budget, Host, tool
from runtime.messages import AssistantMessage, ToolMessage
from tests.support.loopback import Reply, loopback_server, sse

RECORDINGS = Path(__file__).resolve().parent / "recordings"
KEY = "sk-test-not-a-real-key-4243"


@tool
async def get_weather(city: str = "") -> str:
    """The weather of a city."""
    return f"sunny in {city}"


def make(provider: str, url: str, **options: Any) -> Any:
    if provider == "openai":
        return OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=KEY, **options)
    if provider == "openai-responses":
        return OpenAIResponsesProvider("gpt-5-mini", base_url=url + "/v1", api_key=KEY, **options)
    if provider == "anthropic":
        return AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key=KEY, **options)
    return GeminiProvider("gemini-2.5-flash", base_url=url, api_key=KEY, **options)


STEPS = {  # a step with a call, then the answer; the first step's output tokens
    "openai": (("openai/tool-call-fragments.sse", "openai/text-plain.sse"), 18),
    "openai-responses": (
        ("openai-responses/reasoning-function-call.sse", "openai-responses/text.sse"),
        64,
    ),
    "anthropic": (("anthropic/tool-use-split-input.sse", "anthropic/text.sse"), 57),
    "google": (("google/function-call-signed.sse", "google/text.sse"), 59),
}


def cap_of(provider: str, body: dict[str, Any]) -> Any:
    """The output cap a request body carries, in the provider's own field."""
    if provider == "openai":
        return body.get("max_tokens")  # a compatible server's (the loopback's) field
    if provider == "openai-responses":
        return body.get("max_output_tokens")
    if provider == "anthropic":
        return body["max_tokens"]
    return body.get("generationConfig", {}).get("maxOutputTokens")


async def turn(
    provider: str,
    replies: list[Reply],
    budget: Budget,
    settings: dict[str, Any] | None = None,
    **options: Any,
) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """The turn's result, its stored messages, and the request bodies the server got."""
    async with loopback_server(*replies) as server:
        async with Host.open(log_tap=False) as host:
            agent = Agent(
                provider=make(provider, server.url, **options),
                tools=[get_weather],
                budget=budget,
                settings=settings or {},
            )
            session = await host.open_session(agent, session_id="s")
            result = await session.run("What is the weather in Paris?")
            stored = (await host.store.load("s")).messages
        return result, list(stored), [r.json() for r in server.requests]


def recorded(provider: str) -> list[Reply]:
    return [Reply(body=(RECORDINGS / name).read_bytes()) for name in STEPS[provider][0]]


@pytest.mark.parametrize("provider", sorted(STEPS))
async def test_each_call_carries_the_output_tokens_the_turn_has_left(provider):
    """The first call may write the whole budget, the second what the first left."""
    result, _, bodies = await turn(provider, recorded(provider), Budget(max_output_tokens=1000))
    assert result.error is None, result.error
    assert result.finish_reason == "stop"
    first_output = STEPS[provider][1]
    assert [cap_of(provider, b) for b in bodies] == [1000, 1000 - first_output]


@pytest.mark.parametrize(
    ("provider", "settings", "options", "sent"),
    [
        ("openai", {"max_tokens": 50}, {}, [50, 50]),  # the settings' cap, smaller: stays
        ("openai", {"max_tokens": 5000}, {}, [1000, 982]),  # larger: what is left wins
        ("openai", {}, {"max_tokens": 30}, [30, 30]),  # the provider's own option
        ("openai-responses", {"max_output_tokens": 990}, {}, [990, 936]),  # then it is less
        ("anthropic", {}, {}, [1000, 943]),  # below the provider's max_tokens (4096)
        ("anthropic", {}, {"max_tokens": 900}, [900, 900]),
        ("anthropic", {"max_tokens": 100}, {"max_tokens": 900}, [100, 100]),  # settings win
        ("google", {"max_output_tokens": 20}, {}, [20, 20]),
    ],
)
async def test_the_smaller_of_an_explicit_cap_and_what_is_left_is_sent(
    provider, settings, options, sent
):
    result, _, bodies = await turn(
        provider, recorded(provider), Budget(max_output_tokens=1000), settings, **options
    )
    assert result.error is None, result.error
    assert [cap_of(provider, b) for b in bodies] == sent


async def test_settings_naming_max_completion_tokens_cap_that_field():
    """A server that reads only the newer name (or OpenAI's own API, given another
    base URL) is named it in the settings: the budget caps that field, no other."""
    result, _, bodies = await turn(
        "openai", recorded("openai"), Budget(max_output_tokens=1000), {"max_completion_tokens": 1}
    )
    assert result.error is None, result.error
    assert [b.get("max_completion_tokens") for b in bodies] == [1, 1]
    assert all("max_tokens" not in b for b in bodies)


def test_openais_own_api_is_sent_max_completion_tokens_any_other_server_max_tokens():
    """OpenAI's reasoning models refuse ``max_tokens``; Mistral refuses the newer name
    (422), Ollama and LM Studio ignore it."""
    assert _cap_field_for(None) == "max_completion_tokens"
    assert _cap_field_for("https://api.openai.com/v1") == "max_completion_tokens"
    assert _cap_field_for("https://x.openai.azure.com/openai/v1") == "max_completion_tokens"
    assert _cap_field_for("https://api.mistral.ai/v1") == "max_tokens"
    assert _cap_field_for("http://localhost:11434/v1") == "max_tokens"


@pytest.mark.parametrize("provider", ["openai", "openai-responses", "google"])
async def test_a_turn_without_an_output_budget_sends_no_cap(provider):
    result, _, bodies = await turn(provider, recorded(provider), Budget())
    assert result.error is None, result.error
    assert [cap_of(provider, b) for b in bodies] == [None, None]


def _chat_cut(texts: list[str], completion_tokens: int) -> bytes:
    """A Chat Completions stream of ``texts`` cut at its cap (finish ``length``)."""
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events: list[Any] = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": t}}]}
        for t in texts
    ]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    usage = {"prompt_tokens": 10, "completion_tokens": completion_tokens}
    events.append(
        {**base, "choices": [], "usage": {**usage, "total_tokens": 10 + completion_tokens}}
    )
    return sse(*events)


async def test_a_call_cut_at_what_the_budget_left_ends_the_turn_budget_with_its_text_saved():
    """The user sees the cut text, its step finish ``length`` (the model's own), and the
    turn's finish ``budget`` (``max_output_tokens``), as when a call's usage went over;
    the text is stored as the turn's answer. The turn ended ``length`` before: a
    budget-cut answer looked like a model's own long one."""
    cut = Reply(body=_chat_cut(["Once upon", " a time"], 200))
    async with loopback_server(cut) as server:
        async with Host.open(log_tap=False) as host:
            agent = Agent(provider=make("openai", server.url), budget=Budget(max_output_tokens=200))
            session = await host.open_session(agent, session_id="s")
            async with session.stream("Tell me a story.") as out:
                chunks = [c async for c in out]
            stored = (await host.store.load("s")).messages
        bodies = [r.json() for r in server.requests]
    assert [cap_of("openai", b) for b in bodies] == [200]
    assert "".join(c.text for c in chunks if c.type == "text-delta") == "Once upon a time"
    step_end = [c for c in chunks if c.type == "step-finish"]
    assert [c.finish_reason for c in step_end] == ["length"]
    end = chunks[-1]
    assert (end.type, end.finish_reason, end.budget) == ("finish", "budget", "max_output_tokens")
    assert (out.result.finish_reason, out.result.budget) == ("budget", "max_output_tokens")
    answer = stored[-1]
    assert isinstance(answer, AssistantMessage)
    assert [p.text for p in answer.content if p.type == "text"] == ["Once upon a time"]


async def test_a_call_cut_below_the_budget_by_a_smaller_cap_ends_the_turn_length():
    """A cap of the settings' own cut it, with budget left: the model's ``length``."""
    cut = Reply(body=_chat_cut(["Once upon"], 50))
    result, _, bodies = await turn(
        "openai", [cut], Budget(max_output_tokens=200), {"max_tokens": 50}
    )
    assert [cap_of("openai", b) for b in bodies] == [50]
    assert (result.finish_reason, result.budget) == ("length", None)


async def test_a_step_that_spends_the_budget_exactly_runs_no_call_that_could_write_nothing():
    """Its tool calls are refused (no model call could read their results: no API takes
    a cap of 0) and the turn ends ``budget``; one request only."""
    result, stored, bodies = await turn("openai", recorded("openai"), Budget(max_output_tokens=18))
    assert len(bodies) == 1
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    results = [m for m in stored if isinstance(m, ToolMessage)]
    assert [m.error for m in results] == [
        "the tool call was not executed: budget max_output_tokens exceeded"
    ]


async def test_a_turn_with_no_output_tokens_left_makes_no_call():
    """A call capped at 0 is refused by every API (Anthropic's ``max_tokens`` is at least
    1): the turn ends ``budget`` before it, whatever left nothing (here the budget itself;
    a sub-agent's tokens, a taken-over turn's committed steps)."""
    result, _, bodies = await turn("openai", recorded("openai"), Budget(max_output_tokens=0))
    assert bodies == []
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
