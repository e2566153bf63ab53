"""The ASGI app: the chat page, the AI SDK chat endpoint and the sessions API.

``create_app(host, agent)`` returns a Starlette app bound to a running
:class:`~runtime.app.host.Host` (it must run in the host's Trio world, e.g. under
Hypercorn's Trio worker, see :mod:`runtime.app.web.serve`):

``GET /``
    The chat page (one file, no build step); ``/favicon.svg`` and ``/favicon.ico`` its icon.
``POST /api/chat``
    The body ``useChat`` sends (``id`` = session id, ``messages`` with ``parts``,
    ``trigger``). Runs one turn on that session with the last user message (its text and
    ``file`` parts: images and files as ``data:`` or ``http(s):`` URLs, never fetched
    here) and streams it as an AI SDK UI message stream (:mod:`runtime.app.web.ui_stream`).
    Attachments over the agent's ``media_limits``, and a message with more parts than the
    host's ``input_limits``, get 413; unusable ones 400. The server
    keeps the history: only the last user message is read. ``trigger:
    "regenerate-message"`` replaces the session's last turn instead of adding one; so does
    the last user message posted again with other text (an edit; the same text replays
    the stored answer, an earlier message is a 409: :mod:`runtime.app.web.resend`). A
    client that closes the connection cancels the turn (saved, marked interrupted). A
    body whose last message is the assistant's answers a turn waiting for input
    (approvals, client tools' outputs: :mod:`runtime.app.web.answers`) and streams its
    continuation in the same message (docs/approval.md). A message for a session whose
    turn is running gets what the session's busy strategy says (``on_busy``,
    :mod:`runtime.busy`): 409 (``reject``), its own stream once the running turn is
    over (``enqueue``), the running turn cancelled and its own stream (``interrupt``),
    or 202 ``{"steered": true, "turnId", "messageId"}`` once the running turn took it
    at a step boundary, whose stream shows the answer (``steer``); from the client that
    shows the running turn (``useChat`` sending while it streams), the rest of the turn
    as this message's stream instead, the running stream ending there (docs/approval.md).
``GET /api/sessions``, ``GET /api/sessions/{id}``
    The stored sessions; one session's messages in the runtime's JSON form
    (``messages``) and as AI SDK ``UIMessage`` s (``ui_messages``).
``DELETE /api/sessions/{id}``
    Delete the session (:meth:`~runtime.app.host.Host.delete_session`: its running turn
    cancelled, its queued ones withdrawn, their streams ending with ``abort``, reason
    ``session deleted``): 204, also for a session that does not exist (idempotent).
``GET /api/info``
    The agent's name, provider and model.
``GET /api/chat/{id}/stream``, ``POST /api/chat/{id}/stop``
    Resume a running turn from the relay (``useChat({resume: true})``; 204 when none)
    and stop a turn wherever it runs: see :mod:`runtime.app.web.resume`.

Safe by default: only loopback ``Host`` names (403, :mod:`runtime.app.web.guard`), no
state-changing request or API read from another origin (403), no state-changing request
with a non-JSON body (415), no CORS
unless ``cors_origins`` is given, a request body limit (413) and time limit (408),
session ids validated (400), a client that stops reading a stream dropped after
``send_timeout``, and with ``token`` every ``/api/`` request needs
``Authorization: Bearer <token>`` (401).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime import output as o
from runtime.agent import Agent
from runtime.app.host import Host
from runtime.app.session import FINAL_WAIT
from runtime.app.unsaved import ENDS, forget_unsaved, told_end
from runtime.app.web import (
    BODY_TIMEOUT,
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_BODY_IN_FLIGHT,
    SEND_TIMEOUT,
)
from runtime.app.web.answers import (
    is_continuation,
    record_answers,
    waiting_in_meta,
)
from runtime.app.web.chat_input import (
    CHILD_PARSES,
    BodyBudget,
    check_media,
    read_chat_request,
    title_of,
)
from runtime.app.web.frontend import FrontEnd
from runtime.app.web.guard import RequestGuard, cors_origin
from runtime.app.web.health import HOST_FREE, Readiness, health_routes
from runtime.app.web.http import (
    ApiError,
    busy_hint,
    busy_message,
    closing_response,
    error_response,
    has_bearer,
    json_response,
    session_page,
    ui_view,
)
from runtime.app.web.http import session_id_param as _session_id
from runtime.app.web.protocols import MCPLimits, mount_protocols
from runtime.app.web.resend import (
    check_answering_elsewhere,
    classify_resend,
    client_message_id,
    client_turn_id,
    held_answer_id,
    never_answered,
    regenerated_id,
    replay_response,
    resend_history,
    unrelayed_turn_id,
)
from runtime.app.web.resume import resume_stream, stop_turn
from runtime.app.web.signing import ApprovalSigner, for_session
from runtime.app.web.ui_stream import DONE, HEADERS, UIStreamEncoder, handed_over, ui_messages
from runtime.app.web.writer import BodyWriter, SendDeadline
from runtime.approval import Recorded, pending_calls
from runtime.busy import REJECT, OnBusy, check_on_busy
from runtime.errors import (
    SESSION_DELETED,
    CallerWaits,
    HostClosed,
    InputHeld,
    InvalidHistory,
    NothingToResume,
    RegenerateOutdated,
    RelayUnavailable,
    SessionBusy,
    TurnWithdrawn,
)
from runtime.liveness import public_meta
from runtime.messages import UserContent
from runtime.serde import unstructure
from runtime.turn_queue import TurnQueue

KEEPALIVE = 15.0
"""Seconds of silence after which a stream sends an SSE comment, so proxies keep it open."""

NOT_READING = "client not reading"
"""The abort reason of a turn whose client stopped taking its stream."""

STATIC = Path(__file__).with_name("static")

ICONS = {"favicon.ico": "image/x-icon", "favicon.svg": "image/svg+xml"}
"""The page's icon (``<link rel="icon">``) and the one browsers ask ``/favicon.ico`` for."""

