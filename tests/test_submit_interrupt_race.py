"""Interrupts racing in one busy session (``on_busy="interrupt"``), from front ends in two
real processes at once: exactly one survives. Real PostgreSQL (the run's own).

Each submit's call (:data:`actors.stores.postgres_calls.SUBMIT_FUNCTION`) locks the
session's open turns in one statement, cancels them, and inserts its own. Held in flight
together (the test's trigger stalls the first insert; the others wait on the running
turn's row it locked), then let go, each of the others' statement had read the open turns
before the first one's row was committed: none cancelled another's row, and every one of
the N turns stayed queued, to run one after the other, where the last message was to
interrupt them all. Now the call that finds, after its insert, another open turn of the
session it did not stop (a racing interrupt's, committed meanwhile) is sent again, and
stops it: the last to commit runs; every other was told its turn (queued), then found it
cancelled ``interrupted by a new message``, as an interrupt's stop says.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.agent import Agent
from runtime.busy import INTERRUPTED_BY_NEW
from runtime.provider import InferRequest
from tests.support.pg import pg_connect
from tests.test_frontend import LIMIT, body, data, deployment, wait_for_turn
from tests.test_relay_web import sse_events
from tests.test_worker_approval import redis_url as redis_url  # (the fixture)

REPO = str(Path(__file__).resolve().parents[1])
STALL = 4245
"""The advisory lock the test holds and its trigger waits for."""

_CHILD = """
import json, sys, trio
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.errors import TurnConflict

url, name, n, cap = sys.argv[1:5]

async def main():
    store = await PostgresStore.open(url)
    queue = TurnQueue(store, max_queued_per_session=None if cap == "-" else int(cap))
    got = []

    async def submit(i):
        try:
            turn = await queue.submit("s", f"{name} {i}", on_busy="interrupt")
        except TurnConflict as err:
            got.append(["refused", str(err)])
        else:
            got.append(["queued" if turn.status == "queued" else turn.status, turn.turn_id])

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


def _stall(conn: Any, session_id: str = "s") -> None:
    """A trigger of the test before every insert of a turn of ``session_id`` that waits
    until the test lets go of :data:`STALL`."""
    conn.execute(
        f"""CREATE FUNCTION race_stall() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_advisory_lock_shared({STALL});
            PERFORM pg_advisory_unlock_shared({STALL});
            RETURN NEW;
        END $$"""
    )
    conn.execute(
        "CREATE TRIGGER race_stall BEFORE INSERT ON axon_turns FOR EACH ROW "
        f"WHEN (NEW.session_id = '{session_id}') EXECUTE FUNCTION race_stall()"
    )


def _in_flight(conn: Any) -> int:
    """Submits waiting, for the stall or for a row lock a submit holds."""
    (count,) = conn.execute(
        """SELECT count(*) FROM pg_stat_activity
        WHERE wait_event_type = 'Lock' AND query LIKE '%axon_submit%'"""
    ).fetchone()
    return int(count)


async def _until_in_flight(conn: Any, n: int) -> None:
    while True:
        if _in_flight(conn) >= n:
            return
        await trio.sleep(0.01)


