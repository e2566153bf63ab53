"""Claiming turns and holding them: a worker's :meth:`~TurnClaiming.claim` (takeovers
of expired leases, poison turns, the line of heads), its lease's renewals, the fence its
saves run under (with the steering and suspension those saves write), and the end or
release of its claim.

The worker's side of :class:`~actors.stores.turns.TurnQueue`: every write here is
guarded by the claim's ``(owner, epoch)``, so a worker that lost its turn writes
nothing. :class:`_Renewer` renews on a connection of its own, from a lease thread.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final

import attrs

from actors.stores.postgres import (
    SAVE_NEXT_CLAIM_AT,
    Fence,
    RidingClaim,
    Suspend,
    _retrying,
    kept_cursor,
    load_rows,
    read_row,
)
from actors.stores.postgres_calls import (
    CLAIM_FUNCTION_NAME,
    CLAIMED_COLUMNS,
    RESUMED_TOKEN,
    SESSION_COLUMNS,
)
from actors.stores.postgres_lane import CONNECT_TIMEOUT, set_session
from actors.stores.turn_sql import (
    _COLUMNS,
    _SUSPEND,
    TURNS_CHANNEL,
    _first_deadline,
    _mark_steered,
    _notify_turns,
    _write_once,
)
from runtime.approval import WAITING_META
from runtime.errors import SESSION_DELETED, StoreCorrupt, StoreError
from runtime.history import run_long_off_loop
from runtime.messages import Message
from runtime.redact import redact
from runtime.serde import utf8_text
from runtime.store import SessionRecord
from runtime.turn_queue import (
    FINAL_STATUSES,
    NextClaim,
    NextClaimed,
    QueuedTurn,
    Renewal,
    SteerWatch,
)
from runtime.turn_queue import Claim as BaseClaim

if TYPE_CHECKING:
    from actors.stores.postgres import PostgresStore

STARTED, TAKEOVER, RESUMED = "started", "takeover", "resumed"
"""How a claim got its turn: a queued turn started, a running one taken over, a waiting
one's continuation (its calls decided)."""

_Found = tuple[tuple[Any, ...], str, list[Any] | None]
"""What a claim's transaction found: the row, how (``STARTED`` ...), the session's rows
if it read them."""


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

    def __init__(self, queue: TurnClaiming) -> None:
        self.queue = queue
        self.conn: Any = None

    def renew(self, turn_id: str, owner: str, epoch: int) -> Renewal:
        fresh = self.conn is None or self.conn.closed or self.conn.broken
        if fresh:
            self.close()
            self.conn = self.queue.connect()
        try:
            return self.queue.renew_on(self.conn, turn_id, owner, epoch)
        except Exception:
            if fresh or not (self.conn.closed or self.conn.broken):
                raise
        # The kept connection was closed while it idled (the role's idle_session_timeout,
        # a pooler's or a firewall's idle limit, a restart since the last renewal): once
        # more on a new one, a renewal being safe to run twice. Before, the renewal failed
        # (a warning, and the next try a quarter second later) after each idle spell.
        self.close()
        self.conn = self.queue.connect()
        return self.queue.renew_on(self.conn, turn_id, owner, epoch)

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


