"""The embedded SQLite store attacked as a careless user and a hostile environment would
(benchmarks/journal/approval.md, branch ``storeatk``): contents that JSON in UTF-8 cannot
hold, another process keeping the write lock, a disk that fills mid-turn, a process
killed in the middle of its saves. What is not here is in tests/test_stores.py (files
that are not Axon stores, truncated, damaged, newer or older schemas),
tests/test_crash_safety.py (SIGKILL of multi-step turns), tests/test_concurrent_writers.py
(two hosts, two CLI processes on one session) and tests/test_persistence.py (a save that
waits for another process's lock)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import attrs
import pytest
import trio

import actors.stores.sqlite as sqlite_store
import actors.turn.saving as saving
from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from actors.stores import SQLiteStore
from runtime import Agent, Host, tool
from runtime.errors import StoreCorrupt, StoreError
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage, UserMessage
from runtime.testing.stores import record, turn

REPO = Path(__file__).resolve().parents[1]

# -- contents UTF-8 JSON cannot hold as they are ---------------------------------------------


@tool
async def listdir() -> str:
    """The names in a directory (one is not UTF-8: os.listdir gives it surrogate-escaped)."""
    return "notes.txt report_\udcff.pdf"


async def test_a_lone_surrogate_in_a_tool_result_does_not_stop_the_session_being_saved(tmp_path):
    """A tool's output holding a lone surrogate (a file name that is not UTF-8) failed
    the turn's save, then every later save of the session (each starts at or before it):
    the turns lived in memory only, and the next process found none of them."""
    path = tmp_path / "sessions.db"
    provider = ScriptedProvider([tool_call("listdir", {}), ["two files"]])  # each turn
    agent = Agent(name="files", provider=provider, tools=[listdir])
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        with trio.fail_after(10):
            first = await session.run("what is in there?")
            second = await session.run("and now?")
    assert first.error is None and first.saved
    assert second.error is None and second.saved
    store = await SQLiteStore.open(path)
    try:
        stored = (await store.load("s")).messages
    finally:
        await store.aclose()
    assert [m.role for m in stored] == ["user", "assistant", "tool"] * 2
    for result in stored[2], stored[5]:  # the tool executor writes it as an escape first
        assert result.output == "notes.txt report_\\udcff.pdf"


async def test_lone_surrogates_anywhere_in_a_message_or_its_meta_are_stored_replaced(tmp_path):
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        call = ToolCallPart(
            tool_call_id="c1", tool_name="t", step=0, input={"pa\ud800th": ["x\udfff", "😀"]}
        )
        messages = [
            UserMessage(content="hi \udcff there 😀", id="u1"),
            AssistantMessage(content=(call,), id="a1"),
            ToolMessage(tool_call_id="c1", tool_name="t", step=0, output={"k": "\ud83d"}),
        ]
        assert await store.save("s", 0, messages, {"title": "hi \udcff"}) == 1
        loaded = await store.load("s")
        assert loaded.messages[0].content == "hi \ufffd there 😀"  # a real pair is kept
        assert loaded.messages[1].content[0].input == {"pa\ufffdth": ["x\ufffd", "😀"]}
        assert loaded.messages[2].output == {"k": "\ufffd"}
        assert loaded.meta == {"title": "hi \ufffd"}
        assert (await store.list_sessions())[0].meta == {"title": "hi \ufffd"}
        # What cannot be JSON at all is still refused, before anything is written.
        with pytest.raises(StoreError, match="message 3 cannot be serialized"):
            await store.save(
                "s", 3, [ToolMessage(tool_call_id="c", tool_name="t", step=0, output={1.5: "k"})]
            )
        with pytest.raises(StoreError, match="meta is not JSON-serializable"):
            await store.save("s", 3, [], {"x": {1.5: "key"}})
        assert (await store.load("s")) == loaded
    finally:
        await store.aclose()


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


async def test_tool_arguments_nested_deeper_than_orjson_writes_are_stored(tmp_path):
    """A model's tool arguments are parsed by ``json.loads`` (nearly 1,000 levels); orjson
    writes 254. Deeper arguments failed the turn's save and every later one."""
    store = await SQLiteStore.open(tmp_path / "sessions.db")
    try:
        call = ToolCallPart(tool_call_id="c1", tool_name="t", step=0, input=_nested(300))
        messages = [UserMessage(content="go", id="u1"), AssistantMessage(content=(call,), id="a1")]
        await store.save("s", 0, messages)
        assert await store.load("s") == record("s", messages)
    finally:
        await store.aclose()


