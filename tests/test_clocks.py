"""An authority's clock (runtime/clocks.py): the queue's time, or Redis's, carried on the
monotonic clock, so a step of this machine's wall clock does not move it."""

from __future__ import annotations

import time

import pytest

from runtime import clocks
from runtime.clocks import AnchoredClock


class Source:
    """A queue whose clock reads ``reading``; each read advances the monotonic clock by
    ``trip`` seconds (its round trip)."""

    def __init__(self, now: list[float], reading: float, trip: float = 0.0) -> None:
        self.now_ = now
        self.reading = reading
        self.trip = trip
        self.reads = 0

    async def now(self) -> float:
        self.reads += 1
        self.now_[0] += self.trip
        return self.reading


@pytest.fixture
def monotonic(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(clocks, "steady", lambda: now[0])
    return now


async def test_the_clock_reads_the_queues_time_not_the_machines(monotonic, monkeypatch):
    monkeypatch.setattr(time, "time", lambda: 5_000.0)  # the machine: an hour off
    clock = AnchoredClock(Source(monotonic, reading=8_600.0).now)
    await clock.sync()
    monotonic[0] += 30
    assert clock() == 8_630.0


async def test_a_step_of_the_wall_clock_does_not_move_the_synced_clock(monotonic, monkeypatch):
    wall = [8_600.0]
    monkeypatch.setattr(time, "time", lambda: wall[0])
    clock = AnchoredClock(Source(monotonic, reading=8_600.0).now)
    await clock.sync()
    wall[0] -= 3600  # the machine's clock stepped back an hour
    monotonic[0] += 10
    assert clock() == 8_610.0


async def test_a_reading_with_a_slow_round_trip_does_not_replace_a_quick_one(monotonic):
    source = Source(monotonic, reading=8_600.0, trip=0.01)
    clock = AnchoredClock(source.now)
    await clock.sync()
    source.reading, source.trip = 9_999.0, 30.0  # answered at some moment of 30 s
    await clock.sync()
    assert source.reads == 2 and clock() == pytest.approx(8_600.0 + 0.005 + 30.0)


async def test_the_clock_is_due_for_a_reading_until_synced_and_again_a_minute_on(monotonic):
    clock = AnchoredClock(Source(monotonic, reading=1.0).now)
    assert clock.due()
    await clock.sync()
    assert not clock.due()
    monotonic[0] += 60
    assert clock.due()


def test_the_steady_clock_counts_a_suspend_where_the_system_has_one():
    if hasattr(time, "CLOCK_BOOTTIME"):  # Linux: time.monotonic stops while suspended
        assert abs(clocks.steady() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1
