"""runtime.fastbuild: a slot builder makes exactly the value ``__init__`` makes, and
refuses a class whose ``__init__`` does more than set its fields."""

from __future__ import annotations

import copy
import pickle
import weakref

import attrs
import pytest

from runtime import output as o
from runtime.chunks import TextChunk
from runtime.fastbuild import _twin, column_builder, slot_builder

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


@pytest.mark.parametrize("cls", [o.TextDelta, o.ReasoningDelta])
def test_a_delta_built_as_its_twin_is_its_class_through_and_through(cls: type):
    """The deltas are made as an unfrozen twin and then assigned their class: what comes
    out is an instance of the class itself, frozen, with every field, that pickles,
    copies, evolves, serializes and is weakly referenced as one ``__init__`` made."""
    made = cls(step=2, part_id="p1", text="hi", seq=7, session_id="s", turn_id="t")
    singles = [slot_builder(cls, FIELDS)(2, "p1", "hi", 7, "s", "t")]
    runs = column_builder(cls, FIELDS, ("text", "seq"))(1, 2, "p1", ["hi"], [7], "s", "t")
    for built in singles + runs:
        assert type(built) is cls and built.__class__ is cls and isinstance(built, cls)
        assert attrs.asdict(built) == attrs.asdict(made)
        assert pickle.loads(pickle.dumps(built)) == made
        assert copy.copy(built) == made and copy.deepcopy(built) == made
        assert attrs.evolve(built, text="x") == attrs.evolve(made, text="x")
        assert weakref.ref(built)() is built
        for name in FIELDS:
            with pytest.raises(attrs.exceptions.FrozenInstanceError):
                setattr(built, name, "other")
            with pytest.raises(attrs.exceptions.FrozenInstanceError):
                delattr(built, name)
        assert getattr(built, "__dict__", None) is None  # still slotted: no dict


def test_the_deltas_twin_has_their_layout_and_object_s_setattr():
    """Why the twin's stores are fast: its ``__setattr__`` and ``__delattr__`` are
    ``object``'s (either one of the class's own would keep the interpreter's attribute
    store generic); and why it may become a ``TextDelta``: the same base and slots."""
    twin = _twin(o.TextDelta)
    assert twin.__bases__ == o.TextDelta.__bases__
    assert twin.__slots__ == o.TextDelta.__slots__
    assert twin.__basicsize__ == o.TextDelta.__basicsize__
    assert twin.__setattr__ is object.__setattr__ and twin.__delattr__ is object.__delattr__
    assert twin.__init__ is object.__init__  # twin() makes an empty one in C
    with pytest.raises(AttributeError):
        twin().text  # noqa: B018  (no field set: not the base's defaults)
    assert not issubclass(twin, o.TextDelta) and not issubclass(o.TextDelta, twin)


def test_a_class_with_its_own_weakref_slot_is_built_through_its_descriptors():
    """CPython refuses ``__class__`` assignment between two classes that each add
    ``__weakref__`` to their own slots (a base-less attrs class, as ``TextChunk``): such
    a class has no twin, and its builder writes its slots as before, the same value."""
    with pytest.raises(TypeError):
        _twin(TextChunk)
    build = slot_builder(TextChunk, ("text", "refusal"))
    built = build("a", True)
    assert type(built) is TextChunk and built == TextChunk(text="a", refusal=True)

    @attrs.frozen(kw_only=True, slots=True)
    class Plain:
        n: int
        m: str = ""

    columns = column_builder(Plain, ("n", "m"), ("n",))(3, [1, 2, 3], "x")
    assert columns == [Plain(n=1, m="x"), Plain(n=2, m="x"), Plain(n=3, m="x")]
    assert {type(c) for c in columns} == {Plain}


def test_a_column_builder_refuses_columns_of_another_length():
    """Each column holds exactly ``k`` values: one shorter or longer, or two of
    different lengths, is an error, never a silently shorter run."""
    build = column_builder(o.TextDelta, FIELDS, ("text", "seq"))
    with pytest.raises(ValueError):
        build(3, 1, "p", ["a", "b"], range(2), "s", "t")  # k says 3
    with pytest.raises(ValueError):
        build(2, 1, "p", ["a", "b"], range(3), "s", "t")  # the columns differ
    one = column_builder(o.TextDelta, FIELDS, ("text",))
    with pytest.raises(ValueError):
        one(1, 1, "p", ["a", "b"], 4, "s", "t")
    assert [d.seq for d in one(2, 1, "p", ["a", "b"], 4, "s", "t")] == [4, 4]
