"""Submitting turns: :meth:`TurnSubmitting.submit`, with its idempotency (retries,
replays and edits of a client's message), the queue's caps and the busy strategies
(``reject``, ``enqueue``, ``interrupt``, ``steer``: :mod:`runtime.busy`).

The front end's side of :class:`~actors.stores.turns.TurnQueue`: the input is checked,
encoded and hashed here (off the event loop), and one transaction
(:class:`_Submission`, safe to retry whole) applies the strategy, checks the caps and
inserts the row, or finds the turn a retry already stored.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import orjson
import trio

from actors.stores.turn_sql import (
    _COLUMNS,
    _STATUS_COLUMNS,
    TURNS_CHANNEL,
    _busy,
    _interrupt,
    _notify_turns,
    _status,
    _steer_running,
)
from runtime import serde
from runtime.busy import (
    ENQUEUE,
    HELD_STOP_FOR,
    HELD_STOP_ID_MAX,
    HELD_STOPS_KEPT,
    INTERRUPT,
    REJECT,
    STEER,
    OnBusy,
)
from runtime.errors import QueueFull, SessionBusy, StoreError, TurnConflict, TurnIdTaken
from runtime.logging import get_logger
from runtime.messages import File, Image, TextPart, UserContent
from runtime.store import validate_session_id
from runtime.turn_queue import FINAL_STATUSES, STEERED, QueuedTurn, TurnOptions, TurnStatus

if TYPE_CHECKING:
    from actors.stores.postgres import PostgresStore


@attrs.define(kw_only=True)
class _Submission:
    """One :meth:`TurnQueue.submit`, encoded, as its transaction runs it (retried whole
    by the store on a serialization failure: nothing here keeps state between tries)."""

    session_id: str
    turn_id: str
    message_key: str | None
    """The hashed idempotency key of the client's message, if it named one."""
    input_hash: str
    body: str
    """The input, encoded (JSON text)."""
    meta_json: bytes
    options_json: bytes
    regenerate: bool
    on_busy: OnBusy | None
    stop_name: str | None
    """The client's id a stop held before this submit names it by
    (:meth:`TurnSubmitting.hold_stop`), if the caller gave one."""
    named_turn: bool
    """Whether the caller chose the turn id (an AG-UI run's ``runId``): a stop held
    naming that id (:meth:`TurnSubmitting.hold_stop` without a message id) is this
    turn's, whatever its message (a new one, an edit, a regenerate)."""
    held_for: float
    """Seconds a held stop is kept (:data:`~runtime.busy.HELD_STOP_FOR`)."""
    check_room: Callable[[Any, str, str | None, str, bool], None]
    """The queue's caps before the insert (:meth:`TurnQueue._check_room`)."""
    check_total: Callable[[Any, str], None]
    """The queue's total cap after the insert, and the workers woken
    (:meth:`TurnQueue._check_total`)."""

    @property
    def large(self) -> bool:
        """Whether the row is large enough (:data:`LARGE_ROW`) that a submit the total cap
        will refuse should be refused before its insert, not after."""
        return len(self.body) + len(self.options_json) + len(self.meta_json) > LARGE_ROW

    def insert(
        self, conn: Any, key: str | None, regenerate: bool, *, new: bool = False
    ) -> tuple[Any, ...]:
        """Insert the turn (after the busy strategy and the caps), or find its twin.
        ``new``: a message never submitted before, which takes in the same statement a
        stop held for it (:meth:`TurnSubmitting.hold_stop`): the row's ``cancel_reason``
        without ``cancel_requested`` (:data:`HELD_STOP_INSERT`), which its worker stops
        as it starts; a stop it took names no steered message (it runs as a turn)."""
        session_id, turn_id, on_busy = self.session_id, self.turn_id, self.on_busy
        held = None
        name = self.stop_name if new else None  # (a retry's or an edit's: maybe late)
        by_turn = held_turn_name(turn_id) if self.named_turn else None
        if name is not None or by_turn is not None:
            held = (session_id, name, by_turn, self.held_for)
        stopped = None
        if on_busy == INTERRUPT:  # row locks first, as a claim takes them
            # (a stopped message interrupts nothing: the stop taken in that statement)
            stopped = _interrupt(conn, session_id, held)
            held = None
        steer_of = None  # (row locks first here too: the running turn's count of steers)
        if on_busy == STEER and not regenerate:
            steer_of = _steer_running(conn, session_id)
        self.check_room(conn, session_id, key, turn_id, self.large)
        if on_busy == REJECT and _busy(conn, session_id):
            raise SessionBusy(f"session {session_id!r} is already running a turn")
        values = (
            turn_id,
            session_id,
            key,
            self.message_key,
            self.input_hash,
            self.body,
            self.meta_json,
            regenerate,
            self.options_json,
            steer_of,
        )
        if held is not None:  # (one statement, as without)
            row = conn.execute(HELD_STOP_INSERT, (*held, *values)).fetchone()
        elif stopped is not None:  # taken by the interrupt's statement
            row = conn.execute(_STOPPED_INSERT, (*values[:-1], stopped)).fetchone()
        else:
            row = conn.execute(_INSERT, values).fetchone()
        if row is not None:
            self.check_total(conn, turn_id)  # counting this row, under the queue's lock
            return tuple(row)
        if key is not None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM axon_turns WHERE idempotency_key = %s", (key,)
            ).fetchone()
        else:  # its twin by turn id: this very submit (a retried transaction), or the
            # same key-less request sent twice, never another session's or message's turn
            row = conn.execute(
                f"""SELECT {_COLUMNS} FROM axon_turns WHERE turn_id = %s
                AND session_id = %s AND input_hash = %s AND regenerate = %s""",
                (turn_id, session_id, self.input_hash, regenerate),
            ).fetchone()
        if row is None:  # the conflict was on the turn id, another turn's
            raise TurnIdTaken(
                f"submit to session {session_id!r}: turn id {turn_id!r} is already used "
                f"by another turn"
            )
        return tuple(row)  # a twin of this submit committed first: the same turn

    def run(self, conn: Any) -> tuple[Any, ...]:
        """The submit's transaction: a new message, a replay of one, or an edit."""
        message_key, input_hash = self.message_key, self.input_hash
        if message_key is None:
            return self.insert(conn, None, self.regenerate)
        latest = conn.execute(
            """SELECT turn_id, session_id, seq, status, saved, input_hash FROM axon_turns
            WHERE message_key = %s ORDER BY seq DESC LIMIT 1""",
            (message_key,),
        ).fetchone()
        if latest is None:
            key = _sha256(orjson.dumps([message_key, input_hash]))
            return self.insert(conn, key, self.regenerate, new=True)
        old_id, old_session, seq, status, saved, old_hash = latest
        if old_session == self.session_id and old_hash != input_hash:
            return self.edit(conn, old_id, seq, status, saved)
        # a replay (or another session's key, refused below)
        return tuple(
            conn.execute(
                f"SELECT {_COLUMNS} FROM axon_turns WHERE turn_id = %s", (old_id,)
            ).fetchone()
        )

    def edit(self, conn: Any, old_id: str, seq: int, status: str, saved: bool) -> tuple[Any, ...]:
        """A message sent before with other content: its turn is replaced, if it may be."""
        session_id, message_key = self.session_id, self.message_key
        later = conn.execute(
            "SELECT 1 FROM axon_turns WHERE session_id = %s AND seq > %s LIMIT 1",
            (session_id, seq),
        ).fetchone()
        if later is not None:
            raise TurnConflict(
                f"submit to session {session_id!r}: this message was sent before with "
                "other content and later turns follow it; only the last message can be "
                "edited"
            )
        if status not in FINAL_STATUSES:
            raise TurnConflict(
                f"submit to session {session_id!r}: this message was sent before with "
                f"other content and its turn is still {status}; stop it, then edit"
            )
        # The key of an edit names the turn it replaces: editing back to an earlier
        # text is another edit, not a replay of that text's turn.
        key = _sha256(orjson.dumps([message_key, self.input_hash, old_id]))
        return self.insert(conn, key, self.regenerate or saved)


