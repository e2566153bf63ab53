"""How many calls of one step run at once: ``Budget.max_parallel_tool_calls`` (100 by
default). A model that asked for 5,000 async calls in one step had them all running
together (benchmarks/journal/pipeline.md, "greedymodel" and "greedyleft")."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
import trio

from actors.providers.scripted import ScriptedProvider, tool_call
from actors.tool_executor import StepPlaces, run_tool_call
from runtime import Agent, Budget, Host, ToolMessage, tool
from runtime.actor_messages import ToolCallSpec
from runtime.budget import MAX_PARALLEL_TOOL_CALLS
from runtime.errors import ConfigurationError, ToolDefinitionError


class Gauge:
    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.ran = 0


def _agent(gauge: Gauge, calls: int, budget: Budget) -> Agent:
    @tool
    async def fetch(i: int) -> str:
        """Waits on a slow server."""
        gauge.now += 1
        gauge.most = max(gauge.most, gauge.now)
        try:
            await trio.sleep(1)
        finally:
            gauge.now -= 1
        gauge.ran += 1
        return f"got {i}"

    step = [c for i in range(calls) for c in tool_call("fetch", {"i": i}, tool_call_id=f"c{i}")]
    provider = ScriptedProvider([step, ["done"]])
    return Agent(provider=provider, tools=[fetch], budget=budget)


async def _run(agent: Agent) -> tuple[Any, list[ToolMessage]]:
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s")
        result = await session.run("go")
        return result, [m for m in session.messages if isinstance(m, ToolMessage)]


@pytest.mark.parametrize(
    ("bound", "most"),
    [(..., MAX_PARALLEL_TOOL_CALLS), (7, 7), (None, 300)],
    ids=["default", "seven", "unbounded"],
)
async def test_a_steps_calls_run_at_most_the_bound_at_once(
    autojump_clock: Any, bound: Any, most: int
) -> None:
    gauge = Gauge()
    # each call takes 1 s of its 2 s timeout: one waiting for its place does not time out
    budget = (
        Budget(tool_timeout=2)
        if bound is ...
        else Budget(tool_timeout=2, max_parallel_tool_calls=bound)
    )
    result, messages = await _run(_agent(gauge, 300, budget))
    assert gauge.most == most
    assert gauge.ran == 300 and result.text == "done"
    assert [m.error for m in messages] == [None] * 300
    assert [m.output for m in messages] == [f"got {i}" for i in range(300)]


def test_the_bound_is_none_or_at_least_one() -> None:
    assert Budget().max_parallel_tool_calls == MAX_PARALLEL_TOOL_CALLS == 100
    for wrong in (0, -1, True, 1.5, "3"):
        with pytest.raises(ConfigurationError, match="max_parallel_tool_calls"):
            Budget(max_parallel_tool_calls=wrong)


async def test_a_call_waiting_for_its_approval_holds_no_place(autojump_clock: Any) -> None:
    # One place: the call that waits for a person's decision (in process) must not keep
    # the step's other call from running meanwhile.
    ran: list[str] = []
    decided = trio.Event()

    @tool(needs_approval=True)
    async def risky() -> str:
        """Needs a yes."""
        ran.append("risky")
        return "r"

    @tool
    async def free() -> str:
        """Runs at once."""
        ran.append("free")
        return "f"

    async def approve(call: ToolCallSpec, kwargs: Any) -> tuple[bool, str | None]:
        await decided.wait()
        return True, None

    tools = {"risky": risky, "free": free}
    limit = StepPlaces(1)

    def spec(name: str) -> ToolCallSpec:
        return ToolCallSpec(tool_call_id=name, tool_name=name, input={})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            partial(run_tool_call, spec("risky"), tools, 10, None, approve=approve, limit=limit)
        )
        await trio.sleep(1)  # risky waits for its decision
        with trio.fail_after(5):
            freed = await run_tool_call(spec("free"), tools, 10, None, limit=limit)
        assert (freed.output, ran) == ("f", ["free"])
        decided.set()
    assert ran == ["free", "risky"]


def _barrier_agent(calls: int, budget: Budget, *, waits_on_siblings: bool) -> Agent:
    """A step of ``calls`` calls that each wait until all of them have arrived."""
    arrived: list[int] = []
    everyone = trio.Event()

    async def meet(i: int) -> str:
        """Waits for the step's other calls."""
        arrived.append(i)
        if len(arrived) == calls:
            everyone.set()
        await everyone.wait()
        return f"met {i}"

    made = tool(meet, waits_on_siblings=True) if waits_on_siblings else tool(meet)
    step = [c for i in range(calls) for c in tool_call("meet", {"i": i}, tool_call_id=f"c{i}")]
    return Agent(provider=ScriptedProvider([step, ["done"]]), tools=[made], budget=budget)


