"""Replies that never come, through the fault-injecting proxy
(:mod:`tests.support.redis_proxy`): the shared rate limits' scripts, the cancel watch's
subscription, and what a reader's deadline logs.

Each is a stall that used to hang for good (a limiter's ``EVAL``: that call and every one
after it; a subscription silently dead: every cancel published to it) or to log nothing
(``error=''``). Real sockets and real time, as in :mod:`tests.test_relay_proxy_attacks`:
every wait is bounded by the relay's deadlines (``op_timeout`` 0.2 s; 1 s for the
subscription's PINGs, which a loaded machine must not miss: its subscribes are counted)."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import structlog
import trio

from actors.providers import ScriptedProvider
from actors.relays import attach_relay
from actors.relays.redis_entries import NamedStop
from runtime import Agent, Host
from runtime.errors import RateLimitUnavailable
from runtime.ratelimit import RateLimit
from tests.support.redis_proxy import Command, Fault, scripted
from tests.test_busy import Script, agent_with, held, holding
from tests.test_relay_proxy_attacks import (
    STALL_AFTER,
    checked_read,
    through_proxy,
    turn,
)

LIMIT = RateLimit(requests_per_minute=100)
KEY = "scripted|scripted|-"
SCRIPTS = ("EVAL", "EVALSHA", "SCRIPT")


@pytest.fixture
def redis_url() -> str:
    from tests.support.redis import require_redis

    return require_redis()


# -- the shared rate limits ---------------------------------------------------------------


async def test_a_limit_try_whose_reply_never_comes_is_retried_and_counted_once(
    redis_url: str,
) -> None:
    """The first try's ``EVAL`` applied by Redis, its reply held: past the deadline the
    try goes again on another connection (before: it, and every try after it, waited
    behind the held reply for good) and the call is counted once (the script knows the
    call it granted)."""
    async with through_proxy(scripted({("EVAL", 1): STALL_AFTER})) as (proxy, relay):
        backend = relay.rate_limits()
        with trio.fail_after(10):
            first = await backend.try_acquire(KEY, LIMIT, 1000.0, "call-1", 0)
            second = await backend.try_acquire(KEY, LIMIT, 1001.0, "call-2", 0)
        assert first.granted and second.granted
        assert proxy.faults() == ["stall_after"]
        assert await backend.granted(KEY) == [1000.0, 1001.0]  # call-1 once


async def test_a_limit_whose_redis_never_answers_fails_closed_with_a_typed_error(
    redis_url: str,
) -> None:
    """Every script's reply held: the try is retried for ``retry_for``, then fails with
    :class:`RateLimitUnavailable` saying so (before: it hung)."""

    def decide(command: Command) -> Fault | None:
        return STALL_AFTER if command.name in SCRIPTS else None

    async with through_proxy(decide, retry_for=1.0) as (proxy, relay):
        backend = relay.rate_limits()
        with trio.fail_after(10), pytest.raises(RateLimitUnavailable) as caught:
            await backend.try_acquire(KEY, LIMIT, 1000.0, "call-1", 0)
        assert len(proxy.faults()) >= 2  # retried, each on a connection started over
    assert "did not answer for 1 s (acquire)" in str(caught.value)
    assert "TooSlowError: no reply within 0.2 s" in str(caught.value)


async def test_a_turn_whose_shared_limit_never_answers_ends_with_the_error_saved(
    redis_url: str,
) -> None:
    """A worker's turn over a shared limit whose Redis holds every reply: the turn ends
    with a ``RateLimitUnavailable`` error chunk and the failed message is saved; the
    provider was never called (before: the turn hung without a word)."""

    def decide(command: Command) -> Fault | None:
        return STALL_AFTER if command.name in SCRIPTS else None

    provider = ScriptedProvider(["never"], rate_limit=LIMIT)
    async with through_proxy(decide, retry_for=1.0) as (_, relay):
        async with Host.open(log_tap=False) as host:
            host.rate_limits = relay.rate_limits()  # as a worker does
            session = await host.open_session(Agent(provider=provider))
            with trio.fail_after(15):
                async with session.stream("hi") as out:
                    chunks = [c async for c in out]
    assert chunks[-1].type == "error" and chunks[-1].error.kind == "RateLimitUnavailable"
    assert session.messages[-1].failed
    assert session.messages[-1].error.kind == "RateLimitUnavailable"
    assert not provider.requests


async def test_an_audit_read_whose_reply_never_comes_holds_up_no_later_limit_call(
    redis_url: str,
) -> None:
    """``granted`` (the audit's ``LRANGE``) whose reply is held: past the deadline the
    pool starts over and the read goes again, and the limit's next try is not queued
    behind the held reply (before: ``granted`` raised ``TooSlowError`` and left the
    connection in the pool, and every later call waited behind the reply for good)."""
    async with through_proxy(scripted({("LRANGE", 1): STALL_AFTER})) as (proxy, relay):
        backend = relay.rate_limits()
        with trio.fail_after(10):
            first = await backend.try_acquire(KEY, LIMIT, 1000.0, "call-1", 0)
            audit = await backend.granted(KEY)
            later = await backend.try_acquire(KEY, LIMIT, 1001.0, "call-2", 0)
            assert await backend.granted(KEY) == [1000.0, 1001.0]
        assert first.granted and later.granted
        assert audit == [1000.0]
        assert proxy.faults() == ["stall_after"]


# -- what a deadline logs -----------------------------------------------------------------


async def test_a_read_past_its_deadline_logs_the_error_and_the_wait(redis_url: str) -> None:
    """``relay.read_failed`` for a reply that never came names the error and how long was
    waited (before: ``error=''``, a ``TooSlowError`` having no text)."""
    sent = turn(1, 2)
    async with through_proxy(scripted({("EVAL", 1): STALL_AFTER})) as (_, relay):
        writer = relay.writer(session_id="s", turn_id="t", fresh=True)
        for chunk in sent:
            writer.append(chunk)
        await writer.aclose()
        with structlog.testing.capture_logs() as logs:
            got, gone = await checked_read(relay, "t")
    assert len(got) == len(sent) and not gone
    failed = [e for e in logs if e["event"] == "relay.read_failed"]
    assert [e["error"] for e in failed] == ["TooSlowError: no reply within 0.3 s"]


# -- the cancel watch's subscription ------------------------------------------------------


async def test_a_cancel_published_to_a_silently_dead_subscription_still_reaches_the_watch(
    redis_url: str,
) -> None:
    """The watch's subscription black-holed (Redis still counts the subscriber, nothing
    comes through): its next PING gets no answer within ``op_timeout``, it subscribes
    again and reads the cancels recorded meanwhile for the turns this process streams.
    A cancel published while it was dead reaches the watch once; one published after,
    too. Another turn's cancel (no writer here) and one recorded before the silence are
    not handed on. Before: nothing noticed, every cancel lost for good. (Real time, a
    real proxy: the deadline leaves a loaded machine room to answer a live PING.)"""
    cancels: list[tuple[str, str]] = []
    async with through_proxy(scripted({}), cancel_ping=0.5, op_timeout=2.0) as (proxy, relay):
        relay.writer(session_id="s", turn_id="t", fresh=True)
        relay.writer(session_id="s2", turn_id="old", fresh=True)
        with structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await nursery.start(relay.watch_cancels, lambda *args: cancels.append(args))
                assert await relay.request_cancel("old", "earlier") == 1
                with trio.fail_after(10):
                    while not cancels:  # noqa: ASYNC110 - the watch's own record
                        await trio.sleep(0.01)
                await trio.sleep(6.0)  # ages the earlier record past the window to come
                assert proxy.hold_subscriptions() == 1
                assert await relay.request_cancel("t", "stop") == 1  # to the dead subscriber
                assert await relay.request_cancel("elsewhere", "stop") == 1
                with trio.fail_after(10):
                    while len(cancels) < 2:  # noqa: ASYNC110 - the watch's own record
                        await trio.sleep(0.01)
                    await trio.sleep(0.1)
                    while len(cancels) < 3:
                        await relay.request_cancel("u", "later")
                        await trio.sleep(0.05)
                nursery.cancel_scope.cancel()
    assert cancels[:2] == [("old", "earlier"), ("t", "stop")]
    assert set(cancels[2:]) == {("u", "later")}
    assert [c.name for c, _ in proxy.seen].count("SUBSCRIBE") == 2
    dropped = [e for e in logs if e["event"] == "relay.cancel_watch_failed"]
    assert [e["error"] for e in dropped] == [
        "TimeoutError: the cancel subscription answered no PING within 2 s"
    ]


async def test_a_named_stop_sent_while_the_subscription_is_dead_reaches_the_watch(
    redis_url: str,
) -> None:
    """A named stop (``Host.stop_named`` on the host that runs the session's turn ``t``)
    published while that host's subscription is black-holed: once the watch subscribes
    again it reads the stop recorded meanwhile and hands it to ``on_named`` as sent, and
    never as a plain cancel of ``t`` (the stop names a waiting message). Before: a named
    stop was only published, and lost."""
    named: list[NamedStop] = []
    cancels: list[tuple[str, str]] = []
    async with through_proxy(scripted({}), cancel_ping=0.5, op_timeout=2.0) as (proxy, relay):
        relay.writer(session_id="s", turn_id="t", fresh=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                functools.partial(relay.watch_cancels, on_named=named.append),
                lambda *args: cancels.append(args),
            )
            assert proxy.hold_subscriptions() == 1
            sent = await relay.request_cancel(
                "t", "stopped by user", session_id="s", message_id="u2"
            )
            with trio.fail_after(10):
                while not named:  # noqa: ASYNC110 - the watch's own record
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert sent == 1  # Redis still counted the dead subscriber
    assert named == [
        NamedStop(
            turn_id="t",
            session_id="s",
            message_id="u2",
            named_turn=None,
            reason="stopped by user",
        )
    ]
    assert cancels == []
    assert [c.name for c, _ in proxy.seen].count("SUBSCRIBE") == 2


async def test_a_turn_named_by_a_stop_sent_while_its_hosts_subscription_is_dead_stops(
    redis_url: str,
) -> None:
    """The host that runs the turn (``attach_relay``) is deaf when another front end's
    stop naming the turn is sent; once its watch subscribes again the turn stops in its
    first step. Before: the stop was only published, and the turn ran on."""
    held["open"], held["release"] = trio.Event(), trio.Event()
    script = Script(holding(), ["never"])
    async with through_proxy(scripted({}), cancel_ping=0.5, op_timeout=2.0) as (proxy, relay):
        async with Host.open(log_tap=False) as host:
            await attach_relay(host, relay)
            session = await host.open_session(agent_with(script))
            chunks: list[Any] = []

            async def run() -> None:
                async with session.stream("go") as out:
                    chunks.extend([c async for c in out])

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await held["open"].wait()
                assert proxy.hold_subscriptions() == 1
                turn_id = session.current.turn_id
                await relay.request_cancel(
                    turn_id, "stopped by user", session_id=session.id, named_turn=turn_id
                )
                with trio.move_on_after(10):  # (before: held by its tool until released)
                    while not chunks:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                held["release"].set()
    assert chunks[-1].type == "abort" and chunks[-1].reason == "stopped by user"
    assert len(script.requests) == 1  # stopped in its first step


async def test_a_cancel_published_just_after_a_reads_pool_restart_reaches_the_watch(
    redis_url: str,
) -> None:
    """A read whose reply never comes starts the relay's pool over (``_gave_up``); the
    cancel watch's subscription is not in that pool, so a cancel published just after
    reaches it, and it never subscribes again. Before: the restart dropped the
    subscription too and coredis subscribed again by itself (its ``SUBSCRIBE`` held
    0.7 s by the proxy here; its own backoff alone is up to 0.1 s), unseen by the
    watch: a cancel published in between reached no subscriber and its record was
    never read back, lost for good."""
    cancels: list[tuple[str, str]] = []
    sent = turn(1, 2)
    async with through_proxy(scripted({("EVAL", 1): STALL_AFTER}), cancel_ping=60.0) as (
        proxy,
        relay,
    ):
        relay.writer(session_id="s", turn_id="t", fresh=True)  # the turn streamed here
        writer = relay.writer(session_id="s2", turn_id="r", fresh=True)
        for chunk in sent:
            writer.append(chunk)
        await writer.aclose()
        async with trio.open_nursery() as nursery:
            await nursery.start(relay.watch_cancels, lambda *args: cancels.append(args))
            proxy.delay_subscriptions(0.7)  # within coredis's 1 s for the acknowledgement
            got, gone = await checked_read(relay, "r")  # its first page (EVAL) held: the restart
            listening = await relay.request_cancel("t", "stop")
            with trio.move_on_after(5):
                while not cancels:  # noqa: ASYNC110 - the watch's own record
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert len(got) == len(sent) and not gone
    assert cancels == [("t", "stop")]
    assert proxy.faults() == ["stall_after"]
    assert listening == 1
    assert [c.name for c, _ in proxy.seen].count("SUBSCRIBE") == 1
