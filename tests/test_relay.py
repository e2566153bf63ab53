"""The Redis Streams relay against a real Redis: order, resume, coalescing, restarts, loss."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.relays import RedisRelay, attach_relay
from actors.relays.redis_entries import GAP
from runtime import Agent, Host
from runtime import output as o
from runtime.chunks import Usage
from runtime.errors import ConfigurationError, RelayTurnGone, RelayUnavailable
from runtime.messages import AssistantMessage
from runtime.relay import Relay, RelayWriter, StepRestarted
from tests.support.redis import (
    redis_restored,
    require_redis,
    start_redis,
    stop_redis,
    unique_prefix,
)

USAGE = Usage(input_tokens=1, output_tokens=1, total_tokens=2)


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def opened(url: str, **options: Any) -> Any:
    return RedisRelay.open(url, prefix=unique_prefix(), **options)


def text_turn(step_texts: list[str]) -> list[Any]:
    """A small turn's output chunks (producer seqs all 0: the relay stamps its own)."""
    out: list[Any] = [o.Start(message_id="m1", turn_id="t", session_id="s")]
    for step, text in enumerate(step_texts):
        pid = f"p{step}"
        out += [
            o.StepStart(step=step),
            o.TextStart(step=step, part_id=pid),
            o.TextDelta(step=step, part_id=pid, text=text),
            o.TextFinish(step=step, part_id=pid),
            o.StepFinish(step=step, finish_reason="stop", usage=USAGE),
        ]
    return [*out, o.Finish(finish_reason="stop", usage=USAGE)]


@contextmanager
def counted_tail_reads(relay: Any) -> Iterator[list[Any]]:
    """The arguments of every ``XREVRANGE`` the relay's coredis client sends inside (a
    tail read through coredis, not the flusher's pipeline)."""
    tails: list[Any] = []
    xrevrange = relay.client.xrevrange

    async def counted(*args: Any, **kwargs: Any) -> Any:
        tails.append(args)
        return await xrevrange(*args, **kwargs)

    relay.client.xrevrange = counted
    try:
        yield tails
    finally:
        relay.client.xrevrange = xrevrange


async def read_all(relay: Any, turn_id: str, after_seq: int | None = None) -> list[Any]:
    with trio.fail_after(10):
        return [c async for c in relay.read(turn_id, after_seq=after_seq)]


async def read_when_published(relay: Any, turn_id: str) -> list[Any]:
    """The turn read back once the publisher's first flush made it exist (the local
    consumer may finish before the publisher actor's writer flushed at all)."""
    with trio.fail_after(10):
        while True:
            try:
                return await read_all(relay, turn_id)
            except RelayTurnGone:
                await trio.sleep(0.01)


