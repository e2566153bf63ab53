"""The page's delete control on a session of the sessions list, in Debian's Chromium
(Playwright, as tests/test_web_browser.py): it asks first (``confirm``), a dismissed
question deletes nothing, an accepted one removes the session from the list and the
store, and deleting the session open on the page shows a new chat, its running turn's
stream ended."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent, UserMessage
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.test_web_http import body
from tests.web.harness import WebServer, web_server


def agent() -> Agent:
    def respond(request: Any) -> list[Any]:
        user = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
        if "story" in str(user.content):
            return ["Once ", Sleep(600), "never told"]
        return ["Noted."]

    return Agent(name="demo", provider=ScriptedProvider(responder=respond))


def drive(sync_api: Any, server: WebServer) -> dict[str, Any]:
    expect = sync_api.expect
    seen: dict[str, Any] = {"errors": [], "dialogs": []}

    def stored(session_id: str) -> bool:
        return trio.from_thread.run(server.host.store.load, session_id) is not None

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.goto(server.url + "/")
            items = page.locator("#sessions li[data-session-id]")
            expect(items).to_have_count(2)
            gone = page.locator('#sessions li[data-session-id="gone"] .s-delete')

            def dismiss(dialog: Any) -> None:
                seen["dialogs"].append((dialog.type, dialog.message))
                dialog.dismiss()

            page.once("dialog", dismiss)
            gone.click()
            expect(items).to_have_count(2)
            seen["kept_after_dismiss"] = stored("gone")

            page.once("dialog", lambda dialog: dialog.accept())
            gone.click()
            expect(items).to_have_count(1)
            seen["stored_after_accept"] = stored("gone")
            seen["listed"] = items.evaluate_all("(lis) => lis.map((li) => li.dataset.sessionId)")

            # the session open on the page, its turn streaming: deleted from the list
            page.locator("#input").fill("Tell me a story")
            page.locator("#input").press("Enter")
            expect(page.locator(".msg.assistant .text").last).to_contain_text("Once")
            current = page.locator("#session-id").inner_text()
            seen["current"] = current
            page.once("dialog", lambda dialog: dialog.accept())
            page.locator(f'#sessions li[data-session-id="{current}"] .s-delete').click()
            expect(page.locator(".welcome")).to_be_visible()
            expect(page.locator("body")).to_have_attribute("data-turns", "1")  # stream ended
            seen["session_id_shown"] = page.locator("#session-id").inner_text()
            seen["stored_current"] = stored(current)
            expect(items).to_have_count(1)
            seen["listed_at_end"] = items.evaluate_all(
                "(lis) => lis.map((li) => li.dataset.sessionId)"
            )
        finally:
            browser.close()
    return seen


async def test_the_sessions_delete_control_asks_then_deletes_from_the_list_and_store(
    playwright_sync, tmp_path
):
    async with web_server(agent(), store=str(tmp_path / "s.db")) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for session_id in ("kept", "gone"):
                r = await client.post("/api/chat", json=body(session_id, f"hello {session_id}"))
                assert r.status_code == 200
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(drive, playwright_sync, server)

    assert seen["errors"] == []
    assert seen["dialogs"][0][0] == "confirm" and "Delete the session" in seen["dialogs"][0][1]
    assert seen["kept_after_dismiss"] is True
    assert seen["stored_after_accept"] is False
    assert seen["listed"] == ["kept"]
    assert seen["session_id_shown"] == ""
    assert seen["stored_current"] is False
    assert seen["listed_at_end"] == ["kept"]
