"""What deciding a waiting turn wakes, counted in task steps (issue 21: suspending and
resuming should cost about a step commit). A decision for a suspended turn is a bus
event; the tool executor listens for decisions only once a call waits for one in memory
(an in-process approver runs), so such a decision wakes none of its tasks."""

from __future__ import annotations

from collections import Counter

import trio

from actors.plugins import ApprovalActor
from actors.providers.scripted import ScriptedProvider, tool_call
from runtime import Agent, Host
from tests.support.approval_tools import clear_ran, delete_file, ran  # noqa: F401 (fixture)


class StepsByTask(trio.abc.Instrument):
    """Task steps counted by the task's name (its function's qualified name)."""

    def __init__(self) -> None:
        self.steps: Counter[str] = Counter()

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps[task.name.rsplit(".", 1)[-1]] += 1


def agent() -> Agent:
    steps = [tool_call("delete_file", {"path": "/x"}, tool_call_id="D"), ["done"]]
    return Agent(provider=ScriptedProvider(steps), tools=[delete_file])


async def test_a_decision_for_a_suspended_turn_wakes_no_tool_executor_task() -> None:
    counter = StepsByTask()
    async with Host.open() as host:
        session = await host.open_session(agent(), session_id="s")
        waiting = await session.run("go")
        trio.lowlevel.add_instrument(counter)
        try:
            result = await session.respond(waiting.pending[0].approval_id, approved=True)
        finally:
            trio.lowlevel.remove_instrument(counter)
    assert result is not None and result.text == "done"
    assert ran == ["/x"]
    assert counter.steps["_collect_decisions"] == 0


async def test_a_call_waiting_for_an_in_process_approver_still_gets_its_decision() -> None:
    """The executor subscribes to decisions at the first call that waits in memory,
    before that call's request is published: the approver's answer is not missed."""
    async with Host.open() as host:
        approver = await host.start_actor(ApprovalActor(lambda request: (True, None)))
        session = await host.open_session(agent(), session_id="s")
        result = await session.run("go")
        assert approver.pending == {}
    assert result.finish_reason == "stop"
    assert ran == ["/x"]
