"""The AG-UI endpoint (POST /ag-ui): every emitted event is validated against the official
Python schemas (`ag-ui-protocol`'s `ag_ui.core` models), round trip included, and the
stream's sequence against the spec's rules; then the attacks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import Agent, Hooks, Host, ProviderError, ReasoningChunk, RetryPolicy, Tool, tool
from runtime import output as o
from runtime.actor_messages import Batcher
from runtime.app.web.agui_input import (
    AGUIError,
    history_of,
    parse_run_input,
)
from runtime.app.web.agui_wire import (
    RunEncoder,
    agui_messages,
)
from runtime.chunks import Usage
from runtime.messages import (
    AssistantMessage,
    Image,
    ProviderDataPart,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.output import ErrorInfo
from tests.test_web_http import TWO_TOOLS, lookup
from tests.test_web_slow_clients import DELTAS, Flood, read_nothing_until_over
from tests.web.harness import WebServer, web_server

ag_ui = pytest.importorskip("ag_ui.core")
EVENT = TypeAdapter(ag_ui.Event)
MESSAGE = TypeAdapter(ag_ui.Message)

STEP_USAGE = Usage(input_tokens=10, output_tokens=3, total_tokens=13)


def strict(model: Any) -> None:
    """No field the schema does not describe, anywhere (the models keep unknown ones)."""
    if isinstance(model, BaseModel):
        assert not model.model_extra, f"{type(model).__name__}: unknown {model.model_extra}"
        for name in type(model).model_fields:
            strict(getattr(model, name))
    elif isinstance(model, list | tuple):
        for item in model:
            strict(item)


def valid(event: dict[str, Any]) -> Any:
    """``event`` parsed by the official model, with no unknown field, and written back
    by it exactly as sent (camelCase names, nothing coerced)."""
    model = EVENT.validate_python(event)
    strict(model)
    assert model.model_dump(mode="json", by_alias=True) == event
    return model


def check_sequence(events: list[dict[str, Any]]) -> None:
    """The spec's sequence rules: one run from RUN_STARTED (or a lone RUN_ERROR) to its
    end, starts matched by ends, nothing open when it finishes, nothing after it."""
    assert events, "no events"
    assert events[0]["type"] in ("RUN_STARTED", "RUN_ERROR")
    open_: dict[str, set[str]] = {"text": set(), "tool": set(), "reasoning": set(), "span": set()}
    steps: set[str] = set()
    pairs = {
        "TEXT_MESSAGE_START": ("text", "messageId", True),
        "TEXT_MESSAGE_END": ("text", "messageId", False),
        "TOOL_CALL_START": ("tool", "toolCallId", True),
        "TOOL_CALL_END": ("tool", "toolCallId", False),
        "REASONING_MESSAGE_START": ("reasoning", "messageId", True),
        "REASONING_MESSAGE_END": ("reasoning", "messageId", False),
        "REASONING_START": ("span", "messageId", True),
        "REASONING_END": ("span", "messageId", False),
    }
    for i, event in enumerate(events):
        kind = event["type"]
        if kind in ("RUN_FINISHED", "RUN_ERROR"):
            assert i == len(events) - 1, f"{kind} is not last"
            if kind == "RUN_FINISHED":
                assert not steps and not any(open_.values()), (steps, open_)
            continue
        if kind in pairs:
            group, key, opens = pairs[kind]
            if opens:
                assert event[key] not in open_[group], f"{kind} reopens an open one"
                open_[group].add(event[key])
            else:
                assert event[key] in open_[group], f"{kind} closes what is not open"
                open_[group].discard(event[key])
        elif kind == "TEXT_MESSAGE_CONTENT":
            assert event["messageId"] in open_["text"]
        elif kind == "TOOL_CALL_ARGS":
            assert event["toolCallId"] in open_["tool"]
        elif kind == "REASONING_MESSAGE_CONTENT":
            assert event["messageId"] in open_["reasoning"]
        elif kind == "STEP_STARTED":
            assert event["stepName"] not in steps
            steps.add(event["stepName"])
        elif kind == "STEP_FINISHED":
            steps.remove(event["stepName"])
    assert events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR")


def parse_sse(text: str) -> list[dict[str, Any]]:
    events = []
    for block in text.split("\n\n"):
        data = [line[6:] for line in block.split("\n") if line.startswith("data: ")]
        if data:
            events.append(json.loads("\n".join(data)))
    return events


def run_input(thread: str, *messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "threadId": thread,
        "runId": fields.pop("runId", f"run-{thread}"),
        "messages": list(messages),
        **fields,
    }


def user(text: str, id: str | None = None) -> dict[str, Any]:
    return {"id": id or f"u-{abs(hash(text)) % 10**8}", "role": "user", "content": text}


async def post(server: WebServer, body: Any, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
        if isinstance(body, bytes):
            return await c.post(
                "/ag-ui", content=body, headers={"content-type": "application/json", **headers}
            )
        return await c.post("/ag-ui", json=body, headers=headers)


async def run(server: WebServer, body: Any, **headers: str) -> list[dict[str, Any]]:
    """A run's events, each validated, the sequence checked."""
    r = await post(server, body, **headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    for event in events:
        valid(event)
    check_sequence(events)
    return events


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def tool_agent() -> Agent:
    return Agent(
        name="finder", provider=ScriptedProvider(TWO_TOOLS, usage=STEP_USAGE), tools=[lookup]
    )


deleted: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    deleted.append(path)
    return f"deleted {path}"


def approval_agent(*final: str) -> Agent:
    steps = [
        ["Deleting. ", *tool_call("delete_file", {"path": "/tmp/x"}, tool_call_id="d1")],
        [final[0] if final else "Done."],
        ["Second answer."],
    ]
    return Agent(name="deleter", provider=ScriptedProvider(steps), tools=[delete_file])


COLOR_TOOL = {
    "name": "pick_color",
    "description": "Ask the user to pick a color.",
    "parameters": {
        "type": "object",
        "properties": {"options": {"type": "array", "items": {"type": "string"}}},
        "required": ["options"],
    },
}


def client_tool_agent() -> Agent:
    steps = [
        ["Let me ask. ", *tool_call("pick_color", {"options": ["red", "blue"]}, tool_call_id="c1")],
        ["You chose blue."],
    ]
    return Agent(name="asker", provider=ScriptedProvider(steps))


# -- a turn -------------------------------------------------------------------------------


async def test_a_turn_streams_steps_reasoning_text_and_tool_calls_as_valid_events():
    async with web_server(tool_agent(), protocols=("ag-ui",)) as server:
        events = await run(server, run_input("t1", user("find a and b", "u1"), runId="r1"))
    assert events[0] == {
        "type": "RUN_STARTED",
        "threadId": "t1",
        "runId": "r1",
        "protocolVersion": "1.0",
    }
    assert types(events).count("STEP_STARTED") == types(events).count("STEP_FINISHED") == 3
    assert [e["stepName"] for e in events if e["type"] == "STEP_STARTED"] == [
        "step-0",
        "step-1",
        "step-2",
    ]
    message_id = next(e["messageId"] for e in events if e["type"] == "TEXT_MESSAGE_START")
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "Looking up a. Now b. Both found."
    reasoning = "".join(e["delta"] for e in events if e["type"] == "REASONING_MESSAGE_CONTENT")
    assert reasoning == "I need a and b."
    starts = [e for e in events if e["type"] == "TOOL_CALL_START"]
    # (a call's wire id: its message's id, its step and its id, unique in the thread)
    a, b = f"{message_id}.s0.A", f"{message_id}.s1.B"
    assert [(e["toolCallId"], e["toolCallName"], e["parentMessageId"]) for e in starts] == [
        (a, "lookup", message_id),
        (b, "lookup", message_id),
    ]
    args = "".join(
        e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS" and e["toolCallId"] == a
    )
    assert json.loads(args) == {"key": "a"}
    results = [e for e in events if e["type"] == "TOOL_CALL_RESULT"]
    assert [(e["toolCallId"], e["content"]) for e in results] == [
        (a, "value of a"),
        (b, "value of b"),
    ]
    end = events[-1]
    assert end["type"] == "RUN_FINISHED" and end["outcome"] == {"type": "success"}
    assert end["usage"] == [
        {
            "inputTokens": 30,
            "outputTokens": 9,
            "totalTokens": 39,
            "provider": "scripted",
            "model": "scripted",
        }
    ]


async def test_the_run_id_is_the_turn_id_and_the_thread_the_stored_session():
    finished: list[Any] = []

    async def on_turn_finish(event: Any) -> None:
        finished.append(event)

    agent = Agent(provider=ScriptedProvider([["Hi."]]), hooks=Hooks(on_turn_finish=on_turn_finish))
    async with web_server(agent, protocols=("ai-sdk", "ag-ui")) as server:
        await run(server, run_input("thread-7", user("hello", "user-msg-1"), runId="run-42"))
        record = await server.host.store.load("thread-7")
    assert finished[0].turn_id == "run-42"
    assert [type(m).__name__ for m in record.messages] == ["UserMessage", "AssistantMessage"]
    assert record.messages[0].id == "user-msg-1" and record.messages[1].text == "Hi."


async def test_a_later_run_sends_only_its_new_message_and_the_thread_keeps_the_history():
    seen: list[int] = []

    def respond(request: Any) -> list[str]:
        seen.append(len(request.messages))
        return ["ok"]

    agent = Agent(provider=ScriptedProvider(responder=respond))
    async with web_server(agent, protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("one", "m1")))
        assistant = next(e["messageId"] for e in first if e["type"] == "TEXT_MESSAGE_START")
        history = [user("one", "m1"), {"id": assistant, "role": "assistant", "content": "ok"}]
        second = await run(server, run_input("t", *history, user("two", "m2")))
    # the model saw the stored history (and the turn's own message), not the client's copy
    assert seen == [2, 4]
    assert "MESSAGES_SNAPSHOT" not in types(second)  # the client was in step: no resync


