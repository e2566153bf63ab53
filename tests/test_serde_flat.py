"""``serde.flat_unstructurer``: an output chunk whose fields are all kept as they are is
unstructured in one Python call (a relay writer unstructures ~33 chunks a worker's turn,
issue 24 goal 3), to exactly what the converter's hook gives, keys in the same order."""

from __future__ import annotations

import types
import typing
from typing import Any

import attrs
import pytest

from runtime import messages, output
from runtime.serde import flat_unstructurer, unstructurer
from tests.support.calls import python_calls

CHUNKS = [
    cls
    for cls in vars(output).values()
    if isinstance(cls, type) and attrs.has(cls) and isinstance(getattr(cls, "type", None), str)
]


def _value(hint: Any, name: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        other = [a for a in typing.get_args(hint) if a is not type(None)]
        return _value(other[0], name) if len(name) % 2 else None
    if origin is typing.Literal:
        return typing.get_args(hint)[-1]
    return {str: f"{name}-é", int: len(name) * 7, float: len(name) / 4, bool: True}[hint]


@pytest.mark.parametrize("cls", CHUNKS, ids=lambda c: c.__name__)
def test_a_flat_chunk_unstructures_as_the_converter_s_hook(cls: type) -> None:
    flat = flat_unstructurer(cls)
    if flat is None:
        pytest.skip("a field the converter does not keep as it is")
    hints = typing.get_type_hints(cls)
    chunk = cls(**{a.name: _value(hints[a.name], a.name) for a in attrs.fields(cls) if a.init})
    want = unstructurer(cls)(chunk)
    assert list(flat(chunk).items()) == list(want.items())


def test_text_deltas_and_step_starts_are_flat_and_a_finish_is_not() -> None:
    assert flat_unstructurer(output.TextDelta) is not None
    assert flat_unstructurer(output.StepStart) is not None
    assert flat_unstructurer(output.Finish) is None  # its usage has a hook of its own
    assert flat_unstructurer(output.ObjectDelta) is None  # Any: unstructured by value
    assert flat_unstructurer(messages.AssistantMessage) is None  # overrides
    assert flat_unstructurer(dict) is None


def test_a_text_delta_is_one_python_call() -> None:
    flat = flat_unstructurer(output.TextDelta)
    assert flat is not None
    delta = output.TextDelta(step=0, part_id="p", text=" w")
    _, calls = python_calls(lambda: flat(delta))
    assert calls == ["unstructure_flat"]
