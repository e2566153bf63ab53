"""A worker SIGKILLed after an Anthropic ``pause_turn`` step was saved, inside the
continuation's model call: real ``python -m runtime worker`` processes on the test run's
own PostgreSQL and Redis, the real ``AsyncAnthropic`` client of
:mod:`tests.support.pause_worker_agent` on a loopback Anthropic server (SSE) that holds
the continuation's request. The worker that takes the turn over continues the paused
step (tests/test_pause_takeover.py's in-process case, here through the queue's lease, the
step save's meta in PostgreSQL and a process that really died): the paused call is not
sent again, the continuation's request ends with the paused answer, the turn stores one
assistant message and the ``paused_turn`` mark is cleared at its end."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import pytest
import trio

from actors.providers.anthropic import map_messages
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from actors.turn.takeover import PAUSED_META
from runtime.history import Origin
from runtime.messages import AssistantMessage, ProviderDataPart, TextPart, UserMessage
from tests import test_worker_approval_processes as approval_processes
from tests.support import wire_rules
from tests.support.faults import check_history
from tests.support.loopback import Recorded, Reply, loopback_server
from tests.support.redis import require_redis, unique_prefix
from tests.test_provider_anthropic_current import answer
from tests.test_provider_anthropic_pause import RESULT, USE, paused, text_events
from tests.test_relay_web import sse_events
from tests.test_replay_property import request_messages
from tests.test_worker_approval_processes import LIMIT, FrontEnds, chat
from tests.test_workers import Workers, finished, wait_for

AGENT = ["--agent", "tests.support.pause_worker_agent:agent"]
MODEL = "claude-sonnet-4-5"
PAUSED_CONTENT = [{"type": "text", "text": "Let me search."}, USE, RESULT]


@pytest.fixture
def pool(pg_url: str) -> Iterator[Workers]:
    workers = Workers(pg_url, require_redis(), unique_prefix())
    try:
        yield workers
    finally:
        workers.close()


def script(request: Recorded, seen: list[Recorded]) -> Reply:
    """The first call pauses; the second (the continuation) is held: its worker dies in
    it; the third (the takeover's) answers. Any further call is an error reply."""
    n = len(seen)
    if n == 1:
        return paused()
    if n == 2:
        return Reply(stall=600)
    if n == 3:
        return answer(*text_events(0, " Trio is a library."), model=MODEL)
    return Reply(status=500, body=b"a call too many")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
async def test_a_worker_killed_in_the_continuation_of_a_paused_step_leaves_it_continued(
    pg_url: str, pool: Workers, sig: signal.Signals
) -> None:
    """SIGTERM: the worker's shutdown cuts the turn after its grace (saved interrupted,
    the mark kept) and gives it back."""
    async with loopback_server() as server:
        server.respond = lambda request: script(request, server.requests)
        env = {"AXON_TEST_ANTHROPIC_URL": server.url}
        store = await PostgresStore.open(pg_url)
        queue = TurnQueue(store)
        try:
            submitted = await queue.submit("s1", "search trio")
            pool.start("w1", extra_args=AGENT, **env)

            async def in_continuation() -> bool:
                return len(server.requests) >= 2

            await wait_for(in_continuation, what="w1 in the continuation's model call")
            held = await store.load("s1")
            pool.signal("w1", sig)
            if sig == signal.SIGTERM:
                await trio.to_thread.run_sync(pool.procs["w1"].wait, 30)
            pool.start("w2", extra_args=AGENT, **env)
            turn = await finished(queue, submitted.turn_id)
            record = await store.load("s1")
        finally:
            await queue.aclose()
            await store.aclose()
    assert turn.status == "done", pool.log("w2")
    # what w1 left: the paused step stored, marked as the turn's paused step
    assert held is not None
    assert held.meta[PAUSED_META] == {"turn_id": submitted.turn_id, "step": 0, "resumed": 1}
    assert [p.step for p in held.messages[-1].content] == [0, 0, 0]
    # the paused call ran once (w1's); w2 sent the continuation w1 had sent, and only it
    assert len(server.requests) == 3, [r.json()["messages"] for r in server.requests]
    first, cut, resumed = (r.json()["messages"] for r in server.requests)
    assert first == [{"role": "user", "content": "search trio"}]
    continued = [
        {"role": "user", "content": "search trio"},
        {"role": "assistant", "content": PAUSED_CONTENT},
    ]
    assert cut == continued
    assert resumed == continued
    # one assistant message: the paused step and its continuation, the mark cleared
    assert record is not None
    history = list(record.messages)
    check_history(history)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage]
    answer_message = history[1]
    assert answer_message.id == turn.message_id and answer_message.status == "complete"
    assert [(type(p), p.step) for p in answer_message.content] == [
        (TextPart, 0),
        (ProviderDataPart, 0),
        (ProviderDataPart, 0),
        (TextPart, 1),
    ]
    assert answer_message.text == "Let me search. Trio is a library."
    assert record.meta[PAUSED_META] is None
    # the next turn's request replays it as the API takes it
    messages = request_messages([*history, UserMessage(content="thanks", id="next")])
    _system, payload = map_messages(
        "test", messages, origin=Origin(provider="anthropic", model=MODEL)
    )
    assert wire_rules.anthropic_errors(payload) == []
    assert payload[1] == {
        "role": "assistant",
        "content": [*PAUSED_CONTENT, {"type": "text", "text": " Trio is a library."}],
    }


