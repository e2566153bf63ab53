"""A regenerate whose save meets another writer's (branch ``markers``, rebaseprop's
"Left"): its save, rebased, appended the new turn after what the store held, the
regenerated turn still in it (the question stored twice). The save now names the
messages it cut (:attr:`~runtime.actor_messages.SaveRequest.cut`): the rebase drops
them when nothing of another writer's came after them, and refuses the turn
(:class:`~runtime.errors.AnsweredElsewhere`, as an edit under the same id is) when
another writer's turn did: replacing the old turn would drop that one."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Hooks, Host
from runtime.errors import AnsweredElsewhere, StoreError
from runtime.messages import AssistantMessage, UserMessage
from runtime.store import rebase
from tests.test_twin_first_meeting import _no_registry


@pytest.fixture(autouse=True)
def _no_writers_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hosts here keep no registry of the file's writers (as on a store without
    one, or hosts that have not met yet): with it, host A knows of B as B opens and
    claims its regenerate before the model call, so B's turn comes after it
    (:func:`test_a_regenerate_on_a_host_that_knows_the_other_is_claimed_first`); this
    pins the rebase's own rule for a save that meets another writer's."""
    monkeypatch.setattr(Host, "_join_writers", _no_registry)


class _Gate:
    """Holds a turn at its step's start once armed, until released."""

    def __init__(self) -> None:
        self.armed = False
        self.held, self.go = trio.Event(), trio.Event()

    async def hold(self, _step: Any) -> None:
        if self.armed:
            self.armed = False
            self.held.set()
            await self.go.wait()


async def _regenerate_while(path: str, meanwhile: Any) -> tuple[Any, list[tuple[str, Any]]]:
    """On host A: ``q1``, ``q2``, then a regenerate of ``q2`` (a new id) held before its
    model call while ``meanwhile(host_b)`` writes; returns the regenerate's result and
    the stored ``(role, text)`` of each message."""
    gate = _Gate()
    agent = Agent(
        provider=ScriptedProvider(steps=[["A."]] * 4), hooks=Hooks(on_step_start=gate.hold)
    )
    async with Host.open(store=path, log_tap=False) as a, Host.open(store=path, log_tap=False) as b:
        session = await a.open_session(agent, session_id="s")
        await session.run("q1")
        await session.run("q2")
        result = await _regenerate_held(session, gate, lambda: meanwhile(b))
        record = await a.store.load("s")
    stored = [(m.role, m.content if m.role == "user" else m.text) for m in record.messages]
    return result, stored


async def _regenerate_held(session: Any, gate: _Gate, meanwhile: Any) -> Any:
    """Streams a regenerate of ``q2`` (``"q2 again"``) held by ``gate`` at its step's
    start while ``await meanwhile()`` runs; returns its result. Shared with
    tests/test_marker_refresh_attacks.py."""
    gate.armed = True
    results: list[Any] = []
    async with trio.open_nursery() as nursery:

        async def regenerate() -> None:
            async with session.stream("q2 again", regenerate=True) as out:
                async for _ in out:
                    pass
            results.append(out.result)

        nursery.start_soon(regenerate)
        await gate.held.wait()
        await meanwhile()
        gate.go.set()
    return results[0]


async def test_a_regenerate_whose_turn_another_host_answered_after_is_refused(tmp_path):
    async def answer_after(b: Host) -> None:
        other = await b.open_session(Agent(provider=ScriptedProvider(steps=[["B."]])), "s")
        await other.run("q3")

    result, stored = await _regenerate_while(str(tmp_path / "one.db"), answer_after)
    assert not result.saved
    assert result.error.kind == "AnsweredElsewhere"
    assert stored == [
        ("user", "q1"), ("assistant", "A."),
        ("user", "q2"), ("assistant", "A."),
        ("user", "q3"), ("assistant", "B."),
    ]  # fmt: skip


async def test_a_regenerate_whose_save_meets_a_meta_save_replaces_the_turn(tmp_path):
    async def retitle(b: Host) -> None:
        record = await b.store.load("s")
        await b.store.save(
            "s", len(record.messages), (), {**record.meta, "title": "T"},
            expected_version=record.version,
        )  # fmt: skip

    result, stored = await _regenerate_while(str(tmp_path / "one.db"), retitle)
    assert result.saved
    assert stored == [
        ("user", "q1"), ("assistant", "A."),
        ("user", "q2 again"), ("assistant", "A."),
    ]  # fmt: skip


