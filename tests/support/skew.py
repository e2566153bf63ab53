"""Subprocesses whose wall clock is off: the environment that makes
tests/support/skewed_clock/sitecustomize.py move their ``time.time``."""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def skewed(seconds: float) -> dict[str, str]:
    """Environment entries for a subprocess whose wall clock reads ``seconds`` ahead of
    this machine's (behind, if negative)."""
    return {
        "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "skewed_clock"), REPO]),
        "AXON_TEST_CLOCK_OFFSET": repr(float(seconds)),
    }
