"""The page's card for a sub-agent's approval passed up (``as_tool(pass_approvals=True)``)
used carelessly (Chromium, as tests/test_web_approval_page_careless.py does for a call of
the turn's own): a reload while it asks, two tabs deciding it, a reload while the
approved sub call runs. The sub call runs at most once, and a tab always ends showing
what the server holds."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, tool
from tests.test_approval_nested_pass import _helper_model
from tests.test_approval_nested_pass_client import _parent_model  # (answers "never mind")
from tests.test_web_approval_page import ask
from tests.test_web_approval_page_careless import pages
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.web.harness import web_server

paid: list[str] = []
gate: dict[str, trio.Event] = {}
ANSWER = "parent saw: paid"


@tool(needs_approval=True)
async def wire_money(to: str) -> str:
    """Wire money (once the test lets it: the continuation runs meanwhile)."""
    gate["in"].set()
    await gate["go"].wait()
    paid.append(to)
    return "wired"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    paid.clear()
    gate["in"], gate["go"] = trio.Event(), trio.Event()


def release() -> None:
    trio.from_thread.run_sync(gate["go"].set)


def calling() -> Agent:
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_helper_model), tools=[wire_money]
    )
    return Agent(
        name="top",
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


async def browse(playwright_sync: Any, act: Any, tabs: int) -> dict[str, Any]:
    async with web_server(calling()) as server:
        with trio.fail_after(120):
            return await trio.to_thread.run_sync(pages, playwright_sync, server, act, tabs)


async def test_a_reload_while_a_passed_up_approval_asks_asks_again_for_the_sub_call(
    playwright_sync,
):
    def act(tabs: list, expect: Any, seen: dict[str, Any]) -> None:
        (page,) = tabs
        ask(page, expect, "pay x")
        page.reload()
        card = page.locator(".tool-card").first
        expect(card).to_have_attribute("data-state", "approval-requested")
        seen["asking"] = card.locator(".asked .label").text_content()
        release()
        card.get_by_role("button", name="Approve").click()
        expect(page.locator(".msg.assistant .text").last).to_have_text(ANSWER)
        seen["state"] = card.get_attribute("data-state")

    seen = await browse(playwright_sync, act, 1)
    assert seen["page_errors"] == []
    assert seen["asking"] == "Asks to run wire_money"
    assert seen["state"] == "output-available"
    assert paid == ["x"] and seen["posts"] == [0, 0]


@pytest.mark.parametrize("when", ["after", "during"])
async def test_a_second_tab_deciding_a_passed_up_approval_the_first_decided_shows_the_servers(
    playwright_sync, when
):
    """Tab 1 approves the sub call; tab 2, open on the session while it asked, denies it
    once tab 1's continuation ended (``after``) or while the sub call runs (``during``):
    a 409, and tab 2 shows the call approved and run, its answer, no button."""

    def act(tabs: list, expect: Any, seen: dict[str, Any]) -> None:
        one, two = tabs
        card = ask(one, expect, "pay x")
        two.goto(one.url)
        stale = two.locator(".tool-card").first
        expect(stale).to_have_attribute("data-state", "approval-requested")
        card.get_by_role("button", name="Approve").click()
        trio.from_thread.run(gate["in"].wait)  # the sub-agent's call runs
        if when == "after":
            release()
            expect(one.locator(".msg.assistant .text").last).to_have_text(ANSWER)
        stale.get_by_role("button", name="Deny").click()
        expect(two.locator(".notice.error")).to_be_visible()
        seen["said"] = two.locator(".notice.error").text_content()
        expect(two.locator(".tool-card button")).to_have_count(0)
        if when == "during":
            release()
        expect(two.locator(".msg.assistant .text").last).to_have_text(ANSWER, timeout=10_000)
        seen["state"] = stale.get_attribute("data-state")
        seen["asked"] = stale.locator(".asked .label").text_content()

    seen = await browse(playwright_sync, act, 2)
    assert seen["page_errors"] == []
    said = "was decided already" if when == "after" else "already running a turn"
    assert said in seen["said"]
    assert seen["state"] == "output-available"
    assert seen["asked"] == "Approved to run wire_money"
    assert paid == ["x"]
    assert seen["posts"] == [0, 0, 1]


async def test_a_reload_while_the_approved_sub_call_runs_leaves_the_session_usable(
    playwright_sync,
):
    """Leaving the continuation's stream ends the turn (the embedded app's rule): the
    sub call is cut short in the sub-agent and never runs later; the reload shows the
    call as stored, no button; the next message is a turn of its own, not refused as
    waiting for the sub-agent."""

    def act(tabs: list, expect: Any, seen: dict[str, Any]) -> None:
        (page,) = tabs
        card = ask(page, expect, "pay x")
        card.get_by_role("button", name="Approve").click()
        trio.from_thread.run(gate["in"].wait)
        page.reload()
        expect(page.locator(".notice.aborted")).to_contain_text("interrupted")
        card = page.locator(".tool-card").first
        seen["state"] = card.get_attribute("data-state")
        seen["buttons"] = card.locator("button").count()
        release()
        page.locator("#input").fill("never mind")
        page.locator("#input").press("Enter")
        expect(page.locator(".msg.assistant .text").last).to_have_text("fine")
        seen["errors"] = page.locator(".notice.error").count()

    seen = await browse(playwright_sync, act, 1)
    assert seen["page_errors"] == []
    assert seen["state"] == "output-error" and seen["buttons"] == 0
    assert seen["errors"] == 0
    assert paid == []  # (cut short in the tool; not run again by the next turn)


async def test_a_tab_opening_the_session_while_the_approved_sub_call_runs_shows_it_decided(
    playwright_sync,
):
    """Tab 2 reads the session (its stored form) between tab 1's decision and the
    continuation's end: the card says approved, asks nothing, and the tab follows the
    turn to its answer."""

    def act(tabs: list, expect: Any, seen: dict[str, Any]) -> None:
        one, two = tabs
        card = ask(one, expect, "pay x")
        card.get_by_role("button", name="Approve").click()
        trio.from_thread.run(gate["in"].wait)
        two.goto(one.url)
        mid = two.locator(".tool-card").first
        expect(mid).to_have_attribute("data-state", "approval-responded")
        expect(two.locator("body")).to_have_attribute("data-busy", "1")
        seen["asked"] = mid.locator(".asked .label").text_content()
        seen["buttons"] = mid.locator("button").count()
        release()
        expect(two.locator(".msg.assistant .text").last).to_have_text(ANSWER, timeout=10_000)
        seen["state"] = two.locator(".tool-card").first.get_attribute("data-state")

    seen = await browse(playwright_sync, act, 2)
    assert seen["page_errors"] == []
    assert seen["asked"] == "Approved to run wire_money" and seen["buttons"] == 0
    assert seen["state"] == "output-available"
    assert paid == ["x"] and seen["posts"] == [0, 0]
