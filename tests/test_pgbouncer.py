"""Axon behind PgBouncer in transaction pooling mode (``pool_mode = transaction``, what
most production PostgreSQL deployments put in front of the server), through a PgBouncer
of the test run's own (:mod:`tests.support.pgbouncer`).

There each transaction of a client connection may run on another server connection, so
nothing a connection sets outlives its transaction: prepared statements (psycopg's own
after five runs of a statement, the store's event-loop lane's from the first), ``SET
search_path``, ``LISTEN``. Without ``?pooler=transaction`` a store's reads failed with
``prepared statement "_pg3_0" does not exist`` and ``relation "axon_sessions" does not
exist`` as soon as two tasks read at once; it is now refused at open, in one line naming
the parameter. With it, the store prepares nothing, sets nothing, and its workers poll
instead of listening; a worker turn, an approval's wait and resume, and a takeover run
through the bouncer.
"""

from __future__ import annotations

from typing import Any

import httpx
import psycopg
import pytest
import trio
from structlog.testing import capture_logs

from actors.providers.scripted import ScriptedProvider
from actors.stores.postgres import PostgresStore, parse_listen, parse_pooler, parse_url
from actors.stores.turns import TurnQueue
from runtime import Agent
from runtime.errors import ConfigurationError
from runtime.messages import AssistantMessage, UserMessage
from tests.support.pg import pg_connect
from tests.support.pgbouncer import pooled_database
from tests.support.redis import require_redis
from tests.support.services import own_postgres
from tests.test_frontend import LIMIT, deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import answer, approval_agent, asked, chat, payloads, ran

POOLED = "?pooler=transaction"


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


def listening(direct: str) -> int:
    """Server connections of the database whose last statement was a ``LISTEN``."""
    with psycopg.connect(direct, autocommit=True) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
        ).fetchone()
    return int(count)


def test_pooler_is_axons_own_parameter_and_only_transaction_or_none() -> None:
    url = "postgresql://u@h:6432/db?pooler=transaction&schema=s&sslmode=disable"
    assert parse_url(url) == ("postgresql://u@h:6432/db?sslmode=disable", "s")
    assert parse_pooler(url) is True
    assert parse_pooler("postgresql://u@h/db") is False
    assert parse_pooler("postgresql://u@h/db?pooler=session") is False
    with pytest.raises(ConfigurationError, match="invalid pooler 'statement'"):
        parse_pooler("postgresql://u@h/db?pooler=statement")


async def test_a_store_behind_transaction_pooling_without_pooler_is_refused_at_open() -> None:
    with pooled_database() as (bounced, _):
        with pytest.raises(ConfigurationError) as refused:
            await PostgresStore.open(bounced)
    said = str(refused.value)
    assert "pooler=transaction" in said and "\n" not in said


async def test_many_tasks_read_two_pooled_stores_at_once_each_its_own_rows() -> None:
    """Without the pooled mode's unprepared statements and unset schema, most such reads
    failed (`prepared statement "_pg3_0" does not exist`, `already exists`, `relation
    "axon_sessions" does not exist`)."""
    failed: list[str] = []
    read: dict[str, int] = {}
    with pooled_database() as (one, _), pooled_database() as (two, _):
        stores = [await PostgresStore.open(u + POOLED, retry_for=1) for u in (one, two)]
        try:
            for n, store in enumerate(stores):
                await store.save("s", 0, [UserMessage(content=f"store {n}")], {"n": n})

            async def reads(n: int, store: PostgresStore) -> None:
                for _ in range(10):
                    try:
                        meta = await store.meta("s")
                        last = await store.load_last_turn("s")
                        record = await store.load("s")
                    except Exception as err:  # counted, not raised: every failure shown
                        failed.append(f"{type(err).__name__}: {err}"[:200])
                        continue
                    assert meta == {"n": n} and last is not None and record is not None
                    assert record.messages[0].content == f"store {n}"
                    read[f"store {n}"] = read.get(f"store {n}", 0) + 1

            async with trio.open_nursery() as nursery:
                for n, store in enumerate(stores):
                    for _ in range(10):
                        nursery.start_soon(reads, n, store)
        finally:
            for store in stores:
                await store.aclose()
    assert failed == []
    assert read == {"store 0": 100, "store 1": 100}


async def test_a_schema_the_sessions_do_not_start_in_is_refused_behind_a_pooler() -> None:
    with pooled_database() as (bounced, _):
        with pytest.raises(ConfigurationError, match="SET search_path = axon"):
            await PostgresStore.open(f"{bounced}{POOLED}&schema=axon")
    with pooled_database(search_path="axon") as (bounced, direct):
        store = await PostgresStore.open(f"{bounced}{POOLED}&schema=axon")
        try:
            await store.save("s", 0, [UserMessage(content="hi")])
            assert (await store.load("s")) is not None
        finally:
            await store.aclose()
        with psycopg.connect(direct, autocommit=True) as conn:
            (where,) = conn.execute(
                "SELECT relnamespace::regnamespace::text FROM pg_class "
                "WHERE relname = 'axon_sessions'"
            ).fetchone()
    assert where == "axon"


