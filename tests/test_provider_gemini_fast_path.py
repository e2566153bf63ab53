"""Gemini's stream read from its bytes gives what the SDK's types gave, chunk for chunk.

The provider reads ``streamGenerateContent`` from the response bytes
(:mod:`actors.providers.gemini_wire`); before, it read the SDK's pydantic
``GenerateContentResponse`` s (:mod:`tests.support.gemini_reference`, the old parser,
kept as the oracle). Here generated streams (text, thoughts, signatures, calls with and
without ids, empty signed parts, code and images, usage, finish reasons, blocked
prompts, error objects, cut bodies; CRLF or LF; any read boundaries) go through the
real SDK client with only its socket replaced: once through the SDK's
``generate_content_stream`` and the old parser, once through the fast path, once through
the fallback (the SDK's types turned into dicts). All three must emit the same chunks
and fail with the same error class.

Each way's streams are closed as the provider closes them. The fast path then leaves no
async generator to the garbage collector (Trio's ``ResourceWarning``, an error under
``-W error``); the SDK's own generators do when a stream stops before its end or with
an error object (``google.genai._api_client`` iterates its inner generators without
closing them): recorded for the two ways through the SDK, and only theirs allowed.
"""

from __future__ import annotations

import base64
import json
from contextlib import aclosing
from typing import Any

import httpx
import trio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from actors.providers.gemini import GENERATED_ID, parse_stream
from actors.providers.gemini_wire import open_stream, sdk_chunks, wire_chunks, wire_request
from runtime.chunks import ToolCallChunk, ToolInputDeltaChunk, ToolInputStartChunk
from tests.support import gemini_reference
from tests.support.leaks import abandoned_generators

MODEL = "gemini-2.5-flash"
PARAMS = {
    "model": MODEL,
    "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
    "config": {"automatic_function_calling": {"disable": True}},
}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


signatures = st.binary(min_size=1, max_size=24).map(_b64)
words = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | words,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def parts(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["text", "thought", "call", "empty", "code", "image"]))
    part: dict[str, Any]
    if kind == "text":
        part = {"text": draw(words)}
    elif kind == "thought":
        part = {"text": draw(words), "thought": True}
    elif kind == "call":
        call: dict[str, Any] = {"name": draw(st.sampled_from(["get_weather", "final_output"]))}
        call["args"] = draw(st.dictionaries(words, json_values, max_size=3))
        if draw(st.booleans()):
            call["id"] = draw(st.sampled_from(["call-1", "call-2"]))
        part = {"functionCall": call}
    elif kind == "empty":
        part = {"text": ""}
    elif kind == "code":
        part = {"executableCode": {"language": "PYTHON", "code": draw(words)}}
    else:
        data = _b64(draw(st.binary(max_size=12)))
        part = {"inlineData": {"mimeType": "image/png", "data": data}}
    if kind != "code" and draw(st.booleans()):
        part["thoughtSignature"] = draw(signatures)
    return part


FINISHES = [None, None, "STOP", "MAX_TOKENS", "SAFETY", "MALFORMED_FUNCTION_CALL", "OTHER"]
counts = st.none() | st.integers(0, 10_000)


@st.composite
def chunks(draw: Any) -> dict[str, Any]:
    chunk: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        candidate: dict[str, Any] = {"index": 0}
        if draw(st.integers(0, 5)):
            candidate["content"] = {"role": "model", "parts": draw(st.lists(parts(), max_size=3))}
        finish = draw(st.sampled_from(FINISHES))
        if finish is not None:
            candidate["finishReason"] = finish
        chunk["candidates"] = [candidate]
    elif draw(st.booleans()):
        chunk["promptFeedback"] = {"blockReason": "PROHIBITED_CONTENT"}
    if draw(st.booleans()):
        usage = {
            "promptTokenCount": draw(counts),
            "candidatesTokenCount": draw(counts),
            "thoughtsTokenCount": draw(counts),
            "toolUsePromptTokenCount": draw(counts),
            "cachedContentTokenCount": draw(counts),
            "totalTokenCount": draw(counts),
        }
        chunk["usageMetadata"] = {k: v for k, v in usage.items() if v is not None}
    chunk["modelVersion"] = MODEL
    return chunk


