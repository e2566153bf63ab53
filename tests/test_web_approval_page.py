"""The page's Approve / Deny buttons in a real browser (Chromium, driven by Playwright, as
in tests/test_web_browser.py): a call that needs approval shows on its tool card with
the two buttons; a click sends the continuation POST ``useChat`` would send, and the turn
goes on in the same assistant message."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, ToolMessage, UserMessage, tool
from runtime.app.web.signing import ApprovalSigner
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.web.harness import WebServer, web_server

deleted: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    deleted.append(path)
    return f"deleted {path}"


def respond(request: Any) -> list[Any]:
    """Asks to delete each path the user names; then says what the results were."""
    last = next(m for m in reversed(request.messages) if isinstance(m, UserMessage | ToolMessage))
    if isinstance(last, UserMessage):
        paths = [w for w in last.text.split() if w.startswith("/")]
        if not paths:
            return ["Nothing to delete."]
        return [
            chunk
            for i, path in enumerate(paths)
            for chunk in tool_call("delete_file", {"path": path}, tool_call_id=f"D{i}")
        ]
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    said = "; ".join(str(m.output if m.error is None else m.error) for m in results)
    return [f"Results: {said}."]


def approval_agent() -> Agent:
    deleted.clear()
    return Agent(name="files", provider=ScriptedProvider(responder=respond), tools=[delete_file])


def run_page(sync_api: Any, server: WebServer, act: Any) -> dict[str, Any]:
    """Open the page in Chromium, run ``act(page, expect, seen)``; what it saw."""
    seen: dict[str, Any] = {"page_errors": []}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.goto(server.url + "/")
            act(page, sync_api.expect, seen)
        finally:
            browser.close()
    return seen


def ask(page: Any, expect: Any, text: str) -> Any:
    """Send ``text``; the first tool card, once it asks."""
    page.locator("#input").fill(text)
    page.locator("#input").press("Enter")
    card = page.locator(".tool-card").first
    expect(card).to_have_attribute("data-state", "approval-requested")
    expect(page.locator("body")).to_have_attribute("data-busy", "")
    return card


async def drive(playwright_sync: Any, act: Any, **app_options: Any) -> dict[str, Any]:
    async with web_server(approval_agent(), **app_options) as server:
        with trio.fail_after(120):
            return await trio.to_thread.run_sync(run_page, playwright_sync, server, act)


async def test_approve_on_the_card_runs_the_call_and_the_answer_follows_in_the_same_bubble(
    playwright_sync, tmp_path: Path
):
    shots = tmp_path

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        card = ask(page, expect, "please delete /tmp/x")
        expect(card.locator(".t-name")).to_have_text("delete_file")
        expect(card.locator(".input pre")).to_contain_text('"path": "/tmp/x"')
        page.screenshot(path=str(shots / "asking.png"))
        card.get_by_role("button", name="Approve").click()
        expect(card).to_have_attribute("data-state", "output-available")
        expect(card.locator(".result pre")).to_have_text("deleted /tmp/x")
        expect(page.locator(".msg.assistant .text")).to_have_text("Results: deleted /tmp/x.")
        expect(page.locator(".turn-foot")).to_contain_text("stop")
        seen["bubbles"] = page.locator(".msg.assistant").count()
        seen["buttons"] = card.locator("button").count()
        page.screenshot(path=str(shots / "approved.png"))

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert seen["bubbles"] == 1 and seen["buttons"] == 0
    assert deleted == ["/tmp/x"]


async def test_deny_with_a_reason_shows_the_denial_and_the_model_reply(playwright_sync, tmp_path):
    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        card = ask(page, expect, "please delete /tmp/x")
        card.get_by_label("Reason").fill("keep it")
        card.get_by_role("button", name="Deny").click()
        expect(card).to_have_attribute("data-state", "output-denied")
        expect(card.locator(".denied")).to_have_text("Denied: keep it")
        expect(page.locator(".msg.assistant .text")).to_contain_text("denied: keep it")
        seen["bubbles"] = page.locator(".msg.assistant").count()
        page.screenshot(path=str(tmp_path / "denied.png"))

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert seen["bubbles"] == 1
    assert deleted == []


async def test_a_reload_while_a_call_waits_shows_the_buttons_and_approve_still_works(
    playwright_sync,
):
    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        ask(page, expect, "please delete /tmp/x")
        page.reload()
        card = page.locator(".tool-card").first
        expect(card).to_have_attribute("data-state", "approval-requested")
        card.get_by_role("button", name="Approve").click()
        expect(card).to_have_attribute("data-state", "output-available")
        expect(page.locator(".msg.assistant .text")).to_have_text("Results: deleted /tmp/x.")
        seen["bubbles"] = page.locator(".msg.assistant").count()

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert seen["bubbles"] == 1
    assert deleted == ["/tmp/x"]


async def test_answering_one_of_two_calls_keeps_the_other_cards_buttons(playwright_sync):
    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        ask(page, expect, "please delete /a and /b")
        first, second = page.locator(".tool-card").all()
        expect(second).to_have_attribute("data-state", "approval-requested")
        first.get_by_role("button", name="Approve").click()
        expect(page.locator(".notice.info")).to_contain_text("other calls still wait")
        expect(first).to_have_attribute("data-state", "approval-responded")
        seen["still_asking"] = second.get_by_role("button", name="Deny").count()
        second.get_by_role("button", name="Deny").click()
        expect(first).to_have_attribute("data-state", "output-available")
        expect(second).to_have_attribute("data-state", "output-denied")
        expect(page.locator(".msg.assistant .text")).to_contain_text("Results: deleted /a;")

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert seen["still_asking"] == 1
    assert deleted == ["/a"]


async def test_a_new_message_while_a_call_waits_marks_its_card_denied_as_superseded(
    playwright_sync,
):
    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        card = ask(page, expect, "please delete /tmp/x")
        page.locator("#input").fill("never mind")
        page.locator("#input").press("Enter")
        expect(page.locator(".msg.assistant").nth(1)).to_contain_text("Nothing to delete.")
        expect(card).to_have_attribute("data-state", "output-denied")
        expect(card.locator(".denied")).to_have_text("Denied: superseded")
        seen["buttons"] = card.locator("button").count()
        page.reload()  # the server recorded the same
        expect(page.locator(".tool-card").first.locator(".denied")).to_have_text(
            "Denied: superseded"
        )

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert seen["buttons"] == 0
    assert deleted == []


async def test_the_sidebar_marks_the_session_while_its_turn_waits(playwright_sync):
    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        card = ask(page, expect, "please delete /tmp/x")
        badge = page.locator("#sessions li .s-wait")
        expect(badge).to_have_text("waiting")
        seen["title"] = badge.get_attribute("title")
        card.get_by_role("button", name="Approve").click()
        expect(card).to_have_attribute("data-state", "output-available")
        expect(page.locator(".turn-foot")).to_contain_text("stop")
        expect(page.locator("#sessions li .s-wait")).to_have_count(0)
        expect(page.locator("#sessions li")).to_have_count(1)

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert seen["title"] == "waits for input: 1 call"


async def test_a_new_message_after_approving_one_of_two_calls_keeps_that_card_approved(
    playwright_sync,
):
    """The approval the server recorded (its 202: the other call still waited) stands
    when the person types instead of answering the other: the call runs before the new
    message, so its card is not marked denied; the unanswered one is superseded."""

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        ask(page, expect, "please delete /a and /b")
        first, second = page.locator(".tool-card").all()
        first.get_by_role("button", name="Approve").click()
        expect(page.locator(".notice.info")).to_contain_text("other calls still wait")
        page.locator("#input").fill("never mind")
        page.locator("#input").press("Enter")
        expect(page.locator(".msg.assistant").nth(1)).to_contain_text("Nothing to delete.")
        expect(second.locator(".denied")).to_have_text("Denied: superseded")
        seen["first_denied"] = first.locator(".denied").count()
        seen["first_state"] = first.get_attribute("data-state")
        page.reload()  # what the server stored: the approved call with its output
        cards = page.locator(".tool-card")
        expect(cards.first).to_have_attribute("data-state", "output-available")
        expect(cards.nth(1).locator(".denied")).to_have_text("Denied: superseded")

    seen = await drive(playwright_sync, act)
    assert seen["page_errors"] == []
    assert seen["first_denied"] == 0 and seen["first_state"] == "approval-responded"
    assert deleted == ["/a"]


@pytest.mark.parametrize("reload", [False, True], ids=["live", "reloaded"])
async def test_the_page_echoes_the_signed_approval_it_got(playwright_sync, reload):
    """With ``approval_secret`` the request carries a ``signature`` (the stream's, and
    the stored form's after a reload): the page sends it back with the answer, as the
    ``ai`` package does, and the server verifies it. Before, the page rebuilt the
    answered approval from its id alone."""

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        sent: list[Any] = []

        def posted(request: Any) -> None:
            if request.method == "POST" and request.url.endswith("/api/chat"):
                sent.append(request.post_data_json)

        page.on("request", posted)
        card = ask(page, expect, "please delete /tmp/x")
        if reload:
            page.reload()
            card = page.locator(".tool-card").first
            expect(card).to_have_attribute("data-state", "approval-requested")
        card.get_by_role("button", name="Approve").click()
        expect(card).to_have_attribute("data-state", "output-available")
        seen["sent"] = sent

    seen = await drive(playwright_sync, act, approval_secret="page-secret")
    assert seen["page_errors"] == [] and deleted == ["/tmp/x"]
    answer = seen["sent"][-1]
    (part,) = [p for p in answer["messages"][-1]["parts"] if p.get("toolCallId") == "D0"]
    approval = part["approval"]
    signer = ApprovalSigner(secret=b"page-secret")
    assert approval["approved"] is True
    assert approval["signature"] == signer.sign(
        answer["id"], approval["id"], "D0", "delete_file", {"path": "/tmp/x"}
    )


async def test_the_page_answers_two_calls_one_at_a_time_where_signatures_are_required(
    playwright_sync,
):
    """``--require-approval-signature``: every body the page sends (the first answer,
    202; the second, repeating the first) carries each answer's signature, after a
    reload too, so the page is a client that signs (docs/approval.md)."""

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        ask(page, expect, "please delete /a and /b")
        first, _ = page.locator(".tool-card").all()
        first.get_by_role("button", name="Approve").click()
        expect(page.locator(".notice.info")).to_contain_text("other calls still wait")
        page.reload()
        second = page.locator(".tool-card").nth(1)
        expect(second).to_have_attribute("data-state", "approval-requested")
        second.get_by_role("button", name="Approve").click()
        expect(second).to_have_attribute("data-state", "output-available")
        expect(page.locator(".msg.assistant .text")).to_contain_text("Results: deleted /a;")

    seen = await drive(
        playwright_sync, act, approval_secret="page-secret", require_approval_signature=True
    )
    assert seen["page_errors"] == []
    assert sorted(deleted) == ["/a", "/b"]
