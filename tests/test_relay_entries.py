"""A relay stream's entries are bounded in bytes (``RedisRelay(entry_bytes=)``,
:data:`~actors.relays.redis_entries.ENTRY_BYTES`): a flush larger than the bound is
several entries, a chunk larger than it alone several *parts* that readers join back
into the one chunk before yielding it.

Before (branch ``relayentry``), one flush was one entry whatever its size: a 20 MB
chunk was one entry, so a page Redis does not bound in bytes (the live ``XREAD``, the
``XRANGE`` fallback where scripting is refused) held its count of entries of any size,
and an entry past Redis's ``proto-max-bulk-len`` was refused (the turn's readers told to
reload). Each read mode (the page script, ``XRANGE``, live ``XREAD``) is checked with a
5 MB chunk; a resume after every seq around split chunks; a stream trimmed or cut inside
a split chunk (a hole, never a fragment shown); the split and the join for any sizes
(hypothesis); what a reader of 8 MB of large chunks holds (``tracemalloc``)."""

from __future__ import annotations

import tracemalloc
from typing import Any

import attrs
import httpx
import orjson
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from actors.providers.scripted import ScriptedProvider
from actors.relays.redis_entries import ENTRY_BYTES, _Cursor, _decode, _split
from actors.relays.redis_writer import _RawEntry
from runtime import Agent
from runtime import output as o
from runtime.errors import RelayTurnGone
from tests.support.redis import redis_small_bulk, require_redis
from tests.support.services import RedisServer, ServiceUnavailable
from tests.test_frontend import body, data, deployment, stored_text
from tests.test_relay import USAGE, opened, read_all, redis_url
from tests.test_relay_web import sse_events

__all__ = ["redis_url"]  # (the fixture)

