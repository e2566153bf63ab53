"""``RelayPublisher``: an embedded host's turns, published live to a relay.

In the embedded mode (one process, SQLite or memory store) a turn's chunks reach only the
consumer that started it. With this actor on the host's bus, every turn the host runs is
also appended to a :class:`~runtime.relay.Relay`, so any front end streams or resumes it
(``GET /api/chat/{id}/stream``). :func:`attach_relay` also listens for the relay's cancel
requests and cancels the local turn they name: a stop pressed on any front end reaches
the process that runs the turn; a stop naming a message or a turn there stops only what
it names (``Host.stop_named``: a waiting message taken out, or the running turn).

The actor's inbox is ``block`` (every chunk must reach the relay in order) but its
handler never waits on Redis: ``append`` only queues, and the relay's flush task writes.
A Redis that is down therefore never stalls a turn.

**A stop before the turn.** A named stop goes to every host; one sent before the POST of
the message it names reached the host that runs it (the relay streams no turn of the
session then, or one that message would wait for) finds nothing. A host that holds
nothing so named keeps it (:attr:`RelayPublisher.held`, at most
:data:`HELD_KEPT`, each for :data:`HELD_FOR` seconds) and, as a turn of that session
starts here, stops it if the stop names it by what only a new message's turn has: its
user message's id, or its own id (``Host.stop_new_turn``). Nothing on a turn's path but
a look at an empty dict: the watch already hears every stop.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any, ClassVar

import trio

from runtime.actor import Actor
from runtime.approval import AWAITING_INPUT
from runtime.hosting import TurnCanceller
from runtime.inbox import OverflowPolicy
from runtime.output import OUTPUT_CHUNK_TYPES, Abort, Error, Finish, Start

_ENDS = (Finish, Error, Abort)

HELD_KEPT = 1024
"""Stops a publisher keeps at most for turns that have not started here (the oldest go
first): every host hears every such stop, most of them for turns that run elsewhere or
never."""
HELD_FOR = 60.0
"""Seconds a stop for a turn not started here is kept: the life of its record in Redis
(``CANCEL_TTL_MS``); a turn whose POST takes longer to arrive is not stopped by it."""


class RelayPublisher(Actor):
    """Appends every output chunk on the bus to ``relay.writer(session_id, turn_id)``."""

    subscribes_to: ClassVar[Any] = OUTPUT_CHUNK_TYPES
    overflow: ClassVar[OverflowPolicy] = "block"
    inbox_capacity = 4096

    def __init__(self, relay: Any, *, name: str = "relay-publisher") -> None:
        super().__init__(name=name)
        self.relay = relay
        self.writers: dict[str, Any] = {}
        """The open writers, by turn id."""
        self.host: TurnCanceller | None = None
        """The host whose turns it publishes (:func:`attach_relay`): told to stop a
        starting turn that a :attr:`held` stop names."""
        self.held: dict[str, dict[tuple[str | None, str | None], tuple[Any, float]]] = {}
        """The named stops that found nothing here (perhaps sent before the turn they
        name reached this host), by session, then by (message, turn) named: the stop, and
        when it came (trio clock). A stop sent twice is kept once."""
        self._held_order: OrderedDict[tuple[str, str | None, str | None], float] = OrderedDict()
        """The same stops, the oldest first: which go when more than :data:`HELD_KEPT`
        are kept, or once older than :data:`HELD_FOR`."""

    def hold(self, stop: Any) -> None:
        """Keep ``stop`` (a ``NamedStop`` this host held nothing for) for a turn of its
        session that starts here within :data:`HELD_FOR` seconds."""
        order, now = self._held_order, trio.current_time()
        names = (stop.message_id, stop.named_turn)
        key = (stop.session_id, *names)
        order.pop(key, None)
        order[key] = now
        self.held.setdefault(stop.session_id, {})[names] = (stop, now)
        while order and (len(order) > HELD_KEPT or next(iter(order.values())) < now - HELD_FOR):
            (session_id, *oldest), _ = order.popitem(last=False)
            self._drop(session_id, (oldest[0], oldest[1]))

    def _drop(self, session_id: str, names: tuple[str | None, str | None]) -> None:
        """Forget the stop held for ``session_id`` naming ``names`` (message, turn)."""
        self._held_order.pop((session_id, *names), None)
        stops = self.held.get(session_id)
        if stops is not None:
            stops.pop(names, None)
            if not stops:
                del self.held[session_id]

    def _stop_if_held(self, chunk: Start) -> None:
        """The turn of ``chunk`` starts: stop it if a stop held for its session names it
        (and drop that stop, and those of the session that outlived :data:`HELD_FOR`)."""
        stops, host = self.held.get(chunk.session_id), self.host
        if not stops or host is None:
            return
        since = trio.current_time() - HELD_FOR
        for names, (stop, at) in list(stops.items()):
            if at < since or host.stop_new_turn(
                chunk.session_id,
                chunk.turn_id,
                message_id=stop.message_id,
                named_turn=stop.named_turn,
                reason=stop.reason,
            ):
                self._drop(chunk.session_id, names)

    def take_held(self, session_id: str, message_id: str | None, turn_id: str) -> str | None:
        """A new message of ``session_id`` (user message ``message_id``, turn ``turn_id``)
        reaches this host while a turn runs, so it would wait (queued, or to be steered
        into the running turn): the reason of a held stop naming it, dropped as used, or
        ``None``. Its stream then takes it out as :meth:`Host.stop_named` would have, had
        the stop come after it: nothing run, nothing stored (before, it waited and was
        stopped only as its turn started, its message and an interrupted answer saved)."""
        stops = self.held.get(session_id)
        if not stops:
            return None
        since = trio.current_time() - HELD_FOR
        for names, (stop, at) in list(stops.items()):
            named_message, named_turn = names
            if at < since:
                self._drop(session_id, names)
            elif (
                (named_message is not None or named_turn is not None)
                and named_message in (None, message_id)
                and named_turn in (None, turn_id)
            ):
                self._drop(session_id, names)
                return str(stop.reason)
        return None

    async def handle(self, chunk: Any) -> None:
        turn_id = chunk.turn_id
        if not turn_id:
            return
        writer = self.writers.get(turn_id)
        if writer is None:
            if type(chunk) is not Start:
                return  # a turn that began before the publisher started: not relayed
            if self.held:  # (empty but for stops lately heard that found nothing)
                self._stop_if_held(chunk)
            writer = self.writers[turn_id] = self.relay.writer(
                session_id=chunk.session_id, turn_id=turn_id
            )
        writer.append(chunk)
        if type(chunk) in _ENDS:
            del self.writers[turn_id]
            # A turn that waits for input pauses its stream: its continuation (same turn
            # id, docs/approval.md) goes on in it, readers passing over the pause.
            paused = type(chunk) is Finish and chunk.finish_reason == AWAITING_INPUT
            self.relay.nursery.start_soon(partial(writer.aclose, paused=paused))


def cancel_local_turn(host: TurnCanceller, turn_id: str, reason: str) -> bool:
    """Cancel the turn ``turn_id`` if this host runs it (``Host.cancel_turn``); whether it
    did."""
    return host.cancel_turn(turn_id, reason)


async def attach_relay(host: TurnCanceller, relay: Any) -> RelayPublisher:
    """Publish every turn ``host`` runs to ``relay`` and obey the relay's cancel requests
    for them; returns the running publisher."""
    publisher = await host.start_actor(RelayPublisher(relay))
    publisher.host = host
    host.held_stop = publisher.take_held
    watch = getattr(relay, "watch_cancels", None)
    if watch is not None:

        def on_cancel(turn_id: str, reason: str) -> None:
            cancel_local_turn(host, turn_id, reason)

        def on_named(stop: Any) -> None:
            stopped = host.stop_named(
                stop.session_id,
                message_id=stop.message_id,
                turn_id=stop.named_turn,
                reason=stop.reason,
            )
            if stopped is None:  # what it names may not have reached this host yet
                publisher.hold(stop)

        await host.nursery.start(_watch, watch, on_cancel, on_named)
    return publisher


async def _watch(
    watch: Any,
    on_cancel: Any,
    on_named: Any,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    await watch(on_cancel, on_named=on_named, task_status=task_status)


__all__ = ["RelayPublisher", "attach_relay", "cancel_local_turn"]
