"""A session deleted while a turn of it runs stays deleted.

Before: the running turn's next save found the session gone, the persister took that
for another writer's work, reloaded (nothing) and saved the whole turn from message 0
at version 0: the session came back, holding the deleted conversation's last turn. In
a worker deployment the deleted session's queued turns, and one waiting for a person,
still ran (or could be resumed) after the delete.

Now (docs/architecture.md, "Deleting a session"):

* the embedded host's ``delete_session`` cancels the running turn (abort reason
  ``session deleted``), withdraws the turns queued behind it, then deletes;
* a turn's save based on a stored version of a session that is gone is refused
  (:class:`~runtime.errors.SessionDeleted`); the turn ends ``aborted`` (``session
  deleted``) with no error, nothing written, its history forgotten;
* PostgreSQL's ``delete`` ends the session's open turns ``cancelled`` in its transaction:
  a worker running one has every later save refused, queued and waiting ones never run.

Real SQLite files and a PostgreSQL server of the test run's own (``pg_url``); outcomes
and counts, no timings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores import MemoryStore, SQLiteStore
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent, Host
from runtime.actor_messages import InferRequest
from runtime.errors import SESSION_DELETED, TurnWithdrawn
from runtime.messages import TextPart, UserMessage
from runtime.tools import tool

LIMIT = 60.0


class _Gate:
    """The ``hold`` tool's gate: ``entered`` once a call waits, ``opened`` lets it go."""

    def __init__(self) -> None:
        self.entered = trio.Event()
        self.opened = trio.Event()
        self.calls = 0


def _text(request: InferRequest) -> str:
    for message in reversed(request.messages):
        if type(message) is UserMessage:
            content = message.content
            if isinstance(content, str):
                return content
            return "".join(p.text for p in content if isinstance(p, TextPart))
    return ""


def _agent(gate: _Gate, asked: list[str]) -> Agent:
    """Input ``hold ...``: step 0 calls ``hold`` (waits for the gate), step 1 answers;
    any other input answers at once. ``asked`` gets each model call's last input."""

    @tool
    async def hold() -> str:
        """Wait for the test."""
        gate.calls += 1
        gate.entered.set()
        await gate.opened.wait()
        return "held"

    def respond(request: InferRequest) -> list[Any]:
        user = _text(request)
        asked.append(user)
        if user.startswith("hold") and current_step(request.messages) == 0:
            return tool_call("hold", {}, tool_call_id="call_hold")
        return [f"echo: {user}"]

    return Agent(name="delete-test", provider=ScriptedProvider(responder=respond), tools=[hold])


@pytest.fixture(params=["memory", "sqlite"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Any, Any]]:
    """The host's store and a second handle on the same sessions (another process's, for
    SQLite: a second connection to the file)."""
    if request.param == "memory":
        store = MemoryStore()
        yield store, store
        await store.aclose()
        return
    path = tmp_path / "sessions.db"
    host_store = await SQLiteStore.open(path)
    other = await SQLiteStore.open(path)
    try:
        yield host_store, other
    finally:
        await other.aclose()
        await host_store.aclose()


async def _ids(store: Any) -> list[str]:
    return [info.session_id for info in await store.list_sessions()]


async def test_a_session_deleted_in_the_store_while_its_turn_runs_is_not_created_again(
    stores: tuple[Any, Any],
) -> None:
    store, other = stores
    gate, asked = _Gate(), []
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, asked), session_id="s")
        await session.run("first")  # stored: the next turn's saves are based on it
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def second() -> None:
                results.append(await session.run("hold on"))

            nursery.start_soon(second)
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            await other.delete("s")  # another writer deletes it (another process)
            gate.opened.set()
        (result,) = results
        assert await store.load("s") is None
        assert "s" not in await _ids(store)
    assert await store.load("s") is None
    assert (result.finish_reason, result.abort_reason, result.error) == (
        "aborted",
        SESSION_DELETED,
        None,
    )


async def test_a_turn_after_a_deletion_starts_a_new_conversation(
    stores: tuple[Any, Any],
) -> None:
    store, other = stores
    gate, asked = _Gate(), []
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, asked), session_id="s")
        await session.run("first")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "hold on")
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            await other.delete("s")
            gate.opened.set()
        await session.run("again")
    record = await store.load("s")
    assert record is not None
    assert [m.content for m in record.messages if isinstance(m, UserMessage)] == ["again"]


