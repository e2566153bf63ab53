"""Rate limits (runtime/ratelimit.py): sliding one-minute windows that no minute ever
exceeds, token budgets, concurrency, and the provider's own word from its headers."""

from __future__ import annotations

import pytest
import trio

from actors.providers import ScriptedProvider
from runtime import Agent, Host
from runtime.errors import ConfigurationError, RateLimited, RateLimitUnavailable
from runtime.events import ProviderThrottled
from runtime.ratelimit import (
    WINDOW,
    Limiter,
    MemoryBackend,
    RateLimit,
    TrioClock,
    Verdict,
    parse_rate_headers,
)
from tests.support.grammar import check_grammar


def limiter(**limits: int) -> Limiter:
    return Limiter("openai|gpt-4o|-", RateLimit(**limits), MemoryBackend(), TrioClock())


def most_in_a_window(times: list[float]) -> int:
    """The most grant times any window of WINDOW seconds holds."""
    times = sorted(times)
    best = 0
    for i, start in enumerate(times):
        j = i
        while j < len(times) and times[j] < start + WINDOW:
            j += 1
        best = max(best, j - i)
    return best


async def test_no_minute_holds_more_calls_than_requests_per_minute(autojump_clock):
    limit = limiter(requests_per_minute=60)
    granted: list[float] = []

    async def caller() -> None:
        for _ in range(30):
            grant = await limit.acquire()
            granted.append(grant.granted_at)
            await trio.sleep(0.5)  # the call itself
            await limit.release(grant)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(caller)
    assert len(granted) == 240
    assert most_in_a_window(granted) == 60
    assert max(granted) >= 3 * WINDOW  # 240 calls took four minutes, not less


async def test_a_burst_goes_at_once_then_waits_for_the_window_to_slide(autojump_clock):
    limit = limiter(requests_per_minute=3)
    waits: list[Verdict] = []

    async def heard(verdict: Verdict) -> None:
        waits.append(verdict)

    times = [(await limit.acquire(on_wait=heard)).granted_at for _ in range(4)]
    assert times[:3] == [times[0]] * 3 and times[3] == times[0] + WINDOW
    assert [(w.reason, w.wait) for w in waits] == [("requests", WINDOW)]


async def test_tokens_per_minute_counts_what_calls_used(autojump_clock):
    limit = limiter(tokens_per_minute=1000)
    first = await limit.acquire(tokens=400)
    await limit.release(first, used=900)  # it used more than estimated
    start = trio.current_time()
    second = await limit.acquire(tokens=400)  # 900 + 400 > 1000: waits for the first to leave
    assert second.granted_at - start == pytest.approx(WINDOW)
    assert second.waited == pytest.approx(WINDOW)


async def test_a_call_estimated_over_the_token_limit_still_goes(autojump_clock):
    limit = limiter(tokens_per_minute=100)
    grant = await limit.acquire(tokens=10_000)
    assert grant.tokens == 100 and grant.waited == 0


async def test_max_concurrency_bounds_the_calls_in_flight(autojump_clock):
    limit = limiter(max_concurrency=2)
    in_flight, most = 0, 0

    async def call() -> None:
        nonlocal in_flight, most
        grant = await limit.acquire()
        in_flight += 1
        most = max(most, in_flight)
        await trio.sleep(1)
        in_flight -= 1
        await limit.release(grant)

    async with trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(call)
    assert most == 2


async def test_a_pause_the_provider_asked_for_holds_every_caller(autojump_clock):
    limit = limiter(requests_per_minute=1000)
    await limit.pause_for(30)
    waits: list[Verdict] = []

    async def heard(verdict: Verdict) -> None:
        waits.append(verdict)

    start = trio.current_time()
    grant = await limit.acquire(on_wait=heard)
    assert grant.granted_at - start == pytest.approx(30)
    assert [w.reason for w in waits] == ["provider"]


def test_a_limit_below_one_is_refused():
    with pytest.raises(ConfigurationError):
        RateLimit(requests_per_minute=0)


# -- headers -----------------------------------------------------------------------------------

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({}, 0.0),
        ({"x-ratelimit-remaining-requests": "5", "x-ratelimit-reset-requests": "1s"}, 0.0),
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}, 360.0),
        ({"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20ms"}, 0.02),
        (
            {
                "anthropic-ratelimit-requests-remaining": "0",
                "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:30Z",
            },
            30.0,
        ),
        ({"retry-after": "7"}, 7.0),
        ({"retry-after-ms": "1500", "retry-after": "7"}, 1.5),
        ({"retry-after": "Thu, 01 Jan 2026 00:00:12 GMT"}, 12.0),
        ({"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "soon"}, 0.0),
        ({"retry-after": "nan"}, 0.0),
    ],
)
def test_the_headers_say_how_long_every_caller_waits(headers, wait):
    assert parse_rate_headers(headers, now_epoch=NOW) == pytest.approx(wait)


def test_the_longest_reset_of_the_exhausted_limits_wins():
    headers = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "2s",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "1m30s",
    }
    assert parse_rate_headers(headers, now_epoch=NOW) == 90.0


# -- in a session --------------------------------------------------------------------------------


def drain(subscription) -> list:
    out = []
    while True:
        try:
            out.append(subscription.inbox.get_nowait())
        except trio.WouldBlock:
            return out


