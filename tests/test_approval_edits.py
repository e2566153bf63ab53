"""Approving a call with an edited input (``respond(id, approved=True, edited_input=...)``,
docs/approval.md "Approving with edits"): the edit is checked against the tool's input
schema (refused, nothing recorded, when it fails), stored as the call's input with the
model's kept beside it, the tool runs once with it, and each real provider is replayed the
model's own call followed by the result, headed by a note that gives the edit
(tests/test_approval_edit_replay.py: the same with signed reasoning before the call)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from runtime import Agent, Host, Tool
from runtime.errors import InvalidDecision
from runtime.events import ToolApprovalDecided
from runtime.history import EDIT_NOTE
from tests.support.approval_replay import (
    anthropic,
    anthropic_steps,
    decide_from_a_new_host,
    lookup,
    offline_env,  # noqa: F401 (fixture)
    openai_chat,
    openai_chat_steps,
    openai_responses,
    openai_responses_steps,
    ran,
)


def scripted(*tools: Tool) -> Agent:
    steps = [[*tool_call("lookup", {"key": "a"})], ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=list(tools or [lookup]))


def the_call(messages: Any) -> Any:
    return next(p for m in messages for p in getattr(m, "content", ()) if hasattr(p, "awaiting"))


async def test_an_edited_approval_runs_the_tool_once_with_the_edit_and_keeps_the_original(
    tmp_path,
):
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(scripted(), session_id="s")
        waited = await session.run("go")
    async with Host.open(store=db, log_tap=False) as host:  # decided from a new host
        session = await host.open_session(scripted(), session_id="s")
        result = await session.respond(
            waited.pending[0].approval_id, approved=True, edited_input={"key": "b"}
        )
        assert result is not None and result.finish_reason == "stop"
    assert ran == ["b"]
    async with Host.open(store=db, log_tap=False) as host:  # as stored
        record = await host.store.load("s")
    assert record is not None
    part = the_call(record.messages)
    assert part.input == {"key": "b"}
    assert part.awaiting.approved is True and part.awaiting.original_input == {"key": "a"}
    (output,) = [m.output for m in record.messages if type(m).__name__ == "ToolMessage"]
    assert output == "value-b"


async def test_an_approval_without_an_edit_stores_no_original(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(scripted(), session_id="s")
        waited = await session.run("go")
        await session.respond(waited.pending[0].approval_id, approved=True)
        record = await host.store.load("s")
    assert record is not None and ran == ["a"]
    part = the_call(record.messages)
    assert part.input == {"key": "a"} and part.awaiting.original_input is None


@pytest.mark.parametrize(("edit", "edited"), [({"key": "b"}, True), (None, False)])
async def test_the_decision_on_the_bus_says_whether_the_call_was_edited(edit, edited):
    async with Host.open(log_tap=False) as host:
        events = host.bus.subscribe([ToolApprovalDecided], name="t")
        session = await host.open_session(scripted(), session_id="s")
        waited = await session.run("go")
        await session.respond(waited.pending[0].approval_id, approved=True, edited_input=edit)
        decided = events.inbox.get_nowait()
    assert (decided.approved, decided.edited) == (True, edited)


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        ({"approved": True, "edited_input": {"key": 3}}, "invalid arguments for lookup"),
        ({"approved": True, "edited_input": {}}, "invalid arguments for lookup"),
        ({"approved": True, "edited_input": ["b"]}, "must be a JSON object"),
        ({"approved": False, "edited_input": {"key": "b"}}, "approved=True only"),
        ({"approved": False, "reason": "no", "edited_input": {"key": "b"}}, "approved=True"),
    ],
)
async def test_an_edit_that_does_not_fit_is_refused_and_nothing_is_recorded(tmp_path, answer, says):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(scripted(), session_id="s")
        waited = await session.run("go")
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision, match=says):
            await session.respond(waited.pending[0].approval_id, **answer)
        after = await host.store.load("s")
        assert before is not None and after is not None
        assert after.version == before.version and after.messages == before.messages
        assert [c.approval_id for c in session.pending] == [waited.pending[0].approval_id]
        # still waiting: the plain approval goes through
        await session.respond(waited.pending[0].approval_id, approved=True)
    assert ran == ["a"]


async def test_a_client_tools_call_takes_no_edit(tmp_path):
    client = Tool.client("pick", {"type": "object", "properties": {"n": {"type": "integer"}}})
    steps = [[*tool_call("pick", {"n": 1})], ["done"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[client])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        waited = await session.run("go")
        version = (await host.store.load("s")).version  # type: ignore[union-attr]
        with pytest.raises(InvalidDecision, match="cannot be edited"):
            await session.respond(waited.pending[0].approval_id, output=2, edited_input={"n": 2})
        assert (await host.store.load("s")).version == version  # type: ignore[union-attr]


async def test_a_turns_own_tool_is_checked_with_the_tools_respond_is_given(tmp_path):
    steps = [[*tool_call("lookup", {"key": "a"})], ["done"]]
    agent = Agent(provider=ScriptedProvider(steps))
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        async with session.stream("go", tools=[lookup]) as out:
            async for _ in out:
                pass
        key = session.pending[0].approval_id
        with pytest.raises(InvalidDecision, match="not available here"):
            await session.respond(key, approved=True, edited_input={"key": "b"})
        await session.respond(key, approved=True, edited_input={"key": "b"}, tools=[lookup])
    assert ran == ["b"]


# -- what each provider is replayed ---------------------------------------------------------


async def edit_from_a_new_host(tmp_path, provider_of: Any, first: bytes, answer: bytes) -> dict:
    """Suspend on ``first`` (a call of ``lookup`` with key ``a``), approve it with key
    ``b`` from a new host on the same SQLite file; the body of the continuation's model
    request."""
    result, requests = await decide_from_a_new_host(
        tmp_path, provider_of, first, answer, approved=True, edited_input={"key": "b"}
    )
    assert ran == ["b"] and result is not None and result.finish_reason == "stop"
    assert len(requests) == 2
    return requests[1].json()


NOTE_B = EDIT_NOTE.format(input='{"key": "b"}')


async def test_openai_chat_is_replayed_the_models_call_and_the_edit_in_its_result(tmp_path):
    sent = await edit_from_a_new_host(tmp_path, openai_chat, *openai_chat_steps())
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    (call,) = messages[1]["tool_calls"]
    assert call["id"] == "call_A" and json.loads(call["function"]["arguments"]) == {"key": "a"}
    assert messages[2] == {
        "role": "tool",
        "tool_call_id": "call_A",
        "content": f"{NOTE_B}\n\nvalue-b",
    }


async def test_anthropic_is_replayed_the_models_call_and_the_edit_in_its_result(tmp_path):
    sent = await edit_from_a_new_host(tmp_path, anthropic, *anthropic_steps())
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "toolu_A", "name": "lookup", "input": {"key": "a"}}
    ]
    (block,) = messages[2]["content"]
    assert block["type"] == "tool_result" and block["tool_use_id"] == "toolu_A"
    assert block["content"] == f"{NOTE_B}\n\nvalue-b" and not block.get("is_error")


async def test_openai_responses_is_replayed_the_models_call_and_the_edit_in_its_output(tmp_path):
    sent = await edit_from_a_new_host(tmp_path, openai_responses, *openai_responses_steps())
    items = sent["input"]
    (call,) = [i for i in items if i.get("type") == "function_call"]
    (output,) = [i for i in items if i.get("type") == "function_call_output"]
    assert call["call_id"] == "call_A" and json.loads(call["arguments"]) == {"key": "a"}
    assert output == {
        "type": "function_call_output",
        "call_id": "call_A",
        "output": f"{NOTE_B}\n\nvalue-b",
    }


async def test_an_edit_equal_to_the_models_input_is_a_plain_approval(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(scripted(), session_id="s")
        waited = await session.run("go")
        recorded = await session.decide(
            waited.pending[0].approval_id, approved=True, edited_input={"key": "a"}
        )
        record = await host.store.load("s")
    assert record is not None and recorded.call.original_input is None
    part = the_call(record.messages)
    assert part.input == {"key": "a"} and part.awaiting.original_input is None


async def test_an_edited_approval_whose_continuation_never_came_runs_the_edit_before_a_new_message(
    tmp_path,
):
    steps = [[*tool_call("lookup", {"key": "a"})], ["next answer"]]
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[lookup]), session_id="s"
        )
        waited = await session.run("go")
        recorded = await session.decide(
            waited.pending[0].approval_id, approved=True, edited_input={"key": "b"}
        )
        assert recorded.call.input == {"key": "b"}
        assert recorded.call.original_input == {"key": "a"}
    async with Host.open(store=db, log_tap=False) as host:  # no resume: a new message
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps[1:]), tools=[lookup]), session_id="s"
        )
        await session.run("something else")
    assert ran == ["b"]
    (result,) = [m for m in session.messages if type(m).__name__ == "ToolMessage"]
    assert result.output == "value-b"


async def test_an_edit_of_a_passed_up_approval_is_checked_against_the_sub_agents_tool(tmp_path):
    """The edit is of the sub-agent's call (``wire_money(to)``), not of the agent tool's
    prompt: the agent tool's own argument is a key the asking tool does not take."""
    from tests.test_approval_nested_pass import parent
    from tests.test_approval_nested_pass import ran as wired

    wired.clear()
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        waited = await session.run("go")
        key = waited.pending[0].approval_id
        version = (await host.store.load("s")).version  # type: ignore[union-attr]
        with pytest.raises(InvalidDecision, match="names 'input', which wire_money does not"):
            await session.respond(key, approved=True, edited_input={"input": "pay y"})
        assert (await host.store.load("s")).version == version  # type: ignore[union-attr]
        await session.respond(key, approved=True)
    assert wired == ["x"]
