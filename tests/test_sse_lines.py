"""Text deltas read from a read's SSE lines are what the events give (issue 24 goal 1).

The Anthropic reader takes a read of ``event:`` + ``data:`` + blank-line blocks as its
lines (:meth:`~actors.providers.sse.SSEDecoder.feed_lines`) and reads runs of text deltas
by their bytes (:meth:`~actors.providers.json_slot.StringSlot.run_lines`), never cutting
them into ``(name, data)`` pairs; every other block goes through the decoder as events.
These tests hold that reader to the one that reads every read as events, on bodies of
text deltas mixed with pings, other blocks and delta kinds, blocks with more or other
lines, unusual escapes and non-ASCII text, CRLF line ends, invalid JSON, cut into reads
at random places: the same events and texts in the same order, the same failure, and
the same chunks out of the parser. The OpenAI reader does the same with ``data:`` +
blank-line blocks and its two-string slot (texts and padding).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
from hypothesis import example, given, settings
from hypothesis import strategies as st

from actors.providers import anthropic, openai
from actors.providers.json_slot import StringSlot, TwoStringSlot, learn
from actors.providers.sse import SSEDecoder, block_bytes
from runtime.chunks import TextChunk
from runtime.provider import TextRun
from tests.support.chunk_sink import ChunkSink

_TEXT = st.one_of(
    st.text(max_size=6),
    st.sampled_from(
        ['"', "\\", '\\"', "\n", "\r\n", "\x00", "\x1f", "é☃", "😀", "\ud7ff", "", " ", "}}"]
    ),
)


def _delta(text: str, index: int = 0, kind: str = "text_delta", key: str = "text") -> str:
    delta = {"type": kind, key: text}
    event = {"type": "content_block_delta", "index": index, "delta": delta}
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)


def _block(name: str, data: str) -> list[str]:
    return [f"event: {name}", f"data: {data}"]


_DELTA_BLOCK = st.builds(lambda t: _block("content_block_delta", _delta(t)), _TEXT)
_ESCAPED_BLOCK = st.builds(  # the same text, its non-ASCII as escapes: other bytes
    lambda t: _block("content_block_delta", json.dumps(json.loads(_delta(t)))), _TEXT
)
_OTHER_BLOCK = st.one_of(
    st.just(_block("ping", '{"type": "ping"}')),
    st.builds(lambda t: _block("content_block_delta", _delta(t, index=1)), _TEXT),
    st.builds(lambda t: _block("content_block_delta", _delta(t, kind="x", key="x")), _TEXT),
    st.builds(
        lambda t: _block(
            "content_block_delta", _delta(t, kind="input_json_delta", key="partial_json")
        ),
        _TEXT,
    ),
    st.builds(lambda t: _block("content_block_deltx", _delta(t)), _TEXT),  # another name
    st.builds(lambda t: _block("content_block_delta", _delta(t) + " "), _TEXT),
    st.builds(lambda t: ["event: content_block_delta", f"data:{_delta(t)}"], _TEXT),
    st.builds(lambda t: [": a comment", f"data: {_delta(t)}"], _TEXT),
    st.builds(lambda t: [f"data: {_delta(t)}", "event: content_block_delta"], _TEXT),
    st.builds(lambda t: [*_block("content_block_delta", _delta(t)), "id: 7"], _TEXT),
    st.builds(lambda t: ["event: content_block_delta", "data: {", f"data: {_delta(t)}"], _TEXT),
    st.just(["event: content_block_delta"]),
    st.just(["id: 3"]),
    st.just([]),
    st.just(_block("content_block_delta", '{"type":"content_block_delta","index":0,"delta":')),
    st.just(_block("content_block_delta", "[1]")),
)
_BLOCKS = st.lists(
    st.one_of(_DELTA_BLOCK, _DELTA_BLOCK, _DELTA_BLOCK, _ESCAPED_BLOCK, _OTHER_BLOCK)
)


@st.composite
def bodies(draw: Any) -> list[bytes]:
    """A Messages API body: its start, blocks mostly text deltas of one block, its end
    (now and then cut short); lines ended by LF, now and then CRLF; cut into reads at
    random places, a few of them long."""
    start = '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'
    blocks = [
        _block("message_start", '{"type":"message_start","message":{"usage":{}}}'),
        _block("content_block_start", start),
        *draw(_BLOCKS),
    ]
    if draw(st.booleans()):
        blocks.append(
            _block("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn"}}')
        )
        blocks.append(_block("message_stop", '{"type":"message_stop"}'))
    crlf = draw(st.booleans()) and draw(st.booleans())
    end = "\r\n" if crlf else "\n"
    body = "".join(line + end for block in blocks for line in [*block, ""]).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=5)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    return [c for c in chunks if c]


class _Response:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.request, self.status_code = chunks, None, 200

    async def aiter_bytes(self) -> Any:
        for chunk in self.chunks:
            yield chunk


class _Stream:
    """What the reader takes of an SDK ``AsyncStream``: its response and decoder."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.response = _Response(chunks)
        self._decoder = type("SSEDecoder", (), {"__module__": "anthropic._streaming"})()
        self._observer = None

    def _iter_events(self) -> None:
        raise AssertionError("read from the bytes")


