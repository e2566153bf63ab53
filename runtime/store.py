"""The ``Store`` protocol: where sessions live between turns.

A store keeps, per session, an ordered list of messages and a little metadata. Writes
are *appends from an index*: :meth:`Store.save` replaces the messages from ``start`` on,
so saving turn 500 costs what turn 500 wrote, never a rewrite of the whole session.

Several writers may share one store (two processes on one SQLite file, a web server and
a CLI on the same session). Each session therefore has a *version* that every save
checks and bumps atomically: a writer saves on top of the version it loaded, and a save
based on a version another writer has since replaced fails with
:class:`~runtime.errors.StoreConflict` instead of overwriting that writer's turns.
:func:`rebase` is how the runtime then puts its own messages after the other writer's.
"""

from __future__ import annotations

import contextlib
import inspect  # (loaded already: attrs, imported below, imports it)
import re
import weakref
from collections.abc import Callable, Collection, Iterable, Sequence
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

import attrs

from runtime.chunks import _eq, _hash, _repr
from runtime.errors import AnsweredElsewhere, InvalidCursor, InvalidSessionId
from runtime.messages import Message, UserMessage

_SESSION_ID = r"[A-Za-z0-9_.:-]{1,128}"
"""Compiled on first use (``re.compile`` caches it), not on import (issue 24's start-up
figure)."""


_match: Callable[[str], re.Match[str] | None] | None = None


def _session_id_match(session_id: str) -> re.Match[str] | None:
    """The pattern's ``fullmatch`` of ``session_id``; the pattern compiled on first use
    and kept (``re.compile``'s own cache is a look-up of its own: a turn validates its
    session's id five times, issue 24 goal 1)."""
    global _match
    if _match is None:
        _match = re.compile(_SESSION_ID).fullmatch
    return _match(session_id)


def validate_session_id(session_id: str) -> str:
    """Return ``session_id`` unchanged if it is 1-128 characters of ``[A-Za-z0-9_.:-]``.

    Session ids end up in file names, log lines, SQL parameters and URLs; restricting them
    to a small ASCII alphabet up front means none of those places ever needs escaping and
    an id read back from a store is byte-for-byte the one that was saved.

    Raises :class:`~runtime.errors.InvalidSessionId` (a ``ValueError``) otherwise,
    including for values that are not ``str`` at all.
    """
    if not isinstance(session_id, str) or _session_id_match(session_id) is None:
        raise InvalidSessionId(
            f"invalid session id {session_id!r}: a session id must be 1-128 characters "
            "of letters, digits, '-', '_', '.', ':'"
        )
    return session_id


@attrs.frozen(kw_only=True, slots=True)
class SessionRecord:
    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash
    session_id: str
    messages: tuple[Message, ...]
    meta: dict[str, Any] = attrs.field(factory=dict)
    """Free-form: agent name, parent session, timestamps."""
    version: int = attrs.field(default=0, eq=False)
    """The session's version when it was read; pass it as ``expected_version`` to save on
    top of exactly these messages. Not part of equality: two records holding the same
    messages and meta are the same conversation, whichever write produced them."""
    incarnation: int = attrs.field(default=0, eq=False)
    """The version the session's first save gave it. A session deleted and saved again
    under the same id is a new *incarnation*: every version of it, this one first, is
    above any the deleted one had, so a writer whose save was based on a version below
    this one was writing the deleted conversation (the runtime refuses that save as
    :class:`~runtime.errors.SessionDeleted`, where another writer's turns are rebased
    onto). ``0``: the store does not say (one written before incarnations, or a session
    stored before its store recorded them); nothing is refused then. Not part of
    equality, as ``version``."""


@attrs.frozen(kw_only=True, slots=True)
class SessionInfo:
    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash
    session_id: str
    message_count: int
    meta: dict[str, Any] = attrs.field(factory=dict)
    cursor: str | None = attrs.field(default=None, eq=False)
    """Where this session stands in the listing: pass it as ``after`` to
    :meth:`Store.list_sessions` for the sessions listed after it. Opaque (each store
    writes its own; the built-in ones write the session's place in recency order), and
    not part of equality: it names a place in one listing, not the conversation."""


