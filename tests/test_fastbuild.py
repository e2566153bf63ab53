"""runtime.fastbuild: a slot builder makes exactly the value ``__init__`` makes, and
refuses a class whose ``__init__`` does more than set its fields."""

from __future__ import annotations

import attrs
import pytest

from runtime import output as o
from runtime.chunks import TextChunk
from runtime.fastbuild import column_builder, slot_builder

FIELDS = ("step", "part_id", "text", "seq", "session_id", "turn_id")


@pytest.mark.parametrize("cls", [o.TextDelta, o.ReasoningDelta])
def test_a_built_delta_is_the_value_its_init_makes(cls: type):
    built = slot_builder(cls, FIELDS)(2, "p1", "hi", 7, "s", "t")
    made = cls(step=2, part_id="p1", text="hi", seq=7, session_id="s", turn_id="t")
    assert type(built) is cls
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.text = "other"  # type: ignore[misc]


def test_a_built_text_chunk_is_the_value_its_init_makes():
    build = slot_builder(TextChunk, ("text", "refusal"))
    assert build("a", False) == TextChunk(text="a")
    assert build("no", True) == TextChunk(text="no", refusal=True)


def test_the_builder_must_set_every_field():
    with pytest.raises(TypeError):
        slot_builder(TextChunk, ("text",))
    with pytest.raises(TypeError):
        slot_builder(TextChunk, ("text", "text"))


def test_a_class_whose_init_does_more_is_refused():
    @attrs.frozen(kw_only=True, slots=True)
    class Validated:
        n: int = attrs.field(validator=attrs.validators.instance_of(int))

    @attrs.frozen(kw_only=True, slots=True)
    class Converted:
        n: int = attrs.field(converter=int)

    @attrs.frozen(kw_only=True, slots=True)
    class Hooked:
        n: int

        def __attrs_post_init__(self) -> None:
            pass

    @attrs.frozen(kw_only=True, slots=False)
    class Unslotted:
        n: int

    @attrs.frozen(kw_only=True, slots=True, cache_hash=True)
    class HashCached:
        n: int

    for cls in (Validated, Converted, Hooked, Unslotted, HashCached):
        with pytest.raises(TypeError):
            slot_builder(cls, ("n",))


@pytest.mark.parametrize("cls", [o.TextDelta, o.ReasoningDelta])
def test_a_column_builder_makes_the_values_init_makes_in_order(cls: type):
    texts = ["a", "", "b c", "\u00e9"]
    build = column_builder(cls, FIELDS, ("text", "seq"))
    built = build(len(texts), 3, "p2", texts, range(10, 14), "s", "t")
    made = [
        cls(step=3, part_id="p2", text=text, seq=seq, session_id="s", turn_id="t")
        for seq, text in enumerate(texts, 10)
    ]
    assert [type(b) for b in built] == [cls] * len(texts)
    assert built == made and [repr(b) for b in built] == [repr(m) for m in made]
    assert [hash(b) for b in built] == [hash(m) for m in made]


def test_a_column_builder_of_none_builds_an_empty_list():
    assert column_builder(o.TextDelta, FIELDS, ("text", "seq"))(0, 1, "p", [], [], "s", "t") == []


def test_a_column_builder_refuses_what_a_slot_builder_refuses_and_unknown_columns():
    with pytest.raises(TypeError):
        column_builder(TextChunk, ("text",), ("text",))
    with pytest.raises(TypeError):
        column_builder(o.TextDelta, FIELDS, ("texts",))

    @attrs.frozen(kw_only=True, slots=True)
    class Converted:
        n: int = attrs.field(converter=int)

    with pytest.raises(TypeError):
        column_builder(Converted, ("n",), ("n",))
