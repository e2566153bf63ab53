"""``runtime.app.aio`` used carelessly, or in a hostile environment: tasks cancelled at
each point of a turn, loops that close under a running stream, several loops and
threads, many hosts opened and closed, exceptions crossing over. Each pins what the
Trio API does in the same case (docs/asyncio.md).

As in tests/test_aio.py: plain functions running ``asyncio.run``; waiting for the other
side is done on events, never by a timing (``LIMIT`` only bounds a hang).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.stores import MemoryStore
from runtime import Agent
from runtime.app.aio import AsyncHost

LIMIT = 30  # seconds: a hang fails its test instead of stalling the run


def run(main: Any) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(LIMIT):
            return await main()

    return asyncio.run(bounded())


def endless() -> Iterator[str]:
    for i in itertools.count():
        yield f"w{i} "


def talker() -> Agent:
    return Agent(provider=ScriptedProvider(responder=lambda request: endless()))


def host_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "axon-trio-host"}


def statuses(record: Any) -> list[tuple[str, str | None]]:
    return [(m.role, getattr(m, "status", None)) for m in record.messages]


def test_a_host_serves_a_task_of_another_threads_event_loop():
    # a sync thread with no loop of its own reaches the host with asyncio.run, a worker
    # thread's loop as well: the calls settle on the caller's own loop
    agent = Agent(provider=ScriptedProvider([["Hello."]]))

    async def main() -> tuple[Any, ...]:
        async with AsyncHost.open(log_tap=False) as host:

            async def elsewhere() -> tuple[Any, ...]:
                session = await host.open_session(agent, "other")
                async with session.stream("hi") as out:
                    types = [chunk.type async for chunk in out]
                return types[-1], out.result.text, (await session.run("again")).finish_reason

            return await asyncio.to_thread(asyncio.run, elsewhere())

    last, text, again = run(main)
    assert (last, text, again) == ("finish", "Hello.", "stop")


def stop_loop_mid_stream(loop: asyncio.AbstractEventLoop, store: MemoryStore) -> None:
    """Run a stream on ``loop`` until the loop is stopped under it: neither block is
    ever left (loop.stop() from a callback; a KeyboardInterrupt out of
    run_until_complete leaves the same state)."""
    reading: list[Any] = []

    async def main() -> None:
        async with AsyncHost.open(store=store, log_tap=False) as host:
            session = await host.open_session(talker(), "gone")
            async with session.stream("a lot") as out:
                async for chunk in out:
                    reading.append(chunk)
                    if len(reading) == 10:
                        loop.stop()
                        await asyncio.sleep(0)  # the loop stops here, never to run again

    with pytest.raises(RuntimeError, match="stopped before"):
        loop.run_until_complete(loop.create_task(main()))


def test_a_loop_closed_mid_stream_closes_its_host_the_turn_saved_interrupted():
    store = MemoryStore()
    before = host_threads()
    loop = asyncio.new_event_loop()
    stop_loop_mid_stream(loop, store)
    (thread,) = host_threads() - before
    loop.close()
    thread.join(LIMIT)  # the host's thread notices, closes the host as leaving would, ends
    assert not thread.is_alive()
    assert statuses(trio.run(store.load, "gone")) == [("user", None), ("assistant", "interrupted")]


def test_a_loop_whose_thread_ended_mid_stream_closes_its_host_the_turn_saved_interrupted():
    store = MemoryStore()
    before = host_threads()
    loop = asyncio.new_event_loop()  # never closed: its thread just ends
    worker = threading.Thread(target=stop_loop_mid_stream, args=(loop, store))
    worker.start()
    worker.join(LIMIT)
    (thread,) = host_threads() - before
    thread.join(LIMIT)
    assert not thread.is_alive()
    assert statuses(trio.run(store.load, "gone")) == [("user", None), ("assistant", "interrupted")]


def test_an_event_generator_closed_early_saves_its_turn_before_aclose_returns():
    # the FastAPI shape: the stream inside an async generator, which the server closes
    # (aclose) when the client goes; GeneratorExit is an exit with an exception, as in
    # the Trio API: reason "consumer failed: GeneratorExit", the turn saved interrupted
    async def main() -> tuple[Any, Any]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(talker(), "sse")
            results = []

            async def events() -> Any:
                async with session.stream("a lot") as out:
                    try:
                        async for chunk in out:
                            yield chunk
                    finally:
                        results.append(out)

            gen = events()
            async for chunk in gen:
                if chunk.type == "text-delta":
                    break
            await gen.aclose()
            (out,) = results
            record = await host.call(host.host.store.load, "sse")
            return out.result, record

    result, record = run(main)
    assert result.finish_reason == "aborted"
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]
