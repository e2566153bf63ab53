"""PostgreSQL's own work in a worker's turn, counted by the server (issue 24 goal 3, ``pg3``).

A worker's one-step turn (its claim riding on the turn before's last save, a first save
of ``[user, assistant, tool]`` with the ``saved`` mark, a last save from message 0 that
ends it and claims the next) costs the server its statements' executor start-ups, their
plans, and for every non-HOT update of a row an entry in each of the table's indexes.
These pin, on a server of their own with ``pg_stat_statements`` loaded (``track=all``:
the statements inside the server-side functions too), what ``pg3`` cut: the statements a
turn runs, the plans it makes once warm, the index entries a key-less turn and a stored
session's save write. Counts, not timings: the same on a loaded machine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from actors.stores.postgres import PostgresStore
from actors.stores.postgres_calls import (
    CLAIM_FUNCTION_NAME,
    SAVE_FUNCTION_NAME,
    SAVE_NEXT_FUNCTION_NAME,
)
from actors.stores.turns import TurnQueue
from tests.support import services

STATS = (
    "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all "
    "-c pg_stat_statements.track_planning=on"
)


@pytest.fixture(scope="module")
def stats_server() -> Iterator[str]:
    """A PostgreSQL of this module's own with ``pg_stat_statements`` loaded: its URL."""
    try:
        server = services.PostgresServer(options=STATS)
    except services.ServiceUnavailable as err:
        pytest.skip(str(err))
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield server.url
    finally:
        server.close()


@pytest.fixture
async def schema_conn(stats_server: str) -> Any:
    """A schema created by :meth:`PostgresStore.open` on the stats server, and a
    connection in autocommit whose ``search_path`` is it (as the store's lane's is)."""
    schema = "counts_" + uuid.uuid4().hex[:8]
    store = await PostgresStore.open(f"{stats_server}?schema={schema}")
    await store.aclose()
    conn = psycopg.connect(stats_server, autocommit=True)
    conn.execute(f"SET search_path TO {schema}")
    try:
        yield conn
    finally:
        conn.close()


_BODY = b'{"role": "assistant", "content": "%s"}'


def _turns(conn: Any, first: int, count: int, claim: Any = None) -> Any:
    """Run ``count`` one-step turns of sessions ``first``.. as a worker's loop does (each
    claim after the first riding on the turn before's last save; ``claim``: the first's,
    made already); the claim the last one's last save made."""
    if claim is None:
        claim = conn.execute(
            f"SELECT o_turn_id, o_session_id, o_epoch FROM {CLAIM_FUNCTION_NAME}"
            "('w', 30, 'axon_turns')",
            prepare=True,
        ).fetchone()
    for n in range(count):
        turn, session, epoch = claim
        assert session == f"s{first + n}"
        roles = ["user", "assistant", "tool"]
        first_save = conn.execute(
            f"SELECT o_status, o_version FROM {SAVE_FUNCTION_NAME}(%s, 0, 0, '\\x7b7d', "
            "%s::int[], %s::text[], %s::bytea[], %s, 'w', %s, true, NULL, 'axon_turns', "
            "false, NULL)",
            (session, [0, 1, 2], roles, [_BODY % b"u", _BODY % b"a1", _BODY % b"t"], turn, epoch),
            prepare=True,
        ).fetchone()
        assert first_save[0] == "ok"
        bodies = [_BODY % b"u", _BODY % b"a2", _BODY % b"t"]  # the assistant's message grew
        last = conn.execute(
            f"SELECT o_status, n_turn_id, n_session_id, n_epoch FROM {SAVE_NEXT_FUNCTION_NAME}"
            "(%s, 0, %s, '\\x7b7d', %s::int[], %s::text[], %s::bytea[], %s, 'w', %s, "
            "'stop', 'axon_turns', 30)",
            (session, first_save[1], [0, 1, 2], roles, bodies, turn, epoch),
            prepare=True,
        ).fetchone()
        assert last[0] == "ok"
        claim = last[1:]
    return claim


def _queue(conn: Any, count: int) -> None:
    """``count`` key-less one-turn sessions ``s0``.., queued (their heads by the trigger)."""
    conn.execute(
        "INSERT INTO axon_turns (turn_id, session_id, input) "
        "SELECT 't' || i, 's' || i, 'hi' FROM generate_series(0, %s) AS i",
        (count - 1,),
    )


