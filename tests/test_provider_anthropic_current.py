"""The Anthropic provider and what the newest SDK (anthropic 2.17) and API bring: adaptive
thinking, citations, the ``compaction`` stop reason. Through the real ``AsyncAnthropic``
client and a loopback server, the events and request bodies checked against the SDK's
own types."""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import TypeAdapter

from actors.providers import anthropic as anthropic_provider
from actors.providers.anthropic import AnthropicProvider, map_messages
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage, UserMessage
from tests.support.loopback import Reply, anthropic_sse, loopback_server
from tests.support.provider_calls import make_request, replay_with

KEY = "sk-ant-test-not-a-real-key"
ADAPTIVE_MODEL = "claude-opus-4-6"


def message_start(model: str) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": "msg_01Current",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        },
    }


def answer(
    *events: dict[str, Any], stop_reason: str = "end_turn", model: str = ADAPTIVE_MODEL
) -> Reply:
    """A whole message: ``events`` (a text block "ok" when none) and its stop."""
    if not events:
        events = (
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "ok"},
            },
            {"type": "content_block_stop", "index": 0},
        )
    tail = [
        {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {}},
        {"type": "message_stop"},
    ]
    return Reply(body=anthropic_sse(message_start(model), *events, *tail))


# -- adaptive thinking --------------------------------------------------------------------


async def test_a_model_the_sdk_wants_adaptive_thinks_adaptively_with_no_warning():
    from anthropic.types import ThinkingConfigParam

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = await replay_with(
            lambda url: AnthropicProvider(
                ADAPTIVE_MODEL, base_url=url, api_key=KEY, thinking_budget=2048
            ),
            answer(),
        )
    assert [w for w in caught if issubclass(w.category, UserWarning)] == []
    assert run.body["thinking"] == {"type": "adaptive"}
    TypeAdapter(ThinkingConfigParam).validate_python(run.body["thinking"], strict=True)
    assert "anthropic-beta" not in run.server.requests[-1].headers


def test_every_model_the_sdk_warns_for_thinks_adaptively_by_default():
    from anthropic._data import MODELS_TO_WARN_WITH_THINKING_ENABLED

    assert len(MODELS_TO_WARN_WITH_THINKING_ENABLED) == 2
    for model in MODELS_TO_WARN_WITH_THINKING_ENABLED:
        assert anthropic_provider.wants_adaptive(model)
        provider = AnthropicProvider(model, api_key=KEY, thinking_budget=2048)
        assert provider.request_params(make_request())["thinking"] == {"type": "adaptive"}


def test_other_models_keep_their_thinking_budget():
    provider = AnthropicProvider("claude-sonnet-4-5", api_key=KEY, thinking_budget=2048)
    assert provider.adaptive_thinking is False
    thinking = provider.request_params(make_request())["thinking"]
    assert thinking == {"type": "enabled", "budget_tokens": 2048}


def test_adaptive_thinking_false_keeps_the_budget_for_a_model_that_wants_adaptive():
    provider = AnthropicProvider(
        ADAPTIVE_MODEL, api_key=KEY, thinking_budget=2048, adaptive_thinking=False
    )
    thinking = provider.request_params(make_request())["thinking"]
    assert thinking == {"type": "enabled", "budget_tokens": 2048}


def test_adaptive_thinking_needs_no_budget_and_no_budget_below_max_tokens():
    bare = AnthropicProvider("claude-sonnet-4-6", api_key=KEY, adaptive_thinking=True)
    assert bare.request_params(make_request())["thinking"] == {"type": "adaptive"}
    large = AnthropicProvider(ADAPTIVE_MODEL, api_key=KEY, thinking_budget=8000, max_tokens=4096)
    assert large.request_params(make_request())["thinking"] == {"type": "adaptive"}


def test_adaptive_thinking_goes_on_through_a_tool_loop_begun_without_thinking():
    call = ToolCallPart(tool_call_id="toolu_1", tool_name="t", input={}, step=0)
    history = (
        UserMessage(content="go"),
        AssistantMessage(content=(call,)),  # Claude chose not to think on this step
        ToolMessage(tool_call_id="toolu_1", tool_name="t", output="done", step=0),
    )
    provider = AnthropicProvider(ADAPTIVE_MODEL, api_key=KEY, thinking_budget=2048)
    assert provider.request_params(make_request(history))["thinking"] == {"type": "adaptive"}
    budgeted = AnthropicProvider("claude-sonnet-4-5", api_key=KEY, thinking_budget=2048)
    assert "thinking" not in budgeted.request_params(make_request(history))


def test_adaptive_thinking_keeps_a_forced_tool_choice():
    forced = {"type": "tool", "name": "t"}
    request = make_request(settings={"tool_choice": forced, "temperature": 0.2})
    provider = AnthropicProvider(ADAPTIVE_MODEL, api_key=KEY, thinking_budget=2048)
    params = provider.request_params(request)
    assert params["tool_choice"] == forced  # the docs: adaptive supports forced tool use
    assert "temperature" not in params  # still refused with thinking on


def test_adaptive_thinking_asks_no_interleaved_thinking_beta():
    provider = AnthropicProvider(
        ADAPTIVE_MODEL, api_key=KEY, thinking_budget=2048, interleaved_thinking=True
    )
    params = provider.request_params(make_request())
    assert params["thinking"] == {"type": "adaptive"} and "extra_headers" not in params


def test_the_effort_goes_in_output_config_through_request_options():
    from anthropic.types import OutputConfigParam

    provider = AnthropicProvider(
        ADAPTIVE_MODEL, api_key=KEY, adaptive_thinking=True, output_config={"effort": "medium"}
    )
    params = provider.request_params(make_request())
    assert params["output_config"] == {"effort": "medium"}
    TypeAdapter(OutputConfigParam).validate_python(params["output_config"], strict=True)


