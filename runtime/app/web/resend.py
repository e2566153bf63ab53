"""A user message the embedded app has seen before: a retry, or the AI SDK's edit.

The AI SDK's edit (``sendMessage({text, messageId})``) cuts the client's messages after
that user message and posts it, with new text, as an ordinary ``submit-message``. Read as
a new turn, the stored history would hold the old question, its answer, the edited one and
its answer, while the client shows only the last two. So the app stores the client's id
of each user message as the message's own id (when it is in the ids' alphabet) and, on a
post of an id it has stored, follows the worker deployment's rule (docs/deployment.md):
the last user message with other content is an edit, run in place of the last turn
(``regenerate``); with the same content it is a retry, answered with the stored answer
replayed, never a second turn; an earlier user message is a 409 and nothing is stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

from starlette.responses import Response

from runtime.app.web.agui_wire import looks_derived
from runtime.app.web.http import ApiError
from runtime.app.web.resume import stored_turn_chunks
from runtime.app.web.signing import SessionSigner
from runtime.app.web.ui_stream import DONE, HEADERS, UIStreamEncoder
from runtime.errors import RelayUnavailable, StoreError
from runtime.liveness import answering_elsewhere, killed_marker
from runtime.media import user_content
from runtime.messages import AssistantMessage, UserContent, UserMessage

_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""The ids a stored message may have (:func:`runtime.app.session.Session.stream`'s)."""

Resend = Literal["new", "retry", "edit"]


def client_message_id(payload: dict[str, Any]) -> str | None:
    """The client's id of the body's last user message, when it can be the stored
    message's id; ``None`` otherwise (the message then gets an id of the server's, and a
    resend of it is a new turn, as before)."""
    messages = payload.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    value = last.get("id") if isinstance(last, dict) else None
    return value if isinstance(value, str) and _ID.fullmatch(value) else None


def held_answer_id(payload: dict[str, Any]) -> str | None:
    """The id of the assistant message right before the body's last message: what a
    ``useChat`` client that sends while a turn streams shows that turn's answer in."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return None
    held = messages[-2]
    if not isinstance(held, dict) or held.get("role") != "assistant":
        return None
    value = held.get("id")
    return value if isinstance(value, str) else None


def regenerated_id(payload: dict[str, Any]) -> str | None:
    """The id of the answer a regenerate replaces, as the client names it (the AI SDK's
    ``messageId``), if it is a string: a stop naming it stops the regenerate's turn."""
    value = payload.get("messageId")
    return value if isinstance(value, str) and value else None


def client_turn_id(payload: dict[str, Any]) -> str | None:
    """The body's optional ``turnId``: the id the client chose for the turn this POST
    starts (sent by ``prepareSendMessagesRequest``), so that a stop naming it
    (``POST /api/chat/{id}/stop`` with ``{"turnId"}``) sent before this POST arrives stops
    it, as an AG-UI run's ``runId`` does: what an edit or a regenerate without
    ``messageId`` has no other name for. Kept when its answer's id (``msg_<turnId>``) is
    a valid id, else ``None`` (the turn gets an id of the server's, as without one); nor
    one ending as an id an AG-UI snapshot derives (``.r<k>``, ``.result``: the session
    may be read over AG-UI, where the answer's id is written as it is,
    :func:`~runtime.app.web.agui_wire.looks_derived`)."""
    value = payload.get("turnId")
    if isinstance(value, str) and _ID.fullmatch(f"msg_{value}") and not looks_derived(value):
        return value
    return None


async def unrelayed_turn_id(relay: Any, turn_id: str | None) -> str | None:
    """``turn_id`` (the client's: an AG-UI ``runId``, an AI SDK body's ``turnId``) as an
    embedded turn's id, unless the relay the host publishes its turns to (``serve
    --redis``) holds a stream of that id: a runId used again after its turn ended (a
    careless client's constant one) made the new turn append to the earlier turn's
    stream (until its TTL), so a reader of that stream saw both turns. Then, or when the
    relay cannot tell (Redis down), ``None``: the turn gets a new id, as a taken id does
    in a worker deployment (:meth:`runtime.app.web.agui.AGUIRoutes._submit`) and while a
    turn of that id runs (the Host); its events still carry the ``runId``."""
    holds = getattr(relay, "holds_turn", None)
    if turn_id is None or holds is None:
        return turn_id
    try:
        taken = await holds(turn_id)
    except RelayUnavailable:
        return None
    return None if taken else turn_id


