"""Conformance: every recorded OpenAI-style stream in ``../shared/fixtures/streams``.

Each file is served unchanged from the loopback server and read through the real
``AsyncOpenAI`` client and :class:`OpenAIProvider`. The expected values are copied from
that folder's ``PROVENANCE.md`` (abbreviated texts as their prefix and total length) and
hard-coded in :data:`EXPECTED`, so a fixture that appears without an expectation fails.
The fixtures are data this suite reads when present; without them it skips.

Deliberate differences from PROVENANCE.md (which describes what the SDK alone yields):

* ``groq/think-tags-in-content.sse`` says "no standard usage"; the provider reads Groq's
  non-standard ``x_groq.usage`` (21/988/1009), so that is what is expected here.
* ``<think>`` tags stay in the text (the engine splits them later): for those files the
  text is checked as ``<think>`` + reasoning + ``</think>`` + answer.
* a refusal finishes as ``content-filter``, keeping the raw ``stop``.
* the ``n=3`` file is checked for choice 0 only, the one the provider reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors.providers.openai import OpenAIProvider
from runtime.actor_messages import InferRequest
from runtime.chunks import (
    FinishChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    UsageChunk,
)
from runtime.errors import AxonError, BadRequest
from runtime.inbox import Inbox
from runtime.messages import UserMessage
from tests.support.loopback import Reply, loopback_server

STREAMS = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "streams"
FOLDERS = ("openai", "deepseek", "groq", "together", "zai", "openrouter")

if not STREAMS.is_dir():
    pytest.skip(f"shared fixtures absent ({STREAMS})", allow_module_level=True)


@attrs.frozen
class Long:
    """An abbreviated expectation: the text starts with ``prefix`` and has ``length`` chars."""

    prefix: str
    length: int

    def check(self, actual: str) -> None:
        assert actual.startswith(self.prefix), actual[: len(self.prefix) + 20]
        assert len(actual) == self.length


def check_text(expected: str | Long, actual: str) -> None:
    if isinstance(expected, Long):
        expected.check(actual)
    else:
        assert actual == expected


@attrs.frozen(kw_only=True)
class Expect:
    text: str | Long = ""
    refusal: bool = False
    reasoning: str | Long = ""
    think: tuple[Long, Long] | None = None
    """``<think>`` reasoning and visible answer, both inside the content text."""
    calls: tuple[tuple[str, str, Any], ...] = ()
    """``(tool_call_id, tool_name, parsed input)`` in call order."""
    finish: tuple[str, str] | None = None
    """``(unified reason, raw reason)``; ``None`` when the stream ends in an error."""
    usage: tuple[int, int, int] | None = None
    """``(input, output, total)`` tokens; ``None``: no usage chunk."""
    error: type[AxonError] | None = None
    status: int | None = None


EXPECTED: dict[str, Expect] = {
    "openai/chat-text-plain.sse": Expect(
        text=Long(
            "I'm unable to provide real-time weather updates. To get the current weather in "
            "San Francisco, I recommend checking a reliable weather websit",
            159,
        ),
        finish=("stop", "stop"),
        usage=(14, 30, 44),
    ),
    "openai/chat-text-long-gpt41nano.sse": Expect(
        text=Long(
            "**Holiday Name:** Harmony Day\n\n**Date:** Celebrated annually on the first "
            "Saturday of May\n\n**Purpose:** Harmony Day is dedicated to fosterin",
            1724,
        ),
        finish=("stop", "stop"),
        usage=(16, 300, 316),
    ),
    "openai/chat-tool-call-single-strict.sse": Expect(
        calls=(
            (
                "call_CTf1nWJLqSeRgDqaCG27xZ74",
                "get_weather",
                {"city": "San Francisco", "state": "CA"},
            ),
        ),
        finish=("tool-calls", "tool_calls"),
        usage=(48, 19, 67),
    ),
    "openai/chat-tool-call-step1-get-capital.sse": Expect(
        calls=(("call_ZR5UUuTt3pf61kjwAJIYdVMj", "get_capital", {"country": "UK"}),),
        finish=("tool-calls", "tool_calls"),
        usage=(53, 15, 68),
    ),
    "openai/chat-tool-call-step2-answer.sse": Expect(
        text="The capital of the UK is London.", finish=("stop", "stop"), usage=(78, 9, 87)
    ),
    "openai/chat-parallel-tool-calls-weather-stock.sse": Expect(
        calls=(
            (
                "call_JMW1whyEaYG438VE1OIflxA2",
                "GetWeatherArgs",
                {"city": "Edinburgh", "country": "GB", "units": "c"},
            ),
            (
                "call_DNYTawLBoN8fj3KN6qU9N1Ou",
                "get_stock_price",
                {"ticker": "AAPL", "exchange": "NASDAQ"},
            ),
        ),
        finish=("tool-calls", "tool_calls"),
        usage=(149, 60, 209),
    ),
    "openai/chat-parallel-tool-calls-weather-product.sse": Expect(
        calls=(
            ("call_NS4iQj14cDFwc0BnrKqDHavt", "get_weather", {"city": "Mexico City"}),
            ("call_SkGkkGDvHQEEk0CGbnAh2AQw", "get_product_name", {}),
        ),
        finish=("tool-calls", "tool_calls"),
        usage=(417, 44, 461),
    ),
    "openai/chat-text-then-tool-call.sse": Expect(
        text="PRE_TOOL",
        calls=(("call_NZa7xqfefoaMI2YYHowVXVlU", "weather", {}),),
        finish=("tool-calls", "tool_calls"),
        usage=(58, 12, 70),
    ),
    "openai/chat-finish-length.sse": Expect(
        text='{"', finish=("length", "length"), usage=(79, 1, 80)
    ),
    "openai/chat-refusal.sse": Expect(
        text="I'm sorry, I can't assist with that request.",
        refusal=True,
        finish=("content-filter", "stop"),
        usage=(79, 11, 90),
    ),
    "openai/chat-n3-multiple-choices.sse": Expect(
        text='{"city":"San Francisco","temperature":65,"units":"f"}',
        finish=("stop", "stop"),
        usage=(79, 42, 121),
    ),
    "openai/chat-moderation-trailing-chunk.sse": Expect(
        text="Paris.", finish=("stop", "stop"), usage=(13, 11, 24)
    ),
    "openai/azure-prompt-filter-first-chunk.sse": Expect(
        text="Capital of Denmark.", finish=("stop", "stop"), usage=(15, 78, 93)
    ),
    "deepseek/reasoning-content.sse": Expect(
        text="Hello there! 😊 How can I help you today?",
        reasoning=Long(
            'Hmm, the user just said "Hello". It\'s a simple greeting but I wonder if '
            "there's more to it",
            882,
        ),
        finish=("stop", "stop"),
        usage=(6, 212, 218),
    ),
    "deepseek/reasoning-then-tool-call.sse": Expect(
        reasoning=Long(
            "The user is asking for the weather in San Francisco. I need to use the "
            "weather tool to get",
            191,
        ),
        calls=(("call_00_ioIn7yN9p1ZOMNpDLwd4MgAF", "weather", {"location": "San Francisco"}),),
        finish=("tool-calls", "tool_calls"),
        usage=(339, 83, 422),
    ),
    "zai/glm-reasoning-content.sse": Expect(
        text="4",
        reasoning=Long(
            "\n1.  **Analyze the User's Request:** The user is asking a very simple, "
            "fundamental arithme",
            2173,
        ),
        finish=("stop", "stop"),
        usage=(13, 564, 577),
    ),
    "groq/think-tags-in-content.sse": Expect(
        think=(
            Long(
                "\nOkay, so I want to make Uruguayan alfajores. I've heard they're a type of "
                "South American ",
                1977,
            ),
            Long(
                "\n\nTo make Uruguayan alfajores, follow these organized steps for a "
                "delightful cookie sandwi",
                2053,
            ),
        ),
        finish=("stop", "stop"),
        usage=(21, 988, 1009),  # from x_groq.usage: PROVENANCE says "no standard usage"
    ),
    "together/think-tags-in-content-deepseek-r1.sse": Expect(
        think=(
            Long(
                '\nOkay, the user asked "How do I cross the street?" Hmm, seems basic but '
                "actually super imp",
                1430,
            ),
            Long(
                "\nCrossing the street safely requires attention and following key steps. "
                "Here's a step-by-s",
                2557,
            ),
        ),
        finish=("stop", "stop"),
        usage=(10, 955, 965),
    ),
    "groq/midstream-error-event.sse": Expect(
        reasoning=Long(
            "We need to call the tool with invalid parameters first, then second call "
            "with valid args. ",
            412,
        ),
        error=BadRequest,
        status=400,
    ),
    "openrouter/length-then-error-chunk.sse": Expect(
        reasoning="We need to respond to a greeting. The user",
        error=BadRequest,
        status=400,
        usage=(43, 10, 53),  # on the error chunk: billed, counted (branch provleft)
    ),
}

FILES = sorted(str(p.relative_to(STREAMS)) for f in FOLDERS for p in (STREAMS / f).glob("*.sse"))


def test_every_fixture_has_an_expectation():
    assert FILES, "no fixtures found"
    assert sorted(set(FILES) - set(EXPECTED)) == []
    assert sorted(set(EXPECTED) - set(FILES)) == []


async def replay(name: str, write_size: int | None) -> tuple[list[Any], AxonError | None]:
    body = (STREAMS / name).read_bytes()
    async with loopback_server(Reply(body=body, write_size=write_size)) as server:
        provider = OpenAIProvider("recorded", base_url=server.url + "/v1", api_key="sk-dummy")
        request = InferRequest(
            request_id="r1",
            session_id="s1",
            turn_id="t1",
            step=0,
            instructions=None,
            messages=(UserMessage(content="replay"),),
            tools=(),
            reply=Inbox(),
            cancel_scope=trio.CancelScope(),
        )
        chunks: list[Any] = []

        async def emit(chunk: Any) -> None:
            chunks.append(chunk)

        error = None
        try:
            await provider.stream(request, emit)
        except AxonError as exc:
            error = exc
        finally:
            await provider.aclose()
    return chunks, error


@pytest.mark.parametrize("write_size", [None, 61], ids=["one-write", "61-byte-writes"])
@pytest.mark.parametrize("name", FILES)
async def test_recorded_stream(name, write_size, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-dummy")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    expect = EXPECTED[name]
    chunks, error = await replay(name, write_size)

    texts = [c for c in chunks if isinstance(c, TextChunk)]
    text = "".join(c.text for c in texts)
    if expect.think is not None:
        assert text.startswith("<think>")
        reasoning, _, answer = text.removeprefix("<think>").partition("</think>")
        expect.think[0].check(reasoning)
        expect.think[1].check(answer)
    else:
        check_text(expect.text, text)
    assert all(c.refusal == expect.refusal for c in texts)
    assert all(c.text for c in texts)

    reasoning_chunks = [c for c in chunks if isinstance(c, ReasoningChunk)]
    check_text(expect.reasoning, "".join(c.text for c in reasoning_chunks))
    assert all(c.provider == "openai" and c.signature is None for c in reasoning_chunks)

    calls = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert [(c.tool_call_id, c.tool_name, c.input) for c in calls] == list(expect.calls)
    assert all(c.input_error is None for c in calls)
    for call in calls:  # the streamed fragments add up to the final input
        starts = [c for c in chunks if isinstance(c, ToolInputStartChunk)]
        assert [c.tool_call_id for c in starts].count(call.tool_call_id) == 1
        raw = "".join(
            c.delta
            for c in chunks
            if isinstance(c, ToolInputDeltaChunk) and c.tool_call_id == call.tool_call_id
        )
        assert (json.loads(raw) if raw else {}) == call.input

    usages = [c.usage for c in chunks if isinstance(c, UsageChunk)]
    if expect.usage is None:
        assert usages == []
    else:
        assert len(usages) == 1
        u = usages[0]
        assert (u.input_tokens, u.output_tokens, u.total_tokens) == expect.usage

    finishes = [c for c in chunks if isinstance(c, FinishChunk)]
    if expect.error is not None:
        assert isinstance(error, expect.error), error
        assert error.status_code == expect.status
        assert error.provider == "openai"
        assert finishes == []
    else:
        assert error is None, error
        assert chunks[-1] == FinishChunk(reason=expect.finish[0], raw_reason=expect.finish[1])
        assert len(finishes) == 1
        kinds = [type(c) for c in chunks]  # usage, then the calls, then finish, at the end
        tail = [UsageChunk] * bool(usages) + [ToolCallChunk] * len(calls) + [FinishChunk]
        assert kinds[-len(tail) :] == tail
