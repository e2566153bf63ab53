"""A sub-agent's client-side tool passed up (``as_tool(pass_approvals=True)``):
the calling turn suspends for it, its stream shows the sub-agent's call (under the id
``<call id>.<sub call id>``, named by the client tool), and the caller's output for it
reaches the sub-agent, which finishes; then the calling turn goes on in the same
assistant message. Embedded host, SQLite."""

from __future__ import annotations

import json
from typing import Any

import attrs
import httpx
import pytest
import trio
from a2a.types.a2a_pb2 import TaskState
from google.protobuf.json_format import MessageToDict

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from runtime import Agent, AlreadyDecided, Budget, CallerDecides, Host, InvalidDecision, Tool
from runtime.actor_messages import InferRequest
from runtime.app.web.ui_stream import ui_messages
from runtime.approval import WAITING_META, pending_calls, waiting_calls
from runtime.messages import AssistantMessage, ToolMessage, UserMessage
from runtime.output import ToolCall
from runtime.serde import converter
from tests.support.faults import check_history
from tests.support.grammar import check_grammar
from tests.test_a2a import BOTH, collect, sdk
from tests.test_a2a import user as a2a_user
from tests.test_agui import run as agui_run
from tests.test_agui import run_input, user
from tests.test_approval_nested_pass_owner import _load, trio_wall
from tests.test_approval_web import answer, post
from tests.test_sqlite_attacks import _providers_take
from tests.test_web_http import body
from tests.web.harness import WEB, ensure_ai_package, web_server

SUB = "s.helper.H"
ASKED = "H.L"
sub_steps: list[int] = []

locate = Tool.client(
    "locate",
    {"type": "object", "properties": {"precise": {"type": "boolean"}}},
    "Where the user is.",
    output_schema={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


def _last_result(request: InferRequest) -> ToolMessage:
    return [m for m in request.messages if isinstance(m, ToolMessage)][-1]


def _helper_model(request: InferRequest) -> list:
    step = current_step(request.messages)
    sub_steps.append(step)
    if step == 0:
        return tool_call("locate", {"precise": True}, tool_call_id="L")
    result = _last_result(request)
    if result.error is not None:
        return [f"unknown place: {result.error}"]
    return [f"you are in {result.output['city']}"]


def _parent_model(request: InferRequest) -> list:
    said = [m.content for m in request.messages if isinstance(m, UserMessage)][-1]
    if said == "never mind":
        return ["fine"]
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "where am I"}, tool_call_id="H")
    result = _last_result(request)
    return [f"parent saw: {result.output if result.error is None else result.error}"]


def helper(**kw: Any) -> Agent:
    return Agent(
        name="helper", provider=ScriptedProvider(responder=_helper_model), tools=[locate], **kw
    )


def parent(**kw: Any) -> Agent:
    return Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper(**kw).as_tool(pass_approvals=True)],
    )


@pytest.fixture(autouse=True)
def _clear() -> None:
    sub_steps.clear()


async def _suspend(host: Host, agent: Agent | None = None) -> tuple[Any, Any, list]:
    session = await host.open_session(agent or parent(), session_id="s")
    async with session.stream("go") as out:
        chunks = [c async for c in out]
    return session, out.result, chunks


