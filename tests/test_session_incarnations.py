"""A session deleted and re-created under the same id by another process, with nothing
between the two processes but the store (no relay, the CLI's ``delete``): a turn of the
deleted conversation still running in the first process must not write into the new one.

Its next save meets the new session's version (a conflict, as any other writer's save
would give), reloads, and used to take the new conversation for another writer's turns
and append the deleted turn to it. The store records each session's *incarnation* (the
version its first save gave it, above every version a deleted session of that id had):
the reload shows one above the version the turn's save was based on, so the turn's save
is refused as a deleted session's (nothing written; its stream ends ``abort``, "session
deleted"). A turn whose saves had failed, kept in memory for the next turn's save, is
dropped the same way when that turn's reload finds a later incarnation."""

from __future__ import annotations

import contextlib
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio

import runtime.store as store_module
from actors.stores import MemoryStore
from runtime import Host
from runtime.actor_messages import SaveRequest, SaveResult
from runtime.errors import SessionDeleted, StoreError, StoreUnavailable
from runtime.inbox import Inbox
from runtime.messages import UserMessage
from runtime.testing.stores import turn
from tests.test_session_delete import LIMIT, _agent, _Gate
from tests.test_web_http import body
from tests.web.harness import web_server


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """The store both hosts open: one memory store, one SQLite file, or one PostgreSQL
    schema."""
    if request.param == "memory":
        return MemoryStore()
    if request.param == "sqlite":
        return str(tmp_path / "sessions.db")
    return str(request.getfixturevalue("pg_url"))


def _users(record: Any) -> list[Any]:
    return [m.content for m in record.messages if isinstance(m, UserMessage)]