async def test_a_worker_turn_that_waits_for_approval_resumes_through_pgbouncer() -> None:
    redis_url = require_redis()
    with pooled_database() as (bounced, direct):
        async with deployment(bounced + POOLED, redis_url, approval_agent()) as d:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
                first = sse_events((await client.post("/api/chat", json=chat("s1"))).text)
                message_id = payloads(first)[0]["messageId"]
                request = asked(first)
                second = await client.post(
                    "/api/chat", json=answer("s1", message_id, request["approvalId"], True)
                )
                (turn,) = await d.queue.turns("s1")
                done = await d.queue.wait_finished(turn.turn_id, LIMIT)
                record = await d.store.load("s1")
            listens = listening(direct)
    events = payloads(sse_events(second.text))
    assert {"type": "tool-output-available", "toolCallId": "D", "output": "deleted /x"} in events
    assert events[-1]["type"] == "finish" and events[-1]["finishReason"] == "stop"
    assert ran == ["/x"]
    assert done is not None and done.status == "done" and done.resumes == 1
    assert record is not None
    assert [m.id for m in record.messages if isinstance(m, AssistantMessage)] == [message_id]
    assert listens == 0  # the worker polled: no LISTEN left on a pooled server connection


async def test_a_pooled_queue_waits_by_polling_and_opens_no_listen_connection() -> None:
    """A ``LISTEN`` through the bouncer lands on whichever server connection ran it,
    which goes on to serve other clients, and is never heard on the worker's."""
    with pooled_database() as (bounced, _):
        store = await PostgresStore.open(bounced + POOLED)
        queue = TurnQueue(store)
        try:
            await queue.submit("s", "hi")
            woken = await queue.wait(0.05)
            checked = await queue.check_listening()  # the worker's health beat asks
            listener = queue._listen
        finally:
            await queue.aclose()
            await store.aclose()
    assert (woken, checked, listener) == (False, True, None)


async def test_a_turn_whose_worker_stopped_renewing_is_taken_over_through_pgbouncer() -> None:
    redis_url = require_redis()
    with pooled_database() as (bounced, _):
        async with deployment(bounced + POOLED, redis_url, approval_agent(), worker=False) as d:
            ghost = TurnQueue(d.store, lease=0.2)
            turn = await d.queue.submit("s1", "hello")
            claim = await ghost.claim("ghost")
            assert claim is not None and claim.turn.turn_id == turn.turn_id
            await trio.sleep(0.3)  # the lease lapses: nobody renews it
            await d.start_worker()
            done = await d.queue.wait_finished(turn.turn_id, LIMIT)
            record = await d.store.load("s1")
            await ghost.aclose()
    assert done is not None and done.status == "done"
    assert (done.epoch, done.attempts) == (2, 2)  # the ghost's claim, then the takeover
    assert record is not None
    said = [m for m in record.messages if isinstance(m, AssistantMessage)]
    assert len(said) == 1


async def test_a_pooled_store_leaves_no_setting_on_the_server_connections_it_used() -> None:
    """A session ``SET`` behind transaction pooling stays on the server connection, which
    the bouncer hands to its next client, another program's as well."""
    with pooled_database() as (bounced, _):
        store = await PostgresStore.open(bounced + POOLED)
        try:
            await store.save("s", 0, [UserMessage(content="hi")])
            await store.meta("s")
        finally:
            await store.aclose()
        with psycopg.connect(bounced, autocommit=True) as other:
            (idle,) = other.execute(
                "SELECT current_setting('idle_in_transaction_session_timeout')"
            ).fetchone()
    assert idle == "0"


def test_lease_renewals_hop_server_connections_through_pgbouncer_unprepared() -> None:
    """The lease thread renews on a connection of its own, one statement again and again:
    psycopg prepared it at its fifth run, and the bouncer's next server connection did
    not have it. Every other renewal here runs while another client holds the server
    connection the previous one ran on (PgBouncer hands out the last used first)."""

    async def claimed(url: str) -> tuple[PostgresStore, TurnQueue, Any]:
        store = await PostgresStore.open(url)
        queue = TurnQueue(store, lease=30)
        await queue.submit("s", "hi")
        return store, queue, await queue.claim("w")

    with pooled_database() as (bounced, _):
        store, queue, claim = trio.run(claimed, bounced + POOLED)
        renewer = queue.open_renewer()
        held = []
        try:
            with psycopg.connect(bounced, autocommit=True) as other:
                for n in range(12):
                    with other.transaction():
                        other.execute("SELECT 1")  # holds the last server connection
                        if n % 2:
                            held.append(renewer.renew(claim.turn.turn_id, "w", claim.epoch).held)
                    if not n % 2:
                        held.append(renewer.renew(claim.turn.turn_id, "w", claim.epoch).held)
        finally:
            renewer.close()
            trio.run(queue.aclose)
            trio.run(store.aclose)
    assert held == [True] * 12


