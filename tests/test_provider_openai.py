"""The OpenAI Chat Completions provider, end to end through the real ``openai`` client.

Every stream test serves an SSE body from the loopback server (``tests.support.loopback``)
and reads it through ``AsyncOpenAI`` exactly as production does: no SDK mocks. Bodies come
from the project's own recordings (``tests/recordings/openai``, described in its README)
or are built inline with ``sse()``. The shared recorded fixtures are only used by the
two-step test at the end (skipped when they are absent) and by the conformance suite.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.providers.openai import (
    OpenAIProvider,
    classify_error,
    map_finish_reason,
    map_messages,
    map_tools,
)
from runtime.actor_messages import Batch, InferRequest, StreamFailed
from runtime.chunks import (
    FinishChunk,
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
from runtime.inbox import Inbox
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
from tests.support import provider_calls
from tests.support.loopback import Reply, loopback_server, sse
from tests.support.provider_calls import Call, call_with

REPO = Path(__file__).resolve().parents[1]
RECORDINGS = Path(__file__).resolve().parent / "recordings" / "openai"
SHARED = REPO.parent / "shared" / "fixtures" / "streams"
API_KEY = "sk-test-not-a-real-key-4242"


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch):
    """A dummy key and no ambient configuration: nothing here may reach a real server."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-dummy")
    for var in ("OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(var, raising=False)


def recording(name: str) -> bytes:
    return (RECORDINGS / name).read_bytes()


def make_request(messages=None, *, instructions=None, tools=(), settings=None) -> InferRequest:
    return provider_calls.make_request(
        tuple(messages or (UserMessage(content="hi"),)),
        tools=tuple(tools),
        instructions=instructions,
        settings=settings,
        turn_id="t1",
    )


Run = Call


async def run(*replies: Reply, request: InferRequest | None = None, **options: Any) -> Run:
    """Serve ``replies`` and make one ``provider.stream`` call against them."""
    return await call_with(
        lambda url: OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=API_KEY, **options),
        *replies,
        request=request or make_request(),
    )


async def replay(name: str, **reply: Any) -> Run:
    return await run(Reply(body=recording(name), **reply))


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any):
    """One ``chat.completion.chunk`` for inline bodies."""
    body = {
        "id": "chatcmpl-inline",
        "object": "chat.completion.chunk",
        "created": 1735689600,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }
    body.update(extra)
    return body


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    u = {"prompt_tokens": prompt, "completion_tokens": completion}
    return chunk(choices=[], usage={**u, "total_tokens": prompt + completion})


async def test_a_moderation_chunk_and_fields_it_does_not_read_leave_the_answer_whole():
    # openai 3.63's chunk: a moderation chunk with no choices, an obfuscation string;
    # then fields no SDK knows yet, on the chunk and on the delta
    moderation = {
        "input": {"type": "moderation_results", "model": "omni", "results": []},
        "output": {"type": "error", "code": "unavailable", "message": "not moderated"},
    }
    body = sse(
        chunk(choices=[], moderation=moderation),
        chunk({"role": "assistant", "content": "hi"}, obfuscation="x9"),
        chunk({"content": " there", "not_yet_invented": {"x": 1}}, not_yet_invented=[1]),
        chunk(finish="stop"),
        usage_chunk(3, 2),
    )
    result = await run(Reply(body=body))
    assert result.error is None
    assert result.text == "hi there" and result.finish.reason == "stop"


def json_reply(status: int, error: dict[str, Any], headers=()) -> Reply:
    return Reply(
        status=status,
        body=json.dumps({"error": error}).encode(),
        content_type="application/json",
        headers=headers,
    )


# -- module and configuration --------------------------------------------------------------


