"""What each test leaves of the process's logging: as it found it (tests/conftest.py).

"As it found it" includes whether structlog was configured at all. Restoring an
unconfigured structlog with ``structlog.configure(**saved)`` configures it, with its
defaults: from then on :meth:`Host.open <runtime.app.host.Host.open>` takes it for the
application's choice and leaves it be, so every later test's host logs every line down to
debug, printed to ``sys.stdout`` as it is at each write (structlog's ``PrintLogger``).
From a host's own thread (``AsyncHost``, a server's) that is the real terminal whenever
pytest has stopped capturing between a test's phases: the stray lines of a full run, none
when the file ran alone (it then opened its hosts on an unconfigured structlog: quiet JSON
on the captured stderr).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import structlog


@contextmanager
def logging_left_as_found() -> Iterator[None]:
    """Leave structlog (configured or not) and the library loggers
    :func:`~runtime.logging.configure_logging` routes (their handlers, level and
    propagation) as the block found them."""
    from runtime.logging import LIBRARY_LOGGERS  # not at conftest's import: runtime's own

    configured = structlog.is_configured()
    saved = structlog.get_config()
    loggers = {
        name: (list(logger.handlers), logger.level, logger.propagate)
        for name in LIBRARY_LOGGERS
        for logger in [logging.getLogger(name)]
    }
    try:
        yield
    finally:
        if configured:
            structlog.configure(**saved)
        else:
            structlog.reset_defaults()
        for name, (handlers, level, propagate) in loggers.items():
            logger = logging.getLogger(name)
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate


@pytest.fixture
def logs(
    caplog: pytest.LogCaptureFixture,
) -> Iterator[tuple[io.StringIO, pytest.LogCaptureFixture]]:
    """Axon's log at ``debug`` (into the returned stream), and an application's root
    handler at ``DEBUG`` (``caplog``): what a leak test reads for a secret."""
    from runtime.logging import configure_logging  # not at conftest's import: runtime's own

    caplog.set_level(logging.DEBUG)
    stream = io.StringIO()
    configure_logging("debug", stream=stream)
    try:
        yield stream, caplog
    finally:
        configure_logging("warning")
