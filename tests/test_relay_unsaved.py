"""A turn of ``serve --redis``'s in-process host whose final save failed: a client
resuming it from the relay (``GET /api/chat/{id}/stream``, with or without
``Last-Event-ID``, on the front end that runs it or another) is told ``not_saved`` as the
live stream told it, never the ``finish`` (or the store's error text) the turn's stream
ended with (``actors.relays.publisher``'s ``told``, ``runtime.app.web.serve.publish_turns``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.lowlevel

import actors.turn.saving as saving_module
from actors.providers.scripted import ScriptedProvider
from actors.relays import RedisRelay
from actors.relays.publisher import FINISHED_WAIT, RelayPublisher
from actors.stores import MemoryStore
from runtime import Agent
from runtime import events as ev
from runtime import output as o
from runtime.app.unsaved import NOT_CONFIRMED_MESSAGE, NOT_SAVED, NOT_SAVED_MESSAGE, told_end
from runtime.app.web.serve import publish_turns
from runtime.chunks import Usage
from runtime.errors import StoreError
from runtime.output import ErrorInfo
from tests.support.redis import require_redis, unique_prefix
from tests.test_relay_web import chat_body, sse_events
from tests.test_web_unsaved_turns import KEY, LEAKS, PATH
from tests.web.harness import web_server


@pytest.fixture
def redis_url() -> str:
    return require_redis()


class GatedStore(MemoryStore):
    """A memory store whose saves wait for ``gate``, then fail while ``down`` (a full
    disk, quoting a path and a key as a driver's message may); ``hang``: they never
    answer (a save not confirmed in time)."""

    def __init__(self, *, down: bool = True, hang: bool = False) -> None:
        super().__init__()
        self.gate = trio.Event()
        self.down = down
        self.hang = hang

    async def save(self, *args: Any, **kwargs: Any) -> Any:
        await self.gate.wait()
        if self.hang:
            await trio.sleep_forever()
        if self.down:
            raise StoreError(f"disk full writing {PATH} (token {KEY})")
        return await super().save(*args, **kwargs)


@asynccontextmanager
async def two_front_ends(url: str, store: Any) -> AsyncIterator[tuple[Any, Any]]:
    """Front end A runs turns on ``store``, publishing them as ``serve --redis`` does;
    B shares only Redis with it."""
    agent = Agent(name="a", provider=ScriptedProvider(["one two three"]))
    prefix = unique_prefix()
    async with (
        RedisRelay.open(url, prefix=prefix) as relay_a,
        RedisRelay.open(url, prefix=prefix) as relay_b,
        web_server(agent, store=store, relay=relay_a) as a,
        web_server(agent, relay=relay_b) as b,
    ):
        await publish_turns(a.host, relay_a)
        yield a, b


async def live_and_resumed(
    store: GatedStore,
    url: str,
    headers: dict[str, str] | None = None,
    *,
    on_a: bool = False,
    stop: bool = False,
) -> tuple[list[Any], list[Any]]:
    """The turn's live stream (POST on A) and its resume (GET on B, or on A), the
    resume begun while the turn's save waits; with ``stop``, the turn stopped from B
    then (over the relay's cancel channel)."""
    live: list[Any] = []
    async with two_front_ends(url, store) as (a, b):
        viewer = a if on_a else b
        async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:

            async def post() -> None:
                r = await client.post(f"{a.url}/api/chat", json=chat_body("s1"))
                live.extend(d for _, d in sse_events(r.text))

            nursery.start_soon(post)
            with trio.fail_after(10):
                while True:  # the turn streams (its save waits for the gate)
                    async with client.stream(
                        "GET", f"{viewer.url}/api/chat/s1/stream", headers=headers or {}
                    ) as response:
                        if response.status_code == 200:
                            if stop:
                                r = await client.post(f"{b.url}/api/chat/s1/stop", json={})
                                assert r.status_code == 202
                                await cancelled(a.host.sessions["s1"].current)
                            store.gate.set()
                            raw = (await response.aread()).decode()
                            break
                    await trio.sleep(0.02)
    return live, [d for _, d in sse_events(raw)]


async def cancelled(turn: Any) -> None:
    """Wait until the turn's stop (over the relay's cancel channel) has reached it."""
    while True:
        if turn.cancel_reason is not None:
            return
        await trio.sleep(0.01)


def end(events: list[Any]) -> Any:
    return [e for e in events if e != "[DONE]"][-1]


async def test_a_resumed_stream_of_a_turn_whose_save_failed_ends_not_saved(redis_url: str):
    live, resumed = await live_and_resumed(GatedStore(), redis_url)
    told = {"type": "error", "errorText": f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}"}
    assert end(live) == told
    assert end(resumed) == told
    assert "finish" not in [e["type"] for e in resumed if isinstance(e, dict)]
    assert not any(leak in json.dumps(resumed) for leak in LEAKS)


async def test_a_stream_resumed_after_a_seq_ends_not_saved(redis_url: str):
    live, resumed = await live_and_resumed(GatedStore(), redis_url, {"last-event-id": "1"})
    assert (
        end(resumed)
        == end(live)
        == {
            "type": "error",
            "errorText": f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}",
        }
    )


async def test_the_front_end_running_the_turn_resumes_it_not_saved_too(redis_url: str):
    _, resumed = await live_and_resumed(GatedStore(), redis_url, on_a=True)
    assert end(resumed)["errorText"] == f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}"


