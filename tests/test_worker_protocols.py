"""The OpenAI-compatible endpoint, AG-UI and A2A in a worker deployment's front end:
turns queued in PostgreSQL, run by a worker, read back from the Redis relay, each
encoded by its protocol's own encoder. A real front end and a real worker (in this
process; tests/test_worker_protocols_processes.py runs them as processes) on the test
run's own PostgreSQL and Redis, driven by each protocol's official client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from types import SimpleNamespace
from typing import Any

import attrs
import httpx
import openai
import pytest
import trio
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    SendMessageConfiguration,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf.json_format import MessageToDict

from actors.a2a import A2AAgent
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import output as o
from runtime.agent import Agent
from runtime.app.web.a2a_queued import QueuedTaskBook
from runtime.app.web.queued_turn import RestartFilter
from runtime.budget import Budget
from runtime.chunks import Usage
from runtime.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.relay import StepRestarted
from runtime.results import truncate_output
from tests.support import worker_agent
from tests.support.redis import require_redis
from tests.test_a2a import answer_of, collect, last_state, sdk
from tests.test_a2a import user as a2a_user
from tests.test_agui import check_sequence, parse_sse, run_input, types, user, valid
from tests.test_frontend import LIMIT, Deployment, deployment, wait_for_turn
from tests.test_workers import sql, wait_for

ALL = ("ai-sdk", "openai", "ag-ui", "a2a")
USAGE = Usage(input_tokens=10, output_tokens=3, total_tokens=13)


@pytest.fixture
def redis_url() -> str:
    return require_redis()


def scripted_agent(delay: float = 0.0) -> Agent:
    """The worker tests' agent (tests/support/worker_agent.py), keeping its requests."""
    return Agent(
        name="worker-test",
        provider=ScriptedProvider(
            responder=worker_agent.respond, delay=delay, chunk_size=8, usage=USAGE
        ),
        instructions="test",
        tools=[worker_agent.record, worker_agent.guarded],
    )


@asynccontextmanager
async def protocols_deployment(
    pg_url: str, redis_url: str, agent: Agent | None = None, **options: Any
) -> AsyncIterator[Deployment]:
    async with deployment(
        pg_url, redis_url, agent or scripted_agent(), protocols=ALL, **options
    ) as d:
        yield d


@asynccontextmanager
async def openai_client(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", max_retries=0, timeout=LIMIT
    ) as client:
        yield client


async def assistant_of(d: Deployment, session_id: str) -> AssistantMessage:
    """The session's last assistant message, as stored."""
    record = await d.store.load(session_id)
    assert record is not None
    return [m for m in record.messages if isinstance(m, AssistantMessage)][-1]


def requests_of(agent: Agent) -> list[Any]:
    provider = agent.provider
    assert isinstance(provider, ScriptedProvider)
    return list(provider.requests)


# -- the restart filter ---------------------------------------------------------------------


def _text(step: int, part: str, *pieces: str) -> list[Any]:
    return [
        o.TextStart(step=step, part_id=part),
        *(o.TextDelta(step=step, part_id=part, text=p) for p in pieces),
    ]


def test_a_restarted_step_sends_only_what_its_rerun_adds_under_the_first_part_id() -> None:
    keep = RestartFilter()
    first = [o.Start(message_id="m"), o.StepStart(step=0), *_text(0, "p1", "Hello", " wor")]
    rerun = [
        StepRestarted(step=0),
        o.StepStart(step=0),
        *_text(0, "p9", "Hel", "lo world"),
        o.TextFinish(step=0, part_id="p9"),
        o.StepFinish(step=0, finish_reason="stop", usage=Usage()),
    ]
    out = [c for chunk in first + rerun for c in keep(chunk)]
    assert out[: len(first)] == first
    assert out[len(first) :] == [
        o.TextDelta(step=0, part_id="p1", text="ld"),
        o.TextFinish(step=0, part_id="p1"),
        o.StepFinish(step=0, finish_reason="stop", usage=Usage()),
    ]


def test_a_restarted_step_does_not_send_its_calls_again() -> None:
    keep = RestartFilter()
    call = o.ToolCall(step=0, tool_call_id="c1", tool_name="t", input={})
    result = o.ToolResult(step=0, tool_call_id="c1", tool_name="t", output=1)
    finish = o.StepFinish(step=0, finish_reason="tool-calls", usage=Usage())
    first = [o.StepStart(step=0), call, result, finish]
    again = [StepRestarted(step=0), o.StepStart(step=0), call, result, finish, o.StepStart(step=1)]
    out = [c for chunk in first + again for c in keep(chunk)]
    assert out == [*first, o.StepStart(step=1)]


def test_a_reset_step_voids_its_calls_so_a_rerun_with_the_same_ids_is_sent() -> None:
    """A takeover's ``reset-step``: the re-run's call (same id, the provider is
    deterministic) is no repeat of a call the client still has; it was taken back."""
    keep = RestartFilter()
    call = o.ToolCall(step=0, tool_call_id="c1", tool_name="t", input={})
    result = o.ToolResult(step=0, tool_call_id="c1", tool_name="t", output=1)
    reset = o.ResetStep(step=0, provider="p", error=o.ErrorInfo(kind="Takeover", message="m"))
    first = [o.StepStart(step=0), *_text(0, "p1", "Hi"), call]
    rerun = [o.TextFinish(step=0, part_id="p1"), reset, *_text(0, "p2", "Yo"), call, result]
    out = [c for chunk in first + rerun for c in keep(chunk)]
    assert out == first + rerun


