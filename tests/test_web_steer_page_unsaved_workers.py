"""tests/test_web_steer_page_unsaved.py against a worker deployment's front end (real
PostgreSQL and Redis, a front end and a worker in this process, as
tests/test_web_browser_workers.py runs them): the page's turn took a message another
client steered in, then every save holding it was refused, so the worker failed the turn
not saved on its last attempt and the message ran as a turn of its own
(tests/test_worker_unsaved_steer.py). The page showed the message's bubble above the
turn's error for good; a reload shows it below, with its own answer."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step
from actors.stores.postgres import PostgresStore
from runtime import Agent
from runtime.actor_messages import InferRequest
from runtime.errors import StoreError
from runtime.messages import AssistantMessage, UserMessage
from tests import test_busy
from tests.support.redis import require_redis
from tests.test_busy import hold, holding, look, looking
from tests.test_frontend import LIMIT, body, deployment
from tests.test_web_approval_page import run_page
from tests.test_web_browser import playwright_sync as playwright_sync  # the fixture
from tests.test_web_steer_page_unsaved import shown
from tests.test_worker_steer import queued

STEERED = "also this"
ANSWER = "answer to it"


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    test_busy.held["open"], test_busy.held["release"] = trio.Event(), trio.Event()


def respond(request: InferRequest) -> list:
    """``first``: look, hold, answer; once the steered message is last (in the page's
    turn, or in its own), the answer."""
    users = [m.text for m in request.messages if isinstance(m, UserMessage)]
    if users[-1] == STEERED:
        return [ANSWER]
    return [looking, holding][current_step(request.messages)]()


async def test_a_workers_not_saved_turn_hands_the_steered_bubble_below_its_error(
    pg_url: str, redis_url: str, playwright_sync: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = PostgresStore.save
    refused: list[int] = []

    async def save(
        self: Any, session_id: str, start: int, messages: Any, meta: Any = None, **kw: Any
    ) -> Any:
        # every save of the page's turn that holds the steered message (its answer's id
        # is the turn's with ``-s<step>``): the turn fails not saved on its last attempt
        if any(isinstance(m, AssistantMessage) and re.search(r"-s\d+$", m.id) for m in messages):
            refused.append(start)
            raise StoreError("could not extend file /var/lib/pg: No space left on device")
        return await real(self, session_id, start, messages, meta, **kw)

    monkeypatch.setattr(PostgresStore, "save", save)
    agent = Agent(provider=ScriptedProvider(responder=respond), tools=[hold, look], on_busy="steer")
    opened: dict[str, Any] = {}
    idle, named = trio.Event(), trio.Event()

    def act(page: Any, expect: Any, seen: dict[str, Any]) -> None:
        page.locator("#input").fill("first")
        page.locator("#input").press("Enter")
        session_id = page.locator("#session-id").inner_text()
        trio.from_thread.run_sync(lambda: (opened.update(session_id=session_id), named.set()))
        expect(page.locator(".notice.error")).to_contain_text("was not saved", timeout=LIMIT * 1000)
        expect(page.locator(".msg.assistant .msg.user")).to_have_count(0)  # (moved out)
        seen["live"] = shown(page)
        trio.from_thread.run(idle.wait)
        page.reload()
        expect(page.locator(".msg.assistant .text").last).to_have_text(ANSWER)
        seen["reloaded"] = shown(page)

    async with deployment(pg_url, redis_url, agent, on_busy="steer") as d:
        server = type("S", (), {"url": d.urls[0]})()
        seen: dict[str, Any] = {}
        replies: dict[str, Any] = {}

        async def page() -> None:
            seen.update(await trio.to_thread.run_sync(run_page, playwright_sync, server, act))

        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(page)
                with trio.fail_after(LIMIT):
                    await test_busy.held["open"].wait()
                    await named.wait()  # (the page read its new session's id)
                    session_id = opened["session_id"]
                    steer = body(session_id, STEERED, "u-steer")
                    steer["messages"] = steer["messages"][-1:]

                    async def post() -> None:
                        replies["steer"] = await client.post("/api/chat", json=steer)

                    nursery.start_soon(post)
                    await queued(d.queue, session_id, 2)
                    test_busy.held["release"].set()
                    while "steer" not in replies:  # noqa: ASYNC110 (an HTTP reply)
                        await trio.sleep(0.05)
                    idle.set()
            turns = await d.queue.turns(session_id)
    assert seen["page_errors"] == []
    assert (turns[0].status, turns[0].attempts) == ("failed", 3)
    assert replies["steer"].status_code == 200  # its own turn, streamed to its client
    # live: the turn's last run's answer, its error, then the message it handed back;
    # reloaded: the turn's committed steps, then the message and its own answer
    assert seen["live"] == ["first", "[tool]", "[tool]", ANSWER, "[error]", STEERED]
    assert seen["reloaded"] == ["first", "[tool]", "[tool]", STEERED, ANSWER]