async def test_calls_of_a_tool_that_waits_on_its_siblings_run_at_once_past_the_bound(
    autojump_clock: Any,
) -> None:
    # Five calls that meet at a barrier, three places: the three running waited for the
    # two that waited for a place until their timeouts (a deadlock the clock ended).
    budget = Budget(tool_timeout=60, max_parallel_tool_calls=3)
    start = trio.current_time()
    result, messages = await _run(_barrier_agent(5, budget, waits_on_siblings=True))
    assert [m.error for m in messages] == [None] * 5
    assert [m.output for m in messages] == [f"met {i}" for i in range(5)]
    assert result.text == "done" and trio.current_time() - start < 60


async def test_a_stall_behind_the_bound_is_named_where_it_shows(autojump_clock: Any) -> None:
    from structlog.testing import capture_logs

    budget = Budget(tool_timeout=60, max_parallel_tool_calls=3)
    with capture_logs() as logs:
        result, messages = await _run(_barrier_agent(5, budget, waits_on_siblings=False))
    queued = [e for e in logs if e["event"] == "tool.calls-wait-for-a-place"]
    assert [(e["bound"], e["calls"]) for e in queued] == [(3, 5)]  # once for the step
    errors = [m.error or "" for m in messages]
    # The three that held the places timed out while two waited: their errors say why.
    named = [e for e in errors if "max_parallel_tool_calls=3" in e]
    assert len(named) == 3 and all("timed out" in e for e in named), errors
    assert all("waits_on_siblings" in e for e in named)
    assert result.text == "done"  # (the two that waited then met: the step went on)


def test_waits_on_siblings_is_true_or_false() -> None:
    async def meet() -> str:
        """Meets."""
        return "m"

    assert tool(meet, waits_on_siblings=True).waits_on_siblings is True
    assert tool(meet).waits_on_siblings is False
    for wrong in (1, "yes", None):
        with pytest.raises(ToolDefinitionError, match="waits_on_siblings"):
            tool(meet, waits_on_siblings=wrong)  # type: ignore[call-overload]


def test_waits_on_siblings_is_refused_for_a_sync_tool() -> None:
    """A sync tool's calls run in the threads every sync tool of the run shares
    (``TOOL_THREADS``, 40): 45 calls of one marked ``waits_on_siblings`` meeting at a
    ``threading.Barrier`` all timed out, their errors naming nothing. Refused where it
    is made, saying so; an async one is taken, and a sync one without the flag."""
    from runtime.tools import TOOL_THREADS

    def meet(i: int) -> str:
        """Waits for the step's other calls."""
        return f"met {i}"

    with pytest.raises(ToolDefinitionError, match=rf"needs an async function.*{TOOL_THREADS}"):
        tool(meet, waits_on_siblings=True)
    with pytest.raises(ToolDefinitionError, match="needs an async function"):
        tool(waits_on_siblings=True)(meet)
    assert tool(meet).waits_on_siblings is False

    async def ameet(i: int) -> str:
        """Waits for the step's other calls."""
        return f"met {i}"

    assert tool(ameet, waits_on_siblings=True).waits_on_siblings is True
