"""Stop a test run's own server once the run's process is gone, however it ended.

The run stops its servers at its end (pytest's session end, ``atexit`` as a backstop), but
neither runs when the run is killed: a ``timeout`` that sends ``SIGTERM``, an out-of-memory
kill, a closed terminal. A PostgreSQL started by ``pg_ctl`` and a ``redis-server`` then
outlive it, each holding a port and a temporary directory on the user's machine, one more
per killed run. So each server the run starts gets one of these watchers
(:func:`tests.support.services.watch`): a process of its own session (a ``Ctrl-C`` to the
run's process group does not reach it) that looks every half second whether the run's
process still exists and, once it does not, stops the server and deletes its directory.
It exits at once when the directory is gone (the run closed the server itself).

``python -m tests.support.reaper PID ROOT postgresql PG_CTL_COMMAND...`` or
``python -m tests.support.reaper PID ROOT redis`` (or ``pgbouncer``): a Redis server (a
PgBouncer) is found by its working directory, ``ROOT`` (a restarted one has another
process id).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL = 0.5
"""Seconds between two looks at the run's process."""


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts as gone: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def redis_pids(root: Path, name: bytes = b"redis") -> list[int]:
    """The ``redis-server`` processes started with ``--dir root``: found by their working
    directory, which ``--dir`` makes ``root`` (Redis rewrites its command line); with
    ``name`` ``b"pgbouncer"``, the ``pgbouncer`` started in ``root``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(entry / "cwd") == str(root) and name in (entry / "comm").read_bytes():
                found.append(int(entry.name))
    return found


def reap(root: Path, kind: str, command: list[str]) -> None:
    """Stop the server in ``root`` and delete the directory."""
    if kind == "postgresql":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60)  # fmt: skip
    else:
        for pid in redis_pids(root, b"pgbouncer" if kind == "pgbouncer" else b"redis"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str]) -> int:
    pid, root, kind, command = int(argv[1]), Path(argv[2]), argv[3], argv[4:]
    if os.fork() > 0:  # the caller waits for this first process only: it returns at once
        os._exit(0)
    os.setsid()
    while root.exists():
        if not alive(pid):
            reap(root, kind, command)
            break
        time.sleep(POLL)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
