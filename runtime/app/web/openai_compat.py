"""An OpenAI-compatible endpoint: any OpenAI SDK client can use an Axon agent as a model.

Mounted at ``/v1`` by ``serve --protocols openai`` (:mod:`runtime.app.web.protocols`):

``GET /v1/models``
    The served agent, as the one model (its ``id`` is the agent's name).
``POST /v1/chat/completions``
    One turn of the agent, streamed (``stream: true``: ``chat.completion.chunk`` s over
    SSE, then ``data: [DONE]``) or answered whole (one ``chat.completion``).

It is a thin adapter over the same turn machinery as ``POST /api/chat``: the turn runs
through ``session.stream`` and its output chunks (:mod:`runtime.output`) are mapped:

* the agent's answer text, across all the turn's steps (the text a chat client would
  show; the same as ``TurnResult.text``), is ``content`` (``delta.content`` per text delta);
* reasoning is ``reasoning_content`` (``delta.reasoning_content``), the field
  OpenAI-compatible servers (vLLM, DeepSeek) use for it;
* the agent's tool calls run server-side and stay internal: they are not ``tool_calls``
  (a client that sends ``tools`` of its own gets a 400: it cannot run them here);
* ``usage`` is the turn's usage summed over its steps (``prompt_tokens`` =
  input tokens of every model call); streamed, it comes in the last chunk when
  ``stream_options.include_usage`` is set, as OpenAI sends it;
* ``finish_reason``: ``stop`` / ``length`` / ``content_filter`` as the turn ended; a
  turn cut by a budget is ``length``; any other ending is ``stop``;
* a turn that fails (or is cut off, e.g. by a server shutdown) sends
  ``data: {"error": {...}}`` in the stream, which the SDK raises; answered whole it is a
  500 (503 for a cut-off turn) in the same shape.

Sessions: with an ``X-Axon-Session: <id>`` header the turn runs on that session, which
keeps its own history (stored like every session): only the request's last message, a
user message, is new, the rest of ``messages`` is not read. Without the header the
request is stateless: ``messages`` is the whole conversation (``system`` / ``developer``,
``user`` with text and ``image_url`` parts, ``assistant`` with text and ``tool_calls``,
``tool``), the turn runs in a scratch in-memory host on a new session that is closed and
forgotten after it, and nothing reaches the store. Request options the agent decides
itself (``temperature``, ``max_tokens``, ...) are ignored.

Bad input is answered in OpenAI's error shape, ``{"error": {"message", "type", "param",
"code"}}``, before any session is opened: a malformed body 400, an unknown ``model`` 404
(``model_not_found``), a malformed session header 400 (``invalid_session_id``), a missing
or wrong token 401 (``invalid_api_key``), a session already running a turn 409. The Host
and Origin checks of the whole app (:mod:`runtime.app.web.guard`) apply before these.

In a worker deployment's front end (``state.front``) the turn is queued for the workers
instead and its chunks read back from the relay (:mod:`runtime.app.web.queued_turn`),
through the same encoder; a stateless request's conversation travels in the queued row
(:class:`runtime.turn_queue.TurnOptions`) and its scratch session is deleted by its worker.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import orjson
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime import output as o
from runtime.agent import Agent
from runtime.app.host import Host
from runtime.app.nested import delete_scratch
from runtime.app.session import FINAL_WAIT
from runtime.app.unsaved import ENDS, forget_unsaved, told_end
from runtime.app.web.chat_body import not_json
from runtime.app.web.chat_input import (
    INLINE_BODY,
    _read_body,
    check_json_values,
    off_loop,
    title_of,
)
from runtime.app.web.guard import is_json
from runtime.app.web.http import CLOSING_RETRY_AFTER, ApiError, closing_message
from runtime.app.web.openai_wire import (
    CompletionEncoder,
    OpenAIError,
    bad_request,
    parse_chat_request,
)
from runtime.app.web.queued_turn import QueuedStreamResponse, QueuedTurnOutput
from runtime.app.web.resend import resend_history
from runtime.busy import ENQUEUE, REJECT, STEER, OnBusy
from runtime.errors import (
    CallerWaits,
    HostClosed,
    InvalidHistory,
    InvalidMedia,
    InvalidSessionId,
    MediaTooLarge,
    SessionBusy,
    TurnWithdrawn,
)
from runtime.history import checked_off_loop
from runtime.ids import new_id
from runtime.liveness import answering_elsewhere
from runtime.media import check_limits
from runtime.messages import (
    Message,
    UserContent,
)
from runtime.serde import utf8_dumps
from runtime.store import validate_session_id
from runtime.turn_queue import TurnOptions

SESSION_HEADER = "x-axon-session"
"""The request header naming the session a turn runs on (none: stateless)."""

ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
"""Routed to the endpoints, which answer a method they do not take in OpenAI's shape."""

