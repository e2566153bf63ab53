"""The fences of a PostgreSQL store's saves: the lease a worker's saves of a session are
checked against (:class:`Fence`, with the claim that may ride on a turn's last save and
a suspension), the checks of the turn's row in a save's transaction (:func:`_check_fence`),
what a save's own write left there (:func:`_own_write`, :func:`decision_written`: a lost
answer's retry finds it), and the session's lock a save's guard takes
(:data:`LOCK_SESSION`); and the fences a store keeps (:class:`FenceKeeping`, mixed into
:class:`~actors.stores.postgres.PostgresStore`: its fenced blocks, the sub-sessions fenced
by their calling turn's claim, the fence each save runs under)."""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from actors.stores.postgres_calls import STATUS_COLUMNS
from runtime.errors import LeaseLost, SessionDeleted
from runtime.messages import Message
from runtime.turn_queue import SteerWatch

ENDED_REMEMBERED = 65536
"""Sessions whose fence ended that a store remembers, to refuse a late save of their turn
(least recently ended first out: a session's entry is a few hundred bytes, and one that
drops out was given up long before, its late save long answered). A turn's own saves
do not depend on it: they carry the fence their turn began under
(:meth:`FenceKeeping.fence_of`); it serves the saves that carry none (a store's caller
saving a session outside a turn) and the sub-sessions opened past their calling turn's
block (:meth:`FenceKeeping.fence_under`)."""


class FenceBlock:
    """Whether a claimed session's fenced block (:meth:`FenceKeeping.fenced`) ended:
    shared by its :class:`Fence` and the fences of the sub-sessions under it, and carried
    with them by every save of a turn that began under one (``RunTurn.fence``,
    ``SaveRequest.fence``). A late save tells from it, not from a map of ended blocks,
    that its block is over."""

    __slots__ = ("ended",)

    def __init__(self, ended: bool = False) -> None:
        self.ended = ended


@attrs.frozen(kw_only=True, slots=True)
class Fence:
    """The lease a worker's saves of one session are checked against."""

    turn_id: str
    owner: str
    epoch: int
    on_lost: Callable[[], None] | None = attrs.field(default=None, eq=False)
    """Called (from the Trio thread) when a save was refused: the worker stops the turn."""
    on_deleted: Callable[[], None] | None = attrs.field(default=None, eq=False)
    """Called instead of :attr:`on_lost` (when set) for a save refused because the
    session was deleted while the turn ran (:meth:`PostgresStore.delete` ended its row):
    no other worker holds the turn, the worker ends it as deleted."""
    in_save: (
        Callable[[Any, Sequence[Message], Mapping[str, Any] | None, str | None], bool] | None
    ) = attrs.field(default=None, eq=False)
    """Run in each fenced save's transaction once the session is written, with the saved
    messages, meta and ``ends`` (the turn's finish reason when the save is its last,
    :attr:`runtime.actor_messages.SaveRequest.ends`): it may write the turn's row in the
    same commit (the turn queue suspends a turn that waits for a person with the step
    that asks, and finishes a turn with its last step: one transaction instead of two).
    ``True`` when it wrote; then :attr:`on_commit` is called once the save committed."""
    saved: bool = False
    """The turn's row says ``saved`` already (a continuation, a takeover after a save):
    its saves need not mark it, one statement fewer in the first."""
    on_commit: Callable[[], None] | None = attrs.field(default=None, eq=False)
    """Called (from the Trio thread) after a save whose :attr:`in_save` wrote committed."""
    watch: SteerWatch | None = attrs.field(default=None, eq=False)
    """Told of the turn's ``steers`` count each committed save's fence check read
    (:class:`runtime.turn_queue.SteerWatch`)."""
    one_call: (
        Callable[[Sequence[Message], Mapping[str, Any] | None, str | None], bool | Suspend | None]
        | None
    ) = attrs.field(default=None, eq=False)
    """With :attr:`in_save`: whether a save of these messages, meta and ``ends`` may go as
    one call of the save function (:data:`SAVE_FUNCTION`), asked before it is sent:
    ``None`` no (:attr:`in_save` has more to write than the turn's end or suspension:
    the transaction), ``False`` yes, ``True`` yes, and the call ends the turn's row
    ``done`` with ``ends``, a :class:`Suspend` yes, and the call suspends the turn's row
    (then :attr:`on_commit` is called once it committed). Without it a fence with an
    :attr:`in_save` always saves in the transaction."""
    claim_next: Callable[[], RidingClaim | None] | None = attrs.field(default=None, eq=False)
    """Asked right before a save that ends the turn in its call (:attr:`one_call` said
    ``True``) is sent: ``None``, or the claim of the next turn for this fence's owner
    rides on it (:data:`SAVE_NEXT_FUNCTION`), as the :class:`RidingClaim` says."""
    token: object = attrs.field(factory=object, eq=False, repr=False)
    """This fence's identity, kept by its copy without callbacks (:attr:`PostgresStore._after`):
    a release (:meth:`PostgresStore.release_under`) drops the fence it was given, not a
    later one of the same claim (the sub-session opened again)."""
    under: str | None = None
    """Set on the fence of a sub-session an agent tool of the claimed turn runs in
    (:meth:`PostgresStore.fence_under`): the claimed turn's session. Such a fence only
    checks the claim (the turn's row read ``FOR SHARE``): refused once another claim
    took the turn (its epoch moved) or its session was deleted while it ran, whatever
    the row's status (a sub-turn cancelled with its calling turn may save after that
    turn ended or suspended: the save function refuses a turn not running, and the
    save is made again in a transaction, which checks the claim alone). Nothing of the
    row is written (no ``saved`` mark, end or suspension); no callback but
    :attr:`on_lost` and :attr:`on_deleted` (the calling turn's, while its fenced block
    lasts)."""
    block: FenceBlock = attrs.field(factory=FenceBlock, eq=False, repr=False)
    """The fenced block this fence is of: its own (a claimed session's), or its calling
    session's (:attr:`under`). Marked ended as the block ends; a save carrying this
    fence (:meth:`FenceKeeping.carried_fence`) is then refused (a claimed session's) or
    checked without the callbacks (a sub-session's)."""


