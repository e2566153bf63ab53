"""A worker woken past its lease inside an agent tool's sub-turn: the takeover ran the
sub-turn again and saved its sub-session; the woken worker's sub-turn confirms through
its calling turn, finds the claim lost and is cancelled (``SUB_CALLER_LOST``). Its
aborted sub-turn's save is based on what it read before the pause: nothing of it may
land on the takeover's sub-session. Before, the persister took the conflict for another
writer's turn and rebased the aborted sub-turn onto the takeover's (the sub-session's
saves are not under the calling session's fence)."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from actors.stores.memory import MemoryStore
from runtime import Host
from runtime.agent import sub_session_id
from runtime.events import TurnStarted
from runtime.messages import UserMessage
from tests.support.claims import boss, ran

SUB = sub_session_id("s", "helper", "H")
TAKEOVER = (UserMessage(content="the takeover's sub-turn", id="m-b"),)


class LostInTheSubTurn:
    """A worker's confirm: the calling turn's batch confirms; at the sub-turn's batch
    the worker was paused, the takeover saved the sub-session, and the claim is lost
    (the calling turn cancelled, as ``Worker._confirm_claim`` does)."""

    def __init__(self, store: MemoryStore, stream: Any) -> None:
        self.store = store
        self.stream = stream
        self.asked = 0

    async def __call__(self) -> None:
        self.asked += 1
        if self.asked == 2:
            await self.store.save(SUB, 0, TAKEOVER, expected_version=0)
            self.stream.cancel("lease lapsed before the turn ran a tool")
        await trio.lowlevel.checkpoint()


async def test_a_sub_turn_whose_caller_is_taken_over_saves_nothing_over_the_takeover():
    ran.clear()
    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        started = host.bus.subscribe([TurnStarted], name="t")
        session = await host.open_session(boss(), session_id="s")
        turn = session.stream("go")
        claim = LostInTheSubTurn(store, turn)
        turn.confirm_with(claim)
        async with turn as out:
            async for _ in out:
                pass
        events: list[Any] = []
        started.inbox.drain_nowait(events)
        (sub_turn,) = [e.turn_id for e in events if e.session_id == SUB]
        await trio.testing.wait_all_tasks_blocked()  # the cancelled agent tool is over
        # refused for that run only: the turn taken back here runs the call, and saves
        assert not host.refuses_turn(sub_turn)
    stored = await store.load(SUB)  # (the host closed: every save of it is over)
    assert ran == [] and claim.asked == 2
    assert stored is not None
    assert (stored.version, stored.messages) == (1, TAKEOVER)