async def test_relay_meets_the_contract(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        assert isinstance(relay, Relay)
        assert isinstance(relay.writer(session_id="s", turn_id="t"), RelayWriter)


async def test_a_hosts_turn_reads_back_in_order_with_relay_seqs(redis_url: str) -> None:
    async with opened(redis_url) as relay, Host.open(log_tap=False) as host:
        await attach_relay(host, relay)
        agent = Agent(name="a", provider=ScriptedProvider.demo())
        session = await host.open_session(agent, session_id="s1")
        async with session.stream("hello") as out:
            local = await out.collect()
        got = await read_when_published(relay, out.turn_id)
    assert [c.type for c in got] == [c.type for c in local]
    assert [c.seq for c in got] == list(range(1, len(local) + 1))
    assert [getattr(c, "text", None) for c in got] == [getattr(c, "text", None) for c in local]


async def test_resume_after_a_seq_misses_and_repeats_nothing(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in text_turn(["a", "b"]):
            writer.append(chunk)
        await writer.aclose()
        full = await read_all(relay, "t")
        for after in (0, 1, 5, len(full) - 1, len(full)):
            assert await read_all(relay, "t", after_seq=after) == full[after:]


async def test_a_live_reader_gets_every_chunk_as_the_turn_runs(redis_url: str) -> None:
    async with opened(redis_url, block_ms=50) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        chunks = text_turn(["one", "two", "three"])
        writer.append(chunks[0])
        await writer.flushed()
        got: list[Any] = []

        async def read() -> None:
            got.extend(await read_all(relay, "t"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            for chunk in chunks[1:]:
                await trio.sleep(0.01)
                writer.append(chunk)
            await writer.aclose()
    assert [c.type for c in got] == [c.type for c in chunks]


async def test_appends_queued_together_are_written_in_one_flush(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        writer.append(o.Start(message_id="m"))
        for i in range(1000):
            writer.append(o.TextDelta(step=0, part_id="p", text=str(i)))
        await writer.aclose()
        got = await read_all(relay, "t")
    assert writer.flushes == 1  # 1002 items (with the end) in one pipeline
    assert [c.text for c in got[1:]] == [str(i) for i in range(1000)]


async def test_a_backlog_of_more_entries_than_a_page_replays_whole(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        writer.append(o.Start(message_id="m"))
        for i in range(300):  # one flush, so one entry, each
            await writer.flushed()
            writer.append(o.TextDelta(step=0, part_id="p", text=str(i)))
        await writer.aclose()
        got = await read_all(relay, "t")
    assert writer.flushes > 256
    assert [c.text for c in got[1:]] == [str(i) for i in range(300)]


async def test_a_restarted_step_is_dropped_from_a_replay(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        first_try = text_turn(["partial"])[:4]  # start, step-start, text-start, "partial"
        for chunk in first_try:
            writer.append(chunk)
        await writer.restart_step(0)
        for chunk in text_turn(["final"])[1:]:
            writer.append(chunk)
        await writer.aclose()
        replay = await read_all(relay, "t")
        resumed = await read_all(relay, "t", after_seq=3)  # had seen start..text-start
    assert [getattr(c, "text", None) for c in replay if c.type == "text-delta"] == ["final"]
    assert not any(isinstance(c, StepRestarted) for c in replay)
    assert isinstance(resumed[0], StepRestarted) and resumed[0].step == 0
    assert [c.text for c in resumed if c.type == "text-delta"] == ["final"]


TAKEN_OVER = o.ErrorInfo(kind="Takeover", message="another worker runs it again")


async def test_a_takeover_finds_what_the_dead_writer_showed_of_its_step(redis_url: str) -> None:
    """``shown``: nothing of a step the stream does not hold; the parts it left open
    otherwise; only what followed the step's last reset."""
    async with opened(redis_url) as relay:
        dead = relay.writer(session_id="s", turn_id="t")
        for chunk in [*text_turn(["done"])[:-1], o.StepStart(step=1)]:
            dead.append(chunk)
        dead.append(o.ReasoningStart(step=1, part_id="r"))
        dead.append(o.ReasoningFinish(step=1, part_id="r"))
        dead.append(o.TextStart(step=1, part_id="p"))
        dead.append(o.TextDelta(step=1, part_id="p", text="half"))
        await dead.aclose(final=False)
        taker = relay.writer(session_id="s", turn_id="t", takeover=True)
        assert await taker.shown(2) is None  # nothing of step 2 went out
        assert await taker.shown(1) == [o.TextFinish(step=1, part_id="p")]
        taker.append(o.TextFinish(step=1, part_id="p"))
        taker.append(o.ResetStep(step=1, provider="x", error=TAKEN_OVER))
        await taker.aclose(final=False)
        again = relay.writer(session_id="s", turn_id="t", takeover=True)
        assert await again.shown(1) == []  # reset, nothing since: still shown, none open
        await again.aclose()


async def test_a_takeover_after_a_step_committed_and_not_streamed_whole_is_a_gap(
    redis_url: str,
) -> None:
    """The dead worker committed step 0 (the takeover re-runs step 1) but died before it
    streamed that step's end: readers are told the stream is not whole (a ``gap``: they
    rebuild the turn from the store). Before, the takeover's step 1 followed step 0's
    tool call as if the step had ended, its result never shown (the chaos run found it).
    A step that ended in the stream is no gap."""
    async with opened(redis_url) as relay:
        dead = relay.writer(session_id="s", turn_id="t")
        dead.append(o.Start(message_id="m1", turn_id="t", session_id="s"))
        dead.append(o.StepStart(step=0))
        dead.append(o.ToolInputStart(step=0, tool_call_id="c", tool_name="record"))
        dead.append(o.ToolCall(step=0, tool_call_id="c", tool_name="record", input={}))
        await dead.aclose(final=False)  # died: no tool-result, no step-finish streamed
        taker = relay.writer(session_id="s", turn_id="t", takeover=True)
        assert await taker.shown(1) is None
        for chunk in text_turn(["", "after"])[-6:]:  # step 1 whole, then the finish
            taker.append(chunk)
        await taker.aclose()
        with pytest.raises(RelayTurnGone):
            await read_all(relay, "t")
        whole = relay.writer(session_id="s", turn_id="u")
        for chunk in text_turn(["first", "second"])[:-6]:  # through step 0's step-finish
            whole.append(chunk)
        await whole.aclose(final=False)
        again = relay.writer(session_id="s", turn_id="u", takeover=True)
        assert await again.shown(1) is None
        await again.aclose()
        assert [c.type for c in await read_all(relay, "u")][-1] == "step-finish"


async def test_a_continuation_whose_stream_has_no_pause_is_a_gap(redis_url: str) -> None:
    """The worker that suspended the turn committed the wait and died before it streamed
    the pause: the continuation (``resumed``) finds a stream that does not end with it,
    and readers are told the stream is not whole. Before, the continuation followed the
    first part with no pause between (its ``start`` dropped as a takeover's repeat, a
    reader waiting for the pause never given the continuation; the chaos run found it).
    A stream that ends with its pause goes on as before."""
    asked = [
        o.Start(message_id="m1", turn_id="t", session_id="s"),
        o.StepStart(step=0),
        o.ToolCall(step=0, tool_call_id="c", tool_name="guarded", input={}),
        o.StepFinish(step=0, finish_reason="tool-calls", usage=USAGE),
    ]
    goes_on = [
        o.Start(message_id="m1", turn_id="t", session_id="s"),
        o.ToolResult(step=0, tool_call_id="c", tool_name="guarded", output="ok"),
        *text_turn(["", "after"])[-6:],
    ]
    async with opened(redis_url) as relay:
        for turn_id, paused in (("died", False), ("waited", True)):
            first = relay.writer(session_id="s", turn_id=turn_id)
            for chunk in asked:
                first.append(chunk)
            await first.aclose(final=paused, paused=paused)
            then = relay.writer(session_id="s", turn_id=turn_id, takeover=True, resumed=True)
            for chunk in goes_on:
                then.append(chunk)
            await then.aclose()
        with pytest.raises(RelayTurnGone):
            await read_all(relay, "died")
        whole = await read_all(relay, "waited", after_seq=len(asked))
    assert [c.type for c in whole][:2] == ["start", "tool-result"]
    assert whole[-1].type == "finish"


async def test_a_reset_step_drops_the_void_chunks_from_a_replay_but_keeps_the_step_start(
    redis_url: str,
) -> None:
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in text_turn(["partial"])[:4]:  # start, step-start, text-start, "partial"
            writer.append(chunk)
        writer.append(o.TextFinish(step=0, part_id="p0"))
        writer.append(o.ResetStep(step=0, provider="x", error=TAKEN_OVER))
        for chunk in text_turn(["final"])[2:]:
            writer.append(chunk)
        await writer.aclose()
        replay = await read_all(relay, "t")
        resumed = await read_all(relay, "t", after_seq=3)  # had seen start..text-start
    assert [c.type for c in replay[:3]] == ["start", "step-start", "text-start"]
    assert [c.text for c in replay if c.type == "text-delta"] == ["final"]
    assert not any(c.type == "reset-step" for c in replay)
    assert resumed[0].type == "reset-step"
    assert [c.text for c in resumed if c.type == "text-delta"] == ["final"]


async def test_a_takeover_writer_continues_the_seqs(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        first = relay.writer(session_id="s", turn_id="t")
        chunks = text_turn(["x"])
        for chunk in chunks[:3]:
            first.append(chunk)
        await first.aclose(final=False)
        second = relay.writer(session_id="s", turn_id="t")
        for chunk in chunks[3:]:
            second.append(chunk)
        await second.aclose()
        got = await read_all(relay, "t")
    assert [c.seq for c in got] == list(range(1, len(chunks) + 1))


async def test_a_fresh_writer_reads_no_tail_and_its_turn_reads_back_whole(
    redis_url: str,
) -> None:
    """A worker's first claim of a turn says ``fresh``: the first flush is the XADD
    alone (no XREVRANGE of a tail there cannot be), and the seqs still start at 1."""
    async with opened(redis_url) as relay:
        with counted_tail_reads(relay) as tails:
            writer = relay.writer(session_id="s", turn_id="t", fresh=True)
            chunks = text_turn(["x", "y"])
            for chunk in chunks:
                writer.append(chunk)
            await writer.aclose()
        got = await read_all(relay, "t")
    assert tails == []
    assert [c.seq for c in got] == list(range(1, len(chunks) + 1))


async def test_a_continuing_writer_reads_the_tail_in_the_flushers_pipeline(
    redis_url: str,
) -> None:
    """A writer that goes on in a stream (a continuation, a takeover) reads its tail on
    the writers' own connection, as a job of the flusher's pipeline: no coredis call
    (a task and ~190 us of the loop's CPU each), the seqs following on, the writer it
    continues named, then its entries in the pipeline after."""
    async with opened(redis_url) as relay:
        assert relay.batcher.connection is not None  # a plain URL: the RESP connection
        chunks = text_turn(["x", "y"])
        first = relay.writer(session_id="s", turn_id="t", fresh=True)
        for chunk in chunks[:3]:
            first.append(chunk)
        await first.aclose(final=False)
        with counted_tail_reads(relay) as tails:
            pipelines = relay.batcher.pipelines
            second = relay.writer(session_id="s", turn_id="t", takeover=True)
            for chunk in chunks[3:]:
                second.append(chunk)
            await second.aclose()
        got = await read_all(relay, "t")
        entries = await relay.client.xrevrange(relay.turn_key("t"), "+", "-", count=100)
    assert tails == []
    assert relay.batcher.pipelines - pipelines >= 2  # the tail's, then the entries'
    assert [c.seq for c in got] == list(range(1, len(chunks) + 1))
    (opening, *_) = [e for e in reversed(entries) if e.field_values[b"w"] == second.writer_id]
    assert opening.field_values[b"prev"] == first.writer_id  # the writer it continues
    assert second.failures == 0


async def test_a_takeover_that_finds_no_stream_through_the_pipeline_says_gap(
    redis_url: str,
) -> None:
    """The tail read in the flusher's pipeline keeps what it said: a takeover that finds
    no stream starts one whose readers are told the turn's start is lost (re-running
    from step 1: step 0 was committed; from step 0 see test_relay_takeover_empty)."""
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="gone", takeover=True)
        for chunk in text_turn(["committed", "x"])[6:]:
            writer.append(chunk)
        await writer.aclose()
        entries = await relay.client.xrevrange(relay.turn_key("gone"), "+", "-", count=10)
    items = [
        item["type"]
        for entry in reversed(entries)
        for item in json.loads(entry.field_values[b"items"])
    ]
    assert items[0] == GAP


async def test_an_unknown_turn_is_a_lookup_error(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        with pytest.raises(LookupError, match="no stream for turn 'nope'"):
            await read_all(relay, "nope")


async def test_a_stream_that_vanishes_under_a_live_reader_is_reported(redis_url: str) -> None:
    async with opened(redis_url, block_ms=20) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        writer.append(o.Start(message_id="m"))
        await writer.flushed()
        errors: list[BaseException] = []

        async def read() -> None:
            try:
                await read_all(relay, "t")
            except RelayTurnGone as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.sleep(0.1)
            await relay.client.delete([relay.turn_key("t")])
    assert len(errors) == 1 and "expired or was lost" in str(errors[0])


async def test_an_overflowing_queue_says_chunks_were_lost(redis_url: str) -> None:
    async with opened(redis_url, max_queue=5) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in text_turn(["a", "b"]):  # 12 chunks queued before any flush
            writer.append(chunk)
        await writer.aclose()
        assert writer.lost > 0
        with pytest.raises(RelayTurnGone, match="lost part of turn"):
            await read_all(relay, "t")


async def test_active_turn_is_the_running_one_and_none_once_it_ended(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        writer.append(o.Start(message_id="m"))
        await writer.flushed()
        assert await relay.active_turn("s") == "t"
        await writer.aclose()
        assert await relay.active_turn("s") is None
        assert await relay.active_turn("other") is None


async def test_a_turn_this_process_writes_is_held_before_redis_has_any_of_it(
    redis_url: str,
) -> None:
    """An AG-UI runId used again at once (its first turn's answer sent, its writer's last
    flush not yet written) found no stream in Redis, and the new turn took the same id
    and wrote into that stream: the writers this process holds count as held."""
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        assert await relay.client.exists([relay.turn_key("t")]) == 0  # nothing written
        assert await relay.holds_turn("t")
        writer.append(o.Start(message_id="m"))
        await writer.aclose()
        assert await relay.holds_turn("t")  # now from Redis
        assert not await relay.holds_turn("other")


async def test_a_bad_url_is_a_clear_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="bad Redis URL 'http://u:\\[redacted\\]@x"):
        async with RedisRelay.open("http://u:secret@x:1"):
            pass


async def test_an_unreachable_redis_is_relay_unavailable_after_retries() -> None:
    with pytest.raises(RelayUnavailable, match=r"Redis at redis://127\.0\.0\.1:1/0 did not answer"):
        async with RedisRelay.open("redis://127.0.0.1:1/0", retry_for=0.3):
            pass


async def test_cancel_requests_reach_the_host_that_runs_the_turn(redis_url: str) -> None:
    prefix = unique_prefix()
    provider = ScriptedProvider(["word " * 200], delay=0.01)
    async with (
        RedisRelay.open(redis_url, prefix=prefix) as runner_relay,
        RedisRelay.open(redis_url, prefix=prefix) as other_relay,
        Host.open(log_tap=False) as host,
    ):
        await attach_relay(host, runner_relay)
        session = await host.open_session(Agent(name="a", provider=provider), session_id="s")
        async with session.stream("go") as out:
            async for chunk in out:
                if chunk.type == "text-delta":
                    assert await other_relay.request_cancel(out.turn_id, "stopped") >= 1
                    break
            with trio.fail_after(10):  # the result arrives on the stream, after the abort
                rest = [chunk.type async for chunk in out]
    assert rest[-1] == "abort"
    assert out.result.finish_reason == "aborted" or out.result.abort_reason == "stopped"
    assert isinstance(session.messages[-1], AssistantMessage)
    assert session.messages[-1].interrupted


async def test_redis_restarted_mid_turn_loses_nothing_committed(redis_url: str) -> None:
    provider = ScriptedProvider(["tick " * 120], delay=0.01)
    with redis_restored():
        async with opened(redis_url, retry_base=0.02, retry_max=0.2) as relay:
            async with Host.open(log_tap=False) as host:
                publisher = await attach_relay(host, relay)
                session = await host.open_session(Agent(name="a", provider=provider))
                async with session.stream("go") as out:
                    seen = 0
                    async for _chunk in out:
                        seen += 1
                        if seen == 20:
                            await trio.to_thread.run_sync(stop_redis)
                        if seen == 60:
                            await trio.to_thread.run_sync(start_redis)
                assert out.result.finish_reason == "stop"
                text = "".join(p.text for p in session.messages[-1].content)
                assert text == "tick " * 120
                # The turn's writer is closed at its end. The publisher is a bus observer:
                # it may take the turn's last chunks just after the consumer did.
                with trio.fail_after(5):
                    while publisher.writers:  # noqa: ASYNC110 - an observer's state
                        await trio.sleep(0.01)
                # The relay lost what Redis held (nosave): a reader is told, not misled.
                with pytest.raises(LookupError):
                    await read_all(relay, out.turn_id)


def long_turn(prefix: str, words: int) -> list[Any]:
    """A one-step turn of ``words`` text deltas (start, step-start, text-start, deltas...)."""
    head: list[Any] = [
        o.Start(message_id="m1"),
        o.StepStart(step=0),
        o.TextStart(step=0, part_id=prefix),
    ]
    deltas = [o.TextDelta(step=0, part_id=prefix, text=f"{prefix}{i} ") for i in range(words)]
    tail = [
        o.TextFinish(step=0, part_id=prefix),
        o.StepFinish(step=0, finish_reason="stop", usage=USAGE),
        o.Finish(finish_reason="stop", usage=USAGE),
    ]
    return [*head, *deltas, *tail]


async def take_over(relay: Any, chunks: list[Any]) -> None:
    """What a takeover's worker streams: the message's start again, the restarted
    step's marker, then the step run again to the end."""
    writer = relay.writer(session_id="s", turn_id="t", takeover=True)
    writer.append(chunks[0])
    await writer.restart_step(0)
    for chunk in chunks[1:]:
        writer.append(chunk)
    await writer.aclose()


async def test_a_takeover_of_a_stream_redis_lost_is_gone_for_the_readers_that_saw_part_of_it(
    redis_url: str,
) -> None:
    first_try = long_turn("a", 25)[:28]  # seqs 1..28: start, step-start, text-start, 25 deltas
    with redis_restored():
        async with opened(redis_url, retry_base=0.02, retry_max=0.2) as relay:
            dead = relay.writer(session_id="s", turn_id="t")
            for chunk in first_try:
                dead.append(chunk)
            await dead.flushed()
            live = relay.read("t", after_seq=24)
            assert [(await anext(live)).seq for _ in range(4)] == [25, 26, 27, 28]
            await trio.to_thread.run_sync(stop_redis)  # Redis loses the stream
            await trio.to_thread.run_sync(start_redis)
            await take_over(relay, long_turn("b", 40))  # numbers from 1 again, past 29
            with pytest.raises(RelayTurnGone), trio.fail_after(10):
                await anext(live)  # the reader that had 25..28 from the dead worker
            with pytest.raises(RelayTurnGone):
                await read_all(relay, "t", after_seq=28)  # a client resuming after 28
            # A fresh reader: the takeover re-ran the turn from step 0, its stream is the
            # whole turn (what the dead worker streamed was void: relaymend)
            fresh = await read_all(relay, "t")
    assert "".join(c.text for c in fresh if c.type == "text-delta").startswith("b0 b1 ")


async def test_a_takeover_that_found_the_stream_continues_it_for_every_reader(
    redis_url: str,
) -> None:
    async with opened(redis_url) as relay:
        dead = relay.writer(session_id="s", turn_id="t")
        for chunk in long_turn("a", 5)[:6]:
            dead.append(chunk)
        await dead.flushed()
        await take_over(relay, long_turn("b", 3))
        full = await read_all(relay, "t")
        resumed = await read_all(relay, "t", after_seq=6)
    assert [c.text for c in full if c.type == "text-delta"] == ["b0 ", "b1 ", "b2 "]
    assert isinstance(resumed[0], StepRestarted)
    assert [c.text for c in resumed if c.type == "text-delta"] == ["b0 ", "b1 ", "b2 "]


async def test_a_resumed_stream_does_not_repeat_start_after_a_takeover(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        dead = relay.writer(session_id="s", turn_id="t")
        for chunk in long_turn("a", 1)[:4]:
            dead.append(chunk)
        await dead.flushed()
        await take_over(relay, long_turn("b", 1))
        full = await read_all(relay, "t")
        resumed = await read_all(relay, "t", after_seq=4)
    assert [c.type for c in full].count("start") == 1
    assert "start" not in [c.type for c in resumed]


async def test_a_writer_the_turn_lost_is_not_spliced_into_the_takeovers_stream(
    redis_url: str,
) -> None:
    chunks = long_turn("a", 8)
    async with opened(redis_url) as relay:
        zombie = relay.writer(session_id="s", turn_id="t")
        for chunk in chunks[:3]:
            zombie.append(chunk)
        await zombie.flushed()  # seqs 1..3
        successor = relay.writer(session_id="s", turn_id="t", takeover=True)
        for chunk in chunks[3:5]:
            successor.append(chunk)
        await successor.flushed()  # seqs 4..5
        for chunk in chunks[5:8]:
            zombie.append(chunk)  # at 4: refused, Redis has an entry there
        await zombie.flushed()
        successor.append(chunks[8])
        await successor.flushed()  # seq 6
        zombie.append(chunks[9])
        await zombie.flushed()  # seq 7: the lost writer's, right after the successor's 6
        with pytest.raises(RelayTurnGone, match="written over"):
            await read_all(relay, "t")


async def test_a_resume_after_a_seq_the_stream_never_held_is_the_turn_gone(
    redis_url: str,
) -> None:
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in long_turn("a", 1)[:3]:
            writer.append(chunk)
        await writer.flushed()
        with pytest.raises(RelayTurnGone, match="ends at seq 3, before seq 9"):
            await read_all(relay, "t", after_seq=9)  # the client read another stream


JUNK_ENTRIES = {
    "items not JSON": {"first": "1", "items": "not json"},
    "no first": {"items": '[{"type": "start", "message_id": "m"}]'},
    "first not its id": {"first": "3", "items": '[{"type": "start", "message_id": "m"}]'},
    "items not an array": {"first": "1", "items": '{"type": "start"}'},
    "an item not an object": {"first": "1", "items": "[1]"},
    "an unknown chunk type": {"first": "1", "items": '[{"type": "bogus"}]'},
    "a chunk missing fields": {"first": "1", "items": '[{"type": "text-delta"}]'},
    "a restart without its step": {"first": "1", "items": '[{"type": "relay.restart-step"}]'},
}


@pytest.mark.parametrize("fields", JUNK_ENTRIES.values(), ids=JUNK_ENTRIES.keys())
async def test_an_undecodable_entry_is_the_turn_gone(redis_url: str, fields: Any) -> None:
    async with opened(redis_url) as relay:
        await relay.client.xadd(relay.turn_key("t"), fields, identifier="1-1")
        await relay.client.set(relay.active_key("s"), "t")
        assert await relay.active_turn("s") == "t"  # a reader of it then rebuilds
        with pytest.raises(RelayTurnGone, match="junk"):
            await read_all(relay, "t")


async def test_an_undecodable_entry_after_good_ones_is_the_turn_gone(redis_url: str) -> None:
    async with opened(redis_url, block_ms=20) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        writer.append(o.Start(message_id="m"))
        await writer.flushed()
        reader = relay.read("t")
        assert (await anext(reader)).type == "start"
        junk = {"first": "2", "items": "[}"}
        await relay.client.xadd(relay.turn_key("t"), junk, identifier="2-1")
        with pytest.raises(RelayTurnGone, match="junk"), trio.fail_after(10):
            await anext(reader)


async def test_a_turn_key_of_another_type_is_the_turn_gone(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        await relay.client.set(relay.turn_key("t"), "not a stream")
        await relay.client.set(relay.active_key("s"), "t")
        assert await relay.active_turn("s") == "t"
        with pytest.raises(RelayTurnGone, match="not a stream"):
            await read_all(relay, "t")


async def test_a_session_key_of_another_type_or_not_a_turn_id_is_no_turn(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        await relay.client.rpush(relay.active_key("list"), ["t"])
        await relay.client.set(relay.active_key("nul"), b"t\x00x")
        assert await relay.active_turn("list") is None
        assert await relay.active_turn("nul") is None


async def test_a_writer_continues_after_junk_and_readers_are_told(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        await relay.client.xadd(relay.turn_key("t"), {"junk": "1"}, identifier="5-1")
        writer = relay.writer(session_id="s", turn_id="t")
        writer.append(o.Start(message_id="m"))
        await writer.aclose()
        assert writer.flushes == 1 and writer.lost == 0
        with pytest.raises(RelayTurnGone):
            await read_all(relay, "t")


# -- a turn that waits for input: a pause in its stream ------------------------------------


async def paused_then_resumed(relay: Any) -> tuple[list[Any], list[Any]]:
    """A turn's first part, ended by a pause, and its continuation by another writer
    (another worker) in the same stream; the chunks each wrote."""
    first = text_turn(["asks"])
    writer = relay.writer(session_id="s", turn_id="t")
    for chunk in first:
        writer.append(chunk)
    await writer.aclose(paused=True)
    second = text_turn(["goes on"])
    writer = relay.writer(session_id="s", turn_id="t", takeover=True)
    for chunk in second:
        writer.append(chunk)
    await writer.aclose()
    return first, second


async def test_a_read_stops_at_a_pause_with_nothing_after_it(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in text_turn(["asks"]):
            writer.append(chunk)
        await writer.aclose(paused=True)
        got = await read_all(relay, "t")
        active = await relay.active_turn("s")
    assert [c.type for c in got] == [c.type for c in text_turn(["asks"])]
    assert active is None  # a waiting turn streams nothing now


async def test_a_continuation_goes_on_in_the_same_stream_with_its_seqs_following(
    redis_url: str,
) -> None:
    async with opened(redis_url) as relay:
        first, second = await paused_then_resumed(relay)
        whole = await read_all(relay, "t")
        after_first = await read_all(relay, "t", after_seq=len(first))
    seqs = [c.seq for c in whole]
    assert seqs == [*range(1, len(first) + 1), *range(len(first) + 2, len(first) + len(second) + 2)]
    assert [c.type for c in whole] == [c.type for c in first + second]  # the start again
    assert after_first == whole[len(first) :]  # the client that saw the first part


async def test_a_read_after_the_first_pause_waits_for_the_continuation(redis_url: str) -> None:
    async with opened(redis_url, block_ms=50) as relay:
        writer = relay.writer(session_id="s", turn_id="t")
        for chunk in text_turn(["asks"]):
            writer.append(chunk)
        await writer.aclose(paused=True)
        got: list[Any] = []

        async def read() -> None:
            with trio.fail_after(10):
                got.extend([c async for c in relay.read("t", after_pauses=1)])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            await trio.sleep(0.2)  # the reader waits live: nothing after the pause yet
            assert got == []
            writer = relay.writer(session_id="s", turn_id="t", takeover=True)
            for chunk in text_turn(["goes on"]):
                writer.append(chunk)
            await writer.aclose()
    assert [getattr(c, "text", None) for c in got if c.type == "text-delta"] == ["goes on"]
    assert got[0].type == "start" and got[0].message_id == "m1"


# -- the writers' pipelines: many writers' flushes in one, on a RESP connection --------------


def test_plain_urls_get_the_writers_own_connection_and_others_coredis() -> None:
    from actors.relays.resp import Address, address

    assert address("redis://h:7000/3") == Address(host="h", port=7000, db=3)
    assert address("redis://u:p%40ss@h") == Address(host="h", username="u", password="p@ss")
    assert address("redis://:pw@h/0") == Address(host="h", password="pw")
    assert address("unix:///run/r.sock?db=2") == Address(path="/run/r.sock", db=2)
    others = ("rediss://h:1/0", "redis://h/0?ssl_cert_reqs=none", "redis://h/x", "redis://u@h")
    for other in (*others, "http://h"):
        assert address(other) is None, other


@pytest.mark.parametrize("resp", [True, False], ids=["resp", "coredis"])
async def test_writers_flushing_together_share_pipelines_and_each_reads_back_whole(
    redis_url: str, resp: bool
) -> None:
    async with opened(redis_url) as relay:
        if not resp:
            relay.batcher.connection = None  # what a URL the RESP connection does not serve gets
        writers = [relay.writer(session_id=f"s{i}", turn_id=f"t{i}", fresh=True) for i in range(8)]
        turn = text_turn(["a", "b"])
        for chunk in turn:
            for writer in writers:
                writer.append(chunk)
            await trio.lowlevel.checkpoint()
        for writer in writers:
            await writer.aclose()
        for i in range(8):
            got = await read_all(relay, f"t{i}")
            assert [c.type for c in got] == [c.type for c in turn]
            assert [c.seq for c in got] == list(range(1, len(turn) + 1))
            assert await relay.client.get(relay.active_key(f"s{i}")) == f"t{i}".encode()
            assert 0 < await relay.client.ttl(relay.turn_key(f"t{i}")) <= relay.end_ttl
    assert relay.batcher.pipelines < sum(w.flushes for w in writers)


async def test_a_refused_flush_fails_only_its_writer_in_a_shared_pipeline(redis_url: str) -> None:
    async with opened(redis_url) as relay:
        await relay.client.set(relay.turn_key("bad"), "not a stream")
        bad = relay.writer(session_id="s1", turn_id="bad", fresh=True)
        good = relay.writer(session_id="s2", turn_id="good", fresh=True)
        for chunk in text_turn(["x"]):
            bad.append(chunk)
            good.append(chunk)
        await good.aclose()
        with trio.move_on_after(0.5):
            await bad.aclose()
        assert [c.type for c in await read_all(relay, "good")] == [c.type for c in text_turn(["x"])]
        assert good.failures == 0 and bad.failures >= 1
