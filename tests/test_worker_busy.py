"""``serve --on-busy`` in a worker deployment's front end: what a message for a session
whose turn is queued or running does, decided by the turn queue in the submit's
transaction (real PostgreSQL and Redis, front ends and a worker in this process, as
tests/test_frontend.py runs them).

``reject`` is a 409 that queues nothing; ``enqueue`` queues behind (the default, covered
by tests/test_frontend.py); ``interrupt`` cancels the queued and running turns and runs
the new one; ``steer`` queues the message naming the running turn, whose worker inserts
it at its next step boundary (tests/test_worker_steer.py)."""

from __future__ import annotations

from functools import partial
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, Sleep, current_step, tool_call
from actors.stores.turns import TurnQueue
from runtime.agent import Agent
from runtime.app.worker import Worker, _outdated_regenerate
from runtime.busy import INTERRUPT, INTERRUPTED_BY_NEW
from runtime.errors import RegenerateOutdated, SessionBusy
from runtime.messages import AssistantMessage, UserMessage
from runtime.store import SessionRecord
from runtime.tools import tool
from runtime.turn_queue import Claim, QueuedTurn, TurnOptions
from tests.support.redis import require_redis
from tests.support.worker_agent import _last_input
from tests.test_frontend import (
    LIMIT,
    body,
    data,
    deployment,
    slow_agent,
    stored_text,
    streamed_text,
    wait_for_turn,
)
from tests.test_relay_web import sse_events
from tests.test_worker_approval import answer, approval_agent, asked, first_part
from tests.test_worker_approval import payloads as approval_payloads


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def test_reject_answers_409_while_a_turn_runs_and_queues_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(60), on_busy="reject") as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                first: list[httpx.Response] = []

                async def post() -> None:
                    first.append(await client.post("/api/chat", json=body("s1", "one", "u1")))

                nursery.start_soon(post)
                await wait_for_turn(d.queue, "s1", "running")
                second = await client.post("/api/chat", json=body("s1", "two", "u2"))
                retry = await client.post("/api/chat", json=body("s1", "one", "u1"))
        turns = await d.queue.turns("s1")
    assert second.status_code == 409 and "already running a turn" in second.json()["error"]
    assert retry.status_code == 200  # a retry of the running turn is that turn, not a 409
    assert first[0].status_code == 200
    assert [(t.input, t.status) for t in turns] == [("one", "done")]


async def test_reject_answers_409_while_a_turn_is_queued(pg_url: str, redis_url: str) -> None:
    async with deployment(pg_url, redis_url, slow_agent(3), worker=False, on_busy="reject") as d:
        await d.queue.submit("s1", "queued first")
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            refused = await client.post("/api/chat", json=body("s1", "two", "u2"))
        turns = await d.queue.turns("s1")
    assert refused.status_code == 409
    assert [t.input for t in turns] == ["queued first"]


async def test_interrupt_cancels_the_running_turn_and_runs_the_new_one(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(150), on_busy="interrupt") as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                answers: dict[str, httpx.Response] = {}

                async def post(text: str, message_id: str) -> None:
                    answers[text] = await client.post(
                        "/api/chat", json=body("s1", text, message_id)
                    )

                nursery.start_soon(post, "first", "u1")
                running = await wait_for_turn(d.queue, "s1", "running")
                nursery.start_soon(post, "second", "u2")
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    first = data(sse_events(answers["first"].text))
    assert {"type": "abort", "reason": INTERRUPTED_BY_NEW} in first
    assert [(t.turn_id == running.turn_id, t.status) for t in turns] == [
        (True, "cancelled"),
        (False, "done"),
    ]
    assert turns[0].cancel_reason == INTERRUPTED_BY_NEW
    assert record is not None
    assistants = [m for m in record.messages if isinstance(m, AssistantMessage)]
    assert [m.interrupted for m in assistants] == [True, False]
    assert streamed_text(sse_events(answers["second"].text)) == stored_text(assistants[1])


