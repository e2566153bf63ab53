"""The registry of the hosts writing a PostgreSQL store (branch ``pgregistry``).

twins2 gave SQLite's hosts a registry (``writer:<marker_id>`` rows of ``axon_meta``,
read in the version query a turn makes anyway), so two embedded ``serve`` on one file
refuse the very first twin of a message before its model call. PostgreSQL's embedded
hosts (``serve --store postgresql://...`` with no workers) kept none: the first one or
two twins per server pair still ran twice. They now register as SQLite's do; a worker's
host (its turn queue dedupes) neither writes nor reads the registry. Against the run's
own PostgreSQL (tests/support), never the machine's."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import PostgresStore
from runtime import Agent, Host
from tests.test_twin_first_meeting import (
    _first_twin_is_refused,
    _no_registry,
    _second_host_makes_the_first_claim,
)


@pytest.mark.parametrize("first", ["opened first", "opened second"])
async def test_the_first_twin_of_two_fresh_servers_on_one_database_is_refused_before_its_model_call(
    pg_url, first
):
    """Two embedded servers on one database that never saw each other's writes get
    ``q1`` at once (both held in ``on_turn_start``): the winner claims and answers, the
    other's claim meets that answer, its stream ends ``not_saved``, its provider gets no
    request (was: a whole model run, refused at its end)."""
    await _first_twin_is_refused(pg_url, first)


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The text of every statement sent through a psycopg cursor from here on (the
    store's reads; the loop lane's saves are the same with or without the registry)."""
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = str(query)
        if text.strip():  # the pool's check of an idle connection sends ""
            sent.append(text)
        return execute(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", counted)
    yield sent


async def _lone_turns(pg_url: str, statements: list[str]) -> tuple[list[str], bool]:
    """Three one-step turns of one session on a host alone on the database: the
    statements they sent, and whether the host claimed."""
    async with Host.open(store=pg_url, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps=[["Hi."], ["Hi."], ["Hi."]])), session_id="s"
        )
        del statements[:]
        for i in range(3):
            result = await session.run(f"m{i}")
            assert result.error is None
        return list(statements), host.claims_turns


async def test_a_lone_hosts_turns_send_the_statements_they_sent_without_a_registry(
    pg_url, statements, monkeypatch
):
    """A host alone on its database: its three turns send as many statements as with
    no registry at all (its names ride on the version query each turn makes anyway:
    the query's text differs, not the count), write no row, and never claim."""
    with_registry, claimed = await _lone_turns(pg_url, statements)
    assert not claimed
    with monkeypatch.context() as patch:
        patch.setattr(Host, "_join_writers", _no_registry)
        without, _ = await _lone_turns(pg_url, statements)
    assert len(with_registry) == len(without), (with_registry, without)
    assert collections.Counter(s.split()[0].upper() for s in with_registry) == collections.Counter(
        s.split()[0].upper() for s in without
    )
    versions = [s for s in with_registry if "FROM axon_sessions WHERE session_id" in s]
    assert len(versions) == 3 and all("writer:" in s for s in versions)
    assert not any("axon_meta" in s for s in without)
    writes = ("insert into axon_meta", "delete")
    assert not any(s.lstrip().lower().startswith(writes) for s in with_registry)


async def test_a_second_host_on_the_database_makes_the_first_claim_its_next_turn(pg_url):
    """A opens alone; B opens: B claims from the start (A's row), A from its next turn
    (B's row, read in that turn's version query)."""
    await _second_host_makes_the_first_claim(pg_url, log_tap=False)


async def test_a_closed_host_leaves_the_registry(pg_url):
    """A host's row goes as it closes: the next host alone on the database does not claim."""
    async with Host.open(store=pg_url, log_tap=False) as first:
        assert list(await first.store.writers()) == [first.marker_id]
    async with Host.open(store=pg_url, log_tap=False) as host:
        assert not host.claims_turns
        assert list(await host.store.writers()) == [host.marker_id]
    store = await PostgresStore.open(pg_url)
    try:
        assert await store.writers() == {}
    finally:
        await store.aclose()


_CHILD = """
import sys, trio
from runtime import Host

async def main():
    async with Host.open(store=sys.argv[1], log_tap=False) as host:
        print(host.marker_id, flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def test_a_killed_processs_row_is_dropped_as_the_next_host_opens(pg_url):
    """A ``serve``-like process SIGKILLed leaves its row; the next host to open drops it
    (its pid is dead), is alone, and does not claim."""
    child = await trio.lowlevel.open_process(
        [sys.executable, "-c", _CHILD, pg_url],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )
    try:
        assert child.stdout is not None
        line = b""
        with trio.fail_after(60):
            while not line.endswith(b"\n"):
                got = await child.stdout.receive_some()
                assert got, "the child ended before it opened its host"
                line += got
        name = line.decode().strip()
        assert name.startswith("host")
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    store = await PostgresStore.open(pg_url)
    try:
        assert list(await store.writers()) == [name]  # left by the killed process
    finally:
        await store.aclose()
    async with Host.open(store=pg_url, log_tap=False) as host:
        assert not host.claims_turns
        assert list(await host.store.writers()) == [host.marker_id]


async def test_a_workers_host_neither_registers_nor_reads_the_registry(pg_url, statements):
    """A host opened as a worker's (``expects_other_writers``: the turn queue dedupes)
    writes no row, beside another host's row never claims, and its version queries
    read no registry."""
    store = await PostgresStore.open(pg_url)
    try:
        await store.set_writer("host_other", json.dumps({"writer": None, "at": 1e12}))
    finally:
        await store.aclose()
    async with Host.open(store=pg_url, log_tap=False, expects_other_writers=True) as host:
        assert host.expects_other_writers
        del statements[:]
        await host.store.version("s")
        await host.store.version_and_deletions("s")
        assert not any("axon_meta" in s for s in statements), statements
        assert not await host.shares_store()
        assert list(await host.store.writers()) == ["host_other"]
        assert not host.claims_turns
