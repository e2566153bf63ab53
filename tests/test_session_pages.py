"""The session listing by the page: ``GET /api/sessions?limit=&cursor=`` (the chat page's
app and the worker deployment's front end) and the CLI's ``sessions --limit``."""

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
from actors.stores import MemoryStore, SQLiteStore
from runtime import Agent
from runtime.app.web.http import MAX_PAGE_SIZE, PAGE_SIZE
from runtime.messages import UserMessage
from tests.web.harness import web_server

ROOT = Path(__file__).resolve().parent.parent


def _ui_user(text: str) -> dict[str, Any]:
    return {"id": "m-" + text, "role": "user", "parts": [{"type": "text", "text": text}]}


def _agent() -> Agent:
    return Agent(name="pages", provider=ScriptedProvider([]))


async def _fill(store: Any, count: int) -> list[str]:
    """``count`` sessions saved in order; their ids, most recent first."""
    for n in range(count):
        await store.save(f"s{n:03d}", 0, [UserMessage(content=f"hi {n}")], {"title": f"t{n}"})
    return [f"s{n:03d}" for n in reversed(range(count))]


async def _walk(client: httpx.AsyncClient, limit: int | None) -> tuple[list[str], int]:
    listed, pages, cursor = [], 0, None
    while True:
        params = {} if limit is None else {"limit": str(limit)}
        if cursor is not None:
            params["cursor"] = cursor
        answer = (await client.get("/api/sessions", params=params)).json()
        pages += 1
        listed += [s["session_id"] for s in answer["sessions"]]
        assert all(
            {"title", "message_count", "busy", "waiting", "meta"} <= set(s)
            for s in answer["sessions"]
        )
        cursor = answer["next_cursor"]
        if cursor is None:
            return listed, pages


async def test_the_api_answers_a_page_with_the_next_cursor_and_none_at_the_end():
    store = MemoryStore()
    expected = await _fill(store, PAGE_SIZE + 7)
    async with web_server(_agent(), store=store) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = (await client.get("/api/sessions")).json()
            assert [s["session_id"] for s in first["sessions"]] == expected[:PAGE_SIZE]
            assert isinstance(first["next_cursor"], str)
            assert await _walk(client, None) == (expected, 2)
            assert await _walk(client, 10) == (expected, 6)
            assert await _walk(client, 57) == (expected, 1)  # exactly all: no next page
            last = (await client.get("/api/sessions", params={"limit": "57"})).json()
            assert last["next_cursor"] is None


@pytest.mark.parametrize(
    "params",
    [
        {"limit": "0"},
        {"limit": "-1"},
        {"limit": "x"},
        {"limit": "1.5"},
        {"limit": str(MAX_PAGE_SIZE + 1)},
        {"limit": "9" * 40},
        {"cursor": "nope"},
        {"cursor": "-5"},
        {"cursor": "9" * 40},
        [("limit", "2"), ("limit", "3")],
    ],
)
async def test_a_bad_limit_or_cursor_is_a_400_that_says_so(params):
    store = MemoryStore()
    await _fill(store, 3)
    async with web_server(_agent(), store=store) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.get("/api/sessions", params=params)
    assert r.status_code == 400
    assert any(word in r.json()["error"] for word in ("limit", "cursor"))


class _OldStore(MemoryStore):
    """A store written before paging: ``list_sessions`` takes no arguments."""

    async def list_sessions(self):  # type: ignore[override]
        return await super().list_sessions()


async def test_a_store_written_before_paging_is_paged_by_the_api_too():
    store = _OldStore()
    expected = await _fill(store, 12)
    async with web_server(_agent(), store=store) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            assert await _walk(client, 5) == (expected, 3)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "sessions", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


async def test_the_cli_lists_a_page_and_says_how_to_see_more(tmp_path):
    db = str(tmp_path / "s.db")
    store = await SQLiteStore.open(db)
    try:
        expected = await _fill(store, 7)
    finally:
        await store.aclose()
    first = _cli("--store", db, "--limit", "3")
    assert first.returncode == 0, first.stderr
    assert [line.split("\t")[0] for line in first.stdout.splitlines()] == expected[:3]
    hint = first.stderr.strip()
    assert "--after" in hint and "--all" in hint
    cursor = hint.split("--after ")[1].split(",")[0]
    rest = _cli("--store", db, "--limit", "10", "--after", cursor, "--json")
    answer = json.loads(rest.stdout)
    assert [s["session_id"] for s in answer["sessions"]] == expected[3:]
    assert answer["next_cursor"] is None and rest.stderr == ""
    every = _cli("--store", db, "--all")
    assert [line.split("\t")[0] for line in every.stdout.splitlines()] == expected
    assert every.stderr == ""
    bad = _cli("--store", db, "--after", "nope")
    assert bad.returncode == 2 and "--after" in bad.stderr
    assert _cli("--store", db, "--limit", "0").returncode == 2


