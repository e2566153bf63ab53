"""The Anthropic provider against the real ``AsyncAnthropic`` client and a loopback server.

Every stream test replays an SSE body (one of our own recordings in
``tests/recordings/anthropic``, or one built inline) through the SDK's HTTP stack, so what
is tested is exactly what production parses. Restoration tests assert ``map_messages``
and the request body the server received. No SDK mocks, no network, dummy keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.providers.anthropic import (
    TRUNCATED_BY_MAX_TOKENS,
    AnthropicProvider,
    classify_error,
    map_finish_reason,
    map_messages,
    map_tools,
)
from runtime.actor_messages import InferRequest, StreamFailed
from runtime.chunks import (
    FinishChunk,
    ProviderDataChunk,
    ReasoningChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
    Usage,
    UsageChunk,
)
from runtime.errors import (
    AuthenticationFailed,
    BadRequest,
    ConfigurationError,
    ConnectionLost,
    ContextTooLong,
    MalformedStream,
    Overloaded,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
)
from runtime.history import INTERRUPTED, repair
from runtime.messages import (
    AssistantMessage,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.tools import tool
from tests.support import wire_rules
from tests.support.loopback import Reply, anthropic_sse, loopback_server
from tests.support.provider_calls import (
    Run,
    cancel_after_first_chunk,
    make_request,
    replay_with,
    served_items,
)

RECORDINGS = Path(__file__).parent / "recordings" / "anthropic"
SHARED = (
    Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "streams" / "anthropic"
)
MODEL = "claude-sonnet-4-5"
KEY = "sk-ant-test-not-a-real-key"


def recording(name: str) -> bytes:
    return (RECORDINGS / name).read_bytes()


async def replay(
    *replies: Reply,
    request: InferRequest | None = None,
    expect_error: bool = False,
    **provider_kw: Any,
) -> Run:
    return await replay_with(
        lambda url: AnthropicProvider(MODEL, base_url=url, api_key=KEY, **provider_kw),
        *replies,
        request=request,
        expect_error=expect_error,
    )


def sse_reply(name: str, **kw: Any) -> Reply:
    return Reply(body=recording(name), **kw)


def json_error(status: int, error_type: str, message: str, headers=()) -> Reply:
    body = json.dumps({"type": "error", "error": {"type": error_type, "message": message}})
    return Reply(
        status=status, body=body.encode(), content_type="application/json", headers=headers
    )


MESSAGE_START = {
    "type": "message_start",
    "message": {
        "id": "msg_01Inline",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    },
}


def inline(
    *events: dict[str, Any], stop_reason: str | None = "end_turn", stop: bool = True
) -> Reply:
    tail: list[dict[str, Any]] = []
    if stop_reason is not None:
        tail.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason},
                "usage": {"output_tokens": 5},
            }
        )
    if stop:
        tail.append({"type": "message_stop"})
    return Reply(body=anthropic_sse(MESSAGE_START, *events, *tail))


# -- text, ordering, framing ------------------------------------------------------------


async def test_text_deltas_become_text_chunks_as_they_arrive():
    run = await replay(sse_reply("text.sse"))
    assert [c.text for c in run.of(TextChunk)] == ["Hello", ", wor", "ld! It is 21°C."]


async def test_usage_then_finish_are_the_last_two_chunks():
    run = await replay(sse_reply("text.sse"))
    assert run.chunks[-2] == UsageChunk(
        usage=Usage(input_tokens=21, output_tokens=9, total_tokens=30, cache_read=0, cache_write=0)
    )
    assert run.chunks[-1] == FinishChunk(reason="stop", raw_reason="end_turn")


async def test_five_byte_writes_give_the_same_chunks():
    whole = await replay(sse_reply("interleaved-thinking.sse"))
    pieces = await replay(sse_reply("interleaved-thinking.sse", write_size=5))
    assert pieces.chunks == whole.chunks


async def test_pings_between_blocks_are_ignored():
    body = recording("tool-use-several.sse")
    ping = b'event: ping\ndata: {"type": "ping"}\n\n'
    assert body.count(ping) == 2
    with_pings = await replay(Reply(body=body))
    without = await replay(Reply(body=body.replace(ping, b"")))
    assert with_pings.chunks == without.chunks


# -- reasoning -------------------------------------------------------------------------


async def test_thinking_deltas_then_signature_closes_the_block():
    run = await replay(sse_reply("thinking-signature.sse"))
    reasoning = run.of(ReasoningChunk)
    assert [c.text for c in reasoning] == ["The user asks for 2+2.", " That is 4.", ""]
    assert all(c.provider == "anthropic" for c in reasoning)
    assert reasoning[-1].signature is not None and reasoning[-1].signature.startswith("EqQBCkYI")
    assert [c.signature for c in reasoning[:-1]] == [None, None]
    assert run.chunks.index(reasoning[-1]) < run.chunks.index(run.of(TextChunk)[0])


async def test_thinking_block_without_signature_stays_unsigned():
    run = await replay(sse_reply("unsigned-thinking.sse"))
    assert run.of(ReasoningChunk) == [ReasoningChunk(text="Half a thought", provider="anthropic")]
    assert run.text == "Done."


async def test_redacted_thinking_is_one_chunk_with_its_data():
    run = await replay(sse_reply("redacted-thinking.sse"))
    (chunk,) = run.of(ReasoningChunk)
    assert chunk.redacted_data is not None and chunk.redacted_data.startswith("EmwKAhgB")
    assert (chunk.text, chunk.signature, chunk.provider) == ("", None, "anthropic")


async def test_interleaved_thinking_keeps_the_block_order():
    run = await replay(sse_reply("interleaved-thinking.sse"))
    kinds = [c.type for c in run.chunks]
    assert kinds == [
        "reasoning", "reasoning",  # thinking A + its signature
        "text", "text",
        "reasoning", "reasoning",  # thinking B + its signature
        "tool-input-start", "tool-input-delta", "tool-call",
        "usage", "finish",
    ]  # fmt: skip
    signatures = [c.signature for c in run.of(ReasoningChunk) if c.signature]
    assert len(signatures) == 2 and signatures[0] != signatures[1]


# -- tool calls --------------------------------------------------------------------------


async def test_tool_input_split_across_deltas_is_streamed_then_parsed():
    run = await replay(sse_reply("tool-use-split-input.sse"))
    call_id = "toolu_01AxonWeather000000001"
    assert run.of(ToolInputStartChunk) == [
        ToolInputStartChunk(tool_call_id=call_id, tool_name="get_weather")
    ]
    # the empty first fragment is not forwarded; the rest arrive exactly as streamed
    assert [c.delta for c in run.of(ToolInputDeltaChunk)] == [
        '{"ci',
        'ty": "Pa',
        'ris", "uni',
        'ts": "c"}',
    ]
    assert run.of(ToolCallChunk) == [
        ToolCallChunk(
            tool_call_id=call_id, tool_name="get_weather", input={"city": "Paris", "units": "c"}
        )
    ]


async def test_tool_call_is_emitted_once_after_its_last_delta():
    run = await replay(sse_reply("tool-use-split-input.sse"))
    (call,) = run.of(ToolCallChunk)
    last_delta = run.of(ToolInputDeltaChunk)[-1]
    assert run.chunks.index(call) == run.chunks.index(last_delta) + 1


async def test_empty_tool_input_is_an_empty_object():
    run = await replay(sse_reply("tool-use-empty-input.sse"))
    assert run.of(ToolInputDeltaChunk) == []
    assert run.of(ToolCallChunk) == [
        ToolCallChunk(tool_call_id="toolu_01AxonNoArgs0000000001", tool_name="get_time", input={})
    ]
    assert run.chunks[-1] == FinishChunk(reason="tool-calls", raw_reason="tool_use")


async def test_several_tool_use_blocks_each_complete_in_order():
    run = await replay(sse_reply("tool-use-several.sse"))
    calls = [(c.tool_call_id, c.input) for c in run.of(ToolCallChunk)]
    assert calls == [
        ("toolu_01AxonParis000000001", {"city": "Paris"}),
        ("toolu_01AxonTokyo000000001", {"city": "Tokyo"}),
        ("toolu_01AxonClock000000001", {}),
    ]
    # each call is complete before the next one starts
    kinds = [c.type for c in run.chunks if c.type.startswith("tool")]
    assert kinds == [
        "tool-input-start",
        "tool-input-delta",
        "tool-input-delta",
        "tool-call",
    ] * 2 + [
        "tool-input-start",
        "tool-call",
    ]


async def test_max_tokens_cutting_a_tool_input_gives_an_unusable_call():
    run = await replay(sse_reply("max-tokens-tool-input.sse"))
    (call,) = run.of(ToolCallChunk)
    assert call.input == '{"path": "notes.txt", "content": "line one\\nline tw'
    assert call.input_error == TRUNCATED_BY_MAX_TOKENS
    assert run.chunks[-1] == FinishChunk(reason="length", raw_reason="max_tokens")
    assert run.chunks.index(call) < len(run.chunks) - 2  # before usage and finish


async def test_invalid_tool_json_is_reported_not_parsed():
    run = await replay(sse_reply("invalid-tool-json.sse"))
    (call,) = run.of(ToolCallChunk)
    assert call.input == '{"city": "Rome",}'
    assert call.input_error is not None and call.input_error.startswith(
        "invalid JSON in tool input: "
    )


# -- usage, finish, server blocks ----------------------------------------------------------


async def test_usage_counts_cache_tokens_and_takes_message_delta_updates():
    run = await replay(sse_reply("cache-usage.sse"))
    (usage,) = run.of(UsageChunk)
    assert usage.usage == Usage(
        input_tokens=12,
        output_tokens=14,
        total_tokens=26,
        cache_read=1800,
        cache_write=256,
        reasoning_tokens=0,
    )


async def test_usage_without_cache_fields_leaves_them_unknown():
    run = await replay(inline())
    assert run.of(UsageChunk)[0].usage == Usage(input_tokens=10, output_tokens=5, total_tokens=15)


async def test_server_tool_blocks_become_provider_data_not_tool_calls():
    run = await replay(sse_reply("server-tool-web-search.sse"))
    assert run.of(ToolCallChunk) == [] and run.of(ToolInputStartChunk) == []
    assert run.of(ProviderDataChunk) == [
        ProviderDataChunk(
            provider="anthropic",
            data={
                "type": "server_tool_use",
                "id": "srvtoolu_01AxonSearch0000001",
                "name": "web_search",
                "input": {"query": "trio async library"},
            },
        ),
        ProviderDataChunk(
            provider="anthropic",
            data={
                "type": "web_search_tool_result",
                "tool_use_id": "srvtoolu_01AxonSearch0000001",
                "content": [
                    {
                        "type": "web_search_result",
                        "title": "Trio: a friendly Python library for async concurrency",
                        "url": "https://trio.readthedocs.io/",
                        "encrypted_content": (
                            "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgxNC1kNjNjNTk1ZWI3Y2MSDPXWK"
                        ),
                        "page_age": None,
                    }
                ],
            },
        ),
    ]
    assert run.text == "I'll search for that.Trio is a Python library for structured concurrency."


COMPACTION_SUMMARY = "The user asked for the weather in Paris; it was sunny, 21°C."
COMPACTION_EVENTS = [  # context compaction (beta): the summary comes in the block's one delta
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
            "content": COMPACTION_SUMMARY,
            "encrypted_content": "EqQBCkYIBxgCIkCompacted",
        },
    },
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Ok."}},
    {"type": "content_block_stop", "index": 1},
]


async def test_a_compaction_block_goes_back_with_the_summary_its_delta_brought():
    from anthropic.types.beta import BetaRawMessageStreamEvent
    from pydantic import TypeAdapter

    for event in COMPACTION_EVENTS:  # the shapes the SDK's newest event types define
        TypeAdapter(BetaRawMessageStreamEvent).validate_python(event, strict=True)
    chunks: list[Any] = []

    async def emit(chunk: Any) -> None:
        chunks.append(chunk)

    user = UserMessage(content="And the weather?")
    async with loopback_server(inline(*COMPACTION_EVENTS), inline()) as server:
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY)
        await provider.stream(make_request((user,), instructions=None), emit)
        history = (user, AssistantMessage(content=tuple(to_parts(chunks, step=0))))
        await provider.stream(make_request(history, instructions=None), emit)
        await provider.aclose()
    assert server.requests[1].json()["messages"][1]["content"] == [
        {
            "type": "compaction",
            "content": COMPACTION_SUMMARY,
            "encrypted_content": "EqQBCkYIBxgCIkCompacted",
        },
        {"type": "text", "text": "Ok."},
    ]


async def test_block_event_and_delta_types_it_does_not_read_leave_the_answer_whole():
    # anthropic 2.17's beta blocks (fallback, mcp_tool_use) are kept verbatim; an event
    # type and a delta type no SDK knows yet are ignored (citations: their own tests)
    fallback = {
        "type": "fallback",
        "from": {"model": "claude-a"},
        "to": {"model": "claude-b"},
        "trigger": {"type": "refusal"},
    }
    mcp_use = {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "n", "server_name": "s"}
    run = await replay(
        inline(
            {"type": "content_block_start", "index": 0, "content_block": fallback},
            {"type": "content_block_stop", "index": 0},
            {"type": "not_yet_invented", "x": {"y": 1}},
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text"}},
            {"type": "content_block_delta", "index": 1, "delta": {"type": "not_yet_invented"}},
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "citations_delta", "citation": {"type": "char_location"}},
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "text_delta", "text": "ok"},
            },
            {"type": "content_block_stop", "index": 1},
            {"type": "content_block_start", "index": 2, "content_block": {**mcp_use, "input": {}}},
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": '{"a": 1}'},
            },
            {"type": "content_block_stop", "index": 2},
        )
    )
    assert run.error is None
    assert run.of(ProviderDataChunk) == [
        ProviderDataChunk(provider="anthropic", data=fallback),
        ProviderDataChunk(provider="anthropic", data={**mcp_use, "input": {"a": 1}}),
    ]
    assert run.text == "ok" and run.of(FinishChunk)[-1].reason == "stop"


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool-calls"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("refusal", "content-filter"),
        ("pause_turn", "other"),
        ("something_new", "other"),
        (None, "other"),
    ],
)
def test_finish_reason_mapping(raw, reason):
    assert map_finish_reason(raw) == reason


async def test_refusal_finishes_with_content_filter():
    run = await replay(inline(stop_reason="refusal"))
    assert run.chunks[-1] == FinishChunk(reason="content-filter", raw_reason="refusal")


# -- failures ----------------------------------------------------------------------------


async def test_overloaded_error_event_mid_stream_raises_overloaded_after_chunks():
    run = await replay(sse_reply("overloaded-midstream.sse"), expect_error=True)
    *texts, usage = run.chunks  # what message_start counted was billed (branch provleft)
    assert [c.text for c in texts] == ["Partial ", "answer"]
    assert isinstance(usage, UsageChunk) and usage.usage.input_tokens
    assert isinstance(run.error, Overloaded) and run.error.retryable
    assert (run.error.status_code, run.error.provider) == (529, "anthropic")


async def test_http_429_is_rate_limited_with_retry_after():
    reply = json_error(429, "rate_limit_error", "slow down", headers=[("retry-after", "7")])
    run = await replay(reply, expect_error=True)
    assert isinstance(run.error, RateLimited) and run.error.retryable
    assert (run.error.retry_after, run.error.status_code) == (7.0, 429)


async def test_http_529_is_overloaded():
    run = await replay(json_error(529, "overloaded_error", "Overloaded"), expect_error=True)
    assert isinstance(run.error, Overloaded) and run.error.status_code == 529


async def test_http_401_is_authentication_failed_and_not_retryable():
    run = await replay(
        json_error(401, "authentication_error", "invalid x-api-key"), expect_error=True
    )
    assert isinstance(run.error, AuthenticationFailed) and not run.error.retryable
    assert run.error.status_code == 401
    assert KEY not in str(run.error)


async def test_http_400_prompt_too_long_is_context_too_long():
    reply = json_error(
        400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum"
    )
    run = await replay(reply, expect_error=True)
    assert isinstance(run.error, ContextTooLong) and not run.error.retryable


async def test_other_http_400_is_bad_request():
    reply = json_error(400, "invalid_request_error", "messages.1.content.0.type: Expected thinking")
    run = await replay(reply, expect_error=True)
    assert type(run.error) is BadRequest and run.error.status_code == 400


async def test_http_500_is_provider_unavailable():
    run = await replay(json_error(500, "api_error", "Internal server error"), expect_error=True)
    assert isinstance(run.error, ProviderUnavailable) and run.error.retryable


async def test_connection_dropped_mid_body_is_connection_lost():
    run = await replay(sse_reply("text.sse", drop_after=700), expect_error=True)
    assert isinstance(run.error, ConnectionLost) and run.error.retryable
    assert run.text == "Hello"  # what arrived before the drop was emitted


async def test_stream_cut_before_message_stop_is_malformed():
    run = await replay(sse_reply("cut-before-message-stop.sse"), expect_error=True)
    assert isinstance(run.error, MalformedStream) and "message_stop" in str(run.error)
    assert run.text == "Never finished" and run.of(FinishChunk) == []


async def test_message_stop_without_stop_reason_is_malformed():
    run = await replay(inline(stop_reason=None), expect_error=True)
    assert isinstance(run.error, MalformedStream) and "stop_reason" in str(run.error)


async def test_broken_json_in_an_event_is_malformed():
    body = recording("text.sse").replace(b'"text":"Hello"', b'"text":"Hel')
    run = await replay(Reply(body=body), expect_error=True)
    assert isinstance(run.error, MalformedStream) and run.error.retryable


async def test_delta_for_a_block_that_never_started_is_malformed():
    delta = {
        "type": "content_block_delta",
        "index": 3,
        "delta": {"type": "input_json_delta", "partial_json": "{"},
    }
    run = await replay(inline(delta), expect_error=True)
    assert isinstance(run.error, MalformedStream)


async def test_no_next_event_within_the_timeout_is_provider_timeout():
    run = await replay(sse_reply("text.sse", stall=5), expect_error=True, timeout=0.3)
    assert isinstance(run.error, ProviderTimeout) and run.error.retryable


async def test_cancelling_the_request_stops_the_stream_promptly():
    slow = sse_reply("text.sse", write_size=40, delay=0.05)
    request, chunks = await cancel_after_first_chunk(
        lambda url: AnthropicProvider(MODEL, base_url=url, api_key=KEY), slow
    )
    assert request.cancel_scope.cancelled_caught
    assert chunks == [TextChunk(text="Hello")]


async def test_a_failure_reaches_the_requester_as_stream_failed():
    """Through the actor path: chunks first (the usage ``message_start`` counted last),
    then StreamFailed as the last item."""
    items = await served_items(
        lambda url: AnthropicProvider(MODEL, base_url=url, api_key=KEY),
        sse_reply("overloaded-midstream.sse"),
    )
    assert [type(i).__name__ for i in items] == [
        "TextChunk",
        "TextChunk",
        "UsageChunk",
        "StreamFailed",
    ]
    assert isinstance(items[-1], StreamFailed) and isinstance(items[-1].error, Overloaded)


def test_classify_error_covers_sdk_and_transport_errors():
    import anthropic
    import httpx2

    request = httpx2.Request("POST", "https://api.anthropic.com/v1/messages")
    assert isinstance(classify_error(anthropic.APITimeoutError(request)), ProviderTimeout)
    assert isinstance(classify_error(anthropic.APIConnectionError(request=request)), ConnectionLost)
    assert isinstance(classify_error(httpx2.ReadError("reset")), ConnectionLost)
    assert isinstance(classify_error(httpx2.ReadTimeout("slow")), ProviderTimeout)
    assert isinstance(classify_error(json.JSONDecodeError("bad", "{", 1)), MalformedStream)
    same = Overloaded("already classified")
    assert classify_error(same) is same
    other = classify_error(RuntimeError("boom"))
    assert type(other) is ProviderError and other.provider == "anthropic"


def test_retry_after_ms_and_http_dates_are_understood():
    import anthropic
    import httpx2

    def rate_limited(headers: dict[str, str]) -> Any:
        request = httpx2.Request("POST", "https://api.anthropic.com/v1/messages")
        response = httpx2.Response(429, headers=headers, request=request)
        return classify_error(anthropic.RateLimitError("429", response=response, body=None))

    assert rate_limited({"retry-after-ms": "1500", "retry-after": "9"}).retry_after == 1.5
    assert rate_limited({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}).retry_after == 0.0
    assert rate_limited({}).retry_after is None


# -- configuration -----------------------------------------------------------------------


def test_importing_the_module_does_not_import_the_sdk():
    code = (
        "import sys, actors.providers.anthropic as m; "
        "p = m.AnthropicProvider('claude-sonnet-4-5'); "
        "assert 'anthropic' not in sys.modules, 'SDK imported'; "
        "assert 'httpx2' not in sys.modules, 'HTTP client imported'"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)


def test_no_client_and_no_key_read_before_the_first_call(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    provider = AnthropicProvider(MODEL)
    assert provider._client is None


def test_describe_never_includes_the_key():
    provider = AnthropicProvider(MODEL, api_key=KEY, thinking_budget=2048, temperature=0.2)
    description = provider.describe()
    assert KEY not in repr(description) and KEY not in repr(vars(provider).get("request_options"))
    assert description["provider"] == "anthropic" and description["model"] == MODEL
    assert description["options"] == ["temperature"]


def test_thinking_budget_must_stay_below_max_tokens():
    with pytest.raises(ConfigurationError):
        AnthropicProvider(MODEL, thinking_budget=4096, max_tokens=4096)


def test_thinking_budget_must_be_one_the_api_takes():
    with pytest.raises(ConfigurationError, match="at least 1024"):
        AnthropicProvider(MODEL, thinking_budget=512)


def test_a_calls_max_tokens_at_or_below_the_budget_lowers_the_budget_below_it():
    provider = AnthropicProvider(MODEL, api_key=KEY, thinking_budget=2000, max_tokens=4096)
    params = provider.request_params(make_request(settings={"max_tokens": 1500}))
    assert params["max_tokens"] == 1500
    assert params["thinking"] == {"type": "enabled", "budget_tokens": 1499}


async def test_interleaved_thinking_adds_its_beta_to_the_betas_a_caller_asked_for():
    request = make_request(settings={"extra_headers": {"anthropic-beta": "context-1m-2025-08-07"}})
    run = await replay(
        sse_reply("text.sse"),
        request=request,
        thinking_budget=2048,
        interleaved_thinking=True,
    )
    sent = run.server.requests[-1].headers["anthropic-beta"]
    assert sent == "context-1m-2025-08-07,interleaved-thinking-2025-05-14"
    assert "interleaved_thinking" not in run.body  # an option of Axon's, not of the API


async def test_interleaved_thinking_asks_no_beta_for_a_call_that_does_not_think():
    run = await replay(sse_reply("text.sse"), interleaved_thinking=True)
    assert "anthropic-beta" not in run.server.requests[-1].headers
    assert "thinking" not in run.body


def test_with_interleaved_thinking_a_call_with_tools_may_send_a_budget_above_max_tokens():
    provider = AnthropicProvider(
        MODEL, api_key=KEY, thinking_budget=8000, max_tokens=4096, interleaved_thinking=True
    )
    with_tools = provider.request_params(make_request(tools=(get_weather,)))
    assert with_tools["thinking"] == {"type": "enabled", "budget_tokens": 8000}
    without = provider.request_params(make_request())  # the API allows it with tools only
    assert without["thinking"] == {"type": "enabled", "budget_tokens": 4095}


async def test_request_options_and_call_settings_reach_the_body():
    request = make_request(settings={"temperature": 0.1, "metadata": {"user_id": "u-1"}})
    run = await replay(
        sse_reply("text.sse"), request=request, temperature=0.9, top_k=5, stop_sequences=["END"]
    )
    body = run.body
    assert body["temperature"] == 0.1  # the call's settings win over the provider's
    assert body["top_k"] == 5 and body["stop_sequences"] == ["END"]
    assert body["metadata"] == {"user_id": "u-1"}
    assert body["stream"] is True and body["model"] == MODEL and body["max_tokens"] == 4096
    assert "thinking" not in body  # no thinking_budget, no thinking config
    # this SDK version sends the key as a bearer token, older ones as x-api-key
    headers = run.server.requests[-1].headers
    assert KEY in (
        headers.get("x-api-key"),
        headers.get("authorization", "").removeprefix("Bearer "),
    )


# -- restoration --------------------------------------------------------------------------

SIG_A = "EqQBCkYIBxgCIkB3+/=signature-of-step-0"
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5+/="


def three_step_history() -> tuple[Any, ...]:
    assistant = AssistantMessage(
        content=(
            ReasoningPart(
                text="I should look it up.", signature=SIG_A, provider="anthropic", step=0
            ),
            ToolCallPart(
                tool_call_id="toolu_A", tool_name="get_weather", input={"city": "Paris"}, step=0
            ),
            TextPart(text="Paris is sunny; now Tokyo.", step=1),
            ToolCallPart(
                tool_call_id="toolu_B", tool_name="get_weather", input={"city": "Tokyo"}, step=1
            ),
            TextPart(text="Both are sunny.", step=2),
        )
    )
    return (
        UserMessage(content="Weather in Paris and Tokyo?"),
        assistant,
        ToolMessage(tool_call_id="toolu_A", tool_name="get_weather", output="sunny, 21°C", step=0),
        ToolMessage(
            tool_call_id="toolu_B",
            tool_name="get_weather",
            output={"sky": "clear", "c": 18},
            step=1,
        ),
    )


EXPECTED_THREE_STEPS = [
    {"role": "user", "content": "Weather in Paris and Tokyo?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should look it up.", "signature": SIG_A},
            {
                "type": "tool_use",
                "id": "toolu_A",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_A", "content": "sunny, 21°C"}],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Paris is sunny; now Tokyo."},
            {
                "type": "tool_use",
                "id": "toolu_B",
                "name": "get_weather",
                "input": {"city": "Tokyo"},
            },
        ],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_B",
                "content": '{"sky": "clear", "c": 18}',
            }
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "Both are sunny."}]},
]


def test_three_step_history_is_split_per_step():
    system, messages = map_messages("Be brief.", three_step_history())
    assert system == "Be brief."
    assert messages == EXPECTED_THREE_STEPS


def test_signature_is_sent_back_byte_identical():
    _, messages = map_messages(None, three_step_history())
    assert messages[1]["content"][0]["signature"].encode() == SIG_A.encode()


def test_redacted_thinking_round_trips():
    assistant = AssistantMessage(
        content=(
            ReasoningPart(text="", redacted_data=REDACTED, provider="anthropic", step=0),
            TextPart(text="Done.", step=0),
        )
    )
    _, messages = map_messages(None, (UserMessage(content="q"), assistant))
    assert messages[1] == {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": REDACTED},
            {"type": "text", "text": "Done."},
        ],
    }


def test_unsigned_and_foreign_reasoning_is_dropped():
    assistant = AssistantMessage(
        content=(
            ReasoningPart(
                text="openai thoughts", signature="gAAAA-openai", provider="openai", step=0
            ),
            ReasoningPart(text="cut short", provider="anthropic", step=0),
            ReasoningPart(text="no provider", signature="x", step=0),
            TextPart(text="Answer.", step=0),
        )
    )
    _, messages = map_messages(None, (UserMessage(content="q"), assistant))
    assert messages[1] == {"role": "assistant", "content": [{"type": "text", "text": "Answer."}]}


def test_a_step_left_empty_after_dropping_is_omitted():
    assistant = AssistantMessage(
        content=(
            ReasoningPart(text="foreign", provider="openai", step=0),
            TextPart(text="  ", step=0),
        ),
        interrupted=True,
    )
    _, messages = map_messages(
        None, (UserMessage(content="q"), assistant, UserMessage(content="again"))
    )
    assert messages == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "q"}, {"type": "text", "text": "again"}],
        }
    ]


def test_a_repaired_history_sends_the_interrupted_result_as_an_error_tool_result():
    assistant = AssistantMessage(
        content=(ToolCallPart(tool_call_id="toolu_X", tool_name="slow", input={}, step=0),),
        interrupted=True,
    )
    history = (
        UserMessage(content="go"),
        assistant,
        ToolMessage(tool_call_id="toolu_ORPHAN", tool_name="slow", output="late", step=0),
        UserMessage(content="still there?"),
    )
    _, messages = map_messages(None, repair(history))  # the runner repairs before sending
    assert messages[1:] == [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_X", "name": "slow", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_X",
                    "content": INTERRUPTED,
                    "is_error": True,
                },
                {"type": "text", "text": "still there?"},
            ],
        },
    ]


def test_tool_error_result_is_marked_is_error():
    assistant = AssistantMessage(
        content=(
            ToolCallPart(tool_call_id="toolu_E", tool_name="div", input={"a": 1, "b": 0}, step=0),
        )
    )
    error = ToolMessage(
        tool_call_id="toolu_E", tool_name="div", error="ZeroDivisionError: division by zero", step=0
    )
    _, messages = map_messages(None, (UserMessage(content="1/0"), assistant, error))
    assert messages[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_E",
            "content": "ZeroDivisionError: division by zero",
            "is_error": True,
        }
    ]


def test_unparsed_tool_input_is_sent_as_an_empty_object():
    """A call stored with its raw text (invalid or truncated JSON) was never executed; the
    API needs an object, so it goes back as ``{}`` next to its error result."""
    assistant = AssistantMessage(
        content=(
            ToolCallPart(
                tool_call_id="toolu_T", tool_name="write_file", input='{"path": "a', step=0
            ),
            ToolCallPart(
                tool_call_id="toolu_J", tool_name="write_file", input='{"path": "b"}', step=0
            ),
        )
    )
    _, messages = map_messages(None, (UserMessage(content="w"), assistant))
    assert [b["input"] for b in messages[1]["content"]] == [{}, {"path": "b"}]


def test_system_messages_join_the_instructions_and_empty_system_is_omitted():
    history = (SystemMessage(content="Use metric units."), UserMessage(content="hi"))
    assert map_messages("Be brief.", history)[0] == "Be brief.\n\nUse metric units."
    assert map_messages(None, (UserMessage(content="hi"),))[0] is None
    assert map_messages("", (UserMessage(content="hi"),))[0] is None


def test_provider_data_goes_back_only_to_anthropic():
    block = {
        "type": "server_tool_use",
        "id": "srvtoolu_1",
        "name": "web_search",
        "input": {"query": "q"},
    }
    result = {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []}
    assistant = AssistantMessage(
        content=(
            ProviderDataPart(provider="anthropic", data=block, step=0),
            ProviderDataPart(provider="anthropic", data=result, step=0),
            ProviderDataPart(provider="openai", data={"type": "web_search_call"}, step=0),
            TextPart(text="Found it.", step=0),
        )
    )
    _, messages = map_messages(None, (UserMessage(content="q"), assistant))
    assert messages[1]["content"] == [block, result, {"type": "text", "text": "Found it."}]


@tool
def get_weather(city: str, units: str = "c") -> str:
    """Current weather for a city.

    Args:
        city: The city name.
        units: ``c`` or ``f``.
    """
    return f"sunny in {city}"


def test_tools_map_to_name_description_input_schema():
    server_tool = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
    assert map_tools([get_weather, server_tool]) == [
        {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "input_schema": get_weather.parameters,
        },
        server_tool,
    ]


async def test_restored_history_is_exactly_the_request_body():
    request = make_request(
        (*three_step_history(), UserMessage(content="And Oslo?")), tools=(get_weather,)
    )
    run = await replay(
        sse_reply("text.sse"), request=request, thinking_budget=2048, max_tokens=8192
    )
    expected_messages = [*EXPECTED_THREE_STEPS, {"role": "user", "content": "And Oslo?"}]
    assert run.body == {
        "model": MODEL,
        "max_tokens": 8192,
        "system": "Be brief.",
        "messages": expected_messages,
        "tools": map_tools([get_weather]),
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "stream": True,
    }


# -- two-step runs with the shared recordings ---------------------------------------------


def to_parts(chunks: list[Any], step: int) -> list[Any]:
    """The parts an assistant message gets from one call's chunks: the test's stand-in
    for the engine and turn runner (adjacent deltas join; a signature closes reasoning)."""
    parts: list[Any] = []
    buffer: list[str] = []
    kind: str | None = None

    def flush(signature: str | None = None) -> None:
        nonlocal kind
        if kind == "text":
            parts.append(TextPart(text="".join(buffer), step=step))
        elif kind == "reasoning":
            parts.append(
                ReasoningPart(
                    text="".join(buffer), signature=signature, provider="anthropic", step=step
                )
            )
        buffer.clear()
        kind = None

    for chunk in chunks:
        if isinstance(chunk, TextChunk):
            if kind != "text":
                flush()
                kind = "text"
            buffer.append(chunk.text)
        elif isinstance(chunk, ReasoningChunk) and chunk.redacted_data is not None:
            flush()
            parts.append(
                ReasoningPart(
                    text="", redacted_data=chunk.redacted_data, provider="anthropic", step=step
                )
            )
        elif isinstance(chunk, ReasoningChunk):
            if kind != "reasoning":
                flush()
                kind = "reasoning"
            buffer.append(chunk.text)
            if chunk.signature is not None:
                flush(chunk.signature)
        elif isinstance(chunk, ToolCallChunk):
            flush()
            parts.append(
                ToolCallPart(
                    tool_call_id=chunk.tool_call_id,
                    tool_name=chunk.tool_name,
                    input=chunk.input,
                    step=step,
                )
            )
        elif isinstance(chunk, ProviderDataChunk):
            flush()
            parts.append(ProviderDataPart(provider=chunk.provider, data=chunk.data, step=step))
    flush()
    return parts


def shared(name: str) -> bytes:
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"shared fixture {name} is absent")
    return path.read_bytes()


async def two_step_run(
    step1: str, step2: str, output: Any, prompt: str, **provider_kw: Any
) -> tuple[Run, Any]:
    """Replay step 1, store its parts and the tool result as the runtime would, replay
    step 2 and return the step-2 run (with the server's second request) and the parts."""
    user = UserMessage(content=prompt)
    chunks: list[Any] = []

    async def emit(chunk: Any) -> None:
        chunks.append(chunk)

    async with loopback_server(
        Reply(body=shared(step1)), Reply(body=shared(step2), write_size=97)
    ) as server:
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY, **provider_kw)
        await provider.stream(make_request((user,), instructions=None), emit)
        parts = to_parts(chunks, step=0)
        (call,) = [p for p in parts if isinstance(p, ToolCallPart)]
        history = (
            user,
            AssistantMessage(content=tuple(parts)),
            ToolMessage(
                tool_call_id=call.tool_call_id, tool_name=call.tool_name, output=output, step=0
            ),
        )
        run = Run()
        run.server = server
        await provider.stream(make_request(history, instructions=None), run.emit)
        await provider.aclose()
    return run, parts


