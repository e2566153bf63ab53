"""The A2A (Agent2Agent) endpoint: another agent, through the official A2A clients, can
send an Axon agent tasks (``serve --protocols a2a``).

Mounted by :mod:`runtime.app.web.protocols`, speaking A2A 1.0 (:mod:`actors.a2a.wire`):

``GET /.well-known/agent-card.json``
    The Agent Card: the agent's name, its two interfaces below, streaming, and bearer
    authentication when the server has a ``--token``.
``POST /a2a/jsonrpc``
    The JSON-RPC binding: ``SendMessage``, ``SendStreamingMessage`` (SSE), ``GetTask``,
    ``CancelTask``, ``SubscribeToTask`` (SSE); and A2A 0.3's ``message/send``,
    ``message/stream``, ``tasks/get``, ``tasks/cancel``, ``tasks/resubscribe`` in 0.3's
    shapes (:mod:`actors.a2a.legacy`).
``/a2a/...``
    The HTTP+JSON binding: ``POST /a2a/message:send``, ``POST /a2a/message:stream``,
    ``GET /a2a/tasks/{id}``, ``POST /a2a/tasks/{id}:cancel``,
    ``GET|POST /a2a/tasks/{id}:subscribe``.

It is a thin adapter over the same sessions and turns as ``POST /api/chat``
(:mod:`runtime.app.web.a2a_tasks`): a task is a turn, its ``contextId`` the session, a
turn waiting for approval or a client-side tool a task in ``input-required``. Bad input
is answered in the binding's own error shape (a JSON-RPC error object; a
``google.rpc.Status`` body with its HTTP status) before any session opens. The token
check (401) is here; the Host and Origin checks of the whole app
(:mod:`runtime.app.web.guard`) apply before it.

In a worker deployment's front end a task is a row of the turn queue, run by the workers
and followed from the relay (:mod:`runtime.app.web.a2a_queued`), with the same answers.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import nullcontext
from typing import Any

import orjson
import trio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from actors.a2a import legacy, wire
from runtime.app.web.a2a_queued import QueuedTaskBook
from runtime.app.web.a2a_tasks import HostClosing, LiveTask, TaskBook
from runtime.app.web.chat_body import not_json
from runtime.app.web.chat_input import INLINE_BODY, _read_body, check_json_values, off_loop
from runtime.app.web.http import ApiError
from runtime.app.web.writer import BodyWriter
from runtime.errors import HostClosed
from runtime.ids import new_id
from runtime.serde import exact_loads, utf8_dumps

PREFIX = "/a2a"
"""Where the bindings are mounted (the Agent Card is at the well-known path)."""
JSONRPC_PATH = PREFIX + "/jsonrpc"

STREAM_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]

MAX_ID = 256
"""The longest JSON-RPC request id taken: every event of a stream echoes it, so a
megabyte id made each text delta of the answer a megabyte sent (and encoded)."""

STREAMING = frozenset({"SendStreamingMessage", "SubscribeToTask"})
NOT_SERVED = {
    "ListTasks": "UnsupportedOperation",
    "GetExtendedAgentCard": "UnsupportedOperation",
    "CreateTaskPushNotificationConfig": "PushNotificationNotSupported",
    "GetTaskPushNotificationConfig": "PushNotificationNotSupported",
    "ListTaskPushNotificationConfigs": "PushNotificationNotSupported",
    "DeleteTaskPushNotificationConfig": "PushNotificationNotSupported",
}


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        utf8_dumps(data), status_code=status, headers=headers, media_type="application/json"
    )


def _scheme(request: Request) -> str:
    """The scheme the card's URLs name: the request's, or ``https`` when a proxy in front
    says the client came over TLS (``X-Forwarded-Proto: https``). Behind a proxy that
    ends TLS the server sees plain HTTP; a card naming ``http://`` there sends the clients
    that read it (with their bearer token) around the TLS. Only this upgrade is taken from
    the header: a client that forges it gets a card naming ``https``, which is no harm.
    Why no trusted-proxy list (``--forwarded-allow-ips``) for it: the header can only
    upgrade, never name another host or downgrade; the card is built per request and
    sent ``no-cache`` (a shared cache in front revalidates, it does not hand one
    client's card to another); and the card's host is the request's ``Host`` all the
    same, the client's word already (checked by ``--allowed-host``). A forger misleads
    only itself (branch ``restream``). Nor Hypercorn's ``ProxyFixMiddleware`` (serve has
    no trusted-proxy notion): it trusts a count of hops, not the peer's address, and
    would take ``X-Forwarded-Host`` (a card naming any host) and ``X-Forwarded-For``
    as given (branch ``smallleft``)."""
    forwarded = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return "https" if forwarded == "https" else request.url.scheme


def _parsed(raw: bytes) -> Any:
    """A JSON-RPC or REST body's JSON."""
    try:
        return exact_loads(raw)  # (a data part's integer past 64 bits exactly)
    except orjson.JSONDecodeError as exc:
        raise wire.A2AError("ParseError", not_json(exc)) from None