STREAM_HEADERS: dict[str, str] = {
    "content-type": "text/event-stream",
    "cache-control": "no-cache",
    "x-accel-buffering": "no",
}


def error_response(error: OpenAIError, headers: dict[str, str] | None = None) -> Response:
    """``error`` answered in OpenAI's shape with its status (and its own headers, a
    ``retry-after``)."""
    return Response(
        utf8_dumps(error.body()),  # a provider's message may quote half a character
        status_code=error.status,
        headers={**error.headers, **(headers or {})},
        media_type="application/json",
    )


# -- the responses ------------------------------------------------------------------------


def one_answer_each(session: Any) -> OnBusy:
    """The busy strategy of a completion request: the session's, except that ``steer``
    becomes ``enqueue``: a request of this API gets its own answer, and a steered
    message's answer would go to another request's (:mod:`runtime.busy`)."""
    strategy: OnBusy = session.on_busy
    return ENQUEUE if strategy == STEER else strategy


def _busy(session: Any, why: str | None = None) -> Response:
    return error_response(_busy_error(session.id, why))


def _closing(exc: Exception) -> Response:
    """A turn refused as the host closes (``serve`` stopping): OpenAI's 503, to retry."""
    return error_response(
        OpenAIError(
            503,
            closing_message(exc),
            type="server_error",
            code="unavailable",
            headers={"retry-after": CLOSING_RETRY_AFTER},
        )
    )


class CompletionWhole:
    """A turn answered as one ``chat.completion`` once it is over; a client that leaves
    first cancels it (saved, marked interrupted, as a stream's)."""

    def __init__(
        self, session: Any, text: UserContent, encoder: CompletionEncoder, *, named: bool
    ) -> None:
        self.session = session
        self.text = text
        self.encoder = encoder
        self.named = named

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        session = self.session
        try:
            await session.reopen()
        except HostClosed as exc:
            await _closing(exc)(scope, receive, send)
            return
        strategy = one_answer_each(session)
        if session.busy and strategy == REJECT:
            await _busy(session)(scope, receive, send)
            return
        if "title" not in session.meta:
            session.set_title(title_of(self.text))
        busy: bool | str = False
        closed: HostClosed | None = None
        async with trio.open_nursery() as nursery:
            try:
                async with session.stream(self.text, on_busy=strategy) as out:
                    nursery.start_soon(_watch_disconnect, receive, out)
                    end = None  # held until the result says whether the turn was saved
                    async for chunk in out:
                        if type(chunk) in ENDS:
                            end = chunk
                        else:
                            self.encoder.chunks(chunk)
                    with trio.move_on_after(FINAL_WAIT):
                        await out.done.wait()
                    if end is not None:
                        self.encoder.chunks(told_end(end, out.result))
                await forget_unsaved(session, out.result)
            except TurnWithdrawn as exc:  # stopped while it waited: the turn's abort
                self.encoder.chunks(o.Abort(reason=exc.reason))
            except CallerWaits as exc:
                busy = str(exc)
            except HostClosed as exc:  # the turn entered (or waited) as the host closed
                closed = exc
            except SessionBusy:
                busy = True
            finally:
                nursery.cancel_scope.cancel()
        if closed is not None:
            await _closing(closed)(scope, receive, send)
            return
        if busy:
            await _busy(session, busy if isinstance(busy, str) else None)(scope, receive, send)
            return
        headers = _session_header(session, self.named)
        if self.encoder.error is not None:
            response = error_response(self.encoder.error, headers)
        else:
            body = utf8_dumps(self.encoder.completion())
            response = Response(body, headers=headers, media_type="application/json")
        await response(scope, receive, send)


