"""What a block of code left behind: an async generator unexhausted and unclosed; the
live objects of Axon's own classes and Trio's tasks (the leak rooms,
``tests/test_host_leaks.py`` and ``tests/test_worker_leaks.py``).


Trio finalizes such a generator when the garbage collector finds it, and warns
(``ResourceWarning``: "Async generator ... was garbage collected before it had been
exhausted"): a stream's byte iterator left that way holds its connection until then, and
a host run with ``-W error`` fails on the warning. The warnings are recorded here, not
raised: Trio raises them inside the collector, where an exception is only printed.
"""

from __future__ import annotations

import gc
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from actors.log_tap import _Plan

ABANDONED = "garbage collected before it had been exhausted"


@contextmanager
def abandoned_generators(generation: int = 2) -> Iterator[list[str]]:
    """The list of the generators' names Trio warned of inside the block (collected at
    its end, ``gc.collect(generation)``: 1 for a block run many times, whose cycles are
    young, at a fraction of a full collection's cost), filled when the block ends."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        yield found
        gc.collect(generation)
    found.extend(
        str(w.message).split("'")[1]
        for w in seen
        if issubclass(w.category, ResourceWarning) and ABANDONED in str(w.message)
    )


def runtime_objects() -> Counter[str]:
    """The live objects of the runtime's own classes, by class, after a full collection
    (the stores' excepted: they keep conversations, and the fences of the last 65,536
    sessions; and the log tap's plans, one per event class, made on its first line: an
    event first logged late, a retry on a loaded machine, is not a leak)."""
    gc.collect()
    found: Counter[str] = Counter()
    for obj in gc.get_objects():
        module = type(obj).__module__
        if (
            isinstance(module, str)  # (a class of another test's may have a descriptor)
            and module.startswith(("runtime.", "actors."))
            and not module.startswith("actors.stores")
            and type(obj) is not _Plan
        ):
            found[f"{module}.{type(obj).__qualname__}"] += 1
    return found


def tasks() -> int:
    """Trio's tasks, the root's included."""

    def count(task: Any) -> int:
        return 1 + sum(count(child) for n in task.child_nurseries for child in n.child_tasks)

    return count(trio.lowlevel.current_root_task())