async def test_two_step_weather_run_pairs_tool_use_with_its_result():
    result = {"location": "San Francisco, CA", "temperature": "68°F", "condition": "Sunny"}
    run, _ = await two_step_run(
        "tool-use-step1-get-weather.sse", "tool-use-step2-answer.sse", result, "Weather in SF?"
    )
    assert run.body["messages"] == [
        {"role": "user", "content": "Weather in SF?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_018acGYLtfR52q9yDbWaEdQZ",
                    "name": "get_weather",
                    "input": {"location": "San Francisco, CA", "units": "f"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_018acGYLtfR52q9yDbWaEdQZ",
                    "content": (
                        '{"location": "San Francisco, CA", "temperature": "68°F", '
                        '"condition": "Sunny"}'
                    ),
                }
            ],
        },
    ]
    assert run.text.startswith("The weather in San Francisco, CA is currently:")
    assert run.chunks[-1] == FinishChunk(reason="stop", raw_reason="end_turn")


async def test_two_step_thinking_run_sends_the_signed_thinking_first():
    run, parts = await two_step_run(
        "thinking-tool-use-step1.sse",
        "thinking-tool-use-step2.sse",
        "0.32a0",
        "Use fixed_version, tell me the version, make a joke.",
        thinking_budget=1024,
    )
    thinking = parts[0]
    assert isinstance(thinking, ReasoningPart) and len(thinking.signature) == 524
    text = shared("thinking-tool-use-step1.sse").decode()
    assert json.dumps(thinking.signature)[1:-1] in text  # byte-identical to the recording
    assert run.body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert run.body["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": thinking.text, "signature": thinking.signature},
                {
                    "type": "tool_use",
                    "id": "toolu_01825dXWLSoJwCst1qTsiWdb",
                    "name": "fixed_version",
                    "input": {},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01825dXWLSoJwCst1qTsiWdb",
                    "content": "0.32a0",
                }
            ],
        },
    ]
    assert thinking.text.startswith("The user wants me to:\n1. Use the fixed_version tool")
    assert run.text.startswith("The version is **0.32a0**.")


