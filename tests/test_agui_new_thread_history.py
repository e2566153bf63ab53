"""A new AG-UI thread started from another thread's ``MESSAGES_SNAPSHOT`` (a client
that forks a conversation, or one whose server lost the thread): the snapshot lists a
sub-agent's client calls passed up through an agent tool's call ``H`` as calls of the
same assistant message (``H.L0``, ``H.L1``) with their answers as tool messages, so a
client can answer them; the new thread's history holds only what the top agent's model
saw: the agent tool's call and its result. The replay is checked in the OpenAI and
Anthropic request bodies (``map_messages``)."""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers import anthropic, openai
from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.actor_messages import InferRequest
from runtime.app.web.agui_input import history_of
from runtime.messages import AssistantMessage, Message, ToolCallPart, ToolMessage
from tests.test_agui import run, run_input, user
from tests.test_agui_nested import _locates_twice, answer, locate, snapshot_of
from tests.test_approval_nested_pass_client import _parent_model
from tests.web.harness import web_server

pytest.importorskip("ag_ui.core")

requests: list[tuple[Message, ...]] = []
"""What the top agent's model was sent, request by request."""


def _recorded(request: InferRequest) -> list[Any]:
    requests.append(tuple(request.messages))
    return _parent_model(request)


def locating() -> Agent:
    """tests/test_agui_nested.py's: a sub-agent that asks for ``locate`` twice, passed
    up as ``H.L0`` and ``H.L1``; the top agent's requests recorded."""
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_locates_twice), tools=[locate]
    )
    return Agent(
        name="top",
        provider=ScriptedProvider(responder=_recorded),
        tools=[helper.as_tool(pass_approvals=True)],
    )


@pytest.fixture(autouse=True)
def _clear() -> None:
    requests.clear()


async def forked() -> tuple[list[dict[str, Any]], tuple[Message, ...]]:
    """Thread ``s`` run to its end (both sub calls answered), then its snapshot's
    messages posted with a new user message to start thread ``t``: the snapshot, and
    what ``t``'s first request sent the top agent's model."""
    history = [user("go", "m1"), answer("H.L0", "Paris")]
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        await run(server, run_input("s", *history, runId="r2"))
        await run(server, run_input("s", *history, answer("H.L1", "Rome"), runId="r3"))
        held = snapshot_of(await run(server, run_input("s", runId="reconnect")))["messages"]
        requests.clear()
        await run(server, run_input("t", *held, user("never mind", "m2"), runId="r4"))
    return held, requests[0]


def _calls(messages: Any) -> list[tuple[str, str]]:
    return [
        (p.tool_call_id, p.tool_name)
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    ]


async def test_a_new_thread_from_a_snapshot_replays_the_agent_tools_call_alone():
    held, sent = await forked()
    listed = [c["id"] for m in held if m["role"] == "assistant" for c in m.get("toolCalls", ())]
    wire = next(m["id"] for m in held if m["role"] == "assistant") + ".s0."
    assert listed == [wire + "H", wire + "H.L0", wire + "H.L1"]  # what the client was given
    assert _calls(sent) == [("H", "helper")]
    results = [(m.tool_call_id, m.output) for m in sent if isinstance(m, ToolMessage)]
    assert results == [("H", "Paris then Rome")]


async def test_the_openai_request_of_a_forked_thread_names_only_the_top_agents_tools():
    _, sent = await forked()
    body = openai.map_messages(None, sent)
    calls = [c for m in body if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [("H", "helper")]
    assert [m["tool_call_id"] for m in body if m["role"] == "tool"] == ["H"]


async def test_the_anthropic_request_of_a_forked_thread_names_only_the_top_agents_tools():
    _, sent = await forked()
    _, body = anthropic.map_messages(None, sent)
    blocks = [b for m in body if isinstance(m["content"], list) for b in m["content"]]
    uses = [(b["id"], b["name"]) for b in blocks if b["type"] == "tool_use"]
    assert uses == [("H", "helper")]
    assert [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"] == ["H"]


def _call(id: str, name: str) -> dict[str, Any]:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def _assistant(id: str, *calls: dict[str, Any]) -> dict[str, Any]:
    return {"id": id, "role": "assistant", "toolCalls": list(calls)}


def test_sub_calls_and_their_answers_are_left_out_two_agents_deep():
    """``top`` -> ``middle`` -> ``helper``: the sub call's id extends the agent tool's by
    two parts (``H.M.L``); it and its answer are left out all the same."""
    messages = [
        user("go", "m1"),
        _assistant("a1", _call("H", "middle"), _call("H.M.L", "locate")),
        answer("H.M.L", "Paris"),
        answer("H", "Paris it is"),
    ]
    out = history_of(messages)
    assert _calls(out) == [("H", "middle")]
    assert [(m.tool_call_id, m.output) for m in out if isinstance(m, ToolMessage)] == [
        ("H", "Paris it is")
    ]


def test_a_dotted_call_id_that_extends_no_call_of_its_message_is_kept():
    """Only a call under another call of the same message is a sub call: a client's own
    ids may hold dots (``call.1``)."""
    messages = [
        user("go", "m1"),
        _assistant("a1", _call("call.1", "lookup")),
        answer("call.1", "found"),
    ]
    assert _calls(history_of(messages)) == [("call.1", "lookup")]


async def test_a_new_thread_from_a_snapshot_of_a_waiting_sub_call_replays_no_sub_call():
    """Forked while ``H.L1`` waits (``H.L0`` answered, ``H`` not): the agent tool's call
    is replayed alone (its missing result repaired, as any call's), not the sub calls."""
    async with web_server(locating(), protocols=("ag-ui",)) as server:
        await run(server, run_input("s", user("go", "m1")))
        await run(server, run_input("s", user("go", "m1"), answer("H.L0", "Paris"), runId="r2"))
        held = snapshot_of(await run(server, run_input("s", runId="reconnect")))["messages"]
        requests.clear()
        await run(server, run_input("t", *held, user("never mind", "m2"), runId="r3"))
    body = openai.map_messages(None, requests[0])
    calls = [c for m in body if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [("H", "helper")]
    assert [m["tool_call_id"] for m in body if m["role"] == "tool"] == ["H"]
