"""An edit of a sub-agent's call passed up (``as_tool(pass_approvals=True)``) is bounded by
the ``max_tool_result_chars`` of the agent whose call asked, not the calling agent's
(docs/approval.md, "Bounded in size"). The edit becomes that call's input in the
sub-session and is replayed to the sub-agent's model on each of its later requests; the
calling agent's model is never sent it. Bounded by the caller's limit (editsize), a
sub-agent allowed 20 characters was given an edit of 100,000, and one allowed more than
its caller was refused an edit it takes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Budget, EditTooLarge, Host
from tests.test_approval_nested_pass import (
    SUB,
    _helper_model,
    _middle_model,
    _parent_model,
    _top_model,
    ran,
    wire_money,
)

SMALL = 20  # (the sub call's own input, {"to":"x"}, is 10 characters of JSON)


def sized(chars: int) -> dict[str, str]:
    edit = {"to": "x" * (chars - len(orjson.dumps({"to": ""})))}
    assert len(orjson.dumps(edit)) == chars
    return edit


def helper(limit: int | None) -> Agent:
    return Agent(
        name="helper",
        provider=ScriptedProvider(responder=_helper_model),
        tools=[wire_money],
        budget=Budget(max_tool_result_chars=limit),
    )


def parent(sub_limit: int | None, own_limit: int | None = 100_000) -> Agent:
    return Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper(sub_limit).as_tool(pass_approvals=True)],
        budget=Budget(max_tool_result_chars=own_limit),
    )


def grand_parent(sub_limit: int | None) -> Agent:
    """top (100,000) -> middle (100,000) -> helper (``sub_limit``), which asks."""
    middle = Agent(
        name="middle",
        provider=ScriptedProvider(responder=_middle_model),
        tools=[helper(sub_limit).as_tool(pass_approvals=True)],
    )
    return Agent(
        provider=ScriptedProvider(responder=_top_model),
        tools=[middle.as_tool(pass_approvals=True)],
    )


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


async def _edit(tmp_path: Any, agent: Agent, chars: int) -> Any:
    """Suspend ``agent``'s turn on the passed-up approval and approve it with an edit
    of ``chars`` characters of JSON: the result, or the refusal raised."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        (pending,) = (await session.run("go")).pending
        before = (await host.store.load("s"), await host.store.load(SUB))
        try:
            return await session.respond(
                pending.approval_id, approved=True, edited_input=sized(chars)
            )
        except EditTooLarge:
            after = (await host.store.load("s"), await host.store.load(SUB))
            versions = [(r.version if r else None) for r in (*before, *after)]
            assert versions[:2] == versions[2:] and versions[0] is not None  # nothing saved
            raise


async def test_a_sub_agent_with_a_smaller_limit_than_its_caller_bounds_the_edit(tmp_path):
    with pytest.raises(EditTooLarge) as caught:
        await _edit(tmp_path, parent(SMALL), SMALL + 1)
    assert (caught.value.size, caught.value.limit) == (SMALL + 1, SMALL)
    assert "the sub-agent helper's max_tool_result_chars, 20," in str(caught.value)
    assert ran == []


async def test_an_edit_at_the_sub_agents_limit_runs(tmp_path):
    result = await _edit(tmp_path, parent(SMALL), SMALL)
    assert result is not None and result.finish_reason == "stop"
    assert ran == [sized(SMALL)["to"]]


async def test_a_sub_agent_allowed_more_than_its_caller_takes_the_edit(tmp_path):
    """The caller allows 20 (what its own model is sent); the sub-agent, whose model
    the edit goes to, 100,000."""
    result = await _edit(tmp_path, parent(100_000, own_limit=SMALL), 1_000)
    assert result is not None and result.finish_reason == "stop"
    assert ran == [sized(1_000)["to"]]


async def test_two_agents_deep_the_innermost_agents_limit_bounds_the_edit(tmp_path):
    with pytest.raises(EditTooLarge) as caught:
        await _edit(tmp_path, grand_parent(SMALL), SMALL + 1)
    assert (caught.value.size, caught.value.limit) == (SMALL + 1, SMALL)
    assert ran == []
