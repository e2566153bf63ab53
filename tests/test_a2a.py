"""The A2A endpoint (``serve --protocols a2a``), driven by the official ``a2a-sdk`` client
over loopback HTTP, and ``A2AAgent`` delegating to it as a tool.

The SDK is asyncio; the server runs in the test's Trio loop, so each SDK call runs in a
worker thread with an asyncio loop of its own (:func:`sdk`)."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from a2a.client import ClientConfig, ClientFactory
from a2a.client.card_resolver import A2ACardResolver
from a2a.client.errors import A2AClientError
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import (
    A2AError,
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Value
from hypothesis import given
from hypothesis import strategies as st

from actors.a2a import A2AAgent, RemoteAgentError, wire
from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, Host, ToolMessage, tool
from runtime.actor_messages import InferRequest
from runtime.errors import ToolDefinitionError
from runtime.tools import ToolContext
from tests.support.approval_agents import agent as approval_agent
from tests.support.grammar import check_grammar
from tests.web.harness import WebServer, wait_idle, web_server

BOTH = ("ai-sdk", "a2a")
JSONRPC, REST = "JSONRPC", "HTTP+JSON"


# -- the official client, in a thread --------------------------------------------------


def _run_sdk(
    url: str,
    fn: Any,
    *,
    binding: str,
    streaming: bool,
    headers: dict[str, str] | None,
) -> Any:
    async def main() -> Any:
        http = httpx.AsyncClient(headers=headers or {}, timeout=30)
        config = ClientConfig(
            streaming=streaming, httpx_client=http, supported_protocol_bindings=[binding]
        )
        try:
            client = await ClientFactory(config).create_from_url(url)
            return await fn(client)
        finally:
            await http.aclose()

    return asyncio.run(main())


async def sdk(
    server: WebServer,
    fn: Any,
    *,
    binding: str = JSONRPC,
    streaming: bool = True,
    headers: dict[str, str] | None = None,
) -> Any:
    """``await fn(client)`` with an SDK client made from the server's Agent Card."""
    run = partial(_run_sdk, server.url, fn, binding=binding, streaming=streaming, headers=headers)
    return await trio.to_thread.run_sync(run)


def user(
    text: str = "",
    *,
    message_id: str = "m1",
    context_id: str = "",
    task_id: str = "",
    data: Any = None,
) -> SendMessageRequest:
    parts = [Part(text=text)] if text else []
    if data is not None:
        value = Value()
        value.struct_value.update(data)
        parts.append(Part(data=value))
    message = Message(
        message_id=message_id,
        role=Role.ROLE_USER,
        parts=parts,
        context_id=context_id,
        task_id=task_id,
    )
    return SendMessageRequest(message=message)


async def collect(client: Any, request: Any) -> list[Any]:
    return [event async for event in client.send_message(request)]


def answer_of(events: list[Any]) -> str:
    """The answer text a stream of ``StreamResponse`` s carries."""
    text = ""
    for event in events:
        if event.HasField("task"):
            text = "".join(p.text for a in event.task.artifacts for p in a.parts)
        elif event.HasField("artifact_update"):
            text += "".join(p.text for p in event.artifact_update.artifact.parts)
    return text


def last_state(events: list[Any]) -> int:
    event = events[-1]
    if event.HasField("status_update"):
        return event.status_update.status.state
    return event.task.status.state


def hello_agent(*texts: str) -> Agent:
    return Agent(name="helper", provider=ScriptedProvider(turns=[[t] for t in texts] or [["Hi."]]))


# -- the card and the happy paths ------------------------------------------------------


async def test_the_agent_card_names_the_agent_and_both_bindings():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:

        async def fetch() -> Any:
            async with httpx.AsyncClient() as http:
                return await A2ACardResolver(http, server.url).get_agent_card()

        card = await trio.to_thread.run_sync(lambda: asyncio.run(fetch()))
    assert card.name == "helper" and card.capabilities.streaming
    interfaces = {
        (i.protocol_binding, i.url, i.protocol_version) for i in card.supported_interfaces
    }
    assert interfaces == {
        (JSONRPC, server.url + "/a2a/jsonrpc", "1.0"),
        (REST, server.url + "/a2a", "1.0"),
        (JSONRPC, server.url + "/a2a/jsonrpc", "0.3"),  # A2A 0.3's methods, same endpoint
    }
    assert not card.security_schemes  # no --token: nothing to declare


