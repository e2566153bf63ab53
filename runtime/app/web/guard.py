"""What a browser page must not be able to make the server do: the request guard.

The API runs an agent with tools and hands out stored conversations, on a loopback port
with no token by default. A browser is the attacker here: any page the user visits can
send requests to ``http://127.0.0.1:PORT``. :class:`RequestGuard` refuses, before any
endpoint runs:

* a ``Host`` that is not allowed (403), against **DNS rebinding**: a page on
  ``http://attacker.example:PORT`` whose name the attacker re-points to 127.0.0.1 is
  same-origin with the server as far as the browser knows, so it could read every
  response; its requests still carry ``Host: attacker.example:PORT``. Allowed are the
  loopback names (``localhost``, ``127.0.0.1`` and the rest of 127/8, ``[::1]``), IP
  addresses when the server is bound to a wildcard address (an IP literal cannot be
  rebound), and what ``allowed_hosts`` lists.
* a state-changing request (anything but GET, HEAD, OPTIONS) from another origin (403),
  against **CSRF**: a cross-origin ``<form>`` or ``no-cors`` fetch gets no response to
  read, but its request still runs a turn. Browsers say where a request comes from in
  ``Origin`` (and ``Sec-Fetch-Site``); it must be the page's own origin (the ``Host`` it
  was served from) or one of ``cors_origins``. Clients that are not browsers send
  neither header and pass.
* any request to the MCP endpoint (``/mcp``) from another origin, GET too (403): the
  MCP specification asks a server to refuse every request whose ``Origin`` is not
  allowed; its GET opens the stream of a session's messages from the server.
* a GET (or HEAD) under ``/api/``, ``/v1/`` or ``/a2a/`` from another origin (403), by
  the same rules: a page cannot read the answer, but its ``no-cors`` fetches still cost
  the server the work (a page of sessions, a session loaded) and their timing probes
  what is stored.
* a state-changing ``/api/`` request whose body is not ``application/json`` (415): a
  page can send ``text/plain`` or form bodies cross-origin without asking, but JSON needs
  a CORS preflight, which only the ``cors_origins`` pass.
* nothing of a GET or HEAD of ``/healthz`` (``host_free``): a liveness probe answers
  ``{"status":"ok"}`` whatever its ``Host``, so one sent with a name the server was not
  told of cannot have an orchestrator restart a healthy server
  (:mod:`runtime.app.web.health`). ``/readyz`` is checked as any other path.
* every WebSocket handshake (403): no endpoint speaks WebSocket.
* a request with both ``Content-Length`` and ``Transfer-Encoding`` (400, the connection
  closed): a proxy in front may frame its body otherwise than Hypercorn does, and the
  difference run as a second, smuggled request.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import orjson
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing: the Host check covers them, the Origin check does not."""

LOOPBACK_NAMES = frozenset({"localhost"})
WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", "[::]", ""})
"""Bind addresses that mean every address of the machine."""

ANY_HOST = "*"
"""An ``allowed_hosts`` entry that turns the Host check off (behind a proxy that checks)."""


def split_host(value: str) -> tuple[str, int | None]:
    """A ``Host`` header (or an ``allowed_hosts`` entry) as (lower-case name, port).

    IPv6 literals keep no brackets: ``[::1]:8000`` is ``("::1", 8000)``. A port that is
    not an ASCII number (``str.isdigit`` also takes ``²``, which ``int`` refuses), or
    anything after a bracketed literal but ``:port`` (``[::1].attacker.example``, an
    unclosed ``[::1``), makes the whole value the name, and so, matching nothing, refused.
    """
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value[1:].partition("]")
        if bracket and not rest:
            return name, None
        if bracket and rest.startswith(":") and is_number(rest[1:]):
            return name, int(rest[1:])
        return value, None
    name, colon, port = value.rpartition(":")
    if colon and is_number(port) and ":" not in name:
        return name.rstrip("."), int(port)
    return value.rstrip("."), None


