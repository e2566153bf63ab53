"""The contract's value classes share one ``__repr__`` (``runtime.chunks._repr``), one
``__eq__`` and one ``__hash__`` instead of those attrs would compile per class at import
(issue 24); the repr must print what attrs' would, field ``repr=`` options included, so
logs and tracebacks read the same, and equality must mean what attrs' would."""

from __future__ import annotations

from typing import Any

import attrs

from runtime.actor_messages import RetryPrompt, SessionState, ToolOutcome
from runtime.agent import Agent
from runtime.chunks import FinishChunk, TextChunk, Usage, _eq, _hash, _repr
from runtime.compaction import KeepTurns
from runtime.events import StepStarted
from runtime.messages import AssistantMessage, Image, TextPart, UserMessage
from runtime.output import TextDelta
from runtime.store import SessionRecord
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
    assert repr(state) == "SessionState(session_id='s', messages=[...], saved_upto=0, version=0, cut=frozenset())"


def _attrs_eq(cls: type) -> Any:
    """The ``__eq__`` attrs would generate for ``cls``, from a twin it compiles one for."""
    twin = attrs.frozen(eq=True, repr=False, init=False)(
        type(cls.__name__, (cls,), {"__qualname__": cls.__qualname__})
    )
    assert twin.__eq__ is not _eq
    return twin.__eq__


def test_the_shared_eq_and_hash_mean_what_attrs_would() -> None:
    """Equality and hashing of events, chunks and parts are relied on (tests, users'
    sets and dicts): the shared ``__eq__`` must answer what attrs' own would, ``eq=False``
    fields (a record's version) left out, and equal values hash alike."""
    pairs: list[tuple[Any, Any]] = [
        (TextChunk(text="a"), TextChunk(text="b")),
        (TextChunk(text="a"), TextChunk(text="a", refusal=True)),
        (Usage(input_tokens=3), Usage(input_tokens=4)),
        (TextPart(text="x", step=0), TextPart(text="x", step=1)),
        (UserMessage(content="hi"), UserMessage(content="ho")),
        (TextDelta(step=0, part_id="p", text="t"), TextDelta(step=0, part_id="p", text="t", seq=2)),
        (TextDelta(step=0, part_id="p", text="t"), TextDelta(step=0, part_id="p", text="u")),
        (
            StepStarted(step=1, session_id="s", turn_id="t"),
            StepStarted(step=1, session_id="s", turn_id="u"),
        ),
        (SessionRecord(session_id="s", messages=()), SessionRecord(session_id="t", messages=())),
        (KeepTurns(n=2), KeepTurns(n=3)),
        (RetryPrompt(content="again"), RetryPrompt(content="again!")),
    ]
    for a, b in pairs:
        cls = type(a)
        assert cls.__eq__ is _eq and cls.__hash__ is _hash, cls
        assert not cls.__attrs_props__.added_eq, cls  # nothing compiled at import
        copy = attrs.evolve(a)
        reference = _attrs_eq(cls)
        assert (a == copy) is reference(a, copy) is True
        assert (a == b) is bool(reference(a, b)), (a, b)
        assert (a != b) is not (a == b)
        if cls is not SessionRecord:  # its meta is a dict: unhashable, as with attrs'
            assert hash(a) == hash(copy)
        assert a.__eq__(object()) is NotImplemented
    record = SessionRecord(session_id="s", messages=(), version=1)
    assert record == attrs.evolve(record, version=2)  # an eq=False field
    assert TextPart(text="x", step=0) != AssistantMessage(content=(TextPart(text="x", step=0),))
    assert UserMessage(content="hi") != RetryPrompt(content="hi")  # another class
    assert len({TextChunk(text="a"), TextChunk(text="a"), TextChunk(text="b")}) == 2


def test_no_facade_value_class_compiles_its_own_eq() -> None:
    """Every frozen value class of the facade's modules shares :func:`runtime.chunks._eq`
    (a class that compiled its own would cost ``import runtime`` again, issue 24);
    a mutable or identity-compared class keeps what it has."""
    import importlib

    import runtime

    compiled = []
    for name in runtime._MODULES:
        if name.startswith("runtime.app."):
            continue
        for value in vars(importlib.import_module(name)).values():
            if attrs.has(value) and value.__module__ == name and value.__attrs_props__.added_eq:
                compiled.append(value.__qualname__)
    assert compiled == []