async def test_a_card_of_a_server_with_a_token_declares_bearer_auth():
    async with web_server(hello_agent("Hi."), protocols=BOTH, token="s3cret") as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            card = (await http.get(wire.CARD_PATH)).json()  # public: no token needed
    assert card["securitySchemes"] == {"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}}
    assert card["securityRequirements"] == [{"schemes": {"bearer": {"list": []}}}]


@pytest.mark.parametrize("binding", [JSONRPC, REST])
async def test_a_streamed_message_gives_the_task_then_its_answer_then_completed(binding):
    async with web_server(hello_agent("Hello there."), protocols=BOTH) as server:
        events = await sdk(server, lambda c: collect(c, user("hi")), binding=binding)
    assert events[0].HasField("task")
    task = events[0].task
    assert task.context_id and task.id.startswith(task.context_id + "~")
    assert [m.parts[0].text for m in task.history] == ["hi"]
    assert answer_of(events) == "Hello there."
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED
    assert all(
        e.artifact_update.task_id == task.id for e in events if e.HasField("artifact_update")
    )


@pytest.mark.parametrize("binding", [JSONRPC, REST])
async def test_a_sent_message_returns_the_completed_task(binding):
    async with web_server(hello_agent("Hello there."), protocols=BOTH) as server:
        (event,) = await sdk(
            server, lambda c: collect(c, user("hi")), binding=binding, streaming=False
        )
    assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert [p.text for p in event.task.artifacts[0].parts] == ["Hello there."]


@pytest.mark.parametrize("binding", [JSONRPC, REST])
async def test_get_task_gives_a_finished_task_with_its_history(binding):
    async with web_server(hello_agent("Hello there."), protocols=BOTH) as server:

        async def run(client: Any) -> tuple[Any, Any, Any]:
            (event,) = await collect(client, user("hi"))
            got = await client.get_task(GetTaskRequest(id=event.task.id))
            short = await client.get_task(GetTaskRequest(id=event.task.id, history_length=0))
            return event.task, got, short

        sent, got, short = await sdk(server, run, binding=binding, streaming=False)
    assert got.id == sent.id and got.context_id == sent.context_id
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert [m.parts[0].text for m in got.history] == ["hi"]
    assert "".join(p.text for p in got.artifacts[0].parts) == "Hello there."
    assert len(short.history) == 0


async def test_the_context_id_is_the_session_and_keeps_the_conversation():
    provider = ScriptedProvider(turns=[["Hello Ada."], ["You are Ada."]])
    agent = Agent(name="memo", provider=provider)
    async with web_server(agent, protocols=BOTH) as server:

        async def run(client: Any) -> list[Any]:
            first = await collect(client, user("I am Ada.", message_id="a", context_id="chat-1"))
            second = await collect(client, user("Who am I?", message_id="b", context_id="chat-1"))
            return [first, second]

        first, second = await sdk(server, run, streaming=False)
        stored = await server.host.store.load("chat-1")
    assert first[0].task.context_id == second[0].task.context_id == "chat-1"
    assert first[0].task.id != second[0].task.id
    assert answer_of(second) == "You are Ada."
    assert stored is not None and [m.role for m in stored.messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]
    assert [m.id for m in stored.messages if m.role == "user"] == ["a", "b"]  # the messageIds


async def test_a_resent_message_id_runs_no_second_turn():
    provider = ScriptedProvider(turns=[["Only once."], ["Twice!"]])
    agent = Agent(name="once", provider=provider)
    async with web_server(agent, protocols=BOTH) as server:

        async def run(client: Any) -> list[Any]:
            request = user("hi", message_id="same", context_id="c1")
            return [await collect(client, request), await collect(client, request)]

        first, again = await sdk(server, run)
    assert len(provider.requests) == 1
    assert again[0].task.id == first[0].task.id
    assert answer_of(again) == "Only once."
    assert again[-1].task.status.state == TaskState.TASK_STATE_COMPLETED


async def test_a_message_sent_to_a_stored_context_reads_none_of_its_messages(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the message was sent before is asked of the store's index of message ids
    (a PostgreSQL host): it loaded the whole context each send (5,000 messages 1.2 MB)."""
    from actors.stores.postgres import PostgresStore

    loads: list[str] = []
    load = PostgresStore.load

    async def counted(self: PostgresStore, session_id: str) -> Any:
        loads.append(session_id)
        return await load(self, session_id)

    provider = ScriptedProvider(turns=[["One."], ["Two."]])
    store = await PostgresStore.open(pg_url)
    try:
        agent = Agent(name="two", provider=provider)
        async with web_server(agent, store=store, protocols=BOTH) as server:
            first = await sdk(server, lambda c: collect(c, user("hi", context_id="c1")))
            await wait_idle(server, "c1")
            monkeypatch.setattr(PostgresStore, "load", counted)
            second = await sdk(
                server, lambda c: collect(c, user("again", message_id="m2", context_id="c1"))
            )
            sent_loads = list(loads)
            resent = await sdk(server, lambda c: collect(c, user("hi", context_id="c1")))
    finally:
        await store.aclose()
    assert sent_loads == []
    assert [answer_of(first), answer_of(second)] == ["One.", "Two."]
    assert resent[0].task.id == first[0].task.id and len(provider.requests) == 2


async def test_the_same_message_sent_twice_at_once_runs_one_turn():
    gate = trio.Event()
    async with web_server(gated_agent(gate), protocols=BOTH) as server:
        request = user("go", message_id="twice", context_id="c")
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
        sent: list[Any] = []

        async def send() -> None:
            sent.extend(await sdk(server, lambda c: collect(c, request), streaming=False))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            nursery.start_soon(send)
        gate.set()
        assert len({event.task.id for event in sent}) == 1
        await wait_idle(server, "c")
        stored = await server.host.store.load("c")
    assert [m.role for m in stored.messages].count("user") == 1


async def test_a_failed_turn_is_a_failed_task_with_the_error():
    def fail(request: Any) -> Any:
        raise ValueError("boom")

    agent = Agent(name="broken", provider=ScriptedProvider(responder=fail))
    async with web_server(agent, protocols=BOTH) as server:
        events = await sdk(server, lambda c: collect(c, user("hi")))
    assert last_state(events) == TaskState.TASK_STATE_FAILED
    assert "boom" in events[-1].status_update.status.message.parts[0].text


def _run_legacy_sdk(url: str, fn: Any) -> Any:
    """``fn(client)`` with the SDK's A2A 0.3 client: the card offered to the factory
    keeps only the 0.3 interface, so the SDK speaks 0.3's methods and shapes."""
    from a2a.client.card_resolver import parse_agent_card

    async def main() -> Any:
        async with httpx.AsyncClient(timeout=30) as http:
            card = (await http.get(url + wire.CARD_PATH)).json()
            card["supportedInterfaces"] = [
                i for i in card["supportedInterfaces"] if i["protocolVersion"] == "0.3"
            ]
            config = ClientConfig(httpx_client=http, supported_protocol_bindings=[JSONRPC])
            client = ClientFactory(config).create(parse_agent_card(card))
            return await fn(client)

    return asyncio.run(main())


async def test_an_a2a_0_3_client_gets_the_same_tasks_through_0_3s_methods():
    async with web_server(approval_agent, protocols=BOTH) as server:

        async def run(client: Any) -> tuple[Any, Any, Any]:
            from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport

            assert isinstance(client._transport, CompatJsonRpcTransport)
            asked = await collect(client, user("weather?", message_id="q", context_id="old"))
            task = asked[0].task
            pending = MessageToDict(asked[-1].status_update.status.message.parts[1].data)
            decision = {"decisions": [{"id": pending["pending"][0]["id"], "approved": True}]}
            answered = await collect(client, user(message_id="d", task_id=task.id, data=decision))
            got = await client.get_task(GetTaskRequest(id=task.id))
            return asked, answered, got

        asked, answered, got = await trio.to_thread.run_sync(
            partial(_run_legacy_sdk, server.url, run)
        )
    assert last_state(asked) == TaskState.TASK_STATE_INPUT_REQUIRED
    assert answer_of(answered) == "It is sunny in Oslo."
    assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
    assert got.id == asked[0].task.id and got.context_id == "old"
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert [m.parts[0].text for m in got.history if m.parts and m.parts[0].text] == ["weather?"]


def test_legacy_shapes_translate_both_ways():
    from actors.a2a import legacy

    params = legacy.params_in(
        "message/send",
        {
            "message": {
                "kind": "message",
                "messageId": "m",
                "role": "user",
                "parts": [
                    {"kind": "text", "text": "hi"},
                    {"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain"}},
                    {"kind": "data", "data": {"a": 1}},
                ],
            },
            "configuration": {"blocking": False},
        },
    )
    request = wire.SendRequest(params)
    assert request.return_immediately
    assert request.message.parts == [
        {"text": "hi"},
        {"raw": "aGk=", "mediaType": "text/plain"},
        {"data": {"a": 1}},
    ]
    update = legacy.event_out(wire.status_update("c~t", "c", wire.status(wire.INPUT_REQUIRED)))
    assert update["kind"] == "status-update" and update["final"] is True
    assert update["status"]["state"] == "input-required"


# -- input-required: approvals and client tools ------------------------------------------


async def test_a_turn_waiting_for_approval_is_input_required_and_a_decision_resumes_it():
    async with web_server(approval_agent, protocols=BOTH) as server:

        async def run(client: Any) -> tuple[Any, Any, Any]:
            asked = await collect(client, user("weather?", message_id="q"))
            task = asked[0].task
            status = asked[-1].status_update.status
            pending = MessageToDict(status.message.parts[1].data)["pending"]
            decision = {"decisions": [{"id": pending[0]["id"], "approved": True}]}
            answered = await collect(
                client,
                user(message_id="d", task_id=task.id, context_id=task.context_id, data=decision),
            )
            return asked, pending, answered

        asked, pending, answered = await sdk(server, run)
        stored = await server.host.store.load(asked[0].task.context_id)
    assert last_state(asked) == TaskState.TASK_STATE_INPUT_REQUIRED
    assert pending == [
        {
            "id": pending[0]["id"],
            "kind": "approval",
            "tool": "get_weather",
            "input": {"city": "Oslo"},
        }
    ]
    assert answered[0].task.id == asked[0].task.id  # the same task goes on
    assert answer_of(answered) == "It is sunny in Oslo."
    assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
    assert [m.role for m in stored.messages] == ["user", "assistant", "tool"]  # one turn


async def test_a_client_side_tool_is_input_required_and_its_output_resumes_the_task():
    from tests.support.approval_agents import client as client_tool_agent

    async with web_server(client_tool_agent, protocols=BOTH) as server:

        async def run(client: Any) -> tuple[Any, Any]:
            (asked,) = await collect(client, user("where am I?", message_id="q"))
            data = MessageToDict(asked.task.status.message.parts[1].data)["pending"]
            output = {"decisions": [{"output": "Oslo"}]}  # one call waits: no id needed
            (answered,) = await collect(
                client, user(message_id="o", task_id=asked.task.id, data=output)
            )
            return data, answered

        pending, answered = await sdk(server, run, streaming=False)
    assert [(p["kind"], p["tool"]) for p in pending] == [("client", "locate")]
    assert answered.task.status.state == TaskState.TASK_STATE_COMPLETED
    assert "".join(p.text for p in answered.task.artifacts[0].parts) == "It is Oslo."


async def test_an_answer_without_decisions_is_invalid_params_and_records_nothing():
    async with web_server(approval_agent, protocols=BOTH) as server:

        async def run(client: Any) -> Any:
            asked = await collect(client, user("weather?", message_id="q"))
            task = asked[0].task
            with pytest.raises(InvalidParamsError) as caught:
                await collect(client, user("yes please", message_id="d", task_id=task.id))
            again = await client.get_task(GetTaskRequest(id=task.id))
            return caught.value, again

        error, again = await sdk(server, run)
    assert "decisions" in error.message
    assert again.status.state == TaskState.TASK_STATE_INPUT_REQUIRED


async def test_a_new_message_in_the_context_supersedes_a_waiting_task():
    async with web_server(approval_agent, protocols=BOTH) as server:

        async def run(client: Any) -> tuple[Any, Any]:
            asked = await collect(client, user("weather?", message_id="q", context_id="w"))
            await collect(client, user("never mind", message_id="n", context_id="w"))
            return asked[0].task, await client.get_task(GetTaskRequest(id=asked[0].task.id))

        _, old = await sdk(server, run)
    assert old.status.state == TaskState.TASK_STATE_CANCELED


# -- live tasks: subscribe and cancel -----------------------------------------------------


def gated_agent(gate: trio.Event, first: str = "Working. ") -> Agent:
    """Says ``first`` ("Working. "), then waits in a tool until ``gate`` is set, then
    "Done."."""

    @tool
    async def wait_here() -> str:
        """Wait."""
        await gate.wait()
        return "ok"

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return [first, *tool_call("wait_here", {})]
        return ["Done."]

    return Agent(name="slow", provider=ScriptedProvider(responder=script), tools=[wait_here])


@pytest.mark.parametrize("binding", [JSONRPC, REST])
async def test_subscribe_gives_the_running_task_then_its_updates_to_the_end(binding):
    gate = trio.Event()
    async with web_server(gated_agent(gate), protocols=BOTH) as server:
        request = user("go")
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
        (sent,) = await sdk(server, lambda c: collect(c, request), streaming=False, binding=binding)

        async def follow(client: Any) -> list[Any]:
            events = []
            async for event in client.subscribe(SubscribeToTaskRequest(id=sent.task.id)):
                events.append(event)
                if len(events) == 1:
                    trio.from_thread.run_sync(gate.set)
            return events

        events = await sdk(server, follow, binding=binding)
    assert sent.task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    assert events[0].task.id == sent.task.id  # the current Task first
    assert events[0].task.status.state == TaskState.TASK_STATE_WORKING
    assert answer_of(events) == "Working. Done."
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED


async def test_subscribing_to_a_finished_task_is_unsupported_operation():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:

        async def run(client: Any) -> Any:
            events = await collect(client, user("hi"))
            with pytest.raises(UnsupportedOperationError, match="terminal"):
                async for _ in client.subscribe(SubscribeToTaskRequest(id=events[0].task.id)):
                    pass

        await sdk(server, run)


@pytest.mark.parametrize("binding", [JSONRPC, REST])
async def test_cancel_stops_a_running_task_and_is_idempotent(binding):
    gate = trio.Event()
    async with web_server(gated_agent(gate), protocols=BOTH) as server:

        async def run(client: Any) -> tuple[Any, Any, Any]:
            request = user("go", context_id="k")
            request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
            (sent,) = await collect(client, request)
            first = await client.cancel_task(CancelTaskRequest(id=sent.task.id))
            again = await client.cancel_task(CancelTaskRequest(id=sent.task.id))
            return sent, first, again

        _, first, again = await sdk(server, run, binding=binding, streaming=False)
        stored = await server.host.store.load("k")
    assert first.status.state == again.status.state == TaskState.TASK_STATE_CANCELED
    assert stored.messages[1].interrupted  # the turn stopped, saved as interrupted


async def test_cancel_of_a_completed_task_is_task_not_cancelable():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:

        async def run(client: Any) -> None:
            (event,) = await collect(client, user("hi"))
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=event.task.id))

        await sdk(server, run, streaming=False)


