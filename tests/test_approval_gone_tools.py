"""An approved call whose tool the continuation does not have (docs/approval.md): a
turn's own tools are given again to ``respond``, and a tool that went (a redeploy) is
named in the result the model reads; the call is not run."""

from __future__ import annotations

import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host, tool
from runtime.messages import ToolMessage

ran: list[str] = []
GONE = (
    "the tool call was approved, but the tool 'delete_file' is no longer available, "
    "so it was not run"
)


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return f"deleted {path}"


def deleting(tools: list) -> Agent:
    steps = [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["ok"]]
    return Agent(provider=ScriptedProvider(steps), tools=tools)


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def results(messages: list) -> list:
    return [(m.output, m.error) for m in messages if isinstance(m, ToolMessage)]


async def test_respond_runs_an_approved_call_of_the_turns_own_tool():
    """Before: ``respond`` took no tools; the approved call got ``unknown tool``."""
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(deleting([]), session_id="s")
        async with session.stream("go", tools=[delete_file]) as out:
            async for _ in out:
                pass
        assert out.result is not None
        call = out.result.pending[0]
        result = await session.respond(call.approval_id, approved=True, tools=[delete_file])
    assert result is not None and result.text == "ok"
    assert ran == ["/x"] and results(session.messages) == [("deleted /x", None)]


async def test_an_approved_call_whose_tool_went_is_told_it_was_not_run(tmp_path):
    """Before: ``unknown tool 'delete_file'; available tools: none``, as if the model
    had made the call up, for a call a person approved."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        asked = await (await host.open_session(deleting([delete_file]), session_id="s")).run("go")
    async with Host.open(store=db, log_tap=False) as host:  # redeployed without it
        session = await host.open_session(deleting([]), session_id="s")
        await session.respond(asked.pending[0].approval_id, approved=True)
    assert ran == []
    assert results(session.messages) == [(None, GONE)]


async def test_an_approved_call_whose_tool_went_before_a_new_message_is_told_so(tmp_path):
    """Approved, never resumed, then a new message on a host without the tool: before,
    ``unknown tool 'delete_file'; available tools: none``."""
    db = tmp_path / "s.db"
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(deleting([delete_file]), session_id="s")
        asked = await session.run("go")
        await session.decide(asked.pending[0].approval_id, approved=True)
    async with Host.open(store=db, log_tap=False) as host:
        again = Agent(provider=ScriptedProvider(turns=[[], [["fine"]]]), tools=[])
        session = await host.open_session(again, session_id="s")
        await session.run("and now?")
    assert ran == []
    assert results(session.messages) == [(None, GONE)]
