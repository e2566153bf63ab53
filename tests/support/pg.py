"""PostgreSQL for the tests: the real server, one fresh schema per test.

Tests that need PostgreSQL use the ``pg_url`` fixture: a ``postgresql://...?schema=NAME``
URL whose schema is created for the test (by the store, on open) and dropped after it, so
parallel runs and other tests never see each other's rows. The server is the machine's
(``AXON_TEST_PG``, default ``postgresql://postgres@127.0.0.1/test``); when it does not
answer, those tests skip saying so (CI starts it, see ``.ci/run``).
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import Iterator

import pytest

PG_URL = os.environ.get("AXON_TEST_PG", "postgresql://postgres@127.0.0.1/test")


@functools.cache
def pg_unavailable() -> str | None:
    """Why PostgreSQL cannot be used here, or ``None`` when it answers."""
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'axon-runtime[postgres]')"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as err:
        return f"PostgreSQL at {PG_URL} is not reachable: {err}"
    return None


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, connect_timeout=10, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def pg_connect():
    import psycopg

    return psycopg.connect(PG_URL, connect_timeout=10, autocommit=True)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL to a fresh schema in the test database, dropped after the test."""
    reason = pg_unavailable()
    if reason is not None:
        pytest.skip(reason)
    schema = f"axon_t_{uuid.uuid4().hex[:12]}"
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        drop_schema(schema)