async def test_a_session_re_created_by_another_host_without_a_relay_keeps_the_old_turn_out(
    shared_store: Any,
) -> None:
    # Two embedded hosts on one store, no relay. A runs a turn of "s" (held by its tool);
    # B deletes "s" (B holds nothing of it: only the store's delete) and a new message on
    # B starts it again. A's turn, let go, saves next.
    gate, asked = _Gate(), []
    agent = _agent(gate, asked)
    async with (
        web_server(agent, store=shared_store) as a,
        web_server(agent, store=shared_store) as b,
        httpx.AsyncClient(timeout=LIMIT) as client,
    ):
        await client.post(f"{a.url}/api/chat", json=body("s", "first", message_id="u1"))
        old: list[httpx.Response] = []

        async def old_turn() -> None:
            old.append(
                await client.post(f"{a.url}/api/chat", json=body("s", "hold on", message_id="u2"))
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(old_turn)
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            deleted = await client.delete(
                f"{b.url}/api/sessions/s", headers={"content-type": "application/json"}
            )
            new = await client.post(f"{b.url}/api/chat", json=body("s", "fresh", message_id="u3"))
            gate.opened.set()
        record = await b.host.store.load("s")
        await client.post(f"{a.url}/api/chat", json=body("s", "again", message_id="u4"))
        later = await b.host.store.load("s")
    assert deleted.status_code == 204 and new.status_code == 200
    assert record is not None and _users(record) == ["fresh"]  # before: + "hold on"
    assert [m.id for m in record.messages if isinstance(m, UserMessage)] == ["u3"]
    assert record.meta["title"] == "fresh"  # before: "first", the deleted one's
    assert 'data: {"type":"abort","reason":"session deleted"}' in old[0].text
    # A's next message: a turn of the new conversation, which keeps its title (A still
    # holds the deleted one's, "first", and sent it with the turn: it replaced "fresh")
    assert later is not None and _users(later) == ["fresh", "again"]
    assert later.meta["title"] == "fresh"


def _request(replies: Inbox[SaveResult], name: str, start: int, **kw: Any) -> SaveRequest:
    return SaveRequest(
        request_id=name,
        session_id="s",
        turn_id="old",
        start=start,
        messages=tuple(turn(start)),
        reply=replies,
        **kw,
    )


async def _deleted_and_re_created(store: Any) -> int:
    """Store "s" (the old turn's base), delete it, create it again (another process's
    new message); the base's version."""
    base = await store.save("s", 0, turn(0), expected_version=0)
    await store.delete("s")
    await store.save("s", 0, turn(100), expected_version=0)
    return base


async def test_a_save_based_on_a_deleted_incarnations_version_is_refused() -> None:
    store = MemoryStore()
    replies: Inbox[SaveResult] = Inbox(16, name="replies")
    async with Host.open(store=store, log_tap=False) as host:
        base = await _deleted_and_re_created(store)
        await host.persister.send(_request(replies, "a", 2, expected_version=base))
        with trio.fail_after(5):
            answer = await replies.get()
    assert isinstance(answer.error, SessionDeleted) and answer.version is None
    record = await store.load("s")
    assert record is not None and list(record.messages) == turn(100)


async def test_a_save_queued_after_one_refused_so_is_refused_too() -> None:
    # The turn's next request, made while the first was in flight, names it (``after``):
    # no version of its own to compare, it was rebased onto the new conversation.
    store = MemoryStore()
    replies: Inbox[SaveResult] = Inbox(16, name="replies")
    async with Host.open(store=store, log_tap=False) as host:
        base = await _deleted_and_re_created(store)
        await host.persister.send(_request(replies, "a", 2, expected_version=base))
        await host.persister.send(_request(replies, "b", 4, after="a"))
        with trio.fail_after(5):
            answers = [await replies.get(), await replies.get()]
    assert [type(a.error) for a in answers] == [SessionDeleted, SessionDeleted]
    record = await store.load("s")
    assert record is not None and list(record.messages) == turn(100)


class NoIncarnations(MemoryStore):
    """A store written before incarnations: its records say ``0`` (not recorded)."""

    async def load(self, session_id: str) -> Any:
        record = await super().load(session_id)
        return None if record is None else attrs.evolve(record, incarnation=0)


async def test_a_store_that_records_no_incarnation_has_the_save_rebased_as_before() -> None:
    store = NoIncarnations()
    replies: Inbox[SaveResult] = Inbox(16, name="replies")
    async with Host.open(store=store, log_tap=False) as host:
        base = await _deleted_and_re_created(store)
        await host.persister.send(_request(replies, "a", 2, expected_version=base))
        with trio.fail_after(5):
            answer = await replies.get()
    assert answer.error is None and answer.base == tuple(turn(100))
    record = await store.load("s")
    assert record is not None and list(record.messages) == turn(100) + turn(2)


async def test_a_postgres_store_from_before_incarnations_gains_them_on_open(pg_url: str) -> None:
    from actors.stores.postgres import PostgresStore
    from tests.test_turn_queue import sql

    store = await PostgresStore.open(pg_url)
    old = await store.save("s", 0, turn(0), expected_version=0)
    sql(store, "DROP TRIGGER axon_sessions_incarnation_v1 ON axon_sessions")
    sql(store, "ALTER TABLE axon_sessions DROP COLUMN incarnation")
    await store.aclose()
    store = await PostgresStore.open(pg_url)
    try:
        kept = await store.load("s")
        assert kept is not None and kept.version == old
        assert kept.incarnation == 0  # not recorded: nothing is refused on it
        await store.delete("s")
        again = await store.save("s", 0, turn(1), expected_version=0)
        recreated = await store.load("s")
        assert recreated is not None and recreated.incarnation == again > old
    finally:
        await store.aclose()


class FailingSaves(MemoryStore):
    """A memory store whose saves fail (the database away) while ``failing``."""

    failing = False

    async def save(self, *args: Any, **kwargs: Any) -> int:
        if self.failing:
            raise StoreUnavailable("the store is away (test)")
        return await super().save(*args, **kwargs)


async def test_an_unsaved_turn_of_a_deleted_session_is_not_saved_into_its_re_creation() -> None:
    # A turn's saves failed (kept in memory for the next save); meanwhile another process
    # deleted the session and a new message started it again. The session's next turn
    # here reloaded it and saved the kept turn after the new conversation's.
    gate, asked = _Gate(), []
    store = FailingSaves()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, asked), session_id="s")
        await session.run("first")
        store.failing = True
        with contextlib.suppress(StoreError):
            await session.run("lost")
        store.failing = False
        await store.delete("s")  # another process: its delete, and its new message
        await store.save("s", 0, [UserMessage(content="fresh", id="f")], expected_version=0)
        await session.run("next")
        record = await store.load("s")
    assert record is not None and _users(record) == ["fresh", "next"]  # before: + "lost"