async def test_interrupt_cancels_the_queued_turns_so_only_the_newest_runs(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(
        pg_url, redis_url, slow_agent(3, 0.0), worker=False, on_busy="interrupt"
    ) as d:
        older = [await d.queue.submit("s1", text) for text in ("a", "b")]
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                newest: list[httpx.Response] = []

                async def post() -> None:
                    newest.append(await client.post("/api/chat", json=body("s1", "c", "u3")))

                nursery.start_soon(post)
                with trio.fail_after(LIMIT):
                    while len(await d.queue.turns("s1")) < 3:  # noqa: ASYNC110 - "c" submitted
                        await trio.sleep(0.02)
                await d.start_worker()
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert [(t.input, t.status) for t in turns] == [
        ("a", "cancelled"),
        ("b", "cancelled"),
        ("c", "done"),
    ]
    assert all(t.cancel_reason == INTERRUPTED_BY_NEW for t in turns[:2])
    assert [t.turn_id for t in turns[:2]] == [t.turn_id for t in older]
    assert newest[0].status_code == 200
    assert record is not None
    assert [m.content for m in record.messages if isinstance(m, UserMessage)] == ["c"]


async def test_a_steer_submit_names_the_running_turn_and_none_when_idle(pg_url: str) -> None:
    from actors.stores.postgres import PostgresStore

    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        idle = await queue.submit("s1", "first", on_busy="steer")
        claim = await queue.claim("w1")
        assert claim is not None and claim.turn.turn_id == idle.turn_id
        steering = await queue.submit("s1", "also", on_busy="steer")
        taken = await queue.take_steering(claim)
    finally:
        await queue.aclose()
        await store.aclose()
    assert idle.steer_of is None  # nothing ran: an ordinary turn
    assert steering.steer_of == idle.turn_id and steering.status == "queued"
    assert [t.turn_id for t in taken] == [steering.turn_id]


async def test_a_reject_submit_on_the_queue_raises_session_busy(pg_url: str) -> None:
    from actors.stores.postgres import PostgresStore

    store = await PostgresStore.open(pg_url)
    queue = TurnQueue(store)
    try:
        await queue.submit("s1", "first")
        with pytest.raises(SessionBusy):
            await queue.submit("s1", "second", on_busy="reject")
        other = await queue.submit("s2", "elsewhere", on_busy="reject")
        turns = await queue.turns("s1")
    finally:
        await queue.aclose()
        await store.aclose()
    assert [t.input for t in turns] == ["first"]
    assert other.session_id == "s2"


async def test_an_interrupt_sent_as_a_last_save_starts_the_next_turn_stops_that_turn_at_once(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attack round 3 (tests/test_next_claim_attacks.py): the running turn ends as an
    ``interrupt`` message is sent, and its last save starts the session's queued turn
    in its commit. The front end read the running turn before the submit and told that
    one (ended) over the relay; the turn that started got only the queue's mark, so it
    ran, its model asked, until its worker's next renewal (a third of a lease). Now the
    running turn read after the submit, and marked by it, is told: it stops at once."""
    gate = trio.Event()

    @tool
    async def hold() -> str:
        """Wait for the test."""
        await gate.wait()
        return "held"

    def respond(request: Any) -> list[Any]:
        said = _last_input(request)
        if said == "one":
            return tool_call("hold", {}) if current_step(request.messages) == 0 else ["one"]
        return [Sleep(60), "two"] if said == "two" else [said]

    relayed: list[str] = []
    told = Worker._on_relay_cancel

    def on_relay_cancel(self: Worker, turn_id: str, reason: str) -> None:
        relayed.append(turn_id)
        told(self, turn_id, reason)

    monkeypatch.setattr(Worker, "_on_relay_cancel", on_relay_cancel)
    agent = Agent(name="a", provider=ScriptedProvider(responder=respond), tools=[hold])
    async with deployment(pg_url, redis_url, agent, on_busy="interrupt") as d:
        await d.queue.submit("s1", "one")
        second = await d.queue.submit("s1", "two")
        await wait_for_turn(d.queue, "s1", "running")
        submit = TurnQueue.submit

        async def racing(self: TurnQueue, *args: Any, on_busy: Any = None, **kwargs: Any) -> Any:
            if on_busy == INTERRUPT:  # the message's submit, as the running turn ends
                gate.set()
                while (await d.queue.get_status(second.turn_id)).status != "running":  # type: ignore[union-attr]  # noqa: ASYNC110
                    await trio.sleep(0.01)
            return await submit(self, *args, on_busy=on_busy, **kwargs)

        monkeypatch.setattr(TurnQueue, "submit", racing)
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            answer = await client.post("/api/chat", json=body("s1", "three", "u3"))
        turns = await d.queue.turns("s1")
    assert answer.status_code == 200
    assert second.turn_id in relayed
    assert [(t.input, t.status) for t in turns] == [
        ("one", "done"),
        ("two", "cancelled"),
        ("three", "done"),
    ]


async def test_a_replayed_interrupted_message_does_not_stop_the_message_that_interrupted_it(
    pg_url: str, redis_url: str
) -> None:
    """A client retries the POST of its message after a newer one interrupted it: the
    retry is that message's turn again (cancelled; it interrupts nothing), but the front
    end told the running turn to stop over the relay all the same, so the newer
    message's turn, never marked, was cut. Now only a turn the submit marked is told."""
    async with deployment(pg_url, redis_url, slow_agent(150), on_busy="interrupt") as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(client.post, "/api/chat", json=body("s1", "one", "u1")))
                first = await wait_for_turn(d.queue, "s1", "running")
                nursery.start_soon(partial(client.post, "/api/chat", json=body("s1", "two", "u2")))
                with trio.fail_after(LIMIT):
                    while (await wait_for_turn(d.queue, "s1", "running")).turn_id == first.turn_id:  # noqa: ASYNC110
                        await trio.sleep(0.01)
                again = await client.post("/api/chat", json=body("s1", "one", "u1"))
        turns = await d.queue.turns("s1")
    assert again.status_code == 200
    assert [(t.input, t.status) for t in turns] == [("one", "cancelled"), ("two", "done")]


# -- a regenerate that waited -------------------------------------------------------------


def _regenerate(session_id: str, text: str, message_id: str, answer_id: str) -> dict[str, Any]:
    """The AI SDK's regenerate of ``answer_id`` (the answer to ``message_id``)."""
    return {**body(session_id, text, message_id), "trigger": "regenerate-message",
            "messageId": answer_id}  # fmt: skip


async def test_a_regenerate_that_waited_for_a_later_turn_fails_and_cuts_nothing(
    pg_url: str, redis_url: str
) -> None:
    # Another tab regenerates the answer to "one" while the turn of "two" runs: the
    # regenerate waits in the queue, then its worker cut the last turn, which was
    # "two"'s: "two" and its answer vanished and "one" was stored twice. Now the worker
    # refuses it as it would start: the turn fails, its stream says why.
    async with deployment(pg_url, redis_url, slow_agent(150)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("s1", "one", "u1"))
            first = await d.store.load("s1")
            assert first is not None
            answer = first.messages[-1].id
            replies: dict[str, httpx.Response] = {}

            async def post(key: str, sent: dict[str, Any]) -> None:
                replies[key] = await client.post("/api/chat", json=sent)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "two", body("s1", "two", "u2"))
                await wait_for_turn(d.queue, "s1", "running")
                nursery.start_soon(post, "regenerate", _regenerate("s1", "one", "u1", answer))
            retry = await client.post("/api/chat", json=_regenerate("s1", "one", "u1", answer))
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert record is not None
    assert [m.text for m in record.messages if isinstance(m, UserMessage)] == ["one", "two"]
    assert len([m for m in record.messages if isinstance(m, AssistantMessage)]) == 2
    assert answer in [m.id for m in record.messages]
    assert [(t.input, t.regenerate, t.status) for t in turns] == [
        ("one", False, "done"),
        ("two", False, "done"),
        ("one", True, "failed"),
    ]
    assert "is no longer the last answer" in (turns[2].error or "")
    assert replies["two"].status_code == 200
    for reply in (replies["regenerate"], retry):  # the retry is the same turn: the same end
        errors = [e for e in data(sse_events(reply.text)) if e["type"] == "error"]
        assert len(errors) == 1 and "is no longer the last answer" in errors[0]["errorText"]


