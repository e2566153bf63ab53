"""Integers past 64 bits at the edges Axon speaks MCP and A2A on (branch ``exactints2``).

orjson reads an integer outside [-2**63, 2**64) as a float
(``123456789012345678901234567890`` is ``1.2345678901234568e+29``). JSON-RPC ids are
echoed as sent (MCP: "a string or integer ID", with no size limit), and a remote A2A
agent's data part is the value it sent."""

from __future__ import annotations

import json
from typing import Any

import httpx

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, tool
from runtime.actor_messages import InferRequest
from runtime.app.web.mcp_endpoint import _id_in_use
from runtime.messages import ToolMessage
from tests.support.mcp_agents import echo
from tests.web.harness import web_server

BIG = 123456789012345678901234567890
"""Past 64 bits: orjson reads it as 1.2345678901234568e+29."""
MCP = ("ai-sdk", "mcp")
ACCEPT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def _answers(response: httpx.Response) -> list[Any]:
    """The JSON-RPC messages of a POST's answer (one JSON body, or SSE events), each read
    by the standard library's reader (integers of any size)."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return [json.loads(response.text)]
    return [
        json.loads(line[5:])
        for line in response.text.splitlines()
        if line.startswith("data:") and line[5:].strip()
    ]


async def test_an_mcp_request_id_past_64_bits_is_answered_with_that_very_id() -> None:
    """A client whose JSON-RPC ids are past 64 bits (both signs) initializes, lists the
    tools and calls one: each answer carries its request's id, the same integer. Before:
    400 "a request's id must be a string or an integer (not a number with a fraction)"
    (orjson read the id as a float), and the client could not even initialize."""
    init = {
        "jsonrpc": "2.0",
        "id": BIG,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    async with web_server(echo, protocols=MCP) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT) as raw:
            opened = await raw.post("/mcp", content=json.dumps(init))
            assert opened.status_code == 200, opened.text
            session = {
                "mcp-session-id": opened.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-11-25",
            }
            done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await raw.post("/mcp", content=json.dumps(done), headers=session)
            listed = await raw.post(
                "/mcp",
                content=json.dumps({"jsonrpc": "2.0", "id": -BIG, "method": "tools/list"}),
                headers=session,
            )
            call = {
                "jsonrpc": "2.0",
                "id": BIG + 1,
                "method": "tools/call",
                "params": {"name": "echo", "arguments": {"prompt": "hi", "session_id": "m"}},
            }
            called = await raw.post("/mcp", content=json.dumps(call), headers=session)
    [first] = _answers(opened)
    [tools] = [m for m in _answers(listed) if "id" in m]
    [result] = [m for m in _answers(called) if "id" in m]
    assert (first["id"], tools["id"], result["id"]) == (BIG, -BIG, BIG + 1)
    assert "result" in first and [t["name"] for t in tools["result"]["tools"]] == ["echo"]
    assert result["result"]["isError"] is False, result


def test_an_mcp_id_in_use_past_64_bits_is_a_409_naming_it_not_a_500() -> None:
    """A second request reusing the id (past 64 bits) of one still in flight: its 409's
    body names that id and echoes it (before: orjson refused to write it, a 500)."""
    refusal = _id_in_use(BIG)
    body = json.loads(refusal.body)
    assert (refusal.status_code, body["id"]) == (409, BIG)
    assert body["error"]["message"].startswith(f"request id {BIG} is in use")
    assert b"\t" not in refusal.body


@tool(needs_approval=True)
async def move(n: int) -> dict:
    """Moves n (it needs a person's approval)."""
    return {"moved": n}


def _asks_to_move(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("move", {"n": BIG}, tool_call_id="c0")
    last = request.messages[-1]
    assert isinstance(last, ToolMessage)
    return [f"done: {last.output} {last.error}"]


async def _a2a(http: httpx.AsyncClient, message: dict[str, Any]) -> httpx.Response:
    return await http.post(
        "/a2a/message:send",
        content=json.dumps({"message": message}),  # (integers of any size written exactly)
        headers={"content-type": "application/json", "a2a-version": "1.0"},
    )


async def test_an_a2a_task_waiting_on_a_call_past_64_bits_asks_and_takes_the_answer() -> None:
    """Axon's A2A endpoint: the model calls ``move(n=BIG)``, which needs approval. The
    task waits for input: its status says ``move({"n":BIG})`` and its data part holds
    BIG, an integer. The client approves with an edit ``{"n": -BIG}``: 200, the task
    completes, the tool moved -BIG. Before: the waiting status was a 500 (orjson refused
    BIG in the person's line), and an answer whose data held BIG was recorded but
    answered 500 (its fingerprint, orjson), the task left as it was."""
    agent = Agent(name="mover", provider=ScriptedProvider(responder=_asks_to_move), tools=[move])
    async with web_server(agent, protocols=("a2a",)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            first = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "go"}]}
            asked = await _a2a(http, first)
            assert asked.status_code == 200, asked.text
            task = json.loads(asked.text)["task"]
            status = task["status"]
            [line, data] = status["message"]["parts"]
            [pending] = data["data"]["pending"]
            decision = {"id": pending["id"], "approved": True, "editedInput": {"n": -BIG}}
            answer = {
                "messageId": "m2",
                "role": "ROLE_USER",
                "taskId": task["id"],
                "contextId": task["contextId"],
                "parts": [{"data": {"decisions": [decision]}}],
            }
            answered = await _a2a(http, answer)
            again = await _a2a(http, answer)  # (a resend: its fingerprint compared)
        stored = await server.host.store.load(task["contextId"])
    assert status["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert f'move({{"n":{BIG}}})' in line["text"] and "\t" not in line["text"]
    assert pending["input"] == {"n": BIG} and type(pending["input"]["n"]) is int
    assert answered.status_code == 200, answered.text
    done = json.loads(answered.text)["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED", done
    assert again.status_code == 200, again.text
    [result] = [m for m in stored.messages if isinstance(m, ToolMessage)]
    assert result.output == {"moved": -BIG}