ERROR = {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}


@st.composite
def bodies(draw: Any) -> list[bytes]:
    """An SSE body as the API writes it, cut into the reads the client gets."""
    stream = draw(st.lists(chunks(), min_size=1, max_size=6))
    if draw(st.integers(0, 5)) == 0:
        stream.append(ERROR)
    end = draw(st.sampled_from(["\r\n", "\n"]))
    text = "".join(f"data: {json.dumps(c, ensure_ascii=False)}{end}{end}" for c in stream)
    body = text.encode("utf-8")
    if draw(st.integers(0, 7)) == 0:
        body = body[: draw(st.integers(0, len(body)))]  # cut short
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=6)))
    return [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]


class _Body(httpx.AsyncByteStream):
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    async def __aiter__(self) -> Any:
        for read in self.reads:
            yield read


def _client(*hops: list[bytes], sent: list[Any] | None = None) -> Any:
    """A real SDK client whose one socket-facing call serves ``hops`` in turn (the
    reads of each request's body; the last again once they run out), keeping each
    request's body in ``sent``."""
    from google import genai
    from google.genai._api_client import HttpResponse

    client = genai.Client(api_key="test")
    api = client.aio.models._api_client
    served = iter(range(10**6))

    async def serve(*, http_request: Any, http_options: Any = None, stream: bool = False) -> Any:
        if sent is not None:
            sent.append(http_request.data)
        reads = hops[min(next(served), len(hops) - 1)]
        raw = httpx.Response(
            200, stream=_Body(reads), headers={"content-type": "text/event-stream"}
        )
        return HttpResponse(raw.headers, raw)

    api._async_request = serve
    return client


async def _run(parse: Any, source: Any) -> tuple[list[Any], type | None]:
    out: list[Any] = []

    async def emit(chunk: Any) -> None:
        out.append(chunk)

    try:
        await parse(source, emit, answer_tool=None)
    except Exception as exc:
        return _same_ids(out), type(exc)
    return _same_ids(out), None


def _same_ids(chunks: list[Any]) -> list[Any]:
    """Generated call ids (random) renamed in order, so two runs compare."""
    names: dict[str, str] = {}
    out = []
    for c in chunks:
        if isinstance(c, ToolInputStartChunk | ToolInputDeltaChunk | ToolCallChunk):
            if c.tool_call_id.startswith(GENERATED_ID + "_"):
                new = names.setdefault(c.tool_call_id, f"gen-{len(names)}")
                c = type(c)(**{**_fields(c), "tool_call_id": new})
        out.append(c)
    return out


def _fields(chunk: Any) -> dict[str, Any]:
    import attrs

    return {a.name: getattr(chunk, a.name) for a in attrs.fields(type(chunk)) if a.init}


SDK_SIDE = ("google.genai.", "httpx.", f"{__name__}._Body")
"""The generators a stream read through the SDK's types may leave open: the SDK's, and
those of the HTTP response below them (the test's body among them)."""


async def _three_ways(*hops: list[bytes]) -> list[tuple[list[Any], type | None]]:
    with abandoned_generators(1) as left_by_sdk:
        client = _client(*hops)
        sdk_stream = await client.aio.models.generate_content_stream(**PARAMS)
        async with aclosing(sdk_stream):
            oracle = await _run(gemini_reference.parse_stream, sdk_stream)
    wire = wire_request(_client(*hops), PARAMS)
    assert wire is not None

    async def heard(_: Any) -> None:
        return None

    with abandoned_generators(1) as left_by_fast_path:
        async with aclosing(wire_chunks(wire, open_stream, heard)) as chunks:
            fast = await _run(parse_stream, chunks)
    assert left_by_fast_path == []
    with abandoned_generators(1) as left_by_fallback:
        client = _client(*hops)
        fallback_stream = await client.aio.models.generate_content_stream(**PARAMS)
        async with aclosing(fallback_stream), aclosing(sdk_chunks(fallback_stream)) as chunks:
            fallback = await _run(parse_stream, chunks)
    for name in left_by_sdk + left_by_fallback:
        assert name.startswith(SDK_SIDE), name
    return [oracle, fast, fallback]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bodies())
