"""A per-call approval rule (``needs_approval=lambda args, ctx: ...``) is asked once a
call (docs/approval.md, "Declaring tools"): as the turn makes the call, and its answer
goes with the call. Before, the tool executor asked it again as a call the rule let run
ran: a rule with side effects (a count, an audit line, a quota) acted twice, and one
whose second answer differed (a lookup that failed once, a clock) sent the call to wait
in memory for an in-process approver that does not run (the turn hung for the executor's
``approval_timeout``, 300 s), then, after attackapprove, was denied at once. Now the
second question is not asked: no answer can contradict the first.
(tests/test_worker_approval_rule_once.py: the same through a worker deployment.)"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.plugins import ApprovalActor
from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from runtime import Agent, Host, tool
from runtime.events import ToolApprovalRequested
from runtime.messages import ToolMessage

ran: list[int] = []
asked: list[int] = []


def _flips(first: str) -> Any:
    """A rule whose first answer is ``first`` (``"raises"``, ``"no"``, ``"yes"``) and
    every later one the opposite: asked twice, the two disagree."""

    def rule(arguments: dict[str, Any], context: Any) -> bool:
        asked.append(arguments["amount"])
        if len(asked) == 1:
            if first == "raises":
                raise ConnectionError("the limits service did not answer")
            return first == "yes"
        return first != "yes"

    return rule


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()
    asked.clear()


def _transfer(rule: Any) -> Any:
    @tool(needs_approval=rule)
    async def transfer(amount: int) -> str:
        """Moves money."""
        ran.append(amount)
        return "moved"

    return transfer


def _drain(subscription: Any) -> list[Any]:
    out = []
    while True:
        try:
            out.append(subscription.inbox.get_nowait())
        except trio.WouldBlock:
            return out


async def test_a_rule_that_says_no_is_asked_once_and_the_call_runs(autojump_clock):
    steps = [[*tool_call("transfer", {"amount": 5}, tool_call_id="T")], ["moved it"]]
    async with Host.open(log_tap=False) as host:
        requested = host.bus.subscribe([ToolApprovalRequested], name="t")
        agent = Agent(provider=ScriptedProvider(steps), tools=[_transfer(_flips("no"))])
        session = await host.open_session(agent)
        result = await session.run("pay")
        requests = _drain(requested)
    (answer,) = [m for m in session.messages if isinstance(m, ToolMessage)]
    assert asked == [5] and ran == [5]  # asked once; its "no" stands: the call ran
    assert result.finish_reason == "stop" and answer.output == "moved" and requests == []


async def test_a_rule_that_raises_is_asked_once_and_refuses_the_call(autojump_clock):
    steps = [[*tool_call("transfer", {"amount": 5}, tool_call_id="T")], ["could not"]]
    async with Host.open(log_tap=False) as host:
        agent = Agent(provider=ScriptedProvider(steps), tools=[_transfer(_flips("raises"))])
        session = await host.open_session(agent)
        result = await session.run("pay")
        record = await host.store.load(session.id)
    assert record is not None
    (answer,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert asked == [5] and ran == [] and result.finish_reason == "stop"
    assert answer.error == (
        "the tool call was not executed: the approval rule of transfer raised "
        "ConnectionError: the limits service did not answer"
    )


@pytest.mark.parametrize("edit", [None, {"amount": 7}])
async def test_a_rule_that_says_yes_is_asked_once_across_the_wait_and_the_continuation(
    tmp_path, edit
):
    """Asked as the turn suspends; the decision (approved, with an edit or not) runs the
    call from another host without asking the rule again (its second answer, ``no``,
    would not matter either)."""
    db = tmp_path / "s.db"
    steps = [[*tool_call("transfer", {"amount": 50}, tool_call_id="T")], ["moved it"]]
    transfer = _transfer(_flips("yes"))
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[transfer]), session_id="s"
        )
        waited = await session.run("pay")
    assert waited.finish_reason == "awaiting-input" and asked == [50]
    async with Host.open(store=db, log_tap=False) as host:
        session = await host.open_session(
            Agent(provider=ScriptedProvider(steps), tools=[transfer]), session_id="s"
        )
        result = await session.respond(
            waited.pending[0].approval_id, approved=True, edited_input=edit
        )
    assert result is not None and result.finish_reason == "stop"
    assert asked == [50] and ran == [50 if edit is None else 7]


async def test_a_rule_with_a_side_effect_acts_once_per_call_in_a_step_of_many():
    """Three calls of one step: yes, no, no by amount; each asked once."""
    audit: list[int] = []

    def audited(arguments: dict[str, Any], context: Any) -> bool:
        audit.append(arguments["amount"])
        return bool(arguments["amount"] > 10)

    calls = [
        *tool_call("transfer", {"amount": 50}, tool_call_id="A"),
        *tool_call("transfer", {"amount": 1}, tool_call_id="B"),
        *tool_call("transfer", {"amount": 2}, tool_call_id="C"),
    ]
    async with Host.open(log_tap=False) as host:
        agent = Agent(provider=ScriptedProvider([calls, ["ok"]]), tools=[_transfer(audited)])
        session = await host.open_session(agent)
        waited = await session.run("pay")
        assert sorted(audit) == [1, 2, 50] and sorted(ran) == [1, 2]
        await session.respond(waited.pending[0].approval_id, approved=True)
    assert sorted(audit) == [1, 2, 50] and sorted(ran) == [1, 2, 50]


@pytest.mark.parametrize("first", ["yes", "no"])
async def test_under_an_in_process_approver_the_rule_is_asked_once_too(first, autojump_clock):
    """The turn does not ask (the call waits in memory, not suspended): the executor
    asks, once, and the approver decides what it asked for."""
    steps = [[*tool_call("transfer", {"amount": 5}, tool_call_id="T")], ["done"]]
    async with Host.open(log_tap=False) as host:
        requested = host.bus.subscribe([ToolApprovalRequested], name="t")
        await host.start_actor(ApprovalActor(lambda request: (True, None)))
        agent = Agent(provider=ScriptedProvider(steps), tools=[_transfer(_flips(first))])
        session = await host.open_session(agent)
        result = await session.run("pay")
        requests = _drain(requested)
    assert asked == [5] and ran == [5] and result.finish_reason == "stop"
    assert len(requests) == (1 if first == "yes" else 0)
