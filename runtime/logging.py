"""structlog setup: local JSON lines, nothing exported anywhere by default.

Never use structlog's ``a*`` (async) methods under Trio: they hop to asyncio threads.
Loggers here are plain and synchronous, called on the event loop (the log tap's from its
own task): a sink that blocks while it writes (a stdlib handler sending lines over the
network) holds every turn of the host meanwhile. An application whose sink may block
puts a ``logging.handlers.QueueHandler`` in front of it (docs/embedding.md). The default
sink, stderr, never blocks when it is a pipe, a terminal or a stream socket
(:class:`NonBlockingSink`): a full pipe nobody read stalled every session of ``serve``.

A line of an application's own configuration that raises (a processor, a handler) is
dropped, said once on stderr (:class:`_Guarded`), and :func:`configure_logging`'s own
lines go to a stream that never raises (:class:`QuietStream`: a broken stderr pipe drops
them): logging never fails a turn.
"""

from __future__ import annotations

import atexit
import datetime
import errno
import functools
import logging
import os
import select
import socket
import stat
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import structlog

from runtime.errors import describe_exception
from runtime.redact import (
    redact,
    redact_header_pairs,
    redact_processor,
    redact_text,
    redact_urls,
    redacted_str,
)

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
LIBRARY_LOGGERS = ("psycopg", "coredis")
"""The stdlib loggers of the libraries a worker runs on (psycopg's pool warns through
``psycopg.pool``); :func:`configure_logging` renders their records as the same JSON
lines, instead of the plain text of Python's last-resort handler."""


