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

from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import trio

from runtime.actor import Actor
from runtime.approval import AWAITING_INPUT
from runtime.events import TurnFinished
from runtime.hosting import TurnCanceller
from runtime.inbox import OverflowPolicy
from runtime.output import OUTPUT_CHUNK_TYPES, Abort, Error, Finish, Start

_ENDS = (Finish, Error, Abort)

FINISHED_WAIT = 15.0
"""Seconds a turn's end chunk waits at most for its ``TurnFinished`` (which the runner
publishes within its 5 s ``SAVE_TIMEOUT`` of handing the controller the end, or never)."""


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

    async def handle(self, chunk: Any) -> None:
        turn_id = chunk.turn_id
        if not turn_id:
            return
        if type(chunk) is TurnFinished:
            if self.told is not None:
                await self._finished(chunk)
            return
        writer = self.writers.get(turn_id)
        if writer is None:
            if type(chunk) is not Start:
                return  # a turn that began before the publisher started: not relayed
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
                    return
                chunk = self.told(chunk, finished)
            await self._end(writer, chunk)
            return
        writer.append(chunk)
        room = getattr(writer, "room", None)  # the Redis relay's bound in bytes
        if room is not None:
            await room()  # the bus (``block``) holds the turn while Redis is slow

    async def _finished(self, finished: TurnFinished) -> None:
        """A turn's ``TurnFinished``: its held end goes out as told, or it waits for
        the end (only a relayed turn's: one with an open writer)."""
        turn_id = finished.turn_id
        held = self.held.pop(turn_id, None)
        if held is not None:
            writer, end = held
            await self._end(writer, self.told(end, finished))  # type: ignore[misc]
        elif turn_id in self.writers:
            self.finished[turn_id] = finished

    async def _give_up_waiting(self, turn_id: str) -> None:
        """After :data:`FINISHED_WAIT`, a held end goes as it came: its ``TurnFinished``
        was not delivered (the runner's bounded publish gave up), and a stream left
        without its end would keep its readers waiting until the relay's TTL."""
        await trio.sleep(FINISHED_WAIT)
        held = self.held.pop(turn_id, None)
        if held is not None:
            writer, end = held
            writer.append(end)
            self._close(writer, end)

    async def _end(self, writer: Any, end: Any) -> None:
        writer.append(end)
        room = getattr(writer, "room", None)
        if room is not None:
            await room()
        self._close(writer, end)

    def _close(self, writer: Any, end: Any) -> None:
        """Close the writer of a turn that ended with ``end`` (appended). A turn that
        waits for input pauses its stream: its continuation (same turn id,
        docs/approval.md) goes on in it, readers passing over the pause."""
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
