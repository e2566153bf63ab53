"""A worker's turn confirms its claim before each batch of tools (``TurnCancel.confirm``,
the worker's lease check): a process paused past its lease and woken after a takeover
runs no tool the takeover ran. An agent tool's sub-turn (``Agent.as_tool``) runs its own
tools in a turn of its own: it confirms through the calling turn's confirm, so a worker
woken inside a sub-turn runs no sub-agent tool either. Before, the sub-turn had no
confirm: its tools ran whatever the calling turn's claim said."""

from __future__ import annotations

from runtime import Host
from tests.support.claims import Claim, boss, ran


async def test_a_sub_turn_confirms_through_its_calling_turn_and_runs_no_tool_once_it_is_lost():
    ran.clear()
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(boss(), session_id="s")
        turn = session.stream("go")
        claim = Claim(turn, holds=1)  # the boss's batch (the agent tool) runs; then lost
        turn.confirm_with(claim)
        async with turn as out:
            async for _ in out:
                pass
    assert ran == []
    assert claim.asked == 2  # the boss's batch, then the sub-turn's
    assert out.result is not None and out.result.finish_reason == "aborted"


async def test_a_sub_turn_whose_calling_turn_holds_its_claim_runs_its_tools():
    ran.clear()
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(boss(), session_id="s")
        turn = session.stream("go")
        claim = Claim(turn, holds=10)
        turn.confirm_with(claim)
        async with turn as out:
            async for _ in out:
                pass
    assert claim.asked == 2
    assert ran == ["effect"]
    assert out.result is not None and out.result.text == "done"
