"""A relay reader's memory is bounded by a page (``page_bytes``), not the turn's size.

Before (branch ``relayread``), a reader's replay gathered the whole backlog before it
yielded anything (so restarted steps were dropped first), and an ``XRANGE`` page was 256
entries whatever their size: a fresh reader of a long stream of large entries held the
stream's whole size (twice: the reply and its decoded items). Now a backlog longer than
a page is read twice, a page at a time: a first pass finds where its steps were reset,
the second yields as it goes, dropping what those resets take back; and a page is
bounded in bytes too. These tests check both: what a reader holds (``tracemalloc``) and
that what it yields is what the whole-backlog reader yielded (its drop of restarted
steps, :func:`dropped_whole`, kept here as the oracle)."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import attrs
import pytest
import trio
from structlog.testing import capture_logs

from actors.relays.redis_entries import _Resets, _Sieve
from runtime import output as o
from runtime.errors import RelayTurnGone
from runtime.relay import RESTART_STEP as RESTART
from runtime.relay import StepRestarted
from tests.support.redis import require_redis
from tests.support.services import RedisServer, ServiceUnavailable
from tests.test_relay import (
    TAKEN_OVER,
    USAGE,
    opened,
    paused_then_resumed,
    read_all,
    redis_url,
    text_turn,
)

__all__ = ["redis_url"]  # (the fixture)

BIG = "x" * 200_000
"""One delta's text: an entry of about 200 KB."""
ENTRIES = 40
"""A backlog of 8 MB."""
PAGE_BYTES = 250_000
"""The readers' page here: one big entry."""
HELD = 5_000_000
"""The most a reader of the 8 MB backlog may allocate at once: a page's reply (about
three times its bytes in coredis's buffers) and its decoded items, and the parse of one
entry (``orjson.loads`` of a 200 KB entry peaks at 2.6 MB by itself, measured). About
3.3 MB measured."""


def dropped_whole(backlog: list[tuple[int, Any]], seen: int) -> list[tuple[int, Any]]:
    """The whole-backlog reader's drop of reset steps (``_drop_restarted`` before this
    branch), the oracle of :class:`_Sieve`."""
    kept_by = {RESTART: (RESTART,), "reset-step": (RESTART, "reset-step", "step-start")}
    resets = [i for i, (_, item) in enumerate(backlog) if item.get("type") in kept_by]
    keep = [True] * len(backlog)
    for i in resets:
        step = backlog[i][1]["step"]
        kept = kept_by[backlog[i][1]["type"]]
        dropped_seen = False
        for j in range(i):
            seq, item = backlog[j]
            if keep[j] and item.get("step") == step and item.get("type") not in kept:
                keep[j] = False
                dropped_seen = dropped_seen or seq <= seen
        keep[i] = dropped_seen
    return [pair for pair, k in zip(backlog, keep, strict=True) if k]


def sieved(backlog: list[tuple[int, Any]], seen: int) -> list[tuple[int, Any]]:
    found = _Resets()
    found.see(backlog)
    sieve = _Sieve(found, seen)
    return [pair for pair in backlog if sieve.keeps(*pair)]


KINDS = ["step-start", "text-start", "text-delta", "text-finish", "step-finish"]


@pytest.mark.parametrize("seed", range(400))
def test_the_sieve_drops_what_the_whole_backlog_reader_dropped(seed: int) -> None:
    """Random backlogs of two steps with restart markers and ``reset-step`` s (several a
    step, both kinds mixed), read by a client that had seen any prefix of them."""
    rng = random.Random(seed)
    backlog: list[tuple[int, Any]] = [(1, {"type": "start"})]
    for seq in range(2, rng.randrange(3, 30)):
        step = rng.choice([0, 1, 1])
        kind = rng.choice([*KINDS, *KINDS, RESTART, "reset-step"])
        backlog.append((seq, {"type": kind, "step": step}))
    backlog.append((len(backlog) + 1, {"type": "finish"}))
    for seen in range(len(backlog) + 1):
        assert sieved(backlog, seen) == dropped_whole(backlog, seen), seen


async def write_big_turn(relay: Any, *, restart: bool = False) -> list[Any]:
    """A turn of :data:`ENTRIES` big deltas, one entry each (with its step restarted
    half way: the first half void), and what it appended."""
    writer = relay.writer(session_id="s", turn_id="t")
    sent: list[Any] = [o.Start(message_id="m"), o.StepStart(step=0)]
    for chunk in sent:
        writer.append(chunk)
    for i in range(ENTRIES):
        if restart and i == ENTRIES // 2:
            await writer.restart_step(0)
        await writer.flushed()
        chunk = o.TextDelta(step=0, part_id="p", text=BIG[:-3] + f"{i:03}")
        writer.append(chunk)
        sent.append(chunk)
    ending = [
        o.StepFinish(step=0, finish_reason="stop", usage=USAGE),
        o.Finish(finish_reason="stop", usage=USAGE),
    ]
    for chunk in ending:
        writer.append(chunk)
    await writer.aclose()
    return [*sent, *ending]


