"""A takeover between a sub-turn's waiting save and its caller's (real PostgreSQL, two
workers in this process).

A worker's turn calls a sub-agent (``as_tool(pass_approvals=True)``) whose tool needs
an approval: the sub-turn suspends, its sub-session is saved waiting for its caller's
decision, then the calling turn suspends and its own waiting save follows. Worker ``a``
loses the turn between the two (it hangs in the caller's save: a dead process's lease
lapses the same way); ``b`` takes the turn over from what is stored: the caller's step
with its agent-tool call and nothing of the wait, and a sub-session that waits already.
What the person sees: one approval request (the one the sub-turn asked for), decided
once; the guarded tool runs once; ``a`` saves nothing more.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import httpx
import pytest
import trio

from actors.relays import RedisRelay
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.app.worker import Worker
from runtime.approval import Decision, pending_calls
from runtime.errors import LeaseLost, SessionDeleted
from runtime.messages import AssistantMessage, Message, ToolCallPart, ToolMessage, UserMessage
from runtime.tools import sub_session_id
from tests.support.redis import require_redis
from tests.test_approval_nested_pass import _clear, ran  # noqa: F401 (fixture)
from tests.test_frontend import deployment
from tests.test_relay_web import sse_events
from tests.test_worker_approval import chat, payloads, waiting_turn
from tests.test_worker_approval_nested_pass import _answer, _on_h, calling
from tests.test_worker_sub_turn_fence import LIMIT, Held, passing, until_idle
from tests.test_workers import sql

SUB = sub_session_id("s", "helper", "call_h")


def _waits(messages: Sequence[Message]) -> bool:
    return any(
        isinstance(p, ToolCallPart) and p.awaiting is not None
        for m in messages
        if isinstance(m, AssistantMessage)
        for p in m.content
    )


class Hanging(PostgresStore):
    """Worker ``a``'s store: the calling session's waiting save hangs (until ``go``),
    once the sub-session's waiting save is in."""

    caller: str
    sub: str
    sub_waits: trio.Event
    hung: trio.Event
    go: trio.Event
    refused: list[BaseException]

    async def save(
        self,
        session_id: str,
        start: int,
        messages: Sequence[Message],
        meta: Mapping[str, Any] | None = None,
        *,
        expected_version: int | None = None,
        kept: Collection[int] = (),
        **options: Any,
    ) -> int:
        if session_id == self.caller and self.sub_waits.is_set() and _waits(messages):
            self.hung.set()
            await self.go.wait()
            try:
                return await super().save(
                    session_id,
                    start,
                    messages,
                    meta,
                    expected_version=expected_version,
                    kept=kept,
                    **options,
                )
            except BaseException as err:
                self.refused.append(err)
                raise
        version = await super().save(
            session_id,
            start,
            messages,
            meta,
            expected_version=expected_version,
            kept=kept,
            **options,
        )
        if session_id == self.sub and _waits(messages):
            self.sub_waits.set()
        return version


async def hanging(pg_url: str, caller: str, sub: str) -> Hanging:
    store = await Hanging.open(pg_url)
    store.caller, store.sub = caller, sub
    store.sub_waits, store.hung, store.go, store.refused = (
        trio.Event(),
        trio.Event(),
        trio.Event(),
        [],
    )
    return store


def claiming_once(worker: Worker) -> None:
    """``worker`` claims one turn, then nothing more (it does not take its own lost turn
    back)."""
    real_claim = worker._claim
    claimed: list[Any] = []

    async def claim_once(leases: Any) -> Any:
        if claimed:
            await trio.sleep_forever()
        got = await real_claim(leases)
        if got is not None:
            claimed.append(got)
        return got

    worker._claim = claim_once  # type: ignore[method-assign]


async def take_over(pg_url: str, turn_id: str) -> None:
    """``a``'s lease lapses (a paused or dead process) and another claim took the turn."""
    await trio.to_thread.run_sync(
        sql,
        pg_url,
        "UPDATE axon_turns SET owner = 'gone', epoch = epoch + 1, "
        "lease_until = now() - interval '1 second' WHERE turn_id = %s RETURNING turn_id",
        turn_id,
    )


