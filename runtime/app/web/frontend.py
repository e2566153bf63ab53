"""The web app as a stateless front end of a worker deployment.

In a worker deployment (``python -m runtime worker``) turns run on worker processes:
sessions live in PostgreSQL, turns are rows of its queue
(a :class:`runtime.turn_queue.TurnQueue`), and a turn's live output goes through the
relay (:mod:`runtime.relay`). A front end then holds no session in memory and runs no
turn, so any number of them can stand behind a load balancer and a client can reconnect
to any of them:

``POST /api/chat``
    Queues the turn (``queue.submit``) and answers with its UI message stream read from
    the relay. The AI SDK's id of the last user message is the idempotency key: a client
    that retries the same POST gets the same turn, never a second one; the same id with
    other text is an edit, run in place of that message's turn when it is the session's
    last and has ended, else a 409 (never the old turn's replay). A second POST
    while the session is busy queues behind the first (per-session order); its stream
    starts when its turn does. Under ``serve --on-busy steer`` it is queued naming the
    running turn, whose worker inserts it at its next step boundary: the POST answers
    202 ``{"steered": true, "turnId", "messageId"}`` once that save stored it, or streams
    it as a turn of its own when the running turn ended first. From the client that
    shows the running turn (``useChat`` sending while it streams: the body's message
    before the new one is one of that turn's answers) it answers 200 with the rest of
    the turn from the relay (:class:`SteeredTurnResponse`), and the stream that showed
    the answer ends at the message, on whichever front end reads it. A POST over the
    queue's caps (``serve --max-queued-per-session``, ``--max-queued``) is answered 429
    with ``Retry-After`` and queues nothing. Leaving the stream does **not** cancel the turn: the
    client is only a viewer; stopping is explicit (``POST /api/chat/{id}/stop``).
``POST /api/chat`` with the assistant message last (the AI SDK's answer to a turn that
    waits for approval or a client tool's output, docs/approval.md)
    Records the answers through the queue (:meth:`runtime.turn_queue.TurnQueue.decide`:
    checked against the stored turn, compare-and-set in the store, refused unless the
    turn's row still waits), which puts the turn back for any worker to resume when the
    answers complete its decisions; the response then streams the continuation from the
    relay (``start`` with the same message id, no input again for the answered calls).
    Answers that leave calls waiting get 202, as in the embedded app.
``GET /api/chat/{id}/stream``
    The turn streaming now (the relay's), else the session's running or oldest queued
    turn (the queue's), waited for like ``POST`` does; 204 when there is none (a turn
    that waits for input is none: it streams again once decided).
``POST /api/chat/{id}/stop``
    Cancels the session's running turn (its worker stops it, saved and marked
    interrupted), else its oldest queued turn (cancelled at once, it never runs), else
    denies what its waiting turn waits for (reason ``stopped``; the model is told). A
    body naming a turn (``{"turnId"}``) or a message (``{"messageId"}``, the client's id
    of a user message or of the answer a regenerate replaces, looked up by the queue's
    key of it) stops that turn only, queued or running: its POST ends with ``abort``;
    one neither queued nor running is a 204.
``GET /api/sessions``, ``GET /api/sessions/{id}``
    Read from the store.
``DELETE /api/sessions/{id}``
    Deletes the session from the store, whose transaction also cancels its open turns
    (reason ``session deleted``: queued ones never run, a running one's worker has its
    saves refused and stops); a running one's worker is also told on the relay. 204,
    also for a session that does not exist.

Until a worker claims a turn the relay has no stream for it: its viewers wait for the
turn's status to move, all the viewers of one front end on one shared look at the queue
(:class:`runtime.app.web.watch.TurnWatch`, one query for every waiting turn, so PostgreSQL's
load does not grow with viewers), with the queue's row as the truth: a turn that ended
with no stream (cancelled while queued, failed before it streamed anything) ends the
HTTP stream with ``abort`` or ``error``; a finished turn whose stream the relay lost is
rebuilt from the stored message.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any

import orjson
import trio
from starlette.requests import Request
from starlette.responses import Response

from runtime import output as o
from runtime.app.nested import end_sub_waits
from runtime.app.web.answers import (
    STOPPED_WAIT,
    answers_refused,
    awaited_calls,
    check_and_record_on,
    deny_pending,
    is_continuation,
    waiting_in_meta,
)
from runtime.app.web.chat_input import check_media, read_chat_request, title_of
from runtime.app.web.http import (
    FRONT_END_CLOSING,
    STORE_REFUSED,
    ApiError,
    busy_message,
    json_response,
    relay_failed,
    session_id_param,
    session_page,
    store_failed,
    ui_view,
    web_state,
)
from runtime.app.web.queued_turn import STEERED_MARK, of_turn, read_turn
from runtime.app.web.resend import client_message_id, client_turn_id, held_answer_id
from runtime.app.web.resume import (
    STOPPED,
    RelayEncoder,
    RelayStreamResponse,
    _unavailable_as_503,
    parse_after_seq,
    stop_target,
    turn_to_resume,
    unavailable_event,
)
from runtime.app.web.signing import for_session
from runtime.app.web.ui_stream import error_text, handed_over, sse, ui_messages
from runtime.app.web.watch import POLL_FIRST, POLL_MAX, TurnWatch, follow_turn
from runtime.approval import WAITING_META, Decision, Recorded, approval_decided, pending_calls
from runtime.busy import INTERRUPT, INTERRUPTED_BY_NEW, STEER, OnBusy
from runtime.errors import (
    SESSION_DELETED,
    HostClosed,
    QueueFull,
    RelayTurnGone,
    RelayUnavailable,
    SessionBusy,
    StoreError,
    StoreUnavailable,
    TurnConflict,
    TurnIdTaken,
)
from runtime.ids import new_id
from runtime.liveness import public_meta
from runtime.logging import get_logger
from runtime.messages import UserContent
from runtime.serde import unstructure
from runtime.store import SessionRecord, has_user_messages, load_last_turn
from runtime.tools import caller_of
from runtime.turn_queue import (
    DONE,
    FINAL_STATUSES,
    QUEUED,
    RUNNING,
    STEERED,
    WAITING,
    Decided,
    QueuedTurn,
    TurnOptions,
    TurnQueue,
    TurnStatus,
)


def idempotency_key(session_id: str, payload: dict[str, Any], regenerate: bool) -> str | None:
    """The key that makes a retried ``POST /api/chat`` the same turn.

    A submit is keyed by the AI SDK's id of its last user message (the client generates
    it once and sends it again on a retry, or with new text for an edit, which the queue
    tells apart by the input). A regenerate carries the same user message as the turn it
    replaces, so it is keyed by the id of the assistant message it regenerates
    (``messageId``), which the new turn's message replaces; without one there is no key.
    Keys are scoped by session: message ids are only the client's. The key is a hash of
    the JSON list ``[session, kind, id]``: whole ids, and no separator an id could
    contain, so two different tuples never share a key. An id with a NUL (which
    PostgreSQL's text refuses) is a 400."""
    message_id = stop_name(payload, regenerate)
    if message_id is None:
        return None
    kind = "regenerate" if regenerate else "submit"
    if "\x00" in message_id:
        raise ApiError(400, "a message id must not contain NUL characters")
    return message_key(session_id, kind, message_id)


def message_key(session_id: str, kind: str, message_id: str) -> str:
    """The queue's idempotency key of the client's message ``message_id`` submitted as
    ``kind`` (``submit``, ``regenerate``; AG-UI's run: ``ag-ui``): a hash of the JSON
    list ``[session, kind, id]``."""
    return hashlib.sha256(orjson.dumps([session_id, kind, message_id])).hexdigest()


def stop_name(payload: dict[str, Any], regenerate: bool) -> str | None:
    """The client's id a stop names an AI SDK POST's message by, as its key is made
    (:func:`idempotency_key`): its last user message's, or the answer's a regenerate
    replaces (``messageId``); ``None`` for none."""
    if regenerate:
        named = payload.get("messageId")
    else:
        messages = payload.get("messages")
        users = [
            m
            for m in (messages if isinstance(messages, list) else [])
            if isinstance(m, dict) and m.get("role") == "user"
        ]
        named = users[-1].get("id") if users else None
    return named if isinstance(named, str) and named else None


CLOSING_END = (
    b": this front end is stopping; the turn goes on: read it on another with "
    b"GET /api/chat/{id}/stream and Last-Event-ID\n\n"
)
"""The end of an AI SDK stream a closing front end stops reading: an SSE comment
(every client skips it) after whole events, no ``[DONE]``: the turn did not end."""

STEER_ANSWERED_WAIT = 2.0
"""Seconds a steer's 202 reads the steered turn's relay stream for its ``steered``
chunk (there already, unless the relay lost it) before it asks the store."""

STOPPABLE_KINDS = ("submit", "ag-ui", "regenerate")
"""The kinds of key a stop's ``messageId`` is looked up under: a user message's id (an
AI SDK submit's, an AG-UI run's), or the answer's id a regenerate is keyed by (the AI
SDK's ``regenerate`` sends that one)."""


class QueuedTurnResponse(RelayStreamResponse):
    """Streams a queued turn from the relay once a worker streams it; the client leaving
    only stops this stream, never the turn."""

    def __init__(
        self,
        *args: Any,
        queue: TurnQueue,
        watch: TurnWatch | None = None,
        front: FrontEnd | None = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.queue = queue
        self.watch = watch if watch is not None else TurnWatch(queue)
        """The front end's :class:`~runtime.app.web.watch.TurnWatch`, shared by its viewers."""
        self.front = front
        """The front end whose closing ends this stream (:meth:`FrontEnd.viewing`)."""

    async def _body(self, write: Any, encoder: RelayEncoder) -> None:
        if self.front is None:
            await self._followed(write, encoder)
            return
        with self.front.viewing() as viewing:
            await self._followed(write, encoder)
        if viewing.cancelled_caught:  # the front end closes: the turn goes on elsewhere
            self.cut = True
            await write(CLOSING_END)

    async def _followed(self, write: Any, encoder: RelayEncoder) -> None:
        delay = POLL_FIRST
        status: Any = object()  # not looked at yet
        try:
            while True:
                try:
                    await self._relay_events(write, encoder)
                    if self.sent or not await self._continuing():
                        return
                    # The stream ends at a wait whose continuation a worker is about
                    # to stream (decided a moment ago): look at the relay again soon.
                    await trio.sleep(delay)
                    delay = min(delay * 2, POLL_MAX)
                    continue
                except RelayTurnGone as exc:
                    if self.sent:  # lost mid-stream: the client must reload
                        await write(await self._lost_end(exc))
                        return
                # Queued: nothing to stream until a worker claims it, so wait (with the
                # front end's other viewers: one query for all) until its status moves.
                # Claimed and not streaming yet: look at the relay again soon.
                status = await self.watch.changed(
                    self.turn_id, status, math.inf if status == "queued" else delay
                )
                if status is None:
                    await write(_error(f"turn {self.turn_id!r} does not exist"))
                    return
                if status in FINAL_STATUSES or status == WAITING:
                    turn = await self.queue.get(self.turn_id)
                    if turn is None:
                        await write(_error(f"turn {self.turn_id!r} does not exist"))
                        return
                    await self._finished(turn, write, encoder)
                    return
                if status != "queued":
                    delay = min(delay * 2, POLL_MAX)
        except RelayUnavailable as exc:
            await self._unavailable_end(exc, write)
        except StoreError as exc:
            # The queue's store went away under the stream (PostgreSQL restarting): a
            # clear end, not a response the server cuts off; the turn goes on regardless.
            why = store_failed(exc, "frontend.stream_store_failed", turn_id=self.turn_id)
            await write(_error(f"{why}; reload the session (GET /api/sessions/{self.session_id})"))

    async def _unavailable_end(self, exc: RelayUnavailable, write: Any) -> None:
        """The end of a stream whose relay stopped answering. Its worker runs the turn
        and saves it all the same (``relay.unflushed``: readers rebuild from the store),
        so a client shown nothing of it waits, on the queue, for the turn to end and
        gets what the store then holds, as if the turn had ended unread
        (:meth:`_finished`); a client shown part of it, or a store that fails too, gets
        the relay's error, telling it to reload the session (the saved answer)."""
        if self.sent or self.after_seq is not None:
            await write(unavailable_event(exc, self.session_id))
            return
        told = relay_failed(exc, turn_id=self.turn_id)  # (its text names Redis's address)
        try:
            status: Any = object()
            while status not in FINAL_STATUSES and status != WAITING:
                status = await self.watch.changed(self.turn_id, status)
                if status is None:
                    break
            turn = await self.queue.get(self.turn_id)
            if turn is None:
                await write(_error(f"turn {self.turn_id!r} does not exist"))
                return
            await self._stored_end(turn, write, RelayTurnGone(told))
        except StoreError:
            reload = f"; reload the session (GET /api/sessions/{self.session_id})"
            await write(sse({"type": "error", "errorText": error_text(exc.kind, told + reload)}))

    async def _lost_end(self, exc: RelayTurnGone) -> bytes:
        """The end of a stream shown in part whose relay lost the rest: ``abort``
        (``session deleted``) for a turn its session's delete cancelled (its worker,
        its saves refused, stopped without ending the stream; there is no session left
        to reload), else an error telling the client to reload the session."""
        turn = await self.queue.get_status(self.turn_id)
        if (
            turn is not None
            and turn.status == "cancelled"
            and turn.cancel_reason == SESSION_DELETED
        ):
            return sse({"type": "abort", "reason": SESSION_DELETED})
        return await self._rebuilt(exc, replay=False)

    def _read(self) -> AsyncIterator[Any]:
        """The relay's read, given up once the queue says the turn ended and its stream
        still shows nothing (:func:`~runtime.app.web.watch.follow_turn`): a client shown
        part of it is told to reload the session, one shown nothing gets the stored
        message."""
        return follow_turn(
            self.relay,
            self.queue,
            self.turn_id,
            after_seq=self.after_seq,
            after_pauses=self.after_pauses,
            # shown nothing: answered from the store if the relay fails (_unavailable_end)
            unseen=not self.sent and self.after_seq is None,
        )

    async def _relay_events(self, write: Any, encoder: RelayEncoder) -> None:
        held: list[Any] = []  # (an approval request signed from the store: _release)
        async for read in self._read():
            unsigned = type(read) is o.ToolApprovalRequest and encoder.unsigned(read)
            ready = (read,) if not (held or unsigned) else ()
            for chunk in ready or await self._release(read, encoder, held):
                if (
                    type(chunk) is o.Steered
                    and not chunk.answered  # (an earlier turn answered it: this goes on)
                    and await self._hands_over(chunk)
                ):
                    self.sent = self.handed = True
                    await write(encoder.events(chunk) + handed_over(chunk))
                    return
                data = encoder.events(chunk)
                if data:
                    self.sent = True
                    await write(data)
        await self._write_events(write, encoder, await self._release(None, encoder, held))

    async def _hands_over(self, chunk: o.Steered) -> bool:
        """Whether the client that sent the message ``chunk`` says was steered in reads
        the rest of the turn from that message's stream (its steering row names one of
        this turn's answers: :attr:`TurnOptions.follows`): this stream then ends here,
        with ``data-steered`` and a ``finish`` (``steered``), as the embedded app's
        does. One read of the queue per message steered in; a plain turn makes none."""
        key = message_key(self.session_id, "submit", chunk.message_id)
        try:
            row = await self.queue.steering(self.session_id, self.turn_id, key)
        except StoreError as exc:  # (the stream goes on: the client sees both answers)
            get_logger("axon.web").warning(
                "frontend.steering_unread", turn_id=self.turn_id, error=_one_line(exc)
            )
            return False
        return row is not None and follows(row.options.follows, self.turn_id)

    async def _continuing(self) -> bool:
        """Whether the turn runs although its stream, read to its end, showed nothing:
        it waited for input, and its continuation has not streamed yet."""
        turn = await self.queue.get_status(self.turn_id)
        return turn is not None and turn.status == RUNNING

    async def _finished(self, turn: Any, write: Any, encoder: RelayEncoder) -> None:
        """The end of a turn that finished while no stream of it was read: its stream
        after all (it ended between two looks), else its stored message, else why it
        ended (cancelled while queued, failed before it streamed)."""
        try:
            await self._relay_events(write, encoder)
            return
        except RelayTurnGone as exc:
            if self.sent or self.after_seq is not None:
                await write(await self._lost_end(exc))
                return
            gone = exc
        await self._stored_end(turn, write, gone)

    async def _stored_end(self, turn: Any, write: Any, gone: RelayTurnGone) -> None:
        """The end of turn ``turn`` (ended or waiting) from the store, its relay having
        none of it: its stored message, else why it ended."""
        record = await self.store.load(self.session_id)
        if record is not None and any(
            getattr(m, "id", None) == turn.message_id for m in record.messages
        ):
            await write(await self._rebuilt(gone, replay=True, message_id=turn.message_id))
        elif turn.status == "cancelled":
            await write(sse({"type": "abort", "reason": turn.cancel_reason or "cancelled"}))
        elif turn.status == "failed":
            await write(_error(turn.error or f"turn {turn.turn_id!r} failed"))
        else:
            await write(await self._rebuilt(gone, replay=False))


class SteeredTurnResponse(QueuedTurnResponse):
    """The rest of turn ``turn_id`` from the ``steered`` chunk of message ``steered_by``
    on: a ``start`` naming the answer stored after that message (the chunk's
    ``answer_id``), then what follows it. The relay is read from the turn's start to
    find the chunk; ``resume_after`` (a client's ``Last-Event-ID``) leaves out what it
    saw, and the ``start`` too once it saw it. A relay that lost the turn is an error
    telling the client to reload the session (the stored turn's first answer is not
    this message's)."""

    def __init__(self, *args: Any, steered_by: str, resume_after: int | None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.steered_by = steered_by
        self.resume_after = resume_after

    async def _relay_events(self, write: Any, encoder: RelayEncoder) -> None:
        after = -1 if self.resume_after is None else self.resume_after
        found = False
        async for chunk in self._read():
            if not found:
                if type(chunk) is o.Steered and chunk.message_id == self.steered_by:
                    if chunk.answered:  # an earlier turn stored and answered it: it ends
                        # here, as the stream it was sent from ends at a first steer
                        self.sent = self.handed = True
                        if chunk.seq > after:
                            await write(encoder.events(chunk) + handed_over(chunk))
                        return
                    found = True
                    start = encoder.events(o.Start(message_id=chunk.answer_id, seq=chunk.seq))
                    if chunk.seq > after:
                        self.sent = True
                        await write(start)
                continue
            if type(chunk) is o.Steered and not chunk.answered and await self._hands_over(chunk):
                self.sent = self.handed = True
                if chunk.seq > after:
                    await write(encoder.events(chunk) + handed_over(chunk))
                return
            data = encoder.events(chunk)  # (what the client saw too: the encoder's state)
            if data and getattr(chunk, "seq", 0) > after:
                self.sent = True
                await write(data)

    async def _rebuilt(
        self, exc: RelayTurnGone, *, replay: bool, message_id: str | None = None
    ) -> bytes:
        return await super()._rebuilt(exc, replay=False)


def follows(answer_id: str | None, turn_id: str) -> bool:
    """Whether ``answer_id`` (a steering message's :attr:`TurnOptions.follows`) is one of
    turn ``turn_id``'s answers: its first assistant message, or one a message steered
    into it started."""
    return answer_id is not None and of_turn(answer_id, f"msg_{turn_id}")


def _one_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _error(text: str) -> bytes:
    return sse({"type": "error", "errorText": error_text("turn", text)})


class FrontEnd:
    """The endpoints of a front end: ``store`` (shared with the workers), ``queue`` (the
    :class:`~runtime.turn_queue.TurnQueue` in it) and ``relay`` (the one the workers
    write to)."""

    def __init__(self, *, store: Any, queue: TurnQueue, relay: Any) -> None:
        self.store = store
        self.queue = queue
        self.relay = relay
        self.watch = TurnWatch(queue)
        self.closing = False
        """Set by :meth:`close` (``serve`` stopping, once its ``--drain`` ended)."""
        self._viewers: set[trio.CancelScope] = set()

    def close(self) -> None:
        """Begin closing (``serve``, once its ``--drain`` ended; during the drain this
        front end serves as before). A stateless front end holds nothing a client's
        work needs: new work (a message, an answer to a waiting turn, a stream to
        read) is refused with 503 and ``Retry-After`` (:meth:`check_open`), nothing
        queued, for another front end to take; the streams being read end cleanly now
        (:meth:`viewing`: whole events, resumable there with ``Last-Event-ID`` or the
        protocol's own resubscribe) instead of cut by the server's last seconds. The
        turns go on on their workers. Stops, deletes and reads of sessions are still
        answered: one short write or read in the store, harmless and wanted."""
        self.closing = True
        for scope in list(self._viewers):
            scope.cancel()

    def check_open(self) -> None:
        """Raise :class:`~runtime.errors.HostClosed` (each protocol's 503 with
        ``Retry-After``) once this front end is closing (:meth:`close`)."""
        if self.closing:
            raise HostClosed(FRONT_END_CLOSING)

    @contextmanager
    def viewing(self) -> Iterator[trio.CancelScope]:
        """A scope a stream's reading runs in, cancelled when this front end closes
        (:meth:`close`): ``cancelled_caught`` then tells the stream to end cleanly."""
        with trio.CancelScope() as scope:
            if self.closing:
                scope.cancel()
            self._viewers.add(scope)
            try:
                yield scope
            finally:
                self._viewers.discard(scope)

    def routes(self) -> dict[str, Callable[[Request], Any]]:
        """The app's endpoints this mode replaces, by name (see :func:`create_app`)."""
        return {
            "chat": self.chat,
            "stream": self.stream,
            "stop": self.stop,
            "sessions": self.list_sessions,
            "session": self.get_session,
            "delete": self.delete_session,
            "info": self.info,
        }

    def _response(
        self,
        request: Request,
        turn: Any,
        after_seq: int | None,
        *,
        after_pauses: int = 0,
        announced: Iterable[str] = (),
    ) -> Any:
        state = web_state(request)
        return QueuedTurnResponse(
            self.relay,
            self.store,
            turn.session_id,
            turn.turn_id,
            after_seq=after_seq,
            keepalive=state.keepalive,
            send_timeout=state.send_timeout,
            background=state.background,
            queue=self.queue,
            watch=self.watch,
            front=self,
            after_pauses=after_pauses,
            announced=announced,
            signer=state.signer,
        )

    async def chat(self, request: Request) -> Any:
        self.check_open()  # (before the body is read: the 503 closes the connection)
        state = web_state(request)
        payload, session_id, text, regenerate = await read_chat_request(request, answers=True)
        if is_continuation(payload):
            return await self._continue(request, session_id, payload)
        check_media(text, state.agent_for(session_id))
        # ``serve --on-busy`` (None: enqueue): the queue decides it with the insert.
        steer = state.on_busy == STEER and not regenerate
        # The user message is stored under the client's id (the last message's in the
        # body), as the embedded app stores it, whichever strategy queued it: a later
        # regenerate, edit or stop of it, or a reload, names it so. A resend of a stored
        # id is the queue's (its key: the same turn, or an edit in place of it); an id
        # the session holds without a turn of its key gets one of the worker's there.
        options = TurnOptions(user_message_id=client_message_id(payload))
        if steer:  # a steering message's id is the client's, whichever turn stores it
            options = TurnOptions(
                user_message_id=client_message_id(payload) or new_id("msg"),
                follows=held_answer_id(payload),
            )
        elif regenerate:
            # ``messageId``, the answer it replaces: refused by the worker if a later
            # message's turn ran while it waited (not here: a retry of it finds its own
            # turn running). The user message it stores again keeps the client's id, as
            # the embedded app's does (it got one of the worker's, which the client that
            # regenerated no longer matched; ``useChat`` sends no ``messageId`` when its
            # last message is the user's)
            named = payload.get("messageId")
            options = TurnOptions(
                regenerates=named if isinstance(named, str) else None,
                user_message_id=client_message_id(payload),
            )
        # The client's ``turnId``: a stop naming it before this POST came stops the turn
        # (taken in the insert); a turn id used before gets the turn a new one, as does
        # one whose answer, ``msg_<turnId>``, would take its user message's id or an
        # earlier user message's (stored: one indexed look, for a POST with a turnId).
        turn_id = client_turn_id(payload)
        if turn_id is not None and await self.queue.get_status(turn_id) is not None:
            turn_id = None
        elif turn_id is not None and f"msg_{turn_id}" == options.user_message_id:
            turn_id = None  # (its answer, msg_<turnId>, would be its user message's id)
        elif turn_id is not None and await has_user_messages(
            self.store, session_id, (f"msg_{turn_id}",)
        ):
            turn_id = None
        turn = await self.submit(
            session_id,
            text,
            idempotency_key(session_id, payload, regenerate),
            regenerate,
            turn_id=turn_id,
            on_busy=state.on_busy,
            options=options,
            stop_name=stop_name(payload, regenerate),
        )
        if state.on_busy == INTERRUPT:
            await self._interrupt_running(session_id, turn)
        if turn.steer_of is not None and await self._steered(turn):
            if follows(turn.options.follows, turn.steer_of):
                return self._handover(request, turn)
            answered = await self._steer_answered(turn)
            return json_response(
                {
                    "steered": True,
                    "turnId": turn.steer_of,
                    "messageId": turn.user_message_id,
                    "answered": answered,
                },
                202,
            )
        return self._response(request, turn, None)

    async def _check_not_an_answers_id(self, session_id: str, message_id: str | None) -> None:
        """Refuse (409) a new user message named as an answer of a turn of the session
        not ended yet: ``msg_<turn id>``, its first answer's id, or
        ``msg_<turn id>-s<step>``, the id its answer takes after a steered message
        (:func:`actors.turn.takeover.steered_message_id`). Steered in, the runner took
        it for a message the history holds (a retry) and dropped it; queued, its turn
        stored it under an id of the worker's: the embedded app refuses it while the
        session is busy (``InputHeld``), whichever strategy. Not a server id instead:
        the client names its message by its own id (a stop, a resend, an edit), and an
        id no answer takes is all it needs. One status read, only for an id of that
        shape (``msg_...``)."""
        message_id = message_id or ""
        head, mark, step = message_id.rpartition(STEERED_MARK)
        if not (mark and step.isdigit()):
            head = message_id
        if not head.startswith("msg_"):
            return
        status = await self.queue.get_status(head[len("msg_") :])
        if status is None or status.session_id != session_id or status.finished:
            return
        if of_turn(message_id, status.message_id):
            raise ApiError(
                409,
                f"message {message_id!r} is an id turn {status.turn_id!r} of session "
                f"{session_id!r} gives its answer (its first, or one after a steered "
                "message): send it under another id.",
            )

    async def _steer_answered(self, turn: QueuedTurn) -> bool:
        """Whether the running turn that took the steering message ``turn`` found it
        stored and answered by an earlier turn (a client's retry of it): its ``steered``
        chunk says so (:attr:`~runtime.output.Steered.answered`), which the 202 repeats,
        as the embedded app's does. Read from the turn's relay stream up to that chunk
        (sent before the save that marked the row, so already there): for at most
        :data:`STEER_ANSWERED_WAIT` seconds. A relay that lost it (a gap, a restart, a
        trimmed stream: the read ends, fails or waits on) is not waited out to the
        turn's end: the stored history tells (:meth:`_steer_answered_stored`)."""
        assert turn.steer_of is not None
        with trio.move_on_after(STEER_ANSWERED_WAIT):
            try:
                async for chunk in follow_turn(self.relay, self.queue, turn.steer_of):
                    if type(chunk) is o.Steered and chunk.message_id == turn.user_message_id:
                        return chunk.answered
            except (RelayTurnGone, RelayUnavailable, StoreError) as exc:
                get_logger("axon.web").warning(
                    "frontend.steer_unread", turn_id=turn.steer_of, error=_one_line(exc)
                )
        return await self._steer_answered_stored(turn)

    async def _steer_answered_stored(self, turn: QueuedTurn) -> bool:
        """:meth:`_steer_answered` from the store, its row marked ``steered`` (the save
        that took the message committed): answered when the message is stored before the
        steered turn's answer (``msg_<turn id>``, stored from that turn's start), that
        is by an earlier turn; one the steered turn stored comes after it. A store that
        fails, or a history without either: ``False``, as a first steer."""
        assert turn.steer_of is not None
        try:
            record = await self.store.load(turn.session_id)
        except StoreError as exc:
            get_logger("axon.web").warning(
                "frontend.steer_unread", turn_id=turn.steer_of, error=_one_line(exc)
            )
            return False
        if record is None:
            return False
        wanted, answer = turn.user_message_id, f"msg_{turn.steer_of}"
        for message in record.messages:
            if message.id == answer:
                return False
            if message.id == wanted:
                return True
        return False

    def _handover(self, request: Request, turn: QueuedTurn) -> Any:
        """The rest of the turn ``turn`` steered (``turn.steer_of``), from the relay, as
        the answer to the message steered in: its client showed that turn's answer and
        sent the message while it streamed (``useChat``), and the stream it read ends at
        the ``steered`` chunk (:meth:`QueuedTurnResponse._hands_over`), on whichever front
        end it is read. ``Last-Event-ID`` resumes it like any relayed stream."""
        state = web_state(request)
        assert turn.steer_of is not None
        return SteeredTurnResponse(
            self.relay,
            self.store,
            turn.session_id,
            turn.steer_of,
            after_seq=None,
            keepalive=state.keepalive,
            send_timeout=state.send_timeout,
            background=state.background,
            queue=self.queue,
            watch=self.watch,
            steered_by=turn.user_message_id,
            resume_after=parse_after_seq(request),
            signer=state.signer,
        )

    async def _interrupt_running(self, session_id: str, turn: QueuedTurn) -> None:
        """After an ``interrupt`` submit: the session's running turn, which the submit's
        transaction asked to stop (the queue's mark is the truth), told over the relay so
        that its worker hears it at once, not at its next renewal. Read after the
        submit, not before: the turn running then may have ended since, and the next one
        started in its place (a last save claims it in its commit) had its mark from the
        submit but nobody told. Only a turn marked so: one that started after the submit
        (a later message's) is not this message's to stop, nor any a replay of the
        message (which interrupts nothing) finds running."""
        running = await self.queue.active(session_id)
        if (
            running is not None
            and running.status == RUNNING
            and running.turn_id != turn.turn_id
            and running.cancel_requested
        ):
            await _unavailable_as_503(
                self.relay.request_cancel(running.turn_id, INTERRUPTED_BY_NEW)
            )

    async def _steered(self, turn: QueuedTurn) -> bool:
        """Wait until the turn ``turn`` was submitted to steer took it at a step boundary
        (``True``: its stream shows the answer), or it is a turn of its own (``False``:
        that turn ended first, and this one is claimed or ends like any queued turn)."""
        status: Any = turn.status
        while status == QUEUED:
            status = await self.watch.changed(turn.turn_id, status)
        if status != DONE:
            return False
        done = await self.queue.get_status(turn.turn_id)
        return done is not None and done.finish_reason == STEERED

    async def submit(
        self,
        session_id: str,
        text: UserContent,
        key: str | None,
        regenerate: bool,
        *,
        turn_id: str | None = None,
        options: TurnOptions | None = None,
        titled: bool = True,
        on_busy: OnBusy | None = None,
        meta: Mapping[str, Any] | None = None,
        stop_name: str | None = None,
    ) -> Any:
        """Queue the turn (``titled``: naming a session that has no title yet after its
        input; ``meta``: set on the session as the turn starts); a refusal is an
        :class:`ApiError` with the status the queue's error means (429 over a cap, 503
        while the store is unreachable, 409 for a key another turn holds, 400 for
        anything else the store refused), and nothing is queued; on a front end that
        is closing, :class:`~runtime.errors.HostClosed` (:meth:`check_open`)."""
        self.check_open()
        try:
            if options is not None and not regenerate:  # (whichever strategy and protocol:
                # the embedded app's InputHeld while busy)
                await self._check_not_an_answers_id(session_id, options.user_message_id)
            meta = dict(meta or {})
            if titled:  # (its meta alone: the whole session was read for this)
                stored_meta = await self.store.meta(session_id)
                _check_not_callers_wait(session_id, stored_meta)
                if stored_meta is None or "title" not in stored_meta:
                    meta["title"] = title_of(text)
            submit = partial(
                self.queue.submit,
                session_id,
                text,
                idempotency_key=key,
                meta=meta,
                regenerate=regenerate,
                options=options,
                on_busy=on_busy,
                stop_name=stop_name,
            )
            try:
                return await submit(turn_id=turn_id)
            except TurnIdTaken:
                if turn_id is None:
                    raise
                # The client's turn id, found unused, was taken meanwhile (a request
                # sent at the same time, a key-less twin of another message or session):
                # this turn gets an id of its own, as when found used before (nothing
                # was queued; the same message sent twice is one turn, by its key).
                return await submit(turn_id=None)
        except SessionBusy:  # ``--on-busy reject``: which turn runs, how to wait or stop
            try:
                active = await self.queue.active(session_id)
            except StoreError:  # (the store went away since: the 409 without the turn id)
                active = None
            turn_id = active.turn_id if active is not None else None
            raise ApiError(409, busy_message(session_id, turn_id)) from None
        except QueueFull as exc:
            retry = str(max(1, math.ceil(exc.retry_after)))
            raise ApiError(429, exc.message, {"retry-after": retry}) from None
        except StoreUnavailable as exc:  # (the store's text names its host: the log's)
            told = store_failed(exc, "frontend.submit_unavailable", session_id=session_id)
            raise ApiError(503, told, {"retry-after": "1"}) from None
        except TurnConflict as exc:  # (the queue's own words: which message, which turn)
            raise ApiError(409, _one_line(exc)) from None
        except StoreError as exc:  # whatever the store refused: a 4xx and one log line
            told = store_failed(
                exc, "frontend.submit_refused", told=STORE_REFUSED, session_id=session_id
            )
            raise ApiError(400, told) from None

    async def _continue(self, request: Request, session_id: str, payload: dict[str, Any]) -> Any:
        """The AI SDK's answers for a waiting turn: recorded through the queue; the
        request whose answers complete the turn's decisions streams its continuation."""
        self.check_open()  # (its body may have come as this front end began closing)
        decided: list[Decided] = []
        tools = self._tools(request, session_id)
        limit = web_state(request).agent_for(session_id).budget.max_tool_result_chars
        stored, whole = await self._answered_on(session_id, tools, payload, limit)
        # The body's answers are checked on this read, and, when it is the whole session,
        # the first decided on it too (its version-checked save proves it current, else
        # the queue reads again); on a last turn, the queue reads its own.
        record = self._recorder(request, session_id, decided, known=stored if whole else None)
        signer = for_session(web_state(request).signer, session_id)
        announced, recorded = await check_and_record_on(
            stored, tools, payload, record, signer, limit
        )
        if not recorded.complete:  # other calls still wait: whoever decides the last one resumes
            # as the decision left them: no read of the session just saved
            return json_response({"recorded": True, "waiting": recorded.left}, 202)
        turn = decided[-1].turn
        return self._response(request, turn, None, after_pauses=turn.resumes, announced=announced)

    async def _answered_on(
        self,
        session_id: str,
        tools: Mapping[str, Any],
        payload: dict[str, Any],
        max_chars: int | None = None,
    ) -> tuple[SessionRecord | None, bool]:
        """What a continuation's answers are checked on, and whether it is the whole
        session: its last turn (:func:`~runtime.store.load_last_turn`: the calls it
        waits for, the results after it), where the POST read the whole session (every
        message of a long one decoded, in a thread); the whole session when the answers
        are refused on the last turn, which alone tells a call an earlier turn decided
        (409) from one that never waited (404), as the queue's decision does."""
        last = await load_last_turn(self.store, session_id)
        if last is None:
            return None, True
        first, record = last
        if first == 0:
            return record, True
        if answers_refused(record, tools, payload, max_chars=max_chars):
            return await self.store.load(session_id), True
        return record, False

    @staticmethod
    def _tools(request: Request, session_id: str) -> dict[str, Any]:
        return {t.name: t for t in web_state(request).agent_for(session_id).tools}

    def _recorder(
        self,
        request: Request,
        session_id: str,
        decided: list[Decided],
        *,
        known: SessionRecord | None = None,
    ) -> Callable[[str, Decision], Awaitable[Recorded]]:
        """Records one decision through the queue (appending its outcome to ``decided``)
        and tells the bus of an approval's. ``known``: the session as the caller just
        read it, which the first decision decides on instead of reading it again
        (:meth:`~runtime.turn_queue.TurnQueue.decide`); later ones read the store (the
        first moved the session)."""
        state = web_state(request)
        tools = self._tools(request, session_id)
        max_chars = web_state(request).agent_for(session_id).budget.max_tool_result_chars
        view = [known]

        async def record(key: str, decision: Decision) -> Recorded:
            seen, view[0] = view[0], None
            outcome = await self.decide(
                state.host.bus, session_id, key, decision, tools, known=seen, max_chars=max_chars
            )
            decided.append(outcome)
            return outcome.recorded

        return record

    async def decide(
        self,
        bus: Any,
        session_id: str,
        key: str,
        decision: Decision,
        tools: Mapping[str, Any],
        *,
        known: SessionRecord | None = None,
        max_chars: int | None = None,
    ) -> Decided:
        """Record one decision for a waiting call of ``session_id`` through the queue
        (:meth:`runtime.turn_queue.TurnQueue.decide`: refused unless its turn still
        waits; the decision that completes the turn's calls puts it back for a worker),
        publishing on ``bus`` what ``session.decide`` publishes in the embedded app. A
        store that cannot be reached is an :class:`ApiError` 503; a refused decision
        raises its :class:`~runtime.errors.DecisionError`. ``known``: the session as
        the caller just read it (:meth:`~runtime.turn_queue.TurnQueue.decide`).
        ``max_chars``: the agent's ``max_tool_result_chars``, what the client gave is
        stored cut to."""
        try:
            outcome = await self.queue.decide(
                session_id, key, decision, tools, known=known, max_chars=max_chars
            )
        except StoreUnavailable as exc:  # (the store's text names its host: the log's)
            told = store_failed(exc, "frontend.decide_unavailable", session_id=session_id)
            raise ApiError(503, told, {"retry-after": "1"}) from None
        event = approval_decided(
            session_id,
            outcome.recorded.call,
            approved=bool(decision.approved),
            reason=decision.reason,
            max_chars=max_chars,
        )
        if event is not None:
            await bus.publish(event)
        return outcome

    async def stream(self, request: Request) -> Any:
        self.check_open()
        session_id = session_id_param(request.path_params["session_id"])
        after_seq = parse_after_seq(request)
        turn = await self._active(session_id, after_seq)
        if turn is None:
            return Response(status_code=204)
        announced: Iterable[str] = ()
        if turn.resumes:  # a continuation: the calls it answers were streamed before it
            # in the turn's own message: its rows alone, however long the session
            found = await read_turn(self.store, session_id, turn.message_id)
            if found is None:
                record = await self.store.load(session_id)
                found = 0, tuple(record.messages) if record is not None else ()
            announced = awaited_calls(found[1], turn.message_id)
        return self._response(request, turn, after_seq, announced=announced)

    async def _active(self, session_id: str, after_seq: int | None = None) -> Any:
        """The turn to show for the session: the one streaming (or, resumed after
        ``after_seq``, the latest one whose stream the client left before its end), else
        its running or oldest queued one."""
        turn_id = await turn_to_resume(self.relay, self.store, session_id, after_seq)
        if turn_id is not None:
            turn = await self.queue.get_status(turn_id)
            if turn is not None:
                return turn
        return await self.queue.active(session_id)

    async def stop(self, request: Request) -> Response:
        session_id = session_id_param(request.path_params["session_id"])
        message_id, named = await stop_target(request)
        if message_id is not None:  # the turn of that user message only, queued or running
            if "\x00" in message_id:
                return Response(status_code=204)  # (no key holds one: none of its turns)
            keys = [message_key(session_id, kind, message_id) for kind in STOPPABLE_KINDS]
            found = await self.queue.open_by_key(session_id, keys, message_id=message_id)
            if found is None:
                # Its POST may be on its way still (maybe to another front end): held
                # for the submit that names it so (``TurnQueue.hold_stop``; one naming a
                # turn too, while no turn has that id). A submit that committed
                # meanwhile did not see it: look again.
                await self.queue.hold_stop(session_id, message_id, keys, STOPPED, turn_id=named)
                found = await self.queue.open_by_key(session_id, keys, message_id=message_id)
            if found is None or (named is not None and found.turn_id != named):
                return Response(status_code=204)
            return await self._stop(found, steering=web_state(request).on_busy == STEER)
        if named is not None:  # that turn only, queued or running: never another
            turn = await self.queue.get_status(named)
            if turn is None:  # (its POST may be on its way still: kept for its submit,
                # an AG-UI run's ``runId``, whatever its message; then looked at again)
                await self.queue.hold_stop(session_id, None, [], STOPPED, turn_id=named)
                turn = await self.queue.get_status(named)
            if (
                turn is None
                or turn.session_id != session_id
                or turn.status
                not in (
                    QUEUED,
                    RUNNING,
                )
            ):
                return Response(status_code=204)
            return await self._stop(turn)
        turn = await self.queue.active(session_id)
        if turn is None:  # a turn that waits for input: its calls are denied, "stopped"
            record = self._recorder(request, session_id, [])
            waiting = await deny_pending(self.store, session_id, STOPPED_WAIT, record)
            if waiting is None:
                return Response(status_code=204)
            return json_response({"turn_id": waiting}, 202)
        return await self._stop(turn)

    async def _stop(self, turn: TurnStatus, *, steering: bool = False) -> Response:
        """Cancel ``turn``; its worker hears it on the relay at once. With ``steering``
        (a message named under ``--on-busy steer``), a queued one's too: the running
        turn may have taken it in already (its row is marked at the save that stores
        it), and its worker then stops that turn, whose rest is the message's answer."""
        queued = turn.status == QUEUED
        turn = await self.queue.request_cancel(turn.turn_id, STOPPED) or turn
        if turn.status == "running" or (steering and queued):
            await _unavailable_as_503(self.relay.request_cancel(turn.turn_id, STOPPED))
        return json_response({"turn_id": turn.turn_id}, 202)

    async def list_sessions(self, request: Request) -> Response:
        """A page of the sessions, as ``runtime.app.web.app.list_sessions`` answers it:
        the first page leads with the sessions whose first turn is queued or running and
        not saved yet (most recently submitted first)."""
        page = await session_page(request, self.store)
        infos = page.sessions
        busy = await self.queue.busy_sessions()
        unsaved: list[dict[str, Any]] = []
        if "cursor" not in request.query_params:
            unsaved = await self._unsaved({info.session_id for info in infos})
        return json_response(
            {
                "sessions": unsaved
                + [
                    {
                        "session_id": info.session_id,
                        "title": info.meta.get("title"),
                        "message_count": info.message_count,
                        "busy": info.session_id in busy,
                        "waiting": waiting_in_meta(info.meta),
                        "meta": public_meta(info.meta),
                    }
                    for info in infos
                ],
                "next_cursor": page.next_cursor,
            }
        )

    async def _unsaved(self, listed: set[str]) -> list[dict[str, Any]]:
        """The listing's entries of the sessions whose first turn is queued or running
        with nothing stored (one read of the queue), but those ``listed`` already."""
        return [
            {
                "session_id": session_id,
                "title": meta.get("title"),
                "message_count": 0,
                "busy": True,
                "waiting": 0,
                "meta": meta,
            }
            for session_id, meta in await self.queue.unsaved_sessions()
            if session_id not in listed
        ]

    async def get_session(self, request: Request) -> Response:
        """As the embedded app's (:func:`runtime.app.web.app.get_session`): with
        ``?view=ui``, without ``messages``; with ``?only=busy``, ``{session_id, busy}``
        from the turn queue and the session's version, no message read (a session whose
        first turn is queued or running is busy before it is stored)."""
        session_id = session_id_param(request.path_params["session_id"])
        ui_only = ui_view(request)
        if request.query_params.get("only") == "busy":
            busy = await self.queue.active(session_id) is not None
            if not busy and not await self.store.version(session_id):
                raise ApiError(404, f"no session {session_id!r}")
            return json_response({"session_id": session_id, "busy": busy})
        record = await self.store.load(session_id)
        if record is None:
            raise ApiError(404, f"no session {session_id!r}")
        return json_response(
            {
                "session_id": session_id,
                "title": record.meta.get("title"),
                "busy": await self.queue.active(session_id) is not None,
                "waiting": len(pending_calls(record.messages)),
                "meta": public_meta(record.meta),
                **({} if ui_only else {"messages": unstructure(list(record.messages))}),
                "ui_messages": ui_messages(
                    record.messages, for_session(web_state(request).signer, session_id)
                ),
            }
        )

    async def delete_session(self, request: Request) -> Response:
        """Delete the session: the store's delete cancels its open turns in the same
        transaction (:meth:`actors.stores.postgres.PostgresStore.delete`); the worker of
        a running one also hears it on the relay, at once (best effort: it also stops at
        the store's notice or its lease's next renewal). 204, known session or not."""
        session_id = session_id_param(request.path_params["session_id"])
        running = await self.queue.active(session_id)
        # its agent tools' sub-sessions that wait for its decisions: ended (before, they
        # waited for good, refusing decisions and new messages)
        await end_sub_waits(self.store, session_id, bus=web_state(request).host.bus)
        await self.store.delete(session_id)
        if running is not None and running.status == RUNNING:
            try:
                await self.relay.request_cancel(running.turn_id, SESSION_DELETED)
            except RelayUnavailable:
                pass  # deleted already; the store's cancel reaches the worker
        return Response(status_code=204)

    async def info(self, request: Request) -> Response:
        return json_response({**web_state(request).info(), "mode": "front-end"})


__all__ = ["FrontEnd", "QueuedTurnResponse", "idempotency_key"]


def _check_not_callers_wait(session_id: str, meta: Mapping[str, Any] | None) -> None:
    """A 409 for a message to a sub-session (an agent used as a tool, its meta naming the
    calling session) whose turn waits: that wait is its caller's to decide
    (``Awaiting.caller``). Queued, the message's turn was refused by the worker's
    session anyway, and its claim of the sub-session fenced the caller's next save of
    it out (``LeaseLost``): the caller's decision was lost."""
    caller = caller_of(meta)
    if caller is not None and meta is not None and meta.get(WAITING_META):
        raise ApiError(
            409,
            f"session {session_id!r} waits for a decision of session {caller!r}, which "
            "called its agent as a tool: decide it there (a new message here would end "
            "that wait)",
        )
