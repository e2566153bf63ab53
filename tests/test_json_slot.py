"""A text read through a :class:`~actors.providers.json_slot.StringSlot` is the text the
full decode reads, and the event is the same event (issue 24).

The OpenAI and Anthropic providers read a stream's text deltas by decoding their text
alone when the rest of their bytes is those of a delta decoded in full before. These
tests hold the slot to orjson on any event: whatever the learned event's shape and
bytes (keys named like the text's, strings holding the key's bytes, escapes, spacing),
whenever the slot reads a string from some bytes, orjson decodes those bytes to the
learned event with that string as its text; and the providers' readers give the same
texts with the slot as without it, on bodies whose deltas change shape midway.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.providers import anthropic, openai
from actors.providers.json_slot import StringSlot, TwoStringSlot, learn
from actors.providers.sse import block_bytes
from runtime.chunks import TextChunk
from runtime.provider import TextRun
from tests.support.chunk_sink import ChunkSink

_STRING = st.one_of(
    st.text(max_size=8),
    st.sampled_from(
        [
            '"',
            "\\",
            '\\"',
            '"content":"x',
            '"text":"',
            '"obfuscation":"',
            "}",
            "\x00",
            "é☃",
            "\ud7ff",
        ]
    ),
)
_SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), _STRING)
_EXTRA = st.dictionaries(st.sampled_from(["id", "content", "text", "x", "logprobs"]), _SCALAR)


def _dumps(doc: Any, style: int) -> bytes:
    if style == 0:
        return orjson.dumps(doc)
    if style == 1:
        return json.dumps(doc, ensure_ascii=True).encode()
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


@st.composite
def openai_chunks(draw: Any) -> tuple[dict[str, Any], bytes]:
    delta: dict[str, Any] = {"content": draw(_STRING)}
    if draw(st.booleans()):
        delta["role"] = "assistant"
    choice = {"index": 0, "delta": delta, "finish_reason": None, **draw(_EXTRA)}
    choice["index"], choice["finish_reason"] = 0, None
    doc = {**draw(_EXTRA), "choices": [choice]}
    if draw(st.booleans()):
        doc["usage"] = None
    doc.pop("usage", None) if draw(st.booleans()) else None
    return doc, _dumps(doc, draw(st.integers(0, 2)))


def _openai_text(doc: Any) -> Any:
    return openai._text_only(doc) if type(doc) is dict else None


@given(openai_chunks(), st.lists(st.one_of(_STRING, openai_chunks()), max_size=6))
def test_a_slot_reads_what_orjson_reads(learned: Any, others: list[Any]) -> None:
    """Learned from one chunk, the slot reads a string from other bytes only when those
    bytes decode to that chunk with that string as its content."""
    doc, data = learned
    slot = learn(data, doc, b'"content":', _openai_text, openai._put_text)
    if slot is None:
        return
    for other in others:
        if isinstance(other, str):  # the learned bytes around another string, or a fake
            for middle in (orjson.dumps(other), json.dumps(other).encode(), other.encode()):
                _check(slot, slot.prefix + middle + slot.suffix, doc)
        else:
            _check(slot, other[1], doc)


def _check(slot: Any, data: bytes, doc: dict[str, Any]) -> None:
    text = slot.text(data)
    if text is None:
        return
    decoded = orjson.loads(data)
    assert _openai_text(decoded) == text
    openai._put_text(decoded, doc["choices"][0]["delta"]["content"])
    if isinstance(slot, TwoStringSlot):  # the padding, a string, is the only other change
        assert type(decoded.get("obfuscation")) is str
        openai._put_obfuscation(decoded, doc["obfuscation"])
    assert decoded == doc


@st.composite
def padded_chunks(draw: Any) -> tuple[dict[str, Any], bytes]:
    """Chunks as api.openai.com sends them, an ``obfuscation`` string after the choices
    (or, sometimes, before them or a key named so inside a choice)."""
    doc, _ = draw(openai_chunks())
    pad = draw(_STRING)
    where = draw(st.integers(0, 3))
    if where == 0:
        doc = {"obfuscation": pad, **doc}
    elif where == 1:
        doc["choices"][0]["obfuscation"] = pad
    else:
        doc["obfuscation"] = pad
    return doc, _dumps(doc, draw(st.integers(0, 2)))


def _tokens(text: str) -> list[bytes]:
    """A string as JSON tokens of either encoding, and its raw bytes (often no token)."""
    return [orjson.dumps(text), json.dumps(text).encode(), text.encode()]


@given(padded_chunks(), st.lists(st.one_of(st.tuples(_STRING, _STRING), padded_chunks())))
def test_a_two_string_slot_reads_what_orjson_reads(learned: Any, others: list[Any]) -> None:
    """Learned from a padded chunk, the slot reads a string from other bytes only when
    those bytes decode to that chunk with that string as its content and another string
    as its padding."""
    doc, data = learned
    slot = learn(data, doc, b'"content":', _openai_text, openai._put_text, pad=openai._OBFUSCATION)
    if slot is None:
        return
    for other in others:
        if isinstance(other[0], str):  # the learned bytes around two other strings, or fakes
            text, pad = other
            if isinstance(slot, TwoStringSlot):
                for first in _tokens(text):
                    for second in _tokens(pad):
                        built = slot.prefix + first + slot.middle + second + slot.suffix
                        _check(slot, built, doc)
            else:
                for first in _tokens(text):
                    _check(slot, slot.prefix + first + slot.suffix, doc)
        else:
            _check(slot, other[1], doc)


def test_a_two_string_slot_is_learned_from_an_api_shaped_chunk() -> None:
    """The API's chunk does take the two-string slot (else the test above proves
    nothing), a chunk without padding the one-string slot; fakes are not read."""
    doc = {
        "id": "c",
        "choices": [{"index": 0, "delta": {"content": 'a "q"'}, "finish_reason": None}],
        "usage": None,
        "obfuscation": "Qup1",
    }
    data = orjson.dumps(doc)
    slot = learn(data, doc, b'"content":', _openai_text, openai._put_text, pad=openai._OBFUSCATION)
    assert isinstance(slot, TwoStringSlot)
    assert slot.text(data) == 'a "q"'
    assert slot.text(data.replace(b'"Qup1"', b'"\\\\\\"\\u2603"')) == 'a "q"'
    assert slot.text(data.replace(b'a \\"q\\"', b"b\\\\").replace(b"Qup1", b"")) == "b\\"
    assert slot.text(data.replace(b'"Qup1"', b'"a","x":"b"')) is None
    assert slot.text(data.replace(b'"Qup1"', b'"a"+"b"')) is None
    assert slot.text(data.replace(b'a \\"q\\"', b'b","x":"')) is None
    assert slot.text(data.replace(b'"Qup1"', b"1")) is None
    del doc["obfuscation"]
    plain = orjson.dumps(doc)
    one = learn(plain, doc, b'"content":', _openai_text, openai._put_text, pad=openai._OBFUSCATION)
    assert isinstance(one, StringSlot)


def test_slots_are_learned_from_json_with_a_space_after_each_colon() -> None:
    """Python's ``json.dumps`` writes ``"key": value``: a server that sends its events so
    (each delta the same bytes but for its text, as the API's) had every delta decoded in
    full, the string looked for right after the key's colon. The whitespace is part of
    the learned bytes now; the probe proves the slot as before."""
    doc = {
        "id": "c",
        "choices": [{"index": 0, "delta": {"content": 'a "q"'}, "finish_reason": None}],
        "obfuscation": "Qup1",
    }
    data = json.dumps(doc).encode()
    slot = learn(data, doc, b'"content":', _openai_text, openai._put_text, pad=openai._OBFUSCATION)
    assert isinstance(slot, TwoStringSlot)
    other = data.replace(b'a \\"q\\"', b"b\\u00e9").replace(b'"Qup1"', b'"zz"')
    assert slot.text(other) == "b\u00e9"
    assert slot.text(data.replace(b'"Qup1"', b"1")) is None
    event = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "hi"},
    }
    adata = json.dumps(event).encode()
    aslot = learn(adata, event, b'"text":', anthropic._delta_text, anthropic._put_delta_text)
    assert isinstance(aslot, StringSlot)
    assert aslot.text(adata.replace(b'"hi"', b'"ho"')) == "ho"
    assert aslot.text(adata.replace(b'"index": 0', b'"index": 1')) is None


def test_a_slot_is_learned_from_a_benchmark_shaped_chunk() -> None:
    """The common case does take the slot (else the test above proves nothing)."""
    doc = {"id": "c", "choices": [{"index": 0, "delta": {"content": 'a "q"'}}], "usage": None}
    data = orjson.dumps(doc)
    slot = learn(data, doc, b'"content":', _openai_text, openai._put_text)
    assert slot is not None
    assert slot.text(data.replace(b'a \\"q\\"', b"b\\\\")) == "b\\"
    assert slot.text(data.replace(b'a \\"q\\"', b'b","x":"')) is None


def _one_at_a_time(slot: Any, events: list[tuple[Any, bytes]], name: Any) -> tuple[list, int]:
    """What ``slot.run`` must give: ``slot.text`` of each event while it is named
    ``name`` and reads."""
    texts, i = [], 0
    while i < len(events) and events[i][0] == name:
        text = slot.text(events[i][1])
        if text is None:
            break
        texts.append(text)
        i += 1
    return texts, i


_MIDDLES = st.one_of(
    st.builds(orjson.dumps, _STRING),
    st.builds(lambda t: json.dumps(t).encode(), _STRING),
    st.builds(str.encode, _STRING),
    st.sampled_from(
        [b'"a\\"', b'"a","b"', b'"\\u0000"', b'"\\x"', b'"\x01"', b'"\xff"', b'"a\nb"', b""]
    ),
)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from(["delta", "delta", "delta", "other", None]), _MIDDLES)),
    st.integers(0, 3),
)
def test_a_slot_reads_a_run_as_it_reads_each_event(events: Any, at: int) -> None:
    """``StringSlot.run`` (a window of plain tokens in one decode) reads the same texts
    and stops at the same event as ``text`` one event at a time: escapes, control
    characters, fakes of two tokens, other names, runs longer than a window."""
    doc = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}
    data = orjson.dumps(doc)
    slot = learn(data, doc, b'"text":', anthropic._delta_text, anthropic._put_delta_text)
    assert isinstance(slot, StringSlot)
    built = [(name, slot.prefix + middle + slot.suffix) for name, middle in events]
    built += [("delta", slot.prefix + b'"p"' + slot.suffix)] * (40 * (at == 3))  # long runs
    start = min(at, len(built))

    got = slot.run(built, start, "delta")

    texts, read = _one_at_a_time(slot, built[start:], "delta")
    assert got == (texts, start + read)


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.sampled_from([None, None, None, "other"]), _MIDDLES, _MIDDLES),
    ),
    st.integers(0, 3),
)
def test_a_two_string_slot_reads_a_run_as_it_reads_each_event(events: Any, at: int) -> None:
    """``TwoStringSlot.run`` (a window of events in one decode) reads the same texts and
    stops at the same event as ``text`` one event at a time, whatever the text and the
    padding tokens are."""
    doc = {
        "id": "c",
        "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
        "usage": None,
        "obfuscation": "pad",
    }
    data = orjson.dumps(doc)
    slot = learn(data, doc, b'"content":', _openai_text, openai._put_text, pad=openai._OBFUSCATION)
    assert isinstance(slot, TwoStringSlot)
    built = [
        (name, slot.prefix + text + slot.middle + pad + slot.suffix) for name, text, pad in events
    ]
    built += [(None, slot.prefix + b'"p"' + slot.middle + b'"q"' + slot.suffix)] * (40 * (at == 3))
    start = min(at, len(built))

    got = slot.run(built, start, None)

    texts, read = _one_at_a_time(slot, built[start:], None)
    assert got == (texts, start + read)


def _padded_slot(doc: dict[str, Any], data: bytes) -> TwoStringSlot:
    slot = learn(data, doc, b'"content":', _openai_text, openai._put_text, pad=openai._OBFUSCATION)
    assert isinstance(slot, TwoStringSlot)
    return slot


_PADDED = {"id": "c", "choices": [{"index": 0, "delta": {"content": "x"}}], "obfuscation": "p"}
_PADDED_SLOT = _padded_slot(_PADDED, orjson.dumps(_PADDED))
_OWN_BYTES = st.lists(
    st.sampled_from(
        [
            b'"',
            b"a",
            b"\\",
            b"\n",
            _PADDED_SLOT.middle,
            b'"' + _PADDED_SLOT.middle + b'"',
            _PADDED_SLOT.prefix,
            _PADDED_SLOT.suffix,
            _PADDED_SLOT.suffix + b"\n" + _PADDED_SLOT.prefix,
        ]
    ),
    max_size=5,
).map(b"".join)


_EDGES = st.sampled_from([(b"", b""), (b"", b"x"), (b"x", b""), (b"{", b"}")])
"""What replaces an event's first and last byte: nothing, or other bytes (the learned
bytes around the strings, or not)."""


@settings(max_examples=500)
@given(st.lists(st.tuples(_OWN_BYTES, _OWN_BYTES, _EDGES), max_size=6), st.integers(0, 2))
def test_a_two_string_slot_reads_fakes_made_of_its_own_bytes_as_each_event(
    events: Any, at: int
) -> None:
    """A window whose texts or paddings hold the slot's own bytes (its middle with or
    without quotes, its prefix, its suffix, a newline, an unclosed quote: pieces that
    split an event in one place or three), or whose events' first or last byte is
    another, reads as ``text`` reads one event at a time."""
    slot = _PADDED_SLOT
    built = []
    for text, pad, (first, last) in events:
        data = slot.prefix + b'"' + text + b'"' + slot.middle + b'"' + pad + b'"' + slot.suffix
        built.append((None, first + data[1:-1] + last if first or last else data))
    built += [(None, slot.prefix + b'"p"' + slot.middle + b'"q"' + slot.suffix)] * 3
    start = min(at, len(built))

    got = slot.run(built, start, None)

    texts, read = _one_at_a_time(slot, built[start:], None)
    assert got == (texts, start + read)


def _padded_events(count: int) -> list[tuple[Any, bytes]]:
    data = orjson.dumps(_PADDED)
    return [(None, data.replace(b'"x"', b'"t%d"' % i)) for i in range(count)]


def _windows_read(monkeypatch: Any) -> list[int]:
    sizes: list[int] = []
    window = TwoStringSlot._window

    def counted(slot: TwoStringSlot, part: Any, name: Any) -> list[str] | None:
        sizes.append(len(part))
        return window(slot, part, name)

    monkeypatch.setattr(TwoStringSlot, "_window", counted)
    return sizes


def test_a_run_to_the_end_of_a_read_leaves_its_window_to_the_next_run(monkeypatch: Any) -> None:
    """The next read's run of text deltas is read in one window when the last read's run
    reached the read's end (not in windows of 16, 32, ... again)."""
    slot = _padded_slot(_PADDED, orjson.dumps(_PADDED))
    slot.run(_padded_events(48), 0, None)  # windows of 16 and 32
    sizes = _windows_read(monkeypatch)

    got = slot.run(_padded_events(50), 0, None)

    assert got == ([f"t{i}" for i in range(50)], 50)
    assert sizes == [50]


