"""The live-output relay on Redis Streams: one stream per turn, any front end reads it.

Layout (every key under ``prefix``, ``axon:`` by default):

``{prefix}turn:{turn_id}``
    A Redis Stream. Each entry is one *flush* of a writer: ``items`` (a JSON array of
    the chunks queued since the previous flush, in the runtime's JSON form, see
    :mod:`runtime.serde`), ``first`` (the relay seq of the first of them) and ``w`` (the
    writer's random id); a writer's first entry on a stream another writer began also
    has ``prev`` (that writer's id). The entry id is ``{first}-1``, so a retried flush
    that Redis had already applied is refused as a duplicate instead of being written
    twice, and resuming after a seq is a range query.
``{prefix}active:{session_id}``
    The id of the session's latest turn, so ``GET /api/chat/{id}/stream`` finds it.
``{prefix}cancel``
    A pub/sub channel of cancel requests (``{"turn_id", "reason"}``), for the process
    that runs the turn.

**Relay seq.** A chunk read back from the relay has ``seq`` = its position in the turn's
stream (1, 2, ...), stamped by the writer at flush time. The producer's own seqs restart
when a session is reloaded or a turn is taken over by another worker; the relay's never
do, so ``after_seq`` (SSE ``Last-Event-ID``) resumes with nothing missing or repeated.
A takeover's writer continues the numbering from the stream's last entry.

**Continuity.** A reader shows only what it can prove continuous (:class:`_Cursor`):
every entry starts at the seq after the last one read and was written by the same
writer, or by a takeover that names that writer in ``prev``. Redis can lose a stream
(restarted without persistence, eviction) while the turn goes on; a takeover's writer
that finds no stream then writes a ``gap`` first (what the turn streamed before is
gone), and a writer that started a stream over cannot name the writer a reader read
last. So a hole, a stream started over, a client's ``after_seq`` past the stream's end,
a ``gap`` and any entry that does not decode (junk in the relay's keys, a key of another
type) all raise :class:`~runtime.errors.RelayTurnGone`: the front end rebuilds the turn
from the store, or tells a client that saw part of it to reload. Never a spliced turn
shown whole, never a server error. None of this costs a Redis call: the ids ride in the
entries.

**Control items** also take a seq: :class:`StepRestarted` (an older worker's takeover
re-runs ``step``: drop what the step streamed so far) and the end of the turn (not
yielded; iteration stops). A reader that replays a backlog drops the restarted step's
chunks itself and yields the marker only when the reader's client had already seen some
of them; it does the same before a ``reset-step`` chunk (a takeover now, or a provider
fallback), keeping the step's ``step-start``.

**Pauses.** A turn that suspends to wait for a person (docs/approval.md) ends its part of
the stream with a *paused* end (``{"type": "relay.end", "paused": true}``, which an older
reader takes for the end); the worker that resumes it later continues the same stream,
its seqs following on, so one ``Last-Event-ID`` space covers the whole turn. A read stops
at a pause that is the stream's last item (the turn waits), and passes over one that has
more after it (the continuation), yielding that continuation's ``start`` again (same
message id). ``read(after_pauses=k)`` starts after the turn's k-th pause, waiting for it
if need be: what the front end that recorded the decisions streams as the continuation.

**Coalescing and failure.** :meth:`RedisRelayWriter.append` only queues: the relay's one
flush task (:class:`_Flusher`, not a task per writer) writes each writer's queue as one
entry when it is due (one ``XADD``, with ``EXPIRE`` / ``SET`` on the first and last), the
writers due at one moment in one pipeline. A turn's first flush goes at once (the first
chunk a reader waits for is not held); a later one asked for within ``flush_interval``
(5 ms) of the writer's previous flush waits for the relay's next tick of that interval,
shared by every writer, so a burst of chunks is one entry and the writers due at one
tick share one pipeline. A turn's ``finish`` / ``error`` / ``abort`` waits at most
``end_wait`` (50 ms) for the writer's close, so the end goes out in the same entry as
the turn's last chunks (those waiting for their tick too); a close flushes at once.
Readers get chunks of a burst up to 5 ms later, and an end up to 50 ms later; order and
content are untouched.
While Redis is down the flush retries with capped exponential backoff and the turn goes
on; the queue is bounded (``max_queue``): past it the queue is dropped and the stream
gets a ``gap`` item, which makes readers raise :class:`~runtime.errors.RelayTurnGone`,
so they rebuild from the store. Nothing committed is lost: the relay is a cache of what
the store will hold.

coredis is anyio-based and runs under Trio as it is. Imported only by this module.
"""

from __future__ import annotations

import functools
import math
import random
import re
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import orjson
import structlog
import trio
from cattrs.errors import BaseValidationError

from actors.relays import resp
from actors.relays.limits import RedisLimitBackend
from runtime import output as o
from runtime.errors import ConfigurationError, RelayTurnGone, RelayUnavailable
from runtime.output import OutputChunk
from runtime.redact import redact, redact_url, register_url_secrets
from runtime.relay import RESTART_STEP as RESTART
from runtime.relay import StepRestarted
from runtime.serde import structure, unstructure

log = structlog.get_logger("axon.relay")

DEFAULT_PREFIX = "axon:"
LIVE_TTL = 24 * 3600
"""Seconds a turn's stream lives while it is written (refreshed on every flush)."""
END_TTL = 15 * 60
"""Seconds a finished turn's stream stays readable (a late reconnect can still replay it)."""
MAX_QUEUE = 10_000
"""Chunks a writer queues at most while Redis does not answer; past it the queue is
dropped and readers are told (``gap``)."""
RETRY_FOR = 30.0
"""Seconds a reader keeps retrying a Redis that does not answer before it gives up
(:class:`~runtime.errors.RelayUnavailable`)."""
BLOCK_MS = 1000
TTL_REFRESH = 60.0
"""Seconds between refreshes of a live stream's TTL (``LIVE_TTL``, a day: once a minute
is plenty, and a flush in between costs one command instead of three)."""
"""How long one blocking ``XREAD`` waits for new entries before checking the key again."""
PAGE = 256
"""Entries per ``XRANGE`` page when replaying a backlog."""

