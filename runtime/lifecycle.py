"""``Event``, the base of the lifecycle events, apart from the events themselves.

Why apart: :mod:`runtime.events` builds the events, 27 attrs classes, a sixth of what
importing the contract costs a fresh process (issue 24, start-up). What the contract's
own machinery needs of them at import is nothing: ``from runtime import Event`` (a
subscription's ``isinstance``) is this one plain class, and the few events the
machinery publishes on a rare path (an inbox's :class:`~runtime.events.Lagged` notice,
the supervisor's ``actor.*`` events, an approval's decision, the host's eviction) are
named through this module's attributes, ``lifecycle.Lagged``: resolved from
:mod:`runtime.events` on first use (:pep:`562`) and then kept here as plain module
attributes, so the import system runs once per name, never again on that path. An
actor, which imports :mod:`runtime.events` itself, builds them when it is imported (the
host's assembly), as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from runtime.chunks import _repr

if TYPE_CHECKING:
    from runtime.events import ActorCrashed as ActorCrashed
    from runtime.events import ActorGaveUp as ActorGaveUp
    from runtime.events import ActorRestarted as ActorRestarted
    from runtime.events import Lagged as Lagged
    from runtime.events import SessionEvicted as SessionEvicted
    from runtime.events import ToolApprovalDecided as ToolApprovalDecided
    from runtime.events import ToolApprovalExpired as ToolApprovalExpired
    from runtime.events import TurnQueued as TurnQueued


class Event:
    """Base of all lifecycle events (for ``isinstance`` and subscriptions)."""

    __slots__ = ()
    kind: ClassVar[str]
    __repr__ = _repr


def __getattr__(name: str) -> Any:
    """An event class of :mod:`runtime.events` by its name (only an event class: not
    whatever else that module holds), imported on first use and kept in this module's
    namespace, so the next look-up is a plain attribute."""
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from runtime import events  # once per name: the value is kept below

    value = getattr(events, name, None)
    if not (isinstance(value, type) and issubclass(value, Event)):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = ["Event"]
