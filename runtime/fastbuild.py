"""Building a frozen value class on the hot path for half of what its ``__init__`` costs.

Why: a frozen attrs class's ``__init__`` takes keyword arguments and sets each field
through ``object.__setattr__`` (the class's own ``__setattr__`` refuses); for the
:class:`~runtime.output.TextDelta` the stream controller builds per delta that was
0.7 us, a sixth of what a whole turn added per delta to the floor (issue 24). Writing
the slots through their member descriptors, positionally, builds the same value in
about half of it. Only for classes where that *is* the same value: every field set, and
no validator, converter, ``on_setattr``, cached hash or pre/post-init hook that
``__init__`` would run (:func:`slot_builder` refuses any other class).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Any

import attrs


def _check(cls: type, names: tuple[str, ...]) -> None:
    """Raise :class:`TypeError` unless setting ``names`` through the slots builds the
    value ``__init__`` would (see the module's docstring)."""
    fields = attrs.fields_dict(cls)
    if sorted(names) != sorted(fields) or len(set(names)) != len(names):
        raise TypeError(f"{cls.__name__}: the builder must set exactly its fields {list(fields)}")
    if "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not slotted")
    if "_attrs_cached_hash" in cls.__dict__["__slots__"]:  # a slot set by no field
        raise TypeError(f"{cls.__name__} caches its hash")
    for hook in ("__attrs_pre_init__", "__attrs_post_init__", "__attrs_init__"):
        if hasattr(cls, hook):
            raise TypeError(f"{cls.__name__} has {hook}: its __init__ does more than set fields")
    for field in fields.values():
        if field.validator is not None or field.converter is not None:
            raise TypeError(f"{cls.__name__}.{field.name} is validated or converted")
        if field.on_setattr not in (None, attrs.setters.NO_OP):
            raise TypeError(f"{cls.__name__}.{field.name} has on_setattr")


def slot_builder(cls: type, names: tuple[str, ...]) -> Callable[..., Any]:
    """A function that takes the values of ``names`` (every field of ``cls``, in that
    order) positionally and returns the instance ``cls(**dict(zip(names, values)))``
    would be, without running ``__init__``. Raises :class:`TypeError` for a class whose
    ``__init__`` does more than set its fields."""
    _check(cls, names)
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    lines = [f"def build({', '.join(names)}):", "    obj = _new(_cls)"]
    for i, name in enumerate(names):
        namespace[f"_set{i}"] = getattr(cls, name).__set__  # the slot's member descriptor
        lines.append(f"    _set{i}(obj, {name})")
    lines.append("    return obj")
    exec("\n".join(lines), namespace)  # field names only (attrs checked them)
    build: Callable[..., Any] = namespace["build"]
    build.__doc__ = f"{cls.__name__}({', '.join(f'{n}=...' for n in names)}), positionally."
    return build


def column_builder(
    cls: type, names: tuple[str, ...], columns: tuple[str, ...]
) -> Callable[..., list[Any]]:
    """A function that takes ``k`` and the values of ``names`` (every field of ``cls``,
    in that order) positionally, each of ``columns`` as an iterable of at least ``k``
    values and any other as one value for all, and returns the ``k`` instances
    :func:`slot_builder`'s function would build from the columns' values in order.

    Why: the stream controller builds a run's ``TextDelta`` s at once (issue 24), and
    a Python call a delta (the builder's frame, six slot writes from bytecode) was most
    of what they cost: here the instances are made and each field written for all of
    them by ``map`` over ``object.__new__`` and the slot's setter, in C (0.38 -> 0.32 us
    a delta, 128 deltas). Raises :class:`TypeError` as :func:`slot_builder` does, or for
    a column that is not a field."""
    _check(cls, names)
    if not set(columns) <= set(names):
        raise TypeError(f"{cls.__name__}: columns {columns} are not all fields")
    plan = tuple((getattr(cls, name).__set__, name in columns) for name in names)
    new = object.__new__

    def build(k: int, *values: Any) -> list[Any]:
        made: list[Any] = list(map(new, repeat(cls, k)))
        for (put, column), value in zip(plan, values, strict=True):
            given: Iterable[Any] = value if column else repeat(value, k)
            deque(map(put, made, given), 0)  # map stops at ``made``'s end
        return made

    build.__doc__ = f"k {cls.__name__} s of (k, {', '.join(names)}); columns: {columns}."
    return build


__all__ = ["column_builder", "slot_builder"]
