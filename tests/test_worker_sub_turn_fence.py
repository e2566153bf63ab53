"""A worker's sub-turn (an agent tool's, ``Agent.as_tool``) saves under its calling
turn's claim (real PostgreSQL, one worker in this process).

The path ``closedroute`` left: worker ``a`` runs a turn whose agent tool's sub-turn is
inside its own tool when the claim goes to another worker (``b``), which runs the turn
and its sub-turn again and saves the sub-session. ``a``'s lease watch cancels the calling
turn (``_Running.lose``, a refused renewal): the sub-turn ends aborted, and its final
save, based on what ``a`` read before, met ``b``'s version. The sub-session is not the
claimed session, so no fence checked it: the persister took ``b``'s save for another
writer's and rebased ``a``'s aborted sub-turn after it (two user messages in the
sub-session). The sub-turn's own confirm (``runtime.agent._confirming``) never ran: its
tool had passed it. Now every save of a sub-session a fenced turn's agent tool opens
is fenced by that turn's claim (``PostgresStore.fenced_under``): refused once it is lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.actor_messages import InferRequest
from runtime.agent import Agent, sub_session_id
from runtime.app.worker import Worker
from runtime.approval import Decision, pending_calls
from runtime.messages import AssistantMessage, UserMessage
from runtime.tools import ToolContext, tool
from tests.test_workers import sql

LIMIT = 60.0
TAKEOVER = UserMessage(content="the takeover's sub-turn", id="m-b")


@attrs.define
class Held:
    """The sub-agent's tool holds here until the test lets it go."""

    inside: trio.Event = attrs.Factory(trio.Event)
    go: trio.Event = attrs.Factory(trio.Event)
    runs: int = 0
    guarded: int = 0
    linger: trio.Event | None = None


