"""What the ``provfail`` attack left (branch ``provleft``, journal
``benchmarks/journal/pipeline.md``): the usage of a call that fails mid-stream, a
provider's pause held to the limit's ``max_pause`` and to the turn's own deadline, and an
``error`` event after a whole answer. Loopback SSE through the real SDK clients."""

from __future__ import annotations

import pytest
import trio

from runtime import Budget, RetryPolicy
from runtime.ratelimit import MAX_PAUSE, RateLimit
from tests.support.attacks import attack_rig
from tests.support.faults import consume
from tests.support.loopback import Reply
from tests.test_provider_attacks import http_error


async def turn(r, *replies: Reply, within: float = 900) -> tuple[list, object]:
    """One streamed turn served ``replies``, failing if it takes over ``within`` s."""
    r.server.add(*replies)
    with trio.fail_after(within):
        async with r.session.stream("hi") as out:
            chunks = await consume(out)
    r.server.replies.clear()
    return chunks, out.result


# -- a provider's pause: the limit's max_pause, the turn's deadline ---------------------------


def test_a_rate_limit_holds_a_provider_pause_600_s_by_default():
    assert RateLimit().max_pause == MAX_PAUSE == 600.0


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "600", True])
def test_a_max_pause_that_is_no_finite_number_of_seconds_is_refused(bad):
    from runtime.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        RateLimit(max_pause=bad)


async def test_a_rate_limit_max_pause_caps_a_provider_pause(autojump_clock):
    policy = RetryPolicy(max_attempts=2, jitter=0)
    limit = RateLimit(requests_per_minute=100, max_pause=300)
    async with attack_rig("openai", retry=policy, provider={"rate_limit": limit}) as r:
        t0 = trio.current_time()
        slow = http_error("openai", 429, "slow down", [("retry-after", "1e9")])
        _, result = await turn(r, slow, Reply(body=r.answer("ok")))
        assert (result.finish_reason, result.text) == ("stop", "ok")
        assert trio.current_time() - t0 == pytest.approx(300, abs=0.01)


async def test_a_pause_past_the_turns_deadline_ends_the_turn_at_its_deadline(autojump_clock):
    """A 120 s deadline facing a 600 s pause: the turn ends at 120 s, saying why."""
    policy = RetryPolicy(max_attempts=2, jitter=0)
    limit = RateLimit(requests_per_minute=100)
    agent = {"retry": policy, "budget": Budget(deadline=120)}
    async with attack_rig("openai", provider={"rate_limit": limit}, **agent) as r:
        t0 = trio.current_time()
        slow = http_error("openai", 429, "slow down", [("retry-after", "1e9")])
        chunks, result = await turn(r, slow, Reply(body=r.answer("ok")))
        assert trio.current_time() - t0 == pytest.approx(120, abs=0.01)
        assert (result.finish_reason, result.budget) == ("budget", "deadline")
        assert chunks[-1].type == "finish" and chunks[-1].budget == "deadline"
        assert len(r.server.requests) == 1
        stored = await r.host.store.load("s")
        assert stored.messages[-1].interrupted and not stored.messages[-1].content
