"""The providers attacked by a hostile or broken server, as a user sees it.

Every provider (OpenAI Chat Completions, which also serves the OpenAI-compatible
servers, OpenAI Responses, Anthropic, Gemini) runs a whole turn through the Host, over
its real SDK client with a dummy key, against the loopback server
(:mod:`tests.support.loopback`), which cuts, stalls, garbles or lies. For each attack:
what the user sees (the result's finish reason and typed error), what is saved (the
session's and the store's messages: nothing half-written, what was streamed kept) and
that the next turn of the same session still works (its history replays into the next
request). Time runs on the autojump clock.

What :mod:`tests.test_resilience_faults` and :mod:`tests.test_resilience_cancel` pin for
OpenAI and Anthropic (a 429/5xx retried, a drop mid-text, a stall, garbage) is not
repeated here; this adds the other two providers, the attacks those files do not make,
and a regression test for each defect found (branch ``provatk``, journal
``benchmarks/journal/pipeline.md``).
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.providers import failures, gemini_wire
from actors.providers import sse as sse_decoding
from runtime import RetryPolicy, tool
from runtime import events as ev
from runtime.logging import configure_logging
from runtime.messages import TextPart, ToolCallPart, ToolMessage
from runtime.serde import to_json
from tests.support.attacks import (
    KEY,
    KINDS,
    AttackRig,
    attack_rig,
    gemini_chunk,
    gemini_sse,
    responses_call,
    responses_message,
)
from tests.support.faults import (
    a_body,
    a_end,
    a_start,
    a_text,
    a_tool_use,
    consume,
    drain,
    oa_chunk,
    oa_usage,
)
from tests.support.loopback import Reply, loopback_server, responses_sse, sse

ONCE = RetryPolicy(max_attempts=1)
"""No retry: each attack's first answer is what the user gets."""


async def turn(r: AttackRig, *replies: Reply, text: str = "hi") -> tuple[list[Any], Any]:
    """One streamed turn served ``replies``: its chunks and its result."""
    r.server.add(*replies)
    with trio.fail_after(600):
        async with r.session.stream(text) as out:
            chunks = await consume(out)
    r.server.replies.clear()
    return chunks, out.result


def texts(message: Any) -> str:
    return "".join(p.text for p in message.content if isinstance(p, TextPart))


async def check_saved(r: AttackRig, *, text: str, failed: bool) -> None:
    """The session and the store hold the user message and one assistant message with
    exactly ``text``, marked failed (or not)."""
    stored = (await r.host.store.load("s")).messages
    for messages in (r.session.messages, stored):
        assert [m.role for m in messages] == ["user", "assistant"], messages
        assert texts(messages[1]) == text
        assert messages[1].failed is failed
        assert not messages[1].interrupted


def head(kind: str, body: bytes, marker: bytes = b"Hel") -> bytes:
    """``body`` up to the end of the event holding ``marker`` (the first text delta)."""
    sep = b"\r\n\r\n" if kind == "gemini" else b"\n\n"
    return body[: body.index(sep, body.index(marker)) + len(sep)]


def raw_utf8(body: bytes) -> bytes:
    """``body`` with the JSON escapes of the non-ASCII letters used here as raw UTF-8, as
    the real APIs send them."""
    for c in "éö€":
        body = body.replace(json.dumps(c)[1:-1].encode(), c.encode())
    return body


def error_frame(kind: str, message: str) -> bytes:
    """An error inside a 200 stream, as each API sends it."""
    if kind == "openai":
        event = {"error": {"message": message, "type": "server_error", "code": None}}
        return b"data: " + json.dumps(event).encode() + b"\n\n"
    if kind == "responses":
        event = {"type": "error", "code": "server_error", "message": message, "param": None}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    if kind == "anthropic":
        event = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    event = {"error": {"code": 500, "message": message, "status": "INTERNAL"}}
    return b"data: " + json.dumps(event).encode() + b"\r\n\r\n"


def http_error(kind: str, status: int, message: str, headers=()) -> Reply:
    """An HTTP error with each API's JSON error body."""
    if kind == "gemini":
        body: dict[str, Any] = {"error": {"code": status, "message": message, "status": "X"}}
    elif kind == "anthropic":
        word = "invalid_request_error" if status < 500 else "api_error"
        body = {"type": "error", "error": {"type": word, "message": message}}
    else:
        body = {"error": {"message": message, "type": None, "code": None, "param": None}}
    return Reply(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=list(headers),
    )


# -- cut, ended, garbled -----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cut_inside_a_utf8_character_keeps_the_whole_characters_before_it(
    kind, autojump_clock
):
    async with attack_rig(kind, retry=ONCE) as r:
        body = raw_utf8(r.answer("héllo wörld ", "€€ and more"))
        cut = body.index("€".encode()) + 1  # one byte of the three of a euro sign
        _, result = await turn(r, Reply(body=body, drop_after=cut))
        assert result.finish_reason == "error"
        assert result.error.kind == "ConnectionLost" and result.error.retryable
        await check_saved(r, text="héllo wörld ", failed=True)
        sent = await r.next_turn()
    assert "héllo wörld" in json.dumps(sent, ensure_ascii=False)  # the kept text replays


@pytest.mark.parametrize("kind", KINDS)
async def test_a_body_that_ends_before_its_last_event_is_malformed_and_keeps_the_text(
    kind, autojump_clock
):
    """A clean end of the body after the text but before ``[DONE]`` / ``message_stop``
    / ``response.completed`` / the ``finishReason`` chunk: cut short, said so."""
    async with attack_rig(kind, retry=ONCE) as r:
        body = head(kind, r.answer("Hel", "lo"))
        _, result = await turn(r, Reply(body=body))
        assert result.finish_reason == "error"
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        assert "cut" in result.error.message
        await check_saved(r, text="Hel", failed=True)
        await r.next_turn()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(body=b"<html><body>502 Bad Gateway</body></html>\n"), id="html"),
        pytest.param(
            Reply(
                body=b'{"id":"x","choices":[{"message":{"content":"whole"}}]}',
                content_type="application/json",
            ),
            id="json",
        ),
        pytest.param(Reply(body=b""), id="empty"),
    ],
)
async def test_a_200_that_is_no_event_stream_is_malformed_and_saves_nothing(
    kind, reply, autojump_clock
):
    """OpenAI and Anthropic said the stream was cut (no ``[DONE]``, no
    ``message_stop``): now that it holds no events, with its content type and first
    bytes. Gemini quotes the undecodable data or says no ``finishReason`` came;
    Responses said it was cut until it read its body with our decoder (branch
    ``leftovers``)."""
    async with attack_rig(kind, retry=ONCE) as r:
        _, result = await turn(r, reply)
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        if kind in ("openai", "responses", "anthropic"):
            assert "holds no server-sent events" in result.error.message
            assert reply.content_type in result.error.message
            said = f"begins {reply.body[:20]!r}"[:-1] if reply.body else "it is empty"
            assert said in result.error.message
        await check_saved(r, text="", failed=True)
        await r.next_turn()