# What follows the answer (its finishReason and usage, or a blocked prompt) is still read
# when the body ends (branch provmend: the reader stops only at a body kept open).
@example(
    [
        b'data: {"candidates": [{"index": 0, "finishReason": "STOP"}], "usageMetadata": {}}'
        b'\r\n\r\ndata: {"error": {"code": 503, "message": "overloaded", "status": "X"}}'
        b"\r\n\r\n"
    ]
)
@example([b'data: {"promptFeedback": {"blockReason": "OTHER"}}\r\n\r\nd'])
def test_the_fast_path_emits_what_the_sdks_types_gave(reads: list[bytes]) -> None:
    oracle, fast, fallback = trio.run(_three_ways, reads)
    assert fast == oracle
    assert fallback == oracle


def test_a_body_of_text_deltas_is_read_without_the_sdks_types() -> None:
    """The fast path is the one taken: no ``GenerateContentResponse`` is built."""
    from google.genai import types

    body = "".join(
        f"data: {json.dumps({'candidates': [{'content': {'parts': [{'text': w}]}}]})}\r\n\r\n"
        for w in ("a", "b")
    )
    body += 'data: {"candidates": [{"finishReason": "STOP"}]}\r\n\r\n'
    built: list[Any] = []
    original = types.GenerateContentResponse._from_response

    def spy(**kw: Any) -> Any:
        built.append(kw)
        return original(**kw)

    types.GenerateContentResponse._from_response = spy  # type: ignore[method-assign]
    try:
        client = _client([body.encode()])
        wire = wire_request(client, PARAMS)
        assert wire is not None

        async def heard(_: Any) -> None:
            return None

        chunks, error = trio.run(_run, parse_stream, wire_chunks(wire, open_stream, heard))
    finally:
        types.GenerateContentResponse._from_response = original  # type: ignore[method-assign]
    assert error is None and [getattr(c, "text", None) for c in chunks[:2]] == ["a", "b"]
    assert built == []


def _sse(*chunks: dict[str, Any]) -> list[bytes]:
    return [b"".join(f"data: {json.dumps(c)}\r\n\r\n".encode() for c in chunks)]


def test_a_continuation_hop_is_followed_as_the_sdk_follows_it() -> None:
    """``finishReason: CONTINUATION`` with a token: the next request resumes from it,
    the usage adds up, the intermediate finish reason is not the turn's."""
    token = base64.b64encode(b"resume-here").decode()
    first = _sse(
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Part one. "}]}}]},
        {
            "candidates": [{"finishReason": "CONTINUATION", "continuationToken": token}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5},
        },
    )
    second = _sse(
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Part two."}]}}]},
        {
            "candidates": [{"finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4},
        },
    )
    oracle, fast, fallback = trio.run(_three_ways, first, second)
    assert fast == oracle == fallback
    chunks, error = fast
    assert error is None
    assert [getattr(c, "text", None) for c in chunks[:2]] == ["Part one. ", "Part two."]
    assert chunks[-2].usage.input_tokens == 13 and chunks[-2].usage.output_tokens == 9
    assert chunks[-1].reason == "stop"
    sent: list[Any] = []
    client = _client(first, second, sent=sent)
    wire = wire_request(client, PARAMS)
    assert wire is not None

    async def heard(_: Any) -> None:
        return None

    async def fast_path() -> None:
        async with aclosing(wire_chunks(wire, open_stream, heard)) as chunks:
            await _run(parse_stream, chunks)

    trio.run(fast_path)
    bodies = [b if isinstance(b, dict) else json.loads(b) for b in sent]
    assert "continuationToken" not in bodies[0]
    assert base64.urlsafe_b64decode(bodies[1]["continuationToken"] + "==") == b"resume-here"