async def test_a_client_with_another_history_is_resynchronised_with_a_snapshot_first():
    async with web_server(
        Agent(provider=ScriptedProvider([["a"], ["b"]])), protocols=("ag-ui",)
    ) as server:
        await run(server, run_input("t", user("one", "m1")))
        events = await run(server, run_input("t", user("two", "m2")))  # knows nothing of m1
    snapshot = events[1]
    assert snapshot["type"] == "MESSAGES_SNAPSHOT"
    first = snapshot["messages"][0]
    assert (first["role"], first["id"]) == ("user", "m1")
    assert snapshot["messages"][-1] == user("two", "m2")


async def test_a_new_thread_starts_from_the_messages_the_client_holds():
    seen: list[Any] = []

    def respond(request: Any) -> list[str]:
        seen.extend(request.messages)
        return ["Paris, still."]

    agent = Agent(provider=ScriptedProvider(responder=respond))
    earlier = [
        {"id": "s", "role": "system", "content": "Be brief."},
        user("Capital of France?", "m1"),
        {"id": "a1", "role": "assistant", "content": "Paris."},
    ]
    async with web_server(agent, protocols=("ag-ui",)) as server:
        await run(server, run_input("fresh", *earlier, user("Sure?", "m2")))
        record = await server.host.store.load("fresh")
    assert [type(m).__name__ for m in seen] == [
        "SystemMessage",
        "UserMessage",
        "AssistantMessage",
        "UserMessage",
        "AssistantMessage",  # the turn's own, being written
    ]
    assert [getattr(m, "text", None) or m.content for m in record.messages][:3] == [
        "Be brief.",
        "Capital of France?",
        "Paris.",
    ]


async def test_context_is_added_to_the_instructions_of_the_run_only():
    instructions: list[str | None] = []

    def respond(request: Any) -> list[str]:
        instructions.append(request.instructions)
        return ["ok"]

    agent = Agent(instructions="You help.", provider=ScriptedProvider(responder=respond))
    context = [{"description": "The user's city", "value": "Oslo"}]
    async with web_server(agent, protocols=("ag-ui",)) as server:
        await run(server, run_input("t", user("hi", "m1"), context=context))
        await run(
            server,
            run_input(
                "t",
                user("hi", "m1"),
                {"id": "x", "role": "assistant", "content": "ok"},
                user("again", "m2"),
            ),
        )
    assert instructions[0] == "You help.\n\nContext from the application:\n- The user's city: Oslo"
    assert instructions[1] == "You help."


async def test_a_failed_turn_ends_with_run_error_and_its_code():
    agent = Agent(
        provider=ScriptedProvider([["Partial", ProviderError("upstream exploded")]]),
        retry=RetryPolicy(max_attempts=1),
    )
    async with web_server(agent, protocols=("ag-ui",)) as server:
        events = await run(server, run_input("t", user("go", "m1")))
    end = events[-1]
    assert end["type"] == "RUN_ERROR" and end["code"] == "ProviderError"
    assert "upstream exploded" in end["message"]


