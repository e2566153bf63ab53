"""Rate limits per provider and model, shared by every process that calls it.

``max_concurrency`` bounds the calls of one process; ten workers would each use all of
it. A :class:`RateLimit` on a provider (``OpenAIProvider(..., rate_limit=RateLimit(
requests_per_minute=500, tokens_per_minute=200_000, max_concurrency=20))``) is kept by a
:class:`Limiter` over a :class:`LimitBackend` that holds the counts: in-process
(:class:`MemoryBackend`) when Axon is embedded, in Redis (``actors/limits.py``) when
workers run, so that all of them together keep it. The turn runner asks the limiter
before every model call and tells it the tokens the call used after it.

The counts are sliding windows of one minute, exact: a call is granted only if fewer
than ``requests_per_minute`` calls were granted in the minute before it (and the tokens
of those, with this call's estimate, stay within ``tokens_per_minute``), so no minute,
wherever it starts, ever holds more. A call that must wait is told how long; the runner
publishes a ``provider.throttled`` event and streams a ``throttled`` chunk (the AI SDK
stream's transient ``data-throttled``) so a UI can say so.

The provider's own word comes first: ``retry-after`` on a 429 (Gemini's: the
``google.rpc.RetryInfo`` ``retryDelay`` of its ``RESOURCE_EXHAUSTED`` error body, which
the provider reads into the error's ``retry_after``), and the ``x-ratelimit-*`` /
``anthropic-ratelimit-*`` headers and ``retry-after`` of every response
(:func:`parse_rate_headers`), pause every caller of the key until the reset they name.

Time is a :class:`Clock`: Trio's for the in-process backend, the wall clock for Redis
(processes on several machines share it; the Redis script never lets it go backwards).
Tests inject their own, so a minute of limits runs in milliseconds.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

import attrs
import trio

from runtime.chunks import _repr
from runtime.errors import ConfigurationError
from runtime.ids import new_id

WINDOW = 60.0
"""Seconds of the sliding window every per-minute limit counts over."""
LEASE = 600.0
"""Seconds a granted call holds a concurrency slot at most: a process that died with a
call in flight gives its slot back after that."""
MAX_PAUSE = 600.0
"""The default of :attr:`RateLimit.max_pause`: seconds a pause the provider asks for
(``retry-after`` on a 429, a spent limit's ``x-ratelimit-reset-*`` /
``anthropic-ratelimit-*-reset``) holds every caller at most: above the longest reset of a
per-minute limit (OpenAI says ``6m0s`` for tokens). A longer one (a daily quota, a
hostile server's ``retry-after: 1e9``) held every session of the key in the limiter for
hours or for ever, each stream saying ``throttled``; now the call goes after this, and a
provider still refusing it ends the turn with its 429."""
POLL = 0.25
"""Seconds between two tries while every concurrency slot is taken (a slot frees when a
call ends, which a waiter elsewhere cannot hear of)."""


class Clock(Protocol):
    """Where a limiter reads the time and waits."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class TrioClock:
    """Trio's clock (tests run it virtually with ``autojump_clock``): for one process."""

    def now(self) -> float:
        return trio.current_time()

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class WallClock:
    """Seconds since the epoch: what processes on several machines agree on."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


def _positive(_: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ConfigurationError(f"{attribute.name} must be a whole number >= 1 or None")


def _a_pause(_: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigurationError(f"{attribute.name} must be a finite number of seconds >= 0")


@attrs.frozen(kw_only=True, slots=True)
class RateLimit:
    """The limits of one provider configuration (its provider, model and endpoint),
    for all processes together. ``None``: no such limit."""

    __repr__ = _repr

    requests_per_minute: int | None = attrs.field(default=None, validator=_positive)
    tokens_per_minute: int | None = attrs.field(default=None, validator=_positive)
    """Input and output tokens: a call is counted at its input estimate when granted,
    then at what it used (``usage.total_tokens``) once it ends."""
    max_concurrency: int | None = attrs.field(default=None, validator=_positive)
    """Calls in flight at once."""
    max_pause: float = attrs.field(default=MAX_PAUSE, validator=_a_pause)
    """Seconds a pause the provider asks for holds every caller at most
    (:data:`MAX_PAUSE`, 600 s, by default). A turn's own deadline (``Budget.deadline``)
    still ends a wait that would pass it."""
    clock: Clock | None = attrs.field(default=None, eq=False)
    """``None``: the backend's (:class:`TrioClock` in one process, :class:`WallClock`
    over Redis). Tests give a virtual one."""


@attrs.frozen(kw_only=True, slots=True)
class Verdict:
    """A backend's answer to a try: granted (``wait`` 0), or how long to wait and why
    (``"requests"``, ``"tokens"``, ``"concurrency"``, ``"provider"``: a pause the
    provider asked for)."""

    __repr__ = _repr

    wait: float = 0.0
    reason: str = ""

    @property
    def granted(self) -> bool:
        return self.wait <= 0


GRANTED = Verdict()


class LimitBackend(Protocol):
    """Holds the counts of every key; each call is one atomic step."""

    clock: Clock
    """The clock its limiters use unless their :class:`RateLimit` names one."""

    async def try_acquire(
        self, key: str, limit: RateLimit, now: float, call_id: str, tokens: int
    ) -> Verdict:
        """Grant the call ``call_id`` (estimated ``tokens``) at ``now`` and count it, or
        say how long to wait, counting nothing."""
        ...

    async def release(
        self, key: str, now: float, call_id: str, granted_at: float, tokens: int, used: int | None
    ) -> None:
        """The call ended: free its slot; count ``used`` tokens in place of its estimate."""
        ...

    async def pause(self, key: str, now: float, until: float) -> None:
        """Grant nothing for ``key`` before ``until`` (the latest pause wins)."""
        ...


@attrs.frozen(kw_only=True, slots=True)
class Grant:
    """A granted call, to hand back to :meth:`Limiter.release`."""

    __repr__ = _repr

    call_id: str
    granted_at: float
    tokens: int
    waited: float
    """Seconds it waited for its grant (by the limiter's clock)."""


OnWait = Callable[[Verdict], Awaitable[None]]


class Limiter:
    """One provider configuration's :class:`RateLimit` over a :class:`LimitBackend`."""

    def __init__(self, key: str, limit: RateLimit, backend: LimitBackend, clock: Clock) -> None:
        self.key = key
        self.limit = limit
        self.backend = backend
        self.clock = limit.clock or clock

    async def acquire(self, tokens: int = 0, on_wait: OnWait | None = None) -> Grant:
        """Wait until the call may go (``on_wait`` hears each wait first), then return
        its grant. A call estimated above ``tokens_per_minute`` is counted at that limit
        (it would never fit otherwise)."""
        if self.limit.tokens_per_minute is not None:
            tokens = min(tokens, self.limit.tokens_per_minute)
        call_id = new_id("call")
        start = self.clock.now()
        while True:
            now = self.clock.now()
            verdict = await self.backend.try_acquire(self.key, self.limit, now, call_id, tokens)
            if verdict.granted:
                return Grant(call_id=call_id, granted_at=now, tokens=tokens, waited=now - start)
            if on_wait is not None:
                await on_wait(verdict)
            await self.clock.sleep(verdict.wait)

    async def release(self, grant: Grant, used: int | None = None) -> None:
        """The call ended; ``used``: the tokens it really took (``None``: keep the estimate)."""
        if self.limit.tokens_per_minute is not None and used is not None:
            used = min(used, self.limit.tokens_per_minute)
        await self.backend.release(
            self.key, self.clock.now(), grant.call_id, grant.granted_at, grant.tokens, used
        )

    async def pause_for(self, seconds: float) -> None:
        """Grant nothing for ``seconds`` (the provider said so: ``retry-after``, or a
        limit of its own at zero until its reset), at most the limit's ``max_pause``."""
        seconds = min(seconds, self.limit.max_pause)
        if seconds > 0:
            now = self.clock.now()
            await self.backend.pause(self.key, now, now + seconds)


# -- in one process ----------------------------------------------------------------------


@attrs.define(slots=True)
class _Counts:
    __repr__ = _repr
    requests: deque[float] = attrs.field(factory=deque)
    tokens: dict[str, tuple[float, int]] = attrs.field(factory=dict)
    """Call id -> (granted at, tokens)."""
    in_flight: dict[str, float] = attrs.field(factory=dict)
    """Call id -> when its slot lapses."""
    paused_until: float = 0.0


class MemoryBackend:
    """The counts of one process (the embedded default). Trio runs one task at a time,
    so each method is atomic as it is: none awaits."""

    def __init__(self) -> None:
        self._keys: dict[str, _Counts] = {}
        self.clock: Clock = TrioClock()
        """The clock its limiters use unless their :class:`RateLimit` names one."""

    async def try_acquire(
        self, key: str, limit: RateLimit, now: float, call_id: str, tokens: int
    ) -> Verdict:
        counts = self._keys.setdefault(key, _Counts())
        if counts.paused_until > now:
            return Verdict(wait=counts.paused_until - now, reason="provider")
        since = now - WINDOW
        while counts.requests and counts.requests[0] <= since:
            counts.requests.popleft()
        for cid, (at, _) in list(counts.tokens.items()):
            if at <= since:
                del counts.tokens[cid]
        for cid, lapse in list(counts.in_flight.items()):
            if lapse <= now:
                del counts.in_flight[cid]
        rpm, tpm, slots = limit.requests_per_minute, limit.tokens_per_minute, limit.max_concurrency
        if rpm is not None and len(counts.requests) >= rpm:
            frees = counts.requests[len(counts.requests) - rpm]
            return Verdict(wait=frees + WINDOW - now, reason="requests")
        if tpm is not None:
            wait = _tokens_wait(sorted(counts.tokens.values()), tpm, tokens, now)
            if wait > 0:
                return Verdict(wait=wait, reason="tokens")
        if slots is not None and len(counts.in_flight) >= slots:
            return Verdict(wait=POLL, reason="concurrency")
        counts.requests.append(now)
        counts.tokens[call_id] = (now, tokens)
        counts.in_flight[call_id] = now + LEASE
        return GRANTED

    async def release(
        self, key: str, now: float, call_id: str, granted_at: float, tokens: int, used: int | None
    ) -> None:
        counts = self._keys.get(key)
        if counts is None:
            return
        counts.in_flight.pop(call_id, None)
        if used is not None and call_id in counts.tokens:
            counts.tokens[call_id] = (granted_at, used)

    async def pause(self, key: str, now: float, until: float) -> None:
        counts = self._keys.setdefault(key, _Counts())
        counts.paused_until = max(counts.paused_until, until)


def _tokens_wait(window: list[tuple[float, int]], tpm: int, tokens: int, now: float) -> float:
    """Seconds until ``tokens`` more fit under ``tpm``, given the window's ``(granted at,
    tokens)`` in time order (0: now)."""
    total = sum(t for _, t in window)
    if total + tokens <= tpm:
        return 0.0
    for at, t in window:  # the oldest leave first
        total -= t
        if total + tokens <= tpm:
            return at + WINDOW - now
    return 0.0  # unreachable: tokens <= tpm, and an empty window holds it


# -- what the provider says --------------------------------------------------------------


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds_until(value: str | None, now_epoch: float) -> float | None:
    """A reset as OpenAI writes it (``"1s"``, ``"6m0s"``, ``"20ms"``), Anthropic
    (RFC 3339 ``"2026-01-01T00:00:30Z"``) or plain seconds; ``None`` if unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    pieces = _DURATION.findall(value)
    if pieces and "".join(n + u for n, u in pieces) == value:
        return sum(float(n) * _UNIT[u] for n, u in pieces)
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        try:  # an HTTP date, as retry-after may be
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - now_epoch)


def _http_date(value: str | None) -> float | None:
    """An HTTP date (a response's ``Date``) in seconds since the epoch; ``None`` if
    absent or unreadable."""
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return when.timestamp()


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


_REMAINING_RESET = (
    ("x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
    ("x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"),
    ("anthropic-ratelimit-requests-remaining", "anthropic-ratelimit-requests-reset"),
    ("anthropic-ratelimit-tokens-remaining", "anthropic-ratelimit-tokens-reset"),
    ("anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-input-tokens-reset"),
    ("anthropic-ratelimit-output-tokens-remaining", "anthropic-ratelimit-output-tokens-reset"),
)


def parse_rate_headers(
    headers: Mapping[str, str] | Any, *, now_epoch: float | None = None
) -> float:
    """Seconds every caller should wait, from a response's headers (0: none): the
    longest reset among the ``x-ratelimit-*`` (OpenAI) and ``anthropic-ratelimit-*``
    limits whose remaining count is 0, and ``retry-after-ms`` / ``retry-after``. A
    malformed header counts as absent. Absolute resets are read against the response's
    ``Date`` when it has one (``now_epoch``, this machine's clock by default, otherwise)."""
    if headers is None:
        return 0.0
    now_epoch = time.time() if now_epoch is None else now_epoch
    # An absolute reset is the provider's clock: read it against the response's own
    # ``Date`` (that clock too), not this machine's, which may be off by an hour; the
    # pause it sets is every worker's (docs/deployment.md, "One clock decides").
    said = _http_date(headers.get("date"))
    if said is not None:
        now_epoch = said
    wait = 0.0
    get = headers.get
    for remaining, reset in _REMAINING_RESET:
        if _int(get(remaining)) == 0:
            seconds = _seconds_until(get(reset), now_epoch)
            if seconds is not None and math.isfinite(seconds):
                wait = max(wait, seconds)
    ms = get("retry-after-ms")
    after = float(str(ms)) / 1000 if _is_number(ms) else None
    if after is None or not math.isfinite(after):  # a bad one leaves it to retry-after
        after = _seconds_until(get("retry-after"), now_epoch)
    if after is not None and math.isfinite(after):
        wait = max(wait, after)
    return wait


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def limit_key(provider: str, model: str, endpoint: str | None) -> str:
    """The key a provider configuration's counts are kept under: its provider, model and
    endpoint (two servers, two limits)."""
    return f"{provider}|{model}|{endpoint or '-'}"


__all__ = [
    "GRANTED",
    "LEASE",
    "WINDOW",
    "Clock",
    "Grant",
    "LimitBackend",
    "Limiter",
    "MemoryBackend",
    "RateLimit",
    "TrioClock",
    "Verdict",
    "WallClock",
    "limit_key",
    "parse_rate_headers",
]
