"""What the asyncio bridge's attack files share (tests/test_aio_attacks.py,
tests/test_aio_gone.py): ``asyncio.run`` bounded by ``LIMIT``, and an agent that talks
without end when asked for "a lot"."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from actors.providers.scripted import ScriptedProvider
from runtime import Agent, UserMessage

LIMIT = 30  # seconds: a hang fails its test instead of stalling the run
ROOT = Path(__file__).resolve().parents[2]  # the checkout: a child process's cwd and path


def run(main: Any) -> Any:
    """``asyncio.run(main())``, failing after ``LIMIT`` seconds rather than hanging."""

    async def bounded() -> Any:
        async with asyncio.timeout(LIMIT):
            return await main()

    return asyncio.run(bounded())


def endless() -> Iterator[str]:
    for i in itertools.count():
        yield f"w{i} "


def talker() -> Agent:
    """Talks without end when asked for "a lot"; answers "Fine." otherwise."""

    def reply(request: Any) -> Iterator[str]:
        asked = [m.text for m in request.messages if isinstance(m, UserMessage)]
        return endless() if asked[-1] == "a lot" else iter(["Fine."])

    return Agent(provider=ScriptedProvider(responder=reply))