def test_importing_the_module_does_not_import_the_sdk():
    code = (
        "import sys, actors.providers, actors.providers.openai\n"
        "actors.providers.OpenAIProvider('gpt-4o-mini')\n"
        "bad = [m for m in ('openai', 'httpx2') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)


def test_provider_is_created_without_any_key_and_without_a_client(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    provider = OpenAIProvider("gpt-4o-mini")
    assert provider._client is None
    assert provider.provider_name == "openai"


async def test_missing_api_key_fails_as_authentication_failed_on_first_call(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    provider = OpenAIProvider("gpt-4o-mini", base_url="http://127.0.0.1:9/v1")

    async def emit(chunk: Any) -> None:
        raise AssertionError("nothing may be emitted")

    with pytest.raises(AuthenticationFailed):
        await provider.stream(make_request(), emit)


def test_describe_never_includes_the_api_key_or_option_values():
    provider = OpenAIProvider(
        "gpt-4o-mini",
        api_key=API_KEY,
        base_url="http://example.invalid/v1",
        temperature=0.2,
        extra_headers={"Authorization": "Bearer secret-header-value"},
    )
    described = provider.describe()
    assert API_KEY not in repr(described)
    assert "secret-header-value" not in repr(described)
    assert described["model"] == "gpt-4o-mini"
    assert described["options"] == ["extra_headers", "temperature"]


async def test_client_does_not_retry_a_failed_call():
    result = await run(
        json_reply(500, {"message": "boom", "type": "server_error"}),
        Reply(body=recording("text-plain.sse")),
    )
    assert isinstance(result.error, ProviderUnavailable)
    assert len(result.requests) == 1


async def test_request_streams_with_usage_tools_options_and_settings():
    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return city

    request = make_request(
        instructions="Be brief.",
        tools=[get_weather],
        settings={"max_completion_tokens": 50, "temperature": 0.9},
    )
    result = await run(Reply(body=recording("text-plain.sse")), request=request, temperature=0.1)
    body = result.body()
    assert result.requests[-1].path == "/v1/chat/completions"
    assert result.requests[-1].headers["authorization"] == f"Bearer {API_KEY}"
    assert body["model"] == "gpt-4o-mini"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.9  # the request's settings override provider options
    assert body["max_completion_tokens"] == 50
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]


async def test_extra_options_reach_the_wire_with_the_model_in_the_body():
    """The SDK's own options among the request options (``extra_headers``,
    ``extra_query``, ``extra_body``) still reach the request now that the model,
    messages and stream options go in ``extra_body`` too; an option's ``extra_body``
    adds its keys to the body."""
    result = await run(
        Reply(body=recording("text-plain.sse")),
        extra_headers={"x-trace": "t1"},
        extra_query={"tenant": "a"},
        extra_body={"top_k": 3},
    )
    sent = result.requests[-1]
    body = result.body()
    assert sent.path == "/v1/chat/completions?tenant=a"
    assert sent.headers["x-trace"] == "t1"
    assert body["model"] == "gpt-4o-mini"
    assert body["top_k"] == 3
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "user", "content": "hi"}]


async def test_a_model_class_as_response_format_is_still_refused_by_the_sdk():
    """Only a ``response_format`` given as a dict goes in ``extra_body``: a pydantic
    class among the options stays an argument, which ``create`` refuses before any
    request (it points to ``parse``), as before."""
    import pydantic

    class Answer(pydantic.BaseModel):
        text: str

    result = await run(Reply(body=recording("text-plain.sse")), response_format=Answer)
    assert result.requests == []
    assert "parse" in str(result.error)


async def test_request_omits_tools_when_there_are_none():
    result = await replay("text-plain.sse")
    assert "tools" not in result.body()


async def test_stream_options_none_omits_them_for_servers_that_reject_them():
    result = await run(Reply(body=recording("text-plain.sse")), stream_options=None)
    assert "stream_options" not in result.body()


# -- parsing the stream ----------------------------------------------------------------------


async def test_plain_text():
    result = await replay("text-plain.sse")
    assert result.error is None
    assert result.text == "Bonjour — ça va très bien 🙂."
    assert all(c.text for c in result.of(TextChunk))  # the empty delta was skipped
    assert not any(c.refusal for c in result.of(TextChunk))
    assert result.finish == FinishChunk(reason="stop", raw_reason="stop")


@pytest.mark.parametrize("write_size", [1, 7, 13])
@pytest.mark.parametrize("name", ["text-plain.sse", "tool-call-fragments.sse"])
async def test_arbitrary_tcp_splits_give_the_same_chunks(name, write_size):
    whole = await replay(name)
    split = await replay(name, write_size=write_size)
    assert split.chunks == whole.chunks
    assert split.error is None


async def test_usage_from_trailing_chunk_with_empty_choices():
    result = await replay("text-plain.sse")
    assert result.of(UsageChunk) == [
        UsageChunk(
            usage=Usage(
                input_tokens=19, output_tokens=9, total_tokens=28, cache_read=12, reasoning_tokens=0
            )
        )
    ]


async def test_usage_on_a_choice_chunk():
    result = await replay("reasoning-content.sse")
    assert result.usage == Usage(
        input_tokens=8, output_tokens=20, total_tokens=28, cache_read=0, reasoning_tokens=11
    )


async def test_usage_from_x_groq():
    result = await replay("reasoning-field.sse")
    assert result.usage == Usage(input_tokens=30, output_tokens=12, total_tokens=42)


async def test_tool_call_arguments_in_many_fragments():
    result = await replay("tool-call-fragments.sse")
    assert result.of(ToolInputStartChunk) == [
        ToolInputStartChunk(tool_call_id="call_Frag0001", tool_name="get_weather")
    ]
    fragments = ['{"', "city", '":"', "Par", "is", '","', "units", '":"', "c", '"}']
    assert [c.delta for c in result.of(ToolInputDeltaChunk)] == fragments
    assert result.calls == [
        ToolCallChunk(
            tool_call_id="call_Frag0001",
            tool_name="get_weather",
            input={"city": "Paris", "units": "c"},
        )
    ]
    assert result.finish == FinishChunk(reason="tool-calls", raw_reason="tool_calls")