async def test_a_regenerate_of_the_last_answer_and_an_old_row_naming_none_still_run(
    pg_url: str, redis_url: str
) -> None:
    # The check refuses only a regenerate whose answer a later message follows: the
    # last answer is regenerated as before, and so is a row queued without the field
    # (a front end of before it, a mixed fleet while upgrading).
    async with deployment(pg_url, redis_url, slow_agent(3, 0.0)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("s1", "one", "u1"))
            first = await d.store.load("s1")
            assert first is not None
            named = await client.post(
                "/api/chat", json=_regenerate("s1", "one", "u1", first.messages[-1].id)
            )
            old = await d.queue.submit("s1", "one", regenerate=True)  # no TurnOptions
            with trio.fail_after(LIMIT):
                while not (await d.queue.get_status(old.turn_id)).finished:  # type: ignore[union-attr]  # noqa: ASYNC110
                    await trio.sleep(0.02)
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert named.status_code == 200
    assert "finish" in [e["type"] for e in data(sse_events(named.text))]
    assert [(t.regenerate, t.status) for t in turns] == [
        (False, "done"),
        (True, "done"),
        (True, "done"),
    ]
    assert turns[1].options.regenerates == first.messages[-1].id
    assert turns[2].options.regenerates is None
    assert record is not None
    assert [type(m) for m in record.messages] == [UserMessage, AssistantMessage]
    assert record.messages[-1].id == f"msg_{old.turn_id}"