_UNIT = 'abc é€ 😀 "q" \\ \n'
"""Text whose JSON has 1- to 4-byte characters and escapes: a part's cut falls inside
some of them."""
FIVE_MB = _UNIT * (5_000_000 // (len(orjson.dumps(_UNIT)) - 2) + 1)
"""A delta whose JSON is over 5 MB."""


def _turn(*texts: str) -> list[Any]:
    """A turn's chunks: one text delta each of ``texts``, then its end."""
    out: list[Any] = [
        o.Start(message_id="m1", turn_id="t", session_id="s"),
        o.StepStart(step=0),
        o.TextStart(step=0, part_id="p"),
    ]
    out += [o.TextDelta(step=0, part_id="p", text=text) for text in texts]
    out += [
        o.TextFinish(step=0, part_id="p"),
        o.StepFinish(step=0, finish_reason="stop", usage=USAGE),
        o.Finish(finish_reason="stop", usage=USAGE),
    ]
    return out


def _plain(chunks: list[Any]) -> list[Any]:
    return [attrs.evolve(c, seq=0) for c in chunks]


async def _entry_sizes(relay: Any, turn_id: str = "t") -> list[int]:
    """The bytes of chunks' JSON (``items`` or ``part``) of each entry of the stream."""
    entries = await relay.client.xrange(relay.turn_key(turn_id), "-", "+")
    return [len(e.field_values.get(b"items", e.field_values.get(b"part", b""))) for e in entries]


@pytest.mark.parametrize("mode", ["script", "xrange", "live"])
async def test_a_5_mb_chunk_round_trips_whole_in_every_read_mode(redis_url: str, mode: str) -> None:
    # Before: the delta was one entry of 5 MB (each page of any mode held it whole).
    assert len(orjson.dumps(FIVE_MB)) > 5_000_000
    chunks = _turn("a", FIVE_MB, "z")
    async with opened(redis_url) as relay:
        if mode == "xrange":
            relay.scripts_refused = True  # (as after Redis refused the page script)

            async def no_script(*args: Any, **kwargs: Any) -> Any:
                raise AssertionError("the page script was run")

            relay.client.eval = no_script
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        with trio.fail_after(30):
            if mode == "live":  # the reader reads the start, then the rest live
                writer.append(chunks[0])
                await writer.flushed()
                reader = relay.read("t")
                got = [await anext(reader)]
                writer.extend(chunks[1:])
                await writer.aclose()
                got += [chunk async for chunk in reader]
            else:
                writer.extend(chunks)
                await writer.aclose()
                got = await read_all(relay, "t")
        sizes = await _entry_sizes(relay)
    assert _plain(got) == chunks
    assert [c.text for c in got if type(c) is o.TextDelta][1] == FIVE_MB  # byte for byte
    assert [c.seq for c in got] == list(range(1, len(chunks) + 1))
    assert len(sizes) > 20 and max(sizes) <= ENTRY_BYTES, sizes


async def test_a_chunk_past_redis_proto_max_bulk_len_streams_whole() -> None:
    # Before: the 2 MB delta was one entry past the 1 MB limit: refused
    # (``relay.flush_refused``), its readers told to reload the session.
    require_redis()
    try:
        server = RedisServer(options=("--proto-max-bulk-len", "1mb"))
    except ServiceUnavailable as exc:
        pytest.skip(f"no Redis of the test's own: {exc}")
    big = "x" * 2_000_000
    try:
        with capture_logs() as logs:
            async with opened(server.url) as relay:
                writer = relay.writer(session_id="s", turn_id="t", fresh=True)
                writer.extend(_turn(big))
                with trio.fail_after(30):
                    await writer.aclose()
                got = await read_all(relay, "t")
    finally:
        server.close()
    assert writer.lost == 0
    assert "relay.flush_refused" not in [e["event"] for e in logs]
    assert [c.text for c in got if type(c) is o.TextDelta] == [big]


async def test_a_worker_deployment_streams_a_chunk_past_redis_limit_whole(
    pg_url: str, redis_url: str
) -> None:
    # Before (test_relay_too_large.py, its first test): the 2 MB delta's entry was
    # refused and the POST's stream ended with "reload the session".
    big = "y" * 2_000_000
    agent = Agent(name="a", provider=ScriptedProvider(responder=lambda _: ["a b ", big, " c"]))
    with capture_logs() as logs, redis_small_bulk("1mb"):
        async with deployment(pg_url, redis_url, agent) as d:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                response = await client.post("/api/chat", json=body("big"))
            stored = await d.assistant("big")
    events = data(sse_events(response.text))
    assert [e for e in events if e["type"] == "error"] == []
    streamed = "".join(e["delta"] for e in events if e["type"] == "text-delta")
    assert streamed == stored_text(stored) == "a b " + big + " c"
    assert "relay.flush_refused" not in [e["event"] for e in logs]


async def test_every_resume_around_split_chunks_is_the_replay_after_it(redis_url: str) -> None:
    """``Last-Event-ID`` is a chunk's seq, never a part's: a resume after the seq before a
    split chunk gets it whole, after its seq the next chunk; with pages of one entry
    (a page ends between each two parts) and with ``XRANGE`` pages as with one page."""
    texts = ["a", "b" * 5000, "c", "d" * 3000, "e" * 2500]
    async with opened(redis_url, entry_bytes=1000) as relay:
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        writer.extend(_turn(*texts))
        await writer.aclose()
        whole = await read_all(relay, "t")
        last = whole[-1].seq
        ways: dict[str, list[list[Any]]] = {}
        for way in ("one page", "paged", "xrange"):
            relay.page_bytes = 1 if way != "one page" else 1 << 30
            relay.scripts_refused = way == "xrange"
            ways[way] = [await read_all(relay, "t", after_seq=seq) for seq in range(last + 1)]
        sizes = await _entry_sizes(relay)
    assert _plain(whole) == _turn(*texts)
    assert len(sizes) > 10 and max(sizes) <= 1000
    for seq in range(last + 1):
        expected = [c for c in whole if c.seq > seq]
        for way, reads in ways.items():
            assert reads[seq] == expected, (way, seq)
    big = [c.seq for c in whole if type(c) is o.TextDelta and len(c.text) > 1000]
    for seq in big:  # around each split chunk: the whole chunk again, or the next
        assert ways["paged"][seq - 1][0].text == whole[seq - 1].text
        assert ways["paged"][seq][0].seq == seq + 1


def _raw(identifier: str, fields: dict[str, Any], writer: bytes = b"w1") -> _RawEntry:
    values = {k.encode(): v if isinstance(v, bytes) else str(v).encode() for k, v in fields.items()}
    return _RawEntry(identifier=identifier.encode(), field_values={**values, b"w": writer})


async def _write_entries(relay: Any, entries: list[tuple[str, dict[str, Any], int]]) -> None:
    key = relay.turn_key("t")
    for identifier, fields, _ in entries:
        await relay.client.xadd(key, {**fields, "w": b"w1"}, identifier=identifier)


def _items(chunks: list[Any]) -> list[dict[str, Any]]:
    from runtime.serde import unstructure

    return [unstructure(c) for c in chunks]


async def test_a_live_reader_between_two_parts_yields_the_chunk_whole_once_in(
    redis_url: str,
) -> None:
    """A split chunk's ``XADD`` s reach Redis one by one (a pipeline is not atomic): a
    live reader that reads some of its parts waits for the rest, never yields a part."""
    chunks = _turn("b" * 5000)
    entries = _split([*_items(chunks), {"type": "relay.end"}], 1, 1000)
    parts = [e for e in entries if "part" in e[1]]
    assert len(parts) >= 5
    got: list[Any] = []
    async with opened(redis_url) as relay:
        before = entries[: entries.index(parts[0])]
        await _write_entries(relay, before)

        started = trio.Event()

        async def read() -> None:
            async for chunk in relay.read("t"):
                got.append(chunk)
                if len(got) == 3:  # what precedes the split chunk
                    started.set()

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read)
                await started.wait()
                for part in parts[:-1]:
                    await _write_entries(relay, [part])
                    await trio.sleep(0.05)
                    assert len(got) == 3  # nothing of the chunk until its last part
                await _write_entries(relay, entries[entries.index(parts[-1]) :])
    assert _plain(got) == chunks