async def test_a_regenerate_left_unsaved_is_dropped_by_the_reload_that_meets_a_turn_after_it(
    tmp_path,
):
    """A library host keeps a turn the store refused; the next turn's reload met B's
    turn after the one the regenerate cut: the old turn and the new one (after B's)
    were both saved with the next turn."""
    store_of: list[Any] = []

    async def answer_after_while_a_fails(b: Host) -> None:
        a_store = store_of[0]
        a_store.save, save = _refusing, a_store.save
        store_of.append(save)
        other = await b.open_session(Agent(provider=ScriptedProvider(steps=[["B."]])), "s")
        await other.run("q3")

    async def _refusing(*args: Any, **kwargs: Any) -> int:
        raise StoreError("the disk is full")

    gate = _Gate()
    agent = Agent(
        provider=ScriptedProvider(steps=[["A."]] * 4), hooks=Hooks(on_step_start=gate.hold)
    )
    async with Host.open(store=str(tmp_path / "one.db"), log_tap=False) as a:
        async with Host.open(store=str(tmp_path / "one.db"), log_tap=False) as b:
            store_of.append(a.store)
            session = await a.open_session(agent, session_id="s")
            await session.run("q1")
            await session.run("q2")
            result = await _regenerate_held(session, gate, lambda: answer_after_while_a_fails(b))
            a.store.save = store_of[1]  # type: ignore[method-assign]
            assert not result.saved
            await session.run("next")
            record = await a.store.load("s")
    assert [(m.role, m.content if m.role == "user" else m.text) for m in record.messages] == [
        ("user", "q1"), ("assistant", "A."),
        ("user", "q2"), ("assistant", "A."),
        ("user", "q3"), ("assistant", "B."),
        ("user", "next"), ("assistant", "A."),
    ]  # fmt: skip


def _turn(tag: str) -> list[Any]:
    return [UserMessage(content=tag, id=f"u-{tag}"), AssistantMessage(id=f"a-{tag}")]


def test_a_rebase_drops_the_cut_messages_when_nothing_came_after_them():
    stored, ours = [*_turn("1"), *_turn("2")], _turn("2b")
    base, start = rebase(stored, ours, cut={"u-2", "a-2"})
    assert (base, start) == (tuple(_turn("1")), 2)


def test_a_rebase_refuses_when_another_writers_turn_came_after_the_cut_messages():
    stored, ours = [*_turn("1"), *_turn("2"), *_turn("3")], _turn("2b")
    with pytest.raises(AnsweredElsewhere) as caught:
        rebase(stored, ours, cut={"u-2", "a-2"})
    assert caught.value.message_id == "u-2b"


def test_a_rebase_whose_cut_messages_are_gone_appends():
    """Another writer replaced them itself (its own regenerate): nothing to cut."""
    stored, ours = [*_turn("1"), *_turn("2c")], _turn("2b")
    assert rebase(stored, ours, cut={"u-2", "a-2"}) == (tuple(stored), 4)


async def test_a_regenerate_on_a_host_that_knows_the_other_is_claimed_first(tmp_path, monkeypatch):
    """With the writers' registry (branch ``twins2``) A knows of B as B opens: its
    regenerate is stored (claimed) before its model call, the cut turn gone with it,
    and B's turn, another message, is stored beside it: each question once, each
    answered once, the regenerated one not kept."""
    monkeypatch.undo()  # (the writers' registry kept)
    seen: list[Any] = []

    async def answer_after(b: Host) -> None:
        other = await b.open_session(Agent(provider=ScriptedProvider(steps=[["B."]])), "s")
        seen.append(await other.run("q3"))

    result, stored = await _regenerate_while(str(tmp_path / "one.db"), answer_after)
    assert result.saved and seen[0].saved
    assert sorted(stored[i : i + 2] for i in range(0, len(stored), 2)) == [
        [("user", "q1"), ("assistant", "A.")],
        [("user", "q2 again"), ("assistant", "A.")],
        [("user", "q3"), ("assistant", "B.")],
    ]