async def test_a_shutdown_ends_a_run_with_the_cancelled_outcome_after_closing_what_was_open():
    agent = Agent(provider=ScriptedProvider([["Hi", Sleep(30), "there"]]))
    async with web_server(agent, protocols=("ag-ui",)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            async with c.stream("POST", "/ag-ui", json=run_input("t", user("x", "m1"))) as r:
                text = ""
                pieces = r.aiter_text()
                async for piece in pieces:
                    text += piece
                    if "TEXT_MESSAGE_CONTENT" in text:
                        break
                assert server.host.cancel_turns("server shutdown") == 1
                async for piece in pieces:
                    text += piece
    events = parse_sse(text)
    for event in events:
        valid(event)
    check_sequence(events)
    assert events[-1]["outcome"] == {"type": "cancelled"}
    assert events[-1]["metadata"] == {"axon": {"reason": "server shutdown"}}
    assert types(events)[-3:] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_FINISHED"]


async def test_signed_reasoning_sends_its_opaque_value_on_the_message_it_streamed_as():
    steps = [
        [
            ReasoningChunk(text="First thought."),
            ReasoningChunk(text="", signature="sig-1"),
            ReasoningChunk(text="Second thought."),
            ReasoningChunk(text="", signature="sig-2"),
            "Answer.",
        ]
    ]
    async with web_server(Agent(provider=ScriptedProvider(steps)), protocols=("ag-ui",)) as server:
        events = await run(server, run_input("t", user("think", "m1")))
    streamed = [e["messageId"] for e in events if e["type"] == "REASONING_MESSAGE_START"]
    encrypted = [e for e in events if e["type"] == "REASONING_ENCRYPTED_VALUE"]
    assert [(e["entityId"], e["encryptedValue"]) for e in encrypted] == list(
        zip(streamed, ["sig-1", "sig-2"], strict=True)
    )
    assert types(events).index("REASONING_ENCRYPTED_VALUE") < types(events).index("RUN_FINISHED")


async def test_a_new_message_instead_of_a_client_tools_answer_supersedes_the_call():
    agent = Agent(provider=ScriptedProvider(responder=_pick_then_read))
    async with web_server(agent, protocols=("ag-ui",)) as server:
        await run(server, run_input("t", user("pick", "m1"), tools=[COLOR_TOOL]))
        history = [user("pick", "m1"), {"id": "a", "role": "assistant", "content": "x"}]
        events = await run(server, run_input("t", *history, user("forget it", "m2")))
        record = await server.host.store.load("t")
    assert events[-1]["outcome"] == {"type": "success"}
    (denial,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert denial.tool_call_id == "c1" and "superseded" in str(denial.output or denial.error)


def _pick_then_read(request: Any) -> list[Any]:
    if len([m for m in request.messages if isinstance(m, UserMessage)]) == 1:
        return [*tool_call("pick_color", {"options": ["red"]}, tool_call_id="c1")]
    return ["Fine."]


# -- client tools -------------------------------------------------------------------------


async def test_a_client_tool_call_ends_the_run_as_success_naming_the_pending_call():
    async with web_server(client_tool_agent(), protocols=("ag-ui",)) as server:
        events = await run(server, run_input("t", user("pick", "m1"), tools=[COLOR_TOOL]))
        record = await server.host.store.load("t")
    assert "TOOL_CALL_RESULT" not in types(events)  # the spec: the producer never answers it
    assert types(events)[-4:] == [
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "STEP_FINISHED",
        "RUN_FINISHED",
    ]
    (call,) = [p for p in record.messages[1].content if isinstance(p, ToolCallPart)]
    pending = [f"{record.messages[1].id}.s0.c1"]
    assert events[-1]["outcome"] == {"type": "success", "pendingToolCallIds": pending}
    assert call.awaiting is not None and call.awaiting.kind == "client"


async def test_the_next_runs_tool_message_answers_the_client_tool_and_the_turn_goes_on():
    outputs: list[Any] = []

    def respond(request: Any) -> list[Any]:
        results = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not results:
            return [
                "Let me ask. ",
                *tool_call("pick_color", {"options": ["red"]}, tool_call_id="c1"),
            ]
        outputs.append(results[-1].output)
        return ["You chose blue."]

    agent = Agent(provider=ScriptedProvider(responder=respond))
    async with web_server(agent, protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("pick", "m1"), tools=[COLOR_TOOL]))
        message_id = next(e["messageId"] for e in first if e["type"] == "TEXT_MESSAGE_START")
        history = [
            user("pick", "m1"),
            {
                "id": message_id,
                "role": "assistant",
                "content": "Let me ask. ",
                "toolCalls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "pick_color", "arguments": "{}"},
                    }
                ],
            },
            {"id": "answer-1", "role": "tool", "toolCallId": "c1", "content": "blue"},
        ]
        second = await run(server, run_input("t", *history, tools=[COLOR_TOOL], runId="r2"))
        record = await server.host.store.load("t")
    assert outputs == ["blue"]
    assert "TOOL_CALL_RESULT" not in types(second)  # the client holds its own answer
    assert (
        "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
        == "You chose blue."
    )
    assert second[-1]["outcome"] == {"type": "success"}
    assert [type(m).__name__ for m in record.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
    ]
    assert record.messages[1].id == message_id  # the same message, continued


def _picks_each_turn(request: Any) -> list[Any]:
    """Calls ``pick_color`` as ``c1`` in every turn (a provider numbering each response's
    calls), then says what was picked."""
    at = max(i for i, m in enumerate(request.messages) if isinstance(m, UserMessage))
    answered = [m for m in request.messages[at:] if isinstance(m, ToolMessage)]
    if not answered:
        return [*tool_call("pick_color", {"options": ["red"]}, tool_call_id="c1")]
    return [f"You chose {answered[-1].output}."]


