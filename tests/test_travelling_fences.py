"""A turn's saves carry the fence its turn began under (``RunTurn.fence`` ->
``SaveRequest.fence`` -> ``PostgresStore.save(fence=...)``), so a save that reaches the
store late is checked against that fence whatever the store still remembers of it.

Before, the store looked the session's fence up when the save *ran*, in maps bounded at
``ENDED_REMEMBERED``: a claimed session's ended block (``_ended``) and a sub-session
fenced past its calling turn's block (``_after``). A late save whose entry other
sessions had pushed out was written unfenced: a sub-turn's after another worker took
its calling turn over, a claimed turn's after its worker gave it up. The bound is made 2
here in place of 65,536 real sessions."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import actors.stores.postgres_fences as postgres_fences
from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import Fence, PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent, Host
from runtime.errors import LeaseLost
from runtime.messages import UserMessage
from runtime.tools import PARENT_SESSION_META

SUB = "c.helper.k1"


class _Gate:
    """Holds ``store``'s saves of ``session_id`` until opened, as a persister's backlog
    does: the save is on its way, its fence not looked at yet."""

    def __init__(self, store: PostgresStore, session_id: str) -> None:
        self.open = trio.Event()
        self.held = trio.Event()
        self.answered = trio.Event()
        self.outcomes: list[BaseException | int] = []
        real = store.save

        async def save(sid: str, *args: Any, **kwargs: Any) -> int:
            if sid != session_id:
                return await real(sid, *args, **kwargs)
            self.held.set()
            await self.open.wait()
            try:
                version = await real(sid, *args, **kwargs)
            except BaseException as exc:
                self.outcomes.append(exc)
                raise
            finally:
                self.answered.set()
            self.outcomes.append(version)
            return version

        store.save = save  # type: ignore[method-assign]


def _agent(answer: str) -> Agent:
    return Agent(name="a", provider=ScriptedProvider(responder=lambda request: [answer]))


async def _run_quietly(session: Any, text: str) -> None:
    try:
        await session.run(text)
    except Exception:  # (the turn's answer is the test's to read: what is stored)
        pass


async def _stored_text(store: PostgresStore, session_id: str) -> str:
    record = await store.load(session_id)
    return "" if record is None else repr(record.messages)


async def test_a_late_sub_turn_save_is_refused_after_the_bound_of_sub_sessions_still_open(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_fences, "ENDED_REMEMBERED", 2)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    gate = _Gate(store, SUB)
    try:
        await queue.submit("c", "hi")
        claim = await queue.claim("w")
        assert claim is not None
        fence = Fence(turn_id=claim.turn.turn_id, owner="w", epoch=claim.epoch)
        async with Host.open(store=store, log_tap=False) as host, trio.open_nursery() as nursery:
            with store.fenced("c", fence):
                sub = await host.open_session(
                    _agent("late answer"), session_id=SUB, meta={PARENT_SESSION_META: "c"}
                )
                nursery.start_soon(_run_quietly, sub, "hello")
                await gate.held.wait()  # its save on its way as the calling turn ends
            # Three more sub-sessions of the caller, opened past its block and still
            # open: more than the bound of such fences the store keeps.
            for n in range(3):
                store.fence_under(f"c.helper.o{n}", "c")
            assert SUB not in store._after  # (pushed out: the store no longer knows it)
            await store.run(  # another worker takes the calling turn over
                "takeover",
                lambda conn: conn.execute("UPDATE axon_turns SET epoch = epoch + 1, owner = 'v'"),
            )
            gate.open.set()
            await gate.answered.wait()
        assert isinstance(gate.outcomes[0], LeaseLost), gate.outcomes
        assert "late answer" not in await _stored_text(store, SUB)
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_late_save_of_a_claimed_turn_is_refused_after_the_bound_of_ended_blocks(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres_fences, "ENDED_REMEMBERED", 2)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    gate = _Gate(store, "s")
    try:
        await queue.submit("s", "hi")
        claim = await queue.claim("w")
        assert claim is not None
        fence = Fence(turn_id=claim.turn.turn_id, owner="w", epoch=claim.epoch)
        async with Host.open(store=store, log_tap=False) as host, trio.open_nursery() as nursery:
            with store.fenced("s", fence):
                session = await host.open_session(_agent("late answer"), session_id="s")
                nursery.start_soon(_run_quietly, session, "hello")
                await gate.held.wait()  # the worker gives the turn up, its save on its way
            for n in range(3):  # three more claimed sessions' blocks end after it
                with store.fenced(f"o{n}", Fence(turn_id=f"t{n}", owner="w", epoch=1)):
                    pass
            assert "s" not in store._ended  # (pushed out: the store no longer knows it)
            gate.open.set()
            await gate.answered.wait()
        assert isinstance(gate.outcomes[0], LeaseLost), gate.outcomes
        assert "late answer" not in await _stored_text(store, "s")
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_carried_fence_holds_no_callback_and_finds_its_blocks_own_while_it_lasts(
    pg_url: str,
) -> None:
    # What a turn carries pins nothing of the worker's turn (the callbacks hold its
    # stream and history); a save made while the block lasts runs under the block's own
    # fence (its refusal told to the worker), one made after it is refused as late.
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    told: list[str] = []
    try:
        await queue.submit("s", "hi")
        claim = await queue.claim("w")
        assert claim is not None
        fence = Fence(
            turn_id=claim.turn.turn_id,
            owner="w",
            epoch=claim.epoch,
            on_lost=lambda: told.append("lost"),
        )
        with store.fenced("s", fence):
            carried = store.fence_of("s")
            assert carried is not None and carried.on_lost is None
            assert carried.block is fence.block
            await store.run(  # another worker takes the turn over
                "takeover",
                lambda conn: conn.execute("UPDATE axon_turns SET epoch = epoch + 1, owner = 'v'"),
            )
            with pytest.raises(LeaseLost):
                await store.save("s", 0, _say("in the block"), fence=carried)
            assert told == ["lost"]
        with pytest.raises(LeaseLost, match=r"gave turn .* up"):
            await store.save("s", 0, _say("after it"), fence=carried)
        assert told == ["lost"]  # (the block's callbacks are not called past it)
        assert await store.load("s") is None
    finally:
        await queue.aclose()
        await store.aclose()


def _say(text: str) -> list[UserMessage]:
    return [UserMessage(content=text)]