async def test_cancel_of_a_task_waiting_for_input_denies_what_it_waits_for():
    async with web_server(approval_agent, protocols=BOTH) as server:

        async def run(client: Any) -> Any:
            asked = await collect(client, user("weather?", message_id="q", context_id="w"))
            return await client.cancel_task(CancelTaskRequest(id=asked[0].task.id))

        canceled = await sdk(server, run, streaming=False)
        stored = await server.host.store.load("w")
        assert server.host.sessions["w"].busy is False
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    call = stored.messages[1].content[-1]
    assert call.awaiting.decided and call.awaiting.approved is False


async def test_subscribing_to_a_turn_the_chat_page_runs_follows_it_to_its_end():
    gate = trio.Event()
    async with web_server(gated_agent(gate), protocols=BOTH) as server:
        session = await server.app.state.axon.session("page")
        events: list[Any] = []

        streaming = trio.Event()

        async def page_turn() -> None:
            async with session.stream("go") as out:
                async for _ in out:
                    streaming.set()  # its assistant message is in the history now

        async with trio.open_nursery() as nursery:
            nursery.start_soon(page_turn)
            await streaming.wait()
            task_id = "page~" + next(m.id for m in session.messages if m.role == "assistant")

            async def follow(client: Any) -> None:
                async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                    events.append(event)
                    if len(events) == 1:
                        trio.from_thread.run_sync(gate.set)

            await sdk(server, follow)
    assert events[0].task.status.state == TaskState.TASK_STATE_WORKING
    assert answer_of(events) == "Working. Done."
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED


