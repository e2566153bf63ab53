"""The chat page (Chromium, as tests/test_web_steer_page.py) when a turn that took a
message steered in by another client then ends "not saved" (its saves refused by the
store). A message no save of the turn held is handed back by the server and runs as a
turn of its own after it (tests/test_web_unsaved_steer.py): a reload shows it below
where the failed turn was. The page showed its bubble where the model read it, above
the turn's error, for good. Now it moves below the error once the turn ends so; one a
save held stays where the model read it, as the reload shows it."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.test_busy import Script, hold, holding, look, looking
from tests.test_busy_web import _fresh_gate, held  # noqa: F401 (the gate's fixture)
from tests.test_web_approval_page import run_page
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.test_web_http import body
from tests.test_web_unsaved_turns import DownStore
from tests.web.harness import WebServer, web_server

SHOWN = ".msg .bubble, .msg.assistant .text, .msg.assistant .tool-card, .notice.error"
"""What the thread shows, in page order: bubbles, answer texts, tool cards, errors."""


def shown(page: Any) -> list[str]:
    """The thread in page order: ``[tool]`` for a tool card, ``[error]`` for an error."""
    out = []
    for node in page.locator(SHOWN).all():
        cls = node.get_attribute("class") or ""
        out.append(
            "[tool]" if "tool-card" in cls else "[error]" if "notice" in cls else node.inner_text()
        )
    return out


async def steer_while_held(
    server: WebServer, client: httpx.AsyncClient, nursery: trio.Nursery, replies: dict
) -> str:
    """Once the page's turn holds in its tool: another client steers ``also this`` into
    it; the tool lets go once the server holds the message. The session's id."""
    with trio.fail_after(60):
        await held["open"].wait()
        (session_id,) = server.host.sessions
        session = server.host.sessions[session_id]
        steer = body(session_id, "also this", message_id="u-steer")
        steer["messages"] = steer["messages"][-1:]  # another client: the message alone

        async def post() -> None:
            replies["steer"] = await client.post("/api/chat", json=steer, timeout=30)

        nursery.start_soon(post)
        while not session.waiting_inputs:  # noqa: ASYNC110 (the server's state: polled)
            await trio.sleep(0.01)
        held["release"].set()
    return session_id


async def test_a_steered_message_handed_back_by_an_unsaved_turn_shows_below_its_error(
    playwright_sync,
):
    """Every save of the page's turn refused: the steered message runs on its own (200 to
    its client, stored); the page's turn ends not saved, the bubble below its error."""
    store = DownStore()
    script = Script(looking(), holding(), ["answer to both"], ["answer to it"])

    def act(page: Any, expect: Any, seen: dict[str, Any], idle: trio.Event) -> None:
        page.locator("#input").fill("first")
        page.locator("#input").press("Enter")
        expect(page.locator(".notice.error")).to_contain_text("was not saved")
        # the bubble leaves the failed turn's message (the page asks the store first)
        expect(page.locator(".msg.assistant .msg.user")).to_have_count(0)  # (moved out)
        seen["live"] = shown(page)
        trio.from_thread.run(idle.wait)
        page.reload()
        expect(page.locator(".msg.assistant .text")).to_have_text("answer to it")
        seen["reloaded"] = shown(page)

    def responder_down(request: Any) -> list:
        store.down = len(script.requests) < 3  # back for the steered message's own turn
        return script(request)

    seen = await browse_with(playwright_sync, store, responder_down, act)
    assert seen["page_errors"] == []
    assert seen["steer_status"] == 200  # handed back: it ran as its own turn
    assert seen["live"] == ["first", "[tool]", "[tool]", "answer to both", "[error]", "also this"]
    assert seen["reloaded"] == ["also this", "answer to it"]  # (the failed turn: not stored)


async def settled(server: WebServer, session_id: str, replies: dict) -> None:
    """Until the steer was answered and the session's turns are over: idle, or forgotten
    (the host closes a session whose turn went unsaved; a next request opens it anew)."""
    with trio.fail_after(30):
        while "steer" not in replies:  # noqa: ASYNC110 (an HTTP reply: no event to wait on)
            await trio.sleep(0.01)
        while (session := server.host.sessions.get(session_id)) is not None and (  # noqa: ASYNC110
            session.current is not None or session.busy
        ):
            await trio.sleep(0.01)


async def browse_with(playwright_sync: Any, store: DownStore, responder: Any, act: Any) -> dict:
    agent = Agent(
        provider=ScriptedProvider(responder=responder), tools=[hold, look], on_busy="steer"
    )
    seen: dict[str, Any] = {}
    replies: dict[str, Any] = {}
    async with web_server(agent, store=store) as server:
        idle = trio.Event()

        def run(sync_api: Any, server: WebServer, act: Any) -> dict:
            return run_page(sync_api, server, lambda p, e, s: act(p, e, s, idle))

        async def page() -> None:
            seen.update(await trio.to_thread.run_sync(run, playwright_sync, server, act))

        async with httpx.AsyncClient(base_url=server.url) as client, trio.open_nursery() as nursery:
            nursery.start_soon(page)
            session_id = await steer_while_held(server, client, nursery, replies)
            await settled(server, session_id, replies)
            idle.set()
    seen["steer_status"] = replies["steer"].status_code
    return seen


async def test_a_steered_message_a_save_held_stays_where_the_model_read_it(playwright_sync):
    """Guard: the steer was stored by the step save after it, only the turn's last save
    was refused: the store keeps it, followed by the turn's answer to it, so its bubble
    stays in the failed turn's message, above the error, as a reload shows it."""
    store = DownStore(fail_after=3)  # steps 1-3 saved (3 holds the steer), the end refused
    script = Script(looking(), holding(), looking("L2"), ["answer to both"])

    def act(page: Any, expect: Any, seen: dict[str, Any], idle: trio.Event) -> None:
        page.locator("#input").fill("first")
        page.locator("#input").press("Enter")
        expect(page.locator(".notice.error")).to_contain_text("was not saved")
        expect(page.locator(".msg.assistant[data-steers-placed]")).to_have_count(1)  # (asked)
        seen["live"] = shown(page)
        trio.from_thread.run(idle.wait)
        page.reload()
        expect(page.locator(".msg.assistant .tool-card")).to_have_count(3)
        seen["reloaded"] = shown(page)

    seen = await browse_with(playwright_sync, store, script, act)
    assert seen["page_errors"] == []
    assert seen["steer_status"] == 202  # (taken, and stored)
    assert seen["live"] == [
        "first",
        "[tool]",
        "[tool]",
        "also this",
        "[tool]",
        "answer to both",
        "[error]",
    ]
    assert seen["reloaded"] == ["first", "[tool]", "[tool]", "also this", "[tool]"]
