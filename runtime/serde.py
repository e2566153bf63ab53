"""One cattrs converter for every event, chunk, part and message.

The JSON form of a value is its fields by name plus its tag: ``type`` for chunks and
parts, ``role`` for messages, ``kind`` for lifecycle events. Structuring dispatches on
the tag, so a heterogeneous list (a history, an event log) round-trips losslessly.
The models know nothing of this module: converters are kept apart from the models.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, cast

import attrs
import cattrs
import orjson
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.strategies import configure_tagged_union

from runtime import chunks, events, messages, output

converter = cattrs.Converter()
"""The converter. Use :func:`to_json` / :func:`from_json` for bytes."""

_UNSTRUCTURE_OVERRIDES: dict[type, dict[str, Any]] = {
    # Only a failed message carries ``error``: every other stored message keeps the JSON
    # it always had, and data stored before the field existed loads with ``error=None``.
    messages.AssistantMessage: {
        "error": override(omit_if_default=True),
        "usage": override(omit_if_default=True),  # messages stored before it, or built
    },
    # Only a call that suspended its turn carries ``awaiting`` (docs/approval.md).
    messages.ToolCallPart: {"awaiting": override(omit_if_default=True)},
    # Only a compaction summary carries ``summarizes_before`` (runtime/compaction.py).
    messages.SystemMessage: {"summarizes_before": override(omit_if_default=True)},
}
_Dict = dict[str, Any]

# A wait without a deadline stores the JSON it always had (docs/approval.md).
converter.register_unstructure_hook(
    messages.Awaiting,
    make_dict_unstructure_fn(
        messages.Awaiting, converter, expires_at=override(omit_if_default=True)
    ),
)


def _tag_each(tag_field: str, classes: tuple[type, ...]) -> None:
    """Unstructure each of ``classes`` with its tag (last, after its fields), however it
    is reached: cattrs' tagged-union strategy adds the tag only to a value unstructured
    *as the union*, and a stored history, a ``run --jsonl`` line or an event log holds
    values unstructured on their own, all tagged."""
    for cls in classes:
        fields: Callable[[Any], _Dict] = make_dict_unstructure_fn(
            cls, converter, **_UNSTRUCTURE_OVERRIDES.get(cls, {})
        )

        def unstructure(
            obj: Any,
            _f: Callable[[Any], _Dict] = fields,
            _field: str = tag_field,
            _value: Any = getattr(cls, tag_field),
        ) -> _Dict:
            d = _f(obj)
            d[_field] = _value
            return d

        converter.register_unstructure_hook(cls, unstructure)


def _tagged_union(union: Any, tag_field: str) -> None:
    """Structure ``union`` by the tag its members carry (cattrs' strategy), an unknown
    tag being a one-line ``ValueError`` that names it (cattrs says only ``KeyError``).

    Call it after every hook of the members is registered: the strategy takes them then."""
    configure_tagged_union(
        union, converter, tag_generator=lambda cls: getattr(cls, tag_field), tag_name=tag_field
    )
    by_tag: Callable[[_Dict, Any], Any] = converter.get_structure_hook(union)
    tags = frozenset(getattr(cls, tag_field) for cls in union.__args__)

    def structure(d: _Dict, t: Any) -> Any:
        try:
            return by_tag(d, t)
        except KeyError:
            if d.get(tag_field) in tags:
                raise
            raise ValueError(f"unknown {tag_field} {d.get(tag_field)!r} for {union}") from None

    converter.register_structure_hook(union, structure)


# Bytes (image and file data) are base64 text in JSON.
converter.register_unstructure_hook(bytes, lambda b: base64.b64encode(b).decode("ascii"))
converter.register_structure_hook(
    bytes, lambda v, _t: v if isinstance(v, bytes) else base64.b64decode(v, validate=True)
)


# cattrs structures a union alias, but types ``structure``'s class as ``type[T]``, which a
# ``X | Y`` value (a ``UnionType`` to mypy) is not; this says what it stands for.
_USER_PART = cast("type[messages.UserPart]", messages.UserPart)


def _structure_user_content(value: Any, _t: Any) -> Any:
    # ``str`` (every message stored before media existed) or a list of tagged parts.
    if isinstance(value, str):
        return value
    return tuple(converter.structure(p, _USER_PART) for p in value)


converter.register_structure_hook_func(lambda t: t == messages.UserContent, _structure_user_content)


# A tool's media output (a tuple of parts) is stored as a list of tagged part dicts; they
# come back as parts only when every item has exactly a part's keys and one is an image or
# file, so an ordinary JSON output that merely has a "type" key stays what it was.
_PART_KEYS = {
    cls.type: {a.name for a in attrs.fields(cls)} | {"type"} for cls in messages.UserPart.__args__
}


def _media_output(output: Any) -> Any:
    if not isinstance(output, list) or not output:
        return output
    if not all(isinstance(p, dict) and _PART_KEYS.get(p.get("type")) == p.keys() for p in output):
        return output
    if not any(p["type"] in ("image", "file") for p in output):
        return output
    return tuple(converter.structure(p, _USER_PART) for p in output)


_tool_message_base = converter.get_structure_hook(messages.ToolMessage)


def _structure_tool_message(d: _Dict, _t: Any) -> Any:
    value = _tool_message_base(d, _t)
    output = _media_output(value.output)
    return value if output is value.output else attrs.evolve(value, output=output)


converter.register_structure_hook(messages.ToolMessage, _structure_tool_message)


# Every bus event (lifecycle and output) structures through the Event base by kind. Not
# cattrs' strategy: ``Event`` is a base class, not a union, and an output chunk's JSON
# carries its ``type`` (its public form), so the kind may have to be made from that.
_EVENTS: dict[str, type] = {
    cls.kind: cls  # type: ignore[attr-defined]  # set by @_event and @_out
    for cls in events.LIFECYCLE_EVENT_TYPES + output.OUTPUT_CHUNK_TYPES
}


def _structure_event(d: _Dict, _t: Any) -> Any:
    kind = d.get("kind") or ("output." + d["type"] if "type" in d else None)
    try:
        cls = _EVENTS[kind]  # type: ignore[index]
    except KeyError:
        raise ValueError(f"unknown kind {kind!r} for an event") from None
    return converter.structure(d, cls)


# By predicate, not by class: a class hook would be singledispatch's, taken by every
# event class too (each is an ``Event``), and structuring one would come back here.
converter.register_structure_hook_func(lambda t: t is events.Event, _structure_event)

_tool_stream_base = make_dict_structure_fn(output.ToolStream, converter)


def _structure_tool_stream(d: _Dict, _t: Any) -> Any:
    inner = d.get("chunk")
    value: output.ToolStream = _tool_stream_base({**d, "chunk": None}, _t)
    if isinstance(inner, dict):
        inner = _structure_event(inner, events.Event)
    return attrs.evolve(value, chunk=inner)  # type: ignore[misc]  # attrs via @_out


converter.register_structure_hook(output.ToolStream, _structure_tool_stream)

_tag_each("type", tuple(dict.fromkeys(messages.Part.__args__ + messages.UserPart.__args__)))
_tag_each("role", messages.Message.__args__)
_tag_each("type", chunks.StreamChunk.__args__)
_tag_each("type", output.OUTPUT_CHUNK_TYPES)
_tag_each("kind", events.LIFECYCLE_EVENT_TYPES)
# Parts first: a message's hook, made when its union is configured, takes theirs.
_tagged_union(messages.UserPart, "type")
_tagged_union(messages.Part, "type")
_tagged_union(messages.Message, "role")
_tagged_union(chunks.StreamChunk, "type")
_tagged_union(output.OutputChunk, "type")


def unstructure(value: Any) -> Any:
    """Plain JSON-ready data for any model value (or list of them)."""
    return converter.unstructure(value)


def structure(data: Any, cls: Any) -> Any:
    """The model value for ``data``; ``cls`` may be a union such as ``Message``."""
    return converter.structure(data, cls)


def to_json(value: Any) -> bytes:
    """Serialize a model value to JSON bytes (orjson; non-JSON leaves fall back to str)."""
    return orjson.dumps(converter.unstructure(value), default=str)


def from_json(data: bytes | str, cls: Any) -> Any:
    return converter.structure(orjson.loads(data), cls)


def event_to_dict(event: Any) -> dict[str, Any]:
    """The JSON form of a bus event, always with its ``kind`` (output chunks too)."""
    d: _Dict = converter.unstructure(event)
    d.setdefault("kind", event.kind)
    return d
