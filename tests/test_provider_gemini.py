"""The Gemini provider against the real ``google-genai`` client and a loopback server.

Every stream test replays an SSE body (one of our own recordings in
``tests/recordings/google``, written from the SDK's types, or one built inline) through
the SDK's HTTP stack, so what is tested is exactly what production parses. Restoration
tests assert ``map_messages`` and the request body the server received. No SDK mocks,
no network, dummy keys.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.providers.gemini import (
    SIGNATURE_SENTINEL,
    TOOL_MEDIA_PLACEHOLDER,
    GeminiProvider,
    classify_error,
    map_finish_reason,
    map_messages,
    map_tools,
    validates_signatures,
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
    ConnectionLost,
    ContextTooLong,
    MalformedStream,
    Overloaded,
    ProviderError,
    ProviderTimeout,
    ProviderUnavailable,
    RateLimited,
    UnsupportedMedia,
)
from runtime.history import INTERRUPTED, Origin, repair
from runtime.messages import (
    AssistantMessage,
    Image,
    ProviderDataPart,
    ReasoningPart,
    SystemMessage,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.output_schema import output_schema
from runtime.tools import tool
from tests.recordings.google.generate import signature
from tests.support.loopback import Reply, loopback_server
from tests.support.provider_calls import (
    Run,
    cancel_after_first_chunk,
    make_request,
    replay_with,
    served_items,
)

RECORDINGS = Path(__file__).parent / "recordings" / "google"
MODEL = "gemini-2.5-flash"
KEY = "AIza-test-not-a-real-key-0123456789"
PATH = f"/v1/models/{MODEL}:streamGenerateContent?alt=sse"


def recording(name: str) -> bytes:
    return (RECORDINGS / name).read_bytes()


def wire(sig: str) -> str:
    """How the SDK sends a signature back: the same bytes, URL-safe base64."""
    return base64.urlsafe_b64encode(base64.b64decode(sig)).decode()


async def replay(
    *replies: Reply,
    request: InferRequest | None = None,
    expect_error: bool = False,
    model: str = MODEL,
    **provider_kw: Any,
) -> Run:
    return await replay_with(
        lambda url: GeminiProvider(model, base_url=url, api_key=KEY, **provider_kw),
        *replies,
        request=request,
        expect_error=expect_error,
    )


def sse_reply(name: str, **kw: Any) -> Reply:
    return Reply(body=recording(name), **kw)


def json_error(status: int, word: str, message: str, details=(), headers=()) -> Reply:
    error = {"code": status, "message": message, "status": word}
    if details:
        error["details"] = list(details)
    return Reply(
        status=status,
        body=json.dumps({"error": error}).encode(),
        content_type="application/json",
        headers=headers,
    )


def inline(*chunks: dict[str, Any]) -> Reply:
    return Reply(body="".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks).encode())


def candidate(parts: list[dict[str, Any]] | None, finish: str | None = None) -> dict:
    cand: dict[str, Any] = {"index": 0}
    if parts is not None:
        cand["content"] = {"role": "model", "parts": parts}
    if finish is not None:
        cand["finishReason"] = finish
    return {"candidates": [cand], "modelVersion": MODEL}


# -- text, ordering, framing ------------------------------------------------------------


async def test_text_parts_become_text_chunks_as_they_arrive():
    run = await replay(sse_reply("text.sse"))
    assert [c.text for c in run.of(TextChunk)] == ["Hello", ", wor", "ld! It is 21°C."]


async def test_usage_then_finish_are_the_last_two_chunks():
    run = await replay(sse_reply("text.sse"))
    assert run.chunks[-2:] == [
        UsageChunk(usage=Usage(input_tokens=8, output_tokens=9, total_tokens=17)),
        FinishChunk(reason="stop", raw_reason="STOP"),
    ]


async def test_the_request_goes_to_stream_generate_content_with_the_key_header():
    run = await replay(sse_reply("text.sse"))
    request = run.server.requests[0]
    assert (request.method, request.path) == ("POST", PATH)
    assert request.headers["x-goog-api-key"] == KEY


async def test_seven_byte_writes_give_the_same_chunks():
    whole = await replay(sse_reply("thought-summary.sse"))
    cut = await replay(sse_reply("thought-summary.sse", write_size=7))
    assert cut.chunks == whole.chunks


async def test_thought_parts_are_reasoning_and_the_signed_text_part_keeps_its_signature():
    run = await replay(sse_reply("thought-summary.sse"))
    assert run.chunks[:5] == [
        ReasoningChunk(text="**Adding numbers**\n\nThe user asks for 2+2.", provider="google"),
        ReasoningChunk(text=" That is 4.", provider="google"),
        TextChunk(text="2 + 2 = "),
        TextChunk(text="4"),
        ProviderDataChunk(
            provider="google", data={"thought_signature": signature(1), "of": "text"}
        ),
    ]


async def test_thought_tokens_count_as_output_and_as_reasoning():
    run = await replay(sse_reply("thought-summary.sse"))
    assert run.of(UsageChunk)[0].usage == Usage(
        input_tokens=12, output_tokens=46, total_tokens=58, reasoning_tokens=40
    )


async def test_a_signed_function_call_is_a_complete_call_then_its_signature():
    run = await replay(sse_reply("function-call-signed.sse"))
    start, delta, call, signed = run.chunks[1:5]
    assert isinstance(start, ToolInputStartChunk) and start.tool_name == "get_weather"
    assert start.tool_call_id.startswith("gcall_")  # the API gave no id: ours
    assert delta == ToolInputDeltaChunk(tool_call_id=start.tool_call_id, delta='{"city": "Paris"}')
    assert call == ToolCallChunk(
        tool_call_id=start.tool_call_id, tool_name="get_weather", input={"city": "Paris"}
    )
    assert signed == ProviderDataChunk(
        provider="google", data={"thought_signature": signature(2), "of": "function_call"}
    )
    assert run.chunks[-1] == FinishChunk(reason="tool-calls", raw_reason="STOP")


async def test_parallel_calls_keep_their_ids_and_only_the_first_is_signed():
    run = await replay(sse_reply("parallel-function-calls.sse"))
    calls = run.of(ToolCallChunk)
    assert [(c.tool_call_id, c.tool_name, c.input) for c in calls] == [
        ("fc-1a2b", "get_weather", {"city": "Paris"}),
        ("fc-3c4d", "get_time", {"tz": "Europe/Paris"}),
    ]
    kinds = [type(c).__name__ for c in run.chunks]
    assert kinds.index("ProviderDataChunk") == kinds.index("ToolCallChunk") + 1
    assert len(run.of(ProviderDataChunk)) == 1


async def test_a_signature_on_an_empty_text_part_is_kept_as_such():
    run = await replay(sse_reply("signature-empty-part.sse"))
    assert run.text == "The capital of France is Paris."
    assert run.of(ProviderDataChunk) == [
        ProviderDataChunk(
            provider="google", data={"thought_signature": signature(4), "of": "empty"}
        )
    ]


async def test_code_execution_parts_are_kept_verbatim_as_provider_data():
    run = await replay(sse_reply("code-execution.sse"))
    assert [c.data for c in run.of(ProviderDataChunk)] == [
        {"executable_code": {"code": "print(sum(range(1, 101)))", "language": "PYTHON"}},
        {"code_execution_result": {"outcome": "OUTCOME_OK", "output": "5050\n"}},
    ]
    assert run.text == "The sum is 5050."


async def test_only_the_first_candidate_is_read():
    second = {"index": 1, "content": {"role": "model", "parts": [{"text": "other"}]}}
    first = candidate([{"text": "mine"}], "STOP")
    first["candidates"].append(second)
    run = await replay(inline(first))
    assert run.text == "mine"


@pytest.mark.parametrize(
    ("raw", "calls", "reason"),
    [
        ("STOP", False, "stop"),
        ("STOP", True, "tool-calls"),
        ("MAX_TOKENS", False, "length"),
        ("SAFETY", False, "content-filter"),
        ("RECITATION", False, "content-filter"),
        ("PROHIBITED_CONTENT", False, "content-filter"),
        ("MALFORMED_FUNCTION_CALL", False, "error"),
        ("MISSING_THOUGHT_SIGNATURE", False, "error"),
        ("LANGUAGE", False, "other"),
        ("SOMETHING_NEW", False, "other"),
        (None, False, "other"),
    ],
)
def test_finish_reason_mapping(raw, calls, reason):
    assert map_finish_reason(raw, tool_calls=calls) == reason


async def test_max_tokens_finishes_with_length():
    run = await replay(sse_reply("max-tokens.sse"))
    assert run.chunks[-1] == FinishChunk(reason="length", raw_reason="MAX_TOKENS")
    assert run.of(UsageChunk)[0].usage.reasoning_tokens == 250


async def test_a_safety_stop_finishes_with_content_filter_after_the_text():
    run = await replay(sse_reply("safety.sse"))
    assert run.text == "I can"
    assert run.chunks[-1] == FinishChunk(reason="content-filter", raw_reason="SAFETY")


async def test_a_blocked_prompt_finishes_with_content_filter_and_no_text():
    run = await replay(sse_reply("prompt-blocked.sse"))
    assert run.of(TextChunk) == []
    assert run.chunks[-1] == FinishChunk(reason="content-filter", raw_reason="PROHIBITED_CONTENT")


async def test_a_malformed_function_call_finishes_with_error():
    run = await replay(sse_reply("malformed-function-call.sse"))
    assert run.chunks[-1] == FinishChunk(reason="error", raw_reason="MALFORMED_FUNCTION_CALL")


# -- errors -----------------------------------------------------------------------------


async def test_an_error_object_mid_stream_raises_overloaded_after_the_text():
    run = await replay(sse_reply("overloaded-midstream.sse"), expect_error=True)
    *texts, billed = run.chunks
    assert [c.text for c in texts] == ["Partial ", "answer"]
    assert billed.usage.input_tokens == 6  # the chunks' usage, counted (branch leftmix)
    assert isinstance(run.error, Overloaded) and run.error.retryable
    assert (run.error.status_code, run.error.provider) == (503, "google")


async def test_http_429_is_rate_limited_with_the_retry_info_delay():
    retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}
    reply = json_error(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota", [retry])
    run = await replay(reply, expect_error=True)
    assert isinstance(run.error, RateLimited) and run.error.retryable
    assert (run.error.retry_after, run.error.status_code) == (37.0, 429)


async def test_http_429_without_retry_info_reads_retry_after():
    reply = json_error(429, "RESOURCE_EXHAUSTED", "slow down", headers=[("retry-after", "4")])
    run = await replay(reply, expect_error=True)
    assert isinstance(run.error, RateLimited) and run.error.retry_after == 4.0


async def test_http_503_overloaded_is_overloaded():
    reply = json_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")
    run = await replay(reply, expect_error=True)
    assert isinstance(run.error, Overloaded) and run.error.status_code == 503


async def test_http_500_is_provider_unavailable():
    reply = json_error(500, "INTERNAL", "An internal error has occurred.")
    run = await replay(reply, expect_error=True)
    assert type(run.error) is ProviderUnavailable and run.error.retryable


async def test_http_400_invalid_argument_is_bad_request():
    reply = json_error(
        400,
        "INVALID_ARGUMENT",
        "Function call is missing a thought_signature in functionCall parts.",
    )
    run = await replay(reply, expect_error=True)
    assert type(run.error) is BadRequest and not run.error.retryable
    assert "thought_signature" in run.error.message


async def test_http_400_input_over_the_window_is_context_too_long():
    reply = json_error(
        400,
        "INVALID_ARGUMENT",
        "The input token count (1048577) exceeds the maximum number of tokens allowed (1048576).",
    )
    run = await replay(reply, expect_error=True)
    assert isinstance(run.error, ContextTooLong)


async def test_http_403_is_authentication_failed_without_the_key():
    reply = json_error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers.")
    run = await replay(reply, expect_error=True)
    assert isinstance(run.error, AuthenticationFailed) and not run.error.retryable
    assert KEY not in str(run.error)


async def test_connection_dropped_mid_body_is_connection_lost():
    body = recording("text.sse")
    cut = body.index(b"data:", 10) + 20  # inside the second event
    run = await replay(sse_reply("text.sse", drop_after=cut), expect_error=True)
    assert isinstance(run.error, ConnectionLost) and run.error.retryable
    assert run.text == "Hello"  # what arrived before the drop was emitted


async def test_a_stream_without_a_finish_reason_is_malformed():
    run = await replay(sse_reply("cut-no-finish.sse"), expect_error=True)
    assert isinstance(run.error, MalformedStream) and "finishReason" in str(run.error)
    assert run.text == "Never finished" and run.of(FinishChunk) == []


async def test_broken_json_in_a_chunk_is_malformed():
    body = recording("text.sse").replace(b'"text": ", wor"', b'"text": ", wor')
    run = await replay(Reply(body=body), expect_error=True)
    assert isinstance(run.error, MalformedStream) and run.error.retryable
    assert run.text == "Hello"


async def test_no_next_chunk_within_the_timeout_is_provider_timeout():
    run = await replay(
        sse_reply("text.sse", stall=5, stall_after=40), expect_error=True, timeout=0.3
    )
    assert isinstance(run.error, ProviderTimeout) and run.error.retryable


async def test_cancelling_the_request_stops_the_stream_promptly():
    slow = sse_reply("text.sse", write_size=40, delay=0.05)
    request, chunks = await cancel_after_first_chunk(
        lambda url: GeminiProvider(MODEL, base_url=url, api_key=KEY), slow
    )
    assert request.cancel_scope.cancelled_caught
    assert chunks == [TextChunk(text="Hello")]


async def test_a_failure_reaches_the_requester_as_stream_failed():
    """Through the actor path: chunks first, then StreamFailed as the last item."""
    items = await served_items(
        lambda url: GeminiProvider(MODEL, base_url=url, api_key=KEY),
        sse_reply("overloaded-midstream.sse"),
    )
    names = [type(i).__name__ for i in items]  # (the usage billed before the failure too)
    assert names == ["TextChunk", "TextChunk", "UsageChunk", "StreamFailed"]
    assert isinstance(items[-1], StreamFailed) and isinstance(items[-1].error, Overloaded)


def test_classify_error_covers_sdk_and_transport_errors():
    import httpx2
    from google.genai import errors as genai_errors

    assert isinstance(classify_error(httpx2.ReadTimeout("slow")), ProviderTimeout)
    assert isinstance(classify_error(httpx2.RemoteProtocolError("cut")), ConnectionLost)
    assert isinstance(classify_error(json.JSONDecodeError("bad", "{", 1)), MalformedStream)
    unreadable = genai_errors.UnknownApiResponseError("Failed to parse response as JSON.")
    assert isinstance(classify_error(unreadable), MalformedStream)
    in_stream = genai_errors.APIError(None, {"error": {"code": 429, "status": "X"}})
    assert isinstance(classify_error(in_stream), RateLimited)
    same = Overloaded("already classified")
    assert classify_error(same) is same
    other = classify_error(RuntimeError("boom"))
    assert type(other) is ProviderError and other.provider == "google"
    assert "RuntimeError: boom" in str(other)


def test_a_google_status_word_classifies_an_error_without_an_http_status():
    from google.genai import errors as genai_errors

    exhausted = genai_errors.APIError(0, {"error": {"status": "RESOURCE_EXHAUSTED"}})
    assert isinstance(classify_error(exhausted), RateLimited)
    unavailable = genai_errors.APIError(0, {"error": {"status": "UNAVAILABLE"}})
    assert isinstance(classify_error(unavailable), ProviderUnavailable)


async def test_a_call_with_no_key_anywhere_is_authentication_failed(monkeypatch):
    for variable in GeminiProvider.key_env:
        monkeypatch.delenv(variable, raising=False)
    provider = GeminiProvider(MODEL, base_url="http://127.0.0.1:9")
    with pytest.raises(AuthenticationFailed, match="GOOGLE_API_KEY or GEMINI_API_KEY"):
        await provider.stream(make_request(), Run().emit)


async def test_the_key_is_read_from_the_environment_at_the_first_call(monkeypatch):
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    async with loopback_server(sse_reply("text.sse")) as server:
        provider = GeminiProvider(MODEL, base_url=server.url)
        await provider.stream(make_request(), Run().emit)
        await provider.aclose()
    assert server.requests[0].headers["x-goog-api-key"] == KEY


# -- configuration -----------------------------------------------------------------------


def test_importing_the_module_does_not_import_the_sdk():
    code = (
        "import sys, actors.providers.gemini as m; "
        "p = m.GeminiProvider('gemini-2.5-flash'); "
        "assert 'google.genai' not in sys.modules, 'SDK imported'; "
        "assert 'httpx2' not in sys.modules, 'HTTP client imported'"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)


def test_describe_never_includes_the_key():
    provider = GeminiProvider(MODEL, api_key=KEY, thinking_budget=512, temperature=0.2)
    description = provider.describe()
    assert KEY not in repr(description)
    assert (description["provider"], description["model"]) == ("google", MODEL)
    assert description["options"] == ["temperature"]
    assert description["settings"] == {
        "include_thoughts": True,
        "thinking_budget": 512,
        "foreign_reasoning": "drop",
    }


def test_the_origin_is_the_default_endpoint_or_the_base_url(monkeypatch):
    monkeypatch.delenv("GOOGLE_GEMINI_BASE_URL", raising=False)
    assert GeminiProvider(MODEL).origin == Origin(
        provider="google", model=MODEL, endpoint="https://generativelanguage.googleapis.com"
    )
    monkeypatch.setenv("GOOGLE_GEMINI_BASE_URL", "https://proxy.example/")
    assert GeminiProvider(MODEL).origin.endpoint == "https://proxy.example"


async def test_request_options_and_call_settings_reach_the_body():
    request = make_request(settings={"temperature": 0.1, "candidate_count": 1})
    run = await replay(
        sse_reply("text.sse"),
        request=request,
        temperature=0.9,
        max_output_tokens=256,
        thinking_budget=1024,
        brand_new_field={"x": 1},
    )
    config = run.body["generationConfig"]
    assert config["temperature"] == 0.1  # the call's settings win over the provider's
    assert config["maxOutputTokens"] == 256 and config["candidateCount"] == 1
    assert config["thinkingConfig"] == {"include_thoughts": True, "thinking_budget": 1024}
    assert run.body["brand_new_field"] == {"x": 1}  # unknown to the SDK: sent as it is
    assert run.body["systemInstruction"] == {"parts": [{"text": "Be brief."}], "role": "user"}


async def test_no_thoughts_asked_for_when_include_thoughts_is_off():
    run = await replay(sse_reply("text.sse"), include_thoughts=False)
    assert "thinkingConfig" not in run.body.get("generationConfig", {})


@pytest.mark.parametrize(
    ("model", "validates"),
    [
        ("gemini-2.5-flash", False),
        ("gemini-3-pro-preview", True),
        ("models/gemini-3.1-flash", True),
        ("gemini-10-ultra", True),
        ("tunedModels/abc", False),
    ],
)
def test_which_models_validate_signatures(model, validates):
    assert validates_signatures(model) is validates


# -- restoration: messages -> contents ----------------------------------------------------

SIG_A, SIG_B = signature(7), signature(8)


def three_step_history() -> tuple[Any, ...]:
    assistant = AssistantMessage(
        content=(
            ReasoningPart(text="I should look it up.", step=0, provider="google"),
            ToolCallPart(
                tool_call_id="gcall_x_1", tool_name="get_weather", input={"city": "Paris"}, step=0
            ),
            ProviderDataPart(
                provider="google", data={"thought_signature": SIG_A, "of": "function_call"}, step=0
            ),
            TextPart(text="Paris is sunny; now Tokyo.", step=1),
            ToolCallPart(
                tool_call_id="fc-9", tool_name="get_weather", input={"city": "Tokyo"}, step=1
            ),
            TextPart(text="Both are sunny.", step=2),
            ProviderDataPart(
                provider="google", data={"thought_signature": SIG_B, "of": "text"}, step=2
            ),
        )
    )
    return (
        UserMessage(content="Weather in Paris and Tokyo?"),
        assistant,
        ToolMessage(
            tool_call_id="gcall_x_1", tool_name="get_weather", output="sunny, 21°C", step=0
        ),
        ToolMessage(tool_call_id="fc-9", tool_name="get_weather", output={"sky": "clear"}, step=1),
    )


EXPECTED_THREE_STEPS = [
    {"role": "user", "parts": [{"text": "Weather in Paris and Tokyo?"}]},
    {
        "role": "model",
        "parts": [
            {"text": "I should look it up.", "thought": True},
            {
                "function_call": {"name": "get_weather", "args": {"city": "Paris"}},
                "thought_signature": SIG_A,
            },
        ],
    },
    {
        "role": "user",
        "parts": [
            {"function_response": {"name": "get_weather", "response": {"output": "sunny, 21°C"}}}
        ],
    },
    {
        "role": "model",
        "parts": [
            {"text": "Paris is sunny; now Tokyo."},
            {"function_call": {"name": "get_weather", "args": {"city": "Tokyo"}, "id": "fc-9"}},
        ],
    },
    {
        "role": "user",
        "parts": [
            {
                "function_response": {
                    "name": "get_weather",
                    "response": {"output": {"sky": "clear"}},
                    "id": "fc-9",
                }
            }
        ],
    },
    {"role": "model", "parts": [{"text": "Both are sunny.", "thought_signature": SIG_B}]},
]


def test_three_step_history_is_split_per_step_with_signatures_in_place():
    system, contents = map_messages("Be brief.", three_step_history())
    assert system == "Be brief."
    assert contents == EXPECTED_THREE_STEPS


def test_a_signature_of_an_empty_part_goes_back_on_an_empty_part():
    data = {"thought_signature": SIG_A, "of": "empty"}
    assistant = AssistantMessage(
        content=(
            TextPart(text="Paris.", step=0),
            ProviderDataPart(provider="google", data=data, step=0),
        )
    )
    _, contents = map_messages(None, (UserMessage(content="q"), assistant))
    assert contents[1]["parts"] == [{"text": "Paris."}, {"text": "", "thought_signature": SIG_A}]


def test_a_signed_thought_goes_back_as_a_signed_thought():
    assistant = AssistantMessage(
        content=(
            ReasoningPart(text="plan", signature=SIG_A, step=0, provider="google"),
            TextPart(text="ok", step=0),
        )
    )
    _, contents = map_messages(None, (UserMessage(content="q"), assistant))
    assert contents[1]["parts"][0] == {"text": "plan", "thought": True, "thought_signature": SIG_A}


def test_the_interrupted_result_of_a_repaired_history_is_an_error_response():
    assistant = AssistantMessage(
        content=(ToolCallPart(tool_call_id="fc-X", tool_name="slow", input={}, step=0),),
        interrupted=True,
    )
    history = (UserMessage(content="go"), assistant, UserMessage(content="still there?"))
    _, contents = map_messages(None, repair(history))  # the runner repairs before sending
    assert contents[2:] == [
        {
            "role": "user",
            "parts": [
                {
                    "function_response": {
                        "name": "slow",
                        "response": {"error": INTERRUPTED},
                        "id": "fc-X",
                    }
                }
            ],
        },
        {"role": "user", "parts": [{"text": "still there?"}]},
    ]


def _roles(contents: list[dict]) -> list[str]:
    return [c["role"] for c in contents]


def test_function_responses_then_a_steered_message_stay_two_user_contents():
    calls = (
        ToolCallPart(tool_call_id="fc-1", tool_name="a", input={}, step=0),
        ToolCallPart(tool_call_id="fc-2", tool_name="b", input={}, step=0),
    )
    history = (
        UserMessage(content="go"),
        AssistantMessage(content=calls),
        ToolMessage(tool_call_id="fc-1", tool_name="a", output="A", step=0),
        ToolMessage(tool_call_id="fc-2", tool_name="b", output="B", step=0),
        UserMessage(content="use metric units"),  # steered in while the tools ran
    )
    _, contents = map_messages(None, history)
    # Gemini refuses function responses mixed with text in one content
    assert _roles(contents) == ["user", "model", "user", "user"]
    assert [next(iter(p)) for p in contents[2]["parts"]] == ["function_response"] * 2
    assert contents[3] == {"role": "user", "parts": [{"text": "use metric units"}]}


def test_a_user_message_after_a_steered_one_joins_it_not_the_function_responses():
    history = (
        UserMessage(content="go"),
        AssistantMessage(
            content=(ToolCallPart(tool_call_id="fc-1", tool_name="a", input={}, step=0),)
        ),
        ToolMessage(tool_call_id="fc-1", tool_name="a", output="A", step=0),
        UserMessage(content="one"),
        UserMessage(content="two"),
    )
    _, contents = map_messages(None, history)
    assert _roles(contents) == ["user", "model", "user", "user"]
    assert contents[3]["parts"] == [{"text": "one"}, {"text": "two"}]


def test_two_user_messages_in_a_row_are_one_content_in_order():
    history = (UserMessage(content="one"), UserMessage(content="two"))
    _, contents = map_messages(None, history)
    assert contents == [{"role": "user", "parts": [{"text": "one"}, {"text": "two"}]}]


def test_two_assistant_messages_in_a_row_are_one_model_content_in_order():
    history = (
        UserMessage(content="q"),
        AssistantMessage(content=(TextPart(text="first", step=0),)),
        AssistantMessage(content=(TextPart(text="second", step=0),)),
        UserMessage(content="and?"),
    )
    _, contents = map_messages(None, history)
    assert _roles(contents) == ["user", "model", "user"]
    assert contents[1]["parts"] == [{"text": "first"}, {"text": "second"}]


def test_unparsed_tool_input_is_sent_as_an_empty_object():
    assistant = AssistantMessage(
        content=(
            ToolCallPart(tool_call_id="fc-T", tool_name="w", input='{"path": "a', step=0),
            ToolCallPart(tool_call_id="fc-J", tool_name="w", input='{"path": "b"}', step=0),
        )
    )
    _, contents = map_messages(None, (UserMessage(content="w"), assistant))
    assert [p["function_call"]["args"] for p in contents[1]["parts"]] == [{}, {"path": "b"}]


def test_system_messages_join_the_instructions():
    history = (SystemMessage(content="Use metric units."), UserMessage(content="hi"))
    assert map_messages("Be brief.", history)[0] == "Be brief.\n\nUse metric units."
    assert map_messages(None, (UserMessage(content="hi"),))[0] is None


def test_reasoning_and_provider_data_of_another_model_are_dropped_or_sent_as_text():
    assistant = AssistantMessage(
        content=(
            ReasoningPart(text="old plan", step=0, provider="google", model="gemini-a"),
            ReasoningPart(text="Claude's plan", signature="s", step=0, provider="anthropic"),
            ToolCallPart(tool_call_id="fc-1", tool_name="f", input={}, step=0),
            ProviderDataPart(
                provider="google",
                data={"thought_signature": SIG_A, "of": "function_call"},
                step=0,
                model="gemini-a",
            ),
        )
    )
    history = (UserMessage(content="q"), assistant)
    target = Origin(provider="google", model="gemini-b")
    _, contents = map_messages(None, history, origin=target)
    assert contents[1]["parts"] == [{"function_call": {"name": "f", "args": {}, "id": "fc-1"}}]
    _, contents = map_messages(None, history, origin=target, foreign_reasoning="text")
    assert [p.get("text") for p in contents[1]["parts"][:2]] == [
        "<think>old plan</think>",
        "<think>Claude's plan</think>",
    ]


def test_the_sentinel_signs_the_first_unsigned_call_of_each_current_step_only():
    old = AssistantMessage(
        content=(ToolCallPart(tool_call_id="fc-0", tool_name="f", input={}, step=0),)
    )
    current = AssistantMessage(
        content=(
            ToolCallPart(tool_call_id="fc-1", tool_name="f", input={}, step=0),
            ToolCallPart(tool_call_id="fc-2", tool_name="f", input={}, step=0),
            ToolCallPart(tool_call_id="fc-3", tool_name="f", input={}, step=1),
        )
    )
    history = repair([UserMessage(content="a"), old, UserMessage(content="b"), current])
    _, contents = map_messages(None, history, sentinel=True)
    signed = [
        [p.get("thought_signature") for p in c["parts"]] for c in contents if c["role"] == "model"
    ]
    sentinel = base64.urlsafe_b64encode(base64.b64decode(signed[1][0])).decode()
    assert sentinel == SIGNATURE_SENTINEL
    assert signed == [[None], [signed[1][0], None], [signed[1][0]]]


async def test_the_sentinel_reaches_the_wire_verbatim_for_a_gemini_3_model():
    current = AssistantMessage(
        content=(ToolCallPart(tool_call_id="fc-1", tool_name="f", input={}, step=0),)
    )
    history = repair([UserMessage(content="a"), current])
    run = await replay(
        sse_reply("text.sse"), request=make_request(history), model="gemini-3-pro-preview"
    )
    assert run.body["contents"][1]["parts"][0]["thoughtSignature"] == SIGNATURE_SENTINEL


def test_provider_data_parts_go_back_verbatim_only_to_gemini():
    code = {"executable_code": {"code": "print(1)", "language": "PYTHON"}}
    assistant = AssistantMessage(
        content=(
            ProviderDataPart(provider="google", data=code, step=0),
            ProviderDataPart(provider="openai", data={"type": "web_search_call"}, step=0),
            TextPart(text="1", step=0),
        )
    )
    _, contents = map_messages(None, (UserMessage(content="q"), assistant))
    assert contents[1]["parts"] == [code, {"text": "1"}]


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8


def test_images_are_inline_data_or_file_data_and_a_gif_is_refused():
    look = TextPart(text="look", step=0)
    content = (look, Image(data=PNG), Image(url="https://example.com/cat.jpg"))
    _, contents = map_messages(None, (UserMessage(content=content),))
    assert contents[0]["parts"] == [
        {"text": "look"},
        {"inline_data": {"mime_type": "image/png", "data": base64.b64encode(PNG).decode()}},
        {"file_data": {"mime_type": "image/jpeg", "file_uri": "https://example.com/cat.jpg"}},
    ]
    gif = Image(data=b"GIF89a" + b"\x00" * 10)
    with pytest.raises(UnsupportedMedia, match="Gemini cannot take image/gif images"):
        map_messages(None, (UserMessage(content=(gif,)),))


def test_an_image_a_tool_returned_becomes_a_placeholder_in_its_response():
    assistant = AssistantMessage(
        content=(ToolCallPart(tool_call_id="fc-1", tool_name="chart", input={}, step=0),)
    )
    result = ToolMessage(
        tool_call_id="fc-1",
        tool_name="chart",
        output=(TextPart(text="sales", step=0), Image(data=PNG)),
        step=0,
    )
    _, contents = map_messages(None, (UserMessage(content="q"), assistant, result))
    response = contents[2]["parts"][0]["function_response"]["response"]
    placeholder = TOOL_MEDIA_PLACEHOLDER.format(kind="image", media_type="image/png")
    assert response == {"output": f"sales\n{placeholder}"}


@tool
def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
        city: The city name.
    """
    return f"sunny in {city}"


