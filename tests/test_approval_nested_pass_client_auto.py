"""A sub-agent's client-side tool passed up (``as_tool(pass_approvals=True)``), answered
with the real ``ai`` package (the pinned 7 and 6) the way the AI SDK documents client
tools: ``useChat({sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithToolCalls})``
and ``addToolOutput`` in ``onToolCall``, no ``sendMessage()`` of the app's own.

The stream showed the calling agent tool's call ``H`` (input available, no output: it
waits for the sub call) in the same step as the sub call ``H.L``; the predicate wants
every call of the last step answered, so the continuation never went out (one request).
Now the stream marks ``H`` as run by the server (``providerExecuted``) when it shows the
sub call, and the stored form (``ui_messages``) says the same: the chat sends the
continuation itself and the turn finishes in the same assistant message."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent
from runtime.actor_messages import InferRequest
from tests.test_approval_nested_pass_client import (
    ASKED,
    _clear,
    _last_result,
    _locates_twice_model,
    _parent_model,
    locate,
    parent,
)
from tests.test_approval_node import ai6_entry
from tests.web.harness import WEB, ensure_ai_package, web_server

__all__ = ["_clear"]  # (the fixture)


@pytest.fixture(scope="module", params=["ai7", "ai6"])
def ai(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The ``node`` to run and which ``ai`` package drives the chat: 7, or 6."""
    node = ensure_ai_package()
    return {"node": node, **({} if request.param == "ai7" else {"ai": ai6_entry()})}


async def chat(ai: dict[str, Any], agent: Agent, tmp_path: Any, **config: Any) -> tuple:
    """The chat's record (see tests/web/sub_client_chat.mjs) and the stored session."""
    node = ai["node"]
    async with web_server(agent, store=str(tmp_path / "w.db")) as server:
        sent = {"url": server.url, "chatId": "s", "tool": "locate", "auto": True, **config}
        if "ai" in ai:
            sent["ai"] = ai["ai"]
        with trio.fail_after(60):
            proc = await trio.run_process(
                [node, str(WEB / "sub_client_chat.mjs"), json.dumps(sent)],
                capture_stdout=True,
                cwd=WEB,
            )
        async with httpx.AsyncClient(base_url=server.url) as client:
            stored = (await client.get("/api/sessions/s")).json()
    return json.loads(proc.stdout), stored


def tools(message: dict[str, Any]) -> list[tuple]:
    return [
        (p["toolCallId"], p["state"], p.get("output"), p.get("providerExecuted"))
        for p in message["parts"]
        if p["type"].startswith("tool-")
    ]


def _says_then_locates(request: InferRequest) -> list:
    """The sub-agent streams text before its client call (the calling call then shows
    a preliminary output), then answers."""
    if current_step(request.messages) == 0:
        return ["Let me look. ", *tool_call("locate", {"precise": True}, tool_call_id="L")]
    return [f"you are in {_last_result(request).output['city']}"]


@pytest.mark.parametrize("talks", [False, True], ids=["quiet", "preliminary"])
async def test_use_chat_sends_the_continuation_itself_once_the_sub_call_has_its_output(
    ai, tmp_path, talks
):
    agent = parent()
    if talks:
        helper = Agent(
            name="helper", provider=ScriptedProvider(responder=_says_then_locates), tools=[locate]
        )
        agent = Agent(
            provider=ScriptedProvider(responder=_parent_model),
            tools=[helper.as_tool(pass_approvals=True)],
        )
    record, stored = await chat(ai, agent, tmp_path, output={"city": "Oz"})
    assert record["error"] is None and record["status"] == "ready"
    assert len(record["bodies"]) == 2  # before: 1, the chat never sent the continuation
    _, second = record["bodies"]
    message = record["messages"][-1]
    assert second["trigger"] == "submit-message" and second["messageId"] == message["id"]
    assert [m["role"] for m in record["messages"]] == ["user", "assistant"]
    said = "Let me look. you are in Oz" if talks else "you are in Oz"
    assert tools(message) == [
        ("H", "output-available", said, True),
        (ASKED, "output-available", {"city": "Oz"}, None),
    ]
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == [f"parent saw: {said}"]
    assert message["parts"] == stored["ui_messages"][-1]["parts"]  # (a reload shows the same)


async def test_each_client_call_of_the_sub_agent_is_answered_and_sent_on_by_itself(ai, tmp_path):
    """Two client calls in turn: the second shows in the continuation's stream (which
    never showed ``H``: the chat has it marked from the first), and the chat sends the
    next continuation itself too."""
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_locates_twice_model), tools=[locate]
    )
    agent = Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )
    record, stored = await chat(ai, agent, tmp_path, output={"city": "Oz"}, requests=3)
    assert record["error"] is None and record["status"] == "ready"
    assert len(record["bodies"]) == 3
    assert [m["role"] for m in record["messages"]] == ["user", "assistant"]
    message = record["messages"][-1]
    assert [b["trigger"] for b in record["bodies"][1:]] == ["submit-message"] * 2
    assert tools(message) == [
        ("H", "output-available", "Oz then Oz", True),
        ("H.L0", "output-available", {"city": "Oz"}, None),
        ("H.L1", "output-available", {"city": "Oz"}, None),
    ]
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == [
        "parent saw: Oz then Oz"
    ]
    # a reload shows each sub call too (it showed the last one only: the call's wait)
    assert tools(stored["ui_messages"][-1]) == tools(message)
    assert message["parts"] == stored["ui_messages"][-1]["parts"]


async def test_a_reloaded_chat_answers_the_sub_call_and_sends_on_by_itself(ai, tmp_path):
    """The waiting session's stored form given to a new chat (a reloaded page's
    ``messages``): ``H`` marked run by the server there too, so ``addToolOutput`` of the
    sub call sends the continuation."""
    record, _ = await chat(ai, parent(), tmp_path, output={"city": "Oz"}, reload=True)
    assert record["error"] is None and record["status"] == "ready"
    assert len(record["bodies"]) == 2 and record["bodies"][1]["trigger"] == "submit-message"
    message = record["messages"][-1]
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == [
        "parent saw: you are in Oz"
    ]
