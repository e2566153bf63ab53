"""An emoji a server escapes as a surrogate pair split across two deltas (``"\\ud83d"``
then ``"\\ude00"``): every live stream shows the text the session saves. The providers'
readers hold a text's trailing high half back for the next delta of its part, on their
slow path only (orjson refuses half a character; the event is then read as the SDK reads
it): the normal path does the same work as before (journal
``benchmarks/journal/pipeline.md``, ``### emoji``)."""

from __future__ import annotations

import contextlib
import itertools
import json
import sys
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from actors.providers import anthropic, gemini_wire, openai, openai_responses
from runtime import Agent
from runtime.chunks import TextChunk
from runtime.serde import utf8_text
from tests.support.attacks import (
    KINDS,
    attack_rig,
    gemini_chunk,
    gemini_sse,
    make,
    resolve_platform,
    responses_message,
)
from tests.support.faults import (
    a_body,
    a_end,
    a_start,
    a_text,
    a_thinking,
    oa_chunk,
    oa_reasoning_then_text,
    oa_text,
    oa_usage,
    sse,
)
from tests.support.loopback import Reply, loopback_server, responses_sse
from tests.test_hostile_text import WEB_STREAMS, utf16_halves
from tests.test_provider_attacks import ONCE, texts, turn
from tests.web.harness import web_server


def live(chunks: list[Any]) -> str:
    """The text every live stream shows: each delta written as its own JSON event (AI
    SDK, AG-UI, OpenAI-compatible, A2A, the relay: ``serde.utf8_dumps``, a half alone
    U+FFFD), joined. Each delta is whole characters (so those writers' orjson takes it
    as it is)."""
    deltas = [c.text for c in chunks if c.type == "text-delta"]
    for text in deltas:
        text.encode()
    return "".join(utf8_text(text) for text in deltas)


@pytest.mark.parametrize("kind", KINDS)
async def test_an_emoji_split_across_two_deltas_streams_live_as_it_is_saved(kind, autojump_clock):
    """Before: each half alone went out as U+FFFD (``a\\ufffd``, ``\\ufffdb``) while
    the session saved ``a😀b``."""
    async with attack_rig(kind, retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=r.answer("a\ud83d", "\ude00b")))
        assert result.error is None
        assert live(chunks) == texts(r.session.messages[1]) == "a😀b"


@pytest.mark.parametrize("kind", KINDS)
async def test_an_empty_delta_between_an_emojis_halves_leaves_the_emoji_whole(kind, autojump_clock):
    """``"a\\ud83d"``, an empty delta (OpenAI's ``content: ""``), then ``"\\ude00b"``.
    Before: the empty delta joined the held half to nothing, U+FFFD, and the other half
    came alone: ``a\\ufffd\\ufffdb`` live and saved, where no empty delta gives ``a😀b``."""
    async with attack_rig(kind, retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=r.answer("a\ud83d", "", "\ude00b")))
        assert result.error is None
        assert live(chunks) == texts(r.session.messages[1]) == "a😀b"


@pytest.mark.parametrize("pieces", [("a\ud83d", "b"), ("a\ud83d", "b", "c\ud83d")])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_held_half_whose_other_half_never_comes_streams_as_it_is_saved(
    kind, pieces, autojump_clock
):
    """A high half followed by no low half (another character, or the answer's end)
    goes out U+FFFD, as the store keeps it; the text around it is whole."""
    async with attack_rig(kind, retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=r.answer(*pieces)))
        assert result.error is None
        saved = texts(r.session.messages[1])
        assert live(chunks) == saved == utf8_text("".join(pieces))


@pytest.mark.parametrize("protocol", ["ai-sdk", "ag-ui", "openai", "a2a"])
async def test_a_web_stream_of_an_emoji_split_across_two_deltas_shows_the_emoji(protocol):
    """A real OpenAI reader behind each web protocol's stream: before, the client read
    ``a\ufffd`` then ``\ufffdb`` (the saved message: ``a😀b``); now the emoji."""
    path, payload = WEB_STREAMS[protocol]
    async with loopback_server() as server:
        server.add(Reply(body=oa_text("a\ud83d", "\ude00b")))
        provider = make("openai", server.url)
        resolve_platform(provider)
        agent = Agent(name="m", provider=provider)
        try:
            async with web_server(agent, protocols=("ai-sdk", protocol)) as web:
                async with httpx.AsyncClient(base_url=web.url, timeout=30) as client:
                    r = await client.post(path, json=payload)
        finally:
            with trio.CancelScope(shield=True):
                await provider.aclose()
    assert r.status_code == 200
    assert "😀".encode() in r.content and "\ufffd".encode() not in r.content


