"""The chat page in a real browser against a worker deployment's front end (real
PostgreSQL and Redis, a front end and a worker in this process, as tests/test_frontend.py
runs them; Chromium driven as tests/test_web_browser.py drives it)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, deployment, slow_agent
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS, playwright_sync  # noqa: F401


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def _stop_mid_turn(sync_api: Any, url: str, queue: Any) -> dict[str, Any]:
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
            page.locator("#input").fill("go")
            page.locator("#input").press("Enter")
            answer = page.locator(".msg.assistant .text").last
            expect(answer).to_contain_text("w w")
            seen["session_id"] = page.locator("#session-id").inner_text()
            page.locator("#stop").click()
            expect(page.locator(".msg.assistant .notice.aborted")).to_contain_text("aborted")
            seen["turn"] = trio.from_thread.run(_ended, queue, seen["session_id"])
        finally:
            browser.close()
    return seen


async def _ended(queue: Any, session_id: str) -> Any:
    with trio.fail_after(LIMIT):
        while True:
            turns = await queue.turns(session_id)
            if turns and turns[-1].finished:
                return turns[-1]
            await trio.sleep(0.05)


async def test_the_pages_stop_stops_the_workers_turn(pg_url, redis_url, playwright_sync):  # noqa: F811
    # The page stopped a turn by leaving its stream: the embedded app then cancels the
    # turn, but a front end's client is only a viewer, so the worker ran it to its end
    # (its tokens spent, its answer stored) while the page said it was stopped. The
    # page now also names its message to POST /api/chat/{id}/stop.
    async with deployment(pg_url, redis_url, slow_agent(200, 0.05)) as d:
        with trio.fail_after(LIMIT - 2):
            seen = await trio.to_thread.run_sync(
                _stop_mid_turn, playwright_sync, d.urls[0], d.queue
            )
    assert seen["page_errors"] == []
    assert (seen["turn"].status, seen["turn"].cancel_reason) == ("cancelled", "stopped by user")


def _stop_after_reload(sync_api: Any, url: str, queue: Any, session_id: str) -> dict[str, Any]:
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
            page.goto(f"{url}/#session={session_id}")  # the page, reloaded
            expect(page.locator("#stop")).to_be_visible()
            page.locator("#stop").click()
            seen["turn"] = trio.from_thread.run(_ended, queue, session_id)
            expect(page.locator("#send")).to_be_visible()  # the turn over, seen again
            expect(page.locator(".msg.assistant").last).to_contain_text("Result")
        finally:
            browser.close()
    return seen


async def test_the_reloaded_pages_stop_stops_a_running_continuation(
    pg_url,
    redis_url,
    playwright_sync,  # noqa: F811
):
    # An approved turn's continuation runs on a worker; the page that sent it was
    # reloaded. It showed the session's messages and no Stop (its Stop needed a stream of
    # its own): the turn could not be stopped from the page. A session opened busy now
    # has Stop, which stops its running turn (POST /api/chat/{id}/stop).
    import httpx

    from tests.test_relay_web import sse_events
    from tests.test_stop_continuation import _continue_until_text
    from tests.test_worker_approval import answer, approval_agent, asked, chat, payloads

    async with deployment(pg_url, redis_url, approval_agent(delay=0.2)) as d:
        url = d.urls[0]
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = sse_events((await client.post(f"{url}/api/chat", json=chat("s1"))).text)
            sent = answer("s1", payloads(first)[0]["messageId"], asked(first)["approvalId"], True)
            await _continue_until_text(client, url, sent, leave=True)
        with trio.fail_after(LIMIT - 2):
            seen = await trio.to_thread.run_sync(
                _stop_after_reload, playwright_sync, url, d.queue, "s1"
            )
    assert seen["page_errors"] == []
    assert (seen["turn"].status, seen["turn"].cancel_reason) == ("cancelled", "stopped by user")
