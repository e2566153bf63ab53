"""Consecutive Anthropic text blocks of one message (what a cited answer is made of:
uncited text, a cited sentence, uncited text, another cited one) stay one text part
each, so the next request sends the same blocks, each with its own citations. Through
the real ``AsyncAnthropic`` client on a loopback server, the events and the request
checked against the SDK's own types."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from actors.providers.anthropic import AnthropicProvider
from tests.support.loopback import loopback_server
from tests.test_provider_anthropic_current import (
    ADAPTIVE_MODEL,
    CITATION,
    KEY,
    answer,
    message_start,
)

OTHER = {
    **CITATION,
    "cited_text": "The sky is blue. ",
    "start_char_index": 20,
    "end_char_index": 37,
}


def text_block(index: int, text: str, *citations: dict[str, Any]) -> list[dict[str, Any]]:
    start: dict[str, Any] = {"type": "text", "text": ""}
    if citations:
        start["citations"] = []
    events: list[dict[str, Any]] = [
        {"type": "content_block_start", "index": index, "content_block": start},
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "text_delta", "text": text},
        },
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": "citations_delta", "citation": c},
        }
        for c in citations
    ]
    return [*events, {"type": "content_block_stop", "index": index}]


BLOCKS = [  # (text, citations) as the API sent them
    ("According to the document, ", ()),
    ("the grass is green", (CITATION,)),
    (" and ", ()),
    ("the sky is blue", (OTHER,)),
    (". That is all", ()),
    (" I know.", ()),
]
EVENTS = [e for i, (text, cited) in enumerate(BLOCKS) for e in text_block(i, text, *cited)]


def test_the_stream_is_one_the_sdk_knows():
    from anthropic.types import RawMessageStreamEvent

    adapter = TypeAdapter(RawMessageStreamEvent)
    for event in [message_start(ADAPTIVE_MODEL), *EVENTS]:
        assert adapter.validate_python(event, strict=True).type == event["type"]


async def two_turns() -> tuple[list[Any], list[Any], dict[str, Any]]:
    from runtime import Agent, Host

    async with loopback_server(answer(*EVENTS), answer()) as server:
        provider = AnthropicProvider("claude-sonnet-4-5", base_url=server.url, api_key=KEY)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            async with session.stream("what colours?") as out:
                chunks = [c async for c in out]
            await session.run("more")
            messages = list(session.messages)
    return messages, chunks, server.requests[1].json()


async def test_each_text_block_is_a_part_and_goes_back_as_the_same_block_with_its_citations():
    from anthropic.types import MessageParam

    messages, chunks, sent = await two_turns()
    stored = [(p.text, p.citations) for p in messages[1].content]
    assert stored == [(text, cited or None) for text, cited in BLOCKS]
    expected = []
    for text, cited in BLOCKS:
        block: dict[str, Any] = {"type": "text", "text": text}
        if cited:
            block["citations"] = list(cited)
        expected.append(block)
    assert sent["messages"][1] == {"role": "assistant", "content": expected}
    for message in sent["messages"]:
        TypeAdapter(MessageParam).validate_python(message)
    # the stream shows the same text, a part per block
    assert "".join(c.text for c in chunks if c.type == "text-delta") == "".join(
        t for t, _ in BLOCKS
    )
    assert [c.type for c in chunks].count("text-start") == len(BLOCKS)
