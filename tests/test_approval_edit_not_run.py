"""What the model is told of a call a person approved with edits, in each way the call
ends (docs/approval.md, "What the model sees"): the note at the head of its result says
the call *ran* with the edit only when its tool was called (its output, or its own
error: it raised). Approved but never run (its tool gone when the turn resumed, the edit
refused by the tool where it ran, the call ended with its sub-turn) it says so; before,
the note said "the call ran with that input" above "... so it was not run". The result
stores which (``ToolMessage.ran``); a result stored without it is told as before, so
a session's replayed history stays what later reasoning was signed over."""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from runtime import Agent, Host, tool
from runtime.agent import NESTED_WAIT
from runtime.approval import supersede
from runtime.history import EDIT_NOT_RUN_NOTE, EDIT_NOTE, INTERRUPTED, iter_turns
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    Message,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.serde import from_json, to_json

ran: list[Any] = []

EDIT = {"key": "b"}
RAN = EDIT_NOTE.format(input=json.dumps(EDIT))
NOT_RUN = EDIT_NOT_RUN_NOTE.format(input=json.dumps(EDIT))


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()


@tool(needs_approval=True)
async def lookup(key: str) -> str:
    """Look a key up."""
    ran.append(key)
    if key == "boom":
        raise ValueError("no such key")
    return f"value-{key}"


@tool(name="lookup", needs_approval=True)
async def lookup_by_number(key: int) -> str:
    """Look a key up (redeployed: the key is a number now)."""
    ran.append(key)
    return f"value-{key}"


@tool
async def other(x: int) -> str:
    """Something else."""
    return "other"


def agent(*tools: Any, steps: list[Any] | None = None) -> tuple[Agent, ScriptedProvider]:
    provider = ScriptedProvider(steps or [[*tool_call("lookup", {"key": "a"})], ["done"]])
    return Agent(provider=provider, tools=list(tools)), provider


def told(messages: list[Message]) -> list[ToolMessage]:
    """The tool results as every provider's request is built from them (iter_turns)."""
    return [r for kind, _, results in iter_turns(messages) if kind == "assistant" for r in results]


def result_of(messages: Any) -> ToolMessage:
    (result,) = [m for m in messages if isinstance(m, ToolMessage)]
    return result


async def decided(db: Any, edit: dict[str, Any] = EDIT) -> None:
    """A turn that waits for ``lookup``, approved with ``edit`` (recorded, not resumed)."""
    a, _ = agent(lookup)
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(a, session_id="s")
        waited = await session.run("go")
        await session.decide(waited.pending[0].approval_id, approved=True, edited_input=edit)


