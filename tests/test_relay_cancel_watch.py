"""A worker's subscription to cancel requests (``RedisRelay.watch_cancels``) outlives a
connection closed under it: coredis's subscription sends its ``UNSUBSCRIBE`` on the way
out, also on a connection already closed (a worker shutting down, Redis gone), and that
``anyio.ClosedResourceError`` came out of the worker's nursery as a crash (seen in a full
run of the suite: test_frontend's never-reading client, at the worker's shutdown)."""

from __future__ import annotations

from typing import Any

import anyio
import orjson
import trio
import trio.testing

from actors.relays import RedisRelay


class _Connection:
    """A subscription's connection as far as the watch's PINGs use it: it answers."""

    def __init__(self) -> None:
        self.pings = 0

    async def create_request(self, command: bytes, **options: Any) -> bytes:
        self.pings += 1
        return b"PONG"

    def invalidate(self) -> None:
        raise AssertionError("a connection that answers is not dropped")


class _Subscription:
    """coredis's pubsub as far as the watch uses it: raises ``fail`` where asked."""

    def __init__(self, messages: list[dict[str, Any]], *, fail_on_read: bool, fail_on_exit: bool):
        self.messages = messages
        self.fail_on_read = fail_on_read
        self.fail_on_exit = fail_on_exit
        self.connection = _Connection()

    async def __aenter__(self) -> _Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.fail_on_exit:
            raise anyio.ClosedResourceError

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self.fail_on_read:
            raise anyio.ClosedResourceError
        if self.messages:
            return self.messages.pop(0)
        await trio.sleep_forever()
        raise AssertionError


class _Client:
    def __init__(self, *subscriptions: _Subscription) -> None:
        self.subscriptions = list(subscriptions)
        self.opened = 0

    def pubsub(self, **options: Any) -> _Subscription:
        self.opened += 1
        return self.subscriptions.pop(0)


def cancel_message(turn_id: str) -> dict[str, Any]:
    return {"type": "message", "data": orjson.dumps({"turn_id": turn_id, "reason": "stop"})}


async def test_a_closed_connection_at_shutdown_ends_the_watch_quietly():
    client = _Client(_Subscription([], fail_on_read=False, fail_on_exit=True))
    async with trio.open_nursery() as nursery:
        relay = RedisRelay(None, nursery)
        relay.client = client  # type: ignore[assignment]
        await nursery.start(relay.watch_cancels, lambda turn_id, reason: None)
        nursery.cancel_scope.cancel()  # the worker shuts down
    assert client.opened == 1


async def test_a_connection_closed_under_the_watch_subscribes_again(autojump_clock):
    cancelled: list[tuple[str, str]] = []
    client = _Client(
        _Subscription([], fail_on_read=True, fail_on_exit=True),
        _Subscription([cancel_message("t1")], fail_on_read=False, fail_on_exit=False),
    )
    async with trio.open_nursery() as nursery:
        relay = RedisRelay(None, nursery)
        relay.client = client  # type: ignore[assignment]
        await nursery.start(relay.watch_cancels, lambda *got: cancelled.append(got))
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert client.opened == 2
    assert cancelled == [("t1", "stop")]


class _Silent(_Connection):
    """A connection held or black-holed: no PING is ever answered."""

    def __init__(self) -> None:
        super().__init__()
        self.invalidated = False

    async def create_request(self, command: bytes, **options: Any) -> bytes:
        self.pings += 1
        await trio.sleep_forever()
        raise AssertionError

    def invalidate(self) -> None:
        self.invalidated = True


async def test_a_subscription_that_answers_no_ping_is_dropped_and_made_again(autojump_clock):
    """One PING every ``cancel_ping`` on the subscription (not one a turn): unanswered
    within ``op_timeout``, its connection is dropped and the watch subscribes again."""
    dead = _Subscription([], fail_on_read=False, fail_on_exit=False)
    dead.connection = _Silent()
    live = _Subscription([], fail_on_read=False, fail_on_exit=False)
    client = _Client(dead, live)
    async with trio.open_nursery() as nursery:
        relay = RedisRelay(None, nursery, cancel_ping=5.0, op_timeout=2.0)
        relay.client = client  # type: ignore[assignment]
        await nursery.start(relay.watch_cancels, lambda *got: None)
        await trio.sleep(7.5)  # the first PING at 5 s, unanswered at 7 s
        assert client.opened == 2 and dead.connection.invalidated
        await trio.sleep(60 - 7.5)
        nursery.cancel_scope.cancel()
    assert dead.connection.pings == 1
    assert 10 <= live.connection.pings <= 11  # one each 5 s, the minute's rest