AgentSource = Agent | Callable[[str], Agent]
"""An agent for every session, or a factory called with the session id of a new one."""


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.message, exc.headers)


async def _host_closed(request: Request, exc: Exception) -> Response:
    """A request reaching a host closed already (``serve`` stopping: opening its
    session, or reading its store, is refused): the closing host's 503 with
    ``Retry-After``, not a 500 (another protocol answers in its own shape first)."""
    return closing_response(exc)


# -- middleware ---------------------------------------------------------------------------


class BearerAuth:
    """401 for an ``/api/`` request without ``Authorization: Bearer <token>``."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"].startswith("/api/")
            and scope["method"] != "OPTIONS"  # CORS preflight carries no credentials
            and not self._authorized(scope)
        ):
            response = error_response(
                401, "missing or wrong bearer token", {"www-authenticate": "Bearer"}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        return has_bearer(scope, self.token)


class SecurityHeaders:
    """``nosniff`` and a no-referrer policy on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"referrer-policy", b"no-referrer"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


class CloseUnread:
    """A response that starts before its request's body was read to the end (a refusal,
    403, 413, 415, answered without reading the body; a stop that ignores one): the rest
    of the body is read and dropped first when it is small and at hand (:data:`DRAIN_LIMIT`
    bytes in :data:`DRAIN_PIECES` pieces within :data:`DRAIN_TIME`); otherwise the
    response says ``Connection: close``.

    Unread, the server cannot take the connection's next request until the rest of the
    body has gone by, and Hypercorn closed the connection without saying so: a client
    pooling connections sent its next request on it and got "server disconnected without
    sending a response". ``Connection: close`` alone lost the answer itself to a
    *pipelining* client, half the time: Hypercorn (0.18, ``protocol/h11.py``) goes on
    reading while an answer is written, and h11, told the connection closes, takes the
    next request already on the wire for a protocol error; Hypercorn then closes the
    socket under the answer being written (and logs a ``BusyResourceError`` traceback).
    With the body read, h11 holds the next request until the answer is out: an answer
    that needs no ``Connection: close`` keeps the connection, which then serves that
    request; one that says it itself (a smuggled body's 400) is sent after one
    checkpoint, which lets Hypercorn's reader, handed the body's end, stop at the next
    request first. A 408 is sent as it is: its body is the one that did not come."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # HTTP/2 forbids a Connection header (RFC 9113 8.2.2); its streams end on their own.
        if scope["type"] != "http" or scope.get("http_version") == "2" or not _has_body(scope):
            await self.app(scope, receive, send)
            return
        read = False
        taken = 0

        async def receive_noting_the_end() -> Any:
            nonlocal read, taken
            message = await receive()
            taken += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                read = True
            return message

        async def drained() -> bool:
            """Whether the rest of the body was read (and dropped) within the bounds."""
            length = _content_length(scope)
            if length is not None and length - taken > DRAIN_LIMIT:
                return False
            start = taken
            with trio.move_on_after(DRAIN_TIME):
                for _ in range(DRAIN_PIECES):
                    message = await receive_noting_the_end()
                    if message["type"] != "http.request" or taken - start > DRAIN_LIMIT:
                        return False
                    if read:
                        return True
            return False

        async def send_closing(message: Any) -> None:
            if message["type"] == "http.response.start" and not read:
                headers = list(message.get("headers", []))
                closes = _says_close(headers)
                if message.get("status") == 408:
                    pass  # the body did not come in time: waiting more for it is no use
                elif await drained():
                    if closes:
                        await trio.lowlevel.checkpoint()
                elif not closes:
                    message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive_noting_the_end, send_closing)


DRAIN_LIMIT = 64 << 10
"""Bytes of an unread request body :class:`CloseUnread` reads and drops before an early
answer; a larger body's answer closes the connection instead."""
DRAIN_PIECES = 64
"""Pieces (chunks, network reads) of it at most: each costs the server ~30 us however
small (see :data:`runtime.app.web.chat_input.MANY_PIECES`)."""
DRAIN_TIME = 1.0
"""Seconds :class:`CloseUnread` waits for the rest of an unread body."""


def _says_close(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        name.lower() == b"connection" and value.lower() == b"close" for name, value in headers
    )


def _content_length(scope: Scope) -> int | None:
    """The body's length as the request announces it; ``None`` when unknown (chunked: h11
    frames by ``Transfer-Encoding`` whatever ``Content-Length`` says beside it)."""
    names = [name for name, _ in scope["headers"]]
    if b"transfer-encoding" in names:
        return None
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b"0 ")):
            return True
    return False


# -- the chat stream ----------------------------------------------------------------------