def agents(held: Held, *, deeper: bool = False) -> Agent:
    """``boss`` calls ``helper`` (an agent tool); ``helper``'s step 0 calls ``hold``
    (with ``deeper``: ``helper`` calls ``inner``, whose step 0 calls ``hold``)."""

    @tool
    async def hold(ctx: ToolContext) -> str:
        """Hold."""
        held.runs += 1
        held.inside.set()
        await held.go.wait()
        return "held"

    def leaf(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return tool_call("hold", {}, tool_call_id="call_x")
        return ["leaf done"]

    inner = Agent(name="inner", provider=ScriptedProvider(responder=leaf), tools=[hold])

    def middle(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return tool_call("inner", {"input": "go on"}, tool_call_id="call_i")
        return ["middle done"]

    helper = (
        Agent(name="helper", provider=ScriptedProvider(responder=middle), tools=[inner.as_tool()])
        if deeper
        else attrs.evolve(inner, name="helper")
    )

    def top(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return tool_call("helper", {"input": "help"}, tool_call_id="call_h")
        return ["boss done"]

    return Agent(name="boss", provider=ScriptedProvider(responder=top), tools=[helper.as_tool()])


async def taken_over(pg_url: str, store_b: PostgresStore, turn_id: str, sub: str) -> None:
    """What ``b``'s takeover did while ``a`` was paused: the claim (epoch up, another
    owner) and its save of the sub-session."""
    await trio.to_thread.run_sync(
        sql,
        pg_url,
        "UPDATE axon_turns SET owner = 'b', epoch = epoch + 1 WHERE turn_id = %s RETURNING turn_id",
        turn_id,
    )
    record = await store_b.load(sub)
    held = () if record is None else record.messages
    await store_b.save(
        sub, len(held), (TAKEOVER,), expected_version=0 if record is None else record.version
    )


def sub_ids(deeper: bool) -> list[str]:
    """The sub-sessions the calling turn's agent tool opens: its own, and with ``deeper``
    its inner agent's under it."""
    subs = [sub_session_id("s", "helper", "call_h")]
    if deeper:
        subs.append(sub_session_id(subs[0], "inner", "call_i"))
    return subs


@contextlib.asynccontextmanager
async def two_stores(pg_url: str) -> AsyncIterator[tuple[PostgresStore, PostgresStore, TurnQueue]]:
    """The worker's store, another process's, and a turn queue on the latter (the front
    end's), closed after."""
    store_a = await PostgresStore.open(pg_url)
    store_b = await PostgresStore.open(pg_url)
    queue = TurnQueue(store_b)
    try:
        yield store_a, store_b, queue
    finally:
        await queue.aclose()
        await store_a.aclose()
        await store_b.aclose()


@pytest.mark.parametrize("deeper", [False, True], ids=["sub-turn", "sub-sub-turn"])
async def test_a_sub_turn_cancelled_by_the_lease_watch_saves_nothing_over_the_takeover(
    pg_url: str, deeper: bool
) -> None:
    held = Held()
    sub = sub_ids(deeper)[-1]
    async with two_stores(pg_url) as (store_a, store_b, queue):
        async with trio.open_nursery() as nursery:
            # a lease long enough that only the test's takeover takes the turn
            worker = Worker(store=store_a, agent=agents(held, deeper=deeper), lease=30.0, poll=0.05)
            await nursery.start(worker.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                await held.inside.wait()
            before = await store_b.load(sub)
            await taken_over(pg_url, store_b, turn.turn_id, sub)
            # The lease watch fires first (a refused renewal, as LeaseKeeper._apply
            # tells it): the calling turn is cancelled while the sub-turn's tool runs.
            worker.running[turn.turn_id].lose("renewal refused")
            with trio.fail_after(LIMIT):
                while worker.running:  # noqa: ASYNC110 - a's copy of the turn ends lost
                    await trio.sleep(0.02)
            worker.stop()
        stored = await store_b.load(sub)
        caller = await store_b.load("s")
    assert held.runs == 1
    assert stored is not None
    # b's sub-session as b saved it: a's aborted sub-turn is not rebased after it
    kept = () if before is None else before.messages
    assert stored.messages == (*kept, TAKEOVER), stored.messages
    assert [m.role for m in stored.messages].count("user") == 1
    # and nothing of a's calling turn past its claim either (the fence did that before)
    assert caller is None or not any(isinstance(m, AssistantMessage) for m in caller.messages)


def passing(held: Held, *, hold_first: bool = False) -> Agent:
    """``boss`` calls ``helper`` (``as_tool(pass_approvals=True)``), whose step 0 calls
    ``guarded`` (needs approval; holds once approved and run); with ``hold_first``, step
    0 calls ``hold`` (which holds) and step 1 ``guarded``."""

    @tool
    async def hold(ctx: ToolContext) -> str:
        """Hold."""
        held.runs += 1
        held.inside.set()
        await held.go.wait()
        return "held"

    @tool(needs_approval=True)
    async def guarded(ctx: ToolContext) -> str:
        """Guarded."""
        held.guarded += 1
        if not hold_first:
            held.runs += 1
            held.inside.set()
            await held.go.wait()
        return "guarded ran"

    def helper_steps(request: InferRequest) -> list[Any]:
        step = current_step(request.messages)
        if hold_first and step == 0:
            return tool_call("hold", {}, tool_call_id="call_x")
        if step == (1 if hold_first else 0):
            return tool_call("guarded", {}, tool_call_id="call_g")
        return ["helper done"]

    helper = Agent(
        name="helper", provider=ScriptedProvider(responder=helper_steps), tools=[hold, guarded]
    )

    def top(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return tool_call("helper", {"input": "help"}, tool_call_id="call_h")
        return ["boss done"]

    return Agent(
        name="boss",
        provider=ScriptedProvider(responder=top),
        tools=[helper.as_tool(pass_approvals=True)],
    )


async def until_idle(worker: Worker) -> None:
    with trio.fail_after(LIMIT):
        while worker.running:  # noqa: ASYNC110
            await trio.sleep(0.02)


async def test_a_passed_up_approvals_continuation_taken_over_inside_the_sub_turn_saves_nothing(
    pg_url: str,
) -> None:
    """A sub-turn that waited for an approval passed up to its caller
    (``as_tool(pass_approvals=True)``), approved: the calling turn's continuation goes on
    with the sub-turn (``_go_on``) and is taken over inside the approved call. The
    continuation's claim is a new one (epoch up): the sub-turn's saves are fenced by it,
    and a's aborted sub-turn lands nowhere."""
    held = Held()
    agent = passing(held)
    sub = sub_session_id("s", "helper", "call_h")
    async with two_stores(pg_url) as (store_a, store_b, queue):
        async with trio.open_nursery() as nursery:
            worker = Worker(store=store_a, agent=agent, lease=30.0, poll=0.05)
            await nursery.start(worker.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                while (row := await queue.get(turn.turn_id)) is None or not row.waiting:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            caller = await store_b.load("s")
            assert caller is not None
            (call,) = pending_calls(caller.messages)
            tools = {t.name: t for t in agent.tools}
            await queue.decide("s", call.approval_id, Decision(approved=True), tools)
            with trio.fail_after(LIMIT):
                await held.inside.wait()  # the continuation runs the approved call
            before = await store_b.load(sub)
            await taken_over(pg_url, store_b, turn.turn_id, sub)
            worker.running[turn.turn_id].lose("renewal refused")
            await until_idle(worker)
            worker.stop()
        stored = await store_b.load(sub)
    assert held.runs == 1
    assert before is not None and stored is not None
    assert stored.messages == (*before.messages, TAKEOVER), stored.messages


async def test_a_sub_turn_whose_caller_is_deleted_meanwhile_leaves_no_wait_for_it(
    pg_url: str,
) -> None:
    """The calling session is deleted (as the front end's DELETE does: its sub-sessions'
    waits ended, then the delete) while a sub-turn runs a tool; the sub-turn's next step
    asks for an approval passed up to its caller. The worker learns of the delete only
    at its next renewal (a third of the lease) or save: before, the sub-turn's step was
    saved meanwhile, and the sub-session waited for good for a caller that is gone (it
    refuses decisions and new messages: ``CallerWaits``). Its saves are fenced by the
    calling turn's claim, which the delete ended: refused."""
    from runtime.app.nested import end_sub_waits

    held = Held()
    sub = sub_session_id("s", "helper", "call_h")
    async with two_stores(pg_url) as (store_a, store_b, queue):
        async with trio.open_nursery() as nursery:
            worker = Worker(
                store=store_a, agent=passing(held, hold_first=True), lease=30.0, poll=0.05
            )
            await nursery.start(worker.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                await held.inside.wait()
            await end_sub_waits(store_b, "s")
            await store_b.delete("s")
            held.go.set()
            await until_idle(worker)
            worker.stop()
        stored = await store_b.load(sub)
        row = await queue.get(turn.turn_id)
    assert held.runs == 1 and held.guarded == 0
    assert row is None or row.status == "cancelled"
    assert stored is None or pending_calls(stored.messages) == (), stored.messages


@pytest.mark.parametrize("deeper", [False, True], ids=["sub-turn", "sub-sub-turn"])
async def test_a_callers_delete_after_its_turn_takes_the_sub_sessions_a_worker_saved(
    pg_url: str, deeper: bool
) -> None:
    """A worker's turn whose agent tool (two agents deep too) ran saved a sub-session
    per call; the caller's delete takes them with it. Before, each stayed for good, with
    the sub-turn's messages, an orphan nobody reaches (not listed as anyone's)."""
    held = Held()
    held.go.set()
    subs = sub_ids(deeper)
    async with two_stores(pg_url) as (store_a, store_b, queue):
        async with trio.open_nursery() as nursery:
            worker = Worker(store=store_a, agent=agents(held, deeper=deeper), lease=30.0, poll=0.05)
            await nursery.start(worker.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                while (row := await queue.get(turn.turn_id)) is None or row.status != "done":  # noqa: ASYNC110
                    await trio.sleep(0.02)
            worker.stop()
        saved = [await store_b.load(sub) for sub in subs]
        await store_b.delete("s")
        stored = [await store_b.load(sid) for sid in ("s", *subs)]
        listed = await store_b.list_sessions()
    assert all(r is not None for r in saved)
    assert stored == [None] * (1 + len(subs)), stored
    assert listed == []


async def test_a_caller_waiting_for_a_passed_up_approval_deleted_takes_its_sub_session(
    pg_url: str,
) -> None:
    """A sub-turn's approval passed up to its caller (``pass_approvals=True``): both
    sessions wait, both saved. The front end's delete of the caller (its sub-sessions'
    waits ended, then the delete) takes the sub-session with it; before, the sub-session
    stayed for good with its denied call."""
    from runtime.app.nested import end_sub_waits

    held = Held()
    sub = sub_session_id("s", "helper", "call_h")
    async with two_stores(pg_url) as (store_a, store_b, queue):
        async with trio.open_nursery() as nursery:
            worker = Worker(store=store_a, agent=passing(held), lease=30.0, poll=0.05)
            await nursery.start(worker.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                while (row := await queue.get(turn.turn_id)) is None or not row.waiting:  # noqa: ASYNC110
                    await trio.sleep(0.02)
            waiting = await store_b.load(sub)
            await end_sub_waits(store_b, "s")
            await store_b.delete("s")
            await until_idle(worker)
            worker.stop()
        stored = await store_b.load(sub)
        row = await queue.get(turn.turn_id)
    assert waiting is not None and pending_calls(waiting.messages)
    assert held.guarded == 0
    assert row is not None and row.status == "cancelled"
    assert stored is None, stored.messages


@pytest.mark.parametrize("deeper", [False, True], ids=["sub-turn", "sub-sub-turn"])
async def test_a_caller_deleted_while_a_worker_holds_its_sub_turn_leaves_no_sub_session(
    pg_url: str, deeper: bool
) -> None:
    """The calling session is deleted (by another process's store, no front end) while
    the worker's sub-turn (two agents deep too) runs a tool under the calling turn's
    claim: the delete takes whatever of the sub-sessions was saved with it, and the
    sub-turn's later saves are refused as a deleted caller's (its fence), so none is
    created after it."""
    held = Held()
    subs = sub_ids(deeper)
    async with two_stores(pg_url) as (store_a, store_b, queue):
        async with trio.open_nursery() as nursery:
            worker = Worker(store=store_a, agent=agents(held, deeper=deeper), lease=30.0, poll=0.05)
            await nursery.start(worker.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                await held.inside.wait()
            await store_b.delete("s")
            held.go.set()
            await until_idle(worker)
            worker.stop()
        stored = [await store_b.load(sid) for sid in ("s", *subs)]
        row = await queue.get(turn.turn_id)
    assert held.runs == 1
    assert row is not None and row.status == "cancelled"
    assert stored == [None] * (1 + len(subs)), stored


@pytest.mark.parametrize("lost", [False, True], ids=["stopped", "taken-over"])
async def test_a_sub_session_saved_after_its_calling_turn_ended_is_the_claims(
    pg_url: str, lost: bool
) -> None:
    """The calling turn ends while its tool runs, and the tool (its cancellation
    shielded) runs a turn in a sub-session it opens as an agent tool does (its meta
    naming the caller) only then: a sub-turn that outlives its calling turn (the agent
    tool's task ends after the turn that cancelled it).

    Stopped (no takeover): its saves are the calling claim's, which no other worker
    took: written, as before they were fenced (the save function refuses a turn not
    running; the transaction checks the claim alone). Taken over (``lost``): refused,
    the claim that ended is another worker's now; before, written unfenced."""
    from runtime.tools import PARENT_SESSION_META

    held = Held(linger=trio.Event())
    ran = trio.Event()
    late = Agent(name="late", provider=ScriptedProvider([["late answer"]]))
    sub = sub_session_id("s", "late", "call_l")

    @tool
    async def lingering(ctx: ToolContext) -> str:
        """Linger."""
        assert ctx.host is not None and held.linger is not None
        held.inside.set()
        try:
            await held.go.wait()
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await held.linger.wait()
                session = await ctx.host.open_session(
                    late, session_id=sub, meta={PARENT_SESSION_META: ctx.session_id}
                )
                async with session.stream("after the caller") as out:
                    async for _ in out:
                        pass
                await session.close()
                ran.set()
            raise
        return "lingered"

    boss = Agent(
        name="boss",
        provider=ScriptedProvider([[*tool_call("lingering", {}, tool_call_id="call_l")]]),
        tools=[lingering],
    )
    async with two_stores(pg_url) as (store_a, store_b, queue):
        async with trio.open_nursery() as nursery:
            worker = Worker(store=store_a, agent=boss, lease=30.0, poll=0.05)
            await nursery.start(worker.run)
            turn = await queue.submit("s", "go")
            with trio.fail_after(LIMIT):
                await held.inside.wait()
            if lost:
                await taken_over(pg_url, store_b, turn.turn_id, "other")
                worker.running[turn.turn_id].lose("renewal refused")
            else:
                worker.running[turn.turn_id].cancel("stopped")
            await until_idle(worker)
            row = await queue.get(turn.turn_id)
            assert row is not None
            assert (row.status, row.epoch) == (("running", 2) if lost else ("cancelled", 1))
            held.linger.set()
            with trio.fail_after(LIMIT):
                await ran.wait()
            await trio.testing.wait_all_tasks_blocked()  # (its last save answered)
            stored = await store_b.load(sub)
            worker.stop()
    if lost:
        assert stored is None
    else:
        assert stored is not None
        assert [m.role for m in stored.messages] == ["user", "assistant"]
