"""A provider that fails, attacked end to end as a careless user and a hostile server
(branch ``provfail``, journal ``benchmarks/journal/pipeline.md``): what the stream shows,
what is saved, how long a turn waits. What tests/test_provider_attacks.py,
tests/test_fallback*.py and tests/test_ratelimit*.py pin is not repeated here: only a
regression test for each defect found."""

from __future__ import annotations

import io
from typing import Any

import pytest
import trio

from actors.providers.failures import retry_after
from runtime import RetryPolicy
from runtime.ratelimit import MAX_PAUSE, RateLimit
from tests.support.attacks import KINDS, attack_rig
from tests.support.faults import consume
from tests.support.loopback import Reply, loopback_server
from tests.test_provider_attacks import http_error


async def turn(r, *replies: Reply, within: float = 600) -> tuple[list, object]:
    """One streamed turn served ``replies``, failing if it takes over ``within`` s."""
    r.server.add(*replies)
    with trio.fail_after(within):
        async with r.session.stream("hi") as out:
            chunks = await consume(out)
    r.server.replies.clear()
    return chunks, out.result


# -- a pause the provider asks for is capped ------------------------------------------------


async def test_a_429_asking_for_an_endless_wait_holds_a_rate_limited_turn_only_max_pause(
    autojump_clock,
):
    """``retry-after: 1e9`` on a 429 paused the limiter for 1e9 s: the retry (and every
    other session of the key) waited in the limiter for ever, the stream saying
    ``throttled`` with a wait of 31 years, though the retry policy caps the header at
    60 s."""
    policy = RetryPolicy(max_attempts=2, jitter=0)
    limit = RateLimit(requests_per_minute=100)
    async with attack_rig("openai", retry=policy, provider={"rate_limit": limit}) as r:
        t0 = trio.current_time()
        slow = http_error("openai", 429, "slow down", [("retry-after", "1e9")])
        ok = Reply(body=r.answer("ok"))
        chunks, result = await turn(r, slow, ok, within=MAX_PAUSE + 120)
        assert (result.finish_reason, result.text) == ("stop", "ok")
        assert trio.current_time() - t0 == pytest.approx(MAX_PAUSE, abs=0.01)
        assert max(c.wait for c in chunks if c.type == "throttled") <= MAX_PAUSE


async def test_a_spent_limit_whose_reset_is_years_away_holds_the_next_call_only_max_pause(
    autojump_clock,
):
    from types import SimpleNamespace

    from actors.providers import ScriptedProvider
    from runtime import Agent, Host

    provider = ScriptedProvider(["ok"], rate_limit=RateLimit(requests_per_minute=100))
    spent = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1e9"}
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider))
        await provider.observe_headers(SimpleNamespace(headers=spent))
        start = trio.current_time()
        with trio.fail_after(MAX_PAUSE + 60):
            await session.run("two")
    assert trio.current_time() - start == pytest.approx(MAX_PAUSE)


# -- retry-after ------------------------------------------------------------------------------


@pytest.mark.parametrize("ms", ["soon", "nan", "inf", ""])
def test_a_malformed_retry_after_ms_leaves_retry_after_to_say_the_wait(ms):
    """A ``retry-after-ms`` that is no finite number made the whole answer ``None``: a
    valid ``retry-after: 30`` beside it was ignored and the 429 retried after the
    policy's half-second backoff."""
    assert retry_after({"retry-after-ms": ms, "retry-after": "30"}) == 30.0


@pytest.mark.parametrize("ms", ["nan", "inf"])
def test_a_retry_after_ms_that_is_no_finite_number_leaves_the_pause_to_retry_after(ms):
    from runtime.ratelimit import parse_rate_headers

    assert parse_rate_headers({"retry-after-ms": ms, "retry-after": "30"}) == 30.0


# -- a key quoted in a body the error cuts -----------------------------------------------------

PROXY_KEY = "pk9Lmq2Rt7Vx4Wz8Ab3Cd6Ef1Gh5Jk0N"
"""A key of no known shape (a proxy's): only its registered value finds it."""


def proxied(kind: str, url: str) -> Any:
    from actors.providers import (
        AnthropicProvider,
        GeminiProvider,
        OpenAIProvider,
        OpenAIResponsesProvider,
    )
    from tests.support.faults import resolve_platform

    if kind == "gemini":
        return GeminiProvider("gemini-2.5-flash", base_url=url, api_key=PROXY_KEY)
    if kind == "anthropic":
        provider: Any = AnthropicProvider("claude-sonnet-4-5", base_url=url, api_key=PROXY_KEY)
    elif kind == "openai":
        provider = OpenAIProvider("gpt-4o-mini", base_url=url + "/v1", api_key=PROXY_KEY)
    else:
        provider = OpenAIResponsesProvider("gpt-5-mini", base_url=url + "/v1", api_key=PROXY_KEY)
    resolve_platform(provider)
    return provider


@pytest.mark.parametrize("kind", KINDS)
async def test_a_200_page_quoting_the_key_where_the_error_cuts_it_shows_no_piece_of_it(
    kind, autojump_clock
):
    """A proxy's 200 HTML page echoing the key from byte 170: the error quotes the
    body's first 200 bytes, and the 30 characters of the key before the cut were no
    longer the registered value, so they reached the stream, the store and the log."""
    from runtime import Agent, Host
    from runtime.logging import configure_logging
    from runtime.serde import to_json

    page = b"<html>" + b"x" * 164 + PROXY_KEY.encode() + b"</html>"
    log = io.StringIO()
    configure_logging("debug", stream=log)
    try:
        async with loopback_server(Reply(body=page, content_type="text/html")) as server:
            provider = proxied(kind, server.url)
            try:
                async with Host.open(log_tap=False) as host:
                    agent = Agent(provider=provider, retry=RetryPolicy(max_attempts=1))
                    session = await host.open_session(agent, session_id="s")
                    async with session.stream("hi") as out:
                        chunks = await consume(out)
                    stored = await host.store.load("s")
            finally:
                await provider.aclose()
    finally:
        configure_logging("warning")
    assert out.result.error.kind == "MalformedStream"
    assert "[redacted]" in out.result.error.message
    seen = to_json([chunks, out.result.error, stored.messages]).decode() + log.getvalue()
    assert PROXY_KEY[:12] not in seen


@pytest.mark.parametrize("at", [0, 100, 168, 180, 190, 199, 200])
def test_a_quote_cut_through_a_registered_key_shows_none_of_it(at):
    from actors.providers.failures import quoted
    from runtime.redact import register_secret

    register_secret(PROXY_KEY)
    body = b"x" * at + PROXY_KEY.encode() + b"y" * 300
    shown = quoted(body)
    assert PROXY_KEY[:4] not in shown
    assert shown.startswith("b'xxx" if at else "b'[redacted]") and shown.endswith("'")
