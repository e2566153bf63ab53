"""The clock a worker's approval deadlines run on: the queue's, not the worker's own.

A wait's deadline (``Agent(approval_timeout=...)``) is written by the worker whose turn
suspends and compared, later, by whichever worker polls for expired waits
(:meth:`runtime.turn_queue.TurnQueue.take_expired`). Were each to read its own wall
clock, a worker an hour behind (a container without NTP, a VM resumed from suspend)
would store deadlines already past, and one an hour ahead would expire every wait the
moment it polled: a person's ten minutes cut to nothing. One clock decides instead: the
database's (:meth:`~runtime.turn_queue.TurnQueue.now`).

Reading PostgreSQL's clock at every use would cost a round trip per deadline, so
:class:`QueueClock` reads it once (:meth:`~QueueClock.sync`) and carries it forward on
this process's monotonic clock, which no wall-clock step moves; the worker syncs again
every :data:`RESYNC` seconds, so the two clocks' drift stays negligible.
"""

from __future__ import annotations

import time
from typing import Final, Protocol

RESYNC: Final = 60.0
"""Seconds between two readings of the queue's clock."""
MAX_ROUND_TRIP: Final = 1.0
"""A reading whose round trip took longer is not trusted over the one held (its answer
could be from any moment of the trip), unless none is held yet."""


class ClockSource(Protocol):
    """Where the authoritative time comes from (the turn queue)."""

    async def now(self) -> float: ...


class QueueClock:
    """``clock()``: the queue's time in seconds since the epoch, as of the last
    :meth:`sync` plus the monotonic time since. Until the first sync it is this
    process's wall clock (a queue that never answered: nothing better is known)."""

    def __init__(self, source: ClockSource) -> None:
        self.source = source
        self._base = time.time()
        self._at = time.monotonic()
        self._trip: float | None = None
        """The round trip of the reading held (``None``: none yet)."""
        self.synced_at: float | None = None
        """``time.monotonic()`` of the last reading taken."""

    def __call__(self) -> float:
        return self._base + (time.monotonic() - self._at)

    async def sync(self) -> None:
        """Read the queue's clock (a store failure propagates: the old reading stays)."""
        sent = time.monotonic()
        reading = await self.source.now()
        back = time.monotonic()
        trip = back - sent
        self.synced_at = back
        if self._trip is not None and trip > MAX_ROUND_TRIP and trip > self._trip:
            return
        self._base, self._at, self._trip = reading, (sent + back) / 2, trip

    def due(self) -> bool:
        """Whether :data:`RESYNC` seconds passed since the last reading (or none was)."""
        return self.synced_at is None or time.monotonic() - self.synced_at >= RESYNC