async def test_a_stream_trimmed_or_cut_inside_a_split_chunk_is_a_hole(redis_url: str) -> None:
    """Redis trimmed the stream's head inside a split chunk (``XTRIM``: the relay writes
    no ``MAXLEN``, an operator or a policy may), lost a part, or the writer stopped
    between two: every reader is told the turn is gone (the front end rebuilds it from
    the store, or tells a client that saw part of it to reload), never shown the chunk's
    tail, or another chunk, as the chunk."""
    async with opened(redis_url, entry_bytes=1000) as relay:
        key = relay.turn_key("t")

        async def fresh() -> None:
            await relay.client.delete([key])
            writer = relay.writer(session_id="s", turn_id="t", fresh=True)
            writer.extend(_turn("b" * 5000))
            await writer.aclose()

        async def gone(after_seq: int | None = None) -> str:
            with pytest.raises(RelayTurnGone) as caught:
                await read_all(relay, "t", after_seq=after_seq)
            return str(caught.value)

        await fresh()
        ids = [e.identifier.decode() for e in await relay.client.xrange(key, "-", "+")]
        parts = [i for i in ids if i.startswith("4-")]
        assert len(parts) == 6 and parts[0] == "4-1"
        # the head trimmed to the chunk's third part
        await relay.client.xtrim(key, "MINID", threshold=parts[2])
        for after in (None, 3, 4):
            assert "without the parts before it" in await gone(after)
        # a part in the middle lost
        await fresh()
        await relay.client.xdel(key, [parts[2]])
        assert "lost the end of the chunk at seq 4" in await gone()
        # the writer's last parts never written, another entry after them
        await fresh()
        await relay.client.xdel(key, parts[3:])
        assert "lost the end of the chunk at seq 4" in await gone(3)
        # the head trimmed to the chunk's first part: a hole before it, as ever
        await fresh()
        await relay.client.xtrim(key, "MINID", threshold=parts[0])
        assert "lost chunks 1..3" in await gone()


