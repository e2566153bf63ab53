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


def _axon_s_shielded_scopes(monkeypatch: Any) -> list[bool]:
    """Shielded cancel scopes Axon's code enters from now on (the HTTP libraries shield
    their own too), one ``True`` each."""
    import sys

    import trio

    shielded: list[bool] = []
    enter = trio.CancelScope.__enter__

    def counted(scope: trio.CancelScope) -> trio.CancelScope:
        if scope.shield and "actors" in Path(sys._getframe(1).f_code.co_filename).parts:
            shielded.append(True)
        return enter(scope)

    monkeypatch.setattr(trio.CancelScope, "__enter__", counted)
    return shielded


async def test_an_anthropic_answer_read_to_its_end_closes_without_a_shielded_bound(monkeypatch):
    """The close after a whole answer: the drain after ``message_stop`` read the body to
    its end and the HTTP response closed itself, so ``close`` waits for nothing and
    enters no shielded bound (a cancel scope, ~58k instructions a turn; issue 24 goal 1).
    Counted: shielded scopes the provider enters for a whole answer, none; no byte
    iterator left open. A call cancelled mid-stream leaves none open either."""
    shielded = _axon_s_shielded_scopes(monkeypatch)
    body = recording("anthropic", "text.sse")
    with abandoned_generators() as abandoned:
        call = await call_with(MAKERS["anthropic"], Reply(body=body), request=make_request())
        whole = call.error is None and bool(call.text)
        del call
    assert whole and abandoned == []
    assert shielded == []
    stalled = Reply(body=body, stall=30, stall_after=len(body) * 2 // 3)
    with abandoned_generators() as abandoned:
        request, chunks = await cancel_after_first_chunk(MAKERS["anthropic"], stalled)
    assert request.cancel_scope.cancelled_caught and chunks and abandoned == []


async def test_an_anthropic_stream_whose_response_is_open_closes_it_shielded(monkeypatch):
    """A stream that ends with its HTTP response still open (here its events fail before
    the body is read) is closed within the shielded bound, as before the cut above: the
    close runs to its end though the call is cancelled meanwhile."""
    import trio

    from runtime.errors import AxonError

    closes: list[str] = []

    class Response:
        is_closed = False
        headers: dict[str, str] = {}

    class Events:
        response = Response()

        def __aiter__(self) -> Any:
            return self

        async def __anext__(self) -> Any:
            raise RuntimeError("the events failed")

        async def close(self) -> None:
            closes.append("started")
            await trio.lowlevel.checkpoint()  # the cancel already called does not cut it
            closes.append("done")

    class Messages:
        async def create(self, **params: Any) -> Events:
            return Events()

    class Client:
        messages = Messages()

    async def emit(chunk: Any) -> None:
        pass

    provider = AnthropicProvider("claude-sonnet-4-5", api_key=KEY)
    provider._client = Client()
    shielded = _axon_s_shielded_scopes(monkeypatch)
    with trio.CancelScope() as outer:
        outer.cancel()  # delivered at the first checkpoint outside the close's shield
        with pytest.raises(AxonError):
            await provider.stream(make_request(), emit)
    assert closes == ["started", "done"]
    assert shielded == [True]
