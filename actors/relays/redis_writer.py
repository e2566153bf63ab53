"""One turn's writer on the Redis Streams relay (:class:`RedisRelayWriter`) and its flushes.

A writer only queues the turn's chunks and says when its queue is due; the relay's one
flush task (:mod:`actors.relays.redis_flush`) writes it, and hands each flush (a
:class:`_Job`) back to its writer (:meth:`RedisRelayWriter._settle`). Apart from the reader
(:mod:`actors.relays.redis_streams`): this is the side every chunk a turn streams goes
through; the entries it writes are described in :mod:`actors.relays.redis_entries`.

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

**Bytes.** A count alone let a turn of large chunks (a 20 MB tool output, the inputs of
thousands of parallel calls) hold ``max_queue`` times their size while Redis was slow. A
writer also counts the bytes it holds (its queued chunks' JSON, and the entry a flush
has out: :attr:`RedisRelayWriter.held`); past ``max_queue_bytes``
(:data:`MAX_QUEUE_BYTES`) its turn waits (:meth:`RedisRelayWriter.room`, which the
worker and the relay publisher await after each batch they append), so a slow Redis
slows the turn instead of growing the worker or losing the stream. A Redis that gives
no room for ``close_timeout`` is down, not slow: the queue is dropped as on overflow
(``gap``), and until a flush goes through again a writer over the bound drops instead
of waiting, so an outage neither holds the turn nor the memory. Readers take nothing
from a writer (they read Redis): a reader that stops reading holds none of it.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import attrs
import structlog
import trio
from orjson import dumps as _dumps

from actors.relays.redis_entries import (
    END,
    FROM_START,
    GAP,
    PAGE,
    _decode,
    _entry_seq,
    _identifier,
    _joined,
    _paused,
    _split,
    _StepScan,
    _tail,
    _Undecodable,
)
from actors.relays.redis_failures import (
    EntryTooLarge,
    _backoff,
    _described,
    _duplicate,
    _retryable,
)
from runtime.errors import RelayUnavailable
from runtime.relay import RESTART_STEP as RESTART
from runtime.serde import flat_unstructurer, unstructurer, utf8_dumps

if TYPE_CHECKING:
    from actors.relays.redis_streams import RedisRelay

log = structlog.get_logger("axon.relay")

LIVE_TTL = 24 * 3600
"""Seconds a turn's stream lives while it is written (refreshed on every flush)."""
END_TTL = 15 * 60
"""Seconds a finished turn's stream stays readable (a late reconnect can still replay it)."""
MAX_QUEUE = 10_000
"""Chunks a writer queues at most while Redis does not answer; past it the queue is
dropped and readers are told (``gap``)."""
MAX_QUEUE_BYTES = 16 * 1024 * 1024
"""Bytes a writer holds (queued chunks' JSON and its flush's entry out) before its turn
waits for Redis (:meth:`RedisRelayWriter.room`). 16 MB: a turn's usual burst (deltas, a
step's tool calls) is a few kB, far below it; a chunk larger than it (a 20 MB tool
output) still goes, alone (the wait is before the next batch, not for the one that
crosses the bound); and a worker running dozens of turns against a slow Redis holds at
most dozens of times this, not ``max_queue`` times its largest chunk."""
FLUSH_INTERVAL = 0.005
"""Seconds: a writer's flush asked for sooner than this after its previous one waits for
the relay's next tick (multiples of this on the Trio clock), so a burst of chunks is one
``XADD`` and the writers flushing at one tick share one pipeline. ``0``: never wait."""
END_WAIT = 0.05
"""Seconds a turn's last chunk (``finish``, ``error``, ``abort``) waits at most for the
writer's close, so the stream's end is written with it in one entry. ``0``: never wait."""
TTL_REFRESH = 60.0
"""Seconds between refreshes of a live stream's TTL (``LIVE_TTL``, a day: once a minute
is plenty, and a flush in between costs one command instead of three)."""

_LAST = frozenset({"finish", "error", "abort"})
"""The chunk types that end a turn's output: its relay end follows (``aclose``)."""
_QUIET = frozenset({"step-start"})
"""Chunks that show a reader nothing by themselves: a flush of only these is not made at
once even after a quiet spell, but waits for the relay's next tick, so the step's first
content (which follows within the tick when the model is quick) goes in the same entry.
In a worker's tool-using turn the second step's ``step-start`` came after the tool
step's save, more than ``flush_interval`` after the previous flush, and went in an
``XADD`` of its own (issue 24 goal 3)."""


def _chunks(items: list[dict[str, Any]]) -> int:
    """The turn's chunks among queued ``items``: the markers the writer queues itself
    (a gap's after an overflow or a refusal, the stream's end at its close) are none of
    the turn's, so dropping one, again at every refusal, counts nothing in
    :attr:`RedisRelayWriter.lost`."""
    return sum(item["type"] not in _MARKERS for item in items)


_MARKERS = frozenset({GAP, END, FROM_START})


def _too_large(error: BaseException) -> bool:
    """Whether ``error`` is Redis's answer to a command larger than it takes (past its
    ``proto-max-bulk-len``): ``Protocol error: invalid bulk length`` where Redis's reply
    came (plain ``redis://``), :class:`EntryTooLarge` where the flusher found it by the
    entry's size (the reply lost with the connection, as over TLS)."""
    return isinstance(error, EntryTooLarge) or "Protocol error" in str(error)[:30]


