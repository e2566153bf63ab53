"""Busy sessions (runtime/busy.py, docs/busy.md): what a new user message does while a
turn runs, under each strategy: ``reject``, ``enqueue``, ``interrupt``, ``steer``."""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors.providers.anthropic import map_messages as anthropic_messages
from actors.providers.openai import map_messages as openai_messages
from actors.providers.openai_responses import map_messages as responses_messages
from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import Agent, ConfigurationError, Hooks, Host, SessionBusy, ToolMessage, tool
from runtime.busy import INTERRUPTED_BY_NEW
from runtime.events import ToolApprovalDecided, TurnQueued, TurnSteered
from runtime.history import repair
from runtime.messages import AssistantMessage, UserMessage

held = {"open": trio.Event(), "release": trio.Event()}


@tool
async def hold() -> str:
    """Wait until the test lets go (holds a step open)."""
    held["open"].set()
    await held["release"].wait()
    return "held"


@tool
async def look() -> str:
    """Look around."""
    return "looked"


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


class Script:
    """Model calls answered in order, whatever turn asks (the turns of one session run
    one after another); each request is kept."""

    def __init__(self, *steps: list) -> None:
        self.steps = deque(steps)
        self.requests: list[Any] = []

    def __call__(self, request: Any) -> list:
        self.requests.append(request)
        return self.steps.popleft()


def agent_with(script: Script, on_busy: str = "reject") -> Agent:
    return Agent(
        provider=ScriptedProvider(responder=script),
        tools=[hold, look, delete_file],
        on_busy=on_busy,  # type: ignore[arg-type]
    )


def holding(call_id: str = "H") -> list:
    return [*tool_call("hold", {}, tool_call_id=call_id)]


def looking(call_id: str = "L") -> list:
    return [*tool_call("look", {}, tool_call_id=call_id)]


def drain(subscription: Any) -> list:
    """The events a subscription holds."""
    out = []
    while True:
        try:
            out.append(subscription.inbox.get_nowait())
        except trio.WouldBlock:
            return out


def kinds(messages: Any) -> list[str]:
    return [type(m).__name__.removesuffix("Message") for m in messages]


async def run_in(nursery: trio.Nursery, session: Any, text: str, into: dict) -> None:
    """Start ``session.run(text)`` in ``nursery``, its result (or error) into ``into``."""

    async def go() -> None:
        try:
            into[text] = await session.run(text)
        except Exception as exc:
            into[text] = exc

    nursery.start_soon(go)


