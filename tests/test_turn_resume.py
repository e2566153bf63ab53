"""A turn taken over by another worker continues where its committed steps end.

A dead worker is simulated by copying what the store held at the end of step 0 (while
step 1's tool was still running) into the store a second host opens, as a worker taking
the turn over would find it.
"""

from __future__ import annotations

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from actors.turn.parts import PartsManager
from actors.turn.takeover import find_committed, steered_message_id
from runtime import (
    Agent,
    AssistantMessage,
    Budget,
    Host,
    InvalidTurnId,
    TextPart,
    ToolCallPart,
    ToolMessage,
    Usage,
    UserMessage,
    tool,
)
from runtime.chunks import TextChunk
from runtime.history import INTERRUPTED
from runtime.tools import ToolContext

T, M, SID = "turn-1", "msg-1", "pay"

STEPS = [
    [*tool_call("charge", {"n": 1}, tool_call_id="c0")],
    [*tool_call("charge", {"n": 2}, tool_call_id="c1")],
    ["paid twice"],
]
CALL = Usage(input_tokens=10, output_tokens=5, total_tokens=15, cost=0.25)
"""What each model call uses and costs."""


class Charger:
    """The ``charge`` tool: records each run's idempotency key; with ``hang_on``, that
    call never returns (its worker dies there)."""

    def __init__(self, hang_on: int | None = None) -> None:
        self.keys: list[str] = []
        self.hang_on = hang_on
        self.hanging = trio.Event()

    def tool(self) -> object:
        @tool
        async def charge(n: int, context: ToolContext) -> str:
            """Charge the card."""
            self.keys.append(context.idempotency_key)
            if n == self.hang_on:
                self.hanging.set()
                await trio.sleep_forever()
            return f"charged {n}"

        return charge


def agent_with(charger: Charger, **kwargs: object) -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider(STEPS, usage=CALL)
    return Agent(provider=provider, tools=[charger.tool()], **kwargs), provider


async def commit_step_0(store: MemoryStore) -> None:
    """Run the turn on a first host until step 1's tool runs, and copy what its store
    then holds (step 0's commit) into ``store``: the dead worker's legacy."""
    first = MemoryStore()
    charger = Charger(hang_on=2)
    agent, _ = agent_with(charger)
    async with Host.open(store=first, log_tap=False) as host:
        session = await host.open_session(agent, session_id=SID)
        async with session.stream("pay", turn_id=T, message_id=M, resume=True):
            await charger.hanging.wait()
            await trio.sleep(1)  # let the persister write step 0 (autojump clock)
            record = await first.load(SID)
            await store.save(SID, 0, record.messages, dict(record.meta))
    roles = [m.role for m in (await store.load(SID)).messages]
    assert roles == ["user", "assistant", "tool"]


async def take_over(store: MemoryStore, charger: Charger, **kwargs: object):
    agent, provider = agent_with(charger)
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id=SID)
        async with session.stream("pay", turn_id=T, message_id=M, resume=True, **kwargs) as out:
            chunks = await out.collect()
    return chunks, out.result, provider


def check_whole_turn(messages) -> None:
    """One user message, one assistant message ``M`` with steps 0, 1, 2 in order, each
    call and each result exactly once, neither interrupted."""
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool"]
    assistant = messages[1]
    assert assistant.id == M and assistant.status == "complete"
    assert [p.step for p in assistant.content] == [0, 1, 2]
    calls = [p.tool_call_id for p in assistant.content if isinstance(p, ToolCallPart)]
    assert calls == ["c0", "c1"]
    assert [(m.tool_call_id, m.output) for m in messages[2:]] == [
        ("c0", "charged 1"),
        ("c1", "charged 2"),
    ]
    assert assistant.text == "paid twice"


async def test_a_taken_over_turn_reruns_only_the_step_in_flight(autojump_clock):
    store = MemoryStore()
    await commit_step_0(store)
    charger = Charger()
    _, result, _ = await take_over(store, charger)
    assert result.finish_reason == "stop"
    check_whole_turn((await store.load(SID)).messages)


async def test_the_rerun_step_continues_the_step_numbers_and_the_message(autojump_clock):
    store = MemoryStore()
    await commit_step_0(store)
    chunks, result, _ = await take_over(store, Charger())
    assert chunks[0].type == "start" and chunks[0].message_id == M
    steps = [c.step for c in chunks if c.type == "step-start"]
    assert steps == [1, 2]
    assert result.steps == 3 and result.message.id == M


