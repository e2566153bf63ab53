"""The turn queue's SQL shared by its parts (:mod:`actors.stores.turns`): column lists,
channels, statements, and the helpers that run inside another part's transaction.

A fenced save's steering and suspension (:func:`_mark_steered`, :data:`_SUSPEND`,
:func:`_first_deadline`), a decision's requeue (:func:`_resume_if_decided`) and the
guarded writes of a claimed turn's row (:func:`_write_once`) each run on a connection
some transaction of :class:`~actors.stores.turns.TurnQueue` already holds. They live
here, apart from the mixins that call them, so that those mixins share one definition of
the rows (:data:`_COLUMNS`, :data:`_STATUS_COLUMNS`) and of the wake-ups
(:func:`_notify_turns`) and import nothing from one another.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NoReturn

from actors.stores.postgres import LOCK_SESSION, LockedSession
from actors.stores.postgres_calls import CLAIMED_COLUMNS, STATUS_COLUMNS, SUPERSEDE
from runtime.approval import PendingCall, pending_calls
from runtime.errors import AlreadyDecided, UnknownApproval
from runtime.messages import AssistantMessage, Message, ToolCallPart
from runtime.turn_queue import STEERED, SUPERSEDED, WAITING, TurnStatus

TURNS_CHANNEL: Final = "axon_turns"
"""NOTIFY channel: a turn was submitted, released or finished. Channels are database-wide,
so the payload is ``<schema>:<turn id>`` and a queue ignores other schemas' turns."""
CANCEL_CHANNEL: Final = "axon_cancel"
"""NOTIFY channel: a turn's cancellation was requested (payload: its turn id)."""

_COLUMNS = ", ".join(name for name, _ in CLAIMED_COLUMNS)
_STATUS_COLUMNS = ", ".join(STATUS_COLUMNS)
"""What a status read selects: never ``input`` or ``meta``, which may be megabytes."""
_T_STATUS_COLUMNS = ", ".join(f"t.{c.strip()}" for c in _STATUS_COLUMNS.split(","))
"""The same, of a statement's ``t``."""
_STATUS_FIELDS = tuple(name.strip() for name in _STATUS_COLUMNS.split(","))


def _status(row: tuple[Any, ...]) -> TurnStatus:
    return TurnStatus(**dict(zip(_STATUS_FIELDS, row, strict=True)))


def _resume_if_decided(
    conn: Any, session_id: str, call: PendingCall, complete: bool
) -> tuple[TurnStatus, LockedSession | None]:
    """In a decision's save: lock the waiting turn's row, refuse the decision unless the
    turn still waits, and put the turn back to be claimed when the decision completes
    its calls. The row as it stands after, and the session's row when this locked it.

    The decision that completes its turn's calls (nearly every one) is one statement:
    the requeue's ``UPDATE`` is itself the check, ``WHERE`` the row is this session's and
    still waits, and the same statement then locks the session's row for the save
    (:data:`~actors.stores.postgres.LOCK_SESSION`: the turn's row first, then the
    session's, the order every save locks them in). The ``UPDATE`` locks the turn's row
    as the ``SELECT ... FOR UPDATE`` did, and a second decision racing it waits on that
    lock, then (read committed) re-evaluates the ``WHERE`` on the row the first
    committed, which no longer waits: it updates nothing and is refused, so of two
    exactly one wins, as before. Only then (a refusal, whose transaction rolls back
    anyway) does a plain read say why. The workers' wake-up rides in the statement (sent
    at the commit, and not at all if the transaction rolls back). A unique violation
    (another turn of the session runs) aborts the transaction, which the refusal rolls
    back: no savepoint is needed around it."""
    import psycopg

    turn_id = call.turn_id
    if not complete:
        row = conn.execute(
            f"SELECT {_STATUS_COLUMNS} FROM axon_turns WHERE turn_id = %s FOR UPDATE", (turn_id,)
        ).fetchone()
        if row is not None and row[1] == session_id and row[3] == WAITING:
            return _status(row), None
        _refuse_decision(row, session_id, call)
    try:
        got = conn.execute(
            f"""WITH t AS (
                UPDATE axon_turns SET status = 'running', owner = NULL,
                    lease_until = clock_timestamp() - interval '1 second',
                    resume_pending = true, resumes = resumes + 1, expires_at = NULL,
                    finish_reason = NULL
                WHERE turn_id = %s AND session_id = %s AND status = 'awaiting-input'
                RETURNING {_STATUS_COLUMNS},
                    pg_notify(%s, current_schema() || ':' || turn_id) AS notified
            )
            SELECT {_T_STATUS_COLUMNS}, s.meta, s.version
            FROM (VALUES (1)) AS one
            LEFT JOIN t ON true
            {LOCK_SESSION}""",
            (turn_id, session_id, TURNS_CHANNEL, session_id),
        ).fetchone()
    except psycopg.errors.UniqueViolation:  # another turn of the session runs: it won
        raise AlreadyDecided(
            f"{call.approval_id!r} can no longer be decided: a later message superseded it"
        ) from None
    if got[0] is not None:
        session = None if got[-1] is None else (got[-2], got[-1])
        return _status(got[:-2]), LockedSession(row=session)
    row = conn.execute(
        f"SELECT {_STATUS_COLUMNS} FROM axon_turns WHERE turn_id = %s", (turn_id,)
    ).fetchone()
    _refuse_decision(row, session_id, call)