async def test_serve_and_worker_commands_run_a_turn_through_pgbouncer() -> None:
    """The deployment as a user starts it, ``--store`` naming the bouncer and the pooler."""
    from tests.test_frontend import test_serve_and_worker_commands_run_a_turn_end_to_end as run

    with pooled_database() as (bounced, direct):
        await run(bounced + POOLED, require_redis())
        listens = listening(direct)
    assert listens == 0


async def test_a_pooled_store_warns_once_when_nothing_limits_its_idle_transactions() -> None:
    """It cannot set its own ``idle_in_transaction_session_timeout`` there."""
    warned = []
    for setting in (None, "10s"):
        with pooled_database() as (bounced, direct):
            if setting is not None:
                with pg_connect() as conn:
                    conn.execute(
                        f"ALTER DATABASE {direct.rsplit('/', 1)[1]} "
                        f"SET idle_in_transaction_session_timeout = '{setting}'"
                    )
            with capture_logs() as logs:
                store = await PostgresStore.open(bounced + POOLED)
                await store.aclose()
            warned.append([e["event"] for e in logs if e["event"] == "store.pooled_idle_unlimited"])
    assert warned == [["store.pooled_idle_unlimited"], []]


def test_listen_host_and_port_name_the_server_for_the_workers_listen() -> None:
    url = "postgresql://u:pw@bouncer:6432/db?pooler=transaction&listen_host=db1&listen_port=5432"
    assert parse_url(url)[0] == "postgresql://u:pw@bouncer:6432/db"
    assert parse_listen(url) == "postgresql://u:pw@bouncer:6432/db?host=db1&port=5432"
    assert parse_listen("postgresql://u@bouncer:6432/db?pooler=transaction") is None
    assert parse_listen("postgresql://u@db1/db?schema=s") == "postgresql://u@db1/db"


async def test_a_pooled_queue_with_a_direct_listen_port_is_woken_by_a_submit() -> None:
    """The bouncer for every statement, the server itself for the ``LISTEN``: a submit
    wakes the waiting worker at once instead of at its next poll."""
    port = own_postgres().port
    with pooled_database() as (bounced, _):
        store = await PostgresStore.open(f"{bounced}{POOLED}&listen_port={port}")
        queue = TurnQueue(store)
        try:
            opened = await queue.wait(0.01)  # the LISTEN connection opens: "maybe"
            await queue.submit("s", "hi")
            woken = await queue.wait(LIMIT)  # False only once LIMIT passed
        finally:
            await queue.aclose()
            await store.aclose()
    assert (opened, woken) == (True, True)


async def test_a_turn_running_while_pgbouncer_restarts_ends_once_it_is_back() -> None:
    """Every client connection cut and none accepted for a while: as a server restart."""
    import tests.test_pg_read_only as gated
    from tests.support.services import own_pgbouncer
    from tests.test_frontend import body, wait_for_turn

    gated.gate = trio.Event()
    agent = Agent(
        name="g",
        provider=ScriptedProvider(responder=gated.respond),
        tools=[gated.wait_for_gate],
    )
    bouncer = own_pgbouncer()
    with pooled_database() as (bounced, _):
        async with deployment(bounced + POOLED, require_redis(), agent) as d:
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
                async with trio.open_nursery() as nursery:
                    answers: list[httpx.Response] = []

                    async def post() -> None:
                        answers.append(await client.post("/api/chat", json=body("s1")))

                    nursery.start_soon(post)
                    await wait_for_turn(d.queue, "s1", "running")
                    with capture_logs() as logs:
                        bouncer.stop()
                        try:
                            gated.gate.set()
                            with trio.fail_after(LIMIT):
                                while True:  # a save met the bouncer gone, and retries
                                    if any(e["event"] == "store.retry" for e in logs):
                                        break
                                    await trio.sleep(0.02)
                        finally:
                            bouncer.start()
                    (turn,) = await d.queue.turns("s1")
                    done = await d.queue.wait_finished(turn.turn_id, LIMIT)
                record = await d.store.load("s1")
    assert done is not None and done.status == "done"
    assert [e for _, e in sse_events(answers[0].text) if e != "[DONE]"][-1]["type"] == "finish"
    assert record is not None
    assert len([m for m in record.messages if isinstance(m, AssistantMessage)]) == 1
