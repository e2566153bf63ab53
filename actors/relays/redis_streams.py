"""The live-output relay on Redis Streams: one stream per turn, any front end reads it.

:class:`RedisRelay` connects, hands out writers, reads a turn's stream back and carries
cancel requests; this module is the one every import names (``RedisRelay``,
``RedisRelayWriter``, ``StepRestarted``, ``public_url``, the defaults). Its parts live
beside it: the keys' layout, the stream's entries and how a reader proves them continuous
(:mod:`~actors.relays.redis_entries`); a turn's writer, its coalescing and the turn going
on while Redis is down (:mod:`~actors.relays.redis_writer`); the relay's one flush task
(:mod:`~actors.relays.redis_flush`); which Redis errors are retried, and the backoff
(:mod:`~actors.relays.redis_failures`).

**Pauses.** A turn that suspends to wait for a person (docs/approval.md) ends its part of
the stream with a *paused* end (``{"type": "relay.end", "paused": true}``, which an older
reader takes for the end); the worker that resumes it later continues the same stream,
its seqs following on, so one ``Last-Event-ID`` space covers the whole turn. A read stops
at a pause that is the stream's last item (the turn waits), and passes over one that has
more after it (the continuation), yielding that continuation's ``start`` again (same
message id). ``read(after_pauses=k)`` starts after the turn's k-th pause, waiting for it
if need be: what the front end that recorded the decisions streams as the continuation.

coredis is anyio-based and runs under Trio as it is. Imported only by the relay's modules
(``actors/relays/``), on first use.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import orjson
import structlog
import trio
from cattrs.errors import BaseValidationError

from actors.relays.limits import RedisLimitBackend
from actors.relays.redis_entries import (
    END,
    ENTRY_BYTES,
    PAGE,
    NamedStop,
    _cancel_from,
    _Cursor,
    _decode,
    _identifier,
    _Place,
    _Resets,
    _Sieve,
    _turn_id,
    _Undecodable,
)
from actors.relays.redis_failures import (
    _backoff,
    _closed_stream,
    _described,
    _retried,
    _single_leaf,
    _transient,
    _wait_for_redis,
    keep_pool_places,
)
from actors.relays.redis_flush import _Flusher
from actors.relays.redis_writer import (
    END_TTL,
    END_WAIT,
    FLUSH_INTERVAL,
    LIVE_TTL,
    MAX_QUEUE,
    MAX_QUEUE_BYTES,
    RedisRelayWriter,
    _entries,
)
from runtime.errors import ConfigurationError, RelayTurnGone, RelayUnavailable
from runtime.output import OutputChunk
from runtime.redact import redact_url, register_url_secrets
from runtime.relay import RESTART_STEP as RESTART
from runtime.relay import StepRestarted
from runtime.serde import structure

log = structlog.get_logger("axon.relay")

DEFAULT_PREFIX = "axon:"
RETRY_FOR = 30.0
"""Seconds a reader keeps retrying a Redis that does not answer before it gives up
(:class:`~runtime.errors.RelayUnavailable`)."""
BLOCK_MS = 1000
"""How long one blocking ``XREAD`` waits for new entries before checking the key again."""
PAGE_BYTES = 1024 * 1024
"""Bytes (the entries' fields and values) a read's page holds at most, past its first
entry: an ``XRANGE`` of :data:`PAGE` entries took 256 entries whatever their size (256
entries of 16 MB, one writer's bound each, were 4 GB in one reply). A backlog that fits
in one page is read once; a longer one twice (a first pass finds its resets, the second
yields as it goes), holding a page at a time."""
FALLBACK_PAGE = 16
"""The most entries a page holds where Redis refuses the page script (``XRANGE``, not
bounded in bytes by Redis: :meth:`RedisRelay._page`)."""
CANCEL_PING = 5.0
"""Seconds between two PINGs on the cancel watch's subscription (one a process): a
subscription that answers none within ``op_timeout`` is dropped and made again."""
CANCEL_TTL_MS = 60_000
"""How long a cancel request's record (``…cancel:{turn_id}``) lives: what a watch that
subscribes again reads for the cancels it may have missed meanwhile."""
CLOSED_KEPT = 1024
"""Turns whose writers closed that a relay remembers (:attr:`RedisRelay.closed`): their
named stops are read back too when the cancel watch subscribes again."""
UNPLACED_KEPT = 1024
"""Named stops sent while the relay streamed no turn of their session that Redis keeps
(:meth:`RedisRelay.unplaced_stops_key`, one stream for every session: the oldest go
first), for a watch that subscribes again to read back."""

_RECENT_CANCELS = """
local out = {}
local named = {}
local plain = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stream = KEYS[#KEYS]
local since = string.format('%d', now - tonumber(ARGV[2]))
local entries = redis.call('XRANGE', stream, since, '+', 'COUNT', ARGV[3])
for _, entry in ipairs(entries) do
  local at = tonumber(string.match(entry[1], '^(%d+)'))
  table.insert(named, entry[2][2])
  table.insert(named, now - at)
end
for i, key in ipairs(KEYS) do
  if i == #KEYS then
    break
  elseif i <= plain then
    local reason = redis.call('GET', key)
    if reason then
      table.insert(out, i)
      table.insert(out, reason)
      table.insert(out, redis.call('PTTL', key))
    end
  else
    local stops = redis.call('HGETALL', key)
    for j = 1, #stops, 2 do
      table.insert(named, stops[j])
      table.insert(named, now - tonumber(stops[j + 1]))
    end
  end
end
return {out, named}
"""
"""The plain cancels (``GET``, and their ``PTTL``) of the first ``ARGV[1]`` keys, and the
named stops of the rest but the last (each stop's message and its age in ms by Redis's
clock) after those of the last, the unplaced stops' stream, recorded in the last
``ARGV[2]`` ms (at most ``ARGV[3]``)."""

_RECORD_NAMED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
"""Record a named stop (``ARGV[1]``, its channel message) with the time it was recorded,
Redis's own (every host reads the one clock); the hash lives ``ARGV[2]`` ms past the
latest."""

_RECORD_UNPLACED = """
redis.call('XADD', KEYS[1], 'MAXLEN', ARGV[3], '*', 'm', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
"""Record a named stop sent while no turn of its session streamed (``ARGV[1]``, its
channel message) on the stream of them all, at most ``ARGV[3]`` kept (the entry's id is
Redis's time of it); the stream lives ``ARGV[2]`` ms past the latest."""


_PAGE = """
local start, stop = ARGV[1], ARGV[2]
local count, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local out, used, biggest, batch = {}, 0, 1, 1
while #out < count do
  local got = redis.call('XRANGE', KEYS[1], start, stop, 'COUNT', batch)
  for _, entry in ipairs(got) do
    local size = 0
    for _, value in ipairs(entry[2]) do size = size + #value end
    if #out > 0 and used + size > budget then return {1, out} end
    out[#out + 1] = entry
    used = used + size
    if size > biggest then biggest = size end
    start = '(' .. entry[1]
  end
  if #got < batch then return {0, out} end
  batch = math.max(1, math.min(count - #out, math.floor((budget - used) / biggest)))
end
return {1, out}
"""
"""One page of a stream (``KEYS[1]``) from ``ARGV[1]`` to ``ARGV[2]``: at most ``ARGV[3]``
entries, and at most ``ARGV[4]`` bytes of fields and values past the first entry, and
whether the range may hold more (``1``). Redis has no byte bound on ``XRANGE``: the
script reads in batches sized by the biggest entry seen so far, so Redis holds about a
page too, not ``ARGV[3]`` entries of any size."""


def _scripts_refused(error: BaseException) -> bool:
    """Whether Redis's answer to a page script says it runs no script for the relay: the
    ACL denies it (``NOPERM``), ``EVAL`` is renamed away (unknown command), or scripting
    is disabled. Any other error (``BUSY``: another client's script ran past Redis's
    ``busy-reply-threshold``) is that page's, read with ``XRANGE``: taken for a refusal,
    it turned the script off for every later read of the process."""
    from coredis.exceptions import AuthorizationError, UnknownCommandError

    if isinstance(error, AuthorizationError | UnknownCommandError):
        return True
    return "disabled" in str(error).lower()


class RedisRelay:
    """:class:`runtime.relay.Relay` on Redis Streams. Open with :meth:`RedisRelay.open`."""

    def __init__(
        self,
        client: Any,
        nursery: trio.Nursery,
        *,
        prefix: str = DEFAULT_PREFIX,
        live_ttl: int = LIVE_TTL,
        end_ttl: int = END_TTL,
        max_queue: int = MAX_QUEUE,
        max_queue_bytes: int = MAX_QUEUE_BYTES,
        retry_base: float = 0.05,
        retry_max: float = 2.0,
        retry_for: float = RETRY_FOR,
        op_timeout: float = 5.0,
        close_timeout: float = 10.0,
        block_ms: int = BLOCK_MS,
        flush_interval: float = FLUSH_INTERVAL,
        end_wait: float = END_WAIT,
        cancel_ping: float = CANCEL_PING,
        page_bytes: int = PAGE_BYTES,
        entry_bytes: int = ENTRY_BYTES,
        url: str | None = None,
    ) -> None:
        self.client = client
        self.nursery = nursery
        self.prefix = prefix
        self.live_ttl = live_ttl
        self.end_ttl = end_ttl
        self.max_queue = max_queue
        self.max_queue_bytes = max_queue_bytes
        """Bytes a writer holds before its turn waits (:data:`MAX_QUEUE_BYTES`)."""
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.retry_for = retry_for
        self.op_timeout = op_timeout
        self.close_timeout = close_timeout
        self.block_ms = block_ms
        self.flush_interval = flush_interval
        """Seconds: a writer's flush within this of its previous one waits for the next
        tick of this period, shared by the relay's writers (:data:`FLUSH_INTERVAL`)."""
        self.end_wait = end_wait
        """Seconds a turn's last chunk waits at most for its writer's close, to go out
        with the end in one entry (:data:`END_WAIT`)."""
        self.page_bytes = page_bytes
        """Bytes a reader's page of entries holds at most, past one entry
        (:data:`PAGE_BYTES`)."""
        self.entry_bytes = entry_bytes
        """Bytes of chunks' JSON a stream entry holds at most: a larger flush is several
        entries, a larger chunk several parts (:data:`ENTRY_BYTES`)."""
        self.scripts_refused = False
        """Whether Redis refused a reader's page script (:meth:`_page`): ``XRANGE`` then."""
        self.cancel_ping = cancel_ping
        """Seconds between two PINGs on the cancel subscription (:data:`CANCEL_PING`)."""
        self.down = False
        """Whether a read gave up on Redis (its ``retry_for`` passed with no answer) and
        none answered since: a read then gets one try, not ``retry_for`` seconds of them
        (a POST during an outage was answered only after that wait, each time); the
        first that is answered clears it."""
        self.subscriber: Any = None
        """The client (and pool) of the cancel watch's subscription (:meth:`open` makes
        one; ``None``: ``client``'s). Apart from ``client``, whose pool starts over when
        a read gets no reply (:meth:`_gave_up`): that dropped the subscription too, and
        coredis subscribed again by itself, the watch none the wiser, so a cancel
        published in between was lost, its record never read back."""
        self.live: set[RedisRelayWriter] = set()
        """Writers not closed yet (the relay's close lets their queues out)."""
        self.closed: OrderedDict[str, float] = OrderedDict()
        """The turns whose writers closed lately (trio clock of the close), the latest
        last: a named stop is recorded under the session's running turn
        (:meth:`named_stops_key`) but may name another of this process (a queued
        message, which runs next); one sent while the subscription was dead is read back
        under a turn that ended since too (:meth:`_missed_cancels`). At most
        :data:`CLOSED_KEPT`, none older than :data:`CANCEL_TTL_MS` (the record's life)."""
        self.batcher = _Flusher(client, url, op_timeout)
        """The relay's one flush task: writes the writers' queues when due, those due at
        one moment in one pipeline (on a connection of its own for a plain ``url``)."""
        nursery.start_soon(self.batcher.run)

    @classmethod
    @asynccontextmanager
    async def open(cls, url: str, **options: Any) -> AsyncIterator[RedisRelay]:
        """Connect to the Redis at ``url`` (``redis://host:port/db``); leaving the block
        stops the relay's flush task (close writers first to flush them).

        A bad URL raises :class:`~runtime.errors.ConfigurationError`; a Redis that does
        not answer raises :class:`~runtime.errors.RelayUnavailable` (after retrying for
        ``retry_for`` seconds), both naming the URL without its password.
        """
        try:
            import coredis
        except ImportError as exc:  # pragma: no cover - an install problem
            raise ConfigurationError("the Redis relay needs coredis: pip install coredis") from exc
        shown = public_url(url)
        register_url_secrets(url)  # a client's error quoting the URL is redacted too
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise ConfigurationError(
                f"bad Redis URL {shown!r}: expected redis://host:port/db (or rediss://, unix://)"
            )
        try:
            client = keep_pool_places(
                coredis.Redis.from_url(
                    url, decode_responses=False, connect_timeout=2.0, verify_version=False
                )
            )
            # The cancel watch's subscription has a pool of its own: the relay's pool
            # starts over when a reply never comes (``_gave_up``), and coredis would
            # subscribe again on its own, unseen by the watch, missing what was
            # published meanwhile.
            subscriber = keep_pool_places(
                coredis.Redis.from_url(
                    url, decode_responses=False, connect_timeout=2.0, verify_version=False
                )
            )
        except ValueError as exc:
            raise ConfigurationError(f"bad Redis URL {shown!r}: {exc}") from None
        relay_options = dict(options)
        retry_for = float(relay_options.get("retry_for", RETRY_FOR))
        op_timeout = float(relay_options.get("op_timeout", 5.0))
        try:
            async with client, subscriber:
                await _wait_for_redis(client, shown, retry_for, op_timeout)
                async with trio.open_nursery() as nursery:
                    relay = cls(client, nursery, url=url, **relay_options)
                    relay.subscriber = subscriber
                    try:
                        yield relay
                    finally:
                        await relay.aclose()
                        nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The client's task group and the writers' nursery wrap what the caller's block
            # raised; a caller expects the one error it raised (LookupError, ...) unwrapped.
            leaf = _single_leaf(group)
            if leaf is None:
                raise
            raise leaf from None

    async def aclose(self) -> None:
        """Let the writers' queued chunks out (at most ``close_timeout``); called when the
        :meth:`open` block ends. Writers not closed stay open (a worker's shutdown leaves
        its turns to a takeover)."""
        for writer in list(self.live):
            writer._hurry_up()  # what a writer holds goes out at once
        with trio.CancelScope(shield=True), trio.move_on_after(self.close_timeout):
            for writer in list(self.live):
                await writer.flushed()

    def _forget(self, writer: RedisRelayWriter) -> None:
        """``writer`` is closed: not the relay's to flush any more."""
        self.live.discard(writer)
        self.batcher.forget(writer)
        closed, now = self.closed, self.batcher.now()
        closed[writer.turn_id] = now
        closed.move_to_end(writer.turn_id)
        while closed and (
            len(closed) > CLOSED_KEPT or next(iter(closed.values())) < now - CANCEL_TTL_MS / 1000
        ):
            closed.popitem(last=False)

    def next_tick(self, now: float) -> float:
        """The relay's next flush tick after ``now`` (Trio clock): the next multiple of
        ``flush_interval``, the same for every writer, so those that wait flush together."""
        interval = self.flush_interval
        return interval * (math.floor(now / interval) + 1)

    def rate_limits(self) -> Any:
        """A rate-limit backend over this relay's connection and prefix, which every
        worker sharing the relay shares (:class:`actors.relays.limits.RedisLimitBackend`),
        with the relay's deadline of a round trip and retry window."""
        return RedisLimitBackend(
            self.client,
            self.prefix,
            op_timeout=self.op_timeout,
            retry_for=self.retry_for,
            retry_base=self.retry_base,
            retry_max=self.retry_max,
        )

    # -- keys -------------------------------------------------------------------------------

    def turn_key(self, turn_id: str) -> str:
        return f"{self.prefix}turn:{turn_id}"

    def active_key(self, session_id: str) -> str:
        return f"{self.prefix}active:{session_id}"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}cancel"

    def cancel_key(self, turn_id: str) -> str:
        """Where a cancel request of ``turn_id`` is recorded for :data:`CANCEL_TTL_MS`."""
        return f"{self.prefix}cancel:{turn_id}"

    def named_stops_key(self, turn_id: str) -> str:
        """Where the named stops sent to the host that runs ``turn_id`` are recorded (a
        hash: each stop's message, when it was recorded) for :data:`CANCEL_TTL_MS`. Apart
        from :meth:`cancel_key`: a named stop read back as a plain cancel would cancel
        the running turn for a stop naming a waiting message."""
        return f"{self.prefix}named-stops:{turn_id}"

    @property
    def unplaced_stops_key(self) -> str:
        """Where the named stops sent while the relay streamed no turn of their session are
        recorded: one stream for every session (its entries' ids are when, by Redis's
        clock), at most :data:`UNPLACED_KEPT`, for :data:`CANCEL_TTL_MS` after the latest.
        A watch that subscribes again reads back all those it may have missed
        (:meth:`_missed_cancels`), whatever their session: a turn that has not written its
        first chunk yet, or whose POST has not even reached its host, runs on a host that
        cannot name it."""
        return f"{self.prefix}unplaced-stops"

    # -- writing ----------------------------------------------------------------------------

    def writer(
        self,
        *,
        session_id: str,
        turn_id: str,
        takeover: bool = False,
        fresh: bool = False,
        resumed: bool = False,
        first_step: int | None = None,
        pauses: int = 0,
    ) -> RedisRelayWriter:
        """A writer for a turn this process runs; the relay's flush task writes what it
        queues. A second writer for the same turn (a ``takeover``) continues its seqs; a
        takeover that finds no stream starts one readers cannot take for the whole turn,
        and so does a ``resumed`` one (a continuation) whose stream does not end with
        its pause.
        A ``fresh`` writer (nothing streamed the turn before) starts at seq 1 without
        reading the stream's tail: one ``XREVRANGE`` fewer per turn. A takeover's
        ``first_step`` (``0``: nothing of the turn committed) is what a stream found
        missing is judged by at once: the turn's ``start`` goes out without waiting
        for the step's first chunk (:meth:`RedisRelayWriter.shown`). ``pauses``: how
        many times the turn waited (its continuation number): a takeover whose stream
        does not end with a pause and holds fewer makes readers rebuild from the store.

        A continuation (``resumed``, or a writer that says neither, as an embedded host's
        continuation opens it) of a turn whose earlier writer in this process is still
        open reads the stream's tail once that one is closed
        (:meth:`RedisRelayWriter.follow`); a takeover does not wait for a writer the
        turn lost."""
        writer = RedisRelayWriter(
            self,
            session_id=session_id,
            turn_id=turn_id,
            takeover=takeover and not fresh,
            resumed=resumed and not fresh,
            pauses=0 if fresh else pauses,
        )
        if fresh:
            writer.start_fresh()
        else:
            if takeover and first_step is not None:
                writer._learn_step(first_step)
            if resumed or not takeover:
                earlier = [other for other in self.live if other.turn_id == turn_id]
                if earlier:
                    writer.follow(earlier)
        self.live.add(writer)
        return writer

    # -- reading ----------------------------------------------------------------------------

    async def _call(
        self, what: str, fn: Callable[[], Any], *, blocking: bool = False, unseen: bool = False
    ) -> Any:
        """``await fn()`` with retries and backoff while Redis does not answer, for up to
        ``retry_for`` seconds, then :class:`~runtime.errors.RelayUnavailable`.
        ``blocking``: ``fn`` is a blocking command (``XREAD BLOCK``), on a connection of
        its own that coredis drops when it is given up. ``unseen``: the first command of
        a read whose reader was shown nothing (:meth:`read`): no Redis to connect to
        gives up at once, and does not mark the relay :attr:`down`."""
        within = self.op_timeout + self.block_ms / 1000
        down = self.down
        refused = _RefusedAtOnce(what) if unseen else None
        try:
            result = await _retried(
                fn,
                within=within,
                retry_for=0 if down else self.retry_for,
                base=self.retry_base,
                cap=self.retry_max,
                stalled=None if blocking else self._gave_up,
                failed=lambda error: RelayUnavailable(
                    f"Redis is down: a read gave up after {self.retry_for:g} s and it did "
                    f"not answer since ({what}): {error}"
                    if down
                    else f"Redis did not answer for {self.retry_for:g} s ({what}): {error}"
                ),
                logger=log,
                event="relay.read_failed",
                what=what,
                refused=refused,
            )
        except RelayUnavailable as exc:
            if refused is None or exc is not refused.raised:  # (refused at once: a
                self.down = True  # restart's blip, live readers keep their whole window)
            raise
        if down:
            self.down = False
        return result

    async def _out_of_memory(self) -> str | None:
        """Why Redis refuses writes, if it is full (``used_memory`` at ``maxmemory``),
        else ``None``: asked (``INFO memory``, one try within :attr:`op_timeout`) only
        of a stream a reader gives up on, so it can say what stopped it."""
        info: Any = None
        with trio.move_on_after(self.op_timeout) as scope:
            try:
                info = await self.client.info("memory")
            except Exception:  # (a Redis that cannot say: nothing to tell)
                return None
        if scope.cancelled_caught:
            self._gave_up()  # (as :meth:`_call` does: no reply to queue behind)
        if not isinstance(info, dict):
            return None
        try:
            used, most = int(info["used_memory"]), int(info["maxmemory"])
        except (KeyError, TypeError, ValueError):
            return None
        if not 0 < most <= used:
            return None
        policy = info.get("maxmemory_policy", "?")
        return (
            f"Redis is out of memory ({used} of maxmemory {most} bytes used, policy "
            f"{policy}) and refused the stream's writes"
        )

    async def ping(self, within: float) -> None:
        """One ``PING`` answered within ``within`` seconds, else
        :class:`~runtime.errors.RelayUnavailable` (``serve``'s ``/readyz``); no retry. A
        reply that never came leaves the pool's connections to start over, as
        :meth:`_call` does (:meth:`_gave_up`)."""
        with trio.move_on_after(within) as scope:
            try:
                await self.client.ping()
            except Exception as exc:
                raise RelayUnavailable(f"Redis did not answer PING: {exc}") from None
        if scope.cancelled_caught:
            self._gave_up()
            raise RelayUnavailable(f"Redis did not answer PING within {within:g} s")

    def _gave_up(self) -> None:
        """A non-blocking command on the coredis client got no reply within its deadline.
        coredis keeps the pooled connection a cancelled request was sent on, and
        multiplexes the next commands on it, behind a reply that may never come (a held
        or black-holed connection): a retry would wait for it, and every command after
        it, until ``retry_for`` ran out and after. The pool's connections start over
        (the one stalled is not known); the cancel watch's subscription is not among
        them (:attr:`subscriber`)."""
        self.client.connection_pool.disconnect()

    async def _read_call(
        self,
        turn_id: str,
        what: str,
        fn: Callable[[], Any],
        *,
        blocking: bool = False,
        unseen: bool = False,
    ) -> Any:
        """:meth:`_call` on a turn's stream: a key of another type there (junk) is
        :class:`~runtime.errors.RelayTurnGone`."""
        from coredis.exceptions import WrongTypeError

        try:
            return await self._call(what, fn, blocking=blocking, unseen=unseen)
        except WrongTypeError:
            raise RelayTurnGone(
                f"the relay's key of turn {turn_id!r} is not a stream (junk in Redis)"
            ) from None

    async def holds_turn(self, turn_id: str) -> bool:
        """Whether the relay holds a stream of ``turn_id`` (an earlier turn of that id,
        ended or not, until the stream's TTL): a new turn given that id would append to
        it, and a reader of the stream see both turns. One try within the relay's
        deadline of a round trip, no retries (it is asked before a turn starts, which a
        Redis that is down must not hold up): :class:`~runtime.errors.RelayUnavailable`
        when Redis does not answer.

        A turn this process writes is held before Redis has any of it: a writer's first
        flush waits for its batch, and an ended turn's HTTP answer may be sent before its
        writer's last flush, so a runId used again at once found no stream and the new
        turn wrote into the one about to appear."""
        if any(writer.turn_id == turn_id for writer in self.live):
            return True
        found = await _retried(
            lambda: self.client.exists([self.turn_key(turn_id)]),
            within=self.op_timeout,
            retry_for=0,
            base=self.retry_base,
            cap=self.retry_max,
            stalled=self._gave_up,
            failed=lambda error: RelayUnavailable(
                f"Redis did not answer (turn stream of {turn_id!r}): {error}"
            ),
            logger=log,
            event="relay.read_failed",
            what="turn stream",
        )
        return bool(found)

    async def active_turn(self, session_id: str, *, after_seq: int | None = None) -> str | None:
        """The session's turn that is still streaming, if any (``None``: none, or ended);
        with ``after_seq``, maybe one that ended (:meth:`resumable_turn`)."""
        found = await self.resumable_turn(session_id, after_seq=after_seq)
        return None if found is None else found[0]

    async def resumable_turn(
        self, session_id: str, *, after_seq: int | None = None
    ) -> tuple[str, bool] | None:
        """``(turn id, ended)`` of the session's turn that is still streaming, if any
        (``None``: none, or ended).

        With ``after_seq`` (a reader resuming after that seq: ``Last-Event-ID``), the
        session's latest turn also when it ended, if its stream holds chunks past that
        seq: a reader dropped before the end (it stopped reading, its connection broke)
        resumes the tail it missed, not a 204 that leaves its answer cut short. A turn
        that ended waiting for input is none (it streams again once decided).

        ``ended`` says it is such a turn that ended: its session may have been deleted
        since (the caller checks the store: a deleted session's turn is not resumed).

        Junk at the session's key (another type, not a turn id) is no turn; a turn whose
        stream is junk is returned, so its reader finds it gone and rebuilds it."""
        from coredis.exceptions import WrongTypeError

        try:
            raw = await self._call(
                "active turn", lambda: self.client.get(self.active_key(session_id))
            )
        except WrongTypeError:
            raw = None
        turn_id = _turn_id(raw)
        if turn_id is None:
            return None
        try:
            last = await self._read_call(
                turn_id,
                "turn end",
                lambda: self.client.xrevrange(self.turn_key(turn_id), "+", "-", count=1),
            )
        except RelayTurnGone:
            return turn_id, False
        if not last:
            return None
        try:
            entry = _decode(last[0])
            items = entry.items  # (none: a part of a split chunk)
            ended = bool(items) and items[-1]["type"] == END
        except _Undecodable:
            return turn_id, False
        if not ended:
            return turn_id, False
        # The end marker is the stream's last seq; the client's last event the one before.
        missed = after_seq is not None and after_seq < entry.last - 1
        return (turn_id, True) if missed and items[-1].get("paused") is not True else None

    async def read(
        self,
        turn_id: str,
        *,
        after_seq: int | None = None,
        after_pauses: int = 0,
        on_quiet: Callable[[float], Awaitable[None]] | None = None,
        unseen: bool = False,
    ) -> AsyncIterator[Any]:
        """The turn's chunks with ``seq > after_seq`` (all when ``None``), live until the
        turn ends or waits; :class:`StepRestarted` markers among them (see the module doc).
        With ``after_pauses=k``, only what follows the turn's k-th pause (the continuation
        after k waits), waiting for that pause if it was not written yet.

        Raises :class:`~runtime.errors.RelayTurnGone` (a :class:`LookupError`) when the
        relay does not have the turn, lost part of it, or cannot prove that what it has
        continues what the reader (or, with ``after_seq``, its client) read before: a
        hole, a stream another writer started over, junk. Raises
        :class:`~runtime.errors.RelayUnavailable` when Redis stays down.
        ``on_quiet(seconds)`` is awaited after each blocking read that found nothing
        (every :attr:`block_ms`), with how long the live read has waited for an entry;
        what it raises ends the read.

        ``unseen``: the reader was shown nothing of the turn (a POST's own read, which
        the front end answers from the store when the relay fails it): when the read's
        first command finds no Redis to connect to (refused), it gives up at once, not
        after :attr:`retry_for`, and does not mark the relay :attr:`down`. Every later
        command, and every other reader's, keeps the whole window.

        Why: the first POST of an outage waited the whole window (30 s) though each try
        was refused at once. A shorter window for every read (2 s) was tried and reverted:
        it ended live streams across a Redis restart longer than that; a reader shown
        nothing loses no stream by being answered from the store (branch ``smallleft``).
        """
        key = self.turn_key(turn_id)
        seen = after_seq if after_seq is not None else 0
        cursor = _Cursor(turn_id=turn_id)
        place = _Place(seen=seen, pauses=after_pauses)
        found = _Resets()
        held, last_id = await self._scan(turn_id, key, cursor, place, found, unseen=unseen)
        if not cursor.reach:
            raise RelayTurnGone(f"the relay has no stream for turn {turn_id!r}")
        if seen and cursor.from_start:
            # A takeover found no stream: what the client saw of the turn is not in it.
            raise RelayTurnGone(
                f"the relay's stream of turn {turn_id!r} was started over by a takeover "
                f"after seq {seen} the client saw"
            )
        if seen > cursor.reach:
            # The client saw more than the stream holds: not the stream it read.
            raise RelayTurnGone(
                f"the relay's stream of turn {turn_id!r} ends at seq {cursor.position}, "
                f"before seq {seen} the client saw: it was lost and started again"
            )
        sieve = _Sieve(found, place.seen)
        back: tuple[int, Any] | None = None  # the item before: it is the tail if none follows
        again = _Cursor(turn_id=turn_id)
        start = "-"
        more = twice = held is None
        entries: list[Any] = []
        while True:
            if held is None:  # the second pass, a page at a time, up to the first's end
                entries, more = await self._page(
                    turn_id, key, start, last_id, biggest=again.biggest, after=len(entries)
                )
                held = [pair for entry in entries for pair in again.accept(entry)]
                if entries:
                    start = f"({_identifier(entries[-1].identifier)}"
            for pair in held:
                if not sieve.keeps(*pair):
                    continue
                if back is not None:
                    done = self._next(place, turn_id, *back, tail=False)
                    if done is _END:
                        return
                    if done is not None:
                        yield done
                back = pair
            held = None
            if not more:
                break
        if twice and again.position != cursor.position:
            # (Redis lost the stream, or part of it, between the two passes)
            raise RelayTurnGone(
                f"the relay's stream of turn {turn_id!r} changed under its reader "
                f"(read to seq {again.position} of {cursor.position})"
            )
        if back is not None:  # (the tail, unless a split chunk's parts follow it)
            done = self._next(place, turn_id, *back, tail=cursor.next_part is None)
            if done is _END:
                return
            if done is not None:
                yield done
        if cursor.ended:
            return
        while True:  # live: block on new entries after the last one
            pairs: list[tuple[int, Any]] = []
            count = self._count(cursor.biggest)
            for entry in await self._next_entries(turn_id, key, last_id, on_quiet, count):
                pairs.extend(cursor.accept(entry))
                last_id = entry.identifier
            last = len(pairs) - 1 if cursor.next_part is None else -1
            for index, (seq, item) in enumerate(pairs):
                done = self._next(place, turn_id, seq, item, tail=index == last)
                if done is _END:
                    return
                if done is not None:
                    yield done

    async def _page(
        self,
        turn_id: str,
        key: str,
        start: str,
        stop: bytes | str,
        *,
        biggest: int,
        after: int,
        count: int = PAGE,
        unseen: bool = False,
    ) -> tuple[list[Any], bool]:
        """The stream's entries from ``start`` to ``stop``, at most ``count`` of them and
        :attr:`page_bytes` past the first (:data:`_PAGE`), and whether there may be more.

        A Redis that refuses the script (scripting disabled, or denied by the ACL of the
        relay's user) gets ``XRANGE`` instead, for as many entries as :attr:`page_bytes`
        holds of the ``biggest`` the read has seen, but at most twice as many as its page
        before held (``after``; one at first) and :data:`FALLBACK_PAGE`: without Redis
        bounding the bytes, a page may hold that many entries larger than those seen."""
        from coredis.exceptions import ResponseError

        if not self.scripts_refused:
            try:
                more, raw = await self._read_call(
                    turn_id,
                    "replay",
                    functools.partial(
                        self.client.eval,
                        _PAGE,
                        keys=[key],
                        args=[start, stop, count, self.page_bytes],
                    ),
                    unseen=unseen,
                )
                return _entries(raw), bool(more)
            except ResponseError as exc:
                if _scripts_refused(exc):
                    log.warning("relay.page_script_refused", error=_described(exc))
                    self.scripts_refused = True
        wanted = min(count, FALLBACK_PAGE, 2 * after or 1, self._count(biggest))
        page = await self._read_call(
            turn_id,
            "replay",
            functools.partial(self.client.xrange, key, start, stop, count=wanted),
            unseen=unseen,
        )
        return list(page), len(page) == wanted

    def _count(self, biggest: int) -> int:
        """How many entries a page Redis does not bound in bytes (a live ``XREAD``, the
        ``XRANGE`` fallback) asks for: :attr:`page_bytes` of entries as big as the
        ``biggest`` read so far, or as the entry bound (:attr:`entry_bytes`) if bigger,
        an entry's most: so its reply holds at most a page (and one entry), whatever
        comes. Sized by the biggest seen alone, a live reader that had read small
        entries asked for 256, and got 256 of any size (20 MB chunks were one entry)."""
        return max(1, min(PAGE, self.page_bytes // max(biggest, self.entry_bytes)))

    async def _scan(
        self,
        turn_id: str,
        key: str,
        cursor: _Cursor,
        place: _Place,
        found: _Resets,
        *,
        unseen: bool = False,
    ) -> tuple[list[tuple[int, Any]] | None, bytes | str]:
        """The first pass over the turn's stream from its start, page by page, as
        ``cursor`` accepts it: where its resets are (``found``), the pauses the read
        starts after (``place``), and the id of its last entry, where live reading goes
        on. Returns the backlog's (seq, item) pairs too when it was one page (``None``
        when longer: it is read again, a page at a time, as it is yielded).

        From the start, so restarted steps are dropped before anything goes out, and a
        stream that cannot be proved whole is refused before anything goes out. Seqs are
        the writer's, so a stream that lost its head (Redis restarted without its data
        while the turn went on) shows as a hole, never as a shorter turn."""
        start = "-"
        last_id: bytes | str = "0-0"
        first = True
        entries: list[Any] = []
        while True:
            entries, more = await self._page(
                turn_id,
                key,
                start,
                "+",
                biggest=cursor.biggest,
                after=len(entries),
                unseen=unseen and first,
            )
            pairs = [pair for entry in entries for pair in cursor.accept(entry)]
            found.see(pairs)
            place.skip_pauses(pairs)
            if entries:
                last_id = entries[-1].identifier
            if not more:
                return (pairs if first else None), last_id
            first = False
            start = f"({_identifier(last_id)}"

    async def _next_entries(
        self,
        turn_id: str,
        key: str,
        last_id: bytes | str,
        on_quiet: Callable[[float], Awaitable[None]] | None = None,
        count: int = PAGE,
    ) -> Any:
        """The stream's next entries after ``last_id`` (at most ``count``: a reader that
        fell behind a writer of large entries asks for a page's bytes of those it read,
        not :data:`PAGE` whatever their size), blocking until there are some;
        :class:`~runtime.errors.RelayTurnGone` when the stream expired meanwhile.
        ``on_quiet`` is told how long it has waited after each read that found none."""
        since = trio.current_time()
        while True:
            result = await self._read_call(
                turn_id,
                "live",
                functools.partial(
                    self.client.xread, {key: last_id}, count=count, block=self.block_ms
                ),
                blocking=True,
            )
            entries = next(iter(result.values()), ()) if result else ()
            if entries:
                return entries
            exists = await self._call("exists", lambda: self.client.exists([key]))
            if not exists:
                raise RelayTurnGone(f"the relay's stream of turn {turn_id!r} expired or was lost")
            if on_quiet is not None:
                try:
                    await on_quiet(trio.current_time() - since)
                except RelayTurnGone as exc:
                    full = await self._out_of_memory()
                    if full is None:
                        raise
                    # The stream did not end because Redis refused its writes (the
                    # worker logged ``relay.flush_refused``), not because its worker
                    # stopped: the reader is told what happened.
                    raise RelayTurnGone(
                        f"turn {turn_id!r} ended and its relay stream did not: {full}"
                    ) from exc

    def _next(
        self, place: _Place, turn_id: str, seq: int, item: dict[str, Any], *, tail: bool
    ) -> Any:
        """What the reader does with the stream's next item: the chunk (or marker) to
        yield, ``None`` to go on, ``_END`` to stop (the turn ended, or waits)."""
        if item["type"] == END:
            if item.get("paused") is not True:
                return _END if seq > place.seen or place.pauses else None
            if seq <= place.seen:
                return None
            if place.pauses:  # the pause the reader starts after (or one before it)
                place.pauses -= 1
                place.seen = seq
                return None
            # A pause with nothing after it: the turn waits, this read is over. One with
            # more after it is passed over: its continuation follows.
            return _END if tail else None
        if place.pauses or seq <= place.seen:
            return None
        return self._item(turn_id, seq, item)

    def _item(self, turn_id: str, seq: int, item: dict[str, Any]) -> Any:
        """The chunk (or marker) an accepted item stands for; ``_END`` at the turn's end;
        :class:`~runtime.errors.RelayTurnGone` for a chunk that does not decode."""
        kind = item["type"]
        if kind == END:
            return _END
        if kind == RESTART:
            return StepRestarted(step=item["step"], seq=seq)
        try:
            return attrs.evolve(structure(item, OutputChunk), seq=seq)
        except (BaseValidationError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise RelayTurnGone(
                f"the relay's stream of turn {turn_id!r} holds junk at seq {seq} "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            ) from None

    # -- cancelling -------------------------------------------------------------------------

    async def request_cancel(
        self,
        turn_id: str,
        reason: str = "cancelled",
        *,
        session_id: str | None = None,
        message_id: str | None = None,
        named_turn: str | None = None,
    ) -> int:
        """Ask the process that runs ``turn_id`` to cancel it; returns how many processes
        listen (``0``: nobody runs relay cancels now). Recorded first
        (:meth:`cancel_key`, for :data:`CANCEL_TTL_MS`), then published: a watch that
        subscribes again reads what it may have missed.

        With ``session_id`` and ``message_id`` or ``named_turn``, a *named* stop (``POST
        /api/chat/{id}/stop`` naming a message or a turn, sent to a host that does not
        run ``turn_id``, the session's running turn): the host that runs it stops only
        what is so named (a waiting message taken out, or ``turn_id`` if it is the one
        named), ``watch_cancels``'s ``on_named``. It is recorded apart
        (:meth:`named_stops_key`, for :data:`CANCEL_TTL_MS`): a watch that subscribes
        again hands it to ``on_named`` as it was sent (before, only published, one sent
        while that host's subscription was down was lost). ``turn_id`` ``""``: the
        relay streams no turn of the session (one may run that has written nothing
        yet); the stop goes to every host, recorded under :meth:`unplaced_stops_key`."""
        named = session_id is not None and (message_id is not None or named_turn is not None)
        fields: dict[str, str] = {"turn_id": turn_id, "reason": reason}
        if named:
            fields["session_id"] = str(session_id)
            if message_id is not None:
                fields["message_id"] = message_id
            if named_turn is not None:
                fields["named_turn"] = named_turn
        message = orjson.dumps(fields)

        async def record_and_publish() -> int:
            if named and turn_id:
                await self.client.eval(
                    _RECORD_NAMED,
                    keys=[self.named_stops_key(turn_id)],
                    args=[message, CANCEL_TTL_MS],
                )
            elif named:
                await self.client.eval(
                    _RECORD_UNPLACED,
                    keys=[self.unplaced_stops_key],
                    args=[message, CANCEL_TTL_MS, UNPLACED_KEPT],
                )
            else:
                await self.client.set(self.cancel_key(turn_id), reason, px=CANCEL_TTL_MS)
            listening: int = await self.client.publish(self.cancel_channel, message)
            return listening

        return await self._call("cancel", record_and_publish)

    async def watch_cancels(
        self,
        on_cancel: Callable[[str, str], Any],
        *,
        on_named: Callable[[NamedStop], Any] | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``on_cancel(turn_id, reason)`` for every cancel request, and
        ``on_named(stop)`` for every named stop (:meth:`request_cancel`; without
        ``on_named`` one is a plain cancel only when it names its turn), until cancelled;
        resubscribes (with backoff) after Redis went away, or when the subscription
        answers no PING within ``op_timeout`` (one every ``cancel_ping`` seconds: a
        connection held or black-holed delivers nothing and says nothing). Once
        subscribed again, the cancels recorded since the subscription last answered
        (:meth:`cancel_key`, :meth:`named_stops_key`) of the turns this process streams
        (its open writers) are handed to ``on_cancel`` and ``on_named`` too (perhaps a
        second time: they must take that)."""
        started = False
        attempt = 0
        answered: list[float] = []  # when the subscription last answered (trio clock)
        while True:
            failed: BaseException | None = None
            try:
                async with (self.subscriber or self.client).pubsub(
                    channels=[self.cancel_channel], ignore_subscribe_messages=True
                ) as pubsub:
                    if not started:
                        task_status.started()
                        started = True
                    attempt = 0
                    if answered:
                        silent = trio.current_time() - answered[0]
                        await self._missed_cancels(on_cancel, on_named, silent)
                    answered[:] = [trio.current_time()]
                    async with trio.open_nursery() as watching:
                        watching.start_soon(self._ping_subscription, pubsub, answered)
                        async for message in pubsub:
                            _cancel_from(message, on_cancel, on_named)
                        watching.cancel_scope.cancel()
            except* _transient() as group:
                failed = _first_leaf(group)
            except* _closed_stream() as group:
                # coredis's subscription sends its UNSUBSCRIBE on the way out, also when its
                # connection was closed under it (a worker shutting down, Redis gone): a
                # closed connection, not a crash of the process
                failed = _first_leaf(group)
            if failed is not None:
                await trio.lowlevel.checkpoint()  # shutting down: the cancellation goes on
                delay = _backoff(attempt, self.retry_base, self.retry_max)
                attempt += 1
                log.warning(
                    "relay.cancel_watch_failed",
                    retry_in=round(delay, 3),
                    error=_described(failed, self.op_timeout),
                )
                await trio.sleep(delay)
            if not started:  # the subscription ended before it began: try again
                await trio.sleep(self.retry_base)

    async def _ping_subscription(self, pubsub: Any, answered: list[float]) -> None:
        """PING the subscription's connection every ``cancel_ping`` seconds; one not
        answered within ``op_timeout`` drops the connection and raises ``TimeoutError``
        (the watch subscribes again)."""
        while True:
            await trio.sleep(self.cancel_ping)
            connection = pubsub.connection
            with trio.move_on_after(self.op_timeout):
                await connection.create_request(b"PING", disconnect_on_cancellation=True)
                answered[:] = [trio.current_time()]
                continue
            connection.invalidate()  # never back to the pool, nor resubscribed on by coredis
            raise TimeoutError(
                f"the cancel subscription answered no PING within {self.op_timeout:g} s"
            )

    async def _missed_cancels(
        self,
        on_cancel: Callable[[str, str], Any],
        on_named: Callable[[NamedStop], Any] | None,
        silent: float,
    ) -> None:
        """Hand ``on_cancel`` the cancels, and ``on_named`` the named stops, recorded in
        the last ``silent`` seconds (and ``op_timeout`` more) of the turns this process
        streams: those the subscription may have missed while it was dead. Best effort:
        a Redis that does not answer leaves them missed (logged)."""
        turn_ids = sorted({writer.turn_id for writer in self.live})
        since = trio.current_time() - silent - self.op_timeout
        ended = [t for t, at in self.closed.items() if at >= since and t not in turn_ids]
        if not turn_ids and not ended and on_named is None:
            return  # (a watch without ``on_named`` hands on no unplaced stop)
        keys = [self.cancel_key(turn_id) for turn_id in turn_ids]
        # the named stops of the turns that ended meanwhile too: one may name a message of
        # the session that waited for such a turn and runs now (its own turn's key holds
        # nothing), ``Host.stop_named`` takes it out or stops it; a cancel of an ended
        # turn (plain) would stop nothing
        keys += [self.named_stops_key(turn_id) for turn_id in [*turn_ids, *ended]]
        # and those sent while the relay streamed no turn of their session (a turn that
        # had not written its first chunk, or had not reached its host): all of them,
        # whatever the session, as the channel hands them on (``Host.stop_named`` matches
        # them here, or the publisher keeps them for a turn that starts here)
        keys.append(self.unplaced_stops_key)
        window_ms = (silent + self.op_timeout) * 1000
        args = [len(turn_ids), math.ceil(window_ms), UNPLACED_KEPT]
        try:
            found, named = await self._call(
                "missed cancels",
                lambda: self.client.eval(_RECENT_CANCELS, keys=keys, args=args),
            )
        except RelayUnavailable as exc:
            log.warning("relay.missed_cancels_failed", error=_described(exc))
            return
        for at in range(0, len(found), 3):
            index, reason, ttl = found[at : at + 3]
            if CANCEL_TTL_MS - int(ttl) <= window_ms:
                reason = reason.decode() if isinstance(reason, bytes) else str(reason)
                on_cancel(turn_ids[int(index) - 1], reason or "cancelled")
        stops = [(int(named[at + 1]), named[at]) for at in range(0, len(named), 2)]
        for age, message in sorted(stops, key=lambda stop: -stop[0]):  # the oldest first
            if age <= window_ms:  # read as the channel's message is
                _cancel_from({"type": "message", "data": message}, on_cancel, on_named)


_END = object()


class _RefusedAtOnce:
    """What a reader's first command raises when it finds no Redis to connect to
    (:meth:`RedisRelay.read`'s ``unseen``): a :class:`~runtime.errors.RelayUnavailable`
    at once, kept so the relay knows not to mark itself down for it."""

    __slots__ = ("raised", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.raised: RelayUnavailable | None = None

    def __call__(self, error: str) -> RelayUnavailable:
        self.raised = RelayUnavailable(
            f"Redis did not answer: it refused connections ({self.what}): {error}"
        )
        return self.raised


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    """The first exception in ``group`` that is not a group (nurseries nest them)."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def public_url(url: str) -> str:
    """``url`` without its credentials (``redis://:PW@``, ``user:PW@``, ``?password=``),
    for messages and logs: :func:`runtime.redact.redact_url`."""
    return redact_url(url)


__all__ = ["RedisRelay", "RedisRelayWriter", "StepRestarted"]