@attrs.frozen(kw_only=True, slots=True)
class SessionPage:
    """One page of the session listing (:func:`list_page`)."""

    __repr__ = _repr
    __eq__ = _eq
    __hash__ = _hash
    sessions: tuple[SessionInfo, ...]
    next_cursor: str | None = None
    """Pass it as ``after`` for the next page; ``None`` on the last page."""


@runtime_checkable
class Store(Protocol):
    """Session storage. Implementations must be safe to call from Trio tasks.

    **The version rule** (every store keeps it, so no writer ever loses another's turns):
    each session has an integer version, ``0`` while it does not exist. Every successful
    :meth:`save` sets it to a value the session has never had before (the SQLite and
    memory stores add one; a new or re-created session starts above any version a deleted
    one had), and :meth:`load` returns it in :attr:`SessionRecord.version`. When
    ``expected_version`` is given, the check and the write are one atomic step (SQLite:
    inside the ``BEGIN IMMEDIATE`` transaction; PostgreSQL: ``SELECT ... FOR UPDATE`` or a
    conditional ``UPDATE``): if the stored version differs, the save raises
    :class:`~runtime.errors.StoreConflict` and writes nothing.

    **Incarnations** (the built-in stores record them; a store that does not still works):
    :meth:`load` reports in :attr:`SessionRecord.incarnation` the version the session's
    first save gave it. A save that meets a conflict is rebased onto the other writer's
    turns, unless the session was deleted and re-created since the version it was based
    on (its incarnation is above that version): then it is refused, and the deleted
    conversation's turn never lands in the new one. Recording it costs a save nothing
    more: the creating save writes it with the session's row.

    **Deletion marks** (optional, as incarnations; the built-in stores keep them): a store
    may keep, per session id, a number that grows with each deletion of it,
    ``deletions(session_id) -> int`` (``0``: never deleted, or not since long: one
    number per id, however often it is deleted), and read it with the version in one
    go, ``version_and_deletions(session_id) -> (version, deletions)``. A turn of a
    session its host holds nothing stored of reads the mark as it starts
    (:func:`version_and_mark`, in place of the version query it makes anyway); its
    first save reads it again (:func:`deletion_mark`): above the one read at the start,
    the session was deleted since the turn began (created and deleted by another
    process, or created again since), and the save is refused as a deleted session's;
    not above it, a session the save meets was created meanwhile by another writer, and
    the turn is rebased onto it. A store without them: rebased, as before.

    The built-in stores keep the marks of the last :data:`DELETION_MARKS_KEPT` deletions
    only: a deletion's mark is one above the highest the store holds (so an id's mark
    only grows while it is kept), and a mark that many deletions old is dropped (the id
    reads ``0`` again, below any mark a turn read, which refuses nothing). The marks a
    process that creates and deletes sessions without end keeps are so bounded; a turn
    whose first save comes after that many deletions of other sessions since it began
    may miss its own session's deletion (rebased, as a store without marks does).

    **Kept rows** (the built-in stores take them; a store that does not still works): a
    store whose ``save`` takes the keyword ``kept`` (a collection of positions in
    ``messages``) is told that the session, at ``expected_version``, holds the messages
    at those positions already, as they are: it writes the others only (each message
    before the last kept one over its row, the ones after it from there on), and what
    the session holds after the save is what the same save without ``kept`` leaves. A
    turn's assistant message (every step's parts) comes before the turn's tool results
    and changes every step: without it, a step's save rewrote every tool result of the
    turn (:func:`save_keeping`). ``kept`` is a claim about exactly ``expected_version``
    (the save refuses it without one) and never beyond the session's end.

    **Grown rows** (the built-in SQLite and PostgreSQL stores take them; a store that does
    not still works): a
    store whose ``save`` takes the keyword ``grown`` (a collection of positions in
    ``messages``, none of them kept) is told that the assistant message at each of those
    positions is the one the session holds at that place at ``expected_version`` with
    more parts after its own (the same parts first, its other fields maybe changed): a
    running turn's answer, which each step's save sends again one step's parts on. The
    store may then write the message's new parts alone (the built-in ones: its head over
    its row and a segment of the new parts; their readers fold them back), where writing it
    whole made a turn of n steps write n(n+1)/2 steps' parts. What the session holds after
    the save is what the same save without ``grown`` leaves; the runtime passes it only
    while the turn goes on (its last save writes the message whole) (:func:`save_keeping`).
    """

    async def load(self, session_id: str) -> SessionRecord | None:
        """The session (with its version), or ``None`` if it was never saved."""
        ...

    async def save(
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        meta: dict[str, Any] | None = None,
        *,
        expected_version: int | None = None,
    ) -> int:
        """Atomically replace messages ``start..`` with ``messages`` (and merge ``meta``),
        returning the session's new version.

        With ``expected_version``, raise :class:`~runtime.errors.StoreConflict` (writing
        nothing) unless the session's stored version is exactly that. The runtime always
        passes it; ``None`` saves unconditionally, for tools that own the store alone.
        """
        ...

    async def version(self, session_id: str) -> int:
        """The session's current version (``0`` if it does not exist): a cheap query that
        tells a writer whether someone else saved since it last loaded."""
        ...

    async def list_sessions(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[SessionInfo]:
        """The sessions, most recently saved first: all of them with no arguments, else at
        most ``limit`` of them, those listed after the one whose
        :attr:`SessionInfo.cursor` is ``after`` (keyset paging: a page is a range of the
        recency order, read from where the cursor points, never an offset counted from
        the top). Each :class:`SessionInfo` carries its ``cursor``.

        What a walk of pages sees while sessions are saved: a save moves its session to
        the top, above every cursor handed out, so a session saved during the walk and not
        listed yet is not on the later pages (it heads the first page again), and one
        already listed is not listed twice; every session not saved during the walk is
        listed exactly once. A cursor the store did not write, or a ``limit`` below 1, raises
        :class:`~runtime.errors.InvalidCursor` (a ``ValueError``).

        Stores written before paging (``list_sessions(self)``) still work: the runtime
        pages them with :func:`list_page`, which slices their full list."""
        ...

    async def delete(self, session_id: str) -> None:
        """Delete the session, and with it the sessions it owns: the sub-sessions its
        agent tools' calls ran in (``Agent.as_tool``: the sessions whose meta names it
        as their caller, :func:`~runtime.tools.caller_of`, whatever their id: a hashed
        one, :func:`~runtime.tools.sub_session_id`, too), at any depth, with their turns
        queued or waiting (the built-in stores: in one transaction). Nobody else reaches
        a sub-session; left behind, it stayed for good. Deleting an unknown session is
        not an error. A store of before that deletes the one session still works (its
        sub-sessions stay)."""
        ...

    async def aclose(self) -> None: ...


def _takes_paging(store: Any) -> bool:
    """Whether ``store.list_sessions`` takes ``limit`` and ``after`` (a store written
    against the contract since paging), by its signature, remembered per class."""
    cls = type(store)
    known = _PAGING.get(cls)
    if known is None:
        try:
            params = inspect.signature(store.list_sessions).parameters
        except (TypeError, ValueError):
            params = {}  # type: ignore[assignment]
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        known = var_kw or ("limit" in params and "after" in params)
        _PAGING[cls] = known
    return known


_PAGING: dict[type, bool] = {}

_OLD_CURSOR = "i:"
"""The cursor :func:`list_page` writes for a store without paging: ``i:`` and how many
sessions of its full list came before (such a store writes no cursors of its own)."""


async def list_page(store: Store, *, limit: int, after: str | None = None) -> SessionPage:
    """One page of ``store``'s sessions, most recently saved first: at most ``limit``
    (``>= 1``) of them, after the cursor ``after`` (``None``: from the top), with the
    cursor of the next page (``None`` when nothing follows).

    The one place the runtime lists sessions by the page. A store that takes ``limit``
    and ``after`` is asked for ``limit + 1`` (the extra one only says whether a next page
    exists); a store written before paging is asked for its whole list, which is sliced
    by position (its pages shift by one when a session is saved or deleted during the
    walk: one may be repeated or skipped). A bad cursor or limit raises
    :class:`~runtime.errors.InvalidCursor`."""
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidCursor(f"invalid limit {limit!r}: a page holds at least one session")
    if after is not None and not isinstance(after, str):
        raise InvalidCursor(f"invalid cursor {after!r}")
    if _takes_paging(store):
        infos = await store.list_sessions(limit=limit + 1, after=after)
        more = len(infos) > limit
        page = tuple(infos[:limit])
        return SessionPage(sessions=page, next_cursor=page[-1].cursor if more else None)
    start = 0
    if after is not None:
        digits = after.removeprefix(_OLD_CURSOR)
        if not after.startswith(_OLD_CURSOR) or not digits.isdigit() or len(digits) > 18:
            raise InvalidCursor(f"invalid cursor {after!r}")
        start = int(digits)
    infos = await store.list_sessions()
    end = start + limit
    page = tuple(
        attrs.evolve(info, cursor=f"{_OLD_CURSOR}{i}")
        for i, info in enumerate(infos[start:end], start + 1)
    )
    return SessionPage(
        sessions=page, next_cursor=f"{_OLD_CURSOR}{end}" if len(infos) > end else None
    )


async def load_last_turn(store: Store, session_id: str) -> tuple[int, SessionRecord] | None:
    """The session's last turn: ``(the index of its first message, the record of the
    messages from there on)``, the turn from its last assistant message on (every message
    when it has none); ``None`` if the session was never saved.

    What reads a turn's outcome needs (its assistant message, the tool results after it,
    the calls that wait), without the history before it: a store that offers
    ``load_last_turn(session_id)`` itself (the PostgreSQL store: one statement, a few
    rows, however long the session) is asked for it; any other store's whole
    :meth:`Store.load` is cut there, so a store written before this read still serves."""
    own = getattr(store, "load_last_turn", None)
    if own is not None:
        return await own(session_id)  # type: ignore[no-any-return]
    record = await store.load(session_id)
    if record is None:
        return None
    messages = record.messages
    first = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), 0
    )
    return first, attrs.evolve(record, messages=messages[first:])


