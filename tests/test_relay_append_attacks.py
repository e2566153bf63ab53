"""The relay writer's appends attacked: a chunk that comes while its queue waits for the
tick is only appended, and each chunk class's unstructure hook is looked up once (issue
24 goal 3, branch ``wcpu7``). Whatever interleaves with the appends (the tick, a turn's
last chunk, a full queue, Redis stalling, refusing or applying a flush without
answering, a second turn sharing the flusher), every chunk goes out as
:func:`runtime.serde.unstructure` makes it, in order, or is counted lost and readers are
told before what follows it. On Trio's virtual clock against a stand-in for Redis that
keeps each stream (``XADD`` ids checked as Redis checks them)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import attrs
import orjson
import pytest
import trio
from coredis.exceptions import ResponseError

from actors.relays import redis_writer
from actors.relays.redis_entries import END, GAP
from actors.relays.redis_streams import END_WAIT, FLUSH_INTERVAL, RedisRelay
from actors.relays.redis_writer import _LAST
from runtime import output as o
from runtime.serde import unstructure
from tests.test_relay_coalescing import USAGE, delta, fake_relay, started_writer


@attrs.frozen(kw_only=True, slots=True)
class LoudDelta(o.TextDelta):
    """A chunk class of an application's: a delta with a field of its own."""

    loud: int = 0


_MARKERS = (GAP, END)


class Streams:
    """Stands in for the writers' RESP connection: keeps each turn's stream (a tail's
    read gets its last entry); a stalled pipeline never reaches Redis, or
    (``unanswered``) is applied and never answered; a refused ``XADD`` is Redis out of
    memory."""

    def __init__(self) -> None:
        self.streams: dict[str, list[tuple[int, list[dict[str, Any]]]]] = {}
        self.raw: dict[str, list[tuple[int, list[bytes]]]] = {}
        """Each stream's entries as written (first seq, the flat fields)."""
        self.stalls = 0
        self.unanswered = 0
        self.refusals = 0

    async def pipeline(self, commands: list[list[Any]]) -> list[Any]:
        if self.unanswered > 0:
            self.unanswered -= 1
            self._apply(commands)
            await trio.sleep(60.0)
        stalled, self.stalls = self.stalls > 0, max(self.stalls - 1, 0)
        await trio.sleep(60.0 if stalled else 0.0002)
        return self._apply(commands)

    def _apply(self, commands: list[list[Any]]) -> list[Any]:
        replies: list[Any] = []
        for command in commands:
            if command[0] == "XREVRANGE":  # the tail: the last entry, as RESP has it
                tail = self.raw.get(command[1], [])[-1:]
                replies.append([[f"{tail[0][0]}-1".encode(), tail[0][1]]] if tail else [])
                continue
            if command[0] != "XADD":
                replies.append(b"ok")
                continue
            first = int(command[2].split("-")[0])
            stream = self.streams.setdefault(command[1], [])
            if self.refusals > 0:
                self.refusals -= 1
                replies.append(ResponseError("OOM command not allowed"))
            elif stream and first <= stream[-1][0]:
                replies.append(ResponseError("ERR The ID specified in XADD is equal or smaller"))
            else:
                stream.append((first, orjson.loads(command[command.index("items") + 1])))
                fields = [x if isinstance(x, bytes) else str(x).encode() for x in command[3:]]
                self.raw.setdefault(command[1], []).append((first, fields))
                replies.append(b"ok")
        return replies

    async def aclose(self) -> None:
        pass


def _check_append(relay: RedisRelay, writer: Any, chunk: Any, before: int) -> None:
    """What an append leaves: the chunk last in the queue as ``unstructure`` makes it
    (after a gap when the queue was full), the queue waiting for the flusher unless a
    flush is out, and a turn's last chunk holding it for the close."""
    queue = writer._queue
    assert queue[-1] == unstructure(chunk)
    if before >= relay.max_queue:  # dropped, readers told (a failed flush's batch stays)
        assert [item["type"] for item in queue[-2:]] == [GAP, chunk.type]
    if not writer._busy:
        assert writer._due is not None and writer in relay.batcher._pending
    if chunk.type in _LAST:
        assert writer._end_by is not None
        if not writer._busy and not writer._hurry:
            assert writer._due >= writer._end_by


def _check_stream(
    entries: list[tuple[int, list[dict[str, Any]]]], sent: list[Any], lost: int
) -> None:
    """A stream from seq 1 that ends; the turn's chunks in it in order, each once; those
    missing are counted ``lost`` (no more: a batch in the stream is not lost) and
    readers are told before what follows them: by a gap, or a hole in the seqs (a
    reader raises ``RelayTurnGone``)."""
    seq = 1
    items: list[dict[str, Any]] = []
    for first, batch in entries:
        assert first >= seq  # never over what a reader read
        if first > seq:
            items.append({"type": GAP})  # a hole: readers are told as by a gap
        seq = first + len(batch)
        items += batch
    assert items[-1]["type"] == END
    expected = [unstructure(chunk) for chunk in sent]
    at, told = 0, False
    for item in items:
        if item["type"] in _MARKERS:
            told = told or item["type"] == GAP
            continue
        skipped = expected.index(item, at) - at  # ValueError: reordered or repeated
        assert told or not skipped, f"{skipped} chunks missing before {item} untold"
        at += skipped + 1
        told = False
    assert told or at == len(expected)
    missing = len(expected) - len([i for i in items if i["type"] not in _MARKERS])
    assert missing == lost


