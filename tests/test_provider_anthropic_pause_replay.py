"""A paused Anthropic answer sent back to be continued, checked against the API's rules
for a request that ends with the assistant's message (tests/support/wire_rules.py) and
the SDK's request types, through the real ``AsyncAnthropic`` on a loopback server:

- extended thinking on, the paused answer begun without thinking: the API reads it as
  the "final assistant message", which with thinking on must start with a thinking
  block, so the continuation goes with thinking off (as a tool loop begun without
  thinking does); begun with thinking, it stays on;
- the paused answer's last text ending with whitespace: "final assistant content cannot
  end with trailing whitespace", so it goes back cut there (what the SDK's docs ask of
  a partial answer sent back); a whitespace-only text block is not sent at all."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from actors.providers.anthropic import AnthropicProvider
from tests.support import wire_rules
from tests.support.loopback import Reply, loopback_server
from tests.test_provider_anthropic_current import answer
from tests.test_provider_anthropic_pause import MODEL, PAUSED_EVENTS, RESULT, USE, text_events

KEY = "sk-ant-test-not-a-real-key"
PREFILL = "the request ends with an assistant message (prefill)"
SIGNATURE = "c2lnbmVkLXBhdXNlZA=="


def shifted(events: list[dict[str, Any]], by: int) -> list[dict[str, Any]]:
    return [{**e, "index": e["index"] + by} for e in events]


THINKING_EVENTS = [
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "thinking", "thinking": "", "signature": ""},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "thinking_delta", "thinking": "Search first."},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "signature_delta", "signature": SIGNATURE},
    },
    {"type": "content_block_stop", "index": 0},
]


def paused(*events: dict[str, Any]) -> Reply:
    return answer(*events, stop_reason="pause_turn", model=MODEL)


async def bodies(*replies: Reply, **options: Any) -> list[dict[str, Any]]:
    """The request bodies of one turn ("search trio") against ``replies``."""
    from runtime import Agent, Host

    async with loopback_server(*replies) as server:
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY, **options)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            async with session.stream("search trio") as out:
                await out.collect()
    assert out.result.error is None, out.result.error
    return [r.json() for r in server.requests]


def valid(body: dict[str, Any]) -> list[str]:
    """The rules ``body`` breaks but the continuation's own (it ends with the paused
    answer), its messages validated by the SDK's ``MessageParam``."""
    from anthropic.types import MessageParam

    for message in body["messages"]:
        TypeAdapter(MessageParam).validate_python(message)
    thinking = body.get("thinking", {}).get("type") == "enabled"
    errs = wire_rules.anthropic_errors(body["messages"], thinking=thinking)
    return [e for e in errs if e != PREFILL]


async def test_a_paused_answer_begun_without_thinking_is_continued_with_thinking_off():
    done = answer(*text_events(0, " Trio is a library."), model=MODEL)
    first, resumed = await bodies(
        paused(*PAUSED_EVENTS), done, thinking_budget=2048, max_tokens=4096
    )
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert "thinking" not in resumed
    assert resumed["messages"][-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Let me search."}, USE, RESULT],
    }
    assert valid(resumed) == []


async def test_a_paused_answer_begun_with_thinking_is_continued_with_thinking_on():
    done = answer(*text_events(0, " Trio is a library."), model=MODEL)
    events = [*THINKING_EVENTS, *shifted(PAUSED_EVENTS, 1)]
    _, resumed = await bodies(paused(*events), done, thinking_budget=2048, max_tokens=4096)
    assert resumed["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    thought = {"type": "thinking", "thinking": "Search first.", "signature": SIGNATURE}
    assert resumed["messages"][-1]["content"][0] == thought
    assert valid(resumed) == []


async def test_a_paused_answer_ending_in_whitespace_goes_back_without_it():
    """Its last text ends with whitespace, and a whitespace-only block comes between:
    the continuation sends neither the block nor the whitespace."""
    events = [
        *PAUSED_EVENTS,
        *shifted(text_events(0, "\n\n"), 3),
        *shifted(text_events(0, "Found it.\n\n"), 4),
    ]
    done = answer(*text_events(0, "Trio is a library."), model=MODEL)
    _, resumed = await bodies(paused(*events), done)
    assert resumed["messages"][-1]["content"] == [
        {"type": "text", "text": "Let me search."},
        USE,
        RESULT,
        {"type": "text", "text": "Found it."},
    ]
    assert valid(resumed) == []


async def test_the_cut_is_the_request_s_only_and_the_thinking_goes_back_byte_exact():
    """Only the continuation's request is cut (branch ``attack3``): the streamed text and
    the stored answer keep ``Found it.\\n\\n``; the thinking the answer began with (its
    text ending with whitespace too) goes back byte-exact with its signature."""
    from runtime import Agent, Host

    thinking = {"type": "thinking_delta", "thinking": "Search first. \n"}
    events = [
        *(e if e.get("delta", {}).get("type") != "thinking_delta" else {**e, "delta": thinking}
          for e in THINKING_EVENTS),
        *shifted(PAUSED_EVENTS, 1),
        *shifted(text_events(0, "Found it.\n\n"), 4),
    ]  # fmt: skip
    done = answer(*text_events(0, "Trio is a library."), model=MODEL)
    async with loopback_server(paused(*events), done) as server:
        provider = AnthropicProvider(
            MODEL, base_url=server.url, api_key=KEY, thinking_budget=2048, max_tokens=4096
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            async with session.stream("search trio") as out:
                streamed = [getattr(c, "text", None) for c in await out.collect()]
            stored = session.messages[-1]
    resumed = server.requests[1].json()["messages"][-1]["content"]
    assert "Found it.\n\n" in streamed
    assert [p.text for p in stored.content if hasattr(p, "text")][-2:] == [
        "Found it.\n\n",
        "Trio is a library.",
    ]
    assert stored.content[0].text == "Search first. \n"
    assert resumed[0] == {
        "type": "thinking",
        "thinking": "Search first. \n",
        "signature": SIGNATURE,
    }
    assert resumed[-1] == {"type": "text", "text": "Found it."}
