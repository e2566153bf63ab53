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
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NoReturn

import attrs
import orjson
import trio

from actors.stores.postgres import (
    CONNECT_TIMEOUT,
    LOCK_SESSION,
    Fence,
    LockedSession,
    PostgresStore,
    load_rows,
)
from runtime import serde
from runtime.approval import WAITING_META, Decision, PendingCall, pending_calls, record_decision
from runtime.busy import ENQUEUE, INTERRUPT, INTERRUPTED_BY_NEW, REJECT, STEER, OnBusy
from runtime.errors import (
    AlreadyDecided,
    QueueFull,
    SessionBusy,
    StoreCorrupt,
    StoreError,
    TurnConflict,
    UnknownApproval,
)
from runtime.logging import get_logger
from runtime.messages import (
    AssistantMessage,
    File,
    Image,
    Message,
    TextPart,
    ToolCallPart,
    UserContent,
)
from runtime.store import SessionRecord, validate_session_id
from runtime.turn_queue import (
    CANCELLED,
    DONE,
    FAILED,
    FINAL_STATUSES,
    QUEUED,
    RUNNING,
    STEERED,
    SUPERSEDED,
    WAITING,
    Decided,
    QueuedTurn,
    Renewal,
    SteerWatch,
    TurnOptions,
    TurnStatus,
)
from runtime.turn_queue import Claim as BaseClaim
from runtime.turn_queue import TurnQueue as TurnQueueProtocol

DEFAULT_MAX_QUEUED_PER_SESSION: Final = 100
"""Queued turns one session may hold (more than anyone types ahead of an answer)."""
DEFAULT_MAX_QUEUED: Final = 10_000
"""Queued turns the whole queue may hold (every one will run and cost tokens)."""
DEFAULT_RETRY_AFTER: Final = 5.0
"""Seconds a refused submit is told to wait (:attr:`QueueFull.retry_after`)."""

TURNS_CHANNEL: Final = "axon_turns"
"""NOTIFY channel: a turn was submitted, released or finished. Channels are database-wide,
so the payload is ``<schema>:<turn id>`` and a queue ignores other schemas' turns."""
CANCEL_CHANNEL: Final = "axon_cancel"
"""NOTIFY channel: a turn's cancellation was requested (payload: its turn id)."""

_COLUMNS = (
    "turn_id, session_id, seq, input, meta, regenerate, status, owner, epoch, attempts, "
    "saved, cancel_requested, cancel_reason, finish_reason, error, idempotency_key, "
    "resumes, expires_at, steer_of, options"
)
_STATUS_COLUMNS = (
    "turn_id, session_id, seq, status, owner, epoch, attempts, saved, cancel_requested, "
    "cancel_reason, finish_reason, error, resumes, expires_at"
)
"""What a status read selects: never ``input`` or ``meta``, which may be megabytes."""
_T_STATUS_COLUMNS = ", ".join(f"t.{c.strip()}" for c in _STATUS_COLUMNS.split(","))
"""The same, of a statement's ``t``."""
STARTED, TAKEOVER, RESUMED = "started", "takeover", "resumed"
"""How a claim got its turn: a queued turn started, a running one taken over, a waiting
one's continuation (its calls decided)."""
EXPIRY_HOLD: Final = 60.0
"""Seconds a waiting turn handed out by :meth:`TurnQueue.take_expired` is held back from
other workers (one that died meanwhile leaves it to the next look after that)."""
DECODE_INLINE = 64 << 10
"""A turn input up to this many bytes of JSON is decoded on the event loop; a larger one
in a thread, so decoding thousands of parts never holds up the loop (or a lease)."""


@attrs.frozen(kw_only=True, slots=True)
class Claim(BaseClaim):
    """A claim of this queue: the contract's :class:`~runtime.turn_queue.Claim`, and the
    :class:`~actors.stores.postgres.Fence` its saves run under."""

    def fence(self, on_lost: Callable[[], None] | None = None) -> Fence:
        """The :class:`~actors.stores.postgres.Fence` the worker's saves of the session
        run under; ``on_lost`` is called when a save was refused because the turn moved on."""
        return Fence(turn_id=self.turn.turn_id, owner=self.owner, epoch=self.epoch, on_lost=on_lost)


class _Renewer:
    """A :class:`~runtime.turn_queue.LeaseRenewer` on a connection of its own, opened on
    the first renewal and again after one broke (blocking: a lease thread's)."""

    def __init__(self, queue: TurnQueue) -> None:
        self.queue = queue
        self.conn: Any = None

    def renew(self, turn_id: str, owner: str, epoch: int) -> Renewal:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.close()
            self.conn = self.queue.connect()
        return self.queue.renew_on(self.conn, turn_id, owner, epoch)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