async def test_tool_calls_come_only_at_the_end_after_usage():
    result = await replay("parallel-tool-calls.sse")
    kinds = [type(c) for c in result.chunks]
    last_delta = max(i for i, k in enumerate(kinds) if k is ToolInputDeltaChunk)
    usage_at = kinds.index(UsageChunk)
    call_positions = [i for i, k in enumerate(kinds) if k is ToolCallChunk]
    assert last_delta < usage_at < min(call_positions)
    assert call_positions == [len(kinds) - 3, len(kinds) - 2]
    assert kinds[-1] is FinishChunk


async def test_parallel_tool_calls():
    result = await replay("parallel-tool-calls.sse")
    assert [(c.tool_call_id, c.tool_name, c.input) for c in result.calls] == [
        ("call_ParA0001", "get_weather", {"city": "Paris"}),
        ("call_ParB0002", "get_time", {"tz": "Europe/Paris"}),
    ]
    assert [c.tool_call_id for c in result.of(ToolInputStartChunk)] == [
        "call_ParA0001",
        "call_ParB0002",
    ]


async def test_interleaved_parallel_calls_are_kept_apart_by_index():
    def call(index, **fields):
        return chunk({"tool_calls": [{"index": index, **fields}]})

    body = sse(
        call(0, id="call_1", type="function", function={"name": "a", "arguments": ""}),
        call(1, id="call_2", type="function", function={"name": "b", "arguments": '{"y"'}),
        call(0, function={"arguments": '{"x": 1'}),
        call(1, function={"arguments": ": 2}"}),
        call(0, function={"arguments": "}"}),
        chunk({}, "tool_calls"),
    )
    result = await run(Reply(body=body))
    assert [(c.tool_call_id, c.input) for c in result.calls] == [
        ("call_1", {"x": 1}),
        ("call_2", {"y": 2}),
    ]


async def test_whole_call_in_one_delta():
    result = await replay("tool-call-whole-delta.sse")
    assert [(c.tool_call_id, c.tool_name, c.input) for c in result.calls] == [
        ("call_Whole001", "search", {"query": "trio nurseries"}),
        ("call_Whole002", "search", {"query": "cancel scopes"}),
    ]
    assert [c.delta for c in result.of(ToolInputDeltaChunk)] == [
        '{"query":"trio nurseries"}',
        '{"query":"cancel scopes"}',
    ]


async def test_index_reused_for_a_new_id_starts_a_new_call():
    result = await replay("tool-call-index-reused.sse")
    assert [(c.tool_call_id, c.tool_name, c.input) for c in result.calls] == [
        ("call_Reuse001", "lookup", {"key": "alpha"}),
        ("call_Reuse002", "lookup", {"key": "beta"}),
    ]


async def test_empty_or_null_id_on_continuation_continues_the_call():
    result = await replay("tool-call-empty-id.sse")
    assert result.calls == [
        ToolCallChunk(tool_call_id="call_Empty001", tool_name="get_weather", input={"city": "Oslo"})
    ]
    assert len(result.of(ToolInputStartChunk)) == 1


async def test_a_call_without_any_id_gets_a_generated_one():
    body = sse(
        chunk({"tool_calls": [{"index": 0, "function": {"name": "ping", "arguments": "{}"}}]}),
        chunk({}, "tool_calls"),
    )
    result = await run(Reply(body=body))
    (call,) = result.calls
    assert call.tool_call_id.startswith("call_") and call.tool_name == "ping"
    assert result.of(ToolInputStartChunk)[0].tool_call_id == call.tool_call_id


async def test_empty_arguments_parse_as_an_empty_object():
    body = sse(
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "call_e", "function": {"name": "now", "arguments": ""}}
                ]
            }
        ),
        chunk({}, "tool_calls"),
    )
    result = await run(Reply(body=body))
    assert result.calls == [ToolCallChunk(tool_call_id="call_e", tool_name="now", input={})]
    assert result.of(ToolInputDeltaChunk) == []


async def test_azure_empty_choices_first_chunk_and_choice_without_delta():
    result = await replay("azure-empty-choices-first.sse")
    assert result.error is None
    assert result.text == "Copenhagen is the capital."
    assert result.finish == FinishChunk(reason="stop", raw_reason="stop")
    assert result.usage == Usage(
        input_tokens=15, output_tokens=6, total_tokens=21, cache_read=0, reasoning_tokens=0
    )


async def test_refusal_is_marked_and_finishes_as_content_filter():
    result = await replay("refusal.sse")
    refusals = result.of(TextChunk)
    assert refusals and all(c.refusal for c in refusals)
    assert result.text == "I'm sorry, I can't help with that."
    assert result.finish == FinishChunk(reason="content-filter", raw_reason="stop")


