"""A stop naming a message or a turn, sent to an embedded front end that does not run the
session's turn (``serve --redis``: another embedded host runs it and publishes it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
import trio

from actors.relays.redis_entries import _cancel_from
from runtime.messages import ToolMessage
from tests.support.redis import require_redis
from tests.test_busy import Script, held, holding
from tests.test_busy_web import agent_of
from tests.test_relay_web import two_front_ends, wait_streaming
from tests.test_web_http import body
from tests.web.harness import wait_idle

LIMIT = 10


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


async def _post_into(client: httpx.AsyncClient, url: str, into: dict, key: str, sent: Any) -> None:
    into[key] = await client.post(f"{url}/api/chat", json=sent, timeout=30)


def _events(response: httpx.Response) -> list[str]:
    return [line for line in response.text.split("\n\n") if line]


async def _until(done: Any) -> None:
    with trio.fail_after(LIMIT):
        while not done():  # noqa: ASYNC110
            await trio.sleep(0.01)


@pytest.mark.parametrize("named", ["messageId", "turnId"])
async def test_a_stop_naming_the_running_turn_on_another_front_end_stops_it(
    redis_url: str, named: str
) -> None:
    # B held nothing of the session, so a stop naming the turn's message (the chat
    # page's, an AG-UI client's) or its turn was a 204 and the turn on A ran on.
    script = Script(holding(), ["never"])
    async with two_front_ends(redis_url, agent_of(script)) as (a, b):
        async with httpx.AsyncClient(timeout=20) as client:
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "go", message_id="u1")
                )
                await held["open"].wait()
                await wait_streaming(client, f"{b.url}/api/chat/s/stream")
                turn_id = a.host.sessions["s"].current.turn_id
                name = "u1" if named == "messageId" else turn_id
                stop = await client.post(f"{b.url}/api/chat/s/stop", json={named: name})
                await _until(lambda: "u1" in replies)
                held["release"].set()
            await wait_idle(a, "s")
            saved = (await a.host.store.load("s")).messages[-1]
    assert stop.status_code == 202 and stop.json() == {"turn_id": turn_id, "forwarded": True}
    assert 'data: {"type":"abort","reason":"stopped by user"}' in _events(replies["u1"])
    assert isinstance(saved, ToolMessage) and saved.error.startswith("interrupted")
    assert len(script.requests) == 1  # stopped in its first step


async def test_a_stop_naming_another_message_on_another_front_end_leaves_the_turn_alone(
    redis_url: str,
) -> None:
    script = Script(holding(), ["first done"])
    async with two_front_ends(redis_url, agent_of(script)) as (a, b):
        async with httpx.AsyncClient(timeout=20) as client:
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "go", message_id="u1")
                )
                await held["open"].wait()
                await wait_streaming(client, f"{b.url}/api/chat/s/stream")
                stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u9"})
                await trio.sleep(0.3)  # (what a stop that reached A would take to show)
                assert a.host.sessions["s"].current is not None
                held["release"].set()
            await wait_idle(a, "s")
    assert stop.status_code == 202  # forwarded: only A can tell what u9 names
    assert '"finishReason":"stop"' in replies["u1"].text
    assert "abort" not in replies["u1"].text


async def test_a_stop_naming_a_message_queued_on_another_front_end_takes_it_out(
    redis_url: str,
) -> None:
    script = Script(holding(), ["first done"], ["never"])
    async with two_front_ends(redis_url, agent_of(script, "enqueue")) as (a, b):
        async with httpx.AsyncClient(timeout=20) as client:
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "one", message_id="u1")
                )
                await held["open"].wait()
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u2", body("s", "two", message_id="u2")
                )
                await _until(lambda: a.host.sessions["s"].waiting_inputs >= 1)
                stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u2"})
                await _until(lambda: "u2" in replies)
                assert a.host.sessions["s"].current is not None  # the running turn goes on
                held["release"].set()
            await wait_idle(a, "s")
            stored = (await a.host.store.load("s")).messages
    assert stop.status_code == 202
    assert _events(replies["u2"]) == [
        'data: {"type":"abort","reason":"stopped by user"}',
        "data: [DONE]",
    ]
    assert [m.content for m in stored if m.role == "user"][-1] == "one"
    assert len(script.requests) == 2  # "one"'s two steps; "two" never ran


def test_a_watch_that_takes_no_named_stops_cancels_only_one_naming_its_turn() -> None:
    # A worker's watch has no ``on_named``: a named stop must not cancel its running
    # turn for a message that may be one waiting behind it.
    cancelled: list[tuple[str, str]] = []

    def named(**fields: str) -> dict:
        return {"type": "message", "data": orjson.dumps({"turn_id": "t", **fields})}

    _cancel_from(named(session_id="s", message_id="u2", reason="r"), lambda *a: cancelled.append(a))
    _cancel_from(named(session_id="s", named_turn="q", reason="r"), lambda *a: cancelled.append(a))
    assert cancelled == []
    _cancel_from(named(session_id="s", named_turn="t", reason="r"), lambda *a: cancelled.append(a))
    _cancel_from(named(reason="plain"), lambda *a: cancelled.append(a))
    assert cancelled == [("t", "r"), ("t", "plain")]


async def test_a_stop_naming_a_queued_message_sent_while_its_hosts_subscription_is_dead_stops_it(
    redis_url: str,
) -> None:
    # A runs "one" and holds "two" queued (its turn has no relay writer yet); A's cancel
    # subscription is black-holed when B forwards a stop naming "two". The stop is
    # recorded under the running turn's id, which ends before A subscribes again; A then
    # read back only the stops of the turns it still streamed ("two"'s), so the stop was
    # lost and "two" ran to its answer.
    from actors.relays import RedisRelay, attach_relay
    from tests.support.redis import redis_address, unique_prefix
    from tests.support.redis_proxy import redis_fault_proxy, scripted
    from tests.web.harness import web_server

    script = Script(holding("H1"), ["first done"], holding("H2"), ["never"])
    agent = agent_of(script, "enqueue")
    prefix = unique_prefix()
    async with (
        redis_fault_proxy(redis_address(), scripted({})) as proxy,
        RedisRelay.open(proxy.url, prefix=prefix, cancel_ping=0.5, op_timeout=2.0) as relay_a,
        RedisRelay.open(redis_url, prefix=prefix) as relay_b,
        web_server(agent, relay=relay_a) as a,
        web_server(agent, relay=relay_b) as b,
    ):
        await attach_relay(a.host, relay_a)
        async with httpx.AsyncClient(timeout=30) as client:
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "one", message_id="u1")
                )
                await held["open"].wait()
                await wait_streaming(client, f"{b.url}/api/chat/s/stream")
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u2", body("s", "two", message_id="u2")
                )
                await _until(lambda: a.host.sessions["s"].waiting_inputs >= 1)
                assert proxy.hold_subscriptions() == 1  # A is deaf from now on
                stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u2"})
                first = held["release"]
                held["open"], held["release"] = trio.Event(), trio.Event()
                first.set()  # "one" ends (its writer closes); "two" starts, held by its tool
                await _until(lambda: "u1" in replies)
                with trio.move_on_after(LIMIT):  # (before: held until released)
                    await _until(lambda: "u2" in replies)
                held["release"].set()
            await wait_idle(a, "s")
            stored = (await a.host.store.load("s")).messages
    assert stop.status_code == 202 and stop.json()["forwarded"] is True
    assert '"finishReason":"stop"' in replies["u1"].text
    assert 'data: {"type":"abort","reason":"stopped by user"}' in _events(replies["u2"])
    assert "never" not in replies["u2"].text  # before: "two" answered "never"
    assert not any(m.role == "assistant" and "never" in str(m.content) for m in stored)


@pytest.mark.parametrize("named", ["messageId", "turnId"])
async def test_a_stop_naming_a_turn_that_has_written_nothing_to_the_relay_yet_stops_it(
    redis_url: str, named: str
) -> None:
    # A runs "go" but its publisher has not written the turn's first chunk to Redis
    # (held here by a gate on the publisher), so the relay knows of no running turn: B
    # answered 204 and did not forward the stop, and the turn ran to its answer.
    from actors.relays import RedisRelay, attach_relay
    from tests.support.redis import unique_prefix
    from tests.web.harness import web_server

    script = Script(holding(), ["never"])
    agent = agent_of(script)
    prefix = unique_prefix()
    async with (
        RedisRelay.open(redis_url, prefix=prefix) as relay_a,
        RedisRelay.open(redis_url, prefix=prefix) as relay_b,
        web_server(agent, relay=relay_a) as a,
        web_server(agent, relay=relay_b) as b,
    ):
        gate = _held_publishing(await attach_relay(a.host, relay_a))
        async with httpx.AsyncClient(timeout=30) as client:
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "go", message_id="u1")
                )
                await held["open"].wait()
                assert await relay_b.active_turn("s") is None  # nothing written yet
                turn_id = a.host.sessions["s"].current.turn_id
                name = "u1" if named == "messageId" else turn_id
                stop = await client.post(f"{b.url}/api/chat/s/stop", json={named: name})
                gate.set()
                with trio.move_on_after(LIMIT):  # (before: held until released)
                    await _until(lambda: "u1" in replies)
                held["release"].set()
            await wait_idle(a, "s")
    assert stop.status_code == 202 and stop.json() == {"turn_id": None, "forwarded": True}
    assert 'data: {"type":"abort","reason":"stopped by user"}' in _events(replies["u1"])
    assert "never" not in replies["u1"].text  # before: the turn answered "never"
    assert len(script.requests) == 1  # stopped in its first step


async def test_a_stop_naming_an_unwritten_turn_sent_while_its_host_is_deaf_stops_it(
    redis_url: str,
) -> None:
    # As above, and A's cancel subscription is black-holed when B sends the stop: the
    # stop is recorded under the session (no turn to record it under); A, subscribed
    # again, reads it back for the session its turn's writer streams.
    from actors.relays import RedisRelay, attach_relay
    from tests.support.redis import redis_address, unique_prefix
    from tests.support.redis_proxy import redis_fault_proxy, scripted
    from tests.web.harness import web_server

    script = Script(holding(), ["never"])
    agent = agent_of(script)
    prefix = unique_prefix()
    async with (
        redis_fault_proxy(redis_address(), scripted({})) as proxy,
        RedisRelay.open(proxy.url, prefix=prefix, cancel_ping=0.5, op_timeout=2.0) as relay_a,
        RedisRelay.open(redis_url, prefix=prefix) as relay_b,
        web_server(agent, relay=relay_a) as a,
        web_server(agent, relay=relay_b) as b,
    ):
        gate = _held_publishing(await attach_relay(a.host, relay_a))
        async with httpx.AsyncClient(timeout=30) as client:
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "go", message_id="u1")
                )
                await held["open"].wait()
                assert proxy.hold_subscriptions() == 1  # A is deaf from now on
                stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u1"})
                gate.set()  # A's writer opens: the turn streams
                with trio.move_on_after(LIMIT):  # (before: held until released)
                    await _until(lambda: "u1" in replies)
                held["release"].set()
            await wait_idle(a, "s")
    assert stop.status_code == 202 and stop.json() == {"turn_id": None, "forwarded": True}
    assert 'data: {"type":"abort","reason":"stopped by user"}' in _events(replies["u1"])
    assert "never" not in replies["u1"].text


class _Gate:
    """What :func:`_held_publishing` returns: ``set()`` lets the held chunks through."""

    def __init__(self, publisher: Any) -> None:
        self.publisher = publisher
        self.append = publisher.append
        self.held: list[Any] = []
        publisher.append = self.held.append  # (returns None: no room to wait for)

    def set(self) -> None:
        self.publisher.append = self.append
        for chunk in self.held:
            self.append(chunk)
        self.held.clear()


def _held_publishing(publisher: Any) -> _Gate:
    """Hold ``publisher``'s writes to Redis (a turn's first chunk among them) until the
    returned gate is set: the window in which the relay knows of no running turn. The
    publisher appends a chunk to its writer in the turn's own ``bus.publish``
    (``RelayPublisher.append``): held there, the turn runs on."""
    return _Gate(publisher)


@asynccontextmanager
async def _two_hosts(redis_url: str, agent: Any, *, deaf_a: bool = False) -> AsyncIterator[Any]:
    """Hosts A and B on one Redis (A's relay through a fault proxy when ``deaf_a``, so a
    test can black-hole its cancel subscription): ``(a, b, A's publisher, proxy)``."""
    from actors.relays import RedisRelay, attach_relay
    from tests.support.redis import redis_address, unique_prefix
    from tests.support.redis_proxy import redis_fault_proxy, scripted
    from tests.web.harness import web_server

    prefix = unique_prefix()
    async with redis_fault_proxy(redis_address(), scripted({})) as proxy:
        url_a: str = proxy.url if deaf_a else redis_url
        options = {"cancel_ping": 0.5, "op_timeout": 2.0} if deaf_a else {}
        async with (
            RedisRelay.open(url_a, prefix=prefix, **options) as relay_a,
            RedisRelay.open(redis_url, prefix=prefix) as relay_b,
            web_server(agent, relay=relay_a) as a,
            web_server(agent, relay=relay_b) as b,
        ):
            yield a, b, await attach_relay(a.host, relay_a), proxy


async def test_a_stop_that_reaches_another_host_before_the_message_reaches_its_own_stops_it(
    redis_url: str,
) -> None:
    # Stop pressed before the POST got to A: B forwards it (no turn of "s" anywhere), A
    # hears it holding nothing so named, and the turn that then starts on A ran to its
    # answer.
    script = Script(holding(), ["never"])
    async with _two_hosts(redis_url, agent_of(script)) as (a, b, _, _):
        async with httpx.AsyncClient(timeout=30) as client:
            stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u1"})
            await _until(lambda: a.host.held_stops)  # A heard it
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "go", message_id="u1")
                )
                with trio.move_on_after(LIMIT):  # (before: held until released)
                    await _until(lambda: "u1" in replies)
                held["release"].set()
            await wait_idle(a, "s")
            stored = (await a.host.store.load("s")).messages
    assert stop.status_code == 202 and stop.json() == {"turn_id": None, "forwarded": True}
    assert 'data: {"type":"abort","reason":"stopped by user"}' in _events(replies["u1"])
    assert "never" not in replies["u1"].text  # before: the turn answered "never"
    assert not a.host.held_stops  # used once
    assert stored[0].id == "u1" and "never" not in str(stored)  # saved as stopped early