async def test_the_sub_agents_client_call_suspends_the_calling_turn_and_is_shown(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        _, result, chunks = await _suspend(host)
        stored = await host.store.load("s")
        sub = await host.store.load(SUB)
    assert result.finish_reason == "awaiting-input"
    assert [(p.approval_id, p.tool_call_id, p.kind) for p in result.pending] == [
        (ASKED, "H", "client")
    ]
    calls = [(c.tool_call_id, c.tool_name, c.input) for c in chunks if isinstance(c, ToolCall)]
    assert calls == [("H", "helper", {"input": "where am I"}), (ASKED, "locate", {"precise": True})]
    check_grammar(chunks)
    assert stored.meta[WAITING_META] == 1
    (w,) = [c for c in waiting_calls(list(sub.messages))]
    assert (w.tool_call_id, w.kind, w.decided) == ("L", "client", False)
    assert sub_steps == [0]


async def test_the_callers_output_reaches_the_sub_agent_and_both_turns_finish(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, asked, _ = await _suspend(host)
        await session.decide(ASKED, output={"city": "Paris"})
        async with session.resume() as out:
            chunks = [c async for c in out]
        result = out.result
        stored = await host.store.load("s")
        sub = await host.store.load(SUB)
    assert (result.finish_reason, result.text) == ("stop", "parent saw: you are in Paris")
    check_grammar(chunks)
    assert sub_steps == [0, 1]
    (located,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    assert (located.tool_call_id, located.output) == ("L", {"city": "Paris"})
    answers = [m for m in stored.messages if isinstance(m, AssistantMessage)]
    assert len(answers) == 1 and answers[0].id == asked.pending[0].message_id  # the same message
    (h,) = [m for m in stored.messages if isinstance(m, ToolMessage)]
    assert (h.tool_call_id, h.output) == ("H", "you are in Paris")


async def test_a_client_error_is_the_sub_agents_to_answer(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        result = await session.respond(ASKED, error="location denied")
    assert result.text == "parent saw: unknown place: location denied"


@pytest.mark.parametrize(
    "answer",
    [{"output": {"town": "Paris"}}, {"approved": True}, {"output": {"city": 3}}],
    ids=["schema", "approval", "type"],
)
async def test_an_output_that_does_not_fit_the_client_tools_schema_is_refused(tmp_path, answer):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        before = await host.store.load("s")
        with pytest.raises(InvalidDecision):
            await session.decide(ASKED, **answer)
        after = await host.store.load("s")
        sub = await host.store.load(SUB)
        result = await session.respond(ASKED, output={"city": "Rome"})
    assert after.version == before.version and after.messages == before.messages
    assert [c.decided for c in pending_calls(list(sub.messages))] == [False]
    assert result.text == "parent saw: you are in Rome"


async def test_an_answer_sent_to_the_sub_session_is_refused(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        sub_session = await host.open_session(helper(), session_id=SUB)
        with pytest.raises(CallerDecides):
            await sub_session.respond("L", output={"city": "Oslo"})
        await sub_session.close()
        result = await session.respond(ASKED, output={"city": "Rome"})
    assert result.text == "parent saw: you are in Rome"
    assert sub_steps == [0, 1]


async def test_two_racing_answers_one_wins(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        outcomes: list[Any] = []

        async def answer(city: str) -> None:
            try:
                outcomes.append(await session.decide(ASKED, output={"city": city}))
            except AlreadyDecided as exc:
                outcomes.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer, "Paris")
            nursery.start_soon(answer, "Rome")
        async with session.resume() as out:
            async for _ in out:
                pass
        sub = await host.store.load(SUB)
    assert sum(isinstance(o, AlreadyDecided) for o in outcomes) == 1
    (located,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    assert out.result.text == f"parent saw: you are in {located.output['city']}"
    assert sub_steps == [0, 1]


async def test_the_sub_agents_timeout_expires_the_calling_wait(autojump_clock):
    async with Host.open(log_tap=False) as host:
        host.clock = trio_wall
        session = await host.open_session(parent(approval_timeout=60), session_id="s")
        asked = await session.run("go")
        deadline = session.messages[1].content[0].awaiting.expires_at
        await trio.sleep(61)
        await trio.sleep(1)
        text = "".join(getattr(p, "text", "") for p in session.messages[1].content)
        sub = await host.store.load(SUB)
        with pytest.raises(AlreadyDecided):
            await session.decide(ASKED, output={"city": "Paris"})
    assert asked.finish_reason == "awaiting-input" and deadline == trio_wall() - 62 + 60
    assert text == "parent saw: unknown place: timed out"
    (located,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    assert located.error == "timed out" and sub_steps == [0, 1]


async def test_the_stored_histories_of_caller_and_sub_session_map_to_every_provider(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        waiting = await host.store.load("s")
        await session.respond(ASKED, output={"city": "Paris"})
        caller = await host.store.load("s")
        sub = await host.store.load(SUB)
    assert [m.role for m in caller.messages] == ["user", "assistant", "tool"]
    assert [m.role for m in sub.messages] == ["user", "assistant", "tool"]
    for record in (caller, sub):
        check_history(list(record.messages))
        _providers_take(list(record.messages))
    # while it waits, the caller's stored call keeps the sub call's request (round trip)
    (part,) = [p for p in waiting.messages[1].content if getattr(p, "awaiting", None)]
    assert (part.awaiting.id, part.awaiting.sub_tool, part.awaiting.sub_input) == (
        ASKED,
        "locate",
        {"precise": True},
    )
    assert (part.awaiting.kind, part.awaiting.nested, part.awaiting.decided) == (
        "client",
        True,
        False,
    )


def _locates_twice_model(request: InferRequest) -> list:
    step = current_step(request.messages)
    sub_steps.append(step)
    if step < 2:
        return tool_call("locate", {"precise": step == 1}, tool_call_id=f"L{step}")
    cities = [m.output["city"] for m in request.messages if isinstance(m, ToolMessage)]
    return [" then ".join(cities)]


async def test_a_second_client_call_of_the_sub_agent_is_passed_up_in_turn(tmp_path):
    helper2 = Agent(
        name="helper", provider=ScriptedProvider(responder=_locates_twice_model), tools=[locate]
    )
    agent = Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper2.as_tool(pass_approvals=True)],
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, first, _ = await _suspend(host, agent)
        await session.decide("H.L0", output={"city": "Paris"})
        async with session.resume() as out:
            chunks = [c async for c in out]
        again = out.result
        result = await session.respond("H.L1", output={"city": "Rome"})
    assert [p.approval_id for p in first.pending] == ["H.L0"]
    assert again.finish_reason == "awaiting-input"
    assert [p.approval_id for p in again.pending] == ["H.L1"]
    calls = [(c.tool_call_id, c.tool_name, c.input) for c in chunks if isinstance(c, ToolCall)]
    assert calls == [("H.L1", "locate", {"precise": True})]
    check_grammar(chunks)
    assert result.text == "parent saw: Paris then Rome" and sub_steps == [0, 1, 2]


async def test_a_new_message_to_the_caller_ends_the_sub_agents_client_wait(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        assert (await session.run("never mind")).text == "fine"
        sub = await host.store.load(SUB)
        sub_session = await host.open_session(helper(), session_id=SUB)
        with pytest.raises(AlreadyDecided):
            await sub_session.respond("L", output={"city": "Oslo"})
    assert waiting_calls(list(sub.messages)) == ()
    (located,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    assert located.tool_call_id == "L" and located.error is not None and sub_steps == [0]


def _middle_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("helper", {"input": "where"}, tool_call_id="M")
    return [f"middle saw: {_last_result(request).output}"]


async def test_two_agents_deep_the_top_session_answers_the_client_call(tmp_path):
    middle = Agent(
        name="middle",
        provider=ScriptedProvider(responder=_middle_model),
        tools=[helper().as_tool(pass_approvals=True)],
    )
    top = Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[middle.as_tool(name="helper", pass_approvals=True)],
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, asked, chunks = await _suspend(host, top)
        with pytest.raises(InvalidDecision):  # the leaf tool's schema, two levels down
            await session.decide("H.M.L", output={"town": "Paris"})
        result = await session.respond("H.M.L", output={"city": "Paris"})
    assert [p.approval_id for p in asked.pending] == ["H.M.L"]
    calls = [(c.tool_call_id, c.tool_name) for c in chunks if isinstance(c, ToolCall)]
    assert calls == [("H", "helper"), ("H.M.L", "locate")]
    assert result.text == "parent saw: middle saw: you are in Paris"


async def test_an_output_given_but_never_continued_reaches_the_sub_agent_before_a_new_message(
    tmp_path,
):
    """The caller's output recorded, then a new message instead of the continuation:
    as an approved call, it runs first (its sub-agent takes the output and answers),
    and the calling model sees the sub-agent's answer, not the raw output."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        await session.decide(ASKED, output={"city": "Paris"})
        assert (await session.run("never mind")).text == "fine"
        caller = await host.store.load("s")
        sub = await host.store.load(SUB)
    (h,) = [m for m in caller.messages if isinstance(m, ToolMessage)]
    assert (h.tool_call_id, h.output, h.error) == ("H", "you are in Paris", None)
    (located,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    assert located.output == {"city": "Paris"} and sub_steps == [0, 1]


def _sub_part(output: Any, **extra: Any) -> dict[str, Any]:
    """The tool part ``useChat`` sends back once ``addToolOutput`` answered the call."""
    return {
        "type": "tool-locate",
        "toolCallId": ASKED,
        "state": "output-available",
        "input": {"precise": True},
        "output": output,
        **extra,
    }


async def test_the_ai_sdk_stream_shows_the_sub_call_and_its_continuation_answers_it(tmp_path):
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            message_id = first[0]["messageId"]
            sent = answer("s", message_id, _sub_part({"city": "Paris"}))
            # the agent tool's own part, as the page holds it, is passed over
            sent["messages"][-1]["parts"].insert(
                1,
                {
                    "type": "tool-helper",
                    "toolCallId": "H",
                    "state": "input-available",
                    "input": {"input": "where am I"},
                },
            )
            second = await post(client, sent)
    shown = [c for c in first[:-1] if c["type"] == "tool-input-available"]
    assert [(c["toolCallId"], c["toolName"], c["input"]) for c in shown] == [
        ("H", "helper", {"input": "where am I"}),
        ("H", "helper", {"input": "where am I"}),  # again: run by the server (useChat's)
        (ASKED, "locate", {"precise": True}),
    ]
    assert [c.get("providerExecuted") for c in shown] == [None, True, None]
    assert first[-2]["type"] == "finish" and first[-2]["finishReason"] == "tool-calls"
    assert second[0] == {"type": "start", "messageId": message_id}
    done = [c for c in second[:-1] if c["type"] == "tool-output-available"]
    assert [(c["toolCallId"], c["output"]) for c in done if not c.get("preliminary")] == [
        ("H", "you are in Paris")
    ]
    text = "".join(c["delta"] for c in second[:-1] if c["type"] == "text-delta")
    assert text == "parent saw: you are in Paris" and sub_steps == [0, 1]


@pytest.mark.parametrize(
    "part",
    [
        _sub_part({"town": "Paris"}),  # not the client tool's output schema
        _sub_part({"city": "Paris"}, input={"precise": False}),  # another input
        {**_sub_part({"city": "Paris"}), "type": "tool-helper"},  # another tool
    ],
    ids=["schema", "input", "tool"],
)
async def test_an_ai_sdk_answer_that_does_not_fit_is_a_400_and_nothing_changes(tmp_path, part):
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            first = await post(client, body("s"))
            before = await _load("s", tmp_path)
            response = await client.post("/api/chat", json=answer("s", first[0]["messageId"], part))
            after = await _load("s", tmp_path)
            then = await post(client, answer("s", first[0]["messageId"], _sub_part({"city": "X"})))
    assert response.status_code == 400, response.text
    assert (after.version, after.messages) == (before.version, before.messages)
    text = "".join(c["delta"] for c in then[:-1] if c["type"] == "text-delta")
    assert text == "parent saw: you are in X"


async def test_an_ai_sdk_answer_sent_to_the_sub_session_is_a_409(tmp_path):
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            await post(client, body("s"))
            sub = await _load(SUB, tmp_path)
            part = {
                "type": "tool-locate",
                "toolCallId": "L",
                "state": "output-available",
                "input": {"precise": True},
                "output": {"city": "Oslo"},
            }
            response = await client.post("/api/chat", json=answer(SUB, sub.messages[1].id, part))
            after = await _load(SUB, tmp_path)
    assert response.status_code == 409, response.text
    assert "'s'" in response.json()["error"]
    assert [c.decided for c in pending_calls(list(after.messages))] == [False]


async def test_a_reloaded_page_gets_the_sub_call_to_answer_and_then_its_answer(tmp_path):
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host)
        waiting = ui_messages((await host.store.load("s")).messages)
        await session.respond(ASKED, output={"city": "Paris"})
        done = ui_messages((await host.store.load("s")).messages)

    def tools(messages: list) -> list:
        return [
            (p["toolCallId"], p["type"], p["state"], p.get("output"))
            for p in messages[-1]["parts"]
            if p["type"].startswith("tool-")
        ]

    assert tools(waiting) == [
        ("H", "tool-helper", "input-available", None),
        (ASKED, "tool-locate", "input-available", None),
    ]
    assert tools(done) == [
        ("H", "tool-helper", "output-available", "you are in Paris"),
        (ASKED, "tool-locate", "output-available", {"city": "Paris"}),
    ]


async def test_the_ai_package_answers_the_sub_call_and_the_turn_goes_on_in_its_message(tmp_path):
    node = ensure_ai_package()
    async with web_server(parent(), store=str(tmp_path / "w.db")) as server:
        config = {"url": server.url, "chatId": "s", "tool": "locate", "output": {"city": "Oz"}}
        with trio.fail_after(60):
            proc = await trio.run_process(
                [node, str(WEB / "sub_client_chat.mjs"), json.dumps(config)],
                capture_stdout=True,
                cwd=WEB,
            )
        async with httpx.AsyncClient(base_url=server.url) as client:
            stored = (await client.get("/api/sessions/s")).json()
    chat = json.loads(proc.stdout)
    assert chat["error"] is None and chat["status"] == "ready"
    assert [(c["toolCallId"], c["toolName"]) for c in chat["calls"]] == [
        ("H", "helper"),
        (ASKED, "locate"),
    ]
    _, second = chat["bodies"]
    assert (
        second["trigger"] == "submit-message" and second["messageId"] == chat["messages"][-1]["id"]
    )
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant"]
    message = chat["messages"][-1]
    states = [
        (p["toolCallId"], p["state"], p.get("output"))
        for p in message["parts"]
        if p["type"].startswith("tool-")
    ]
    assert states == [
        ("H", "output-available", "you are in Oz"),
        (ASKED, "output-available", {"city": "Oz"}),
    ]
    assert [p["text"] for p in message["parts"] if p["type"] == "text"] == [
        "parent saw: you are in Oz"
    ]
    assert message["parts"] == stored["ui_messages"][-1]["parts"]


pick = Tool.client("pick", {"type": "object", "properties": {}}, "Pick a color.")


def _picks_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("pick", {}, tool_call_id="P")
    return [f"picked {_last_result(request).output}"]


async def test_an_ag_ui_run_names_the_sub_call_pending_and_the_next_run_answers_it():
    picker = Agent(name="helper", provider=ScriptedProvider(responder=_picks_model), tools=[pick])
    agent = Agent(
        name="top",
        provider=ScriptedProvider(responder=_parent_model),
        tools=[picker.as_tool(pass_approvals=True)],
    )
    async with web_server(agent, protocols=("ag-ui",)) as server:
        first = await agui_run(server, run_input("t", user("go", "m1")))
        history = [
            user("go", "m1"),
            {"id": "answer-1", "role": "tool", "toolCallId": "H.P", "content": "red"},
        ]
        second = await agui_run(server, run_input("t", *history, runId="r2"))
    starts = [(e["toolCallId"], e["toolCallName"]) for e in first if e["type"] == "TOOL_CALL_START"]
    wire = starts[0][0].removesuffix("H")  # the wire ids' <message id>.s<step>.
    assert wire.startswith("msg_") and wire.endswith(".s0.")
    assert starts == [(wire + "H", "helper"), (wire + "H.P", "pick")]
    assert first[-1]["outcome"] == {"type": "success", "pendingToolCallIds": [wire + "H.P"]}
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "parent saw: picked red"


async def test_a_takeover_of_the_waiting_calling_turn_shows_the_sub_call_again(tmp_path):
    """A worker taking the waiting calling turn over (``resume=True``) streams its
    suspended step as stored: the agent tool's call and, after it, the sub call to
    answer (before this change it showed the agent tool's call alone)."""
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(parent(), session_id="s")
        ids = {"turn_id": "turn_w", "message_id": "msg_w", "resume": True}
        async with session.stream("go", **ids) as out:
            first = [c async for c in out]
        async with session.stream("go", **ids) as out:
            again = [c async for c in out]
        result = out.result
    assert result.finish_reason == "awaiting-input"
    check_grammar(again)

    def calls(chunks: list) -> list:
        return [(c.tool_call_id, c.tool_name, c.input) for c in chunks if isinstance(c, ToolCall)]

    assert (
        calls(again)
        == calls(first)
        == [
            ("H", "helper", {"input": "where am I"}),
            (ASKED, "locate", {"precise": True}),
        ]
    )
    assert sub_steps == [0]


def _echo_model(request: InferRequest) -> list:
    if current_step(request.messages) == 0:
        return tool_call("locate", {"precise": True}, tool_call_id="L")
    result = _last_result(request)
    return [f"error: {result.error}" if result.error else f"got {len(str(result.output))}"]


async def test_an_output_past_the_callers_result_limit_reaches_the_sub_agent_cut(tmp_path):
    """The caller stores the output cut to its agent's ``max_tool_result_chars`` (as
    any client's output), after checking it whole against the schema: the sub-session
    takes that cut output (its check was the caller's), not an error because the cut
    text no longer fits the schema."""
    helper3 = Agent(name="helper", provider=ScriptedProvider(responder=_echo_model), tools=[locate])
    agent = Agent(
        provider=ScriptedProvider(responder=_parent_model),
        tools=[helper3.as_tool(pass_approvals=True)],
        budget=Budget(max_tool_result_chars=200),
    )
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session, _, _ = await _suspend(host, agent)
        result = await session.respond(ASKED, output={"city": "P" * 1000})
        sub = await host.store.load(SUB)
    (located,) = [m for m in sub.messages if isinstance(m, ToolMessage)]
    assert located.error is None and isinstance(located.output, str)
    assert "[truncated:" in located.output and len(located.output) < 300  # (the marker)
    assert result.text.startswith("parent saw: got ")


async def test_an_a2a_task_names_the_sub_call_and_its_output_completes_the_task(tmp_path):
    async with web_server(parent(), protocols=BOTH, store=str(tmp_path / "w.db")) as server:

        async def run(client: Any) -> tuple[Any, Any]:
            (asked,) = await collect(client, a2a_user("go", message_id="q"))
            data = MessageToDict(asked.task.status.message.parts[1].data)["pending"]
            output = {"decisions": [{"id": ASKED, "output": {"city": "Oslo"}}]}
            (answered,) = await collect(
                client, a2a_user(message_id="o", task_id=asked.task.id, data=output)
            )
            return data, answered

        pending, answered = await sdk(server, run, streaming=False)
    assert [(p["id"], p["kind"], p["tool"], p["input"]) for p in pending] == [
        (ASKED, "client", "locate", {"precise": True})
    ]
    assert answered.task.status.state == TaskState.TASK_STATE_COMPLETED
    text = "".join(p.text for p in answered.task.artifacts[0].parts)
    assert text == "parent saw: you are in Oslo"


def test_a_call_held_again_carries_each_sub_call_answered_before():
    """The stored wait of a calling call was replaced by its next one, so the stored
    form showed only the last of the sub calls the stream had shown. Each answered one
    is carried along now (``Awaiting.sub_answered``): over three waits, and kept when
    the next wait is the same one held again, or an approval."""
    from actors.turn.suspension import mark_held, nested_wait
    from runtime.messages import ToolCallPart

    parts: list[Any] = [ToolCallPart(tool_call_id="H", tool_name="helper", input={}, step=0)]

    def answer_it() -> None:  # (as the caller's respond() stores it)
        w = parts[0].awaiting
        parts[0] = attrs.evolve(parts[0], awaiting=attrs.evolve(w, decided=True, output=w.id))

    for n in range(3):
        mark_held(parts, {"H": nested_wait(f"H.L{n}", "t", client=("locate", {"n": n}))})
        if n < 2:
            answer_it()
    carried = parts[0].awaiting.sub_answered
    assert [(a.id, a.sub_input, a.output, a.sub_answered) for a in carried] == [
        ("H.L0", {"n": 0}, "H.L0", ()),
        ("H.L1", {"n": 1}, "H.L1", ()),
    ]
    mark_held(parts, {"H": nested_wait("H.L2", "t", client=("locate", {"n": 2}))})
    assert parts[0].awaiting.sub_answered == carried  # the same wait again: nothing lost
    answer_it()
    mark_held(parts, {"H": nested_wait("ap_1", "t")})  # then an approval
    assert [a.id for a in parts[0].awaiting.sub_answered] == ["H.L0", "H.L1", "H.L2"]
    stored = converter.structure(converter.unstructure(parts[0]), ToolCallPart)
    assert stored == parts[0]  # (stored and read back whole)
