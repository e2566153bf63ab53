"""A step longer than ``AXON_RUNNING_MARKER_TTL`` (branch ``markers``, claimttl's
"Left"): another machine's host takes a marker older than the bound for a killed turn's,
so a model call (or tool) running longer than it, with no step save in between, had its
turn settled as interrupted there and its message run a second time while it ran. A
host whose store another process writes (``claims_turns``) now refreshes the marker
every third of the bound while a step's model call or tools run
(``Saving._touching``); any other host writes nothing more."""

from __future__ import annotations

from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import liveness
from runtime.agent import Agent
from runtime.app.host import Host
from runtime.liveness import RUNNING_META, killed_marker
from runtime.tools import tool

TTL = 900.0
CALL = 2000.0  # one model call, longer than twice the bound


def _from_another_machine(marker: dict[str, Any]) -> dict[str, Any]:
    """``marker`` as a host of another machine reads it: its writer unknown there."""
    return {**marker, "writer": "other-machine:" + marker["writer"].split(":", 1)[1]}


@tool(timeout=CALL + 1)
async def slow() -> str:
    """Take a long time."""
    await trio.sleep(CALL)
    return "slept"


async def _long_call(
    tmp_path: Any, monkeypatch: Any, *, claims: bool, in_tool: bool = False
) -> tuple[list[float], Any]:
    """One turn whose single model call takes :data:`CALL` seconds, on a host that
    claims its turns or not; returns the marker times its saves stored, and what another
    machine reads halfway through the call, past the bound: ``None`` (no marker), the
    marker it takes for a killed turn's, or ``{}`` (a live turn's)."""
    monkeypatch.setattr(liveness, "_wall", trio.current_time)
    monkeypatch.setenv(liveness.MARKER_TTL_ENV, str(TTL))
    steps: list[Any] = [[Sleep(CALL), "done"]]
    if in_tool:  # the wait in a tool of step 0 instead
        steps = [[*tool_call("slow", {}, tool_call_id="c0")], ["done"]]
    agent = Agent(provider=ScriptedProvider(steps=steps), tools=[slow])
    marks: list[float] = []
    async with Host.open(store=str(tmp_path / "one.db"), log_tap=False) as host:
        host.claims_turns = claims
        save = host.store.save

        async def recorded(*args: Any, **kwargs: Any) -> int:
            marker = args[3].get(RUNNING_META)
            if isinstance(marker, dict):
                marks.append(marker["at"])
            return await save(*args, **kwargs)

        host.store.save = recorded  # type: ignore[method-assign]
        session = await host.open_session(agent, session_id="s")
        seen: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def look() -> None:
                await trio.sleep(TTL + 100)
                record = await host.store.load("s")
                marker = None if record is None else record.meta.get(RUNNING_META)
                elsewhere = None if marker is None else _from_another_machine(marker)
                seen.append(elsewhere and (killed_marker({RUNNING_META: elsewhere}) or {}))

            nursery.start_soon(look)
            result = await session.run("go")
        assert result.text == "done"
        assert (await host.store.load("s")).meta.get(RUNNING_META) is None
    return marks, seen[0]


async def test_a_model_call_longer_than_the_bound_keeps_its_marker_fresh(
    tmp_path, monkeypatch, autojump_clock
):
    marks, seen = await _long_call(tmp_path, monkeypatch, claims=True)
    assert seen == {}
    assert len(marks) == 1 + int(CALL // (TTL / liveness.TOUCHES_PER_TTL))  # claim + 6


async def test_a_host_that_claims_no_turns_writes_nothing_during_a_step(
    tmp_path, monkeypatch, autojump_clock
):
    marks, seen = await _long_call(tmp_path, monkeypatch, claims=False)
    assert marks == []
    assert seen is None


async def test_a_tool_call_longer_than_the_bound_keeps_its_marker_fresh(
    tmp_path, monkeypatch, autojump_clock
):
    marks, seen = await _long_call(tmp_path, monkeypatch, claims=True, in_tool=True)
    assert seen == {}
    assert len(marks) == 1 + int(CALL // (TTL / liveness.TOUCHES_PER_TTL)) + 1  # + step 0's


async def test_a_claiming_host_cancelled_during_a_long_call_saves_it_interrupted(
    tmp_path, monkeypatch, autojump_clock
):
    """Cut between two refreshes: the turn's end waits for no refresh and saves the
    turn stopped, its marker cleared."""
    monkeypatch.setattr(liveness, "_wall", trio.current_time)
    agent = Agent(provider=ScriptedProvider(steps=[[Sleep(CALL), "done"]]))
    path = str(tmp_path / "one.db")
    with trio.move_on_after(TTL + 100):  # (three refreshes made)
        async with Host.open(store=path, log_tap=False) as host:
            host.claims_turns = True
            session = await host.open_session(agent, session_id="s")
            await session.run("go")
    async with Host.open(store=path, log_tap=False) as again:
        record = await again.store.load("s")
    assert record.meta.get(RUNNING_META) is None
    assert [m.interrupted for m in record.messages if m.role == "assistant"] == [True]


async def test_refreshes_rebased_on_another_hosts_turn_store_each_turn_once(
    tmp_path, monkeypatch, autojump_clock
):
    """Two hosts on one SQLite file: B answers a message while A's long call runs (A's
    refreshes then rebased on B's save): each question and answer stored once."""
    monkeypatch.setattr(liveness, "_wall", trio.current_time)
    path = str(tmp_path / "one.db")
    slow_agent = Agent(provider=ScriptedProvider(steps=[[Sleep(CALL), "A."]]))
    async with Host.open(store=path, log_tap=False) as a, Host.open(store=path, log_tap=False) as b:
        a.claims_turns = True
        session = await a.open_session(slow_agent, session_id="s")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "slow")
            await trio.sleep(100)
            other = await b.open_session(Agent(provider=ScriptedProvider(steps=[["B."]])), "s")
            await other.run("quick")
        record = await a.store.load("s")
    assert [(m.role, m.content if m.role == "user" else m.text) for m in record.messages] == [
        ("user", "quick"), ("assistant", "B."), ("user", "slow"), ("assistant", "A."),
    ]  # fmt: skip
    assert record.meta.get(RUNNING_META) is None
