"""An application embedding Axon carelessly: a host cancelled from outside, streams
left unread, misbehaving tools and observers, misused API. Each must end in a clear
typed error or a saved turn, never a hang or a lost turn."""

from __future__ import annotations

import attrs
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from actors.stores.memory import MemoryStore
from runtime import (
    Actor,
    ActorFailed,
    Agent,
    Budget,
    ConfigurationError,
    Host,
    HostClosed,
    InvalidDecision,
    InvalidMeta,
    SessionBusy,
    SessionError,
    TextChunk,
    Tool,
    ToolContext,
    ToolDefinitionError,
    tool,
)
from tests.support.grammar import check_grammar


def stalling_agent() -> Agent:
    """Says "Hello " and then stalls for a minute."""
    steps = [[TextChunk(text="Hello "), Sleep(60), TextChunk(text="world")]]
    return Agent(provider=ScriptedProvider(steps))


async def test_a_host_cancelled_from_outside_mid_turn_saves_the_turn_interrupted(
    autojump_clock,
):
    store = MemoryStore()
    with trio.move_on_after(1):
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(stalling_agent(), session_id="s")
            async with session.stream("hi") as out:
                async for _ in out:
                    pass
    stored = await store.load("s")
    assert out.result is not None and out.result.saved
    assert [m.role for m in stored.messages] == ["user", "assistant"]
    assert stored.messages[1].interrupted and stored.messages[1].text == "Hello "


async def test_a_store_left_by_a_host_cancelled_mid_turn_opens_again_and_runs_on(autojump_clock):
    store = MemoryStore()
    with trio.move_on_after(1):
        async with Host.open(store=store, log_tap=False) as host:
            await (await host.open_session(stalling_agent(), session_id="s")).run("hi")
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider([["again"]])), "s")
        result = await session.run("go on")
    assert result.text == "again"
    assert [m.role for m in session.messages] == ["user", "assistant", "user", "assistant"]


async def closed_host_and_session() -> tuple[Host, object, MemoryStore]:
    """A host left, its store (the application's own) still open, and a session of it."""
    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])), "s")
    return host, session, store


async def test_a_host_that_fails_to_construct_raises_instead_of_waiting_on_its_actors(
    monkeypatch,
):
    # The actors' nursery is shielded from the block's cancellation; with no host made
    # to cancel it, an error in the constructor used to leave Host.open waiting forever.
    def refuse(self: Host, *args: object, **kwargs: object) -> None:
        raise RuntimeError("constructor refused")

    monkeypatch.setattr(Host, "__init__", refuse)
    with pytest.raises(RuntimeError, match="constructor refused"):
        async with Host.open(store=MemoryStore()):
            pass


async def test_opening_a_session_on_a_closed_host_raises_host_closed():
    host, session, _ = await closed_host_and_session()
    with pytest.raises(HostClosed):
        await host.open_session(session.agent, "other")


async def test_a_turn_on_a_session_of_a_closed_host_raises_host_closed_and_stores_nothing():
    _, session, store = await closed_host_and_session()
    with pytest.raises(HostClosed):
        await session.run("hello")
    assert await store.load("s") is None


async def test_starting_an_actor_on_a_closed_host_raises_host_closed():
    host, _, _ = await closed_host_and_session()
    with pytest.raises(HostClosed):
        await host.start_actor(Actor(name="late"))


async def noop() -> str:
    """Does nothing."""
    return ""


@pytest.mark.parametrize("name", ["my tool", "a.b", "naïve", "x" * 65])
def test_a_tool_name_the_providers_refuse_is_refused_when_the_tool_is_made(name):
    with pytest.raises(ToolDefinitionError, match="1-64 letters, digits"):
        tool(noop, name=name)


def test_a_lambda_is_refused_as_a_tool_without_a_name():
    with pytest.raises(ToolDefinitionError, match="'<lambda>'"):
        tool(lambda: "")


def test_a_client_tool_name_the_providers_refuse_is_refused():
    with pytest.raises(ToolDefinitionError, match="1-64 letters, digits"):
        Tool.client("pick a date", {"type": "object"})