# -- the OpenAI-compatible endpoint ---------------------------------------------------------


async def test_openai_streams_a_queued_turn_from_the_worker_with_reasoning_and_usage(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url) as d, openai_client(d.urls[0]) as c:
        with trio.fail_after(LIMIT):
            raw = await c.chat.completions.with_raw_response.create(
                model="worker-test",
                messages=[{"role": "user", "content": "tools please"}],
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"X-Axon-Session": "oa-1"},
            )
            chunks = [chunk async for chunk in raw.parse()]
        turns = await d.queue.turns("oa-1")
        stored = await assistant_of(d, "oa-1")
    assert raw.headers["x-axon-session"] == "oa-1"
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert deltas[0].role == "assistant"
    content = "".join(dl.content or "" for dl in deltas)
    assert content == worker_agent.answer_text("tools please") == stored.text
    reasoning = "".join(getattr(dl, "reasoning_content", None) or "" for dl in deltas)
    assert reasoning == "I will record two effects."
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 30  # 3 steps
    assert [t.status for t in turns] == ["done"]
    assert {ch.id for ch in chunks} == {f"chatcmpl-{turns[0].turn_id}"}


async def test_openai_answers_a_queued_turn_whole_and_the_session_keeps_the_history(
    pg_url: str, redis_url: str
) -> None:
    agent = scripted_agent()
    async with protocols_deployment(pg_url, redis_url, agent) as d, openai_client(d.urls[0]) as c:
        header = {"X-Axon-Session": "oa-2"}
        with trio.fail_after(LIMIT):
            first = await c.chat.completions.create(
                model="worker-test", messages=[{"role": "user", "content": "one"}],
                extra_headers=header,
            )  # fmt: skip
            second = await c.chat.completions.create(
                model="worker-test", messages=[{"role": "user", "content": "two"}],
                extra_headers=header,
            )  # fmt: skip
        record = await d.store.load("oa-2")
    assert first.choices[0].message.content == "echo: one"
    assert second.choices[0].message.content == "echo: two"
    assert second.usage is not None and second.usage.total_tokens == 13
    sent = requests_of(agent)[-1].messages
    assert [m.text if isinstance(m, AssistantMessage) else m.content for m in sent[0:3]] == [
        "one",
        "echo: one",
        "two",
    ]
    assert record is not None and record.meta["title"] == "one" and len(record.messages) == 4


async def test_a_stateless_openai_turn_runs_on_a_worker_from_its_history_and_leaves_no_session(
    pg_url: str, redis_url: str
) -> None:
    agent = scripted_agent()
    async with protocols_deployment(pg_url, redis_url, agent) as d, openai_client(d.urls[0]) as c:
        with trio.fail_after(LIMIT):
            raw = await c.chat.completions.with_raw_response.create(
                model="worker-test",
                messages=[
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Capital of France?"},
                    {"role": "assistant", "content": "Paris."},
                    {"role": "user", "content": "And Spain?"},
                ],
            )
        completion = raw.parse()
        turn_id = completion.id.removeprefix("chatcmpl-")
        row = await d.queue.get_status(turn_id)
        # The worker deletes the scratch session after the turn's stream ended (the
        # client, who never learns its id, is not held up by the delete): wait for it,
        # bounded, rather than race it.
        with trio.move_on_after(LIMIT):
            for _ in range(int(LIMIT / 0.02)):
                if not await d.store.list_sessions():
                    break
                await trio.sleep(0.02)
        sessions = await d.store.list_sessions()
        stored = await d.store.load(row.session_id) if row is not None else None
    assert "x-axon-session" not in raw.headers
    assert completion.choices[0].message.content == "echo: And Spain?"
    sent = requests_of(agent)[-1].messages
    kinds = [SystemMessage, UserMessage, AssistantMessage, UserMessage]
    assert [type(m) for m in sent[0:4]] == kinds
    assert row is not None and row.status == "done"
    assert sessions == [] and stored is None  # its worker deleted the scratch session


async def test_openai_answers_409_session_busy_while_the_session_runs_a_turn(
    pg_url: str, redis_url: str
) -> None:
    async with (
        protocols_deployment(pg_url, redis_url, scripted_agent(delay=0.05)) as d,
        openai_client(d.urls[0]) as c,
    ):
        header = {"X-Axon-Session": "oa-3"}
        with trio.fail_after(LIMIT):
            stream = await c.chat.completions.create(
                model="worker-test", messages=[{"role": "user", "content": "tools slow"}],
                stream=True, extra_headers=header,
            )  # fmt: skip
            await wait_for_turn(d.queue, "oa-3", "running")
            with pytest.raises(openai.ConflictError) as refused:
                await c.chat.completions.create(
                    model="worker-test", messages=[{"role": "user", "content": "again"}],
                    extra_headers=header,
                )  # fmt: skip
            async for _ in stream:
                pass
        turns = await d.queue.turns("oa-3")
    assert refused.value.code == "session_busy"
    assert len(turns) == 1  # nothing queued for the refused request


