"""What a person's decision reads in the worker deployment (issue 21), counted.

A decision (:meth:`TurnQueue.decide <actors.stores.turns.TurnQueue.decide>`) looks at
the calls the session's last turn waits for and saves from that turn's assistant message
on. It read the whole session for it, in a thread: every message of a long session
decoded for one decision. It reads the last turn, from the event loop, and keeps every
refusal what it was (an unknown or another session's id 404, a decided one 409, nothing
written) by reading the whole session only for a key the last turn does not wait for.
Counts, not timings: messages decoded, thread hops, statements.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import trio

import actors.stores.postgres as postgres_module
from actors.stores.postgres import PostgresStore
from actors.stores.postgres_lane import LoopLane
from actors.stores.turns import TurnQueue
from runtime.app.web.frontend import FrontEnd
from runtime.app.web.http import ApiError
from runtime.approval import WAITING_META, Decision
from runtime.errors import AlreadyDecided, UnknownApproval
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    Message,
    TextPart,
    ToolCallPart,
    ToolMessage,
    UserMessage,
)
from runtime.turn_queue import Claim

EARLIER = 100
"""Earlier turns of the session (a user message and an answer each) before the one that
waits."""


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter[str]]:
    """Messages decoded by the PostgreSQL store, thread hops, and statements sent from the
    event loop (:class:`LoopLane`), from here on."""
    counts: collections.Counter[str] = collections.Counter()
    decode = postgres_module.decode_message

    def decoded(*args: Any, **kwargs: Any) -> Any:
        counts["decoded"] += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(postgres_module, "decode_message", decoded)
    run_sync = trio.to_thread.run_sync

    async def hop(*args: Any, **kwargs: Any) -> Any:
        counts["thread hops"] += 1
        return await run_sync(*args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", hop)
    call = LoopLane.call

    async def sent(self: Any, name: bytes, sql: bytes, *args: Any) -> Any:
        counts["loop statements"] += 1
        return await call(self, name, sql, *args)

    monkeypatch.setattr(LoopLane, "call", sent)
    yield counts


def _earlier_turns() -> list[Message]:
    """``EARLIER`` turns, the first of which asked for an approval (``old``), decided and
    answered then."""
    asked = ToolCallPart(
        tool_call_id="c0",
        tool_name="delete",
        input={},
        step=0,
        awaiting=Awaiting(kind="approval", id="old", turn_id="t0", decided=True, approved=True),
    )
    out: list[Message] = [
        UserMessage(content="first"),
        AssistantMessage(content=(asked,)),
        ToolMessage(tool_call_id="c0", tool_name="delete", step=0, output="gone"),
    ]
    for i in range(1, EARLIER):
        out.append(UserMessage(content=f"q{i}"))
        out.append(AssistantMessage(content=(TextPart(text=f"a{i}", step=0),)))
    return out


async def _waiting_after_history(store: PostgresStore, queue: TurnQueue, calls: int = 1) -> Claim:
    """Session ``s`` with its earlier turns stored, then a turn whose step waits for
    approvals ``ap1``.. (``calls`` of them; suspended by that step's save); its claim."""
    history = _earlier_turns()
    version = await store.save("s", 0, history)
    turn = await queue.submit("s", "now")
    claim = await queue.claim("w1")
    assert claim is not None and claim.turn.turn_id == turn.turn_id
    asked = tuple(
        ToolCallPart(
            tool_call_id=f"c{n}",
            tool_name="delete",
            input={},
            step=0,
            awaiting=Awaiting(kind="approval", id=f"ap{n}", turn_id=turn.turn_id),
        )
        for n in range(1, calls + 1)
    )
    step = [UserMessage(content="now"), AssistantMessage(id=claim.turn.message_id, content=asked)]
    with queue.fenced(claim, on_suspended=lambda: None):
        await store.save("s", len(history), step, {WAITING_META: calls}, expected_version=version)
    return claim


async def test_a_decision_decodes_its_sessions_last_turn_only_on_the_loop(store_and_queue, counted):
    """Two statements from the event loop (the last turn's read, the decision's
    function), the one message of the last turn decoded, no thread: a decision on a
    session of 201 earlier messages decoded all 203 of them, in a thread's read."""
    store, queue = store_and_queue
    await _waiting_after_history(store, queue)
    before = await store.load("s")
    assert before is not None
    await store.save("warm", 0, [UserMessage(content="a")])  # the loop's connection opened
    counted.clear()
    decided = await queue.decide("s", "ap1", Decision(approved=True), {})
    assert dict(counted) == {"loop statements": 2, "decoded": 1}, counted
    assert decided.recorded.complete and decided.turn.status == "running"
    assert decided.recorded.messages is None  # no whole history was read
    after = await store.load("s")
    assert after is not None and after.version == decided.recorded.version
    assert after.messages[:-1] == before.messages[:-1]  # the earlier turns untouched
    call = after.messages[-1].content[0]
    assert isinstance(call, ToolCallPart) and call.awaiting is not None
    assert (call.awaiting.decided, call.awaiting.approved) == (True, True)
    claim = await queue.claim("w2")  # the continuation reads what the decision stored
    assert claim is not None and claim.resumed and claim.stored == after


async def test_a_decisions_refusals_on_a_long_session_are_what_they_were(store_and_queue):
    """A key the last turn does not wait for is looked up in the whole history before it
    is refused: an earlier turn's call (decided then) is 409, a key no call of the
    session ever waited for and another session's are 404, a call of the last turn
    decided already is 409; none of them writes anything."""
    store, queue = store_and_queue
    await _waiting_after_history(store, queue)
    stored = await store.load("s")
    with pytest.raises(AlreadyDecided):
        await queue.decide("s", "old", Decision(approved=False), {})
    with pytest.raises(UnknownApproval):
        await queue.decide("s", "nobody", Decision(approved=False), {})
    with pytest.raises(UnknownApproval):
        await queue.decide("other", "ap1", Decision(approved=False), {})
    assert await store.load("s") == stored  # nothing written
    await queue.decide("s", "ap1", Decision(approved=False, reason="no"), {})
    decided = await store.load("s")
    with pytest.raises(AlreadyDecided):
        await queue.decide("s", "ap1", Decision(approved=True), {})
    assert await store.load("s") == decided


async def test_a_decision_after_the_session_moved_decides_on_what_it_holds(
    store_and_queue, monkeypatch
):
    """A later message superseded the waiting turn between the decision's read of the
    last turn and its save: the version check refuses the save, the next attempt reads
    the last turn again, which waits for nothing, and the decision is refused (409)."""
    store, queue = store_and_queue
    claim = await _waiting_after_history(store, queue)
    read = TurnQueue._last_turn
    moved: list[bool] = []

    async def then_superseded(self: Any, session_id: str) -> Any:
        got = await read(self, session_id)
        if not moved:
            moved.append(True)
            await queue.submit("s", "instead")
            later = await queue.claim("w2")  # supersedes the wait
            assert later is not None and later.turn.input == "instead"
            with queue.fenced(later):
                await store.save("s", got[0] + 1, [UserMessage(content="instead")])
        return got

    monkeypatch.setattr(TurnQueue, "_last_turn", then_superseded)
    with pytest.raises(AlreadyDecided):
        await queue.decide("s", "ap1", Decision(approved=True), {})
    row = await queue.get_status(claim.turn.turn_id)
    assert row is not None and (row.status, row.finish_reason) == ("done", "superseded")


async def test_a_decision_on_the_callers_fresh_read_is_the_functions_one_call(
    store_and_queue, counted
):
    """A front end checked a body's answers on the session it read a moment ago: the
    decision decides on that read (``known``) and is one statement, the function's,
    whose version check proves the read current; it reads and decodes nothing more."""
    store, queue = store_and_queue
    await _waiting_after_history(store, queue)
    seen = await store.load("s")
    await store.save("warm", 0, [UserMessage(content="a")])  # the loop's connection opened
    counted.clear()
    decided = await queue.decide("s", "ap1", Decision(approved=True), {}, known=seen)
    assert dict(counted) == {"loop statements": 1}, counted
    assert decided.recorded.complete and decided.turn.status == "running"
    after = await store.load("s")
    assert after is not None and after.version == decided.recorded.version
    assert decided.recorded.messages == after.messages


async def test_a_stale_or_refusing_view_is_not_believed(store_and_queue, counted):
    """A view behind the store is not decided on: its save's version check refuses it
    (nothing written), the last turn is read and the decision made on it; a view that
    refuses the key (it has not got the call yet) makes the store decide: the call
    waits there, so it is recorded; a decider whose view that decision made stale is
    refused (409), nothing written."""
    store, queue = store_and_queue
    await _waiting_after_history(store, queue)
    seen = await store.load("s")
    assert seen is not None
    # a view without the waiting turn (as read before it suspended): the call unknown
    before = attrs.evolve(seen, messages=seen.messages[:-2])
    counted.clear()
    decided = await queue.decide("s", "ap1", Decision(approved=True), {}, known=before)
    assert decided.recorded.complete
    assert counted["loop statements"] == 2, counted  # the view refused: the store read
    with pytest.raises(AlreadyDecided):  # the same fresh-looking view, now stale
        await queue.decide("s", "ap1", Decision(approved=False), {}, known=seen)
    stored = await store.load("s")
    assert stored is not None and stored.version == decided.recorded.version
    call = stored.messages[-1].content[0]
    assert isinstance(call, ToolCallPart) and call.awaiting is not None
    assert call.awaiting.approved is True


async def test_a_front_ends_approve_post_reads_the_last_turn_not_the_session(
    store_and_queue, counted
):
    """The continuation POST of a worker deployment's front end checks the body's answers
    on the session's last turn, and the decision reads that turn again: three statements
    from the event loop (the two reads, the decision's function), the last turn's
    messages decoded, no load, no thread. It loaded the whole session (203 messages
    decoded, in a thread) to check the answers on."""
    store, queue = store_and_queue
    claim = await _waiting_after_history(store, queue, calls=2)
    published: list[Any] = []

    async def publish(event: Any) -> None:
        published.append(event)

    state = SimpleNamespace(
        agent_for=lambda session_id: SimpleNamespace(
            tools=(), budget=SimpleNamespace(max_tool_result_chars=None)
        ),
        host=SimpleNamespace(bus=SimpleNamespace(publish=publish)),
        signer=None,  # no --approval-secret: nothing signed or checked
    )
    request: Any = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(axon=state)))
    part = {
        "type": "tool-delete",
        "toolCallId": "c1",
        "state": "approval-responded",
        "input": {},
        "approval": {"id": "ap1", "approved": True},
    }
    payload = {
        "id": "s",
        "messages": [
            {"id": "u", "role": "user", "parts": [{"type": "text", "text": "now"}]},
            {"id": claim.turn.message_id, "role": "assistant", "parts": [part]},
        ],
        "messageId": claim.turn.message_id,
    }
    front = FrontEnd(store=store, queue=queue, relay=None)
    await store.save("warm", 0, [UserMessage(content="a")])  # the loop's connection opened
    loads = 0
    load = store.load

    async def counted_load(session_id: str) -> Any:
        nonlocal loads
        loads += 1
        return await load(session_id)

    store.load = counted_load  # type: ignore[method-assign]
    counted.clear()
    response = await front._continue(request, "s", payload)
    assert response.status_code == 202  # ap2 still waits
    assert (loads, counted["loop statements"], counted["thread hops"]) == (0, 3, 0), counted
    assert counted["decoded"] == 2, counted  # the waiting turn's message, read twice
    assert [e.causation_id for e in published] == ["ap1"]
    stored = await store.load("s")
    assert stored is not None and stored.meta[WAITING_META] == 1


