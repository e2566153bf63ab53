"""The embedded host's wait deadlines while its machine's wall clock steps (NTP correcting
it, a VM restored): the host reads the wall clock once and carries it on Trio's clock, so
a step neither stretches a person's wait nor cuts it short (runtime/clocks.py); a restart
reads the wall clock again, so a deadline that passed while the host was down is past."""

from __future__ import annotations

import time

import trio
import trio.testing

from runtime.app.host import Host
from runtime.events import ToolApprovalExpired
from tests.support.approval_tools import clear_ran, ran  # noqa: F401 (fixture)
from tests.test_approval_expiry import EPOCH, agent, results


def wall(step: list[float]):  # type: ignore[no-untyped-def]
    """A machine's wall clock: Trio's (autojump) time since ``EPOCH``, plus ``step[0]``."""
    return lambda: EPOCH + trio.current_time() + step[0]


async def test_a_wall_clock_stepped_back_an_hour_does_not_stretch_a_wait(
    autojump_clock, monkeypatch
):
    step = [0.0]
    monkeypatch.setattr(time, "time", wall(step))
    async with Host.open(log_tap=False) as host:
        events = host.bus.subscribe([ToolApprovalExpired], name="t")
        session = await host.open_session(agent(60), session_id="s")
        await session.run("go")
        step[0] = -3600.0
        await trio.sleep(61)
        expired = events.inbox.get_nowait()
    assert (expired.tool_call_id, expired.reason) == ("D", "timed out")
    assert results(session) == ["the tool call was denied: timed out"]
    assert ran == []


async def test_a_wall_clock_stepped_on_an_hour_does_not_cut_a_wait_short(
    autojump_clock, monkeypatch
):
    step = [0.0]
    monkeypatch.setattr(time, "time", wall(step))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(60), session_id="s")
        await session.run("go")
        step[0] = 3600.0
        await trio.sleep(1)
        second = await host.open_session(agent(60), session_id="t")
        await second.run("go")  # noticed by the timer, whose next wake is due
        await trio.sleep(30)
        assert [c.tool_call_id for c in session.pending] == ["D"]
        assert [c.tool_call_id for c in second.pending] == ["D"]


async def test_a_restart_after_the_deadline_reads_the_wall_clock_again(
    tmp_path, autojump_clock, monkeypatch
):
    step = [0.0]
    monkeypatch.setattr(time, "time", wall(step))
    path = tmp_path / "s.db"
    async with Host.open(store=path, log_tap=False) as host:
        await (await host.open_session(agent(60), session_id="s")).run("go")
    step[0] = 61.0  # the host was down past the deadline
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent(60), session_id="s")
        assert session.pending == ()
        await trio.testing.wait_all_tasks_blocked()
        assert results(session) == ["the tool call was denied: timed out"]


HOUR = 3600.0


def deadline_left(pg_url: str, session) -> float:  # type: ignore[no-untyped-def]
    """The session's wait deadline less PostgreSQL's clock."""
    from tests.test_workers import sql

    ((now,),) = sql(pg_url, "SELECT extract(epoch FROM clock_timestamp())::float8")
    (call,) = [p for p in session.messages[1].content if getattr(p, "awaiting", None)]
    return float(call.awaiting.expires_at) - float(now)


async def test_an_embedded_host_an_hour_behind_on_a_shared_store_sets_the_databases_deadline(
    pg_url, monkeypatch
):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - HOUR)  # this machine's clock
    async with Host.open(store=pg_url, log_tap=False) as host:
        session = await host.open_session(agent(600), session_id="s")
        await session.run("go")
    assert 500 < deadline_left(pg_url, session) <= 600


async def test_an_embedded_host_an_hour_ahead_on_a_shared_store_keeps_anothers_wait(
    pg_url, monkeypatch
):
    async with Host.open(store=pg_url, log_tap=False) as host:  # a host whose clock is right
        await (await host.open_session(agent(600), session_id="s")).run("go")
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + HOUR)  # another machine's clock
    async with Host.open(store=pg_url, log_tap=False) as host:
        session = await host.open_session(agent(600), session_id="s")
        await trio.testing.wait_all_tasks_blocked()
        assert [c.tool_call_id for c in session.pending] == ["D"]  # not expired on load
    assert ran == []
