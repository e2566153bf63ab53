"""The page in a real browser: Debian's Chromium, driven by Playwright for Python.

The server runs in the test's Trio loop; Playwright's sync API drives the browser from a
worker thread (``trio.to_thread``) and calls back into the loop to check the store. No
browser is downloaded: without ``playwright`` or ``/usr/bin/chromium`` the test skips.

The screenshot (1280 px wide, at 2x) goes to the test's tmp dir, and to
docs/screenshot.png when that file is missing or ``AXON_UPDATE_SCREENSHOT=1`` is set (so
test runs leave the docs alone).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent, AssistantMessage, Hooks, ReasoningChunk, UserMessage
from runtime.app.demo import demo_provider, get_time, get_weather
from tests.web.harness import WebServer, wait_idle, web_server

CHROMIUM = os.environ.get("AXON_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = Path(__file__).resolve().parents[1] / "docs" / "screenshot.png"
STORY = "Once upon a time there was a runtime that streamed every token as it came".split() * 3
"""Told at 0.3 s a word (about 13 s): the test stops it after two words."""


def browser_agent(finished: list[Any]) -> Agent:
    """The demo agent (reasoning, get_weather, answer), plus a slow story to stop."""
    demo = demo_provider()

    def respond(request: Any) -> list[Any]:
        user = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
        if "story" in user.content:
            words = [p for i, w in enumerate(STORY) for p in (Sleep(0.3), " "[: i > 0] + w)]
            return [ReasoningChunk(text="A long story, told slowly.", provider="scripted"), *words]
        return list(demo.select(request))

    async def on_turn_finish(event: Any) -> None:
        finished.append(event)

    return Agent(
        name="demo",
        provider=ScriptedProvider(responder=respond, delay=0.01),
        tools=[get_weather, get_time],
        hooks=Hooks(on_turn_finish=on_turn_finish),
    )


@pytest.fixture
def playwright_sync() -> Any:
    try:
        from playwright import sync_api
    except ImportError:
        pytest.skip("playwright (Python) is not installed: pip install playwright")
    if not (os.path.exists(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    return sync_api


def drive(sync_api: Any, server: WebServer, shot: Path) -> dict[str, Any]:
    """Everything the browser does, in one thread (Playwright's sync objects stay in it)."""
    expect = sync_api.expect
    seen: dict[str, Any] = {"page_errors": [], "session_gets": []}
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except Exception as exc:  # an unusable browser build: not this project's failure
            pytest.skip(f"Chromium at {CHROMIUM} did not start under Playwright: {exc}")
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=2)
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: seen["page_errors"].append(str(e)))
            page.on(
                "request",
                lambda r: (
                    seen["session_gets"].append(r.url.split("/api/sessions/")[1])
                    if r.method == "GET" and "/api/sessions/" in r.url
                    else None
                ),
            )
            page.goto(server.url + "/")
            expect(page.locator(".welcome")).to_be_visible()
            expect(page.locator("#agent-info")).to_contain_text("demo")

            # -- a turn: reasoning, a tool card with its result, the answer ---------------
            page.evaluate(
                """() => { window.__mutations = 0;
                new MutationObserver((ms) => { window.__mutations += ms.length; })
                  .observe(document.getElementById('thread'),
                           {subtree: true, childList: true, characterData: true}); }"""
            )
            page.locator("#input").fill("What's the weather in Paris?")
            page.locator("#input").press("Enter")
            expect(page.locator(".msg.user .bubble")).to_have_text("What's the weather in Paris?")
            reasoning = page.locator("details.reasoning").first
            expect(reasoning).to_be_visible()
            expect(page.locator("#stop")).to_be_visible()  # stop shows while it streams
            card = page.locator(".tool-card").first
            expect(card).to_have_attribute("data-state", "output-available")
            expect(card.locator(".t-name")).to_have_text("get_weather")
            expect(card.locator(".input pre")).to_contain_text('"city": "Paris"')
            expect(card.locator(".result pre")).to_contain_text('"temperature_c"')
            answer = page.locator(".msg.assistant .text").last
            expect(answer).to_contain_text("in Paris right now")
            expect(page.locator("body")).to_have_attribute("data-busy", "")
            expect(page.locator("#send")).to_be_visible()
            expect(reasoning).to_contain_text("I should call get_weather")
            expect(reasoning.locator("summary")).to_contain_text("Reasoning ·")
            expect(page.locator(".step-divider")).to_have_count(1)
            expect(page.locator(".turn-foot")).to_contain_text("stop · 2 steps")
            seen["mutations"] = page.evaluate("window.__mutations")
            seen["session_id"] = page.locator("#session-id").inner_text()
            expect(page.locator("#sessions li.active")).to_contain_text(
                "What's the weather in Paris?"
            )
            for details in page.locator("details.reasoning").all():
                details.evaluate("(d) => { d.open = true; }")
            page.screenshot(path=str(shot), animations="disabled")

            # -- stop mid-stream ----------------------------------------------------------
            page.locator("#input").fill("Tell me a long story")
            page.locator("#input").press("Enter")
            second = page.locator(".msg.assistant").nth(1)
            expect(second.locator(".text")).to_contain_text("Once upon")
            page.locator("#stop").click()
            expect(second.locator(".notice.aborted")).to_contain_text("Turn aborted")
            expect(page.locator("body")).to_have_attribute("data-busy", "")
            expect(second.locator(".streaming")).to_have_count(0)
            seen["partial_text"] = second.locator(".text").inner_text()
            # the server cancels the turn and saves it: wait for that in the Trio loop
            trio.from_thread.run(wait_idle, server, seen["session_id"])

            # -- reload: the session comes back (from the URL, then from the list) --------
            page.reload()
            expect(page.locator(".msg.user")).to_have_count(2)
            page.goto(server.url + "/")
            expect(page.locator(".welcome")).to_be_visible()
            item = page.locator("#sessions li", has_text="What's the weather in Paris?")
            expect(item).to_have_count(1)
            item.locator("button.s-open").click()  # (not its delete control)
            expect(page.locator("#title")).to_have_text("What's the weather in Paris?")
            expect(page.locator(".msg.user .bubble")).to_have_text(
                ["What's the weather in Paris?", "Tell me a long story"]
            )
            first = page.locator(".msg.assistant").nth(0)
            expect(first.locator("details.reasoning")).to_have_count(2)
            expect(first.locator(".tool-card")).to_have_attribute("data-state", "output-available")
            expect(first.locator(".tool-card .result pre")).to_contain_text('"city": "Paris"')
            expect(first.locator(".text").last).to_contain_text("in Paris right now")
            expect(first.locator(".step-divider")).to_have_count(1)
            restored = page.locator(".msg.assistant").nth(1)
            expect(restored.locator(".notice.aborted")).to_contain_text("interrupted")
            seen["restored_partial"] = restored.locator(".text").inner_text()
            seen["url"] = page.url
        finally:
            browser.close()
    return seen


