"""One converter round-trips every event, chunk, part and message through JSON."""

from __future__ import annotations

import string
import typing

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import chunks, events, messages, output, serde
from runtime.chunks import Usage
from runtime.output import ErrorInfo

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.text(max_size=8),
    lambda kids: (
        st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3)
    ),
    max_leaves=6,
)

_PARTS = typing.get_args(messages.Part)
_MESSAGES = typing.get_args(messages.Message)

PNG = b"\x89PNG\r\n\x1a\n"
user_parts = st.one_of(
    st.builds(messages.TextPart, text=st.text(min_size=1, max_size=8), step=st.just(0)),
    st.builds(messages.Image, data=st.binary(max_size=16).map(lambda b: PNG + b)),
    st.builds(
        messages.Image,
        url=st.sampled_from(["https://example.com/a.png", "http://x/y.jpg?z=1"]),
        media_type=st.sampled_from(["image/png", "image/webp"]),
    ),
    st.builds(
        messages.File,
        data=st.binary(max_size=16).map(lambda b: b"%PDF-1.7\n" + b),
        filename=st.none() | st.text(max_size=6),
    ),
    st.builds(
        messages.File,
        # Plain words: arbitrary text can spell another format's magic bytes (hypothesis
        # found "SQLite format 3\x00"), which the media check rightly refuses as text/plain.
        data=st.text(alphabet=string.ascii_letters + " .,", max_size=12).map(str.encode),
        media_type=st.just("text/plain"),
        filename=st.none() | st.just("notes.txt"),
    ),
)
user_content = st.text(max_size=10) | st.lists(user_parts, min_size=1, max_size=4).map(tuple)


def _strategy_for(tp: typing.Any) -> st.SearchStrategy:
    origin = typing.get_origin(tp)
    if tp is typing.Any:
        return json_values
    if tp is str:
        return st.text(max_size=10)
    if tp is int:
        return st.integers(0, 10**6)
    if tp is float:
        return st.floats(0, 1e6, allow_nan=False)
    if tp is bool:
        return st.booleans()
    if tp is Usage:
        return st.builds(
            Usage, input_tokens=st.integers(0, 99), cache_read=st.none() | st.integers(0, 9)
        )
    if tp is output.TextDelta:
        return st.builds(
            output.TextDelta,
            step=st.integers(0, 9),
            part_id=st.text(max_size=4),
            text=st.text(max_size=8),
            seq=st.integers(0, 99),
        )
    if tp is ErrorInfo:
        return st.builds(ErrorInfo, kind=st.text(max_size=5), message=st.text(max_size=5))
    if tp == messages.UserContent:
        return user_content
    if tp is messages.Message or tp in _MESSAGES:
        return st.sampled_from(_sample_messages())
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return st.one_of([_strategy_for(a) for a in typing.get_args(tp)])
    if tp is type(None):
        return st.none()
    if origin is tuple and typing.get_args(tp)[:1] == (str,):  # (names: asked_via)
        return st.lists(st.text(max_size=4), max_size=3).map(tuple)
    if origin is tuple and typing.get_args(tp)[:1] == (messages.Awaiting,):  # sub_answered
        earlier = _builds(messages.Awaiting, sub_answered=st.just(()))
        return st.lists(earlier, max_size=2).map(tuple)
    if origin is tuple and typing.get_origin(typing.get_args(tp)[0]) is dict:  # citations
        return st.lists(_strategy_for(typing.get_args(tp)[0]), max_size=3).map(tuple)
    if origin is tuple:
        return st.lists(st.sampled_from(_sample_parts()), max_size=4).map(tuple)
    if origin is dict:
        return st.dictionaries(st.text(max_size=4), json_values, max_size=3)
    if attrs.has(tp):  # a value class nested in an event (TurnStarted's TraceContext)
        return _builds(tp)
    raise NotImplementedError(tp)


def _builds(cls: type, **given: st.SearchStrategy) -> st.SearchStrategy:
    hints = typing.get_type_hints(cls)
    if cls is output.ToolStream:  # its payload is itself an output chunk
        hints["chunk"] = output.TextDelta
    return st.builds(
        cls,
        **{
            f.name: given[f.name] if f.name in given else _strategy_for(hints[f.name])
            for f in attrs.fields(cls)
            if f.init and (f.name != "id" or cls is messages.Awaiting)
        },
    )


