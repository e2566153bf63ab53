"""The relay attacked at the connection: a fault-injecting TCP proxy
(:mod:`tests.support.redis_proxy`) between the relay and the test run's own Redis delays
replies, cuts the connection before a command reaches Redis or after Redis applied it,
hands replies on byte by byte, stalls, and answers ``-OOM``; scripted (a fault in the
retry of a flush Redis applied unanswered, two stalls in a row, a break in a
continuing writer's tail read) and from seeded schedules.

Whatever the faults, a reader of the turn gets every chunk once, in order, at the seqs
the writer gave them, or a :class:`~runtime.errors.RelayTurnGone` after a prefix of
them (told, never a splice shown whole), and only when the stream really lacks part of
the turn; the writer's ``lost`` is what the stream lacks. Real sockets and real time:
every wait here is bounded by the relay's deadlines (``op_timeout`` 0.2 s)."""

from __future__ import annotations

import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import coredis
import orjson
import pytest
import trio

from actors.relays.redis_entries import END, GAP
from actors.relays.redis_streams import RedisRelay
from runtime import output as o
from runtime.errors import RelayTurnGone
from runtime.serde import unstructure
from tests.support.redis import redis_address, require_redis, unique_prefix
from tests.support.redis_proxy import Command, Fault, redis_fault_proxy, scripted
from tests.test_relay_coalescing import USAGE

OPTIONS: dict[str, Any] = {
    "op_timeout": 0.2,
    "retry_base": 0.01,
    "retry_max": 0.05,
    "close_timeout": 15.0,
    "block_ms": 100,
    "retry_for": 15.0,
}


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@asynccontextmanager
async def through_proxy(decide: Any, **options: Any) -> AsyncIterator[tuple[Any, RedisRelay]]:
    """A relay whose every connection (coredis's and the writers' own) goes through a
    proxy dealing ``decide``'s faults."""
    async with redis_fault_proxy(redis_address(), decide) as proxy:
        async with RedisRelay.open(
            proxy.url, prefix=unique_prefix(), **{**OPTIONS, **options}
        ) as relay:
            yield proxy, relay


def turn(steps: int, deltas: int, name: str = "") -> list[Any]:
    """A text turn's chunks, each distinct (a repeat or a reorder shows)."""
    chunks: list[Any] = [o.Start(message_id=f"m{name}")]
    for step in range(steps):
        part = f"p{step}"
        chunks += [o.StepStart(step=step), o.TextStart(step=step, part_id=part)]
        chunks += [
            o.TextDelta(step=step, part_id=part, text=f"{name}{step}.{i}") for i in range(deltas)
        ]
        chunks += [
            o.TextFinish(step=step, part_id=part),
            o.StepFinish(step=step, finish_reason="stop", usage=USAGE),
        ]
    return [*chunks, o.Finish(finish_reason="stop", usage=USAGE)]


async def stream_items(relay: RedisRelay, turn_id: str) -> list[tuple[int, list[dict[str, Any]]]]:
    """The turn's stream as Redis holds it, read past the proxy: (first seq, items)."""
    client = coredis.Redis.from_url(require_redis(), decode_responses=False)
    async with client:
        entries = await client.xrange(relay.turn_key(turn_id), "-", "+")
    return [
        (int(e.field_values[b"first"]), orjson.loads(e.field_values[b"items"])) for e in entries
    ]


def unstructured(chunk: Any) -> dict[str, Any]:
    item: dict[str, Any] = unstructure(chunk)
    return item


def missing(entries: list[tuple[int, list[dict[str, Any]]]], sent: list[Any]) -> int:
    """The turn's chunks the stream lacks; asserts it holds none twice, none out of order,
    and none after a loss that readers are not told of (a gap item or a hole in the
    seqs before it)."""
    expected = [unstructured(chunk) for chunk in sent]
    seq, at, told, found = 1, 0, False, 0
    for first, items in entries:
        assert first >= seq, f"entry at {first} over seqs up to {seq - 1}"
        told = told or first > seq
        seq = first + len(items)
        for item in items:
            if item["type"] in (GAP, END):
                told = told or item["type"] == GAP
                continue
            index = expected.index(item, at)  # ValueError: repeated or reordered
            assert told or index == at, f"{index - at} chunks missing before {item} untold"
            at, found = index + 1, found + 1
    return len(expected) - found


