"""``python -m runtime serve``: the web UI and the AI SDK chat API, in one Trio run.

    python -m runtime serve                                  # offline demo agent
    python -m runtime serve --store sessions.db --port 8000
    python -m runtime serve --provider openai --model gpt-4o-mini --token s3cret
    python -m runtime serve --agent myapp.agents:support     # your own Agent

A :class:`~runtime.app.host.Host` and the Starlette app (:mod:`runtime.app.web.app`) share one
Trio run: Hypercorn's Trio worker serves the app, so each request's turn runs in the
same Trio world as the host's actors. Binds to 127.0.0.1 unless ``--host`` says
otherwise; a non-loopback address needs ``--token`` (or ``--insecure``).
SIGINT/SIGTERM stop it gracefully: running turns end with ``abort`` ("server shutdown")
and are saved, marked interrupted.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from contextlib import AsyncExitStack
from functools import partial
from typing import Any, TextIO

import trio

from actors.relays import RedisRelay, attach_relay
from actors.relays.redis_streams import public_url
from actors.stores import require_driver, turn_queue
from runtime.app.commands import (
    MCP_HELP,
    add_agent_arguments,
    add_input_limit_arguments,
    add_log_level_argument,
    add_plugin_argument,
    command_collector,
    input_limits,
    make_agent,
    make_plugins,
    non_negative,
    positive,
    program_name,
    report_bad_input,
)
from runtime.app.host import Host
from runtime.app.unsaved import told_end
from runtime.app.web import (
    BODY_TIMEOUT,
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_BODY_IN_FLIGHT,
    SEND_TIMEOUT,
)
from runtime.app.web.protocols import DEFAULT as DEFAULT_PROTOCOLS
from runtime.app.web.protocols import (
    MCP_MAX_SESSIONS,
    MCP_SESSION_IDLE,
    MCP_STREAM_MAX_AGE,
    MCPLimits,
    parse_protocols,
    unbuilt_refusal,
)
from runtime.app.web.signing import (
    REQUIRE_ENV,
    SECRET_ENV,
    SECRET_FILE_ENV,
    SECRET_SOURCES,
    SIGNING_CLIENTS,
)
from runtime.busy import STRATEGIES
from runtime.errors import ConfigurationError, RelayUnavailable, reraise, sole_exception
from runtime.logging import QuietStream, configure_logging, get_logger, unblocked
from runtime.redact import redact_text, redact_url
from runtime.turn_queue import TurnQueue

DEFAULT_PORT = 8000
TOKEN_ENV = "AXON_WEB_TOKEN"
DEFAULT_SESSION_TTL = 15 * 60.0
"""Seconds an idle session stays in memory (its history stays in the store)."""
DEFAULT_MAX_SESSIONS = 1000
"""Sessions kept in memory at most; the least recently used idle ones are evicted."""


def _origin(value: str) -> str:
    """A ``--cors-origin``: an origin, not ``*`` (:func:`runtime.app.web.guard.cors_origin`)."""
    # Here, not at the top: the guard imports Starlette, which every command's parser
    # (built at start-up, ``run`` too) would then pay for; only ``serve`` parses this.
    from runtime.app.web.guard import cors_origin

    try:
        return cors_origin(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _cap(value: str) -> int:
    """A queue cap on the command line: a positive integer, or ``off`` (0: no cap)."""
    if value.strip().lower() == "off":
        return 0
    return int(positive(int)(value))


def queue_caps(args: argparse.Namespace) -> dict[str, Any]:
    """The turn queue's caps ``serve``'s options set (:func:`actors.stores.turn_queue`): only
    those given (the queue's defaults otherwise), ``off`` as ``None``."""
    given = {
        "max_queued_per_session": args.max_queued_per_session,
        "max_queued": args.max_queued,
    }
    return {name: (value or None) for name, value in given.items() if value is not None}


def _embedded_cap(args: argparse.Namespace) -> dict[str, Any]:
    """``--max-queued-per-session`` for the embedded app (its default unless given;
    ``off``: no cap). It was a front end's option only, and ignored without a word."""
    given = getattr(args, "max_queued_per_session", None)
    return {} if given is None else {"max_queued_per_session": given or None}


def mcp_limits(args: argparse.Namespace) -> MCPLimits:
    """The bounds of ``/mcp``'s sessions ``serve``'s options set (``off``: no cap)."""
    return MCPLimits(
        session_idle=args.mcp_session_idle,
        max_sessions=args.mcp_max_sessions or None,
        stream_max_age=args.mcp_stream_max_age,
    )


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``serve`` options to ``parser`` (imports nothing of the web stack)."""
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    add(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"port (default {DEFAULT_PORT}; 0: any free port)",
    )
    add_agent_arguments(parser)
    _add_session_arguments(parser)
    _add_deployment_arguments(parser)
    _add_access_arguments(parser)
    _add_limit_arguments(parser)
    add_log_level_argument(parser, "warning")
    add(
        "--otel",
        action="store_true",
        help="export OpenTelemetry traces, configured by the OTEL_* variables "
        "(docs/telemetry.md; --plugin otel)",
    )
    add_plugin_argument(parser)
    parser.set_defaults(jsonl=False)
    return parser


def _add_session_arguments(parser: argparse.ArgumentParser) -> None:
    """What a session runs with: the demo's pace, the store, MCP servers."""
    add = parser.add_argument
    add(
        "--delay",
        type=non_negative(float),
        default=0.02,
        help="scripted demo: seconds between chunks, so the page shows it typing (default 0.02)",
    )
    add(
        "--store",
        default=None,
        help="session store: an SQLite file or a postgresql:// URL (default: memory)",
    )
    add("--mcp", action="append", default=[], metavar="SERVER", help=MCP_HELP)


def _add_deployment_arguments(parser: argparse.ArgumentParser) -> None:
    """The relay, what a message for a busy session does, and the front end of a worker
    deployment with its queue caps."""
    add = parser.add_argument
    add(
        "--redis",
        default=None,
        metavar="URL",
        help="publish turns live to this Redis (redis://host:port/db) so any front end can "
        "stream, resume or stop them (docs/relay.md)",
    )
    add(
        "--redis-prefix",
        default=None,
        metavar="PREFIX",
        help="key prefix of the relay's streams (default 'axon:'; workers must agree)",
    )
    add(
        "--on-busy",
        choices=STRATEGIES,
        default=None,
        help="what a message for a session whose turn runs does: reject it (409), enqueue "
        "its turn after the running one, interrupt the running turn, or steer it (the "
        "message joins it at its next step) (default: the agent's on_busy, reject; as a "
        "front end of workers, enqueue; docs/approval.md)",
    )
    add(
        "--run-turns-here",
        action="store_true",
        help="with a postgresql:// --store and --redis, run turns in this process as "
        f"without them, instead of serving as a front end of `{program_name()} worker`s",
    )
    add(
        "--max-queued-per-session",
        type=_cap,
        default=None,
        metavar="N",
        help="refuse a message (429 with Retry-After) when N messages of its session wait "
        "for its running turn already (default 100; 'off': no cap)",
    )
    add(
        "--max-queued",
        type=_cap,
        default=None,
        metavar="N",
        help="front end: refuse a turn (429 with Retry-After) when N turns are queued in "
        "all (default 10000; 'off': no cap)",
    )


def _add_access_arguments(parser: argparse.ArgumentParser) -> None:
    """Who may call what: the protocols served, the token, origins and host names."""
    add = parser.add_argument
    add(
        "--protocols",
        type=parse_protocols,
        default=DEFAULT_PROTOCOLS,
        metavar="NAMES",
        help="the protocols to serve, comma-separated: ai-sdk (the page and /api/), ag-ui "
        "(POST /ag-ui), openai (/v1/chat/completions, /v1/models), a2a (the Agent Card and "
        "/a2a/), mcp (the agent as an MCP tool at /mcp) (default: ai-sdk; docs/protocols.md)",
    )
    add(
        "--token",
        default=None,
        help="require 'Authorization: Bearer TOKEN' on /api/ and the protocols' endpoints "
        f"(/v1/, /a2a/, /ag-ui, /mcp), not the probes /healthz and /readyz (or set ${TOKEN_ENV})",
    )
    add(
        "--approval-secret",
        default=None,
        metavar="SECRET",
        help="sign the AI SDK's tool approval requests (HMAC) and refuse a continuation "
        "whose signature does not verify; the same on every front end of a worker "
        f"deployment (or set ${SECRET_ENV}; or --approval-secret-file or ${SECRET_FILE_ENV}, "
        "which ps does not show; an option overrides both variables; default: nothing "
        "signed; docs/approval.md)",
    )
    add(
        "--approval-secret-file",
        default=None,
        metavar="PATH",
        help="read the --approval-secret from the file PATH, once at start (its trailing "
        f"newline left out): unlike the option it does not show in ps (or set "
        f"${SECRET_FILE_ENV}=PATH)",
    )
    add(
        "--require-approval-signature",
        action="store_true",
        help="with an approval secret, refuse (403) an AI SDK approval answer that carries "
        f"no signature ({SIGNING_CLIENTS} send it back; older ones cannot answer); AG-UI, "
        f"A2A and session.respond carry none and are not affected (or set ${REQUIRE_ENV}=1; "
        "default: an unsigned answer is checked against the store alone)",
    )
    add(
        "--cors-origin",
        action="append",
        type=_origin,
        default=[],
        metavar="ORIGIN",
        help="allow this browser origin to call the API (repeatable; default none)",
    )
    add(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="also answer requests for this Host name, e.g. behind a proxy (repeatable; "
        "default: loopback names and the --host address; '*': any)",
    )
    add(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without --token",
    )


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """What one request, one client and the memory may take."""
    add = parser.add_argument
    add(
        "--max-body",
        type=positive(int),
        default=DEFAULT_MAX_BODY,
        help=f"largest request body, bytes (default {DEFAULT_MAX_BODY}: "
        f"{DEFAULT_MAX_BODY / 2**20:g} MiB, room for attachments)",
    )
    add(
        "--max-body-bytes-in-flight",
        metavar="BYTES",
        type=positive(int),
        default=DEFAULT_MAX_BODY_IN_FLIGHT,
        help="request-body bytes read at once, all requests together; a body that would "
        "pass it gets 503 with Retry-After and its connection closed, so clients "
        "stalling mid-body cannot take the server's memory (default "
        f"{DEFAULT_MAX_BODY_IN_FLIGHT}: {DEFAULT_MAX_BODY_IN_FLIGHT / 2**20:g} MiB)",
    )
    add_input_limit_arguments(parser)
    add(
        "--session-ttl",
        type=positive(float),
        default=DEFAULT_SESSION_TTL,
        metavar="SECONDS",
        help="free a session idle this long from memory; it reloads from the store on its "
        f"next use (default {DEFAULT_SESSION_TTL:g})",
    )
    add(
        "--max-sessions",
        type=positive(int),
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help="keep at most N sessions in memory, freeing the least recently used idle ones "
        f"(default {DEFAULT_MAX_SESSIONS})",
    )
    add(
        "--gc-pacing",
        action="store_true",
        help="pace the garbage collector from the event loop (Host.open(gc_pacing=True)): "
        "for long histories (a body of 600,000 messages brought collections of 0.3-0.8 s); "
        "costs 6-7%% more CPU on short turns. docs/embedding.md",
    )
    add(
        "--max-connections",
        type=_cap,
        default=None,
        metavar="N",
        help="hold at most N connections; one more is answered 503 (Retry-After) and closed "
        "at once, with one log line a minute while it lasts, so held or idle connections "
        "cannot run the server out of file descriptors (default: half the open-file "
        "limit, which serve raises to the hard one; 'off': no cap)",
    )
    add(
        "--max-connections-per-address",
        type=_cap,
        default=None,
        metavar="N",
        help="hold at most N connections from one client address (an IPv6 /64), counted by "
        "the socket's address, never X-Forwarded-For; one more is answered 503 as past "
        "--max-connections (default: a quarter of --max-connections; 'off' behind a "
        "reverse proxy, whose connections all come from its address: limit clients there)",
    )
    add(
        "--drain",
        type=non_negative(float),
        default=0.0,
        metavar="SECONDS",
        help="at SIGTERM, answer GET /readyz 503 (draining) and go on serving for SECONDS "
        "before stopping, so a load balancer stops sending first (a second signal stops at "
        "once; default 0: /readyz says 503 while the running requests end)",
    )
    add(
        "--body-timeout",
        type=positive(float),
        default=BODY_TIMEOUT,
        help=f"seconds a request body may take to arrive (default {BODY_TIMEOUT:g})",
    )
    add(
        "--send-timeout",
        type=positive(float),
        default=SEND_TIMEOUT,
        help="seconds a stream waits for a client that takes no data before dropping it "
        "and cancelling its turn; every other write to a connection (an error answer "
        f"too) is bounded by it as well (default {SEND_TIMEOUT:g})",
    )
    add(
        "--mcp-session-idle",
        type=positive(float),
        default=MCP_SESSION_IDLE,
        metavar="SECONDS",
        help="with --protocols mcp: end an MCP session after SECONDS with no request in "
        "flight, one whose client left without its DELETE among them (the client opens "
        f"another after its 404; default {MCP_SESSION_IDLE:g})",
    )
    add(
        "--mcp-max-sessions",
        type=_cap,
        default=MCP_MAX_SESSIONS,
        metavar="N",
        help="with --protocols mcp: hold at most N MCP sessions; one more is answered 503 "
        "(Retry-After) until some end; there is no per-client cap, one token serving "
        f"every client (default {MCP_MAX_SESSIONS}; 'off': no cap)",
    )
    add(
        "--mcp-stream-max-age",
        type=positive(float),
        default=MCP_STREAM_MAX_AGE,
        metavar="SECONDS",
        help="with --protocols mcp: end a session's GET stream after SECONDS (the client "
        "opens another), so a session whose client holds one open, read or not, can still "
        f"expire (default {MCP_STREAM_MAX_AGE:g})",
    )


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``serve`` sub-command on ``build_parser()``'s subparsers."""
    parser = subparsers.add_parser(
        "serve",
        help="serve the web UI and an AI SDK (useChat) compatible chat API",
        description="Serve the chat page and POST /api/chat (Vercel AI SDK UI message stream).",
    )
    return add_serve_arguments(parser)


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def bind_address(host: str) -> str:
    """The address binding ``host`` takes, resolved as Hypercorn binds it (IPv6 when the
    name holds a ``:``, else IPv4; the first answer); ``OSError`` when it names none."""
    name = host.replace("[", "").replace("]", "")
    family = socket.AF_INET6 if ":" in name else socket.AF_INET
    infos = socket.getaddrinfo(name or None, 0, family, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    return str(infos[0][4][0])


def _is_loopback(host: str) -> bool:
    """Whether ``host`` binds a loopback address: decided on the address it resolves to,
    not its spelling (``127.0.0.1.`` resolves to nothing, ``127.example`` to anything)."""
    try:
        address = bind_address(host)
    except OSError:
        return False
    return ipaddress.ip_address(address.partition("%")[0]).is_loopback


def bind_problem(host: str, port: int) -> str | None:
    """Why ``host``:``port`` cannot be bound (``None``: it can), found by binding it as
    Hypercorn will, then letting go: a name that resolves to no address
    (``127.0.0.1.``), an address this machine does not have, a port in use. Said in one
    line before anything starts, instead of a traceback from inside the server."""
    try:
        address = bind_address(host)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((address, port))
    except (OSError, OverflowError) as exc:
        return f"cannot serve on {_bind(host, port)}: {bind_reason(exc)}"
    return None


def bind_reason(exc: BaseException) -> str:
    """Why a bind failed, and for a port in use what to do about it."""
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        reason += " (another server listens there: pass --port N, or --port 0 for a free one)"
    return reason


def bind_refusal(host: str, token: str | None, insecure: bool) -> str | None:
    """Why ``serve`` must not bind ``host`` (``None``: it may): a non-loopback address
    with no token lets anyone who reaches it run the agent and its tools."""
    if _is_loopback(host) or token or insecure:
        return None
    return (
        f"refusing to serve on {host} without --token: anyone who can reach it could run "
        f"the agent and its tools and read every session. Set --token (or ${TOKEN_ENV}), "
        "or pass --insecure to serve it open anyway."
    )


async def _until_signal(drain: float = 0.0, on_signal: Any = None) -> None:
    """Return at SIGINT/SIGTERM; with ``drain`` seconds, ``on_signal()`` is called at the
    signal and the return waits that long more (a second signal cuts it short), the
    server still serving meanwhile: ``/readyz`` answers 503 ``draining`` from the signal
    on, so a load balancer has time to see it and send no more before the server stops
    (docs/deployment.md, "Health checks")."""
    if threading.current_thread() is not threading.main_thread():
        await trio.sleep_forever()  # signals reach only the main thread
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            break
        if on_signal is not None:
            on_signal()
        if drain > 0:
            log = get_logger("axon.web")
            log.warning(
                "web.draining",
                seconds=drain,
                hint="/readyz answers 503 draining; requests are still served until the "
                "drain ends (a second signal ends it now)",
            )
            with trio.move_on_after(drain) as waited:
                async for _ in signals:
                    break
            log.warning("web.drained", seconds=drain, cut_short=not waited.cancelled_caught)


async def serve_app(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    shutdown_trigger: Any = None,
    access_log: bool = False,
    max_connections: int | None = None,
    max_connections_per_address: int | None = None,
    send_timeout: float | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with Hypercorn's Trio worker in the current Trio run until
    ``shutdown_trigger()`` returns (or the caller cancels); ``task_status`` gets the bound
    URLs (``port=0`` picks a free port). An address it cannot bind (in use, not this
    machine's) is the ``OSError`` itself, not wrapped in Hypercorn's exception groups.
    At most ``max_connections`` connections are held (``None``: no cap); one more is
    answered a 503 and closed at once (:class:`~runtime.app.web.connections.ConnectionCap`),
    and with it at most ``max_connections_per_address`` from one address (an IPv6 /64).
    ``send_timeout`` is the app's deadline for a client that takes no data (``None``:
    none); a write its client takes nothing of for about twice that closes the
    connection, whoever wrote it (:class:`~runtime.app.web.connections.CappedConfig`)."""
    from hypercorn.trio import serve  # Hypercorn: only when serving

    from runtime.app.web.connections import (
        CappedConfig,
        ConnectionCap,
        release_connections_on_close,
    )

    release_connections_on_close()  # a closed connection's socket freed at once
    config = CappedConfig()
    cap = (
        None
        if max_connections is None
        else ConnectionCap(max_connections, max_connections_per_address)
    )
    config.connection_cap = cap
    config.send_timeout = send_timeout or None
    config.bind = [_bind(host, port)]
    config.accesslog = _hypercorn_logger("access", sys.stdout) if access_log else None
    config.errorlog = _hypercorn_logger("error", sys.stderr)
    config.graceful_timeout = 5.0
    config.include_server_header = False
    try:
        if cap is None:
            await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
        else:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cap.report_held)  # refusals held logged, at the end too
                await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:  # Hypercorn's nurseries wrap e.g. a bind's OSError
        sole = sole_exception(group)
        if sole is None:
            raise
        reraise(sole)


def _hypercorn_logger(kind: str, stream: TextIO) -> logging.Logger:
    """Hypercorn's ``hypercorn.KIND`` logger as its ``"-"`` makes it (a line a record, on
    ``stream``), written without ever blocking the event loop
    (:func:`runtime.logging.unblocked`): with stdout a pipe nobody read, the access log's
    line of each request filled it and the next request's line blocked the loop, every
    request and turn stalled (28 requests on a 4 KiB pipe, 500 on a 64 KiB one). A stream
    that is gone drops its lines (:class:`~runtime.logging.QuietStream`). Its lines are
    redacted (:class:`_RedactingFormatter`)."""
    logger = logging.getLogger(f"hypercorn.{kind}")
    handler = logging.StreamHandler(QuietStream.around(unblocked(stream)))
    handler.setFormatter(
        _RedactingFormatter(
            "%(asctime)s [%(process)d] [%(levelname)s] %(message)s", "[%Y-%m-%d %H:%M:%S %z]"
        )
    )
    logger.handlers = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    if kind == "access":
        logger.filters = [_probe_filter]
    return logger


PROBES = frozenset({"/healthz", "/readyz"})


def _probe_filter(record: logging.LogRecord) -> bool:
    """Whether an access-log line is written: not that of a health probe answered 200
    (one every few seconds from every load balancer and orchestrator, at ``info``)."""
    atoms = record.args
    if isinstance(atoms, Mapping) and atoms.get("U") in PROBES and str(atoms.get("s")) == "200":
        return False
    return True


class _RedactingFormatter(logging.Formatter):
    """A Hypercorn log line with its credentials replaced (:func:`runtime.redact.redact_text`),
    traceback included: Hypercorn logs a route's unhandled exception ("Error in ASGI
    Framework") with its traceback, and the exception's text went to stderr as it was, a
    key an upstream error quoted with it; the access log's request line carries the query
    string (``?api_key=...``). Axon's own lines are redacted by its logging set-up."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def is_front_end(args: argparse.Namespace) -> bool:
    """Whether ``serve`` is a stateless front end of a worker deployment: its sessions in
    PostgreSQL, its live output on a relay, and not told to run turns itself."""
    store = str(args.store or "")
    return (
        store.startswith(("postgresql://", "postgres://"))
        and bool(args.redis)
        and not args.run_turns_here
    )


async def serve_command(args: argparse.Namespace) -> int:
    """Run the ``serve`` command: a host, the app, until SIGINT/SIGTERM; the process's
    collector at :data:`~runtime.app.commands.COMMAND_GC_THRESHOLDS` meanwhile."""
    token = args.token or os.environ.get(TOKEN_ENV) or None
    protocols = getattr(args, "protocols", DEFAULT_PROTOCOLS)
    refusal = _refusal(args, token, protocols)
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    try:
        approvals = approval_settings(args)  # (read once, before anything starts)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    warning = unsigned_decisions_warning(approvals[1], protocols)
    if warning is not None:
        print(f"warning: {warning}", file=sys.stderr)
    configure_logging(args.log_level)
    from runtime.app.web.connections import raise_open_file_limit  # imports Hypercorn

    raise_open_file_limit()  # room for connections: not the 1,024 of most systems' default
    with command_collector():
        return await _run_serve_command(args, token, protocols, approvals)


async def _run_serve_command(
    args: argparse.Namespace,
    token: str | None,
    protocols: Any,
    approvals: tuple[str | bytes | None, bool] = (None, False),
) -> int:
    from runtime.app.web.app import create_app  # Starlette: only when serving

    agent = make_agent(args)
    if not _is_loopback(args.host) and not token:
        print(
            f"warning: serving on {args.host} with no --token (--insecure): anyone who can "
            "reach it can run the agent",
            file=sys.stderr,
        )
    try:
        plugins = make_plugins(args)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    async with AsyncExitStack() as stack:
        try:
            require_driver(args.store)  # a missing extra said before Redis is tried for seconds
            relay = await _open_relay(stack, args)
        except (ConfigurationError, RelayUnavailable) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        host = await stack.enter_async_context(
            Host.open(
                store=args.store,
                idle_ttl=args.session_ttl,
                max_sessions=args.max_sessions,
                input_limits=input_limits(args),
                gc_pacing=args.gc_pacing,
            )
        )
        queue = await _start_deployment(stack, args, host, relay, plugins)
        app = create_app(
            host,
            agent,
            token=token,
            cors_origins=args.cors_origin,
            max_body=args.max_body,
            max_body_in_flight=args.max_body_bytes_in_flight,
            allowed_hosts=[args.host, *args.allowed_host],
            body_timeout=args.body_timeout,
            send_timeout=args.send_timeout,
            relay=relay,
            queue=queue,
            protocols=protocols,
            on_busy=getattr(args, "on_busy", None),
            mcp_limits=mcp_limits(args),
            approval_secret=approvals[0],
            require_approval_signature=approvals[1],
            **_embedded_cap(args),
        )
        served = _served(args, front_end=queue is not None, plugins=plugins)
        return await _serve_until_signal(app, host, args, served, protocols=protocols)


UNSIGNED_DECISIONS = ("ag-ui", "a2a")
"""The protocols that decide approvals with no signature to require (docs/approval.md)."""


def unsigned_decisions_warning(required: bool, protocols: Any) -> str | None:
    """What ``serve`` says at start when it requires signed approvals and serves a
    protocol whose decisions carry no signature (``None``: nothing to say)."""
    unsigned = [p for p in UNSIGNED_DECISIONS if p in protocols]
    if not (required and unsigned):
        return None
    return (
        "--require-approval-signature covers the AI SDK's POST /api/chat; approvals "
        f"decided through {' and '.join(unsigned)} carry no signature and are taken as "
        "before (leave them out of --protocols to take only signed decisions)"
    )


SECRET_FILE_MAX = 64 * 1024
"""The most bytes ``--approval-secret-file`` reads: a larger file is not a secret (a
wrong path: a log, a device), and reading it whole would hold the start-up."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})


def approval_secret(args: argparse.Namespace) -> str | bytes | None:
    """The secret that signs approval requests (docs/approval.md), from the command
    line, else the environment: ``--approval-secret`` or the contents of
    ``--approval-secret-file``, else ``$AXON_APPROVAL_SECRET`` or the contents of the
    file ``$AXON_APPROVAL_SECRET_FILE`` names, else none (nothing signed). An empty value
    is none given. A :class:`ConfigurationError` for two sources in one place (both
    options, or both variables: which one was meant is a guess) or a file that gives
    no secret (:func:`read_secret_file`); its text never holds the secret. A source the
    command line overrides is not read."""
    given = getattr(args, "approval_secret", None) or None
    path = getattr(args, "approval_secret_file", None)
    if path is not None:
        if given:
            raise ConfigurationError(
                "give the approval secret once: --approval-secret or --approval-secret-file"
            )
        return read_secret_file(path)
    if given:
        return given
    env_secret = os.environ.get(SECRET_ENV) or None
    env_path = os.environ.get(SECRET_FILE_ENV) or None
    if env_path is not None:
        if env_secret:
            raise ConfigurationError(
                f"give the approval secret once: ${SECRET_ENV} or ${SECRET_FILE_ENV} "
                "(both are set; unset one, or give --approval-secret-file, which overrides "
                "both)"
            )
        return read_secret_file(env_path, where=f"${SECRET_FILE_ENV}")
    return env_secret


def read_secret_file(path: str, *, where: str = "--approval-secret-file") -> bytes:
    """The secret the file at ``path`` holds (its trailing newlines left out: an
    ``echo`` wrote it, or an editor); a :class:`ConfigurationError` naming ``where`` it
    was given and the path, not its contents, when it cannot be read, is empty, or is
    larger than :data:`SECRET_FILE_MAX`."""
    where = f"{where} {path!r}"
    try:
        with open(path, "rb") as f:
            data = f.read(SECRET_FILE_MAX + 1)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ConfigurationError(f"{where} cannot be read: {why}") from None
    if len(data) > SECRET_FILE_MAX:
        raise ConfigurationError(
            f"{where} is larger than {SECRET_FILE_MAX} bytes: not a secret (a wrong path?)"
        )
    secret = data.rstrip(b"\r\n")
    if not secret:
        raise ConfigurationError(f"{where} is empty: it must hold the secret")
    return secret


def require_approval_signature(args: argparse.Namespace) -> bool:
    """Whether an AI SDK approval answer must carry a signature:
    ``--require-approval-signature``, else ``$AXON_REQUIRE_APPROVAL_SIGNATURE`` (``1``,
    ``true``, ``yes``, ``on``; ``0``, ``false``, ``no``, ``off`` or unset: no); another
    value is a :class:`ConfigurationError` rather than a guess."""
    if getattr(args, "require_approval_signature", False):
        return True
    raw = os.environ.get(REQUIRE_ENV, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ConfigurationError(
        f"${REQUIRE_ENV} must be 1 or 0 (true/false, yes/no, on/off), not {raw[:40]!r}"
    )


def approval_settings(args: argparse.Namespace) -> tuple[str | bytes | None, bool]:
    """The approval secret and whether a signature is required, checked together: a
    requirement without a secret is a :class:`ConfigurationError` (nothing would be
    signed, so every AI SDK approval would be refused)."""
    secret = approval_secret(args)
    required = require_approval_signature(args)
    if required and not secret:
        raise ConfigurationError(
            f"--require-approval-signature (${REQUIRE_ENV}) needs an approval secret to "
            f"sign with: {SECRET_SOURCES}"
        )
    return secret, required


def _refusal(args: argparse.Namespace, token: str | None, protocols: Any) -> str | None:
    """Why ``serve`` must not start (``None``: it may), said before anything starts: a
    protocol not built, an address it cannot or must not bind."""
    refusal = unbuilt_refusal(protocols)
    if refusal is not None:
        return refusal
    return bind_problem(args.host, args.port) or bind_refusal(args.host, token, args.insecure)


async def _open_relay(stack: AsyncExitStack, args: argparse.Namespace) -> RedisRelay | None:
    """The ``--redis`` relay, open until ``stack`` closes (``None`` without one)."""
    if not args.redis:
        return None
    options = {"prefix": args.redis_prefix} if args.redis_prefix else {}
    return await stack.enter_async_context(RedisRelay.open(args.redis, **options))


async def publish_turns(host: Host, relay: Any) -> Any:
    """Publish the turns ``host`` runs to ``relay`` (``serve --redis``), each turn's end
    as its web client is told it (:func:`~runtime.app.unsaved.told_end`): a client
    resuming from the relay a turn whose save failed is told ``not_saved``, as the live
    stream told it, not the ``finish`` (or the store's error) the turn's stream ended with."""
    return await attach_relay(host, relay, told=told_end)


async def _start_deployment(
    stack: AsyncExitStack,
    args: argparse.Namespace,
    host: Host,
    relay: RedisRelay | None,
    plugins: list[Any],
) -> TurnQueue | None:
    """A front end's turn queue (its host only lends it the store: it runs no turn), or
    the relay attached to the host that runs turns here (``None``); the plug-ins started."""
    queue = None
    if is_front_end(args):
        queue = turn_queue(host.store, **queue_caps(args))
        stack.push_async_callback(queue.aclose)
    elif relay is not None:
        await publish_turns(host, relay)
    for plugin in plugins:
        await host.start_actor(plugin)
    return queue


def _served(args: argparse.Namespace, *, front_end: bool, plugins: list[Any]) -> str:
    """What the start-up line says is served: the mode, agent, store, relay, plug-ins."""
    return (
        f"{'front-end mode: turns run on workers; ' if front_end else ''}"
        f"{'agent ' + args.agent if args.agent else 'provider ' + args.provider}"
        f", store {redact_url(args.store or 'memory')}"
        f"{', relay ' + public_url(args.redis) if args.redis else ''}"
        f"{plugins_banner(plugins)}"
    )


def _endpoints(url: str, protocols: Any) -> str:
    """The start-up line's endpoints of the protocols served beside the page, at ``url``."""
    return (
        f"{', OpenAI API ' + url + '/v1' if 'openai' in protocols else ''}"
        f"{', AG-UI ' + url + '/ag-ui' if 'ag-ui' in protocols else ''}"
        f"{', A2A agent ' + url if 'a2a' in protocols else ''}"
        f"{', MCP ' + url + '/mcp' if 'mcp' in protocols else ''}"
    )


async def _serve_until_signal(
    app: Any, host: Host, args: argparse.Namespace, served: str, *, protocols: Any
) -> int:
    """Serve ``app`` until SIGINT/SIGTERM, printing each bound URL with what is
    ``served`` and the other ``protocols``' endpoints; 2 when the address is refused.
    The signal ends every running turn with a clean abort before the server stops."""

    async def shutdown_trigger() -> None:
        await _until_signal(getattr(args, "drain", 0.0), app.state.axon.readiness.drain)
        # Closing from here, as Host.open's own signal watcher marks it: a message waiting
        # for a turn cancelled below must not start one of its own (it gets the closing
        # host's 503), nor a new turn, stop or resume on a connection still open.
        host.shutting_down = True
        front = app.state.axon.front
        if front is not None:  # a worker deployment's: new work 503, its streams ended
            front.close()
        host.cancel_turns("server shutdown")  # end streams with a clean abort
        for cancel_turns in getattr(app.state, "turn_cancellers", ()):
            cancel_turns("server shutdown")  # turns of other hosts (runtime.app.web.protocols)

    cap = _max_connections(args)
    async with trio.open_nursery() as nursery:
        try:
            binds = await nursery.start(
                partial(
                    serve_app,
                    app,
                    host=args.host,
                    port=args.port,
                    shutdown_trigger=shutdown_trigger,
                    access_log=args.log_level in ("debug", "info"),
                    max_connections=cap,
                    max_connections_per_address=_max_connections_per_address(args, cap),
                    send_timeout=args.send_timeout,
                )
            )
        except OSError as exc:  # raised before serving: the address is refused
            where = _bind(args.host, args.port)
            print(f"error: cannot serve on {where}: {bind_reason(exc)}", file=sys.stderr)
            return 2
        fragment = f"#token={args.token}" if args.token else ""  # not an env secret
        for url in binds:
            print(
                f"Axon web UI on {url}/{fragment}  ({served}{_endpoints(url, protocols)})",
                flush=True,
            )
    return 0


def _max_connections(args: argparse.Namespace) -> int | None:
    """``--max-connections``: as given, ``off`` (0) as no cap, else derived from the soft
    limit of open files (read after ``serve`` raised it)."""
    given = getattr(args, "max_connections", None)
    if given is None:
        from runtime.app.web.connections import default_max_connections

        return default_max_connections()
    return given or None


def _max_connections_per_address(args: argparse.Namespace, cap: int | None) -> int | None:
    """``--max-connections-per-address``: as given, ``off`` (0) as none, else a quarter of
    the connection cap ``cap`` (none without a cap)."""
    given = getattr(args, "max_connections_per_address", None)
    if given is None:
        from runtime.app.web.connections import ADDRESS_SHARE

        return None if cap is None else max(1, cap // ADDRESS_SHARE)
    return given or None


def plugins_banner(plugins: list[Any]) -> str:
    """What the banner says of the running plug-ins (``OpenTelemetry traces`` for
    ``otel``, as before plug-ins had names)."""
    names = [
        "OpenTelemetry traces" if plugin.name == "otel" else f"plug-in {plugin.name}"
        for plugin in plugins
    ]
    return "".join(f", {name}" for name in names)


def main(argv: list[str] | None = None) -> int:
    """``python -m runtime.app.web.serve``: the same command without the ``runtime`` CLI."""
    parser = add_serve_arguments(
        argparse.ArgumentParser(prog="python -m runtime.app.web.serve", description=__doc__)
    )
    args = parser.parse_args(argv)

    def serve() -> int:
        try:
            return trio.run(serve_command, args)
        except KeyboardInterrupt:
            return 130

    return report_bad_input(serve)


__all__ = [
    "add_serve_arguments",
    "add_serve_parser",
    "bind_address",
    "bind_problem",
    "bind_refusal",
    "main",
    "serve_app",
    "serve_command",
]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
