"""Sessions are saved at every step boundary and reload equal from SQLite."""

from __future__ import annotations

import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, Sleep, tool_call
from actors.stores import MemoryStore, SQLiteStore
from runtime import Agent, Host, ReasoningChunk, tool


@tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


STEPS = [
    [
        ReasoningChunk(text="sum it", signature="sig", provider="scripted"),
        *tool_call("add", {"a": 2, "b": 3}, tool_call_id="S"),
    ],
    ["The sum is 5."],
]


async def test_session_saved_to_sqlite_reloads_equal(tmp_path):
    path = str(tmp_path / "sessions.db")
    agent = Agent(provider=ScriptedProvider(STEPS), tools=[add])
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(agent, session_id="calc")
        await session.run("2+3?")
        before = session.messages
    async with Host.open(store=path, log_tap=False) as host:
        again = await host.open_session(agent, session_id="calc")
        assert again.messages == before
        # and the resumed session continues with its history
        await again.run("again?")
        assert len(again.messages) == len(before) + 3
    store = await SQLiteStore.open(path)
    try:
        record = await store.load("calc")
    finally:
        await store.aclose()
    assert record is not None and len(record.messages) == len(before) + 3


async def test_every_step_boundary_is_saved_before_the_turn_ends(autojump_clock):
    store = MemoryStore()
    steps = [[*tool_call("add", {"a": 1, "b": 1}, tool_call_id="S")], [Sleep(10), "two"]]
    agent = Agent(provider=ScriptedProvider(steps), tools=[add])
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="mid")
        async with session.stream("1+1") as out:
            async for chunk in out:
                if chunk.type == "step-finish" and chunk.step == 0:
                    await trio.sleep(1)  # let the persister write step 0
                    record = await store.load("mid")
                    roles = [m.role for m in record.messages]
                    assert roles == ["user", "assistant", "tool"]
                    assert record.messages[1].content[0].tool_call_id == "S"
        assert out.result.finish_reason == "stop"
    final = await store.load("mid")
    assert final.messages[1].text == "two"


async def test_two_sessions_on_one_store_stay_separate(tmp_path):
    path = str(tmp_path / "s.db")
    agent = Agent(provider=ScriptedProvider(turns=[[["alpha"]], [["beta"]]]))
    async with Host.open(store=path, log_tap=False) as host:
        a = await host.open_session(agent, session_id="a")
        b = await host.open_session(agent, session_id="b")
        await a.run("x")
        await b.run("y")
        await b.run("z")
    async with Host.open(store=path, log_tap=False) as host:
        sessions = await host.store.list_sessions()
        counts = {s.session_id: s.message_count for s in sessions}
    assert counts == {"a": 2, "b": 4}


async def test_a_version_read_runs_on_the_loop_without_a_thread(tmp_path, monkeypatch):
    """Every turn starts with a version read: it costs microseconds on the loop, where a
    worker thread's round trip costs hundreds (issue 24)."""
    from runtime.messages import UserMessage

    store = await SQLiteStore.open(str(tmp_path / "sessions.db"))
    try:
        version = await store.save("v", 0, [UserMessage(content="hi")])

        def no_thread(*args: object, **kwargs: object) -> None:
            raise AssertionError("the version read went to a thread")

        monkeypatch.setattr(trio.to_thread, "run_sync", no_thread)
        assert await store.version("v") == version
        assert await store.version("never-saved") == 0
    finally:
        monkeypatch.undo()
        await store.aclose()


async def test_a_small_save_runs_on_the_loop_and_a_large_one_in_a_thread(tmp_path, monkeypatch):
    """A turn's save is written on the loop when it is small (issue 24: the thread's
    round trip was part of every turn's fixed cost); a large one still goes to a thread."""
    from actors.stores.sqlite import INLINE_SAVE_BYTES
    from runtime.messages import UserMessage

    store = await SQLiteStore.open(str(tmp_path / "sessions.db"))
    threads: list[object] = []
    run_sync = trio.to_thread.run_sync

    async def counted(fn: object, *args: object) -> object:
        threads.append(fn)
        return await run_sync(fn, *args)  # type: ignore[arg-type]

    try:
        monkeypatch.setattr(trio.to_thread, "run_sync", counted)
        first = await store.save("v", 0, [UserMessage(content="hi")])
        assert threads == []
        big = UserMessage(content="x" * (INLINE_SAVE_BYTES + 1))
        second = await store.save("v", 1, [big], expected_version=first)
        assert len(threads) == 1 and second == first + 1
        record = await store.load("v")
        assert record is not None and [m.content for m in record.messages] == ["hi", big.content]
    finally:
        monkeypatch.undo()
        await store.aclose()


