"""What a client of ``serve`` is told when its turn's final save was not confirmed.

A turn whose last save the store refused (a full disk, a read-only database) or did not
answer within ``SAVE_TIMEOUT`` ends with ``TurnResult.saved`` ``False``. Its stream had
ended as any other turn's (``finish``, or an error chunk quoting the store's exception),
so a web client (the AI SDK's ``useChat``, an A2A or AG-UI client, the OpenAI SDK, an
MCP host) believed the conversation stored when it was not, or was shown the store's
own text: a file path, a connection string. Every protocol ``serve`` speaks ends such a
turn with its own error shape carrying :func:`unsaved_error` instead: one plain message,
the same in each, naming no class, path or key (the store's text goes to the log only,
``session.save-failed``). A worker deployment's front end never sees such an end: its
worker gives the turn back to be run again (``worker.turn_unsaved``)."""

from __future__ import annotations

from typing import Any

from runtime import output as o
from runtime.errors import (
    SESSION_DELETED,
    ActorFailed,
    AnsweredElsewhere,
    LeaseLost,
    SessionBusy,
    StoreConflict,
    StoreCorrupt,
    StoreError,
    StoreUnavailable,
    TurnConflict,
)
from runtime.output import ErrorInfo

NOT_SAVED = "not_saved"
"""The error's code (``ErrorInfo.kind``; AG-UI's ``code``, OpenAI's ``code``)."""

NOT_SAVED_MESSAGE = (
    "this answer was not saved: the server could not store the conversation; "
    "reload the conversation to see what it holds before going on"
)
NOT_CONFIRMED_MESSAGE = (
    "this answer may not be saved: the server's store did not confirm it in time; "
    "reload the conversation to see what it holds before going on"
)
"""A save that outlived ``SAVE_TIMEOUT``: still in flight, it may land yet."""
ANSWERED_ELSEWHERE_MESSAGE = (
    "this answer was not saved: another server answered this message at the same time "
    "(the message was sent to two at once); reload the conversation to see its answer"
)
"""A save refused as :class:`~runtime.errors.AnsweredElsewhere`: the stored answer stands."""

_STORES = (StoreError, StoreCorrupt, StoreConflict, StoreUnavailable, TurnConflict, LeaseLost)
STORE_KINDS = frozenset(
    {cls.__name__ for cls in _STORES} | {ActorFailed.__name__}  # (a persister gone)
)
"""Kinds of error whose text is a store's (its paths, its connection string): never
quoted to a client."""


def unsaved(result: Any) -> bool:
    """Whether ``result`` (a :class:`~runtime.output.TurnResult`, or ``None`` when none
    came) is a turn whose final save was not confirmed. A turn whose session was
    deleted while it ran is not: nothing was to be saved, and its end says so."""
    return (
        result is not None
        and not getattr(result, "saved", True)
        and result.abort_reason != SESSION_DELETED
    )


def unsaved_error(result: Any) -> ErrorInfo:
    """The error an unsaved turn ends with. A turn that had failed on its own (a
    provider's error: ``finish_reason`` ``error``) keeps that error's text after the
    sentence; a failed save is only ever the turn's error when it had none, and a
    store's text is never quoted."""
    if result.error is None:  # no failure: the save did not answer in time
        return ErrorInfo(kind=NOT_SAVED, message=NOT_CONFIRMED_MESSAGE)
    if result.error.kind == AnsweredElsewhere.__name__:
        return ErrorInfo(kind=NOT_SAVED, message=ANSWERED_ELSEWHERE_MESSAGE)
    own = result.error if result.finish_reason == "error" else None
    if own is None or own.kind in STORE_KINDS:
        return ErrorInfo(kind=NOT_SAVED, message=NOT_SAVED_MESSAGE)
    why = f"{own.kind}: {own.message}" if own.message else own.kind
    return ErrorInfo(kind=NOT_SAVED, message=f"{NOT_SAVED_MESSAGE} (the turn had failed: {why})")


ENDS = frozenset({o.Finish, o.Error, o.Abort})
"""The chunks a turn's stream ends with: held by a streaming protocol until the turn's
result says whether it was saved (:func:`told_end`)."""


def told_end(end: Any, result: Any) -> Any:
    """The end chunk a client is sent: ``end`` as the turn's stream had it, or an
    ``error`` chunk in its place (same ids) when the turn was not saved."""
    if not unsaved(result):
        return end
    return o.Error(
        seq=end.seq, session_id=end.session_id, turn_id=end.turn_id, error=unsaved_error(result)
    )


async def forget_unsaved(session: Any, result: Any) -> None:
    """Drop ``session`` from memory after its turn ended unsaved, so that the next
    request loads it from the store, which holds none of that turn.

    Kept, its history held the unsaved turn: the chat page's reload was answered from
    memory (the answer the client was just told is not saved), an AI SDK retry of the
    same message was replayed that answer with ``finish`` instead of running again, and
    an OpenAI client sending its request again (as its SDK retries a 5xx) had the user
    message twice, both saved with the next turn. The worker deployment does the same
    (``worker.turn_unsaved``). A save that did not answer in time (no error) is kept:
    still in flight, it lands, and the history held is what the store will hold. A
    session another turn waits on keeps its history (that turn carries the unsaved one
    and saves it)."""
    if not unsaved(result) or result.error is None:
        return
    if not session.loaded or session.busy or session.queued:
        return
    try:
        await session.close()
    except SessionBusy:  # a turn entered meanwhile: it carries the history on
        pass