def configure_logging(
    level: str | int = "info", *, stream: TextIO | None = None, json: bool = True
) -> None:
    """Configure structlog to write one JSON object per line to ``stream`` (stderr).

    ``level`` filters before any formatting happens, so a delta that is not logged costs
    nothing beyond the level check. The warnings of the libraries in
    :data:`LIBRARY_LOGGERS` (stdlib logging) become lines of the same format.
    """
    lvl = _LEVELS.get(level, logging.INFO) if isinstance(level, str) else level
    renderer: Any = JsonRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    sink = QuietStream.around(stream or unblocked(sys.stderr, _dropped_notice(renderer)))
    global _own_processors
    _own_processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        UtcStamper(),
        # Tracebacks are rendered to text first, so the redaction below covers them too:
        # a provider error's __cause__ is the SDK's exception, which may quote the key.
        format_exc_info,
        redact_processor,  # every line, whoever logged it: no key reaches stderr
        renderer,
    ]
    structlog.configure(
        processors=_own_processors,
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.WriteLoggerFactory(file=sink),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
    _route_library_loggers(max(lvl, logging.WARNING), sink, renderer)
    quiet_mcp_client_logs()
    quiet_mcp_server_logs()


MCP_CLIENT_LOGGERS = (
    "client",  # (mcp.client.session's: logging.getLogger("client"))
    "mcp.client.client",
    "mcp.client.streamable_http",
    "mcp.client.sse",
    "mcp.client.stdio",
    "mcp.client.caching",
    "mcp.client.auth.oauth2",
    "mcp.shared.jsonrpc_dispatcher",
    "mcp.shared.dispatcher",
    "mcp.shared.direct_dispatcher",
)
"""The stdlib loggers of the ``mcp`` package's client side (a filter on a logger sees
only its own records, not its children's: each module's is named)."""

MCP_LINE_CHARS = 500
"""Characters of an ``mcp`` client record's text kept (:class:`MCPClientLines`)."""


def _message(record: logging.LogRecord) -> str:
    """``record``'s message, or its format alone when its arguments do not fit it."""
    try:
        return record.getMessage()
    except Exception:
        return str(record.msg)


def _one_line(text: str) -> str:
    """``text`` redacted and cut to :data:`MCP_LINE_CHARS`, saying how much was cut."""
    text = redact_text(text)
    if len(text) > MCP_LINE_CHARS:
        text = f"{text[:MCP_LINE_CHARS]}... ({len(text) - MCP_LINE_CHARS} characters more)"
    return text


class MCPClientLines(logging.Filter):
    """What the ``mcp`` package's client logs (:data:`MCP_CLIENT_LOGGERS`), kept out of
    every log whatever its level or handler: the record is changed in place, before any
    handler (an application's root handler too) sees it.

    * Below ``WARNING``: dropped. Its debug lines hold whole JSON-RPC messages (``SSE
      message: ...``, ``Sending client message: ...``: a tool's arguments and results,
      what a server echoed of the headers it was sent), its info lines the session id
      (a bearer of the session) and endpoints; a level says nothing of what a line
      holds, and Axon's own ``mcp.*`` events tell a server's life.
    * ``WARNING`` and above: one line of at most :data:`MCP_LINE_CHARS` characters,
      key shapes redacted; an exception is its type and message on that line, without
      its traceback, pydantic's without the input it quotes (an SSE event the package
      could not read, cut in the middle: an echoed token's tail, of no key shape).

    The package's session logs under the bare name ``client``, which an application may
    well use for a logger of its own: there only the records written from the package's
    own files are touched, an application's pass as they were."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "client" and not _from_mcp(record.pathname):
            return True  # an application's own logger named "client"
        if record.levelno < logging.WARNING:
            return False
        text = _message(record)
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            text = f"{text}: {_said_by(exc)}"
        record.msg, record.args = _one_line(text), ()
        record.exc_info = record.exc_text = record.stack_info = None
        return True


def _from_mcp(path: str) -> bool:
    """Whether a record written from ``path`` came from the ``mcp`` package's files (none
    did unless it is imported: nothing is looked up for it)."""
    folders = getattr(sys.modules.get("mcp"), "__path__", None) or ()
    return any(path.startswith(os.path.join(f, "")) for f in folders)


def _said_by(exc: BaseException) -> str:
    """``TypeName: message`` of ``exc`` or of the pydantic error it was raised from,
    that one without the input it quotes."""
    found: BaseException | None = exc
    while found is not None and not _is_pydantic_error(found):
        found = found.__cause__ or found.__context__
    if found is None:
        return describe_exception(exc)
    errors = found.errors(include_input=False, include_url=False, include_context=False)  # type: ignore[attr-defined]
    said = "; ".join(
        f"{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"] for e in errors[:3]
    )
    return f"{type(found).__name__}: {said}"


def _is_pydantic_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "ValidationError" and hasattr(exc, "errors")


MCP_CLIENT_LINES = MCPClientLines()


def quiet_mcp_client_logs() -> None:
    """Put :data:`MCP_CLIENT_LINES` on each of :data:`MCP_CLIENT_LOGGERS` (once):
    :func:`configure_logging` does, and so does each MCP server's actor as it starts
    (an application that configures its own logging)."""
    for name in MCP_CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        if MCP_CLIENT_LINES not in logger.filters:
            logger.addFilter(MCP_CLIENT_LINES)


MCP_SERVER_LOGGERS = (
    "mcp.server._streamable_http_modern",
    "mcp.server.auth.handlers.authorize",
    "mcp.server.auth.middleware.bearer_auth",
    "mcp.server.connection",
    "mcp.server.context",
    "mcp.server.lowlevel.server",
    "mcp.server.mcpserver.prompts.manager",
    "mcp.server.mcpserver.resolve",
    "mcp.server.mcpserver.resources.resource_manager",
    "mcp.server.mcpserver.server",
    "mcp.server.mcpserver.tools.tool_manager",
    "mcp.server.mcpserver.utilities.func_metadata",
    "mcp.server.request_state",
    "mcp.server.runner",
    "mcp.server.session",
    "mcp.server.sse",
    "mcp.server.streamable_http",
    "mcp.server.streamable_http_manager",
    "mcp.server.subscriptions",
    "mcp.server.transport_security",
)
"""The stdlib loggers of the ``mcp`` package's server side (each module's: a filter on a
logger sees only its own records), whose records :class:`MCPServerLines` keeps to
Axon's terms when Axon serves an agent over MCP (``serve --protocols mcp``,
``mcp-server``); its dispatcher's (``mcp.shared.*``) are :data:`MCP_CLIENT_LOGGERS`."""


