"""The same user message (the same message id) posted at once to two ``serve`` front ends
of the worker deployment (a balancer retrying on the other upstream, a client that sent
it twice): real ``serve`` and ``python -m runtime worker`` processes on the test run's own
PostgreSQL and Redis. The queue takes the message once (its id is the submit's key): one
turn runs, it is stored once, and both clients stream that turn's answer (twinserve's
``AnsweredElsewhere`` is the embedded deployment's case; here the twin never reaches a
worker).

``held``: both submits are held inside their call (tests/test_submit_processes.py's
trigger, before the row's insert) until both are there, so they overlap in PostgreSQL;
``running``: the second is posted once the worker streams the first's answer; ``done``:
once the first's stream ended (a retry after a lost answer)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from actors.stores.postgres import PostgresStore
from runtime.messages import AssistantMessage, UserMessage
from tests.support.faults import check_history
from tests.support.pg import pg_connect
from tests.test_frontend_killed_submit_processes import _until_held
from tests.test_submit_processes import STALL, _stall
from tests.test_worker_approval_processes import FrontEnds, chat, deployment
from tests.test_workers import Workers, sql

__all__ = ["deployment"]

LIMIT = 60
TEXT = " ".join(["hello"] * 20)
"""Long enough that the ``running`` twin comes while its answer streams (16 chunks)."""


def _text(sse: str) -> str:
    events = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: {")]
    return "".join(e["delta"] for e in events if e["type"] == "text-delta")


async def _stored(pg_url: str) -> list[Any]:
    store = await PostgresStore.open(pg_url)
    try:
        record = await store.load("s1")
    finally:
        await store.aclose()
    assert record is not None
    return list(record.messages)


@pytest.mark.parametrize("on_busy", ["enqueue", "reject", "interrupt", "steer"])
@pytest.mark.parametrize("when", ["held", "running", "done"])
async def test_the_same_message_posted_to_two_front_ends_at_once_runs_one_turn(
    pg_url: str, deployment: tuple[Workers, FrontEnds], when: str, on_busy: str
) -> None:
    workers, fronts = deployment
    fronts.args += ["--on-busy", on_busy]
    urls = [await fronts.start(), await fronts.start()]
    if when == "held":
        store = await PostgresStore.open(pg_url)
        try:
            await store.run("stall", _stall)
        finally:
            await store.aclose()
        workers.start("w1")
    else:
        workers.start("w1", AXON_TEST_DELAY="0.2" if when == "running" else "0")
    got: dict[int, httpx.Response] = {}
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        with trio.fail_after(LIMIT):

            async def post(i: int) -> None:
                got[i] = await client.post(f"{urls[i]}/api/chat", json=chat("s1", TEXT))

            if when == "held":
                with pg_connect() as lock:
                    lock.execute("SELECT pg_advisory_lock(%s)", (STALL,))
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(post, 0)
                        nursery.start_soon(post, 1)
                        # one in the trigger, the other on the session's lock it holds
                        await _until_held(pg_url, 2)
                        lock.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
            elif when == "done":
                await post(0)
                await post(1)
            else:
                async with trio.open_nursery() as nursery:
                    async with client.stream(
                        "POST", f"{urls[0]}/api/chat", json=chat("s1", TEXT)
                    ) as first:
                        raw = ""
                        posted = False
                        async for text in first.aiter_text():
                            raw += text
                            if not posted and "text-delta" in raw:
                                status = sql(pg_url, "SELECT status FROM axon_turns")
                                assert [tuple(t) for t in status] == [("running",)]
                                nursery.start_soon(post, 1)  # the turn streams its answer
                                posted = True
                    got[0] = httpx.Response(first.status_code, text=raw)
    turns = sql(pg_url, "SELECT status FROM axon_turns WHERE session_id = 's1'")
    assert [tuple(t) for t in turns] == [("done",)]
    for i in (0, 1):
        assert got[i].status_code == 200, got[i].text
        assert _text(got[i].text) == f"echo: {TEXT}", got[i].text
        assert "[DONE]" in got[i].text
    history = await _stored(pg_url)
    check_history(history)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage]
    assert history[0].id == "u1" and history[1].text == f"echo: {TEXT}"