# -- attacks -------------------------------------------------------------------------------


async def test_a_cross_site_request_is_refused_and_runs_nothing():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}
            r = await http.post(
                "/a2a/jsonrpc", json=body, headers={"origin": "https://evil.example"}
            )
            rest = await http.post(
                "/a2a/message:send", json={}, headers={"sec-fetch-site": "cross-site"}
            )
        assert r.status_code == 403 and "CSRF" in r.json()["error"]["message"]
        assert r.json()["jsonrpc"] == "2.0"
        assert rest.status_code == 403 and rest.json()["error"]["status"] == "PERMISSION_DENIED"
        assert server.host.sessions == {}


async def test_a_forged_host_is_refused():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:
        with pytest.raises(A2AClientError, match="403"):
            await sdk(server, lambda c: collect(c, user("hi")), headers={"host": "evil.example"})
        assert await server.host.store.list_sessions() == []


async def test_a_missing_or_wrong_token_is_401_and_the_right_one_works():
    async with web_server(hello_agent("Hi."), protocols=BOTH, token="s3cret") as server:
        with pytest.raises(A2AClientError, match="401"):
            await sdk(server, lambda c: collect(c, user("hi")))
        with pytest.raises(A2AError, match="bearer token"):  # REST: the body's reason
            await sdk(
                server,
                lambda c: collect(c, user("hi")),
                headers={"authorization": "Bearer wrong"},
                binding=REST,
            )
        assert server.host.sessions == {}
        events = await sdk(
            server, lambda c: collect(c, user("hi")), headers={"authorization": "Bearer s3cret"}
        )
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{nope", -32700),
        (b"[]", -32600),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "SendMessage"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1}', -32600),
        (b'{"jsonrpc": "2.0", "id": {"x": 1}, "method": "GetTask"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "Nope"}', -32601),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": 1}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": []}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}', -32602),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": '
            b'{"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x"}]}}}',
            -32602,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": '
            b'{"messageId": "m", "role": "ROLE_USER", "parts": [{"nothing": 1}]}}}',
            -32602,
        ),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": 7}}', -32602),
    ],
)
async def test_malformed_jsonrpc_is_answered_in_jsonrpc_shape_and_stores_nothing(body, code):
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            r = await http.post(
                "/a2a/jsonrpc", content=body, headers={"content-type": "application/json"}
            )
        assert r.status_code == 200
        answer = r.json()
        assert answer["jsonrpc"] == "2.0" and set(answer) == {"jsonrpc", "id", "error"}
        assert answer["error"]["code"] == code and answer["error"]["message"]
        assert server.host.sessions == {} and await server.host.store.list_sessions() == []


