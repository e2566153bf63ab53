"""A front end SIGKILLed inside its submit: between sending the submit's call
(``axon_submit_v3``) and reading its answer. Real processes: ``serve`` front ends and a
``worker`` on the run's own PostgreSQL and Redis. The submit is held inside its call (a
trigger of the test's waits on an advisory lock the test holds, before the row's insert)
while the front end is killed; the client then sends the same POST (same message id) to
another front end. The message is queued once or not at all, and the retry streams the
one turn."""

from __future__ import annotations

import json
import signal
from typing import Any

import httpx
import pytest
import trio

from actors.stores.postgres import PostgresStore
from tests.support.pg import pg_connect
from tests.test_submit_processes import STALL, _stall
from tests.test_worker_approval_processes import FrontEnds, chat, deployment
from tests.test_workers import Workers, sql

__all__ = ["deployment"]

LIMIT = 60


async def _until_held(pg_url: str, n: int) -> None:
    """Until ``n`` backends wait for an advisory lock (the test's, inside a submit's
    call, or a session's, which that submit holds)."""
    query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    while True:
        if sql(pg_url, query)[0][0] >= n:
            return
        await trio.sleep(0.02)


def _text(sse: str) -> str:
    """The text deltas of an SSE body, joined."""
    events = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: {")]
    return "".join(e["delta"] for e in events if e["type"] == "text-delta")


def _turns(pg_url: str) -> list[tuple[Any, ...]]:
    return [
        tuple(row)
        for row in sql(pg_url, "SELECT session_id, status FROM axon_turns WHERE session_id = 's1'")
    ]


@pytest.mark.parametrize("retry_while_held", [False, True])
async def test_a_front_end_killed_inside_its_submit_leaves_one_turn_the_retry_streams(
    pg_url: str, deployment: tuple[Workers, FrontEnds], retry_while_held: bool
) -> None:
    workers, fronts = deployment
    first = await fronts.start()
    second = await fronts.start()
    store = await PostgresStore.open(pg_url)
    try:
        await store.run("stall", _stall)
    finally:
        await store.aclose()
    workers.start("w1")
    killed = fronts.procs[0]
    with pg_connect() as lock:
        lock.execute("SELECT pg_advisory_lock(%s)", (STALL,))
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:

                    async def doomed() -> None:
                        try:
                            await client.post(f"{first}/api/chat", json=chat("s1", "hello"))
                        except httpx.HTTPError:
                            pass

                    nursery.start_soon(doomed)
                    await _until_held(pg_url, 1)
                    killed.send_signal(signal.SIGKILL)
                    await trio.to_thread.run_sync(killed.wait)
                if retry_while_held:
                    async with trio.open_nursery() as nursery:
                        got: list[httpx.Response] = []

                        async def retry() -> None:
                            got.append(
                                await client.post(f"{second}/api/chat", json=chat("s1", "hello"))
                            )

                        nursery.start_soon(retry)
                        await _until_held(pg_url, 2)
                        lock.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
                    response = got[0]
                else:
                    lock.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
                    await trio.sleep(0.5)
                    response = await client.post(f"{second}/api/chat", json=chat("s1", "hello"))
    assert response.status_code == 200, response.text
    assert _text(response.text) == "echo: hello", response.text
    assert "[DONE]" in response.text
    turns = _turns(pg_url)
    assert turns == [("s1", "done")], turns