async def test_a_client_streaming_the_paused_turn_from_a_front_end_sees_each_part_once(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same SIGKILL, the turn posted to a ``serve`` front end whose client streams it
    through the takeover: the paused step's text once, then the continuation's."""
    monkeypatch.setattr(approval_processes, "AGENT", AGENT[1])
    redis_url = require_redis()
    prefix = unique_prefix()
    workers = Workers(pg_url, redis_url, prefix)
    fronts = FrontEnds(pg_url, redis_url, prefix)
    try:
        async with loopback_server() as server:
            server.respond = lambda request: script(request, server.requests)
            env = {"AXON_TEST_ANTHROPIC_URL": server.url}
            front = await fronts.start()
            workers.start("w1", extra_args=AGENT, **env)
            async with httpx.AsyncClient(timeout=LIMIT) as client:
                with trio.fail_after(LIMIT):
                    async with trio.open_nursery() as nursery:

                        async def in_continuation() -> bool:
                            return len(server.requests) >= 2

                        async def kill_in_continuation() -> None:
                            await wait_for(in_continuation, what="w1 in the continuation")
                            workers.signal("w1", signal.SIGKILL)
                            workers.start("w2", extra_args=AGENT, **env)

                        nursery.start_soon(kill_in_continuation)
                        async with client.stream(
                            "POST", f"{front}/api/chat", json=chat("s1", "search trio")
                        ) as response:
                            assert response.status_code == 200
                            raw = "".join([text async for text in response.aiter_text()])
    finally:
        workers.close()
        fronts.close()
    assert len(server.requests) == 3
    events = [data for _, data in sse_events(raw) if isinstance(data, dict)]
    texts = "".join(e["delta"] for e in events if e["type"] == "text-delta")
    assert texts == "Let me search. Trio is a library.", [e["type"] for e in events]
    assert raw.rstrip().endswith("data: [DONE]")
    assert [e["type"] for e in events].count("finish") == 1


def twice_paused(request: Recorded, seen: list[Recorded]) -> Reply:
    """Calls 1 and 2 pause (the second a text only); the third (the continuation of
    both) is held: its worker dies in it; the fourth (the takeover's) pauses again: the
    turn's third pause, past ``MAX_RESUMES=2``. Any further call is an error reply."""
    n = len(seen)
    if n == 1:
        return paused()
    if n == 2:
        return paused(*text_events(0, " Still searching."))
    if n == 3:
        return Reply(stall=600)
    if n == 4:
        return paused(*text_events(0, " More."))
    return Reply(status=500, body=b"a call too many")


async def test_the_pauses_before_a_kill_count_toward_max_resumes_in_the_worker_that_takes_over(
    pg_url: str, pool: Workers
) -> None:
    """Workers run with ``MAX_RESUMES=2``; w1 continued two pauses and is SIGKILLed in
    the third call. w2 counts on from the stored mark: the pause its call brings is the
    turn's third, which ends the turn (finish ``other``) instead of a fourth call; and
    no paused step is asked for again (4 calls: w1's 3, w2's continuation)."""
    async with loopback_server() as server:
        server.respond = lambda request: twice_paused(request, server.requests)
        env = {"AXON_TEST_ANTHROPIC_URL": server.url, "AXON_TEST_MAX_RESUMES": "2"}
        store = await PostgresStore.open(pg_url)
        queue = TurnQueue(store)
        try:
            submitted = await queue.submit("s1", "search trio")
            pool.start("w1", extra_args=AGENT, **env)

            async def in_third_call() -> bool:
                return len(server.requests) >= 3

            await wait_for(in_third_call, what="w1 in the continuation of its second pause")
            held = await store.load("s1")
            pool.signal("w1", signal.SIGKILL)
            pool.start("w2", extra_args=AGENT, **env)
            turn = await finished(queue, submitted.turn_id)
            record = await store.load("s1")
        finally:
            await queue.aclose()
            await store.aclose()
    assert turn.status == "done", pool.log("w2")
    assert held is not None
    assert held.meta[PAUSED_META] == {"turn_id": submitted.turn_id, "step": 1, "resumed": 2}
    # w1's three calls, w2's one: the continuation w1 had sent, and no fifth
    assert len(server.requests) == 4, [r.json()["messages"] for r in server.requests]
    bodies = [r.json()["messages"] for r in server.requests]
    both_paused = [
        {"role": "user", "content": "search trio"},
        {
            "role": "assistant",
            "content": [*PAUSED_CONTENT, {"type": "text", "text": " Still searching."}],
        },
    ]
    assert bodies[2] == bodies[3] == both_paused
    assert record is not None
    history = list(record.messages)
    check_history(history)
    answer_message = history[1]
    assert [p.step for p in answer_message.content] == [0, 0, 0, 1, 2]
    assert answer_message.text == "Let me search. Still searching. More."
    assert answer_message.status == "complete"
    assert record.meta[PAUSED_META] is None
