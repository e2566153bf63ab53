"""A claim whose answer was lost after its COMMIT (the connection died on the way back)
charges no attempt its turn did not use (round 4, ``atk4``).

The claim committed: its turn ``running`` under the worker, one attempt counted. The
retry claimed anew and nothing knew of that turn: its lease lapsed into a takeover that
counted a second attempt, and with ``max_attempts`` 1 the turn was failed as poison
("abandoned by 1 workers") without ever running. Now every claiming call writes a token
of its own into the row (``axon_turns.claim_token``) and a retry first gives back what
that token claimed, attempt included (``turn_claims.give_back``): the retry, or the next
claim, takes the turn as the lapsed claim left it. Each path that claims is attacked: the
claim's one call from the event loop (a queued turn's start, a decided turn's
continuation), the takeover's transaction in a thread, the claim riding on a last save.
Real PostgreSQL (the run's own), workers in this process.
"""

from __future__ import annotations

from typing import Any

import psycopg
import trio

from actors.stores import turn_claims
from actors.stores.postgres import PostgresStore
from actors.stores.postgres_lane import LoopLane
from actors.stores.turns import TurnQueue
from runtime.app.worker import Worker
from runtime.approval import Decision
from tests.support.calls import python_calls
from tests.support.pg import pg_connect
from tests.support.worker_agent import agent
from tests.test_next_claim_attacks import _lose_answer_once
from tests.test_turn_queue import suspended


def _rows(store: PostgresStore, query: str, params: tuple[Any, ...] = ()) -> list[Any]:
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {store.schema}")
        return list(conn.execute(query, params).fetchall())


def _turn(store: PostgresStore, turn_id: str) -> tuple[Any, ...]:
    (row,) = _rows(
        store,
        "SELECT status, owner, epoch, attempts, error FROM axon_turns WHERE turn_id = %s",
        (turn_id,),
    )
    return tuple(row)


async def test_a_claims_lost_answer_at_max_attempts_1_runs_the_turn_not_fails_it(
    pg_url, monkeypatch
):
    """The claim's call started the turn and committed; its answer was lost. The retry
    used to find nothing to claim (the turn was running, under this very worker), the
    turn's lease lapsed and the takeover failed it as poison at its first attempt. The
    retry now gives it back and takes it: one attempt, held."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=1)
    try:
        turn = await queue.submit("s", "hello")
        lost = _lose_answer_once(monkeypatch, b"axon_claim_call")
        claim = await queue.claim("w1")
        assert lost == [1]
        assert claim is not None and claim.turn.turn_id == turn.turn_id
        row = _turn(store, turn.turn_id)
        held = await queue.renew(claim)
        assert await queue.finish(claim, status="done", finish_reason="stop")
    finally:
        await queue.aclose()
        await store.aclose()
    assert (claim.turn.attempts, claim.epoch) == (1, 2)  # started (lost), taken back
    assert row == ("running", "w1", 2, 1, None)
    assert held.held


async def test_a_lost_claim_gives_back_only_its_own_turn_not_one_held_by_the_same_owner(
    pg_url, monkeypatch
):
    """Two claims of one worker (one owner): the first's answer came, the second's was
    lost. The retry gives back the turn its own token claimed, never the first one's,
    which its worker runs: that one keeps its epoch, its lease and its one attempt."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=1)
    try:
        first = await queue.submit("s1", "one")
        second = await queue.submit("s2", "two")
        held = await queue.claim("w")
        assert held is not None and held.turn.turn_id == first.turn_id
        lost = _lose_answer_once(monkeypatch, b"axon_claim_call")
        retried = await queue.claim("w")
        renewal = await queue.renew(held)
        rows = [_turn(store, t.turn_id) for t in (first, second)]
    finally:
        await queue.aclose()
        await store.aclose()
    assert lost == [1]
    assert retried is not None and retried.turn.turn_id == second.turn_id
    assert renewal.held
    assert rows == [("running", "w", 1, 1, None), ("running", "w", 2, 1, None)]


async def test_a_continuations_lost_claim_is_given_back_as_a_continuation(pg_url, monkeypatch):
    """A decided turn's continuation claimed by the call (``attempts = 1``, its
    ``resume_pending`` cleared) and its answer lost: the retry found nothing, the
    continuation's lease lapsed into a takeover, poison at ``max_attempts`` 1. It is given
    back as the decision left it and claimed again as a continuation, with its session."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=1)
    try:
        waiting = await suspended(queue, store)
        await queue.decide("s1", "ap1", Decision(approved=True), {})
        lost = _lose_answer_once(monkeypatch, b"axon_claim_call")
        claim = await queue.claim("w2", load=lambda _: True)
        row = _turn(store, waiting.turn.turn_id)
    finally:
        await queue.aclose()
        await store.aclose()
    assert lost == [1]
    assert claim is not None and claim.turn.turn_id == waiting.turn.turn_id
    assert claim.resumed and not claim.takeover
    assert claim.stored is not None and len(claim.stored.messages) == 2
    assert row == ("running", "w2", 3, 1, None)


async def test_a_takeovers_lost_commit_is_given_back_not_counted_twice(pg_url, monkeypatch):
    """The takeover's transaction (in a thread) committed, then its answer was lost: the
    retry found no expired lease (this worker held it), and the lease then lapsed into a
    second takeover, which at ``max_attempts`` 2 failed the turn: two attempts charged,
    one used. The retry gives the first back and takes the turn over: two attempts, the
    first worker's and this one's."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=2)
    real = turn_claims._claim_on
    lost: list[int] = []

    def claim_on(conn: Any, **kwargs: Any) -> Any:
        found = real(conn, **kwargs)
        if found is not None and not lost:
            lost.append(1)  # committed (autocommit, its transaction ended): answer lost
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return found

    try:
        turn = await queue.submit("s", "hello")
        first = await queue.claim("w0")
        assert first is not None
        _rows(
            store,
            "UPDATE axon_turns SET lease_until = now() - interval '1 minute' "
            "WHERE turn_id = %s RETURNING 1",
            (turn.turn_id,),
        )
        monkeypatch.setattr(turn_claims, "_claim_on", claim_on)
        claim = await queue.claim("w1")
        row = _turn(store, turn.turn_id)
    finally:
        await queue.aclose()
        await store.aclose()
    assert lost == [1]
    assert claim is not None and claim.takeover and claim.turn.turn_id == turn.turn_id
    assert row == ("running", "w1", 3, 2, None)