_INSERT = f"""INSERT INTO axon_turns (turn_id, session_id, idempotency_key,
        message_key, input_hash, input, meta, regenerate, options, steer_of)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT DO NOTHING RETURNING {_COLUMNS}"""

_STOPPED_COLUMNS = "cancel_reason, status, finish_reason, cancel_requested, finished_at"
"""What a new message's row that took a held stop sets besides its input."""

_STOPPED_VALUES = """s.reason,
        CASE WHEN s.waits THEN 'cancelled' ELSE 'queued' END,
        CASE WHEN s.waits THEN 'aborted' END,
        coalesce(s.waits, false),
        CASE WHEN s.waits THEN clock_timestamp() END"""
"""Their values, from ``s`` (``reason``; ``waits``: the session has a turn queued or
running, which this one would wait for or be steered into): cancelled at once then,
as a stop of a queued turn ends it, and as the embedded host takes such a message out
of its queue (nothing stored); else queued with the stop's reason alone, stopped by its
worker as it starts (its message saved, with an interrupted answer)."""

_WAITS = """EXISTS (SELECT 1 FROM axon_turns AS o
            WHERE o.session_id = t.session_id AND o.status IN ('queued', 'running'))"""

_STOPPED_INSERT = f"""WITH turn (turn_id, session_id, idempotency_key, message_key,
        input_hash, input, meta, regenerate, options, reason) AS (
        VALUES (%s, %s, %s, %s, %s, %s, %s::bytea, %s::boolean, %s::bytea, %s)
    )
    INSERT INTO axon_turns (turn_id, session_id, idempotency_key, message_key,
        input_hash, input, meta, regenerate, options, {_STOPPED_COLUMNS})
    SELECT t.turn_id, t.session_id, t.idempotency_key, t.message_key, t.input_hash,
        t.input, t.meta, t.regenerate, t.options, {_STOPPED_VALUES}
    FROM turn AS t, LATERAL (SELECT t.reason, {_WAITS} AS waits) AS s
    ON CONFLICT DO NOTHING RETURNING {_COLUMNS}"""
