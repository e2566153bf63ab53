"""Building a frozen value class on the hot path for a fraction of what its ``__init__`` costs.

Why: a frozen attrs class's ``__init__`` takes keyword arguments and sets each field
through ``object.__setattr__`` (the class's own ``__setattr__`` refuses); for the
:class:`~runtime.output.TextDelta` the stream controller builds per delta that was
0.7 us, a sixth of what a whole turn added per delta to the floor (issue 24). Only for
classes where setting the slots *is* the same value: every field set, and no validator,
converter, ``on_setattr``, cached hash or pre/post-init hook that ``__init__`` would run
(the builders refuse any other class).

How: an instance is made as the class's *twin* (:func:`_twin`: the same base and slots,
but ``object``'s own ``__setattr__``, ``__delattr__`` and ``__init__``), whose fields the
interpreter writes with its specialised slot store, a few nanoseconds each, and then
becomes an instance of the class by ``__class__`` assignment, which CPython allows only
between classes of the same layout (it checks that at every assignment). The frozen
class's ``__setattr__`` keeps that store from specialising: writing its slots through
their member descriptors' ``__set__`` cost ~40 ns a field, six fields most of a delta's
build (issue 24 goal 1: 335 -> 165 ns a ``TextDelta``). The value is the one ``__init__``
makes: a ``cls`` instance with every slot set; a twin instance never leaves the builder.
What can tell: the twin is a subclass of the class's base (``_Base.__subclasses__()``),
and each assignment raises the ``object.__setattr__`` audit event (``sys.addaudithook``).
"""

from __future__ import annotations

from collections.abc import Callable
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


def _twin(cls: type) -> type:
    """A class of ``cls``'s layout whose instances the interpreter writes directly: a
    subclass of ``cls``'s one base with ``cls``'s own ``__slots__``, ``object``'s
    ``__setattr__`` and ``__delattr__`` (both: either one of a class's own keeps its
    attribute stores generic) and ``object``'s ``__init__``, nothing else. Raises
    :class:`TypeError` if an instance of it cannot become a ``cls`` (another layout:
    CPython refuses the assignment)."""
    if len(cls.__bases__) != 1:
        raise TypeError(f"{cls.__name__} has more than one base")
    namespace = {
        "__slots__": cls.__dict__["__slots__"],
        "__setattr__": object.__setattr__,
        "__delattr__": object.__delattr__,
        "__init__": object.__init__,  # so ``twin()`` makes one in C, no argument tuple
        "__module__": __name__,
        "__qualname__": f"_twin.<{cls.__qualname__}>",
    }
    twin = type(f"{cls.__name__}Twin", cls.__bases__, namespace)
    probe: Any = object.__new__(twin)
    probe.__class__ = cls  # raises TypeError for another layout
    return twin


def _writes(
    cls: type, names: tuple[str, ...], values: list[str], indent: str
) -> tuple[list[str], dict[str, Any]]:
    """The lines that make ``obj`` with ``names`` set to ``values`` (expressions) and
    the names they use: as ``cls``'s twin, then a ``cls`` (:func:`_twin`), or, for a
    class whose layout has no twin (CPython refuses ``__class__`` assignment between two
    classes that each add ``__weakref__`` to their own slots, as a base-less attrs class
    does), made as a ``cls`` and each slot written through its member descriptor."""
    try:
        namespace: dict[str, Any] = {"_twin": _twin(cls), "_cls": cls}
    except TypeError:
        namespace = {"_new": object.__new__, "_cls": cls}
        lines = [f"{indent}obj = _new(_cls)"]
        for i, (name, value) in enumerate(zip(names, values, strict=True)):
            namespace[f"_set{i}"] = getattr(cls, name).__set__  # the slot's member descriptor
            lines.append(f"{indent}_set{i}(obj, {value})")
        return lines, namespace
    lines = [f"{indent}obj = _twin()"]
    lines += [f"{indent}obj.{n} = {v}" for n, v in zip(names, values, strict=True)]
    lines.append(f"{indent}obj.__class__ = _cls")
    return lines, namespace


def _compile(lines: list[str], namespace: dict[str, Any], doc: str) -> Callable[..., Any]:
    exec("\n".join(lines), namespace)  # field names only (attrs checked them)
    build: Callable[..., Any] = namespace["build"]
    build.__doc__ = doc
    return build


def slot_builder(cls: type, names: tuple[str, ...]) -> Callable[..., Any]:
    """A function that takes the values of ``names`` (every field of ``cls``, in that
    order) positionally and returns the instance ``cls(**dict(zip(names, values)))``
    would be, without running ``__init__`` (made as the twin, then a ``cls``: see the
    module's docstring). Raises :class:`TypeError` for a class whose ``__init__`` does
    more than set its fields."""
    _check(cls, names)
    params = [f"v{i}" for i in range(len(names))]
    writes, namespace = _writes(cls, names, params, "    ")
    lines = [f"def build({', '.join(params)}):", *writes, "    return obj"]
    doc = f"{cls.__name__}({', '.join(f'{n}=...' for n in names)}), positionally."
    return _compile(lines, namespace, doc)


def column_builder(
    cls: type, names: tuple[str, ...], columns: tuple[str, ...]
) -> Callable[..., list[Any]]:
    """A function that takes ``k`` and the values of ``names`` (every field of ``cls``,
    in that order) positionally, each of ``columns`` as an iterable of exactly ``k``
    values and any other as one value for all, and returns the ``k`` instances
    :func:`slot_builder`'s function would build from the columns' values in order
    (:class:`ValueError` for a column of another length).

    Why: the stream controller builds a run's ``TextDelta`` s at once (issue 24): one
    loop over the columns, each instance made and its fields written by bytecode in it,
    no call a delta but ``object.__new__``. Raises :class:`TypeError` as
    :func:`slot_builder` does, or for a column that is not a field."""
    _check(cls, names)
    if not columns or not set(columns) <= set(names):
        raise TypeError(f"{cls.__name__}: columns {columns} are not all fields")
    params = [f"v{i}" for i in range(len(names))]
    items = [f"c{i}" for i, name in enumerate(names) if name in columns]
    given = [f"v{i}" for i, name in enumerate(names) if name in columns]
    each = (
        f"{items[0]} in {given[0]}"
        if len(items) == 1
        else f"{', '.join(items)} in zip({', '.join(given)}, strict=True)"
    )
    values = [f"{'c' if name in columns else 'v'}{i}" for i, name in enumerate(names)]
    writes, namespace = _writes(cls, names, values, "        ")
    lines = [
        f"def build(k, {', '.join(params)}):",
        "    made = []",
        "    append = made.append",
        f"    for {each}:",
        *writes,
        "        append(obj)",
        "    if len(made) != k:",
        "        raise ValueError(f'{len(made)} values in a column, not {k}')",
        "    return made",
    ]
    doc = f"k {cls.__name__} s of (k, {', '.join(names)}); columns: {columns}."
    return _compile(lines, namespace, doc)


__all__ = ["column_builder", "slot_builder"]