class _Listener:
    """The state of one wait thread, shared with the Trio side: a wait cancelled while
    its thread blocks abandons the thread, which then closes the connection itself."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.abandoned = False
        self.done = False


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
    check_room: Callable[[Any, str, str | None, str], None]
    """The queue's caps (:meth:`TurnQueue._check_room`)."""

    def insert(self, conn: Any, key: str | None, regenerate: bool) -> tuple[Any, ...]:
        """Insert the turn (after the busy strategy and the caps), or find its twin."""
        session_id, turn_id, on_busy = self.session_id, self.turn_id, self.on_busy
        if on_busy == INTERRUPT:  # row locks first, as a claim takes them
            _interrupt(conn, session_id)
        steer_of = None  # (row locks first here too: the running turn's count of steers)
        if on_busy == STEER and not regenerate:
            steer_of = _steer_running(conn, session_id)
        self.check_room(conn, session_id, key, turn_id)
        if on_busy == REJECT and _busy(conn, session_id):
            raise SessionBusy(f"session {session_id!r} is already running a turn")
        row = conn.execute(
            f"""INSERT INTO axon_turns (turn_id, session_id, idempotency_key,
                message_key, input_hash, input, meta, regenerate, options, steer_of)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
            ON CONFLICT DO NOTHING RETURNING {_COLUMNS}""",
            (
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
            ),
        ).fetchone()
        if row is not None:
            _notify_turns(conn, turn_id)
            return tuple(row)
        where, value = ("idempotency_key", key) if key is not None else ("turn_id", turn_id)
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM axon_turns WHERE {where} = %s", (value,)
        ).fetchone()
        if row is None:  # the conflict was on the other unique key
            raise StoreError(
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
            return self.insert(conn, key, self.regenerate)
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


class TurnQueue:
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

    # -- submitting ----------------------------------------------------------------------

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
        """
        validate_session_id(session_id)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key
        ):
            raise StoreError(f"idempotency_key must be a non-empty string, not {idempotency_key!r}")
        if turn_id is not None and (not isinstance(turn_id, str) or not turn_id):
            raise StoreError(f"turn_id must be a non-empty string, not {turn_id!r}")
        content = _check_input(input)
        try:
            # megabytes, maybe: encoded and hashed off the event loop
            body, input_hash = await trio.to_thread.run_sync(
                _encoded_and_hashed, content, regenerate
            )
            meta_json = orjson.dumps(dict(meta or {}))
            options_json = (
                b"{}"
                if options is None or options.empty
                else await trio.to_thread.run_sync(serde.to_json, options)  # a history, maybe
            )
        except (TypeError, ValueError, orjson.JSONEncodeError) as err:
            raise StoreError(
                f"submit to session {session_id!r}: input or meta cannot be serialized: {err}"
            ) from err
        turn_id = turn_id or f"turn_{uuid.uuid4().hex}"
        message_key = (
            None
            if idempotency_key is None
            else _sha256(idempotency_key.encode("utf-8", "surrogatepass"))
        )

        if on_busy is not None and on_busy not in (ENQUEUE, REJECT, INTERRUPT, STEER):
            raise StoreError(
                f"submit to session {session_id!r}: on_busy {on_busy!r} is not one of "
                "enqueue, reject, interrupt, steer"
            )

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
            check_room=self._check_room,
        )
        row = await self.store.run(f"submit to session {session_id!r}", submission.run)
        turn = await self._decoded(row)
        if turn.session_id != session_id:
            used = (
                f"idempotency key {idempotency_key!r}"
                if idempotency_key is not None
                else f"turn id {turn_id!r}"
            )
            raise TurnConflict(
                f"submit to session {session_id!r}: {used} already names turn "
                f"{turn.turn_id} of session {turn.session_id!r}"
            )
        return turn

    def _check_room(
        self, conn: Any, session_id: str, idempotency_key: str | None, turn_id: str
    ) -> None:
        """In the submit's transaction: raise :class:`QueueFull` when the session or the
        queue is at its cap. Takes the session's lock (the one the head trigger takes,
        :data:`actors.stores.postgres._HEAD_TRIGGER`), then the queue's, each held to
        the commit, so two racing submits count each other. A submit that repeats one
        already stored (same key or turn id) is never refused: it returns its turn."""
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
        if conn.execute(f"SELECT 1 FROM axon_turns WHERE {where}", (key,)).fetchone():
            return
        # Each count reads at most its cap's index entries. ">= x AND <= x" (not "= x")
        # with ORDER BY keeps a prepared statement's generic plan on the axon_turns_queued
        # index, as in the head trigger (actors.stores.postgres._HEAD_FUNCTION).
        if per_session is not None:
            (count,) = conn.execute(
                """SELECT count(*) FROM (SELECT 1 FROM axon_turns
                WHERE session_id >= %s AND session_id <= %s AND status = 'queued'
                ORDER BY session_id, seq LIMIT %s) AS q""",
                (session_id, session_id, per_session),
            ).fetchone()
            if count >= per_session:
                raise QueueFull(
                    f"session {session_id!r} already has {count} turns queued (the limit); "
                    f"retry after {self.retry_after:g} s",
                    scope="session",
                    limit=per_session,
                    retry_after=self.retry_after,
                )
        if total is not None:
            conn.execute(
                "SELECT pg_advisory_xact_lock("
                "hashtextextended('axon_turns:' || current_schema(), 0))"
            )
            (count,) = conn.execute(
                """SELECT count(*) FROM (SELECT 1 FROM axon_turns
                WHERE status = 'queued' ORDER BY seq LIMIT %s) AS q""",
                (total,),
            ).fetchone()
            if count >= total:
                raise QueueFull(
                    f"the turn queue already holds {count} queued turns (the limit); "
                    f"retry after {self.retry_after:g} s",
                    scope="total",
                    limit=total,
                    retry_after=self.retry_after,
                )

    # -- claiming ------------------------------------------------------------------------

    async def claim(
        self,
        owner: str,
        *,
        on_claimed: Callable[[str, str, int], None] | None = None,
        load: Callable[[str], bool] | None = None,
    ) -> Claim | None:
        """Take the next turn to run for worker ``owner``, or ``None`` if there is none.

        An expired lease is taken over first (its turn may be half done; ``takeover`` is
        true), failing instead any turn that already used ``max_attempts``; otherwise the
        first *head* in line (a session's oldest queued turn, ``axon_turns.head``, by
        ``head_seq``: when it became the head) whose session is idle starts. Walking
        heads, not queued turns, makes a claim cost the same behind one session's backlog
        of thousands as behind none; and the line makes claims fair across sessions: a
        session's next turn joins the line when its previous one starts, behind the
        other sessions' heads already waiting. A
        takeover of a turn whose cancellation was requested still happens: the claim's
        ``turn.cancel_requested`` tells the worker to stop it at once.

        ``on_claimed(turn_id, owner, epoch)`` is called as soon as the turn is claimed,
        before its input is decoded (thousands of parts may take longer than the lease):
        a worker starts renewing the lease there.

        ``load(session_id)`` (called in the claim's thread: a quick look, such as whether
        the worker has the session in memory) asks for the turn's session too: it is read
        on the claim's connection once the claim committed, saving the turn a thread hop
        and a pool checkout of its own (:attr:`Claim.stored`). A continuation's claim
        reads it anyway.
        """
        if not isinstance(owner, str) or not owner:
            raise StoreError(f"owner must be a non-empty string, not {owner!r}")
        import psycopg

        max_attempts = self.max_attempts
        lease = self.lease

        def claim(conn: Any) -> tuple[tuple[Any, ...], str, list[Any] | None] | None:
            # Walk the heads (one per session with queued turns) in line and stop at the
            # first claimable one. On a table PostgreSQL has not analyzed yet (a new
            # deployment's first burst) the planner would otherwise check every head and
            # sort them: measured 1.9 ms instead of 0.08 ms at 300 queued turns.
            # The SET rides with the first look for expired leases: one round trip.
            setting = "SET LOCAL enable_sort = off;"
            while True:  # expired leases first; poison turns fail and are skipped
                cur = conn.execute(
                    f"""{setting} SELECT turn_id, attempts, resume_pending FROM axon_turns
                    WHERE status = 'running' AND lease_until < clock_timestamp()
                    ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED"""
                )
                if setting:
                    setting = ""
                    cur.nextset()
                row = cur.fetchone()
                if row is None:
                    break
                turn_id, attempts, resume_pending = row
                if resume_pending:  # decided: its continuation's first run, not a takeover
                    # Sorting goes back on in the same statement (``set_config`` is ``SET
                    # LOCAL``; a round trip fewer than a statement of its own): without it
                    # the planner reads the session's messages below in hundreds of
                    # milliseconds, not a fraction of one.
                    resumed = conn.execute(
                        f"""UPDATE axon_turns SET owner = %s, epoch = epoch + 1, attempts = 1,
                            resume_pending = false,
                            lease_until = clock_timestamp() + make_interval(secs => %s)
                        WHERE turn_id = %s
                        RETURNING {_COLUMNS}, set_config('enable_sort', 'on', true)""",
                        (owner, lease, turn_id),
                    ).fetchone()[:-1]
                    # The decisions moved the session: read it here, not in a load of its
                    # own before the continuation's first step (a thread hop and a pool
                    # checkout fewer).
                    return resumed, RESUMED, load_rows(conn, resumed[1])
                if attempts < max_attempts:
                    taken = conn.execute(
                        f"""UPDATE axon_turns SET owner = %s, epoch = epoch + 1,
                            attempts = attempts + 1,
                            lease_until = clock_timestamp() + make_interval(secs => %s)
                        WHERE turn_id = %s RETURNING {_COLUMNS}""",
                        (owner, lease, turn_id),
                    ).fetchone()
                    return taken, TAKEOVER, None
                conn.execute(
                    """UPDATE axon_turns SET status = 'failed', finish_reason = 'error',
                        error = %s, lease_until = NULL, finished_at = clock_timestamp()
                    WHERE turn_id = %s""",
                    (
                        f"abandoned by {attempts} workers (their leases expired while "
                        f"running it): it may be killing its workers; not retried",
                        turn_id,
                    ),
                )
                _notify_turns(conn, turn_id)
            # The first claimable head, started, and in the same statement the end of a
            # turn of the session that waits for a decision: superseded (its runner
            # denies what still waits, as the embedded host does), so no decision resumes
            # it any more. One statement: the look and the start were two round trips.
            started = conn.execute(
                f"""WITH head AS (
                    SELECT turn_id FROM axon_turns AS t
                    WHERE t.head AND t.status = 'queued' AND NOT t.cancel_requested
                      AND NOT EXISTS (SELECT 1 FROM axon_turns AS r
                          WHERE r.session_id = t.session_id AND r.status = 'running')
                    ORDER BY t.head_seq LIMIT 1 FOR UPDATE SKIP LOCKED
                ), started AS (
                    UPDATE axon_turns SET status = 'running', owner = %s,
                        epoch = epoch + 1, attempts = attempts + 1,
                        lease_until = clock_timestamp() + make_interval(secs => %s),
                        started_at = coalesce(started_at, clock_timestamp())
                    WHERE turn_id = (SELECT turn_id FROM head) AND status = 'queued'
                    RETURNING {_COLUMNS}
                ), superseded AS ({_SUPERSEDE} FROM started AS s
                    WHERE w.session_id = s.session_id AND w.status = 'awaiting-input'
                    RETURNING pg_notify(%s, current_schema() || ':' || w.turn_id)
                )
                SELECT {_COLUMNS} FROM started""",
                (owner, lease, TURNS_CHANNEL),
            ).fetchone()
            return None if started is None else (started, STARTED, None)

        def claim_once(conn: Any) -> tuple[tuple[Any, ...], str, list[Any] | None] | None:
            # A concurrent claim may have started another turn of this session since the
            # look's snapshot: the unique index refuses the second one, and this claim,
            # rolled back, found nothing (no savepoint: two statements fewer per claim).
            try:
                with conn.transaction():
                    found = claim(conn)
            except psycopg.errors.UniqueViolation:
                return None
            if found is not None and found[2] is None and load is not None:
                session_id = found[0][1]
                if load(session_id):  # after the commit: no lock is held while it reads
                    return found[0], found[1], load_rows(conn, session_id)
            return found

        found = await self.store.run(f"claim by {owner!r}", claim_once, transaction=False)
        if found is None:
            return None
        if on_claimed is not None:
            on_claimed(found[0][0], owner, found[0][8])  # turn_id, epoch: see _COLUMNS
        turn = await self._decoded(found[0])
        return Claim(
            turn=turn,
            owner=owner,
            epoch=turn.epoch,
            takeover=found[1] == TAKEOVER,
            resumed=found[1] == RESUMED,
            stored=self._stored(turn.session_id, found[2]),
        )

    def _stored(self, session_id: str, rows: list[Any] | None) -> SessionRecord | None:
        """The session a claim read (``None`` if it did not, or cannot decode it: the turn
        then reads it itself, and meets the problem there as any turn would)."""
        if rows is None:
            return None
        try:
            record = self.store.record(session_id, rows)
        except StoreError:
            return None
        return record or SessionRecord(session_id=session_id, messages=())

    # -- holding and ending a claim ------------------------------------------------------

    async def renew(self, claim: BaseClaim) -> Renewal:
        """Extend the claim's lease by ``lease`` seconds from now, if the worker still
        holds the turn; ``held`` is false once another worker took it over (or it ended),
        and the worker must stop. Also reports a requested cancellation."""
        key = (claim.turn.turn_id, claim.owner, claim.epoch)
        return await self.store.run(
            f"renewal of turn {claim.turn.turn_id}", lambda conn: self.renew_on(conn, *key)
        )

    def renew_on(self, conn: Any, turn_id: str, owner: str, epoch: int) -> Renewal:
        """:meth:`renew` of the claim ``(turn_id, owner, epoch)`` on ``conn`` (one of
        :meth:`connect`'s, in autocommit), in the calling thread: what a worker's lease
        thread runs, so that nothing its event loop does can delay a renewal
        (:class:`runtime.app.worker.LeaseKeeper`)."""
        row = conn.execute(
            """UPDATE axon_turns SET lease_until = clock_timestamp() + make_interval(secs => %s)
            WHERE turn_id = %s AND owner = %s AND epoch = %s AND status = 'running'
            RETURNING cancel_requested, cancel_reason""",
            (self.lease, turn_id, owner, epoch),
        ).fetchone()
        if row is None:
            return Renewal(held=False)
        return Renewal(held=True, cancel_requested=row[0], cancel_reason=row[1])

    def connect(self) -> Any:
        """A new autocommit connection to the queue's schema, outside the store's pool
        (blocking: call it from a thread); the caller closes it."""
        import psycopg

        conn = psycopg.connect(self.store.libpq, connect_timeout=CONNECT_TIMEOUT, autocommit=True)
        try:
            conn.execute(f"SET search_path TO {self.store.schema}")
        except BaseException:
            conn.close()
            raise
        return conn

    def open_renewer(self) -> _Renewer:
        """A lease renewer on a connection of its own (:class:`runtime.turn_queue.LeaseRenewer`),
        which connects on its first renewal."""
        return _Renewer(self)

    def fenced(
        self,
        claim: BaseClaim,
        on_lost: Callable[[], None] | None = None,
        on_suspended: Callable[[], None] | None = None,
        steered: Sequence[str] = (),
        watch: SteerWatch | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """While inside, every save of the claimed turn's session checks, in its own
        transaction, that the claim still holds the turn
        (:meth:`PostgresStore.fenced <actors.stores.postgres.PostgresStore.fenced>`).

        With ``on_suspended``, the save of the step that makes the turn wait for a person
        (its meta counts waiting calls, :data:`~runtime.approval.WAITING_META`) also
        suspends the row (:meth:`suspend`), in the same transaction: one commit where there were
        two, and no moment where the step is stored and the row still holds a lease.
        ``on_suspended`` is called once that save committed (the worker then has nothing
        left to write to the row).

        ``steered`` (read at every save; the worker appends to it) names the messages the
        turn took from :meth:`take_steering`: the save that stores them marks their rows
        ``done`` (:data:`~runtime.turn_queue.STEERED`) in its commit, so a worker that
        dies before that save leaves them queued, for the turn's next worker to take
        again or to run as turns of their own. ``watch`` learns from each save the turn's
        count of steering submits (:class:`~runtime.turn_queue.SteerWatch`), read by the
        fence check the save makes anyway."""
        key = (claim.turn.turn_id, claim.owner, claim.epoch)

        def suspend_if_waiting(
            conn: Any, messages: Sequence[Message], meta: Mapping[str, Any] | None
        ) -> bool:
            if steered:
                _mark_steered(conn, claim.turn.turn_id, list(steered))
            if on_suspended is None or not (meta or {}).get(WAITING_META):
                return False
            row = conn.execute(_SUSPEND, (_first_deadline(messages), *key)).fetchone()
            if row is None:  # not held: the fence check before would have refused the save
                return False
            _notify_turns(conn, claim.turn.turn_id)
            return True

        fence = Fence(
            turn_id=claim.turn.turn_id,
            owner=claim.owner,
            epoch=claim.epoch,
            on_lost=on_lost,
            saved=claim.turn.saved,
            in_save=None if on_suspended is None and steered == () else suspend_if_waiting,
            on_commit=on_suspended,
            watch=watch,
        )
        return self.store.fenced(claim.turn.session_id, fence)

    async def take_steering(
        self, claim: BaseClaim, watch: SteerWatch | None = None
    ) -> list[QueuedTurn]:
        """The messages submitted to steer the claimed turn (``on_busy="steer"``) that
        are still queued, in order: one read of the ``axon_turns_queued`` index, with
        the turn's count of steering submits from the same snapshot (to ``watch.taken``:
        a submit after this read counts past it). Nothing is written here: the save that
        stores them marks them (:meth:`fenced`)."""
        turn = claim.turn

        def take(conn: Any) -> list[tuple[Any, ...]]:
            return conn.execute(
                f"""SELECT r.steers, q.* FROM axon_turns AS r LEFT JOIN LATERAL (
                    SELECT {_COLUMNS} FROM axon_turns
                    WHERE session_id = %s AND status = 'queued' AND steer_of = %s
                      AND NOT cancel_requested
                    ORDER BY seq
                ) AS q ON true
                WHERE r.turn_id = %s""",
                (turn.session_id, turn.turn_id, turn.turn_id),
            ).fetchall()

        rows = await self.store.run(f"steering of turn {turn.turn_id}", take, transaction=False)
        if rows and watch is not None:
            watch.taken = max(watch.taken, rows[0][0])
        return [await self._decoded(tuple(row[1:])) for row in rows if row[1] is not None]

    def close_fences(self) -> None:
        """Refuse every fenced save of the store from now on (a worker stopping at once)."""
        self.store.close_fences()

    async def finish(
        self,
        claim: BaseClaim,
        *,
        status: str,
        finish_reason: str | None = None,
        error: str | None = None,
    ) -> bool:
        """End the claimed turn with ``status`` (``done``, ``failed`` or ``cancelled``)
        and wake whoever waits for it; ``False`` (nothing written) if the worker no
        longer holds the turn."""
        if status not in FINAL_STATUSES:
            raise StoreError(
                f"finish of turn {claim.turn.turn_id}: status must be one of "
                f"{sorted(FINAL_STATUSES)}, not {status!r}"
            )
        key = (claim.turn.turn_id, claim.owner, claim.epoch)

        def finish(conn: Any) -> bool:
            return _write_once(
                conn,
                """UPDATE axon_turns SET status = %s, finish_reason = %s, error = %s,
                    lease_until = NULL, finished_at = clock_timestamp()
                WHERE turn_id = %s AND owner = %s AND epoch = %s AND status = 'running'
                RETURNING turn_id""",
                (status, finish_reason, error, *key),
                "SELECT 1 FROM axon_turns WHERE turn_id = %s AND owner = %s AND epoch = %s "
                "AND status = %s AND finished_at IS NOT NULL",
                (*key, status),
            )

        # One statement when it writes (``_write_once``): no BEGIN and COMMIT around it.
        done = await self.store.run(
            f"finish of turn {claim.turn.turn_id}", finish, transaction=False
        )
        return bool(done)

    async def release(self, claim: BaseClaim, *, keep_attempt: bool = False) -> bool:
        """Give the claimed turn back at once (a worker shutting down); ``False`` if the
        worker no longer held it.

        The turn stays ``running`` with no owner and a lease already expired, so the next
        claim takes it over without waiting: it is a takeover, not a fresh start, since
        steps may be committed. The attempt the releasing worker used is given back, so
        graceful restarts never make a turn fail; with ``keep_attempt`` (a turn whose
        final save was not confirmed: the store may be what fails it) it is not. The
        released claim is fenced out: its later saves, renewals and finish are refused.
        """
        key = (claim.turn.turn_id, claim.owner, claim.epoch)
        given_back = 0 if keep_attempt else 1

        def release(conn: Any) -> bool:
            return _write_once(
                conn,
                """UPDATE axon_turns SET owner = NULL,
                    lease_until = clock_timestamp() - interval '1 second',
                    attempts = greatest(attempts - %s, 0)
                WHERE turn_id = %s AND owner = %s AND epoch = %s AND status = 'running'
                RETURNING turn_id""",
                (given_back, *key),
                # a retried release finds the same epoch with no owner
                "SELECT 1 FROM axon_turns WHERE turn_id = %s AND owner IS NULL AND epoch = %s "
                "AND status = 'running'",
                (claim.turn.turn_id, claim.epoch),
            )

        done = await self.store.run(
            f"release of turn {claim.turn.turn_id}", release, transaction=False
        )
        return bool(done)

    # -- turns that wait for a person ------------------------------------------------------

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
        self, session_id: str, key: str, decision: Decision, tools: Mapping[str, Any]
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
        check), and exactly one decision completes a turn's set, so one resumes it."""
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

            def guard(conn: Any) -> LockedSession | None:
                status, locked = _resume_if_decided(conn, session_id, call, complete)
                rows.append(status)
                return locked

            return await self.store.save(
                session_id,
                start,
                messages,
                meta,
                expected_version=expected_version,
                guard=guard,
                # Not the turn's own write: a worker running the turn (its step's commit
                # suspended the row a moment ago) must not fence out the decision for it.
                unfenced=True,
            )

        recorded = await record_decision(self.store, session_id, key, decision, tools, save=save)
        return Decided(recorded=recorded, turn=rows[-1])

    async def take_expired(self, now: float, limit: int = 100) -> list[TurnStatus]:
        """Waiting turns whose ``expires_at`` is at or before ``now`` (the caller's wall
        clock, as the deadline was stored), oldest deadline first. Each is held back from
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

    # -- reading -------------------------------------------------------------------------

    async def get(self, turn_id: str) -> QueuedTurn | None:
        """The turn ``turn_id``, or ``None`` if there is none."""
        row = await self.store.run(
            f"read of turn {turn_id}",
            lambda conn: conn.execute(
                f"SELECT {_COLUMNS} FROM axon_turns WHERE turn_id = %s", (turn_id,)
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else await self._decoded(row)

    async def get_status(self, turn_id: str) -> TurnStatus | None:
        """Where the turn ``turn_id`` stands (its input is not read), or ``None`` if
        there is no such turn."""
        row = await self.store.run(
            f"status of turn {turn_id}",
            lambda conn: conn.execute(
                f"SELECT {_STATUS_COLUMNS} FROM axon_turns WHERE turn_id = %s", (turn_id,)
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else _status(row)

    async def active(self, session_id: str) -> TurnStatus | None:
        """The status of the session's running turn, else of its oldest queued one, else
        ``None`` (its input is not read)."""
        validate_session_id(session_id)
        row = await self.store.run(
            f"active turn of session {session_id!r}",
            lambda conn: conn.execute(
                f"""SELECT {_STATUS_COLUMNS} FROM axon_turns
                WHERE session_id = %s AND status IN ('running', 'queued')
                ORDER BY status = 'running' DESC, seq LIMIT 1""",
                (session_id,),
            ).fetchone(),
            transaction=False,
        )
        return None if row is None else _status(row)

    async def statuses(self, turn_ids: list[str]) -> dict[str, str]:
        """The status of each of ``turn_ids`` that exists, in one query (a front end's
        viewers of queued turns share it: :mod:`runtime.app.web.watch`)."""
        if not turn_ids:
            return {}
        rows = await self.store.run(
            f"status of {len(turn_ids)} turns",
            lambda conn: conn.execute(
                "SELECT turn_id, status FROM axon_turns WHERE turn_id = ANY(%s)", (turn_ids,)
            ).fetchall(),
            transaction=False,
        )
        return {turn_id: status for turn_id, status in rows}

    async def busy_sessions(self) -> set[str]:
        """The sessions with a turn queued or running (one indexed scan of the open
        turns, for a list of sessions that says which are busy)."""
        rows = await self.store.run(
            "busy sessions",
            lambda conn: conn.execute(
                "SELECT DISTINCT session_id FROM axon_turns WHERE status IN ('queued', 'running')"
            ).fetchall(),
            transaction=False,
        )
        return {row[0] for row in rows}

    async def turns(self, session_id: str) -> list[QueuedTurn]:
        """Every turn of the session, in submission order."""
        validate_session_id(session_id)
        rows = await self.store.run(
            f"turns of session {session_id!r}",
            lambda conn: conn.execute(
                f"SELECT {_COLUMNS} FROM axon_turns WHERE session_id = %s ORDER BY seq",
                (session_id,),
            ).fetchall(),
            transaction=False,
        )
        return [self._decode(row) for row in rows]

    # -- waiting -------------------------------------------------------------------------

    async def wait(self, timeout: float) -> bool:  # noqa: ASYNC109 - a thread blocks on it
        """Block until a ``NOTIFY axon_turns`` arrives or ``timeout`` seconds pass; ``True``
        if notified (something may be claimable or finished).

        The ``LISTEN`` connection stays open between calls, so a notification sent while
        the worker was busy is kept and the next wait returns at once. When the connection
        is (re)opened, notifications may have been missed, so that wait returns ``True``
        at once: a spurious wake-up costs one claim, a missed one a whole ``timeout``.
        Cancelling a wait abandons its thread, which closes the connection when it ends.
        Meant for one worker loop: concurrent waits on one queue take turns (front ends
        waiting for a turn use :meth:`wait_finished`).
        """
        if self._closed:
            raise StoreError(f"turn queue of {self.store.url} is closed")
        async with self._wait_lock:
            listener = self._listen
            if listener is None or listener.conn.closed or listener.conn.broken:
                if listener is not None:
                    await trio.to_thread.run_sync(listener.conn.close)
                    self._listen = None
                try:
                    conn = await trio.to_thread.run_sync(self._connect_listener)
                except Exception as err:
                    # Down: say "maybe" after a pause; the caller's next query retries.
                    self._log.warning("turns.listen_failed", error=str(err))
                    await trio.sleep(min(timeout, 1.0))
                    return True
                self._listen = _Listener(conn)
                return True
            try:
                return await trio.to_thread.run_sync(
                    _wait_for_notify,
                    listener,
                    f"{self.store.schema}:",
                    timeout,
                    abandon_on_cancel=True,
                )
            except trio.Cancelled:
                with listener.lock:
                    listener.abandoned = True
                    done = listener.done
                self._listen = None
                if done:
                    listener.conn.close()
                raise
            except Exception as err:  # the connection broke: reopen on the next wait
                self._log.warning("turns.listen_broken", error=str(err))
                return True

    async def wait_finished(self, turn_id: str, timeout: float) -> QueuedTurn | None:  # noqa: ASYNC109
        """Poll until turn ``turn_id`` is ``done``, ``failed`` or ``cancelled`` and return
        it; ``None`` if it did not finish within ``timeout`` seconds (or does not exist:
        :meth:`get` tells the two apart). For front ends and tests; it does not use the
        workers' ``LISTEN`` connection, so any number may wait at once."""
        delay = 0.02
        with trio.move_on_after(timeout):
            while True:
                status = await self.get_status(turn_id)  # the input is read once, at the end
                if status is not None and status.finished:
                    return await self.get(turn_id)
                await trio.sleep(delay)
                delay = min(delay * 2, 0.25)
        return None

    async def aclose(self) -> None:
        """Close the ``LISTEN`` connection; idempotent (the store stays open: it is the
        caller's)."""
        self._closed = True
        listener, self._listen = self._listen, None
        if listener is not None:
            await trio.to_thread.run_sync(listener.conn.close)

    # -- helpers -------------------------------------------------------------------------

    def _connect_listener(self) -> Any:
        import psycopg

        conn = psycopg.connect(self.store.libpq, connect_timeout=CONNECT_TIMEOUT, autocommit=True)
        try:
            conn.execute(f"LISTEN {TURNS_CHANNEL}")
        except BaseException:
            conn.close()
            raise
        return conn

    async def _decoded(self, row: tuple[Any, ...]) -> QueuedTurn:
        """:meth:`_decode`, in a thread when the input is large (see :data:`DECODE_INLINE`)."""
        if len(row[3]) + len(row[-1]) <= DECODE_INLINE:
            return self._decode(row)
        return await trio.to_thread.run_sync(self._decode, row)

    def _decode(self, row: tuple[Any, ...]) -> QueuedTurn:
        (
            turn_id,
            session_id,
            seq,
            body,
            meta,
            regenerate,
            status,
            owner,
            epoch,
            attempts,
            saved,
            cancel_requested,
            cancel_reason,
            finish_reason,
            error,
            idempotency_key,
            resumes,
            expires_at,
            steer_of,
            options,
        ) = row
        try:
            content = serde.from_json(body, UserContent)
            decoded_meta = orjson.loads(bytes(meta))
            raw_options = bytes(options)
            decoded_options = (
                TurnOptions() if raw_options == b"{}" else serde.from_json(raw_options, TurnOptions)
            )
        except Exception as err:
            raise StoreCorrupt(
                f"turn store {self.store.url}: turn {turn_id!r} cannot be read: {err!r}"
            ) from err
        if not isinstance(decoded_meta, dict):
            raise StoreCorrupt(
                f"turn store {self.store.url}: meta of turn {turn_id!r} is not a JSON object"
            )
        return QueuedTurn(
            turn_id=turn_id,
            session_id=session_id,
            seq=seq,
            input=content,
            meta=decoded_meta,
            regenerate=regenerate,
            status=status,
            owner=owner,
            epoch=epoch,
            attempts=attempts,
            saved=saved,
            cancel_requested=cancel_requested,
            cancel_reason=cancel_reason,
            finish_reason=finish_reason,
            error=error,
            idempotency_key=idempotency_key,
            resumes=resumes,
            expires_at=expires_at,
            options=decoded_options,
            steer_of=steer_of,
        )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


