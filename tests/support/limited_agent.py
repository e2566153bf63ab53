"""The agent of the rate-limit worker test (``--agent tests.support.limited_agent:agent``).

A scripted model answering ``echo: <input>`` in one step, on a provider limited to
:data:`RPM` requests a minute for all workers together, by a clock that all the worker
processes share and that runs :envvar:`AXON_TEST_CLOCK_SPEED` times faster than the
wall clock from :envvar:`AXON_TEST_CLOCK_EPOCH` (a minute of limits in seconds).
"""

from __future__ import annotations

import os
import time

import trio

from actors.providers.scripted import ScriptedProvider
from runtime.actor_messages import InferRequest
from runtime.agent import Agent
from runtime.messages import UserMessage
from runtime.ratelimit import RateLimit

RPM = 60


class ScaledClock:
    """Wall-clock seconds since the test's epoch, times its speed."""

    def __init__(self) -> None:
        self.epoch = float(os.environ.get("AXON_TEST_CLOCK_EPOCH", "0"))
        self.speed = float(os.environ.get("AXON_TEST_CLOCK_SPEED", "1"))

    def now(self) -> float:
        return (time.time() - self.epoch) * self.speed

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds / self.speed)


def echo(request: InferRequest) -> list[str]:
    user = next(m for m in reversed(request.messages) if isinstance(m, UserMessage))
    return [f"echo: {user.text}"]


agent = Agent(
    name="limited",
    provider=ScriptedProvider(
        responder=echo,
        keep_requests=0,
        rate_limit=RateLimit(requests_per_minute=RPM, clock=ScaledClock()),
    ),
)