class MCPServerLines(MCPClientLines):
    """What the ``mcp`` package's server logs (:data:`MCP_SERVER_LOGGERS`), as
    :class:`MCPClientLines` keeps its client's, changed in place before any handler
    (an application's root handler too) sees it:

    * Below ``WARNING``: dropped. Its info lines name each session's id as it is made
      and ended (``Created new transport with session ID: ...``: the bearer of the
      session, which a client's requests carry), and the id a client sent that it does
      not know (text of the client's choosing); its debug lines a frame received before
      the first request whole (``%r``: a call's arguments, the user's prompt).
    * ``WARNING`` and above: its text one line of at most :data:`MCP_LINE_CHARS`
      characters, key shapes redacted; its traceback kept (an Axon handler's failure is
      worth its frames), redacted as a whole (its exception's text may quote what the
      client sent).
    * A record Axon's own filter rewrote in its own words (``axon_said``: the transport's
      race with a session's ``DELETE``, ``runtime.app.web.mcp_endpoint``) passes as
      it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "axon_said", False):
            return True
        if record.levelno < logging.WARNING:
            return False
        text = _one_line(_message(record))
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            said = traceback.format_exception(*record.exc_info)
            record.exc_text = redact_text("".join(said).rstrip("\n"))
        record.msg, record.args = text, ()
        record.stack_info = None
        return True


MCP_SERVER_LINES = MCPServerLines()


def quiet_mcp_server_logs() -> None:
    """Put :data:`MCP_SERVER_LINES` on each of :data:`MCP_SERVER_LOGGERS` (once), and
    :data:`MCP_CLIENT_LINES` on the dispatchers both sides share:
    :func:`configure_logging` does, and so do ``serve``'s ``/mcp`` endpoint and
    ``mcp-server`` as they start (an application that configures its own logging)."""
    quiet_mcp_client_logs()
    for name in MCP_SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if MCP_SERVER_LINES not in logger.filters:
            logger.addFilter(MCP_SERVER_LINES)


HTTP_CLIENT_LOGGERS = ("httpx", "httpx2")
"""The stdlib loggers of the HTTP clients the SDKs, the MCP and A2A clients send with
(``httpx2`` under the OpenAI and Anthropic SDKs, ``httpx`` or ``httpx2`` under Gemini's,
MCP's, A2A's): each logs an ``INFO`` line a request, ``HTTP Request: POST URL "HTTP/1.1
200 OK"``, with the URL whole."""
HTTP_STACK_LOGGERS = (
    *(f"httpcore.{m}" for m in ("connection", "http11", "http2", "proxy", "socks")),
    *(f"httpcore2.{m}" for m in ("connection", "http11", "http2", "proxy", "socks")),
    *("openai._base_client", "anthropic._base_client", "hpack.hpack", "hpack.table"),
)
"""The stdlib loggers under those clients and the SDKs whose ``DEBUG`` lines quote
headers: httpcore's ``receive_response_headers.complete`` (the response's, a server's
``set-cookie``), the Anthropic SDK's ``HTTP Response`` (the same) and ``Request
options`` (the request's extra headers and body: :data:`SDK_OPTIONS_LINE`), hpack's
header table (HTTP/2). A filter is on the logger a record is made on, not its parents:
each module's own is listed
(tests/test_http_debug_headers.py checks that the list covers the packages)."""


HPACK_BLOCK_LINES = frozenset({"Encoded header block to %s", "Decoding %s"})
"""hpack's ``DEBUG`` lines that quote a whole HTTP/2 header block (the encoder's output,
the decoder's input): every header's value is in it, a literal's as it is and a Huffman
coded one in a code anyone decodes, so no pattern can redact it. Logged with the block's
size instead (the per-header lines, ``Decoded``/``Adding``, keep their names, their
credential values redacted)."""


SDK_OPTIONS_LINE = "Request options: %s"
"""The Anthropic SDK's ``DEBUG`` line of each request's options (``anthropic._base_client``):
a dictionary of them whole, ``json_data`` with it (the user's messages, the system
prompt, the tools, whatever ``extra_body`` adds) and the extra headers. Logged with its
method and path only (:func:`_request_options`), as the OpenAI SDK logs its request
(``Building HTTP request: method=post``: its code says "Request bodies, files, URLs,
and custom options can contain private data")."""


def _request_options(args: object) -> str:
    """:data:`SDK_OPTIONS_LINE` of ``args`` (the record's: the options' dictionary,
    which ``logging`` unwraps from a tuple of one) as ``method=... url=...``, the URL's
    credentials redacted; anything else as the line without its argument."""
    options = args[0] if isinstance(args, tuple) and len(args) == 1 else args
    if not isinstance(options, Mapping):
        return "Request options: (not logged)"
    method, url = options.get("method"), options.get("url")
    return f"Request options: method={method} url={redact_urls(str(url))}"


def _block_size(value: object) -> object:
    """A header block argument as its size (``<27 bytes>``); anything else as it is."""
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    return value


