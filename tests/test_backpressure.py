"""Bounded batches: a consumer that stops reading holds its pipeline back, not its memory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, AssistantMessage, Host
from runtime.actor_messages import MAX_BATCH, Batcher
from runtime.inbox import Inbox


def batch_sizes(inbox: Inbox) -> list[int]:
    """The sizes of the batches waiting in ``inbox`` (taken out of it)."""
    sizes: list[int] = []
    while len(inbox):
        sizes.append(len(inbox.get_nowait()))
    return sizes


async def test_a_batch_the_receiver_has_not_taken_grows_to_max_items_only():
    inbox = Inbox(8)
    batcher = Batcher(inbox)
    for i in range(2 * MAX_BATCH + 1):
        await batcher.send(i)
    assert batch_sizes(inbox) == [MAX_BATCH, MAX_BATCH, 1]


async def test_send_all_splits_what_does_not_fit_into_full_batches():
    inbox = Inbox(8)
    batcher = Batcher(inbox)
    await batcher.send("first")
    await batcher.send_all(list(range(2 * MAX_BATCH)))
    assert batch_sizes(inbox) == [MAX_BATCH, MAX_BATCH, 1]


async def test_send_all_keeps_the_order_of_items_across_batches():
    inbox = Inbox(8)
    batcher = Batcher(inbox)
    items = list(range(3 * MAX_BATCH + 5))
    await batcher.send_all(items[:7])
    await batcher.send_all(items[7:])
    received = [item for _ in range(len(inbox)) for item in inbox.get_nowait()]
    assert received == items


async def test_a_receiver_that_never_reads_blocks_the_sender_at_capacity_times_max_items():
    inbox = Inbox(2)
    batcher = Batcher(inbox)
    sent = 0

    async def produce() -> None:
        nonlocal sent
        for i in range(100 * MAX_BATCH):
            await batcher.send(i)
            sent += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(produce)
        await trio.testing.wait_all_tasks_blocked()
        assert sent == 2 * MAX_BATCH  # blocked on the third batch, not piling up
        nursery.cancel_scope.cancel()


async def test_an_item_sent_after_a_cancelled_put_is_delivered(autojump_clock):
    inbox = Inbox(1)
    batcher = Batcher(inbox)
    await batcher.send_all(list(range(MAX_BATCH)))  # a full batch fills the inbox
    with trio.move_on_after(1):
        await batcher.send("cancelled while waiting for room")
    assert len(inbox.get_nowait()) == MAX_BATCH  # the receiver takes the full batch
    await batcher.send("after")
    assert list(inbox.get_nowait()) == ["after"]


async def test_try_send_all_batches_as_send_all_does_when_nothing_waits():
    sent, tried = Inbox(8), Inbox(8)
    ahead = list(range(MAX_BATCH - 3))
    for inbox in (sent, tried):
        await Batcher(inbox).send("unrelated")  # another sender's batch, already queued
    by_send, by_try = Batcher(sent), Batcher(tried)
    for batcher in (by_send, by_try):
        await batcher.send_all(ahead)
    await by_send.send_all(list(range(5)))
    assert by_try.try_send_all(list(range(5)))  # fills the pending batch, then a new one
    assert [list(b) for b in (sent.get_nowait() for _ in range(3))] == [
        list(b) for b in (tried.get_nowait() for _ in range(3))
    ]


async def test_try_send_all_sends_nothing_when_it_would_wait():
    inbox = Inbox(1)
    batcher = Batcher(inbox)
    await batcher.send_all(list(range(MAX_BATCH)))  # a full batch fills the inbox
    assert not batcher.try_send_all(["end", "done"])
    assert not batcher.try_send_all(list(range(2 * MAX_BATCH)))  # two batches: never
    assert batch_sizes(inbox) == [MAX_BATCH]  # nothing appended, nothing queued
    assert batcher.try_send_all(["end", "done"])
    assert list(inbox.get_nowait()) == ["end", "done"]


def endless_text(pulled: list[int]) -> Iterator[str]:
    """Many small text deltas, counting in ``pulled`` how many the provider took."""
    for i in range(200_000):
        pulled[0] += 1
        yield f"w{i} "


async def test_a_consumer_that_stops_reading_stalls_the_provider_and_the_next_turn_runs(
    monkeypatch,
):
    # A small cap keeps the pipeline's bound (inbox capacities x cap) small for the test.
    monkeypatch.setattr(Batcher, "max_items", 2)
    pulled = [0]
    turns = iter([lambda: endless_text(pulled), lambda: iter(["Fine."])])

    def respond(request: Any) -> Iterator[str]:
        return next(turns)()

    agent = Agent(provider=ScriptedProvider(responder=respond))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="stuck")
        with trio.fail_after(30):
            async with session.stream("a lot") as out:
                await anext(out)
                await trio.testing.wait_all_tasks_blocked()
                stalled_at = pulled[0]
            # the consumer left: the turn was cancelled and saved with what it had
            assert stalled_at < 100_000  # the provider was held back, not drained
            assert out.result is not None and out.result.finish_reason == "aborted"
            record = await host.store.load("stuck")
            stopped = record.messages[1]
            assert isinstance(stopped, AssistantMessage) and stopped.interrupted
            assert stopped.text.startswith("w0 w1 ")
            # the leftovers of the cancelled call do not wedge the session
            result = await session.run("again")
        assert result.finish_reason == "stop" and result.text == "Fine."


async def test_a_network_read_of_deltas_crosses_each_stage_as_one_batch():
    """A fast stream's read holds 70-150 deltas; each batch costs every stage an inbox
    put, a get and a scheduler round, so such a read goes as one batch (issue 24)."""
    inbox = Inbox(8)
    await Batcher(inbox).send_all([f"w{i} " for i in range(120)])
    assert batch_sizes(inbox) == [120]


async def test_what_a_stalled_receiver_holds_up_did_not_grow_with_the_batches():
    """The inboxes that carry chunk batches were halved as the batches doubled, and
    quartered for batches of text runs (MAX_RUN deltas): capacity times the deltas of a
    batch (what a receiver that stops reading can hold up) is as before."""
    import inspect

    from actors.engine import Engine
    from actors.stream_controller import StreamController
    from runtime.app.session import TurnStream
    from runtime.inbox import MAX_RUN

    agent = Agent(provider=ScriptedProvider(["Hi."]))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="bounds")
        await session.run("hello")
        runner = session.runner
        assert runner is not None
        held = {
            "engine": Engine.inbox_capacity * MAX_RUN,
            "engine-output": runner.stream_inbox.capacity * MAX_RUN,
            "stream-controller": StreamController.inbox_capacity * MAX_RUN,
            "consumer": inspect.signature(TurnStream).parameters["capacity"].default * MAX_BATCH,
        }
    assert held == {
        "engine": 1024 * 64,
        "engine-output": 1024 * 64,
        "stream-controller": 1024 * 64,
        "consumer": 256 * 64,
    }


async def test_a_call_cut_short_leaves_nothing_unread_in_the_sessions_inboxes(monkeypatch):
    # The consumer stops reading: the pipeline fills up to the engine's inbox. It leaves,
    # the turn ends aborted, and the session idles: what the engine had forwarded to the
    # runner, and the provider to the engine, of the cut call was kept until the next.
    monkeypatch.setattr(Batcher, "max_items", 2)
    agent = Agent(provider=ScriptedProvider(responder=lambda r: endless_text([0])))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="cut")
        with trio.fail_after(30):
            async with session.stream("a lot") as out:
                await anext(out)
                await trio.testing.wait_all_tasks_blocked()
                runner = session.runner
                assert runner is not None and len(runner.stream_inbox) > 0  # (it filled up)
            await trio.testing.wait_all_tasks_blocked()
        assert out.result is not None and out.result.finish_reason == "aborted"
        assert (len(runner.stream_inbox), len(runner.engine.inbox)) == (0, 0)


async def test_discarding_lets_the_senders_waiting_for_room_in_or_drops_theirs_too():
    inbox: Inbox[str] = Inbox(2)
    for m in ("old-1", "keep-1"):
        inbox.put_nowait(m)
    done: list[str] = []

    async def put(m: str) -> None:
        await inbox.put(m)
        done.append(m)

    async with trio.open_nursery() as nursery:
        for m in ("old-2", "keep-2", "keep-3"):
            nursery.start_soon(put, m)
            await trio.testing.wait_all_tasks_blocked()
        assert inbox.discard(lambda m: m.startswith("old")) == 2
        await trio.testing.wait_all_tasks_blocked()
        # (Trio runs tasks woken together in any order) keep-3 waits: the queue is full again
        assert sorted(done) == ["keep-2", "old-2"]
        assert [inbox.get_nowait() for _ in range(3)] == ["keep-1", "keep-2", "keep-3"]