async def load_last_turns(
    store: Store, session_id: str, turns: int
) -> tuple[int, SessionRecord] | None:
    """The session's last ``turns`` turns, as :func:`load_last_turn` reads the last one:
    ``(the index of its first message, the record of the messages from there on)``, from
    its ``turns``-th last assistant message on (every message when it has fewer);
    ``None`` if the session was never saved.

    What a front end reads of a turn that messages were steered into (an assistant
    message after each steer): a store that offers ``load_last_turns(session_id,
    turns)`` (the PostgreSQL store: one statement) is asked for it; any other store's
    whole :meth:`Store.load` is cut there."""
    if turns < 1:
        raise ValueError(f"turns must be at least 1, not {turns}")
    if turns == 1:
        return await load_last_turn(store, session_id)
    own = getattr(store, "load_last_turns", None)
    if own is not None:
        return await own(session_id, turns)  # type: ignore[no-any-return]
    record = await store.load(session_id)
    if record is None:
        return None
    messages = record.messages
    assistants = [i for i, m in enumerate(messages) if m.role == "assistant"]
    first = assistants[-turns] if len(assistants) >= turns else 0
    return first, attrs.evolve(record, messages=messages[first:])


async def has_user_messages(store: Store, session_id: str, ids: Iterable[str]) -> frozenset[str]:
    """Which of ``ids`` are the ids of user messages stored in the session (none for a
    session never saved; an assistant's or a tool's message of that id is not one): "was
    this message sent before", which a front end asks of an A2A ``message/send`` (the ids
    a client gives are those of the messages it sends, the user's).

    A store that offers ``has_user_messages(session_id, ids)`` (the PostgreSQL and SQLite
    stores: one statement on an index of the user messages' ids, whatever the session's
    length) is
    asked for it; any other store's whole :meth:`Store.load` is read (the default a store
    of a third party keeps, as :func:`load_last_turn`'s)."""
    wanted = frozenset(ids)
    if not wanted:
        return frozenset()
    own = getattr(store, "has_user_messages", None)
    if own is not None:
        return frozenset(await own(session_id, wanted))
    record = await store.load(session_id)
    if record is None:
        return frozenset()
    return frozenset(m.id for m in record.messages if isinstance(m, UserMessage) and m.id in wanted)


