"""The sessions a session owns: what :meth:`~runtime.store.Store.delete` deletes with it.

A session that calls an agent as a tool (``Agent.as_tool``) has each call run in a
sub-session of its own, whose id is derived from the caller's and the call's
(:func:`~runtime.tools.sub_session_id`) and whose meta names the caller
(:data:`~runtime.tools.PARENT_SESSION_META`). Nobody else reaches such a session: only
the caller's turns open it again (a waiting sub-turn's continuation). Before, deleting
the caller left each of them in the store for good, with whatever the sub-turn had said
and any turn of it still queued or waiting. Every built-in store now deletes a session's
sub-sessions, at any depth, in the same transaction as the session.

Found by what each sub-session records, its caller (its meta's
:data:`~runtime.tools.PARENT_SESSION_META`, written with its first save), indexed: the
memory store reads its sessions' metas; SQLite and PostgreSQL look the caller up in an
index of it (SQLite's an expression index over the meta; PostgreSQL's a ``caller``
column its triggers keep, so every writer, a process of an earlier version too, keeps
it, and a save whose meta is unchanged stays HOT). Before, the stores derived the
candidates from the caller's stored calls (every assistant message of each session of
the tree read and decoded at its delete) and the ``<caller>.`` id range: a sub-session
with a hashed id (``sub.<sha>``) whose caller's call was never stored (the caller's
step not saved yet) was found by neither. A candidate is the caller's only when its meta
names it (read again here): a session whose meta names another caller, or none, stays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from runtime.tools import caller_of

OWNED_MAX = 100_000
"""At most this many sessions are deleted with one (a cycle cannot occur, ids are
unique; a bound on one delete's transaction all the same)."""

UNREADABLE_CALLER = ""
"""What PostgreSQL's ``axon_sessions.caller`` holds for a meta that holds the key but
that the database could not read (no session's id is empty): a delete reads those
sessions too and decides on their meta here (:func:`meta_caller`)."""


def meta_caller(raw: Any) -> str | None:
    """The caller a stored meta names (a JSON object's ``parent_session_id``); ``None``
    for a meta that names none or cannot be read."""
    if isinstance(raw, dict):
        return caller_of(raw)
    try:
        meta = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None
    return caller_of(meta)


def owned_sessions(
    session_id: str, candidates: Callable[[str], Iterable[tuple[str, Any]]]
) -> list[str]:
    """``session_id`` and the sessions it owns, at any depth, callers before their
    sub-sessions. ``candidates(sid)`` gives the stored sessions that may be ``sid``'s
    sub-sessions, with their meta (raw or read); those whose meta names ``sid`` as
    caller are."""
    found = [session_id]
    seen = {session_id}
    at = 0
    while at < len(found) and len(found) < OWNED_MAX:
        caller = found[at]
        at += 1
        for sub, meta in candidates(caller):
            if sub not in seen and meta_caller(meta) == caller:
                seen.add(sub)
                found.append(sub)
    return found
