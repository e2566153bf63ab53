"""``serve --protocols mcp``: the served agent as an MCP tool, over streamable HTTP at ``/mcp``.

Mounted by :func:`runtime.app.web.protocols.mount_protocols`. The MCP side (the tool, its
calls, progress and errors) is :mod:`runtime.app.mcp_tools`, shared with the stdio server;
this module puts it behind the web app: the official ``mcp`` package's
``StreamableHTTPSessionManager`` speaks the transport (both protocol eras: the
``initialize`` handshake with an ``Mcp-Session-Id``, and the 2026 per-request envelope),
run for the app's lifespan, and every turn runs on the app's host through its
:class:`~runtime.app.web.app.WebState`, so MCP calls and chat-page turns share sessions,
store and observers.

The checks are the app's: the app-wide guard (:mod:`runtime.app.web.guard`) refuses a
``Host`` it does not answer and a state-changing request from another origin (403, here
as a JSON-RPC error body), before the transport sees it, so the package's own
DNS-rebinding settings are left off rather than kept as a second, different list; with
``--token`` every request needs ``Authorization: Bearer <token>`` (401 in the shape the
``mcp`` package's own bearer-auth middleware answers: ``{"error": "invalid_token",
"error_description": ...}`` and a ``WWW-Authenticate: Bearer`` challenge), and a POST
whose body is not sent as ``application/json`` 415 (a page can send ``text/plain``
cross-origin without asking; JSON needs a CORS preflight). The transport
itself answers a missing ``Accept`` (406), an unknown or
forged ``Mcp-Session-Id`` (404) and a body over ``--max-body`` (413), each as a JSON-RPC
error.

In a worker deployment's front end (``state.front``) no turn runs here: a call is queued
for the workers (:class:`QueuedAgentTools`) and its progress and answer read back from the
relay (:mod:`runtime.app.web.queued_turn`), the same chunks the embedded call reads from
``session.stream``; a call that is cancelled (``notifications/cancelled``) cancels the
queued turn; bad input is refused before anything is queued, as in the embedded app.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import orjson
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from runtime.app.mcp_tools import (
    AgentTools,
    Progress,
    Report,
    build_server,
    busy_result,
    closing_result,
    error_result,
    tool_result,
)
from runtime.app.web.chat_input import TooManyValues, _read_body, check_json_values
from runtime.app.web.guard import is_json
from runtime.app.web.http import ApiError, has_bearer
from runtime.app.web.queued_turn import (
    CUT_BY_CLOSING,
    QueuedTurnOutput,
    cancel_quietly,
    settle_quietly,
)
from runtime.app.web.writer import streams_bounded
from runtime.busy import REJECT
from runtime.errors import HostClosed
from runtime.json_exact import dumps, exact, lost_int
from runtime.logging import quiet_mcp_server_logs

PATH = "/mcp"


def jsonrpc_error(
    status: int, message: str, code: int = -32600, *, headers: dict[str, str] | None = None
) -> Response:
    """A JSON-RPC error with no id (an HTTP-level refusal), as the transport answers."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}
    return Response(
        orjson.dumps(body), status_code=status, headers=headers, media_type="application/json"
    )


def token_refusal(description: str) -> Response:
    """401 as the ``mcp`` package's ``RequireAuthMiddleware`` answers it."""
    challenge = f'Bearer error="invalid_token", error_description="{description}"'
    return Response(
        orjson.dumps({"error": "invalid_token", "error_description": description}),
        status_code=401,
        headers={"www-authenticate": challenge},
        media_type="application/json",
    )


def _aged_receive(receive: Receive, deadline: float) -> Receive:
    """``receive``, but from ``deadline`` on (trio's clock) a client's disconnect: what a
    GET stream's transport hears when the stream is past its age
    (:meth:`MCPEndpoint._handled`). A wait for the client's next message is cut at the
    deadline (a trio channel's receive, which a cancel leaves as it was)."""

    async def aged() -> Message:
        with trio.move_on_at(deadline):
            return await receive()
        return {"type": "http.disconnect"}

    return aged


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


