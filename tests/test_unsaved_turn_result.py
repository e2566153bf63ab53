"""A turn whose final save the store does not answer within ``SAVE_TIMEOUT`` (logged
``session.save-timeout``): the caller of ``session.run()`` and of ``session.stream()``
can tell from the result (``saved`` ``False``), as the ``run`` command and a worker do;
a failed save is the turn's error as well (benchmarks/journal/pipeline.md, "greedyleft")."""

from __future__ import annotations

from typing import Any

import trio
from structlog.testing import capture_logs

import actors.turn.saving as saving_module
from actors.providers.scripted import ScriptedProvider
from actors.stores import MemoryStore
from runtime import Agent, Hooks, Host
from runtime.errors import StoreError


def _held_store(gate: trio.Event, *, fail: bool = False) -> MemoryStore:
    store = MemoryStore()
    real = store.save

    async def save(*args: Any, **kwargs: Any) -> int:
        if fail:
            raise StoreError("disk full")
        await gate.wait()
        return await real(*args, **kwargs)

    store.save = save  # type: ignore[method-assign]
    return store


async def test_a_save_the_store_does_not_answer_in_time_is_told_by_run_and_stream(
    autojump_clock: Any,
) -> None:
    gate = trio.Event()
    store = _held_store(gate)
    finished: list[Any] = []

    async def on_turn_finish(event: Any) -> None:
        finished.append(event.saved)

    agent = Agent(
        provider=ScriptedProvider(turns=[[["one"]], [["two"]]]),
        hooks=Hooks(on_turn_finish=on_turn_finish),
    )
    with capture_logs() as logs:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(agent, session_id="s")
            ran = await session.run("m1")
            async with session.stream("m2") as out:
                chunks = [chunk.type async for chunk in out]
            streamed = out.result
            gate.set()
    timeouts = [e for e in logs if e["event"] == "session.save-timeout"]
    assert len(timeouts) == 2
    assert (ran.finish_reason, ran.error, ran.saved) == ("stop", None, False)
    assert streamed is not None and chunks[-1] == "finish"
    assert (streamed.finish_reason, streamed.error, streamed.saved) == ("stop", None, False)
    # the hook (and every observer of turn.finished) is told too
    assert finished == [False, False]
    # both landed later, in order (the host's close waited for them)
    record = await store.load("s")
    assert record is not None and [m.text for m in record.messages if m.role == "assistant"] == [
        "one",
        "two",
    ]
    assert saving_module.SAVE_TIMEOUT == 5.0  # what docs/embedding.md says


async def test_a_save_the_store_refuses_is_the_turns_error_and_not_saved() -> None:
    store = _held_store(trio.Event(), fail=True)
    finished: list[Any] = []

    async def on_turn_finish(event: Any) -> None:
        finished.append((event.saved, event.error is not None))

    agent = Agent(provider=ScriptedProvider([["one"]]), hooks=Hooks(on_turn_finish=on_turn_finish))
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        async with session.stream("m1") as out:
            chunks = [chunk.type async for chunk in out]
    result = out.result
    assert result is not None and not result.saved
    assert result.error is not None and "disk full" in result.error.message
    assert chunks[-1] == "error"
    assert finished == [(False, True)]


async def test_a_saved_turn_says_so_to_its_hook() -> None:
    finished: list[Any] = []

    async def on_turn_finish(event: Any) -> None:
        finished.append(event.saved)

    agent = Agent(provider=ScriptedProvider([["one"]]), hooks=Hooks(on_turn_finish=on_turn_finish))
    async with Host.open(store=MemoryStore(), log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("m1")
    assert result.saved and finished == [True]
