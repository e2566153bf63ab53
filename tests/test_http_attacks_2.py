"""The served app attacked again (round 2, docs/web.md#attacked-round-2): what was found
and fixed, each pinned over real HTTP (Hypercorn on a loopback port, httpx and raw
sockets) where a browser or a careless client could reach it."""

from __future__ import annotations

import json
import threading
from functools import partial
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent, AssistantMessage, Hooks, UserMessage, history
from runtime.actor_messages import Batcher
from runtime.app.web import agui, openai_compat
from runtime.app.web.app import create_app
from runtime.app.web.guard import HostPolicy, cors_origin
from runtime.app.web.serve import add_serve_arguments
from tests.test_mcp_server import ACCEPT, INIT
from tests.test_web_http import body, events
from tests.test_web_slow_clients import DELTAS, Flood, chat_request, connect, read_to_end
from tests.web.harness import WebServer, wait_idle, web_server

ALL = ("ai-sdk", "ag-ui", "a2a", "openai", "mcp")


def agent(*steps: Any) -> Agent:
    return Agent(provider=ScriptedProvider(list(steps) or [["ok"]]))


async def raw_request(server: WebServer, request: bytes) -> bytes:
    """``request`` sent as it is over a socket; everything the server answers."""
    with trio.fail_after(20):
        sock = await connect(server)
        with sock:
            await sock.send(request)
            return await read_to_end(sock)


def head_of(response: bytes) -> bytes:
    return response.partition(b"\r\n\r\n")[0]


# -- headers whose digits int() cannot read ------------------------------------------------

# str.isdigit() is true for the superscripts latin-1 carries (0xB2, 0xB3, 0xB9), which a
# header value may hold, and int() refuses them: the checks raised, and the client got a
# 500 (and the log a traceback) instead of the refusal.


async def test_a_host_with_a_superscript_port_is_refused_not_a_server_error():
    async with web_server(agent()) as server:
        response = await raw_request(
            server, b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1:\xb2\r\nConnection: close\r\n\r\n"
        )
    assert head_of(response).startswith(b"HTTP/1.1 403")
    assert b"DNS rebinding" in response


@pytest.mark.parametrize(
    "request_line",
    [
        b"GET /api/chat/s/stream HTTP/1.1\r\nLast-Event-ID: \xb2\r\n",
        b"GET /api/chat/s/stream?after_seq=%C2%B2 HTTP/1.1\r\n",
    ],
    ids=["last-event-id", "after_seq"],
)
async def test_a_resume_cursor_of_superscript_digits_is_a_400_not_a_server_error(request_line):
    async with web_server(agent()) as server:
        response = await raw_request(
            server, request_line + b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
    assert head_of(response).startswith(b"HTTP/1.1 400")
    assert b"non-negative integer" in response


# -- DNS rebinding: a bracketed literal with something after it ----------------------------


@pytest.mark.parametrize("host", ["[::1].attacker.example", "[::1]attacker.example", "[::1"])
def test_a_bracketed_loopback_address_with_a_suffix_is_not_loopback(host):
    assert not HostPolicy().allows(host)
    assert not HostPolicy().allows(host + ":8000")
    assert HostPolicy().allows("[::1]:8000") and HostPolicy().allows("[::1]")


async def test_a_host_naming_a_loopback_literal_inside_another_name_is_refused():
    async with web_server(agent()) as server, httpx.AsyncClient(base_url=server.url) as client:
        r = await client.get("/api/sessions", headers={"host": "[::1].attacker.example"})
    assert r.status_code == 403


# -- CORS: a careless --cors-origin ---------------------------------------------------------


async def test_a_star_cors_origin_is_refused_before_any_page_can_read_the_sessions():
    async with web_server(agent()) as server:
        with pytest.raises(ValueError, match="every web page"):
            create_app(server.host, agent(), cors_origins=["*"])
        with pytest.raises(ValueError, match="not an origin"):
            create_app(server.host, agent(), cors_origins=["null"])
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cors-origin", "*"])


async def test_a_cors_origin_given_with_a_slash_and_capitals_matches_the_browsers_origin():
    assert cors_origin("HTTP://App.example:3000/") == "http://app.example:3000"
    async with web_server(agent(), cors_origins=["HTTP://App.example/"]) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            preflight = await client.options(
                "/api/chat",
                headers={
                    "origin": "http://app.example",
                    "access-control-request-method": "POST",
                    "access-control-request-headers": "content-type",
                },
            )
            sessions = await client.get("/api/sessions", headers={"origin": "http://app.example"})
            other = await client.get("/api/sessions", headers={"origin": "http://evil.example"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://app.example"
    assert sessions.headers["access-control-allow-origin"] == "http://app.example"
    assert "access-control-allow-origin" not in other.headers


# -- an MCP client that never reads its call's progress -----------------------------------


async def mcp_call_request(server: WebServer, client: httpx.AsyncClient) -> bytes:
    """A raw ``tools/call`` asking for progress notifications, on an initialized session."""
    opened = await client.post("/mcp", json=INIT)
    session = {"mcp-session-id": opened.headers["mcp-session-id"]}
    await client.post(
        "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session
    )
    call = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": "assistant",
            "arguments": {"prompt": "go", "session_id": "mcp-stuck"},
            "_meta": {"progressToken": "p"},
        },
    }
    payload = json.dumps(call).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nhost: {server.url.removeprefix('http://')}\r\n"
        f"content-type: application/json\r\naccept: application/json, text/event-stream\r\n"
        f"mcp-session-id: {session['mcp-session-id']}\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def test_an_mcp_client_that_reads_no_progress_does_not_hold_its_turn(monkeypatch):
    # Before: the unsent notification stopped the turn (backpressure) and send_timeout did
    # not apply, so the turn, its session and the model's stream were held for good.
    monkeypatch.setattr(Batcher, "max_items", 1)
    flood = Flood()
    async with web_server(flood.agent, protocols=("ai-sdk", "mcp"), send_timeout=1) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT) as client:
            request = await mcp_call_request(server, client)
            sock = await connect(server, receive_buffer=4096)
            with sock, trio.fail_after(60):
                await sock.send(request)
                await flood.over.wait()  # the client reads nothing meanwhile
            record = await server.host.store.load("mcp-stuck")
    assert [(e.finish_reason, e.abort_reason) for e in flood.finished] == [("stop", None)]
    assert flood.pulled[0] == DELTAS
    saved = record.messages[-1]
    assert isinstance(saved, AssistantMessage) and not saved.interrupted
    assert len(saved.text.split()) == DELTAS