async def test_a_warm_one_step_turn_runs_20_statements_and_plans_none(schema_conn: Any) -> None:
    """Per turn, once warm: 2 calls from the client, 18 statements inside the functions
    and the head trigger (23 before ``pg3``: in the last save, the ``saved`` mark of a
    turn its first save marked, an ``UPDATE`` of no row; the hole check of a save from
    message 0, a query where ``p_start > 0`` alone says no; the save's own call, a
    ``SELECT ... FROM`` the function where an expression does), none of them planned
    again (the hole check was, at every call: its custom plan, folded to false, always
    looked cheaper than the generic one)."""
    conn = schema_conn
    _queue(conn, 13)
    claim = _turns(conn, 0, 6)  # every statement's plan cached (a plan is custom 5 times)
    conn.execute("SELECT public.pg_stat_statements_reset()")
    _turns(conn, 6, 6, claim)  # turns 6-11, their last saves claiming 7-12
    rows = conn.execute(
        "SELECT calls, plans, toplevel, query FROM public.pg_stat_statements "
        "WHERE query NOT LIKE '%%pg_stat_statements%%'"
    ).fetchall()
    every = sorted((r[0], r[3][:70]) for r in rows)
    assert sum(r[0] for r in rows) == 6 * 20, every
    assert sum(r[0] for r in rows if r[2]) == 6 * 2, every
    assert sum(r[1] for r in rows if not r[2]) == 0, [(r[1], r[3][:70]) for r in rows if r[1]]
    marks = [r[0] for r in rows if r[3].startswith("UPDATE axon_turns SET saved")]
    assert marks == [6]  # the first save's, not the last save's again


async def test_a_stored_sessions_save_is_hot_and_key_less_turns_index_no_key(
    schema_conn: Any,
) -> None:
    """A key-less turn writes no entry in the keys' index (a UNIQUE column indexed its
    NULL at the turn's insert and again at each non-HOT update: its claim and its end),
    and a stored session's save updates its row HOT (an index on ``update_seq``, which
    every save bumps, made it non-HOT: an entry in each of its two indexes a save)."""
    conn = schema_conn
    _queue(conn, 8)
    conn.execute("BEGIN")
    _turns(conn, 0, 8)
    sessions = conn.execute(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
        "WHERE relid = 'axon_sessions'::regclass"
    ).fetchone()
    conn.execute("COMMIT")
    assert sessions == (8, 8)  # one stored save a turn (its last), each HOT
    indexes = conn.execute(
        "SELECT indexrelid::regclass::text, pg_relation_size(indexrelid) FROM pg_index "
        "WHERE indrelid IN ('axon_sessions'::regclass, 'axon_turns'::regclass)"
    ).fetchall()
    sizes = dict(indexes)
    assert sorted(name for name in sizes if name.startswith("axon_sessions")) == [
        "axon_sessions_by_caller",  # a column a save never changes: still HOT
        "axon_sessions_by_code_point",  # the ids, which a save never changes: still HOT
        "axon_sessions_pkey",
    ]
    assert sizes["axon_turns_idempotency_key_key"] == 8192  # its meta page: no entry


async def test_a_store_of_before_with_the_unique_key_column_keeps_it_and_works(
    stats_server: str,
) -> None:
    """A store created before ``pg3`` (the keys' column UNIQUE, the sessions' index on
    ``update_seq``) opens untouched: its constraint and index stay, a key still names
    one submission, a turn still runs and saves."""
    schema = "before_" + uuid.uuid4().hex[:8]
    url = f"{stats_server}?schema={schema}"
    store = await PostgresStore.open(url)
    await store.aclose()
    with psycopg.connect(stats_server, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("DROP INDEX axon_turns_idempotency_key_key")
        conn.execute(
            "ALTER TABLE axon_turns ADD CONSTRAINT axon_turns_idempotency_key_key "
            "UNIQUE (idempotency_key)"
        )
        conn.execute("CREATE INDEX axon_sessions_by_update ON axon_sessions (update_seq)")
    store = await PostgresStore.open(url)
    queue = TurnQueue(store)
    try:
        first = await queue.submit("s0", "hi", idempotency_key="k")
        assert (await queue.submit("s0", "hi", idempotency_key="k")).turn_id == first.turn_id
        with psycopg.connect(stats_server, autocommit=True) as conn:
            conn.execute(f"SET search_path TO {schema}")
            kept = conn.execute(
                "SELECT conname FROM pg_constraint WHERE conrelid = 'axon_turns'::regclass "
                "AND contype = 'u'"
            ).fetchall()
            assert kept == [("axon_turns_idempotency_key_key",)]
            assert conn.execute(
                "SELECT to_regclass('axon_sessions_by_update') IS NOT NULL"
            ).fetchone() == (True,)
            _turns(conn, 0, 1)
            assert conn.execute(
                "SELECT status, saved FROM axon_turns WHERE session_id = 's0'"
            ).fetchall() == [("done", True)]
    finally:
        await queue.aclose()
        await store.aclose()
