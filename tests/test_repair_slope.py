"""A turn of many steps repairs its history in what each step added (journal pipeline.md,
repairslope): the runner repairs the history before every model call, and the turn in
flight was repaired whole each time, a walk of every part and result of the turn so far
per step (quadratic over a turn of ``max_steps`` in the hundreds)."""

from __future__ import annotations

import sys

import attrs

import runtime.history
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
    history: list[Message] = [
        UserMessage(content="go"),
        AssistantMessage(id="m", content=(TextPart(text="x", step=0),)),
        ToolMessage(tool_call_id="late", tool_name="f", step=1, output="r"),
    ]
    repaired = RepairedHistory()
    assert len(repaired(history)) == 2
    call = ToolCallPart(tool_call_id="late", tool_name="f", input={}, step=1)
    history[1] = attrs.evolve(history[1], content=(TextPart(text="x", step=0), call))
    request = repaired(history)
    assert request == tuple(repair(history))
    assert request[2] is history[2] and request[2].error != INTERRUPTED  # type: ignore[union-attr]
