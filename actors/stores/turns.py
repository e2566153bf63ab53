"""Turns as durable work: a queue of user inputs in PostgreSQL that any worker may run.

Many worker processes share sessions through one :class:`~actors.stores.postgres.PostgresStore`.
A front end :meth:`TurnQueue.submit`\\ s a user input; it becomes a row of ``axon_turns``
(status ``queued``). A worker :meth:`~TurnQueue.claim`\\ s it: the row turns ``running``
under the worker's name (``owner``) and a new ``epoch``, with a lease (``lease_until``,
on the database's clock, so workers' clocks never matter) the worker keeps by
:meth:`~TurnQueue.renew`. When the turn ends the worker :meth:`~TurnQueue.finish`\\ es it.

**Why a lease and an epoch.** A worker that dies (or hangs) stops renewing; once its lease
has expired the next claim *takes the turn over*: ``epoch + 1``, the new owner. The old
worker, if it was only slow, is fenced out: its saves of the session
(:meth:`Claim.fence` with :meth:`PostgresStore.fenced
<actors.stores.postgres.PostgresStore.fenced>`), renewals and finish all check
``(owner, epoch, running)`` in their own transaction and write nothing once another
worker holds the turn. The runner that takes over resumes from the steps the session has
committed; the assistant message keeps one id for the turn (:attr:`QueuedTurn.message_id`)
so a resumed turn continues the same message rather than adding a second one.

**Order.** Turns of one session run one at a time, in submission order: a queued turn is
claimable only when its session has no running turn and no older queued turn, and the
partial unique index ``axon_turns_one_running`` makes two running turns of one session
impossible even when two claims race (the loser claims nothing). Turns of different
sessions run in parallel on any workers. A trigger keeps ``head`` true on each session's
oldest queued turn (:data:`actors.stores.postgres._HEAD_TRIGGER`), and a claim walks only
those, in the order they became heads: its cost does not grow with one session's
backlog, and a session with thousands queued holds one place in line (its next turn joins
the line's end when the previous one starts), so another session's single turn waits for
at most one turn of it.

**Caps.** A submit beyond ``max_queued_per_session`` queued turns in its session, or
``max_queued`` in the queue, is refused (:class:`~runtime.errors.QueueFull`): queued
turns are work that will run and cost tokens, and a client can queue them faster than any
worker runs them.

**Poison turns.** Every claim counts an attempt. A turn whose attempts reached
``max_attempts`` when its lease expires again (it keeps killing or hanging its workers)
becomes ``failed`` instead of being taken over, so it cannot block its session forever.
A worker shutting down :meth:`~TurnQueue.release`\\ s its turn: the next claim takes it
over at once, and the release gives the attempt back, so graceful restarts never fail a
turn.

**Turns that wait for a person.** A turn that suspends for approval (docs/approval.md)
is :meth:`~TurnQueue.suspend`\\ ed by its worker: ``awaiting-input``, no owner, no lease,
so it holds nothing and its session's next turn may run (that claim marks the wait
``done``, ``superseded``). :meth:`~TurnQueue.decide` records a decision in the session's
save transaction together with the row (refused unless it still waits); the decision
that completes the turn's calls puts the row back (``running``, no owner, a lapsed
lease, ``resume_pending``), and the next claim is its continuation
(:attr:`~runtime.turn_queue.Claim.resumed`). :meth:`~TurnQueue.take_expired` hands a
wait whose ``expires_at`` passed to one worker at a time.

**Waking workers.** Submitting or finishing a turn sends ``NOTIFY axon_turns`` in its
transaction; :meth:`~TurnQueue.wait` blocks on a dedicated ``LISTEN`` connection until
one arrives, so idle workers claim new work at once without polling the table.
Cancelling a running turn sends ``NOTIFY axon_cancel`` with the turn id; its worker also
learns of it on its next renewal (:attr:`Renewal.cancel_requested`).

**Failures.** Every query runs through :meth:`PostgresStore.run
<actors.stores.postgres.PostgresStore.run>`, so a restarting server is retried with
backoff. A retried transaction must be safe to run twice, and each here is: a submit
finds its own row (by idempotency key or turn id), a finish or release whose COMMIT
answer was lost recognizes its own write. A claim whose answer was lost leaves a turn
running under an epoch its worker never learnt; its lease expires and another worker
takes it over.

**Its parts.** :class:`TurnQueue` is composed here of one mixin per concern, each in a
module of its own, so that each can be read (and reviewed) apart:
:mod:`~actors.stores.turn_submit` (submits: idempotency, caps, busy strategies),
:mod:`~actors.stores.turn_claims` (claims, leases, fences, finish and release),
:mod:`~actors.stores.turn_decisions` (waits for a person, decisions, expiries,
cancellations), :mod:`~actors.stores.turn_listen` (the workers' ``LISTEN``) and
:mod:`~actors.stores.turn_reads` (reads, and the decoding of a row), over the SQL they
share (:mod:`~actors.stores.turn_sql`). Only this module imports them all; every name
the rest of Axon uses is imported from here.
"""