@pytest.mark.parametrize("then", ["\ude00b", "b"])
def test_a_half_held_as_a_gemini_continuation_hop_ends_waits_for_the_next_hop(then):
    """A hop that ends (``finishReason: CONTINUATION``) between an emoji's halves: the
    half waits for the next hop's first text, and the live text is the saved one (the
    other half, or U+FFFD when it does not come)."""
    from actors.providers.gemini import parse_stream
    from actors.providers.gemini_wire import open_stream, wire_chunks, wire_request
    from tests.test_provider_gemini_fast_path import PARAMS, _client, _run

    def hop(text: str, finish: dict[str, Any]) -> list[bytes]:
        content = {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}}]}
        usage = {"promptTokenCount": 1, "candidatesTokenCount": 1}
        chunks = [content, {"candidates": [finish], "usageMetadata": usage}]
        return [b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)]

    token = "cmVzdW1l"
    first = hop("a\ud83d", {"finishReason": "CONTINUATION", "continuationToken": token})
    second = hop(then, {"finishReason": "STOP"})

    async def main() -> tuple[list[Any], Any]:
        wire = wire_request(_client(first, second), PARAMS)
        assert wire is not None

        async def heard(_: Any) -> None:
            return None

        async with contextlib.aclosing(wire_chunks(wire, open_stream, heard)) as chunks:
            return await _run(parse_stream, chunks)

    chunks, error = trio.run(main)
    assert error is None
    deltas = [c.text for c in chunks if isinstance(c, TextChunk)]
    for text in deltas:
        text.encode()
    assert "".join(deltas) == utf8_text("a\ud83d" + then)


def reasoning_body(kind: str, *pieces: str) -> bytes:
    """A reasoning streamed in ``pieces``, then the answer ``ok``, in ``kind``'s wire."""
    if kind == "openai":
        return oa_reasoning_then_text(pieces, ["ok"])
    if kind == "anthropic":
        return a_body(a_start(), a_thinking(0, *pieces), a_text(1, "ok"), a_end())
    if kind == "gemini":
        chunks = [gemini_chunk([{"text": p, "thought": True}]) for p in pieces]
        return gemini_sse(*chunks, gemini_chunk([{"text": "ok"}], "STOP"))
    item = {"id": "rs_1", "type": "reasoning", "summary": []}
    deltas = [
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "delta": p,
        }
        for p in pieces
    ]
    summary = [{"type": "summary_text", "text": "".join(pieces)}]
    events = [
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        *deltas,
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {**item, "summary": summary},
        },
    ]
    return responses_sse("gpt-5-mini", 1, [*events, *responses_message(1, "msg_1", "ok")])


def reasoning_of(message: Any) -> str:
    return "".join(p.text for p in message.content if p.type == "reasoning")


@pytest.mark.parametrize("kind", KINDS)
async def test_an_emoji_split_across_two_reasoning_deltas_streams_live_as_it_is_saved(
    kind, autojump_clock
):
    """Before: only an answer's text held the half; a reasoning's went out as
    ``\ufffd`` twice live, while the session saved the emoji."""
    async with attack_rig(kind, retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=reasoning_body(kind, "a\ud83d", "\ude00b")))
        assert result.error is None
        deltas = [c.text for c in chunks if c.type == "reasoning-delta"]
        for text in deltas:
            text.encode()
        assert "".join(deltas) == reasoning_of(r.session.messages[1]) == "a😀b"


