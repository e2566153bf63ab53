"""The page's approval card used carelessly (Chromium, as tests/test_web_approval_page.py):
two tabs on one session deciding the same call, double clicks, a reload while the
approved call runs.

Two tabs: the second tab's card kept asking after the first tab's answer. Its click got
409 (``'approval_…' was decided already``, or ``already running a turn`` while the
first tab's continuation ran), and the page put the buttons back as for a refused edit:
a card asking for a call that the server had run, its answer never shown, and every
click another 409. Now a 409 shows the session as the server holds it (followed while
its turn runs), with the refusal's text."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, tool
from tests.test_web_approval_page import ask, respond
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.web.harness import WebServer, web_server

deleted: list[str] = []
gate: dict[str, trio.Event] = {}


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file (once the test lets it: the continuation runs meanwhile)."""
    gate["in"].set()
    await gate["go"].wait()
    deleted.append(path)
    return f"deleted {path}"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    deleted.clear()
    gate["in"], gate["go"] = trio.Event(), trio.Event()


def pages(sync_api: Any, server: WebServer, act: Any, tabs: int = 2) -> dict[str, Any]:
    """``act(pages, expect, seen)`` with ``tabs`` pages of one browser, the first open on
    the server; what it saw, with the POSTs to /api/chat each page sent."""
    seen: dict[str, Any] = {"page_errors": [], "posts": []}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            opened = []
            for tab in range(tabs):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(20_000)
                page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
                page.on(
                    "request",
                    lambda r, tab=tab: (
                        seen["posts"].append(tab)
                        if r.method == "POST" and r.url.endswith("/api/chat")
                        else None
                    ),
                )
                opened.append(page)
            opened[0].goto(server.url + "/")
            act(opened, sync_api.expect, seen)
        finally:
            browser.close()
    return seen


def release() -> None:
    """Let the approved call finish (from the browser's thread)."""
    trio.from_thread.run_sync(gate["go"].set)


ANSWER = "Results: deleted /tmp/x."


@pytest.mark.parametrize("when", ["after", "during"])
async def test_a_second_tab_deciding_a_call_the_first_decided_shows_what_the_server_holds(
    playwright_sync, when
):
    """Tab 1 approves; tab 2, opened on the session while the call asked, denies it
    after tab 1's continuation ended (``after``: 409 decided already) or while it runs
    (``during``: 409 already running a turn)."""

    def act(tabs: list, expect: Any, seen: dict[str, Any]) -> None:
        one, two = tabs
        card = ask(one, expect, "please delete /tmp/x")
        two.goto(one.url)  # (#session=...)
        stale = two.locator(".tool-card").first
        expect(stale).to_have_attribute("data-state", "approval-requested")
        card.get_by_role("button", name="Approve").click()
        trio.from_thread.run(gate["in"].wait)  # the continuation runs the call
        if when == "after":
            release()
            expect(one.locator(".msg.assistant .text")).to_have_text(ANSWER)
        stale.get_by_role("button", name="Deny").click()
        said = "was decided already" if when == "after" else "already running a turn"
        expect(two.locator(".notice.error")).to_contain_text(said)  # (why, once reloaded)
        expect(two.locator(".tool-card button")).to_have_count(0)
        if when == "during":  # the call as stored while it runs: approved; then followed
            expect(stale).to_have_attribute("data-state", "approval-responded")
            expect(two.locator("body")).to_have_attribute("data-busy", "1")
            release()
        # the server's: the call approved and run, its answer; no button left
        expect(two.locator(".msg.assistant .text")).to_have_text(ANSWER, timeout=10_000)
        seen["state"] = stale.get_attribute("data-state")
        seen["buttons"] = two.locator(".tool-card button").count()

    seen = await browse_tabs(playwright_sync, act, 2)
    assert seen["page_errors"] == []
    assert seen["state"] == "output-available" and seen["buttons"] == 0
    assert deleted == ["/tmp/x"]
    assert seen["posts"] == [0, 0, 1]  # the question, tab 1's answer, tab 2's refused one