async def test_a_small_session_loads_on_the_loop_and_a_large_one_in_a_thread(tmp_path, monkeypatch):
    """Reading a small session on the loop costs less than a worker thread's round trip
    (issue 24: the turn's fixed cost); a large one still goes to a thread, so the loop
    never stalls on it. Both load equal to what was saved."""
    from actors.stores.sqlite import INLINE_LOAD_BYTES
    from runtime.messages import UserMessage

    path = str(tmp_path / "sessions.db")
    store = await SQLiteStore.open(path)
    small = [UserMessage(content="hi"), UserMessage(content="again")]
    large = [UserMessage(content="x" * (INLINE_LOAD_BYTES // 2)) for _ in range(3)]
    threads: list[object] = []
    run_sync = trio.to_thread.run_sync

    def no_thread(*args: object, **kwargs: object) -> None:
        raise AssertionError("the small session's load went to a thread")

    async def counted(fn: object, *args: object) -> object:
        threads.append(fn)
        return await run_sync(fn, *args)  # type: ignore[arg-type]

    try:
        await store.save("small", 0, small)
        await store.save("large", 0, large)
        monkeypatch.setattr(trio.to_thread, "run_sync", no_thread)
        record = await store.load("small")
        assert record is not None and list(record.messages) == small
        assert await store.load("never-saved") is None
        monkeypatch.setattr(trio.to_thread, "run_sync", counted)
        record = await store.load("large")
        assert len(threads) == 1
        assert record is not None and list(record.messages) == large
    finally:
        monkeypatch.undo()
        await store.aclose()
    # The same records read in a worker thread whatever their size, as before.
    store = await SQLiteStore.open(path)
    try:
        for sid, messages in (("small", small), ("large", large)):
            record = await store._run("load", store._load, sid)
            assert record is not None and list(record.messages) == messages
    finally:
        await store.aclose()


async def test_a_save_while_another_process_writes_waits_in_a_thread(tmp_path):
    """Another connection holds the write lock: the save must not block the loop waiting
    for it (it goes to a worker thread, which waits) and is written once the lock is free."""
    import sqlite3

    from runtime.messages import UserMessage

    path = str(tmp_path / "sessions.db")
    store = await SQLiteStore.open(path)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        other.execute("BEGIN IMMEDIATE")
        ticks = 0
        saved: list[int] = []

        async def save() -> None:
            saved.append(await store.save("w", 0, [UserMessage(content="hi")]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(save)
            for _ in range(5):  # the loop keeps running while the save waits
                await trio.sleep(0.02)
                ticks += 1
            assert saved == []
            other.execute("COMMIT")
        assert ticks == 5 and saved == [1]
        record = await store.load("w")
        assert record is not None and record.messages[0].content == "hi"
    finally:
        other.close()
        await store.aclose()


async def test_a_version_read_that_would_wait_goes_to_a_thread(tmp_path, monkeypatch):
    """When SQLite says the read would have to wait (busy), it is made again in a worker
    thread, which may wait, and the answer is the same."""
    import sqlite3

    from runtime.messages import UserMessage

    store = await SQLiteStore.open(str(tmp_path / "sessions.db"))
    try:
        version = await store.save("v", 0, [UserMessage(content="hi")])

        def busy(session_id: str) -> int:
            err = sqlite3.OperationalError("database is locked")
            err.sqlite_errorcode = sqlite3.SQLITE_BUSY  # type: ignore[attr-defined]
            raise err

        threads: list[object] = []
        run_sync = trio.to_thread.run_sync

        async def counted(fn: object, *args: object) -> object:
            threads.append(fn)
            return await run_sync(fn, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(store, "_version_without_waiting", busy)
        monkeypatch.setattr(trio.to_thread, "run_sync", counted)
        assert await store.version("v") == version
        assert len(threads) == 1
    finally:
        monkeypatch.undo()
        await store.aclose()


async def test_a_session_never_saved_is_loaded_without_a_thread(tmp_path, monkeypatch):
    """A new conversation's first load finds nothing on the loop (no thread hand-off);
    a saved one is still loaded, whole (a small one on the loop too, see
    ``test_a_small_session_loads_on_the_loop_and_a_large_one_in_a_thread``)."""
    from runtime.messages import UserMessage

    store = await SQLiteStore.open(str(tmp_path / "sessions.db"))
    try:
        await store.save("saved", 0, [UserMessage(content="hi")])
        threads: list[object] = []
        run_sync = trio.to_thread.run_sync

        async def counted(fn: object, *args: object) -> object:
            threads.append(fn)
            return await run_sync(fn, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(trio.to_thread, "run_sync", counted)
        assert await store.load("new") is None
        assert threads == []
        record = await store.load("saved")
        assert record is not None and record.messages[0].content == "hi"
        assert threads == []
    finally:
        monkeypatch.undo()
        await store.aclose()


async def test_a_store_call_on_the_loop_takes_no_scheduler_round_while_the_lock_is_free(
    tmp_path,
):
    """The version query, a small save and a small load run on the loop without
    yielding: nothing else can take the lock while they run, so taking it (a schedule
    point: a task step and a scheduler round more each, three per turn) is skipped while
    it is free (issue 24 goal 1). Cancellation is still checked."""
    from runtime.messages import UserMessage
    from tests.support.steps import counted

    store = await SQLiteStore.open(str(tmp_path / "sessions.db"))
    me = trio.lowlevel.current_task()
    try:
        with counted() as steps:
            version = await store.save("v", 0, [UserMessage(content="hi")])
            assert await store.version("v") == version
            record = await store.load("v")
        assert steps.of(me) == 0 and steps.rounds == 0
        assert record is not None and record.messages[0].content == "hi"
        with trio.CancelScope() as scope:
            scope.cancel()
            await store.version("v")
        assert scope.cancelled_caught
    finally:
        await store.aclose()


async def test_a_store_call_on_the_loop_waits_while_a_thread_call_holds_the_lock(tmp_path):
    """While a worker thread's call holds the store's lock, a call that would run on the
    loop waits for it: the connection is never used from two threads at once."""
    from runtime.messages import UserMessage

    store = await SQLiteStore.open(str(tmp_path / "sessions.db"))
    order: list[str] = []
    try:
        version = await store.save("v", 0, [UserMessage(content="hi")])
        async with trio.open_nursery() as nursery:
            await store._lock.acquire()  # as a thread's call holds it
            nursery.start_soon(lambda: _version_into(store, order))
            await trio.testing.wait_all_tasks_blocked()
            order.append("released")
            store._lock.release()
        assert order == ["released", f"version {version}"]
    finally:
        await store.aclose()


async def _version_into(store: SQLiteStore, order: list[str]) -> None:
    order.append(f"version {await store.version('v')}")