def _busy(conn: Any, session_id: str) -> bool:
    """In a submit's transaction: whether the session has a turn queued or running,
    read under the session's lock (the one the head trigger and the caps take), so two
    racing ``reject`` submits see each other."""
    conn.execute(
        "SELECT pg_advisory_xact_lock("
        "hashtextextended('axon_turns:' || current_schema() || ':' || %s, 0))",
        (session_id,),
    )
    busy = conn.execute(
        """SELECT 1 FROM axon_turns
        WHERE session_id = %s AND status IN ('queued', 'running') LIMIT 1""",
        (session_id,),
    ).fetchone()
    return busy is not None


def _interrupt(conn: Any, session_id: str) -> None:
    """In a submit's transaction, before its insert: cancel the session's queued turns
    (``cancelled`` at once) and ask its running one to stop (its worker hears it on
    ``axon_cancel``, or on its next renewal), the reason ``interrupted by a new
    message``. The rows are locked first, in line order, as a claim locks a head before
    the trigger takes the session's lock; each is then updated by a statement of its
    own (the head trigger moves the head on to the next, which a later one cancels)."""
    rows = conn.execute(
        """SELECT turn_id, status FROM axon_turns
        WHERE session_id = %s AND status IN ('queued', 'running')
        ORDER BY seq FOR UPDATE""",
        (session_id,),
    ).fetchall()
    for turn_id, status in rows:
        if status == QUEUED:
            conn.execute(
                """UPDATE axon_turns SET status = 'cancelled', finish_reason = 'aborted',
                    cancel_requested = true, cancel_reason = %s,
                    finished_at = clock_timestamp()
                WHERE turn_id = %s""",
                (INTERRUPTED_BY_NEW, turn_id),
            )
            _notify_turns(conn, turn_id)
        else:
            conn.execute(
                """UPDATE axon_turns SET cancel_requested = true,
                    cancel_reason = coalesce(cancel_reason, %s)
                WHERE turn_id = %s""",
                (INTERRUPTED_BY_NEW, turn_id),
            )
        conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, turn_id))


