"""``run_sync``: one turn from ordinary blocking code (a script, a notebook cell, a test).

Everything else in Axon is async and runs under Trio. A script that wants one answer
should not have to write ``async def main`` and ``trio.run`` for it: :func:`run_sync`
does exactly that, around a :class:`~runtime.app.host.Host` of its own that lives for the
one turn, and returns what ``await session.run(...)`` returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from runtime.actor_messages import TurnResult
from runtime.agent import Agent
from runtime.app.host import Host
from runtime.errors import ConfigurationError
from runtime.media import UserInput
from runtime.messages import Message


def run_sync(
    agent: Agent,
    input: UserInput,
    *,
    deps: Any = None,
    history: Sequence[Message] | None = None,
    store: Any = None,
    session_id: str | None = None,
) -> TurnResult:
    """Run one turn of ``agent`` on ``input`` and return its :class:`TurnResult`
    (``result.text`` is the answer), blocking until the turn is over.

    A fresh Trio run and host each call: nothing is kept in memory between calls.
    ``deps`` reach the tools as ``ToolContext.deps``; ``history`` is the conversation so
    far (the turn continues it); ``store`` (a path, a URL or a ``Store``; ``None``: in
    memory only) with ``session_id`` resumes and saves a stored session instead. As
    with ``session.run``, a turn that fails returns with ``result.error`` set.

    It cannot be called from inside a Trio program (it would block the program's own
    event loop): there, ``await session.run(...)`` on a host does the same.
    """
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        pass  # no Trio run in this thread: the expected case
    else:
        raise ConfigurationError(
            "run_sync() cannot be called from inside a Trio program; use "
            "`session = await host.open_session(agent)` and `await session.run(...)`"
        )

    async def one_turn() -> TurnResult:
        async with Host.open(store=store) as host:
            session = await host.open_session(agent, session_id, deps=deps, history=history)
            return await session.run(input)

    return trio.run(one_turn)
