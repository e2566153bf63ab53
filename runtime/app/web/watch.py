"""One front end's shared look at the turns its viewers wait for.

A viewer of a queued turn (``POST /api/chat`` or a resume of a session whose turn waits
in the queue) has nothing to stream until a worker claims the turn. Each viewer asking
PostgreSQL for its turn's row every half second made a front end's load grow with its
viewers (300 viewers of queued turns: ~410 commits a second). Here the viewers of one
front end share one look instead: :meth:`TurnWatch.changed` waits until the turn's status
is no longer the one its caller saw, and while anyone waits one task at a time (a
waiter, not a background task: nothing runs when nobody waits) reads the statuses of
*every* watched turn in one query (:meth:`runtime.turn_queue.TurnQueue.statuses`),
then wakes them all. The look comes ``first`` seconds after a turn is first watched, then
backs off to every ``most`` seconds while nothing changes: the queries a front end sends
depend on time, not on how many viewers it has.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any, Final

import trio

from runtime.errors import RelayTurnGone, StoreError
from runtime.logging import get_logger
from runtime.redact import redact
from runtime.turn_queue import TurnQueue

POLL_FIRST: Final = 0.02
"""Seconds from a turn's first watcher to the look that answers it."""
POLL_MAX: Final = 0.5
"""Seconds between looks at most, while no watched turn changes."""

_UNSEEN: Final = object()


class TurnWatch:
    """The statuses of the turns a front end's viewers wait for, read for all at once
    from ``queue`` (a :class:`~runtime.turn_queue.TurnQueue`)."""

    def __init__(
        self, queue: TurnQueue, *, first: float = POLL_FIRST, most: float = POLL_MAX
    ) -> None:
        self.queue = queue
        self.first = first
        self.most = most
        self.looks = 0
        """How many queries the watch sent (one per look, however many turns it read)."""
        self._waiters: dict[str, int] = {}
        self._status: dict[str, Any] = {}
        self._looking = False
        self._looked = trio.Event()
        self._delay = first
        self._next = -math.inf
        """When the next look is due (Trio's clock): kept when the waiter that was to look
        leaves, so waiters coming and going cannot put the look off."""
        self._nap: trio.CancelScope | None = None

    async def changed(self, turn_id: str, seen: Any, timeout: float = math.inf) -> str | None:  # noqa: ASYNC109
        """The status of turn ``turn_id`` once it is not ``seen`` (``None``: there is no
        such turn); ``seen`` itself if ``timeout`` seconds pass first. A caller that has
        not seen a status yet passes anything that is not one (``object()``): the look
        that answers it then comes within ``first`` seconds; a known status waits for the
        watch's next regular look."""
        self._waiters[turn_id] = self._waiters.get(turn_id, 0) + 1
        if turn_id not in self._status:
            if isinstance(seen, str):
                self._status[turn_id] = seen
            else:
                self._status[turn_id] = _UNSEEN
                self._delay = self.first
                self._next = min(self._next, trio.current_time() + self.first)
                if self._nap is not None:
                    self._nap.deadline = self._next
        try:
            with trio.move_on_after(timeout):
                while self._status[turn_id] is _UNSEEN or self._status[turn_id] == seen:
                    if self._looking:
                        await self._looked.wait()
                    else:
                        await self._look()
            current = self._status[turn_id]
        finally:
            self._waiters[turn_id] -= 1
            if not self._waiters[turn_id]:
                del self._waiters[turn_id]
                del self._status[turn_id]
        return seen if current is _UNSEEN else current

    async def _look(self) -> None:
        """Wait until the next look is due, then read every watched turn's status in one
        query and wake every waiter. Run by one waiter at a time; if it leaves (its
        client went away, its timeout passed) the others wake and one of them looks
        instead, when the same look is due."""
        self._looking = True
        looked = self._looked
        try:
            with trio.move_on_at(self._next) as self._nap:
                await trio.sleep_forever()
            self._nap = None
            turn_ids = list(self._waiters)
            found = await self.queue.statuses(turn_ids)
            self.looks += 1
            changed = False
            for turn_id in turn_ids:
                now = found.get(turn_id)
                old = self._status.get(turn_id, _UNSEEN)
                if old is not _UNSEEN and old != now:
                    changed = True
                if turn_id in self._waiters:
                    self._status[turn_id] = now
            self._delay = self.first if changed else min(self._delay * 2, self.most)
            self._next = trio.current_time() + self._delay
        finally:
            self._nap = None
            self._looking = False
            self._looked = trio.Event()
            looked.set()