def stream_whole(entries: list[tuple[int, list[dict[str, Any]]]]) -> bool:
    """Whether the stream is contiguous from seq 1, without a gap item, and ended."""
    seq = 1
    for first, items in entries:
        if first != seq or any(item["type"] == GAP for item in items):
            return False
        seq = first + len(items)
    return bool(entries) and entries[-1][1][-1] == {"type": END}


async def write(
    writer: Any, chunks: list[Any], rng: random.Random | None = None, paused: bool = False
) -> None:
    for chunk in chunks:
        writer.append(chunk)
        if rng is not None and rng.random() < 0.5:
            await trio.sleep(rng.choice([0, 0.001, 0.004, 0.006, 0.02]))
        else:
            await trio.sleep(0.006)  # past the tick: a flush each
    with trio.fail_after(30):
        await writer.aclose(paused=paused)


def stream_chunks(
    entries: list[tuple[int, list[dict[str, Any]]]], after_pause: bool = False
) -> list[tuple[int, dict[str, Any]]]:
    """The turn's chunks (seq, item) in the stream up to its first loss (a gap or a
    hole): what a reader may show; ``after_pause``: only those after its first pause."""
    shown: list[tuple[int, dict[str, Any]]] = []
    seq, paused = 1, False
    for first, items in entries:
        if first != seq:
            break
        for at, item in enumerate(items, start=first):
            if item["type"] == GAP:
                return shown
            if item["type"] == END:
                paused = paused or item.get("paused") is True
            elif paused or not after_pause:
                shown.append((at, item))
        seq = first + len(items)
    return shown


async def checked_read(
    relay: RedisRelay,
    turn_id: str,
    entries: list[tuple[int, list[dict[str, Any]]]] | None = None,
    *,
    after_seq: int | None = None,
    after_pauses: int = 0,
    into: list[Any] | None = None,
) -> tuple[list[Any], bool]:
    """A read of the turn: the chunks it showed and whether it was told the turn is
    gone; checked against the stream (``entries``) when given."""
    got: list[Any] = [] if into is None else into
    gone = False
    with trio.fail_after(60):
        try:
            async for chunk in relay.read(turn_id, after_seq=after_seq, after_pauses=after_pauses):
                got.append(chunk)
        except RelayTurnGone:
            gone = True
    if entries is not None:
        check_read(got, gone, entries, after_seq=after_seq, after_pause=after_pauses > 0)
    return got, gone


def check_read(
    got: list[Any],
    gone: bool,
    entries: list[tuple[int, list[dict[str, Any]]]],
    *,
    after_seq: int | None = None,
    after_pause: bool = False,
) -> None:
    """What a read showed is the stream's chunks after ``after_seq``, each once, in order,
    at its seq: all of them (the stream whole), or a prefix and then told (gone)."""
    expected = [(s, i) for s, i in stream_chunks(entries, after_pause) if s > (after_seq or 0)]
    shown = [(c.seq, unstructured(attrs.evolve(c, seq=0))) for c in got]
    assert shown == expected[: len(shown)], "a read showed what the stream does not hold there"
    assert gone == (not stream_whole(entries)), f"gone={gone} for a stream whole={not gone}"
    if not gone:
        assert len(shown) == len(expected), "a read of a whole stream ended early"


async def check_turn(relay: RedisRelay, writer: Any, sent: list[Any], turn_id: str = "t") -> bool:
    """The stream's and a replay's invariants; whether the turn is whole."""
    entries = await stream_items(relay, turn_id)
    lacking = missing(entries, sent)
    assert writer.lost == lacking, f"lost {writer.lost}, the stream lacks {lacking}"
    _, gone = await checked_read(relay, turn_id, entries)
    return not gone