async def test_double_clicks_answer_once(playwright_sync):
    """Guard: Approve, Deny, Edit and Approve with edits double-clicked: one answer
    each (the card's buttons go with the first click), one edit box."""

    def act(tabs: list, expect: Any, seen: dict[str, Any]) -> None:
        (page,) = tabs
        release()  # (the calls run at once)
        for text, button in [("/tmp/a", "Approve"), ("/tmp/d", "Deny")]:
            page.locator("#input").fill("please delete " + text)
            page.locator("#input").press("Enter")
            card = page.locator(".tool-card").last
            expect(card).to_have_attribute("data-state", "approval-requested")
            card.get_by_role("button", name=button).dblclick()
            expect(card).to_have_attribute(
                "data-state", "output-available" if button == "Approve" else "output-denied"
            )
            expect(page.locator("body")).to_have_attribute("data-busy", "")
        page.locator("#input").fill("please delete /tmp/e")
        page.locator("#input").press("Enter")
        card = page.locator(".tool-card").last
        expect(card).to_have_attribute("data-state", "approval-requested")
        card.get_by_role("button", name="Edit").dblclick()
        seen["boxes"] = card.locator(".edit-box").count()
        card.get_by_label("Edited input").fill('{"path": "/tmp/edited"}')
        card.get_by_role("button", name="Approve with edits").dblclick()
        expect(card).to_have_attribute("data-state", "output-available")
        expect(page.locator("body")).to_have_attribute("data-busy", "")
        seen["errors"] = page.locator(".notice.error, .edit-error").count()

    seen = await browse_tabs(playwright_sync, act, 1)
    assert seen["page_errors"] == [] and seen["errors"] == 0
    assert seen["boxes"] == 1
    assert seen["posts"] == [0] * 6  # three questions, three answers
    assert deleted == ["/tmp/a", "/tmp/edited"]


async def browse_tabs(playwright_sync: Any, act: Any, tabs: int) -> dict[str, Any]:
    agent = Agent(name="files", provider=ScriptedProvider(responder=respond), tools=[delete_file])
    async with web_server(agent) as server:
        with trio.fail_after(120):
            return await trio.to_thread.run_sync(pages, playwright_sync, server, act, tabs)


async def test_a_reload_while_the_approved_call_runs_shows_it_interrupted_as_stored(
    playwright_sync,
):
    """A pin of the embedded app's rule (leaving a turn's stream stops it): reloaded
    while its continuation runs the approved call, the page's leaving ends the turn;
    the reload shows what is stored, the call interrupted, no button to click again."""

    def act(tabs: list, expect: Any, seen: dict[str, Any]) -> None:
        (page,) = tabs
        card = ask(page, expect, "please delete /tmp/x")
        card.get_by_role("button", name="Approve").click()
        trio.from_thread.run(gate["in"].wait)
        page.reload()
        expect(page.locator(".notice.aborted")).to_contain_text("interrupted")
        card = page.locator(".tool-card").first
        seen["state"] = card.get_attribute("data-state")
        seen["buttons"] = card.locator("button").count()
        release()

    seen = await browse_tabs(playwright_sync, act, 1)
    assert seen["page_errors"] == []
    assert seen["state"] == "output-error" and seen["buttons"] == 0
    assert deleted == []  # (cancelled in the tool)


async def test_approving_a_call_of_a_session_deleted_elsewhere_shows_it_gone(playwright_sync):
    """Another client deletes the session while its card asks; Approve gets 404 (no call
    waits). Before, the card asked again (each click another 404) for a session that is
    no more; now the page reopens it: gone, a new chat. Nothing ran."""
    agent = Agent(name="files", provider=ScriptedProvider(responder=respond), tools=[delete_file])
    async with web_server(agent) as server:

        def act(tabs: list, expect: Any, seen: dict[str, Any]) -> None:
            (page,) = tabs
            card = ask(page, expect, "please delete /tmp/x")
            session_id = page.locator("#session-id").inner_text()
            trio.from_thread.run(delete_session, server, session_id)
            card.get_by_role("button", name="Approve").click()
            expect(page.locator(".welcome")).to_be_visible()
            seen["cards"] = page.locator(".tool-card").count()
            seen["title"] = page.locator("#title").inner_text()

        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(pages, playwright_sync, server, act, 1)
    assert seen["page_errors"] == []
    assert seen["cards"] == 0 and seen["title"] == "New chat"
    assert deleted == [] and seen["posts"] == [0, 0]


async def delete_session(server: WebServer, session_id: str) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        response = await client.request(
            "DELETE", f"/api/sessions/{session_id}", headers={"content-type": "application/json"}
        )
    assert response.status_code == 204