def _page_through(sync_api: Any, url: str) -> dict[str, Any]:
    """The chat page: its first page of sessions, the next one when the list is scrolled
    to its end, the last one from the "More sessions" button."""
    from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS

    expect = sync_api.expect
    seen: dict[str, Any] = {"page_errors": [], "requests": []}
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:
            pytest.skip(f"Chromium at {CHROMIUM} did not start under Playwright: {exc}")
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.on(
                "request",
                lambda r: seen["requests"].append(r.url) if "/api/sessions" in r.url else None,
            )
            page.goto(url + "/")
            items = page.locator("#sessions li[data-session-id]")
            expect(items).to_have_count(50)
            seen["first"] = items.evaluate_all("(lis) => lis.map((li) => li.dataset.sessionId)")
            more = page.locator("#more-sessions")
            expect(more).to_have_count(1)
            more.scroll_into_view_if_needed()  # scrolled to the end: the next page loads
            expect(items).to_have_count(100)
            expect(more).to_have_count(1)
            # pressed (from script: the list may have scrolled it into view and loading
            # already, which a second press does not repeat)
            page.evaluate("() => document.getElementById('more-sessions')?.click()")
            expect(items).to_have_count(120)
            expect(page.locator("#more-sessions")).to_have_count(0)
            seen["all"] = items.evaluate_all("(lis) => lis.map((li) => li.dataset.sessionId)")
            seen["titles"] = page.locator("#sessions .s-title").last.inner_text()
        finally:
            browser.close()
    return seen


async def test_the_chat_page_lists_sessions_a_page_at_a_time(tmp_path):
    from tests.test_web_browser import CHROMIUM

    try:
        from playwright import sync_api
    except ImportError:
        pytest.skip("playwright (Python) is not installed: pip install playwright")
    if not os.path.exists(CHROMIUM):  # noqa: ASYNC240 (a stat before the test starts)
        pytest.skip(f"no Chromium at {CHROMIUM}")
    store = await SQLiteStore.open(tmp_path / "s.db")
    expected = await _fill(store, 120)
    async with web_server(_agent(), store=store) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(_page_through, sync_api, server.url)
    assert seen["page_errors"] == []
    assert seen["first"] == expected[:50] and seen["all"] == expected
    assert seen["titles"] == "t0"
    pages = [u for u in seen["requests"] if "/api/sessions?" in u]
    assert len(pages) == 3 and all("limit=50" in u for u in pages)
    assert "cursor=" not in pages[0] and all("cursor=" in u for u in pages[1:])


def _turn_after_paging(sync_api: Any, url: str) -> dict[str, Any]:
    """The chat page: the sessions list scrolled to its second page, then a turn in a new
    chat, then the rest of the list from "More sessions"."""
    from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS

    expect = sync_api.expect
    seen: dict[str, Any] = {"page_errors": []}
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:
            pytest.skip(f"Chromium at {CHROMIUM} did not start under Playwright: {exc}")
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.goto(url + "/")
            items = page.locator("#sessions li[data-session-id]")
            expect(items).to_have_count(50)
            page.locator("#more-sessions").scroll_into_view_if_needed()
            expect(items).to_have_count(100)
            page.locator("#input").fill("hello")
            page.locator("#input").press("Enter")
            expect(page.locator(".msg.assistant .text").last).to_contain_text("hi there")
            expect(page.locator("body")).to_have_attribute("data-busy", "")
            # the list was read again after the turn: the new session on top, and the
            # second page still there (the first page alone was 50 and "More")
            seen["session_id"] = page.locator("#session-id").inner_text()
            expect(items.first).to_have_attribute("data-session-id", seen["session_id"])
            expect(items).to_have_count(101)
            seen["after_turn"] = items.evaluate_all(
                "(lis) => lis.map((li) => li.dataset.sessionId)"
            )
            page.evaluate("() => document.getElementById('more-sessions')?.click()")
            expect(items).to_have_count(121)
            expect(page.locator("#more-sessions")).to_have_count(0)
            seen["all"] = items.evaluate_all("(lis) => lis.map((li) => li.dataset.sessionId)")
        finally:
            browser.close()
    return seen


