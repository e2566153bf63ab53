"""The relay writer's appends attacked while Redis stalls, refuses, or applies a flush
without answering: every chunk goes out as :func:`runtime.serde.unstructure` makes it,
in order, or is counted lost and readers are told before what follows it. On Trio's
virtual clock against a stand-in for Redis that keeps each stream (``XADD`` ids checked
as Redis checks them)."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
import trio
from coredis.exceptions import ResponseError

from actors.relays import redis_writer
from actors.relays.redis_entries import END, GAP
from actors.relays.redis_streams import FLUSH_INTERVAL
from runtime import output as o
from runtime.serde import unstructure
from tests.test_relay_coalescing import delta, fake_relay, started_writer

_MARKERS = (GAP, END)


class Streams:
    """Stands in for the writers' RESP connection: keeps each turn's stream; a stalled
    pipeline never reaches Redis, or (``unanswered``) is applied and never answered; a
    refused ``XADD`` is Redis out of memory."""

    def __init__(self) -> None:
        self.streams: dict[str, list[tuple[int, list[dict[str, Any]]]]] = {}
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
            if command[0] != "XADD":
                replies.append([] if command[0] == "XREVRANGE" else b"ok")
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
                replies.append(b"ok")
        return replies

    async def aclose(self) -> None:
        pass


def _check_stream(
    entries: list[tuple[int, list[dict[str, Any]]]], sent: list[Any], lost: int, exact: bool = True
) -> None:
    """A stream from seq 1 that ends; the turn's chunks in it in order, each once; those
    missing are counted ``lost`` (``exact``: no more) and readers are told before what
    follows them: by a gap, or a hole in the seqs (a reader raises ``RelayTurnGone``)."""
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
    assert missing == lost if exact else missing <= lost


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
    """Redis may hold the refused retry's batch (it applied the first try), so the gap
    that says it is lost goes after its seqs: at them, it would be refused as a duplicate
    and taken as written, and the chunks after it could continue the stream unseen."""
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
        _check_stream(streams.streams[relay.turn_key("t")], sent, writer.lost, exact=False)
