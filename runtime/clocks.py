"""One clock for times that several processes compare: an authority's, not each
machine's own.

Two kinds of deadline are written by one process and read by another: a waiting turn's
(``Agent(approval_timeout=...)``), written by the worker whose turn suspends and
compared by whichever worker polls for expired waits; and a shared rate limit's grants
(:mod:`actors.relays.limits`), counted in one sliding minute by every worker. Were each
process to read its own wall clock, a worker an hour behind (a container without NTP, a
VM resumed from suspend) would store wait deadlines already past and spend a rate
limit's minute a second time, and one an hour ahead would expire every wait at its first
poll and hold the limit's minute for an hour. One clock decides instead: the store's
(PostgreSQL's ``clock_timestamp()``, :meth:`runtime.turn_queue.TurnQueue.now`) for waits,
Redis's ``TIME`` for rate limits.

Reading the authority at every use would cost a round trip each time, so
:class:`AnchoredClock` reads it once (:meth:`~AnchoredClock.sync`) and carries it forward
on this process's steady clock (:func:`steady`), which no step of the wall clock moves
and which counts a machine's suspend; its owner syncs again every :data:`RESYNC`
seconds, so the two clocks' drift stays negligible.

In one process (the embedded host) the same rule takes the other form: durations on one
monotonic clock. :class:`SteadyWallClock` reads the wall clock once and carries it on
Trio's clock, plus the time the machine spent suspended (which Trio's clock does not
count).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Final

import trio

RESYNC: Final = 60.0
"""Seconds between two readings of the authority's clock."""
MAX_ROUND_TRIP: Final = 1.0
"""A reading whose round trip took longer is not trusted over the one held (its answer
could be from any moment of the trip), unless none is held yet."""


if hasattr(time, "CLOCK_BOOTTIME"):  # Linux

    def steady() -> float:
        """Seconds on a clock no wall-clock step moves that counts the time the machine
        was suspended (``CLOCK_BOOTTIME``): carried on ``time.monotonic``, which stops
        while the machine sleeps, a worker resumed after an hour would set deadlines an
        hour early until its next reading."""
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    def suspended() -> float:
        """Seconds this machine has spent suspended since it booted: what
        ``CLOCK_BOOTTIME`` counts and ``CLOCK_MONOTONIC`` (``time.monotonic``, and so
        Trio's clock) does not."""
        return time.clock_gettime(time.CLOCK_BOOTTIME) - time.monotonic()

else:  # pragma: no cover - elsewhere the monotonic clock is the steady one there is

    def steady() -> float:
        """Seconds on a clock no wall-clock step moves (``time.monotonic``)."""
        return time.monotonic()

    def suspended() -> float:
        """No clock here says how long the machine was suspended: none counted."""
        return 0.0


class AnchoredClock:
    """``clock()`` (or ``clock.now()``): the authority's time in seconds since the epoch,
    as of the last :meth:`sync` plus the :func:`steady` time since. Until the first sync it
    is this process's wall clock (an authority that never answered: nothing better is
    known). ``read`` is the authority: one round trip, its time."""

    def __init__(self, read: Callable[[], Awaitable[float]]) -> None:
        self.read = read
        self._base = time.time()
        self._at = steady()
        self._trip: float | None = None
        """The round trip of the reading held (``None``: none yet)."""
        self.synced_at: float | None = None
        """``steady()`` of the last reading taken."""

    def __call__(self) -> float:
        return self._base + (steady() - self._at)

    def now(self) -> float:
        """The same as calling the clock (:class:`runtime.ratelimit.Clock`'s shape)."""
        return self()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` (Trio's clock: a duration needs no authority)."""
        await trio.sleep(seconds)

    async def sync(self) -> None:
        """Read the authority's clock (a failure propagates: the old reading stays)."""
        sent = steady()
        reading = await self.read()
        back = steady()
        trip = back - sent
        self.synced_at = back
        if self._trip is not None and trip > MAX_ROUND_TRIP and trip > self._trip:
            return
        self._base, self._at, self._trip = reading, (sent + back) / 2, trip

    def due(self) -> bool:
        """Whether :data:`RESYNC` seconds passed since the last reading (or none was)."""
        return self.synced_at is None or steady() - self.synced_at >= RESYNC


class SteadyWallClock:
    """``clock()``: this machine's wall clock as read once (at the first call), carried
    on Trio's clock plus the time the machine has been suspended since (:func:`suspended`):
    the embedded host's wait deadlines. A deadline is stored as wall-clock time so that it
    holds across a restart (a new host reads the wall clock again, and a wait whose
    deadline passed while it was down is past); while the host runs, a step of the wall
    clock (NTP correcting it, a VM restored) neither stretches a person's wait by the step
    nor cuts it short. Trio's clock (``CLOCK_MONOTONIC``) stops while the machine sleeps:
    carried on it alone, a laptop suspended an hour past a 60 s deadline woke to a wait
    still open, and a decision taken, for the rest of the minute. The first call must be
    made inside ``trio.run``."""

    def __init__(self) -> None:
        self._anchor: tuple[float, float, float] | None = None
        self._slept = 0.0
        """The most suspended time seen since the anchor (two clocks read one after the
        other differ by a microsecond's noise: the clock never goes back by it)."""

    def __call__(self) -> float:
        if self._anchor is None:
            self._anchor = (time.time(), trio.current_time(), suspended())
        wall, at, asleep = self._anchor
        self._slept = max(self._slept, suspended() - asleep)
        return wall + (trio.current_time() - at) + self._slept


__all__ = ["MAX_ROUND_TRIP", "RESYNC", "AnchoredClock", "SteadyWallClock", "steady", "suspended"]
