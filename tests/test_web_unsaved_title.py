"""The title ``serve`` lists a session under describes what the store holds: a session
whose first turn's save the store refused is titled by its first stored message, not by
the refused one (its client was told ``not_saved``; the store holds none of it). Before,
the host kept that turn's title (``Session.unsaved_meta`` reapplied it on reopen; a
queued turn carried it) and the next turn saved it with its own messages. A turn
queued behind the refused one is titled by its own message, the first stored."""

from __future__ import annotations

from typing import Any

import httpx

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.test_web_unsaved_queue import TOLD, RefusingStore, ends, seen_by_model, two_posts
from tests.test_web_unsaved_turns import DownStore, chat_body, post_chat
from tests.web.harness import WebServer, web_server


async def listed(server: WebServer) -> list[tuple[str, Any]]:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        r = await c.get("/api/sessions")
    assert r.status_code == 200, r.text
    return [(s["session_id"], s["title"]) for s in r.json()["sessions"]]


async def test_a_session_whose_first_turn_was_not_saved_is_titled_by_its_next_message():
    # (a pin: the idle session is closed after the refused save, and opened fresh)
    store = DownStore()
    agent = Agent(name="a", provider=ScriptedProvider(responder=lambda request: ["Hello."]))
    async with web_server(agent, store=store) as server:
        told = await post_chat(server, chat_body("s1", "u1", "unsaved words"))
        assert told[-2]["type"] == "error"
        store.down = False
        kept = await post_chat(server, chat_body("s1", "u2", "stored words"))
        assert kept[-2]["type"] == "finish"
        assert await listed(server) == [("s1", "stored words")]
        record = await store.load("s1")
        assert record is not None and record.meta.get("title") == "stored words"


async def test_a_turn_queued_behind_an_unsaved_first_turn_is_titled_by_its_own_message():
    requests, respond = seen_by_model()
    store = RefusingStore(down=True)
    store.refusing = False

    def back_for_the_second(request: Any) -> list[str]:
        answer = respond(request)
        store.down = len(requests) < 2
        return answer

    agent = Agent(
        name="a", provider=ScriptedProvider(responder=back_for_the_second), on_busy="enqueue"
    )
    async with web_server(agent, store=store) as server:
        out = await two_posts(server, store, first="unsaved words")
        assert ends(out["first"]) == TOLD
        assert ends(out["second"])["type"] == "finish"
        # never the unstored message's; and not untitled until a third turn (it was)
        assert await listed(server) == [("s1", "second")]
        record = await store.load("s1")
        assert record is not None and record.meta.get("title") == "second"
        assert [m.text for m in record.messages if m.role == "user"] == ["second"]