# -- the SDK's OpenTelemetry span, skipped while it could do nothing ----------------------


def _count_spans_started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record each call of the SDK's ``start_api_call_span`` (and what it returned)."""
    import anthropic._base_client as base

    started: list[Any] = []
    real = base.start_api_call_span

    def counted(*args: Any, **kw: Any) -> Any:
        span = real(*args, **kw)
        started.append(span)
        return span

    monkeypatch.setattr(base, "start_api_call_span", counted)
    return started


async def _two_calls(between: Any = None) -> Run:
    """Two calls of one provider (one client); ``between()`` runs after the first."""
    run = Run()
    async with loopback_server(inline(), inline()) as server:
        run.server = server
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY)
        try:
            await provider.stream(make_request(), run.emit)
            if between is not None:
                between()
            await provider.stream(make_request(), run.emit)
        finally:
            await provider.aclose()
    return run


async def test_no_sdk_span_is_built_while_no_opentelemetry_tracer_provider_is_set(
    monkeypatch: pytest.MonkeyPatch,
):
    from opentelemetry import trace

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)  # OpenTelemetry's proxy
    started = _count_spans_started(monkeypatch)
    run = await _two_calls()
    assert started == []
    assert len(run.server.requests) == 2


async def test_the_sdk_span_is_recorded_once_a_tracer_provider_is_set_after_the_first_call(
    monkeypatch: pytest.MonkeyPatch,
):
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    started = _count_spans_started(monkeypatch)
    await _two_calls(lambda: monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider))
    assert len(started) == 1  # the second call's only
    assert len(exporter.get_finished_spans()) == 1