@pytest.mark.parametrize("kind", KINDS)
async def test_cr_only_line_ends_in_small_writes_read_as_the_answer(kind, autojump_clock):
    async with attack_rig(kind, retry=ONCE) as r:
        body = r.answer("Hel", "lo").replace(b"\r\n", b"\n").replace(b"\n", b"\r")
        _, result = await turn(r, Reply(body=body, write_size=7))
        assert (result.finish_reason, result.text) == ("stop", "Hello")
        await check_saved(r, text="Hello", failed=False)


@pytest.mark.parametrize("kind", KINDS)
async def test_comment_lines_before_and_between_events_are_skipped(kind, autojump_clock):
    """``: keep-alive`` comments (a proxy's) are SSE; for Gemini they failed the stream
    (read as raw JSON, as its SDK reads them): fixed."""
    async with attack_rig(kind, retry=ONCE) as r:
        body = r.answer("Hel", "lo")
        sep = b"\r\n" if kind == "gemini" else b"\n"
        noise = b": keep-alive" + sep + b": ping" + sep + sep
        first = body.index(sep + sep) + 2 * len(sep)
        body = noise + body[:first] + noise + body[first:]
        _, result = await turn(r, Reply(body=body))
        assert (result.finish_reason, result.text) == ("stop", "Hello"), result.error
        await check_saved(r, text="Hello", failed=False)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_block_of_a_retry_field_alone_is_skipped(kind, autojump_clock):
    """``retry: 3000`` and a blank line, before the events: a block with no data. The
    OpenAI SDK's decoder makes it an event with empty data and fails parsing it (and so
    did the provider, which decodes as the SDK does): fixed; Gemini skipped it as a
    field (fixed with the comments); Responses, read through the SDK's stream, failed
    it too until it read its body with our decoder (branch ``leftovers``)."""
    async with attack_rig(kind, retry=ONCE) as r:
        sep = b"\r\n" if kind == "gemini" else b"\n"
        body = b"retry: 3000" + sep + sep + r.answer("Hel", "lo")
        _, result = await turn(r, Reply(body=body))
        assert (result.finish_reason, result.text) == ("stop", "Hello"), result.error
        await check_saved(r, text="Hello", failed=False)


@pytest.mark.parametrize("kind", ["openai", "responses", "anthropic"])
async def test_invalid_utf8_inside_an_event_is_malformed_and_keeps_what_came_before(
    kind, autojump_clock
):
    async with attack_rig(kind, retry=ONCE) as r:
        body = r.answer("Hel", "lo!").replace(b"lo!", b"l\xff\xfeo")
        _, result = await turn(r, Reply(body=body))
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        await check_saved(r, text="Hel", failed=True)
        await r.next_turn()


async def test_gemini_reads_invalid_utf8_as_replacement_characters_as_its_sdk_does(
    autojump_clock,
):
    async with attack_rig("gemini", retry=ONCE) as r:
        body = r.answer("Hel", "lo!").replace(b"lo!", b"l\xffo")
        _, result = await turn(r, Reply(body=body))
        assert (result.finish_reason, result.text) == ("stop", "Hell\ufffdo")


# -- one endless line ----------------------------------------------------------------------


@pytest.fixture
def small_events(monkeypatch):
    """The longest line or event the decoders read, lowered to 1 MiB for the test."""
    limit = 1 << 20
    monkeypatch.setattr(sse_decoding, "MAX_EVENT_BYTES", limit, raising=False)
    monkeypatch.setattr(gemini_wire, "MAX_EVENT_BYTES", limit, raising=False)
    return limit


@pytest.mark.parametrize("shape", ["one-line", "data-lines"])
@pytest.mark.parametrize("kind", KINDS)
async def test_an_endless_line_or_event_is_a_clear_error_not_unbounded_memory(
    kind, shape, small_events, autojump_clock
):
    """A server that sends text, then one line (or one event of data lines) with no end:
    the provider stops reading at the limit with a MalformedStream naming it; the text
    before is kept. (Before: the buffer grew without bound, re-joined with every read,
    16 MiB costing 5 s of CPU; Responses, read through the SDK's own decoder, which has
    no limit, grew it until it read its body with ours, branch ``leftovers``.)"""
    async with attack_rig(kind, retry=ONCE) as r:
        prefix = head(kind, r.answer("Hel", "lo"))
        if shape == "one-line":
            flood = b"data: " + b"x" * (2 * small_events)
        else:
            flood = b"data: " + b"y" * 1000 + b"\n"
            flood *= 2 * small_events // len(flood)
        _, result = await turn(r, Reply(body=prefix + flood, write_size=65536))
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        assert f"more than {small_events} bytes" in result.error.message
        await check_saved(r, text="Hel", failed=True)
        await r.next_turn()


@given(
    cuts=st.lists(st.integers(min_value=0, max_value=5000), max_size=12),
    line=st.integers(min_value=0, max_value=4000),
)
@settings(max_examples=60, deadline=None)
def test_reads_that_end_no_line_are_held_and_give_the_same_events(cuts, line):
    """However a body with a long line is cut into reads, the decoders give the events
    of the whole body at once; a read that ends no line completes nothing (it is held,
    not re-joined with every read)."""
    long = "z" * line
    body = (
        f'data: {{"a": "{long}"}}\n\nevent: e\ndata: 1\ndata: 2\n\n'
        f': c\ndata: {{"b": 1}}\r\n\r\ndata: {long}\r\r'
    ).encode()
    points = sorted({min(c, len(body)) for c in cuts})
    pieces = [body[i:j] for i, j in zip([0, *points], [*points, len(body)], strict=True)]
    whole = sse_decoding.SSEDecoder()
    expected = whole.feed(body) + whole.finish()
    one = gemini_wire.LineDecoder()
    chunks = one.feed(body) + one.finish()
    decoder, gemini = sse_decoding.SSEDecoder(), gemini_wire.LineDecoder()
    got: list[Any] = []
    lines: list[bytes] = []
    for piece in pieces:
        events = decoder.feed(piece)
        if b"\n" not in piece and b"\r" not in piece:
            assert events == []
        got += events
        lines += gemini.feed(piece)
    assert got + decoder.finish() == expected
    assert lines + gemini.finish() == chunks


# -- errors inside the stream, and the key ---------------------------------------------------


LEAK = f"upstream refused Authorization: Bearer {KEY} (key={KEY})"
"""An error message quoting the key, as a broken proxy might."""


