"""The OpenAI-compatible endpoint, AG-UI and A2A in a worker deployment's front end:
turns queued in PostgreSQL, run by a worker, read back from the Redis relay, each
encoded by its protocol's own encoder. A real front end and a real worker (in this
process; tests/test_worker_protocols_processes.py runs them as processes) on the test
run's own PostgreSQL and Redis, driven by each protocol's official client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from runtime import output as o
from runtime.agent import Agent
from runtime.app.web.queued_turn import RestartFilter
from runtime.chunks import Usage
from runtime.messages import AssistantMessage, SystemMessage, UserMessage
from runtime.relay import StepRestarted
from tests.support import worker_agent
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, Deployment, deployment, wait_for_turn

ALL = ("ai-sdk", "openai")
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