async def test_the_taken_over_turn_counts_the_usage_of_its_committed_steps(autojump_clock):
    store = MemoryStore()
    await commit_step_0(store)
    _, result, provider = await take_over(store, Charger())
    assert len(provider.requests) == 2  # steps 1 and 2; step 0 was the first worker's
    assert result.usage.input_tokens == 30 and result.usage.cost == 0.75
    assert (await store.load(SID)).messages[1].usage == result.usage


async def test_the_rerun_tool_call_gets_the_idempotency_key_of_its_step(autojump_clock):
    store = MemoryStore()
    await commit_step_0(store)
    charger = Charger()
    await take_over(store, charger)
    assert charger.keys == [f"{T}:1:c1"]


async def test_the_result_lists_the_committed_tool_messages_too(autojump_clock):
    store = MemoryStore()
    await commit_step_0(store)
    _, result, _ = await take_over(store, Charger())
    assert [m.tool_call_id for m in result.tool_messages] == ["c0", "c1"]


async def test_a_step_cut_short_and_saved_interrupted_runs_again(autojump_clock):
    store = MemoryStore()
    charger = Charger(hang_on=2)
    agent, _ = agent_with(charger)
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id=SID)
        async with session.stream("pay", turn_id=T, message_id=M) as out:
            await charger.hanging.wait()
            out.cancel("worker shutting down")
    cut = (await store.load(SID)).messages
    assert cut[1].interrupted and cut[-1].error == INTERRUPTED
    again = Charger()
    await take_over(store, again)
    assert again.keys == [f"{T}:1:c1"]
    check_whole_turn((await store.load(SID)).messages)


async def test_resuming_an_answered_turn_runs_no_model_call_and_changes_nothing():
    store = MemoryStore()
    agent, _ = agent_with(Charger())
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id=SID)
        async with session.stream("pay", turn_id=T, message_id=M) as out:
            await out.collect()
    before = await store.load(SID)
    charger = Charger()
    chunks, result, provider = await take_over(store, charger)
    after = await store.load(SID)
    assert len(provider.requests) == 0 and charger.keys == []
    assert [c.type for c in chunks] == ["start", "finish"]
    assert result.finish_reason == "stop"
    assert after.messages == before.messages and after.version == before.version


async def test_resume_without_a_committed_message_runs_a_new_turn_with_that_id():
    store = MemoryStore()
    charger = Charger()
    chunks, _, provider = await take_over(store, charger)
    assert chunks[0].type == "start" and chunks[0].message_id == M
    assert [c.step for c in chunks if c.type == "step-start"] == [0, 1, 2]
    assert len(provider.requests) == 3
    check_whole_turn((await store.load(SID)).messages)


async def test_resume_wins_over_regenerate_when_the_message_exists(autojump_clock):
    store = MemoryStore()
    await commit_step_0(store)
    charger = Charger()
    await take_over(store, charger, regenerate=True)
    assert charger.keys == [f"{T}:1:c1"]  # step 0 was not run again
    check_whole_turn((await store.load(SID)).messages)


async def test_the_step_budget_counts_the_committed_steps(autojump_clock):
    store = MemoryStore()
    await commit_step_0(store)
    charger = Charger()
    agent, _ = agent_with(charger, budget=Budget(max_steps=2))
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id=SID)
        async with session.stream("pay", turn_id=T, message_id=M, resume=True) as out:
            await out.collect()
    assert out.result.finish_reason == "budget" and out.result.budget == "max_steps"
    assert charger.keys == [f"{T}:1:c1"]  # step 1 ran, step 2 was refused


@pytest.mark.parametrize("bad", ["", "a b", "x" * 129, "tür", 7])
async def test_a_malformed_turn_id_is_refused(bad):
    agent, _ = agent_with(Charger())
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        with pytest.raises(InvalidTurnId):
            session.stream("pay", turn_id=bad)
        assert not session.busy


async def test_resume_without_a_message_id_is_refused():
    agent, _ = agent_with(Charger())
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        with pytest.raises(InvalidTurnId, match="message_id"):
            session.stream("pay", turn_id=T, resume=True)


def test_the_parts_manager_continues_the_stored_parts():
    stored = (ToolCallPart(tool_call_id="c0", tool_name="charge", input={}, step=0),)
    parts = PartsManager(stored)
    parts.step = 1
    out: list[object] = []
    parts.text(TextChunk(text="done"), out)
    parts.close(out)
    assert parts.content == [*stored, TextPart(text="done", step=1)]


