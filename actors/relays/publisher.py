"""``RelayPublisher``: an embedded host's turns, published live to a relay.

In the embedded mode (one process, SQLite or memory store) a turn's chunks reach only the
consumer that started it. With this actor on the host's bus, every turn the host runs is
also appended to a :class:`~runtime.relay.Relay`, so any front end streams or resumes it
(``GET /api/chat/{id}/stream``). :func:`attach_relay` also listens for the relay's cancel
requests and cancels the local turn they name: a stop pressed on any front end reaches
the process that runs the turn; a stop naming a message or a turn there stops only what
it names (``Host.stop_named``: a waiting message taken out, or the running turn).

Every chunk reaches the relay in order, and nothing waits on Redis itself: ``append``
only queues, and the relay's flush task writes. A Redis that is down stalls a turn at
most until its writer's bound gives way (``close_timeout``), and no other turn.

**A slow Redis slows only the turns it holds.** A writer's queue is bounded in bytes
(the Redis relay's ``max_queue_bytes``, ``room()``); the turn over it waits, in its own
publishing: a chunk's ``put`` into this actor's inbox (:class:`_RoomInbox`) appends it
to its writer at once and waits for that writer's room, so chunks never queue in the
inbox. Before, the actor's handler appended them and awaited the writer's room after
each: every other turn's chunks waited behind it on the bus (a slow Redis for one huge
turn held every turn of the host out of the relay, and, once the inbox was full, every
turn of the host), and a burst of one turn's chunks queued in the inbox (4096 of them,
whatever their size) out of the bound.

**A stop before the turn.** A named stop goes to every host; one sent before the POST of
the message it names reached the host that runs it (the relay streams no turn of the
session then, or one that message would wait for) finds nothing. A host that holds
nothing so named keeps it (``Host.hold_stop``, the contract's
:class:`~runtime.busy.HeldStops`: at most 1024, each for a minute, used once), and the
new message's stream takes it when it comes: taken out if it would wait, its turn
stopped if it starts at once.

**A turn's end as its client is told it.** A web client is told a turn whose final save
failed (or was not confirmed) as ``not_saved`` (``runtime.app.unsaved.told_end``), not as
the ``finish`` (or the store's error) its stream ended with. What decides it, the turn's
``TurnFinished`` (``saved``), comes on the bus beside the end chunk: given ``told``, the
publisher writes the end that ``told(end, finished)`` returns, so a client resuming the
turn from the relay is told what the live stream told. The event is normally on the
inbox before the end chunk (the runner publishes it as it hands the controller the
turn's end); the other way round, the end waits for it, at most :data:`FINISHED_WAIT`
seconds (an event the runner gave up delivering: the end goes as it came).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, ClassVar

import structlog
import trio

from runtime.actor import Actor
from runtime.approval import AWAITING_INPUT
from runtime.events import TurnFinished
from runtime.hosting import TurnCanceller
from runtime.inbox import Inbox, OverflowPolicy
from runtime.output import OUTPUT_CHUNK_TYPES, Abort, Error, Finish, Start

_ENDS = (Finish, Error, Abort)

FINISHED_WAIT = 15.0
"""Seconds a turn's end chunk waits at most for its ``TurnFinished`` (which the runner
publishes within its 5 s ``SAVE_TIMEOUT`` of handing the controller the end, or never)."""

log = structlog.get_logger("axon.relay")


class _RoomInbox(Inbox[Any]):
    """The publisher's inbox, which its chunks never enter: a chunk's ``put`` (the
    producing turn's ``bus.publish``) appends it to its turn's writer at once
    (:meth:`RelayPublisher.append`, in the order the turn publishes), then waits while that
    writer holds its bound (``room()``): that turn waits for Redis, and the others'
    chunks go on (see the module doc). ``put_nowait`` appends without the wait."""

    __slots__ = ("publisher",)

    def __init__(self, publisher: RelayPublisher) -> None:
        super().__init__(publisher.inbox_capacity, "block", name=publisher.name)
        self.publisher = publisher

    async def put(self, message: Any) -> None:
        room = self._append(message)
        if room is not None:
            await room()

    def put_nowait(self, message: Any) -> None:
        self._append(message)

    def _append(self, message: Any) -> Any:
        if self._closed or self._receiver_closed:  # (the actor stopped: unsubscribed)
            raise trio.ClosedResourceError
        try:
            return self.publisher.append(message)
        except Exception as exc:  # the relay's failure is never the turn's
            log.error(
                "relay.publish_failed",
                turn_id=getattr(message, "turn_id", None),
                error=f"{type(exc).__name__}: {exc}"[:300],
            )
            return None


class RelayPublisher(Actor):
    """Appends every output chunk on the bus to ``relay.writer(session_id, turn_id)``."""

    subscribes_to: ClassVar[Any] = (*OUTPUT_CHUNK_TYPES, TurnFinished)
    overflow: ClassVar[OverflowPolicy] = "block"
    inbox_capacity = 4096

    def __init__(
        self,
        relay: Any,
        *,
        told: Callable[[Any, TurnFinished], Any] | None = None,
        name: str = "relay-publisher",
    ) -> None:
        super().__init__(name=name)
        self.relay = relay
        self.told = told
        """The end chunk a turn's client is told, from the chunk and the turn's
        ``TurnFinished`` (``None``: the end as it came)."""
        self.writers: dict[str, Any] = {}
        """The open writers, by turn id."""
        self.finished: dict[str, TurnFinished] = {}
        """The ``TurnFinished`` of relayed turns whose end chunk has not come yet."""
        self.held: dict[str, tuple[Any, Any]] = {}
        """``(writer, end chunk)`` of turns whose ``TurnFinished`` has not come yet."""
        self.inbox = _RoomInbox(self)

    async def handle(self, chunk: Any) -> None:
        room = self.append(chunk)  # (what is sent to the actor rather than published)
        if room is not None:
            await room()

    def append(self, chunk: Any) -> Callable[[], Awaitable[None]] | None:
        """Append ``chunk`` to its turn's writer (opened by the turn's ``start``, closed
        by its end); the writer's ``room`` to wait for after it (the Redis relay's bound
        in bytes), ``None`` when there is none to wait for (a turn's end never waits: a
        turn cancelled meanwhile, its end published as it unwinds, would leave its
        stream without one)."""
        turn_id = chunk.turn_id
        if not turn_id:
            return None
        if type(chunk) is TurnFinished:
            if self.told is not None:
                self._finished(chunk)
            return None
        writer = self.writers.get(turn_id)
        if writer is None:
            if type(chunk) is not Start:
                return None  # a turn that began before the publisher started: not relayed
            writer = self.writers[turn_id] = self.relay.writer(
                session_id=chunk.session_id, turn_id=turn_id
            )
        if type(chunk) in _ENDS:
            del self.writers[turn_id]
            if self.told is not None:
                finished = self.finished.pop(turn_id, None)
                if finished is None:  # not come yet: the end waits for it
                    self.held[turn_id] = (writer, chunk)
                    self.relay.nursery.start_soon(self._give_up_waiting, turn_id)
                    return None
                chunk = self.told(chunk, finished)
            self._end(writer, chunk)
            return None
        writer.append(chunk)
        return getattr(writer, "room", None)

    def _finished(self, finished: TurnFinished) -> None:
        """A turn's ``TurnFinished``: its held end goes out as told, or it waits for
        the end (only a relayed turn's: one with an open writer)."""
        turn_id = finished.turn_id
        held = self.held.pop(turn_id, None)
        if held is not None:
            writer, end = held
            self._end(writer, self.told(end, finished))  # type: ignore[misc]
        elif turn_id in self.writers:
            self.finished[turn_id] = finished

    async def _give_up_waiting(self, turn_id: str) -> None:
        """After :data:`FINISHED_WAIT`, a held end goes as it came: its ``TurnFinished``
        was not delivered (the runner's bounded publish gave up), and a stream left
        without its end would keep its readers waiting until the relay's TTL."""
        await trio.sleep(FINISHED_WAIT)
        held = self.held.pop(turn_id, None)
        if held is not None:
            self._end(*held)

    def _end(self, writer: Any, end: Any) -> None:
        """Append a turn's ``end`` and close its writer (an end never waits for room). A
        turn that waits for input pauses its stream: its continuation (same turn id,
        docs/approval.md) goes on in it, readers passing over the pause."""
        writer.append(end)
        paused = type(end) is Finish and end.finish_reason == AWAITING_INPUT
        self.relay.nursery.start_soon(partial(writer.aclose, paused=paused))


def cancel_local_turn(host: TurnCanceller, turn_id: str, reason: str) -> bool:
    """Cancel the turn ``turn_id`` if this host runs it (``Host.cancel_turn``); whether it
    did."""
    return host.cancel_turn(turn_id, reason)


async def attach_relay(
    host: TurnCanceller, relay: Any, *, told: Callable[[Any, Any], Any] | None = None
) -> RelayPublisher:
    """Publish every turn ``host`` runs to ``relay`` and obey the relay's cancel requests
    for them; returns the running publisher. ``told``: each turn's end chunk as its
    client is told it (:class:`RelayPublisher`)."""
    publisher = await host.start_actor(RelayPublisher(relay, told=told))
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
                host.hold_stop(
                    stop.session_id,
                    message_id=stop.message_id,
                    turn_id=stop.named_turn,
                    reason=stop.reason,
                )

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
