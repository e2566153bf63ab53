"""What a session's length costs the work that is not about its whole history, counted.

Users keep one session for weeks (thousands of messages): listing sessions must not cost
their length, nor a step's save its turn's earlier messages that it did not change.
Pinned as counts (SQLite's virtual machine steps, PostgreSQL's buffers, what a save
writes), never as timings: the same count for a session of 10 messages and one of 1,000.
"""

from __future__ import annotations

import json
import time
from typing import Any

import attrs
import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.stores import MemoryStore
from actors.stores.postgres import _HAS_USER_MESSAGES_SQL, _LIST_SQL, PostgresStore
from actors.stores.postgres_tables import MESSAGE_ID_FUNCTION
from actors.stores.sqlite import SQLiteStore
from actors.stores.turns import TurnQueue
from actors.turn.turn_state import CONTEXT_TOO_LONG_HINT
from runtime import Agent, Host, serde, tool
from runtime.budget import Budget
from runtime.messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.store import has_user_messages
from tests.support.pg import own_database, pg_connect
from tests.web.harness import web_server

SHORT, LONG = 10, 1000


def history(n: int) -> list[Message]:
    return [
        UserMessage(content=f"q{i}")
        if i % 2 == 0
        else AssistantMessage(content=(TextPart(text=f"a{i}", step=0),))
        for i in range(n)
    ]


async def _listing_steps(store: SQLiteStore) -> int:
    """The SQLite virtual machine steps of one page listing the latest session."""
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    store._conn.set_progress_handler(step, 1)
    try:
        (info,) = await store.list_sessions(limit=1)
    finally:
        store._conn.set_progress_handler(None, 1)
    return steps if info.message_count else -1


async def test_listing_a_long_sqlite_session_costs_what_listing_a_short_one_does(tmp_path):
    """Each listed session's count was ``count(*)`` of its messages: a step per message,
    so a page of 5,000-message sessions stepped through every one of them."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        await store.save("short", 0, history(SHORT))
        short = await _listing_steps(store)
        await store.save("long", 0, history(LONG))
        long = await _listing_steps(store)
        (info,) = await store.list_sessions(limit=1)
    finally:
        await store.aclose()
    assert info.message_count == LONG
    assert long == short  # (was 69 steps -> 3,040)


def _buffers(plan: Any) -> int:
    """The shared buffers an ``EXPLAIN (ANALYZE, BUFFERS)`` plan's top node touched (its
    children's included)."""
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


async def _listing_buffers(store: PostgresStore) -> int:
    def explain(conn: Any) -> Any:
        (plan,) = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _LIST_SQL, (1,)
        ).fetchone()
        return plan if not isinstance(plan, str) else json.loads(plan)

    return _buffers(await store.run("explain", explain, transaction=False))


async def test_listing_a_long_postgres_session_reads_what_listing_a_short_one_does(pg_url):
    """As SQLite's: ``count(*)`` read each listed session's every message index entry
    (and their rows, to check they are visible). The highest index's probe reads one
    page a level of the messages' primary key: 1,000 messages put one level more."""
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("short", 0, history(SHORT))
        await _listing_buffers(store)  # (the catalog's and the plan's first reads)
        short = await _listing_buffers(store)
        await store.save("long", 0, history(LONG))
        await _listing_buffers(store)
        long = await _listing_buffers(store)
        (info,) = await store.list_sessions(limit=1)
    finally:
        await store.aclose()
    assert info.message_count == LONG
    assert long <= short + 1, (short, long)  # (+1: the index one level deeper; was 3 -> 25)


async def _lookup_buffers(store: PostgresStore, session_id: str) -> int:
    def explain(conn: Any) -> Any:
        (plan,) = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + _HAS_USER_MESSAGES_SQL,
            {"session": session_id, "ids": ["msg_new", "msg_other"]},
        ).fetchone()
        return plan if not isinstance(plan, str) else json.loads(plan)

    return _buffers(await store.run("explain", explain, transaction=False))


