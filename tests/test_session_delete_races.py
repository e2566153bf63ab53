"""A turn's save that races its session's delete: in flight at the store past the
delete's wait, or landing after a new message re-created the session under the same id
on another embedded host. The deleted conversation's turn must never write into the
store again: not back into the deleted session, not into the new one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import actors.turn.saving as saving
import runtime.app.host as host_module
from actors.relays import RedisRelay, attach_relay
from actors.stores import MemoryStore
from runtime import Host
from runtime.errors import SESSION_DELETED
from runtime.messages import UserMessage
from tests.support.redis import require_redis, unique_prefix
from tests.test_session_delete import LIMIT, _agent, _Gate
from tests.test_web_http import body
from tests.web.harness import web_server


class HeldSaves(MemoryStore):
    """A memory store whose saves wait at ``release`` once ``holding`` (``entered`` set as
    the first one waits, ``landed`` once it is written); deletes are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = False
        self.entered, self.release, self.landed = trio.Event(), trio.Event(), trio.Event()
        self.deletes = 0

    async def save(self, *args: Any, **kwargs: Any) -> int:
        if self.holding:
            self.entered.set()
            await self.release.wait()
            try:
                return await super().save(*args, **kwargs)
            finally:
                self.landed.set()
        return await super().save(*args, **kwargs)

    async def delete(self, session_id: str) -> None:
        self.deletes += 1
        await super().delete(session_id)