@pytest.mark.parametrize("binding", [JSONRPC, REST])
async def test_an_unknown_task_id_is_task_not_found(binding):
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:

        async def run(client: Any) -> None:
            for task_id in ("nope", "ctx~missing", "a/b~c", "x" * 300 + "~y"):
                with pytest.raises(TaskNotFoundError):
                    await client.get_task(GetTaskRequest(id=task_id))
                with pytest.raises(TaskNotFoundError):
                    await client.cancel_task(CancelTaskRequest(id=task_id))

        await sdk(server, run, binding=binding)
        assert server.host.sessions == {} and await server.host.store.list_sessions() == []


async def test_a_message_naming_another_contexts_task_is_refused_and_runs_nothing():
    provider = ScriptedProvider(turns=[["A's answer."], ["never"]])
    async with web_server(Agent(name="a", provider=provider), protocols=BOTH) as server:

        async def run(client: Any) -> Any:
            (event,) = await collect(client, user("hi", message_id="1", context_id="alice"))
            with pytest.raises(InvalidParamsError, match="not the context"):
                await collect(
                    client,
                    user("hijack", message_id="2", context_id="mallory", task_id=event.task.id),
                )
            return event

        await sdk(server, run, streaming=False)
        assert len(provider.requests) == 1
        assert "mallory" not in server.host.sessions
        stored = await server.host.store.load("alice")
        assert [m.role for m in stored.messages] == ["user", "assistant"]


async def test_a_cancel_naming_a_task_under_another_context_cancels_nothing():
    gate = trio.Event()
    async with web_server(gated_agent(gate), protocols=BOTH) as server:
        request = user("go", message_id="1", context_id="alice")
        request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
        (sent,) = await sdk(server, lambda c: collect(c, request), streaming=False)
        forged = "mallory~" + sent.task.id.split("~", 1)[1]  # alice's turn, mallory's context

        async def cancel(client: Any) -> None:
            with pytest.raises(TaskNotFoundError):
                await client.cancel_task(CancelTaskRequest(id=forged))

        await sdk(server, cancel)
        assert server.host.sessions["alice"].busy  # alice's task runs on
        gate.set()
        await wait_idle(server, "alice")
        got = await sdk(server, lambda c: c.get_task(GetTaskRequest(id=sent.task.id)))
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert "mallory" not in server.host.sessions


async def test_tasks_past_the_running_cap_are_refused_until_one_ends(monkeypatch):
    from runtime.app.web import a2a_tasks

    monkeypatch.setattr(a2a_tasks, "RUNNING_TASKS", 1)
    gate = trio.Event()
    async with web_server(gated_agent(gate), protocols=BOTH) as server:
        first = user("go", message_id="1", context_id="a")
        first.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
        await sdk(server, lambda c: collect(c, first), streaming=False)
        async with httpx.AsyncClient(base_url=server.url) as http:
            message = {
                "messageId": "2",
                "contextId": "b",
                "role": "ROLE_USER",
                "parts": [{"text": "x"}],
            }
            refused = await http.post("/a2a/message:send", json={"message": message})
        assert refused.status_code == 429
        assert refused.json()["error"]["details"][0]["reason"] == "UNSUPPORTED_OPERATION"
        assert "b" not in server.host.sessions
        gate.set()
        await wait_idle(server, "a")
        second = await sdk(server, lambda c: collect(c, user("x", message_id="2", context_id="b")))
    assert last_state(second) == TaskState.TASK_STATE_COMPLETED


async def test_a_huge_message_is_refused_in_the_bindings_shape_and_stores_nothing():
    limit = 64 << 10
    async with web_server(hello_agent("Hi."), protocols=BOTH, max_body=limit) as server:
        huge = {
            "message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "x" * limit}]}
        }
        async with httpx.AsyncClient(base_url=server.url) as http:
            rpc = await http.post(
                "/a2a/jsonrpc",
                json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": huge},
            )
            rest = await http.post("/a2a/message:send", json=huge)
        assert rpc.status_code == 413 and rpc.json()["error"]["code"] == -32600
        assert rest.status_code == 413 and rest.json()["error"]["details"][0]["reason"]
        assert server.host.sessions == {} and await server.host.store.list_sessions() == []


