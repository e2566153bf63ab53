"""``python -m runtime delete SESSION_ID --store STORE``: deletes one stored session; on
a terminal it asks first (``--yes`` does not), with stdin not a terminal it needs
``--yes``; an unknown session or a store that cannot be opened is one clear line."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import trio

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.errors import SESSION_DELETED
from runtime.messages import UserMessage

ROOT = Path(__file__).resolve().parents[1]


def axon(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        stdin=stdin,
    )


def stored(db: str, *session_ids: str) -> None:
    for session_id in session_ids:
        run = axon("run", "--store", db, "--session", session_id, "--jsonl", "hello")
        assert run.returncode == 0, run.stderr


def listed(db: str) -> list[str]:
    return [line.split("\t")[0] for line in axon("sessions", "--store", db).stdout.splitlines()]


def answering(answer: str, *args: str) -> subprocess.CompletedProcess:
    """The command run with a terminal as its stdin, ``answer`` typed into it."""
    primary, secondary = pty.openpty()
    try:
        os.write(primary, answer.encode())
        return axon(*args, stdin=secondary)
    finally:
        os.close(secondary)
        os.close(primary)


def test_delete_with_yes_removes_the_session_from_the_store(tmp_path):
    db = str(tmp_path / "s.db")
    stored(db, "gone", "kept")
    deleted = axon("delete", "gone", "--store", db, "--yes")
    shown = axon("show", "gone", "--store", db)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == "deleted session 'gone'\n"
    assert listed(db) == ["kept"]
    assert shown.returncode == 1


def test_delete_asks_on_a_terminal_and_deletes_on_yes(tmp_path):
    db = str(tmp_path / "s.db")
    stored(db, "gone")
    deleted = answering("y\n", "delete", "gone", "--store", db)
    assert deleted.returncode == 0, deleted.stderr
    assert "delete session 'gone'" in deleted.stderr and "[y/N]" in deleted.stderr
    assert listed(db) == []


def test_delete_on_a_terminal_keeps_the_session_unless_the_answer_is_yes(tmp_path):
    db = str(tmp_path / "s.db")
    stored(db, "kept")
    refused = [answering(answer, "delete", "kept", "--store", db) for answer in ("n\n", "\n")]
    assert [r.returncode for r in refused] == [1, 1]
    assert all(r.stderr.endswith("not deleted\n") for r in refused)
    assert listed(db) == ["kept"]


def test_delete_without_yes_and_without_a_terminal_deletes_nothing(tmp_path):
    db = str(tmp_path / "s.db")
    stored(db, "kept")
    refused = axon("delete", "kept", "--store", db)
    assert refused.returncode == 2
    assert refused.stderr.startswith("error: ") and "add --yes" in refused.stderr
    assert listed(db) == ["kept"]


def test_deleting_an_unknown_session_says_so_and_exits_1(tmp_path):
    db = str(tmp_path / "s.db")
    stored(db, "kept")
    missing = axon("delete", "nope", "--store", db, "--yes")
    assert missing.returncode == 1
    assert missing.stderr == f"no session 'nope' in {db}\n"


def test_delete_from_a_missing_store_is_one_line_and_creates_nothing(tmp_path):
    db = tmp_path / "none.db"
    proc = axon("delete", "s", "--store", str(db), "--yes")
    assert proc.returncode == 2 and proc.stderr == f"error: no session store at {db}\n"
    assert not db.exists()


def test_delete_from_a_file_that_is_no_store_is_one_line(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("my notes, not a database\n")
    proc = axon("delete", "s", "--store", str(text), "--yes")
    assert proc.returncode == 2 and "is not an Axon store" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert text.read_text() == "my notes, not a database\n"


def test_delete_with_a_bad_session_id_is_one_line(tmp_path):
    db = str(tmp_path / "s.db")
    stored(db, "kept")
    proc = axon("delete", "bad id!", "--store", db, "--yes")
    assert proc.returncode == 2 and "invalid session id 'bad id!'" in proc.stderr


async def test_delete_from_postgresql_cancels_the_sessions_queued_turn(pg_url):
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("s", 0, [UserMessage(content="earlier")], {"title": "t"})
        turn = await queue.submit("s", "never runs")  # no worker: it stays queued
        proc = await trio.run_process(
            [sys.executable, "-m", "runtime", "delete", "s", "--store", pg_url, "--yes"],
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=ROOT,
        )
        after = await queue.get(turn.turn_id)
        record = await store.load("s")
    finally:
        with trio.CancelScope(shield=True):
            await queue.aclose()
            await store.aclose()
    assert proc.returncode == 0, proc.stderr
    assert record is None
    assert after is not None and after.status == "cancelled"
    assert after.cancel_reason == SESSION_DELETED
