"""A person's decision saved by the transaction (the fallback of the decision's one call:
a stored meta the function cannot merge) whose COMMIT's answer was lost (round 4,
``atk4``).

The one call's retry already recognised its own write (round 3); the transaction's did
not: its retry found the turn no longer waiting and told the person the approval was
"already decided" although their own decision was the one stored. Now its guard, on a
retry, first looks at what the session's last write stored, as the one call's retry
does. A retry behind another person's different decision is still refused. Real
PostgreSQL (the run's own).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

from actors.stores import postgres as postgres_module
from actors.stores import turn_decisions
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.approval import Decision
from runtime.errors import AlreadyDecided
from tests.test_turn_queue import suspended


async def _waiting_with_a_nul_in_meta(queue: TurnQueue, store: PostgresStore) -> str:
    """A suspended turn whose session's stored meta holds an escaped NUL: the decision's
    function cannot merge it, so the decision goes as the transaction."""
    claim = await suspended(queue, store)
    await store.save("s1", 2, [], {"title": "a\x00b"})
    return claim.turn.turn_id


def _count_guards(monkeypatch: pytest.MonkeyPatch, before: Any = None) -> list[int]:
    """Count the transaction's guard runs (``_resume_if_decided``); ``before(n)`` runs
    first on the ``n``th."""
    real = turn_decisions._resume_if_decided
    ran: list[int] = []

    def guard(*args: Any) -> Any:
        ran.append(1)
        if before is not None:
            before(len(ran))
        return real(*args)

    monkeypatch.setattr(turn_decisions, "_resume_if_decided", guard)
    return ran


async def test_a_transactions_decision_whose_answer_is_lost_is_recorded_not_refused(
    pg_url, monkeypatch
):
    """The transaction committed (the call decided, the turn put back for its
    continuation), then the connection died before its answer: the retry found the turn
    running and refused the decision, ``AlreadyDecided``, though it was stored. Now it
    finds its own write and reports it recorded; the turn resumes once."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0)
    lost: list[int] = []
    ran = _count_guards(monkeypatch)

    class AnswerLost(dict):  # the store's bookkeeping right after a transaction's COMMIT
        def __setitem__(self, key: Any, value: Any) -> None:
            if ran and not lost:
                lost.append(1)
                raise psycopg.OperationalError("server closed the connection unexpectedly")
            super().__setitem__(key, value)

    try:
        turn_id = await _waiting_with_a_nul_in_meta(queue, store)
        monkeypatch.setattr(postgres_module, "_used", AnswerLost())
        decided = await queue.decide("s1", "ap1", Decision(approved=True), {})
        resumed = await queue.claim("w2")
        again = await queue.claim("w3")
    finally:
        await queue.aclose()
        await store.aclose()
    assert lost == [1] and ran == [1]  # the transaction's path; its retry found its write
    assert decided.recorded.complete and decided.recorded.version > 0
    assert (decided.turn.status, decided.turn.owner, decided.turn.resumes) == ("running", None, 1)
    assert resumed is not None and resumed.turn.turn_id == turn_id and resumed.resumed
    assert again is None


async def test_a_transactions_retry_behind_anothers_different_decision_is_refused(
    pg_url, monkeypatch
):
    """The first try failed before its COMMIT and another person denied the call
    meanwhile: what the session's last write stored is not this decision, so the retry
    is refused as any late decision is, and the denial stands."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0)
    other = await PostgresStore.open(pg_url)
    rival = TurnQueue(other, lease=30.0)

    def before(n: int) -> None:
        if n == 1:  # this decision's first try, in its transaction, in a store thread
            trio.from_thread.run(
                rival.decide, "s1", "ap1", Decision(approved=False, reason="no"), {}
            )
            raise psycopg.OperationalError("server closed the connection unexpectedly")

    try:
        await _waiting_with_a_nul_in_meta(queue, store)
        ran = _count_guards(monkeypatch, before)
        with pytest.raises(AlreadyDecided):
            await queue.decide("s1", "ap1", Decision(approved=True), {})
        record = await store.load("s1")
    finally:
        await rival.aclose()
        await other.aclose()
        await queue.aclose()
        await store.aclose()
    assert len(ran) >= 3  # this try, the rival's, this retry (refused)
    assert record is not None
    (call_part,) = record.messages[1].content
    assert call_part.awaiting.approved is False and call_part.awaiting.reason == "no"
