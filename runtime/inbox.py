"""Bounded inboxes with an overflow policy.

An actor owns one inbox and handles one message at a time. The policy decides what a
full inbox does to its sender:

* ``"block"``: the sender waits (backpressure). For actors on the critical path.
* ``"drop-oldest"``: the oldest message is discarded and the receiver is later handed a
  :class:`~runtime.events.Lagged` notice saying how many it missed. For observers, so a
  slow UI or logger never stalls an agent.
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar

import trio

from runtime.events import Lagged

OverflowPolicy = Literal["block", "drop-oldest"]
T = TypeVar("T")


class Inbox(Generic[T]):
    """A bounded queue of messages of type ``T`` for one actor (or one bus subscriber).

    Generic like the Trio memory channel it wraps (``Inbox[SaveResult]``), so a reader
    and a type checker can follow what travels where. Under ``drop-oldest`` the receiver
    may also get a :class:`~runtime.events.Lagged` notice (see :meth:`get`).

    The channel is opened on first use, and :meth:`park` drops it while nothing is queued
    or waiting: an idle session's inboxes (ten thousand sessions in one host) then cost
    a small object each, not a channel with its queues of waiting tasks.
    """

    __slots__ = ("_closed", "_recv", "_send", "capacity", "dropped", "name", "policy")

    def __init__(
        self, capacity: int = 256, policy: OverflowPolicy = "block", *, name: str = "inbox"
    ) -> None:
        if policy not in ("block", "drop-oldest"):
            raise ValueError(f"unknown overflow policy {policy!r}")
        if capacity < 1:
            raise ValueError("an inbox needs a capacity of at least 1")
        self.name = name
        self.capacity = capacity
        self.policy: OverflowPolicy = policy
        self.dropped = 0
        self._closed = False
        self._send: trio.MemorySendChannel[T] | None = None
        self._recv: trio.MemoryReceiveChannel[T] | None = None

    def _open(self) -> tuple[trio.MemorySendChannel[T], trio.MemoryReceiveChannel[T]]:
        """The channel, opened now if it was not (or was parked)."""
        if self._send is None or self._recv is None:
            self._send, self._recv = trio.open_memory_channel[T](self.capacity)
        return self._send, self._recv

    def park(self) -> bool:
        """Drop the channel if it is open, empty, and no task waits on it (the next
        message opens a new one); whether it is dropped. A closed inbox, or one whose
        receiver is closed or owes a :class:`Lagged` notice, keeps its channel."""
        recv = self._recv
        if recv is None:
            return True
        if self._closed or self.dropped:
            return False
        stats = recv.statistics()
        if (
            stats.current_buffer_used
            or stats.tasks_waiting_receive
            or stats.tasks_waiting_send
            or not stats.open_receive_channels
        ):
            return False
        self._send = self._recv = None
        return True

    @property
    def parked(self) -> bool:
        """Whether the inbox holds no channel now (never used, or :meth:`park` ed)."""
        return self._recv is None

    # -- sending -----------------------------------------------------------------------

    async def put(self, message: T) -> None:
        """Deliver ``message``; waits for room only under the ``block`` policy.

        Under ``block`` this does not yield when there is room: a producer keeps going
        and the consumer picks up whatever has accumulated in one go (batching).
        """
        send = self._send or self._open()[0]
        try:
            send.send_nowait(message)
        except trio.WouldBlock:
            if self.policy == "block":
                await send.send(message)
            else:
                self._drop_one_and_put(message)

    def put_nowait(self, message: T) -> None:
        """Deliver without waiting: drops the oldest under ``drop-oldest``, raises
        :class:`trio.WouldBlock` when a ``block`` inbox is full."""
        send = self._send or self._open()[0]
        try:
            send.send_nowait(message)
        except trio.WouldBlock:
            if self.policy == "block":
                raise
            self._drop_one_and_put(message)

    def _drop_one_and_put(self, message: T) -> None:
        send, recv = self._open()
        try:
            recv.receive_nowait()
            self.dropped += 1
        except trio.WouldBlock:  # pragma: no cover - full yet empty cannot happen
            pass
        send.send_nowait(message)

    # -- receiving ---------------------------------------------------------------------

    async def get(self) -> T:
        """The next message; a :class:`Lagged` notice first if messages were dropped
        (typed as ``T``: only a ``drop-oldest`` inbox ever returns one, and its readers
        are observers that take any event)."""
        if self.dropped:
            return self._lagged()
        return await (self._recv or self._open()[1]).receive()

    def get_nowait(self) -> T:
        if self.dropped:
            return self._lagged()
        return (self._recv or self._open()[1]).receive_nowait()

    def drain_nowait(self, into: list[T], limit: int = 4096) -> None:
        """Append every message already waiting (up to ``limit``) to ``into``."""
        recv = self._recv
        if recv is None:
            return
        try:
            for _ in range(limit):
                into.append(recv.receive_nowait())
        except trio.WouldBlock:
            pass

    def _lagged(self) -> T:
        n, self.dropped = self.dropped, 0
        return Lagged(subscriber=self.name, dropped=n)  # type: ignore[return-value]

    def close(self) -> None:
        """No more messages will be accepted; the receiver ends after draining."""
        self._closed = True
        self._open()[0].close()

    def close_receiver(self) -> None:
        """The receiver is gone: further sends raise :class:`trio.BrokenResourceError`."""
        self._open()[1].close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: the inbox accepts no more messages."""
        return self._closed

    def __aiter__(self) -> Inbox[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.get()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def __len__(self) -> int:
        recv = self._recv
        return 0 if recv is None else recv.statistics().current_buffer_used
