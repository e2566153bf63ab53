"""``runtime.app.aio``: the asyncio front door (an ``AsyncHost`` on its own Trio thread).

These tests are plain functions that run an asyncio program (``asyncio.run``); the Trio
host runs on its own thread, as in an application. Waiting for the Trio side is done on
the Trio side (``host.call(wait_all_tasks_blocked)``) or for an event, never by a timing.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, AssistantMessage, Host, InvalidSessionId, SessionBusy, SessionError
from runtime.actor_messages import Batcher
from runtime.app.aio import AsyncHost, HostClosed
from runtime.errors import ConfigurationError

LIMIT = 30  # seconds: a hang fails its test instead of stalling the run


def run(main: Any) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(LIMIT):
            return await main()

    return asyncio.run(bounded())


def endless(pulled: list[int]) -> Iterator[str]:
    """Many small text deltas, counting in ``pulled`` how many the provider took."""
    for i in range(200_000):
        pulled[0] += 1
        yield f"w{i} "


def endless_agent(pulled: list[int]) -> Agent:
    return Agent(provider=ScriptedProvider(responder=lambda request: endless(pulled)))


async def stored_reply(host: AsyncHost, session_id: str) -> AssistantMessage:
    record = await host.call(host.host.store.load, session_id)
    reply = record.messages[1]
    assert isinstance(reply, AssistantMessage)
    return reply


def test_a_stream_yields_the_turns_chunks_and_its_result():
    agent = Agent(provider=ScriptedProvider([["Hello from Trio."]]))

    async def main() -> tuple[list[str], Any, list[str]]:
        async with AsyncHost.open() as host:
            session = await host.open_session(agent, "s")
            async with session.stream("hi") as out:
                types = [chunk.type async for chunk in out]
            return types, out.result, [m.role for m in session.messages]

    types, result, roles = run(main)
    assert types[0] == "start" and types[-1] == "finish"
    assert types.count("text-delta") == 3
    assert result.finish_reason == "stop" and result.text == "Hello from Trio."
    assert roles == ["user", "assistant"]


def test_run_returns_the_turns_result():
    agent = Agent(provider=ScriptedProvider([["Fine."]]))

    async def main() -> Any:
        async with AsyncHost.open() as host:
            session = await host.open_session(agent)
            return await session.run("hi")

    result = run(main)
    assert result.text == "Fine." and result.finish_reason == "stop"


def test_a_cancelled_asyncio_task_cancels_the_turn_and_it_is_saved_interrupted():
    pulled = [0]

    async def main() -> AssistantMessage:
        async with AsyncHost.open() as host:
            session = await host.open_session(endless_agent(pulled), "cancelled")
            first = asyncio.Event()

            async def consume() -> None:
                async with session.stream("a lot") as out:
                    async for _ in out:
                        first.set()

            task = asyncio.create_task(consume())
            await first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # the CancelledError came out once the turn was saved
            assert not session.session.busy
            return await stored_reply(host, "cancelled")

    reply = run(main)
    assert reply.interrupted
    assert reply.text.startswith("w0")


def test_a_cancelled_run_saves_the_turn_interrupted():
    streaming = threading.Event()

    def talk(request: Any) -> Iterator[str]:
        yield "first "
        streaming.set()
        for i in itertools.count():  # no end: 200,000 deltas could all stream before the
            yield f"w{i} "  # cancel crossed over from asyncio on a loaded machine

    async def main() -> AssistantMessage:
        async with AsyncHost.open() as host:
            session = await host.open_session(
                Agent(provider=ScriptedProvider(responder=talk)), "run"
            )
            task = asyncio.create_task(session.run("a lot"))
            await asyncio.to_thread(streaming.wait, LIMIT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await stored_reply(host, "run")

    assert run(main).interrupted


def test_leaving_the_block_early_cancels_the_turn_as_a_trio_consumer_does():
    pulled = [0]
    replies = iter([endless(pulled), iter(["Fine."])])
    agent = Agent(provider=ScriptedProvider(responder=lambda request: next(replies)))

    async def main() -> tuple[Any, AssistantMessage, Any]:
        async with AsyncHost.open() as host:
            session = await host.open_session(agent, "left")
            async with session.stream("a lot") as out:
                async for chunk in out:
                    if chunk.type == "text-delta":
                        break
            again = await session.run("again")  # the session is free for the next turn
            return out.result, await stored_reply(host, "left"), again

    result, reply, again = run(main)
    assert result.finish_reason == "aborted"
    assert reply.interrupted
    assert again.text == "Fine."


def test_a_consumer_that_stops_reading_stalls_the_provider(monkeypatch):
    # A small cap keeps the pipeline's bound (inbox capacities x cap) small, as in
    # tests/test_backpressure.py; the bridge adds at most two hand-offs to it.
    monkeypatch.setattr(Batcher, "max_items", 2)
    pulled = [0]

    async def main() -> tuple[int, Any, AssistantMessage]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(endless_agent(pulled), "stuck")
            async with session.stream("a lot") as out:
                await anext(out)
                await host.call(trio.testing.wait_all_tasks_blocked)
                stalled_at = pulled[0]
            return stalled_at, out.result, await stored_reply(host, "stuck")

    stalled_at, result, reply = run(main)
    assert stalled_at < 100_000  # held back, not drained into a buffer
    assert result.finish_reason == "aborted"
    assert reply.interrupted and reply.text.startswith("w0 w1 ")


def test_cancel_from_asyncio_ends_the_stream_with_an_abort_carrying_the_reason():
    pulled = [0]

    async def main() -> list[Any]:
        async with AsyncHost.open() as host:
            session = await host.open_session(endless_agent(pulled))
            async with session.stream("a lot") as out:
                chunks = []
                async for chunk in out:
                    chunks.append(chunk)
                    if len(chunks) == 3:
                        out.cancel("user pressed stop")
            return chunks

    chunks = run(main)
    aborts = [c for c in chunks if c.type == "abort"]
    assert [a.reason for a in aborts] == ["user pressed stop"]


def test_closing_the_host_ends_a_running_asyncio_stream_with_its_abort():
    pulled = [0]

    async def main() -> list[Any]:
        chunks: list[Any] = []
        first = asyncio.Event()

        async def consume(session: Any) -> None:
            async with session.stream("a lot") as out:
                async for chunk in out:
                    chunks.append(chunk)
                    first.set()

        async with AsyncHost.open() as host:
            session = await host.open_session(endless_agent(pulled))
            task = asyncio.create_task(consume(session))
            await first.wait()
        await task  # ended, not cancelled: the turn's end reached it
        return chunks

    chunks = run(main)
    assert chunks[-1].type == "abort" and chunks[-1].reason == "host shutdown"


def test_an_error_on_the_trio_side_is_raised_in_asyncio_as_itself():
    pulled = [0]

    async def main() -> None:
        async with AsyncHost.open() as host:
            with pytest.raises(InvalidSessionId):
                await host.open_session(endless_agent(pulled), "no spaces allowed")
            session = await host.open_session(endless_agent(pulled), "busy")
            async with session.stream("a lot") as out:
                await anext(out)
                with pytest.raises(SessionBusy, match="already running a turn"):
                    async with session.stream("another"):
                        pass

    run(main)


def test_a_closed_host_refuses_new_work():
    agent = Agent(provider=ScriptedProvider([["x"]]))

    async def main() -> None:
        async with AsyncHost.open() as host:
            pass
        with pytest.raises(HostClosed):
            await host.open_session(agent)

    run(main)


def test_iterating_a_stream_never_entered_raises_a_session_error():
    agent = Agent(provider=ScriptedProvider([["x"]]))

    async def main() -> None:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(agent, "s")
            with pytest.raises(SessionError, match="async with"):
                async for _ in session.stream("hi"):
                    pass

    run(main)


def test_entering_a_stream_a_second_time_raises_and_runs_no_second_turn():
    agent = Agent(provider=ScriptedProvider([["x"]]))

    async def main() -> list[str]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(agent, "s")
            out = session.stream("hi")
            async with out:
                pass
            with pytest.raises(SessionError, match="again"):
                async with out:
                    pass
            return [m.role for m in session.messages]

    assert run(main) == ["user", "assistant"]


def test_signals_are_left_to_the_asyncio_application():
    async def main() -> None:
        async with AsyncHost.open(handle_signals=True):
            pass

    with pytest.raises(ConfigurationError, match="handle_signals"):
        run(main)


def test_call_raises_the_trio_functions_own_exception():
    class Refused(Exception):
        pass

    async def refuse() -> None:
        await trio.lowlevel.checkpoint()
        raise Refused("no")

    async def main() -> None:
        async with AsyncHost.open() as host:
            with pytest.raises(Refused, match="no"):
                await host.call(refuse)

    run(main)


async def test_next_batch_takes_in_bulk_the_chunks_async_for_yields():
    # the Trio side of the bridge: TurnStream.next_batch / take_ready
    agent = Agent(provider=ScriptedProvider([["one two three four five"]]))
    async with Host.open() as host:
        session = await host.open_session(agent)
        async with session.stream("x") as out:
            one_by_one = [(c.type, getattr(c, "text", None)) async for c in out]
        batches = []
        async with session.stream("x") as out:
            while batch := await out.next_batch():
                batches.append(batch)
            assert await out.next_batch() == []  # and stays so
    in_bulk = [(c.type, getattr(c, "text", None)) for batch in batches for c in batch]
    assert in_bulk == one_by_one


def test_a_host_that_cannot_open_raises_its_error_and_leaves_no_thread():
    async def main() -> None:
        async with AsyncHost.open(idle_ttl=-1):
            pass

    with pytest.raises(ConfigurationError, match="idle_ttl"):
        run(main)
    assert "axon-trio-host" not in {t.name for t in threading.enumerate()}


def test_an_approval_is_answered_from_asyncio_and_the_turn_goes_on():
    from actors.providers.scripted import tool_call
    from runtime import tool

    ran: list[str] = []

    @tool(needs_approval=True)
    async def delete_file(path: str) -> str:
        """Delete a file."""
        ran.append(path)
        return f"deleted {path}"

    provider = ScriptedProvider(
        [[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], ["Deleted."]]
    )
    agent = Agent(provider=provider, tools=[delete_file])

    async def main() -> tuple[Any, Any, Any]:
        async with AsyncHost.open() as host:
            session = await host.open_session(agent, "s")
            waiting = await session.run("delete /x")
            (call,) = session.pending
            result = await session.respond(call.approval_id, approved=True)
            return waiting, call, result

    waiting, call, result = run(main)
    assert waiting.finish_reason == "awaiting-input"
    assert call.tool_name == "delete_file"
    assert ran == ["/x"]
    assert result.text.endswith("Deleted.") and result.finish_reason == "stop"