def _refuse_decision(row: Any, session_id: str, call: PendingCall) -> NoReturn:
    """Why a decision for ``call`` cannot be recorded, its turn's row being ``row``:
    :class:`UnknownApproval` when there is none of this session's, else
    :class:`AlreadyDecided` (the turn no longer waits)."""
    if row is None or row[1] != session_id:
        raise UnknownApproval(f"no turn of this session waits for {call.approval_id!r}")
    status = _status(row)
    why = (
        "a later message superseded it"
        if status.finish_reason == SUPERSEDED
        else f"its turn is {status.status} now"
    )
    raise AlreadyDecided(f"{call.approval_id!r} can no longer be decided: {why}")


def _first_deadline(messages: Sequence[Message]) -> float | None:
    """The earliest ``expires_at`` of the calls ``messages`` (a save's, from the turn's
    user message on) still wait for, if any: the waiting row's ``expires_at``."""
    waiting = {c.tool_call_id for c in pending_calls(messages)}
    due = [
        p.awaiting.expires_at
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
        and p.tool_call_id in waiting
        and p.awaiting is not None
        and p.awaiting.expires_at is not None
    ]
    return min(due, default=None)


_SUPERSEDE = SUPERSEDE


def _mark_steered(conn: Any, turn_id: str, steered: list[str]) -> None:
    """In the save that stores them: the messages turn ``turn_id`` took are ``done``
    (``steered``), and whoever waits for them (their front end) is woken."""
    rows = conn.execute(
        """UPDATE axon_turns SET status = 'done', finish_reason = %s,
            finished_at = clock_timestamp()
        WHERE turn_id = ANY(%s) AND steer_of = %s AND status = 'queued'
        RETURNING turn_id""",
        (STEERED, steered, turn_id),
    ).fetchall()
    for (done,) in rows:
        _notify_turns(conn, done)


_SUSPEND = """UPDATE axon_turns SET status = 'awaiting-input', owner = NULL,
        lease_until = NULL, finish_reason = 'awaiting-input', expires_at = %s
    WHERE turn_id = %s AND owner = %s AND epoch = %s AND status = 'running'
    RETURNING turn_id"""
"""A held turn's row becomes ``awaiting-input`` with no owner and no lease (params: the
wait's expiry, then turn id, owner, epoch): in the step's own save, or on its own."""


def _write_once(
    conn: Any, update: str, params: Sequence[Any], retried: str, retried_params: Sequence[Any]
) -> bool:
    """One guarded write of a claimed turn's row (its end, release or suspension), made
    once even when retried. ``update`` (owner and epoch in its ``WHERE``, ``RETURNING
    turn_id``) wakes the workers when it wrote; when it found nothing, ``retried`` says
    whether a retry's first COMMIT, whose answer was lost, already wrote it."""
    # The wake-up rides on the write: one statement, so a caller may run it alone, in
    # autocommit (its effect and its notification commit together either way).
    row = conn.execute(
        f"WITH w AS ({update}) SELECT pg_notify(%s, current_schema() || ':' || w.turn_id) FROM w",
        (*params, TURNS_CHANNEL),
    ).fetchone()
    if row is not None:
        return True
    return conn.execute(retried, retried_params).fetchone() is not None


def _notify_turns(conn: Any, turn_id: str) -> None:
    """Wake the workers of this schema (sent when the transaction commits)."""
    conn.execute("SELECT pg_notify(%s, current_schema() || ':' || %s)", (TURNS_CHANNEL, turn_id))
