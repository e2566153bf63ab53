"""Bounded inboxes with an overflow policy.

An actor owns one inbox and handles one message at a time. The policy decides what a
full inbox does to its sender:

* ``"block"``: the sender waits (backpressure). For actors on the critical path.
* ``"drop-oldest"``: the oldest message is discarded and the receiver is later handed a
  :class:`~runtime.events.Lagged` notice saying how many it missed. For observers, so a
  slow UI or logger never stalls an agent.
"""

from __future__ import annotations

from typing import Any, Literal

import trio

OverflowPolicy = Literal["block", "drop-oldest"]


class Inbox:
    """A bounded queue of messages for one actor (or one bus subscriber)."""

    __slots__ = ("_recv", "_send", "capacity", "dropped", "name", "policy")

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
        self._send, self._recv = trio.open_memory_channel[Any](capacity)

    # -- sending -----------------------------------------------------------------------

    async def put(self, message: Any) -> None:
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

    def put_nowait(self, message: Any) -> None:
        """Deliver without waiting: drops the oldest under ``drop-oldest``, raises
        :class:`trio.WouldBlock` when a ``block`` inbox is full."""
        try:
            self._send.send_nowait(message)
        except trio.WouldBlock:
            if self.policy == "block":
                raise
            self._drop_one_and_put(message)

    def _drop_one_and_put(self, message: Any) -> None:
        try:
            self._recv.receive_nowait()
            self.dropped += 1
        except trio.WouldBlock:  # pragma: no cover - full yet empty cannot happen
            pass
        self._send.send_nowait(message)

    # -- receiving ---------------------------------------------------------------------

    async def get(self) -> Any:
        """The next message; a :class:`Lagged` notice first if messages were dropped."""
        if self.dropped:
            return self._lagged()
        return await self._recv.receive()

    def get_nowait(self) -> Any:
        if self.dropped:
            return self._lagged()
        return self._recv.receive_nowait()

    def drain_nowait(self, into: list[Any], limit: int = 4096) -> None:
        """Append every message already waiting (up to ``limit``) to ``into``."""
        recv = self._recv
        try:
            for _ in range(limit):
                into.append(recv.receive_nowait())
        except trio.WouldBlock:
            pass

    def _lagged(self) -> Any:
        from runtime.events import Lagged

        n, self.dropped = self.dropped, 0
        return Lagged(subscriber=self.name, dropped=n)

    def close(self) -> None:
        """No more messages will be accepted; the receiver ends after draining."""
        self._send.close()

    def close_receiver(self) -> None:
        """The receiver is gone: further sends raise :class:`trio.BrokenResourceError`."""
        self._recv.close()

    @property
    def closed(self) -> bool:
        try:
            return self._send._closed  # type: ignore[attr-defined]
        except AttributeError:  # pragma: no cover
            return False

    def __aiter__(self) -> Inbox:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.get()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def __len__(self) -> int:
        return self._recv.statistics().current_buffer_used
