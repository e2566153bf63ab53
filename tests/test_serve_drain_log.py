"""``serve --drain N``: the operator reads in the log when the drain starts (the
signal came: ``/readyz`` says ``draining``, the server goes on serving N seconds) and
when it ends (the server stops now), not only a silent pause before the shutdown."""

from __future__ import annotations

import os
import signal

import trio
from structlog.testing import capture_logs

from runtime.app.web.serve import _until_signal


async def test_a_drain_logs_one_warning_as_it_starts_and_one_as_it_ends(autojump_clock):
    drained: list[bool] = []
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_signal, 30.0, lambda: drained.append(True))
            await trio.sleep(1)  # the signal receiver is open
            os.kill(os.getpid(), signal.SIGTERM)
    lines = [(e["event"], e["log_level"], e.get("seconds")) for e in logs]
    assert drained == [True]
    assert lines == [("web.draining", "warning", 30.0), ("web.drained", "warning", 30.0)]


async def test_no_drain_logs_nothing(autojump_clock):
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_signal, 0.0, None)
            await trio.sleep(1)
            os.kill(os.getpid(), signal.SIGTERM)
    assert [e["event"] for e in logs] == []
