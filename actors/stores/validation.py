"""What every store checks: the arguments of :meth:`Store.save` before a write, and the
rows it reads back.

One definition shared by the built-in stores and any plug-in store, so a bad call is
refused with the same :class:`~runtime.errors.StoreError` whatever stores the session,
and before anything is written; and a damaged row is reported with the same
:class:`~runtime.errors.StoreCorrupt` by every store.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Collection, Mapping, Sequence
from itertools import filterfalse, repeat
from typing import Any

import cattrs
import orjson
import trio

from runtime import serde
from runtime.errors import (
    InvalidCursor,
    SessionDeleted,
    StoreConflict,
    StoreCorrupt,
    StoreError,
)
from runtime.history import OFF_LOOP_MESSAGES, off_loop_limiter
from runtime.messages import Message
from runtime.store import validate_session_id

_MESSAGE_TYPES: tuple[type, ...] = typing.get_args(Message)


def check_save(
    session_id: str,
    start: int,
    messages: Sequence[Message],
    meta: Mapping[str, Any] | None,
    expected_version: int | None = None,
) -> tuple[Message, ...]:
    """Validate the arguments of :meth:`Store.save` the same way in every store.

    Checked before anything is touched, so a bad call never changes a session. Returns
    ``messages`` as a tuple (the caller's sequence may be a list it keeps mutating). Whether
    ``start`` is within the session is left to the store, which must check it atomically
    with the write.
    """
    validate_session_id(session_id)
    if expected_version is not None and (
        not isinstance(expected_version, int)
        or isinstance(expected_version, bool)
        or expected_version < 0
    ):
        raise StoreError(
            f"save of session {session_id!r}: expected_version must be an int >= 0 or "
            f"None, got {expected_version!r}"
        )
    if not isinstance(start, int) or isinstance(start, bool) or start < 0:
        raise StoreError(
            f"save of session {session_id!r}: start must be an int >= 0, got {start!r}"
        )
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise StoreError(
            f"save of session {session_id!r}: messages must be a sequence of Message, "
            f"got {type(messages).__name__}"
        )
    messages = tuple(messages)
    # (in C first: a step's save is checked with every message of its turn so far)
    if not all(map(isinstance, messages, repeat(_MESSAGE_TYPES))):
        _refuse_messages(session_id, start, messages)
    if meta is not None and not isinstance(meta, Mapping):
        raise StoreError(
            f"save of session {session_id!r}: meta must be a dict or None, "
            f"got {type(meta).__name__}"
        )
    if meta is not None and not all(isinstance(key, str) for key in meta):
        raise StoreError(f"save of session {session_id!r}: meta keys must be str")
    return messages


def _refuse_messages(session_id: str, start: int, messages: tuple[Any, ...]) -> None:
    """Raise :class:`StoreError` naming the first of ``messages`` that is not a Message."""
    for offset, message in enumerate(messages):
        if not isinstance(message, _MESSAGE_TYPES):
            raise StoreError(
                f"save of session {session_id!r}: message {start + offset} is a "
                f"{type(message).__name__}, not a Message"
            )


def kept_tail(
    session_id: str, messages: Sequence[Message], kept: Any, expected_version: int | None
) -> tuple[int, frozenset[int]]:
    """A save's ``kept`` (:class:`~runtime.store.Store`'s kept rows) checked: the
    position in ``messages`` after the last kept one (``0``: none kept, the save writes
    them all) and the kept positions. The messages before it that are not kept are
    written over their rows, the ones from it on replace the session's tail. Refused
    without ``expected_version`` (the claim is about a version) or past ``messages``."""
    if not kept:
        return 0, frozenset()
    if isinstance(kept, str | bytes) or not isinstance(kept, Collection):
        raise StoreError(
            f"save of session {session_id!r}: kept must be a collection of positions, "
            f"got {type(kept).__name__}"
        )
    if expected_version is None:
        raise StoreError(
            f"save of session {session_id!r}: kept messages are those of a version: "
            "give expected_version"
        )
    positions = frozenset(kept)
    if set(map(type, positions)) == {int} and 0 <= min(positions) <= max(positions) < len(
        messages
    ):  # (in C: a step's save keeps every message of its turn so far but one)
        return max(positions) + 1, positions
    for i in positions:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(messages):
            raise StoreError(
                f"save of session {session_id!r}: kept position {i!r} is not one of its "
                f"{len(messages)} messages"
            )
    return max(positions) + 1, positions


def check_grown(
    session_id: str,
    messages: Sequence[Message],
    grown: Any,
    kept: frozenset[int],
    expected_version: int | None,
) -> frozenset[int]:
    """A save's ``grown`` (:class:`~runtime.store.Store`'s grown rows) checked: the
    positions, each one of ``messages`` and not kept. Refused without
    ``expected_version`` (the claim is about a version), as ``kept`` is."""
    if not grown:
        return frozenset()
    if isinstance(grown, str | bytes) or not isinstance(grown, Collection):
        raise StoreError(
            f"save of session {session_id!r}: grown must be a collection of positions, "
            f"got {type(grown).__name__}"
        )
    if expected_version is None:
        raise StoreError(
            f"save of session {session_id!r}: grown messages are those of a version: "
            "give expected_version"
        )
    positions = frozenset(grown)
    for i in positions:
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(messages) or i in kept:
            raise StoreError(
                f"save of session {session_id!r}: grown position {i!r} is not one of its "
                f"{len(messages)} messages not kept"
            )
    return positions


async def encoded_off_loop(
    session_id: str,
    start: int,
    messages: Sequence[Message],
    meta: Mapping[str, Any] | None,
    expected_version: int | None = None,
    kept: frozenset[int] = frozenset(),
) -> tuple[tuple[Message, ...], list[tuple[str, int, str, bytes]]]:
    """:func:`check_save` and :func:`encode_rows` of a save's arguments: the messages as
    a tuple and their rows. In a worker thread for more than
    :data:`~runtime.history.OFF_LOOP_MESSAGES` messages: a session saved with a long
    history (a client's thread of 600,000 messages, seeded into its first save) took the
    event loop 9 s to encode. The thread is handed a tuple of the messages and a copy of
    ``meta``, taken here, so nothing it reads can change meanwhile; a cancelled save
    waits for it (the thread is not abandoned) and then writes nothing. The rows leave
    out the messages at positions ``kept`` (:func:`kept_tail`), which are not written."""
    if not isinstance(messages, list | tuple) or len(messages) <= OFF_LOOP_MESSAGES:
        new = check_save(session_id, start, messages, meta, expected_version)
        return new, encode_rows(session_id, start, new, kept)
    snapshot = tuple(messages)
    meta_copy = dict(meta) if isinstance(meta, Mapping) else meta
    return await trio.to_thread.run_sync(
        _checked_and_encoded,
        session_id,
        start,
        snapshot,
        meta_copy,
        expected_version,
        kept,
        limiter=off_loop_limiter(),  # not trio's default: runtime.history.off_loop_limiter
    )


def _checked_and_encoded(
    session_id: str,
    start: int,
    messages: tuple[Message, ...],
    meta: Mapping[str, Any] | None,
    expected_version: int | None,
    kept: frozenset[int],
) -> tuple[tuple[Message, ...], list[tuple[str, int, str, bytes]]]:
    new = check_save(session_id, start, messages, meta, expected_version)
    return new, encode_rows(session_id, start, new, kept)


def decode_message(store: str, session_id: str, idx: int, role: str, body: Any) -> Message:
    """Message ``idx`` of a session as ``store`` (its path or URL, for the error) keeps it:
    its serde JSON ``body`` and the ``role`` column written beside it, which must agree."""
    try:
        message = serde.from_json(body, Message)
    except Exception as err:
        raise StoreCorrupt(
            f"session store {store}: session {session_id!r} message {idx} cannot be read: {err!r}"
        ) from err
    if message.role != role:
        raise StoreCorrupt(
            f"session store {store}: session {session_id!r} message {idx} "
            f"is stored as role {role!r} but its body is a {message.role!r} message"
        )
    return message


def decode_meta(store: str, raw: Any, session_id: str) -> dict[str, Any]:
    """A session's meta as ``store`` keeps it: a JSON object."""
    try:
        # (walked: a PostgreSQL merge of meta keeps each value's text, not the mark
        # before an integer past 64 bits that serde.dumps writes)
        meta = serde.exact(orjson.loads(raw), raw)
    except orjson.JSONDecodeError as err:
        raise StoreCorrupt(
            f"session store {store}: meta of session {session_id!r} is not JSON: {err}"
        ) from err
    if not isinstance(meta, dict):
        raise StoreCorrupt(
            f"session store {store}: meta of session {session_id!r} is not a JSON object"
        )
    return meta


def encode_rows(
    session_id: str,
    start: int,
    messages: Sequence[Message],
    kept: frozenset[int] = frozenset(),
) -> list[tuple[str, int, str, bytes]]:
    """``(session_id, idx, role, body)`` rows of ``messages`` from index ``start``, bodies
    in serde JSON: serialized before a store's transaction begins, so a message that cannot
    be fails the save with nothing written. None for the positions ``kept`` (stored as
    they are: :func:`kept_tail`)."""
    rows = []
    # (the positions not kept, found in C: a step's save keeps all but one or two)
    for offset in filterfalse(kept.__contains__, range(len(messages))):
        idx, message = start + offset, messages[offset]
        try:
            body = serde.message_json(message)
        except Exception as err:
            anyway = _encoded_anyway(message, err)
            if anyway is None:
                raise StoreError(
                    f"save of session {session_id!r}: message {idx} cannot be serialized: {err}"
                ) from err
            body = anyway
        rows.append((session_id, idx, message.role, body))
    return rows


def _encoded_anyway(message: Message, err: Exception) -> bytes | None:
    """The body of a message orjson refused for what every message can come to hold, or
    ``None`` for any other failure (the save then fails as before).

    * A lone surrogate (``"\\udcff"``): a tool's ``os.listdir`` of a file name that is not
      UTF-8, a model server's ``"\\ud800"`` escape decoded by ``json.loads``, a command
      line's undecodable byte. UTF-8 cannot hold it, so it is stored as U+FFFD (what
      ``errors="replace"`` gives); a valid pair stays the character it spells.
    * Nesting deeper than orjson writes (254 levels): a model's tool arguments, parsed by
      ``json.loads``. The standard library writes it, and orjson reads it back.

    Refused, such a message failed every later save of its session too (each starts at
    or before it), so the session's turns were kept only in memory and lost with the
    process."""
    text = str(err)
    if "surrogates" not in text and "Recursion limit" not in text:
        return None
    try:
        value = serde.without_lone_surrogates(serde.converter.unstructure(message), 0)
        try:
            body = serde.dumps(value, default=str)
        except orjson.JSONEncodeError:
            text = json.dumps(
                value, ensure_ascii=False, default=str, allow_nan=False, separators=(",", ":")
            )
            body = text.encode()
            if serde.lost_int(orjson.loads(body)):  # an integer past 64 bits: marked, so
                body = serde.BIG_INT_MARK + body  # read back exactly (serde.loads)
        serde.from_json(body, Message)  # (a rare path) what is stored must load back
    except (RecursionError, TypeError, ValueError, cattrs.BaseValidationError):
        return None
    return body


def encode_meta(session_id: str, meta: Mapping[str, Any] | None) -> bytes | None:
    """``meta`` as JSON (``None`` when there is nothing to merge), before a store's
    transaction begins, so meta that is not JSON fails the save with nothing written (a
    lone surrogate is written as U+FFFD, as in a message: :func:`storable_meta`)."""
    try:
        return serde.dumps(dict(meta)) if meta else None
    except orjson.JSONEncodeError as err:
        return serde.dumps(_meta_without_lone_surrogates(session_id, meta, err))


def storable_meta(session_id: str, meta: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``meta`` itself when it is JSON; with each lone surrogate replaced by U+FFFD when
    that is all that keeps it from being (a title made of a first message that holds
    one, :func:`_encoded_anyway`); else a :class:`~runtime.errors.StoreError`, before a
    store's transaction begins."""
    try:
        serde.dumps(dict(meta)) if meta else None
    except orjson.JSONEncodeError as err:
        return _meta_without_lone_surrogates(session_id, meta, err)
    return meta


def _meta_without_lone_surrogates(
    session_id: str, meta: Any, err: orjson.JSONEncodeError
) -> dict[str, Any]:
    if "surrogates" in str(err):
        try:
            cleaned: dict[str, Any] = serde.without_lone_surrogates(dict(meta), 0)
            serde.dumps(cleaned)
            return cleaned
        except (RecursionError, ValueError, TypeError):
            pass
    raise StoreError(
        f"save of session {session_id!r}: meta is not JSON-serializable: {err}"
    ) from err


def check_version(store: str, session_id: str, current: int, expected: int | None) -> None:
    """Refuse a save based on another version than the session's ``current`` one (the
    version rule of :class:`~runtime.store.Store`; ``expected`` ``None``: any): another
    writer saved it since. Checked by a store inside the save's transaction."""
    if expected is not None and expected != current:
        raise StoreConflict(
            f"save of session {session_id!r}: it is at version {current}, not the "
            f"{expected} this save was based on: another writer saved it "
            f"since (session store {store})",
            session_id=session_id,
            expected=expected,
            actual=current,
        )


_MAX_SEQ = 2**63 - 1


def deleted_since(session_id: str, mark: int, absent_mark: int) -> None:
    """Raise :class:`~runtime.errors.SessionDeleted` when a save that would create
    ``session_id`` finds its deletion mark ``mark`` above ``absent_mark``, the one its
    turn read before it began: created and deleted since by another process, the save
    would bring the deleted conversation back (:func:`runtime.store.checks_absent_mark`).
    A mark dropped since (read ``0``) is below: nothing refused."""
    if mark > absent_mark:
        raise SessionDeleted(
            f"save of session {session_id!r} refused: the session was deleted since its "
            f"turn began (deletion mark {mark}, read {absent_mark}); nothing was written",
            session_id=session_id,
        )


def parse_cursor(after: Any) -> int:
    """The place in recency order a built-in store's cursor names (the decimal
    ``update_seq`` of the session it was listed with): sessions listed after it are those
    below it. Anything else raises :class:`~runtime.errors.InvalidCursor`."""
    if (
        not isinstance(after, str)
        or not after.isascii()
        or not after.isdigit()
        or len(after) > 19
        or int(after) > _MAX_SEQ
    ):
        raise InvalidCursor(f"invalid cursor {after!r}: not one this store wrote")
    return int(after)


def check_limit(limit: Any) -> int | None:
    """A page size as a query takes it: ``None`` (all), or a positive integer kept within
    a 64-bit ``LIMIT`` (a larger one lists all the same). Anything else raises
    :class:`~runtime.errors.InvalidCursor`."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise InvalidCursor(f"invalid limit {limit!r}: a page holds at least one session")
    return None if limit is None else min(limit, _MAX_SEQ)


# -- grown messages: a running turn's answer stored as a head and segments ---------------

HEAD_PREFIX = b'{"content":{"parts":'
"""How the row of a message stored in segments begins (:func:`split_grown`): its fields
without its content, ``content`` being ``{"parts": N}``, the number of parts its segments
hold together. A whole assistant message's JSON begins ``{"content":[``. An older
process that reads such a row fails to read it (``content`` is no list of parts: the
load raises :class:`~runtime.errors.StoreCorrupt`): it never takes it for a message
without content."""
_WHOLE_PREFIX = b'{"content":['
HEAD_PEEK = 40
"""Bytes of a row enough to read a head's part count (:func:`head_parts`)."""


def head_parts(body: bytes) -> int | None:
    """The number of parts a head row's segments hold (:data:`HEAD_PREFIX`), or ``None``
    for a row that is no head (a whole message); from the row's first bytes."""
    if not body.startswith(HEAD_PREFIX):
        return None
    close = body.find(b"}", len(HEAD_PREFIX))
    digits = body[len(HEAD_PREFIX) : close] if close > 0 else b""
    return int(digits) if digits.isdigit() else None


def split_grown(message: Message, body: bytes, held: int) -> tuple[bytes, bytes] | None:
    """A grown message's head row and the segment of its parts from ``held`` on (the
    parts' JSON, comma-separated, as they stand in ``body``; ``b""``: none new), ``body``
    being its whole JSON (:func:`encode_rows`'), or ``None`` when it cannot be split so
    (not an assistant message with parts, a body written otherwise: the message is then
    written whole). The segment is cut out of ``body`` where the encoder says part
    ``held`` began, or else after the new parts encoded one by one, and checked to be
    those bytes: folded (:func:`fold_grown`), head and segments give ``body`` back."""
    content = getattr(message, "content", None)
    if (
        type(message).__name__ != "AssistantMessage"
        or type(content) is not tuple
        or not content
        or not 0 <= held <= len(content)
        or not body.startswith(_WHOLE_PREFIX)
    ):
        return None
    end = body.rfind(b'],"id":' + orjson.dumps(message.id))
    if end < len(_WHOLE_PREFIX) or body[end + 2 : end + 7] != b'"id":':
        return None
    if held == 0:
        segment = body[len(_WHOLE_PREFIX) : end]
    elif held == len(content):
        segment = b""
    else:
        at = serde.part_end(message, held - 1, body)
        if at is None:
            try:
                tail = b",".join(map(serde.part_json, content[held:]))
            except (TypeError, ValueError, RecursionError):  # (a body written otherwise:
                return None  # a lone surrogate replaced, too deep for orjson)
            at = end - len(tail) - 1
            if at <= len(_WHOLE_PREFIX) or body[at + 1 : end] != tail:
                return None
        if body[at : at + 1] != b",":
            return None
        segment = body[at + 1 : end]
    head = HEAD_PREFIX + b"%d}," % len(content) + body[end + 2 :]
    return head, segment


def fold_grown(
    store: str, session_id: str, idx: int, head: bytes, segments: Sequence[tuple[int, bytes]]
) -> bytes:
    """The whole JSON of the message stored as ``head`` and its ``segments`` (``(first
    part, JSON)`` in order): what :func:`split_grown` was given. Segments that do not
    follow one another from part 0 raise :class:`~runtime.errors.StoreCorrupt`; the
    count of parts the head names is checked by the caller once decoded
    (:func:`check_folded`)."""
    parts = head_parts(head)
    close = head.find(b"},", len(HEAD_PREFIX))
    if parts is None or close < 0 or not segments or segments[0][0] != 0:
        raise StoreCorrupt(
            f"session store {store}: session {session_id!r} message {idx} is stored in "
            f"segments that cannot be read (head {bytes(head[:HEAD_PEEK])!r}, segments from "
            f"{[first for first, _ in segments]})"
        )
    bodies = [bytes(body) for _, body in segments]
    return b"".join((_WHOLE_PREFIX, b",".join(filter(None, bodies)), b"],", head[close + 2 :]))


def check_folded(store: str, session_id: str, idx: int, head: bytes, message: Message) -> Message:
    """``message``, decoded from a fold, if it holds the parts its head counts; else
    :class:`~runtime.errors.StoreCorrupt` (a segment missing)."""
    parts = head_parts(head)
    if parts != len(getattr(message, "content", ())):
        raise StoreCorrupt(
            f"session store {store}: session {session_id!r} message {idx} is stored in "
            f"segments holding {len(getattr(message, 'content', ()))} parts, not the "
            f"{parts} its head counts"
        )
    return message


def decode_folded(
    store: str,
    session_id: str,
    idx: int,
    role: str,
    body: bytes,
    segments: Sequence[tuple[int, bytes]],
) -> Message:
    """Message ``idx`` whose row ``body`` may be a head (:data:`HEAD_PREFIX`): folded with
    its ``segments`` then decoded (:func:`decode_message`); a whole row decoded as it is
    (segments left beside it are not read)."""
    if not bytes(body[: len(HEAD_PREFIX)]) == HEAD_PREFIX:
        return decode_message(store, session_id, idx, role, body)
    head = bytes(body)
    whole = fold_grown(store, session_id, idx, head, segments)
    return check_folded(
        store, session_id, idx, head, decode_message(store, session_id, idx, role, whole)
    )
