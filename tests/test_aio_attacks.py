"""``runtime.app.aio`` used carelessly, or in a hostile environment: tasks cancelled at
each point of a turn, loops that close under a running stream, several loops and
threads, many hosts opened and closed, exceptions crossing over. Each pins what the
Trio API does in the same case (docs/asyncio.md).

As in tests/test_aio.py: plain functions running ``asyncio.run``; waiting for the other
side is done on events, never by a timing (``LIMIT`` only bounds a hang).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from runtime import Agent, SessionError, tool
from runtime.actor_messages import Batcher
from runtime.app import aio
from runtime.app.aio import HANDOFF_MOST, AsyncHost, HostClosed
from tests.support.aio_talk import LIMIT, ROOT, endless, run, talker


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
    loop.close()  # (only now: not a ResourceWarning)


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


class GatedStore(MemoryStore):
    """A memory store whose saves, once ``gating``, wait for ``gate`` (a thread event,
    set from asyncio); ``saving`` is set when one does."""

    def __init__(self) -> None:
        super().__init__()
        self.gating = False
        self.gate = threading.Event()
        self.saving = threading.Event()

    async def save(self, *args: Any, **kwargs: Any) -> int:
        if self.gating:
            self.saving.set()
            await trio.to_thread.run_sync(self.gate.wait)
        return await super().save(*args, **kwargs)


def test_a_task_cancelled_before_it_ever_ran_starts_no_turn():
    async def main() -> tuple[bool, Any, str]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(talker(), "never")

            async def consume() -> None:
                async with session.stream("a lot") as out:
                    async for _ in out:
                        pass

            task = asyncio.create_task(consume())
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record = await host.call(host.host.store.load, "never")
            return session.session.busy, record, (await session.run("again")).text

    busy, record, again = run(main)
    assert not busy and record is None
    assert again == "Fine."  # the session's next turn runs


def test_a_task_cancelled_while_its_turn_starts_saves_the_turn_interrupted():
    async def main() -> tuple[Any, str]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(talker(), "starting")

            async def consume() -> None:
                async with session.stream("a lot") as out:
                    async for _ in out:
                        pass

            task = asyncio.create_task(consume())
            await asyncio.sleep(0)  # the task has asked the Trio side for the turn
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record = await host.call(host.host.store.load, "starting")
            return record, (await session.run("again")).text

    record, again = run(main)
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]
    assert again == "Fine."


def test_cancelling_a_task_again_while_its_turn_saves_waits_for_the_save():
    store = GatedStore()

    async def main() -> tuple[bool, Any, Any]:
        async with AsyncHost.open(store=store, log_tap=False) as host:
            session = await host.open_session(talker(), "saving")
            first = asyncio.Event()

            async def consume() -> None:
                async with session.stream("a lot") as out:
                    async for _ in out:
                        first.set()

            task = asyncio.create_task(consume())
            await first.wait()
            store.gating = True
            task.cancel()
            await asyncio.to_thread(store.saving.wait, LIMIT)
            for _ in range(3):  # a client that disconnects, then a server's shutdown...
                task.cancel()
                await asyncio.sleep(0)
            done_while_saving = task.done()
            store.gate.set()
            with pytest.raises(asyncio.CancelledError):
                await task
            record = await host.call(store.load, "saving")
            store.gating = False
            return done_while_saving, record, (await session.run("again")).text

    done_while_saving, record, again = run(main)
    assert not done_while_saving  # the CancelledError came after the save, not before
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]
    assert again == "Fine."


def test_a_task_cancelled_mid_continuation_after_an_approval_saves_it_as_trio_does():
    @tool(needs_approval=True)
    async def delete_file(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    replies = iter([[*tool_call("delete_file", {"path": "/x"}, tool_call_id="D")], endless()])
    agent = Agent(
        provider=ScriptedProvider(responder=lambda request: next(replies)), tools=[delete_file]
    )

    async def main() -> tuple[Any, Any, Any]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(agent, "approval")
            waiting = await session.run("delete /x")
            (call,) = session.pending
            first = asyncio.Event()

            async def consume() -> None:
                await session.decide(call.approval_id, approved=True)
                async with session.resume() as out:
                    async for chunk in out:
                        if chunk.type == "text-delta":
                            first.set()

            task = asyncio.create_task(consume())
            await first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record = await host.call(host.host.store.load, "approval")
            return waiting.finish_reason, session.pending, record

    finish_reason, pending, record = run(main)
    assert finish_reason == "awaiting-input" and pending == ()
    assert statuses(record) == [("user", None), ("assistant", "interrupted"), ("tool", None)]


def own_threads() -> set[threading.Thread]:
    """The live threads but Trio's idle worker cache (``to_thread``), which comes and
    goes on its own."""
    return {t for t in threading.enumerate() if not t.name.startswith("Trio thread")}


def test_two_hundred_hosts_opened_and_closed_leave_no_thread():
    before = own_threads()

    async def main() -> int:
        most = 0
        for _ in range(200):
            async with AsyncHost.open(log_tap=False):
                most = max(most, len(host_threads()))
        return most

    assert run(main) == 1  # one host thread at a time, each ended at its block's end
    assert own_threads() == before


def test_a_host_kept_from_an_earlier_asyncio_run_refuses_work_a_new_one_serves():
    agent = Agent(provider=ScriptedProvider([["Fine."]]))
    kept: list[AsyncHost] = []

    async def first() -> None:
        async with AsyncHost.open(log_tap=False) as host:
            kept.append(host)

    async def second() -> str:
        with pytest.raises(HostClosed):
            await kept[0].open_session(agent)
        async with AsyncHost.open(log_tap=False) as host:
            return (await (await host.open_session(agent)).run("hi")).text

    run(first)
    assert run(second) == "Fine."


def test_a_stream_under_uvloop_gives_the_turn_and_cancels_it():
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[Any, Any]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=ScriptedProvider([["Hi."]])))
            whole = await session.run("hi")
            talking = await host.open_session(talker(), "uv")
            async with talking.stream("a lot") as out:
                async for chunk in out:
                    if chunk.type == "text-delta":
                        break
            return whole, await host.call(host.host.store.load, "uv")

    whole, record = uvloop.run(asyncio.wait_for(main(), LIMIT))
    assert whole.text == "Hi."
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]


def test_a_stalled_consumer_holds_at_most_two_hand_offs(monkeypatch):
    monkeypatch.setattr(Batcher, "max_items", 2)
    pulled = [0]

    def counted() -> Iterator[str]:
        for text in endless():
            pulled[0] += 1
            yield text

    agent = Agent(provider=ScriptedProvider(responder=lambda request: counted()))

    async def main() -> tuple[int, int, int, int]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(agent)
            async with session.stream("a lot") as out:
                await anext(out)
                await host.call(trio.testing.wait_all_tasks_blocked)
                stalled_at = pulled[0]
                await host.call(trio.testing.wait_all_tasks_blocked)
                held = len(out._reading) + sum(len(batch) for batch in out._waiting)
                return stalled_at, pulled[0], held, len(out._waiting)

    stalled_at, later, held, batches = run(main)
    assert later == stalled_at  # the provider is held, not drained into a buffer
    assert batches <= 1 and held <= 2 * HANDOFF_MOST


def test_a_provider_error_ends_the_stream_as_it_ends_a_trio_one():
    def failing(request: Any) -> Iterator[str]:
        yield "partial "
        raise RuntimeError("provider blew up")

    agent = Agent(provider=ScriptedProvider(responder=failing))

    async def main() -> tuple[Any, Any]:
        async with AsyncHost.open(log_tap=False) as host:

            async def under_trio() -> tuple[list[str], Any]:
                session = await host.host.open_session(agent, "trio")
                async with session.stream("hi") as out:
                    types = [chunk.type async for chunk in out]
                return types, out.result

            session = await host.open_session(agent, "aio")
            async with session.stream("hi") as out:
                types = [chunk.type async for chunk in out]
            return (types, out.result), await host.call(under_trio)

    (aio_types, aio_result), (trio_types, trio_result) = run(main)
    assert aio_types == trio_types and aio_types[-1] == "error"
    assert aio_result.error == trio_result.error
    assert aio_result.error.message == "RuntimeError: provider blew up"


def test_a_keyboard_interrupt_in_the_consumer_saves_the_turn_before_it_leaves_asyncio_run():
    store = MemoryStore()

    async def main() -> None:
        async with AsyncHost.open(store=store, log_tap=False) as host:
            session = await host.open_session(talker(), "interrupted")
            async with session.stream("a lot") as out:
                async for chunk in out:
                    if chunk.type == "text-delta":
                        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(main)
    assert not host_threads()
    record = trio.run(store.load, "interrupted")
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]


class Boom(BaseException):
    """A user's own BaseException (not an Exception)."""


