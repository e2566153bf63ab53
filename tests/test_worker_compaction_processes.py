"""Compaction in a worker's turn, the worker SIGKILLed (real ``python -m runtime worker``
processes on the test run's own PostgreSQL and Redis, the agent of
:mod:`tests.support.compaction_worker_agent`): inside the summary's model call, or after
the step that stored the summary. The turn taken over ends with one summary stored where
the embedded runtime stores it (right before the turn's user message, standing for the
older turns), a well-formed history, and a request every provider's API takes."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence

import pytest
import trio

from actors.providers import anthropic, gemini, openai, openai_responses
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.approval import Decision, pending_calls
from runtime.compaction import SUMMARY_PREFIX, is_summary
from runtime.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    TextPart,
    ToolMessage,
    UserMessage,
)
from tests.support import wire_rules
from tests.support.compaction_worker_agent import SUMMARY_TEXT
from tests.support.faults import check_history
from tests.support.redis import require_redis, unique_prefix
from tests.support.worker_agent import answer_text, guarded, read_ledger
from tests.test_replay_property import ORIGINS, request_messages
from tests.test_workers import Workers, finished, wait_for


@pytest.fixture
def pool(pg_url: str) -> Iterator[Workers]:
    workers = Workers(pg_url, require_redis(), unique_prefix())
    try:
        yield workers
    finally:
        workers.close()


AGENT = ["--agent", "tests.support.compaction_worker_agent:agent"]
LONG = " ".join(f"word{i}" for i in range(120))
OLD_TURNS = 3


def old_turns() -> list[Message]:
    """Three long turns: over the agent's window together, so the next turn summarizes."""
    out: list[Message] = []
    for i in range(OLD_TURNS):
        out.append(UserMessage(content=f"question {i}: {LONG}", id=f"old-u{i}"))
        out.append(
            AssistantMessage(
                id=f"old-a{i}", content=(TextPart(text=f"answer {i}: {LONG}", step=0),)
            )
        )
    return out


async def summary_calls(pg_url: str) -> int:
    _, attempts = await trio.to_thread.run_sync(read_ledger, pg_url)
    return attempts.get("summary", 0)


def assert_replays_on_every_provider(history: Sequence[Message]) -> None:
    """The next turn's request (the history and a new user message) on each API."""
    messages = request_messages([*history, UserMessage(content="and now?", id="next")])
    _system, payload = anthropic.map_messages("test", messages, origin=ORIGINS[0])
    errors = wire_rules.anthropic_errors(payload) + wire_rules.sdk_errors("anthropic", payload)
    chat = openai.map_messages("test", messages, origin=ORIGINS[2])
    errors += wire_rules.chat_errors(chat) + wire_rules.sdk_errors("chat", chat)
    items = openai_responses.map_messages(messages, origin=ORIGINS[3])
    errors += wire_rules.responses_errors(items) + wire_rules.sdk_errors("responses", items)
    _system, contents = gemini.map_messages("test", messages, origin=ORIGINS[5])
    errors += wire_rules.gemini_errors(contents) + wire_rules.sdk_errors("gemini", contents)
    assert errors == []
    assert any(SUMMARY_TEXT in str(m) for m in messages if isinstance(m, SystemMessage))


def assert_one_summary_before_the_turn(history: Sequence[Message], user_text: str) -> None:
    summaries = [i for i, m in enumerate(history) if is_summary(m)]
    (at,) = summaries
    summary = history[at]
    assert isinstance(summary, SystemMessage)
    assert summary.content == SUMMARY_PREFIX + SUMMARY_TEXT
    user = history[at + 1]
    assert isinstance(user, UserMessage) and user.content == user_text
    assert summary.summarizes_before == user.id  # the older turns, all of them
    assert [m.id for m in history[:at]] == [m.id for m in old_turns()]  # all kept in store


async def run_killed(pg_url: str, workers: Workers, text: str, **hold: str) -> list[Message]:
    """Seed the session, submit ``text``, SIGKILL w1 once :func:`kill_when` says, let w2
    take the turn over; the stored history."""
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("s1", 0, old_turns())
        submitted = await queue.submit("s1", text)
        workers.start("w1", extra_args=AGENT, **hold)
        return await _take_over(pg_url, workers, queue, store, submitted.turn_id, text)
    finally:
        await queue.aclose()
        await store.aclose()


async def _take_over(
    pg_url: str, workers: Workers, queue: TurnQueue, store: PostgresStore, turn_id: str, text: str
) -> list[Message]:
    if text.startswith("tools"):  # step 1's model call holds: step 0 and the summary stored

        async def step_0_stored() -> bool:
            record = await store.load("s1")
            return record is not None and isinstance(record.messages[-1], ToolMessage)

        await wait_for(step_0_stored, what="w1 in step 1's model call")
    else:

        async def in_summary() -> bool:
            return await summary_calls(pg_url) >= 1

        await wait_for(in_summary, what="w1 in the summary's model call")
    workers.signal("w1", signal.SIGKILL)
    workers.start("w2", extra_args=AGENT)
    turn = await finished(queue, turn_id)
    assert turn.status == "done", workers.log("w2")
    record = await store.load("s1")
    assert record is not None
    return list(record.messages)


async def test_a_worker_killed_inside_the_summary_call_leaves_the_takeover_one_summary(
    pg_url: str, pool: Workers
) -> None:
    history = await run_killed(pg_url, pool, "hello there", AXON_TEST_SUMMARY_HOLD="600")
    check_history(history)
    assert_one_summary_before_the_turn(history, "hello there")
    last = history[-1]
    assert isinstance(last, AssistantMessage) and last.text == "echo: hello there"
    assert await summary_calls(pg_url) == 2  # w1's, cut, and w2's again
    assert_replays_on_every_provider(history)