# -- another process holding the write lock ---------------------------------------------------


def _holder(path: Path) -> sqlite3.Connection:
    """Another process's connection, holding the file's write lock until it commits."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


async def test_a_write_lock_held_too_long_is_a_clear_error_and_nothing_is_half_written(
    tmp_path, monkeypatch
):
    """SQLite's own text, "database is locked", said neither who holds it nor how long
    the save waited."""
    monkeypatch.setattr(sqlite_store, "_BUSY_TIMEOUT", 0.2)
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.save("s", 0, turn(0))
        other = _holder(path)
        try:
            with pytest.raises(
                StoreError, match=r"another process held the file's write lock"
            ) as info:
                await store.save("s", 2, turn(1), expected_version=1)
            assert "for more than 0.2 s" in str(info.value) and str(path) in str(info.value)
            assert await store.load("s") == record("s", turn(0))  # reads go on meanwhile
        finally:
            other.execute("COMMIT")
            other.close()
        assert await store.save("s", 2, turn(1), expected_version=1) == 2
        assert await store.load("s") == record("s", turn(0) + turn(1))
    finally:
        await store.aclose()


def _create(path: Path) -> None:
    async def create() -> None:
        store = await SQLiteStore.open(path)
        await store.save("a", 0, turn(0))
        await store.aclose()

    trio.run(create)


@pytest.mark.parametrize("released", [False, True], ids=["held-past-the-end", "released-late"])
def test_run_says_a_turn_the_store_never_took_was_not_saved(
    tmp_path, monkeypatch, capsys, released
):
    """``run --store`` while another process holds the file's write lock longer than the
    turn waits for its final save (``SAVE_TIMEOUT``): the answer was printed, the save
    failed while the host closed, and the command exited 0 saying nothing; the turn was
    gone. Now it reads the store to tell, and says so (exit 1); a save that landed late,
    once the lock was released, is a success as before."""
    from runtime.app.cli import main

    monkeypatch.setattr(saving, "SAVE_TIMEOUT", 0.1)
    monkeypatch.setattr(sqlite_store, "_BUSY_TIMEOUT", 1.0 if released else 0.3)
    path = tmp_path / "sessions.db"
    _create(path)
    other = _holder(path)
    timer = threading.Timer(0.4, other.execute, ("COMMIT",))
    if released:
        timer.start()
    try:
        code = main(["run", "--store", str(path), "--session", "a", "--delay", "0", "hi"])
    finally:
        timer.join() if released else other.execute("COMMIT")
        other.close()
    err = capsys.readouterr().err
    stored = sqlite3.connect(path).execute("SELECT count(*) FROM messages").fetchone()[0]
    if released:
        assert code == 0 and "not saved" not in err and stored > 2
    else:
        assert code == 1 and stored == 2
        assert f"the turn was not saved to {path}: the store did not take its save" in err


# -- the disk fills up mid-turn ---------------------------------------------------------------

_FULL_DISK_CHILD = """
import json, os, resource, signal, sys
import trio
from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from runtime import Agent, Host, tool

@tool
async def blob() -> str:
    "A long result."
    return "x" * 40_000

async def main(path):
    provider = ScriptedProvider([tool_call("blob", {}), ["done"]])
    agent = Agent(name="full", provider=provider, tools=[blob])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        for n in range(5):
            if n == 1:  # no file may grow more than a turn's worth from here
                wal = max(os.path.getsize(path + suffix) for suffix in ("", "-wal"))
                resource.setrlimit(resource.RLIMIT_FSIZE, (wal + 20_000, resource.RLIM_INFINITY))
            if n == 3:  # space is back
                resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
            result = await session.run(f"turn {n}")
            error = None if result.error is None else result.error.message
            print(json.dumps({"n": n, "saved": result.saved, "error": error}), flush=True)

