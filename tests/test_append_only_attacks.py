"""Grown rows attacked (branch ``attackappend``, journal ``benchmarks/journal/workers.md``).

A running turn's step saves write its answer as a head and segments of its new parts
(:class:`~runtime.store.Store`'s grown rows); its last save was to write it whole. Two
turns ended with their answer still a head for good, the last save keeping it as the
same object: one ended by its budget, and one a steer closed an answer of. And a turn
that waits for a decision stored its waiting answer as a head (no final save follows
the one that suspends it). The rest of this file pins what held: another host writing
the session mid-turn, a summary stored mid-turn, a turn cancelled mid-step and the
next one, a session deleted mid-turn."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.sqlite import SQLiteStore
from actors.stores.validation import HEAD_PREFIX
from runtime import Agent, Budget, Host, tool
from runtime.compaction import StoredSummary
from runtime.messages import AssistantMessage, SystemMessage, UserMessage
from tests.test_approval import delete_file
from tests.test_busy import Script, agent_with, held, holding, looking, run_in
from tests.test_steer_attacks import steer_in


@tool
def step(i: int) -> str:
    """A step."""
    return f"r{i}"


def _calls(n: int, name: str = "step") -> list[Any]:
    return [tool_call(name, {"i": i}, tool_call_id=f"c{i}") for i in range(n)]


def _agent(steps: int, tools: list[Any], **kw: Any) -> Agent:
    return Agent(
        provider=ScriptedProvider([*_calls(steps, tools[0].name), ["done"]]),
        tools=tools,
        budget=Budget(max_steps=steps + 1),
        **kw,
    )


def _stored(path: Path) -> tuple[list[tuple[str, int]], int]:
    """The heads (session, index) a SQLite file holds, and its segments' count."""
    with sqlite3.connect(path) as conn:
        heads = conn.execute(
            "SELECT session_id, idx FROM messages WHERE substr(body, 1, ?) = ?",
            (len(HEAD_PREFIX), HEAD_PREFIX),
        ).fetchall()
        (segments,) = conn.execute("SELECT count(*) FROM message_segments").fetchone()
    return heads, segments


async def _pg_stored(store: Any) -> tuple[list[tuple[str, int]], int]:
    """:func:`_stored` of a PostgreSQL store."""

    def read(conn: Any) -> tuple[list[tuple[str, int]], int]:
        heads = conn.execute(
            "SELECT session_id, idx FROM axon_messages WHERE substring(body FROM 1 FOR %s) = %s",
            (len(HEAD_PREFIX), HEAD_PREFIX),
        ).fetchall()
        (segments,) = conn.execute("SELECT count(*) FROM axon_message_segments").fetchone()
        return [tuple(h) for h in heads], segments

    return await store.run("stored", read, transaction=False)


