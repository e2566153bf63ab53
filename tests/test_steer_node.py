"""The real `ai` package's AbstractChat (what `useChat` wraps) sends a message while a
turn streams, under ``on_busy="steer"``: what it holds, and its regenerate after."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

from tests.test_approval_node import ai6_entry
from tests.test_busy import Script, held, holding
from tests.test_busy_web import agent_of
from tests.web.harness import WEB, ensure_ai_package, run_node_script, web_server


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    held["open"], held["release"] = trio.Event(), trio.Event()


@pytest.fixture(scope="module")
def node() -> str:
    return ensure_ai_package()


@pytest.fixture(scope="module", params=["ai7", "ai6"])
def ai(request: pytest.FixtureRequest, node: str) -> dict[str, str]:
    return {} if request.param == "ai7" else {"ai": ai6_entry()}


async def steered_chat(node: str, ai: dict, script: Script, **config: Any) -> tuple[dict, dict]:
    """The chat's outcome and the stored session: "first" held in its ``hold`` tool,
    "also this" sent by the same chat meanwhile, released once the server holds it."""
    async with web_server(agent_of(script, "steer")) as server:
        outcome: dict = {}

        async def run() -> None:
            outcome.update(
                await run_node_script(
                    node, WEB / "steer_chat.mjs", {"url": server.url, "chatId": "s", **ai, **config}
                )
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await held["open"].wait()
            with trio.fail_after(30):  # until the server holds the message Node sent
                while True:
                    session = server.host.sessions.get("s")
                    if session is not None and session.waiting_inputs:
                        break
                    await trio.sleep(0.01)
            held["release"].set()
        async with httpx.AsyncClient(base_url=server.url) as client:
            stored = (await client.get("/api/sessions/s")).json()
    return outcome, stored


def parts_of(messages: list[dict]) -> list[tuple]:
    """Each message's id, role and parts (metadata aside: the live stream's and the
    stored message's differ by design)."""
    return [(m["id"], m["role"], m["parts"]) for m in messages]


async def test_a_message_sent_while_the_turn_streams_shows_where_the_session_stores_it(node, ai):
    """``sendMessage`` while ``status === 'streaming'`` pushes the message after the
    streaming answer and posts it: the server steers it in. The answer so far ends
    there, and the rest shows in a message after the one sent, as stored (it grew the
    answer above the message before, which looked unanswered until a reload)."""
    chat, stored = await steered_chat(node, ai, Script(holding(), ["answer to both"]))
    assert chat["errors"] == [None] and chat["status"] == "ready"
    assert [b["trigger"] for b in chat["bodies"]] == ["submit-message", "submit-message"]
    assert parts_of(chat["steered"]) == parts_of(stored["ui_messages"])
    roles = [m["role"] for m in chat["steered"]]
    assert roles == ["user", "assistant", "user", "assistant"]
    assert chat["steered"][3]["parts"][-1]["text"] == "answer to both"
    (steered,) = chat["data"]  # onData still hears it
    assert steered["data"]["answerId"] == chat["steered"][3]["id"]


async def test_a_regenerate_after_a_steered_turn_leaves_the_client_as_the_session_is(node, ai):
    """The regenerate re-answers the steered message, in place of the answer the client
    shows after it: client and session agree, no answer shown that is no longer
    stored (it kept "answer to both" in the message above, which the server had cut)."""
    script = Script(holding(), ["answer to both"], ["again"])
    chat, stored = await steered_chat(node, ai, script, regenerate=True)
    assert chat["errors"] == [None, None]
    assert chat["bodies"][-1]["trigger"] == "regenerate-message"
    assert parts_of(chat["messages"]) == parts_of(stored["ui_messages"])
    texts = [p.get("text") for m in chat["messages"] for p in m["parts"] if p["type"] == "text"]
    assert texts == ["first", "also this", "again"]
