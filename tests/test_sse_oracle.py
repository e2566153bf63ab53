"""The providers' fast stream readers against a plain oracle: the SDK's own SSE decoder
and ``json.loads`` of each event's data (issue 24 goal 1).

:mod:`tests.test_sse_lines` holds the line reader to the event reader, which shares the
slot (:mod:`actors.providers.json_slot`) with it; here neither is the reference. Bodies
are written the way a server (or a proxy) may write them: text deltas whose JSON has its
keys in another order, whitespace, extra and duplicate keys, a ``"text"`` key or
``"text":`` inside a nested object or a string, every character now and then written as
an escape (``\\uXXXX``, a surrogate pair, ``\\/``, the short ones), ``id:``, ``retry:``
and comment lines between the fields, LF, CRLF or CR line ends (mixed), an invalid data
line or the server's error event, all cut into reads at random places (now and then a
byte a read). The chunks the parser makes from the fast reader (lines, slot, runs) must
be those it makes from the oracle's events, and a stream the oracle cannot decode (or
that brings an error) must fail after the same chunks.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai._streaming import SSEDecoder as SDKDecoder

from actors.providers import anthropic, openai
from runtime.chunks import TextChunk
from runtime.provider import TextRun
from tests.support.chunk_sink import ChunkSink

_SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n"}
_SHORT.update({"\r": "\\r", "\t": "\\t"})

_TEXT = st.one_of(
    st.text(alphabet="ab é☃😀/\n\t\\", max_size=6),
    st.text(alphabet="ab é☃😀/\n\t\\", max_size=6),
    st.text(max_size=8),
    st.text(alphabet='"\\/\n\r\t\x00\x1f é☃😀\U0010ffff{}[]:,', max_size=8),
    st.sampled_from(['"text":"x"', '\\"', '"}', "\\", "data: x", "event: ping", "\u2028"]),
)


@st.composite
def json_string(draw: Any, s: str, style: int) -> str:
    """``s`` as a JSON string token: plain (style 0, ASCII-safe 1), or each character
    written as it may be (style 2: escapes at random, surrogate pairs for astral ones)."""
    if style == 0:
        return json.dumps(s, ensure_ascii=False)
    if style == 1:
        return json.dumps(s)
    out = []
    for ch in s:
        code = ord(ch)
        how = draw(st.integers(0, 3))
        if code < 0x20 or ch in '"\\':
            how = how or 1
        if how == 0:
            out.append(ch)
        elif how == 1 and ch in _SHORT:
            out.append(_SHORT[ch])
        elif code > 0xFFFF:
            hi = 0xD800 + ((code - 0x10000) >> 10)
            lo = 0xDC00 + ((code - 0x10000) & 0x3FF)
            pair = f"\\u{hi:04x}\\u{lo:04x}"
            out.append(pair.upper().replace("\\U", "\\u") if how == 3 else pair)
        else:
            esc = f"\\u{code:04x}"
            out.append(esc.upper().replace("\\U", "\\u") if how == 3 else esc)
    return '"' + "".join(out) + '"'


def json_doc(value: Any, ws: str) -> str:
    """``value`` as JSON: keys in the dict's order, ``ws`` around the punctuation."""
    if isinstance(value, dict):
        items = [f"{json.dumps(k)}{ws}:{ws}{json_doc(v, ws)}" for k, v in value.items()]
        return "{" + ws + f"{ws},{ws}".join(items) + ws + "}"
    if isinstance(value, list):
        return "[" + ws + f"{ws},{ws}".join(json_doc(v, ws) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


_SPACE = st.sampled_from([" ", " ", " ", ""])
_ONE_IN_4 = st.sampled_from([False, False, False, True])
_ONE_IN_10 = st.sampled_from([False] * 9 + [True])
_WS = st.sampled_from(["", "", " ", "\t", "  "])
_EXTRA = st.sampled_from(
    [
        {},
        {"extra": 1},
        {"meta": {"text": "nested"}},
        {"note": '"text":"not this"'},
        {"z": [1, {"text": "in a list", "content": "x"}]},
    ]
)
_MARK = "\x01TEXT\x01"
_MARK_TOKEN = json.dumps(_MARK, ensure_ascii=False)
_PAD = "\x01PAD\x01"
_PAD_TOKEN = json.dumps(_PAD, ensure_ascii=False)


@st.composite
def template(draw: Any, doc: dict[str, Any], key: str) -> str:
    """``doc`` (its text ``_MARK``) as JSON of a drawn shape: keys in the drawn order
    (the nested ones too), whitespace, extra keys, now and then a duplicate ``key``
    before the real one (the last one counts). Its text token is ``_MARK_TOKEN``."""

    def shuffled(value: Any) -> Any:
        if isinstance(value, dict):
            keys = draw(st.permutations(list(value)))
            return {k: shuffled(value[k]) for k in keys}
        if isinstance(value, list):
            return [shuffled(v) for v in value]
        return value

    ws = draw(_WS)
    out = json_doc({**shuffled(doc), **draw(_EXTRA)}, ws)
    if draw(_ONE_IN_4):
        real = f'"{key}"{ws}:{ws}{_MARK_TOKEN}'
        out = out.replace(real, f'"{key}"{ws}:{ws}"dup"{ws},{ws}{real}')
    return out


@st.composite
def with_text(draw: Any, template: str, styles: list[int]) -> str:
    """``template`` with a drawn text in its place, written in one of ``styles``."""
    token = draw(json_string(draw(_TEXT), draw(st.sampled_from(styles))))
    return template.replace(_MARK_TOKEN, token)


_SOME = st.sampled_from([0, 5, 20, 40])
"""The least events of a body (hypothesis draws short lists most)."""
_STYLES = st.sampled_from([[0], [1], [2], [0, 2], [0, 1, 2]])


_NOISE = st.sampled_from([": keep-alive", "id: 7", "retry: 100", ":", "id:", "retry: x"])
_NOISE_RATE = st.sampled_from([0, 0, 0, 0, 0, 5, 30])
"""How often (percent of lines) an ``id:``, ``retry:`` or comment line comes before a
line: most bodies have none, so that their reads are read as lines."""


@st.composite
def noise(draw: Any, rate: int) -> str | None:
    return draw(_NOISE) if rate and draw(st.integers(0, 99)) < rate else None


@st.composite
def anthropic_body(draw: Any) -> tuple[list[bytes], bool]:
    """A Messages API body cut into reads, and whether a line's JSON is broken."""
    delta = {"type": "content_block_delta", "index": 0}
    delta["delta"] = {"type": "text_delta", "text": _MARK}
    shape = draw(template(delta, "text"))
    other = draw(template({**delta, "other": 1}, "text"))  # another shape now and then
    styles = draw(_STYLES)
    events: list[tuple[str, str]] = [
        ("message_start", '{"type":"message_start","message":{"usage":{"input_tokens":3}}}'),
        (
            "content_block_start",
            '{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}',
        ),
    ]
    broken = False
    kinds = st.sampled_from("ddddddddddpxtjL")
    for kind in draw(st.lists(kinds, min_size=draw(_SOME), max_size=60)):
        if kind in "dx":
            data = draw(with_text(shape if kind == "d" else other, styles))
            events.append(("content_block_delta", data))
        elif kind == "p":
            events.append(("ping", '{"type": "ping"}'))
        elif kind == "t":  # a text delta of another block
            data = re.sub(r'"index"(\s*):(\s*)0', r'"index"\1:\g<2>1', shape)
            events.append(("content_block_delta", draw(with_text(data, styles))))
        elif kind == "j":  # another kind of delta, its string in the same place
            data = shape.replace('"text_delta"', '"input_json_delta"')
            events.append(("content_block_delta", draw(with_text(data, styles))))
        elif kind == "L":  # a data line longer than any read
            token = json.dumps('é😀\\"x' * draw(st.sampled_from([3000, 20000])))
            events.append(("content_block_delta", shape.replace(_MARK_TOKEN, token)))
    if draw(_ONE_IN_4):  # a line of invalid JSON, or the server's error, among them
        broken = True
        at = draw(st.integers(2, len(events)))
        events.insert(
            at,
            draw(
                st.sampled_from(
                    [
                        ("content_block_delta", '{"type":"content_block_delta","index":0,'),
                        ("error", '{"type":"error","error":{"type":"overloaded_error"}}'),
                    ]
                )
            ),
        )
    events.append(("content_block_stop", '{"type":"content_block_stop","index":0}'))
    events.append(("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn"}}'))
    events.append(("message_stop", '{"type":"message_stop"}'))
    lines: list[str] = []
    rate = draw(_NOISE_RATE)
    for name, data in events:
        space = draw(_SPACE)  # "field:value" is "field: value" (one space dropped)
        for line in [f"event:{space}{name}", f"data:{space}{data}"]:
            field = draw(noise(rate))
            if field:
                lines.append(field)
            lines.append(line)
        lines.append("")
    return _cut(draw, lines), broken


def _cut(draw: Any, lines: list[str]) -> list[bytes]:
    ends = draw(st.sampled_from(["\n", "\n", "\n", "\r\n", "\r", "mixed"]))
    body = b""
    end = ""
    for line in lines:
        if ends != "mixed":
            end = ends
        elif line or end != "\r":
            end = draw(st.sampled_from(["\n", "\r\n", "\r"]))
        else:  # a blank line after a CR: its LF would make one line end of the two
            end = draw(st.sampled_from(["\r\n", "\r"]))
        body += (line + end).encode()
    if len(body) < 20_000 and draw(_ONE_IN_10):  # a byte a read
        return [body[i : i + 1] for i in range(len(body))]
    cuts = sorted(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=8)))
    return [
        c for c in (body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)) if c
    ]