FLUSH_INTERVAL = 0.005
"""Seconds: a writer's flush asked for sooner than this after its previous one waits for
the relay's next tick (multiples of this on the Trio clock), so a burst of chunks is one
``XADD`` and the writers flushing at one tick share one pipeline. ``0``: never wait."""
END_WAIT = 0.05
"""Seconds a turn's last chunk (``finish``, ``error``, ``abort``) waits at most for the
writer's close, so the stream's end is written with it in one entry. ``0``: never wait."""

END = "relay.end"
GAP = "relay.gap"
_LAST = frozenset({"finish", "error", "abort"})
"""The chunk types that end a turn's output: its relay end follows (``aclose``)."""
_QUIET = frozenset({"step-start"})
"""Chunks that show a reader nothing by themselves: a flush of only these is not made at
once even after a quiet spell, but waits for the relay's next tick, so the step's first
content (which follows within the tick when the model is quick) goes in the same entry.
In a worker's tool-using turn the second step's ``step-start`` came after the tool
step's save, more than ``flush_interval`` after the previous flush, and went in an
``XADD`` of its own (issue 24 goal 3)."""


def _quiet(items: list[dict[str, Any]]) -> bool:
    """Whether ``items`` are all :data:`_QUIET` chunks."""
    return all(item["type"] in _QUIET for item in items)


def _transient() -> tuple[type[BaseException], ...]:
    from coredis.exceptions import ConnectionError as RedisConnectionError

    return (RedisConnectionError, TimeoutError, OSError)


def _retryable() -> tuple[type[BaseException], ...]:
    """What a Redis call is retried on: a transient error, or its own deadline passing."""
    return (*_transient(), trio.TooSlowError)


def _backoff(attempt: int, base: float, cap: float) -> float:
    """Capped exponential backoff with full jitter (many writers must not retry in step)."""
    return random.uniform(0, min(cap, base * 2**attempt))


@attrs.frozen(kw_only=True, slots=True)
class _Entry:
    """One stream entry, decoded: its items numbered from ``first``, who wrote it
    (``writer``), and, on a writer's first entry, the writer whose tail it continued
    (``prev``)."""

    first: int
    items: list[dict[str, Any]]
    writer: bytes | None
    prev: bytes | None

    @property
    def last(self) -> int:
        return self.first + len(self.items) - 1


class _Undecodable(ValueError):
    """A stream entry that is not one a writer wrote (junk in the relay's keys)."""


