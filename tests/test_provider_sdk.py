"""The SDK providers' shared setup (actors/providers/sdk.py): the client is built once, on
first use; the credentials it resolved, given or read from the environment, are secrets
from then on; closing drops it. Building an SDK client
opens no connection; the tests of the cached endpoint URL call a loopback server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import runtime.redact as redaction
from actors.providers import AnthropicProvider, OpenAIProvider, OpenAIResponsesProvider
from actors.providers.sdk import SDKProvider, cache_prepared_urls
from runtime.redact import redact_text
from tests.support.loopback import (
    Reply,
    anthropic_end,
    anthropic_sse,
    anthropic_start,
    loopback_server,
    responses_sse,
    sse,
)
from tests.support.provider_calls import Run, make_request

KEY_ENV = [
    (OpenAIProvider, "OPENAI_API_KEY"),
    (OpenAIResponsesProvider, "OPENAI_API_KEY"),
    (AnthropicProvider, "ANTHROPIC_API_KEY"),
]
PLAIN_KEY = "plainkey0123456789abcdef"
"""A key with no known prefix: only its registration can redact it."""


@pytest.fixture(autouse=True)
def isolated_secrets() -> Iterator[None]:
    """Registrations made by a test are forgotten after it: the registry is process-wide."""
    saved = redaction._secrets, redaction._pattern
    try:
        yield
    finally:
        redaction._secrets, redaction._pattern = saved


@pytest.mark.parametrize(("cls", "env"), KEY_ENV)
def test_a_key_the_client_read_from_the_environment_is_redacted_from_then_on(
    cls: type[SDKProvider], env: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(env, PLAIN_KEY)
    provider = cls("m")
    assert PLAIN_KEY in redact_text(f"error: {PLAIN_KEY}")  # nothing resolved it yet
    provider._get_client()
    assert PLAIN_KEY not in redact_text(f"error: {PLAIN_KEY}")


def test_an_anthropic_bearer_token_is_redacted_like_a_key(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", PLAIN_KEY)
    AnthropicProvider("m")._get_client()
    assert PLAIN_KEY not in redact_text(f"error: {PLAIN_KEY}")


@pytest.mark.parametrize(("cls", "env"), KEY_ENV)
def test_the_client_is_built_once_and_shared_by_every_call(cls: type[SDKProvider], env: str):
    provider = cls("m", api_key="sk-test-dummy")
    assert provider._get_client() is provider._get_client()


@pytest.mark.parametrize(("cls", "env"), KEY_ENV)
async def test_closing_drops_the_client_and_the_next_call_builds_another(
    cls: type[SDKProvider], env: str
):
    provider = cls("m", api_key="sk-test-dummy")
    first = provider._get_client()
    await provider.aclose()
    assert provider._client is None
    assert provider._get_client() is not first


@pytest.mark.parametrize(("cls", "env"), KEY_ENV)
def test_the_shared_arguments_are_kept_and_the_options_copied(cls: type[SDKProvider], env: str):
    options = {"temperature": 0.5}
    provider = cls("m", base_url="http://127.0.0.1:9/v1", timeout=5.0, **options)
    assert (provider.base_url, provider.timeout) == ("http://127.0.0.1:9/v1", 5.0)
    assert provider.request_options == options
    assert provider.describe()["options"] == ["temperature"]


# -- the endpoint's URL, joined once (cache_prepared_urls) --------------------------------

OPENAI_BODY = sse(
    {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
    }
)
ANTHROPIC_BODY = anthropic_sse(
    anthropic_start(),
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
    {"type": "content_block_stop", "index": 0},
    *anthropic_end("end_turn"),
)
BODIES: dict[type[SDKProvider], bytes] = {
    OpenAIProvider: OPENAI_BODY,
    OpenAIResponsesProvider: responses_sse(
        "m", 1, [{"type": "response.output_text.delta", "item_id": "m1", "delta": "hi"}]
    ),
    AnthropicProvider: ANTHROPIC_BODY,
}
PER_REQUEST_HEADERS = frozenset({"idempotency-key", "x-stainless-retry-count"})
"""Headers whose value the SDK makes anew for each request (none is a URL's)."""


def _wire(recorded: Any) -> tuple[str, str, list[tuple[str, str]], bytes]:
    """A recorded request as the server read it: its method, target, headers in their
    order (those made per request by name only) and body."""
    headers = [
        (name, "*" if name in PER_REQUEST_HEADERS else value)
        for name, value in recorded.headers.items()
    ]
    return recorded.method, recorded.path, headers, recorded.body


async def _calls(provider: SDKProvider, calls: int, *, cached: bool) -> None:
    """``calls`` one-step calls of ``provider``; ``cached=False``: its client with the
    SDK's own ``_prepare_url`` (the client as it was before the cache)."""
    client = provider._get_client()
    if not cached:
        del client._prepare_url  # the instance's cache: the class's method again
    try:
        for _ in range(calls):
            await provider.stream(make_request(), Run().emit)
    finally:
        await provider.aclose()


@pytest.mark.parametrize("cls", list(BODIES))
@pytest.mark.parametrize("url", ["/v1", "/v1/", "/proxy/a%20b/v1"])
async def test_requests_through_the_joined_url_are_the_ones_the_sdk_sends_without_it(
    cls: type[SDKProvider], url: str
):
    async with loopback_server(*(Reply(body=BODIES[cls]) for _ in range(4))) as server:
        for cached in (True, False):
            provider = cls("m", base_url=f"{server.url}{url}", api_key="sk-test-dummy")
            await _calls(provider, 2, cached=cached)
    sent = [_wire(r) for r in server.requests]
    assert sent[:2] == sent[2:]  # the same requests with the cache and without
    assert sent[0] == sent[1]  # the second call's URL came from the cache


@pytest.mark.parametrize("cls", list(BODIES))
def test_a_client_joins_each_endpoint_once_to_its_base_url(cls: type[SDKProvider]):
    client = cls("m", base_url="http://127.0.0.1:1/v1", api_key="sk-test-dummy")._get_client()
    first = client._prepare_url("chat/completions")
    assert client._prepare_url("chat/completions") is first
    assert str(first) == "http://127.0.0.1:1/v1/chat/completions"


def test_a_client_given_a_new_base_url_joins_the_endpoint_to_it():
    client = OpenAIProvider("m", base_url="http://127.0.0.1:1/v1", api_key="k")._get_client()
    client._prepare_url("chat/completions")
    client.base_url = "http://127.0.0.2:2/v2"
    assert str(client._prepare_url("chat/completions")) == "http://127.0.0.2:2/v2/chat/completions"


def test_a_client_class_with_its_own_url_routing_is_not_cached():
    import openai

    client = openai.AsyncAzureOpenAI(
        api_key="k", azure_endpoint="https://x.openai.azure.com", api_version="2024-10-21"
    )
    cache_prepared_urls(client)
    assert "_prepare_url" not in vars(client)


def test_a_client_with_its_joined_urls_is_freed_without_the_collector():
    import gc
    import weakref

    client = OpenAIProvider("m", base_url="http://127.0.0.1:1/v1", api_key="k").new_client()
    cache_prepared_urls(client)
    client._prepare_url("chat/completions")
    gone = weakref.ref(client)
    gc.disable()
    try:
        del client
        assert gone() is None  # no reference cycle through the cache
    finally:
        gc.enable()


# -- the client's default timeout, a Timeout already (client_timeout) ---------------------


class _CountedChecks(type):
    """A metaclass counting ``isinstance`` checks against its classes."""

    checks = 0

    def __instancecheck__(cls, instance: Any) -> bool:
        _CountedChecks.checks += 1
        return isinstance(instance, (int, float))


class _CountedSupportsFloat(metaclass=_CountedChecks):
    """Stands in for ``typing.SupportsFloat`` in httpx2's ``Timeout``: counts the
    runtime protocol checks a call makes (each ~44k instructions with the real one)."""


def _float_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The providers give their SDK client the number itself, as before client_timeout."""
    import actors.providers.anthropic as anthropic_provider
    import actors.providers.openai_common as openai_common

    for module in (anthropic_provider, openai_common):
        monkeypatch.setattr(module, "client_timeout", lambda timeout, _cls: timeout)


@pytest.mark.parametrize("cls", list(BODIES))
async def test_a_call_builds_its_timeout_without_a_protocol_check(
    cls: type[SDKProvider], monkeypatch: pytest.MonkeyPatch
):
    import httpx2._config

    monkeypatch.setattr(httpx2._config, "SupportsFloat", _CountedSupportsFloat)
    async with loopback_server(*(Reply(body=BODIES[cls]) for _ in range(2))) as server:
        provider = cls("m", base_url=f"{server.url}/v1", api_key="sk-test-dummy", timeout=5.0)
        provider._get_client()  # (its Timeout made once: from the number)
        monkeypatch.setattr(_CountedChecks, "checks", 0)
        await _calls(provider, 2, cached=True)
    assert len(server.requests) == 2
    assert _CountedChecks.checks == 0


@pytest.mark.parametrize("cls", list(BODIES))
@pytest.mark.parametrize("seconds", [5.0, 7, None])
async def test_a_client_s_timeout_as_a_timeout_sends_what_the_number_sent(
    cls: type[SDKProvider], seconds: float | None, monkeypatch: pytest.MonkeyPatch
):
    async with loopback_server(*(Reply(body=BODIES[cls]) for _ in range(2))) as server:
        given = cls("m", base_url=f"{server.url}/v1", api_key="sk-test-dummy", timeout=seconds)
        client = given._get_client()
        await _calls(given, 1, cached=True)
        with monkeypatch.context() as patched:
            _float_timeouts(patched)
            plain = cls("m", base_url=f"{server.url}/v1", api_key="sk-test-dummy", timeout=seconds)
            number = plain._get_client()
            await _calls(plain, 1, cached=True)
    assert number.timeout == seconds  # (the monkeypatch took: the number itself)
    if seconds is None:
        assert client.timeout is None
    else:
        assert (client.timeout.connect, client.timeout.read) == (seconds, seconds)
    assert client._client.timeout == number._client.timeout
    sent = [_wire(r) for r in server.requests]
    assert sent[0] == sent[1]  # same method, target, headers (timeouts' too) and body
    assert any(name == "x-stainless-read-timeout" for name, _ in sent[0][2]) is (
        seconds is not None
    )
