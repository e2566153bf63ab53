"""The embedded host's wait deadlines across a suspend of its machine (a laptop's lid
closed): Trio's clock (``CLOCK_MONOTONIC``) stops while the machine sleeps, the time the
deadline is stored in does not, so the host's clock counts the suspend
(``runtime.clocks.suspended``: ``CLOCK_BOOTTIME`` less ``CLOCK_MONOTONIC``) and its timer
sleeps no longer than ``runtime.app.expiry.NAP`` at a time. A suspend is faked here by
stepping what ``suspended`` says, with Trio's clock autojumping."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from runtime import clocks
from runtime.app.expiry import NAP
from runtime.app.host import Host
from runtime.errors import WaitExpired
from tests.support.approval_tools import clear_ran, ran  # noqa: F401 (fixture)
from tests.test_approval_expiry import agent, results

HOUR = 3600.0


@pytest.fixture
def asleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """``asleep[0]``: the seconds the machine has been suspended (a test steps it)."""
    slept = [0.0]
    monkeypatch.setattr(clocks, "suspended", lambda: slept[0])
    return slept


async def test_a_decision_after_a_suspend_past_the_deadline_is_refused(autojump_clock, asleep):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(60), session_id="s")
        first = await session.run("go")
        await trio.sleep(10)
        asleep[0] = HOUR  # the lid closed for an hour, 50 s before the deadline
        with pytest.raises(WaitExpired):
            await session.respond(first.pending[0].approval_id, approved=True)
        await trio.testing.wait_all_tasks_blocked()
        assert results(session) == ["the tool call was denied: timed out"]
    assert ran == []


async def test_the_timer_expires_a_wait_soon_after_a_suspend_past_its_deadline(
    autojump_clock, asleep
):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(60), session_id="s")
        await session.run("go")
        await trio.sleep(10)
        asleep[0] = HOUR
        await trio.sleep(NAP + 1)  # 21 s of Trio's clock: 39 before its deadline by it
        assert session.pending == ()
        assert results(session) == ["the tool call was denied: timed out"]