def test_the_idempotency_key_names_turn_step_and_call():
    ctx = ToolContext(
        host=None,
        session_id="s",
        turn_id="turn-9",
        step=4,
        tool_call_id="call_x",
        tool_name="charge",
        emit=None,
    )
    assert ctx.idempotency_key == "turn-9:4:call_x"


def _turn_history(steps: int, calls_per_step: list[int], final: bool):
    """A turn's history as committed after ``steps`` steps: each step makes its calls
    (the last one none when ``final``)."""
    parts, tools = [], []
    for s in range(steps):
        parts.append(TextPart(text=f"step {s}", step=s))
        if final and s == steps - 1:
            continue
        for k in range(calls_per_step[s]):
            cid = f"c{s}_{k}"
            parts.append(ToolCallPart(tool_call_id=cid, tool_name="t", input={}, step=s))
            tools.append(ToolMessage(tool_call_id=cid, tool_name="t", step=s, output="ok"))
    return [UserMessage(content="go"), AssistantMessage(id=M, content=tuple(parts)), *tools]


@given(
    st.integers(min_value=1, max_value=5),
    st.lists(st.integers(min_value=1, max_value=3), min_size=5, max_size=5),
    st.booleans(),
)
def test_committed_steps_are_kept_whole_and_counted(steps, calls, final):
    history = _turn_history(steps, calls, final)
    found = find_committed(history, M)
    assert found is not None
    assert found.next_step == steps and found.finished == final
    assert found.parts == history[1].content
    assert found.tool_messages == tuple(history[2:])


@given(
    st.integers(min_value=1, max_value=5),
    st.lists(st.integers(min_value=1, max_value=3), min_size=5, max_size=5),
    st.integers(min_value=0, max_value=2),
)
def test_a_cut_last_step_is_dropped_whole(steps, calls, completed):
    """The last step's calls: ``completed`` of them got a result before the cut, the
    rest the interrupted one; the step is dropped, parts and results."""
    history = _turn_history(steps, calls, final=False)
    last = steps - 1
    tools = [m for m in history[2:] if m.step == last]
    completed = min(completed, len(tools) - 1)
    cut = [
        m
        if i < completed
        else ToolMessage(tool_call_id=m.tool_call_id, tool_name="t", step=last, error=INTERRUPTED)
        for i, m in enumerate(tools)
    ]
    assistant = AssistantMessage(id=M, content=history[1].content, interrupted=True)
    kept = [m for m in history[2:] if m.step != last]
    found = find_committed([history[0], assistant, *kept, *cut], M)
    assert found is not None
    assert found.next_step == last and not found.finished
    assert all(p.step < last for p in found.parts)
    assert found.tool_messages == tuple(kept)


def test_an_interrupted_answer_is_not_a_finished_turn():
    history = _turn_history(2, [1, 1], final=True)
    assistant = AssistantMessage(id=M, content=history[1].content, interrupted=True)
    found = find_committed([history[0], assistant, *history[2:]], M)
    assert found is not None and found.next_step == 1 and not found.finished


def test_a_turn_followed_by_later_turns_is_finished_and_left_alone():
    history = [*_turn_history(2, [1, 1], final=False), UserMessage(content="next")]
    found = find_committed(history, M)
    assert found is not None and found.finished


def test_no_message_with_the_id_means_nothing_was_committed():
    assert find_committed(_turn_history(2, [1, 1], final=True), "other") is None


def test_a_steered_turn_continues_its_last_assistant_message_counting_every_call():
    # A message steered in after step 0: the steps from 1 on go to a message of their
    # own (``steered_message_id``); a takeover goes on there, the budget counting the
    # calls of both messages.
    first = _turn_history(1, [2], final=False)
    steered_id = steered_message_id(M, 1)
    call = ToolCallPart(tool_call_id="c1", tool_name="t", input={}, step=1)
    history = [
        *first,
        UserMessage(content="also this"),
        AssistantMessage(id=steered_id, content=(call,)),
        ToolMessage(tool_call_id="c1", tool_name="t", step=1, output="ok"),
    ]
    found = find_committed(history, M)
    assert found is not None
    assert (found.message_id, found.assistant_index, found.user_index) == (steered_id, 5, 4)
    assert (found.next_step, found.finished, found.calls) == (2, False, 3)
