"""Waits that expire (``Agent(approval_timeout=...)``, docs/approval.md): past the
deadline a waiting call is denied with reason ``timed out`` and the turn goes on, whether
the host is up (its timer) or loads the session later; a person's decision recorded
first stands, and of an expiry and a decision racing exactly one is recorded."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, AlreadyDecided, ConfigurationError, Host, Tool, ToolMessage
from runtime.app.expiry import expire_session
from runtime.events import ToolApprovalDecided, ToolApprovalExpired, TurnFinished
from runtime.messages import Awaiting, ToolCallPart
from runtime.serde import converter
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)

EPOCH = 1_700_000_000.0


def agent(timeout: float | None = 60.0) -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["answered"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file], approval_timeout=timeout)


def trio_wall() -> float:
    """A wall clock that moves with Trio's (autojump) clock."""
    return EPOCH + trio.current_time()


def answer(session) -> str:
    """The text of the session's (one) assistant message."""
    return "".join(getattr(p, "text", "") for p in session.messages[1].content)


def results(session) -> list:
    return [m.error or m.output for m in session.messages if isinstance(m, ToolMessage)]


async def test_the_stored_wait_carries_its_wall_clock_deadline():
    async with Host.open(log_tap=False) as host:
        host.clock = lambda: EPOCH
        session = await host.open_session(agent(60), session_id="s")
        await session.run("go")
        part = session.messages[1].content[0]
    assert part.awaiting.expires_at == EPOCH + 60


async def test_a_wait_without_a_deadline_stores_the_json_it_always_had():
    stored = converter.unstructure(Awaiting(kind="approval", id="a", turn_id="t"))
    assert "expires_at" not in stored
    old = {"tool_call_id": "D", "tool_name": "x", "input": {}, "step": 0, "awaiting": stored}
    assert converter.structure(old, ToolCallPart).awaiting.expires_at is None


@pytest.mark.parametrize("bad", [0, -1, "60", True])
def test_approval_timeout_must_be_a_positive_number(bad):
    with pytest.raises(ConfigurationError, match="approval_timeout"):
        agent(bad)


async def test_the_hosts_timer_denies_an_expired_call_and_the_turn_goes_on(autojump_clock):
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        events = host.bus.subscribe([ToolApprovalExpired], name="t")
        session = await host.open_session(agent(60), session_id="s")
        first = await session.run("go")
        await trio.sleep(59)
        assert [c.tool_call_id for c in session.pending] == ["D"]
        await trio.sleep(2)
        expired = events.inbox.get_nowait()
    assert first.finish_reason == "awaiting-input"
    assert (expired.tool_call_id, expired.reason) == ("D", "timed out")
    assert expired.causation_id == first.pending[0].approval_id
    assert ran == []
    assert results(session) == ["the tool call was denied: timed out"]
    assert answer(session) == "answered"
    assert session.messages[1].id == first.message.id  # the same message went on


async def test_opening_a_session_after_its_deadline_expires_the_wait_and_resumes(tmp_path):
    path = tmp_path / "s.db"
    now = [EPOCH]
    async with Host.open(store=path, log_tap=False) as host:
        host.clock = lambda: now[0]
        session = await host.open_session(agent(60), session_id="s")
        await session.run("go")
    now[0] += 61
    async with Host.open(store=path, log_tap=False) as host:
        host.clock = lambda: now[0]
        events = host.bus.subscribe([ToolApprovalExpired, TurnFinished], name="t")
        session = await host.open_session(agent(60), session_id="s")
        assert session.pending == ()
        assert (await events.inbox.get()).tool_call_id == "D"
        finished = await events.inbox.get()  # the turn resumed, in the background
        assert finished.finish_reason == "stop"
        assert ran == []
        assert results(session) == ["the tool call was denied: timed out"]
        assert answer(session) == "answered"


async def test_a_session_opened_before_its_deadline_keeps_waiting(tmp_path):
    path = tmp_path / "s.db"
    now = [EPOCH]
    async with Host.open(store=path, log_tap=False) as host:
        host.clock = lambda: now[0]
        await (await host.open_session(agent(60), session_id="s")).run("go")
    now[0] += 59
    async with Host.open(store=path, log_tap=False) as host:
        host.clock = lambda: now[0]
        session = await host.open_session(agent(60), session_id="s")
        await trio.testing.wait_all_tasks_blocked()
        assert [c.tool_call_id for c in session.pending] == ["D"]


