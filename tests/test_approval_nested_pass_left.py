"""What ``as_tool(pass_approvals=True)`` left after ``subapprove`` (embedded host,
SQLite): the web app's 409 for a new message to a sub-session whose caller waits says
the calling session decides; a sub-agent with a client tool is refused when the tool
is built; deleting the calling session while it waits ends the sub-session's wait."""

from __future__ import annotations

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Tool, ToolDefinitionError
from runtime.approval import pending_calls
from tests.test_approval_nested_pass import (
    SUB,
    _clear,  # noqa: F401 (fixture)
    parent,
)
from tests.test_approval_nested_pass_owner import _load
from tests.test_approval_web import post
from tests.test_web_http import body
from tests.web.harness import web_server


async def test_the_web_apps_409_for_a_message_to_the_sub_session_names_the_caller(tmp_path):
    """Before: the generic "is already running a turn (a turn runs). Stop the turn
    with ..." text, for a session that runs no turn and that a stop does not free."""
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await post(client, body("s"))
            response = await client.post("/api/chat", json=body(SUB))
        after = await _load(SUB, tmp_path)
    assert response.status_code == 409
    error = response.json()["error"]
    assert "waits for a decision of session 's'" in error and "decide it there" in error
    assert "already running a turn" not in error
    assert [c.decided for c in pending_calls(list(after.messages))] == [False]


locate = Tool.client("locate", {"type": "object", "properties": {}}, "Where the user is.")


def _with_client_tool() -> Agent:
    return Agent(name="helper", provider=ScriptedProvider([["hi"]]), tools=[locate])


def test_pass_approvals_for_an_agent_with_a_client_tool_is_refused_when_built():
    """Only approvals pass up: a sub-turn waiting for ``locate``'s output was a tool
    error at run time, after the sub-agent's other calls had run."""
    with pytest.raises(ToolDefinitionError, match=r"'helper' has client-side tools \(locate\)"):
        _with_client_tool().as_tool(pass_approvals=True)


def test_an_agent_with_a_client_tool_is_still_a_tool_without_pass_approvals():
    assert _with_client_tool().as_tool().name == "helper"