async def test_an_unsaved_turn_of_a_deleted_session_does_not_bring_the_session_back() -> None:
    # As above, but the other process only deletes "s". The next turn here reloaded the
    # session (gone: ``None``) and saved the kept turn with its own: the deleted session
    # came back holding the turn that never reached it.
    gate, asked = _Gate(), []
    store = FailingSaves()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, asked), session_id="s")
        await session.run("first")
        store.failing = True
        with contextlib.suppress(StoreError):
            await session.run("lost")
        store.failing = False
        await store.delete("s")  # another process's delete: nothing here hears of it
        await session.run("next")
        record = await store.load("s")
    assert record is not None and _users(record) == ["next"]  # before: ["lost", "next"]


DELETE = {"content-type": "application/json"}


async def test_a_session_deleted_by_another_host_does_not_keep_its_title_there(
    shared_store: Any,
) -> None:
    # A holds "s" (titled "first" by its first message); B deletes it, no relay. A's next
    # message starts a new conversation, and saved the deleted one's title with it.
    agent = _agent(_Gate(), [])
    async with (
        web_server(agent, store=shared_store) as a,
        web_server(agent, store=shared_store) as b,
        httpx.AsyncClient(timeout=LIMIT) as client,
    ):
        await client.post(f"{a.url}/api/chat", json=body("s", "first", message_id="u1"))
        deleted = await client.delete(f"{b.url}/api/sessions/s", headers=DELETE)
        again = await client.post(f"{a.url}/api/chat", json=body("s", "again", message_id="u2"))
        record = await b.host.store.load("s")
    assert deleted.status_code == 204 and again.status_code == 200
    assert record is not None and _users(record) == ["again"]
    assert "title" not in record.meta  # before: "first", the deleted conversation's


async def test_a_session_re_created_by_another_host_keeps_its_title_when_the_old_host_writes(
    shared_store: Any,
) -> None:
    # As above, and a message on B starts "s" again (titled "fresh") before A's next one.
    agent = _agent(_Gate(), [])
    async with (
        web_server(agent, store=shared_store) as a,
        web_server(agent, store=shared_store) as b,
        httpx.AsyncClient(timeout=LIMIT) as client,
    ):
        await client.post(f"{a.url}/api/chat", json=body("s", "first", message_id="u1"))
        await client.delete(f"{b.url}/api/sessions/s", headers=DELETE)
        await client.post(f"{b.url}/api/chat", json=body("s", "fresh", message_id="u2"))
        more = await client.post(f"{a.url}/api/chat", json=body("s", "more", message_id="u3"))
        later = await client.post(f"{a.url}/api/chat", json=body("s", "later", message_id="u4"))
        record = await b.host.store.load("s")
    assert more.status_code == 200 and later.status_code == 200
    assert record is not None and _users(record) == ["fresh", "more", "later"]
    assert record.meta["title"] == "fresh"  # before: "first", the deleted conversation's


async def test_two_hosts_deleting_one_session_at_once_both_answer_204_and_it_stays_deleted(
    shared_store: Any,
) -> None:
    # A runs a turn of "s" (held by its tool); A and B each get a DELETE of it at once.
    gate = _Gate()
    agent = _agent(gate, [])
    replies: dict[str, httpx.Response] = {}
    async with (
        web_server(agent, store=shared_store) as a,
        web_server(agent, store=shared_store) as b,
        httpx.AsyncClient(timeout=LIMIT) as client,
    ):
        await client.post(f"{a.url}/api/chat", json=body("s", "first", message_id="u1"))

        async def send(name: str, method: str, url: str, **kw: Any) -> None:
            replies[name] = await client.request(method, url, **kw)

        async with trio.open_nursery() as nursery:
            chat = body("s", "hold on", message_id="u2")
            nursery.start_soon(partial(send, "old", "POST", f"{a.url}/api/chat", json=chat))
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            for name, server in (("a", a), ("b", b)):
                url = f"{server.url}/api/sessions/s"
                nursery.start_soon(partial(send, name, "DELETE", url, headers=DELETE))
            with trio.fail_after(LIMIT):
                while len(replies) < 3:  # noqa: ASYNC110 - the three answers
                    await trio.sleep(0.01)
            gate.opened.set()
        gone = await b.host.store.load("s")
        await client.post(f"{b.url}/api/chat", json=body("s", "fresh", message_id="u3"))
        record = await b.host.store.load("s")
    assert (replies["a"].status_code, replies["b"].status_code) == (204, 204)
    assert 'data: {"type":"abort","reason":"session deleted"}' in replies["old"].text
    assert gone is None
    assert record is not None and _users(record) == ["fresh"] and record.meta["title"] == "fresh"


