"""Whether a block of code left an async generator unexhausted and unclosed.

Trio finalizes such a generator when the garbage collector finds it, and warns
(``ResourceWarning``: "Async generator ... was garbage collected before it had been
exhausted"): a stream's byte iterator left that way holds its connection until then, and
a host run with ``-W error`` fails on the warning. The warnings are recorded here, not
raised: Trio raises them inside the collector, where an exception is only printed.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

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