async def test_reasoning_content_field():
    result = await replay("reasoning-content.sse")
    assert result.reasoning == "The user greets me; reply briefly."
    assert {c.provider for c in result.of(ReasoningChunk)} == {"openai"}
    assert result.text == "Hi! How can I help?"
    kinds = [type(c) for c in result.chunks]
    assert kinds.index(TextChunk) > max(i for i, k in enumerate(kinds) if k is ReasoningChunk)


async def test_reasoning_field():
    result = await replay("reasoning-field.sse")
    assert result.reasoning == "Need a short answer."
    assert result.text == "Forty-two."
    assert result.finish == FinishChunk(reason="stop", raw_reason="stop")


async def test_reasoning_sent_in_both_fields_is_read_once():
    body = sse(
        chunk({"reasoning_content": "same", "reasoning": "same"}),
        chunk({"content": "ok"}, "stop"),
    )
    result = await run(Reply(body=body))
    assert result.reasoning == "same"


async def test_only_the_first_choice_is_read():
    body = sse(
        chunk(choices=[{"index": 1, "delta": {"content": "other"}, "finish_reason": None}]),
        chunk({"content": "mine"}),
        chunk(choices=[{"index": 1, "delta": {}, "finish_reason": "length"}]),
        chunk({}, "stop"),
    )
    result = await run(Reply(body=body))
    assert result.text == "mine"
    assert result.finish == FinishChunk(reason="stop", raw_reason="stop")


async def test_finish_length_marks_a_pending_tool_call_as_not_executed():
    result = await replay("length-pending-tool-call.sse")
    assert result.text == "Saving the note."
    (call,) = result.calls
    assert call.tool_call_id == "call_Trunc001" and call.tool_name == "write_file"
    assert call.input == '{"path": "/tmp/notes.txt", "text": "Dear Sir or'
    assert "truncated by the output limit" in call.input_error
    assert "not executed" in call.input_error
    assert result.finish == FinishChunk(reason="length", raw_reason="length")


async def test_invalid_json_arguments_keep_the_raw_string_and_an_input_error():
    result = await replay("invalid-json-arguments.sse")
    (call,) = result.calls
    assert call.input == '{"city": Paris}'
    assert call.input_error.startswith("invalid JSON in tool arguments: ")
    assert result.finish.reason == "tool-calls"


async def test_error_object_midstream_raises_after_what_came_before():
    result = await replay("error-object-midstream.sse")
    assert result.text == "The answer is"
    assert not result.of(FinishChunk)
    assert isinstance(result.error, ProviderUnavailable)
    assert result.error.provider == "openai"
    assert "server had an error" in result.error.message


async def test_error_event_midstream_raises_classified():
    result = await replay("error-event-midstream.sse")
    assert result.text == "Let me think"
    assert not result.of(FinishChunk)
    assert isinstance(result.error, RateLimited)
    assert result.error.retryable


async def test_stream_cut_without_finish_is_malformed():
    result = await replay("cut-no-finish.sse")
    assert result.text == "Once upon a time"
    assert isinstance(result.error, MalformedStream)
    assert not result.of(FinishChunk)


async def test_done_without_any_finish_reason_is_malformed():
    body = sse(chunk({"content": "half"}), usage_chunk(3, 1))
    result = await run(Reply(body=body))
    assert isinstance(result.error, MalformedStream)


async def test_undecodable_data_is_malformed():
    body = sse(chunk({"content": "ok"})).replace(b"data: [DONE]", b"data: {not json")
    result = await run(Reply(body=body))
    assert result.text == "ok"
    assert isinstance(result.error, MalformedStream)


# -- HTTP and transport failures --------------------------------------------------------------


