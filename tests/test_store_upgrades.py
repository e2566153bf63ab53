"""Stores over time and under concurrency: a user upgrading, processes starting at once.

What is attacked: a store written by an older version of Axon opened by today's (its
rows read back, replayed and continued), a store of a newer version refused untouched,
several real processes opening one fresh store at the same instant, an upgrade opened
while workers of the older version write turns, an upgrade killed halfway, and two
deployments sharing one PostgreSQL database in two schemas.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import trio

from actors.providers import ScriptedProvider, anthropic, openai, openai_responses
from actors.providers.scripted import tool_call
from actors.stores import SQLiteStore
from actors.stores.postgres import PostgresStore, parse_url
from actors.stores.turns import TurnQueue
from runtime import Agent, Host, tool
from runtime.app.demo import demo_agent
from runtime.errors import StoreCorrupt, StoreError
from runtime.history import repair
from runtime.messages import AssistantMessage, UserMessage
from tests.support import wire_rules
from tests.support.pg import drop_schema, own_database, pg_connect
from tests.test_stores import make_schema_3, make_schema_5, schema_4_file

ROOT = Path(__file__).resolve().parents[1]


def _sql(schema: str, query: str, params: tuple = ()) -> list[tuple]:
    """``query`` in ``schema`` on a connection of its own (autocommit)."""
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {schema}")
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else []


def _make_pre_incarnation(schema: str) -> None:
    """Make the store in ``schema`` one of before incarnations (as 749b9ed left it: no
    ``incarnation`` column, no trigger writing it, no deletion marks' table nor trigger, no
    index of its messages' ids)."""
    _sql(schema, "DROP TRIGGER axon_sessions_incarnation_v1 ON axon_sessions")
    _sql(schema, "ALTER TABLE axon_sessions DROP COLUMN incarnation")
    _sql(schema, "DROP TABLE axon_deletions")
    _make_pre_deletion_trigger(schema)
    _make_pre_message_ids(schema)


def _make_pre_deletion_trigger(schema: str) -> None:
    """Make the store in ``schema`` one of before the trigger that moves the deletion
    marks (the marks' first version counted them in its delete's statement)."""
    _sql(schema, "DROP TRIGGER IF EXISTS axon_sessions_deletion_v1 ON axon_sessions")
    _sql(schema, "DROP FUNCTION axon_sessions_deletion_v1()")
    _sql(schema, "DROP INDEX IF EXISTS axon_deletions_by_mark")


def _make_pre_message_ids(schema: str) -> None:
    """Make the store in ``schema`` one of before the index of its messages' ids."""
    _sql(schema, "DROP INDEX axon_user_messages_by_id")
    _sql(schema, "DROP FUNCTION axon_message_id_v1(bytea)")


# -- PostgreSQL: an upgrade opened while a worker writes --------------------------------


def _make_pre_claim_token(schema: str) -> None:
    """Make the store in ``schema`` one of before claim tokens (84081b9): its turns table
    lacks a column, as every store of before a queue column was added."""
    _sql(schema, "ALTER TABLE axon_turns DROP COLUMN claim_token")


@pytest.mark.parametrize(
    "make_old", [_make_pre_incarnation, _make_pre_claim_token], ids=["sessions", "turns"]
)
async def test_an_upgrade_opened_during_a_fenced_save_waits_for_it_not_deadlocks(
    pg_url: str, make_old: Any
) -> None:
    """A worker's fenced save locks its turn's row (``FOR SHARE``), writes the session,
    then updates the turn's row. An opening that upgrades the store used to take the
    turns table (``CREATE INDEX IF NOT EXISTS`` locks it even when the index is there),
    then wait to alter a table the save held (the sessions table for a column it lacks,
    or the turns table itself, which the save's row lock holds too): the save's update
    of its turn then waited for the opening, PostgreSQL found the deadlock after a second
    and failed the opening (``deadlock detected``: a new worker that did not start). Now
    the opening takes both tables at once, gives way, and completes after the save."""
    _, schema = parse_url(pg_url)
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("s", 0, [UserMessage(content="a")])
        await queue.submit("s", "b")
        claim = await queue.claim("w")
        assert claim is not None
    finally:
        await queue.aclose()
        await store.aclose()
    make_old(schema)
    writer = psycopg.connect(parse_url(pg_url)[0])  # the save's transaction, step by step
    opened: list[PostgresStore] = []
    try:
        writer.execute(f"SET search_path TO {schema}")
        turn = claim.turn.turn_id
        writer.execute("SELECT 1 FROM axon_turns WHERE turn_id = %s FOR SHARE", (turn,))
        writer.execute("UPDATE axon_sessions SET version = version + 1 WHERE session_id = 's'")
        async with trio.open_nursery() as nursery:

            async def open_store() -> None:
                opened.append(await PostgresStore.open(pg_url))

            nursery.start_soon(open_store)
            with trio.fail_after(20):
                while not _sql(schema, "SELECT 1 FROM pg_locks WHERE NOT granted"):  # noqa: ASYNC110 - the server's state
                    await trio.sleep(0.01)  # the opening waits for a table the save holds

            def finish_save() -> None:
                writer.execute("UPDATE axon_turns SET saved = true WHERE turn_id = %s", (turn,))
                writer.commit()

            await trio.to_thread.run_sync(finish_save)
    finally:
        writer.close()
        for store in opened:
            await store.aclose()
    assert len(opened) == 1
    assert _complete(_schema_parts(pg_url))
    assert _sql(schema, "SELECT saved FROM axon_turns WHERE turn_id = %s", (turn,)) == [(True,)]


# -- SQLite: files of older schemas -----------------------------------------------------

FIXTURE_V2 = Path(__file__).parent / "fixtures" / "store_v2_waiting.sqlite"
"""Written by axon-runtime at 749b9ed (SQLite schema 2), as
``fixtures/make_store_v2_waiting.py`` says: session ``chat`` (two demo turns with a tool
call each), ``ask`` (a turn waiting for one approval), ``two`` (two calls, the first
denied, the second waiting)."""


@tool(needs_approval=True)
async def send_email(to: str) -> str:
    """Send an email."""
    return f"sent to {to}"


def _emailer() -> Agent:
    """The fixture's agent of ``ask``: its call, then its answer once decided."""
    steps = [
        [*tool_call("send_email", {"to": "ceo@example.com"}, tool_call_id="call_one")],
        ["Done: it is sent."],
    ]
    return Agent(provider=ScriptedProvider(steps), tools=[send_email])


async def test_a_schema_2_file_of_that_version_reads_back_and_replays_to_every_provider(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v2.db"
    shutil.copy(FIXTURE_V2, path)
    store = await SQLiteStore.open(path)
    try:
        listed = {info.session_id: info.message_count for info in await store.list_sessions()}
        assert listed == {"chat": 6, "ask": 2, "two": 2}
        for session_id in listed:
            record = await store.load(session_id)
            assert record is not None and record.incarnation == 0  # (not recorded)
            # the deletion marks gained: none counted before
            assert await store.version_and_deletions(session_id) == (record.version, 0)
            history = repair([*record.messages, UserMessage(content="next")])
            chat = openai.map_messages(None, history)
            assert wire_rules.chat_errors(chat) + wire_rules.sdk_errors("chat", chat) == []
            assert wire_rules.responses_errors(openai_responses.map_messages(history)) == []
            assert wire_rules.anthropic_errors(anthropic.map_messages(None, history)[1]) == []
    finally:
        await store.aclose()
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(demo_agent(), session_id="chat")
        result = await session.run("And in Rome?")
    assert result.finish_reason == "stop" and "Rome" in result.text
    assert len(session.messages) == 9


async def test_a_schema_2_files_waiting_turns_are_approved_by_todays_host(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    shutil.copy(FIXTURE_V2, path)
    async with Host.open(store=path, log_tap=False) as host:
        ask = await host.open_session(_emailer(), session_id="ask")
        (waiting,) = ask.pending
        assert (waiting.tool_name, waiting.input) == ("send_email", {"to": "ceo@example.com"})
        done = await ask.respond(waiting.approval_id, approved=True)
        two = await host.open_session(_emailer(), session_id="two")
        (second,) = two.pending  # the first call was denied under schema 2
        assert second.input == {"to": "b@example.com"}
        both = await two.respond(second.approval_id, approved=True)
    assert done is not None and (done.finish_reason, done.text) == ("stop", "Done: it is sent.")
    assert both is not None and both.finish_reason == "stop" and two.pending == ()
    store = await SQLiteStore.open(path)
    try:
        record = await store.load("two")
    finally:
        await store.aclose()
    assert record is not None
    assert [getattr(m, "output", None) for m in record.messages if m.role == "tool"] == [
        None,  # denied: no output, an error result
        "sent to b@example.com",
    ]


FIXTURE_V1 = Path(__file__).parent / "fixtures" / "store_v1.sqlite"
"""Written by the schema-1 SQLiteStore (see tests/test_stores.py)."""


def _child_env() -> dict[str, str]:
    """The environment of a child process: this tree's code first."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


def _kill_once_it_says(code: str, target: str, line: str) -> None:
    """Run ``code`` in a child process on ``target`` and SIGKILL it once it printed
    ``line`` (its upgrade's statements run, its transaction not committed)."""
    child = subprocess.Popen(
        [sys.executable, "-c", code, target], stdout=subprocess.PIPE, text=True, env=_child_env()
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == line
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


_OPEN_AT_ONCE = """
import sys, trio
from actors.stores import open_store
async def main(target):
    store = await open_store(target)
    await store.aclose()
print("ready", flush=True)
sys.stdin.readline()
trio.run(main, sys.argv[1])
print("opened", flush=True)
"""
"""A child that imports everything, says ``ready``, and opens the store given when told."""


def _open_at_once(target: str, processes: int = 4) -> list[tuple[int, str, str]]:
    """``processes`` real processes opening ``target`` at the same instant (each ready,
    then all told at once): each one's exit status, stdout and stderr."""
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AT_ONCE, target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_child_env(),
        )
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "ready\n"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        return [(child.wait(60), *child.communicate()) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


def _schema_3_file(path: Path) -> None:
    """A store file at ``path`` as schema 3 left one (before deletion marks): sessions
    ``a`` (versions 1 and 2) and ``b`` (version 1)."""

    async def write() -> None:
        store = await SQLiteStore.open(path)
        try:
            first = await store.save("a", 0, [UserMessage(content="a")])
            await store.save("a", 1, [UserMessage(content="a2")], expected_version=first)
            await store.save("b", 0, [UserMessage(content="b")])
        finally:
            await store.aclose()

    trio.run(write)
    make_schema_3(path)


def _schema_5_file(path: Path) -> None:
    """A store file at ``path`` as schema 5 left one (before the segments): session ``s``
    (a user message and an answer, version 1)."""

    async def write() -> None:
        store = await SQLiteStore.open(path)
        try:
            await store.save("s", 0, [UserMessage(content="a", id="u1"), AssistantMessage(id="x")])
        finally:
            await store.aclose()

    trio.run(write)
    make_schema_5(path)


@pytest.mark.parametrize(
    "start",
    [None, FIXTURE_V1, FIXTURE_V2, "v3", "v4", "v5"],
    ids=["fresh", "v1", "v2", "v3", "v4", "v5"],
)
def test_processes_opening_one_sqlite_file_at_once_all_open_it_made_or_upgraded_once(
    tmp_path: Path, start: Path | str | None
) -> None:
    path = tmp_path / "sessions.db"
    if start == "v3":
        _schema_3_file(path)
    elif start == "v4":
        schema_4_file(path)
    elif start == "v5":
        _schema_5_file(path)
    elif start is not None:
        shutil.copy(start, path)
    results = _open_at_once(str(path))
    assert [(status, out) for status, out, _ in results] == [(0, "opened\n")] * 4, results
    conn = sqlite3.connect(path)
    try:
        assert dict(conn.execute("SELECT key, value FROM axon_meta")) == {
            "magic": "axon-session-store",
            "schema_version": "6",
        }
        objects = sorted(conn.execute("SELECT type, name FROM sqlite_master"))
        columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
        versions = {row[0] for row in conn.execute("SELECT version FROM sessions")}
        marks = list(conn.execute("SELECT * FROM deletions"))
        unread = conn.execute(
            "SELECT count(*) FROM messages WHERE role = 'user' AND message_id IS NULL"
        ).fetchone()
    finally:
        conn.close()
    assert [name for kind, name in objects if kind != "index" or "autoindex" not in name] == [
        "sessions_by_caller",
        "sessions_by_update",
        "user_messages_by_id",
        "axon_meta",
        "deletions",
        "message_segments",
        "messages",
        "sessions",
    ]
    assert columns.count("version") == 1 and columns.count("incarnation") == 1
    # Migrated once: schema 1's sessions start at 1, schema 2's and 3's keep theirs.
    assert (
        versions
        == {
            None: set(),
            FIXTURE_V1: {1},
            FIXTURE_V2: {1, 2, 4},
            "v3": {1, 2},
            "v4": {1},
            "v5": {1},
        }[start]
    )
    assert marks == []  # none counted before the marks
    assert unread == (0,)  # every stored user message's id read into the index


_MIGRATE_THEN_HANG = """
import sys, time, trio
from actors.stores import sqlite
migrate = sqlite._migrate
def hanging(conn, version):
    migrate(conn, version)  # every statement run, the transaction not committed
    print("migrated", flush=True)
    time.sleep(600)
sqlite._migrate = hanging
trio.run(sqlite.SQLiteStore.open, sys.argv[1])
"""


@pytest.mark.parametrize(
    "start", [FIXTURE_V1, FIXTURE_V2, "v3", "v4", "v5"], ids=["v1", "v2", "v3", "v4", "v5"]
)
async def test_a_sqlite_upgrade_killed_before_its_commit_is_done_by_the_next_open(
    tmp_path: Path, start: Path | str
) -> None:
    path = tmp_path / "sessions.db"
    if start == "v3":
        await trio.to_thread.run_sync(_schema_3_file, path)
    elif start == "v4":
        await trio.to_thread.run_sync(schema_4_file, path)
    elif start == "v5":
        await trio.to_thread.run_sync(_schema_5_file, path)
    else:
        shutil.copy(start, path)
    before = sqlite3.connect(path)
    try:
        rows = sorted(before.execute("SELECT session_id, idx, body FROM messages"))
    finally:
        before.close()
    _kill_once_it_says(_MIGRATE_THEN_HANG, str(path), "migrated\n")
    store = await SQLiteStore.open(path)
    try:
        for info in await store.list_sessions():
            record = await store.load(info.session_id)
            assert record is not None and record.version >= 1
        await store.save("after", 0, [UserMessage(content="a")], expected_version=0)
    finally:
        await store.aclose()
    conn = sqlite3.connect(path)
    try:
        assert dict(conn.execute("SELECT key, value FROM axon_meta"))["schema_version"] == "6"
        after = sorted(conn.execute("SELECT session_id, idx, body FROM messages"))
    finally:
        conn.close()
    assert [row for row in after if row[0] != "after"] == rows


# -- PostgreSQL: processes at once, upgrades killed, newer schemas ------------------------

_STORE_TRIGGERS = [
    ("axon_sessions", "axon_sessions_caller_update_v1"),
    ("axon_sessions", "axon_sessions_caller_v1"),
    ("axon_sessions", "axon_sessions_deletion_v1"),
    ("axon_sessions", "axon_sessions_incarnation_v1"),
    ("axon_turns", "axon_turns_head_insert_v1"),
    ("axon_turns", "axon_turns_head_v1"),
]


def _schema_parts(url: str) -> dict[str, Any]:
    """What the store in ``url``'s schema has: its triggers, its functions (with how many
    of each name), its marker rows, whether ``axon_sessions`` has ``incarnation``, and
    whether the deletion marks' table is there."""
    import psycopg as pg

    libpq, schema = parse_url(url)
    with pg.connect(libpq, autocommit=True) as conn:
        triggers = conn.execute(
            "SELECT c.relname, t.tgname FROM pg_trigger AS t JOIN pg_class AS c "
            "ON c.oid = t.tgrelid WHERE c.relnamespace = %s::regnamespace AND NOT t.tgisinternal "
            "ORDER BY 1, 2",
            (schema,),
        ).fetchall()
        functions = conn.execute(
            "SELECT proname, count(*) FROM pg_proc WHERE pronamespace = %s::regnamespace "
            "GROUP BY 1 ORDER BY 1",
            (schema,),
        ).fetchall()
        marker = conn.execute(f"SELECT key, value FROM {schema}.axon_meta ORDER BY 1").fetchall()
        (incarnation,) = conn.execute(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = %s "
            "AND table_name = 'axon_sessions' AND column_name = 'incarnation'",
            (schema,),
        ).fetchone()
        (deletions,) = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = %s::regnamespace "
            "AND relname = 'axon_deletions' AND relkind = 'r'",
            (schema,),
        ).fetchone()
        (by_mark,) = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = %s::regnamespace "
            "AND relname = 'axon_deletions_by_mark' AND relkind = 'i'",
            (schema,),
        ).fetchone()
    return {
        "triggers": triggers,
        "functions": functions,
        "marker": marker,
        "incarnation": incarnation,
        "deletions": deletions + by_mark,
    }


def _complete(parts: dict[str, Any]) -> bool:
    """Whether :func:`_schema_parts` shows a complete store, each part once."""
    return (
        parts["triggers"] == _STORE_TRIGGERS
        and {count for _, count in parts["functions"]} == {1}
        and parts["marker"] == [("magic", "axon-session-store"), ("schema_version", "1")]
        and parts["incarnation"] == 1
        and parts["deletions"] == 2  # the marks' table and its index
    )


@pytest.mark.parametrize("schema", ["axon_t", "public"])
def test_processes_opening_one_fresh_postgres_database_at_once_make_its_schema_once(
    schema: str,
) -> None:
    with own_database("UTF8") as url:
        url = url if schema == "axon_t" else url.removesuffix("?schema=axon_t")
        results = _open_at_once(url)
        assert [(status, out) for status, out, _ in results] == [(0, "opened\n")] * 4, results
        parts = _schema_parts(url if "?schema=" in url else url + "?schema=public")
    assert _complete(parts), parts


_WRITE_TURNS = """
import os, sys, trio
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.messages import AssistantMessage, TextPart, UserMessage
async def main(url, stop):
    store = await PostgresStore.open(url)
    queue = TurnQueue(store, lease=30.0, max_attempts=3)
    print("ready", flush=True)
    done, plain = 0, 0
    while not os.path.exists(stop):
        turn = await queue.submit(f"w{done}", "hi")
        claim = await queue.claim("writer")
        assert claim is not None and claim.turn.turn_id == turn.turn_id
        said = [UserMessage(content="hi"), AssistantMessage(content=(TextPart(text="ok", step=0),))]
        with queue.fenced(claim):
            await store.save(f"w{done}", 0, said)
        assert await queue.finish(claim, status="done")
        plain = await store.save("plain", done, said[:1], expected_version=plain)
        done += 1
        print(done, flush=True)
    await queue.aclose()
    await store.aclose()
trio.run(main, sys.argv[1], sys.argv[2])
"""
"""A worker's writes without reading a session (so its code runs on a store of before
incarnations): a turn submitted, claimed, saved fenced and finished, a plain save, over
and over until the file ``stop`` exists; prints how many it finished."""


def test_an_old_schema_opened_by_two_processes_while_a_third_writes_turns(
    pg_url: str, tmp_path: Path
) -> None:
    stop = tmp_path / "stop"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITE_TURNS, pg_url, str(stop)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_child_env(),
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        _make_pre_incarnation(parse_url(pg_url)[1])  # as a store of 749b9ed, in use
        assert _schema_parts(pg_url)["incarnation"] == _schema_parts(pg_url)["deletions"] == 0
        results = _open_at_once(pg_url, processes=2)
        before = int(writer.stdout.readline())
        while int(writer.stdout.readline()) < before + 5:  # writes go on after
            pass
        stop.touch()
        _, errors = writer.communicate(timeout=60)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert [(status, out) for status, out, _ in results] == [(0, "opened\n")] * 2, results
    assert writer.returncode == 0, errors
    assert _complete(_schema_parts(pg_url))


async def test_a_postgres_store_of_before_deletion_marks_gains_them_on_open(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url)
    try:
        kept = await store.save("s", 0, [UserMessage(content="a")])
    finally:
        await store.aclose()
    _sql(parse_url(pg_url)[1], "DROP TABLE axon_deletions")  # as a store of before them
    _make_pre_deletion_trigger(parse_url(pg_url)[1])
    store = await PostgresStore.open(pg_url)
    try:
        assert await store.version_and_deletions("s") == (kept, 0)  # none counted before
        await store.delete("s")
        assert await store.version_and_deletions("s") == (0, 1)
    finally:
        await store.aclose()


async def test_a_postgres_store_of_the_first_deletion_marks_gains_their_trigger_on_open(
    pg_url: str,
) -> None:
    # The marks' first version counted them in its own delete statement: a process of
    # before them (a bare DELETE) moved none. Opened by this version, every delete does.
    store = await PostgresStore.open(pg_url)
    await store.aclose()
    schema = parse_url(pg_url)[1]
    _make_pre_deletion_trigger(schema)
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("s", 0, [UserMessage(content="a")])
        _sql(schema, "DELETE FROM axon_sessions WHERE session_id = 's'")  # an old process's
        assert await store.version_and_deletions("s") == (0, 1)
        assert _complete(_schema_parts(pg_url))
    finally:
        await store.aclose()


async def test_a_postgres_store_of_before_the_save_v6_gains_it_and_keeps_v5(pg_url: str) -> None:
    # A schema the version before made has axon_save_v5, not v6 (its first save's mark in
    # the save): opened by this version it gains v6, keeps v5, and a process of before
    # still saves through its own.
    from actors.stores.postgres_calls import SAVE_FUNCTION_NAME, SAVE_V5_FUNCTION_NAME

    store = await PostgresStore.open(pg_url)
    await store.aclose()
    schema = parse_url(pg_url)[1]
    _sql(schema, f"DROP FUNCTION {SAVE_FUNCTION_NAME}")  # as the version before left it
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("s", 0, [UserMessage(content="a")], expected_version=0, absent_mark=0)
        old = _sql(
            schema,
            f"SELECT o_status FROM {SAVE_V5_FUNCTION_NAME}('t', 0, 0, NULL, ARRAY[0], "
            "ARRAY['user'], ARRAY[%s]::bytea[], NULL, NULL, NULL, false, NULL, 'axon_turns', "
            "false, NULL)",
            (b'{"role": "user", "content": "b"}',),
        )
        parts = _schema_parts(pg_url)
        assert (await store.load("s")) is not None and (await store.load("t")) is not None
    finally:
        await store.aclose()
    assert old == [("ok",)]
    names = {name for name, _ in parts["functions"]}
    assert {SAVE_FUNCTION_NAME, SAVE_V5_FUNCTION_NAME} <= names and _complete(parts)


async def test_a_postgres_store_of_before_segment_calls_gains_them_and_keeps_the_old_ones(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A schema the version before made has axon_save_v6, axon_claim_v4 and
    # axon_save_next_v6, not the versions that take a grown save's segments and fold a
    # continuation's heads: opened by this version it gains them and keeps the old ones,
    # which a process of before calls (its whole save of a session this version left a
    # head in: written, read back folded where no head is left).
    from actors.stores import postgres
    from actors.stores.postgres_calls import (
        CLAIM_FUNCTION_NAME,
        CLAIM_V4_FUNCTION_NAME,
        SAVE_FUNCTION_NAME,
        SAVE_NEXT_FUNCTION_NAME,
        SAVE_NEXT_V6_FUNCTION_NAME,
        SAVE_V6_FUNCTION_NAME,
    )
    from runtime.messages import ToolCallPart

    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    store = await PostgresStore.open(pg_url)
    await store.aclose()
    schema = parse_url(pg_url)[1]
    for name in (CLAIM_FUNCTION_NAME, SAVE_FUNCTION_NAME, SAVE_NEXT_FUNCTION_NAME):
        _sql(schema, f"DROP FUNCTION {name}")  # as the version before left it
    calls = tuple(
        ToolCallPart(tool_call_id=f"c{i}", tool_name="t", input={"i": i}, step=i) for i in range(3)
    )
    user = UserMessage(content="go", id="u")
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, [user, AssistantMessage(content=calls[:1], id="a")])
        grown = AssistantMessage(content=calls, id="a")
        version = await store.save("s", 1, [grown], expected_version=version, grown=(0,))
        segments = _sql(schema, "SELECT count(*) FROM axon_message_segments")
        assert (await store.load("s")) is not None
        old = _sql(
            schema,
            f"SELECT o_status FROM {SAVE_V6_FUNCTION_NAME}('s', 1, %s, NULL, ARRAY[1], "
            "ARRAY['assistant'], ARRAY[%s]::bytea[], NULL, NULL, NULL, false, NULL, "
            "'axon_turns', false, NULL, NULL)",
            (version, b'{"role": "assistant", "content": [], "id": "b"}'),
        )
        after = await store.load("s")
        parts = _schema_parts(pg_url)
    finally:
        await store.aclose()
    assert segments == [(1,)] and old == [("ok",)]
    assert after is not None and after.messages[1] == AssistantMessage(content=(), id="b")
    names = {name for name, _ in parts["functions"]}
    assert {
        CLAIM_FUNCTION_NAME,
        CLAIM_V4_FUNCTION_NAME,
        SAVE_FUNCTION_NAME,
        SAVE_V6_FUNCTION_NAME,
        SAVE_NEXT_FUNCTION_NAME,
        SAVE_NEXT_V6_FUNCTION_NAME,
    } <= names and _complete(parts)


async def test_a_postgres_store_of_before_message_ids_indexes_the_messages_it_holds(
    pg_url: str,
) -> None:
    """The index (of the user messages' ids only) is built on open over the messages
    stored before it (one whose JSON holds a ``\\u0000`` too, which the index holds as
    no id: read the long way), and the messages saved after it are in it."""
    store = await PostgresStore.open(pg_url)
    nul = UserMessage(content="a\x00b", id="m_nul")
    try:
        await store.save("s", 0, [UserMessage(content="a", id="m_a")])
        await store.save("n", 0, [nul])
    finally:
        await store.aclose()
    schema = parse_url(pg_url)[1]
    _make_pre_message_ids(schema)
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 1, [UserMessage(content="b", id="m_b")])
        assert version
        assert await store.has_user_messages("s", {"m_a", "m_b", "m_c"}) == {"m_a", "m_b"}
        assert await store.has_user_messages("n", {"m_nul", "m_a"}) == {"m_nul"}
    finally:
        await store.aclose()
    indexes = _sql(
        schema,
        "SELECT indexname, indexdef FROM pg_indexes "
        "WHERE tablename = 'axon_messages' AND schemaname = current_schema()",
    )
    assert dict(indexes)["axon_user_messages_by_id"].endswith("WHERE (role = 'user'::text)")


def test_the_message_id_index_builds_in_parallel(pg_url: str) -> None:
    """PostgreSQL builds a large table's index with parallel workers, which cannot start
    the subtransaction of the id function's exception block: marked ``PARALLEL SAFE``,
    the build (an upgrade of a store holding many messages) failed."""
    from actors.stores.postgres_tables import _MESSAGE_ID_SCHEMA

    trio.run(_save_one, pg_url)
    schema = parse_url(pg_url)[1]
    _make_pre_message_ids(schema)
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute("ALTER TABLE axon_messages SET (parallel_workers = 2)")
        conn.execute("SET max_parallel_maintenance_workers = 2")
        for statement in _MESSAGE_ID_SCHEMA:
            conn.execute(statement)


async def _save_one(pg_url: str) -> None:
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("s", 0, [UserMessage(content="a", id="m_a")])
    finally:
        await store.aclose()


_UPGRADE_THEN_HANG = """
import sys, time, trio
from actors.stores import postgres_schema
add = postgres_schema._add_session_columns
def hanging(conn, schema):
    add(conn, schema)  # the column added, the transaction not committed
    print("upgrading", flush=True)
    time.sleep(600)
postgres_schema._add_session_columns = hanging
from actors.stores.postgres import PostgresStore
trio.run(PostgresStore.open, sys.argv[1])
"""


async def test_a_postgres_upgrade_killed_before_its_commit_is_done_by_the_next_open(
    pg_url: str,
) -> None:
    store = await PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, [UserMessage(content="a")])
    finally:
        await store.aclose()
    _make_pre_incarnation(parse_url(pg_url)[1])
    _kill_once_it_says(_UPGRADE_THEN_HANG, pg_url, "upgrading\n")
    store = await PostgresStore.open(pg_url)  # (the killed one's backend rolled back)
    try:
        record = await store.load("s")
        assert record is not None and record.version == version and record.incarnation == 0
        assert await store.save("t", 0, [UserMessage(content="b")], expected_version=0) > 0
    finally:
        await store.aclose()
    assert _complete(_schema_parts(pg_url))


async def test_a_postgres_schema_of_a_newer_version_is_refused_naming_both_untouched(
    pg_url: str,
) -> None:
    store = await PostgresStore.open(pg_url)
    await store.aclose()
    schema = parse_url(pg_url)[1]
    _make_pre_incarnation(schema)  # something an opening of this version would add
    _sql(schema, "UPDATE axon_meta SET value = '2' WHERE key = 'schema_version'")
    before = _schema_parts(pg_url)
    with pytest.raises(StoreError, match=r"schema version 2, newer than the 1 "):
        await PostgresStore.open(pg_url)
    assert _schema_parts(pg_url) == before


async def test_a_postgres_schema_version_that_is_no_number_is_refused_as_damaged(
    pg_url: str,
) -> None:
    store = await PostgresStore.open(pg_url)
    await store.aclose()
    schema = parse_url(pg_url)[1]
    _sql(schema, "UPDATE axon_meta SET value = 'two' WHERE key = 'schema_version'")
    with pytest.raises(StoreCorrupt, match="schema_version 'two' is not a version number"):
        await PostgresStore.open(pg_url)


# -- PostgreSQL: two deployments in two schemas of one database ---------------------------


async def test_two_schemas_of_one_database_share_no_rows_turns_or_session_locks(
    pg_url: str,
) -> None:
    other_url = pg_url.rsplit("?schema=", 1)[0] + f"?schema={parse_url(pg_url)[1]}_b"
    one = await PostgresStore.open(pg_url)
    two = await PostgresStore.open(other_url)
    queue_one, queue_two = TurnQueue(one), TurnQueue(two)
    try:
        await one.save("s", 0, [UserMessage(content="one's")])
        assert await two.load("s") is None and await two.list_sessions() == []
        await two.save("s", 0, [UserMessage(content="two's")], expected_version=0)
        await queue_one.submit("s", "for one", turn_id="turn_same")
        assert await queue_two.claim("w") is None  # one's turn is not two's to run
        await queue_two.submit("s", "for two", turn_id="turn_same")  # its own row
        # One's session lock held (a submit or a claim of "s" in progress there): two's
        # submit to its own "s" does not wait for it.
        with pg_connect() as held:
            held.execute("BEGIN")
            held.execute(f"SET LOCAL search_path TO {one.schema}")
            held.execute(
                "SELECT pg_advisory_xact_lock("
                "hashtextextended('axon_turns:' || current_schema() || ':' || 's', 0))"
            )
            with trio.fail_after(10):
                await queue_two.submit("s", "again")
            held.execute("ROLLBACK")
        claim = await queue_two.claim("w")
        assert claim is not None and claim.turn.turn_id == "turn_same"
        assert claim.turn.input == "for two"
        await one.delete("s")
        kept = await two.load("s")
        assert kept is not None and [m.text for m in kept.messages] == ["two's"]
    finally:
        for queue in (queue_one, queue_two):
            await queue.aclose()
        for store in (one, two):
            await store.aclose()
        drop_schema(parse_url(other_url)[1])


def test_a_role_that_owns_its_schema_but_cannot_create_schemas_opens_the_store() -> None:
    """The usual least-privilege setup: an administrator creates the schema for the
    application's role, which may create nothing else in the database. Every opening
    ran ``CREATE SCHEMA IF NOT EXISTS``, which PostgreSQL refuses such a role before it
    looks whether the schema exists: the store could not be opened at all."""
    role = f"axon_r_{uuid.uuid4().hex[:12]}"
    with own_database("UTF8") as url:
        libpq = url.removesuffix("?schema=axon_t")
        with psycopg.connect(libpq, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
            try:
                admin.execute(f"CREATE SCHEMA app AUTHORIZATION {role}")
                parts = urlsplit(libpq)
                host = parts.netloc.rsplit("@", 1)[-1]
                as_role = urlunsplit(parts._replace(netloc=f"{role}@{host}", query="schema=app"))

                async def use() -> None:
                    store = await PostgresStore.open(as_role)
                    try:
                        await store.save("s", 0, [UserMessage(content="a")])
                    finally:
                        await store.aclose()
                    await (await PostgresStore.open(as_role)).aclose()  # and again

                trio.run(use)
            finally:
                admin.execute("DROP SCHEMA IF EXISTS app CASCADE")
                admin.execute(f"DROP ROLE {role}")


def test_a_role_with_only_data_privileges_opens_a_store_that_is_up_to_date() -> None:
    """Tables made by their owner (a migration role), the application's role granted
    only reads and writes of them: an opening that finds everything there creates
    nothing. It ran ``CREATE TABLE IF NOT EXISTS`` and ``CREATE INDEX IF NOT EXISTS`` for
    every table and index, which PostgreSQL refuses such a role before it looks
    (``permission denied for schema``): the store could not be opened by it."""
    role = f"axon_r_{uuid.uuid4().hex[:12]}"
    with own_database("UTF8") as url:
        trio.run(_open_and_close, url)  # made by the owner
        libpq = url.removesuffix("?schema=axon_t")
        with psycopg.connect(libpq, autocommit=True) as admin:
            admin.execute(f"CREATE ROLE {role} LOGIN")
            try:
                admin.execute(f"GRANT USAGE ON SCHEMA axon_t TO {role}")
                admin.execute(
                    f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA axon_t TO {role}"
                )
                admin.execute(f"GRANT USAGE, UPDATE ON ALL SEQUENCES IN SCHEMA axon_t TO {role}")
                parts = urlsplit(url)
                host = parts.netloc.rsplit("@", 1)[-1]
                as_role = urlunsplit(parts._replace(netloc=f"{role}@{host}"))

                async def use() -> None:
                    store = await PostgresStore.open(as_role)
                    queue = TurnQueue(store)
                    try:
                        await store.save("s", 0, [UserMessage(content="a")])
                        await queue.submit("s", "b")
                        assert await queue.claim("w") is not None
                    finally:
                        await queue.aclose()
                        await store.aclose()

                trio.run(use)
            finally:
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE {role}")


async def _open_and_close(url: str) -> None:
    await (await PostgresStore.open(url)).aclose()


async def test_an_upgrade_whose_tables_stay_in_use_fails_saying_so_and_changes_nothing(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction that keeps reading the sessions table (a report, a forgotten
    ``psql``) holds the upgrade off: it tries again for ``UPGRADE_WAIT`` seconds, letting
    every other query through between its tries, then fails naming the cause (it used to
    queue its exclusive lock behind that transaction, and every save of the deployment
    behind its lock, for as long as the transaction lasted)."""
    from actors.stores import postgres_schema

    await _open_and_close(pg_url)
    schema = parse_url(pg_url)[1]
    _make_pre_incarnation(schema)
    monkeypatch.setattr(postgres_schema, "UPGRADE_WAIT", 0.5)
    with pg_connect() as reader:
        reader.execute("BEGIN")
        reader.execute(f"SELECT count(*) FROM {schema}.axon_sessions")
        with pytest.raises(StoreError, match=r"found them in use for 0\.5 s"):
            await PostgresStore.open(pg_url)
        assert _schema_parts(pg_url)["incarnation"] == 0
        reader.execute("ROLLBACK")
    await _open_and_close(pg_url)
    assert _complete(_schema_parts(pg_url))


# -- PostgreSQL: what an opening runs ----------------------------------------------------

_OLD_STORES = {
    "up to date": [],
    "before incarnations": [
        "DROP TRIGGER axon_sessions_incarnation_v1 ON axon_sessions",
        "ALTER TABLE axon_sessions DROP COLUMN incarnation",
    ],
    "before claim tokens": ["ALTER TABLE axon_turns DROP COLUMN claim_token"],
    "before callers": [
        "DROP TRIGGER axon_sessions_caller_v1 ON axon_sessions",
        "DROP TRIGGER axon_sessions_caller_update_v1 ON axon_sessions",
        "ALTER TABLE axon_sessions DROP COLUMN caller",
    ],
    "before waiting turns": [
        "ALTER TABLE axon_turns DROP CONSTRAINT axon_turns_status_check, ADD CONSTRAINT "
        "axon_turns_status_check CHECK (status IN ('queued', 'running', 'done', 'failed', "
        "'cancelled'))",
        "ALTER TABLE axon_turns DROP COLUMN expires_at, DROP COLUMN resumes, "
        "DROP COLUMN resume_pending",
    ],
    "before head triggers": [
        "DROP TRIGGER axon_turns_head_v1 ON axon_turns",
        "DROP TRIGGER axon_turns_head_insert_v1 ON axon_turns",
        "ALTER TABLE axon_turns DROP COLUMN head",
    ],
    "with the one head trigger": ["DROP TRIGGER axon_turns_head_insert_v1 ON axon_turns"],
    "without a queue index": ["DROP INDEX axon_turns_by_session"],
}
"""Stores of before, each as an older Axon left it (the statements that make one)."""

_ALTERS_A_TABLE = re.compile(
    r"^\s*(ALTER TABLE|CREATE (UNIQUE )?INDEX|CREATE (OR REPLACE )?TRIGGER|DROP TRIGGER"
    r"|UPDATE axon_turns)",
    re.IGNORECASE,
)


@pytest.mark.parametrize("old", list(_OLD_STORES))
async def test_an_opening_alters_existing_tables_only_once_it_holds_them_all(
    pg_url: str, old: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever an older store lacks, the opening alters none of its tables before it
    holds every table it alters, and only those (the deadlock above, for each kind of
    upgrade, and for any a later version adds without telling ``_tables_to_alter``); an
    opening of a store that lacks nothing locks nothing."""
    await _open_and_close(pg_url)
    schema = parse_url(pg_url)[1]
    for statement in _OLD_STORES[old]:
        _sql(schema, statement)
    ran: list[str] = []
    connect = psycopg.connect

    def recording(*args: Any, **kwargs: Any) -> Any:
        conn = connect(*args, **kwargs)
        execute = conn.execute

        def execute_recorded(query: Any, *rest: Any, **more: Any) -> Any:
            ran.append(str(query))
            return execute(query, *rest, **more)

        conn.execute = execute_recorded
        return conn

    monkeypatch.setattr(psycopg, "connect", recording)
    store = await PostgresStore.open(pg_url)
    monkeypatch.undo()
    await store.aclose()
    altering = [n for n, statement in enumerate(ran) if _ALTERS_A_TABLE.match(statement)]
    locks = [n for n, statement in enumerate(ran) if statement.startswith("LOCK TABLE")]
    if old == "up to date":
        assert altering == locks == []
    else:
        assert altering, ran
        assert locks and locks[0] < altering[0], ran
        altered = (
            "axon_sessions" if old in ("before incarnations", "before callers") else "axon_turns"
        )
        assert ran[locks[0]] == f"LOCK TABLE {altered} IN ACCESS EXCLUSIVE MODE"
    assert _complete(_schema_parts(pg_url))