async def test_asking_whether_a_long_postgres_session_has_a_message_id_reads_what_a_short_one_does(
    pg_url,
):
    """Whether a user message was sent before (A2A's send) read the whole session: the
    index of the user messages' ids answers it, as many pages for 1,000 messages as for
    10 (the index one level deeper at most; the query names the index's predicate)."""
    store = await PostgresStore.open(pg_url)
    try:
        await store.save("short", 0, history(SHORT))
        await store.save("long", 0, history(LONG))
        await _lookup_buffers(store, "short")  # (the catalog's and the plan's first reads)
        short = await _lookup_buffers(store, "short")
        long = await _lookup_buffers(store, "long")
        ids = [m.id for m in history(1)]
        found = await store.has_user_messages("long", {"msg_new", *ids})
    finally:
        await store.aclose()
    assert found == frozenset()  # (history's ids are new each call)
    assert long <= short + 1, (short, long)


async def _lookup_steps(store: SQLiteStore, session_id: str, ids: list[str]) -> int:
    """The SQLite virtual machine steps of asking which of ``ids`` the session's user
    messages have (:func:`runtime.store.has_user_messages`, as a front end asks)."""
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    store._conn.set_progress_handler(step, 1)
    try:
        await has_user_messages(store, session_id, ids)
    finally:
        store._conn.set_progress_handler(None, 1)
    return steps


async def test_asking_whether_a_long_sqlite_session_has_a_message_id_costs_what_a_short_one_does(
    tmp_path,
):
    """As PostgreSQL's: the SQLite store read the whole session (every row's body, then
    decoded) to answer it; the index of the user messages' ids (schema 5) answers it
    in the same steps for 1,000 messages as for 10."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        short_history, long_history = history(SHORT), history(LONG)
        await store.save("short", 0, short_history)
        await store.save("long", 0, long_history)
        asked = ["msg_new", long_history[-2].id]
        short = await _lookup_steps(store, "short", asked)
        long = await _lookup_steps(store, "long", asked)
        found = await has_user_messages(store, "long", asked)
    finally:
        await store.aclose()
    assert found == {long_history[-2].id}
    assert long <= short + 10, (short, long)  # (the index a level deeper at most)


async def _save_a_tool_turn(url: str) -> None:
    store = await PostgresStore.open(url)
    try:
        call = ToolCallPart(tool_call_id="c1", tool_name="read", input={}, step=0)
        await store.save(
            "s",
            0,
            [
                UserMessage(content="read it", id="u1"),
                AssistantMessage(content=(call,), id="a1"),
                ToolMessage(tool_call_id="c1", tool_name="read", step=0, output="x" * 100_000),
                AssistantMessage(content=(TextPart(text="done", step=1),), id="a2"),
            ],
        )
    finally:
        await store.aclose()


def test_a_postgres_save_parses_the_json_of_its_user_messages_only() -> None:
    """The index of message ids runs its function (a parse of the message's JSON) for
    each row a save writes that the index holds: one per user message, none for the
    assistant's and the tool's (a 100 KB tool output parsed each save cost the server
    ~1.5 ms, issue 24's budget 2 ms a turn). Counted by PostgreSQL (``track_functions``,
    flushed as the store's connections end) in a database of the test's own."""
    with own_database("UTF8") as url:
        database = url.rsplit("/", 1)[1].split("?")[0]
        with pg_connect() as conn:
            conn.execute(f"ALTER DATABASE {database} SET track_functions = 'all'")
        trio.run(_save_a_tool_turn, url)
        import psycopg

        with psycopg.connect(url.split("?")[0], autocommit=True) as conn:
            for _ in range(1000):  # the store's sessions flush their counts as they end
                (others,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND backend_type = 'client backend'"
                ).fetchone()
                if not others:
                    break
                time.sleep(0.01)
            conn.execute("SELECT pg_stat_clear_snapshot()")
            calls = conn.execute(
                "SELECT calls FROM pg_stat_user_functions WHERE funcname = %s",
                (MESSAGE_ID_FUNCTION,),
            ).fetchall()
    assert others == 0
    assert calls == [(1,)]


class SavesSeen(MemoryStore):
    """A memory store that notes each save's start and the roles of what it writes."""

    def __init__(self) -> None:
        super().__init__()
        self.saves: list[tuple[int, str]] = []

    async def save(self, session_id: str, start: int, messages: Any, *args: Any, **kw: Any) -> int:
        self.saves.append((start, "".join(m.role[0] for m in messages)))
        return await super().save(session_id, start, messages, *args, **kw)


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return key


async def test_a_step_s_save_does_not_write_the_turn_s_user_message_again():
    """Each step's save sends its whole turn (rebased whole if another writer saved
    meanwhile); written whole, the user's message went to the store again at every step,
    a 10 MB attachment 10 MB a step. The assistant message after it changes every step,
    so every later save starts there."""
    steps = [[*tool_call("lookup", {"key": "a"}, tool_call_id="A")], ["done"]]
    store = SavesSeen()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[lookup]), session_id="s"
        )
        await session.run("hi")
        await session.run("again")
        record = await store.load("s")
    assert store.saves == [(0, "uat"), (1, "at"), (3, "uat"), (4, "at")]
    assert record is not None and [m.role[0] for m in record.messages] == list("uatuat")


