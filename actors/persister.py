"""The persister: the one writer of the session store in this host.

Turn runners send it :class:`~runtime.actor_messages.SaveRequest` s at every step boundary
and at the end of each turn; it writes them in order and answers each with a
:class:`~runtime.actor_messages.SaveResult` on the request's reply inbox. Being its
own actor, its writes are not cancelled when a turn is: a turn that is aborted still
gets its final save, and the turn runner waits for it in a shielded, time-bounded scope.

It is the one writer *in this host*, not on the store: another process may save the same
session. Every save is therefore based on a version (the store's version rule), and a
save that meets a newer version is rebased, never forced: the session is reloaded and the
request's messages are appended after what the store now holds. Nothing either writer
stored is lost; the turn runner adopts the new layout from the answer.

A session's requests are written in order; other sessions' need not wait for them. A
save of more than :data:`~runtime.history.OFF_LOOP_MESSAGES` messages (a session's first
save of a long history a client sent: 600,000 messages are seconds of encoding, 58 MB
sent and as many rows inserted) is written by a task of its own, with that session's
later requests behind it in order, while the persister goes on with the other sessions'
saves: written in line, it held every other turn of the host at its next step's save
(a bystander's deltas stopped 7.7 s, benchmarks/journal/approval.md, branch ``whist``).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable
from itertools import compress
from typing import Any, NoReturn

import trio

from runtime.actor import Actor
from runtime.actor_messages import SaveRequest, SaveResult
from runtime.errors import (
    LeaseLost,
    SessionDeleted,
    StoreConflict,
    StoreError,
    describe_exception,
)
from runtime.events import SessionSaved
from runtime.history import OFF_LOOP_MESSAGES
from runtime.liveness import rebased_meta
from runtime.logging import get_logger
from runtime.messages import AssistantMessage, Message, ToolMessage
from runtime.redact import redact
from runtime.serde import forget_encoded, keep_encoded
from runtime.store import (
    Store,
    checks_absent_mark,
    deletion_mark,
    rebase,
    save_keeping,
    takes_fence,
    takes_grown,
)

REBASE_ATTEMPTS = 5
"""Reload-and-append attempts for one save before it fails with StoreConflict (another
writer saving the same session between each of our reloads and writes, five times over)."""
REMEMBERED = 1024
"""Sessions whose latest answer the persister remembers, to resolve a request based on
the one before it (:attr:`SaveRequest.after`). A session that drops out (least recently
saved first) loses nothing: its next such request is rebased instead."""


class _Forget:
    """The marker :meth:`Persister.forget_when_saved` queues behind a closed session's
    saves: handled in their order, it forgets the session once they are written."""

    __slots__ = ("session_id", "then")

    def __init__(self, session_id: str, then: Callable[[], None] | None = None) -> None:
        self.session_id = session_id
        self.then = then


class Persister(Actor):
    inbox_capacity = 4096

    def __init__(self, store: Store, *, name: str = "persister") -> None:
        super().__init__(name=name)
        self.store = store
        self._ends_turns = bool(getattr(store, "ends_turns", False))
        """Whether the store finishes a turn in its save (:meth:`_ends`): asked once, not
        a save each (a store without the attribute built and dropped an AttributeError
        every save, issue 24 goal 1)."""
        self._takes_fences = takes_fence(store)
        """Whether the store's save takes the fence a request carries
        (:attr:`SaveRequest.fence`, :func:`~runtime.store.takes_fence`): asked once too."""
        self._grows = takes_grown(store)
        """Whether the store's save takes ``grown`` (:class:`~runtime.store.Store`'s grown
        rows): a running turn's answer written as its new parts, not whole (:meth:`_grown`)."""
        self._marks_in_save = checks_absent_mark(store)
        """Whether the store checks a first save's deletion mark in the save itself
        (:func:`~runtime.store.checks_absent_mark`); otherwise it is read just before."""
        self._log = get_logger("axon.persister")
        self._latest: OrderedDict[str, tuple[str, int | None, bool, int]] = OrderedDict()
        """Each session's latest request id, the version it left if it was saved in place,
        whether the session was stored for it (saved, or refused as deleted: a request
        after it is of a stored session too), and the version it left however it was
        saved (``0``: none). Bounded: :data:`REMEMBERED`; no messages, so it pins no
        history."""
        self._written: dict[str, tuple[str, int, int, tuple[Message, ...]]] = {}
        """Each session's last save written in place while its turn goes on: the turn's
        id, the version the save left, its ``start`` and its messages (the objects, which
        the session's history holds as well). The turn's next request, based on that
        version from the same ``start``, writes only its messages that are not one of
        these at the same place (:meth:`_unchanged`): a step's save sends its whole turn
        again (the turn's new messages are rebased whole if another writer saved
        meanwhile), and writing it whole rewrote, at every step, what no step had
        changed: a user's 10 MB attachment 10 MB a step, and every tool result of the
        turn after its assistant message (which changes every step). Dropped at the
        turn's final save, a save not written in place, and when the session is
        forgotten; at most one turn's messages a session."""
        self._grew: dict[str, tuple[str, frozenset[str]]] = {}
        """Each session's running turn, by id, and the ids of the messages its saves
        passed as grown rows (:meth:`_grown`): stored as heads and segments, they are
        written whole by the turn's last save (:meth:`_unheaded`) even where it would
        keep them (an answer a steer closed, the next one after the steered message).
        Dropped once such a save is written, and when the session is forgotten."""
        self._refused: OrderedDict[str, str] = OrderedDict()
        """The turns whose session was deleted while they ran (:meth:`refuse`), by turn
        id, with their session's id: none of their saves may write. Bounded:
        :data:`REMEMBERED`."""
        self._aside: dict[str, list[SaveRequest | _Forget]] = {}
        """The sessions whose long save a task of its own is writing: that request and
        the session's later ones, in order, the first being written."""
        self._nursery: trio.Nursery | None = None

    async def run(self) -> None:
        """Handle requests (:meth:`Actor.run`); a long save's task is a child of this
        one, so a persister that stops once its inbox is drained waits for it too."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await super().run()
            finally:
                self._nursery = None

    async def handle(self, message: Any) -> None:
        if not isinstance(message, SaveRequest | _Forget):
            return
        queued = self._aside.get(message.session_id)
        if queued is not None:  # behind the session's long save, in order
            queued.append(message)
            return
        if isinstance(message, _Forget):
            self._forgotten(message)
            return
        if len(message.messages) > OFF_LOOP_MESSAGES and self._nursery is not None:
            self._aside[message.session_id] = [message]
            self._nursery.start_soon(self._write_aside, message.session_id)
            return
        await self._save(message)

    async def _write_aside(self, session_id: str) -> None:
        """Write the session's requests set aside, in order, until none is left."""
        queued = self._aside[session_id]
        try:
            while queued:
                item = queued[0]
                if isinstance(item, _Forget):
                    self._forgotten(item)
                else:
                    await self._save(item)
                del queued[0]  # (no schedule point from here to the pop: none comes in)
        finally:
            self._aside.pop(session_id, None)

    async def _save(self, message: SaveRequest) -> None:
        """Write one request and answer it (a failure too), then announce the save."""
        if message.step is not None and message.ends is None:  # the turn goes on: its
            answer = _answer_of(message.messages)  # next step's save stores its answer
            if answer is not None:  # again, encoded from what this one encodes
                keep_encoded(answer.id)
        try:
            version, base = await self._write(message)
        except Exception as exc:  # a failed write is reported to the requester, never lost
            result = SaveResult(
                request_id=message.request_id, session_id=message.session_id, error=exc
            )
            if isinstance(exc, SessionDeleted):  # the turn ends quietly: said, not an error
                self._log.info(
                    "session.save-refused-deleted",
                    session_id=message.session_id,
                    turn_id=message.turn_id,
                )
            else:
                self._log.error(
                    "session.save-failed",
                    session_id=message.session_id,
                    turn_id=message.turn_id,
                    error=redact(describe_exception(exc)),
                )
        else:
            result = SaveResult(
                request_id=message.request_id,
                session_id=message.session_id,
                version=version,
                base=base,
            )
        self._remember(result)
        self._note_written(message, result)
        if message.reply is not None:
            try:
                message.reply.put_nowait(result)
            except (trio.WouldBlock, trio.ClosedResourceError, trio.BrokenResourceError):
                pass  # a requester that stopped listening; never wait for one
        if result.error is None:
            before = message.start if result.base is None else len(result.base)
            await self.publish(
                SessionSaved(
                    session_id=message.session_id,
                    turn_id=message.turn_id,
                    message_count=before + len(message.messages),
                    step=message.step,
                )
            )

    def _remember(self, result: SaveResult) -> None:
        latest = self._latest
        latest[result.session_id] = (
            result.request_id,
            result.version if result.in_place else None,
            result.version is not None or isinstance(result.error, SessionDeleted),
            result.version or 0,
        )
        latest.move_to_end(result.session_id)
        if len(latest) > REMEMBERED:
            latest.popitem(last=False)

    def _note_written(self, req: SaveRequest, result: SaveResult) -> None:
        """Keep ``req``'s messages for its turn's next save (:attr:`_written`) when it was
        written in place and its turn goes on; forget the session's otherwise."""
        if result.in_place and req.step is not None and req.ends is None:
            assert result.version is not None
            self._written[req.session_id] = (req.turn_id, result.version, req.start, req.messages)
            if req.may_end:  # (its heads were written whole: _unheaded)
                self._grew.pop(req.session_id, None)
            return
        self._written.pop(req.session_id, None)
        if result.version is not None and _last(req):
            self._grew.pop(req.session_id, None)
        if req.step is None or req.ends is not None:  # the turn's last save: no step
            # will save its answer again, whose encoded parts need not be kept
            # (serde.message_json); the answer is the last one, after its user message
            answer = _answer_of(req.messages)
            if answer is not None:
                forget_encoded(answer.id)

    def _unchanged(self, req: SaveRequest, expected: int) -> tuple[int, ...]:
        """The positions of ``req``'s messages the store holds as they are: the same
        objects at the same places the turn's previous save wrote in place from the same
        ``start``, the store still at the version that save left (so nobody wrote since).
        None when that is not known (an empty tuple). The turn's assistant message
        (every step's parts) changes every step, the tool results after it do not: they
        are kept (:func:`~runtime.store.save_keeping`), not written again every step.

        A continuation's first save has no previous save of its turn here: the record it
        began from (:attr:`SaveRequest.held`, the session at ``expected_version``) says
        the same, the user message and the waiting assistant message the decision stored
        being kept (issue 21: the continuation rewrote both)."""
        written = self._written.get(req.session_id)
        if written is not None:
            turn_id, version, start, messages = written
            if turn_id == req.turn_id and version == expected and start == req.start:
                return _same_places(req.messages, messages)
        if req.held and expected == req.expected_version:
            return _same_places(req.messages, req.held[req.start :])
        return ()

    def _grown(self, req: SaveRequest, expected: int) -> list[int]:
        """The positions of ``req``'s assistant messages that extend the ones the turn's
        previous save wrote in place at the same places, the store still at the version
        it left (:class:`~runtime.store.Store`'s grown rows): the running turn's answer,
        whose parts so far are the same objects. None at the turn's last save (its
        answer is written whole) or for a store that does not take them."""
        if not self._grows or _last(req):
            return []
        written = self._written.get(req.session_id)
        if written is None:
            return []
        turn_id, version, start, stored = written
        if turn_id != req.turn_id or version != expected or start != req.start:
            return []
        ours = req.messages
        grown = []
        # The positions not kept (the save's ``kept`` is _same_places(ours, stored): the
        # same written entry), found in C: a step's save keeps all but one or two. Taken
        # as the set of all positions less the kept ones, 1.7 ms a save at 10,000
        # messages (3 hash sets of them), 4.7 times _same_places itself.
        for p in compress(range(len(ours)), map(operator.is_not, ours, stored)):
            new, old = ours[p], stored[p]
            if (
                type(new) is AssistantMessage
                and type(old) is AssistantMessage
                and new.id == old.id
                and type(new.content) is tuple
                and old.content
                and len(old.content) <= len(new.content)
                and all(map(operator.is_, old.content, new.content))
            ):
                grown.append(p)
        return grown

    def _note_grown(self, req: SaveRequest, grown: list[int]) -> None:
        """Remember the messages ``req`` passes as grown (:attr:`_grew`)."""
        ids = frozenset(req.messages[p].id for p in grown)
        known = self._grew.get(req.session_id)
        if known is not None and known[0] == req.turn_id:
            ids = ids | known[1]
        self._grew[req.session_id] = (req.turn_id, ids)

    def _unheaded(self, req: SaveRequest, kept: tuple[int, ...]) -> tuple[int, ...]:
        """``kept`` without the messages ``req``'s turn stored as heads and segments
        (:attr:`_grew`): the turn's last save writes them whole. Without, an answer a
        steer closed (kept by every later save of its turn), or the answer of a turn
        ended by its budget (its final save keeps it: the same object as the step's
        save wrote), stayed a head for good: every later read folded it, and a
        worker's claim read the session again for it each turn."""
        known = self._grew.get(req.session_id)
        if known is None or known[0] != req.turn_id or not kept:
            return kept
        ids, messages = known[1], req.messages
        return tuple(p for p in kept if getattr(messages[p], "id", None) not in ids)

    def forget(self, session_id: str) -> None:
        """Drop what is remembered of ``session_id``: its host evicted it. An evicted
        session was idle with every message saved (its runner had the answer to its last
        request, which is remembered before it is answered), and its next turn is a new
        runner's, whose first request names a version, never an older request
        (:attr:`SaveRequest.after`): the entry would serve nothing, yet kept one tuple,
        one id and a slot each for up to :data:`REMEMBERED` evicted sessions (issue 21:
        a waiting turn, evicted, holds no memory in the process)."""
        self._latest.pop(session_id, None)
        self._written.pop(session_id, None)
        self._grew.pop(session_id, None)

    def _forgotten(self, marker: _Forget) -> None:
        self.forget(marker.session_id)
        if marker.then is not None:
            marker.then()

    def forget_when_saved(self, session_id: str, then: Callable[[], None] | None = None) -> None:
        """:meth:`forget` ``session_id`` once the saves of it already sent here are
        written: its host closed it with a save in flight (one that outlasted its turn's
        wait, ``SAVE_TIMEOUT``: a slow or paused store), and its runner, stopped, sends no
        more. Forgotten at once, that save would have put back what it keeps (the
        session's latest request; a waiting turn's messages, 10 MB attachments and
        all), for the host's life: so a marker is queued behind it, past the inbox's
        capacity if need be (never a wait), and handled in its order. A persister that
        stops already forgets at once. ``then``, called once it is forgotten: the store's
        release of the session's sub-turn fence (``Host.close_session``)."""
        try:
            self.inbox.put_over(_Forget(session_id, then))
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._forgotten(_Forget(session_id, then))

    def refuse(self, session_id: str, turn_id: str) -> None:
        """Refuse every save of turn ``turn_id`` from now on: its session is being
        deleted (``Host.delete_session``, or another host's delete told over the relay).
        Its saves raise :class:`~runtime.errors.SessionDeleted`, writing nothing, also
        one already queued here, and whatever the store holds by then: without this a
        save that finds the session re-created under the same id (a new message) takes
        it for another writer's save and appends the deleted conversation's turn to the
        new one. A save of it already sent to the store when this is called, which
        created the session (its first save, held past the delete), is undone: the
        session it created is deleted again before any later save of this persister."""
        self._refused[turn_id] = session_id
        self._refused.move_to_end(turn_id)
        if len(self._refused) > REMEMBERED:
            self._refused.popitem(last=False)

    def accept(self, session_id: str, turn_id: str) -> None:
        """Undo :meth:`refuse` of turn ``turn_id`` of ``session_id`` (that run of it is
        over: ``runtime.agent``'s sub-turn whose caller was taken over)."""
        if self._refused.get(turn_id) == session_id:
            del self._refused[turn_id]

    def refuses(self, turn_id: str) -> bool:
        """Whether the saves of turn ``turn_id`` are refused (:meth:`refuse`): a new turn
        named so (a client's constant id) must take another."""
        return turn_id in self._refused

    def _check_refused(self, req: SaveRequest) -> None:
        if self._refused.get(req.turn_id) == req.session_id:
            raise SessionDeleted(
                f"save of session {req.session_id!r} refused: the session was deleted "
                f"while its turn {req.turn_id!r} ran; nothing was written",
                session_id=req.session_id,
            )

    async def _created_refused(self, req: SaveRequest) -> None:
        """After a save of ``req`` that created its session: if its turn was refused
        while the store wrote it (:meth:`refuse`), delete that session again (it holds
        that turn's messages only) and refuse the save."""
        if self._refused.get(req.turn_id) == req.session_id:
            await self.store.delete(req.session_id)
            self._check_refused(req)

    def _based_on(self, req: SaveRequest) -> int | None:
        """The version ``req``'s ``start`` and ``messages`` are known to fit, if any.

        A request made while the previous one was in flight fits the version that one
        left, provided it wrote where it was asked to (no rebase, no failure): then
        nothing moved. Requests are handled in order, so that one was answered already.
        """
        if req.expected_version is not None:
            return req.expected_version
        prev = self._latest.get(req.session_id)
        if req.after is not None and prev is not None and prev[0] == req.after:
            return prev[1]
        return None

    def _of_stored(self, req: SaveRequest, expected: int | None) -> bool:
        """Whether ``req`` is a save of a session that was stored when its turn made it:
        based on a stored version (above ``0``), or following a request of the session
        that stored it (or was refused as deleted). Such a save that finds the session
        gone must not create it again (:class:`~runtime.errors.SessionDeleted`)."""
        if expected is not None:
            return expected > 0
        prev = self._latest.get(req.session_id)
        return req.after is not None and prev is not None and prev[0] == req.after and prev[2]

    def _seen(self, req: SaveRequest, expected: int | None) -> int:
        """A version of the session this save is known to follow (``0``: none): the one
        it was based on, or the one the previous request of the session it names left
        (saved in place or rebased). A session whose incarnation is above it was deleted
        and created again since (:attr:`~runtime.store.SessionRecord.incarnation`)."""
        if expected is not None:
            return expected
        prev = self._latest.get(req.session_id)
        if req.after is not None and prev is not None and prev[0] == req.after:
            return prev[3]
        return 0

    async def _deleted_since(self, req: SaveRequest, mark: int) -> bool:
        """Whether ``req``'s session was deleted since its turn read the deletion mark
        ``mark`` (:attr:`SaveRequest.absent_mark`): a session met now is then one created
        again since, not a concurrent creator's. ``False`` for a store that keeps no
        mark (any more)."""
        now = await deletion_mark(self.store, req.session_id)
        # Above: a deletion since. Below or equal: none (a mark only grows while the store
        # keeps it; one dropped since, DELETION_MARKS_KEPT deletions old, reads 0).
        return now is not None and now > mark

    def _gone(self, req: SaveRequest) -> NoReturn:
        """Refuse ``req`` and every later save of its turn: its session was deleted while
        the turn ran (:meth:`refuse`)."""
        self.refuse(req.session_id, req.turn_id)
        raise SessionDeleted(
            f"save of session {req.session_id!r} refused: the session was deleted "
            "while its turn ran; nothing was written",
            session_id=req.session_id,
        )

    def _absent(self, mark: int | None) -> dict[str, int]:
        """The save's ``absent_mark`` keyword, for a save that may create its session
        (based on version ``0``) of a turn that read the mark ``mark``, when the store
        checks it in the save; nothing otherwise."""
        if mark is None or not self._marks_in_save:
            return {}
        return {"absent_mark": mark}

    def _ends(self, req: SaveRequest) -> dict[str, Any]:
        """The save's ``ends`` keyword (:attr:`SaveRequest.ends`) for a store that takes
        it (``ends_turns``: a worker's PostgreSQL store finishes the turn's queue row in
        the save's commit), and its ``fence`` (:attr:`SaveRequest.fence`) for a store
        that takes that; nothing for any other store, whose ``save`` knows neither."""
        options: dict[str, Any] = {}
        if req.ends is not None and self._ends_turns:
            options["ends"] = req.ends
        if req.fence is not None and self._takes_fences:
            options["fence"] = req.fence
        return options

    async def _write(self, req: SaveRequest) -> tuple[int, tuple[Message, ...] | None]:
        """Save ``req`` on top of the version it was based on, or rebase it; returns the
        session's new version and, when rebased, what the store holds before ``req``'s
        messages now."""
        self._check_refused(req)
        expected = self._based_on(req)
        ends = self._ends(req)
        if expected is not None:
            first = req.absent_mark if expected == 0 else None
            if (
                first is not None
                and not self._marks_in_save
                and await self._deleted_since(req, first)
            ):
                # A turn's first save, its session not stored when it began: created and
                # deleted since by another process (nothing re-created it: the save would
                # meet no conflict and bring the deleted conversation back holding this
                # turn). Refused as a deleted session's, with every later save of it. A
                # store that checks the mark in the save itself does it there (no create
                # and delete can fall between the check and the write); read apart here.
                self._gone(req)
            kept = self._unchanged(req, expected)
            grown = self._grown(req, expected)
            if grown:
                self._note_grown(req, grown)
            elif _last(req):
                kept = self._unheaded(req, kept)
            try:
                version = _checked(
                    self.store,
                    await save_keeping(
                        self.store,
                        req.session_id,
                        req.start,
                        req.messages,
                        dict(req.meta),
                        kept=kept,
                        expected_version=expected,
                        grown=grown,
                        **ends,
                        **self._absent(first),
                    ),
                )
                if expected == 0:
                    await self._created_refused(req)
                return version, None
            except SessionDeleted as exc:
                if not self._absent(first) or isinstance(exc, LeaseLost):
                    raise  # (not the store's answer to absent_mark: a fence's, a refusal's)
                self._gone(req)  # created and deleted since the turn began (the store said)
            except StoreConflict:
                pass  # another writer saved the session since: rebase below
        conflict: StoreConflict | None = None
        of_stored = self._of_stored(req, expected)
        seen = self._seen(req, expected)
        mark = None if seen else req.absent_mark
        for _ in range(REBASE_ATTEMPTS):
            self._check_refused(req)
            record = await self.store.load(req.session_id)
            self._check_refused(req)
            if (
                (record is None and of_stored)
                or (record is not None and seen and record.incarnation > seen)
                or (mark is not None and await self._deleted_since(req, mark))
            ):
                # Deleted since the turn's save was based on it: saved from 0 at version 0,
                # it would come back (a tombstone-less store cannot tell); or deleted and
                # saved again since (another process's new message: its incarnation began
                # above the version this save was based on), rebased it would append the
                # deleted conversation's turn to the new one; or, the turn based on no
                # version (its session not stored when it began), deleted since the turn
                # began (its deletion mark moved, read after the load: a deletion after it
                # fails the save below and is read on the next attempt). Refused, and so
                # is every later save of the turn (one already queued, based on this one).
                self._gone(req)
            stored = () if record is None else record.messages
            base, start = rebase(stored, req.messages, req.cut)
            meta = req.meta if record is None else rebased_meta(req.meta, record.meta, req.turn_id)
            try:
                version = await self.store.save(
                    req.session_id,
                    start,
                    base[start:] + req.messages,
                    dict(meta),
                    expected_version=0 if record is None else record.version,
                    **ends,
                    **self._absent(mark if record is None else None),
                )
            except SessionDeleted as exc:
                if record is not None or not self._absent(mark) or isinstance(exc, LeaseLost):
                    raise
                self._gone(req)  # created and deleted between the load and the write
            except StoreConflict as exc:
                conflict = exc  # overtaken again between our load and our write
                continue
            if record is None:
                await self._created_refused(req)
            return _checked(self.store, version), base
        raise StoreConflict(
            f"save of session {req.session_id!r} gave up: another writer saved it between "
            f"each of {REBASE_ATTEMPTS} reloads and writes; the turn is kept in memory and "
            "the next save tries again",
            session_id=req.session_id,
            expected=conflict.expected if conflict else -1,
            actual=conflict.actual if conflict else -1,
        ) from conflict