def test_an_agent_whose_name_cannot_be_a_tool_name_says_so_in_as_tool():
    agent = Agent(name="my helper", provider=ScriptedProvider([["hi"]]))
    with pytest.raises(ToolDefinitionError, match="'my helper'"):
        agent.as_tool()


async def read_after_a_stall(session, stall: float) -> tuple[list, object]:
    """A consumer that stops reading after its first chunk for ``stall`` seconds."""
    chunks: list = []
    async with session.stream("hi") as out:
        async for chunk in out:
            chunks.append(chunk)
            if len(chunks) == 1:
                await trio.sleep(stall)
    return chunks, out.result


async def test_a_deadline_while_the_consumer_stalls_a_full_pipeline_still_ends_its_stream(
    autojump_clock,
):
    # 50,000 deltas fill every inbox of the pipeline; the deadline passes while the
    # consumer sleeps, and the turn's end must still reach it (it waited for ever).
    agent = Agent(provider=ScriptedProvider([["w " * 50_000]]), budget=Budget(deadline=30))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        with trio.fail_after(1000):  # (it hung: the consumer waited for ever)
            chunks, result = await read_after_a_stall(session, 100)
    assert (result.finish_reason, result.budget) == ("budget", "deadline")
    check_grammar(chunks)


class StuckObserver(Actor):
    """An observer written carelessly: no ``overflow`` of its own, and a handler that
    never returns (an HTTP call without a timeout)."""

    subscribes_to = Actor.ALL
    inbox_capacity = 2

    async def handle(self, message) -> None:
        await trio.sleep_forever()


async def test_an_observer_that_sets_no_overflow_never_stalls_a_turn(autojump_clock):
    async with Host.open(log_tap=False, drain_timeout=0) as host:
        await host.start_actor(StuckObserver())
        session = await host.open_session(Agent(provider=ScriptedProvider([["a b c d"]])))
        with trio.fail_after(1000):  # (it hung: publishing waited for room for ever)
            result = await session.run("hi")
    assert result.text == "a b c d"


def test_an_actor_that_subscribes_to_nothing_keeps_the_blocking_inbox():
    assert Actor(name="worker").inbox.policy == "block"


class CannotConnect(Actor):
    async def on_start(self) -> None:
        raise ConnectionRefusedError("metrics backend down")


async def test_an_actor_that_never_starts_makes_start_actor_raise_actor_failed(autojump_clock):
    async with Host.open(log_tap=False) as host:
        with pytest.raises(ActorFailed, match=r"'exporter'.*metrics backend down"):
            await host.start_actor(CannotConnect(name="exporter"))


@tool(needs_approval=True)
async def pay(amount: int) -> str:
    """Pay an amount."""
    return f"paid {amount}"


async def waiting_payment(host: Host):
    """A session whose turn waits for the approval of a payment."""
    agent = Agent(provider=ScriptedProvider([[*tool_call("pay", {"amount": 5})], ["ok"]]))
    session = await host.open_session(attrs.evolve(agent, tools=(pay,)))
    await session.run("pay")
    return session


@pytest.mark.parametrize("approved", ["no", "false", 0, 1])
async def test_an_approval_answered_with_anything_but_a_bool_is_refused(approved):
    async with Host.open(log_tap=False) as host:
        session = await waiting_payment(host)
        with pytest.raises(InvalidDecision, match="approved=True or approved=False"):
            await session.respond(session.pending[0].approval_id, approved=approved)
        assert not session.pending[0].decided


async def test_a_denial_whose_reason_is_not_text_is_refused():
    async with Host.open(log_tap=False) as host:
        session = await waiting_payment(host)
        with pytest.raises(InvalidDecision, match="reason"):
            await session.respond(session.pending[0].approval_id, approved=False, reason=5)


async def test_a_turn_whose_runner_crashes_raises_actor_failed_instead_of_hanging(
    autojump_clock, monkeypatch
):
    from actors.turn.runner import TurnRunner

    def broken(self, run):
        raise RuntimeError("a bug in the turn runner")

    monkeypatch.setattr(TurnRunner, "_open_turn", broken)
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
        with trio.fail_after(1000), pytest.raises(ActorFailed, match="without a result"):
            await session.run("hello")