async def test_a_stop_naming_a_queued_turn_cancels_it_and_not_the_running_one(
    pg_url: str, redis_url: str
) -> None:
    # A stop names the turn to stop (the embedded app takes a named message out of its
    # queue the same way): a front end that ignored the name stopped the running turn,
    # the one the client did not mean. A message id no open turn holds stops nothing.
    async with deployment(pg_url, redis_url, slow_agent(150)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            replies: dict[str, httpx.Response] = {}

            async def post(text: str, message_id: str) -> None:
                replies[text] = await client.post("/api/chat", json=body("s1", text, message_id))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "one", "u1")
                running = await wait_for_turn(d.queue, "s1", "running")
                nursery.start_soon(post, "two", "u2")
                with trio.fail_after(LIMIT):
                    while len(turns := await d.queue.turns("s1")) < 2:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                by_message = await client.post("/api/chat/s1/stop", json={"messageId": "u9"})
                stop = await client.post("/api/chat/s1/stop", json={"turnId": turns[1].turn_id})
                other = await client.post("/api/chat/s1/stop", json={"turnId": "turn_nope"})
        turns = await d.queue.turns("s1")
    assert by_message.status_code == 204
    assert stop.status_code == 202 and stop.json()["turn_id"] == turns[1].turn_id
    assert other.status_code == 204
    assert [(t.turn_id == running.turn_id, t.status) for t in turns] == [
        (True, "done"),
        (False, "cancelled"),
    ]
    assert data(sse_events(replies["two"].text)) == [{"type": "abort", "reason": "stopped by user"}]
    assert "finish" in [e["type"] for e in data(sse_events(replies["one"].text))]


async def test_a_stop_naming_a_queued_message_takes_it_out_and_the_running_turn_goes_on(
    pg_url: str, redis_url: str
) -> None:
    # The embedded app's stop takes a queued message out by the client's id; a front
    # end answered it 400 (the queue keeps message ids hashed), so the page's stop of a
    # message it had sent could not reach it. Now the queue finds the message's turn by
    # its key: that turn is cancelled, its POST ends with abort, nothing stored of it.
    async with deployment(pg_url, redis_url, slow_agent(150)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            replies: dict[str, httpx.Response] = {}

            async def post(text: str, message_id: str) -> None:
                replies[text] = await client.post("/api/chat", json=body("s1", text, message_id))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "one", "u1")
                await wait_for_turn(d.queue, "s1", "running")
                for count, (text, message_id) in enumerate([("two", "u2"), ("three", "u3")]):
                    nursery.start_soon(post, text, message_id)
                    with trio.fail_after(LIMIT):
                        while len(await d.queue.turns("s1")) < count + 2:  # noqa: ASYNC110
                            await trio.sleep(0.02)
                stop = await client.post("/api/chat/s1/stop", json={"messageId": "u2"})
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert stop.status_code == 202 and stop.json()["turn_id"] == turns[1].turn_id
    assert [(t.input, t.status) for t in turns] == [
        ("one", "done"),
        ("two", "cancelled"),
        ("three", "done"),
    ]
    assert data(sse_events(replies["two"].text)) == [{"type": "abort", "reason": "stopped by user"}]
    assert record is not None
    users = [m for m in record.messages if isinstance(m, UserMessage)]
    assert [(m.id, m.content) for m in users] == [("u1", "one"), ("u3", "three")]


