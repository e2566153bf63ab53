"""The loopback SSE server: a separate process replaying pre-generated bodies.

Run as ``python -m benchmarks.server``; it prints ``PORT <n>`` and serves until its stdin
closes (so it never outlives the benchmark). The path picks the body::

    /<format>/<deltas>/<mode>/...      format: openai | anthropic
                                       mode:   burst | paced

so an OpenAI client uses ``base_url=http://127.0.0.1:<port>/openai/1000/burst/v1`` and an
Anthropic client ``base_url=http://127.0.0.1:<port>/anthropic/1000/burst``.

``burst`` writes the whole body at once (the client-side cost of a stream, nothing else);
``paced`` writes the first events, waits :data:`PACE_PAUSE` seconds, then the rest, so the
first delta is on the wire before anything after it (time-to-first-delta).

It runs in its own process (a thread per connection, HTTP/1.1 keep-alive, chunked
transfer encoding as the real APIs use) so its work never runs on the event loop being
measured; the bodies are built once, before the first request, and cached.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from functools import cache

from benchmarks.sse import body, split_events

PACE_HEAD_EVENTS = 3
"""Events written before the pause in ``paced`` mode (role/start events + first delta)."""
PACE_PAUSE = 0.05
SENT_LOG_ENV = "AXON_BENCH_SENT_LOG"
"""A file the server appends ``time.perf_counter()`` to, one line per paced response,
just before it writes the first events: where the clocks of a first delta start from
(``perf_counter`` is the system's monotonic clock, the same in every process on Linux)."""
_sent_lock = threading.Lock()


def _note_sent() -> None:
    path = os.environ.get(SENT_LOG_ENV)
    if path:
        with _sent_lock, open(path, "a", encoding="ascii") as f:
            f.write(f"{time.perf_counter()!r}\n")


@cache
def _body(fmt: str, n: int) -> bytes:
    return body(fmt, n)


@cache
def _paced(fmt: str, n: int) -> tuple[bytes, bytes]:
    events = split_events(_body(fmt, n))
    # Anthropic: message_start, content_block_start, ping precede the first delta;
    # Gemini: the first chunk is the first delta.
    k = {"anthropic": PACE_HEAD_EVENTS + 1, "gemini": 1}.get(fmt, PACE_HEAD_EVENTS)
    return b"".join(events[:k]), b"".join(events[k:])


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _read_request(conn: socket.socket, buf: bytearray) -> str | None:
    """Read one request (headers + Content-Length body); its path, or None at EOF."""
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end]).decode("latin-1")
    del buf[:end]
    lines = head.split("\r\n")
    path = lines[0].split(" ")[1]
    length = 0
    for line in lines[1:]:
        if line.lower().startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    while len(buf) < length:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    del buf[:length]
    return path


def _serve(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    try:
        while True:
            path = _read_request(conn, buf)
            if path is None:
                return
            try:
                fmt, n, mode = path.strip("/").split("/")[:3]
                count = int(n)
                if fmt not in ("openai", "anthropic", "gemini") or mode not in ("burst", "paced"):
                    raise ValueError(path)
            except ValueError:
                msg = b"unknown path"
                conn.sendall(
                    b"HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(msg), msg)
                )
                continue
            head = (
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n"
                b"x-request-id: req_bench\r\nrequest-id: req_bench\r\n\r\n"
            )
            if mode == "burst":
                conn.sendall(head + _chunk(_body(fmt, count)) + b"0\r\n\r\n")
            else:
                first, rest = _paced(fmt, count)
                _note_sent()
                conn.sendall(head + _chunk(first))
                time.sleep(PACE_PAUSE)
                conn.sendall(_chunk(rest) + b"0\r\n\r\n")
    except OSError:
        return
    finally:
        conn.close()


def main() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            threading.Thread(target=_serve, args=(conn,), daemon=True).start()

    # Pre-build the bodies the benchmarks use, so no request pays for it.
    for spec in sys.argv[1:]:
        fmt, n = spec.split(":")
        _body(fmt, int(n))
        _paced(fmt, int(n))
    threading.Thread(target=accept, daemon=True).start()
    print(f"PORT {listener.getsockname()[1]}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin (or dies)


if __name__ == "__main__":
    main()