"""A new message's insert whose held stop the ``interrupt`` statement took
(``actors.stores.turn_sql._interrupt``): the row :data:`HELD_STOP_INSERT` leaves."""

HELD_STOP_INSERT = f"""WITH held AS (
        DELETE FROM axon_held_stops
        WHERE session_id = %s AND (message_id = %s OR message_id = %s)
            AND held_at >= clock_timestamp() - make_interval(secs => %s)
        RETURNING reason
    ), turn (turn_id, session_id, idempotency_key, message_key, input_hash, input, meta,
        regenerate, options, steer_of) AS (
        VALUES (%s, %s, %s, %s, %s, %s, %s::bytea, %s::boolean, %s::bytea, %s::text)
    ), unsteer AS (
        UPDATE axon_turns SET steers = steers - 1
        WHERE turn_id = (SELECT steer_of FROM turn) AND EXISTS (SELECT 1 FROM held)
    )
    INSERT INTO axon_turns (turn_id, session_id, idempotency_key, message_key,
        input_hash, input, meta, regenerate, options, steer_of, {_STOPPED_COLUMNS})
    SELECT t.turn_id, t.session_id, t.idempotency_key, t.message_key, t.input_hash,
        t.input, t.meta, t.regenerate, t.options,
        CASE WHEN s.reason IS NULL THEN t.steer_of END, {_STOPPED_VALUES}
    FROM turn AS t LEFT JOIN LATERAL (
        SELECT h.reason, {_WAITS} AS waits FROM held AS h LIMIT 1) AS s ON true
    ON CONFLICT DO NOTHING RETURNING {_COLUMNS}"""