async def test_http_429_with_retry_after_is_rate_limited():
    reply = json_reply(
        429,
        {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"},
        headers=[("retry-after", "3")],
    )
    result = await run(reply)
    assert isinstance(result.error, RateLimited)
    assert result.error.retry_after == 3.0
    assert result.error.status_code == 429
    assert result.error.retryable
    assert result.error.message == "Rate limit reached"


async def test_http_429_retry_after_ms_wins():
    reply = json_reply(
        429,
        {"message": "slow down", "type": "requests"},
        headers=[("retry-after-ms", "1500"), ("retry-after", "9")],
    )
    result = await run(reply)
    assert isinstance(result.error, RateLimited)
    assert result.error.retry_after == 1.5


async def test_http_429_insufficient_quota_is_not_retryable():
    reply = json_reply(
        429, {"message": "quota", "type": "insufficient_quota", "code": "insufficient_quota"}
    )
    result = await run(reply)
    assert isinstance(result.error, RateLimited)
    assert not result.error.retryable


async def test_http_401_is_authentication_failed():
    result = await run(
        json_reply(401, {"message": "Incorrect API key", "type": "invalid_request_error"})
    )
    assert isinstance(result.error, AuthenticationFailed)
    assert result.error.status_code == 401
    assert not result.error.retryable


async def test_http_403_is_authentication_failed():
    result = await run(json_reply(403, {"message": "not allowed", "type": "permission_error"}))
    assert isinstance(result.error, AuthenticationFailed)


async def test_http_500_is_provider_unavailable():
    result = await run(json_reply(500, {"message": "internal", "type": "server_error"}))
    assert isinstance(result.error, ProviderUnavailable)
    assert result.error.status_code == 500
    assert result.error.retryable


async def test_http_529_is_overloaded():
    result = await run(json_reply(529, {"message": "Overloaded", "type": "overloaded_error"}))
    assert isinstance(result.error, Overloaded)


async def test_http_400_context_length_exceeded_is_context_too_long():
    error = {
        "message": "This model's maximum context length is 128000 tokens.",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
    result = await run(json_reply(400, error))
    assert isinstance(result.error, ContextTooLong)
    assert result.error.status_code == 400


async def test_http_400_other_is_bad_request():
    result = await run(json_reply(400, {"message": "bad tools", "type": "invalid_request_error"}))
    assert type(result.error) is BadRequest


async def test_connection_dropped_mid_body_is_connection_lost():
    body = recording("text-plain.sse")
    cut = body.index(" très bien".encode()) + 4  # inside the third content event
    result = await run(Reply(body=body, drop_after=cut, write_size=64))
    assert isinstance(result.error, ConnectionLost)
    assert result.error.retryable
    assert result.text == "Bonjour — ça va"
    assert not result.of(FinishChunk)


async def test_connection_refused_is_connection_lost():
    with socket.socket() as s:  # a port with nothing listening on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    provider = OpenAIProvider("m", base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY)

    async def emit(chunk: Any) -> None:
        raise AssertionError(chunk)

    with pytest.raises(ConnectionLost):
        await provider.stream(make_request(), emit)
    await provider.aclose()


async def test_no_data_within_the_timeout_is_provider_timeout():
    result = await run(Reply(body=recording("text-plain.sse"), stall=5.0), timeout=0.3)
    assert isinstance(result.error, ProviderTimeout)


async def test_cancelling_mid_stream_stops_the_call_promptly():
    body = recording("tool-call-fragments.sse")
    async with loopback_server(Reply(body=body, write_size=200, delay=0.05)) as server:
        provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key=API_KEY)
        chunks: list[Any] = []
        with trio.CancelScope() as scope:

            async def emit(chunk: Any) -> None:
                chunks.append(chunk)
                if isinstance(chunk, ToolInputDeltaChunk):
                    scope.cancel()

            with trio.fail_after(5):
                await provider.stream(make_request(), emit)
        await provider.aclose()
    assert scope.cancelled_caught
    assert not any(isinstance(c, (ToolCallChunk, FinishChunk)) for c in chunks)


def test_map_finish_reason():
    assert map_finish_reason("stop") == "stop"
    assert map_finish_reason("tool_calls") == "tool-calls"
    assert map_finish_reason("function_call") == "tool-calls"
    assert map_finish_reason("length") == "length"
    assert map_finish_reason("content_filter") == "content-filter"
    assert map_finish_reason("eos") == "other"
    assert map_finish_reason(None) == "other"


def test_classify_error_passes_axon_errors_through():
    err = BadRequest("x", provider="openai")
    assert classify_error(err) is err
    assert isinstance(classify_error(RuntimeError("?")), ProviderError)


async def test_actor_sends_chunks_then_finish_in_batches():
    async with loopback_server(Reply(body=recording("parallel-tool-calls.sse"))) as server:
        provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key=API_KEY)
        request = make_request()
        request.reply = Inbox(1024)
        await provider.serve(request)
        await provider.aclose()
    items: list[Any] = []
    batches: list[Any] = []
    request.reply.drain_nowait(batches)
    for batch in batches:
        assert isinstance(batch, Batch) and batch.tag == "req-1"
        items.extend(batch)
    assert isinstance(items[-1], FinishChunk)
    assert [c.tool_call_id for c in items if isinstance(c, ToolCallChunk)] == [
        "call_ParA0001",
        "call_ParB0002",
    ]


async def test_actor_reports_a_failed_call_as_stream_failed():
    reply = json_reply(429, {"message": "slow", "type": "requests"}, headers=[("retry-after", "2")])
    async with loopback_server(reply) as server:
        provider = OpenAIProvider("m", base_url=server.url + "/v1", api_key=API_KEY)
        request = make_request()
        await provider.serve(request)
        await provider.aclose()
    batches: list[Any] = []
    request.reply.drain_nowait(batches)
    last = batches[-1][-1]
    assert isinstance(last, StreamFailed)
    assert isinstance(last.error, RateLimited) and last.error.retry_after == 2.0


# -- restoration -----------------------------------------------------------------------------