async def test_a_message_of_too_many_parts_is_invalid_params():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:
        parts = [{"text": "x"}] * 5000
        params = {"message": {"messageId": "m", "role": "ROLE_USER", "parts": parts}}
        async with httpx.AsyncClient(base_url=server.url) as http:
            r = await http.post(
                "/a2a/jsonrpc",
                json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": params},
            )
        assert r.json()["error"]["code"] == -32602 and "parts" in r.json()["error"]["message"]
        assert server.host.sessions == {}


async def test_media_over_the_agents_limits_is_invalid_params():
    from runtime.media import MediaLimits

    agent = Agent(
        name="small", provider=ScriptedProvider(["x"]), media_limits=MediaLimits(image_bytes=1024)
    )
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 4096
    async with web_server(agent, protocols=BOTH) as server:
        request = user("look")
        request.message.parts.append(Part(raw=png, media_type="image/png"))
        with pytest.raises(InvalidParamsError, match="limit"):
            await sdk(server, lambda c: collect(c, request))
        assert server.host.sessions == {}


async def test_a_body_not_sent_as_json_is_415():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            r = await http.post(
                "/a2a/message:send", content=b"{}", headers={"content-type": "text/plain"}
            )
        assert r.status_code == 415 and r.json()["error"]["status"] == "INVALID_ARGUMENT"


async def test_only_the_named_protocols_are_mounted():
    async with web_server(hello_agent("Hi.")) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get(wire.CARD_PATH)).status_code == 404
    async with web_server(hello_agent("Hi."), protocols=("a2a",)) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get("/api/info")).status_code == 404
            assert (await http.get(wire.CARD_PATH)).status_code == 200


async def test_finished_tasks_past_the_limit_are_read_back_from_the_store(monkeypatch):
    from runtime.app.web import a2a_tasks

    monkeypatch.setattr(a2a_tasks, "LIVE_TASKS", 1)
    async with web_server(hello_agent("One.", "Two."), protocols=BOTH) as server:

        async def send_two(client: Any) -> Any:
            (first,) = await collect(client, user("1", message_id="1", context_id="c"))
            await collect(client, user("2", message_id="2", context_id="c"))
            return first.task

        first = await sdk(server, send_two, streaming=False)
        book = server.app.router.routes[-1].app.tasks  # the /a2a mount's task book
        assert len(book.live) == 1 and first.id not in book.live
        again = await sdk(server, lambda c: c.get_task(GetTaskRequest(id=first.id)))
    assert again.status.state == TaskState.TASK_STATE_COMPLETED
    assert "".join(p.text for p in again.artifacts[0].parts) == "One."
    assert [m.message_id for m in again.history] == ["1"]


async def test_another_protocol_version_is_version_not_supported():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "c~t"}}
            r = await http.post("/a2a/jsonrpc", json=body, headers={"a2a-version": "0.3"})
    assert r.json()["error"]["code"] == -32009


async def test_a_malformed_rest_body_is_a_google_rpc_status():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            bad = await http.post(
                "/a2a/message:send", content=b"{nope", headers={"content-type": "application/json"}
            )
            wrong = await http.get("/a2a/message:send")
            missing = await http.get("/a2a/nothing")
        assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert wrong.status_code == 405 and set(wrong.json()["error"]) >= {"code", "message"}
        assert missing.status_code == 404
        assert missing.json()["error"]["details"][0]["reason"] == "METHOD_NOT_FOUND"
        assert server.host.sessions == {}


JUNK = st.recursive(
    st.none() | st.booleans() | st.text(max_size=5) | st.integers(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=9), inner),
    max_leaves=8,
)
PART = st.fixed_dictionaries(
    {},
    optional={"text": JUNK, "raw": JUNK, "url": JUNK, "data": JUNK, "mediaType": JUNK},
)
PARAMS = JUNK | st.fixed_dictionaries(
    {},
    optional={
        "message": JUNK
        | st.fixed_dictionaries(
            {},
            optional={
                "messageId": JUNK,
                "role": st.sampled_from(["ROLE_USER", 1, "ROLE_AGENT"]) | JUNK,
                "parts": JUNK | st.lists(PART, max_size=3),
                "taskId": JUNK,
                "contextId": JUNK,
            },
        ),
        "configuration": JUNK,
    },
)


@given(PARAMS)
def test_any_send_params_parse_or_are_an_a2a_error(params):
    from runtime.errors import InvalidMedia

    try:
        request = wire.SendRequest(params)
        wire.user_input(request.message.parts)
    except wire.A2AError as exc:
        assert exc.code in (-32602, -32003) and exc.message
    except InvalidMedia as exc:  # a bad image or file: the endpoint's ContentTypeNotSupported
        assert str(exc)


# -- A2AAgent: delegating to a remote A2A agent -------------------------------------------


def lead_agent(remote: Any) -> Agent:
    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return [*tool_call("researcher", {"input": "what is trio?"}, tool_call_id="P1")]
        last = request.messages[-1]
        return [f"Summary: {last.output if last.error is None else last.error}"]

    return Agent(name="lead", provider=ScriptedProvider(responder=script), tools=[remote])


async def test_a_remote_agent_streams_nested_under_the_tool_call_like_a_sub_agent():
    researcher = Agent(name="researcher", provider=ScriptedProvider(["Trio is structured."]))
    async with web_server(researcher, protocols=BOTH, token="tok") as server:
        remote = A2AAgent(server.url, token="tok").as_tool(name="researcher")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead_agent(remote), session_id="p")
            async with session.stream("explain trio") as out:
                chunks = [c async for c in out]
    check_grammar(chunks)
    nested = [c for c in chunks if c.type == "tool-stream"]
    assert nested and all(c.tool_call_id == "P1" and c.tool_name == "researcher" for c in nested)
    inner = [c.chunk for c in nested]
    check_grammar(inner)  # the remote task as a complete, well-formed stream of its own
    assert "".join(c.text for c in inner if c.type == "text-delta") == "Trio is structured."
    types = [c.type for c in chunks]
    assert types.index("tool-stream") < types.index("tool-result")
    result = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert result.output == "Trio is structured."
    assert out.result.text == "Summary: Trio is structured."