def _as_events(self: SSEDecoder, chunk: bytes) -> tuple[list[bytes], list[Any]]:
    return [], self.feed(chunk)  # every read as its events: the reader before the lines


async def _read(chunks: list[bytes]) -> tuple[list[Any], str | None]:
    """The reader's events, each text as ``("text", text)``, and its failure."""
    out: list[Any] = []
    try:
        async for batch in anthropic.json_event_batches(_Stream(chunks), texts=True):
            for item in batch:
                out += [("text", t) for t in item] if isinstance(item, list) else [item]
    except Exception as exc:  # invalid JSON, data that is no object
        return out, f"{type(exc).__name__}: {exc}"
    return out, None


def _both(chunks: list[bytes]) -> tuple[Any, Any]:
    lines = trio.run(_read, chunks)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(SSEDecoder, "feed_lines", _as_events)
        events = trio.run(_read, chunks)
    return lines, events


@settings(max_examples=400, deadline=None)
@given(chunks=bodies())
@example(chunks=[f"event: content_block_delta\ndata: {_delta('a')}\n\n".encode()] * 3)
def test_the_lines_read_the_events_and_texts_the_events_read(chunks: list[bytes]) -> None:
    lines, events = _both(chunks)
    assert lines == events


def _texts_of(chunks: list[Any]) -> list[Any]:
    out: list[Any] = []
    for chunk in chunks:
        out += [TextChunk(text=t) for t in chunk.texts] if type(chunk) is TextRun else [chunk]
    return out


async def _parsed(chunks: list[bytes], texts: bool) -> list[Any]:
    sink = ChunkSink()
    try:
        batches = anthropic.json_event_batches(_Stream(chunks), texts=texts)
        await anthropic.parse_batches(batches, sink, runs=texts)
    except Exception as exc:
        sink.chunks.append(f"{type(exc).__name__}: {exc}")
    return _texts_of(sink.chunks)


@settings(max_examples=200, deadline=None)
@given(bodies())
def test_the_parser_gives_the_chunks_the_full_decode_gives(chunks: list[bytes]) -> None:
    """With the lines and the slot (and runs), the same chunks as every event decoded."""
    assert trio.run(_parsed, chunks, True) == trio.run(_parsed, chunks, False)


def test_a_read_of_text_deltas_is_read_as_lines_in_windows(monkeypatch: Any) -> None:
    """The benchmark's shape: after the first read, no block of a text delta is read as
    an event, and the texts are the deltas'."""
    texts = [f"w{i}é\\" for i in range(300)]
    body = b"".join(f"event: content_block_delta\ndata: {_delta(t)}\n\n".encode() for t in texts)
    read = _counting_block_events(monkeypatch)
    chunks = [body[:500], body[500:20000], body[20000:]]
    out, failure = trio.run(_read, chunks)
    assert failure is None
    assert [t for kind, t in out[1:]] == texts[1:]
    assert sum(read) <= 4  # the first delta (learned), then lines only