async def test_the_page_streams_a_turn_stops_one_and_restores_the_session(
    playwright_sync, tmp_path
):
    finished: list[Any] = []
    shot = tmp_path / "screenshot.png"
    async with web_server(browser_agent(finished)) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(drive, playwright_sync, server, shot)
        record = await server.host.store.load(seen["session_id"])

    assert seen["page_errors"] == []
    # the page reads ui_messages alone: it never asks for the session with messages too
    opened = seen["session_id"] + "?view=ui"
    assert seen["session_gets"].count(opened) == 2  # the reload, then the list's item
    assert set(seen["session_gets"]) <= {opened, seen["session_id"] + "?only=busy"}
    assert seen["mutations"] > 30  # typed in as it streamed, not rendered at the end
    assert [(e.finish_reason, e.abort_reason) for e in finished] == [
        ("stop", None),
        ("aborted", "client disconnected"),
    ]
    stopped = record.messages[-1]
    assert isinstance(stopped, AssistantMessage) and stopped.interrupted
    assert stopped.text.strip().startswith("Once upon")
    assert len(stopped.text.split()) < len(STORY)
    assert seen["partial_text"].startswith("Once upon")
    assert seen["restored_partial"].strip().startswith("Once upon")
    assert seen["url"].endswith("#session=" + seen["session_id"])

    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if not SCREENSHOT.exists() or os.environ.get("AXON_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)
