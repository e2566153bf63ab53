"""The page as a user sees it at 1280 and 390 px wide, in Debian's Chromium (Playwright, as
in tests/test_web_browser.py, and skipped the same way without them): its icon, the
paperclip, the agent line, the sidebar's "running" badge, and on a phone the menu that
opens the session list, "New chat", and a header that stays on one line.

Screenshots go to the test's tmp dir (``wide.png``, ``narrow.png``,
``narrow-sessions.png``): look at them when the layout changes.
"""

from __future__ import annotations

import httpx

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.web.harness import web_server


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
