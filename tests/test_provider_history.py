"""Providers receive repaired history: the turn runner applies runtime.history.repair
once, to the messages it puts in each InferRequest, so no provider has to remember to
(and the stored history keeps what really happened)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.providers import ScriptedProvider
from actors.stores import MemoryStore
from runtime import Agent, Host
from runtime.history import INTERRUPTED, RepairedHistory, repair
from runtime.messages import AssistantMessage, TextPart, ToolCallPart, ToolMessage, UserMessage
from tests.support.faults import check_history


def call(call_id: str, step: int = 0) -> ToolCallPart:
    return ToolCallPart(tool_call_id=call_id, tool_name="slow", input={}, step=step)


def result(call_id: str, output: str = "ok") -> ToolMessage:
    return ToolMessage(tool_call_id=call_id, tool_name="slow", output=output, step=0)


BROKEN = [
    UserMessage(content="go"),
    AssistantMessage(content=(call("X"),), interrupted=True),  # cut before its result
    result("Z", "orphan"),  # answers no call
]


async def test_the_provider_receives_the_history_repaired():
    provider = ScriptedProvider(["ok"])
    store = MemoryStore()
    await store.save("s1", 0, BROKEN)
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id="s1")
        await session.run("again")
    (request,) = provider.requests
    sent = request.messages
    assert [type(m).__name__ for m in sent] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
        "UserMessage",
        "AssistantMessage",
    ]
    assert (sent[2].tool_call_id, sent[2].error) == ("X", INTERRUPTED)
    assert sent[3].content == "again"


async def test_the_session_keeps_its_history_as_it_was():
    provider = ScriptedProvider(["ok"])
    store = MemoryStore()
    await store.save("s1", 0, BROKEN)
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(Agent(provider=provider), session_id="s1")
        await session.run("again")
        kept = session.messages[:3]
    assert list(kept) == BROKEN  # the orphan and the unanswered call are still stored


# -- the repair pass ---------------------------------------------------------------------------


def test_a_call_without_a_result_gets_the_interrupted_error():
    (_, _, added) = repair([UserMessage(content="go"), AssistantMessage(content=(call("X"),))])
    assert (added.tool_call_id, added.error, added.step) == ("X", INTERRUPTED, 0)


def test_a_result_without_its_call_is_dropped():
    history = [UserMessage(content="go"), result("Z"), UserMessage(content="again")]
    assert repair(history) == [history[0], history[2]]


def test_a_second_result_for_the_same_call_is_dropped():
    first, second = result("X", "first"), result("X", "second")
    history = [UserMessage(content="go"), AssistantMessage(content=(call("X"),)), first, second]
    assert repair(history)[2:] == [first]


def test_results_follow_their_calls_in_call_order():
    assistant = AssistantMessage(content=(call("A"), call("B", step=1)))
    history = [UserMessage(content="go"), assistant, result("B"), result("A")]
    assert [m.tool_call_id for m in repair(history)[2:]] == ["A", "B"]


def test_blank_text_parts_are_removed():
    blank, text = TextPart(text=" \n", step=0), TextPart(text="hi", step=0)
    assistant = AssistantMessage(content=(blank, text))
    (_, repaired) = repair([UserMessage(content="go"), assistant])
    assert [p.text for p in repaired.content] == ["hi"]


ids = st.sampled_from(["A", "B", "C", "D"])


@st.composite
def histories(draw: st.DrawFn) -> list:
    """Turns of user, assistant (distinct call ids), then any results, stray ones too."""
    out: list = []
    for _ in range(draw(st.integers(0, 4))):
        out.append(UserMessage(content="u"))
        if draw(st.booleans()):
            out.append(result(draw(ids)))  # a result with nothing before it
        calls = draw(st.lists(ids, unique=True, max_size=3))
        out.append(AssistantMessage(content=tuple(call(c) for c in calls)))
        out.extend(result(r) for r in draw(st.lists(ids, max_size=4)))
    return out


@given(histories())
def test_any_history_comes_out_valid(history):
    check_history(repair(history))


@given(histories())
def test_repairing_twice_changes_nothing_more(history):
    once = repair(history)
    assert repair(once) == once


# -- repairing a growing history once per message ----------------------------------------------

edits = st.one_of(
    st.tuples(st.just("append"), histories()),
    st.tuples(st.just("truncate"), st.integers(0, 20)),
    st.tuples(
        st.just("replace"),
        st.integers(0, 20),
        st.one_of(
            st.builds(result, ids),
            st.builds(lambda i: AssistantMessage(content=(call(i),)), ids),
            st.just(UserMessage(content="edited")),
        ),
    ),
)


def same(kept: tuple, full: list) -> bool:
    """Equal but for the ids of the ``interrupted`` results repair makes (new each time)."""
    return [attrs.evolve(m, id="") for m in kept] == [attrs.evolve(m, id="") for m in full]


class Folding(RepairedHistory):
    FOLD = 1  # what a turn adds joins the repaired head at once, or at the next turn


@pytest.mark.parametrize("kept", [RepairedHistory, Folding], ids=["kept", "folding"])
@given(start=histories(), changes=st.lists(edits, max_size=6))
def test_the_kept_repair_always_equals_a_full_repair(kept, start, changes):
    repaired = kept()
    history = list(start)
    assert same(repaired(history), repair(history))
    for change in changes:
        if change[0] == "append":
            history.extend(change[1])
        elif change[0] == "truncate":
            del history[change[1] :]
        elif history:  # replace one message, anywhere
            history[change[1] % len(history)] = change[2]
        assert same(repaired(history), repair(history))


def test_a_kept_part_is_not_repaired_again():
    repaired = RepairedHistory()
    history = [UserMessage(content="go"), AssistantMessage(content=(call("X"),))]
    history += [UserMessage(content="again")]
    first = repaired(history)
    history.append(AssistantMessage(content=()))
    again = repaired(history)
    assert again[2] is first[2]  # the interrupted result made for X is reused, not remade


def test_a_result_put_where_the_kept_part_ended_is_paired_with_its_call():
    repaired = RepairedHistory()
    history = [UserMessage(content="go"), AssistantMessage(content=(call("X"),))]
    history += [UserMessage(content="again")]
    repaired(history)  # keeps the first two, X answered as interrupted
    history[2] = result("X", "late")  # the user message becomes X's real result
    history.append(UserMessage(content="and now?"))
    assert same(repaired(history), repair(history))
    assert repaired(history)[2].output == "late"