@pytest.mark.parametrize("pieces", [("a\ud83d", "b"), ("a\ud83d",)], ids=["then-b", "ends"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_reasonings_held_half_whose_other_half_never_comes_goes_out_as_reasoning(
    kind, pieces, autojump_clock
):
    """The half goes out U+FFFD as the store keeps it, in the reasoning (a text delta
    flushed for it would have put U+FFFD in the answer)."""
    async with attack_rig(kind, retry=ONCE) as r:
        chunks, result = await turn(r, Reply(body=reasoning_body(kind, *pieces)))
        assert result.error is None
        deltas = [c.text for c in chunks if c.type == "reasoning-delta"]
        for text in deltas:
            text.encode()
        saved = reasoning_of(r.session.messages[1])
        assert "".join(deltas) == saved == utf8_text("".join(pieces))
        assert live(chunks) == texts(r.session.messages[1]) == "ok"


@pytest.mark.parametrize("kind", ["openai", "anthropic", "responses"])
async def test_an_emoji_split_across_two_tool_argument_deltas_streams_live_as_it_is_saved(
    kind, autojump_clock
):
    """A tool call's arguments streamed in pieces, an emoji's halves in two of them
    (Gemini sends a call's arguments whole). Before: each half live as ``\ufffd``; the
    tool was given the emoji."""
    given: list[str] = []

    async def echo(q: str) -> str:
        """Say ``q`` back."""
        given.append(q)
        return q

    pieces = ('{"q": "a\ud83d', '\ude00b"}')
    async with attack_rig(kind, retry=ONCE, tools=[echo]) as r:
        call = Reply(body=r.tool_call("c1", "echo", *pieces))
        chunks, result = await turn(r, call, Reply(body=r.answer("ok")))
        assert result.error is None
        deltas = [c.delta for c in chunks if c.type == "tool-input-delta"]
        for text in deltas:
            text.encode()
        stored = next(p for p in r.session.messages[1].content if p.type == "tool-call")
        assert json.loads("".join(deltas)) == stored.input == {"q": "a😀b"}
        assert given == ["a😀b"]


# -- any text, cut anywhere, read in any reads --------------------------------------------------


def escaped(piece: str) -> bytes:
    """A delta's text as a server escapes it: every non-ASCII character as ``\\uXXXX``,
    an astral one as its two halves (which the cut may have parted)."""
    return json.dumps(piece).encode()


def openai_events(pieces: list[str]) -> list[tuple[Any, bytes]]:
    head, tail = b'{"choices":[{"index":0,"delta":{"content":', b"}}]}"
    events = [(None, head + escaped(p) + tail) for p in pieces]
    return [*events, (None, b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}')]


def openai_texts(out: list[Any]) -> list[str]:
    found: list[str] = []
    for item in out:
        if type(item) is list:
            found += item
        else:
            delta = item["choices"][0]["delta"]
            found += [delta["content"]] if delta.get("content") else []
    return found


def anthropic_events(pieces: list[str]) -> list[tuple[Any, bytes]]:
    head = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
    events = [("content_block_delta", head + escaped(p) + b"}}") for p in pieces]
    return [*events, ("content_block_stop", b'{"type":"content_block_stop","index":0}')]


def anthropic_texts(out: list[Any]) -> list[str]:
    found: list[str] = []
    for item in out:
        if type(item) is list:
            found += item
        elif anthropic._delta_text(item):
            found.append(item["delta"]["text"])
    return found


READERS: dict[str, tuple[Callable[[], Any], Callable[..., Any], Callable[..., Any]]] = {
    "openai": (lambda: openai._ChunkReader(None, True), openai_events, openai_texts),
    "anthropic": (
        lambda: anthropic._EventReader(SimpleNamespace(response=None), True),
        anthropic_events,
        anthropic_texts,
    ),
}


@pytest.mark.parametrize("name", list(READERS))
@given(
    text=st.text(st.characters(codec="utf-8"), max_size=30),
    cuts=st.lists(st.integers(0, 10**6)),
    reads=st.lists(st.integers(0, 10**6)),
)
def test_any_text_cut_anywhere_streams_as_its_own_characters(name, text, cuts, reads):
    """Any text (astral characters, ZWJ sequences, NUL) cut into deltas at any UTF-16
    position, each escaped as a server escapes it, the deltas read in any network reads
    (a slot learned or not): every text the reader gives is whole characters, and
    together they are the text."""
    make, events_of, texts_of = READERS[name]
    units = utf16_halves(text)
    points = sorted({c % (len(units) + 1) for c in cuts} | {0, len(units)})
    events = events_of([units[a:b] for a, b in itertools.pairwise(points)])
    bounds = sorted({c % (len(events) + 1) for c in reads} | {0, len(events)})
    reader, out = make(), []
    for a, b in itertools.pairwise(bounds):
        failure = reader.events(events[a:b], out)
        assert (failure[0] if type(failure) is tuple else failure) is None
    got = texts_of(out)
    for piece in got:
        piece.encode()  # no half alone: each live event holds it as it is
    assert "".join(got) == text


KIND_EVENTS: dict[str, tuple[Callable[[str], bytes], Callable[[bytes], bytes]]] = {
    "openai-reasoning": (
        lambda p: b'{"choices":[{"index":0,"delta":{"reasoning_content":' + escaped(p) + b"}}]}",
        lambda _: b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}',
    ),
    "openai-arguments": (
        lambda p: (
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
            b'{"arguments":' + escaped(p) + b"}}]}}]}"
        ),
        lambda _: b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
    ),
    "anthropic-thinking": (
        lambda p: (
            b'{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta",'
            b'"thinking":' + escaped(p) + b"}}"
        ),
        lambda _: b'{"type":"content_block_stop","index":0}',
    ),
    "anthropic-input": (
        lambda p: (
            b'{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta",'
            b'"partial_json":' + escaped(p) + b"}}"
        ),
        lambda _: b'{"type":"content_block_stop","index":0}',
    ),
}
"""A reasoning's or a tool call's arguments streamed in deltas, and the event ending them."""


def kind_texts(out: list[Any]) -> list[str]:
    """The reasoning or arguments text of each event a reader gave."""
    found: list[str] = []
    for item in out:
        if "choices" in item:
            delta = item["choices"][0]["delta"]
            text = delta.get("reasoning_content")
            calls = delta.get("tool_calls")
            text = calls[0]["function"]["arguments"] if calls else text
        else:
            delta = item.get("delta") or {}
            text = delta.get("thinking", delta.get("partial_json"))
        if text:
            found.append(text)
    return found


@pytest.mark.parametrize("kind", list(KIND_EVENTS))
@given(
    text=st.text(st.characters(codec="utf-8"), max_size=30),
    cuts=st.lists(st.integers(0, 10**6)),
    reads=st.lists(st.integers(0, 10**6)),
)
def test_any_reasoning_or_arguments_cut_anywhere_stream_as_their_own_characters(
    kind, text, cuts, reads
):
    """The same for a reasoning's deltas and a tool call's argument deltas (OpenAI's
    and Anthropic's readers): each piece whole characters, together the text."""
    delta, end = KIND_EVENTS[kind]
    units = utf16_halves(text)
    points = sorted({c % (len(units) + 1) for c in cuts} | {0, len(units)})
    name = "content_block_delta" if kind.startswith("anthropic") else None
    events = [(name, delta(units[a:b])) for a, b in itertools.pairwise(points)]
    events.append(("content_block_stop" if name else None, end(b"")))
    bounds = sorted({c % (len(events) + 1) for c in reads} | {0, len(events)})
    reader = READERS[kind.partition("-")[0]][0]()
    out: list[Any] = []
    for a, b in itertools.pairwise(bounds):
        failure = reader.events(events[a:b], out)
        assert (failure[0] if type(failure) is tuple else failure) is None
    got = kind_texts(out)
    for piece in got:
        piece.encode()
    assert "".join(got) == text


def gemini_texts(pieces: list[str], reads: list[int]) -> list[str]:
    chunks = [{"candidates": [{"content": {"parts": [{"text": p}]}}]} for p in pieces]
    chunks.append({"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP"}]})
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    found: list[str] = []

    async def main() -> None:
        async for chunk in gemini_wire._chunks_of(None, Body(body, reads)):
            found.extend(p["text"] for p in chunk["candidates"][0]["content"]["parts"])

    trio.run(main)
    return [t for t in found if t]