"""A new message's insert that takes the stop held for it (by the client's id of its
message, or by its turn id when the client chose it: :func:`held_turn_name`), in one
statement. A stopped message steers nothing: the count of steers a ``steer`` submit
raised on the running turn first (``_steer_running``, for its row lock) is given back
(``unsteer``), so its worker's saves see no steering to read. When the session has a
turn queued or running the row is
``cancelled`` at once (:data:`_STOPPED_VALUES`). Else it is a queued row with a
``cancel_reason`` and no ``cancel_requested`` (no other writer leaves a row so: a
cancel of a queued turn ends it ``cancelled`` at once), a turn to stop as it starts.
Its claim takes it as any (a cancel requested would keep it from every claim: never
run, nothing of it stored), and its worker cancels its stream before the model call:
the user message saved, with an interrupted answer, as a stop just after it started
would leave it."""


class TurnSubmitting:
    """The turn queue's submits (mixed into :class:`~actors.stores.turns.TurnQueue`, whose
    store, caps and row decoding they use)."""

    held_stops_kept: int = HELD_STOPS_KEPT
    """Stops :meth:`hold_stop` keeps at most, the fleet's (the oldest dropped first)."""
    held_stop_for: float = HELD_STOP_FOR
    """Seconds a held stop is kept for the message it names."""

    if TYPE_CHECKING:  # provided by the turn queue
        store: PostgresStore
        max_queued_per_session: int | None
        max_queued: int | None
        retry_after: float

        async def _decoded(self, row: tuple[Any, ...]) -> QueuedTurn: ...

    async def submit(
        self,
        session_id: str,
        input: UserContent,
        *,
        idempotency_key: str | None = None,
        meta: dict[str, Any] | None = None,
        regenerate: bool = False,
        turn_id: str | None = None,
        options: TurnOptions | None = None,
        on_busy: OnBusy | None = None,
        stop_name: str | None = None,
    ) -> QueuedTurn:
        """Queue a turn for ``session_id`` and wake the workers; returns its row.

        ``on_busy`` is what the new turn does when the session has a turn queued or
        running (a front end's ``serve --on-busy``, :mod:`runtime.busy`), decided in the
        submit's transaction under the session's lock, so racing submits see each other:
        ``enqueue`` (or ``None``) queues it behind them; ``reject`` raises
        :class:`~runtime.errors.SessionBusy` and stores nothing; ``interrupt`` cancels
        the session's queued turns (``cancelled`` at once) and asks its running one to
        stop (abort reason ``interrupted by a new message``), then queues it: the newest
        message wins. (A turn that waits for input is neither: the new turn supersedes
        it.) ``steer`` queues it naming the session's running turn (``steer_of``; none
        running: an ordinary queued turn): that turn's worker takes it at its next step
        boundary (:meth:`take_steering`) and its save marks it ``done`` (``steered``);
        a turn that ends first leaves it queued, to run as a turn of its own. A
        retry of a turn already stored returns it whatever the strategy.

        ``idempotency_key`` names what the caller submits (a front end: the client's id of
        the message): submitting it again with the same input and ``regenerate`` (a retry
        whose answer was lost) returns the turn already queued, never a second one; so
        does a retried transaction, by ``turn_id``. The same key with another input is an
        *edit* of that message: when the key's latest turn is the session's last turn and
        has ended, a new turn replaces it (``regenerate``: the history then holds what the
        client shows, the edited message and its answer; an ordinary turn when the old one
        never reached the history);
        otherwise, and for a key already used by another session,
        :class:`~runtime.errors.TurnConflict` and nothing is queued. Meta is not part of
        the input: a retry may carry another title. Nor are ``options``
        (:class:`~runtime.turn_queue.TurnOptions`: the client's message id, client-side
        tools, instructions, a starting history), stored with the row for its worker.
        A submit over a cap (``max_queued_per_session``, ``max_queued``) is refused with
        :class:`~runtime.errors.QueueFull` and stores nothing.

        ``stop_name``: the client's id a stop names this message by (a front end's: its
        user message's, or the answer's a regenerate replaces). A keyed submit never
        made before takes the stop :meth:`hold_stop` kept under that id, in its insert:
        its worker stops the turn as it starts (its message saved, with an interrupted
        answer), and under ``interrupt`` it interrupts nothing. A retry or an edit
        takes none: a stop of that id may be a late one of the turn before.
        """
        validate_session_id(session_id)
        _check_names(session_id, idempotency_key, turn_id, on_busy)
        content = _check_input(input)
        body, input_hash, meta_json, options_json = await _serialized(
            session_id, content, regenerate, meta, options
        )
        named_turn = turn_id is not None
        turn_id = turn_id or f"turn_{uuid.uuid4().hex}"
        message_key = None if idempotency_key is None else _message_key(idempotency_key)
        submission = _Submission(
            session_id=session_id,
            turn_id=turn_id,
            message_key=message_key,
            input_hash=input_hash,
            body=body,
            meta_json=meta_json,
            options_json=options_json,
            regenerate=regenerate,
            on_busy=on_busy,
            stop_name=stop_name,
            named_turn=named_turn,
            held_for=self.held_stop_for,
            check_room=self._check_room,
            check_total=self._check_total,
        )
        row = await self.store.run(f"submit to session {session_id!r}", submission.run)
        turn = await self._decoded(row)
        if turn.session_id != session_id:
            # Taken, not by whom: the refusal's text reaches the client (a front end's
            # 409), and another session's id (or its turn's) is not this client's to
            # read. The operator's log line names both.
            used = "idempotency key" if idempotency_key is not None else "turn id"
            get_logger("axon.store.turns").info(
                "turn_queue.key_taken",
                session_id=session_id,
                used=used,
                other_session=turn.session_id,
                turn_id=turn.turn_id,
            )
            raise TurnConflict(
                f"submit to session {session_id!r}: this {used} is already used by "
                "another session; send the message under an id of its own"
            )
        return turn

    async def open_by_key(
        self, session_id: str, keys: Sequence[str], *, message_id: str | None = None
    ) -> TurnStatus | None:
        """The session's running turn submitted under one of ``keys`` (idempotency keys,
        as :meth:`submit` was given them), else its oldest such queued one, else the
        turn a message submitted so to steer it took in (``done``, :data:`STEERED`: the
        rest of that turn is the message's answer), if it is still open, else ``None``:
        a front end's stop naming a message by the client's id. At most one turn of a
        key is open at a time (an edit waits for its turn's end).

        With ``message_id`` (the client's id the keys were made of), also the open
        turn of the session whose answer it is (``msg_<turn id>``,
        :attr:`~runtime.turn_queue.TurnStatus.message_id`) once a decision continued it
        (``resumes``): the AI SDK continuation's ``messageId`` names the answer, and the
        continuation is keyed by its user message only. As the embedded host's
        ``TurnStream.named_by``: a turn not continued is not named by its answer."""
        validate_session_id(session_id)
        hashed = [_message_key(k) for k in keys if isinstance(k, str) and k]
        answered = (
            message_id.removeprefix("msg_")
            if message_id is not None and message_id.startswith("msg_")
            else None
        )
        if not hashed and answered is None:
            return None
        row = await self.store.run(
            f"open turn of a message of session {session_id!r}",
            lambda conn: conn.execute(
                f"""SELECT {_STATUS_COLUMNS} FROM axon_turns
                WHERE session_id = %s AND status IN ('running', 'queued')
                    AND (message_key = ANY(%s) OR (turn_id = %s AND resumes > 0)
                        OR turn_id = (
                        SELECT steer_of FROM axon_turns
                        WHERE message_key = ANY(%s) AND session_id = %s
                            AND status = 'done' AND finish_reason = %s
                        ORDER BY seq DESC LIMIT 1))
                ORDER BY status = 'running' DESC, seq LIMIT 1""",
                (session_id, hashed, answered, hashed, session_id, STEERED),
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else _status(row)

    async def hold_stop(
        self,
        session_id: str,
        message_id: str | None,
        keys: Sequence[str],
        reason: str,
        *,
        turn_id: str | None = None,
    ) -> None:
        """Keep a stop of ``session_id`` naming the client's message ``message_id``, whose
        turn a front end did not find: its POST may be on its way still (Stop and the
        POST race on two connections, maybe to two front ends). The submit that names
        it so (``stop_name``) takes it, once, within :attr:`held_stop_for` seconds. Not
        kept when a turn was ever submitted under one of ``keys`` (the idempotency keys
        the message's submits would have: a late stop, which an edit or a retry must not
        take), nor an id longer than :data:`HELD_STOP_ID_MAX`. The table stays bounded:
        each hold drops the stops past their time, then the oldest past
        :attr:`held_stops_kept` (two holds racing may each keep one more, for a moment).
        A stop sent twice is kept once, from its last sending. Two statements, one
        transaction; a submit racing it may miss it (its caller looks again).

        Nor one naming the answer of a turn of the session that was ever continued (its
        ``resumes``; the answer's id is ``msg_<turn id>``,
        :attr:`~runtime.turn_queue.TurnStatus.message_id`): a continuation is keyed by
        its user message, and a stop naming its answer that comes now is the
        continuation's, late, which a regenerate of that answer (named by it too) must
        not take (the embedded host's ``Session.continued``). A stop that also names a
        turn (``turn_id``: an AG-UI client knows its run's before the POST) is kept by
        its message id only while no turn has that id: one that exists is found, or
        ended, or is another message's. (Both checks in the insert's one statement.)

        A stop naming a turn only (``message_id`` ``None``: an AG-UI client's ``runId``,
        which names an edit or a regenerate too, where the message's id cannot tell an
        early stop from a late one) is kept under that turn id while no turn has it, for
        the submit that creates that turn (a caller's ``turn_id``), whatever it is."""
        validate_session_id(session_id)
        if message_id is None:
            if not turn_id or len(turn_id) > HELD_STOP_ID_MAX or "\x00" in turn_id:
                return
            message_id, keys = held_turn_name(turn_id), []
        elif not message_id or len(message_id) > HELD_STOP_ID_MAX or "\x00" in message_id:
            return
        elif message_id.startswith(_TURN_NAME):
            return  # (names no client's message: that is how a turn's stop is kept)
        hashed = [_message_key(k) for k in keys if isinstance(k, str) and k]
        kept, held_for = self.held_stops_kept, self.held_stop_for
        answered = message_id.removeprefix("msg_") if message_id.startswith("msg_") else None

        def hold(conn: Any) -> None:
            conn.execute(
                # (rows another hold is dropping are skipped, not waited for: two
                # holds never wait on each other here, so never deadlock)
                """DELETE FROM axon_held_stops WHERE ctid IN (
                    SELECT ctid FROM axon_held_stops
                    WHERE ctid IN (SELECT ctid FROM axon_held_stops
                            ORDER BY held_at DESC OFFSET %s)
                        OR held_at < clock_timestamp() - make_interval(secs => %s)
                    FOR UPDATE SKIP LOCKED)""",
                (max(kept - 1, 0), held_for),
            )
            conn.execute(
                """INSERT INTO axon_held_stops (session_id, message_id, reason)
                SELECT %s, %s, %s WHERE %s > 0 AND NOT EXISTS (
                    SELECT 1 FROM axon_turns WHERE message_key = ANY(%s) OR turn_id = %s
                        OR (turn_id = %s AND session_id = %s AND resumes > 0))
                ON CONFLICT (session_id, message_id) DO UPDATE
                SET reason = EXCLUDED.reason, held_at = EXCLUDED.held_at""",
                (session_id, message_id, reason, kept, hashed, turn_id, answered, session_id),
            )

        await self.store.run(f"stop held for a message of session {session_id!r}", hold)

    def _check_room(
        self,
        conn: Any,
        session_id: str,
        idempotency_key: str | None,
        turn_id: str,
        large: bool = False,
    ) -> None:
        """In the submit's transaction, before its insert: raise :class:`QueueFull` when
        the session is at its cap. Takes the session's lock (the one the head trigger
        takes, :data:`actors.stores.postgres_tables._HEAD_TRIGGER`), held to the commit,
        so two racing submits of the session count each other. A submit that repeats one
        already stored (same key or turn id) is never refused: it returns its turn.

        The queue's total cap is checked after the insert (:meth:`_check_total`), under
        the queue's lock, so that no submit holds that lock, which every submit of the
        fleet takes, while its row (megabytes, maybe: a client's history) is sent and
        written. A ``large`` row is first looked at here, without the lock: a queue
        already at its cap refuses it before it is sent, not after it was written."""
        per_session, total = self.max_queued_per_session, self.max_queued
        if per_session is None and total is None:
            return
        conn.execute(
            "SELECT pg_advisory_xact_lock("
            "hashtextextended('axon_turns:' || current_schema() || ':' || %s, 0))",
            (session_id,),
        )
        if idempotency_key is not None:
            where, key = "idempotency_key = %s", idempotency_key
        else:
            where, key = "turn_id = %s", turn_id
        if per_session is None:
            if conn.execute(f"SELECT 1 FROM axon_turns WHERE {where}", (key,)).fetchone():
                return
        else:
            # Each count reads at most its cap's index entries. ">= x AND <= x" (not
            # "= x") with ORDER BY keeps a prepared statement's generic plan on the
            # axon_turns_queued index, as in the head trigger
            # (actors.stores.postgres_tables._HEAD_FUNCTION). The look for a repeat is
            # in the same statement (a round trip fewer a submit): after the lock, as
            # the count.
            stored, count = conn.execute(
                f"""SELECT EXISTS (SELECT 1 FROM axon_turns WHERE {where}),
                (SELECT count(*) FROM (SELECT 1 FROM axon_turns
                WHERE session_id >= %s AND session_id <= %s AND status = 'queued'
                ORDER BY session_id, seq LIMIT %s) AS q)""",
                (key, session_id, session_id, per_session),
            ).fetchone()
            if stored:
                return
            if count >= per_session:
                raise QueueFull(
                    f"session {session_id!r} already has {count} turns queued (the limit); "
                    f"retry after {self.retry_after:g} s",
                    scope="session",
                    limit=per_session,
                    retry_after=self.retry_after,
                )
        if total is not None and large:  # a look without the lock: refused early
            (count,) = conn.execute(_COUNT_QUEUED, (total,)).fetchone()
            if count >= total:
                raise self._queue_full(count, total)

    def _check_total(self, conn: Any, turn_id: str) -> None:
        """In the submit's transaction, right after its insert (the row queued, not yet
        committed): raise :class:`QueueFull`, which rolls the insert back, when the queue
        holds more than its cap counting this row; otherwise the workers are woken for
        ``turn_id`` (a ``pg_notify``, sent at the commit: a rolled-back submit wakes
        none), in the count's statement where there is a cap (a round trip fewer). Takes
        the queue's lock first, held to the commit: the count (a statement after the
        lock, so a snapshot after every submit that held it before committed) sees every
        turn queued before, and every submit after waits for this one's commit and counts
        its row, so racing submits, of one process or many, never pass the cap. The lock
        is taken after the row is written, not before: the insert of a large row (its
        transfer, its compression, its WAL) holds no other submit of the fleet."""
        total = self.max_queued
        if total is None:
            _notify_turns(conn, turn_id)
            return
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended('axon_turns:' || current_schema(), 0))"
        )
        (count, _) = conn.execute(
            _COUNT_QUEUED_NOTIFY, (total + 1, TURNS_CHANNEL, turn_id)
        ).fetchone()
        if count > total:
            raise self._queue_full(count - 1, total)

    def _queue_full(self, count: int, total: int) -> QueueFull:
        return QueueFull(
            f"the turn queue already holds {count} queued turns (the limit); "
            f"retry after {self.retry_after:g} s",
            scope="total",
            limit=total,
            retry_after=self.retry_after,
        )


