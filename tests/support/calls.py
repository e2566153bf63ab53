"""The Python function calls a piece of code makes, counted by a profiler: tests that
pin a hot path's cost in calls (issue 24 goal 3: a relay writer's append, a flat
unstructure, a claim token) read them here, not in timings."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def python_calls(run: Callable[[], T]) -> tuple[T, list[str]]:
    """Run ``run()`` under a profiler: its result, and the name of each Python function
    it called, in order (``run`` itself not counted; C functions never are)."""
    calls: list[str] = []

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(count)
    try:
        result = run()
    finally:
        sys.setprofile(None)
    return result, calls[1:]