STEPS, RESULT = 12, 20_000


def _page_text(n: int) -> str:
    return "".join(f"{n % 10}:{i:07d} " for i in range(RESULT // 10))


@tool
def page(n: int) -> str:
    """A page of a long output: ``RESULT`` characters, distinct per page."""
    return _page_text(n)


def _paging_steps() -> list[Any]:
    """``STEPS`` steps that each call ``page`` (one ``RESULT``-character result a step),
    then the answer."""
    return [[*tool_call("page", {"n": n}, tool_call_id=f"P{n}")] for n in range(STEPS)] + [["done"]]


def _count_written(store: SQLiteStore) -> list[int]:
    """The bytes of message bodies each save of ``store`` writes (its rows' inserts and
    rewrites), one entry a save."""
    written: list[int] = []
    save_rows = store._save_rows

    def counted(session_id: str, start: int, rows: Any, *args: Any) -> Any:
        written.append(sum(len(row[3]) for row in rows.rows()))
        return save_rows(session_id, start, rows, *args)

    store._save_rows = counted  # type: ignore[method-assign]
    return written


class RewritingStore(SQLiteStore):
    """A SQLite store whose ``save`` does not take ``kept``: a store of before them."""

    async def save(  # type: ignore[override]
        self,
        session_id: str,
        start: int,
        messages: Any,
        meta: Any = None,
        *,
        expected_version: int | None = None,
    ) -> int:
        return await super().save(
            session_id, start, messages, meta, expected_version=expected_version
        )


async def _paging_turn(
    store: Any, written: list[int] | None = None
) -> tuple[list[int], list[bytes]]:
    """The bytes each save of a ``STEPS``-step turn writes (counted by the SQLite
    store's transaction, or by the caller into ``written``), and the stored turn (each
    message's serde JSON, its random id left out)."""
    if written is None:
        written = _count_written(store)
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(
                Agent(
                    provider=ScriptedProvider(_paging_steps()),
                    tools=[page],
                    budget=Budget(max_steps=STEPS + 1),
                ),
                session_id="s",
            )
            await session.run("read it all")
        record = await store.load("s")
    finally:
        await store.aclose()
    assert record is not None
    assert [m.role[0] for m in record.messages] == ["u", "a", *"t" * STEPS]
    return written, [serde.to_json(attrs.evolve(m, id="-")) for m in record.messages]


async def test_a_step_s_save_writes_that_step_s_messages_not_the_turn_s_tool_results_again(
    tmp_path,
):
    """Within a turn the assistant message (every step's parts) comes before the tool
    results, and it changes every step: a save from it rewrote every tool result of the
    turn at every step, quadratic in the turn's steps (30 steps of 100 KB results wrote
    ~45 MB). Now a step's save writes the assistant message's row over and its own new
    results: the turn writes each result once. The stored turn is what it was."""
    written, stored = await _paging_turn(await SQLiteStore.open(tmp_path / "s.db"))
    before, stored_before = await _paging_turn(await RewritingStore.open(tmp_path / "r.db"))
    assert stored == stored_before
    results = sum(len(body) for body in stored[2:])
    assert len(written) == len(before) == STEPS + 1  # a save a step
    # Each result once, and the assistant message (a few hundred bytes) each step; a
    # store that cannot keep rows still writes sum(k * RESULT for k in 1..STEPS).
    assert sum(written) < results * 1.2, (sum(written), results)
    assert sum(before) > results * STEPS / 2, (sum(before), results)


async def _turn_statements(store: SQLiteStore, steps: list[Any]) -> list[str]:
    """The statements SQLite runs for a turn of ``steps`` (each statement's first words)."""
    seen: list[str] = []
    store._conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())[:24]))
    try:
        async with Host.open(store=store, log_tap=False) as host:
            session = await host.open_session(
                Agent(provider=ScriptedProvider(steps), tools=[lookup]), session_id="s"
            )
            await session.run("hi")
    finally:
        store._conn.set_trace_callback(None)
        await store.aclose()
    return seen