async def test_a_decision_before_the_deadline_wins(autojump_clock):
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        events = host.bus.subscribe([ToolApprovalExpired], name="t")
        session = await host.open_session(agent(60), session_id="s")
        first = await session.run("go")
        await trio.sleep(30)
        result = await session.respond(first.pending[0].approval_id, approved=True)
        await trio.sleep(120)
        with pytest.raises(trio.WouldBlock):
            events.inbox.get_nowait()
    assert result.text == "answered" and ran == ["/x"]


async def test_an_expiry_racing_a_decision_records_exactly_one():
    now = [EPOCH]
    async with Host.open(log_tap=False) as host:
        host.clock = lambda: now[0]
        decided = host.bus.subscribe([ToolApprovalDecided], name="t")
        the_agent = agent(60)
        session = await host.open_session(the_agent, session_id="s")
        first = await session.run("go")
        now[0] += 61
        outcome: dict[str, object] = {}

        async def human() -> None:
            try:
                outcome["human"] = await session.decide(first.pending[0].approval_id, approved=True)
            except AlreadyDecided:
                outcome["human"] = None

        async def timer() -> None:
            outcome["expiry"] = await expire_session(host, "s", the_agent)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(human)
            nursery.start_soon(timer)
        await trio.testing.wait_all_tasks_blocked()
        seen = []
        while True:
            try:
                seen.append(decided.inbox.get_nowait())
            except trio.WouldBlock:
                break
        record = await host.store.load("s")
    assert len(seen) == 1
    assert (outcome["human"] is None) == outcome["expiry"]
    stored = record.messages[1].content[0].awaiting
    assert stored.approved is seen[0].approved


async def test_a_wait_stored_without_a_deadline_never_expires(tmp_path):
    path = tmp_path / "s.db"
    now = [EPOCH]
    async with Host.open(store=path, log_tap=False) as host:
        host.clock = lambda: now[0]
        await (await host.open_session(agent(None), session_id="s")).run("go")
    now[0] += 10**9
    async with Host.open(store=path, log_tap=False) as host:
        host.clock = lambda: now[0]
        session = await host.open_session(agent(60), session_id="s")  # the stored wait rules
        await trio.testing.wait_all_tasks_blocked()
        assert [c.tool_call_id for c in session.pending] == ["D"]


locate = Tool.client("locate", {"type": "object", "properties": {}}, "Where the user is.")


async def test_an_expired_client_tool_gets_timed_out_as_its_error(autojump_clock):
    steps = [[*tool_call("locate", {}, tool_call_id="L")], ["answered"]]
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        the_agent = Agent(provider=ScriptedProvider(steps), tools=[locate], approval_timeout=5)
        session = await host.open_session(the_agent, session_id="s")
        await session.run("go")
        await trio.sleep(6)
    assert results(session) == ["timed out"]
    assert answer(session) == "answered"


async def test_the_timer_resumes_a_session_evicted_while_it_waited(autojump_clock):
    async with Host.open(log_tap=False, idle_ttl=10) as host:
        host.clock = trio_wall
        session = await host.open_session(agent(60), session_id="s")
        await session.run("go")
        await trio.sleep(20)
        assert not session.loaded
        await trio.sleep(45)  # the deadline (60) passes; the next idle eviction (70) not
        assert results(session) == ["the tool call was denied: timed out"]
        assert answer(session) == "answered"


async def test_a_workers_host_leaves_an_expired_wait_alone(tmp_path, autojump_clock):
    """On a worker the turn queue owns a turn's resumption: its host neither watches a
    wait nor expires one it loads, so no resume runs outside the queue."""
    path = tmp_path / "s.db"
    now = [EPOCH]
    async with Host.open(store=path, log_tap=False) as host:
        host.expects_other_writers = True
        host.clock = lambda: now[0]
        session = await host.open_session(agent(60), session_id="s")
        await session.run("go")
        now[0] += 61
        await trio.sleep(120)  # a timer, were there one, would have fired
        assert [c.tool_call_id for c in session.pending] == ["D"]
    async with Host.open(store=path, log_tap=False) as host:
        host.expects_other_writers = True
        host.clock = lambda: now[0]
        session = await host.open_session(agent(60), session_id="s")
        assert [c.tool_call_id for c in session.pending] == ["D"]
    assert ran == []
