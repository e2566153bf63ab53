"""A database whose defaults an operator changed (``ALTER DATABASE ... SET``, or a
role's), which the store's SQL cannot run under; it now sets its own on every connection
it opens (:data:`actors.stores.postgres_lane.SESSION_SETTINGS`), and behind a
transaction pooler, where no ``SET`` outlives a transaction, opening refuses others,
naming the fix. The settings come here by the URL's ``options`` (a session default, as
a role's or a database's). Real PostgreSQL (the run's own).

- ``default_transaction_isolation``: the caps' counts after the session's and the
  queue's locks see what others committed meanwhile under read committed only. Under
  ``repeatable read`` each submit's call counted in the snapshot of its start: two
  processes' submits to one session at a cap of 3 queued 8; under ``serializable``
  racing submits failed ``could not serialize access`` (a front end's 500).
- ``standard_conforming_strings`` off (a legacy application's database): the functions'
  and triggers' ``bytea`` literals (``'\\x7b7d'``) were read as escapes: saves failed
  ``invalid input syntax for type bytea`` or stored what the store then called corrupt.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.errors import ConfigurationError
from runtime.testing.stores import StoreGrownRows, StoreSubSessions
from tests.test_submit_processes import _race

LEVELS = {"repeatable read": "repeatable%5C%20read", "serializable": "serializable"}


def _with_default(pg_url: str, level: str, more: str = "") -> str:
    base, schema = pg_url.split("?")
    return f"{base}?options=-c%20default_transaction_isolation%3D{LEVELS[level]}{more}&{schema}"


def _legacy_strings(pg_url: str, more: str = "") -> str:
    base, schema = pg_url.split("?")
    return f"{base}?options=-c%20standard_conforming_strings%3Doff{more}&{schema}"


@pytest.mark.parametrize("level", sorted(LEVELS))
async def test_two_processes_submitting_at_once_keep_the_cap_whatever_the_default_isolation(
    pg_url, level
):
    got, queued = await _race(_with_default(pg_url, level), same=True, caps=("3", "-"), n=4)
    assert got == ["queued"] * 3 + ["session"] * 5
    assert queued == 3


@pytest.mark.parametrize("level", sorted(LEVELS))
async def test_every_connection_of_the_store_reads_committed(pg_url, level):
    """The pool's, the lane's and a lease renewer's."""
    store = await PostgresStore.open(_with_default(pg_url, level))
    queue = TurnQueue(store)
    show = "SELECT current_setting('transaction_isolation')"
    try:
        pooled = await store.run(
            "isolation", lambda conn: conn.execute(show).fetchone()[0], transaction=False
        )
        laned = await store._lane.call(b"isolation", show.encode(), (), (), 0)
        conn = queue.connect()
        try:
            renewer = conn.execute(show).fetchone()[0]
        finally:
            conn.close()
    finally:
        await queue.aclose()
        await store.aclose()
    assert pooled == renewer == "read committed"
    assert laned.get_value(0, 0) == b"read committed"


async def test_behind_a_transaction_pooler_another_default_isolation_is_refused(pg_url):
    schema = pg_url.rsplit("schema=", 1)[1]
    await (await PostgresStore.open(pg_url)).aclose()  # (the schema made)
    url = _with_default(pg_url, "repeatable read", f"%20-c%20search_path%3D{schema}")
    with pytest.raises(ConfigurationError) as caught:
        await PostgresStore.open(url + "&pooler=transaction")
    assert "default_transaction_isolation is 'repeatable read'" in str(caught.value)
    assert "SET default_transaction_isolation = 'read committed'" in str(caught.value)


class TestLegacyStrings(StoreGrownRows, StoreSubSessions):
    """The store kit's grown rows (every head's prefix a ``bytea`` literal; every head
    here: :data:`~actors.stores.postgres.GROWN_FROM_BYTES` 0) and sub-sessions (the
    caller trigger's key, created under the setting too) with
    ``standard_conforming_strings`` off."""

    @pytest.fixture
    async def store(self, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
        from actors.stores import postgres

        monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
        s = await postgres.PostgresStore.open(_legacy_strings(pg_url))
        try:
            yield s
        finally:
            await s.aclose()


async def test_behind_a_transaction_pooler_legacy_strings_are_refused(pg_url):
    schema = pg_url.rsplit("schema=", 1)[1]
    url = _legacy_strings(pg_url, f"%20-c%20search_path%3D{schema}")
    with pytest.raises(ConfigurationError) as caught:
        await PostgresStore.open(url + "&pooler=transaction")
    assert "standard_conforming_strings is 'off'" in str(caught.value)
    assert "SET standard_conforming_strings = 'on'" in str(caught.value)
