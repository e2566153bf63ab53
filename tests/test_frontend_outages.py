"""The worker deployment when a service goes away: front ends, an in-process worker, the
test run's own PostgreSQL and Redis (:mod:`tests.support.services`) stopped, paused or
filled under them. Waits are bounded by the deployment's limit; nothing is timed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import structlog
import trio

from actors.relays import RedisRelay
from actors.stores.postgres import PostgresStore
from runtime.app.web.http import RELAY_UNAVAILABLE
from runtime.errors import RelayTurnGone, RelayUnavailable, StoreUnavailable
from tests.support.pg import postgres_stopped
from tests.support.redis import (
    redis_address,
    redis_full,
    redis_restored,
    start_redis,
    stop_redis,
    unique_prefix,
)
from tests.test_frontend import (
    EventReader,
    body,
    data,
    deployment,
    redis_url,
    slow_agent,
    stored_text,
    wait_for_turn,
)
from tests.test_relay_web import sse_events

__all__ = ["redis_url"]  # (the fixture, imported for pytest)


async def test_a_post_whose_turn_ran_while_redis_was_down_gets_the_stored_answer(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Redis is down: the front end queues the turn, the worker runs and saves it (its
    # relay writes fail), and the reader's relay read gives up. What the client gets is
    # the answer the store holds, not an error about a relay it needs no more.
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "retry_for", 1.0)
    with redis_restored():
        async with deployment(pg_url, redis_url, slow_agent(3, 0)) as d:
            await trio.to_thread.run_sync(stop_redis)
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                response = await client.post("/api/chat", json=body("s1"))
            await trio.to_thread.run_sync(start_redis)
            turns = await d.queue.turns("s1")
            stored = await d.assistant("s1")
    events = data(sse_events(response.text))
    assert turns[0].status == "done"
    assert [e["type"] for e in events if e["type"] == "error"] == []
    assert events[0] == {"type": "start", "messageId": stored.id}
    assert "".join(e["delta"] for e in events if e["type"] == "text-delta") == stored_text(stored)


async def gives_up(relay: RedisRelay) -> None:
    """A read whose reader was shown part of its turn (not ``unseen``) gives up on a
    Redis that is down, after the relay's retry window: the relay is then known down."""
    with pytest.raises(RelayUnavailable):
        async for _ in relay.read("t", after_seq=1):
            pass  # pragma: no cover
    assert relay.down


async def test_a_post_while_redis_is_known_down_waits_no_retry_window(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each POST during an outage waited out the relay's retry window (30 s) before it
    # turned to the queue for the stored answer. Once a read gave up, the next gets one
    # try: the second POST here is answered though its window is an hour.
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "retry_for", 1.0)
    with redis_restored():
        async with deployment(pg_url, redis_url, slow_agent(3, 0)) as d:
            await trio.to_thread.run_sync(stop_redis)
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                (relay,) = d.relays
                await gives_up(relay)  # a read (not a POST's first) gives up: known down
                relay.retry_for = 3600
                with trio.fail_after(60):
                    response = await client.post("/api/chat", json=body("s2"))
            await trio.to_thread.run_sync(start_redis)
            stored = await d.assistant("s2")
    events = data(sse_events(response.text))
    assert [e["type"] for e in events if e["type"] == "error"] == []
    assert "".join(e["delta"] for e in events if e["type"] == "text-delta") == stored_text(stored)


async def test_the_first_post_of_an_outage_that_refuses_connections_waits_no_retry_window(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The relay not yet known down, a POST's first read waited the whole retry window
    # (30 s) though Redis refused each connection at once. A read shown nothing gives up
    # at its first refused command: the POST below is answered (from the store) though
    # its window is an hour; the relay is not marked down by it (live readers keep their
    # window across a Redis restart).
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "retry_for", 3600.0)
    with redis_restored():
        async with deployment(pg_url, redis_url, slow_agent(3, 0)) as d:
            (relay,) = d.relays
            await trio.to_thread.run_sync(stop_redis)
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=120) as client:
                with trio.fail_after(60):
                    response = await client.post("/api/chat", json=body("s1"))
            down = relay.down
            await trio.to_thread.run_sync(start_redis)
            stored = await d.assistant("s1")
    events = data(sse_events(response.text))
    assert not down
    assert [e["type"] for e in events if e["type"] == "error"] == []
    assert "".join(e["delta"] for e in events if e["type"] == "text-delta") == stored_text(stored)