_SUPERSEDE = """UPDATE axon_turns AS w SET status = 'done', finish_reason = 'superseded',
    expires_at = NULL, finished_at = clock_timestamp()"""
"""The waiting turn a later turn of its session supersedes (its ``WHERE`` follows)."""


def _steer_running(conn: Any, session_id: str) -> str | None:
    """The session's running turn, if any (what a ``steer`` submit steers), its count of
    steers raised in the submit's transaction: the turn's next fenced save reads it, so
    its worker knows to read the steering rows (:class:`~runtime.turn_queue.SteerWatch`)."""
    row = conn.execute(
        """UPDATE axon_turns SET steers = steers + 1
        WHERE session_id = %s AND status = 'running' RETURNING turn_id""",
        (session_id,),
    ).fetchone()
    return None if row is None else str(row[0])


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


_STATUS_FIELDS = tuple(name.strip() for name in _STATUS_COLUMNS.split(","))


def _encoded(content: UserContent) -> str:
    return serde.to_json(content).decode("utf-8")


def _encoded_and_hashed(content: UserContent, regenerate: bool) -> tuple[str, str]:
    """The input as stored, and the hash that tells a retry (same) from an edit."""
    body = _encoded(content)
    return body, _sha256(orjson.dumps([body, bool(regenerate)]))


