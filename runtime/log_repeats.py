"""A warning that repeats as long as a condition lasts, logged as a line and a count.

A worker whose PostgreSQL is down fails each claim and each ``LISTEN`` it tries, once a
poll: it logged ``worker.claim_failed`` and ``turns.listen_failed`` for every one of them,
hundreds of lines in a few minutes of outage (five a second at ``--poll 0.2``), which
buried every other line and filled a log collector's quota. :class:`RepeatedWarning`
logs the first at once (the operator learns of the outage as soon as it starts), then at
most one line each :data:`REPEAT_INTERVAL` seconds with ``repeated``, the count of those
held back since the last line, and the last one's fields; when the condition ends
(:meth:`RepeatedWarning.clear`) the ones still held are logged in one such line, so no
failure goes uncounted, and the next failure is logged at once again.
"""

from __future__ import annotations

from typing import Any

import trio

from runtime.logging import get_logger

REPEAT_INTERVAL = 30.0
"""Seconds between two lines of one repeated warning (its first is logged at once)."""


class RepeatedWarning:
    """One warning (``event`` on the logger named ``logger``, looked up at each line: a
    command configures logging after its objects may be made) that may repeat: see the
    module. Mutable, used within one Trio run (its clock decides the interval)."""

    __slots__ = ("_fields", "_held", "_logged_at", "event", "interval", "logger")

    def __init__(self, logger: str, event: str, interval: float = REPEAT_INTERVAL) -> None:
        self.logger = logger
        self.event = event
        self.interval = interval
        self._logged_at: float | None = None
        """When the last line was logged; ``None``: the condition is not going on."""
        self._held = 0
        """Warnings since the last line, not logged."""
        self._fields: dict[str, Any] = {}
        """The last held warning's fields (its error), for the line that counts it."""

    def warning(self, **fields: Any) -> None:
        """The condition happened (again): logged at once the first time, and then when
        :attr:`interval` has passed since the last line, with the count held back;
        counted otherwise."""
        now = trio.current_time()
        if self._logged_at is not None and now - self._logged_at < self.interval:
            self._held += 1
            self._fields = fields
            return
        if self._logged_at is None:
            get_logger(self.logger).warning(self.event, **fields)
        else:
            get_logger(self.logger).warning(self.event, **fields, repeated=self._held + 1)
        self._logged_at = now
        self._held = 0
        self._fields = {}

    def clear(self) -> None:
        """The condition is over (a claim answered, a connection opened): the warnings
        still held are logged in one line with their count, and the next one is logged
        at once."""
        if self._held:
            get_logger(self.logger).warning(self.event, **self._fields, repeated=self._held)
        self._logged_at = None
        self._held = 0
        self._fields = {}


__all__ = ["REPEAT_INTERVAL", "RepeatedWarning"]