@pytest.fixture(params=["sqlite", "postgres"])
async def grown_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A store that takes grown rows, and a reader of its heads and segments."""
    if request.param == "sqlite":
        store = await SQLiteStore.open(tmp_path / "s.db")

        async def stored() -> tuple[list[tuple[str, int]], int]:
            return _stored(tmp_path / "s.db")

    else:
        from actors.stores import postgres

        url = request.getfixturevalue("pg_url")
        request.getfixturevalue("monkeypatch").setattr(postgres, "GROWN_FROM_BYTES", 0)
        store = await postgres.PostgresStore.open(url)

        async def stored() -> tuple[list[tuple[str, int]], int]:
            return await _pg_stored(store)

    try:
        yield store, stored
    finally:
        await store.aclose()


async def test_a_turn_its_budget_ends_stores_its_answer_whole(grown_store: Any) -> None:
    """The step that hits ``max_steps`` wrote the answer as a head and segments; the
    turn's final save found it the same object and kept it, a head for good (5 segments
    here). Written whole by that save now (``Persister._unheaded``)."""
    store, stored = grown_store
    agent = Agent(provider=ScriptedProvider(_calls(20)), tools=[step], budget=Budget(max_steps=6))
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("go")
        assert result.finish_reason == "budget"
        mine = session.messages
    record = await store.load("s")
    assert record is not None and record.messages == tuple(mine)
    assert len(record.messages[1].content) == 6
    assert await stored() == ([], 0)


async def test_an_answer_a_steer_closed_is_written_whole_by_its_turns_last_save(
    grown_store: Any,
) -> None:
    """A message steered in after step 3 closes the answer so far (a new one follows the
    steered message); every later save of the turn keeps that answer as it is, so it
    stayed the head and segments its step saves left. The turn's last save writes it
    whole (``Persister._unheaded``)."""
    store, stored = grown_store
    held["open"], held["release"] = trio.Event(), trio.Event()
    script = Script(looking("L1"), looking("L2"), holding("H"), looking("L3"), ["answer"])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent_with(script, "steer"), session_id="s")
        results: dict = {}
        steered: dict = {}
        async with trio.open_nursery() as nursery:
            await run_in(nursery, session, "first", results)
            await held["open"].wait()
            await steer_in(nursery, session, "also this", steered)
            held["release"].set()
        mine = session.messages
    record = await store.load("s")
    assert record is not None and record.messages == tuple(mine)
    answers = [m for m in record.messages if isinstance(m, AssistantMessage)]
    assert [len(a.content) for a in answers] == [3, 2]  # (closed at the steer; the next)
    # (PostgreSQL left the closed answer's 2 segments, held by no head: its store
    # dropped the unheld ones at the step after the steer, that head still holding its
    # own, and forgot the session had any, so the last save's whole write dropped none)
    assert await stored() == ([], 0)


async def test_a_turn_waiting_for_a_decision_stores_its_answer_whole_and_goes_on(
    tmp_path: Path,
) -> None:
    """Step 5's call waits for approval: the save that suspends the turn is its last
    until a decision, and wrote the answer as a head (a worker's claim of the
    continuation then read the session again). Written whole now
    (``SaveRequest.may_end``); the continuation's
    steps grow it again and its last save writes it whole."""
    path = tmp_path / "s.db"
    calls = [*_calls(5), tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]
    agent = Agent(
        provider=ScriptedProvider([*calls, *_calls(4), ["done"]]),
        tools=[step, delete_file],
        budget=Budget(max_steps=20),
    )
    store = await SQLiteStore.open(path)
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(agent, session_id="s")
            first = await session.run("go")
            assert first.pending
            assert _stored(path) == ([], 0)
            waiting = await store.load("s")
            assert waiting is not None and waiting.messages == tuple(session.messages)
            await session.decide(first.pending[0].approval_id, approved=True)
            async with session.resume() as out:
                await out.collect()
            mine = session.messages
        record = await store.load("s")
    finally:
        await store.aclose()
    assert record is not None and record.messages == tuple(mine)
    assert record.messages[1].text == "done"
    assert _stored(path) == ([], 0)


# -- what held ---------------------------------------------------------------------------


async def test_another_host_writing_the_session_mid_turn_is_rebased_onto(tmp_path: Path) -> None:
    """A second host on the same file (a CLI ``run`` while ``serve`` runs) adds a turn to
    the session while step 5's tool runs: the running turn's next save meets the
    conflict and rebases (its answer written whole), and its later steps grow again."""
    path = tmp_path / "s.db"

    @tool
    async def other_host(i: int) -> str:
        """A step; at step 5 another host adds a turn to the session."""
        if i == 5:
            async with Host.open(store=path, log_tap=False) as host2:
                other = await host2.open_session(
                    Agent(provider=ScriptedProvider([["other"]])), session_id="s"
                )
                await other.run("from elsewhere")
        return f"r{i}"

    store = await SQLiteStore.open(path)
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(_agent(10, [other_host]), session_id="s")
            await session.run("go")
            mine = session.messages
        record = await store.load("s")
    finally:
        await store.aclose()
    assert record is not None and record.messages == tuple(mine)
    assert [m.text for m in mine if isinstance(m, UserMessage)] == ["from elsewhere", "go"]
    assert _stored(path) == ([], 0)


async def test_a_summary_stored_mid_turn_moves_the_answer_and_it_is_written_whole(
    tmp_path: Path,
) -> None:
    """A history processor stores a summary at step 4 (put before the turn's user
    message: the answer moves one place on): the save after it writes the answer whole
    at its new place, never a head's segments onto another message's row."""
    path = tmp_path / "s.db"

    def summarize(messages: tuple[Any, ...], ctx: Any) -> Any:
        if ctx.step == 4:
            users = [m for m in messages if isinstance(m, UserMessage)]
            ctx.store(
                StoredSummary(
                    message=SystemMessage(content="sum", summarizes_before=users[-1].id),
                    tokens_before=10,
                    tokens_after=5,
                    covered=2,
                )
            )
        return messages

    @tool
    def look(i: int) -> str:
        """A step."""
        return f"r{i}"

    store = await SQLiteStore.open(path)
    seen: list[int] = []
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(
                _agent(10, [look], history_processors=(summarize,)),
                session_id="s",
                history=[UserMessage(content="old"), AssistantMessage()],
            )
            async with session.stream("go") as out:
                async for _ in out:
                    record = await store.load("s")
                    if record is not None:
                        seen.append(len(record.messages))
            mine = session.messages
        record = await store.load("s")
    finally:
        await store.aclose()
    assert record is not None and record.messages == tuple(mine)
    assert isinstance(record.messages[2], SystemMessage) and record.messages[4].text == "done"
    # (read while the turn ran, heads folded: the summary moved the answer at step 4)
    assert len(seen) > 10 and seen == sorted(seen) and 4 < seen[-1] <= len(mine)
    assert _stored(path) == ([], 0)


async def test_a_turn_cancelled_mid_step_then_the_next_turn(
    tmp_path: Path, autojump_clock: Any
) -> None:
    path = tmp_path / "s.db"

    @tool
    async def slow(i: int) -> str:
        """A step; step 5 hangs until cancelled."""
        if i == 5:
            await trio.sleep(1000)
        return f"r{i}"

    store = await SQLiteStore.open(path)
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(_agent(10, [slow]), session_id="s")
            with trio.move_on_after(10):
                await session.run("go")
            record = await store.load("s")
            assert record is not None and record.messages == tuple(session.messages)
            assert record.messages[1].interrupted and len(record.messages[1].content) == 6
            assert _stored(path) == ([], 0)
            assert (await session.run("again")).text == "done"
            mine = session.messages
        record = await store.load("s")
    finally:
        await store.aclose()
    assert record is not None and record.messages == tuple(mine)
    assert _stored(path) == ([], 0)


async def test_a_session_deleted_mid_turn_leaves_no_segments(tmp_path: Path) -> None:
    path = tmp_path / "s.db"

    @tool
    async def deleting(i: int) -> str:
        """A step; at step 5 another store deletes the session."""
        if i == 5:
            other = await SQLiteStore.open(path)
            try:
                await other.delete("s")
            finally:
                await other.aclose()
        return f"r{i}"

    store = await SQLiteStore.open(path)
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(_agent(10, [deleting]), session_id="s")
            result = await session.run("go")
            assert result.finish_reason == "aborted"  # (its saves refused from then on)
        assert await store.load("s") is None
    finally:
        await store.aclose()
    assert _stored(path) == ([], 0)
