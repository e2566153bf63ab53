"""Retry policy for model calls: exponential backoff with jitter, honouring retry-after.

A call is retried only while its step has produced no output (a retried call would
otherwise stream the same text twice), only for errors classified ``retryable``, and
never for a cancellation.
"""

from __future__ import annotations

import random
from typing import Any

import attrs

from runtime.chunks import _eq, _hash, _repr
from runtime.errors import AxonError


@attrs.frozen(kw_only=True, slots=True)
class RetryPolicy:
    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash
    max_attempts: int = 3
    """Total attempts per model call, the first included (1 disables retries)."""
    initial_delay: float = 0.5
    max_delay: float = 20.0
    retry_after_cap: float = 60.0
    """A provider's ``retry-after`` is honoured up to this many seconds."""
    jitter: float = 0.25
    """Fraction of the delay randomized (0: deterministic)."""

    def delay(self, attempt: int, error: BaseException) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or ``None`` to give up."""
        if attempt >= self.max_attempts or not getattr(error, "retryable", False):
            return None
        retry_after: Any = (
            getattr(error, "retry_after", None) if isinstance(error, AxonError) else None
        )
        if retry_after is not None:
            return min(max(0.0, float(retry_after)), self.retry_after_cap)
        base = min(self.max_delay, self.initial_delay * (2 ** (attempt - 1)))
        delay: float = base * (1 - self.jitter + 2 * self.jitter * random.random())
        return delay
