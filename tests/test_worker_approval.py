"""Turns that wait for a person in the worker deployment, in process: real PostgreSQL and
Redis, front ends and a worker in this process (tests/test_worker_approval_processes.py
runs real worker and front-end processes).

A turn that suspends for approval leaves its queue row ``awaiting-input`` with nothing
held; a decision posted to any front end is recorded through the queue, which puts the
row back; a worker resumes the turn, and its continuation streams through the relay in
the same assistant message."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores.postgres import parse_url
from runtime import Agent, tool
from runtime.actor_messages import InferRequest
from runtime.messages import AssistantMessage, ToolCallPart, ToolMessage, UserMessage
from tests.support.redis import require_redis
from tests.test_frontend import LIMIT, Deployment, EventReader, deployment
from tests.test_relay_web import sse_events

ran: list[str] = []


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file (it needs a person's approval)."""
    ran.append(path)
    return f"deleted {path}"


def respond(request: InferRequest) -> list[Any]:
    """For ``delete ...``: step 0 asks to delete ``/x`` (and ``/y`` for ``delete /x /y``),
    then an answer naming the result or the denial; any other input is answered ``ok``."""
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    if users[-1].content not in ("delete /x", "delete /x /y"):
        return ["ok"]
    if current_step(request.messages) == 0:
        calls = tool_call("delete_file", {"path": "/x"}, tool_call_id="D")
        if users[-1].content == "delete /x /y":
            calls += tool_call("delete_file", {"path": "/y"}, tool_call_id="E")
        return ["I will delete it. ", *calls]
    last = request.messages[-1]
    assert isinstance(last, ToolMessage)
    said = last.error if last.error is not None else last.output
    return [f"Result: {said}. " + " ".join(f"w{i}" for i in range(40))]


def approval_agent(*, delay: float = 0.0, timeout: float | None = None) -> Agent:
    return Agent(
        name="asks",
        provider=ScriptedProvider(responder=respond, delay=delay, chunk_size=4),
        tools=[delete_file],
        approval_timeout=timeout,
    )


@pytest.fixture
def redis_url() -> str:
    return require_redis()


@pytest.fixture(autouse=True)
def _clear_ran() -> None:
    ran.clear()


def chat(session_id: str, text: str = "delete /x", message_id: str = "u1") -> dict[str, Any]:
    return {
        "id": session_id,
        "messages": [{"id": message_id, "role": "user", "parts": [{"type": "text", "text": text}]}],
        "trigger": "submit-message",
    }


def answer(
    session_id: str, message_id: str, approval_id: str, approved: bool, **extra: Any
) -> dict[str, Any]:
    """The continuation ``useChat`` sends: the conversation, the answered assistant
    message last (``approval-responded``)."""
    sent = chat(session_id)
    part = {
        "type": "tool-delete_file",
        "toolCallId": "D",
        "state": "approval-responded",
        "input": {"path": "/x"},
        "approval": {"id": approval_id, "approved": approved, **extra},
    }
    sent["messages"].append(
        {"id": message_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}
    )
    sent["messageId"] = message_id
    return sent


def payloads(events: list[tuple[str | None, Any]]) -> list[Any]:
    return [d for _, d in events if d != "[DONE]"]


def asked(events: list[tuple[str | None, Any]]) -> dict[str, Any]:
    return next(d for d in payloads(events) if d["type"] == "tool-approval-request")


def row(pg_url: str, turn_id: str) -> tuple[Any, ...]:
    import psycopg

    libpq, schema = parse_url(pg_url)
    with psycopg.connect(libpq, autocommit=True) as conn:
        conn.execute(f"SET search_path TO {schema}")
        found = conn.execute(
            "SELECT status, owner, lease_until, resumes, finish_reason FROM axon_turns "
            "WHERE turn_id = %s",
            (turn_id,),
        ).fetchone()
    assert found is not None
    return tuple(found)


async def first_part(d: Deployment, url: str, session_id: str = "s1") -> list[Any]:
    """POST a turn that asks for approval; its events once the turn waits."""
    async with httpx.AsyncClient(timeout=LIMIT) as client:
        response = await client.post(f"{url}/api/chat", json=chat(session_id))
    assert response.status_code == 200
    return sse_events(response.text)