class _Response:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.status_code = chunks, 200
        self.request = httpx.Request("POST", "http://127.0.0.1/v1")  # (an error names it)

    async def aiter_bytes(self) -> Any:
        for chunk in self.chunks:
            yield chunk


class _Stream:
    """An SDK ``AsyncStream`` as the readers see it: a response whose body the SDK would
    decode as plain SSE (so the fast readers take its bytes)."""

    def __init__(self, chunks: list[bytes], module: str) -> None:
        self.response = _Response(chunks)
        self._decoder = type("SSEDecoder", (), {"__module__": module})()
        self._observer = None
        self._client = self  # (what makes the status error of an ``event: error``)

    def _make_status_error(self, message: str, *, body: Any, response: Any) -> Exception:
        return RuntimeError(message)

    def _iter_events(self) -> None:
        raise AssertionError("read from the bytes")


def _expanded(chunks: list[Any]) -> list[Any]:
    out: list[Any] = []
    for chunk in chunks:
        out += [TextChunk(text=t) for t in chunk.texts] if type(chunk) is TextRun else [chunk]
    return out


async def _fast(chunks: list[bytes], provider: Any) -> tuple[list[Any], bool]:
    sink = ChunkSink()
    failed = False
    try:
        if provider is anthropic:
            batches = anthropic.json_event_batches(
                _Stream(chunks, "anthropic._streaming"), texts=True
            )
        else:
            batches = openai.json_chunk_batches(_Stream(chunks, "openai._streaming"), texts=True)
        await provider.parse_batches(batches, sink, runs=True)
    except Exception:
        failed = True
    return _expanded(sink.chunks), failed