async def test_a_failed_remote_task_is_a_tool_error_the_model_sees():
    def fail(request: Any) -> Any:
        raise ValueError("boom")

    broken = Agent(name="researcher", provider=ScriptedProvider(responder=fail))
    async with web_server(broken, protocols=BOTH) as server:
        remote = A2AAgent(server.url).as_tool(name="researcher")
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead_agent(remote), session_id="p")
            result = await session.run("explain trio")
    message = next(m for m in session.messages if isinstance(m, ToolMessage))
    assert message.error is not None and "failed" in message.error and "boom" in message.error
    assert result.text.startswith("Summary: ")


async def test_discover_names_the_tool_from_the_agent_card():
    async with web_server(hello_agent("Hi."), protocols=BOTH) as server:
        remote = await A2AAgent.discover(server.url)
        spec = remote.as_tool().spec()
        assert await remote.run("hi") == "Hi."
    assert spec["name"] == "helper"
    assert list(spec["parameters"]["properties"]) == ["input"]


async def test_a_remote_agent_with_a_wrong_token_is_a_remote_agent_error():
    async with web_server(hello_agent("Hi."), protocols=BOTH, token="tok") as server:
        with pytest.raises(RemoteAgentError, match="bearer token"):
            await A2AAgent(server.url, token="wrong").run("hi")


async def test_a_remote_task_that_asks_for_input_is_canceled_and_an_error():
    async with web_server(approval_agent, protocols=BOTH) as server:
        with pytest.raises(RemoteAgentError, match="asked for input"):
            await A2AAgent(server.url).run("weather?")
        (session_id,) = [info.session_id for info in await server.host.store.list_sessions()]
        stored = await server.host.store.load(session_id)
    call = stored.messages[1].content[-1]
    assert call.awaiting.decided and call.awaiting.approved is False  # canceled: denied


def test_the_task_id_carries_its_context():
    from runtime.app.web.a2a_tasks import split_task_id, task_id_of

    assert split_task_id(task_id_of("ctx:1", "task_x_2")) == ("ctx:1", "task_x_2")
    with pytest.raises(wire.A2AError) as caught:
        split_task_id("no-separator")
    assert caught.value.kind == "TaskNotFound"


def test_a_task_dict_parses_as_the_sdks_task():
    from google.protobuf.json_format import ParseDict

    data = wire.task(
        "c~t",
        "c",
        wire.status(
            wire.INPUT_REQUIRED, wire.message(wire.ROLE_AGENT, [{"data": {"a": 1}}], message_id="x")
        ),
        text="partial",
        history=[wire.message(wire.ROLE_USER, [wire.text_part("hi")], message_id="m")],
    )
    task = ParseDict(data, Task())
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert task.artifacts[0].parts[0].text == "partial"


async def test_a_step_that_started_over_replaces_the_answer_artifact_without_its_text():
    from runtime import RetryPolicy
    from runtime.errors import Overloaded

    busy = Overloaded("overloaded", provider="scripted", status_code=529)
    primary = ScriptedProvider([["Half an ans", busy]], name="primary")
    backup = ScriptedProvider([["The whole answer."]], name="backup")
    agent = Agent(name="fb", provider=[primary, backup], retry=RetryPolicy(max_attempts=1))
    async with web_server(agent, protocols=BOTH) as server:
        events = await sdk(server, lambda c: collect(c, user("hi")))
    updates = [e.artifact_update for e in events if e.HasField("artifact_update")]
    texts = [("".join(p.text for p in u.artifact.parts), u.append) for u in updates]
    reset = texts.index(("", False))  # the artifact, whole again, without the void text
    assert reset > 0 and "".join(t for t, _ in texts[:reset]) == "Half an ans"
    answer = ""  # as the spec reads them: an update without append replaces the artifact
    for text, append in texts:
        answer = answer + text if append else text
    assert answer == "The whole answer."
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED


def passing_on(name: str, remote: A2AAgent) -> Agent:
    """An agent that hands every task to ``remote`` (as tool ``other``), then answers
    with what came back, its name first."""

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return [*tool_call("other", {"input": "pass it on"}, tool_call_id=f"{name}1")]
        last = request.messages[-1]
        return [f"{name}: {last.output if last.error is None else last.error}"]

    return Agent(
        name=name,
        provider=ScriptedProvider(responder=script),
        tools=[remote.as_tool(name="other")],
    )


async def test_agents_calling_each_other_over_a2a_stop_at_max_depth():
    # A -> B -> A over A2A: as_tool's depth bound held only within one host; each hop
    # here is another server's turn, so the loop ran until a server's 100 running tasks
    # were all taken. The message's hop count (metadata axonHops) now carries the depth.
    to_a, to_b = A2AAgent("http://127.0.0.1:9"), A2AAgent("http://127.0.0.1:9")
    a, b = passing_on("a", to_b), passing_on("b", to_a)
    async with web_server(a, protocols=("a2a",)) as server_a:
        async with web_server(b, protocols=("a2a",)) as server_b:
            to_a.url, to_b.url = server_a.url, server_b.url  # their ports, known now
            async with Host.open(log_tap=False) as host:
                session = await host.open_session(a, session_id="top")
                with trio.fail_after(60):
                    result = await session.run("start")
            depths = {}
            for server in (server_a, server_b):
                for info in await server.host.store.list_sessions():
                    record = await server.host.store.load(info.session_id)
                    depths[record.meta.get("agent_depth")] = server is server_a
    refused = (
        "tool other raised RuntimeError: agent nesting deeper than 8: other was not called "
        "(agents calling agents, over A2A too, 8 deep already)"
    )
    assert result.text == "a: b: a: b: a: b: a: b: a: " + refused
    # hops 1 to 8, B's the odd ones: the 8th's call sent nothing
    assert depths == {d: d % 2 == 0 for d in range(1, 9)}