def leaks(chunks: Any, result: Any, r: AttackRig, stored: Any, log: str) -> list[str]:
    outputs = {
        "chunks": to_json(chunks).decode(),
        "result": repr(result) + to_json(result.message).decode(),
        "session": to_json(list(r.session.messages)).decode(),
        "store": to_json(list(stored.messages)).decode(),
        "log": log,
    }
    return [where for where, text in outputs.items() if KEY in text]


@pytest.mark.parametrize("kind", KINDS)
async def test_an_error_event_mid_stream_quoting_the_key_is_classified_and_redacted(
    kind, autojump_clock
):
    log = io.StringIO()
    configure_logging("debug", stream=log)
    try:
        async with attack_rig(kind, retry=ONCE) as r:
            body = head(kind, r.answer("Hel", "lo")) + error_frame(kind, LEAK)
            chunks, result = await turn(r, Reply(body=body))
            assert (result.error.kind, result.error.retryable) == ("ProviderUnavailable", True)
            assert "[redacted]" in result.error.message
            await check_saved(r, text="Hel", failed=True)
            stored = await r.host.store.load("s")
            await r.next_turn()
    finally:
        configure_logging("warning")
    assert '"turn.failed"' in log.getvalue()
    assert leaks(chunks, result, r, stored, log.getvalue()) == []


@pytest.mark.parametrize(
    ("status", "content_type", "body"),
    [
        pytest.param(500, "application/json", None, id="500-json"),
        pytest.param(400, "application/json", None, id="400-json"),
        pytest.param(502, "text/html", f"<html><body>{LEAK}</body></html>", id="502-html"),
        pytest.param(503, "text/plain", LEAK, id="503-text"),
    ],
)
@pytest.mark.parametrize("kind", KINDS)
async def test_an_http_error_quoting_the_key_leaks_it_nowhere(
    kind, status, content_type, body, autojump_clock
):
    reply = http_error(kind, status, LEAK)
    if body is not None:
        reply = Reply(status=status, body=body.encode(), content_type=content_type)
    log = io.StringIO()
    configure_logging("debug", stream=log)
    try:
        async with attack_rig(kind, retry=ONCE) as r:
            chunks, result = await turn(r, reply)
            assert result.finish_reason == "error"
            assert result.error.kind == ("BadRequest" if status == 400 else "ProviderUnavailable")
            stored = await r.host.store.load("s")
            await r.next_turn()
    finally:
        configure_logging("warning")
    assert leaks(chunks, result, r, stored, log.getvalue()) == []


# -- Retry-After from a hostile server -------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "waits"),
    [
        (None, [0.5, 1.0]),  # absent: the policy's backoff
        ("1e9", [60.0, 60.0]),  # huge: capped (retry_after_cap)
        ("Wed, 21 Oct 2099 07:28:00 GMT", [60.0, 60.0]),  # a date far ahead: capped
        ("-5", [0.0, 0.0]),  # negative: no wait (pinned by test_provider_failures too)
        ("soon", [0.5, 1.0]),  # garbage: absent
        ("nan", [0.5, 1.0]),
        ("1e400", [0.5, 1.0]),  # not finite: absent
    ],
)
@pytest.mark.parametrize("kind", KINDS)
async def test_retry_after_of_any_shape_gives_a_bounded_wait(kind, header, waits, autojump_clock):
    policy = RetryPolicy(max_attempts=3, jitter=0)
    async with attack_rig(kind, retry=policy) as r:
        headers = [] if header is None else [("retry-after", header)]
        errs = [http_error(kind, 429, "slow down", headers) for _ in range(2)]
        t0 = trio.current_time()
        _, result = await turn(r, *errs, Reply(body=r.answer("ok")))
        assert (result.finish_reason, result.text) == ("stop", "ok")
        assert trio.current_time() - t0 == pytest.approx(sum(waits), abs=0.01)
        assert len(r.server.requests) == 3
        await check_saved(r, text="ok", failed=False)


@pytest.mark.parametrize("kind", ["responses", "gemini"])
async def test_cancel_during_a_long_retry_after_ends_at_once_without_retrying(kind, autojump_clock):
    async with attack_rig(kind, retry=RetryPolicy(max_attempts=3, jitter=0)) as r:
        r.server.add(http_error(kind, 503, "down", [("retry-after", "50")]))
        r.server.add(Reply(body=r.answer("never")))
        async with r.session.stream("hi") as out:
            t0 = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_after, out, 10.0)
                await consume(out)
        assert trio.current_time() - t0 == pytest.approx(10.0, abs=0.01)
        assert out.result.finish_reason == "aborted"
        assert len(r.server.requests) == 1
        r.server.replies.clear()
        await r.next_turn()


async def cancel_after(out: Any, seconds: float) -> None:
    await trio.sleep(seconds)
    out.cancel("user pressed stop")


# -- stalls --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["after-headers", "after-text"])
@pytest.mark.parametrize("kind", ["responses", "gemini"])
async def test_a_stall_times_out_and_a_cancel_while_stalled_keeps_the_text(
    kind, where, autojump_clock
):
    """Responses and Gemini (OpenAI and Anthropic: tests/test_resilience_*): a server
    that stops forever after its headers or after some text ends in a ProviderTimeout at
    the read timeout; the user's cancel while it stalls ends the turn at once, the text
    streamed kept and the message marked interrupted."""
    async with attack_rig(kind, retry=ONCE) as r:
        body = r.answer("Hel", "lo")
        at = 0 if where == "after-headers" else len(head(kind, body))
        sent = "" if at == 0 else "Hel"
        t0 = trio.current_time()
        _, result = await turn(r, Reply(body=body, stall=1e6, stall_after=at))
        assert trio.current_time() - t0 == pytest.approx(60.0, abs=0.01)  # the read timeout
        assert (result.error.kind, result.error.retryable) == ("ProviderTimeout", True)
        await check_saved(r, text=sent, failed=True)
        r.server.add(Reply(body=body, stall=1e6, stall_after=at))
        async with r.session.stream("again") as out:
            t0 = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_after, out, 5.0)
                await consume(out)
        assert trio.current_time() - t0 == pytest.approx(5.0, abs=0.01)
        assert (out.result.finish_reason, out.result.text) == ("aborted", sent)
        last = r.session.messages[-1]
        assert last.interrupted and texts(last) == sent
        r.server.replies.clear()
        await r.next_turn()


# -- what a server sends where text or a count belongs ----------------------------------------


