"""PgBouncer for the tests: one of the run's own, in transaction pooling mode, in front of
the run's own PostgreSQL (:class:`tests.support.services.PgBouncerServer`).

``pooled_database()`` makes a database of its own on the run's server (dropped after) and
gives its URL through the bouncer. A database, not a schema: behind transaction pooling
no ``SET search_path`` outlives a transaction, so the store's schema must be the one its
sessions start in (``public`` here, or the database's ``search_path``). Tests skip, saying
what to install, where there is no ``pgbouncer`` binary, and when PostgreSQL is the user's
(``AXON_TEST_PG``): the bouncer is only ever put in front of the run's own server.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from tests.support.pg import EXTERNAL_PG, pg_base_url, pg_connect
from tests.support.services import ServiceUnavailable, own_pgbouncer


def bouncer_base() -> str:
    """``postgresql://postgres@127.0.0.1:PORT`` of the run's own PgBouncer; skips when
    there is none."""
    if EXTERNAL_PG is not None:
        pytest.skip("AXON_TEST_PG points at a server this run did not start: no PgBouncer")
    pg_base_url()  # skips without PostgreSQL
    try:
        return own_pgbouncer().url.rsplit("/", 1)[0]
    except ServiceUnavailable as err:
        pytest.skip(str(err))


@contextlib.contextmanager
def pooled_database(search_path: str | None = None) -> Iterator[tuple[str, str]]:
    """A database of its own (its sessions' ``search_path`` set when given), dropped
    after: ``(its URL through the bouncer, its URL straight to PostgreSQL)``, neither
    with Axon's parameters."""
    base = bouncer_base()
    name = f"axon_b_{uuid.uuid4().hex[:12]}"
    with pg_connect() as conn:
        conn.execute(f"CREATE DATABASE {name}")
        if search_path is not None:
            conn.execute(f"ALTER DATABASE {name} SET search_path = {search_path}")
    direct = f"{pg_base_url().rsplit('/', 1)[0]}/{name}"
    try:
        yield f"{base}/{name}", direct
    finally:
        with pg_connect() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
