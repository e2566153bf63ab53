"""A2A attacked, both directions: ``A2AAgent`` (our client) against hostile remote agents
(a card that points elsewhere, endless or malformed streams, an error text quoting the
token, stalls), and the A2A endpoint (our server) against careless clients.

A hostile remote agent is a small Starlette app served on a loopback port in the test's
Trio loop (:func:`hostile`): its Agent Card and its JSON-RPC endpoint are whatever the
test says, and it records every request it gets."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import httpx
import orjson
import pytest
import trio
import trio.testing
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from actors.a2a import A2AAgent, RemoteAgentError, agent, wire
from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host, ToolMessage
from runtime.actor_messages import InferRequest
from runtime.app.web.serve import serve_app
from runtime.redact import redact_text
from tests.test_a2a import BOTH, hello_agent
from tests.web.harness import wait_idle, web_server

TOKEN = "tok-attack-7f3a9c21e5"
"""The token the client is given: no ``Bearer`` shape of its own once a remote agent
quotes it bare."""


class Remote:
    """A hostile remote agent: its card, its JSON-RPC answers, and what it was sent."""

    def __init__(self) -> None:
        self.url = ""
        self.card: Any = None
        self.answer: Callable[[dict[str, Any]], Any] = lambda body: None
        self.requests: list[tuple[str, dict[str, str], Any]] = []

    def methods(self) -> list[str]:
        return [b.get("method") for _, _, b in self.requests if isinstance(b, dict)]


def card_of(url: str, *, streaming: bool = True) -> dict[str, Any]:
    card = wire.agent_card(name="remote", description="d", url=url, token=True, version="1")
    card["capabilities"]["streaming"] = streaming
    return card


@asynccontextmanager
async def hostile() -> AsyncIterator[Remote]:
    remote = Remote()

    async def card(request: Request) -> Response:
        remote.requests.append((request.url.path, dict(request.headers), None))
        if isinstance(remote.card, Response):
            return remote.card
        return Response(orjson.dumps(remote.card), media_type="application/json")

    async def anything(request: Request) -> Any:
        raw = await request.body()
        body = orjson.loads(raw) if raw else None
        remote.requests.append((request.url.path, dict(request.headers), body))
        if isinstance(body, dict) and body.get("method") == "CancelTask":
            task = wire.task(body["params"]["id"], "c", wire.status(wire.CANCELED))
            return Response(orjson.dumps(wire.jsonrpc_result(body.get("id"), task)))
        return remote.answer(body)

    app = Starlette(
        routes=[
            Route(wire.CARD_PATH, card),
            Route("/{path:path}", anything, methods=["GET", "POST"]),
        ]
    )
    async with trio.open_nursery() as nursery:
        (remote.url,) = await nursery.start(partial(serve_app, app, host="127.0.0.1", port=0))
        remote.card = card_of(remote.url + "/a2a")
        try:
            yield remote
        finally:
            nursery.cancel_scope.cancel()


def event(result: Any) -> bytes:
    return wire.sse(wire.jsonrpc_result("1", result))


def stream(*pieces: bytes, then: Any = None) -> StreamingResponse:
    """An SSE answer: ``pieces``, then whatever the async iterator ``then`` yields."""

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece
        if then is not None:
            async for piece in then:
                yield piece

    return StreamingResponse(body(), media_type="text/event-stream")


WORKING = {"task": wire.task("ctx~t1", "ctx", wire.status(wire.WORKING))}


def lead(tool: Any) -> Agent:
    """A parent agent that calls the remote agent once, then says what the call gave."""

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return [*tool_call("remote", {"input": "do it"}, tool_call_id="P1")]
        last = request.messages[-1]
        return [f"Got: {last.output if last.error is None else last.error}"]

    return Agent(name="lead", provider=ScriptedProvider(responder=script), tools=[tool])


# -- our client against a hostile remote agent ------------------------------------------


async def test_a_card_pointing_at_another_origin_is_refused_and_gets_no_token():
    async with hostile() as remote, hostile() as elsewhere:
        remote.card = card_of(elsewhere.url + "/a2a")
        with pytest.raises(RemoteAgentError, match="another origin"):
            await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert elsewhere.requests == []  # the token (and the task) never went there


@pytest.mark.parametrize(
    "where",
    ["file:///etc/passwd", "ftp://127.0.0.1/a2a", "http://169.254.169.254/latest/meta-data"],
)
async def test_a_card_pointing_at_another_scheme_or_a_metadata_address_is_refused(where):
    async with hostile() as remote:
        for interface in remote.card["supportedInterfaces"]:
            interface["url"] = where
        with pytest.raises(RemoteAgentError, match="another origin"):
            await A2AAgent(remote.url, token=TOKEN).run("hi")


async def test_a_card_on_the_same_origin_under_another_path_is_used():
    async with hostile() as remote:
        remote.card = card_of(remote.url + "/elsewhere")
        remote.answer = lambda body: stream(
            event({"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "ok"}]}})
        )
        assert await A2AAgent(remote.url, token=TOKEN).run("hi") == "ok"
    path, headers, _ = remote.requests[-1]
    assert path == "/elsewhere/jsonrpc" and headers["authorization"] == f"Bearer {TOKEN}"


async def test_a_redirect_is_not_followed_with_the_token():
    async with hostile() as remote, hostile() as elsewhere:
        remote.card = Response(
            status_code=307, headers={"location": elsewhere.url + wire.CARD_PATH}
        )
        with pytest.raises(RemoteAgentError, match="HTTP 307"):
            await A2AAgent(remote.url, token=TOKEN).run("hi")
        remote.card = card_of(remote.url + "/a2a")
        remote.answer = lambda body: Response(
            status_code=307, headers={"location": elsewhere.url + "/a2a/jsonrpc"}
        )
        with pytest.raises(RemoteAgentError, match="HTTP 307"):
            await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert elsewhere.requests == []


async def test_a_token_the_remote_agent_quotes_is_redacted_where_the_model_and_store_see_it():
    quoted = f"token {TOKEN} is not valid here"
    async with hostile() as remote:
        remote.answer = lambda body: stream(
            event(WORKING),
            event(
                {
                    "statusUpdate": {
                        "status": {
                            "state": wire.FAILED,
                            "message": {
                                "role": "ROLE_AGENT",
                                "messageId": "n",
                                "parts": [{"text": quoted}],
                            },
                        }
                    }
                }
            ),
        )
        tool = A2AAgent(remote.url, token=TOKEN).as_tool(name="remote")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead(tool), session_id="p")
            async with session.stream("go") as out:
                chunks = [c async for c in out]
            stored = await host.store.load("p")
    result = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert result.error is not None and "is not valid here" in result.error
    seen = orjson.dumps([c.model_dump() if hasattr(c, "model_dump") else repr(c) for c in chunks])
    assert TOKEN.encode() not in seen
    assert TOKEN not in result.error and TOKEN not in out.result.text
    assert TOKEN not in repr(stored.messages)


async def test_a_refusal_quoting_the_token_is_redacted_in_the_error_raised():
    refusal = await _refusal_quoting(TOKEN, token=TOKEN)
    assert "who is" in refusal and TOKEN not in refusal


async def _refusal_quoting(secret: str, **options: Any) -> str:
    """The error an ``A2AAgent(**options)`` raises when the remote agent refuses with a
    JSON-RPC error whose message quotes ``secret`` (``who is <secret>?``)."""
    async with hostile() as remote:
        error = {"code": -32001, "message": f"who is {secret}?"}
        remote.answer = lambda body: Response(
            orjson.dumps({"jsonrpc": "2.0", "id": "1", "error": error}),
            media_type="application/json",
        )
        with pytest.raises(RemoteAgentError) as caught:
            await A2AAgent(remote.url, **options).run("hi")
    return str(caught.value)


async def test_credentials_in_the_agents_url_are_not_in_the_tool_description():
    tool = A2AAgent("http://user:hunter2-secret@127.0.0.1:9/", token=TOKEN).as_tool()
    assert "hunter2-secret" not in orjson.dumps(tool.spec()).decode()


async def test_an_endless_answer_is_cut_at_max_answer_chars_and_its_task_canceled():
    async def endless() -> AsyncIterator[bytes]:
        chunk = {
            "artifactUpdate": {
                "taskId": "ctx~t1",
                "append": True,
                "artifact": {"parts": [{"text": "x" * 100}]},
            }
        }
        while True:
            yield event(chunk)
            await trio.lowlevel.checkpoint()

    async with hostile() as remote:
        remote.answer = lambda body: stream(event(WORKING), then=endless())
        with pytest.raises(RemoteAgentError, match="passed 1000 characters"):
            await A2AAgent(remote.url, token=TOKEN, max_answer_chars=1000).run("hi")
    assert remote.methods() == ["SendStreamingMessage", "CancelTask"]


async def test_an_event_line_that_never_ends_is_not_buffered_whole(monkeypatch):
    monkeypatch.setattr(agent, "MAX_PIECE_BYTES", 1000)
    async with hostile() as remote:
        remote.answer = lambda body: stream(event(WORKING), b"data: " + b"x" * 100_000)
        with pytest.raises(RemoteAgentError, match="over 1000 bytes"):
            await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert remote.methods() == ["SendStreamingMessage", "CancelTask"]


async def test_a_huge_card_or_answer_is_refused_unread(monkeypatch):
    monkeypatch.setattr(agent, "MAX_PIECE_BYTES", 1000)
    async with hostile() as remote:
        remote.card = {**card_of(remote.url + "/a2a", streaming=False), "pad": "x" * 5000}
        with pytest.raises(RemoteAgentError, match="over 1000 bytes"):
            await A2AAgent(remote.url, token=TOKEN).run("hi")
        remote.card = card_of(remote.url + "/a2a", streaming=False)
        remote.answer = lambda body: Response(b"[" + b"1," * 5000 + b"1]")
        with pytest.raises(RemoteAgentError, match="over 1000 bytes"):
            await A2AAgent(remote.url, token=TOKEN).run("hi")


@pytest.mark.parametrize(
    ("piece", "says"),
    [
        (event([1, 2]), "malformed event \\(an array"),
        (event("text"), "malformed event \\(a string"),
        (b"data: {nope\n\n", "an event that is not JSON"),
        (event({"task": {"id": {"a": 1}, "status": {"state": wire.WORKING}}}), "string id"),
    ],
)
async def test_a_malformed_event_is_named_so_not_an_unreachable_agent(piece, says):
    async with hostile() as remote:
        remote.answer = lambda body: stream(piece)
        with pytest.raises(RemoteAgentError, match=says) as caught:
            await A2AAgent(remote.url, token=TOKEN).run("hi")
    assert "could not be reached" not in str(caught.value)


async def test_junk_inside_well_formed_events_is_skipped():
    async with hostile() as remote:
        remote.answer = lambda body: stream(
            event(WORKING),
            event({"artifactUpdate": {"artifact": [1]}}),
            event({"artifactUpdate": {"artifact": {"parts": "abc"}}}),
            event({"artifactUpdate": {"append": True, "artifact": {"parts": [{"text": 5}]}}}),
            event({"artifactUpdate": {"append": True, "artifact": {"parts": [{"text": "ok"}]}}}),
            event({"statusUpdate": {"status": {"state": wire.COMPLETED}}}),
        )
        assert await A2AAgent(remote.url, token=TOKEN).run("hi") == "ok"


@pytest.mark.parametrize("state", [wire.AUTH_REQUIRED, wire.INPUT_REQUIRED])
async def test_a_task_that_asks_for_auth_or_input_is_canceled_and_the_model_reads_why(state):
    async with hostile() as remote:
        note = {"role": "ROLE_AGENT", "messageId": "n", "parts": [{"text": "log in first"}]}
        remote.answer = lambda body: stream(
            event(WORKING), event({"statusUpdate": {"status": {"state": state, "message": note}}})
        )
        tool = A2AAgent(remote.url, token=TOKEN).as_tool(name="remote")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead(tool), session_id="p")
            result = await session.run("go")
    message = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert message.error is not None
    assert "asked for input" in message.error and "log in first" in message.error
    assert result.text.startswith("Got: ")
    assert remote.methods() == ["SendStreamingMessage", "CancelTask"]


async def test_a_stalled_stream_is_cut_by_the_tool_timeout_and_its_task_canceled(autojump_clock):
    async with hostile() as remote:
        remote.answer = lambda body: stream(event(WORKING), then=_forever())
        tool = A2AAgent(remote.url, token=TOKEN).as_tool(name="remote")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead(tool), session_id="p")
            result = await session.run("go")
    message = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert message.error is not None and "timed out" in message.error.lower()
    assert result.text.startswith("Got: ")
    assert remote.methods() == ["SendStreamingMessage", "CancelTask"]


async def _forever() -> AsyncIterator[bytes]:
    await trio.sleep_forever()
    yield b""  # pragma: no cover


# -- our server against careless or hostile clients --------------------------------------


async def _card(server: Any, headers: dict[str, str]) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        response = await http.get(server.url + wire.CARD_PATH, headers=headers)
    assert response.status_code == 200
    return response.json()


async def test_the_card_behind_a_tls_proxy_names_https_and_no_forged_scheme():
    async with web_server(hello_agent(), protocols=BOTH, allowed_hosts=["agent.example"]) as s:
        proxied = await _card(s, {"host": "agent.example", "x-forwarded-proto": "https"})
        forged = await _card(s, {"x-forwarded-proto": "gopher"})
        direct = await _card(s, {})
    assert {i["url"] for i in proxied["supportedInterfaces"]} == {
        "https://agent.example/a2a/jsonrpc",
        "https://agent.example/a2a",
    }
    assert proxied["url"] == "https://agent.example/a2a/jsonrpc"
    assert forged["url"] == direct["url"] == s.url + "/a2a/jsonrpc"


async def test_a_forged_scheme_names_https_in_its_own_card_alone():
    """Why ``X-Forwarded-Proto`` is taken from any client (no trusted-proxy list,
    ``a2a._scheme``): the card is built per request and sent ``no-cache``, so a client's
    forged ``https`` is in its own card only, never one a cache or the next client
    gets; and no forwarded header names the card's host (branch ``smallleft``)."""
    async with web_server(hello_agent(), protocols=BOTH) as s:
        async with httpx.AsyncClient() as http:
            forged = await http.get(
                s.url + wire.CARD_PATH,
                headers={"x-forwarded-proto": "https", "x-forwarded-host": "evil.example"},
            )
            after = await http.get(s.url + wire.CARD_PATH)
    assert forged.headers["cache-control"] == after.headers["cache-control"] == "no-cache"
    host = s.url.partition("://")[2]
    assert forged.json()["url"] == f"https://{host}/a2a/jsonrpc"
    assert after.json()["url"] == s.url + "/a2a/jsonrpc"