def bad_text_body(kind: str) -> bytes:
    """A text delta whose text is the number 5, after a good one."""
    if kind == "openai":  # content is read only as a string; a refusal is emitted as it is
        events = [oa_chunk({"content": "Hel"}), oa_chunk({"refusal": 5}), oa_chunk({}, "stop")]
        return sse(*events, oa_usage())
    if kind == "anthropic":
        bad = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta"}}
        bad["delta"]["text"] = 5
        return a_body(a_start(), a_text(0, "Hel", stop=False), bad, a_end())
    if kind == "responses":
        events: list[dict[str, Any]] = [
            {"type": "response.output_text.delta", "item_id": "m", "output_index": 0}
        ]
        events[0].update(content_index=0, delta="Hel", logprobs=[])
        events.append({**events[0], "delta": 5})
        return responses_sse("gpt-5-mini", 1, events)
    return gemini_sse(gemini_chunk([{"text": "Hel"}]), gemini_chunk([{"text": 5}], "STOP"))


@pytest.mark.parametrize("kind", KINDS)
async def test_a_text_delta_that_is_no_text_fails_the_turn_as_malformed(kind, autojump_clock):
    """Before: the number went to the engine as a chunk's text and crashed it (Anthropic,
    Gemini, an OpenAI refusal, Responses), and the turn ended ``stop``, its text lost."""
    async with attack_rig(kind, retry=ONCE) as r:
        _, result = await turn(r, Reply(body=bad_text_body(kind)))
        assert result.finish_reason == "error"
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        assert "not text" in result.error.message
        await check_saved(r, text="Hel", failed=True)
        await r.next_turn()


def usage_body(kind: str, counts: tuple[Any, Any]) -> bytes:
    """A plain answer whose usage reports ``counts`` (input, output) as they are."""
    inp, out = counts
    if kind == "openai":
        usage = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp}
        return sse(
            oa_chunk({"content": "ok"}), oa_chunk({}, "stop"), oa_chunk(choices=[], usage=usage)
        )
    if kind == "anthropic":
        end = a_end()
        end[0]["usage"] = {"output_tokens": out, "input_tokens": inp}
        return a_body(a_start(), a_text(0, "ok"), end)
    if kind == "responses":
        body = responses_sse("gpt-5-mini", 1, [])
        body = body.replace(b'"input_tokens": 10', b'"input_tokens": ' + json.dumps(inp).encode())
        body = body.replace(b'"output_tokens": 5', b'"output_tokens": ' + json.dumps(out).encode())
        body = body.replace(b'"total_tokens": 15', b'"total_tokens": ' + json.dumps(inp).encode())
        text = {"type": "response.output_text.delta", "item_id": "m", "output_index": 0}
        text.update(content_index=0, delta="ok", logprobs=[])
        created, rest = body.split(b"\n\n", 1)
        line = f"event: {text['type']}\ndata: {json.dumps(text)}\n\n".encode()
        return created + b"\n\n" + line + rest
    chunk = gemini_chunk([{"text": "ok"}], "STOP")
    chunk["usageMetadata"] = {"promptTokenCount": inp, "candidatesTokenCount": out}
    return gemini_sse(chunk)


@pytest.mark.parametrize(
    "counts", [pytest.param(("ten", "5"), id="strings"), pytest.param((-50, -7), id="negative")]
)
@pytest.mark.parametrize("kind", KINDS)
async def test_token_counts_that_are_no_counts_are_none(kind, counts, autojump_clock):
    """A string count failed the turn with the runtime's TypeError (OpenAI, Anthropic,
    Gemini); a negative one was summed, lowering the turn's usage (and so its token
    budget's count). Now such a count is none: the answer stands, its usage is 0 (for
    Anthropic, the counts ``message_start`` gave, which a bad count does not replace)."""
    async with attack_rig(kind, retry=ONCE) as r:
        _, result = await turn(r, Reply(body=usage_body(kind, counts)))
        assert (result.finish_reason, result.text) == ("stop", "ok"), result.error
        usage = result.usage
        expected = (10, 1, 11) if kind == "anthropic" else (0, 0, 0)
        assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == expected
        await check_saved(r, text="ok", failed=False)
        await r.next_turn()


# -- tool calls that are not what they should be ---------------------------------------------

CALLED: list[Any] = []


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    CALLED.append(key)
    return f"value of {key}"


def oa_calls(*deltas: dict[str, Any], finish: str = "tool_calls") -> bytes:
    events = [oa_chunk({"role": "assistant", "content": ""})]
    events += [oa_chunk({"tool_calls": [d]}) for d in deltas]
    return sse(*events, oa_chunk({}, finish), oa_usage())


def call(index: Any, call_id: str | None, name: str | None, args: Any) -> dict[str, Any]:
    delta: dict[str, Any] = {"index": index, "type": "function", "function": {}}
    if call_id is not None:
        delta["id"] = call_id
    if name is not None:
        delta["function"]["name"] = name
    delta["function"]["arguments"] = args
    return delta


async def tool_turn(r: AttackRig, body: bytes) -> tuple[Any, list[Any]]:
    """A turn whose first step is ``body`` and second a plain answer; the result and the
    saved assistant message's calls and the tool results after it."""
    CALLED.clear()
    _, result = await turn(r, Reply(body=body), Reply(body=r.answer("done")))
    messages = r.session.messages
    calls = [p for p in messages[1].content if isinstance(p, ToolCallPart)]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [c.tool_call_id for c in calls] == [m.tool_call_id for m in results]
    return result, results


async def test_openai_arguments_sent_as_an_object_are_that_objects_json(autojump_clock):
    """Some compatible servers send ``arguments`` as the object itself. Before: the
    fragments were joined as strings and the turn failed with a TypeError."""
    async with attack_rig("openai", retry=ONCE, tools=[lookup]) as r:
        body = oa_calls(call(0, "call_a", "lookup", {"key": "a"}))
        result, results = await tool_turn(r, body)
        assert (result.finish_reason, result.text) == ("stop", "done"), result.error
        assert CALLED == ["a"] and len(results) == 1
        await r.next_turn()


async def test_anthropic_partial_json_that_is_no_string_is_malformed(autojump_clock):
    CALLED.clear()
    async with attack_rig("anthropic", retry=ONCE, tools=[lookup]) as r:
        events = a_tool_use(0, "toolu_1", "lookup", "x")
        events[1]["delta"]["partial_json"] = {"key": "a"}
        _, result = await turn(r, Reply(body=a_body(a_start(), events, a_end("tool_use"))))
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        assert CALLED == []
        await r.next_turn()


