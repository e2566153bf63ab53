"""PostgreSQL at its connection limit: the server's ``max_connections`` (``sorry, too many
clients already``), a role's or a database's ``CONNECTION LIMIT`` (``too many connections
for role "app"``), met by a store that needs one more connection mid-run.

Before: the role's limit was taken for a refused login (its text names a role, as
``role "app" does not exist`` does) and the call failed at once: a worker's read or
save that needed a new connection while the role was at its limit failed instead of
waiting for one. Now each limit is retried as an unreachable server is.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import trio
from structlog.testing import capture_logs

from actors.stores.postgres import PostgresStore
from tests.support.pg import EXTERNAL_PG, pg_base_url, pg_connect

LIMIT = 3


@contextlib.contextmanager
def limited_role(limit: int) -> Iterator[str]:
    """A role of the test's own limited to ``limit`` connections, owning a database of
    its own: the URL of that database as that role. Both dropped after."""
    if EXTERNAL_PG is not None:
        pytest.skip("AXON_TEST_PG points at a server this run did not start: no role made")
    suffix = uuid.uuid4().hex[:10]
    role, name = f"axon_u_{suffix}", f"axon_l_{suffix}"
    with pg_connect() as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit}")
        conn.execute(f"CREATE DATABASE {name} OWNER {role}")
    base = pg_base_url().rsplit("/", 1)[0].replace("postgres@", f"{role}@")
    try:
        yield f"{base}/{name}"
    finally:
        with pg_connect() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {role}")


async def test_a_call_that_needs_a_connection_at_the_roles_limit_waits_for_one() -> None:
    with limited_role(LIMIT) as url:
        store = await PostgresStore.open(url)
        held: list[psycopg.Connection] = []
        try:
            with contextlib.suppress(psycopg.OperationalError):
                for _ in range(LIMIT):  # the rest of the role's connections
                    held.append(psycopg.connect(url, autocommit=True))
            got: list[object] = []
            with capture_logs() as logs:
                async with trio.open_nursery() as nursery:

                    async def read() -> None:
                        got.append(await store.load_last_turn("s"))  # a new connection

                    nursery.start_soon(read)
                    with trio.fail_after(30):
                        while True:  # it met the limit, and retries
                            if any("too many connections" in str(e.get("error")) for e in logs):
                                break
                            await trio.sleep(0.02)
                    held.pop().close()
        finally:
            for conn in held:
                conn.close()
            await store.aclose()
    assert got == [None]  # answered once a connection was free: no such session
