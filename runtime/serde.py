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

from runtime import chunks, events, messages, output

converter = cattrs.Converter()
"""The converter. Use :func:`to_json` / :func:`from_json` for bytes."""

_TAGGED: dict[type, tuple[str, str]] = {}  # class -> (tag field, tag value)
_UNSTRUCTURE_OVERRIDES: dict[type, dict[str, Any]] = {
    # Only a failed message carries ``error``: every other stored message keeps the JSON
    # it always had, and data stored before the field existed loads with ``error=None``.
    messages.AssistantMessage: {"error": override(omit_if_default=True)},
    # Only a call that suspended its turn carries ``awaiting`` (docs/approval.md).
    messages.ToolCallPart: {"awaiting": override(omit_if_default=True)},
}
_BY_TAG: dict[tuple[Any, Any], type] = {}  # (union marker, tag value) -> class
_Dict = dict[str, Any]


def _register(marker: Any, tag_field: str, classes: tuple[type, ...]) -> None:
    """Tagged-union hooks for ``classes`` (the members of the union ``marker``)."""
    for cls in classes:
        value = getattr(cls, tag_field)
        _TAGGED[cls] = (tag_field, value)
        _BY_TAG[(marker, value)] = cls
        base_un: Callable[[Any], _Dict] = make_dict_unstructure_fn(
            cls, converter, **_UNSTRUCTURE_OVERRIDES.get(cls, {})
        )
        base_st: Callable[[_Dict, Any], Any] = make_dict_structure_fn(cls, converter)

        def unstructure(
            obj: Any,
            _f: Callable[[Any], _Dict] = base_un,
            _field: str = tag_field,
            _value: Any = value,
        ) -> _Dict:
            d = _f(obj)
            d[_field] = _value
            return d

        def structure(
            d: _Dict,
            _t: Any,
            _f: Callable[[_Dict, Any], Any] = base_st,
            _field: str = tag_field,
        ) -> Any:
            if _field in d:
                d = {k: v for k, v in d.items() if k != _field}
            return _f(d, _t)

        converter.register_unstructure_hook(cls, unstructure)
        converter.register_structure_hook(cls, structure)

    def structure_union(d: _Dict, _t: Any, _marker: Any = marker, _field: str = tag_field) -> Any:
        try:
            cls = _BY_TAG[(_marker, d[_field])]
        except KeyError:
            raise ValueError(f"unknown {_field} {d.get(_field)!r} for {_marker}") from None
        return converter.structure(d, cls)

    converter.register_structure_hook(marker, structure_union)


_PARTS: tuple[type, ...] = messages.Part.__args__
_MESSAGES: tuple[type, ...] = messages.Message.__args__
_STREAM: tuple[type, ...] = chunks.StreamChunk.__args__

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


_register(messages.Part, "type", _PARTS)
_register(messages.UserPart, "type", messages.UserPart.__args__)
_register(messages.Message, "role", _MESSAGES)
_register(chunks.StreamChunk, "type", _STREAM)
_register(output.OutputChunk, "type", output.OUTPUT_CHUNK_TYPES)
# Every bus event (lifecycle and output) structures through the Event marker by kind.
_register(events.Event, "kind", events.LIFECYCLE_EVENT_TYPES)
for _cls in output.OUTPUT_CHUNK_TYPES:
    _BY_TAG[(events.Event, getattr(_cls, "kind"))] = _cls  # noqa: B009 - set by @_out


def _structure_event(d: _Dict, _t: Any) -> Any:
    # Output chunks carry ``type`` (their public JSON form); lifecycle events ``kind``.
    kind = d.get("kind") or ("output." + d["type"] if "type" in d else None)
    try:
        cls = _BY_TAG[(events.Event, kind)]
    except KeyError:
        raise ValueError(f"unknown kind {kind!r} for an event") from None
    return converter.structure(d, cls)


converter.register_structure_hook(events.Event, _structure_event)


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

_tool_stream_base = make_dict_structure_fn(output.ToolStream, converter)


def _structure_tool_stream(d: _Dict, _t: Any) -> Any:
    d = {k: v for k, v in d.items() if k != "type"}
    inner = d.get("chunk")
    value: output.ToolStream = _tool_stream_base({**d, "chunk": None}, _t)
    if isinstance(inner, dict):
        inner = _structure_event(inner, events.Event)
    return attrs.evolve(value, chunk=inner)  # type: ignore[misc]  # attrs via @_out


converter.register_structure_hook(output.ToolStream, _structure_tool_stream)


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
