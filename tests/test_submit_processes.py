"""Submits of front ends in two real processes at once, into the turn queue's caps.

A submit is one call of the submit's server-side function
(:data:`actors.stores.postgres_calls.SUBMIT_FUNCTION`): its locks (the session's before
its count, the queue's after its insert) and its counts, each a statement of its own
after its lock, are what keep racing submits of a fleet under the caps. Here each process
runs its submits at once, every one held inside its call (a trigger of the test's waits
on a lock the test holds, before the row's insert) until all of both processes are
in flight; once let go, exactly the cap is queued and the rest refused. A process of the
version before (its submit a transaction of statements: here the test's own copy of it)
beside one of this version counts the other's rows the same way (a rolling deploy).
Real PostgreSQL (the run's own).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.stores.postgres import PostgresStore
from actors.stores.postgres_calls import SUBMIT_FUNCTION_NAME
from actors.stores.turns import TurnQueue
from runtime.errors import QueueFull
from tests.support.pg import pg_connect

REPO = str(Path(__file__).resolve().parents[1])
STALL = 4244
"""The advisory lock the test holds and its trigger waits for."""

_CHILD = """
import json, sys, trio
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.errors import QueueFull

url, name, n, same, per_session, total = sys.argv[1:7]

def cap(text):
    return None if text == "-" else int(text)

async def main():
    store = await PostgresStore.open(url)
    queue = TurnQueue(store, max_queued_per_session=cap(per_session), max_queued=cap(total))
    got = []

    async def submit(i):
        session = "s" if same == "same" else f"s-{name}-{i}"
        try:
            await queue.submit(session, f"hi {i}")
        except QueueFull as err:
            got.append(err.scope)
        else:
            got.append("queued")

    await queue.submit("warm", "open the connections", idempotency_key=name)
    print("ready", flush=True)
    sys.stdin.readline()
    async with trio.open_nursery() as nursery:
        for i in range(int(n)):
            nursery.start_soon(submit, i)
    await queue.aclose()
    await store.aclose()
    print(json.dumps(got), flush=True)

trio.run(main)
"""


def _stall(conn: Any) -> None:
    """A trigger of the test before every insert of a turn of a session named ``s...``
    that waits until the test lets go of :data:`STALL` (the warm-up's is not held)."""
    conn.execute(
        f"""CREATE FUNCTION procs_stall() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_lock_shared({STALL});
            PERFORM pg_advisory_unlock_shared({STALL});
            RETURN NEW;
        END $$"""
    )
    conn.execute(
        "CREATE TRIGGER procs_stall BEFORE INSERT ON axon_turns FOR EACH ROW "
        "WHEN (NEW.session_id LIKE 's%') EXECUTE FUNCTION procs_stall()"
    )


def _waiting(conn: Any, schema: str) -> int:
    """Backends waiting for the stall, session ``s``'s lock or the queue's, of ``schema``."""
    (count,) = conn.execute(
        """WITH k (key) AS (VALUES (hashtextextended('axon_turns:' || %s || ':s', 0)),
            (hashtextextended('axon_turns:' || %s, 0)), (%s::bigint))
        SELECT count(*) FROM pg_locks AS l, k
        WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objsubid = 1
            AND l.classid = ((k.key >> 32) & 4294967295)::oid
            AND l.objid = (k.key & 4294967295)::oid""",
        (schema, schema, STALL),
    ).fetchone()
    return int(count)


async def _until_waiting(conn: Any, schema: str, n: int) -> None:
    while True:
        if _waiting(conn, schema) >= n:
            return
        await trio.sleep(0.01)


def _spawn(url: str, name: str, n: int, same: bool, caps: tuple[str, str]) -> Any:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, name, str(n), "same" if same else "many", *caps],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, "PYTHONDONTWRITEBYTECODE": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def _race(pg_url: str, same: bool, caps: tuple[str, str], n: int) -> tuple[list[str], int]:
    """Two processes' ``n`` submits each (to one session, or each to its own), all held
    in their calls until every one is in flight, then let go: what each got (``queued``
    or the refusal's scope), and the turns queued after."""
    store = await PostgresStore.open(pg_url)  # (the schema made)
    await store.aclose()
    schema = pg_url.rsplit("schema=", 1)[1]
    procs = []
    got: list[str] = []
    with pg_connect() as holder, pg_connect() as look:
        holder.execute(f"SET search_path TO {schema}")
        try:
            procs = [_spawn(pg_url, name, n, same, caps) for name in ("a", "b")]
            for proc in procs:
                assert (await trio.to_thread.run_sync(proc.stdout.readline)).strip() == "ready"
            _stall(holder)
            holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
            for proc in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            with trio.fail_after(60):
                # each one waits for the stall, or for a lock one it holds holds
                await _until_waiting(look, schema, 2 * n)
            holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
            for proc in procs:
                out, err = await trio.to_thread.run_sync(proc.communicate, None, 60)
                assert proc.returncode == 0, err
                got += json.loads(out.strip().splitlines()[-1])
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        (queued,) = look.execute(
            f"SELECT count(*) FROM {schema}.axon_turns "
            "WHERE status = 'queued' AND session_id LIKE 's%'"
        ).fetchone()
    return sorted(got), int(queued)


async def test_two_processes_submitting_at_once_to_one_session_queue_its_cap(pg_url):
    got, queued = await _race(pg_url, same=True, caps=("3", "-"), n=4)
    assert got == ["queued"] * 3 + ["session"] * 5
    assert queued == 3


async def test_two_processes_submitting_at_once_to_many_sessions_queue_the_total_cap(pg_url):
    # (the warm-up's turns count too: 2 of the 7)
    got, queued = await _race(pg_url, same=False, caps=("-", "7"), n=4)
    assert got == ["queued"] * 5 + ["total"] * 3
    assert queued == 5


