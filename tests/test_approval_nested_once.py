"""An approved agent-as-tool runs once (issue 21): the process running the continuation
dies (here: the host is cut at a chosen save, nothing stored after it) after the
sub-agent did its work and before the calling turn saved the call's result. The retry
(a new host on the same file) finds the sub-session's turn for that call: a finished one
gives its answer without a model call, a half-finished one goes on from its committed
steps, its tools keyed as the first time (``ToolContext.idempotency_key``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, Host, tool
from runtime.actor_messages import InferRequest
from runtime.errors import ProviderError, StoreError
from runtime.messages import AssistantMessage, TextPart, ToolMessage, UserMessage
from runtime.tools import ToolContext

keys: list[str] = []  # the idempotency key of every run of the sub-agent's tool
model_calls: list[int] = []  # the sub-agent's model calls, by step


@tool
async def log_it(note: str, context: ToolContext) -> str:
    """Log a note (a side effect)."""
    keys.append(context.idempotency_key)
    return "logged"


def _helper_model(request: InferRequest) -> list:
    step = current_step(request.messages)
    model_calls.append(step)
    if step == 0:
        return tool_call("log_it", {"note": "n"}, tool_call_id="L")
    return ["sub answer"]


def parent(model: Callable[[InferRequest], list] = _helper_model, *tools: Any) -> Agent:
    """The calling agent; its ``helper`` (an agent as a tool, approved) answers with
    ``model`` and has ``tools`` (``log_it``)."""
    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=model), tools=[*tools] or [log_it]
    )
    return Agent(
        provider=ScriptedProvider(
            [[*tool_call("helper", {"input": "do"}, tool_call_id="H")], ["ok"]]
        ),
        tools=[helper.as_tool(needs_approval=True)],
    )


SUB = "s.helper.H"


class DyingStore(SQLiteStore):
    """An SQLite store whose process "dies" at the first save ``at`` matches: from then
    on nothing more is written (``kill`` cancels the host's block)."""

    at: Callable[[str, list], bool]
    after: bool
    kill: trio.CancelScope
    dead = False

    async def save(self, session_id, start, messages, meta=None, **kwargs):
        if self.dead:
            raise StoreError("the process is gone")
        if not self.at(session_id, list(messages)):
            return await super().save(session_id, start, messages, meta, **kwargs)
        version = (
            await super().save(session_id, start, messages, meta, **kwargs) if self.after else 0
        )
        self.dead = True
        self.kill.cancel()
        if not self.after:
            raise StoreError("the process is gone")
        return version


def _has_result(call_id: str) -> Callable[[str, list], bool]:
    def at(session_id: str, messages: list) -> bool:
        return any(isinstance(m, ToolMessage) and m.tool_call_id == call_id for m in messages)

    return at


async def _approve_then_die(
    path: Any, at: Callable[[str, list], bool], after: bool, make: Callable[[], Agent] = parent
) -> None:
    """Run the turn to its wait, approve the sub-agent's call, and run the continuation
    until a save ``at`` matches (``after`` it is written, or before): the host dies."""
    async with Host.open(store=path, log_tap=False) as host:
        asked = await (await host.open_session(make(), session_id="s")).run("go")
    store = await DyingStore.open(path)
    store.at, store.after = at, after
    with trio.CancelScope() as scope:
        store.kill = scope
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(make(), session_id="s")
            await session.respond(asked.pending[0].approval_id, approved=True)
    assert store.dead


async def _retry(path: Any, make: Callable[[], Agent] = parent) -> Any:
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(make(), session_id="s")
        async with session.resume() as out:
            async for _ in out:
                pass
        return out.result, await host.store.load(SUB), await host.store.load("s")


@pytest.fixture(autouse=True)
def _clear() -> None:
    keys.clear()
    model_calls.clear()


async def test_a_retried_continuation_takes_the_finished_sub_turns_answer_without_running_it(
    tmp_path,
):
    """Killed before the calling turn saved ``H``'s result, the sub-turn done. Before: the
    retry ran the sub-agent again (a second turn in its sub-session, ``log_it`` again)."""
    path = tmp_path / "s.db"
    await _approve_then_die(path, lambda sid, ms: sid == "s" and _has_result("H")(sid, ms), False)
    assert (keys, model_calls) == ([keys[0]], [0, 1])
    result, sub, stored = await _retry(path)
    assert (result.finish_reason, result.text) == ("stop", "ok")
    assert model_calls == [0, 1] and len(keys) == 1  # nothing of the sub-agent ran again
    assert sum(isinstance(m, UserMessage) for m in sub.messages) == 1
    (answer,) = [m for m in stored.messages if isinstance(m, ToolMessage)]
    assert (answer.tool_call_id, answer.output) == ("H", "sub answer")


async def test_a_retried_continuation_goes_on_with_the_half_finished_sub_turn(tmp_path):
    """Killed once the sub-turn committed its step with ``log_it``'s result. Before: the
    retry started the sub-turn over and ran ``log_it`` again, with a new key."""
    path = tmp_path / "s.db"
    await _approve_then_die(path, lambda sid, ms: sid == SUB and _has_result("L")(sid, ms), True)
    assert len(keys) == 1
    before = len(model_calls)  # step 1's call may have begun: it was in flight
    result, sub, stored = await _retry(path)
    assert (result.finish_reason, result.text) == ("stop", "ok")
    assert model_calls[before:] == [1] and len(keys) == 1  # only the step in flight again
    assert sum(isinstance(m, UserMessage) for m in sub.messages) == 1
    (answer,) = [m for m in stored.messages if isinstance(m, ToolMessage)]
    assert (answer.tool_call_id, answer.output) == ("H", "sub answer")


@tool(needs_approval=True)
async def wire_money(to: str) -> str:
    """Wire money."""
    keys.append("wired")
    return "wired"


def _asking_model(request: InferRequest) -> list:
    model_calls.append(current_step(request.messages))
    return tool_call("wire_money", {"to": "x"}, tool_call_id="W")


async def test_a_retried_continuation_does_not_go_on_with_a_sub_turn_whose_wait_was_ended(
    tmp_path,
):
    """The sub-turn asked for approval and was ended (its call denied, answered); killed
    before the calling turn saved ``H``'s error. The retry tells the calling model the same
    and runs nothing of the sub-agent (resumed, its model would have been asked again)."""

    def asking() -> Agent:
        return parent(_asking_model, wire_money)

    path = tmp_path / "s.db"
    at_h = _has_result("H")
    await _approve_then_die(path, lambda sid, ms: sid == "s" and at_h(sid, ms), False, asking)
    assert model_calls == [0]
    result, sub, stored = await _retry(path, asking)
    assert (result.finish_reason, result.text) == ("stop", "ok")
    assert model_calls == [0] and keys == []
    assert sum(isinstance(m, UserMessage) for m in sub.messages) == 1
    (answer,) = [m for m in stored.messages if isinstance(m, ToolMessage)]
    assert answer.tool_call_id == "H"
    assert "stopped to wait for a person's input (wire_money (approval))" in answer.error


@pytest.mark.parametrize("streamed", [(), ("half an ans",)], ids=["nothing", "text"])
async def test_a_retried_continuation_re_runs_only_the_failed_step_of_a_failed_sub_turn(
    tmp_path, streamed
):
    """The sub-turn's step 1 failed (its model call raised, after ``streamed``): the
    sub-turn ended ``error``, the calling model was to be told; killed before the calling
    turn saved ``H``'s error. The retry (the same call) takes the sub-turn over as a
    durable turn is: step 0 and ``log_it`` stand, only the failed step runs again, and
    what it had streamed is not kept."""
    failed: list[int] = []

    def failing_once(request: InferRequest) -> list:
        step = current_step(request.messages)
        if step == 1 and not failed:
            failed.append(step)
            model_calls.append(step)
            return [*streamed, ProviderError("model down", retryable=False)]
        return _helper_model(request)

    path = tmp_path / "s.db"
    at_h = _has_result("H")
    make = lambda: parent(failing_once)  # noqa: E731
    await _approve_then_die(path, lambda sid, ms: sid == "s" and at_h(sid, ms), False, make)
    assert (model_calls, len(keys)) == ([0, 1], 1)
    result, sub, stored = await _retry(path, make)
    assert (result.finish_reason, result.text) == ("stop", "ok")
    assert model_calls == [0, 1, 1] and len(keys) == 1  # only the failed step again
    assert sum(isinstance(m, UserMessage) for m in sub.messages) == 1
    (answer,) = [m for m in stored.messages if isinstance(m, ToolMessage)]
    assert (answer.tool_call_id, answer.output, answer.error) == ("H", "sub answer", None)
    (reply,) = [m for m in sub.messages if isinstance(m, AssistantMessage)]
    assert "".join(p.text for p in reply.content if isinstance(p, TextPart)) == "sub answer"
