"""Attacks on the output account that sub-agents called at once share
(:class:`runtime.budget.OutputAccount`, the budget3 merge): stalls, reservations not
given back, cancellation, fallbacks, A2A cuts.

Each test pins a behaviour found by trying to break it; those that found a defect say
which fix they need (the journal's ``attackbudget`` section).
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio
import trio.testing

from actors.a2a import A2AAgent
from actors.a2a.agent import SPENT_NOTE
from actors.providers.scripted import ScriptedProvider, Sleep, current_step, tool_call
from runtime import Agent, Budget, FallbackProvider, Host, RetryPolicy, ToolMessage, Usage, tool
from runtime.actor_messages import InferRequest
from runtime.budget import OutputAccount
from runtime.chunks import FinishChunk, UsageChunk
from runtime.errors import ConfigurationError, RateLimited
from tests.test_a2a import BOTH
from tests.test_a2a_output_budget import ask
from tests.test_output_cap_shared import Greedy, run
from tests.web.harness import web_server

# -- A2A: a remote call held the account for its whole remote turn ---------------------


def _gated_remote(gate: trio.Event) -> Agent:
    """Says "Working on it. ", waits in a tool until ``gate`` is set, then "Done."."""

    @tool
    async def wait_here() -> str:
        """Wait."""
        await gate.wait()
        return "ok"

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return ["Working on it. ", *tool_call("wait_here", {})]
        return ["Done."]

    return Agent(name="slow", provider=ScriptedProvider(responder=script), tools=[wait_here])


def _lead(tools: list[Any], calls: list[tuple[str, str, str]], budget: Budget) -> Agent:
    """The caller: its first step calls each ``(tool, input, call id)`` of ``calls`` at
    once, its second answers "ok"."""

    def script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return [
                chunk
                for name, given, call_id in calls
                for chunk in tool_call(name, {"input": given}, tool_call_id=call_id)
            ]
        return ["ok"]

    return Agent(
        name="lead", provider=ScriptedProvider(responder=script), tools=tools, budget=budget
    )


async def test_a_remote_call_does_not_hold_the_account_while_its_remote_turn_waits():
    """A remote agent and a local sub-agent called in one step, the remote one waiting
    (in a tool) for what the local one does. The remote call reserved all the caller
    had left for the whole remote turn, so the local sub-agent's model call waited for
    it: a deadlock, ended only by the tool timeout (the remote call's result a timeout
    error). A remote answer now draws on the account as its bytes arrive: nothing is
    held while the remote turn waits, and both finish."""
    gate = trio.Event()

    def helper_model(request: InferRequest) -> list[Any]:
        gate.set()  # what the remote agent waits for
        return ["helped"]

    helper = Agent(name="helper", provider=ScriptedProvider(responder=helper_model))

    async with web_server(_gated_remote(gate), protocols=BOTH) as server:
        remote = A2AAgent(server.url).as_tool(name="researcher")

        lead = _lead(
            [remote, helper.as_tool()],
            [("researcher", "q", "R"), ("helper", "h", "H")],
            Budget(max_output_tokens=200, tool_timeout=5),
        )
        async with Host.open(log_tap=False) as host:
            session = await host.open_session(lead, session_id="p")
            with trio.fail_after(30):
                result = await session.run("go")
            tools = [m for m in session.messages if isinstance(m, ToolMessage)]
            outputs = {m.tool_call_id: m.output or m.error for m in tools}
    assert outputs == {"R": "Working on it. Done.", "H": "helped"}
    assert result.finish_reason == "stop"
    assert result.usage.output_tokens == 1 + len("Working on it. Done.") + 1 + 1


# -- compaction: a sub-turn's history processors held all that was left ----------------


async def test_a_history_processor_that_waits_holds_nothing_of_the_account(autojump_clock):
    """Two sub-agents called at once; the first's history processor (an application's,
    async) waits for what the second's model call does. Compaction reserved all the
    caller had left for all of its processors, a summary call or not, so the second's
    call waited for it: a deadlock, ended only by the tool timeout. A summary call now
    reserves its cap as it is made, and a processor that makes none holds nothing."""
    gate, inside = trio.Event(), trio.Event()

    async def waits(messages: Any, context: Any) -> Any:
        inside.set()
        await gate.wait()  # (a retrieval, a lock: anything an application awaits)
        return messages

    async def after_first(messages: Any, context: Any) -> Any:
        await inside.wait()  # (the second's call comes once the first is compacting)
        return messages

    def second_model(request: InferRequest) -> list[Any]:
        gate.set()
        return ["second"]

    first = Agent(name="first", provider=ScriptedProvider(["first"]), history_processors=[waits])
    second = Agent(
        name="second",
        provider=ScriptedProvider(responder=second_model),
        history_processors=[after_first],
    )

    lead = _lead(
        [first.as_tool(), second.as_tool()],
        [("first", "a", "A"), ("second", "b", "B")],
        Budget(max_output_tokens=100, tool_timeout=5),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, session_id="c")
        with trio.fail_after(30):
            result = await session.run("go")
        tools = [m for m in session.messages if isinstance(m, ToolMessage)]
    assert {m.tool_call_id: m.output or m.error for m in tools} == {"A": "first", "B": "second"}
    assert result.finish_reason == "stop"


# -- the caller stopped while its sub-turns wait on the account --------------------------


class Holding(ScriptedProvider):
    """A greedy sub-agent's model: the first call made holds its reservation (it writes
    nothing for a long while); the calls beside it wait for the account."""

    def __init__(self) -> None:
        super().__init__(responder=self.respond)
        self.calls = 0

    def respond(self, request: InferRequest) -> list[Any]:
        self.calls += 1
        return [Sleep(10_000), "x" * 10]


async def test_a_caller_stopped_while_its_sub_turns_wait_on_the_account_ends_at_once(
    autojump_clock,
):
    """Three sub-agents; the first call holds all that was left, the other two wait in
    the account. Stopping the caller ends all three at once (no call waits on), the
    caller's turn saved interrupted with an ``interrupted`` result for each call, and
    the waiting sub-agents never made a call."""
    helper_model = Holding()
    helper = Agent(name="helper", provider=helper_model)

    lead = _lead(
        [helper.as_tool()],
        [("helper", "H1", "H1"), ("helper", "H2", "H2"), ("helper", "H3", "H3")],
        Budget(max_output_tokens=100, tool_timeout=None),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, session_id="stop")
        start = trio.current_time()
        async with session.stream("go") as out:
            await trio.sleep(5)  # the sub-turns are under way, two waiting
            out.cancel("stop")
            with trio.fail_after(1):
                async for _ in out:
                    pass
        assert trio.current_time() - start < 10  # (virtual: nothing waited for the sleep)
        result = out.result
        stored = await host.store.load("stop")
    assert helper_model.calls == 1
    assert result.finish_reason == "aborted"
    turn = stored.messages[1]
    assert turn.interrupted
    results = [m for m in stored.messages if isinstance(m, ToolMessage)]
    assert len(results) == 3


# -- a reservation given back on every exit path -----------------------------------------


def _greedy(wants: int, caps: list[Any]) -> Any:
    """A model that writes ``wants`` tokens, at most the cap it is sent."""

    def respond(request: InferRequest) -> list[Any]:
        cap = request.max_output_tokens
        caps.append(cap)
        n = wants if cap is None else min(wants, cap)
        usage = Usage(input_tokens=1, output_tokens=n, total_tokens=1 + n)
        return ["x" * n, UsageChunk(usage=usage), FinishChunk(reason="stop")]

    return respond


async def _lead_with(holder: Any, greedy_caps: list[Any], budget: Budget) -> tuple[Any, dict]:
    """The lead calls ``slow`` (``holder``'s agent, whose tool times out after 5 s) and
    two greedy helpers (40 each) in one step; the helpers' calls come once the slow
    one's model call has its reservation."""
    started = trio.Event()

    async def after_slow(messages: Any, context: Any) -> Any:
        await started.wait()
        return messages

    original = holder.stream

    async def stream(request: InferRequest, emit: Any) -> None:
        started.set()
        await original(request, emit)

    holder.stream = stream
    slow = attrs.evolve(Agent(name="slow", provider=holder).as_tool(), timeout=5)
    fast = Agent(
        name="fast",
        provider=ScriptedProvider(responder=_greedy(40, greedy_caps)),
        history_processors=[after_slow],
    )

    lead = _lead(
        [slow, fast.as_tool()],
        [("slow", "s", "S"), ("fast", "a", "F1"), ("fast", "b", "F2")],
        budget,
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, session_id="exit")
        with trio.fail_after(100):
            result = await session.run("go")
        tools = [m for m in session.messages if isinstance(m, ToolMessage)]
    return result, {m.tool_call_id: m.output or m.error for m in tools}


async def test_a_sub_agent_timed_out_while_it_holds_its_reservation_gives_it_back(
    autojump_clock,
):
    """The slow sub-agent's call holds all that was left and its tool times out: the
    helpers waiting on the account then run, sent what it had not written."""
    caps: list[Any] = []
    result, outputs = await _lead_with(Holding(), caps, Budget(max_output_tokens=200))
    assert outputs == {"S": "tool slow timed out after 5s", "F1": "x" * 40, "F2": "x" * 40}
    assert caps == [199, 159]  # all of it back: the slow call wrote nothing
    assert result.usage.output_tokens == 1 + 40 + 40 + 1
    assert result.finish_reason == "stop"


class Raising(ScriptedProvider):
    """Writes a little, then fails with an error that is not a provider's."""

    def __init__(self) -> None:
        super().__init__(responder=lambda request: ["y" * 7, Sleep(1), RuntimeError("boom")])


async def test_a_sub_agent_whose_provider_raises_mid_stream_gives_its_reservation_back(
    autojump_clock,
):
    caps: list[Any] = []
    result, outputs = await _lead_with(Raising(), caps, Budget(max_output_tokens=200))
    assert outputs["F1"] == outputs["F2"] == "x" * 40
    assert caps == [192, 152]  # back but the 7 it wrote, which the caller counts
    assert result.usage.output_tokens == 1 + 7 + 40 + 40 + 1
    assert result.finish_reason == "stop"


# -- careless budgets ---------------------------------------------------------------------


async def test_a_token_budget_that_is_not_a_count_is_refused_as_it_is_made():
    """``"100"`` (text from a config file) failed every turn with a ``TypeError`` once
    its first call was capped; ``-5`` silently meant 0 (every turn ended ``budget``
    before a call); ``2.5`` and ``True`` went out as an API's integer cap."""
    for field in ("max_input_tokens", "max_output_tokens", "max_total_tokens"):
        for value in ("100", -5, 2.5, True):
            with pytest.raises(ConfigurationError, match=field):
                Budget(**{field: value})
        assert getattr(Budget(**{field: 0}), field) == 0
        assert getattr(Budget(**{field: 10**12}), field) == 10**12


# -- A2A: the cut at a character boundary, the remote task canceled -----------------------


async def test_a_remote_answer_is_cut_between_characters_and_its_task_canceled():
    """5 bytes left, an answer of two-byte characters (and a four-byte one): the cut
    drops the character it would split (no broken character, nothing replaced), counts
    the 5 bytes, and the remote task (waiting in a tool) is canceled, its turn saved
    interrupted with the text it had streamed."""
    gate = trio.Event()  # never set: only the cancel ends the remote turn

    @tool
    async def wait_here() -> str:
        """Wait."""
        await gate.wait()
        return "ok"

    def remote_script(request: InferRequest) -> list[Any]:
        if current_step(request.messages) == 0:
            return ["é", "é😀é", *tool_call("wait_here", {})]
        return ["Done."]

    remote = Agent(
        name="slow", provider=ScriptedProvider(responder=remote_script), tools=[wait_here]
    )
    result, results, _, nested, stored = await ask(remote, Budget(max_output_tokens=6))
    (tool_result,) = results
    assert tool_result.output == "éé\n" + SPENT_NOTE
    texts = "".join(c.text for c in nested if c.type == "text-delta")
    assert texts == "éé" and "\ufffd" not in texts
    assert result.usage.output_tokens == 1 + 5
    assert (result.finish_reason, result.budget) == ("budget", "max_output_tokens")
    (remote_session,) = stored
    assert remote_session.messages[1].interrupted


# -- a fallback provider's own cap ---------------------------------------------------------


class OwnCap(ScriptedProvider):
    """A backup whose requests carry a cap of 25 of their own (as a provider option
    would): it holds only that, and writes once the sibling's call has started."""

    def __init__(self, started: trio.Event, sibling: trio.Event) -> None:
        super().__init__(responder=lambda request: ["z" * 10], name="backup")
        self.started, self.sibling = started, sibling

    def sent_cap(self, settings: Any, left: int | None) -> int | None:
        return 25 if left is None else min(25, left)

    async def stream(self, request: InferRequest, emit: Any) -> None:
        self.started.set()
        await self.sibling.wait()  # (a backup that reserved 99 would wait for ever)
        await super().stream(request, emit)


async def test_a_fallback_call_reserves_the_cap_its_own_provider_sends(autojump_clock):
    """The primary fails before writing; the backup's requests carry 25: its call holds
    25, not the 99 the primary's was sent, so a sibling sub-agent capped at 40 runs
    beside it (its budget's cap the 74 left)."""
    backup_started, sibling_started = trio.Event(), trio.Event()
    primary = ScriptedProvider([[RateLimited("busy", provider="scripted")]], name="primary")
    chain = FallbackProvider([primary, OwnCap(backup_started, sibling_started)])
    slow = Agent(name="slow", provider=chain, retry=RetryPolicy(max_attempts=1))
    caps: list[Any] = []

    async def after_backup(messages: Any, context: Any) -> Any:
        await backup_started.wait()
        return messages

    def sibling_model(request: InferRequest) -> list[Any]:
        sibling_started.set()
        return _greedy(40, caps)(request)

    fast = Agent(
        name="fast",
        provider=ScriptedProvider(responder=sibling_model),
        history_processors=[after_backup],
        settings={"max_tokens": 40},  # (fits beside the backup's 25: no wait)
    )

    lead = _lead(
        [slow.as_tool(), fast.as_tool()],
        [("slow", "s", "S"), ("fast", "f", "F")],
        Budget(max_output_tokens=100, tool_timeout=5),
    )
    async with Host.open(log_tap=False) as host:
        session = await host.open_session(lead, session_id="fb")
        result = await session.run("go")
        tools = [m for m in session.messages if isinstance(m, ToolMessage)]
    assert {m.tool_call_id: m.output or m.error for m in tools} == {"S": "z" * 10, "F": "x" * 40}
    assert caps == [74]
    assert result.finish_reason == "stop"


# -- a crumb of what was left: a call cut while its siblings' holds come back ------------


async def test_a_call_waits_for_held_tokens_rather_than_being_cut_at_a_crumb():
    """90 left, three sub-agents capped at 40 by their settings, each writing 20 (60 in
    all). The third reserved the 10 the first two's holds left it, was sent 10 and cut
    there: its sub-turn ended ``budget`` ("max_output_tokens reached") while 50 of
    those holds were about to come back. A call now waits while the account has less
    than its cap and other calls hold some; it takes less only when nothing is held
    (then that is what is left)."""
    helper = Greedy(wants=20)
    result, results = await run(helper, settings={"max_tokens": 40})
    assert sorted(m.output for m in results) == ["x" * 20] * 3
    assert min(helper.caps) >= 40  # (the budget's cap; each request carried 40)
    assert result.usage.output_tokens == 10 + 60 + 1
    assert (result.finish_reason, result.budget) == ("stop", None)


async def test_a_reservation_waits_for_all_it_wants_while_calls_hold_some():
    account = OutputAccount(90)
    assert await account.reserve(40) == 90
    assert await account.reserve(40) == 50
    got: list[int] = []

    async def third() -> None:
        got.append(await account.reserve(40))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(third)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # 10 available, 80 held: it waits for them
        account.settle(40, 20)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []  # 30 available, 40 still held
        account.settle(40, 20)
    assert got == [50]
    account.settle(40, 45)  # (nothing held now: 5 left, and a call takes that)
    assert await account.reserve(40) == 5
    account.settle(5, 5)
    assert await account.reserve(0) == 0  # spent, nothing held
