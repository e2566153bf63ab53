"""Identifier generation: short, unique, sortable enough for logs."""

from __future__ import annotations

import itertools
import os
import re

_counter = itertools.count()
_prefix = os.urandom(4).hex()


def _new_prefix() -> None:
    """A forked child draws its own prefix: with its parent's (and counter) two
    children of one parent (a prefork server's) made the same ids, e.g. the same
    host name in a store's registry of the hosts writing it: one row for two
    processes, each alone by it (branch ``attackregistry``)."""
    global _prefix
    _prefix = os.urandom(4).hex()


os.register_at_fork(after_in_child=_new_prefix)


def new_id(kind: str) -> str:
    """A process-unique id such as ``part_3f2a9c1e_17``; cheap enough for the hot path."""
    return f"{kind}_{_prefix}_{next(_counter)}"


def repeated_call_id(original: str, step: int, k: int = 1) -> str:
    """The id the runtime gives a tool call whose provider's id ``original`` the turn's
    message already holds (a server numbering calls per response): ``{original}-{step}``,
    then ``-{step}-{k}`` for ``k`` from 2 while that one is taken too
    (``actors.turn.parts.CallIds``). Letters, digits, ``_`` and ``-`` stay so: every API's
    id pattern takes it."""
    return f"{original}-{step}" if k == 1 else f"{original}-{step}-{k}"


_RENAMED_TAIL = re.compile(r"-\d+(?:-\d+)?")


def is_call_id_of(call_id: str, original: str) -> bool:
    """Whether ``call_id`` is the provider's ``original`` id, or the one
    :func:`repeated_call_id` made of it: a provider that recorded the id a server gave a
    call (a reasoning item's link to the item after it) still knows the call."""
    if call_id == original:
        return True
    return call_id.startswith(original) and (
        _RENAMED_TAIL.fullmatch(call_id, len(original)) is not None
    )
