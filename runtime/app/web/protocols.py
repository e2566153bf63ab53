"""Which outside protocols ``serve`` speaks: ``--protocols ai-sdk,ag-ui,openai,mcp``.

Every protocol is a thin adapter over the same session and turn machinery, behind the
same Host, Origin and token checks, and each is served by a worker deployment's front
end too, which queues its turns for the workers and reads them back from the relay
(:mod:`runtime.app.web.queued_turn`). :data:`PROTOCOLS` are the names the option accepts;
:data:`BUILT` the ones this version can mount: naming another is refused in one line
(:func:`unbuilt_refusal`) rather than served silently without it.

* ``ai-sdk``: the chat page at ``/`` and the ``/api/`` endpoints (AI SDK UI message
  stream, :mod:`runtime.app.web.app`);
* ``openai``: ``/v1/chat/completions`` and ``/v1/models``
  (:mod:`runtime.app.web.openai_compat`);
* ``ag-ui``: ``POST /ag-ui``, a ``RunAgentInput`` answered with AG-UI events
  (:mod:`runtime.app.web.agui`);
* ``a2a``: the Agent Card at ``/.well-known/agent-card.json`` and the A2A bindings under
  ``/a2a/`` (:mod:`runtime.app.web.a2a`);
* ``mcp``: the agent as an MCP tool over streamable HTTP at ``/mcp``
  (:mod:`runtime.app.web.mcp_endpoint`).
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Collection
from contextlib import asynccontextmanager
from typing import Any

import attrs

from runtime.extras import require_mcp

PROTOCOLS: tuple[str, ...] = ("ai-sdk", "ag-ui", "a2a", "openai", "mcp")
"""Every protocol name ``--protocols`` knows."""

BUILT: frozenset[str] = frozenset({"ai-sdk", "ag-ui", "a2a", "openai", "mcp"})
"""The protocols this version serves."""

DEFAULT: tuple[str, ...] = ("ai-sdk",)

MCP_SESSION_IDLE = 600.0
"""Seconds an MCP session (``/mcp``) lives with no request in flight: the ``mcp``
package's default is 30 minutes, for a session that costs little but that a client that
left without its ``DELETE`` never ends."""

MCP_MAX_SESSIONS = 1000
"""MCP sessions held at once (the package's default: 10,000)."""

MCP_STREAM_MAX_AGE = 300.0
"""Seconds a session's GET stream is kept open before it is ended (the client opens
another, as SSE clients do): the package counts an open GET stream as a request in
flight, so a session whose client held one open, read or not, never idled out."""


@attrs.frozen(kw_only=True, slots=True)
class MCPLimits:
    """The bounds of ``/mcp``'s sessions (``serve --mcp-session-idle``,
    ``--mcp-max-sessions``, ``--mcp-stream-max-age``; ``create_app(mcp_limits=)``).
    ``None``: no bound. There is no per-client bound: the app knows no client identity
    (``--token`` is one token for every client), so one client can open
    ``max_sessions`` sessions and the next is answered 503 until some expire."""

    session_idle: float | None = MCP_SESSION_IDLE
    max_sessions: int | None = MCP_MAX_SESSIONS
    stream_max_age: float | None = MCP_STREAM_MAX_AGE


def parse_protocols(value: str) -> tuple[str, ...]:
    """``--protocols``' value (comma-separated names, each once) as a tuple; an unknown
    or empty name is an :class:`argparse.ArgumentTypeError`."""
    names = [name.strip().lower() for name in value.split(",")]
    for name in names:
        if name not in PROTOCOLS:
            raise argparse.ArgumentTypeError(
                f"unknown protocol {name!r} (choose from {', '.join(PROTOCOLS)})"
            )
    return tuple(dict.fromkeys(names))


def unbuilt_refusal(protocols: Collection[str]) -> str | None:
    """Why ``protocols`` cannot be served (``None``: they can): one names a protocol this
    version does not have yet."""
    missing = [name for name in protocols if name not in BUILT]
    if not missing:
        return None
    return (
        f"--protocols {', '.join(missing)}: not available in this version "
        f"(available: {', '.join(sorted(BUILT))})"
    )


def mount_protocols(
    app: Any, state: Any, protocols: Collection[str], *, token: str | None, stream: Any
) -> None:
    """Keep or add the routes of ``protocols`` on ``app`` (made by
    :func:`runtime.app.web.app.create_app` with the ``ai-sdk`` routes). ``stream`` is the
    app's turn-streaming response class, which the other protocols stream through with
    their own encoders (passed in: importing the app from here would be a cycle)."""
    refusal = unbuilt_refusal(protocols)
    if refusal is not None:
        raise ValueError(refusal)
    if "ai-sdk" not in protocols:
        app.router.routes.clear()
    # Here, not at the top: serve's argument parsing imports this module, and must not
    # pay for Starlette and the adapters (as runtime.app.web.serve's own imports).
    if "ag-ui" in protocols:
        from starlette.routing import Route

        from runtime.app.web.agui import PATH, agui_endpoint

        run = agui_endpoint(state, token=token, stream=stream)
        app.router.routes.append(Route(PATH, run, methods=["POST"]))
    if "openai" in protocols:
        from starlette.routing import Mount

        from runtime.app.web.openai_compat import openai_endpoint

        endpoint, cancel_turns = openai_endpoint(state, token=token, stream=stream)
        app.router.routes.append(Mount("/v1", app=endpoint))
        # turns run outside the app's host: serve cancels them too when it shuts down
        app.state.turn_cancellers = [*getattr(app.state, "turn_cancellers", ()), cancel_turns]
    if "a2a" in protocols:
        from starlette.routing import Mount, Route

        from actors.a2a.wire import CARD_PATH
        from runtime.app.web.a2a import PREFIX, a2a_endpoint

        a2a, _cancel_tasks = a2a_endpoint(state, token=token)
        app.router.routes.append(Route(CARD_PATH, a2a.card, methods=["GET"]))
        app.router.routes.append(Mount(PREFIX, app=a2a))
        # its tasks run on the app's host, whose shutdown cancels them with the rest
    if "mcp" in protocols:
        _mount_mcp(app, state, token=token)


def _mount_mcp(app: Any, state: Any, *, token: str | None) -> None:
    """``/mcp`` (:mod:`runtime.app.web.mcp_endpoint`), its transport run for the app's
    lifespan (wrapped around the app's own, inside it)."""
    from starlette.routing import Route  # as for openai: only when serving

    require_mcp("--protocols mcp")
    from runtime.app.web.mcp_endpoint import PATH, MCPEndpoint

    endpoint = MCPEndpoint(state, token=token)
    app.router.routes.append(Route(PATH, endpoint=endpoint))
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(started: Any) -> AsyncIterator[Any]:
        async with inner(started) as value, endpoint.running():
            yield value

    app.router.lifespan_context = lifespan


__all__ = [
    "BUILT",
    "DEFAULT",
    "PROTOCOLS",
    "MCPLimits",
    "mount_protocols",
    "parse_protocols",
    "unbuilt_refusal",
]