async def test_a_worker_killed_after_the_summary_was_stored_leaves_it_to_the_takeover(
    pg_url: str, pool: Workers
) -> None:
    history = await run_killed(pg_url, pool, "tools please", AXON_TEST_STEP1_HOLD="600")
    check_history(history)
    assert_one_summary_before_the_turn(history, "tools please")
    last = history[-3]  # the turn's answer, then its two tool results
    assert isinstance(last, AssistantMessage) and last.text == answer_text("tools please")
    assert await summary_calls(pg_url) == 1  # w2 used the stored one
    effects, _ = await trio.to_thread.run_sync(read_ledger, pg_url)
    assert sorted(effects.values()) == [1, 1, 1]
    assert_replays_on_every_provider(history)


async def test_a_message_steered_in_while_the_summary_is_made_joins_the_turn_taken_over(
    pg_url: str, pool: Workers
) -> None:
    # A second front end's message (``--on-busy steer``) comes while w1's summary call
    # runs; w1 dies there. w2 summarizes again, runs step 0, and inserts the message at
    # its boundary: after the summary, the turn's first step and its result.
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("s1", 0, old_turns())
        first = await queue.submit("s1", "tools please")
        pool.start("w1", extra_args=AGENT, AXON_TEST_SUMMARY_HOLD="600")

        async def in_summary() -> bool:
            return await summary_calls(pg_url) >= 1

        await wait_for(in_summary, what="w1 in the summary's model call")
        steered = await queue.submit("s1", "also this", on_busy="steer")
        pool.signal("w1", signal.SIGKILL)
        pool.start("w2", extra_args=AGENT)
        turn = await finished(queue, first.turn_id)
        second = await finished(queue, steered.turn_id)
        record = await store.load("s1")
    finally:
        await queue.aclose()
        await store.aclose()
    assert (turn.status, second.status) == ("done", "done"), pool.log("w2")
    assert record is not None
    history = list(record.messages)
    check_history(history)
    assert_one_summary_before_the_turn(history, "tools please")
    users = [m.content for m in history if isinstance(m, UserMessage)]
    assert users[OLD_TURNS:] == ["tools please", "also this"]
    last = history[-1]
    assert isinstance(last, AssistantMessage) and last.text == "echo: also this"
    assert await summary_calls(pg_url) == 2
    assert_replays_on_every_provider(history)


async def test_a_turn_killed_after_a_steered_message_was_stored_finishes_its_answer(
    pg_url: str, pool: Workers
) -> None:
    # "tools please" runs step 0 (its tool holds); "tools again" is steered in and joins
    # at step 0's boundary, with an assistant message of its own; its steps 1 and 2
    # call tools too. w1 dies in step 2's tool, after step 1 (the steered message with
    # it) was stored. w2 must run step 2 again and answer: not take the turn for over
    # because its first assistant message is followed by the steered one.
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("s1", 0, old_turns())
        first = await queue.submit("s1", "tools please")
        pool.start("w1", extra_args=AGENT, AXON_TEST_TOOL_HOLD="2.5")

        async def tool_attempts(n: int) -> bool:
            _, attempts = await trio.to_thread.run_sync(read_ledger, pg_url)
            return sum(c for key, c in attempts.items() if key != "summary") >= n

        await wait_for(lambda: tool_attempts(1), what="w1 in step 0's tool")
        steered = await queue.submit("s1", "tools again", on_busy="steer")
        await wait_for(lambda: tool_attempts(3), what="w1 in step 2's tool")
        pool.signal("w1", signal.SIGKILL)
        pool.start("w2", extra_args=AGENT)
        turn = await finished(queue, first.turn_id)
        second = await finished(queue, steered.turn_id)
        record = await store.load("s1")
    finally:
        await queue.aclose()
        await store.aclose()
    assert (turn.status, second.status) == ("done", "done"), pool.log("w2")
    assert record is not None
    history = list(record.messages)
    check_history(history)
    # The old turns' summary before the turn; the steps after the steer may summarize
    # again (then right before the steered message, which starts a turn for them).
    summaries = [i for i, m in enumerate(history) if is_summary(m)]
    assert summaries[0] == OLD_TURNS * 2
    for i in summaries:
        after = history[i + 1]
        assert isinstance(after, UserMessage)
        assert history[i].summarizes_before == after.id  # type: ignore[union-attr]
    users = [m.content for m in history if isinstance(m, UserMessage)]
    assert users[OLD_TURNS:] == ["tools please", "tools again"]
    answer = history[-3]  # the steered message's answer, then its two tool results
    assert isinstance(answer, AssistantMessage), "\n".join(repr(m)[:300] for m in history[-4:])
    assert answer.text == answer_text("tools again")
    assert_replays_on_every_provider(history)


async def test_a_summary_stored_with_a_turn_that_waits_holds_when_another_worker_resumes_it(
    pg_url: str, pool: Workers
) -> None:
    # Step 0 summarizes, then asks for an approval: the turn suspends, the summary stored
    # with it. w1 is SIGKILLed while the turn waits; the decision puts it back, w2 resumes
    # it with the stored summary (no second summary call) and answers.
    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await store.save("s1", 0, old_turns())
        submitted = await queue.submit("s1", "approve this")
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
    history = list(record.messages)
    check_history(history)
    assert_one_summary_before_the_turn(history, "approve this")
    last = history[-2]  # the answer, then the approved call's result
    assert isinstance(last, AssistantMessage)
    assert last.text == "I need your approval. " + answer_text("approve this")
    assert await summary_calls(pg_url) == 1
    assert_replays_on_every_provider(history)