def _oracle_events(chunks: list[bytes]) -> list[Any]:
    return list(SDKDecoder().iter_bytes(iter(chunks)))


async def _oracle(chunks: list[bytes], provider: Any) -> tuple[list[Any], bool]:
    """The parser fed the SDK decoder's events, each data decoded by ``json.loads``."""
    docs: list[Any] = []
    failed = False
    for sse in _oracle_events(chunks):
        if provider is anthropic:
            if sse.event in (None, "ping") or not sse.data:
                continue
            if sse.event == "error":  # the server's error, as the SDK raises it
                failed = True
                break
        elif sse.data.startswith("[DONE]"):
            break
        try:
            doc = json.loads(sse.data)
        except ValueError:
            failed = True
            break
        if provider is openai and type(doc) is dict and doc.get("error"):
            failed = True
            break
        docs.append(doc)

    async def batches() -> Any:
        for doc in docs:
            yield [doc]

    sink = ChunkSink()
    try:
        await provider.parse_batches(batches(), sink)
    except Exception:
        failed = True
    return _expanded(sink.chunks), failed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=anthropic_body())
def test_anthropic_fast_reader_gives_what_the_sdk_decoder_and_json_loads_give(
    body: tuple[list[bytes], bool],
) -> None:
    chunks, broken = body
    fast = trio.run(_fast, chunks, anthropic)
    oracle = trio.run(_oracle, chunks, anthropic)
    assert fast == oracle
    assert fast[1] == broken