DELETION_MARKS_KEPT = 10_000
"""How many deletions' marks the built-in stores keep (:class:`Store`, "Deletion
marks"): the marks of older deletions are dropped, so the marks a store holds are
bounded whatever the number of sessions deleted. A turn's first save that comes after
more deletions than this since its turn began may miss its session's deletion."""


async def deletion_mark(store: Store, session_id: str) -> int | None:
    """How many times ``session_id`` was deleted from ``store`` (its *deletion mark*, see
    :class:`Store`), or ``None`` for a store that keeps no such mark (it has no
    ``deletions`` method: a store written before them, whose saves are rebased as
    before). Read only when a save based on no version meets a conflict."""
    own = getattr(store, "deletions", None)
    if own is None:
        return None
    return await own(session_id)  # type: ignore[no-any-return]


def fence_under(store: Any, session_id: str, caller_id: str) -> None:
    """Have ``store`` fence the saves of ``session_id``, a sub-session an agent tool of a
    turn of ``caller_id`` runs in (``Agent.as_tool``), by the claim that turn's saves are
    fenced by, if it fences them (a worker's PostgreSQL store:
    :meth:`~actors.stores.postgres.PostgresStore.fence_under`); nothing otherwise. The
    sub-turn's work is the calling turn's: once another worker holds that turn, none
    of it may be saved."""
    fence = getattr(store, "fence_under", None)
    if fence is not None:
        fence(session_id, caller_id)