@pytest.mark.parametrize(
    ("deltas", "ran"),
    [
        pytest.param(  # a reused index with a new id is a new call (documented)
            [
                call(0, "call_a", "lookup", '{"key": "a"}'),
                call(0, "call_b", "lookup", '{"key": "b"}'),
            ],
            {"a", "b"},
            id="index-reused",
        ),
        pytest.param(
            [
                call(0, "call_a", "lookup", '{"key": "a"}'),
                call(7, "call_b", "lookup", '{"key": "b"}'),
            ],
            {"a", "b"},
            id="index-jump",
        ),
        pytest.param([call(None, "call_a", "lookup", '{"key": "a"}')], {"a"}, id="index-null"),
        pytest.param([call(0, None, "lookup", '{"key": "a"}')], {"a"}, id="no-id"),
        pytest.param([call(0, "call_a", None, '{"key": "a"}')], set(), id="no-name"),
        pytest.param([call(0, "call_a", "lookup", '{"key": "a"')], set(), id="never-json"),
        pytest.param([call(0, "call_a", "lookup", "[1, 2]")], set(), id="not-an-object"),
        pytest.param(  # fragments before the head: kept apart, neither runs
            [call(0, None, None, '{"key": '), call(0, "call_a", "lookup", '"x"}')],
            set(),
            id="arguments-before-head",
        ),
    ],
)
async def test_openai_tool_call_deltas_out_of_shape_run_only_whole_calls(
    deltas, ran, autojump_clock
):
    """Each malformed call gets an error result the model sees (never run); each whole
    one runs; the step and its results are saved paired and the turn goes on."""
    async with attack_rig("openai", retry=ONCE, tools=[lookup]) as r:
        result, results = await tool_turn(r, oa_calls(*deltas))
        assert (result.finish_reason, result.text) == ("stop", "done"), result.error
        assert set(CALLED) == ran
        errors = [m for m in results if m.is_error]
        assert len(results) - len(errors) == len(ran)
        await r.next_turn()


async def test_openai_a_call_with_an_unknown_finish_reason_is_not_run_and_the_model_is_told(
    autojump_clock,
):
    """A compatible server's own finish word (``eos_token``) after a call: the turn
    runner does not run a call of a step that ended ``other`` (its input may be cut);
    the model gets an error result saying so, and the turn goes on."""
    async with attack_rig("openai", retry=ONCE, tools=[lookup]) as r:
        body = oa_calls(call(0, "call_a", "lookup", '{"key": "a"}'), finish="eos_token")
        result, results = await tool_turn(r, body)
        assert (result.finish_reason, result.text) == ("stop", "done"), result.error
        assert CALLED == [] and "'other'" in results[0].error
        await r.next_turn()


@pytest.mark.parametrize(
    ("events", "text"),
    [
        pytest.param(  # two text blocks interleaved: one text, in arrival order
            [
                *a_text(0, "A0", stop=False),
                *a_text(1, "B1", stop=False),
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "A2"},
                },
                {"type": "content_block_stop", "index": 0},
                {"type": "content_block_stop", "index": 1},
            ],
            "A0B1A2",
            id="interleaved-text",
        ),
        pytest.param(
            [*a_text(0, "hi"), {"type": "content_block_stop", "index": 7}],
            "hi",
            id="stop-for-an-unknown-index",
        ),
        pytest.param(
            [{"type": "weird_new_event", "x": 1}, *a_text(0, "hi")], "hi", id="unknown-event"
        ),
    ],
)
async def test_anthropic_blocks_out_of_order_keep_the_text(events, text, autojump_clock):
    async with attack_rig("anthropic", retry=ONCE) as r:
        _, result = await turn(r, Reply(body=a_body(a_start(), events, a_end())))
        assert (result.finish_reason, result.text) == ("stop", text), result.error
        await check_saved(r, text=text, failed=False)
        await r.next_turn()


@pytest.mark.parametrize("kind", ["anthropic", "gemini"])
async def test_an_unknown_stop_reason_finishes_other_and_keeps_the_answer(kind, autojump_clock):
    async with attack_rig(kind, retry=ONCE) as r:
        if kind == "anthropic":
            body = a_body(a_start(), a_text(0, "hi"), a_end("brand_new_reason"))
        else:
            body = gemini_sse(gemini_chunk([{"text": "hi"}], "BRAND_NEW_REASON"))
        _, result = await turn(r, Reply(body=body))
        assert (result.finish_reason, result.text) == ("other", "hi"), result.error
        await check_saved(r, text="hi", failed=False)
        await r.next_turn()


def test_token_counts_are_kept_only_when_they_are_counts():
    assert [failures.tokens(v) for v in (0, 7, -1, "7", 7.0, True, None)] == [
        0,
        7,
        None,
        None,
        None,
        None,
        None,
    ]


# -- chunks and events of the wrong shape ------------------------------------------------------


async def test_an_openai_chunk_that_is_a_json_array_is_malformed_not_a_run_of_texts(
    autojump_clock,
):
    """``data: [1, 2]``: the reader gives a run of texts as a list, so a JSON array went
    downstream as texts and its numbers crashed the engine (the turn then ended as
    answered). Now a chunk that is no object is malformed, as Anthropic's and Gemini's
    readers already said."""
    async with attack_rig("openai", retry=ONCE) as r:
        body = head("openai", r.answer("Hel", "lo")) + b"data: [1, 2]\n\n"
        _, result = await turn(r, Reply(body=body))
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        assert "not a JSON object" in result.error.message
        await check_saved(r, text="Hel", failed=True)
        await r.next_turn()


SHAPES = [
    pytest.param(
        "openai",
        b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": {"a": 1}}]}\n\n',
        id="openai-finish-reason-object",
    ),
    pytest.param(
        "anthropic",
        b'event: content_block_start\ndata: {"type": "content_block_start", "index": 1,'
        b' "content_block": "text"}\n\n',
        id="anthropic-block-a-string",
    ),
    pytest.param(
        "anthropic",
        b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0,'
        b' "delta": "text"}\n\n',
        id="anthropic-delta-a-string",
    ),
    pytest.param(
        "responses",
        b'event: error\ndata: {"type": "error", "code": 5, "message": {"a": 1},'
        b' "sequence_number": 3}\n\n',
        id="responses-error-of-objects",
    ),
]


@pytest.mark.parametrize(("kind", "frame"), SHAPES)
async def test_an_event_of_the_wrong_shape_is_malformed_and_retryable(kind, frame, autojump_clock):
    """Before: a ``ProviderError`` naming the ``TypeError`` or ``AttributeError`` the
    parser raised, not retryable, as if the provider had a bug."""
    async with attack_rig(kind, retry=ONCE) as r:
        _, result = await turn(r, Reply(body=head(kind, r.answer("Hel", "lo")) + frame))
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        await check_saved(r, text="Hel", failed=True)
        await r.next_turn()