async def _first_turn_meanwhile(
    shared_store: Any, *, delete: bool, recreate: bool = True
) -> tuple[Any, str]:
    """Two hosts on one store, no relay. A's turn of the new session "s" is held in its
    step 0 (nothing of "s" stored yet); B posts "other" (creating "s") and, with
    ``delete``, deletes it and (``recreate``) posts "fresh" (creating it again); A's turn
    is let go. The stored record and A's stream."""
    gate = _Gate()
    agent = _agent(gate, [])
    async with (
        web_server(agent, store=shared_store) as a,
        web_server(agent, store=shared_store) as b,
        httpx.AsyncClient(timeout=LIMIT) as client,
    ):
        old: list[httpx.Response] = []

        async def old_turn() -> None:
            old.append(
                await client.post(f"{a.url}/api/chat", json=body("s", "hold on", message_id="u1"))
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(old_turn)
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            other = await client.post(f"{b.url}/api/chat", json=body("s", "other", message_id="u2"))
            assert other.status_code == 200
            if delete:
                gone = await client.delete(f"{b.url}/api/sessions/s", headers=DELETE)
                assert gone.status_code == 204
            if delete and recreate:
                fresh = await client.post(
                    f"{b.url}/api/chat", json=body("s", "fresh", message_id="u3")
                )
                assert fresh.status_code == 200
            gate.opened.set()
        record = await b.host.store.load("s")
        if delete and recreate:  # A's next message: a turn of the new conversation, after "fresh"
            again = await client.post(f"{a.url}/api/chat", json=body("s", "again"))
            assert again.status_code == 200
            later = await b.host.store.load("s")
            assert later is not None and _users(later) == ["fresh", "again"]
            assert later.meta["title"] == "fresh"  # not A's deleted turn's "hold on"
    return record, old[0].text


async def test_a_first_turn_of_a_session_deleted_and_re_created_meanwhile_stays_out_of_it(
    shared_store: Any,
) -> None:
    # A's first save met B's new "s" and, based on no version, was rebased onto it:
    # stored ['fresh', 'hold on'] titled "hold on", A's stream ending "finish".
    record, stream = await _first_turn_meanwhile(shared_store, delete=True)
    assert record is not None and _users(record) == ["fresh"]
    assert record.meta["title"] == "fresh"
    assert 'data: {"type":"abort","reason":"session deleted"}' in stream


async def test_a_first_turn_of_a_session_created_and_deleted_meanwhile_is_not_saved(
    shared_store: Any,
) -> None:
    # B created "s" and deleted it while A's first turn ran, and nothing started it
    # again: A's first save met no session (no conflict, nothing read) and created it,
    # holding A's turn ("hold on"), its stream ending "finish": the conversation B
    # deleted came back. The delete ends the turn, as on a session A had stored.
    record, stream = await _first_turn_meanwhile(shared_store, delete=True, recreate=False)
    assert record is None
    assert 'data: {"type":"abort","reason":"session deleted"}' in stream


async def test_a_first_turn_of_a_session_another_host_created_meanwhile_is_rebased_onto_it(
    shared_store: Any,
) -> None:
    # No delete: B created "s" once while A's first turn ran, a concurrent creator. A's
    # turn is kept, after B's.
    record, stream = await _first_turn_meanwhile(shared_store, delete=False)
    assert record is not None and _users(record) == ["other", "hold on"]
    assert 'data: {"type":"finish"' in stream and '"abort"' not in stream


async def test_a_new_sessions_turn_reads_the_mark_in_the_query_it_makes_anyway(
    tmp_path: Path,
) -> None:
    # The mark is read with the version query before the turn (one statement, as the
    # version alone was), and checked again by the turn's first save in the statement
    # that reads the version in its transaction (a session created and deleted
    # meanwhile: that save meets no conflict). A turn of a new session takes 7
    # statements (8 when the mark was read once more, apart, before the first save), a
    # stored session's 7, its version query unchanged.
    from actors.providers import ScriptedProvider
    from actors.stores import SQLiteStore
    from runtime import Agent

    store = await SQLiteStore.open(tmp_path / "s.db")
    seen: list[str] = []
    store._conn.set_trace_callback(lambda sql: seen.append(" ".join(sql.split())))
    agent = Agent(provider=ScriptedProvider(responder=lambda request: ["ok"]))
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        seen.clear()
        await session.run("one")
        new, seen[:] = list(seen), []
        await session.run("two")
        stored = list(seen)
    assert (len(new), len(stored)) == (7, 7)
    (both,) = [s for s in new if "version FROM" in s]  # at the turn's start only
    (alone,) = [s for s in stored if "version FROM" in s]
    assert "FROM deletions" in both and "FROM deletions" not in alone
    # (both also read the registry of the file's hosts, in the same statement: twins2)
    assert "'writer:'" in both and "'writer:'" in alone


class NoMarks:
    """A store written before deletion marks: the protocol's methods only (a memory
    store's), no ``deletions``."""

    def __init__(self) -> None:
        self._store = MemoryStore()
        self.load = self._store.load
        self.save = self._store.save
        self.version = self._store.version
        self.list_sessions = self._store.list_sessions
        self.delete = self._store.delete
        self.aclose = self._store.aclose


async def _first_save_meets(store: Any, mark: int) -> SaveResult:
    """A turn's first save (based on no version, ``absent_mark`` ``mark``) meeting "s",
    created (``turn(100)``) since; the persister's answer."""
    replies: Inbox[SaveResult] = Inbox(16, name="replies")
    async with Host.open(store=store, log_tap=False) as host:
        await host.persister.send(_request(replies, "a", 0, expected_version=0, absent_mark=mark))
        with trio.fail_after(5):
            return await replies.get()


@pytest.mark.parametrize(
    ("before", "deleted"),
    [(False, False), (True, False), (False, True)],
    ids=["created", "created-after-an-old-delete", "re-created"],
)
async def test_a_first_save_is_refused_only_when_the_session_was_deleted_since_its_mark(
    before: bool, deleted: bool
) -> None:
    store = MemoryStore()
    if before:  # "s" was deleted before the turn began (and read its mark, 1)
        await store.save("s", 0, turn(0))
        await store.delete("s")
    mark = await store.deletions("s")
    if deleted:
        await store.save("s", 0, turn(0))
        await store.delete("s")  # after the turn read its mark
    await store.save("s", 0, turn(100), expected_version=0)
    answer = await _first_save_meets(store, mark)
    record = await store.load("s")
    assert record is not None
    if deleted:
        assert isinstance(answer.error, SessionDeleted)
        assert list(record.messages) == turn(100)
    else:  # a concurrent creator's: rebased onto it
        assert answer.error is None and list(record.messages) == turn(100) + turn(0)


async def test_a_store_without_deletion_marks_has_the_first_save_rebased_as_before() -> None:
    store = NoMarks()
    await store.save("s", 0, turn(1))
    await store.delete("s")
    await store.save("s", 0, turn(100), expected_version=0)
    answer = await _first_save_meets(store, 0)
    record = await store.load("s")
    assert answer.error is None
    assert record is not None and list(record.messages) == turn(100) + turn(0)


async def test_a_store_without_deletion_marks_runs_turns_of_new_sessions() -> None:
    store = NoMarks()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(_Gate(), []), session_id="s")
        result = await session.run("hello")
    record = await store.load("s")
    assert result.error is None and record is not None and _users(record) == ["hello"]