async def test_a_stop_that_reaches_a_deaf_host_before_the_message_does_stops_its_turn(
    redis_url: str,
) -> None:
    # As above, A's cancel subscription black-holed when B sends the stop: A, subscribed
    # again, read back the unplaced stops of the sessions its writers streamed, and it
    # streamed none (the turn had not reached it), so the stop was lost.
    script = Script(holding(), ["never"])
    async with _two_hosts(redis_url, agent_of(script), deaf_a=True) as (a, b, _, proxy):
        async with httpx.AsyncClient(timeout=30) as client:
            assert proxy.hold_subscriptions() == 1  # A is deaf from now on
            stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u1"})
            with trio.move_on_after(LIMIT):  # A subscribes again and reads it back
                await _until(lambda: a.host.held_stops)
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "go", message_id="u1")
                )
                with trio.move_on_after(LIMIT):  # (before: held until released)
                    await _until(lambda: "u1" in replies)
                held["release"].set()
            await wait_idle(a, "s")
    assert stop.status_code == 202 and stop.json() == {"turn_id": None, "forwarded": True}
    assert 'data: {"type":"abort","reason":"stopped by user"}' in _events(replies["u1"])
    assert "never" not in replies["u1"].text


@pytest.mark.parametrize("on_busy", ["enqueue", "steer"])
async def test_a_stop_that_reaches_a_busy_host_before_the_message_it_names_takes_it_out(
    redis_url: str, on_busy: str
) -> None:
    # A runs "one" (the relay streams it); Stop for "two" is pressed before "two"'s POST
    # reaches A: B forwards it to A's turn, where nothing is so named yet. "two" then
    # came and waited (queued behind "one", or to be steered into it): queued, it was
    # stopped only as its turn started, its message and an interrupted answer saved;
    # steered, the running turn took it in. A stop after it came takes it out, nothing
    # stored (``Host.stop_named``): both orders now agree.
    script = Script(holding("H1"), ["first done"], ["never"])
    agent = agent_of(script, on_busy)
    async with _two_hosts(redis_url, agent) as (a, b, _, _):
        async with httpx.AsyncClient(timeout=30) as client:
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "one", message_id="u1")
                )
                await held["open"].wait()
                await wait_streaming(client, f"{b.url}/api/chat/s/stream")
                stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u2"})
                await _until(lambda: a.host.held_stops)  # A heard it: nothing named "u2" here
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u2", body("s", "two", message_id="u2")
                )
                with trio.move_on_after(LIMIT):  # (before: it waited for "one")
                    await _until(lambda: "u2" in replies)
                waiting = a.host.sessions["s"].waiting_inputs
                held["release"].set()
            await wait_idle(a, "s")
            stored = (await a.host.store.load("s")).messages
    assert stop.status_code == 202 and stop.json()["forwarded"] is True
    assert waiting == 0
    assert _events(replies["u2"]) == [
        'data: {"type":"abort","reason":"stopped by user"}',
        "data: [DONE]",
    ]
    assert '"finishReason":"stop"' in replies["u1"].text  # the running turn went on
    assert [m.content for m in stored if m.role == "user"] == ["one"]  # nothing of "two"
    assert "never" not in str(stored) and len(script.requests) == 2
    assert not a.host.held_stops  # used once


