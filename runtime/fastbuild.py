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

from collections.abc import Callable
from typing import Any

import attrs


def slot_builder(cls: type, names: tuple[str, ...]) -> Callable[..., Any]:
    """A function that takes the values of ``names`` (every field of ``cls``, in that
    order) positionally and returns the instance ``cls(**dict(zip(names, values)))``
    would be, without running ``__init__``. Raises :class:`TypeError` for a class whose
    ``__init__`` does more than set its fields."""
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


__all__ = ["slot_builder"]
