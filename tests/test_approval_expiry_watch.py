"""What the embedded host's expiry timer keeps (``runtime.app.expiry.ExpiryWatch``): one
task for every waiting session, and an entry per session only while its wait is open. A
wait decided or a session deleted leaves the timer at once: kept until its deadline, a
long ``approval_timeout`` filled the timer's ``MAX_WATCHED`` places with waits long over,
and a new wait past them was never timed out while the host ran."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from runtime.app import expiry
from runtime.app.host import Host
from tests.support.approval_tools import clear_ran, ran  # noqa: F401 (fixture)
from tests.test_approval_expiry import agent, results


def tasks() -> int:
    """Every task of this Trio run."""
    count, stack = 0, [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


@pytest.fixture
def one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(expiry, "MAX_WATCHED", 1)


async def test_a_decided_wait_frees_its_place_for_the_next_wait(autojump_clock, one_place):
    async with Host.open(log_tap=False) as host:
        decided = await host.open_session(agent(60), session_id="a")
        first = await decided.run("go")
        await decided.respond(first.pending[0].approval_id, approved=False, reason="no")
        waiting = await host.open_session(agent(60), session_id="b")
        await waiting.run("go")
        await trio.sleep(61)
        assert results(waiting) == ["the tool call was denied: timed out"]


async def test_a_deleted_sessions_wait_frees_its_place_for_the_next_wait(autojump_clock, one_place):
    async with Host.open(log_tap=False) as host:
        await (await host.open_session(agent(60), session_id="a")).run("go")
        await host.delete_session("a")
        waiting = await host.open_session(agent(60), session_id="b")
        await waiting.run("go")
        await trio.sleep(61)
        assert results(waiting) == ["the tool call was denied: timed out"]


async def test_forty_waiting_sessions_hold_one_timer_task_and_one_entry_each_still_open(
    autojump_clock,
):
    async with Host.open(log_tap=False) as host:
        one = agent(3600)
        sessions = [await host.open_session(one, session_id=f"s{i}") for i in range(40)]
        firsts = [await sessions[0].run("go")]
        await trio.testing.wait_all_tasks_blocked()
        one_waits = tasks()  # the timer's task is one of them
        firsts += [await s.run("go") for s in sessions[1:]]
        await trio.testing.wait_all_tasks_blocked()
        assert (tasks(), len(host.expiry._due)) == (one_waits, 40)
        for session, first in list(zip(sessions, firsts, strict=True))[:20]:
            await session.respond(first.pending[0].approval_id, approved=False, reason="no")
        for session in sessions[20:30]:
            await host.delete_session(session.id)
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(host.expiry._due) == sorted(s.id for s in sessions[30:])
        await trio.sleep(3601)
        await trio.testing.wait_all_tasks_blocked()
        assert (tasks(), host.expiry._due) == (one_waits, {})
    assert ran == []