async def test_only_a_read_shown_nothing_gives_up_at_once_when_redis_refuses(
    redis_url: str,
) -> None:
    # ``unseen`` (a POST's own read): Redis refusing connections fails it at once, the
    # relay not marked down. A read without it (a live reader's) keeps its whole window:
    # refused again and again, it rides the outage and reads Redis once it is back.
    with redis_restored():
        async with RedisRelay.open(
            redis_url, prefix=unique_prefix(), retry_base=0.02, retry_max=0.2, retry_for=3600.0
        ) as relay:
            await trio.to_thread.run_sync(stop_redis)
            with trio.fail_after(60), pytest.raises(RelayUnavailable, match="refused connec"):
                async for _ in relay.read("t", unseen=True):
                    pass  # pragma: no cover
            down = relay.down
            outcome: list[BaseException] = []

            async def live() -> None:
                try:
                    async for _ in relay.read("t"):
                        pass  # pragma: no cover
                except (RelayTurnGone, RelayUnavailable) as exc:
                    outcome.append(exc)

            with structlog.testing.capture_logs() as logs:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(live)
                    with trio.fail_after(60):
                        while sum(e["event"] == "relay.read_failed" for e in logs) < 5:  # noqa: ASYNC110 - retries logged
                            await trio.sleep(0.01)
                    await trio.to_thread.run_sync(start_redis)
    assert not down
    assert [type(e) for e in outcome] == [RelayTurnGone]  # answered: no stream of "t"


async def test_a_relay_known_down_reads_again_once_redis_answers(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "retry_for", 1.0)
    with redis_restored():
        async with deployment(pg_url, redis_url, slow_agent(3, 0)) as d:
            await trio.to_thread.run_sync(stop_redis)
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                (relay,) = d.relays
                await gives_up(relay)
                down = relay.down
                await trio.to_thread.run_sync(start_redis)
                response = await client.post("/api/chat", json=body("s2"))
    events = data(sse_events(response.text))
    assert down and not relay.down
    assert [e["type"] for e in events if e["type"] == "error"] == []
    assert "".join(e["delta"] for e in events if e["type"] == "text-delta") == "w w w"


