"""The turn runner judges a ``length`` cut by the cap the provider actually sent.

A call's request carries the smaller of the budget's cap and the provider's own: the
agent's ``settings``, the provider's options, or its API's default (Anthropic's
``max_tokens``, 4096 unless the provider is given another). The runner saw only the
budget's cap and the settings', so a call cut by Anthropic's default (or an option of
the provider's) within a quarter of a larger budget's cap read ``budget``: the turn
said its allowance ran out while more than a thousand tokens of it were left. The
provider now says what its request mapping sends (``Provider.sent_cap``), and the runner
judges by that. Real SDKs against the loopback server.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers import AnthropicProvider, OpenAIProvider, ScriptedProvider
from runtime import Agent, Budget, Host
from tests.support.faults import a_body, a_end, a_start, a_text
from tests.support.loopback import Reply, loopback_server
from tests.test_output_cap_unreported import chat

KEY = "sk-test-not-a-real-key-4243"


def anthropic_cut(output_tokens: int, stop: str = "max_tokens") -> bytes:
    """An Anthropic stream of one text block that stops with ``stop`` after writing
    ``output_tokens`` (its ``message_delta`` usage)."""
    return a_body(a_start(21), a_text(0, "Once upon a time"), a_end(stop, output_tokens))


async def anthropic_turn(
    reply: bytes, budget: Budget, **options: Any
) -> tuple[Any, list[dict[str, Any]]]:
    async with loopback_server(Reply(body=reply)) as server:
        async with Host.open(log_tap=False) as host:
            provider = AnthropicProvider(
                "claude-sonnet-4-5", base_url=server.url, api_key=KEY, **options
            )
            session = await host.open_session(Agent(provider=provider, budget=budget))
            result = await session.run("Tell me a long story.")
        return result, [r.json() for r in server.requests]


async def test_a_cut_by_anthropics_default_max_tokens_under_a_larger_budget_ends_length():
    """5,000 left, 4,096 sent (the provider's default): cut there, 904 tokens of the
    budget are left, and the turn says ``length``. It read ``budget`` (4,096 is within
    a quarter of 5,000)."""
    result, bodies = await anthropic_turn(anthropic_cut(4096), Budget(max_output_tokens=5000))
    assert [b["max_tokens"] for b in bodies] == [4096]
    assert result.error is None, result.error
    assert (result.finish_reason, result.budget) == ("length", None)


async def test_a_cut_by_the_providers_own_max_tokens_option_ends_length():
    result, bodies = await anthropic_turn(
        anthropic_cut(3900), Budget(max_output_tokens=5000), max_tokens=4000
    )
    assert [b["max_tokens"] for b in bodies] == [4000]
    assert (result.finish_reason, result.budget) == ("length", None)


@pytest.mark.parametrize("reported", [3000, 2900])
async def test_a_cut_at_the_budgets_cap_below_anthropics_default_ends_budget(reported):
    """3,000 left, below 4,096: the budget's cap is what was sent, so a cut there (also
    reported a little short of it) is the budget's."""
    result, bodies = await anthropic_turn(anthropic_cut(reported), Budget(max_output_tokens=3000))
    assert [b["max_tokens"] for b in bodies] == [3000]
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")


async def test_a_cut_by_an_openai_providers_own_cap_option_ends_length():
    """``OpenAIProvider(..., max_tokens=...)``, an option of the provider, not the
    agent's settings: the runner did not see it either."""
    cut = Reply(body=chat(texts=("Once upon",), finish="length", usage=900))
    async with loopback_server(cut) as server:
        async with Host.open(log_tap=False) as host:
            provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key=KEY, max_tokens=900)
            agent = Agent(provider=provider, budget=Budget(max_output_tokens=1000))
            result = await (await host.open_session(agent)).run("Tell me a story.")
        bodies = [r.json() for r in server.requests]
    assert [b["max_tokens"] for b in bodies] == [900]
    assert (result.finish_reason, result.budget) == ("length", None)


def test_each_provider_says_the_cap_its_request_carries():
    anthropic = AnthropicProvider("claude-sonnet-4-5", api_key=KEY)
    assert anthropic.sent_cap({}, 5000) == 4096
    assert anthropic.sent_cap({}, 300) == 300
    assert anthropic.sent_cap({"max_tokens": 200}, 300) == 200
    assert anthropic.sent_cap({}, None) == 4096
    assert AnthropicProvider("m", api_key=KEY, max_tokens=8000).sent_cap({}, 5000) == 5000
    chat_ = OpenAIProvider("m", base_url="http://127.0.0.1:1/v1", api_key=KEY, max_tokens=30)
    assert chat_.sent_cap({}, 100) == 30
    assert chat_.sent_cap({"max_completion_tokens": 20}, 100) == 20
    assert OpenAIProvider("m", api_key=KEY).sent_cap({}, 100) == 100
    assert OpenAIProvider("m", api_key=KEY).sent_cap({}, None) is None
    scripted = ScriptedProvider(["hi"])
    assert scripted.sent_cap({"max_tokens": 7}, 100) == 7
    assert scripted.sent_cap({"max_tokens": "7"}, 100) == 100  # (no int: the API refuses)
