"""Structured answers in a worker's turn, the worker SIGKILLed mid-answer (real ``python
-m runtime worker`` processes on the test run's own PostgreSQL and Redis, the agent of
:mod:`tests.support.structured_worker_agent`): a relay reader drops the dead worker's
partial objects at the step's restart and ends with the object the store holds; a turn
whose earlier answers were rejected keeps, on the worker that takes it over, the
feedback and the retry count it had (docs/structured-output.md)."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncGenerator, Iterator
from typing import Any, cast

import pytest
import trio

from actors.relays.redis_streams import RedisRelay
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.approval import Decision, pending_calls
from runtime.errors import RelayTurnGone
from runtime.messages import AssistantMessage, TextPart
from runtime.output import Error, Finish, ObjectDelta, ResetStep
from runtime.relay import StepRestarted
from tests.support.redis import require_redis, unique_prefix
from tests.support.structured_worker_agent import WORDS, answer_json
from tests.support.worker_agent import guarded, read_ledger
from tests.test_workers import Workers, finished, wait_for

AGENT = ["--agent", "tests.support.structured_worker_agent:agent"]


@pytest.fixture
def pool(pg_url: str) -> Iterator[Workers]:
    workers = Workers(pg_url, require_redis(), unique_prefix())
    try:
        yield workers
    finally:
        workers.close()


async def held(pg_url: str) -> bool:
    _, attempts = await trio.to_thread.run_sync(read_ledger, pg_url)
    return attempts.get("hold", 0) >= 1


async def read_turn(pool: Workers, turn_id: str, seen: list[Any]) -> None:
    """Follow the turn's relay stream from its start to its end into ``seen``."""
    async with RedisRelay.open(pool.redis_url, prefix=pool.prefix) as relay:
        while True:
            try:
                after = seen[-1].seq if seen else None
                reading = cast(AsyncGenerator[Any, None], relay.read(turn_id, after_seq=after))
                try:
                    async for chunk in reading:
                        seen.append(chunk)
                        if isinstance(chunk, (Finish, Error)):
                            return
                finally:
                    await reading.aclose()
            except RelayTurnGone:
                pass  # not written yet
            await trio.sleep(0.05)


def shown_objects(seen: list[Any]) -> list[ObjectDelta]:
    """The object-delta chunks a reader still shows once each step restart dropped
    what it showed of its step."""
    shown: list[ObjectDelta] = []
    for chunk in seen:
        if isinstance(chunk, (ResetStep, StepRestarted)):
            shown = [o for o in shown if o.step != chunk.step]
        elif isinstance(chunk, ObjectDelta):
            shown.append(chunk)
    return shown


async def test_a_reader_of_a_structured_answer_taken_over_ends_with_the_stored_object(
    pg_url: str, pool: Workers
) -> None:
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    seen: list[Any] = []
    try:
        submitted = await queue.submit("s1", "json please")
        pool.start("w1", extra_args=AGENT, AXON_TEST_ANSWER_TAG="a", AXON_TEST_HOLD_STEP="0")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_turn, pool, submitted.turn_id, seen)

            async def partial_read() -> bool:
                return any(isinstance(c, ObjectDelta) for c in seen)

            await wait_for(partial_read, what="a partial object of w1's")
            pool.signal("w1", signal.SIGKILL)
            pool.start("w2", extra_args=AGENT, AXON_TEST_ANSWER_TAG="b")
            turn = await finished(queue, submitted.turn_id)
        record = await store.load("s1")
    finally:
        await queue.aclose()
        await store.aclose()
    assert turn.status == "done", pool.log("w2")
    assert record is not None
    (answer,) = [m for m in record.messages if isinstance(m, AssistantMessage)]
    stored = json.loads("".join(p.text for p in answer.content if isinstance(p, TextPart)))
    assert stored == json.loads(answer_json("b", 0))
    shown = shown_objects(seen)
    assert shown[-1].value == stored  # the reader ends with what is stored
    assert sum(isinstance(c, (ResetStep, StepRestarted)) for c in seen) == 1
    for partial in shown:  # each a partial of w2's answer, none of w1's left
        words = partial.value.get("words", [])
        assert words == stored["words"][: len(words)] or (
            words[:-1] == stored["words"][: len(words) - 1]
            and stored["words"][len(words) - 1].startswith(words[-1])
        )
    assert len(stored["words"]) == WORDS


async def run_wrong(pg_url: str, pool: Workers, text: str) -> tuple[Any, AssistantMessage]:
    """Submit ``text``; SIGKILL w1 inside step 2's answer (steps 0 and 1 rejected and
    stored); w2 takes the turn over. The turn's row and its stored answer."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        submitted = await queue.submit("s1", text)
        pool.start("w1", extra_args=AGENT, AXON_TEST_HOLD_STEP="2")
        try:
            await wait_for(lambda: held(pg_url), 10)
        except AssertionError:
            print(pool.log("w1")[-4000:])
            print(await store.load("s1"))
            raise
        pool.signal("w1", signal.SIGKILL)
        pool.start("w2", extra_args=AGENT)
        turn = await finished(queue, submitted.turn_id)
        record = await store.load("s1")
    finally:
        await queue.aclose()
        await store.aclose()
    assert record is not None
    (answer,) = [m for m in record.messages if isinstance(m, AssistantMessage)]
    return turn, answer


async def test_a_turn_taken_over_after_two_rejected_answers_shows_the_model_both_errors(
    pg_url: str, pool: Workers
) -> None:
    # Embedded, step 2's request shows answer 0, its error, answer 1, its error: the
    # agent answers with ``total`` = the retry prompts it was shown.
    turn, answer = await run_wrong(pg_url, pool, "wrong twice")
    assert turn.status == "done", pool.log("w2")
    last = "".join(p.text for p in answer.content if isinstance(p, TextPart) and p.step == 2)
    assert json.loads(last) == json.loads(answer_json("", 2))


async def test_a_turn_taken_over_gets_no_more_answers_than_its_output_retries(
    pg_url: str, pool: Workers
) -> None:
    # output_retries=2: three answers, then the turn fails, whichever worker runs it.
    turn, answer = await run_wrong(pg_url, pool, "never right")
    assert turn.status == "failed", turn
    assert answer.error is not None and answer.error.kind == "OutputValidationError"
    assert sorted({p.step for p in answer.content}) == [0, 1, 2]


async def test_a_structured_turn_resumed_after_approval_on_another_worker_shows_its_rejection(
    pg_url: str, pool: Workers
) -> None:
    # Step 0's answer is rejected, step 1 asks for an approval: the turn waits; w1 dies.
    # w2 resumes it once approved: step 2's request shows the rejection (``total`` 1).
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        submitted = await queue.submit("s1", "approve please")
        pool.start("w1", extra_args=AGENT)

        async def waiting() -> list:  # type: ignore[type-arg]
            record = await store.load("s1")
            return [] if record is None else pending_calls(record.messages)

        (call,) = await wait_for(waiting, what="the turn waiting for approval on w1")
        pool.signal("w1", signal.SIGKILL)
        pool.start("w2", extra_args=AGENT)
        await queue.decide("s1", call.approval_id, Decision(approved=True), {"guarded": guarded})
        turn = await finished(queue, submitted.turn_id)
        record = await store.load("s1")
    finally:
        await queue.aclose()
        await store.aclose()
    assert turn.status == "done", pool.log("w2")
    assert record is not None
    (answer,) = [m for m in record.messages if isinstance(m, AssistantMessage)]
    last = "".join(p.text for p in answer.content if isinstance(p, TextPart) and p.step == 2)
    assert json.loads(last) == json.loads(answer_json("", 1))