async def test_a_turn_s_saves_run_no_more_statements_than_they_did(tmp_path):
    """Kept rows cost a turn no statement: a one-step turn's save runs what it ran, and
    a step's save after the first writes its assistant message over its row where the
    save from it wrote each of the turn's rows again."""
    one = [["done"]]
    two = [[*tool_call("lookup", {"key": "a"}, tool_call_id="A")], ["done"]]
    for steps in (one, two):
        now = await _turn_statements(await SQLiteStore.open(tmp_path / "a.db"), steps)
        before = await _turn_statements(await RewritingStore.open(tmp_path / "b.db"), steps)
        assert len(now) <= len(before), (now, before)
        (tmp_path / "a.db").unlink()
        (tmp_path / "b.db").unlink()
    assert now.count("UPDATE messages SET role") == 1  # the assistant message, over its row
    # saved from the first message not kept, the result went over its row too
    assert before.count("UPDATE messages SET role") == 2
    assert before.count("INSERT INTO messages (se") == now.count("INSERT INTO messages (se")
    assert "DELETE FROM messages WHE" not in now


async def test_a_step_s_save_sends_postgres_that_step_s_messages_alone(pg_url, monkeypatch):
    """The PostgreSQL store as the SQLite one: each step's save sends the assistant
    message's row and the step's new result (its save function writes rows below its
    start over their places), never the turn's earlier results again."""
    import actors.stores.postgres as postgres

    written: list[int] = []
    encoded = postgres.encoded_off_loop

    async def counted(*args: Any) -> Any:
        new, rows = await encoded(*args)
        written.append(sum(len(row[3]) for row in rows))
        return new, rows

    monkeypatch.setattr(postgres, "encoded_off_loop", counted)
    written, stored = await _paging_turn(await PostgresStore.open(pg_url), written)
    results = sum(len(body) for body in stored[2:])
    assert len(written) == STEPS + 1
    assert sum(written) < results * 1.2, (sum(written), results)


async def test_asking_whether_a_session_is_busy_reads_none_of_its_messages(tmp_path):
    """The page asks every second while a turn it has no stream of runs; the whole
    session answered (a store load, every message twice in JSON) was ~1.5 MB a second
    for a 5,000-message session."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    await store.save("long", 0, history(LONG))
    loads: list[str] = []
    load = store.load

    async def counted(session_id: str) -> Any:
        loads.append(session_id)
        return await load(session_id)

    store.load = counted  # type: ignore[method-assign]
    agent = Agent(provider=ScriptedProvider(steps=[["x"]]))
    async with web_server(agent, store=store) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            busy = await client.get("/api/sessions/long?only=busy")
            never = await client.get("/api/sessions/never?only=busy")
    assert busy.json() == {"session_id": "long", "busy": False}
    assert never.status_code == 404
    assert loads == []


async def test_a_front_end_says_a_queued_first_turn_s_session_is_busy_reading_no_message(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker deployment's front end, as the embedded app: busy from the turn queue
    (a first turn not stored yet too), no message read."""
    from tests.support.redis import require_redis
    from tests.test_frontend import body, deployment, slow_agent, wait_for_turn

    loads: list[str] = []
    load = PostgresStore.load

    async def counted(self: PostgresStore, session_id: str) -> Any:
        loads.append(session_id)
        return await load(self, session_id)

    async with deployment(pg_url, require_redis(), slow_agent(), worker=False) as d:
        async with httpx.AsyncClient(base_url=d.urls[0]) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: client.post("/api/chat", json=body("s1")))
                await wait_for_turn(d.queue, "s1", "queued")
                monkeypatch.setattr(PostgresStore, "load", counted)
                busy = await client.get("/api/sessions/s1?only=busy")
                never = await client.get("/api/sessions/never?only=busy")
                nursery.cancel_scope.cancel()
    assert busy.json() == {"session_id": "s1", "busy": True}
    assert never.status_code == 404
    assert loads == []


async def _session_views(client: httpx.AsyncClient, session_id: str) -> tuple[Any, Any]:
    """The session as API clients ask (``messages`` too) and as the page asks (``?view=ui``)."""
    whole = await client.get(f"/api/sessions/{session_id}")
    ui = await client.get(f"/api/sessions/{session_id}?view=ui")
    assert whole.status_code == ui.status_code == 200
    return whole, ui


