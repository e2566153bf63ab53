"""What ``as_tool(pass_approvals=True)`` left after ``subapprove`` (embedded host,
SQLite): the web app's 409 for a new message to a sub-session whose caller waits says
the calling session decides; a sub-agent with a client tool is refused when the tool
is built; deleting the calling session while it waits ends the sub-session's wait."""

from __future__ import annotations

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host, Tool
from runtime.actor_messages import InferRequest
from runtime.approval import pending_calls, waiting_calls
from runtime.messages import ToolMessage, UserMessage
from tests.test_approval_nested_pass import (
    SUB,
    _clear,  # noqa: F401 (fixture)
    _grand_parent,
    _suspend,
    parent,
    ran,
    wire_money,
)
from tests.test_approval_nested_pass_many import _pays_in_turn_model
from tests.test_approval_nested_pass_owner import _load
from tests.test_approval_web import post
from tests.test_mcp_server import eventually
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


def test_pass_approvals_for_an_agent_with_a_client_tool_builds():
    """Refused when built until ``subclient``: a client tool's call now passes up
    (tests/test_approval_nested_pass_client.py)."""
    assert _with_client_tool().as_tool(pass_approvals=True).name == "helper"


def test_an_agent_with_a_client_tool_is_still_a_tool_without_pass_approvals():
    assert _with_client_tool().as_tool().name == "helper"


async def test_deleting_the_calling_session_while_it_waits_deletes_the_waiting_sub_session(
    tmp_path,
):
    """Before: the sub-session waited for good, refusing decisions (``CallerDecides``)
    and new messages (``CallerWaits``); nothing could end it. Then its wait was ended
    and it stayed, an orphan. Now the caller's delete takes it (the store's delete of
    the sessions a session owns); a message under its id starts a new conversation."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        await _suspend(host)
        await host.delete_session("s")
        sub = await host.store.load(SUB)
        other = Agent(name="other", provider=ScriptedProvider([["hi there"]]))
        sub_session = await host.open_session(other, session_id=SUB)
        answered = await sub_session.run("hello")
    assert sub is None
    assert answered.text == "hi there" and ran == []


async def test_deleting_the_top_session_deletes_the_waiting_sub_sessions_two_agents_deep(
    tmp_path,
):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_grand_parent(), session_id="s")
        await session.run("go")
        await host.delete_session("s")
        middle = await host.store.load("s.middle.T")
        bottom = await host.store.load("s.middle.T.helper.M")
    assert middle is None and bottom is None and ran == []


async def test_runtime_delete_of_the_calling_session_deletes_the_waiting_sub_session(tmp_path):
    from tests.test_cli_delete import axon

    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        await _suspend(host)
    deleted = await trio.to_thread.run_sync(
        lambda: axon("delete", "s", "--store", str(tmp_path / "s.db"), "--yes")
    )
    sub = await _load_from(tmp_path / "s.db", SUB)
    assert deleted.returncode == 0, deleted.stderr
    assert sub is None


async def _load_from(path, session_id: str):
    async with Host.open(store=path, log_tap=False) as host:
        return await host.store.load(session_id)


def _caller_model(request: InferRequest) -> list:
    """Calls ``helper`` first; then says what each result it has was."""
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    if current_step(request.messages) == 0 and len(users) == 1:
        return tool_call("helper", {"input": "pay x and y"}, tool_call_id="H")
    results = [m for m in request.messages if isinstance(m, ToolMessage)]
    return ["caller saw: " + "; ".join(str(m.output or m.error) for m in results)]


def _asks_again() -> Agent:
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=_pays_in_turn_model), tools=[wire_money]
    )
    return Agent(
        provider=ScriptedProvider(responder=_caller_model),
        tools=[helper.as_tool(pass_approvals=True)],
    )


async def test_a_sub_agent_asking_again_in_a_new_messages_turn_is_a_clear_tool_error(tmp_path):
    """The caller approved the first approval, then sent a new message instead of its
    continuation: the call runs in the new message's turn, which cannot wait for the
    sub-agent's second approval (the call is the superseded turn's). Refused, saying
    so, the sub-turn ended; before, the error said nobody could ever give the input."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(_asks_again(), session_id="s")
        asked = await session.run("go")
        await session.decide(asked.pending[0].approval_id, approved=True)
        result = await session.run("and then?")
        sub = await host.store.load(SUB)
    assert result.finish_reason == "stop"
    assert "asked for another approval (wire_money)" in result.text
    assert "after its caller went on with a new message" in result.text
    assert "the calls it made that ran: wire_money" in result.text
    assert ran == ["x"] and sub is not None and waiting_calls(list(sub.messages)) == ()


@pytest.mark.parametrize("stream", [False, True])
async def test_an_openai_completion_naming_the_sub_session_is_a_409_naming_the_caller(
    tmp_path, stream
):
    """Embedded: before, OpenAI's generic "is already running a turn"."""
    async with web_server(
        parent(), store=str(tmp_path / "w.db"), protocols=("ai-sdk", "openai")
    ) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await post(client, body("s"))
            response = await client.post(
                "/v1/chat/completions",
                json={
                    "model": "assistant",
                    "messages": [{"role": "user", "content": "hello"}],
                    "stream": stream,
                },
                headers={"X-Axon-Session": SUB},
            )
    assert response.status_code == 409, response.text
    error = response.json()["error"]
    assert "waits for a decision of session 's'" in error["message"]
    assert error["code"] == "session_busy"


async def test_an_a2a_message_in_the_sub_sessions_context_is_refused_naming_the_caller(tmp_path):
    message = {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": SUB}
    sent = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}
    async with web_server(
        parent(), store=str(tmp_path / "w.db"), protocols=("ai-sdk", "a2a")
    ) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await post(client, body("s"))
            response = await client.post("/a2a/jsonrpc", json=sent)
        after = await _load(SUB, tmp_path)
    refused = response.json()
    assert "waits for a decision of session 's'" in refused["error"]["message"], refused
    assert [c.decided for c in pending_calls(list(after.messages))] == [False]


async def test_a_sub_session_the_web_app_held_open_takes_a_message_once_its_caller_is_deleted(
    tmp_path,
):
    """The 409 for the first message opened the sub-session in the app's host; before,
    that open session kept the wait the store had ended, and refused the message again."""
    json = {"content-type": "application/json"}
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await post(client, body("s"))
            refused = await client.post("/api/chat", json=body(SUB))
            deleted = await client.delete("/api/sessions/s", headers=json)
            again = await client.post("/api/chat", json=body(SUB))
    assert (refused.status_code, deleted.status_code) == (409, 204)
    assert again.status_code == 200, again.text


async def test_an_unnamed_completions_scratch_session_goes_with_its_waiting_sub_session(tmp_path):
    """Embedded: the stateless host deletes the scratch session after the answer, and
    with it the sub-session its agent tool left waiting for it; before, that sub-session
    waited for good in that host's store (then, its wait ended, stayed there for good)."""
    request = {"model": "assistant", "messages": [{"role": "user", "content": "go"}]}
    async with web_server(parent(), protocols=("ai-sdk", "openai")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            done = await client.post("/v1/chat/completions", json=request)
        scratch = server.app.state.turn_cancellers[0].__self__._host  # the stateless host

        async def nothing_is_left() -> bool:  # the request's finally deletes them
            return not scratch.sessions and not await scratch.store.list_sessions()

        await eventually(nothing_is_left)
    assert done.status_code == 200, done.text
    assert ran == []