def responses_texts(pieces: list[str], reads: list[int]) -> list[str]:
    event = {"type": "response.output_text.delta", "item_id": "m", "output_index": 0}
    events = [{**event, "content_index": 0, "delta": p} for p in pieces]
    events.append({"type": "response.output_text.done", "item_id": "m", "output_index": 0})
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    found: list[str] = []

    async def main() -> None:
        async for e in openai_responses.sdk_events(sdk_stream(body, reads)):
            if e["type"] == "response.output_text.delta" and e["delta"]:
                found.append(e["delta"])

    trio.run(main)
    return found


@pytest.mark.parametrize("texts_of", [gemini_texts, responses_texts])
@given(
    text=st.text(st.characters(codec="utf-8"), max_size=30),
    cuts=st.lists(st.integers(0, 10**6)),
    reads=st.lists(st.integers(0, 10**6)),
)
def test_any_text_cut_anywhere_streams_as_its_own_characters_from_a_body(
    texts_of, text, cuts, reads
):
    """The same for Gemini's and the Responses API's readers, their bodies read in
    network reads cut at any byte."""
    units = utf16_halves(text)
    points = sorted({c % (len(units) + 1) for c in cuts} | {0, len(units)})
    got = texts_of([units[a:b] for a, b in itertools.pairwise(points)], reads)
    for piece in got:
        piece.encode()
    assert "".join(got) == text