@pytest.mark.parametrize(
    ("error", "message"),
    [
        pytest.param('"a plain string"', "a plain string", id="a-string"),
        pytest.param('{"code": "abc", "message": 5}', "5", id="code-no-number"),
        pytest.param("{}", "an error with no message", id="empty"),
    ],
)
async def test_a_gemini_error_object_of_any_shape_is_the_servers_failure(
    error, message, autojump_clock
):
    """Before: the SDK's error compared the missing or textual ``code`` with numbers and
    the turn failed with that ``TypeError``, not retryable, the message lost."""
    async with attack_rig("gemini", retry=ONCE) as r:
        frame = b'data: {"error": ' + error.encode() + b"}\r\n\r\n"
        _, result = await turn(r, Reply(body=head("gemini", r.answer("Hel", "lo")) + frame))
        assert (result.error.kind, result.error.retryable) == ("ProviderUnavailable", True)
        assert result.error.message == message
        await check_saved(r, text="Hel", failed=True)
        await r.next_turn()


async def test_an_openai_error_that_is_a_string_is_its_message(autojump_clock):
    async with attack_rig("openai", retry=ONCE) as r:
        frame = b'data: {"error": "upstream model crashed"}\n\n'
        _, result = await turn(r, Reply(body=head("openai", r.answer("Hel", "lo")) + frame))
        assert result.error.message == "upstream model crashed"
        await check_saved(r, text="Hel", failed=True)


# -- a redirect ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [302, 307, 308])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_redirect_to_another_origin_is_refused_naming_it_and_sends_nothing_there(
    kind, status, autojump_clock
):
    """The SDKs' clients follow redirects: a 307/308 re-sent the whole conversation to the
    host the endpoint named (and Gemini's ``x-goog-api-key`` with it, until branch
    ``provatk`` dropped it there). Now a redirect off the endpoint's origin (scheme, host,
    port) is refused before anything is sent there, for every provider: a ProviderError,
    not retryable, naming the origin and never the key."""
    async with loopback_server() as elsewhere, attack_rig(kind, retry=ONCE) as r:
        elsewhere.add(Reply(body=r.answer("elsewhere")))
        moved = Reply(status=status, headers=[("location", elsewhere.url + "/moved?x=1")])
        _, result = await turn(r, moved)
        assert elsewhere.requests == []
        assert (result.error.kind, result.error.retryable) == ("ProviderError", False)
        assert f"redirected the call to another origin, {elsewhere.url}" in result.error.message
        assert KEY not in result.error.message and "/moved" not in result.error.message
        await check_saved(r, text="", failed=True)
        await r.next_turn()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_redirect_within_the_endpoints_origin_is_followed(kind, autojump_clock):
    async with attack_rig(kind, retry=ONCE) as r:
        moved = Reply(status=307, headers=[("location", r.server.url + "/moved")])
        _, result = await turn(r, moved, Reply(body=r.answer("Hel", "lo")))
        assert (result.finish_reason, result.text) == ("stop", "Hello"), result.error
        assert r.server.requests[-1].path == "/moved"
        assert r.sent()  # the conversation went on to the same server


def responses_item_with(field: str, value: Any) -> list[dict[str, Any]]:
    """A function call to ``lookup({"key": "a"})`` whose items' ``field`` is ``value``."""
    events = responses_call(0, "c1", "lookup", '{"key": "a"}')
    return [{**e, "item": {**e["item"], field: value}} if "item" in e else e for e in events]


async def test_responses_arguments_sent_as_an_object_are_that_objects_json(autojump_clock):
    """As for Chat Completions: before, the item's object failed the turn
    (``'dict' object has no attribute 'strip'``)."""
    async with attack_rig("responses", retry=ONCE, tools=[lookup]) as r:
        body = responses_sse("gpt-5-mini", 1, responses_item_with("arguments", {"key": "a"}))
        result, results = await tool_turn(r, body)
        assert (result.finish_reason, result.text) == ("stop", "done"), result.error
        assert CALLED == ["a"] and not results[0].is_error
        await r.next_turn()


async def test_a_responses_call_whose_name_is_no_text_is_malformed(autojump_clock):
    """Before: the number went on as the tool's name (saved so, answered "unknown tool 5")."""
    CALLED.clear()
    async with attack_rig("responses", retry=ONCE, tools=[lookup]) as r:
        body = responses_sse("gpt-5-mini", 1, responses_item_with("name", 5))
        _, result = await turn(r, Reply(body=body))
        assert (result.error.kind, result.error.retryable) == ("MalformedStream", True)
        assert CALLED == []
        await check_saved(r, text="", failed=True)
        await r.next_turn()


@pytest.mark.parametrize(
    ("case", "ran"),
    [
        pytest.param("done-without-added", {"a"}, id="done-without-added"),
        pytest.param("added-only", {"a"}, id="never-done-in-a-completed-response"),
        pytest.param("no-name", set(), id="no-name"),
        pytest.param("no-call-id", {"a"}, id="no-call-id"),
    ],
)
async def test_responses_calls_out_of_shape_run_only_whole_calls(case, ran, autojump_clock):
    events = responses_call(0, "c1", "lookup" if case != "no-name" else "", '{"key": "a"}')
    if case == "done-without-added":
        events = events[-1:]
    elif case == "added-only":
        events = events[:-1]
    elif case == "no-call-id":
        events = [
            {**e, "item": {k: v for k, v in e["item"].items() if k != "call_id"}}
            if "item" in e
            else e
            for e in events
        ]
    async with attack_rig("responses", retry=ONCE, tools=[lookup]) as r:
        result, results = await tool_turn(r, responses_sse("gpt-5-mini", 1, events))
        assert (result.finish_reason, result.text) == ("stop", "done"), result.error
        assert set(CALLED) == ran and len(results) == 1
        await r.next_turn()


@pytest.mark.parametrize("kind", ["openai", "responses", "anthropic"])
async def test_a_server_that_keeps_the_body_open_after_the_last_event_does_not_fail_the_turn(
    kind, autojump_clock
):
    """The whole answer, its last event (``[DONE]``, ``response.completed``,
    ``message_stop``), then the body kept open. Anthropic read on to the body's end, so
    a finished answer waited for the read timeout and failed with a ProviderTimeout: it
    now stops at ``message_stop`` (reading what follows for 0.1 s). (Gemini, and OpenAI
    with no ``[DONE]``: the next test.)"""
    async with attack_rig(kind, retry=ONCE) as r:
        body = r.answer("Hel", "lo")
        t0 = trio.current_time()
        _, result = await turn(
            r, Reply(body=body + b": more\n\n", stall=1e6, stall_after=len(body))
        )
        assert (result.finish_reason, result.text) == ("stop", "Hello"), result.error
        assert trio.current_time() - t0 < 1.0
        await check_saved(r, text="Hello", failed=False)
        await r.next_turn()


