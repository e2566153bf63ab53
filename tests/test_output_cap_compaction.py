"""A compaction summary call is one of the turn's calls, under its budget.

Its usage counted toward the turn's, but it was sent no cap (it could write past the
turn's output budget), it was not priced (a turn under ``max_cost`` whose history was
summarized ended ``budget``: its cost unknown), and a summary that spent what was left
was followed by a step call sent a cap of 0. Chat Completions streams from the loopback
server, read by the real openai SDK (``gpt-4o-mini``, priced as OpenAI's: ``price_as``).
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers import OpenAIProvider
from runtime import Agent, Budget, Host, Summarize
from runtime.compaction import SUMMARY_PREFIX, is_summary
from runtime.messages import AssistantMessage, TextPart, UserMessage
from runtime.pricing import load_prices
from tests.support.loopback import Reply, loopback_server
from tests.test_output_cap_unreported import chat

KEY = "sk-test-not-a-real-key-4243"


@pytest.fixture(autouse=True)
def prices_loaded() -> None:
    assert load_prices()  # up front: the first priced call loads it in a thread


def older_turns() -> list[Any]:
    """Two turns of long text: over the summarizer's limit of 50 tokens."""
    out: list[Any] = []
    for n in range(2):
        out.append(UserMessage(content=f"question {n} " + "words " * 60))
        out.append(
            AssistantMessage(content=(TextPart(text=f"answer {n} " + "words " * 60, step=0),))
        )
    return out


async def run(replies: list[Reply], budget: Budget) -> tuple[Any, list[Any], list[dict[str, Any]]]:
    """The turn's result, the stored history and the request bodies (summary first)."""
    async with loopback_server(*replies) as server:
        async with Host.open(log_tap=False) as host:
            agent = Agent(
                provider=OpenAIProvider(
                    "gpt-4o-mini", base_url=server.url + "/v1", api_key=KEY, price_as="openai"
                ),
                budget=budget,
                history_processors=[Summarize(max_tokens=50, keep_turns=1)],
            )
            session = await host.open_session(agent, session_id="s", history=older_turns())
            result = await session.run("And now?")
            stored = list((await host.store.load("s")).messages)
        return result, stored, [r.json() for r in server.requests]


async def test_a_summary_call_is_sent_what_the_turn_has_left_and_the_step_what_it_left():
    replies = [
        Reply(body=chat(texts=("The gist.",), usage=30)),
        Reply(body=chat(texts=("Ok.",), usage=2)),
    ]
    result, stored, bodies = await run(replies, Budget(max_output_tokens=100))
    assert result.error is None, result.error
    assert [b["max_tokens"] for b in bodies] == [100, 70]
    assert result.usage.output_tokens == 32
    assert any(is_summary(m) for m in stored)


async def test_a_summary_call_is_priced_so_a_cost_budget_holds_the_turn():
    """Its usage unpriced made the turn's cost unknown: ``max_cost`` ended it ``budget``."""
    replies = [
        Reply(body=chat(texts=("The gist.",), usage=30)),
        Reply(body=chat(texts=("Ok.",), usage=2)),
    ]
    result, _, bodies = await run(replies, Budget(max_cost=1.0))
    assert len(bodies) == 2
    assert (result.finish_reason, result.budget) == ("stop", None)
    assert result.usage.cost is not None and 0 < result.usage.cost < 1.0


async def test_a_summary_cut_at_what_the_turn_had_left_is_not_used_and_ends_the_turn_budget():
    """Half a summary would stand for the turns it cut in every later request."""
    cut = Reply(body=chat(texts=("The gist of it is",), finish="length", usage=10))
    result, stored, bodies = await run([cut], Budget(max_output_tokens=10))
    assert [b["max_tokens"] for b in bodies] == [10]
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    assert not any(is_summary(m) for m in stored)
    assert result.usage.output_tokens == 10


async def test_a_summary_that_spends_what_was_left_is_followed_by_no_call_capped_at_zero():
    whole = Reply(body=chat(texts=("The gist.",), usage=10))
    result, stored, bodies = await run([whole], Budget(max_output_tokens=10))
    assert [b["max_tokens"] for b in bodies] == [10]  # no second request, sent 0
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    summaries = [m for m in stored if is_summary(m)]
    assert [m.content for m in summaries] == [SUMMARY_PREFIX + "The gist."]


async def test_a_summary_with_no_usage_counts_its_bytes_at_most_what_was_left():
    replies = [Reply(body=chat(texts=("The gist.",))), Reply(body=chat(texts=("Ok.",), usage=2))]
    result, _, bodies = await run(replies, Budget(max_output_tokens=100))
    assert [b["max_tokens"] for b in bodies] == [100, 100 - len("The gist.")]
    assert result.usage.output_tokens == len("The gist.") + 2