def propagated_parent() -> Any:
    """A sampled remote span context, as a request's ``traceparent`` brings in (trace
    ``0af7651916cd43dd8448eb211c80319c``)."""
    from opentelemetry import trace

    return trace.SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )


async def test_a_call_in_a_propagated_trace_context_still_sends_its_traceparent(
    monkeypatch: pytest.MonkeyPatch,
):
    from opentelemetry import context, trace

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    remote = propagated_parent()
    token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(remote)))
    try:
        run = await _two_calls()
    finally:
        context.detach(token)
    for sent in run.server.requests:
        assert sent.headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")


async def test_concurrent_calls_each_keep_their_own_trace_context(monkeypatch: pytest.MonkeyPatch):
    """One client serves every session; the SDK reads its tracer after an ``await`` (the
    first call's platform look-up in a thread). A call in a propagated trace still sends
    its ``traceparent`` while another, outside any trace, runs beside it."""
    from opentelemetry import context, trace

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    remote = propagated_parent()
    run = Run()

    async def traced(provider: AnthropicProvider) -> None:
        token = context.attach(trace.set_span_in_context(trace.NonRecordingSpan(remote)))
        try:
            await provider.stream(make_request(), run.emit)
        finally:
            context.detach(token)

    async with loopback_server(inline(), inline()) as server:
        provider = AnthropicProvider(MODEL, base_url=server.url, api_key=KEY)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(traced, provider)
                nursery.start_soon(provider.stream, make_request(), run.emit)
        finally:
            await provider.aclose()
    parents = [r.headers.get("traceparent") for r in server.requests]
    assert len(parents) == 2
    assert sum(1 for p in parents if p and "0af7651916cd43dd8448eb211c80319c" in p) == 1


