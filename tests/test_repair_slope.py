"""A turn of many steps repairs its history in what each step added (journal pipeline.md,
repairslope): the runner repairs the history before every model call, and the turn in
flight was repaired whole each time, a walk of every part and result of the turn so far
per step (quadratic over a turn of ``max_steps`` in the hundreds)."""

from __future__ import annotations

import sys

import attrs

import runtime.history
from actors.turn.takeover import find_committed, steered_message_id
from runtime.actor_messages import History
from runtime.history import INTERRUPTED, RepairedHistory, repair
from runtime.messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)


def _lines_of_a_turn(steps: int) -> int:
    """Python lines :mod:`runtime.history` runs to repair the history before each model
    call of a turn of ``steps`` steps (one tool call and its result a step), as the
    runner grows it: the assistant message replaced by one with the step's call added."""
    history = History(
        [UserMessage(content="hi"), AssistantMessage(content=(TextPart(text="a", step=0),))]
    )
    repaired = RepairedHistory()
    lines = 0
    filename = runtime.history.__file__

    def trace(frame, event, arg):  # type: ignore[no-untyped-def]
        nonlocal lines
        if frame.f_code.co_filename != filename:
            return None
        lines += event == "line"
        return trace

    history.append(UserMessage(content="go"))
    at = len(history)
    history.append(AssistantMessage(id="m", content=()))
    for step in range(steps):
        sys.settrace(trace)
        try:
            request = repaired(history)
        finally:
            sys.settrace(None)
        assert request == tuple(repair(history))
        call = ToolCallPart(tool_call_id=f"c{step}", tool_name="f", input={}, step=step)
        assistant = history[at]
        assert isinstance(assistant, AssistantMessage)
        history[at] = attrs.evolve(assistant, content=(*assistant.content, call))
        history.append(ToolMessage(tool_call_id=f"c{step}", tool_name="f", step=step, output="r"))
    return lines


def test_a_turn_of_many_steps_repairs_what_each_step_added():
    """Twice the steps, about twice the lines (four times when the turn so far is walked
    at every step: 200 steps took ~3.8x the lines of 100 before)."""
    hundred, two_hundred = _lines_of_a_turn(100), _lines_of_a_turn(200)
    assert two_hundred < 2.3 * hundred, (hundred, two_hundred)


def test_a_step_that_replaces_a_part_of_the_turn_is_repaired_anew():
    """A part of the turn's assistant message replaced by another (not only parts added
    after it) is seen: the request holds the new part, blank text left out."""
    call = ToolCallPart(tool_call_id="c0", tool_name="f", input={}, step=0)
    first = AssistantMessage(id="m", content=(TextPart(text="x", step=0), call))
    result = ToolMessage(tool_call_id="c0", tool_name="f", step=0, output="r")
    history: list[Message] = [UserMessage(content="go"), first, result]
    repaired = RepairedHistory()
    assert repaired(history) == (history[0], first, result)
    history[1] = attrs.evolve(
        first, content=(TextPart(text=" ", step=0), call, TextPart(text="y", step=0))
    )
    assert repaired(history) == tuple(repair(history))
    assert repaired(history)[1].content == (call, TextPart(text="y", step=0))  # type: ignore[union-attr]


def test_a_call_added_after_a_result_of_its_id_was_dropped_takes_that_result():
    """A result of an id no call had yet is dropped; once a later step adds a call of that
    id, the request is what :func:`repair` makes of the whole turn (the result answers
    it), not what the earlier request kept."""
    text = TextPart(text="x", step=0)
    history: list[Message] = [
        UserMessage(content="go"),
        AssistantMessage(id="m", content=(text,)),
        ToolMessage(tool_call_id="late", tool_name="f", step=1, output="r"),
    ]
    repaired = RepairedHistory()
    assert len(repaired(history)) == 2
    call = ToolCallPart(tool_call_id="late", tool_name="f", input={}, step=1)
    history[1] = attrs.evolve(history[1], content=(text, call))
    request = repaired(history)
    assert request == tuple(repair(history))
    assert request[2] is history[2] and request[2].error != INTERRUPTED  # type: ignore[union-attr]


class _Reads(list):  # type: ignore[type-arg]
    """A history that counts the messages read from it (by position, in a slice taken
    and iterated, or iterated)."""

    read = 0

    def __getitem__(self, key):  # type: ignore[no-untyped-def]
        got = super().__getitem__(key)
        if isinstance(key, slice):
            return _Reads(got)
        _Reads.read += 1
        return got

    def __iter__(self):  # type: ignore[no-untyped-def]
        for message in super().__iter__():
            _Reads.read += 1
            yield message


def _session_then_turn(earlier_turns: int, steered: bool) -> list[Message]:
    """``earlier_turns`` finished turns, then a turn of one step with a call (a message
    steered into it at step 1, and a step with a call after it, when ``steered``)."""
    history: list[Message] = []
    for t in range(earlier_turns):
        history += [UserMessage(content="hi"), AssistantMessage(id=f"old{t}", content=())]
    call = ToolCallPart(tool_call_id="c0", tool_name="f", input={}, step=0)
    history += [
        UserMessage(content="go"),
        AssistantMessage(id="m", content=(call,)),
        ToolMessage(tool_call_id="c0", tool_name="f", step=0, output="r"),
    ]
    if steered:
        again = ToolCallPart(tool_call_id="c1", tool_name="f", input={}, step=1)
        history += [
            UserMessage(content="and"),
            AssistantMessage(id=steered_message_id("m", 1), content=(again,)),
            ToolMessage(tool_call_id="c1", tool_name="f", step=1, output="r"),
        ]
    return history


def test_a_continued_turn_reads_its_own_messages_not_the_session():
    """What a turn continued after an approval (or taken over) committed is read from the
    turn's messages: a session of 2,000 earlier messages adds none to the reading (every
    one was read, for the calls of steered messages, at each continuation before)."""
    for steered in (False, True):
        short = _session_then_turn(0, steered)
        long = _session_then_turn(1000, steered)[:2000] + short
        _Reads.read = 0
        found = find_committed(_Reads(short), "m")
        few = _Reads.read
        _Reads.read = 0
        assert find_committed(_Reads(long), "m") == attrs.evolve(
            found,  # type: ignore[arg-type]
            user_index=found.user_index + 2000,  # type: ignore[union-attr]
            assistant_index=found.assistant_index + 2000,  # type: ignore[union-attr]
        )
        assert _Reads.read == few, (steered, few, _Reads.read)
        assert found is not None and found.calls == (2 if steered else 1)


async def test_a_session_at_rest_holds_no_repair_of_a_turn_in_flight(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Each open session held the tail repair of its last turn (or of its opening): four
    # lists and a set, 10,000 idle sessions 4.17 -> 5.05 KB each (issue 24 goal 5).
    from actors.providers.scripted import ScriptedProvider, tool_call
    from runtime import Agent, Host, tool

    @tool
    def look(i: int) -> str:
        """Looks."""
        return "x"

    provider = ScriptedProvider([tool_call("look", {"i": 1}), ["done"]])
    agent = Agent(provider=provider, tools=[look])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        opened = session.runner._repaired._tail
        assert (await session.run("go")).text == "done"
        after = session.runner._repaired._tail
    assert opened is None
    assert after is None
