"""A turn the Anthropic server paused (``stop_reason: "pause_turn"``: its server tools
ran long; ``"compaction"``: the beta's ``pause_after_compaction``) goes on by itself: the
turn runner's next step sends the conversation as it stands, the paused answer last,
and the model continues it (what the SDK's tool runner calls ``resume``), at most
``MAX_RESUMES`` times a turn. Through the real ``AsyncAnthropic`` client on a loopback
server (SSE), the events and requests checked against the SDK's own types."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from actors.providers.anthropic import AnthropicProvider
from actors.turn import runner as runner_module
from runtime.messages import ProviderDataPart, TextPart
from tests.support import wire_rules
from tests.support.loopback import Reply, loopback_server
from tests.test_provider_anthropic_current import COMPACTION_BLOCK, KEY, answer, message_start

MODEL = "claude-sonnet-4-5"
USE = {
    "type": "server_tool_use",
    "id": "srvtoolu_01Pause",
    "name": "web_search",
    "input": {"query": "trio"},
}
RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_01Pause",
    "content": [
        {
            "type": "web_search_result",
            "title": "Trio",
            "url": "https://trio.readthedocs.io/",
            "encrypted_content": "EqgfCioIARgBPause",
            "page_age": None,
        }
    ],
}


def text_events(index: int, text: str) -> list[dict[str, Any]]:
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


PAUSED_EVENTS = [
    *text_events(0, "Let me search."),
    {"type": "content_block_start", "index": 1, "content_block": {**USE, "input": {}}},
    {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"query": "trio"}'},
    },
    {"type": "content_block_stop", "index": 1},
    {"type": "content_block_start", "index": 2, "content_block": RESULT},
    {"type": "content_block_stop", "index": 2},
]


def paused(*events: dict[str, Any], stop_reason: str = "pause_turn") -> Reply:
    return answer(*(events or PAUSED_EVENTS), stop_reason=stop_reason, model=MODEL)


def test_the_paused_stream_is_one_the_sdk_knows():
    from anthropic.types import RawMessageStreamEvent

    adapter = TypeAdapter(RawMessageStreamEvent)
    tail = {
        "type": "message_delta",
        "delta": {"stop_reason": "pause_turn", "stop_sequence": None},
        "usage": {"output_tokens": 5},
    }
    for event in [message_start(MODEL), *PAUSED_EVENTS, tail]:
        assert adapter.validate_python(event, strict=True).type == event["type"]


async def turns(*replies: Reply, then: str | None = "thanks") -> tuple[Any, ...]:
    """A turn "search trio" against ``replies`` (and a second turn ``then``): its stream
    chunks, the stored messages and the server (its requests)."""
    from runtime import Agent, Host

    more = (answer(model=MODEL),) if then else ()
    async with loopback_server(*replies, *more) as server:
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            async with session.stream("search trio") as out:
                chunks = [c async for c in out]
            if then:
                await session.run(then)
            messages = list(session.messages)
    return chunks, messages, server


async def test_a_paused_turn_goes_on_with_the_paused_answer_sent_back_last():
    from anthropic.types import MessageParam

    done = answer(*text_events(0, " Trio is a library."), model=MODEL)
    chunks, messages, server = await turns(paused(), done)
    paused_content = [
        {"type": "text", "text": "Let me search."},
        USE,
        RESULT,
    ]
    first, resumed, after = (r.json()["messages"] for r in server.requests)
    assert first == [{"role": "user", "content": "search trio"}]
    assert resumed == [  # the same conversation, the paused answer last: the model goes on
        {"role": "user", "content": "search trio"},
        {"role": "assistant", "content": paused_content},
    ]
    assert after == [  # one assistant message for the turn, both calls' blocks in order
        {"role": "user", "content": "search trio"},
        {
            "role": "assistant",
            "content": [*paused_content, {"type": "text", "text": " Trio is a library."}],
        },
        {"role": "user", "content": "thanks"},
    ]
    for body in (resumed, after):
        for message in body:
            TypeAdapter(MessageParam).validate_python(message)
    # one turn of two steps: the paused one finished "other", the turn "stop"
    assert [c.finish_reason for c in chunks if c.type == "step-finish"] == ["other", "stop"]
    assert [c.finish_reason for c in chunks if c.type == "finish"] == ["stop"]
    answer_parts = messages[1].content
    assert [(type(p), p.step) for p in answer_parts] == [
        (TextPart, 0),
        (ProviderDataPart, 0),
        (ProviderDataPart, 0),
        (TextPart, 1),
    ]


async def test_a_compaction_pause_goes_on_from_the_compaction_block():
    from anthropic.types.beta import BetaMessageParam

    events = [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "compaction", "content": None, "encrypted_content": None},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {
                "type": "compaction_delta",
                "content": COMPACTION_BLOCK["content"],
                "encrypted_content": COMPACTION_BLOCK["encrypted_content"],
            },
        },
        {"type": "content_block_stop", "index": 0},
    ]
    chunks, _, server = await turns(
        paused(*events, stop_reason="compaction"), answer(model=MODEL), then=None
    )
    resumed = server.requests[1].json()["messages"]
    assert resumed == [
        {"role": "user", "content": "search trio"},
        {"role": "assistant", "content": [COMPACTION_BLOCK]},
    ]
    for message in resumed:
        TypeAdapter(BetaMessageParam).validate_python(message)
    assert [c.finish_reason for c in chunks if c.type == "finish"] == ["stop"]
    assert len(server.requests) == 2


async def test_a_turn_continues_at_most_max_resumes_paused_calls(monkeypatch):
    from runtime import Agent, Budget, Host

    monkeypatch.setattr(runner_module, "MAX_RESUMES", 2)
    replies = [paused(*text_events(0, f"part {n}.")) for n in range(4)]
    async with loopback_server(*replies) as server:
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider, budget=Budget(max_steps=50)))
            async with session.stream("search trio") as out:
                chunks = [c async for c in out]
    assert len(server.requests) == 3  # the first call and two continuations
    assert [c.finish_reason for c in chunks if c.type == "finish"] == ["other"]  # as before
    assert [c.finish_reason for c in chunks if c.type == "step-finish"] == ["other"] * 3
    last = server.requests[2].json()["messages"]
    assert last[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "part 0."}, {"type": "text", "text": "part 1."}],
    }


async def test_max_steps_bounds_the_continuations_too():
    from runtime import Agent, Budget, Host

    replies = [paused(*text_events(0, f"part {n}.")) for n in range(3)]
    async with loopback_server(*replies) as server:
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider, budget=Budget(max_steps=2)))
            async with session.stream("search trio") as out:
                chunks = [c async for c in out]
    assert len(server.requests) == 2
    assert [c.finish_reason for c in chunks if c.type == "finish"] == ["budget"]


async def test_a_use_paused_before_its_result_goes_back_and_pairs_with_the_continuations():
    # the paused answer ends with a server tool use whose result the continuation brings:
    # the use goes back as it came (the server resumes it), and later requests send use
    # and result in one assistant message (dropping the use left its result an orphan)
    events = [e for e in PAUSED_EVENTS if e.get("index") != 2]  # no result block
    done = answer(
        {"type": "content_block_start", "index": 0, "content_block": RESULT},
        {"type": "content_block_stop", "index": 0},
        *text_events(1, " Trio is a library."),
        model=MODEL,
    )
    _, _, server = await turns(paused(*events), done)
    resumed, after = (r.json()["messages"] for r in server.requests[1:])
    assert resumed[-1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Let me search."}, USE],
    }
    assert after[1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me search."},
            USE,
            RESULT,
            {"type": "text", "text": " Trio is a library."},
        ],
    }
    assert wire_rules.anthropic_errors(after) == []


def test_a_use_without_its_result_in_an_answer_not_continued_is_still_dropped():
    from actors.providers.anthropic import map_messages
    from runtime.messages import AssistantMessage, UserMessage

    cut = AssistantMessage(
        content=(
            TextPart(text="Let me search.", step=0),
            ProviderDataPart(provider="anthropic", data=USE, step=0),
        )
    )
    _, sent = map_messages(None, [UserMessage(content="go"), cut, UserMessage(content="and?")])
    assert sent[1] == {"role": "assistant", "content": [{"type": "text", "text": "Let me search."}]}