class TurnResponse:
    """Streams one turn as a UI message stream; the client leaving cancels the turn.

    The body goes out through a :class:`~runtime.app.web.writer.BodyWriter` running in
    ``background`` (when given): a client that takes no data for ``send_timeout`` seconds
    has its turn cancelled (``abort``: "client not reading"), saved, marked interrupted,
    and its connection closed. What waits for it meanwhile is bounded: the writer's
    queue, then the turn's pipeline, which stops the provider (backpressure).
    """

    def __init__(
        self,
        session: Any,
        text: UserContent,
        *,
        regenerate: bool = False,
        user_message_id: str | None = None,
        regenerates: str | None = None,
        resume: bool = False,
        decided: Recorded | None = None,
        announced: Iterable[str] = (),
        keepalive: float = KEEPALIVE,
        send_timeout: float | None = SEND_TIMEOUT,
        background: trio.Nursery | None = None,
        encoder: Callable[[], Any] | None = None,
        headers: Mapping[str, str] = HEADERS,
        busy: Callable[..., Response] | None = None,
        closing: Callable[[Exception], Response] | None = None,
        on_busy: OnBusy | None = None,
        turn_id: str | None = None,
        tools: tuple[Any, ...] = (),
        instructions: str | None = None,
        max_queued: int | None = None,
        follow: bool = False,
    ) -> None:
        self.session = session
        self.follow = follow
        """Steered into the running turn (``steer``), stream the rest of that turn as the
        answer to this message (the client shows the turn's answer so far, and ends its
        showing of it where this message joined: :meth:`TurnStream.hands_over
        <runtime.app.session.TurnStream.hands_over>`), instead of answering 202."""
        self.max_queued = max_queued
        """How many messages may wait for the session's running turn (``None``: no cap):
        one more is a 429 (:data:`MAX_QUEUED_PER_SESSION`)."""
        self.text = text
        self.regenerate = regenerate
        self.user_message_id = user_message_id
        """The client's id of the user message, stored as its id (:mod:`runtime.app.web.resend`)."""
        self.regenerates = regenerates
        """A regenerate's ``messageId``: the answer it replaces, by which a stop names it."""
        self.resume = resume
        """Run the continuation of the turn that waited for input (docs/approval.md)."""
        self.decided = decided
        """With ``resume``: the decision this request recorded that completed the turn;
        the continuation starts from what it stored (``session.resume(decided=...)``)."""
        self.announced = announced
        """Calls the client knows: their input is not streamed again."""
        self.keepalive = keepalive
        self.send_timeout = send_timeout
        self.background = background
        self.disconnected = False
        # Another protocol's stream (runtime.app.web.openai_compat) gives its own encoder
        # (``events(chunk)`` -> bytes), headers and answer to a busy session; by default
        # the AI SDK's, told which calls the client already knows.
        self.encoder = encoder
        self.headers = headers
        self.busy = busy or _busy
        self.closing = closing or closing_response
        """The answer to a turn refused as the host closes (:class:`HostClosed`, ``serve``
        stopping), in the request's protocol: 503 with ``Retry-After``, nothing stored."""
        self.on_busy = on_busy
        """This request's busy strategy, if not the session's (:mod:`runtime.busy`)."""
        # What another protocol's turn carries beyond the AI SDK's (runtime.app.web.agui):
        # the client's run id as the turn's, and tools and instructions for this turn only.
        self.turn_id = turn_id
        self.tools = tools
        self.instructions = instructions

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = self.session
        try:
            await session.reopen()  # the host may have evicted it since the request looked it up
        except HostClosed as exc:
            await self.closing(exc)(scope, receive, send)
            return
        strategy = REJECT if self.resume else self.on_busy or session.on_busy
        if session.busy and strategy == REJECT:
            await self.busy(session)(scope, receive, send)
            return
        cap = self.max_queued
        if cap is not None and not self.resume and session.waiting_inputs >= cap:
            await error_response(
                429,
                f"session {session.id!r} has {session.waiting_inputs} messages waiting for "
                f"its running turn, its cap (--max-queued-per-session {cap}): nothing was "
                f"queued; send it again later. {busy_hint(session.id)}",
                {"retry-after": "5"},
            )(scope, receive, send)
            return
        if "title" not in session.meta and not self.resume:
            session.set_title(title_of(self.text))
        started = False
        async with trio.open_nursery() as local:
            # In the background nursery the writer outlives this task, so this task can
            # return (and Hypercorn close the connection) while a write is stuck; the local
            # one, the fallback, is left only after the turn is over and saved.
            try:
                turn = (
                    session.resume(
                        tools=self.tools, instructions=self.instructions, decided=self.decided
                    )
                    if self.resume
                    else session.stream(
                        self.text,
                        regenerate=self.regenerate,
                        user_message_id=self.user_message_id,
                        regenerates=self.regenerates,
                        on_busy=self.on_busy,
                        turn_id=self.turn_id,
                        tools=self.tools,
                        instructions=self.instructions,
                        follow=self.follow,
                    )
                )
                waits = session.busy or session.queued > 0  # in the queue, or steered
                async with _unless_left(turn, receive, self, watch=waits) as out:
                    if out is None:  # the client left while its turn waited: it never ran
                        return
                    started = True
                    if self.disconnected:  # ... just as the turn started
                        out.cancel("client disconnected")
                    if out.steered and not out.follow:  # the running turn's stream shows the rest
                        await _steered(out)(scope, receive, send)
                        return
                    await self._stream(out, receive, send, self.background or local)
                await forget_unsaved(session, out.result)
            except (InputHeld, RegenerateOutdated) as exc:  # never a second copy
                busy = (
                    error_response(
                        409,
                        f"{exc} {busy_hint(session.id)}"
                        if isinstance(exc, InputHeld)
                        else str(exc),
                    )
                    if self.busy is _busy
                    else self.busy(session)  # another protocol's 409, in its own shape
                )
                await busy(scope, receive, send)
            except TurnWithdrawn as exc:  # stopped while it waited: never ran, nothing stored
                await self._withdrawn(exc.reason)(scope, receive, send)
            except CallerWaits as exc:  # not "already running a turn": the caller decides
                if started:
                    raise
                await self.busy(session, str(exc))(scope, receive, send)
            except HostClosed as exc:  # the turn entered (or waited) as the host closed
                if started:
                    raise
                await self.closing(exc)(scope, receive, send)
            except SessionBusy:
                if started:
                    raise
                await self.busy(session)(scope, receive, send)
            except NothingToResume as exc:
                await error_response(409, str(exc))(scope, receive, send)

    def _withdrawn(self, reason: str) -> Response:
        """The stream of a message taken out of the queue before its turn started: the
        turn's ``abort`` in the request's protocol (the AI SDK's ``abort`` and
        ``[DONE]``; OpenAI's error event; AG-UI's run ended as cancelled), as a turn
        stopped while it ran ends."""
        encoder = self.encoder() if self.encoder is not None else UIStreamEncoder(self.announced)
        data = encoder.events(o.Abort(reason=reason))
        final = getattr(encoder, "final", None)
        data += final(NOT_STARTED) if final is not None else DONE
        return Response(data, headers=self.headers)

    async def _stream(
        self, out: Any, receive: Receive, send: Send, background: trio.Nursery
    ) -> None:
        writer = BodyWriter.ok(send, self.headers, timeout=self.send_timeout)
        background.start_soon(writer.run)
        try:
            await self._pump(out, receive, writer)
        except BaseException:
            writer.abandon()
            raise
        if writer.stalled or self.disconnected or not await writer.close():
            writer.abandon()

    async def _pump(self, out: Any, receive: Receive, writer: BodyWriter) -> None:
        """The turn's chunks to the writer, with keep-alives; cancels the turn when the
        client leaves or stops reading."""
        last_write = trio.current_time()

        async def write(data: bytes) -> None:
            nonlocal last_write
            if self.disconnected or writer.stalled:
                return
            if not await writer.write(data):
                if cut():  # the client was told the stream is over: the turn goes on
                    self.disconnected = True
                    return
                out.cancel(NOT_READING if writer.stalled else "client disconnected")
                nursery.cancel_scope.cancel()  # leave: the stream's exit waits for the save
            last_write = trio.current_time()

        handed = False
        """Whether the stream was handed over (:meth:`TurnStream.hands_over
        <runtime.app.session.TurnStream.hands_over>`): ended for this client, the turn
        goes on, and the stream of the message steered in shows the rest."""

        def cut() -> bool:
            """Whether the encoder ended the client's stream early (a chat.completions
            stream after a ``reset-step``), or it was handed over: the turn is no longer
            the client's to cancel."""
            return handed or bool(getattr(encoder, "cut", False))

        async def watch_disconnect() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.disconnected = True
                    if not cut():
                        out.cancel("client disconnected")
                    return

        async def keep_alive() -> None:
            while True:
                await trio.sleep_until(last_write + self.keepalive)
                if trio.current_time() >= last_write + self.keepalive:
                    await write(b": keep-alive\n\n")

        encoder = self.encoder() if self.encoder is not None else UIStreamEncoder(self.announced)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_disconnect)
            if self.keepalive:
                nursery.start_soon(keep_alive)
            end = None
            """The turn's last chunk (``finish``, ``error``, ``abort``), held until its
            result tells whether it was saved (:mod:`runtime.app.unsaved`)."""
            async for chunk in out:
                if handed:
                    continue  # (read on: the turn feeds the stream that took over)
                if type(chunk) in ENDS:
                    end = chunk
                    continue
                data = encoder.events(chunk)
                if (
                    type(chunk) is o.Steered
                    and not chunk.answered  # (an earlier turn answered it: this goes on)
                    and out.hands_over(chunk.message_id)
                ):
                    await write(data + handed_over(chunk))
                    handed = True
                    if not (self.disconnected or writer.stalled):
                        await writer.close()  # the client's request is over
                    continue
                if data:
                    await write(data)
            if handed:
                nursery.cancel_scope.cancel()
                return
            # [DONE] once the turn is saved and the session idle: a client may reload the
            # session or send its next message as soon as it sees it. An encoder with a
            # ``final(out)`` ends its protocol's stream its own way (AG-UI's RUN_FINISHED).
            with trio.move_on_after(FINAL_WAIT):
                await out.done.wait()
            if end is not None:
                await write(encoder.events(told_end(end, out.result)))
            final = getattr(encoder, "final", None)
            ending = final(out) if final is not None else DONE
            if ending:
                await write(ending)
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def _unless_left(
    turn: Any, receive: Receive, response: TurnResponse, *, watch: bool
) -> AsyncIterator[Any]:
    """``async with turn``, giving ``None`` instead when the client leaves (``watch``)
    while the turn waits to start: behind the running turn (``enqueue``, ``interrupt``)
    or to be taken into it (``steer``). A client that posted and hung up left its turn
    queued before, and it ran (and cost its tokens) with no one to read it; now it
    leaves the queue. A disconnect seen just as the turn started sets
    ``response.disconnected`` (the caller cancels the turn)."""
    if not watch:
        async with turn as out:
            yield out
        return
    async with AsyncExitStack() as stack:
        out = refused = None
        with trio.CancelScope() as waiting:
            async with trio.open_nursery() as watcher:

                async def leave_on_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    response.disconnected = True
                    waiting.cancel()

                watcher.start_soon(leave_on_disconnect)
                try:
                    out = await stack.enter_async_context(turn)
                except Exception as exc:  # raised bare, not in the nursery's group
                    refused = exc
                watcher.cancel_scope.cancel()
        if refused is not None:
            raise refused
        yield out


