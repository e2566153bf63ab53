"""The AI SDK's approval round trip over HTTP (embedded ``serve`` on SQLite): the stream
asks, the continuation POST (the assistant message last) answers, the same message goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Tool, tool
from tests.test_web_http import body, events
from tests.web.harness import web_server

ran: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(path)
    return f"deleted {path}"


pick_color = Tool.client("pick_color", {"type": "object", "properties": {}}, "Pick a color.")


def agent(first: list) -> Agent:
    return Agent(provider=ScriptedProvider([first, ["done"]]), tools=[delete_file, pick_color])


def answer(session_id: str, message_id: str, part: dict[str, Any]) -> dict[str, Any]:
    """The continuation ``useChat`` sends: the conversation, the answered assistant
    message last."""
    sent = body(session_id)
    sent["messages"].append(
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
    )
    sent["messageId"] = message_id
    return sent


def approval_part(approval_id: str, approved: bool, **extra: Any) -> dict[str, Any]:
    return {
        "type": "tool-delete_file",
        "toolCallId": "D",
        "state": "approval-responded",
        "input": {"path": "/x"},
        "approval": {"id": approval_id, "approved": approved, **extra},
    }


def request_of(chunks: list[Any]) -> dict[str, Any]:
    """The stream's ``tool-approval-request`` chunk."""
    return next(c for c in chunks if c != "[DONE]" and c["type"] == "tool-approval-request")


async def post(client: httpx.AsyncClient, sent: dict[str, Any]) -> list[Any]:
    return events((await client.post("/api/chat", json=sent)).content)


