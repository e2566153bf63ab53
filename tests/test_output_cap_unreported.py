"""The output budget when a server reports no usage, and which limit cut a call.

An OpenAI-compatible server that ignores ``stream_options.include_usage`` (or reports
zeros), and a stream cut before its usage chunk, report no output tokens: the turn
counted nothing, so every next call was sent the whole budget again as its cap, and a
call cut at that cap ended ``length`` (the model's own) instead of ``budget``. Such a
call now counts the UTF-8 bytes it wrote (no fewer than its tokens), at most the cap it
was sent. Chat Completions streams from the loopback server, read by the real openai SDK.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.providers import OpenAIProvider
from runtime import Agent, Budget, Host, tool
from tests.support.loopback import Reply, loopback_server, sse

KEY = "sk-test-not-a-real-key-4243"


@tool
async def get_weather(city: str = "") -> str:
    """The weather of a city."""
    return f"sunny in {city}"


def chat(
    *,
    texts: tuple[str, ...] = (),
    call: tuple[str, str, str] | None = None,
    finish: str | None = "stop",
    usage: int | None = None,
) -> bytes:
    """A Chat Completions stream: ``texts``, a ``call`` (id, name, arguments), the
    ``finish`` reason (``None``: none, the stream cut) and, given ``usage``, a usage
    chunk with that many completion tokens (``None``: none, as a server that ignores
    ``include_usage``)."""
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

    events: list[Any] = [chunk({"role": "assistant", "content": t}) for t in texts]
    if call is not None:
        fn = {"name": call[1], "arguments": call[2]}
        events.append(
            chunk({"tool_calls": [{"index": 0, "id": call[0], "type": "function", "function": fn}]})
        )
    if finish is not None:
        events.append(chunk({}, finish))
    if usage is not None:
        numbers = {"prompt_tokens": 10, "completion_tokens": usage, "total_tokens": 10 + usage}
        events.append({**base, "choices": [], "usage": numbers})
    return sse(*events, done=finish is not None)


def provider(url: str) -> OpenAIProvider:
    return OpenAIProvider("m", base_url=url + "/v1", api_key=KEY)


async def run(
    replies: list[Reply],
    budget: Budget,
    *,
    fallback: bool = False,
    settings: dict[str, Any] | None = None,
) -> tuple[Any, list[dict[str, Any]]]:
    """The turn's result and the request bodies the server got."""
    async with loopback_server(*replies) as server:
        async with Host.open(log_tap=False) as host:
            chain: Any = provider(server.url)
            if fallback:
                chain = [chain, provider(server.url)]
            agent = Agent(
                provider=chain, tools=[get_weather], budget=budget, settings=settings or {}
            )
            session = await host.open_session(agent, session_id="s")
            result = await session.run("What is the weather in Paris?")
        return result, [r.json() for r in server.requests]


ARGS = json.dumps({"city": "Paris"}, separators=(",", ":"))
CALLED = len("get_weather") + len(ARGS)  # 27: the first step's bytes


async def test_a_call_with_no_usage_counts_its_bytes_so_the_next_cap_is_smaller():
    """The second call is sent what the first left by its bytes; it was sent the whole
    budget again (1000, 1000)."""
    replies = [
        Reply(body=chat(call=("call_1", "get_weather", ARGS), finish="tool_calls")),
        Reply(body=chat(texts=("Sunny.",))),
    ]
    result, bodies = await run(replies, Budget(max_output_tokens=1000))
    assert result.error is None, result.error
    assert [b["max_tokens"] for b in bodies] == [1000, 1000 - CALLED]
    assert result.usage.output_tokens == CALLED + len("Sunny.")


async def test_a_call_reporting_zero_output_tokens_is_counted_as_one_reporting_none():
    replies = [
        Reply(body=chat(call=("call_1", "get_weather", ARGS), finish="tool_calls", usage=0)),
        Reply(body=chat(texts=("Sunny.",), usage=0)),
    ]
    result, bodies = await run(replies, Budget(max_output_tokens=1000))
    assert [b["max_tokens"] for b in bodies] == [1000, 1000 - CALLED]
    assert result.usage.output_tokens == CALLED + len("Sunny.")


