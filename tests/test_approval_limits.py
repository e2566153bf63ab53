"""What a client gives a waiting turn (a client tool's output or error, a denial's reason)
reaches the model cut to the agent's ``max_tool_result_chars``, as a server tool's result
is (docs/approval.md): before, 10 MB of a client tool's output went to the model whole."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Budget, Host, InvalidDecision, Tool, ToolMessage, tool
from runtime.events import ToolApprovalDecided
from runtime.results import TRUNCATION_MARKER, truncate_output
from tests.test_web_http import body, events
from tests.web.harness import wait_idle, web_server

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


# What is stored of what a client gave: cut to the same limit (docs/approval.md). Before,
# the decision kept the client's 10 MB output or 1 MB reason whole in the session's rows.

BIG_OUTPUT = "r" * 10_000_000
BIG_REASON = "n" * 1_000_000
LIMIT = Budget().max_tool_result_chars
assert LIMIT is not None


def largest_row(db: Path) -> int:
    """The longest message row the SQLite store holds, in bytes."""
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT max(length(body)) FROM messages").fetchone()[0]


async def test_a_client_tools_10mb_output_is_stored_cut_to_the_limit(tmp_path):
    seen: list[Any] = []
    step = [*tool_call("pick_color", {}, tool_call_id="C")]
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent(step, seen, limit=LIMIT))
        await session.run("go")
        await session.respond("C", output=BIG_OUTPUT)
    assert seen[-1] == [cut(BIG_OUTPUT, LIMIT)]
    assert largest_row(tmp_path / "s.db") < LIMIT + 1_000


async def test_a_1mb_denial_reason_is_stored_cut_to_the_limit(tmp_path):
    seen: list[Any] = []
    step = [*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        session = await host.open_session(agent(step, seen, limit=LIMIT))
        first = await session.run("go")
        await session.respond(first.pending[0].approval_id, approved=False, reason=BIG_REASON)
    assert seen[-1] == [cut(f"the tool call was denied: {BIG_REASON}", LIMIT)]
    assert largest_row(tmp_path / "s.db") < LIMIT + 1_000


async def test_a_1mb_denial_reasons_bus_event_carries_the_reason_cut_as_stored():
    """An observer of the bus (an event log, a structured log) was handed the client's
    whole reason, though the store keeps it cut to ``max_tool_result_chars``."""
    step = [*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]
    async with Host.open(log_tap=False) as host:
        decided = host.bus.subscribe([ToolApprovalDecided], name="t")
        session = await host.open_session(agent(step, [], limit=LIMIT))
        first = await session.run("go")
        await session.respond(first.pending[0].approval_id, approved=False, reason=BIG_REASON)
        event = decided.inbox.get_nowait()
    assert event.reason == cut(BIG_REASON, LIMIT)


def continuation(message_id: str, part: dict[str, Any]) -> dict[str, Any]:
    """The body ``useChat`` posts to answer the turn's waiting call."""
    sent = body("s")
    sent["messages"].append(
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
    )
    sent["messageId"] = message_id
    return sent


async def test_a_client_tools_10mb_output_over_http_is_stored_cut_to_the_limit(tmp_path):
    seen: list[Any] = []
    step = [*tool_call("pick_color", {}, tool_call_id="C")]
    db = tmp_path / "s.db"
    async with web_server(agent(step, seen, limit=LIMIT), store=str(db)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            part = {
                "type": "tool-pick_color",
                "toolCallId": "C",
                "state": "output-available",
                "input": {},
                "output": BIG_OUTPUT,
            }
            r = await client.post("/api/chat", json=continuation(first[0]["messageId"], part))
            assert r.status_code == 200
            await wait_idle(server, "s")
    assert seen[-1] == [cut(BIG_OUTPUT, LIMIT)]
    assert largest_row(db) < LIMIT + 1_000


async def test_a_1mb_denial_reason_over_http_is_stored_cut_to_the_limit(tmp_path):
    seen: list[Any] = []
    step = [*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]
    db = tmp_path / "s.db"
    async with web_server(agent(step, seen, limit=LIMIT), store=str(db)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = next(c for c in first if c != "[DONE]" and c["type"] == "tool-approval-request")
            part = {
                "type": "tool-delete_file",
                "toolCallId": "D",
                "state": "approval-responded",
                "input": {"path": "/x"},
                "approval": {"id": asked["approvalId"], "approved": False, "reason": BIG_REASON},
            }
            r = await client.post("/api/chat", json=continuation(first[0]["messageId"], part))
            assert r.status_code == 200
            await wait_idle(server, "s")
    assert seen[-1] == [cut(f"the tool call was denied: {BIG_REASON}", LIMIT)]
    assert largest_row(db) < LIMIT + 1_000


def test_a_text_cut_already_is_cut_as_the_text_it_came_from():
    """What lets a decision store a value cut while the model reads the same of it."""
    whole = "p" * 30 + "q" * 50
    assert truncate_output(truncate_output("q" * 50, 20), 20) == cut("q" * 50, 20)
    assert truncate_output("p" * 30 + truncate_output("q" * 50, 20), 20) == cut(whole, 20)
