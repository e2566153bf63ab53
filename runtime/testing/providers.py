"""The provider conformance kit: what every :class:`~runtime.provider.Provider` must do.

A provider (a built-in one, or a plug-in's through the ``axon.providers`` entry points)
passes this suite, or the turn runner cannot rely on it: it describes itself with the
contract's keys and never with its credential, builds from command-line options or says
it cannot, streams only :data:`~runtime.chunks.StreamChunk` s in their grammar
(:func:`check_stream`: one :class:`~runtime.chunks.FinishChunk`, last; a tool call's input
deltas after its start), turns any failure into an :class:`~runtime.errors.AxonError`,
and answers again after a call cancelled mid-stream.

Use it from a test module, with a ``provider`` fixture giving a provider whose calls
(three at least) each answer with some text, from a fake server on the loopback
interface, say, and never the real API; give the credential it was built with as
``provider_secret`` so the kit can look for it (pytest and pytest-trio are needed;
nothing in Axon imports this)::

    import pytest
    from runtime.testing.providers import ProviderConformance

    from my_package.echo import EchoProvider


    class TestEchoProvider(ProviderConformance):
        @pytest.fixture
        def provider_secret(self):
            return "sk-test-0123456789"

        @pytest.fixture
        async def provider(self, provider_secret):
            provider = EchoProvider("echo-1", api_key=provider_secret)
            try:
                yield provider
            finally:
                await provider.aclose()

:func:`call` (one model call, its chunks) and :func:`check_stream` are public too, for a
provider's own tests beyond the kit.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import trio

from runtime.actor_messages import InferRequest
from runtime.chunks import (
    FinishChunk,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
    ToolInputDeltaChunk,
    ToolInputStartChunk,
)
from runtime.errors import AxonError, ConfigurationError, ProviderError
from runtime.inbox import Inbox
from runtime.messages import Message, UserMessage
from runtime.provider import DESCRIBE_KEYS, Provider, ProviderOptions

STREAM_CHUNK_TYPES: tuple[type, ...] = StreamChunk.__args__
"""Every type a provider may emit."""


def request(messages: tuple[Message, ...] | None = None, **fields: Any) -> InferRequest:
    """A request for one model call: ``messages`` (default: one user message asking for
    a short greeting), no tools, no instructions; ``fields`` override the rest."""
    values: dict[str, Any] = {
        "request_id": "kit-request",
        "session_id": "kit-session",
        "turn_id": "kit-turn",
        "step": 0,
        "instructions": None,
        "messages": messages or (UserMessage(content="Say hello.", id="kit-user"),),
        "tools": (),
        "reply": Inbox(),
        "cancel_scope": trio.CancelScope(),
    }
    return InferRequest(**{**values, **fields})


async def call(
    provider: Provider, infer: InferRequest | None = None, *, cancel_after: int | None = None
) -> list[Any]:
    """Run one model call through ``provider.stream`` and return the chunks it emitted;
    raises what the call raises. ``cancel_after``: cancel the call once it has emitted
    that many chunks (what a stopped turn does), and return the chunks it got to."""
    chunks: list[Any] = []
    with trio.CancelScope() as scope:

        async def emit(chunk: Any) -> None:
            chunks.append(chunk)
            if cancel_after is not None and len(chunks) >= cancel_after:
                scope.cancel()
            await trio.lowlevel.checkpoint()

        await provider.stream(infer or request(), emit)
    return chunks


def check_stream(chunks: list[Any]) -> None:
    """Assert the grammar of one completed call's chunks: every chunk a
    :data:`~runtime.chunks.StreamChunk`, exactly one :class:`FinishChunk` and it last,
    each tool call's input start at most once and before its deltas and its call, and
    each tool call id called once."""
    strays = [type(c).__name__ for c in chunks if not isinstance(c, STREAM_CHUNK_TYPES)]
    assert not strays, f"not stream chunks: {strays}"
    finishes = [i for i, c in enumerate(chunks) if isinstance(c, FinishChunk)]
    assert finishes == [len(chunks) - 1], f"one FinishChunk, last; found at {finishes}"
    started: set[str] = set()
    called: set[str] = set()
    for chunk in chunks:
        if isinstance(chunk, ToolInputStartChunk):
            assert chunk.tool_call_id not in started, f"{chunk.tool_call_id} started twice"
            assert chunk.tool_call_id not in called, f"{chunk.tool_call_id} started after its call"
            started.add(chunk.tool_call_id)
        elif isinstance(chunk, ToolInputDeltaChunk):
            assert chunk.tool_call_id in started, f"{chunk.tool_call_id}: a delta before its start"
            assert chunk.tool_call_id not in called, f"{chunk.tool_call_id}: a delta after its call"
        elif isinstance(chunk, ToolCallChunk):
            assert chunk.tool_call_id not in called, f"{chunk.tool_call_id} called twice"
            called.add(chunk.tool_call_id)


class ProviderConformance:
    """The conformance tests, for a subclass named ``Test...`` that defines a
    ``provider`` fixture (and, when it has one, ``provider_secret``; see the module's
    docstring). Every test is a Trio test (``pytest.mark.trio``), whatever the project's
    ``trio_mode``."""

    pytestmark = pytest.mark.trio

    @pytest.fixture
    def provider_secret(self) -> str | None:
        """The credential the ``provider`` fixture was built with (``None``: none)."""
        return None

    async def test_describes_itself_with_the_contract_keys(self, provider: Provider) -> None:
        described = provider.describe()
        assert tuple(described) == DESCRIBE_KEYS
        assert described["provider"] == provider.provider_name
        assert (described["name"], described["model"]) == (provider.name, provider.model)

    async def test_describe_is_json_for_logs_and_status_pages(self, provider: Provider) -> None:
        assert orjson.loads(orjson.dumps(provider.describe())) == provider.describe()

    async def test_describe_never_shows_the_credential(
        self, provider: Provider, provider_secret: str | None
    ) -> None:
        if not provider_secret:
            pytest.skip("no provider_secret fixture: no credential to look for")
        assert provider_secret not in repr(provider.describe())

    async def test_builds_from_options_or_says_it_cannot(self, provider: Provider) -> None:
        try:
            built = type(provider).from_options(ProviderOptions(model="kit-model"))
        except ConfigurationError:
            return  # configured in Python only: the default from_options says so
        try:
            assert isinstance(built, type(provider))
        finally:
            close = getattr(built, "aclose", None)  # an SDK provider's client, if it made one
            if close is not None:
                await close()

    async def test_a_call_streams_its_chunks_in_grammar(self, provider: Provider) -> None:
        check_stream(await call(provider))

    async def test_a_call_answers_with_text(self, provider: Provider) -> None:
        chunks = await call(provider)
        assert "".join(c.text for c in chunks if isinstance(c, TextChunk))

    async def test_any_failure_is_an_axon_error(self, provider: Provider) -> None:
        assert isinstance(provider.classify_error(RuntimeError("boom")), AxonError)
        already = ProviderError("already classified", provider=provider.provider_name)
        assert provider.classify_error(already) is already

    async def test_answers_again_after_a_call_cancelled_mid_stream(
        self, provider: Provider
    ) -> None:
        cut = await call(provider, cancel_after=1)
        assert len(cut) == 1
        check_stream(await call(provider))
