"""What a long-lived host keeps of each way a turn ends: run one ending many times in one
host (a new session each time, closed after, or evicted), and count what is left. The
objects of the runtime's own classes, the host's sessions, the bus's subscriptions, the
Trio tasks and the open files are the same after the 40th run as after the 10th
(benchmarks/journal/approval.md, "leaks": the probe that ran each ending 300-600 times).
"""

from __future__ import annotations

import gc
import os
import time
import traceback
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from runtime import Agent, Host, Tool, tool
from runtime.errors import MalformedStream, ProviderError
from runtime.messages import AssistantMessage
from tests.support.leaks import runtime_objects, tasks

EPOCH = 1_700_000_000.0


async def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def broken(city: str) -> str:
    """A tool that raises."""
    raise RuntimeError("tool broke")


async def slow(city: str) -> str:
    """A tool that takes long."""
    await trio.sleep(10)
    return "late"


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


PICK = Tool.client("pick", {"type": "object", "properties": {"n": {"type": "integer"}}})

SCRIPTS: dict[str, list[Any]] = {
    "success": [tool_call("lookup", {"city": "Paris"}), ["It is sunny."]],
    "provider error": [["half ", ProviderError("down", retryable=False)]],
    "malformed stream": [["half ", MalformedStream("bad json")]],
    "tool raises": [tool_call("broken", {"city": "Paris"}), ["sorry"]],
    "unknown tool": [tool_call("nope", {"city": "Paris"}), ["sorry"]],
    "invalid args": [tool_call("lookup", {"town": 3}), ["sorry"]],
    "slow text": [["a ", Sleep(5), "b ", Sleep(5), "c"]],
    "slow tool": [tool_call("slow", {"city": "Paris"}), ["done"]],
    "approval": [tool_call("delete_file", {"path": "/x"}, tool_call_id="D"), ["answered"]],
    "client tool": [tool_call("pick", {"n": 1}, tool_call_id="C"), ["answered"]],
}


def make_agent(script: str, **kw: Any) -> Agent:
    return Agent(
        name=script.replace(" ", "-"),
        provider=ScriptedProvider(steps=SCRIPTS[script], keep_requests=0),
        tools=[lookup, broken, slow, delete_file],
        **kw,
    )


async def drain(out: Any) -> None:
    async for _ in out:
        pass


Run = Callable[[Host, Agent, int], Awaitable[None]]


async def ends_on_its_own(host: Host, agent: Agent, i: int) -> None:
    session = await host.open_session(agent, session_id=f"s{i}")
    async with session.stream("hi") as out:
        await drain(out)
    await session.close()


async def caller_leaves(host: Host, agent: Agent, i: int) -> None:
    session = await host.open_session(agent, session_id=f"s{i}")
    async with session.stream("hi") as out:
        async for _ in out:
            break
    await session.close()


async def caller_cancelled(host: Host, agent: Agent, i: int) -> None:
    session = await host.open_session(agent, session_id=f"s{i}")
    with trio.move_on_after(3):
        async with session.stream("hi") as out:
            await drain(out)
    await session.close()


async def stopped(host: Host, agent: Agent, i: int) -> None:
    session = await host.open_session(agent, session_id=f"s{i}")
    async with session.stream("hi", user_message_id=f"u{i}") as out:
        async for _ in out:
            host.stop_named(session.id, message_id=f"u{i}", turn_id=None, reason="stop")
    await session.close()


def second_message(on_busy: str) -> Run:
    async def run(host: Host, agent: Agent, i: int) -> None:
        session = await host.open_session(agent, session_id=f"s{i}", on_busy=on_busy)  # type: ignore[arg-type]

        async def first() -> None:
            async with session.stream("one") as out:
                await drain(out)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await trio.sleep(1)
            async with session.stream("two") as out:
                await drain(out)
        await session.close()

    return run


def decided(how: str) -> Run:
    async def run(host: Host, agent: Agent, i: int) -> None:
        session = await host.open_session(agent, session_id=f"s{i}")
        first = await session.run("go")
        approval_id = first.pending[0].approval_id
        if how == "expired":
            await trio.sleep(61)
        else:
            await session.respond(approval_id, approved=how == "approved", reason="r")
        await session.close()

    return run


