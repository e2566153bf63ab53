"""A delta is never held back: not by a buffered burst, not waiting for a later one.

The provider's :class:`~runtime.inbox.Batcher` yields ``hold_rounds`` scheduler rounds
after its first batch and after each ``max_hold`` of parsing, one round per stage a chunk
still has to pass and one more (the last stage and the provider run in the same round, in
either order), so the first delta of a whole body read at once reaches the consumer
before the provider parses on (issue 14: it used to arrive about 10 ms late).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio

from runtime.actor_messages import Batch, Batcher
from runtime.inbox import Inbox
from tests.support.faults import PROVIDERS, a_body, a_end, a_start, a_text, cut_after, oa_text, rig
from tests.support.loopback import Reply


async def _relay(inbox: Inbox, out: Inbox) -> None:
    """A stage like the engine: forwards each batch it takes, without yielding."""
    sender = Batcher(out)
    async for batch in inbox:
        batch.taken = True
        await sender.send_all(list(batch))


async def _collect(inbox: Inbox, got: list[Any]) -> None:
    async for batch in inbox:
        assert isinstance(batch, Batch)
        batch.taken = True
        got.extend(batch)


@pytest.mark.parametrize("rounds, arrived", [(5, ["a"]), (1, [])])
async def test_the_first_item_crosses_four_stages_before_the_producer_goes_on(rounds, arrived):
    # provider -> engine -> runner -> controller -> consumer: four hops after the provider
    inboxes = [Inbox(64) for _ in range(4)]
    got: list[Any] = []
    async with trio.open_nursery() as nursery:
        for a, b in itertools.pairwise(inboxes):
            nursery.start_soon(_relay, a, b)
        nursery.start_soon(_collect, inboxes[-1], got)
        await trio.testing.wait_all_tasks_blocked()
        producer = Batcher(inboxes[0], max_hold=60.0, hold_rounds=rounds)
        await producer.send("a")  # parsing a burst: nothing else yields after this
        seen_before_second = list(got)
        await producer.send("b")
        nursery.cancel_scope.cancel()
    assert seen_before_second == arrived  # one round moves it only one stage


async def test_a_batcher_without_max_hold_never_yields_while_there_is_room():
    inbox = Inbox(4)
    batcher = Batcher(inbox)
    with trio.CancelScope() as scope:
        scope.cancel()  # any checkpoint would raise Cancelled
        await batcher.send("a")
        await batcher.send("b")
    assert inbox.get_nowait() == ["a", "b"]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_deltas_reach_the_consumer_while_the_server_pauses_mid_stream(kind, autojump_clock):
    if kind == "openai":
        full = oa_text("Hello ", "there")
    else:
        full = a_body(a_start(), a_text(0, "Hello ", "there"), a_end())
    async with rig(kind, provider={"timeout": 30.0}) as r:
        r.server.add(Reply(body=full, stall=20.0, stall_after=cut_after(full, '"Hello "')))
        start = trio.current_time()
        seen: list[tuple[str, float]] = []
        async with r.session.stream("hi") as out:
            async for chunk in out:
                if chunk.type == "text-delta":
                    seen.append((chunk.text, trio.current_time() - start))
        assert out.result.text == "Hello there"
    (first, at_first), (second, at_second) = seen
    assert (first, second) == ("Hello ", "there")
    assert at_first < 20.0 <= at_second  # virtual time: "Hello " came during the pause
