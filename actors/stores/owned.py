"""The sessions a session owns: what :meth:`~runtime.store.Store.delete` deletes with it.

A session that calls an agent as a tool (``Agent.as_tool``) has each call run in a
sub-session of its own, whose id is derived from the caller's and the call's
(:func:`~runtime.tools.sub_session_id`) and whose meta names the caller
(:data:`~runtime.tools.PARENT_SESSION_META`). Nobody else reaches such a session: only
the caller's turns open it again (a waiting sub-turn's continuation). Before, deleting
the caller left each of them in the store for good, with whatever the sub-turn had said
and any turn of it still queued or waiting. Every built-in store now deletes a session's
sub-sessions, at any depth, in the same transaction as the session.

Found by what the caller holds, not by a scan of every session: the sub-session ids its
stored assistant messages' tool calls derive (the store does not know which tools are
agents: an id that names no stored session costs a primary-key probe), and, for the
unhashed ids (``<caller>.<tool>.<call>``), the ids that start with ``<caller>.``: a
sub-session saved before the caller's call was (none found: a worker confirms a tool
batch before running it). Either way a candidate is the caller's only when its meta
names it: a session an application named ``<caller>.x`` itself is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from runtime.tools import caller_of, sub_session_id

OWNED_MAX = 100_000
"""At most this many sessions are deleted with one (a cycle cannot occur, ids are
unique; a bound on one delete's transaction all the same)."""


def called_sub_sessions(session_id: str, bodies: Iterable[Any]) -> set[str]:
    """The ids of the sub-sessions the tool calls in ``bodies`` (the serde JSON of the
    session's stored assistant messages) would run in, were their tools agents. Read
    leniently: a body that cannot be read names none (a delete never fails on a damaged
    row, which it deletes)."""
    ids: set[str] = set()
    for body in bodies:
        try:
            message = orjson.loads(body)
        except (orjson.JSONDecodeError, TypeError):
            continue
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict):
                continue
            call, name = part.get("tool_call_id"), part.get("tool_name")
            if isinstance(call, str) and isinstance(name, str):
                ids.add(sub_session_id(session_id, name, call))
    ids.discard(session_id)
    return ids


def prefix_range(session_id: str) -> tuple[str, str]:
    """The range ``[low, high)`` of the ids that start with ``<session_id>.`` (the
    unhashed sub-session ids), in code point order (SQLite's ``BINARY``, PostgreSQL's
    ``COLLATE "C"``): ``'/'`` follows ``'.'``."""
    return f"{session_id}.", f"{session_id}/"


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