async def resumed(db: Any, *tools: Any) -> tuple[list[Message], ToolMessage]:
    """The decided turn resumed on a new host whose agent has ``tools``: what the model
    was sent next, and the stored result."""
    a, provider = agent(*tools)
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(a, session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
        record = await host.store.load("s")
    assert record is not None
    return list(provider.requests[-1].messages), result_of(record.messages)


async def test_an_edited_call_that_ran_is_told_it_ran_and_its_result_says_so(tmp_path):
    await decided(tmp_path / "s.db")
    sent, stored = await resumed(tmp_path / "s.db", lookup)
    assert ran == ["b"] and stored.ran is True and stored.output == "value-b"
    assert result_of(told(sent)).output == f"{RAN}\n\nvalue-b"


async def test_an_edited_call_whose_tool_raised_ran_and_is_told_its_error(tmp_path):
    await decided(tmp_path / "s.db", {"key": "boom"})
    sent, stored = await resumed(tmp_path / "s.db", lookup)
    assert ran == ["boom"] and stored.ran is True
    assert stored.error == "tool lookup raised ValueError: no such key"
    note = EDIT_NOTE.format(input=json.dumps({"key": "boom"}))
    assert result_of(told(sent)).error == f"{note}\n\n{stored.error}"


async def test_an_edited_call_whose_tool_is_gone_when_it_resumes_is_told_it_did_not_run(
    tmp_path,
):
    await decided(tmp_path / "s.db")
    sent, stored = await resumed(tmp_path / "s.db", other)  # redeployed without lookup
    assert ran == [] and stored.ran is False
    assert "no longer available, so it was not run" in stored.error
    assert result_of(told(sent)).error == f"{NOT_RUN}\n\n{stored.error}"


async def test_an_edit_the_redeployed_tool_refuses_is_told_it_did_not_run(tmp_path):
    await decided(tmp_path / "s.db")
    sent, stored = await resumed(tmp_path / "s.db", lookup_by_number)  # key: int now
    assert ran == [] and stored.ran is False
    assert stored.error.startswith("invalid arguments for lookup")
    assert result_of(told(sent)).error == f"{NOT_RUN}\n\n{stored.error}"


@pytest.mark.parametrize(("tools", "runs"), [((lookup,), True), ((other,), False)])
async def test_an_edited_call_run_as_a_new_message_begins_is_told_whether_it_ran(
    tmp_path, tools, runs
):
    """Decided, the continuation never came: a new message runs it first (or finds its
    tool gone)."""
    await decided(tmp_path / "s.db")
    a, provider = agent(*tools, steps=[["next answer"]])
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(a, session_id="s")
        await session.run("something else")
        record = await host.store.load("s")
    assert record is not None
    stored = result_of(record.messages)
    assert stored.ran is runs and ran == (["b"] if runs else [])
    body = stored.output if runs else stored.error
    (result,) = told(list(provider.requests[-1].messages))
    assert (result.output if runs else result.error) == f"{RAN if runs else NOT_RUN}\n\n{body}"


def _edited_waiting_turn() -> list[Message]:
    wait = Awaiting(
        kind="approval",
        id="approval_1",
        turn_id="turn_1",
        decided=True,
        approved=True,
        original_input={"key": "a"},
        edit_in_result=True,
    )
    call = ToolCallPart(tool_call_id="c1", tool_name="lookup", input=EDIT, step=0, awaiting=wait)
    return [UserMessage(content="go"), AssistantMessage(id="m1", content=(call,))]


def test_an_edited_call_its_sub_turn_ended_before_it_ran_is_told_it_did_not_run():
    """A sub-session whose caller went on (``NESTED_WAIT``) gives an approved call it
    never ran the result "not executed": the note says so too."""
    messages = _edited_waiting_turn()
    supersede(messages, reason=NESTED_WAIT)
    stored = result_of(messages)
    assert stored.ran is False and stored.error.startswith("the tool call was not executed")
    assert result_of(told(messages)).error == f"{NOT_RUN}\n\n{stored.error}"


def test_whether_an_edited_call_ran_is_stored_and_only_for_one():
    ran_ = ToolMessage(tool_call_id="c", tool_name="t", step=0, output="x", ran=False, id="i")
    plain = ToolMessage(tool_call_id="c", tool_name="t", step=0, output="x", id="i")
    assert b'"ran":false' in to_json(ran_) and b"ran" not in to_json(plain)
    assert from_json(to_json(ran_), Message) == ran_
    old = json.loads(to_json(plain))  # (stored before: no key) reads as not recorded
    assert from_json(json.dumps(old).encode(), Message).ran is None


def test_a_result_stored_without_the_record_or_cut_short_is_told_as_before():
    """An edited call's result stored before ``ran`` existed (or ``interrupted``: it may
    have begun) keeps the note it was replayed with: changing it would change the prefix
    later signed reasoning in that session was checked over."""
    for error in ("the tool 'lookup' is no longer available, so it was not run", INTERRUPTED):
        messages = _edited_waiting_turn()
        messages.append(ToolMessage(tool_call_id="c1", tool_name="lookup", step=0, error=error))
        assert result_of(told(messages)).error == f"{RAN}\n\n{error}"
