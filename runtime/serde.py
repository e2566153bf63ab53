"""One cattrs converter for every event, chunk, part and message.

The JSON form of a value is its fields by name plus its tag: ``type`` for chunks and
parts, ``role`` for messages, ``kind`` for lifecycle events. Structuring dispatches on
the tag, so a heterogeneous list (a history, an event log) round-trips losslessly.
The models know nothing of this module: converters are kept apart from the models.

Every hook that cattrs generates (it compiles a function per class) is made on first use
of its class, not when this module is imported: a process that saves a text turn builds
the few it needs, not one for each of the hundred-odd classes (issue 24, start-up).
"""

from __future__ import annotations

import base64
import operator
import threading
import types
import typing
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, cast

import attrs
import cattrs
import orjson
from cattrs.fns import identity
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from runtime import chunks, events, messages, output

# Integers past 64 bits: runtime/json_exact.py, a module of its own so that the contract
# modules writing JSON exactly build neither this converter nor the lifecycle events at
# import (issue 24's start-up); its names are this module's too.
from runtime.json_exact import (
    BIG_INT_MARK as BIG_INT_MARK,
)
from runtime.json_exact import (
    INT_MAX as INT_MAX,
)
from runtime.json_exact import (
    INT_MIN as INT_MIN,
)
from runtime.json_exact import (
    MAX_DEPTH as MAX_DEPTH,
)
from runtime.json_exact import (
    dumps as dumps,
)
from runtime.json_exact import (
    exact as exact,
)
from runtime.json_exact import (
    exact_loads as exact_loads,
)
from runtime.json_exact import (
    loads as loads,
)
from runtime.json_exact import (
    lost_int as lost_int,
)
from runtime.json_exact import (
    with_big_ints as with_big_ints,
)

converter = cattrs.Converter()
"""The converter. Use :func:`to_json` / :func:`from_json` for bytes."""

_UNSTRUCTURE_OVERRIDES: dict[type, dict[str, Any]] = {
    # Only a failed message carries ``error``: every other stored message keeps the JSON
    # it always had, and data stored before the field existed loads with ``error=None``.
    messages.AssistantMessage: {
        "error": override(omit_if_default=True),
        "usage": override(omit_if_default=True),  # messages stored before it, or built
    },
    # Only cited text carries ``citations`` (Anthropic): all other text keeps its JSON.
    messages.TextPart: {"citations": override(omit_if_default=True)},
    # Only a call that suspended its turn carries ``awaiting`` (docs/approval.md).
    messages.ToolCallPart: {"awaiting": override(omit_if_default=True)},
    # Only a compaction summary carries ``summarizes_before`` (runtime/compaction.py).
    messages.SystemMessage: {"summarizes_before": override(omit_if_default=True)},
    # Only an edited call's result says whether it ran (docs/approval.md).
    messages.ToolMessage: {
        "ran": override(omit_if_default=True),
        "ran_unknown": override(omit_if_default=True),
    },
    # Only a sub-agent's approval passed up names the call that asks (docs/approval.md):
    # every other request keeps the JSON it always had.
    output.ToolApprovalRequest: {
        "asked_tool": override(omit_if_default=True),
        "asked_input": override(omit_if_default=True),
        "asked_via": override(omit_if_default=True),
    },
}
_Dict = dict[str, Any]

# A wait without a deadline stores the JSON it always had (docs/approval.md).
converter.register_unstructure_hook_factory(
    lambda t: t is messages.Awaiting,
    lambda t: make_dict_unstructure_fn(
        t,
        converter,
        expires_at=override(omit_if_default=True),
        nested=override(omit_if_default=True),
        caller=override(omit_if_default=True),
        sub_tool=override(omit_if_default=True),
        sub_input=override(omit_if_default=True),
        counted=override(omit_if_default=True),
        original_input=override(omit_if_default=True),
        edit_in_result=override(omit_if_default=True),
        schema=override(omit_if_default=True),
        schema_ref=override(omit_if_default=True),
        asked_tool=override(omit_if_default=True),
        asked_input=override(omit_if_default=True),
        asked_via=override(omit_if_default=True),
        edited_input=override(omit_if_default=True),
        sub_answered=override(omit_if_default=True),
    ),
)