# -- citations ------------------------------------------------------------------------------

CITATION = {  # a recorded citations_delta's citation (a char_location of a text document)
    "type": "char_location",
    "cited_text": "The grass is green. ",
    "document_index": 0,
    "document_title": "My Document",
    "start_char_index": 0,
    "end_char_index": 20,
    "file_id": None,
}
CITED_EVENTS = [
    {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": "", "citations": []},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "the grass is green"},
    },
    {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "citations_delta", "citation": CITATION},
    },
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "."}},
    {"type": "content_block_stop", "index": 1},
]


def test_the_cited_stream_is_one_the_sdk_knows():
    from anthropic.types import RawMessageStreamEvent

    adapter = TypeAdapter(RawMessageStreamEvent)
    for event in [message_start(ADAPTIVE_MODEL), *CITED_EVENTS]:
        assert adapter.validate_python(event, strict=True).type == event["type"]


async def cited_then_more() -> tuple[Any, list[Any], Any]:
    """A session's two turns: a cited answer, then "more"; the stored messages, the
    first turn's stream and the second request's body."""
    from runtime import Agent, Host

    async with loopback_server(answer(*CITED_EVENTS), answer()) as server:
        provider = AnthropicProvider("claude-sonnet-4-5", base_url=server.url, api_key=KEY)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            async with session.stream("what colour is the grass?") as out:
                chunks = [c async for c in out]
            await session.run("more")
            messages = list(session.messages)
    return messages, chunks, server.requests[1].json()


async def test_a_text_blocks_citations_are_stored_on_its_part_and_sent_back_with_it():
    from anthropic.types import MessageParam

    messages, _, sent = await cited_then_more()
    first = messages[1]
    assert [(p.text, p.citations) for p in first.content] == [
        ("the grass is green", (CITATION,)),
        (".", None),
    ]
    assert sent["messages"][1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "the grass is green", "citations": [CITATION]},
            {"type": "text", "text": "."},
        ],
    }
    for message in sent["messages"]:
        TypeAdapter(MessageParam).validate_python(message)


async def test_citations_leave_the_streamed_text_as_it_was():
    _, chunks, _ = await cited_then_more()
    texts = [c for c in chunks if c.type == "text-delta"]
    assert "".join(c.text for c in texts) == "the grass is green."
    assert [c.type for c in chunks].count("text-start") == 2  # a cited block: its own part


def test_citations_are_dropped_for_other_providers():
    from actors.providers import gemini, openai, openai_responses
    from runtime.messages import TextPart

    cited = TextPart(text="green", step=0, citations=(CITATION,))
    history = [UserMessage(content="?"), AssistantMessage(content=(cited,))]
    assert openai.map_messages(None, history)[1] == {"role": "assistant", "content": "green"}
    assert openai_responses.map_messages(history)[1] == {"role": "assistant", "content": "green"}
    assert gemini.map_messages(None, history)[1][1]["parts"] == [{"text": "green"}]
    # and to Anthropic with them
    assert map_messages(None, history)[1][1]["content"][0]["citations"] == [CITATION]


def test_a_stored_cited_part_loads_back_and_an_uncited_one_keeps_its_json():
    from runtime import serde
    from runtime.messages import TextPart

    cited = AssistantMessage(content=(TextPart(text="green", step=0, citations=(CITATION,)),))
    assert serde.from_json(serde.to_json(cited), AssistantMessage) == cited
    plain = serde.converter.unstructure(TextPart(text="green", step=0))
    assert "citations" not in plain


# -- the compaction stop reason -------------------------------------------------------------

COMPACTION_BLOCK = {
    "type": "compaction",
    "content": "The user asked about grass colours.",
    "encrypted_content": "EqQBCkYIBxgCIkCompacted",
}


async def test_a_compaction_stop_goes_on_and_the_next_request_sends_the_block_back():
    # pause_after_compaction (beta): the server hands the turn back with the compaction
    # block alone; the SDK's tool runner sends it back unchanged to continue. So does
    # Axon's turn runner now, as its next step (tests/test_provider_anthropic_pause.py):
    # the paused step finishes "other" (raw "compaction"), the turn goes on, and every
    # later request sends the block back as the assistant's.
    from anthropic.types.beta import BetaMessageParam, BetaRawMessageStreamEvent

    from runtime import Agent, Host

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
        {
            "type": "message_delta",
            "delta": {"stop_reason": "compaction", "stop_sequence": None},
            "usage": {"output_tokens": 5},
        },
    ]
    adapter = TypeAdapter(BetaRawMessageStreamEvent)
    for event in events:
        adapter.validate_python(event, strict=True)
    paused = Reply(
        body=anthropic_sse(message_start("claude-sonnet-4-5"), *events, {"type": "message_stop"})
    )
    async with loopback_server(paused, answer(), answer()) as server:
        provider = AnthropicProvider("claude-sonnet-4-5", base_url=server.url, api_key=KEY)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            async with session.stream("go") as out:
                chunks = [c async for c in out]
            await session.run("go on")
    assert [c.finish_reason for c in chunks if c.type == "step-finish"] == ["other", "stop"]
    assert [c.finish_reason for c in chunks if c.type == "finish"] == ["stop"]
    assert len(server.requests) == 3  # the turn made two calls
    assert server.requests[1].json()["messages"] == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [COMPACTION_BLOCK]},
    ]
    sent = server.requests[2].json()["messages"]
    assert sent == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [COMPACTION_BLOCK, {"type": "text", "text": "ok"}]},
        {"role": "user", "content": "go on"},
    ]
    for message in sent:
        TypeAdapter(BetaMessageParam).validate_python(message)