NOT_STARTED = SimpleNamespace(result=None, session=SimpleNamespace(messages=()))
"""What an encoder's ``final(out)`` reads of a turn that never started: no result, no
messages."""


MAX_QUEUED_PER_SESSION = 100
"""The messages that may wait for one session's running turn in the embedded app, by
default (``serve --max-queued-per-session``; a front end of workers has the queue's)."""


def _busy(session: Any, why: str | None = None) -> Response:
    """409: the turn that runs, and how to wait for it or stop it (``reject``); ``why``:
    another reason the session takes no message (:class:`~runtime.errors.CallerWaits`)."""
    if why is not None:
        return json_response({"error": why, "sessionId": session.id}, 409)
    running = session.current
    turn_id = running.turn_id if running is not None else None
    return json_response(
        {"error": busy_message(session.id, turn_id), "sessionId": session.id, "turnId": turn_id},
        409,
    )


def _steered(out: Any) -> Response:
    """202: the message joined the running turn (``steer``), stored as ``messageId``
    before that turn's next model call; the turn's own stream carries the answer.
    ``answered``: the turn found it stored and answered by an earlier turn (a retry of
    it; :attr:`~runtime.output.Steered.answered`), as a worker front end's 202 says."""
    return json_response(
        {
            "steered": True,
            "turnId": out.turn_id,
            "messageId": out.user_message_id,
            "answered": out.steer_answered,
        },
        202,
    )


