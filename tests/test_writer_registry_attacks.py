"""Attacks on the store-level registry of the hosts writing a store (branches ``twins2``
and ``pgregistry``; this file: branch ``attackregistry``).

A row of the registry (``axon_meta`` key ``writer:<host>``) that nothing judges gone
stays for good, and every host opening the store then claims its turns (one save more
a turn) for as long as it stays. A hostile or damaged row must not be one; a store
holding many rows must not make every turn's version query read them all."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import PostgresStore
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, Host
from runtime.ids import new_id
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


async def test_a_row_whose_pid_now_belongs_to_another_process_is_dropped(tmp_path):
    """A dead host's pid taken by an unrelated live process (pid reuse): the row's
    start time is not that process's, so the row is gone, dropped as the next host
    opens (pinned: kept, it would make every later host claim)."""
    mine = this_process()
    assert mine is not None
    host_name, boot, ns, pid, start = mine.rsplit(":", 4)
    reused = ":".join((host_name, boot, ns, pid, str(int(start) + 1)))  # this pid, alive
    db = str(tmp_path / "one.db")
    store = await SQLiteStore.open(db)
    try:
        await store.set_writer("host_reused_0", json.dumps({"writer": reused, "at": time.time()}))
    finally:
        await store.aclose()
    async with Host.open(store=db) as host:
        assert not host.claims_turns
        assert list(await host.store.writers()) == [host.marker_id]


async def test_two_hosts_opening_at_once_both_claim_from_their_first_turn(tmp_path, monkeypatch):
    """Both read the registry before either wrote its row (neither knew of the other
    as it opened): each one's first turn reads the other's name in its version query
    and claims (pinned: the read as a turn starts covers the open's race)."""
    reads = 0
    both_read = trio.Event()
    read = SQLiteStore.writers

    async def writers(self: SQLiteStore) -> dict[str, str]:
        nonlocal reads
        rows = await read(self)
        reads += 1
        if reads == 2:
            both_read.set()
        await both_read.wait()
        return rows

    monkeypatch.setattr(SQLiteStore, "writers", writers)
    db = str(tmp_path / "one.db")
    await (await SQLiteStore.open(db)).aclose()  # (the schema, before the race)
    hosts: list[Host] = []
    done = trio.Event()

    async def open_host(task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with Host.open(store=db) as host:
            task_status.started(host)
            await done.wait()

    async with trio.open_nursery() as nursery:
        hosts = list(await _both(nursery, open_host))
        assert [h.claims_turns for h in hosts] == [False, False]
        for i, host in enumerate(hosts):
            session = await host.open_session(
                Agent(provider=ScriptedProvider(steps=[["ok"]])), session_id=f"s{i}"
            )
            assert (await session.run("one")).error is None
        assert [h.claims_turns for h in hosts] == [True, True]
        done.set()


async def _both(nursery: trio.Nursery, start: Any) -> tuple[Host, Host]:
    got: list[Host] = []

    async def one() -> None:
        got.append(await nursery.start(start))

    async with trio.open_nursery() as pair:
        pair.start_soon(one)
        pair.start_soon(one)
    return got[0], got[1]


def _ids_of_a_forked_child() -> str:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # (the child: its id, then out without running anything of pytest's)
        try:
            os.write(write, new_id("host").encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        os.waitpid(pid, 0)
        return os.read(read, 200).decode()
    finally:
        os.close(read)


def test_two_children_forked_from_one_parent_name_their_hosts_apart():
    """Two children of one parent (a prefork server's workers) each open a host on
    the same store: their names in its registry must differ. They shared the parent's
    id prefix and counter: both hosts were ``host_<prefix>_N``, one row for both, and
    each found only its own name there (neither claimed)."""
    assert _ids_of_a_forked_child() != _ids_of_a_forked_child()
