"""How a turn suspends for a person's input and how its continuation begins.

The turn runner asks :func:`hold_kind` of each call a step makes: a call that needs
approval (and no in-process approver decides it: ``TurnHost.approves_in_process``) or
that runs on the client is *held*. The step's other calls run; the held ones are marked
on their parts (:func:`mark_held`), the step is committed, and the turn ends with
``awaiting-input``. The store then holds all there is of the wait (docs/approval.md).

When the decisions are recorded (:func:`runtime.approval.record_decision`), the turn is
resumed (``RunTurn(resume=True)`` on its message): :func:`resolution` says what each
decided call becomes, a call to run (approved) or a result at once (denied, or a client
tool's output), before the step loop goes on after the suspended step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from runtime import events as ev
from runtime.actor_messages import (
    REASONING,
    TEXT,
    ApprovalAsked,
    ExecuteTools,
    PartBegin,
    PartEnd,
    StepBegin,
    StepEnd,
    ToolCallSpec,
    ToolDone,
    ToolOutcome,
    ToolProgress,
)
from runtime.approval import APPROVAL, AWAITING_INPUT, CLIENT, WAITING_META, denial_text
from runtime.budget import batch_account
from runtime.chunks import ReasoningChunk, TextChunk, ToolCallChunk, Usage
from runtime.errors import BudgetExceeded
from runtime.history import INTERRUPTED
from runtime.ids import new_id
from runtime.messages import (
    AssistantMessage,
    Awaiting,
    Message,
    Part,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolMessage,
    share_schemas,
)
from runtime.results import truncate_output
from runtime.tools import Tool, ToolContext, agent_depth, own_input

if TYPE_CHECKING:
    from runtime.actor import Actor
    from runtime.actor_messages import Batcher, SaveRequest, SessionState
    from runtime.agent import Agent
    from runtime.hosting import ToolHost, ToolSource, TurnHost
    from runtime.inbox import Inbox


async def _no_emit(chunk: Any) -> None:
    """A held call streams nothing: it does not run here."""


RUNS = "runs"
""":func:`hold_kind`'s answer for a call whose approval rule was asked and needs no
decision: it runs now, the rule not asked again (``ToolCallSpec.ruled``)."""


def hold_kind(
    tool: Tool | None,
    call_input: Any,
    context: ToolContext[Any],
    approver_in_process: bool,
) -> tuple[str | None, str | None]:
    """``(kind, refusal)``: ``kind`` ``"client"`` or ``"approval"`` when the call
    suspends the turn, :data:`RUNS` when its approval rule was asked and said no decision
    is needed, else ``None`` (it runs now, nothing asked: an unknown tool or bad input
    runs too, into its error result; under an in-process approver the executor asks the
    rule). ``refusal``: the call's error result when its rule raised (not run).

    The rule is asked here once a call, and its answer goes with the call: the executor
    does not ask it again (before, it did for every call the rule let run, so a rule
    with side effects ran twice, and one whose second answer differed was obeyed in
    both)."""
    if tool is None or not (tool.is_client or (tool.needs_approval and not approver_in_process)):
        return None, None  # the common case, decided without validating the input twice
    try:
        arguments = tool.validate(own_input(call_input))  # (the rule may change them)
    except Exception:  # ToolInputError, or a validator of the tool's own that raised
        return None, None  # the executor makes it the call's error result
    if tool.is_client:
        return CLIENT, None
    try:
        asks = tool.requires_approval(arguments, context)
    except Exception as exc:
        return None, tool.rule_raised(exc)  # the call's error, not run
    return (APPROVAL if asks else RUNS), None


def hold_context(
    host: ToolHost, session_id: str, turn_id: str, step: int, call: Any, deps: Any, depth: int
) -> ToolContext[Any]:
    """The :class:`ToolContext` a per-call approval rule is given: the call's, as the tool
    would be given it (its ids, ``deps``, ``host``, and ``depth``, the session's agent
    depth: a sub-agent's rule was told 0, where the tool and an in-process approver's
    rule are told its depth), but for what is the running call's alone: nothing it
    ``emit`` s is streamed (the call has not run), no output budget, no wait."""
    return ToolContext(
        depth=depth,
        host=host,
        session_id=session_id,
        turn_id=turn_id,
        step=step,
        tool_call_id=call.tool_call_id,
        tool_name=call.tool_name,
        emit=_no_emit,
        deps=deps,
    )


def awaiting(
    kind: str,
    tool_call_id: str,
    turn_id: str,
    expires_at: float | None = None,
    caller: str | None = None,
    tool: Tool | None = None,
) -> Awaiting:
    """The stored wait of a held call (an approval gets an id of its own). ``caller``:
    the session that called this one's agent as a tool, which decides the wait.
    ``tool``: the call's tool as the model was given it: an approval of one whose schema
    no code holds (an MCP server's) stores that schema, which an edit is checked
    against wherever the decision is made (:meth:`~runtime.tools.Tool.stored_schema`)."""
    return Awaiting(
        kind=kind,
        id=new_id("approval") if kind == APPROVAL else tool_call_id,
        turn_id=turn_id,
        expires_at=expires_at,
        caller=caller,
        schema=tool.stored_schema() if tool is not None and kind == APPROVAL else None,
    )


def nested_wait(
    approval_id: str,
    turn_id: str,
    expires_at: float | None = None,
    caller: str | None = None,
    client: tuple[str, Any] | None = None,
    counted: Usage | None = None,
    asked: tuple[str, Any, Any, tuple[str, ...]] | None = None,
) -> Awaiting:
    """The stored wait of a call whose sub-agent (an agent used as a tool) suspended for
    the approval ``approval_id``: the calling turn waits for that same id
    (``ToolOutcome.waits_for``); its deadline is the sooner of the sub-turn's own (its
    agent's ``approval_timeout``) and this turn's agent's, if either has one: past it the
    call is denied ``timed out``, and its sub-turn with it. ``caller``: as
    :func:`awaiting`'s (an agent tool two agents deep). ``client``: the sub-turn waits
    for a client tool's output, not an approval (that call's tool name and input): a
    ``"client"`` wait the caller answers with the output (``approval_id`` is then
    ``<call id>.<sub call id>``). ``counted``: the sub-turn's usage so far, which the
    calling turn adds as it suspends (:func:`since_wait` takes it off again).
    ``asked``: an approval's sub call (its tool's name, input, stored schema and the
    agent tools between, :attr:`~runtime.messages.Awaiting.asked_via`), which
    an edit of the approval replaces (:attr:`~runtime.messages.Awaiting.asked_tool`)."""
    asked = asked if client is None else None
    return Awaiting(
        kind=APPROVAL if client is None else CLIENT,
        id=approval_id,
        turn_id=turn_id,
        expires_at=expires_at,
        nested=True,
        caller=caller,
        sub_tool=None if client is None else client[0],
        sub_input=None if client is None else client[1],
        counted=counted,
        asked_tool=None if asked is None else asked[0],
        asked_input=None if asked is None else asked[1],
        schema=None if asked is None else asked[2],
        asked_via=() if asked is None else tuple(asked[3]),
    )


def since_wait(usage: Usage | None, waited: Awaiting | None) -> Usage | None:
    """What a call run on after its wait adds to the turn: its ``usage`` less what the
    turn counted when the call suspended (``Awaiting.counted``). A pass_approvals
    sub-turn reports its whole usage, the tokens before its wait included, and those
    were counted at the wait: added again, a caller allowed 100 that wrote 34 counted
    44 and sent its next call a cap of 60, not 70. Read from the stored wait, not from
    the sub-session: a continuation retried after a crash finds its sub-turn finished
    (its saved usage the whole), yet its own turn counted only what was before the
    wait. Each count floors at 0; a cost is unknown when either is."""
    counted = waited.counted if waited is not None else None
    if usage is None or counted is None:
        return usage

    def less(a: int | None, b: int | None) -> int | None:
        return None if a is None else max(0, a - (b or 0))

    cost = None if usage.cost is None else usage.cost - (counted.cost or 0.0)
    if counted.cost is None and not counted.empty:
        cost = None  # (a sub-turn of unknown price: its whole cost is unknown too)
    return Usage(
        input_tokens=max(0, usage.input_tokens - counted.input_tokens),
        output_tokens=max(0, usage.output_tokens - counted.output_tokens),
        total_tokens=max(0, usage.total_tokens - counted.total_tokens),
        cache_read=less(usage.cache_read, counted.cache_read),
        cache_write=less(usage.cache_write, counted.cache_write),
        reasoning_tokens=less(usage.reasoning_tokens, counted.reasoning_tokens),
        cost=None if cost is None else max(0.0, cost),
    )


def held_sub_calls(parts: list[Part], held: Mapping[str, Awaiting]) -> list[ToolCallChunk]:
    """The client tool calls of sub-agents the held calls wait for (nested ``"client"``
    waits), as the calling stream shows them: a call under the wait's id, named by the
    sub-agent's tool (the AI SDK's ``tool-input-available``, so a page answers it)."""
    return [
        ToolCallChunk(tool_call_id=w.id, tool_name=w.sub_tool, input=w.sub_input)
        for p in parts
        if isinstance(p, ToolCallPart)
        and (w := held.get(p.tool_call_id)) is not None
        and w.sub_tool is not None
    ]


def expiry_time(host: TurnHost, agent: Agent) -> float | None:
    """When a wait that starts now expires (the host's wall clock), by
    ``agent.approval_timeout``."""
    timeout = agent.approval_timeout
    if timeout is None:
        return None
    return float(host.clock()) + timeout


def mark_held(parts: list[Part], held: Mapping[str, Awaiting]) -> None:
    """Put each held call's :class:`Awaiting` on its part (in place). A call held again
    (its sub-agent asks once more) keeps the sub calls the caller answered before
    (``Awaiting.sub_answered``): the stream showed each, so the stored form does too.
    Each schema the waits store is stored once (:func:`~runtime.messages.share_schemas`:
    each held call of an MCP tool, and each sub-agent call passing up a call of one,
    is given the whole schema here)."""
    for i, p in enumerate(parts):
        if isinstance(p, ToolCallPart) and p.tool_call_id in held:
            parts[i] = attrs.evolve(p, awaiting=_carried(p.awaiting, held[p.tool_call_id]))
    share_schemas(parts)


def _carried(before: Awaiting | None, now: Awaiting) -> Awaiting:
    """``now``, the next wait of a call whose wait was ``before``, with ``before``'s
    answered sub call (and those it carried) in :attr:`~Awaiting.sub_answered`."""
    if before is None:
        return now
    answered = before.sub_answered
    if before.sub_tool is not None and before.decided and before.id != now.id:
        answered = (*answered, attrs.evolve(before, sub_answered=(), counted=None))
    return attrs.evolve(now, sub_answered=answered) if answered else now


def held_approvals(
    parts: list[Part], held: Mapping[str, Awaiting]
) -> list[tuple[ToolCallPart, Awaiting]]:
    """The held calls that wait for a person's approval, in call order."""
    return [
        (p, held[p.tool_call_id])
        for p in parts
        if isinstance(p, ToolCallPart)
        and p.tool_call_id in held
        and held[p.tool_call_id].kind == APPROVAL
    ]


def waiting_parts(parts: list[Part], results: Mapping[str, Any]) -> list[ToolCallPart]:
    """A resumed turn's calls that waited and have no result yet, in call order."""
    return [
        p
        for p in parts
        if isinstance(p, ToolCallPart) and p.awaiting is not None and p.tool_call_id not in results
    ]


def resolution(part: ToolCallPart, max_chars: int | None) -> ToolCallSpec | ToolOutcome:
    """What a decided waiting call becomes in its turn's continuation: an approved call
    to run (once: marked approved, it does not ask again), or its result at once, cut to
    ``max_chars`` (the agent's ``max_tool_result_chars``) as a server tool's is: a client
    tool's output or error, a denial's reason are the client's, of any length (10 MB of
    output reached the model whole, and the step's save stored it again)."""
    w = part.awaiting
    assert w is not None and w.decided
    if w.nested:  # run again, approved or not: its sub-turn goes on with the decision
        return ToolCallSpec(
            tool_call_id=part.tool_call_id,
            tool_name=part.tool_name,
            input=part.input,
            approved=True,
            decision=w,
        )
    if w.kind == APPROVAL and w.approved:
        return ToolCallSpec(
            tool_call_id=part.tool_call_id,
            tool_name=part.tool_name,
            input=part.input,
            approved=True,
        )
    if w.kind == APPROVAL:
        return ToolOutcome(
            tool_call_id=part.tool_call_id,
            tool_name=part.tool_name,
            error=truncate_output(denial_text(w.reason), max_chars),
        )
    return ToolOutcome(
        tool_call_id=part.tool_call_id,
        tool_name=part.tool_name,
        output=None if w.error is not None else truncate_output(w.output, max_chars),
        error=None if w.error is None else truncate_output(w.error, max_chars),
    )


def edit_ran(part: ToolCallPart, outcome: ToolOutcome | None) -> tuple[bool | None, bool]:
    """What an edited call's result records of whether its tool ran
    (:attr:`~runtime.messages.ToolMessage.ran` and
    :attr:`~runtime.messages.ToolMessage.ran_unknown`, which decide what the model is
    told of the edit): for a call a person approved with edits, the outcome's word, and
    whether it has none (``outcome`` ``None`` or its ``ran`` ``None``: cut short, or an
    executor bug's); ``(None, False)`` for any other call (nothing is stored for it)."""
    w = part.awaiting
    if w is None or not w.edit_in_result:
        return None, False
    ran = None if outcome is None else outcome.ran
    return ran, ran is None


def gone_text(tool_name: str) -> str:
    """The result of an approved call whose tool the agent no longer has when its turn
    resumes (or a new message runs it): it was not run."""
    return (
        f"the tool call was approved, but the tool {tool_name!r} is no longer "
        "available, so it was not run"
    )


def in_call_order(messages: list[Message], a_index: int) -> None:
    """Put the tool messages after the assistant message ``a_index`` in the order of its
    calls (a continuation adds the waiting calls' results after the others of their
    step): results are stored in call order."""
    assistant = messages[a_index]
    order = {
        p.tool_call_id: i
        for i, p in enumerate(getattr(assistant, "content", ()))
        if isinstance(p, ToolCallPart)
    }
    end = a_index + 1
    while end < len(messages) and isinstance(messages[end], ToolMessage):
        end += 1
    tools = messages[a_index + 1 : end]
    tools.sort(key=lambda m: order.get(getattr(m, "tool_call_id", ""), len(order)))
    messages[a_index + 1 : end] = tools


class Suspending:
    """The turn runner's part that suspends a turn and resumes it (mixed into
    :class:`~actors.turn.runner.TurnRunner`, whose turn state and helpers it uses)."""

    if TYPE_CHECKING:  # provided by the turn runner
        state: SessionState
        agent: Agent
        host: TurnHost
        tool_source: ToolSource
        tool_inbox: Inbox[ToolOutcome | ToolProgress]
        tool_executor: Actor

        async def publish(self, event: Any) -> None: ...

        async def _announce(self, event: Any, hook: Any) -> None: ...

        @staticmethod
        async def _ask(actor: Actor, message: Any) -> None: ...

        async def _tools(self, turn: Any) -> tuple[Tool, ...]: ...

        def _trace_meta(self, turn: Any) -> dict[str, Any]: ...

        async def _execute(
            self, turn: Any, step: int, runnable: list[ToolCallSpec], tools: dict[str, Any]
        ) -> None: ...

        async def _tool_done(
            self,
            turn_id: str,
            step: int,
            oc: ToolOutcome,
            ctrl: Batcher,
            *,
            denied: bool = False,
            reason: str | None = None,
        ) -> None: ...

        def _add_result(
            self, turn: Any, oc: ToolOutcome, step: int, ran: tuple[bool | None, bool] = ...
        ) -> None: ...

        def _snapshot(self, turn: Any) -> None: ...

        def _publish_history(self) -> None: ...

        async def _save(
            self,
            turn: Any,
            step: int | None,
            *,
            ends: str | None = None,
            running: bool = True,
            touch: bool = False,
        ) -> SaveRequest: ...

    async def _hold(self, turn: Any, step: int) -> None:
        """Mark the step's held calls on their parts and ask for each approval."""
        if not turn.held:
            return
        mark_held(turn.parts.content, turn.held)
        for part, w in held_approvals(turn.parts.content, turn.held):
            await turn.ctrl.send(
                ApprovalAsked(
                    step=step,
                    tool_call_id=part.tool_call_id,
                    tool_name=part.tool_name,
                    approval_id=w.id,
                    asked_tool=w.asked_tool,  # (a sub-agent's approval passed up: its call)
                    asked_input=w.asked_input,
                    asked_via=w.asked_via,
                )
            )
        for call in held_sub_calls(turn.parts.content, turn.held):
            await turn.ctrl.send(call)  # a sub-agent's client tool call, to be answered

    async def _announce_waiting(self, turn: Any, step: int) -> None:
        """The bus hears of each approval the suspended turn waits for (once stored);
        the host's timer, of its deadline if it has one (:mod:`runtime.app.expiry`)."""
        if any(w.expires_at is not None and w.caller is None for w in turn.held.values()):
            # (a wait its caller decides expires with the caller's wait, by its timer)
            self.host.expiry.note(self.state.session_id, self.agent, self.state.messages)
        for part, w in held_approvals(turn.parts.content, turn.held):
            await self.publish(
                ev.ToolApprovalRequested(
                    session_id=self.state.session_id,
                    turn_id=turn.turn_id,
                    step=step,
                    tool_call_id=part.tool_call_id,
                    tool_name=part.tool_name,
                    input=part.input,
                    causation_id=w.id,
                )
            )

    async def _show_waiting(self, turn: Any) -> None:
        """A turn taken over (``resume``) that still waits for a decision: its suspended
        step streamed again as it is stored (its text and reasoning, its calls, the
        results of those that ran, the request of each approval still waited for), so
        its stream has the shape of a waiting turn's (``start``, the step, ``finish``
        ``awaiting-input``) and a client that shows it can be asked. Before, it streamed
        ``start finish`` alone: no step (outside the grammar) and no request to answer.
        A worker's relay takes back what the dead worker streamed of the step first
        (``reset-step``), as for any step a takeover runs again. Each call goes out
        whole (``tool-call``: the AI SDK's ``tool-input-available``), not as its input's
        deltas: a client tool's call is ``input-available`` all the same, as from the
        live stream (tests/test_stepless_turns.py)."""
        parts = turn.parts.content
        waiting = waiting_parts(parts, turn.results)
        if not waiting:
            return
        step = waiting[-1].step
        items: list[Any] = [StepBegin(step=step)]
        n = 0
        for part in parts:
            if part.step != step:
                continue
            if isinstance(part, TextPart | ReasoningPart) and part.text:
                n += 1
                kind = TEXT if isinstance(part, TextPart) else REASONING
                pid = f"{turn.message_id}-w{step}-{n}"  # none of the dead worker's ids
                text = TextChunk(text=part.text) if kind == TEXT else ReasoningChunk(text=part.text)
                items += [PartBegin(kind=kind, part_id=pid), text, PartEnd(kind=kind, part_id=pid)]
            elif isinstance(part, ToolCallPart):
                call, name = part.tool_call_id, part.tool_name
                items.append(ToolCallChunk(tool_call_id=call, tool_name=name, input=part.input))
                result = turn.results.get(call)
                w = part.awaiting
                if result is not None:
                    oc = ToolOutcome(
                        tool_call_id=call, tool_name=name, output=result.output, error=result.error
                    )
                    items.append(ToolDone(step=step, outcome=oc))
                elif w is not None and not w.decided and w.kind == APPROVAL:
                    items.append(
                        ApprovalAsked(
                            step=step,
                            tool_call_id=call,
                            tool_name=name,
                            approval_id=w.id,
                            asked_tool=w.asked_tool,
                            asked_input=w.asked_input,
                            asked_via=w.asked_via,
                        )
                    )
                elif w is not None and not w.decided and w.sub_tool is not None:
                    items += held_sub_calls([part], {call: w})
        # no usage: the step ran no model call here, and its tokens are in the turn's
        # total already (``finish``); the stored step's usage again (none is kept per
        # step) would count it twice for a client adding up each stream's steps
        items.append(StepEnd(step=step, finish_reason="tool-calls", usage=Usage()))
        for item in items:
            await turn.ctrl.send(item)

    async def _resolve(self, turn: Any) -> bool:
        """A resumed turn: give each call it waited for its result (run the approved
        ones, deny the denied, take a client tool's output), commit them, then the step
        loop goes on. ``False`` (nothing done) while a call is still undecided. An agent
        tool whose sub-agent asks for its next approval gets no result: it is held
        again (``turn.held``), committed waiting, and the turn ends ``awaiting-input``
        with the others' results in (the caller sees ``turn.held``, runs no step)."""
        waiting = waiting_parts(turn.parts.content, turn.results)
        if not all(p.awaiting is not None and p.awaiting.decided for p in waiting):
            return False
        if not waiting:
            return True
        step = waiting[0].step
        to_run: list[ToolCallSpec] = []
        for part in waiting:
            what = resolution(part, self.agent.budget.max_tool_result_chars)
            if isinstance(what, ToolCallSpec):
                to_run.append(what)
                continue
            turn.outcomes[what.tool_call_id] = what
            w = part.awaiting
            denied = w is not None and w.kind == APPROVAL
            reason = w.reason if w is not None else None
            await self._tool_done(turn.turn_id, step, what, turn.ctrl, denied=denied, reason=reason)
        tools = {t.name: t for t in await self._tools(turn)}
        for spec in [c for c in to_run if c.tool_name not in tools]:
            # approved, but its tool went (a redeploy, a turn's own tool not given
            # again): said so, not "unknown tool", as if the model had made it up
            gone = ToolOutcome(
                tool_call_id=spec.tool_call_id,
                tool_name=spec.tool_name,
                error=gone_text(spec.tool_name),
                ran=False,
            )
            turn.outcomes[spec.tool_call_id] = gone
            await self._tool_done(turn.turn_id, step, gone, turn.ctrl)
        to_run = [c for c in to_run if c.tool_name in tools]
        await self._execute(turn, step, to_run, tools)
        for part in waiting:
            oc = turn.outcomes[part.tool_call_id]
            spent = since_wait(oc.usage, part.awaiting)  # (the rest counted at its wait)
            if spent is not None:  # an agent used as a tool, approved: its tokens count
                turn.usage = turn.usage + spent  # (they were lost: the budget too)
            if part.tool_call_id not in turn.held:
                self._add_result(turn, oc, part.step, edit_ran(part, oc))
        in_call_order(self.state.messages, turn.a_index)
        budget = turn.limits  # (the continuation makes a call: 0 left is spent)
        over = budget.tokens_exceeded(turn.usage)
        over = over or budget.output_spent(turn.usage, more=True, cut=False)
        if turn.held:  # its sub-agent asked again: the call waits for the next approval
            await self._hold(turn, step)  # (as a step that asks: marked, asked, saved)
            if not over:
                turn.meta = {**turn.meta, WAITING_META: len(turn.held), **self._trace_meta(turn)}
        self._snapshot(turn)
        self._publish_history()
        await self._save(turn, step)
        if over:  # as after the step that ran them at once: no model call more
            raise BudgetExceeded(over)
        if turn.held:
            turn.finish_reason = AWAITING_INPUT
            await self._announce_waiting(turn, step)
        return True

    async def _run_approved_before(self, turn: Any) -> None:
        """Run the calls a person approved in the turn this one superseded (they never
        ran: its continuation never came), as that turn's continuation would have (its
        turn id, so the same idempotency key; approved, they do not ask again), and put
        their results after that turn's other results, before this turn's user message:
        the model sees them, then the new message. Nothing of them streams (this turn's
        stream, an AI SDK client's, knows no such calls); the bus hears each result. A
        call cut short (the turn cancelled meanwhile) gets the ``interrupted`` result.
        The results are saved before the model call (with this turn's user message and
        its assistant message, still empty)."""
        if turn.ended_before:  # their results were given: only their sub-turns to end
            ended, turn.ended_before = turn.ended_before, ()
            await self._run_quietly(turn, ended, {}, end=True)
        parts: tuple[ToolCallPart, ...] = turn.approved_before
        if not parts:
            return
        turn.approved_before = ()
        outcomes: dict[str, ToolOutcome] = {}
        try:
            await self._run_quietly(turn, parts, outcomes)
        finally:
            for part in parts:
                oc = outcomes.get(part.tool_call_id)
                # an agent used as a tool: this turn spent what its sub-turn wrote after
                # the wait (before it, the superseded turn counted)
                spent = since_wait(oc.usage if oc is not None else None, part.awaiting)
                if spent is not None:
                    turn.usage = turn.usage + spent
            self._place_approved_before(turn, parts, outcomes)
        # Committed before the model call, as a continuation commits its results: a
        # process that dies during that call does not run them again on the next message.
        await self._save(turn, None)

    def _place_approved_before(
        self, turn: Any, parts: tuple[ToolCallPart, ...], outcomes: dict[str, ToolOutcome]
    ) -> None:
        """The results of ``parts`` (approved calls of the turn this one superseded)
        after that turn's other results, before this turn's user message: each its
        outcome, or ``interrupted`` (cut short, or never run: the turn was cancelled
        before it ran them, as :meth:`_seal` finds them)."""
        results = [_result_of(p, outcomes.get(p.tool_call_id)) for p in parts]
        messages, at = self.state.messages, turn.start_index
        messages[at:at] = results
        turn.start_index += len(results)
        turn.a_index += len(results)
        before = at - 1
        while before > 0 and not isinstance(messages[before], AssistantMessage):
            before -= 1
        in_call_order(messages, before)
        self._publish_history()

    async def _run_quietly(
        self,
        turn: Any,
        parts: tuple[ToolCallPart, ...],
        outcomes: dict[str, ToolOutcome],
        *,
        end: bool = False,
    ) -> None:
        """Run ``parts`` (approved, of one earlier turn) on the tool executor, each
        outcome into ``outcomes``, announced on the bus and to the hook, not streamed.
        ``end``: calls whose sub-agent waits, denied by a new message: each is given the
        decision ``decided=False``, which ends its sub-turn (``ToolContext.decision``)."""
        awaited = parts[0].awaiting
        assert awaited is not None
        budget, sid = turn.limits, self.state.session_id
        left = budget.output_left(turn.usage)
        account = batch_account(left, turn.account)
        tools = {t.name: t for t in await self._tools(turn)}
        by_step: dict[int, list[ToolCallPart]] = {}
        for part in parts:
            if part.tool_name not in tools:  # its tool went: said so, not run
                outcomes[part.tool_call_id] = ToolOutcome(
                    tool_call_id=part.tool_call_id,
                    tool_name=part.tool_name,
                    error=gone_text(part.tool_name),
                    ran=False,
                )
                continue
            by_step.setdefault(part.step, []).append(part)
        for step, same in by_step.items():
            # A worker's: is the turn still its own? (cancels it when not; as _execute)
            if turn.confirm is not None and not await turn.confirm():
                await trio.lowlevel.checkpoint()  # (raises: this turn is cancelled)
                return  # (or not in its scope: left unrun, placed as interrupted)
            request = ExecuteTools(
                session_id=sid,
                turn_id=awaited.turn_id,
                step=step,
                calls=tuple(
                    [
                        ToolCallSpec(
                            tool_call_id=p.tool_call_id,
                            tool_name=p.tool_name,
                            input=p.input,
                            approved=True,
                            decision=_decision_of(p, end),
                        )
                        for p in same
                    ]
                ),
                tools=tools,
                default_timeout=budget.tool_timeout,
                max_result_chars=budget.max_tool_result_chars,
                max_parallel=budget.max_parallel_tool_calls,
                output_left=left,  # a sub-agent's bound
                output_account=account,  # one for all of them, as one batch's
                reply=self.tool_inbox,
                cancel_scope=trio.CancelScope(),
                host=self.host,
                deps=turn.deps,
                depth=agent_depth(turn.meta),
                confirm=turn.confirm,
            )
            await self._ask(self.tool_executor, request)
            pending = {p.tool_call_id for p in same}
            try:
                while pending:
                    item = await self.tool_inbox.get()
                    if not isinstance(item, ToolOutcome) or item.tool_call_id not in pending:
                        continue  # its progress (not streamed), a cancelled request's
                    pending.discard(item.tool_call_id)
                    outcomes[item.tool_call_id] = item
                    await self._announce(
                        ev.ToolCallCompleted(
                            session_id=sid,
                            turn_id=awaited.turn_id,
                            step=step,
                            tool_call_id=item.tool_call_id,
                            tool_name=item.tool_name,
                            output=item.output,
                            error=item.error,
                            duration=item.duration,
                        ),
                        self.agent.hooks.on_tool_result,
                    )
            finally:
                request.cancel_scope.cancel()


def _decision_of(part: ToolCallPart, end: bool) -> Awaiting | None:
    """What a call run before a new message is told of its decision: a nested one's
    (``decided=False`` when the new message ends its sub-turn: a client tool's output
    has ``approved=None`` too), else nothing."""
    w = part.awaiting
    if w is None or not w.nested:
        return None
    return attrs.evolve(w, decided=False, approved=None) if end else w


def _result_of(part: ToolCallPart, outcome: ToolOutcome | None) -> ToolMessage:
    """The stored result of an approved call run before a superseding message."""
    ran, unknown = edit_ran(part, outcome)
    if outcome is None:
        return ToolMessage(
            tool_call_id=part.tool_call_id,
            tool_name=part.tool_name,
            step=part.step,
            error=INTERRUPTED,
            ran_unknown=unknown,
        )
    return ToolMessage(
        tool_call_id=part.tool_call_id,
        tool_name=part.tool_name,
        step=part.step,
        output=outcome.output,
        error=outcome.error,
        ran=ran,
        ran_unknown=unknown,
    )