# -- the normal path: the same work as before -------------------------------------------------

HOLD_CODE = {
    "hold_half",
    "loads_refused",
    "refuse_held",
    "_ChunkReader.refused",
    "_EventReader.refused",
}
"""The slow path's functions (those that read or hold a half)."""


def opcodes(run: Callable[[], Any]) -> tuple[int, set[Any]]:
    """The Python opcodes ``run`` executes in the frames of Axon's providers and of
    ``json`` (not Trio's: its scheduler's count varies from run to run) and the
    functions it runs there."""
    count, codes = 0, set()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        code = frame.f_code
        if "/actors/providers/" not in code.co_filename and "/json/" not in code.co_filename:
            return None
        frame.f_trace_opcodes = True
        if event == "call":
            codes.add(code.co_qualname)
        elif event == "opcode":
            count += 1
        return tracer

    sys.settrace(tracer)
    try:
        run()
    finally:
        sys.settrace(None)
    return count, codes


TEXT = "w é😀"
"""A delta with an emoji, escaped as its two halves side by side (``json.dumps``)."""


def openai_run(k: int) -> Callable[[], Any]:
    events = openai_events([f"{TEXT}{i}" for i in range(k)])[:-1]
    return lambda: openai._ChunkReader(None, False).events(events, [])


def anthropic_run(k: int) -> Callable[[], Any]:
    events = anthropic_events([f"{TEXT}{i}" for i in range(k)])[:-1]
    return lambda: anthropic._EventReader(SimpleNamespace(response=None), False).events(events, [])


class Body:
    """An HTTP response's body, read in reads cut at ``cuts`` (offsets, any)."""

    def __init__(self, body: bytes, cuts: Sequence[int] = ()) -> None:
        self.body = body
        self.cuts = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})

    async def aiter_bytes(self) -> Any:
        for a, b in itertools.pairwise(self.cuts):
            yield self.body[a:b]


def sdk_stream(body: bytes, cuts: Sequence[int] = ()) -> Any:
    """An SDK ``AsyncStream`` of the Responses API as :func:`sdk_events` reads it, its
    events built as the plain dicts they are."""
    from openai._streaming import SSEDecoder

    built = SimpleNamespace(_process_response_data=lambda data, cast_to, response: data)
    return SimpleNamespace(
        _decoder=SSEDecoder(),
        response=Body(body, cuts),
        _cast_to=object,
        _options=None,
        _client=built,
    )


def gemini_run(k: int) -> Callable[[], Any]:
    chunks = [{"candidates": [{"content": {"parts": [{"text": f"{TEXT}{i}"}]}}]} for i in range(k)]
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)

    async def main() -> None:
        async for _ in gemini_wire._chunks_of(None, Body(body)):
            pass

    return lambda: trio.run(main)


def responses_run(k: int) -> Callable[[], Any]:
    event = {"type": "response.output_text.delta", "item_id": "m", "output_index": 0}
    body = b"".join(
        b"event: response.output_text.delta\ndata: "
        + json.dumps({**event, "content_index": 0, "delta": f"{TEXT}{i}"}).encode()
        + b"\n\n"
        for i in range(k)
    )
    stream = sdk_stream(body)

    async def main() -> None:
        async for _ in openai_responses.sdk_events(stream):
            pass

    return lambda: trio.run(main)


NORMAL = {
    "openai": (openai_run, 58),
    "anthropic": (anthropic_run, 57),
    "gemini": (gemini_run, 161),
    "responses": (responses_run, 207),
}
"""Each reader's normal path and the Python opcodes a text delta cost it before this
branch (main at ec9f0391, counted by :func:`opcodes` as here)."""


