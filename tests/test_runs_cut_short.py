"""A fast answer cut short in the middle of its runs of text deltas, through the real SDK
clients and the whole host (issue 24 goal 1: runs of up to ``MAX_RUN`` deltas cross the
actors, the stream controller hands them out ``MAX_BATCH`` at a time).

The answer is 3,000 deltas in one network write, its JSON compact as the APIs write it, so
they travel as runs of up to 512 (a test checks that they do).
Stopping the turn at a given delta (the first one, which goes alone, or one in the middle
of a run), or a line of invalid JSON in the middle of the body, must leave what the
consumer saw (read to the end) equal to what the session saved and the store holds:
nothing duplicated, nothing lost, the ``seq`` of every chunk the one after the last.
:mod:`tests.test_resilience_cancel` does the same for slow streams, one delta a write.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from tests.support.faults import (
    PROVIDERS,
    Rig,
    a_body,
    a_end,
    a_start,
    a_text,
    check_history,
    oa_text,
    rig,
)
from tests.support.grammar import check_grammar
from tests.support.loopback import Reply

WORDS = [f"w{i} " for i in range(3000)]


def fast_body(kind: str) -> bytes:
    """The answer with its JSON written compactly, as the APIs write it (the test
    helpers' ``json.dumps`` spacing is read event by event, never as runs)."""
    body = oa_text(*WORDS) if kind == "openai" else a_body(a_start(), a_text(0, *WORDS), a_end())
    lines = body.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"data: {"):
            doc = json.loads(line[6:])
            lines[i] = b"data: " + json.dumps(doc, separators=(",", ":")).encode()
    return b"\n".join(lines)


def one_write(body: bytes) -> Reply:
    return Reply(body=body, write_size=len(body))


async def saved_as_seen(r: Rig, chunks: list[Any]) -> str:
    """The text the consumer saw, checked against the session and the store."""
    seqs = [c.seq for c in chunks]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # none twice, none skipped
    shown = "".join(c.text for c in chunks if c.type == "text-delta")
    assert r.session.messages[1].text == shown
    stored = await r.host.store.load("s")
    assert stored is not None and stored.messages == r.session.messages
    check_history(r.session.messages)
    return shown


@pytest.mark.parametrize("at", [1, 600])
@pytest.mark.parametrize("kind", PROVIDERS)
async def test_a_turn_stopped_in_the_middle_of_a_run_saves_what_its_consumer_saw(
    kind, at, autojump_clock
):
    async with rig(kind, one_write(fast_body(kind))) as r:
        chunks: list[Any] = []
        deltas = 0
        with trio.fail_after(60):
            async with r.session.stream("hi") as out:
                async for chunk in out:
                    chunks.append(chunk)
                    if chunk.type == "text-delta":
                        deltas += 1
                        if deltas == at:
                            out.cancel("enough")
        check_grammar(chunks, ending="abort")
        assert out.result.finish_reason == "aborted"
        shown = await saved_as_seen(r, chunks)
        assert shown.startswith("".join(WORDS[:at])) and r.session.messages[1].interrupted
        await r.next_turn()


def _with_a_broken_line(kind: str, before: int) -> bytes:
    """The fast body with a line of invalid JSON just before delta ``before``."""
    body = fast_body(kind)
    word = f'"w{before} "'.encode()  # (its JSON string: the text's value)
    at = body.rindex(b"\n\n", 0, body.index(word)) + 2  # the start of that delta's block
    if kind == "openai":
        bad = b'data: {"choices":[{"index":0,"delta":{"content":"cut\n\n'
    else:
        bad = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,\n\n'
    return body[:at] + bad + body[at:]


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_invalid_json_in_the_middle_of_a_run_fails_clearly_and_keeps_what_came_before(
    kind, autojump_clock
):
    async with rig(kind, one_write(_with_a_broken_line(kind, 1500))) as r:
        with trio.fail_after(60):
            async with r.session.stream("hi") as out:
                chunks = [c async for c in out]
        check_grammar(chunks, ending="error")
        assert out.result.error is not None and out.result.error.kind == "MalformedStream"
        assert await saved_as_seen(r, chunks) == "".join(WORDS[:1500])


async def test_the_answer_crosses_the_controller_as_runs_longer_than_a_piece(
    monkeypatch, autojump_clock
):
    """What the tests above rely on: the controller gets runs of more than ``MAX_BATCH``
    deltas (built and sent a piece at a time), from both providers."""
    from actors.stream_controller import StreamController
    from runtime.actor_messages import MAX_BATCH, Batch
    from runtime.provider import TextRun

    longest: list[int] = []
    handle = StreamController.handle

    async def counting(self: StreamController, message: Any) -> None:
        if isinstance(message, Batch):
            longest.extend(len(item.texts) for item in message if type(item) is TextRun)
        await handle(self, message)

    monkeypatch.setattr(StreamController, "handle", counting)
    for kind in PROVIDERS:
        longest.clear()
        async with rig(kind, one_write(fast_body(kind))) as r:
            assert (await r.session.run("hi")).text == "".join(WORDS)
        assert max(longest, default=0) > MAX_BATCH, kind