trio.run(main, sys.argv[1])
"""


def test_a_disk_that_fills_mid_turn_fails_the_turn_s_save_clearly_and_loses_nothing(tmp_path):
    """A real short write (RLIMIT_FSIZE: EFBIG, what a full disk's ENOSPC also gives
    SQLite): the turns that could not be saved say so, the ones saved before stay, and
    once space is back the session's next save writes every turn kept in memory."""
    path = tmp_path / "sessions.db"
    proc = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["saved"] for r in results] == [True, False, False, True, True]
    for failed in results[1:3]:
        assert (
            f"session store {path}: save of session 's' failed: disk I/O error" in (failed["error"])
        )
    assert results[3]["error"] is None and results[4]["error"] is None

    async def stored() -> list:
        store = await SQLiteStore.open(path)
        try:
            return list((await store.load("s")).messages)
        finally:
            await store.aclose()

    messages = trio.run(stored)
    assert [m.content for m in messages if m.role == "user"] == [f"turn {n}" for n in range(5)]
    assert [m.role for m in messages] == ["user", "assistant", "tool"] * 5


# -- SIGKILL in the middle of saves -----------------------------------------------------------

_SAVER_CHILD = """
import sys
import trio
from actors.stores import SQLiteStore
from runtime.messages import UserMessage

BATCH = 40

async def main(path):
    store = await SQLiteStore.open(path)
    record = await store.load("s")
    count, version = (0, 0) if record is None else (len(record.messages), record.version)
    for batch in range(count // BATCH, 10_000):
        messages = [  # 40 x 8 KB: a save of many pages, given to a worker thread
            UserMessage(content=f"{batch}:{i}:" + "y" * 8000, id=f"b{batch}-{i}")
            for i in range(BATCH)
        ]
        version = await store.save("s", batch * BATCH, messages, {"batch": batch},
                                   expected_version=version)
        print(batch, flush=True)

trio.run(main, sys.argv[1])
"""