async def test_a_session_deleted_by_its_host_while_its_turn_runs_stays_deleted(
    stores: tuple[Any, Any],
) -> None:
    store, _ = stores
    gate, asked = _Gate(), []
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, asked), session_id="s", on_busy="enqueue")
        await session.run("first")
        results: list[Any] = []
        withdrawn: list[BaseException] = []

        async def run(text: str) -> None:
            try:
                results.append(await session.run(text))
            except TurnWithdrawn as exc:
                withdrawn.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "hold on")
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            nursery.start_soon(run, "queued behind")
            while session.queued == 0:  # until it waits in the queue
                await trio.lowlevel.checkpoint()
            await host.delete_session("s")
            gate.opened.set()
        assert await store.load("s") is None
        assert "s" not in await _ids(store)
    (result,) = results
    assert (result.finish_reason, result.abort_reason) == ("aborted", SESSION_DELETED)
    assert len(withdrawn) == 1  # the queued turn never ran
    assert asked == ["first", "hold on"]  # no model call for it, nor after the cancel
    assert await store.load("s") is None


async def test_a_new_session_deleted_by_its_host_before_its_first_save_stays_deleted(
    stores: tuple[Any, Any],
) -> None:
    store, _ = stores
    gate, asked = _Gate(), []
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, asked), session_id="n")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "hold on")
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            await host.delete_session("n")
            gate.opened.set()
        assert await store.load("n") is None
        assert await _ids(store) == []


# -- a worker deployment on PostgreSQL ----------------------------------------------------


def _worker_agent(gate: _Gate, asked: list[str]) -> Agent:
    """:func:`_agent`, and input ``approve ...``: step 0 calls ``guarded``, which waits for
    a person's approval (the turn suspends: ``awaiting-input``)."""
    base = _agent(gate, asked)

    @tool(needs_approval=True)
    async def guarded() -> str:
        """Needs a person's approval."""
        return "done"

    def respond(request: InferRequest) -> list[Any]:
        user = _text(request)
        if user.startswith("approve") and current_step(request.messages) == 0:
            asked.append(user)
            return tool_call("guarded", {}, tool_call_id="call_guarded")
        return base.provider.responder(request)  # type: ignore[union-attr]

    return Agent(
        name="delete-test",
        provider=ScriptedProvider(responder=respond),
        tools=[*base.tools, guarded],
    )


@pytest.fixture
async def deployment(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore, TurnQueue]]:
    """A worker's store, and a front end's store and queue, on one schema."""
    worker_store = await PostgresStore.open(pg_url)
    front = await PostgresStore.open(pg_url)
    queue = TurnQueue(front)
    try:
        yield worker_store, front, queue
    finally:
        await queue.aclose()
        await front.aclose()
        await worker_store.aclose()


async def _until_idle(worker: Any) -> None:
    with trio.fail_after(LIMIT):
        while worker.running:  # noqa: ASYNC110 - the worker's turn ends (lost: refused)
            await trio.sleep(0.02)


async def test_a_session_deleted_while_a_worker_runs_its_turn_stays_deleted(
    deployment: tuple[PostgresStore, PostgresStore, TurnQueue],
) -> None:
    from structlog.testing import capture_logs

    from runtime.app.worker import Worker

    worker_store, front, queue = deployment
    gate, asked = _Gate(), []
    async with trio.open_nursery() as nursery:
        worker = Worker(store=worker_store, agent=_worker_agent(gate, asked), owner="w", poll=0.05)
        await nursery.start(worker.run)
        first = await queue.submit("s", "first")
        done = await queue.wait_finished(first.turn_id, LIMIT)
        assert done is not None and done.status == "done"
        held = await queue.submit("s", "hold on")
        with trio.fail_after(LIMIT):
            await gate.entered.wait()
        queued = await queue.submit("s", "queued behind")
        with capture_logs() as logs:
            await front.delete("s")  # the front end deletes it: the worker's turn runs on
            gate.opened.set()
            await _until_idle(worker)
        other = await queue.submit("t", "another session")  # the worker still claims
        done = await queue.wait_finished(other.turn_id, LIMIT)
        assert done is not None and done.status == "done"
        worker.stop()
    turns = {t.turn_id: t for t in await queue.turns("s")}
    assert await front.load("s") is None
    assert [info.session_id for info in await front.list_sessions()] == ["t"]
    assert (turns[held.turn_id].status, turns[queued.turn_id].status) == (
        "cancelled",
        "cancelled",
    )
    assert "queued behind" not in asked  # it never ran
    # the worker's turn ended quietly: its save refused as the session's deletion, no
    # error (before: the persister's session.save-failed, the turn's LeaseLost error)
    events = [(e["event"], e.get("log_level")) for e in logs]
    assert not [e for e in events if e[1] == "error"], events


