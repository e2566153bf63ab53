"""Attacks on the continuation's tail read in the flusher's RESP pipeline (``ce91923``):
a stream key of the wrong type, a stream gone during the wait for a person, and a reader
that resumes across the continuation. Real Redis (tests.support.redis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from actors.relays.redis_entries import GAP
from runtime.errors import RelayTurnGone
from tests.support.redis import _restartable, redis_restored, start_redis, stop_redis
from tests.test_relay import counted_tail_reads, opened, read_all, redis_url, text_turn

__all__ = ["redis_url"]  # the fixture, used by name


def _items(entries: list[Any]) -> list[str]:
    return [
        item["type"]
        for entry in reversed(entries)
        for item in json.loads(entry.field_values[b"items"])
    ]


async def paused_turn(relay: Any) -> list[Any]:
    """A two-delta text turn whose first writer (``fresh``) wrote its first six chunks
    and closed paused for a person, as a suspension leaves turn ``t``'s stream: the
    whole turn's chunks, the continuation's from ``[6:]``."""
    chunks = text_turn(["x", "y"])
    first = relay.writer(session_id="s", turn_id="t", fresh=True)
    for chunk in chunks[:6]:
        first.append(chunk)
    await first.aclose(paused=True)
    return chunks


async def test_a_tail_read_refused_with_wrongtype_is_a_refusal_and_the_flusher_goes_on(
    redis_url: str,
) -> None:
    """A continuation whose stream key holds another type (``WRONGTYPE`` answers its
    ``XREVRANGE`` in the pipeline): the writer counts a refusal, its close stays bounded
    by ``close_timeout``, no coredis call is made, and the flusher shared by all the
    writers still writes another turn whole."""
    async with opened(redis_url, close_timeout=1.0) as relay:
        assert relay.batcher.connection is not None
        await relay.client.set(relay.turn_key("bad"), "not a stream")
        with counted_tail_reads(relay) as tails:
            bad = relay.writer(session_id="s", turn_id="bad")
            for chunk in text_turn(["x"])[1:]:
                bad.append(chunk)
            with trio.fail_after(10):
                await bad.aclose()
        good = relay.writer(session_id="s", turn_id="good", fresh=True)
        chunks = text_turn(["y"])
        for chunk in chunks:
            good.append(chunk)
        await good.aclose()
        got = await read_all(relay, "good")
        kept = await relay.client.get(relay.turn_key("bad"))
    assert tails == []
    assert bad.failures >= 1
    assert kept == b"not a stream"  # nothing written over the other type's key
    assert [c.seq for c in got] == list(range(1, len(chunks) + 1))
    assert good.failures == 0


async def test_a_refusal_repeated_counts_the_turns_chunks_lost_once(redis_url: str) -> None:
    """Every retry of a key of another type is refused again, each time with only the
    gap's marker the writer queued itself after the first refusal: ``lost`` counts the
    turn's six chunks, not the marker again at every refusal."""
    async with opened(redis_url, close_timeout=1.0) as relay:
        await relay.client.set(relay.turn_key("bad"), "not a stream")
        bad = relay.writer(session_id="s", turn_id="bad")
        chunks = text_turn(["x"])[1:]
        for chunk in chunks:
            bad.append(chunk)
        with trio.fail_after(10):
            await bad.aclose()
    assert bad.failures >= 2  # refused, then refused again with the marker alone
    assert bad.lost == len(chunks) == 6


async def test_a_reader_resuming_across_a_continuation_sees_no_gap_and_no_repeat(
    redis_url: str,
) -> None:
    """A turn paused for a person, then continued by a writer that reads the tail in the
    pipeline: a reader that resumes after the last seq it had (Last-Event-ID) reads the
    continuation's chunks from the next seq on, none twice, none missing."""
    async with opened(redis_url) as relay:
        chunks = await paused_turn(relay)
        before = await read_all(relay, "t")  # ends at the pause
        second = relay.writer(session_id="s", turn_id="t")
        for chunk in chunks[6:]:
            second.append(chunk)
        await second.aclose()
        after = await read_all(relay, "t", after_seq=before[-1].seq)
        whole = await read_all(relay, "t")
    assert [c.seq for c in before] == list(range(1, 7))
    # The pause's end marker holds seq 7 (no chunk): the continuation numbers on after it.
    assert [c.seq for c in after] == list(range(8, len(chunks) + 2))
    assert [type(c) for c in before + after] == [type(c) for c in chunks]
    assert [c.seq for c in whole] == [c.seq for c in before + after]
    assert second.failures == 0