async def test_a_split_flush_refused_past_its_first_parts_tells_readers_why(
    redis_url: str,
) -> None:
    """Redis takes a split chunk's first two parts, then refuses the flush's next
    entries (out of memory). The gap goes after the seqs Redis took: readers that read
    those parts are told why. Before, the gap went at the chunk's own seq, the id of its
    first part: Redis refused it as a duplicate, the writer took it for written, and a
    reader waited for the rest of the chunk (here: ``TooSlowError``), until its front end
    gave up on the turn."""
    from coredis.exceptions import ResponseError

    async with opened(redis_url, entry_bytes=1000) as relay:
        connection = relay.batcher.connection
        assert connection is not None
        send = connection.pipeline
        once = [True]

        async def full_after_two_parts(commands: list[list[Any]]) -> list[Any]:
            cut = next(
                (i for i, c in enumerate(commands) if c[0] == "XADD" and c[2] == "4-3"), None
            )
            if cut is None or not once:
                return await send(commands)
            once.clear()
            refused = {i for i, c in enumerate(commands) if i >= cut and c[0] == "XADD"}
            kept = iter(await send([c for i, c in enumerate(commands) if i not in refused]))
            oom = ResponseError("OOM command not allowed when used memory > 'maxmemory'.")
            return [oom if i in refused else next(kept) for i in range(len(commands))]

        connection.pipeline = full_after_two_parts  # type: ignore[method-assign]
        with capture_logs() as logs:
            writer = relay.writer(session_id="s", turn_id="t", fresh=True)
            writer.extend(_turn("b" * 5000))
            with trio.fail_after(30):
                await writer.aclose()
        ids = [e.identifier.decode() for e in await relay.client.xrange(relay.turn_key("t"))]
        with pytest.raises(RelayTurnGone, match="out of memory"):
            await read_all(relay, "t")
        with pytest.raises(RelayTurnGone, match="out of memory"):
            await read_all(relay, "t", after_seq=3)
    assert not once  # (the refusal happened)
    assert ids == ["1-1", "4-1", "4-2", "5-1"]  # the gap after the parts Redis took
    assert writer.lost == 4  # the split delta and the three chunks after it
    assert [e["event"] for e in logs].count("relay.flush_refused") == 1


async def test_a_split_flush_whose_connection_broke_midway_is_retried_whole(
    redis_url: str,
) -> None:
    """The connection breaks after Redis applied the flush's first entries (a split
    chunk's first two parts): the retry's entries Redis holds are refused as
    duplicates, the rest are written, and readers get the chunk whole, once."""
    from coredis.exceptions import ConnectionError as RedisConnectionError

    async with opened(redis_url, entry_bytes=1000, retry_base=0.01) as relay:
        connection = relay.batcher.connection
        assert connection is not None
        send = connection.pipeline
        once = [True]

        async def broken_after_two_parts(commands: list[list[Any]]) -> list[Any]:
            cut = next(
                (i for i, c in enumerate(commands) if c[0] == "XADD" and c[2] == "4-3"), None
            )
            if cut is None or not once:
                return await send(commands)
            once.clear()
            await send(commands[:cut])
            raise RedisConnectionError("Connection lost while receiving response")

        connection.pipeline = broken_after_two_parts  # type: ignore[method-assign]
        chunks = _turn("b" * 5000)
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        writer.extend(chunks)
        with trio.fail_after(30):
            await writer.aclose()
        got = await read_all(relay, "t")
    assert not once and writer.failures == 1 and writer.lost == 0
    assert _plain(got) == chunks


