"""Session settings a deployment puts in its PostgreSQL URL or on its role: libpq's
``options`` (``-c TimeZone=...``, ``-c search_path=...``), a non-UTC time zone, a
role's ``statement_timeout``.

Before: the store re-encoded the URL's query when it took its own ``schema`` out, and a
space (``options=-c%20TimeZone%3D...``, how a URL writes ``-c TimeZone=...``) became
``+``, which libpq does not decode: the server refused ``+TimeZone``, and the open was
retried for 10 s as an unreachable server before it failed. Now the other parameters go
to libpq as written.
"""

from __future__ import annotations

import time

import psycopg
import pytest
import trio

from actors.stores.postgres import PostgresStore, parse_url
from actors.stores.turns import TurnQueue
from runtime.errors import StoreError
from tests.support.pg import own_database, pg_connect

TZ = "options=-c%20TimeZone%3DPacific/Kiritimati"
"""UTC+14: a time zone far from the machine's."""


def test_the_urls_other_parameters_reach_libpq_as_written() -> None:
    url = f"postgresql://u@h/db?{TZ}&schema=s&application_name=a+b&pooler=transaction"
    assert parse_url(url) == (f"postgresql://u@h/db?{TZ}&application_name=a+b", "s")
    assert parse_url("postgresql://u@h/db?schema=s") == ("postgresql://u@h/db", "s")


async def test_a_session_time_zone_far_from_utc_moves_no_clock_or_deadline(pg_url: str) -> None:
    store = await PostgresStore.open(f"{pg_url}&{TZ}")
    queue = TurnQueue(store)
    try:
        zone = await store.run("zone", lambda c: c.execute("SHOW TimeZone").fetchone()[0])
        skew = await queue.now() - time.time()
        turn = await queue.submit("s", "hi")
        claim = await queue.claim("w")
        assert claim is not None
        deadline = time.time() + 600
        assert await queue.suspend(claim, expires_at=deadline)
        status = await queue.get_status(turn.turn_id)
        early = await queue.take_expired(deadline - 1)
        due = await queue.take_expired(deadline + 1)
    finally:
        await queue.aclose()
        await store.aclose()
    assert zone == "Pacific/Kiritimati"
    assert abs(skew) < 5  # the database's clock, not shifted by 14 hours
    assert status is not None and status.expires_at == pytest.approx(deadline, abs=0.01)
    assert early == []  # not due a second before its deadline
    assert [t.turn_id for t in due] == [turn.turn_id]  # due a second after


async def test_a_search_path_in_the_urls_options_does_not_move_the_tables() -> None:
    """``?schema=`` decides where the tables are (``public`` without it); libpq's
    ``-c search_path`` is overridden by the store's own (docs/deployment.md)."""
    with own_database("UTF8") as url:
        base = url.split("?")[0]
        store = await PostgresStore.open(f"{base}?options=-c%20search_path%3Dmine")
        await store.aclose()
        with psycopg.connect(base, autocommit=True) as conn:
            found = conn.execute(
                "SELECT relnamespace::regnamespace::text FROM pg_class "
                "WHERE relname = 'axon_sessions'"
            ).fetchall()
    assert found == [("public",)]


async def test_a_statement_timeout_the_role_sets_below_a_statement_is_one_line() -> None:
    with own_database("UTF8") as url:
        name = url.rsplit("/", 1)[1].split("?")[0]
        with pg_connect() as conn:
            conn.execute(f"ALTER DATABASE {name} SET statement_timeout = '1ms'")
        with pytest.raises(StoreError) as refused:
            await PostgresStore.open(url, connect_retry_for=1)
    assert "statement timeout" in str(refused.value) and "\n" not in str(refused.value)


async def test_an_unknown_setting_in_the_urls_options_fails_the_open_at_once(pg_url: str) -> None:
    """Not retried for ``connect_retry_for`` as an unreachable server (it was: 10 s)."""
    with pytest.raises(StoreError, match="unrecognized configuration parameter") as refused:
        await PostgresStore.open(f"{pg_url}&options=-c%20axon_no_such%3D1", connect_retry_for=60)
    assert "gave up after retrying" not in str(refused.value)


async def test_a_lease_renewal_after_the_roles_idle_session_timeout_closed_its_connection() -> None:
    """The lease thread's connection idles between turns; the server closes it then."""
    with own_database("UTF8") as url:
        name = url.rsplit("/", 1)[1].split("?")[0]
        with pg_connect() as conn:
            conn.execute(f"ALTER DATABASE {name} SET idle_session_timeout = '200ms'")
        store = await PostgresStore.open(url)
        queue = TurnQueue(store)
        renewer = queue.open_renewer()
        try:
            await queue.submit("s", "hi")
            claim = await queue.claim("w")
            assert claim is not None
            key = (claim.turn.turn_id, "w", claim.epoch)
            first = await trio.to_thread.run_sync(renewer.renew, *key)
            await trio.sleep(0.5)  # the server ends the idle session meanwhile
            second = await trio.to_thread.run_sync(renewer.renew, *key)
        finally:
            renewer.close()
            await queue.aclose()
            await store.aclose()
    assert (first.held, second.held) == (True, True)