IDLE_LOOK = 2.0
"""Seconds a turn's relay stream may show nothing before its reader asks the queue
whether the turn ended (a stream that moves costs no query)."""


class EndedTurnLook:
    """The ``on_quiet`` of a queued turn's relay read (:meth:`runtime.relay.Relay.read`):
    once the stream has shown nothing for :data:`IDLE_LOOK` seconds, ask ``queue``
    whether turn ``turn_id`` ended, and again each :data:`IDLE_LOOK` seconds after; the
    second look in a row that finds it ended (or gone) while the stream still shows
    nothing gives the stream up (:class:`~runtime.errors.RelayTurnGone`); a look the
    store fails counts as none (logged ``frontend.turn_look_failed``). A worker
    killed between a turn's last commit and its stream's end leaves a stream nobody
    ends: its readers waited for it until the relay's stream expired, a day later."""

    def __init__(self, queue: TurnQueue, turn_id: str) -> None:
        self.queue = queue
        self.turn_id = turn_id
        self.looks = 0
        """How many times it asked the queue."""
        self._quiet = 0.0
        self._due = -math.inf
        self._ended = 0

    async def __call__(self, quiet: float) -> None:
        if quiet < self._quiet or self._due == -math.inf:  # the stream moved since
            self._due, self._ended = IDLE_LOOK, 0
        self._quiet = quiet
        if quiet < self._due:
            return
        self._due = quiet + IDLE_LOOK
        self.looks += 1
        try:
            turn = await self.queue.get_status(self.turn_id)
        except StoreError as exc:
            # A store that cannot say (PostgreSQL restarting) does not say the turn
            # ended: the read goes on, on a relay and a worker that may well be fine.
            get_logger("axon.web").warning(
                "frontend.turn_look_failed", turn_id=self.turn_id, error=redact(str(exc))
            )
            self._ended = 0
            return
        self._ended = self._ended + 1 if turn is None or turn.finished else 0
        if self._ended >= 2:
            raise RelayTurnGone(
                f"turn {self.turn_id!r} ended and its relay stream did not "
                "(its worker stopped before it wrote the end)"
            )


def follow_turn(
    relay: Any,
    queue: TurnQueue,
    turn_id: str,
    *,
    after_seq: int | None = None,
    after_pauses: int = 0,
    unseen: bool = False,
) -> AsyncIterator[Any]:
    """A queued turn's chunks from ``relay`` as every front end's adapter reads them
    (the AI SDK endpoint, AG-UI, A2A, the OpenAI-compatible one, MCP): the relay's
    read, given up once the turn ended and its stream shows nothing
    (:class:`EndedTurnLook`). ``unseen``: the client was shown nothing of the turn
    (it is answered from the store if the relay fails): a Redis refusing connections
    fails the read at once, not after the relay's retry window (``Relay.read``)."""
    options: dict[str, Any] = {"after_pauses": after_pauses} if after_pauses else {}
    if unseen:
        options["unseen"] = True
    look = EndedTurnLook(queue, turn_id)
    return relay.read(turn_id, after_seq=after_seq, on_quiet=look, **options)  # type: ignore[no-any-return]


__all__ = ["IDLE_LOOK", "POLL_FIRST", "POLL_MAX", "EndedTurnLook", "TurnWatch", "follow_turn"]