async def test_a_turn_keeps_the_sessions_the_list_had_loaded_by_scrolling(tmp_path):
    # After each turn the page read the sessions' first page again and showed it alone:
    # a list scrolled to its third page went back to 50 sessions and "More". The first
    # page is now merged with what was loaded: nothing lost, nothing twice, in order.
    from tests.test_web_browser import CHROMIUM

    try:
        from playwright import sync_api
    except ImportError:
        pytest.skip("playwright (Python) is not installed: pip install playwright")
    if not os.path.exists(CHROMIUM):  # noqa: ASYNC240 (a stat before the test starts)
        pytest.skip(f"no Chromium at {CHROMIUM}")
    store = await SQLiteStore.open(tmp_path / "s.db")
    expected = await _fill(store, 120)
    agent = Agent(name="pages", provider=ScriptedProvider([["hi there"]]))
    async with web_server(agent, store=store) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(_turn_after_paging, sync_api, server.url)
    assert seen["page_errors"] == []
    assert seen["after_turn"] == [seen["session_id"], *expected[:100]]
    assert seen["all"] == [seen["session_id"], *expected]


async def test_a_postgres_page_is_a_top_n_scan_or_an_index_range_never_a_full_sort(pg_url):
    """This schema has no index on ``update_seq`` (every save changes it: an index would
    make each save non-HOT), so a page is the sessions scanned into a heap of ``limit``
    rows; on a store created before that schema, with ``axon_sessions_by_update``, it is
    a backward range of the index from the cursor. Either way the counts are for the
    page's rows only."""
    import psycopg

    from actors.stores import postgres as pg
    from actors.stores.postgres import PostgresStore

    store = await PostgresStore.open(pg_url)
    await store.aclose()
    base, schema = pg_url.split("?schema=")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        conn.execute(
            "INSERT INTO axon_sessions (session_id, meta, update_seq, version) "
            "SELECT 's' || n, '{}'::bytea, nextval('axon_update_seq'), n "
            "FROM generate_series(1, 20000) AS n"
        )
        conn.execute("ANALYZE axon_sessions")

        def plan(sql: str, args: tuple[Any, ...]) -> str:
            rows = conn.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql, args)
            return "\n".join(r[0] for r in rows)

        for sql, args in ((pg._LIST_SQL, (50,)), (pg._LIST_AFTER_SQL, (10_000, 50))):
            unindexed = plan(sql, args)
            assert "top-N heapsort" in unindexed, unindexed
            assert "SubPlan" in unindexed and "loops=50" in unindexed, unindexed
        conn.execute("CREATE INDEX axon_sessions_by_update ON axon_sessions (update_seq)")
        conn.execute("ANALYZE axon_sessions")
        for sql, args in ((pg._LIST_SQL, (50,)), (pg._LIST_AFTER_SQL, (10_000, 50))):
            indexed = plan(sql, args)
            assert "Index Scan Backward using axon_sessions_by_update" in indexed, indexed
            assert "top-N heapsort" not in indexed and "Seq Scan" not in indexed, indexed
    store = await PostgresStore.open(pg_url)
    try:
        page = await store.list_sessions(limit=3, after="10000")
        assert [i.session_id for i in page] == ["s9999", "s9998", "s9997"]
    finally:
        await store.aclose()


async def test_a_running_session_is_listed_once_whether_stored_or_not():
    """The first page leads with the sessions whose first turn runs (not stored yet); a
    stored session a turn runs in again stays at its place in the listing, even when
    that is on a later page, and is not listed on the first page too."""
    store = MemoryStore()
    await _fill(store, 5)  # s000 the oldest
    slow = ScriptedProvider(steps=[["Once", Sleep(30), " more"]])
    async with web_server(Agent(name="pages", provider=slow), store=store) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=20) as client:
            streams = []
            for sid in ("s000", "fresh"):
                chat = {"id": sid, "messages": [_ui_user(sid)]}
                streams.append(client.stream("POST", "/api/chat", json=chat))
            async with streams[0] as first, streams[1] as second:
                kept = [r.aiter_lines() for r in (first, second)]  # dropped: closed
                for lines in kept:
                    assert (await anext(lines)).startswith("data: {")
                assert all(server.host.sessions[s].busy for s in ("s000", "fresh"))
                assert await store.version("s000") == 1  # not saved again while it runs
                listed: list[tuple[str, bool]] = []
                cursor = None
                while True:
                    params = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
                    answer = (await client.get("/api/sessions", params=params)).json()
                    listed += [(s["session_id"], s["busy"]) for s in answer["sessions"]]
                    cursor = answer["next_cursor"]
                    if cursor is None:
                        break
    ids = [sid for sid, _ in listed]
    assert len(ids) == len(set(ids)) and set(ids) == {"fresh", *(f"s{n:03d}" for n in range(5))}
    assert listed[0] == ("fresh", True) and listed[-1] == ("s000", True)
