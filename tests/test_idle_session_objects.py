"""An idle session's actors keep their attributes in CPython's shared-key form: a class
whose instances set more than it can share (or set one after a turn's own attributes
took the rest) gives every idle session's actor a dict of its own, 1.6 KB a session
(benchmarks 24.5: 4.15 -> 5.64 KB an idle session, before the runner's kept ids were
made a class default)."""

from __future__ import annotations

import gc

from actors.providers.scripted import ScriptedProvider
from actors.stores import MemoryStore
from runtime import Agent, Host


def _own_dict(obj: object) -> bool:
    """Whether ``obj`` holds its attributes in a dict of its own (a referent dict holding
    its attribute ``state`` or ``session_id``) rather than CPython's shared-key values."""
    return any(
        type(r) is dict and ("session_id" in r or "state" in r) for r in gc.get_referents(obj)
    )


async def test_an_idle_sessions_runner_and_controller_keep_no_dict_of_their_own() -> None:
    agent = Agent(name="echo", provider=ScriptedProvider(steps=[["ok"]] * 4))
    async with Host.open(store=MemoryStore()) as host:
        for i in range(3):  # turns first: their attributes take their places in the class
            warm = await host.open_session(agent, session_id=f"warm-{i}")
            async with warm.stream("hi", message_id=f"m{i}") as out:
                async for _ in out:
                    pass
        idle = await host.open_session(agent, session_id="idle")
        runner = idle.runner
        assert not _own_dict(runner), sorted(vars(runner))
        assert not _own_dict(runner.controller)
