"""Keeping a session's history in memory in step with the store, when others write too.

The turn runner owns the in-memory history (:class:`~runtime.actor_messages.SessionState`); the
store may also be written by other processes or hosts. Two moments bring the two back
together, and both are plain functions here so they can be tested without a turn:

* :func:`adopt_save`: a save finished. If the persister had to rebase it (another writer
  saved in between), the history becomes what the store now holds, followed by this
  session's own messages from the save's start on, exactly the store's new layout;
  unless the store now holds a message the turn took in since the request (steered in,
  another writer's answered copy): then the next save is rebased whole.
* :func:`adopt_record`: a turn is about to start and the stored version moved. The
  history becomes the stored one, followed by whatever this session had not yet managed
  to save (so the model sees the other writer's turns, and nothing of ours is dropped),
  unless the session was deleted since (gone, or started again: its incarnation says so),
  or that unsaved turn's message was answered by another writer (its save refused,
  :class:`~runtime.errors.AnsweredElsewhere`): that turn goes, the stored answer stands.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from runtime.actor_messages import SaveRequest, SaveResult, SessionState
from runtime.errors import AnsweredElsewhere
from runtime.messages import Message
from runtime.store import SessionRecord, rebase


@attrs.frozen(kw_only=True, slots=True)
class Adopted:
    """What adopting the store's view changed in the history."""

    shift: int = 0
    """How far the messages after the adopted prefix moved (add it to their indices)."""
    added: int = 0
    """Messages of another writer that the history holds now and did not before."""
    dropped: int = 0
    """Messages the history held before that the store no longer has."""
    deleted: bool = False
    """The session was deleted since the version the history held (gone, or started
    again: :func:`adopt_record`): what this host still holds of it (its title) is the
    deleted conversation's."""

    @property
    def concurrent(self) -> bool:
        """Whether another writer's work is visible in the change."""
        return bool(self.added or self.dropped)


def adopt_save(state: SessionState, req: SaveRequest, result: SaveResult) -> Adopted:
    """Record in ``state`` what the save ``req`` left in the store (the persister's
    ``result``).

    Only the session's latest request is ever adopted, and nothing else changes the
    layout between its creation and its adoption, so ``req.start`` is still where its
    messages begin in ``state.messages``.
    """
    if result.error is not None:  # nothing was written: save from here again next time
        state.saved_upto = min(state.saved_upto, req.start)
        return Adopted()
    assert result.version is not None
    if result.base is None:  # written where it was asked to: the layout is unchanged
        # What a regenerate cut is gone from the store too, as far as this save carried
        # it: a save made before the cut (the previous turn's, adopted by the
        # regenerate's first) removed none of it (branch attackmarkers).
        state.cut = _less(state.cut, req.cut)
        state.version = result.version
        state.saved_upto = req.start + len(req.messages)
        return Adopted()
    if _meets(result.base, state.messages[req.start + len(req.messages) :]):
        # The other writer stored a message the turn took in after this request (one
        # steered in: the same message posted to another process, which answered it).
        # Adopted, the history held it twice and the next save, based on this version,
        # wrote both copies in place, unchecked (branch rebaseprop). Taken as not
        # adopted: the version stays the one before, so the next save meets the store's
        # and is rebased whole (refused: :class:`~runtime.errors.AnsweredElsewhere`).
        state.saved_upto = min(state.saved_upto, req.start)
        return Adopted()
    state.version = result.version
    state.cut = _less(state.cut, req.cut)  # (dropped by the rebase too: runtime.store.rebase)
    adopted = _replace_prefix(state, req.start, result.base)
    state.saved_upto = len(result.base) + len(req.messages)
    return adopted


def _less(cut: frozenset[str], saved: frozenset[str]) -> frozenset[str]:
    """``cut`` without what a save carrying ``saved`` removed (no set built when either
    is empty: the common case)."""
    if not cut or not saved:
        return cut if not saved else frozenset()
    return cut - saved


def adopt_record(state: SessionState, record: SessionRecord | None) -> Adopted:
    """Make ``state`` the stored session ``record`` plus what ``state`` had not saved yet,
    unless ``record`` is a later incarnation of the session (deleted and started again
    since the version ``state`` holds, :attr:`~runtime.store.SessionRecord.incarnation`):
    what ``state`` had not saved then belongs to the deleted conversation, and goes. So
    it does when ``record`` is ``None`` though ``state`` holds a stored version: the
    session was deleted since (a store loses no session otherwise), and saving what
    ``state`` had not saved would bring the deleted session back holding it."""
    stored = () if record is None else record.messages
    end = state.saved_upto
    deleted = state.version > 0 and (record is None or state.version < record.incarnation)
    if deleted:
        end = len(state.messages)
    unsaved = state.messages[end:]
    if deleted:
        state.cut = frozenset()
    while True:
        if not unsaved:
            state.cut = frozenset()  # (nothing of ours replaces what a regenerate cut)
        try:
            # What a regenerate cut goes from the store's history too, or (another
            # writer's turn after it) its turn is refused as an answered one is: kept,
            # the next save stored the old turn and the new one after the other's.
            base, start = rebase(stored, unsaved, state.cut)
            break
        except AnsweredElsewhere as exc:
            # Our unsaved turn of a message another writer answered (its save was
            # refused): it goes from that message on, the stored answer stands. Again
            # until none is: an earlier unsaved message of ours may have been answered
            # too, its answer stored after the first one found (the rebase reports the
            # first in the store's order, not ours).
            del state.messages[end + _index(unsaved, exc.message_id) :]
            unsaved = state.messages[end:]
    adopted = _replace_prefix(state, end, base)
    if start < len(base) and not deleted:
        # The store keeps an earlier copy of ours (a step saved before the other
        # writer's turn) before messages of that writer's: the history holds them
        # after ``start`` now, and a save from ``start`` sent them as ours. Should that
        # writer save again first (the next step of a turn it runs), the rebase took
        # our stale copies of its messages for ours: its newer ones dropped, their tool
        # results left without their call (the interleavings property, branch
        # rebaseprop). So the store is taken as holding ``base`` (``saved_upto``) on
        # the version before (not the one read): the next save, ours alone, meets the
        # store's version and is rebased, our stale copies dropped there.
        state.saved_upto = len(base)
        return adopted
    # The store holds ``base`` only up to ``start``, where it keeps an earlier copy of
    # ours (none of another writer's after it): the next save starts there.
    state.saved_upto = start
    state.version = 0 if record is None else record.version
    return attrs.evolve(adopted, deleted=True) if deleted else adopted


def _meets(base: Sequence[Message], later: Sequence[Message]) -> bool:
    """Whether a message of ``later`` has its id in ``base``. (A rebased save's only: a
    set of the base's ids, built when the turn took messages in after the request.)"""
    if not later:
        return False
    ids = {message.id for message in base}
    return any(message.id in ids for message in later)


def _index(messages: Sequence[Message], message_id: str) -> int:
    """The index of the message ``message_id`` in ``messages``."""
    return next(i for i, message in enumerate(messages) if message.id == message_id)


def _replace_prefix(state: SessionState, end: int, prefix: Sequence[Message]) -> Adopted:
    """Replace ``state.messages[:end]`` with ``prefix``."""
    before = state.messages[:end]
    had = {m.id for m in before}
    has = {m.id for m in prefix}
    state.messages[:end] = prefix
    return Adopted(
        shift=len(prefix) - end,
        added=sum(m.id not in had for m in prefix),
        dropped=sum(m.id not in has for m in before),
    )
