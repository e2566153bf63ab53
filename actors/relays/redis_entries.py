"""What the Redis Streams relay keeps in Redis, and how a reader proves it whole.

The layout of the relay's keys and the format of a turn's stream entries, with what reads
them: :func:`_decode` (one entry), :class:`_Cursor` (a reader's proof that each entry
continues the stream), :class:`_Place` (where a read starts), :class:`_Resets` and
:class:`_Sieve` (a backlog without its reset steps, read in two passes), :func:`_tail`
(where a writer's numbering starts), :class:`_StepScan` (a takeover's backward scan of
one step), and the other keys' values (:func:`_turn_id`, :func:`_cancel_from`). Pure
code over what Redis returned, no Redis call: apart from the writer
(:mod:`actors.relays.redis_writer`) and the reader (:mod:`actors.relays.redis_streams`),
which both read entries.

Layout (every key under ``prefix``, ``axon:`` by default):

``{prefix}turn:{turn_id}``
    A Redis Stream. Each entry is one *flush* of a writer: ``items`` (a JSON array of
    the chunks queued since the previous flush, in the runtime's JSON form, see
    :mod:`runtime.serde`), ``first`` (the relay seq of the first of them) and ``w`` (the
    writer's random id); a writer's first entry on a stream another writer began also
    has ``prev`` (that writer's id). The entry id is ``{first}-1``, so a retried flush
    that Redis had already applied is refused as a duplicate instead of being written
    twice, and resuming after a seq is a range query.
    A flush whose JSON is larger than :data:`ENTRY_BYTES` is several entries: its items
    grouped in order into entries of at most that many bytes each, and a chunk larger
    than that alone cut into *parts*: entries ``{seq}-1`` .. ``{seq}-{n}`` with ``first``
    (the chunk's seq), ``part`` (the next bytes of its JSON), ``of`` (``n``, the count:
    the continuation marker) and ``w``. A reader joins them into the chunk before it
    yields it (:class:`_Cursor`): a chunk's seq is its one ``Last-Event-ID``, a part has
    none, so a resume never starts inside a chunk; a part whose parts before it are not
    read (trimmed, lost) is a hole, as any other.
``{prefix}active:{session_id}``
    The id of the session's latest turn, so ``GET /api/chat/{id}/stream`` finds it.
``{prefix}cancel``
    A pub/sub channel of cancel requests (``{"turn_id", "reason"}``), for the process
    that runs the turn; a named stop adds ``session_id`` and ``message_id`` or
    ``named_turn`` (:class:`NamedStop`).

**Relay seq.** A chunk read back from the relay has ``seq`` = its position in the turn's
stream (1, 2, ...), stamped by the writer at flush time. The producer's own seqs restart
when a session is reloaded or a turn is taken over by another worker; the relay's never
do, so ``after_seq`` (SSE ``Last-Event-ID``) resumes with nothing missing or repeated.
A takeover's writer continues the numbering from the stream's last entry.

**Continuity.** A reader shows only what it can prove continuous (:class:`_Cursor`):
every entry starts at the seq after the last one read and was written by the same
writer, or by a takeover that names that writer in ``prev``. Redis can lose a stream
(restarted without persistence, eviction) while the turn goes on; a takeover's writer
that finds no stream then writes a ``gap`` first (what the turn streamed before is
gone), and a writer that started a stream over cannot name the writer a reader read
last. So a hole, a stream started over, a client's ``after_seq`` past the stream's end,
a ``gap`` and any entry that does not decode (junk in the relay's keys, a key of another
type) all raise :class:`~runtime.errors.RelayTurnGone`: the front end rebuilds the turn
from the store, or tells a client that saw part of it to reload. Never a spliced turn
shown whole, never a server error. None of this costs a Redis call: the ids ride in the
entries.

**Control items** also take a seq: :class:`~runtime.relay.StepRestarted` (an older
worker's takeover re-runs ``step``: drop what the step streamed so far) and the end of the
turn (not yielded; iteration stops). A reader that replays a backlog drops the restarted
step's chunks itself and yields the marker only when the reader's client had already seen
some of them; it does the same before a ``reset-step`` chunk (a takeover now, or a
provider fallback), keeping the step's ``step-start``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, ClassVar

import attrs
import orjson
import structlog

from runtime import output as o
from runtime.errors import RelayTurnGone
from runtime.relay import RESTART_STEP as RESTART
from runtime.serde import loads, utf8_dumps

log = structlog.get_logger("axon.relay")

PAGE = 256
"""Entries per ``XRANGE`` page when replaying a backlog."""
ENTRY_BYTES = 256 * 1024
"""The most bytes of chunks' JSON one stream entry holds (its ``items``, or its ``part``
of a split chunk): a flush larger than this is written as several entries, and a chunk
larger than this alone (a 20 MB tool output, a big delta) as several *parts*
(:func:`_split`), which readers join back into the one chunk before yielding it. Why: an
entry was a whole flush, whatever its size, so a reader's page that Redis does not bound
in bytes (the ``XRANGE`` fallback, the live ``XREAD``) held its count of entries of any
size, and one entry near Redis's ``proto-max-bulk-len`` (1 MB at its lowest) was
refused. 256 KB: a quarter of that lowest limit, a page of the reader (1 MB) holds four,
and a large chunk costs one ``XADD`` per 256 KB (80 for 20 MB, in one pipeline). Measured
writing a 5 MB chunk (journal, ``relayentry``): 16 KB entries 69 ms, 64 KB 16 ms, 256 KB
and 1 MB 13 ms; reading it back is slowest with 16 KB entries too."""

END = "relay.end"
GAP = "relay.gap"
"""Chunks were lost before this item; a gap a refusal made says why (``"why"``)."""
MAX_WHY = 400
"""The most of a gap's ``why`` a reader is told (it is the writer's text, in Redis)."""
FROM_START = "relay.from-start"
"""A takeover's first item on a stream it found empty, when it streams the turn from its
start (no step committed before it): a reader that has shown nothing of the turn reads
on (the stream is the whole turn); one that had (``after_seq``) is told the stream was
lost, as at a ``gap``. Only as the stream's first item; older readers take it for junk
(the turn rebuilt from the store, as a gap)."""


@attrs.frozen(kw_only=True, slots=True)
class _Entry:
    """One stream entry, decoded: its items numbered from ``first``, who wrote it
    (``writer``), and, on a writer's first entry, the writer whose tail it continued
    (``prev``)."""

    first: int
    items: list[dict[str, Any]]
    writer: bytes | None
    prev: bytes | None
    part: ClassVar[None] = None
    """(A :class:`_Part`'s: an entry of chunks is none.)"""
    index: ClassVar[int] = 1
    of: ClassVar[int] = 1

    @property
    def last(self) -> int:
        return self.first + len(self.items) - 1


@attrs.frozen(kw_only=True, slots=True)
class _Part:
    """One part of a split chunk (seq ``first``), decoded: the next bytes of its JSON
    (``part``), which part it is (``index``, 1-based: its id's second number) of how
    many (``of``), and who wrote it. Apart from :class:`_Entry`, whose fields every
    reader's entry sets (a field more was ~10 % of a small entry's read)."""

    first: int
    writer: bytes | None
    prev: bytes | None
    part: bytes
    index: int
    of: int
    items: ClassVar[tuple[dict[str, Any], ...]] = ()
    """(An entry's chunks: a part holds none by itself.)"""

    @property
    def last(self) -> int:
        return self.first


class _Undecodable(ValueError):
    """A stream entry that is not one a writer wrote (junk in the relay's keys)."""


def _decode(entry: Any) -> _Entry | _Part:
    """One stream entry; :class:`_Undecodable` when it is not what a writer writes: a
    ``first`` that is not its id's, ``items`` that are not a non-empty JSON array of
    objects with a string ``type``, a marker without its fields, a part whose number is
    not its id's or past its count."""
    try:
        fields = entry.field_values
        first = int(fields[b"first"])
        writer, prev = fields.get(b"w"), fields.get(b"prev")
        identifier = _identifier(entry.identifier)
        if (part := fields.get(b"part")) is not None:
            of = int(fields[b"of"])
            seq, _, index = identifier.partition("-")
            if seq != str(first) or first < 1 or not 1 <= int(index) <= of or of < 2:
                raise _Undecodable(f"entry {identifier!r} is no part {index} of {of} of {first}")
            return _Part(first=first, writer=writer, prev=prev, part=part, index=int(index), of=of)
        items = loads(fields[b"items"])  # (orjson; exactly when it holds an int past 64 bits)
        if identifier != f"{first}-1" or first < 1:
            raise _Undecodable(f"entry {entry.identifier!r} says it starts at seq {first}")
    except (KeyError, ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise _Undecodable(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(items, list) or not items:
        raise _Undecodable("'items' is not a non-empty JSON array")
    for item in items:  # (:func:`_check` inline: a call an item cost ~4 % of a read)
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            raise _Undecodable(f"an item is not a chunk: {str(item)[:100]!r}")
        if item["type"] == RESTART and type(item.get("step")) is not int:
            raise _Undecodable(f"a restart marker without its step: {str(item)[:100]!r}")
    return _Entry(first=first, items=items, writer=writer, prev=prev)


def _check(item: Any) -> None:
    """:class:`_Undecodable` unless ``item`` is a chunk as a writer writes one."""
    if not isinstance(item, dict) or not isinstance(item.get("type"), str):
        raise _Undecodable(f"an item is not a chunk: {str(item)[:100]!r}")
    if item["type"] == RESTART and type(item.get("step")) is not int:
        raise _Undecodable(f"a restart marker without its step: {str(item)[:100]!r}")


def _joined(data: bytes | bytearray) -> dict[str, Any]:
    """The chunk a split chunk's parts, joined, are (:class:`_Undecodable` if none).

    Parsed with the standard library's ``json``, not ``orjson``: orjson's parse of a
    document peaks at about 13 times its size (a 2 MB delta: 26 MB, measured with
    ``tracemalloc``; the standard library 4 MB), and a split chunk is at least an entry
    bound (the largest a reader parses otherwise). It is 1.4 to 4 times slower (a 2 MB
    delta: 4 ms, 1 ms with orjson), for a rare chunk. Both read what orjson wrote."""
    try:
        item = json.loads(data)
    except ValueError as exc:
        raise _Undecodable(f"a split chunk's parts do not join: {exc}") from None
    _check(item)
    return item  # type: ignore[no-any-return]


def _split(
    batch: list[dict[str, Any]], first: int, bound: int, encoded: bytes | None = None
) -> list[tuple[str, dict[str, bytes | str], int]]:
    """``batch`` (from seq ``first``) as stream entries of at most ``bound`` bytes of
    JSON each: ``(id, fields)`` pairs without the writer's fields (``w``, ``prev``).
    Consecutive items go into one entry (``first``, ``items``) while they fit; an item
    larger than ``bound`` alone is cut into parts (``first``, ``part``, ``of``), ids
    ``{seq}-1`` .. ``{seq}-{n}``. With each, the last seq it holds. ``encoded``: the
    batch's JSON, if the caller has it (a batch within the bound is one entry of it)."""
    if encoded is None:
        encoded = utf8_dumps(batch, default=str)
    if len(encoded) <= bound:
        return [(f"{first}-1", {"first": str(first), "items": encoded}, first + len(batch) - 1)]
    out: list[tuple[str, dict[str, bytes | str], int]] = []
    group: list[bytes] = []
    size = 2  # the array's brackets
    start = first

    def close() -> None:
        items = b"[" + b",".join(group) + b"]"
        out.append((f"{start}-1", {"first": str(start), "items": items}, start + len(group) - 1))

    for seq, item in enumerate(batch, start=first):
        one = utf8_dumps(item, default=str)
        if group and size + len(one) + 1 > bound:
            close()
            group, size = [], 2
        if len(one) + 2 > bound:  # alone too large: parts, at least two, of equal size
            count = max(2, -(-len(one) // bound))
            step = -(-len(one) // count)
            of = str(count)
            view = memoryview(one)
            for index, at in enumerate(range(0, len(one), step), start=1):
                part = bytes(view[at : at + step])
                fields: dict[str, bytes | str] = {"first": str(seq), "part": part, "of": of}
                out.append((f"{seq}-{index}", fields, seq))
            start = seq + 1
            continue
        if not group:
            start = seq
        group.append(one)
        size += len(one) + 1
    if group:
        close()
    return out


def _identifier(identifier: bytes | str) -> str:
    return identifier.decode() if isinstance(identifier, bytes) else identifier


def _entry_seq(identifier: bytes | str) -> int:
    return int(_identifier(identifier).split("-", 1)[0])


@attrs.define
class _Cursor:
    """What a reader has read of a turn's stream, to prove each next entry continues it.

    An entry continues the stream when its first seq follows the last one read and it
    was written by the same writer as the entry before it, or by a writer that says it
    continued that one (``prev``, a takeover that found the stream). Anything else (a
    hole, a stream that another writer started over after Redis lost it, a writer the
    turn had lost that still wrote, a ``gap`` item, junk) is :class:`RelayTurnGone`: a
    reader never shows a spliced turn as a whole one."""

    turn_id: str
    position: int = 0
    """The last seq read (shown to the client or not)."""
    writer: bytes | None = None
    message_id: str | None = None
    """The message the stream's ``start`` opened: a takeover's repeat of it is dropped."""
    ended: bool = False
    """The turn's end was read (a pause is not its end)."""
    from_start: bool = False
    """The stream began with :data:`FROM_START`: whole for a reader that showed nothing
    of the turn before it, lost for one that did."""
    biggest: int = 1
    """The most bytes (fields and values) of an entry read: how many entries a live
    read asks for at once (:data:`PAGE_BYTES` of them)."""
    pending: bytearray | None = None
    """The parts read so far of a split chunk whose last part is still to come (an
    entry bound's worth each: a page may end between two, a live read may come between
    the writer's ``XADD`` s of them)."""
    next_part: tuple[int, int, int] | None = None
    """The part awaited: the chunk's seq, the part's number, their count."""

    @property
    def reach(self) -> int:
        """The last seq the stream was read into: a chunk whose parts are being read
        counts (a client that saw it saw what the stream holds)."""
        return self.next_part[0] if self.next_part is not None else self.position

    def _part(self, entry: _Entry | _Part, raw: Any) -> dict[str, Any] | None:
        """The next entry while a split chunk's parts are read: its next part (``None``;
        the chunk itself once it is the last), else :class:`RelayTurnGone` (a gap's
        why if the entry holds one: a writer that lost the rest of the chunk wrote one)."""
        assert self.next_part is not None and self.pending is not None
        seq, index, of = self.next_part
        if (
            entry.part is None
            or (entry.first, entry.index, entry.of) != (seq, index, of)
            or (entry.writer != self.writer)
        ):
            for item in entry.items:
                if item["type"] == GAP:
                    self.next_part = self.pending = None
                    self.position = seq  # the gap's own message, as it would be
                    self.accept(raw)
                    raise AssertionError("a gap is always refused")  # pragma: no cover
            raise RelayTurnGone(
                f"the relay lost the end of the chunk at seq {seq} of turn {self.turn_id!r} "
                f"(read {index - 1} of its {of} parts)"
            )
        self.biggest = max(self.biggest, sum(map(len, raw.field_values.values())))
        self.pending += entry.part
        if index < of:
            self.next_part = (seq, index + 1, of)
            return None
        return self._whole(entry)

    def _whole(self, entry: _Part) -> dict[str, Any]:
        """The split chunk whose last part ``entry`` is, joined."""
        data = self.pending if self.pending is not None else entry.part
        self.pending = self.next_part = None
        assert data is not None
        try:
            return _joined(data)
        except _Undecodable as exc:
            raise RelayTurnGone(
                f"the relay's stream of turn {self.turn_id!r} holds junk ({exc})"
            ) from None

    def accept(self, raw: Any) -> list[tuple[int, dict[str, Any]]]:
        """The ``(seq, item)`` pairs of the stream's next entry ``raw``, repeated
        ``start`` s left out; :class:`RelayTurnGone` unless it provably continues. A
        split chunk's part gives none until its last, which gives the chunk."""
        turn = self.turn_id
        try:
            entry = _decode(raw)
        except _Undecodable as exc:
            raise RelayTurnGone(f"the relay's stream of turn {turn!r} holds junk ({exc})") from None
        if self.next_part is not None:
            whole = self._part(entry, raw)
            if whole is None:
                return []
            items: Any = (whole,)
        else:
            if entry.index > 1:
                raise RelayTurnGone(
                    f"the relay's stream of turn {turn!r} holds part {entry.index} of "
                    f"{entry.of} of the chunk at seq {entry.first} without the parts before "
                    "it (trimmed or lost)"
                )
            if entry.first > self.position + 1:
                raise RelayTurnGone(
                    f"the relay lost chunks {self.position + 1}..{entry.first - 1} of turn {turn!r}"
                )
            if entry.first != self.position + 1 or (
                self.position and entry.writer != self.writer and entry.prev != self.writer
            ):
                raise RelayTurnGone(
                    f"the relay's stream of turn {turn!r} was written over after seq "
                    f"{self.position} (Redis lost it and another writer started it again)"
                )
            self.biggest = max(self.biggest, sum(map(len, raw.field_values.values())))
            items = entry.items
            if entry.part is not None:
                if entry.index < entry.of:  # the chunk's last part is still to come
                    self.pending = bytearray(entry.part)
                    self.next_part = (entry.first, 2, entry.of)
                    self.writer = entry.writer
                    return []
                items = (self._whole(entry),)
        pairs: list[tuple[int, dict[str, Any]]] = []
        for seq, item in enumerate(items, start=entry.first):
            kind = item["type"]
            if kind == GAP or (kind == FROM_START and seq != 1):
                why = item.get("why")  # the writer's refusal, if one made the gap
                raise RelayTurnGone(
                    f"the relay lost part of turn {turn!r}: {why[:MAX_WHY]}"
                    if isinstance(why, str) and why
                    else f"the relay lost part of turn {turn!r} (Redis was unreachable or lost it)"
                )
            if kind == FROM_START:
                self.from_start = True
                continue
            if kind == END:
                if item.get("paused") is True:
                    self.message_id = None  # the continuation starts the message again
                else:
                    self.ended = True
            elif kind == "start":
                message_id = item.get("message_id")
                if self.message_id is not None and message_id == self.message_id:
                    continue  # a takeover starts the same message over: the client has it
                self.message_id = self.message_id or message_id
            pairs.append((seq, item))
        self.position = entry.last
        self.writer = entry.writer
        return pairs


@attrs.define
class _Place:
    """Where a read starts: after seq ``seen``, and after the turn's ``pauses``-th pause
    (counted down as the reader passes them)."""

    seen: int
    pauses: int

    def skip_pauses(self, backlog: list[tuple[int, Any]]) -> None:
        """Move past the pauses the read starts after that the backlog already holds."""
        for seq, item in backlog:
            if not self.pauses:
                return
            if item.get("type") == END and item.get("paused") is True:
                self.pauses -= 1
                self.seen = max(self.seen, seq)


def _tail(last: list[Any], *, takeover: bool) -> tuple[int, bytes | None, bool]:
    """Where a writer's numbering starts, from the stream's last entry (``last``, empty
    when there is no stream): the next seq, the writer it continues (``prev``), and
    whether what the turn streamed before is lost (a takeover that finds no stream, or a
    last entry that is junk)."""
    if not last:
        return 1, None, takeover
    try:
        entry = _decode(last[0])
    except _Undecodable:
        return _entry_seq(last[0].identifier) + 1, None, True
    # A split chunk whose last part is not in: its seq is taken, the chunk lost.
    return entry.last + 1, entry.writer or b"", entry.index < entry.of


def _paused(raw: Any) -> bool:
    """Whether the stream entry ``raw`` ends with a pause (the turn waits)."""
    try:
        items = _decode(raw).items
    except _Undecodable:
        return False
    return bool(items) and items[-1].get("type") == END and items[-1].get("paused") is True


_OPENS = {"text-start": o.TextFinish, "reasoning-start": o.ReasoningFinish}
_CLOSES = ("text-finish", "reasoning-finish")


class _StepScan:
    """A stream's items read backwards for one step (:meth:`RedisRelayWriter.shown`):
    whether it holds any item of the step, and the parts the step left open. Items
    before a reset of the step (a ``reset-step`` or an older worker's restart marker)
    were taken back already, and those of an earlier step end the scan.

    Also the messages shown steered into the step (``steered`` items, sent before its
    ``step-start``), before a reset too: a reset takes back the step's output, not the
    message that joined the turn before it (:class:`_Sieve` keeps those). A takeover
    takes a message an earlier run took but could not save again (its row is marked
    only by the save that stores it): its readers had it shown once already."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.found = False
        self.closed: set[str] = set()
        self.open: list[Any] = []
        self.earlier: int | None = None
        """The step before ``step`` the stream holds items of, read on for its end."""
        self.earlier_ended = False
        self.steered: set[str] = set()
        """The ids of the messages shown steered into ``step``."""
        self.reset = False
        """A reset of ``step`` was read: only its ``steered`` items are looked for now."""

    @property
    def behind(self) -> bool:
        """The stream holds an earlier step without its ``step-finish``: the step was
        committed (the turn goes on after it) by a worker that died before it streamed
        the step's end, so what the stream shows of it is not what the store holds."""
        return self.earlier is not None and not self.earlier_ended

    def done(self, items: Any) -> bool:
        for item in items:
            step = item.get("step")
            if type(step) is not int:
                continue
            if self.reset:  # (behind a reset: the step's steered messages, to its start)
                if step < self.step:
                    return True
                if step == self.step and item["type"] == "steered":
                    self._steered(item)
                continue
            if self.earlier is not None or step < self.step:
                if self.earlier is None:
                    self.earlier = step
                elif step < self.earlier:
                    return True  # an older step: the earlier one has no end
                if step == self.earlier and item["type"] == "step-finish":
                    self.earlier_ended = True
                    return True
                continue
            if step != self.step:
                continue
            self.found = True
            kind = item["type"]
            if kind in (RESTART, "reset-step"):
                self.reset = True
            elif kind == "steered":
                self._steered(item)
            elif kind in _CLOSES:
                self.closed.add(item.get("part_id"))
            elif kind in _OPENS and item.get("part_id") not in self.closed:
                self.open.append(_OPENS[kind](step=step, part_id=item["part_id"]))
        return False

    def _steered(self, item: dict[str, Any]) -> None:
        message_id = item.get("message_id")
        if isinstance(message_id, str):
            self.steered.add(message_id)

    def result(self) -> list[Any] | None:
        return list(reversed(self.open)) if self.found else None


class _Resets:
    """Where a backlog's steps were reset, found by a first pass over it (:meth:`see`):
    for each step the seq of its last restart marker (an older worker's takeover) and of
    its last ``reset-step`` (a takeover, a provider fallback). What a replay drops is
    decided from these alone (:class:`_Sieve`), so it yields as it reads a second time,
    holding one page, not the whole backlog (which it held before: a fresh reader of a
    long stream of large entries held the stream's whole size)."""

    __slots__ = ("resets", "restarts")

    def __init__(self) -> None:
        self.restarts: dict[Any, int] = {}
        self.resets: dict[Any, int] = {}

    def see(self, pairs: list[tuple[int, Any]]) -> None:
        for seq, item in pairs:
            kind = item["type"]
            if kind == RESTART:
                self.restarts[item["step"]] = seq
            elif kind == "reset-step" and (step := _step_of(item)) is not None:
                self.resets[step] = seq


def _step_of(item: dict[str, Any]) -> Any:
    """The step an item belongs to, as a reset names it (``None``: no step, or junk that
    no reset could name)."""
    step = item.get("step")
    return step if isinstance(step, int | float | str) else None


class _Sieve:
    """A backlog read in order, without every reset step's earlier chunks: before a
    restart marker, all of them; before a ``reset-step``, all but the step's
    ``step-start``, which no new one follows, and the messages steered in before it
    (``steered``). The marker or reset is kept only when the reader had been sent some
    of what it removes (seq <= ``seen``). The resets' places
    come from a first pass (:class:`_Resets`); what each removes, and whether the reader
    saw any of it, is followed here as the items go by (for each step the first seq of
    the items a reset would still remove), so nothing of the backlog is held."""

    __slots__ = ("found", "plain", "seen", "soft")

    def __init__(self, found: _Resets, seen: int) -> None:
        self.found = found
        self.seen = seen
        self.plain: dict[Any, int] = {}
        """Each step's first item any reset removes (not yet removed by one)."""
        self.soft: dict[Any, int] = {}
        """Each step's first ``step-start`` or kept ``reset-step``: a marker removes them."""

    def keeps(self, seq: int, item: dict[str, Any]) -> bool:
        step = _step_of(item)
        if step is None:
            return True
        kind = item["type"]
        if kind == "steered":
            # A message that joined the turn before the step: a reset takes back the
            # step's output, not the message (:class:`_StepScan`). Dropped, a reader
            # that replayed the stream was shown it nowhere: its takeover's run had
            # sent it again, before the reset (live readers were shown it twice).
            return True
        restarted = self.found.restarts.get(step, 0) > seq
        if kind in _RESETS:
            first = self.plain.pop(step, None)
            if kind == RESTART:
                soft = self.soft.pop(step, None)
                first = soft if first is None else first if soft is None else min(first, soft)
            shown = first is not None and first <= self.seen
            if kind == RESTART:
                return shown
            if shown:
                self.soft.setdefault(step, seq)
            return shown and not restarted
        if kind == "step-start":
            self.soft.setdefault(step, seq)
            return not restarted
        self.plain.setdefault(step, seq)
        return not restarted and self.found.resets.get(step, 0) <= seq


_KEPT = {RESTART: (RESTART,), "reset-step": (RESTART, "reset-step", "step-start")}
"""What a reset keeps of its step's earlier items."""
_RESETS = tuple(_KEPT)


_TURN_ID = re.compile(rb"[A-Za-z0-9_.:-]{1,128}")
"""Turn ids' alphabet (:mod:`runtime.app.session`)."""


def _turn_id(raw: Any) -> str | None:
    """The turn id a session's key holds; ``None`` when it holds none, or junk."""
    if not isinstance(raw, bytes) or _TURN_ID.fullmatch(raw) is None:
        return None
    return raw.decode()


@attrs.frozen(slots=True, kw_only=True)
class NamedStop:
    """A stop naming a message or a turn of a session, sent over the cancel channel by a
    host that does not run the session's turn (``turn_id``) to the one that does: only
    what is so named stops there (``Host.stop_named``)."""

    turn_id: str
    session_id: str
    message_id: str | None
    named_turn: str | None
    reason: str


def _cancel_from(
    message: dict[str, Any],
    on_cancel: Callable[[str, str], Any],
    on_named: Callable[[NamedStop], Any] | None = None,
) -> None:
    """Hand a cancel request of the relay's channel to ``on_cancel``, a named stop to
    ``on_named`` (without it, to ``on_cancel`` only when it names its turn: a watch that
    cannot look for a waiting message must not cancel the running turn for one); junk is
    logged."""
    if message.get("type") != "message":
        return
    try:
        data = orjson.loads(message["data"])
        turn_id, reason = str(data["turn_id"]), str(data.get("reason", ""))
        session_id = data.get("session_id")
        message_id, named_turn = data.get("message_id"), data.get("named_turn")
        if not all(isinstance(v, str | None) for v in (session_id, message_id, named_turn)):
            raise TypeError("a named stop's names must be strings")
    except (orjson.JSONDecodeError, KeyError, TypeError):
        log.warning("relay.bad_cancel", data=repr(message.get("data"))[:200])
        return
    reason = reason or "cancelled"
    if session_id is None or (message_id is None and named_turn is None):
        on_cancel(turn_id, reason)
    elif on_named is not None:
        stop = NamedStop(
            turn_id=turn_id,
            session_id=session_id,
            message_id=message_id,
            named_turn=named_turn,
            reason=reason,
        )
        on_named(stop)
    elif named_turn == turn_id and message_id is None:
        on_cancel(turn_id, reason)
