"""A per-call approval rule (``needs_approval=lambda args, ctx: ...``) that answers
differently the second time it is asked: the turn runner asks it whether the call
suspends its turn, the tool executor asks again as the call runs (docs/approval.md,
"Declaring tools"). A rule that raised, then asked for approval (a lookup that failed
once), or whose answer changed in between (a clock, a count), sent the call to wait in
memory for an in-process approver that does not run: the turn hung for the executor's
``approval_timeout`` (300 s), its approval request answerable by nobody."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from actors.providers import ScriptedProvider
from actors.providers.scripted import tool_call
from actors.tool_executor import NO_APPROVER
from runtime import Agent, Host, tool
from runtime.events import ToolApprovalRequested
from runtime.messages import ToolMessage

ran: list[int] = []
asked: list[int] = []


def _flips(first: str) -> Any:
    def rule(arguments: dict[str, Any], context: Any) -> bool:
        asked.append(arguments["amount"])
        if len(asked) == 1:
            if first == "raises":
                raise ConnectionError("the limits service did not answer")
            return False
        return True

    return rule


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()
    asked.clear()


@pytest.mark.parametrize("first", ["raises", "no"])
async def test_a_rule_that_asks_only_when_the_call_runs_refuses_it_at_once_not_waits(
    first, autojump_clock
):
    @tool(needs_approval=_flips(first))
    async def transfer(amount: int) -> str:
        """Moves money."""
        ran.append(amount)
        return "moved"

    steps = [[*tool_call("transfer", {"amount": 5}, tool_call_id="T")], ["could not"]]
    async with Host.open(log_tap=False) as host:
        requested = host.bus.subscribe([ToolApprovalRequested], name="t")
        session = await host.open_session(Agent(provider=ScriptedProvider(steps), tools=[transfer]))
        result = await session.run("pay")
        record = await host.store.load(session.id)
        requests = []
        while True:
            try:
                requests.append(requested.inbox.get_nowait())
            except trio.WouldBlock:
                break
    assert record is not None
    (answer,) = [m for m in record.messages if isinstance(m, ToolMessage)]
    assert ran == [] and asked == [5, 5]
    assert result.finish_reason == "stop" and result.pending == ()
    assert answer.error == f"the tool call was denied: {NO_APPROVER.format(tool='transfer')}"
    assert requests == []  # nobody to answer one
