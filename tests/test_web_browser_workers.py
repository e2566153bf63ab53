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