async def client_answers(host: Host, agent: Agent, i: int) -> None:
    session = await host.open_session(agent, session_id=f"s{i}")
    async with session.stream("go", tools=(PICK,)) as out:
        await drain(out)
    await session.respond("C", output={"picked": 1}, tools=(PICK,))
    await session.close()


async def deleted_while_running(host: Host, agent: Agent, i: int) -> None:
    session = await host.open_session(agent, session_id=f"s{i}")

    async def first() -> None:
        async with session.stream("one") as out:
            await drain(out)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(first)
        await trio.sleep(1)
        await host.delete_session(session.id)


async def left_to_eviction(host: Host, agent: Agent, i: int) -> None:
    session = await host.open_session(agent, session_id=f"s{i}")
    async with session.stream("hi") as out:
        await drain(out)


ENDINGS: dict[str, tuple[str, Run]] = {
    "success": ("success", ends_on_its_own),
    "provider error": ("provider error", ends_on_its_own),
    "malformed stream": ("malformed stream", ends_on_its_own),
    "tool raises": ("tool raises", ends_on_its_own),
    "unknown tool": ("unknown tool", ends_on_its_own),
    "invalid args": ("invalid args", ends_on_its_own),
    "caller leaves the stream": ("slow text", caller_leaves),
    "caller's scope cancelled": ("slow text", caller_cancelled),
    "stopped by name": ("slow text", stopped),
    "interrupted": ("slow text", second_message("interrupt")),
    "steered": ("slow tool", second_message("steer")),
    "queued behind": ("slow text", second_message("enqueue")),
    "approved": ("approval", decided("approved")),
    "denied": ("approval", decided("denied")),
    "expired": ("approval", decided("expired")),
    "client tool answered": ("client tool", client_answers),
    "deleted while running": ("slow tool", deleted_while_running),
    "evicted": ("success", left_to_eviction),
}


def held(host: Host) -> dict[str, Any]:
    return {
        "objects": runtime_objects(),
        "sessions": len(host.sessions),
        "subscriptions": host.bus.subscription_count,
        "tasks": tasks(),
        "files": len(os.listdir("/proc/self/fd")),
    }


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_a_turn_ending_so_leaves_nothing_behind_in_the_host(
    ending: str, autojump_clock: Any, tmp_path: Any
) -> None:
    script, run = ENDINGS[ending]
    agent = make_agent(script, approval_timeout=60 if script == "approval" else None)
    bounds = {"max_sessions": 3} if run is left_to_eviction else {}
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False, **bounds) as host:
        host.clock = lambda: EPOCH + trio.current_time()
        for i in range(10):
            await run(host, agent, i)
        before = held(host)
        for i in range(10, 40):
            await run(host, agent, i)
        after = held(host)
        for _ in range(40):
            # A closed session's actors wind down after its close returns, and on a
            # loaded machine past this look (the engine's last forwarded batch): a leak
            # stays, they go. Real time passes in a thread (the clock is autojump's).
            if after == before:
                break
            await trio.to_thread.run_sync(time.sleep, 0.05)
            after = held(host)
    grown = after.pop("objects") - before.pop("objects")
    assert dict(grown) == {}
    assert after == before


async def test_a_scripted_error_raised_by_many_turns_keeps_one_turns_traceback() -> None:
    error = ProviderError("down", retryable=False)
    agent = Agent(provider=ScriptedProvider(steps=[["half ", error]], keep_requests=0))
    depths = []
    async with Host.open(log_tap=False) as host:
        for i in range(4):
            session = await host.open_session(agent, session_id=f"s{i}")
            await session.run("hi")
            await session.close()
            depths.append(len(traceback.extract_tb(error.__traceback__)))
    assert depths[-1] == depths[0]


def assistant_messages() -> int:
    gc.collect()
    return sum(type(o) is AssistantMessage for o in gc.get_objects())