@attrs.frozen(kw_only=True, slots=True)
class RidingClaim:
    """The claim of the next turn riding on a turn's last save (:attr:`Fence.claim_next`)."""

    lease: float
    """The claimed turn's lease, in seconds."""
    on_answer: Callable[[Any], None]
    """Given the call's result (in the binary format, the claim's columns from
    :data:`SAVE_NEXT_CLAIM_AT` on) once the save is known committed, before anything else
    runs on the event loop."""
    token: str
    """The claiming call's token, kept by the row it claims (``axon_turns.claim_token``)."""
    give_back: Callable[[Any], Any]
    """Run on a connection when the save's answer was lost after its commit (its retry
    found its own write): what the lost answer claimed is given back with its attempt,
    as no worker knows it holds it."""


@attrs.frozen(slots=True)
class Suspend:
    """:attr:`Fence.one_call`'s answer for a save whose call also suspends the turn's row
    (``awaiting-input``, no owner, no lease) until ``expires_at`` (wall clock; ``None``:
    no deadline)."""

    expires_at: float | None


@attrs.frozen(kw_only=True, slots=True)
class LockedSession:
    """What a save's guard returns when its own statement locked the session's row
    (:data:`LOCK_SESSION`): the row's ``(meta, version)``, ``None`` when there is none."""

    row: tuple[Any, int] | None


LOCK_SESSION: Final = (
    "LEFT JOIN LATERAL (SELECT meta, version FROM axon_sessions WHERE session_id = %s "
    "FOR UPDATE) AS s ON true"
)
"""The session's row locked for a save, as a join a guard's statement ends with (selecting
``s.meta, s.version``): after the statement's earlier joins, so in the order a save locks
(the turn's row first, then the session's)."""


_SHARE_TURN = "SELECT owner, epoch, status, steers FROM axon_turns WHERE turn_id = %s FOR SHARE"
_MARK_TURN = (
    "UPDATE axon_turns SET saved = true WHERE turn_id = %s RETURNING owner, epoch, status, steers"
)
"""The fence's look at its turn's row, locked: plain, or marking the turn ``saved`` (its
first save; a refused save rolls the mark back with everything else)."""


def decision_written(
    conn: Any, session_id: str, turn_id: str, start: int, bodies: Sequence[bytes]
) -> tuple[int, tuple[Any, ...]] | None:
    """:meth:`PostgresStore._decision_written`'s read on ``conn``: also run by a decision
    saved in the transaction (:mod:`actors.stores.turn_decisions`), inside its retry."""
    rows = conn.execute(
        """SELECT s.version, m.body, m.xmin = s.xmin
        FROM axon_sessions AS s JOIN axon_messages AS m
            ON m.session_id = s.session_id AND m.idx >= %s
        WHERE s.session_id = %s ORDER BY m.idx""",
        (start, session_id),
    ).fetchall()
    if not rows or not all(same for _, _, same in rows):
        return None
    if [bytes(body) for _, body, _ in rows] != [bytes(body) for body in bodies]:
        return None
    turn = conn.execute(
        f"SELECT {', '.join(STATUS_COLUMNS)} FROM axon_turns WHERE turn_id = %s",
        (turn_id,),
    ).fetchone()
    return None if turn is None else (int(rows[0][0]), tuple(turn))