def fence_of(store: Any, session_id: str) -> object | None:
    """The fence ``store`` would run a save of ``session_id`` under now, if it fences saves
    (a worker's PostgreSQL store: :meth:`~actors.stores.postgres.PostgresStore.fence_of`);
    ``None`` otherwise. Taken as a turn begins (``RunTurn.fence``) and carried by each of
    its saves (``SaveRequest.fence``) to the store's ``save`` (its ``fence``): a save that
    reaches the store late is judged by the claim its turn ran under, not by what the
    store still remembers of that claim."""
    return store.fence_of(session_id) if takes_fence(store) else None


def takes_fence(store: Any) -> bool:
    """Whether ``store``'s ``save`` takes the ``fence`` :func:`fence_of` gave. Remembered
    by store: asked as every turn begins, and a ``getattr`` that misses (every store but
    a worker's) builds and drops an AttributeError."""
    try:
        known = _FENCES.get(store)
    except TypeError:  # (not weakly referable, or unhashable: asked each time)
        return callable(getattr(store, "fence_of", None))
    if known is None:
        known = callable(getattr(store, "fence_of", None))
        _FENCES[store] = known
    return known


_FENCES: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def release_under(store: Any, session_id: str) -> Callable[[], None] | None:
    """What has ``store`` drop the fence :func:`fence_under` gave ``session_id``, to be
    called once its host closed the sub-session and every save of it sent before is
    written (:meth:`~actors.stores.postgres.PostgresStore.release_under`); ``None`` when
    there is none to drop (a store that fences nothing, a session that is no fenced
    sub-session)."""
    release = getattr(store, "release_under", None)
    return None if release is None else release(session_id)