class _BodyRefused(wire.A2AError):
    """The body refused as it was read (:func:`~runtime.app.web.chat_input._read_body`),
    with the headers of that refusal: a full body budget's 503 says ``Retry-After`` and
    closes the connection, as on the other endpoints."""

    def __init__(self, refusal: ApiError) -> None:
        super().__init__("InvalidRequest", refusal.message, status=refusal.status)
        self.headers = refusal.headers


class EventStream:
    """An SSE response: ``first`` (the task as it is), then the task's events as they
    come until it settles. A client that leaves or stops reading is dropped; the task
    goes on (a client may subscribe again)."""

    def __init__(
        self,
        first: bytes,
        events: AsyncIterator[dict[str, Any]] | None,
        encode: Callable[[dict[str, Any]], bytes],
        state: Any,
    ) -> None:
        self.first = first
        self.events = events
        self.encode = encode
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        writer = BodyWriter(
            send,
            {"type": "http.response.start", "status": 200, "headers": STREAM_HEADERS},
            timeout=state.send_timeout,
        )
        async with trio.open_nursery() as local:
            (state.background or local).start_soon(writer.run)
            async with trio.open_nursery() as nursery:
                last_write = trio.current_time()

                async def write(data: bytes) -> None:
                    nonlocal last_write
                    if not await writer.write(data):
                        nursery.cancel_scope.cancel()
                    last_write = trio.current_time()

                async def watch_disconnect() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    nursery.cancel_scope.cancel()

                async def keep_alive() -> None:
                    while True:
                        await trio.sleep_until(last_write + state.keepalive)
                        if trio.current_time() >= last_write + state.keepalive:
                            await write(b": keep-alive\n\n")

                nursery.start_soon(watch_disconnect)
                if state.keepalive:
                    nursery.start_soon(keep_alive)
                await write(self.first)
                if self.events is not None:
                    # A worker deployment's front end that closes ends its streams (the
                    # task goes on: subscribe to it on another front end).
                    front = state.front
                    with front.viewing() if front is not None else nullcontext():
                        async for event in self.events:
                            await write(self.encode(event))
                nursery.cancel_scope.cancel()
            if writer.stalled or not await writer.close():
                writer.abandon()