# -- an empty tool output ------------------------------------------------------------------


def _answered(output: Any) -> dict[str, Any]:
    history = (
        UserMessage(content="go"),
        AssistantMessage(
            content=(ToolCallPart(tool_call_id="toolu_1", tool_name="t", input={}, step=0),)
        ),
        ToolMessage(tool_call_id="toolu_1", tool_name="t", output=output, step=0),
    )
    _, messages = map_messages(None, history)
    return messages[2]["content"][0]


@pytest.mark.parametrize("output", ["", " \n"], ids=["empty", "blank"])
def test_an_empty_tool_output_is_sent_as_a_placeholder_not_empty_content(output):
    from actors.providers.anthropic import EMPTY_OUTPUT

    result = _answered(output)
    assert result == {"type": "tool_result", "tool_use_id": "toolu_1", "content": EMPTY_OUTPUT}


def test_a_tool_output_with_text_is_sent_as_it_is():
    assert _answered(" 0 ")["content"] == " 0 "


async def test_a_request_after_an_empty_tool_output_has_no_empty_tool_result():
    from actors.providers.anthropic import EMPTY_OUTPUT

    history = (
        UserMessage(content="go"),
        AssistantMessage(
            content=(ToolCallPart(tool_call_id="toolu_1", tool_name="t", input={}, step=0),)
        ),
        ToolMessage(tool_call_id="toolu_1", tool_name="t", output="", step=0),
    )
    run = await replay(sse_reply("text.sse"), request=make_request(history))
    sent = run.server.requests[-1].json()["messages"][2]["content"][0]
    assert sent["content"] == EMPTY_OUTPUT


def _thought(sig: str) -> ReasoningPart:
    return ReasoningPart(text="hmm", signature=sig, provider="anthropic", step=0)


@pytest.mark.parametrize(
    ("parts", "sent"),
    [
        ((_thought("s1"),), []),  # cut between its thinking and its answer
        ((_thought("s1"), TextPart(text="so", step=0), _thought("s2")), ["thinking", "text"]),
    ],
)
def test_a_step_ending_with_thinking_is_sent_without_the_thinking_at_its_end(parts, sent):
    history = [
        UserMessage(content="hi"),
        AssistantMessage(content=parts),
        UserMessage(content="go"),
    ]
    _system, messages = map_messages(None, history)
    assert wire_rules.anthropic_errors(messages) == []
    steps = [m["content"] for m in messages if m["role"] == "assistant"]
    assert [b["type"] for step in steps for b in step] == sent