class TurnClaiming:
    """The turn queue's claims and what a worker does with one (mixed into
    :class:`~actors.stores.turns.TurnQueue`, whose store, lease, attempts and row decoding
    they use)."""

    if TYPE_CHECKING:  # provided by the turn queue
        store: PostgresStore
        lease: float
        max_attempts: int
        _log: Any

        async def _decoded(self, row: tuple[Any, ...]) -> QueuedTurn: ...

    async def claim(
        self,
        owner: str,
        *,
        on_claimed: Callable[[str, str, int], None] | None = None,
        load: Callable[[str], bool] | None = None,
    ) -> Claim | None:
        """:meth:`claim_unread`, the turn read before it returns: always a :class:`Claim`."""
        got = await self.claim_unread(owner, on_claimed=on_claimed, load=load)
        if isinstance(got, NextClaimed):  # a failed read leaves the lease to lapse
            claim: Claim = await got.take()
            return claim
        return got

    async def claim_unread(
        self,
        owner: str,
        *,
        on_claimed: Callable[[str, str, int], None] | None = None,
        load: Callable[[str], bool] | None = None,
    ) -> Claim | NextClaimed | None:
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

        ``load(session_id)`` (a quick look, such as whether the worker has the session
        in memory) asks for the turn's session too: it is read once the claim committed,
        before the claim returns (:attr:`Claim.stored`). A continuation's claim reads it
        anyway; a session not stored yet (a first turn: the start statement says so) is
        not read, there is nothing to.

        The common case (no lease expired) is one call of the claim's function sent from
        the event loop (:class:`~actors.stores.postgres_lane.LoopLane`: no thread), and so is
        a decided turn's continuation (the function claims it and returns its session's
        rows); a takeover of a worker's lapsed lease runs in a transaction, in a thread.

        A turn the claim's call started (neither a takeover nor a continuation) is
        returned as a :class:`~runtime.turn_queue.NextClaimed` at once, its session's read
        and its input's decoding left to its ``take()``: a worker's claim loop goes on
        claiming while a session of 600,000 messages is read for one turn (seconds, which
        other sessions' turns waited behind: benchmarks/journal/approval.md, branch ``whist``). A
        takeover and a continuation are returned whole, as :class:`Claim`: the loop must
        know it took over a turn (it claims nothing beside one), and a continuation's
        call read its session already.
        """
        if not isinstance(owner, str) or not owner:
            raise StoreError(f"owner must be a non-empty string, not {owner!r}")
        if "\x00" in owner or (not owner.isascii() and not _utf8(owner)):
            # The claim's call sends it as a C string: a NUL would cut it short (two
            # workers one owner to the fences), as psycopg refused it before.
            raise StoreError(f"owner {owner!r} cannot be stored: no NUL, and UTF-8 text")
        action = f"claim by {owner!r}"
        # The call's token, kept by the row it claims: a retry after a lost answer gives
        # back what the first try took (:func:`give_back`), its attempt with it.
        token = claim_token()
        # A store without a lane (a test's stand-in around ``run``) claims in a thread.
        found = (
            await self._start_on_loop(action, owner, token)
            if hasattr(self.store, "_lane")
            else _EXPIRED
        )
        if found is _EXPIRED:  # a takeover first, in a transaction, in a thread
            tries = 0

            def take(conn: Any) -> _Found | None:
                nonlocal tries
                tries += 1
                if tries > 1:  # the try before may have committed: its answer was lost
                    give_back(conn, owner, token)
                return _claim_on(
                    conn,
                    owner=owner,
                    lease=self.lease,
                    max_attempts=self.max_attempts,
                    load=load,
                    token=token,
                )

            found = await self.store.run(action, take, transaction=False)
            if found is None:
                return None
            if on_claimed is not None:
                on_claimed(found[0][0], owner, found[0][8])  # turn_id, epoch: see _COLUMNS
            return await self._claim_of(found, owner)
        if found is None:
            return None
        if on_claimed is not None:
            on_claimed(found[0][0], owner, found[0][8])  # turn_id, epoch: see _COLUMNS
        if found[1] == RESUMED:
            return await self._claimed(found, owner, load)
        return NextClaimed(
            turn_id=found[0][0],
            owner=owner,
            epoch=found[0][8],
            take=partial(self._claimed, found, owner, load),
        )

    async def _claimed(
        self, found: _Found, owner: str, load: Callable[[str], bool] | None
    ) -> Claim:
        """The :class:`Claim` of a turn the claim's function started (its session read
        now if ``load`` asks for it and the call did not: a continuation's call did)."""
        row, how, rows = found
        if how != RESUMED:
            if load is None or not load(row[1]):
                rows = None  # not asked for
            elif rows is None:  # a stored session, asked for: read now (not yet: [])
                session_id = row[1]
                rows = await self.store.run(
                    f"load of session {session_id!r}",
                    lambda conn: load_rows(conn, session_id),
                    transaction=False,
                )
        return await self._claim_of((row, how, rows), owner)

    def _next_claimed(self, hook: NextClaim, owner: str, result: Any) -> None:
        """The answer of a last save that claimed the next turn too
        (:data:`~actors.stores.postgres_calls.SAVE_NEXT_FUNCTION`): the turn it claimed, if
        any, handed to the worker at once (its lease held from here)."""
        found = _found_in(result, SAVE_NEXT_CLAIM_AT)
        if found is None:  # nothing claimable
            if hook.found_none is not None:
                hook.found_none()
            return
        if found is _EXPIRED:  # a takeover first: the loop's claim makes it
            return
        turn_id, epoch = found[0][0], found[0][8]  # see _COLUMNS
        hook.on_claimed(turn_id, owner, epoch)
        hook.claimed(
            NextClaimed(
                turn_id=turn_id,
                owner=owner,
                epoch=epoch,
                take=partial(self._claimed, found, owner, hook.load),
            )
        )

    async def _start_on_loop(self, action: str, owner: str, token: str) -> Any:
        """The claim's function called from the event loop
        (:class:`~actors.stores.postgres_lane.LoopLane`: no thread): the started turn as
        :func:`_start_head` says it, ``None`` when none is claimable (or a concurrent
        claim started the session's other turn: the unique index refused this one), or
        :data:`_EXPIRED`; or a decided turn's continuation, claimed with its session's
        rows (``RESUMED``). A call retried after a connection failure first gives back
        what the failed one may have claimed and committed (:func:`give_back`)."""
        import psycopg

        store = self.store
        if store._closed:
            raise StoreError(f"session store {store.url} is closed")
        params = (
            owner.encode(),
            repr(float(self.lease)).encode(),
            TURNS_CHANNEL.encode(),
            token.encode(),
        )
        sent = 0

        async def once() -> Any:
            nonlocal sent
            sent += 1
            if sent > 1:
                await store.run(
                    f"{action}: what its lost answer claimed",
                    partial(give_back, owner=owner, token=token),
                    transaction=False,
                )
            try:
                return await store._lane.call(_CLAIM_NAME, _CLAIM_SQL, params, (0, 0, 0, 0), 1)
            except psycopg.errors.UniqueViolation:
                return None

        result = await _retrying(f"{action} ({store.url})", store._retry_for, once, log=store._log)
        if result is None:
            return None
        # (a continuation's long session: its rows, the answer's own, off the loop)
        return await run_long_off_loop(result.ntuples, _found_in, result, 0)

    async def _claim_of(self, found: _Found, owner: str) -> Claim:
        """The :class:`Claim` of what a claim's transaction found: its turn decoded (out
        of the transaction: thousands of parts may take a while), how it was claimed, and
        the session as the claim read it, if it did. A row this version cannot read (a
        field of another shape: written by a newer version, or damaged) is ended
        ``failed`` saying so, and the error raised: let go instead, it was claimed again
        and again until its attempts ran out, blocking its session's later turns for
        ``max_attempts`` leases, and then failed as one that kills its workers."""
        try:
            turn = await self._decoded(found[0])
        except StoreCorrupt as err:
            await self._refuse_unreadable(found[0], owner, err)
            raise
        return Claim(
            turn=turn,
            owner=owner,
            epoch=turn.epoch,
            takeover=found[1] == TAKEOVER,
            resumed=found[1] == RESUMED,
            stored=await self._stored(turn.session_id, found[2]),
        )

    async def _refuse_unreadable(self, row: tuple[Any, ...], owner: str, err: Exception) -> None:
        """End the claimed row that cannot be read ``failed`` (its claim's fence: nothing
        written when the claim is no longer this owner's); a failure to is logged (its
        lease then lapses, as before)."""
        turn_id, epoch = row[0], row[8]  # see _COLUMNS
        error = _text_column(
            f"this worker cannot read the turn (a row of a newer version, or damaged): {err}"
        )
        try:
            await self.store.run(
                f"failing unreadable turn {turn_id}",
                lambda conn: conn.execute(
                    """UPDATE axon_turns SET status = 'failed', finish_reason = 'error',
                        error = %s, lease_until = NULL, finished_at = clock_timestamp()
                    WHERE turn_id = %s AND owner = %s AND epoch = %s AND status = 'running'""",
                    (error, turn_id, owner, epoch),
                ),
            )
        except StoreError as exc:
            self._log.warning(
                "turns.fail_unreadable_failed", turn_id=turn_id, error=redact(str(exc))
            )

    async def _stored(self, session_id: str, rows: list[Any] | None) -> SessionRecord | None:
        """The session a claim read (``None`` if it did not, or cannot decode it: the turn
        then reads it itself, and meets the problem there as any turn would); decoded in
        a worker thread when it is long (:meth:`PostgresStore.record_off_loop`)."""
        if rows is None:
            return None
        try:
            record = await self.store.record_off_loop(session_id, rows)
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
            # No claim since this one (the epoch is its) and the row waits or is done:
            # the claim's own commit let it go (a released row is no such commit). So
            # it did when a decision came since: the row decided (``resume_pending``,
            # set only from a wait, which at this epoch is this claim's), or claimed
            # once more by the continuation that decision started (the next epoch, a
            # resumed claim's token: a takeover's has none).
            # Or the session was deleted while the turn ran: the delete ended the row
            # ``cancelled`` at this epoch with no owner (PostgresStore.delete).
            gone = conn.execute(
                "SELECT coalesce((epoch = %s "
                "AND (status IN ('awaiting-input', 'done') OR resume_pending)) "
                "OR (epoch = %s + 1 AND claim_token LIKE %s), false), "
                "coalesce(epoch = %s AND status = 'cancelled' AND owner IS NULL "
                "AND cancel_reason = %s, false) "
                "FROM axon_turns WHERE turn_id = %s",
                (epoch, epoch, "%" + RESUMED_TOKEN, epoch, SESSION_DELETED, turn_id),
            ).fetchone()
            if gone is None:
                return Renewal(held=False)
            return Renewal(held=False, let_go=bool(gone[0]), deleted=bool(gone[1]))
        return Renewal(held=True, cancel_requested=row[0], cancel_reason=row[1])

    def connect(self) -> Any:
        """A new autocommit connection to the queue's schema, outside the store's pool
        (blocking: call it from a thread); the caller closes it."""
        import psycopg

        pooled = getattr(self.store, "pooled", False)
        conn = psycopg.connect(
            self.store.libpq,
            connect_timeout=CONNECT_TIMEOUT,
            autocommit=True,
            # Behind a transaction pooler (``?pooler=transaction``) the renewal, run again
            # and again, must never be prepared, nor the schema SET: see PostgresStore.
            prepare_threshold=None if pooled else 5,
        )
        try:
            if not pooled:
                conn.execute(f"SET search_path TO {self.store.schema}")
                set_session(conn)
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
        on_finished: Callable[[], None] | None = None,
        on_finishing: Callable[[], None] | None = None,
        claim_next: NextClaim | None = None,
        on_deleted: Callable[[], None] | None = None,
    ) -> contextlib.AbstractContextManager[None]:
        """While inside, every save of the claimed turn's session checks, in its own
        transaction, that the claim still holds the turn
        (:meth:`PostgresStore.fenced <actors.stores.postgres.PostgresStore.fenced>`).

        With ``on_finished``, the save that ends the turn (its ``ends``:
        :attr:`runtime.actor_messages.SaveRequest.ends`) also finishes the row ``done``
        with that finish reason, as :meth:`finish` would, in the same transaction: one
        store call and commit a turn fewer, and no moment where the last step is stored
        and the row still running (a worker that dies before the commit leaves both
        undone: the turn is taken over and re-runs its last step). ``on_finishing`` is
        called in the save's thread once the row is written there, before the commit
        (the worker stops renewing the lease: a renewal that waited for the commit is
        then refused for a turn that is over, not lost); ``on_finished`` on the event
        loop once the save committed (the worker then has nothing left to write to the
        row).

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
        fence check the save makes anyway.

        ``on_deleted`` is called instead of ``on_lost`` for a save refused because the
        session was deleted while the turn ran (:meth:`PostgresStore.delete
        <actors.stores.postgres.PostgresStore.delete>` ended the row)."""
        key = (claim.turn.turn_id, claim.owner, claim.epoch)
        ended: list[bool] = []  # the last attempt of the save finished the row
        suspending: list[bool] = []  # the call about to be sent suspends the row

        def write_row(
            conn: Any,
            messages: Sequence[Message],
            meta: Mapping[str, Any] | None,
            ends: str | None,
        ) -> bool:
            ended.clear()
            if steered:
                _mark_steered(conn, claim.turn.turn_id, list(steered))
            if on_suspended is not None and (meta or {}).get(WAITING_META):
                row = conn.execute(_SUSPEND, (_first_deadline(messages), *key)).fetchone()
                if row is None:  # not held: the fence check before would have refused it
                    return False
                _notify_turns(conn, claim.turn.turn_id)
                return True
            if ends is None or on_finished is None:
                return False
            finished = kept_cursor(conn).execute(_FINISH_IN_SAVE, (ends, *key, TURNS_CHANNEL))
            if finished.fetchone() is None:
                return False  # not held: as above
            ended.append(True)
            if on_finishing is not None:
                on_finishing()
            return True

        def one_call(
            messages: Sequence[Message], meta: Mapping[str, Any] | None, ends: str | None
        ) -> bool | Suspend | None:
            # The save function writes the turn's end or suspension, nothing else of the
            # row: steered rows go in the save's transaction (write_row).
            ended.clear()
            suspending.clear()
            if steered:
                return None
            if on_suspended is not None and (meta or {}).get(WAITING_META):
                suspending.append(True)
                return Suspend(_first_deadline(messages))
            if ends is None or on_finished is None:
                return False
            ended.append(True)
            # Before the call, which commits the end with the save: a renewal that
            # waits for it is then refused for a turn that is over, not lost.
            if on_finishing is not None:
                on_finishing()
            return True

        def committed() -> None:
            done = on_finished if ended else on_suspended
            if done is not None:
                done()

        def next_claim() -> RidingClaim | None:
            # Only for a call that ends or suspends the turn (its slot is freed with the
            # commit) and when the worker will run another turn in the slot.
            if claim_next is None or not (ended or suspending) or not claim_next.wanted():
                return None
            token = claim_token()
            return RidingClaim(
                lease=self.lease,
                on_answer=partial(self._next_claimed, claim_next, claim.owner),
                token=token,
                give_back=partial(give_back, owner=claim.owner, token=token),
            )

        writes = on_suspended is not None or on_finished is not None or steered != ()
        fence = Fence(
            turn_id=claim.turn.turn_id,
            owner=claim.owner,
            epoch=claim.epoch,
            on_lost=on_lost,
            on_deleted=on_deleted,
            saved=claim.turn.saved,
            in_save=write_row if writes else None,
            one_call=one_call,
            claim_next=None
            if claim_next is None or (on_finished is None and on_suspended is None)
            else next_claim,
            on_commit=committed,
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
        if error is not None:
            error = _text_column(error)

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


_FINISH_IN_SAVE = """WITH w AS (
        UPDATE axon_turns SET status = 'done', finish_reason = %s, error = NULL,
            lease_until = NULL, finished_at = clock_timestamp()
        WHERE turn_id = %s AND owner = %s AND epoch = %s AND status = 'running'
        RETURNING turn_id
    )
    SELECT pg_notify(%s, current_schema() || ':' || w.turn_id) FROM w"""
"""The end of a held turn, ``done`` with its finish reason, written by the save of its
last step (params: finish reason, turn id, owner, epoch, channel): what
:meth:`TurnClaiming.finish` writes, its wake-up riding on it, sent at the save's commit."""


def _claim_on(
    conn: Any,
    *,
    owner: str,
    lease: float,
    max_attempts: int,
    load: Callable[[str], bool] | None,
    token: str | None = None,
) -> _Found | None:
    """:meth:`TurnClaiming.claim`'s work on ``conn`` (in autocommit, in the store's
    thread): a head started by one call of the claim's function when no lease has
    expired (:data:`~actors.stores.postgres.CLAIM_FUNCTION`: one round trip, no
    transaction); else an expired lease taken over, or a head started, in one
    transaction; then, if ``load`` asks for it, the session's rows, read after the commit
    so that no lock is held while it reads.

    A concurrent claim may have started another turn of this session since the look's
    snapshot: the unique index refuses the second one, and this claim, rolled back, found
    nothing (no savepoint: two statements fewer per claim)."""
    import psycopg

    try:
        found = _start_head(conn, owner, lease, token)
        if found is _EXPIRED:
            with conn.transaction():
                found = _take_expired_or_start(conn, owner, lease, max_attempts, token)
    except psycopg.errors.UniqueViolation:
        return None
    if found is None or found[1] == RESUMED:  # a continuation's claim read the session
        return found
    row, how, rows = found
    if load is None or not load(row[1]):
        return row, how, None
    # A started turn whose session is not stored yet (its first turn) has nothing to
    # read: the start said so (``rows`` is ``[]``), one statement fewer.
    return row, how, load_rows(conn, row[1]) if rows is None else rows


def _take_expired_or_start(
    conn: Any, owner: str, lease: float, max_attempts: int, token: str | None = None
) -> _Found | None:
    """In a claim's transaction: an expired lease taken over (:func:`_take_expired`),
    else a head started; a lease that expired between the two looks goes round again."""
    while True:
        found = _take_expired(conn, owner, lease, max_attempts, token)
        if found is not None:
            return found
        started = _start_head(conn, owner, lease, token)
        if started is not _EXPIRED:
            return started


def _take_expired(
    conn: Any, owner: str, lease: float, max_attempts: int, token: str | None = None
) -> _Found | None:
    """A running turn whose lease expired, taken over by ``owner`` (or, decided while it
    waited, its continuation's first run); one that used ``max_attempts`` fails instead
    and the walk goes on. ``None``: no lease has expired. Leaves sorting off for the
    transaction (``SET LOCAL``)."""
    # Sorting is off for the whole claim, as the claim's function has it for the head's
    # start (:data:`~actors.stores.postgres.CLAIM_FUNCTION`): on a table PostgreSQL has
    # not analyzed yet (a new deployment's first burst) the planner would otherwise check
    # every expired lease or head and sort them: measured 1.9 ms instead of 0.08 ms at
    # 300 queued turns.
    # The setting rides with the look for expired leases: one round trip. As
    # ``set_config(..., true)`` (``SET LOCAL``) in the look's one row, not a ``SET LOCAL``
    # statement before it: a query of two statements cannot be prepared, so the server
    # parsed and planned the look at every claim; one statement is prepared (psycopg,
    # from its fifth run on a connection), its plan kept.
    while True:  # expired leases first; poison turns fail and are skipped
        turn_id, attempts, resume_pending, _ = conn.execute(
            """SELECT e.turn_id, e.attempts, e.resume_pending,
                set_config('enable_sort', 'off', true)
            FROM (VALUES (1)) AS one LEFT JOIN LATERAL (
                SELECT turn_id, attempts, resume_pending FROM axon_turns
                WHERE status = 'running' AND lease_until < clock_timestamp()
                ORDER BY lease_until LIMIT 1 FOR UPDATE SKIP LOCKED
            ) AS e ON true"""
        ).fetchone()
        if turn_id is None:
            break
        if resume_pending:  # decided: its continuation's first run, not a takeover
            # (the claim's function takes the first expired one itself when it is
            # decided: this is one behind another's lapsed lease, or a race)
            # Sorting goes back on in the same statement (``set_config`` is ``SET
            # LOCAL``; a round trip fewer than a statement of its own): without it
            # the planner reads the session's messages below in hundreds of
            # milliseconds, not a fraction of one.
            resumed = conn.execute(
                f"""UPDATE axon_turns SET owner = %s, epoch = epoch + 1, attempts = 1,
                    resume_pending = false, claim_token = %s || '{RESUMED_TOKEN}',
                    lease_until = clock_timestamp() + make_interval(secs => %s)
                WHERE turn_id = %s
                RETURNING {_COLUMNS}, set_config('enable_sort', 'on', true)""",
                (owner, token, lease, turn_id),
            ).fetchone()[:-1]
            # The decisions moved the session: read it here, not in a load of its
            # own before the continuation's first step (a thread hop and a pool
            # checkout fewer).
            return resumed, RESUMED, load_rows(conn, resumed[1])
        if attempts < max_attempts:
            taken = conn.execute(
                f"""UPDATE axon_turns SET owner = %s, epoch = epoch + 1,
                    attempts = attempts + 1, claim_token = %s,
                    lease_until = clock_timestamp() + make_interval(secs => %s)
                WHERE turn_id = %s RETURNING {_COLUMNS}""",
                (owner, token, lease, turn_id),
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
    return None


_EXPIRED: Final[Any] = ("expired",)
"""What :func:`_start_head` says when a lease has expired: it started nothing."""

_CLAIM = f"SELECT * FROM {CLAIM_FUNCTION_NAME}(%s, %s, %s, %s)"
_CLAIM_SQL: Final = f"SELECT * FROM {CLAIM_FUNCTION_NAME}($1, $2, $3, $4)".encode()
"""The claim's function as :class:`~actors.stores.postgres_lane.LoopLane` prepares it (the
parameters as text; the answer in the binary format)."""
_CLAIM_NAME: Final = b"axon_claim_call"
_CLAIM_KINDS: Final = (
    "BOOLEAN",
    "BOOLEAN",
    "BOOLEAN",
    *(kind for _, kind in CLAIMED_COLUMNS),
)
"""The types of the function's first columns: ``o_expired``, ``o_stored``, ``o_resumed``,
the turn's (the session's columns follow, :data:`_SESSION_AT`)."""
_SESSION_AT: Final = len(_CLAIM_KINDS)
_SESSION_KINDS: Final = tuple(kind for _, kind in SESSION_COLUMNS)


def _found_in(result: Any, at: int) -> Any:
    """What the claim's function answered (its columns from ``at`` on, in the binary
    format): the started turn as :func:`_start_head` says it, ``None`` (none claimable),
    :data:`_EXPIRED`, or a continuation with its session's rows (``RESUMED``)."""
    if result.ntuples == 0:
        return None
    row = read_row(result, 0, _CLAIM_KINDS, at)
    if row[0]:
        return _EXPIRED
    turn = tuple(row[3:_SESSION_AT])
    if turn[0] is None:  # a last save's call that claimed nothing
        return None
    if row[2]:  # a continuation's: the session's rows follow the turn's
        rows = [
            read_row(result, i, _SESSION_KINDS, at + _SESSION_AT) for i in range(1, result.ntuples)
        ]
        return turn, RESUMED, rows
    return turn, STARTED, None if row[1] else []


def _text_column(text: str) -> str:
    """``text`` as a ``TEXT`` column holds it: a NUL (which PostgreSQL refuses) and half
    a character alone (which UTF-8 cannot write) each U+FFFD, as the store writes them
    in a message. Why: a turn failed by a provider's error quoting a NUL or a lone
    ``"\\ud800"`` escape could not be finished (a ``StoreError``, or a raw
    ``UnicodeEncodeError``): its worker then marked it failed with that error in place
    of the provider's."""
    return utf8_text(text).replace("\x00", "\ufffd")


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 text (no lone surrogate)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _start_head(conn: Any, owner: str, lease: float, token: str | None = None) -> _Found | None:
    """The first claimable head in line, started by ``owner`` in one call of the claim's
    function (``None``: none is; :data:`_EXPIRED`: a lease has expired, take it over
    first); its session's rows ``[]`` when the session is not stored (nothing to read),
    else ``None`` (not read). Or a decided turn's continuation, which the function
    claims (before any head) with its session's rows."""
    got = kept_cursor(conn).execute(_CLAIM, (owner, float(lease), TURNS_CHANNEL, token)).fetchall()
    if not got:
        return None
    started = got[0]
    if started[0]:
        return _EXPIRED
    turn = tuple(started[3:_SESSION_AT])
    if started[2]:
        return turn, RESUMED, [tuple(r[_SESSION_AT:]) for r in got[1:]]
    # Whether its session is stored rides along: a first turn's claim need not read it.
    return turn, STARTED, None if started[1] else []


def claim_token() -> str:
    """A new token for one claiming call (its tries share it): the row it claims keeps
    it (``axon_turns.claim_token``), so a retry finds what a lost answer claimed: 32
    random hex digits (a ``uuid4``'s length; its object cost ~2-5 us a claim, one a
    worker's turn: issue 24 goal 3)."""
    return os.urandom(16).hex()


_GIVE_BACK: Final = f"""WITH w AS (
        UPDATE axon_turns SET owner = NULL,
            lease_until = clock_timestamp() - interval '1 second',
            attempts = CASE WHEN claim_token = %s THEN greatest(attempts - 1, 0)
                ELSE attempts END,
            resume_pending = claim_token <> %s, claim_token = NULL
        WHERE status = 'running' AND owner = %s AND claim_token IN (%s, %s || '{RESUMED_TOKEN}')
        RETURNING turn_id
    )
    SELECT pg_notify(%s, current_schema() || ':' || w.turn_id) FROM w"""


def give_back(conn: Any, owner: str, token: str) -> int:
    """What a claiming call of ``owner`` with ``token`` claimed, given back (in
    autocommit, one statement): the call committed but its answer was lost (the
    connection died on the way back), so no worker knows it holds the turn, and its
    lease would lapse into a takeover that counts a second attempt, or fails the turn as
    poison at ``max_attempts`` 1, though no worker ever ran it. It goes back as a
    release leaves a turn (no owner, its lease lapsed: the next claim takes it over at
    once) with the attempt the lost call counted, or, a decided turn's continuation, as
    its decision left it (``resume_pending``). Found by the token the call wrote
    (:data:`~actors.stores.postgres_calls.RESUMED_TOKEN` marks a continuation's) and the
    owner, never another call's claim. How many rows it gave back (0 or 1): none when
    the lost call never committed, or claimed nothing."""
    rows = conn.execute(_GIVE_BACK, (token, token, owner, token, token, TURNS_CHANNEL)).fetchall()
    return len(rows)