def history() -> list[Any]:
    """A turn of three steps: reasoning + text + call A; call B + bad call C; final text."""
    return [
        UserMessage(content="Weather and time in Paris?"),
        AssistantMessage(
            content=(
                ReasoningPart(text="Weather first.", step=0, provider="openai"),
                TextPart(text="Checking the weather.", step=0),
                ToolCallPart(
                    tool_call_id="call_A", tool_name="get_weather", input={"city": "Paris"}, step=0
                ),
                ReasoningPart(text="Now the ", step=1, provider="openai"),
                ReasoningPart(text="signed", signature="sig==", step=1, provider="anthropic"),
                ReasoningPart(text="", redacted_data="opaque", step=1, provider="anthropic"),
                ReasoningPart(text="time.", step=1, provider="openai"),
                TextPart(text="  \n", step=1),
                ToolCallPart(
                    tool_call_id="call_B",
                    tool_name="get_time",
                    input={"tz": "Europe/Paris"},
                    step=1,
                ),
                ToolCallPart(
                    tool_call_id="call_C", tool_name="get_time", input='{"tz": Paris', step=1
                ),
                ProviderDataPart(provider="anthropic", data={"type": "server_tool_use"}, step=1),
                TextPart(text="Sunny, ", step=2),
                TextPart(text="and it is noon.", step=2, refusal=False),
            )
        ),
        # results saved in call order; the mapping must not depend on it either way
        ToolMessage(tool_call_id="call_B", tool_name="get_time", step=1, output={"time": "12:00"}),
        ToolMessage(tool_call_id="call_A", tool_name="get_weather", step=0, output="sunny, 24 °C"),
        ToolMessage(
            tool_call_id="call_C",
            tool_name="get_time",
            step=1,
            error="invalid JSON in tool arguments",
        ),
        UserMessage(content="Thanks!"),
    ]


def expected_messages(*, reasoning: bool) -> list[dict[str, Any]]:
    step0: dict[str, Any] = {
        "role": "assistant",
        "content": "Checking the weather.",
        "tool_calls": [
            {
                "id": "call_A",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    step1: dict[str, Any] = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_B",
                "type": "function",
                "function": {"name": "get_time", "arguments": '{"tz": "Europe/Paris"}'},
            },
            {
                "id": "call_C",
                "type": "function",
                "function": {"name": "get_time", "arguments": '{"tz": Paris'},
            },
        ],
    }
    if reasoning:
        step0["reasoning_content"] = "Weather first."
        step1["reasoning_content"] = "Now the time."
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather and time in Paris?"},
        step0,
        {"role": "tool", "tool_call_id": "call_A", "content": "sunny, 24 °C"},
        step1,
        {"role": "tool", "tool_call_id": "call_B", "content": '{"time": "12:00"}'},
        {"role": "tool", "tool_call_id": "call_C", "content": "invalid JSON in tool arguments"},
        {"role": "assistant", "content": "Sunny, and it is noon."},
        {"role": "user", "content": "Thanks!"},
    ]


def test_map_messages_splits_steps_and_pairs_results():
    assert map_messages("Be brief.", history()) == expected_messages(reasoning=False)


def test_map_messages_sends_unsigned_reasoning_content_only_when_asked():
    mapped = map_messages("Be brief.", history(), send_reasoning_content=True)
    assert mapped == expected_messages(reasoning=True)


@pytest.mark.parametrize("reasoning", [False, True])
async def test_restored_history_is_what_the_server_receives(reasoning):
    request = make_request(history(), instructions="Be brief.")
    result = await run(
        Reply(body=recording("text-plain.sse")), request=request, send_reasoning_content=reasoning
    )
    assert result.body()["messages"] == expected_messages(reasoning=reasoning)


def test_a_repaired_history_sends_the_interrupted_result_as_a_tool_message():
    messages = [
        SystemMessage(content="sys"),
        UserMessage(content="go"),
        AssistantMessage(
            content=(ToolCallPart(tool_call_id="call_X", tool_name="slow", input={}, step=0),),
            interrupted=True,
        ),
        ToolMessage(tool_call_id="call_Z", tool_name="ghost", step=0, output="orphan"),
        UserMessage(content="again"),
    ]
    assert map_messages(None, repair(messages)) == [  # the runner repairs before sending
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_X",
                    "type": "function",
                    "function": {"name": "slow", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_X", "content": INTERRUPTED},
        {"role": "user", "content": "again"},
    ]


def test_a_step_with_nothing_to_send_is_omitted():
    messages = [
        UserMessage(content="q"),
        AssistantMessage(
            content=(
                ReasoningPart(text="thinking only", step=0, provider="openai"),
                TextPart(text="answer", step=1),
            )
        ),
    ]
    assert map_messages(None, messages) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "answer"},
    ]


def test_refusal_text_is_sent_back_as_content():
    messages = [
        UserMessage(content="q"),
        AssistantMessage(content=(TextPart(text="I can't help.", step=0, refusal=True),)),
    ]
    assert map_messages(None, messages)[-1] == {"role": "assistant", "content": "I can't help."}