async def test_a_title_the_host_sets_after_its_turn_was_refused_as_deleted_is_saved() -> None:
    # The refused turn's title ("first") is the deleted conversation's; a title set after
    # it (as a worker's next turn carries its front end's) is the new one's. The stale
    # title was taken from the next turn's meta, so the new title was left out.
    gate, store = _Gate(), MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(gate, []), session_id="s")
        session.set_title("first")
        await session.run("first")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.run, "hold on")
            with trio.fail_after(LIMIT):
                await gate.entered.wait()
            await store.delete("s")  # another process's delete: this host is not told
            gate.opened.set()
        session.set_title("new")
        await session.run("again")
        record = await store.load("s")
    assert record is not None and _users(record) == ["again"]
    assert record.meta["title"] == "new"  # before: no title


async def test_a_title_the_host_sets_after_its_session_was_deleted_while_idle_is_saved() -> None:
    # As above, but the delete comes while the session is idle: the next turn's reload
    # finds it gone. The deleted conversation's title is the one last saved ("first");
    # the title set since ("new", as a worker's turn carries its front end's) is the new
    # conversation's. It was taken from that turn's meta as the stale one and left out.
    store = MemoryStore()
    async with Host.open(store=store, log_tap=False) as host:
        session = await host.open_session(_agent(_Gate(), []), session_id="s")
        session.set_title("first")
        await session.run("first")
        await store.delete("s")  # another process's delete: this host is not told
        session.set_title("new")
        await session.run("again")
        record = await store.load("s")
    assert record is not None and _users(record) == ["again"]
    assert record.meta["title"] == "new"  # before: no title