async def test_a_stop_naming_the_running_message_stops_that_turn(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(150)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            replies: list[httpx.Response] = []

            async def post() -> None:
                replies.append(await client.post("/api/chat", json=body("s1", "one", "u1")))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post)
                running = await wait_for_turn(d.queue, "s1", "running")
                stop = await client.post("/api/chat/s1/stop", json={"messageId": "u1"})
        turns = await d.queue.turns("s1")
    assert stop.status_code == 202 and stop.json()["turn_id"] == running.turn_id
    assert [(t.status, t.cancel_reason) for t in turns] == [("cancelled", "stopped by user")]
    assert {"type": "abort", "reason": "stopped by user"} in data(sse_events(replies[0].text))


async def test_a_stop_naming_the_answer_a_queued_regenerate_replaces_cancels_it(
    pg_url: str, redis_url: str
) -> None:
    # The AI SDK's regenerate names the answer it replaces (``messageId``), by which its
    # turn is keyed; a stop naming that id was looked up only under the keys of user
    # messages: 204, and the regenerate ran when its turn came.
    async with deployment(pg_url, redis_url, slow_agent(150)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("s1", "one", "u1"))
            first = await d.store.load("s1")
            assert first is not None
            answer = first.messages[-1].id
            replies: dict[str, httpx.Response] = {}

            async def post(key: str, sent: dict[str, Any]) -> None:
                replies[key] = await client.post("/api/chat", json=sent)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "two", body("s1", "two", "u2"))
                await wait_for_turn(d.queue, "s1", "running")
                nursery.start_soon(post, "regenerate", _regenerate("s1", "one", "u1", answer))
                with trio.fail_after(LIMIT):
                    while len(turns := await d.queue.turns("s1")) < 3:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                stop = await client.post("/api/chat/s1/stop", json={"messageId": answer})
        turns = await d.queue.turns("s1")
    assert stop.status_code == 202 and stop.json()["turn_id"] == turns[2].turn_id
    assert [(t.input, t.regenerate, t.status) for t in turns] == [
        ("one", False, "done"),
        ("two", False, "done"),
        ("one", True, "cancelled"),
    ]
    assert data(sse_events(replies["regenerate"].text)) == [
        {"type": "abort", "reason": "stopped by user"}
    ]
    assert "finish" in [e["type"] for e in data(sse_events(replies["two"].text))]


async def test_a_stop_naming_the_answer_a_running_regenerate_replaces_stops_it(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, slow_agent(150)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("s1", "one", "u1"))
            first = await d.store.load("s1")
            assert first is not None
            answer = first.messages[-1].id
            replies: list[httpx.Response] = []

            async def post() -> None:
                sent = _regenerate("s1", "one", "u1", answer)
                replies.append(await client.post("/api/chat", json=sent))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post)
                with trio.fail_after(LIMIT):  # the regenerate's turn runs ("one"'s is over)
                    while [t.status for t in await d.queue.turns("s1")] != ["done", "running"]:  # noqa: ASYNC110
                        await trio.sleep(0.02)
                stop = await client.post("/api/chat/s1/stop", json={"messageId": answer})
        turns = await d.queue.turns("s1")
    assert stop.status_code == 202 and stop.json()["turn_id"] == turns[1].turn_id
    assert [(t.regenerate, t.status, t.cancel_reason) for t in turns] == [
        (False, "done", None),
        (True, "cancelled", "stopped by user"),
    ]
    assert {"type": "abort", "reason": "stopped by user"} in data(sse_events(replies[0].text))


def _regenerate_claim(
    *, regenerates: str | None, takeover: bool = False, saved: bool = False
) -> Claim:
    turn = QueuedTurn(
        turn_id="t3", session_id="s1", seq=3, status="running", owner="w", epoch=1,
        attempts=1, saved=saved, cancel_requested=False, cancel_reason=None,
        finish_reason=None, error=None, input="one", meta={}, regenerate=True,
        idempotency_key=None, options=TurnOptions(regenerates=regenerates),
    )  # fmt: skip
    return Claim(turn=turn, owner="w", epoch=1, takeover=takeover)


