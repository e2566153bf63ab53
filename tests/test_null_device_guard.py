"""The guard that stops the run when ``/dev/null`` stops being a character device
(tests/conftest.py, tests/support/machine_guard.py). One run, as root, left a regular
file there. A FIFO, a file and a link of the test's own stand in for a replaced device:
the real one is only looked at."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import machine_guard

ROOT = Path(__file__).resolve().parent.parent


def test_the_null_device_as_it_is_passes() -> None:
    assert machine_guard.null_device_problem() is None


def test_a_regular_file_a_fifo_a_link_or_nothing_in_its_place_is_said(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(os.devnull)
    said = {
        name: machine_guard.null_device_problem(str(tmp_path / name))
        for name in ("file", "fifo", "link", "gone")
    }
    assert said == {
        "file": f"{tmp_path / 'file'} is a regular file now, no longer the character device",
        "fifo": f"{tmp_path / 'fifo'} is a FIFO now, no longer the character device",
        "link": f"{tmp_path / 'link'} is a symbolic link now, no longer the character device",
        "gone": f"{tmp_path / 'gone'} is gone (No such file or directory)",
    }


INNER = """
import os
from tests.support import machine_guard

def test_replaces_it():
    machine_guard.NULL_DEVICE = {fifo!r}  # what the guard sees from now on

def test_after_it():
    pass
"""


def test_the_run_stops_naming_the_test_after_which_it_was_replaced(tmp_path: Path) -> None:
    """A run of two tests under the suite's own conftest fixtures: the first points the
    guard at a FIFO (as if it had replaced the device); the run stops there, the second
    never runs."""
    fifo = tmp_path / "null"
    os.mkfifo(fifo)
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "pytest.ini").write_text("[pytest]\n")
    (inner / "conftest.py").write_text(
        "from tests.conftest import (\n"
        "    pytest_runtest_setup, pytest_runtest_teardown, pytest_sessionstart\n"
        ")\n"
    )
    (inner / "test_inner.py").write_text(INNER.format(fifo=str(fifo)))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=inner,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert (
        f"machine guard: {fifo} is a FIFO now, no longer the character device: "
        "changed by test_inner.py::test_replaces_it"
    ) in done.stdout + done.stderr
    assert "test_after_it" not in done.stdout