async def test_a_riding_claims_lost_answer_at_max_attempts_1_runs_the_next_turn(
    pg_url, monkeypatch
):
    """A last save that also claimed the slot's next turn committed both; its answer was
    lost. The save was recognised as stored (round 3), but the turn it claimed waited
    for its lease and was taken over as a second attempt: at ``max_attempts`` 1 it failed
    as poison, never run. It is given back and runs: both turns done, one attempt each."""
    store = await PostgresStore.open(pg_url)
    submitter = TurnQueue(store)
    first = await submitter.submit("s0", "hello")
    second = await submitter.submit("s1", "hello")
    lost = _lose_answer_once(monkeypatch, b"axon_save_next_call")
    worker = Worker(
        store=store, agent=agent, owner="w", poll=0.05, concurrency=1, lease=1.0, max_attempts=1
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            done = [await submitter.wait_finished(t.turn_id, 30) for t in (first, second)]
            worker.stop()
        rows = [_turn(store, t.turn_id) for t in (first, second)]
    finally:
        await submitter.aclose()
        await store.aclose()
    assert lost == [1]
    assert [d.status if d else None for d in done] == ["done", "done"]
    assert worker.done == {"done": 2}
    assert [(status, attempts, error) for status, _, _, attempts, error in rows] == [
        ("done", 1, None),
        ("done", 1, None),
    ]


async def test_a_claim_that_failed_before_the_server_gives_back_nothing(pg_url, monkeypatch):
    """The first send never reached the server (the connection was refused): the retry's
    give-back finds no row of its token, and the retry starts the turn as a first claim
    would (epoch 1, one attempt, not a takeover)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=1)
    real = LoopLane.call
    failed: list[int] = []

    async def call(self: Any, name: bytes, *args: Any) -> Any:
        if name == b"axon_claim_call" and not failed:
            failed.append(1)
            raise psycopg.OperationalError("connection refused")
        return await real(self, name, *args)

    try:
        turn = await queue.submit("s", "hello")
        monkeypatch.setattr(LoopLane, "call", call)
        claim = await queue.claim("w1")
        row = _turn(store, turn.turn_id)
    finally:
        await queue.aclose()
        await store.aclose()
    assert failed == [1]
    assert claim is not None and not claim.takeover and claim.epoch == 1
    assert row == ("running", "w1", 1, 1, None)


async def test_a_give_back_whose_own_answer_is_lost_gives_back_once(pg_url, monkeypatch):
    """The claim's answer lost, then the give-back's too (it committed): its retry finds
    the token cleared and gives nothing back a second time (no attempt refunded twice,
    no other claim touched); the turn is taken over once, one attempt."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=1)
    real = turn_claims.give_back
    given: list[int] = []

    def give_back(conn: Any, owner: str, token: str) -> int:
        n = real(conn, owner, token)
        given.append(n)
        if len(given) == 1:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return n

    try:
        turn = await queue.submit("s", "hello")
        monkeypatch.setattr(turn_claims, "give_back", give_back)
        lost = _lose_answer_once(monkeypatch, b"axon_claim_call")
        claim = await queue.claim("w1")
        row = _turn(store, turn.turn_id)
    finally:
        await queue.aclose()
        await store.aclose()
    assert lost == [1] and given == [1, 0]
    assert claim is not None and claim.takeover and claim.turn.turn_id == turn.turn_id
    assert row == ("running", "w1", 2, 1, None)


def test_a_claim_token_is_32_random_hex_digits_made_in_no_python_call() -> None:
    # Issue 24 goal 3: a token a claim, one a worker's turn; uuid4's object (its
    # __init__ and properties in Python) cost ~2-5 us of the turn for 32 hex digits.

    def two_hundred() -> list[str]:
        tokens: list[str] = []
        for _ in range(200):
            tokens.append(turn_claims.claim_token())
        return tokens

    tokens, calls = python_calls(two_hundred)
    assert calls == ["claim_token"] * 200
    assert len(set(tokens)) == 200
    assert all(len(t) == 32 and int(t, 16) >= 0 and t == t.lower() for t in tokens)