class HTTPClientLines(logging.Filter):
    """The request lines of the HTTP clients (:data:`HTTP_CLIENT_LOGGERS`) with the
    credentials of their URLs redacted (:func:`runtime.redact.redact_urls`): a
    ``base_url`` of ``https://user:PW@proxy/v1``, a key in its query (Azure's
    ``?api-key=``, Gemini's ``?key=``, a proxy's ``?token=``), an MCP server's URL
    with a token, as the package wrote them, went to an application's root handler at
    ``INFO`` (``logging.basicConfig(level=logging.INFO)``: a line a model call). The
    record is changed in place, before any handler sees it; the method, the host, the
    path and the status stay. On :data:`HTTP_STACK_LOGGERS` (their ``DEBUG`` lines), the
    value of each header named like a credential too
    (:func:`runtime.redact.redact_header_pairs`): a request's or a response's.

    A record's traceback (``exc_info``: the Anthropic SDK's ``Encountered Exception``)
    is formatted here, redacted (:func:`runtime.redact.redact_text`), into its
    ``exc_text``, which a handler's ``logging.Formatter`` prints in its place: an
    exception's text can quote what was sent (h11's ``Illegal header value b'<a
    gateway key>\\n'`` for a key read with its newline). Kept whole otherwise (its
    frames, its type); Axon's own structlog lines redact theirs as every line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            said = traceback.format_exception(*record.exc_info)
            record.exc_text = redact_text("".join(said).rstrip("\n"))
        if record.msg in HPACK_BLOCK_LINES and record.name.startswith("hpack."):
            record.args = tuple(_block_size(a) for a in record.args or ())
            return True
        if record.msg == SDK_OPTIONS_LINE and record.name.endswith("._base_client"):
            record.msg, record.args = _request_options(record.args), ()
            return True
        try:
            text = record.getMessage()
        except Exception:  # (arguments that do not fit the format: the format alone)
            text = str(record.msg)
        clean = redact_header_pairs(text) if record.levelno < logging.INFO else redact_urls(text)
        if clean != text:
            record.msg, record.args = clean, ()
        return True


HTTP_CLIENT_LINES = HTTPClientLines()


def quiet_http_client_logs() -> None:
    """Put :data:`HTTP_CLIENT_LINES` on each of :data:`HTTP_CLIENT_LOGGERS` and
    :data:`HTTP_STACK_LOGGERS` (once).

    Called once, as this module is imported: every client that sends with those HTTP
    clients (the providers' SDKs, the MCP and A2A clients) imports this module before
    it can be built, so its request lines are redacted from its first, whether or not
    the application calls :func:`configure_logging` (it was called by each client's
    constructor, three places, and by :func:`configure_logging`). A logger's filters
    survive an application's ``logging.config.dictConfig``, which replaces handlers."""
    for name in (*HTTP_CLIENT_LOGGERS, *HTTP_STACK_LOGGERS):
        logger = logging.getLogger(name)
        if HTTP_CLIENT_LINES not in logger.filters:
            logger.addFilter(HTTP_CLIENT_LINES)


quiet_http_client_logs()


_BROKEN = (BrokenPipeError, ConnectionResetError)
"""What a write raises once its stream is gone for good: the reader left the pipe
(``axon run ... 2>&1 | head -1``). A closed stream (``ValueError``) and ``EBADF`` are gone
too; a line the stream cannot encode (``UnicodeEncodeError``, a ``ValueError`` too) is
that line's failure only."""


class QuietStream:
    """The stream :func:`configure_logging` writes its lines to, around the one it was
    given: a write or flush that raises is dropped instead. A line's write raised into
    whoever logged it: with stderr a pipe whose reader had left, the log tap crashed, the
    supervisor raised logging that, the turn raised logging its save, and ``axon run``
    exited 0 with the turn neither shown nor saved. Once the stream is gone for good
    (:data:`_BROKEN`, closed, or ``EBADF``) every later line is dropped without a try, as
    Python's ``logging.Handler.handleError`` drops a record on a broken stderr; another
    ``OSError`` (a full disk, a non-blocking pipe that is full) or a line the stream cannot
    encode drops that write's lines only.
    Anything else (``fileno``, ``isatty``, ``encoding``) is the stream's."""

    __slots__ = ("__weakref__", "_flush", "_write", "broken", "stream")

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.broken = False
        self._write = stream.write
        self._flush = stream.flush

    @classmethod
    def around(cls, stream: TextIO) -> QuietStream:
        return stream if isinstance(stream, QuietStream) else cls(stream)

    def write(self, text: str) -> int:
        if self.broken:
            return 0
        try:
            return self._write(text)
        except (OSError, ValueError) as exc:
            self._failed(exc)
            return 0

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self._flush()
        except (OSError, ValueError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        if (
            isinstance(exc, _BROKEN)
            or getattr(exc, "errno", None) == errno.EBADF
            or getattr(self.stream, "closed", False) is True
        ):
            self.broken = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


PENDING_LIMIT = 1 << 20
"""Bytes of lines a :class:`NonBlockingSink` holds while its reader is behind (a pipe
nobody reads any more is full at 64 KiB); lines that would take it past are dropped."""
EXIT_WAIT = 2.0
"""Seconds a :class:`NonBlockingSink` waits at the process's exit for its reader to take
the lines it holds, counted afresh each time the reader takes some."""


class NonBlockingSink:
    """The process's stderr (or stdout) when it is a pipe, a terminal or a stream socket,
    written so that a write never waits for the reader.

    Lines are written on the event loop. With stderr a pipe whose reader stopped reading
    without closing it (a parent's ``stderr=PIPE`` never read, a ``| tee`` suspended with
    Ctrl-Z, a terminal paused with Ctrl-S), the 64 KiB pipe filled and the next line's
    ``write`` blocked the loop: ``serve --log-level info`` stopped answering after ten
    turns, every session stalled. Now a write that would wait is kept (up to
    :data:`PENDING_LIMIT` bytes, sent before any later line, never half a line lost);
    past that, lines are dropped, and once the reader has caught up a ``log.lines-dropped``
    line says how many. Held lines do not wait for a later line to go: a thread of the
    sink's own, started when a line is first held and ended once none is, sends them as
    the reader makes room (before, the last lines of a turn stayed in the process until
    the next line was logged, for ever on a quiet server). What it still holds at exit is
    waited for while the reader takes it (:data:`EXIT_WAIT`).

    A pipe or a terminal is written through a description of its own, opened anew through
    ``/proc/self/fd`` with ``O_NONBLOCK`` (on the inherited one it would be the parent's
    and every sibling's sharing it too). A socket cannot be opened so (systemd connects a
    service's stderr to the journal's stream socket; a reader that stops reading stalled
    ``serve`` the same way): each send says ``MSG_DONTWAIT`` instead, which changes no
    description's flags. ``put(dest, data)`` is that primitive, ``os.write`` or
    :func:`_send_nowait`; the holding and dropping are the same for both. Where neither
    can be done (no ``/proc``, a datagram socket, a regular file, whose writes do not wait
    for a reader) :func:`unblocked` keeps the stream as it was. A broken pipe or socket
    raises as the stream's own write would (:class:`QuietStream` drops the lines from then
    on)."""

    __slots__ = (
        "__weakref__",
        "_dest",
        "_drainer",
        "_dropped",
        "_fd",
        "_lock",
        "_notice",
        "_pending",
        "_put",
        "encoding",
        "stream",
    )

    def __init__(
        self,
        stream: TextIO,
        fd: int,
        notice: Callable[[int], str],
        put: Callable[[Any, Any], int] = os.write,
        dest: Any = None,
    ) -> None:
        self.stream = stream
        self.encoding = getattr(stream, "encoding", None) or "utf-8"
        self._fd = fd
        # ``put(dest, data)``: a call of the primitive itself per line, no wrapper between
        self._put = put
        self._dest = fd if dest is None else dest
        self._notice = notice
        self._pending = bytearray()
        self._dropped = 0
        self._drainer: threading.Thread | None = None
        self._lock = threading.Lock()  # stdlib handlers' threads write here too

    def write(self, text: str) -> int:
        data = text.encode(self.encoding, "backslashreplace")
        with self._lock:
            if self._pending or self._dropped:
                self._behind(text, data)
            else:
                self._send(data)
            if self._pending and self._drainer is None:
                self._start_drainer()
        return len(text)

    def _start_drainer(self) -> None:
        """Start the thread that sends the held lines as the reader makes room (called
        with the lock held, while lines are held and no such thread runs)."""
        self._drainer = threading.Thread(target=self._drain_held, name="axon-log-sink", daemon=True)
        self._drainer.start()

    def _drain_held(self) -> None:
        """The held lines' thread: wait for the reader to make room (``POLLOUT``, looked
        at again each second: the reader may have left), send what fits, and end once
        nothing is held nor dropped unsaid. A reader gone (``OSError``) ends it too: the
        next line's write raises as the stream's own would."""
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        try:
            while True:
                poller.poll(1000)
                with self._lock:
                    if self._pending:
                        self._send_pending()
                    if not self._pending and self._dropped:
                        notice = self._notice(self._dropped)
                        self._dropped = 0
                        self._send(notice.encode(self.encoding, "backslashreplace"))
                    if not self._pending:
                        self._drainer = None
                        return
        except OSError:
            with self._lock:
                self._drainer = None

    def _behind(self, text: str, data: bytes) -> None:
        """``write`` while lines are held or were dropped: the held ones go first; a line
        that cannot go is held, or dropped past :data:`PENDING_LIMIT`; once all went,
        the line saying how many were dropped goes before this one."""
        if self._pending:
            self._send_pending()
            if self._pending:
                if len(self._pending) + len(data) > PENDING_LIMIT:
                    self._dropped += text.count("\n") or 1
                else:
                    self._pending += data
                return
        if self._dropped:
            notice = self._notice(self._dropped).encode(self.encoding, "backslashreplace")
            self._dropped = 0
            data = notice + data
        self._send(data)

    def flush(self) -> None:
        """Send what is held, if the reader has room for it now; never waits."""
        if self._pending:
            with self._lock:
                self._send_pending()

    def _send(self, data: bytes) -> None:
        try:
            sent = self._put(self._dest, data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            self._pending += memoryview(data)[sent:]

    def _send_pending(self) -> None:
        pending = self._pending
        try:
            sent = self._put(self._dest, pending)
        except BlockingIOError:
            return
        del pending[:sent]

    def drain(self, wait: float = EXIT_WAIT) -> None:
        """At exit: wait for the reader to take what is held, giving up after ``wait``
        seconds in which it took nothing."""
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        with self._lock:
            while self._pending:
                if not poller.poll(wait * 1000):
                    return
                before = len(self._pending)
                try:
                    self._send_pending()
                except OSError:  # the reader left meanwhile
                    return
                if len(self._pending) == before:
                    return

    def fileno(self) -> int:
        return self._fd

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


_unblocked: dict[tuple[int, int, int, int], NonBlockingSink] = {}
"""One sink per stream and its file (a pipe's, a terminal's, a socket's), made once and
never closed (a logger configured with it may still write): configuring the logging again
reuses it, not opening another description (or socket) each time."""

_NOWAIT = socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)


def _send_nowait(sock: socket.socket, data: Any) -> int:
    """``sock.send`` that never waits (``EAGAIN``: ``BlockingIOError``), though the open
    file description it shares with stderr, and with the parent's, stays blocking. No
    ``SIGPIPE`` either: a reader gone raises ``BrokenPipeError``."""
    return sock.send(data, _NOWAIT)


def _stream_socket(fd: int) -> socket.socket | None:
    """A socket object of its own on ``fd``'s socket (a duplicate descriptor), if it is a
    stream socket; ``None`` else. Not when a default socket timeout is set: making the
    object would set ``O_NONBLOCK`` on the shared description."""
    if socket.getdefaulttimeout() is not None:
        return None
    own = os.dup(fd)
    try:
        sock = socket.socket(fileno=own)
    except OSError:
        os.close(own)
        return None
    if sock.type != socket.SOCK_STREAM:  # a datagram's send is whole or not at all
        sock.close()
        return None
    return sock


def unblocked(stream: TextIO, notice: Callable[[int], str] | None = None) -> Any:
    """``stream`` as a :class:`NonBlockingSink` when it is a pipe or a terminal that can be
    opened anew without blocking, or a stream socket; else ``stream`` itself.
    ``notice(n)`` is the line that says ``n`` lines were dropped."""
    try:
        fd = stream.fileno()
        info = os.fstat(fd)
    except (OSError, ValueError, AttributeError):  # no descriptor (a StringIO), closed
        return stream
    is_socket = stat.S_ISSOCK(info.st_mode)
    if not (
        is_socket or stat.S_ISFIFO(info.st_mode) or (stat.S_ISCHR(info.st_mode) and os.isatty(fd))
    ):
        return stream
    key = (id(stream), fd, info.st_dev, info.st_ino)  # (the sink keeps the stream alive)
    sink = _unblocked.get(key)
    if sink is not None:
        return sink
    notice = notice or _dropped_text
    if is_socket:
        sock = _stream_socket(fd)
        if sock is None:
            return stream
        _flush_quietly(stream)
        sink = NonBlockingSink(stream, sock.fileno(), notice, _send_nowait, sock)
    else:
        flags = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        try:
            own = os.open(f"/proc/self/fd/{fd}", flags)
        except OSError:  # no /proc; ENXIO: the pipe's reader left (its own write says so)
            return stream
        _flush_quietly(stream)
        sink = NonBlockingSink(stream, own, notice)
    _unblocked[key] = sink
    atexit.register(sink.drain)
    return sink


def _flush_quietly(stream: TextIO) -> None:
    """What ``stream`` holds goes out before the sink's first line."""
    try:
        stream.flush()
    except (OSError, ValueError):
        pass


def _dropped_text(lines: int) -> str:
    return f"axon: {lines} log lines dropped: the reader of this stream fell behind\n"


def _dropped_notice(renderer: Any) -> Callable[[int], str]:
    """The ``log.lines-dropped`` line, as ``renderer`` writes every other line."""

    def notice(lines: int) -> str:
        event = {"logger": "axon.logging", "lines": lines, "event": "log.lines-dropped"}
        event["level"] = "warning"
        return f"{renderer(None, 'warning', UtcStamper()(None, 'warning', event))}\n"

    return notice


class _LibraryHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`configure_logging` puts on each of :data:`LIBRARY_LOGGERS`
    (a class of its own, so configuring again replaces it rather than adding another)."""


def _route_library_loggers(level: int, stream: Any, renderer: Any) -> None:
    """Render the records of :data:`LIBRARY_LOGGERS` through structlog's processors
    (``logger`` is the stdlib logger's name; redacted like every line) to ``stream``.

    Their level is at least ``warning`` whatever the runtime's: their info lines
    (connections opened, pools resized) are the libraries' business. They no longer
    propagate, so an application's root handler does not print them a second time."""
    handler = _LibraryHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                format_exc_info,
                redact_processor,
                renderer,
            ],
        )
    )
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        for old in [h for h in logger.handlers if isinstance(h, _LibraryHandler)]:
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False