async def test_a_turn_redis_refuses_as_full_mid_stream_is_saved_and_its_reader_told_to_reload(
    pg_url: str, redis_url: str
) -> None:
    # Redis fills up (noeviction) while a reader follows the turn: the worker's relay
    # writes are refused, the turn runs on and is saved, and the reader, shown part of
    # it, is told to reload the session; it is not left waiting for the rest.
    async with deployment(pg_url, redis_url, slow_agent(200, 0.02)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
            async with client.stream("POST", "/api/chat", json=body("s1")) as response:
                reader = EventReader(response)
                await reader.until(4)
                with redis_full():
                    events = data(await reader.all())
        turns = await d.queue.turns("s1")
        stored = await d.assistant("s1")
    assert turns[0].status == "done" and not stored.interrupted
    assert stored_text(stored) == " ".join(["w"] * 200)
    assert events[-1]["type"] == "error" and "reload the session" in events[-1]["errorText"]


async def test_a_reader_whose_turn_redis_refuses_as_full_is_told_redis_is_out_of_memory(
    pg_url: str, redis_url: str
) -> None:
    # The reload is right; the reason is Redis refusing the stream's writes, not a
    # worker that stopped before it wrote the end (what the reader was told before).
    async with deployment(pg_url, redis_url, slow_agent(200, 0.02)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
            async with client.stream("POST", "/api/chat", json=body("s1")) as response:
                reader = EventReader(response)
                await reader.until(4)
                with redis_full():
                    events = data(await reader.all())
    text = events[-1]["errorText"]
    assert "Redis is out of memory" in text and "refused the stream's writes" in text
    assert "worker stopped" not in text


async def refused_flush(relay: RedisRelay) -> None:
    """Wait until one of the relay's writers lost chunks (Redis refused a flush)."""
    while True:
        if any(w.lost for w in relay.live):
            return
        await trio.sleep(0.01)


async def test_a_reader_is_told_redis_was_out_of_memory_after_it_was_freed(
    pg_url: str, redis_url: str
) -> None:
    # Redis refuses some of the stream's writes as full, then has room again before the
    # reader reaches the gap: asked then, Redis says nothing of it; the gap says why.
    async with deployment(pg_url, redis_url, slow_agent(200, 0.02)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
            async with client.stream("POST", "/api/chat", json=body("s1")) as response:
                reader = EventReader(response)
                await reader.until(4)
                relay = d.workers[0].relay
                with redis_full():
                    await refused_flush(relay)
                events = data(await reader.all())
    text = events[-1]["errorText"]
    assert "Redis is out of memory and refused the stream's writes (OOM" in text
    assert "reload the session" in text


async def test_a_reader_shown_part_of_a_turn_when_redis_stays_down_is_told_to_reload(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Redis goes down mid-stream and stays down past the relay's retry window (1 s
    # here): the worker saves the turn all the same, so the reader, shown part of it,
    # is told to reload the session for it, not only that Redis did not answer.
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "retry_for", 1.0)
    with redis_restored():
        async with deployment(pg_url, redis_url, slow_agent(200, 0.02)) as d:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                async with client.stream("POST", "/api/chat", json=body("s1")) as response:
                    reader = EventReader(response)
                    await reader.until(4)
                    await trio.to_thread.run_sync(stop_redis)
                    events = data(await reader.all())
            await trio.to_thread.run_sync(start_redis)
    text = events[-1]["errorText"]
    # A fixed sentence: the relay's own text names Redis's address (coredis's "Unable to
    # establish a connection to host:port"), the operator's, logged.
    assert (
        text == f"RelayUnavailable: {RELAY_UNAVAILABLE}; reload the session (GET /api/sessions/s1)"
    )
    assert "Redis" not in text and str(redis_address()[1]) not in text


async def test_an_openai_stream_shown_part_of_a_turn_when_redis_stays_down_names_the_store(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other protocols' reader (QueuedTurnOutput), the same outage: the error says
    # the stored session has the turn, as its error for a relay that lost it does.
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "retry_for", 1.0)
    request = {"model": "a", "messages": [{"role": "user", "content": "go"}], "stream": True}
    headers = {"X-Axon-Session": "oa-1"}
    with redis_restored():
        async with deployment(
            pg_url, redis_url, slow_agent(200, 0.02), protocols=("ai-sdk", "openai")
        ) as d:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                async with client.stream(
                    "POST", "/v1/chat/completions", json=request, headers=headers
                ) as response:
                    texts = response.aiter_text()
                    raw = ""
                    while raw.count('"content":"w') < 3:
                        raw += await texts.__anext__()
                    await trio.to_thread.run_sync(stop_redis)
                    raw += "".join([text async for text in texts])
            await trio.to_thread.run_sync(start_redis)
    assert f"{RELAY_UNAVAILABLE}; the stored session has the turn" in raw
    assert "Redis" not in raw and f":{redis_address()[1]}" not in raw
    assert raw.rstrip().endswith("data: [DONE]")


async def test_a_store_that_fails_the_ended_turn_look_does_not_end_the_relay_read() -> None:
    # The look is a guard against a stream nobody ends; a store that cannot answer it
    # (PostgreSQL restarting) tells it nothing, so the live read goes on: the relay, and
    # the worker streaming into it, are fine. It raised StoreUnavailable out of the read,
    # which cut the reader's response with no end event.
    from runtime.app.web.watch import IDLE_LOOK, EndedTurnLook

    asked: list[str] = []

    class Queue:
        async def get_status(self, turn_id: str) -> Any:
            asked.append(turn_id)
            raise StoreUnavailable("the PostgreSQL server cannot be reached")

    look = EndedTurnLook(Queue(), "t1")  # type: ignore[arg-type]
    await look(IDLE_LOOK)
    await look(IDLE_LOOK * 2)
    assert asked == ["t1", "t1"] and look.looks == 2


async def test_a_post_waiting_for_its_queued_turn_while_postgresql_is_down_ends_with_an_error(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No worker: the POST's stream waits on the queue for its turn to be claimed. The
    # run's own PostgreSQL stops; once the store gives up (2 s here), the client gets an
    # error event and the stream's end, not a response cut off by the server's crash.
    monkeypatch.setitem(PostgresStore.open.__func__.__kwdefaults__, "retry_for", 2.0)  # type: ignore[attr-defined]
    async with deployment(pg_url, redis_url, slow_agent(3, 0), worker=False) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
            async with client.stream("POST", "/api/chat", json=body("s1")) as response:
                await wait_for_turn(d.queue, "s1", "queued")
                with postgres_stopped():
                    raw = "".join([text async for text in response.aiter_text()])
    events = sse_events(raw)
    assert events[-1][1] == "[DONE]"
    error = events[-2][1]
    assert error["type"] == "error" and "reload the session" in error["errorText"]


async def test_an_openai_stream_waiting_for_its_queued_turn_while_postgresql_is_down_ends(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other protocols' queued-turn reader (QueuedTurnOutput), the same outage: an
    # error in the protocol's shape and the stream's end, not a cut response.
    monkeypatch.setitem(PostgresStore.open.__func__.__kwdefaults__, "retry_for", 2.0)  # type: ignore[attr-defined]
    request = {"model": "a", "messages": [{"role": "user", "content": "go"}], "stream": True}
    headers = {"X-Axon-Session": "oa-1"}
    async with deployment(
        pg_url, redis_url, slow_agent(3, 0), worker=False, protocols=("ai-sdk", "openai")
    ) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
            async with client.stream(
                "POST", "/v1/chat/completions", json=request, headers=headers
            ) as response:
                assert response.status_code == 200, await response.aread()
                await wait_for_turn(d.queue, "oa-1", "queued")
                with postgres_stopped():
                    raw = "".join([text async for text in response.aiter_text()])
    # (the store's own words went to the client: the log has them now, the client a
    # stable sentence: test_an_openai_stream_whose_store_fails_tells_the_client_...)
    assert "the session store is unavailable; try again" in raw
    assert raw.rstrip().endswith("data: [DONE]")


async def test_an_openai_stream_whose_turn_ran_while_redis_was_down_gets_the_stored_answer(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other protocols' reader, Redis down while the worker runs the turn: the
    # stored answer, as the AI SDK stream gets it, not the relay's error.
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "retry_for", 1.0)
    request = {"model": "a", "messages": [{"role": "user", "content": "go"}], "stream": True}
    headers = {"X-Axon-Session": "oa-1"}
    with redis_restored():
        async with deployment(
            pg_url, redis_url, slow_agent(3, 0), protocols=("ai-sdk", "openai")
        ) as d:
            await trio.to_thread.run_sync(stop_redis)
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
                response = await client.post("/v1/chat/completions", json=request, headers=headers)
            await trio.to_thread.run_sync(start_redis)
            turns = await d.queue.turns("oa-1")
    assert turns[0].status == "done"
    assert "RelayUnavailable" not in response.text
    assert '"content":"w w w"' in response.text
    assert response.text.rstrip().endswith("data: [DONE]")


async def test_an_openai_stream_posted_while_redis_refuses_connections_waits_no_retry_window(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other protocols' reader (``queued_turn``), shown nothing: its first read gives
    # up at once on a Redis that refuses connections, as the AI SDK stream's does (its
    # window an hour here), and the stored answer is sent.
    monkeypatch.setitem(RedisRelay.__init__.__kwdefaults__, "retry_for", 3600.0)
    request = {"model": "a", "messages": [{"role": "user", "content": "go"}], "stream": True}
    headers = {"X-Axon-Session": "oa-1"}
    with redis_restored():
        async with deployment(
            pg_url, redis_url, slow_agent(3, 0), protocols=("ai-sdk", "openai")
        ) as d:
            (relay,) = d.relays
            await trio.to_thread.run_sync(stop_redis)
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=120) as client:
                with trio.fail_after(60):
                    response = await client.post(
                        "/v1/chat/completions", json=request, headers=headers
                    )
            down = relay.down
            await trio.to_thread.run_sync(start_redis)
    assert not down
    assert "RelayUnavailable" not in response.text
    assert '"content":"w w w"' in response.text
    assert response.text.rstrip().endswith("data: [DONE]")


async def test_a_stream_whose_store_fails_tells_the_client_a_generic_text_and_logs_the_error(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store's text names the deployment's database (a host, a port): the
    # operator's, in the log; the client is told the store is unavailable, always in
    # the same words. (No worker: the POST's stream waits on the queue's watch.)
    from runtime.app.web.watch import TurnWatch

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("could not connect to server at db-7.internal:5433")

    async with deployment(pg_url, redis_url, slow_agent(3, 0), worker=False) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
            monkeypatch.setattr(TurnWatch, "changed", failing)
            with structlog.testing.capture_logs() as logs:
                response = await client.post("/api/chat", json=body("s1"))
    error = sse_events(response.text)[-2][1]
    assert error == {
        "type": "error",
        "errorText": "turn: the session store is unavailable; try again; "
        "reload the session (GET /api/sessions/s1)",
    }
    logged = [e for e in logs if e["event"] == "frontend.stream_store_failed"]
    assert [e["error"] for e in logged] == ["could not connect to server at db-7.internal:5433"]


async def test_an_openai_stream_whose_store_fails_tells_the_client_a_generic_text(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other protocols' queued-turn reader (QueuedTurnOutput), the same failure.
    from runtime.app.web.watch import TurnWatch

    async def failing(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("could not connect to server at db-7.internal:5433")

    request = {"model": "a", "messages": [{"role": "user", "content": "go"}], "stream": True}
    headers = {"X-Axon-Session": "oa-1"}
    async with deployment(
        pg_url, redis_url, slow_agent(3, 0), worker=False, protocols=("ai-sdk", "openai")
    ) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=60) as client:
            monkeypatch.setattr(TurnWatch, "changed", failing)
            response = await client.post("/v1/chat/completions", json=request, headers=headers)
    assert "the session store is unavailable; try again" in response.text
    assert "db-7" not in response.text