@pytest.mark.parametrize("name", list(NORMAL))
def test_a_delta_read_on_the_normal_path_costs_no_more_than_before(name):
    """A text delta orjson reads (an emoji's halves side by side in one delta
    included) never reaches the code that holds a half, and costs the reader no more
    Python opcodes than before: no check a delta was added. (OpenAI and Anthropic: the
    same 58 and 57; Gemini 153 and the Responses reader 65, their chunks now read by
    orjson first, ``json.loads`` only for what orjson refuses.)"""
    run, before = NORMAL[name]
    run(2)()  # (imports, caches)
    small, _ = opcodes(run(20))
    large, codes = opcodes(run(120))
    assert not codes & HOLD_CODE
    assert (large - small) / 100 <= before


# -- empty texts between and beside the halves (branch smallleft) ------------------------------

EMOJI_TEXT = st.text(st.sampled_from(["a", "é", "😀", "🎉", "\u200d"]), max_size=6)
"""A short text of emoji (each a surrogate pair to cut) and other characters."""


def with_empties(
    text: str, cuts: list[int], empties: list[int], groups: list[int]
) -> list[list[str]]:
    """``text`` cut into UTF-16 pieces at ``cuts``, empty pieces put in at ``empties``,
    and the pieces gathered into events of several texts at ``groups`` (a Gemini chunk's
    parts, an OpenAI chunk's argument deltas of one call), one that says something an
    event."""
    units = utf16_halves(text)
    points = sorted({c % (len(units) + 1) for c in cuts} | {0, len(units)})
    pieces = [units[a:b] for a, b in itertools.pairwise(points)]
    for at in empties:
        pieces.insert(at % (len(pieces) + 1), "")
    bounds = sorted({g % (len(pieces) + 1) for g in groups} | {0, len(pieces)})
    events = [pieces[a:b] for a, b in itertools.pairwise(bounds)]
    # (one text that says something an event: halves in two texts of one event are no
    # wire's, and are left: journal, ### smallleft)
    return [e for event in events for e in split_said(event)]


def split_said(event: list[str]) -> list[list[str]]:
    """``event`` cut so each part holds one non-empty text at most, its empty texts
    kept beside it."""
    out: list[list[str]] = [[]]
    for piece in event:
        if piece and any(out[-1]):
            out.append([])
        out[-1].append(piece)
    return out


def single(events: list[list[str]]) -> list[str]:
    return [piece for event in events for piece in event]


def grouped_gemini_texts(events: list[list[str]]) -> list[str]:
    chunks = [{"candidates": [{"content": {"parts": [{"text": p} for p in e]}}]} for e in events]
    chunks.append({"candidates": [{"content": {"parts": [{"text": "!"}]}, "finishReason": "STOP"}]})
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    found: list[str] = []

    async def main() -> None:
        async for chunk in gemini_wire._chunks_of(None, Body(body)):
            found.extend(p["text"] for p in chunk["candidates"][0]["content"]["parts"])

    trio.run(main)
    return found[:-1]


def grouped_openai_texts(events: list[list[str]]) -> list[str]:
    """An OpenAI call's arguments, each event a chunk of as many argument deltas."""
    head, tail = b'{"choices":[{"index":0,"delta":{"tool_calls":[', b"]}}]}"
    call = b'{"index":0,"function":{"arguments":%s}}'
    data = [head + b",".join(call % escaped(p) for p in e) + tail for e in events]
    end = b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}'
    reader, out = openai._ChunkReader(None, True), []
    for event in [*data, end]:
        failure = reader.events([(None, event)], out)
        assert (failure[0] if type(failure) is tuple else failure) is None
    found: list[str] = []
    for item in out:
        for c in item["choices"][0]["delta"].get("tool_calls") or ():
            found.append(c["function"]["arguments"])
    return found


def one_reader(name: str) -> Callable[[list[list[str]]], list[str]]:
    """OpenAI's (content) or Anthropic's reader, one text a delta."""

    def texts_of(events: list[list[str]]) -> list[str]:
        make, events_of, found = READERS[name]
        reader, out = make(), []
        for event in events_of(single(events)):
            failure = reader.events([event], out)
            assert (failure[0] if type(failure) is tuple else failure) is None
        return found(out)

    return texts_of


