"""Attacks on the store-level registry of the hosts writing a store (branches ``twins2``
and ``pgregistry``; this file: branch ``attackregistry``).

A row of the registry (``axon_meta`` key ``writer:<host>``) that nothing judges gone
stays for good, and every host opening the store then claims its turns (one save more
a turn) for as long as it stays. A hostile or damaged row must not be one; a store
holding many rows must not make every turn's version query read them all."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest

from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import PostgresStore
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, Host
from runtime.liveness import MARKER_TTL_DEFAULT, this_process


def _unseen_writer() -> str:
    """A writer name of a process this one cannot see (another machine)."""
    mine = this_process()
    assert mine is not None
    return "other-machine:" + mine.split(":", 1)[1]


_ODD_ROWS = {
    "no time": lambda: json.dumps({"writer": _unseen_writer()}),
    "time not a number": lambda: json.dumps({"writer": _unseen_writer(), "at": "now"}),
    "time NaN": lambda: json.dumps({"writer": _unseen_writer(), "at": math.nan}),
    "time Infinity": lambda: json.dumps({"writer": _unseen_writer(), "at": math.inf}),
    "time years ahead": lambda: json.dumps({"writer": _unseen_writer(), "at": time.time() + 3e8}),
}


@pytest.mark.parametrize("odd", list(_ODD_ROWS))
async def test_a_row_whose_time_never_ages_is_dropped_as_the_next_host_opens(tmp_path, odd):
    """A row of a host not seen from here is judged by its age; one whose ``at`` is
    missing, not a finite number, or more than the bound ahead of this clock never
    aged: it was kept for good and every host opening the file claimed. Now gone: the
    host opening drops it and is alone."""
    db = str(tmp_path / "one.db")
    store = await SQLiteStore.open(db)
    try:
        await store.set_writer("host_other_0", _ODD_ROWS[odd]())
    finally:
        await store.aclose()
    async with Host.open(store=db) as host:
        assert not host.claims_turns
        assert list(await host.store.writers()) == [host.marker_id]


async def test_a_row_a_little_ahead_of_this_clock_still_counts(tmp_path):
    """Clocks a little apart (less than the bound): another machine's fresh row still
    names a host writing the file."""
    db = str(tmp_path / "one.db")
    store = await SQLiteStore.open(db)
    try:
        row = json.dumps({"writer": _unseen_writer(), "at": time.time() + MARKER_TTL_DEFAULT / 2})
        await store.set_writer("host_other_0", row)
    finally:
        await store.aclose()
    async with Host.open(store=db) as host:
        assert host.claims_turns


async def _fill(store: Any, rows: int) -> None:
    fresh = json.dumps({"writer": _unseen_writer(), "at": time.time()})
    for i in range(rows):
        await store.set_writer(f"host_many_{i}", fresh)


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_a_version_query_reads_two_registry_names_however_many_rows(tmp_path, kind, request):
    """The registry's names ride on the version query every turn makes: with five
    rows it reads two (enough to tell "this host alone" from "another too"), not all
    (10,000 rows of a crash loop cost 0.7 ms and a 230 kB string a turn on SQLite)."""
    if kind == "sqlite":
        store: Any = await SQLiteStore.open(str(tmp_path / "one.db"))
    else:
        store = await PostgresStore.open(request.getfixturevalue("pg_url"))
    try:
        await _fill(store, 5)
        await store.version("s")
        seen = store.writers_seen()
        await store.version_and_deletions("s")
        seen_with_mark = store.writers_seen()
    finally:
        await store.aclose()
    assert seen is not None and len(seen) == 2
    assert seen_with_mark is not None and len(seen_with_mark) == 2


async def test_a_host_beside_many_rows_still_claims_its_next_turn(tmp_path):
    """Two names read: not this host alone, so its turn reads the rows and claims."""
    db = str(tmp_path / "one.db")
    async with Host.open(store=db) as host:
        await _fill(host.store, 3)
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps=[["A."]])), session_id="s"
        )
        assert (await session.run("one")).error is None
        assert host.claims_turns
