"""Identifier generation: short, unique, sortable enough for logs."""

from __future__ import annotations

import itertools
import os

_counter = itertools.count()
_prefix = os.urandom(4).hex()


def new_id(kind: str) -> str:
    """A process-unique id such as ``part_3f2a9c1e_17``; cheap enough for the hot path."""
    return f"{kind}_{_prefix}_{next(_counter)}"