class ForgetfulA2AAgent(A2AAgent):
    """A caller that resets the hop count: every message it sends says ``axonHops: 0``
    (another A2A SDK's agent sends none; a hostile one, whatever it likes)."""

    async def _answer(self, text: str, nested: Any, depth: int) -> None:
        await super()._answer(text, nested, -1)  # (what the tool calls, and run)


async def test_a_loop_through_an_agent_that_resets_the_hop_count_stops_at_max_in_flight():
    # A -> B -> A where B sends every message with the hop count reset: A's turns all
    # run at depth 0, so max_depth never bites and the loop ran until a server's 100
    # running tasks were taken. A's tool to B holds one call more each round.
    to_a, to_b = ForgetfulA2AAgent("http://127.0.0.1:9"), A2AAgent("http://127.0.0.1:9")
    b = passing_on("b", to_a)
    a = Agent(
        name="a",
        provider=passing_on("a", to_b).provider,
        tools=[to_b.as_tool(name="other", max_in_flight=3)],
    )
    async with web_server(a, protocols=("a2a",)) as server_a:
        async with web_server(b, protocols=("a2a",)) as server_b:
            to_a.url, to_b.url = server_a.url, server_b.url
            async with Host.open(log_tap=False) as host:
                session = await host.open_session(a, session_id="top")
                with trio.fail_after(60):
                    result = await session.run("start")
            depths = []
            for server in (server_a, server_b):
                infos = await server.host.store.list_sessions()
                records = [await server.host.store.load(i.session_id) for i in infos]
                depths.append([r.meta.get("agent_depth") for r in records])
    refused = (
        "tool other raised RuntimeError: other has 3 calls in flight, its max_in_flight: it "
        "was not called (agents calling agents in a loop that drops the hop count hold one "
        "call more each round)"
    )
    assert result.text == "a: b: a: b: a: b: a: " + refused
    # A's tasks run at depth 0 (no meta) each time: only the ceiling stopped the loop
    assert depths == [[None, None, None], [1, 1, 1]]


def depth_teller() -> Agent:
    """An agent that answers with the depth its turn runs at (a tool's ``context.depth``)."""

    @tool
    def my_depth(context: ToolContext) -> str:
        """How deep this agent runs."""
        return f"depth {context.depth}"

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return [*tool_call("my_depth", {}, tool_call_id="d")]
        return [request.messages[-1].output]

    return Agent(name="d", provider=ScriptedProvider(responder=script), tools=[my_depth])


async def test_a_message_cannot_lower_the_depth_its_context_runs_at():
    # A caller re-using a context with a smaller hop count reset the chain's depth.
    # (Raw JSON-RPC: the SDK's metadata is a protobuf Struct, whose numbers are floats.)
    texts = []
    async with web_server(depth_teller(), protocols=("a2a",)) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            for n, hops in enumerate((6, 1)):
                message = {
                    "messageId": f"m{n}",
                    "contextId": "c",
                    "role": "ROLE_USER",
                    "parts": [{"text": "how deep?"}],
                    "metadata": {"axonHops": hops},
                }
                body = {"jsonrpc": "2.0", "id": n, "method": "SendMessage"}
                r = await http.post("/a2a/jsonrpc", json={**body, "params": {"message": message}})
                texts.append(r.json()["result"]["task"]["artifacts"][0]["parts"][0]["text"])
    assert texts == ["depth 6", "depth 6"]


def test_a_hop_count_is_a_positive_int_or_none():
    assert [wire.hops({"axonHops": v}) for v in (3, 0, -1, True, "3", 2.0)] == [3, 0, 0, 0, 0, 0]
    assert wire.hops(None) == wire.hops(["axonHops"]) == 0


def test_a2a_agent_as_tool_refuses_a_max_depth_below_one():
    with pytest.raises(ToolDefinitionError, match="max_depth must be an int >= 1"):
        A2AAgent("http://127.0.0.1:9").as_tool(max_depth=0)


async def test_a_task_approved_then_superseded_before_it_resumed_reads_canceled(tmp_path):
    """A decision recorded (``decide`` without ``resume``, or a ``serve`` stopped before
    the continuation), then a new message in the context: that message's turn runs the
    approved call, but the task's own turn never answered it. Read from the store (after
    a restart), it is ``canceled``, as the task the live adapter superseded reads; it
    read ``completed``."""
    store = str(tmp_path / "a.db")
    async with web_server(approval_agent, protocols=BOTH, store=store) as server:

        async def ask(client: Any) -> Any:
            return (await collect(client, user("weather?", message_id="q", context_id="w")))[0]

        asked = await sdk(server, ask)
        session = server.host.sessions["w"]
        (call,) = session.pending
        await session.decide(call.approval_id, approved=True)
    async with web_server(approval_agent, protocols=BOTH, store=store) as server:

        async def supersede(client: Any) -> tuple[Any, Any]:
            new = await collect(client, user("never mind", message_id="n", context_id="w"))
            return new, await client.get_task(GetTaskRequest(id=asked.task.id))

        _, old = await sdk(server, supersede)
        stored = await server.host.store.load("w")
    assert [m.role for m in stored.messages] == ["user", "assistant", "tool", "user", "assistant"]
    assert stored.messages[2].output == "sunny in Oslo"  # the approval held: the call ran
    assert old.status.state == TaskState.TASK_STATE_CANCELED