async def waiting_turn(d: Deployment, session_id: str = "s1") -> Any:
    with trio.fail_after(LIMIT):
        while True:
            turns = await d.queue.turns(session_id)
            if turns and turns[-1].waiting:
                return turns[-1]
            await trio.sleep(0.02)


async def expire_waiting_turn(d: Deployment) -> Any:
    """Move the first worker's wall clock ten minutes on past s1's waiting turn (its
    ``approval_timeout`` 600 s, checked to be set) and return the turn once the worker
    noticed the expiry from the queue and finished it."""
    waited = await waiting_turn(d)
    assert waited.expires_at is not None and waited.expires_at > time.time() + 500
    host = d.workers[0].host
    assert host is not None
    host.clock = lambda: time.time() + 601  # the wall clock, ten minutes on
    return await d.queue.wait_finished(waited.turn_id, LIMIT)


async def test_a_suspended_turns_row_awaits_input_with_no_owner_and_no_lease(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent()) as d:
        events = await first_part(d, d.urls[0])
        turn = await waiting_turn(d)
        status, owner, lease, resumes, reason = row(pg_url, turn.turn_id)
        running = dict(d.workers[0].running)
        async with httpx.AsyncClient(base_url=d.urls[0], timeout=LIMIT) as client:
            listed = (await client.get("/api/sessions")).json()["sessions"]
            resumed = await client.get("/api/chat/s1/stream")
    assert [(s["busy"], s["waiting"]) for s in listed] == [(False, 1)]
    assert resumed.status_code == 204  # a waiting turn streams nothing until decided
    assert (status, owner, lease, resumes, reason) == (
        "awaiting-input",
        None,
        None,
        0,
        "awaiting-input",
    )
    assert running == {}  # nothing of it held in the worker
    assert asked(events)["toolCallId"] == "D"
    assert payloads(events)[-1]["messageMetadata"]["finishReason"] == "awaiting-input"
    assert ran == []


