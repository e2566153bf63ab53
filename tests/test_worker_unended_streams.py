"""A worker killed between a turn's last commit and its stream's end leaves a relay
stream nobody ends (the chaos run, tests/support/chaos.py, found it). Every adapter of a
worker deployment's front end reads a queued turn through
:func:`runtime.app.web.watch.follow_turn`, which gives such a stream up once the queue
says the turn ended and the stream still shows nothing; each adapter then ends its
response in its own protocol's way, as it does for a stream the relay lost. Before, the
OpenAI-compatible, AG-UI, A2A and MCP adapters waited for the stream's end until it
expired, a day later (the AI SDK endpoint's case: tests/test_frontend.py).

Real front end and worker, the test run's own PostgreSQL and Redis; the worker's relay
writer is made to stop before it writes the stream's end, as the killed worker did."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import openai
import pytest
import trio
from a2a.types.a2a_pb2 import GetTaskRequest, TaskState

from runtime import output as o
from runtime.app.web import watch
from runtime.app.web.a2a_queued import QueuedTaskBook
from tests.support import worker_agent
from tests.support.redis import require_redis
from tests.test_a2a import collect, sdk
from tests.test_a2a import user as a2a_user
from tests.test_agui import check_sequence, parse_sse, run_input, user, valid
from tests.test_worker_mcp import TOOL, mcp_client, mcp_deployment
from tests.test_worker_protocols import (
    agui_agent,
    agui_post,
    at,
    openai_client,
    protocols_deployment,
    returning_at_once,
    text_of,
)

ENDS_WITHIN = 20
"""Seconds a response may take to end: the turn is a few words, the give-up two looks."""


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(params=["finish shown", "finish lost"])
def finish(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The worker's relay writer stops before the stream's end, as a worker killed right
    after the turn's last commit: with the turn's ``finish`` streamed, or killed before
    it flushed that (dropped here). The looks come sooner."""
    from actors.relays.redis_writer import RedisRelayWriter

    monkeypatch.setattr(watch, "IDLE_LOOK", 0.2)
    real_close = RedisRelayWriter.aclose
    real_append = RedisRelayWriter.append

    async def dies_before_the_end(self: Any, *, final: bool = True, **options: Any) -> None:
        if not final:  # (options: ``paused``, and whatever else a worker passes)
            await real_close(self, final=final, **options)

    def kept(chunk: Any) -> bool:
        return not (request.param == "finish lost" and type(chunk) is o.Finish)

    def append(self: Any, chunk: Any) -> None:
        if kept(chunk):
            real_append(self, chunk)

    monkeypatch.setattr(RedisRelayWriter, "aclose", dies_before_the_end)
    monkeypatch.setattr(RedisRelayWriter, "append", append)
    real_extend = getattr(RedisRelayWriter, "extend", None)
    if real_extend is not None:  # a worker that forwards its chunks in batches

        def extend(self: Any, chunks: Any) -> None:
            real_extend(self, [c for c in chunks if kept(c)])

        monkeypatch.setattr(RedisRelayWriter, "extend", extend)
    return str(request.param)


async def test_an_openai_stream_ends_once_its_turn_ended(
    pg_url: str, redis_url: str, finish: str
) -> None:
    async with protocols_deployment(pg_url, redis_url) as d, openai_client(d.urls[0]) as c:
        chunks: list[Any] = []
        with trio.fail_after(ENDS_WITHIN):
            stream = await c.chat.completions.create(
                model="worker-test",
                messages=[{"role": "user", "content": "tools please"}],
                stream=True,
                extra_headers={"X-Axon-Session": "oa-1"},
            )
            try:
                async for chunk in stream:
                    chunks.append(chunk)
                failed = None
            except openai.APIError as exc:  # an error event in the stream
                failed = exc
        turns = await d.queue.turns("oa-1")
    assert [t.status for t in turns] == ["done"]
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert content == worker_agent.answer_text("tools please")
    if finish == "finish shown":  # the turn's end came: the response ends as the turn's
        assert failed is None
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    else:  # lost before it: OpenAI's error event, as for a stream the relay lost
        assert failed is not None and "RelayTurnGone" in str(failed)


