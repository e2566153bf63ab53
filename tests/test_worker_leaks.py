"""What a long-lived worker keeps of each way a turn ends: one worker (in process, the
test run's own PostgreSQL and Redis) runs one ending many times, a new session each time,
and what it holds is counted. The objects of the runtime's own classes, the turns it
runs, the leases it renews, its host's sessions (at most ``max_sessions``), the relay's
open writers and the Trio tasks are the same after the 18th run as after the 6th
(benchmarks/journal/workers.md, "leakworker": the probe that ran each ending 100 times
through a front end, and a ``runtime worker`` process 3,100 times).
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.relays import RedisRelay
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime import Agent, tool
from runtime.actor_messages import InferRequest
from runtime.app.worker import LeaseKeeper, Worker, _Running
from runtime.approval import Decision
from runtime.errors import ProviderError, RelayTurnGone
from runtime.messages import AssistantMessage, ToolCallPart, UserMessage
from runtime.output import TextDelta
from runtime.turn_queue import ClientToolSpec, Renewal, TurnOptions
from tests.support.leaks import runtime_objects, tasks
from tests.support.redis import require_redis, unique_prefix

LIMIT = 30


@pytest.fixture
def redis_url() -> str:
    return require_redis()


async def broken(city: str) -> str:
    """A tool that raises."""
    raise RuntimeError("tool broke")


@tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file."""
    return f"deleted {path}"


GATE: dict[str, trio.Event] = {}


async def gate(n: int) -> str:
    """Wait until the test opens the gate."""
    GATE["entered"].set()
    await GATE["open"].wait()
    return "open"


PICK = ClientToolSpec(name="pick", schema={"type": "object"}, description="Pick a colour.")


def respond(request: InferRequest) -> list[Any]:
    text = [m for m in request.messages if isinstance(m, UserMessage)][-1].content
    first = current_step(request.messages) == 0
    if text == "fail":
        return ["half ", ProviderError("down", retryable=False)]
    if text == "broken" and first:
        return tool_call("broken", {"city": "Paris"})
    if text == "delete" and first:
        return ["I will. ", *tool_call("delete_file", {"path": "/x"})]
    if text == "gate" and first:
        return tool_call("gate", {"n": 1})
    if text == "pick" and first:
        return tool_call("pick", {})
    if text == "slow":
        return ["w " * 2000]
    return ["ok"]


AGENT = Agent(
    name="a",
    provider=ScriptedProvider(responder=respond, chunk_size=4, delay=0.002, keep_requests=0),
    tools=[broken, delete_file, gate],
)
EXPIRING = Agent(
    name="a",
    provider=ScriptedProvider(responder=respond, chunk_size=4, delay=0.002, keep_requests=0),
    tools=[delete_file],
    approval_timeout=0.1,
)
"""Its approvals expire (the worker records them denied ``timed out``, every ``poll``)."""

Run = Callable[[Worker, TurnQueue, RedisRelay, str], Awaitable[None]]


def finished(status: str, text: str) -> Run:
    async def run(worker: Worker, queue: TurnQueue, relay: RedisRelay, session_id: str) -> None:
        turn = await queue.submit(session_id, text)
        done = await queue.wait_finished(turn.turn_id, LIMIT)
        assert done is not None and done.status == status

    return run


async def streamed_text(relay: RedisRelay, turn_id: str) -> None:
    """Once the turn has streamed a text delta (its relay stream may not be open yet)."""
    while True:
        try:
            async with aclosing(relay.read(turn_id)) as chunks:
                async for chunk in chunks:
                    if isinstance(chunk, TextDelta):
                        return
        except RelayTurnGone:
            await trio.sleep(0.01)


async def cancelled(worker: Worker, queue: TurnQueue, relay: RedisRelay, session_id: str) -> None:
    turn = await queue.submit(session_id, "slow")
    while turn.turn_id not in worker.running:  # noqa: ASYNC110 - the worker claims it
        await trio.sleep(0.01)
    # Stopped once it streams text, so that every run saves the same parts (a stop before
    # the first delta saved no text part: one session kept one object fewer).
    await streamed_text(relay, turn.turn_id)
    await queue.request_cancel(turn.turn_id, "stop")  # (as a front end's stop does)
    await relay.request_cancel(turn.turn_id, "stop")
    done = await queue.wait_finished(turn.turn_id, LIMIT)
    assert done is not None and done.status == "cancelled"