async def test_a_stop_sent_to_another_host_naming_a_message_the_running_turn_took_stops_it(
    redis_url: str,
) -> None:
    # Under steer A's turn took "two" in: the rest of the turn is its answer. B forwards
    # a stop naming "two"; A found it neither waiting nor the turn's own message, and
    # the turn ran on to its end.
    script = Script(holding("H1"), holding("H2"), ["never"])
    async with _two_hosts(redis_url, agent_of(script, "steer")) as (a, b, _, _):
        async with httpx.AsyncClient(timeout=30) as client:
            replies: dict = {}
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u1", body("s", "one", message_id="u1")
                )
                await held["open"].wait()
                nursery.start_soon(
                    _post_into, client, a.url, replies, "u2", body("s", "two", message_id="u2")
                )
                await _until(lambda: a.host.sessions["s"].waiting_inputs >= 1)
                first = held["release"]
                held["open"], held["release"] = trio.Event(), trio.Event()
                first.set()  # the step ends; the next one takes "two" in and holds
                await held["open"].wait()
                await wait_streaming(client, f"{b.url}/api/chat/s/stream")
                stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u2"})
                with trio.move_on_after(5):  # (before: it ran until released)
                    await _until(lambda: "u1" in replies)
                held["release"].set()
            await wait_idle(a, "s")
            stored = (await a.host.store.load("s")).messages
    assert stop.status_code == 202 and stop.json()["forwarded"] is True
    assert 'data: {"type":"abort","reason":"stopped by user"}' in _events(replies["u1"])
    assert [m.content for m in stored if m.role == "user"] == ["one", "two"]
    assert "never" not in str(stored) and len(script.requests) == 2