def test_run_lines_reads_what_text_reads_and_stops_at_a_quote() -> None:
    data = _delta("x").encode()
    slot = learn(
        data, json.loads(data), b'"text":', anthropic._delta_text, anthropic._put_delta_text
    )
    assert slot is not None
    words = ["a", "b\\u00e9", 'q\\"', "c"]  # the third's quote (escaped) is read alone
    lines: list[bytes] = []
    for w in words:
        line = _delta("").encode().replace(b'"text":""', b'"text":"' + w.encode() + b'"')
        lines += [b"event: content_block_delta", b"data: " + line, b""]
    lead = b"event: content_block_delta\ndata: "
    read = b"".join(line + b"\n" for line in lines)  # as SSEDecoder.read holds them
    at = [block_bytes(lines, 0, j) for j in range(5)]  # where each block starts
    assert slot.run_lines(lines, 0, 4, lead, read, 0) == (["a", "bé"], 2, at[2])
    assert slot.run_lines(lines, 3, 4, lead, read, at[3]) == (["c"], 4, at[4])
    wrong = b"event: content_block_deltx\ndata: "
    assert slot.run_lines(lines, 0, 4, wrong, read, 0) == ([], 0, 0)


def test_run_lines_compares_the_blocks_where_the_read_holds_them() -> None:
    """The run's blocks are checked against the read's bytes at the offset the reader
    gives: the same lines at another offset, or a read that differs there, read nothing
    (the texts are cut from the lines; the bytes compared prove what those lines are)."""
    data = _delta("x").encode()
    slot = learn(
        data, json.loads(data), b'"text":', anthropic._delta_text, anthropic._put_delta_text
    )
    assert slot is not None
    lines: list[bytes] = []
    for w in ["a", "b", "c"]:
        lines += [b"event: content_block_delta", b"data: " + _delta(w).encode(), b""]
    lead = b"event: content_block_delta\ndata: "
    read = b"".join(line + b"\n" for line in lines)
    assert slot.run_lines(lines, 0, 3, lead, read, 0) == (["a", "b", "c"], 3, len(read))
    assert slot.run_lines(lines, 0, 3, lead, b"\n" + read, 0)[:2] == ([], 0)
    assert slot.run_lines(lines, 0, 3, lead, read, 1)[:2] == ([], 0)
    other = read.replace(b'"b"', b'"B"')  # the lines say b, the read says B
    assert slot.run_lines(lines, 0, 3, lead, other, 0)[:2] == (["a"], 1)
    assert slot.run_lines(lines, 1, 3, lead, other, block_bytes(lines, 0, 1))[:2] == ([], 1)


# -- OpenAI: blocks of a data line and a blank line, the two-string slot ---------------------

_HEAD = {"id": "c", "object": "chat.completion.chunk", "model": "m"}


def _chunk(delta: dict[str, Any], pad: str | None, finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    doc: dict[str, Any] = {**_HEAD, "choices": [choice], "usage": None}
    if pad is not None:
        doc["obfuscation"] = pad
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


_PAD = st.one_of(st.none(), st.text("ab1", max_size=4), _TEXT)
_TEXT_LINES = st.builds(lambda t, p: [f"data: {_chunk({'content': t}, p)}"], _TEXT, _PAD)
_OTHER_LINES = st.one_of(
    st.builds(lambda t: [f"data: {_chunk({'content': t}, 'x', 'stop')}"], _TEXT),
    st.builds(lambda t: [f"data: {_chunk({'content': t, 'role': 'assistant'}, 'x')}"], _TEXT),
    st.builds(lambda t: [f"data: {_chunk({'content': t}, 'x')} "], _TEXT),
    st.builds(lambda t: [f"data:{_chunk({'content': t}, 'x')}"], _TEXT),
    st.builds(lambda t: ["event: x", f"data: {_chunk({'content': t}, 'x')}"], _TEXT),
    st.builds(lambda t: [f"data: {_chunk({'content': t}, 'x')}", "id: 2"], _TEXT),
    st.builds(lambda t: ["data: {", f"data: {_chunk({'content': t}, 'x')}"], _TEXT),
    st.just([": keep-alive"]),
    st.just([]),
    st.just(['data: {"choices":[],"usage":{"prompt_tokens":1}}']),
    st.just(['data: {"error":{"message":"boom","type":"server_error"}}']),
    st.just(["data: [DONE]"]),
    st.just(['data: {"choices":[{"index":0,"delta":{"content":']),
)
_CHUNK_LINES = st.lists(st.one_of(_TEXT_LINES, _TEXT_LINES, _TEXT_LINES, _OTHER_LINES))


@st.composite
def openai_bodies(draw: Any) -> list[bytes]:
    """A Chat Completions body: mostly text chunks with or without their padding, now
    and then another chunk or block; LF or CRLF; cut into reads at random places."""
    blocks = [[f"data: {_chunk({'role': 'assistant', 'content': ''}, 'p')}"], *draw(_CHUNK_LINES)]
    if draw(st.booleans()):
        blocks += [[f"data: {_chunk({}, 'p', 'stop')}"], ["data: [DONE]"]]
    end = "\r\n" if draw(st.booleans()) and draw(st.booleans()) else "\n"
    body = "".join(line + end for block in blocks for line in [*block, ""]).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=5)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    return [c for c in chunks if c]


