"""An attacker's HTTP server on loopback that records every request it gets.

Used to prove that nothing a schema says makes the host open a connection: a test points
a ``$ref`` at :func:`recording_server`'s URL and asserts that its ``contacts`` stay empty.

It runs in a thread of its own, not in the test's Trio run, on purpose: the bug it
catches is a blocking ``urlopen`` on the Trio thread, which would keep a Trio listener
from ever answering, so the old code would hang the test instead of failing it. This
server answers at once (a JSON schema, ``{"type": "integer"}``), and the test fails on
the recorded request.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import attrs


@attrs.frozen(kw_only=True, slots=True)
class Listener:
    url: str
    """``http://127.0.0.1:PORT``."""
    contacts: list[str]
    """The path of every request received, in order."""


@contextmanager
def recording_server() -> Iterator[Listener]:
    """Serve on a free loopback port until the block ends; yield what it records."""
    contacts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            contacts.append(self.path)
            body = b'{"type": "integer"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Listener(url=f"http://127.0.0.1:{server.server_address[1]}", contacts=contacts)
    finally:
        server.shutdown()
        server.server_close()
