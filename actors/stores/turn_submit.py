"""Submitting turns: :meth:`TurnSubmitting.submit`, with its idempotency (retries,
replays and edits of a client's message), the queue's caps and the busy strategies
(``reject``, ``enqueue``, ``interrupt``, ``steer``: :mod:`runtime.busy`).

The front end's side of :class:`~actors.stores.turns.TurnQueue`: the input is checked,
encoded and hashed here (off the event loop when large), and one call of the submit's
server-side function (:data:`~actors.stores.postgres_calls.SUBMIT_FUNCTION`, safe to send
again whole) applies the strategy, checks the caps and inserts the row, or finds the
turn a retry already stored.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import orjson
import trio

from actors.stores.postgres_calls import (
    CLAIMED_COLUMNS,
    INTERRUPT_RACED,
    SUBMIT_FUNCTION_NAME,
    SUBMIT_REFUSALS,
)
from actors.stores.postgres_health import _retrying
from actors.stores.postgres_rows import read_row
from actors.stores.postgres_schema import recreate_submit_function
from actors.stores.turn_sql import (
    _STATUS_COLUMNS,
    CANCEL_CHANNEL,
    TURNS_CHANNEL,
    _status,
)
from runtime import serde
from runtime.busy import (
    ENQUEUE,
    HELD_STOP_FOR,
    HELD_STOP_ID_MAX,
    HELD_STOPS_KEPT,
    INTERRUPT,
    INTERRUPTED_BY_NEW,
    REJECT,
    STEER,
    OnBusy,
)
from runtime.errors import QueueFull, SessionBusy, StoreError, TurnConflict, TurnIdTaken
from runtime.logging import get_logger
from runtime.messages import File, Image, TextPart, UserContent
from runtime.store import validate_session_id
from runtime.turn_queue import STEERED, QueuedTurn, TurnOptions, TurnStatus

if TYPE_CHECKING:
    from actors.stores.postgres import PostgresStore


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
        # The key of a message never submitted before (an edit's names the turn it
        # replaces: the function makes it, as this did, from the turn it finds).
        new_key = None if message_key is None else _sha256(orjson.dumps([message_key, input_hash]))
        # A large row a queue at its cap will refuse is refused before its insert
        # (LARGE_ROW); a small one is counted after it, the look costing more.
        large = len(body) + len(options_json) + len(meta_json) > LARGE_ROW
        try:
            params = (
                session_id.encode(),
                turn_id.encode(),
                _text(message_key),
                input_hash.encode(),
                _text(new_key),
                body,
                meta_json,
                options_json,
                b"t" if regenerate else b"f",
                _text(on_busy),
                _text(stop_name),
                _text(held_turn_name(turn_id) if named_turn else None),
                repr(float(self.held_stop_for)).encode(),
                _number(self.max_queued_per_session),
                _number(self.max_queued),
                b"t" if large else b"f",
                TURNS_CHANNEL.encode(),
                CANCEL_CHANNEL.encode(),
                INTERRUPTED_BY_NEW.encode(),
            )
        except UnicodeEncodeError as err:  # (half a character: no text PostgreSQL stores)
            raise StoreError(
                f"submit to session {session_id!r}: its turn id or stop name cannot be "
                f"stored: {err}"
            ) from None
        row = await self._submit_call(session_id, turn_id, params, large)
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

    async def _submit_call(
        self, session_id: str, turn_id: str, params: tuple[bytes | None, ...], large: bool
    ) -> tuple[Any, ...]:
        """The submit's function called from the event loop
        (:class:`~actors.stores.postgres_lane.LoopLane`: one statement, in autocommit, no
        thread): the row it queued or found. A call sent again after a connection
        failure finds what the first one stored, if it committed (its key; unkeyed, its
        turn id, looked for before the call is sent again). A refusal
        (:data:`~actors.stores.postgres_calls.SUBMIT_REFUSALS`) raises the error it
        stands for: the call wrote nothing."""
        import psycopg

        store = self.store
        action = f"submit to session {session_id!r}"

        def refused(err: Any) -> Exception | None:
            refusal = SUBMIT_REFUSALS.get(err.sqlstate or "")
            if refusal is None:
                return None
            return self._refused(refusal, session_id, turn_id, err.diag.message_detail)

        if not hasattr(store, "_lane"):  # a test's stand-in around ``run``: in a thread
            values = tuple(
                value if value is None or i in _SUBMIT_BYTEA else value.decode()
                for i, value in enumerate(params)
            )

            def call(conn: Any) -> tuple[Any, ...]:
                try:
                    row = conn.execute(_SUBMIT_CALL, values).fetchone()
                except psycopg.Error as err:
                    refusal = refused(err)
                    if refusal is None:
                        raise
                    raise refusal from None
                if row is None:
                    raise StoreError(f"{action}: the turn of this message was deleted meanwhile")
                return tuple(row)

            return await store.run(action, call, transaction=False)
        if store._closed:
            raise StoreError(f"session store {store.url} is closed")

        # A call sent again after a connection failure runs whole: where its first try
        # committed (its answer lost), a keyed one replays, but an unkeyed ``reject``
        # met its own row (``SessionBusy`` for a turn that runs), an ``interrupt``
        # cancelled it (the message lost) and a ``steer`` counted itself twice. So an
        # unkeyed call's retry looks for its twin first (a retry's cost only).
        tries: list[int] = []
        twin = None if params[2] is not None else (params[1], params[0], params[3], params[8])

        async def once() -> Any:
            try:
                return await sent()
            except psycopg.errors.UndefinedFunction:
                # The function dropped (or not restored with the tables) since the open
                # created it: every submit failed until the process started again. It
                # is created again (the open's step) and called again, once.
                if recreated:
                    raise
                recreated.append(1)
                store._log.warning("store.retry", action=action, error="submit function missing")
                await store.run(
                    f"create the submit's function again ({SUBMIT_FUNCTION_NAME})",
                    partial(recreate_submit_function, schema=store.schema),
                )
                return await sent()

        recreated: list[int] = []

        async def sent() -> Any:
            if tries and twin is not None:
                found = await store._lane.call(_TWIN_NAME, _TWIN_SQL, twin, _TWIN_FORMATS, 1)
                if found.ntuples:
                    return found
            deadlocked = raced = 0
            while True:
                tries.append(1)
                try:
                    return await store._lane.call(
                        _SUBMIT_NAME, _SUBMIT_SQL, params, _SUBMIT_FORMATS, 1, _KEPT
                    )
                except psycopg.errors.DeadlockDetected:
                    # Interrupts racing in one session (each cancelling the rows the
                    # others lock, the head trigger moving the head on) are at times
                    # one another's deadlock: the call rolled back whole, so it is sent
                    # again (it was a StoreError, a front end's 500).
                    deadlocked += 1
                    if deadlocked == DEADLOCK_TRIES:
                        raise
                    store._log.warning("store.retry", action=action, error="deadlock detected")
                except psycopg.errors.SerializationFailure:
                    # An interrupt that found, its row inserted, a racing interrupt's
                    # turn it did not stop, or an edit a racing edit's turn of the
                    # message (INTERRUPT_RACED): rolled back whole, sent again, it
                    # stops that turn (the edit: a 409, or an edit of that turn).
                    # Past RACE_TRIES a clear 409.
                    raced += 1
                    if raced == RACE_TRIES:
                        raise TurnConflict(
                            f"submit to session {session_id!r}: other messages interrupted "
                            f"it at the same time ({raced} tries); nothing was queued, "
                            "send it again"
                        ) from None
                except psycopg.Error as err:
                    refusal = refused(err)
                    if refusal is None:
                        raise
                    raise refusal from None

        result = await _retrying(f"{action} ({store.url})", store._retry_for, once, log=store._log)
        if result.ntuples == 0:  # a replay whose turn was deleted meanwhile
            raise StoreError(f"{action}: the turn of this message was deleted meanwhile")
        if large:  # (its input, megabytes maybe, decoded off the loop)
            return await trio.to_thread.run_sync(read_row, result, 0, _SUBMIT_KINDS)
        return read_row(result, 0, _SUBMIT_KINDS)

    def _refused(
        self, refusal: str, session_id: str, turn_id: str, detail: str | None
    ) -> Exception:
        """The error a refusal of the submit's function stands for (``detail``: the
        count of a cap, the status of the turn an edit cannot replace)."""
        if refusal == "session":
            assert self.max_queued_per_session is not None
            return QueueFull(
                f"session {session_id!r} already has {detail} turns queued (the limit); "
                f"retry after {self.retry_after:g} s",
                scope="session",
                limit=self.max_queued_per_session,
                retry_after=self.retry_after,
            )
        if refusal == "total":
            assert self.max_queued is not None
            return self._queue_full(int(detail or 0), self.max_queued)
        if refusal == "busy":
            return SessionBusy(f"session {session_id!r} is already running a turn")
        if refusal == "later":
            return TurnConflict(
                f"submit to session {session_id!r}: this message was sent before with "
                "other content and later turns follow it; only the last message can be "
                "edited"
            )
        if refusal == "open":
            return TurnConflict(
                f"submit to session {session_id!r}: this message was sent before with "
                f"other content and its turn is still {detail}; stop it, then edit"
            )
        return TurnIdTaken(
            f"submit to session {session_id!r}: turn id {turn_id!r} is already used by another turn"
        )

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
at before the insert too (the submit's function, ``p_large``): a refused row of that size
is not worth sending and writing only to roll it back; a small one is, the look costing
more than the insert."""

