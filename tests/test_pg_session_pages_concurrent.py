"""The sessions list by the page on PostgreSQL while other writers save (the test run's
own server): what docs/web.md promises a user paging the list while turns run, checked
over many walks with writers saving, creating and deleting sessions from other store
handles meanwhile. Within one walk no session is listed twice; every session that
existed and was not saved (nor deleted) during the whole walk is listed exactly once;
a deleted one is not listed after its delete."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import httpx
import psycopg
import trio
import trio.lowlevel

from actors.stores.postgres import PostgresStore, parse_url
from runtime.messages import UserMessage
from runtime.store import list_page
from tests.support.redis import require_redis
from tests.test_frontend import deployment, slow_agent, wait_for_turn
from tests.test_workers import wait_for

SESSIONS = 40
WALKS = 25
API_WALKS = 8
CREATED = 20
"""New sessions the writers make at most (each walk stays a few pages long)."""
PAGE = 3


class Writers:
    """Writers on their own store handles: each saves a random session (sometimes a new
    one, sometimes deletes one) in a loop, noting each session it touched and when."""

    def __init__(self) -> None:
        self.touched: list[tuple[int, str]] = []
        """``(walk generation, session id)`` of every save or delete begun."""
        self.generation = 0
        self.created = 0
        self.writes = 0

    async def write(self, store: PostgresStore, seed: int, stop: trio.Event) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            roll = rng.random()
            if roll < 0.15 and self.created < CREATED:
                self.created += 1
                session_id = f"new{seed}_{self.created}"
            else:
                session_id = f"s{rng.randrange(SESSIONS)}"
            self.touched.append((self.generation, session_id))
            if roll > 0.97:
                await store.delete(session_id)
            else:
                version = await store.version(session_id)
                message = UserMessage(content=f"write {self.writes}")
                try:
                    await store.save(session_id, 0, [message], expected_version=version)
                except Exception:  # another writer got there first: fine, it was touched
                    pass
            self.writes += 1
            self.touched.append((self.generation, session_id))
            await trio.lowlevel.checkpoint()


async def walk_store(reader: PostgresStore) -> list[str]:
    listed: list[str] = []
    cursor = None
    while True:
        page = await list_page(reader, limit=PAGE, after=cursor)
        listed += [info.session_id for info in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            return listed
        await trio.lowlevel.checkpoint()  # the writers get their turn between pages


async def walk_api(client: httpx.AsyncClient) -> list[str]:
    listed: list[str] = []
    cursor = None
    while True:
        params = {"limit": str(PAGE)} | ({"cursor": cursor} if cursor else {})
        answer = await client.get("/api/sessions", params=params)
        assert answer.status_code == 200, answer.text
        listed += [s["session_id"] for s in answer.json()["sessions"]]
        cursor = answer.json()["next_cursor"]
        if cursor is None:
            return listed


async def walks_during_saves(
    pg_url: str, walk: Callable[[], Awaitable[list[str]]], reader: PostgresStore, walks: int
) -> tuple[int, int]:
    """``walks`` walks while writers save; each checked. ``(walks that met a write,
    writes)``."""
    stores = [await PostgresStore.open(pg_url) for _ in range(3)]
    writers = Writers()
    met = 0
    try:
        for n in range(SESSIONS):
            await reader.save(f"s{n}", 0, [UserMessage(content="first")])
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for i, store in enumerate(stores):
                nursery.start_soon(writers.write, store, i, stop)
            for _ in range(walks):
                writers.generation += 1
                generation = writers.generation
                before = {info.session_id for info in await reader.list_sessions()}
                listed = await walk()
                writers.generation += 1
                touched = {sid for g, sid in writers.touched if g == generation}
                after = {info.session_id for info in await reader.list_sessions()}
                assert len(listed) == len(set(listed)), listed  # none twice
                untouched = (before & after) - touched
                assert untouched <= set(listed), untouched - set(listed)  # none skipped
                met += bool(touched)
            stop.set()
    finally:
        for store in stores:
            await store.aclose()
    return met, writers.writes


async def test_store_walks_during_saves_list_none_twice_and_every_untouched_one_once(
    pg_url: str,
) -> None:
    reader = await PostgresStore.open(pg_url)
    try:
        met, writes = await walks_during_saves(pg_url, lambda: walk_store(reader), reader, WALKS)
    finally:
        await reader.aclose()
    assert met >= WALKS // 2 and writes > WALKS


async def test_api_walks_during_saves_list_none_twice_and_every_untouched_one_once(
    pg_url: str,
) -> None:
    async with (
        deployment(pg_url, require_redis(), slow_agent(3), worker=False) as d,
        httpx.AsyncClient(base_url=d.urls[0], timeout=30) as client,
    ):
        met, writes = await walks_during_saves(pg_url, lambda: walk_api(client), d.store, API_WALKS)
    assert met >= API_WALKS // 2 and writes > API_WALKS


async def test_the_front_end_lists_a_session_whose_first_turn_runs_unsaved_first(
    pg_url: str,
) -> None:
    # docs/web.md: the first page leads with the sessions whose first turn is running
    # and not saved yet; the worker deployment's front end answers the same. It listed
    # only what the store held: nothing of the session until its first step was saved.
    async with deployment(pg_url, require_redis(), slow_agent(400, 0.05)) as d:
        await d.store.save("old", 0, [UserMessage(content="earlier")])
        await d.queue.submit("fresh", "go", meta={"title": "Fresh"})
        await wait_for_turn(d.queue, "fresh", "running")
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=30) as client:
            listed = (await client.get("/api/sessions")).json()["sessions"]
        stored = await d.store.version("fresh")
    assert stored == 0  # (the turn's first step still streams: nothing saved)
    assert [(s["session_id"], s["busy"], s["title"]) for s in listed] == [
        ("fresh", True, "Fresh"),
        ("old", False, None),
    ]


async def test_a_delete_while_a_save_holds_the_session_waits_for_it_instead_of_deadlocking(
    pg_url: str,
) -> None:
    # Found by the walks above: a save locks the session's row, then rewrites its
    # messages; the delete locked the messages first, then the row: each waited for the
    # other, and PostgreSQL failed one ("deadlock detected", a StoreError). Here another
    # connection takes the save's locks in its order around a delete waiting between.
    store = await PostgresStore.open(pg_url)
    libpq, schema = parse_url(pg_url)
    try:
        await store.save("s1", 0, [UserMessage(content=f"m{i}") for i in range(3)])
        with psycopg.connect(libpq, connect_timeout=10) as saver:
            saver.execute(f"SET search_path TO {schema}")
            saver.execute("SELECT 1 FROM axon_sessions WHERE session_id = 's1' FOR UPDATE")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.delete, "s1")
                await wait_for(lambda: lock_waiters(libpq), what="the delete to wait")
                saver.execute("DELETE FROM axon_messages WHERE session_id = 's1' AND idx >= 1")
                saver.commit()
        listed = [info.session_id for info in await store.list_sessions()]
    finally:
        await store.aclose()
    assert listed == []  # the delete went through once the save committed


async def lock_waiters(libpq: str) -> int:
    def count() -> int:
        with psycopg.connect(libpq, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchone()
        return int(row[0]) if row else 0

    return await trio.to_thread.run_sync(count)