def test_a_run_that_ends_at_an_unread_event_leaves_the_first_window(monkeypatch: Any) -> None:
    """After a run that stopped at an event it could not read (a finish chunk), the next
    run starts at the first window again."""
    slot = _padded_slot(_PADDED, orjson.dumps(_PADDED))
    slot.run(_padded_events(48), 0, None)  # to the end of a read: its window is left
    slot.run([*_padded_events(48), (None, b'{"other":1}')], 0, None)
    sizes = _windows_read(monkeypatch)

    slot.run(_padded_events(50), 0, None)

    assert sizes[0] == 16


def test_a_two_string_slot_learned_from_bytes_with_a_newline_reads_runs_event_by_event() -> None:
    """A slot whose learned bytes hold a newline (data spread over ``data:`` lines) reads
    no window at once (its proof needs the window's newlines to be between events) and
    still reads a run as ``text`` reads each event."""
    data = b'{"id":"c",\n"choices":[{"index":0,"delta":{"content":"x"}}],"obfuscation":"p"}'
    slot = _padded_slot(orjson.loads(data), data)
    events = [(None, data.replace(b'"x"', b'"t%d"' % i)) for i in range(20)]

    assert slot._window(events[:4], None) is None
    assert slot.run(events, 0, None) == ([f"t{i}" for i in range(20)], 20)


