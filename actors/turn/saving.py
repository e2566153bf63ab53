"""How the turn runner keeps the store in step with its history.

The runner saves at every step boundary and at the end of every turn, through the
host's one writer (:class:`~actors.persister.Persister`), without waiting for a step's
save before the next model call: a request names the stored version it is based on, or
the request still in flight before it, and the answer is adopted into the state when it
is next needed (:mod:`actors.turn.session_sync` says what adopting does). Before a
turn, the history is brought up to date with what another writer stored. The turn's
final save is waited for, bounded by :data:`SAVE_TIMEOUT`. Mixed into
:class:`~actors.turn.runner.TurnRunner`, whose state and inboxes it uses.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import trio

from actors.turn.session_sync import Adopted, adopt_record, adopt_save
from actors.turn.turn_state import Turn
from runtime import events as ev
from runtime.actor_messages import SaveRequest, SaveResult
from runtime.approval import AWAITING_INPUT
from runtime.errors import (
    ActorFailed,
    AnsweredElsewhere,
    SessionDeleted,
    StoreError,
    describe_exception,
)
from runtime.ids import new_id
from runtime.liveness import PAUSED_META, RUNNING_META, running_marker, settle, touch_interval
from runtime.messages import Message, UserMessage
from runtime.redact import redact
from runtime.serde import forget_encoded
from runtime.store import SessionRecord, version_and_mark

if TYPE_CHECKING:
    from runtime.actor import Actor
    from runtime.actor_messages import SessionState
    from runtime.hosting import TurnHost
    from runtime.inbox import Inbox
    from runtime.messages import Message

NO_TITLE: Any = object()
"""No title (``TurnRunner._stale_title``: no deleted conversation's title to leave out)."""
NO_TURN: Any = object()
"""No turn opened by this runner yet (``TurnRunner._held_title``: no title known)."""
SAVE_TIMEOUT = 5.0
"""Seconds a turn waits (shielded) for its final save."""


def _user_holds(messages: Sequence[Message], message_id: str) -> bool:
    """Whether a user message of ``messages`` has id ``message_id`` (a pass over the
    history: only for a turn whose copy was not given the client's id, which is rare)."""
    return any(type(m) is UserMessage and m.id == message_id for m in messages)


class Saving:
    """The turn runner's part that saves the session and adopts what the store answers
    (mixed into :class:`~actors.turn.runner.TurnRunner`, which sets these attributes)."""

    if TYPE_CHECKING:  # provided by the turn runner
        state: SessionState
        host: TurnHost
        persister: Actor
        save_replies: Inbox[SaveResult]
        _pending: SaveRequest | None
        _answered: SaveResult | None
        _deleted_since: bool
        _stale_title: Any
        _held_title: Any
        _absent_mark: int | None
        _log: Any

        async def publish(self, event: Any) -> None: ...

        def _publish_history(self) -> None: ...

    async def _save(
        self,
        turn: Turn,
        step: int | None,
        *,
        ends: str | None = None,
        running: bool = True,
        touch: bool = False,
    ) -> SaveRequest:
        """Queue a save of the turn (from wherever the store is behind, after a failed
        save) with the persister; returns the request (its answer comes on
        :attr:`save_replies`, see :meth:`_answer`).

        The save is based on the stored version the state matches. If the previous save
        is still in flight, that version is not known yet: the request names the previous
        one instead, and the persister resolves it (see :class:`SaveRequest`).

        A save the turn goes on after (``running``: not its final save, nor a step's that
        may end or suspend it) stores the turn as running in this process
        (:mod:`runtime.liveness`): a host that loads the session after this process died
        marks the turn interrupted. It rides in the save's meta: no statement more.

        ``touch``: a refresh of the marker while the step's calls run (:meth:`_touch`):
        the turn goes on after it (the step's save comes), though a call of the step is
        held already (:attr:`Turn.held`, which makes the step's save one it may end at)."""
        state = self.state
        prev = self._pending
        if prev is not None and self._answer(prev) is not None:
            await self._adopt(prev, turn)
            prev = None
        if turn.deleted:  # its session was deleted while it ran: nothing more is saved
            raise SessionDeleted(
                f"session {state.session_id!r} was deleted while its turn ran",
                session_id=state.session_id,
            )
        start = min(turn.start_index, state.saved_upto)
        began, turn.began_from = turn.began_from, None  # (the persister knows the rest)
        held: tuple[Message, ...] = ()
        if began is not None and prev is None and began.version == state.version:
            held = began.messages
        held_now = bool(turn.held) and not touch
        req = SaveRequest(
            request_id=new_id("save"),
            session_id=state.session_id,
            turn_id=turn.turn_id,
            start=start,
            messages=tuple(state.messages[start:]),
            meta=self._save_meta(turn, running=running and ends is None and not held_now),
            step=step,
            expected_version=state.version if prev is None else None,
            after=None if prev is None else prev.request_id,
            reply=self.save_replies,
            ends=ends,
            absent_mark=self._absent_mark,
            held=held,
            fence=turn.fence,
            may_end=not running or ends is not None or held_now,
            cut=state.cut,
        )
        self._pending, self._answered = req, None
        try:
            await self.persister.inbox.put(req)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            self._answered = SaveResult(
                request_id=req.request_id,
                session_id=req.session_id,
                error=ActorFailed("the persister is not running; the session was not saved"),
            )
        return req

    def _answer(self, req: SaveRequest) -> SaveResult | None:
        """The persister's answer to ``req`` (the latest request) if it came in; answers
        to earlier requests are passed over (the latest one's is the one adopted)."""
        inbox = self.save_replies
        while self._answered is None:
            reply = inbox.poll(None)  # (no WouldBlock raised when none came yet)
            if reply is None:
                return None
            if isinstance(reply, SaveResult) and reply.request_id == req.request_id:
                self._answered = reply
        return self._answered

    async def _wait_answer(self, req: SaveRequest) -> SaveResult:
        """Wait for the persister's answer to ``req`` (the latest request)."""
        while (answer := self._answer(req)) is None:
            reply = await self.save_replies.get()
            if isinstance(reply, SaveResult) and reply.request_id == req.request_id:
                self._answered = reply
        return answer

    async def _adopt(self, req: SaveRequest, turn: Turn | None) -> SaveResult:
        """Take a finished save's outcome into the state: how far the store got, its
        version and, if the save was rebased after another writer's, the new layout."""
        result = await self._wait_answer(req)
        if self._pending is req:
            self._pending, self._answered = None, None
        adopted = adopt_save(self.state, req, result)
        if isinstance(result.error, SessionDeleted):
            if turn is not None:
                turn.deleted = True  # it stops at its next save, and forgets at its end
            else:  # a turn's final save that outlived it: that turn is gone already
                self._forget_deleted(req.meta)
        if turn is not None and turn.unsaved_steers and result.error is None:
            held = {id(m) for m in req.messages}
            for item, message in [s for s in turn.unsaved_steers if id(s[1]) in held]:
                item.stored.set()  # the steering caller's 202 waits for this save
                turn.unsaved_steers.remove((item, message))
        self._publish_history()
        if turn is not None and adopted.shift:
            turn.start_index += adopted.shift
            turn.a_index += adopted.shift
        await self._concurrent(adopted, "rebased", req.turn_id)
        return result

    async def _sync(
        self, turn_id: str, *, reload: bool = False, stored: SessionRecord | None = None
    ) -> SessionRecord | None:
        """Before a turn: if another writer saved the session since this process last
        saw it, take its history (a version query; a load only when it moved), so the
        model sees that writer's turns. Bounded, and best effort: a save that meets the
        other writer's turns is rebased anyway.

        With ``reload`` (a turn resumed: its decisions were recorded by another writer,
        or taken over from another worker) the session has almost surely moved: it is
        loaded at once, one store round trip instead of a version query and a load; and
        when its caller hands the session as it just read or wrote it (``stored``: a
        continuation started in the process that recorded its decisions), none.

        Returns the stored session the history now holds, when this read it or was
        handed it (a continuation's first save keeps its rows: :attr:`Turn.began_from`),
        else ``None``."""
        state = self.state
        if self._absent_mark is not None:  # the previous turn's: read again, or not at all
            self._absent_mark = None
        if stored is not None and self._pending is None and stored.version == state.version:
            # The session as its caller just read it, at the version this process holds
            # (a worker's claim of a first turn hands its empty record): nothing to take,
            # and no bound entered to find that out (a cancel scope, as the SQLite path
            # below avoids; issue 24 goal 3).
            return stored
        if (
            stored is not None
            and self._pending is None
            and stored.version > state.version
            and (self.host.expects_other_writers or RUNNING_META not in stored.meta)
        ):
            # A continuation handed the session as this process's decision stored it
            # (``resume()``, ``respond``): nothing to wait for (no earlier save to adopt,
            # no read, nothing to settle), so no bound entered to take it (a cancel
            # scope: issue 21, the continuation's start; issue 24 goal 1).
            return await self._take_record(stored, turn_id)
        store = getattr(self.persister, "store", None)
        moved = False
        if self._pending is None and store is not None and stored is None and not reload:
            # A store that can read the version without waiting (SQLite's, while the file
            # is free) is asked so, outside the bound: a turn whose session did not move
            # then enters no cancel scope here (issue 24 goal 1). Anything else, as before.
            # A session this host holds nothing stored of: its deletion mark too, in the
            # same read (:meth:`_absent`).
            if state.version == 0:
                now = _version_mark_now(store, state.session_id)
                if now is not None and now[0] == 0:
                    self._absent_mark = now[1]
                    return None
                moved = now is not None
            else:
                version = _version_now(store, state.session_id)
                if version == state.version:
                    return None
                moved = version is not None
        with trio.move_on_after(SAVE_TIMEOUT):
            prev = self._pending
            if prev is not None:  # the previous turn's final save, if it outlived the turn
                await self._adopt(prev, None)
            if store is None:
                return None
            try:
                if stored is not None and stored.version >= state.version:
                    record: SessionRecord | None = stored  # (not older than ours)
                elif not reload and not moved and state.version == 0:
                    if await self._absent(store):
                        return None
                    record = await store.load(state.session_id)
                elif (
                    not reload
                    and not moved
                    and await store.version(state.session_id) == state.version
                ):
                    return None
                else:
                    record = await store.load(state.session_id)
                if (0 if record is None else record.version) == state.version:
                    # (``reload``) it had not moved after all: nothing to take, but its
                    # meta tells a takeover the turn's paused step, which the
                    # application's meta never holds (runtime.liveness.PRIVATE_META)
                    return record if reload else None
                if record is not None and not self.host.expects_other_writers:
                    # another process's turn, left running as it died: marked interrupted
                    # (runtime.liveness) before this one's turn reads it
                    record = await settle(store, record)
            except StoreError as exc:
                self._log.warning(
                    "session.reload-failed",
                    session_id=state.session_id,
                    turn_id=turn_id,
                    error=redact(describe_exception(exc)),
                )
                return None
            return await self._take_record(record, turn_id)
        return None

    async def _take_record(
        self, record: SessionRecord | None, turn_id: str
    ) -> SessionRecord | None:
        """:meth:`_sync`'s end: the history becomes ``record`` plus what this process had
        not saved (:func:`adopt_record`); said so when another writer's work came in."""
        adopted = adopt_record(self.state, record)
        if adopted.deleted:
            # The deleted conversation's title is the one this runner's turns carried
            # (a title set since, as a worker's next turn carries its front end's, is
            # the new conversation's); a runner that opened no turn yet knows none
            # but the one its host loaded, which the turn about to open carries.
            if self._held_title is NO_TURN:
                self._deleted_since = True
            else:
                self._stale_title = self._held_title
        self._publish_history()
        if adopted.concurrent:
            with trio.move_on_after(SAVE_TIMEOUT):  # (its event may wait for a full inbox)
                await self._concurrent(adopted, "reloaded", turn_id)
        return record

    async def _absent(self, store: Any) -> bool:
        """Whether the session, which this host holds nothing stored of, is still not
        stored; if so, its deletion mark (read with its version: one query, the one a
        turn makes anyway) is kept for the turn's saves (:attr:`SaveRequest.absent_mark`):
        should the first meet a session created meanwhile, the mark tells one deleted
        and created again since the turn began (refused) from a concurrent creator's
        (rebased)."""
        version, mark = await version_and_mark(store, self.state.session_id)
        if version:
            return False
        if mark is not None:
            self._absent_mark = mark
        return True

    async def _concurrent(self, adopted: Adopted, resolution: str, turn_id: str) -> None:
        """Say so (an event and a log line) when another writer's work came in: a warning,
        or a debug line on a host that expects other writers (a worker's)."""
        if not adopted.concurrent:
            return
        self.host.saw_other_writer()
        state = self.state
        expected = self.host.expects_other_writers
        log = self._log.debug if expected else self._log.warning
        log(
            "session.concurrent-writer",
            session_id=state.session_id,
            turn_id=turn_id,
            resolution=resolution,
            added=adopted.added,
            dropped=adopted.dropped,
            version=state.version,
        )
        await self.publish(
            ev.ConcurrentWrite(
                session_id=state.session_id,
                turn_id=turn_id,
                resolution=resolution,
                version=state.version,
                message_count=len(state.messages),
                added=adopted.added,
                dropped=adopted.dropped,
            )
        )

    async def _claim(self, turn: Turn, wanted: str | None) -> None:
        """Before a new turn's first model call on a host whose store is shared
        (:attr:`~runtime.hosting.TurnHost.claims_turns`): its user message saved, with
        the turn's empty answer and its running marker, and the answer waited for. The
        same message posted to another process at once (a balancer's retry) is then
        answered once: the second to save meets the first's answer after its copy of
        the message (:func:`~runtime.store.rebase`) and is refused before its model
        call, instead of at its end after a whole run. ``wanted`` is the client's id
        of the message: held already by a user message another process stored since
        (the id was not given to this turn's copy), it was answered there (or is
        being). Held by another kind of message (an answer's id, a client naming its
        message so), there is no twin: the turn runs, under the id it was given. A turn
        without a client's id (the OpenAI API has none) claims too: its running marker
        tells another process's front end the session runs a turn (``session_busy``),
        where a retry of the request (an SDK's, after a timeout) ran beside it.

        A failed claim is no refusal: the turn runs, its step saves try again."""
        messages = self.state.messages
        at = turn.a_index - 1  # (the turn's user message: the last before its answer)
        while at > 0 and type(messages[at]) is not UserMessage:
            at -= 1
        if wanted is not None and messages[at].id != wanted and _user_holds(messages, wanted):
            turn.refused = turn.elsewhere = True  # (nothing of it saved, now or later)
            raise AnsweredElsewhere(
                f"message {wanted!r} was answered by another process (the same message "
                "sent to two at once): its stored answer stands, this turn did not run",
                message_id=wanted,
            )
        result = await self._adopt(await self._save(turn, turn.step), turn)
        if isinstance(result.error, AnsweredElsewhere):
            turn.refused = turn.elsewhere = True  # (its last save would meet the same)
            raise result.error

    def _touching(self, turn: Turn) -> Touch | None:
        """Start refreshing ``turn``'s running marker while a long wait of its step runs
        (its model call, its tool calls: nothing else saves then), on a host whose store
        another process writes (:attr:`~runtime.hosting.TurnHost.claims_turns`) once a
        save stored the marker (:attr:`Turn.marked`): every :func:`touch_interval`, a save
        of the turn as its last step left it, the marker's ``at`` new. ``None`` (nothing
        started) on any other host, or when markers never expire. Stop it with
        :meth:`_touched` before the step changes the history.

        Why: another machine's host takes a marker older than ``AXON_RUNNING_MARKER_TTL``
        for a killed turn's; a step longer than that (a slow model, a long tool) had its
        turn settled as interrupted and its message run a second time while it still ran
        (branch ``markers``). A step shorter than the interval writes nothing more."""
        if not turn.marked or not self.host.claims_turns:
            return None
        every = touch_interval()
        if every is None:
            return None
        touch = Touch()
        self.host.nursery.start_soon(self._touch, turn, touch, every)
        return touch

    async def _touch(self, turn: Turn, touch: Touch, every: float) -> None:
        """:meth:`_touching`'s task: a save every ``every`` seconds until stopped. Each
        save is shielded (sent whole to the persister, or the turn's next save would name
        a request it never got); the step waits for one in flight (:meth:`_touched`).
        The previous save's answer is adopted before, unshielded (its bus event may wait)."""
        try:
            with touch.scope:
                while not turn.deleted:
                    await trio.sleep(every)
                    prev = self._pending
                    if prev is not None and self._answer(prev) is not None:
                        # Adopted out of the shield: its news of another writer waits
                        # for the bus (a ``block`` observer that stopped reading); there
                        # it held the step's end, and a cancel, a deadline, a closing
                        # host never ended the turn (branch attackmarkers).
                        await self._adopt(prev, turn)
                    with trio.CancelScope(shield=True):
                        # (a call held for approval: its step's save comes after the
                        # others ran; a refresh that took it for the end cleared the
                        # marker, the session idle to another process: attackmarkers)
                        await self._save(turn, turn.step, touch=True)
                        touch.saves += 1
        except SessionDeleted:  # (deleted while it ran: the step's save says so)
            pass
        except Exception as exc:  # (in the host's nursery: a failure here ends no host)
            self._log.error(
                "session.marker-refresh-failed",
                session_id=self.state.session_id,
                turn_id=turn.turn_id,
                error=redact(describe_exception(exc)),
            )
        finally:
            touch.done.set()

    async def _touched(self, touch: Touch | None) -> None:
        """Stop :meth:`_touching`'s refreshes; returns once a save in flight was sent
        (shielded: the turn's next save must follow it)."""
        if touch is None:
            return
        touch.scope.cancel()
        with trio.CancelScope(shield=True):
            await touch.done.wait()

    async def _bounded_save(self, turn: Turn) -> SaveResult | None:
        """The turn's final save, waited for at most ``SAVE_TIMEOUT`` seconds.

        When the last step's save (still in flight) already holds the turn as it ends (a
        turn that finished normally: nothing changed since), its answer is the final
        one: a second, identical write would cost a store round trip per turn for
        nothing (a transaction per turn on a PostgreSQL store).

        Shielded: a turn cancelled from outside (a host shutting down) still waits for
        its save, within the bound (the turn's end, :meth:`TurnRunner._finish_turn`,
        is shielded where it waits)."""
        with trio.move_on_after(SAVE_TIMEOUT, shield=True) as scope:
            pending = self._pending
            if pending is not None and (turn.deleted or self._holds_turn(pending, turn)):
                result = await self._adopt(pending, turn)
                # That step's save marked the answer's encoded parts to keep for the
                # next step's (runtime.serde.message_json); there is none in this
                # process (a turn suspended for a person, its answer asked again...).
                forget_encoded(turn.message_id)
                if result.error is None or turn.deleted:
                    return result
            if turn.deleted:  # refused already: a save now would only be refused again
                return None
            try:
                final = await self._save(turn, None, running=False)
            except SessionDeleted:  # the step's save, answered meanwhile, was refused
                return None
            return await self._adopt(final, turn)
        if scope.cancelled_caught:
            self._log.error(
                "session.save-timeout", session_id=self.state.session_id, turn_id=turn.turn_id
            )
        return None

    async def _discard_unsaved(self, turn: Turn) -> None:
        """The store refused ``turn``'s final save and the host forgets such turns
        (``serve``: its client is told ``not_saved``), or (any host, a library's too)
        the refusal said its message was answered by another process
        (:attr:`~actors.turn.turn_state.Turn.elsewhere`): the history becomes what the store
        holds (loaded again, bounded), so the session's next turn, one queued behind this
        one too, neither runs on nor saves what its client was told is not saved. Kept,
        the next turn's save wrote it, the client's reload showing the answer it had
        been told was lost; and content the store refuses (too large, not encodable)
        failed every later turn's save with it. The load gives the steps the store
        confirmed as it holds them (as a session closed and opened again would); a
        store that cannot be read leaves the history cut before the turn, its next save
        then written from there."""
        state = self.state
        cut = min(state.saved_upto, turn.start_index)
        del state.messages[cut:]
        state.saved_upto = cut
        store = getattr(self.persister, "store", None)
        with trio.move_on_after(SAVE_TIMEOUT, shield=True):
            try:
                record = None if store is None else await store.load(state.session_id)
            except Exception as exc:  # (any store's failure: the history stays cut)
                self._log.warning(
                    "session.reload-failed",
                    session_id=state.session_id,
                    turn_id=turn.turn_id,
                    error=redact(describe_exception(exc)),
                )
            else:
                if record is not None and record.version >= state.version:
                    adopt_record(state, record)
        self._publish_history()

    def _forget_deleted(self, meta: Mapping[str, Any]) -> None:
        """The session was deleted while a turn of it ran (its save refused): forget its
        history, so nothing of it is saved again; a later turn starts a new
        conversation, as a turn of a session never saved does. The title in ``meta`` (the
        refused turn's) is the deleted conversation's: not saved with a later turn that
        still carries it (``TurnRunner._turn_meta``: an embedded host holds it), which
        would name another writer's new conversation after it. Taken from the refused
        turn, not from the next one's meta: a worker's next turn carries the new
        conversation's own title (its front end's), which must be saved."""
        state = self.state
        state.messages.clear()
        state.saved_upto = 0
        state.version = 0
        self._stale_title = meta.get("title", NO_TITLE)
        self._publish_history()

    def _save_meta(self, turn: Turn, *, running: bool) -> Mapping[str, Any]:
        """The meta a save of ``turn`` writes: the turn's, with the marker that it runs in
        this process (:data:`~runtime.liveness.RUNNING_META`) when it goes on after the
        save, cleared (``None``) by its saves that do not once a save of it set one. A
        worker's host marks nothing: its turn queue knows which turns run.

        The turn's paused step (:data:`~runtime.liveness.PAUSED_META`, which only a
        turn that paused or took a paused one over holds) is cleared here, the one place,
        by a save the turn does not go on after: the step's that ends it (so the final
        save, the same, costs no write) and the final one; kept by a turn that waits
        for a person or was cut from outside (a worker's shutdown: another worker
        continues the pause)."""
        meta = turn.meta
        if not running and meta.get(PAUSED_META) is not None and not _goes_on_later(turn):
            meta = {**meta, PAUSED_META: None}
        if self.host.expects_other_writers:
            return meta
        if running:
            marker = running_marker(turn.turn_id, turn.message_id, self.host.marker_id)
            if marker is not None:
                turn.marked = True
                return {**meta, RUNNING_META: marker}
        elif turn.marked:
            return {**meta, RUNNING_META: None}
        return meta

    def _holds_turn(self, req: SaveRequest, turn: Turn) -> bool:
        """Whether ``req`` writes the session exactly as it is now (from the turn on),
        as the turn's final save would (its meta too: the running marker cleared)."""
        start = min(turn.start_index, self.state.saved_upto)
        return (
            req.start == start
            and req.meta == self._save_meta(turn, running=False)
            and len(req.messages) == len(self.state.messages) - start
            # the same objects: an equal message may hold values of other types
            and all(map(operator.is_, req.messages, self.state.messages[start:]))
        )


class Touch:
    """A running step's marker refreshes (:meth:`Saving._touching`)."""

    __slots__ = ("done", "saves", "scope")

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.saves = 0


def _goes_on_later(turn: Turn) -> bool:
    """Whether ``turn``, as its last save is written, may still be continued: it waits
    for a person (its calls held, or found waiting again), or was cut from outside."""
    return bool(turn.held) or turn.finish_reason == AWAITING_INPUT or turn.abort_reason is not None


def _version_mark_now(store: Any, session_id: str) -> tuple[int, int] | None:
    """``store.version_and_deletions_now(session_id)`` for a store that has it (the
    version and deletion mark in one read without waiting, or ``None`` when that would
    wait); ``None`` for any other store, or when the read fails (the bounded query then
    reads both, or meets the failure and says so)."""
    now = getattr(store, "version_and_deletions_now", None)
    if now is None:
        return None
    try:
        got = now(session_id)
    except StoreError:
        return None
    return got if isinstance(got, tuple) else None


def _version_now(store: Any, session_id: str) -> int | None:
    """``store.version_now(session_id)`` for a store that has it (the version read
    without waiting, or ``None`` when that would wait); ``None`` for any other store, or
    when the read fails (the bounded query then meets the failure and says so)."""
    now = getattr(store, "version_now", None)
    if now is None:
        return None
    try:
        version = now(session_id)
    except StoreError:
        return None
    return version if isinstance(version, int) and not isinstance(version, bool) else None