def _optional_scalar(t: Any) -> bool:
    """Whether ``t`` is ``X | None`` for a type ``X`` the converter leaves as it is
    (``str``, ``int``, ``float``, ``bool``, a ``Literal``): cattrs's hook for it is a
    function call per value that hands a value other than ``None`` to ``X``'s hook, the
    identity. Unstructured as the identity itself, a class's generated function reads
    such a field in line (``'model': instance.model``), as it does a ``str`` one: the
    same values, without a call each (an event has two to five: ``causation_id``,
    ``usage``'s token counts; issue 24 goal 1)."""
    if typing.get_origin(t) not in (typing.Union, types.UnionType):
        return False
    args = typing.get_args(t)
    if len(args) != 2 or type(None) not in args:
        return False
    other = args[0] if args[1] is type(None) else args[1]
    if other in _SCALAR_TYPES:
        return True
    return typing.get_origin(other) is typing.Literal and all(
        type(v) in _SCALAR_TYPES for v in typing.get_args(other)
    )


_SCALAR_TYPES = (str, int, float, bool)
converter.register_unstructure_hook_factory(_optional_scalar, lambda _t: identity)

_TAGS: dict[type, str] = {}
"""The classes unstructured with their tag, each to the name of its tag field."""


def _tagged_class(t: Any) -> type | None:
    """The class of :data:`_TAGS` that ``t`` is or derives from (a ``RetryPrompt`` is a
    ``UserMessage``), or ``None``."""
    if not isinstance(t, type):
        return None
    for c in t.__mro__:  # (a loop: a generator left unfinished is closed by an exception)
        if c in _TAGS:
            return c
    return None


def _tagged_unstructure(t: type) -> Callable[[Any], _Dict]:
    """``t``'s unstructure hook, made on its first use: its fields, then its tag."""
    cls = _tagged_class(t)
    assert cls is not None
    field = _TAGS[cls]
    fields: Callable[[Any], _Dict] = make_dict_unstructure_fn(
        t, converter, **_UNSTRUCTURE_OVERRIDES.get(cls, {})
    )
    value = getattr(cls, field)

    def unstructure(obj: Any) -> _Dict:
        d = fields(obj)
        d[field] = value
        return d

    return unstructure


converter.register_unstructure_hook_factory(
    lambda t: _tagged_class(t) is not None, _tagged_unstructure
)


def _tag_each(tag_field: str, classes: tuple[type, ...]) -> None:
    """Unstructure each of ``classes`` with its tag (last, after its fields), however it
    is reached: a tagged union's tag only on a value unstructured *as the union* would not
    do, since a stored history, a ``run --jsonl`` line or an event log holds values
    unstructured on their own, all tagged."""
    for cls in classes:
        _TAGS[cls] = tag_field


def _tagged_union(union: Any, tag_field: str) -> None:
    """Structure ``union`` by the tag its members carry, an unknown tag being a one-line
    ``ValueError`` that names it. What cattrs' tagged-union strategy does, except that a
    member's hook is made when a value of it is first read, not when this module loads."""
    by_tag = {getattr(cls, tag_field): cls for cls in union.__args__}

    def structure(d: _Dict, _t: Any) -> Any:
        try:
            cls = by_tag[d[tag_field]]
        except (KeyError, TypeError):
            tag = d.get(tag_field) if isinstance(d, dict) else None
            raise ValueError(f"unknown {tag_field} {tag!r} for {union}") from None
        value = dict(d)
        del value[tag_field]
        return converter.structure(value, cls)

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
def _media_output(output: Any) -> Any:
    if not messages.reads_back_as_media(output):
        return output
    return tuple(converter.structure(p, _USER_PART) for p in output)


