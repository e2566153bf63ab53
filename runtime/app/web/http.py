"""The HTTP pieces every route module shares: JSON answers, API errors, path parameters.

:mod:`runtime.app.web.app` and :mod:`runtime.app.web.resume` both answer with these; keeping them
here lets the app import its route modules without those importing the app back.
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from runtime.errors import InvalidCursor, InvalidSessionId
from runtime.logging import get_logger
from runtime.redact import redact
from runtime.serde import utf8_dumps
from runtime.store import SessionPage, Store, list_page, validate_session_id


class ApiError(Exception):
    """An error answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # utf8_dumps: a stored error quoting half a character made a session's page a 500
    body = utf8_dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)
    return Response(body, status_code=status, headers=headers, media_type="application/json")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": message}, status, headers)


STORE_UNAVAILABLE = "the session store is unavailable; try again"
"""What a client is told when the session store fails under its request or stream: a
store's own text names its database (a host, a port, a file) and is the operator's."""


RELAY_UNAVAILABLE = "the live stream is unavailable just now; try again"
"""What a client is told when the relay (Redis) did not answer a front end's read, stop
or interrupt, in every protocol (the AI SDK's error chunk, AG-UI's ``RUN_ERROR``,
OpenAI's, MCP's, A2A's): the error itself names Redis's address (coredis's ``Unable to
establish a connection to host:port``), which is logged (:func:`relay_failed`), not
sent, as a store's error is (:func:`store_failed`)."""


STORE_REFUSED = (
    "the session store refused this message (a value it cannot hold, such as a NUL "
    "character); nothing was queued"
)
"""What a client is told when the store refuses its submit for no reason the queue
names (a 400): the store's own text (which can name its database) goes to the log."""


def store_failed(
    exc: Exception, event: str, *, told: str = STORE_UNAVAILABLE, **fields: Any
) -> str:
    """``told`` (:data:`STORE_UNAVAILABLE` unless given), the client's text for ``exc``
    (a store's error), once the whole error (redacted) is logged as ``event`` with
    ``fields``: the log has what went wrong, the client a stable sentence that names no
    part of the deployment."""
    get_logger("axon.web").warning(event, error=redact(str(exc)), **fields)
    return told


def relay_failed(exc: Exception, event: str = "frontend.relay_unavailable", **fields: Any) -> str:
    """:data:`RELAY_UNAVAILABLE`, once ``exc`` (a relay's error: it names Redis's address)
    is logged redacted as ``event`` with ``fields`` (:func:`store_failed`)."""
    return store_failed(exc, event, told=RELAY_UNAVAILABLE, **fields)


CLOSING_RETRY_AFTER = "5"
"""Seconds a client waits before sending again a request that reached a closing host:
the server restarting (or another one behind the same address) takes it then."""


FRONT_END_CLOSING = (
    "this front end is stopping: the turns run on the workers, another front end serves them"
)
"""Why a worker deployment's front end that is closing refuses new work and ends the
streams it serves (:meth:`runtime.app.web.frontend.FrontEnd.close`)."""


def closing_message(exc: Exception) -> str:
    """What a request whose turn entered as the host closed (``serve`` stopping:
    :class:`~runtime.errors.HostClosed`) is told: nothing of it ran or was stored."""
    return f"the server is shutting down ({exc}): nothing was stored; send it again shortly"


def closing_response(exc: Exception) -> Response:
    """503 with ``Retry-After`` for a request the closing host refused (the AI SDK
    endpoints' shape, ``{"error": message}``)."""
    return error_response(503, closing_message(exc), {"retry-after": CLOSING_RETRY_AFTER})


def busy_hint(session_id: str) -> str:
    """How a client waits for a busy session's turn, or stops it."""
    return (
        f"Stop the turn with POST /api/chat/{session_id}/stop, or wait until GET "
        f"/api/sessions/{session_id} says busy false (GET /api/chat/{session_id}/stream "
        "follows the turn where a relay runs), then send the message again"
    )


def busy_message(session_id: str, turn_id: str | None) -> str:
    """What a 409 for a message to a busy session (``--on-busy reject``) says: which turn
    runs, and how to wait for it or stop it before sending again."""
    running = f"turn {turn_id!r} runs" if turn_id is not None else "a turn runs"
    return f"session {session_id!r} is already running a turn ({running}). {busy_hint(session_id)}"


def session_id_param(value: Any) -> str:
    """A session id from a URL or body: a bad one is a 400, not a server error."""
    try:
        return validate_session_id(value)
    except InvalidSessionId as exc:
        raise ApiError(400, str(exc)) from None


PAGE_SIZE = 50
"""How many sessions ``GET /api/sessions`` answers without ``?limit=``."""
MAX_PAGE_SIZE = 500
"""The most ``?limit=`` may ask for: a larger one is a 400, not a slow answer."""


def _one_param(request: Request, name: str) -> str | None:
    values = request.query_params.getlist(name)
    if len(values) > 1:
        raise ApiError(400, f"{name} given {len(values)} times: give it once")
    return values[0] if values else None


def ui_view(request: Request) -> bool:
    """Whether ``GET /api/sessions/{id}`` was asked ``?view=ui``: its history as the AI
    SDK ``UIMessage`` s alone, without ``messages``. The page reads only ``ui_messages``,
    and both forms of a long history were ~1.9x the bytes of that one; API clients that
    read ``messages`` ask without the option and get the answer as before. Any other
    ``view`` is a 400, not the whole answer a typo would silently cost."""
    view = _one_param(request, "view")
    if view is not None and view != "ui":
        raise ApiError(400, f"invalid view {view[:40]!r}: ui, or no view for the whole answer")
    return view == "ui"


async def session_page(request: Request, store: Store) -> SessionPage:
    """The page of ``store``'s sessions ``GET /api/sessions?limit=N&cursor=C`` asks for
    (:data:`PAGE_SIZE` of them from the top without either). A limit that is not a whole
    number from 1 to :data:`MAX_PAGE_SIZE`, or a cursor not from an earlier answer's
    ``next_cursor``, is a 400."""
    raw_limit = _one_param(request, "limit")
    cursor = _one_param(request, "cursor")
    limit = PAGE_SIZE
    if raw_limit is not None:
        if not (raw_limit.isascii() and raw_limit.isdigit() and len(raw_limit) <= 6) or not (
            1 <= int(raw_limit) <= MAX_PAGE_SIZE
        ):
            raise ApiError(
                400, f"invalid limit {raw_limit[:40]!r}: a whole number from 1 to {MAX_PAGE_SIZE}"
            )
        limit = int(raw_limit)
    try:
        return await list_page(store, limit=limit, after=cursor or None)
    except InvalidCursor:
        raise ApiError(
            400,
            f"invalid cursor {(cursor or '')[:80]!r}: pass the next_cursor of an earlier "
            "answer, or no cursor for the first page",
        ) from None


def web_state(request: Request) -> Any:
    """The app's shared state (:class:`runtime.app.web.app.WebState`)."""
    return request.app.state.axon


def has_bearer(scope: Scope, token: bytes) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>`` (compared in
    constant time, so the comparison tells nothing of the token)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, credentials = value.partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(credentials.strip(), token):
                return True
    return False
