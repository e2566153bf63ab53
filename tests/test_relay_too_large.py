"""A relay entry larger than Redis takes (its ``proto-max-bulk-len``), on the test run's
own Redis: Redis answers a protocol error and closes the connection. That is a refusal
named as such at once, not an outage retried until the writer gives up
(benchmarks/journal/pipeline.md, "greedyleft").

Entries are bounded now (``RedisRelay(entry_bytes=)``, 256 KB, below Redis's lowest
limit: a large chunk is several entries, ``tests/test_relay_entries.py``), so only a
relay whose bound is set past Redis's limit writes such an entry: these tests set it so
(:func:`unbounded_entries`), to keep the refusal path answered as before."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import ResponseError
from structlog.testing import capture_logs

from actors.providers.scripted import ScriptedProvider
from actors.relays import resp
from actors.relays.redis_streams import RedisRelay
from runtime import Agent
from runtime import output as o
from runtime.errors import RelayTurnGone
from runtime.provider import InferRequest
from tests.support.redis import redis_small_bulk, require_redis, unique_prefix
from tests.support.services import RedisServer, ServiceUnavailable
from tests.test_frontend import EventReader, body, data, deployment, redis_url, stored_text
from tests.test_relay import USAGE, opened, read_all
from tests.test_relay_web import sse_events

__all__ = ["redis_url"]  # (the fixture, imported for pytest)


@pytest.fixture(autouse=True)
def unbounded_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every relay of these tests writes entries of up to 64 MB (one per flush, as before
    entries were bounded): past the 1 MB limit the tests give Redis."""
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "entry_bytes", 64 * 1024 * 1024)


BIG = "x" * 2_000_000
"""One delta of 2 MB: past the 1 MB ``proto-max-bulk-len`` the test sets."""


def _respond(request: InferRequest) -> list[str]:
    if request.session_id == "big":
        return ["a b ", BIG, " c d"]
    return [" ".join(["w"] * 60)]


async def test_a_relay_entry_larger_than_redis_takes_is_refused_at_once_and_named(
    pg_url: str, redis_url: str
) -> None:
    # Before: the XADD's connection reset was taken for Redis down, retried for ~10 s,
    # then logged "Redis did not answer"; the reader waited for the turn to be seen over.
    agent = Agent(name="a", provider=ScriptedProvider(responder=_respond, delay=0.02))
    with capture_logs() as logs, redis_small_bulk("1mb"):
        async with deployment(pg_url, redis_url, agent) as d:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                async with client.stream("POST", "/api/chat", json=body("small")) as other:
                    reader = EventReader(other)
                    await reader.until(3)
                    big = await client.post("/api/chat", json=body("big"))
                    other_events = data(await reader.all())
            turns = await d.queue.turns("big")
            stored_big = await d.assistant("big")
            stored_small = await d.assistant("small")
    events = data(sse_events(big.text))
    # the reader of the big turn is told at once why, and to reload the session
    text = events[-1]["errorText"]
    assert events[-1]["type"] == "error"
    assert "Redis refused an entry of the stream as larger than it accepts" in text
    assert "proto-max-bulk-len" in text and "reload the session" in text
    # refused once, named; never retried as Redis down nor left unflushed (another
    # turn's flush in the same pipeline, after the refused one, never ran: retried)
    (refused,) = [e for e in logs if e["event"] == "relay.flush_refused"]
    of_turn = [e["event"] for e in logs if e.get("turn_id") == refused["turn_id"]]
    assert "relay.flush_failed" not in of_turn and "relay.unflushed" not in of_turn
    assert "relay.unflushed" not in [e["event"] for e in logs]
    assert refused["entry_bytes"] > 2_000_000 and refused["dropped"] >= 1
    assert "proto-max-bulk-len" in refused["why"]
    # the turn is saved whole, as before
    assert turns[0].status == "done"
    assert stored_text(stored_big) == "a b " + BIG + " c d"
    # the other session's stream, read meanwhile on the same relay, is whole
    assert [e for e in other_events if e["type"] == "error"] == []
    streamed = "".join(e["delta"] for e in other_events if e["type"] == "text-delta")
    assert streamed == stored_text(stored_small) == " ".join(["w"] * 60)


async def test_a_pipeline_redis_answers_with_a_protocol_error_gives_each_command_its_outcome(
    redis_url: str,
) -> None:
    # The commands before the one too large ran and are answered; that one gets Redis's
    # error (not retried: Redis answered); those after it never ran (the connection's
    # error, retried by their writers). The next pipeline opens a new connection.
    address = resp.address(redis_url)
    assert address is not None
    key = unique_prefix() + "s"
    connection = resp.RespConnection(address)
    try:
        with redis_small_bulk("1mb"):
            replies = await connection.pipeline(
                [
                    ["SET", key + "a", "1"],
                    ["XADD", key, "1-1", "items", BIG],
                    ["SET", key + "b", "2"],
                ]
            )
            assert replies[0] == b"OK"
            assert isinstance(replies[1], ResponseError) and "Protocol error" in str(replies[1])
            assert isinstance(replies[2], RedisConnectionError)
            assert await connection.pipeline([["GET", key + "a"], ["GET", key + "b"]]) == [
                b"1",
                None,
            ]
    finally:
        await connection.aclose()


def _last_then_short(request: InferRequest) -> list[str]:
    users = sum(1 for m in request.messages if m.role == "user")
    return ["a b ", BIG] if users == 1 else ["second answer"]