async def test_a_forged_openai_session_header_is_400_in_openais_shape_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url) as d, openai_client(d.urls[0]) as c:
        with pytest.raises(openai.BadRequestError) as refused:
            await c.chat.completions.create(
                model="worker-test", messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Axon-Session": "../etc/passwd"},
            )  # fmt: skip
        busy = await d.queue.busy_sessions()
        sessions = await d.store.list_sessions()
    assert refused.value.code == "invalid_session_id"
    assert refused.value.body["param"] == "x-axon-session"  # type: ignore[index]
    assert busy == set() and sessions == []


async def test_a_full_queue_is_429_in_openais_shape_with_retry_after_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    caps = {"max_queued": 1}
    async with (
        protocols_deployment(pg_url, redis_url, worker=False, queue_caps=caps) as d,
        openai_client(d.urls[0]) as c,
    ):
        request = {"model": "worker-test", "messages": [{"role": "user", "content": "hi"}]}
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(c.chat.completions.create, **request))  # queued
                await wait_for(d.queue.busy_sessions, LIMIT, "the first turn to be queued")
                with pytest.raises(openai.RateLimitError) as refused:
                    await c.chat.completions.with_raw_response.create(**request)
                nursery.cancel_scope.cancel()  # the first client leaves: its turn is cancelled

            async def idle() -> bool:
                return not await d.queue.busy_sessions()

            await wait_for(idle, LIMIT, "the first turn to be cancelled")
        rows = sql(pg_url, "SELECT status, cancel_reason FROM axon_turns")
    assert refused.value.status_code == 429
    assert refused.value.response.headers["retry-after"] == "5"
    assert refused.value.body["message"].startswith("the turn queue already holds")  # type: ignore[index]
    assert rows == [("cancelled", "client disconnected")]  # the refused one queued nothing


async def test_a_client_leaving_an_openai_stream_cancels_its_queued_turn(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, scripted_agent(delay=0.05)) as d:
        request = {
            "model": "worker-test",
            "messages": [{"role": "user", "content": "tools long"}],
            "stream": True,
        }
        with trio.fail_after(LIMIT):
            async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
                headers = {"X-Axon-Session": "oa-4"}
                async with client.stream(
                    "POST", "/v1/chat/completions", json=request, headers=headers
                ) as response:
                    async for line in response.aiter_lines():
                        if '"content"' in line:
                            break  # the client leaves mid-stream
            turn = await wait_for_turn_to_end(d, "oa-4")
    assert turn.status == "cancelled"


async def wait_for_turn_to_end(d: Deployment, session_id: str) -> Any:
    while True:
        turns = await d.queue.turns(session_id)
        if turns and turns[-1].finished:
            return turns[-1]
        await trio.sleep(0.02)


# -- AG-UI ----------------------------------------------------------------------------------

COLOR_TOOL = {
    "name": "pick_color",
    "description": "Ask the user to pick a color.",
    "parameters": {
        "type": "object",
        "properties": {"options": {"type": "array", "items": {"type": "string"}}},
        "required": ["options"],
    },
}


def agui_agent(delay: float = 0.0) -> Agent:
    """The worker tests' agent, and ``pick ...``: a call of the client's ``pick_color``
    tool, then an answer with its output."""

    def respond(request: Any) -> list[Any]:
        if worker_agent._last_input(request).startswith("pick"):
            results = [m for m in request.messages if isinstance(m, ToolMessage)]
            if not results:
                return [
                    "Let me ask. ",
                    *tool_call("pick_color", {"options": ["red", "blue"]}, tool_call_id="c1"),
                ]
            return [f"You chose {results[-1].output}."]
        return worker_agent.respond(request)

    return Agent(
        name="worker-test",
        provider=ScriptedProvider(responder=respond, delay=delay, chunk_size=8, usage=USAGE),
        instructions="test",
        tools=[worker_agent.record, worker_agent.guarded],
    )