async def test_a_client_tool_call_whose_id_an_earlier_turn_used_is_answered():
    """Turn 2's client call has turn 1's id (``c1``): its answer was passed over as the
    result the thread held under that id, and the run refused as answering nothing
    (409 ``interrupt_pending``), for good."""
    agent = Agent(provider=ScriptedProvider(responder=_picks_each_turn))

    def answer(n: int, text: str) -> dict[str, Any]:
        return {"id": f"a{n}", "role": "tool", "toolCallId": "c1", "content": text}

    async with web_server(agent, protocols=("ag-ui",)) as server:

        async def thread() -> list[dict[str, Any]]:
            record = await server.host.store.load("t")
            assert record is not None
            return agui_messages(record.messages)

        await run(server, run_input("t", user("pick", "m1"), tools=[COLOR_TOOL]))
        held = await thread()
        await run(server, run_input("t", *held, answer(1, "blue"), tools=[COLOR_TOOL], runId="r2"))
        second = user("again", "m2")
        await run(server, run_input("t", *await thread(), second, tools=[COLOR_TOOL], runId="r3"))
        held = await thread()
        last = await run(
            server, run_input("t", *held, answer(2, "green"), tools=[COLOR_TOOL], runId="r4")
        )
    text = "".join(e["delta"] for e in last if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "You chose green." and last[-1]["outcome"] == {"type": "success"}


async def test_a_client_tool_that_takes_an_agent_tools_name_is_refused():
    async with web_server(tool_agent(), protocols=("ag-ui",)) as server:
        r = await post(server, run_input("t", user("x"), tools=[{**COLOR_TOOL, "name": "lookup"}]))
        assert server.host.sessions == {}  # refused before the thread opened
    assert r.status_code == 400 and r.json()["code"] == "tool_name_taken"


async def test_a_turn_offered_a_tool_with_an_agent_tools_name_fails():
    agent = Agent(provider=ScriptedProvider([["x"]]), tools=[lookup])
    from runtime import Host

    async with Host.open() as host:
        session = await host.open_session(agent)
        clash = Tool.client("lookup", {"type": "object", "properties": {}})
        async with session.stream("go", tools=(clash,)) as out:
            chunks = await out.collect()
    assert out.result is not None and out.result.finish_reason == "error"
    assert "ToolDefinitionError" in [c.error.kind for c in chunks if isinstance(c, o.Error)]


# -- approvals ----------------------------------------------------------------------------


async def test_an_approval_ends_the_run_with_the_interrupt_outcome_after_a_snapshot():
    deleted.clear()
    async with web_server(approval_agent(), protocols=("ag-ui",)) as server:
        events = await run(server, run_input("t", user("delete it", "m1")))
    snapshot, end = events[-2:]
    assert snapshot["type"] == "MESSAGES_SNAPSHOT"
    assert [m["role"] for m in snapshot["messages"]] == ["user", "assistant"]
    wire = f"{snapshot['messages'][1]['id']}.s0.d1"
    assert snapshot["messages"][1]["toolCalls"][0]["id"] == wire
    (interrupt,) = end["outcome"]["interrupts"]
    assert end["outcome"]["type"] == "interrupt"
    assert interrupt["reason"] == "tool_call" and interrupt["toolCallId"] == wire
    assert interrupt["id"].startswith("approval_")
    assert interrupt["responseSchema"]["required"] == ["approved"]
    assert deleted == []  # nothing ran: it waits


async def approve_delete(server: Any) -> list[dict[str, Any]]:
    """Run ``delete it`` on thread ``t`` (the approval agent's call waits), then a second
    run approving its interrupt; that run's events."""
    first = await run(server, run_input("t", user("delete it", "m1")))
    interrupt_id = first[-1]["outcome"]["interrupts"][0]["id"]
    resume = [{"interruptId": interrupt_id, "status": "resolved", "payload": {"approved": True}}]
    return await run(server, run_input("t", user("delete it", "m1"), resume=resume, runId="r2"))


async def test_resume_approves_and_the_continuation_reports_the_tools_result():
    deleted.clear()
    async with web_server(approval_agent("It is gone."), protocols=("ag-ui",)) as server:
        second = await approve_delete(server)
    assert deleted == ["/tmp/x"]
    assert "TOOL_CALL_START" not in types(second)  # the spec: not re-emitted on resume
    (result,) = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert result["toolCallId"].endswith(".s0.d1") and result["content"] == "deleted /tmp/x"
    assert (
        "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT") == "It is gone."
    )
    assert second[-1]["outcome"] == {"type": "success"}


async def test_a_cancelled_resume_entry_denies_the_call():
    deleted.clear()
    async with web_server(approval_agent("Not deleted."), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("delete it", "m1")))
        interrupt_id = first[-1]["outcome"]["interrupts"][0]["id"]
        second = await run(
            server, run_input("t", resume=[{"interruptId": interrupt_id, "status": "cancelled"}])
        )
    assert deleted == []
    (result,) = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert result["content"] == "the tool call was denied: cancelled"
    assert result["metadata"] == {"axon": {"denied": True, "reason": "cancelled"}}


async def test_replaying_a_resume_after_the_turn_went_on_changes_nothing():
    deleted.clear()
    async with web_server(approval_agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("delete it", "m1")))
        resume = [
            {
                "interruptId": first[-1]["outcome"]["interrupts"][0]["id"],
                "status": "resolved",
                "payload": {"approved": True},
            }
        ]
        await run(server, run_input("t", resume=resume))
        replay = await run(server, run_input("t", resume=resume, runId="again"))
        record = await server.host.store.load("t")
    assert deleted == ["/tmp/x"]  # once
    assert types(replay) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert len(record.messages) == 3


async def test_a_new_message_while_an_approval_waits_is_409_and_records_nothing():
    async with web_server(approval_agent(), protocols=("ag-ui",)) as server:
        await run(server, run_input("t", user("delete it", "m1")))
        before = await server.host.store.load("t")
        r = await post(server, run_input("t", user("delete it", "m1"), user("never mind", "m2")))
        after = await server.host.store.load("t")
    assert r.status_code == 409 and r.json()["code"] == "interrupt_pending"
    assert "resume" in r.json()["error"]
    assert after.messages == before.messages


async def test_a_resume_payload_that_is_not_an_approval_is_400_and_records_nothing():
    async with web_server(approval_agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("delete it", "m1")))
        interrupt_id = first[-1]["outcome"]["interrupts"][0]["id"]
        for payload in ({"approve": True}, "yes", {"approved": True, "editedArgs": "/"}):
            r = await post(
                server,
                run_input(
                    "t",
                    resume=[
                        {"interruptId": interrupt_id, "status": "resolved", "payload": payload}
                    ],
                ),
            )
            assert r.status_code == 400 and r.json()["code"] == "invalid_resume_payload"
        record = await server.host.store.load("t")
    (call,) = [p for p in record.messages[1].content if isinstance(p, ToolCallPart)]
    assert call.awaiting is not None and not call.awaiting.decided


async def test_an_unknown_resume_entry_is_ignored_and_said_so_when_the_rest_covers_the_wait():
    async with web_server(approval_agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("delete it", "m1")))
        interrupt_id = first[-1]["outcome"]["interrupts"][0]["id"]
        resume = [
            {"interruptId": interrupt_id, "status": "resolved", "payload": {"approved": False}},
            {"interruptId": "made-up", "status": "resolved", "payload": {"approved": True}},
        ]
        second = await run(server, run_input("t", resume=resume))
    assert second[0]["metadata"] == {"axon": {"ignoredResume": ["made-up"]}}
    assert second[-1]["outcome"] == {"type": "success"}