async def test_a_refused_entry_holding_the_turns_end_still_tells_the_reader_and_the_next_runs(
    pg_url: str, redis_url: str
) -> None:
    # The big delta is the turn's last: it goes in one entry with the turn's end, which
    # is refused with it. The gap still goes out (Redis took the next, small entry), and
    # the session's next turn streams whole.
    agent = Agent(name="a", provider=ScriptedProvider(responder=_last_then_short))
    with capture_logs() as logs, redis_small_bulk("1mb"):
        async with deployment(pg_url, redis_url, agent) as d:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                first = await client.post("/api/chat", json=body("s"))
                second = await client.post("/api/chat", json=body("s", "again", "u2"))
            turns = await d.queue.turns("s")
            stored = await d.assistant("s")
    (refused,) = [e for e in logs if e["event"] == "relay.flush_refused"]
    assert refused["entry_bytes"] > 2_000_000
    assert "relay.unflushed" not in [e["event"] for e in logs]
    ended = data(sse_events(first.text))[-1]
    assert ended["type"] == "error" and "larger than it accepts" in ended["errorText"]
    assert [t.status for t in turns] == ["done", "done"]
    events = data(sse_events(second.text))
    assert [e for e in events if e["type"] == "error"] == []
    assert "".join(e["delta"] for e in events if e["type"] == "text-delta") == "second answer"
    assert stored_text(stored) == "second answer"


@pytest.fixture
def tls_redis() -> Iterator[RedisServer]:
    """A Redis of the test's own over TLS (``rediss://``, a self-signed certificate made
    for it) taking no argument past 1 MB; skipped, saying why, where redis-server was
    built without TLS or openssl is missing."""
    require_redis()  # (skips where no redis-server is installed)
    try:
        server = RedisServer(tls=True, options=("--proto-max-bulk-len", "1mb"))
    except ServiceUnavailable as exc:
        pytest.skip(f"no TLS Redis here: {exc}")
    try:
        yield server
    finally:
        server.close()


def _turn(turn_id: str, text: str) -> list[Any]:
    return [
        o.Start(message_id="m" + turn_id, turn_id=turn_id, session_id="s" + turn_id),
        o.StepStart(step=0),
        o.TextStart(step=0, part_id="p"),
        o.TextDelta(step=0, part_id="p", text=text),
        o.TextFinish(step=0, part_id="p"),
        o.StepFinish(step=0, finish_reason="stop", usage=USAGE),
        o.Finish(finish_reason="stop", usage=USAGE),
    ]


@pytest.mark.parametrize("size", [2_000_000, 20_000_000])
async def test_an_entry_larger_than_a_tls_redis_takes_is_refused_at_once_and_named(
    tls_redis: RedisServer, size: int
) -> None:
    # Over TLS Redis's "Protocol error" reply is lost with the connection it closes:
    # coredis raised ConnectionError ("Connection lost while receiving response"; "while
    # sending request" for 20 MB), retried as Redis down until the writer gave up. Now
    # the entry's size, past the proto-max-bulk-len Redis says, names it.
    logs, refused = await _big_beside_small(tls_redis, size)
    assert "proto-max-bulk-len" in refused["why"] and refused["dropped"] >= 1
    assert [e for e in logs if e["event"] in ("relay.flush_failed", "relay.unflushed")
            and e.get("turn_id") == "big"] == []  # fmt: skip


async def _big_beside_small(server: RedisServer, size: int) -> tuple[list[Any], Any]:
    """A turn with an entry of ``size`` bytes and a small one, written at once to
    ``server``: the big one is refused as too large (readers are told so), the small one
    streams whole; the logs and the refusal's line."""
    with capture_logs() as logs:
        async with opened(server.url, op_timeout=5.0, close_timeout=30) as relay:
            big = relay.writer(session_id="sbig", turn_id="big", fresh=True)
            small = relay.writer(session_id="ssmall", turn_id="small", fresh=True)
            small.extend(_turn("small", "hello"))
            big.extend(_turn("big", "x" * size))
            with trio.fail_after(60):
                await small.aclose()
                await big.aclose()
            with pytest.raises(RelayTurnGone, match="larger than it accepts"):
                await read_all(relay, "big")
            shown = await read_all(relay, "small")
    (refused,) = [e for e in logs if e["event"] == "relay.flush_refused"]
    assert refused["turn_id"] == "big" and refused["entry_bytes"] > size
    assert big.lost >= 1 and small.lost == 0
    assert [c.text for c in shown if type(c) is o.TextDelta] == ["hello"]
    return logs, refused


@pytest.fixture
def tls_redis_without_config() -> Iterator[RedisServer]:
    """:func:`tls_redis` with ``CONFIG`` disabled (renamed to nothing), as managed
    services do: it will not say its ``proto-max-bulk-len``."""
    require_redis()
    options = ("--proto-max-bulk-len", "1mb", "--rename-command", "CONFIG", '""')
    try:
        server = RedisServer(tls=True, options=options)
    except ServiceUnavailable as exc:
        pytest.skip(f"no TLS Redis here: {exc}")
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("size", [2_000_000, 20_000_000])
async def test_an_entry_too_large_for_a_tls_redis_that_will_not_say_its_limit_is_refused(
    tls_redis_without_config: RedisServer, size: int
) -> None:
    # Before: a refused CONFIG GET was taken for the 512 MB default, the entry (under
    # it) retried as Redis down until the writer gave up (close_timeout), and readers
    # told of an overflow, not of the entry. Now: retried once, refused when its
    # connection is lost under it again while Redis answers.
    logs, refused = await _big_beside_small(tls_redis_without_config, size)
    assert "CONFIG refused" in refused["why"] and refused["unsure"] >= 1  # (a retry's)
    failed = [e for e in logs if e["event"] == "relay.flush_failed" and e["turn_id"] == "big"]
    assert len(failed) == 1  # the first loss: retried once