def _structure_tool_message(t: type) -> Callable[[_Dict, Any], Any]:
    base: Callable[[_Dict, Any], Any] = make_dict_structure_fn(t, converter)

    def structure(d: _Dict, _t: Any) -> Any:
        value = base(d, _t)
        output = _media_output(value.output)
        return value if output is value.output else attrs.evolve(value, output=output)

    return structure


converter.register_structure_hook_factory(
    lambda t: t is messages.ToolMessage, _structure_tool_message
)


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


def _structure_tool_stream(t: type) -> Callable[[_Dict, Any], Any]:
    base: Callable[[_Dict, Any], Any] = make_dict_structure_fn(t, converter)

    def structure(d: _Dict, _t: Any) -> Any:
        inner = d.get("chunk")
        value: output.ToolStream = base({**d, "chunk": None}, _t)
        if isinstance(inner, dict):
            inner = _structure_event(inner, events.Event)
        return attrs.evolve(value, chunk=inner)  # type: ignore[misc]  # attrs via @_out

    return structure


converter.register_structure_hook_factory(lambda t: t is output.ToolStream, _structure_tool_stream)

_tag_each("type", tuple(dict.fromkeys(messages.Part.__args__ + messages.UserPart.__args__)))
_tag_each("role", messages.Message.__args__)
_tag_each("type", chunks.StreamChunk.__args__)
_tag_each("type", output.OUTPUT_CHUNK_TYPES)
_tag_each("kind", events.LIFECYCLE_EVENT_TYPES)
_tagged_union(messages.UserPart, "type")
_tagged_union(messages.Part, "type")
_tagged_union(messages.Message, "role")
_tagged_union(chunks.StreamChunk, "type")
_tagged_union(output.OutputChunk, "type")


def unstructure(value: Any) -> Any:
    """Plain JSON-ready data for any model value (or list of them)."""
    return converter.unstructure(value)


def unstructurer(cls: type) -> Callable[[Any], Any]:
    """What :func:`unstructure` calls for a value of ``cls`` (the converter's hook for the
    class): for a caller that unstructures many values of a few classes and looks each
    class's up once, not the converter's dispatch per value."""
    hook: Callable[[Any], Any] = converter.get_unstructure_hook(cls)
    return hook


def flat_unstructurer(cls: type) -> Callable[[Any], _Dict] | None:
    """For a tagged class (an output chunk) every field of which the converter keeps as
    it is (``str``, ``int``, ``X | None`` of those: :func:`_optional_scalar`), and without
    overrides: one function that gives what :func:`unstructurer`'s hook gives (its
    fields in order, then its tag), in one Python call where the hook makes two (its
    fields' generated function, then the tag). A relay writer unstructures ~33 chunks a
    worker's turn (issue 24 goal 3). ``None`` for any other class."""
    tagged = _tagged_class(cls)
    if tagged is None or not attrs.has(cls) or _UNSTRUCTURE_OVERRIDES.get(tagged):
        return None
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a name it cannot resolve: the converter's own hook
        return None
    names = []
    for a in attrs.fields(cls):
        kept = converter.get_unstructure_hook(hints[a.name]) is identity
        if not (kept and a.name.isidentifier()):
            return None
        names.append(a.name)
    field = _TAGS[tagged]
    if field in names:
        return None
    items = "".join(f"{name!r}: o.{name}, " for name in names)
    source = f"def unstructure_flat(o):\n    return {{{items}{field!r}: tag}}\n"
    scope: dict[str, Any] = {"tag": getattr(tagged, field)}
    exec(source, scope)  # (the names are a class's attribute names, checked above)
    flat: Callable[[Any], _Dict] = scope["unstructure_flat"]
    return flat


def structure(data: Any, cls: Any) -> Any:
    """The model value for ``data``; ``cls`` may be a union such as ``Message``."""
    return converter.structure(data, cls)


def to_json(value: Any) -> bytes:
    """Serialize a model value to JSON bytes (orjson; non-JSON leaves fall back to str;
    an integer past 64 bits exactly, :func:`dumps`)."""
    return dumps(converter.unstructure(value), default=str)