def _check_fence(conn: Any, fence: Fence, session_id: str, steers: list[int] | None = None) -> None:
    """Raise :class:`LeaseLost` unless ``fence`` still holds its turn (row-locked, so a
    takeover's epoch bump waits for this transaction, or this one sees it); the turn's
    ``steers`` count goes to ``steers``."""
    row = conn.execute(_SHARE_TURN, (fence.turn_id,)).fetchone()
    _check_fence_row(row, fence, session_id)
    if steers is not None:
        steers.append(row[3])


def _own_write(
    fence: Fence, ends: str | None, suspend: Suspend | None
) -> tuple[str | None, int, str] | None:
    """The turn's row as a save that ends (``ends``) or suspends (``suspend``) it left it
    (owner, epoch, status): what a retry of that save finds when the first try committed
    and only its answer was lost. Nothing else writes those: another worker's takeover
    bumps the epoch, a release keeps the row ``running``, a poison turn is ``failed``."""
    if ends is not None:
        return (fence.owner, fence.epoch, "done")
    if suspend is not None:
        return (None, fence.epoch, "awaiting-input")
    return None


class _DeletedWhileRunning(LeaseLost, SessionDeleted):
    """A fenced save refused because the session was deleted while its turn ran: the
    delete ended the turn's row ``cancelled`` with no owner at the claim's epoch (no other
    writer leaves a held row so). A lost lease to the worker (it writes nothing more) and
    a deleted session to the turn runner (the turn ends quietly, ``session deleted``)."""


def _check_fence_row(row: Any, fence: Fence, session_id: str) -> None:
    if row is not None and (row[0], row[1], row[2]) == (None, fence.epoch, "cancelled"):
        what = "the session" if fence.under is None else f"its calling session {fence.under!r}"
        raise _DeletedWhileRunning(
            f"save of session {session_id!r} refused: {what} was deleted while turn "
            f"{fence.turn_id} ran (worker {fence.owner}, epoch {fence.epoch})",
            session_id=session_id,
        )
    if fence.under is not None:  # a sub-session's: the claim, whatever the turn's status
        if row is None or row[1] != fence.epoch:
            held = "no such turn" if row is None else f"owner {row[0]}, epoch {row[1]}, {row[2]}"
            raise LeaseLost(
                f"save of session {session_id!r} refused: it is a sub-turn's of turn "
                f"{fence.turn_id} of session {fence.under!r}, which worker {fence.owner} "
                f"(epoch {fence.epoch}) no longer holds ({held})"
            )
        return
    if row is None or (row[0], row[1], row[2]) != (fence.owner, fence.epoch, "running"):
        held = "no such turn" if row is None else f"owner {row[0]}, epoch {row[1]}, {row[2]}"
        raise LeaseLost(
            f"save of session {session_id!r} refused: worker {fence.owner} (epoch "
            f"{fence.epoch}) no longer holds turn {fence.turn_id} ({held})"
        )