# -- reconnecting -------------------------------------------------------------------------


async def test_a_run_with_nothing_new_answers_with_a_snapshot_of_the_thread():
    async with web_server(tool_agent(), protocols=("ag-ui",)) as server:
        await run(server, run_input("t", user("find", "m1")))
        events = await run(server, run_input("t", runId="reconnect"))
        empty = await run(server, run_input("nothing-here", runId="r"))
    assert types(events) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    messages = events[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "reasoning", "assistant", "tool", "tool"]
    wires = [f"{messages[2]['id']}.s0.A", f"{messages[2]['id']}.s1.B"]
    assert [m["toolCallId"] for m in messages if m["role"] == "tool"] == wires
    assert messages[2]["content"] == "Looking up a. Now b. Both found."
    for m in messages:
        strict(MESSAGE.validate_python(m))
    assert empty[1] == {"type": "MESSAGES_SNAPSHOT", "messages": []}


async def test_a_reconnect_while_an_approval_waits_ends_with_the_interrupt_again():
    async with web_server(approval_agent(), protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("delete it", "m1")))
        again = await run(server, run_input("t", user("delete it", "m1"), runId="r2"))
    assert types(again) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert again[-1]["outcome"] == first[-1]["outcome"]


# -- the mapping, chunk by chunk ----------------------------------------------------------


def every_chunk() -> Iterator[o.OutputChunk]:
    ids = {"session_id": "s", "turn_id": "t"}
    yield o.Start(message_id="msg_1", **ids)
    yield o.StepStart(step=0)
    yield o.Throttled(step=0, wait=2.5, reason="requests")
    yield o.BudgetWait(step=0, want=90, available=50, held=40, ahead=1)
    yield o.ReasoningStart(step=0, part_id="p1")
    yield o.ReasoningDelta(step=0, part_id="p1", text="hmm")
    yield o.ReasoningFinish(step=0, part_id="p1")
    yield o.TextStart(step=0, part_id="p2")
    yield o.TextDelta(step=0, part_id="p2", text='{"a": 1}')
    yield o.ObjectDelta(step=0, part_id="p2", value={"a": 1})
    yield o.TextFinish(step=0, part_id="p2")
    yield o.ToolInputStart(step=0, tool_call_id="c1", tool_name="f")
    yield o.ToolInputDelta(step=0, tool_call_id="c1", delta='{"x":')
    yield o.ToolInputDelta(step=0, tool_call_id="c1", delta="1}")
    yield o.ToolCall(step=0, tool_call_id="c1", tool_name="f", input={"x": 1})
    yield o.ToolCall(step=0, tool_call_id="c2", tool_name="g", input={})
    yield o.ToolCall(step=0, tool_call_id="c3", tool_name="h", input={"y": [1]})
    yield o.ToolCall(step=0, tool_call_id="c4", tool_name="img", input={})
    yield o.ToolStream(
        step=0, tool_call_id="c1", tool_name="f", chunk=o.TextDelta(step=0, part_id="q", text="sub")
    )
    yield o.ToolResult(step=0, tool_call_id="c1", tool_name="f", output={"ok": True})
    yield o.ToolError(step=0, tool_call_id="c2", tool_name="g", error="disk on fire")
    yield o.ToolOutputDenied(step=0, tool_call_id="c3", tool_name="h", reason="no")
    png = Image(data=b"\x89PNG\r\n\x1a\n" + b"\0" * 8)
    yield o.ToolResult(
        step=0, tool_call_id="c4", tool_name="img", output=(TextPart(text="see", step=0), png)
    )
    yield o.ToolApprovalRequest(step=0, tool_call_id="c5", tool_name="k", approval_id="ap1")
    yield o.StepFinish(step=0, finish_reason="tool-calls", usage=STEP_USAGE)
    yield o.Finish(finish_reason="stop", usage=STEP_USAGE)


def test_every_output_chunk_maps_to_valid_events():
    encoder = RunEncoder("th", "run", provider="anthropic", model="claude")
    events = [e for chunk in every_chunk() for e in encoder.encode(chunk)]
    message = AssistantMessage(
        id="msg_1",
        content=(
            ReasoningPart(text="hmm", step=0, signature="sig-opaque"),
            ProviderDataPart(
                provider="openai", data={"type": "reasoning", "encrypted_content": "enc"}, step=0
            ),
        ),
    )
    result = type(
        "R", (), {"message": message, "pending": (), "output": {"a": 1}, "budget": None}
    )()
    events += encoder.closing(result, [])
    for event in events:
        valid(event)
    check_sequence(events)
    kinds = set(types(events))
    assert kinds >= {
        "RUN_STARTED",
        "STEP_STARTED",
        "STEP_FINISHED",
        "REASONING_START",
        "REASONING_END",
        "REASONING_MESSAGE_START",
        "REASONING_MESSAGE_CONTENT",
        "REASONING_MESSAGE_END",
        "REASONING_ENCRYPTED_VALUE",
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
        "CUSTOM",
        "RUN_FINISHED",
    }
    encrypted = [e for e in events if e["type"] == "REASONING_ENCRYPTED_VALUE"]
    # the signature on its reasoning message; the step's encrypted reasoning item, its
    # reasoning message taken, on the assistant message
    assert [(e["entityId"], e["encryptedValue"]) for e in encrypted] == [
        ("msg_1.r0", "sig-opaque"),
        ("msg_1", "enc"),
    ]
    assert [e["name"] for e in events if e["type"] == "CUSTOM"] == [
        "axon.throttled",
        "axon.budget-wait",
        "axon.object",
        "axon.tool-stream",
    ]
    media = next(
        e for e in events if e["type"] == "TOOL_CALL_RESULT" and e["toolCallId"].endswith(".c4")
    )
    assert [p["type"] for p in media["content"]] == ["text", "image"]
    assert events[-1]["result"] == {"a": 1}
    # Anthropic counts cache reads beside its input: AG-UI's inputTokens includes them
    assert events[-1]["usage"][0]["inputTokens"] == 10


