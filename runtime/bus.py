"""The event bus: routes events by type and session straight into subscribers' inboxes.

There is no bus task and no extra hop: :meth:`Bus.publish` looks up the inboxes
subscribed to the event's class (and to its ``session_id``, or to all sessions) and
puts the event into each, honouring each inbox's overflow policy. When nobody listens
to an event type, publishing it costs two dictionary look-ups, so the hot path pays
nothing for observers that are not there (:meth:`Bus.wants` lets a producer skip even
building an event).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import trio

from runtime.inbox import Inbox, OverflowPolicy


class Subscription:
    """One subscriber's registration; its :attr:`inbox` receives the matching events."""

    __slots__ = ("bus", "inbox", "kinds", "session_id")

    def __init__(
        self,
        bus: Bus,
        inbox: Inbox[Any],
        kinds: frozenset[type] | None,
        session_id: str | None,
    ) -> None:
        self.bus = bus
        self.inbox = inbox
        self.kinds = kinds
        self.session_id = session_id

    def matches(self, cls: type) -> bool:
        return self.kinds is None or any(issubclass(cls, k) for k in self.kinds)

    def close(self) -> None:
        """Stop delivery and end the inbox's iteration once drained."""
        self.bus.unsubscribe(self)
        self.inbox.close()

    def __aiter__(self) -> Inbox[Any]:
        return self.inbox.__aiter__()


class Bus:
    """Publish/subscribe by event class and session id."""

    def __init__(self) -> None:
        self._subs: dict[Subscription, None] = {}
        """The subscriptions, in the order they were made (a dict: closing one of ten
        thousand is one pop, where a list's ``remove`` scanned them all)."""
        self._scoped_count = 0
        """How many of them are to one session's events."""
        self._any = False
        """``bool(self._subs)``, kept up to date by :meth:`subscribe` / :meth:`unsubscribe`."""
        self._scoped = False
        """Whether a subscription is to one session's events: only then does a route
        depend on the session. While none is (an embedded host's observers: the log tap,
        metrics), every session's events go by class alone, with no table per session:
        a host that opens a session per turn built one per turn, and a tuple per event
        class in it (issue 24 goal 1)."""
        # session_id (or None) -> event class -> subscriptions; rebuilt lazily on change.
        # By session first, so that forgetting a closed session's routes is one pop, not
        # a scan of every session's (ten thousand sessions closing one after another).
        self._routes: dict[str | None, dict[type, tuple[Subscription, ...]]] = {}
        # event class -> the subscriptions to it, of any session: what a new session's
        # routes are filtered from (matching a class against every subscription's kinds
        # is the expensive part, and the same for every session).
        self._by_class: dict[type, tuple[Subscription, ...]] = {}
        self.trace_contexts: dict[str, dict[str, str]] = {}
        """The trace context an observer gave each running turn (turn id -> ``trace_id``
        and ``span_id``, hex): the tracing plug-in sets it when the turn starts and drops
        it when the turn ends; a turn that suspends stores it with the wait
        (:data:`runtime.approval.SUSPENDED_TRACE_META`), so that its continuation, in
        any process, links to the suspended span."""

    def subscribe(
        self,
        kinds: Iterable[type] | None = None,
        *,
        session_id: str | None = None,
        policy: OverflowPolicy = "drop-oldest",
        capacity: int = 1024,
        name: str = "subscriber",
        inbox: Inbox[Any] | None = None,
    ) -> Subscription:
        """Subscribe to events of the given classes (subclasses included; ``None`` for
        all), optionally of one session only. Events go into ``inbox`` (a new one with
        ``policy`` and ``capacity`` when not given)."""
        box = inbox if inbox is not None else Inbox(capacity, policy, name=name)
        sub = Subscription(self, box, None if kinds is None else frozenset(kinds), session_id)
        self._subs[sub] = None
        self._any = True
        if session_id is not None:
            self._scoped_count += 1
            self._scoped = True
        self._routes.clear()
        self._by_class.clear()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        if self._subs.pop(sub, False) is False:
            return
        self._any = bool(self._subs)
        if sub.session_id is not None:
            self._scoped_count -= 1
            self._scoped = self._scoped_count > 0
        self._routes.clear()
        self._by_class.clear()

    def _route(self, session_id: str | None, cls: type) -> tuple[Subscription, ...]:
        if not self._scoped:  # the same for every session: by class alone
            subs = self._by_class.get(cls)
            if subs is None:
                subs = self._by_class[cls] = tuple(s for s in self._subs if s.matches(cls))
            return subs
        routes = self._routes.get(session_id)
        if routes is None:
            routes = self._routes[session_id] = {}
        subs = routes.get(cls)
        if subs is None:
            of_class = self._by_class.get(cls)
            if of_class is None:
                of_class = self._by_class[cls] = tuple(s for s in self._subs if s.matches(cls))
            subs = tuple(s for s in of_class if s.session_id is None or s.session_id == session_id)
            if len(subs) == len(of_class):  # the same for every session: one tuple, shared
                subs = of_class  # (ten thousand sessions made a dozen tuples each otherwise)
            routes[cls] = subs
        return subs

    @property
    def subscription_count(self) -> int:
        """How many subscriptions are registered."""
        return len(self._subs)

    def has_subscribers(self) -> bool:
        """Whether anyone subscribed at all: one attribute read, for the hot path to skip
        even the per-event :meth:`wants` look-ups while nobody listens."""
        return self._any

    def wants(self, cls: type, session_id: str | None = None) -> bool:
        """Whether anyone would receive an event of ``cls`` for ``session_id``."""
        return bool(self._route(session_id, cls))

    async def publish(self, event: Any) -> None:
        """Deliver ``event``; waits only for full ``block`` inboxes."""
        for sub in self._route(getattr(event, "session_id", None), type(event)):
            try:
                await sub.inbox.put(event)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.unsubscribe(sub)

    def publish_nowait(self, event: Any) -> None:
        """Deliver without waiting; a full ``block`` inbox raises :class:`trio.WouldBlock`."""
        for sub in self._route(getattr(event, "session_id", None), type(event)):
            try:
                sub.inbox.put_nowait(event)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.unsubscribe(sub)

    def try_publish(self, event: Any) -> bool:
        """Deliver ``event`` at once if no subscriber would make :meth:`publish` wait (no
        full ``block`` inbox): then every subscriber gets it, as :meth:`publish` gives
        it, and ``True``; else nobody does, and ``False`` (the caller publishes, waiting).
        A caller that bounds its wait enters the bound only then (issue 24 goal 1)."""
        subs = self._route(getattr(event, "session_id", None), type(event))
        for sub in subs:
            if sub.inbox.would_wait():
                return False
        if len(subs) > 1 and not _room_for_each(subs):
            return False
        for sub in subs:
            try:
                sub.inbox.put_nowait(event)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.unsubscribe(sub)
        return True

    def forget_session(self, session_id: str) -> None:
        """Drop cached routes of a closed session (keeps the cache from growing)."""
        self._routes.pop(session_id, None)


def _room_for_each(subs: tuple[Subscription, ...]) -> bool:
    """Whether each ``block`` inbox behind ``subs`` has room for the event as many times
    as it is subscribed (an inbox may be, :meth:`Bus.subscribe` takes any): ``would_wait``
    looks at one put, and the second into an inbox with room for one raised
    ``WouldBlock`` after the first was delivered."""
    counts: dict[int, int] = {}
    for sub in subs:
        box = sub.inbox
        if box.policy != "block":
            continue
        n = counts[id(box)] = counts.get(id(box), 0) + 1
        if n > 1 and len(box) + n > box.capacity and not box.closed:
            return False
    return True
