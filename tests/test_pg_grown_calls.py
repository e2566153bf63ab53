"""A running turn's grown saves and a continuation's claim on PostgreSQL, counted in
statements (branch ``appendpg``, journal ``benchmarks/journal/workers.md``).

A step save of a long answer writes its head and a segment of its new parts
(``actors.stores.postgres``, "Grown messages"): ``axon_save_v6`` took no segment, so
such a save was a transaction of five round trips (``BEGIN``, the lock, the write, the
segments, ``COMMIT``) and the turn's last save a call and a ``DELETE`` of the segments
after it. ``axon_save_v7`` takes them: every save is one call. ``axon_claim_v4`` read a
continuation's session with its heads unfolded (their decode failed, and the turn read
its session again); ``axon_claim_v5`` folds them.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.stores import postgres
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.app.worker import Worker
from runtime.approval import WAITING_META, Decision
from runtime.messages import AssistantMessage, ToolCallPart, UserMessage
from tests import test_pg_turn_statements as _counted
from tests.test_append_only_saves import _agent, lookup

statements = _counted.statements  # the fixture: statements by their first word


def _calls(n: int) -> tuple[ToolCallPart, ...]:
    return tuple(
        ToolCallPart(tool_call_id=f"c{i}", tool_name="t", input={"i": i}, step=i) for i in range(n)
    )


async def _segments(store: PostgresStore, session_id: str) -> int:
    return await store.run(
        "count",
        lambda conn: conn.execute(
            "SELECT count(*) FROM axon_message_segments WHERE session_id = %s", (session_id,)
        ).fetchone()[0],
        transaction=False,
    )


async def test_a_grown_save_is_one_call_and_so_is_the_last_save_that_drops_its_segments(
    pg_url: str, statements: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)  # heads from the second save
    store = await PostgresStore.open(pg_url)
    user = UserMessage(content="go", id="u")
    try:
        version = await store.save("s", 0, [user, AssistantMessage(content=_calls(1), id="a")])
        for n in (2, 3, 4):
            answer = AssistantMessage(content=_calls(n), id="a")
            statements.clear()
            version = await store.save("s", 1, [answer], expected_version=version, grown=(0,))
            assert statements == {"SELECT": 1}, statements  # the save function, no BEGIN
            assert await store.load("s") == await store.load("s")  # (a read of its own)
            loaded = await store.load("s")
            assert loaded is not None and loaded.messages == (user, answer)
            assert loaded.version == version
            assert await _segments(store, "s") == n - 1  # parts 0-1, then one a save
        done = AssistantMessage(content=(*_calls(4), *_calls(1)), id="a")
        statements.clear()
        version = await store.save("s", 1, [done], expected_version=version)  # the last
        assert statements == {"SELECT": 1}, statements  # the drop in its commit
        assert await _segments(store, "s") == 0
        loaded = await store.load("s")
        assert loaded is not None and loaded.messages == (user, done)
    finally:
        await store.aclose()


async def test_a_grown_save_through_the_call_is_refused_as_a_whole_one_and_writes_nothing(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale version: the function says ``conflict`` before it writes a row or a
    segment (its segments are written after the messages, in the same commit)."""
    from runtime.errors import StoreConflict

    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    store = await PostgresStore.open(pg_url)
    try:
        first = [UserMessage(content="go", id="u"), AssistantMessage(content=_calls(1), id="a")]
        version = await store.save("s", 0, first)
        grown = AssistantMessage(content=_calls(2), id="a")
        version = await store.save("s", 1, [grown], expected_version=version, grown=(0,))
        with pytest.raises(StoreConflict):
            await store.save(
                "s",
                1,
                [AssistantMessage(content=_calls(3), id="a")],
                expected_version=version - 1,
                grown=(0,),
            )
        loaded = await store.load("s")
        assert loaded is not None and loaded.messages == (first[0], grown)
        assert await _segments(store, "s") == 1
    finally:
        await store.aclose()


