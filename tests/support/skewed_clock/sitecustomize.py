"""Loaded by a test's subprocess when this folder leads its ``PYTHONPATH``
(:func:`tests.support.skew.skewed`): moves ``time.time`` (and ``time.time_ns``) by
``AXON_TEST_CLOCK_OFFSET`` seconds, as a machine whose wall clock is off would read it
(a container without NTP, a VM resumed from suspend). The monotonic clocks, Trio's
among them, are left alone: they are not the wall clock."""

import os
import time

_offset = float(os.environ.get("AXON_TEST_CLOCK_OFFSET", "0") or 0)
if _offset:
    _time, _time_ns = time.time, time.time_ns
    time.time = lambda: _time() + _offset
    time.time_ns = lambda: _time_ns() + int(_offset * 1e9)