DELETE = [*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")]


async def test_the_stream_asks_and_the_continuation_post_approves_in_the_same_message(tmp_path):
    ran.clear()
    async with web_server(agent(DELETE), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = request_of(first)
            assert asked["toolCallId"] == "D"
            assert first[-2]["type"] == "finish" and first[-2]["finishReason"] == "tool-calls"
            message_id = first[0]["messageId"]
            r = await client.post(
                "/api/chat", json=answer("s", message_id, approval_part(asked["approvalId"], True))
            )
            assert r.status_code == 200
            second = events(r.content)
    assert ran == ["/x"]
    types = [c["type"] for c in second[:-1]]
    assert second[0] == {"type": "start", "messageId": message_id}
    assert types[1] == "tool-output-available" and second[1]["output"] == "deleted /x"
    assert "tool-input-available" not in types and "tool-input-start" not in types
    assert types[-1] == "finish" and second[-2]["finishReason"] == "stop"


async def test_a_denial_over_http_streams_tool_output_denied():
    ran.clear()
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = request_of(first)
            part = approval_part(asked["approvalId"], False, reason="no")
            second = events(
                (
                    await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
                ).content
            )
    assert ran == []
    assert second[1] == {"type": "tool-output-denied", "toolCallId": "D"}


async def test_a_client_tool_output_posted_back_continues_the_turn():
    step = [*tool_call("pick_color", {}, tool_call_id="C")]
    async with web_server(agent(step)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            assert not any(c != "[DONE]" and c["type"] == "tool-approval-request" for c in first)
            part = {
                "type": "tool-pick_color",
                "toolCallId": "C",
                "state": "output-available",
                "input": {},
                "output": "red",
            }
            second = events(
                (
                    await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
                ).content
            )
    assert second[1] == {"type": "tool-output-available", "toolCallId": "C", "output": "red"}


async def test_unknown_decided_and_foreign_approval_ids_get_4xx_and_change_nothing():
    async with web_server(agent(DELETE)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            other = events((await client.post("/api/chat", json=body("other"))).content)
            mine = request_of(first)
            theirs = next(
                c for c in other if c != "[DONE]" and c["type"] == "tool-approval-request"
            )
            mid = first[0]["messageId"]
            before = await server.host.store.load("s")
            unknown = await client.post(
                "/api/chat", json=answer("s", mid, approval_part("approval_nope", True))
            )
            foreign = await client.post(
                "/api/chat", json=answer("s", mid, approval_part(theirs["approvalId"], True))
            )
            assert (unknown.status_code, foreign.status_code) == (404, 404)
            assert "approval_nope" in unknown.json()["error"]
            assert (await server.host.store.load("s")).version == before.version
            ok = await client.post(
                "/api/chat", json=answer("s", mid, approval_part(mine["approvalId"], False))
            )
            again = await client.post(
                "/api/chat", json=answer("s", mid, approval_part(mine["approvalId"], True))
            )
    assert ok.status_code == 200 and again.status_code == 409


async def test_a_continuation_is_refused_where_answers_are_not_taken():
    import orjson
    from starlette.requests import Request

    from runtime.app.web.chat_input import read_chat_request
    from runtime.app.web.http import ApiError
    from runtime.media import InputLimits

    sent = orjson.dumps(answer("s", "m", approval_part("a", True)))

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": sent, "more_body": False}

    class App:
        class state:
            axon = type(
                "S",
                (),
                {
                    "max_body": 1 << 20,
                    "body_timeout": None,
                    "body_budget": None,
                    "host": type("H", (), {"input_limits": InputLimits()})(),
                },
            )()

    request = Request({"type": "http", "method": "POST", "headers": [], "app": App}, receive)
    try:
        await read_chat_request(request)
    except ApiError as exc:
        assert exc.status == 400 and "not supported here" in exc.message
    else:
        raise AssertionError("a continuation body was read as a new turn")


async def test_an_answer_that_leaves_calls_waiting_is_recorded_and_resumes_nothing():
    ran.clear()
    two = [*DELETE, *tool_call("delete_file", {"path": "/y"}, tool_call_id="E")]
    async with web_server(agent(two)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            approval_id = request_of(first)["approvalId"]
            r = await client.post(
                "/api/chat",
                json=answer("s", first[0]["messageId"], approval_part(approval_id, True)),
            )
    assert (r.status_code, r.json()) == (202, {"recorded": True, "waiting": 1})
    assert ran == []


async def test_a_body_repeating_a_recorded_answer_with_the_last_one_resumes_the_turn():
    ran.clear()
    two = [*DELETE, *tool_call("delete_file", {"path": "/y"}, tool_call_id="E")]
    async with web_server(agent(two)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            d, e = (c["approvalId"] for c in first if c != "[DONE]" and "approvalId" in c)
            mid = first[0]["messageId"]
            await client.post("/api/chat", json=answer("s", mid, approval_part(d, True)))
            both = answer("s", mid, approval_part(d, True))  # the page sends what it holds
            both["messages"][-1]["parts"].append(
                {**approval_part(e, False), "toolCallId": "E", "input": {"path": "/y"}}
            )
            r = await client.post("/api/chat", json=both)
    assert r.status_code == 200
    assert {"type": "tool-output-denied", "toolCallId": "E"} in events(r.content)
    assert ran == ["/x"]


# -- a real `serve` process, stopped and started again between the request and the answer


@tool(needs_approval=True)
async def write_mark(path: str) -> str:
    """Append a mark to a file."""
    with open(path, "a") as f:  # noqa: ASYNC230 - a tiny local write
        f.write("x")
    return "marked"


served = Agent(
    provider=ScriptedProvider(
        [
            [
                *tool_call(
                    "write_mark", {"path": os.environ.get("AXON_TEST_MARK", "")}, tool_call_id="M"
                )
            ],
            ["done"],
        ]
    ),
    tools=[write_mark],
)
"""What ``serve --agent tests.test_approval_web:served`` runs."""


ROOT = Path(__file__).resolve().parents[1]


@asynccontextmanager
async def serve(db: Path, mark: Path) -> AsyncIterator[str]:
    """``python -m runtime.app.web.serve`` on ``db``; its URL. SIGTERM on leaving (exit 0)."""
    proc = await trio.lowlevel.open_process(
        [
            *(sys.executable, "-m", "runtime.app.web.serve", "--port", "0", "--store", str(db)),
            *("--agent", "tests.test_approval_web:served"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "AXON_TEST_MARK": str(mark)},
        cwd=ROOT,
    )
    try:
        with trio.fail_after(30):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
            yield line.decode().split(" on ", 1)[1].split()[0].rstrip("/")
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_serve_stopped_between_request_and_approval_resumes_after_a_restart(tmp_path):
    db, mark = tmp_path / "serve.db", tmp_path / "mark"
    async with serve(db, mark) as url, httpx.AsyncClient(base_url=url) as client:
        first = await post(client, body("s"))
    assert request_of(first)["toolCallId"] == "M" and not mark.exists()
    async with serve(db, mark) as url, httpx.AsyncClient(base_url=url) as client:
        part = {
            **approval_part(request_of(first)["approvalId"], True),
            **{"type": "tool-write_mark", "toolCallId": "M", "input": {"path": str(mark)}},
        }
        second = await post(client, answer("s", first[0]["messageId"], part))
        stored = (await client.get("/api/sessions/s")).json()
    assert mark.read_text() == "x"  # ran once, in the second process
    assert second[0] == {"type": "start", "messageId": first[0]["messageId"]}
    assert second[1] == {"type": "tool-output-available", "toolCallId": "M", "output": "marked"}
    call = stored["messages"][1]["content"][0]
    assert call["awaiting"]["approved"] is True  # the request and the decision, stored
    assert stored["messages"][2]["output"] == "marked"  # and the result


async def test_answers_sent_again_resume_a_turn_decided_but_never_resumed(tmp_path):
    """The process that recorded the last decision stopped before the continuation stored
    anything (found by tests/test_embedded_chaos.py: ``serve`` SIGKILLed during the
    continuation POST): every call is decided, none has its result. The client sending
    its answers again (a reloaded ``useChat`` sends the same assistant message) gets the
    continuation, the tool run once; before, a 400 ("answers no call the turn waits
    for"), and the turn waited for good with nothing left to decide."""
    ran.clear()
    db = str(tmp_path / "w.db")
    async with web_server(agent(DELETE), store=db) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = events((await client.post("/api/chat", json=body("s"))).content)
            asked = request_of(first)
        # the decision recorded, as the stopped process's POST did, and nothing resumed
        await server.host.sessions["s"].decide(asked["approvalId"], approved=True)
    sent = answer("s", first[0]["messageId"], approval_part(asked["approvalId"], True))
    async with web_server(agent(DELETE), store=db) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=sent)
            assert r.status_code == 200, r.text
            again = await client.post("/api/chat", json=sent)  # resumed and over: refused
    second = events(r.content)
    assert ran == ["/x"]
    assert second[0] == {"type": "start", "messageId": first[0]["messageId"]}
    assert second[1] == {"type": "tool-output-available", "toolCallId": "D", "output": "deleted /x"}
    assert second[-2]["type"] == "finish" and second[-2]["finishReason"] == "stop"
    assert again.status_code == 409  # decided already