DEADLOCK_TRIES = 4
"""Times a submit's call is sent when PostgreSQL ends it as part of a deadlock (the
call rolled back whole: sent again as it was), the last one's error raised. Four
processes interrupting one session 20 times each at once, 12 rounds: 16 of 960 failed
``deadlock detected`` without it; with it all 960 queued (13 sent again)."""

_SUBMIT_SQL: Final = (
    f"SELECT * FROM {SUBMIT_FUNCTION_NAME}(" + ", ".join(f"${i}" for i in range(1, 20)) + ")"
).encode()
"""The submit's function as :class:`~actors.stores.postgres_lane.LoopLane` prepares it."""
_SUBMIT_NAME: Final = b"axon_submit_call"
_SUBMIT_CALL: Final = f"SELECT * FROM {SUBMIT_FUNCTION_NAME}({', '.join(['%s'] * 19)})"
"""The same, as psycopg runs it (a store without a lane: a test's stand-in)."""
_SUBMIT_BYTEA: Final = frozenset({6, 7})
"""The positions of its ``bytea`` parameters (the meta, the options)."""
_SUBMIT_FORMATS: Final = (1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1)
"""Its parameters' formats: text and ``bytea`` in the binary one (their bytes as they
are, a NUL refused by the server, never cut short as a C string), the rest as text."""
_SUBMIT_KINDS: Final = tuple(kind for _, kind in CLAIMED_COLUMNS)
_TWIN_SQL: Final = (
    "SELECT " + ", ".join(name for name, _ in CLAIMED_COLUMNS) + " FROM axon_turns "
    "WHERE turn_id = $1 AND session_id = $2 AND input_hash = $3 AND regenerate = $4"
).encode()
"""The turn an unkeyed submit's first try stored, as its function's twin look finds it
(looked for by its retry before it calls again: ``_submit_call``)."""
_TWIN_NAME: Final = b"axon_submit_twin"
_TWIN_FORMATS: Final = (1, 1, 1, 0)
_REFUSED: Final = frozenset(SUBMIT_REFUSALS)
"""Its refusals' ``SQLSTATE`` s."""
_KEPT: Final = _REFUSED | {INTERRUPT_RACED}
"""The ``SQLSTATE`` s after which the lane keeps its connection (the call's own ends)."""

