"""Each test leaves the process's logging as it found it (tests/conftest.py), down to
whether structlog was configured at all: the next test logs as it would in a process of
its own, not through what an earlier test set up (tests/support/logging_state.py: the
stray log lines a full run printed on the terminal)."""

from __future__ import annotations

import io
import logging

import pytest
import structlog

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, Host
from runtime.logging import configure_logging
from tests.support.logging_state import logging_left_as_found


def test_structlog_found_unconfigured_is_left_unconfigured():
    structlog.reset_defaults()
    with logging_left_as_found():
        configure_logging("info", stream=io.StringIO())
    assert not structlog.is_configured()


async def test_a_host_opened_after_a_test_that_configured_logging_logs_no_turn(
    tmp_path, capsys: pytest.CaptureFixture[str]
):
    """In a process of its own a host that nobody configured logging for writes warnings
    only, as JSON on stderr; an info line on stdout means an earlier test's configuration
    was still there (structlog's defaults, every level, printed to ``sys.stdout`` as it is
    at each write: from a host's thread, the real terminal between two of pytest's
    captures)."""
    structlog.reset_defaults()
    with logging_left_as_found():
        configure_logging("info", stream=io.StringIO())
    async with Host.open(store=tmp_path / "s.db") as host:
        session = await host.open_session(Agent(provider=ScriptedProvider([["hi"]])))
        await session.run("hello")
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("name", ["psycopg", "coredis"])
def test_a_library_logger_is_left_propagating_at_its_level(name: str):
    logger = logging.getLogger(name)
    logger.propagate = True  # as in a process where nobody configured logging
    logger.setLevel(logging.NOTSET)
    before = (logger.propagate, logger.level, list(logger.handlers))
    with logging_left_as_found():
        configure_logging("info", stream=io.StringIO())
    assert (logger.propagate, logger.level, list(logger.handlers)) == before
