"""A sub-turn's fence (``PostgresStore.fence_under``) let go once its host closed the
sub-session and its saves are written (``Host.close_session`` ->
``PostgresStore.release_under``), so the store's bound on the fences it keeps past
their calling turn's block (``ENDED_REMEMBERED``) counts the sub-sessions still open,
not every one fenced since: a late save of a sub-turn that outlived its calling turn
was written unfenced once that many other sub-sessions had been fenced after it."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import actors.stores.postgres_fences as postgres_fences
from actors.providers.scripted import ScriptedProvider
from actors.stores.memory import MemoryStore
from actors.stores.postgres import Fence, PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent, Host
from runtime.errors import LeaseLost
from runtime.messages import UserMessage
from runtime.tools import PARENT_SESSION_META


async def test_a_late_sub_turn_save_is_refused_after_more_closed_sub_sessions_than_the_bound(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_fences, "ENDED_REMEMBERED", 2)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        fence = await _claimed_caller(queue)
        with store.fenced("c", fence):
            store.fence_under("late", "c")  # a sub-turn that outlives the block
            for n in range(3):  # three more, closed (released) as their sub-turns end
                store.fence_under(f"sub{n}", "c")
                release = store.release_under(f"sub{n}")
                assert release is not None
                release()
        for n in range(3, 6):  # three opened as the block ended, closed too
            store.fence_under(f"sub{n}", "c")
            release = store.release_under(f"sub{n}")
            assert release is not None
            release()
        await store.run(  # another worker takes the calling turn over
            "takeover",
            lambda conn: conn.execute("UPDATE axon_turns SET epoch = epoch + 1, owner = 'v'"),
        )
        with pytest.raises(LeaseLost):
            await store.save("late", 0, [UserMessage(content="late")], {PARENT_SESSION_META: "c"})
        assert await store.load("late") is None
    finally:
        await queue.aclose()


async def test_a_release_leaves_the_fence_of_the_sub_session_opened_again(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        fence = await _claimed_caller(queue)
        with store.fenced("c", fence):
            store.fence_under("sub", "c")
            release = store.release_under("sub")  # (closed, a save still in flight)
            store.fence_under("sub", "c")  # opened again before that save is written
            assert release is not None
            release()
            assert store._save_fence("sub") is not None
    finally:
        await queue.aclose()


class _Recording(MemoryStore):
    """A store that fences sub-sessions as far as telling which were released."""

    def __init__(self) -> None:
        super().__init__()
        self.released: list[str] = []

    def fence_under(self, session_id: str, caller_id: str) -> None:
        pass

    def release_under(self, session_id: str) -> Any:
        return lambda: self.released.append(session_id)


async def test_a_host_closing_a_sub_session_releases_its_fence() -> None:
    store = _Recording()
    async with Host.open(store=store, log_tap=False) as host:
        agent = Agent(name="a", provider=ScriptedProvider(responder=lambda request: ["hi"]))
        session = await host.open_session(
            agent, session_id="c.helper.k1", meta={PARENT_SESSION_META: "c"}
        )
        await session.run("hello")
        assert store.released == []
        await session.close()
        assert store.released == ["c.helper.k1"]


class _SlowRecording(_Recording):
    """:class:`_Recording` whose saves outlast the turn's wait for them."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.stored_at_release: list[bool] = []

    async def save(self, *args: Any, **kwargs: Any) -> Any:
        await trio.sleep(self.delay)
        return await super().save(*args, **kwargs)

    def release_under(self, session_id: str) -> Any:
        def release() -> None:
            self.stored_at_release.append(session_id in self._sessions)
            self.released.append(session_id)

        return release


async def test_a_sub_session_closed_with_a_save_in_flight_is_released_once_it_is_written(
    autojump_clock: Any,
) -> None:
    from actors.turn.saving import SAVE_TIMEOUT

    store = _SlowRecording(SAVE_TIMEOUT * 2)
    async with Host.open(store=store, log_tap=False) as host:
        agent = Agent(name="a", provider=ScriptedProvider(responder=lambda request: ["hi"]))
        session = await host.open_session(
            agent, session_id="c.helper.k1", meta={PARENT_SESSION_META: "c"}
        )
        await session.run("hello")
        assert not session.state.all_saved  # (the save in flight)
        await session.close()
        assert store.released == []  # (its save not written yet: it may still be refused)
        await trio.sleep(SAVE_TIMEOUT * 4)
        assert store.stored_at_release == [True]


async def _claimed_caller(queue: TurnQueue) -> Fence:
    """The fence of worker ``w``'s claim of a turn of session ``c`` (the calling turn)."""
    await queue.submit("c", "hi")
    claim = await queue.claim("w")
    assert claim is not None
    return Fence(turn_id=claim.turn.turn_id, owner="w", epoch=claim.epoch)