_TURN_NAME = "\x1fturn "
"""The start of the ``message_id`` a stop naming a turn only is kept under
(:func:`held_turn_name`): a unit separator, never in a client's message id that a stop
is kept for (such a stop is not kept)."""


def held_turn_name(turn_id: str) -> str:
    """The ``axon_held_stops.message_id`` of a stop naming turn ``turn_id`` only (no
    column of its own: the table's layout is unchanged)."""
    return _TURN_NAME + turn_id


LARGE_ROW = 64 * 1024
"""Bytes of a submit's input, options and meta past which the queue's total cap is looked
at before the insert too (:meth:`TurnSubmitting._check_room`): a refused row of that size
is not worth sending and writing only to roll it back; a small one is, the look costing
more than the insert."""

_COUNT_QUEUED = """SELECT count(*) FROM (SELECT 1 FROM axon_turns
    WHERE status = 'queued' ORDER BY seq LIMIT %s) AS q"""
"""The queued turns, up to a limit: reads at most that many index entries."""

_COUNT_QUEUED_NOTIFY = f"""SELECT ({_COUNT_QUEUED}), pg_notify(%s, current_schema() || ':' || %s)"""
""":data:`_COUNT_QUEUED` and the workers' wake-up of :func:`_notify_turns` in one statement."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _message_key(idempotency_key: str) -> str:
    """The ``message_key`` column of a submit's caller key: the key, hashed."""
    return _sha256(idempotency_key.encode("utf-8", "surrogatepass"))