@asynccontextmanager
async def first_turn_held(
    agent: Agent, first: str
) -> AsyncIterator[tuple[Host, Any, trio.Nursery, dict]]:
    """Session ``s`` of ``agent`` with turn ``first`` started in a nursery and held in its
    ``hold`` tool: the block runs while it is held; the turns started in the nursery have
    ended (their results in the dict, by input) when the block's ``async with`` is left."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, first, results)
            await held["open"].wait()
            yield host, session, nursery, results


async def test_reject_refuses_a_message_while_a_turn_runs():
    script = Script(holding(), ["first done"])
    async with first_turn_held(agent_with(script), "first") as (_, session, _, results):
        with pytest.raises(SessionBusy):
            await session.run("second")
        held["release"].set()
    assert results["first"].text == "first done"
    assert [m.text for m in session.messages if isinstance(m, UserMessage)] == ["first"]


async def test_enqueue_runs_the_new_turn_after_the_running_one_with_its_own_result():
    script = Script(holding(), ["first done"], ["second done"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "enqueue"), session_id="s")
        results: dict = {}
        queued: list = []
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            await run_in(nursery, session, "second", results)
            await trio.testing.wait_all_tasks_blocked()
            queued.append(session.queued)
            held["release"].set()
    first, second = results["first"], results["second"]
    assert queued == [1]
    assert (first.text, second.text) == ("first done", "second done")
    assert first.turn_id != second.turn_id
    assert kinds(session.messages) == ["User", "Assistant", "Tool", "User", "Assistant"]
    # the second turn's model call saw the whole first turn
    assert kinds(script.requests[2].messages) == kinds(session.messages)


async def test_enqueue_keeps_arrival_order_for_several_waiting_turns():
    script = Script(holding(), ["1 done"], ["2 done"], ["3 done"])
    held_turn = first_turn_held(agent_with(script, "enqueue"), "1")
    async with held_turn as (_, session, nursery, results):
        for text in ("2", "3"):
            await run_in(nursery, session, text, results)
            await trio.testing.wait_all_tasks_blocked()
        assert session.queued == 2
        held["release"].set()
    assert [results[t].text for t in ("1", "2", "3")] == ["1 done", "2 done", "3 done"]
    users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert users == ["1", "2", "3"]


async def test_a_waiting_turn_whose_caller_leaves_gives_its_place_up():
    script = Script(holding(), ["1 done"], ["3 done"])
    held_turn = first_turn_held(agent_with(script, "enqueue"), "1")
    async with held_turn as (_, session, nursery, results):
        with trio.CancelScope() as leaving:
            nursery.start_soon(lambda: _cancel_when_queued(session, leaving))
            await session.run("2")
        await run_in(nursery, session, "3", results)
        await trio.testing.wait_all_tasks_blocked()
        held["release"].set()
    assert leaving.cancelled_caught
    assert [results[t].text for t in ("1", "3")] == ["1 done", "3 done"]
    assert [m.text for m in session.messages if isinstance(m, UserMessage)] == ["1", "3"]
    assert session.queued == 0


async def _cancel_when_queued(session: Any, scope: trio.CancelScope) -> None:
    await trio.testing.wait_all_tasks_blocked()
    assert session.queued == 1
    scope.cancel()


async def test_interrupt_cancels_the_running_turn_saved_interrupted_and_runs_the_new_one():
    script = Script(holding(), ["second done"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "interrupt"), session_id="s")
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            second = await session.run("second")
        record = await host.store.load("s")
    first = results["first"]
    assert first.finish_reason == "aborted" and first.abort_reason == INTERRUPTED_BY_NEW
    assert second.text == "second done"
    assert record is not None
    assert kinds(record.messages) == ["User", "Assistant", "Tool", "User", "Assistant"]
    cut = record.messages[1]
    assert isinstance(cut, AssistantMessage) and cut.interrupted
    assert "interrupted" in (record.messages[2].error or "")  # the call never completed


async def test_interrupt_with_two_messages_waiting_lets_the_newest_one_answer():
    script = Script(holding(), ["third done"])
    ending = trio.Event()

    async def slow_end(event: Any) -> None:  # the first turn takes its time to end
        if not ending.is_set():
            await ending.wait()

    agent = attrs.evolve(agent_with(script, "interrupt"), hooks=Hooks(on_turn_finish=slow_end))
    async with first_turn_held(agent, "first") as (_, session, nursery, results):
        await run_in(nursery, session, "second", results)
        await trio.testing.wait_all_tasks_blocked()  # the first turn is ending
        await run_in(nursery, session, "third", results)
        await trio.testing.wait_all_tasks_blocked()
        queued = session.queued
        ending.set()
    assert queued == 2
    reasons = [(results[t].finish_reason, results[t].abort_reason) for t in ("first", "second")]
    assert reasons == [("aborted", INTERRUPTED_BY_NEW)] * 2
    assert results["third"].text == "third done"
    assert len(script.requests) == 2  # the second turn was cut before its model call
    users = [m.text for m in session.messages if isinstance(m, UserMessage)]
    assert users == ["first", "second", "third"]  # every message is kept


async def test_steer_arriving_during_step_1_is_seen_before_step_2s_model_call():
    script = Script(looking(), holding(), ["answer to both"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        steering = host.bus.subscribe([TurnSteered])
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()  # step 1 is open: its tool runs
            assert len(script.requests) == 2

            async def steer() -> None:
                async with session.stream("also this") as out:
                    results["steered"] = out
                    chunks = [c async for c in out]
                results["steered chunks"] = chunks

            nursery.start_soon(steer)
            await trio.testing.wait_all_tasks_blocked()
            assert len(script.requests) == 2  # nothing more: it waits for the boundary
            held["release"].set()
        record = await host.store.load("s")
        steered = drain(steering)
    first, out = results["first"], results["steered"]
    assert first.text == "answer to both" and first.steps == 3
    assert out.steered and out.turn_id == first.turn_id
    assert out.result is first and results["steered chunks"] == []
    # step 2's request: the steered message after step 1's tool result, before step 2
    seen = script.requests[2].messages
    assert kinds(seen) == ["User", "Assistant", "Tool", "Tool", "User", "Assistant"]
    assert seen[4].text == "also this" and seen[5].content == ()
    # stored as the model saw it: each user input with its own assistant message
    assert record is not None
    assert kinds(record.messages) == kinds(seen)
    answer = record.messages[5]
    assert isinstance(answer, AssistantMessage) and answer.text == "answer to both"
    assert {p.step for p in answer.content} == {2}
    assert first.message == answer and first.new_messages == record.messages
    assert [(e.step, e.message_id) for e in steered] == [(2, record.messages[4].id)]


async def test_a_steered_message_the_turn_ends_without_taking_starts_a_new_turn(autojump_clock):
    script = Script([Sleep(10), "first done"], ["second done"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await trio.sleep(1)  # the last step is streaming
            await run_in(nursery, session, "second", results)
    first, second = results["first"], results["second"]
    assert (first.text, second.text) == ("first done", "second done")
    assert first.turn_id != second.turn_id
    assert kinds(session.messages) == ["User", "Assistant", "User", "Assistant"]
    assert [m.text for m in session.messages if isinstance(m, UserMessage)] == [
        "first",
        "second",
    ]


async def test_a_steered_message_waits_for_a_turn_that_runs_a_long_tool(autojump_clock):
    script = Script(holding(), ["done"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        queueing = host.bus.subscribe([TurnQueued])
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            await run_in(nursery, session, "second", results)
            await trio.sleep(50)  # long in the tool: the message still waits
            assert "second" not in results and len(script.requests) == 1
            held["release"].set()
        queued = drain(queueing)
    assert results["second"] is results["first"]  # it joined that turn
    assert queued == []


@pytest.mark.parametrize("on_busy", ["reject", "enqueue", "interrupt", "steer"])
async def test_a_message_while_a_turn_waits_for_approval_supersedes_it(on_busy):
    deleting = [*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]
    script = Script(deleting, ["new answer"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, on_busy), session_id="s")
        deciding = host.bus.subscribe([ToolApprovalDecided])
        first = await session.run("delete it")
        second = await session.run("never mind")
        decided = drain(deciding)
    assert first.finish_reason == "awaiting-input"
    assert second.text == "new answer" and not getattr(second, "steered", False)
    denial = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert denial.error == "the tool call was denied: superseded"
    assert [(e.approved, e.reason) for e in decided] == [(False, "superseded")]
    assert session.pending == ()


@pytest.mark.parametrize("on_busy", ["enqueue", "steer"])
async def test_a_message_during_a_turn_that_then_suspends_supersedes_its_wait(on_busy):
    asks = [
        *tool_call("hold", {}, tool_call_id="H"),
        *tool_call("delete_file", {"path": "/x"}, tool_call_id="D"),
    ]
    script = Script(asks, ["new answer"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, on_busy), session_id="s")
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "delete it", results)
            await held["open"].wait()  # the step that asks runs its other tool
            await run_in(nursery, session, "never mind", results)
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
    first, second = results["delete it"], results["never mind"]
    assert first.finish_reason == "awaiting-input"
    assert second.text == "new answer" and second.turn_id != first.turn_id
    denial = next(m for m in session.messages if getattr(m, "tool_call_id", "") == "D")
    assert denial.error == "the tool call was denied: superseded"
    assert kinds(session.messages) == ["User", "Assistant", "Tool", "Tool", "User", "Assistant"]
    assert session.pending == ()


async def test_interrupt_cancels_a_turn_before_it_suspends_and_nothing_waits():
    asks = [
        *tool_call("hold", {}, tool_call_id="H"),
        *tool_call("delete_file", {"path": "/x"}, tool_call_id="D"),
    ]
    script = Script(asks, ["new answer"])
    held_turn = first_turn_held(agent_with(script, "interrupt"), "delete it")
    async with held_turn as (_, session, _, results):
        second = await session.run("never mind")
    assert results["delete it"].finish_reason == "aborted"
    assert second.text == "new answer" and session.pending == ()
    results_of = {m.tool_call_id: m.error for m in session.messages if isinstance(m, ToolMessage)}
    assert set(results_of) == {"H", "D"}  # every call of the cut turn has its result


async def test_a_session_strategy_overrides_the_agents():
    script = Script(holding(), ["first done"], ["second done"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script), session_id="s", on_busy="enqueue")
        assert session.on_busy == "enqueue" and session.agent.on_busy == "reject"
        results: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            await run_in(nursery, session, "second", results)
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
    assert results["second"].text == "second done"


async def test_an_unknown_strategy_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="on_busy"):
        Agent(on_busy="queue")  # type: ignore[arg-type]
    async with Host.open(log_tap=False) as host:
        with pytest.raises(ConfigurationError, match="on_busy"):
            await host.open_session(agent_with(Script()), on_busy="later")  # type: ignore[arg-type]


# -- the steered history, replayed to each provider ------------------------------------


async def steered_history() -> tuple:
    """The stored history of a turn steered before its third step."""
    script = Script(looking("call_L"), holding("call_H"), ["answer to both"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "first")
            await held["open"].wait()
            nursery.start_soon(session.run, "also this")
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
        record = await host.store.load("s")
    assert record is not None
    return tuple(repair(record.messages))


async def test_the_steered_history_replays_to_openai_chat():
    messages = openai_messages(None, await steered_history())
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "user",
        "assistant",
    ]
    assert messages[4]["tool_call_id"] == "call_H" and messages[5]["content"] == "also this"
    assert messages[6]["content"] == "answer to both"


async def test_the_steered_history_replays_to_openai_responses():
    items = responses_messages(await steered_history())
    shape = [i.get("type") or i["role"] for i in items]
    assert shape == [
        "user",
        "function_call",
        "function_call_output",
        "function_call",
        "function_call_output",
        "user",
        "assistant",
    ]
    assert items[4]["call_id"] == "call_H"
    assert items[5]["content"] == "also this" and items[6]["content"] == "answer to both"


async def test_the_steered_history_replays_to_anthropic_with_the_text_after_the_results():
    _system, messages = anthropic_messages(None, await steered_history())
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    last_user = messages[4]["content"]
    # one user turn: the tool result first (the API requires it), then the steered text
    assert [b["type"] for b in last_user] == ["tool_result", "text"]
    assert last_user[0]["tool_use_id"] == "call_H" and last_user[1]["text"] == "also this"
    assert messages[5]["content"][0]["text"] == "answer to both"


async def test_a_steered_message_is_stored_when_the_steering_caller_is_told(autojump_clock):
    """``out.steered`` (over HTTP the 202) is an acknowledgement: the message must be in
    the store by then. Found by tests/test_embedded_chaos.py: the 202 came at the step
    boundary that took the message, which only the next step's save stores, and a
    ``serve`` SIGKILLed in between lost a message it had acknowledged. Now the caller is
    told once a save of the turn holds it."""
    script = Script(holding(), [Sleep(5), "answer to both"])
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        results: dict = {}

        async def steer() -> None:
            async with session.stream("also this") as out:
                record = await host.store.load("s")  # what a kill now would leave
                assert record is not None
                results["stored"] = [m.text for m in record.messages if type(m) is UserMessage]
                results["steered"] = out.steered
                async for _ in out:
                    pass

        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()  # step 0's tool runs: the message waits for its end
            nursery.start_soon(steer)
            await trio.testing.wait_all_tasks_blocked()
            held["release"].set()
    assert results["steered"] is True
    assert results["stored"] == ["first", "also this"]
    assert results["first"].text == "answer to both"