@pytest.mark.parametrize("kind", KINDS)
async def test_a_retried_429_quoting_the_key_leaks_it_into_no_retry_event_or_log(
    kind, autojump_clock
):
    """The ``provider.retry`` event and its log line carry the error's message."""
    log = io.StringIO()
    configure_logging("debug", stream=log)
    try:
        async with attack_rig(kind, retry=RetryPolicy(max_attempts=2, jitter=0)) as r:
            watch = r.host.bus.subscribe([ev.ProviderRetry])
            limited = http_error(kind, 429, LEAK, [("retry-after", "1")])
            chunks, result = await turn(r, limited, Reply(body=r.answer("ok")))
            assert (result.finish_reason, result.text) == ("stop", "ok")
            published = drain(watch.inbox)
            stored = await r.host.store.load("s")
    finally:
        configure_logging("warning")
    assert len(published) == 1 and "[redacted]" in published[0].error.message
    assert '"provider.retry"' in log.getvalue()
    assert KEY not in repr(published)
    assert leaks(chunks, result, r, stored, log.getvalue()) == []


@pytest.mark.parametrize("kind", KINDS)
async def test_a_cancel_while_the_second_step_stalls_keeps_the_first_step_and_its_result(
    kind, autojump_clock
):
    """Step one calls a tool (committed: the call and its result); step two streams some
    text, then the server stalls. The user's cancel ends the turn at once; the saved turn
    holds the call, its result and the text streamed, marked interrupted."""
    CALLED.clear()
    async with attack_rig(kind, retry=ONCE, tools=[lookup]) as r:
        second = r.answer("Hel", "lo")
        r.server.add(Reply(body=r.tool_call("call_1", "lookup", '{"key": "a"}')))
        r.server.add(Reply(body=second, stall=1e6, stall_after=len(head(kind, second))))
        async with r.session.stream("hi") as out:
            t0 = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_after, out, 5.0)
                await consume(out)
        assert trio.current_time() - t0 == pytest.approx(5.0, abs=0.01)
        assert (out.result.finish_reason, out.result.text) == ("aborted", "Hel")
        assert CALLED == ["a"]
        for messages in (r.session.messages, (await r.host.store.load("s")).messages):
            assert [m.role for m in messages] == ["user", "assistant", "tool"]
            calls = [p for p in messages[1].content if isinstance(p, ToolCallPart)]
            assert [c.tool_call_id for c in calls] == [messages[2].tool_call_id]
            assert not messages[2].is_error and texts(messages[1]) == "Hel"
            assert messages[1].interrupted
        r.server.replies.clear()
        await r.next_turn()


# -- a byte order mark, a body kept open, a redirect (branch provmend) -----------------------


def text_first_body(kind: str, r: AttackRig) -> bytes:
    """An answer "Hello" (10 tokens in, 5 out) whose first event carries text ("Hel"),
    or, for Anthropic and Responses, the start of the answer."""
    if kind == "openai":
        events = [oa_chunk({"content": "Hel"}), oa_chunk({"content": "lo"}), oa_chunk({}, "stop")]
        return sse(*events, oa_usage())
    return r.answer("Hel", "lo")