async def test_a_reader_of_a_backlog_of_big_entries_holds_about_a_page(redis_url: str) -> None:
    # Before: one XRANGE of the 40 entries (8 MB) and every decoded item held before the
    # first was yielded: a peak of over 16 MB.
    async with opened(redis_url) as relay:
        relay.page_bytes = PAGE_BYTES
        await write_big_turn(relay)
        count = 0
        tracemalloc.start()
        try:
            with trio.fail_after(30):
                async for chunk in relay.read("t"):
                    count += 1
                    del chunk
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert count == ENTRIES + 4
    assert peak < HELD, peak


async def test_a_paged_replay_still_drops_a_restarted_step(redis_url: str) -> None:
    """The void half of the step (restarted by an older worker's marker) spans many
    pages: a fresh reader gets none of it and no marker; one that had seen part of it
    gets the marker first, then the re-run."""
    async with opened(redis_url) as relay:
        relay.page_bytes = PAGE_BYTES
        await write_big_turn(relay, restart=True)
        replay = await read_all(relay, "t")
        resumed = await read_all(relay, "t", after_seq=10)  # inside the void half
    texts = [c.text[-3:] for c in replay if c.type == "text-delta"]
    assert texts == [f"{i:03}" for i in range(ENTRIES // 2, ENTRIES)]
    assert not any(isinstance(c, StepRestarted) for c in replay)
    assert isinstance(resumed[0], StepRestarted)
    assert [c.text[-3:] for c in resumed if c.type == "text-delta"] == texts


async def test_every_resume_of_a_paged_replay_is_the_one_page_replays(redis_url: str) -> None:
    """A turn with a restart marker, a ``reset-step`` and a pause, read after each of
    its seqs: with a page of one entry (read twice, a page at a time) as with one page."""
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in text_turn(["partial"])[:4]:
            await writer.flushed()
            writer.append(chunk)
        await writer.restart_step(0)
        for chunk in text_turn(["again"])[1:5]:
            await writer.flushed()
            writer.append(chunk)
        writer.append(o.ResetStep(step=0, provider="x", error=TAKEN_OVER))
        for chunk in text_turn(["final"])[2:]:
            await writer.flushed()
            writer.append(chunk)
        await writer.aclose()
        whole = [await read_all(relay, "t", after_seq=seq) for seq in range(0, 16)]
        relay.page_bytes = 1
        paged = [await read_all(relay, "t", after_seq=seq) for seq in range(0, 16)]
    assert paged == whole
    assert [c.text for c in whole[0] if c.type == "text-delta"] == ["final"]
    assert isinstance(whole[4][0], StepRestarted)  # had seen "partial"


async def test_a_reader_that_stops_reading_holds_a_page_while_another_reads(
    redis_url: str,
) -> None:
    """Two readers at once: one stops after its first chunk (a client that reads no
    more), the other reads the whole turn; each holds a page, and the first, read on
    later, gets the whole turn too."""
    async with opened(redis_url) as relay:
        relay.page_bytes = PAGE_BYTES
        sent = await write_big_turn(relay)
        stalled = relay.read("t")
        tracemalloc.start()
        try:
            with trio.fail_after(30):
                first = [await anext(stalled)]
                other = [chunk.type async for chunk in relay.read("t")]
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        with trio.fail_after(30):
            first += [chunk async for chunk in stalled]
    assert peak < 2 * HELD, peak
    assert other == [c.type for c in sent]
    assert [attrs.evolve(c, seq=0) for c in first] == sent


async def test_a_live_reader_behind_big_entries_reads_about_a_page_at_a_time(
    redis_url: str,
) -> None:
    # Before: its XREAD asked for 256 entries whatever their size: the 20 it fell behind
    # (4 MB) came in one reply.
    replies: list[int] = []
    async with opened(redis_url) as relay:
        relay.page_bytes = PAGE_BYTES
        xread = relay.client.xread

        async def counted(*args: Any, **kwargs: Any) -> Any:
            result = await xread(*args, **kwargs)
            for entries in (result or {}).values():
                replies.append(sum(len(v) for e in entries for v in e.field_values.values()))
            return result

        relay.client.xread = counted
        writer = relay.writer(session_id="s", turn_id="t")
        writer.append(o.Start(message_id="m"))
        writer.append(o.TextDelta(step=0, part_id="p", text=BIG))
        await writer.flushed()
        reader = relay.read("t")
        with trio.fail_after(30):
            assert (await anext(reader)).type == "start"
            assert (await anext(reader)).type == "text-delta"
            for _ in range(20):  # written while the reader reads nothing
                await writer.flushed()
                writer.append(o.TextDelta(step=0, part_id="p", text=BIG))
            writer.append(o.Finish(finish_reason="stop", usage=USAGE))
            await writer.aclose()
            rest = [chunk.type async for chunk in reader]
    assert rest == ["text-delta"] * 20 + ["finish"]
    assert max(replies) < PAGE_BYTES + len(BIG) + 1000, replies


async def test_a_stream_lost_between_the_two_passes_is_gone_not_cut(redis_url: str) -> None:
    """Redis loses the stream after the first pass proved it whole: the second pass
    finds less, and the reader says the turn is gone (the front end rebuilds it), not a
    turn that ends early."""
    async with opened(redis_url) as relay:
        relay.page_bytes = PAGE_BYTES
        await write_big_turn(relay)
        page = relay._page

        async def losing(turn_id: str, key: str, start: str, stop: Any, **kw: Any) -> Any:
            if start == "-" and stop != "+":  # the second pass begins
                await relay.client.xtrim(key, "MAXLEN", 5)  # keeps only the last 5
            return await page(turn_id, key, start, stop, **kw)

        relay._page = losing
        with pytest.raises(RelayTurnGone):
            await read_all(relay, "t")


async def test_a_paged_read_stops_at_a_pause_with_nothing_after_it(redis_url: str) -> None:
    """The backlog's last item, a pause, is known for the last only once the second pass
    has read on past it (it holds back one item): the read stops there, not live."""
    async with opened(redis_url) as relay:
        relay.page_bytes = 1
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in text_turn(["asks"]):
            await writer.flushed()
            writer.append(chunk)
        await writer.aclose(paused=True)
        got = await read_all(relay, "t")
    assert [c.type for c in got] == [c.type for c in text_turn(["asks"])]


async def test_paged_reads_after_a_pause_are_the_one_page_reads(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        await paused_then_resumed(relay)
        whole = [[c async for c in relay.read("t", after_pauses=k)] for k in (0, 1)]
        relay.page_bytes = 1
        paged = [[c async for c in relay.read("t", after_pauses=k)] for k in (0, 1)]
    assert paged == whole
    assert whole[1][0].type == "start" and len(whole[1]) < len(whole[0])


async def test_a_redis_that_refuses_scripts_is_paged_with_xrange(redis_url: str) -> None:
    """Scripting denied to the relay's user (an ACL without ``@scripting``): a page is an
    ``XRANGE`` for as many entries as the page holds of the biggest seen, and the
    restarted step is dropped all the same."""
    require_redis()
    acl = ("--user", "default", "on", "nopass", "~*", "&*", "+@all", "-@scripting")
    try:
        server = RedisServer(options=acl)
    except ServiceUnavailable as exc:
        pytest.skip(f"no Redis of the test's own: {exc}")
    counts: list[int] = []
    try:
        with capture_logs() as logs:
            async with opened(server.url) as relay:
                relay.page_bytes = PAGE_BYTES
                await write_big_turn(relay, restart=True)
                xrange = relay.client.xrange

                async def counted(*args: Any, count: int, **kwargs: Any) -> Any:
                    counts.append(count)
                    return await xrange(*args, count=count, **kwargs)

                relay.client.xrange = counted
                replay = await read_all(relay, "t")
                again = await read_all(relay, "t")
    finally:
        server.close()
    texts = [c.text[-3:] for c in replay if c.type == "text-delta"]
    assert texts == [f"{i:03}" for i in range(ENTRIES // 2, ENTRIES)]
    assert again == replay
    assert [e["event"] for e in logs].count("relay.page_script_refused") == 1  # then known
    assert max(counts) <= 2  # one at first, then twice that, then one 200 KB entry a page


async def test_a_busy_redis_does_not_turn_the_page_script_off_for_good(redis_url: str) -> None:
    """A page script answered ``BUSY`` (another client's script ran past Redis's
    ``busy-reply-threshold``) is no refusal of scripting: that page is an ``XRANGE``, and
    the next read pages with the script again. Taken for a refusal, every read of the
    process after one busy moment paged with ``XRANGE``, without Redis bounding a page's
    bytes (attacknew)."""
    from coredis.exceptions import ResponseError

    async with opened(redis_url) as relay:
        relay.page_bytes = PAGE_BYTES
        await write_big_turn(relay)
        evaluate = relay.client.eval
        busy = [1]

        async def busy_once(*args: Any, **kwargs: Any) -> Any:
            if busy:
                busy.pop()
                raise ResponseError("BUSY Redis is busy running a script.")
            return await evaluate(*args, **kwargs)

        relay.client.eval = busy_once
        with capture_logs() as logs:
            first = await read_all(relay, "t")
            assert not relay.scripts_refused
            again = await read_all(relay, "t")
    assert again == first and len(first) == ENTRIES + 4
    assert not [e for e in logs if e["event"] == "relay.page_script_refused"]