RACE_TRIES = 16
"""Times an interrupt's call is sent when it ends :data:`INTERRUPT_RACED` (another
interrupt of the session committed meanwhile, which the next call stops), the last one's
a :class:`~runtime.errors.TurnConflict` (a front end's 409): each round of racers commits
at least one, so N at once need at most N - 1 more. Six interrupts of one busy session
at once (two processes): every one queued, one survivor
(tests/test_submit_interrupt_race.py)."""


def _text(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def _number(value: int | None) -> bytes | None:
    return None if value is None else str(int(value)).encode()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _message_key(idempotency_key: str) -> str:
    """The ``message_key`` column of a submit's caller key: the key, hashed."""
    return _sha256(idempotency_key.encode("utf-8", "surrogatepass"))


def _encoded_and_hashed(content: UserContent, regenerate: bool) -> tuple[bytes, str]:
    """The input as stored (its UTF-8 JSON), and the hash that tells a retry (same) from
    an edit (of the text, as every version hashed it)."""
    body = serde.to_json(content)
    return body, _sha256(orjson.dumps([body.decode("utf-8"), bool(regenerate)]))


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
) -> tuple[bytes, str, bytes, bytes]:
    """A submit's input (and its hash), meta and options as the row stores them; the
    input and options (megabytes, maybe: a history) encoded off the event loop. What
    cannot be serialized is a :class:`StoreError`."""
    try:
        body, input_hash = await trio.to_thread.run_sync(_encoded_and_hashed, content, regenerate)
        meta_json = serde.dumps(dict(meta or {}))  # (an integer past 64 bits exactly)
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