@pytest.mark.parametrize("write_size", [None, 1], ids=["one-write", "byte-by-byte"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_leading_byte_order_mark_is_skipped_and_the_first_event_read(
    kind, write_size, autojump_clock
):
    """A body that starts with a UTF-8 BOM (EF BB BF), as some proxies write it: the SSE
    specification strips it. Before, it joined the first line, so the first event was
    lost (OpenAI's first text, Anthropic's ``message_start`` and its input count) and
    Gemini failed the stream (the line read as raw JSON). (Responses held: it lost only
    the first event's name, and reads the type from its data.)"""
    async with attack_rig(kind, retry=ONCE) as r:
        body = b"\xef\xbb\xbf" + text_first_body(kind, r)
        _, result = await turn(r, Reply(body=body, write_size=write_size))
        assert (result.finish_reason, result.text) == ("stop", "Hello"), result.error
        assert (result.usage.input_tokens, result.usage.output_tokens) == (10, 5)
        await check_saved(r, text="Hello", failed=False)


@pytest.mark.parametrize("kind", ["openai", "gemini"])
async def test_a_body_kept_open_after_the_finish_and_usage_ends_the_turn_with_both(
    kind, autojump_clock
):
    """OpenAI: the finish chunk, the usage chunk (``choices: []``, after the finish), then
    no ``[DONE]`` and the body kept open; Gemini: the chunk with ``finishReason`` (and
    its ``usageMetadata``), then the body kept open. Both read on to ``[DONE]`` or the
    body's end, so a finished answer waited for the read timeout and failed with a
    ProviderTimeout; they now stop there, the usage kept."""
    async with attack_rig(kind, retry=ONCE) as r:
        body = r.answer("Hel", "lo")
        if kind == "openai":
            body = body[: body.index(b"data: [DONE]")]
        t0 = trio.current_time()
        _, result = await turn(
            r, Reply(body=body + b": more\n\n", stall=1e6, stall_after=len(body))
        )
        assert (result.finish_reason, result.text) == ("stop", "Hello"), result.error
        assert (result.usage.input_tokens, result.usage.output_tokens) == (10, 5)
        assert trio.current_time() - t0 < 1.0
        await check_saved(r, text="Hello", failed=False)
        await r.next_turn()


async def test_openai_usage_after_the_finish_is_read_before_the_turn_ends(autojump_clock):
    """The usage chunk comes a while after the finish chunk (a slow server): the reader
    does not stop at the finish, so the usage is not lost. A while within the grace
    after the finish (``USAGE_GRACE``): past it the answer ends without its usage
    (``tests/test_provider_deadlines.py``, branch ``provdeadline``)."""
    from actors.providers.openai import USAGE_GRACE

    async with attack_rig("openai", retry=ONCE) as r:
        body = r.answer("Hel", "lo")
        at = body.index(b"data: " + json.dumps(oa_usage()).encode())
        _, result = await turn(r, Reply(body=body, stall=USAGE_GRACE / 2, stall_after=at))
        assert (result.finish_reason, result.text) == ("stop", "Hello"), result.error
        assert (result.usage.input_tokens, result.usage.output_tokens) == (10, 5)


async def test_openai_without_usage_asked_a_body_kept_open_after_the_finish_ends_the_turn(
    autojump_clock,
):
    """``stream_options=None`` (a server that refuses it): no usage chunk will come, so
    the finish chunk ends the answer."""
    async with attack_rig("openai", retry=ONCE, provider={"stream_options": None}) as r:
        body = sse(oa_chunk({"content": "Hel"}), oa_chunk({"content": "lo"}), done=False)
        body += sse(oa_chunk({}, "stop"), done=False)
        t0 = trio.current_time()
        _, result = await turn(
            r, Reply(body=body + b": more\n\n", stall=1e6, stall_after=len(body))
        )
        assert (result.finish_reason, result.text) == ("stop", "Hello"), result.error
        assert "stream_options" not in r.sent()
        assert trio.current_time() - t0 < 1.0


# -- numbers JSON has not, in a tool call's input ------------------------------------------

MEASURED: list[Any] = []


@tool
async def measure(x: float) -> str:
    """Measure x."""
    MEASURED.append(x)
    return f"measured {x}"


def strict_json(body: bytes) -> Any:
    """``body`` read as JSON is (Python's reader takes ``NaN`` and infinities)."""

    def refuse(name: str) -> Any:
        raise AssertionError(f"{name} in a request body: {body[:300]!r}")

    return json.loads(body, parse_constant=refuse)


def measure_call(kind: str, r: AttackRig, number: str) -> bytes:
    """A call of ``measure`` whose input is ``{"x": <number>}``, the number as written."""
    args = '{"x": ' + number + "}"
    if kind == "openai":
        return oa_calls(call(0, "call_a", "measure", args))
    if kind == "anthropic":
        return a_body(a_start(), a_tool_use(0, "call_a", "measure", args), a_end("tool_use"))
    if kind == "responses":
        return r.tool_call("call_a", "measure", args)
    return r.tool_call("call_a", "measure", '{"x": 1}').replace(b'"x": 1', args[1:-1].encode())


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_whose_input_holds_nan_or_infinity_is_not_run_and_the_model_is_told(
    kind, number, autojump_clock
):
    """Python's JSON reader takes ``NaN``, ``Infinity`` and ``1e400`` (an infinity): the
    tool ran with ``nan``, the session kept it (the store writes ``null``), and its replay
    made the next Anthropic request fail to build, not retryable, on every later turn of
    the session (``Out of range float values are not JSON compliant``), Gemini's body no
    JSON and OpenAI's arguments no JSON. Now such an input is invalid JSON, as any other:
    the call is not run, the model reads why in its result, the turn goes on, and every
    request after it is JSON."""
    MEASURED.clear()
    async with attack_rig(kind, retry=ONCE, tools=[measure]) as r:
        result, results = await tool_turn(r, measure_call(kind, r, number))
        assert (result.finish_reason, result.text) == ("stop", "done"), result.error
        assert MEASURED == []
        assert results[0].is_error and "invalid JSON" in results[0].error
        stored = (await r.host.store.load("s")).messages
        for messages in (r.session.messages, stored):
            (saved,) = [p for p in messages[1].content if isinstance(p, ToolCallPart)]
            json.dumps(saved.input, allow_nan=False)  # (raw text, or Gemini's args with null)
        strict_json(r.server.requests[1].body)  # the call replayed in the turn's next step
        await r.next_turn()
        strict_json(r.server.requests[2].body)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_history_holding_nan_in_a_calls_input_is_sent_as_null(kind, autojump_clock):
    """A history made by hand (or kept from before) whose call input holds ``nan`` and an
    infinity: the request holds ``null`` there, as the store writes it, where the
    Anthropic request failed to build and Gemini's and OpenAI's were no JSON."""
    from actors.stores import MemoryStore
    from runtime import Agent, Host
    from runtime.messages import AssistantMessage, UserMessage
    from tests.support.attacks import make
    from tests.support.faults import resolve_platform

    history = [
        UserMessage(content="go"),
        AssistantMessage(
            content=(
                ToolCallPart(
                    tool_call_id="call_a",
                    tool_name="measure",
                    input={"x": float("nan"), "y": [float("inf"), 1.5]},
                    step=0,
                ),
            )
        ),
        ToolMessage(tool_call_id="call_a", tool_name="measure", output="ok", step=0),
    ]
    store = MemoryStore()
    await store.save("s", 0, history)
    async with loopback_server() as server:
        provider = make(kind, server.url)
        if kind != "gemini":
            resolve_platform(provider)
        try:
            async with Host.open(store=store, log_tap=False) as host:
                session = await host.open_session(
                    Agent(provider=provider, tools=[measure], retry=ONCE), session_id="s"
                )
                r = AttackRig(kind, server, host, session, provider)
                server.add(Reply(body=r.answer("fine")))
                result = await session.run("again")
        finally:
            await provider.aclose()
    assert (result.finish_reason, result.text) == ("stop", "fine"), result.error
    sent = json.dumps(strict_json(server.requests[0].body))
    if kind in ("openai", "responses"):  # arguments are JSON text inside the body
        assert '{\\"x\\": null, \\"y\\": [null, 1.5]}' in sent
    else:
        assert '{"x": null, "y": [null, 1.5]}' in sent


# -- Responses: whitespace alone after reasoning -------------------------------------------


def responses_reasoning(index: int, item_id: str) -> list[dict[str, Any]]:
    """A reasoning item (summary "Plan.", encrypted content) at ``index``."""
    head = {"id": item_id, "type": "reasoning", "summary": []}
    final = {
        **head,
        "summary": [{"type": "summary_text", "text": "Plan."}],
        "encrypted_content": "gAAAA" + item_id,
    }
    delta = {"type": "response.reasoning_summary_text.delta", "item_id": item_id}
    delta.update(output_index=index, summary_index=0, delta="Plan.")
    return [
        {"type": "response.output_item.added", "output_index": index, "item": head},
        delta,
        {"type": "response.output_item.done", "output_index": index, "item": final},
    ]


async def test_responses_reasoning_followed_by_whitespace_alone_is_not_sent_unpaired(
    autojump_clock,
):
    """Reasoning, a message of whitespace alone ("\\n\\n", as models write before a call),
    a call. The history's repair drops the whitespace text, so the reasoning item went
    back followed by the call, without the message that had followed it: the API pairs
    the two by id and refuses a reasoning item "provided without its required following
    item". Now that reasoning item is not sent (the call and its output are); one that
    kept its message still is (the next step's, "Next." here)."""
    CALLED.clear()
    async with attack_rig("responses", retry=ONCE, tools=[lookup]) as r:
        events = [
            *responses_reasoning(0, "rs_1"),
            *responses_message(1, "msg_1", "\n\n"),
            *responses_call(2, "call_1", "lookup", '{"key": "a"}'),
        ]
        second = [*responses_reasoning(0, "rs_2"), *responses_message(1, "msg_2", "Next.")]
        first_step = Reply(body=responses_sse("gpt-5-mini", 1, events))
        second_step = Reply(body=responses_sse("gpt-5-mini", 2, second))
        _, result = await turn(r, first_step, second_step)
        assert (result.finish_reason, result.text) == ("stop", "\n\nNext."), result.error
        assert CALLED == ["a"]
        items = r.sent()["input"]
        assert [i.get("type", i.get("role")) for i in items] == [
            "user",
            "function_call",
            "function_call_output",
        ]
        items = (await r.next_turn())["input"]
        ids = [i.get("id") for i in items]
        assert "rs_1" not in ids and ids.index("rs_2") + 1 == ids.index("msg_2")
