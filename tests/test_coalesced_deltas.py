"""A provider's chunks go downstream a network read at a time, and may be coalesced.

The OpenAI and Anthropic providers send each read's chunks in one call
(:class:`actors.providers.read_batch.ReadBatch`); with
:attr:`runtime.provider.Provider.coalesce_deltas` a read's consecutive text deltas of one
part join into one. Neither may change what the turn says or stores: the same text, the
same parts in the same order, the stream's first delta alone and at once (issue 24).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio

from actors.providers.anthropic import parse_batches as anthropic_batches
from actors.providers.openai import parse_batches as openai_batches
from actors.providers.read_batch import ReadBatch
from runtime.actor_messages import MAX_BATCH, Batch, Batcher
from runtime.chunks import FinishChunk, ReasoningChunk, TextChunk
from runtime.inbox import Inbox
from tests.support.faults import (
    PROVIDERS,
    a_body,
    a_end,
    a_start,
    a_text,
    a_thinking,
    oa_reasoning_then_text,
    rig,
)
from tests.support.loopback import Reply


def _body(kind: str) -> tuple[bytes, str]:
    """A body whose text is split around a reasoning part, and the whole text."""
    if kind == "openai":
        return oa_reasoning_then_text(["Let me ", "think."], ["Hello", " there", "!"]), (
            "Hello there!"
        )
    body = a_body(
        a_start(),
        a_text(0, "Hello", " there", "!"),
        a_thinking(1, "Let me ", "think."),
        a_text(2, "A", "B", "C"),
        a_end(),
    )
    return body, "Hello there!ABC"


async def _turn(kind: str, coalesce: bool) -> tuple[list[Any], Any]:
    body, _ = _body(kind)
    async with rig(kind, Reply(body=body)) as r:
        r.agent.provider.coalesce_deltas = coalesce
        async with r.session.stream("hi") as out:
            chunks = [chunk async for chunk in out]
        record = await r.host.store.load("s")
    assert record is not None and record.messages[-1] == out.result.message
    return chunks, out.result.message


@pytest.mark.parametrize("kind", PROVIDERS)
async def test_coalesced_deltas_say_and_store_exactly_what_single_ones_do(kind):
    single, single_message = await _turn(kind, coalesce=False)
    joined, joined_message = await _turn(kind, coalesce=True)
    _, text = _body(kind)

    def deltas(chunks: list[Any]) -> list[str]:
        return [c.text for c in chunks if c.type == "text-delta"]

    def frames(chunks: list[Any]) -> list[str]:
        return [c.type for c in chunks if not c.type.endswith("-delta")]

    assert "".join(deltas(joined)) == "".join(deltas(single)) == text
    assert len(deltas(joined)) < len(deltas(single))  # the body came in one read
    assert deltas(joined)[0] == deltas(single)[0] == "Hello"  # the first goes alone
    assert frames(joined) == frames(single)  # the same parts, opened and closed alike
    assert [(type(p), p.text) for p in joined_message.content] == [
        (type(p), p.text) for p in single_message.content
    ]
    assert joined_message.text == single_message.text == text


async def _batches(*batches: list[Any]) -> Any:
    for batch in batches:
        yield batch


def _delta(index: int, text: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "text_delta", "text": text},
    }


async def test_a_text_run_never_spans_two_anthropic_blocks():
    sent: list[Any] = []

    async def emit(chunk: Any) -> None:
        sent.append(chunk)

    read = [
        a_start(),
        *a_text(0, stop=False),
        *a_text(1, stop=False),
        _delta(0, "x"),
        _delta(0, "a"),
        _delta(0, "b"),
        _delta(1, "c"),
        _delta(1, "d"),
        _delta(0, "e"),
        *a_end(),
    ]
    await anthropic_batches(_batches(read), emit, coalesce=True)
    texts = [c.text for c in sent if isinstance(c, TextChunk)]
    assert texts == ["x", "ab", "cd", "e"]
    assert isinstance(sent[-1], FinishChunk)


async def test_openai_reads_keep_their_order_around_other_chunks():
    sent: list[Any] = []

    async def emit(chunk: Any) -> None:
        sent.append(chunk)

    def text(t: str) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": {"content": t}}]}

    reasoning = {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    await openai_batches(
        _batches([text("a"), text("b"), text("c"), reasoning, text("d"), text("e")], [finish]),
        emit,
        coalesce=True,
    )
    kinds = [(type(c).__name__, getattr(c, "text", None)) for c in sent]
    assert kinds == [
        ("TextChunk", "a"),
        ("TextChunk", "bc"),
        ("ReasoningChunk", "hm"),
        ("TextChunk", "de"),
        ("FinishChunk", None),
    ]
    assert not any(isinstance(c, ReasoningChunk) and c.text != "hm" for c in sent)


async def _relay(inbox: Inbox, out: Inbox) -> None:
    sender = Batcher(out)
    async for batch in inbox:
        batch.taken = True
        await sender.send_all(list(batch))


async def test_send_all_lets_the_first_batch_through_every_stage_before_going_on():
    inboxes = [Inbox(64) for _ in range(4)]
    got: list[Any] = []

    async def collect() -> None:
        async for batch in inboxes[-1]:
            assert isinstance(batch, Batch)
            batch.taken = True
            got.extend(batch)

    async with trio.open_nursery() as nursery:
        for a, b in itertools.pairwise(inboxes):
            nursery.start_soon(_relay, a, b)
        nursery.start_soon(collect)
        await trio.testing.wait_all_tasks_blocked()
        producer = Batcher(inboxes[0], max_hold=60.0, hold_rounds=5)
        await producer.send_all(["a", "b"])  # parsing a burst: nothing else yields
        seen = list(got)
        await producer.send_all(["c"])
        nursery.cancel_scope.cancel()
    assert seen == ["a", "b"]


@pytest.mark.parametrize("size", [1, MAX_BATCH - 1, MAX_BATCH])
async def test_a_full_batch_lets_the_actors_after_the_provider_run(size: int) -> None:
    """After sending a full batch the provider yields once (the batches of a fast stream
    do not pile up before the engine, nor their chunks in the collector's old
    generation); a smaller one it sends without yielding. A checkpoint is what raises
    in a cancelled scope, so that tells one, after the chunks were sent."""
    sent: list[Any] = []

    async def emit(chunk: Any) -> None:  # never yields
        sent.append(chunk)

    out = ReadBatch(emit)
    out.text("first")
    await out.flush()  # the first delta alone
    yielded = True
    with trio.CancelScope() as scope:
        scope.cancel()
        for k in range(size):
            out.text(f"t{k}")
        await out.flush()
        yielded = False
    assert len(sent) == size + 1
    assert yielded == (size == MAX_BATCH)
