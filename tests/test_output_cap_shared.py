"""Sub-agents called at once share what their calling turn has left.

Each agent-tool call of a step was given all that the caller had left
(``ToolContext.output_left``, fixed as the batch began), so three sub-agents called in
one step could write three times it: the caller was billed for all and ended
``budget`` after them. They now draw on one live account per batch
(:class:`runtime.budget.OutputAccount`): each model call reserves the cap it is sent and
gives back what it did not write, so together they never write more than was left; a
sub-turn the account stops ends ``budget`` as the budget's own stop does. The scripted
provider plays a greedy model (it writes as much as it may, up to what it wants), its
usage as written; the caller's first call writes 10 of a 100-token budget.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, Sleep, current_step, tool_call
from runtime import Agent, Budget, Host, Usage, tool
from runtime.actor_messages import InferRequest
from runtime.budget import OutputAccount
from runtime.chunks import FinishChunk, UsageChunk
from runtime.messages import ToolMessage

CALLS = ("H1", "H2", "H3")


def written(n: int, *, cut: bool = False, calls: list[Any] | None = None) -> list[Any]:
    """A step that writes ``n`` tokens (a token a character), reported as such."""
    usage = Usage(input_tokens=5, output_tokens=n, total_tokens=5 + n)
    finish = "tool-calls" if calls else ("length" if cut else "stop")
    return [
        *(["x" * n] if n else []),
        *(calls or []),
        UsageChunk(usage=usage),
        FinishChunk(reason=finish),
    ]


class Greedy(ScriptedProvider):
    """Writes ``wants`` tokens a call, at most the cap it is sent (``length`` when cut);
    records the caps and how many of its calls ran at once."""

    def __init__(self, wants: int) -> None:
        super().__init__(responder=self.respond)
        self.wants = wants
        self.caps: list[int | None] = []
        self.now = self.most = 0

    def respond(self, request: InferRequest) -> list[Any]:
        cap = request.max_output_tokens
        self.caps.append(cap)
        sent = self.sent_cap(request.settings, cap)  # the settings' cap too, if smaller
        n = self.wants if sent is None else min(self.wants, sent)
        return [Sleep(0.01), *written(n, cut=n < self.wants)]  # (calls that may overlap do)

    async def stream(self, request: InferRequest, emit: Any) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await super().stream(request, emit)
        finally:
            self.now -= 1


def caller_model(calls: tuple[str, ...] = CALLS):
    def respond(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            chunks = [c for i in calls for c in tool_call("helper", {"input": i}, tool_call_id=i)]
            return written(10, calls=chunks)
        return written(1)

    return respond


async def run(
    helper: Greedy, *, settings: dict[str, Any] | None = None, calls: tuple[str, ...] = CALLS
) -> tuple[Any, list[ToolMessage]]:
    async with Host.open(log_tap=False) as host:
        sub = Agent(name="helper", provider=helper, settings=settings or {})
        agent = Agent(
            provider=ScriptedProvider(responder=caller_model(calls)),
            tools=[sub.as_tool()],
            budget=Budget(max_output_tokens=100),
        )
        session = await host.open_session(agent, session_id="s")
        result = await session.run("Ask the helpers.")
        results = [m for m in session.messages if isinstance(m, ToolMessage)]
    return result, results


NOTE = "\n[the sub-agent stopped before it finished: max_output_tokens reached]"


async def test_sub_agents_called_at_once_write_no_more_together_than_the_caller_had_left():
    """90 left: two write their 40, the third the 10 still left, cut there (``budget``);
    each call was sent what was left as it began. Before: each was sent 90, they wrote
    120, the caller 130 of its 100."""
    helper = Greedy(wants=40)
    result, results = await run(helper)
    assert sorted(helper.caps, reverse=True) == [90, 50, 10]
    assert result.usage.output_tokens == 100
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    outputs = sorted(m.output for m in results)
    assert outputs == ["x" * 10 + NOTE, "x" * 40, "x" * 40]


async def test_a_sub_agent_left_nothing_by_the_others_ends_budget_without_a_call():
    """The first writes all 90; the others find nothing left and nothing held: no call
    (none may be sent a cap of 0), each ends ``budget``, its note the call's result."""
    helper = Greedy(wants=500)
    result, results = await run(helper)
    assert helper.caps == [90]
    assert result.usage.output_tokens == 100
    assert sorted(m.output for m in results) == [NOTE, NOTE, "x" * 90 + NOTE]


async def test_sub_agents_with_a_smaller_cap_of_their_own_run_side_by_side():
    """Each call reserves only the cap it is sent (its settings' 25): all three run at
    once, and each stops at its own cap (``length``, not the caller's budget)."""
    helper = Greedy(wants=40)
    result, results = await run(helper, settings={"max_tokens": 25})
    assert helper.most == 3
    assert result.usage.output_tokens == 10 + 75 + 1
    assert (result.finish_reason, result.budget) == ("stop", None)
    assert sorted(m.output for m in results) == ["x" * 25] * 3