def from_json(data: bytes | str, cls: Any) -> Any:
    """The model value of JSON this process's kind wrote (:func:`to_json`), its integers
    past 64 bits exact (:func:`loads`)."""
    return converter.structure(loads(data), cls)


ENCODED_MESSAGES = 64
"""How many assistant messages :func:`message_json` keeps the encoded parts of (the
latest saved, by message id): a host's turns in progress, each of which is saved again
at its next step with the same parts and some more."""
KEPT_FROM_BYTES = 1024
"""An assistant message encoded to fewer bytes is not kept by :func:`message_json`:
encoding it whole again is cheaper than joining its parts' JSON (a message of one text
part: 3 us whole, 6 us joined), and an ordinary turn's one or two saves pay nothing."""
ENCODED_BYTES = 64 * 1024 * 1024
"""At most this many bytes of encoded parts kept by :func:`message_json` (the oldest
dropped first); a message encoded to more is not kept."""


@attrs.frozen(slots=True)
class _Encoded:
    """An assistant message's parts (the very objects), the JSON it was encoded to, and
    where in it each part's JSON ends (``ends[i]``: part ``i``'s; ``-1``: not known, the
    message having been encoded whole; the last part's is always known)."""

    parts: tuple[Any, ...]
    ends: tuple[int, ...]
    body: bytes


_encoded: OrderedDict[str, _Encoded] = OrderedDict()
_encoded_lock = threading.Lock()  # (stores encode a long save in a worker thread)
_encoded_bytes = [0]
_keeping: OrderedDict[str, None] = OrderedDict()
"""The ids of the messages :func:`message_json` keeps (:func:`keep_encoded`)."""
KEEPING = 4096
"""At most this many ids marked to keep (a turn that never made its last save leaves
its mark; the oldest go first)."""


def keep_encoded(message_id: str) -> None:
    """Have :func:`message_json` keep the encoded parts of the message ``message_id``: a
    running turn's answer, which its next step's save stores again (the persister marks
    it at a step's save, and :func:`forget_encoded` at its last). Only those: any
    assistant message of 1 KB encoded whole was kept before, a history given to a
    session (a client's, AG-UI or Chat Completions) too, its parts held after its turn
    (their objects ~11x their JSON) until 64 other messages pushed them out."""
    with _encoded_lock:
        _keeping[message_id] = None
        _keeping.move_to_end(message_id)
        if len(_keeping) > KEEPING:
            _keeping.popitem(last=False)


def message_json(message: Any) -> bytes:
    """:func:`to_json` of a message, the same bytes, encoding only what changed since
    the message was last encoded: an assistant message's parts that were in the one of
    its id encoded last (the very objects, at the same places) are not encoded again.

    Why: a turn's assistant message holds the parts of every step of the turn, and each
    step's save stores it again, one more step's parts on: every save encoding it whole
    made a turn of n steps encode n(n+1)/2 parts (1,000 steps: 500,500 tool calls
    unstructured, 47 MB encoded; benchmarks/journal/pipeline.md, ``stepsaves``). A part
    is a frozen value, so what it encoded to stands while it is the same object; the
    parts must be a tuple: a list given as ``content`` and changed in place (a part
    replaced, one added) compared the same with itself, and its old bytes were stored
    (or an ``IndexError`` raised). A message that cannot be encoded part by part (a
    value orjson refuses) is encoded by :func:`to_json`, whose error the caller handles
    as before."""
    if (
        type(message) is not messages.AssistantMessage
        or type(message.content) is not tuple  # (a list changed in place seems the same)
        or not message.content
    ):
        return to_json(message)
    try:
        return _assistant_json(message)
    except (TypeError, ValueError, RecursionError):  # (orjson's errors are TypeErrors)
        return to_json(message)