@pytest.mark.parametrize("tools", [noop, tool(noop), "noop"])
def test_tools_given_as_one_tool_instead_of_a_list_are_refused_saying_so(tools):
    with pytest.raises(ConfigurationError, match=r"tools=\[...\]"):
        Agent(provider=ScriptedProvider([["hi"]]), tools=tools)


def test_a_model_name_given_as_the_provider_is_refused_naming_model():
    with pytest.raises(ConfigurationError, match="model='openai:gpt-4o-mini'"):
        Agent(provider="openai:gpt-4o-mini")


def test_a_budget_that_is_not_a_budget_is_refused():
    with pytest.raises(ConfigurationError, match=r"Budget\(max_steps=3\)"):
        Agent(provider=ScriptedProvider([["hi"]]), budget={"max_steps": 3})


@tool
async def fails_in_a_nursery() -> str:
    """Fails in a task of its own nursery."""
    async with trio.open_nursery():
        raise RuntimeError("the index is not built")


async def test_a_tool_failing_inside_its_own_nursery_reports_the_error_not_the_group():
    steps = [[*tool_call("fails_in_a_nursery", {})], ["done"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[fails_in_a_nursery])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        result = await session.run("go")
    error = result.tool_messages[0].error
    assert error == "tool fails_in_a_nursery raised RuntimeError: the index is not built"


async def test_iterating_a_stream_never_entered_raises_instead_of_waiting_for_ever(
    autojump_clock,
):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
        with trio.fail_after(1000), pytest.raises(SessionError, match="async with"):
            async for _ in session.stream("hello"):
                pass


async def test_entering_a_stream_a_second_time_raises_and_leaves_the_session_free():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
        out = session.stream("hello")
        async with out:
            pass
        with pytest.raises(SessionError, match=r"session.stream\(...\) again"):
            async with out:
                pass
        assert not session.busy


@tool
async def asks_its_own_session(context: ToolContext) -> str:
    """Runs a turn of the session that called it."""
    return (await context.deps.run("inner")).text


async def test_a_tool_running_a_turn_of_its_own_session_fails_at_once_not_at_its_timeout(
    autojump_clock,
):
    steps = [[*tool_call("asks_its_own_session", {})], ["done"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[asks_its_own_session], on_busy="enqueue")
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        session.deps = session
        start = trio.current_time()
        result = await session.run("go")
    assert "its own session" in result.tool_messages[0].error
    assert trio.current_time() == start  # (it waited for the tool's 60 s timeout)


class BrokenObserver(Actor):
    subscribes_to = Actor.ALL

    async def handle(self, message) -> None:
        raise ValueError("a bug in the plug-in")


async def test_an_observer_crash_is_logged_with_its_traceback(autojump_clock):
    from structlog.testing import capture_logs

    with capture_logs() as logs:
        async with Host.open(log_tap=False, drain_timeout=0) as host:
            await host.start_actor(BrokenObserver(name="broken"))
            session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
            await session.run("hello")
    crash = next(line for line in logs if line["event"] == "actor.crashed")
    text = crash.get("exception") or ""
    assert 'raise ValueError("a bug in the plug-in")' in text and "in handle" in text


@pytest.mark.parametrize("meta", [{"tags": {"a", "b"}}, {1: "one"}, ["not", "a", "dict"]])
async def test_meta_that_cannot_be_stored_is_refused_when_given_not_when_saved(meta):
    async with Host.open(log_tap=False) as host:
        with pytest.raises(InvalidMeta):
            await host.open_session(Agent(provider=ScriptedProvider([["hi"]])), meta=meta)


async def test_meta_that_cannot_be_stored_is_refused_by_update_meta_and_nothing_changes():
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
        with pytest.raises(InvalidMeta, match="not JSON"):
            session.update_meta({"client": object()})
        result = await session.run("hello")
    assert result.saved and dict(session.meta) == {}


async def test_closing_a_session_while_its_turn_runs_raises_and_the_turn_goes_on(autojump_clock):
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(stalling_agent())
        with trio.fail_after(1000):  # (the stream never ended: its actors were stopped)
            async with session.stream("hi") as out:
                async for _ in out:
                    with pytest.raises(SessionBusy, match="cancel it"):
                        await session.close()
                    break
    assert out.result is not None and out.result.abort_reason == "consumer left the stream"