async def test_a_deleted_sessions_waiting_turn_ends_and_its_queued_turns_never_run(
    deployment: tuple[PostgresStore, PostgresStore, TurnQueue],
) -> None:
    from runtime.app.worker import Worker

    worker_store, front, queue = deployment
    gate, asked = _Gate(), []
    async with trio.open_nursery() as nursery:
        worker = Worker(store=worker_store, agent=_worker_agent(gate, asked), owner="w", poll=0.05)
        await nursery.start(worker.run)
        waiting = await queue.submit("s", "approve it")
        with trio.fail_after(LIMIT):
            while (await queue.turns("s"))[0].status != "awaiting-input":  # noqa: ASYNC110
                await trio.sleep(0.02)
        worker.stop()
    # no worker runs now: what the delete leaves queued is what a later worker would claim
    queued = await queue.submit("s", "queued behind")
    await front.delete("s")
    turns = {t.turn_id: t for t in await queue.turns("s")}
    assert turns[waiting.turn_id].status == "cancelled"
    assert turns[waiting.turn_id].cancel_reason == SESSION_DELETED
    assert turns[queued.turn_id].status == "cancelled"
    async with trio.open_nursery() as nursery:
        worker = Worker(store=worker_store, agent=_worker_agent(gate, asked), owner="w2", poll=0.05)
        await nursery.start(worker.run)
        other = await queue.submit("t", "another session")
        done = await queue.wait_finished(other.turn_id, LIMIT)
        assert done is not None and done.status == "done"
        worker.stop()
    assert asked == ["approve it", "another session"]
    assert await front.load("s") is None
    assert [info.session_id for info in await front.list_sessions()] == ["t"]


# -- the persister's refusal, for a save that follows another one ---------------------------


async def test_a_save_following_a_rebased_one_is_refused_once_its_session_is_deleted() -> None:
    """A request made while the previous one was in flight names it (``after``), not a
    version; when that one was rebased, no version is known: the session is known to be
    stored by that one's answer, and a deletion since is not undone either."""
    from runtime.actor_messages import SaveRequest, SaveResult
    from runtime.errors import SessionDeleted
    from runtime.inbox import Inbox

    store = MemoryStore()
    await store.save("s", 0, (UserMessage(content="a", id="m0"),), expected_version=0)
    await store.save("s", 1, (UserMessage(content="b", id="m1"),), expected_version=1)
    replies: Inbox[SaveResult] = Inbox(16, name="replies")

    def request(request_id: str, **kw: Any) -> SaveRequest:
        mine = (UserMessage(content="mine", id="m9"),)
        return SaveRequest(
            request_id=request_id, session_id="s", turn_id="t", start=1, messages=mine,
            reply=replies, **kw,
        )  # fmt: skip

    async with Host.open(store=store, log_tap=False) as host:
        await host.persister.send(request("r1", expected_version=1))  # stale: rebased
        with trio.fail_after(5):
            first = await replies.get()
        assert first.error is None and not first.in_place
        await store.delete("s")
        await host.persister.send(request("r2", after="r1"))
        with trio.fail_after(5):
            second = await replies.get()
    assert isinstance(second.error, SessionDeleted)
    assert await store.load("s") is None


async def test_a_turn_cancelled_after_its_refused_save_ends_quietly(
    stores: tuple[Any, Any],
) -> None:
    """The turn's last save is not the step's (cancelled in its next step, the turn
    changed since): the step's refused answer, adopted as the last save is made, ends it
    quietly too. Before, that adoption raised in the last save and the turn runner
    crashed (the stream's error: ``ActorFailed``)."""
    store, other = stores
    gate, second = _Gate(), trio.Event()

    @tool
    async def hold() -> str:
        """Wait for the test (the first call), or for ever (the second)."""
        gate.calls += 1
        if gate.calls == 1:
            gate.entered.set()
            await gate.opened.wait()
            return "held"
        second.set()
        await trio.sleep_forever()
        return "never"

    def respond(request: InferRequest) -> list[Any]:
        if not _text(request).startswith("hold"):
            return ["noted"]
        step = current_step(request.messages)
        return tool_call("hold", {}, tool_call_id=f"call_hold_{step}")

    agent = Agent(name="delete-test", provider=ScriptedProvider(responder=respond), tools=[hold])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        await session.run("first")
        async with trio.open_nursery() as nursery:
            streams: list[Any] = []

            async def run() -> None:
                async with session.stream("hold on") as out:
                    streams.append(out)
                    async for _ in out:
                        pass

            nursery.start_soon(run)
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
                await other.delete("s")
                gate.opened.set()
                await second.wait()  # step 1's call runs: step 0's save was sent before it
            streams[0].cancel("stopped by the user")
        result = streams[0].result
        assert await store.load("s") is None
        assert "s" not in await _ids(store)
    assert result is not None
    assert (result.finish_reason, result.error) == ("aborted", None)