async def test_a_new_sessions_first_save_landing_after_its_delete_does_not_bring_it_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The turn's first save is at the store when the delete comes, and stays there past
    # the turn's SAVE_TIMEOUT and the delete's wait: the delete found nothing to delete,
    # and the save, landing after, created the session again with the deleted turn in it.
    monkeypatch.setattr(saving, "SAVE_TIMEOUT", 0.2)
    monkeypatch.setattr(host_module, "_DELETE_WAIT", 0.3)
    store, gate, asked = HeldSaves(), _Gate(), []
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, asked), session_id="n")
        results: list[Any] = []

        async def run() -> None:
            results.append(await session.run("hold on"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            store.holding = True
            gate.opened.set()  # the tool returns: the step's save goes to the store
            with trio.fail_after(LIMIT):
                await store.entered.wait()
            await host.delete_session("n")
        assert await store.load("n") is None  # (the save still waits at the store)
        store.release.set()
        with trio.fail_after(LIMIT):
            await store.landed.wait()
        with trio.move_on_after(5):  # the persister undoes it (before: nothing did)
            while store.deletes < 2:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert await store.load("n") is None
        assert [info.session_id for info in await store.list_sessions()] == []
    (result,) = results
    assert result.abort_reason == SESSION_DELETED


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def _users(record: Any) -> list[Any]:
    return [m.content for m in record.messages if isinstance(m, UserMessage)]


async def test_a_session_deleted_and_re_created_on_another_host_keeps_the_old_turn_out(
    redis_url: str, tmp_path: Path
) -> None:
    # serve --redis, two embedded hosts on one SQLite file. A runs a turn of "s"; B
    # deletes "s" (B holds nothing of it: only the store's delete) and a new message to
    # "s" on B starts it again. A's turn, let go, met its save's conflict, reloaded, took
    # the new conversation for another writer's and appended the deleted one's turn to
    # it. Now B's delete tells A over the relay: A's turn is cancelled and none of its
    # saves write; its client sees the stream end with abort "session deleted".
    gate, asked = _Gate(), []
    agent = _agent(gate, asked)
    path = str(tmp_path / "sessions.db")
    prefix = unique_prefix()
    async with (
        RedisRelay.open(redis_url, prefix=prefix) as relay_a,
        RedisRelay.open(redis_url, prefix=prefix) as relay_b,
        web_server(agent, store=path, relay=relay_a) as a,
        web_server(agent, store=path, relay=relay_b) as b,
        httpx.AsyncClient(timeout=LIMIT) as client,
    ):
        await attach_relay(a.host, relay_a)
        await client.post(f"{a.url}/api/chat", json=body("s", "first", message_id="u1"))
        old: list[httpx.Response] = []

        async def old_turn() -> None:
            old.append(
                await client.post(f"{a.url}/api/chat", json=body("s", "hold on", message_id="u2"))
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(old_turn)
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            deleted = await client.delete(
                f"{b.url}/api/sessions/s", headers={"content-type": "application/json"}
            )
            with trio.move_on_after(3):  # (before: A's turn ran on, held by the tool)
                while not old:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            new = await client.post(f"{b.url}/api/chat", json=body("s", "fresh", message_id="u3"))
            gate.opened.set()
        record = await b.host.store.load("s")
    assert record is not None and _users(record) == ["fresh"]  # before: + "hold on"
    assert deleted.status_code == 204 and new.status_code == 200
    assert 'data: {"type":"abort","reason":"session deleted"}' in old[0].text


class HeldView:
    """Another host's handle on ``inner`` (one memory store, two hosts), whose saves wait
    at ``release`` once ``holding``, as :class:`HeldSaves`'s."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.holding = False
        self.entered, self.release, self.landed = trio.Event(), trio.Event(), trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save(self, *args: Any, **kwargs: Any) -> int:
        if self.holding:
            self.entered.set()
            await self.release.wait()
            try:
                return await self.inner.save(*args, **kwargs)
            finally:
                self.landed.set()
        return await self.inner.save(*args, **kwargs)


async def test_a_save_in_flight_when_another_host_deletes_and_re_creates_writes_nothing(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A's step save is at the store when B deletes "s" and a new message re-creates it:
    # landing, it conflicts, reloads, and (before) appended the deleted turn to the new
    # conversation. A was told of the delete (the relay) while the save was in flight:
    # the persister refuses it at its reload.
    monkeypatch.setattr(saving, "SAVE_TIMEOUT", 0.2)
    gate, asked = _Gate(), []
    agent = _agent(gate, asked)
    shared = MemoryStore()
    held = HeldView(shared)
    prefix = unique_prefix()
    async with (
        RedisRelay.open(redis_url, prefix=prefix) as relay_a,
        RedisRelay.open(redis_url, prefix=prefix) as relay_b,
        web_server(agent, store=held, relay=relay_a) as a,
        web_server(agent, store=shared, relay=relay_b) as b,
        httpx.AsyncClient(timeout=LIMIT) as client,
    ):
        await attach_relay(a.host, relay_a)
        await client.post(f"{a.url}/api/chat", json=body("s", "first", message_id="u1"))
        old: list[httpx.Response] = []

        async def old_turn() -> None:
            old.append(
                await client.post(f"{a.url}/api/chat", json=body("s", "hold on", message_id="u2"))
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(old_turn)
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            held.holding = True
            gate.opened.set()
            with trio.fail_after(LIMIT):
                await held.entered.wait()
            deleted = await client.delete(
                f"{b.url}/api/sessions/s", headers={"content-type": "application/json"}
            )
            with trio.move_on_after(3):  # until A's turn ends (its save still at the store)
                while not old:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            new = await client.post(f"{b.url}/api/chat", json=body("s", "fresh", message_id="u3"))
            held.release.set()
            with trio.fail_after(LIMIT):
                await held.landed.wait()
        # A's persister writes in order: once a turn of another session on A is saved,
        # what it had of "s" is written (or refused)
        await client.post(f"{a.url}/api/chat", json=body("z", "after", message_id="u4"))
        record = await shared.load("s")
    assert record is not None and _users(record) == ["fresh"]  # before: + "hold on"
    assert deleted.status_code == 204 and new.status_code == 200
    # the old turn had answered (its stream ended as usual) before its save landed
    assert old[0].text.endswith("data: [DONE]\n\n")


async def test_a_turn_named_as_a_deleted_sessions_turn_is_saved_in_the_new_session() -> None:
    # The deleted turn's id stays refused (its save may still be at the store); a client
    # whose ids are constant (an AG-UI runId) names its next turn, on the session it
    # starts again, the same: that turn takes an id of its own and is saved.
    store, gate, asked = MemoryStore(), _Gate(), []
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, asked), session_id="s")
        async with trio.open_nursery() as nursery:

            async def old() -> None:
                async with session.stream("hold on", turn_id="run-1") as out:
                    await out.collect()

            nursery.start_soon(old)
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            await host.delete_session("s")
        again = await host.open_session(_agent(gate, asked), session_id="s")
        async with again.stream("again", turn_id="run-1") as out:
            await out.collect()
        record = await store.load("s")
    assert record is not None and _users(record) == ["again"]  # before: nothing saved
    assert out.turn_id != "run-1"
