"""A primary that becomes read-only (a failover's old primary, a standby a DNS name still
points at, ``default_transaction_read_only``): every write fails with ``cannot execute
INSERT in a read-only transaction``.

Each test makes a database of its own on the run's own server and turns it read-only the
way a failover reaches clients: ``ALTER DATABASE ... SET default_transaction_read_only``,
its connections cut, so the store's next ones are read-only; "writable again" resets it
and cuts nothing. Before: the error was a store error like a bad request (a submit
answered 400, nothing retried), ``/readyz`` said ``ok`` throughout (its read works on a
standby), and the store's pooled connections stayed read-only once the server was
writable again (a connection to a standby stays one). Now a read-only server is retried
as an unreachable one is (``StoreUnavailable`` after ``retry_for``: 503 with
``Retry-After``), each connection that met it is dropped, and ``/readyz`` says so.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from structlog.testing import capture_logs

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent, tool
from runtime.actor_messages import InferRequest
from runtime.app.web.http import STORE_UNAVAILABLE
from runtime.errors import StoreUnavailable
from runtime.messages import AssistantMessage, ToolMessage
from tests.support.pg import own_database, pg_connect
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, body, deployment, wait_for_turn
from tests.test_relay_web import sse_events


@contextlib.contextmanager
def database() -> Iterator[tuple[str, str]]:
    """``(a store URL in a database of the test's own, the database's name)``."""
    with own_database("UTF8") as url:
        yield url, url.rsplit("/", 1)[1].split("?")[0]


def read_only(name: str, on: bool) -> None:
    """Turn database ``name`` read-only (its connections cut, as a failover cuts them) or
    writable again (nothing cut: connections made meanwhile stay as they were made)."""
    with pg_connect() as conn:
        if on:
            conn.execute(f"ALTER DATABASE {name} SET default_transaction_read_only = on")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (name,),
            )
        else:
            conn.execute(f"ALTER DATABASE {name} RESET default_transaction_read_only")


async def test_a_read_only_server_is_unavailable_and_its_connections_are_dropped() -> None:
    with database() as (url, name):
        store = await PostgresStore.open(url, retry_for=0.5)
        queue = TurnQueue(store)
        try:
            await queue.submit("s0", "before")
            read_only(name, True)
            with pytest.raises(StoreUnavailable, match="read-only") as refused:
                await queue.submit("s1", "hello")
            with pytest.raises(StoreUnavailable, match="read-only"):
                await store.check_ready("nobody")
            read_only(name, False)
            submitted = await queue.submit("s1", "hello")
            await store.check_ready("nobody")
        finally:
            await queue.aclose()
            await store.aclose()
    assert "cannot execute INSERT in a read-only transaction" in str(refused.value)
    assert submitted.status == "queued"


async def test_readiness_after_a_read_only_spell_says_ok_with_no_write_between() -> None:
    """The connections ``/readyz`` read the read-only server on are dropped, not only
    those a write met: a front end whose submits go from the event loop (one call, not
    the pool's) may see no write after a failover, and its readiness, read on a
    connection made while the server was read-only, said 503 for good."""
    with database() as (url, name):
        store = await PostgresStore.open(url, retry_for=0.5)
        try:
            read_only(name, True)
            with pytest.raises(StoreUnavailable, match="read-only"):
                await store.check_ready("nobody")
            read_only(name, False)
            await store.check_ready("nobody")
        finally:
            await store.aclose()


gate = trio.Event()


@tool
async def wait_for_gate() -> str:
    """Wait until the test lets the turn go on."""
    await gate.wait()
    return "opened"


def respond(request: InferRequest) -> list[Any]:
    if current_step(request.messages) == 0:
        return ["Waiting. ", *tool_call("wait_for_gate", {}, tool_call_id="G")]
    return ["Done after the gate."]


async def test_a_turn_running_while_the_primary_turns_read_only_ends_once_it_is_writable() -> None:
    global gate
    gate = trio.Event()
    agent = Agent(name="g", provider=ScriptedProvider(responder=respond), tools=[wait_for_gate])
    with database() as (url, name):
        async with deployment(url, require_redis(), agent) as d:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
                async with trio.open_nursery() as nursery:
                    answers: list[httpx.Response] = []

                    async def post() -> None:
                        answers.append(await client.post("/api/chat", json=body("s1")))

                    nursery.start_soon(post)
                    await wait_for_turn(d.queue, "s1", "running")
                    with capture_logs() as logs:
                        read_only(name, True)
                        gate.set()
                        with trio.fail_after(LIMIT):
                            while True:  # a save met the read-only server
                                if any("read-only" in str(e.get("error")) for e in logs):
                                    break
                                await trio.sleep(0.02)
                        ready = await client.get("/readyz")
                        read_only(name, False)
                        (turn,) = await d.queue.turns("s1")
                        done = await d.queue.wait_finished(turn.turn_id, LIMIT)
                record = await d.store.load("s1")
    assert ready.status_code == 503 and "read-only" in ready.json()["store"]
    assert done is not None and done.status == "done"
    events = [e for _, e in sse_events(answers[0].text) if e != "[DONE]"]
    assert events[-1]["type"] == "finish"
    assert record is not None
    assistant = [m for m in record.messages if isinstance(m, AssistantMessage)]
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert len(assistant) == 1 and [r.output for r in results] == ["opened"]


async def test_a_post_to_a_read_only_primary_is_503_with_retry_after_and_then_runs() -> None:
    """Before: 400 (the store's refusal taken for the request's fault), nothing retried."""
    with database() as (url, name):
        async with deployment(
            url, require_redis(), Agent(name="a", provider=ScriptedProvider(["hi"]))
        ) as d:
            d.hosts[0].store._retry_for = 0.3  # the front end's: give up soon
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
                read_only(name, True)
                with capture_logs() as logs:
                    refused = await client.post("/api/chat", json=body("s1"))
                ready = await client.get("/readyz")
                read_only(name, False)
                taken = await client.post("/api/chat", json=body("s1"))
    assert (refused.status_code, refused.headers.get("retry-after")) == (503, "1")
    # the client a fixed sentence (a store's text can name its host); the log, why
    assert refused.json() == {"error": STORE_UNAVAILABLE}
    logged = [e["error"] for e in logs if e["event"] == "frontend.submit_unavailable"]
    assert len(logged) == 1 and "read-only" in logged[0]
    assert ready.status_code == 503
    assert taken.status_code == 200
    assert [e for _, e in sse_events(taken.text) if e != "[DONE]"][-1]["type"] == "finish"