async def test_the_step_that_asks_suspends_the_row_in_its_own_commit(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.stores.turns import TurnQueue

    separate: list[str] = []
    original = TurnQueue.suspend

    async def suspend(self: TurnQueue, claim: Any, **kw: Any) -> bool:
        separate.append(claim.turn.turn_id)
        return await original(self, claim, **kw)

    monkeypatch.setattr(TurnQueue, "suspend", suspend)
    async with deployment(pg_url, redis_url, approval_agent(timeout=600)) as d:
        await first_part(d, d.urls[0])
        turn = await waiting_turn(d)
        status = await d.queue.get_status(turn.turn_id)
    assert separate == []  # no transaction of its own: the step's save suspended it
    assert status is not None and status.waiting and status.owner is None
    assert status.expires_at is not None and status.expires_at > time.time() + 500


async def test_approving_on_another_front_end_resumes_the_turn_in_the_same_message(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        a, b = d.urls
        first = await first_part(d, a)
        message_id = payloads(first)[0]["messageId"]
        request = asked(first)
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(
                f"{b}/api/chat", json=answer("s1", message_id, request["approvalId"], True)
            )
        turn = await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        record = await d.store.load("s1")
    second = payloads(sse_events(response.text))
    types = [c["type"] for c in second]
    assert response.status_code == 200
    assert second[0] == {"type": "start", "messageId": message_id}
    assert "tool-input-available" not in types and "tool-input-start" not in types
    assert {"type": "tool-output-available", "toolCallId": "D", "output": "deleted /x"} in second
    assert types[-1] == "finish" and second[-1]["finishReason"] == "stop"
    assert ran == ["/x"]  # once
    assert turn is not None and turn.status == "done" and turn.resumes == 1
    assert record is not None
    assistant = [m for m in record.messages if isinstance(m, AssistantMessage)]
    assert [m.id for m in assistant] == [message_id]
    call = next(p for p in assistant[0].content if isinstance(p, ToolCallPart))
    assert call.awaiting is not None and call.awaiting.id == request["approvalId"]
    assert call.awaiting.decided and call.awaiting.approved  # the request and the decision
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [(r.tool_call_id, r.output) for r in results] == [("D", "deleted /x")]


async def test_an_answer_that_leaves_a_call_waiting_is_202_with_what_still_waits(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        a, b = d.urls
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(f"{a}/api/chat", json=chat("s1", "delete /x /y"))
            first = sse_events(response.text)
            sent = answer("s1", payloads(first)[0]["messageId"], asked(first)["approvalId"], True)
            sent["messages"][0]["parts"][0]["text"] = "delete /x /y"
            partly = await client.post(f"{b}/api/chat", json=sent)
        turn = await waiting_turn(d)
    assert (partly.status_code, partly.json()) == (202, {"recorded": True, "waiting": 1})
    assert ran == [] and turn.waiting  # nothing runs until the last call is decided


async def test_a_denial_streams_tool_output_denied_and_runs_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        a, b = d.urls
        first = await first_part(d, a)
        message_id = payloads(first)[0]["messageId"]
        sent = answer("s1", message_id, asked(first)["approvalId"], False, reason="not now")
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(f"{b}/api/chat", json=sent)
        record = await d.store.load("s1")
    second = payloads(sse_events(response.text))
    assert {"type": "tool-output-denied", "toolCallId": "D"} in second
    text = "".join(c["delta"] for c in second if c["type"] == "text-delta")
    assert text.startswith("Result: the tool call was denied: not now.")
    assert ran == []
    assert record is not None
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [r.error for r in results] == ["the tool call was denied: not now"]


async def test_stop_denies_what_a_waiting_turn_waits_for_and_the_turn_ends(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        await first_part(d, d.urls[0])
        turn = await waiting_turn(d)
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            stopped = await client.post(f"{d.urls[1]}/api/chat/s1/stop", json={})
        finished = await d.queue.wait_finished(turn.turn_id, LIMIT)
        record = await d.store.load("s1")
    assert stopped.status_code == 202 and stopped.json() == {"turn_id": turn.turn_id}
    assert finished is not None and finished.status == "done" and finished.resumes == 1
    assert ran == []
    assert record is not None
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [r.error for r in results] == ["the tool call was denied: stopped"]


async def test_stop_with_no_turn_running_queued_or_waiting_is_204(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent()) as d:
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            stopped = await client.post(f"{d.urls[0]}/api/chat/nobody/stop", json={})
    assert stopped.status_code == 204


async def test_two_racing_decisions_on_two_front_ends_record_exactly_one(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        message_id = payloads(first)[0]["messageId"]
        approval_id = asked(first)["approvalId"]
        answers: dict[str, httpx.Response] = {}

        async def decide(url: str, approved: bool) -> None:
            async with httpx.AsyncClient(timeout=LIMIT) as client:
                sent = answer("s1", message_id, approval_id, approved)
                answers[url] = await client.post(f"{url}/api/chat", json=sent)

        async with trio.open_nursery() as nursery:
            for url, approved in zip(d.urls, (True, False), strict=True):
                nursery.start_soon(decide, url, approved)
        turn = await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        record = await d.store.load("s1")
    codes = sorted(r.status_code for r in answers.values())
    assert codes == [200, 409]
    assert turn is not None and turn.resumes == 1  # resumed once
    assert record is not None
    call = next(
        p for m in record.messages if isinstance(m, AssistantMessage) for p in m.content
        if isinstance(p, ToolCallPart)
    )  # fmt: skip
    winner = next(u for u, r in answers.items() if r.status_code == 200)
    assert call.awaiting is not None and call.awaiting.approved is (winner == d.urls[0])
    assert len([m for m in record.messages if isinstance(m, ToolMessage)]) == 1
    assert ran == (["/x"] if winner == d.urls[0] else [])


async def test_a_decision_for_another_sessions_approval_is_refused_and_changes_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        theirs = await first_part(d, d.urls[0], "victim")
        await first_part(d, d.urls[0], "attacker")
        before = await d.store.load("victim")
        sent = answer(
            "attacker", payloads(theirs)[0]["messageId"], asked(theirs)["approvalId"], True
        )
        sent["messageId"] = None  # whatever message id: the approval is not this session's
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            refused = await client.post(f"{d.urls[1]}/api/chat", json=sent)
        after = await d.store.load("victim")
        victim = (await d.queue.turns("victim"))[-1]
    assert refused.status_code == 404, refused.text
    assert before is not None and after is not None and after.version == before.version
    assert victim.waiting and ran == []


async def test_a_new_message_supersedes_the_waiting_turn(pg_url: str, redis_url: str) -> None:
    async with deployment(pg_url, redis_url, approval_agent(), fronts=2) as d:
        first = await first_part(d, d.urls[0])
        waited = await waiting_turn(d)
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            other = await client.post(
                f"{d.urls[1]}/api/chat", json=chat("s1", "never mind", message_id="u2")
            )
            late = await client.post(
                f"{d.urls[1]}/api/chat",
                json=answer(
                    "s1", payloads(first)[0]["messageId"], asked(first)["approvalId"], True
                ),
            )
        turns = await d.queue.turns("s1")
        record = await d.store.load("s1")
    assert other.status_code == 200
    assert (turns[0].turn_id, turns[0].status, turns[0].finish_reason) == (
        waited.turn_id,
        "done",
        "superseded",
    )
    assert late.status_code == 409 and ran == [], late.text
    assert record is not None
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [r.error for r in results] == ["the tool call was denied: superseded"]
    assert [m.content for m in record.messages if isinstance(m, UserMessage)] == [
        "delete /x",
        "never mind",
    ]


async def test_a_worker_notices_an_expired_wait_from_the_queue_and_resumes_it_denied(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(timeout=600)) as d:
        await first_part(d, d.urls[0])
        turn = await expire_waiting_turn(d)
        record = await d.store.load("s1")
    assert turn is not None and turn.status == "done" and turn.resumes == 1
    assert record is not None
    results = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert [r.error for r in results] == ["the tool call was denied: timed out"]
    assert ran == []


async def test_a_client_resuming_the_continuation_on_the_first_front_end_misses_and_repeats_nothing(
    pg_url: str, redis_url: str
) -> None:
    async with deployment(pg_url, redis_url, approval_agent(delay=0.01), fronts=2) as d:
        a, b = d.urls
        first = await first_part(d, a)
        message_id = payloads(first)[0]["messageId"]
        sent = answer("s1", message_id, asked(first)["approvalId"], True)
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with client.stream("POST", f"{b}/api/chat", json=sent) as response:
                seen = await EventReader(response).until(5)  # then the client drops B
            last = seen[-1][0]
            assert last is not None
            rest = await client.get(f"{a}/api/chat/s1/stream", headers={"last-event-id": last})
        await d.queue.wait_finished((await d.queue.turns("s1"))[0].turn_id, LIMIT)
        record = await d.store.load("s1")
    events = [e for e in first if e[0] is not None] + seen
    events += [e for e in sse_events(rest.text) if e[0] is not None]
    ids = [int(i) for i, _ in events if i is not None]
    assert ids == sorted(set(ids))  # nothing repeated
    assert record is not None
    stored = next(m for m in record.messages if isinstance(m, AssistantMessage))
    streamed = "".join(d["delta"] for _, d in events if d["type"] == "text-delta")
    assert streamed == "".join(getattr(p, "text", "") for p in stored.content)  # nothing missing
    outputs = [d for _, d in events if d["type"] == "tool-output-available"]
    assert len(outputs) == 1 and ran == ["/x"]


async def test_a_client_joining_a_long_session_s_continuation_reads_the_turn_not_the_session(
    pg_url: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``GET /api/chat/{id}/stream`` of a continuation leaves out the calls the client saw
    asked: it loaded the whole session for them (a 5,000-message one 1.2 MB a reconnect).
    Now it reads the turn's rows: the same few after 1,000 messages as after none."""
    from actors.stores.postgres import PostgresStore
    from runtime.messages import TextPart

    rows: list[int] = []
    front: list[Any] = []
    record_off_loop = PostgresStore.record_off_loop

    async def counted(self: PostgresStore, sid: str, joined: list[Any], first: int = 0) -> Any:
        if front and self is front[0]:
            rows.append(sum(1 for r in joined if r[2] is not None))
        return await record_off_loop(self, sid, joined, first)

    history = [
        UserMessage(content=f"q{i}", id=f"h{i}")
        if i % 2 == 0
        else AssistantMessage(content=(TextPart(text=f"a{i}", step=0),), id=f"ha{i}")
        for i in range(1000)
    ]
    async with deployment(pg_url, redis_url, approval_agent(delay=0.01), fronts=2) as d:
        a, b = d.urls
        await d.store.save("s1", 0, history)
        first = await first_part(d, a)
        message_id = payloads(first)[0]["messageId"]
        sent = answer("s1", message_id, asked(first)["approvalId"], True)
        front.append(d.hosts[0].store)
        monkeypatch.setattr(PostgresStore, "record_off_loop", counted)
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            async with client.stream("POST", f"{b}/api/chat", json=sent) as response:
                await EventReader(response).until(2)
                rest = await client.get(f"{a}/api/chat/s1/stream")
    streamed = payloads(sse_events(rest.text))
    kinds = [c["type"] for c in streamed]
    assert kinds[0] == "start" and kinds[-1] == "finish"
    assert kinds.count("tool-input-available") == kinds.count("tool-output-available") == 1
    assert 0 < sum(rows) < 10


def test_a_turn_whose_step_suspended_its_row_is_not_lost_to_a_late_renewal() -> None:
    """The step's commit let the row go (``awaiting-input``): a renewal or a save of the
    turn after it finds the row so, which must not cut the turn's relay stream short."""
    from runtime.app.worker import _Running

    entry = _Running(claim=None)  # type: ignore[arg-type]
    entry.suspend()
    entry.lose("the renewal found the row waiting")
    assert not entry.lost


async def test_a_renewal_after_the_turns_own_commit_let_the_row_go_is_no_loss(
    store_and_queue: Any,
) -> None:
    """The renewal runs in the worker's lease thread: it can come between the commit of
    the step that made the turn wait (or of its last step) and that commit's answer on
    the event loop. It finds the row let go by this very claim (the same epoch) and says
    so; before, it was a refusal like a takeover's, the turn was taken for lost and its
    end never relayed (the chaos run, seed 113 at size ``large``: the waiting turn's
    continuation went out with no pause before it, the first part with no ``finish``).
    A row another claim took since is still a loss."""
    from runtime.app.worker import LeaseKeeper, _Running
    from runtime.turn_queue import Renewal

    _store, queue = store_and_queue
    renewer = queue.open_renewer()
    try:
        waits = await queue.submit("s1", "ask")
        claim = await queue.claim("w")
        assert claim is not None and claim.turn.turn_id == waits.turn_id
        assert await queue.suspend(claim)
        key = (claim.turn.turn_id, claim.owner, claim.epoch)
        renewal = await trio.to_thread.run_sync(lambda: renewer.renew(*key))
        assert (renewal.held, renewal.let_go) == (False, True)
        ends = await queue.submit("s2", "answer")
        done = await queue.claim("w")
        assert done is not None and done.turn.turn_id == ends.turn_id
        assert await queue.finish(done, status="done", finish_reason="stop")
        renewal = await trio.to_thread.run_sync(
            lambda: renewer.renew(done.turn.turn_id, "w", done.epoch)
        )
        assert (renewal.held, renewal.let_go) == (False, True)
        # An older epoch's renewal (another claim took the turn since): lost.
        renewal = await trio.to_thread.run_sync(
            lambda: renewer.renew(done.turn.turn_id, "w", done.epoch - 1)
        )
        assert (renewal.held, renewal.let_go) == (False, False)
    finally:
        await trio.to_thread.run_sync(renewer.close)
    keeper = LeaseKeeper(queue, interval=60.0)
    entry = _Running(claim=claim)
    keeper.attach(entry)
    keeper._apply(keeper._held[claim.turn.turn_id], Renewal(held=False, let_go=True))
    assert not entry.lost and claim.turn.turn_id not in keeper._held  # no loss, not renewed
    other = _Running(claim=done)
    keeper.attach(other)
    keeper._apply(keeper._held[done.turn.turn_id], Renewal(held=False))
    assert other.lost


async def test_a_decision_between_the_suspending_commit_and_its_answer_is_no_loss(
    store_and_queue: Any,
) -> None:
    """In order: the step's save suspends the turn (its commit), a person decides, the
    lease thread's renewal runs, and only then would the commit's answer reach the
    worker. The renewal finds the row no longer waiting at the claim's epoch (decided:
    ``running`` again, no owner), then, once the continuation is claimed, at the next
    epoch: both are still the claim's own let-go, not a lost lease. Before, both were a
    refusal like a takeover's: the entry was lost before its suspension was told, so the
    pause was never relayed (the chaos run's note: a decision recorded in that window).
    A takeover of the continuation (the epoch after it, no resumed claim) is a loss."""
    from runtime.app.worker import LeaseKeeper, _Running
    from runtime.approval import WAITING_META, Decision
    from runtime.messages import Awaiting

    store, queue = store_and_queue
    renewer = queue.open_renewer()
    try:
        turn = await queue.submit("s", "delete /x")
        claim = await queue.claim("w1")
        assert claim is not None and claim.turn.turn_id == turn.turn_id
        asked = ToolCallPart(
            tool_call_id="c1",
            tool_name="delete_file",
            input={"path": "/x"},
            step=0,
            awaiting=Awaiting(kind="approval", id="ap1", turn_id=turn.turn_id),
        )
        step = [
            UserMessage(content="delete /x"),
            AssistantMessage(id=turn.message_id, content=(asked,)),
        ]
        suspended: list[bool] = []
        with queue.fenced(claim, on_suspended=lambda: suspended.append(True)):
            await store.save("s", 0, step, {WAITING_META: 1})  # the suspending commit
        decided = await queue.decide("s", "ap1", Decision(approved=True), {})
        assert decided.recorded.complete and decided.turn.status == "running"
        key = (claim.turn.turn_id, claim.owner, claim.epoch)
        first = await trio.to_thread.run_sync(lambda: renewer.renew(*key))
        assert (first.held, first.let_go) == (False, True)
        resumed = await queue.claim("w2")  # the continuation, claimed
        assert resumed is not None and resumed.resumed and resumed.epoch == claim.epoch + 1
        renewal = await trio.to_thread.run_sync(lambda: renewer.renew(*key))
        assert (renewal.held, renewal.let_go) == (False, True)
        # The continuation's claim given up, and taken over: its renewal is a loss.
        assert await queue.release(resumed)
        taken = await queue.claim("w3")
        assert taken is not None and taken.takeover and taken.epoch == resumed.epoch + 1
        late = (resumed.turn.turn_id, resumed.owner, resumed.epoch)
        renewal = await trio.to_thread.run_sync(lambda: renewer.renew(*late))
        assert (renewal.held, renewal.let_go) == (False, False)
    finally:
        await trio.to_thread.run_sync(renewer.close)
    keeper = LeaseKeeper(queue, interval=60.0)
    entry = _Running(claim=claim)
    keeper.attach(entry)
    keeper._apply(keeper._held[claim.turn.turn_id], first)  # before the commit's answer
    assert not entry.lost  # so the answer's suspension is told, and the pause relayed


async def test_a_1mb_denial_reason_through_the_queue_is_stored_cut_to_the_limit(
    pg_url: str, redis_url: str
) -> None:
    """The front end records the decision with the agent's ``max_tool_result_chars``: the
    whole reason stayed in the session's rows before, though the model read only that."""
    from runtime import Budget
    from runtime.events import ToolApprovalDecided
    from runtime.results import truncate_output

    agent = Agent(
        name="asks",
        provider=ScriptedProvider(responder=respond, chunk_size=4),
        tools=[delete_file],
        budget=Budget(max_tool_result_chars=50),
    )
    reason = "n" * 1_000_000
    async with deployment(pg_url, redis_url, agent) as d:
        (url,) = d.urls
        first = await first_part(d, url)
        message_id = payloads(first)[0]["messageId"]
        sent = answer("s1", message_id, asked(first)["approvalId"], False, reason=reason)
        decided = d.hosts[0].bus.subscribe([ToolApprovalDecided], name="t")
        async with httpx.AsyncClient(timeout=LIMIT) as client:
            response = await client.post(f"{url}/api/chat", json=sent)
        record = await d.store.load("s1")
        event = decided.inbox.get_nowait()
    # The bus event (an event log's, a structured log's) carries the reason as stored.
    assert event.reason == truncate_output(reason, 50)
    second = payloads(sse_events(response.text))
    text = "".join(c["delta"] for c in second if c["type"] == "text-delta")
    denial = truncate_output(f"the tool call was denied: {reason}", 50)
    assert text.startswith(f"Result: {denial}. ")
    assert record is not None
    call = next(
        p
        for m in record.messages
        if isinstance(m, AssistantMessage)
        for p in m.content
        if isinstance(p, ToolCallPart)
    )
    assert call.awaiting is not None and call.awaiting.reason == truncate_output(reason, 50)