class _Response:
    def __init__(self, body: bytes) -> None:
        self.body, self.request, self.status_code = body, None, 200

    async def aiter_bytes(self) -> Any:
        for start in range(0, len(self.body), 97):
            yield self.body[start : start + 97]


class _Stream:
    """What the readers take of an SDK ``AsyncStream``: its response and decoder."""

    def __init__(self, body: bytes) -> None:
        self.response = _Response(body)
        self._decoder = type("SSEDecoder", (), {"__module__": "openai._streaming"})()
        self._observer = None

    def _iter_events(self) -> None:
        raise AssertionError("read from the bytes")


def _spread(chunks: list[Any]) -> list[Any]:
    """``chunks`` with each :class:`~runtime.provider.TextRun` as a text chunk a delta."""
    out: list[Any] = []
    for chunk in chunks:
        out += [TextChunk(text=t) for t in chunk.texts] if type(chunk) is TextRun else [chunk]
    return out


def _anthropic_body(blocks: list[list[str]], spaced: bool) -> bytes:
    def event(obj: dict[str, Any]) -> bytes:
        data = json.dumps(obj) if spaced else json.dumps(obj, separators=(",", ":"))
        return f"event: {obj['type']}\ndata: {data}\n\n".encode()

    message = {"id": "m", "type": "message", "role": "assistant", "content": [], "usage": {}}
    out = [event({"type": "message_start", "message": message})]
    for index, texts in enumerate(blocks):
        block = {"type": "text", "text": ""}
        out.append(event({"type": "content_block_start", "index": index, "content_block": block}))
        for k, text in enumerate(texts):
            delta = {"type": "text_delta", "text": text}
            if k % 3 == 2:
                delta["extra"] = k  # another shape midway: decoded in full
            out.append(event({"type": "content_block_delta", "index": index, "delta": delta}))
        out.append(event({"type": "content_block_stop", "index": index}))
    out.append(event({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}))
    out.append(event({"type": "message_stop"}))
    return b"".join(out)