def test_map_tools_uses_the_tool_spec():
    @tool
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    assert map_tools([add]) == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": add.parameters,
            },
        }
    ]


# -- a two-step run on the shared recorded fixtures -------------------------------------------

STEP1 = SHARED / "openai" / "chat-tool-call-step1-get-capital.sse"
STEP2 = SHARED / "openai" / "chat-tool-call-step2-answer.sse"


@pytest.mark.skipif(not (STEP1.exists() and STEP2.exists()), reason="shared fixtures absent")
async def test_two_step_tool_run_on_recorded_fixtures():
    @tool
    def get_capital(country: str) -> str:
        """The capital of a country."""
        return "London"

    prompt = "What is the capital of the UK? Use the tool, then answer."
    user = UserMessage(content=prompt)
    first = await run(
        Reply(body=STEP1.read_bytes(), write_size=97),
        request=make_request([user], tools=[get_capital]),
    )
    (call,) = first.calls
    assert (call.tool_call_id, call.tool_name, call.input) == (
        "call_ZR5UUuTt3pf61kjwAJIYdVMj",
        "get_capital",
        {"country": "UK"},
    )
    assert first.finish.reason == "tool-calls"

    assistant = AssistantMessage(
        content=(
            ToolCallPart(
                tool_call_id=call.tool_call_id, tool_name=call.tool_name, input=call.input, step=0
            ),
        )
    )
    result = ToolMessage(
        tool_call_id=call.tool_call_id, tool_name=call.tool_name, step=0, output="London"
    )
    second = await run(
        Reply(body=STEP2.read_bytes(), write_size=97),
        request=make_request([user, assistant, result], tools=[get_capital]),
    )
    assert second.body()["messages"] == [
        {"role": "user", "content": prompt},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_ZR5UUuTt3pf61kjwAJIYdVMj",
                    "type": "function",
                    "function": {"name": "get_capital", "arguments": '{"country": "UK"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_ZR5UUuTt3pf61kjwAJIYdVMj", "content": "London"},
    ]
    assert second.text == "The capital of the UK is London."
    assert second.finish == FinishChunk(reason="stop", raw_reason="stop")
    assert second.usage == Usage(
        input_tokens=78, output_tokens=9, total_tokens=87, cache_read=0, reasoning_tokens=0
    )


async def test_model_messages_and_tools_given_as_extra_body_make_the_same_request_body():
    """``as_body`` (the model, the messages or input items, the tools, the stream options
    and the other members the providers build, handed to the SDK as ``extra_body``,
    which it does not walk against its request types) sends the same JSON object the
    named arguments do, every member with its value, an ``extra_body`` of the options
    kept: for Chat Completions and for the Responses API."""
    import openai

    from actors.providers.openai import BODY_KEYS
    from actors.providers.openai_common import as_body, body_keys
    from actors.providers.openai_responses import BODY_KEYS as RESPONSES_KEYS

    http = next(sys.modules[m] for m in ("httpx2", "httpx") if m in sys.modules)
    bodies: list[bytes] = []

    def answer(request: Any) -> Any:
        bodies.append(request.content)
        return http.Response(400, json={"error": {"message": "recorded"}})

    client = openai.AsyncOpenAI(
        api_key="k",
        base_url="http://test/v1",
        max_retries=0,
        http_client=http.AsyncClient(transport=http.MockTransport(answer)),
    )
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, image]},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.5,
        "extra_body": {"top_k": 3},
    }
    for given in (chat, as_body(chat, body_keys(client, BODY_KEYS))):
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(**given)
    said = {"type": "output_text", "text": "x", "annotations": []}
    responses = {
        "model": "m",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "message", "role": "assistant", "content": [said]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "r"},
        ],
        "store": False,
        "instructions": "s",
        "tools": [{"type": "function", "name": "f", "parameters": {}, "strict": False}],
        "include": ["reasoning.encrypted_content"],
        "text": {"format": {"type": "json_schema", "name": "a", "schema": {}, "strict": True}},
        "stream": True,
        "extra_body": {"top_k": 3},
    }
    for given in (responses, as_body(responses, body_keys(client, RESPONSES_KEYS))):
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(**given)
    await client.close()
    sent = [json.loads(body) for body in bodies]
    assert len(sent) == 4 and sent[0] == sent[1] and sent[2] == sent[3]
    assert sent[1]["model"] == sent[3]["model"] == "m"
    assert sent[1]["messages"] == chat["messages"]
    assert sent[3]["input"] == responses["input"]
    assert sent[3]["text"] == responses["text"] and sent[3]["store"] is False


def test_the_model_is_given_to_the_sdk_in_the_body_not_as_an_argument_it_walks():
    """The model goes in ``extra_body``, its argument ``NOT_GIVEN``: the SDK's walk of
    the arguments against its request types skips it (its type, a union with a
    ``Literal`` of every model name, cost about 60 us a call to walk)."""
    import openai

    from actors.providers.openai import BODY_KEYS
    from actors.providers.openai_common import as_body, body_keys

    client = openai.AsyncOpenAI(api_key="k", base_url="http://test/v1")
    given = as_body({"model": "m", "messages": [], "stream": True}, body_keys(client, BODY_KEYS))
    assert given["model"] is openai.NOT_GIVEN
    assert given["extra_body"]["model"] == "m"