# -- the app ------------------------------------------------------------------------------


class WebState:
    """What the endpoints share: the host, the agent and the limits."""

    def __init__(
        self,
        host: Host,
        agent: AgentSource,
        *,
        max_body: int,
        keepalive: float,
        body_timeout: float | None = BODY_TIMEOUT,
        send_timeout: float | None = SEND_TIMEOUT,
        on_busy: OnBusy | None = None,
        max_queued_per_session: int | None = None,
        max_body_in_flight: int = DEFAULT_MAX_BODY_IN_FLIGHT,
    ) -> None:
        self.host = host
        self.agent = agent
        self.on_busy = on_busy
        """The busy strategy of the sessions the app opens (``None``: their agent's)."""
        self.max_queued_per_session = max_queued_per_session
        """How many messages may wait for a session's running turn (``None``: no cap)."""
        self.max_body = max_body
        self.body_budget = BodyBudget(max_body_in_flight)
        """The request-body bytes all requests hold at once, and their bound."""
        self.keepalive = keepalive
        self.body_timeout = body_timeout
        self.send_timeout = send_timeout
        self.relay: Any = None
        """The live-output relay (:mod:`runtime.relay`) turns are resumed from, if any."""
        self.cancel_hook: Callable[[str], Any] | None = None
        """``await cancel_hook(turn_id)`` cancels a turn this process does not run (a
        worker deployment's ``request_cancel``)."""
        self.front: Any = None
        """The :class:`~runtime.app.web.frontend.FrontEnd` of a worker deployment, if any."""
        self.signer: ApprovalSigner | None = None
        """Signs the AI SDK's approval requests and checks the signatures sent back
        (``create_app(approval_secret=)``; :mod:`runtime.app.web.signing`)."""
        self.mcp_limits = MCPLimits()
        """The bounds of ``/mcp``'s sessions (:class:`~runtime.app.web.protocols.MCPLimits`)."""
        self.background: trio.Nursery | None = None
        """Where response writers run, outliving their request (opened by the app's
        lifespan; without one, each request keeps its own)."""
        self.readiness = Readiness(host.store)
        """What ``GET /readyz`` reports (:mod:`runtime.app.web.health`); ``serve`` has it
        drain at the first signal."""
        self._open_lock = trio.Lock()
        self.parse_limiter = trio.CapacityLimiter(CHILD_PARSES)
        """Bounds the child processes parsing large bodies (:mod:`runtime.app.web.chat_input`)."""

    async def session(self, session_id: str, *, history: Any = None) -> Any:
        """The open session ``session_id``, opened (resumed from the store) if needed;
        one the host evicted is loaded back into its ``Session`` object. ``history``
        starts a session that is neither open nor stored (AG-UI's first run on a thread
        the client already holds messages of); a stored one raises ``InvalidHistory``."""
        session = self.host.sessions.get(session_id)
        if session is not None and history is None:
            self.host.touch(session)
            return session
        async with self._open_lock:
            session = self.host.get_session(session_id)
            if session is None:
                agent = self.agent_for(session_id)
                session = await self.host.open_session(
                    agent, session_id=session_id, history=history, on_busy=self.on_busy
                )
            elif history is not None:
                raise InvalidHistory(f"session {session_id!r} is open already")
            else:
                await session.reopen()
        return session

    def agent_for(self, session_id: str) -> Agent:
        """The agent that runs ``session_id``'s turns."""
        return self.agent if isinstance(self.agent, Agent) else self.agent(session_id)

    def info(self) -> dict[str, Any]:
        agent = self.agent if isinstance(self.agent, Agent) else None
        provider = getattr(agent, "provider", None)
        named = agent.model.partition(":") if agent is not None and agent.model else None
        provider_name: str | None
        model: str | None
        if agent is None:  # a function of the session id: its agents may differ, and
            provider_name = model = None  # the page said "scripted · offline" of them all
        elif provider is None and named is not None:  # Agent(model="provider:model")
            provider_name, model = named[0], named[2]
        else:
            provider_name = getattr(provider, "provider_name", None) if provider else "scripted"
            model = getattr(provider, "model", None) if provider else "scripted"
        return {
            "agent": agent.name if agent else None,
            "provider": provider_name,
            "model": model,
            "tools": [t.name for t in agent.tools] if agent else None,
        }