@pytest.mark.parametrize("seed", range(3))
def test_sigkill_during_saves_leaves_whole_batches_and_a_store_that_goes_on(tmp_path, seed):
    """A process killed at a seeded moment of a run of large saves (each many pages of
    the write-ahead log): the file opens again without a repair, every save is there
    whole or not at all, none it reported done is missing, and the next process
    continues the session from there."""
    rng = random.Random(seed)
    path = tmp_path / "sessions.db"
    reported = -1
    for _ in range(2):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SAVER_CHILD, str(path)],
            stdout=subprocess.PIPE,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert proc.stdout is not None
            for _ in range(rng.randint(1, 4)):  # let it report a few saves...
                line = proc.stdout.readline()
                assert line, "the child exited before it was killed"
                reported = int(line)
            for _ in range(rng.randint(0, 30_000)):  # ...then kill it within the next
                pass
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        reported = max([reported, *(int(line) for line in proc.stdout.read().split())])
        proc.stdout.close()

        wal = path.with_name(path.name + "-wal")
        assert wal.stat().st_size > 0  # a log left by the killed process: the next opens it
        # What it left, as another program sees it (read-only: it leaves the log in place).
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = conn.execute("SELECT idx, body FROM messages ORDER BY idx").fetchall()
        (batch_meta,) = conn.execute("SELECT meta FROM sessions").fetchone()
        conn.close()
        assert len(rows) % 40 == 0 and len(rows) // 40 > reported
        assert [idx for idx, _ in rows] == list(range(len(rows)))
        for idx, body in rows:
            assert json.loads(body)["content"].startswith(f"{idx // 40}:{idx % 40}:")
        assert json.loads(batch_meta) == {"batch": len(rows) // 40 - 1}

    async def reopened() -> int:
        store = await SQLiteStore.open(path)
        try:
            return len((await store.load("s")).messages)
        finally:
            await store.aclose()

    assert trio.run(reopened) == len(rows)


# -- a newer axon-runtime upgrades the file while this one has it open --------------------


async def test_a_file_upgraded_by_a_newer_runtime_while_open_is_not_written_into(tmp_path):
    """The schema was checked only when the file was opened: a process of this version,
    left running while another of a newer one upgraded the file, went on writing rows
    of the old layout into it. Each write checks it now, in the statement it already
    made, and writes nothing."""
    path = tmp_path / "sessions.db"
    store = await SQLiteStore.open(path)
    try:
        await store.save("s", 0, turn(0))
        await store.save("gone", 0, turn(0))
        newer = sqlite3.connect(path)
        newer.execute("UPDATE axon_meta SET value = '7' WHERE key = 'schema_version'")
        newer.commit()
        newer.close()
        before = sqlite3.connect(path).execute("SELECT count(*) FROM messages").fetchone()
        with pytest.raises(StoreError, match="is at schema version 7 now, not the 6") as info:
            await store.save("s", 2, turn(1), expected_version=1)
        assert "nothing was written" in str(info.value) and str(path) in str(info.value)
        with pytest.raises(StoreError, match="is at schema version 7 now"):
            await store.delete("gone")
        after = sqlite3.connect(path).execute("SELECT count(*) FROM messages").fetchone()
        assert after == before
    finally:
        await store.aclose()


_CREATOR_CHILD = """
import sqlite3, sys
from actors.stores.sqlite import _create_schema
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
if sys.argv[2] == "foreign":  # another application's database, committed
    conn.execute("CREATE TABLE notes(body TEXT)")
conn.execute("PRAGMA cache_size = 2")  # pages reach the file before the commit
conn.execute("BEGIN IMMEDIATE")
if sys.argv[2] == "axon":
    _create_schema(conn)
conn.execute("CREATE TABLE filler(x TEXT)")
conn.executemany("INSERT INTO filler VALUES (?)", (("v" * 900,) for _ in range(200)))
print("in the transaction", flush=True)
sys.stdin.read()
"""


def _killed_in_a_transaction(path: Path, kind: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CREATOR_CHILD, str(path), kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"in the transaction\n"
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdout, proc.stdin):
            assert pipe is not None
            pipe.close()
    journal = path.with_name(path.name + "-journal")
    assert journal.stat().st_size > 0 and path.stat().st_size > 4096  # written, uncommitted


def test_a_store_whose_creation_was_killed_mid_transaction_is_recovered_not_refused(tmp_path):
    """A process killed while it created the file (its transaction's pages partly in the
    file, a hot journal beside it) left what the header check refused as "not a SQLite
    database" (or as truncated), though SQLite rolls it back to the empty file it was.
    SQLite judges it now: the store opens, empty. A foreign database with a hot journal
    is still refused, once SQLite has restored it."""
    path = tmp_path / "sessions.db"
    _killed_in_a_transaction(path, "axon")

    async def reopened() -> None:
        store = await SQLiteStore.open(path)
        try:
            assert await store.list_sessions() == []
            await store.save("s", 0, turn(0))
            assert await store.load("s") == record("s", turn(0))
        finally:
            await store.aclose()

    trio.run(reopened)
    assert not path.with_name(path.name + "-journal").exists()

    foreign = tmp_path / "notes.db"
    _killed_in_a_transaction(foreign, "foreign")
    with pytest.raises(StoreCorrupt, match="another application"):
        trio.run(SQLiteStore.open, foreign)
    tables = sqlite3.connect(foreign).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("notes",)]  # as it was committed: rolled back, not written into


# -- where the file is ------------------------------------------------------------------------


async def test_a_store_in_a_missing_directory_says_so(tmp_path):
    """SQLite's own text was "unable to open database file", for a directory missing."""
    path = tmp_path / "no such dir" / "sessions.db"
    with pytest.raises(StoreError, match="unable to open database file") as info:
        await SQLiteStore.open(path)
    assert f"its directory {path.parent} does not exist" in str(info.value)
    assert not path.parent.exists()


