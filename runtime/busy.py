"""What a session does with a new user message while one of its turns runs.

A session runs one turn at a time. When a user message arrives while a turn runs, the
session's *busy strategy* decides (docs/busy.md):

``reject`` (the default)
    refuse it: :class:`~runtime.errors.SessionBusy` (HTTP 409);
``enqueue``
    run its turn after the running one (and after those enqueued before it), in order,
    each with its own turn id and result;
``interrupt``
    cancel the running turn (saved, marked interrupted, as any cancel saves it) and run
    the new one;
``steer``
    hand the message to the running turn, which inserts it at its next step boundary:
    the model sees it before its next call. If the turn ends without another step, the
    message starts a new turn instead.

A turn that *waits* for input (an approval, a client tool) is not running: a new user
message then starts a new turn under every strategy, which denies the waiting calls
with reason ``superseded``.

Declared on the agent (``Agent(on_busy=...)``), or per session, overriding the agent's
(``host.open_session(agent, on_busy=...)``, ``serve --on-busy``).

A stop that names a message (``POST /api/chat/{id}/stop`` with ``{"messageId"}``) may
reach a host before the POST of the message it names: :class:`HeldStops` keeps it for
that message, which it stops when it comes (docs/relay.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal, TypeAlias

import trio

from runtime.errors import ConfigurationError

OnBusy: TypeAlias = Literal["reject", "enqueue", "interrupt", "steer"]
REJECT: OnBusy = "reject"
ENQUEUE: OnBusy = "enqueue"
INTERRUPT: OnBusy = "interrupt"
STEER: OnBusy = "steer"
STRATEGIES: tuple[OnBusy, ...] = (REJECT, ENQUEUE, INTERRUPT, STEER)

INTERRUPTED_BY_NEW = "interrupted by a new message"
"""The abort reason of a turn an ``interrupt`` strategy cancelled."""


def check_on_busy(value: Any) -> OnBusy:
    """``value`` if it names a strategy, else :class:`~runtime.errors.ConfigurationError`."""
    if value not in STRATEGIES:
        raise ConfigurationError(f"on_busy must be one of {', '.join(STRATEGIES)}, not {value!r}")
    return value  # type: ignore[no-any-return]


HELD_STOPS_KEPT = 1024
"""Named stops a host keeps at most for messages not there yet (the oldest go first):
every host of a relay hears every such stop, most of them for turns that run elsewhere
or never."""
HELD_STOP_FOR = 60.0
"""Seconds a named stop is kept for a message not there yet: the life of its record in
Redis (``CANCEL_TTL_MS``); a message whose POST takes longer to arrive is not stopped."""

HELD_STOP_ID_MAX = 256
"""Characters of a message or turn id past which a stop naming it is not kept (the AI
SDK's ids are a few dozen): the held stops' size is bounded by their count and this (a
stop body may be 48 MiB: 1024 of 10 MB ids held a host 10 GB). The worker deployment's
table keeps the same bound."""


class HeldStops:
    """Named stops that found nothing so named yet: the message or turn they name may be
    on its way still (its POST and the stop race on two connections). Kept by session,
    then by the (message id, turn id) named: the reason and when it came (``clock``),
    each for ``held_for`` seconds, at most ``kept`` of them (the oldest dropped), a stop
    sent twice kept once; :meth:`take` uses one up."""

    __slots__ = ("_by_session", "_order", "clock", "held_for", "kept")

    def __init__(
        self,
        *,
        kept: int = HELD_STOPS_KEPT,
        held_for: float = HELD_STOP_FOR,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.kept = kept
        self.held_for = held_for
        self.clock = clock
        self._by_session: dict[str, dict[tuple[str | None, str | None], tuple[str, float]]] = {}
        self._order: OrderedDict[tuple[str, str | None, str | None], float] = OrderedDict()
        """The same stops, the oldest first: which go past ``kept``, or once too old."""

    def __len__(self) -> int:
        return len(self._order)

    def hold(
        self, session_id: str, message_id: str | None, turn_id: str | None, reason: str
    ) -> None:
        """Keep a stop of ``session_id`` naming user message ``message_id`` or turn
        ``turn_id`` (or both: then it names what has both); one naming neither is not
        kept, nor one naming an id longer than :data:`HELD_STOP_ID_MAX` (it names
        nothing a client sends)."""
        if message_id is None and turn_id is None:
            return
        if len(message_id or "") > HELD_STOP_ID_MAX or len(turn_id or "") > HELD_STOP_ID_MAX:
            return
        order, now = self._order, self.clock()
        names = (message_id, turn_id)
        key = (session_id, message_id, turn_id)
        order.pop(key, None)
        order[key] = now
        stops = self._by_session.setdefault(session_id, {})
        stops.pop(names, None)  # (sent again: it goes last, as in the order)
        stops[names] = (reason, now)
        since = now - self.held_for
        while order and (len(order) > self.kept or next(iter(order.values())) < since):
            (oldest, *dropped), _ = order.popitem(last=False)
            self._drop(oldest, (dropped[0], dropped[1]))

    def _drop(self, session_id: str, names: tuple[str | None, str | None]) -> None:
        self._order.pop((session_id, *names), None)
        stops = self._by_session.get(session_id)
        if stops is not None:
            stops.pop(names, None)
            if not stops:
                del self._by_session[session_id]

    def take(self, session_id: str, message_id: str | None, turn_id: str | None) -> str | None:
        """The reason of a kept stop of ``session_id`` that names user message
        ``message_id`` or turn ``turn_id`` (what it names of the two, it names alike),
        dropped as used; or ``None``. Stops of the session too old are dropped."""
        stops = self._by_session.get(session_id)
        if not stops:
            return None
        since = self.clock() - self.held_for
        for names, (reason, at) in list(stops.items()):
            named_message, named_turn = names
            if at < since:
                self._drop(session_id, names)
            elif named_message in (None, message_id) and named_turn in (None, turn_id):
                self._drop(session_id, names)
                return reason
        return None


__all__ = [
    "ENQUEUE",
    "HELD_STOPS_KEPT",
    "HELD_STOP_FOR",
    "HELD_STOP_ID_MAX",
    "INTERRUPT",
    "INTERRUPTED_BY_NEW",
    "REJECT",
    "STEER",
    "STRATEGIES",
    "HeldStops",
    "OnBusy",
    "check_on_busy",
]
