"""The page as a user sees it at 1280 and 390 px wide, in Debian's Chromium (Playwright, as
in tests/test_web_browser.py, and skipped the same way without them): its icon, the
paperclip, the agent line, the sidebar's "running" badge, and on a phone the menu that
opens the session list, "New chat", and a header that stays on one line.

Screenshots go to the test's tmp dir (``wide.png``, ``narrow.png``,
``narrow-sessions.png``): look at them when the layout changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.web.app import STATIC
from tests.test_web_browser import CHROMIUM, CHROMIUM_ARGS, browser_agent
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.web.harness import WebServer, wait_idle, web_server

WIDE = {"width": 1280, "height": 800}
NARROW = {"width": 390, "height": 844}  # a phone (iPhone 12-15) in CSS pixels

FITS = """(node) => {
  const r = node.getBoundingClientRect(), box = node.parentElement.getBoundingClientRect();
  return {text: node.textContent, height: r.height, right: r.right, boxRight: box.right,
          clipped: node.scrollWidth > node.clientWidth,
          lineHeight: parseFloat(getComputedStyle(node).lineHeight) || r.height,
          whiteSpace: getComputedStyle(node).whiteSpace,
          textOverflow: getComputedStyle(node).textOverflow};
}"""
"""Where an element is and whether its text is cut, as the browser laid it out."""


async def test_the_favicon_is_served_as_an_icon():
    agent = Agent(name="demo", provider=ScriptedProvider([["ok"]]))
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        ico = await client.get("/favicon.ico")
        svg = await client.get("/favicon.svg")
    assert ico.status_code == 200
    assert ico.headers["content-type"] == "image/x-icon"
    assert ico.content[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
    assert svg.status_code == 200
    assert svg.headers["content-type"].startswith("image/svg+xml")
    assert svg.text.startswith("<svg ")


def test_the_page_has_no_emoji():
    """Pictographs need a colour emoji font that Debian's Chromium does not have: they
    showed as empty boxes (the paperclip did)."""
    page = (STATIC / "index.html").read_text()
    assert [c for c in page if ord(c) >= 0x1F000] == []


def launch(p: Any) -> Any:
    return p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def send(page: Any, expect: Any, text: str) -> None:
    turns = int(page.locator("body").get_attribute("data-turns") or 0)
    page.locator("#input").fill(text)
    page.locator("#input").press("Enter")
    expect(page.locator("body")).to_have_attribute("data-turns", str(turns + 1))


def drive_wide(sync_api: Any, server: WebServer, shots: Path) -> dict[str, Any]:
    expect = sync_api.expect
    seen: dict[str, Any] = {"errors": [], "failed": []}
    with sync_api.sync_playwright() as p:
        browser = launch(p)
        try:
            page = browser.new_page(viewport=WIDE)
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: seen["errors"].append(str(e)))
            page.on("console", lambda m: m.type == "error" and seen["errors"].append(m.text))
            page.on("response", lambda r: r.status >= 400 and seen["failed"].append(r.url))
            page.goto(server.url + "/")
            expect(page.locator("#agent-info")).to_contain_text("demo")
            seen["agent_info"] = page.locator("#agent-info").inner_text()
            seen["icon"] = page.evaluate(
                """async () => {
                  const href = document.querySelector("link[rel=icon]").href;
                  const r = await fetch(href);
                  return [r.status, r.headers.get("content-type")];
                }"""
            )
            attach = page.locator("#attach")
            seen["attach_text"] = attach.inner_text()
            seen["attach_svg"] = attach.locator("svg").bounding_box()
            seen["menu_visible"] = page.locator("#menu").is_visible()

            send(page, expect, "What's the weather in Paris?")
            # a slow turn: the sidebar says it runs, in full
            page.locator("#input").fill("Tell me a long story")
            page.locator("#input").press("Enter")
            busy = page.locator("#sessions li .s-busy")
            expect(busy).to_have_count(1)
            seen["busy"] = busy.evaluate(FITS)
            item = page.locator("#sessions li", has=page.locator(".s-busy"))
            seen["busy_item"] = item.inner_text()
            page.screenshot(path=str(shots / "wide.png"), animations="disabled")
            seen["session_id"] = page.locator("#session-id").inner_text()
            page.locator("#stop").click()
            expect(page.locator(".notice.aborted")).to_be_visible()
            trio.from_thread.run(wait_idle, server, seen["session_id"])
        finally:
            browser.close()
    return seen


async def test_at_1280_px_the_icon_paperclip_agent_line_and_running_badge_show_in_full(
    playwright_sync, tmp_path
):
    async with web_server(browser_agent([])) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(drive_wide, playwright_sync, server, tmp_path)

    assert seen["errors"] == [] and seen["failed"] == []
    assert seen["icon"] == [200, "image/svg+xml"]
    assert seen["attach_text"].strip() == ""  # an SVG icon, no character to miss a font
    assert seen["attach_svg"]["width"] >= 16 and seen["attach_svg"]["height"] >= 16
    assert seen["agent_info"] == "demo · scripted · offline"
    assert not seen["menu_visible"]
    busy = seen["busy"]
    assert busy["text"] == "running" and not busy["clipped"]
    assert busy["right"] <= busy["boxRight"]
    assert "3 msgs" in seen["busy_item"]  # shown in full beside it
    assert (tmp_path / "wide.png").exists()


def open_narrow(browser: Any, server: WebServer, seen: dict[str, Any]) -> Any:
    page = browser.new_page(viewport=NARROW, device_scale_factor=2, is_mobile=True)
    page.set_default_timeout(20_000)
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.goto(server.url + "/")
    return page


def drive_narrow(sync_api: Any, server: WebServer, shots: Path) -> dict[str, Any]:
    expect = sync_api.expect
    seen: dict[str, Any] = {"errors": []}
    with sync_api.sync_playwright() as p:
        browser = launch(p)
        try:
            page = open_narrow(browser, server, seen)
            sidebar, menu = page.locator("#sidebar"), page.locator("#menu")
            expect(page.locator(".welcome")).to_be_visible()
            seen["sidebar_at_start"] = sidebar.is_visible()
            send(page, expect, "What's the weather in Paris?")
            seen["first"] = page.locator("#session-id").inner_text()

            menu.click()
            expect(sidebar).to_be_in_viewport()
            seen["expanded"] = menu.get_attribute("aria-expanded")
            expect(page.locator("#sessions li")).to_have_count(1)
            page.screenshot(path=str(shots / "narrow-sessions.png"), animations="disabled")
            page.locator("#new-chat").click()
            expect(sidebar).to_be_hidden()
            expect(page.locator(".welcome")).to_be_visible()
            seen["url_after_new_chat"] = page.url
            seen["sid_after_new_chat"] = page.locator("#session-id").inner_text()

            send(page, expect, "What time is it?")
            seen["second"] = page.locator("#session-id").inner_text()
            seen["url"] = page.url
            menu.click()
            items = page.locator("#sessions li")
            expect(items).to_have_count(2)
            page.locator("#scrim").click(position={"x": 370, "y": 400})  # beside the drawer
            expect(sidebar).to_be_hidden()
            menu.click()
            page.locator("#sessions li", has_text="What's the weather in Paris?").click()
            expect(sidebar).to_be_hidden()
            expect(page.locator("#session-id")).to_have_text(seen["first"])
            seen["reopened"] = page.locator(".msg.user .bubble").all_inner_texts()
        finally:
            browser.close()
    return seen


async def test_at_390_px_the_menu_opens_the_sessions_and_new_chat_starts_another(
    playwright_sync, tmp_path
):
    async with web_server(browser_agent([])) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(drive_narrow, playwright_sync, server, tmp_path)

    assert seen["errors"] == []
    assert not seen["sidebar_at_start"]
    assert seen["expanded"] == "true"
    assert "#session=" not in seen["url_after_new_chat"] and seen["sid_after_new_chat"] == ""
    assert seen["second"] not in ("", seen["first"])
    assert seen["url"].endswith("#session=" + seen["second"])
    assert seen["reopened"] == ["What's the weather in Paris?"]
    assert (tmp_path / "narrow-sessions.png").exists()


def drive_header(sync_api: Any, server: WebServer, shots: Path) -> dict[str, Any]:
    expect = sync_api.expect
    seen: dict[str, Any] = {"errors": []}
    with sync_api.sync_playwright() as p:
        browser = launch(p)
        try:
            page = open_narrow(browser, server, seen)
            send(page, expect, "What's the weather in Paris?")
            seen["sid"] = page.locator("#session-id").evaluate(FITS)
            seen["title"] = page.locator("#title").evaluate(FITS)
            seen["page_width"] = page.evaluate("document.documentElement.scrollWidth")
            seen["agent_info"] = page.locator("#agent-info").text_content()
            page.screenshot(path=str(shots / "narrow.png"), animations="disabled")
        finally:
            browser.close()
    return seen


async def test_at_390_px_the_header_stays_on_one_line(playwright_sync, tmp_path):
    async with web_server(browser_agent([])) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(drive_header, playwright_sync, server, tmp_path)

    for part in (seen["sid"], seen["title"]):
        assert part["whiteSpace"] == "nowrap" and part["textOverflow"] == "ellipsis"
        assert part["height"] < 1.5 * part["lineHeight"]  # one line
        assert part["right"] <= NARROW["width"]
    assert seen["page_width"] <= NARROW["width"]  # nothing scrolls sideways


async def test_the_agent_line_names_an_agent_named_after_its_provider_once(
    playwright_sync, tmp_path
):
    """The CLI names its agent after its provider: the line said "Agent scripted · scripted"."""
    agent = Agent(name="scripted", provider=ScriptedProvider([["It is sunny."]]))
    async with web_server(agent) as server:
        with trio.fail_after(120):
            seen = await trio.to_thread.run_sync(drive_header, playwright_sync, server, tmp_path)
    assert seen["agent_info"] == "scripted · offline"