def is_number(text: str) -> bool:
    """Whether ``text`` is a non-empty run of ASCII digits: what ``int`` reads and a
    header may carry (``"²".isdigit()`` is true, and ``int("²")`` raises)."""
    return text.isascii() and text.isdigit()


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def is_loopback(name: str) -> bool:
    """``localhost`` or a loopback address (name as :func:`split_host` gives it)."""
    if name in LOOPBACK_NAMES:
        return True
    ip = _ip(name)
    return ip is not None and ip.is_loopback


class HostPolicy:
    """Which ``Host`` headers the server answers (see the module docstring).

    ``allowed`` entries are host names or addresses, optionally with ``:port`` (then only
    that port matches); a wildcard address (``0.0.0.0``, ``::``) allows any IP address,
    ``*`` any host at all.
    """

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.any_host = False
        self.any_ip = False
        self.names: set[tuple[str, int | None]] = set()
        for entry in allowed:
            if entry.strip() == ANY_HOST:
                self.any_host = True
            elif entry.strip().lower() in WILDCARD_ADDRESSES:
                self.any_ip = True
            else:
                self.names.add(split_host(entry))

    def allows(self, host: str) -> bool:
        if self.any_host:
            return True
        name, port = split_host(host)
        if not name:
            return False
        if is_loopback(name) or (name, None) in self.names or (name, port) in self.names:
            return True
        return self.any_ip and _ip(name) is not None


API_READS = ("/api/", "/v1/", "/a2a/")
"""Where a GET (or HEAD) reads what the API holds (sessions, tasks) or costs the server
work: from another site it is refused as a state-changing request is (see
:func:`_reads_guarded`)."""


def _reads_guarded(method: str, path: str) -> bool:
    """Whether a safe-method request to ``path`` gets the origin check all the same: any
    to ``/mcp`` (its GET opens a session's message stream), a GET or HEAD under
    :data:`API_READS`. A page on another site cannot read the answer without CORS, but a
    ``no-cors`` fetch or an ``<img>`` still makes the browser send it: each
    ``GET /api/sessions`` a page of the store, each ``GET /api/sessions/{id}`` a session
    loaded, and its timing a probe of what is stored. The page itself (same origin), a
    ``cors_origins`` app (its fetches carry ``Origin``), the address bar
    (``Sec-Fetch-Site: none``) and clients that are not browsers are not refused.
    Preflights (OPTIONS) are not: they run nothing."""
    if path == "/mcp" or path.startswith("/mcp/"):
        return True
    return method in ("GET", "HEAD") and path.startswith(API_READS)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def is_json(content_type: str | None) -> bool:
    """``application/json``, with or without parameters (``; charset=utf-8``)."""
    if content_type is None:
        return False
    return content_type.split(";", 1)[0].strip().lower() == "application/json"


