"""The call ids of a long turn (branch ``longturn2``, journal
``benchmarks/journal/pipeline.md``): :class:`actors.turn.parts.CallIds` renames a call id
the turn's message already holds, and it used to build the set of those ids from the
whole message for each model call: a turn of n steps walked n(n+1)/2 parts. The parts
manager now keeps the set (:attr:`PartsManager.call_ids`), grown with each call and
shrunk with a failed call's discarded parts; the ids are the same ones."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
import trio
import trio.testing

import actors.turn.parts as parts_module
from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from runtime import Agent, Budget, Host, RetryPolicy, tool
from runtime.errors import Overloaded
from runtime.ids import repeated_call_id
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)


@tool
def lookup(i: int) -> str:
    """Looks a number up."""
    return f"r{i}"


def numbered(steps: int, start: int = 0) -> list[list[Any]]:
    """Model calls that each call ``lookup`` twice, both calls named ``call_0`` (a server
    that numbers the calls of each response)."""
    return [
        [
            *tool_call("lookup", {"i": 2 * i}, tool_call_id="call_0"),
            *tool_call("lookup", {"i": 2 * i + 1}, tool_call_id="call_0"),
        ]
        for i in range(start, start + steps)
    ]


def expected(steps: int) -> list[str]:
    """The ids :func:`numbered` calls get: step 0 keeps ``call_0`` for its first call;
    every other is renamed (``-{step}``, the step's second ``-{step}-2``)."""
    ids = ["call_0", repeated_call_id("call_0", 0)]
    for step in range(1, steps):
        ids += [repeated_call_id("call_0", step), repeated_call_id("call_0", step, 2)]
    return ids


def calls_of(messages: Any) -> list[str]:
    return [
        p.tool_call_id
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]


def results_of(messages: Any) -> list[str]:
    return [m.tool_call_id for m in messages if isinstance(m, ToolMessage)]


@pytest.fixture
def call_id_lines() -> Iterator[list[int]]:
    """Line events run in actors/turn/parts.py for call ids (``CallIds``, the parts
    manager's set) while the test runs."""
    count = [0]
    here = parts_module.__file__

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code.co_filename != here or not (
            code.co_qualname.startswith("CallIds")
            or code.co_qualname.startswith("PartsManager.__init__")
        ):
            return None

        def lines(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "line":
                count[0] += 1
            return lines

        return lines

    sys.settrace(tracer)
    try:
        yield count
    finally:
        sys.settrace(None)


async def run_numbered(steps: int) -> list[Any]:
    provider = ScriptedProvider([*numbered(steps), ["done"]])
    agent = Agent(provider=provider, tools=[lookup], budget=Budget(max_steps=steps + 1))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        assert (await session.run("go")).text == "done"
        return list(session.messages)


@pytest.mark.parametrize("steps", [100, 200])
async def test_a_long_turns_call_ids_cost_a_few_lines_a_step(
    steps: int, call_id_lines: list[int]
) -> None:
    messages = await run_numbered(steps)
    assert calls_of(messages) == results_of(messages) == expected(steps)
    # 60 a step now (two calls renamed a step); the set built from the whole message at
    # each model call made it 16,007 lines at 100 steps, 52,007 at 200
    assert call_id_lines[0] < 80 * steps


async def test_a_failed_call_that_made_a_part_gives_its_id_back() -> None:
    # The primary's step 1 completes call_0 (a part: call_0-1) and then fails; the backup
    # makes the step again and its call_0 is call_0-1 once more, not call_0-1-1.
    busy = Overloaded("overloaded", provider="scripted", status_code=529)
    primary = ScriptedProvider(
        [numbered(1)[0], [*tool_call("lookup", {"i": 9}, tool_call_id="call_0"), busy]],
        name="primary",
    )
    backup = ScriptedProvider([["unused"], *numbered(1, start=1), ["done"]], name="backup")
    agent = Agent(provider=[primary, backup], tools=[lookup], retry=RetryPolicy(max_attempts=1))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        async with session.stream("go") as out:
            chunks = await out.collect()
    assert [c.type for c in chunks].count("reset-step") == 1
    assert calls_of(session.messages) == results_of(session.messages) == expected(2)


@pytest.mark.usefixtures("clear_ran")
async def test_ids_stay_unique_across_a_continuation_after_approval() -> None:
    # Steps 0-2 rename call_0; step 3's call_0 waits for approval; the continuation
    # (another turn runner, its parts manager built from the stored message) goes on.
    steps = [
        *numbered(3),
        [*tool_call("delete_file", {"path": "/x"}, tool_call_id="call_0")],
        *numbered(2, start=4),
        ["done"],
    ]
    store = MemoryStore()
    agent = Agent(provider=ScriptedProvider(steps), tools=[lookup, delete_file])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        waiting = await session.run("go")
        assert waiting.pending[0].tool_call_id == repeated_call_id("call_0", 3)
        result = await session.respond(waiting.pending[0].approval_id, approved=True)
    assert result is not None and result.text == "done" and ran == ["/x"]
    want = [*expected(3), repeated_call_id("call_0", 3)]
    for step in (4, 5):
        want += [repeated_call_id("call_0", step), repeated_call_id("call_0", step, 2)]
    stored = (await store.load("s")).messages
    for messages in (stored, session.messages):
        assert calls_of(messages) == want
        assert sorted(results_of(messages)) == sorted(want)


async def test_ids_stay_unique_after_a_takeover_at_the_last_committed_step(
    autojump_clock: Any,
) -> None:
    # The first worker commits steps 0-2 and dies in step 3's tool; the second runs step
    # 3 again and goes on: every call keeps the id it had, and none repeats.
    hanging, hang_on = trio.Event(), [6]

    @tool(name="lookup")
    async def hangs(i: int) -> str:
        """Looks a number up."""
        if i in hang_on:
            hanging.set()
            await trio.sleep_forever()
        return f"r{i}"

    def agent() -> Agent:
        return Agent(
            provider=ScriptedProvider([*numbered(5), ["done"]]),
            tools=[hangs],
            budget=Budget(max_steps=10),
        )

    store, first = MemoryStore(), MemoryStore()
    async with Host.open(store=first, log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        async with session.stream("go", turn_id="t", message_id="m", resume=True):
            await hanging.wait()
            await trio.sleep(1)  # the persister writes step 2 (autojump clock)
            record = await first.load("s")
            await store.save("s", 0, record.messages, dict(record.meta))
    assert calls_of(record.messages) == expected(3)
    hang_on.clear()  # the second worker's step 3 runs through
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        async with session.stream("go", turn_id="t", message_id="m", resume=True) as out:
            await out.collect()
    stored = (await store.load("s")).messages
    assert calls_of(stored) == results_of(stored) == expected(5)


@tool
async def hold() -> str:
    """Waits until the test lets go (a message is steered in meanwhile)."""
    gate["held"].set()
    await gate["release"].wait()
    return "held"


gate: dict[str, trio.Event] = {}


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    gate["held"], gate["release"] = trio.Event(), trio.Event()


async def steered_turn(store: Any, agent: Agent, stop: trio.Event | None = None) -> Any:
    """Run the turn ``t`` (message ``m``) and steer "also" into it while step 0's ``hold``
    runs; with ``stop``, leave once it is set (the worker dies there). What ``store``
    holds then (at the turn's end without ``stop``)."""
    record = None
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")

        async def steer() -> None:
            await gate["held"].wait()
            async with session.stream("also") as out:
                await out.collect()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(steer)
            async with session.stream("go", turn_id="t", message_id="m", resume=True) as out:
                await gate["held"].wait()
                await trio.testing.wait_all_tasks_blocked()
                gate["release"].set()
                if stop is None:
                    await out.collect()
                else:
                    await stop.wait()
                    await trio.sleep(1)  # the persister writes step 1 (autojump clock)
                    record = await store.load("s")
            nursery.cancel_scope.cancel()
    return record if record is not None else await store.load("s")


def steered_steps(start: int = 0) -> ScriptedProvider:
    """The steered turn's model: its calls in order, whatever the history (a steps list
    is read by the step the history shows, which a steered message starts over)."""
    steps = [
        [*tool_call("hold", {}, tool_call_id="call_0")],
        [*tool_call("lookup", {"i": 1}, tool_call_id="call_0")],
        [*tool_call("lookup", {"i": 2}, tool_call_id="call_0")],
        ["done"],
    ][start:]
    return ScriptedProvider(responder=lambda request: steps.pop(0))


STEERED_IDS = ["call_0", repeated_call_id("call_0", 1), repeated_call_id("call_0", 2)]


async def test_ids_stay_unique_across_the_messages_of_a_steered_turn(autojump_clock: Any) -> None:
    # Each message steered in starts an assistant message of its own; the turn's results
    # and outcomes are kept by call id, so an id must not come back in a later message.
    store = MemoryStore()
    agent = Agent(provider=steered_steps(), tools=[hold, lookup], on_busy="steer")
    await steered_turn(store, agent)
    stored = (await store.load("s")).messages
    assert len([m for m in stored if isinstance(m, AssistantMessage)]) == 2
    assert calls_of(stored) == results_of(stored) == STEERED_IDS


async def test_a_steered_turn_taken_over_gives_its_calls_the_ids_they_had(
    autojump_clock: Any,
) -> None:
    # The first worker commits steps 0 (first message) and 1 (the steered one's) and
    # dies in step 2's tool; the second runs step 2 again: its call is call_0-2 again.
    hanging = trio.Event()
    hang = [True]

    @tool(name="lookup")
    async def hangs(i: int) -> str:
        """Looks a number up."""
        if i == 2 and hang:
            hanging.set()
            await trio.sleep_forever()
        return f"r{i}"

    def agent() -> Agent:
        return Agent(provider=steered_steps(), tools=[hold, hangs], on_busy="steer")

    store, first = MemoryStore(), MemoryStore()
    record = await steered_turn(first, agent(), stop=hanging)
    assert calls_of(record.messages) == STEERED_IDS[:2]
    await store.save("s", 0, record.messages, dict(record.meta))
    hang.clear()
    takeover = Agent(provider=steered_steps(start=2), tools=[hold, hangs], on_busy="steer")
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(takeover, session_id="s")
        async with session.stream("go", turn_id="t", message_id="m", resume=True) as out:
            await out.collect()
    stored = (await store.load("s")).messages
    assert calls_of(stored) == results_of(stored) == STEERED_IDS