DROP_AFTER = Fault("drop_after")
DROP_BEFORE = Fault("drop_before")
STALL_AFTER = Fault("stall_after")
STALL_BEFORE = Fault("stall_before")
REFUSE = Fault("refuse")


@pytest.mark.parametrize(
    "second",
    [
        DROP_AFTER,
        DROP_BEFORE,
        STALL_AFTER,
        STALL_BEFORE,
        Fault("cut"),
        Fault("fragment"),
        Fault("delay", 0.3),
    ],
    ids=lambda f: f.kind,
)
async def test_a_fault_in_the_retry_of_a_flush_redis_applied_unanswered(
    redis_url: str, second: Fault
) -> None:
    """The third ``XADD`` is applied and its connection cut; its retry (alone, at its
    seqs: ``_doubt``) meets a second fault; the chunks queued meanwhile wait behind it.
    The turn reads back whole, each chunk once."""
    sent = turn(2, 6)
    async with through_proxy(scripted({("XADD", 3): DROP_AFTER, ("XADD", 4): second})) as (
        proxy,
        relay,
    ):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        await write(writer, sent)
        assert proxy.faults("XADD") == ["drop_after", second.kind]
        # the fragmented reply is answered; the others fail the retry too (the delay is
        # past the deadline). More only if the machine stalls the test past a deadline.
        assert writer.failures >= (1 if second.kind == "fragment" else 2)
        assert await check_turn(relay, writer, sent)


async def test_two_stalls_in_a_row_then_a_break_lose_nothing(redis_url: str) -> None:
    """A flush whose reply never comes (applied), its retry never forwarded, the retry
    after that applied (a duplicate) and its connection cut: three failures in a row of
    one batch, then a duplicate taken as written; nothing lost, nothing twice."""
    sent = turn(2, 8)
    faults = {("XADD", 2): STALL_AFTER, ("XADD", 3): STALL_BEFORE, ("XADD", 4): DROP_AFTER}
    async with through_proxy(scripted(faults)) as (proxy, relay):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        await write(writer, sent)
        assert proxy.faults() == ["stall_after", "stall_before", "drop_after"]
        assert writer.failures >= 3
        assert await check_turn(relay, writer, sent)


async def test_a_retry_refused_after_redis_applied_the_first_try_counts_what_the_stream_lacks(
    redis_url: str,
) -> None:
    """The first try applied unanswered, the retry answered ``-OOM``: the batch is in the
    stream after all. The writer reads the stream's tail to know: nothing is lost,
    nothing counted lost, no gap makes readers rebuild the turn, and the chunks queued
    behind the retry follow it."""
    sent = turn(2, 6)
    async with through_proxy(scripted({("XADD", 3): DROP_AFTER, ("XADD", 4): REFUSE})) as (
        proxy,
        relay,
    ):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        await write(writer, sent)
        assert proxy.faults("XADD") == ["drop_after", "refuse"]
        assert proxy.faults() == ["drop_after", "refuse"]  # the tail's read answered
        assert [c.name for c, _ in proxy.seen].count("XREVRANGE") == 1
        assert writer.lost == 0 and await check_turn(relay, writer, sent)


