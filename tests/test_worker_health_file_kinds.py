"""``worker --health-file`` given something that is no regular file: ``/dev/null`` ("no
file wanted", one might think), a FIFO, a symbolic link. The worker touched the path,
removed it (a check before it starts), touched it again at its first beat: as root,
``/dev/null`` itself was unlinked and a regular file took its place. A FIFO stands in
for the device here (it is no regular file either, and the test's own)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.app.worker import _remove, _touch

ROOT = Path(__file__).resolve().parent.parent
WORKER = (sys.executable, "-m", "runtime", "worker")


def _fifo(tmp_path: Path) -> tuple[Path, int]:
    """A FIFO with a reader held open (so that an ``open`` for writing does not wait)."""
    path = tmp_path / "alive"
    os.mkfifo(path)
    return path, os.open(path, os.O_RDONLY | os.O_NONBLOCK)


def test_a_fifo_is_refused_by_the_touch_and_left_by_the_removal(tmp_path: Path) -> None:
    path, reader = _fifo(tmp_path)
    try:
        with pytest.raises(OSError, match="not a regular file"):
            _touch(path)
        _remove(path)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


def test_a_symbolic_link_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("theirs")
    os.utime(target, (0, 0))
    link = tmp_path / "alive"
    link.symlink_to(target)
    with pytest.raises(OSError, match="a symbolic link"):
        _touch(link)
    _remove(link)
    assert link.is_symlink() and os.stat(target).st_mtime == 0


def test_a_missing_file_is_created_then_removed(tmp_path: Path) -> None:
    path = tmp_path / "alive"
    _touch(path)
    assert stat.S_ISREG(os.lstat(path).st_mode)
    _remove(path)
    assert not path.exists()


def test_the_worker_command_refuses_a_fifo_before_it_starts_and_leaves_it(
    tmp_path: Path,
) -> None:
    """Refused before the store is opened (port 1: nothing is reached)."""
    path, reader = _fifo(tmp_path)
    try:
        done = subprocess.run(
            [*WORKER, "--store", "postgresql://127.0.0.1:1/x", "--health-file", str(path)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.close(reader)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"error: cannot write --health-file {path}: not a regular file: give the path of a "
        "file (created if missing, removed at exit)"
    )
    assert stat.S_ISFIFO(os.lstat(path).st_mode)