# -- OpenAI Chat Completions --------------------------------------------------------------


@st.composite
def openai_body(draw: Any) -> tuple[list[bytes], bool]:
    choice = {"index": 0, "delta": {"content": _MARK}, "finish_reason": None}
    doc: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": "m"}
    doc["choices"] = [choice]
    padded = draw(st.booleans())
    if padded:  # api.openai.com's padding, a string of its own on every chunk
        doc["obfuscation"] = _PAD
    shape = draw(template(doc, "content"))
    other = draw(template({**doc, "usage": None}, "content"))
    styles = draw(_STYLES)

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {**doc, "choices": [choice], "obfuscation": "p"}

    datas = [json.dumps(chunk({"role": "assistant", "content": ""}))]
    broken = False
    for kind in draw(st.lists(st.sampled_from("ddddddddxL"), min_size=draw(_SOME), max_size=60)):
        if kind == "L":  # a data line longer than any read
            token = json.dumps('é😀\\"x' * draw(st.sampled_from([3000, 20000])))
            datas.append(shape.replace(_MARK_TOKEN, token).replace(_PAD_TOKEN, '"p"'))
            continue
        if kind in "dx":
            data = draw(with_text(shape if kind == "d" else other, styles))
            pad = draw(st.one_of(st.text("ab1", max_size=5), _TEXT))
            datas.append(data.replace(_PAD_TOKEN, draw(json_string(pad, 0))))
    if draw(_ONE_IN_4):  # a line of invalid JSON, or the server's error, among them
        broken = True
        at = draw(st.integers(1, len(datas)))
        bad = st.sampled_from(
            [
                '{"id":"c1","choices":[{"index":0,"delta":{"content":',
                '{"error":{"message":"boom","type":"server_error"}}',
            ]
        )
        datas.insert(at, draw(bad))
    datas.append(json.dumps(chunk({}, "stop")))
    datas.append("[DONE]")
    lines: list[str] = []
    rate = draw(_NOISE_RATE)
    for data in datas:
        field = draw(noise(rate))
        if field:
            lines.append(field)
        lines += [f"data:{draw(_SPACE)}{data}", ""]
    return _cut(draw, lines), broken


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=openai_body())
def test_openai_fast_reader_gives_what_the_sdk_decoder_and_json_loads_give(
    body: tuple[list[bytes], bool],
) -> None:
    chunks, broken = body
    fast = trio.run(_fast, chunks, openai)
    oracle = trio.run(_oracle, chunks, openai)
    assert fast == oracle
    assert fast[1] == broken
