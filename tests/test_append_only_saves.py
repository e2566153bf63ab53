"""A long turn's step saves write what the step added (branch ``appendonly``, journal
``benchmarks/journal/workers.md``).

A turn's answer holds every step's parts and each step's save sent it again: written
whole over its row, a turn of n steps wrote n(n+1)/2 steps' parts (46.9 MB at 1,000
steps, 99.3 % of what the turn wrote; journal ``longturn2``). A store that takes
``grown`` (:class:`~runtime.store.Store`'s grown rows) writes the answer's head and a
segment of its new parts; its readers fold them back, and the turn's last save writes
it whole."""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores.sqlite import SQLiteStore
from actors.stores.validation import HEAD_PREFIX, decode_message
from runtime import Agent, Budget, Host, serde, tool
from runtime.errors import StoreCorrupt
from runtime.messages import AssistantMessage, Message, TextPart, ToolCallPart, UserMessage

STEPS = 200


class _CountingConnection:
    """A store's connection that sums the str/bytes parameters of its writes, a save
    (a ``COMMIT``) at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self.saves: list[int] = []
        self._now = 0

    def _count(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if sql.lstrip().split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE"):
            self._now += sum(len(v) for row in rows for v in row if isinstance(v, str | bytes))

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if sql.strip() == "COMMIT" and self._now:
            self.saves.append(self._now)
            self._now = 0
        self._count(sql, [params] if params else [])
        return self._conn.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> Any:
        rows = list(rows)
        self._count(sql, rows)
        return self._conn.executemany(sql, rows)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _WholeStore(SQLiteStore):
    """The SQLite store as it was before grown rows: its save does not take ``grown``,
    so the runtime sends none and every answer is written whole."""

    async def save(  # type: ignore[override]
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        meta: Any = None,
        *,
        expected_version: int | None = None,
        kept: Collection[int] = (),
        absent_mark: int | None = None,
    ) -> int:
        return await super().save(
            session_id,
            start,
            messages,
            meta,
            expected_version=expected_version,
            kept=kept,
            absent_mark=absent_mark,
        )


def _agent(steps: int, tools: list[Any]) -> Agent:
    calls = [tool_call(tools[0].name, {"i": i}, tool_call_id=f"c{i}") for i in range(steps)]
    return Agent(
        provider=ScriptedProvider([*calls, ["done"]]),
        tools=tools,
        budget=Budget(max_steps=steps + 1),
    )


@tool
def lookup(i: int) -> str:
    """Looks a number up."""
    return f"r{i}" + "x" * 100


async def test_a_step_saves_bytes_do_not_grow_with_the_turns_steps(tmp_path: Path) -> None:
    store = await SQLiteStore.open(tmp_path / "s.db")
    counting = _CountingConnection(store._conn)
    store._conn = counting  # type: ignore[assignment]
    async with Host.open(store=store, log_tap=False) as host:
        opened = len(counting.saves)  # (the host's registry row, written as it opens)
        session = await host.open_session(_agent(STEPS, [lookup]), session_id="s")
        assert (await session.run("go")).text == "done"
        messages = session.messages
        ran = len(counting.saves)
    await store.aclose()
    saves = counting.saves[opened:ran]  # (not the registry row's removal as it closes)
    assert len(saves) == STEPS + 1
    # (~720 bytes a step's save here; written whole, step 200's save wrote ~19 KB and
    # step 20's ~2.5 KB)
    assert saves[STEPS - 1] < 2 * saves[19]
    assert sum(saves[:-1]) < 1_000 * STEPS
    reopened = await SQLiteStore.open(tmp_path / "s.db")
    try:
        loaded = await reopened.load("s")
    finally:
        await reopened.aclose()
    assert loaded is not None and loaded.messages == tuple(messages)
    with sqlite3.connect(tmp_path / "s.db") as conn:  # the last save wrote it whole
        assert conn.execute("SELECT count(*) FROM message_segments").fetchone() == (0,)
        (body,) = conn.execute("SELECT body FROM messages WHERE idx = 1").fetchone()
    assert body == serde.to_json(messages[1])


def _seen_by_another_process(path: Path, seen: list[Sequence[Message]]) -> Any:
    """A tool that loads the session through a store of its own on ``path`` (another
    connection, as another process reads it) at each step, into ``seen``."""

    @tool
    async def look(i: int) -> str:
        """Looks at the stored session."""
        other = await SQLiteStore.open(path)
        try:
            record = await other.load("s")
        finally:
            await other.aclose()
        seen.append(() if record is None else record.messages)
        return f"r{i}"

    return look


def _without_ids(messages: Sequence[Message]) -> list[Message]:
    return [attrs.evolve(m, id="x") if hasattr(m, "id") else m for m in messages]


@pytest.mark.parametrize("steps", [1, 2, 30])
async def test_every_step_reads_the_messages_a_whole_row_store_gives(
    tmp_path: Path, steps: int
) -> None:
    runs = []
    for kind in (SQLiteStore, _WholeStore):
        path = tmp_path / f"{kind.__name__}.db"
        seen: list[Sequence[Message]] = []
        store = await kind.open(path)
        async with Host.open(store=store, log_tap=False) as host:
            agent = _agent(steps, [_seen_by_another_process(path, seen)])
            session = await host.open_session(agent, session_id="s")
            await session.run("go")
            final = session.messages
        await store.aclose()
        runs.append(([_without_ids(s) for s in seen], _without_ids(final)))
        if kind is SQLiteStore and steps > 1:
            # (step 1's tool runs before the turn's first save)
            assert [len(s[1].content) for s in seen[1:]] == list(range(1, steps))
    assert runs[0] == runs[1]


def _snapshot_at(step: int, path: Path, copy: Path) -> Any:
    """A tool ``snap(i)`` that copies the SQLite file ``path`` to ``copy`` at step
    ``step`` (SQLite's backup: one snapshot, what a process killed then leaves)."""

    @tool
    def snap(i: int) -> str:
        """Copies the store at one step."""
        if i == step:
            with sqlite3.connect(path) as source, sqlite3.connect(copy) as target:
                source.backup(target)
        return f"r{i}"

    return snap


async def test_a_process_killed_mid_turn_leaves_the_answer_so_far_and_a_next_turn_goes_on(
    tmp_path: Path,
) -> None:
    """The file as a process killed at step 8 leaves it (a copy taken then, by SQLite's
    backup: one snapshot): the answer is a head and its segments, a new host reads the
    steps saved so far, and its next turn is stored after them."""
    path, crashed = tmp_path / "s.db", tmp_path / "crashed.db"

    snap = _snapshot_at(8, path, crashed)
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(_agent(12, [snap]), session_id="s")
        await session.run("go")
        whole = session.messages
    with sqlite3.connect(crashed) as conn:
        (body,) = conn.execute("SELECT body FROM messages WHERE idx = 1").fetchone()
        segments = conn.execute("SELECT count(*) FROM message_segments").fetchone()[0]
    assert body.startswith(HEAD_PREFIX) and segments >= 2
    store = await SQLiteStore.open(crashed)
    try:
        record = await store.load("s")
        assert record is not None
        answer = record.messages[1]
        assert isinstance(answer, AssistantMessage) and answer.id == whole[1].id
        assert answer.content == whole[1].content[:8]  # the steps saved before step 8's
        assert record.messages[2:] == whole[2:10]
        async with Host.open(store=store, log_tap=False) as host:
            provider = ScriptedProvider([["again"]])
            session = await host.open_session(Agent(provider=provider), session_id="s")
            assert (await session.run("more")).text == "again"
            after = session.messages
        again = await store.load("s")
    finally:
        await store.aclose()
    assert again is not None and again.messages == tuple(after)
    # its writer's Host has closed (this process lives on): its turn, left running in
    # the copy, is settled as a killed process's is (branch markers)
    assert again.messages[1] == attrs.evolve(answer, interrupted=True)
    with sqlite3.connect(crashed) as conn:  # the next turn wrote the killed one's head whole
        (body,) = conn.execute("SELECT body FROM messages WHERE idx = 1").fetchone()
        segments = conn.execute("SELECT count(*) FROM message_segments").fetchone()[0]
    assert not body.startswith(HEAD_PREFIX) and segments == 0


async def test_an_older_reader_refuses_a_head_rather_than_read_an_empty_answer(
    tmp_path: Path,
) -> None:
    """What a process of schema 5 (which has the file open when another upgrades it)
    does with a running turn's head: its load decodes the row alone
    (:func:`decode_message`) and fails loudly, never a message without content."""
    path, copy = tmp_path / "s.db", tmp_path / "mid.db"

    snap = _snapshot_at(3, path, copy)
    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(_agent(5, [snap]), session_id="s")
        await session.run("go")
    with sqlite3.connect(copy) as conn:
        (body,) = conn.execute("SELECT body FROM messages WHERE idx = 1").fetchone()
    assert body.startswith(HEAD_PREFIX)
    with pytest.raises(StoreCorrupt, match="message 1 cannot be read"):
        decode_message(str(copy), "s", 1, "assistant", body)


async def test_a_missing_segment_is_refused_as_damage(tmp_path: Path) -> None:
    path, copy = tmp_path / "s.db", tmp_path / "mid.db"

    @tool
    def snap(i: int) -> str:
        """Copies the store at step 6."""
        if i == 6:
            with sqlite3.connect(path) as source, sqlite3.connect(copy) as target:
                source.backup(target)
        return f"r{i}"

    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(_agent(8, [snap]), session_id="s")
        await session.run("go")
    for which in ("min", "max"):
        damaged = tmp_path / f"{which}.db"
        with sqlite3.connect(copy) as source, sqlite3.connect(damaged) as target:
            source.backup(target)
        with sqlite3.connect(damaged) as conn:
            conn.execute(
                f"DELETE FROM message_segments WHERE first = "
                f"(SELECT {which}(first) FROM message_segments)"
            )
        store = await SQLiteStore.open(damaged)
        try:
            with pytest.raises(StoreCorrupt, match="message 1"):
                await store.load("s")
        finally:
            await store.aclose()


async def test_deleting_a_session_mid_turn_drops_its_segments(tmp_path: Path) -> None:
    path = tmp_path / "s.db"

    @tool
    def step(i: int) -> str:
        """A step."""
        return f"r{i}"

    async with Host.open(store=path, log_tap=False) as host:
        session = await host.open_session(_agent(4, [step]), session_id="s")
        await session.run("go")
        other = await host.open_session(_agent(4, [step]), session_id="t")
        await other.run("go")
    # a running turn's rows, as a killed process leaves them: a head and segments
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO message_segments VALUES ('s', 1, 0, ?)", (b'{"type":"text"}',))
        conn.execute("INSERT INTO message_segments VALUES ('t', 1, 0, ?)", (b'{"type":"text"}',))
    store = await SQLiteStore.open(path)
    try:
        await store.delete("s")
    finally:
        await store.aclose()
    with sqlite3.connect(path) as conn:
        left = conn.execute("SELECT DISTINCT session_id FROM message_segments").fetchall()
    assert left == [("t",)]


@pytest.mark.parametrize("text", ["\udcff", "ok"])
async def test_a_grown_answer_whose_new_part_orjson_refuses_is_stored_as_a_whole_save_stores_it(
    tmp_path: Path, text: str
) -> None:
    """A lone surrogate in a step's new part: the body is the one written anyway (U+FFFD
    in its place, :func:`~actors.stores.validation.encode_rows`), and the grown save
    stores what a whole save does, without failing."""
    calls = [
        ToolCallPart(tool_call_id=f"c{i}", tool_name="t", input={"i": i}, step=i) for i in range(3)
    ]
    user = UserMessage(content="go", id="u")
    results = []
    for kind in (SQLiteStore, _WholeStore):
        store = await kind.open(tmp_path / f"{kind.__name__}.db")
        try:
            version = await store.save(
                "s", 0, [user, AssistantMessage(content=(calls[0],), id="a")]
            )
            answer = AssistantMessage(content=(calls[0], calls[1]), id="a")
            version = await store.save("s", 1, [answer], expected_version=version, **_grown(store))
            odd = AssistantMessage(content=(*answer.content, TextPart(text=text, step=3)), id="a")
            await store.save("s", 1, [odd], expected_version=version, **_grown(store))
            results.append(await store.load("s"))
        finally:
            await store.aclose()
    assert results[0] == results[1]
    assert results[0].messages[1].content[-1].text == ("\ufffd" if text != "ok" else "ok")


def _grown(store: SQLiteStore) -> dict[str, Any]:
    return {} if isinstance(store, _WholeStore) else {"grown": (0,)}


# -- PostgreSQL ------------------------------------------------------------------------


@pytest.fixture
def pg_saves(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of the message bodies and segments each PostgreSQL save writes (its
    one call's rows, or its transaction's rows and segments), a save an entry."""
    from actors.stores import postgres

    saves: list[int] = []
    call, in_transaction, segments = (
        postgres.PostgresStore._save_call,
        postgres.PostgresStore._save_in,
        postgres._write_segments,
    )

    async def counted_call(
        self: Any, action: str, sid: str, start: int, rows: Any, *a: Any, **kw: Any
    ) -> Any:
        written = kw.get("segments") or ()
        saves.append(sum(len(row[3]) for row in rows) + sum(len(s[2]) for s in written))
        return await call(self, action, sid, start, rows, *a, **kw)

    def counted_in(self: Any, conn: Any, sid: str, start: int, rows: Any, *a: Any) -> int:
        saves.append(sum(len(row[3]) for row in rows))
        return in_transaction(self, conn, sid, start, rows, *a)

    def counted_segments(conn: Any, sid: str, fresh: Any, written: Any) -> None:
        saves[-1] += sum(len(s[2]) for s in written)
        segments(conn, sid, fresh, written)

    monkeypatch.setattr(postgres.PostgresStore, "_save_call", counted_call)
    monkeypatch.setattr(postgres.PostgresStore, "_save_in", counted_in)
    monkeypatch.setattr(postgres, "_write_segments", counted_segments)
    return saves


async def test_a_step_saves_bytes_do_not_grow_with_the_turns_steps_on_postgres(
    pg_url: str, pg_saves: list[int]
) -> None:
    from actors.stores.postgres import PostgresStore

    store = await PostgresStore.open(pg_url)
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(_agent(STEPS, [lookup]), session_id="s")
            assert (await session.run("go")).text == "done"
            messages = session.messages
        assert len(pg_saves) == STEPS + 1
        # (written whole from GROWN_FROM_BYTES on too: step 200's ~19 KB, step 20's ~2.5 KB)
        assert pg_saves[STEPS - 1] < 2 * pg_saves[19]
        loaded = await store.load("s")
        assert loaded is not None and loaded.messages == tuple(messages)
        left = await store.run(
            "count",
            lambda conn: conn.execute("SELECT count(*) FROM axon_message_segments").fetchone()[0],
            transaction=False,
        )
        assert left == 0  # the last save wrote the answer whole, its segments dropped
    finally:
        await store.aclose()


def _pg_whole_store() -> Any:
    from actors.stores.postgres import PostgresStore

    class WholePostgresStore(PostgresStore):
        """A save without ``grown``: every answer written whole, as before."""

        grows_rows = False

        async def save(self, *args: Any, **kwargs: Any) -> int:  # type: ignore[override]
            kwargs.pop("grown", None)
            return await super().save(*args, **kwargs)

    return WholePostgresStore


def _pg_reader(url: str, seen: list[Any], segments: list[int]) -> Any:
    """A tool that reads the session through a store of its own (another worker's, a
    front end's): its load, its last turn and its last two turns, at each step."""
    from actors.stores.postgres import PostgresStore

    async def read_once(other: Any) -> Any:
        record = await other.load("s")
        last = await other.load_last_turn("s")
        lasts = await other.load_last_turns("s", 2)
        return (
            None
            if record is None
            else (
                _without_ids(record.messages),
                None if last is None else (last[0], _without_ids(last[1].messages)),
                None if lasts is None else (lasts[0], _without_ids(lasts[1].messages)),
            )
        )

    @tool
    async def look(i: int) -> str:
        """Looks at the stored session: read until two reads agree, as the step's own
        save of its call may still be on its way while the tool runs (the three reads
        of one look then straddled it, about one run in ten under load)."""
        other = await PostgresStore.open(url)
        try:
            before, now = None, await read_once(other)
            while now != before:
                await trio.sleep(0.01)
                before, now = now, await read_once(other)
            segments.append(
                await other.run(
                    "segments",
                    lambda conn: conn.execute(
                        "SELECT count(*) FROM axon_message_segments"
                    ).fetchone()[0],
                    transaction=False,
                )
            )
        finally:
            await other.aclose()
        seen.append(now)
        return f"r{i}"

    return look


async def test_every_step_reads_on_postgres_what_a_whole_row_store_gives(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.stores import postgres

    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)  # heads from the second save
    runs = []
    for kind in (postgres.PostgresStore, _pg_whole_store()):
        seen: list[Any] = []
        segments: list[int] = []
        store = await kind.open(pg_url)
        try:
            async with Host.open(store=store, log_tap=False) as host:
                session = await host.open_session(
                    Agent(
                        provider=ScriptedProvider(
                            [
                                *[
                                    tool_call("look", {"i": i}, tool_call_id=f"c{i}")
                                    for i in range(12)
                                ],
                                ["done"],
                            ]
                        ),
                        tools=[_pg_reader(pg_url, seen, segments)],
                        budget=Budget(max_steps=13),
                    ),
                    session_id="s",
                )
                await session.run("go")
                final = _without_ids(session.messages)
            await store.delete("s")
        finally:
            await store.aclose()
        runs.append((seen, final))
        if kind is postgres.PostgresStore:  # (read as heads and their segments)
            assert segments[-1] == 10
    assert runs[0] == runs[1]
    assert [len(s[0][1].content) for s in runs[0][0][1:]] == list(range(1, 12))


async def test_a_worker_claims_a_session_a_killed_turn_left_in_segments(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows a turn killed at step 8 leaves (taken then, restored after the turn):
    its answer a head and segments. Its reads fold them (load, last turn), and a worker
    that claims the session's next turn, whose claim reads it unfolded (a head there
    fails its decode), reads it itself and appends its turn after it."""
    from actors.stores import postgres
    from actors.stores.turns import TurnQueue
    from runtime.app.worker import Worker
    from tests.support.worker_agent import agent as worker_agent

    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    store = await postgres.PostgresStore.open(pg_url)
    taken: list[Any] = []

    def rows(conn: Any) -> Any:
        return (
            conn.execute("SELECT * FROM axon_sessions WHERE session_id = 's'").fetchall(),
            conn.execute("SELECT * FROM axon_messages WHERE session_id = 's'").fetchall(),
            conn.execute("SELECT * FROM axon_message_segments WHERE session_id = 's'").fetchall(),
        )

    @tool
    async def snap(i: int) -> str:
        """Takes the session's rows at step 8."""
        if i == 8:  # (once step 7's save is written: a step's save is not waited for)
            with trio.fail_after(30):
                while True:
                    record = await store.load("s")
                    if record is not None and len(record.messages[1].content) == 8:
                        break
                    await trio.sleep(0.01)
            taken.append(await store.run("snapshot", rows, transaction=False))
        return f"r{i}"

    def restore(conn: Any) -> None:
        for table, found in zip(
            ("axon_sessions", "axon_messages", "axon_message_segments"), taken[0], strict=True
        ):
            for row in found:
                marks = ", ".join(["%s"] * len(row))
                conn.execute(f"INSERT INTO {table} VALUES ({marks})", row)

    submitter = TurnQueue(store)
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(_agent(12, [snap]), session_id="s")
            await session.run("go")
            whole = session.messages
        await store.delete("s")
        await store.run("restore", restore)
        assert len(taken[0][2]) >= 2  # the answer in segments
        record = await store.load("s")
        assert record is not None and record.messages[2:] == tuple(whole[2:10])
        answer = record.messages[1]
        assert isinstance(answer, AssistantMessage) and answer.content == whole[1].content[:8]
        last = await store.load_last_turn("s")
        assert last is not None and last[1].messages[0] == answer
        turn = await submitter.submit("s", "hello")
        worker = Worker(store=store, agent=worker_agent, owner="w", poll=0.05)
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            done = await submitter.wait_finished(turn.turn_id, 30)
            worker.stop()
        assert done is not None and done.status == "done"
        after = await store.load("s")
        left = await store.run("rows", rows, transaction=False)
    finally:
        await submitter.aclose()
        await store.aclose()
    assert after is not None and after.messages[:10] == record.messages
    assert [m.role for m in after.messages[10:]] == ["user", "assistant"]
    # the next turn's last save wrote the killed turn's head whole, its segments gone
    assert not any(bytes(m[3]).startswith(HEAD_PREFIX) for m in left[1]) and left[2] == []


async def test_a_whole_save_after_a_killed_turns_head_writes_that_head_whole(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn whose last save never came (its answer a head) and a next turn saved
    whole after it: that save folds the head into a whole row before it drops the
    segments (a drop of them all without the fold left the answer unreadable; a drop of
    those no head holds left the head's for good)."""
    from actors.stores import postgres

    monkeypatch.setattr(postgres, "GROWN_FROM_BYTES", 0)
    calls = [
        ToolCallPart(tool_call_id=f"c{i}", tool_name="t", input={"i": i}, step=i) for i in range(3)
    ]
    first = AssistantMessage(content=(calls[0],), id="a")
    grown = AssistantMessage(content=tuple(calls), id="a")
    store = await postgres.PostgresStore.open(pg_url)
    try:
        version = await store.save("s", 0, [UserMessage(content="go", id="u"), first])
        version = await store.save("s", 1, [grown], expected_version=version, grown=(0,))
        later = [UserMessage(content="more", id="u2"), AssistantMessage(content=(), id="b")]
        await store.save("s", 2, later, expected_version=version)
        loaded = await store.load("s")
        segments = await store.run(
            "count",
            lambda conn: conn.execute("SELECT count(*) FROM axon_message_segments").fetchone()[0],
            transaction=False,
        )
    finally:
        await store.aclose()
    assert (
        loaded is not None and loaded.messages[1] == grown and loaded.messages[2:] == tuple(later)
    )
    assert segments == 0