def _as_events_2(self: SSEDecoder, chunk: bytes, size: int = 3) -> tuple[list[bytes], list[Any]]:
    return [], self.feed(chunk)


async def _read_openai(chunks: list[bytes]) -> tuple[list[Any], str | None]:
    out: list[Any] = []
    try:
        async for batch in openai.json_chunk_batches(_Stream(chunks), texts=True):
            for item in batch:
                out += [("text", t) for t in item] if isinstance(item, list) else [item]
    except Exception as exc:  # invalid JSON, an error chunk
        return out, f"{type(exc).__name__}: {exc}"
    return out, None


@settings(max_examples=400, deadline=None)
@given(chunks=openai_bodies())
@example(chunks=[f"data: {_chunk({'content': 'a'}, 'x')}\n\n".encode()] * 3)
def test_openai_lines_read_the_chunks_and_texts_the_events_read(chunks: list[bytes]) -> None:
    lines = trio.run(_read_openai, chunks)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(SSEDecoder, "feed_lines", _as_events_2)
        events = trio.run(_read_openai, chunks)
    assert lines == events


async def _parsed_openai(chunks: list[bytes], texts: bool) -> list[Any]:
    out: list[Any] = []
    try:
        batches = openai.json_chunk_batches(_Stream(chunks), texts=texts)
        await openai.parse_batches(batches, ChunkSink(out), runs=texts)
    except Exception as exc:
        out.append(f"{type(exc).__name__}: {exc}")
    return _texts_of(out)


@settings(max_examples=200, deadline=None)
@given(chunks=openai_bodies())
def test_openai_parser_gives_the_chunks_the_full_decode_gives(chunks: list[bytes]) -> None:
    assert trio.run(_parsed_openai, chunks, True) == trio.run(_parsed_openai, chunks, False)


def test_an_openai_read_of_text_chunks_is_read_as_lines_in_windows(monkeypatch: Any) -> None:
    """The benchmark's shape (padded chunks): after the first text chunk, none is read
    as an event, and the texts are the chunks'."""
    texts = [f"w{i}é\\" for i in range(300)]
    body = b"".join(
        f"data: {_chunk({'content': t}, 'ab' * (i % 5))}\n\n".encode() for i, t in enumerate(texts)
    )
    read = _counting_block_events(monkeypatch)
    out, failure = trio.run(_read_openai, [body[:900], body[900:30000], body[30000:]])
    assert failure is None
    assert [t for kind, t in out[1:]] == texts[1:]
    assert sum(read) <= 4  # the first chunk (learned), then lines only


def test_a_slot_whose_bytes_hold_a_newline_reads_no_run_of_lines() -> None:
    """A slot learned from data of two ``data:`` lines holds a newline: its bytes are no
    block's lines, so no window of lines is read by it (each block goes as its event)."""
    slot = StringSlot(b'{"a":1,\n"text":', b"}")
    lines = [b"event: content_block_delta", b'data: {"a":1,', b'"text":"x"}', b""]
    read = b"".join(line + b"\n" for line in lines)
    head = b"event: content_block_delta\ndata: " + slot.prefix + b'"'
    assert slot._window_lines(lines[1:2], head, 6, read, 0) is None
    assert slot.run_lines(lines[:3], 0, 1, b"event: content_block_delta\ndata: ", read, 0)[:2] == (
        [],
        0,
    )


def _counting_block_events(monkeypatch: Any) -> list[int]:
    """The blocks each reader reads as events (not by lines), counted."""
    read: list[int] = []
    block_events = SSEDecoder.block_events

    def counted(self: SSEDecoder, lines: list[bytes], i: int, j: int, size: int = 3) -> Any:
        read.append(j - i)
        return block_events(self, lines, i, j, size)

    monkeypatch.setattr(SSEDecoder, "block_events", counted)
    return read


