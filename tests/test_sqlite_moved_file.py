"""The embedded store's file moved, deleted or replaced while a process has it open (an
operator's ``mv sessions.db``, ``rm``, a backup put back), or that it may not write,
branch ``sqliteattack`` (a full disk is tests/test_sqlite_attacks.py's).
SQLite goes on committing into the WAL beside the old name: every save said saved, and
the moved file held none of it, not even the turns saved before the move (SQLite's
close, seeing the file moved, does not checkpoint). Now the writes are refused, saying
why, and what was saved before is checkpointed into the moved file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import trio

from actors.providers import ScriptedProvider
from actors.stores import SQLiteStore
from runtime import Agent, Host
from runtime.errors import StoreError
from runtime.testing.stores import record, turn

REFUSED = "refused: the file was moved, deleted or replaced while this process had it open"


async def _stored(path: str, session_id: str):
    store = await SQLiteStore.open(path)
    try:
        return await store.load(session_id)
    finally:
        await store.aclose()


async def test_a_store_moved_between_turns_refuses_the_next_save_and_keeps_the_first(tmp_path):
    path = str(tmp_path / "sessions.db")
    agent = Agent(provider=ScriptedProvider([["one"], ["two"], ["three"]]))
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        results = [await session.run("turn 0")]
        os.rename(path, path + ".moved")
        results += [await session.run(f"turn {n}") for n in (1, 2)]
        assert [r.saved for r in results] == [True, False, False]
        for failed in results[1:]:
            assert f"session store {path}: save of session 's' {REFUSED}" in failed.error.message
        # the session goes on in memory, every turn in it
        assert [m.content for m in session.messages if m.role == "user"] == [
            "turn 0",
            "turn 1",
            "turn 2",
        ]
    assert not await trio.Path(path).exists()
    moved = await _stored(path + ".moved", "s")
    assert moved is not None and [m.content for m in moved.messages if m.role == "user"] == [
        "turn 0"
    ]


async def test_a_store_moved_away_then_closed_keeps_what_it_saved_in_the_moved_file(tmp_path):
    path = str(tmp_path / "sessions.db")
    store = await SQLiteStore.open(path)
    await store.save("s", 0, turn(0))
    os.rename(path, path + ".moved")
    await store.aclose()
    assert await _stored(path + ".moved", "s") == record("s", turn(0))


async def test_a_deleted_store_refuses_saves_and_deletes_saying_so(tmp_path):
    path = str(tmp_path / "sessions.db")
    store = await SQLiteStore.open(path)
    try:
        await store.save("s", 0, turn(0))
        os.unlink(path)
        with pytest.raises(StoreError, match=f"save of session 's' {REFUSED}"):
            await store.save("s", 2, turn(1), expected_version=1)
        with pytest.raises(StoreError, match=f"delete of session 's' {REFUSED}"):
            await store.delete("s")
        assert await store.load("s") == record("s", turn(0))  # still read, as it was
    finally:
        await store.aclose()
    assert not await trio.Path(path).exists()


async def test_a_store_replaced_by_another_file_is_not_written_into(tmp_path):
    path = str(tmp_path / "sessions.db")
    backup = str(tmp_path / "backup.db")
    other = await SQLiteStore.open(backup)
    await other.save("b", 0, turn(5))
    await other.aclose()
    store = await SQLiteStore.open(path)
    try:
        await store.save("s", 0, turn(0))
        os.rename(path, path + ".old")
        shutil.copyfile(backup, path)  # the backup put back in its place
        before = await trio.Path(path).read_bytes()
        with pytest.raises(StoreError, match=REFUSED):
            await store.save("s", 2, turn(1), expected_version=1)
        assert await trio.Path(path).read_bytes() == before
    finally:
        await store.aclose()
    assert await trio.Path(path).read_bytes() == before


def test_the_checks_leave_an_in_memory_store_alone():
    async def main() -> None:
        store = await SQLiteStore.open(":memory:")
        try:
            assert await store.save("s", 0, turn(0)) == 1
        finally:
            await store.aclose()

    trio.run(main)


_READ_ONLY_CHILD = """
import json, sys
import trio
from actors.providers import ScriptedProvider
from runtime import Agent, Host

async def main(path):
    agent = Agent(provider=ScriptedProvider([["one"]]))
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("next")
        record = await host.store.load("s")
        print(json.dumps({
            "saved": result.saved,
            "error": None if result.error is None else result.error.message,
            "stored": len(record.messages),
            "held": len(session.messages),
        }))

trio.run(main, sys.argv[1])
"""


def test_a_read_only_store_s_save_says_the_file_may_not_be_written_and_keeps_it(tmp_path):
    """A file the process may read but not write (a copy left 0444, a volume mounted
    read-only): it opens, the turn runs, and its save failed with SQLite's "attempt to
    write a readonly database" alone; now it says what to do. The file is as it was and
    the session still reads."""
    import json
    import subprocess
    import sys

    from tests.test_sqlite_attacks import REPO, _unprivileged

    path = str(tmp_path / "sessions.db")

    async def create() -> None:
        store = await SQLiteStore.open(path)
        await store.save("s", 0, turn(0))
        await store.aclose()

    trio.run(create)
    before = Path(path).read_bytes()
    os.chmod(path, 0o444)
    try:
        proc = subprocess.run(
            [*_unprivileged(), sys.executable, "-c", _READ_ONLY_CHILD, path],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        os.chmod(path, 0o644)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["saved"] is False and out["stored"] == 2 and out["held"] == 4
    assert out["error"] == (
        f"session store {path}: save of session 's' failed: this process may read the file "
        "but not write it (attempt to write a readonly database): make the file and its "
        "directory writable to it; nothing was written"
    )
    assert Path(path).read_bytes() == before
