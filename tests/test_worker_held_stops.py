"""A named stop that reaches a front end before the POST of the message it names, in a
worker deployment (real PostgreSQL and Redis, front ends and a worker as
tests/test_frontend.py runs them): the front end finds no turn of it and holds it in
``axon_held_stops`` (``TurnQueue.hold_stop``); the submit of that message, on any front
end, takes it in its insert, and the worker stops the turn as it starts. A late stop
(its turn ended) is not held: an edit or regenerate that follows runs. The held stops
stay bounded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import trio

from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.app.web.frontend import message_key
from runtime.app.worker import open_worker
from runtime.messages import AssistantMessage
from runtime.turn_queue import TurnOptions
from tests import test_busy
from tests.support import worker_agent
from tests.support.pg import pg_connect
from tests.support.redis import require_redis
from tests.test_busy import Script, agent_with, holding
from tests.test_frontend import LIMIT, body, data, deployment, streamed_text
from tests.test_relay_web import sse_events
from tests.test_worker_approval import answer, approval_agent, asked, chat, payloads, ran
from tests.test_worker_steer import queued


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _fresh_gate() -> None:
    test_busy.held["open"], test_busy.held["release"] = trio.Event(), trio.Event()


async def held_rows(queue: Any) -> list[tuple[Any, ...]]:
    return await queue.store.run(
        "held stops",
        lambda conn: conn.execute(
            "SELECT session_id, message_id, reason FROM axon_held_stops ORDER BY held_at"
        ).fetchall(),
        transaction=False,
    )


async def test_a_stop_before_its_message_through_another_front_end_stops_its_turn(
    pg_url: str, redis_url: str
) -> None:
    script = Script(["never"])
    async with deployment(pg_url, redis_url, agent_with(script), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            stop = await client.post(f"{d.urls[1]}/api/chat/s1/stop", json={"messageId": "u1"})
            reply = await client.post(f"{d.urls[0]}/api/chat", json=body("s1", "go", "u1"))
        (turn,) = await d.queue.turns("s1")
        record = await d.store.load("s1")
        left = await held_rows(d.queue)
    assert stop.status_code == 204
    chunks = data(sse_events(reply.text))
    assert {"type": "abort", "reason": "stopped by user"} in chunks
    assert "never" not in reply.text and script.requests == []
    assert (turn.status, turn.finish_reason) == ("cancelled", "aborted")  # as any stop
    assert record is not None
    user, answer = record.messages
    assert user.text == "go" and user.id == "u1"
    assert isinstance(answer, AssistantMessage) and answer.interrupted
    assert left == []  # used once


@pytest.mark.parametrize("again", ["regenerate", "edit"])
async def test_a_late_stop_does_not_stop_the_regenerate_or_edit_that_follows(
    pg_url: str, redis_url: str, again: str
) -> None:
    script = Script(["first"], ["second"])
    async with deployment(pg_url, redis_url, agent_with(script), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = await client.post(f"{d.urls[0]}/api/chat", json=body("s1", "go", "u1"))
            stop = await client.post(f"{d.urls[1]}/api/chat/s1/stop", json={"messageId": "u1"})
            left = await held_rows(d.queue)
            if again == "regenerate":
                sent = {**body("s1", "go", "u1"), "trigger": "regenerate-message"}
            else:
                sent = body("s1", "went", "u1")
            second = await client.post(f"{d.urls[0]}/api/chat", json=sent)
        record = await d.store.load("s1")
    assert "first" in first.text and stop.status_code == 204
    assert left == []  # its turn ended: a late stop, not held
    assert "abort" not in second.text and "second" in second.text
    assert record is not None and record.messages[-1].text == "second"


@pytest.fixture
async def queue(pg_url: str) -> AsyncIterator[TurnQueue]:
    store = await PostgresStore.open(pg_url)
    turns = TurnQueue(store)
    try:
        yield turns
    finally:
        await turns.aclose()
        await store.aclose()


async def test_a_held_stop_is_taken_by_the_first_submit_of_its_message_only(
    queue: TurnQueue,
) -> None:
    # A retry or an edit names a message sent before: a stop of it may be a late one
    await queue.hold_stop("s1", "u1", [], "stopped by user")
    first = await queue.submit("s1", "go", idempotency_key="k1", stop_name="u1")
    await queue.hold_stop("s1", "u1", [], "stopped by user")  # late (its keys not told)
    again = await queue.submit("s1", "go", idempotency_key="k1", stop_name="u1")
    await queue.request_cancel(first.turn_id, "stopped by user")  # ended: it may be edited
    edit = await queue.submit("s1", "went", idempotency_key="k1", stop_name="u1")
    assert (first.cancel_reason, first.cancel_requested) == ("stopped by user", False)
    assert again.turn_id == first.turn_id
    assert edit.turn_id != first.turn_id and edit.cancel_reason is None
    assert await held_rows(queue) == [("s1", "u1", "stopped by user")]  # left to expire


async def test_a_stop_of_another_message_or_session_is_not_taken(queue: TurnQueue) -> None:
    await queue.hold_stop("s1", "u9", [], "stopped by user")
    await queue.hold_stop("s2", "u1", [], "stopped by user")
    turn = await queue.submit("s1", "go", idempotency_key="k1", stop_name="u1")
    assert turn.cancel_reason is None and len(await held_rows(queue)) == 2


async def test_a_stop_past_its_time_is_not_taken(queue: TurnQueue) -> None:
    queue.held_stop_for = 0.0
    await queue.hold_stop("s1", "u1", [], "stopped by user")
    turn = await queue.submit("s1", "go", idempotency_key="k1", stop_name="u1")
    assert turn.cancel_reason is None


async def test_the_held_stops_are_bounded_the_oldest_dropped(queue: TurnQueue) -> None:
    # 100,000 stops for ids never sent keep at most ``held_stops_kept`` rows
    queue.held_stops_kept = 3
    for n in range(6):
        await queue.hold_stop(f"s{n}", "u1", [], "stopped by user")
    assert [row[0] for row in await held_rows(queue)] == ["s3", "s4", "s5"]


async def test_a_stop_naming_an_overlong_id_is_not_held(queue: TurnQueue) -> None:
    await queue.hold_stop("s1", "u" * 257, [], "stopped by user")
    assert await held_rows(queue) == []


async def test_racing_holds_all_succeed_and_the_next_one_trims_to_the_cap(
    queue: TurnQueue,
) -> None:
    # Many front ends hold stops at once (an attack's): no hold fails on another's
    # locks, and the table is back within its cap at the next hold.
    queue.held_stops_kept = 5
    async with trio.open_nursery() as nursery:
        for n in range(40):
            nursery.start_soon(queue.hold_stop, f"s{n}", "u1", [], "stopped by user")
    await queue.hold_stop("last", "u1", [], "stopped by user")
    rows = await held_rows(queue)
    assert len(rows) <= 5 and rows[-1][0] == "last"


async def test_a_stop_before_a_steering_message_takes_it_out_at_once(
    pg_url: str, redis_url: str
) -> None:
    # Under --on-busy steer a message held stopped is not handed to the running turn
    # (whose model would have seen it), nor kept to run after it: cancelled in its
    # submit, nothing of it stored (the embedded host takes it out so).
    script = Script(holding("H1"), ["first done"], ["never"])
    agent = agent_with(script, "steer")
    async with deployment(pg_url, redis_url, agent, fronts=2, on_busy="steer") as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            out: dict[str, Any] = {}

            async def post(name: str, text: str, message_id: str) -> None:
                out[name] = await client.post(
                    f"{d.urls[0]}/api/chat", json=body("s1", text, message_id)
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "first", "first", "u1")
                await test_busy.held["open"].wait()
                stop = await client.post(f"{d.urls[1]}/api/chat/s1/stop", json={"messageId": "u2"})
                nursery.start_soon(post, "second", "also this", "u2")
                await queued(d.queue, "s1", 2)
                test_busy.held["release"].set()
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert stop.status_code == 204
    first = sse_events(out["first"].text)
    assert streamed_text(first) == "first done" and "abort" not in out["first"].text
    assert {"type": "abort", "reason": "stopped by user"} in data(sse_events(out["second"].text))
    assert turns[1].steer_of is None and turns[1].status == "cancelled"
    assert len(script.requests) == 2  # "never" was not asked for
    assert all("also this" not in str(r.messages) for r in script.requests)
    assert record is not None
    assert [m.text for m in record.messages if m.role == "user"] == ["first"]
    assert not any(isinstance(m, AssistantMessage) and m.interrupted for m in record.messages)


async def test_a_stop_whose_message_was_submitted_while_it_was_held_stops_that_turn(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The POST's submit commits between the stop's look for its turn and its hold: the
    # submit found nothing to take, the hold sees the turn (a late stop, by its rule)
    # and keeps nothing; the stop looks again and stops it.
    hold = TurnQueue.hold_stop

    async def racing_hold(self: TurnQueue, session_id: str, *args: Any, **kwargs: Any) -> None:
        key = message_key(session_id, "submit", "u1")
        await self.submit(session_id, "go", idempotency_key=key, stop_name="u1")
        await hold(self, session_id, *args, **kwargs)

    async with deployment(pg_url, redis_url, agent_with(Script()), worker=False) as d:
        monkeypatch.setattr(TurnQueue, "hold_stop", racing_hold)
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            stop = await client.post(f"{d.urls[0]}/api/chat/s1/stop", json={"messageId": "u1"})
        (turn,) = await d.queue.turns("s1")
    assert stop.status_code == 202 and stop.json() == {"turn_id": turn.turn_id}
    assert turn.status == "cancelled"


async def test_a_late_stop_of_a_continuation_does_not_stop_a_regenerate_of_its_answer(
    pg_url: str, redis_url: str
) -> None:
    # The continuation of answer A ended before the client's stop naming A arrived (a
    # continuation's turn is keyed by its user message: no turn was ever keyed by A);
    # a regenerate of A names A too, and was stopped by that late stop held for it.
    ran.clear()
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = sse_events((await client.post(f"{a}/api/chat", json=chat("s1"))).text)
            answer_id = payloads(first)[0]["messageId"]
            sent = answer("s1", answer_id, asked(first)["approvalId"], True)
            continued = await client.post(f"{a}/api/chat", json=sent)
            stop = await client.post(f"{b}/api/chat/s1/stop", json={"messageId": answer_id})
            left = await held_rows(d.queue)
            again = {**chat("s1"), "trigger": "regenerate-message", "messageId": answer_id}
            regenerated = await client.post(f"{a}/api/chat", json=again)
    assert '"finishReason":"stop"' in continued.text
    assert stop.status_code == 204 and left == []
    assert regenerated.status_code == 200 and "abort" not in regenerated.text


async def test_a_stopped_message_does_not_interrupt_the_running_turn(
    pg_url: str, redis_url: str
) -> None:
    # Under --on-busy interrupt a message whose stop came first is stopped as it starts:
    # it is no new message to interrupt the running turn for.
    script = Script(holding("H1"), ["first done"], ["never"])
    agent = agent_with(script, "interrupt")
    async with deployment(pg_url, redis_url, agent, fronts=2, on_busy="interrupt") as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            out: dict[str, Any] = {}

            async def post(name: str, text: str, message_id: str) -> None:
                out[name] = await client.post(
                    f"{d.urls[0]}/api/chat", json=body("s1", text, message_id)
                )

            async with trio.open_nursery() as nursery:
                nursery.start_soon(post, "first", "first", "u1")
                await test_busy.held["open"].wait()
                stop = await client.post(f"{d.urls[1]}/api/chat/s1/stop", json={"messageId": "u2"})
                nursery.start_soon(post, "second", "also this", "u2")
                await queued(d.queue, "s1", 2)
                test_busy.held["release"].set()
        turns = await d.queue.turns("s1")
    assert stop.status_code == 204
    assert streamed_text(sse_events(out["first"].text)) == "first done"
    assert "abort" not in out["first"].text
    assert (turns[0].status, turns[0].cancel_requested) == ("done", False)
    assert {"type": "abort", "reason": "stopped by user"} in data(sse_events(out["second"].text))
    assert turns[1].status == "cancelled" and len(script.requests) == 2


async def test_a_stop_naming_a_message_and_a_turn_not_there_yet_is_held_by_the_message(
    pg_url: str, redis_url: str
) -> None:
    # An AG-UI client knows its run's turn id (its runId) before the POST: a stop naming
    # both that overtakes the run was not kept, and the run went on to its answer.
    script = Script(["never"])
    async with deployment(pg_url, redis_url, agent_with(script), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            named = {"messageId": "u1", "turnId": "run_1"}
            stop = await client.post(f"{d.urls[1]}/api/chat/s1/stop", json=named)
            left = await held_rows(d.queue)
            reply = await client.post(f"{d.urls[0]}/api/chat", json=body("s1", "go", "u1"))
        (turn,) = await d.queue.turns("s1")
    assert stop.status_code == 204 and left == [("s1", "u1", "stopped by user")]
    assert {"type": "abort", "reason": "stopped by user"} in data(sse_events(reply.text))
    assert turn.status == "cancelled" and script.requests == []


async def test_a_stop_naming_a_message_and_another_existing_turn_is_not_held(
    queue: TurnQueue,
) -> None:
    # The turn it names is there and is not the message's: it names nothing to come.
    other = await queue.submit("s1", "go", idempotency_key="k0")
    await queue.hold_stop("s1", "u1", [], "stopped by user", turn_id=other.turn_id)
    assert await held_rows(queue) == []


async def test_a_stop_past_its_time_does_not_keep_a_message_from_interrupting(
    queue: TurnQueue,
) -> None:
    queue.held_stop_for = 0.0
    first = await queue.submit("s1", "go", idempotency_key="k0")
    await queue.hold_stop("s1", "u1", [], "stopped by user")
    second = await queue.submit(
        "s1", "went", idempotency_key="k1", stop_name="u1", on_busy="interrupt"
    )
    before = await queue.get_status(first.turn_id)
    assert before is not None and before.status == "cancelled"
    assert second.cancel_reason is None


async def test_a_stop_naming_the_answer_of_a_turn_never_continued_does_not_find_it(
    queue: TurnQueue,
) -> None:
    # Only a continuation is named by its answer (the embedded TurnStream.named_by).
    turn = await queue.submit("s1", "go", idempotency_key="k0")
    assert await queue.open_by_key("s1", [], message_id=turn.message_id) is None


STALL = 4243
"""The advisory lock the test holds and its trigger waits for (its row's insert)."""


@pytest.mark.parametrize("between", ["held", "dropped"])
async def test_an_interrupting_submit_checks_and_takes_a_held_stop_at_once(
    queue: TurnQueue, pg_url: str, between: str
) -> None:
    # Another front end's hold (or its trim of the held stops) commits while the
    # interrupting submit runs, after its interrupt was decided (held by the test's
    # trigger before its row's insert, in the submit's one call): the message
    # interrupts the running turn or is stopped, never both (held) nor neither (dropped).
    first = await queue.submit("s1", "go", idempotency_key="k0")
    if between == "dropped":
        await queue.hold_stop("s1", "u1", [], "stopped by user")
    schema = pg_url.rsplit("schema=", 1)[1]
    with pg_connect() as holder, pg_connect() as other:
        for conn in (holder, other):
            conn.execute(f"SET search_path TO {schema}")
        holder.execute(
            f"""CREATE FUNCTION held_stall() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                PERFORM pg_advisory_lock_shared({STALL});
                PERFORM pg_advisory_unlock_shared({STALL});
                RETURN NEW;
            END $$"""
        )
        holder.execute(
            "CREATE TRIGGER held_stall BEFORE INSERT ON axon_turns FOR EACH ROW "
            "EXECUTE FUNCTION held_stall()"
        )
        holder.execute("SELECT pg_advisory_lock(%s)", (STALL,))
        got: list[Any] = []
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:

                async def submit() -> None:
                    got.append(
                        await queue.submit(
                            "s1", "went", idempotency_key="k1", stop_name="u1", on_busy="interrupt"
                        )
                    )

                nursery.start_soon(submit)
                while True:  # until the submit waits in its insert
                    if other.execute(
                        "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                        "AND classid = 0 AND objid = %s",
                        (STALL,),
                    ).fetchone():
                        break
                    await trio.sleep(0.01)
                if between == "held":
                    other.execute(
                        "INSERT INTO axon_held_stops (session_id, message_id, reason) "
                        "VALUES ('s1', 'u1', 'stopped by user')"
                    )
                else:  # as a hold's trim does: rows another takes are skipped
                    other.execute(
                        "DELETE FROM axon_held_stops WHERE ctid IN (SELECT ctid "
                        "FROM axon_held_stops FOR UPDATE SKIP LOCKED)"
                    )
                holder.execute("SELECT pg_advisory_unlock(%s)", (STALL,))
    (second,) = got
    before = await queue.get_status(first.turn_id)
    assert before is not None
    interrupted = before.status == "cancelled"
    stopped = second.cancel_reason == "stopped by user"
    assert interrupted != stopped, (before, second)


@pytest.mark.parametrize("on_busy", ["enqueue", "steer", "interrupt"])
async def test_a_stopped_message_that_would_wait_for_another_turn_is_cancelled_at_once(
    queue: TurnQueue, on_busy: str
) -> None:
    # As the embedded host takes such a message out of its queue (nothing stored): its
    # row ends cancelled in its submit, and no worker ever runs it (it ran after the
    # turn ahead, stopped as it started: its message and an interrupted answer saved).
    first = await queue.submit("s1", "go", idempotency_key="k0")
    await queue.hold_stop("s1", "u1", [], "stopped by user")
    second = await queue.submit("s1", "went", idempotency_key="k1", stop_name="u1", on_busy=on_busy)
    ahead = await queue.get_status(first.turn_id)
    assert (second.status, second.finish_reason) == ("cancelled", "aborted")
    assert second.cancel_reason == "stopped by user" and second.steer_of is None
    assert ahead is not None and ahead.status == "queued"  # (interrupted by nothing)


async def test_a_stopped_message_of_an_idle_session_is_queued_to_be_stopped_as_it_starts(
    queue: TurnQueue,
) -> None:
    await queue.hold_stop("s1", "u1", [], "stopped by user")
    turn = await queue.submit("s1", "go", idempotency_key="k1", stop_name="u1")
    assert (turn.status, turn.cancel_reason, turn.cancel_requested) == (
        "queued",
        "stopped by user",
        False,
    )


async def test_a_careless_clients_stops_through_a_front_end_keep_nothing_and_stop_nothing(
    pg_url: str, redis_url: str
) -> None:
    # A 10 MB id (a continuation's answer's shape too), a stop of a finished turn, and
    # one naming another session's message: each a 204, nothing held, nothing stopped.
    script = Script(["first"], ["second"])
    huge = "msg_" + "t" * (10 << 20)
    async with deployment(pg_url, redis_url, agent_with(script), fronts=2) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = await client.post(f"{d.urls[0]}/api/chat", json=body("s1", "go", "u1"))
            stops = [
                await client.post(f"{d.urls[1]}/api/chat/s1/stop", json=named)
                for named in ({"messageId": huge}, {"turnId": huge}, {"messageId": "u1"})
            ]
            other = await client.post(f"{d.urls[1]}/api/chat/s2/stop", json={"messageId": "u2"})
            left = await held_rows(d.queue)
            second = await client.post(f"{d.urls[0]}/api/chat", json=body("s1", "next", "u2"))
    assert "first" in first.text
    assert [s.status_code for s in stops] == [204, 204, 204]
    assert other.status_code == 204 and left == [("s2", "u2", "stopped by user")]
    assert "abort" not in second.text and "second" in second.text


async def test_a_stop_naming_a_turn_not_there_yet_stops_the_edit_that_creates_it(
    queue: TurnQueue,
) -> None:
    # An edit (or a regenerate) carries the id of a message sent before: a stop naming
    # that id may be a late one of the turn before. A client that chose the new turn's
    # id (an AG-UI run's runId) names that instead, which nothing before had.
    first = await queue.submit("s1", "go", idempotency_key="k1", stop_name="u1")
    await queue.request_cancel(first.turn_id, "done with it")
    await queue.hold_stop("s1", None, [], "stopped by user", turn_id="turn_edit")
    held = await held_rows(queue)
    edit = await queue.submit(
        "s1", "went", idempotency_key="k1", stop_name="u1", turn_id="turn_edit"
    )
    assert len(held) == 1 and edit.cancel_reason == "stopped by user"
    assert await held_rows(queue) == []  # used


async def test_a_stop_naming_a_turn_is_not_kept_once_that_turn_exists(queue: TurnQueue) -> None:
    turn = await queue.submit("s1", "go", turn_id="turn_x")
    await queue.hold_stop("s1", None, [], "stopped by user", turn_id=turn.turn_id)
    await queue.hold_stop("s1", "\x1fturn turn_y", [], "stopped by user")  # (not a message's)
    assert await held_rows(queue) == []


async def test_a_stop_naming_a_turn_only_through_a_front_end_stops_the_run_that_comes(
    pg_url: str, redis_url: str
) -> None:
    script = Script(["never"])
    async with deployment(pg_url, redis_url, agent_with(script), worker=False) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            stop = await client.post(f"{d.urls[0]}/api/chat/s1/stop", json={"turnId": "run_1"})
        turn = await d.queue.submit("s1", "go", turn_id="run_1")
    assert stop.status_code == 204
    assert turn.cancel_reason == "stopped by user"


async def test_a_stopped_steering_message_counts_nothing_on_the_running_turn(
    queue: TurnQueue,
) -> None:
    # A steer that takes a held stop joins nothing: the running turn's count of steers
    # (what its worker's next save reads to look for steering rows) stays as it was.
    await queue.submit("s1", "go", idempotency_key="k0")
    claim = await queue.claim("w1")
    assert claim is not None
    await queue.hold_stop("s1", "u1", [], "stopped by user")
    stopped = await queue.submit(
        "s1", "went", idempotency_key="k1", stop_name="u1", on_busy="steer"
    )
    steering = await queue.submit("s1", "also", idempotency_key="k2", on_busy="steer")
    (steers,) = await queue.store.run(
        "steers",
        lambda conn: conn.execute(
            "SELECT steers FROM axon_turns WHERE turn_id = %s", (claim.turn.turn_id,)
        ).fetchone(),
        transaction=False,
    )
    assert stopped.status == "cancelled" and stopped.steer_of is None
    assert steering.steer_of == claim.turn.turn_id
    assert steers == 1


async def test_a_stop_naming_the_turn_id_an_ai_sdk_edit_sends_stops_it_before_its_post(
    pg_url: str, redis_url: str
) -> None:
    # An edit of u1 carries u1's id, which the turn before had: a stop naming it may be a
    # late one of that turn. The body's ``turnId`` (``prepareSendMessagesRequest``)
    # names the edit's turn alone: a stop of it sent before the POST stops it.
    script = Script(["first"], ["never"])
    async with deployment(pg_url, redis_url, agent_with(script)) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            first = await client.post(f"{d.urls[0]}/api/chat", json=body("s1", "go", "u1"))
            stop = await client.post(f"{d.urls[0]}/api/chat/s1/stop", json={"turnId": "t_edit"})
            edit = await client.post(
                f"{d.urls[0]}/api/chat", json={**body("s1", "went", "u1"), "turnId": "t_edit"}
            )
        turn = await d.queue.get_status("t_edit")
    assert "first" in first.text and stop.status_code == 204
    assert turn is not None and turn.cancel_reason == "stopped by user"
    assert "never" not in edit.text and len(script.requests) == 1


# -- rolling upgrades: the stored form of a stop held for a turn not running yet ---------
#
# It is the turn's queued row: ``cancel_reason`` set, ``cancel_requested`` not (no version
# column, no shape tag). Options are JSON read field by field: a field a row lacks takes
# its default, one this version does not know is ignored. Pinned here: a row of before
# (options without the fields added since) is stopped as it starts; a row of a newer
# front end runs without what this worker does not know; a row this worker cannot read
# at all ends failed saying so, not a worker that claims it again and again.


def set_options(queue: TurnQueue, turn_id: str, options: bytes) -> None:
    with pg_connect() as conn:
        conn.execute(f"SET search_path TO {queue.store.schema}")
        conn.execute("UPDATE axon_turns SET options = %s WHERE turn_id = %s", (options, turn_id))


async def run_worker_until(pg_url: str, queue: TurnQueue, turn_id: str, **options: Any) -> Any:
    async with open_worker(pg_url, agent=worker_agent.agent, poll=0.05, **options):
        done = await queue.wait_finished(turn_id, LIMIT)
    assert done is not None, "the turn did not end"
    return done


async def test_a_held_stop_on_a_row_of_before_the_newer_options_stops_its_turn(
    pg_url: str, queue: TurnQueue
) -> None:
    await queue.hold_stop("s1", "u1", [], "stopped by user")
    turn = await queue.submit(
        "s1", "go", idempotency_key="k1", stop_name="u1", options=TurnOptions(user_message_id="u1")
    )
    assert (turn.cancel_reason, turn.cancel_requested) == ("stopped by user", False)
    set_options(queue, turn.turn_id, b'{"user_message_id": "u1"}')  # no follows, regenerates
    done = await run_worker_until(pg_url, queue, turn.turn_id)
    record = await queue.store.load("s1")
    assert (done.status, done.finish_reason) == ("cancelled", "aborted")
    assert record is not None
    user, answer = record.messages
    assert user.id == "u1" and isinstance(answer, AssistantMessage) and answer.interrupted


async def test_a_row_with_options_this_worker_does_not_know_runs_without_them(
    pg_url: str, queue: TurnQueue
) -> None:
    turn = await queue.submit("s1", "go", options=TurnOptions(user_message_id="u1"))
    set_options(queue, turn.turn_id, b'{"user_message_id": "u1", "from_the_future": [1]}')
    done = await run_worker_until(pg_url, queue, turn.turn_id)
    assert (done.status, done.options) == ("done", TurnOptions(user_message_id="u1"))


async def test_a_row_this_worker_cannot_read_ends_failed_saying_why(
    pg_url: str, queue: TurnQueue
) -> None:
    # A field of another shape (a newer front end's, or a broken write): the claim cannot
    # decode the row. The session's later turns must not wait behind it for ever.
    turn = await queue.submit("s1", "go")
    set_options(queue, turn.turn_id, b'{"tools": 5}')
    later = await queue.submit("s1", "then")
    async with open_worker(pg_url, agent=worker_agent.agent, poll=0.05, lease=0.3):
        after = await queue.wait_finished(later.turn_id, LIMIT)
    status = await queue.get_status(turn.turn_id)
    assert status is not None and status.status == "failed"
    assert status.error is not None and "cannot be read" in status.error, status.error
    assert status.attempts == 1  # failed by its first claim, not abandoned three times
    assert after is not None and after.status == "done"