from __future__ import annotations

from typing import Final

import trio

from actors.stores.postgres import PostgresStore
from actors.stores.turn_claims import RESUMED, STARTED, TAKEOVER, Claim, TurnClaiming
from actors.stores.turn_decisions import EXPIRY_HOLD, TurnDecisions
from actors.stores.turn_listen import TurnListening, _Listener
from actors.stores.turn_reads import DECODE_INLINE, TurnReads
from actors.stores.turn_sql import CANCEL_CHANNEL, TURNS_CHANNEL
from actors.stores.turn_submit import TurnSubmitting
from runtime.log_repeats import RepeatedWarning
from runtime.logging import get_logger
from runtime.turn_queue import (
    CANCELLED,
    DONE,
    FAILED,
    FINAL_STATUSES,
    QUEUED,
    RUNNING,
    SUPERSEDED,
    WAITING,
    Decided,
    QueuedTurn,
    Renewal,
    TurnStatus,
)
from runtime.turn_queue import TurnQueue as TurnQueueProtocol

DEFAULT_MAX_QUEUED_PER_SESSION: Final = 100
"""Queued turns one session may hold (more than anyone types ahead of an answer)."""
DEFAULT_MAX_QUEUED: Final = 10_000
"""Queued turns the whole queue may hold (every one will run and cost tokens)."""
DEFAULT_RETRY_AFTER: Final = 5.0
"""Seconds a refused submit is told to wait (:attr:`QueueFull.retry_after`)."""


class TurnQueue(TurnSubmitting, TurnClaiming, TurnDecisions, TurnListening, TurnReads):
    """Durable turns in ``store``'s ``axon_turns`` table; see the module docstring.

    ``lease`` is how long (seconds) a claim or renewal holds a turn: a worker renews well
    within it (a third is usual), and a worker that stopped renewing loses the turn that
    long after its last renewal. ``max_attempts`` bounds how many claims one turn gets.

    ``max_queued_per_session`` and ``max_queued`` cap the turns waiting (``queued``) in
    one session and in the whole queue: a submit over either is refused with
    :class:`~runtime.errors.QueueFull` (telling the caller to retry after
    ``retry_after`` seconds), so a client that submits and hangs up in a loop cannot
    queue unbounded work, each of which would run and cost tokens. ``None`` turns a cap
    off. The caps are checked in the submit's transaction under locks (the session's,
    then the queue's), so racing submits never exceed them.
    """

    def __init__(
        self,
        store: PostgresStore,
        *,
        lease: float = 10.0,
        max_attempts: int = 3,
        max_queued_per_session: int | None = DEFAULT_MAX_QUEUED_PER_SESSION,
        max_queued: int | None = DEFAULT_MAX_QUEUED,
        retry_after: float = DEFAULT_RETRY_AFTER,
    ):
        if not lease > 0:
            raise ValueError(f"lease must be positive seconds, not {lease!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts!r}")
        for name, cap in (
            ("max_queued_per_session", max_queued_per_session),
            ("max_queued", max_queued),
        ):
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
                raise ValueError(f"{name} must be a positive integer or None, not {cap!r}")
        if not retry_after >= 0:
            raise ValueError(f"retry_after must be non-negative seconds, not {retry_after!r}")
        self.store = store
        self.lease = float(lease)
        self.max_attempts = max_attempts
        self.max_queued_per_session = max_queued_per_session
        self.max_queued = max_queued
        self.retry_after = float(retry_after)
        self._listen: _Listener | None = None
        self._wait_lock = trio.Lock()
        self._closed = False
        self._log = get_logger("axon.store.turns")
        self._listen_failed = RepeatedWarning("axon.store.turns", "turns.listen_failed")
        """``LISTEN`` connections that could not be opened (the server down: one a
        poll), logged at once and then with a count (:mod:`runtime.log_repeats`)."""


def as_protocol(queue: TurnQueue) -> TurnQueueProtocol:
    """``queue`` as the contract's :class:`runtime.turn_queue.TurnQueue`: a function only so
    that the type checker proves this queue satisfies the protocol."""
    return queue


__all__ = [
    "CANCELLED",
    "CANCEL_CHANNEL",
    "DECODE_INLINE",
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_PER_SESSION",
    "DEFAULT_RETRY_AFTER",
    "DONE",
    "EXPIRY_HOLD",
    "FAILED",
    "FINAL_STATUSES",
    "QUEUED",
    "RESUMED",
    "RUNNING",
    "STARTED",
    "SUPERSEDED",
    "TAKEOVER",
    "TURNS_CHANNEL",
    "WAITING",
    "Claim",
    "Decided",
    "QueuedTurn",
    "Renewal",
    "TurnQueue",
    "TurnStatus",
    "as_protocol",
]