def _last(req: SaveRequest) -> bool:
    """Whether ``req`` may be its turn's last save: its final one (no step), the save of
    the step that ends it, or of a step after which it may not go on
    (:attr:`SaveRequest.may_end`). Its answer is written whole (:meth:`Persister._grown`)."""
    return req.step is None or req.ends is not None or req.may_end


def _checked(store: Store, version: Any) -> int:
    """``version`` if it is one; a store that returns none cannot keep the version rule."""
    if not isinstance(version, int) or isinstance(version, bool):
        raise StoreError(
            f"{type(store).__name__}.save returned {version!r}, not the session's new "
            "version: a Store's save must return it (see runtime.store.Store)"
        )
    return version


def _same_places(ours: tuple[Message, ...], stored: tuple[Message, ...]) -> tuple[int, ...]:
    """The positions at which ``ours`` holds the very objects ``stored`` holds. (In C, not
    a Python loop: a step's save asks it of every message of its turn so far.)"""
    return tuple(compress(range(len(ours)), map(operator.is_, ours, stored)))


def _answer_of(messages: tuple[Message, ...]) -> AssistantMessage | None:
    """A turn's save's answer: its last message past the tool results after it."""
    for message in reversed(messages):
        if type(message) is AssistantMessage:
            return message
        if type(message) is not ToolMessage:
            return None
    return None
