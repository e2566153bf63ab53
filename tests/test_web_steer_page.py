"""The chat page (Chromium, as tests/test_web_browser.py) while another client steers a
message into the turn it streams (``on_busy="steer"``): the page shows the message
where the model read it, and a reload shows the same order."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from tests.test_busy import Script, held, holding
from tests.test_busy_web import agent_of
from tests.test_web_approval_page import run_page
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.test_web_http import body
from tests.web.harness import web_server

SHOWN = ".msg .bubble, .msg.assistant .text, .msg.assistant .tool-card"
"""What the thread shows, in page order: user bubbles, answer texts, tool cards."""


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


def shown(page: Any) -> list[str]:
    """The thread's bubbles and texts, and ``[tool]`` for a tool card, in page order."""
    return [
        "[tool]" if "tool-card" in (n.get_attribute("class") or "") else n.inner_text()
        for n in page.locator(SHOWN).all()
    ]


async def test_a_message_steered_in_shows_where_the_model_read_it_live_and_after_a_reload(
    playwright_sync,
):
    script = Script(holding(), ["answer to both"])

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        page.locator("#input").fill("first")
        page.locator("#input").press("Enter")
        expect(page.locator(".msg.assistant .text")).to_have_text("answer to both")
        expect(page.locator("body")).to_have_attribute("data-busy", "")
        seen["live"] = shown(page)
        page.reload()
        expect(page.locator(".msg.assistant .text")).to_have_text("answer to both")
        seen["reloaded"] = shown(page)

    async with web_server(agent_of(script, "steer")) as server:
        seen: dict[str, Any] = {}

        async def browse() -> None:
            seen.update(await trio.to_thread.run_sync(run_page, playwright_sync, server, act))

        async with httpx.AsyncClient(base_url=server.url) as client, trio.open_nursery() as nursery:
            nursery.start_soon(browse)
            with trio.fail_after(60):
                await held["open"].wait()
                (session_id,) = server.host.sessions
                session = server.host.sessions[session_id]
                steer = body(session_id, "also this", message_id="u-steer")
                steer["messages"] = steer["messages"][-1:]  # another client: the message alone
                nursery.start_soon(lambda: client.post("/api/chat", json=steer, timeout=30))
                while True:  # until the server holds it: then the tool may end
                    if session.waiting_inputs:
                        break
                    await trio.sleep(0.01)
                held["release"].set()
    assert seen["page_errors"] == []
    assert seen["live"] == seen["reloaded"]
    assert seen["live"] == ["first", "[tool]", "also this", "answer to both"]