@pytest.mark.parametrize(
    "faults",
    [
        [DROP_AFTER],
        [DROP_BEFORE, STALL_AFTER],
        [STALL_BEFORE, DROP_AFTER],
        [Fault("fragment")],
        [Fault("cut"), Fault("delay", 0.3)],
        [REFUSE],
    ],
    ids=lambda fs: "+".join(f.kind for f in fs),
)
async def test_a_break_in_a_continuing_writers_tail_read(
    redis_url: str, faults: list[Fault]
) -> None:
    """A turn paused for a person and continued by a writer that reads the stream's
    tail first (``XREVRANGE`` in the flusher's pipeline): the read broken, stalled,
    fragmented or refused. The continuation numbers on after the pause, once; a reader
    of the whole turn and one resuming after the pause see each chunk once (the
    continuation's ``start`` again: the web stream drops it), or are told the turn is
    gone when a refusal dropped the continuation's chunks (counted ``lost``)."""
    before, after = turn(1, 4)[:-1], [o.Start(message_id="m"), *turn(1, 5, name="c")[1:]]
    pause = len(before) + 1  # the pause's seq: never sent to a reader
    script = {("XREVRANGE", n + 1): fault for n, fault in enumerate(faults)}
    async with through_proxy(scripted(script)) as (proxy, relay):
        first = relay.writer(session_id="s", turn_id="t", fresh=True)
        for chunk in before:
            first.append(chunk)
        await first.aclose(paused=True)
        second = relay.writer(session_id="s", turn_id="t")
        await write(second, after)
        assert proxy.faults("XREVRANGE") == [f.kind for f in faults]
        entries = await stream_items(relay, "t")
        got, gone = await checked_read(relay, "t", entries)
        resumed, _ = await checked_read(relay, "t", entries, after_seq=pause - 1)
    assert first.lost == 0
    assert second.lost == missing(entries, [*before, *after])
    if any(f.kind == "refuse" for f in faults):  # what the refusal dropped is told (a gap)
        assert gone and second.lost >= 1
        return
    assert not gone and second.lost == 0
    assert [attrs.evolve(c, seq=0) for c in got] == [*before, *after]
    assert [c.seq for c in got] == [*range(1, pause), *range(pause + 1, pause + 1 + len(after))]
    assert resumed == got[len(before) :]


async def test_a_tail_read_through_coredis_whose_reply_never_comes_is_retried_elsewhere(
    redis_url: str,
) -> None:
    """A writer on coredis (a URL the RESP connection does not serve) reads a stream's
    tail as a command of its own: after a retry Redis refused, its reply held. The read
    past its deadline starts the pool over, so the next read is answered (before, it
    queued behind the held reply on the same connection, as every one after it, until
    the close counted the batch and the queue lost though Redis held the batch)."""
    sent = turn(2, 6)
    faults = {("XADD", 3): DROP_AFTER, ("XADD", 4): REFUSE, ("XREVRANGE", 1): STALL_AFTER}
    async with through_proxy(scripted(faults), close_timeout=5.0) as (proxy, relay):
        relay.batcher.connection = None  # what a URL the RESP connection does not serve gets
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        await write(writer, sent)
        assert proxy.faults() == ["drop_after", "refuse", "stall_after"]
        assert writer.lost == 0 and await check_turn(relay, writer, sent)


# -- seeded schedules ---------------------------------------------------------------------

WRITES = ("XADD", "XREVRANGE", "EXPIRE", "SET")
READS = ("EVAL", "XREAD", "EXISTS", "HELLO", "PING")
"""The readers' commands (a replay's page is an ``EVAL``: an ``XRANGE`` bounded in
bytes), and coredis's set-up of a connection and the open's PING."""
SEEDS = int(os.environ.get("AXON_RELAY_PROXY_SEEDS", "12"))
"""Schedules the suite runs (each ~1 s); set more to attack longer by hand."""


class Schedule:
    """A seeded ``decide``: a fault for about one in ``every`` of the relay's own
    commands (the writers' and the readers'), the kinds drawn from the seed; stalls
    capped (each costs a deadline), and faults come in runs (a fault in the retry of a
    flush that failed)."""

    def __init__(self, seed: int, every: int = 5, stalls: int = 6) -> None:
        self.rng = random.Random(seed)
        self.every = every
        self.stalls = stalls
        self.run = 0
        """Commands of the writers' still to get a fault (a run of faults)."""

    def __call__(self, command: Command) -> Fault | None:
        rng = self.rng
        if command.name not in WRITES + READS:
            return None
        if command.name in WRITES and self.run > 0:
            self.run -= 1
        elif rng.randrange(self.every * (1 if command.name in WRITES else 2)):
            return None
        elif command.name in WRITES and rng.random() < 0.3:
            self.run = rng.randint(1, 2)
        kinds = ["delay", "fragment", "drop_before", "drop_after", "cut"]
        kinds += ["stall_before", "stall_after"]
        if command.name == "XADD":
            kinds.append("refuse")
        kind = rng.choice(kinds)
        if kind.startswith("stall"):
            if self.stalls <= 0:
                kind = "drop_after"
            self.stalls -= 1
        return Fault(kind, rng.choice([0.002, 0.05, 0.25]) if kind == "delay" else 0.0)


