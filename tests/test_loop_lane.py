"""The store's event-loop lane (:class:`actors.stores.postgres_lane.LoopLane`) on a fake libpq
connection: a call with a free slot sends its statement without a schedule point before
it (issue 24 goal 3: the ``Semaphore``'s ``async with`` yielded once even with a slot
free, a task step for nothing a few times a turn), a cancelled caller sends nothing, and
a call beyond the lane's size still waits for a slot, and a call reads nothing more once
libpq holds its answer whole."""

from __future__ import annotations

import socket
from typing import Any

import psycopg
import trio

from actors.stores.postgres_lane import LoopLane
from tests.support.steps import scopes_counted


class _Result:
    status = psycopg.pq.ExecStatus.TUPLES_OK


class _PgConn:
    """libpq's non-blocking side as :class:`LoopLane` uses it: busy until the test's end of
    the socket pair writes a byte (the server's answer)."""

    def __init__(self, log: list[str], answered: bool) -> None:
        self.log = log
        self.ours, self.server = socket.socketpair()
        self.ours.setblocking(False)
        self.socket = self.ours.fileno()
        self._answers = 0
        self.reads = 0
        """``consume_input`` calls: each is a ``recv`` on a real connection."""
        self._busy = False
        self._auto = answered

    def send_prepare(self, name: bytes, sql: bytes) -> None:
        self.log.append(f"prepare {name.decode()}")
        self._start()

    def send_query_prepared(self, name: bytes, *args: Any) -> None:
        self.log.append(f"send {name.decode()}")
        self._start()

    def _start(self) -> None:
        self._busy, self._got = True, False
        if self._auto:
            self.server.send(b"x")

    def flush(self) -> int:
        return 0

    def consume_input(self) -> None:
        self.reads += 1
        try:
            if self.ours.recv(1):
                self._busy = False
        except BlockingIOError:
            pass

    def is_busy(self) -> bool:
        return self._busy

    def get_result(self) -> Any:
        if self._got:
            return None
        self._got = True
        return _Result()


class _Conn:
    def __init__(self, log: list[str], *, answered: bool = True) -> None:
        self.pgconn = _PgConn(log, answered)
        self._axon_prepared = {b"known"}
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _lane(*conns: _Conn) -> LoopLane:
    lane = LoopLane("", "public", len(conns))
    lane._free.extend(conns)
    return lane


async def test_a_call_with_a_free_slot_sends_before_another_task_runs() -> None:
    log: list[str] = []
    lane = _lane(_Conn(log))

    async def other() -> None:
        log.append("other task")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other)  # runnable from here on
        await lane.call(b"known", b"SELECT 1", [], [])
    assert log[:2] == ["send known", "other task"], log


async def test_a_cancelled_caller_sends_nothing_and_leaves_its_slot_free() -> None:
    log: list[str] = []
    conn = _Conn(log)
    lane = _lane(conn)
    with trio.CancelScope() as scope:
        scope.cancel()
        await lane.call(b"known", b"SELECT 1", [], [])
    assert log == []
    await lane.call(b"new", b"SELECT 2", [], [])  # the slot was given back
    assert log == ["prepare new", "send new"]
    assert not conn.closed


async def test_a_call_beyond_the_lanes_size_waits_for_a_slot() -> None:
    log: list[str] = []
    conn = _Conn(log, answered=False)
    lane = _lane(conn)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lane.call, b"known", b"SELECT 1", [], [])
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(lane.call, b"known", b"SELECT 1", [], [])
        await trio.testing.wait_all_tasks_blocked()
        assert log == ["send known"]  # the second waits for the only connection
        conn.pgconn._auto = True
        conn.pgconn.server.send(b"x")  # the first's answer
    assert log == ["send known", "send known"]
    assert lane._free == [conn]