async def test_the_card_never_names_a_host_the_guard_refuses():
    import httpx

    async with web_server(hello_agent(), protocols=BOTH) as s:
        async with httpx.AsyncClient() as http:
            response = await http.get(s.url + wire.CARD_PATH, headers={"host": "evil.example"})
    assert response.status_code == 403 and "supportedInterfaces" not in response.text


async def test_answers_sent_whole_again_and_again_count_toward_max_answer_chars():
    whole = {"artifactUpdate": {"artifact": {"parts": [{"text": "y" * 600}]}}}  # no append
    async with hostile() as remote:
        remote.answer = lambda body: stream(
            event(WORKING),
            *[event(whole)] * 5,
            event({"statusUpdate": {"status": {"state": wire.COMPLETED}}}),
        )
        with pytest.raises(RemoteAgentError, match="passed 1000 characters"):
            await A2AAgent(remote.url, token=TOKEN, max_answer_chars=1000).run("hi")


def _send(text: str, *, message_id: str = "m-1", context_id: str = "demo-1", **more: Any) -> Any:
    message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
    message.update(contextId=context_id, **more)
    return {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": message}}


async def _post(server: Any, body: Any) -> Any:
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(server.url + "/a2a/jsonrpc", json=body)
    return response.json()


@pytest.mark.parametrize("kept", [True, False])
async def test_a_message_id_reused_for_another_message_is_refused_and_runs_nothing(
    kept, monkeypatch
):
    from runtime.app.web import a2a_tasks

    if not kept:  # the first task is no longer in memory: found from the store
        monkeypatch.setattr(a2a_tasks, "LIVE_TASKS", 0)
    async with web_server(hello_agent("Hi.", "Four."), protocols=BOTH) as s:
        first = await _post(s, _send("hi"))
        again = await _post(s, _send("hi"))  # a true resend: the task it started
        other = await _post(s, _send("what is 2+2?"))  # a careless client's constant id
        stored = await s.host.store.load("demo-1")
    assert again["result"]["task"]["id"] == first["result"]["task"]["id"]
    assert other["error"]["code"] == -32602 and "sent before" in other["error"]["message"]
    assert [m.text for m in stored.messages] == ["hi", "Hi."]  # ran nothing


async def test_a_message_on_a_task_reusing_the_questions_id_is_refused_not_taken_as_a_resend():
    from tests.support.approval_agents import agent as approval_agent

    async with web_server(approval_agent, protocols=BOTH) as s:
        asked = await _post(s, _send("weather?", message_id="q"))
        task = asked["result"]["task"]
        decision = {"decisions": [{"approved": True}]}
        body = _send("", message_id="q", taskId=task["id"])
        body["params"]["message"]["parts"] = [{"data": decision}]
        reused = await _post(s, body)
        body["params"]["message"]["messageId"] = "d"
        answered = await _post(s, body)
        resent = await _post(s, body)  # the answer sent again: the same task, nothing more
    assert task["status"]["state"] == wire.INPUT_REQUIRED
    assert reused["error"]["code"] == -32602 and "sent before" in reused["error"]["message"]
    assert answered["result"]["task"]["status"]["state"] == wire.COMPLETED
    assert resent["result"]["task"]["id"] == task["id"]


async def test_a_message_id_reused_for_another_message_is_refused_in_a_worker_deployment(
    pg_url: str,
) -> None:
    from tests.support.redis import require_redis
    from tests.test_frontend import LIMIT
    from tests.test_worker_protocols import at, protocols_deployment

    async with protocols_deployment(pg_url, require_redis()) as d:
        front = at(d.urls[0])
        with trio.fail_after(LIMIT):
            first = await _post(front, _send("tools a2a", context_id="c1"))
            again = await _post(front, _send("tools a2a", context_id="c1"))
            other = await _post(at(d.urls[0]), _send("tools other", context_id="c1"))
        turns = await d.queue.turns("c1")
    assert again["result"]["task"]["id"] == first["result"]["task"]["id"]
    assert other["error"]["code"] == -32602 and "sent before" in other["error"]["message"]
    assert [t.status for t in turns] == ["done"]  # the other message ran nothing


async def test_a_finished_task_keeps_its_answer_not_its_stream_events():
    pieces = [f"w{i} " for i in range(200)]
    agent = Agent(name="long", provider=ScriptedProvider(turns=[["".join(pieces)]]))
    async with web_server(agent, protocols=BOTH) as s:
        body = _send("go")
        body["method"] = "SendStreamingMessage"
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(s.url + "/a2a/jsonrpc", json=body)
        events = [orjson.loads(line[5:]) for line in response.text.splitlines() if line]
        (task,) = _task_book(s.app).live.values()
        got = await _post(s, {**_send("x"), "method": "GetTask", "params": {"id": task.id}})
    updates = [e["result"]["artifactUpdate"] for e in events if "artifactUpdate" in e["result"]]
    streamed = "".join(p["text"] for u in updates for p in u["artifact"]["parts"])
    assert len(updates) > 2 and streamed == "".join(pieces)  # the follower read them all
    assert events[-1]["result"]["statusUpdate"]["status"]["state"] == wire.COMPLETED
    assert task.events == [] and task.text == ["".join(pieces)]
    assert got["result"]["artifacts"][0]["parts"][0]["text"] == "".join(pieces)


def _task_book(app: Any) -> Any:
    from runtime.app.web.a2a import A2AEndpoint

    (endpoint,) = [
        r.app for r in app.router.routes if isinstance(getattr(r, "app", None), A2AEndpoint)
    ]
    return endpoint.tasks


async def test_a_waiting_task_pushed_out_of_memory_by_later_tasks_is_still_answered(monkeypatch):
    from runtime.app.web import a2a_tasks
    from tests.support.approval_agents import agent as approval_agent

    monkeypatch.setattr(a2a_tasks, "LIVE_TASKS", 1)
    async with web_server(approval_agent, protocols=BOTH) as s:
        first = (await _post(s, _send("weather?", message_id="q", context_id="a")))["result"]
        await _post(s, _send("weather?", message_id="q", context_id="b"))
        await _post(s, _send("weather?", message_id="q", context_id="c"))
        assert first["task"]["id"] not in _task_book(s.app).live  # pushed out
        body = _send("", message_id="d", context_id="a", taskId=first["task"]["id"])
        body["params"]["message"]["parts"] = [{"data": {"approved": True}}]
        answered = await _post(s, body)
    assert first["task"]["status"]["state"] == wire.INPUT_REQUIRED
    assert answered["result"]["task"]["status"]["state"] == wire.COMPLETED


async def test_a_cancel_racing_the_answer_that_resumes_a_task_tells_what_happened(monkeypatch):
    from runtime.app.web.a2a_tasks import TaskBook
    from tests.support.approval_agents import agent as approval_agent

    gate, starting = trio.Event(), trio.Event()
    original = TaskBook._start

    async def slow_start(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("decided") is not None:  # the continuation, its answers recorded
            starting.set()
            await gate.wait()
        await original(self, *args, **kwargs)

    monkeypatch.setattr(TaskBook, "_start", slow_start)
    async with web_server(approval_agent, protocols=BOTH) as s:
        task = (await _post(s, _send("weather?", message_id="q")))["result"]["task"]
        body = _send("", message_id="d", taskId=task["id"])
        body["params"]["message"]["parts"] = [{"data": {"approved": True}}]
        cancel = {"jsonrpc": "2.0", "id": 2, "method": "CancelTask", "params": {"id": task["id"]}}
        answers: dict[str, Any] = {}

        async def post(name: str, payload: Any) -> None:
            answers[name] = await _post(s, payload)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "answer", body)
            await starting.wait()  # the answer is recorded; its continuation not started
            nursery.start_soon(post, "cancel", cancel)
            await trio.testing.wait_all_tasks_blocked(0.05)  # the cancel's turn to go
            gate.set()
        final = await _post(s, {**cancel, "method": "GetTask"})
        await wait_idle(s, "demo-1")
    said = answers["cancel"]["result"]["status"]["state"]
    # the cancel answers once the continuation runs, and stops it: what it says is so
    assert said == final["result"]["status"]["state"] == wire.CANCELED
    assert answers["answer"]["result"]["task"]["id"] == task["id"]


async def test_discover_makes_a_tool_a_model_takes_from_a_card_named_for_people():
    async with hostile() as remote:
        remote.card = {**remote.card, "name": "Currency Agent ☀ (v2)", "description": "d" * 5000}
        named = await A2AAgent.discover(remote.url, token=TOKEN)
        remote.card = {**remote.card, "name": "☀☀"}
        unnamed = await A2AAgent.discover(remote.url, token=TOKEN)
    spec = named.as_tool().spec()
    assert (
        spec["name"] == "Currency_Agent_v2" and unnamed.as_tool().spec()["name"] == "remote_agent"
    )
    assert len(named.description or "") == agent.MAX_DESCRIPTION


async def test_a_huge_jsonrpc_id_is_refused_not_echoed_in_every_event():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as s:
        body = {**_send("hi"), "id": "i" * 100_000, "method": "SendStreamingMessage"}
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(s.url + "/a2a/jsonrpc", json=body)
        sessions = await s.host.store.list_sessions()
        fine = await _post(s, {**_send("hi"), "id": "i" * 256})
    refused = response.json()
    assert refused["id"] is None and refused["error"]["code"] == -32600
    assert len(response.content) < 1000 and sessions == []
    assert fine["id"] == "i" * 256 and fine["result"]["task"]["status"]["state"] == wire.COMPLETED


@pytest.mark.parametrize(
    "method", ["SendMessage", "SendStreamingMessage", "message/send", "GetTask", "NoSuch"]
)
async def test_a_notification_gets_no_reply_and_runs_nothing(method):
    """A request with no ``id`` is a JSON-RPC notification: the server must not reply
    to it (JSON-RPC 2.0, section 4.1). It got a whole answer with ``"id": null`` (an
    error for an unknown method or task), and a ``SendMessage`` ran its turn. Now: HTTP
    204, no body, nothing run; ``"id": null`` is still a request, answered; what is no
    request object is still refused."""
    async with web_server(hello_agent("Hi.", "Hi."), protocols=BOTH) as s:
        body = _send("hi")
        del body["id"]
        body["method"] = method
        if method == "message/send":  # A2A 0.3's shapes
            body["params"]["message"] = {
                "messageId": "m-1",
                "role": "user",
                "parts": [{"kind": "text", "text": "hi"}],
                "contextId": "demo-1",
            }
        elif method == "GetTask":
            body["params"] = {"id": "no-such-task"}
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.post(s.url + "/a2a/jsonrpc", json=body)
            sessions = await s.host.store.list_sessions()
            answered = await _post(s, {**_send("hi"), "id": None})
            invalid = await http.post(s.url + "/a2a/jsonrpc", json={**body, "jsonrpc": "1.0"})
    assert (response.status_code, response.content) == (204, b"")
    assert sessions == []
    assert answered["id"] is None
    assert answered["result"]["task"]["status"]["state"] == wire.COMPLETED
    assert invalid.json()["error"]["code"] == -32600


@pytest.mark.parametrize(
    "chunks",
    [
        [b'data: {"a": 1}\n\ndata: {"a": 2}\n\n'],
        [b'data: {"a": 1}\r', b'\n\r\ndata: {"a"', b": 2}\r\n\r\n"],  # CRLF cut in two
        [b'data: {"a": 1}\r\rdata: {"a": 2}\r\r'],  # CR alone ends lines too
        # comments skipped; a last event with no blank line after it
        [b": keep-alive\n\n", b'data: {"a": 1}\n\n', b"data:", b' {"a": 2}'],
        [b'data: {"a": 1}\n\ndata: {"a":\ndata: 2}\n\n'],  # an event of two data lines
        # a leading byte order mark, cut from its line (the first event was lost), and an
        # id-only block (the providers' decoder, branch provmend)
        [b"\xef\xbb", b'\xbfdata: {"a": 1}\n\nid: 7\n\ndata: {"a": 2}\n\n'],
    ],
)
async def test_sse_events_are_read_whatever_their_line_ends_and_chunks(chunks):
    class Chunked:
        async def aiter_bytes(self) -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

    assert [e async for e in agent._sse(Chunked())] == [{"a": 1}, {"a": 2}]


async def test_a_task_taking_its_answer_is_not_pushed_out_of_memory_under_a_cancel(monkeypatch):
    # Tasks past LIVE_TASKS are dropped from memory (read back from the store when asked
    # for), but one whose answer was being recorded was dropped too: a cancel then found
    # a fresh copy, without the lock that orders it after the continuation, answered
    # CANCELED, and the continuation ran the approved call and completed the turn.
    from runtime.app.web import a2a_tasks
    from runtime.app.web.a2a_tasks import TaskBook
    from tests.support.approval_agents import agent as approval_agent

    monkeypatch.setattr(a2a_tasks, "LIVE_TASKS", 1)
    gate, starting = trio.Event(), trio.Event()
    original = TaskBook._start

    async def slow_start(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("decided") is not None:  # the continuation, its answers recorded
            starting.set()
            await gate.wait()
        await original(self, *args, **kwargs)

    monkeypatch.setattr(TaskBook, "_start", slow_start)
    async with web_server(approval_agent, protocols=BOTH) as s:
        task = (await _post(s, _send("weather?", message_id="q", context_id="a")))["result"]
        task_id = task["task"]["id"]
        body = _send("", message_id="d", context_id="a", taskId=task_id)
        body["params"]["message"]["parts"] = [{"data": {"approved": True}}]
        cancel = {"jsonrpc": "2.0", "id": 2, "method": "CancelTask", "params": {"id": task_id}}
        answers: dict[str, Any] = {}

        async def post(name: str, payload: Any) -> None:
            answers[name] = await _post(s, payload)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "answer", body)
            await starting.wait()  # the answer is recorded; its continuation not started
            await _post(s, _send("weather?", message_id="q", context_id="b"))  # one more task
            nursery.start_soon(post, "cancel", cancel)
            await trio.testing.wait_all_tasks_blocked(0.05)  # the cancel's turn to go
            gate.set()
        await wait_idle(s, "a")
        await _post(s, _send("weather?", message_id="q", context_id="c"))
        assert task_id not in _task_book(s.app).live  # what it says is read from the store
        final = await _post(s, {**cancel, "method": "GetTask"})
    said = answers["cancel"]["result"]["status"]["state"]
    assert said == final["result"]["status"]["state"] == wire.CANCELED


async def test_the_65th_waiting_task_pushes_the_first_out_of_memory_and_loses_nothing():
    # LIVE_TASKS (64) bounds the tasks kept in memory at rest; past it the oldest is
    # dropped and read back from its session's history: asked for, answered, it is whole.
    from runtime.app.web.a2a_tasks import LIVE_TASKS
    from tests.support.approval_agents import agent as approval_agent

    async with web_server(approval_agent, protocols=BOTH) as s:
        sent = [
            (await _post(s, _send("weather?", message_id="q", context_id=f"c{n}")))["result"]
            for n in range(LIVE_TASKS + 1)
        ]
        book = _task_book(s.app)
        first = sent[0]["task"]["id"]
        kept, pushed = len(book.live), first not in book.live
        got = await _post(
            s, {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": first}}
        )
        body = _send("", message_id="d", context_id="c0", taskId=first)
        body["params"]["message"]["parts"] = [{"data": {"approved": True}}]
        answered = await _post(s, body)
    assert [t["task"]["status"]["state"] for t in sent] == [wire.INPUT_REQUIRED] * 65
    assert kept == LIVE_TASKS == 64 and pushed
    assert got["result"]["status"]["state"] == wire.INPUT_REQUIRED
    assert [m["messageId"] for m in got["result"]["history"]] == ["q"]
    assert answered["result"]["task"]["status"]["state"] == wire.COMPLETED
    assert answered["result"]["task"]["artifacts"][0]["parts"][0]["text"] == "It is sunny in Oslo."


MESSAGE = {"messageId": "m", "contextId": "c", "role": "ROLE_USER", "parts": [{"text": "x"}]}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/a2a/jsonrpc",
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendStreamingMessage",
                "params": {"message": MESSAGE},
            },
        ),
        ("/a2a/message:stream", {"message": MESSAGE}),
    ],
)
async def test_a_client_that_never_reads_its_task_stream_is_dropped_and_the_task_ends(path, body):
    # A stream of 5 MB to a client whose receive window is a few KB and who reads
    # nothing: dropped after the send timeout; the task runs on and its turn is saved.
    raw = orjson.dumps(body)
    agent = Agent(name="long", provider=ScriptedProvider([["w" * 1000 + " "] * 5000]))
    async with web_server(agent, protocols=("a2a",), send_timeout=1) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with trio.socket.socket() as sock:
            sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
            await sock.connect(("127.0.0.1", port))
            await sock.send(
                b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"accept: text/event-stream\r\ncontent-length: %d\r\n\r\n%s"
                % (path.encode(), len(raw), raw)
            )
            with trio.fail_after(60):  # a guard: the turn ends though nothing is read
                stored = await saved_answer(server.host.store, "c")
                while await sock.recv(1 << 16):  # what was sent before the drop, then EOF
                    pass
    assert len(stored.text) == 5000 * 1001


