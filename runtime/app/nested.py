"""The sub-sessions of a calling session that waits (``as_tool(pass_approvals=True)``):
when the calling session is deleted, the waits its sub-sessions keep for its decision
are ended, as nobody can make it any more. Before, such a sub-session waited for good,
and refused every decision (``CallerDecides``) and every new message (``CallerWaits``).
The embedded host's ``delete_session``, the worker front end's delete and ``runtime
delete`` call :func:`end_sub_waits` before they delete the session (its readers are told
of each denial), and the store's delete then deletes the sub-sessions with it (every
built-in store, :mod:`actors.stores.owned`). A scratch session
(an unnamed OpenAI-compatible completion's) is deleted with its sub-sessions
(:func:`delete_scratch`): nobody can read or continue them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime.agent import CALLER_DELETED, sub_session_id
from runtime.approval import (
    RECORD_ATTEMPTS,
    WAITING_META,
    approval_decided,
    pending_calls,
    supersede,
    waiting_calls,
)
from runtime.errors import StoreConflict
from runtime.messages import AssistantMessage, Message, ToolCallPart
from runtime.store import Store, load_last_turn
from runtime.tools import caller_of


def _last_calls(messages: list[Message]) -> list[ToolCallPart]:
    """The calls of the history's last assistant message that still wait."""
    waiting = {c.tool_call_id for c in waiting_calls(messages)}
    if not waiting:
        return []
    last = next((m for m in reversed(messages) if isinstance(m, AssistantMessage)), None)
    if last is None:
        return []
    return [p for p in last.content if isinstance(p, ToolCallPart) and p.tool_call_id in waiting]


async def delete_scratch(store: Store, session_id: str, messages: Sequence[Message]) -> int:
    """Delete the scratch session ``session_id`` (a stateless request's: nobody's to
    read or continue) and the sub-sessions its agent tools' calls in ``messages`` (what
    its turn added) ran in, theirs too, agents calling agents. Before, each agent-tool
    call of a stateless completion left its sub-session in the store for good (one per
    call, never listed to anyone). One load per call of ``messages``; a session that is
    not the sub-session of that call (none, or another caller's) is left alone. Returns
    how many sessions were deleted."""
    deleted = 0
    for message in messages:
        if not isinstance(message, AssistantMessage):
            continue
        for part in message.content:
            if not isinstance(part, ToolCallPart):
                continue
            sub = sub_session_id(session_id, part.tool_name, part.tool_call_id)
            record = await store.load(sub)
            if record is not None and caller_of(record.meta) == session_id:
                deleted += await delete_scratch(store, sub, record.messages)
    await store.delete(session_id)
    return deleted + 1


async def end_sub_waits(
    store: Store, session_id: str, *, bus: Any = None, reason: str = CALLER_DELETED
) -> list[str]:
    """End, in their sub-sessions, the waits the calls of ``session_id`` that wait for
    an agent tool's sub-turn (``Awaiting.nested``) stand for: each sub-session call that
    waits for this session's decision (``Awaiting.caller``) is denied with ``reason``
    and gets its result, in one version-checked save, two or more agents deep too. A
    later message to the sub-session starts a turn of its own. Returns the sub-sessions
    whose wait was ended; the ``bus`` (if any) is told of each denial."""
    last = await load_last_turn(store, session_id)  # (the PostgreSQL store: a few rows)
    if last is None:
        return []
    return await _end_subs(store, session_id, list(last[1].messages), bus, reason)


async def _end_subs(
    store: Store, caller: str, messages: list[Message], bus: Any, reason: str
) -> list[str]:
    ended: list[str] = []
    for part in _last_calls(messages):
        if part.awaiting is not None and part.awaiting.nested:
            sub = sub_session_id(caller, part.tool_name, part.tool_call_id)
            ended += await _end_sub(store, sub, caller, bus, reason)
    return ended


async def _end_sub(store: Store, sub: str, caller: str, bus: Any, reason: str) -> list[str]:
    deeper: list[str] | None = None
    for _ in range(RECORD_ATTEMPTS):
        record = await store.load(sub)
        if record is None:
            return []
        messages = list(record.messages)
        calls = _last_calls(messages)
        if not any(p.awaiting is not None and p.awaiting.caller == caller for p in calls):
            return []  # not waiting for this caller (any more)
        if deeper is None:  # its own sub-sessions wait for it: ended first
            deeper = await _end_subs(store, sub, messages, bus, reason)
        denied = pending_calls(messages)
        at = supersede(messages, reason=reason)
        if at is None:
            return []
        try:
            await store.save(
                sub, at, messages[at:], {WAITING_META: 0}, expected_version=record.version
            )
        except StoreConflict:
            continue
        if bus is not None:
            for call in denied:
                event = approval_decided(sub, call, approved=False, reason=reason)
                if event is not None:
                    await bus.publish(event)
        return [sub, *deeper]
    return deeper or []