def test_the_workers_regenerate_check_asks_only_a_first_start_naming_a_known_answer() -> None:
    # A takeover or a saved turn goes on with what its own saves stored (its new answer
    # follows the later message: refusing it then would fail a turn half done); a row
    # without the field, or naming an answer the history does not hold, replaces the
    # last turn as before.
    history = (
        UserMessage(content="one", id="u1"),
        AssistantMessage(id="a1"),
        UserMessage(content="two", id="u2"),
        AssistantMessage(id="a2"),
    )
    record = SessionRecord(session_id="s1", messages=history)
    outdated = _outdated_regenerate(_regenerate_claim(regenerates="a1"), None, record)
    assert isinstance(outdated, RegenerateOutdated) and "'u2'" in str(outdated)
    assert _outdated_regenerate(_regenerate_claim(regenerates="a1"), history, None) is not None
    for claim in (
        _regenerate_claim(regenerates="a2"),  # the last answer: regenerated
        _regenerate_claim(regenerates=None),  # a row from before the field
        _regenerate_claim(regenerates="a9"),  # an answer the history does not hold
        _regenerate_claim(regenerates="a1", takeover=True),
        _regenerate_claim(regenerates="a1", saved=True),
    ):
        assert _outdated_regenerate(claim, None, record) is None


async def stored_user_ids(d: Any, session_id: str = "s1") -> list[str]:
    record = await d.store.load(session_id)
    assert record is not None
    return [m.id for m in record.messages if isinstance(m, UserMessage)]


@pytest.mark.parametrize("on_busy", [None, "enqueue", "interrupt", "steer", "reject"])
async def test_each_busy_strategy_stores_user_messages_under_the_ids_the_client_sent(
    pg_url: str, redis_url: str, on_busy: str | None
) -> None:
    # A second message while the first's turn runs (queued, interrupting, steering; under
    # reject, once it ended): each stored under its ``useChat`` id, as the embedded app
    # stores it, so a later regenerate, edit, stop or reload of it matches the session.
    async with deployment(pg_url, redis_url, slow_agent(40), on_busy=on_busy) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            async with trio.open_nursery() as nursery:

                async def post(text: str, message_id: str) -> None:
                    await client.post("/api/chat", json=body("s1", text, message_id))

                nursery.start_soon(post, "one", "u1")
                await wait_for_turn(d.queue, "s1", "running")
                if on_busy != "reject":
                    nursery.start_soon(post, "two", "u2")
            if on_busy == "reject":
                await post("two", "u2")
        ids = await stored_user_ids(d)
    assert ids == ["u1", "u2"]


async def test_an_edit_of_the_last_message_is_stored_once_under_its_client_id(
    pg_url: str, redis_url: str
) -> None:
    # The AI SDK's edit: the same id, other text, run in place of its turn (the queue's
    # resend rule, unchanged): the history holds the edited message once, under its id.
    async with deployment(pg_url, redis_url, slow_agent(3, 0.0)) as d:
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            await client.post("/api/chat", json=body("s1", "one", "u1"))
            await client.post("/api/chat", json=body("s1", "one, edited", "u1"))
        record = await d.store.load("s1")
    assert record is not None
    users = [m for m in record.messages if isinstance(m, UserMessage)]
    assert [(m.id, m.content) for m in users] == [("u1", "one, edited")]


async def test_a_client_id_the_session_already_holds_gets_a_fresh_id_not_a_second_copy(
    pg_url: str, redis_url: str
) -> None:
    # "u1" stored by an earlier writer (the embedded app on the same store, an AG-UI
    # run), so no queued turn of the AI SDK's key for it: the message is a new turn, as
    # before, and its user message gets an id of the worker's (ids stay unique).
    async with deployment(pg_url, redis_url, slow_agent(3, 0.0)) as d:
        history = [UserMessage(content="one", id="u1"), AssistantMessage(id="a1")]
        await d.store.save("s1", 0, history)
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            response = await client.post("/api/chat", json=body("s1", "two", "u1"))
        record = await d.store.load("s1")
    assert response.status_code == 200
    assert record is not None
    users = [m for m in record.messages if isinstance(m, UserMessage)]
    assert [m.content for m in users] == ["one", "two"]
    assert users[0].id == "u1" and users[1].id != "u1"
    assert len({m.id for m in record.messages}) == len(record.messages)


async def test_a_continuation_keeps_the_user_message_under_its_client_id(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent()) as d:
        first = await first_part(d, d.urls[0])
        message_id = approval_payloads(first)[0]["messageId"]
        request = asked(first)
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            decided = answer("s1", message_id, request["approvalId"], True)
            response = await client.post("/api/chat", json=decided)
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        ids = await stored_user_ids(d)
    assert response.status_code == 200
    assert ids == ["u1"]
