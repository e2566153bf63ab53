"""The inbox is its own queue with a Trio memory channel's semantics (issue 24 item 5:
a memory channel was eight tracked objects, six per turn in flight, for every full
garbage collection to walk)."""

from __future__ import annotations

import gc

import pytest
import trio
import trio.testing

from runtime import Inbox


def tracked_by(inbox: Inbox) -> list[object]:
    """The tracked objects the inbox refers to (its queue, its tables of waiters)."""
    return [o for o in gc.get_referents(inbox) if gc.is_tracked(o) and not isinstance(o, type)]


async def test_an_inbox_in_use_holds_a_deque_and_no_channel():
    inbox: Inbox[int] = Inbox(4)
    await inbox.put(1)
    held = tracked_by(inbox)
    assert [type(o).__name__ for o in held] == ["deque"]
    assert await inbox.get() == 1
    assert inbox.park() and tracked_by(inbox) == []


async def test_a_full_inbox_makes_the_sender_wait_until_a_message_is_taken():
    inbox: Inbox[int] = Inbox(1)
    await inbox.put(1)
    sent: list[int] = []

    async def send() -> None:
        await inbox.put(2)
        sent.append(2)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await trio.testing.wait_all_tasks_blocked()
        assert sent == [] and len(inbox) == 1 and not inbox.park()
        assert inbox.get_nowait() == 1  # the waiting sender's message moves up
        assert len(inbox) == 1
    assert sent == [2] and inbox.get_nowait() == 2
    with pytest.raises(trio.WouldBlock):
        inbox.put_nowait(3) or inbox.put_nowait(4)


async def test_a_message_goes_straight_to_a_waiting_receiver_in_order():
    inbox: Inbox[str] = Inbox(2)
    got: dict[str, str] = {}

    async def receive(name: str) -> None:
        got[name] = await inbox.get()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive, "first")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(receive, "second")
        await trio.testing.wait_all_tasks_blocked()
        inbox.put_nowait("a")
        inbox.put_nowait("b")
        assert len(inbox) == 0
    assert got == {"first": "a", "second": "b"}


async def test_closing_ends_a_waiting_receiver_after_the_queue_drains():
    inbox: Inbox[int] = Inbox(4)
    ended: list[str] = []

    async def receive_all() -> None:
        async for message in inbox:
            ended.append(str(message))
        ended.append("end")

    inbox.put_nowait(1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(receive_all)
        await trio.testing.wait_all_tasks_blocked()
        inbox.close()
    assert ended == ["1", "end"]
    with pytest.raises(trio.ClosedResourceError):
        await inbox.put(2)


async def test_closing_the_receiver_breaks_a_waiting_sender_and_later_sends():
    inbox: Inbox[int] = Inbox(1)
    inbox.put_nowait(1)
    failed: list[type] = []

    async def send() -> None:
        try:
            await inbox.put(2)
        except trio.BrokenResourceError as exc:
            failed.append(type(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await trio.testing.wait_all_tasks_blocked()
        inbox.close_receiver()
    assert failed == [trio.BrokenResourceError] and len(inbox) == 0
    with pytest.raises(trio.BrokenResourceError):
        inbox.put_nowait(3)
    with pytest.raises(trio.ClosedResourceError):
        inbox.get_nowait()


async def test_a_cancelled_receiver_or_sender_leaves_no_waiter_behind():
    inbox: Inbox[int] = Inbox(1)
    with trio.move_on_after(1):
        await inbox.get()
    inbox.put_nowait(1)
    with trio.move_on_after(1):
        await inbox.put(2)
    assert inbox.get_nowait() == 1 and len(inbox) == 0 and inbox.park()


async def test_a_drop_oldest_inbox_drops_and_then_owes_a_lagged_notice():
    inbox: Inbox[int] = Inbox(2, "drop-oldest", name="obs")
    for i in range(5):
        await inbox.put(i)
    lagged = await inbox.get()
    assert (lagged.subscriber, lagged.dropped) == ("obs", 3)
    rest: list[int] = []
    inbox.drain_nowait(rest)
    assert rest == [3, 4]


async def test_take_finds_a_waiting_message_without_a_schedule_point():
    """``take`` returns a message already queued without yielding (``get`` yields once),
    and still checks cancellation; on an empty inbox it waits like ``get``."""
    from tests.support.steps import counted

    inbox: Inbox[int] = Inbox(4)
    inbox.put_nowait(1)
    inbox.put_nowait(2)
    me = trio.lowlevel.current_task()
    with counted() as steps:
        assert await inbox.take() == 1
    assert steps.of(me) == 0
    with counted() as steps:
        assert await inbox.get() == 2
    assert steps.of(me) == 1
    inbox.put_nowait(3)
    with trio.CancelScope() as scope:
        scope.cancel()
        await inbox.take()
    assert scope.cancelled_caught and inbox.get_nowait() == 3
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_put_later, inbox, 4)
        assert await inbox.take() == 4


async def _put_later(inbox: Inbox[int], value: int) -> None:
    await trio.testing.wait_all_tasks_blocked()
    inbox.put_nowait(value)