def _check_ui_view_halves_the_answer(whole: httpx.Response, ui: httpx.Response) -> None:
    """``?view=ui`` drops ``messages`` alone: the rest as before, about half the bytes."""
    whole_body, ui_body = whole.json(), ui.json()
    assert list(whole_body) == [
        *("session_id", "title", "busy", "waiting", "meta", "messages", "ui_messages")
    ]
    assert len(whole_body["messages"]) == LONG
    assert ui_body == {k: v for k, v in whole_body.items() if k != "messages"}
    assert len(ui.content) * 10 < len(whole.content) * 6  # was the same bytes (~1.9x half)


async def test_the_page_s_view_of_a_long_session_sends_its_history_once(tmp_path):
    """The page opens a session asking ``?view=ui``: it reads only ``ui_messages``, and
    the stored form alongside was ~1.9x the bytes of a long history. Without the option
    the answer is as before, for API clients reading ``messages``."""
    store = await SQLiteStore.open(tmp_path / "s.db")
    await store.save("long", 0, history(LONG), {"title": "kept"})
    async with web_server(Agent(provider=ScriptedProvider(steps=[["x"]])), store=store) as server:
        async with httpx.AsyncClient(base_url=server.url) as client:
            whole, ui = await _session_views(client, "long")
            unknown = await client.get("/api/sessions/long?view=everything")
    _check_ui_view_halves_the_answer(whole, ui)
    assert unknown.status_code == 400


async def test_a_front_end_s_ui_view_of_a_long_session_sends_its_history_once(
    pg_url: str,
) -> None:
    """The worker deployment's front end, as the embedded app."""
    from tests.support.redis import require_redis
    from tests.test_frontend import deployment, slow_agent

    async with deployment(pg_url, require_redis(), slow_agent(), worker=False) as d:
        await d.store.save("long", 0, history(LONG), {"title": "kept"})
        async with httpx.AsyncClient(base_url=d.urls[0]) as client:
            whole, ui = await _session_views(client, "long")
            unknown = await client.get("/api/sessions/long?view=everything")
    _check_ui_view_halves_the_answer(whole, ui)
    assert unknown.status_code == 400


async def test_a_front_end_queues_a_turn_of_a_long_session_reading_none_of_its_messages(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It asks whether the session has a title yet (the first input names it): that
    loaded the whole session, every turn (1.4 MB for a 5,000-message one)."""
    from runtime.app.web.frontend import FrontEnd

    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("long", 0, history(LONG), {"title": "kept"})
        await store.save("new", 0, history(SHORT))
        loads: list[str] = []
        load = PostgresStore.load

        async def counted(self: PostgresStore, session_id: str) -> Any:
            loads.append(session_id)
            return await load(self, session_id)

        monkeypatch.setattr(PostgresStore, "load", counted)
        front = FrontEnd(store=store, queue=queue, relay=None)
        await front.submit("long", "next question", "k1", False)
        await front.submit("new", "a first question", "k2", False)
        metas = [(await queue.turns(s))[0].meta.get("title") for s in ("long", "new")]
    finally:
        await queue.aclose()
        await store.aclose()
    assert loads == []
    assert metas == [None, "a first question"]


async def _settled(
    store: PostgresStore, queue: TurnQueue, session_id: str, n: int, *, whole: bool = False
) -> tuple[Any, Any, int]:
    """A turn of a session of ``n`` messages, stored (user, assistant with a call, its
    result) and settled by a front end's :class:`QueuedTurnOutput` (``whole``: as
    AG-UI's, whose snapshot reads the history): ``(the output, the turn's result from
    the whole history, the message rows the settle read)``."""
    from types import SimpleNamespace

    from runtime import output as o
    from runtime.app.web.queued_turn import QueuedTurnOutput, turn_result
    from runtime.chunks import Usage
    from runtime.messages import ToolCallPart, ToolMessage

    await store.save(session_id, 0, history(n))
    turn = await queue.submit(session_id, "next question")
    call = ToolCallPart(tool_call_id="c1", tool_name="t", input={}, step=0)
    done = TextPart(text="done", step=1)
    await store.save(
        session_id,
        n,
        [
            UserMessage(content="next question"),
            AssistantMessage(content=(call, done), id=turn.message_id),
            ToolMessage(tool_call_id="c1", tool_name="t", step=0, output="ok"),
        ],
    )
    rows: list[int] = []
    record_off_loop = PostgresStore.record_off_loop

    async def counted(self: PostgresStore, sid: str, joined: list[Any], first: int = 0) -> Any:
        rows.append(sum(1 for r in joined if r[2] is not None))
        return await record_off_loop(self, sid, joined, first)

    out = QueuedTurnOutput(SimpleNamespace(store=store, queue=queue), turn, history=whole)
    out.last = o.Finish(finish_reason="stop", usage=Usage())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PostgresStore, "record_off_loop", counted)
        await out.settle()
    stored = await store.load(session_id)
    assert stored is not None
    expected = turn_result(turn.turn_id, turn.message_id, stored.messages, out.status, out.last)
    return out, _fields(expected), sum(rows)


def _fields(result: Any) -> tuple[Any, ...]:
    """A :class:`~runtime.output.TurnResult`'s fields (its equality is identity)."""
    import attrs

    return attrs.astuple(result, recurse=False)


