"""A claiming host whose claim save fails (the file's write lock held by another
process past the busy timeout): the turn still runs and is saved, and no running
marker of it is left to make the session look busy elsewhere (branch ``attack3``,
attacking ``twinleft``: every new turn of a claiming host claims, with or without a
client's id). A claim stored whose turn's end saves are refused leaves its marker (its
writer alive): the same host's next OpenAI post of the session still runs, and clears
it (a guard for whoever makes a freshly opened session's twin check see the marker)."""

from __future__ import annotations

import sqlite3
from typing import Any

import httpx

from actors.providers.scripted import ScriptedProvider
from actors.stores import sqlite as sqlite_store
from runtime import Agent, Hooks, Host
from runtime.liveness import RUNNING_META, answering_elsewhere


class _LockDuringClaim:
    """Holds the file's write lock from the turn of ``one``'s start (before its claim)
    to its first step (after the claim, before the model call)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.other: sqlite3.Connection | None = None
        self.armed = False
        """Set: the next step's end takes the lock (:meth:`take_once`)."""

    async def take(self, started: Any) -> None:
        if started.input == "one":
            self.hold()

    async def take_once(self, _step: Any) -> None:
        if self.armed:
            self.armed = False
            self.hold()

    def hold(self) -> None:
        self.other = sqlite3.connect(self.path, isolation_level=None)
        self.other.execute("BEGIN IMMEDIATE")

    async def release(self, _step: Any) -> None:
        if self.other is not None:
            self.other.execute("COMMIT")
            self.other.close()
            self.other = None


def _saves(store: Any) -> list[str]:
    """Each ``store.save`` call's outcome: ``saved`` or the error's class name."""
    outcomes: list[str] = []
    save = store.save

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            version = await save(*args, **kwargs)
        except Exception as exc:
            outcomes.append(type(exc).__name__)
            raise
        outcomes.append("saved")
        return version

    store.save = recorded
    return outcomes


async def test_a_turn_whose_claim_save_fails_runs_is_saved_and_leaves_no_running_marker(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sqlite_store, "_BUSY_TIMEOUT", 0.2)
    db = str(tmp_path / "one.db")
    lock = _LockDuringClaim(db)
    hooks = Hooks(on_turn_start=lock.take, on_step_start=lock.release)
    async with (
        Host.open(store=db, log_tap=False) as host_a,
        Host.open(store=db, log_tap=False) as host_b,
    ):
        a = await host_a.open_session(
            Agent(provider=ScriptedProvider(steps=[["A."]] * 3), hooks=hooks), session_id="s"
        )
        b = await host_b.open_session(
            Agent(provider=ScriptedProvider(steps=[["B."]] * 2)), session_id="s"
        )
        for session, text in ((a, "zero"), (b, "zero b"), (a, "zero c"), (b, "zero d")):
            await session.run(text)  # each takes in the other's turn: both claim
        assert host_a.claims_turns
        outcomes = _saves(host_a.store)
        result = await a.run("one")
        record = await host_a.store.load("s")
    assert outcomes[0] == "StoreError"  # the claim, refused by the lock
    assert outcomes[-1] == "saved"
    assert result.saved
    assert [m.content for m in record.messages if m.role == "user"][-1] == "one"
    assert record.messages[-1].text == "A."
    assert record.meta.get(RUNNING_META) is None
    assert not answering_elsewhere(record.meta)


def _chat(text: str) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


async def test_an_openai_session_whose_turn_end_save_failed_after_its_claim_takes_the_next_post(
    tmp_path, monkeypatch
):
    """A's claim stored its running marker; the write lock, held from A's model call on,
    refused the turn's end saves, so the marker stayed (its writer, A, alive). The next
    OpenAI post to A, nothing running there, must run and clear it: its twin check read
    A's own stale marker as a turn running on another server (409 ``session_busy`` on
    every post, to A and B alike, for as long as A lived)."""
    from tests.test_sqlite_twin_claims import _meet
    from tests.web.harness import web_server

    monkeypatch.setattr(sqlite_store, "_BUSY_TIMEOUT", 0.2)
    db = str(tmp_path / "one.db")
    lock = _LockDuringClaim(db)

    agent = Agent(
        name="m",
        provider=ScriptedProvider(steps=[["A."]] * 8),
        hooks=Hooks(on_step_finish=lock.take_once),
    )
    async with (
        web_server(agent, store=db, protocols=("ai-sdk", "openai")) as a,
        web_server(Agent(name="m", provider=ScriptedProvider(steps=[["B."]] * 4)), store=db) as b,
    ):
        async with (
            httpx.AsyncClient(base_url=a.url, timeout=30) as to_a,
            httpx.AsyncClient(base_url=b.url, timeout=30) as to_b,
        ):
            await _meet(to_a, to_b)
            assert a.host.claims_turns
            lock.armed = True
            headers = {"X-Axon-Session": "s"}
            await to_a.post("/v1/chat/completions", json=_chat("one"), headers=headers)
            await lock.release(None)
            stale = (await a.host.store.load("s")).meta.get(RUNNING_META)
            after = await to_a.post("/v1/chat/completions", json=_chat("two"), headers=headers)
        record = await a.host.store.load("s")
    assert stale is not None  # the claim's marker, left by the refused end saves
    assert after.status_code == 200, after.content
    assert [m.content for m in record.messages if m.role == "user"][-1] == "two"
    assert record.meta.get(RUNNING_META) is None
