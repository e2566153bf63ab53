"""The page says why a turn, or a sub-agent's call, is quiet (Chromium, as
tests/test_web_approval_page.py): the stream's transient ``data-throttled`` (a model
call waits for a rate limit) and ``data-budget-wait`` (for output tokens the calls
beside it hold) were dropped, the turn's own and a sub-agent's (``data.toolCallId``, the
call it runs under at any depth) alike: a run stopped for a minute with nothing shown.
Now the turn's shows in its step, a sub-agent's on its call's card, each until that
goes on."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, ToolContext, tool
from runtime import output as o
from runtime.ratelimit import RateLimit
from tests.test_web_approval_page import run_page
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.web.harness import web_server

gate: dict[str, trio.Event] = {}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    gate["go"] = trio.Event()


def release() -> None:
    """Let the wait end (from the browser's thread)."""
    trio.from_thread.run_sync(gate["go"].set)


class GatedClock:
    """A rate limiter's clock whose wait lasts until the test lets it end."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        await gate["go"].wait()
        self.t += seconds


@tool
async def look(q: str) -> str:
    """Look something up."""
    return f"found {q}"


@tool
async def research(topic: str, context: ToolContext) -> str:
    """Stands for an agent used as a tool: its sub-turn waits for output budget, then
    (its own sub-agent's, two deep) for a rate limit, until the test lets it go on."""
    await context.emit(o.BudgetWait(step=0, want=90, available=10, held=80, ahead=1))
    inner = o.Throttled(step=0, wait=42.0, reason="tokens")
    await context.emit(o.ToolStream(step=0, tool_call_id="inner", tool_name="deeper", chunk=inner))
    await gate["go"].wait()
    await context.emit(o.TextDelta(step=0, part_id="p", text="Half of it"))
    return f"all about {topic}"


def wait_notices(page: Any) -> list[tuple[str | None, str]]:
    found = page.locator(".wait")
    return [
        (found.nth(i).get_attribute("data-wait"), found.nth(i).text_content() or "")
        for i in range(found.count())
    ]


async def test_the_turns_rate_limit_wait_shows_in_its_step_until_the_answer_streams(
    playwright_sync,
):
    limit = RateLimit(requests_per_minute=1, clock=GatedClock())
    steps = [[*tool_call("look", {"q": "x"}, tool_call_id="L")], ["Found it."]]
    agent = Agent(provider=ScriptedProvider(steps, rate_limit=limit), tools=[look])

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        page.locator("#input").fill("look x up")
        page.locator("#input").press("Enter")
        notice = page.locator(".msg.assistant .step .notice.wait")
        expect(notice).to_have_count(1)
        seen["waiting"] = wait_notices(page)
        seen["steps"] = page.locator(".msg.assistant .step").count()
        release()
        expect(page.locator(".msg.assistant .text")).to_have_text("Found it.")
        seen["after"] = wait_notices(page)

    async with web_server(agent) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(run_page, playwright_sync, server, act)
    assert seen["page_errors"] == []
    assert seen["waiting"] == [
        ("throttled", "⏳ Waiting for the rate limit on requests (about 60 s)")
    ]
    assert seen["steps"] == 2  # (in the step whose model call waits)
    assert seen["after"] == []


async def test_a_sub_agents_waits_show_on_its_calls_card_until_it_goes_on(playwright_sync):
    steps = [[*tool_call("research", {"topic": "owls"}, tool_call_id="R")], ["Done."]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[research])

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        page.locator("#input").fill("research owls")
        page.locator("#input").press("Enter")
        card = page.locator('.tool-card[data-tool-call-id="R"]')
        expect(card.locator(".tool-sec.wait")).to_have_attribute("data-wait", "throttled")
        seen["waiting"] = wait_notices(page)
        seen["on_card"] = card.locator(".wait").count()
        release()
        expect(card).to_have_attribute("data-state", "output-available")
        expect(page.locator(".msg.assistant .text")).to_have_text("Done.")
        seen["after"] = wait_notices(page)

    async with web_server(agent) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(run_page, playwright_sync, server, act)
    assert seen["page_errors"] == []
    # the budget wait, replaced by the deeper sub-agent's rate limit: one line, the last
    assert seen["waiting"] == [
        ("throttled", "⏳ Waiting for the rate limit on tokens (about 42 s)")
    ]
    assert seen["on_card"] == 1
    assert seen["after"] == []


async def test_a_sub_agents_budget_wait_says_what_it_waits_for_and_its_text_ends_it(
    playwright_sync,
):
    @tool
    async def summarise(topic: str, context: ToolContext) -> str:
        """Waits for output budget, then streams."""
        await context.emit(o.BudgetWait(step=0, want=90, available=10, held=80, ahead=1))
        await gate["go"].wait()
        await context.emit(o.TextDelta(step=0, part_id="p", text="Owls are"))
        await gate["done"].wait()
        return "Owls are birds."

    gate["done"] = trio.Event()
    steps = [[*tool_call("summarise", {"topic": "owls"}, tool_call_id="S")], ["Done."]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[summarise])

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        page.locator("#input").fill("summarise owls")
        page.locator("#input").press("Enter")
        card = page.locator('.tool-card[data-tool-call-id="S"]')
        expect(card.locator(".tool-sec.wait")).to_have_count(1)
        seen["waiting"] = wait_notices(page)
        release()
        expect(card.locator(".result pre")).to_have_text("Owls are")
        seen["streaming"] = wait_notices(page)
        trio.from_thread.run_sync(gate["done"].set)
        expect(page.locator(".msg.assistant .text")).to_have_text("Done.")

    async with web_server(agent) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(run_page, playwright_sync, server, act)
    assert seen["page_errors"] == []
    assert seen["waiting"] == [
        (
            "budget-wait",
            "⏳ Waiting for output budget: wants 90 tokens, 10 free, 80 held by calls in "
            "flight, 1 ahead",
        )
    ]
    assert seen["streaming"] == []  # its text came: it went on


async def test_a_reload_while_the_turn_waits_for_the_rate_limit_shows_it_as_stored(
    playwright_sync,
):
    """Leaving the stream ends the turn (the embedded app's rule), in the limiter's wait
    too: the reload shows the turn interrupted and no wait line (a notice is never
    stored); the next message is answered."""
    limit = RateLimit(requests_per_minute=1, clock=GatedClock())
    steps = [[*tool_call("look", {"q": "x"}, tool_call_id="L")], ["Found it."]]
    agent = Agent(provider=ScriptedProvider(steps, rate_limit=limit), tools=[look])

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        page.locator("#input").fill("look x up")
        page.locator("#input").press("Enter")
        expect(page.locator(".notice.wait")).to_have_count(1)
        page.reload()
        expect(page.locator(".notice.aborted")).to_contain_text("interrupted")
        seen["reloaded"] = wait_notices(page)
        seen["card"] = page.locator(".tool-card").first.get_attribute("data-state")
        release()
        page.locator("#input").fill("again")
        page.locator("#input").press("Enter")
        expect(page.locator(".msg.assistant .text").last).to_have_text("Found it.")
        seen["errors"] = page.locator(".notice.error").count()

    async with web_server(agent) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(run_page, playwright_sync, server, act)
    assert seen["page_errors"] == []
    assert seen["reloaded"] == [] and seen["card"] == "output-available"
    assert seen["errors"] == 0
