"""The web front: an HTTP API that speaks the Vercel AI SDK UI message stream, and a page.

Nothing here is imported by ``import runtime``: the web stack (Starlette, Hypercorn) is
loaded only by ``python -m runtime serve`` or by importing :mod:`runtime.web.app`.

* :mod:`runtime.web.protocol` maps :data:`~runtime.output.OutputChunk` s to UI message
  stream chunks and stored histories to UI messages (no web dependencies).
* :mod:`runtime.web.app` builds the ASGI app: ``create_app(host, agent, ...)``.
* :mod:`runtime.web.serve` is the ``serve`` command: a host and the app in one Trio run,
  served by Hypercorn's Trio worker.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_MAX_BODY", "create_app"]

DEFAULT_MAX_BODY = 1 << 20
"""Largest request body the app accepts, in bytes (1 MiB); bigger ones get 413."""


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from runtime.web.app import create_app

        return create_app
    raise AttributeError(f"module 'runtime.web' has no attribute {name!r}")
