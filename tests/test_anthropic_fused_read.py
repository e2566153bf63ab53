"""Anthropic's one-pass read of an SSE body equals the two-pass one it replaced.

The provider used to decode a read's events into a list of dicts
(:func:`~actors.providers.anthropic.json_event_batches`) and parse that list
(:func:`~actors.providers.anthropic.parse_batches`); on a byte stream it now does both in
one loop (:func:`~actors.providers.anthropic.parse_sse_batches`, issue 24). Whatever the
events (text deltas of several blocks, other deltas, pings, nameless, empty, error
events, bad or non-object JSON, deltas to unknown blocks), both must emit the same chunks
in the same sends and end with the same error, or none.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.providers import anthropic
from runtime.chunks import TextChunk


class _Sink:
    """An emit that takes lists (as the provider actor's batcher does): the sends."""

    def __init__(self) -> None:
        self.sends: list[list[Any]] = []

    async def __call__(self, chunk: Any) -> None:
        self.sends.append([chunk])

    async def send_all(self, chunks: list[Any]) -> None:
        self.sends.append(list(chunks))


class _Response:
    status_code = 200


class _Client:
    def _make_status_error(self, message: str, *, body: Any, response: Any) -> Exception:
        return RuntimeError(f"status error: {message}")


class _Stream:
    """What the readers look at on an SDK stream (the events come from a patch)."""

    response = _Response()
    _client = _Client()
    _observer = None

    def _iter_events(self) -> Any:  # pragma: no cover - never called: event_batches is patched
        raise AssertionError


def _data(obj: Any) -> bytes:
    return json.dumps(obj).encode()


_TEXT = st.builds(
    lambda i, t: (
        "content_block_delta",
        _data(
            {"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}}
        ),
    ),
    st.sampled_from([0, 1, 2]),
    st.sampled_from(["", "a", " b", "Hé"]),
)
_OTHER = st.sampled_from(
    [
        (
            "message_start",
            _data({"type": "message_start", "message": {"usage": {"input_tokens": 3}}}),
        ),
        (
            "content_block_start",
            _data(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                }
            ),
        ),
        (
            "content_block_start",
            _data(
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "thinking", "thinking": "hm"},
                }
            ),
        ),
        (
            "content_block_start",
            _data(
                {
                    "type": "content_block_start",
                    "index": 2,
                    "content_block": {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                }
            ),
        ),
        (
            "content_block_delta",
            _data(
                {
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "thinking_delta", "thinking": "x"},
                }
            ),
        ),
        (
            "content_block_delta",
            _data(
                {
                    "type": "content_block_delta",
                    "index": 2,
                    "delta": {"type": "input_json_delta", "partial_json": '{"a"'},
                }
            ),
        ),
        ("content_block_delta", _data({"type": "content_block_delta", "index": 0, "delta": {}})),
        ("content_block_delta", _data({"type": "content_block_delta", "index": 0})),
        ("content_block_delta", _data({"type": "message_stop"})),
        ("content_block_delta", b""),
        ("content_block_delta", b"[1]"),
        ("content_block_delta", b"{not json"),
        ("content_block_stop", _data({"type": "content_block_stop", "index": 0})),
        ("content_block_stop", _data({"type": "content_block_stop", "index": 2})),
        (
            "message_delta",
            _data(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 4},
                }
            ),
        ),
        ("message_stop", _data({"type": "message_stop"})),
        ("ping", _data({"type": "ping"})),
        (None, _data({"type": "message_stop"})),
        ("something_new", _data({"type": "something_new"})),
        ("something_new", b"7"),
        ("error", _data({"type": "error", "error": {"type": "overloaded_error"}})),
    ]
)
_START = [
    ("message_start", _data({"type": "message_start", "message": {"usage": {"input_tokens": 3}}})),
    (
        "content_block_start",
        _data(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        ),
    ),
]
_END = [
    ("content_block_stop", _data({"type": "content_block_stop", "index": 0})),
    ("message_delta", _data({"type": "message_delta", "delta": {"stop_reason": "end_turn"}})),
    ("message_stop", _data({"type": "message_stop"})),
]


async def _run(reader: str, reads: list[list[Any]], coalesce: bool) -> tuple[Any, str | None]:
    async def batches(stream: Any) -> Any:
        for read in reads:
            yield list(read)

    sink = _Sink()
    stream = _Stream()
    failure = None
    try:
        if reader == "fused":
            await anthropic.parse_sse_batches(stream, batches(stream), sink, coalesce=coalesce)
        else:
            original = anthropic.event_batches
            anthropic.event_batches = batches  # type: ignore[assignment]
            try:
                parsed = anthropic.json_event_batches(stream)
                await anthropic.parse_batches(parsed, sink, coalesce=coalesce)
            finally:
                anthropic.event_batches = original
    except Exception as exc:
        failure = f"{type(exc).__name__}: {exc}"
    return sink.sends, failure


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    middle=st.lists(st.one_of(_TEXT, _TEXT, _OTHER), max_size=30),
    cuts=st.lists(st.integers(0, 40), max_size=6),
    coalesce=st.booleans(),
    complete=st.booleans(),
)
def test_one_pass_read_emits_and_fails_as_two_passes(middle, cuts, coalesce, complete):
    events = _START + middle + (_END if complete else [])
    bounds = sorted({c for c in cuts if c < len(events)} | {0, len(events)})
    reads = [events[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    fused = trio.run(_run, "fused", reads, coalesce)
    two = trio.run(_run, "two", reads, coalesce)
    assert fused == two


def test_a_plain_text_stream_is_its_deltas_in_order():
    texts = ["Hel", "lo", " there"]
    events = (
        _START
        + [
            (
                "content_block_delta",
                _data(
                    {
                        "type": "content_block_delta",
                        "index": 0,
                        "delta": {"type": "text_delta", "text": t},
                    }
                ),
            )
            for t in texts
        ]
        + _END
    )
    sends, failure = trio.run(_run, "fused", [events[:3], events[3:]], False)
    assert failure is None
    chunks = [c for send in sends for c in send]
    assert [c.text for c in chunks if isinstance(c, TextChunk)] == texts
    assert sends[0] == [TextChunk(text="Hel")]  # the first delta goes alone