async def test_a_front_end_settles_a_turn_of_a_long_session_reading_the_turn_alone(
    pg_url: str,
) -> None:
    """The OpenAI, A2A and MCP answers of a worker deployment read how the turn ended:
    that loaded the whole session (a 5,000-message one 1.5 MB a turn). Now the rows read
    are the turn's (its assistant message and tool result), however long the session;
    the result is the one the whole history gives."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        short, short_expected, short_rows = await _settled(store, queue, "short", SHORT)
        long, long_expected, long_rows = await _settled(store, queue, "long", LONG)
    finally:
        await queue.aclose()
        await store.aclose()
    assert short_rows == long_rows == 2
    assert (_fields(short.result), _fields(long.result)) == (short_expected, long_expected)
    assert long.result.finish_reason == "stop" and len(long.result.tool_messages) == 1
    assert (long.session.first, len(long.session.messages)) == (LONG + 1, 2)


async def test_an_ag_ui_front_end_still_reads_the_whole_session_for_its_snapshot(
    pg_url: str,
) -> None:
    """AG-UI's closing ``MESSAGES_SNAPSHOT`` is the whole thread: its settle reads it."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        out, expected, rows = await _settled(store, queue, "s", SHORT, whole=True)
    finally:
        await queue.aclose()
        await store.aclose()
    assert rows == SHORT + 3 and len(out.session.messages) == SHORT + 3
    assert out.session.first == 0 and _fields(out.result) == expected


_TOO_LONG = {
    # OpenAI's words for it: the code says it, the message says it differently
    "openai": (
        b'{"error": {"message": "This model\'s maximum context length is 128000 tokens.", '
        b'"type": "invalid_request_error", "code": "context_length_exceeded"}}'
    ),
    "anthropic": (
        b'{"type": "error", "error": {"type": "invalid_request_error", '
        b'"message": "prompt is too long: 210000 tokens > 200000 maximum"}}'
    ),
}


@pytest.mark.parametrize("kind", sorted(_TOO_LONG))
async def test_a_turn_past_the_context_window_ends_context_too_long_its_input_stored(
    kind: str, tmp_path: Any
) -> None:
    """What a user of a session that outgrew the model sees, through the real SDK
    client: the typed error (asked once: retrying cannot shrink the request) and the
    message they typed kept in the store, for when the session is compacted or cut; and
    what to do about it, since every later turn of the session is refused too."""
    from tests.support.faults import rig
    from tests.support.loopback import Reply

    reply = Reply(status=400, body=_TOO_LONG[kind], content_type="application/json")
    store = await SQLiteStore.open(tmp_path / "s.db")
    async with rig(kind, reply, store=store) as r:
        result = await r.session.run("the question that no longer fits")
        requests = len(r.server.requests)
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        record = await store.load("s")
    finally:
        await store.aclose()
    assert result.error is not None and result.finish_reason == "error"
    assert (result.error.kind, result.error.retryable, requests) == ("ContextTooLong", False, 1)
    assert result.error.message.endswith(f"({CONTEXT_TOO_LONG_HINT})")
    assert record is not None
    assert record.messages[0].content == "the question that no longer fits"
    assert record.messages[-1].error == result.error