async def test_a_call_reads_no_more_after_its_result_when_libpq_holds_the_answer_whole() -> None:
    # Issue 24 goal 3: after a call's result the lane read again, a recv that found
    # nothing (EAGAIN) whenever the answer's ReadyForQuery came in the same read.
    log: list[str] = []
    conn = _Conn(log, answered=False)
    lane = _lane(conn)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lane.call, b"known", b"SELECT 1", [], [])
        await trio.testing.wait_all_tasks_blocked()
        before = conn.pgconn.reads
        conn.pgconn.server.send(b"x")  # the answer
    # read at once after the send (a busy machine's server may have answered by then),
    # then once the socket was readable; none after the result
    assert (before, conn.pgconn.reads) == (1, 2)
    conn.pgconn._auto = True  # answered before the lane reads: no wait, one read a call
    for _ in range(5):
        await lane.call(b"known", b"SELECT 1", [], [])
    assert conn.pgconn.reads == 7


async def test_a_call_answered_at_once_enters_no_cancel_scope() -> None:
    # Issue 24 goal 3: the shield's scope (~3.5 µs) was entered for every call, also when
    # the answer was whole at the first read, as it often is on a busy machine (the
    # backend the statement woke ran before the lane read): two calls a worker's turn.
    log: list[str] = []
    conn = _Conn(log)  # answered before the lane reads
    lane = _lane(conn)
    await lane.call(b"known", b"SELECT 1", [], [])  # warm
    with scopes_counted() as scopes:
        for _ in range(5):
            await lane.call(b"known", b"SELECT 1", [], [])
    assert scopes.total() == 0
    assert conn.pgconn.reads == 6 and lane._free == [conn]  # one read a call, none after


async def test_a_call_that_waits_for_its_answer_is_shielded_and_reads_once_per_wake() -> None:
    # Not answered at the first read: the wait is shielded (the statement is sent: its
    # answer is read whatever the caller does), one scope, and read again only once the
    # socket is readable.
    log: list[str] = []
    conn = _Conn(log, answered=False)
    lane = _lane(conn)
    got: list[object] = []
    scope = trio.CancelScope()

    async def caller() -> None:
        with scope:
            got.append(await lane.call(b"known", b"SELECT 1", [], []))

    with scopes_counted() as scopes:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()  # the caller is cancelled as it waits
            await trio.testing.wait_all_tasks_blocked()
            assert got == [] and conn.pgconn.reads == 1
            conn.pgconn.server.send(b"x")  # the answer
    assert scopes.of("postgres_lane") == 1
    assert len(got) == 1 and isinstance(got[0], _Result)
    assert conn.pgconn.reads == 2 and lane._free == [conn] and not conn.closed


async def test_a_call_and_its_retry_wrapper_import_nothing_when_all_goes_well(
    monkeypatch: Any,
) -> None:
    # Issue 24 goal 3: each lane call (two a worker's turn, through ``_retrying``) ran two
    # import statements of psycopg (~0.5 µs each) for the error it did not have.
    import builtins

    from actors.stores import postgres_lane
    from actors.stores.postgres_health import _retrying

    assert postgres_lane._FATAL_ERROR == psycopg.pq.ExecStatus.FATAL_ERROR
    log: list[str] = []
    lane = _lane(_Conn(log))
    await lane.call(b"known", b"SELECT 1", [], [])  # warm
    imports: list[str] = []
    original = builtins.__import__

    def counted(name: str, *args: Any, **kwargs: Any) -> Any:
        imports.append(name)
        return original(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", counted)
    got = await _retrying("save", 1.0, lambda: lane.call(b"known", b"SELECT 1", [], []))
    monkeypatch.undo()
    assert isinstance(got, _Result)
    assert imports == []


async def test_a_failed_result_still_raises_as_psycopg_raises_it() -> None:
    from actors.stores.postgres_lane import _checked

    class _Failed:
        status = psycopg.pq.ExecStatus.FATAL_ERROR

        def error_field(self, field: Any) -> bytes | None:
            return {psycopg.pq.DiagnosticField.SQLSTATE: b"23505"}.get(field, b"dup")

        def get_error_message(self, encoding: str = "utf-8") -> str:
            return "duplicate key"

    try:
        _checked([_Failed()])
    except psycopg.errors.UniqueViolation:
        pass
    else:
        raise AssertionError("no error raised")