async def test_two_processes_submitting_at_once_under_both_caps_pass_neither(pg_url):
    # the total (5, the warm-ups' 2 of them) leaves 3, under the session's 4
    got, queued = await _race(pg_url, same=True, caps=("4", "5"), n=4)
    assert got == ["queued"] * 3 + ["total"] * 5
    assert queued == 3


@pytest.mark.parametrize("same", [True, False])
async def test_a_process_of_before_and_one_of_now_submitting_at_once_keep_the_caps(pg_url, same):
    """A rolling deploy: a front end of the version before (its transaction, here the
    test's, holding its session's lock and then the queue's) and one of this version (the
    function, in the test's process) submit at once; the function's counts wait for the
    other's locks and count its rows: never more than a cap queued."""
    import psycopg

    store = await PostgresStore.open(pg_url)
    per_session, total = (3, 100) if same else (100, 3)
    queue = TurnQueue(store, max_queued_per_session=per_session, max_queued=total)
    schema = pg_url.rsplit("schema=", 1)[1]
    results: list[bool] = []
    try:
        with psycopg.connect(store.libpq) as old, pg_connect() as look:
            old.execute(f"SET search_path TO {schema}")
            old.commit()
            # the old process's submit holds both its locks, its row written, uncommitted
            assert _submit_of_before(old, "s" if same else "s-old", per_session, total)

            async def new(i: int) -> None:
                try:
                    await queue.submit("s" if same else f"s-new-{i}", f"hi {i}")
                except QueueFull:
                    results.append(False)
                else:
                    results.append(True)

            with trio.fail_after(60):
                async with trio.open_nursery() as nursery:
                    for i in range(4):
                        nursery.start_soon(new, i)
                    # every new one waits for a lock the old one holds
                    await _until_waiting(look, schema, 4)
                    old.commit()
            (queued,) = look.execute(
                f"SELECT count(*) FROM {schema}.axon_turns WHERE status = 'queued'"
            ).fetchone()
    finally:
        await queue.aclose()
        await store.aclose()
    assert queued == 3 and results.count(True) == 2 and results.count(False) == 2


def _submit_of_before(conn: Any, session_id: str, cap: int, total: int) -> bool:
    """A capped submit as a process of the version before made it, its statements (the
    session's lock, its count, the insert, the queue's lock, its count) in the
    transaction ``conn`` begins, left uncommitted (its locks held); whether it would be
    queued."""
    conn.execute(
        "SELECT pg_advisory_xact_lock("
        "hashtextextended('axon_turns:' || current_schema() || ':' || %s, 0))",
        (session_id,),
    )
    (count,) = conn.execute(
        """SELECT count(*) FROM (SELECT 1 FROM axon_turns
        WHERE session_id >= %s AND session_id <= %s AND status = 'queued'
        ORDER BY session_id, seq LIMIT %s) AS q""",
        (session_id, session_id, cap),
    ).fetchone()
    if count >= cap:
        return False
    conn.execute(
        "INSERT INTO axon_turns (turn_id, session_id, input, input_hash) "
        "VALUES ('old-1', %s, '\"old\"', 'h')",
        (session_id,),
    )
    conn.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('axon_turns:' || current_schema(), 0))"
    )
    (count,) = conn.execute(
        """SELECT count(*) FROM (SELECT 1 FROM axon_turns
        WHERE status = 'queued' ORDER BY seq LIMIT %s) AS q""",
        (total + 1,),
    ).fetchone()
    return bool(count <= total)


async def test_a_store_of_before_the_submit_function_gains_it_on_open(pg_url):
    """A schema the version before made has no submit function (its processes submit in
    transactions of statements, on the same tables): opened by this version it gains it."""
    store = await PostgresStore.open(pg_url)
    await store.aclose()
    schema = pg_url.rsplit("schema=", 1)[1]
    with pg_connect() as conn:
        conn.execute(f"DROP FUNCTION {schema}.{SUBMIT_FUNCTION_NAME}")
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        turn = await queue.submit("s", "hi", idempotency_key="k")
        again = await queue.submit("s", "hi", idempotency_key="k")
    finally:
        await queue.aclose()
        await store.aclose()
    assert turn.turn_id == again.turn_id and turn.status == "queued"


@pytest.mark.parametrize("old_id", ["turn_1", 't"q\\b\x01\x1f\x7f é漢😀\u2028'])
async def test_an_edits_key_is_the_one_a_process_of_before_made(pg_url, old_id):
    """The function keys an edit by the turn it replaces as the transaction of before did
    (sha256 of the JSON ``[message key, input hash, old turn id]``, made by orjson): a
    retry of an edit reaching a front end of the other version replays it, never queues
    it twice. The old turn id a client's (an AG-UI ``runId``), with what JSON escapes."""
    import hashlib

    import orjson

    from actors.stores.turn_submit import _message_key

    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    schema = pg_url.rsplit("schema=", 1)[1]
    try:
        first = await queue.submit("s", "hi", idempotency_key="m1", turn_id=old_id)
        with pg_connect() as conn:
            conn.execute(f"UPDATE {schema}.axon_turns SET status = 'done'")
        edit = await queue.submit("s", "hello", idempotency_key="m1")
        again = await queue.submit("s", "hello", idempotency_key="m1")
    finally:
        await queue.aclose()
        await store.aclose()
    input_hash = hashlib.sha256(orjson.dumps(['"hello"', False])).hexdigest()
    made = hashlib.sha256(orjson.dumps([_message_key("m1"), input_hash, first.turn_id]))
    assert first.turn_id == old_id and edit.turn_id != old_id
    assert edit.idempotency_key == made.hexdigest() and again.turn_id == edit.turn_id
