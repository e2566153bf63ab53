"""Stores over time and under concurrency: a user upgrading, processes starting at once.

What is attacked: a store written by an older version of Axon opened by today's (its
rows read back, replayed and continued), a store of a newer version refused untouched,
several real processes opening one fresh store at the same instant, an upgrade opened
while workers of the older version write turns, an upgrade killed halfway, and two
deployments sharing one PostgreSQL database in two schemas.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import trio

from actors.stores.postgres import PostgresStore, parse_url
from actors.stores.turns import TurnQueue
from runtime.messages import UserMessage
from tests.support.pg import pg_connect

ROOT = Path(__file__).resolve().parents[1]


def _sql(schema: str, query: str, params: tuple = ()) -> list[tuple]:
    """``query`` in ``schema`` on a connection of its own (autocommit)."""
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {schema}")
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _make_pre_incarnation(schema: str) -> None:
    """Make the store in ``schema`` one of before incarnations (as 749b9ed left it: no
    ``incarnation`` column, no trigger writing it)."""
    _sql(schema, "DROP TRIGGER axon_sessions_incarnation_v1 ON axon_sessions")
    _sql(schema, "ALTER TABLE axon_sessions DROP COLUMN incarnation")


def _incarnation_parts(schema: str) -> tuple[int, int]:
    """How many ``incarnation`` columns and incarnation triggers ``schema`` has."""
    ((columns,),) = _sql(
        schema,
        "SELECT count(*) FROM information_schema.columns WHERE table_schema = %s "
        "AND table_name = 'axon_sessions' AND column_name = 'incarnation'",
        (schema,),
    )
    ((triggers,),) = _sql(
        schema,
        "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'axon_sessions'::regclass "
        "AND tgname = 'axon_sessions_incarnation_v1'",
    )
    return columns, triggers


# -- PostgreSQL: an upgrade opened while a worker writes --------------------------------


async def test_an_upgrade_opened_during_a_fenced_save_waits_for_it_not_deadlocks(pg_url):
    """A worker's fenced save locks its turn's row (``FOR SHARE``), writes the session,
    then updates the turn's row. An opening that upgrades the store used to take the
    turns table (``CREATE INDEX IF NOT EXISTS`` locks it even when the index is there),
    then wait to alter the sessions table the save held: the save's update of the turn
    then waited for the opening, PostgreSQL found the deadlock after a second and failed
    the opening (``deadlock detected``: a new worker that did not start). Now the opening
    takes both tables at once, gives way, and completes after the save."""
    _, schema = parse_url(pg_url)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("s", 0, [UserMessage(content="a")])
        await queue.submit("s", "b")
        claim = await queue.claim("w")
        assert claim is not None
    finally:
        await queue.aclose()
        await store.aclose()
    _make_pre_incarnation(schema)
    writer = psycopg.connect(parse_url(pg_url)[0])  # the save's transaction, step by step
    opened: list[PostgresStore] = []
    try:
        writer.execute(f"SET search_path TO {schema}")
        turn = claim.turn.turn_id
        writer.execute("SELECT 1 FROM axon_turns WHERE turn_id = %s FOR SHARE", (turn,))
        writer.execute("UPDATE axon_sessions SET version = version + 1 WHERE session_id = 's'")
        async with trio.open_nursery() as nursery:

            async def open_store() -> None:
                opened.append(await PostgresStore.open(pg_url))

            nursery.start_soon(open_store)
            with trio.fail_after(20):
                while not _sql(schema, "SELECT 1 FROM pg_locks WHERE NOT granted"):  # noqa: ASYNC110 - the server's state
                    await trio.sleep(0.01)  # the opening waits for a table the save holds

            def finish_save() -> None:
                writer.execute("UPDATE axon_turns SET saved = true WHERE turn_id = %s", (turn,))
                writer.commit()

            await trio.to_thread.run_sync(finish_save)
    finally:
        writer.close()
        for store in opened:
            await store.aclose()
    assert len(opened) == 1
    assert _incarnation_parts(schema) == (1, 1)
    assert _sql(schema, "SELECT saved FROM axon_turns WHERE turn_id = %s", (turn,)) == [(True,)]