def _sample_parts():
    return [
        messages.TextPart(text="hi", step=0),
        messages.ReasoningPart(text="r", step=1, signature="sig==", provider="anthropic"),
        messages.ReasoningPart(text="", step=1, redacted_data="opaque", provider="anthropic"),
        messages.ToolCallPart(tool_call_id="c", tool_name="t", input={"a": [1, None]}, step=2),
        messages.ProviderDataPart(provider="anthropic", data={"type": "server_tool_use"}, step=0),
    ]


def _sample_messages():
    return [
        messages.SystemMessage(content="sys"),
        messages.UserMessage(content="hello"),
        messages.UserMessage(
            content=(
                messages.TextPart(text="what is this?", step=0),
                messages.Image(data=PNG + b"pixels"),
                messages.Image(url="https://example.com/cat.jpg"),
                messages.File(data=b"%PDF-1.4 x", filename="a.pdf"),
            )
        ),
        messages.AssistantMessage(content=tuple(_sample_parts()), interrupted=True),
        messages.ToolMessage(tool_call_id="c", tool_name="t", step=2, output={"x": 1}),
        messages.ToolMessage(tool_call_id="c", tool_name="t", step=2, error="boom"),
    ]


EVENT_CLASSES = [*events.LIFECYCLE_EVENT_TYPES, *output.OUTPUT_CHUNK_TYPES]
STREAM_CLASSES = list(typing.get_args(chunks.StreamChunk))


@pytest.mark.parametrize("cls", EVENT_CLASSES, ids=lambda c: c.kind)
@given(data=st.data())
def test_every_event_round_trips_through_json(cls, data):
    event = data.draw(_builds(cls))
    back = serde.from_json(serde.to_json(event), events.Event)
    assert back == event and type(back) is cls


@pytest.mark.parametrize("cls", list(output.OUTPUT_CHUNK_TYPES), ids=lambda c: c.type)
@given(data=st.data())
def test_output_chunk_json_has_its_type_string(cls, data):
    event = data.draw(_builds(cls))
    assert serde.unstructure(event)["type"] == cls.type


@pytest.mark.parametrize("cls", STREAM_CLASSES, ids=lambda c: c.type)
@given(data=st.data())
def test_every_stream_chunk_round_trips(cls, data):
    chunk = data.draw(_builds(cls))
    assert serde.from_json(serde.to_json(chunk), chunks.StreamChunk) == chunk


@given(waiting=_builds(messages.Awaiting))
def test_a_waiting_calls_wait_round_trips_through_json(waiting):
    """Every field of a stored wait (``schema_ref`` and ``schema``, the earlier waits of
    ``sub_answered``...) comes back as it was saved."""
    part = messages.ToolCallPart(
        tool_call_id="c", tool_name="t", input={}, step=0, awaiting=waiting
    )
    assert serde.from_json(serde.to_json(part), messages.Part) == part


@pytest.mark.parametrize("message", _sample_messages(), ids=lambda m: m.role)
def test_every_message_round_trips_with_its_role(message):
    data = serde.unstructure(message)
    assert data["role"] == message.role
    assert serde.from_json(serde.to_json(message), messages.Message) == message


def test_a_whole_history_round_trips_as_one_list():
    history = _sample_messages()
    assert serde.from_json(serde.to_json(history), list[messages.Message]) == history


def test_parts_serialize_with_type_and_step():
    data = serde.unstructure(_sample_parts()[3])
    assert data == {
        "type": "tool-call",
        "tool_call_id": "c",
        "tool_name": "t",
        "input": {"a": [1, None]},
        "step": 2,
    }


def test_unknown_tag_is_a_clear_error():
    with pytest.raises(Exception, match="unknown role"):
        serde.structure({"role": "wizard", "content": "x"}, messages.Message)