def checks_absent_mark(store: Store) -> bool:
    """Whether ``store``'s ``save`` takes ``absent_mark``: with ``expected_version=0`` and
    ``absent_mark`` a deletion mark read before (:func:`deletion_mark`), the save checks
    the session's mark inside its own transaction, under the write it guards, and raises
    :class:`~runtime.errors.SessionDeleted`, writing nothing, when the mark is above
    ``absent_mark``: the session was created and deleted since it was read. A store
    without it (``checks_absent_mark`` not true) has the mark read apart, just before
    the save, where a create and delete by another process between the two is missed.

    Asked as :func:`_takes_kept` asks for ``kept``: the keyword named in ``save``'s
    signature, or a save taking any keyword (a wrapper's) of a store that says it checks
    (``checks_absent_mark``); a subclass whose ``save`` names its keywords without it (a
    save of before the keyword) has the mark read apart."""
    if getattr(store, "checks_absent_mark", False) is not True:
        return False
    try:
        params = inspect.signature(store.save).parameters
    except (TypeError, ValueError):
        return False
    return "absent_mark" in params or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    )


async def version_and_mark(store: Store, session_id: str) -> tuple[int, int | None]:
    """The session's version and deletion mark (:func:`deletion_mark`), read together:
    what a turn of a session its host holds nothing stored of reads before it begins.

    A store with ``version_and_deletions`` is asked for both in one read (no more than
    the version query every turn makes); one with ``deletions`` alone, for the mark
    first and then the version (read in that order, a deletion between the two cannot
    hide: a session created since shows in the version, and the turn adopts it); any
    other store, for its version (mark ``None``)."""
    both = getattr(store, "version_and_deletions", None)
    if both is not None:
        version, mark = await both(session_id)
        return version, mark
    mark = await deletion_mark(store, session_id)
    return await store.version(session_id), mark


def _takes_kept(store: Any) -> bool:
    """Whether ``store.save`` takes ``kept`` (:class:`Store`'s kept rows): named in its
    signature, or a save taking any keyword (a wrapper's) of a store that says it keeps
    rows (``keeps_rows``). By the save's function, remembered: a turn saves every step."""
    return _save_takes(store, "kept", "keeps_rows", _KEPT)


def takes_grown(store: Any) -> bool:
    """Whether ``store.save`` takes ``grown`` (:class:`Store`'s grown rows): named in its
    signature, or a save taking any keyword (a wrapper's) of a store that says it grows
    rows (``grows_rows``). By the save's function, remembered, as :func:`_takes_kept`."""
    return _save_takes(store, "grown", "grows_rows", _GROWN)


def _save_takes(
    store: Any, keyword: str, flag: str, known_by_save: weakref.WeakKeyDictionary[Any, bool]
) -> bool:
    """Whether ``store.save`` takes ``keyword``: named in its signature, or a save taking
    any keyword (a wrapper's) of a store whose attribute ``flag`` is ``True``. Remembered
    in ``known_by_save`` by the save's function: asked at every step's save, and
    :func:`inspect.signature` is not cheap."""
    save = store.save
    fn = getattr(save, "__func__", save)
    try:
        known = known_by_save.get(fn)
    except TypeError:  # (not weakly referable: asked each time)
        known = None
    if known is not None:
        return known
    try:
        params = inspect.signature(save).parameters
    except (TypeError, ValueError):
        params = {}  # type: ignore[assignment]
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    known = keyword in params or (var_kw and getattr(store, flag, False) is True)
    with contextlib.suppress(TypeError):
        known_by_save[fn] = known
    return known


_KEPT: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()
_GROWN: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