async def test_a_takeover_reads_back_a_step_holding_split_chunks(redis_url: str) -> None:
    """``shown`` reads the stream backwards: a split chunk's parts come last part first,
    joined once its first is read. The parts the step left open are found across them,
    no gap written (a guard: a part taken for an entry of chunks would be junk)."""
    async with opened(redis_url, entry_bytes=1000) as relay:
        dead = relay.writer(session_id="s", turn_id="t", fresh=True)
        dead.extend(
            [
                o.Start(message_id="m1"),
                o.StepStart(step=1),
                o.TextStart(step=1, part_id="p"),
                o.TextDelta(step=1, part_id="p", text="b" * 3000),
                o.TextFinish(step=1, part_id="p"),
                o.TextStart(step=1, part_id="q"),
                o.TextDelta(step=1, part_id="q", text="c" * 3000),
            ]
        )
        await dead.aclose(final=False)
        assert len(await _entry_sizes(relay)) > 6  # (split)
        taker = relay.writer(session_id="s", turn_id="t", takeover=True)
        with capture_logs() as logs:
            assert await taker.shown(1) == [o.TextFinish(step=1, part_id="q")]
        await taker.aclose()
    assert logs == []


_TEXT = st.text(alphabet=st.sampled_from(list('ab é€😀"\\\n')), max_size=600)


@given(
    texts=st.lists(_TEXT, min_size=1, max_size=12),
    bound=st.integers(min_value=1, max_value=2000),
    first=st.integers(min_value=1, max_value=10**6),
)
def test_split_entries_join_back_into_the_batch(texts: list[str], bound: int, first: int) -> None:
    """Any batch, any bound: every entry holds at most ``bound`` bytes of chunks' JSON,
    ids rise as Redis requires, each decodes, and a reader gets the batch back item for
    item at its seqs; a batch within the bound is one entry, as before entries were
    bounded."""
    batch = [{"type": "text-delta", "step": 0, "part_id": "p", "text": t} for t in texts]
    entries = _split(batch, first, bound)
    sizes = [len(f.get("items") or f["part"]) for _, f, _ in entries]
    assert max(sizes) <= bound or len(entries) == 1
    if len(orjson.dumps(batch)) <= bound:
        assert len(entries) == 1 and orjson.loads(entries[0][1]["items"]) == batch
    else:
        assert max(sizes) <= bound
    ids = [tuple(map(int, i.split("-"))) for i, _, _ in entries]
    assert ids == sorted(set(ids))
    cursor = _Cursor(turn_id="t", position=first - 1, writer=b"w1")
    got: list[tuple[int, Any]] = []
    for identifier, fields, last in entries:
        raw = _raw(identifier, fields)
        assert _decode(raw).last == last
        got += cursor.accept(raw)
    assert got == list(enumerate(batch, start=first))
    assert cursor.next_part is None and cursor.position == first + len(batch) - 1


BIG = "x" * 2_000_000
"""A chunk of 2 MB: eight entries of 256 KB."""
HELD = 16_000_000
"""The most a reader of 8 MB of such chunks may allocate at once: a page (1 MB, more in
coredis's buffers), the parts of the chunk it joins (2 MB), their parse (the standard
library's: about twice the document) and the chunk the read holds back to know the
tail. About 11 MB measured. Before: 33 MB (the page script, the ``XRANGE`` fallback),
40 MB live (its ``XREAD`` asked for 256 entries and got the four chunks in one reply),
``orjson.loads`` of one 2 MB entry peaking at 26 MB by itself."""


@pytest.mark.parametrize("mode", ["live", "script", "xrange"])
async def test_a_reader_of_8_mb_of_large_chunks_holds_about_a_page_and_a_chunk(
    redis_url: str, mode: str
) -> None:
    async with opened(redis_url) as relay:
        relay.scripts_refused = mode == "xrange"
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        writer.append(o.Start(message_id="m1"))
        writer.append(o.TextDelta(step=0, part_id="p", text="small"))
        await writer.flushed()
        reader = relay.read("t")
        if mode == "live":  # read the small entries, then fall behind the large ones
            assert (await anext(reader)).type == "start"
        for _ in range(4):
            writer.append(o.TextDelta(step=0, part_id="p", text=BIG))
            await writer.flushed()
        writer.append(o.Finish(finish_reason="stop", usage=USAGE))
        await writer.aclose()
        count = 0
        tracemalloc.start()
        try:
            with trio.fail_after(30):
                async for chunk in reader:
                    count += 1
                    del chunk
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert count == (6 if mode == "live" else 7)
    assert peak < HELD, peak