async def test_a_front_ends_approve_post_of_an_earlier_turns_call_is_refused_as_it_was(
    store_and_queue,
):
    """Checked on the last turn, an answer to a call an earlier turn decided is refused
    there; the whole session read then tells it decided (409), as the whole read did,
    not unknown (404); nothing written."""
    store, queue = store_and_queue
    claim = await _waiting_after_history(store, queue)
    state = SimpleNamespace(
        agent_for=lambda session_id: SimpleNamespace(
            tools=(), budget=SimpleNamespace(max_tool_result_chars=None)
        ),
        host=SimpleNamespace(bus=SimpleNamespace(publish=None)),
        signer=None,  # no --approval-secret: nothing signed or checked
    )
    request: Any = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(axon=state)))
    part = {
        "type": "tool-delete",
        "toolCallId": "c0",
        "state": "approval-responded",
        "input": {},
        "approval": {"id": "old", "approved": False},
    }
    payload = {
        "id": "s",
        "messages": [
            {"id": "u", "role": "user", "parts": [{"type": "text", "text": "now"}]},
            {"id": claim.turn.message_id, "role": "assistant", "parts": [part]},
        ],
    }
    front = FrontEnd(store=store, queue=queue, relay=None)
    before = await store.load("s")
    with pytest.raises(ApiError) as refused:
        await front._continue(request, "s", payload)
    assert refused.value.status == 409, refused.value
    assert await store.load("s") == before