def test_an_unknown_tag_is_a_value_error_that_names_it():
    with pytest.raises(ValueError, match="unknown type 'sparkle'"):
        serde.structure({"type": "sparkle", "step": 0}, messages.Part)


def test_a_value_unstructured_on_its_own_keeps_its_tag():
    assert serde.unstructure([messages.SystemMessage(id="s", content="x")]) == [
        {"content": "x", "id": "s", "role": "system"}
    ]


def test_a_failed_assistant_message_round_trips_with_its_error():
    error = ErrorInfo(kind="AuthenticationFailed", message="bad key", retryable=False)
    failed = messages.AssistantMessage(id="a", error=error)
    data = serde.unstructure(failed)
    assert data["error"] == {
        "kind": "AuthenticationFailed",
        "message": "bad key",
        "retryable": False,
    }
    restored = serde.from_json(serde.to_json(failed), messages.Message)
    assert restored == failed and restored.status == "failed" and not restored.interrupted


def test_an_assistant_message_that_did_not_fail_is_stored_without_an_error_field():
    data = serde.unstructure(messages.AssistantMessage(id="a", interrupted=True))
    assert data == {"role": "assistant", "content": [], "id": "a", "interrupted": True}


def test_an_assistant_message_stored_before_the_error_field_existed_still_loads():
    old = {"role": "assistant", "content": [], "id": "a", "interrupted": True}
    restored = serde.structure(old, messages.Message)
    assert restored.error is None and restored.status == "interrupted"


@given(content=user_content)
def test_user_content_round_trips_through_json(content):
    message = messages.UserMessage(content=content)
    assert serde.from_json(serde.to_json(message), messages.Message) == message


@given(parts=st.lists(user_parts, min_size=1, max_size=3))
def test_a_tool_media_output_round_trips_as_parts(parts):
    if not any(isinstance(p, messages.Image | messages.File) for p in parts):
        parts.append(messages.Image(data=PNG))
    message = messages.ToolMessage(tool_call_id="c", tool_name="t", step=0, output=tuple(parts))
    assert serde.from_json(serde.to_json(message), messages.Message) == message


def test_image_bytes_are_base64_in_json():
    data = serde.unstructure(messages.Image(data=PNG))
    assert data == {"type": "image", "data": "iVBORw0KGgo=", "url": None, "media_type": "image/png"}


def test_a_tool_output_that_only_looks_like_an_image_stays_json():
    output = [{"type": "image", "url": "https://example.com/a.png"}]  # no media_type/data keys
    message = messages.ToolMessage(tool_call_id="c", tool_name="t", step=0, output=output)
    assert serde.from_json(serde.to_json(message), messages.Message).output == output


def test_user_text_stored_before_media_existed_loads_as_str():
    stored = b'{"role": "user", "content": "hi", "id": "msg_1"}'
    assert serde.from_json(stored, messages.Message) == messages.UserMessage(
        content="hi", id="msg_1"
    )


def _generated_after(code: str) -> list[str]:
    """The cattrs hooks (compiled functions, each in linecache) that exist after running
    ``code`` in a fresh interpreter that imported :mod:`runtime.serde`."""
    import subprocess
    import sys

    probe = (
        "import linecache, runtime.serde as serde\n"
        f"{code}\n"
        "print('\\n'.join(k for k in linecache.cache if k.startswith('<cattrs generated')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if line]


def test_importing_serde_generates_no_hook():
    """Issue 24: the converter's hooks are made on first use of their class, so an
    import (start-up) compiles none of them."""
    assert _generated_after("") == []


def test_a_round_trip_generates_hooks_for_the_classes_it_uses_only():
    code = (
        "from runtime.messages import AssistantMessage, Message, TextPart\n"
        "m = AssistantMessage(content=(TextPart(text='hi', step=0),))\n"
        "assert serde.from_json(serde.to_json(m), Message) == m"
    )
    generated = _generated_after(code)
    joined = " ".join(generated)
    assert "runtime.messages.AssistantMessage" in joined
    assert "runtime.messages.TextPart" in joined
    assert "runtime.events" not in joined and "TextDelta" not in joined
    assert len(generated) < 10  # of about 200 hooks the converter can make
