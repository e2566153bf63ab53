"""What a streaming response holds for a client that stops reading, counted in bytes."""

from __future__ import annotations

from typing import Any

import trio

from runtime.app.web.writer import QUEUED_BYTES, BodyWriter

PIECE = b"x" * 100_000
"""A relay read of about a thousand events, as a queued turn's stream writes them."""


def stuck_client(sent: list[dict[str, Any]], *, fails: bool = False) -> Any:
    """Hypercorn's ``send`` for a client that takes the headers and no body: it waits
    for good (or the connection breaks, with ``fails``)."""

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            if fails:
                raise OSError("connection reset")
            await trio.sleep_forever()

    return send


async def test_a_client_that_takes_nothing_holds_up_at_most_the_queued_bytes(
    autojump_clock: Any,
) -> None:
    sent: list[dict[str, Any]] = []
    writer = BodyWriter.ok(stuck_client(sent), {}, timeout=0.5)
    accepted = 0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        while await writer.write(PIECE):
            accepted += len(PIECE)
        nursery.cancel_scope.cancel()
    assert writer.stalled
    # What the writer is stuck sending (the queue it took, merged) and what was queued
    # behind it, each less than QUEUED_BYTES and a piece: 6.5 MB with 64 pieces queued.
    assert accepted <= 2 * (QUEUED_BYTES + len(PIECE))


async def test_a_write_waiting_for_room_ends_when_the_connection_breaks(
    autojump_clock: Any,
) -> None:
    sent: list[dict[str, Any]] = []
    writer = BodyWriter.ok(stuck_client(sent, fails=True), {}, timeout=60)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.run)
        began = trio.current_time()
        while await writer.write(PIECE):
            pass
    assert not writer.stalled  # told at once, not after the minute's wait
    assert trio.current_time() - began < 60
