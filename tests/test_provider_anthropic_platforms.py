"""Claude on Vertex AI and on Bedrock, through the ``anthropic`` SDK's own clients
(``AsyncAnthropicVertex``, ``AsyncAnthropicBedrock``) and a loopback server replaying each
platform's wire format: Vertex's SSE (Anthropic's events) under its project/region URL,
Bedrock's AWS event-stream binary frames (``tests/support/eventstream.py``) under its
``/model/<id>/invoke-with-response-stream`` URL, signed with SigV4 from dummy AWS keys
(boto3 signs locally; nothing leaves the machine).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.providers import anthropic
from actors.providers.anthropic import AnthropicBedrockProvider, AnthropicVertexProvider
from actors.providers.anthropic_platforms import BEDROCK_STREAM_ERRORS
from actors.providers.registry import create_provider
from runtime.chunks import FinishChunk, ReasoningChunk, TextChunk, ToolCallChunk
from runtime.errors import (
    AuthenticationFailed,
    BadRequest,
    ConfigurationError,
    ConnectionLost,
    ContextTooLong,
    MalformedStream,
    Overloaded,
    ProviderUnavailable,
    RateLimited,
)
from runtime.history import Origin
from runtime.messages import AssistantMessage, ReasoningPart, TextPart, UserMessage
from runtime.provider import ProviderOptions
from tests.support.eventstream import bedrock_stream, exception, message
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
)
from tests.support.provider_calls import Run, make_request, replay_with
from tests.test_provider_e2e import an_text, an_thinking, an_tool

TOKEN = "ya29.test-not-a-real-access-token"
AWS_KEY, AWS_SECRET = "AKIDEXAMPLE0123456789", "aws-secret-test-not-real-0123456789"
BEDROCK_KEY = "ABSK-test-not-a-real-bedrock-key"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
BEDROCK_MODEL = "anthropic.claude-sonnet-4-5-20250929-v1:0"
EVENTSTREAM = "application/vnd.amazon.eventstream"


def answer(*blocks: dict[str, Any], stop: str = "end_turn") -> list[dict[str, Any]]:
    return [anthropic_start(), *blocks, *anthropic_end(stop)]


THINKING_ANSWER = answer(*an_thinking(0, "plan", "SIG-1"), *an_text(1, "hello from the cloud"))


async def replay(
    make: Any, *replies: Reply, request: Any = None, expect_error: bool = False
) -> Run:
    return await replay_with(make, *replies, request=request, expect_error=expect_error)


def vertex(url: str, **kw: Any) -> AnthropicVertexProvider:
    return AnthropicVertexProvider(
        VERTEX_MODEL,
        base_url=url,
        region="us-east5",
        project_id="axon-test",
        access_token=TOKEN,
        **kw,
    )


def bedrock(url: str, **kw: Any) -> AnthropicBedrockProvider:
    kw.setdefault("aws_access_key", AWS_KEY)
    kw.setdefault("aws_secret_key", AWS_SECRET)
    return AnthropicBedrockProvider(BEDROCK_MODEL, base_url=url, region="us-east-1", **kw)


def frames(*events: dict[str, Any], tail: bytes = b"", **kw: Any) -> Reply:
    return Reply(body=bedrock_stream(*events) + tail, content_type=EVENTSTREAM, **kw)


# -- Vertex AI ------------------------------------------------------------------------------


async def test_vertex_streams_thinking_and_text_from_its_sse():
    run = await replay(vertex, Reply(body=anthropic_sse(*THINKING_ANSWER)))
    assert run.chunks[:3] == [
        ReasoningChunk(text="plan", provider="anthropic"),
        ReasoningChunk(signature="SIG-1", provider="anthropic"),
        TextChunk(text="hello from the cloud"),
    ]
    assert run.chunks[-1] == FinishChunk(reason="stop", raw_reason="end_turn")


async def test_vertex_posts_to_the_models_stream_raw_predict_with_the_bearer_token():
    run = await replay(vertex, Reply(body=anthropic_sse(*THINKING_ANSWER)))
    request = run.request
    assert request.path == (
        f"/projects/axon-test/locations/us-east5/publishers/anthropic/models/"
        f"{VERTEX_MODEL}:streamRawPredict"
    )
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    body = request.json()
    assert "model" not in body and body["stream"] is True and body["anthropic_version"]
    assert body["messages"] == [{"role": "user", "content": "Hi"}]


async def test_vertex_google_style_429_is_rate_limited_and_tagged_with_the_platform():
    error = {
        "code": 429,
        "message": "Quota exceeded for aiplatform",
        "status": "RESOURCE_EXHAUSTED",
    }
    reply = Reply(
        status=429, body=json.dumps({"error": error}).encode(), content_type="application/json"
    )
    run = await replay(vertex, reply, expect_error=True)
    assert isinstance(run.error, RateLimited) and run.error.retryable
    assert (run.error.status_code, run.error.provider) == (429, "anthropic-vertex")
    assert "Quota exceeded" in run.error.message


async def test_vertex_overloaded_event_mid_stream_is_overloaded_after_the_text():
    events = [anthropic_start(), *an_text(0, "Partial")]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    body = anthropic_sse(*events) + b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n"
    run = await replay(vertex, Reply(body=body), expect_error=True)
    assert run.text == "Partial"
    assert isinstance(run.error, Overloaded) and run.error.provider == "anthropic-vertex"


async def test_vertex_connection_dropped_mid_stream_is_connection_lost():
    body = anthropic_sse(*THINKING_ANSWER)
    run = await replay(vertex, Reply(body=body, drop_after=len(body) // 2), expect_error=True)
    assert isinstance(run.error, ConnectionLost) and run.error.provider == "anthropic-vertex"


async def test_vertex_without_a_region_is_a_configuration_error(monkeypatch):
    monkeypatch.delenv("CLOUD_ML_REGION", raising=False)
    provider = AnthropicVertexProvider(VERTEX_MODEL, project_id="p", access_token=TOKEN)
    with pytest.raises(ConfigurationError, match="region"):
        await provider.stream(make_request(), Run().emit)


def test_vertex_origin_is_the_regional_endpoint_with_anthropics_tag(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_VERTEX_BASE_URL", raising=False)
    provider = AnthropicVertexProvider(VERTEX_MODEL, region="europe-west1")
    assert provider.origin == Origin(
        provider="anthropic",
        model=VERTEX_MODEL,
        endpoint="https://europe-west1-aiplatform.googleapis.com/v1",
    )
    assert AnthropicVertexProvider(VERTEX_MODEL, region="global").endpoint == (
        "https://aiplatform.googleapis.com/v1"
    )


def test_vertex_builds_from_options_and_never_describes_its_token():
    provider = create_provider("anthropic-vertex", ProviderOptions(api_key=TOKEN))
    assert isinstance(provider, AnthropicVertexProvider) and provider.model == VERTEX_MODEL
    described = provider.describe()
    assert described["provider"] == "anthropic-vertex" and TOKEN not in repr(described)


# -- Bedrock --------------------------------------------------------------------------------


async def test_bedrock_decodes_its_event_stream_frames():
    run = await replay(bedrock, frames(*THINKING_ANSWER))
    assert run.chunks[:3] == [
        ReasoningChunk(text="plan", provider="anthropic"),
        ReasoningChunk(signature="SIG-1", provider="anthropic"),
        TextChunk(text="hello from the cloud"),
    ]
    assert run.chunks[-1] == FinishChunk(reason="stop", raw_reason="end_turn")


async def test_bedrock_frames_cut_into_small_writes_give_the_same_chunks():
    whole = await replay(bedrock, frames(*THINKING_ANSWER))
    cut = await replay(bedrock, frames(*THINKING_ANSWER, write_size=13))
    assert cut.chunks == whole.chunks


async def test_bedrock_tool_use_streams_through_the_frames():
    events = answer(*an_tool(0, "toolu_B1", "k"), stop="tool_use")
    run = await replay(bedrock, frames(*events))
    (call,) = [c for c in run.chunks if isinstance(c, ToolCallChunk)]
    assert (call.tool_call_id, call.input) == ("toolu_B1", {"key": "k"})
    assert run.chunks[-1] == FinishChunk(reason="tool-calls", raw_reason="tool_use")


async def test_bedrock_signs_with_sigv4_and_puts_the_model_in_the_url():
    run = await replay(bedrock, frames(*THINKING_ANSWER))
    request = run.request
    assert request.path == f"/model/{BEDROCK_MODEL}/invoke-with-response-stream"
    auth = request.headers["authorization"]
    assert auth.startswith(f"AWS4-HMAC-SHA256 Credential={AWS_KEY}/")
    assert "/us-east-1/bedrock/aws4_request" in auth and AWS_SECRET not in auth
    body = request.json()
    assert "model" not in body and "stream" not in body and body["anthropic_version"]


async def test_bedrock_asks_for_interleaved_thinking_in_the_body():
    # Bedrock reads betas from the body's anthropic_beta (the SDK moves the header there)
    run = await replay(
        lambda url: bedrock(url, thinking_budget=1024, max_tokens=2048, interleaved_thinking=True),
        frames(*THINKING_ANSWER),
    )
    assert run.request.json()["anthropic_beta"] == ["interleaved-thinking-2025-05-14"]


async def test_bedrock_api_key_is_sent_as_a_bearer_token():
    def make(url: str) -> AnthropicBedrockProvider:
        return AnthropicBedrockProvider(
            BEDROCK_MODEL, base_url=url, region="us-east-1", api_key=BEDROCK_KEY
        )

    run = await replay(make, frames(*THINKING_ANSWER))
    assert run.request.headers["authorization"] == f"Bearer {BEDROCK_KEY}"


@pytest.mark.parametrize(
    ("name", "expected", "status"),
    [
        ("throttlingException", RateLimited, 429),
        ("serviceUnavailableException", ProviderUnavailable, 503),
        ("internalServerException", ProviderUnavailable, 500),
        ("modelStreamErrorException", ProviderUnavailable, 500),
        ("validationException", BadRequest, 400),
    ],
)
async def test_a_bedrock_error_frame_mid_stream_is_classified_by_its_exception(
    name, expected, status
):
    events = [anthropic_start(), *an_text(0, "Partial")]
    run = await replay(
        bedrock, frames(*events, tail=exception(name, "went wrong")), expect_error=True
    )
    assert run.text == "Partial"
    assert type(run.error) is expected
    assert (run.error.status_code, run.error.provider) == (status, "anthropic-bedrock")


async def test_bedrock_http_429_is_rate_limited():
    reply = Reply(
        status=429,
        body=b'{"message":"Too many requests, please wait before trying again."}',
        content_type="application/json",
        headers=[("x-amzn-errortype", "ThrottlingException:http://internal.amazon.com/")],
    )
    run = await replay(bedrock, reply, expect_error=True)
    assert isinstance(run.error, RateLimited) and run.error.provider == "anthropic-bedrock"


async def test_bedrock_input_too_long_is_context_too_long():
    reply = Reply(
        status=400,
        body=b'{"message":"Input is too long for requested model."}',
        content_type="application/json",
    )
    run = await replay(bedrock, reply, expect_error=True)
    assert isinstance(run.error, ContextTooLong)


async def test_a_frame_with_a_bad_checksum_is_malformed():
    good = bedrock_stream(*THINKING_ANSWER[:2])
    bad = bytearray(
        message({":event-type": "chunk", ":message-type": "event"}, b'{"bytes":"e30="}')
    )
    bad[-1] ^= 0xFF
    run = await replay(
        bedrock, Reply(body=good + bytes(bad), content_type=EVENTSTREAM), expect_error=True
    )
    assert isinstance(run.error, MalformedStream) and run.error.provider == "anthropic-bedrock"


async def test_a_bedrock_stream_cut_before_message_stop_is_malformed():
    run = await replay(bedrock, frames(*THINKING_ANSWER[:-1]), expect_error=True)
    assert isinstance(run.error, MalformedStream) and "message_stop" in str(run.error)


async def test_bedrock_without_credentials_is_authentication_failed(monkeypatch, tmp_path):
    for variable in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_BEARER_TOKEN_BEDROCK",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask an instance (network)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))

    def make(url: str) -> AnthropicBedrockProvider:
        return AnthropicBedrockProvider(BEDROCK_MODEL, base_url=url, region="us-east-1")

    run = await replay(make, frames(*THINKING_ANSWER), expect_error=True)
    assert isinstance(run.error, AuthenticationFailed) and not run.error.retryable
    assert run.server.requests == []


async def test_bedrock_without_a_region_is_a_configuration_error(monkeypatch, tmp_path):
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    provider = AnthropicBedrockProvider(BEDROCK_MODEL, api_key=BEDROCK_KEY)
    with pytest.raises(ConfigurationError, match="region"):
        await provider.stream(make_request(), Run().emit)


def test_bedrock_stream_errors_have_the_service_models_statuses():
    """The table is botocore's ``bedrock-runtime`` model, but for the one exception it
    documents as retryable (see :data:`BEDROCK_STREAM_ERRORS`)."""
    from botocore.loaders import Loader
    from botocore.model import ServiceModel

    model = ServiceModel(Loader().load_service_model("bedrock-runtime", "service-2"))
    operation = model.operation_model("InvokeModelWithResponseStream")
    statuses = {
        shape.name[0].lower() + shape.name[1:]: shape.metadata["error"]["httpStatusCode"]
        for shape in operation.error_shapes
    }
    for name, status in BEDROCK_STREAM_ERRORS.items():
        expected = 500 if name == "modelStreamErrorException" else statuses[name]
        assert status == expected, name


def test_bedrock_origin_is_the_regional_runtime_endpoint(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_BEDROCK_BASE_URL", raising=False)
    provider = AnthropicBedrockProvider(BEDROCK_MODEL, region="eu-west-3")
    assert provider.origin == Origin(
        provider="anthropic",
        model=BEDROCK_MODEL,
        endpoint="https://bedrock-runtime.eu-west-3.amazonaws.com",
    )


def test_bedrock_describe_shows_neither_key_nor_secret():
    provider = AnthropicBedrockProvider(
        BEDROCK_MODEL, region="us-east-1", aws_access_key=AWS_KEY, aws_secret_key=AWS_SECRET
    )
    described = repr(provider.describe())
    assert AWS_SECRET not in described and "anthropic-bedrock" in described


# -- the signature bound to its platform -----------------------------------------------------


def signed_history(endpoint: str, model: str) -> tuple[Any, ...]:
    thinking = ReasoningPart(
        text="plan", signature="SIG-X", step=0, provider="anthropic", model=model, endpoint=endpoint
    )
    return (
        UserMessage(content="one"),
        AssistantMessage(content=(thinking, TextPart(text="hi", step=0))),
        UserMessage(content="two"),
    )


async def test_first_party_thinking_is_not_replayed_to_vertex():
    history = signed_history("https://api.anthropic.com", VERTEX_MODEL)
    run = await replay(
        vertex, Reply(body=anthropic_sse(*THINKING_ANSWER)), request=make_request(history)
    )
    assistant = run.request.json()["messages"][1]
    assert assistant == {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}


async def test_vertex_replays_thinking_it_signed_itself():
    async with loopback_server(Reply(body=anthropic_sse(*THINKING_ANSWER))) as server:
        provider = vertex(server.url)
        history = signed_history(provider.endpoint or "", VERTEX_MODEL)
        await provider.stream(make_request(history), Run().emit)
        await provider.aclose()
    blocks = server.requests[0].json()["messages"][1]["content"]
    assert blocks[0] == {"type": "thinking", "thinking": "plan", "signature": "SIG-X"}


def test_the_cloud_providers_restore_like_anthropic():
    provider = bedrock("http://127.0.0.1:9")
    history = signed_history("http://127.0.0.1:9", BEDROCK_MODEL)
    _, messages = anthropic.map_messages("Be brief.", history, origin=provider.origin)
    assert messages[1]["content"][0]["signature"] == "SIG-X"