@pytest.mark.parametrize("spaced", [False, True])
@given(blocks=st.lists(st.lists(_STRING, max_size=6), min_size=1, max_size=3))
def test_anthropic_reads_the_same_chunks_with_slots(spaced: bool, blocks: Any) -> None:
    """Blocks of text deltas, some of another shape: the same chunks either way."""
    body = _anthropic_body(blocks, spaced)

    async def read(texts: bool) -> list[Any]:
        sink = ChunkSink()
        batches = anthropic.json_event_batches(_Stream(body), texts=texts)
        await anthropic.parse_batches(batches, sink)
        return sink.chunks

    assert trio.run(read, False) == trio.run(read, True)


@given(blocks=st.lists(st.lists(_STRING, max_size=6), min_size=1, max_size=3))
def test_anthropic_reads_the_same_deltas_as_runs(blocks: Any) -> None:
    """The same body read into runs (a request that takes them): the same chunks once
    each run is spread into a text chunk per delta."""
    body = _anthropic_body(blocks, False)

    async def read(runs: bool) -> list[Any]:
        sink = ChunkSink()
        batches = anthropic.json_event_batches(_Stream(body), texts=True)
        await anthropic.parse_batches(batches, sink, runs=runs)
        return sink.chunks

    assert _spread(trio.run(read, True)) == trio.run(read, False)


