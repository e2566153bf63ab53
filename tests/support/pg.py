"""PostgreSQL for the tests: a server of the test run's own, one fresh schema per test.

Tests that need PostgreSQL use the ``pg_url`` fixture: a ``postgresql://...?schema=NAME``
URL whose schema is created for the test (by the store, on open) and dropped after it, so
tests never see each other's rows. The server is one the run starts itself
(:mod:`tests.support.services`: own data directory, free port, removed at the end), or
the one ``AXON_TEST_PG`` names when the user sets it. Tests that restart the server run
only on the run's own (:func:`restart_postgres` skips otherwise): the suite never restarts,
or writes outside its own schemas in, a server it did not start. Where no server can be
had, these tests skip saying what to install (docs/testing.md).
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.support.services import ServiceUnavailable, own_postgres

EXTERNAL_PG = os.environ.get("AXON_TEST_PG") or None


@functools.cache
def _target() -> str | Exception:
    try:
        import psycopg
    except ImportError as err:
        return RuntimeError(
            f"psycopg is not installed (pip install 'axon-runtime[postgres]'): {err}"
        )
    if EXTERNAL_PG is not None:
        url = EXTERNAL_PG
    else:
        try:
            url = own_postgres().url
        except ServiceUnavailable as err:
            return err
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as err:
        return RuntimeError(f"PostgreSQL at {url} is not reachable: {err}")
    return url


def pg_unavailable() -> str | None:
    """Why PostgreSQL cannot be used here, or ``None`` when it can."""
    got = _target()
    return str(got) if isinstance(got, Exception) else None


def pg_base_url() -> str:
    """The test server's URL (no schema); skips the test when there is none."""
    got = _target()
    if isinstance(got, Exception):
        pytest.skip(str(got))
    return got


def restart_postgres() -> None:
    """Restart the run's own server (every connection cut); skips the test when the
    server is the user's (``AXON_TEST_PG``), which the suite never restarts."""
    if EXTERNAL_PG is not None:
        pytest.skip("AXON_TEST_PG points at a server this run did not start: not restarting it")
    own_postgres().restart()


def drop_schema(schema: str) -> None:
    with pg_connect() as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def psycopg_errors() -> Any:
    import psycopg

    return psycopg.errors


def pg_connect():
    import psycopg

    return psycopg.connect(pg_base_url(), connect_timeout=10, autocommit=True)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL to a fresh schema in the test database, dropped after the test."""
    base = pg_base_url()
    schema = f"axon_t_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{base}?schema={schema}"
    finally:
        drop_schema(schema)


@pytest.fixture
async def store_and_queue(pg_url: str) -> AsyncIterator[tuple[Any, Any]]:
    """A store on the test's schema and a turn queue on it (lease 30 s, 3 attempts),
    closed after the test: ``(PostgresStore, TurnQueue)``."""
    from actors.stores.postgres import PostgresStore
    from actors.stores.turns import TurnQueue

    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    try:
        yield store, queue
    finally:
        await queue.aclose()
        await store.aclose()


@contextlib.contextmanager
def own_database(encoding: str, locale: str = "LC_COLLATE 'C' LC_CTYPE 'C'") -> Iterator[str]:
    """A database in ``encoding`` (locale C, or the ``CREATE DATABASE`` locale clause
    ``locale``) on the run's own server, dropped after: the URL of a schema in it. Skips
    when the server is the user's (``AXON_TEST_PG``): the suite creates no database on a
    server it did not start, and when the server cannot make the locale."""
    if EXTERNAL_PG is not None:
        pytest.skip("AXON_TEST_PG points at a server this run did not start: no database made")
    base = pg_base_url()
    name = f"axon_d_{uuid.uuid4().hex[:12]}"
    with pg_connect() as conn:
        try:
            conn.execute(
                f"CREATE DATABASE {name} ENCODING '{encoding}' {locale} TEMPLATE template0"
            )
        except psycopg_errors().FeatureNotSupported as err:  # (a server built without ICU)
            pytest.skip(f"the test server cannot make a database with {locale}: {err}")
    try:
        yield f"{base.rsplit('/', 1)[0]}/{name}?schema=axon_t"
    finally:
        with pg_connect() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextlib.contextmanager
def postgres_stopped() -> Iterator[None]:
    """Inside, the run's own server is stopped (``pg_ctl stop -m fast``: every
    connection cut, none accepted); started again after. Skips the test when the server
    is the user's (``AXON_TEST_PG``)."""
    if EXTERNAL_PG is not None:
        pytest.skip("AXON_TEST_PG points at a server this run did not start: not stopping it")
    own_postgres().stop("fast")
    try:
        yield
    finally:
        own_postgres().start()