def _unprivileged() -> list[str]:
    """A command prefix under which file permissions hold (root without capabilities)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file permissions do not apply")
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]


def test_a_store_in_a_directory_that_is_not_writable_says_why_even_to_read_it(tmp_path):
    """A WAL store is opened, even to list its sessions, by creating its ``-wal`` and
    ``-shm`` files beside it: in a directory that is not writable SQLite said "attempt
    to write a readonly database", of a file the user can write."""
    directory = tmp_path / "ro"
    directory.mkdir()
    _create(directory / "sessions.db")
    directory.chmod(0o555)
    store = str(directory / "sessions.db")
    try:
        proc = subprocess.run(
            [*_unprivileged(), sys.executable, "-m", "runtime", "sessions", "--store", store],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        directory.chmod(0o755)
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"its directory {directory} is not writable" in proc.stderr
    assert "sessions.db-wal and sessions.db-shm beside the file" in proc.stderr


@pytest.mark.parametrize("kind", ["directory", "/dev/null", "fifo"])
async def test_a_path_that_is_no_regular_file_is_refused_saying_so(tmp_path, kind):
    """``--store /dev/null`` (no store, one might think) and a FIFO failed with SQLite's
    "disk I/O error", a directory with "cannot read the file: Is a directory"."""
    if kind == "directory":
        path = tmp_path / "sessions.db"
        path.mkdir()
    elif kind == "fifo":
        path = tmp_path / "sessions.db"
        os.mkfifo(path)
    else:
        path = Path(os.devnull)
    with pytest.raises(StoreError, match="give the path of a file") as info:
        await SQLiteStore.open(path)
    assert str(info.value).startswith(f"session store {path} is ")


# -- SIGKILL at a chosen statement of a host's saves -----------------------------------------

_KILLED_HOST_CHILD = """
import os, signal, sys
import trio
from actors.providers import ScriptedProvider
from actors.providers.scripted import current_step, tool_call, turn_index
from actors.stores import SQLiteStore
from runtime import Agent, Host, tool

class Killing:
    '''The store's connection, killing the process at its n-th statement, or in the
    middle of the rows an insert of several is given.'''

    def __init__(self, real, at):
        self.real, self.left = real, at

    def _tick(self):
        self.left -= 1
        if self.left == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def execute(self, sql, *args):
        self._tick()
        return self.real.execute(sql, *args)

    def executemany(self, sql, rows):
        def rows_then_kill():
            for row in rows:
                yield row
                self._tick()
        return self.real.executemany(sql, rows_then_kill())

    def __getattr__(self, name):
        return getattr(self.real, name)

@tool
async def lookup(key: str) -> str:
    "Look a key up."
    return f"value of {key}"

async def main(path, at):
    store = await SQLiteStore.open(path)
    store._conn = Killing(store._conn, at)
    def respond(request):  # call ids unique in the session, as a model's are
        step, turn = current_step(request.messages), turn_index(request.messages)
        if step == 0:
            return ["thinking first", *tool_call("lookup", {"key": "a"}, tool_call_id=f"a{turn}")]
        if step == 1:
            return tool_call("lookup", {"key": "b"}, tool_call_id=f"b{turn}")
        return ["both looked up"]

    agent = Agent(name="killed", provider=ScriptedProvider(responder=respond), tools=[lookup])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        for n in range(1000):
            await session.run(f"turn {n}")

trio.run(main, sys.argv[1], int(sys.argv[2]))
"""


def _providers_take(messages: list) -> None:
    """Every provider builds its next request from the history as it is."""
    from actors.providers.anthropic import map_messages as anthropic_messages
    from actors.providers.gemini import map_messages as gemini_messages
    from actors.providers.openai import map_messages as openai_messages
    from actors.providers.openai_responses import map_messages as responses_messages
    from tests.support.faults import (
        check_anthropic_body,
        check_openai_body,
        check_responses_body,
    )

    check_openai_body({"messages": openai_messages(None, messages)})
    check_responses_body({"input": responses_messages(messages)})
    _system, turns = anthropic_messages(None, messages)
    check_anthropic_body({"messages": turns})
    _system, contents = gemini_messages(None, messages)
    assert len(contents) >= len([m for m in messages if m.role == "user"])


@pytest.mark.parametrize("seed", range(3))
def test_a_host_killed_at_seeded_statements_of_its_saves_leaves_a_history_every_provider_takes(
    tmp_path, seed
):
    """SIGKILL at the n-th statement the store runs (between a save's BEGIN and COMMIT,
    or between the rows of its insert), n seeded, three times on one file: each time the
    file opens, its history is well formed (every call has its result, nothing to
    repair, no step half there), nothing saved before is lost, every provider builds a
    request from it, and a new host continues the session."""
    from runtime.history import repair
    from tests.support.faults import check_history

    rng = random.Random(seed)
    path = tmp_path / "sessions.db"
    previous: list = []
    for _ in range(3):
        at = rng.randint(1, 60)
        proc = subprocess.run(
            [sys.executable, "-c", _KILLED_HOST_CHILD, str(path), str(at)],
            capture_output=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]

        async def stored() -> list:
            store = await SQLiteStore.open(path)
            try:
                record = await store.load("s")
            finally:
                await store.aclose()
            return [] if record is None else list(record.messages)

        messages = trio.run(stored)
        check_history(messages)
        assert repair(messages) == messages
        assert [m.id for m in messages[: len(previous)]] == [m.id for m in previous]
        for i, message in enumerate(messages):  # each input kept has its answer kept
            if message.role == "user":
                assert messages[i + 1].role == "assistant"
        if messages:
            _providers_take(messages)
        previous = messages

    async def continued() -> list:
        provider = ScriptedProvider([["still here"]])
        async with Host.open(store=path, log_tap=False) as host:
            session = await host.open_session(Agent(name="next", provider=provider), session_id="s")
            assert (await session.run("and now?")).saved
            return list(session.messages)

    after = trio.run(continued)
    # The killed turn, left running by a dead process, is marked interrupted as the new
    # host loads it (runtime.liveness); nothing else of it changes.
    last = max((i for i, m in enumerate(previous) if m.role == "assistant"), default=None)
    if last is not None and after[last].interrupted and not previous[last].interrupted:
        previous[last] = attrs.evolve(previous[last], interrupted=True)
    assert after[: len(previous)] == previous and len(after) == len(previous) + 2
    _providers_take(after)


@pytest.mark.parametrize("option", ["--record", "--plugin"])
def test_recording_into_the_store_s_own_file_is_refused_before_anything_runs(
    tmp_path, capsys, option
):
    """``run --store sessions.db --record sessions.db`` (a slip): the event lines were
    appended to the database file, where SQLite's pages overwrote them or its checkpoint
    cut them off; the run said nothing and the recording was gone."""
    from runtime.app.cli import main

    path = tmp_path / "sessions.db"
    _create(path)
    before = path.read_bytes()
    target = str(tmp_path / "." / "sessions.db")
    value = target if option == "--record" else f"recorder:{target}-wal"
    code = main(["run", "--store", str(path), option, value, "--session", "a", "hi"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the event recording ") and "is the session store's" in err
    assert path.read_bytes() == before


def test_an_older_store_file_that_is_read_only_says_it_needs_upgrading(tmp_path):
    """A schema 5 file (every file of before the running answer's segments) that the
    user may not write: the open upgrades it, a write, and failed with SQLite's "attempt
    to write a readonly database" alone, where this file opened as schema 5 before the
    upgrade. It says what the write was and what to do, and leaves the file as it was."""
    from tests.test_stores import make_schema_5

    path = tmp_path / "sessions.db"
    _create(path)
    make_schema_5(path)
    before = path.read_bytes()
    path.chmod(0o444)
    try:
        proc = subprocess.run(
            [*_unprivileged(), sys.executable, "-m", "runtime", "sessions", "--store", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        path.chmod(0o644)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "is of schema 5, which this version upgrades to schema 6 as it opens it" in proc.stderr
    assert "the file is read-only" in proc.stderr
    assert path.read_bytes() == before