class A2AEndpoint:
    """The ASGI app of ``/a2a/`` (both bindings), over the app's
    :class:`~runtime.app.web.app.WebState`."""

    def __init__(self, state: Any, token: str | None) -> None:
        self.state = state
        self.token = token.encode() if token else None
        # a worker deployment's front end: tasks are rows of the turn queue
        self.tasks = QueuedTaskBook(state) if state.front is not None else TaskBook(state)

    # -- the card -----------------------------------------------------------------------

    async def card(self, request: Request) -> Response:
        agent = self.state.agent_for(new_id("session"))
        base = f"{_scheme(request)}://{request.headers.get('host', 'localhost')}{PREFIX}"
        card = wire.agent_card(
            name=agent.name,
            description=f"The Axon agent {agent.name!r}.",
            url=base,
            token=self.token is not None,
            version="0.1.0",
        )
        return _json(card, headers={"cache-control": "no-cache"})

    # -- ASGI ---------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        full = scope["path"]  # a Mount keeps the whole path (and sets root_path)
        rpc = full == JSONRPC_PATH
        request = Request(scope, receive)
        try:
            self._check(request, rpc)
            response = await (self._jsonrpc(request) if rpc else self._rest(request, full))
        except wire.A2AError as exc:
            response = self._error(exc, rpc, None)
        except HostClosed as exc:  # (the HTTP+JSON binding's)
            response = self._error(HostClosing(exc), rpc, None)
        await response(scope, receive, send)

    def _error(self, exc: wire.A2AError, rpc: bool, request_id: Any) -> Response:
        """``exc`` in the binding's shape. A JSON-RPC error is an HTTP 200, but for what
        is refused before the JSON-RPC request is read (the token, the body's size, time
        and media type, the server's room for bodies), which keeps its HTTP status."""
        headers = {"www-authenticate": "Bearer"} if exc.status == 401 else None
        if isinstance(exc, _BodyRefused | HostClosing):
            headers = exc.headers
        if rpc:
            http = exc.status if exc.status in (401, 408, 413, 415, 503) else 200
            return _json(exc.jsonrpc(request_id), http, headers)
        return _json(exc.rest(), exc.status, headers)

    def _check(self, request: Request, rpc: bool) -> None:
        """The token (401), the protocol version and the body's media type."""
        if self.token is not None:
            scheme, _, credentials = (
                request.headers.get("authorization", "").encode().partition(b" ")
            )
            if scheme.lower() != b"bearer" or not hmac.compare_digest(
                credentials.strip(), self.token
            ):
                raise wire.A2AError(
                    "InvalidRequest",
                    "missing or wrong bearer token (the server's --token)",
                    status=401,
                )
        if not rpc:  # JSON-RPC: checked once the method says which version it is
            self._check_version(request, wire.PROTOCOL_VERSION)
        if request.method == "POST":
            media = request.headers.get("content-type")
            empty = (
                request.headers.get("content-length") in (None, "0")
                and "transfer-encoding" not in request.headers
            )
            if media is None and empty and not rpc:
                return  # a subscribe (or cancel) without a body
            if media is None or media.split(";", 1)[0].strip().lower() not in wire.MEDIA_TYPES:
                raise wire.A2AError(
                    "InvalidRequest",
                    "the body must be sent as content-type: application/json",
                    status=415,
                )

    @staticmethod
    def _check_version(request: Request, speaks: str) -> None:
        """The ``A2A-Version`` header must name ``speaks`` (its major version; a request
        without the header is taken as that version)."""
        version = request.headers.get(wire.VERSION_HEADER.lower())
        if version and version.split(".")[0] != speaks.split(".")[0]:
            raise wire.A2AError(
                "VersionNotSupported",
                f"A2A version {version!r} is not supported here (this method is A2A {speaks})",
            )

    async def _body(self, request: Request) -> Any:
        try:
            raw = await _read_body(
                request, self.state.max_body, self.state.body_timeout, self.state.body_budget
            )
            await check_json_values(raw, self.state)
        except ApiError as exc:
            raise _BodyRefused(exc) from None
        if not raw:
            return {}
        # A large body off the event loop, as the other endpoints parse theirs: 48 MiB
        # of small JSON values is seconds of parsing, and on the loop no other request
        # of the process was answered meanwhile.
        return await off_loop(_parsed, raw, big=len(raw) > INLINE_BODY, state=self.state)

    # -- JSON-RPC -------------------------------------------------------------------------

    async def _jsonrpc(self, request: Request) -> Any:
        if request.method != "POST":
            error = wire.A2AError(
                "InvalidRequest", f"{request.method} is not allowed here (use POST)", status=405
            )
            return _json(error.jsonrpc(None), 405, {"allow": "POST"})
        body = await self._body(request)
        request_id = body.get("id") if isinstance(body, dict) else None
        if isinstance(request_id, bool) or not isinstance(request_id, str | int | None):
            request_id = None
        elif isinstance(request_id, str) and len(request_id) > MAX_ID:
            request_id = None  # refused below; not echoed
        try:
            if isinstance(body, list):
                raise wire.A2AError("InvalidRequest", "batch requests are not supported")
            if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
                raise wire.A2AError("InvalidRequest", "not a JSON-RPC 2.0 request object")
            method = body.get("method")
            if not isinstance(method, str) or not method:
                raise wire.A2AError("InvalidRequest", "'method' must be a non-empty string")
            if "id" not in body:
                # A notification: JSON-RPC 2.0 says the server must not reply to it, and
                # every method here is a request whose answer is its point (a task to
                # follow, a stream): nothing runs, the HTTP answer is empty (the
                # a2a-sdk server ran it and replied with a null id; docs/protocols.md).
                return Response(status_code=204)
            if body["id"] is not request_id:
                raise wire.A2AError(
                    "InvalidRequest",
                    f"'id' must be a string of at most {MAX_ID} characters, an integer or null",
                )
            params = body.get("params", {})
            old = method in legacy.METHODS or method in legacy.NOT_SERVED
            self._check_version(request, legacy.VERSION if old else wire.PROTOCOL_VERSION)
            if method in legacy.NOT_SERVED:
                raise wire.A2AError("PushNotificationNotSupported", f"{method} is not served")
            task_out: Callable[[dict[str, Any]], Any] = lambda task: task  # noqa: E731
            event_out: Callable[[dict[str, Any]], Any] = lambda event: event  # noqa: E731
            if old:  # A2A 0.3: the same methods, in 0.3's shapes (actors.a2a.legacy)
                params = legacy.params_in(method, params)
                method = legacy.METHODS[method]
                task_out, event_out = legacy.task_out, legacy.event_out
            if method in NOT_SERVED:
                raise wire.A2AError(NOT_SERVED[method], f"{method} is not served by this agent")

            def encode(event: dict[str, Any]) -> bytes:
                return wire.sse(wire.jsonrpc_result(request_id, event_out(event)))

            if method in ("SendMessage", "SendStreamingMessage"):
                send = wire.SendRequest(params)
                live = await self.tasks.send(send)
                if method == "SendStreamingMessage":
                    return self._stream(live, encode)
                sent = await self._sent(live, send)
                result = task_out(sent["task"]) if old else sent
                return _json(wire.jsonrpc_result(request_id, result))
            if method in ("GetTask", "CancelTask", "SubscribeToTask"):
                task_id, history_length = wire.task_request(params)
                if method != "GetTask":  # closing: 503, nothing canceled (as a send)
                    self._check_not_closing(method == "SubscribeToTask")
                if method == "GetTask":
                    live = await self.tasks.find(task_id)
                    result = task_out(live.snapshot(history_length))
                    return _json(wire.jsonrpc_result(request_id, result))
                if method == "CancelTask":
                    live = await self.tasks.cancel(task_id)
                    return _json(wire.jsonrpc_result(request_id, task_out(live.snapshot())))
                return self._subscribe(await self.tasks.find(task_id), encode)
            raise wire.A2AError("MethodNotFound", f"no method {method!r}")
        except wire.A2AError as exc:
            return self._error(exc, True, request_id)
        except HostClosed as exc:  # its session opened on a host closed already
            return self._error(HostClosing(exc), True, request_id)

    # -- HTTP+JSON --------------------------------------------------------------------------

    async def _rest(self, request: Request, path: str) -> Any:
        method = request.method
        route = path[len(PREFIX) :]

        def only(*methods: str) -> None:
            if method not in methods:
                error = wire.A2AError(
                    "InvalidRequest", f"{method} is not allowed here (use {methods[0]})", status=405
                )
                raise error

        encode = wire.sse
        if route in ("/message:send", "/message:stream"):
            only("POST")
            send = wire.SendRequest(await self._body(request))
            live = await self.tasks.send(send)
            if route == "/message:stream":
                return self._stream(live, encode)
            return _json(await self._sent(live, send))
        if route.startswith("/tasks/") and len(route) > len("/tasks/"):
            task_id, _, verb = route[len("/tasks/") :].rpartition(":")
            if verb not in ("cancel", "subscribe"):
                task_id, verb = route[len("/tasks/") :], ""
            else:  # closing: 503, nothing canceled (as a send)
                self._check_not_closing(verb == "subscribe")
            if verb == "cancel":
                only("POST")
                return _json((await self.tasks.cancel(task_id)).snapshot())
            if verb == "subscribe":
                only("GET", "POST")
                return self._subscribe(await self.tasks.find(task_id), encode)
            only("GET", "HEAD")
            _, history_length = wire.task_request(
                {"id": task_id, "historyLength": request.query_params.get("historyLength")}
            )
            return _json((await self.tasks.find(task_id)).snapshot(history_length))
        if route in ("/tasks", "/extendedAgentCard") or "/pushNotificationConfigs" in route:
            raise wire.A2AError("UnsupportedOperation", f"{route} is not served by this agent")
        raise wire.A2AError("MethodNotFound", f"no route {path!r}")

    # -- answers ----------------------------------------------------------------------------

    async def _sent(self, live: LiveTask, send: wire.SendRequest) -> dict[str, Any]:
        """``SendMessageResponse``: the task once it is over or waits for input (at once
        with ``returnImmediately``); a client that leaves meanwhile leaves the task on."""
        if not send.return_immediately:
            await live.wait_settled()
        return {"task": live.snapshot(send.history_length)}

    def _stream(self, live: LiveTask, encode: Callable[[dict[str, Any]], bytes]) -> EventStream:
        return EventStream(
            encode({"task": live.snapshot()}), live.follow(live.cursor), encode, self.state
        )

    def _check_not_closing(self, subscribe: bool) -> None:
        """Raise :class:`~runtime.errors.HostClosed` (503) for a cancel or subscribe the
        closing server refuses: on an embedded host both (its turns are being stopped);
        on a worker deployment's front end a subscribe only (a stream it would cut: read
        it on another), a cancel being one write to the store, done wherever it comes
        (:meth:`runtime.app.web.frontend.FrontEnd.close`)."""
        front = self.state.front
        if front is None:
            self.state.host.check_not_closing()
        elif subscribe:
            front.check_open()

    def _subscribe(self, live: LiveTask, encode: Callable[[dict[str, Any]], bytes]) -> EventStream:
        if live.state in wire.TERMINAL and not live.running:
            raise wire.A2AError(
                "UnsupportedOperation",
                f"task {live.id!r} is in a terminal state ({live.state}): nothing more to stream",
            )
        return self._stream(live, encode)


def a2a_endpoint(state: Any, *, token: str | None) -> tuple[A2AEndpoint, Callable[[str], int]]:
    """The A2A endpoint over the app's ``state`` (mounted by
    :func:`runtime.app.web.protocols.mount_protocols`), and the function that cancels its
    running tasks (at shutdown)."""
    endpoint = A2AEndpoint(state, token)
    return endpoint, endpoint.tasks.cancel_all


__all__ = ["JSONRPC_PATH", "PREFIX", "A2AEndpoint", "a2a_endpoint"]