# -- a history of many messages is checked off the event loop -------------------------------


MANY = 20_000
"""Messages enough for a body over the inline size (256 KiB)."""


def long_agui_run() -> dict[str, object]:
    """An AG-UI run of a new thread: MANY earlier messages, alternating, then the user's."""
    earlier = [
        {"id": f"m{i}", "role": "user" if i % 2 == 0 else "assistant", "content": "x"}
        for i in range(MANY)
    ]
    last = {"id": "last", "role": "user", "content": "hi"}
    return {"threadId": "t", "runId": "r", "messages": [*earlier, last]}


async def post_long_chat() -> httpx.Response:
    """A Chat Completions request of MANY earlier messages, alternating, then the user's,
    to a fresh server: its answer (read whole)."""
    messages = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": "x"} for i in range(MANY)
    ]
    body = {"model": "assistant", "messages": [*messages, {"role": "user", "content": "hi"}]}
    async with web_server(agent(), protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            return await client.post("/v1/chat/completions", json=body)


"""Messages enough for a body over the inline size (256 KiB)."""


def threads_running(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[bool]:
    """Patch ``module.name`` to record whether each call ran off the main thread."""
    seen: list[bool] = []
    original = getattr(module, name)

    def spy(*args: Any) -> Any:
        seen.append(threading.current_thread() is not threading.main_thread())
        return original(*args)

    monkeypatch.setattr(module, name, spy)
    return seen


async def test_an_agui_body_of_many_messages_is_checked_and_converted_off_the_event_loop(
    monkeypatch,
):
    parsed = threads_running(monkeypatch, agui, "parse_run_input")
    converted = threads_running(monkeypatch, agui, "history_of")
    run = long_agui_run()
    async with web_server(agent(), protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            r = await client.post("/ag-ui", json=run)
            small = await client.post(
                "/ag-ui",
                json={
                    "threadId": "t2",
                    "runId": "r2",
                    "messages": [{"id": "u", "role": "user", "content": "hi"}],
                },
            )
        assert len((await server.host.store.load("t")).messages) == MANY + 2
    assert r.status_code == 200 and '"RUN_FINISHED"' in r.text
    assert small.status_code == 200
    assert parsed == [True, False] and converted == [True]


async def test_a_chat_completions_body_of_many_messages_is_checked_off_the_event_loop(
    monkeypatch,
):
    parsed = threads_running(monkeypatch, openai_compat, "parse_chat_request")
    r = await post_long_chat()
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    assert parsed == [True]


def walks(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[tuple[int, bool]]:
    """Patch ``module.name`` (a function of one sequence first) to record each call's
    length and whether it ran off the main thread."""
    seen: list[tuple[int, bool]] = []
    original = getattr(module, name)

    def spy(items: Any, *args: Any, **kwargs: Any) -> Any:
        off = threading.current_thread() is not threading.main_thread()
        seen.append((len(items), off))
        return original(items, *args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def long_walks(seen: list[tuple[int, bool]]) -> list[bool]:
    """Whether each walk of (most of) a history of the test's size ran off the main
    thread."""
    return [off for length, off in seen if length > MANY // 2]


async def test_a_new_agui_thread_of_many_messages_is_counted_typed_and_repaired_off_the_loop(
    monkeypatch,
):
    counted = walks(monkeypatch, agui, "_check_counts")
    typed = walks(monkeypatch, history, "check_history")
    repaired = walks(monkeypatch, history, "repair")
    run = long_agui_run()
    async with web_server(agent(), protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            r = await client.post("/ag-ui", json=run)
        assert len((await server.host.store.load("t")).messages) == MANY + 2
    assert r.status_code == 200 and '"RUN_FINISHED"' in r.text
    assert long_walks(counted) == [True]
    assert long_walks(typed) == [True]  # the host's check of the seed
    assert long_walks(repaired) == [True]  # the runner's first repair, as it opens


async def test_an_agui_thread_of_many_messages_posted_again_is_snapshotted_off_the_loop(
    monkeypatch,
):
    looked_up = walks(monkeypatch, agui, "_ids")
    snapshotted = walks(monkeypatch, agui, "agui_messages")
    run = long_agui_run()
    async with web_server(agent(), protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            first = await client.post("/ag-ui", json=run)
            again = await client.post("/ag-ui", json=run)  # nothing new: the snapshot
    assert first.status_code == 200 and again.status_code == 200
    assert '"MESSAGES_SNAPSHOT"' in again.text and '"TEXT_MESSAGE_START"' not in again.text
    assert long_walks(looked_up) == [True]  # the stored ids, on the second post
    assert long_walks(snapshotted) == [True]


async def test_a_chat_completions_history_of_many_messages_is_typed_and_repaired_off_the_loop(
    monkeypatch,
):
    typed = walks(monkeypatch, history, "check_history")
    repaired = walks(monkeypatch, history, "repair")
    r = await post_long_chat()
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    assert long_walks(typed) == [True, True]  # the endpoint's check, then the host's
    assert long_walks(repaired) == [True]


# -- secrets in a provider's error, on every protocol -------------------------------------

KEYS = (
    "sk-ant-api03-Zr7Kp2Lw9Qx4Vb8Nm1Tc6Yd3Fh5Gj0abcdefgh",
    "sk-proj-Q9zT4mLr8vXw2Yb7NcK1pD5eHj3s",
)


def failing() -> Agent:
    error = RuntimeError(f"401 invalid x-api-key: {KEYS[0]}; upstream said {KEYS[1]}")
    return Agent(provider=ScriptedProvider(responder=lambda request: [error]))


async def test_a_provider_error_quoting_keys_reaches_no_client_of_any_protocol_unredacted(capsys):
    async with web_server(failing(), protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            answers = [
                await client.post("/api/chat", json=body("s")),
                await client.get("/api/sessions/s"),
                await client.post(
                    "/ag-ui",
                    json={
                        "threadId": "t",
                        "runId": "r",
                        "messages": [{"id": "u", "role": "user", "content": "hi"}],
                    },
                ),
                await client.post(
                    "/v1/chat/completions",
                    json={"model": "assistant", "messages": [{"role": "user", "content": "hi"}]},
                ),
                await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "assistant",
                        "stream": True,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                ),
                await client.post(
                    "/a2a/message:send",
                    json={
                        "message": {
                            "messageId": "m1",
                            "role": "ROLE_USER",
                            "parts": [{"text": "hi"}],
                        }
                    },
                ),
            ]
    stream = events(answers[0].content)
    assert any(c != "[DONE]" and c["type"] == "error" for c in stream)
    for answer in answers:
        assert "[redacted]" in answer.text, answer.request.url
        assert not any(key in answer.text for key in KEYS), answer.request.url
    logged = capsys.readouterr()
    assert not any(key in logged.out + logged.err for key in KEYS)


# -- JSON values of the wrong type where a name is looked up in a set -----------------------

# ``{} in frozenset(...)`` raises TypeError (a dict is unhashable): a role, part type or
# resume status sent as an object was a 500 and a traceback in the log, not a 400.

CHAT = {"model": "assistant", "messages": [{"role": "user", "content": "hi"}]}
RUN = {"threadId": "t", "runId": "r", "messages": [{"id": "u", "role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        ("/v1/chat/completions", {**CHAT, "messages": [{"role": {}, "content": "hi"}]}),
        (
            "/v1/chat/completions",
            {**CHAT, "messages": [{"role": "system", "content": [{"type": [], "text": "x"}]}]},
        ),
        ("/ag-ui", {**RUN, "messages": [{"id": "u", "role": {}, "content": "hi"}]}),
        ("/ag-ui", {**RUN, "resume": [{"interruptId": "i", "status": {}}]}),
    ],
    ids=["chat-role", "chat-part-type", "agui-role", "agui-resume-status"],
)
async def test_an_object_where_a_name_is_expected_is_a_400_not_a_server_error(path, sent):
    async with web_server(agent(), protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post(path, json=sent)
    assert r.status_code == 400, r.text


@pytest.mark.parametrize(
    ("path", "sent"),
    [
        (
            "/a2a/message:send",
            {
                "message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]},
                "configuration": {"historyLength": "\u00b2"},
            },
        ),
        (
            "/a2a/jsonrpc",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "GetTask",
                "params": {"id": "c:m", "historyLength": "\u00b2"},
            },
        ),
    ],
    ids=["rest", "jsonrpc"],
)
async def test_an_a2a_history_length_of_superscript_digits_is_invalid_params_not_a_500(path, sent):
    async with web_server(agent(), protocols=ALL) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            r = await client.post(path, json=sent)
    assert r.status_code in (200, 400), r.text  # JSON-RPC errors are HTTP 200
    assert "historyLength must be a non-negative integer" in r.text


# -- a refusal that leaves the body unread: drained and kept, or closed, and says so -----


async def test_a_refusal_before_a_small_body_is_read_keeps_the_connection_for_the_next_request():
    # Once: Connection: close and the connection closed (it was closed without saying
    # so before that). A small body is now read and dropped first (CloseUnread), and the
    # pooled connection serves the next request; a large one still closes, said so
    # (tests/test_web_pipelining.py).
    big = json.dumps({"id": "s", "pad": "a" * 5000}).encode()

    async def chunked() -> Any:
        for i in range(0, len(big), 500):
            yield big[i : i + 500]

    async with web_server(agent(), protocols=ALL, max_body=1000) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            answers = []
            for path in ("/api/chat", "/ag-ui", "/v1/chat/completions", "/a2a/message:send"):
                for content in (big, chunked()):
                    refused = await client.post(
                        path, content=content, headers={"content-type": "application/json"}
                    )
                    after = await client.get("/api/info")  # on the pooled connection
                    answers.append(
                        (refused.status_code, refused.headers.get("connection"), after.status_code)
                    )
            plain = await client.post(
                "/api/chat", content=big, headers={"content-type": "text/plain"}
            )
            ok = await client.post("/api/chat", json=body("s"))
    assert set(answers) == {(413, None, 200)}
    assert (plain.status_code, plain.headers.get("connection")) == (415, None)
    assert ok.status_code == 200 and "connection" not in ok.headers


# -- WebSocket handshakes ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/models", "/a2a/tasks/x", "/api/sessions"])
async def test_a_websocket_handshake_from_a_foreign_host_and_origin_is_refused_on_every_route(
    path,
):
    # The guard checked only HTTP scopes: a handshake reached the mounted apps past the
    # Host and Origin checks (/v1/ answered 404, /a2a/ 500).
    handshake = (
        f"GET {path} HTTP/1.1\r\nHost: attacker.example\r\nOrigin: http://attacker.example\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    async with web_server(agent(), protocols=ALL) as server:
        response = await raw_request(server, handshake.encode())
    assert head_of(response).startswith(b"HTTP/1.1 403")


# -- a client that leaves while its turn waits to start ------------------------------------


async def until(check: Any) -> None:
    """Wait (at most 10 s) until ``check()`` holds."""
    with trio.fail_after(10):
        while True:
            if check():
                return
            await trio.sleep(0.01)


@pytest.mark.parametrize("on_busy", ["enqueue", "steer"])
async def test_a_client_that_leaves_while_its_turn_waits_runs_no_turn(on_busy):
    # Before: the waiting turn stayed queued with no one to read it, then ran and cost its
    # tokens; a client posting and hanging up could queue any number of them.
    started: list[Any] = []

    async def on_turn_start(event: Any) -> None:
        started.append(event)

    def respond(request: Any) -> Any:
        return [Sleep(60), "first"] if not started[1:] else ["later"]

    agent = Agent(
        provider=ScriptedProvider(responder=respond),
        on_busy=on_busy,
        hooks=Hooks(on_turn_start=on_turn_start),
    )
    async with (
        web_server(agent) as server,
        httpx.AsyncClient(base_url=server.url, timeout=30) as client,
    ):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, "/api/chat", json=body("s", "first")))
            await until(lambda: "s" in server.host.sessions and server.host.sessions["s"].busy)
            session = server.host.sessions["s"]
            sock = await connect(server)
            with sock:
                await sock.send(chat_request(server, json.dumps(body("s", "left")).encode()))
                running = session.current
                await until(lambda: session.queued == 1 or running._steering.waiting)
            await until(lambda: session.queued == 0 and not running._steering.waiting)
            stopped = await client.post("/api/chat/s/stop", json={})
            assert stopped.status_code == 202
        await wait_idle(server, "s")
        record = await server.host.store.load("s")
    assert len(started) == 1
    assert [m.content for m in record.messages if isinstance(m, UserMessage)] == ["first"]


async def test_an_mcp_client_that_reads_nothing_of_a_long_answer_is_dropped(autojump_clock):
    # The transport writes its event streams itself (not through the app's stream
    # writer), and the send deadline let every event stream through: a client that
    # called the agent and read nothing held the answer (~6 MB here: the text and its
    # structured copy) and the request's task for as long as it kept the connection, and
    # got all of it when it came back. Now its sends are bounded as the app's other
    # answers: the rest is dropped and the connection closed; the turn is stored whole.
    autojump_clock.autojump_threshold = 0.05  # (no jump while the socket's data is on its way)
    text = "w" * 3_000_000
    agent = Agent(provider=ScriptedProvider(steps=[[text]]))
    async with web_server(agent, protocols=("ai-sdk", "mcp"), send_timeout=60) as server:
        async with httpx.AsyncClient(base_url=server.url, headers=ACCEPT) as client:
            request = await mcp_call_request(server, client)
        head, _, payload = request.partition(b"\r\n\r\n")
        payload = payload.replace(b', "_meta": {"progressToken": "p"}', b"")  # the answer alone
        head = head.rsplit(b"\r\n", 1)[0]  # (the content-length line, last)
        sock = await connect(server, receive_buffer=4096)
        with sock:
            await sock.send(head + b"\r\ncontent-length: %d\r\n\r\n" % len(payload) + payload)
            await trio.sleep(300)  # the client reads nothing for five send timeouts
            response = b""
            with trio.move_on_after(600):  # (held, the connection stayed open past this)
                response = await read_to_end(sock)
        record = await server.host.store.load("mcp-stuck")
    assert head_of(response).startswith(b"HTTP/1.1 200")  # read, and closed
    assert b'"finish_reason":"stop"' not in response  # cut short: the server gave up on it
    assert record.messages[-1].text == text


async def test_an_mcp_request_whose_body_never_arrives_gets_408_and_is_closed(autojump_clock):
    # /mcp read its body through the transport, with no deadline: a client that announced
    # a body and sent part of it held the request's task for as long as it kept the
    # connection (the other endpoints answer 408 after --body-timeout).
    async with web_server(agent(), protocols=("ai-sdk", "mcp"), body_timeout=30) as server:
        head = (
            f"POST /mcp HTTP/1.1\r\nhost: {server.url.removeprefix('http://')}\r\n"
            "content-type: application/json\r\naccept: application/json, text/event-stream\r\n"
            "content-length: 100\r\n\r\n"
        )
        sock = await connect(server)
        with sock:
            await sock.send(head.encode() + b'{"jsonrpc"')  # 10 bytes of the 100, then none
            response = b""
            with trio.move_on_after(600):  # (held: nothing came, the connection stayed open)
                response = await read_to_end(sock)
    head_, _, payload = response.partition(b"\r\n\r\n")
    assert head_.startswith(b"HTTP/1.1 408") and b"connection: close" in head_.lower()
    assert json.loads(payload)["error"]["message"] == "the request body did not arrive within 30 s"