async def test_a_takeover_between_the_sub_turns_waiting_save_and_the_callers_asks_once(
    pg_url: str,
) -> None:
    held = Held()
    held.go.set()  # the guarded tool, once approved, runs through
    store_a = await hanging(pg_url, "s", SUB)
    store_b = await PostgresStore.open(pg_url)
    queue = TurnQueue(store_b)
    try:
        async with trio.open_nursery() as nursery:
            worker_a = Worker(store=store_a, agent=passing(held), owner="a", lease=30.0, poll=0.05)
            claiming_once(worker_a)
            await nursery.start(worker_a.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                await store_a.hung.wait()
            asked = await store_b.load(SUB)
            assert asked is not None
            (asked_call,) = pending_calls(asked.messages)
            caller_then = await store_b.load("s")
            await take_over(pg_url, turn.turn_id)
            worker_b = Worker(store=store_b, agent=passing(held), owner="b", lease=30.0, poll=0.05)
            await nursery.start(worker_b.run)
            with trio.fail_after(LIMIT):
                while (row := await queue.get(turn.turn_id)) is None or not row.waiting:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            store_a.go.set()  # a wakes: its caller's save after b's
            await until_idle(worker_a)
            caller = await store_b.load("s")
            assert caller is not None
            pending = pending_calls(caller.messages)
            agent = passing(held)
            tools = {t.name: t for t in agent.tools}
            for call in pending:
                await queue.decide("s", call.approval_id, Decision(approved=True), tools)
            done = await queue.wait_finished(turn.turn_id, LIMIT)
            worker_a.stop()
            worker_b.stop()
        final = await store_b.load("s")
        sub = await store_b.load(SUB)
    finally:
        await queue.aclose()
        await store_a.aclose()
        await store_b.aclose()
    assert caller_then is None or not _waits(caller_then.messages)  # a got no further
    assert len(pending) == 1  # one approval request ...
    assert pending[0].approval_id == asked_call.approval_id  # ... the one the sub-turn asked
    assert done is not None and done.status == "done" and done.owner == "b"
    assert held.guarded == 1  # decided once, run once
    # a's caller saves, woken after b's: refused, all of them
    assert store_a.refused and all(isinstance(e, LeaseLost) for e in store_a.refused)
    assert final is not None and sub is not None
    assert [m.content for m in final.messages if isinstance(m, UserMessage)] == ["go"]
    assert [m.tool_call_id for m in final.messages if isinstance(m, ToolMessage)] == ["call_h"]
    assert [m.role for m in sub.messages].count("user") == 1
    assert [m.tool_call_id for m in sub.messages if isinstance(m, ToolMessage)] == ["call_g"]


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def _worker(
    d: Any, store: PostgresStore, owner: str, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    async with (
        RedisRelay.open(d.redis_url, prefix=d.prefix) as relay,
        trio.open_nursery(),
    ):
        worker = Worker(
            store=store, relay=relay, agent=calling(), owner=owner, lease=30.0, poll=0.05
        )
        if owner == "a":
            claiming_once(worker)
        task_status.started(worker)
        await worker.run()


async def test_a_reader_of_a_takeover_between_the_two_waiting_saves_is_asked_once(
    pg_url: str, redis_url: str
) -> None:
    """Over HTTP, the ``useChat`` reader of the calling turn: one approval request in
    its stream (the id the sub-turn asked with), its answer resumes both turns on the
    worker that took over, and the guarded tool runs once."""
    store_a = await hanging(pg_url, "s1", "s1.helper.H")
    store_b = await PostgresStore.open(pg_url)
    try:
        async with deployment(pg_url, redis_url, calling(), worker=False) as d:
            async with trio.open_nursery() as nursery:
                worker_a = await nursery.start(_worker, d, store_a, "a")
                async with httpx.AsyncClient(timeout=LIMIT) as client:
                    got: list[Any] = []

                    async def post() -> None:
                        response = await client.post(f"{d.urls[0]}/api/chat", json=chat("s1", "go"))
                        got.append(sse_events(response.text))

                    nursery.start_soon(post)
                    with trio.fail_after(LIMIT):
                        await store_a.hung.wait()
                    (turn,) = await d.queue.turns("s1")
                    await take_over(pg_url, turn.turn_id)
                    worker_b = await nursery.start(_worker, d, store_b, "b")
                    await waiting_turn(d)
                    store_a.go.set()
                    await until_idle(worker_a)
                    with trio.fail_after(LIMIT):
                        while not got:  # noqa: ASYNC110
                            await trio.sleep(0.02)
                    first = got[0]
                    sub = await store_b.load("s1.helper.H")
                    assert sub is not None
                    (stored_ask,) = pending_calls(sub.messages)
                    message_id = payloads(first)[0]["messageId"]
                    requests = [d for d in payloads(first) if d["type"] == "tool-approval-request"]
                    response = await client.post(
                        f"{d.urls[0]}/api/chat",
                        json=_answer("s1", message_id, _on_h(requests[0]["approvalId"], True)),
                    )
                done = await d.queue.wait_finished(turn.turn_id, LIMIT)
                worker_a.stop()
                worker_b.stop()
    finally:
        await store_a.aclose()
        await store_b.aclose()
    # a's step 0 (its call and the request), if the reader was shown it, is taken back
    # (``reset-step``: nothing of it was committed) and b's run of it asks again with the
    # same id: after the reset, one request, the one the sub-turn stored (on a loaded
    # machine the reader may be shown b's run only)
    kinds = [c["type"] for c in payloads(first)]
    after = payloads(first)
    if "reset-step" in kinds:
        after = after[len(kinds) - kinds[::-1].index("reset-step") :]
    shown = [c["approvalId"] for c in after if c["type"] == "tool-approval-request"]
    assert shown == [stored_ask.approval_id], kinds
    assert {c["approvalId"] for c in requests} == {stored_ask.approval_id}
    second = payloads(sse_events(response.text))
    outputs = [
        c for c in second if c["type"] == "tool-output-available" and not c.get("preliminary")
    ]
    assert [(c["toolCallId"], c["output"]) for c in outputs] == [("H", "paid")]
    assert done is not None and done.status == "done" and done.owner == "b"
    assert ran == ["x"]
    assert store_a.refused and all(isinstance(e, LeaseLost) for e in store_a.refused)


async def test_a_caller_deleted_between_the_two_waiting_saves_leaves_no_waiting_sub_session(
    pg_url: str,
) -> None:
    """The calling session is deleted (the front end's order: its sub-sessions' waits
    ended, then the delete) while ``a`` hangs between the sub-session's waiting save and
    the caller's. The caller stores no wait yet, so ending its sub-sessions' waits finds
    none: before, the sub-session stayed waiting for good for a caller that is gone
    (refusing every decision and message, ``CallerWaits``). The caller's delete takes
    it with it; ``a``'s late save is refused."""
    from runtime.app.nested import end_sub_waits

    held = Held()
    store_a = await hanging(pg_url, "s", SUB)
    store_b = await PostgresStore.open(pg_url)
    queue = TurnQueue(store_b)
    try:
        async with trio.open_nursery() as nursery:
            worker_a = Worker(store=store_a, agent=passing(held), owner="a", lease=30.0, poll=0.05)
            claiming_once(worker_a)
            await nursery.start(worker_a.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                await store_a.hung.wait()
            waiting = await store_b.load(SUB)
            ended = await end_sub_waits(store_b, "s")
            await store_b.delete("s")
            store_a.go.set()
            await until_idle(worker_a)
            worker_a.stop()
        sub = await store_b.load(SUB)
        row = await queue.get(turn.turn_id)
    finally:
        await queue.aclose()
        await store_a.aclose()
        await store_b.aclose()
    assert waiting is not None and pending_calls(waiting.messages)
    assert ended == []  # the caller stored no wait to end
    assert held.guarded == 0
    assert row is not None and row.status == "cancelled"
    assert sub is None, sub.messages
    assert late_saves_refused(store_a)


def late_saves_refused(store: Hanging) -> bool:
    """``a``'s caller saves after the delete were refused (or never made)."""
    return all(isinstance(e, LeaseLost | SessionDeleted) for e in store.refused)