def test_tools_map_to_one_declaration_list_and_built_ins_pass_through():
    assert map_tools([get_weather, {"google_search": {}}]) == [
        {
            "function_declarations": [
                {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters_json_schema": get_weather.parameters,
                }
            ]
        },
        {"google_search": {}},
    ]


async def test_restored_history_is_exactly_the_request_body():
    request = make_request(
        (*three_step_history(), UserMessage(content="And Oslo?")), tools=(get_weather,)
    )
    run = await replay(sse_reply("text.sse"), request=request)

    def on_wire(content: dict) -> dict:  # camelCase keys, URL-safe base64
        parts = []
        for part in content["parts"]:
            out = {}
            for key, value in part.items():
                if key == "thought_signature":
                    out["thoughtSignature"] = wire(value)
                elif key == "function_call":
                    out["functionCall"] = value
                elif key == "function_response":
                    out["functionResponse"] = value
                else:
                    out[key] = value
            parts.append(out)
        return {"parts": parts, "role": content["role"]}

    expected = [*EXPECTED_THREE_STEPS, {"role": "user", "parts": [{"text": "And Oslo?"}]}]
    assert run.body["contents"] == [on_wire(c) for c in expected]
    assert run.body["tools"] == [
        {
            "functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters_json_schema": get_weather.parameters,
                }
            ]
        }
    ]


