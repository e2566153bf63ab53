"""The real `ai` package's AbstractChat (what `useChat` wraps) answers an approval:
the continuation it sends itself streams into the same assistant message."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, tool
from tests.web.harness import WEB, ensure_ai_package, web_server

ran: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return f"deleted {path}"


@pytest.fixture(scope="module")
def node() -> str:
    return ensure_ai_package()


def agent() -> Agent:
    steps = [["Deleting. ", *tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["Gone."]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


async def chat_through_an_approval(node: str, tmp_path: Any, **answer: Any) -> tuple[dict, dict]:
    """The chat's outcome and the stored session, for one approval answered ``answer``."""
    ran.clear()
    async with web_server(agent(), store=str(tmp_path / "w.db")) as server:
        config = json.dumps({"url": server.url, "chatId": "s", **answer})
        with trio.fail_after(60):
            proc = await trio.run_process(
                [node, str(WEB / "approve_chat.mjs"), config], capture_stdout=True, cwd=WEB
            )
        async with httpx.AsyncClient(base_url=server.url) as client:
            stored = (await client.get("/api/sessions/s")).json()
    return json.loads(proc.stdout), stored


async def test_the_ai_package_approves_and_the_turn_continues_in_the_same_message(node, tmp_path):
    chat, stored = await chat_through_an_approval(node, tmp_path, approved=True)
    assert chat["error"] is None and chat["status"] == "ready"
    _, second = chat["bodies"]
    assert second["trigger"] == "submit-message" and second["messages"][-1]["role"] == "assistant"
    assert second["messageId"] == second["messages"][-1]["id"]
    assert ran == ["/x"]
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant"]
    message = chat["messages"][-1]
    tool_part = next(p for p in message["parts"] if p["type"] == "tool-delete_file")
    assert tool_part["state"] == "output-available" and tool_part["output"] == "deleted /x"
    texts = [p["text"] for p in message["parts"] if p["type"] == "text"]
    assert texts == ["Deleting. ", "Gone."]
    # one assistant message, the stored message's UI form (metadata aside)
    saved = stored["ui_messages"][-1]
    assert (message["id"], message["parts"]) == (saved["id"], saved["parts"])


async def test_the_ai_package_denies_and_sees_the_denial(node, tmp_path):
    chat, _ = await chat_through_an_approval(node, tmp_path, approved=False, reason="no")
    assert chat["error"] is None and ran == []
    message = chat["messages"][-1]
    tool_part = next(p for p in message["parts"] if p["type"] == "tool-delete_file")
    assert tool_part["state"] == "output-denied"
    assert tool_part["approval"]["approved"] is False and tool_part["approval"]["reason"] == "no"