async def deleted(worker: Worker, queue: TurnQueue, relay: RedisRelay, session_id: str) -> None:
    turn = await queue.submit(session_id, "slow")
    while turn.turn_id not in worker.running:  # noqa: ASYNC110 - the worker claims it
        await trio.sleep(0.01)
    await queue.store.delete(session_id)
    done = await queue.wait_finished(turn.turn_id, LIMIT)
    assert done is not None and done.status == "cancelled"


def decided(approved: bool) -> Run:
    async def run(worker: Worker, queue: TurnQueue, relay: RedisRelay, session_id: str) -> None:
        turn = await queue.submit(session_id, "delete")
        while not (await queue.get(turn.turn_id)).waiting:  # type: ignore[union-attr]  # noqa: ASYNC110
            await trio.sleep(0.01)
        record = await queue.store.load(session_id)
        assert record is not None
        asking = record.messages[-1]
        assert isinstance(asking, AssistantMessage)
        call = next(p for p in asking.content if isinstance(p, ToolCallPart))
        assert call.awaiting is not None
        await queue.decide(session_id, call.awaiting.id, Decision(approved=approved), {})
        done = await queue.wait_finished(turn.turn_id, LIMIT)
        assert done is not None and done.status == "done"

    return run


async def waiting_call(queue: TurnQueue, turn_id: str, session_id: str) -> str:
    """The id the turn's waiting call is decided by, once the turn waits."""
    while not (await queue.get(turn_id)).waiting:  # type: ignore[union-attr]  # noqa: ASYNC110
        await trio.sleep(0.01)
    record = await queue.store.load(session_id)
    assert record is not None
    asking = record.messages[-1]
    assert isinstance(asking, AssistantMessage)
    call = next(p for p in asking.content if isinstance(p, ToolCallPart))
    assert call.awaiting is not None
    return call.awaiting.id


async def client_tool(worker: Worker, queue: TurnQueue, relay: RedisRelay, session_id: str) -> None:
    # The model calls a tool of the client's: the turn waits for its output, which the
    # client's answer brings (as a front end records it), and goes on.
    turn = await queue.submit(session_id, "pick", options=TurnOptions(tools=(PICK,)))
    key = await waiting_call(queue, turn.turn_id, session_id)
    decision = Decision(output={"colour": "red"}, has_output=True)
    await queue.decide(session_id, key, decision, {"pick": PICK.tool()})
    done = await queue.wait_finished(turn.turn_id, LIMIT)
    assert done is not None and done.status == "done"


async def expired(worker: Worker, queue: TurnQueue, relay: RedisRelay, session_id: str) -> None:
    # Nobody decides: the worker's expiry records the call denied "timed out" (EXPIRING's
    # approval_timeout), and a claim resumes the turn.
    turn = await queue.submit(session_id, "delete")
    done = await queue.wait_finished(turn.turn_id, LIMIT)
    assert done is not None and done.status == "done"
    record = await queue.store.load(session_id)
    assert record is not None and "timed out" in repr(record.messages)


async def taken_over(worker: Worker, queue: TurnQueue, relay: RedisRelay, session_id: str) -> None:
    # Another worker claimed the turn and died (no renewal): once its lease expired, the
    # worker takes it over. The worker (concurrency 1) has its one slot busy in a tool
    # meanwhile, so that it cannot claim the turn first.
    GATE["entered"], GATE["open"] = trio.Event(), trio.Event()
    busy = await queue.submit(f"{session_id}-busy", "gate")
    await GATE["entered"].wait()
    turn = await queue.submit(session_id, "hi")
    dead = TurnQueue(queue.store, lease=0.05)
    try:
        claim = await dead.claim("dead")
    finally:
        await dead.aclose()
    assert claim is not None and claim.turn.turn_id == turn.turn_id
    GATE["open"].set()
    for turn_id in (busy.turn_id, turn.turn_id):
        done = await queue.wait_finished(turn_id, LIMIT)
        assert done is not None and done.status == "done"
    assert done.epoch == 2  # the dead claim, then the worker's takeover