async def _settle_counted(store: PostgresStore, out: Any) -> int:
    """:meth:`QueuedTurnOutput.settle` of ``out``: the message rows it read."""
    rows: list[int] = []
    record_off_loop = PostgresStore.record_off_loop

    async def counted(self: PostgresStore, sid: str, joined: list[Any], first: int = 0) -> Any:
        rows.append(sum(1 for r in joined if r[2] is not None))
        return await record_off_loop(self, sid, joined, first)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PostgresStore, "record_off_loop", counted)
        await out.settle()
    return sum(rows)


async def _settled_steered(
    store: PostgresStore, queue: TurnQueue, session_id: str, n: int
) -> tuple[Any, Any, int]:
    """A steered turn of a session of ``n`` messages, stored as a worker stores it (the
    user's message, the turn's assistant message with a call, its result, the message
    steered in at step 1, the assistant message its steps go on in, ``<id>-s1``) and
    settled by a front end: ``(the output, the result from the whole history, rows)``."""
    from types import SimpleNamespace

    from actors.turn.takeover import steered_message_id
    from runtime import output as o
    from runtime.app.web.queued_turn import QueuedTurnOutput, turn_result
    from runtime.chunks import Usage
    from runtime.messages import ToolCallPart, ToolMessage

    await store.save(session_id, 0, history(n))
    turn = await queue.submit(session_id, "next question")
    call = ToolCallPart(tool_call_id="c1", tool_name="t", input={}, step=0)
    await store.save(
        session_id,
        n,
        [
            UserMessage(content="next question"),
            AssistantMessage(content=(call,), id=turn.message_id),
            ToolMessage(tool_call_id="c1", tool_name="t", step=0, output="ok"),
            UserMessage(content="and also this"),
            AssistantMessage(
                content=(TextPart(text="both done", step=1),),
                id=steered_message_id(turn.message_id, 1),
            ),
        ],
    )
    out = QueuedTurnOutput(SimpleNamespace(store=store, queue=queue), turn)
    out.last = o.Finish(finish_reason="stop", usage=Usage())
    rows = await _settle_counted(store, out)
    stored = await store.load(session_id)
    assert stored is not None
    expected = turn_result(turn.turn_id, turn.message_id, stored.messages, out.status, out.last)
    return out, _fields(expected), rows


async def test_a_front_end_settles_a_steered_turn_of_a_long_session_reading_the_turn_alone(
    pg_url: str,
) -> None:
    """A turn a message was steered into ends in another assistant message (``<id>-s1``)
    than its first: its settle loaded the whole session (a 5,000-message one 1.5 MB).
    Now it reads the last turn, then the last two: the same rows at any length."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        short, short_expected, short_rows = await _settled_steered(store, queue, "ss", SHORT)
        long, long_expected, long_rows = await _settled_steered(store, queue, "sl", LONG)
    finally:
        await queue.aclose()
        await store.aclose()
    assert short_rows == long_rows == 1 + 4
    assert (_fields(short.result), _fields(long.result)) == (short_expected, long_expected)
    assert long.result.message.id == long.turn.message_id
    assert len(long.result.tool_messages) == 1
    assert (long.session.first, len(long.session.messages)) == (LONG + 1, 4)


async def test_a_front_end_settles_a_turn_cancelled_while_queued_reading_no_message(
    pg_url: str,
) -> None:
    """A turn that ended without storing anything (cancelled while queued, its row not
    ``saved``) has nothing to read: its settle read the last turn, then, not finding
    its message there, the whole session."""
    from types import SimpleNamespace

    from runtime.app.web.queued_turn import QueuedTurnOutput

    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("c", 0, history(LONG))
        turn = await queue.submit("c", "never mind")
        await queue.request_cancel(turn.turn_id, "stopped")
        out = QueuedTurnOutput(SimpleNamespace(store=store, queue=queue), turn)
        rows = await _settle_counted(store, out)
    finally:
        await queue.aclose()
        await store.aclose()
    assert rows == 0
    assert out.status is not None and out.status.status == "cancelled"
    assert out.result is not None and out.result.finish_reason == "aborted"
    assert out.result.message.content == () and out.result.tool_messages == ()


def test_the_front_end_tells_a_steered_message_id_as_the_turn_s_own() -> None:
    """The front end's copy of the steered id's form (it cannot import the turn actor's)."""
    from actors.turn.takeover import steered_message_id
    from runtime.app.web.queued_turn import of_turn

    assert of_turn(steered_message_id("msg_t", 3), "msg_t")
    assert of_turn("msg_t", "msg_t")
    assert not of_turn("msg_t2", "msg_t") and not of_turn("msg_t-sx", "msg_t")