class JsonRenderer:
    """The last processor: the line as one JSON object (orjson; a value it cannot encode
    is written as its ``str``). What ``structlog.processors.JSONRenderer`` with orjson as
    its serializer writes, without its call through a keyword-taking wrapper, or an
    ``import`` statement, per line."""

    __slots__ = ("_dumps",)

    def __init__(self) -> None:
        import orjson  # here, not at import: ``import runtime`` does not need it

        self._dumps = orjson.dumps

    def __call__(self, _logger: Any, _method: str, event_dict: Any) -> str:
        try:
            return self._dumps(event_dict, default=redacted_str).decode()  # type: ignore[no-any-return]
        except TypeError:  # orjson's refusal of a lone surrogate (a surrogateescape'd
            import json  # file name in a tool's error): JSON's own escape, not a raise

            return json.dumps(
                event_dict, default=redacted_str, ensure_ascii=True, separators=(",", ":")
            )


def format_exc_info(logger: Any, method: str, event_dict: Any) -> Any:
    """``structlog.processors.format_exc_info`` for the lines that carry ``exc_info``:
    the others (nearly all) are left as they are without the call, which would only
    find that out."""
    if "exc_info" in event_dict:
        return structlog.processors.format_exc_info(logger, method, event_dict)
    return event_dict


