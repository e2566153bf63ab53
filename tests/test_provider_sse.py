"""The providers' SSE decoder (:mod:`actors.providers.sse`) reads what the SDKs read.

The OpenAI and Anthropic providers read a response's events from its bytes instead of
through the SDK's line decoder (issue 24: that decoder was the largest single cost of a
stream). These tests hold it to the SDK's decoder on any body, however its lines end and
however the network cuts it, and check which streams it is used for.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from hypothesis import example, given
from hypothesis import strategies as st

from actors.providers.failures import EventTooLarge
from actors.providers.sse import SSEDecoder, event_batches, sdk_sse_response, sse_batches

openai_streaming = pytest.importorskip("openai._streaming")

_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\r\n\x00", blacklist_categories=("Cs",)),
    max_size=12,
)
_LINE = st.one_of(
    st.builds(lambda v: f"data: {v}", _TEXT),
    st.builds(lambda v: f"data:{v}", _TEXT),
    st.just("data"),
    st.builds(lambda v: f"event: {v}", _TEXT),
    st.builds(lambda v: f": {v}", _TEXT),
    st.builds(lambda v: f"id: {v}", _TEXT),
    st.builds(lambda v: f"retry: {v}", st.one_of(st.integers(0, 9999).map(str), _TEXT)),
    st.builds(lambda v: f"other: {v}", _TEXT),
)
_EVENT = st.lists(_LINE, max_size=4)


@st.composite
def bodies(draw: Any) -> tuple[bytes, list[bytes]]:
    """A body of events (each ended by a blank line, the last maybe not) with each line
    ended by LF, CRLF or CR at random, cut into reads at random places."""
    events = draw(st.lists(_EVENT, max_size=6))
    lines = [line for event in events for line in [*event, ""]]
    if lines and draw(st.booleans()):
        lines.pop()  # a body that ends inside its last event
    ends = draw(st.lists(st.sampled_from(["\n", "\r\n", "\r"]), min_size=len(lines)))
    body = "".join(line + end for line, end in zip(lines, ends, strict=False)).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=6)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    return body, [c for c in chunks if c]


_DATA_LINE = st.builds(lambda v: f"data: {v}", st.sampled_from(["", "x", "data: y", " z"]))
_MOSTLY_DATA = st.one_of(
    st.lists(_DATA_LINE, min_size=1, max_size=1),  # the Chat Completions shape
    st.lists(_DATA_LINE, min_size=1, max_size=1),
    st.lists(_DATA_LINE, min_size=1, max_size=1),
    _EVENT,  # now and then another: blank, two data lines, a name, a comment
)


def _cut_body(draw: Any, events: list[list[str]]) -> list[bytes]:
    """``events`` as an LF-ended body (the last blank line now and then left off), cut
    into reads at up to four random places."""
    lines = [line for event in events for line in [*event, ""]]
    if lines and draw(st.booleans()):
        lines.pop()
    body = "".join(line + "\n" for line in lines).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    return [c for c in chunks if c]


@st.composite
def data_line_bodies(draw: Any) -> list[bytes]:
    """Bodies of mostly one-``data:``-line events (what the decoder reads by counting,
    :meth:`SSEDecoder._data_blocks`), LF-ended, cut into reads at random places."""
    return _cut_body(draw, draw(st.lists(_MOSTLY_DATA, max_size=12)))


_NAMED = st.builds(
    lambda name, value: [f"event: {name}", f"data: {value}"],
    st.sampled_from(["content_block_delta", "ping", "message_stop", "", " x", "é", "data: q"]),
    st.sampled_from(["", "x", "data: y", "event: z", " z"]),
)
_MOSTLY_NAMED = st.one_of(_NAMED, _NAMED, _NAMED, _EVENT)


@st.composite
def named_bodies(draw: Any) -> list[bytes]:
    """Bodies of mostly ``event:`` + ``data:`` events (a Messages API stream, what the
    decoder reads in slices, :meth:`SSEDecoder._named_blocks`), LF-ended, now and then
    another event, cut into reads at random places."""
    return _cut_body(draw, draw(st.lists(_MOSTLY_NAMED, max_size=12)))


@given(named_bodies())
@example([b"event: ping\ndata: \n\nevent: ping\ndata: x\n\n"])
@example([b"event: ping\ndata: \n\n\nevent: ping\ndata: x\n\n"])
@example([b"event: ping\ndata: a\ndata: b\n\nevent: ping\n\n"])
def test_bodies_of_named_events_are_read_as_the_sdk_reads_them(chunks: list[bytes]) -> None:
    assert _decode(chunks) == _sdk(chunks)


@given(data_line_bodies())
@example([b"data: \n\n\n\n\ndata: \n"])  # a read's rest that opens with a newline
def test_bodies_of_one_line_events_are_read_as_the_sdk_reads_them(chunks: list[bytes]) -> None:
    assert _decode(chunks) == _sdk(chunks)


def _decode_lines(chunks: list[bytes], step: int) -> list[tuple[str | None, bytes]]:
    """The events as a reader of :meth:`SSEDecoder.feed_lines` gets them: each read's
    lines read as events ``step`` blocks at a time."""
    decoder = SSEDecoder()
    out: list[tuple[str | None, bytes]] = []
    for chunk in chunks:
        lines, events = decoder.feed_lines(chunk)
        assert not (lines and events)
        assert len(lines) % 3 == 0 and lines[2::3].count(b"") == len(lines) // 3
        out += events
        k = len(lines) // 3
        for i in range(0, k, step):
            out += decoder.block_events(lines, i, min(i + step, k))
    return out + decoder.finish()


@given(
    st.one_of(named_bodies(), data_line_bodies(), bodies().map(lambda b: b[1])), st.integers(1, 4)
)
@example([b"event: ping\ndata: x\n\nevent: ping\ndata: \n\n\ndata: y\n\n"], 1)
@example([b"event: ping\ndata: x\n\nevent: ping\n\ndata: y"], 1)
@example([b"event: ping\ndata: 0\n\n", b"data: a\n", b"event: ping\ndata: x\n\n"], 1)  # pending
@example([b"event: ping\ndata: x\n\nid: 1\ndata: y\n\n\nevent: q\ndata: z\n\n"], 2)
def test_a_reads_lines_read_as_events_are_the_sdks_events(chunks: list[bytes], step: int) -> None:
    assert _decode_lines(chunks, step) == _sdk(chunks)


def _decode(chunks: list[bytes]) -> list[tuple[str | None, bytes]]:
    decoder = SSEDecoder()
    out = [event for chunk in chunks for event in decoder.feed(chunk)]
    return out + decoder.finish()


def _sdk(chunks: list[bytes]) -> list[tuple[str | None, bytes]]:
    events = openai_streaming.SSEDecoder().iter_bytes(iter(chunks))
    return [(sse.event, sse.data.encode()) for sse in events]


@given(bodies())
def test_the_events_are_the_sdks_however_the_lines_end_and_the_reads_fall(body: Any) -> None:
    _, chunks = body
    assert _decode(chunks) == _sdk(chunks)


def test_a_cr_at_the_end_of_a_read_and_its_lf_at_the_start_of_the_next_end_one_line():
    assert _decode([b"data: a\r", b"\n\r", b"\ndata: b\r\n\r\n"]) == [(None, b"a"), (None, b"b")]


def test_data_lines_join_with_a_newline_and_keep_their_bytes():
    chunks = ['event: delta\ndata: {"t": "é"}\ndata: x\n\n'.encode()]
    assert _decode(chunks) == [("delta", '{"t": "é"}\nx'.encode())]


def test_a_last_event_without_its_blank_line_is_not_an_event():
    assert _decode([b"data: a\n\ndata: b\n"]) == [(None, b"a")]


def test_a_leading_byte_order_mark_is_dropped_however_the_reads_cut_it():
    """The SSE specification drops a UTF-8 BOM at the body's start; it joined the first
    field's name, and the first event was lost (branch ``provmend``). One later in the
    body is the line's."""
    body = b"\xef\xbb\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\ndata: c\n\n"
    for cut in range(len(body)):
        assert _decode([body[:cut], body[cut:]]) == [(None, b"a"), (None, b"c")], cut
        decoder = SSEDecoder()
        lines, events = decoder.feed_lines(body[:cut], 2)
        more, rest = decoder.feed_lines(body[cut:], 2)
        got = events + rest
        for found in (lines, more):
            got += decoder.block_events(found, 0, len(found) // 2, 2) if found else []
        assert got == [(None, b"a"), (None, b"c")], cut


def test_a_decoders_own_limit_bounds_its_lines_and_events():
    """``SSEDecoder(limit=...)`` (the A2A client's 16 MiB); the default stays
    ``MAX_EVENT_BYTES``."""
    with pytest.raises(EventTooLarge, match="more than 100 bytes"):
        SSEDecoder(limit=100).feed(b"data: " + b"x" * 200)  # a line with no end
    with pytest.raises(EventTooLarge, match="more than 100 bytes"):
        SSEDecoder(limit=100).feed(b"data: " + b"x" * 60 + b"\ndata: " + b"y" * 60 + b"\n")
    assert SSEDecoder().feed(b"data: " + b"x" * 200 + b"\n\n") == [(None, b"x" * 200)]


def test_finish_with_flush_ends_the_last_line_and_event():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\ndata: b\ndata:") == [(None, b"a")]
    assert decoder.feed(b" c") == []
    assert decoder.finish(flush=True) == [(None, b"b\nc")]
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.finish(flush=True) == [(None, b"a")]


async def test_the_batches_hold_the_events_each_read_completed():
    async def reads() -> Any:
        for chunk in (b"data: 1\n\ndata: 2\n\nda", b"ta: 3\n", b"\n"):
            yield chunk
            await trio.lowlevel.checkpoint()

    got = [batch async for batch in sse_batches(reads())]
    assert got == [[(None, b"1"), (None, b"2")], [(None, b"3")]]


class _Stream:
    """An SDK stream's shape: a decoder, a response and the SDK's iterator."""

    def __init__(self, decoder: Any) -> None:
        self._decoder = decoder
        self.response = _Response()

    async def _iter_events(self) -> Any:
        yield openai_streaming.ServerSentEvent(event="through-sdk", data="x")


class _Response:
    async def aiter_bytes(self) -> Any:
        yield b"event: from-bytes\ndata: x\n\n"


async def test_a_stream_the_sdk_decodes_as_sse_is_read_from_its_bytes():
    stream = _Stream(openai_streaming.SSEDecoder())
    assert sdk_sse_response(stream) is stream.response
    assert [b async for b in event_batches(stream)] == [[("from-bytes", b"x")]]


async def test_a_stream_with_another_decoder_goes_through_the_sdk():
    class AWSEventStreamDecoder:  # Bedrock's binary event stream, say
        pass

    stream = _Stream(AWSEventStreamDecoder())
    assert sdk_sse_response(stream) is None
    assert [b async for b in event_batches(stream)] == [[("through-sdk", b"x")]]