def _state(request: Request) -> WebState:
    return request.app.state.axon


async def chat(request: Request) -> Any:
    state = _state(request)
    payload, session_id, text, regenerate = await read_chat_request(request, answers=True)
    session = await state.session(session_id)
    signer = for_session(state.signer, session.id)
    if is_continuation(payload):
        announced, recorded = await record_answers(session, payload, signer)
        if recorded is not None and not recorded.complete:  # whoever decides the last resumes
            return json_response({"recorded": True, "waiting": recorded.left}, 202)
        return TurnResponse(
            session,
            "",
            resume=True,
            decided=recorded,
            announced=announced,
            encoder=None if signer is None else partial(UIStreamEncoder, announced, signer),
            keepalive=state.keepalive,
            send_timeout=state.send_timeout,
            background=state.background,
        )
    check_media(text, session.agent)
    client_id = client_message_id(payload)
    history, stored_meta = (
        (session.messages, {})
        if session.busy or client_id is None
        else await resend_history(session, state.host.store)
    )
    resend = (
        "new" if session.busy else classify_resend(history, client_id, text, regenerate=regenerate)
    )
    if resend == "retry":
        check_answering_elsewhere(
            stored_meta, client_id, state.host.marker_id
        )  # (a 409: answered elsewhere now)
        if not never_answered(history, stored_meta):
            return replay_response(history, signer)
        resend = "edit"  # (a killed claim's empty answer: run it again in its place)
    running = session.current
    held = held_answer_id(payload)
    return TurnResponse(
        session,
        text,
        # steered by the client that shows the running turn: the rest of it is its answer
        follow=held is not None and running is not None and held in running.answer_ids,
        regenerate=regenerate or resend == "edit",
        user_message_id=client_id,
        regenerates=regenerated_id(payload) if regenerate else None,
        # the client's ``turnId`` (a stop may name it before this POST came)
        turn_id=await unrelayed_turn_id(state.relay, client_turn_id(payload)),
        max_queued=state.max_queued_per_session,
        encoder=None if signer is None else partial(UIStreamEncoder, (), signer),
        keepalive=state.keepalive,
        send_timeout=state.send_timeout,
        background=state.background,
    )


async def list_sessions(request: Request) -> Response:
    """A page of the stored sessions, most recently updated first (``?limit=N``, default
    :data:`~runtime.app.web.http.PAGE_SIZE`; ``?cursor=`` the ``next_cursor`` of the page
    before, ``null`` on the last page); a session whose first turn is running (not saved
    yet) comes first, on the first page. ``busy``: a turn of it runs here; ``waiting``:
    how many calls its last turn waits for (an approval, a client tool's output), as its
    stored meta says (docs/approval.md)."""
    state = _state(request)
    page = await session_page(request, state.host.store)
    infos = page.sessions
    open_sessions = state.host.sessions
    stored = {info.session_id for info in infos}
    unsaved = []
    if "cursor" not in request.query_params:  # the first page: the running first turns
        for sid, session in list(open_sessions.items()):
            # Stored but not on this page (an older session a turn runs in again): its
            # place is further down the listing, not here too.
            if session.busy and sid not in stored and not await state.host.store.version(sid):
                unsaved.append(
                    {
                        "session_id": sid,
                        "title": session.meta.get("title"),
                        "message_count": len(session.messages),
                        "busy": True,
                        "waiting": 0,
                        "meta": dict(session.meta),
                    }
                )
    return json_response(
        {
            "sessions": unsaved
            + [
                {
                    "session_id": info.session_id,
                    "title": info.meta.get("title"),
                    "message_count": info.message_count,
                    "busy": bool(
                        info.session_id in open_sessions and open_sessions[info.session_id].busy
                    ),
                    "waiting": waiting_in_meta(info.meta),
                    "meta": public_meta(info.meta),
                }
                for info in infos
            ],
            "next_cursor": page.next_cursor,
        }
    )


async def get_session(request: Request) -> Response:
    """The stored session whole (``{session_id, title, busy, waiting, meta, messages,
    ui_messages}``; ``?view=ui``: without ``messages``, what the page asks, about half the
    bytes), or with ``?only=busy`` whether a turn of it runs here
    (``{session_id, busy}``): what the page asks every second while a turn it has no
    stream of runs, which loaded and sent the whole history each time (a 5,000-message
    session ~1.5 MB a second). That reads no message: a session open here (a running
    first turn not saved yet too) answers from memory, any other is looked up by its
    version; 404 for neither."""
    state = _state(request)
    state.host.check_open()  # a closed host's store is closed: 503, not a store error
    session_id = _session_id(request.path_params["session_id"])
    ui_only = ui_view(request)
    if request.query_params.get("only") == "busy":
        open_now = state.host.sessions.get(session_id)
        if open_now is None and not await state.host.store.version(session_id):
            raise ApiError(404, f"no session {session_id!r}")
        return json_response(
            {"session_id": session_id, "busy": bool(open_now is not None and open_now.busy)}
        )
    record = await state.host.load_settled(session_id)  # (a killed turn: interrupted)
    if record is None:
        raise ApiError(404, f"no session {session_id!r}")
    open_session = state.host.sessions.get(session_id)
    if open_session is not None:
        state.host.touch(open_session)  # a read is a use: it keeps the session in memory
    return json_response(
        {
            "session_id": session_id,
            "title": record.meta.get("title"),
            "busy": bool(open_session is not None and open_session.busy),
            "waiting": len(pending_calls(record.messages)),
            "meta": public_meta(record.meta),
            **({} if ui_only else {"messages": unstructure(list(record.messages))}),
            "ui_messages": ui_messages(record.messages, for_session(state.signer, session_id)),
        }
    )