async def test_a_continuation_whose_stream_is_gone_after_the_wait(redis_url: str) -> None:
    """The stream expired (or Redis restarted empty) while the turn waited for a person:
    the continuation's tail read in the pipeline answers no entries. Its stream starts
    with a gap, and a reader that resumes with the last seq it had is told the turn is
    gone (it rebuilds from the store) instead of skipping the new stream's low seqs."""
    async with opened(redis_url) as relay:
        chunks = await paused_turn(relay)
        await relay.client.delete([relay.turn_key("t")])
        # The worker's writer for a continuation (a resumed claim) is a takeover's.
        second = relay.writer(session_id="s", turn_id="t", takeover=True)
        for chunk in chunks[6:]:
            second.append(chunk)
        await second.aclose()
        entries = await relay.client.xrevrange(relay.turn_key("t"), "+", "-", count=100)
        with pytest.raises(RelayTurnGone):
            await read_all(relay, "t", after_seq=6)
    assert _items(entries)[0] == GAP


async def test_a_tail_read_while_redis_is_down_is_retried_not_refused(redis_url: str) -> None:
    """Redis down when the continuation's first flush reads the tail in the pipeline
    (and back empty, as after a restart without persistence): the read fails as the
    connection's, retried after a backoff with the queue kept (not a refusal that drops
    it), and the continuation's chunks all land after the gap its lost stream says."""
    with redis_restored():
        async with opened(redis_url, retry_base=0.02, retry_max=0.2, close_timeout=30.0) as relay:
            chunks = await paused_turn(relay)
            await trio.to_thread.run_sync(stop_redis)
            second = relay.writer(session_id="s", turn_id="t", takeover=True)
            for chunk in chunks[6:]:
                second.append(chunk)
            with trio.fail_after(20):
                while second.failures < 2:  # noqa: ASYNC110 - the writer's state
                    await trio.sleep(0.01)
            await trio.to_thread.run_sync(start_redis)
            with trio.fail_after(20):
                await second.aclose()
            entries = await relay.client.xrevrange(relay.turn_key("t"), "+", "-", count=100)
    assert second.lost == 0
    assert _items(entries) == [GAP, *[c.type for c in chunks[6:]], "relay.end"]


async def test_a_junk_entry_at_the_tail_read_in_the_pipeline_says_gap_not_refusal(
    redis_url: str,
) -> None:
    """A foreign entry at the stream's tail (no ``items``: not a writer's) read by a
    continuation in the pipeline: the writer numbers on after it and tells readers that
    part of the turn is lost (a gap), keeping its chunks; no refusal drops them."""
    async with opened(redis_url) as relay:
        chunks = await paused_turn(relay)
        key = relay.turn_key("t")
        await relay.client.xadd(key, {"junk": "x"}, identifier="9-0")
        second = relay.writer(session_id="s", turn_id="t", takeover=True)
        for chunk in chunks[6:]:
            second.append(chunk)
        await second.aclose()
        entries = await relay.client.xrevrange(key, "+", "-", count=100)
        with pytest.raises(RelayTurnGone):
            await read_all(relay, "t")
    mine = [e for e in entries if e.field_values.get(b"w") == second.writer_id]
    assert _items(mine) == [GAP, *[c.type for c in chunks[6:]], "relay.end"]
    assert mine[-1].identifier.split(b"-")[0] == b"10"  # numbered on after the junk
    assert second.lost == 0


async def test_a_tail_read_that_redis_stalls_past_its_deadline_is_retried_on_a_new_connection(
    redis_url: str,
) -> None:
    """Redis stalls the continuation's tail read past the flusher's deadline (``CLIENT
    PAUSE``): the read fails as too slow and is retried after the stall, the RESP
    connection opened again (a late reply is never taken for a later command's), and
    the continuation's chunks land once each, numbered on after the pause's end, with
    no gap."""
    _restartable()  # the pause stalls every client: only on the run's own server
    async with opened(
        redis_url, op_timeout=0.2, retry_base=0.05, retry_max=0.2, close_timeout=30.0
    ) as relay:
        chunks = await paused_turn(relay)
        await relay.client.client_pause(800)
        second = relay.writer(session_id="s", turn_id="t", takeover=True)
        for chunk in chunks[6:]:
            second.append(chunk)
        with trio.fail_after(20):
            await second.aclose()
        got = await read_all(relay, "t")
    assert second.failures >= 1 and second.lost == 0
    assert [type(c) for c in got] == [type(c) for c in chunks]
    assert [c.seq for c in got] == [*range(1, 7), *range(8, len(chunks) + 2)]
