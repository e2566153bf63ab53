"""The web app over real HTTP: Hypercorn's Trio worker on a loopback port, in the test's loop."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import Agent, Hooks, ProviderError, ReasoningChunk, RetryPolicy, tool
from runtime.messages import AssistantMessage, ToolMessage, UserMessage
from tests.web.harness import wait_idle, web_server


@tool
async def lookup(key: str) -> str:
    """Look a key up."""
    return f"value of {key}"


TWO_TOOLS = [
    [
        ReasoningChunk(text="I need a and b."),
        "Looking up a. ",
        *tool_call("lookup", {"key": "a"}, tool_call_id="A"),
    ],
    ["Now b. ", *tool_call("lookup", {"key": "b"}, tool_call_id="B")],
    ["Both found."],
]


JSON = {"content-type": "application/json"}
_message_ids = itertools.count()


def body(
    session_id: Any, text: str = "go", trigger: str = "submit-message", message_id: str = ""
) -> dict[str, Any]:
    """A `useChat` request body (DefaultChatTransport's shape); its last user message has
    id ``message_id``, else a new one (a client's new message)."""
    return {
        "id": session_id,
        "messages": [
            {"id": "m0", "role": "user", "parts": [{"type": "text", "text": "earlier"}]},
            {"id": "m1", "role": "assistant", "parts": [{"type": "text", "text": "ok"}]},
            {
                "id": message_id or f"u{next(_message_ids)}",
                "role": "user",
                "parts": [{"type": "text", "text": text}],
            },
        ],
        "trigger": trigger,
        "messageId": None,
    }


def events(raw: bytes) -> list[Any]:
    """The SSE events of a body: parsed JSON, or the string ``"[DONE]"``."""
    text = raw.decode()
    assert text.endswith("\n\n")
    out: list[Any] = []
    for event in text[:-2].split("\n\n"):
        if event.startswith(":"):  # a comment (keep-alive)
            continue
        assert event.startswith("data: ") and "\n" not in event, event
        data = event[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def recording_agent(provider: Any, finished: list[Any] | None = None, **kw: Any) -> Agent:
    async def on_turn_finish(event: Any) -> None:
        if finished is not None:
            finished.append(event)

    return Agent(
        provider=provider, tools=[lookup], hooks=Hooks(on_turn_finish=on_turn_finish), **kw
    )


async def test_chat_streams_the_turn_as_an_ai_sdk_ui_message_stream():
    agent = Agent(name="tester", provider=ScriptedProvider(TWO_TOOLS), tools=[lookup])
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/api/chat", json=body("s1", "Find a and b"))
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-vercel-ai-ui-message-stream"] == "v1"
        assert r.headers["cache-control"] == "no-cache"
        assert "access-control-allow-origin" not in r.headers
        chunks = events(r.content)
        assert chunks[-1] == "[DONE]" and chunks.count("[DONE]") == 1
        types = [c["type"] for c in chunks[:-1]]
        assert types[:3] == ["start", "start-step", "reasoning-start"]
        assert types[-2:] == ["finish-step", "finish"]
        assert types.count("start-step") == 3
        assert chunks[-2]["finishReason"] == "stop"
        assert chunks[-2]["messageMetadata"]["usage"]["total_tokens"] > 0
        outputs = [(c["toolCallId"], c["output"]) for c in chunks[:-1] if "output" in c]
        assert outputs == [("A", "value of a"), ("B", "value of b")]
        text = "".join(c["delta"] for c in chunks[:-1] if c["type"] == "text-delta")
        assert text == "Looking up a. Now b. Both found."
        reasoning = "".join(c["delta"] for c in chunks[:-1] if c["type"] == "reasoning-delta")
        assert reasoning == "I need a and b."

        # the session is in the store: listed with its title, messages with their parts
        listed = (await client.get("/api/sessions")).json()["sessions"]
        assert [(s["session_id"], s["title"], s["message_count"]) for s in listed] == [
            ("s1", "Find a and b", 4)
        ]
        stored = (await client.get("/api/sessions/s1")).json()
        assert [m["role"] for m in stored["messages"]] == ["user", "assistant", "tool", "tool"]
        assert stored["messages"][0]["content"] == "Find a and b"
        parts = stored["messages"][1]["content"]
        assert [(p["type"], p["step"]) for p in parts] == [
            ("reasoning", 0),
            ("text", 0),
            ("tool-call", 0),
            ("text", 1),
            ("tool-call", 1),
            ("text", 2),
        ]
        assert stored["messages"][1]["id"] == chunks[0]["messageId"]
        ui = stored["ui_messages"]
        assert [m["role"] for m in ui] == ["user", "assistant"]
        assert [p["type"] for p in ui[1]["parts"]] == [
            "step-start",
            "reasoning",
            "text",
            "tool-lookup",
            "step-start",
            "text",
            "tool-lookup",
            "step-start",
            "text",
        ]
        info = (await client.get("/api/info")).json()
        assert info == {
            "agent": "tester",
            "provider": "scripted",
            "model": "scripted",
            "tools": ["lookup"],
        }


async def test_each_request_adds_a_turn_and_regenerate_replaces_the_last_one():
    provider = ScriptedProvider(steps=[["Answer."]])
    agent = Agent(provider=provider)
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        for text in ("one", "two"):
            r = await client.post("/api/chat", json=body("s", text))
            assert events(r.content)[-1] == "[DONE]"
        record = await server.host.store.load("s")
        assert [m.content for m in record.messages if isinstance(m, UserMessage)] == ["one", "two"]
        # only the last user message of the body is read: the server keeps the history
        assert [m.content for m in provider.requests[-1].messages if m.role == "user"] == [
            "one",
            "two",
        ]
        r = await client.post("/api/chat", json=body("s", "two, again", "regenerate-message"))
        assert events(r.content)[-1] == "[DONE]"
        record = await server.host.store.load("s")
        assert [m.role for m in record.messages] == ["user", "assistant"] * 2
        assert [m.content for m in record.messages if isinstance(m, UserMessage)] == [
            "one",
            "two, again",
        ]
        assert (await client.get("/api/sessions")).json()["sessions"][0]["title"] == "one"


async def _user_texts(server: Any, session_id: str) -> list[Any]:
    record = await server.host.store.load(session_id)
    return [(m.id, m.content) for m in record.messages if isinstance(m, UserMessage)]


async def test_an_edit_of_the_last_message_replaces_its_turn():
    provider = ScriptedProvider(steps=[["Answer."]])
    async with web_server(Agent(provider=provider)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.post("/api/chat", json=body("s", "one", message_id="q1"))
            r = await client.post("/api/chat", json=body("s", "one, edited", message_id="q1"))
            assert events(r.content)[-1] == "[DONE]"
        record = await server.host.store.load("s")
        assert [m.role for m in record.messages] == ["user", "assistant"]
        assert await _user_texts(server, "s") == [("q1", "one, edited")]
        assert len(provider.requests) == 2


async def test_a_retry_of_the_last_message_replays_its_answer_and_runs_no_turn():
    provider = ScriptedProvider(steps=[["Answer."]])
    async with web_server(Agent(provider=provider)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await client.post("/api/chat", json=body("s", "one", message_id="q1"))
            again = await client.post("/api/chat", json=body("s", "one", message_id="q1"))
        assert again.status_code == 200
        text = "".join(c["delta"] for c in events(again.content)[:-1] if "delta" in c)
        assert text == "Answer."
        assert events(again.content)[0]["messageId"] == events(first.content)[0]["messageId"]
        assert len(provider.requests) == 1
        assert await _user_texts(server, "s") == [("q1", "one")]


async def test_an_edit_of_an_earlier_message_is_refused_and_stores_nothing():
    provider = ScriptedProvider(steps=[["Answer."]])
    async with web_server(Agent(provider=provider)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.post("/api/chat", json=body("s", "one", message_id="q1"))
            await client.post("/api/chat", json=body("s", "two", message_id="q2"))
            r = await client.post("/api/chat", json=body("s", "one, edited", message_id="q1"))
        assert r.status_code == 409
        assert "only the last message can be edited" in r.json()["error"]
        assert await _user_texts(server, "s") == [("q1", "one"), ("q2", "two")]
        assert len(provider.requests) == 2


async def test_a_regenerate_of_an_earlier_message_is_refused():
    provider = ScriptedProvider(steps=[["Answer."]])
    async with web_server(Agent(provider=provider)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.post("/api/chat", json=body("s", "one", message_id="q1"))
            await client.post("/api/chat", json=body("s", "two", message_id="q2"))
            again = body("s", "one", "regenerate-message", message_id="q1")
            assert (await client.post("/api/chat", json=again)).status_code == 409
        assert await _user_texts(server, "s") == [("q1", "one"), ("q2", "two")]


async def test_a_new_message_id_is_a_new_turn():
    provider = ScriptedProvider(steps=[["Answer."]])
    async with web_server(Agent(provider=provider)) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.post("/api/chat", json=body("s", "same", message_id="q1"))
            await client.post("/api/chat", json=body("s", "same", message_id="q2"))
        assert await _user_texts(server, "s") == [("q1", "same"), ("q2", "same")]


async def test_sessions_are_loaded_from_and_saved_to_the_store(tmp_path):
    db = str(tmp_path / "web.db")
    provider = ScriptedProvider(steps=[["Hello."]])
    async with web_server(Agent(provider=provider), store=db) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await client.post("/api/chat", json=body("kept", "first"))
    provider2 = ScriptedProvider(steps=[["Again."]])
    async with web_server(Agent(provider=provider2), store=db) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            listed = (await client.get("/api/sessions")).json()["sessions"]
            assert [s["session_id"] for s in listed] == ["kept"]
            await client.post("/api/chat", json=body("kept", "second"))
            stored = (await client.get("/api/sessions/kept")).json()
    # the resumed session's history went to the model
    sent = provider2.requests[0].messages
    assert [m.content for m in sent if m.role == "user"] == ["first", "second"]
    assert sent[1].text == "Hello."
    assert [m["role"] for m in stored["messages"]] == ["user", "assistant"] * 2


async def test_bad_requests_are_rejected_with_a_reason():
    agent = Agent(provider=ScriptedProvider(steps=[["x"]]))
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        cases = [
            (body("bad id!"), 400, "invalid session id"),
            (body("x" * 129), 400, "invalid session id"),
            (body(42), 400, "invalid session id"),
            ({"messages": body("s")["messages"]}, 400, "'id'"),
            ({"id": "s", "messages": []}, 400, "no user message"),
            ({"id": "s", "messages": "hi"}, 400, "must be a list"),
            (body("s", "   "), 400, "no text"),
            (body("s", "hi", "resume-stream"), 400, "unknown trigger"),
            ([1, 2], 400, "JSON object"),
        ]
        for payload, status, reason in cases:
            r = await client.post("/api/chat", json=payload)
            assert r.status_code == status, payload
            assert reason in r.json()["error"], (payload, r.json())
        r = await client.post("/api/chat", content=b"{not json", headers=JSON)
        assert r.status_code == 400 and "not JSON" in r.json()["error"]
        r = await client.get("/api/sessions/bad%20id")
        assert r.status_code == 400
        r = await client.get("/api/sessions/never-saved")
        assert r.status_code == 404
        r = await client.get("/api/chat")
        assert r.status_code == 405
        # pre-parts message shape (`content`) still works
        r = await client.post(
            "/api/chat", json={"id": "old", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert events(r.content)[-1] == "[DONE]"
        assert server.host.sessions["old"].messages[0].content == "hi"
        assert not server.host.sessions.get("s")  # nothing opened for the bad requests


async def test_request_bodies_over_the_limit_get_413():
    agent = Agent(provider=ScriptedProvider(steps=[["x"]]))
    async with web_server(agent, max_body=2000) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("s", "y" * 3000))
            assert r.status_code == 413
            assert "larger than 2000 bytes" in r.json()["error"]

            async def chunked():  # no content-length: counted while reading
                for _ in range(5):
                    yield b"x" * 1000

            r = await client.post("/api/chat", content=chunked(), headers=JSON)
            assert r.status_code == 413
            r = await client.post("/api/chat", json=body("s", "y" * 1000))
            assert r.status_code == 200
            assert "s" in server.host.sessions


async def test_bearer_token_guards_the_api_but_not_the_page():
    agent = Agent(provider=ScriptedProvider(steps=[["x"]]))
    async with web_server(agent, token="s3cret") as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            for method, path in [
                ("POST", "/api/chat"),
                ("GET", "/api/sessions"),
                ("GET", "/api/sessions/s"),
                ("GET", "/api/info"),
            ]:
                r = await client.request(method, path, json=body("s"))
                assert r.status_code == 401, path
                assert r.headers["www-authenticate"] == "Bearer"
                r = await client.request(
                    method, path, json=body("s"), headers={"authorization": "Bearer nope"}
                )
                assert r.status_code == 401, path
            assert not server.host.sessions
            page = await client.get("/")
            assert page.status_code == 200 and "<title>Axon</title>" in page.text
            ok = {"authorization": "Bearer s3cret"}
            r = await client.post("/api/chat", json=body("s"), headers=ok)
            assert r.status_code == 200 and events(r.content)[-1] == "[DONE]"
            r = await client.get("/api/sessions", headers={"authorization": "bearer s3cret"})
            assert r.status_code == 200


async def test_no_cors_unless_origins_are_given():
    agent = Agent(provider=ScriptedProvider(steps=[["x"]]))
    preflight = {
        "origin": "http://app.example",
        "access-control-request-method": "POST",
        "access-control-request-headers": "content-type,authorization",
    }
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        r = await client.options("/api/chat", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
        r = await client.get("/api/sessions", headers={"origin": "http://app.example"})
        assert "access-control-allow-origin" not in r.headers
    async with web_server(agent, cors_origins=["http://app.example"], token="t") as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.options("/api/chat", headers=preflight)
            assert r.status_code == 200
            assert r.headers["access-control-allow-origin"] == "http://app.example"
            assert "authorization" in r.headers["access-control-allow-headers"].lower()
            r = await client.post(
                "/api/chat",
                json=body("c"),
                headers={"origin": "http://app.example", "authorization": "Bearer t"},
            )
            assert r.headers["access-control-allow-origin"] == "http://app.example"
            exposed = r.headers["access-control-expose-headers"].lower()
            assert "x-vercel-ai-ui-message-stream" in exposed
            r = await client.options("/api/chat", headers={**preflight, "origin": "http://evil"})
            assert r.status_code == 400
            assert "access-control-allow-origin" not in r.headers


SLOW = [
    [
        ReasoningChunk(text="Thinking."),
        "Once",
        Sleep(0.05),
        " upon",
        Sleep(30),
        " a time.",
    ]
]


async def test_client_disconnect_cancels_the_turn_and_it_is_saved_interrupted():
    finished: list[Any] = []
    agent = recording_agent(ScriptedProvider(turns=[SLOW, [["Fine."]]]), finished)
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        seen: list[str] = []
        with trio.fail_after(10):
            async with client.stream("POST", "/api/chat", json=body("cut", "tell me")) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if chunk["type"] == "text-delta":
                            seen.append(chunk["delta"])
                            if "".join(seen) == "Once upon":
                                break
            await wait_idle(server, "cut")
        assert [(e.finish_reason, e.abort_reason) for e in finished] == [
            ("aborted", "client disconnected")
        ]
        record = await server.host.store.load("cut")
        assistant = record.messages[1]
        assert isinstance(assistant, AssistantMessage) and assistant.interrupted
        assert assistant.text == "Once upon"
        stored = (await client.get("/api/sessions/cut")).json()
        assert stored["ui_messages"][1]["metadata"]["interrupted"] is True
        # the session takes the next turn
        r = await client.post("/api/chat", json=body("cut", "again"))
        assert r.status_code == 200 and events(r.content)[-2]["finishReason"] == "stop"


async def test_a_second_turn_while_one_runs_gets_409():
    agent = Agent(provider=ScriptedProvider(SLOW))
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        async with client.stream("POST", "/api/chat", json=body("busy")) as r:
            lines = r.aiter_lines()  # kept: dropping the iterator would close the response
            assert (await anext(lines)).startswith("data: {")
            r2 = await client.post("/api/chat", json=body("busy", "me too"))
            assert r2.status_code == 409
            assert "already running" in r2.json()["error"]
            listed = (await client.get("/api/sessions")).json()["sessions"]
            assert [(s["session_id"], s["busy"]) for s in listed] == [("busy", True)]
            await lines.aclose()


async def test_a_failed_turn_streams_an_error_chunk_then_done():
    agent = Agent(
        provider=ScriptedProvider([["Partial ", ProviderError("upstream exploded")]]),
        retry=RetryPolicy(max_attempts=1),
    )
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        r = await client.post("/api/chat", json=body("err"))
        chunks = events(r.content)
        assert chunks[-1] == "[DONE]"
        error = chunks[-2]
        assert error["type"] == "error"
        assert "upstream exploded" in error["errorText"]
        # parts were closed before the error
        types = [c["type"] for c in chunks[:-1]]
        assert types.index("text-end") < types.index("error")


async def test_tool_errors_stream_as_tool_output_error():
    @tool
    async def broken(key: str) -> str:
        """Always fails."""
        raise RuntimeError("disk on fire")

    script = [[*tool_call("broken", {"key": "k"}, tool_call_id="X")], ["Sorry."]]
    agent = Agent(provider=ScriptedProvider(script), tools=[broken])
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        chunks = events((await client.post("/api/chat", json=body("te"))).content)
        (err,) = [c for c in chunks[:-1] if c["type"] == "tool-output-error"]
        assert err["toolCallId"] == "X" and "disk on fire" in err["errorText"]
        ui = (await client.get("/api/sessions/te")).json()["ui_messages"]
        tool_part = next(p for p in ui[1]["parts"] if p["type"] == "tool-broken")
        assert tool_part["state"] == "output-error"


async def test_quiet_streams_send_keep_alive_comments():
    agent = Agent(provider=ScriptedProvider([["a", Sleep(0.3), "b"]]))
    async with web_server(agent, keepalive=0.05) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post("/api/chat", json=body("ka"))
    assert b"\n\n: keep-alive\n\n" in r.content
    assert events(r.content)[-1] == "[DONE]"


async def test_a_factory_gives_each_new_session_its_agent():
    made: list[str] = []

    def factory(session_id: str) -> Agent:
        made.append(session_id)
        return Agent(name=f"agent-{session_id}", provider=ScriptedProvider(steps=[["hi"]]))

    async with web_server(factory) as server, httpx.AsyncClient(base_url=server.url) as client:
        for sid in ("a", "b", "a"):
            r = await client.post("/api/chat", json=body(sid))
            assert events(r.content)[-1] == "[DONE]"
        assert made == ["a", "b"]
        assert server.host.sessions["b"].agent.name == "agent-b"
        assert (await client.get("/api/info")).json()["agent"] is None


async def test_info_names_no_provider_or_model_for_an_agent_function():
    """``serve --agent module:function``: the page named every session's agent
    "scripted · offline", whatever provider the function's agents call."""

    def factory(session_id: str) -> Agent:
        return Agent(name="real", model="openai:gpt-4o-mini")

    async with web_server(factory) as server, httpx.AsyncClient(base_url=server.url) as client:
        info = (await client.get("/api/info")).json()
    assert info == {"agent": None, "provider": None, "model": None, "tools": None}


async def test_info_names_the_provider_and_model_of_a_model_string():
    agent = Agent(name="g", model="google:gemini-2.5-flash")
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        info = (await client.get("/api/info")).json()
    assert (info["provider"], info["model"]) == ("google", "gemini-2.5-flash")


async def test_the_page_is_served_with_a_strict_policy():
    agent = Agent(provider=ScriptedProvider(steps=[["x"]]))
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        r = await client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "connect-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    for marker in ("/api/chat", "AbortController", "getReader", "/api/sessions"):
        assert marker in r.text


def test_serve_parser_defaults_are_safe():
    import argparse

    from runtime.app.web.serve import add_serve_parser

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve"])
    assert (args.host, args.port, args.provider, args.token, args.cors_origin) == (
        "127.0.0.1",
        8000,
        "scripted",
        None,
        [],
    )
    assert args.max_body == 48 << 20 and args.store is None
    args = parser.parse_args(
        ["serve", "--cors-origin", "http://a", "--cors-origin", "http://b", "--token", "t"]
    )
    assert args.cors_origin == ["http://a", "http://b"] and args.token == "t"


async def test_serve_command_runs_and_stops_on_sigint(tmp_path):
    db = tmp_path / "serve.db"
    proc = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "runtime.app.web.serve",
            "--port",
            "0",
            "--delay",
            "0",
            "--store",
            str(db),
            "--token",
            "tok",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        with trio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                line += await proc.stdout.receive_some(1)
            url = line.decode().split(" on ", 1)[1].split("/#", 1)[0]
            assert line.decode().startswith("Axon web UI on http://127.0.0.1:")
            assert "#token=tok" in line.decode()
            async with httpx.AsyncClient(base_url=url) as client:
                assert (await client.get("/api/sessions")).status_code == 401
                auth = {"authorization": "Bearer tok"}
                r = await client.post(
                    "/api/chat", json=body("cli", "Weather in Oslo?"), headers=auth
                )
                chunks = events(r.content)
                assert chunks[-1] == "[DONE]"
                outputs = [c["output"] for c in chunks[:-1] if c["type"] == "tool-output-available"]
                assert outputs[0]["city"] == "Oslo"
            proc.send_signal(signal.SIGINT)
            assert await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    import sqlite3

    with sqlite3.connect(db) as conn:
        rows = conn.execute("select session_id from sessions").fetchall()
    assert rows == [("cli",)]


async def test_concurrent_sessions_stream_independently():
    n = 3
    agent = Agent(provider=ScriptedProvider(TWO_TOOLS), tools=[lookup])
    async with web_server(agent) as server, httpx.AsyncClient(base_url=server.url) as client:
        results: dict[str, list[Any]] = {}

        async def one(sid: str) -> None:
            r = await client.post("/api/chat", json=body(sid))
            results[sid] = events(r.content)

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, f"c{i}")
        for chunks in results.values():
            assert chunks[-1] == "[DONE]" and chunks[-2]["type"] == "finish"
        records = [await server.host.store.load(f"c{i}") for i in range(n)]
        assert all(isinstance(r.messages[-1], ToolMessage) for r in records)


async def test_an_agent_used_as_a_tool_streams_preliminary_outputs():
    child = Agent(name="helper", provider=ScriptedProvider([["The child agent answers."]]))
    parent = Agent(
        name="parent",
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "sub task"}, tool_call_id="H")], ["Done."]]
        ),
        tools=[child.as_tool()],
    )
    async with web_server(parent) as server, httpx.AsyncClient(base_url=server.url) as client:
        chunks = events((await client.post("/api/chat", json=body("parent"))).content)
        outputs = [c for c in chunks[:-1] if c["type"] == "tool-output-available"]
        assert outputs[-1] == {
            "type": "tool-output-available",
            "toolCallId": "H",
            "output": "The child agent answers.",
        }
        preliminary = [c["output"] for c in outputs[:-1]]
        assert all(c["preliminary"] is True for c in outputs[:-1])
        assert preliminary[-1] == "The child agent answers." and len(preliminary) > 1
        assert all(b.startswith(a) for a, b in itertools.pairwise(preliminary))
        listed = (await client.get("/api/sessions")).json()["sessions"]
        sub = [s for s in listed if s["meta"].get("parent_session_id") == "parent"]
        assert len(sub) == 1  # listed, with its parent in meta (the page nests it away)


def test_python_m_runtime_serve_is_wired_into_the_cli():
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0 and "invalid choice" in proc.stderr:
        pytest.skip("runtime.app.cli does not register `serve` yet (add_serve_parser)")
    assert proc.returncode == 0, proc.stderr
    for option in ("--host", "--port", "--provider", "--store", "--token", "--cors-origin"):
        assert option in proc.stdout