async def test_an_azure_client_is_given_the_model_it_routes_by():
    """An Azure client reads the ``model`` argument to name the deployment in the URL,
    before the body is merged: :func:`body_keys` leaves the model an argument there."""
    import openai

    from actors.providers.openai import BODY_KEYS
    from actors.providers.openai_common import as_body, body_keys

    http = next(sys.modules[m] for m in ("httpx2", "httpx") if m in sys.modules)
    urls: list[str] = []

    def answer(request: Any) -> Any:
        urls.append(str(request.url))
        return http.Response(400, json={"error": {"message": "recorded"}})

    client = openai.AsyncAzureOpenAI(
        api_key="k",
        api_version="2024-10-21",
        azure_endpoint="http://test",
        max_retries=0,
        http_client=http.AsyncClient(transport=http.MockTransport(answer)),
    )
    params = {"model": "deployed", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(**as_body(params, body_keys(client, BODY_KEYS)))
    await client.close()
    assert urls and "/deployments/deployed/chat/completions" in urls[0]


# -- call ids a Mistral server takes -------------------------------------------------------

MISTRAL_ID = r"[a-zA-Z0-9]{9}"


def _foreign_history() -> tuple[Any, ...]:
    """Calls with OpenAI's, Anthropic's and Mistral's ids, and an empty one."""
    ids = ["call_Zx81QpLm2rT5vWy9bCd3", "toolu_01A09q90qw90lq917835lq9", "AbC123xyZ", ""]
    calls = tuple(ToolCallPart(tool_call_id=i, tool_name="t", input={}, step=0) for i in ids)
    results = tuple(ToolMessage(tool_call_id=i, tool_name="t", output="ok", step=0) for i in ids)
    return (UserMessage(content="go"), AssistantMessage(content=calls), *results)


def _sent_ids(messages: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    calls = [c["id"] for m in messages for c in m.get("tool_calls", ())]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    return calls, answered


def test_mistral_call_ids_are_nine_letters_and_digits_paired_and_unique():
    import re

    calls, answered = _sent_ids(map_messages(None, _foreign_history(), call_ids="mistral"))
    assert calls == answered  # each result names its call
    assert all(re.fullmatch(MISTRAL_ID, i) for i in calls)
    assert len(set(calls)) == 4
    assert calls[2] == "AbC123xyZ"  # Mistral's own id goes back as it came


def test_mistral_call_ids_are_the_same_for_the_same_history():
    first = map_messages(None, _foreign_history(), call_ids="mistral")
    assert map_messages(None, _foreign_history(), call_ids="mistral") == first


def test_a_mistral_id_made_from_a_digest_never_takes_an_id_the_history_holds(monkeypatch):
    from actors.providers import openai as chat

    made = chat._nine
    monkeypatch.setattr(
        chat, "_nine", lambda raw, salt: "AbC123xyZ" if salt == 0 else made(raw, salt)
    )
    calls, answered = _sent_ids(map_messages(None, _foreign_history(), call_ids="mistral"))
    assert calls == answered and len(set(calls)) == 4
    assert calls.count("AbC123xyZ") == 1 and calls[2] == "AbC123xyZ"


def test_openai_call_ids_stay_as_they_are():
    calls, _ = _sent_ids(map_messages(None, _foreign_history()))
    assert calls[:3] == ["call_Zx81QpLm2rT5vWy9bCd3", "toolu_01A09q90qw90lq917835lq9", "AbC123xyZ"]


def test_an_endpoint_on_mistral_ai_takes_mistral_call_ids_unless_told_otherwise():
    assert OpenAIProvider("m", base_url="https://api.mistral.ai/v1").call_ids == "mistral"
    assert OpenAIProvider("m", base_url="https://api.openai.com/v1").call_ids == "openai"
    assert OpenAIProvider("m", base_url="https://notmistral.ai/v1").call_ids == "openai"
    told = OpenAIProvider("m", base_url="https://api.mistral.ai/v1", call_ids="openai")
    assert told.call_ids == "openai"


def test_an_unknown_call_id_shape_is_a_configuration_error():
    from runtime.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        OpenAIProvider("m", call_ids="uuid")  # type: ignore[arg-type]


async def test_a_provider_told_mistral_sends_a_foreign_history_with_mistral_ids():
    import re

    result = await run(
        Reply(body=recording("text-plain.sse")),
        request=make_request(_foreign_history()),
        call_ids="mistral",
    )
    calls, answered = _sent_ids(result.body()["messages"])
    assert calls == answered and all(re.fullmatch(MISTRAL_ID, i) for i in calls)
