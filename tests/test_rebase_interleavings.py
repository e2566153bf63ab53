"""Random interleavings of two and three writers on one session (branch rebaseprop).

Each writer is a turn runner's history (:class:`~runtime.actor_messages.SessionState`)
kept in step with the store by the real :func:`~actors.turn.session_sync.adopt_save` and
:func:`~actors.turn.session_sync.adopt_record`, its saves made as
:meth:`actors.turn.saving.Saving._save` makes them (from ``min(turn start, saved_upto)``,
based on the version, or after the request still in flight) and written as
:meth:`actors.persister.Persister._write` writes them: in place on the version it was
based on, else through the real :func:`~runtime.store.rebase`. Writers append a message
and run a turn of steps (tool calls and their results, saved at each step's end), steer
a message in between steps, regenerate or edit (the same message id) their last message,
and retry a step (its parts dropped before its save); a save is written whenever the
interleaving says, so several of a writer's may be in flight. The store is a versioned
list, or (the second test) one SQLite file through a connection per writer.

After every step: the stored history is one a provider accepts (a user message first,
each user message answered once, every tool call followed by exactly its result, ids
unique); no message of a save a writer was told was written is gone, unless a writer
that held it cut it (a regenerate); and a turn whose final save was refused was told so
(its error), never told saved.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actors.stores import SQLiteStore
from actors.turn.session_sync import adopt_record, adopt_save
from runtime.actor_messages import SaveRequest, SaveResult, SessionState
from runtime.errors import AnsweredElsewhere, StoreConflict, StoreError
from runtime.messages import (
    AssistantMessage,
    Message,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.store import SessionRecord, rebase

SID = "s"
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None
"""Where the SQLite files go: a file system in memory where there is one (every save
syncs the file; on a disk that was most of the test's time)."""


def replay_problems(messages: Sequence[Message]) -> list[str]:
    """What makes ``messages`` a history a provider refuses, or not the session's own."""
    problems = []
    if len({m.id for m in messages}) != len(messages):
        problems.append("an id names two messages")
    if messages and not isinstance(messages[0], UserMessage):
        problems.append(f"it starts with a {messages[0].role} message")
    answers: dict[str, int] = {}
    last_user: str | None = None
    i = 0
    while i < len(messages):
        message = messages[i]
        if isinstance(message, UserMessage):
            last_user = message.id
            i += 1
            continue
        if not isinstance(message, AssistantMessage):
            problems.append(f"message {i} ({message.role}) follows no assistant's call")
            i += 1
            continue
        if last_user is not None:
            answers[last_user] = answers.get(last_user, 0) + 1
        calls = [p.tool_call_id for p in message.content if isinstance(p, ToolCallPart)]
        results = []
        i += 1
        while i < len(messages) and isinstance(messages[i], ToolMessage):
            results.append(messages[i].tool_call_id)  # type: ignore[union-attr]
            i += 1
        if results != calls:
            problems.append(f"calls {calls} answered by {results}")
    problems += [f"user message {u} answered {n} times" for u, n in answers.items() if n > 1]
    return problems


# -- the stores -----------------------------------------------------------------------


class ListStore:
    """One session as a versioned list: what every store keeps (the version rule)."""

    def __init__(self, writers: int) -> None:
        self.messages: list[Message] = []
        self.version = 0

    def load(self, writer: int) -> SessionRecord | None:
        if not self.version:
            return None
        return SessionRecord(session_id=SID, messages=tuple(self.messages), version=self.version)

    def save(self, writer: int, start: int, messages: Sequence[Message], expected: int) -> int:
        if expected != self.version:
            raise StoreConflict("moved", session_id=SID, expected=expected, actual=self.version)
        assert start <= len(self.messages), "a save past the session's end"
        self.messages[start:] = messages
        self.version += 1
        return self.version

    def close(self) -> None:
        pass


class SQLiteFile:
    """One SQLite file, a connection (a :class:`SQLiteStore`) per writer."""

    def __init__(self, writers: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="rebaseprop-", dir=SCRATCH)
        path = str(Path(self.dir) / "shared.db")
        self.stores = [trio.run(SQLiteStore.open, path) for _ in range(writers)]

    def load(self, writer: int) -> SessionRecord | None:
        return trio.run(self.stores[writer].load, SID)

    def save(self, writer: int, start: int, messages: Sequence[Message], expected: int) -> int:
        async def main() -> int:
            return await self.stores[writer].save(
                SID, start, messages, {}, expected_version=expected
            )

        return trio.run(main)

    def close(self) -> None:
        for store in self.stores:
            trio.run(store.aclose)
        shutil.rmtree(self.dir, ignore_errors=True)


# -- a writer: a turn runner's history and its persister ----------------------------------


@attrs.define
class Turn:
    turn_id: str
    start_index: int
    a_index: int
    message_id: str
    step: int = 0


@attrs.define(repr=False)
class Writer:
    n: int
    state: SessionState
    forgets_unsaved: bool
    turn: Turn | None = None
    queue: list[SaveRequest] = attrs.field(factory=list)
    """Its requests the persister has not written yet, in order."""
    answers: dict[str, SaveResult] = attrs.field(factory=dict)
    pending: SaveRequest | None = None
    """Its latest request (the one adopted)."""
    latest: tuple[str, int | None] | None = None
    """The persister's ``_latest``: the last request written and its version if in place."""
    cut: Any = None
    """Its last regenerate's: the ids it cut, the version it cut them from, where (its
    saves carry the cut until one lands: this turn's, or a later one's)."""

    def __repr__(self) -> str:
        return f"writer{self.n}"


class Interleavings(RuleBasedStateMachine):
    """Two or three writers on one session, their steps in any order."""

    make_store: Any = ListStore

    def __init__(self) -> None:
        super().__init__()
        self.ids = itertools.count()
        self.writers: list[Writer] = []
        self.told_saved: dict[str, int] = {}
        """Message id -> the store version of the save a writer was told wrote it."""
        self.withdrawn: set[str] = set()
        """Ids a writer that held them cut (regenerate, edit) and saved the cut in place."""
        self.store: Any = None
        self.cuts: list[tuple[SaveRequest, Any, Writer]] = []
        self.based_on: dict[str, int | None] = {}
        """Request id -> the version the persister wrote it on (``None``: rebased)."""
        self.sent: list[str] = []
        """The ids of the messages writers were sent (a twin is sent one of them)."""

    @initialize(count=st.sampled_from([2, 3]), forgets=st.lists(st.booleans(), min_size=3))
    def open(self, count: int, forgets: list[bool]) -> None:
        self.store = self.make_store(count)
        self.writers = [
            Writer(n=n, state=SessionState(session_id=SID), forgets_unsaved=forgets[n])
            for n in range(count)
        ]

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()

    def new_id(self, kind: str) -> str:
        return f"{kind}{next(self.ids)}"

    # -- the persister -----------------------------------------------------------------

    def write(self, w: Writer, *, fails: bool = False) -> None:
        """The persister writes ``w``'s oldest request (``Persister._write``); ``fails``:
        the store fails it, writing nothing (a disk full, a lost connection)."""
        req = w.queue.pop(0)
        if fails:
            error = StoreError("disk full")
            w.latest = (req.request_id, None)
            w.answers[req.request_id] = SaveResult(
                request_id=req.request_id, session_id=SID, error=error
            )
            return
        expected = req.expected_version
        if expected is None and w.latest is not None and w.latest[0] == req.after:
            expected = w.latest[1]
        self.based_on[req.request_id] = expected
        result: SaveResult | None = None
        try:
            if expected is not None:
                try:
                    version = self.store.save(w.n, req.start, req.messages, expected)
                except StoreConflict:
                    pass
                else:
                    result = SaveResult(request_id=req.request_id, session_id=SID, version=version)
            if result is None:  # (one reload: nothing writes between it and the save here)
                record = self.store.load(w.n)
                stored = () if record is None else record.messages
                base, start = rebase(stored, req.messages)
                version = self.store.save(
                    w.n, start, base[start:] + req.messages, 0 if record is None else record.version
                )
                result = SaveResult(
                    request_id=req.request_id, session_id=SID, version=version, base=base
                )
        except StoreError as exc:
            result = SaveResult(request_id=req.request_id, session_id=SID, error=exc)
        assert result is not None
        if result.version is not None:
            for message in req.messages:
                self.told_saved[message.id] = result.version
        w.latest = (req.request_id, result.version if result.in_place else None)
        w.answers[req.request_id] = result

    # -- the turn runner -----------------------------------------------------------------

    def adopt_pending(self, w: Writer, *, wait: bool) -> SaveResult | None:
        """Adopt ``w``'s latest request if answered (or, ``wait``, once written)."""
        req = w.pending
        if req is None:
            return None
        if wait:
            while req.request_id not in w.answers:
                self.write(w)
        result = w.answers.get(req.request_id)
        if result is None:
            return None
        w.pending = None
        adopted = adopt_save(w.state, req, result)
        if w.turn is not None and adopted.shift:
            w.turn.start_index += adopted.shift
            w.turn.a_index += adopted.shift
        return result

    def save(self, w: Writer) -> SaveRequest:
        turn = w.turn
        assert turn is not None
        state = w.state
        self.adopt_pending(w, wait=False)
        prev = w.pending
        start = min(turn.start_index, state.saved_upto)
        req = SaveRequest(
            request_id=self.new_id("save"),
            session_id=SID,
            turn_id=turn.turn_id,
            start=start,
            messages=tuple(state.messages[start:]),
            expected_version=state.version if prev is None else None,
            after=None if prev is None else prev.request_id,
        )
        w.pending = req
        w.queue.append(req)
        return req

    def sync(self, w: Writer) -> None:
        """Before a turn (``Saving._sync``): the store's history, if it moved."""
        self.adopt_pending(w, wait=True)
        record = self.store.load(w.n)
        if (0 if record is None else record.version) != w.state.version:
            adopt_record(w.state, record)

    def begin(self, w: Writer, user_id: str) -> None:
        state = w.state
        turn = Turn(
            turn_id=self.new_id("turn"),
            start_index=len(state.messages),
            a_index=len(state.messages) + 1,
            message_id=self.new_id("a"),
        )
        state.messages.append(UserMessage(content=user_id, id=user_id))
        self.sent.append(user_id)
        state.messages.append(AssistantMessage(id=turn.message_id))
        w.turn = turn

    def grow(self, w: Writer, calls: int) -> None:
        """One step of ``w``'s turn: its parts, then its calls' results."""
        turn = w.turn
        assert turn is not None
        state = w.state
        answer = state.messages[turn.a_index]
        assert isinstance(answer, AssistantMessage) and answer.id == turn.message_id
        parts: list[Any] = [TextPart(text=f"step {turn.step}", step=turn.step)]
        results = []
        for _ in range(calls):
            call_id = self.new_id("call")
            parts.append(
                ToolCallPart(tool_call_id=call_id, tool_name="t", input={}, step=turn.step)
            )
            results.append(
                ToolMessage(
                    tool_call_id=call_id, tool_name="t", step=turn.step, id=self.new_id("t")
                )
            )
        state.messages[turn.a_index] = attrs.evolve(answer, content=(*answer.content, *parts))
        state.messages.extend(results)
        turn.step += 1

    # -- rules -----------------------------------------------------------------------------

    def idle(self) -> list[Writer]:
        return [w for w in self.writers if w.turn is None]

    def running(self) -> list[Writer]:
        return [w for w in self.writers if w.turn is not None]

    @precondition(lambda self: self.idle())
    @rule(data=st.data())
    def send(self, data: st.DataObject) -> None:
        """A writer starts a turn of a new message."""
        w = data.draw(st.sampled_from(self.idle()))
        self.sync(w)
        self.begin(w, self.new_id("u"))

    @precondition(lambda self: self.idle() and self.sent)
    @rule(data=st.data())
    def twin(self, data: st.DataObject) -> None:
        """A writer starts a turn of a message another writer was sent (a client's retry
        of a post on another server), unless its history holds that id (``_user_id``)."""
        w = data.draw(st.sampled_from(self.idle()))
        self.sync(w)
        wanted = data.draw(st.sampled_from(self.sent))
        held = any(m.id == wanted for m in w.state.messages)
        self.begin(w, self.new_id("u") if held else wanted)

    @precondition(lambda self: self.idle())
    @rule(data=st.data(), same_id=st.booleans())
    def regenerate(self, data: st.DataObject, same_id: bool) -> None:
        """A writer runs its last message again (``same_id``: an edit of it that keeps
        its id, as a client's edit sends it)."""
        w = data.draw(st.sampled_from(self.idle()))
        self.sync(w)
        messages = w.state.messages
        at = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), None)
        if at is None:
            return
        cut = [m.id for m in messages[at:]]
        user_id = messages[at].id if same_id else self.new_id("u")
        del messages[at:]  # (runner._cut_last_turn)
        w.state.saved_upto = min(w.state.saved_upto, at)
        self.begin(w, user_id)
        w.cut = (cut, w.state.version, at)

    @precondition(lambda self: self.running())
    @rule(data=st.data(), calls=st.integers(0, 2), retried=st.booleans())
    def step(self, data: st.DataObject, calls: int, retried: bool) -> None:
        """A step of a running turn ends and is saved (a retried step: its first
        attempt's parts dropped before, so only the retry's are saved)."""
        w = data.draw(st.sampled_from(self.running()))
        if retried:
            turn = w.turn
            assert turn is not None
            before = w.state.messages[turn.a_index]
            self.grow(w, 0)  # the failed attempt's parts, then gone (``PartsManager.discard``)
            w.state.messages[turn.a_index] = before
            turn.step -= 1
        self.grow(w, calls)
        self.note_cut(w, self.save(w))

    @precondition(lambda self: any(w.turn is not None and w.turn.step for w in self.writers))
    @rule(data=st.data(), twin=st.booleans())
    def steer(self, data: st.DataObject, twin: bool) -> None:
        """A message steered into a running turn at a step boundary: a new answer
        (``twin``: a message another writer was sent; not again if held, ``_steer``)."""
        w = data.draw(st.sampled_from([w for w in self.running() if w.turn.step]))  # type: ignore[union-attr]
        turn = w.turn
        assert turn is not None
        user_id = data.draw(st.sampled_from(self.sent)) if twin else self.new_id("u")
        if any(m.id == user_id for m in w.state.messages):
            return
        self.sent.append(user_id)
        w.state.messages.append(UserMessage(content="steer", id=user_id))
        turn.message_id = self.new_id("a")
        turn.a_index = len(w.state.messages)
        w.state.messages.append(AssistantMessage(id=turn.message_id))

    @precondition(lambda self: any(w.turn is not None and w.turn.step for w in self.writers))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        """A turn's last step (text only) and its final save, waited for."""
        w = data.draw(st.sampled_from([w for w in self.running() if w.turn.step]))  # type: ignore[union-attr]
        turn = w.turn
        assert turn is not None
        self.grow(w, 0)
        req = self.save(w)
        self.note_cut(w, req)
        result = self.adopt_pending(w, wait=True)
        assert result is not None
        w.turn = None
        stored = self.store.load(w.n)
        held = () if stored is None else stored.messages
        if result.error is None:
            assert turn.message_id in {m.id for m in held}, "told saved, answer not stored"
        if isinstance(result.error, AnsweredElsewhere):  # so it was: another's answer follows
            at = next(i for i, m in enumerate(held) if m.id == result.error.message_id)
            assert held[at + 1].role == "assistant", held
            assert held[at + 1].id not in {m.id for m in req.messages}, held
        if result.error is not None and w.forgets_unsaved:  # (``Saving._discard_unsaved``)
            state = w.state
            cut = min(state.saved_upto, turn.start_index)
            del state.messages[cut:]
            state.saved_upto = cut
            record = self.store.load(w.n)
            if record is not None and record.version >= state.version:
                adopt_record(state, record)

    @precondition(lambda self: any(w.queue for w in self.writers))
    @rule(data=st.data(), fails=st.sampled_from([False] * 5 + [True]))
    def persist(self, data: st.DataObject, fails: bool) -> None:
        """The persister of a writer writes its oldest request (or the store fails it)."""
        self.write(data.draw(st.sampled_from([w for w in self.writers if w.queue])), fails=fails)

    def note_cut(self, w: Writer, req: SaveRequest) -> None:
        """A regenerate's cut is the writer's to make when a save of its lands in place
        on the version it cut from (checked in ``nothing_told_saved_is_lost``)."""
        if w.cut is not None:
            self.cuts.append((req, w.cut, w))

    @invariant()
    def stored_history_replays(self) -> None:
        if self.store is None:
            return
        record = self.store.load(0)
        messages = () if record is None else record.messages
        assert replay_problems(messages) == [], messages

    @invariant()
    def nothing_told_saved_is_lost(self) -> None:
        if self.store is None:
            return
        for req, (ids, version, _at), w in self.cuts:
            result = w.answers.get(req.request_id)
            based = self.based_on.get(req.request_id)
            if result is not None and result.in_place and based == version:
                self.withdrawn.update(ids)
        record = self.store.load(0)
        stored = set() if record is None else {m.id for m in record.messages}
        lost = set(self.told_saved) - stored - self.withdrawn
        assert not lost, f"told saved, gone: {sorted(lost)}"


Interleavings.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_two_or_three_writers_keep_a_valid_history = Interleavings.TestCase


class OnOneSQLiteFile(Interleavings):
    """The same writers, each saving through its own connection to one SQLite file."""

    make_store = SQLiteFile


OnOneSQLiteFile.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_writers_on_one_sqlite_file_keep_a_valid_history = OnOneSQLiteFile.TestCase