def classify_resend(
    history: Sequence[Any], client_id: str | None, content: UserContent, *, regenerate: bool
) -> Resend:
    """What a post of user message ``client_id`` with ``content`` is to ``history``:
    ``"new"`` (an id not stored), ``"retry"`` (the last user message again, same content,
    not a regenerate), ``"edit"`` (the last user message, other content). An earlier user
    message is a 409: only the last one can be edited or regenerated."""
    users = [m for m in history if isinstance(m, UserMessage)]
    if client_id is None or all(m.id != client_id for m in users):
        return "new"
    if users[-1].id != client_id:
        raise ApiError(
            409,
            f"message {client_id!r} is not the session's last user message; only the last "
            "message can be edited or regenerated",
        )
    if regenerate:
        return "edit"
    return "retry" if users[-1].content == user_content(content) else "edit"


async def resend_history(session: Any, store: Any) -> tuple[Sequence[Any], Mapping[str, Any]]:
    """The history a post's message is told against (:func:`classify_resend`): the open
    session's, or the store's when another process saved the session since this one
    last read it. Two ``serve`` processes on one SQLite file (behind one balancer, or
    the CLI beside ``serve``): a client's retry, sent to the other one, of a message
    the first answered and saved was told against the other's older history, a new
    message, and ran a second turn (the question and its answer stored twice); an edit
    of it became a turn after it, an earlier message's edit was not refused. A store
    that cannot tell now (its write lock held too long, say) leaves the session's.
    Returned with the stored meta when it was loaded, or as the session's open read it
    when nothing was saved since (else an empty one), for
    :func:`check_answering_elsewhere`."""
    try:
        if await store.version(session.id) == session.state.version:
            return session.messages, _opened_meta(session)
        record = await store.load(session.id)
    except StoreError:
        return session.messages, _NO_META
    return (session.messages, _NO_META) if record is None else (record.messages, record.meta)


_NO_META: Mapping[str, Any] = MappingProxyType({})


def _opened_meta(session: Any) -> Mapping[str, Any]:
    """The stored meta of a session at the version it was opened at, as the open read
    it (its running marker with it: ``session.meta`` hides the runner's keys); else an
    empty one. Why: a session opened after another process claimed a turn of it (a
    front end that never held it open) is at the stored version, so no load was made,
    and the marker went unseen: the twin ran beside the other's turn (branch
    ``attack3``). No statement more: the open's record is still held."""
    record = getattr(session, "loaded_record", None)
    if record is None or record.version != session.state.version:
        return _NO_META
    return record.meta


def check_answering_elsewhere(
    meta: Mapping[str, Any], client_id: str | None, mine: str | None = None
) -> None:
    """A retry (:func:`classify_resend`) of message ``client_id`` whose answer another
    process is writing now: its session's stored meta holds a running marker
    (:data:`~runtime.liveness.RUNNING_META`) whose writer is not known dead. The same
    message posted to two ``serve`` on one file at once (a balancer's retry) once the
    first claimed it (:attr:`~runtime.app.host.Host.claims_turns`): replayed, the reply
    was the claimed empty answer (a 200 saying nothing); a 409 says what happened. A
    marker of a dead writer is left to the next turn's load, which settles it; one of
    this host (``mine``, its ``marker_id``) is its own leftover, not another's turn."""
    if answering_elsewhere(meta, mine):
        raise ApiError(
            409,
            f"message {client_id!r}: another server is answering it now (the same message "
            "was sent to two at once); reload the conversation once it is done",
        )


def never_answered(history: Sequence[Any], meta: Mapping[str, Any]) -> bool:
    """Whether the last answer of ``history`` (told against a retry: its user message
    is the last) holds nothing and never will: cut short before any step was stored
    (``interrupted``, or its session's running marker names it and its writer is dead:
    not settled yet). A retry of its message then runs it again, as an edit of it,
    instead of replaying nothing. Why: a host that claims its turns
    (:attr:`~runtime.app.host.Host.claims_turns`) stores the message and an empty
    answer before its first model call; killed during that call, its client's retry
    was answered with the empty answer (an ``abort``) every time: the question was
    never answered, where without the claim (nothing stored) the retry ran it."""
    last = history[-1] if history else None
    if type(last) is not AssistantMessage or last.content or last.error is not None:
        return False
    if last.interrupted:
        return True
    marker = killed_marker(meta)
    return marker is not None and marker.get("message_id") == last.id


def replay_response(history: Sequence[Any], signer: SessionSigner | None = None) -> Response:
    """The session's last answer as a UI message stream, rebuilt from the history: what a
    retried message gets instead of a second turn (its approval requests signed by
    ``signer``, the session's, as the first stream's were)."""
    encoder = UIStreamEncoder(signer=signer)
    body = b"".join(encoder.events(c) for c in stored_turn_chunks(history))
    return Response(body + DONE, headers=HEADERS)


__all__ = [
    "Resend",
    "check_answering_elsewhere",
    "classify_resend",
    "client_message_id",
    "client_turn_id",
    "held_answer_id",
    "never_answered",
    "regenerated_id",
    "replay_response",
    "resend_history",
    "unrelayed_turn_id",
]