async def test_a_call_with_no_usage_is_counted_at_most_its_cap_and_a_whole_answer_stays_stop():
    """Eleven bytes under a cap of 5: counted 5, the budget spent exactly; the answer
    ended ``stop``, whole, and the turn says so (not ``budget``)."""
    result, bodies = await run(
        [Reply(body=chat(texts=("Hello there",)))], Budget(max_output_tokens=5)
    )
    assert [b["max_tokens"] for b in bodies] == [5]
    assert (result.finish_reason, result.budget) == ("stop", None)
    assert result.usage.output_tokens == 5


async def test_a_call_with_no_usage_cut_at_its_cap_ends_the_turn_budget():
    """``length`` and no usage: the bytes reach the cap, so the budget's cap cut it."""
    cut = Reply(body=chat(texts=("Once upon", " a time"), finish="length"))
    result, _ = await run([cut], Budget(max_output_tokens=10))
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    assert result.text == "Once upon a time"


async def test_a_call_with_no_usage_cut_short_of_its_cap_ends_the_turn_length():
    """Nine bytes cannot be 200 tokens: the server's own limit cut it, not the budget."""
    cut = Reply(body=chat(texts=("Once upon",), finish="length"))
    result, _ = await run([cut], Budget(max_output_tokens=200))
    assert (result.finish_reason, result.budget) == ("length", None)


async def test_a_call_cut_by_the_servers_own_lower_limit_ends_the_turn_length():
    """Usage reported, 9 of the 200 tokens the call was sent: the server's limit."""
    cut = Reply(body=chat(texts=("Once upon",), finish="length", usage=9))
    result, bodies = await run([cut], Budget(max_output_tokens=200))
    assert [b["max_tokens"] for b in bodies] == [200]
    assert (result.finish_reason, result.budget) == ("length", None)


async def test_a_call_cut_at_the_budgets_cap_with_usage_ends_the_turn_budget():
    cut = Reply(body=chat(texts=("Once upon",), finish="length", usage=200))
    result, _ = await run([cut], Budget(max_output_tokens=200))
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")


@pytest.mark.parametrize(
    ("reported", "finish"), [(190, "budget"), (150, "budget"), (149, "length")]
)
async def test_a_call_cut_at_the_budgets_cap_counted_short_of_it_ends_the_turn_budget(
    reported, finish
):
    """The server stopped at our cap of 200 but counts fewer (a token left out, another
    tokenizer): within a quarter of the cap, the budget's cut (it read ``length``, the
    server's own limit); further below, another limit's."""
    cut = Reply(body=chat(texts=("Once upon",), finish="length", usage=reported))
    result, bodies = await run([cut], Budget(max_output_tokens=200))
    assert [b["max_tokens"] for b in bodies] == [200]
    assert result.finish_reason == finish
    assert result.usage.output_tokens == reported  # (what the server bills)


async def test_a_call_cut_by_a_smaller_settings_cap_near_the_budgets_ends_the_turn_length():
    """The agent's own ``max_tokens`` (180) was sent, not the budget's 200: it cut the
    call, though 180 is within the budget cap's margin."""
    cut = Reply(body=chat(texts=("Once upon",), finish="length", usage=180))
    result, bodies = await run([cut], Budget(max_output_tokens=200), settings={"max_tokens": 180})
    assert [b["max_tokens"] for b in bodies] == [180]
    assert (result.finish_reason, result.budget) == ("length", None)


async def test_a_stream_cut_before_its_usage_counts_its_bytes_for_the_fallbacks_cap():
    """The first provider's stream drops after its text, with no usage: the fallback,
    making the step again, is sent what that call's bytes left (it was sent 100)."""
    first = chat(texts=("Twenty bytes of text",), finish=None)  # one event, no [DONE]
    dropped = chat(texts=("Twenty bytes of text", " and more"), finish=None)
    replies = [
        Reply(body=dropped, drop_after=len(first), write_events=True, delay=0.01),
        Reply(body=chat(texts=("Sunny.",), usage=2)),
    ]
    result, bodies = await run(replies, Budget(max_output_tokens=100), fallback=True)
    assert result.error is None, result.error
    assert [b["max_tokens"] for b in bodies] == [100, 80]
    assert result.usage.output_tokens == 20 + 2
