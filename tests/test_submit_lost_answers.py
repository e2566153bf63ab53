"""A submit whose answer was lost after its call committed, sent again.

A front end's submit is one call of the submit's server-side function
(:data:`actors.stores.postgres_calls.SUBMIT_FUNCTION`), retried whole after a connection
failure (:func:`actors.stores.postgres_health._retrying`). A keyed one replays its turn
(the message's key, looked at first). An unkeyed one (no client message id: an OpenAI
client's, a chat POST without ids) under ``reject``, ``interrupt`` or ``steer`` met its
own row on its retry: refused as busy while its turn runs, cancelled by itself (the
message lost), or counted twice as a steer. Its retry looks for its twin first. Real
PostgreSQL (the run's own); the answer is lost as the store reads it.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from actors.stores.postgres import PostgresStore
from actors.stores.postgres_lane import LoopLane
from actors.stores.turns import TurnQueue


def _lose_the_first_answer(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first submit call's answer lost after its commit (as the connection dropped
    right after the server sent it)."""
    real = LoopLane.call
    lost: list[int] = []

    async def answer_lost(self: Any, name: bytes, *args: Any) -> Any:
        result = await real(self, name, *args)
        if not lost and name == b"axon_submit_call":
            lost.append(1)
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return result

    monkeypatch.setattr(LoopLane, "call", answer_lost)
    return lost


async def _rows(store: PostgresStore) -> list[tuple[Any, ...]]:
    return await store.run(
        "rows",
        lambda conn: conn.execute(
            "SELECT input, status, steers, cancel_reason FROM axon_turns ORDER BY seq"
        ).fetchall(),
        transaction=False,
    )


@pytest.mark.parametrize("on_busy", ["interrupt", "steer"])
async def test_an_unkeyed_submit_retried_after_its_answer_was_lost_leaves_its_turn_untouched(
    pg_url, monkeypatch, on_busy
):
    """Beside a running turn: the retry returns the one queued turn its first try stored,
    queued (an interrupt's retry cancelled it, ``interrupted by a new message``), and the
    running turn counts one steer (two)."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await queue.submit("s", "one")
        assert await queue.claim("w") is not None
        lost = _lose_the_first_answer(monkeypatch)
        turn = await queue.submit("s", "two", on_busy=on_busy)
        rows = await _rows(store)
    finally:
        await queue.aclose()
        await store.aclose()
    steered = 1 if on_busy == "steer" else 0
    reason = "interrupted by a new message" if on_busy == "interrupt" else None
    assert lost == [1]
    assert turn.status == "queued" and turn.input == "two"
    assert rows == [('"one"', "running", steered, reason), ('"two"', "queued", 0, None)]


async def test_an_unkeyed_reject_submit_retried_after_its_answer_was_lost_returns_its_turn(
    pg_url, monkeypatch
):
    """To an idle session: the retry returns the turn its first try queued, where it
    raised ``SessionBusy`` (its own turn the one found open) while that turn ran."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        lost = _lose_the_first_answer(monkeypatch)
        turn = await queue.submit("s", "one", on_busy="reject")
        rows = await _rows(store)
    finally:
        await queue.aclose()
        await store.aclose()
    assert lost == [1]
    assert turn.status == "queued" and turn.input == "one"
    assert rows == [('"one"', "queued", 0, None)]


async def test_a_submit_postgresql_ends_as_a_deadlock_is_sent_again_and_queues_once(pg_url):
    """Interrupts racing in one session are at times one another's deadlock (four
    processes' 20 each at once: 16 of 960 ``deadlock detected``, a front end's 500): the
    call rolled back whole, so it is sent again. Here the test's trigger ends the first
    insert so (``40P01``): one turn queued, the running one asked to stop once."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await queue.submit("s", "one")
        assert await queue.claim("w") is not None

        def deadlock_once(conn: Any) -> None:
            conn.execute("CREATE SEQUENCE dl_tries")
            conn.execute(
                """CREATE FUNCTION dl_once() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF nextval('dl_tries') = 1 THEN
                        RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01';
                    END IF;
                    RETURN NEW;
                END $$"""
            )
            conn.execute(
                "CREATE TRIGGER dl_once BEFORE INSERT ON axon_turns "
                "FOR EACH ROW EXECUTE FUNCTION dl_once()"
            )

        await store.run("trigger", deadlock_once)
        turn = await queue.submit("s", "two", on_busy="interrupt")
        rows = await _rows(store)
        tries = await store.run(
            "tries",
            lambda conn: conn.execute("SELECT last_value FROM dl_tries").fetchone(),
            transaction=False,
        )
    finally:
        await queue.aclose()
        await store.aclose()
    assert turn.status == "queued" and turn.input == "two"
    assert tries == (2,)
    assert rows == [
        ('"one"', "running", 0, "interrupted by a new message"),
        ('"two"', "queued", 0, None),
    ]