def _encoded(content: UserContent) -> str:
    return serde.to_json(content).decode("utf-8")


def _encoded_and_hashed(content: UserContent, regenerate: bool) -> tuple[str, str]:
    """The input as stored, and the hash that tells a retry (same) from an edit."""
    body = _encoded(content)
    return body, _sha256(orjson.dumps([body, bool(regenerate)]))


def _check_input(input: Any) -> UserContent:
    """The input as :data:`~runtime.messages.UserContent`, or a clear error: plain text,
    or a sequence of text, image and file parts."""
    if isinstance(input, str):
        return input
    if isinstance(input, list | tuple):
        parts = tuple(input)
        for part in parts:
            if not isinstance(part, TextPart | Image | File):
                raise StoreError(
                    f"turn input parts must be TextPart, Image or File, not {type(part).__name__}"
                )
        return parts
    raise StoreError(f"turn input must be text or a sequence of parts, not {type(input).__name__}")


def _check_names(
    session_id: str, idempotency_key: str | None, turn_id: str | None, on_busy: OnBusy | None
) -> None:
    """A submit's keys and strategy are what they must be, or :class:`StoreError`."""
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str) or not idempotency_key
    ):
        raise StoreError(f"idempotency_key must be a non-empty string, not {idempotency_key!r}")
    if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
        raise StoreError(f"turn_id must be a non-empty string, not {turn_id!r}")
    if on_busy is not None and on_busy not in (ENQUEUE, REJECT, INTERRUPT, STEER):
        raise StoreError(
            f"submit to session {session_id!r}: on_busy {on_busy!r} is not one of "
            "enqueue, reject, interrupt, steer"
        )


async def _serialized(
    session_id: str,
    content: Any,
    regenerate: bool,
    meta: dict[str, Any] | None,
    options: TurnOptions | None,
) -> tuple[str, str, bytes, bytes]:
    """A submit's input (and its hash), meta and options as the row stores them; the
    input and options (megabytes, maybe: a history) encoded off the event loop. What
    cannot be serialized is a :class:`StoreError`."""
    try:
        body, input_hash = await trio.to_thread.run_sync(_encoded_and_hashed, content, regenerate)
        meta_json = orjson.dumps(dict(meta or {}))
        if options is None or options.empty:
            options_json = b"{}"
        elif options.history is None and not options.tools:
            # ids and flags (every chat POST's: the client's message id): a few hundred
            # bytes, not worth a thread's round trip on each submit
            options_json = serde.to_json(options)
        else:
            options_json = await trio.to_thread.run_sync(serde.to_json, options)
    except (TypeError, ValueError, orjson.JSONEncodeError) as err:
        raise StoreError(
            f"submit to session {session_id!r}: input or meta cannot be serialized: {err}"
        ) from err
    return body, input_hash, meta_json, options_json