class UtcStamper:
    """``timestamp``: the time in ISO 8601, UTC, as structlog's
    ``TimeStamper(fmt="iso", utc=True)`` writes it (``2026-12-03T18:20:28.844091Z``), at a
    fifth of the cost: the date and time up to the second are formatted once a second,
    not once a line (every turn writes six lines, issue 24), and the microseconds are
    taken from ``time.time_ns`` by integer division (1.5 -> 0.6 us hot: the float's
    subtraction and scaling were half of a stamp)."""

    __slots__ = ("_second",)

    def __init__(self) -> None:
        self._second: tuple[int, str, str] = (-1, "", "")  # replaced whole: thread-safe

    def __call__(self, _logger: Any, _method: str, event_dict: Any) -> Any:
        micros = time.time_ns() // 1000
        second = micros // 1_000_000
        cached = self._second
        if cached[0] != second:
            utc = datetime.datetime.fromtimestamp(second, datetime.UTC)
            text = utc.strftime("%Y-%m-%dT%H:%M:%S")
            cached = self._second = (second, f"{text}Z", f"{text}.")
        micros -= second * 1_000_000
        # The six digits as the last six of a seven-digit number's text: a third cheaper
        # than the ``06d`` format (the dearest step of a stamp in a turn, issue 24 goal 1).
        event_dict["timestamp"] = (
            f"{cached[2]}{str(micros + 1_000_000)[1:]}Z" if micros else cached[1]
        )
        return event_dict