async def test_a_workers_long_turn_saves_each_step_in_one_call(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's turn of 12 steps, its answer a head from its second save on: every
    save is the function's one call, none a transaction, and no segment is dropped in a
    statement of its own (with ``axon_save_v6``: a transaction a step save, and a
    ``DELETE`` after the last)."""
    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    calls: list[int] = []
    other: list[str] = []
    call, in_transaction = PostgresStore._save_call, PostgresStore._save_in

    async def counted_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(len(kwargs.get("segments") or ()))
        return await call(self, *args, **kwargs)

    def counted_in(self: Any, *args: Any) -> Any:
        other.append("transaction")
        return in_transaction(self, *args)

    monkeypatch.setattr(PostgresStore, "_save_call", counted_call)
    monkeypatch.setattr(PostgresStore, "_save_in", counted_in)
    try:
        turn = await submitter.submit("s", "go")
        worker = Worker(store=store, agent=_agent(12, [lookup]), owner="w", poll=0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            done = await submitter.wait_finished(turn.turn_id, 30)
            worker.stop()
        assert done is not None and done.status == "done"
        assert other == []
        assert len(calls) == 13 and sum(calls) >= 10, calls  # the steps' segments in them
        loaded = await store.load("s")
        assert loaded is not None
        answer = loaded.messages[1]
        assert isinstance(answer, AssistantMessage)
        assert [p.tool_call_id for p in answer.content if isinstance(p, ToolCallPart)] == [
            f"c{i}" for i in range(12)
        ]
        assert await _segments(store, "s") == 0  # the last save's drop, in its call
    finally:
        await submitter.aclose()
        await store.aclose()


async def test_a_continuations_claim_folds_the_head_its_session_holds(
    pg_url: str, statements: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session whose earlier turn was killed mid-answer (its answer a head and
    segments), then a turn that waits for a person, decided: the claim's function
    returns the continuation's session folded, so the claim's record is the session
    (``axon_claim_v4``'s rows held the head, their decode failed: ``stored`` None, and
    the continuation read its session again)."""
    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        killed = AssistantMessage(content=_calls(3), id="a")
        version = await store.save(
            "s", 0, [UserMessage(content="go", id="u"), AssistantMessage(content=_calls(1), id="a")]
        )
        version = await store.save("s", 1, [killed], expected_version=version, grown=(0,))
        assert await _segments(store, "s") == 1  # (a head: no last save came)
        turn = await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None and claim.turn.turn_id == turn.turn_id
        with queue.fenced(claim, on_suspended=lambda: None):
            waiting = _counted._waiting_step(turn.turn_id, claim.turn.message_id)
            await store.save("s", 2, waiting, {WAITING_META: 1}, expected_version=version)
        await queue.decide("s", "ap1", Decision(approved=True), {})
        decided = await store.load("s")
        assert decided is not None and decided.messages[1] == killed
        statements.clear()
        resumed = await queue.claim("w2")
        assert statements == {"SELECT": 1}, statements
        assert resumed is not None and resumed.resumed
        assert resumed.stored == decided  # folded: the worker reads it no more
    finally:
        await queue.aclose()
        await store.aclose()


async def test_the_step_that_waits_saves_a_grown_answer_and_claims_next_in_one_call(
    pg_url: str, statements: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The save of the step that makes a long turn wait for a person writes its answer's
    head and new parts, suspends the turn and claims the next turn for the slot it frees,
    in one call (``axon_save_next_v8`` takes the segments)."""
    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    nxt = _counted._Next()
    try:
        turn = await queue.submit("s", "one")
        other = await queue.submit("t", "two")
        claim = await queue.claim("w1")
        assert claim is not None and claim.turn.turn_id == turn.turn_id
        user, waits = _counted._waiting_step(turn.turn_id, claim.turn.message_id)
        assert isinstance(waits, AssistantMessage)
        answer = AssistantMessage(id=waits.id, content=(*_calls(2), *waits.content))
        with queue.fenced(claim, on_suspended=lambda: None, claim_next=nxt.hook()):
            first = AssistantMessage(id=waits.id, content=_calls(2)[:1])
            version = await store.save("s", 0, [user, first], expected_version=0)
            statements.clear()
            await store.save(
                "s", 1, [answer], {WAITING_META: 1}, expected_version=version, grown=(0,)
            )
        assert statements == {"SELECT": 1}, statements
        assert [key[0] for key in nxt.held] == [other.turn_id]  # claimed in the call
        row = await _counted._suspended_row(store, turn.turn_id)
        assert row[0] == "awaiting-input", row
        loaded = await store.load("s")
        assert loaded is not None and loaded.messages == (user, answer)
        assert await _segments(store, "s") == 1  # the answer's head and its parts
    finally:
        await queue.aclose()
        await store.aclose()


async def test_a_takeover_of_a_long_turn_reads_its_answer_folded_in_the_claim(
    pg_url: str, statements: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker dies mid-answer (its answer a head and segments, its lease run out):
    the takeover's claim reads the session folded after its commit (``load_rows``), so
    the claim's record is the session and the new worker loads nothing more."""
    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        turn = await queue.submit("s", "one")
        claim = await queue.claim("w1")
        assert claim is not None and claim.turn.turn_id == turn.turn_id
        user = UserMessage(content="one", id="u")
        with queue.fenced(claim):
            version = await store.save(
                "s", 0, [user, AssistantMessage(content=_calls(1), id="a")], expected_version=0
            )
            for n in (2, 3):
                version = await store.save(
                    "s",
                    1,
                    [AssistantMessage(content=_calls(n), id="a")],
                    expected_version=version,
                    grown=(0,),
                )
        await _counted._expire(store, turn.turn_id)
        loaded = await store.load("s")
        statements.clear()
        taken = await queue.claim("w2", load=lambda session_id: True)
        # the function's call (a lease expired: it says so), again in the thread, the
        # look and the takeover in a transaction, then the session's one folded read
        assert statements == {"SELECT": 4, "TRANSACTION": 1, "UPDATE": 1}, statements
        assert taken is not None and taken.takeover
        assert loaded is not None and taken.stored == loaded  # folded: no load after
        assert loaded.messages[1] == AssistantMessage(content=_calls(3), id="a")
    finally:
        await queue.aclose()
        await store.aclose()