def test_a_top_level_wait_is_a_custom_event_and_a_nested_one_stays_in_its_tool_stream():
    """A top-level ``throttled`` / ``budget-wait`` was dropped: a run whose model call
    waited for a rate limit (or an application's output account) just went quiet. Each
    is now a ``CUSTOM`` event with the chunk's fields; a sub-agent's still comes inside
    its ``axon.tool-stream`` (once, not twice)."""
    encoder = RunEncoder("th", "run")
    wait = o.BudgetWait(step=1, want=90, available=10, held=80, ahead=2)
    events = [
        e
        for chunk in (
            o.Start(message_id="m", session_id="s", turn_id="t"),
            o.Throttled(step=1, wait=0.25, reason="concurrency"),
            wait,
            o.ToolStream(step=1, tool_call_id="c", tool_name="helper", chunk=wait),
        )
        for e in encoder.encode(chunk)
    ]
    for event in events:
        valid(event)
    assert events[1:3] == [
        {
            "type": "CUSTOM",
            "name": "axon.throttled",
            "value": {"step": 1, "wait": 0.25, "reason": "concurrency"},
        },
        {
            "type": "CUSTOM",
            "name": "axon.budget-wait",
            "value": {"step": 1, "want": 90, "available": 10, "held": 80, "ahead": 2},
        },
    ]
    (nested,) = events[3:]
    assert nested["name"] == "axon.tool-stream" and nested["value"]["toolCallId"] == "m.s1.c"
    assert nested["value"]["chunk"]["type"] == "budget-wait"
    assert nested["value"]["chunk"]["want"] == 90


def test_an_error_ends_the_run_and_nothing_follows_it():
    encoder = RunEncoder("th", "run")
    events = encoder.encode(o.Start(message_id="m")) + encoder.encode(
        o.TextStart(step=0, part_id="p")
    )
    events += encoder.encode(o.Error(error=ErrorInfo(kind="RateLimited", message="slow down")))
    events += encoder.encode(o.TextDelta(step=0, part_id="p", text="late")) + encoder.closing(
        None, []
    )
    for event in events:
        valid(event)
    assert types(events) == ["RUN_STARTED", "TEXT_MESSAGE_START", "RUN_ERROR"]


def test_a_takeovers_reset_of_a_step_already_finished_opens_the_step_again():
    """A takeover re-runs a step whose ``step-finish`` the dead worker had relayed but
    not committed: the relay's live reader gets that ``step-finish``, the takeover's
    ``reset-step``, the re-run's parts (no second ``step-start``) and its own
    ``step-finish``. The step is started again after the reset, so each STEP_FINISHED
    closes an open step (before: the second closed a step already finished)."""
    encoder = RunEncoder("th", "run")
    usage = Usage(input_tokens=1, output_tokens=1, total_tokens=2)
    takeover = ErrorInfo(kind="Takeover", message="the worker running the turn stopped")
    chunks = [
        o.Start(message_id="m"),
        o.StepStart(step=0),
        o.TextStart(step=0, part_id="a"),
        o.TextDelta(step=0, part_id="a", text="first run"),
        o.TextFinish(step=0, part_id="a"),
        o.StepFinish(step=0, finish_reason="stop", usage=usage),
        o.ResetStep(step=0, provider="scripted", error=takeover),
        o.TextStart(step=0, part_id="b"),
        o.TextDelta(step=0, part_id="b", text="re-run"),
        o.TextFinish(step=0, part_id="b"),
        o.StepFinish(step=0, finish_reason="stop", usage=usage),
    ]
    events = [event for chunk in chunks for event in encoder.encode(chunk)]
    events += encoder.closing(None, [])
    for event in events:
        valid(event)
    check_sequence(events)
    assert types(events).count("STEP_STARTED") == types(events).count("STEP_FINISHED") == 2


def test_anthropic_cache_counts_are_added_into_input_tokens():
    from runtime.app.web.agui_wire import (
        token_usage,
    )

    usage = Usage(input_tokens=5, output_tokens=2, total_tokens=7, cache_read=100, cache_write=10)
    (entry,) = token_usage(usage, "anthropic", "claude")
    assert (entry["inputTokens"], entry["cachedInputTokens"], entry["totalTokens"]) == (
        115,
        100,
        117,
    )
    (plain,) = token_usage(usage, "openai", "gpt")
    assert plain["inputTokens"] == 5


def test_a_stored_history_becomes_valid_agui_messages_and_back():
    messages = [
        UserMessage(
            content=(TextPart(text="look", step=0), Image(data=b"\x89PNG\r\n\x1a\n" + b"\0" * 8)),
            id="u",
        ),
        AssistantMessage(
            id="a",
            content=(
                ReasoningPart(text="", step=0, redacted_data="opaque"),
                TextPart(text="Checking.", step=0),
                ToolCallPart(tool_call_id="c", tool_name="f", input={"q": 1}, step=0),
            ),
        ),
        ToolMessage(tool_call_id="c", tool_name="f", step=0, error="failed"),
    ]
    out = agui_messages(messages)
    for m in out:
        model = MESSAGE.validate_python(m)
        strict(model)
        assert model.model_dump(mode="json", by_alias=True) == m
    assert [m["role"] for m in out] == ["user", "reasoning", "assistant", "tool"]
    assert out[1]["encryptedValue"] == "opaque"
    assert out[3] == {
        "id": "a.s0.c.result",
        "role": "tool",
        "toolCallId": "a.s0.c",
        "content": "failed",
        "error": "failed",
    }
    back = history_of([m for m in out if m["role"] != "reasoning"])
    assert [type(m).__name__ for m in back] == ["UserMessage", "AssistantMessage", "ToolMessage"]
    assert back[1].content[1].input == {"q": 1} and back[2].error == "failed"
    # (read back as the call the model made: its wire id's message and step taken off)
    assert out[2]["toolCalls"][0]["id"] == "a.s0.c"
    assert back[1].content[1].tool_call_id == back[2].tool_call_id == "c"


# -- attacks ------------------------------------------------------------------------------


async def test_a_missing_or_wrong_token_is_401_and_runs_nothing():
    async with web_server(tool_agent(), protocols=("ag-ui",), token="s3cret") as server:
        none = await post(server, run_input("t", user("x")))
        wrong = await post(server, run_input("t", user("x")), authorization="Bearer nope")
        ok = await run(server, run_input("t", user("x")), authorization="Bearer s3cret")
    assert none.status_code == wrong.status_code == 401
    assert none.headers["www-authenticate"] == "Bearer" and none.json()["code"] == "unauthorized"
    assert ok[-1]["type"] == "RUN_FINISHED"


async def test_a_forged_host_is_refused_before_anything_runs():
    async with web_server(tool_agent(), protocols=("ag-ui",)) as server:
        r = await post(server, run_input("t", user("x")), host="evil.example")
        assert await server.host.store.list_sessions() == []
    assert r.status_code == 403 and "DNS rebinding" in r.json()["error"]


