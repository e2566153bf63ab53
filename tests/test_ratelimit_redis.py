"""Rate limits kept in Redis (actors/relays/limits.py), on the test run's own Redis: the
same answers as the in-process backend, whichever process asks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import attrs
import pytest
import trio

from actors.relays.redis_streams import RedisRelay
from runtime.ratelimit import WINDOW, Limiter, MemoryBackend, RateLimit
from tests.support.redis import require_redis, unique_prefix
from tests.test_ratelimit import most_in_a_window


@attrs.define
class ManualClock:
    """A clock that moves only when a caller sleeps: a minute of limits in no time."""

    t: float = 1_767_225_600.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds
        await trio.lowlevel.checkpoint()


@pytest.fixture
async def relay() -> AsyncIterator[RedisRelay]:
    async with RedisRelay.open(require_redis(), prefix=unique_prefix()) as relay:
        yield relay


def limiter(backend, clock: ManualClock, **limits: int) -> Limiter:
    return Limiter("openai|gpt-4o|-", RateLimit(**limits, clock=clock), backend, clock)


async def test_a_burst_goes_at_once_then_waits_for_the_minute_to_slide(relay):
    clock = ManualClock()
    limit = limiter(relay.rate_limits(), clock, requests_per_minute=3)
    grants = [await limit.acquire() for _ in range(7)]
    start = grants[0].granted_at
    assert [round(g.granted_at - start, 3) for g in grants] == [0, 0, 0, 60, 60, 60, 120]
    assert most_in_a_window(await relay.rate_limits().granted(limit.key)) == 3


async def test_the_tokens_a_call_used_replace_its_estimate(relay):
    clock = ManualClock()
    limit = limiter(relay.rate_limits(), clock, tokens_per_minute=1000)
    first = await limit.acquire(tokens=400)
    await limit.release(first, used=900)
    second = await limit.acquire(tokens=400)
    assert second.waited == pytest.approx(WINDOW)


async def test_a_pause_holds_callers_of_every_process(relay):
    clock = ManualClock()
    here = limiter(relay.rate_limits(), clock, requests_per_minute=100)
    there = limiter(relay.rate_limits(), clock, requests_per_minute=100)  # another worker
    await here.pause_for(12)
    grant = await there.acquire()
    assert grant.waited == pytest.approx(12)


async def test_concurrency_slots_are_shared_and_given_back(relay):
    clock = ManualClock()
    backend = relay.rate_limits()
    a = limiter(backend, clock, max_concurrency=1)
    first = await a.acquire()
    verdict = await backend.try_acquire(a.key, a.limit, clock.now(), "other", 0)
    assert verdict.reason == "concurrency"
    await a.release(first)
    assert (await backend.try_acquire(a.key, a.limit, clock.now(), "other", 0)).granted


async def test_time_never_goes_backwards_for_a_slower_clock(relay):
    ahead, behind = ManualClock(t=1_000_100.0), ManualClock(t=1_000_000.0)
    backend = relay.rate_limits()
    fast = limiter(backend, ahead, requests_per_minute=2)
    slow = limiter(backend, behind, requests_per_minute=2)
    await fast.acquire()
    await fast.acquire()
    grant = await slow.acquire()  # 100 s behind: it must not see the two as long gone
    assert grant.waited == pytest.approx(100 + WINDOW)
    assert most_in_a_window(await backend.granted(fast.key)) == 2


async def test_redis_and_memory_agree_on_a_mixed_load(relay):
    """The same calls through both backends get the same grant times."""

    async def times(backend) -> list[float]:
        clock = ManualClock()
        limit = limiter(backend, clock, requests_per_minute=5, tokens_per_minute=3000)
        out = []
        for n in range(20):
            grant = await limit.acquire(tokens=100 * (n % 7))
            out.append(grant.granted_at - 1_767_225_600.0)
            await limit.release(grant, used=150 * (n % 5))
        return out

    assert await times(relay.rate_limits()) == pytest.approx(await times(MemoryBackend()))


HOUR = 3600.0


async def started(backend) -> None:
    """What a worker does with its shared limits as it starts (runtime/app/worker.py)."""
    sync = getattr(backend, "sync_clock", None)
    if sync is not None:
        await sync()


async def redis_time(relay: RedisRelay) -> float:
    return (await relay.client.time()).timestamp()


async def test_a_worker_an_hour_behind_does_not_spend_the_minute_a_second_time(relay, monkeypatch):
    real, limit = time.time, RateLimit(requests_per_minute=2)
    monkeypatch.setattr(time, "time", lambda: real() - HOUR)  # its machine's clock
    behind = relay.rate_limits()
    await started(behind)
    slow = Limiter("k", limit, behind, behind.clock)
    await slow.acquire()
    await slow.acquire()
    monkeypatch.setattr(time, "time", real)
    right = relay.rate_limits()
    await started(right)
    verdict = await right.try_acquire("k", limit, right.clock.now(), "third", 0)
    assert not verdict.granted  # two calls went in this minute already


async def test_a_worker_an_hour_ahead_counts_its_grant_at_redis_time(relay, monkeypatch):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + HOUR)
    ahead = relay.rate_limits()
    await started(ahead)
    await Limiter("k", RateLimit(requests_per_minute=2), ahead, ahead.clock).acquire()
    monkeypatch.setattr(time, "time", real)
    (granted,) = await ahead.granted("k")
    assert abs(granted - await redis_time(relay)) < WINDOW  # not an hour on: the minute slides
