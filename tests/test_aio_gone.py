"""``runtime.app.aio`` when the asyncio side goes away without a word: a reader's own
loop (not the host's opener) closed or its thread ended mid-stream, the interpreter
exiting with a host open, and what an idle host costs (it sleeps until work comes).
Also loops used one after another, per-chunk ``asyncio.wait_for`` timeouts, and two
hosts on one store (docs/asyncio.md, "When things go wrong").

As in tests/test_aio_attacks.py: plain functions running ``asyncio.run``; waiting for
the other side is done on events, never by a timing (``LIMIT`` only bounds a hang), and
:data:`runtime.app.aio.LOOP_WATCH` is patched small where a test waits for a check.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep
from actors.stores import MemoryStore
from actors.stores.sqlite import SQLiteStore
from runtime import Agent, ConfigurationError, Host, SessionError, UserMessage
from runtime.app import aio
from runtime.app.aio import AsyncHost
from tests.support.aio_talk import LIMIT, ROOT, run, talker


def statuses(record: Any) -> list[tuple[str, str | None]]:
    return [(m.role, getattr(m, "status", None)) for m in record.messages]


def loop_makers() -> list[Any]:
    makers: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        makers.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip("no uvloop")))
    else:
        makers.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return makers


def read_in_a_thread_until_its_loop_dies(
    new_loop: Callable[[], asyncio.AbstractEventLoop], session: Any, how: str, kept: list[Any]
) -> Any:
    """In a thread of its own, a loop reads ten chunks of a stream and stops where it
    is (neither the block nor the loop left; the task kept referenced in ``kept``, as an
    application's registry of its tasks would, so no garbage collection closes it); then
    the loop is closed, or just left as the thread ends."""
    entered: list[Any] = []

    def worker() -> None:
        loop = new_loop()

        async def read() -> None:
            count = 0
            async with session.stream("a lot") as out:
                entered.append(out)
                async for _ in out:
                    count += 1
                    if count == 10:
                        loop.stop()
                        await asyncio.sleep(0)  # stopped here, never to run again

        task = loop.create_task(read())
        kept.append((task, loop))
        with pytest.raises(RuntimeError):  # (run_until_complete: stopped before...)
            loop.run_until_complete(task)
        if how == "closed":
            loop.close()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(LIMIT)
    (out,) = entered
    return out


@pytest.mark.parametrize("new_loop", loop_makers())
@pytest.mark.parametrize("how", ["closed", "thread ended"])
def test_a_readers_own_loop_dying_mid_stream_ends_its_turn_saved_interrupted(
    monkeypatch, new_loop, how
):
    # the host's opener is alive and well; the stream is read by another thread's loop,
    # which dies while the Trio side waits for it to take a batch. Before, the turn
    # waited for ever (the session busy, nothing saved) until the host closed.
    monkeypatch.setattr(aio, "LOOP_WATCH", 0.01)
    store = MemoryStore()

    async def main() -> tuple[Any, Any, str, Any]:
        async with AsyncHost.open(store=store, log_tap=False) as host:
            session = await host.open_session(talker(), "gone")
            kept: list[Any] = []
            out = await asyncio.to_thread(
                read_in_a_thread_until_its_loop_dies, new_loop, session, how, kept
            )
            await host.call(out._trio.done.wait)  # the turn ends (before: never)
            record = await host.call(store.load, "gone")
            return out._trio.result, record, (await session.run("again")).text, kept

    result, record, again, _ = run(main)
    assert (result.finish_reason, result.error) == ("aborted", None)
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]
    assert again == "Fine."  # the host goes on, the session free


def test_a_loop_stopped_between_run_until_complete_calls_keeps_its_stream(monkeypatch):
    # a host opened by a loop driven with run_until_complete, a stream entered in one
    # call and read on in the next: between them the loop is not running, but its
    # thread is alive, so the reader is not gone however many checks pass
    monkeypatch.setattr(aio, "LOOP_WATCH", 0.001)
    checks = [0]
    checked = threading.Event()
    real_gone = aio._gone

    def counted(loop: Any, thread: Any) -> bool:
        checks[0] += 1
        if checks[0] >= 20:
            checked.set()
        return real_gone(loop, thread)

    monkeypatch.setattr(aio, "_gone", counted)
    agent = Agent(provider=ScriptedProvider([["one two three"]]))
    outcome: list[Any] = []

    def driven() -> None:
        loop = asyncio.new_event_loop()
        opening = AsyncHost.open(log_tap=False)
        host = loop.run_until_complete(opening.__aenter__())
        session = loop.run_until_complete(host.open_session(talker(), "paused"))
        out = session.stream("a lot")

        async def start() -> list[str]:
            await out.__aenter__()
            return [(await anext(out)).type for _ in range(3)]

        first = loop.run_until_complete(start())
        checked.wait(LIMIT)  # the Trio side waits for the credit, looking at the loop

        async def elsewhere() -> str:  # another loop of the same thread meanwhile
            other = await host.open_session(agent, "other")
            return (await other.run("hi")).text

        text = asyncio.run(elsewhere())

        async def finish() -> tuple[Any, Any]:
            more = []
            async for chunk in out:
                more.append(chunk)
                if len(more) == 50:
                    break
            await out.__aexit__(None, None, None)
            return more, await host.call(host.host.store.load, "paused")

        more, record = loop.run_until_complete(finish())
        loop.run_until_complete(opening.__aexit__(None, None, None))
        loop.close()
        outcome.append((first, text, len(more), out.result.finish_reason, statuses(record)))

    thread = threading.Thread(target=driven)
    thread.start()
    thread.join(LIMIT)
    (got,) = outcome
    assert checks[0] >= 20
    assert got == (
        ["start", "step-start", "text-start"],
        "one two three",
        50,
        "aborted",  # the block left early: consumer left the stream
        [("user", None), ("assistant", "interrupted")],
    )


def test_an_idle_host_sleeps_until_work_comes_and_still_closes_at_once(monkeypatch):
    # before, the host thread woke every LOOP_WATCH (1 s) for ever to look at its
    # opener's loop. Counted with the watch at 0 s (so a poll would spin): the host's
    # checks while idle, over 50 round trips through its Trio thread (each wakes the
    # thread, not the host's main task).
    monkeypatch.setattr(aio, "LOOP_WATCH", 0)
    checks = [0]
    real = AsyncHost._loop_gone

    def counted(self: AsyncHost) -> bool:
        checks[0] += 1
        return real(self)

    monkeypatch.setattr(AsyncHost, "_loop_gone", counted)
    agent = Agent(provider=ScriptedProvider([["Hi."]]))

    async def round_trip(host: AsyncHost) -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        host._submit(lambda: loop.call_soon_threadsafe(done.set_result, None))
        await done

    async def main() -> tuple[int, int, int, str]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(agent)
            text = (await session.run("hi")).text
            busy = checks[0]  # (the watch ran while the calls were in flight)
            for _ in range(2):  # the host's main task has seen the last call end
                await round_trip(host)
            idle = checks[0]
            for _ in range(50):
                await round_trip(host)
            slept = checks[0] - idle
            thread = host._thread
        # leaving the block woke it: the thread has ended (joined) by now
        return busy, slept, thread.is_alive(), text

    busy, slept, alive, text = run(main)
    assert busy >= 1 and text == "Hi."
    assert slept == 0  # no wake-up while idle
    assert not alive


EXITING = """
import asyncio, sys
from actors.providers.scripted import ScriptedProvider, Sleep
from runtime import Agent
from runtime.app.aio import AsyncHost

agent = Agent(provider=ScriptedProvider([["hello ", Sleep(3600), "never"]]))
kept = []

async def main():
    kept.append(AsyncHost.open(store=sys.argv[1]))
    host = await kept[0].__aenter__()  # never left
    session = await host.open_session(agent, "x")
    kept.append(session.stream("go"))
    out = await kept[1].__aenter__()  # never left
    async for chunk in out:
        if chunk.type == "text-delta":
            if sys.argv[2] == "returns":
                return
            asyncio.get_running_loop().call_soon(sys.exit, 3)  # out of run_until_complete
            await asyncio.sleep(3600)

asyncio.new_event_loop().run_until_complete(main())  # no asyncio.run to clean up
"""


@pytest.mark.parametrize(("how", "code"), [("returns", 0), ("sys.exit", 3)])
def test_an_exit_with_a_turn_running_on_an_open_host_saves_it_interrupted(tmp_path, how, code):
    # the script ends (returns from its loop, or sys.exit from a callback) with a host
    # and a stream entered and never left: before, the host's daemon thread was stopped
    # where it was and the turn never saved; the exit hook now closes the host, as a
    # Trio host is closed on the way out of trio.run. The provider would wait an hour:
    # the run's own timeout bounds the exit.
    store = str(tmp_path / "s.db")
    done = subprocess.run(
        [sys.executable, "-c", EXITING, store, how],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr, done.stderr

    async def stored() -> Any:
        async with AsyncHost.open(store=store, log_tap=False) as host:
            return await host.call(host.host.store.load, "x")

    record = run(stored)
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]
    assert record.messages[-1].text == "hello "


HUNG = """
import asyncio, atexit, sys, threading
from actors.providers.scripted import ScriptedProvider, Sleep
from actors.stores import MemoryStore
from runtime import Agent
from runtime.app import aio

class Hung(MemoryStore):
    hang = False
    async def save(self, *args, **kwargs):
        if self.hang:
            threading.Event().wait()  # the host's thread stuck for good
        return await super().save(*args, **kwargs)

aio.EXIT_WAIT = 0.5
store = Hung()
atexit.register(lambda: print("exited", flush=True))  # (runs after the host's hook)
kept = []

async def main():
    kept.append(aio.AsyncHost.open(store=store, log_tap=False))
    host = await kept[0].__aenter__()
    agent = Agent(provider=ScriptedProvider([["hello ", Sleep(3600)]]))
    kept.append((await host.open_session(agent, "x")).stream("go"))
    out = await kept[1].__aenter__()
    async for chunk in out:
        if chunk.type == "text-delta":
            store.hang = True
            return

asyncio.new_event_loop().run_until_complete(main())
"""


def test_the_exit_waits_for_a_stuck_host_at_most_exit_wait():
    # the host's thread stuck (a store blocking it) when the interpreter exits: the
    # exit hook gives up after EXIT_WAIT and the process ends (the turn unsaved)
    done = subprocess.run(
        [sys.executable, "-c", HUNG],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "exited\n"), done.stderr


def replier() -> Agent:
    def reply(request: Any) -> list[str]:
        asked = [m.text for m in request.messages if isinstance(m, UserMessage)]
        return [f"to {asked[-1]}"]

    return Agent(provider=ScriptedProvider(responder=reply))


def test_two_hosts_on_one_store_path_keep_both_turns_of_a_session(tmp_path):
    # two hosts (two Trio threads) on one SQLite file, one session, a turn each at once:
    # each host opened a store of its own; the later save is rebased, both turns kept
    path = str(tmp_path / "two.db")

    async def main() -> tuple[list[str], Any]:
        async with (
            AsyncHost.open(store=path, log_tap=False) as a,
            AsyncHost.open(store=path, log_tap=False) as b,
        ):
            one = await a.open_session(replier(), "shared")
            two = await b.open_session(replier(), "shared")
            results = await asyncio.gather(one.run("a"), two.run("b"))
            return [r.finish_reason for r in results], await a.call(a.host.store.load, "shared")

    reasons, record = run(main)
    assert reasons == ["stop", "stop"]
    assert sorted(m.text for m in record.messages) == ["a", "b", "to a", "to b"]


def test_one_store_object_serves_one_hosts_thread_at_a_time(tmp_path):
    # an SQLiteStore object given to two AsyncHosts: its trio.Lock and its connection
    # served two Trio runs, whose transactions interleaved: a turn each of 7 sessions in
    # 200 was lost, both runs answered "stop". Now the second host is refused (as a
    # provider serving another run is); hosts of one Trio run may still share it.
    store = trio.run(SQLiteStore.open, str(tmp_path / "one.db"))

    async def main() -> tuple[str, str]:
        async with AsyncHost.open(store=store, log_tap=False) as a:
            with pytest.raises(ConfigurationError, match="serves one Trio run at a time"):
                async with AsyncHost.open(store=store, log_tap=False):
                    pass
            first = await (await a.open_session(replier(), "s")).run("a")
        async with AsyncHost.open(store=store, log_tap=False) as b:  # released: served
            second = await (await b.open_session(replier(), "s")).run("b")
        return first.text, second.text

    async def one_run() -> int:
        async with Host.open(store=store, log_tap=False) as a, Host.open(store=store) as b:
            await (await a.open_session(replier(), "t")).run("a")
            await (await b.open_session(replier(), "t")).run("b")
            return len((await store.load("t")).messages)

    assert run(main) == ("to a", "to b")
    assert trio.run(one_run) == 4
    trio.run(store.aclose)


def test_a_per_chunk_wait_for_timeout_loses_no_chunk_and_the_stream_reads_on():
    # asyncio.wait_for around each anext(out), as an idle timeout: a timeout cancels the
    # wait only, not the turn (the block is not left); the chunks before it all came,
    # once, and the stream reads on, here to the abort of out.cancel()
    def reply(request: Any) -> Any:
        asked = [m.text for m in request.messages if isinstance(m, UserMessage)]
        return ["one two three", Sleep(3600), "never"] if asked[-1] == "hi" else ["Fine."]

    agent = Agent(provider=ScriptedProvider(responder=reply))

    async def main() -> tuple[list[str], list[str], Any, str]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(agent, "idle")
            texts: list[str] = []
            async with session.stream("hi") as out:
                while True:
                    try:
                        chunk = await asyncio.wait_for(anext(out), 0.05)
                    except TimeoutError:
                        if "".join(texts) == "one two three":  # the provider's pause
                            break
                        continue  # (a slow chunk before it)
                    if chunk.type == "text-delta":
                        texts.append(chunk.text)
                out.cancel("idle")
                rest = [chunk.type async for chunk in out]
            record = await host.call(host.host.store.load, "idle")
            return texts, rest, statuses(record), (await session.run("again")).text

    texts, rest, stored, again = run(main)
    assert texts == ["one", " two", " three"]
    assert rest == ["text-finish", "abort"]
    assert stored == [("user", None), ("assistant", "interrupted")]
    assert again == "Fine."


def test_wait_for_timeouts_around_a_stream_and_its_chunks_as_cancels():
    # wait_for around the whole consumer: a cancel, saved interrupted before the
    # TimeoutError; around each anext(out) of a fast stream, timing out now and then:
    # every delta comes once, in order
    many = " ".join(str(i) for i in range(3000))
    agent = Agent(provider=ScriptedProvider(responder=lambda request: [many]))

    async def main() -> tuple[Any, bool, str]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(talker(), "whole")

            async def consume() -> None:
                async with session.stream("a lot") as out:
                    async for _ in out:
                        await asyncio.sleep(0)

            with pytest.raises(TimeoutError):
                await asyncio.wait_for(consume(), 0.5)  # (mid-stream: it is endless)
            record = await host.call(host.host.store.load, "whole")
            busy = session.session.busy
            fast = await host.open_session(agent, "fast")
            texts = []
            async with fast.stream("go") as out:
                while True:
                    try:
                        chunk = await asyncio.wait_for(anext(out), 0.00001)
                    except TimeoutError:
                        continue
                    except StopAsyncIteration:
                        break
                    if chunk.type == "text-delta":
                        texts.append(chunk.text)
            return statuses(record), busy, "".join(texts)

    stored, busy, text = run(main)
    assert stored == [("user", None), ("assistant", "interrupted")] and not busy
    assert text == many


def test_a_stream_read_by_another_loop_is_refused_its_own_loop_reads_on():
    # the stream's wake-ups go to the loop that entered its block: another thread's loop
    # reading it parked on a future nobody woke (a hang), set from the wrong thread. Now
    # a SessionError at its next batch; the entering task reads on.
    async def main() -> tuple[str, int, str]:
        async with AsyncHost.open(log_tap=False) as host:
            session = await host.open_session(talker(), "two-loops")
            async with session.stream("a lot") as out:
                first = await anext(out)

                def elsewhere() -> None:
                    async def read() -> None:
                        async for _ in out:
                            pass

                    with pytest.raises(SessionError, match="another event loop"):
                        asyncio.run(asyncio.wait_for(read(), LIMIT))  # (bounds a hang)

                await asyncio.to_thread(elsewhere)
                more = [await anext(out) for _ in range(50)]
            return first.type, len(more), out.result.finish_reason

    assert run(main) == ("start", 50, "aborted")


def test_a_dead_readers_coroutine_closed_from_another_running_loop_does_not_wait():
    # the garbage collector may close a dead loop's task's coroutine in any thread, one
    # whose own loop runs included: it took that loop's task for its own and waited for
    # the save in a closing coroutine ("coroutine ignored GeneratorExit", then, under
    # anyio, "no running event loop" from the shielded scope, unraisable at GC; about 1
    # run in 8 of the test above). Closed here by hand from the test's running loop.
    store = MemoryStore()

    async def main() -> tuple[Any, Any]:
        async with AsyncHost.open(store=store, log_tap=False) as host:
            session = await host.open_session(talker(), "closed")
            kept: list[Any] = []
            out = await asyncio.to_thread(
                read_in_a_thread_until_its_loop_dies, asyncio.new_event_loop, session, "x", kept
            )
            ((task, loop),) = kept
            task.get_coro().close()  # (before: RuntimeError, coroutine ignored GeneratorExit)
            await host.call(out._trio.done.wait)
            loop.close()
            return out._trio.result, await host.call(store.load, "closed")

    result, record = run(main)
    assert result.finish_reason == "aborted"
    assert statuses(record) == [("user", None), ("assistant", "interrupted")]
