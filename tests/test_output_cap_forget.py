"""What the turn runner learnt of a model's output maximum is forgotten after a while.

A call refused for its budget cap (``OutputCapTooLarge``, a model's "supports at most
16384 completion tokens") is made again with the cap lowered, and the maximum is kept
so later calls send it directly (actors/turn/output_caps.py). It was kept for the
process: a model whose maximum rose (a provider raising the limit, an alias moved to a
newer model, a local server restarted with another model under the same name) stayed
capped at the old one until a restart, and a process meeting many models kept them
all. Now an entry is forgotten ``FORGET_AFTER`` seconds later on the host's clock, and
at most ``MOST`` are kept (the oldest goes).
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider
from actors.turn import output_caps
from runtime import Agent, Budget, Host
from runtime.actor_messages import InferRequest
from runtime.errors import OutputCapTooLarge
from tests.test_output_cap_shared import written

BIG = 1_000_000
MAXIMUM = 16_384


@pytest.fixture(autouse=True)
def _fresh_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output_caps, "KNOWN", {})
    monkeypatch.setattr(output_caps, "LEARNT", {})


class Model(ScriptedProvider):
    """A model that refuses a cap above its maximum (``limit``, which may change), as
    OpenAI's API does, naming it; records every cap it was sent."""

    def __init__(self, name: str = "scripted") -> None:
        super().__init__(responder=self.respond, name=name)
        self.limit = MAXIMUM
        self.caps: list[Any] = []

    def respond(self, request: InferRequest) -> list[Any]:
        cap = request.max_output_tokens
        self.caps.append(cap)
        if cap is not None and cap > self.limit:
            return [OutputCapTooLarge(f"at most {self.limit}", limit=self.limit, status_code=400)]
        return written(3)


class Endpoint:
    """A provider as :mod:`~actors.turn.output_caps` keys it: its model, no cap of its own."""

    provider_name = "openai"
    endpoint = "chat"

    def __init__(self, model: str = "gpt-4o") -> None:
        self.model = model

    def sent_cap(self, settings: Any, left: int | None) -> int | None:
        return left


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def _learn(model: Any, clock: Clock, limit: int = MAXIMUM) -> bool:
    exc = OutputCapTooLarge("too large", limit=limit)
    return output_caps.learn(model, {}, exc, BIG, clock)


def test_a_maximum_learnt_is_kept_for_a_while_then_forgotten():
    model, clock = Endpoint(), Clock()
    output_caps.expire(model, clock)
    assert clock.reads == 0  # nothing learnt: the clock is not read (every call asks)
    assert _learn(model, clock)
    assert output_caps.asked(model, BIG) == MAXIMUM
    clock.now += output_caps.FORGET_AFTER - 1
    output_caps.expire(model, clock)
    assert output_caps.asked(model, BIG) == MAXIMUM
    clock.now += 1
    output_caps.expire(model, clock)
    assert output_caps.asked(model, BIG) == BIG  # sent the budget's cap again
    assert output_caps.KNOWN == output_caps.LEARNT == {}


def test_a_model_that_named_no_maximum_is_forgotten_too():
    model, clock = Endpoint(), Clock()
    assert output_caps.learn(model, {}, OutputCapTooLarge("too large"), BIG, clock)
    assert output_caps.asked(model, BIG) is None  # no cap sent
    clock.now += output_caps.FORGET_AFTER
    output_caps.expire(model, clock)
    assert output_caps.asked(model, BIG) == BIG


def test_at_most_MOST_models_are_kept_the_oldest_going_first():
    clock = Clock()
    models = [Endpoint(f"m{i}") for i in range(output_caps.MOST + 1)]
    assert _learn(models[0], clock)
    for model in models[1:-1]:
        assert _learn(model, clock)
    assert _learn(models[0], clock, limit=8_000)  # learnt again: now the newest
    assert _learn(models[-1], clock)  # one past MOST: the oldest (m1) goes
    assert len(output_caps.KNOWN) == len(output_caps.LEARNT) == output_caps.MOST
    assert output_caps.asked(models[1], BIG) == BIG
    assert output_caps.asked(models[0], BIG) == 8_000
    assert output_caps.asked(models[-1], BIG) == MAXIMUM


async def test_a_turn_an_hour_later_sends_the_budgets_cap_again_and_finds_a_raised_maximum(
    autojump_clock,
):
    """The first turn learns 16,384; the next sends it directly; an hour on (the host's
    clock), the model's maximum having risen to 32,768, a turn sends the budget's cap
    again and learns the new maximum. Before, it sent 16,384 until the process ended."""
    model = Model()
    agent = Agent(provider=model, budget=Budget(max_output_tokens=BIG))
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent)
        first = await session.run("one")
        second = await session.run("two")
        await trio.sleep(output_caps.FORGET_AFTER)
        model.limit = 32_768
        third = await session.run("three")
        fourth = await session.run("four")
    assert [r.finish_reason for r in (first, second, third, fourth)] == ["stop"] * 4
    assert model.caps == [BIG, MAXIMUM, MAXIMUM, BIG, 32_768, 32_768]
