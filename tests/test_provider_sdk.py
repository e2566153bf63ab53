"""The SDK providers' shared setup (actors/providers/sdk.py): the client is built once, on
first use; the credentials it resolved, given or read from the environment, are secrets
from then on; closing drops it. Nothing here reaches the network: building an SDK client
opens no connection."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import runtime.redact as redaction
from actors.providers import AnthropicProvider, OpenAIProvider, OpenAIResponsesProvider
from actors.providers.sdk import SDKProvider
from runtime.redact import redact_text

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