async def saved_answer(store: Any, session_id: str) -> Any:
    """The session's answer once its turn saved one."""
    while True:
        record = await store.load(session_id)
        if record is not None and len(record.messages) >= 2:
            return record.messages[-1]
        await trio.sleep(0.05)


@pytest.mark.parametrize(
    "name", ["X-Auth-Token", "X-Goog-Api-Key", "Ocp-Apim-Subscription-Key", "Private-Token"]
)
async def test_a_credential_header_the_remote_agent_quotes_is_redacted_in_the_error(name):
    """A header named like a credential (as an HTTP client's debug line tells them:
    ``*token*``, ``*key*``, ``*auth*``...), not only the few names of a JSON field
    (``authorization``, ``x-api-key``): its value is no key shape, so only its
    registration hides it when a remote agent's refusal quotes it."""
    value = f"hdr-{name.lower()}-of-no-shape-4402"
    refusal = await _refusal_quoting(value, headers={name: value})
    assert "who is [redacted]? " in refusal


def test_a_session_header_that_names_no_token_is_no_secret_and_one_that_holds_one_is():
    """``session`` and ``signature`` name headers that often carry a label, not a
    credential: their value is registered only when it is a token (key characters with
    a digit, 16 or more). ``X-Session-Name: Quokka Team Chat`` was registered, and every
    error text and log line naming the team's chat lost it."""
    A2AAgent(
        "http://127.0.0.1:9/a2a",
        headers={
            "X-Session-Name": "Quokka Team Chat",
            "X-Signature-Method": "HMAC-SHA256",
            "X-Session-Token": "quokka-session-7c1d2e3f4a5b6c7d",
        },
    )
    assert redact_text("Quokka Team Chat signs HMAC-SHA256") == (
        "Quokka Team Chat signs HMAC-SHA256"
    )
    assert redact_text("who is quokka-session-7c1d2e3f4a5b6c7d?") == "who is [redacted]?"


def test_a_credential_header_given_as_bytes_is_registered_not_a_type_error():
    # httpx takes bytes headers; their name was tested with `"idempotency" in name`,
    # a TypeError at A2AAgent(...), and their value was never registered.
    A2AAgent("http://127.0.0.1:9/a2a", headers={b"X-Auth-Token": b"quokka-bytes-9f8e7d6c5b4a"})
    assert redact_text("who is quokka-bytes-9f8e7d6c5b4a?") == "who is [redacted]?"
