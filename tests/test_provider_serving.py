"""The base shared by providers and the tool executor (runtime.actor.ServingActor).

Requests are served in child tasks and tracked while in flight; when the actor crashes,
every request the crash cut short is answered with a clear error (none waits forever),
and a request that already finished is never answered twice.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from actors.tool_executor import ToolExecutor
from runtime import Bus, RestartPolicy, tool
from runtime.actor import Supervisor
from runtime.actor_messages import (
    ExecuteTools,
    InferRequest,
    StreamFailed,
    ToolCallSpec,
    ToolOutcome,
)
from runtime.chunks import FinishChunk, TextChunk
from runtime.errors import ActorFailed
from runtime.inbox import Inbox
from runtime.provider import Provider


class Serving(Provider):
    """``slow-*`` requests stream ``hi`` and wait for ever; ``bug-*`` requests, once
    ``release`` is set, make the provider's own error handling raise (a crash in a
    request's task); the message ``"crash"`` crashes :meth:`handle`; any other request
    streams ``hi`` and finishes."""

    provider_name = "serving"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.release = trio.Event()

    async def stream(self, request: InferRequest, emit: Any) -> None:
        await emit(TextChunk(text="hi"))
        if request.request_id.startswith("slow"):
            await trio.sleep_forever()
        if request.request_id.startswith("bug"):
            await self.release.wait()
            raise ValueError("the call failed")
        await emit(FinishChunk(reason="stop", raw_reason="stop"))

    def classify_error(self, exc: BaseException) -> Any:
        raise RuntimeError("classifier bug")

    async def handle_other(self, message: Any) -> None:
        if message == "crash":
            raise RuntimeError("provider bug")


def infer(request_id: str) -> InferRequest:
    return InferRequest(
        request_id=request_id,
        session_id="s1",
        turn_id="t1",
        step=0,
        instructions=None,
        messages=(),
        tools=(),
        reply=Inbox(64),
        cancel_scope=trio.CancelScope(),
    )


def received(inbox: Inbox) -> list[Any]:
    """Every item of every batch waiting in ``inbox``."""
    batches: list[Any] = []
    inbox.drain_nowait(batches)
    return [item for batch in batches for item in batch]


async def start(nursery: trio.Nursery, actor: Any, intensity: int = 3) -> Supervisor:
    supervisor = Supervisor(Bus(), RestartPolicy(intensity=intensity, period=60))
    await nursery.start(supervisor.supervise, actor)
    return supervisor


async def test_a_crash_fails_the_calls_running_in_other_tasks(autojump_clock):
    provider = Serving(model="m")
    async with trio.open_nursery() as nursery:
        await start(nursery, provider)
        slow = infer("slow-1")
        await provider.send(slow)
        await trio.testing.wait_all_tasks_blocked()
        assert provider.in_flight == [slow]
        await provider.send("crash")
        await trio.testing.wait_all_tasks_blocked()
        items = received(slow.reply)
        assert provider.in_flight == []
        provider.stop()
    assert [type(i) for i in items] == [TextChunk, StreamFailed]
    error = items[-1].error
    assert isinstance(error, ActorFailed)
    assert str(error) == "provider serving:m crashed: RuntimeError: provider bug"


async def test_a_crash_in_one_call_answers_it_and_its_siblings(autojump_clock):
    provider = Serving(model="m")
    async with trio.open_nursery() as nursery:
        await start(nursery, provider)
        slow, bug = infer("slow-1"), infer("bug-1")
        await provider.send(slow)
        await provider.send(bug)
        provider.release.set()
        await trio.testing.wait_all_tasks_blocked()
        failures = [received(r.reply)[-1] for r in (slow, bug)]
        provider.stop()
    assert all(isinstance(f, StreamFailed) for f in failures)
    assert all("RuntimeError: classifier bug" in str(f.error) for f in failures)


async def test_a_finished_call_is_not_answered_again_by_a_later_crash(autojump_clock):
    provider = Serving(model="m")
    async with trio.open_nursery() as nursery:
        await start(nursery, provider)
        bug, done = infer("bug-1"), infer("fast-1")
        await provider.send(bug)
        await provider.send(done)  # the last message handled before the crash
        await trio.testing.wait_all_tasks_blocked()
        assert provider.in_flight == [bug]
        provider.release.set()  # bug-1's task now crashes the actor
        await trio.testing.wait_all_tasks_blocked()
        items = received(done.reply)
        provider.stop()
    assert [type(i) for i in items] == [TextChunk, FinishChunk]


async def test_a_call_cancelled_by_its_requester_is_not_in_flight_nor_failed(autojump_clock):
    provider = Serving(model="m")
    async with trio.open_nursery() as nursery:
        await start(nursery, provider)
        slow = infer("slow-1")
        await provider.send(slow)
        await trio.testing.wait_all_tasks_blocked()
        slow.cancel_scope.cancel()
        await trio.testing.wait_all_tasks_blocked()
        assert provider.in_flight == []
        await provider.send("crash")
        await trio.testing.wait_all_tasks_blocked()
        items = received(slow.reply)
        provider.stop()
    assert items == []  # (what it streamed unread is taken back: nobody reads it now)


class Late(Provider):
    """Streams ``hi``; once ``go`` is set, its requester's cancel lands while the call's
    task is already scheduled, and it puts one more batch before its next schedule
    point."""

    provider_name = "late"

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.go = trio.Event()

    async def stream(self, request: InferRequest, emit: Any) -> None:
        await emit(TextChunk(text="hi"))
        await self.go.wait()
        request.cancel_scope.cancel()  # (as the turn's end does, from another task)
        await emit(TextChunk(text="late"))  # a put with room does not yield
        await trio.lowlevel.checkpoint()


async def test_a_batch_put_after_the_requester_cancelled_is_not_left_in_its_inbox(
    autojump_clock,
):
    # A cancelled turn's engine rests with an empty inbox; a batch its provider put
    # after the cancel sat there, unread, until the session's next turn.
    provider = Late(model="m")
    async with trio.open_nursery() as nursery:
        await start(nursery, provider)
        call = infer("c-1")
        await provider.send(call)
        first = await call.reply.get()
        first.taken = True  # (the engine took the first batch)
        provider.go.set()
        await trio.testing.wait_all_tasks_blocked()
        assert provider.in_flight == []
        assert len(call.reply) == 0 and call.reply.parked
        provider.stop()
    assert [c.text for c in first] == ["hi"]


async def test_giving_up_fails_the_calls_still_queued(autojump_clock):
    provider = Serving(model="m")
    queued = infer("fast-1")
    await provider.send("crash")  # both wait in the inbox before the actor starts
    await provider.send(queued)
    async with trio.open_nursery() as nursery:
        await start(nursery, provider, intensity=0)
        await provider.stopped.wait()
    (failure,) = received(queued.reply)
    assert isinstance(failure, StreamFailed) and isinstance(failure.error, ActorFailed)
    assert provider.inbox.closed


async def test_stopping_waits_for_the_calls_in_flight(autojump_clock):
    provider = Serving(model="m")
    async with trio.open_nursery() as nursery:
        await start(nursery, provider)
        request = infer("fast-1")
        await provider.send(request)
        provider.stop()
        await provider.stopped.wait()
    assert [type(i) for i in received(request.reply)] == [TextChunk, FinishChunk]


# -- the tool executor, on the same base ------------------------------------------------


@tool
async def wait_forever() -> str:
    """Never returns."""
    await trio.sleep_forever()
    return "unreachable"


@tool
async def quick() -> str:
    """Returns at once."""
    return "done"


class CrashingExecutor(ToolExecutor):
    async def handle_other(self, message: Any) -> None:
        if message == "crash":
            raise RuntimeError("executor bug")


def execute(*calls: tuple[str, str]) -> ExecuteTools:
    return ExecuteTools(
        session_id="s1",
        turn_id="t1",
        step=0,
        calls=tuple(ToolCallSpec(tool_call_id=i, tool_name=n, input={}) for i, n in calls),
        tools={"wait_forever": wait_forever, "quick": quick},
        default_timeout=None,
        max_result_chars=None,
        reply=Inbox(64),
        cancel_scope=trio.CancelScope(),
    )


async def test_an_executor_crash_answers_only_the_calls_not_yet_answered(autojump_clock):
    executor = CrashingExecutor()
    async with trio.open_nursery() as nursery:
        await start(nursery, executor)
        request = execute(("A", "quick"), ("B", "wait_forever"))
        await executor.send(request)
        await trio.testing.wait_all_tasks_blocked()
        await executor.send("crash")
        await trio.testing.wait_all_tasks_blocked()
        outcomes: list[ToolOutcome] = []
        request.reply.drain_nowait(outcomes)
        executor.stop()
    assert [(o.tool_call_id, o.output, o.error) for o in outcomes] == [
        ("A", "done", None),
        (
            "B",
            None,
            "the tool executor 'tool-executor' crashed (RuntimeError: executor bug); "
            "the call did not complete",
        ),
    ]