def exploding(error: BaseException) -> Agent:
    @tool
    async def explode() -> str:
        """Explode."""
        raise error

    replies = iter([[*tool_call("explode", {}, tool_call_id="E")], ["After."], ["Again."]])
    return Agent(provider=ScriptedProvider(responder=lambda r: next(replies)), tools=[explode])


def test_a_base_exception_from_a_tool_is_the_tools_error_as_under_trio():
    async def main() -> tuple[Any, Any, Any]:
        async with AsyncHost.open(log_tap=False) as host:

            async def under_trio() -> Any:
                session = await host.host.open_session(exploding(Boom("b")), "trio")
                return await session.run("go")

            session = await host.open_session(exploding(Boom("b")), "aio")
            result = await session.run("go")
            return result, await host.call(under_trio), await session.run("again")

    result, trio_result, again = run(main)
    assert (result.finish_reason, result.text) == ("stop", "After.")
    assert (trio_result.finish_reason, trio_result.text) == ("stop", "After.")
    assert again.text == "Again."


def test_a_keyboard_interrupt_from_a_tool_stops_the_host_as_under_trio():
    # Trio: the interrupt ends the host's trio.run; here, the calls waiting fail with
    # HostClosed and the interrupt comes out of the host's block, no thread left
    async def main() -> None:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(exploding(KeyboardInterrupt()), "kbi")
            with pytest.raises(HostClosed):
                await session.run("go")

    with pytest.raises(KeyboardInterrupt):
        run(main)
    assert not host_threads()