def _assistant_json(message: messages.AssistantMessage) -> bytes:
    """:func:`message_json` of an assistant message with parts: whole (:func:`to_json`)
    when none of its parts was kept (a turn's first save, a short message: no slower
    than it was), else the known ones' JSON and the others'. A new part is encoded inside a list
    inside an object, as deep as it sits in its message, so a value nested too deep for
    orjson fails here as it fails in the whole message."""
    content = message.content
    known = _encoded.get(message.id)
    same = 0
    if known is not None:
        old, ends = known.parts, known.ends
        n = min(len(old), len(content))
        if all(map(operator.is_, content[:n], old[:n])):
            same = n
        else:
            while content[same] is old[same]:
                same += 1
        while same and ends[same - 1] < 0:
            same -= 1
    if not same:
        body = to_json(message)
        if len(body) < KEPT_FROM_BYTES or message.id not in _keeping:
            return body
        end = body.rfind(b'],"id":' + orjson.dumps(message.id))  # (no string holds `"],`)
        if end > 0:
            _remember(message.id, _Encoded(content, (-1,) * (len(content) - 1) + (end,), body))
        return body
    assert known is not None
    kept = list(known.ends[:same])
    end = kept[-1]
    pieces: list[Any] = [memoryview(known.body)[:end]]
    for part in content[same:]:
        encoded = dumps({"c": [converter.unstructure(part)]}, default=str)[6:-2]
        pieces.append(b",")
        pieces.append(encoded)
        end += len(encoded) + 1
        kept.append(end)
    pieces.append(b"],")
    pieces.append(dumps(_assistant_fields(message), default=str)[1:])
    body = b"".join(pieces)
    _remember(message.id, _Encoded(content, tuple(kept), body))
    return body


def part_json(part: Any) -> bytes:
    """One part's JSON as :func:`message_json` writes it inside its message's content
    (encoded inside a list inside an object, as deep as it sits there)."""
    return dumps({"c": [converter.unstructure(part)]}, default=str)[6:-2]


def part_end(message: Any, index: int, body: bytes) -> int | None:
    """Where part ``index`` of ``message``'s content ends in ``body``, the JSON
    :func:`message_json` last gave for it, if it kept that (the same parts, the same
    bytes) and knows it; else ``None``."""
    with _encoded_lock:
        known = _encoded.get(message.id)
    if known is None or known.parts is not message.content or known.body is not body:
        return None
    end = known.ends[index] if 0 <= index < len(known.ends) else -1
    return end if end >= 0 else None


def _remember(key: str, encoded: _Encoded) -> None:
    size = len(encoded.body)
    with _encoded_lock:
        old = _encoded.pop(key, None)
        if old is not None:
            _encoded_bytes[0] -= len(old.body)
        if size > ENCODED_BYTES:
            return
        _encoded[key] = encoded
        _encoded_bytes[0] += size
        while len(_encoded) > ENCODED_MESSAGES or _encoded_bytes[0] > ENCODED_BYTES:
            _encoded_bytes[0] -= len(_encoded.popitem(last=False)[1].body)


def forget_encoded(message_id: str | None = None) -> None:
    """Drop what :func:`message_json` keeps of the message ``message_id`` (its turn has
    ended: no step will save it again), or of every message."""
    with _encoded_lock:
        if message_id is None:
            _encoded.clear()
            _encoded_bytes[0] = 0
            _keeping.clear()
            return
        _keeping.pop(message_id, None)
        old = _encoded.pop(message_id, None)
        if old is not None:
            _encoded_bytes[0] -= len(old.body)


_assistant_fields_fn: list[Callable[[Any], _Dict]] = []


def _assistant_fields(message: messages.AssistantMessage) -> _Dict:
    """What the converter unstructures ``message`` to, less ``content``, tag last."""
    if not _assistant_fields_fn:
        _assistant_fields_fn.append(
            fields_unstructurer(messages.AssistantMessage, omit=("content",))
        )
    d = _assistant_fields_fn[0](message)
    d["role"] = "assistant"
    return d