def _refusal(error: BaseException) -> str:
    """What a gap says of the refusal that made it, for its readers: Redis out of
    memory (its ``OOM`` error), or another refusal; Redis's text cut at 200 characters."""
    text = str(error)[:200]
    if text.startswith("OOM"):
        return f"Redis is out of memory and refused the stream's writes ({text})"
    if _too_large(error):
        return (
            "Redis refused an entry of the stream as larger than it accepts (a chunk "
            f"or a batch of chunks past its proto-max-bulk-len: {text})"
        )
    return f"Redis refused the stream's writes ({type(error).__name__}: {text})"


_UNSTRUCTURERS: dict[type, Callable[[Any], dict[str, Any]]] = {}
"""Each chunk class's unstructure hook (:func:`_hook`), looked up once a class: a
worker's turn appends ~35 chunks of a few classes."""


def _hook(cls: type) -> Callable[[Any], dict[str, Any]]:
    """The relay's unstructure hook for ``cls`` (:func:`~runtime.serde.unstructurer`),
    cached. An output chunk class (its ``type`` a string on the class, as
    :mod:`runtime.output` sets it) gives items that all have it: its hook as it is. Any
    other class (a dict, an application's value) is checked at each use: an item with no
    string ``type``, queued, would be junk in the stream to every reader, or kill the
    relay's one flush task (every writer's) when it counts a batch's chunks."""
    hook = flat_unstructurer(cls) or unstructurer(cls)  # (one call a chunk: a text delta's)
    if not isinstance(getattr(cls, "type", None), str):
        unchecked = hook

        def hook(chunk: Any) -> dict[str, Any]:
            item = unchecked(chunk)
            try:
                kind = item["type"]
            except (KeyError, TypeError, IndexError):
                kind = None
            if type(kind) is not str:
                raise TypeError(
                    f"a {cls.__name__} is not an output chunk (it unstructures to no string "
                    "'type'): a relay writer takes output chunks only"
                )
            return item

    _UNSTRUCTURERS[cls] = hook
    return hook


def _entry_bytes(job: _Job) -> int:
    """The bytes of ``job``'s entries' chunks (what its writer holds while it is out)."""
    return job.size()


def _size(item: dict[str, Any]) -> int:
    """The bytes ``item`` takes as JSON (what :attr:`RedisRelayWriter.held` counts). An
    item that does not encode (an int past 64 bits) counts as its ``repr``: its flush
    will fail (:meth:`RedisRelayWriter._take`), not its append."""
    try:
        return len(utf8_dumps(item, default=str))
    except TypeError:
        return len(repr(item))


def _measured(items: list[dict[str, Any]]) -> int:
    """The bytes ``items`` take as JSON, on the rare paths that cut a queue (a retry's
    split, an overflow); an append counts its chunk's alone."""
    return sum(_size(item) for item in items)


def _quiet(items: list[dict[str, Any]]) -> bool:
    """Whether ``items`` are all :data:`_QUIET` chunks. A loop, not ``all`` of a
    generator: asked at each flush and each queue's wait, ~20 times a worker's turn, the
    generator was a frame and a resume an item (issue 24 goal 3)."""
    for item in items:
        if item["type"] not in _QUIET:
            return False
    return True


