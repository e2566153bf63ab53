"""Proof that a test run left the machine's own PostgreSQL and Redis alone.

``.ci/run`` calls ``record`` before the README's test command and ``check`` after it:

* PostgreSQL on 127.0.0.1:5432: ``pg_postmaster_start_time()`` must be the same after
  the run (a restart changes it);
* Redis on 127.0.0.1:6379: its ``run_id`` must be the same (a restart changes it), and a
  sentinel key written by ``record`` must still hold its value (a flush or a restart
  without persistence loses it). ``check`` deletes the sentinel.
* ``/dev/null`` must still be a character device (one run, as root, left a regular file
  there; everything that writes to it afterwards then fills that file). The suite checks
  it before and after each test too (tests/conftest.py), naming the test that changed it.

A server that does not answer at ``record`` is not checked (and said so). This writes one
key into the machine's Redis, so it is for CI's throwaway machine only: the suite itself
never connects to these servers.

Usage: ``python3 -m tests.support.machine_guard record|check STATE_FILE``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import stat
import sys
from pathlib import Path

PG = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS = ("127.0.0.1", 6379)
SENTINEL = "axon:ci:machine-guard"
NULL_DEVICE = os.devnull
"""The path :func:`null_device_problem` looks at (a test of the guard points it elsewhere)."""


def null_device_problem(path: str | None = None) -> str | None:
    """What is wrong with the null device (:data:`NULL_DEVICE`): ``None`` while it is a
    character device. One ``lstat``, a microsecond: cheap enough for every test."""
    path = NULL_DEVICE if path is None else path
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        return f"{path} is gone ({exc.strerror})"
    if stat.S_ISCHR(mode):
        return None
    kind = (
        "a regular file"
        if stat.S_ISREG(mode)
        else "a symbolic link"
        if stat.S_ISLNK(mode)
        else "a FIFO"
        if stat.S_ISFIFO(mode)
        else "a directory"
        if stat.S_ISDIR(mode)
        else "no character device"
    )
    return f"{path} is {kind} now, no longer the character device"


def _redis(*command: str, at: tuple[str, int] = REDIS) -> str | None:
    """One command on a Redis (the machine's by default) over RESP; its reply, or None."""
    payload = f"*{len(command)}\r\n" + "".join(f"${len(c)}\r\n{c}\r\n" for c in command)
    try:
        with socket.create_connection(at, timeout=3) as sock:
            sock.sendall(payload.encode())
            reply = b""
            while True:
                chunk = sock.recv(65536)
                reply += chunk
                if not chunk or _complete(reply):
                    break
    except OSError:
        return None
    return reply.decode(errors="replace")


def _complete(reply: bytes) -> bool:
    if reply[:1] in (b"+", b"-", b":"):
        return reply.endswith(b"\r\n")
    if reply[:1] == b"$":
        head, _, rest = reply.partition(b"\r\n")
        size = int(head[1:])
        return size < 0 or len(rest) >= size + 2
    return False


def _bulk(reply: str | None) -> str | None:
    if reply is None or not reply.startswith("$") or reply.startswith("$-1"):
        return None
    head, _, body = reply.partition("\r\n")
    return body[: int(head[1:])]


def _redis_run_id(at: tuple[str, int]) -> str | None:
    info = _bulk(_redis("INFO", "server", at=at))
    if info is None:
        return None
    for line in info.splitlines():
        if line.startswith("run_id:"):
            return line.split(":", 1)[1].strip()
    return None


def _pg_start_time(url: str) -> str | None:
    try:
        import psycopg
    except ImportError:
        return None
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            row = conn.execute("SELECT pg_postmaster_start_time()::text").fetchone()
    except psycopg.Error:
        return None
    return None if row is None else str(row[0])


def record(state: Path, *, pg: str = PG, redis: tuple[str, int] = REDIS) -> None:
    """Write what ``check`` compares against into ``state`` (and set the sentinel key)."""
    token = secrets.token_hex(8)
    run_id = _redis_run_id(redis)
    if run_id is not None:
        _redis("SET", SENTINEL, token, at=redis)
    facts = {"pg_start": _pg_start_time(pg), "redis_run_id": run_id, "sentinel": token}
    state.write_text(json.dumps(facts))
    print(
        "machine guard: PostgreSQL started "
        f"{facts['pg_start'] or '(not answering: not checked)'}, "
        f"Redis run_id {run_id or '(not answering: not checked)'}"
    )


def check(state: Path, *, pg: str = PG, redis: tuple[str, int] = REDIS) -> int:
    """0 when both servers are as ``record`` found them and the null device is one; else
    1, each change said."""
    facts = json.loads(state.read_text())
    problems = []
    null = null_device_problem()
    if null is not None:
        problems.append(f"{null}: the test run (or something beside it) replaced it")
    if facts["pg_start"] is not None and _pg_start_time(pg) != facts["pg_start"]:
        problems.append("the machine's PostgreSQL was restarted (or stopped) by the test run")
    if facts["redis_run_id"] is not None:
        if _redis_run_id(redis) != facts["redis_run_id"]:
            problems.append("the machine's Redis was restarted (or stopped) by the test run")
        elif _bulk(_redis("GET", SENTINEL, at=redis)) != facts["sentinel"]:
            problems.append("the machine's Redis lost a key during the test run (flushed?)")
        _redis("DEL", SENTINEL, at=redis)
    for problem in problems:
        print(f"machine guard: {problem}", file=sys.stderr)
    if not problems:
        print("machine guard: the machine's PostgreSQL, Redis and /dev/null were left alone")
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("record", "check"):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    state = Path(argv[1])
    if argv[0] == "record":
        record(state)
        return 0
    return check(state)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
