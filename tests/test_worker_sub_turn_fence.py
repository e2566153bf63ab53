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

from typing import Any

import attrs
import pytest
import trio

from actors.providers.scripted import ScriptedProvider, current_step, tool_call
from actors.stores.postgres import PostgresStore
from actors.stores.turns import TurnQueue
from runtime.actor_messages import InferRequest
from runtime.agent import Agent, sub_session_id
from runtime.app.worker import Worker
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


@pytest.mark.parametrize("deeper", [False, True], ids=["sub-turn", "sub-sub-turn"])
async def test_a_sub_turn_cancelled_by_the_lease_watch_saves_nothing_over_the_takeover(
    pg_url: str, deeper: bool
) -> None:
    held = Held()
    store_a = await PostgresStore.open(pg_url)
    store_b = await PostgresStore.open(pg_url)
    queue = TurnQueue(store_b)
    sub = sub_session_id("s", "helper", "call_h")
    if deeper:
        sub = sub_session_id(sub, "inner", "call_i")
    try:
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
    finally:
        await queue.aclose()
        await store_a.aclose()
        await store_b.aclose()
    assert held.runs == 1
    assert stored is not None
    # b's sub-session as b saved it: a's aborted sub-turn is not rebased after it
    kept = () if before is None else before.messages
    assert stored.messages == (*kept, TAKEOVER), stored.messages
    assert [m.role for m in stored.messages].count("user") == 1
    # and nothing of a's calling turn past its claim either (the fence did that before)
    assert caller is None or not any(isinstance(m, AssistantMessage) for m in caller.messages)