INVALID_MESSAGE = (
    'Validation error: not a JSON-RPC 2.0 message (an object with "jsonrpc": "2.0" '
    'and a "method" string, with an "id" that is a string or an integer for a '
    "request; or a response to a request of the server)"
)
"""What a body that parses but is no JSON-RPC message is told, in place of the
transport's own text (pydantic's report: its model class names, the input echoed and a
link to pydantic's documentation)."""


def _clean_refusal(body: bytes) -> bytes | None:
    """The transport's 400 ``body`` with a pydantic validation report as its error's
    message, that message replaced (:data:`INVALID_MESSAGE`); ``None`` for any other."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return None
    message = error.get("message")
    if not isinstance(message, str) or not message.startswith("Validation error:"):
        return None
    return orjson.dumps({**answer, "error": {**error, "message": INVALID_MESSAGE}})


class _Refusals:
    """The transport's ``send``, with two of its refusals replaced: its body-limit
    refusal (413 as plain text, the one refusal it does not answer as a JSON-RPC error)
    by the JSON-RPC error the client's own parser reads, as the app's other refusals are;
    and the message of its 400 for a body that is no JSON-RPC message, which is
    pydantic's validation report, by :data:`INVALID_MESSAGE`.

    What it sends once its response is whole is dropped (:attr:`finished`): it answers a
    notification 202 before it hands the notification to the session, and a session
    ended in between (the client's ``DELETE`` right after) had it start a 500 on the
    finished response, which the server raised out of the app as a second traceback
    ("Error in ASGI Framework"), as it did the ``ClosedResourceError`` it raises next
    (:meth:`MCPEndpoint.__call__` lets that one end there).

    A response it started and returned without ending (:attr:`started`, not
    :attr:`finished`) is ended by :meth:`MCPEndpoint.__call__`."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.finished = False
        self.held: Any = None

    async def __call__(self, message: Any) -> None:
        send = self.send
        if self.finished:
            return
        if message["type"] == "http.response.start":
            self.started = True
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.finished = True  # (the response is whole: nothing follows it)
        if message["type"] == "http.response.start" and message["status"] == 503:
            # The transport's one 503: its session cap (``Too many open sessions``),
            # which says nothing of when to come back; room frees as sessions end.
            headers = [*message["headers"], (b"retry-after", FULL_RETRY_AFTER)]
            await send({**message, "headers": headers})
        elif message["type"] == "http.response.start" and message["status"] == 413:
            self.finished = True
            refusal = jsonrpc_error(413, "Request body too large")
            await send({**message, "headers": refusal.raw_headers})
            await send({"type": "http.response.body", "body": refusal.body})
        elif message["type"] == "http.response.start" and message["status"] == 400:
            self.held = message  # (until its body says what it is)
        elif self.held is not None and message["type"] == "http.response.body":
            start, self.held = self.held, None
            body = None if message.get("more_body") else _clean_refusal(message["body"])
            if body is None:
                await send(start)
                await send(message)
                return
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        else:
            await send(message)


FULL_RETRY_AFTER = b"60"
"""``Retry-After`` on the transport's 503 at its session cap (``--mcp-max-sessions``)."""


SDK_LOGGER = "mcp.server.streamable_http"
"""The transport's logger, whose records :class:`_EndedSessionRaces` quiets."""

RACE_MESSAGES = frozenset({"Error handling POST request", "SSE response error"})
"""What the transport logs, with a traceback at ERROR, when a POST finds its session
closed as it hands the message on (the client's ``DELETE`` just before: an ordinary
race, 12 and 7 in 50 such races in branch ``mcpreap``)."""


def _only_closed(exc: BaseException | None) -> bool:
    """``exc`` is a closed or broken stream, or a group of nothing else."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_closed(inner) for inner in exc.exceptions)
    return isinstance(exc, (anyio.ClosedResourceError, anyio.BrokenResourceError))


class _EndedSessionRaces(logging.Filter):
    """The transport's ERROR and traceback for a POST whose session ended as it was sent
    (:data:`RACE_MESSAGES`, raised by a closed stream) made one INFO line (dropped where
    the logger's level is above INFO): an operator's log filled with tracebacks for a
    client's ordinary ``DELETE``. Its other records, and those messages for any other
    error, are left as they are."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in RACE_MESSAGES and record.exc_info and _only_closed(record.exc_info[1]):
            said = (record.getMessage(), type(record.exc_info[1]).__name__)
            record.msg, record.args = "%s: its session ended as it was sent (%s)", said
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.exc_info, record.exc_text = None, None
            record.axon_said = True  # (Axon's words: runtime.logging.MCPServerLines keeps it)
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


QUIET_RACES = _EndedSessionRaces()


def quiet_ended_session_races() -> None:
    """Put :data:`QUIET_RACES` on the transport's logger (once)."""
    logger = logging.getLogger(SDK_LOGGER)
    if QUIET_RACES not in logger.filters:
        logger.addFilter(QUIET_RACES)


GET_STREAM_ID = "_GET_stream"
"""The key the ``mcp`` package's transport files a session's GET stream under, in the
same table as its requests' response streams, by ``str`` of their JSON-RPC ids
(``mcp.server.streamable_http.GET_STREAM_KEY``; ``_handle_post_request``:
``request_id = str(message.id)``, ``self._request_streams[request_id] = ...``)."""


END_OF_BODY: Message = {"type": "http.response.body", "body": b"", "more_body": False}


def _request_key(session_id: str | None, raw: bytes) -> tuple[str, str, Any] | None:
    """A POSTed JSON-RPC request's session id, the key the transport files its response
    stream under (``str`` of its id: ``7`` and ``"7"`` are one, as there) and its id;
    ``None`` for anything else (a notification, a response, a request outside a session,
    a body the transport refuses). The transport keeps one response stream per key in a
    session: a second request with the key of one in flight took it over, and the first
    was never answered (its turn ran; its POST waited for as long as the client kept the
    connection), nor did it end with the session (branch ``mcpreap``: ``7`` then ``"7"``
    had the second answered with the first's result, the first POST's tasks left after
    the ``DELETE``)."""
    message = _message(raw)
    if not session_id or message is None or "id" not in message:
        return None  # (no id: a notification)
    request_id = message["id"]
    return session_id, str(request_id), request_id


def _message(raw: bytes) -> dict[str, Any] | None:
    """The JSON-RPC request or notification ``raw`` holds (an object with a
    ``method``), else ``None`` (left to the transport's own answers)."""
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(message, dict) or "method" not in message:
        return None
    if type(message.get("id")) is float and lost_int(message["id"]):
        # an integer id past 64 bits, which orjson read as a float: read exactly, so it
        # is the integer the transport (pydantic) reads and answers with, not a 400
        message = exact(message, raw)
    return message


_JSON_TYPES = {float: "a number with a fraction", bool: "a boolean", type(None): "null"}
_JSON_TYPES.update({list: "an array", dict: "an object"})
"""How a refused id is named (never echoed: an id nested 300 deep is past what
``orjson.dumps`` takes, and its refusal was a 500)."""


def _id_invalid(raw: bytes) -> Response | None:
    """400 for a request whose ``id`` is neither a string nor an integer (MCP: "Requests
    MUST include a string or integer ID", never null), else ``None``. The transport
    took such a request for a notification (its model has no ``id``, extra keys
    allowed): 202, nothing run, and the client waited for an answer that never came."""
    message = _message(raw)
    if message is None or "id" not in message:
        return None
    request_id = message["id"]
    if isinstance(request_id, (int, str)) and not isinstance(request_id, bool):
        return None
    body = {
        "jsonrpc": "2.0",
        "id": None,
        "error": {
            "code": -32600,
            "message": "a request's id must be a string or an integer "
            f"(not {_JSON_TYPES.get(type(request_id), 'that')})",
        },
    }
    return Response(orjson.dumps(body), status_code=400, media_type="application/json")


def _id_in_use(request_id: Any) -> Response:
    """409 for a request whose id a request of its session in flight has."""
    shown = dumps(request_id, marked=False).decode()  # (an integer past 64 bits too)
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {
            "code": -32600,
            "message": f"request id {shown} is in use by a request of this "
            "session still being answered: ids must be unique among a session's requests",
        },
    }
    return Response(dumps(body, marked=False), status_code=409, media_type="application/json")


def _id_reserved(request_id: str) -> Response:
    """400 for a request with the id the transport keeps its session's GET stream under
    (:data:`GET_STREAM_ID`): its response stream took the GET stream's place, whose
    request then outlived the session's ``DELETE`` for as long as the client kept it, and
    the server's messages for the GET stream went to the request's."""
    body = {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {
            "code": -32600,
            "message": f"request id {orjson.dumps(request_id).decode()} is reserved by this "
            "server: use another",
        },
    }
    return Response(orjson.dumps(body), status_code=400, media_type="application/json")


CANCELLED = "the MCP client cancelled the call"
"""The cancel reason of a queued turn whose call was cancelled."""


class QueuedAgentTools(AgentTools):
    """The tool in a worker deployment's front end: a call's turn is queued for the
    workers and read back from the relay, with the same progress and result as a turn
    run here. The session's busy strategy is the queue's: ``reject`` refuses a call on
    a session with a turn queued or running; any other queues it behind that turn (a
    call needs its own answer, so nothing is steered into or cut off)."""

    async def run(self, session_id: str, prompt: str, report: Report) -> types.CallToolResult:
        state = self.sessions
        front = state.front  # type: ignore[attr-defined]
        strategy = state.on_busy or state.agent_for(session_id).on_busy  # type: ignore[attr-defined]
        if strategy == REJECT and await front.queue.active(session_id) is not None:
            return busy_result(session_id)
        try:
            turn = await front.submit(session_id, prompt, None, False)
        except ApiError as exc:  # a full queue, a store that cannot be reached, ...
            return error_result(f"the turn could not be queued: {exc.message}")
        except HostClosed as exc:  # this front end is closing: another takes the call
            return closing_result(exc, session_id)
        out = QueuedTurnOutput(front, turn)
        progress = Progress(report)
        try:
            with front.viewing() as viewing:
                async for chunk in out:
                    await progress.chunk(chunk)
        except BaseException:  # the call was cancelled (or the server shuts down)
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await cancel_quietly(out, CANCELLED)
            raise
        if viewing.cancelled_caught:  # this front end closes: the turn goes on, saved
            return error_result(f"{CUT_BY_CLOSING} ({session_id})")
        await settle_quietly(out)
        return tool_result(out.result, session_id)


class MCPEndpoint:
    """The ASGI app at ``/mcp`` over the web app's ``state``; :meth:`running` is entered
    for the app's lifespan (the session manager's task group lives there)."""

    def __init__(self, state: Any, *, token: str | None) -> None:
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        self.state = state
        queued = getattr(state, "front", None) is not None  # a worker deployment's front end
        self.tools = (QueuedAgentTools if queued else AgentTools)(state)
        self.server = build_server(self.tools, send_timeout=state.send_timeout)
        limits = state.mcp_limits
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            security_settings=None,  # the app's guard checks Host and Origin (module doc)
            max_request_body_size=state.max_body,
            session_idle_timeout=limits.session_idle,
            max_sessions=limits.max_sessions,
        )
        self.stream_max_age: float | None = limits.stream_max_age
        quiet_ended_session_races()
        quiet_mcp_server_logs()  # (an application may never call configure_logging)
        self.token = token.encode() if token else None
        self.started = False
        self.in_flight: set[tuple[str, str]] = set()
        """The requests being answered, by session id and the key of their JSON-RPC id
        (:func:`_request_key`): one more with the same pair is refused."""

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the transport's sessions for the time of the block (the app's lifespan)."""
        async with self.manager.run():
            self.started = True
            try:
                yield
            finally:
                self.started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # pragma: no cover - Starlette routes only HTTP here
            return
        if self.token is not None and not self._authorized(scope):
            await token_refusal("missing or wrong bearer token")(scope, receive, send)
            return
        if scope["method"] == "POST" and not is_json(_header(scope, b"content-type")):
            # Before the transport, whose own check answers 400 in plain text for some
            # types: a form or a no-cors fetch from a page sends text/plain.
            refusal = jsonrpc_error(
                415, "Unsupported Media Type: Content-Type must be application/json"
            )
            await refusal(scope, receive, send)
            return
        if not self.started:
            refusal = jsonrpc_error(503, "the MCP endpoint runs while the app's lifespan does")
            await refusal(scope, receive, send)
            return
        in_flight = None
        if scope["method"] == "POST":
            try:
                receive, raw = await self._body_read(scope, receive)
            except ApiError as exc:  # (413 in the words the transport's own limit says it)
                too_large = exc.status == 413 and not isinstance(exc, TooManyValues)
                message = "Request body too large" if too_large else exc.message
                refusal = jsonrpc_error(exc.status, message, headers=exc.headers)
                await refusal(scope, receive, send)
                return
            invalid = _id_invalid(raw)
            if invalid is not None:
                await invalid(scope, receive, send)
                return
            request = _request_key(_header(scope, b"mcp-session-id"), raw)
            if request is not None:
                session_id, key, request_id = request
                if key == GET_STREAM_ID:
                    await _id_reserved(request_id)(scope, receive, send)
                    return
                in_flight = (session_id, key)
                if in_flight in self.in_flight:
                    await _id_in_use(request_id)(scope, receive, send)
                    return
        if in_flight is not None:
            self.in_flight.add(in_flight)
        try:
            sending = _Refusals(send)
            with streams_bounded(scope):  # its event streams are the transport's own
                try:
                    await self._handled(scope, receive, sending)
                    if sending.started and not sending.finished:
                        # A call's POST racing its session's DELETE: the transport
                        # started the call's event stream, then found the session
                        # closed at handing it the call (``ClosedResourceError`` at
                        # ``writer.send`` in ``_handle_post_request``, which it logs
                        # as "SSE response error" and returns from), and left the
                        # response open: Hypercorn cut the connection, and the
                        # client read a broken response (7 in 50 such races). Ended
                        # here as the stream of a session that ended.
                        await sending(END_OF_BODY)
                except anyio.ClosedResourceError:
                    if not sending.finished:
                        raise  # (_Refusals: after its answer, the session it was for ended)
        finally:
            if in_flight is not None:
                self.in_flight.discard(in_flight)

    async def _handled(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The transport's answer; a session's GET stream ended after
        :attr:`stream_max_age`: the response ends whole and the client opens another,
        as SSE clients do (the ``mcp`` package's client after a second). The transport
        counts an open GET stream as a request in flight, its session's idle countdown
        stopped: one held open, read or not, kept the session and its tasks for as long
        as the connection lived (its 15 s pings too small to fill the socket and meet
        ``--send-timeout``).

        Ended here, in the layer that wraps the transport (:func:`_aged_receive`): at the
        stream's age the transport's ``receive`` says the client left, so the transport
        ends the stream as for any client that leaves (its writer and its place for the
        session's one GET stream let go), and :meth:`__call__` ends the response it
        started. It used to reach the session's transport through the session
        manager's private ``_server_instances`` (to call its
        ``close_standalone_sse_stream``): a renamed attribute in a later ``mcp`` turned
        the bound off without a word."""
        max_age = self.stream_max_age
        if (
            scope["method"] == "GET"
            and max_age is not None
            and _header(scope, b"mcp-session-id") is not None
        ):
            receive = _aged_receive(receive, trio.current_time() + max_age)
        await self.manager.handle_request(scope, receive, send)

    async def _body_read(self, scope: Scope, receive: Receive) -> tuple[Receive, bytes]:
        """A ``receive`` that hands the transport the request's body, read here first
        within ``--body-timeout`` and ``--max-body`` as the other endpoints read theirs
        (:func:`~runtime.app.web.chat_input._read_body`: 408 and the connection closed,
        413, 400); then the request's own ``receive`` (its disconnect). The transport
        read it with no deadline: a client that announced a body and sent part of it
        held the request's task for as long as it kept the connection (branch
        ``deadlinecli``). The body itself is returned too."""
        state = self.state
        raw = await _read_body(
            Request(scope, receive), state.max_body, state.body_timeout, state.body_budget
        )
        await check_json_values(raw, state)
        given = False

        async def replay() -> Message:
            nonlocal given
            if given:
                return await receive()
            given = True
            return {"type": "http.request", "body": raw, "more_body": False}

        return replay, raw

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        return has_bearer(scope, self.token)


__all__ = ["PATH", "MCPEndpoint", "QueuedAgentTools", "jsonrpc_error"]
