"""The contract's value classes share one ``__repr__`` (``runtime.chunks._repr``) instead of
the one attrs would compile per class at import (issue 24); it must print what attrs'
would, field ``repr=`` options included, so logs and tracebacks read the same."""

from __future__ import annotations

from typing import Any

import attrs

from runtime.actor_messages import SessionState, ToolOutcome
from runtime.agent import Agent
from runtime.chunks import FinishChunk, TextChunk, Usage, _repr
from runtime.messages import AssistantMessage, Image, TextPart, UserMessage
from runtime.tools import tool


def _attrs_repr(value: Any) -> str:
    """``value`` as the repr attrs generates for its class would print it."""
    cls = type(value)
    twin = attrs.define(repr=True, eq=False, init=False)(
        type(cls.__name__, (cls,), {"__qualname__": cls.__qualname__})
    )
    assert twin.__repr__ is not _repr
    return twin.__repr__(value)


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


def test_the_shared_repr_prints_what_attrs_would() -> None:
    image = Image(data=b"\x89PNG\r\n\x1a\n" + bytes(16), media_type="image/png")
    values: list[Any] = [
        TextChunk(text="hi 'there'"),
        FinishChunk(reason="stop"),
        Usage(input_tokens=3, output_tokens=4),
        TextPart(text="x", step=0),
        UserMessage(content=[TextPart(text="hello", step=0)]),
        AssistantMessage(content=(TextPart(text="a", step=1),), usage=Usage(input_tokens=1)),
        image,  # data has a repr= callable
        ToolOutcome(tool_call_id="c1", tool_name="add", output=3, error=None),
        add,  # a ClientTool: its validators are repr=False
        Agent(name="a", model="scripted:x", tools=[add]),  # an init=False field
    ]
    for value in values:
        assert type(value).__repr__ is _repr, type(value)
        assert repr(value) == _attrs_repr(value)
    assert "<24 bytes>" in repr(image)


def test_a_value_that_holds_itself_reprs_as_dots_inside() -> None:
    state = SessionState(session_id="s")
    state.messages.append(state)  # type: ignore[arg-type]
    assert repr(state) == "SessionState(session_id='s', messages=[...], saved_upto=0, version=0)"