class RedisRelayWriter:
    """One turn's outgoing side (:class:`runtime.relay.RelayWriter`) on a Redis Stream.

    A writer has no task of its own: :meth:`append` queues, and the relay's one flusher
    (:class:`_Flusher`) writes the queue when it is due (see :meth:`_due_at`)."""

    def __init__(
        self,
        relay: RedisRelay,
        *,
        session_id: str,
        turn_id: str,
        takeover: bool = False,
        resumed: bool = False,
        pauses: int = 0,
    ) -> None:
        self.relay = relay
        self.session_id = session_id
        self.turn_id = turn_id
        self.takeover = takeover
        """Another writer may have streamed the turn before: a stream found empty lost it."""
        self.resumed = resumed
        """A continuation after a wait: a stream that does not end with its pause lost
        the first part's end (its writer stopped before it streamed it)."""
        self.pauses = pauses
        """How many times the turn waited before this writer's part (its continuation
        number, the turn row's ``resumes``): a takeover of a continuation whose stream
        does not end with a pause and holds fewer than that lost a part's end (the
        worker that suspended the turn stopped before it streamed it, and the
        continuation's claimer before its first flush): :meth:`_count_pauses`."""
        self.key = relay.turn_key(turn_id)
        self.writer_id = os.urandom(8).hex().encode()
        """Written in every entry (``w``), so a reader tells this writer's entries from
        those of a writer that started the stream over: 16 random hex digits, as the
        first of a ``uuid4``'s were, without its object (~2-5 us a turn, issue 24 goal 3)."""
        self._prev: bytes | None = None
        """The writer whose tail this one continues, written (``prev``) until this
        writer's first entry is in."""
        self._queue: list[dict[str, Any]] = []
        self._bytes = 0
        """The turn's chunks in ``_queue`` as JSON, in bytes (the writer's own markers,
        a few bytes each, are not counted)."""
        self._out = 0
        """The entry of the flush that is out, in bytes (0 while none is)."""
        self._gave_way = False
        """:meth:`room` waited ``close_timeout`` and Redis made none: until a flush goes
        through, a writer over the bound drops its queue instead of waiting."""
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
        self._doubt = 0
        """The queue's first items that a failed flush carried: Redis may have applied it
        without answering. The next flush carries them alone, at the same seqs, so
        Redis refusing it as a duplicate means exactly them, not the chunks queued since
        (which a duplicate would otherwise take as written, though they never were)."""
        self.lost_under: int | None = None
        """The first seq of this writer's flush whose connection was lost under it while
        Redis would not say its ``proto-max-bulk-len`` (``CONFIG`` refused): lost again
        under the same entry, that entry is refused as too large
        (:meth:`~actors.relays.redis_flush._Flusher._name_too_large`)."""
        self._unsure: tuple[int, int, str] | None = None
        """After Redis refused such a retry: the seq after its batch, the turn's chunks
        in it, and why (the gap's ``why`` if it is lost). Redis may hold the batch all
        the same (the first try applied unanswered), so the stream's tail is read before
        the next flush: the batch is lost (counted, readers told) only if the tail is not
        this writer's entry ending just before that seq (:meth:`_tail_read`)."""
        self._first_step: int | None = None
        """The step the caller first asked :meth:`shown` about (a takeover's re-run)."""
        self._unproven = False
        """A takeover's tail read found no stream, and which step it re-runs first is not
        known yet: nothing is written until it is, or until a close
        (:meth:`_found_no_stream`)."""
        self.steered_shown: frozenset[str] = frozenset()
        """The messages the stream shows steered into the step :meth:`shown` was last
        asked about (an earlier run's ``steered`` chunks, before a reset too): a takeover
        does not show them a second time (:meth:`runtime.app.worker.Worker._relay`)."""
        self.lost = 0
        """The turn's chunks dropped: the queue overflowed while Redis did not answer,
        Redis refused them, or the turn ended before they were written (the writer's own
        gap and end markers are not counted: :func:`_chunks`)."""
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

    def follow(self, earlier: list[RedisRelayWriter]) -> None:
        """Read the stream's tail only once this process's ``earlier`` writers of the
        turn are closed (at most ``close_timeout``): a continuation claimed here while
        the part before it is still ending (its wait committed, its end and pause not
        flushed yet) would otherwise read a tail without the pause, and write a false
        ``gap`` (a worker's continuation) or number on at the pause's own seqs (an
        embedded host's). Meanwhile appends only queue."""
        self._busy = True
        self.relay.nursery.start_soon(self._wait_for, earlier)

    async def _wait_for(self, earlier: list[RedisRelayWriter]) -> None:
        try:
            with trio.move_on_after(self.relay.close_timeout):
                for other in earlier:
                    while not other._closed:
                        if other._settled is None:
                            other._settled = trio.Event()
                        await other._settled.wait()
        finally:
            self._busy = False
            self._notify()
        if self._queue and not self._closed:
            self.relay.batcher.schedule(self, self._due_at(trio.current_time()))

    # -- the producer's side (never blocks) ----------------------------------------------

    def append(self, chunk: Any) -> None:
        """Queue ``chunk``; the relay's flusher writes it with whatever else is queued.

        Most of a turn's chunks come while its queue waits for the relay's tick: such a
        chunk (not the turn's last, the queue not full) is only appended, as
        :meth:`_put` would do for it, without its call (issue 24 goal 3)."""
        if self._closing:
            raise RuntimeError(f"relay writer for turn {self.turn_id!r} is closed")
        cls = type(chunk)
        hook = _UNSTRUCTURERS.get(cls) or _hook(cls)  # (a value that is no chunk: TypeError)
        item = hook(chunk)
        try:  # orjson itself: no Python call more a chunk (issue 24 goal 3)
            self._bytes += len(_dumps(item, default=str))
        except TypeError:  # half a character, or a value that does not encode
            self._bytes += _size(item)
        queue = self._queue
        if (
            self._due is not None
            and len(queue) < self.relay.max_queue
            and (self._end_by is not None or item["type"] not in _LAST)
        ):
            queue.append(item)
            return
        self._put(item)

    def extend(self, chunks: Iterable[Any]) -> None:
        """:meth:`append` each of ``chunks``, in order, in one call: a worker forwards its
        turn's chunks in batches (``TurnStream.next_batch``), ~35 a turn, and a call per
        chunk was a Python call more each (issue 24 goal 3). The same queue and the same
        flushes as their appends one by one.

        The batch's bytes (:attr:`held`) are one encode of the batch, not one a chunk:
        orjson writes a list as its items' JSON between brackets, joined by commas, so
        the items' bytes are the list's less ``n + 1`` (~26 encodes a worker's turn
        fewer, issue 24 goal 3). A chunk that does not encode as it is (half a
        character, an int past 64 bits) has the batch measured item by item, as an
        append measures it; a batch that overflows the queue has the queue's chunks
        measured, as the overflow does."""
        if self._closing:
            raise RuntimeError(f"relay writer for turn {self.turn_id!r} is closed")
        hooks = _UNSTRUCTURERS
        items = [(hooks.get(type(chunk)) or _hook(type(chunk)))(chunk) for chunk in chunks]
        if not items:
            return
        try:
            size = len(_dumps(items, default=str)) - len(items) - 1
        except TypeError:  # half a character, or a value that does not encode
            size = _measured(items)
        max_queue = self.relay.max_queue
        overflowed = False
        for item in items:
            queue = self._queue
            if (
                self._due is not None
                and len(queue) < max_queue
                and (self._end_by is not None or item["type"] not in _LAST)
            ):
                queue.append(item)
            else:
                overflowed = overflowed or len(queue) >= max_queue
                self._put(item)
        if overflowed:  # (the queue was cut and measured: what it holds now)
            self._bytes = _measured([i for i in self._queue if i["type"] not in _MARKERS])
        else:
            self._bytes += size

    @property
    def held(self) -> int:
        """The bytes this writer holds for Redis: its queued chunks as JSON, and the
        entry its flush has out (what ``max_queue_bytes`` bounds)."""
        return self._bytes + self._out

    async def room(self) -> None:
        """Wait while this writer holds ``max_queue_bytes`` or more (:attr:`held`): the
        turn's backpressure when Redis is slower than the turn (see the module's
        **Bytes**). Its callers await it after each batch they append (the worker's
        relay task, the relay publisher): the turn's own queues are bounded and block,
        so the turn waits, nothing is lost. Redis making no room within
        ``close_timeout`` is an outage: the queue is dropped (``gap``, counted in
        :attr:`lost`) and the turn goes on; until a flush goes through again, a writer
        over the bound drops at once instead of waiting again."""
        bound = self.relay.max_queue_bytes
        if self._bytes + self._out < bound or self._closing:
            return
        if self._gave_way:  # logged once an outage: its turn's every batch drops
            self._overflow(None)
            return
        with trio.move_on_after(self.relay.close_timeout):
            while self._bytes + self._out >= bound and not self._closed:
                if self._settled is None:
                    self._settled = trio.Event()
                await self._settled.wait()
            return
        self._gave_way = True
        self._overflow(
            f"Redis took no entry of this turn for {self.relay.close_timeout:g} s while "
            f"it held {self._bytes + self._out} bytes for it; readers rebuild from the "
            "store (and, until a flush goes through, from every batch over the bound)"
        )

    def _overflow(self, why: str | None) -> None:
        """Drop the queue (but a failed flush's batch, which Redis may hold already at
        its seqs: ``_doubt``) and tell readers (``gap``): Redis is not keeping up.
        Logged with ``why`` (``None``: not logged, the outage's first drop was)."""
        queue, doubt = self._queue, self._doubt
        dropped = _chunks(queue[doubt:])
        self.lost += dropped
        if why is not None:
            log.warning("relay.overflow", turn_id=self.turn_id, dropped=dropped,
                        bytes=self._bytes, error=why)  # fmt: skip
        del queue[doubt:]
        self._bytes = _measured(queue)
        if not queue or queue[-1]["type"] != GAP:
            queue.append({"type": GAP})
        if self._due is None and not self._busy and not self._closed and not self._unproven:
            self.relay.batcher.schedule(self, self._due_at(self.relay.batcher.now()))

    async def restart_step(self, step: int) -> None:
        """Queue the marker that drops the partial ``step`` for readers, and wait (at most
        ``close_timeout``) until it is written."""
        self._learn_step(step)
        self._put({"type": RESTART, "step": step})
        with trio.move_on_after(self.relay.close_timeout):
            await self.flushed()

    async def shown(self, step: int) -> list[Any] | None:
        """What an earlier writer streamed of ``step`` (:meth:`runtime.relay.RelayWriter.shown`):
        read from the stream's end back to the step's first chunk, page by page. A
        Redis that does not answer within ``close_timeout``, or junk, makes readers
        rebuild the turn (a ``gap``): the turn does not wait on the relay."""
        from coredis.exceptions import WrongTypeError

        self._learn_step(step)
        with trio.move_on_after(self.relay.close_timeout):
            try:
                scan = await self.relay._call("takeover scan", lambda: self._scan(step))
            except (RelayUnavailable, WrongTypeError, _Undecodable) as exc:
                log.warning(
                    "relay.takeover_scan_failed", turn_id=self.turn_id, error=_described(exc)
                )
            else:
                if not scan.behind:
                    self.steered_shown = frozenset(scan.steered)
                    return scan.result()
                # A step committed before this one is not whole in the stream (its
                # worker died between its commit and its flush): readers rebuild the
                # turn from the store rather than be shown it without that step's end.
                log.warning("relay.takeover_unended_step", turn_id=self.turn_id, step=step)
        self._put({"type": GAP})
        return None

    async def _scan(self, step: int) -> _StepScan:
        scan = _StepScan(step)
        end = "+"
        parts: tuple[int, list[bytes]] | None = None
        """The parts of a split chunk read so far, backwards: the chunk's seq, its parts."""
        while True:
            page = await self.relay.client.xrevrange(self.key, end, "-", count=PAGE)
            for raw in page:
                entry = _decode(raw)
                if entry.part is None:
                    items = entry.items
                elif parts is None and entry.index < entry.of:
                    # the stream ends inside a split chunk (its writer died writing it):
                    # nothing of that chunk was shown
                    continue
                else:  # a split chunk read backwards: joined once its first part is read
                    if parts is None or _entry_seq(raw.identifier) != parts[0]:
                        parts = (entry.first, [])
                    parts[1].append(entry.part)
                    if entry.index > 1:
                        continue
                    items = [_joined(b"".join(reversed(parts[1])))]
                    parts = None
                if scan.done(reversed(items)):
                    return scan
            if len(page) < PAGE:
                return scan
            end = f"({_identifier(page[-1].identifier)}"

    async def aclose(
        self, *, final: bool = True, paused: bool = False, shield: bool = False
    ) -> None:
        """Flush what is queued; with ``final`` the stream ends (readers stop) and expires
        after ``end_ttl``; with ``paused`` too, the turn waits for a person instead: the
        stream stays for ``live_ttl`` and the turn's continuation goes on in it. Bounded by
        ``close_timeout``: a Redis that stays down does not hold the turn's end. A closer
        that is cancelled does not cancel the flush (the relay's flusher writes it); with
        ``shield`` it still waits for it (bounded the same), as a worker closes its turn's
        writer: the bound's scope is the shield too, one cancel scope a close where the
        worker's own shield around it made two (issue 24 goal 3)."""
        if self._closing:
            return
        if final:
            self._put({"type": END, "paused": True} if paused else {"type": END})
        self._closing = True
        self._hurry_up()
        deadline = self.relay.batcher.now() + self.relay.close_timeout
        with trio.CancelScope(shield=shield, deadline=deadline):
            await self.flushed()
        self._closed = True
        self.relay._forget(self)
        self._notify()
        if self._unsure is not None:  # not known whether Redis holds it: counted lost
            self.lost += self._unsure[1]
            self._unsure = None
        if self._queue:
            unflushed = _chunks(self._queue)
            self.lost += unflushed
            log.warning(
                "relay.unflushed",
                turn_id=self.turn_id,
                chunks=unflushed,
                error="Redis did not answer before the turn ended; readers rebuild from the store",
            )

    async def flushed(self) -> None:
        """Wait until everything queued so far is written (or the writer stopped)."""
        while (self._queue or self._busy or self._unsure) and not self._closed:
            if self._settled is None:
                self._settled = trio.Event()
            await self._settled.wait()

    def _put(self, item: dict[str, Any]) -> None:
        if self.takeover and self._first_step is None and item["type"] == "step-start":
            self._learn_step(item["step"])
        queue = self._queue
        if len(queue) >= self.relay.max_queue:
            self._overflow("Redis is not keeping up; readers of this turn rebuild from the store")
        queue.append(item)
        last = self._end_by is None and item["type"] in _LAST
        if last:
            self._end_by = self.relay.batcher.now() + self.relay.end_wait
        if self._due is None:
            if not self._busy and not self._closed and not self._unproven:
                self.relay.batcher.schedule(self, self._due_at(self.relay.batcher.now()))
        elif last and not self._hurry:
            # What waited for its tick now waits with the last chunk for the close.
            self.relay.batcher.schedule(self, self._due_at(self.relay.batcher.now()))

    def _notify(self) -> None:
        settled, self._settled = self._settled, None
        if settled is not None:
            settled.set()

    def _learn_step(self, step: int) -> None:
        """The first step this writer streams (a takeover's re-run): told by
        :meth:`shown`, :meth:`restart_step`, or read off its first ``step-start``."""
        if self._first_step is None:
            self._first_step = step
            if self._unproven:
                self._found_no_stream()

    def _found_no_stream(self) -> None:
        """A takeover found no stream (Redis lost it, or the dead writer streamed
        nothing: the two look the same). When it re-runs the turn from step 0 (no step
        was committed), its stream is the whole turn: :data:`FROM_START` first, which
        only readers that showed some of the turn before take for a loss; otherwise (a
        later step, or not known by a close) a ``gap``: readers rebuild from the store.
        Then the queue goes out."""
        self._unproven = False
        whole = self._first_step == 0
        self._queue.insert(0, {"type": FROM_START if whole else GAP})
        if not whole:
            log.warning("relay.takeover_lost_stream", turn_id=self.turn_id)
        if self._queue and not self._closed and not self._busy:
            self.relay.batcher.schedule(self, max(self.relay.batcher.now(), self._retry_at))

    def _hurry_up(self) -> None:
        """Nothing is held any more (a close): a queue waiting for its tick or for the
        close goes out at once (not before a failed flush's backoff is over)."""
        if self._unproven:
            self._found_no_stream()
        self._hurry = True
        if self._due is not None and not self._closed:
            self.relay.batcher.schedule(self, max(self.relay.batcher.now(), self._retry_at))

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
        """The flush of everything queued, for the flusher's pipeline at ``now``; when the
        stream's tail must be read first (a continuation's or a takeover's first flush),
        that read instead: a job of the pipeline (its ``XREVRANGE`` on the writers' own
        connection), or without one (coredis) ``None`` and a task of its own; the writer
        is due again once it is back."""
        self._busy = True
        if self._next_seq is None:
            if self.relay.batcher.connection is not None:
                # Through coredis the read cost ~190 us of the loop's CPU and ~0.45 ms,
                # a task and a deadline's scope besides; on the RESP connection ~15 us.
                command = ("XREVRANGE", self.key, "+", "-", "COUNT", 1)
                return _Job(writer=self, batch=[], first=0, commands=[command], touch=False,
                            at=now, tail=True)  # fmt: skip
            self.relay.nursery.start_soon(self._read_tail)
            return None
        retry, self._doubt = self._doubt, 0
        if retry:  # a failed flush's batch again, alone (see ``_doubt``)
            batch, self._queue = self._queue[:retry], self._queue[retry:]
            self._bytes = _measured(self._queue)
        else:
            batch, self._queue = self._queue, []
            self._bytes = 0
        self._end_by = None
        if not _quiet(batch):  # a lone step-start does not hold what follows
            self._sent = now
        first = self._next_seq
        try:
            commands, touch, ends = self._commands(batch, first, now)
        except Exception as exc:  # a chunk that does not encode (an int past 64 bits)
            # This writer's batch is lost, as one Redis refused; not the flusher, which
            # every other writer needs.
            self._settle(_Job(writer=self, batch=batch, first=first, commands=[], touch=False,
                              at=now, error=exc))  # fmt: skip
            return None
        job = _Job(writer=self, batch=batch, first=first, commands=commands, touch=touch, at=now,
                   retry=retry > 0, ends=ends)  # fmt: skip
        self._out = _entry_bytes(job)
        return job

    def _settle(self, job: _Job) -> None:
        """The outcome of this writer's flush ``job``: the seqs move on, or the batch goes
        back in front of the queue (order kept; the queue's bound applies on append) to
        be retried alone after a backoff (``_doubt``); a batch Redis refused is dropped
        and readers told.
        A tail read's outcome is :meth:`_tail_read`'s."""
        if job.tail:
            last, error = None, job.error
            if error is None:
                try:
                    last = _entries(job.result)
                except (TypeError, ValueError) as exc:  # not a stream's entries
                    error = RuntimeError(
                        f"the tail's read answered {str(job.result)[:100]!r}: {exc}"
                    )
            self._tail_read(last, error)
            return
        self._busy = False
        self._out = 0
        error = job.error
        if error is None or _duplicate(error):
            # A duplicate: a retry of a flush that Redis applied before the connection
            # broke (or a writer the turn had lost wrote there: readers see its entry
            # breaks the chain of writers, and rebuild from the store).
            if job.touch and error is None:
                self._touched = job.at
            self._next_seq = job.first + len(job.batch)
            self._prev = None
            self.lost_under = None
            self.flushes += 1
            self._attempt = 0
            self._retry_at = -math.inf
            self._gave_way = False
        elif isinstance(error, _retryable()):
            self._queue = job.batch + self._queue
            self._bytes += _entry_bytes(job)
            self._doubt = len(job.batch)
            self._failed("relay.flush_failed", error)
        else:  # Redis refused it (OOM, wrong type): not retried
            dropped = _chunks(job.batch)
            if job.applied and not job.retry:
                # Redis took the flush's first entries (it refused one of a split
                # flush's): the gap goes after the seqs they took, not on their ids.
                through, whole = job.written()
                self._next_seq = through + 1
                dropped = _chunks(job.batch[whole:])
            if job.retry:  # Redis may hold it (applied unanswered): the tail says
                why = _refusal(error)
                self._next_seq, self._unsure = None, (job.first + len(job.batch), dropped, why)
                if _too_large(error):
                    self._failed("relay.flush_refused", error, unsure=dropped,
                                 entry_bytes=job.largest(), why=why)  # fmt: skip
                else:
                    self._failed("relay.flush_refused", error, unsure=dropped)
            else:
                self.lost += dropped
                # Why, with the stream: Redis full now may be freed by the time a reader
                # reads the gap (asked then, it would say nothing).
                self._queue.insert(0, {"type": GAP, "why": _refusal(error)})
                if _too_large(error):
                    self._failed("relay.flush_refused", error, dropped=dropped,
                                 entry_bytes=job.largest(), why=_refusal(error))  # fmt: skip
                else:
                    self._failed("relay.flush_refused", error, dropped=dropped)
        self._notify()
        if (self._queue or self._unsure) and not self._closed:
            self.relay.batcher.schedule(self, self._due_at(self.relay.batcher.now()))

    def _failed(self, event: str, error: BaseException, **fields: Any) -> None:
        self.failures += 1
        delay = _backoff(self._attempt, self.relay.retry_base, self.relay.retry_max)
        self._attempt += 1
        self._retry_at = self.relay.batcher.now() + delay
        level = log.error if event == "relay.flush_refused" else log.warning
        level(
            event,
            turn_id=self.turn_id,
            attempt=self._attempt,
            retry_in=round(delay, 3),
            error=_described(error, self.relay.op_timeout),
            **fields,
        )

    async def _read_tail(self) -> None:
        """The stream's tail read through coredis (a relay without the writers' own
        connection), then :meth:`_tail_read`."""
        try:
            with trio.fail_after(self.relay.op_timeout):
                last = await self.relay.client.xrevrange(self.key, "+", "-", count=1)
        except Exception as exc:
            if isinstance(exc, trio.TooSlowError):
                self.relay._gave_up()  # the retry is not to queue behind the lost reply
            self._tail_read(None, exc)
        except BaseException:  # the relay closing
            self._busy = False
            self._notify()
            raise
        else:
            self._tail_read(last, None)

    def _tail_read(self, last: Any, error: BaseException | None, waited: bool = False) -> None:
        """Where to number on from: after the stream's last entry (``last``, the tail's
        read; a continuation's or a takeover's first flush, or the next flush after a
        retry Redis refused: ``_unsure``); then the writer is due at once (after a backoff
        if the read failed: ``error``). ``waited``: ``last`` is the newest entry
        :meth:`_await_pause` read, a continuation's pause or not."""
        unsure, self._unsure = self._unsure, None
        if error is None:
            first, self._prev, lost = _tail(last, takeover=self.takeover or unsure is not None)
            if unsure is not None:  # a refused retry's batch: in the stream or lost
                if first == unsure[0] and self._prev == self.writer_id:
                    self._prev = None  # it is: this writer's entries go on after it
                else:
                    self.lost += unsure[1]
                    lost = True
            elif self.resumed and last and not _paused(last[0]):
                if not waited:  # its pause may be on its way from the suspending worker
                    self.relay.nursery.start_soon(self._await_pause, last)
                    return  # (busy until it is in, or the wait is over)
                lost = True  # a continuation whose stream does not end with its pause
            elif self.pauses and last and not lost and not _paused(last[0]):
                # A takeover of a continuation: its tail is the dead claimer's first
                # entries, or the part before it without its pause. The stream says.
                self.relay.nursery.start_soon(self._count_pauses, first)
                return  # (busy until it is counted)
            self._next_seq = first
            if lost and not last and not self.resumed and not self.pauses and unsure is None:
                # No stream: lost, or the dead writer streamed nothing (see the method)
                lost = False
                self._unproven = True
                if self._first_step is None:  # a step-start queued without _put
                    starts = (i["step"] for i in self._queue if i["type"] == "step-start")
                    self._first_step = next(starts, None)
            if self._unproven and (self._first_step is not None or self._hurry):
                self._found_no_stream()  # known, or closing: no step will say
            if lost:
                # What the turn streamed before is not in the stream: readers are told
                # (they rebuild from the store) instead of shown the turn without it.
                # (a refused retry's says why, as the refusal of a first try does)
                gap = {"type": GAP} if unsure is None else {"type": GAP, "why": unsure[2]}
                self._queue.insert(0, gap)
                event = "relay.takeover_lost_stream" if unsure is None else "relay.refused_lost"
                log.warning(event, turn_id=self.turn_id)
        elif isinstance(error, _retryable()):
            self._unsure = unsure
            self._failed("relay.flush_failed", error)
        else:  # a key of another type: the queue is lost, as a refusal
            self.lost += _chunks(self._queue) + (unsure[1] if unsure is not None else 0)
            self._queue = [{"type": GAP}]
            self._bytes = 0
            self._failed("relay.flush_refused", error)
        self._busy = False
        self._notify()
        if (self._queue or self._unsure) and not self._closed and not self._unproven:
            self.relay.batcher.schedule(self, max(self.relay.batcher.now(), self._retry_at))

    async def _await_pause(self, last: Any) -> None:
        """A continuation whose stream's tail (``last``) is no pause: wait for the pause,
        blocking on the stream's next entries (``XREAD BLOCK``), for at most half of
        ``close_timeout`` (this writer's close, which may come meanwhile, has the other
        half to flush in). The worker that suspended the turn may be alive with its end
        and pause not flushed yet when another worker claims the continuation (its wait
        is committed first): the ``gap`` the tail alone meant made live readers rebuild
        from the store for nothing. No pause by then (that worker died before it streamed
        it), or Redis failing the read: a ``gap``, numbered after the newest entry read.
        Only on this path: a continuation whose tail is its pause reads nothing more."""
        newest = [last[0]]
        relay = self.relay
        try:
            with trio.move_on_after(relay.close_timeout / 2):
                while not _paused(newest[0]):
                    read = functools.partial(
                        relay.client.xread,
                        {self.key: _identifier(newest[0].identifier)},
                        count=PAGE,
                        block=relay.block_ms,
                    )
                    reply = await relay._call("continuation's pause", read, blocking=True)
                    entries = next(iter(reply.values()), ()) if reply else ()
                    if entries:
                        newest[0] = entries[-1]
        except Exception as exc:
            log.warning("relay.pause_wait_failed", turn_id=self.turn_id, error=_described(exc))
        except BaseException:  # the relay closing
            self._busy = False
            self._notify()
            raise
        self._tail_read(newest, None, waited=True)

    async def _count_pauses(self, first: int) -> None:
        """A takeover of the turn's ``pauses``-th continuation whose stream's tail is no
        pause (:meth:`_tail_read`, numbering on from ``first``): the stream must hold
        ``pauses`` pauses. Fewer: a part before this one ended without its pause (the
        worker that suspended the turn died between its wait's commit and its pause,
        and the continuation's claimer, which would have said so, before its first
        flush), so readers are told (``gap``): the continuation spliced after that part
        would show a reader of it the turn without the wait's end, and the approver's
        read (``after_pauses``) would pass over everything waiting for the pause and end
        with nothing. As many: the dead claimer streamed the continuation's first
        entries after its pause; this writer goes on after them (no false gap). Read
        from the stream's start, only on this path; a Redis that does not answer within
        ``close_timeout``, or that refuses the read (a key of another type), is a ``gap``
        too: this task is the relay's, and what it raises would end every writer's."""
        held: int | None = None
        try:
            with trio.move_on_after(self.relay.close_timeout):
                held = await self._pauses_held()  # (each page through relay._call)
        except Exception as exc:
            log.warning("relay.takeover_scan_failed", turn_id=self.turn_id, error=_described(exc))
        except BaseException:  # the relay closing
            self._busy = False
            self._notify()
            raise
        self._next_seq = first
        if held is None or held < self.pauses:
            self._queue.insert(0, {"type": GAP})
            log.warning("relay.takeover_lost_pause", turn_id=self.turn_id, waits=self.pauses,
                        pauses=held)  # fmt: skip
        self._busy = False
        self._notify()
        if self._queue and not self._closed:
            self.relay.batcher.schedule(self, max(trio.current_time(), self._retry_at))

    async def _pauses_held(self) -> int:
        """The pauses in the turn's stream, read from its start page by page, up to
        :attr:`pauses` (no further: that many is all it needs to know). An entry that
        does not decode holds none (its readers are told of it themselves). Its pages
        are a reader's (``RedisRelay._page``: at most ``page_bytes`` a reply, Redis's
        retries): ``XRANGE ... COUNT 256`` had no byte bound, 256 entries of up to
        ``entry_bytes`` each (64 MB at the defaults) held and decoded at once."""
        held, start, biggest, after = 0, "-", 1, 0
        while True:
            page, more = await self.relay._page(
                self.turn_id, self.key, start, "+", biggest=biggest, after=after
            )
            for raw in page:
                biggest = max(biggest, sum(map(len, raw.field_values.values())))
                try:
                    items = _decode(raw).items
                except _Undecodable:
                    continue
                for item in items:
                    if item["type"] == END and item.get("paused") is True:
                        held += 1
                if held >= self.pauses:
                    return held
            if not more or not page:
                return held
            after = len(page)
            start = f"({_identifier(page[-1].identifier)}"

    def _commands(
        self, batch: list[dict[str, Any]], first: int, now: float
    ) -> tuple[list[tuple[Any, ...]], bool, list[int] | None]:
        """The flush's ``XADD`` of ``batch`` from seq ``first`` (one; several when its
        JSON is past the relay's ``entry_bytes``: :func:`_split`), with the TTLs'
        commands when it sets them; whether it does; and, for several entries, the last
        seq each holds. The TTLs are set by the first flush and the last, and refreshed
        at most every ``TTL_REFRESH`` seconds: a flush in between is one ``XADD``, not
        three commands."""
        relay = self.relay
        ended = batch[-1].get("type") == END and batch[-1].get("paused") is not True
        opening = self.flushes == 0  # a continuation's or a takeover's first entry too
        items = utf8_dumps(batch, default=str)
        commands: list[tuple[Any, ...]]
        ends: list[int] | None = None
        if len(items) <= relay.entry_bytes:  # nearly every flush: one entry
            fields: dict[str, str | bytes] = {"first": str(first), "items": items,
                                              "w": self.writer_id}  # fmt: skip
            commands = [("XADD", self.key, f"{first}-1", fields)]
        else:
            commands, ends = [], []
            for identifier, fields, last in _split(batch, first, relay.entry_bytes, items):
                fields["w"] = self.writer_id
                commands.append(("XADD", self.key, identifier, fields))
                ends.append(last)
            fields = commands[0][3]
        if self._prev is not None:
            fields["prev"] = self._prev
        touch = ended or opening or now - self._touched > TTL_REFRESH
        if touch:
            commands.append(("EXPIRE", self.key, relay.end_ttl if ended else relay.live_ttl))
            active = relay.active_key(self.session_id)
            if opening:
                commands.append(("SET", active, self.turn_id, relay.live_ttl))
            elif ended:
                commands.append(("EXPIRE", active, relay.end_ttl))
        return commands, touch, ends


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
    tail: bool = False
    """The job reads the stream's tail (``XREVRANGE``), not a flush (nothing carried)."""
    retry: bool = False
    """The batch is a failed flush's again: Redis may have applied it unanswered."""
    ends: list[int] | None = None
    """A flush of several entries (``None``: one, the usual): the last seq of each."""
    applied: int = 0
    """The flush's first entries Redis took (or held: a duplicate) before it refused one."""

    @property
    def adds(self) -> int:
        """The flush's ``XADD`` s (its first commands)."""
        return 1 if self.ends is None else len(self.ends)

    def written(self) -> tuple[int, int]:
        """After a refusal past the first entry: the last seq the entries Redis took
        hold (a split chunk's part counts), and how many of the batch's items they
        hold whole."""
        assert self.ends is not None and self.applied
        through = self.ends[self.applied - 1]
        fields = self.commands[self.applied - 1][3]
        whole = through - self.first + 1
        if "part" in fields and not self.commands[self.applied - 1][2].endswith("-" + fields["of"]):
            whole -= 1  # the chunk's last part is not in
        return through, whole

    def size(self) -> int:
        """The bytes of the entries' chunks (items or parts); 0 for a tail read."""
        if self.tail or not self.commands:
            return 0
        if self.ends is None:
            return len(self.commands[0][3]["items"])
        return sum(map(_chunk_bytes, self.commands[: self.adds]))

    def largest(self) -> int:
        """The bytes of the largest entry's chunks (an ``XADD``'s largest argument: what
        Redis's ``proto-max-bulk-len`` bounds); 0 for a tail read."""
        if self.tail or not self.commands:
            return 0
        return max(map(_chunk_bytes, self.commands[: self.adds]))


def _chunk_bytes(command: tuple[Any, ...]) -> int:
    """The bytes of the chunks an ``XADD`` of a flush carries (its ``items`` or ``part``)."""
    fields = command[3]
    return len(fields["items"] if "items" in fields else fields["part"])


@attrs.frozen
class _RawEntry:
    """A stream entry as the RESP connection reads it (coredis's ``StreamEntry``'s
    fields: what :func:`~actors.relays.redis_entries._decode` reads)."""

    identifier: bytes
    field_values: dict[bytes, bytes]


def _entries(reply: Any) -> list[_RawEntry]:
    """An ``XREVRANGE`` reply on the RESP connection, or a reader's page
    (``[[id, [field, value, ...]]]``)."""
    return [
        _RawEntry(identifier=identifier, field_values=dict(zip(flat[::2], flat[1::2], strict=True)))
        for identifier, flat in reply
    ]
