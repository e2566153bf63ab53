"""The chat page in a real browser drops the parts of a step that started over on a
fallback provider (``reset-step``): the half answer it showed is gone, the fallback's
answer stays, and the reloaded session shows the same (tests/test_web_browser.py has the
browser set-up; it skips without Playwright or Chromium)."""

from __future__ import annotations

from typing import Any

import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent, RetryPolicy
from runtime.errors import Overloaded
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS, playwright_sync  # noqa: F401
from tests.web.harness import WebServer, web_server

HALF = "Half an answer that will be void"


def fallback_agent() -> Agent:
    busy = Overloaded("overloaded", provider="scripted", status_code=529)
    # the pause lets the page render the half answer before the call fails
    primary = ScriptedProvider([[HALF, Sleep(0.5), busy]], name="primary")
    backup = ScriptedProvider([["The whole answer."]], name="backup")
    return Agent(name="fb", provider=[primary, backup], retry=RetryPolicy(max_attempts=1))


def drive(sync_api: Any, server: WebServer) -> dict[str, Any]:
    expect = sync_api.expect
    seen: dict[str, Any] = {"page_errors": []}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.goto(server.url + "/")
            page.locator("#input").fill("Go")
            page.locator("#input").press("Enter")
            message = page.locator(".msg.assistant").first
            expect(message.locator(".text")).to_contain_text(HALF)  # shown while it streams
            expect(message.locator(".turn-foot")).to_contain_text("stop · 1 step")
            seen["texts"] = message.locator(".text").all_inner_texts()
            page.reload()
            restored = page.locator(".msg.assistant").first
            expect(restored.locator(".text")).to_have_count(1)
            seen["restored"] = restored.locator(".text").all_inner_texts()
        finally:
            browser.close()
    return seen


async def test_the_page_drops_the_half_answer_of_a_step_that_started_over(playwright_sync):  # noqa: F811
    async with web_server(fallback_agent()) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(drive, playwright_sync, server)
    assert seen["page_errors"] == []
    assert [t.strip() for t in seen["texts"]] == ["The whole answer."]
    assert [t.strip() for t in seen["restored"]] == ["The whole answer."]
