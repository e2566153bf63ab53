"""Every SDK provider closes the HTTP body it reads, on every way a call ends.

A stream's byte iterator (the HTTP library's async generator, and the SDK's over it) left
unexhausted and unclosed is finalized by the garbage collector, which Trio reports as a
``ResourceWarning`` ("Async generator ... was garbage collected before it had been
exhausted"); a host that runs with ``-W error`` (or a test suite) then fails. The
Responses provider left it so on every call that ended at its terminal event (branch
``providers3``). Each provider is called against the loopback server through its real SDK
client, for a stream that ends normally, one that fails in the middle, one that is not
JSON, and one its requester cancels after the first chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.providers import AnthropicProvider, OpenAIProvider, OpenAIResponsesProvider
from actors.providers.gemini import GeminiProvider
from tests.support.leaks import abandoned_generators
from tests.support.loopback import Reply
from tests.support.provider_calls import call_with, cancel_after_first_chunk, make_request

RECORDINGS = Path(__file__).resolve().parent / "recordings"
KEY = "sk-test-not-a-real-key-4243"

MAKERS: dict[str, Callable[[str], Any]] = {
    "openai": lambda url: OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=KEY),
    "openai-responses": lambda url: OpenAIResponsesProvider(
        "gpt-5-mini", base_url=url + "/v1", api_key=KEY
    ),
    "anthropic": lambda url: AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key=KEY),
    "google": lambda url: GeminiProvider("gemini-2.5-flash", base_url=url, api_key=KEY),
}

# (provider, the recording of a whole answer, of one that fails in the middle)
CASES = [
    ("openai", "text-plain.sse", "error-event-midstream.sse"),
    ("openai-responses", "text.sse", "error-event.sse"),
    ("openai-responses", "text.sse", "failed-server-error.sse"),
    ("anthropic", "text.sse", "overloaded-midstream.sse"),
    ("google", "text.sse", "overloaded-midstream.sse"),
]


def recording(provider: str, name: str) -> bytes:
    folder = "openai-responses" if provider == "openai-responses" else provider
    return (RECORDINGS / folder / name).read_bytes()


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch):
    for var in ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "GOOGLE_GEMINI_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize(("provider", "whole", "failing"), CASES)
async def test_a_whole_answer_leaves_no_byte_iterator_open(provider, whole, failing):
    with abandoned_generators() as abandoned:
        call = await call_with(
            MAKERS[provider], Reply(body=recording(provider, whole)), request=make_request()
        )
        whole_answer = call.error is None and bool(call.text)
        del call  # its error's traceback would keep the generators alive past the block
    assert whole_answer
    assert abandoned == []


@pytest.mark.parametrize(("provider", "whole", "failing"), CASES)
async def test_a_stream_failing_in_the_middle_leaves_no_byte_iterator_open(
    provider, whole, failing
):
    with abandoned_generators() as abandoned:
        call = await call_with(
            MAKERS[provider], Reply(body=recording(provider, failing)), request=make_request()
        )
        failed = call.error is not None
        del call  # its error's traceback would keep the generators alive past the block
    assert failed
    assert abandoned == []


@pytest.mark.parametrize("provider", sorted(MAKERS))
async def test_a_body_that_is_not_json_leaves_no_byte_iterator_open(provider):
    with abandoned_generators() as abandoned:
        call = await call_with(
            MAKERS[provider], Reply(body=b"data: {not json\n\n"), request=make_request()
        )
        failed = call.error is not None
        del call  # its error's traceback would keep the generators alive past the block
    assert failed
    assert abandoned == []


@pytest.mark.parametrize(("provider", "whole", "failing"), CASES)
async def test_a_cancelled_stream_leaves_no_byte_iterator_open(provider, whole, failing):
    body = recording(provider, whole)
    stalled = Reply(body=body, stall=30, stall_after=len(body) * 2 // 3)
    with abandoned_generators() as abandoned:
        request, chunks = await cancel_after_first_chunk(MAKERS[provider], stalled)
    assert request.cancel_scope.cancelled_caught and chunks
    assert abandoned == []


# -- Bedrock: binary event-stream frames, read by a decoder of ours in the SDK's place -------


def _bedrock(url: str) -> Any:
    from actors.providers.anthropic import AnthropicBedrockProvider

    return AnthropicBedrockProvider(
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
        base_url=url,
        region="us-east-1",
        aws_access_key="AKIDEXAMPLE0123456789",
        aws_secret_key="aws-secret-test-not-real-0123456789",
    )


def _frames(tail: bytes = b"", whole: bool = True) -> Reply:
    from tests.support.eventstream import bedrock_stream
    from tests.support.loopback import anthropic_end, anthropic_start
    from tests.test_provider_e2e import an_text

    events = [anthropic_start(), *an_text(0, "Partial")]
    if whole:
        events += anthropic_end("end_turn")
    body = bedrock_stream(*events) + tail
    return Reply(body=body, content_type="application/vnd.amazon.eventstream")


async def test_a_whole_bedrock_answer_leaves_no_byte_iterator_open():
    with abandoned_generators() as abandoned:
        call = await call_with(_bedrock, _frames(), request=make_request())
        whole_answer = call.error is None and call.text == "Partial"
        del call
    assert whole_answer
    assert abandoned == []


@pytest.mark.parametrize("tail", ["exception", "garbled"])
async def test_a_bedrock_stream_failing_in_the_middle_leaves_no_byte_iterator_open(tail):
    from tests.support.eventstream import exception

    bad = exception("throttlingException", "slow down") if tail == "exception" else b"\x00" * 16
    with abandoned_generators() as abandoned:
        call = await call_with(_bedrock, _frames(bad, whole=False), request=make_request())
        failed = call.error is not None and call.text == "Partial"
        del call
    assert failed
    assert abandoned == []