_bound: dict[str, tuple[tuple[Any, ...], Any]] = {}

_own_processors: list[Any] | None = None
"""The processor chain :func:`configure_logging` made last: a line through it cannot
fail (the JSON renderer writes what it cannot encode as its ``str``)."""

_LINE_METHODS = frozenset(
    ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "msg", "log")
)
_BINDING_METHODS = frozenset(("bind", "new", "unbind", "try_unbind"))
_logging_failed = False


class _Guarded:
    """A bound logger of a configuration other than :func:`configure_logging`'s (an
    application's own processors, a handler of its own), whose lines never raise into
    the runtime: a processor that raises crashed the supervisor logging an actor's
    crash, and the turn logging its save, taking the whole host down. A line that fails
    is dropped; the first such failure is said once on stderr. Anything else (the
    processors, the wrapped logger, ``is_enabled_for``) is the wrapped logger's."""

    __slots__ = ("_wrapped",)

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._wrapped, name)
        if name in _LINE_METHODS:
            return functools.partial(_guarded_line, attr)
        if name in _BINDING_METHODS:
            return lambda *args, **kw: _Guarded(attr(*args, **kw))
        return attr


def _guarded_line(method: Any, *args: Any, **kw: Any) -> Any:
    try:
        return method(*args, **kw)
    except Exception as exc:
        _say_logging_failed(exc)
        return None