class FenceKeeping:
    """The fences a store keeps for its sessions' saves (mixed into
    :class:`~actors.stores.postgres.PostgresStore`, whose ``__init__`` sets the
    attributes below and documents them): the worker's fenced blocks, the sub-sessions
    fenced by their calling turn's claim, and the fence a save runs under."""

    if TYPE_CHECKING:  # set by PostgresStore.__init__
        _fences_closed: bool
        _fences: dict[str, Fence]
        _ended: OrderedDict[str, tuple[str, str, int]]
        _marked: set[str]
        _under: dict[str, list[str]]
        _after: OrderedDict[str, Fence]

    # -- keeping them --------------------------------------------------------------------------

    @contextlib.contextmanager
    def fenced(self, session_id: str, fence: Fence) -> Iterator[None]:
        """While inside, every save of ``session_id`` is fenced by ``fence``; after,
        until the session's next fenced block, every save of it is refused (unless
        ``unfenced``): one made for the turn reaches the store only once the worker has
        left the block if it outlived the turn's wait for it, and the worker may have
        given the turn up by then (another worker may have saved the session since)."""
        self._ended.pop(session_id, None)
        self._after.pop(session_id, None)
        self._fences[session_id] = fence
        fence.block.ended = False  # (a fence given to a block again: open once more)
        if fence.saved:
            self._marked.add(fence.turn_id)
        try:
            yield
        finally:
            # Every save carrying this fence (its turn's, and its sub-turns') is late now:
            # told so by the fence it carries, however many blocks end after this one.
            fence.block.ended = True
            self._marked.discard(fence.turn_id)
            for sub in self._under.pop(session_id, ()):
                held = self._fences.get(sub)
                if held is not None and held.under == session_id:
                    del self._fences[sub]
                    self._fence_after(sub, held)
            if self._fences.get(session_id) is fence:
                del self._fences[session_id]
                self._ended[session_id] = (fence.turn_id, fence.owner, fence.epoch)
                if len(self._ended) > ENDED_REMEMBERED:
                    self._ended.popitem(last=False)

    def fence_under(self, session_id: str, caller_id: str) -> None:
        """Fence every save of ``session_id`` (a sub-session an agent tool runs in:
        ``Agent.as_tool``) by the claim the saves of ``caller_id`` (the calling session)
        are fenced by (or were: a tool may outlive its calling turn's fenced block), until
        the sub-session is fenced again (another call's open, a turn of its own claimed
        here); nothing when the calling session's saves are not fenced here (no
        worker's turn).

        A sub-session is not the claimed session, and its saves were not fenced: a worker
        paused past its lease inside a sub-turn, whose calling turn another worker took
        over (running the sub-turn again, saving the sub-session), had its aborted
        sub-turn's save meet that worker's version, taken by the persister for another
        writer's and rebased after it. Fenced by the calling turn's claim, it is refused
        (:class:`~runtime.errors.LeaseLost`) however the sub-turn ended. The claim is
        only checked (:attr:`Fence.under`). Deeper sub-sessions (an agent tool of a
        sub-agent) are fenced by the same claim, through their caller's fence."""
        held = self._fences.get(session_id)
        if held is not None and held.under is None:
            return  # a turn of its own claimed here: its saves are fenced by that claim
        caller = self._fences.get(caller_id)
        late = caller is None
        if caller is None:  # (opened as its calling turn ended: its tool outlived it)
            caller = self._after.get(caller_id)
        if caller is None and caller_id in self._ended:
            turn_id, owner, epoch = self._ended[caller_id]
            caller = Fence(turn_id=turn_id, owner=owner, epoch=epoch, block=FenceBlock(True))
        if caller is None:
            return
        root = caller.under if caller.under is not None else caller_id
        fence = Fence(
            turn_id=caller.turn_id,
            owner=caller.owner,
            epoch=caller.epoch,
            on_lost=caller.on_lost,
            on_deleted=caller.on_deleted,
            under=root,
            block=caller.block,
        )
        self._ended.pop(session_id, None)
        self._after.pop(session_id, None)
        self._fences.pop(session_id, None)
        if late or root not in self._fences:
            self._fence_after(session_id, fence)
            return
        self._fences[session_id] = fence
        subs = self._under.setdefault(root, [])
        if session_id not in subs:
            subs.append(session_id)

    def release_under(self, session_id: str) -> Callable[[], None] | None:
        """What drops the fence :meth:`fence_under` gave ``session_id`` (``None``: it has
        none), to be called once no save of the sub-turns it fenced can come: its host
        closed the sub-session and the saves sent before are written
        (``Host.close_session``). Before, such a fence stayed in :attr:`_after` until
        :data:`ENDED_REMEMBERED` later ones pushed it out, those of sub-sessions long
        closed as much as those of a sub-turn still running past its calling turn: a
        late save of that one, pushed out, was written unfenced. Now the bound holds the
        fences of sub-sessions still open here only. The fence it was given only: one
        fenced since (opened again) stays."""
        held = self._fences.get(session_id)
        if held is None or held.under is None:
            held = self._after.get(session_id)
        if held is None or held.under is None:
            return None
        token = held.token

        def release() -> None:
            fence = self._fences.get(session_id)
            if fence is not None and fence.token is token:
                del self._fences[session_id]
                subs = self._under.get(fence.under or "")
                if subs is not None and session_id in subs:
                    subs.remove(session_id)
            fence = self._after.get(session_id)
            if fence is not None and fence.token is token:
                del self._after[session_id]

        return release

    def _fence_after(self, session_id: str, fence: Fence) -> None:
        """Keep checking ``session_id``'s saves against ``fence``'s claim once its calling
        turn's block ended (:attr:`_after`), without the callbacks."""
        self._after[session_id] = attrs.evolve(fence, on_lost=None, on_deleted=None)
        self._after.move_to_end(session_id)
        if len(self._after) > ENDED_REMEMBERED:
            self._after.popitem(last=False)

    def close_fences(self) -> None:
        """Refuse every fenced save from now on (a worker stopping at once): a turn cut
        here keeps only the steps it committed, as if its worker had been killed."""
        self._fences_closed = True

    def fence_of(self, session_id: str) -> Fence | None:
        """The fence the saves of a turn of ``session_id`` beginning now are to run under,
        wherever they reach the store (``None``: none known here): its host puts it on
        the turn (``RunTurn.fence``), the turn on each of its saves, and the persister
        gives it to :meth:`~actors.stores.postgres.PostgresStore.save` (its ``fence``).
        Carried so, a save that reaches the store late is checked against its turn's
        claim (a sub-session's) or refused (a claimed session's, its block over), where
        the store's maps of ended blocks (:attr:`_ended`, :attr:`_after`), bounded at
        :data:`ENDED_REMEMBERED`, forgot the oldest: such a save was written unfenced.
        One of a session whose block ended already is an ended fence: refused as late.

        Without its callbacks (they hold the worker's turn, its stream and history: a
        save that outlived ``SAVE_TIMEOUT`` stays with its runner until the session's
        next turn); a save made while its block lasts runs under the block's own fence,
        found by the block they share (:meth:`_save_fence`)."""
        fence = self._fences.get(session_id)
        if fence is None:
            fence = self._after.get(session_id)  # (without callbacks already)
        else:
            fence = attrs.evolve(
                fence,
                on_lost=None,
                on_deleted=None,
                in_save=None,
                on_commit=None,
                watch=None,
                one_call=None,
                claim_next=None,
            )
        if fence is None and session_id in self._ended:
            turn_id, owner, epoch = self._ended[session_id]
            fence = Fence(turn_id=turn_id, owner=owner, epoch=epoch, block=FenceBlock(True))
        return fence

    def _save_fence(self, session_id: str, carried: Fence | None = None) -> Fence | None:
        """The fence a save of ``session_id`` runs under (``None``: none, the session is
        no fenced turn's), or :class:`LeaseLost` for a save that must not reach the store:
        one that outlived its fenced block (its worker may have given the turn up, and
        another worker saved the session since), or any fenced one once the worker is
        stopping at once (:meth:`close_fences`). ``carried``: the fence the save's turn
        began under (:meth:`fence_of`), which decides alone; without one the store's own
        (a save not of a turn, or of a store's caller that carries none)."""
        if carried is not None:
            fence: Fence | None = self._fences.get(session_id)
            if fence is None or fence.block is not carried.block:
                if carried.block.ended and carried.under is None:
                    raise LeaseLost(
                        f"save of session {session_id!r} refused: it reached the store after "
                        f"worker {carried.owner} (epoch {carried.epoch}) gave turn "
                        f"{carried.turn_id} up"
                    )
                # A sub-turn's past its calling turn's block (the claim checked on, no
                # callback called), or of a fence the session's no longer is.
                fence = carried
            # else: its block lasts, and the session's fence now is of it (callbacks and all)
        else:
            fence = self._fences.get(session_id)
            if fence is None:
                fence = self._after.get(session_id)  # (a sub-session's, checked on)
            if fence is None and session_id in self._ended:
                turn_id, owner, epoch = self._ended[session_id]
                raise LeaseLost(
                    f"save of session {session_id!r} refused: it reached the store after "
                    f"worker {owner} (epoch {epoch}) gave turn {turn_id} up"
                )
        if fence is not None and self._fences_closed:
            raise LeaseLost(
                f"save of session {session_id!r} refused: worker {fence.owner} is stopping; "
                f"turn {fence.turn_id} keeps its committed steps"
            )
        return fence

    def _fenced_save_committed(self, fence: Fence, wrote: list[bool], steers: list[int]) -> None:
        """After a fenced save committed: its ``watch`` learns the turn's count of steering
        submits the fence check read (``steers``), later saves of the turn need not mark
        it ``saved``, and ``on_commit`` hears of a commit its ``in_save`` wrote to (``wrote``:
        the turn row suspended)."""
        if fence.watch is not None and steers:
            fence.watch.saw(steers[-1])
        if fence.under is None:  # (a sub-session's save marks nothing: its turn's may)
            self._marked.add(fence.turn_id)
        if any(wrote) and fence.on_commit is not None:
            fence.on_commit()
