"""The turn runner's side of rate limits (:mod:`runtime.ratelimit`).

Before each model call the runner asks its provider's limiter (the host set it, in this
process or in Redis) for a grant; while it waits, the turn's stream shows a
``throttled`` chunk and the bus a ``provider.throttled`` event, once per wait. After the
call the grant goes back with the tokens the call used, shielded and bounded: a slot is
never kept by a cancelled turn (at worst, a dead process's lapses after ``LEASE``).
A shared limit whose Redis does not answer fails the grant
(:class:`~runtime.errors.RateLimitUnavailable`, the turn's error); a give-back that
fails is logged, the call being over.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio

from runtime.chunks import Usage
from runtime.errors import RateLimitUnavailable, describe_exception
from runtime.ratelimit import Grant, Limiter, Verdict
from runtime.redact import redact

log = structlog.get_logger("axon.limits")

RELEASE_TIMEOUT = 2.0
"""Seconds giving a grant back may take (a Redis round trip)."""


def limiter_of(provider: Any) -> Limiter | None:
    """The provider's limiter, if the host gave it one (a rate limit is configured)."""
    limiter = getattr(provider, "limiter", None)
    return limiter if isinstance(limiter, Limiter) else None


async def acquire(
    limiter: Limiter | None,
    tokens: Callable[[], int],
    on_wait: Callable[[Verdict], Awaitable[None]] | None = None,
) -> Grant | None:
    """A grant for one model call (``None`` without a limiter); ``tokens`` estimates the
    call's input, asked only when the limit counts tokens."""
    if limiter is None:
        return None
    estimate = tokens() if limiter.limit.tokens_per_minute is not None else 0
    return await limiter.acquire(estimate, on_wait)


async def release(limiter: Limiter | None, grant: Grant | None, usage: Usage | None) -> None:
    """Give ``grant`` back with the tokens the call used (its estimate when it reported none)."""
    if limiter is None or grant is None:
        return
    used = usage.total_tokens if usage is not None and usage.total_tokens else None
    with trio.CancelScope(shield=True), trio.move_on_after(RELEASE_TIMEOUT):
        try:
            await limiter.release(grant, used)
        except RateLimitUnavailable as exc:  # the slot lapses after LEASE; the call is done
            log.warning(
                "limits.release_failed",
                key=limiter.key,
                error=redact(describe_exception(exc)),
            )