async def test_a_cross_site_request_is_refused():
    async with web_server(tool_agent(), protocols=("ag-ui",)) as server:
        origin = await post(server, run_input("t", user("x")), origin="https://evil.example")
        fetch = await post(server, run_input("t", user("x")), **{"sec-fetch-site": "cross-site"})
        form = await post(
            server, json.dumps(run_input("t", user("x"))).encode(), **{"content-type": "text/plain"}
        )
        assert server.host.sessions == {}
    assert origin.status_code == fetch.status_code == 403
    assert "CSRF" in origin.json()["error"]
    assert form.status_code == 415  # a body a page may send cross-site without asking


async def test_a_malformed_run_agent_input_is_400_naming_the_field_and_runs_nothing():
    cases = [
        (b"{nope", "the body is not JSON"),
        (json.dumps([1]).encode(), "the body"),
        (json.dumps({"runId": "r", "messages": []}).encode(), "threadId"),
        (
            json.dumps(run_input("t", {"id": "m", "role": "wizard", "content": "x"})).encode(),
            "messages[0].role",
        ),
        (
            json.dumps(run_input("t", {"id": "m", "role": "user", "content": 5})).encode(),
            "messages[0].content",
        ),
        (
            json.dumps(
                run_input("t", user("x"), tools=[{"name": "f", "parameters": {"type": "array"}}])
            ).encode(),
            "tools[0]",
        ),
        (
            json.dumps(run_input("t", resume=[{"interruptId": "i", "status": "maybe"}])).encode(),
            "resume[0].status",
        ),
        (json.dumps(run_input("../etc", user("x"))).encode(), "threadId"),
    ]
    async with web_server(tool_agent(), protocols=("ag-ui",)) as server:
        for body, field in cases:
            r = await post(server, body)
            assert r.status_code == 400, (body, r.text)
            assert field in r.json()["error"], (field, r.json())
        assert server.host.sessions == {}
        assert await server.host.store.list_sessions() == []


JUNK = st.recursive(
    st.none() | st.booleans() | st.text(max_size=5) | st.integers(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
PART_JUNK = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["text", "image", "document", "audio", "x"]),
        "text": JUNK,
        "source": JUNK
        | st.fixed_dictionaries(
            {"type": st.sampled_from(["data", "url", "file"]), "value": JUNK, "mimeType": JUNK}
        ),
    }
)
MESSAGE_JUNK = st.fixed_dictionaries(
    {
        "id": JUNK,
        "role": st.sampled_from(["user", "assistant", "tool", "system", "x"]),
        "content": JUNK | st.lists(PART_JUNK, max_size=3),
        "toolCalls": JUNK,
        "toolCallId": JUNK,
    }
)


@given(
    st.one_of(
        JUNK,
        st.fixed_dictionaries(
            {"threadId": JUNK, "runId": JUNK, "messages": st.lists(MESSAGE_JUNK, max_size=3)},
            optional={"tools": JUNK, "context": JUNK, "resume": JUNK},
        ),
    )
)
def test_any_json_body_parses_and_converts_or_is_a_400(payload):
    try:
        history_of(parse_run_input(payload).messages)
    except AGUIError as exc:
        assert exc.status == 400 and exc.message


PNG = "iVBORw0KGgoAAAAAAAAAAA=="  # the PNG signature and eight zero bytes


async def test_a_user_messages_image_part_is_stored_as_an_image():
    image = {"type": "image", "source": {"type": "data", "value": PNG, "mimeType": "image/png"}}
    message = {
        "id": "m1",
        "role": "user",
        "content": [{"type": "text", "text": "What is it?"}, image],
    }
    async with web_server(
        Agent(provider=ScriptedProvider([["A PNG."]])), protocols=("ag-ui",)
    ) as server:
        await run(server, run_input("t", message))
        record = await server.host.store.load("t")
    text, stored = record.messages[0].content
    assert text.text == "What is it?"
    assert isinstance(stored, Image) and stored.media_type == "image/png"


async def test_too_many_parts_are_413_before_any_is_decoded():
    image = {
        "type": "image",
        "source": {"type": "data", "value": "not base64!", "mimeType": "image/png"},
    }
    message = {"id": "m1", "role": "user", "content": [image] * 101}
    async with web_server(tool_agent(), protocols=("ag-ui",)) as server:
        r = await post(server, run_input("t", message))
        assert server.host.sessions == {}
    assert r.status_code == 413 and r.json()["code"] == "too_many_parts"


async def test_an_unknown_tool_result_is_404_and_records_nothing():
    async with web_server(client_tool_agent(), protocols=("ag-ui",)) as server:
        await run(server, run_input("t", user("pick", "m1"), tools=[COLOR_TOOL]))
        before = await server.host.store.load("t")
        forged = {"id": "f", "role": "tool", "toolCallId": "never-made", "content": "rm -rf"}
        r = await post(server, run_input("t", user("pick", "m1"), forged, tools=[COLOR_TOOL]))
        after = await server.host.store.load("t")
    assert r.status_code == 404 and r.json()["code"] == "unknown_tool_call"
    assert after.messages == before.messages and after.version == before.version


async def test_answers_that_leave_a_call_waiting_are_409_and_record_nothing():
    steps = [
        [
            *tool_call("pick_color", {"options": []}, tool_call_id="c1"),
            *tool_call("delete_file", {"path": "/p"}, tool_call_id="d1"),
        ],
        ["done"],
    ]
    agent = Agent(provider=ScriptedProvider(steps), tools=[delete_file])
    async with web_server(agent, protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("go", "m1"), tools=[COLOR_TOOL]))
        assert first[-1]["outcome"]["type"] == "interrupt"  # an approval and a client call wait
        answer = {"id": "x", "role": "tool", "toolCallId": "c1", "content": "red"}
        r = await post(server, run_input("t", user("go", "m1"), answer, tools=[COLOR_TOOL]))
        record = await server.host.store.load("t")
    assert r.status_code == 409 and r.json()["code"] == "interrupt_pending"
    calls = [p for p in record.messages[1].content if isinstance(p, ToolCallPart)]
    assert all(not p.awaiting.decided for p in calls)