@pytest.mark.parametrize(
    ("writes", "seed"),
    [
        *(("resp", seed) for seed in range(SEEDS)),
        *(("coredis", seed) for seed in range(SEEDS // 2)),
    ],
)
async def test_a_turn_under_a_seeded_schedule_of_connection_faults(
    redis_url: str, writes: str, seed: int
) -> None:
    """Turns of ~40 chunks appended at random pace (some paused for a person and
    continued by a writer that reads the tail; some with a second turn beside, so the
    flusher's pipelines carry both), faults on about one in five of the writers'
    commands and one in ten of the readers': a live reader, one resuming after what it
    had (Last-Event-ID) and a replay each show the turn whole, or a prefix and then
    gone, and only when the stream lacks part of the turn; the writers' ``lost`` is what
    the stream lacks of what they were given. The writers' flushes go on their own RESP
    connection, or (``coredis``: a URL it does not serve, ``rediss://``) through
    coredis, whose tail reads are commands of their own."""
    rng = random.Random(seed)
    schedule = Schedule(seed, every=int(os.environ.get("AXON_RELAY_PROXY_EVERY", "5")))
    turns = [f"t{i}" for i in range(rng.choice([1, 1, 2]))]
    async with through_proxy(schedule) as (proxy, relay):
        if writes == "coredis":
            relay.batcher.connection = None  # what a URL the RESP connection does not serve gets
        async with trio.open_nursery() as nursery:
            for turn_id in turns:
                nursery.start_soon(attacked_turn, relay, turn_id, random.Random(rng.random()))
    assert proxy.faults(), "the schedule dealt no fault"


async def attacked_turn(relay: RedisRelay, turn_id: str, rng: random.Random) -> None:
    """One turn of the seeded attack, written and read, and checked."""
    paused = rng.random() < 0.5
    chunks = turn(3, 9, name=turn_id)
    cut = rng.randrange(4, len(chunks) - 4)
    before, after = chunks[:cut], [o.Start(message_id=f"m{turn_id}"), *chunks[cut:]]
    writers = [relay.writer(session_id=f"s{turn_id}", turn_id=turn_id, fresh=True)]
    live: list[Any] = []
    live_gone: list[bool] = []

    async def live_reader() -> None:
        read = await checked_read(relay, turn_id, into=live, after_pauses=int(paused))
        live_gone.append(read[1])

    async with trio.open_nursery() as nursery:
        writers[0].append(before[0])
        with trio.fail_after(20):
            await writers[0].flushed()  # the stream is there unless its start was lost
        if not writers[0].lost:
            nursery.start_soon(live_reader)
        if paused:
            await write(writers[0], before[1:], rng, paused=True)
            writers.append(relay.writer(session_id=f"s{turn_id}", turn_id=turn_id))
            await write(writers[1], after, rng)
        else:
            await write(writers[0], [*before[1:], *chunks[cut:]], rng)
    entries = await stream_items(relay, turn_id)
    sent = [*before, *after] if paused else chunks
    assert sum(w.lost for w in writers) == missing(entries, sent)
    if live_gone:
        check_read(live, live_gone[0], entries, after_pause=paused)
    replay, _ = await checked_read(relay, turn_id, entries)
    if replay:
        await checked_read(relay, turn_id, entries, after_seq=replay[len(replay) // 2].seq)
    if paused:
        await checked_read(relay, turn_id, entries, after_pauses=1)


@pytest.mark.parametrize("command", ["EVAL", "EXISTS", "XREAD"])
async def test_a_read_whose_reply_never_comes_is_retried_on_another_connection(
    redis_url: str, command: str
) -> None:
    """A reader's command forwarded to Redis whose reply never comes back on its
    connection (a proxy or a network path that holds it): the read's deadline passes
    and its retry goes on another connection, not behind the stalled reply on the same
    one, so the read ends whole in a few deadlines instead of failing for
    ``retry_for`` (coredis multiplexes the relay's non-blocking reads on one pooled
    connection, which it keeps after a request it was waiting on is cancelled)."""
    sent = turn(1, 3)
    async with through_proxy(scripted({(command, 1): STALL_AFTER}), retry_for=3.0) as (
        proxy,
        relay,
    ):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        for chunk in sent[:-1]:
            writer.append(chunk)
        await writer.flushed()
        got: list[Any] = []

        async def read() -> None:
            await checked_read(relay, "t", into=got)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read)
            if (
                command != "EVAL"
            ):  # the replay's page is not: the live read's: it blocks for new entries
                with trio.fail_after(5):
                    while not proxy.faults():  # noqa: ASYNC110 - the proxy's record
                        await trio.sleep(0.01)
                await trio.sleep(0.5)  # past the stalled command's deadline
            writer.append(sent[-1])
            await writer.aclose()
        assert proxy.faults() == ["stall_after"]
        entries = await stream_items(relay, "t")
    check_read(got, False, entries)
    assert [attrs.evolve(c, seq=0) for c in got] == sent


@pytest.mark.parametrize("command", ["EVAL", "XREAD"])
async def test_the_cancel_watch_outlives_the_connections_a_stalled_read_starts_over(
    redis_url: str, command: str
) -> None:
    """A stalled read (the replay's page, an ``EVAL``) makes the relay's coredis connections
    start over; the cancel watch's subscription is not among them (a client of its own,
    branch ``relaymend``: before, it subscribed again, and a cancel published meanwhile
    was missed), and a cancel sent after the read reaches the watcher. A stalled live
    read (``XREAD BLOCK``) is on a connection of its own, which coredis drops: the
    others stay. Either way one ``SUBSCRIBE``."""
    cancels: list[tuple[str, str]] = []
    # a deadline a loaded machine does not pass by itself: the subscriptions are counted
    faults = scripted({(command, 1): STALL_AFTER})
    async with through_proxy(faults, retry_for=5.0, op_timeout=1.0) as (
        proxy,
        relay,
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.watch_cancels, lambda *args: cancels.append(args))
            writer = relay.writer(session_id="s", turn_id="t", fresh=True)
            sent = turn(1, 2)
            for chunk in sent[:-1]:
                writer.append(chunk)
            await writer.flushed()
            got: list[Any] = []
            reading = trio.Event()

            async def read() -> None:
                await checked_read(relay, "t", into=got)
                reading.set()

            nursery.start_soon(read)
            with trio.fail_after(5):
                while not proxy.faults():  # noqa: ASYNC110 - the proxy's record
                    await trio.sleep(0.01)
            writer.append(sent[-1])
            await writer.aclose()
            with trio.fail_after(10):
                await reading.wait()
                while not cancels:
                    await relay.request_cancel("t", "stop")
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    assert [attrs.evolve(c, seq=0) for c in got] == sent
    assert proxy.faults() == ["stall_after"]
    assert cancels[0] == ("t", "stop")
    subscribes = [c.name for c, _ in proxy.seen].count("SUBSCRIBE")
    assert subscribes == 1


async def test_a_relay_opens_though_its_first_ping_is_never_answered(redis_url: str) -> None:
    """``RedisRelay.open`` PINGs until Redis answers: the first PING's reply held, the
    next goes on another connection (before, it queued behind the held reply, as every
    one after it, and the open failed with ``RelayUnavailable`` after ``retry_for``)."""
    async with through_proxy(scripted({("PING", 1): STALL_AFTER}), retry_for=3.0) as (
        proxy,
        relay,
    ):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        sent = turn(1, 1)
        for chunk in sent:
            writer.append(chunk)
        await writer.aclose()
        assert await check_turn(relay, writer, sent)
    assert proxy.faults() == ["stall_after"]