async def _watch_disconnect(receive: Receive, out: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            out.cancel("client disconnected")
            return


def _session_header(session: Any, named: bool) -> dict[str, str]:
    """The ``X-Axon-Session`` answer header: only for a session the client named (a
    stateless turn's scratch session is nobody's to continue)."""
    return {SESSION_HEADER: session.id} if named else {}


class Stateless:
    """Runs ``make(session, False)`` (a response for a session) on a new scratch session
    ``session_id`` that starts from ``history``, and forgets the session after it: nothing
    reaches the app's store."""

    def __init__(
        self,
        scratch: ScratchHost,
        agent: Agent,
        session_id: str,
        history: tuple[Message, ...],
        make: Callable[[Any, bool], ASGIApp],
    ) -> None:
        self.scratch = scratch
        self.agent = agent
        self.session_id = session_id
        self.history = history
        self.make = make

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.scratch.host() as host:
            session = await host.open_session(
                self.agent, session_id=self.session_id, history=self.history
            )
            try:
                await self.make(session, False)(scope, receive, send)
            finally:
                with trio.CancelScope(shield=True):
                    added = session.messages[len(self.history) :]  # what its turn added
                    await session.close()
                    # with its agent tools' sub-sessions (nobody reads or decides them now)
                    await delete_scratch(host.store, session.id, added)


class ScratchHost:
    """The in-memory host stateless turns run in: opened on first use in the app's
    background nursery (its lifespan) and kept, so the agent's MCP servers and provider
    actor start once; without a lifespan, one host per request."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self._host: Host | None = None
        self._lock = trio.Lock()

    @asynccontextmanager
    async def host(self) -> AsyncIterator[Host]:
        """The scratch host, for the time of one request."""
        background = self.state.background
        if background is None:
            async with Host.open(store=None) as host:
                yield host
            return
        async with self._lock:
            if self._host is None:
                self._host = await background.start(self._run)
            host = self._host
        yield host

    def cancel_turns(self, reason: str) -> int:
        """Cancel the stateless turns running now (a server shutting down ends them with
        a clean ``abort``, as the main host's); how many were running."""
        return self._host.cancel_turns(reason) if self._host is not None else 0

    async def _run(self, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with Host.open(store=None) as host:
                task_status.started(host)
                await trio.sleep_forever()
        finally:
            self._host = None


# -- the routes ---------------------------------------------------------------------------


class OpenAIRoutes:
    """``/v1/models`` and ``/v1/chat/completions`` over the app's
    :class:`~runtime.app.web.app.WebState`."""

    def __init__(self, state: Any, stream: Any) -> None:
        self.state = state
        self.stream = stream
        """The app's turn-streaming response (:class:`runtime.app.web.app.TurnResponse`)."""
        self.scratch = ScratchHost(state)
        self._model: str | None = None

    def model(self) -> str:
        """The served agent's name (a factory's: the agent it gives a new session)."""
        if self._model is None:
            self._model = self.state.agent_for(new_id("session")).name
        return self._model

    async def models(self, request: Request) -> Response:
        model = {"id": self.model(), "object": "model", "created": 0, "owned_by": "axon"}
        return _json({"object": "list", "data": [model]})

    async def chat_completions(self, request: Request) -> Any:
        state = self.state
        if state.front is not None:  # closing: 503 before the body is read
            try:
                state.front.check_open()
            except HostClosed as exc:
                return _closing(exc)
        try:
            raw = await _read_body(request, state.max_body, state.body_timeout, state.body_budget)
            await check_json_values(raw, state)
        except ApiError as exc:
            raise OpenAIError(exc.status, exc.message, headers=exc.headers) from None
        chat = await off_loop(_chat_request, raw, big=len(raw) > INLINE_BODY, state=state)
        if chat.model != self.model():
            raise OpenAIError(
                404,
                f"The model '{chat.model}' does not exist (this server serves '{self.model()}')",
                param="model",
                code="model_not_found",
            )
        encoder = CompletionEncoder(chat.model, include_usage=chat.include_usage)
        if state.front is not None:  # a worker deployment's front end: queue it
            return await self._queued(request, chat, encoder)

        def respond(session: Any, named: bool) -> ASGIApp:
            if chat.stream:
                return self.stream(  # the AI SDK endpoint's stream, with this encoder
                    session,
                    chat.input,
                    keepalive=state.keepalive,
                    send_timeout=state.send_timeout,
                    background=state.background,
                    encoder=lambda: encoder,
                    headers={**STREAM_HEADERS, **_session_header(session, named)},
                    busy=_busy,
                    closing=_closing,
                    on_busy=one_answer_each(session),
                )
            return CompletionWhole(session, chat.input, encoder, named=named)

        header = request.headers.get(SESSION_HEADER)
        if header is None:
            scratch_id = new_id("session")
            agent = state.agent_for(scratch_id)
            _check_media(chat.input, agent)
            try:
                history = await checked_off_loop(chat.history, limiter=state.parse_limiter)
            except InvalidHistory as exc:
                raise bad_request(str(exc), "messages") from None
            return Stateless(self.scratch, agent, scratch_id, history, respond)
        session_id = _session_id(header)
        try:
            session = await state.session(session_id)
        except HostClosed as exc:  # opened on a host closed already (serve stopping)
            return _closing(exc)
        _check_media(chat.input, session.agent)
        if (
            not session.busy
            # (a host alone on its store: its registry's read, no load, no write)
            and (state.host.claims_turns or await state.host.shares_store(fresh=True))
            and answering_elsewhere(
                (await resend_history(session, state.host.store))[1], state.host.marker_id
            )
        ):
            # Another server on the store runs a turn of the session now (two ``serve``
            # on one file): refused as one running here is, not run beside it. Under
            # ``enqueue`` and ``interrupt`` too: no queue spans two processes on a file,
            # nor a stop (and without message ids this post may be that turn's retry).
            return _busy(
                session,
                f"session {session_id!r} is running a turn on another server: send it "
                "again once that is done",
            )
        return respond(session, True)

    async def _queued(self, request: Request, chat: Any, encoder: CompletionEncoder) -> Any:
        """The completion in a worker deployment's front end: the turn is queued for the
        workers (on the named session; without the header on a scratch session that
        starts from the request's ``messages`` and that its worker deletes once the turn
        is over) and its output read back from the relay, through the same encoder."""
        state, front = self.state, self.state.front
        header = request.headers.get(SESSION_HEADER)
        named = header is not None
        options: TurnOptions | None = None
        if header is None:
            session_id = new_id("session")
            _check_media(chat.input, state.agent_for(session_id))
            try:
                history = await checked_off_loop(chat.history, limiter=state.parse_limiter)
            except InvalidHistory as exc:
                raise bad_request(str(exc), "messages") from None
            options = TurnOptions(history=history or None, ephemeral=True)
        else:
            session_id = _session_id(header)
            agent = state.agent_for(session_id)
            _check_media(chat.input, agent)
            strategy = state.on_busy or agent.on_busy
            if strategy == REJECT and await front.queue.active(session_id) is not None:
                raise _busy_error(session_id)
        try:
            turn = await front.submit(
                session_id, chat.input, None, False, options=options, titled=named
            )
        except ApiError as exc:
            raise OpenAIError(exc.status, exc.message, headers=exc.headers) from None
        except HostClosed as exc:  # this front end is closing: another takes it
            return _closing(exc)
        out = QueuedTurnOutput(front, turn)
        headers = {SESSION_HEADER: session_id} if named else {}
        if chat.stream:
            return QueuedStreamResponse(
                out,
                encoder,
                headers={**STREAM_HEADERS, **headers},
                keepalive=state.keepalive,
                send_timeout=state.send_timeout,
                background=state.background,
            )
        return QueuedCompletionWhole(out, encoder, headers)


class QueuedCompletionWhole:
    """A queued turn answered as one ``chat.completion`` once it is over; a client that
    leaves first cancels it, as in the embedded app."""

    def __init__(
        self, out: QueuedTurnOutput, encoder: CompletionEncoder, headers: dict[str, str]
    ) -> None:
        self.out = out
        self.encoder = encoder
        self.headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        left = False
        async with trio.open_nursery() as nursery:

            async def watch_disconnect() -> None:
                nonlocal left
                while (await receive())["type"] != "http.disconnect":
                    pass
                left = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_disconnect)
            async for chunk in self.out:
                self.encoder.chunks(chunk)
            nursery.cancel_scope.cancel()
        if left:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await self.out.cancel("client disconnected")
            return
        if self.encoder.error is not None:
            response = error_response(self.encoder.error, self.headers)
        else:
            body = utf8_dumps(self.encoder.completion())
            response = Response(body, headers=self.headers, media_type="application/json")
        await response(scope, receive, send)


def _session_id(header: str) -> str:
    try:
        return validate_session_id(header)
    except InvalidSessionId as exc:
        raise OpenAIError(
            400, f"X-Axon-Session: {exc}", param=SESSION_HEADER, code="invalid_session_id"
        ) from None


def _busy_error(session_id: str, why: str | None = None) -> OpenAIError:
    """409 ``session_busy``; ``why``: another reason than a running turn
    (:class:`~runtime.errors.CallerWaits`)."""
    return OpenAIError(
        409, why or f"session {session_id!r} is already running a turn", code="session_busy"
    )


def _check_media(text: UserContent, agent: Agent) -> None:
    try:
        check_limits(text, agent.media_limits)
    except MediaTooLarge as exc:
        raise OpenAIError(413, exc.message, param="messages") from None
    except InvalidMedia as exc:
        raise bad_request(exc.message, "messages") from None


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def _endpoint(handler: Callable[[Request], Any], *methods: str) -> Callable[[Request], Any]:
    """``handler`` for ``methods``, with its :class:`OpenAIError` s (and a 405 for any
    other method) answered in OpenAI's shape."""

    async def endpoint(request: Request) -> Any:
        if request.method not in methods:
            error = OpenAIError(405, f"{request.method} is not allowed here (use {methods[0]})")
            return error_response(error, {"allow": ", ".join(methods)})
        try:
            return await handler(request)
        except OpenAIError as exc:
            return error_response(exc)

    return endpoint


class OpenAIGuard:
    """The token (401) and JSON body (415) checks of ``/v1/``, answered in OpenAI's shape.

    The app's :class:`~runtime.app.web.app.BearerAuth` and the guard's content-type check
    cover ``/api/``; this covers the OpenAI routes the same way. The SDK sends its
    ``api_key`` as the bearer token."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app = app
        self.token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "OPTIONS":
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(
                    refusal, {"www-authenticate": "Bearer"} if refusal.status == 401 else None
                )(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> OpenAIError | None:
        headers = dict(scope["headers"])
        if self.token is not None:
            scheme, _, credentials = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credentials.strip(), self.token
            ):
                return OpenAIError(
                    401, "missing or wrong API key (the server's token)", code="invalid_api_key"
                )
        content_type = headers.get(b"content-type")
        if scope["method"] == "POST" and not is_json(
            content_type.decode("latin-1") if content_type else None
        ):
            return OpenAIError(415, "the body must be sent as content-type: application/json")
        return None


def _chat_request(raw: bytes) -> Any:
    """A Chat Completions body, parsed and checked (``off_loop``: a big one in a thread)."""
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(not_json(exc)) from None
    return parse_chat_request(payload)


def openai_endpoint(
    state: Any, *, token: str | None, stream: Any
) -> tuple[ASGIApp, Callable[[str], int]]:
    """The ``/v1`` app over the app's ``state`` (mounted by
    :func:`runtime.app.web.protocols.mount_protocols`), its turns streamed by ``stream``, and
    the function that cancels its stateless turns (``cancel(reason)``, at shutdown)."""
    routes = OpenAIRoutes(state, stream)

    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        error = OpenAIError(404, f"no route {scope['path']!r}", code="unknown_url")
        await error_response(error)(scope, receive, send)

    router = Router(
        routes=[
            Route("/models", _endpoint(routes.models, "GET", "HEAD"), methods=ANY_METHOD),
            Route(
                "/chat/completions", _endpoint(routes.chat_completions, "POST"), methods=ANY_METHOD
            ),
        ],
        default=not_found,
    )
    return OpenAIGuard(router, token), routes.scratch.cancel_turns


__all__ = ["SESSION_HEADER", "openai_endpoint"]
