"""What a session does with a new user message while one of its turns runs.

A session runs one turn at a time. When a user message arrives while a turn runs, the
session's *busy strategy* decides (docs/approval.md, "Busy sessions"):

``reject`` (the default)
    refuse it: :class:`~runtime.errors.SessionBusy` (HTTP 409);
``enqueue``
    run its turn after the running one (and after those enqueued before it), in order,
    each with its own turn id and result;
``interrupt``
    cancel the running turn (saved, marked interrupted, as any cancel saves it) and run
    the new one;
``steer``
    hand the message to the running turn, which inserts it at its next step boundary:
    the model sees it before its next call. If the turn ends without another step, the
    message starts a new turn instead.

A turn that *waits* for input (an approval, a client tool) is not running: a new user
message then starts a new turn under every strategy, which denies the waiting calls
with reason ``superseded``.

Declared on the agent (``Agent(on_busy=...)``), or per session, overriding the agent's
(``host.open_session(agent, on_busy=...)``, ``serve --on-busy``).
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

from runtime.errors import ConfigurationError

OnBusy: TypeAlias = Literal["reject", "enqueue", "interrupt", "steer"]
REJECT: OnBusy = "reject"
ENQUEUE: OnBusy = "enqueue"
INTERRUPT: OnBusy = "interrupt"
STEER: OnBusy = "steer"
STRATEGIES: tuple[OnBusy, ...] = (REJECT, ENQUEUE, INTERRUPT, STEER)

INTERRUPTED_BY_NEW = "interrupted by a new message"
"""The abort reason of a turn an ``interrupt`` strategy cancelled."""


def check_on_busy(value: Any) -> OnBusy:
    """``value`` if it names a strategy, else :class:`~runtime.errors.ConfigurationError`."""
    if value not in STRATEGIES:
        raise ConfigurationError(f"on_busy must be one of {', '.join(STRATEGIES)}, not {value!r}")
    return value  # type: ignore[no-any-return]


__all__ = [
    "ENQUEUE",
    "INTERRUPT",
    "INTERRUPTED_BY_NEW",
    "REJECT",
    "STEER",
    "STRATEGIES",
    "OnBusy",
    "check_on_busy",
]