def _spawn(url: str, name: str, n: int, cap: str) -> Any:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, name, str(n), cap],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, "PYTHONDONTWRITEBYTECODE": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("cap", ["-", "2"])
async def test_interrupts_racing_in_one_busy_session_leave_one_survivor(pg_url, cap):
    """Six at once (three from each of two processes); with a cap of 2 queued turns a
    session, too: none is refused over it (each stops the turns it would count), where
    the count after the interrupt's own cancels counted the racing ones' turns."""
    n = 3
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        running = await queue.submit("s", "the turn that runs")
        assert (await queue.claim("w")) is not None
    finally:
        await queue.aclose()
        await store.aclose()
    schema = pg_url.rsplit("schema=", 1)[1]
    procs = []
    got: list[list[str]] = []
    with pg_connect() as holder, pg_connect() as look:
        holder.execute(f"SET search_path TO {schema}")
        try:
            procs = [_spawn(pg_url, name, n, cap) for name in ("a", "b")]
            for proc in procs:
                assert (await trio.to_thread.run_sync(proc.stdout.readline)).strip() == "ready"
            _stall(holder)
            holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
            for proc in procs:
                proc.stdin.write("go\n")
                proc.stdin.flush()
            with trio.fail_after(60):
                await _until_in_flight(look, 2 * n)
            holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
            for proc in procs:
                out, err = await trio.to_thread.run_sync(proc.communicate, None, 60)
                assert proc.returncode == 0, err
                got += json.loads(out.strip().splitlines()[-1])
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        rows = look.execute(
            f"""SELECT turn_id, status, cancel_requested, cancel_reason, finish_reason
            FROM {schema}.axon_turns WHERE session_id = 's' ORDER BY seq"""
        ).fetchall()
    first, *submitted = rows
    told = {turn_id for answer, turn_id in got if answer == "queued"}
    survivors = [r for r in submitted if r[1] in ("queued", "running") and not r[2]]
    assert first[:4] == (running.turn_id, "running", True, INTERRUPTED_BY_NEW)
    assert len(got) == 2 * n and all(answer in ("queued", "refused") for answer, _ in got), got
    assert {r[0] for r in submitted} == told  # (a refused one stored nothing)
    assert [r[0] for r in survivors] == [submitted[-1][0]], rows  # the last to commit
    assert all(
        r[1:] == ("cancelled", True, INTERRUPTED_BY_NEW, "aborted") for r in submitted[:-1]
    ), rows


def _respond(request: InferRequest) -> list[Any]:
    """Every turn runs until it is stopped (none ends before the racers are answered)."""
    return [Sleep(600), "never"]


def _agent() -> Agent:
    return Agent(name="a", provider=ScriptedProvider(responder=_respond))


async def test_interrupts_racing_through_two_front_ends_each_get_a_clear_answer(pg_url, redis_url):
    """Four chat POSTs under ``--on-busy interrupt`` through two front ends at once, held
    in flight together while a turn runs: once all are queued, exactly one new turn is
    neither cancelled nor asked to stop (the last in line); every other POST is a 200
    whose stream ends ``abort`` ``interrupted by a new message``, as the running turn's
    does. (The survivor, stopped by the test at the end, ends ``abort`` ``test``.)"""
    async with deployment(pg_url, redis_url, _agent(), fronts=2, on_busy="interrupt") as d:
        schema = pg_url.rsplit("schema=", 1)[1]
        answers: dict[str, httpx.Response] = {}
        async with httpx.AsyncClient(timeout=LIMIT) as client:

            async def post(url: str, text: str, message_id: str) -> None:
                sent = body("s1", text, message_id)
                answers[text] = await client.post(f"{url}/api/chat", json=sent)

            with pg_connect() as holder, pg_connect() as look:
                holder.execute(f"SET search_path TO {schema}")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(post, d.urls[0], "first", "u0")
                    await wait_for_turn(d.queue, "s1", "running")
                    _stall(holder, "s1")
                    holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
                    for i in range(4):
                        nursery.start_soon(post, d.urls[i % 2], f"m{i}", f"u{i + 1}")
                    with trio.fail_after(LIMIT):
                        await _until_in_flight(look, 4)
                    holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
                    with trio.fail_after(LIMIT):
                        await _until_submitted(d, 5)
                    raced = await d.queue.turns("s1")
                    open_ = [
                        t
                        for t in raced
                        if t.status in ("queued", "running") and not t.cancel_requested
                    ]
                    for t in open_:  # (the survivor: the test ends it)
                        await d.queue.request_cancel(t.turn_id, "test")
        turns = await d.queue.turns("s1")
    ended = {
        text: [e for e in data(sse_events(r.text)) if e["type"] in ("abort", "finish")]
        for text, r in answers.items()
    }
    assert len(open_) == 1 and open_[0].turn_id == raced[-1].turn_id, [
        (t.input, t.status, t.cancel_requested) for t in raced
    ]
    survivor = open_[0].input
    assert all(r.status_code == 200 for r in answers.values()), answers
    assert [t.status for t in turns] == ["cancelled"] * 5
    assert ended[survivor] == [{"type": "abort", "reason": "test"}], ended
    for text, events in ended.items():
        if text != survivor:
            assert events == [{"type": "abort", "reason": INTERRUPTED_BY_NEW}], (text, events)


async def _until_submitted(d: Any, n: int) -> None:
    """Until the session holds ``n`` turns and no submit is in flight."""
    while True:
        if len(await d.queue.turns("s1")) >= n:
            return
        await trio.sleep(0.01)
