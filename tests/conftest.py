"""Shared test setup: dummy provider keys, hypothesis profile, shared fixture paths."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from trio.testing import MockClock

from tests.support import machine_guard
from tests.support.clock import thread_aware_autojump_clock
from tests.support.logging_state import logging_left_as_found, logs  # noqa: F401 (fixture)

# No test may reach a real provider: the SDKs get dummy keys and loopback URLs only.
os.environ["OPENAI_API_KEY"] = "sk-test-dummy"
os.environ["ANTHROPIC_API_KEY"] = "sk-ant-test-dummy"

settings.register_profile(
    "axon", deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("axon")


@pytest.fixture
def autojump_clock() -> MockClock:
    """pytest-trio's ``autojump_clock``, except that virtual time does not pass while a
    worker thread runs (a SQLite store call): see :mod:`tests.support.clock`."""
    return thread_aware_autojump_clock()


@pytest.fixture(autouse=True)
def _logging_configuration_restored() -> Iterator[None]:
    """Each test leaves structlog (and the library loggers it routes) as it found them. A
    test that runs a command configures logging onto its own captured stderr, which is
    closed once it ends; a later test that logs would write into that closed file."""
    with logging_left_as_found():
        yield


# -- the machine's /dev/null: one run, as root, left a regular file there -----------------
# Checked by hooks rather than autouse fixtures: one ``lstat`` (about 4 us on this shared
# machine) before each test's setup and after its teardown (every fixture of it, and a
# module's when the next test is another module's), no fixture machinery around it. The run
# stops at the first test after which it is no longer a character device, naming it:
# everything after would write into the regular file (tests/support/machine_guard.py).


def pytest_sessionstart(session: pytest.Session) -> None:
    _stop_unless_null_device_intact("before the run started (not this run's doing)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _stop_unless_null_device_intact(f"before {item.nodeid} (between tests)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        _stop_unless_null_device_intact(f"by {item.nodeid} (its run or its fixtures)")


def _stop_unless_null_device_intact(when: str) -> None:
    problem = machine_guard.null_device_problem()
    if problem is not None:
        pytest.exit(f"machine guard: {problem}: changed {when}", returncode=3)


SHARED_STREAMS = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "streams"

# ``pg_url``: a fresh PostgreSQL schema per test (skips when the server is not reachable).
pytest_plugins = ["tests.support.pg"]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the PostgreSQL and Redis servers this run started (tests/support/services.py),
    then look at ``/dev/null`` once more (unless the run already stopped for it)."""
    from tests.support.services import close_all

    close_all()
    problem = machine_guard.null_device_problem()
    if problem is not None and exitstatus != 3:
        print(f"machine guard: {problem}: changed after the last test", file=sys.stderr)
        session.exitstatus = 3
