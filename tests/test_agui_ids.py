"""AG-UI message ids when a provider numbers each response's tool calls (``call_0``,
``call_1``, ... in every turn and step): every message of a snapshot has its own id, the
same in every snapshot and in the live stream, and a client's resend of a snapshot still
answers the call that waits."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent
from runtime.app.web.agui_wire import agui_messages
from runtime.messages import ToolMessage, UserMessage
from tests.test_agui import COLOR_TOOL, approval_agent, approve_delete, run, run_input, user
from tests.test_agui_node import node as node  # the fixture
from tests.test_agui_node import run_client
from tests.test_web_http import lookup
from tests.web.harness import WebServer, web_server


def _turn_calls(request: Any) -> list[Any]:
    """Per turn: ``lookup`` as ``call_0``, then the client's ``pick_color`` as ``call_0``
    in a turn that says "pick", then the text of what it got."""
    at = max(i for i, m in enumerate(request.messages) if isinstance(m, UserMessage))
    results = [m for m in request.messages[at:] if isinstance(m, ToolMessage)]
    asked = request.messages[at].text
    if "pick" in asked and not results:
        return [*tool_call("pick_color", {"options": ["red"]}, tool_call_id="call_0")]
    if "pick" not in asked and not results:
        return [*tool_call("lookup", {"key": asked}, tool_call_id="call_0")]
    return [f"Got {results[-1].output}."]


async def _snapshot(server: WebServer) -> list[dict[str, Any]]:
    record = await server.host.store.load("t")
    assert record is not None
    return agui_messages(record.messages)


def _results(events: list[dict[str, Any]]) -> list[str]:
    return [e["messageId"] for e in events if e["type"] == "TOOL_CALL_RESULT"]


async def test_two_turns_with_the_same_call_id_give_snapshot_messages_distinct_ids():
    agent = Agent(provider=ScriptedProvider(responder=_turn_calls), tools=[lookup])
    async with web_server(agent, protocols=("ag-ui",)) as server:
        await run(server, run_input("t", user("one", "m1")))
        await run(server, run_input("t", *await _snapshot(server), user("two", "m2"), runId="r2"))
        held = await _snapshot(server)
    ids = Counter(m["id"] for m in held)
    assert [i for i, n in ids.items() if n > 1] == []
    tools = [m for m in held if m["role"] == "tool"]
    first, second = (m["toolCallId"] for m in tools)
    assert first != second and first.endswith(".call_0") and second.endswith(".call_0")
    assert [m["content"] for m in tools] == ["value of one", "value of two"]


async def test_the_live_result_ids_are_the_snapshots():
    agent = Agent(provider=ScriptedProvider(responder=_turn_calls), tools=[lookup])
    async with web_server(agent, protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("one", "m1")))
        once = await _snapshot(server)
        second = await run(server, run_input("t", *once, user("two", "m2"), runId="r2"))
        held = await _snapshot(server)
    live = _results(first) + _results(second)
    assert live == [m["id"] for m in held if m["role"] == "tool"]
    assert len(set(live)) == 2
    first = next(m for m in once if m["role"] == "tool")
    assert next(m for m in held if m["role"] == "tool") == first  # on every snapshot


async def test_a_resumed_approvals_live_result_id_is_the_snapshots():
    async with web_server(approval_agent("It is gone."), protocols=("ag-ui",)) as server:
        second = await approve_delete(server)
        held = await _snapshot(server)
    assert _results(second) == [m["id"] for m in held if m["role"] == "tool"]


async def test_a_resent_snapshot_answers_a_new_waiting_call_with_an_earlier_turns_id():
    seen: list[Any] = []

    def respond(request: Any) -> list[Any]:
        seen.append(
            [(m.tool_call_id, m.output) for m in request.messages if isinstance(m, ToolMessage)]
        )
        return _turn_calls(request)

    agent = Agent(provider=ScriptedProvider(responder=respond), tools=[lookup])
    async with web_server(agent, protocols=("ag-ui",)) as server:
        await run(server, run_input("t", user("one", "m1"), tools=[COLOR_TOOL]))
        waits = await run(
            server,
            run_input(
                "t", *await _snapshot(server), user("pick", "m2"), tools=[COLOR_TOOL], runId="r2"
            ),
        )
        (pending,) = waits[-1]["outcome"]["pendingToolCallIds"]
        assert pending.endswith(".call_0")
        held = await _snapshot(server)
        answer = {"id": "answer-1", "role": "tool", "toolCallId": "call_0", "content": "blue"}
        last = await run(server, run_input("t", *held, answer, tools=[COLOR_TOOL], runId="r3"))
        after = await _snapshot(server)
    text = "".join(e["delta"] for e in last if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Got blue." and last[-1]["outcome"] == {"type": "success"}
    assert seen[-1] == [("call_0", "value of one"), ("call_0", "blue")]
    tools = [m for m in after if m["role"] == "tool"]
    assert [m["content"] for m in tools] == ["value of one", "blue"]
    assert len({m["id"] for m in after}) == len(after)


async def test_the_official_client_keeps_each_turns_call_0_apart(node):
    """``@ag-ui/client`` over three runs: a server call ``call_0``, then a client call
    ``call_0`` it answers. The client finds tool calls by id across all its messages:
    turn 2's ``TOOL_CALL_START`` renamed turn 1's call (its args appended to the old
    ones) and turn 2's assistant message was never made."""
    agent = Agent(provider=ScriptedProvider(responder=_turn_calls), tools=[lookup])
    runs = [
        {"userText": "one", "tools": [COLOR_TOOL]},
        {"userText": "pick", "tools": [COLOR_TOOL]},
        {"answerPending": {"content": "blue"}, "tools": [COLOR_TOOL]},
    ]
    async with web_server(agent, protocols=("ag-ui",)) as server:
        out = await run_client(node, {"url": server.url + "/ag-ui", "threadId": "t", "runs": runs})
    for result in out["results"]:
        assert result["error"] is None and result["schemaErrors"] == [], result
    messages = out["results"][2]["messages"]
    assert len({m["id"] for m in messages}) == len(messages)
    calls = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for m in messages
        if m["role"] == "assistant"
        for c in m.get("toolCalls", [])
    ]
    assert calls == [("lookup", {"key": "one"}), ("pick_color", {"options": ["red"]})]
    assert out["warnings"] == []
