"""Crash safety and supervision.

* A child process runs multi-step turns on an SQLite store and is killed with SIGKILL at
  random moments (several seeds). After every kill the store opens, the session loads,
  its history is valid for the next request, nothing saved before is lost, and a new
  host continues the session.
* A tool executor that crashes is restarted by policy; past its restart intensity only
  the session that uses it fails, with a clear error, and every other session carries on.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from actors.stores import MemoryStore, SQLiteStore
from actors.tool_executor import ToolExecutor
from runtime import Agent, Host, RestartPolicy, StoreCorrupt, StoreError, tool
from runtime import events as ev
from runtime.actor_messages import ExecuteTools
from runtime.history import repair
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage, UserMessage
from tests.support.faults import check_history, drain, oa_text, oa_tool_calls, rig
from tests.support.grammar import check_grammar
from tests.support.loopback import Reply

REPO = Path(__file__).resolve().parents[1]
SEEDS = range(6)

# -- SIGKILL at random points -------------------------------------------------------------


async def _run_child_and_kill(path: Path, delay: float) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "tests.support.crash_child", str(path), "victim"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        with trio.fail_after(30):
            buf = b""
            while b"ready\n" not in buf:
                data = await proc.stdout.receive_some(1024)
                assert data, f"the child exited before it was ready ({proc.returncode})"
                buf += data
        await trio.sleep(delay)
        assert proc.poll() is None, "the child died on its own"
    finally:
        proc.send_signal(signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await proc.wait()
            await proc.stdout.aclose()
    assert proc.returncode == -signal.SIGKILL


def _assert_valid(messages) -> None:
    """What a killed process left is a history the next request can use as it is."""
    check_history(messages)  # every saved call is already paired with its result
    assert repair(messages) == list(messages)  # the repair pass has nothing to fix
    for i, msg in enumerate(messages):
        if isinstance(msg, UserMessage):
            assert isinstance(messages[i + 1], AssistantMessage), "a user input with no reply"


def _marked_as_loaded(stored: list, loaded: list) -> list:
    """``stored`` with its last assistant message marked interrupted if the host that
    ``loaded`` it did so: the killed child left its turn running (runtime.liveness)."""
    last = max((i for i, m in enumerate(stored) if m.role == "assistant"), default=None)
    if last is None or len(loaded) <= last or not loaded[last].interrupted:
        return stored
    return [*stored[:last], attrs.evolve(stored[last], interrupted=True), *stored[last + 1 :]]


async def test_sigkill_at_random_points_leaves_a_session_that_loads_and_continues(tmp_path):
    path = tmp_path / "sessions.db"
    previous: list = []
    grew = 0
    for seed in SEEDS:
        delay = random.Random(seed).uniform(0.05, 1.0)
        await _run_child_and_kill(path, delay)

        store = await SQLiteStore.open(path)  # no StoreCorrupt
        try:
            record = await store.load("victim")
        finally:
            await store.aclose()
        messages = list(record.messages) if record is not None else []
        _assert_valid(messages)
        # nothing that was saved before the kill is lost or rewritten
        assert [m.id for m in messages[: len(previous)]] == [m.id for m in previous]
        grew += len(messages) > len(previous)

        # a new host resumes the session and runs the next turn on it
        provider = ScriptedProvider([["resumed fine"]])
        agent = Agent(name="crashy", provider=provider)
        async with Host.open(store=str(path), log_tap=False) as host:
            session = await host.open_session(agent, session_id="victim")
            messages = _marked_as_loaded(messages, list(session.messages))
            assert list(session.messages) == messages
            with trio.fail_after(10):
                result = await session.run("are you there?")
        assert result.finish_reason == "stop" and result.text == "resumed fine"
        (request,) = provider.requests
        assert list(request.messages[: len(messages)]) == messages
        store = await SQLiteStore.open(path)
        try:
            previous = list((await store.load("victim")).messages)
        finally:
            await store.aclose()
        assert previous[: len(messages)] == messages and len(previous) == len(messages) + 2
        _assert_valid(previous)
    assert grew >= 3  # the child did make progress between kills
    calls = [p for m in previous if isinstance(m, AssistantMessage) for p in m.content]
    assert any(isinstance(p, ToolCallPart) for p in calls)
    assert any(isinstance(m, ToolMessage) and m.output for m in previous)


async def test_a_foreign_store_file_is_a_clear_error_and_is_left_untouched(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"my precious notes\n")
    with pytest.raises(StoreCorrupt, match="not an Axon store"):
        async with Host.open(store=str(path), log_tap=False):
            pass
    assert path.read_bytes() == b"my precious notes\n"


# -- supervision: a crashing tool executor --------------------------------------------------


class CrashingExecutor(ToolExecutor):
    """A tool executor whose handler raises on its first ``crashes`` requests."""

    def __init__(self, crashes: int) -> None:
        super().__init__(name="flaky-tools")
        self.crashes = crashes

    async def handle(self, message):
        if isinstance(message, ExecuteTools) and self.crashes:
            self.crashes -= 1
            raise RuntimeError("executor bug")
        await super().handle(message)


@tool
async def echo(text: str) -> str:
    """Echo the text."""
    return text


async def test_a_tool_executor_that_crashes_is_restarted_and_the_turn_goes_on(autojump_clock):
    step = oa_tool_calls(("call_1", "echo", ['{"text": "a"}']))
    async with rig("openai", tools=[echo]) as r:
        watch = r.host.bus.subscribe([ev.ActorCrashed, ev.ActorRestarted, ev.ActorGaveUp])
        flaky = await r.host.start_actor(CrashingExecutor(crashes=1))
        r.session.runner.tool_executor = flaky
        r.server.add(Reply(body=step), Reply(body=oa_text("sorry")))
        with trio.fail_after(20):
            async with r.session.stream("hi") as out:
                chunks = [c async for c in out]
        check_grammar(chunks)
        (err,) = [c for c in chunks if c.type == "tool-error"]
        assert err.tool_call_id == "call_1" and "tool executor 'flaky-tools' crashed" in err.error
        assert out.result.finish_reason == "stop" and out.result.text == "sorry"
        second = r.body()  # the model saw the crash as the tool's error result
        assert "tool executor 'flaky-tools' crashed" in second["messages"][2]["content"]
        # restarted: the next call on the same executor runs normally
        r.server.add(Reply(body=oa_tool_calls(("call_2", "echo", ['{"text": "b"}']))))
        r.server.add(Reply(body=oa_text("ok")))
        with trio.fail_after(20):
            again = await r.session.run("again")
        assert again.tool_messages[0].output == "b"
        kinds = [e.kind for e in drain(watch.inbox)]
        assert kinds == ["actor.crashed", "actor.restarted"]


async def test_a_crashed_tool_executor_names_the_real_error(autojump_clock):
    step = oa_tool_calls(("call_1", "echo", ['{"text": "a"}']))
    async with rig("openai", tools=[echo]) as r:
        watch = r.host.bus.subscribe([ev.ActorCrashed])
        flaky = await r.host.start_actor(CrashingExecutor(crashes=1))
        r.session.runner.tool_executor = flaky
        r.server.add(Reply(body=step), Reply(body=oa_text("sorry")))
        with trio.fail_after(20):
            result = await r.session.run("hi")
        (crash,) = drain(watch.inbox)
    assert "RuntimeError: executor bug" in result.tool_messages[0].error
    assert crash.error_type == "RuntimeError" and crash.error == "executor bug"


async def test_past_its_restart_intensity_only_the_session_using_it_fails(autojump_clock):
    step = oa_tool_calls(("call_1", "echo", ['{"text": "a"}']))
    other_agent = Agent(
        name="other",
        provider=ScriptedProvider(
            [[*tool_call("echo", {"text": "b"}, tool_call_id="B")], ["other done"]]
        ),
        tools=[echo],
    )
    async with rig("openai", tools=[echo]) as r:
        watch = r.host.bus.subscribe([ev.ActorGaveUp])
        doomed = await r.host.start_actor(
            CrashingExecutor(crashes=100), policy=RestartPolicy(intensity=0, period=60)
        )
        r.session.runner.tool_executor = doomed
        other = await r.host.open_session(other_agent, session_id="other")
        r.server.add(Reply(body=step), Reply(body=oa_text("first")))
        r.server.add(Reply(body=step))
        results: dict[str, object] = {}

        async def run(name, session, text):
            with trio.fail_after(20):
                async with session.stream(text) as out:
                    chunks = [c async for c in out]
            results[name] = (chunks, out.result)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "doomed-1", r.session, "hi")
            nursery.start_soon(run, "other", other, "hi")
        await doomed.stopped.wait()
        assert [e.actor for e in drain(watch.inbox)] == ["flaky-tools"]
        # the turn that was running when the executor gave up: its call failed visibly
        _, first = results["doomed-1"]
        assert "tool executor 'flaky-tools' crashed" in first.tool_messages[0].error
        # the next tool call on that session: a clear, typed error, and a valid history
        async with r.session.stream("again") as out:
            chunks = [c async for c in out]
        check_grammar(chunks, ending="error")
        assert chunks[-1].error.kind == "ActorFailed"
        assert "tool-executor" in chunks[-1].error.message or "flaky" in chunks[-1].error.message
        check_history(r.session.messages)
        msgs = r.session.messages
        assert msgs[-1].tool_call_id == "call_1" and msgs[-1].error is not None
        # the other session, on the same host, was not affected
        other_chunks, other_result = results["other"]
        check_grammar(other_chunks)
        assert other_result.finish_reason == "stop" and other_result.text == "other done"
        assert other_result.tool_messages[0].output == "b"
        r.server.add(Reply(body=oa_text("still here")))
        with trio.fail_after(20):
            later = await r.session.run("no tools this time")
        assert later.text == "still here"


# -- a store outage --------------------------------------------------------------------------


class OutageStore(MemoryStore):
    """A memory store that fails every save while ``down`` (a full disk, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def save(self, session_id, start, messages, meta=None, **kwargs):
        if self.down:
            raise StoreError("disk full")
        return await super().save(session_id, start, messages, meta, **kwargs)


async def test_a_failed_save_is_reported_with_the_turn_result(autojump_clock):
    store = OutageStore()
    async with rig("openai", Reply(body=oa_text("hello")), store=store) as r:
        store.down = True
        with trio.fail_after(20):
            result = await r.session.run("hi")
        assert result.text == "hello"  # the answer itself is fine...
        assert result.error is not None and result.error.kind == "StoreError"  # ...but unsaved
        assert "disk full" in result.error.message
        assert await store.load("s") is None


async def test_saving_catches_up_once_the_store_works_again(autojump_clock):
    store = OutageStore()
    async with rig("openai", store=store) as r:
        r.server.add(Reply(body=oa_text("one")), Reply(body=oa_text("two")))
        store.down = True
        await r.session.run("first")
        store.down = False
        with trio.fail_after(20):
            second = await r.session.run("second")
        assert second.error is None, second.error
        stored = await store.load("s")
    assert stored is not None and list(stored.messages) == list(r.session.messages)
