"""When a relay writer flushes (docs/relay.md, "Coalescing and Redis down").

A turn's first flush goes at once; a later one within ``flush_interval`` of the writer's
previous one waits for the relay's shared tick, so a burst is one ``XADD`` and writers
that flush at one tick share a pipeline; the turn's last chunk waits (at most
``end_wait``) for the close, so the end goes with it. The timing tests run the real
writers and batcher on Trio's virtual clock against a stand-in for the RESP connection;
the last test reads a real Redis back.
"""

from __future__ import annotations

import random
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from actors.relays import RedisRelay
from actors.relays.redis_streams import END_WAIT, FLUSH_INTERVAL
from runtime import output as o
from runtime.chunks import Usage
from tests.support.calls import python_calls
from tests.support.redis import require_redis, unique_prefix
from tests.support.steps import scopes_counted

USAGE = Usage(input_tokens=1, output_tokens=1, total_tokens=2)


class Pipes:
    """Stands in for the writers' RESP connection: records each pipeline it is sent,
    with the virtual time it went out."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, list[list[Any]]]] = []
        self.stalls = 0
        """How many of the next pipelines hang (a minute: a Redis that does not answer)."""

    async def pipeline(self, commands: list[list[Any]]) -> list[Any]:
        self.sent.append((trio.current_time(), commands))
        stalled, self.stalls = self.stalls > 0, max(self.stalls - 1, 0)
        await trio.sleep(60.0 if stalled else 0.0002)  # a round trip
        # a tail's read finds no stream; every other command is answered "ok"
        return [[] if command[0] == "XREVRANGE" else b"ok" for command in commands]

    async def aclose(self) -> None:
        pass

    def entries(self) -> list[tuple[float, str, list[str]]]:
        """Every ``XADD`` sent: (when, the stream's key, its items' types)."""
        got = []
        for when, commands in self.sent:
            for command in commands:
                if command[0] == "XADD":
                    items = orjson.loads(command[command.index("items") + 1])
                    got.append((when, command[1], [item["type"] for item in items]))
        return got


@asynccontextmanager
async def fake_relay(**options: Any) -> AsyncIterator[tuple[RedisRelay, Pipes]]:
    async with trio.open_nursery() as nursery:
        relay = RedisRelay(None, nursery, **options)
        pipes = Pipes()
        relay.batcher.connection = pipes  # type: ignore[assignment]
        yield relay, pipes
        nursery.cancel_scope.cancel()


async def started_writer(relay: RedisRelay) -> Any:
    """Turn ``t``'s writer, its ``start`` already written (a turn's first flush goes at
    once; what a test pins comes after it)."""
    writer = relay.writer(session_id="s", turn_id="t", fresh=True)
    writer.append(o.Start(message_id="m"))
    await writer.flushed()
    return writer


def delta(i: int) -> o.TextDelta:
    return o.TextDelta(step=0, part_id="p", text=f" w{i}")


async def test_a_turns_first_chunk_is_written_without_waiting(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        start = trio.current_time()
        writer.append(o.Start(message_id="m"))
        await writer.flushed()
        assert [(when, types) for when, _, types in pipes.entries()] == [(start, ["start"])]
        # A chunk that comes a while after the previous flush is not held either.
        await trio.sleep(10 * FLUSH_INTERVAL)
        later = trio.current_time()
        writer.append(delta(0))
        await writer.flushed()
        assert pipes.entries()[-1][0] == later


async def test_a_burst_of_chunks_is_one_write(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        first = trio.current_time()
        for i in range(20):  # a delta every 0.2 ms: a burst
            writer.append(delta(i))
            await trio.sleep(FLUSH_INTERVAL / 25)
        await writer.flushed()
        entries = pipes.entries()
        assert [types for _, _, types in entries] == [["start"], ["text-delta"] * 20]
        assert entries[1][0] <= first + FLUSH_INTERVAL  # held until the tick, no longer
        assert writer.flushes == 2


async def test_writers_flushing_at_one_tick_share_one_pipeline(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writers = [relay.writer(session_id=f"s{i}", turn_id=f"t{i}", fresh=True) for i in range(8)]
        for writer in writers:
            writer.append(o.Start(message_id="m"))
        await trio.sleep(FLUSH_INTERVAL / 10)
        # At once: in the pipeline going out, or the next one when it is back.
        assert all(when < FLUSH_INTERVAL / 10 for when, _, _ in pipes.entries())
        assert len(pipes.entries()) == 8
        opening = len(pipes.sent)
        for i in range(5):  # the writers' next chunks come at different moments
            for writer in writers:
                writer.append(delta(i))
                await trio.sleep(FLUSH_INTERVAL / 100)
        for writer in writers:
            await writer.flushed()
        assert len(pipes.sent) == opening + 1  # the 8 writers' second flushes: one pipeline
        assert sorted(key for _, key, _ in pipes.entries()[8:]) == sorted(
            relay.turn_key(f"t{i}") for i in range(8)
        )
        assert sum(w.flushes for w in writers) == 16


async def test_a_step_start_after_a_quiet_spell_waits_for_the_tick_with_the_steps_content(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        await trio.sleep(10 * FLUSH_INTERVAL)  # the tool step's save, say
        asked = trio.current_time()
        writer.append(o.StepStart(step=1))
        await trio.sleep(FLUSH_INTERVAL / 10)  # a quick model's first text
        writer.append(o.TextStart(step=1, part_id="p"))
        writer.append(delta(0))
        await writer.flushed()
        entries = pipes.entries()
        assert [types for _, _, types in entries] == [
            ["start"],
            ["step-start", "text-start", "text-delta"],
        ]
        assert entries[1][0] == relay.next_tick(asked)


async def test_a_step_start_that_nothing_follows_goes_out_alone_at_the_tick(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        await trio.sleep(10 * FLUSH_INTERVAL)
        asked = trio.current_time()
        writer.append(o.StepStart(step=1))
        await trio.sleep(10 * FLUSH_INTERVAL)  # a slow model: held no longer than the tick
        assert pipes.entries()[-1] == (
            relay.next_tick(asked),
            relay.turn_key("t"),
            ["step-start"],
        )


async def test_content_after_a_lone_step_starts_tick_goes_at_once(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        await trio.sleep(10 * FLUSH_INTERVAL)
        writer.append(o.StepStart(step=1))
        await writer.flushed()  # alone, at the tick
        await trio.sleep(FLUSH_INTERVAL / 2)  # the model's first text, after the tick
        asked = trio.current_time()
        writer.append(o.TextStart(step=1, part_id="p"))
        await writer.flushed()
        assert pipes.entries()[-1][::2] == (asked, ["text-start"])


async def test_a_turns_first_flush_goes_at_once_even_if_it_is_only_a_step_start(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, pipes):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        start = trio.current_time()
        writer.append(o.StepStart(step=2))  # a continuation's first chunk
        await writer.flushed()
        assert [(when, types) for when, _, types in pipes.entries()] == [(start, ["step-start"])]


async def test_a_pipeline_that_outlives_op_timeout_fails_its_flush_and_the_next_goes(
    autojump_clock: Any,
) -> None:
    async with fake_relay(op_timeout=1.0) as (relay, pipes):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        pipes.stalls = 1
        started = trio.current_time()
        writer.append(o.Start(message_id="m"))
        await writer.flushed()  # failed at the deadline, then retried
        assert (writer.failures, writer.flushes) == (1, 1)
        assert [types for _, _, types in pipes.entries()] == [["start"], ["start"]]
        assert pipes.sent[1][0] - started >= 1.0
        pipes.stalls = 1  # the next pipeline has a deadline too
        writer.append(delta(0))
        await writer.flushed()
        assert (writer.failures, writer.flushes) == (2, 2)


async def test_the_end_is_written_with_the_last_chunks(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(delta(0))
        writer.append(o.Finish(finish_reason="stop", usage=USAGE))
        await trio.sleep(END_WAIT / 2)  # the worker commits the turn's end meanwhile
        closed = trio.current_time()
        await writer.aclose()
        entries = pipes.entries()
        assert [types for _, _, types in entries] == [
            ["start"],
            ["text-delta", "finish", "relay.end"],
        ]
        assert entries[1][0] == closed


async def test_a_close_is_written_at_once_not_at_the_tick(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(delta(0))  # within the interval: held for the tick
        await trio.sleep(FLUSH_INTERVAL / 5)
        writer.append(o.Finish(finish_reason="stop", usage=USAGE))
        closed = trio.current_time()
        await writer.aclose()  # what active_turn, a stop and the closer wait for
        assert pipes.entries()[-1] == (
            closed,
            relay.turn_key("t"),
            ["text-delta", "finish", "relay.end"],
        )
        assert trio.current_time() - closed < FLUSH_INTERVAL / 2


async def test_an_end_whose_close_is_late_goes_out_after_end_wait(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        queued = trio.current_time()
        writer.append(o.Abort(reason="stopped"))
        await writer.flushed()
        when, _, types = pipes.entries()[-1]
        assert types == ["abort"] and when == queued + END_WAIT
        await writer.aclose()
        assert [types for _, _, types in pipes.entries()][-1] == ["relay.end"]


async def test_a_cancelled_writer_still_flushes_what_it_holds(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(delta(0))
        writer.append(delta(1))  # held for the tick
        with trio.CancelScope() as scope:
            scope.cancel()  # the closing task is cancelled before the flush is done
            await writer.aclose()
        await trio.sleep(1)
        assert [types for _, _, types in pipes.entries()][1:] == [
            ["text-delta", "text-delta", "relay.end"]
        ]
        # A turn the worker lost (its own teardown): what was produced still goes out,
        # without an end.
        lost = relay.writer(session_id="s2", turn_id="t2", fresh=True)
        lost.append(o.Start(message_id="m"))
        await lost.flushed()
        lost.append(delta(0))
        lost.append(o.Error(error=o.ErrorInfo(kind="x", message="torn down")))
        started = trio.current_time()
        await lost.aclose(final=False)
        assert pipes.entries()[-1][2] == ["text-delta", "error"]
        assert trio.current_time() - started <= FLUSH_INTERVAL  # no end to wait for


async def test_closing_the_relay_does_not_wait_out_a_writers_hold(autojump_clock: Any) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(o.Finish(finish_reason="stop", usage=USAGE))  # never closed
        started = trio.current_time()
        await relay.aclose()
        assert pipes.entries()[-1][2] == ["finish"]
        assert trio.current_time() - started < END_WAIT


async def test_with_no_interval_and_no_end_wait_every_flush_goes_at_once(
    autojump_clock: Any,
) -> None:
    async with fake_relay(flush_interval=0, end_wait=0) as (relay, pipes):
        writer = await started_writer(relay)
        for i in range(3):
            writer.append(delta(i))
            await writer.flushed()
        writer.append(o.StepStart(step=1))
        await writer.flushed()
        writer.append(o.Finish(finish_reason="stop", usage=USAGE))
        await trio.sleep(0.001)
        assert [types for _, _, types in pipes.entries()] == [
            ["start"],
            ["text-delta"],
            ["text-delta"],
            ["text-delta"],
            ["step-start"],
            ["finish"],
        ]
        await writer.aclose()


# -- one flush task for all the relay's writers (issue 24 goal 3) ------------------------


async def test_the_relay_runs_one_task_however_many_writers_it_has(autojump_clock: Any) -> None:
    async with trio.open_nursery() as nursery:
        relay = RedisRelay(None, nursery, flush_interval=FLUSH_INTERVAL)
        relay.batcher.connection = Pipes()  # type: ignore[assignment]
        await trio.testing.wait_all_tasks_blocked()
        tasks = len(nursery.child_tasks)
        writers = [relay.writer(session_id=f"s{i}", turn_id=f"t{i}", fresh=True) for i in range(8)]
        for writer in writers:
            writer.append(o.Start(message_id="m"))
        await trio.testing.wait_all_tasks_blocked()
        assert len(nursery.child_tasks) == tasks == 1
        for writer in writers:
            await writer.aclose()
        nursery.cancel_scope.cancel()


async def test_a_burst_of_appends_due_at_one_tick_wakes_the_flusher_once(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, pipes):
        writers = [relay.writer(session_id=f"s{i}", turn_id=f"t{i}", fresh=True) for i in range(8)]
        for writer in writers:
            writer.append(o.Start(message_id="m"))
        for writer in writers:
            await writer.flushed()
        woken, sent = relay.batcher.wakeups, len(pipes.sent)
        for i in range(10):  # every writer's deltas, within the tick
            for writer in writers:
                writer.append(delta(i))
            await trio.sleep(FLUSH_INTERVAL / 50)
        for writer in writers:
            await writer.flushed()
        assert relay.batcher.wakeups - woken == 1  # the first append; the rest wait with it
        assert len(pipes.sent) - sent == 1
        assert [types for _, _, types in pipes.entries()[8:]] == [["text-delta"] * 10] * 8


async def test_a_delta_appended_while_its_queue_waits_for_the_tick_is_two_python_calls(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(delta(0))  # waits for the tick
        deltas = [delta(i) for i in range(1, 11)]

        def append_each() -> None:
            for chunk in deltas:
                writer.append(chunk)

        _, calls = python_calls(append_each)
        # the append and its class's unstructure hook, one function
        # (``serde.flat_unstructurer``: two before); 6 before issue 24 goal 3's cuts: the
        # converter's dispatch and ``_put`` were called for each too
        assert len(calls) == 2 * len(deltas)
        await writer.flushed()
        assert [types for _, _, types in pipes.entries()[1:]] == [["text-delta"] * 11]


async def test_a_last_chunk_appended_while_deltas_wait_for_the_tick_keeps_them_for_the_close(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(delta(0))  # waits for the tick
        await trio.sleep(FLUSH_INTERVAL / 10)  # the turn ends before the tick
        writer.append(o.Finish(finish_reason="stop", usage=USAGE))
        await trio.sleep(END_WAIT / 2)
        closed = trio.current_time()
        await writer.aclose()
        assert [(when, types) for when, _, types in pipes.entries()][1:] == [
            (closed, ["text-delta", "finish", "relay.end"])
        ]


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


UNENCODABLE = _nested(300)
"""A tool's output no JSON writer here encodes: nested past orjson's 254 levels (an
integer past 64 bits was, until such integers were written exactly: branch bigints)."""


async def test_a_chunk_that_does_not_encode_loses_its_writers_batch_and_no_other(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, pipes):
        bad = relay.writer(session_id="s1", turn_id="t1", fresh=True)
        good = relay.writer(session_id="s2", turn_id="t2", fresh=True)
        bad.append(o.Start(message_id="m1"))
        bad.append(o.ToolResult(step=0, tool_call_id="c", tool_name="t", output=UNENCODABLE))
        good.append(o.Start(message_id="m2"))
        await good.aclose()
        await bad.aclose()
        assert bad.lost == 2 and bad.failures == 1
        by_key = {key: types for _, key, types in pipes.entries()}
        assert by_key == {
            relay.turn_key("t2"): ["start", "relay.end"],
            relay.turn_key("t1"): ["relay.gap", "relay.end"],  # readers rebuild it
        }


async def test_after_a_chunk_that_does_not_encode_the_gap_goes_out_without_waiting_for_a_close(
    autojump_clock: Any,
) -> None:
    async with fake_relay(retry_max=0.5) as (relay, pipes):
        bad = relay.writer(session_id="s1", turn_id="t1", fresh=True)
        bad.append(o.Start(message_id="m1"))
        bad.append(o.ToolResult(step=0, tool_call_id="c", tool_name="t", output=UNENCODABLE))
        await trio.sleep(1.0)  # past the backoff; the writer is not closed
        assert [types for _, _, types in pipes.entries()] == [["relay.gap"]]


async def test_a_continuations_tail_read_rides_in_the_pipeline_beside_other_writers(
    autojump_clock: Any,
) -> None:
    """A continuation's (or a takeover's) first flush reads the stream's tail on the
    writers' own connection, as a job of the flusher's pipeline: another writer's flush
    due then goes in the same pipeline, not after it; the continuation's entries go in
    the next one."""
    async with fake_relay(op_timeout=5.0) as (relay, pipes):
        continuation = relay.writer(session_id="s1", turn_id="t1", takeover=True)
        other = relay.writer(session_id="s2", turn_id="t2", fresh=True)
        continuation.append(o.Start(message_id="m1"))
        continuation.append(o.StepStart(step=1))  # re-runs from step 1: steps 0 committed
        other.append(o.Start(message_id="m2"))
        started = trio.current_time()
        await other.flushed()
        await continuation.flushed()
        assert trio.current_time() - started < FLUSH_INTERVAL
        sent = [[(c[0], c[1]) for c in commands if c[0] != "EXPIRE"] for _, commands in pipes.sent]
        one, two = relay.turn_key("t1"), relay.turn_key("t2")
        assert sent[0] == [("XREVRANGE", one), ("XADD", two), ("SET", relay.active_key("s2"))]
        assert sent[1][0] == ("XADD", one)
        # no stream there for a takeover: its readers are told the turn's start is lost
        assert pipes.entries()[-1][2] == ["relay.gap", "start", "step-start"]
        assert continuation.flushes == 1


async def test_a_tail_read_answered_with_junk_loses_the_queue_not_the_flusher(
    autojump_clock: Any,
) -> None:
    """A tail's read whose answer is not a stream's entries is a refusal (its writer's
    queue lost, readers told, as for a key of another type): the flusher goes on
    writing the other writers."""
    async with fake_relay(op_timeout=5.0) as (relay, pipes):
        pipeline = pipes.pipeline

        async def junk(commands: list[list[Any]]) -> list[Any]:
            replies = await pipeline(commands)
            return [
                b"junk" if c[0] == "XREVRANGE" else r
                for c, r in zip(commands, replies, strict=True)
            ]

        pipes.pipeline = junk  # type: ignore[method-assign]
        continuation = relay.writer(session_id="s1", turn_id="t1", takeover=True)
        continuation.append(o.Start(message_id="m1"))
        await trio.sleep(1.0)
        # refused, as a key of another type is (retried after a backoff, as before)
        assert continuation.failures >= 1 and continuation.lost >= 1
        assert continuation.flushes == 0
        other = relay.writer(session_id="s2", turn_id="t2", fresh=True)
        other.append(o.Start(message_id="m2"))
        await other.flushed()
        assert other.flushes == 1


async def test_a_stalled_redis_keeps_each_writers_queue_bounded(autojump_clock: Any) -> None:
    async with fake_relay(op_timeout=1.0, max_queue=50) as (relay, pipes):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        pipes.stalls = 1_000  # Redis does not answer
        writer.append(o.Start(message_id="m"))
        longest = 0
        for i in range(3_000):  # three seconds: its pipelines time out after one
            writer.append(delta(i))
            longest = max(longest, len(writer._queue))
            await trio.sleep(0.001)
        assert writer.failures >= 2  # its pipelines timed out, and were retried
        assert longest <= 50 + 1 and writer.lost > 0
        pipes.stalls = 0  # Redis is back: what is queued goes, after a gap
        await writer.aclose()
        assert pipes.entries()[-1][2][0] == "relay.gap"
        assert pipes.entries()[-1][2][-1] == "relay.end"


# -- against Redis: nothing lost or reordered --------------------------------------------


@pytest.mark.parametrize("resp", [True, False], ids=["resp", "coredis"])
async def test_readers_see_every_chunk_in_order_whatever_the_bursts(resp: bool) -> None:
    url = require_redis()
    rng = random.Random(7)
    turns = {f"t{i}": [o.Start(message_id=f"m{i}"), *map(delta, range(150))] for i in range(4)}
    got: dict[str, list[Any]] = {}
    async with RedisRelay.open(url, prefix=unique_prefix(), block_ms=50) as relay:
        if not resp:
            relay.batcher.connection = None

        async def write(turn_id: str) -> None:
            writer = relay.writer(session_id=f"s-{turn_id}", turn_id=turn_id, fresh=True)
            for chunk in turns[turn_id]:
                writer.append(chunk)
                if rng.random() < 0.3:  # bursts, pauses shorter and longer than a tick
                    await trio.sleep(rng.choice([0, 0.001, 0.003, 0.008]))
            writer.append(o.Finish(finish_reason="stop", usage=USAGE))
            await trio.sleep(rng.choice([0, 0.01]))
            await writer.aclose()
            assert writer.flushes < len(turns[turn_id])  # coalesced

        async def read(turn_id: str) -> None:
            with trio.fail_after(20):
                while True:  # until the writer's first flush made the stream
                    try:
                        got[turn_id] = [c async for c in relay.read(turn_id)]
                        return
                    except LookupError:
                        await trio.sleep(0.001)

        async with trio.open_nursery() as nursery:
            for turn_id in turns:
                nursery.start_soon(read, turn_id)
            await trio.sleep(0.01)
            for turn_id in turns:
                nursery.start_soon(write, turn_id)
        for turn_id, chunks in turns.items():
            expected = [c.type for c in chunks] + ["finish"]
            assert [c.type for c in got[turn_id]] == expected
            texts = [c.text for c in got[turn_id] if c.type == "text-delta"]
            assert texts == [f" w{i}" for i in range(150)]
            assert [c.seq for c in got[turn_id]] == list(range(1, len(expected) + 1))
            replayed = [c async for c in relay.read(turn_id, after_seq=75)]
            assert [c.seq for c in replayed] == list(range(76, len(expected) + 1))


async def test_a_flushers_sleep_a_writer_wakes_enters_no_cancel_scope(
    autojump_clock: Any,
) -> None:
    # Issue 24 goal 3: each of the flusher's timed sleeps entered a ``move_on_at`` scope
    # of its own (~4.4 µs), ~1.3 a worker's turn, most of them ended by a writer's wake-up
    # (a turn's first or last flush, at once) before their deadline. The flusher's one
    # scope's deadline is the sleep's wake-up now: a new scope only when it passes.
    async with fake_relay() as (relay, pipes):
        held = await started_writer(relay)
        cycles = 4
        with scopes_counted() as scopes:
            for i in range(cycles):
                held.append(delta(i))  # waits for the tick: the flusher sleeps until it
                await trio.sleep(FLUSH_INTERVAL / 10)
                opening = relay.writer(session_id=f"s{i}", turn_id=f"o{i}", fresh=True)
                opening.append(o.Start(message_id="m"))  # at once: wakes the flusher
                await opening.flushed()
                assert pipes.entries()[-1][2] == ["start"]  # before the tick
                await held.flushed()  # at the tick: the sleep's deadline passed
                assert pipes.entries()[-1][2] == ["text-delta"]
        assert len(pipes.entries()) == 1 + 2 * cycles
        # one scope a tick the flusher slept until (main: two, the woken sleep's too)
        assert scopes.of("redis_flush") == cycles


async def test_a_shielded_close_is_one_scope_and_waits_for_its_end_when_cancelled(
    autojump_clock: Any,
) -> None:
    # Issue 24 goal 3: a worker closed its turn's writer inside a shield of its own, the
    # close's bound a second scope; the bound's scope shields (``shield=True``).
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(delta(0))  # held for the tick
        with scopes_counted() as scopes, trio.CancelScope() as cancelled:
            cancelled.cancel()  # the closing task is cancelled: it still waits
            await writer.aclose(shield=True)
            assert pipes.entries()[-1][2] == ["text-delta", "relay.end"]
        assert scopes.of("redis_writer") == 1


async def test_a_batch_extended_is_two_python_calls_a_delta_and_flushes_as_its_appends(
    autojump_clock: Any,
) -> None:
    # Issue 24 goal 3: a worker forwards its turn's chunks in batches; ``extend`` takes a
    # batch in one call (the appends were a call each), and writes what they would.
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(delta(0))  # waits for the tick
        deltas = [delta(i) for i in range(1, 11)]
        _, calls = python_calls(lambda: writer.extend(deltas))
        # ``extend``, its list of items, and one a delta: its unstructure in one function
        # (``serde.flat_unstructurer``; appended one by one: 3 a delta)
        assert len(calls) == len(deltas) + 2
        await writer.flushed()
        assert [types for _, _, types in pipes.entries()[1:]] == [["text-delta"] * 11]

    turn = [
        o.Start(message_id="m"),
        o.StepStart(step=0),
        *[delta(i) for i in range(5)],
        o.Finish(finish_reason="stop", usage=USAGE),
    ]
    written = []
    for extended in (False, True):
        async with fake_relay() as (relay, pipes):
            writer = relay.writer(session_id="s", turn_id="t", fresh=True)
            began = trio.current_time()
            for batch in (turn[:1], turn[1:4], turn[4:]):  # as a worker's batches come
                if extended:
                    writer.extend(batch)
                else:
                    for chunk in batch:
                        writer.append(chunk)
                await trio.sleep(FLUSH_INTERVAL / 3)
            await writer.aclose()
            written.append([(when - began, types) for when, _, types in pipes.entries()])
    assert written[0] == written[1] and [types[-1] for _, types in written[0]] == [
        "start",
        "relay.end",
    ]


async def test_a_pipeline_whose_flushes_all_went_through_looks_for_no_failure(
    autojump_clock: Any,
) -> None:
    # Issue 24 goal 3: after every pipeline the flusher asked of each flush whether its
    # connection was lost under a large entry (two Python calls and an import each),
    # ~7 a worker's turn; a flush with no error is looked at no further.
    async with fake_relay() as (relay, pipes):
        writers = [relay.writer(session_id=f"s{i}", turn_id=f"t{i}", fresh=True) for i in range(3)]
        for writer in writers:
            writer.append(o.Start(message_id="m"))
            await writer.flushed()
        for i, writer in enumerate(writers):
            writer.append(delta(i))  # each waits for the tick: one pipeline for the three
        pipelines = relay.batcher.pipelines
        calls: list[tuple[str, str]] = []

        def count(frame: Any, event: str, arg: Any) -> None:
            if event == "call":  # (a generator's resume is one too)
                code = frame.f_code
                calls.append((code.co_filename.rsplit("/", 1)[-1], code.co_name))

        sys.setprofile(count)
        try:
            for writer in writers:
                await writer.flushed()
        finally:
            sys.setprofile(None)
        assert relay.batcher.pipelines == pipelines + 1
        assert [types for _, _, types in pipes.entries()[-3:]] == [["text-delta"]] * 3
        assert [name for _, name in calls if name in ("_suspect", "_transient")] == []
        # Whether each queue is only quiet chunks, asked as it waits and as it is taken,
        # is a loop: no generator frame (and a resume an item) each time.
        assert ("redis_writer.py", "_quiet") in calls
        assert [c for c in calls if c[0] == "redis_writer.py" and c[1] == "<genexpr>"] == []


async def test_a_writer_s_id_is_16_random_hex_digits_made_in_no_python_call() -> None:
    # Issue 24 goal 3: a writer a turn; its id was a uuid4's first 16 hex digits, the
    # object's __init__ and properties Python calls of the turn.
    async with fake_relay() as (relay, _):
        calls: list[str] = []

        def count(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                calls.append(frame.f_code.co_filename.rsplit("/", 1)[-1])

        sys.setprofile(count)
        try:
            writers = [relay.writer(session_id="s", turn_id=f"t{i}") for i in range(50)]
        finally:
            sys.setprofile(None)
        ids = [w.writer_id for w in writers]
        for writer in writers:
            await writer.aclose(final=False)
    assert "uuid.py" not in calls
    assert len(set(ids)) == 50
    assert all(len(i) == 16 and int(i, 16) >= 0 for i in ids)


async def test_a_batch_s_bytes_are_one_encode_of_the_batch(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 24 goal 3: a worker's turn forwards ~35 chunks in ~7 batches; each chunk
    # was encoded alone to count its bytes (``held``), then again in its flush's entry.
    from actors.relays import redis_writer

    encodes: list[Any] = []

    def dumps(value: Any, **kw: Any) -> bytes:
        encodes.append(value)
        return orjson.dumps(value, **kw)

    monkeypatch.setattr(redis_writer, "_dumps", dumps)
    async with fake_relay() as (relay, _):
        writer = await started_writer(relay)
        encodes.clear()
        chunks = [delta(i) for i in range(5)]
        chunks.append(o.TextDelta(step=0, part_id="p", text="é\U0001f600"))
        writer.extend(chunks)
        assert len(encodes) == 1
        # The same bytes as the chunks' JSON one by one (the writer's ``held``).
        alone = sum(len(orjson.dumps(redis_writer._hook(type(c))(c))) for c in chunks)
        assert writer.held == alone
        writer.extend([])  # nothing: nothing encoded, nothing counted
        assert len(encodes) == 1 and writer.held == alone


async def test_a_batch_with_half_a_character_is_measured_item_by_item(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, _):
        writer = await started_writer(relay)
        chunks = [delta(1), o.TextDelta(step=0, part_id="p", text="a\ud83d")]
        writer.extend(chunks)
        from actors.relays.redis_writer import _hook, _size

        assert writer.held == sum(_size(_hook(type(c))(c)) for c in chunks)


async def test_a_relay_reads_the_run_s_clock_without_trio_s_current_time(
    autojump_clock: Any,
) -> None:
    # Issue 24 goal 3: ``trio.current_time()`` is three Python calls a read; the writers
    # and the flusher read the clock ~20 times a worker's turn. They read the run's
    # clock itself (one call), the same times (the virtual clock here).
    async with fake_relay() as (relay, pipes):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        callers: list[str] = []

        def count(frame: Any, event: str, arg: Any) -> None:
            code = frame.f_code
            if event == "call" and code.co_name == "current_time":
                if code.co_filename.endswith("_generated_run.py"):
                    callers.append(frame.f_back.f_code.co_filename.rsplit("/", 1)[-1])

        sys.setprofile(count)
        try:
            writer.append(o.Start(message_id="m"))
            await writer.flushed()
            writer.extend([delta(1), delta(2)])
            writer.append(o.Finish(finish_reason="stop", usage=USAGE))
            await writer.aclose()
        finally:
            sys.setprofile(None)
        assert [c for c in callers if c.startswith("redis_")] == []
        assert [types for _, _, types in pipes.entries()] == [
            ["start"],
            ["text-delta", "text-delta", "finish", "relay.end"],
        ]
        assert relay.closed["t"] == trio.current_time()


async def test_a_pipeline_s_commands_are_built_without_a_python_call_a_flush(
    autojump_clock: Any,
) -> None:
    # Issue 24 goal 3: each flush's XADD had its fields flattened by a list
    # comprehension (a Python call a flush, ~5 a worker's turn), and the flusher found
    # its next wake-up as ``min`` of a generator (a frame, and a resume a writer).
    async with fake_relay() as (relay, pipes):
        writers = [relay.writer(session_id=f"s{i}", turn_id=f"t{i}", fresh=True) for i in range(3)]
        calls: list[tuple[str, str]] = []

        def count(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                code = frame.f_code
                calls.append((code.co_filename.rsplit("/", 1)[-1], code.co_name))

        sys.setprofile(count)
        try:
            for writer in writers:
                writer.append(o.Start(message_id="m"))
            for writer in writers:
                await writer.flushed()
        finally:
            sys.setprofile(None)
        assert ("redis_flush.py", "_send_resp") in calls
        assert [c for c in calls if c[0] == "redis_flush.py" and c[1].startswith("<")] == []
        [(_, commands)] = pipes.sent
        assert [tuple(c[:3]) for c in commands[::3]] == [
            ("XADD", f"{relay.turn_key(f't{i}')}", "1-1") for i in range(3)
        ]
        assert [c[0] for c in commands] == ["XADD", "EXPIRE", "SET"] * 3
        assert commands[2][3:] == ("EX", relay.live_ttl)
