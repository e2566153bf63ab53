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
        self._send: trio.MemorySendChannel[T]
        self._recv: trio.MemoryReceiveChannel[T]
        self._send, self._recv = trio.open_memory_channel[T](capacity)

    # -- sending -----------------------------------------------------------------------

    async def put(self, message: T) -> None:
        """Deliver ``message``; waits for room only under the ``block`` policy.

        Under ``block`` this does not yield when there is room: a producer keeps going
        and the consumer picks up whatever has accumulated in one go (batching).
        """
        try:
            self._send.send_nowait(message)
        except trio.WouldBlock:
            if self.policy == "block":
                await self._send.send(message)
            else:
                self._drop_one_and_put(message)

    def put_nowait(self, message: T) -> None:
        """Deliver without waiting: drops the oldest under ``drop-oldest``, raises
        :class:`trio.WouldBlock` when a ``block`` inbox is full."""
        try:
            self._send.send_nowait(message)
        except trio.WouldBlock:
            if self.policy == "block":
                raise
            self._drop_one_and_put(message)

    def _drop_one_and_put(self, message: T) -> None:
        try:
            self._recv.receive_nowait()
            self.dropped += 1
        except trio.WouldBlock:  # pragma: no cover - full yet empty cannot happen
            pass
        self._send.send_nowait(message)

    # -- receiving ---------------------------------------------------------------------

    async def get(self) -> T:
        """The next message; a :class:`Lagged` notice first if messages were dropped
        (typed as ``T``: only a ``drop-oldest`` inbox ever returns one, and its readers
        are observers that take any event)."""
        if self.dropped:
            return self._lagged()
        return await self._recv.receive()

    def get_nowait(self) -> T:
        if self.dropped:
            return self._lagged()
        return self._recv.receive_nowait()

    def drain_nowait(self, into: list[T], limit: int = 4096) -> None:
        """Append every message already waiting (up to ``limit``) to ``into``."""
        recv = self._recv
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
        self._send.close()

    def close_receiver(self) -> None:
        """The receiver is gone: further sends raise :class:`trio.BrokenResourceError`."""
        self._recv.close()

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
        return self._recv.statistics().current_buffer_used
