"""The output account that sub-agents called at once share is fair, and says when a
call waits (budget4).

:class:`runtime.budget.OutputAccount` made a call that wanted more than was free wait
for holds to settle, but any later call that fit took what came back first: a sub-agent
with no cap of its own (it wants all that is left) beside capped sub-agents that make
call after call waited until their turns were over, and was then sent the crumbs. Now
reservations are served first come, first served across the account's tree: once one
waits, every later one waits behind it. And a sub-turn that waited said nothing in its
stream: it now sends a ``budget-wait`` chunk. Tools that count usage of their own
(``ToolContext.add_usage``) take it from the account at once.

Scripted providers (a token a character, usage as written); the caller's first call
writes 10 of a 100-token budget, so its calls share 90.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from actors.providers.scripted import ScriptedProvider, Sleep, current_step, tool_call
from runtime import Agent, Budget, Host, ToolMessage, Usage, tool
from runtime.actor_messages import InferRequest
from runtime.budget import OutputAccount
from runtime.output import BudgetWait, ToolStream
from runtime.tools import ToolContext
from tests.test_output_cap_shared import Greedy, written

# -- the account: first come, first served -----------------------------------------------


async def test_a_waiting_reservation_is_served_before_a_later_one_that_would_fit():
    """90 left, a capped call holds 20; a greedy call wants 90 and waits; a capped call
    asking after it (20 would fit in the 70 free) waits behind it. Before, the later
    call took its 20 at once, and the greedy one waited on."""
    account = OutputAccount(90)
    assert await account.reserve(20) == 90
    order: list[tuple[str, int]] = []

    async def call(name: str, want: int) -> None:
        order.append((name, await account.reserve(want)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "greedy", 90)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call, "capped", 20)
        await trio.testing.wait_all_tasks_blocked()
        assert order == []  # both wait: the greedy one for the hold, the capped behind it
        assert account.waiting() == 2
        account.settle(20, 5)  # nothing held now: the greedy one takes all that is left
        await trio.testing.wait_all_tasks_blocked()
        assert order == [("greedy", 85)]
        account.settle(85, 30)
    assert order == [("greedy", 85), ("capped", 55)]
    assert (account.left, account.held, account.waiting()) == (35, 20, 0)


async def test_a_cancelled_head_wakes_the_waiter_behind_it():
    account = OutputAccount(50)
    assert await account.reserve(40) == 50
    got: list[int] = []

    async def capped() -> None:
        got.append(await account.reserve(10))

    async with trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def greedy() -> None:
            with scope:
                await account.reserve(50)

        nursery.start_soon(greedy)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(capped)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # 10 are free, but the greedy one is first
        scope.cancel()
    assert got == [10]  # it went once the greedy one left, with no hold settling


async def test_a_head_told_nothing_is_left_lets_the_next_one_hear_it_too():
    account = OutputAccount(30)
    assert await account.reserve(30) == 30
    got: list[tuple[str, int]] = []

    async def call(name: str, want: int) -> None:
        got.append((name, await account.reserve(want)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, "first", 30)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call, "second", 5)
        await trio.testing.wait_all_tasks_blocked()
        account.settle(30, 30)  # all written: nothing left, nothing held
    assert got == [("first", 0), ("second", 0)]


async def test_the_queue_is_the_whole_trees_a_waiter_in_one_sub_account_blocks_a_sibling():
    """Two sub-turns' batches under one caller's account: a reservation waiting in one
    holds up a later one in the other (their tokens are the caller's)."""
    top = OutputAccount(90)
    left, right = OutputAccount(90, top), OutputAccount(90, top)
    assert await left.reserve(20) == 90
    order: list[tuple[str, int]] = []

    async def call(account: OutputAccount, name: str, want: int) -> None:
        order.append((name, await account.reserve(want)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call, left, "greedy", 90)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(call, right, "capped", 20)
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and top.waiting() == left.waiting() == right.waiting() == 2
        left.settle(20, 0)
        await trio.testing.wait_all_tasks_blocked()
        left.settle(90, 0)
    assert order == [("greedy", 90), ("capped", 90)]


async def test_the_notice_comes_once_before_the_wait_with_what_is_free_held_and_ahead():
    account = OutputAccount(90)
    assert await account.reserve(20) == 90
    said: list[tuple[str, int, int, int]] = []

    def notice(name: str) -> Any:
        async def waits(available: int, held: int, ahead: int) -> None:
            said.append((name, available, held, ahead))

        return waits

    assert await account.reserve(10, notice("fits")) == 70  # no wait: nothing said
    async with trio.open_nursery() as nursery:
        nursery.start_soon(account.reserve, 90, notice("greedy"))
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(account.reserve, 5, notice("behind"))
        await trio.testing.wait_all_tasks_blocked()
        account.settle(20, 0)
        account.settle(10, 0)
        await trio.testing.wait_all_tasks_blocked()
        account.settle(90, 0)
    assert said == [("greedy", 60, 30, 0), ("behind", 60, 30, 1)]


# -- sub-agents: an uncapped one beside capped ones that make call after call -------------


@tool
async def noop() -> str:
    """Do nothing."""
    return "done"


def _capped(name: str, log: list[str], steps: int = 4) -> ScriptedProvider:
    """A capped sub-agent's model: ``steps`` calls of 5 tokens and a tool call, then an
    answer of 5; each call takes a second."""

    def respond(request: InferRequest) -> list[Any]:
        log.append(name)
        step = current_step(request.messages)
        calls = tool_call("noop", {}, tool_call_id=f"{name}{step}") if step < steps else None
        return [Sleep(1), *written(5, calls=calls)]

    return ScriptedProvider(responder=respond)


def _uncapped(log: list[str], caps: list[Any]) -> ScriptedProvider:
    """A sub-agent's model with no cap of its own: it may be sent all that is left;
    writes 30."""

    def respond(request: InferRequest) -> list[Any]:
        log.append("G")
        caps.append(request.max_output_tokens)
        return [Sleep(1), *written(min(30, request.max_output_tokens or 30))]

    return ScriptedProvider(responder=respond)


def _after(seconds: float) -> Any:
    """A history processor that holds the sub-turn's first call back ``seconds``."""
    first = [True]

    async def later(messages: Any, context: Any) -> Any:
        if first[0]:
            first[0] = False
            await trio.sleep(seconds)
        return messages

    return later


async def _three_at_once() -> tuple[Any, list[str], list[Any], list[Any], dict[str, Any]]:
    """C1 (capped at 20 by its settings) calls at once, G (no cap) a quarter second
    later, C2 (capped) half a second later: C1's and C2's calls overlap, so some capped
    call holds tokens at every moment until both are done."""
    log: list[str] = []
    caps: list[Any] = []
    capped = {"max_tokens": 20}
    c1 = Agent(name="c1", provider=_capped("C1", log), tools=[noop], settings=capped)
    c2 = Agent(
        name="c2",
        provider=_capped("C2", log),
        tools=[noop],
        settings=capped,
        history_processors=[_after(0.5)],
    )
    g = Agent(name="g", provider=_uncapped(log, caps), history_processors=[_after(0.25)])

    def caller(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            calls = [
                c
                for name in ("c1", "g", "c2")
                for c in tool_call(name, {"input": "go"}, tool_call_id=name.upper())
            ]
            return written(10, calls=calls)
        return written(1)

    lead = Agent(
        provider=ScriptedProvider(responder=caller),
        tools=[c1.as_tool(), g.as_tool(), c2.as_tool()],
        budget=Budget(max_output_tokens=100, tool_timeout=None),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, session_id="fair")
        async with session.stream("go") as out:
            chunks = [c async for c in out]
        results = {m.tool_call_id: m.output for m in session.messages if isinstance(m, ToolMessage)}
    return out.result, log, caps, chunks, results


async def test_an_uncapped_sub_agent_waits_only_for_the_calls_in_flight_when_it_asked(
    autojump_clock,
):
    """G asks for all 90 while C1 holds 20: it waits for that call (not for C2, which
    asked after it, nor for C1's next call), then is sent the 85 left. Before: the
    capped calls kept taking what came back (some always held tokens), G waited until
    both capped sub-agents had ended, and was sent the 40 they left."""
    result, log, caps, _, results = await _three_at_once()
    assert caps == [85]
    assert log[:2] == ["C1", "G"]  # (before: G last of eleven calls)
    # C2 (queued at 0.5 s) and C1's second call (queued at 1 s) are both served when G
    # gives back at 2 s; which of the two reaches its model first is trio's scheduling
    # order (randomised), not the account's.
    assert sorted(log[2:4]) == ["C1", "C2"]
    assert results["G"] == "x" * 30
    assert results["C1"] == results["C2"] == "x" * 25  # (five calls of 5)
    assert result.usage.output_tokens == 10 + 30 + 25 + 25 + 1
    assert (result.finish_reason, result.budget) == ("stop", None)


async def test_a_sub_turn_waiting_on_the_account_says_so_in_the_callers_stream(autojump_clock):
    """Each wait is a ``budget-wait`` chunk in the sub-turn's stream, which the caller's
    carries nested under the tool call (and the bus, as every chunk): G would be sent
    90 with 70 free and 20 held; C2, which fits, waits as one reservation is ahead."""
    _, _, _, chunks, _ = await _three_at_once()
    waits = [
        (c.tool_call_id, c.chunk)
        for c in chunks
        if isinstance(c, ToolStream) and isinstance(c.chunk, BudgetWait)
    ]
    first = [(call, (w.step, w.want, w.available, w.held, w.ahead)) for call, w in waits][:2]
    assert first == [("G", (0, 90, 70, 20, 0)), ("C2", (0, 20, 70, 20, 1))]


# -- a tool's own usage is drawn from the account ------------------------------------------


async def test_a_tools_own_usage_is_taken_from_the_account_as_it_is_added():
    """A tool that calls a model of its own reports 60 output tokens while a sub-agent
    beside it runs: that sub-agent's call is sent the 30 left, not 90. Before, the
    tool's tokens counted only after the batch, the sub-agent was sent 90 and wrote
    40: the caller 111 of its 100."""
    reported = trio.Event()

    @tool
    async def summarize(context: ToolContext) -> str:
        """Summarize with a model of its own."""
        context.add_usage(Usage(input_tokens=100, output_tokens=60, total_tokens=160))
        reported.set()
        return "summary"

    async def after_the_tool(messages: Any, context: Any) -> Any:
        await reported.wait()
        return messages

    helper_model = Greedy(wants=40)
    helper = Agent(name="helper", provider=helper_model, history_processors=[after_the_tool])

    def caller(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            calls = [
                *tool_call("summarize", {}, tool_call_id="S"),
                *tool_call("helper", {"input": "h"}, tool_call_id="H"),
            ]
            return written(10, calls=calls)
        return written(1)

    lead = Agent(
        provider=ScriptedProvider(responder=caller),
        tools=[summarize, helper.as_tool()],
        budget=Budget(max_output_tokens=100),
    )
    async with Host.open(log_tap=False) as host:
        result = await (await host.open_session(lead, session_id="u")).run("go")
    assert helper_model.caps == [30]
    assert result.usage.output_tokens == 10 + 60 + 30
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")


def _context(account: OutputAccount | None) -> ToolContext:
    return ToolContext(
        host=None,
        session_id="s",
        turn_id="t",
        step=0,
        tool_call_id="c",
        tool_name="tool",
        emit=None,
        output_left=None if account is None else account.left,
        output_account=account,
    )


async def test_add_usage_takes_from_the_account_unless_it_was_drawn_already():
    account = OutputAccount(100)
    context = _context(account)
    context.add_usage(Usage(output_tokens=30, total_tokens=30))
    assert (account.left, account.held) == (70, 0)
    context.add_usage(Usage(output_tokens=20, total_tokens=20), drawn=True)  # reserved itself
    assert account.left == 70
    assert context.usage.output_tokens == 50  # both counted toward the calling turn
    context.add_usage(Usage(output_tokens=90, total_tokens=90))  # past what is left
    assert account.available() == 0 and account.left == -20
    _context(None).add_usage(Usage(output_tokens=5))  # no output budget: counted only


async def test_add_usage_refuses_a_count_that_is_not_one_and_takes_nothing():
    account = OutputAccount(100)
    context = _context(account)
    for bad in (-5, "5", 2.5, True, None):
        with pytest.raises(ValueError, match="output_tokens"):
            context.add_usage(Usage(output_tokens=bad))  # type: ignore[arg-type]
    assert (account.left, context.usage) == (100, None)


async def test_a_summary_call_waiting_on_the_account_says_so_in_the_stream(autojump_clock):
    """A turn on an account of which another call holds 60 of 100: its history's
    summary call (which may write all 100) waits, and the stream says so before
    anything else of the step; it goes on once the hold comes back."""
    from runtime import Summarize
    from tests.test_output_cap_compaction import older_turns

    account = OutputAccount(100)
    assert await account.reserve(60) == 100
    caps: list[Any] = []

    def respond(request: InferRequest) -> list[Any]:
        caps.append(request.max_output_tokens)
        return written(5)

    agent = Agent(
        provider=ScriptedProvider(responder=respond),
        history_processors=[Summarize(max_tokens=50, keep_turns=1)],
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(agent, session_id="s", history=older_turns())
        waits: list[BudgetWait] = []
        with trio.fail_after(60):  # (without the notice nobody settles: it would wait)
            async with session.stream(
                "And now?", max_output_tokens=100, output_account=account
            ) as out:
                async for chunk in out:
                    if isinstance(chunk, BudgetWait):
                        waits.append(chunk)
                        account.settle(60, 10)  # the other call wrote 10
    assert [(w.want, w.available, w.held, w.ahead) for w in waits] == [(100, 40, 60, 0)]
    assert caps == [90, 85]  # the summary all that was left, the step what it left
    assert out.result.finish_reason == "stop"


class _Waiting(ScriptedProvider):
    """A model whose call starts once ``first`` is set (then says ``text``), setting
    ``started`` as it is made and writing only once ``go`` is set (when given)."""

    def __init__(
        self, text: str, first: trio.Event | None, started: trio.Event, go: trio.Event | None
    ) -> None:
        super().__init__(responder=lambda request: [text])
        self.first, self.started, self.go = first, started, go

    async def stream(self, request: InferRequest, emit: Any) -> None:
        if self.first is not None:
            await self.first.wait()
        self.started.set()
        if self.go is not None:
            await self.go.wait()
        await super().stream(request, emit)


async def test_a_remote_answer_waiting_on_the_account_says_so_in_its_nested_stream():
    """A local sub-agent's call holds all the caller had left when the remote agent's
    answer arrives: the answer's bytes wait for it, and the remote call's nested stream
    says so (a ``budget-wait``), as a sub-turn's does; then both finish."""
    from actors.a2a import A2AAgent
    from tests.test_a2a import BOTH
    from tests.web.harness import web_server

    holding, remote_started, noticed = trio.Event(), trio.Event(), trio.Event()
    helper = Agent(name="helper", provider=_Waiting("helped", None, holding, noticed))
    remote_agent = Agent(name="far", provider=_Waiting("Far.", holding, remote_started, None))

    def caller(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            calls = [
                *tool_call("helper", {"input": "h"}, tool_call_id="H"),
                *tool_call("researcher", {"input": "r"}, tool_call_id="R"),
            ]
            return written(10, calls=calls)
        return written(1)

    async with web_server(remote_agent, protocols=BOTH) as server:
        remote = A2AAgent(server.url).as_tool(name="researcher")
        lead = Agent(
            provider=ScriptedProvider(responder=caller),
            tools=[helper.as_tool(), remote],
            budget=Budget(max_output_tokens=100, tool_timeout=20),
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead, session_id="far")
            waits: list[tuple[str, BudgetWait]] = []
            with trio.fail_after(30):  # (without the notice the helper never writes)
                async with session.stream("go") as out:
                    async for chunk in out:
                        if isinstance(chunk, ToolStream) and isinstance(chunk.chunk, BudgetWait):
                            waits.append((chunk.tool_call_id, chunk.chunk))
                            noticed.set()
            results = {
                m.tool_call_id: m.output for m in session.messages if isinstance(m, ToolMessage)
            }
    assert [(call, w.want, w.available, w.held) for call, w in waits] == [("R", 4, 0, 90)]
    assert results == {"H": "helped", "R": "Far."}
    assert out.result.usage.output_tokens == 10 + 1 + 4 + 1  # (the scripted helper: 1)
