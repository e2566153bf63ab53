"""Rate limits shared by every worker through Redis (:mod:`runtime.ratelimit`).

:class:`RedisLimitBackend` keeps each key's counts in Redis, beside the relay's streams
and over the relay's connection (:meth:`actors.relays.redis_streams.RedisRelay.rate_limits`),
so all the workers of a deployment keep one :class:`~runtime.ratelimit.RateLimit`
together. Each try is one Lua script, atomic in Redis, doing exactly what the in-process
backend does:

* ``…:req`` is a sorted set of the grants of the last minute (scored by time),
  ``…:tok`` the same with each grant's tokens in its member, ``…:run`` the calls in
  flight scored by when their slot lapses (a dead worker's comes back after
  :data:`~runtime.ratelimit.LEASE`), ``…:pause`` the time before which nothing is
  granted (``retry-after``, a limit the provider says is spent);
* time is Redis's (``TIME``, read by each worker and carried on its monotonic clock:
  :class:`~runtime.clocks.AnchoredClock`), not each machine's: a worker whose wall clock
  is an hour off neither spends a minute a second time (behind) nor holds the minute
  for an hour (ahead);
* the script never lets time go backwards (``…:now`` holds the latest time it was
  given): what is left of the workers' differences (a round trip's, a reading's age)
  still gives one order of grants, and no minute of that order holds more than the limit;
* every key expires two minutes after its last use: nothing is left behind.

``…:log`` keeps the times of the last :data:`AUDIT_SIZE` grants for an hour, for audits
(:meth:`RedisLimitBackend.granted`: the tests check no minute of it exceeds the limit).

**A Redis that does not answer.** Every round trip has a deadline (``op_timeout``, the
relay's); a deadline that passes starts the client's connections over (coredis would
queue the retry, and every call after it, behind the reply that never came: see
``RedisRelay._gave_up``), and the call is retried with backoff for ``retry_for`` seconds
(the relay's), then fails with :class:`~runtime.errors.RateLimitUnavailable`. Shared
limits *fail closed*: a call the limit cannot count is not made (the turn ends with that
error), because the limit promises that no minute holds more, for every worker together,
and a worker that went ahead uncounted could not keep it. A retried try is counted once:
a call already granted (its try applied, its reply lost) is granted again, not twice.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from actors.relays.redis_failures import _retried
from runtime.clocks import AnchoredClock
from runtime.errors import RateLimitUnavailable
from runtime.ratelimit import LEASE, POLL, WINDOW, RateLimit, Verdict

log = structlog.get_logger("axon.limits")

T = TypeVar("T")

OP_TIMEOUT = 5.0
"""Seconds one round trip to Redis may take (the relay's ``op_timeout`` by default)."""
RETRY_FOR = 30.0
"""Seconds a call is retried while Redis does not answer, before
:class:`~runtime.errors.RateLimitUnavailable` (the relay's ``retry_for`` by default)."""

_TTL_MS = int(2 * WINDOW * 1000)
AUDIT_SIZE = 10_000
"""Grant times kept per key in ``…:log`` (:meth:`RedisLimitBackend.granted`)."""
_AUDIT_TTL_MS = 3600 * 1000

_ACQUIRE = """
local now = tonumber(ARGV[1])
local last = tonumber(redis.call('GET', KEYS[5]) or '0')
if now < last then now = last end
redis.call('SET', KEYS[5], tostring(now), 'PX', ARGV[10])
local call, tokens = ARGV[2], tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], call) then return {'', tostring(now)} end
local rpm, tpm, slots = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local window, lease, poll = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local paused = tonumber(redis.call('GET', KEYS[4]) or '0')
if paused > now then return {'provider', tostring(paused - now)} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if rpm > 0 then
  local n = redis.call('ZCARD', KEYS[1])
  if n >= rpm then
    local frees = redis.call('ZRANGE', KEYS[1], n - rpm, n - rpm, 'WITHSCORES')
    return {'requests', tostring(tonumber(frees[2]) + window - now)}
  end
end
if tpm > 0 then
  local held = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  local total = 0
  for i = 1, #held, 2 do
    total = total + tonumber(string.match(held[i], ':(%d+)$'))
  end
  if total + tokens > tpm then
    for i = 1, #held, 2 do
      total = total - tonumber(string.match(held[i], ':(%d+)$'))
      if total + tokens <= tpm then
        return {'tokens', tostring(tonumber(held[i + 1]) + window - now)}
      end
    end
  end
end
if slots > 0 and redis.call('ZCARD', KEYS[3]) >= slots then
  return {'concurrency', tostring(poll)}
end
redis.call('ZADD', KEYS[1], now, call)
redis.call('ZADD', KEYS[2], now, call .. ':' .. tokens)
redis.call('ZADD', KEYS[3], now + lease, call)
redis.call('RPUSH', KEYS[6], tostring(now))
redis.call('LTRIM', KEYS[6], -tonumber(ARGV[11]), -1)
redis.call('PEXPIRE', KEYS[6], ARGV[12])
for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ARGV[10]) end
return {'', tostring(now)}
"""

_RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
local used, member = ARGV[3], ARGV[1] .. ':' .. ARGV[2]
local at = redis.call('ZSCORE', KEYS[1], member)
if used ~= '' and at then
  redis.call('ZREM', KEYS[1], member)
  redis.call('ZADD', KEYS[1], at, ARGV[1] .. ':' .. used)
end
return 1
"""

_PAUSE = """
local stop = tonumber(ARGV[1])
local paused = tonumber(redis.call('GET', KEYS[1]) or '0')
if stop > paused then
  redis.call('SET', KEYS[1], tostring(stop), 'PX', ARGV[2])
end
return 1
"""


class RedisLimitBackend:
    """A :class:`~runtime.ratelimit.LimitBackend` in Redis (see the module docstring).
    ``client`` is a ``coredis`` client (``decode_responses=False``); keys start with
    ``prefix`` (the relay's, then ``limit:``)."""

    def __init__(
        self,
        client: Any,
        prefix: str = "axon:",
        *,
        op_timeout: float = OP_TIMEOUT,
        retry_for: float = RETRY_FOR,
        retry_base: float = 0.05,
        retry_max: float = 2.0,
    ) -> None:
        self.client = client
        self.prefix = f"{prefix}limit:"
        self.op_timeout = op_timeout
        """Seconds one round trip may take (:data:`OP_TIMEOUT`)."""
        self.retry_for = retry_for
        """Seconds a call is retried before :class:`~runtime.errors.RateLimitUnavailable`."""
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.clock: AnchoredClock = AnchoredClock(self._redis_time)
        """Redis's clock (``TIME``), carried on this process's monotonic clock: the one
        every worker's limiter reads, so machines whose wall clocks differ still count
        one minute (runtime/clocks.py). :meth:`sync_clock` reads it."""
        self._scripts: dict[str, Any] = {}

    async def _redis_time(self) -> float:
        when = await self._call("time", self.client.time)
        return float(when.timestamp())

    async def sync_clock(self) -> None:
        """Read Redis's clock (a worker does as it starts; each try again once a minute
        passed): :class:`~runtime.errors.RateLimitUnavailable` when Redis does not
        answer, the reading held kept."""
        await self.clock.sync()

    def keys(self, key: str) -> list[str]:
        """The Redis keys of one limit key: grants, tokens, in flight, pause, time, log."""
        base = f"{self.prefix}{{{key}}}"  # one hash slot, for a cluster
        return [f"{base}:{name}" for name in ("req", "tok", "run", "pause", "now", "log")]

    async def _run(self, name: str, source: str, keys: list[str], args: list[Any]) -> Any:
        """:meth:`_script` through :meth:`_call`."""
        values = [str(a) for a in args]
        return await self._call(name, lambda: self._script(name, source, keys, values))

    async def _call(self, name: str, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` (one round trip) within ``op_timeout``, the pool started over
        when it passes, retried with backoff while Redis does not answer, for
        ``retry_for`` seconds; then :class:`~runtime.errors.RateLimitUnavailable` (see
        the module docstring). Every call to Redis goes through here: one whose reply
        never came and that left the pool as it was would hold every later call."""
        return await _retried(
            fn,
            within=self.op_timeout,
            retry_for=self.retry_for,
            base=self.retry_base,
            cap=self.retry_max,
            stalled=self.client.connection_pool.disconnect,
            failed=lambda error: RateLimitUnavailable(
                f"the shared rate limits' Redis did not answer for {self.retry_for:g} s "
                f"({name}): {error}"
            ),
            logger=log,
            event="limits.call_failed",
            what=name,
        )

    async def _script(self, name: str, source: str, keys: list[str], values: list[str]) -> Any:
        """Run a script by its SHA, loading it first when this Redis does not know it
        (a restarted Redis forgets them)."""
        from coredis.exceptions import NoScriptError

        sha = self._scripts.get(name)
        if sha is not None:
            try:
                return await self.client.evalsha(sha, keys=keys, args=values)
            except NoScriptError:
                pass
        self._scripts[name] = await self.client.script_load(source)
        return await self.client.eval(source, keys=keys, args=values)

    async def try_acquire(
        self, key: str, limit: RateLimit, now: float, call_id: str, tokens: int
    ) -> Verdict:
        if self.clock.due():  # for the next try: this one's ``now`` is read
            await self.sync_clock()
        reason, value = await self._run(
            "acquire",
            _ACQUIRE,
            self.keys(key),
            [
                repr(now),
                call_id,
                int(tokens),
                limit.requests_per_minute or 0,
                limit.tokens_per_minute or 0,
                limit.max_concurrency or 0,
                WINDOW,
                LEASE,
                POLL,
                _TTL_MS,
                AUDIT_SIZE,
                _AUDIT_TTL_MS,
            ],
        )
        reason = reason.decode() if isinstance(reason, bytes) else reason
        if not reason:
            return Verdict()
        return Verdict(wait=max(float(value), 0.001), reason=reason)

    async def release(
        self, key: str, now: float, call_id: str, granted_at: float, tokens: int, used: int | None
    ) -> None:
        keys = self.keys(key)
        await self._run(
            "release",
            _RELEASE,
            [keys[1], keys[2]],
            [call_id, int(tokens), "" if used is None else int(used)],
        )

    async def pause(self, key: str, now: float, until: float) -> None:
        await self._run("pause", _PAUSE, [self.keys(key)[3]], [repr(until), _TTL_MS])

    async def granted(self, key: str) -> list[float]:
        """The times of the last :data:`AUDIT_SIZE` grants of ``key`` (within the hour
        after its last grant), in order: what an audit of the limit reads."""
        audit = self.keys(key)[5]
        times = await self._call("granted", lambda: self.client.lrange(audit, 0, -1))
        return [float(t) for t in times]


__all__ = ["RedisLimitBackend"]