# -- structured output --------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}


async def test_without_tools_structured_output_asks_for_json_mode():
    output = output_schema(SCHEMA)
    run = await replay(
        inline(candidate([{"text": '{"city": "Paris"}'}], "STOP")),
        request=make_request(output=output),
    )
    config = run.body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == SCHEMA
    assert run.text == '{"city": "Paris"}'


async def test_with_tools_the_answer_comes_as_the_output_function_streamed_as_text():
    output = output_schema(SCHEMA)
    call = {"functionCall": {"name": "final_output", "args": {"city": "Paris"}}}
    run = await replay(
        inline(candidate([call], "STOP")),
        request=make_request(tools=(get_weather,), output=output),
    )
    declared = run.body["tools"][0]["functionDeclarations"]
    assert [d["name"] for d in declared] == ["get_weather", "final_output"]
    assert run.body["toolConfig"] == {"functionCallingConfig": {"mode": "ANY"}}
    assert run.text == '{"city": "Paris"}' and run.of(ToolCallChunk) == []
    assert run.chunks[-1] == FinishChunk(reason="stop", raw_reason="STOP")


# -- the rate limiter hears what Gemini says --------------------------------------------


def limited(url: str) -> GeminiProvider:
    """A provider with a rate limit, its limiter in this process (a host sets one)."""
    from runtime.ratelimit import Limiter, MemoryBackend, RateLimit

    provider = GeminiProvider(
        MODEL, base_url=url, api_key=KEY, rate_limit=RateLimit(requests_per_minute=100)
    )
    backend = MemoryBackend()
    provider.limiter = Limiter(provider.limit_key, provider.rate_limit, backend, backend.clock)
    return provider