def _say_logging_failed(exc: Exception) -> None:
    """One line on stderr, the first time a line of the application's logging
    configuration fails: the lines that fail are dropped, the runtime goes on."""
    global _logging_failed
    if _logging_failed:
        return
    _logging_failed = True
    stream = sys.__stderr__
    try:
        if stream is not None:
            stream.write(
                "axon: a log line failed in the logging configuration and was dropped "
                f"({redact_text(describe_exception(exc))}); later failures are dropped "
                "silently\n"
            )
            stream.flush()
    except Exception:  # a closed stderr: nothing more to say it with
        pass


def get_logger(name: str = "axon") -> Any:
    """A structlog logger bound with ``logger=name``.

    Made once per name and structlog configuration, not once per call: every session's
    actors ask for theirs as they start (issue 24). A bound logger is immutable (binding
    makes a new one), so sharing it is safe; a new configuration makes a new one (the
    objects of the one it was made with are compared by identity, and kept alive)."""
    config = structlog.get_config()
    key = (
        config["processors"],
        config["wrapper_class"],
        config["logger_factory"],
        config["context_class"],
    )
    cached = _bound.get(name)
    if cached is not None and all(a is b for a, b in zip(cached[0], key, strict=True)):
        return cached[1]
    logger = structlog.get_logger(name).bind(logger=name)
    if config["processors"] is not _own_processors:
        logger = _Guarded(logger)
    _bound[name] = (key, logger)
    return logger


def chain_redacts(logger: Any) -> bool:
    """Whether ``logger``'s processors redact every line it writes (those of
    :func:`configure_logging` do; an application's own, structlog's defaults, may not).

    Asked for each line, not once: ``structlog.testing.capture_logs`` and a reconfigured
    chain change the very list a bound logger holds. A logger that is not a bound
    structlog logger (no ``_processors``) is taken not to redact."""
    processors = getattr(logger, "_processors", None)
    return isinstance(processors, list) and redact_processor in processors


def log_exception(logger: Any, event: str, **fields: Any) -> None:
    """``logger.exception(event, **fields)`` (call it in an ``except`` block), redacted
    whoever configured the logging, as the log tap's lines are.

    :func:`configure_logging`'s chain renders the traceback to text before it redacts.
    Another chain (the application's, structlog's defaults) may not redact at all, and
    structlog's default renderer with ``rich`` installed prints every frame's local
    variables: a provider's key, a store URL's password. For such a chain the traceback
    goes as the ``exception`` field instead, plain text without the locals, redacted."""
    if chain_redacts(logger):
        logger.exception(event, **fields)
    else:
        logger.error(event, exception=redact(traceback.format_exc()), **redact(fields))


def level_enabled(logger: Any, level: str) -> bool:
    """Whether ``logger`` would emit at ``level`` (used to skip building log events)."""
    try:
        return logger.is_enabled_for(_LEVELS[level])
    except AttributeError:
        return True