def test_a_task_cancelled_while_its_host_opens_gets_the_cancellation_and_no_thread_is_left(
    monkeypatch,
):
    # a lifespan startup cancelled (Ctrl-C while the app starts, a startup timeout):
    # before, the cancelled task waited forever for a host nobody would close
    opening, go_on = threading.Event(), threading.Event()
    real_open = aio.Host.open

    @asynccontextmanager
    async def slow_open(**options: Any) -> AsyncIterator[Any]:
        opening.set()
        await trio.to_thread.run_sync(go_on.wait)
        async with real_open(**options) as host:
            yield host

    monkeypatch.setattr(aio.Host, "open", slow_open)
    before = host_threads()

    async def main() -> bool:
        async def lifespan() -> None:
            async with AsyncHost.open(log_tap=False):
                await asyncio.sleep(LIMIT)

        task = asyncio.create_task(lifespan())
        await asyncio.to_thread(opening.wait, LIMIT)
        task.cancel()
        go_on.set()
        await asyncio.wait({task}, timeout=LIMIT)  # (bounds a hang)
        return task.cancelled()

    assert asyncio.run(main())
    assert not host_threads() - before


def test_cancelling_a_stream_after_its_host_closed_does_nothing_as_under_trio():
    # a disconnect callback that fires during the app's shutdown
    async def main() -> Any:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(Agent(provider=ScriptedProvider([["Hi."]])))
            async with session.stream("hi") as out:
                await out.collect()
        out.cancel("the client went")
        return out.result

    assert run(main).finish_reason == "stop"


def test_a_second_task_reading_the_same_stream_is_refused_as_under_trio():
    # before, the first reader waited for ever: the second's wake-up replaced its own
    async def main() -> tuple[Any, ...]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(talker(), "two")
            async with session.stream("a lot") as out:
                first = asyncio.create_task(anext(out))
                await asyncio.sleep(0)  # the first reader waits for a batch
                with pytest.raises(SessionError, match="another task is reading"):
                    await anext(out)
                return (await first).type, (await anext(out)).type

    assert run(main) == ("start", "step-start")


def test_cancelled_and_timed_out_calls_leave_no_bridge_task_behind():
    async def main() -> tuple[int, bool, str]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(talker(), "left")

            async def consume() -> None:
                async with session.stream("a lot") as out:
                    async for _ in out:
                        await asyncio.sleep(LIMIT)

            task = asyncio.create_task(consume())
            for _ in range(3):
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0):
                    await session.run("a lot")

            async def bridge_tasks() -> int:
                await trio.testing.wait_all_tasks_blocked()
                return len(host._nursery.child_tasks)

            return (
                await host.call(bridge_tasks),
                session.session.busy,
                (await session.run("again")).text,
            )

    assert run(main) == (1, False, "Fine.")  # (the one counting)


