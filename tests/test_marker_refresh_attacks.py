"""Attacks on the marker refreshes of a claiming host's long step (branch ``markers``,
``Saving._touching``), branch ``attackmarkers``."""

from __future__ import annotations

from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from actors.turn.saving import SAVE_TIMEOUT
from runtime import Budget, Hooks, liveness
from runtime.agent import Agent
from runtime.app.host import Host
from runtime.events import ConcurrentWrite
from runtime.liveness import RUNNING_META
from runtime.tools import tool
from tests.test_regenerate_conflicts import _Gate, _regenerate_held
from tests.test_twin_first_meeting import _no_registry

TTL = 900.0
CALL = 2000.0


@tool(timeout=CALL + 1)
async def slow() -> str:
    """Take a long time."""
    await trio.sleep(CALL)
    return "slept"


@tool(needs_approval=True)
async def risky() -> str:
    """Needs a person's yes."""
    return "done"


async def test_a_long_tool_beside_a_call_held_for_approval_keeps_its_marker(
    tmp_path, monkeypatch, autojump_clock
):
    """A step whose calls are a held one and a long one: while the long one runs, the
    turn goes on (its step save comes after it), so a refresh stores the marker fresh;
    it cleared it (the held call made it a save "the turn may end at"), and the session
    looked idle to another process while its tool ran."""
    monkeypatch.setattr(liveness, "_wall", trio.current_time)
    monkeypatch.setenv(liveness.MARKER_TTL_ENV, str(TTL))
    steps: list[Any] = [
        [*tool_call("risky", {}, tool_call_id="c0"), *tool_call("slow", {}, tool_call_id="c1")]
    ]
    agent = Agent(provider=ScriptedProvider(steps=steps), tools=[slow, risky])
    async with Host.open(store=str(tmp_path / "one.db"), log_tap=False) as host:
        host.claims_turns = True
        session = await host.open_session(agent, session_id="s")
        seen: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def look() -> None:
                await trio.sleep(TTL)  # (the tool runs: two refreshes made)
                record = await host.store.load("s")
                seen.append(record.meta.get(RUNNING_META))

            nursery.start_soon(look)
            result = await session.run("go")
        record = await host.store.load("s")
    assert result.finish_reason == "awaiting-input"
    assert record.meta.get(RUNNING_META) is None  # (the step's save: the turn waits)
    assert seen[0] is not None
    assert seen[0]["at"] >= TTL - TTL / liveness.TOUCHES_PER_TTL


async def test_a_regenerate_after_a_slow_save_is_refused_when_another_turn_came_after(
    tmp_path, monkeypatch, autojump_clock
):
    """The turn before the regenerate's save outlived it (a slow store: past its bound
    and the next turn's sync's); the regenerate's first save adopts it after the cut.
    That adoption emptied ``SessionState.cut`` (any save written in place did), so the
    regenerate's save, rebased on another host's turn, stored the old turn and the new
    one after the other's: the question twice. (The hosts keep no writers' registry
    here, as hosts that have not met yet: with it, A claims its regenerate before B's
    turn, tests/test_regenerate_conflicts.py.)"""
    monkeypatch.setattr(Host, "_join_writers", _no_registry)
    gate = _Gate()
    agent = Agent(
        provider=ScriptedProvider(steps=[["A."]] * 4), hooks=Hooks(on_step_start=gate.hold)
    )
    path = str(tmp_path / "one.db")
    async with Host.open(store=path, log_tap=False) as a, Host.open(store=path, log_tap=False) as b:
        save, slow = a.store.save, [False]

        async def slowly(*args: Any, **kwargs: Any) -> int:
            if slow[0]:
                slow[0] = False
                await trio.sleep(3 * SAVE_TIMEOUT)
            return await save(*args, **kwargs)

        a.store.save = slowly  # type: ignore[method-assign]
        session = await a.open_session(agent, session_id="s")
        await session.run("q1")
        slow[0] = True
        await session.run("q2")  # (its save still running as the turn ends)

        async def answer_after_the_slow_save() -> None:
            await trio.sleep(3 * SAVE_TIMEOUT)  # (the slow save landed)
            other = await b.open_session(Agent(provider=ScriptedProvider(steps=[["B."]])), "s")
            await other.run("q3")

        result = await _regenerate_held(session, gate, answer_after_the_slow_save)
        record = await a.store.load("s")
    stored = [(m.role, m.content if m.role == "user" else m.text) for m in record.messages]
    assert not result.saved
    assert result.error.kind == "AnsweredElsewhere"
    assert stored == [
        ("user", "q1"), ("assistant", "A."),
        ("user", "q2"), ("assistant", "A."),
        ("user", "q3"), ("assistant", "B."),
    ]  # fmt: skip


async def test_a_deadline_cuts_a_long_call_whose_refresh_waits_for_a_full_observer(
    tmp_path, monkeypatch, autojump_clock
):
    """A refresh that adopts a save rebased on another host's turn tells the bus
    (``ConcurrentWrite``); a ``block`` subscriber that stopped reading held that
    publish. It ran shielded, and the step's end waits, shielded, for the refresh: the
    turn's deadline (a cancel, a closing host) never ended it while the observer slept."""
    monkeypatch.setattr(liveness, "_wall", trio.current_time)
    monkeypatch.setenv(liveness.MARKER_TTL_ENV, str(TTL))
    every = TTL / liveness.TOUCHES_PER_TTL
    agent = Agent(
        provider=ScriptedProvider(steps=[[Sleep(CALL), "A."]]),
        budget=Budget(deadline=2 * every + 100),  # (after the second refresh)
    )
    path = str(tmp_path / "one.db")
    async with Host.open(store=path, log_tap=False) as a, Host.open(store=path, log_tap=False) as b:
        a.claims_turns = True
        full = a.bus.subscribe([ConcurrentWrite], policy="block", capacity=1)
        full.inbox.put_nowait(None)  # (an observer that stopped reading)
        session = await a.open_session(agent, session_id="s")
        ended = trio.Event()
        results: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def slow_turn() -> None:
                results.append(await session.run("slow"))
                ended.set()

            nursery.start_soon(slow_turn)
            await trio.sleep(every / 3)
            other = await b.open_session(Agent(provider=ScriptedProvider(steps=[["B."]])), "s")
            await other.run("quick")  # (the first refresh is rebased on it)
            with trio.move_on_after(CALL):
                await ended.wait()
            finished = ended.is_set()
            while not ended.is_set():  # (the observer reads again: the test ends)
                full.inbox.poll(None)
                await trio.sleep(1)
    assert finished
    assert results[0].finish_reason == "budget"
