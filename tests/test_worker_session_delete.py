"""A worker whose running turn's session is deleted ends the turn as deleted, not lost.

``PostgresStore.delete`` ends the session's running turn ``cancelled`` (reason ``session
deleted``) in its transaction; the worker then has its next save refused, or its next
lease renewal. Before, it took either for a lost lease: a ``worker.lease_lost`` warning,
the turn counted ``lost``, and its relay stream left without an end (as for a turn
another worker takes over). Only the front end that received the ``DELETE`` ended its
own viewers' streams (``abort``); a viewer on another front end, or one resuming from
``Last-Event-ID``, waited until the front end's look at the queue gave the stream up.

Now the worker logs ``worker.session_deleted`` (info), ends the stream with the same
``abort`` (``session deleted``) and counts the turn ``cancelled``. The test run's own
PostgreSQL (``pg_url``) and Redis (``redis_url``); the relay is read as any viewer
reads it, with nothing but the stream's own end to end the read.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import pytest
import trio
from structlog.testing import capture_logs

from actors.relays import RedisRelay
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import output as o
from runtime.app.worker import Worker
from runtime.errors import SESSION_DELETED, RelayTurnGone
from runtime.logging import configure_logging
from tests.support.redis import require_redis, unique_prefix
from tests.test_session_delete import LIMIT, _agent, _Gate


@pytest.fixture
def redis_url() -> str:
    return require_redis()


class _NoEnd(AssertionError):
    """The turn's relay stream has no end although its worker is done with the turn."""


@attrs.define
class _Deployment:
    worker: Worker
    relay: RedisRelay
    front: PostgresStore
    queue: TurnQueue
    gate: _Gate


@contextmanager
def _info_logs() -> Iterator[list[dict[str, Any]]]:
    """The lines logged meanwhile, down to info (the tests' configuration stops at
    warning; the autouse fixture restores it after the test)."""
    configure_logging("info", stream=io.StringIO())
    with capture_logs() as logs:
        yield logs


@asynccontextmanager
async def _deployment(pg_url: str, redis_url: str, **options: Any) -> AsyncIterator[_Deployment]:
    """A worker with a Redis relay, and a front end's store and queue on its schema."""
    worker_store = await PostgresStore.open(pg_url)
    front = await PostgresStore.open(pg_url)
    queue = TurnQueue(front)
    gate: _Gate = _Gate()
    try:
        async with (
            RedisRelay.open(redis_url, prefix=unique_prefix()) as relay,
            trio.open_nursery() as nursery,
        ):
            worker = Worker(
                store=worker_store,
                relay=relay,
                agent=_agent(gate, []),
                owner="w",
                poll=0.05,
                **options,
            )
            await nursery.start(worker.run)
            yield _Deployment(worker, relay, front, queue, gate)
            worker.stop()
    finally:
        with trio.CancelScope(shield=True):
            await queue.aclose()
            await front.aclose()
            await worker_store.aclose()


async def _held_turn(d: _Deployment) -> str:
    """A stored session ``s`` whose second turn now waits in its ``hold`` tool."""
    first = await d.queue.submit("s", "first")
    done = await d.queue.wait_finished(first.turn_id, LIMIT)
    assert done is not None and done.status == "done"
    held = await d.queue.submit("s", "hold on")
    with trio.fail_after(LIMIT):
        await d.gate.entered.wait()
    return held.turn_id


async def _read(d: _Deployment, turn_id: str, after_seq: int | None = None) -> list[Any]:
    """The turn's relay stream read to its end, as a viewer that did not delete reads it.
    Nothing but the stream's end ends the read: once the worker runs no turn (its
    writer closed, flushed), a second read that finds nothing more fails (:class:`_NoEnd`)."""
    quiet_after_idle = 0

    async def on_quiet(_: float) -> None:
        nonlocal quiet_after_idle
        if not d.worker.running:
            quiet_after_idle += 1
            if quiet_after_idle >= 2:
                raise _NoEnd(f"turn {turn_id}'s stream has no end; its worker is idle")

    with trio.fail_after(LIMIT):
        while True:
            try:
                read = d.relay.read(turn_id, after_seq=after_seq, on_quiet=on_quiet)
                return [chunk async for chunk in read]
            except RelayTurnGone:  # not flushed yet: the turn's first chunks are on their way
                await trio.sleep(0.02)


async def _until_idle(worker: Worker) -> None:
    with trio.fail_after(LIMIT):
        while worker.running:  # noqa: ASYNC110 - the deleted turn ends on the worker
            await trio.sleep(0.02)


ABORT = ("abort", SESSION_DELETED)
"""The end the deleting front end gives its own viewers (``abort``, ``session deleted``)."""


def _ends(chunks: list[Any]) -> list[tuple[str, str | None]]:
    """The stream's last chunk's type and reason (a list: an empty stream shows as one)."""
    return [(c.type, getattr(c, "reason", None)) for c in chunks[-1:]]


async def test_relay_readers_that_did_not_delete_see_the_deleted_turns_stream_end_with_abort(
    pg_url: str, redis_url: str
) -> None:
    async with _deployment(pg_url, redis_url) as d:
        turn_id = await _held_turn(d)
        live: list[Any] = []
        async with trio.open_nursery() as nursery:

            async def viewer() -> None:  # on a front end that did not get the DELETE
                live.extend(await _read(d, turn_id))

            nursery.start_soon(viewer)
            await d.front.delete("s")  # as a front end does: the store's delete only
            d.gate.opened.set()
            await _until_idle(d.worker)
        resumed = await _read(d, turn_id, after_seq=1)  # a reconnect with Last-Event-ID
    assert _ends(live) == [ABORT]
    assert _ends(resumed) == [ABORT]
    assert [c for c in live if isinstance(c, o.Abort | o.Finish | o.Error)] == [live[-1]]


async def test_the_worker_logs_the_deleted_turn_once_at_info_and_counts_it_cancelled_not_lost(
    pg_url: str, redis_url: str
) -> None:
    async with _deployment(pg_url, redis_url) as d:
        turn_id = await _held_turn(d)
        with _info_logs() as logs:
            await d.front.delete("s")
            d.gate.opened.set()
            await _until_idle(d.worker)
        done = dict(d.worker.done)
    events = [e for e in logs if e["event"].startswith("worker.")]
    assert [e for e in events if e["event"] == "worker.lease_lost"] == []
    deleted = [e for e in events if e["event"] == "worker.session_deleted"]
    assert [(e["log_level"], e["turn_id"], e["session_id"]) for e in deleted] == [
        ("info", turn_id, "s")
    ]
    assert done == {"done": 1, "cancelled": 1}


async def test_a_deletion_the_lease_renewal_finds_ends_the_turn_as_deleted(
    pg_url: str, redis_url: str
) -> None:
    """The turn saves nothing after the delete (its tool never returns) and nobody asks
    the relay to cancel it: the lease's next renewal is what finds the row deleted."""
    async with _deployment(pg_url, redis_url, lease=1.5) as d:
        turn_id = await _held_turn(d)
        with _info_logs() as logs:
            await d.front.delete("s")
            await _until_idle(d.worker)  # the renewal cancels the held tool
        ended = await _read(d, turn_id)
        done = dict(d.worker.done)
    whys = [(e["event"], e.get("why")) for e in logs if e["event"].startswith("worker.")]
    assert whys == [("worker.session_deleted", "renewal refused")]
    assert _ends(ended) == [ABORT]
    assert done == {"done": 1, "cancelled": 1}