def test_breaking_out_of_async_for_alone_pauses_the_turn_as_under_trio():
    # the turn is interrupted when the *block* is left, not the loop: a loop broken and
    # iterated again goes on from the next chunk, and the turn ends normally
    agent = Agent(provider=ScriptedProvider([["one two three four"]]))

    async def main() -> tuple[Any, Any]:
        async with AsyncHost.open(log_tap=False) as host:

            async def under_trio() -> tuple[list[str], Any]:
                session = await host.host.open_session(agent, "trio")
                async with session.stream("hi") as out:
                    async for chunk in out:
                        if chunk.type == "text-delta":
                            break
                    texts = [chunk.text async for chunk in out if chunk.type == "text-delta"]
                return texts, out.result

            session = await host.open_session(agent, "aio")
            async with session.stream("hi") as out:
                async for chunk in out:
                    if chunk.type == "text-delta":
                        break
                texts = [chunk.text async for chunk in out if chunk.type == "text-delta"]
            return (texts, out.result), await host.call(under_trio)

    (texts, result), (trio_texts, trio_result) = run(main)
    assert texts == trio_texts == [" two", " three", " four"]
    assert result.finish_reason == trio_result.finish_reason == "stop"
    assert result.text == "one two three four"


def test_an_anyio_cancel_scope_does_not_spin_the_loop_while_the_turn_saves():
    # Starlette and FastAPI cancel a disconnected client's response through anyio, whose
    # cancel scopes cancel the task again at every pass of the loop until it leaves the
    # scope: the wait for the save caught each one and waited again, a busy loop for
    # the whole save. Counted: the cancellations the task received over 100 passes.
    anyio = pytest.importorskip("anyio")
    store = GatedStore()

    async def main() -> tuple[int, Any]:
        async with AsyncHost.open(store=store, log_tap=False) as host:
            session = await host.open_session(talker(), "anyio")
            first = asyncio.Event()
            scopes: list[Any] = []

            async def respond() -> None:
                with anyio.CancelScope() as scope:
                    scopes.append(scope)
                    async with session.stream("a lot") as out:
                        async for _ in out:
                            first.set()

            task = asyncio.create_task(respond())
            await first.wait()
            store.gating = True
            scopes[0].cancel()  # the client went away
            await asyncio.to_thread(store.saving.wait, LIMIT)
            for _ in range(100):
                await asyncio.sleep(0)
            cancellations = task.cancelling()
            store.gate.set()
            await task  # the scope took its own cancellation back
            return cancellations, await host.call(store.load, "anyio")

    cancellations, record = run(main)
    assert cancellations == 1  # the client's going, and no more
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]


CTRL_C = """
import asyncio, itertools, os, signal, sys, threading
from actors.providers.scripted import ScriptedProvider
from runtime import Agent
from runtime.app.aio import AsyncHost

# A terminal's Ctrl-C: a suite started in the background (`nohup pytest &`) hands its
# children SIGINT ignored, which Python keeps, and the kill below then did nothing.
signal.signal(signal.SIGINT, signal.default_int_handler)

def endless(request):
    for i in itertools.count():
        yield f"w{i} "

async def main():
    async with AsyncHost.open(store=sys.argv[1], log_tap=False) as host:
        session = await host.open_session(Agent(provider=ScriptedProvider(responder=endless)), "c")
        async with session.stream("a lot") as out:
            async for chunk in out:
                if chunk.type == "text-delta":
                    os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C

try:
    asyncio.run(main())
except KeyboardInterrupt:
    hosts = [t.name for t in threading.enumerate() if t.name == "axon-trio-host"]
    print("KeyboardInterrupt", hosts)
"""


def test_ctrl_c_under_asyncio_run_saves_the_turn_interrupted_and_ends_the_host(tmp_path):
    # a real SIGINT: asyncio.run cancels the main task, which cancels the turn
    store = str(tmp_path / "s.db")
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C, store],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.strip() == "KeyboardInterrupt []", done.stderr

    async def stored() -> Any:
        async with AsyncHost.open(store=store, log_tap=False) as host:
            return await host.call(host.host.store.load, "c")

    assert statuses(run(stored)) == [("user", None), ("assistant", "interrupted")]