ENDINGS: dict[str, Run] = {
    "success": finished("done", "hi"),
    "provider error": finished("failed", "fail"),
    "tool raises": finished("done", "broken"),
    "cancelled while running": cancelled,
    "session deleted while running": deleted,
    "approved": decided(True),
    "denied": decided(False),
    "taken over": taken_over,
    "client tool answered": client_tool,
    "approval expired": expired,
}
OPTIONS: dict[str, dict[str, Any]] = {
    "taken over": {"concurrency": 1},
    "approval expired": {"agent": EXPIRING},
}
"""The worker's options for an ending, beside the room's."""


async def held(worker: Worker, relay: RedisRelay) -> dict[str, Any]:
    while worker.running:  # noqa: ASYNC110 - its row is finished before the worker lets it go
        await trio.sleep(0.01)
    # The last turn's objects go as its tasks wind down (a cancelled turn's last batch,
    # the relay's tick): counted once two looks 50 ms apart agree, so a loaded machine's
    # slower wind-down is not read as a leak (one batch and its chunk, seen under load).
    objects = runtime_objects()
    for _ in range(100):
        await trio.sleep(0.05)
        objects, last = runtime_objects(), objects
        if objects == last:
            break
    assert worker.host is not None and worker._leases is not None
    return {
        "objects": objects,
        "leases": len(worker._leases._held),
        "sessions": len(worker.host.sessions),
        "writers": len(relay.live),
        "tasks": tasks(),
    }


@pytest.mark.parametrize("ending", list(ENDINGS))
async def test_a_turn_ending_so_leaves_nothing_behind_in_the_worker(
    ending: str, pg_url: str, redis_url: str
) -> None:
    run = ENDINGS[ending]
    worker_store = await PostgresStore.open(pg_url)
    front = await PostgresStore.open(pg_url)
    queue = TurnQueue(front)
    try:
        async with (
            RedisRelay.open(redis_url, prefix=unique_prefix()) as relay,
            trio.open_nursery() as nursery,
        ):
            options: dict[str, Any] = {"agent": AGENT, **OPTIONS.get(ending, {})}
            worker = Worker(store=worker_store, relay=relay, poll=0.05, max_sessions=3, **options)
            await nursery.start(worker.run)
            with trio.fail_after(120):
                for i in range(6):
                    await run(worker, queue, relay, f"s{i}")
                before = await held(worker, relay)
                for i in range(6, 18):
                    await run(worker, queue, relay, f"s{i}")
                after = await held(worker, relay)
                for _ in range(20):
                    # A turn's wind-down on a loaded machine can outlast held's looks (a
                    # deleted session's relay writer closing): a leak stays, it does not.
                    if after == before:
                        break
                    await trio.sleep(0.1)
                    after = await held(worker, relay)
            worker.stop()
    finally:
        with trio.CancelScope(shield=True):
            await queue.aclose()
            await front.aclose()
            await worker_store.aclose()
    grown = after.pop("objects") - before.pop("objects")
    assert dict(grown) == {}
    assert after == before


class _Renewer:
    """Renews every lease; says when it renewed one."""

    def __init__(self) -> None:
        self.renewed = threading.Event()

    def renew(self, turn_id: str, owner: str, epoch: int) -> Renewal:
        self.renewed.set()
        return Renewal(held=True)

    def close(self) -> None:
        pass


class _Queue:
    def __init__(self) -> None:
        self.renewer = _Renewer()

    def open_renewer(self) -> _Renewer:
        return self.renewer


class _Turn:
    turn_id = "t"


class _Claim:
    turn = _Turn()
    owner = "w"
    epoch = 1


async def test_the_lease_keeper_keeps_no_turn_it_no_longer_renews() -> None:
    queue = _Queue()
    keeper = LeaseKeeper(queue, interval=0.01)  # type: ignore[arg-type]
    entry = _Running(claim=_Claim())  # type: ignore[arg-type]
    keeper.attach(entry)
    keeper.start()
    try:
        await trio.to_thread.run_sync(queue.renewer.renewed.wait)
        keeper.release("t", 1)  # the turn ended
        gone = weakref.ref(entry)
        del entry
        await trio.sleep(0.05)  # (rounds of the idle keeper)
        gc.collect()
        assert gone() is None
    finally:
        await keeper.aclose()
