"""Turns that wait for a person, and turns ended from outside their worker: a claimed
turn's suspension, a person's decision that resumes it (:meth:`TurnDecisions.decide`),
expired waits handed to one worker at a time, and cancellations.

The approvals' side of :class:`~actors.stores.turns.TurnQueue` (docs/approval.md): a
decision is recorded in the session's save together with its turn's row
(:func:`~actors.stores.turn_sql._resume_if_decided`), so exactly one decision resumes a
turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from actors.stores.postgres import LockedSession, decision_written
from actors.stores.turn_sql import (
    _STATUS_COLUMNS,
    _SUSPEND,
    CANCEL_CHANNEL,
    _notify_turns,
    _refuse_decision,
    _resume_if_decided,
    _status,
    _write_once,
)
from actors.stores.validation import encode_rows
from runtime.approval import Decision, PendingCall, record_decision
from runtime.errors import AlreadyDecided
from runtime.messages import Message
from runtime.store import SessionRecord, validate_session_id
from runtime.turn_queue import QUEUED, RUNNING, WAITING, Decided, TurnStatus
from runtime.turn_queue import Claim as BaseClaim

if TYPE_CHECKING:
    from actors.stores.postgres import PostgresStore


EXPIRY_HOLD: Final = 60.0
"""Seconds a waiting turn handed out by :meth:`TurnQueue.take_expired` is held back from
other workers (one that died meanwhile leaves it to the next look after that)."""


class _Written(Exception):
    """Raised by a decision's guard, in a retried transaction, that found the try before
    committed this very decision: the retry ends there (rolled back: it wrote nothing)
    and the decision is reported recorded, at the version that write gave the session."""

    def __init__(self, *, version: int, row: tuple[Any, ...]) -> None:
        super().__init__(version)
        self.version = version
        self.row = row


class TurnDecisions:
    """The turn queue's waits, decisions and cancellations (mixed into
    :class:`~actors.stores.turns.TurnQueue`, whose store they write)."""

    if TYPE_CHECKING:  # provided by the turn queue
        store: PostgresStore

    async def suspend(self, claim: BaseClaim, *, expires_at: float | None = None) -> bool:
        """The claimed turn suspended for input (docs/approval.md): its row becomes
        ``awaiting-input`` with no owner and no lease, holding nothing (a later turn of
        the session may run: it supersedes the wait), until a decision puts it back
        (:meth:`decide`) or, past ``expires_at``, a worker expires it
        (:meth:`take_expired`). ``False`` (nothing written) if the worker no longer held
        the turn. A retry whose first COMMIT went through finds its write."""
        key = (claim.turn.turn_id, claim.owner, claim.epoch)

        def suspend(conn: Any) -> bool:
            return _write_once(
                conn,
                _SUSPEND,
                (expires_at, *key),
                "SELECT 1 FROM axon_turns WHERE turn_id = %s AND epoch = %s "
                "AND status = 'awaiting-input'",
                (claim.turn.turn_id, claim.epoch),
            )

        return bool(await self.store.run(f"suspend of turn {claim.turn.turn_id}", suspend))

    async def decide(
        self,
        session_id: str,
        key: str,
        decision: Decision,
        tools: Mapping[str, Any],
        *,
        known: SessionRecord | None = None,
        max_chars: int | None = None,
    ) -> Decided:
        """Record ``decision`` for the waiting call ``key`` of session ``session_id``
        together with its turn's row, in the save's transaction (the row locked first,
        as a fenced save locks it): refused with :class:`~runtime.errors.AlreadyDecided`
        unless the turn still waits (a later turn superseded it, a decision resumed it),
        :class:`~runtime.errors.UnknownApproval` when the call is not this session's.
        When the decision is the last its turn waited for, the row goes back to
        ``running`` with no owner, a lapsed lease and ``resume_pending``: the next claim
        of any worker runs the continuation (:attr:`~runtime.turn_queue.Claim.resumed`).
        Of two decisions for one call exactly one is recorded (the session's version
        check), and exactly one decision completes a turn's set, so one resumes it.

        On PostgreSQL the save, the row's check and its requeue are one call of the
        decision's function sent from the event loop
        (:meth:`~actors.stores.postgres.PostgresStore.save_decision`); a stored meta the
        function cannot merge, and a store without a lane, save in the transaction with
        :func:`~actors.stores.turn_sql._resume_if_decided` as its guard.

        The decision reads the session's last turn (:meth:`_last_turn`), not all of it;
        ``known``, the session as the caller read it a moment ago (a front end that
        checked a body's answers on it), is decided on first instead of reading it
        again: the decision is then the function's one call, whose version check says
        whether the view was what the store held (a conflict reads the last turn and
        decides again; a view that refuses is not believed, the store is read)."""
        validate_session_id(session_id)
        rows: list[TurnStatus] = []

        async def save(
            *,
            start: int,
            messages: Sequence[Message],
            meta: Mapping[str, Any],
            expected_version: int,
            call: PendingCall,
            complete: bool,
        ) -> int:
            rows.clear()
            if hasattr(self.store, "_lane"):  # one call from the event loop
                said, version, row = await self._save_decision(
                    session_id,
                    call,
                    start=start,
                    messages=messages,
                    meta=meta,
                    expected_version=expected_version,
                    complete=complete,
                )
                if said == "ok":
                    assert version is not None and row is not None
                    rows.append(_status(row))
                    return version
                if said == "refused":
                    _refuse_decision(row, session_id, call)
                # "meta": merged by the client, in the transaction below

            tries = 0

            def guard(conn: Any) -> LockedSession | None:
                nonlocal tries
                tries += 1
                if tries > 1:
                    # A retry (the store retries a connection's failure): the try before
                    # may have committed and lost only its answer. Its own write found,
                    # the decision is recorded; told "already decided", the person whose
                    # decision is the one stored would try again or give up. Recognised
                    # as the one call's retry recognises it: by what the session's last
                    # write stored (another's different decision is refused below).
                    bodies = [row[3] for row in encode_rows(session_id, start, messages)]
                    mine = decision_written(conn, session_id, call.turn_id, start, bodies)
                    if mine is not None:
                        raise _Written(version=mine[0], row=mine[1])
                status, locked = _resume_if_decided(conn, session_id, call, complete)
                rows.append(status)
                return locked

            try:
                return await self.store.save(
                    session_id,
                    start,
                    messages,
                    meta,
                    expected_version=expected_version,
                    guard=guard,
                    # Not the turn's own write: a worker running the turn (its step's
                    # commit suspended the row a moment ago) must not fence out the
                    # decision for it.
                    unfenced=True,
                )
            except _Written as written:
                rows.append(_status(written.row))
                return written.version

        last_turn = None
        if hasattr(self.store, "_lane"):

            async def last_turn() -> tuple[int, SessionRecord] | None:
                return await self._last_turn(session_id)

        recorded = await record_decision(
            self.store,
            session_id,
            key,
            decision,
            tools,
            save=save,
            known=known,
            last_turn=last_turn,
            max_chars=max_chars,
        )
        return Decided(recorded=recorded, turn=rows[-1])

    async def _last_turn(self, session_id: str) -> tuple[int, SessionRecord] | None:
        """The session's last turn as a decision reads it
        (:meth:`PostgresStore.load_last_turn
        <actors.stores.postgres.PostgresStore.load_last_turn>`): where the decision
        loaded the whole session in a thread (a hop, every message decoded), it decodes
        the last turn's messages, on the loop."""
        return await self.store.load_last_turn(session_id)

    async def _save_decision(
        self, session_id: str, call: PendingCall, **save: Any
    ) -> tuple[str, int | None, tuple[Any, ...] | None]:
        """:meth:`PostgresStore.save_decision
        <actors.stores.postgres.PostgresStore.save_decision>` for ``call``, another
        running turn of the session (a later message started one) refused as the
        transaction refuses it."""
        import psycopg

        try:
            return await self.store.save_decision(session_id, turn_id=call.turn_id, **save)
        except psycopg.errors.UniqueViolation:  # another turn of the session runs: it won
            raise AlreadyDecided(
                f"{call.approval_id!r} can no longer be decided: a later message superseded it"
            ) from None

    async def now(self) -> float:
        """PostgreSQL's clock (:meth:`PostgresStore.now
        <actors.stores.postgres.PostgresStore.now>`): the one clock every worker's wait
        deadlines are set and expired by, so a worker whose own wall clock is off neither
        cuts a person's wait short nor stretches it (:class:`runtime.clocks.AnchoredClock`)."""
        return float(await self.store.now())

    async def take_expired(self, now: float, limit: int = 100) -> list[TurnStatus]:
        """Waiting turns whose ``expires_at`` is at or before ``now`` (the queue's clock,
        :meth:`now`, as the deadline was stored), oldest deadline first. Each is held back from
        other callers for :data:`EXPIRY_HOLD` seconds (its deadline moved on by that
        much), so two workers looking at once do not both expire it; the one that does
        sets its next deadline (:meth:`set_expiry`) or resumes it."""

        def take(conn: Any) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = conn.execute(
                f"""UPDATE axon_turns SET expires_at = %s
                WHERE turn_id IN (SELECT turn_id FROM axon_turns
                    WHERE status = 'awaiting-input' AND expires_at <= %s
                    ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED)
                RETURNING {_STATUS_COLUMNS}""",
                (now + EXPIRY_HOLD, now, limit),
            ).fetchall()
            return rows

        rows = await self.store.run("expired waits", take)
        return [_status(row) for row in rows]

    async def set_expiry(self, turn_id: str, expires_at: float | None) -> None:
        """The waiting turn's next deadline (``None``: none), once some of its calls
        expired and others still wait; a turn that no longer waits is left alone."""
        await self.store.run(
            f"expiry of turn {turn_id}",
            lambda conn: conn.execute(
                "UPDATE axon_turns SET expires_at = %s "
                "WHERE turn_id = %s AND status = 'awaiting-input'",
                (expires_at, turn_id),
            ),
        )

    async def request_cancel(
        self, turn_id: str, reason: str = "cancelled", *, waiting: bool = False
    ) -> TurnStatus | None:
        """Cancel a turn: a queued one ends ``cancelled`` at once (finish reason
        ``aborted``); a running one is marked, and its worker stops it on its next renewal
        (or at once, listening on ``axon_cancel``). With ``waiting``, a turn that waits
        for input ends ``cancelled`` at once too (nothing holds it, and no decision
        resumes it any more); without, it is left waiting, as a finished turn is left as
        it is. Returns where the turn now stands, or ``None`` if there is no such turn."""
        ends_now = (QUEUED, WAITING) if waiting else (QUEUED,)

        def cancel(conn: Any) -> tuple[Any, ...] | None:
            row = conn.execute(
                "SELECT status FROM axon_turns WHERE turn_id = %s FOR UPDATE", (turn_id,)
            ).fetchone()
            if row is None:
                return None
            if row[0] in ends_now:
                conn.execute(
                    """UPDATE axon_turns SET status = 'cancelled', finish_reason = 'aborted',
                        cancel_requested = true, cancel_reason = %s, expires_at = NULL,
                        finished_at = clock_timestamp()
                    WHERE turn_id = %s""",
                    (reason, turn_id),
                )
                _notify_turns(conn, turn_id)
            elif row[0] == RUNNING:
                conn.execute(
                    """UPDATE axon_turns SET cancel_requested = true,
                        cancel_reason = coalesce(cancel_reason, %s)
                    WHERE turn_id = %s""",
                    (reason, turn_id),
                )
            if row[0] in (QUEUED, RUNNING):
                conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, turn_id))
            current: tuple[Any, ...] = conn.execute(
                f"SELECT {_STATUS_COLUMNS} FROM axon_turns WHERE turn_id = %s", (turn_id,)
            ).fetchone()
            return current

        row = await self.store.run(f"cancel of turn {turn_id}", cancel)
        return None if row is None else _status(row)