@pytest.mark.parametrize("again", ["regenerate", "edit"])
async def test_a_late_stop_does_not_stop_the_regenerate_or_edit_that_follows(
    redis_url: str, again: str
) -> None:
    # "go" (u1) answered on A; the client's stop naming u1 arrives late (no turn runs:
    # B forwards it, A holds it); then a regenerate of the answer, or an edit of u1,
    # names u1 too: a stop before its POST cannot be told from this late one, so it
    # must not stop it.
    script = Script(["first"], ["second"])
    async with _two_hosts(redis_url, agent_of(script)) as (a, b, _, _):
        async with httpx.AsyncClient(timeout=30) as client:
            first = await client.post(f"{a.url}/api/chat", json=body("s", "go", message_id="u1"))
            stop = await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u1"})
            await _until(lambda: a.host.held_stops)
            sent = (
                body("s", "go", "regenerate-message", message_id="u1")
                if again == "regenerate"
                else body("s", "went", message_id="u1")
            )
            second = await client.post(f"{a.url}/api/chat", json=sent)
            await wait_idle(a, "s")
            stored = (await a.host.store.load("s")).messages
    assert '"finishReason":"stop"' in first.text
    assert stop.status_code == 202 and stop.json() == {"turn_id": None, "forwarded": True}
    assert "abort" not in second.text and "second" in second.text
    assert [m.text for m in stored if m.role == "assistant"][-1:] == ["second"]