def _openai_body(texts: list[str], every: int, pads: list[str] | None = None) -> bytes:
    def chunk(delta: dict[str, Any], k: int, finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        extra = {"obfuscation": "x" * (k % 3)} if every and k % every == 0 else {}
        if pads:
            extra = {"usage": None, "obfuscation": pads[k % len(pads)]}
        return b"data: " + orjson.dumps({"id": "c", "choices": [choice], **extra}) + b"\n\n"

    out = [chunk({"role": "assistant", "content": ""}, 0)]
    out += [chunk({"content": text}, k) for k, text in enumerate(texts)]
    out.append(chunk({}, 0, "stop"))
    return b"".join(out) + b"data: [DONE]\n\n"


@given(texts=st.lists(_STRING, max_size=12), every=st.integers(0, 3))
def test_openai_reads_the_same_chunks_with_slots(texts: list[str], every: int) -> None:
    """Chunks of text, some with an obfuscation field of their own: the same chunks."""
    body = _openai_body(texts, every)

    async def read(with_slots: bool) -> list[Any]:
        sink = ChunkSink()
        batches = openai.json_chunk_batches(_Stream(body), texts=with_slots)
        await openai.parse_batches(batches, sink)
        return sink.chunks

    assert trio.run(read, False) == trio.run(read, True)


async def _openai_chunks(body: bytes, with_slots: bool) -> list[Any]:
    sink = ChunkSink()
    batches = openai.json_chunk_batches(_Stream(body), texts=with_slots)
    await openai.parse_batches(batches, sink)
    return sink.chunks


@given(texts=st.lists(_STRING, max_size=12), pads=st.lists(_STRING, min_size=1, max_size=5))
def test_openai_reads_the_same_padded_chunks_with_slots(texts: list[str], pads: Any) -> None:
    """Every chunk with its own padding (escapes, quotes, unicode): the same chunks."""
    body = _openai_body(texts, 0, pads)
    assert trio.run(_openai_chunks, body, False) == trio.run(_openai_chunks, body, True)


@given(texts=st.lists(_STRING, max_size=12), pads=st.lists(_STRING, min_size=0, max_size=5))
def test_openai_reads_the_same_deltas_as_runs(texts: list[str], pads: Any) -> None:
    """The same body read into runs: the same chunks once each run is spread."""
    body = _openai_body(texts, 0, pads or None)

    async def read(runs: bool) -> list[Any]:
        sink = ChunkSink()
        batches = openai.json_chunk_batches(_Stream(body), texts=True)
        await openai.parse_batches(batches, sink, runs=runs)
        return sink.chunks

    assert _spread(trio.run(read, True)) == trio.run(read, False)


_RECORDING = (
    Path(__file__).resolve().parents[2]
    / "shared/fixtures/streams/openai/chat-text-long-gpt41nano.sse"
)


@pytest.mark.skipif(not _RECORDING.exists(), reason="the shared recordings are not here")
def test_openai_reads_the_same_chunks_of_a_real_stream_with_slots(monkeypatch: Any) -> None:
    """A real api.openai.com stream (padding on every chunk): the same chunks, and all but
    the first text chunk read through the two-string slot, most of them a window of
    events (or of their lines) at a time."""
    body = _RECORDING.read_bytes()
    read: list[int] = []
    windows: list[int] = []
    text, window = TwoStringSlot.text, TwoStringSlot._window

    def counted(slot: TwoStringSlot, data: bytes) -> str | None:
        got = text(slot, data)
        read.append(got is not None)
        return got

    def counted_window(slot: TwoStringSlot, part: Any, name: Any) -> list[str] | None:
        got = window(slot, part, name)
        windows.append(0 if got is None else len(got))
        return got

    lines_window = TwoStringSlot._window_lines

    def counted_lines(slot: TwoStringSlot, *args: Any) -> tuple[list[str], int] | None:
        got = lines_window(slot, *args)
        windows.append(0 if got is None else len(got[0]))
        return got

    monkeypatch.setattr(TwoStringSlot, "text", counted)
    monkeypatch.setattr(TwoStringSlot, "_window", counted_window)
    monkeypatch.setattr(TwoStringSlot, "_window_lines", counted_lines)
    chunks = trio.run(_openai_chunks, body, True)
    assert chunks == trio.run(_openai_chunks, body, False)
    assert sum(read) + sum(windows) == body.count(b'"delta":{"content":') - 1 > 100
    assert sum(windows) > sum(read)


def _blocks_one_at_a_time(slot: Any, lines: list[bytes], start: int, lead: bytes) -> tuple:
    """What ``slot.run_lines`` must give: ``slot.text`` of each block's data while the
    block is ``lead``'s lines, a data line and a blank line, and its text reads."""
    size = lead.count(b"\n") + 2
    head = lead.split(b"\n")
    texts, j = [], start
    while j < len(lines) // size:
        block = lines[size * j : size * (j + 1)]
        data_line = block[size - 2]
        if block[: size - 2] != head[:-1] or not data_line.startswith(head[-1]):
            break
        text = slot.text(data_line[len(head[-1]) :])
        if text is None:
            break
        texts.append(text)
        j += 1
    return texts, j


def _by_runs(slot: Any, lines: list[bytes], start: int, lead: bytes) -> tuple:
    """``slot.run_lines`` as the readers use it: each block it leaves is read by itself
    (:func:`_blocks_one_at_a_time` of that one block), and the runs go on after it."""
    size = lead.count(b"\n") + 2
    k = len(lines) // size
    read = b"".join(line + b"\n" for line in lines) + b"rest"  # as SSEDecoder.read holds them
    at = block_bytes(lines, 0, start, size)
    texts, i = [], start
    while True:
        got, i, at = slot.run_lines(lines, i, k, lead, read, at)
        assert at == block_bytes(lines, 0, i, size)  # where block i starts
        texts += got
        if i == k:
            return texts, i
        one, after = _blocks_one_at_a_time(slot, lines, i, lead)
        if after == i:
            return texts, i
        texts.append(one[0])
        at += block_bytes(lines, i, i + 1, size)
        i += 1


def _as_lines(blocks: list[bytes], size: int) -> list[bytes] | None:
    """The lines of ``blocks`` (each ended by a blank line) as the decoder gives them,
    or ``None`` when a newline inside makes them other blocks."""
    lines = b"".join(blocks).split(b"\n")[:-1]
    if len(lines) % size or lines[size - 1 :: size].count(b"") != len(lines) // size:
        return None
    return lines


_LINE_PIECES = st.one_of(_OWN_BYTES, st.sampled_from([b'a","b', b'a\\"', b"\\", b'\\"",']))
"""A text's or a padding's bytes: the slot's own, or quotes that make two tokens of one."""


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.sampled_from(["delta", "delta", "delta", "other"]), _MIDDLES)),
    st.integers(0, 3),
)
def test_a_slot_reads_runs_of_lines_as_it_reads_each_event(events: Any, at: int) -> None:
    """``StringSlot.run_lines`` over blocks of ``event:`` + ``data:`` + blank lines, each
    block it leaves read by itself, reads the same texts and stops at the same block as
    ``text`` of each block's data: escapes, control characters, fakes of two tokens,
    other names, runs longer than a window."""
    doc = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}}
    data = orjson.dumps(doc)
    slot = learn(data, doc, b'"text":', anthropic._delta_text, anthropic._put_delta_text)
    assert isinstance(slot, StringSlot)
    blocks = [
        b"event: " + name.encode() + b"\ndata: " + slot.prefix + middle + slot.suffix + b"\n\n"
        for name, middle in events
    ]
    blocks += (
        [b"event: delta\ndata: " + slot.prefix + b'"p"' + slot.suffix + b"\n\n"] * 40 * (at == 3)
    )
    lines = _as_lines(blocks, 3)
    if lines is None:
        return
    start = min(at, len(lines) // 3)
    lead = b"event: delta\ndata: "
    got = _by_runs(slot, lines, start, lead)
    assert got == _blocks_one_at_a_time(slot, lines, start, lead)


@settings(max_examples=500)
@given(
    st.lists(st.tuples(_LINE_PIECES, _LINE_PIECES, _EDGES, st.booleans()), max_size=6),
    st.integers(0, 2),
)
def test_a_two_string_slot_reads_runs_of_lines_as_it_reads_each_event(events: Any, at: int) -> None:
    """``TwoStringSlot.run_lines`` over blocks of ``data:`` + blank lines, whose texts or
    paddings hold the slot's own bytes, quotes and backslashes, or tokens, or whose
    data's first or last byte is another, each block it leaves read by itself, reads as
    ``text`` reads each block's data."""
    slot = _PADDED_SLOT
    blocks = []
    for text, pad, (first, last), token in events:
        if token:  # a JSON token of those bytes: the common case, escapes and all
            text = orjson.dumps(text.decode("utf-8", "replace"))[1:-1]
        data = slot.prefix + b'"' + text + b'"' + slot.middle + b'"' + pad + b'"' + slot.suffix
        data = first + data[1:-1] + last if first or last else data
        blocks.append(b"data: " + data + b"\n\n")
    blocks += [b"data: " + slot.prefix + b'"p"' + slot.middle + b'"q"' + slot.suffix + b"\n\n"] * 3
    lines = _as_lines(blocks, 2)
    if lines is None:
        return
    start = min(at, len(lines) // 2)
    got = _by_runs(slot, lines, start, b"data: ")
    assert got == _blocks_one_at_a_time(slot, lines, start, b"data: ")