def _decode(entry: Any) -> _Entry:
    """One stream entry; :class:`_Undecodable` when it is not what a writer writes: a
    ``first`` that is not its id's, ``items`` that are not a non-empty JSON array of
    objects with a string ``type``, a marker without its fields."""
    try:
        fields = entry.field_values
        first = int(fields[b"first"])
        items = orjson.loads(fields[b"items"])
        writer, prev = fields.get(b"w"), fields.get(b"prev")
        if _identifier(entry.identifier) != f"{first}-1" or first < 1:
            raise _Undecodable(f"entry {entry.identifier!r} says it starts at seq {first}")
    except (KeyError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise _Undecodable(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(items, list) or not items:
        raise _Undecodable("'items' is not a non-empty JSON array")
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise _Undecodable(f"an item is not a chunk: {str(item)[:100]!r}")
        if item["type"] == RESTART and type(item.get("step")) is not int:
            raise _Undecodable(f"a restart marker without its step: {str(item)[:100]!r}")
    return _Entry(first=first, items=items, writer=writer, prev=prev)


def _identifier(identifier: bytes | str) -> str:
    return identifier.decode() if isinstance(identifier, bytes) else identifier


def _entry_seq(identifier: bytes | str) -> int:
    return int(_identifier(identifier).split("-", 1)[0])


@attrs.define
class _Cursor:
    """What a reader has read of a turn's stream, to prove each next entry continues it.

    An entry continues the stream when its first seq follows the last one read and it
    was written by the same writer as the entry before it, or by a writer that says it
    continued that one (``prev``, a takeover that found the stream). Anything else (a
    hole, a stream that another writer started over after Redis lost it, a writer the
    turn had lost that still wrote, a ``gap`` item, junk) is :class:`RelayTurnGone`: a
    reader never shows a spliced turn as a whole one."""

    turn_id: str
    position: int = 0
    """The last seq read (shown to the client or not)."""
    writer: bytes | None = None
    message_id: str | None = None
    """The message the stream's ``start`` opened: a takeover's repeat of it is dropped."""
    ended: bool = False
    """The turn's end was read (a pause is not its end)."""

    def accept(self, raw: Any) -> list[tuple[int, dict[str, Any]]]:
        """The ``(seq, item)`` pairs of the stream's next entry ``raw``, repeated
        ``start`` s left out; :class:`RelayTurnGone` unless it provably continues."""
        turn = self.turn_id
        try:
            entry = _decode(raw)
        except _Undecodable as exc:
            raise RelayTurnGone(f"the relay's stream of turn {turn!r} holds junk ({exc})") from None
        if entry.first > self.position + 1:
            raise RelayTurnGone(
                f"the relay lost chunks {self.position + 1}..{entry.first - 1} of turn {turn!r}"
            )
        if entry.first != self.position + 1 or (
            self.position and entry.writer != self.writer and entry.prev != self.writer
        ):
            raise RelayTurnGone(
                f"the relay's stream of turn {turn!r} was written over after seq "
                f"{self.position} (Redis lost it and another writer started it again)"
            )
        pairs: list[tuple[int, dict[str, Any]]] = []
        for seq, item in enumerate(entry.items, start=entry.first):
            kind = item["type"]
            if kind == GAP:
                raise RelayTurnGone(
                    f"the relay lost part of turn {turn!r} (Redis was unreachable or lost it)"
                )
            if kind == END:
                if item.get("paused") is True:
                    self.message_id = None  # the continuation starts the message again
                else:
                    self.ended = True
            elif kind == "start":
                message_id = item.get("message_id")
                if self.message_id is not None and message_id == self.message_id:
                    continue  # a takeover starts the same message over: the client has it
                self.message_id = self.message_id or message_id
            pairs.append((seq, item))
        self.position = entry.last
        self.writer = entry.writer
        return pairs


@attrs.define
class _Place:
    """Where a read starts: after seq ``seen``, and after the turn's ``pauses``-th pause
    (counted down as the reader passes them)."""

    seen: int
    pauses: int

    def skip_pauses(self, backlog: list[tuple[int, Any]]) -> None:
        """Move past the pauses the read starts after that the backlog already holds."""
        for seq, item in backlog:
            if not self.pauses:
                return
            if item.get("type") == END and item.get("paused") is True:
                self.pauses -= 1
                self.seen = max(self.seen, seq)


def _tail(last: list[Any], *, takeover: bool) -> tuple[int, bytes | None, bool]:
    """Where a writer's numbering starts, from the stream's last entry (``last``, empty
    when there is no stream): the next seq, the writer it continues (``prev``), and
    whether what the turn streamed before is lost (a takeover that finds no stream, or a
    last entry that is junk)."""
    if not last:
        return 1, None, takeover
    try:
        entry = _decode(last[0])
    except _Undecodable:
        return _entry_seq(last[0].identifier) + 1, None, True
    return entry.last + 1, entry.writer or b"", False


_OPENS = {"text-start": o.TextFinish, "reasoning-start": o.ReasoningFinish}
_CLOSES = ("text-finish", "reasoning-finish")


class _StepScan:
    """A stream's items read backwards for one step (:meth:`RedisRelayWriter.shown`):
    whether it holds any item of the step, and the parts the step left open. Items
    before a reset of the step (a ``reset-step`` or an older worker's restart marker)
    were taken back already, and those of an earlier step end the scan."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.found = False
        self.closed: set[str] = set()
        self.open: list[Any] = []

    def done(self, items: Any) -> bool:
        for item in items:
            step = item.get("step")
            if type(step) is not int:
                continue
            if step < self.step:
                return True
            if step != self.step:
                continue
            self.found = True
            kind = item["type"]
            if kind in (RESTART, "reset-step"):
                return True
            if kind in _CLOSES:
                self.closed.add(item.get("part_id"))
            elif kind in _OPENS and item.get("part_id") not in self.closed:
                self.open.append(_OPENS[kind](step=step, part_id=item["part_id"]))
        return False

    def result(self) -> list[Any] | None:
        return list(reversed(self.open)) if self.found else None


class RedisRelayWriter:
    """One turn's outgoing side (:class:`runtime.relay.RelayWriter`) on a Redis Stream.

    A writer has no task of its own: :meth:`append` queues, and the relay's one flusher
    (:class:`_Flusher`) writes the queue when it is due (see :meth:`_due_at`)."""

    def __init__(
        self, relay: RedisRelay, *, session_id: str, turn_id: str, takeover: bool = False
    ) -> None:
        self.relay = relay
        self.session_id = session_id
        self.turn_id = turn_id
        self.takeover = takeover
        """Another writer may have streamed the turn before: a stream found empty lost it."""
        self.key = relay.turn_key(turn_id)
        self.writer_id = uuid.uuid4().hex[:16].encode()
        """Written in every entry (``w``), so a reader tells this writer's entries from
        those of a writer that started the stream over."""
        self._prev: bytes | None = None
        """The writer whose tail this one continues, written (``prev``) until this
        writer's first entry is in."""
        self._queue: list[dict[str, Any]] = []
        self._due: float | None = None
        """When the flusher writes the queue (Trio clock); ``None`` while the writer is
        not waiting for it (nothing queued, or its flush or tail read is out)."""
        self._busy = False
        """A flush of this writer (or its tail read) is out: at most one at a time."""
        self._settled: trio.Event | None = None
        """Set when a flush or the close settles, for :meth:`flushed` (made on demand)."""
        self._hurry = False
        """Set by a close (the writer's or the relay's): nothing is held any more."""
        self._closing = False
        self._closed = False
        self._next_seq: int | None = None
        """The relay seq of the next item (read from the stream on the first flush)."""
        self._touched = -math.inf
        """When the flush that last set the stream's TTL ran (Trio clock)."""
        self._sent = -math.inf
        """When this writer's last flush went out (Trio clock): the first goes at once. A
        flush of only :data:`_QUIET` chunks does not count: the content that follows it
        after a quiet spell goes at once, as it did when that chunk went at once."""
        self._end_by: float | None = None
        """Set while the turn's last chunk is queued: when it goes out at the latest
        even if the writer is not closed by then (``end_wait`` after it was queued)."""
        self._retry_at = -math.inf
        """After a failed flush: not before this (capped, jittered backoff)."""
        self._attempt = 0
        """Failed attempts in a row (the backoff's exponent)."""
        self.lost = 0
        """Chunks dropped because the queue overflowed while Redis did not answer."""
        self.flushes = 0
        """Entries written (one ``XADD`` per flush: the coalescing, observable)."""
        self.failures = 0
        """Flush attempts that failed (Redis down or slow)."""

    def start_fresh(self) -> None:
        """Number from seq 1 without reading the stream's tail on the first flush: the
        turn never streamed before (see :meth:`RedisRelay.writer`'s ``fresh``). Only
        for such a turn: a stream there already would refuse this writer's entries
        below its top (``XADD`` ids are the seqs)."""
        self._next_seq, self._prev = 1, None

    # -- the producer's side (never blocks) ----------------------------------------------

    def append(self, chunk: Any) -> None:
        """Queue ``chunk``; the relay's flusher writes it with whatever else is queued."""
        if self._closing:
            raise RuntimeError(f"relay writer for turn {self.turn_id!r} is closed")
        self._put(unstructure(chunk))

    async def restart_step(self, step: int) -> None:
        """Queue the marker that drops the partial ``step`` for readers, and wait (at most
        ``close_timeout``) until it is written."""
        self._put({"type": RESTART, "step": step})
        with trio.move_on_after(self.relay.close_timeout):
            await self.flushed()

    async def shown(self, step: int) -> list[Any] | None:
        """What an earlier writer streamed of ``step`` (:meth:`runtime.relay.RelayWriter.shown`):
        read from the stream's end back to the step's first chunk, page by page. A
        Redis that does not answer within ``close_timeout``, or junk, makes readers
        rebuild the turn (a ``gap``): the turn does not wait on the relay."""
        from coredis.exceptions import WrongTypeError

        with trio.move_on_after(self.relay.close_timeout):
            try:
                return await self.relay._call("takeover scan", lambda: self._scan(step))
            except (RelayUnavailable, WrongTypeError, _Undecodable) as exc:
                log.warning(
                    "relay.takeover_scan_failed", turn_id=self.turn_id, error=redact(str(exc))
                )
        self._put({"type": GAP})
        return None

    async def _scan(self, step: int) -> list[Any] | None:
        scan = _StepScan(step)
        end = "+"
        while True:
            page = await self.relay.client.xrevrange(self.key, end, "-", count=PAGE)
            for entry in page:
                if scan.done(reversed(_decode(entry).items)):
                    return scan.result()
            if len(page) < PAGE:
                return scan.result()
            end = f"({_identifier(page[-1].identifier)}"

    async def aclose(self, *, final: bool = True, paused: bool = False) -> None:
        """Flush what is queued; with ``final`` the stream ends (readers stop) and expires
        after ``end_ttl``; with ``paused`` too, the turn waits for a person instead: the
        stream stays for ``live_ttl`` and the turn's continuation goes on in it. Bounded by
        ``close_timeout``: a Redis that stays down does not hold the turn's end. A closer
        that is cancelled does not cancel the flush (the relay's flusher writes it)."""
        if self._closing:
            return
        if final:
            self._put({"type": END, "paused": True} if paused else {"type": END})
        self._closing = True
        self._hurry_up()
        with trio.move_on_after(self.relay.close_timeout):
            await self.flushed()
        self._closed = True
        self.relay._forget(self)
        self._notify()
        if self._queue:
            self.lost += len(self._queue)
            log.warning(
                "relay.unflushed",
                turn_id=self.turn_id,
                chunks=len(self._queue),
                error="Redis did not answer before the turn ended; readers rebuild from the store",
            )

    async def flushed(self) -> None:
        """Wait until everything queued so far is written (or the writer stopped)."""
        while (self._queue or self._busy) and not self._closed:
            if self._settled is None:
                self._settled = trio.Event()
            await self._settled.wait()

    def _put(self, item: dict[str, Any]) -> None:
        queue = self._queue
        if len(queue) >= self.relay.max_queue:
            self.lost += len(queue)
            log.warning(
                "relay.overflow",
                turn_id=self.turn_id,
                dropped=len(queue),
                error="Redis is not keeping up; readers of this turn rebuild from the store",
            )
            queue.clear()
            queue.append({"type": GAP})
        queue.append(item)
        last = self._end_by is None and item["type"] in _LAST
        if last:
            self._end_by = trio.current_time() + self.relay.end_wait
        if self._due is None:
            if not self._busy and not self._closed:
                self.relay.batcher.schedule(self, self._due_at(trio.current_time()))
        elif last and not self._hurry:
            # What waited for its tick now waits with the last chunk for the close.
            self.relay.batcher.schedule(self, self._due_at(trio.current_time()))

    def _notify(self) -> None:
        settled, self._settled = self._settled, None
        if settled is not None:
            settled.set()

    def _hurry_up(self) -> None:
        """Nothing is held any more (a close): a queue waiting for its tick or for the
        close goes out at once (not before a failed flush's backoff is over)."""
        self._hurry = True
        if self._due is not None and not self._closed:
            self.relay.batcher.schedule(self, max(trio.current_time(), self._retry_at))

    # -- when the flusher writes the queue -------------------------------------------------

    def _due_at(self, now: float) -> float:
        """When the queue, that has just become waiting at ``now``, goes out. The turn's
        last chunk waits (at most ``end_wait`` after it was queued) until the writer is
        closed, so the end goes in the same entry. Otherwise a flush asked for within
        ``flush_interval`` of the previous one waits for the relay's next tick: the
        chunks queued meanwhile go with it, and every writer due at that tick goes in one
        pipeline. The first flush never waits, nor a closed writer's (its end is what
        readers, ``active_turn`` and the closer wait for: a stop sent once the turn is
        over must find it over), nor anything once the relay closes
        (:meth:`RedisRelay.aclose` must not wait out a hold). A flush of only chunks that
        show a reader nothing (:data:`_QUIET`) waits for the tick after a quiet spell
        too. After a failed flush nothing goes before its backoff is over.

        Decided once, when the queue starts waiting: appends while it waits change
        nothing (they go with it), only a close does (:meth:`_hurry_up`)."""
        now = max(now, self._retry_at)
        if self._hurry:
            return now
        relay = self.relay
        if self._end_by is not None:
            now = max(now, self._end_by)
        if relay.flush_interval > 0 and (
            now - self._sent < relay.flush_interval or self._quiet_only()
        ):
            return relay.next_tick(now)
        return now

    def _quiet_only(self) -> bool:
        """Whether the flush would carry only :data:`_QUIET` chunks; never a turn's first
        flush (the stream and the turn's ``active`` key go out at once)."""
        return self._sent != -math.inf and _quiet(self._queue)

    # -- the flusher's side ----------------------------------------------------------------

    def _take(self, now: float) -> _Job | None:
        """The flush of everything queued, for the flusher's pipeline at ``now``; ``None``
        when the stream's tail must be read first (a continuation's or a takeover's
        first flush: a task of its own, the writer due again once it is back)."""
        self._busy = True
        if self._next_seq is None:
            self.relay.nursery.start_soon(self._read_tail)
            return None
        batch, self._queue = self._queue, []
        self._end_by = None
        if not _quiet(batch):  # a lone step-start does not hold what follows
            self._sent = now
        first = self._next_seq
        try:
            commands, touch = self._commands(batch, first, now)
        except Exception as exc:  # a chunk that does not encode (an int past 64 bits)
            # This writer's batch is lost, as one Redis refused; not the flusher, which
            # every other writer needs.
            self._settle(_Job(writer=self, batch=batch, first=first, commands=[], touch=False,
                              at=now, error=exc))  # fmt: skip
            return None
        return _Job(writer=self, batch=batch, first=first, commands=commands, touch=touch, at=now)

    def _settle(self, job: _Job) -> None:
        """The outcome of this writer's flush ``job``: the seqs move on, or the batch goes
        back in front of the queue (order kept; the queue's bound applies on append) to
        be retried after a backoff; a batch Redis refused is dropped and readers told."""
        self._busy = False
        error = job.error
        if error is None or _duplicate(error):
            # A duplicate: a retry of a flush that Redis applied before the connection
            # broke (or a writer the turn had lost wrote there: readers see its entry
            # breaks the chain of writers, and rebuild from the store).
            if job.touch and error is None:
                self._touched = job.at
            self._next_seq = job.first + len(job.batch)
            self._prev = None
            self.flushes += 1
            self._attempt = 0
            self._retry_at = -math.inf
        elif isinstance(error, _retryable()):
            self._queue = job.batch + self._queue
            self._failed("relay.flush_failed", error)
        else:  # Redis refused it (OOM, wrong type): not retried
            self.lost += len(job.batch)
            self._queue.insert(0, {"type": GAP})
            self._failed("relay.flush_refused", error, dropped=len(job.batch))
        self._notify()
        if self._queue and not self._closed:
            self.relay.batcher.schedule(self, self._due_at(trio.current_time()))

    def _failed(self, event: str, error: BaseException, **fields: Any) -> None:
        self.failures += 1
        delay = _backoff(self._attempt, self.relay.retry_base, self.relay.retry_max)
        self._attempt += 1
        self._retry_at = trio.current_time() + delay
        level = log.error if event == "relay.flush_refused" else log.warning
        level(
            event,
            turn_id=self.turn_id,
            attempt=self._attempt,
            retry_in=round(delay, 3),
            error=f"{type(error).__name__}: {error}",
            **fields,
        )

    async def _read_tail(self) -> None:
        """Where to number on from: after the stream's last entry (a continuation's or a
        takeover's first flush); then the writer is due at once (after a backoff if the
        read failed)."""
        try:
            with trio.fail_after(self.relay.op_timeout):
                last = await self.relay.client.xrevrange(self.key, "+", "-", count=1)
        except _retryable() as exc:
            self._failed("relay.flush_failed", exc)
        except Exception as exc:  # a key of another type: the queue is lost, as a refusal
            self.lost += len(self._queue)
            self._queue = [{"type": GAP}]
            self._failed("relay.flush_refused", exc)
        else:
            first, self._prev, lost = _tail(last, takeover=self.takeover)
            self._next_seq = first
            if lost:
                # What the turn streamed before is not in the stream: readers are told
                # (they rebuild from the store) instead of shown the turn without it.
                self._queue.insert(0, {"type": GAP})
                log.warning("relay.takeover_lost_stream", turn_id=self.turn_id)
        finally:
            self._busy = False
            self._notify()
            if self._queue and not self._closed:
                self.relay.batcher.schedule(self, max(trio.current_time(), self._retry_at))

    def _commands(
        self, batch: list[dict[str, Any]], first: int, now: float
    ) -> tuple[list[tuple[Any, ...]], bool]:
        """The flush's ``XADD`` of ``batch`` from seq ``first``, with the TTLs' commands
        when it sets them; and whether it does. The TTLs are set by the first flush and
        the last, and refreshed at most every ``TTL_REFRESH`` seconds: a flush in
        between is one ``XADD``, not three commands."""
        relay = self.relay
        ended = batch[-1].get("type") == END and batch[-1].get("paused") is not True
        opening = self.flushes == 0  # a continuation's or a takeover's first entry too
        fields: dict[str, str | bytes] = {
            "first": str(first),
            "items": orjson.dumps(batch, default=str),
            "w": self.writer_id,
        }
        if self._prev is not None:
            fields["prev"] = self._prev
        touch = ended or opening or now - self._touched > TTL_REFRESH
        commands: list[tuple[Any, ...]] = [("XADD", self.key, f"{first}-1", fields)]
        if touch:
            commands.append(("EXPIRE", self.key, relay.end_ttl if ended else relay.live_ttl))
            active = relay.active_key(self.session_id)
            if opening:
                commands.append(("SET", active, self.turn_id, relay.live_ttl))
            elif ended:
                commands.append(("EXPIRE", active, relay.end_ttl))
        return commands, touch


@functools.cache
def _response_error() -> type[BaseException]:
    from coredis.exceptions import ResponseError

    return ResponseError


def _duplicate(error: BaseException) -> bool:
    """Whether ``error`` is Redis refusing an ``XADD`` id at or below the stream's top."""
    return isinstance(error, _response_error()) and "equal or smaller" in str(error)


@attrs.define(kw_only=True, slots=True, eq=False)
class _Job:
    """One writer's flush in the flusher's pipeline (:class:`_Flusher`): its commands,
    ``("XADD", key, id, fields)`` first (the one whose reply is wanted), then
    ``("EXPIRE", key, seconds)`` / ``("SET", key, value, ex_seconds)``; the batch it
    carries from seq ``first``; whether it sets the TTLs (``touch``), and when it was
    taken (``at``)."""

    writer: RedisRelayWriter
    batch: list[dict[str, Any]]
    first: int
    commands: list[tuple[Any, ...]]
    touch: bool
    at: float
    result: Any = None
    error: BaseException | None = None


class _Flusher:
    """The relay's one flush task: writes every writer's due queue, those due at one
    moment in one pipeline.

    Each writer had a task of its own that held its queue, then handed its flush to a
    batcher task and waited for the outcome: about five task wake-ups, a cancel scope
    and an ``Event`` per flush, and a worker's turn makes several (issue 24 goal 3: the
    relay was about 22 % of a worker's CPU per turn). Now a writer's append only queues
    and, when its queue starts waiting, tells this task when it is due (:meth:`schedule`;
    a wake-up only when that is sooner than what this task already sleeps until, so a
    burst at a tick wakes nothing). At the due moment this task takes every due
    writer's queue, sends them as one pipeline, and settles each writer's outcome
    itself (:meth:`RedisRelayWriter._settle`); a writer's closer waits for its own
    outcome, nobody else does.

    Pipelines are written as RESP on a connection of their own
    (:mod:`actors.relays.resp`; coredis for a URL that module does not serve): through
    coredis one ``XADD`` cost about 200 µs of CPU. Each writer still has at most one
    flush out and gets its own outcome: its ``XADD`` refused (a duplicate id, a key of
    another type) is its error alone; a connection that breaks, or a pipeline that
    outlives ``timeout``, fails every flush of that pipeline, each retried by its writer
    after a backoff (the ids make a flush Redis applied a duplicate). While a pipeline
    is out, appends only queue (each writer's queue is bounded, ``max_queue``).
    """

    def __init__(self, client: Any, url: str | None, timeout: float) -> None:
        self.client = client
        self.timeout = timeout
        where = resp.address(url) if url is not None else None
        self.connection = resp.RespConnection(where) if where is not None else None
        """The writers' own connection (``None``: they go through coredis)."""
        self._pending: dict[RedisRelayWriter, None] = {}
        """The writers whose queue waits to go out (each knows when: ``_due``)."""
        self._wake = trio.Event()
        self._asleep_until = -math.inf
        """What this task sleeps until (``inf``: until woken; ``-inf``: it is not
        asleep, and looks at every pending writer before it sleeps again)."""
        self.pipelines = 0
        """Pipelines sent (observable: fewer than the writers' flushes when busy)."""
        self.wakeups = 0
        """Times a writer woke this task (observable: a burst at a tick wakes it once)."""

    def schedule(self, writer: RedisRelayWriter, at: float) -> None:
        """``writer``'s queue goes out at ``at`` (Trio clock) with every other due then."""
        writer._due = at
        self._pending[writer] = None
        if at < self._asleep_until:
            self._asleep_until = at
            self.wakeups += 1
            self._wake.set()

    def forget(self, writer: RedisRelayWriter) -> None:
        """``writer`` closed: whatever it still queues is not written."""
        writer._due = None
        self._pending.pop(writer, None)

    async def run(self) -> None:
        try:
            while True:
                await self._serve()
        finally:
            if self.connection is not None:
                await self.connection.aclose()

    async def _serve(self) -> None:
        """Send pipelines until one outlives ``timeout`` (its flushes then fail with
        ``TooSlowError``). One cancel scope serves them all, its deadline moved for each
        pipeline, instead of a ``trio.fail_after`` per pipeline: a new scope with a
        deadline was ~44 µs of CPU on the 2-core benchmark machine."""
        with trio.CancelScope() as scope:
            while True:
                jobs = await self._next_jobs()
                self.pipelines += 1
                scope.deadline = trio.current_time() + self.timeout
                await self._send(jobs)
                scope.deadline = math.inf

    async def _next_jobs(self) -> list[_Job]:
        """The flushes of every writer due, once there are any (sleeping until the
        soonest is due, or a writer wakes this task for a sooner one)."""
        while True:
            now = trio.current_time()
            jobs: list[_Job] = []
            pending = self._pending
            for writer in list(pending):
                due = writer._due
                if due is None:  # closed meanwhile
                    del pending[writer]
                elif due <= now:
                    del pending[writer]
                    writer._due = None
                    job = writer._take(now)
                    if job is not None:
                        jobs.append(job)
            if jobs:
                return jobs
            # After the look: a writer ``_take`` settled at once is due again (later).
            soonest = min((writer._due or math.inf for writer in pending), default=math.inf)
            self._asleep_until = soonest
            if soonest == math.inf:
                await self._wake.wait()
            else:
                with trio.move_on_at(soonest):
                    await self._wake.wait()
            self._asleep_until = -math.inf
            if self._wake.is_set():
                self._wake = trio.Event()

    async def _send(self, jobs: list[_Job]) -> None:
        """One pipeline of ``jobs``; each writer gets its outcome, whatever happens."""
        try:
            if self.connection is not None:
                await self._send_resp(jobs)
            else:
                await self._send_coredis(jobs)
        except Exception as exc:  # the connection: every flush of it failed
            for job in jobs:
                job.error = exc
        except BaseException:  # the deadline (or the relay closing): none was confirmed
            for job in jobs:
                job.error = trio.TooSlowError(f"Redis did not answer within {self.timeout:g} s")
            raise
        finally:
            for job in jobs:
                job.writer._settle(job)

    async def _send_resp(self, jobs: list[_Job]) -> None:
        assert self.connection is not None
        commands: list[list[Any]] = []
        for job in jobs:
            for name, key, *args in job.commands:
                if name == "XADD":
                    identifier, fields = args
                    flat = [x for pair in fields.items() for x in pair]
                    commands.append(["XADD", key, identifier, *flat])
                elif name == "SET":
                    value, ex = args
                    commands.append(["SET", key, value, "EX", ex])
                else:
                    commands.append([name, key, *args])
        replies = await self.connection.pipeline(commands)
        at = 0
        for job in jobs:
            reply = replies[at]
            at += len(job.commands)
            if isinstance(reply, Exception):
                job.error = reply
            else:
                job.result = reply

    async def _send_coredis(self, jobs: list[_Job]) -> None:
        wanted: list[Any] = []
        async with self.client.pipeline(transaction=False, raise_on_error=False) as pipe:
            for job in jobs:
                (_, key, identifier, fields), *rest = job.commands
                wanted.append(pipe.xadd(key, fields, identifier=identifier))
                for name, key, *args in rest:
                    if name == "SET":
                        pipe.set(key, args[0], ex=args[1])
                    else:
                        pipe.expire(key, args[0])
        for job, result in zip(jobs, wanted, strict=True):
            try:
                job.result = await result
            except Exception as exc:  # this writer's command was refused
                job.error = exc


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
        retry_base: float = 0.05,
        retry_max: float = 2.0,
        retry_for: float = RETRY_FOR,
        op_timeout: float = 5.0,
        close_timeout: float = 10.0,
        block_ms: int = BLOCK_MS,
        flush_interval: float = FLUSH_INTERVAL,
        end_wait: float = END_WAIT,
        url: str | None = None,
    ) -> None:
        self.client = client
        self.nursery = nursery
        self.prefix = prefix
        self.live_ttl = live_ttl
        self.end_ttl = end_ttl
        self.max_queue = max_queue
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
        self.live: set[RedisRelayWriter] = set()
        """Writers not closed yet (the relay's close lets their queues out)."""
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
            client = coredis.Redis.from_url(
                url, decode_responses=False, connect_timeout=2.0, verify_version=False
            )
        except ValueError as exc:
            raise ConfigurationError(f"bad Redis URL {shown!r}: {exc}") from None
        relay_options = dict(options)
        retry_for = float(relay_options.get("retry_for", RETRY_FOR))
        try:
            async with client:
                await _wait_for_redis(client, shown, retry_for)
                async with trio.open_nursery() as nursery:
                    relay = cls(client, nursery, url=url, **relay_options)
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

    def next_tick(self, now: float) -> float:
        """The relay's next flush tick after ``now`` (Trio clock): the next multiple of
        ``flush_interval``, the same for every writer, so those that wait flush together."""
        interval = self.flush_interval
        return interval * (math.floor(now / interval) + 1)

    def rate_limits(self) -> Any:
        """A rate-limit backend over this relay's connection and prefix, which every
        worker sharing the relay shares (:class:`actors.relays.limits.RedisLimitBackend`)."""
        return RedisLimitBackend(self.client, self.prefix)

    # -- keys -------------------------------------------------------------------------------

    def turn_key(self, turn_id: str) -> str:
        return f"{self.prefix}turn:{turn_id}"

    def active_key(self, session_id: str) -> str:
        return f"{self.prefix}active:{session_id}"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}cancel"

    # -- writing ----------------------------------------------------------------------------

    def writer(
        self, *, session_id: str, turn_id: str, takeover: bool = False, fresh: bool = False
    ) -> RedisRelayWriter:
        """A writer for a turn this process runs; the relay's flush task writes what it
        queues. A second writer for the same turn (a ``takeover``) continues its seqs; a
        takeover that finds no stream starts one readers cannot take for the whole turn.
        A ``fresh`` writer (nothing streamed the turn before) starts at seq 1 without
        reading the stream's tail: one ``XREVRANGE`` fewer per turn."""
        writer = RedisRelayWriter(
            self, session_id=session_id, turn_id=turn_id, takeover=takeover and not fresh
        )
        if fresh:
            writer.start_fresh()
        self.live.add(writer)
        return writer

    # -- reading ----------------------------------------------------------------------------

    async def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        """``await fn()`` with retries and backoff while Redis does not answer, for up to
        ``retry_for`` seconds, then :class:`~runtime.errors.RelayUnavailable`."""
        deadline = trio.current_time() + self.retry_for
        attempt = 0
        while True:
            try:
                with trio.fail_after(self.op_timeout + self.block_ms / 1000):
                    return await fn()
            except _retryable() as exc:
                if trio.current_time() >= deadline:
                    raise RelayUnavailable(
                        f"Redis did not answer for {self.retry_for:g} s ({what}): "
                        f"{type(exc).__name__}: {exc}"
                    ) from None
                delay = _backoff(attempt, self.retry_base, self.retry_max)
                attempt += 1
                log.warning(
                    "relay.read_failed", what=what, retry_in=round(delay, 3), error=redact(str(exc))
                )
                await trio.sleep(delay)

    async def _read_call(self, turn_id: str, what: str, fn: Callable[[], Any]) -> Any:
        """:meth:`_call` on a turn's stream: a key of another type there (junk) is
        :class:`~runtime.errors.RelayTurnGone`."""
        from coredis.exceptions import WrongTypeError

        try:
            return await self._call(what, fn)
        except WrongTypeError:
            raise RelayTurnGone(
                f"the relay's key of turn {turn_id!r} is not a stream (junk in Redis)"
            ) from None

    async def active_turn(self, session_id: str) -> str | None:
        """The session's turn that is still streaming, if any (``None``: none, or ended).

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
            return turn_id
        if not last:
            return None
        try:
            ended = _decode(last[0]).items[-1]["type"] == END
        except _Undecodable:
            return turn_id
        return None if ended else turn_id

    async def read(
        self, turn_id: str, *, after_seq: int | None = None, after_pauses: int = 0
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
        """
        key = self.turn_key(turn_id)
        seen = after_seq if after_seq is not None else 0
        cursor = _Cursor(turn_id=turn_id)
        backlog, last_id = await self._replay(turn_id, key, cursor)
        if not cursor.position:
            raise RelayTurnGone(f"the relay has no stream for turn {turn_id!r}")
        if seen > cursor.position:
            # The client saw more than the stream holds: not the stream it read.
            raise RelayTurnGone(
                f"the relay's stream of turn {turn_id!r} ends at seq {cursor.position}, "
                f"before seq {seen} the client saw: it was lost and started again"
            )
        place = _Place(seen=seen, pauses=after_pauses)
        place.skip_pauses(backlog)
        backlog = _drop_restarted(backlog, place.seen)
        for index, (seq, item) in enumerate(backlog):
            done = self._next(place, turn_id, seq, item, tail=index == len(backlog) - 1)
            if done is _END:
                return
            if done is not None:
                yield done
        if cursor.ended:
            return
        while True:  # live: block on new entries after the last one
            pairs: list[tuple[int, Any]] = []
            for entry in await self._next_entries(turn_id, key, last_id):
                pairs.extend(cursor.accept(entry))
                last_id = entry.identifier
            for index, (seq, item) in enumerate(pairs):
                done = self._next(place, turn_id, seq, item, tail=index == len(pairs) - 1)
                if done is _END:
                    return
                if done is not None:
                    yield done

    async def _replay(
        self, turn_id: str, key: str, cursor: _Cursor
    ) -> tuple[list[tuple[int, Any]], bytes | str]:
        """The turn's stream from the start, page by page, as ``cursor`` accepts it (seq,
        item pairs), and the id of its last entry, where live reading goes on.

        From the start, so restarted steps are dropped before anything goes out. Seqs are
        the writer's, so a stream that lost its head (Redis restarted without its data
        while the turn went on) shows as a hole, never as a shorter turn."""
        backlog: list[tuple[int, Any]] = []
        start = "-"
        last_id: bytes | str = "0-0"
        while True:
            page = await self._read_call(
                turn_id,
                "replay",
                functools.partial(self.client.xrange, key, start, "+", count=PAGE),
            )
            for entry in page:
                backlog.extend(cursor.accept(entry))
                last_id = entry.identifier
            if len(page) < PAGE:
                return backlog, last_id
            start = f"({_identifier(last_id)}"

    async def _next_entries(self, turn_id: str, key: str, last_id: bytes | str) -> Any:
        """The stream's next entries after ``last_id``, blocking until there are some;
        :class:`~runtime.errors.RelayTurnGone` when the stream expired meanwhile."""
        while True:
            result = await self._read_call(
                turn_id,
                "live",
                functools.partial(
                    self.client.xread, {key: last_id}, count=PAGE, block=self.block_ms
                ),
            )
            entries = next(iter(result.values()), ()) if result else ()
            if entries:
                return entries
            exists = await self._call("exists", lambda: self.client.exists([key]))
            if not exists:
                raise RelayTurnGone(f"the relay's stream of turn {turn_id!r} expired or was lost")

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

    async def request_cancel(self, turn_id: str, reason: str = "cancelled") -> int:
        """Ask the process that runs ``turn_id`` to cancel it; returns how many processes
        listen (``0``: nobody runs relay cancels now)."""
        message = orjson.dumps({"turn_id": turn_id, "reason": reason})
        return await self._call("cancel", lambda: self.client.publish(self.cancel_channel, message))

    async def watch_cancels(
        self,
        on_cancel: Callable[[str, str], Any],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Call ``on_cancel(turn_id, reason)`` for every cancel request, until cancelled;
        resubscribes (with backoff) after Redis went away."""
        started = False
        attempt = 0
        while True:
            failed: BaseException | None = None
            try:
                async with self.client.pubsub(
                    channels=[self.cancel_channel], ignore_subscribe_messages=True
                ) as pubsub:
                    if not started:
                        task_status.started()
                        started = True
                    attempt = 0
                    async for message in pubsub:
                        _cancel_from(message, on_cancel)
            except* _transient() as group:
                failed = group.exceptions[0]
            except* _closed_stream() as group:
                # coredis's subscription sends its UNSUBSCRIBE on the way out, also when its
                # connection was closed under it (a worker shutting down, Redis gone): a
                # closed connection, not a crash of the process
                failed = group.exceptions[0]
            if failed is not None:
                await trio.lowlevel.checkpoint()  # shutting down: the cancellation goes on
                delay = _backoff(attempt, self.retry_base, self.retry_max)
                attempt += 1
                log.warning(
                    "relay.cancel_watch_failed",
                    retry_in=round(delay, 3),
                    error=redact(f"{type(failed).__name__}: {failed}"),
                )
                await trio.sleep(delay)
            if not started:  # the subscription ended before it began: try again
                await trio.sleep(self.retry_base)


def _cancel_from(message: dict[str, Any], on_cancel: Callable[[str, str], Any]) -> None:
    """Hand a cancel request of the relay's channel to ``on_cancel`` (junk is logged)."""
    if message.get("type") != "message":
        return
    try:
        data = orjson.loads(message["data"])
        turn_id, reason = str(data["turn_id"]), str(data.get("reason", ""))
    except (orjson.JSONDecodeError, KeyError, TypeError):
        log.warning("relay.bad_cancel", data=repr(message.get("data"))[:200])
        return
    on_cancel(turn_id, reason or "cancelled")


def _closed_stream() -> tuple[type[BaseException], ...]:
    """What coredis raises writing to a connection already closed (anyio's streams)."""
    import anyio

    return (anyio.ClosedResourceError, anyio.BrokenResourceError)


_END = object()
_TURN_ID = re.compile(rb"[A-Za-z0-9_.:-]{1,128}")
"""Turn ids' alphabet (:mod:`runtime.app.session`)."""


def _turn_id(raw: Any) -> str | None:
    """The turn id a session's key holds; ``None`` when it holds none, or junk."""
    if not isinstance(raw, bytes) or _TURN_ID.fullmatch(raw) is None:
        return None
    return raw.decode()


async def _wait_for_redis(client: Any, shown: str, retry_for: float) -> None:
    """PING until Redis answers; :class:`RelayUnavailable` after ``retry_for`` seconds."""
    deadline = trio.current_time() + retry_for
    attempt = 0
    while True:
        try:
            with trio.fail_after(5.0):
                await client.ping()
            return
        except _retryable() as exc:
            if trio.current_time() >= deadline:
                raise RelayUnavailable(
                    f"Redis at {shown} did not answer for {retry_for:g} s: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            log.warning("relay.connect_failed", url=shown, error=redact(str(exc)))
            await trio.sleep(_backoff(attempt, 0.1, 2.0))
            attempt += 1


def _single_leaf(group: BaseExceptionGroup) -> BaseException | None:
    """The only exception inside nested groups, or ``None`` when there are several."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else None


def _drop_restarted(backlog: list[tuple[int, Any]], seen: int) -> list[tuple[int, Any]]:
    """The backlog with every reset step's earlier chunks removed: before a restart
    marker (an older worker's takeover), all of them; before a ``reset-step`` (a
    takeover, a provider fallback), all but the step's ``step-start``, which no new one
    follows. The marker or reset stays only when the reader had already been sent some
    of the removed chunks (seq <= ``seen``)."""
    resets = [i for i, (_, item) in enumerate(backlog) if item.get("type") in _RESETS]
    if not resets:
        return backlog
    keep = [True] * len(backlog)
    for i in resets:
        step = backlog[i][1]["step"]
        kept = _KEPT[backlog[i][1]["type"]]
        dropped_seen = False
        for j in range(i):
            seq, item = backlog[j]
            if keep[j] and item.get("step") == step and item.get("type") not in kept:
                keep[j] = False
                dropped_seen = dropped_seen or seq <= seen
        keep[i] = dropped_seen
    return [pair for pair, k in zip(backlog, keep, strict=True) if k]


_KEPT = {RESTART: (RESTART,), "reset-step": (RESTART, "reset-step", "step-start")}
"""What a reset keeps of its step's earlier items."""
_RESETS = tuple(_KEPT)


def public_url(url: str) -> str:
    """``url`` without its credentials (``redis://:PW@``, ``user:PW@``, ``?password=``),
    for messages and logs: :func:`runtime.redact.redact_url`."""
    return redact_url(url)


__all__ = ["RedisRelay", "RedisRelayWriter", "StepRestarted"]