async def pause_of(provider: GeminiProvider) -> Any:
    """What the limiter answers the next caller of this configuration."""
    import trio

    limiter = provider.limiter
    return await limiter.backend.try_acquire(
        limiter.key, limiter.limit, trio.current_time(), "probe", 0
    )


async def serve_limited(reply: Reply) -> tuple[list[Any], GeminiProvider]:
    made: list[GeminiProvider] = []

    def make(url: str) -> GeminiProvider:
        made.append(limited(url))
        return made[0]

    items = await served_items(make, reply)
    return items, made[0]


async def test_a_429_with_retry_info_pauses_every_caller_for_the_delay():
    retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "37s"}
    reply = json_error(429, "RESOURCE_EXHAUSTED", "You exceeded your current quota", [retry])
    items, provider = await serve_limited(reply)
    (failed,) = [i for i in items if isinstance(i, StreamFailed)]
    assert isinstance(failed.error, RateLimited) and failed.error.retry_after == 37.0
    verdict = await pause_of(provider)
    assert verdict.reason == "provider" and verdict.wait == pytest.approx(37, abs=1)


async def test_a_429_with_only_retry_after_pauses_for_it():
    reply = json_error(429, "RESOURCE_EXHAUSTED", "slow down", headers=[("retry-after", "12")])
    _, provider = await serve_limited(reply)
    verdict = await pause_of(provider)
    assert verdict.reason == "provider" and verdict.wait == pytest.approx(12, abs=1)


async def test_a_resource_exhausted_error_inside_the_stream_pauses_for_its_retry_info():
    retry = {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"}
    error = {"code": 429, "message": "quota", "status": "RESOURCE_EXHAUSTED", "details": [retry]}
    reply = inline(candidate([{"text": "Partial"}]), {"error": error})
    items, provider = await serve_limited(reply)
    (failed,) = [i for i in items if isinstance(i, StreamFailed)]
    assert isinstance(failed.error, RateLimited) and failed.error.retry_after == 1.5
    verdict = await pause_of(provider)
    assert verdict.reason == "provider" and verdict.wait == pytest.approx(1.5, abs=0.5)


async def test_a_retry_after_on_a_streamed_answer_pauses_the_next_call():
    reply = Reply(body=recording("text.sse"), headers=[("retry-after", "20")])
    items, provider = await serve_limited(reply)
    assert not [i for i in items if isinstance(i, StreamFailed)]
    verdict = await pause_of(provider)
    assert verdict.reason == "provider" and verdict.wait == pytest.approx(20, abs=1)


async def test_without_a_word_from_the_api_nothing_is_paused():
    _, provider = await serve_limited(sse_reply("text.sse"))
    assert (await pause_of(provider)).granted
