"""The real `ai` package's edit (``sendMessage({text, messageId})``): the stored history
ends up as the chat shows it, the edited message in place of the old one."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from tests.web.harness import WEB, ensure_ai_package, web_server


@pytest.fixture(scope="module")
def node() -> str:
    return ensure_ai_package()


def _user_texts(messages: list[dict]) -> list[str]:
    return [
        "".join(p["text"] for p in m["parts"] if p["type"] == "text")
        for m in messages
        if m["role"] == "user"
    ]


async def test_an_edit_by_the_ai_package_leaves_the_history_the_chat_shows(node, tmp_path):
    agent = Agent(provider=ScriptedProvider(steps=[["Answer."]]))
    async with web_server(agent, store=str(tmp_path / "w.db")) as server:
        config = json.dumps({"url": server.url, "chatId": "s"})
        with trio.fail_after(60):
            proc = await trio.run_process(
                [node, str(WEB / "edit_chat.mjs"), config], capture_stdout=True, cwd=WEB
            )
        async with httpx.AsyncClient(base_url=server.url) as client:
            stored = (await client.get("/api/sessions/s")).json()
    chat = json.loads(proc.stdout)
    assert chat["error"] is None and chat["status"] == "ready"
    assert _user_texts(chat["messages"]) == ["one", "two, edited"]
    assert _user_texts(stored["ui_messages"]) == _user_texts(chat["messages"])
    assert [m["id"] for m in stored["ui_messages"] if m["role"] == "user"] == [
        m["id"] for m in chat["messages"] if m["role"] == "user"
    ]


async def test_a_stop_naming_the_turn_id_the_ai_package_sends_stops_its_edit_before_it_runs(
    node, tmp_path
):
    # The body's ``turnId``, set by ``prepareSendMessagesRequest``: a stop naming it that
    # overtakes the edit's POST stops the edit's turn (its message id is the turn before's).
    provider = ScriptedProvider(steps=[["Answer."], ["Never."]])
    agent = Agent(provider=provider)
    async with web_server(agent, store=str(tmp_path / "w.db")) as server:
        config = json.dumps({"url": server.url, "chatId": "s", "turnId": "t_edit"})
        with trio.fail_after(60):
            proc = await trio.run_process(
                [node, str(WEB / "stop_edit_chat.mjs"), config], capture_stdout=True, cwd=WEB
            )
    chat = json.loads(proc.stdout)
    assert chat["bodies"][-1]["turnId"] == "t_edit" and chat["stop"] == 204
    assert _user_texts(chat["messages"]) == ["one, edited"]
    answer = chat["messages"][-1]
    assert answer["role"] == "assistant"
    assert "Never." not in json.dumps(answer) and len(provider.requests) == 1
