"""What a client gives a waiting turn (a client tool's output or error, a denial's reason)
reaches the model cut to the agent's ``max_tool_result_chars``, as a server tool's result
is (docs/approval.md): before, 10 MB of a client tool's output went to the model whole."""

from __future__ import annotations

from typing import Any

import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, Host, InvalidDecision, Tool, ToolMessage, tool
from runtime.results import TRUNCATION_MARKER

pick_color = Tool.client("pick_color", {"type": "object", "properties": {}}, "Pick a color.")


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    return "deleted"


def agent(first: list, seen: list[Any], limit: int = 10) -> Agent:
    def model(request: Any) -> list:
        seen.append([m.output or m.error for m in request.messages if m.role == "tool"])
        return first if len(seen) == 1 else ["done"]

    return Agent(
        provider=ScriptedProvider(responder=model),
        tools=[pick_color, delete_file],
        budget=Budget(max_tool_result_chars=limit),
    )


def cut(text: str, limit: int = 10) -> str:
    return text[:limit] + TRUNCATION_MARKER.format(omitted=len(text) - limit, total=len(text))


async def test_a_client_tools_long_output_reaches_the_model_cut_to_the_limit():
    seen: list[Any] = []
    step = [*tool_call("pick_color", {}, tool_call_id="C")]
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(step, seen))
        await session.run("go")
        await session.respond("C", output="r" * 100)
        stored = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert seen[-1] == [cut("r" * 100)]
    assert stored.output == cut("r" * 100)


async def test_a_client_tools_long_error_reaches_the_model_cut_to_the_limit():
    seen: list[Any] = []
    step = [*tool_call("pick_color", {}, tool_call_id="C")]
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(step, seen))
        await session.run("go")
        await session.respond("C", error="e" * 100)
    assert seen[-1] == [cut("e" * 100)]


async def test_a_long_denial_reason_reaches_the_model_cut_to_the_limit():
    seen: list[Any] = []
    step = [*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(step, seen, limit=40))
        first = await session.run("go")
        await session.respond(first.pending[0].approval_id, approved=False, reason="n" * 100)
    assert seen[-1] == [cut(f"the tool call was denied: {'n' * 100}", 40)]


async def test_a_decided_client_output_superseded_by_a_new_message_is_cut_too():
    seen: list[Any] = []
    step = [
        *tool_call("pick_color", {}, tool_call_id="C"),
        *tool_call("delete_file", {"path": "/x"}, tool_call_id="D"),
    ]
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(step, seen))
        await session.run("go")
        await session.decide("C", output="r" * 100)  # D still waits: nothing resumes
        await session.run("something else")
    assert seen[-1][0] == cut("r" * 100)


async def test_a_client_output_shaped_as_stored_media_is_refused_and_changes_nothing():
    """Taken, it was JSON text to the model here and, once the session was read back from
    the store, an image at the client's URL sent to the model as the tool's result."""
    step = [*tool_call("pick_color", {}, tool_call_id="C")]
    image = {
        "type": "image",
        "data": None,
        "url": "https://example.invalid/x",
        "media_type": "image/png",
    }
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent(step, []))
        await session.run("go")
        version = await host.store.version(session.id)
        with pytest.raises(InvalidDecision, match="shaped as stored media parts"):
            await session.decide("C", output=[image])
        assert await host.store.version(session.id) == version
