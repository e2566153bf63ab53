"""A worker's wait for new work takes every notification received at once (issue 24
goal 3): each turn's end notifies every worker, and a worker with its slots full reads
none until it waits again; taken one a wait, each cost a claim that found nothing.

The ``LISTEN`` connection is a stand-in here (libpq's ``consume_input``/``notifies`` on
a socket pair), so what one wait takes off it is a count, not a timing."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors.stores.turn_listen import _wait_for_notify


@attrs.define
class _Notify:
    extra: bytes


@attrs.define
class _PgConn:
    """libpq's side of a ``LISTEN`` connection: notifications reach its queue only when
    ``consume_input`` reads them, ``per_read`` at a time (libpq's buffer is finite)."""

    socket: int
    arriving: list[bytes] = attrs.field(factory=list)
    per_read: int = 1000
    reads: int = 0
    queue: list[_Notify] = attrs.field(factory=list)

    def consume_input(self) -> None:
        self.reads += 1
        taken, self.arriving = self.arriving[: self.per_read], self.arriving[self.per_read :]
        self.queue += [_Notify(extra) for extra in taken]

    def notifies(self) -> _Notify | None:
        return self.queue.pop(0) if self.queue else None


@attrs.define
class _Conn:
    pgconn: _PgConn


@pytest.fixture
def conn() -> Iterator[_Conn]:
    a, b = socket.socketpair()
    with a, b:
        yield _Conn(_PgConn(socket=a.fileno()))


async def test_one_wait_takes_every_notification_received(conn: Any) -> None:
    conn.pgconn.arriving = [f"s:turn{i}".encode() for i in range(5)]
    assert await _wait_for_notify(conn, "s:", 10)
    assert conn.pgconn.queue == [] and conn.pgconn.arriving == []


async def test_one_wait_reads_again_until_a_read_brings_none(conn: Any) -> None:
    conn.pgconn.arriving = [f"s:turn{i}".encode() for i in range(5)]
    conn.pgconn.per_read = 2
    assert await _wait_for_notify(conn, "s:", 10)
    assert conn.pgconn.arriving == [] and conn.pgconn.reads == 4  # 2, 2, 1, none


async def test_the_wait_after_taking_them_all_times_out(conn: Any, autojump_clock: Any) -> None:
    conn.pgconn.arriving = [f"s:turn{i}".encode() for i in range(5)]
    assert await _wait_for_notify(conn, "s:", 10)
    assert not await _wait_for_notify(conn, "s:", 10)


async def test_another_schemas_notifications_are_taken_and_wake_nobody(
    conn: Any, autojump_clock: Any
) -> None:
    conn.pgconn.arriving = [b"other:turn1", b"other:turn2"]
    assert not await _wait_for_notify(conn, "s:", 10)
    assert conn.pgconn.queue == [] and conn.pgconn.arriving == []


async def test_this_schemas_notification_among_others_wakes_the_wait(conn: Any) -> None:
    conn.pgconn.arriving = [b"other:turn1", b"s:turn2", b"other:turn3"]
    assert await _wait_for_notify(conn, "s:", 10)
    assert conn.pgconn.queue == []


async def test_a_notification_arriving_later_wakes_a_waiting_wait(conn: Any) -> None:
    a, b = socket.socketpair()
    with a, b:
        conn.pgconn.socket = a.fileno()

        async def later() -> None:
            await trio.testing.wait_all_tasks_blocked()  # the wait is in its read
            conn.pgconn.arriving.append(b"s:turn1")
            b.send(b"x")  # the socket readable, as the server's message makes it

        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            assert await _wait_for_notify(conn, "s:", 10)