async def delete_session(request: Request) -> Response:
    """Delete the session for good (:meth:`~runtime.app.host.Host.delete_session`): 204,
    also when there is no such session, as ``DELETE`` is idempotent. Guarded as every
    state-changing request is (:mod:`runtime.app.web.guard`)."""
    state = _state(request)
    session_id = _session_id(request.path_params["session_id"])
    await _tell_the_host_that_runs_it(state, session_id)
    await state.host.delete_session(session_id)
    return Response(status_code=204)


async def _tell_the_host_that_runs_it(state: WebState, session_id: str) -> None:
    """With a relay, cancel the session's turn another embedded host runs (``session
    deleted``), before the store's delete: that host refuses the turn's saves from then
    on (``Host.cancel_turn``), so a save of it can neither bring the session back nor,
    once a new message re-created it under the same id, append the deleted
    conversation's turn to the new one. Best effort: a relay that does not answer leaves
    that turn to find the session gone at its next save."""
    relay = state.relay
    session = state.host.sessions.get(session_id)
    if relay is None or not hasattr(relay, "request_cancel"):
        return
    if session is not None and session.current is not None:
        return  # this host runs it: delete_session cancels it
    try:
        turn_id = await relay.active_turn(session_id)
        if turn_id is not None:
            await relay.request_cancel(turn_id, SESSION_DELETED)
    except RelayUnavailable:
        pass


async def info(request: Request) -> Response:
    return json_response(_state(request).info())


CSP = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)


def _page_routes() -> list[Route]:
    """``GET /`` (the chat page) and its icons, read once."""
    page = (STATIC / "index.html").read_bytes()
    icons = {name: (STATIC / name).read_bytes() for name in ICONS}

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"content-security-policy": CSP})

    async def icon(request: Request) -> Response:
        name = request.url.path.lstrip("/")
        return Response(
            icons[name],
            media_type=ICONS[name],
            headers={
                "cache-control": "max-age=86400",
                "content-security-policy": "default-src 'none'",
            },
        )

    return [
        Route("/", index, methods=["GET"]),
        *(Route("/" + name, icon, methods=["GET"]) for name in ICONS),
    ]


def _api_routes(front: FrontEnd | None) -> list[Route]:
    """The ``/api/`` endpoints: this process's, or those of a worker deployment's front
    end, which replaces them by name."""
    handlers: dict[str, Callable[[Request], Any]] = {
        "chat": chat,
        "stream": resume_stream,
        "stop": stop_turn,
        "sessions": list_sessions,
        "session": get_session,
        "delete": delete_session,
        "info": info,
    }
    if front is not None:
        handlers.update(front.routes())
    return [
        Route("/api/info", handlers["info"], methods=["GET"]),
        Route("/api/chat", handlers["chat"], methods=["POST"]),
        Route("/api/chat/{session_id}/stream", handlers["stream"], methods=["GET"]),
        Route("/api/chat/{session_id}/stop", handlers["stop"], methods=["POST"]),
        Route("/api/sessions", handlers["sessions"], methods=["GET"]),
        Route("/api/sessions/{session_id}", handlers["session"], methods=["GET"]),
        Route("/api/sessions/{session_id}", handlers["delete"], methods=["DELETE"]),
    ]


def _middleware(
    state: WebState,
    token: str | None,
    cors_origins: Sequence[str] | None,
    allowed_hosts: Sequence[str] | None,
) -> list[Middleware]:
    """A send deadline for answers that are not streams, ``Connection: close`` after an
    unread body, security headers, CORS (only for ``cors_origins``), the request guard,
    and the bearer token check when there is a token; outermost first."""
    middleware = [
        Middleware(SendDeadline, state=state),
        Middleware(CloseUnread),
        Middleware(SecurityHeaders),
    ]
    if cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=list(cors_origins),
                allow_methods=["GET", "POST", "DELETE"],
                allow_headers=["authorization", "content-type"],
                expose_headers=["x-vercel-ai-ui-message-stream"],
                max_age=600,
            )
        )
    middleware.append(
        Middleware(
            RequestGuard,
            allowed_hosts=allowed_hosts or (),
            cors_origins=cors_origins or (),
            host_free=HOST_FREE,
        )
    )
    if token:
        middleware.append(Middleware(BearerAuth, token=token))
    return middleware


def _lifespan(state: WebState) -> Callable[[Starlette], Any]:
    """The app's lifespan: the nursery response writers run in (``state.background``)."""

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with trio.open_nursery() as nursery:
            state.background = nursery
            try:
                yield
            finally:
                state.background = None
                nursery.cancel_scope.cancel()

    return lifespan