def _status(row: tuple[Any, ...]) -> TurnStatus:
    return TurnStatus(**dict(zip(_STATUS_FIELDS, row, strict=True)))


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


def _wait_for_notify(listener: _Listener, prefix: str, timeout: float) -> bool:
    """In a worker thread: block on the LISTEN connection until a notification of this
    schema (payload starting with ``prefix``) arrives or ``timeout`` passes."""
    deadline = time.monotonic() + max(timeout, 0.0)
    try:
        while True:
            remaining = max(deadline - time.monotonic(), 0.0)
            for notify in listener.conn.notifies(timeout=remaining, stop_after=1):
                if notify.payload.startswith(prefix):
                    return True
            if time.monotonic() >= deadline:
                return False
    finally:
        with listener.lock:
            listener.done = True
            abandoned = listener.abandoned
        if abandoned:
            listener.conn.close()


def as_protocol(queue: TurnQueue) -> TurnQueueProtocol:
    """``queue`` as the contract's :class:`runtime.turn_queue.TurnQueue`: a function only so
    that the type checker proves this queue satisfies the protocol."""
    return queue


__all__ = [
    "CANCELLED",
    "DONE",
    "FAILED",
    "FINAL_STATUSES",
    "QUEUED",
    "RUNNING",
    "SUPERSEDED",
    "WAITING",
    "Claim",
    "Decided",
    "QueuedTurn",
    "Renewal",
    "TurnQueue",
    "TurnStatus",
    "as_protocol",
]
