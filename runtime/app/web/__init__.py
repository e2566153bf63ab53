"""The web front (application layer): an AI SDK UI message stream API and its page.

Nothing here is imported by ``import runtime``: the web stack (Starlette, Hypercorn) is
loaded only by ``python -m runtime serve`` or by importing :mod:`runtime.app.web.app`.

* :mod:`runtime.app.web.ui_stream` maps :data:`~runtime.output.OutputChunk` s to UI message
  stream chunks and stored histories to UI messages (no web dependencies).
* :mod:`runtime.app.web.app` builds the ASGI app: ``create_app(host, agent, ...)``.
* :mod:`runtime.app.web.serve` is the ``serve`` command: a host and the app in one Trio run,
  served by Hypercorn's Trio worker.
* :mod:`runtime.app.web.guard` refuses what a browser page must not make the server do
  (foreign ``Host`` names, cross-origin writes); :mod:`runtime.app.web.writer` writes a
  stream so that a client that stops reading is dropped.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BODY_TIMEOUT",
    "DEFAULT_MAX_BODY",
    "DEFAULT_MAX_BODY_IN_FLIGHT",
    "SEND_TIMEOUT",
    "create_app",
]

DEFAULT_MAX_BODY = 48 << 20
"""Largest request body the app accepts, in bytes (48 MiB); bigger ones get 413. Room for
one message with the default media limits (32 MiB, as base64 data URLs 43 MiB) and its
text; the media limits themselves (413 with their own message) are the agent's."""

DEFAULT_MAX_BODY_IN_FLIGHT = 256 << 20
"""Request-body bytes the app holds at once, all requests together (256 MiB); a body that
would take more gets 503 with ``Retry-After`` and its connection closed. Each body is
bounded by :data:`DEFAULT_MAX_BODY` and :data:`BODY_TIMEOUT`, but not their sum: 10
clients each sending 40 MB of a 48 MiB body and stalling took ``serve`` from 56 to 368 MB
resident, and 100 would have needed ~4.8 GB. Room for five bodies of the largest size
at once, or thousands of ordinary chat requests."""

BODY_TIMEOUT = 30.0
"""Seconds a request body may take to arrive in full; after that 408 and the connection
is closed (a client that announces a body and never sends it holds nothing open)."""

SEND_TIMEOUT = 60.0
"""Seconds a stream waits for a client that takes no data before it drops the client and
cancels its turn (saved, marked interrupted)."""


def __getattr__(name: str) -> Any:  # Starlette loads only when the app is asked for
    if name == "create_app":
        from runtime.app.web.app import create_app

        return create_app
    raise AttributeError(f"module 'runtime.app.web' has no attribute {name!r}")