def create_app(
    host: Host,
    agent: AgentSource,
    *,
    token: str | None = None,
    cors_origins: Sequence[str] | None = None,
    max_body: int = DEFAULT_MAX_BODY,
    keepalive: float = KEEPALIVE,
    allowed_hosts: Sequence[str] | None = None,
    body_timeout: float | None = BODY_TIMEOUT,
    send_timeout: float | None = SEND_TIMEOUT,
    relay: Any = None,
    cancel_hook: Callable[[str], Any] | None = None,
    queue: TurnQueue | None = None,
    protocols: Collection[str] = ("ai-sdk",),
    on_busy: OnBusy | None = None,
    max_queued_per_session: int | None = MAX_QUEUED_PER_SESSION,
    max_body_in_flight: int = DEFAULT_MAX_BODY_IN_FLIGHT,
    mcp_limits: MCPLimits | None = None,
    approval_secret: str | bytes | None = None,
    require_approval_signature: bool = False,
) -> Starlette:
    """The web app for ``host``: every session runs ``agent`` (or ``agent(session_id)``).

    ``token`` requires ``Authorization: Bearer <token>`` on ``/api/``; ``cors_origins``
    allows those origins to call the API from a browser (none by default; an entry that
    is not an origin, ``*`` among them, is a ``ValueError``:
    :func:`~runtime.app.web.guard.cors_origin`); ``max_body``
    caps request bodies (413 above it), ``max_body_in_flight`` the bytes of them read at
    once, all requests together (503 with ``Retry-After`` and the connection closed for
    one that would pass it: :class:`~runtime.app.web.chat_input.BodyBudget`);
    ``keepalive`` is the SSE comment interval (0: off).
    ``allowed_hosts`` adds ``Host`` names to the loopback ones the app answers (see
    :class:`~runtime.app.web.guard.HostPolicy`); ``body_timeout`` bounds the time a request
    body takes to arrive (408), ``send_timeout`` the time a stream waits for a client that
    takes no data before dropping it (``None``: no limit). ``relay`` (a
    :class:`runtime.relay.Relay`) serves ``GET /api/chat/{id}/stream`` for turns running
    anywhere; ``cancel_hook(turn_id)`` stops a turn running in another process.

    With ``queue`` (a :class:`runtime.turn_queue.TurnQueue`) and ``relay`` the app is a
    stateless front end of a worker deployment (:mod:`runtime.app.web.frontend`): it queues
    turns for the workers and streams them from the relay, and ``host`` only lends it
    its store (it opens no session and runs no turn).

    ``protocols`` names the endpoints mounted (:mod:`runtime.app.web.protocols`): ``ai-sdk``
    the page and ``/api/``, ``openai`` ``/v1/`` (:mod:`runtime.app.web.openai_compat`),
    ``ag-ui`` ``POST /ag-ui`` (:mod:`runtime.app.web.agui`), ``a2a`` ``/a2a/`` and its
    agent card, ``mcp`` ``/mcp`` (docs/protocols.md).

    ``on_busy`` is the busy strategy of every session the app opens, instead of its
    agent's (:mod:`runtime.busy`): what ``POST /api/chat`` does with a message for a
    session whose turn runs. ``max_queued_per_session`` caps the messages that may wait
    for one session's running turn (``enqueue``, ``interrupt``, ``steer``; ``None``: no
    cap): one more is a 429 with ``Retry-After`` and waits nowhere (a front end of
    workers: the queue's own caps, ``turn_queue(max_queued_per_session=)``).

    ``mcp_limits`` bounds ``/mcp``'s sessions (idle lifetime, how many, a GET stream's
    age: :class:`~runtime.app.web.protocols.MCPLimits`; its defaults when not given).

    ``approval_secret`` signs the AI SDK's approval requests (``signature``) and checks
    the signatures its continuations send back (:mod:`runtime.app.web.signing`; the same
    on every front end of a worker deployment). ``None``: nothing signed or checked.
    ``require_approval_signature`` refuses (403) an AI SDK approval answer that carries
    no signature; it needs ``approval_secret`` (a ``ValueError`` without one). AG-UI,
    A2A and ``session.respond`` carry no signature and are not affected
    (docs/approval.md, "Signed approvals").
    """
    cors_origins = [cors_origin(origin) for origin in cors_origins or ()]
    state = WebState(
        host,
        agent,
        max_body=max_body,
        keepalive=keepalive,
        body_timeout=body_timeout,
        send_timeout=send_timeout,
        on_busy=None if on_busy is None else check_on_busy(on_busy),
        max_queued_per_session=max_queued_per_session,
        max_body_in_flight=max_body_in_flight,
    )
    state.relay = relay
    state.readiness.relay = relay
    if mcp_limits is not None:
        state.mcp_limits = mcp_limits
    state.cancel_hook = cancel_hook
    state.signer = ApprovalSigner.of(approval_secret, required=require_approval_signature)
    # Every protocol tells a turn whose save the store refused as ``not_saved``
    # (runtime/app/unsaved.py): none of it is carried on into a later turn's save.
    host.forgets_unsaved = True
    if queue is not None:
        if relay is None:
            raise ValueError("a front end (queue=) needs the relay its workers write to")
        state.front = FrontEnd(store=host.store, queue=queue, relay=relay)
    return _app(state, token, cors_origins, allowed_hosts, protocols)


def _app(
    state: WebState,
    token: str | None,
    cors_origins: Sequence[str] | None,
    allowed_hosts: Sequence[str] | None,
    protocols: Collection[str],
) -> Starlette:
    """The Starlette app on ``state``: the page's and the API's routes behind the
    middleware, and the other ``protocols``' endpoints."""
    app = Starlette(
        routes=[*health_routes(), *_page_routes(), *_api_routes(state.front)],
        middleware=_middleware(state, token, cors_origins, allowed_hosts),
        exception_handlers={ApiError: _api_error, HostClosed: _host_closed},
        lifespan=_lifespan(state),
    )
    app.state.axon = state
    mount_protocols(app, state, protocols, token=token, stream=TurnResponse)
    return app