async def test_a_stop_naming_another_message_does_not_stop_a_new_turn(redis_url: str) -> None:
    script = Script(["done"])
    async with _two_hosts(redis_url, agent_of(script)) as (a, b, _, _):
        async with httpx.AsyncClient(timeout=30) as client:
            await client.post(f"{b.url}/api/chat/s/stop", json={"messageId": "u9"})
            await _until(lambda: a.host.held_stops)
            reply = await client.post(f"{a.url}/api/chat", json=body("s", "go", message_id="u1"))
    assert "abort" not in reply.text and "done" in reply.text
    assert a.host.stopped_before("s", "u9", "t9") == "stopped by user"  # kept till it expires


async def test_the_record_of_unplaced_stops_is_one_bounded_key_that_expires(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stops for sessions that never get a turn: one stream for them all, its length
    # capped and its life a minute past the latest (before: a hash a session).
    import actors.relays.redis_streams as streams
    from actors.relays import RedisRelay
    from tests.support.redis import unique_prefix

    monkeypatch.setattr(streams, "UNPLACED_KEPT", 3)
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        for n in range(5):
            await relay.request_cancel("", "r", session_id=f"s{n}", message_id="u1")
        key = relay.unplaced_stops_key
        kept = await relay.client.xrange(key)
        life = await relay.client.pttl(key)
        keys = await relay.client.keys(f"{relay.prefix}*")
    assert [orjson.loads(e.field_values[b"m"])["session_id"] for e in kept] == ["s2", "s3", "s4"]
    assert 0 < life <= streams.CANCEL_TTL_MS
    assert set(keys) == {key.encode()}


async def test_a_stop_naming_a_ten_megabyte_id_is_not_forwarded_to_every_host(
    redis_url: str,
) -> None:
    # No message or turn has such an id (a client's ids are at most 128 characters):
    # forwarded, it was a 10 MB record in Redis for a minute, read by every host.
    huge = "u" * (10 << 20)
    async with two_front_ends(redis_url, agent_of(Script())) as (_a, b):
        async with httpx.AsyncClient(timeout=60) as client:
            stops = [
                await client.post(f"{b.url}/api/chat/s/stop", json={field: huge})
                for field in ("messageId", "turnId")
            ]
    assert [s.status_code for s in stops] == [204, 204]