def refusal_body(path: str, message: str) -> dict[str, Any]:
    """A refusal in the error shape of the protocol ``path`` belongs to: OpenAI's for
    ``/v1/`` (:mod:`runtime.app.web.openai_compat`), A2A's for ``/a2a/``
    (:mod:`runtime.app.web.a2a`), so their SDKs read the reason, a JSON-RPC error for
    ``/mcp`` (:mod:`runtime.app.web.mcp_endpoint`); else
    ``{"error": message}``."""
    if path.startswith("/v1/"):
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
        return {"error": error}
    if path == "/a2a/jsonrpc":  # A2A's JSON-RPC binding (runtime.app.web.a2a)
        return {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    if path.startswith("/a2a/"):  # A2A's HTTP+JSON binding: a google.rpc.Status
        return {"error": {"code": 403, "status": "PERMISSION_DENIED", "message": message}}
    if path == "/mcp" or path.startswith("/mcp/"):  # a JSON-RPC error, as MCP's transport's
        return {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": message}}
    return {"error": message}


def cors_origin(value: str) -> str:
    """A ``cors_origins`` entry checked and written as browsers send ``Origin``
    (``scheme://host[:port]``, lower-case, no trailing slash); a :class:`ValueError`
    says why it cannot be one. ``*`` is refused: the API's GETs carry no token by
    default, so ``Access-Control-Allow-Origin: *`` let every page the user visited read
    every stored session (while its POSTs were still refused). So is ``null`` (any
    sandboxed frame or ``data:`` page sends it), and a path, which no ``Origin`` has."""
    text = value.strip()
    if text == "*":
        raise ValueError(
            "'*' would let every web page read every session: "
            "name the origins, for example http://localhost:3000"
        )
    parts = urlsplit(text)
    if (
        parts.scheme.lower() not in ("http", "https")
        or not parts.hostname
        or "@" in parts.netloc
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ValueError(
            f"{value!r} is not an origin (scheme://host[:port], for example http://localhost:3000)"
        )
    return f"{parts.scheme}://{parts.netloc}".lower()


class RequestGuard:
    """The ASGI middleware that refuses what :mod:`runtime.app.web.guard` describes, with a
    JSON ``{"error": ...}`` that says why."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_hosts: Iterable[str] = (),
        cors_origins: Iterable[str] = (),
        host_free: Iterable[str] = (),
    ) -> None:
        self.app = app
        self.hosts = HostPolicy(allowed_hosts)
        self.host_free = frozenset(host_free)
        """Paths whose safe-method requests skip the Host check: ``/healthz``, which
        answers the same to anyone (:mod:`runtime.app.web.health`)."""
        self.origins = {origin.rstrip("/").lower() for origin in cors_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            # No endpoint speaks WebSocket, and a handshake is a GET any page may send
            # to any origin: refused (403) before a route sees it. Mounted apps (/v1/,
            # /a2a/) were handed it past the Host and Origin checks and answered 404 or
            # 500.
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http":
            refusal = self.refusal(scope)
            if refusal is not None:
                status, message = refusal
                body = orjson.dumps(refusal_body(scope["path"], message))
                # A smuggled body's 400 closes the connection whatever is read of it
                # (runtime.app.web.app.CloseUnread keeps one whose body it drained).
                headers = {"connection": "close"} if status == 400 else None
                response = Response(
                    body, status_code=status, media_type="application/json", headers=headers
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """``(status, why)`` when the request must be refused, else ``None``."""
        if _header(scope, b"transfer-encoding") is not None and (
            _header(scope, b"content-length") is not None
        ):
            # Hypercorn (h11) frames such a body by Transfer-Encoding and kept the
            # connection open, so a proxy in front that framed it by Content-Length could
            # have the rest of the body read as a second, smuggled request. RFC 9112 6.1:
            # refuse it or close the connection after it; refused, Connection: close.
            return 400, (
                "a request with both Transfer-Encoding and Content-Length is refused "
                "(request smuggling protection)"
            )
        path = scope["path"]
        method = scope["method"]
        if path in self.host_free and method in ("GET", "HEAD"):
            return None
        host = _header(scope, b"host")
        if host is None:
            return 403, "the request has no Host header"
        if not self.hosts.allows(host):
            name = split_host(host)[0]
            return 403, (
                f"host {host!r} is not allowed (DNS rebinding protection); "
                f"serve with --allowed-host {name} to accept it"
            )
        if method in SAFE_METHODS and not _reads_guarded(method, path):
            return None
        origin = _header(scope, b"origin")
        if origin is not None:
            if not self._origin_allowed(origin, host):
                return 403, (
                    f"cross-origin request from {origin!r} refused (CSRF protection); "
                    "serve with --cors-origin to allow an origin"
                )
        elif (_header(scope, b"sec-fetch-site") or "none") not in ("same-origin", "none"):
            return 403, (
                "cross-site request refused (CSRF protection); "
                "serve with --cors-origin to allow an origin"
            )
        if (
            method not in SAFE_METHODS
            and path.startswith("/api/")
            and not is_json(_header(scope, b"content-type"))
        ):
            return 415, "the body must be sent as content-type: application/json"
        return None

    def _origin_allowed(self, origin: str, host: str) -> bool:
        origin = origin.strip().lower()
        if origin in self.origins:
            return True
        try:
            parts = urlsplit(origin)
        except ValueError:  # ("http://[::1": an unclosed IPv6 bracket) no origin of ours
            return False
        return parts.scheme in ("http", "https") and parts.netloc == host.strip().lower()


__all__ = [
    "HostPolicy",
    "RequestGuard",
    "cors_origin",
    "is_json",
    "is_loopback",
    "is_number",
    "split_host",
]
