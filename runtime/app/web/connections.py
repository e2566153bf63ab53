"""What a connection costs the ``serve`` process: its socket held no longer than it is
used, and room for many of them.

Imported only when serving (it imports Hypercorn). Two things, each found by holding
and churning connections against ``serve`` (docs/web.md, "Connections"):

* :func:`release_connections_on_close`: Hypercorn (0.18) kept the socket of a
  connection whose client had closed it, and that connection's two tasks, until its
  keep-alive timer ran out (5 s), because the timer was still running when the reader
  saw the end of the stream. Every client that sent a request, read the answer and
  closed its connection a moment later (a client that pools no connections, a browser
  tab closed, a load balancer's health check) cost the server a file descriptor for
  5 s: 200 such requests a second filled a default limit of 1,024, and the server
  stopped accepting connections and could not open its own (a turn's call to the model
  failed with "all attempts to connect ... failed").
* :func:`raise_open_file_limit`: ``serve`` raises its soft limit of open files to the
  hard one (Go's runtime does the same for every program), so a few thousand
  connections, idle or slow ones an attacker holds (up to the 5 s keep-alive for a
  request's head, ``--body-timeout`` for its body), cannot exhaust the 1,024 most
  systems give a process by default.
"""

from __future__ import annotations

from typing import Any

from hypercorn.events import Event, Updated
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer

OPEN_FILES_FALLBACK = 10240
"""The soft limit tried when the hard one cannot be set: macOS refuses more than
``OPEN_MAX`` (10,240) however high its hard limit, which it reports as unlimited."""


class ReleasingTCPServer(TCPServer):
    """Hypercorn's Trio connection, which stops its keep-alive timer once the client has
    closed the connection (or it could not be read), and starts none after, so that its
    socket is closed as soon as its answers are over, not when the timer runs out."""

    releases_on_close = True
    reading_over = False
    """Whether the reader has ended: no further request can come."""

    async def _read_data(self) -> None:
        await super()._read_data()
        # The reader has handed the protocol the close; what is left of the connection
        # is the answers being written (each ends on its own), then the socket's close.
        self.reading_over = True
        await self.idle_task.stop()

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated) and event.idle and self.reading_over:
            # An answer ended after the client had left (a stream, an answer written
            # while the close came in): there is no next request to wait for.
            return
        await super().protocol_send(event)


def release_connections_on_close() -> None:
    """Make Hypercorn's Trio worker serve each connection with :class:`ReleasingTCPServer`
    (once per process; a Hypercorn whose connection class no longer has the reader and
    timer this relies on is left as it is)."""
    current: Any = hypercorn_run.TCPServer
    if getattr(current, "releases_on_close", False):
        return
    if current is not TCPServer or not hasattr(TCPServer, "_read_data"):
        return  # not the class this was written against: leave it alone
    hypercorn_run.TCPServer = ReleasingTCPServer  # type: ignore[misc]


def raise_open_file_limit() -> int | None:
    """Raise this process's soft limit of open files (sockets included) to its hard
    limit, or to :data:`OPEN_FILES_FALLBACK` where the hard one is refused; the limit in
    force after, ``None`` where there is none to raise (Windows)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows has no such limit
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    for target in (hard, OPEN_FILES_FALLBACK):
        if soft == resource.RLIM_INFINITY or (target != resource.RLIM_INFINITY and target <= soft):
            break
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            continue
        break
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


__all__ = ["ReleasingTCPServer", "raise_open_file_limit", "release_connections_on_close"]