async def save_keeping(
    store: Store,
    session_id: str,
    start: int,
    messages: Sequence[Message],
    meta: dict[str, Any] | None,
    *,
    kept: Collection[int],
    expected_version: int,
    grown: Collection[int] = (),
    **options: Any,
) -> int:
    """:meth:`Store.save` of ``messages`` from ``start`` on top of ``expected_version``,
    where the session holds the messages at positions ``kept`` already, as they are; the
    new version.

    A step's save sends its turn whole (a rebase needs it whole) and the turn's
    assistant message, which changes every step, comes before its tool results: a store
    that takes ``kept`` (:class:`Store`'s kept rows) writes that message's row and the
    step's new results alone, where a save from the assistant message rewrote every tool
    result of the turn at every step (30 steps of 100 KB results: ~45 MB for a turn of
    3 MB). Any other store saves from the first message not kept, as before. Either way
    the kept messages at the start are not sent. ``grown``: the positions of messages
    that extend the ones stored there (:class:`Store`'s grown rows), passed on to a store
    that takes them (:func:`takes_grown`; any other store writes them whole).
    ``options``: the store's own keywords (``ends``)."""
    positions = kept if isinstance(kept, frozenset | set | range) else frozenset(kept)
    same = 0  # (a set: a first save of a long history keeps all of it at its next step)
    while same < len(messages) and same in positions:
        same += 1
    rest = list(map(same.__rsub__, filter(same.__lt__, positions)))  # (i - same, in C:
    # a step's save keeps every result of its turn so far, one Python step each before)
    if grown and takes_grown(store):
        options = {**options, "grown": [i - same for i in grown if i >= same]}
    if rest and _takes_kept(store):
        return await store.save(  # type: ignore[call-arg]
            session_id,
            start + same,
            messages[same:],
            meta,
            expected_version=expected_version,
            kept=rest,
            **options,
        )
    return await store.save(
        session_id,
        start + same,
        messages[same:],
        meta,
        expected_version=expected_version,
        **options,
    )


def rebase(
    stored: Sequence[Message], ours: Sequence[Message], cut: Collection[str] = ()
) -> tuple[tuple[Message, ...], int]:
    """What a writer whose save met a conflict keeps of the store, to append ``ours`` to.

    ``stored`` is the session as the store holds it now, ``ours`` the messages the writer
    was saving. Any earlier copy of one of ``ours`` in ``stored`` (the same message
    ``id``: a step of this turn saved before the other writer appended its turn) is
    dropped, so the result followed by ``ours`` holds every message exactly once: the
    other writer's turns first, then this writer's turn whole, its tool calls still
    followed by their results. Returns that base and the index of the first stored
    message it does not keep unchanged (where the save has to start).

    A stored copy of one of our *user* messages followed by an assistant or tool message
    that is not ours is another writer's answer to it (the message posted to two
    processes at once): :class:`~runtime.errors.AnsweredElsewhere`, nothing to append.
    Only past ``start`` (our earlier saves and what followed them): a save that met no
    conflict never gets here.

    ``cut``: the ids of the stored messages our save replaces (a regenerate cut its
    session's last turn, :attr:`~runtime.actor_messages.SaveRequest.cut`). Still stored
    with nothing of another writer's after them (it changed the session's meta, marked
    the old answer), they are dropped as our earlier copies are: the turn replaced.
    Followed by another writer's messages (its turn came after the one regenerated),
    :class:`~runtime.errors.AnsweredElsewhere`: replacing the turn would drop that
    writer's, keeping it stored the question twice (the old turn, the new one after the
    other writer's: branch ``markers``), as an edit under the same id is refused.
    """
    ids = {message.id for message in ours}
    if cut:
        at = next((i for i, message in enumerate(stored) if message.id in cut), None)
        if at is not None:
            if any(m.id not in cut and m.id not in ids for m in stored[at:]):
                asked = next((m.id for m in ours if type(m) is UserMessage), next(iter(cut)))
                raise AnsweredElsewhere(
                    f"message {asked!r} regenerates a turn another process's turn came "
                    "after since: replacing it would drop that turn; the stored one "
                    "stands, this turn was not saved",
                    message_id=asked,
                )
            ids.update(cut)
    base = tuple(message for message in stored if message.id not in ids)
    start = next((i for i, message in enumerate(stored) if message.id in ids), len(stored))
    for here, after in pairwise(stored[start:]):
        if (
            type(here) is UserMessage
            and here.id in ids
            and after.id not in ids
            and after.role in _ANSWERS
        ):
            raise AnsweredElsewhere(
                f"message {here.id!r} was answered by another process (the same message "
                "sent to two at once): its stored answer stands, this turn was not saved",
                message_id=here.id,
            )
    return base, start


_ANSWERS = frozenset(("assistant", "tool"))
"""The roles of a message that answers the user message before it."""