async def test_an_agui_run_ends_once_its_turn_ended(
    pg_url: str, redis_url: str, finish: str
) -> None:
    async with protocols_deployment(pg_url, redis_url, agui_agent()) as d:
        with trio.fail_after(ENDS_WITHIN):
            r = await agui_post(d.urls[0], run_input("t1", user("tools go", "u1"), runId="r1"))
        turns = await d.queue.turns("t1")
    assert [t.status for t in turns] == ["done"]
    events = parse_sse(r.text)
    for event in events:
        valid(event)
    check_sequence(events)
    assert text_of(events) == worker_agent.answer_text("tools go")
    if finish == "finish shown":
        assert events[-1]["type"] == "RUN_FINISHED"
        assert events[-1]["outcome"] == {"type": "success"}
    else:
        assert (events[-1]["type"], events[-1]["code"]) == ("RUN_ERROR", "RelayTurnGone")


async def test_an_a2a_tasks_follower_ends_once_its_turn_ended(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch, finish: str
) -> None:
    """The front end follows a task's turn from the relay in the background (what its
    streaming and subscribing clients get); GetTask answers from the row either way."""
    followed: list[Any] = []
    ended = trio.Event()
    drive = QueuedTaskBook._drive_queued

    async def follow(self: QueuedTaskBook, live: Any, turn: Any) -> None:
        followed.append(live)
        await drive(self, live, turn)
        ended.set()

    monkeypatch.setattr(QueuedTaskBook, "_drive_queued", follow)
    async with protocols_deployment(pg_url, redis_url) as d:
        request = returning_at_once(a2a_user("tools a2a", context_id="c1"))
        (sent,) = await sdk(at(d.urls[0]), lambda c: collect(c, request), streaming=False)
        with trio.fail_after(ENDS_WITHIN):
            await ended.wait()
        turns = await d.queue.turns("c1")
        task = await sdk(at(d.urls[0]), lambda c: c.get_task(GetTaskRequest(id=sent.task.id)))
    assert [t.status for t in turns] == ["done"]
    (live,) = followed
    assert not live.running
    answer = worker_agent.answer_text("tools a2a")
    if finish == "finish shown":
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert "".join(p.text for p in task.artifacts[0].parts) == answer
    else:  # A2A's error form: the task failed, its note says what became of the stream
        assert task.status.state == TaskState.TASK_STATE_FAILED
        assert "stream" in task.status.message.parts[0].text  # lost, or not ended


async def test_an_mcp_call_is_answered_once_its_turn_ended(
    pg_url: str, redis_url: str, finish: str
) -> None:
    async with mcp_deployment(pg_url, redis_url) as d, mcp_client(d.urls[0]) as c:
        with trio.fail_after(ENDS_WITHIN):
            result = await c.call_tool(TOOL, {"prompt": "tools please"})
    if finish == "finish shown":
        assert not result.is_error
        assert result.structured_content is not None
        answer = result.structured_content["answer"]
        assert answer == worker_agent.answer_text("tools please")
    else:  # MCP's error form: a tool error that names the lost stream and the session
        assert result.is_error
        assert "the turn failed" in result.content[0].text and "stream" in result.content[0].text


async def test_the_look_asks_the_queue_only_when_quiet_and_gives_up_on_two_ended_looks() -> None:
    """:class:`EndedTurnLook`, as the relay's live read calls it (the seconds it has
    shown nothing): no query before :data:`IDLE_LOOK` of quiet, a query per
    :data:`IDLE_LOOK` after; a stream that moves starts the count over; a running turn is
    never given up; two looks in a row at an ended turn give its stream up."""
    from runtime.app.web.watch import IDLE_LOOK, EndedTurnLook
    from runtime.errors import RelayTurnGone

    statuses = ["running", "done", "done", "done", "done"]
    asked: list[str] = []

    class Queue:
        async def get_status(self, turn_id: str) -> Any:
            asked.append(turn_id)
            return SimpleNamespace(finished=statuses.pop(0) == "done")

    look = EndedTurnLook(Queue(), "t1")  # type: ignore[arg-type]
    await look(IDLE_LOOK / 2)
    assert asked == []  # not quiet long enough
    await look(IDLE_LOOK)  # running
    await look(IDLE_LOOK * 1.5)
    assert len(asked) == 1  # the next look is due IDLE_LOOK later
    await look(IDLE_LOOK * 2)  # done: one look
    await look(IDLE_LOOK / 4)  # the stream moved: the count starts over
    await look(IDLE_LOOK)  # done, first look since it moved
    with pytest.raises(RelayTurnGone):
        await look(IDLE_LOOK * 2)  # done, second: given up
    assert len(asked) == 4 and look.looks == 4