async def test_a_turn_over_the_limit_waits_and_says_so_in_its_stream_and_on_the_bus(
    autojump_clock,
):
    provider = ScriptedProvider(["ok"], rate_limit=RateLimit(requests_per_minute=2))
    async with Host.open(log_tap=False) as host:
        heard = host.bus.subscribe([ProviderThrottled], name="t")
        session = await host.open_session(Agent(provider=provider))
        await session.run("one")
        await session.run("two")
        start = trio.current_time()
        async with session.stream("three") as out:
            chunks = [chunk async for chunk in out]
        waited = trio.current_time() - start
    check_grammar(chunks)
    (notice,) = [c for c in chunks if c.type == "throttled"]
    assert (notice.reason, notice.wait) == ("requests", pytest.approx(WINDOW))
    assert waited == pytest.approx(WINDOW)
    (event,) = drain(heard)
    assert (event.reason, event.key) == ("requests", "scripted|scripted|-")


async def test_a_429_with_retry_after_pauses_the_other_sessions_too(autojump_clock):
    calls = {"n": 0}

    def model(request):
        calls["n"] += 1
        if calls["n"] == 1:
            return [RateLimited("slow down", retry_after=30, provider="scripted")]
        return ["ok"]

    provider = ScriptedProvider(responder=model, rate_limit=RateLimit(requests_per_minute=100))
    async with Host.open(log_tap=False) as host:
        heard = host.bus.subscribe([ProviderThrottled], name="t")
        first = await host.open_session(Agent(provider=provider))
        other = await host.open_session(Agent(provider=provider))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first.run, "one")
            await trio.sleep(1)  # the 429 came back: the pause is on
            start = trio.current_time()
            result = await other.run("two")
            waited = trio.current_time() - start
    assert result.error is None
    assert waited == pytest.approx(29)
    assert "provider" in [e.reason for e in drain(heard)]


class Response:
    def __init__(self, headers: dict[str, str]) -> None:
        self.headers = headers


async def test_a_limit_the_provider_reports_spent_holds_the_next_call_until_its_reset(
    autojump_clock,
):
    provider = ScriptedProvider(["ok"], rate_limit=RateLimit(requests_per_minute=100))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider))
        await session.run("one")
        spent = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "20s"}
        await provider.observe_headers(Response(spent))
        start = trio.current_time()
        await session.run("two")
    assert trio.current_time() - start == pytest.approx(20)


async def test_the_sdk_providers_feed_their_response_headers_to_the_limiter():
    from actors.providers import OpenAIProvider
    from tests.support.faults import oa_text, resolve_platform
    from tests.support.loopback import Reply, loopback_server

    headers = [("x-ratelimit-remaining-tokens", "0"), ("x-ratelimit-reset-tokens", "6m0s")]
    async with loopback_server(Reply(body=oa_text("hi"), headers=headers)) as server:
        provider = OpenAIProvider(
            "gpt-4o",
            base_url=server.url + "/v1",
            api_key="test",
            rate_limit=RateLimit(tokens_per_minute=10_000),
        )
        resolve_platform(provider)
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=provider))
            assert (await session.run("hi")).text == "hi"
            backend = host.rate_limits
            verdict = await backend.try_acquire(
                provider.limit_key, provider.rate_limit, trio.current_time(), "probe", 0
            )
    assert verdict.reason == "provider" and verdict.wait == pytest.approx(360, abs=5)


def test_every_sdk_provider_takes_a_rate_limit():
    from actors.providers import (
        AnthropicProvider,
        GeminiProvider,
        OpenAIProvider,
        OpenAIResponsesProvider,
    )

    limit = RateLimit(requests_per_minute=60)
    for cls in (OpenAIProvider, OpenAIResponsesProvider, AnthropicProvider, GeminiProvider):
        provider = cls("m", api_key="test", rate_limit=limit)
        assert provider.rate_limit is limit and "rate_limit" not in provider.request_options


class _DownBackend(MemoryBackend):
    """A shared backend whose Redis holds every reply (``hang``) or stays down (raises)."""

    def __init__(self, *, hang: bool) -> None:
        super().__init__()
        self.hang = hang
        self.pauses = 0

    async def pause(self, key: str, now: float, until: float) -> None:
        self.pauses += 1
        if self.hang:
            await trio.sleep_forever()
        raise RateLimitUnavailable("the shared rate limits' Redis did not answer")


@pytest.mark.parametrize("hang", [True, False], ids=["held", "down"])
async def test_a_pause_a_shared_limit_cannot_record_holds_up_nothing(autojump_clock, hang):
    """The provider's headers ask for a pause the backend cannot record: the response
    goes on within ``PAUSE_TIMEOUT`` (before: a held reply hung it for good)."""
    from types import SimpleNamespace

    from runtime.provider import PAUSE_TIMEOUT

    backend = _DownBackend(hang=hang)
    provider = ScriptedProvider(["ok"], rate_limit=RateLimit(requests_per_minute=5))
    provider.limiter = Limiter(provider.limit_key, provider.rate_limit, backend, TrioClock())
    start = trio.current_time()
    await provider.observe_headers(SimpleNamespace(headers={"retry-after": "30"}))
    assert trio.current_time() - start <= PAUSE_TIMEOUT
    assert backend.pauses == 1