async def test_a_session_closed_while_its_turn_waits_leaves_no_message_in_memory(
    tmp_path: Any,
) -> None:
    agent = make_agent("approval")  # (no deadline: no timer watches the waits)
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        counts = []
        for i in range(30):
            session = await host.open_session(agent, session_id=f"s{i}")
            assert (await session.run("go")).finish_reason == "awaiting-input"
            await session.close()
            del session
            if i in (9, 29):
                counts.append(assistant_messages())
    assert counts[1] == counts[0]


def answer(session: Any) -> str:
    """The text of the session's (one) assistant message."""
    return "".join(getattr(p, "text", "") for p in session.messages[1].content)


async def test_a_session_its_hosts_timer_loaded_to_expire_a_wait_is_closed_again(
    autojump_clock: Any, tmp_path: Any
) -> None:
    agent = make_agent("approval", approval_timeout=60)
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        host.clock = lambda: EPOCH + trio.current_time()
        session = await host.open_session(agent, session_id="s")
        await session.run("go")
        await session.close()
        assert host.sessions == {}
        await trio.sleep(61)
        assert host.sessions == {}
        assert host.expiry._due == {}
        await session.reopen()
        assert answer(session) == "answered"  # the turn went on


async def test_a_session_open_when_its_wait_expires_stays_open(
    autojump_clock: Any, tmp_path: Any
) -> None:
    agent = make_agent("approval", approval_timeout=60)
    async with Host.open(store=str(tmp_path / "s.db"), log_tap=False) as host:
        host.clock = lambda: EPOCH + trio.current_time()
        session = await host.open_session(agent, session_id="s")
        await session.run("go")
        await trio.sleep(61)
        assert host.sessions == {"s": session}
        assert answer(session) == "answered"


class SlowSaves:
    """A memory store whose saves take ``delay`` seconds (past the turn's
    ``SAVE_TIMEOUT`` when asked): the turn ends with its save still in the persister."""

    def __init__(self, delay: float) -> None:
        from actors.stores.memory import MemoryStore

        self.inner = MemoryStore()
        self.delay = delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save(self, *args: Any, **kwargs: Any) -> Any:
        await trio.sleep(self.delay)
        return await self.inner.save(*args, **kwargs)


@pytest.mark.parametrize("aside", [False, True])
@pytest.mark.parametrize("script", ["approval", "success"])
async def test_a_session_closed_with_a_save_in_flight_leaves_nothing_in_the_persister(
    autojump_clock: Any, script: str, aside: bool, monkeypatch: Any
) -> None:
    # The turn's save outlasted its wait (SAVE_TIMEOUT): the turn ended, its session was
    # closed, and the save then landed: the persister kept the session's latest request
    # and, for a turn that waits, its messages, for the host's life (close_session
    # forgets only a session all saved).
    from actors import persister as persister_module
    from actors.turn.saving import SAVE_TIMEOUT

    if aside:  # every save a long one, written by a task of its own, in order
        monkeypatch.setattr(persister_module, "OFF_LOOP_MESSAGES", 0)
    store = SlowSaves(SAVE_TIMEOUT * 2)
    agent = make_agent(script)
    async with Host.open(store=store, log_tap=False) as host:
        for i in range(5):
            session = await host.open_session(agent, session_id=f"s{i}")
            await session.run("go")
            assert not session.state.all_saved  # (the save in flight)
            await session.close()
        await trio.sleep(SAVE_TIMEOUT * 20)  # every save landed
        persister = host.persister
        kept = (dict(persister._written), dict(persister._latest))
        stored = [await store.inner.version(f"s{i}") for i in range(5)]
    assert kept == ({}, {})
    assert all(stored)  # (saved all the same)


async def test_an_open_session_keeps_nothing_of_its_ended_turn_in_its_stream_controller() -> None:
    # The controller kept the last batch it rendered (its TurnDone, the turn's result and
    # the batch's chunks) until the session's next turn: an idle session held its last
    # turn's output, and a worker's leak count grew when that batch held one more chunk.
    agent = make_agent("success")
    async with Host.open(store=":memory:", log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        async with session.stream("hi") as out:
            await drain(out)
            result = weakref.ref(out.result)
        del out
        gc.collect()
        assert result() is None
        await session.close()