# -- the marks kept: bounded, and still telling a deletion since a turn began ------------


async def _open(shared_store: Any) -> Any:
    from actors.stores import open_store

    return shared_store if isinstance(shared_store, MemoryStore) else await open_store(shared_store)


def _mark_rows(store: Any) -> int:
    """How many deletion marks ``store`` holds (its rows)."""
    if isinstance(store, MemoryStore):
        return len(store._deletions)
    if hasattr(store, "schema"):  # PostgreSQL
        from tests.test_turn_queue import sql

        return int(sql(store, "SELECT count(*) FROM axon_deletions")[0][0])
    return int(store._conn.execute("SELECT count(*) FROM deletions").fetchone()[0])


async def test_a_store_keeps_the_marks_of_its_last_deletions_only(
    shared_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 12 sessions created and deleted, the marks of 4 kept: before, one row a deleted
    # id for ever (12 here; a process deleting uuid sessions grew the table without end).
    monkeypatch.setattr(store_module, "DELETION_MARKS_KEPT", 4)
    store = await _open(shared_store)
    try:
        for n in range(12):
            await store.save(f"s{n}", 0, turn(n), expected_version=0)
            await store.delete(f"s{n}")
        assert _mark_rows(store) == 4  # before: 12
        marks = [await store.deletions(f"s{n}") for n in range(12)]
    finally:
        await store.aclose()
    assert marks[:8] == [0] * 8  # dropped: as never deleted
    assert 0 < marks[8] < marks[9] < marks[10] < marks[11]


async def test_a_turns_first_save_sees_its_session_deleted_while_fewer_deletions_than_kept_followed(
    shared_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The turn read "s"'s mark; "s" was created and deleted (nothing re-created it), then
    # 3 other sessions were deleted, the marks of 4 kept: the turn's first save is refused.
    monkeypatch.setattr(store_module, "DELETION_MARKS_KEPT", 4)
    store = await _open(shared_store)
    try:
        mark = await store.deletions("s")
        await store.save("s", 0, turn(0))
        await store.delete("s")
        for n in range(3):
            await store.save(f"x{n}", 0, turn(n))
            await store.delete(f"x{n}")
        answer = await _first_save(store, mark)
        record = await store.load("s")
    finally:
        await store.aclose()
    assert isinstance(answer.error, SessionDeleted) and record is None


async def test_a_turns_first_save_is_not_refused_when_its_sessions_old_mark_was_dropped() -> None:
    # "s" was deleted before the turn began (the turn read its mark); the mark was dropped
    # since (later deletions of other sessions), "s" reads 0: not a deletion since, the
    # turn's first save creates "s". Compared for difference, it was refused.
    store = MemoryStore()
    await store.save("s", 0, turn(0))
    await store.delete("s")
    mark = await store.deletions("s")
    kept, store_module.DELETION_MARKS_KEPT = store_module.DELETION_MARKS_KEPT, 1
    try:
        await store.save("x", 0, turn(1))
        await store.delete("x")
    finally:
        store_module.DELETION_MARKS_KEPT = kept
    assert (mark, await store.deletions("s")) == (1, 0)
    answer = await _first_save(store, mark)
    record = await store.load("s")
    assert answer.error is None and record is not None and list(record.messages) == turn(0)


async def _first_save(store: Any, mark: int) -> SaveResult:
    """A turn's first save of "s" (based on no version, ``absent_mark`` ``mark``): the
    persister's answer."""
    replies: Inbox[SaveResult] = Inbox(16, name="replies")
    async with Host.open(store=store, log_tap=False) as host:
        await host.persister.send(_request(replies, "a", 0, expected_version=0, absent_mark=mark))
        with trio.fail_after(5):
            return await replies.get()


# -- PostgreSQL: deletes by processes of before the marks -------------------------------


_BARE_DELETE = "DELETE FROM axon_sessions WHERE session_id = 's'"
"""A process of before the marks deletes so (with its messages, as here)."""
_COUNTED_DELETE = """WITH gone AS (
    DELETE FROM axon_sessions WHERE session_id = 's' RETURNING session_id
) INSERT INTO axon_deletions (session_id, deletions) SELECT session_id, 1 FROM gone
ON CONFLICT (session_id) DO UPDATE SET deletions = axon_deletions.deletions + 1"""
"""A process of the marks' first version deletes so (its own count of the mark)."""


@pytest.mark.parametrize("statement", [_BARE_DELETE, _COUNTED_DELETE], ids=["bare", "counted"])
async def test_a_delete_by_a_postgres_process_of_before_moves_the_mark_up(
    pg_url: str, statement: str
) -> None:
    # During a rolling upgrade a turn of this version read "s"'s mark; a process of before
    # created "s" and deleted it with its own statement, nothing re-created it. The bare
    # delete moved no mark: the turn's first save brought "s" back holding the turn.
    from actors.stores.postgres import PostgresStore
    from tests.test_turn_queue import sql

    store = await PostgresStore.open(pg_url)
    try:
        await store.save("x", 0, turn(5))
        await store.delete("x")  # another id's mark: "s"'s is set above it
        mark = await store.deletions("s")
        await store.save("s", 0, turn(0))
        sql(store, statement)
        sql(store, "DELETE FROM axon_messages WHERE session_id = 's'")
        moved = await store.deletions("s")
        answer = await _first_save(store, mark)
        record = await store.load("s")
    finally:
        await store.aclose()
    assert moved > mark  # before (bare): unmoved, 0
    assert isinstance(answer.error, SessionDeleted) and record is None


# -- the mark checked in the creating save itself ----------------------------------------


async def test_a_first_save_is_refused_when_the_session_was_created_and_deleted_just_before_it(
    shared_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another process creates "s" and deletes it after everything the persister does
    # before the turn's first save (its read of the mark, when it read one) and before
    # the save's write. Read apart from the save, the mark was still the turn's: the
    # save met no session and created "s" holding the turn (the deleted conversation
    # back). Checked inside the save's transaction, the save is refused.
    store = await _open(shared_store)
    other = store if isinstance(store, MemoryStore) else await _open(shared_store)
    real = store.save
    raced: list[bool] = []

    async def save(*args: Any, **kw: Any) -> int:
        if not raced:  # the other process's create+delete, once, just before the write
            raced.append(True)
            await other.save("s", 0, turn(100), expected_version=0)
            await other.delete("s")
        return await real(*args, **kw)

    try:
        mark = await store.deletions("s")
        monkeypatch.setattr(store, "save", save)
        answer = await _first_save(store, mark)
        record = await store.load("s")
    finally:
        await store.aclose()
        if other is not store:
            await other.aclose()
    assert raced and record is None
    assert isinstance(answer.error, SessionDeleted)


class SaveOfBefore(MemoryStore):
    """A store subclass whose ``save`` names its keywords, ``absent_mark`` not among them
    (written before it): it inherits ``checks_absent_mark``."""

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


async def test_a_store_whose_save_takes_no_absent_mark_has_the_mark_read_apart() -> None:
    # Given the keyword its save does not take, a new session's first save failed
    # (TypeError) and the turn with it; the mark is read before the save instead.
    store = SaveOfBefore()
    assert not store_module.checks_absent_mark(store)
    mark = await store.deletions("s")
    await store.save("s", 0, turn(100))
    await store.delete("s")  # since the turn read its mark: still refused
    answer = await _first_save(store, mark)
    assert isinstance(answer.error, SessionDeleted) and await store.load("s") is None


@pytest.mark.parametrize("meta", [None, {"k": "\x00"}], ids=["function", "transaction"])
async def test_a_postgres_save_creating_a_session_deleted_since_its_mark_writes_nothing(
    pg_url: str, meta: Any
) -> None:
    # Both ways a PostgreSQL save goes: its one function call, and its transaction (here
    # for a meta holding an escaped NUL, which the function cannot merge).
    from actors.stores.postgres import PostgresStore

    store = await PostgresStore.open(pg_url)
    try:
        mark = await store.deletions("s")
        await store.save("s", 0, turn(100))
        await store.delete("s")
        with pytest.raises(SessionDeleted):
            await store.save("s", 0, turn(0), meta, expected_version=0, absent_mark=mark)
        assert await store.load("s") is None
        assert await store.save("s", 0, turn(0), meta, expected_version=0, absent_mark=mark + 1)
    finally:
        await store.aclose()