def utf8_text(text: str) -> str:
    """``text`` as UTF-8 can hold it: two halves of a character side by side (a surrogate
    pair) become that character, a half alone U+FFFD (:func:`without_lone_surrogates`'
    rule for one string). ``text`` itself, not walked, when it is ASCII.

    The check is an encode to UTF-32, which refuses exactly what UTF-8 refuses, a
    surrogate (U+D800-U+DFFF; Python's UTF-16 and UTF-32 encoders refuse them since 3.4),
    but copies each character as it is: for a text of one byte a character (Latin-1:
    accents, a degree sign) ~50x faster than UTF-8's, which writes each non-ASCII one as
    two bytes (22 instructions a character: ~98k a 1,000-delta turn's 4.4 KB reply, run
    once a part; issue 24 goal 1), and never slower for wider ones."""
    if text.isascii():
        return text
    try:
        text.encode("utf-32")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def utf8_dumps(value: Any, default: Any = None, option: int | None = None) -> bytes:
    """``orjson.dumps(value, default=default, option=option)`` (an integer past 64 bits
    written exactly, :func:`dumps`); a value holding half a character, which orjson
    refuses (a delta ending or starting with half an emoji a server split across two
    deltas), written as :func:`without_lone_surrogates` makes it (each half alone
    U+FFFD). Why: a web stream's event or a relay's batch holding such a
    delta raised instead, and the stream was cut or the batch lost."""
    try:  # (orjson itself first: no call more on a stream's event, the fast path)
        return orjson.dumps(value, default=default, option=option)
    except TypeError as exc:
        if "surrogates" in str(exc):
            return dumps(without_lone_surrogates(value), default=default, option=option)
        if "64-bit" not in str(exc):
            raise
    try:  # an integer past 64 bits (:func:`dumps`), maybe with half a character too
        return orjson.dumps(with_big_ints(value), default=default, option=option)
    except TypeError as exc:
        if "surrogates" not in str(exc):
            raise
        return dumps(without_lone_surrogates(value), default=default, option=option)


def without_lone_surrogates(value: Any, depth: int = 0) -> Any:
    """``value`` (JSON values) with each string that UTF-8 cannot hold made text, keys
    included: two halves of a character side by side (a surrogate pair: a server's
    ``\\ud83d`` and ``\\ude00`` escapes split across two deltas, joined) become that
    character, a half alone (a tool's ``os.listdir`` of a name that is not UTF-8) becomes
    U+FFFD. One rule for what the store writes and what a provider sends, so a session
    replays as it was stored. ``ValueError`` past :data:`MAX_DEPTH` levels."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    if isinstance(value, str):
        return utf8_text(value)
    if isinstance(value, dict):
        return {
            without_lone_surrogates(k, depth): without_lone_surrogates(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [without_lone_surrogates(v, depth + 1) for v in value]
    return value


def fields_unstructurer(cls: type, *, omit: tuple[str, ...] = ()) -> Callable[[Any], _Dict]:
    """A function of a ``cls`` value to what :data:`converter` unstructures it to, less
    its tag (``type``, ``kind`` or ``role``) and less the fields named in ``omit``: for a
    reader that drops them anyway (the log tap, every event a line), the same dictionary
    without them being put in to be taken out, nor the converter's dispatch per value.

    Made by cattrs for the class, with the same overrides as the converter's own hook
    (built afresh on every call: keep it). A class that is not tagged gets the converter's
    hook, and the fields in ``omit`` are taken out of what it gives."""
    tagged = _tagged_class(cls)
    if tagged is None or not attrs.has(cls):
        hook = converter.get_unstructure_hook(cls)

        def untagged(obj: Any) -> _Dict:
            d: _Dict = hook(obj)
            for name in omit:
                d.pop(name, None)
            return d

        return untagged
    names = {a.name for a in attrs.fields(cls)}
    overrides = dict(_UNSTRUCTURE_OVERRIDES.get(tagged, {}))
    overrides.update({name: override(omit=True) for name in omit if name in names})
    fn: Callable[[Any], _Dict] = make_dict_unstructure_fn(cls, converter, **overrides)
    return fn


def event_to_dict(event: Any) -> dict[str, Any]:
    """The JSON form of a bus event, always with its ``kind`` (output chunks too)."""
    d: _Dict = converter.unstructure(event)
    d.setdefault("kind", event.kind)
    return d