READ_WITH_EMPTIES: dict[str, Callable[[list[list[str]]], list[str]]] = {
    "openai": one_reader("openai"),
    "openai-arguments": grouped_openai_texts,
    "anthropic": one_reader("anthropic"),
    "gemini": grouped_gemini_texts,
    "responses": lambda events: responses_texts(single(events), []),
}


@pytest.mark.parametrize("name", list(READ_WITH_EMPTIES))
@given(
    text=EMOJI_TEXT,
    cuts=st.lists(st.integers(0, 10**6), max_size=8),
    empties=st.lists(st.integers(0, 10**6), max_size=4),
    groups=st.lists(st.integers(0, 10**6), max_size=4),
)
def test_an_emoji_cut_anywhere_with_empty_texts_between_streams_as_it_is_saved(
    name, text, cuts, empties, groups
):
    """Emoji cut between their halves anywhere, empty texts anywhere among the pieces
    (before, between, after a held half), several texts of one part in one event where
    the wire has that (a Gemini chunk's parts, an OpenAI chunk's argument deltas of one
    call): each text a reader gives is whole characters, and together they are the text
    (the saved one). Before: an empty part first or last in a Gemini chunk, or an empty
    argument delta first in an OpenAI chunk, sent a half alone (U+FFFD live, the emoji
    saved)."""
    got = READ_WITH_EMPTIES[name](with_empties(text, cuts, empties, groups))
    for piece in got:
        piece.encode()
    assert "".join(got) == text


@pytest.mark.parametrize(
    "chunks",
    [
        [["a\ud83d"], ["", "\ude00b"]],
        [["a\ud83d"], ["", "\ude00\ud83d"], ["\ude00"]],
        [["a\ud83d", ""], ["\ude00"]],
        [["a\ud83d"], ["", "", "\ude00"]],
    ],
    ids=["empty-first", "empty-first-then-half", "empty-last", "two-empty-first"],
)
async def test_a_gemini_chunks_empty_parts_beside_a_held_half_leave_the_emoji_whole(
    chunks, autojump_clock
):
    """Gemini chunks whose empty text parts stand first or last beside an emoji's
    halves. Before: the half went out alone (``UnicodeEncodeError`` here: U+FFFD on every
    live stream) while the session saved the emoji."""
    async with attack_rig("gemini", retry=ONCE) as r:
        parts = [gemini_chunk([{"text": p} for p in chunk]) for chunk in chunks]
        body = gemini_sse(*parts, gemini_chunk([{"text": "!"}], "STOP"))
        got, result = await turn(r, Reply(body=body))
        assert result.error is None
        whole = "".join(p for chunk in chunks for p in chunk) + "!"
        assert live(got) == texts(r.session.messages[1]) == utf8_text(whole)
        assert "\ufffd" not in whole or "\ufffd" in live(got)


async def test_an_openai_chunks_empty_argument_delta_before_the_other_half_leaves_it_whole(
    autojump_clock,
):
    """A chunk with two argument deltas of one call, ``""`` then the emoji's other half.
    Before: the half was kept for the empty one and the other went out alone (U+FFFD
    twice live), the tool given the emoji."""
    given: list[str] = []

    async def echo(q: str) -> str:
        """Say ``q`` back."""
        given.append(q)
        return q

    def args(*pieces: str) -> dict[str, Any]:
        return {"tool_calls": [{"index": 0, "function": {"arguments": p}} for p in pieces]}

    head = {"index": 0, "id": "c1", "type": "function", "function": {"name": "echo"}}
    body = sse(
        oa_chunk({"role": "assistant", "content": None, "tool_calls": [head]}),
        oa_chunk(args('{"q": "a\ud83d')),
        oa_chunk(args("", '\ude00b"}')),
        oa_chunk({}, "tool_calls"),
        oa_usage(),
    )
    async with attack_rig("openai", retry=ONCE, tools=[echo]) as r:
        chunks, result = await turn(r, Reply(body=body), Reply(body=r.answer("ok")))
        assert result.error is None
        deltas = [c.delta for c in chunks if c.type == "tool-input-delta"]
        for text in deltas:
            text.encode()
        stored = next(p for p in r.session.messages[1].content if p.type == "tool-call")
        assert json.loads("".join(deltas)) == stored.input == {"q": "a😀b"}
        assert given == ["a😀b"]
