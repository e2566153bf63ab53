"""The submit's server-side function (:data:`actors.stores.postgres_calls.SUBMIT_FUNCTION`)
missing while processes run, and its ``search_path``. Real PostgreSQL (the run's own).

Dropped (an operator's cleanup, a restore of the tables without the functions), every
submit failed ``function axon_submit_v1(...) does not exist`` until the process was
started again, whose open creates it: now the first submit that meets it missing creates
it again (the open's step, under the open's lock) and is sent again, once.

Its ``search_path`` is pinned at creation (``SET search_path FROM CURRENT``), but a path
without ``pg_temp`` in it searches the session's temporary tables first: a temporary
``axon_turns`` on the connection (one a transaction pooler hands from another client)
took the submit's rows. The path the functions are created with names ``pg_temp`` last.
"""

from __future__ import annotations

from actors.stores.postgres import PostgresStore
from actors.stores.postgres_calls import SUBMIT_FUNCTION_NAME
from actors.stores.turns import TurnQueue
from runtime.busy import INTERRUPTED_BY_NEW
from tests.support.pg import pg_connect

_CALL = (
    f"SELECT o_turn_id, o_status FROM {SUBMIT_FUNCTION_NAME}("
    "'s', 't1', NULL, 'h', NULL, '\"hi\"', '\\x7b7d'::bytea, '\\x7b7d'::bytea, false, NULL,"
    " NULL, NULL, 5.0, NULL, NULL, false, 'axon_turns', 'axon_cancel', %s)"
)


def _schema(pg_url: str) -> str:
    return pg_url.rsplit("schema=", 1)[1]


async def test_a_submit_after_the_function_was_dropped_creates_it_again_and_queues(pg_url):
    """The function dropped under an open store (its lane's connections prepared the
    call already): the next submit is queued, and so are the ones after it."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        first = await queue.submit("s", "one", idempotency_key="k1")
        with pg_connect() as conn:
            conn.execute(f"DROP FUNCTION {_schema(pg_url)}.{SUBMIT_FUNCTION_NAME}")
        second = await queue.submit("s", "two", idempotency_key="k2")
        third = await queue.submit("s", "three", idempotency_key="k3")
        again = await queue.submit("s", "two", idempotency_key="k2")
        turns = await queue.turns("s")
    finally:
        await queue.aclose()
        await store.aclose()
    assert [t.turn_id for t in turns] == [first.turn_id, second.turn_id, third.turn_id]
    assert again.turn_id == second.turn_id
    with pg_connect() as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_proc WHERE proname = %s AND pronamespace = %s::regnamespace",
            (SUBMIT_FUNCTION_NAME, _schema(pg_url)),
        ).fetchone()
    assert count == 1


async def test_the_submit_function_never_writes_to_a_temporary_table_of_the_callers(pg_url):
    """A temporary ``axon_turns`` on the calling connection (its search_path the store's
    schema, as the store's own connections set it): the submit's row goes to the store's
    table, the temporary one stays empty."""
    store = await PostgresStore.open(pg_url)
    await store.aclose()
    schema = _schema(pg_url)
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute(f"CREATE TEMP TABLE axon_turns (LIKE {schema}.axon_turns INCLUDING ALL)")
        row = conn.execute(_CALL, (INTERRUPTED_BY_NEW,)).fetchone()
        (in_temp,) = conn.execute("SELECT count(*) FROM pg_temp.axon_turns").fetchone()
        (in_store,) = conn.execute(f"SELECT count(*) FROM {schema}.axon_turns").fetchone()
    assert row is not None and row[0] == "t1"
    assert (in_temp, in_store) == (0, 1)


async def test_a_store_of_before_gets_its_functions_path_pinned_with_pg_temp_last(pg_url):
    """A schema whose functions were created with the path of before (the schema alone):
    opened by this version, each function of it that pins a path pins ``pg_temp`` last."""
    store = await PostgresStore.open(pg_url)
    await store.aclose()
    schema = _schema(pg_url)
    pinned = """SELECT proname, proconfig FROM pg_proc
        WHERE pronamespace = %s::regnamespace
            AND EXISTS (SELECT 1 FROM unnest(proconfig) AS c WHERE c LIKE 'search_path=%%')
        ORDER BY proname"""
    with pg_connect() as conn:
        names = [name for name, _ in conn.execute(pinned, (schema,)).fetchall()]
        for name in names:
            conn.execute(f"ALTER FUNCTION {schema}.{name} SET search_path = {schema}")
    store = await PostgresStore.open(pg_url)
    await store.aclose()
    with pg_connect() as conn:
        after = conn.execute(pinned, (schema,)).fetchall()
    assert SUBMIT_FUNCTION_NAME in names and len(names) >= 6
    assert [name for name, _ in after] == names
    assert all(f"search_path={schema}, pg_temp" in config for _, config in after), after
