"""The relay writers' own RESP connection (actors/relays/resp.py) against a server that
misbehaves: a loopback TCP server scripted per connection, so that each failure Redis
could show (an error reply, junk, a close mid-reply, a refused password, a reply that
arrives after its caller gave up) is shown on purpose. What the writer sees is coredis's
exception types; what must never happen is a reply handed to the wrong pipeline."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from types import EllipsisType
from typing import Any

import hiredis
import pytest
import trio
from coredis.exceptions import ConnectionError as RedisConnectionError
from coredis.exceptions import ResponseError

from actors.relays.resp import Address, RespConnection

# A connection's script: given the commands read so far on it (each a list of bytes),
# the bytes to answer, or None to close the connection, or ... to stay silent.
Script = Callable[[list[list[bytes]]], bytes | EllipsisType | None]


@asynccontextmanager
async def scripted_server(*scripts: Script) -> AsyncIterator[tuple[int, list[list[list[bytes]]]]]:
    """A server whose n-th connection answers by ``scripts[n]``; yields its port and the
    commands each connection received."""
    received: list[list[list[bytes]]] = []

    async def serve(stream: trio.SocketStream) -> None:
        index = len(received)
        seen: list[list[bytes]] = []
        received.append(seen)
        script = scripts[min(index, len(scripts) - 1)]
        reader = hiredis.Reader()
        async with stream:
            while chunk := await stream.receive_some(65536):
                reader.feed(chunk)
                while (command := reader.gets()) is not False:
                    seen.append(command)
                    answer = script(seen)
                    if answer is None:
                        return
                    if answer is not ...:
                        await stream.send_all(answer)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
        yield listeners[0].socket.getsockname()[1], received
        nursery.cancel_scope.cancel()


def ok(seen: list[list[bytes]]) -> bytes:
    return b"+OK\r\n"


def connection(port: int, **kw: object) -> RespConnection:
    return RespConnection(Address(host="127.0.0.1", port=port, **kw))  # type: ignore[arg-type]


async def test_an_error_reply_fails_its_command_alone() -> None:
    def script(seen: list[list[bytes]]) -> bytes:
        return b"-WRONGTYPE not a stream\r\n" if seen[-1][1] == b"bad" else b"$3\r\n1-1\r\n"

    async with scripted_server(script) as (port, _):
        conn = connection(port)
        replies = await conn.pipeline(
            [["XADD", "good", "*", "f", "v"], ["XADD", "bad", "*", "f", "v"]]
        )
        await conn.aclose()
    assert replies[0] == b"1-1"
    assert isinstance(replies[1], ResponseError) and "WRONGTYPE" in str(replies[1])


async def test_junk_from_the_server_drops_the_connection_and_the_next_pipeline_opens_another() -> (
    None
):
    async with scripted_server(lambda seen: b"?what\r\n", ok) as (port, received):
        conn = connection(port)
        with pytest.raises(RedisConnectionError, match="relay write connection"):
            await conn.pipeline([["SET", "k", "v"]])
        assert await conn.pipeline([["SET", "k", "v"]]) == [b"OK"]
        await conn.aclose()
    assert len(received) == 2


async def test_a_close_mid_reply_fails_the_pipeline_and_nothing_of_it_reaches_the_next() -> None:
    def half(seen: list[list[bytes]]) -> bytes | None:
        return b"$10\r\nhal" if len(seen) == 1 else None  # a bulk cut short, then closed

    async with scripted_server(half, lambda seen: b"$4\r\nnext\r\n") as (port, _):
        conn = connection(port)
        with pytest.raises(RedisConnectionError, match="closed"):
            await conn.pipeline([["GET", "a"], ["GET", "b"]])
        assert await conn.pipeline([["GET", "c"]]) == [b"next"]
        await conn.aclose()


async def test_a_reply_that_comes_after_its_caller_gave_up_is_never_read_as_the_next_ones() -> None:
    late = trio.Event()

    def slow_then_fine(seen: list[list[bytes]]) -> bytes | EllipsisType:
        if seen[-1] == [b"GET", b"first"]:
            late.set()
            return ...  # silent: the caller times out
        return b"$6\r\nsecond\r\n"

    async with scripted_server(slow_then_fine) as (port, received):
        conn = connection(port)
        with trio.move_on_after(0.2) as scope:
            await conn.pipeline([["GET", "first"]])
        assert scope.cancelled_caught and late.is_set()
        assert await conn.pipeline([["GET", "second"]]) == [b"second"]
        await conn.aclose()
    assert len(received) == 2  # the first connection was dropped, not reused


async def test_a_refused_password_is_a_connection_error_that_does_not_quote_it() -> None:
    def refuse(seen: list[list[bytes]]) -> bytes:
        return b"-WRONGPASS invalid username-password pair\r\n"

    async with scripted_server(refuse) as (port, received):
        conn = connection(port, username="app", password="s3cret-p@ss")
        with pytest.raises(RedisConnectionError) as caught:
            await conn.pipeline([["SET", "k", "v"]])
    assert received[0][0] == [b"AUTH", b"app", b"s3cret-p@ss"]
    assert "WRONGPASS" in str(caught.value) and "s3cret" not in str(caught.value)
    assert [b"SET", b"k", b"v"] not in received[0]  # nothing sent on a refused connection


async def test_the_database_is_selected_before_the_first_command() -> None:
    async with scripted_server(ok) as (port, received):
        conn = connection(port, db=3)
        assert await conn.pipeline([["SET", "k", "v"]]) == [b"OK"]
        await conn.aclose()
    assert received[0] == [[b"SELECT", b"3"], [b"SET", b"k", b"v"]]


async def test_a_pipeline_takes_one_schedule_point_its_wait_for_the_replies() -> None:
    from tests.support.steps import counted

    async with scripted_server(ok) as (port, _):
        conn = connection(port)
        await conn.pipeline([["SET", "k", "v"]])  # connected: the count is a pipeline's
        task = trio.lowlevel.current_task()
        with counted() as steps:
            replies = await conn.pipeline([["SET", "k", "w"]])
        await conn.aclose()
    # woken once with the reply; a Trio socket's send and recv yielded after each too
    assert (replies, steps.of(task)) == ([b"OK"], 1)


async def test_a_pipeline_whose_replies_are_there_at_once_still_yields_once() -> None:
    from tests.support.steps import counted

    async with scripted_server(ok) as (port, _):
        conn = connection(port)
        await conn.pipeline([["SET", "k", "v"]])
        conn._reader.feed(b"+OK\r\n")  # a reply already buffered: nothing to wait for
        task = trio.lowlevel.current_task()
        with counted() as steps:
            replies = await conn.pipeline([["GET", "k"]])
        await conn.aclose()
    assert (replies, steps.of(task)) == ([b"OK"], 1)


async def test_a_pipeline_that_goes_through_imports_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Issue 24 goal 3: the relay's flusher sends a few pipelines a worker's turn; each
    # ran an import statement (~0.7 us) for the error type of a failure it did not have.
    import builtins

    imports: list[str] = []
    original = builtins.__import__

    def counted(name: str, *args: object, **kwargs: object) -> object:
        imports.append(name)
        return original(name, *args, **kwargs)  # type: ignore[arg-type]

    async with scripted_server(lambda seen: b"$3\r\n1-1\r\n") as (port, _):
        conn = connection(port)
        await conn.pipeline([["XADD", "k", "*", "f", "v"]])  # (its connection opened)
        monkeypatch.setattr(builtins, "__import__", counted)
        replies = await conn.pipeline([["XADD", "k", "*", "f", "v"], ["XADD", "k", "*", "f", "w"]])
        monkeypatch.undo()
        await conn.aclose()
    assert replies == [b"1-1", b"1-1"]
    assert imports == []


def test_a_pipeline_s_commands_are_encoded_without_a_generator() -> None:
    # Issue 24 goal 3: a generator resumed once a command, a pipeline a flush.
    from actors.relays.resp import encode

    events: list[str] = []

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            events.append(frame.f_code.co_name)

    commands = [["XADD", "k", "1-1", "f", "v"], ["EXPIRE", "k", 60], ["SET", "a", "t", "EX", 60]]
    sys.setprofile(count)
    try:
        data = encode(commands)
    finally:
        sys.setprofile(None)
    assert data == b"".join(hiredis.pack_command(tuple(c)) for c in commands)  # type: ignore[arg-type]
    assert "<genexpr>" not in events