async def test_a_resumed_stream_of_a_save_not_confirmed_in_time_says_it_may_not_be_saved(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(saving_module, "SAVE_TIMEOUT", 0.3)
    live, resumed = await live_and_resumed(GatedStore(hang=True), redis_url)
    told = {"type": "error", "errorText": f"{NOT_SAVED}: {NOT_CONFIRMED_MESSAGE}"}
    assert end(live) == end(resumed) == told


async def test_a_turn_stopped_from_another_front_end_while_its_save_fails_resumes_not_saved(
    redis_url: str,
):
    # The stop reaches the turn in its save (shielded): it ends unsaved, not stopped,
    # and both streams say so.
    live, resumed = await live_and_resumed(GatedStore(), redis_url, stop=True)
    told = {"type": "error", "errorText": f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}"}
    assert end(live) == end(resumed) == told


async def test_a_resumed_stream_of_a_saved_turn_still_ends_with_finish(redis_url: str):
    live, resumed = await live_and_resumed(GatedStore(down=False), redis_url)
    assert end(live)["type"] == end(resumed)["type"] == "finish"


class FakeWriter:
    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self.closed = False

    def append(self, chunk: Any) -> None:
        self.chunks.append(chunk)

    async def aclose(self, *, paused: bool = False) -> None:
        self.closed = True


class FakeRelay:
    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery
        self.opened: list[FakeWriter] = []

    def writer(self, **_: Any) -> FakeWriter:
        self.opened.append(FakeWriter())
        return self.opened[-1]


def finished(saved: bool) -> Any:
    return ev.TurnFinished(
        session_id="s",
        turn_id="t",
        finish_reason="stop",
        usage=Usage(),
        steps=1,
        saved=saved,
        error=None if saved else ErrorInfo(kind="StoreError", message="disk full"),
    )


async def test_an_end_chunk_that_comes_before_its_turn_finished_waits_for_it_and_is_told():
    async with trio.open_nursery() as nursery:
        relay = FakeRelay(nursery)
        publisher = RelayPublisher(relay, told=told_end)
        await publisher.handle(o.Start(session_id="s", turn_id="t", message_id="m"))
        await publisher.handle(
            o.Finish(session_id="s", turn_id="t", finish_reason="stop", usage=Usage())
        )
        (writer,) = relay.opened
        assert [c.type for c in writer.chunks] == ["start"]  # the end waits
        await publisher.handle(finished(saved=False))
        await trio.lowlevel.checkpoint()
    assert [c.type for c in writer.chunks] == ["start", "error"]
    assert writer.chunks[-1].error.kind == NOT_SAVED and writer.closed


async def test_an_end_whose_turn_finished_never_comes_goes_as_it_came(autojump_clock):
    async with trio.open_nursery() as nursery:
        relay = FakeRelay(nursery)
        publisher = RelayPublisher(relay, told=told_end)
        await publisher.handle(o.Start(session_id="s", turn_id="t", message_id="m"))
        await publisher.handle(
            o.Finish(session_id="s", turn_id="t", finish_reason="stop", usage=Usage())
        )
        await trio.sleep(FINISHED_WAIT + 1)
        (writer,) = relay.opened
        assert [c.type for c in writer.chunks] == ["start", "finish"] and writer.closed
        await publisher.handle(finished(saved=False))  # too late: nothing more
    assert [c.type for c in writer.chunks] == ["start", "finish"]


class DownStore(MemoryStore):
    """A memory store whose saves fail while ``down`` (or, with ``hang``, never answer)."""

    down = False
    hang = False

    async def save(self, *args: Any, **kwargs: Any) -> Any:
        if self.down and self.hang:
            await trio.sleep_forever()
        if self.down:
            raise StoreError("disk full")
        return await super().save(*args, **kwargs)


async def second_turn_lost(url: str, store: DownStore) -> tuple[list[Any], list[Any]]:
    """Turn 1 stored, turn 2's saves failing (``store.down`` set between them), turn 2's
    relay stream then lost (junk at its key): turn 2's live events and its resume's."""
    from tests.test_relay_web import JUNK_STREAMS, plant_junk_stream, written_active_turn

    async with two_front_ends(url, store) as (a, _):
        relay = a.app.state.axon.relay
        async with httpx.AsyncClient(base_url=a.url, timeout=30) as client:
            await client.post("/api/chat", json=chat_body("s1"))
            first = await written_active_turn(relay, "s1")
            store.down = True
            body = chat_body("s1", "again")
            body["messages"][0]["id"] = "u2"
            live = [d for _, d in sse_events((await client.post("/api/chat", json=body)).text)]
            with trio.fail_after(10):
                for _ in range(1000):  # (the publisher writes the key on its own task)
                    second = await written_active_turn(relay, "s1")
                    if second != first:
                        break
                    await trio.sleep(0.01)
            await plant_junk_stream(relay, "s1", second, JUNK_STREAMS["a key of another type"])
            resumed = (await client.get("/api/chat/s1/stream")).text
    return live, [d for _, d in sse_events(resumed)]


async def test_a_lost_stream_of_an_unsaved_turn_is_never_rebuilt_from_the_previous_answer(
    redis_url: str,
):
    # Turn 1 is stored; turn 2's save is refused (its session then closed: nothing
    # here knows the turn), and the relay loses its stream: the resume of turn 2 may
    # not show turn 1's answer ending ``finish``.
    live, resumed = await second_turn_lost(redis_url, DownStore())
    assert end(live)["errorText"] == f"{NOT_SAVED}: {NOT_SAVED_MESSAGE}"
    assert "one two three" not in json.dumps(resumed)
    assert [e["type"] for e in resumed if isinstance(e, dict)] == ["error"]
    assert "reload the session" in resumed[0]["errorText"]


async def test_a_lost_stream_of_a_turn_this_host_kept_unconfirmed_ends_as_its_live_stream(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
):
    # Turn 2's save is not confirmed in time: the session is kept (the save may land),
    # and the host knows what turn 2's client was told.
    monkeypatch.setattr(saving_module, "SAVE_TIMEOUT", 0.3)
    store = DownStore()
    store.hang = True
    live, resumed = await second_turn_lost(redis_url, store)
    told = {"type": "error", "errorText": f"{NOT_SAVED}: {NOT_CONFIRMED_MESSAGE}"}
    assert end(live) == end(resumed) == told
    assert [e["type"] for e in resumed if isinstance(e, dict)] == ["error"]