def test_runs_after_a_block_read_as_its_event_go_on_by_lines(monkeypatch: Any) -> None:
    """Within one read, a block read as its event (a ping, a text with a quote) moves the
    offset the next run is compared at by that block's bytes: the runs after it are read
    by lines again, not every block after it as an event."""
    texts = [f"w{i}" for i in range(400)]
    texts[150] = 'say "hi"'  # a quote: read alone
    blocks = [f"event: content_block_delta\ndata: {_delta(t)}\n\n" for t in texts]
    blocks.insert(300, 'event: ping\ndata: {"type": "ping"}\n\n')
    body = "".join(blocks).encode()
    read = _counting_block_events(monkeypatch)
    out, failure = trio.run(_read, [body[:300], body[300:]])
    assert failure is None
    got = [x[1] if isinstance(x, tuple) else x.get("delta", {}).get("text") for x in out]
    assert [t for t in got if t is not None] == texts
    assert sum(read) <= 6  # the first read's, the quoted text's block and the ping's


def test_openai_runs_after_a_block_read_as_its_event_go_on_by_lines(monkeypatch: Any) -> None:
    """The same for OpenAI's blocks: a chunk whose text holds a quote is read as its
    event, and the chunks after it by lines."""
    texts = [f"w{i}" for i in range(400)]
    texts[150] = 'say "hi"'
    body = b"".join(
        f"data: {_chunk({'content': t}, 'ab' * (i % 5))}\n\n".encode() for i, t in enumerate(texts)
    )
    read = _counting_block_events(monkeypatch)
    out, failure = trio.run(_read_openai, [body[:900], body[900:]])
    assert failure is None
    got = [x[1] if isinstance(x, tuple) else x["choices"][0]["delta"]["content"] for x in out]
    assert got == texts
    assert sum(read) <= 6  # the first read's and the quoted text's block


def _failed_windows(monkeypatch: Any, cls: Any) -> list[int]:
    """The sizes of the windows of blocks ``cls`` 's slot read and dropped (not whole)."""
    failed: list[int] = []
    window_lines = cls._window_lines

    def counted(self: Any, block: list[bytes], size: int, *rest: Any) -> Any:
        got = window_lines(self, block, size, *rest)
        if got is None:
            failed.append(len(block) // size)
        return got

    monkeypatch.setattr(cls, "_window_lines", counted)
    return failed


def test_a_read_ending_with_the_stream_s_end_reads_no_window_it_drops(monkeypatch: Any) -> None:
    """A read holding the last text deltas and the stream's end (block stop, message
    delta, message stop) reads the deltas in windows that each read whole: no window
    holding the end's blocks is tried and halved (a turn's fixed cost, issue 24 goal 1);
    the same texts and events."""
    texts = [f"w{i}" for i in range(600)]
    body = b"".join(f"event: content_block_delta\ndata: {_delta(t)}\n\n".encode() for t in texts)
    end = (
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        b'"end_turn","stop_sequence":null},"usage":{"output_tokens":600}}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    failed = _failed_windows(monkeypatch, StringSlot)
    out, failure = trio.run(_read, [body[:300], body[300:] + end])
    assert failure is None
    got = [x[1] if isinstance(x, tuple) else x["delta"]["text"] for x in out[:-3]]
    assert got == texts  # (the first delta read as its event: the slot is learned from it)
    assert [e["type"] for e in out[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert failed == []


def test_an_openai_read_ending_with_the_stream_s_end_reads_no_window_it_drops(
    monkeypatch: Any,
) -> None:
    """The same for Chat Completions: a read of the last text chunks, the finish chunk,
    the usage chunk and ``[DONE]``."""
    texts = [f"w{i}" for i in range(600)]
    body = b"".join(
        f"data: {_chunk({'content': t}, 'ab' * (i % 5))}\n\n".encode() for i, t in enumerate(texts)
    )
    usage = {**_HEAD, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
    end = (
        f"data: {_chunk({}, 'x', 'stop')}\n\n"
        f"data: {json.dumps(usage, separators=(',', ':'))}\n\n"
        "data: [DONE]\n\n"
    ).encode()
    failed = _failed_windows(monkeypatch, StringSlot)
    failed_two = _failed_windows(monkeypatch, TwoStringSlot)
    out, failure = trio.run(_read_openai, [body[:900], body[900:] + end])
    assert failure is None
    got = [x[1] if isinstance(x, tuple) else x["choices"][0]["delta"]["content"] for x in out[:-2]]
    assert got == texts
    assert [x["choices"] for x in out[len(texts) :]] == [
        [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
        [],
    ]
    assert failed == failed_two == []