async def agui_post(url: str, body: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as c:
        return await c.post("/ag-ui", json=body)


async def agui_run(url: str, body: Any) -> list[dict[str, Any]]:
    """A run's events, each validated by the official models, the sequence checked."""
    with trio.fail_after(LIMIT):
        r = await agui_post(url, body)
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    for event in events:
        valid(event)
    check_sequence(events)
    return events


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")


async def test_an_agui_run_streams_a_queued_turn_as_valid_events_under_the_clients_ids(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, agui_agent()) as d:
        events = await agui_run(d.urls[0], run_input("t1", user("tools go", "u1"), runId="r1"))
        turns = await d.queue.turns("t1")
        record = await d.store.load("t1")
    assert (events[0]["type"], events[0]["threadId"], events[0]["runId"]) == (
        "RUN_STARTED",
        "t1",
        "r1",
    )
    assert [t.turn_id for t in turns] == ["r1"] and turns[0].status == "done"
    kinds = types(events)
    assert kinds.count("STEP_STARTED") == 3 and "REASONING_MESSAGE_CONTENT" in kinds
    assert [e["toolCallName"] for e in events if e["type"] == "TOOL_CALL_START"] == [
        "record",
        "record",
    ]
    assert text_of(events) == worker_agent.answer_text("tools go")
    assert events[-1]["type"] == "RUN_FINISHED" and events[-1]["outcome"] == {"type": "success"}
    assert record is not None and record.messages[0].id == "u1"  # the client's message id
    assert record.messages[1].id == "msg_r1"


async def test_an_agui_run_that_ends_without_a_snapshot_reads_the_thread_once(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AG-UI's closing ``MESSAGES_SNAPSHOT`` (the whole thread) goes out only when the run
    waits for input or a step started over; a run that just ends sends none, and its
    front end read the whole thread for it anyway, a second time (its request reads it
    once to see what is new): a 5,000-message thread 1.5 MB more a run."""
    from actors.stores.postgres import PostgresStore

    loads: list[str] = []
    load = PostgresStore.load

    async def counted(self: PostgresStore, session_id: str) -> Any:
        loads.append(session_id)
        return await load(self, session_id)

    async with protocols_deployment(pg_url, redis_url, agui_agent()) as d:
        first = await agui_run(d.urls[0], run_input("tl", user("hello", "u1"), runId="r1"))
        monkeypatch.setattr(PostgresStore, "load", counted)
        held = [user("hello", "u1"), {"id": "msg_r1", "role": "assistant", "content": "x"}]
        second = await agui_run(d.urls[0], run_input("tl", *held, user("again", "u2")))
    assert "MESSAGES_SNAPSHOT" not in types(first) + types(second)
    assert second[-1]["type"] == "RUN_FINISHED" and second[-1]["outcome"] == {"type": "success"}
    assert loads == ["tl"]


async def test_a_runid_used_again_in_any_thread_runs_under_a_new_turn_id(
    pg_url: str, redis_url: str
) -> None:
    # A careless client's constant runId: the queue holds a turn id once, so each later
    # run was a 400 for ever; it now runs (as it does without workers) under a new id.
    async with protocols_deployment(pg_url, redis_url, agui_agent()) as d:
        runs = [
            run_input("ta", user("tools go", "u1"), runId="run-1"),
            run_input("tb", user("tools go", "u1"), runId="run-1"),
            run_input("ta", user("tools go", "u1"), user("again", "u2"), runId="run-1"),
        ]
        started = [(await agui_run(d.urls[0], body))[0] for body in runs]
        ta, tb = await d.queue.turns("ta"), await d.queue.turns("tb")
    assert [e["runId"] for e in started] == ["run-1"] * 3  # each client sees its own
    assert [t.status for t in ta + tb] == ["done"] * 3
    assert ta[0].turn_id == "run-1" and len({t.turn_id for t in ta + tb}) == 3


async def test_a_new_agui_thread_starts_on_the_worker_from_the_messages_the_client_holds(
    pg_url: str, redis_url: str
) -> None:
    agent = agui_agent()
    async with protocols_deployment(pg_url, redis_url, agent) as d:
        earlier = [
            user("hello", "h1"),
            {"id": "h2", "role": "assistant", "content": "Hi there."},
        ]
        events = await agui_run(d.urls[0], run_input("t6", *earlier, user("again", "h3")))
        record = await d.store.load("t6")
    assert text_of(events) == "echo: again"
    sent = requests_of(agent)[-1].messages
    assert [m.text if isinstance(m, AssistantMessage) else m.content for m in sent[:3]] == [
        "hello",
        "Hi there.",
        "again",
    ]
    assert record is not None
    assert [getattr(m, "text", None) or m.content for m in record.messages] == [
        "hello",
        "Hi there.",
        "again",
        "echo: again",
    ]
    assert record.messages[2].id == "h3"  # the new message keeps the client's id


async def test_an_agui_client_tool_travels_to_the_worker_and_its_answer_resumes_the_turn(
    pg_url: str, redis_url: str
) -> None:
    agent = agui_agent()
    async with protocols_deployment(pg_url, redis_url, agent) as d:
        context = [{"description": "The user", "value": "Ada"}]
        body = run_input("t2", user("pick one", "m1"), tools=[COLOR_TOOL], context=context)
        first = await agui_run(d.urls[0], body)
        waiting = await d.queue.turns("t2")
        message_id = next(e["messageId"] for e in first if e["type"] == "TEXT_MESSAGE_START")
        history = [
            user("pick one", "m1"),
            {
                "id": message_id,
                "role": "assistant",
                "content": "Let me ask. ",
                "toolCalls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "pick_color", "arguments": "{}"}}
                ],
            },
            {"id": "answer-1", "role": "tool", "toolCallId": "c1", "content": "blue"},
        ]  # fmt: skip
        second = await agui_run(
            d.urls[0], run_input("t2", *history, tools=[COLOR_TOOL], runId="r2")
        )
        turns = await d.queue.turns("t2")
        record = await d.store.load("t2")
    offered = requests_of(agent)[0]
    assert "pick_color" in [t.name for t in offered.tools]
    assert "Ada" in (offered.instructions or "")
    (pending,) = first[-1]["outcome"]["pendingToolCallIds"]  # the call's wire id
    assert pending.endswith(".s0.c1")  # (answered by "c1" alone: still taken)
    assert [t.status for t in waiting] == ["awaiting-input"]
    assert text_of(second) == "You chose blue."
    assert second[-1]["outcome"] == {"type": "success"}
    assert [t.status for t in turns] == ["done"]  # the same turn, continued
    assert record is not None
    assert [type(m).__name__ for m in record.messages] == [
        "UserMessage",
        "AssistantMessage",
        "ToolMessage",
    ]


async def test_an_agui_approval_interrupts_and_its_resume_runs_the_tool_on_a_worker(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, agui_agent()) as d:
        first = await agui_run(d.urls[0], run_input("t3", user("approve it", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        resume = [
            {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
        ]
        second = await agui_run(
            d.urls[0], run_input("t3", user("approve it", "m1"), resume=resume, runId="r2")
        )
        replay = await agui_run(d.urls[0], run_input("t3", resume=resume, runId="r3"))
        turns = await d.queue.turns("t3")
    assert first[-1]["outcome"]["type"] == "interrupt"
    assert interrupt["toolCallId"].endswith(".s0.call_a")  # its wire id
    assert "TOOL_CALL_START" not in types(second)  # not re-emitted on resume
    (result,) = [e for e in second if e["type"] == "TOOL_CALL_RESULT"]
    assert result["content"] == "recorded 1"
    assert text_of(second) == worker_agent.answer_text("approve it")
    assert types(replay) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    assert [t.status for t in turns] == ["done"]


REASON = "n" * 1_000_000
"""A denial's reason far past :data:`CUT_LIMIT`: what a decision stores must be cut."""
CUT_LIMIT = 50


def stored_reason(record: Any) -> str | None:
    """The reason the session's (one) decided approval keeps."""
    assert record is not None
    call = next(
        p
        for m in record.messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    )
    assert call.awaiting is not None and call.awaiting.decided
    return call.awaiting.reason


async def test_an_agui_1mb_denial_reason_on_a_worker_front_end_is_stored_cut_to_the_limit(
    pg_url: str, redis_url: str
) -> None:
    # The front end records the decision with the agent's max_tool_result_chars: the
    # whole reason stayed in the session's rows before, though the model read only that.
    agent = attrs.evolve(agui_agent(), budget=Budget(max_tool_result_chars=CUT_LIMIT))
    async with protocols_deployment(pg_url, redis_url, agent) as d:
        first = await agui_run(d.urls[0], run_input("t9", user("approve it", "m1")))
        (interrupt,) = first[-1]["outcome"]["interrupts"]
        payload = {"approved": False, "reason": REASON}
        resume = [{"interruptId": interrupt["id"], "status": "resolved", "payload": payload}]
        await agui_run(
            d.urls[0], run_input("t9", user("approve it", "m1"), resume=resume, runId="r2")
        )
        record = await d.store.load("t9")
    assert stored_reason(record) == truncate_output(REASON, CUT_LIMIT)


async def test_agui_bad_input_in_a_worker_deployment_is_refused_in_its_shape_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, agui_agent(delay=0.05)) as d:
        url = d.urls[0]
        malformed = await agui_post(url, {"threadId": "t4", "runId": "r", "messages": "no"})
        forged = await agui_post(url, run_input("../t4", user("hi", "m0")))
        unknown_call = await agui_post(
            url,
            run_input("t4", {"id": "x", "role": "tool", "toolCallId": "nope", "content": "1"}),
        )
        nothing_queued = await d.queue.turns("t4")
        await agui_run(url, run_input("t4", user("approve it", "m1")))
        while_waiting = await agui_post(
            url, run_input("t4", user("approve it", "m1"), user("no", "m2"))
        )
        async with httpx.AsyncClient(base_url=url, timeout=LIMIT) as c:
            async with c.stream("POST", "/ag-ui", json=run_input("t5", user("tools long", "n1"))):
                await wait_for_turn(d.queue, "t5", "running")
                busy = await c.post("/ag-ui", json=run_input("t5", user("again", "n2")))
        turns = await d.queue.turns("t4")
        stored = await d.store.load("t4")
    assert (malformed.status_code, malformed.json()["code"]) == (400, "invalid_input")
    assert (forged.status_code, forged.json()["code"]) == (400, "invalid_thread_id")
    assert (unknown_call.status_code, unknown_call.json()["code"]) == (404, "unknown_tool_call")
    assert nothing_queued == []
    assert (while_waiting.status_code, while_waiting.json()["code"]) == (409, "interrupt_pending")
    assert (busy.status_code, busy.json()["code"]) == (409, "thread_busy")
    assert [t.status for t in turns] == ["awaiting-input"]  # the refused runs queued nothing
    assert stored is not None and [type(m).__name__ for m in stored.messages] == [
        "UserMessage",
        "AssistantMessage",
    ]


async def test_a_queued_run_stopped_before_a_worker_took_it_ends_as_cancelled(
    pg_url: str, redis_url: str
) -> None:
    # A run queued (no worker has claimed it yet) and stopped (POST /api/chat/{id}/stop,
    # by its message id here) got a 200 with no event at all: the encoder's end needed
    # the turn's start, which a turn cancelled in the queue never streams. Now the run
    # starts and ends with the cancelled outcome, as a run stopped mid-turn does.
    async with protocols_deployment(pg_url, redis_url, worker=False) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as c:
            replies: list[httpx.Response] = []

            async def run() -> None:
                replies.append(await c.post("/ag-ui", json=run_input("t1", user("hi", "m1"))))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await wait_for_turn(d.queue, "t1", "queued")
                stop = await c.post("/api/chat/t1/stop", json={"messageId": "m1"})
        turns = await d.queue.turns("t1")
    assert stop.status_code == 202
    events = parse_sse(replies[0].text)
    for event in events:
        valid(event)
    check_sequence(events)
    assert types(events) == ["RUN_STARTED", "RUN_FINISHED"]
    assert events[-1]["outcome"] == {"type": "cancelled"}
    assert events[-1]["metadata"] == {"axon": {"reason": "stopped by user"}}
    assert [t.status for t in turns] == ["cancelled"]


# -- A2A ------------------------------------------------------------------------------------


def at(url: str) -> Any:
    """What :func:`tests.test_a2a.sdk` needs of a server: its URL."""
    return SimpleNamespace(url=url)


def returning_at_once(request: Any) -> Any:
    request.configuration.CopyFrom(SendMessageConfiguration(return_immediately=True))
    return request


async def test_an_a2a_task_is_a_queued_turn_that_any_front_end_answers_for(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, fronts=2) as d:
        one, two = at(d.urls[0]), at(d.urls[1])
        with trio.fail_after(LIMIT):
            events = await sdk(one, lambda c: collect(c, a2a_user("tools a2a", context_id="c1")))
            task_id = events[0].task.id
            again = await sdk(two, lambda c: c.get_task(GetTaskRequest(id=task_id)))
            resent = await sdk(
                two, lambda c: collect(c, a2a_user("tools a2a", context_id="c1")), streaming=False
            )
        turns = await d.queue.turns("c1")
    assert [t.status for t in turns] == ["done"]  # the resent message ran nothing
    assert task_id == f"c1~msg_{turns[0].turn_id}"
    assert events[0].task.status.state in (
        TaskState.TASK_STATE_SUBMITTED,
        TaskState.TASK_STATE_WORKING,
    )
    assert answer_of(events) == worker_agent.answer_text("tools a2a")
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED
    assert again.status.state == TaskState.TASK_STATE_COMPLETED
    assert "".join(p.text for p in again.artifacts[0].parts) == answer_of(events)
    assert [m.message_id for m in again.history] == ["m1"]
    assert resent[0].task.id == task_id


async def test_an_a2a_message_sent_to_a_stored_context_reads_none_of_its_messages(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``message/send`` asks whether its message id was sent before (a retry answers with
    the task it started): the front end loaded the whole context for that, each send
    (5,000 messages 1.2 MB). Now the id is looked up alone; only a resend loads it."""
    from actors.stores.postgres import PostgresStore

    loads: list[str] = []
    load = PostgresStore.load

    async def counted(self: PostgresStore, session_id: str) -> Any:
        loads.append(session_id)
        return await load(self, session_id)

    async with protocols_deployment(pg_url, redis_url, fronts=1) as d:
        front = at(d.urls[0])
        with trio.fail_after(LIMIT):
            await sdk(front, lambda c: collect(c, a2a_user("tools a2a", context_id="c1")))
            monkeypatch.setattr(PostgresStore, "load", counted)
            two = a2a_user("tools again", message_id="m2", context_id="c1")
            second = await sdk(front, lambda c: collect(c, two))
            sent_loads = list(loads)
            resent = await sdk(front, lambda c: collect(c, two), streaming=False)
        turns = await d.queue.turns("c1")
    assert sent_loads == []
    assert [t.status for t in turns] == ["done", "done"]
    assert last_state(second) == TaskState.TASK_STATE_COMPLETED
    assert resent[0].task.id == second[0].task.id


async def test_an_a2a_messages_hop_count_is_the_depth_its_queued_turn_runs_at(
    pg_url: str, redis_url: str
) -> None:
    # Agents calling agents over A2A ran without end (A -> B -> A): the message's hop
    # count (metadata axonHops) is the depth the task's turn runs at, so the agents it
    # calls in turn stop at their max_depth (tests/test_a2a.py has the loop itself).
    async with protocols_deployment(pg_url, redis_url) as d:
        with trio.fail_after(LIMIT):
            answer = await A2AAgent(d.urls[0]).run("tools hops", depth=2)
        (info,) = await d.store.list_sessions()
        record = await d.store.load(info.session_id)
    assert answer == worker_agent.answer_text("tools hops")
    assert record is not None and record.meta["agent_depth"] == 3


async def test_an_a2a_message_cannot_lower_the_depth_its_queued_context_runs_at(
    pg_url: str, redis_url: str
) -> None:
    # A caller re-using a context with a smaller hop count reset the chain's depth (the
    # worker merged the submitted turn's meta as it came).
    async with protocols_deployment(pg_url, redis_url) as d:
        stored = []
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as http:
            for n, hops in enumerate((6, 1)):
                message = {
                    "messageId": f"m{n}",
                    "contextId": "deep",
                    "role": "ROLE_USER",
                    "parts": [{"text": "tools hops"}],
                    "metadata": {"axonHops": hops},
                }
                body = {"jsonrpc": "2.0", "id": n, "method": "SendMessage"}
                with trio.fail_after(LIMIT):
                    r = await http.post(
                        "/a2a/jsonrpc", json={**body, "params": {"message": message}}
                    )
                assert r.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
                record = await d.store.load("deep")
                assert record is not None
                stored.append(record.meta["agent_depth"])
    assert stored == [6, 6]


async def test_an_a2a_task_waiting_for_approval_resumes_on_a_worker_from_the_decision(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, fronts=2) as d:

        async def ask(client: Any) -> list[Any]:
            return await collect(client, a2a_user("approve it", message_id="q", context_id="c2"))

        with trio.fail_after(LIMIT):
            asked = await sdk(at(d.urls[0]), ask)
            task = asked[0].task
            status = asked[-1].status_update.status
            pending = MessageToDict(status.message.parts[1].data)["pending"]
            decision = {"decisions": [{"id": pending[0]["id"], "approved": True}]}
            request = a2a_user(message_id="d", task_id=task.id, data=decision)
            answered = await sdk(at(d.urls[1]), lambda c: collect(c, request))
        turns = await d.queue.turns("c2")
    assert last_state(asked) == TaskState.TASK_STATE_INPUT_REQUIRED
    assert [(p["kind"], p["tool"]) for p in pending] == [("approval", "guarded")]
    assert answered[0].task.id == task.id  # the same task goes on
    # the Task carries the answer so far, then the continuation streams the rest
    assert answer_of(answered) == "I need your approval. " + worker_agent.answer_text("approve it")
    assert last_state(answered) == TaskState.TASK_STATE_COMPLETED
    assert [t.status for t in turns] == ["done"]


async def test_an_a2a_1mb_denial_reason_on_a_worker_front_end_is_stored_cut_to_the_limit(
    pg_url: str, redis_url: str
) -> None:
    # As the AG-UI one: the queued A2A front end records with the agent's limit.
    agent = attrs.evolve(scripted_agent(), budget=Budget(max_tool_result_chars=CUT_LIMIT))
    async with protocols_deployment(pg_url, redis_url, agent) as d:
        with trio.fail_after(LIMIT):
            asked = await sdk(
                at(d.urls[0]), lambda c: collect(c, a2a_user("approve it", context_id="c9"))
            )
            status = asked[-1].status_update.status
            pending = MessageToDict(status.message.parts[1].data)["pending"]
            decision = {
                "decisions": [{"id": pending[0]["id"], "approved": False, "reason": REASON}]
            }
            request = a2a_user(message_id="d", task_id=asked[0].task.id, data=decision)
            await sdk(at(d.urls[0]), lambda c: collect(c, request))
            await wait_for_turn_to_end(d, "c9")
            record = await d.store.load("c9")
    assert stored_reason(record) == truncate_output(REASON, CUT_LIMIT)


async def test_subscribing_on_another_front_end_gives_the_task_then_its_updates_to_the_end(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, scripted_agent(0.02), fronts=2) as d:
        request = returning_at_once(a2a_user("tools follow", context_id="c3"))
        with trio.fail_after(LIMIT):
            (sent,) = await sdk(at(d.urls[0]), lambda c: collect(c, request), streaming=False)

            async def follow(client: Any) -> list[Any]:
                return [e async for e in client.subscribe(SubscribeToTaskRequest(id=sent.task.id))]

            events = await sdk(at(d.urls[1]), follow)
    assert events[0].task.id == sent.task.id  # the current Task first
    assert events[0].task.status.state == TaskState.TASK_STATE_WORKING
    assert answer_of(events) == worker_agent.answer_text("tools follow")
    assert last_state(events) == TaskState.TASK_STATE_COMPLETED


async def test_a_task_whose_turn_ended_reads_completed_where_its_follower_lags(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The front end that took the message follows its turn from the relay; when that
    # follower lags (another front end may have streamed the end already), GetTask still
    # answers from the row and the store, not from the follower's "working".
    lagging = trio.Event()
    drive = QueuedTaskBook._drive_queued

    async def lag(self: QueuedTaskBook, live: Any, turn: Any) -> None:
        await lagging.wait()
        await drive(self, live, turn)

    monkeypatch.setattr(QueuedTaskBook, "_drive_queued", lag)
    async with protocols_deployment(pg_url, redis_url, fronts=1) as d:
        request = returning_at_once(a2a_user("tools lag", context_id="c9"))
        with trio.fail_after(LIMIT):
            (sent,) = await sdk(at(d.urls[0]), lambda c: collect(c, request), streaming=False)
            await wait_for_turn_to_end(d, "c9")
            task = await sdk(at(d.urls[0]), lambda c: c.get_task(GetTaskRequest(id=sent.task.id)))
            lagging.set()
    assert sent.task.status.state == TaskState.TASK_STATE_WORKING
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert "".join(p.text for p in task.artifacts[0].parts) == worker_agent.answer_text("tools lag")


async def test_canceling_a_running_a2a_task_cancels_its_turn_and_is_idempotent(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, scripted_agent(0.05), fronts=2) as d:
        request = returning_at_once(a2a_user("tools cancel me", context_id="c4"))
        with trio.fail_after(LIMIT):
            (sent,) = await sdk(at(d.urls[0]), lambda c: collect(c, request), streaming=False)
            await wait_for_turn(d.queue, "c4", "running")
            cancel = CancelTaskRequest(id=sent.task.id)
            first = await sdk(at(d.urls[1]), lambda c: c.cancel_task(cancel), streaming=False)
            turn = await wait_for_turn_to_end(d, "c4")
            again = await sdk(at(d.urls[0]), lambda c: c.cancel_task(cancel), streaming=False)
            later = await sdk(at(d.urls[1]), lambda c: c.get_task(GetTaskRequest(id=sent.task.id)))
    assert first.status.state == again.status.state == TaskState.TASK_STATE_CANCELED
    assert later.status.state == TaskState.TASK_STATE_CANCELED
    assert turn.status == "cancelled"


async def test_canceling_a_waiting_a2a_task_denies_its_calls_and_runs_no_continuation(
    pg_url: str, redis_url: str
) -> None:
    agent = scripted_agent()
    async with protocols_deployment(pg_url, redis_url, agent) as d:
        with trio.fail_after(LIMIT):
            asked = await sdk(
                at(d.urls[0]), lambda c: collect(c, a2a_user("approve no", context_id="c5"))
            )
            cancel = CancelTaskRequest(id=asked[0].task.id)
            canceled = await sdk(at(d.urls[0]), lambda c: c.cancel_task(cancel), streaming=False)
            turn = await wait_for_turn_to_end(d, "c5")
            record = await d.store.load("c5")
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED
    assert turn.status == "cancelled"
    assert len(requests_of(agent)) == 1  # no model call after the denial
    assert record is not None
    call = next(p for p in record.messages[1].content if isinstance(p, ToolCallPart))
    assert call.awaiting is not None and call.awaiting.decided and not call.awaiting.approved


async def test_a2a_bad_input_in_a_worker_deployment_is_answered_in_a2as_shape_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, scripted_agent(0.05)) as d:
        server = at(d.urls[0])

        async def unknown(client: Any) -> None:
            for task_id in ("nope", "ctx~missing", "ctx~msg_turn_nope", "a/b~c"):
                with pytest.raises(TaskNotFoundError):
                    await client.get_task(GetTaskRequest(id=task_id))
                with pytest.raises(TaskNotFoundError):
                    await client.cancel_task(CancelTaskRequest(id=task_id))
            with pytest.raises(InvalidParamsError, match="contextId"):
                await collect(client, a2a_user("x", message_id="f", context_id="../forged"))

        async def finished(client: Any) -> Any:
            (done,) = await collect(client, a2a_user("hi", message_id="1", context_id="alice"))
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=done.task.id))
            with pytest.raises(InvalidParamsError, match="not the context"):
                hijack = a2a_user("x", message_id="2", context_id="mallory", task_id=done.task.id)
                await collect(client, hijack)
            return done

        async def subscribe_finished(client: Any) -> None:
            with pytest.raises(UnsupportedOperationError, match="terminal"):
                async for _ in client.subscribe(SubscribeToTaskRequest(id=done.task.id)):
                    pass

        async def busy(client: Any) -> None:
            await collect(client, returning_at_once(a2a_user("tools", context_id="b")))
            with pytest.raises(UnsupportedOperationError, match="one task runs per context"):
                await collect(client, a2a_user("more", message_id="m2", context_id="b"))

        with trio.fail_after(LIMIT):
            await sdk(server, unknown)
            done = await sdk(server, finished, streaming=False)
            await sdk(server, subscribe_finished)
            await sdk(server, busy, streaming=False)
        sessions = sorted(s.session_id for s in await d.store.list_sessions())
        mallory = await d.queue.turns("mallory")
        b_turns = await d.queue.turns("b")
    assert mallory == [] and len(b_turns) == 1
    assert "ctx" not in sessions and "mallory" not in sessions


async def test_an_agui_run_stopped_before_it_came_through_another_front_end_is_stopped(
    pg_url: str, redis_url: str
) -> None:
    # Stop (naming the run's message) reached a front end before the run reached the
    # other: nothing was kept, and the run went on to its answer.
    async with protocols_deployment(pg_url, redis_url, fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as c:
            stop = await c.post(f"{d.urls[1]}/api/chat/t1/stop", json={"messageId": "m1"})
        events = await agui_run(d.urls[0], run_input("t1", user("hi", "m1")))
        record = await d.store.load("t1")
    assert stop.status_code == 204
    assert events[-1]["type"] == "RUN_FINISHED"
    assert events[-1]["outcome"] == {"type": "cancelled"}
    assert record is not None and [m.role for m in record.messages] == ["user", "assistant"]
    assert record.messages[-1].interrupted
