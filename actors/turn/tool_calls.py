"""How the turn runner runs the tool calls of a step.

Each call is announced, then refused (:func:`refuse_call`: the step did not finish so
that its calls may run, their input is unusable, a budget is spent), held for a person's
input (:mod:`actors.turn.suspension`) or sent to the tool executor with the others of
its step; outcomes stream in completion order into the turn's, and the runner adds
them to the history in call order. Mixed into :class:`~actors.turn.runner.TurnRunner`,
whose state, host and inboxes it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from actors.turn.suspension import (
    RUNS,
    awaiting,
    expiry_time,
    hold_context,
    hold_kind,
    nested_wait,
)
from actors.turn.turn_state import Step, Turn
from runtime import events as ev
from runtime.actor_messages import (
    Batcher,
    ExecuteTools,
    ToolCallSpec,
    ToolDenied,
    ToolDone,
    ToolOutcome,
    ToolProgress,
    ToolStreamed,
)
from runtime.budget import batch_account
from runtime.chunks import ToolCallChunk
from runtime.errors import ToolDefinitionError
from runtime.tools import Tool, agent_depth, caller_of

if TYPE_CHECKING:
    from runtime.actor import Actor
    from runtime.actor_messages import SessionState
    from runtime.agent import Agent
    from runtime.hosting import ToolSource, TurnHost
    from runtime.inbox import Inbox

RUNNABLE_FINISH = ("stop", "tool-calls")
"""The finish reasons of a step whose tool calls may run."""


class ToolCalling:
    """The turn runner's part that runs a step's tool calls (mixed into
    :class:`~actors.turn.runner.TurnRunner`, which sets these attributes)."""

    if TYPE_CHECKING:  # provided by the turn runner
        state: SessionState
        agent: Agent
        host: TurnHost
        tool_source: ToolSource
        tool_inbox: Inbox[ToolOutcome | ToolProgress]
        tool_executor: Actor

        async def _announce(self, event: Any, hook: Any) -> None: ...

        @staticmethod
        async def _ask(actor: Actor, message: Any) -> None: ...

    async def _run_tools(self, turn: Turn, result: Step, *, refuse: str | None) -> str | None:
        """Run (or refuse) the step's calls, streaming each outcome as it completes into
        ``turn.outcomes``. Returns the name of a budget the calls ran into, if any."""
        agent, budget, sid = self.agent, turn.limits, self.state.session_id
        step, ctrl = turn.step, turn.ctrl
        refused: list[ToolOutcome] = []
        runnable: list[ToolCallSpec] = []
        over: str | None = None
        tools = {t.name: t for t in await self._tools(turn)}
        approver = self.host.approves_in_process()
        for call in result.calls:
            await self._announce(
                ev.ToolCallRequested(
                    session_id=sid,
                    turn_id=turn.turn_id,
                    step=step,
                    tool_call_id=call.tool_call_id,
                    tool_name=call.tool_name,
                    input=call.input,
                ),
                agent.hooks.on_tool_call,
            )
            refusal = refuse_call(call, result.finish, refuse)
            if refusal is None and not budget.admits_tool_call(turn.tool_calls_used):
                refusal = (
                    "the tool call was not executed: budget "
                    f"max_tool_calls={budget.max_tool_calls} reached"
                )
                over = "max_tool_calls"
            kind = None
            if refusal is None:
                turn.tool_calls_used += 1
                context = hold_context(
                    self.host, sid, turn.turn_id, step, call, turn.deps, agent_depth(turn.meta)
                )
                kind, refusal = hold_kind(tools.get(call.tool_name), call.input, context, approver)
            if refusal is not None:  # (its approval rule raised: counted, not run)
                refused.append(
                    ToolOutcome(
                        tool_call_id=call.tool_call_id, tool_name=call.tool_name, error=refusal
                    )
                )
            else:
                if kind is not None and kind != RUNS:
                    # (its schema, if stored, is stored once a message: mark_held)
                    turn.held[call.tool_call_id] = awaiting(
                        kind,
                        call.tool_call_id,
                        turn.turn_id,
                        expiry_time(self.host, self.agent),
                        caller_of(turn.meta),
                        tools.get(call.tool_name),
                    )
                    continue
                runnable.append(
                    ToolCallSpec(
                        tool_call_id=call.tool_call_id,
                        tool_name=call.tool_name,
                        input=call.input,
                        ruled=kind == RUNS,  # (its rule's answer: not asked again)
                    )
                )
        for oc in refused:
            turn.outcomes[oc.tool_call_id] = oc
            await self._tool_done(turn.turn_id, step, oc, ctrl)
        await self._execute(turn, step, runnable, tools)
        return over

    async def _tools(self, turn: Turn) -> tuple[Tool, ...]:
        """The tools offered for the turn's next model call: the agent's (and its MCP
        servers' current ones), then the turn's own; a turn tool that takes an agent
        tool's name is a :class:`ToolDefinitionError`."""
        tools = await self.tool_source(self.agent)
        if not turn.tools:
            return tools
        taken = {t.name for t in tools} & {t.name for t in turn.tools}
        if taken:
            raise ToolDefinitionError(
                f"the turn's tool(s) {sorted(taken)} take the name of one of the agent's tools"
            )
        return (*tools, *turn.tools)

    async def _execute(
        self, turn: Turn, step: int, runnable: list[ToolCallSpec], tools: dict[str, Any]
    ) -> None:
        """Run ``runnable`` on the tool executor, streaming each outcome as it completes
        into ``turn.outcomes``."""
        budget, sid, ctrl = turn.limits, self.state.session_id, turn.ctrl
        if runnable:
            if turn.confirm is not None:  # a worker's: is the turn still its own?
                await turn.confirm()  # (cancels the turn when it is not)
            inbox = self.tool_inbox
            left = budget.output_left(turn.usage)
            request = ExecuteTools(
                session_id=sid,
                turn_id=turn.turn_id,
                step=step,
                calls=tuple(runnable),
                tools=tools,
                default_timeout=budget.tool_timeout,
                max_result_chars=budget.max_tool_result_chars,
                max_parallel=budget.max_parallel_tool_calls,
                reply=inbox,
                cancel_scope=trio.CancelScope(),
                host=self.host,
                deps=turn.deps,
                depth=agent_depth(turn.meta),
                may_wait=True,
                confirm=turn.confirm,
                output_left=left,  # a sub-agent's bound
                output_account=batch_account(left, turn.account),  # shared by the batch
            )
            await self._ask(self.tool_executor, request)
            pending = {c.tool_call_id for c in runnable}
            try:
                while pending:
                    item = await inbox.get()
                    if type(item) is ToolProgress:
                        if item.tool_call_id in pending:
                            await ctrl.send(ToolStreamed(step=step, progress=item))
                        continue
                    if not isinstance(item, ToolOutcome) or item.tool_call_id not in pending:
                        continue  # a late outcome of a cancelled earlier request
                    pending.discard(item.tool_call_id)
                    turn.outcomes[item.tool_call_id] = item
                    if item.waits_for is not None:  # its sub-agent waits: so does the turn
                        turn.held[item.tool_call_id] = nested_wait(
                            item.waits_for,
                            turn.turn_id,
                            _sooner(item.waits_until, expiry_time(self.host, self.agent)),
                            caller_of(turn.meta),
                            item.waits_client,
                            item.usage,  # counted as the turn suspends (_take_results)
                            item.waits_asked,
                        )
                        continue
                    await self._tool_done(turn.turn_id, step, item, ctrl)
            finally:
                request.cancel_scope.cancel()

    async def _tool_done(
        self,
        turn_id: str,
        step: int,
        oc: ToolOutcome,
        ctrl: Batcher,
        *,
        denied: bool = False,
        reason: str | None = None,
    ) -> None:
        if denied:
            await ctrl.send(ToolDenied(step=step, outcome=oc, reason=reason))
        else:
            await ctrl.send(ToolDone(step=step, outcome=oc))
        await self._announce(
            ev.ToolCallCompleted(
                session_id=self.state.session_id,
                turn_id=turn_id,
                step=step,
                tool_call_id=oc.tool_call_id,
                tool_name=oc.tool_name,
                output=oc.output,
                error=oc.error,
                duration=oc.duration,
            ),
            self.agent.hooks.on_tool_result,
        )


def _sooner(a: float | None, b: float | None) -> float | None:
    """The earlier of two deadlines (``None``: none)."""
    if a is None or b is None:
        return b if a is None else a
    return min(a, b)


def refuse_call(call: ToolCallChunk, finish: str, token_budget: str | None) -> str | None:
    """Why a call of a step that finished with ``finish`` must not run (the error result
    the model sees instead), or ``None`` if it may. The provider's ``input_error`` comes
    first: it says what is wrong with the input (invalid JSON, cut by ``length``), which
    helps the model more than the finish reason; then the finish reason, then a token
    ``token_budget`` the turn went over. (The tool-call budget is counted by the caller.)
    """
    if call.input_error is not None:
        return call.input_error
    if finish not in RUNNABLE_FINISH:
        return (
            f"the tool call was not executed: the response ended with {finish!r} "
            "(its input may be truncated)"
        )
    if token_budget is not None:
        return f"the tool call was not executed: budget {token_budget} exceeded"
    return None