async def test_one_sub_agent_gets_all_the_caller_has_left():
    helper = Greedy(wants=40)
    result, results = await run(helper, calls=("H1",))
    assert helper.caps == [90]
    assert [m.output for m in results] == ["x" * 40]
    assert result.usage.output_tokens == 10 + 40 + 1


# -- the account itself --------------------------------------------------------------


async def test_a_reservation_waits_for_a_held_call_to_settle_and_gets_what_came_back():
    account = OutputAccount(100)
    assert await account.reserve(100) == 100
    got: list[int] = []

    async def second() -> None:
        got.append(await account.reserve(100))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # nothing available, a call holds it all: it waits
        account.settle(100, 30)
    assert got == [70]
    assert (account.left, account.held) == (0, 70)
    account.settle(70, 70)
    assert await account.reserve(10) == 0  # spent, nothing held: nothing comes back


async def test_a_reservation_in_a_nested_account_holds_in_every_account_above_it():
    top = OutputAccount(50)
    mine = OutputAccount(80, top)  # a sub-turn's batch, under its caller's
    sibling = OutputAccount(50, top)
    assert await mine.reserve(40) == 50  # the top has 50: 40 reserved there too
    assert sibling.available() == 10
    mine.settle(40, 45)  # it wrote more than it held (a server past its cap)
    assert (top.left, mine.left, sibling.available()) == (5, 35, 5)


# -- sub-agents that passed an approval up, gone on together --------------------------


@tool(needs_approval=True)
async def deploy() -> str:
    """Deploy."""
    return "deployed"


class Asking(Greedy):
    """Writes 20 tokens and asks to deploy; once decided, writes greedily."""

    def respond(self, request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            self.caps.append(request.max_output_tokens)
            return written(20, calls=tool_call("deploy", {}, tool_call_id="D"))
        return super().respond(request)


async def test_sub_agents_gone_on_after_their_approvals_share_what_the_caller_has_left(tmp_path):
    """Each wrote 20 before it waited (counted with the wait: the caller had 50 left);
    gone on, in a new host, they write 40 and the 10 still left, not 40 each. The
    continuation's batch shares one account as the step's did."""
    helper = Asking(wants=40)

    def agent() -> Agent:
        sub = Agent(name="helper", provider=helper, tools=[deploy])
        return Agent(
            provider=ScriptedProvider(responder=caller_model(("H1", "H2"))),
            tools=[sub.as_tool(pass_approvals=True)],
            budget=Budget(max_output_tokens=100),
        )

    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        asked = await session.run("Ask the helpers.")
    assert asked.finish_reason == "awaiting-input"
    assert asked.usage.output_tokens == 10 + 20 + 20
    async with Host.open(store=tmp_path / "s.db", log_tap=False) as host:
        session = await host.open_session(agent(), session_id="s")
        first, second = (p.approval_id for p in asked.pending)
        assert await session.respond(first, approved=True) is None
        result = await session.respond(second, approved=True)
        results = [m for m in session.messages if isinstance(m, ToolMessage)]
    assert sorted(helper.caps[2:], reverse=True) == [50, 10]  # gone on: 50 left, shared
    assert result.usage.output_tokens == 100
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    answers = sorted(m.output for m in results if m.tool_name == "helper")
    assert answers == ["x" * 20 + "x" * 10 + NOTE, "x" * 20 + "x" * 40]


async def test_a_sub_agent_of_a_sub_agent_draws_on_the_top_callers_account_too():
    """``outer`` (called beside ``helper``) calls ``inner``: inner's calls reserve in
    outer's batch's account and in the caller's, so inner and helper together stay
    within the caller's 90. Unchained, inner drew only on outer's left (89, which knew
    nothing of helper): 10 + 1 + 60 + 1 + 60 of the caller's 100."""

    def outer_model(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return written(1, calls=tool_call("inner", {"input": "go"}, tool_call_id="I1"))
        return written(1)

    def caller(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            calls = [
                *tool_call("outer", {"input": "o"}, tool_call_id="O1"),
                *tool_call("helper", {"input": "h"}, tool_call_id="H1"),
            ]
            return written(10, calls=calls)
        return written(1)

    inner = Agent(name="inner", provider=Greedy(wants=60))
    outer = Agent(
        name="outer", provider=ScriptedProvider(responder=outer_model), tools=[inner.as_tool()]
    )
    helper = Agent(name="helper", provider=Greedy(wants=60))
    agent = Agent(
        provider=ScriptedProvider(responder=caller),
        tools=[outer.as_tool(), helper.as_tool()],
        budget=Budget(max_output_tokens=100),
    )
    async with Host.open(log_tap=False) as host:
        result = await (await host.open_session(agent, session_id="s")).run("Go.")
    assert result.usage.output_tokens <= 100
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