async def test_a_flush_redis_applied_without_answering_is_retried_without_what_came_after(
    autojump_clock: Any,
) -> None:
    """Its retry is a duplicate (the ids): taken as written, it must not carry the chunks
    appended meanwhile, or they are never written (a hole: every reader gives up)."""
    streams = Streams()
    async with fake_relay(op_timeout=0.05, retry_base=0.002, retry_max=0.02) as (relay, _):
        relay.batcher.connection = streams  # type: ignore[assignment]
        writer = await started_writer(relay)
        streams.unanswered = 1
        writer.append(delta(0))
        await trio.sleep(FLUSH_INTERVAL * 2)  # its flush is out: applied, not answered
        writer.append(delta(1))
        await trio.sleep(0.2)  # timed out, retried: a duplicate
        writer.append(delta(2))
        await writer.aclose()
        assert writer.failures == 1 and writer.lost == 0
        entries = streams.streams[relay.turn_key("t")]
        assert all(a + len(items) == b for (a, items), (b, _) in itertools.pairwise(entries))
        sent = [o.Start(message_id="m"), delta(0), delta(1), delta(2)]
        items = [item for _, batch in entries for item in batch]
        assert items == [*map(unstructure, sent), {"type": END}]


async def test_a_retry_redis_refuses_after_applying_it_unanswered_is_not_spliced_over(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis may hold the refused retry's batch (it applied the first try): the stream's
    tail, read before the next flush, says whether. Here it does, so nothing is counted
    lost and no gap tells readers to rebuild the turn; a gap put at the batch's seqs
    would be refused as a duplicate and taken as written, and the chunks after it could
    continue the stream unseen."""
    monkeypatch.setattr(redis_writer, "_backoff", lambda attempt, base, cap: 0.01)
    streams = Streams()
    async with fake_relay(op_timeout=0.05) as (relay, _):
        relay.batcher.connection = streams  # type: ignore[assignment]
        writer = await started_writer(relay)
        streams.unanswered = 1
        writer.append(delta(0))
        writer.append(delta(1))  # one flush: applied, not answered
        await trio.sleep(FLUSH_INTERVAL + 0.05)  # timed out; retried 0.01 s later ...
        streams.refusals = 1  # ... and refused (Redis out of memory)
        writer.append(delta(2))  # queued behind the retry: after it, with the gap
        await trio.sleep(0.1)
        assert writer.failures == 2
        writer.append(delta(3))
        writer.append(delta(4))
        await writer.aclose()
        sent = [o.Start(message_id="m"), *map(delta, range(5))]
        entries = streams.streams[relay.turn_key("t")]
        _check_stream(entries, sent, writer.lost)
        assert writer.lost == 0 and GAP not in [
            item["type"] for _, batch in entries for item in batch
        ]


@pytest.mark.parametrize("unanswered", [False, True], ids=["", "unanswered"])
@pytest.mark.parametrize("seed", range(4))
async def test_two_turns_appending_through_ticks_stalls_refusals_and_overflows_lose_nothing_untold(
    autojump_clock: Any, seed: int, unanswered: bool
) -> None:
    """With ``unanswered``, some pipelines are applied and never answered: a batch
    refused on its retry may be in the stream after all (the tail, read next, says
    whether: counted lost only if it is not)."""
    rng = random.Random(seed)
    streams = Streams()
    options = {"max_queue": 6, "op_timeout": 0.05, "retry_base": 0.002, "retry_max": 0.02}
    async with fake_relay(**options) as (relay, _):
        relay.batcher.connection = streams  # type: ignore[assignment]
        writers = [relay.writer(session_id=f"s{i}", turn_id=f"t{i}", fresh=True) for i in (0, 1)]
        sent: list[list[Any]] = [[], []]
        for i, writer in enumerate(writers):
            writer.append(o.Start(message_id=f"m{i}"))
            sent[i].append(o.Start(message_id=f"m{i}"))
        for n in range(400):
            i = rng.randrange(2)
            writer = writers[i]
            roll = rng.random()
            if roll < 0.04:
                chunk: Any = o.Finish(finish_reason=f"stop {n}", usage=USAGE)
            elif roll < 0.08:
                chunk = o.Error(error=o.ErrorInfo(kind="X", message=f"e{n}"))
            elif roll < 0.15:
                chunk = o.StepStart(step=n)
            else:
                chunk = delta(n)
            before = len(writer._queue)
            writer.append(chunk)
            sent[i].append(chunk)
            _check_append(relay, writer, chunk, before)
            roll = rng.random()
            if roll < 0.02:
                streams.stalls += 1
            elif roll < 0.03 and unanswered:
                streams.unanswered += 1
            elif roll < 0.04:
                streams.refusals += 1
            if rng.random() < 0.4:
                await trio.sleep(
                    rng.choice([0, 0.0001, FLUSH_INTERVAL / 3, FLUSH_INTERVAL, END_WAIT, 0.06])
                )
        streams.stalls = streams.unanswered = streams.refusals = 0
        for writer in writers:
            await writer.aclose()
        assert sum(writer.failures for writer in writers) > 0  # the attack reached Redis
        for i, writer in enumerate(writers):
            entries = streams.streams[relay.turn_key(f"t{i}")]
            _check_stream(entries, sent[i], writer.lost)


async def test_a_subclass_of_a_chunk_class_goes_out_with_its_own_fields_whichever_came_first(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_writer, "_UNSTRUCTURERS", {})  # no class's hook looked up yet
    async with fake_relay() as (relay, _):
        writer = await started_writer(relay)
        chunks = [LoudDelta(step=0, part_id="p", text="a", loud=5), delta(1)]
        chunks += [LoudDelta(step=0, part_id="p", text="b", loud=6), delta(2)]
        for chunk in chunks:  # the first waits for the tick; the others are appended
            writer.append(chunk)
        assert writer._queue == [unstructure(chunk) for chunk in chunks]
        assert [item.get("loud") for item in writer._queue] == [5, None, 6, None]


async def test_a_chunk_that_cannot_be_unstructured_raises_as_unstructure_does_and_queues_nothing(
    autojump_clock: Any,
) -> None:
    async with fake_relay() as (relay, pipes):
        writer = await started_writer(relay)
        writer.append(delta(0))  # waits for the tick: what follows is only appended
        bad = o.Finish(finish_reason="stop", usage=object())  # type: ignore[arg-type]
        with pytest.raises(Exception) as expected:
            unstructure(bad)
        with pytest.raises(type(expected.value), match=str(expected.value)):
            writer.append(bad)
        assert writer._queue == [unstructure(delta(0))] and writer._end_by is None
        writer.append(o.Finish(finish_reason="stop", usage=USAGE))  # the class's hook works
        assert writer._end_by is not None  # and the turn's last chunk waits for the close
        await writer.aclose()
        assert [types for _, _, types in pipes.entries()] == [
            ["start"],
            ["text-delta", "finish", END],
        ]


@attrs.frozen
class Note:
    """An application's value that is no output chunk (no ``type``)."""

    text: str


@pytest.mark.parametrize("value", [Note("x"), "not a chunk", {"text": "x"}, {"type": 3}], ids=repr)
async def test_a_value_that_is_no_chunk_is_refused_in_an_extend_as_at_an_append(
    autojump_clock: Any, value: Any
) -> None:
    """A worker forwards its turn's chunks in batches (``extend``): a value with no
    string ``type`` in one is refused there too, not queued to kill the flusher."""
    async with fake_relay() as (relay, _):
        writer = await started_writer(relay)
        writer.append(delta(0))
        queued = list(writer._queue)
        with pytest.raises(TypeError, match="not an output chunk"):
            writer.extend([value])
        assert writer._queue == queued
        await writer.aclose()
    assert writer.lost == 0


@pytest.mark.parametrize("value", [Note("x"), "not a chunk", {"text": "x"}, {"type": 3}], ids=repr)
async def test_a_value_that_is_no_chunk_is_refused_at_its_append_even_behind_a_last_chunk(
    autojump_clock: Any, value: Any
) -> None:
    """Behind a turn's last chunk, an append only queued what it was given without
    looking at its ``type``: a value without one went in the stream (junk to every
    reader) or, at the end of a batch, killed the relay's one flush task (every
    writer's) when it counted the batch's chunks. It raises ``TypeError`` at the append
    now, queues nothing, and the turn and the flusher go on."""
    streams = Streams()
    async with fake_relay() as (relay, _):
        relay.batcher.connection = streams  # type: ignore[assignment]
        writer = await started_writer(relay)
        writer.append(delta(0))
        writer.append(o.Finish(finish_reason="stop", usage=USAGE))  # waits for the close
        queued = list(writer._queue)
        with pytest.raises(TypeError, match="not an output chunk"):
            writer.append(value)
        assert writer._queue == queued
        await trio.sleep(END_WAIT * 2)  # the batch goes out without the close
        other = relay.writer(session_id="s2", turn_id="t2", fresh=True)
        other.append(o.Start(message_id="m2"))
        await writer.aclose()
        await other.aclose()
    sent = [o.Start(message_id="m"), delta(0), o.Finish(finish_reason="stop", usage=USAGE)]
    _check_stream(streams.streams[relay.turn_key("t")], sent, writer.lost)
    assert writer.lost == 0 and relay.turn_key("t2") in streams.streams
