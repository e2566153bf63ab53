"""A message steered (``serve --on-busy steer``) into a worker's turn whose saves are
then refused, or whose worker dies, before a save stores it. Its queue row is marked
only by the save that stores it, so the turn's next run (another worker's takeover, or
a re-claim of the turn given back unsaved) takes it again; the stream showed it once
already. Before, every run that took it showed it again (live readers had a
``data-steered`` chunk, the bundled page a bubble, per run), while a replay of the
stream dropped each one before its step's ``reset-step`` and showed it nowhere. Now a
takeover does not show again a message the stream shows steered into the step it
re-runs, and a replay keeps it: once everywhere.

End to end with real PostgreSQL, Redis and HTTP (tests/test_frontend.py's deployment);
the relay's part against the real Redis."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.relays import RedisRelay
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import output as o
from runtime.errors import StoreError
from runtime.messages import UserMessage
from tests.support.redis import unique_prefix
from tests.test_busy import Script, agent_with, holding, looking
from tests.test_frontend import data, deployment
from tests.test_relay import TAKEN_OVER, read_all, text_turn
from tests.test_relay_web import sse_events
from tests.test_worker_steer import _fresh_gate, redis_url, steering_in_step_1

__all__ = ["_fresh_gate", "redis_url"]  # (the fixtures)

STEERED = "also this"


def steered_in(step: int) -> o.Steered:
    return o.Steered(step=step, message_id="u2", text=STEERED, answer_id=f"m1-s{step}")


async def test_a_takeover_is_told_the_messages_shown_steered_into_its_step(
    redis_url: str,
) -> None:
    """``shown``'s ``steered_shown``: the messages the stream shows steered into the
    step, read past the step's resets (a second takeover); a replay keeps the one
    ``steered`` chunk before the reset (it used to drop it with the step's output)."""
    async with RedisRelay.open(redis_url, prefix=unique_prefix()) as relay:
        dead = relay.writer(session_id="s", turn_id="t")
        for chunk in [*text_turn(["first"])[:-1], steered_in(1), o.StepStart(step=1)]:
            dead.append(chunk)
        dead.append(o.TextStart(step=1, part_id="q"))
        dead.append(o.TextDelta(step=1, part_id="q", text="lost"))
        await dead.aclose(final=False)
        taker = relay.writer(session_id="s", turn_id="t", takeover=True)
        assert taker.steered_shown == frozenset()  # (nothing asked yet)
        assert await taker.shown(1) == [o.TextFinish(step=1, part_id="q")]
        assert taker.steered_shown == {"u2"}
        taker.append(o.TextFinish(step=1, part_id="q"))
        taker.append(o.ResetStep(step=1, provider="x", error=TAKEN_OVER))
        taker.append(o.TextStart(step=1, part_id="r"))
        taker.append(o.TextDelta(step=1, part_id="r", text="again"))
        await taker.aclose(final=False)
        again = relay.writer(session_id="s", turn_id="t", takeover=True)
        assert await again.shown(1) == [o.TextFinish(step=1, part_id="r")]
        assert again.steered_shown == {"u2"}  # (before the reset)
        again.append(o.TextFinish(step=1, part_id="r"))
        again.append(text_turn([])[-1])  # (the finish)
        await again.aclose()
        replay = await read_all(relay, "t")
    assert [c.message_id for c in replay if isinstance(c, o.Steered)] == ["u2"]
    assert [c.text for c in replay if isinstance(c, o.TextDelta)] == ["first", "again"]


def refusing_saves_of(text: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first two saves of messages holding ``text`` refused (a full disk); where each
    started."""
    real = PostgresStore.save
    refused: list[int] = []

    async def save(
        self: Any, session_id: str, start: int, messages: Any, meta: Any = None, **kw: Any
    ) -> Any:
        if len(refused) < 2 and any(getattr(m, "text", "") == text for m in messages):
            refused.append(start)
            raise StoreError("could not extend file /var/lib/pg: No space left on device")
        return await real(self, session_id, start, messages, meta, **kw)

    monkeypatch.setattr(PostgresStore, "save", save)
    return refused


async def test_a_message_steered_into_a_turn_given_back_unsaved_is_shown_once(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 1 holds while ``also this`` is steered in; the step that takes it and the
    turn's final save are refused (a full disk), so the worker gives the turn back and
    its re-run takes the message again and stores it. Before: two ``data-steered``
    chunks for it on the first client's stream."""
    refused = refusing_saves_of(STEERED, monkeypatch)
    script = Script(looking("call_L"), holding("call_H"), ["answer to both"], ["again"])
    out: dict[str, Any] = {}
    async with deployment(pg_url, redis_url, agent_with(script, "steer"), on_busy="steer") as d:
        async with steering_in_step_1(d, out, STEERED):
            pass
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert len(refused) == 2
    first, steering = turns
    assert (first.status, first.attempts) == ("done", 2), first.error
    assert (steering.status, steering.finish_reason) == ("done", "steered")
    assert out["steered"].status_code == 202 and out["steered"].json()["steered"] is True
    chunks = data(sse_events(out["first"].text))
    shown = [c["data"]["messageId"] for c in chunks if c["type"] == "data-steered"]
    assert shown == ["u2"]
    types = [c["type"] for c in chunks]
    assert types.count("reset-step") == 1 and types[-1] == "finish", types
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta").endswith("again")
    # the message ran once in each run, and is stored once, where the model saw it
    assert all(
        [m.text for m in r.messages if isinstance(m, UserMessage)].count(STEERED) <= 1
        for r in script.requests
    )
    assert record is not None
    users = [m.text for m in record.messages if isinstance(m, UserMessage)]
    assert users == ["first", STEERED]
    assert record.messages[-1].text == "again"


async def test_a_turn_given_back_unsaved_streams_its_step_before_another_worker_reruns_it(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The give-back flushes what the unsaved run streamed before it releases the turn.
    Here the relay holds each flush a second (its tick) and the giving worker is slow
    after the release, so a second worker re-runs the step at once. Before, that
    worker read the step as never streamed and sent no ``reset-step``: the client was
    shown the unsaved run's answer and then the re-run's, one after the other."""
    refusing_saves_of(STEERED, monkeypatch)
    monkeypatch.setattr(RedisRelay, "next_tick", lambda self, now: now + 1.0)
    release = TurnQueue.release

    async def slow_release(self: Any, claim: Any, **kw: Any) -> bool:
        released = await release(self, claim, **kw)
        await trio.sleep(0.8)  # the other worker takes the turn meanwhile
        return released

    monkeypatch.setattr(TurnQueue, "release", slow_release)
    script = Script(looking("call_L"), holding("call_H"), ["answer to both"], ["again"])
    out: dict[str, Any] = {}
    async with deployment(pg_url, redis_url, agent_with(script, "steer"), on_busy="steer") as d:
        await d.start_worker()
        async with steering_in_step_1(d, out, STEERED):
            pass
        first, _ = await d.queue.turns("s1")
    assert (first.status, first.attempts) == ("done", 2), first.error
    chunks = data(sse_events(out["first"].text))
    types = [c["type"] for c in chunks]
    assert types.count("reset-step") == 1 and types[-1] == "finish", types
    at = types.index("reset-step")  # the unsaved answer before it, the re-run's after
    assert "".join(c["delta"] for c in chunks[:at] if c["type"] == "text-delta") == (
        "answer to both"
    )
    assert "".join(c["delta"] for c in chunks[at:] if c["type"] == "text-delta") == "again"