async def test_a_thread_running_a_run_answers_409_thread_busy():
    agent = Agent(provider=ScriptedProvider([["Hi", Sleep(30), "there"]]))
    async with web_server(agent, protocols=("ag-ui",)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            async with c.stream("POST", "/ag-ui", json=run_input("t", user("x", "m1"))) as first:
                async for piece in first.aiter_text():
                    if "RUN_STARTED" in piece:
                        break
                second = await post(server, run_input("t", user("x", "m1"), user("y", "m2")))
                server.host.cancel_turns("test over")
    assert second.status_code == 409 and second.json()["code"] == "thread_busy"


async def test_two_threads_running_at_once_with_one_run_id_get_distinct_turn_ids():
    # A careless client's constant runId: a turn id must name one running turn, or a
    # stop of one thread (the relay's cancel, by turn id) stops the other's.
    agent = Agent(provider=ScriptedProvider([["Hi", Sleep(30), "there"]] * 2))
    async with web_server(agent, protocols=("ag-ui",)) as server:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            runs = [run_input(t, user("x", "m1"), runId="run-1") for t in ("alice", "bob")]
            async with (
                c.stream("POST", "/ag-ui", json=runs[0]) as alice,
                c.stream("POST", "/ag-ui", json=runs[1]) as bob,
            ):
                started = []
                for response in (alice, bob):
                    async for piece in response.aiter_text():
                        if "RUN_STARTED" in piece:
                            started.append(piece)
                            break
                turns = [s.current for s in server.host.sessions.values()]
                first, other = sorted(turns, key=lambda t: t.turn_id != "run-1")
                assert first.turn_id == "run-1" != other.turn_id  # the first keeps it
                assert server.host.cancel_turn("run-1", "test over")
                with trio.fail_after(10):
                    await first.done.wait()
                assert not other.done.is_set()  # the other thread's turn goes on
                server.host.cancel_turns("test over")
    assert all('"runId":"run-1"' in piece for piece in started)  # each client sees its own


async def test_a_continuation_whose_turn_id_another_thread_runs_now_gets_its_own():
    # A thread's turn waited for an approval under its runId; another thread (a client's
    # constant runId) then ran a turn of that id; the continuation kept the id: two
    # running turns under one id, and a stop by turn id (the relay's cancel) stopped
    # whichever came first. Now it gets an id of its own, as a new turn does.
    deleted.clear()
    slow = Agent(provider=ScriptedProvider([["Hi", Sleep(30), "there"]]))
    async with Host.open(store=None) as host:
        alice = await host.open_session(approval_agent("It is gone."), session_id="alice")
        async with alice.stream("delete it", turn_id="run-1") as out:
            async for _ in out:
                pass
        assert out.result is not None and out.turn_id == "run-1"
        (waiting,) = out.result.pending
        bob = await host.open_session(slow, session_id="bob")
        async with bob.stream("x", turn_id="run-1") as running:
            async for chunk in running:
                if isinstance(chunk, o.TextDelta):
                    break
            await alice.decide(waiting.approval_id, approved=True)
            async with alice.resume() as continuation:
                async for _ in continuation:
                    pass
            assert running.turn_id == "run-1" != continuation.turn_id
            assert not running.done.is_set()  # bob's turn runs on
            assert host.cancel_turn("run-1", "test over")  # and is the one a stop names
            with trio.fail_after(10):
                async for _ in running:
                    pass
    assert deleted == ["/tmp/x"]
    assert continuation.result is not None and continuation.result.text.endswith("It is gone.")
    assert running.result is not None and running.result.abort_reason == "test over"


async def test_a_client_that_never_reads_is_dropped_and_its_turn_saved_interrupted(monkeypatch):
    monkeypatch.setattr(Batcher, "max_items", 1)
    flood = Flood()
    async with web_server(flood.agent, protocols=("ag-ui",), send_timeout=2) as server:
        payload = json.dumps(run_input("stuck", user("go", "m1"))).encode()
        host = server.url.removeprefix("http://")
        request = (
            f"POST /ag-ui HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        response, record = await read_nothing_until_over(server, flood, request, "stuck")
    finished, pulled = flood.finished, flood.pulled
    assert [(e.finish_reason, e.abort_reason) for e in finished] == [
        ("aborted", "client not reading")
    ]
    saved = record.messages[1]
    assert isinstance(saved, AssistantMessage) and saved.interrupted
    assert pulled[0] < DELTAS  # backpressure held the provider back
    assert response.startswith(b"HTTP/1.1 200") and b"RUN_FINISHED" not in response


# -- mounting -----------------------------------------------------------------------------


async def test_the_endpoint_is_mounted_only_when_named():
    async with web_server(tool_agent()) as server:
        assert (await post(server, run_input("t", user("x")))).status_code == 404
    async with web_server(tool_agent(), protocols=("ag-ui",)) as server:
        async with httpx.AsyncClient(base_url=server.url) as c:
            assert (await c.get("/api/info")).status_code == 404
            assert (await c.get("/ag-ui")).status_code == 405


async def test_a_run_id_the_relay_cannot_check_gets_a_new_turn_id():
    """Embedded with a relay: a runId whose stream the relay holds, or cannot say it does
    not (Redis down), is not the turn's id (the new turn would append to an earlier
    turn's stream); the relay is asked once, with no retries, so a Redis that is down
    does not hold the run up. Without a relay, or a runId that is no id, nothing asked."""
    from runtime.app.web.agui import _unrelayed
    from runtime.errors import RelayUnavailable

    class Relay:
        def __init__(self, answer: Any) -> None:
            self.answer, self.asked = answer, []

        async def holds_turn(self, turn_id: str) -> bool:
            self.asked.append(turn_id)
            if isinstance(self.answer, Exception):
                raise self.answer
            return bool(self.answer)

    down = Relay(RelayUnavailable("Redis did not answer"))
    assert await _unrelayed(Relay(True), "run-1") is None
    assert await _unrelayed(Relay(False), "run-1") == "run-1"
    assert await _unrelayed(down, "run-1") is None and down.asked == ["run-1"]
    assert await _unrelayed(None, "run-1") == "run-1"
    assert await _unrelayed(down, None) is None and down.asked == ["run-1"]


async def test_a_later_run_on_a_thread_held_here_reads_no_history_from_the_store():
    """A client's every run read the whole thread from the store before anything else
    (a 5,000-message one ~1.5 MB a run): the session open here holds it, checked current
    by a version query."""
    from tests.test_approval_reads import count_calls

    agent = Agent(provider=ScriptedProvider([["a"], ["b"]]))
    async with web_server(agent, protocols=("ag-ui",)) as server:
        first = await run(server, run_input("t", user("one", "m1")))
        assistant = next(e["messageId"] for e in first if e["type"] == "TEXT_MESSAGE_START")
        history = [user("one", "m1"), {"id": assistant, "role": "assistant", "content": "a"}]
        calls = count_calls(server.host.store)
        second = await run(server, run_input("t", *history, user("two", "m2")))
        record = await server.host.store.load("t")
    assert "MESSAGES_SNAPSHOT" not in types(second)
    assert calls["load"] == 1  # (the test's own, after the run)
    assert [m.id for m in record.messages if isinstance(m, UserMessage)] == ["m1", "m2"]
